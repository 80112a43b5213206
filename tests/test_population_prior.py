"""A fleet's fitted populations as the prior of another fit (``bayesprism.population_prior``):
their summary, the potentials' densities, what a fit learns from them, and bad priors."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from posterior_builders import unit_grid_table
from scipy import stats

from bayesprism.errors import ConvergenceWarning, InputError
from bayesprism.population_prior import (
    ParameterPrior,
    PopulationPrior,
    fleet_classes,
    population_prior_from,
)

GPU_SD = 0.02


def fleet_posterior(seed: int = 0) -> xr.DataTree:
    """A kernel-level posterior of one ``benchmark`` class with known population draws."""
    rng = np.random.default_rng(seed)
    shape = (2, 500)

    def var(values, dims=("chain", "draw")):
        return (dims, values)

    post = xr.Dataset({
        "gpu_scale": var(np.exp(np.log(0.014) + 0.02 * rng.standard_normal(shape))[..., None],
                         ("chain", "draw", "kernel_class")),
        "node_scale": var(np.exp(np.log(0.011) + 0.03 * rng.standard_normal(shape))[..., None],
                          ("chain", "draw", "kernel_class")),
        "gpu_nu": var(1.0 + np.exp(np.log(20.0) + 0.3 * rng.standard_normal(shape))),
        "node_nu": var(1.0 + np.exp(np.log(15.0) + 0.4 * rng.standard_normal(shape))),
        "gpustep_scale": var(np.full((*shape, 1), 0.001), ("chain", "draw", "kernel_class")),
        "gpustep_slow_weight": var(np.full(shape, 0.0125)),
        "gpustep_slow_shift": var(np.full(shape, 87.5)),
        "gpustep_slow_sd": var(np.full(shape, math.sqrt(1.0 + 24.0**2))),
    }, coords={"kernel_class": ["benchmark"]}, attrs={
        "node_population": "student_t", "gpu_population": "student_t",
        "gpustep_population": "degraded"})
    tree = xr.DataTree.from_dict({"posterior": post})
    tree.attrs = {"model_kind": "kernel", "input_digest": "d1"}
    return tree


def test_summary_of_a_fleet_posterior_is_each_parameters_transformed_moments():
    prior = population_prior_from(fleet_posterior(), "gemm", "benchmark", "fleet.nc")
    assert prior.kernel_class == "gemm" and prior.input_digest == "d1"
    assert prior.families == {"node": "student_t", "gpu": "student_t", "gpustep": "degraded"}
    gpu = prior.parameter("gpu_scale")
    assert gpu.transform == "log"
    assert gpu.mean == pytest.approx(math.log(0.014), abs=0.003)
    assert gpu.sd == pytest.approx(0.02, rel=0.1)
    nu = prior.parameter("gpu_nu")
    assert (nu.transform, round(nu.median)) == ("log_minus_one", 21)
    assert nu.sd == pytest.approx(0.3, rel=0.1)
    # an episode's size in the class's units: shift 87.5 core sds of 0.1 %, extra sd 24 sds
    assert prior.parameter("gpustep_episode_shift").median == pytest.approx(0.0875)
    assert prior.parameter("gpustep_episode_spread").median == pytest.approx(0.024)
    assert prior.parameter("gpustep_slow_weight").median == pytest.approx(0.0125)
    assert prior.parameter("gpustep_scale") is None  # a session's core noise is not a step's
    assert PopulationPrior.from_json(prior.to_json()) == prior


def test_summary_refuses_what_it_cannot_carry_over():
    with pytest.raises(InputError, match=re.escape(
            "fleet.nc: kernel_class: not a class of the posterior (it has benchmark), got 'gemm'")):
        population_prior_from(fleet_posterior(), "gemm", "gemm", "fleet.nc")
    step = fleet_posterior()
    step.attrs = {"model_kind": "step"}
    with pytest.raises(InputError, match="needs a kernel-level posterior"):
        population_prior_from(step, "gemm", "benchmark", "fleet.nc")
    assert fleet_classes(fleet_posterior()) == ["benchmark"]


@pytest.mark.parametrize(("transform", "value", "expected"), [
    ("log", 0.013, stats.lognorm(s=0.05, scale=math.exp(-4.3)).logpdf(0.013)),
    ("log_minus_one", 18.0, stats.lognorm(s=0.05, scale=math.exp(-4.3)).logpdf(17.0)),
    ("logit", 0.013, stats.norm(-4.3, 0.05).logpdf(math.log(0.013 / 0.987))
     - math.log(0.013 * 0.987)),
])
def test_potential_is_the_parameters_density(transform, value, expected):
    from bayesprism.model.fleet_prior import _transformed_logp

    logp = _transformed_logp(np.float64(value), ParameterPrior("p", transform, -4.3, 0.05))
    assert float(logp.eval()) == pytest.approx(float(expected), rel=1e-9)


def few_nodes_table(seed: int = 5) -> pd.DataFrame:
    """3 nodes x 4 GPUs x 6 steps of one GEMM (4 launches a step): GPU effects N(0, GPU_SD)."""
    rng = np.random.default_rng(seed)
    nodes, gpus, steps, launches = 3, 4, 6, 4
    node = 0.01 * rng.standard_normal(nodes)
    gpu = GPU_SD * rng.standard_normal((nodes, gpus))
    return unit_grid_table(nodes, gpus, steps, launches, lambda nn, gg, ss: (
        np.log(800.0) + node[nn] + gpu[nn, gg] + 0.01 * rng.standard_normal(nn.size)),
        kernel="sm90_gemm")


@pytest.fixture(scope="module")
def fits_with_and_without():
    import bayesprism as bp
    from bayesprism.spec import ModelSpec

    table = few_nodes_table()
    spec = ModelSpec(levels=("gpu",))
    prior = PopulationPrior("fleet.nc", "gemm", {"gpu": "student_t", "node": "student_t"}, (
        ParameterPrior("gpu_scale", "log", math.log(GPU_SD), 0.03),
        ParameterPrior("gpu_nu", "log_minus_one", math.log(20.0), 0.2)))
    options = {"draws": 400, "tune": 400, "random_seed": 1, "progress": False}
    with warnings.catch_warnings():  # 2 short chains: an R-hat near 1.01 is what they give
        warnings.simplefilter("ignore", ConvergenceWarning)
        return (bp.fit(table, spec, **options),
                bp.fit(table, spec, population_prior=prior, **options))


def test_fleet_prior_pins_the_population_twelve_gpus_leave_wide(fits_with_and_without):
    alone, informed = fits_with_and_without

    def interval(tree):
        scale = tree["posterior"]["gpu_scale"].sel(kernel_class="gemm").to_numpy().ravel()
        return np.quantile(scale, [0.05, 0.5, 0.95])

    low, mid, high = interval(informed)
    assert mid == pytest.approx(GPU_SD, rel=0.05)
    width_alone = np.diff(interval(alone)[[0, 2]])[0]
    assert high - low < width_alone / 3
    nu = informed["posterior"]["gpu_nu"].to_numpy()
    assert 12 < np.median(nu) < 35
    notes = informed["posterior"].attrs["notes"]
    assert "population prior from fleet.nc (class gemm): gpu_scale 2 %, gpu_nu 21" in notes
    # the node level has no prior parameters of its own in this prior: nothing said of it
    assert PopulationPrior.from_json(informed["posterior"].attrs["population_prior"]).families \
        == {"gpu": "student_t", "node": "student_t"}


def test_prior_of_a_class_the_fit_does_not_launch_is_refused():
    import bayesprism as bp

    prior = PopulationPrior("fleet.nc", "attention", {"gpu": "student_t"},
                            (ParameterPrior("gpu_scale", "log", -4.0, 0.1),))
    with pytest.raises(InputError, match=re.escape(
            "fleet.nc: kernel_class: not a compute class of the fit (it has gemm), got "
            "'attention'")):
        bp.fit(few_nodes_table(), "default", draws=10, tune=10, population_prior=prior,
               progress=False)


def test_cli_refuses_a_missing_or_unusable_prior_in_one_line(tmp_path, capsys):
    from bayesprism.cli.main import main

    table = tmp_path / "t.parquet"
    few_nodes_table().to_parquet(table)
    code = main(["fit", str(table), "-o", str(tmp_path / "p.nc"),
                 "--population-prior", str(tmp_path / "fleet.nc")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "fleet.nc" in err[0] and "--population-prior" in err[0] and "no such file" in err[0]
    (tmp_path / "bad.nc").write_text("not netCDF")
    code = main(["fit", str(table), "-o", str(tmp_path / "p.nc"), "--quiet",
                 "--population-prior", str(tmp_path / "bad.nc")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "bad.nc" in err[0]


def test_a_gemm_benchmark_measures_the_traced_gemm_class():
    from types import SimpleNamespace

    from bayesprism.inference import population_prior_for

    tree = fleet_posterior()
    tree["constant_data"] = xr.Dataset({
        "kernel_class_of_kernel": ("kernel", [0]), "cell_kernel": ("cell", [0, 0]),
        "cell_n": ("cell", [5.0, 5.0])},
        coords={"kernel": ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n[m=8192,n=8192,k=8192]"]})
    traced = SimpleNamespace(coords={"kernel_class": ["allreduce", "gemm", "norm"]})
    prior = population_prior_for(tree, traced, "fleet.nc")
    assert (prior.kernel_class, prior.source) == ("gemm", "fleet.nc")
    without_gemm = SimpleNamespace(coords={"kernel_class": ["allreduce", "norm"]})
    with pytest.raises(InputError, match=re.escape(
            "fleet.nc: kernel_class: no class of the population prior is a compute class of "
            "the fit (norm), got 'benchmark'")):
        population_prior_for(tree, without_gemm, "fleet.nc")


def test_cli_fit_with_a_fitted_posterior_as_prior_says_what_it_carried(
        fits_with_and_without, tmp_path, capsys):
    from bayesprism.cli.main import main
    from bayesprism.io import save

    alone, _ = fits_with_and_without
    save(alone, tmp_path / "fleet.nc")
    table = tmp_path / "t.parquet"
    few_nodes_table(seed=6).to_parquet(table)
    code = main(["fit", str(table), "-o", str(tmp_path / "p.nc"), "--draws", "30", "--tune",
                 "30", "--quiet", "--population-prior", str(tmp_path / "fleet.nc")])
    out = capsys.readouterr().out
    assert code == 0
    assert f"note: population prior from {tmp_path / 'fleet.nc'} (class gemm): gpu_scale" in out
    # the fleet fit had no node or GPU×step population: nothing of theirs is claimed
    assert "node_scale" not in out and "gpustep_slow_weight" not in out


def test_a_parameter_prior_is_a_proper_normal_under_a_known_transform():
    with pytest.raises(ValueError, match="gpu_scale: transform 'sqrt' is not one of log, "
                       "log_minus_one, logit"):
        ParameterPrior("gpu_scale", "sqrt", 0.0, 1.0)
    with pytest.raises(ValueError, match=re.escape("an sd > 0, got -4.0, 0.0")):
        ParameterPrior("gpu_scale", "log", -4.0, 0.0)


def fleet_units_posterior(seed: int = 0) -> xr.DataTree:
    """:func:`fleet_posterior` with node and GPU effects of 2 nodes x 3 GPUs and a third node
    measured on one GPU; every GPU's log effect on the class known to 0.2 %."""
    rng = np.random.default_rng(seed)
    tree = fleet_posterior(seed)
    post = tree["posterior"].to_dataset()
    shape = (post.sizes["chain"], post.sizes["draw"])
    log_gpu = np.array([0.01, -0.02, 0.01, 0.03, 0.0, -0.03, 0.02])
    scale = post["gpu_scale"].isel(kernel_class=0).to_numpy()
    draws = log_gpu + 0.002 * rng.standard_normal((*shape, log_gpu.size))
    post["gpu_effect"] = (("chain", "draw", "gpu_unit"), draws / scale[..., None])
    post = post.assign_coords(gpu_unit=["a/0", "a/1", "a/2", "b/0", "b/1", "b/2", "c/0"])
    tree["posterior"] = post
    return tree


