"""diagnose(): convergence numbers, predictive checks, summary tables, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
from posterior_builders import (
    SLOW_NODE,
    TRUTH_CLASSES,
    TRUTH_KERNELS,
    spec_attrs,
    truth_posterior,
)
from scipy import stats

from bayesprism.checks.diagnostics import (
    convergence_table,
    diagnose,
    plot_label,
    unit_effects,
    variance_components,
    worst_draws,
)
from bayesprism.checks.predictive_checks import _residual_cell_mean, cell_predictive_check
from bayesprism.cli.main import main


@pytest.fixture(scope="module")
def good_fit() -> xr.DataTree:
    return truth_posterior(seed=0)


@pytest.fixture(scope="module")
def good_report(good_fit):
    return diagnose(good_fit)


def _with_posterior(fit: xr.DataTree, **changes) -> xr.DataTree:
    """A copy of ``fit`` whose posterior has the given variables replaced or added."""
    new = fit.copy(deep=True)
    post = new["posterior"].to_dataset()
    for name, value in changes.items():
        post[name] = value
    new["posterior"] = post
    return new


def test_known_truth_fit_passes_every_check(good_report):
    assert good_report.ok, good_report.problems
    assert good_report.problems == []
    assert good_report.max_rhat < 1.01
    assert good_report.min_ess_bulk > 200 and good_report.min_ess_tail > 200
    assert good_report.divergences == 0
    # independent normal energies: BFMI = E[(ΔE)²] / Var(E) = 2
    assert 1.6 < good_report.bfmi_min < 2.4
    assert set(good_report.ppc) == set(TRUTH_CLASSES)
    for cls, numbers in good_report.ppc.items():
        assert numbers["n_cells"] == (144 if cls == "gemm" else 72)
        assert 0.8 <= numbers["coverage_90"] <= 1.0, (cls, numbers)
        assert 0.3 <= numbers["coverage_50"] <= 0.7, (cls, numbers)
        assert numbers["ks_distance"] < 0.2, (cls, numbers)


def test_a_second_sampling_from_the_best_chain_is_noted(good_fit, good_report):
    """A fit that sampled again (``inference.minor_mode_restart``) says so in diagnose's notes,
    with the first sampling's gap; a fit that did not, does not."""
    assert not any("second sampling" in n for n in good_report.notes)
    restarted = good_fit.copy(deep=True)
    post = restarted["posterior"].to_dataset()
    post.attrs["minor_mode_restart"] = json.dumps(
        {"best_chain": 1, "gap": 429.2, "gap_sds": 35.0, "coordinates": 267})
    restarted["posterior"] = post
    notes = [n for n in diagnose(restarted).notes if "second sampling" in n]
    assert len(notes) == 1 and "429 log units (35 within-chain sds) below chain 1's, over 267 " \
        "coordinates" in notes[0]
    post.attrs["minor_mode_restart"] = json.dumps(
        {"best_chain": 0, "gap": 172.4, "gap_sds": 17.3, "mass_gap": 151.0})
    restarted["posterior"] = post
    notes = [n for n in diagnose(restarted).notes if "second sampling" in n]
    assert len(notes) == 1 and "172 log units (17 within-chain sds) below chain 0's, its mass " \
        "about e^-151 of that chain's" in notes[0]


def test_to_dict_has_the_documented_keys_and_is_json(good_report):
    d = good_report.to_dict()
    for key in (
        "ok",
        "max_rhat",
        "min_ess_bulk",
        "min_ess_tail",
        "divergences",
        "bfmi_min",
        "problems",
        "ppc",
    ):
        assert key in d
    assert d["ppc"]["norm"]["n_cells"] == 72
    json.dumps(d)


def test_shifted_class_fails_the_predictive_check_and_names_the_class(good_fit):
    report = diagnose(truth_posterior(seed=0, shift_class="attention", shift=1.0))
    assert not report.ok
    assert report.ppc["attention"]["coverage_90"] < 0.1
    assert report.ppc["attention"]["ks_distance"] > 0.8
    assert report.ppc["gemm"]["coverage_90"] > 0.8
    assert len(report.problems) == 1
    assert "attention" in report.problems[0] and "90% predictive intervals" in report.problems[0]


