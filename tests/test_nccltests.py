"""nccl-tests output reader, on hand-written fixtures in the real output format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bayesprism.errors import TraceFormatError
from bayesprism.ingest.nccltests import can_read, read_nccl_tests
from bayesprism.schema import validate_table

DATA = Path(__file__).parent / "data" / "nccl_tests"
ALL_REDUCE = DATA / "all_reduce_perf_2x8.log"
REDUCE_SCATTER = DATA / "reduce_scatter_perf_1x8.txt"


def test_all_reduce_two_nodes():
    df, report = read_nccl_tests(ALL_REDUCE)
    df = validate_table(df, source=str(ALL_REDUCE))
    # 28 sizes (8 B .. 1 GiB) x out-of-place and in-place; the MPI warning line is not a row
    assert len(df) == 56 and report["skipped"] == {}
    assert df["phase"].tolist()[:2] == ["out-of-place", "in-place"]
    assert df["bytes"].tolist()[::2] == [float(2**k) for k in range(3, 31)]
    assert df["step"].tolist()[::2] == list(range(28))
    assert set(df["kernel"]) == {"nccl-tests:all_reduce_perf"}
    assert set(df["kernel_class"]) == {"allreduce"}
    assert set(df["group_size"]) == {16} and set(df["dtype"]) == {"float"}
    assert set(df["node"]) == {"gpu-a017"} and set(df["rank"]) == {0} and set(df["gpu"]) == {0}
    assert (df["transfer_us"] == df["duration_us"]).all() and (df["wait_us"] == 0).all()
    last = ALL_REDUCE.read_text().splitlines()
    row = next(line for line in last if line.strip().startswith("1073741824")).split()
    big = df[df["bytes"] == 2**30]
    assert big["duration_us"].tolist() == [float(row[5]), float(row[9])]
    meta = report["run_meta"]
    assert report["run"] == "all_reduce_perf_2x8"
    assert (meta["world_size"], meta["nodes"], meta["gpus_per_node"]) == (16, 2, 8)
    assert meta["hosts"] == ["gpu-a017", "gpu-a018"]
    assert meta["platform"] == "NVIDIA H100 80GB HBM3"
    assert meta["nccl_tests_version"] == "2.13.9" and meta["nccl_version"] == "2.21.5+cuda12.4"


def test_single_process_eight_gpus_collective_from_file_name():
    df, report = read_nccl_tests(REDUCE_SCATTER, run="dgx07")
    assert len(df) == 18 and set(df["kernel_class"]) == {"reducescatter"}
    assert set(df["run"]) == {"dgx07"} and set(df["dtype"]) == {"half"}
    assert set(df["group_size"]) == {8}
    assert report["run_meta"]["nodes"] == 1 and report["run_meta"]["gpus_per_node"] == 8
    # the bus bandwidth printed by nccl-tests is consistent with the time we read
    text = [
        ln.split()
        for ln in REDUCE_SCATTER.read_text().splitlines()
        if ln.strip() and ln.strip()[0].isdigit()
    ]
    busbw = np.array([float(r[7]) for r in text])
    oop = df[df["phase"] == "out-of-place"]
    mine = oop["bytes"].to_numpy() / oop["duration_us"].to_numpy() / 1e3 * 7 / 8
    assert np.allclose(mine, busbw, rtol=0.01)


def test_can_read():
    assert can_read(ALL_REDUCE, ALL_REDUCE.read_bytes()[:65536])
    assert not can_read(Path("x.log"), b":::MLLOG {}")


def _row(size, count, dtype, redop, time_oop, wrong_oop, time_ip, wrong_ip) -> str:
    """One result line laid out as nccl-tests prints it (bandwidths are irrelevant here)."""
    bw = "N/A" if time_ip == "N/A" else "0.00"
    return (
        f"{size:>12}{count:>14}{dtype:>10}{redop:>8}{-1:>8}"
        f"{time_oop:>9}{'0.00':>8}{'0.00':>8}{wrong_oop:>7}"
        f"{time_ip:>9}{bw:>8}{bw:>8}{wrong_ip:>7}"
    )


def _section(binary_line: str, rows: list[str]) -> list[str]:
    return [
        binary_line,
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 "
        "agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
        "#  Rank  0 Group  0 Pid   1001 on hostA device  0 [0000:04:00] NVIDIA H100 80GB HBM3",
        "#  Rank  1 Group  0 Pid   2001 on hostB device  0 [0000:04:00] NVIDIA H100 80GB HBM3",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        *rows,
    ]


def test_several_sweeps_bad_times_and_wrong_results(tmp_path):
    path = tmp_path / "mixed.log"
    path.write_text(
        "\n".join(
            _section(
                "# Collective test starting: alltoall_perf",
                [
                    _row(8, 1, "float", "none", "30.10", 0, "N/A", "N/A"),
                    _row(16, 2, "float", "none", "30.50", 3, "30.40", 0),
                ],
            )
            + _section(
                "# Collective test starting: alltoall_perf",
                [
                    _row(8, 1, "float", "none", "31.00", 0, "31.20", 0),
                    "   32  1  float  none",
                ],
            )
        )
        + "\n"
    )
    df, report = read_nccl_tests(path)
    assert df["step"].tolist() == [0, 1, 1, 2, 2]
    assert df["duration_us"].tolist() == [30.10, 30.50, 30.40, 31.00, 31.20]
    assert report["skipped"] == {
        "nccl-tests time is not a positive number": 1,
        "nccl-tests row with an unexpected number of fields": 1,
    }
    assert any("several sweeps" in n for n in report["notes"])
    assert any("validation errors" in n for n in report["notes"])
    assert set(df["kernel_class"]) == {"alltoall"} and set(df["group_size"]) == {2}


def test_errors_name_the_file(tmp_path):
    unknown = tmp_path / "results.log"
    unknown.write_text(
        "\n".join(
            _section(
                "# nccl-tests version 2.13.9",
                [_row(8, 2, "float", "sum", "20.0", 0, "20.0", 0)],
            )
        )
        + "\n"
    )
    with pytest.raises(TraceFormatError, match=r"results\.log: collective: cannot tell which"):
        read_nccl_tests(unknown)
    empty = tmp_path / "all_gather_perf.log"
    empty.write_text("# nThread 1 nGpus 1\n# Using devices\n")
    with pytest.raises(TraceFormatError, match=r"all_gather_perf\.log: no nccl-tests result rows"):
        read_nccl_tests(empty)
    bad = tmp_path / "b.log"
    bad.write_text("# Collective test starting: hypercube_perf\n# nThread 1\n")
    with pytest.raises(TraceFormatError, match=r"unknown nccl-tests binary.*'hypercube_perf'"):
        read_nccl_tests(bad)


def test_dispatcher_reads_the_fixture():
    bp = pytest.importorskip("bayesprism")
    table = bp.read_traces([ALL_REDUCE], progress=False)
    assert len(table) == 56 and set(table["kernel_class"].astype(str)) == {"allreduce"}
    assert table.attrs["runs"]["all_reduce_perf_2x8"]["world_size"] == 16
