"""Per-GPU benchmark tables: every PAL file against the numbers in the data README."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bayesprism.errors import TraceFormatError
from bayesprism.ingest.benchmarks import can_read, read_gpu_benchmark
from bayesprism.schema import validate_table

# file: run, rows in the file, GPUs, nodes, cabinets, README median of the timing column (µs)
PAL = {
    "frontera/frontera-resnet-agg.csv": ("frontera/resnet", 1480, 296, 74, 4, 0.137e6),
    "frontera/frontera-bert-agg.csv": ("frontera/bert", 1656, 276, 69, 4, 0.179e6),
    "frontera/frontera-pagerank-agg.csv": ("frontera/pagerank", 1240, 248, 62, 4, None),
    "ls6/resnet-ls6-agg.csv": ("ls6/resnet", 219, 219, 73, 11, 0.025e6),
    "sim/resnet-longhorn-agg.csv": ("longhorn/resnet", 1404, 336, 84, 8, None),
    "sim/bert-longhorn-agg.csv": ("longhorn/bert", 1096, 136, 34, 5, None),
    "sim/pagerank-longhorn-agg.csv": ("longhorn/pagerank", 880, 172, 43, 8, None),
}


@pytest.mark.parametrize("name", list(PAL))
def test_pal_file_matches_readme(shared_data, name):
    run, rows, gpus, nodes, cabinets, median = PAL[name]
    path = shared_data / "pal" / name
    assert can_read(path, path.read_bytes()[:65536])
    df, report = read_gpu_benchmark(path)
    df = validate_table(df, source=name)
    assert report["run"] == run and set(df["run"]) == {run}
    # every row is either in the table or counted as skipped (warm-up rows of Longhorn BERT)
    assert len(df) + sum(report["skipped"].values()) == rows
    assert df["rank"].nunique() == gpus == report["run_meta"]["world_size"]
    assert df["node"].nunique() == nodes and df["cabinet"].nunique() == cabinets
    assert set(df["kernel_class"]) == {"benchmark"}
    assert set(df["kernel"]) == {run.split("/")[1]}
    # rank is a dense index over (node, gpu); each rank lives on one node
    assert sorted(df["rank"].unique()) == list(range(gpus))
    assert (df.groupby("rank", observed=True)["node"].nunique() == 1).all()
    # (rank, step) identifies one repeat
    assert not df.duplicated(["rank", "step"]).any()
    if median is not None:
        # the README rounds to 3 decimals of a second: within half a unit of the last digit
        assert df["duration_us"].median() == pytest.approx(median, abs=500)


def test_frontera_values_and_ids_exact(shared_data):
    path = shared_data / "pal" / "frontera" / "frontera-resnet-agg.csv"
    raw = pd.read_csv(path)
    df, _ = read_gpu_benchmark(path)
    first = raw.iloc[0]  # reps 0, cabinet c197, node 101, device 0
    row = df[(df["node"] == "c197-101") & (df["gpu"] == 0) & (df["step"] == 0)]
    assert len(row) == 1
    assert row["duration_us"].iloc[0] == pytest.approx(first["mean_iter_dur"] * 1e6)
    assert row["cabinet"].iloc[0] == "c197"


def test_longhorn_units_warmup_and_repeat_order(shared_data):
    path = shared_data / "pal" / "sim" / "bert-longhorn-agg.csv"
    raw = pd.read_csv(path)
    df, report = read_gpu_benchmark(path)
    assert report["skipped"] == {"warm-up run (warmup flag)": int(raw["warmup"].sum())}
    # perf is in ms: 243 ms median -> µs
    kept = raw.loc[~raw["warmup"], "perf"]
    assert df["duration_us"].median() == pytest.approx(kept.median() * 1e3)
    # steps of one GPU follow the time order of its runs
    gpu = raw[(raw["uuid"] == "c002-10-0") & ~raw["warmup"]].sort_values("ts")
    mine = df[(df["node"] == "c002-10") & (df["gpu"] == 0)].sort_values("step")
    assert np.allclose(mine["duration_us"], gpu["perf"] * 1e3)
    kept, report_all = read_gpu_benchmark(path, keep_warmup=True)
    assert len(kept) == len(raw) and report_all["skipped"] == {}


def test_node_numbers_with_leading_zeros_are_one_node(shared_data):
    df, _ = read_gpu_benchmark(shared_data / "pal" / "sim" / "pagerank-longhorn-agg.csv")
    assert "c005-4" in set(df["node"]) and not any(n.endswith("-004") for n in df["node"])


def test_slowdown_factor_file_is_refused(shared_data):
    with pytest.raises(TraceFormatError, match="slowdown factors relative to the median GPU"):
        read_gpu_benchmark(shared_data / "pal" / "32gpu-variability.csv")


def test_generic_table_with_value_column(tmp_path):
    path = tmp_path / "gemm-mycluster.csv"
    path.write_text("host,gpu,rep,time_ms\nn1,0,0,2.0\nn1,1,0,2.5\nn2,0,0,-1\nn2,0,1,3.0\n")
    df, report = read_gpu_benchmark(path, value_column="time_ms")
    assert report["run"] == "gemm-mycluster/gemm-mycluster"
    assert df["duration_us"].tolist() == [2000.0, 2500.0, 3000.0]
    assert df["node"].tolist() == ["n1", "n1", "n2"] and df["rank"].tolist() == [0, 1, 2]
    assert report["skipped"] == {"timing value missing, non-finite or <= 0": 1}
    assert "cabinet" not in df.columns
    df2, _ = read_gpu_benchmark(path, value_column="time_ms", unit="s", run="x/gemm")
    assert df2["duration_us"].iloc[0] == 2e6 and set(df2["run"]) == {"x/gemm"}


def test_bad_inputs_name_file_and_field(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("node,device,perf\nn1,0,1.0\n")
    with pytest.raises(TraceFormatError, match=r"t.csv: value_column: no timing column recognised"):
        read_gpu_benchmark(path)
    with pytest.raises(TraceFormatError, match=r"t.csv: unit: unit of 'perf' unknown"):
        read_gpu_benchmark(path, value_column="perf")
    with pytest.raises(TraceFormatError, match=r"t.csv: unit: unknown unit.*'hours'"):
        read_gpu_benchmark(path, value_column="perf", unit="hours")
    nogpu = tmp_path / "n.csv"
    nogpu.write_text("node,perf\nn1,1.0\n")
    with pytest.raises(TraceFormatError, match=r"n.csv: gpu: no gpu column"):
        read_gpu_benchmark(nogpu, value_column="perf", unit="s")
    assert not can_read(Path("x.csv"), b"run,step,rank,node,gpu,kernel,kernel_class,duration_us\n")


def test_shipped_pal_files(package_data):
    for name in ("frontera/frontera-resnet-agg.csv", "ls6/resnet-ls6-agg.csv"):
        run, rows, gpus, *_ = PAL[name]
        df, report = read_gpu_benchmark(package_data / "pal" / name)
        assert report["run"] == run and len(df) == rows and df["rank"].nunique() == gpus


def test_fleet_table_with_time_us_hostname_gpu_index_and_sessions(shared_data):
    from bayesprism.ingest.dispatch import read_head

    path = shared_data / "simulated" / "megatron-3d-dev" / "fleet_gemm_bench.csv.gz"
    assert can_read(path, read_head(path))
    raw = pd.read_csv(path)
    df, report = read_gpu_benchmark(path)
    df = validate_table(df, source=str(path))
    assert len(df) == len(raw) and report["skipped"] == {}
    assert np.allclose(np.sort(df["duration_us"]), np.sort(raw["time_us"]))
    assert df["node"].nunique() == 512 and df["rank"].nunique() == 4096
    # hosts keep their names, so traced nodes are the same nodes in a joint fit
    assert "dgx-h100-1733" in set(df["node"].astype(str))
    # step = session; a GPU's repeats in a session are launches of one GPU-step
    assert sorted(df["step"].unique()) == [0, 1, 2]
    assert (df.groupby(["rank", "step"]).size() == 5).all()
    # the kernel is a signature of its own: a traced kernel of that name has class gemm
    (kernel,) = set(df["kernel"].astype(str))
    assert kernel == raw["kernel"].iloc[0] + "[m=8192,n=8192,k=8192,bf16]"
    assert report["run"] == "fleet-gemm-bench" and report["run_meta"]["benchmark"] is True
    assert any("time_us" in n for n in report["notes"])


def test_generic_timing_columns(tmp_path):
    path = tmp_path / "bench.csv"
    path.write_text("hostname,gpu_index,session,repeat,time_ms\n"
                    "h1,0,s1,0,2.0\nh1,0,s1,1,2.2\nh1,0,s2,0,2.4\nh2,0,s1,0,3.0\n")
    df, report = read_gpu_benchmark(path)
    assert df["duration_us"].tolist() == [2000.0, 2200.0, 2400.0, 3000.0]
    assert df["step"].tolist() == [0, 0, 1, 0]  # sessions, coded in sorted order
    assert df["node"].tolist() == ["h1", "h1", "h1", "h2"]
    assert any("step = the benchmark session" in n for n in report["notes"])
    two = tmp_path / "two.csv"
    two.write_text("host,gpu,time_us,elapsed_ms\nh1,0,1.0,2.0\n")
    with pytest.raises(TraceFormatError, match=r"two\.csv: value_column: several timing "
                                               r"columns.*'elapsed_ms, time_us'"):
        read_gpu_benchmark(two)
    assert read_gpu_benchmark(two, value_column="elapsed_ms")[0]["duration_us"].tolist() == [
        2000.0]
