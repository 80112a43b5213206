"""Composition: hand-computable step times, order statistics, exact vs fast path."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import xarray as xr
from posterior_builders import GEMM_SPREAD, gemm_only, kernel_posterior, quiet_compose
from scipy import stats

from bayesprism.errors import InputError
from bayesprism.forecast.composition import build_plan_model, compose, ideal_step_time, rank_law
from bayesprism.forecast.extremes import top_node_log_multipliers
from bayesprism.plan import Cluster, ParallelPlan, PlanWarning

LOG100 = float(np.log(100.0))


def dp_posterior(**kwargs):
    kernels = {
        "gemm0": {"class": "gemm", "launches": 10, "log_median": LOG100},
        "ar_grad": {"class": "allreduce", "role": "dp", "launches": 2, "bytes": 1e8,
                    "group": 8, "log_median": float(np.log(5000.0))},
    }
    return kernel_posterior(kernels, traced_plan={"dp": 8}, **kwargs)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_deterministic_pipeline_step_is_m_plus_p_minus_1_slots(schedule):
    post = gemm_only(draws=3)  # one rank did 10 x 100 us per step, one micro-batch
    plan = ParallelPlan(pp=4, microbatches=8, schedule=schedule)
    steps = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(0))
    slot = 10 * 100.0 / 4 * 1e-6  # F + B of one micro-batch on a stage of 1/4 of the layers
    np.testing.assert_allclose(steps.step_time_s, (8 + 4 - 1) * slot)
    np.testing.assert_allclose(steps.compute_s, 8 * slot)
    np.testing.assert_allclose(steps.bubble_s, 3 * slot)
    np.testing.assert_allclose(steps.wait_s, 0.0, atol=1e-15)
    assert steps.ideal_step_time_s == pytest.approx(11 * slot)


def test_zero_bubble_and_interleaved_steps():
    post = gemm_only(draws=2)
    slot = 10 * 100.0 / 4 * 1e-6
    zb = quiet_compose(post, ParallelPlan(pp=4, microbatches=8, schedule="zero-bubble"),
                       replicates=1, rng=np.random.default_rng(0))
    # F : B : W = 1 : 1 : 1 (backward split in halves): (3m + p - 1) thirds of a slot
    np.testing.assert_allclose(zb.step_time_s, (3 * 8 + 3) * slot / 3)
    inter = quiet_compose(post, ParallelPlan(pp=4, microbatches=8, schedule="interleaved-1f1b",
                                             virtual_stages=2),
                          replicates=1, rng=np.random.default_rng(0))
    np.testing.assert_allclose(inter.bubble_s, 3 * slot / 2)
    np.testing.assert_allclose(inter.step_time_s, 8 * slot + 3 * slot / 2)


@pytest.mark.parametrize(
    ("dp", "sharding", "overlap", "comm_us"),
    [
        # inter-node ring AllReduce of 16: alpha 2(p-1) + b 2(p-1)/p / bw, two 1e8-byte buckets
        (16, "none", 0.0, 2 * (10 * 2 * 15 + 1e8 * 2 * 15 / 16 / 25e3)),
        (16, "none", 0.5, 0.5 * 2 * (10 * 2 * 15 + 1e8 * 2 * 15 / 16 / 25e3)),
        # intra-node (8 GPUs on one node): 5 us, 100 GB/s
        (8, "none", 0.0, 2 * (5 * 2 * 7 + 1e8 * 2 * 7 / 8 / 100e3)),
        # ReduceScatter + AllGather cost what one ring AllReduce costs; FSDP adds an AllGather
        (16, "zero1", 0.0, 2 * 2 * (10 * 15 + 1e8 * 15 / 16 / 25e3)),
        (16, "fsdp", 0.0, 2 * 3 * (10 * 15 + 1e8 * 15 / 16 / 25e3)),
    ],
)
def test_data_parallel_ring_collectives(dp, sharding, overlap, comm_us):
    post = dp_posterior(draws=2)
    plan = ParallelPlan(dp=dp, sharding=sharding, overlap=overlap)
    steps = compose(post, plan, replicates=1, rng=np.random.default_rng(0))
    np.testing.assert_allclose(steps.step_time_s, (1000.0 + comm_us) * 1e-6)
    np.testing.assert_allclose(steps.exposed_comm_s, comm_us * 1e-6)
    np.testing.assert_allclose(steps.compute_s, 1000.0 * 1e-6)


def test_a_steps_congestion_is_shared_by_all_transfers_of_a_tier():
    """ZeRO-1 over 16 ranks on 2 nodes: the reduce-scatter and the all-gather cross the same
    inter-node links in the same step, so one congestion draw moves both. Their total is the
    deterministic cost times exp(0.1 eta): log sd 0.1 (independent draws would give 0.071)."""
    post = dp_posterior(draws=1, coll_congestion={"reducescatter/inter": 0.1,
                                                  "allgather/inter": 0.1})
    plan = ParallelPlan(dp=16, sharding="zero1")
    steps = compose(post, plan, replicates=4000, rng=np.random.default_rng(0))
    comm_us = 2 * 2 * (10 * 15 + 1e8 * 15 / 16 / 25e3)
    log_ratio = np.log(steps.exposed_comm_s / (comm_us * 1e-6))
    assert float(np.std(log_ratio)) == pytest.approx(0.1, rel=0.05)
    assert float(np.mean(log_ratio)) == pytest.approx(0.0, abs=0.01)


def test_a_posterior_with_one_congestion_per_collective_still_forecasts():
    """Posteriors fitted before congestion was per (collective, tier) key it by collective."""
    post = dp_posterior(draws=1)
    group = post["posterior"].to_dataset()
    old = xr.full_like(group["coll_noise"], 0.1)  # dims (chain, draw, collective)
    post["posterior"] = xr.DataTree(group.drop_vars("coll_congestion").assign(coll_congestion=old))
    steps = compose(post, ParallelPlan(dp=16), replicates=4000, rng=np.random.default_rng(0))
    assert float(np.std(np.log(steps.exposed_comm_s))) == pytest.approx(0.1, rel=0.05)


def test_tensor_parallel_synthesised_from_activation_bytes():
    post = gemm_only(draws=2)
    plan = ParallelPlan(tp=2, microbatches=2, layers=4, activation_bytes=1e6)
    steps = compose(post, plan, replicates=1, rng=np.random.default_rng(0))
    # compute: 1000 us of one replica, halved by tp, per micro-batch; 2 micro-batches
    # TP: 4 AllReduces per layer per micro-batch of 2 ranks: 5*2 + 1e6*(2*1/2)/1e5 = 20 us
    np.testing.assert_allclose(steps.compute_s, 1000e-6)
    np.testing.assert_allclose(steps.exposed_comm_s, 4 * 4 * 2 * 20e-6)
    np.testing.assert_allclose(steps.step_time_s, 1000e-6 + 640e-6)


def test_pipeline_transfers_from_traced_send_recv():
    kernels = {
        "gemm0": {"class": "gemm", "launches": 10, "log_median": LOG100},
        "p2p": {"class": "sendrecv", "role": "pp", "launches": 8, "bytes": 1e6, "group": 2,
                "log_median": 3.0},
    }
    post = kernel_posterior(kernels, traced_plan={"pp": 2, "microbatches": 4}, draws=2)
    plan = ParallelPlan(pp=4, microbatches=8, schedule="gpipe")
    steps = compose(post, plan, replicates=1, rng=np.random.default_rng(0))
    slot = 10 * 100.0 * 2 / (4 * 4)  # traced stage had half the layers and 4 micro-batches
    transfer = 5.0 + 1e6 / 100e3  # one intra-node send/recv
    np.testing.assert_allclose(steps.step_time_s, ((8 + 3) * slot + 2 * 3 * transfer) * 1e-6)


def test_optimizer_is_sharded_by_zero():
    kernels = {
        "gemm0": {"class": "gemm", "launches": 10, "log_median": LOG100},
        "adam": {"class": "optimizer", "launches": 1, "log_median": float(np.log(160.0))},
    }
    post = kernel_posterior(kernels, draws=2)
    with pytest.warns(PlanWarning, match="no data-parallel gradient collectives"):
        plain = compose(post, ParallelPlan(dp=16), replicates=1, rng=np.random.default_rng(0))
    with pytest.warns(PlanWarning):
        zero = compose(post, ParallelPlan(dp=16, sharding="zero1"), replicates=1,
                       rng=np.random.default_rng(0))
    np.testing.assert_allclose(plain.step_time_s, (1000 + 160) * 1e-6)
    np.testing.assert_allclose(zero.step_time_s, (1000 + 10) * 1e-6)


def test_measured_nodes_use_their_own_effects():
    post = gemm_only(draws=4, scales={"node": {"gemm": 0.1}},
                     measured_nodes={"fast": 0.0, "slow": 5.0})
    plan = ParallelPlan(dp=16)  # two nodes: both measured
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        steps = compose(post, plan, replicates=2, rng=np.random.default_rng(0),
                        cluster=Cluster(nodes=("fast", "slow")))
        np.testing.assert_allclose(steps.step_time_s, 1000e-6 * np.exp(0.5))
        np.testing.assert_allclose(steps.wait_s, 1000e-6 * (np.exp(0.5) - (1 + np.exp(0.5)) / 2))
        with pytest.raises(InputError) as exc:
            compose(post, plan, replicates=1, rng=np.random.default_rng(0),
                    cluster=Cluster(nodes=("fast", "gone")))
    assert exc.value.lines() == [
        "cluster: nodes: not a measured node of the posterior (1 row), got 'gone'"
    ]


def test_same_seed_same_numbers_other_seed_other_numbers():
    post = gemm_only(draws=20, scales=GEMM_SPREAD)
    plan = ParallelPlan(dp=4, tp=8, pp=2, microbatches=4)
    a = quiet_compose(post, plan, replicates=4, rng=np.random.default_rng(7))
    b = quiet_compose(post, plan, replicates=4, rng=np.random.default_rng(7))
    c = quiet_compose(post, plan, replicates=4, rng=np.random.default_rng(8))
    np.testing.assert_array_equal(a.step_time_s, b.step_time_s)
    assert not np.array_equal(a.step_time_s, c.step_time_s)
    for name in ("compute_s", "exposed_comm_s", "bubble_s", "wait_s"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    total = a.compute_s + a.exposed_comm_s + a.bubble_s + a.wait_s
    np.testing.assert_allclose(total, a.step_time_s)


def test_ideal_step_is_the_variability_free_step():
    post = gemm_only(draws=50, scales=GEMM_SPREAD)
    plan = ParallelPlan(dp=2, tp=8, pp=2, microbatches=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        ideal = ideal_step_time(post, plan)
        steps = compose(post, plan, replicates=4, rng=np.random.default_rng(0))
    slot = 1000e-6 / (8 * 2)
    # launch noise (resid 0.3) at its mean, exp(0.3^2 / 2): a step sums many launches
    assert ideal == pytest.approx((4 + 1) * slot * np.exp(0.3**2 / 2))
    assert steps.ideal_step_time_s == pytest.approx(ideal)
    assert np.mean(steps.step_time_s > ideal) > 0.95  # waiting for the slowest of the ranks


class _SlowMixture:
    """The mixture population with a slow component (w 5 %, shift 4)."""

    @staticmethod
    def cdf(x):
        return 0.95 * stats.norm.cdf(x) + 0.05 * stats.norm.cdf(x - 4.0)


class _Degraded:
    """The degraded population: 5 % of units 30 core sds slow, spread over 10 core sds."""

    @staticmethod
    def cdf(x):
        return 0.95 * stats.norm.cdf(x) + 0.05 * stats.norm.cdf(x, 30.0, 10.0)


@pytest.mark.parametrize(
    ("family", "params", "dist"),
    [("normal", {}, stats.norm), ("student_t", {"node_nu": 3.0}, stats.t(3.0)),
     ("mixture", {"node_slow_weight": 0.05, "node_slow_shift": 4.0}, _SlowMixture),
     ("degraded", {"node_slow_weight": 0.05, "node_slow_shift": 30.0, "node_slow_sd": 10.0},
      _Degraded)],
)
def test_fast_path_maximum_has_the_distribution_of_the_max_of_n_draws(family, params, dist):
    n_nodes, scale = 1000, 0.1
    post = gemm_only(draws=200, scales={"node": {"gemm": scale}}, node_population=family,
                     population_params=params)
    model = build_plan_model(post, ParallelPlan(dp=n_nodes * 8))
    top = top_node_log_multipliers(rank_law(model), post, n_nodes, 10, 2, np.random.default_rng(0))
    first = top[..., 0].ravel()
    assert stats.kstest(first, lambda x: dist.cdf(x / scale) ** n_nodes).pvalue > 0.01
    # second largest: P(X_(2) <= x) = F^N + N F^(N-1) (1 - F)
    def second_cdf(x):
        f = dist.cdf(x / scale)
        return f**n_nodes + n_nodes * f ** (n_nodes - 1) * (1 - f)
    assert stats.kstest(top[..., 1].ravel(), second_cdf).pvalue > 0.01
    assert np.all(top[..., 0] >= top[..., 1])


def test_fast_path_max_over_gpus_of_a_node():
    n_nodes, scale = 500, 0.05
    post = gemm_only(draws=200, scales={"gpu": {"gemm": scale}})
    model = build_plan_model(post, ParallelPlan(dp=n_nodes * 8))
    top = top_node_log_multipliers(rank_law(model), post, n_nodes, 10, 1, np.random.default_rng(1))
    cdf = lambda x: stats.norm.cdf(x / scale) ** (8 * n_nodes)  # noqa: E731
    assert stats.kstest(top.ravel(), cdf).pvalue > 0.01


@pytest.mark.parametrize("plan", [
    ParallelPlan(dp=64, tp=8, pp=4, microbatches=8),
    ParallelPlan(dp=16, tp=8, pp=16, microbatches=32),
    ParallelPlan(dp=64, tp=4, pp=4, ep=8, microbatches=8, schedule="zero-bubble"),
], ids=lambda p: p.name)
def test_fast_path_quantiles_within_one_percent_of_exact(plan):
    post = gemm_only(draws=300, scales=GEMM_SPREAD)
    exact = quiet_compose(post, plan, replicates=8, rng=np.random.default_rng(3), exact=True)
    fast = quiet_compose(post, plan, replicates=8, rng=np.random.default_rng(3), exact=False)
    levels = [0.05, 0.25, 0.5, 0.75, 0.95]
    q_exact = np.quantile(exact.step_time_s, levels)
    q_fast = np.quantile(fast.step_time_s, levels)
    np.testing.assert_allclose(q_fast, q_exact, rtol=0.01)
    assert fast.ideal_step_time_s == exact.ideal_step_time_s
    # the interval of the mean step (one cluster per draw): within 3%
    ci_exact = np.quantile(exact.step_time_s.mean(axis=1), [0.05, 0.95])
    ci_fast = np.quantile(fast.step_time_s.mean(axis=1), [0.05, 0.95])
    np.testing.assert_allclose(ci_fast, ci_exact, rtol=0.03)


@pytest.mark.parametrize("with_dp_comm", [False, True])
def test_p95_does_not_decrease_with_dp_at_fixed_work_per_gpu(with_dp_comm):
    if with_dp_comm:
        post = dp_posterior(draws=100, scales=GEMM_SPREAD, coll_noise=0.1, coll_congestion=0.05)
    else:
        post = gemm_only(draws=100, scales=GEMM_SPREAD)
    p95 = []
    for dp in (1, 2, 8, 32, 128, 512, 2048, 4096, 32768):  # exact up to 2048, then fast
        steps = quiet_compose(post, ParallelPlan(dp=dp), replicates=4,
                              rng=np.random.default_rng(0))
        p95.append(np.quantile(steps.step_time_s, 0.95))
    assert all(b > a for a, b in itertools.pairwise(p95)), p95


def test_cluster_tier_override_replaces_the_fitted_link():
    post = dp_posterior(draws=2)
    cluster = Cluster(tiers={"inter": {"latency_us": 1.0, "bandwidth_gbps": 50.0}})
    steps = compose(post, ParallelPlan(dp=16), replicates=1, rng=np.random.default_rng(0),
                    cluster=cluster)
    comm_us = 2 * (1.0 * 2 * 15 + 1e8 * 2 * 15 / 16 / 50e3)
    np.testing.assert_allclose(steps.exposed_comm_s, comm_us * 1e-6)
    # four GPUs per node: the same 16 ranks now span four nodes, still one inter-node ring
    with pytest.warns(PlanWarning, match="cluster gpus_per_node = 4 overrides the plan's 8"):
        small_nodes = compose(post, ParallelPlan(dp=16), replicates=1,
                              rng=np.random.default_rng(0),
                              cluster=Cluster(gpus_per_node=4, tiers=cluster.tiers))
    np.testing.assert_allclose(small_nodes.exposed_comm_s, comm_us * 1e-6)
    with pytest.warns(PlanWarning, match="overrides"):
        intra = compose(post, ParallelPlan(dp=16), replicates=1, rng=np.random.default_rng(0),
                        cluster=Cluster(gpus_per_node=16, tiers=cluster.tiers))
    np.testing.assert_allclose(intra.exposed_comm_s, 2 * (5 * 30 + 1e8 * 30 / 16 / 100e3) * 1e-6)


def test_expert_parallel_replicas_advance_together():
    # 4 nodes of 8 GPUs: node = dp index + 2 * stage; nodes "a" (replica 0, stage 0) and
    # "d" (replica 1, stage 1) are slow. Each replica alone has one slow stage; with ep = 2 the
    # two replicas exchange tokens every layer, so both stages run at the slow pace.
    post = gemm_only(draws=2, scales={"node": {"gemm": 0.1}},
                     measured_nodes={"a": 5.0, "b": 0.0, "c": 0.0, "d": 5.0})
    cluster = Cluster(nodes=("a", "b", "c", "d"))
    slow = np.exp(0.5)
    slot = 1000e-6 / (8 * 2)  # F + B of one micro-batch on a stage (tp 8, pp 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        coupled = compose(post, ParallelPlan(dp=2, ep=2, tp=8, pp=2, microbatches=4),
                          replicates=1, rng=np.random.default_rng(0), cluster=cluster)
        alone = compose(post, ParallelPlan(dp=2, tp=8, pp=2, microbatches=4), replicates=1,
                        rng=np.random.default_rng(0), cluster=cluster)
    np.testing.assert_allclose(coupled.step_time_s, (4 + 1) * slot * slow)
    assert np.all(alone.step_time_s < coupled.step_time_s - 0.1 * slot)


def test_traced_gpu_idle_time_is_carried_over_per_step():
    # busy 10 x 100 us per rank; spans of 1600 us on every rank: 600 us idle, no spread
    post = gemm_only(draws=3, spans_us=[1600.0, 1600.0, 1600.0])
    steps = compose(post, ParallelPlan(pp=2, microbatches=4, schedule="gpipe"), replicates=1,
                    rng=np.random.default_rng(0))
    slot = 1000.0 / 2  # F + B per micro-batch on a stage of half the layers
    np.testing.assert_allclose(steps.step_time_s, ((4 + 1) * slot + 600.0) * 1e-6)
    np.testing.assert_allclose(steps.compute_s, (4 * slot + 600.0) * 1e-6)
    assert steps.ideal_step_time_s == pytest.approx(((4 + 1) * slot + 600.0) * 1e-6)


def _with_idle(post, idle_us, roles):
    """``post`` with a traced ``traced_idle_us`` (step_unit, rank, sync) inventory."""
    idle_us = np.asarray(idle_us, dtype=float)
    inventory = post["inventory"].to_dataset().drop_dims("step_unit", errors="ignore")
    inventory = inventory.drop_vars(["rank"], errors="ignore")
    inventory["traced_idle_us"] = (("step_unit", "rank", "sync"), idle_us)
    inventory["sync_role"] = ("sync", np.array(roles, dtype=object))
    out = post.copy()
    out["inventory"] = inventory
    return out


def test_each_synchronisation_waits_for_the_slowest_rank_idle():
    # deterministic kernels (1000 us a step); idle before a dp collective: 100 or 300 us
    # (gamma, mean 200, variance 80,000/3 from 4 traced ranks); every rank idles 50 us at the end
    traced = [[[100.0, 50.0], [300.0, 50.0], [100.0, 50.0], [300.0, 50.0]]]
    post = _with_idle(gemm_only(draws=400), traced, ["dp", "step"])
    model = build_plan_model(post, ParallelPlan(dp=16))
    assert model.idle_group.tolist() == [16, 16]
    # Bayesian bootstrap: mean around 200 us, the per-draw law varies (parameter uncertainty)
    assert np.mean(model.idle_mean[:, 0]) == pytest.approx(200.0, rel=0.03)
    assert np.ptp(model.idle_mean[:, 0]) > 50.0
    np.testing.assert_allclose(model.idle_mean[:, 1], 50.0)
    np.testing.assert_allclose(model.idle_var[:, 1], 0.0)
    steps = compose(post, ParallelPlan(dp=16), replicates=50, rng=np.random.default_rng(1))
    extra = steps.step_time_s * 1e6 - 1000.0 - 50.0  # idle of the slowest of 16 ranks
    k = model.idle_mean[:, 0] ** 2 / model.idle_var[:, 0]
    theta = model.idle_var[:, 0] / model.idle_mean[:, 0]
    # P(max of 16 <= x) = F(x)^16 averaged over draws, at the predicted quartiles
    for q in (0.25, 0.5, 0.75):
        x = np.quantile(extra, q)
        law = np.mean(stats.gamma.cdf(x, k, scale=theta) ** 16)
        assert law == pytest.approx(q, abs=0.02)
    assert np.median(extra) > 250.0  # well above the mean rank's 200 us
    total = steps.compute_s + steps.exposed_comm_s + steps.bubble_s + steps.wait_s
    np.testing.assert_allclose(total, steps.step_time_s)
    # compute holds the mean rank's idle (cap far away), wait the slowest rank's excess
    np.testing.assert_allclose(steps.compute_s * 1e6, np.broadcast_to(
        1000.0 + 50.0 + model.idle_mean[:, :1], steps.compute_s.shape), rtol=1e-6)
    assert np.mean(steps.wait_s) > 0
    # the ideal step takes every rank at its mean idle
    assert steps.ideal_step_time_s * 1e6 == pytest.approx(
        1000.0 + 50.0 + np.median(model.idle_mean[:, 0]))
    # a synchronisation of one rank (tp = 1 here) waits for nobody: its own idle only
    alone = build_plan_model(_with_idle(post, traced, ["tp", "step"]), ParallelPlan(dp=16))
    assert alone.idle_group.tolist() == [1, 16]


def test_the_host_time_between_steps_is_added_once_per_step():
    # the traced steps' boundary gaps: 30 and 50 us (gamma, mean 40, one draw per step shared
    # by every rank: the slowest of 4,096 ranks is not taken); nothing idles inside the step
    traced = [[[0.0], [0.0]], [[0.0], [0.0]]]
    post = _with_idle(gemm_only(draws=400), traced, ["step"])
    inventory = post["inventory"].to_dataset()
    inventory["traced_step_gap_us"] = ("step_unit", [30.0, 50.0])
    post["inventory"] = inventory
    model = build_plan_model(post, ParallelPlan(dp=4096))
    assert model.idle_group.tolist() == [4096, 1]
    assert np.mean(model.idle_mean[:, 1]) == pytest.approx(40.0, rel=0.05)
    for exact in (True, False):
        steps = compose(post, ParallelPlan(dp=4096), replicates=20,
                        rng=np.random.default_rng(2), exact=exact)
        gap = steps.step_time_s * 1e6 - 1000.0
        assert np.mean(gap) == pytest.approx(40.0, rel=0.1)
        assert np.median(gap) < 50.0  # one gap a step: the slowest of 4,096 would be ~100
    assert steps.ideal_step_time_s * 1e6 == pytest.approx(
        1000.0 + np.median(model.idle_mean[:, 1]))


def test_idle_is_the_same_in_the_exact_and_the_fast_path():
    traced = [[[100.0, 50.0], [300.0, 60.0], [120.0, 40.0], [250.0, 55.0]]]
    post = _with_idle(gemm_only(draws=50), traced, ["dp", "step"])
    plan = ParallelPlan(dp=4096)
    exact = compose(post, plan, replicates=4, rng=np.random.default_rng(3), exact=True)
    fast = compose(post, plan, replicates=4, rng=np.random.default_rng(3), exact=False)
    np.testing.assert_allclose(fast.step_time_s, exact.step_time_s)
    np.testing.assert_allclose(fast.wait_s, exact.wait_s)
    # the slowest of 4,096 ranks, capped at 20x the mean: bounded, above every traced value
    extra = exact.step_time_s * 1e6 - 1000.0
    assert np.all(extra > 300.0) and np.all(extra < 20 * (300.0 + 60.0))


def test_gamma_quantiles_in_blocks_equal_one_call():
    """The idle draws' inverse gamma CDF, shared out over threads by blocks of draws, gives
    the same numbers as one call (large arrays are split, small ones are not)."""
    from scipy import special

    from bayesprism.forecast.composition import _gamma_upper_quantile

    rng = np.random.default_rng(0)
    for shape_of in ((301, 8, 50), (3, 2, 5)):
        shape = rng.uniform(0.2, 30.0, shape_of)
        tail = rng.random(shape_of) ** 4
        np.testing.assert_array_equal(_gamma_upper_quantile(shape, tail),
                                      special.gammainccinv(shape, tail))


def test_plans_of_one_forecast_share_the_idle_quantiles_of_their_common_segments():
    # a tp segment (group 8 in both plans) and a dp one (16 then 64 ranks): with one memo, the
    # second plan computes only its dp segment, and every number is as without the memo
    traced = [[[100.0, 20.0], [300.0, 60.0], [120.0, 40.0], [250.0, 55.0]]]
    post = _with_idle(gemm_only(draws=40), traced, ["dp", "tp"])
    memo = {}
    for dp, stored in ((16, 2), (64, 3), (16, 3)):
        plan = ParallelPlan(dp=dp, tp=8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlanWarning)
            shared = compose(post, plan, replicates=3, rng=np.random.default_rng(4),
                             idle_quantiles=memo)
            alone = compose(post, plan, replicates=3, rng=np.random.default_rng(4))
        assert len(memo) == stored
        np.testing.assert_array_equal(shared.step_time_s, alone.step_time_s)
        np.testing.assert_array_equal(shared.wait_s, alone.wait_s)