def test_units_the_fleet_measured_carry_their_centred_effects_without_the_population():
    from bayesprism.population_prior import unit_prior_from

    post = fleet_units_posterior()["posterior"].to_dataset()
    # the traced fit's GPUs: a/0..a/2 and b/0..b/2 in two nodes, c/0 alone in its node, d/0
    # not measured by the fleet
    names = ["a/0", "a/1", "a/2", "b/0", "b/1", "b/2", "c/0", "d/0"]
    prior = unit_prior_from(post, "student_t", "gpu", "benchmark",
                            (names, np.array([0, 0, 0, 1, 1, 1, 2, 3])))
    assert prior.units == ("a/0", "a/1", "a/2", "b/0", "b/1", "b/2")  # c/0: no contrast
    assert prior.groups == (0, 0, 0, 1, 1, 1)
    # centred within node: a is (0.01, -0.02, 0.01) - (0) ; b is (0.03, 0, -0.03) - 0
    centred = np.array([0.01, -0.02, 0.01, 0.03, 0.0, -0.03])
    # posterior sd of a centred effect: 0.2 % x sqrt(1 - 1/3); the population (scale 1.4 %,
    # nu 21) times sqrt(1 - 1/3) is divided out
    nu = float(np.median(post["gpu_nu"]))
    population_var = 0.014**2 * nu / (nu - 2.0) * (2.0 / 3.0)
    posterior_var = 0.002**2 * (2.0 / 3.0)
    likelihood_var = 1.0 / (1.0 / posterior_var - 1.0 / population_var)
    assert np.array(prior.sd) == pytest.approx(math.sqrt(likelihood_var), rel=0.08)
    assert np.array(prior.mean) == pytest.approx(centred * likelihood_var / posterior_var,
                                                 abs=3e-4)
    assert np.array(prior.mean) != pytest.approx(centred, abs=2e-4)  # not the posterior as is
    whole = population_prior_from(fleet_units_posterior(), "gemm", "benchmark", "fleet.nc",
                                  units={"gpu": (names, np.array([0, 0, 0, 1, 1, 1, 2, 3]))})
    assert whole.units == (prior,)
    assert PopulationPrior.from_json(whole.to_json()) == whole
    # nothing of these units measured: nothing carried
    assert unit_prior_from(post, "student_t", "gpu", "benchmark",
                           (["x/0", "x/1"], np.array([0, 0]))) is None