def test_shifted_chain_gives_rhat_problem_in_plain_words(good_fit):
    scale = good_fit["posterior"]["node_scale"].copy()
    scale.loc[{"chain": 1, "kernel_class": "gemm"}] += 0.05  # chains disagree by 10 sd
    report = diagnose(_with_posterior(good_fit, node_scale=scale))
    assert not report.ok
    assert report.convergence.iloc[0]["element"] == "node_scale[gemm]"
    rhat = report.convergence.iloc[0]["r_hat"]
    assert rhat > 1.5
    assert (
        f"R-hat {rhat:.3f} > 1.01 for node_scale[gemm]; run more tuning draws or use "
        "--spec robust" in report.problems
    )


def test_constant_elements_are_ignored_but_stuck_chains_are_not(good_fit):
    chains, draws = good_fit["posterior"].sizes["chain"], good_fit["posterior"].sizes["draw"]
    fixed = xr.DataArray(np.full((chains, draws), 0.5), dims=("chain", "draw"))
    # a zero-sum vector of length 1 is identically 0: its R-hat is undefined, not bad
    zero_sum = xr.DataArray(np.zeros((chains, draws, 1)), dims=("chain", "draw", "cab"))
    report = diagnose(_with_posterior(good_fit, fixed=fixed, zero_sum=zero_sum))
    assert report.ok, report.problems
    assert np.isfinite(report.max_rhat)
    assert any("2 constant posterior elements" in n for n in report.notes)

    stuck = xr.DataArray(
        np.repeat(np.arange(chains)[:, None] + 1.0, draws, axis=1), dims=("chain", "draw")
    )
    report = diagnose(_with_posterior(good_fit, stuck=stuck))
    assert not report.ok
    # rank normalisation breaks the ties, so R-hat is huge rather than infinite
    assert any(
        p.startswith("R-hat") and " for stuck; run more tuning" in p for p in report.problems
    )


def test_divergences_are_counted_and_reported(good_fit):
    fit = good_fit.copy(deep=True)
    stats = fit["sample_stats"].to_dataset()
    diverging = stats["diverging"].to_numpy().copy()
    diverging[0, :7] = True
    stats["diverging"] = (("chain", "draw"), diverging)
    fit["sample_stats"] = stats
    report = diagnose(fit)
    assert report.divergences == 7
    assert any(p.startswith("7 divergent transitions") for p in report.problems)


def test_variance_shares_are_exact_for_fixed_loadings():
    draws = np.ones((2, 50, 1))
    post = xr.Dataset(
        {
            "node_scale": (("chain", "draw", "kernel_class"), 3 * draws),
            "resid_scale": (("chain", "draw", "kernel_class"), 4 * draws),
        },
        coords={"kernel_class": ["gemm"]},
    )
    table = variance_components(xr.DataTree.from_dict({"posterior": post}))
    assert table["level"].tolist() == ["node", "resid"]
    assert table["q50"].tolist() == [3.0, 4.0]
    np.testing.assert_allclose(table["share_q50"], [9 / 25, 16 / 25])


def test_variance_quantiles_match_numpy(good_fit):
    table = variance_components(good_fit)
    row = table[(table["kernel_class"] == "allreduce") & (table["level"] == "step")].iloc[0]
    values = good_fit["posterior"]["step_scale"].sel(kernel_class="allreduce").to_numpy()
    assert row["q95"] == pytest.approx(np.quantile(values, 0.95))
    assert row["mean"] == pytest.approx(values.mean())


def test_degraded_node_comes_first_and_excludes_zero(good_fit):
    table = unit_effects(good_fit, "node")
    assert table.iloc[0]["unit"] == SLOW_NODE
    assert bool(table.iloc[0]["excludes_zero"])
    assert table["q50"].is_monotonic_decreasing


def test_worst_draws_holds_the_worst_elements(good_fit, good_report):
    draws = worst_draws(good_fit, good_report, k=3)
    names = list(draws["posterior"].data_vars)
    assert names == [plot_label(e) for e in good_report.convergence["element"].head(3)]
    variable = good_report.convergence.iloc[0]["variable"]
    element = names[0]
    table, _ = convergence_table(good_fit)
    assert table.iloc[0]["element"] == element
    assert draws["posterior"][element].dims == ("chain", "draw")
    assert variable in element


