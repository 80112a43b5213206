"""Sensitivity: the ranking comes from the composed step time, with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from posterior_builders import analysis_plan, analysis_posterior

from bayesprism.analysis.sensitivity import REMOVED, sensitivity, sources_of
from bayesprism.cli.sensitivity import format_table
from bayesprism.errors import InputError
from bayesprism.forecast.workload import residual_moments
from bayesprism.posterior import thin_draws

pytestmark = pytest.mark.filterwarnings("ignore::bayesprism.plan.PlanWarning")


def _entry(result: dict, factor: str, level: str) -> dict:
    (entry,) = [e for e in result["contributions"] if (e["factor"], e["level"]) == (factor, level)]
    return entry


@pytest.fixture(scope="module")
def noisy_posterior():
    """GEMM: most of the work, GPU x step spread 0.1. Norm: 1% of the work, spread 0.5 (5x the
    CV of GEMM). AllReduce: noise 0.5 and congestion 0.8 (the largest spread of all)."""
    return analysis_posterior(
        draws=20,
        scales={"gpustep": {"gemm": 0.1, "norm": 0.5}},
        coll_noise={"allreduce": 0.5},
        coll_congestion={"allreduce": 0.8},
    )


def test_critical_path_class_dominates_an_overlapped_high_variance_class(noisy_posterior):
    plan = analysis_plan(dp=4, microbatches=2, overlap=1.0)  # gradient AllReduce fully hidden
    result = sensitivity(noisy_posterior, plan, draws=20, replicates=64)
    ranked = [(e["factor"], e["level"]) for e in result["contributions"] if e["factor"] != "all"]
    assert ranked[0] == ("gemm", "gpustep")
    gemm = _entry(result, "gemm", "gpustep")
    assert gemm["p95_delta_ci90"][0] > 0
    assert gemm["slowdown_p_delta"]["1.05"] > 0.5
    # high variance is not high impact: the overlapped collective changes nothing at all ...
    allreduce = _entry(result, "allreduce", "collective")
    assert allreduce["p95_delta_s"] == 0.0 and allreduce["p95_delta_ci90"] == [0.0, 0.0]
    # ... and the noisy but tiny norm class matters far less than GEMM
    norm = _entry(result, "norm", "gpustep")
    assert 0 < norm["p95_delta_s"] < 0.1 * gemm["p95_delta_s"]
    # halving a small spread removes about half of the tail it causes
    assert 0.35 < gemm["halved"]["p95_delta_s"] / gemm["p95_delta_s"] < 0.65
    # sorted by impact, every source listed once
    impacts = [abs(e["p95_delta_s"]) for e in result["contributions"]]
    assert impacts == sorted(impacts, reverse=True)
    assert len({(e["factor"], e["level"]) for e in result["contributions"]}) == len(impacts)
    assert not _entry(result, "attention", "node")["composed"]


def test_exposed_collective_takes_the_lead_when_not_overlapped(noisy_posterior):
    result = sensitivity(noisy_posterior, analysis_plan(dp=4, microbatches=2), draws=20,
                         replicates=64)
    ranked = [(e["factor"], e["level"]) for e in result["contributions"] if e["factor"] != "all"]
    assert ranked[0] == ("allreduce", "collective")
    assert _entry(result, "allreduce", "collective")["p95_delta_ci90"][0] > 0


def test_p95_delta_of_a_shared_step_effect_matches_the_lognormal_quantile():
    """One GPU, step effect of GEMM only: step = C exp(l w) with l = 0.2 x GEMM's work share."""
    post = analysis_posterior(draws=10, scales={"step": {"gemm": 0.2}})
    result = sensitivity(post, analysis_plan(dp=1), draws=10, replicates=2000, random_seed=1)
    compute_s, share = 0.0302, 20_000 / 30_200
    expected = compute_s * (np.exp(0.2 * share * 1.6448536) - 1.0)
    entry = _entry(result, "gemm", "step")
    assert entry["p95_delta_s"] == pytest.approx(expected, rel=0.04)
    assert result["base"]["ideal_step_time_s"] == pytest.approx(compute_s, rel=1e-9)
    assert result["base"]["p95_s"] - entry["p95_delta_s"] == pytest.approx(compute_s, rel=1e-9)
    assert entry["p95_share_of_excess"] == pytest.approx(1.0, rel=1e-9)