GPU_EFFECTS = np.array([[0.012, -0.008, 0.003, -0.007], [-0.015, 0.01, 0.004, 0.001],
                        [0.006, -0.012, 0.009, -0.003], [0.002, 0.011, -0.01, -0.003]])
SLOW_GPU = (2, 1)  # 10 % slower in every traced step: an episode, not its silicon


def slow_gpu_table(seed: int = 3) -> pd.DataFrame:
    """4 nodes x 4 GPUs x 8 steps of one GEMM (6 launches a step): GPU effects as measured by
    the fleet, but GPU 1 of node 2 10 % slow through the whole trace."""
    rng = np.random.default_rng(seed)
    node = np.array([0.004, -0.006, 0.002, 0.0])
    slow = np.zeros_like(GPU_EFFECTS)
    slow[SLOW_GPU] = 0.10
    gpustep = 0.002 * rng.standard_normal((4, 4, 8))
    return unit_grid_table(4, 4, 8, 6, lambda nn, gg, ss: (
        np.log(800.0) + node[nn] + GPU_EFFECTS[nn, gg] + slow[nn, gg] + gpustep[nn, gg, ss]
        + 0.003 * rng.standard_normal(nn.size)), kernel="sm90_gemm")


def test_a_gpu_slow_through_the_trace_but_not_in_the_fleet_is_fitted_as_an_episode():
    import bayesprism as bp
    from bayesprism.population_prior import UnitPrior

    centred = GPU_EFFECTS - GPU_EFFECTS.mean(axis=1, keepdims=True)
    units = UnitPrior("gpu", tuple(f"n{n:02d}/{g}" for n in range(4) for g in range(4)),
                      tuple(int(n) for n in np.repeat(np.arange(4), 4)),
                      tuple(float(v) for v in centred.ravel()), (0.002,) * 16)
    parameters = (ParameterPrior("gpu_scale", "log", math.log(0.01), 0.03),
                  ParameterPrior("gpustep_slow_weight", "logit", math.log(0.05 / 0.95), 0.3),
                  ParameterPrior("gpustep_episode_shift", "log", math.log(0.1), 0.1),
                  ParameterPrior("gpustep_episode_spread", "log", math.log(0.02), 0.3))
    families = {"gpu": "student_t", "gpustep": "degraded"}
    options = {"draws": 300, "tune": 300, "random_seed": 2, "progress": False}
    slow = 4 * SLOW_GPU[0] + SLOW_GPU[1]

    def slow_gpu_effect(units):
        prior = PopulationPrior("fleet.nc", "gemm", families, parameters, units=units)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            post = bp.fit(slow_gpu_table(), "default", population_prior=prior, **options)
        effect = post["posterior"]["gpu_effect"] * post["posterior"]["gpu_scale"].sel(
            kernel_class="gemm")
        return float(effect.isel(gpu_unit=slow).median()), str(post["posterior"].attrs["notes"])

    alone, _ = slow_gpu_effect(())
    assert alone > 0.06  # without the fleet's measurement: slow silicon
    carried, notes = slow_gpu_effect((units,))
    assert carried == pytest.approx(centred[SLOW_GPU], abs=0.01)
    assert "n02/1 ran" in notes and "slower through the trace than the fleet measured it: " \
        "slow for a while, not for good (started as measured)" in notes
    assert "population prior: the fleet's measurements of the fit's own 16 of 16 GPUs " \
        "carried over (one effect per unit in both fits)" in notes