# ------------------------------------------------------------------------------- real sampler
def _tiny_model():
    import pymc as pm

    y = np.random.default_rng(3).normal(1.0, [[0.3], [0.8]], size=(2, 30))
    with pm.Model(coords={"kernel_class": ["gemm", "allreduce"]}) as model:
        mu = pm.Normal("mu", 0, 5)
        scale = pm.HalfNormal("resid_scale", 1.0, dims="kernel_class")
        pm.Normal("y", mu, scale[:, None], observed=y)
    return model


def _attrs(dt: xr.DataTree, tune: int, draws: int) -> xr.DataTree:
    dt.attrs.update(
        {
            "bayesprism_version": "0.1.0",
            "schema_version": 1,
            "model_kind": "kernel",
            **spec_attrs(),
            "input_digest": "0",
            "sampler": "pymc",
            "seconds": 0.0,
            "draws": draws,
            "tune": tune,
            "chains": 2,
            "random_seed": 1,
        }
    )
    return dt


@pytest.fixture(scope="module")
def pymc_fits(tmp_path_factory):
    """An unconverged (tune=0, 20 draws, chains started far apart) and a converged fit."""
    import pymc as pm

    model = _tiny_model()
    common = {
        "chains": 2,
        "cores": 1,
        "nuts_sampler": "pymc",
        "progressbar": False,
        "compute_convergence_checks": False,
        "random_seed": 1,
    }
    with model:
        bad = pm.sample(draws=20, tune=0, initvals=[{"mu": -4.0}, {"mu": 6.0}], **common)
        good = pm.sample(draws=500, tune=500, **common)
    out = tmp_path_factory.mktemp("fits")
    paths = {}
    for name, dt, tune, draws in (("bad", bad, 0, 20), ("good", good, 500, 500)):
        paths[name] = out / f"{name}.nc"
        _attrs(dt, tune, draws).to_netcdf(paths[name])
    return {"bad": bad, "good": good, **{f"{k}_path": v for k, v in paths.items()}}


def test_unconverged_pymc_fit_is_not_ok(pymc_fits):
    report = diagnose(pymc_fits["bad"])
    assert not report.ok
    assert report.max_rhat > 1.1
    assert any(p.startswith("R-hat") and "mu" in p for p in report.problems)
    assert any("not a kernel-level posterior" in n for n in report.notes)


def test_converged_pymc_fit_is_ok(pymc_fits):
    report = diagnose(pymc_fits["good"])
    assert report.ok, report.problems
    assert report.max_rhat < 1.01
    assert report.bfmi_min is not None and report.bfmi_min > 0.3


def test_cli_strict_exits_3_on_unconverged_fit(pymc_fits, capsys):
    code = main(["diagnose", str(pymc_fits["bad_path"]), "--json", "--strict", "--quiet"])
    out = json.loads(capsys.readouterr().out)
    assert code == 3
    assert {"ok", "max_rhat", "min_ess_bulk", "min_ess_tail", "divergences", "problems"} <= set(out)
    # the chains never move (tune=0): R-hat is infinite, which JSON writes as null
    assert out["ok"] is False and out["problems"]
    assert out["max_rhat"] is None or out["max_rhat"] > 1.1
    assert out["divergences"] > 0


def test_cli_strict_exits_0_on_converged_fit(pymc_fits, capsys):
    code = main(["diagnose", str(pymc_fits["good_path"]), "--strict"])
    text = capsys.readouterr().out
    assert code == 0
    assert text.startswith("fit OK")
    assert "max R-hat" in text


def test_cli_without_strict_exits_0_and_prints_problems(pymc_fits, capsys):
    code = main(["diagnose", str(pymc_fits["bad_path"])])
    text = capsys.readouterr().out
    assert code == 0
    assert text.startswith("fit NOT trustworthy")
    assert "problem: R-hat" in text