def test_results_are_reproducible_with_a_seed(noisy_posterior):
    plan = analysis_plan(dp=4, microbatches=2)
    first = sensitivity(noisy_posterior, plan, draws=5, replicates=8, random_seed=7)
    again = sensitivity(noisy_posterior, plan, draws=5, replicates=8, random_seed=7)
    other = sensitivity(noisy_posterior, plan, draws=5, replicates=8, random_seed=8)
    assert first == again
    assert first["base"]["p95_s"] != other["base"]["p95_s"]
    assert first["draws"] == 5 and first["replicates"] == 8


def test_thin_draws_keeps_evenly_spaced_draws_of_all_chains():
    post = analysis_posterior(chains=2, draws=10, node_effect_sd=1.0)
    thinned = thin_draws(post, 4)
    group = thinned["posterior"]
    assert dict(group.sizes)["chain"] == 1 and dict(group.sizes)["draw"] == 4
    flat = post["posterior"]["node_effect"].to_numpy().reshape(20, -1)
    np.testing.assert_array_equal(group["node_effect"].to_numpy()[0], flat[[0, 6, 13, 19]])


def test_thin_draws_leaves_out_warm_up_draws_of_another_length():
    """A fit with 10 draws after 6 warm-up draws per chain: the posterior's draws are thinned
    and the warm-up group, whose draws are not the posterior's, is left out (it used to be
    indexed by the posterior's draw numbers: an IndexError whenever draws > tune)."""
    post = analysis_posterior(chains=2, draws=10, node_effect_sd=1.0)
    warm_up = post["posterior"].to_dataset().isel(draw=slice(0, 6))
    post["warmup_posterior"] = warm_up
    thinned = thin_draws(post, 15)
    assert dict(thinned["posterior"].sizes)["draw"] == 15
    assert "warmup_posterior" not in thinned.children


def test_printed_table_lists_sources_with_spread(noisy_posterior):
    result = sensitivity(noisy_posterior, analysis_plan(dp=4), draws=3, replicates=4)
    text = format_table(result, "dp4", top=3)
    assert "allreduce       collective" in text
    assert "sources have no spread in the posterior" in text


def test_bad_input_is_refused():
    post = analysis_posterior(draws=2)
    with pytest.raises(InputError, match="arguments: draws: must be at least 1"):
        sensitivity(post, analysis_plan(dp=1), draws=0)
    post.attrs["model_kind"] = "step"
    with pytest.raises(InputError, match="model_kind: sensitivity needs a kernel-level posterior"):
        sensitivity(post, analysis_plan(dp=1))


