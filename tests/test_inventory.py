"""Kernel and step inventories on hand-built tables with hand-computed values."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from bayesprism.inventory import (
    collective_role,
    kernel_inventory,
    run_layout,
    step_inventory,
    traced_step_times_us,
)
from bayesprism.schema import empty_attrs, validate_table


def _kernel_table(plan: dict | None = None) -> pd.DataFrame:
    # (rank, node, gpu, step, kernel, class, start, duration, bytes, group size)
    rows = [
        (0, "a", 0, 0, "g", "gemm", 0, 10, None, None),
        (0, "a", 0, 0, "g", "gemm", 12, 10, None, None),
        (0, "a", 0, 0, "ar", "allreduce", 25, 5, 100, 3),
        (0, "a", 0, 1, "g", "gemm", 100, 10, None, None),
        (0, "a", 0, 1, "ar", "allreduce", 115, 5, 300, 3),
        (1, "a", 1, 0, "g", "gemm", 0, 20, None, None),
        (1, "a", 1, 0, "ar", "allreduce", 30, 4, 100, 3),
        (1, "a", 1, 1, "g", "gemm", 100, 20, None, None),
        (1, "a", 1, 1, "ar", "allreduce", 125, 4, 300, 3),
        (2, "b", 0, 0, "g", "gemm", 0, 8, None, None),
        (2, "b", 0, 0, "ar", "allreduce", 9, 6, 100, 3),
    ]
    df = pd.DataFrame(rows, columns=["rank", "node", "gpu", "step", "kernel", "kernel_class",
                                     "start_us", "duration_us", "bytes", "group_size"])
    df["run"] = "r"
    df.attrs = empty_attrs()
    meta = {"platform": "V100", "world_size": 3}
    if plan is not None:
        meta["plan"] = plan
    df.attrs["runs"] = {"r": meta}
    return validate_table(df)


def test_kernel_inventory_exact_values():
    inv = kernel_inventory(_kernel_table({"dp": 3, "tp": 1, "pp": 1}))
    assert list(inv["kernel"].values) == ["ar", "g"]
    assert list(inv["kernel_class"].values) == ["allreduce", "gemm"]
    np.testing.assert_allclose(inv["launches"].sel(kernel="g").values, [1.5, 1.0, 1.0])
    np.testing.assert_allclose(inv["launches"].sel(kernel="ar").values, [1.0, 1.0, 1.0])
    np.testing.assert_allclose(inv["launches_per_step"].values, [1.0, 3.5 / 3])
    assert inv["bytes_per_launch"].sel(kernel="ar") == pytest.approx(180.0)
    assert np.isnan(inv["bytes_per_launch"].sel(kernel="g"))
    assert inv["group_size"].sel(kernel="ar") == 3
    assert list(inv["role"].values) == ["dp", "compute"]
    assert list(inv["rank_node"].values) == ["a", "a", "b"]
    assert list(inv["rank_gpu"].values) == [0, 1, 0]
    assert list(inv["step_unit"].values) == ["r/0", "r/1"]
    np.testing.assert_allclose(inv["traced_step_time_us"].values,
                               [[30, 34, 15], [20, 29, np.nan]])
    # the step: node a 0 -> 34 and 100 -> 129, node b 0 -> 15; the longest node counts
    np.testing.assert_allclose(inv["traced_step_span_us"].values, [34, 29])
    # node a's step 1 starts 100 us after its step 0, which spans 34 us: 66 us between steps
    np.testing.assert_allclose(inv["traced_step_gap_us"].values, [66, np.nan])
    # idle before the AllReduce from the node's step start (0 and 100 on node a), minus the
    # GEMMs' cover; nothing after it; rank 2 ran nothing in step 1
    np.testing.assert_allclose(inv["traced_idle_us"].values,
                               [[[5, 0], [10, 0], [1, 0]], [[5, 0], [5, 0], [np.nan, np.nan]]])
    assert list(inv["sync_role"].values) == ["dp", "step"]
    # data-parallel collectives only: no stage group meets inside the step
    assert np.isnan(inv["sync_segment_us"]) and np.isnan(inv["sync_segment_share"])
    plan = json.loads(inv.attrs["traced_plan"])
    assert plan == {"dp": 3, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "microbatches": None,
                    "gpus_per_node": 2, "world_size": 3}
    assert inv.attrs["run"] == "r" and inv.attrs["platform"] == "V100"


def test_the_host_time_between_steps_is_read_on_each_nodes_own_clock():
    """Node b's clock runs 1,000 us ahead of node a's; steps 0, 1, 2 and 4 are traced. Each
    node's step starts 100 then 110 us after its previous one; the longest node span is b's
    90 us (a's 80): 10 and 20 us between steps, none known after step 2 (step 3 untraced) and
    the last."""
    rows = []
    for step, start in zip((0, 1, 2, 4), (0.0, 100.0, 210.0, 500.0), strict=True):
        rows += [(0, "a", step, start, 80.0), (1, "b", step, start + 1000.0, 90.0)]
    df = pd.DataFrame(rows, columns=["rank", "node", "step", "start_us", "duration_us"])
    df = df.assign(run="r", gpu=0, kernel="g", kernel_class="gemm")
    df.attrs = empty_attrs()
    df.attrs["runs"] = {"r": {"platform": "H100", "world_size": 2}}
    inv = kernel_inventory(validate_table(df))
    np.testing.assert_allclose(inv["traced_step_span_us"].values, [90, 90, 90, 90])
    np.testing.assert_allclose(inv["traced_step_gap_us"].values, [10, 20, np.nan, np.nan])
    # the step as timed from one start to the next: the unknown gaps at their median, 15 us
    np.testing.assert_allclose(traced_step_times_us(inv), [100, 110, 105, 105])


def test_compute_segments_between_tensor_parallel_collectives():
    """Each rank's compute from one TP collective to the next (a segment its group waits on):
    rank 0 covers 20 µs (two GEMMs) before the AllGather and 6 µs before the ReduceScatter,
    then 5 µs to the step's end; rank 1 covers 8 and 4 µs."""
    rows = [
        (0, 0, "g", "gemm", 0, 10), (0, 0, "g", "gemm", 12, 10), (0, 0, "ag", "allgather", 25, 5),
        (0, 0, "g", "gemm", 30, 6), (0, 0, "rs", "reducescatter", 40, 5),
        (0, 0, "g", "gemm", 45, 5),
        (1, 1, "g", "gemm", 0, 8), (1, 1, "ag", "allgather", 25, 5), (1, 1, "g", "gemm", 30, 4),
        (1, 1, "rs", "reducescatter", 40, 5),
    ]
    df = pd.DataFrame(rows, columns=["rank", "gpu", "kernel", "kernel_class", "start_us",
                                     "duration_us"])
    df = df.assign(run="r", node="a", step=0, bytes=np.where(df["kernel"] == "g", np.nan, 64.0),
                   group_size=np.where(df["kernel"] == "g", np.nan, 2.0))
    df.attrs = empty_attrs()
    df.attrs["runs"] = {"r": {"platform": "H100", "world_size": 2,
                              "plan": {"dp": 1, "tp": 2, "pp": 1}}}
    inv = kernel_inventory(validate_table(df))
    assert set(inv["role"].sel(kernel=["ag", "rs"]).values) == {"tp"}
    segments = np.array([20.0, 6.0, 8.0, 4.0])
    assert float(inv["sync_segment_us"]) == pytest.approx((segments**2).sum() / segments.sum())
    assert float(inv["sync_segment_share"]) == pytest.approx(segments.sum() / (31.0 + 12.0))


def test_kernel_inventory_without_plan_defaults_dp_to_world_size():
    inv = kernel_inventory(_kernel_table(plan=None))
    assert json.loads(inv.attrs["traced_plan"])["dp"] == 3
    assert inv["role"].sel(kernel="ar") == "dp"  # world-size group, no plan
    assert inv.attrs["plan_known"] == 0


@pytest.mark.parametrize(
    ("kernel_class", "group", "plan", "role"),
    [
        ("allreduce", 4, {"dp": 2, "tp": 4, "pp": 2, "known": True}, "tp"),
        ("allreduce", 2, {"dp": 2, "tp": 4, "pp": 2, "known": True}, "dp"),
        ("sendrecv", 2, {"dp": 2, "tp": 4, "pp": 2, "known": True}, "pp"),
        ("alltoall", 4, {"dp": 4, "ep": 4, "known": True}, "ep"),
        ("allgather", 3, {"dp": 2, "tp": 4, "known": True}, "unknown"),
        ("allreduce", 8, {"world_size": 8, "known": False}, "dp"),
        ("allreduce", 4, {"world_size": 8, "known": False}, "unknown"),
        ("allreduce", np.nan, {"dp": 8, "known": True}, "unknown"),
        ("gemm", np.nan, {"dp": 8, "known": True}, "compute"),
    ],
)
def test_collective_role(kernel_class, group, plan, role):
    assert collective_role(kernel_class, group, plan) == role


def _step_table() -> pd.DataFrame:
    times = {"big/0": [2.0, 1.0, 1.2, 1.1], "small/0": [0.6, 0.5, 0.4]}
    rows = [(run, s, t * 1e6) for run, ts in times.items() for s, t in enumerate(ts)]
    df = pd.DataFrame(rows, columns=["run", "step", "duration_us"])
    df = df.assign(rank=-1, node="*", gpu=-1, kernel="train_step", kernel_class="step")
    df.attrs = empty_attrs()
    df.attrs["runs"] = {
        "big/0": {"platform": "H100", "world_size": 64, "gpus_per_node": 8, "global_batch": 64,
                  "plan": {"tp": 4, "pp": 2, "microbatches": 4}},
        "small/0": {"platform": "H100", "world_size": 16, "gpus_per_node": 8,
                    "plan": {"dp": 2, "tp": 4, "pp": 2, "microbatches": 8,
                             "virtual_stages": 2}},
    }
    return validate_table(df)


def test_step_inventory_records_runs_and_logged_times():
    inv = kernel_inventory(_step_table())  # dispatches on all-step rows
    assert inv.attrs["kind"] == "step"
    assert list(inv["run"].values) == ["big/0", "small/0"]
    assert list(inv["dp"].values) == [8, 2]  # 64 / (4*2) derived
    assert list(inv["microbatches"].values) == [4, 8]
    assert list(inv["virtual_stages"].values) == [1, 2]
    np.testing.assert_allclose(inv["micro_batch_size"].values, [2.0, np.nan])  # 64/(8*4)
    assert list(inv["steps_logged"].values) == [4, 3]
    np.testing.assert_allclose(inv["step_time_s"].values,
                               [[2.0, 1.0, 1.2, 1.1], [0.6, 0.5, 0.4, np.nan]])
    np.testing.assert_allclose(inv["step_time_median_s"].values, [1.15, 0.5])
    assert inv.attrs["platform"] == "H100"
    assert step_inventory(_step_table()).identical(inv)


def test_run_layout_reports_inconsistent_plan():
    _, problems = run_layout("x", {"world_size": 10, "plan": {"dp": 4, "tp": 2,
                                                                   "microbatches": 1}})
    assert len(problems) == 1
    assert "dp*tp*pp*cp = 8 differs from world_size 10" in str(problems[0])
    _, problems = run_layout("x", {"world_size": 8, "plan": {}})
    assert [str(p) for p in problems] == [
        "table: attrs.runs['x'].plan.microbatches: is missing (gradient-accumulation steps "
        "per DP rank)"]


def test_covered_lengths_match_a_brute_force_union():
    """Host idle is each window's length minus what the rank's kernels cover in it: the
    covered length of overlapping, nested and disjoint intervals in many windows at once equals
    a union measured on a fine grid, window by window."""
    from bayesprism.inventory import _covered_lengths

    rng = np.random.default_rng(4)
    starts = rng.uniform(0, 100, 60).round(1)
    ends = starts + rng.exponential(3.0, 60).round(1)
    lo = rng.uniform(-5, 105, 40).round(1)
    hi = lo + rng.uniform(-2, 30, 40).round(1)  # some windows empty (hi <= lo)
    grid = np.arange(-10, 140, 0.05) + 0.025  # cell centres, 0.05 wide
    covered = ((grid[:, None] >= starts) & (grid[:, None] < ends)).any(axis=1)
    expected = [0.05 * (covered & (grid >= a) & (grid < b)).sum()
                for a, b in zip(lo, hi, strict=True)]
    np.testing.assert_allclose(_covered_lengths(starts, ends, lo, hi), expected, atol=1e-9)
    assert _covered_lengths(starts[:0], ends[:0], lo, hi).tolist() == [0.0] * 40
