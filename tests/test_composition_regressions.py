"""Regressions of the composition (issue 4 follow-up): common random numbers under zero
loadings, the slowdown cap of heavy tails, measured node positions above the exact limit, and
the per-posterior array cache."""

from __future__ import annotations

import numpy as np
import pytest
from posterior_builders import GEMM_SPREAD, gemm_only, quiet_compose
from scipy import stats

from bayesprism.forecast import composition, workload
from bayesprism.forecast.composition import build_plan_model, compose, ideal_step_time, rank_law
from bayesprism.forecast.extremes import top_node_log_multipliers
from bayesprism.plan import Cluster, ParallelPlan, PlanWarning


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fast"])
def test_zero_node_loading_keeps_every_other_random_number(exact):
    # removing the node loading must change the node terms only: with a node population of
    # zero spread in the reference (node_scale tiny but drawn) and exactly 0 in the
    # counterfactual, both runs see the same GPU, step and residual numbers
    tiny = {**GEMM_SPREAD, "node": {"gemm": 1e-300}}
    zero = {**GEMM_SPREAD, "node": {"gemm": 0.0}}
    plan = ParallelPlan(dp=64, tp=8, pp=4, microbatches=8)
    a = quiet_compose(gemm_only(draws=20, scales=tiny), plan, replicates=3,
                      rng=np.random.default_rng(5), exact=exact)
    b = quiet_compose(gemm_only(draws=20, scales=zero), plan, replicates=3,
                      rng=np.random.default_rng(5), exact=exact)
    np.testing.assert_allclose(a.step_time_s, b.step_time_s, rtol=1e-12)


def test_zero_gpu_loading_with_student_t_nodes_keeps_common_random_numbers():
    # Student-t draws consume a parameter-dependent amount of the stream (rejection sampling):
    # the other sources must not see it
    params = {"node_nu": 4.0}
    tiny = {**GEMM_SPREAD, "gpu": {"gemm": 1e-300}}
    zero = {**GEMM_SPREAD, "gpu": {"gemm": 0.0}}
    plan = ParallelPlan(dp=32, tp=8, pp=2, microbatches=4)
    kw = {"draws": 10, "node_population": "student_t", "population_params": params}
    a = quiet_compose(gemm_only(scales=tiny, **kw), plan, replicates=2,
                      rng=np.random.default_rng(2))
    b = quiet_compose(gemm_only(scales=zero, **kw), plan, replicates=2,
                      rng=np.random.default_rng(2))
    np.testing.assert_allclose(a.step_time_s, b.step_time_s, rtol=1e-12)


HEAVY = {"node": {"gemm": 0.5}, "gpustep": {"gemm": 0.02}, "resid": {"gemm": 0.1}}


def heavy_posterior(draws: int = 30):
    return gemm_only(draws=draws, scales=HEAVY, node_population="student_t",
                     population_params={"node_nu": 1.1})


def test_heavy_tailed_nodes_are_capped_at_max_slowdown_and_warned():
    post = heavy_posterior()
    plan = ParallelPlan(dp=65536)
    with pytest.warns(PlanWarning, match=r"slowdown cap .*20x.* binds in .* node"):
        steps = compose(post, plan, replicates=2, rng=np.random.default_rng(0))
    ideal = steps.ideal_step_time_s
    assert np.all(np.isfinite(steps.step_time_s)) and np.all(np.isfinite(steps.wait_s))
    # no rank runs slower than 20x its typical pace (residual mean factor aside)
    assert steps.step_time_s.max() <= 20.0 * ideal * (1 + 1e-9)
    assert np.median(steps.step_time_s) > 10.0 * ideal  # the cap binds: the slowest node
    total = steps.compute_s + steps.exposed_comm_s + steps.bubble_s + steps.wait_s
    np.testing.assert_allclose(total, steps.step_time_s)
    wider = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(0),
                          max_slowdown=100.0)
    assert wider.step_time_s.max() > 20.0 * ideal


def test_capped_exact_and_fast_paths_agree():
    # node scale 0.02 with nu = 1.1 on 256 nodes: the cap binds in ~30% of the steps
    post = gemm_only(draws=1000, scales={**HEAVY, "node": {"gemm": 0.02}},
                     node_population="student_t", population_params={"node_nu": 1.1})
    plan = ParallelPlan(dp=256, tp=8)  # 2,048 GPUs: both paths run
    exact = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(1), exact=True)
    fast = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(1), exact=False)
    ideal = exact.ideal_step_time_s
    at_cap = [np.mean(s.step_time_s > 19.9 * ideal) for s in (exact, fast)]
    assert 0.2 < at_cap[0] < 0.4
    assert at_cap[1] == pytest.approx(at_cap[0], abs=0.05)
    levels = [0.05, 0.25, 0.5]
    np.testing.assert_allclose(np.quantile(fast.step_time_s, levels),
                               np.quantile(exact.step_time_s, levels), rtol=0.15)
    assert max(s.step_time_s.max() for s in (exact, fast)) <= 20.0 * ideal * (1 + 1e-9)