def test_unit_potential_is_the_normal_density_of_the_centred_log_effects():
    """The potential of carried units at a point: per unit, the normal density of its log
    effect on the carried class centred within its group over the carried units."""
    from types import SimpleNamespace

    import pymc as pm

    from bayesprism.model.fleet_prior import _add_unit_prior
    from bayesprism.population_prior import UnitPrior

    effect = np.array([1.0, -0.5, 0.2, 2.0, 0.0])  # standardised, GPUs of nodes a, a, a, b, b
    scale = np.array([0.5, 0.02])  # per class; the carried class is the second
    prepared = SimpleNamespace(coords={"gpu_unit": ["a/0", "a/1", "a/2", "b/0", "b/1"]})
    units = UnitPrior("gpu", ("b/1", "a/0", "a/1", "a/2", "b/0", "x/0"), (1, 0, 0, 0, 1, 2),
                      (0.01, 0.005, -0.01, 0.0, -0.01, 0.3), (0.004, 0.002, 0.003, 0.002,
                                                              0.004, 0.1))
    with pm.Model() as model:
        pm.Deterministic("gpu_scale", pm.math.constant(scale))
        pm.Deterministic("gpu_effect", pm.math.constant(effect))
        shown = _add_unit_prior(units, prepared, model, class_index=1)
    assert shown == "5 of 5 GPUs"
    logp = float(model.compile_fn(model.potentials[0], inputs=[])({}))
    log_effect = 0.02 * effect
    centred = {"a/0": log_effect[0] - log_effect[:3].mean(),
               "a/1": log_effect[1] - log_effect[:3].mean(),
               "a/2": log_effect[2] - log_effect[:3].mean(),
               "b/0": log_effect[3] - log_effect[3:].mean(),
               "b/1": log_effect[4] - log_effect[3:].mean()}
    expected = sum(stats.norm(m, s).logpdf(centred[u]) for u, m, s in zip(
        units.units[:5], units.mean[:5], units.sd[:5], strict=True))
    assert logp == pytest.approx(expected, rel=1e-9)
