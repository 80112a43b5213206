"""Placement: slot geometry, a degraded node placed where the schedule has slack, drain advice."""

from __future__ import annotations

import numpy as np
import pytest
from posterior_builders import analysis_plan, analysis_posterior

from bayesprism.analysis.placement import place
from bayesprism.cli.place import format_table
from bayesprism.errors import InputError
from bayesprism.forecast.composition import compose
from bayesprism.forecast.slots import drained_cluster, rank_nodes, slots_of
from bayesprism.plan import Cluster

pytestmark = pytest.mark.filterwarnings("ignore::bayesprism.plan.PlanWarning")


def _plan(**kw):
    return analysis_plan(activation_bytes=1e6, **kw)


def _nodes(n: int, slow: dict[str, float] | None = None) -> dict[str, float]:
    effects = {f"n{i}": 0.0 for i in range(n)}
    effects.update(slow or {})
    return effects


PIPELINE = dict(dp=2, tp=2, pp=4, microbatches=8, schedule="1f1b")


def test_slots_follow_megatron_rank_order():
    slots = slots_of(_plan(**PIPELINE), 2)  # tp=2 fills a node: slot = one (replica, stage)
    assert [(s.stages, s.replicas, s.tp_groups) for s in slots[:3]] == [
        ((0,), (0,), (0,)),
        ((0,), (1,), (1,)),
        ((1,), (0,), (2,)),
    ]
    assert slots[-1].position() == {
        "slot": 7,
        "ranks": [14, 15],
        "stage": 3,
        "replica": 1,
        "tp_group": 7,
    }
    wide = slots_of(_plan(dp=1, tp=4, pp=2), 2)  # a tp group spans two nodes
    assert [(s.stages, s.piece, s.tp_groups) for s in wide] == [
        ((0,), 0, (0,)),
        ((0,), 1, (0,)),
        ((1,), 0, (1,)),
        ((1,), 1, (1,)),
    ]
    packed = slots_of(_plan(dp=8), 4)  # four replicas per node
    assert [s.replicas for s in packed] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert packed[0].position()["replica"] == [0, 1, 2, 3]


def _step_with_slow_node_at(post, plan, slot: int, slow: str, n: int) -> float:
    others = [f"n{i}" for i in range(n) if f"n{i}" != slow]
    others.insert(slot, slow)
    cluster = Cluster(gpus_per_node=2, nodes=tuple(others))
    return float(
        compose(
            post, plan, replicates=2, rng=np.random.default_rng(0), cluster=cluster
        ).step_time_s.mean()
    )


@pytest.fixture(scope="module")
def degraded():
    """Eight typical nodes and n5 degraded (+3 sd, GEMM/attention 35% slower on it)."""
    post = analysis_posterior(
        draws=4,
        node_effect=_nodes(8, {"n5": 3.0}),
        scales={"node": {"gemm": 0.1, "attention": 0.1}},
    )
    plan = _plan(**PIPELINE)
    by_slot = [_step_with_slow_node_at(post, plan, j, "n5", 8) for j in range(8)]
    return post, plan, by_slot


def test_degraded_node_goes_where_the_schedule_has_slack(degraded):
    post, plan, by_slot = degraded
    # 1F1B: a slow first stage delays the pipeline least, a slow last stage most
    assert by_slot[0] < by_slot[2] < by_slot[4] < by_slot[6]
    result = place(post, plan, draws=4, replicates=2, random_placements=32, random_seed=2)
    assert result["assignment"]["n5"]["stage"] == 0
    assert result["objective_s"] == pytest.approx(by_slot[0], rel=1e-12)
    assert result["gain_vs_worst"] == pytest.approx(max(by_slot) / min(by_slot), rel=1e-12)
    # a random placement puts n5 in a uniformly random slot
    expected_random = np.mean(by_slot) / min(by_slot)
    assert result["gain_vs_random"] > 1.0
    assert result["gain_vs_random"] == pytest.approx(expected_random, abs=0.012)
    assert result["gain_vs_random_ci90"][0] <= result["gain_vs_random"]
    assert result["spares"] == []


def test_placement_cannot_gain_without_slack():
    """Plain data parallelism: every slot is equivalent, every placement equally good."""
    post = analysis_posterior(
        draws=4, node_effect=_nodes(4, {"n1": 3.0}), scales={"node": {"gemm": 0.1}}
    )
    result = place(post, _plan(dp=8), draws=4, replicates=8)
    assert result["gain_vs_random"] == pytest.approx(1.0, abs=1e-12)
    assert result["gain_vs_worst"] == pytest.approx(1.0, abs=1e-12)
    # with transient noise the best of many noisy evaluations is not reported as a gain
    noisy = analysis_posterior(
        draws=4,
        node_effect=_nodes(4, {"n1": 3.0}),
        scales={"node": {"gemm": 0.1}, "gpustep": {"gemm": 0.05}},
    )
    result = place(noisy, _plan(dp=8), draws=4, replicates=8)
    assert result["gain_vs_random"] == pytest.approx(1.0, abs=0.003)
    assert result["gain_vs_random_ci90"][0] < 1.0 < result["gain_vs_random_ci90"][1]


def test_slow_nodes_share_one_tensor_parallel_group_in_the_stage_with_slack():
    post = analysis_posterior(
        draws=4,
        node_effect=_nodes(4, {"n1": 3.0, "n2": 3.0}),
        scales={"node": {"gemm": 0.1, "attention": 0.1}},
    )
    result = place(post, _plan(dp=1, tp=4, pp=2, microbatches=8), draws=4, replicates=2)
    assert result["assignment"]["n1"]["tp_group"] == result["assignment"]["n2"]["tp_group"] == 0
    assert result["gain_vs_worst"] > 1.05