@pytest.mark.parametrize(("nu", "n_nodes"), [(1.1, 256), (1.1, 8192), (1.5, 1000)])
def test_order_statistics_of_power_law_nodes(nu, n_nodes):
    # maxima of very heavy tails spread over decades: the inverse CDF must still be exact
    scale = 0.02
    post = gemm_only(draws=200, scales={"node": {"gemm": scale}}, node_population="student_t",
                     population_params={"node_nu": nu})
    model = build_plan_model(post, ParallelPlan(dp=n_nodes * 8))
    top = top_node_log_multipliers(rank_law(model), post, n_nodes, 10, 2,
                                   np.random.default_rng(0))
    dist = stats.t(nu)
    assert np.all(np.isfinite(top))
    first = stats.kstest(top[..., 0].ravel(), lambda x: dist.cdf(x / scale) ** n_nodes)
    assert first.pvalue > 0.01

    def second_cdf(x):
        f, sf = dist.cdf(x / scale), dist.sf(x / scale)
        return f**n_nodes + n_nodes * f ** (n_nodes - 1) * sf

    assert stats.kstest(top[..., 1].ravel(), second_cdf).pvalue > 0.01


def test_max_slowdown_must_exceed_one():
    from bayesprism.errors import InputError

    with pytest.raises(InputError) as exc:
        quiet_compose(gemm_only(draws=2), ParallelPlan(dp=8), rng=np.random.default_rng(0),
                      max_slowdown=1.0)
    assert exc.value.lines() == ["arguments: max_slowdown: must be a number above 1, got 1.0"]


def test_measured_node_positions_are_kept_above_the_exact_limit():
    # 4,096 GPUs on 512 nodes, the first two measured, one very slow: with the default
    # (exact=None) the measured nodes keep their stages, i.e. the exact path's numbers
    measured = {"slow": 3.0, "fine": 0.0}
    post = gemm_only(draws=4, scales={"node": {"gemm": 0.1}, "resid": {"gemm": 0.05}},
                     measured_nodes=measured)
    plan = ParallelPlan(dp=256, tp=8, pp=2, microbatches=4)
    cluster = Cluster(nodes=tuple(measured))
    auto = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(4), cluster=cluster)
    exact = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(4), cluster=cluster,
                          exact=True)
    np.testing.assert_array_equal(auto.step_time_s, exact.step_time_s)
    with pytest.warns(PlanWarning, match="measured node positions"):
        forced = compose(post, plan, replicates=2, rng=np.random.default_rng(4), cluster=cluster,
                         exact=False)
    np.testing.assert_array_equal(forced.step_time_s, exact.step_time_s)


def test_arrays_passed_in_compose_the_same_steps_and_edits_are_seen():
    post = gemm_only(draws=5, scales=GEMM_SPREAD)
    plan = ParallelPlan(dp=16, tp=2)
    first = workload.posterior_arrays(post)
    given = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(0), arrays=first)
    extracted = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(given.step_time_s, extracted.step_time_s)
    # nothing is remembered: a variable replaced in place is seen by the next extraction
    post["posterior"]["node_scale"] = post["posterior"]["node_scale"] * 2.0
    edited = workload.posterior_arrays(post)
    np.testing.assert_allclose(edited.class_scale[("node", "gemm")],
                               2 * first.class_scale[("node", "gemm")])
    assert composition.DEFAULT_MAX_SLOWDOWN == 20.0


def test_ideal_step_counts_launch_noise_at_its_mean_so_a_noise_only_plan_is_not_slowed():
    # Only launch-to-launch noise (s = 0.3), no unit/step variability: the ideal step must be
    # the mean step (launches * exp(mu + s^2/2)), not the median launch times the launches.
    post = gemm_only(launches=500.0, scales={"resid": {"gemm": 0.3}})
    plan = ParallelPlan(dp=1, gpus_per_node=8)
    ideal = ideal_step_time(post, plan)
    assert ideal == pytest.approx(500 * 100.0 * np.exp(0.045) / 1e6, rel=1e-9)
    steps = quiet_compose(post, plan, replicates=200, rng=np.random.default_rng(0))
    assert np.mean(steps.step_time_s) == pytest.approx(ideal, rel=0.01)
