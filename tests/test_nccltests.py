"""nccl-tests output reader, on hand-written fixtures in the real output format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bayesprism.costs import collectives as coll
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


# --------------------------------------------------------------------------- CSV sweeps
CSV_HEADER = ("collective,nodes,gpus,size_bytes,dtype,run,iters,time_us,algbw_GBps,busbw_GBps,"
              "hostnames\n")


def _csv_line(collective, nodes, gpus, size, run, time, hosts) -> str:
    algbw = size / time / 1e3
    return f"{collective},{nodes},{gpus},{size},bfloat16,{run},20,{time},{algbw:.3f},0,{hosts}\n"


def test_csv_sweeps_of_the_dev_fleet(shared_data):
    path = shared_data / "simulated" / "megatron-3d-dev" / "nccl_bench.csv"
    assert can_read(path, path.read_bytes()[:65536])
    raw = pd.read_csv(path)
    df, report = read_nccl_tests(path)
    df = validate_table(df, source=str(path))
    assert len(df) == len(raw) == 432 and report["skipped"] == {}
    assert set(df["kernel_class"].astype(str)) == {"allgather", "reducescatter", "allreduce"}
    assert set(df["kernel"].astype(str)) == {"nccl-tests:all_gather_perf",
                                            "nccl-tests:reduce_scatter_perf",
                                            "nccl-tests:all_reduce_perf"}
    assert (df["group_size"].to_numpy() == raw["gpus"].to_numpy()).all()
    assert (df["bytes"].to_numpy() == raw["size_bytes"].to_numpy()).all()
    assert (df["transfer_us"] == df["duration_us"]).all() and (df["wait_us"] == 0).all()
    # nccl-tests' size is the full buffer: algbw = size / time, busbw = algbw (p-1)/p for
    # AllGather/ReduceScatter, the convention of bayesprism.costs.collectives
    gather = raw["collective"] == "all_gather"
    bus = coll.bandwidth_factor("allgather", raw["gpus"]) * raw["size_bytes"] / raw["time_us"]
    assert np.allclose(bus[gather] / 1e3, raw.loc[gather, "busbw_GBps"], rtol=0.01)
    # one step per sweep (node count x repeat), shared by its sizes; node = its first host
    assert df["step"].nunique() == 24
    assert (df.groupby("step")["bytes"].nunique() == 6).all()
    assert df["node"].iloc[0] == raw["hostnames"].iloc[0].split(";")[0]
    meta = report["run_meta"]
    assert report["run"] == "nccl_bench" and meta["gpus_per_node"] == 8
    assert meta["benchmark"] is True and meta["format"] == "nccl-tests"


def test_csv_sweeps_feed_the_cost_model_with_both_tiers(shared_data):
    bp = pytest.importorskip("bayesprism")
    from bayesprism.model import prepare
    from bayesprism.spec import ModelSpec

    path = shared_data / "simulated" / "megatron-3d-dev" / "nccl_bench.csv"
    table = bp.read_traces([path], progress=False)
    prepared = prepare([table], ModelSpec())
    # every line is a cell of its own (collective, tier, size, bytes, sweep)
    assert prepared.summary["collective_rows"] == prepared.summary["collective_cells"] == 432
    # one node (8 GPUs) is intra-node, 2-32 nodes inter-node
    assert prepared.data["coll_observed_tiers"].all()
    one_node = int((pd.read_csv(path)["nodes"] == 1).sum())
    assert int((prepared.data["coll_cell_tier"] == 0).sum()) == one_node == 72


def test_csv_gpus_per_node_hosts_and_errors(tmp_path):
    path = tmp_path / "sweep.csv"
    path.write_text(CSV_HEADER
                    + _csv_line("all_reduce", 1, 4, 1048576, 0, 30.0, "a")
                    + _csv_line("all_reduce", 2, 8, 1048576, 0, 90.0, "a;b")
                    + _csv_line("allgather_perf", 2, 16, 1048576, 0, 80.0, "c;d")
                    + _csv_line("all_reduce", 1, 4, 2097152, 0, -1, "a"))
    df, report = read_nccl_tests(path)
    # 4 GPUs per node on a and b, 8 on c and d: runs of their own, so 8 ranks on 2 nodes of 4
    # GPUs are inter-node and 16 ranks on 2 nodes of 8 too
    assert report["runs"]["sweep/4-gpus-per-node"]["gpus_per_node"] == 4
    assert report["runs"]["sweep/8-gpus-per-node"]["gpus_per_node"] == 8
    assert df["run"].tolist() == ["sweep/4-gpus-per-node"] * 2 + ["sweep/8-gpus-per-node"]
    assert df["kernel_class"].tolist() == ["allreduce", "allreduce", "allgather"]
    assert report["skipped"] == {"nccl-tests time is not a positive number": 1}
    assert any("different GPUs per node" in n for n in report["notes"])
    assert validate_table(df, source="t").groupby(["run", "rank"])["node"].nunique().max() == 1

    unknown = tmp_path / "u.csv"
    unknown.write_text(CSV_HEADER + _csv_line("hypercube", 1, 8, 1024, 0, 10.0, "a"))
    with pytest.raises(TraceFormatError, match=r"u\.csv: collective: unknown collective.*"
                                               r"'hypercube'"):
        read_nccl_tests(unknown)
    per_rank = tmp_path / "p.csv"
    per_rank.write_text(CSV_HEADER + "all_gather,1,8,1024,bf16,0,20,10.0,0.819,0,a\n")
    with pytest.raises(TraceFormatError, match=r"p\.csv: size_bytes: .*full buffer"):
        read_nccl_tests(per_rank)
    clash = tmp_path / "c.csv"
    clash.write_text(CSV_HEADER + _csv_line("all_reduce", 2, 16, 1024, 0, 10.0, "a"))
    with pytest.raises(TraceFormatError, match=r"c\.csv: hostnames: the number of hosts"):
        read_nccl_tests(clash)
    bare = tmp_path / "bare.csv"
    bare.write_text("collective,gpus,size_bytes,time_us\nall_reduce,8,1024,10.0\n")
    df, report = read_nccl_tests(bare)
    assert df["group_size"].tolist() == [8] and report["run_meta"]["gpus_per_node"] == 8
    assert any("every group is taken as one node" in n for n in report["notes"])