def test_draining_the_degraded_node_is_the_first_advice(degraded):
    post, plan, _ = degraded
    result = place(post, plan, draws=4, replicates=2, drain=2)
    assert result["drain"][0] == "n5"
    first = result["drain_detail"][0]
    assert first["node"] == "n5" and first["dp"] == 1 and first["microbatches"] == 16
    assert first["throughput_per_gpu_gain"] > 1.0 and first["improves"]


def test_a_degraded_node_with_a_spare_is_left_out():
    post = analysis_posterior(
        draws=4,
        node_effect=_nodes(9, {"n5": 3.0}),
        scales={"node": {"gemm": 0.1, "attention": 0.1}},
    )
    result = place(post, _plan(**PIPELINE), draws=4, replicates=2, drain=1)
    assert result["spares"] == ["n5"] and "n5" not in result["assignment"]
    # draining a node that runs nothing changes nothing: no drain is advised, consistently
    first = result["drain_detail"][0]
    assert first["node"] == "n5" and not first["improves"]
    assert first["throughput_per_gpu_gain"] == pytest.approx(1.0, rel=1e-12)
    assert result["drain"] == []
    table = format_table(result, "pipeline")
    assert "spare" in table and "advice: drain nothing" in table


def test_results_are_reproducible_with_a_seed():
    post = analysis_posterior(
        draws=6,
        node_effect=_nodes(8, {"n5": 2.0, "n2": 1.0}),
        node_effect_sd=0.5,
        scales={"node": {"gemm": 0.1}, "gpustep": {"gemm": 0.05}},
    )
    plan = _plan(**PIPELINE)
    kw = dict(objective="p95", draws=4, replicates=4, random_seed=11, max_compositions=20)
    first = place(post, plan, **kw)
    again = place(post, plan, **kw)
    assert first == again
    assert first["objective"] == "p95" and first["gain_vs_random"] >= 1.0


def test_a_plan_larger_than_the_measured_nodes_is_placed_with_new_nodes():
    """16 slots, 4 measured nodes (n2 degraded): the measured nodes keep their effects in the
    first slots, 12 new nodes come from the population; draining n2 puts a new node in its
    place (the plan is kept) and is advised because it raises throughput."""
    post = analysis_posterior(
        draws=4,
        node_effect=_nodes(4, {"n2": 3.0}),
        scales={"node": {"gemm": 0.1, "attention": 0.1}},
    )
    plan = _plan(dp=32)  # 32 one-GPU replicas on 2-GPU nodes: 16 node slots
    result = place(post, plan, draws=4, replicates=2, drain=2)
    assert result["new_nodes"] == 12 and set(result["assignment"]) == {"n0", "n1", "n2", "n3"}
    assert result["spares"] == []
    first, second = result["drain_detail"]
    assert first["node"] == "n2" and first["dp"] == 32 and first["gpus"] == 32
    assert first["improves"] and first["throughput_per_gpu_gain"] > 1.05
    # the advice is the prefix with the best gain, and says so in the table
    best = max(range(2), key=lambda j: result["drain_detail"][j]["throughput_per_gpu_gain"])
    assert result["drain"] == ["n2", second["node"]][: best + 1]
    assert all(d["improves"] for d in result["drain_detail"][: len(result["drain"])])
    table = format_table(result, "dp32")
    assert "12 new nodes drawn from the fitted population" in table
    assert "advice: drain n2" in table


def test_drained_cluster_shrinks_dp_only_without_spares():
    plan = _plan(**PIPELINE)
    ranking = ["n5", "n0", "n1", "n2", "n3", "n4", "n6", "n7", "n8"]
    cluster = Cluster(gpus_per_node=2, nodes=tuple(f"n{i}" for i in range(9)))
    kept_cluster, kept_plan, drained = drained_cluster(cluster, plan, 1, ranking)
    assert drained == ["n5"] and kept_plan == plan and len(kept_cluster.nodes) == 8
    _, small_plan, drained = drained_cluster(cluster, plan, ["n5", "n7"], ranking)
    assert (small_plan.dp, small_plan.microbatches) == (1, 16)


def test_bad_input_is_named():
    post = analysis_posterior(draws=2, node_effect=_nodes(4))
    with pytest.raises(InputError, match="node not measured in the posterior"):
        place(post, _plan(dp=2), cluster=Cluster(gpus_per_node=2, nodes=("n0", "x9")), draws=2)
    with pytest.raises(InputError, match="objective: must be one of"):
        place(post, _plan(dp=2), objective="median", draws=2)
    assert rank_nodes(analysis_posterior(draws=2, node_effect={"a": 0.0, "b": 1.0})) == ["b", "a"]


def test_cli_prints_json_and_tables(tmp_path, degraded, capsys):
    import json

    from bayesprism import io
    from bayesprism.cli.main import main

    post, _, _ = degraded
    path = tmp_path / "posterior.nc"
    io.save(post, path)
    plan = tmp_path / "plan.toml"
    plan.write_text(
        "dp = 2\ntp = 2\npp = 4\nmicrobatches = 8\ngpus_per_node = 2\nactivation_bytes = 1e6\n"
    )
    args = ["place", str(path), "--plan", str(plan), "--draws", "2", "--replicates", "2"]
    assert main([*args, "--json", "--drain", "1", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"assignment", "gain_vs_random", "gain_vs_random_ci90", "gain_vs_worst", "drain"} <= set(
        result
    )
    assert result["assignment"]["n5"]["stage"] == 0 and result["drain"] == ["n5"]
    one_draw = ["place", str(path), "--plan", str(plan), "--draws", "1", "--replicates", "1"]
    assert main([*one_draw, "--objective", "p95", "--quiet"]) == 0
    assert "gain vs random" in capsys.readouterr().out