def test_cli_prints_json_and_tables(tmp_path, noisy_posterior, capsys):
    import json

    from bayesprism import io
    from bayesprism.cli.main import main

    path = tmp_path / "posterior.nc"
    io.save(noisy_posterior, path)
    plan = tmp_path / "plan.toml"
    plan.write_text('name = "small"\ndp = 4\ngpus_per_node = 2\noverlap = 1.0\n')
    args = ["sensitivity", str(path), "--plan", str(plan), "--draws", "4", "--replicates", "8"]
    assert main([*args, "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["contributions"][0]["factor"] in ("all", "gemm")
    assert {
        "factor",
        "level",
        "p95_delta_s",
        "p95_delta_ci90",
        "slowdown_p_delta",
        "halved",
    } <= set(result["contributions"][0])
    assert main([*args, "--quiet"]) == 0
    assert "plan small" in capsys.readouterr().out
    two = tmp_path / "two.toml"
    two.write_text("[[plan]]\ndp = 2\n[[plan]]\ndp = 4\n")
    assert main(["sensitivity", str(path), "--plan", str(two), "--quiet"]) == 2
    assert "give a file with exactly one plan" in capsys.readouterr().err


# -- a two-component (slow-launch) residual -------------------------------------------------------

#: GEMM residual: core sd σ, a share w of slow launches shifted by δ with sd s (log scale)
SIGMA, WEIGHT, SHIFT, SLOW_SD = 0.05, 0.2, 0.8, 0.3
SLOW_VARS = ("resid_slow_weight", "resid_slow_shift", "resid_slow_sd")


def _mixture_posterior(draws: int = 10):
    """:func:`analysis_posterior` with the mixture residual on GEMM only (every other class:
    no residual at all, w = δ = s = 0)."""
    post = analysis_posterior(draws=draws, scales={"resid": {"gemm": SIGMA}})
    group = post["posterior"].to_dataset()
    is_gemm = (group["kernel_class"] == "gemm").broadcast_like(group["resid_scale"])
    for name, value in zip(SLOW_VARS, (WEIGHT, SHIFT, SLOW_SD), strict=True):
        group[name] = xr.where(is_gemm, value, 0.0).transpose(*group["resid_scale"].dims)
    tree = post.copy()
    tree["posterior"] = group
    return tree


def _gemm_mixture(group) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    pick = {"kernel_class": "gemm", "chain": 0, "draw": 0}
    return (np.atleast_1d(group["resid_scale"].sel(pick).to_numpy()),
            tuple(np.atleast_1d(group[n].sel(pick).to_numpy()) for n in SLOW_VARS))


def _log_sd(sigma, slow) -> float:
    w, shift, slow_sd = (float(v[0]) for v in slow)
    return float(np.sqrt((1 - w) * sigma[0] ** 2 + w * slow_sd**2 + w * (1 - w) * shift**2))


def test_removing_a_mixture_residual_leaves_no_residual_and_halving_halves_its_log_sd():
    group = _mixture_posterior()["posterior"].to_dataset()
    (source,) = [s for s in sources_of(group) if (s.factor, s.level) == ("gemm", "residual")]
    sigma, slow = _gemm_mixture(source.edit(group, REMOVED))
    # no residual variability at all: the factor exp(eps) is exactly 1, as without a residual
    assert residual_moments(sigma, slow) == (1.0, 0.0)
    assert residual_moments(sigma, slow) == residual_moments(np.zeros(1))
    assert slow[0][0] == 0.0  # no slow launches left either
    sigma_h, slow_h = _gemm_mixture(source.edit(group, 0.5))
    assert slow_h[0][0] == WEIGHT  # the share of slow launches is kept ...
    assert (sigma_h[0], slow_h[1][0], slow_h[2][0]) == (SIGMA / 2, SHIFT / 2, SLOW_SD / 2)
    # ... and the residual's sd in log space is halved
    assert _log_sd(sigma_h, slow_h) == pytest.approx(0.5 * _log_sd(*_gemm_mixture(group)))
    # other classes are untouched by the GEMM source
    norm = {"kernel_class": "norm"}
    edited = source.edit(group, REMOVED)
    for name in ("resid_scale", *SLOW_VARS):
        xr.testing.assert_equal(edited[name].sel(norm), group[name].sel(norm))


def test_removed_mixture_residual_forecasts_the_no_residual_step_time():
    """One rank: only GEMM (20 ms of the 30.2 ms step) has a residual, so the mean step time is
    the step time without residual plus 20 ms × (E[exp(eps)] − 1) (the composition matches the
    mean of the rank's residual factor)."""
    plan = analysis_plan(dp=1)
    result = sensitivity(_mixture_posterior(), plan, draws=10, replicates=2000, random_seed=3)
    compute_s, gemm_s = 0.0302, 0.02
    mean, _ = residual_moments(np.array([SIGMA]), tuple(np.array([v]) for v in
                                                        (WEIGHT, SHIFT, SLOW_SD)))
    entry = _entry(result, "gemm", "residual")
    # removed: exactly the deterministic step (the slow launches went too)
    assert result["base"]["p95_s"] - entry["p95_delta_s"] == pytest.approx(compute_s, rel=1e-9)
    assert result["base"]["mean_s"] - entry["mean_delta_s"] == pytest.approx(compute_s, rel=1e-9)
    assert entry["mean_delta_s"] == pytest.approx(gemm_s * (mean[0] - 1.0), rel=0.05)
    # halved: the mixture with σ, δ and s halved (w kept)
    half, _ = residual_moments(np.array([SIGMA / 2]), tuple(np.array([v]) for v in
                                                            (WEIGHT, SHIFT / 2, SLOW_SD / 2)))
    assert entry["halved"]["mean_delta_s"] == pytest.approx(gemm_s * (mean[0] - half[0]),
                                                            rel=0.05)


def test_host_idle_is_a_source_and_leads_on_a_host_bound_step():
    """Ranks idle 0–40 ms before the step ends (a ~20 ms mean on a 40 ms step of kernels with
    little spread): at dp=64 every step waits for the slowest host, which the host-idle source
    explains; removing it keeps the mean idle, so the step stays above the kernels alone."""
    post = analysis_posterior(draws=10, scales={"gpustep": {"gemm": 0.02}})
    inventory = post["inventory"].to_dataset()
    ranks, steps = inventory.sizes["rank"], 4
    idle = np.linspace(0.0, 40e3, ranks * steps).reshape(steps, ranks, 1)
    inventory["traced_idle_us"] = (("step_unit", "rank", "sync"), idle)
    inventory["sync_role"] = ("sync", ["step"])
    post["inventory"] = inventory
    result = sensitivity(post, analysis_plan(dp=64), draws=10, replicates=16)
    host = _entry(result, "host", "idle")
    assert host["composed"] and result["contributions"][0] is host
    assert host["p95_delta_s"] > 0.01  # the slowest of 64 hosts idles far above the mean
    assert 0 < host["halved"]["p95_delta_s"] < host["p95_delta_s"]
    assert "host" in format_table(result, "dp64", top=3)
    # without traced idle there is no such source
    plain = sensitivity(analysis_posterior(draws=4), analysis_plan(dp=4), draws=4, replicates=2)
    assert not [e for e in plain["contributions"] if e["level"] == "idle"]


def test_degraded_links_are_a_source_with_their_cost():
    # every 2-node cluster has a degraded link (rate 1) that makes the inter-node gradient
    # all-reduce 3x slower in bandwidth: removing the source takes exactly that time off
    from posterior_builders import kernel_posterior

    from bayesprism.costs import collectives
    from bayesprism.plan import ParallelPlan

    kernels = {"g": {"class": "gemm", "launches": 1.0, "log_median": np.log(1000.0)},
               "ar [dp]": {"class": "allreduce", "role": "dp", "launches": 1.0,
                           "log_median": np.log(10.0), "bytes": 1e9, "group": 2.0}}
    post = kernel_posterior(kernels, traced_plan={"dp": 2}, gpus_per_node=1, draws=4,
                            degraded_link=(1.0, np.log(3.0)))
    group = post["posterior"].to_dataset()
    post["posterior"] = group.assign(coll_fabric_exponent=(
        ("chain", "draw"), np.zeros((group.sizes["chain"], group.sizes["draw"]))))
    result = sensitivity(post, ParallelPlan(dp=2, gpus_per_node=1), draws=4, replicates=2)
    link = _entry(result, "fabric", "degraded_link")
    extra = (collectives.transfer_time_us("allreduce", 2, 1e9, 10.0, 25.0 / 3.0)
             - collectives.transfer_time_us("allreduce", 2, 1e9, 10.0, 25.0)) / 1e6
    assert link["composed"] and link["p95_delta_s"] == pytest.approx(extra)
    assert result["contributions"][0] is link
