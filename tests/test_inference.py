"""fit(): artifact contents, samplers, convergence warnings, seeds and bad input."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from posterior_builders import GPU_EFFECT, fitted, tiny_kernel_table, tiny_spec

from bayesprism.errors import ConvergenceWarning, InputError
from bayesprism.inference import _resolve_spec, convergence_summary, fit, input_digest

ROOT_ATTRS = ("bayesprism_version", "schema_version", "model_kind", "spec", "spec_hash",
              "input_digest", "sampler", "seconds", "draws", "tune", "chains", "random_seed")


def test_fit_returns_a_self_describing_tree():
    tree, caught = fitted("pymc")
    assert set(ROOT_ATTRS) <= set(tree.attrs)
    assert {"posterior", "sample_stats", "observed_data", "constant_data",
            "inventory"} <= set(tree.children)
    attrs = tree.attrs
    assert (attrs["model_kind"], attrs["sampler"], attrs["draws"], attrs["tune"],
            attrs["chains"], attrs["random_seed"]) == ("kernel", "pymc", 200, 200, 2, 0)
    assert json.loads(attrs["spec"]) == tiny_spec().to_dict()
    assert attrs["spec_hash"] == tiny_spec().spec_hash()
    assert attrs["input_digest"] == input_digest([tiny_kernel_table()])
    assert attrs["seconds"] > 0
    assert tree["posterior"].attrs["gpu_population"] == "normal"  # PreparedData.attrs
    assert "diverging" in tree["sample_stats"]
    assert tree["posterior"].sizes["chain"] == 2 and tree["posterior"].sizes["draw"] == 200
    inv = tree["inventory"]
    assert list(inv["role"].values) == ["compute", "compute", "dp"]  # ew_b, gemm_a, nccl_ar
    conv = convergence_summary(tree)
    assert conv["max_rhat"] < 1.05 and conv["divergences"] == 0
    warned = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert bool(warned) == bool(conv["failing"])


def test_gpu_effects_recover_the_simulated_truth():
    tree, _ = fitted("pymc")
    post = tree["posterior"]
    shift = (post["gpu_effect"] * post["gpu_scale"].sel(kernel_class="gemm")).mean(
        ("chain", "draw"))
    labels = [str(v) for v in post["gpu_unit"].to_numpy()]
    truth = [GPU_EFFECT[(label.split("/")[0], int(label.split("/")[1]))] for label in labels]
    np.testing.assert_allclose(shift.to_numpy(), truth, atol=0.03)


def test_nutpie_sampler_writes_the_same_groups():
    tree, _ = fitted("nutpie")
    assert tree.attrs["sampler"] == "nutpie"
    assert {"posterior", "sample_stats", "observed_data", "constant_data",
            "inventory"} <= set(tree.children)
    assert len(tree["constant_data"].data_vars) > 0
    pymc_tree, _ = fitted("pymc")
    a = tree["posterior"]["kernel_log_median"].mean(("chain", "draw")).to_numpy()
    b = pymc_tree["posterior"]["kernel_log_median"].mean(("chain", "draw")).to_numpy()
    np.testing.assert_allclose(a, b, atol=0.03)


def test_unconverged_fit_warns_and_same_seed_gives_same_numbers():
    table, spec = tiny_kernel_table(), tiny_spec()
    with pytest.warns(ConvergenceWarning, match=r"did not converge .*(R-hat|bulk ESS)"):
        first = fit(table, spec, draws=10, tune=2, sampler="nutpie", random_seed=7,
                    progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        second = fit(table, spec, draws=10, tune=2, sampler="nutpie", random_seed=7,
                     progress=False)
        other = fit(table, spec, draws=10, tune=2, sampler="nutpie", random_seed=8,
                    progress=False)
    a = first["posterior"]["kernel_log_median"].to_numpy()
    np.testing.assert_array_equal(a, second["posterior"]["kernel_log_median"].to_numpy())
    assert not np.array_equal(a, other["posterior"]["kernel_log_median"].to_numpy())


def test_input_digest_is_stable_and_content_sensitive():
    table = tiny_kernel_table()
    assert input_digest([table]) == input_digest([tiny_kernel_table()])
    changed = table.copy()
    changed.loc[0, "duration_us"] *= 1.0001
    assert input_digest([changed]) != input_digest([table])


def test_bad_input_is_an_input_error_not_a_traceback():
    with pytest.raises(InputError, match="unknown sampler"):
        fit(tiny_kernel_table(), tiny_spec(), sampler="hmc", progress=False)
    with pytest.raises(InputError, match="draws: must be a positive integer"):
        fit(tiny_kernel_table(), tiny_spec(), draws=0, progress=False)
    with pytest.raises(InputError, match="expected a DataFrame"):
        fit([], progress=False)
    with pytest.raises(InputError, match="nutpie needs tune >= 1"):
        fit(tiny_kernel_table(), tiny_spec(), tune=0, sampler="nutpie", progress=False)
    with pytest.raises(InputError, match="pathfinder needs pymc-extras"):
        fit(tiny_kernel_table(), tiny_spec(), sampler="pathfinder", progress=False)


def test_step_tables_default_to_the_step_spec():
    from test_step_model import synthetic_ladder

    with pytest.warns(UserWarning, match="every row is a step-level row"):
        spec = _resolve_spec(None, [synthetic_ladder(2, 4)])
    assert spec.kind == "step"
    assert _resolve_spec(None, [tiny_kernel_table()]).kind == "kernel"


def _two_chains(offset: float, seed: int = 0):
    """2 chains x 1000 iid draws of one coordinate, the second chain shifted by ``offset``."""
    import xarray as xr

    x = np.random.default_rng(seed).standard_normal((2, 1000))
    x[1] += offset
    return xr.DataTree.from_dict({
        "/": xr.Dataset(attrs={"sampler": "nutpie"}),
        "posterior": xr.Dataset({"a": (("chain", "draw"), x)}),
        "sample_stats": xr.Dataset({"diverging": (("chain", "draw"), np.zeros((2, 1000), bool))}),
    })


def test_a_borderline_rhat_from_two_chains_is_told_apart_from_a_real_problem():
    """Only R-hat, at most 1.02, enough ESS, no divergences: the warning says 2 chains cross
    1.01 by chance and how to tell; further out it says to sample longer."""
    from bayesprism.cli._common import summarize_warnings
    from bayesprism.inference import RHAT_BORDERLINE, _warn_convergence

    slight, far = _two_chains(0.25), _two_chains(1.0)  # R-hat 1.014 and 1.17
    assert 1.01 < convergence_summary(slight)["max_rhat"] <= RHAT_BORDERLINE
    assert convergence_summary(far)["max_rhat"] > RHAT_BORDERLINE
    with pytest.warns(ConvergenceWarning,
                      match=r"a: R-hat 1\.0\d\d\. Only R-hat.*4 chains") as told:
        _warn_convergence(slight)
    assert "what to do: refit with --chains 4" in summarize_warnings(told)[0]
    with pytest.warns(ConvergenceWarning, match="Sample longer") as caught:
        _warn_convergence(far)
    assert "4 chains" not in str(caught[0].message)


def test_the_short_low_rank_warmup_is_for_models_of_up_to_1000_coordinates():
    import pymc as pm

    from bayesprism.inference import SHORT_WARMUP_MAX_COORDINATES, default_length

    def model(size: int):
        with pm.Model() as m:  # a transformed coordinate counts once, as sampled
            pm.Normal("effect", shape=size - 1)
            pm.HalfNormal("scale")
        return m

    small, large = model(SHORT_WARMUP_MAX_COORDINATES), model(SHORT_WARMUP_MAX_COORDINATES + 1)
    assert default_length(small, "low_rank") == (600, 1500)
    assert default_length(small, "diag") == (1000, 1000)
    assert default_length(large, "low_rank") == (1000, 1000)


def test_chains_in_different_modes_are_told_apart_from_slow_mixing():
    """R-hat far out with the chains' mean log densities many sds apart: the warning says the
    chains sit in different modes (sampling longer does not join them); with log densities
    alike it says to sample longer."""
    from bayesprism.cli._common import summarize_warnings
    from bayesprism.inference import MODE_GAP_SDS, _warn_convergence

    rng = np.random.default_rng(2)
    for gap, told in ((400.0, "different modes"), (1.0, "Sample longer")):
        tree = _two_chains(1.0)
        logp = rng.normal(0.0, 10.0, (2, 1000))
        logp[1] -= gap
        tree["sample_stats"] = tree["sample_stats"].to_dataset().assign(
            logp=(("chain", "draw"), logp))
        summary = convergence_summary(tree)
        assert summary["chain_logp_gap"] == pytest.approx(gap, abs=2.0)
        assert (summary["chain_logp_gap_sds"] > MODE_GAP_SDS) == (gap > 100)
        with pytest.warns(ConvergenceWarning, match=told) as caught:
            _warn_convergence(tree)
        if gap > 100:
            assert "what to do: refit with --chains 4" in summarize_warnings(caught)[0]
    assert np.isnan(convergence_summary(_two_chains(1.0))["chain_logp_gap"])


@pytest.mark.filterwarnings("ignore::bayesprism.errors.ConvergenceWarning")
def test_a_chain_in_a_minor_mode_is_sampled_again_from_the_best_chain(monkeypatch):
    """The first sampling's chain 1 is made to sit 10^6 log units below chain 0 (a mode of no
    mass): fit samples again, every chain started at chain 0's last draw of every free
    variable, records it and says so; a gap of 2 sds is left to the convergence check."""
    import bayesprism.inference as inference

    table, spec = tiny_kernel_table(), tiny_spec()
    real_sample = inference._sample
    calls = []

    def sample(model, sampler, **options):
        tree = real_sample(model, sampler, **options)
        calls.append((options.get("start"), tree))
        if len(calls) == 1:  # the first sampling: chain 1 in a minor mode
            stats = tree["sample_stats"].to_dataset()
            stats["logp"] = stats["logp"] - 1e6 * stats["chain"]
            tree["sample_stats"] = stats
        return tree

    monkeypatch.setattr(inference, "_sample", sample)
    from bayesprism.cli._common import summarize_warnings

    with pytest.warns(UserWarning, match="sampled again from chain 0's last draw") as caught:
        tree = fit(table, spec, draws=50, tune=50, sampler="nutpie", random_seed=3,
                   progress=False)
    assert any("what to do: none needed" in line for line in summarize_warnings(caught))
    assert len(calls) == 2 and calls[0][0] is None
    start, first = calls[1][0], calls[0][1]
    assert "gpu_scale_ref" in start and set(start) <= set(first["posterior"].data_vars)
    for name, value in start.items():
        np.testing.assert_array_equal(value, first["posterior"][name].isel(chain=0, draw=-1))
    restart = json.loads(tree["posterior"].attrs["minor_mode_restart"])
    assert restart["best_chain"] == 0 and restart["gap"] > 1e5 and restart["mass_gap"] > 1e5
    # a gap that is not decisive (the lower mode's mass not negligible): one sampling
    calls.clear()
    monkeypatch.setattr(inference, "DECISIVE_LOG_MASS_GAP", 1e9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = fit(table, spec, draws=50, tune=50, sampler="nutpie", random_seed=3,
                   progress=False)
    assert len(calls) == 1 and "minor_mode_restart" not in tree["posterior"].attrs


def test_the_jax_compilation_cache_goes_under_the_cache_home_unless_jax_has_one(
        monkeypatch, tmp_path):
    jax = pytest.importorskip("jax")
    from bayesprism.inference import JAX_CACHE_MAX_BYTES, jax_compilation_cache

    saved = {name: getattr(jax.config, name) for name in (
        "jax_compilation_cache_dir", "jax_compilation_cache_max_size",
        "jax_enable_compilation_cache")}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert jax_compilation_cache() == str(tmp_path / "bayesprism" / "jax")
        assert jax.config.jax_compilation_cache_max_size == JAX_CACHE_MAX_BYTES
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "theirs"))
        assert jax_compilation_cache() == str(tmp_path / "theirs")  # the user's stays
        jax.config.update("jax_enable_compilation_cache", False)
        assert jax_compilation_cache() is None
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
