"""What-if forecasts: exact deltas on deterministic posteriors, common random numbers, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from posterior_builders import analysis_plan, analysis_posterior

from bayesprism.analysis.what_if import Changes, what_if
from bayesprism.costs.collectives import transfer_time_us
from bayesprism.errors import InputError
from bayesprism.forecast.composition import compose
from bayesprism.plan import Cluster

pytestmark = pytest.mark.filterwarnings("ignore::bayesprism.plan.PlanWarning")

#: typical compute of one step of one rank of the builder's run: 10 x 2000 + 10 x 20 + 10 x 1000 µs
COMPUTE_US = 30_200.0
GEMM_US = 20_000.0


def test_faster_class_shortens_a_deterministic_step_exactly():
    post = analysis_posterior(draws=6)
    result = what_if(post, analysis_plan(dp=1), {"faster": {"gemm": 0.1}}, draws=6, replicates=3)
    assert result["base"]["mean_s"] == pytest.approx(COMPUTE_US / 1e6, rel=1e-9)
    assert result["deltas"]["mean_s"]["estimate"] == pytest.approx(-0.1 * GEMM_US / 1e6, rel=1e-9)
    assert result["deltas"]["p95_s"]["ci90"] == pytest.approx([-0.002, -0.002], rel=1e-9)
    assert result["relative"]["mean_s"]["estimate"] == pytest.approx(1 - 0.1 * GEMM_US / COMPUTE_US)
    assert result["changes"] == {"faster": {"gemm": 0.1}}


def test_bandwidth_and_latency_change_the_data_parallel_allreduce_exactly():
    post = analysis_posterior(draws=4)
    plan = analysis_plan(dp=4)  # 4 ranks on 2 nodes: the gradient AllReduce uses the inter tier
    # traced gradients: 2 buckets of 5e7 bytes; inter tier of allreduce: 20 µs, 20 GB/s
    one = transfer_time_us("allreduce", 4, 5e7, 20.0, 20.0)
    faster_links = transfer_time_us("allreduce", 4, 5e7, 20.0, 40.0)
    lower_latency = transfer_time_us("allreduce", 4, 5e7, 10.0, 20.0)
    base = what_if(post, plan, {}, draws=4, replicates=2)
    assert base["base"]["mean_s"] == pytest.approx((COMPUTE_US + 2 * one) / 1e6, rel=1e-9)
    bw = what_if(post, plan, {"bandwidth": {"allreduce": 2.0}}, draws=4, replicates=2)
    assert bw["deltas"]["mean_s"]["estimate"] == pytest.approx(2 * (faster_links - one) / 1e6)
    lat = what_if(post, plan, {"latency": {"allreduce/inter": 0.5}}, draws=4, replicates=2)
    assert lat["deltas"]["mean_s"]["estimate"] == pytest.approx(2 * (lower_latency - one) / 1e6)
    intra_only = what_if(post, plan, {"latency": {"allreduce/intra": 0.5}}, draws=4, replicates=2)
    assert intra_only["deltas"]["mean_s"]["estimate"] == 0.0
    # a faster collective class with the cost model: its whole transfer takes (1 - x) of the time
    halved = what_if(post, plan, {"faster": {"allreduce": 0.5}}, draws=4, replicates=2)
    assert halved["deltas"]["mean_s"]["estimate"] == pytest.approx(-one / 1e6, rel=1e-9)


def test_no_change_gives_exactly_zero_deltas_under_variability():
    """Common random numbers: the same draws and seed give identical forecasts."""
    post = analysis_posterior(
        draws=10,
        scales={"gpustep": {"gemm": 0.2}, "step": {"attention": 0.1}},
        coll_noise={"allreduce": 0.3},
    )
    result = what_if(post, analysis_plan(dp=4), Changes(), draws=10, replicates=16, random_seed=3)
    for key in ("mean_s", "p50_s", "p95_s"):
        assert result["deltas"][key] == {"estimate": 0.0, "ci90": [0.0, 0.0]}
    assert result["base"]["p95_s"] > result["base"]["ideal_step_time_s"]


def test_thresholds_are_ratios_and_the_old_fractions_still_work_with_a_warning():
    """1.10 asks for P(step > 1.10 x ideal), keyed "1.10" as in forecast; 0.1, the spelling
    of earlier releases, gives the same numbers with a FutureWarning."""
    post = analysis_posterior(draws=6, scales={"gpustep": {"gemm": 0.2}})
    args = (post, analysis_plan(dp=2), {"faster": {"gemm": 0.1}})
    ratio = what_if(*args, draws=6, replicates=8, thresholds=(1.02, 1.10))
    assert list(ratio["base"]["slowdown_p"]) == ["1.02", "1.10"]
    assert ratio["thresholds"] == [1.02, 1.10]
    with pytest.warns(FutureWarning, match="read as fractions"):
        old = what_if(*args, draws=6, replicates=8, thresholds=(0.02, 0.1))
    assert old["base"] == ratio["base"] and old["deltas"] == ratio["deltas"]
    base = ratio["base"]
    assert 0 < base["slowdown_p"]["1.02"] and base["slowdown_p"]["1.10"] <= base["slowdown_p"][
        "1.02"]


def test_microbatches_and_schedule_match_direct_compositions_with_the_same_seed():
    post = analysis_posterior(draws=8, scales={"gpustep": {"gemm": 0.1}})
    base_plan = analysis_plan(dp=1, pp=4, microbatches=4, schedule="gpipe", activation_bytes=1e6)
    result = what_if(
        post,
        base_plan,
        {"microbatches": 8, "schedule": "1f1b"},
        draws=8,
        replicates=8,
        random_seed=5,
    )
    changed_plan = analysis_plan(dp=1, pp=4, microbatches=8, schedule="1f1b", activation_bytes=1e6)
    base = compose(post, base_plan, replicates=8, rng=np.random.default_rng(5))
    changed = compose(post, changed_plan, replicates=8, rng=np.random.default_rng(5))
    expected = (changed.step_time_s.mean(axis=1) - base.step_time_s.mean(axis=1)).mean()
    assert result["deltas"]["mean_s"]["estimate"] == pytest.approx(expected, rel=1e-12)
    assert result["changed_plan"]["schedule"] == "1f1b"
    assert result["changed_plan"]["microbatches"] == 8


def _nodes(n: int, slow: str | None = "n5") -> dict[str, float]:
    effects = {f"n{i}": 0.0 for i in range(n)}
    if slow:
        effects[slow] = 3.0
    return effects


def test_drain_with_a_spare_keeps_the_plan_and_removes_the_slow_node():
    post = analysis_posterior(draws=4, scales={"node": {"gemm": 0.1}}, node_effect=_nodes(9))
    plan = analysis_plan(dp=2, tp=2, pp=4, microbatches=8, activation_bytes=1e6)
    cluster = Cluster(gpus_per_node=2, nodes=tuple(f"n{i}" for i in range(9)))
    result = what_if(post, plan, {"drain": 1}, cluster=cluster, draws=4, replicates=2)
    assert result["drained"] == ["n5"]
    assert result["changed_plan"] == result["plan"]
    assert result["deltas"]["mean_s"]["estimate"] < 0
    remaining = Cluster(gpus_per_node=2, nodes=tuple(f"n{i}" for i in range(9) if i != 5))
    direct = compose(post, plan, replicates=2, rng=np.random.default_rng(0), cluster=remaining)
    assert result["changed"]["mean_s"] == pytest.approx(direct.step_time_s.mean(), rel=1e-12)


def test_drain_without_spares_shrinks_data_parallelism_and_keeps_the_global_batch():
    post = analysis_posterior(draws=4, scales={"node": {"gemm": 0.1}}, node_effect=_nodes(8))
    plan = analysis_plan(dp=2, tp=2, pp=4, microbatches=8, activation_bytes=1e6)
    result = what_if(post, plan, {"drain": ["n5"]}, draws=4, replicates=2)
    assert result["drained"] == ["n5"]
    assert result["changed_plan"]["dp"] == 1
    assert result["changed_plan"]["microbatches"] == 16


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"faster": {"gemm": 1.5}}, "changes: faster.gemm: must be a fraction in [0, 1), got 1.5"),
        ({"faster": {"fft": 0.1}}, "changes: faster.fft: unknown kernel class"),
        ({"bandwidth": {"allgather": 2.0}}, "changes: bandwidth.allgather: unknown collective"),
        ({"latency": {"allreduce": -1}}, "changes: latency.allreduce: must be a positive"),
        ({"speed": 2}, "changes: speed: unknown change"),
        ({"drain": -1}, "changes: drain: must be >= 0, got -1"),
        ({"microbatches": 0}, "changes: microbatches: must be a positive integer, got 0"),
    ],
)
def test_bad_changes_are_named(changes, message):
    post = analysis_posterior(draws=2)
    with pytest.raises(InputError) as info:
        what_if(post, analysis_plan(dp=1), changes, draws=2, replicates=1)
    assert message in str(info.value)
