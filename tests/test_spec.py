"""ModelSpec: closed registries, TOML round trips, named specs, stable hash."""

from __future__ import annotations

import tomllib

import pytest

from bayesprism.errors import SpecError
from bayesprism.spec import BUILTIN_SPECS, MODELS_DIR, ModelSpec


def test_default_toml_equals_default_spec():
    assert ModelSpec.load(MODELS_DIR / "default.toml") == ModelSpec.default()
    assert ModelSpec.load("default") == ModelSpec.default()


@pytest.mark.parametrize("name", sorted(BUILTIN_SPECS))
def test_named_toml_files_equal_builtins(name):
    assert ModelSpec.load(MODELS_DIR / f"{name}.toml") == BUILTIN_SPECS[name]


def test_named_specs_have_the_documented_shape():
    assert ModelSpec.load("step").kind == "step"
    robust = ModelSpec.load("robust")
    # robust and benchmark specs: slow launches / repeats in a two-component residual
    assert robust.likelihood == "mixture" and robust.gpu_population == "mixture"
    benchmark = ModelSpec.load("benchmark")
    assert "cabinet" in benchmark.levels and benchmark.likelihood == "mixture"
    assert benchmark.node_population == "degraded"
    assert ModelSpec.load("default").likelihood == "lognormal"


def test_builtin_fallback_when_models_folder_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr("bayesprism.spec.MODELS_DIR", tmp_path / "absent")
    assert ModelSpec.load("robust") == BUILTIN_SPECS["robust"]


def test_round_trip_through_dict_and_toml(tmp_path):
    spec = ModelSpec(name="x", levels=("node", "step"), priors={"level_scale": 0.3},
                     step={"work_exponent": 1.0})
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    path = tmp_path / "x.toml"
    path.write_text(spec.to_toml())
    assert ModelSpec.load(path) == spec
    assert tomllib.loads(spec.to_toml())["priors"] == {"level_scale": 0.3}


def test_hash_is_stable_and_sensitive():
    a = ModelSpec()
    assert a.spec_hash() == ModelSpec.from_dict(a.to_dict()).spec_hash()
    assert a.spec_hash() != ModelSpec(node_population="normal").spec_hash()
    assert hash(a) == hash(ModelSpec())
    # pinned: changing the default spec must be a deliberate act
    assert len(a.spec_hash()) == 16


def test_unknown_values_list_the_allowed_ones():
    with pytest.raises(SpecError) as err:
        ModelSpec(likelihood="cauchy", node_population="pareto", levels=("rack",))
    text = str(err.value)
    assert ("likelihood: unknown value; allowed: lognormal, student_t, mixture, got 'cauchy'"
            in text)
    assert "node_population: unknown value; allowed: normal, student_t, mixture" in text
    assert "levels: unknown value; allowed: node, gpu, step, gpustep, cabinet, got 'rack'" in text


def test_unknown_field_and_prior_are_refused(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('kind = "kernel"\nimport_path = "evil.module"\n[priors]\nfoo = 1.0\n')
    with pytest.raises(SpecError, match="import_path: unknown field"):
        ModelSpec.load(path)
    with pytest.raises(SpecError, match=r"priors.foo: unknown prior"):
        ModelSpec(priors={"foo": 1.0})
    with pytest.raises(SpecError, match=r"priors.level_scale: must be a positive number"):
        ModelSpec(priors={"level_scale": -1})


def test_unknown_name_and_bad_toml(tmp_path):
    with pytest.raises(SpecError, match="no such named spec; known: benchmark, default"):
        ModelSpec.load("nonesuch")
    path = tmp_path / "broken.toml"
    path.write_text("kind = \n")
    with pytest.raises(SpecError, match="invalid TOML"):
        ModelSpec.load(path)
    with pytest.raises(SpecError, match="spec file not found"):
        ModelSpec.load(tmp_path / "missing.toml")


def test_mixture_residual_is_fitted_on_rows_with_its_own_priors():
    spec = ModelSpec(likelihood="mixture", priors={"resid_slow_shift": 1.0})
    assert spec.fits_rows and ModelSpec(likelihood="student_t").fits_rows
    assert not ModelSpec().fits_rows
    assert spec.prior("resid_slow_shift") == 1.0
    assert spec.prior("resid_slow_sd") == 0.5
    assert spec.prior("resid_slow_weight_beta") == 19.0  # Beta(1, 19): 5 % slow launches
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(SpecError, match=r"priors.resid_slow_sd: must be a positive number"):
        ModelSpec(likelihood="mixture", priors={"resid_slow_sd": 0.0})
