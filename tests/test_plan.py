"""ParallelPlan and Cluster: construction, TOML files, validation messages."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from bayesprism.errors import PlanError
from bayesprism.plan import Cluster, ParallelPlan, PlanWarning


def lines_of(exc_info) -> list[str]:
    return exc_info.value.lines()


def test_defaults_gpus_and_name():
    plan = ParallelPlan(dp=4, tp=8, pp=2, cp=2, microbatches=8)
    assert plan.gpus == 128
    assert plan.nodes == 16
    assert plan.name == "dp4-tp8-pp2-cp2-m8-1f1b"
    assert dataclasses.is_dataclass(plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.dp = 2  # type: ignore[misc]


def test_generated_name_follows_replace_but_a_given_name_stays():
    plan = ParallelPlan(dp=4, pp=2, microbatches=4)
    assert dataclasses.replace(plan, dp=8).name == "dp8-tp1-pp2-m4-1f1b"
    named = ParallelPlan(name="prod", dp=4)
    assert dataclasses.replace(named, dp=8).name == "prod"


def test_every_problem_reported_at_once_with_exact_messages():
    with pytest.raises(PlanError) as exc:
        ParallelPlan(dp=0, tp=2.5, schedule="pipedream", sharding="zero3", overlap=1.5)
    assert lines_of(exc) == [
        "plan: dp: must be a positive integer, got 0",
        "plan: tp: must be a positive integer, got 2.5",
        "plan: overlap: must be a fraction between 0 and 1, got 1.5",
        "plan: schedule: unknown schedule; allowed: gpipe, 1f1b, interleaved-1f1b, zero-bubble, "
        "got 'pipedream'",
        "plan: sharding: unknown sharding; allowed: none, zero1, zero2, fsdp, got 'zero3'",
    ]


def test_relations_between_fields():
    with pytest.raises(PlanError) as exc:
        ParallelPlan(name="bad", dp=6, tp=2, pp=4, ep=4, world_size=40, layers=2,
                     virtual_stages=2, microbatches=8)
    assert lines_of(exc) == [
        "plan 'bad': world_size: must equal dp*tp*pp*cp = 6*2*4*1 = 48, got 40",
        "plan 'bad': ep: must divide the data-parallel degree dp = 6, got 4",
        "plan 'bad': virtual_stages: only used by schedule 'interleaved-1f1b', not '1f1b', got 2",
        "plan 'bad': pp: pp*virtual_stages = 8 stages exceed layers = 2, got 4",
    ]


def test_tp_must_divide_the_attention_heads():
    with pytest.raises(PlanError) as exc:
        ParallelPlan(tp=16, heads=8, gpus_per_node=16, name="gqa")
    assert lines_of(exc) == [
        "plan 'gqa': tp: must divide heads = 8 (tensor parallelism splits the attention heads), "
        "got 16"]
    assert ParallelPlan(tp=8, heads=64).heads == 64


def test_nodes_spanned_by_the_widest_group():
    from bayesprism.plan import nodes_spanned
    assert [nodes_spanned(span, 8) for span in (1, 2, 3, 4, 6, 7, 8, 12, 16, 20, 24)] == [
        1, 1, 2, 1, 2, 2, 1, 2, 2, 3, 3]


def test_interleaved_needs_multiple_of_pp_and_chunks():
    with pytest.raises(PlanError) as exc:
        ParallelPlan(pp=4, microbatches=6, schedule="interleaved-1f1b")
    assert lines_of(exc) == [
        "plan: virtual_stages: schedule 'interleaved-1f1b' needs >= 2, got 1",
        "plan: microbatches: schedule 'interleaved-1f1b' needs a multiple of pp = 4, got 6",
    ]
    plan = ParallelPlan(pp=4, microbatches=8, schedule="interleaved-1f1b", virtual_stages=2)
    assert plan.name == "dp1-tp1-pp4-m8-v2-interleaved-1f1b"


def test_warnings_for_wasteful_layouts():
    with pytest.warns(PlanWarning, match="microbatches = 2 < pp = 4"):
        ParallelPlan(pp=4, microbatches=2)
    with pytest.warns(PlanWarning, match="tp = 16 > gpus_per_node = 8"):
        ParallelPlan(tp=16)
    with pytest.warns(PlanWarning, match="tp = 7 does not divide gpus_per_node = 8: some "
                      "tensor-parallel groups straddle two nodes"):
        ParallelPlan(tp=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ParallelPlan(pp=4, microbatches=2, schedule="gpipe")  # GPipe has no 1F1B steady state


def test_toml_array_of_plans(tmp_path):
    path = tmp_path / "plans.toml"
    path.write_text(
        '[[plan]]\nname = "small"\ndp = 4\ntp = 2\n\n'
        '[[plan]]\nname = "big"\ndp = 64\ntp = 8\npp = 4\nmicrobatches = 16\n'
        'schedule = "zero-bubble"\nsharding = "zero1"\noverlap = 0.5\nsteps = 1000\n\n'
        '[cluster]\ngpus_per_node = 4\nnodes = ["n1", "n2"]\n'
        '[cluster.tiers.inter]\nbandwidth_gbps = 50.0\n'
    )
    small, big = ParallelPlan.from_toml(path)
    assert (small.name, small.gpus) == ("small", 8)
    assert (big.schedule, big.sharding, big.overlap, big.steps, big.gpus) == (
        "zero-bubble", "zero1", 0.5, 1000, 2048)
    cluster = Cluster.from_toml(path)
    assert cluster == Cluster(gpus_per_node=4, nodes=("n1", "n2"),
                              tiers={"inter": {"bandwidth_gbps": 50.0}})


def test_toml_single_plan_at_top_level_or_in_one_table(tmp_path):
    top = tmp_path / "top.toml"
    top.write_text("dp = 2\npp = 2\nmicrobatches = 4\n")
    table = tmp_path / "table.toml"
    table.write_text("[plan]\ndp = 2\npp = 2\nmicrobatches = 4\n")
    assert ParallelPlan.from_toml(top) == ParallelPlan.from_toml(table)
    assert Cluster.from_toml(top) is None


def test_toml_errors_name_file_plan_and_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[plan]]\nname = "a"\ndp = 2\n\n[[plan]]\nname = "b"\ndpp = 2\npp = -1\n')
    with pytest.raises(PlanError) as exc:
        ParallelPlan.from_toml(path)
    lines = lines_of(exc)
    assert len(lines) == 2
    assert lines[0].startswith(f"{path}[plan 1] 'b': dpp: unknown plan field; allowed: ")
    assert lines[1] == f"{path}[plan 1] 'b': pp: must be a positive integer, got -1"
    broken = tmp_path / "broken.toml"
    broken.write_text("dp = \n")
    with pytest.raises(PlanError, match="invalid TOML"):
        ParallelPlan.from_toml(broken)


def test_cluster_validation():
    with pytest.raises(PlanError) as exc:
        Cluster(gpus_per_node=0, nodes=("a", "a"), tiers={"rack": {}, "inter": {"speed": 1}})
    assert lines_of(exc) == [
        "cluster: gpus_per_node: must be a positive integer, got 0",
        "cluster: nodes: lists a node twice",
        "cluster: tiers: unknown tier; allowed: intra, inter, got 'rack'",
        "cluster: tiers.inter: unknown key; allowed: latency_us, bandwidth_gbps, got 'speed'",
    ]


def test_plan_from_run_uses_the_fitted_layout():
    """dp from the world size, micro-batch size from the global batch, recorded schedule kept."""
    from bayesprism.plan import plan_from_run

    meta = {"world_size": 64, "gpus_per_node": 4, "global_batch": 256,
            "plan": {"tp": 2, "pp": 4, "microbatches": 16, "virtual_stages": 2}}
    plan = plan_from_run(meta)
    assert (plan.dp, plan.tp, plan.pp, plan.microbatches) == (8, 2, 4, 16)
    assert plan.micro_batch_size == 256 / (8 * 16)
    assert (plan.schedule, plan.virtual_stages, plan.gpus_per_node) == (
        "interleaved-1f1b", 2, 4)
    assert plan.name == "64 GPUs"
    kept = plan_from_run({**meta, "plan": {**meta["plan"], "virtual_stages": 1,
                                           "schedule": "zero-bubble", "overlap": 0.5}},
                         name="x")
    assert (kept.schedule, kept.overlap, kept.name) == ("zero-bubble", 0.5, "x")
    with pytest.raises(PlanError, match=r"attrs.runs\[.r1.\].world_size: is missing"):
        plan_from_run({"plan": {"tp": 2}}, run="r1")
    with pytest.raises(PlanError, match=r"dp\*tp\*pp\*cp = 32 differs from world_size 64"):
        plan_from_run({"world_size": 64, "plan": {"dp": 4, "tp": 2, "pp": 4}}, run="r1")