def test_cli_out_writes_plots(good_fit, tmp_path, capsys):
    path = tmp_path / "fit.nc"
    good_fit.to_netcdf(path)
    code = main(["diagnose", str(path), "--out", str(tmp_path / "plots"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] is True
    names = sorted(p.split("/")[-1] for p in out["plots"])
    assert names == [
        "gpu_effects.png",
        "node_effects.png",
        "ppc.png",
        "rank.png",
        "trace.png",
        "variance_components.png",
    ]
    assert all((tmp_path / "plots" / n).stat().st_size > 5000 for n in names)


def test_cli_missing_file_exits_2(tmp_path, capsys):
    code = main(["diagnose", str(tmp_path / "nope.nc")])
    assert code == 2
    assert "nope.nc" in capsys.readouterr().err


def test_plot_label_shortens_and_avoids_slashes():
    assert plot_label("gpu_effect[node1/0]") == "gpu_effect[node1\u22150]"
    long = "kernel_log_median[" + "x" * 200 + "_end]"
    short = plot_label(long)
    assert len(short) == 48 and short.startswith("kernel_log_median[x") and short.endswith("_end]")


def test_step_time_check_compares_traced_and_composed_step_time(good_fit, good_report):
    try:
        import bayesprism.forecast.composition  # noqa: F401
    except ImportError:
        assert any(n.startswith("step-time check skipped") for n in good_report.notes)
        return
    check = good_report.step_time_check
    assert check is not None, good_report.notes
    assert check["n_steps"] == 6
    inventory = good_fit["inventory"]
    spans = (inventory["traced_step_span_us"] if "traced_step_span_us" in inventory
             else inventory["traced_step_time_us"].max("rank"))
    traced = spans.median().item() / 1e6
    assert check["observed_median_s"] == pytest.approx(traced)
    # same truth on both sides: the composed median is within 20% of the traced one
    assert check["predicted_median_s"] == pytest.approx(traced, rel=0.2)


def test_a_kernel_missing_from_the_inventory_is_checked_by_its_stored_class(good_fit):
    # a per-GPU benchmark's kernel is fitted but is not part of the job's inventory
    fit = good_fit.copy(deep=True)
    fit["inventory"] = fit["inventory"].to_dataset().drop_sel(kernel="gemm_b")
    rng = np.random.default_rng(0)
    ppc, _, notes = cell_predictive_check(fit, rng)
    # without the stored classes its cells are left out, not read with another class's scales
    assert "unknown" not in ppc and ppc["gemm"]["n_cells"] == 72
    assert any("72 cells of kernels the inventory does not list (e.g. 'gemm_b')" in n
               for n in notes)
    kernels = fit["posterior"]["kernel_log_median"].coords["kernel"].to_numpy()
    classes = list(fit["posterior"].coords["kernel_class"].to_numpy())
    constant = fit["constant_data"].to_dataset()
    constant["kernel_class_of_kernel"] = ("kernel", [classes.index(TRUTH_KERNELS[k][0])
                                                     for k in kernels])
    fit["constant_data"] = constant.assign_coords(kernel=kernels)
    ppc, _, notes = cell_predictive_check(fit, rng)
    assert ppc["gemm"]["n_cells"] == 144 and not any("does not list" in n for n in notes)
    assert 0.8 <= ppc["gemm"]["coverage_90"] <= 1.0


def test_unlinked_cells_are_predicted_marginally_with_a_note():
    report = diagnose(truth_posterior(seed=0, link_units=False))
    assert any("cells are not linked to their node" in n for n in report.notes)
    assert any("cells are not linked to their gpu_unit" in n for n in report.notes)
    # wider (marginal) predictions still cover the data: no false misfit
    assert report.ok, report.problems
    assert all(v["coverage_90"] >= 0.8 for v in report.ppc.values())


# -- a two-component (slow-launch) residual -------------------------------------------------------

#: w, δ, s of every class's residual: a fifth of the launches 0.8 slower in log (s ≥ every σ)
SLOW_RESIDUAL = (0.2, 0.8, 0.5)
SLOW_VARS = ("resid_slow_weight", "resid_slow_shift", "resid_slow_sd")


@pytest.fixture(scope="module")
def mixture_fit() -> xr.DataTree:
    return truth_posterior(seed=1, draws=100, slow_residual=SLOW_RESIDUAL)


def test_mixture_residual_cells_are_calibrated(mixture_fit):
    ppc, _, notes = cell_predictive_check(mixture_fit, np.random.default_rng(0))
    assert set(ppc) == set(TRUTH_CLASSES), notes
    for cls, numbers in ppc.items():
        assert 0.8 <= numbers["coverage_90"] <= 1.0, (cls, numbers)
        assert 0.3 <= numbers["coverage_50"] <= 0.7, (cls, numbers)
        assert numbers["ks_distance"] < 0.2, (cls, numbers)


def test_mixture_read_as_lognormal_would_look_miscalibrated(mixture_fit):
    """The same cells against the core residual only (the slow launches ignored): the
    check must see the misfit, or the calibration test above proves nothing."""
    post = mixture_fit["posterior"].to_dataset().drop_vars(list(SLOW_VARS))
    core_only = mixture_fit.copy()
    core_only["posterior"] = post
    ppc, _, _ = cell_predictive_check(core_only, np.random.default_rng(0))
    assert ppc["gemm"]["coverage_90"] < 0.6, ppc["gemm"]


def test_residual_cell_mean_has_the_mixture_moments():
    """Cells of n = 5 launches: mean w·δ, variance ((1−w)σ² + w·s² + w(1−w)δ²)/n."""
    sigma, (w, shift, slow_sd), n = 0.1, SLOW_RESIDUAL, 5
    values = {"resid_scale": sigma, "resid_slow_weight": w, "resid_slow_shift": shift,
              "resid_slow_sd": slow_sd}
    post = xr.Dataset({k: (("chain", "draw", "kernel_class"), np.full((1, 1, 1), v))
                       for k, v in values.items()})
    cells = 200_000
    draws = _residual_cell_mean(post, lambda name: post[name].to_numpy().reshape(1, -1),
                                np.zeros(cells, dtype=int), np.full(cells, float(n)),
                                np.random.default_rng(0))
    assert draws.shape == (1, cells)
    var = ((1 - w) * sigma**2 + w * slow_sd**2 + w * (1 - w) * shift**2) / n
    assert draws.mean() == pytest.approx(w * shift, abs=4 * np.sqrt(var / cells))
    assert draws.var() == pytest.approx(var, rel=0.02)
    # the exact law (K ~ Binomial(n, w) slow launches), which the CLT normal is not
    grid = np.linspace(-0.2, 0.6, 41)
    k = np.arange(n + 1)[:, None]
    cdf = (stats.binom.pmf(k, n, w) * stats.norm.cdf(
        grid, k * shift / n, np.sqrt((n - k) * sigma**2 + k * slow_sd**2) / n)).sum(axis=0)
    ecdf = (draws.reshape(-1, 1) <= grid).mean(axis=0)
    assert np.abs(ecdf - cdf).max() < 0.006
    assert np.abs(stats.norm.cdf(grid, w * shift, np.sqrt(var)) - cdf).max() > 0.03


def test_variance_components_count_the_slow_launches_in_the_residual():
    ones = np.ones((2, 50, 1))
    post = xr.Dataset(
        {
            "node_scale": (("chain", "draw", "kernel_class"), 0.3 * ones),
            "resid_scale": (("chain", "draw", "kernel_class"), 0.1 * ones),
            "resid_slow_weight": (("chain", "draw", "kernel_class"), 0.2 * ones),
            "resid_slow_shift": (("chain", "draw", "kernel_class"), 1.0 * ones),
            "resid_slow_sd": (("chain", "draw", "kernel_class"), 0.5 * ones),
        },
        coords={"kernel_class": ["gemm"]},
    )
    table = variance_components(xr.DataTree.from_dict({"posterior": post}))
    # residual variance 0.8·0.01 + 0.2·0.25 + 0.2·0.8·1 = 0.218
    np.testing.assert_allclose(table["q50"], [0.3, np.sqrt(0.218)])
    np.testing.assert_allclose(table["share_q50"], [0.09 / 0.308, 0.218 / 0.308])
