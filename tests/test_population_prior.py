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
