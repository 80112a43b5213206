"""Kineto reader and ``read_traces`` on the hand-written golden traces and the real traces."""

from __future__ import annotations

import gzip
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bayesprism import read_traces, schema
from bayesprism.errors import IngestWarning, TraceFormatError
from bayesprism.ingest import ingest_to_parquet
from bayesprism.ingest.kineto import read_kineto

GOLDEN = Path(__file__).parent / "data" / "kineto_golden"
GOLDEN_FILES = sorted(GOLDEN.glob("*.pt.trace.json"))
GEMM = "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
MEMCPY = "Memcpy HtoD (Pinned -> Device)"


def test_golden_table():
    df = read_traces(GOLDEN_FILES, progress=False)
    got = df[["rank", "node", "gpu", "step", "kernel", "kernel_class", "duration_us", "start_us",
              "stream", "occurrence", "bytes", "dtype", "group_size", "process_group", "wait_us",
              "transfer_us", "source"]].astype(object)
    got = got.sort_values(["rank", "start_us"]).reset_index(drop=True)
    nan = np.nan
    a, b = GOLDEN_FILES[0].name, GOLDEN_FILES[1].name
    rows = [
        # rank node gpu step kernel class dur start stream occ bytes dtype gs pg wait transfer
        (0, "hostA", 0, 7, MEMCPY, "memcpy", 10.0, 1050.0, 22, 0, nan, nan, nan, nan, nan, nan, a),
        (0, "hostA", 0, 7, GEMM, "gemm", 50.0, 1100.0, 7, 0, nan, nan, nan, nan, nan, nan, a),
        (0, "hostA", 0, 7, GEMM, "gemm", 40.0, 1160.0, 7, 1, nan, nan, nan, nan, nan, nan, a),
        (0, "hostA", 0, 7, ALLREDUCE, "allreduce", 100.0, 1210.0, 20, 0, 4000.0, "float32", 2, "0",
         40.0, 60.0, a),
        (0, "hostA", 0, 7, ALLREDUCE, "allreduce", 30.0, 1320.0, 20, 1, 4000.0, "float32", 2, "0",
         10.0, 20.0, a),
        (1, "hostB", 1, 7, GEMM, "gemm", 80.0, 1100.0, 7, 0, nan, nan, nan, nan, nan, nan, b),
        (1, "hostB", 1, 7, GEMM, "gemm", 45.0, 1185.0, 7, 1, nan, nan, nan, nan, nan, nan, b),
        (1, "hostB", 1, 7, ALLREDUCE, "allreduce", 60.0, 1250.0, 20, 0, 4000.0, "float32", 2, "0",
         0.0, 60.0, b),
        (1, "hostB", 1, 7, ALLREDUCE, "allreduce", 20.0, 1360.0, 20, 1, 4000.0, "float32", 2, "0",
         0.0, 20.0, b),
    ]
    expected = pd.DataFrame(rows, columns=got.columns).astype(object)
    got = got.map(lambda v: np.nan if v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    assert set(df["run"]) == {"kineto_golden"}
    assert df.attrs["skipped"] == {"kernel with zero or negative duration": 1,
                                   "kernel outside any ProfilerStep": 1}
    run = df.attrs["runs"]["kineto_golden"]
    assert run["world_size"] == 2 and run["platform"] == "Test GPU"
    assert [Path(p).name for p in run["source_files"]] == [a, b]
    assert any("ended before the last one started" in n for n in df.attrs["notes"])


def test_golden_parquet_round_trip_equals_in_memory(tmp_path):
    summary = ingest_to_parquet(GOLDEN_FILES, tmp_path / "t.parquet", progress=False)
    back = schema.read_table(tmp_path / "t.parquet")
    mem = read_traces(GOLDEN_FILES, progress=False)
    assert summary["rows"] == len(back) == len(mem) == 9
    cols = ["rank", "step", "kernel", "occurrence", "duration_us", "wait_us", "transfer_us"]
    key = ["rank", "start_us"]
    pd.testing.assert_frame_equal(
        back.sort_values(key)[cols].reset_index(drop=True).astype(object),
        mem.sort_values(key)[cols].reset_index(drop=True).astype(object))
    assert back.attrs["skipped"] == mem.attrs["skipped"]
    assert back.attrs["notes"] == mem.attrs["notes"]
    assert back.attrs["runs"]["kineto_golden"]["world_size"] == 2


def test_node_from_rank_when_no_host_warns(tmp_path):
    data = json.loads(GOLDEN_FILES[0].read_text())
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(data))
    with pytest.warns(IngestWarning, match=r"node taken as rank // 4 \(4 GPUs per node from "
                      r"gpus_per_node\)"):
        df, _report = read_kineto(path, gpus_per_node=4)
    assert set(df["node"]) == {"node0"}
    df, _ = read_kineto(path, rank_to_node={0: "n17"})
    assert set(df["node"]) == {"n17"}


def test_missing_distributed_info_uses_rank_option(tmp_path):
    data = json.loads(GOLDEN_FILES[0].read_text())
    del data["distributedInfo"]
    path = tmp_path / "hostA_1.1.pt.trace.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceFormatError, match="distributedInfo: missing"):
        read_kineto(path)
    df, report = read_kineto(path, rank=3, world_size=4)
    assert set(df["rank"]) == {3} and report["world_size"] == 4
    assert "taken from the options" in report["notes"][0]


# --- the real traces -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def dlrm(shared_data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IngestWarning)
        return read_traces(shared_data / "kineto" / "param_dlrm_8rank", progress=False)


def test_dlrm_ranks_steps_and_kernels(dlrm):
    assert sorted(dlrm["rank"].unique()) == list(range(8))
    assert set(dlrm["step"]) == {10}
    assert set(dlrm["gpu"]) == set(range(8))
    assert dlrm.groupby("rank")["gpu"].first().tolist() == list(range(8))
    kernels = dlrm[~dlrm["kernel"].astype(str).str.startswith(("Memcpy", "Memset"))]
    per_rank = kernels.groupby("rank").size()
    assert per_rank.between(245, 315).all()
    # 2,104 kernel events in the 8 files; 128 (on ranks 1 and 3) were launched before the window.
    assert per_rank.sum() + dlrm.attrs["skipped"]["kernel outside any ProfilerStep"] == 2104
    assert dlrm.attrs["runs"]["param_dlrm_8rank"]["world_size"] == 8
    assert dlrm.attrs["runs"]["param_dlrm_8rank"]["platform"] == "Tesla V100-SXM2-32GB"
    # Hand-chosen file names (worker<r>_step_12) are not host names: node from rank // 8.
    assert set(dlrm["node"]) == {"node0"}
    classes = set(dlrm["kernel_class"])
    assert {"sendrecv", "allreduce", "gemm", "elementwise", "memcpy", "other"} <= classes
    assert dlrm.attrs["skipped"]["file of unrecognised format (found in a directory)"] == 1


def test_dlrm_wait_transfer_split(dlrm):
    coll = dlrm[dlrm["kernel_class"].isin(["sendrecv", "allreduce"])]
    assert len(coll) == 8 * 8  # 5 SendRecv + 3 AllReduce per rank
    assert coll["wait_us"].notna().all() and coll["transfer_us"].notna().all()
    np.testing.assert_allclose(coll["wait_us"] + coll["transfer_us"], coll["duration_us"])
    assert (coll["wait_us"] >= 0).all() and (coll["transfer_us"] >= 0).all()
    inst = coll.groupby(["kernel", "occurrence"], observed=True)
    assert (inst["wait_us"].min() == 0).all()  # the last arriver waits 0
    assert (inst.size() == 8).all()
    # The first SendRecv: rank 1 arrived first and waited longest (7,635 µs kernel, 11 µs transfer).
    first = coll[(coll["kernel_class"] == "sendrecv") & (coll["occurrence"] == 0)].set_index("rank")
    assert first.loc[1, "wait_us"] == first["wait_us"].max() == 7624.0
    assert first.loc[7, "wait_us"] == 0.0


# (file, rank, world size, steps, GPU kernels) from the data README.
HTA_FILES = [
    ("trace_filter/sampled_rank-0.json.gz", 0, 128, [551, 552], 1154),
    ("trace_filter/sampled_rank-1.json.gz", 1, 128, [551, 552], 1104),
    ("nccl_parser_config/nccl_data.json.gz", 0, 2, [4, 5, 6], 2700),
    ("negative_queue_length_values_check/rank0.json.gz", 0, 16, [550, 551, 552, 553, 554], 6080),
    ("trace_diff/control/control.json.gz", 3, 8, [1009, 1010, 1011, 1012, 1013, 1014], 8568),
    ("ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", 0, 1,
     [101, 102, 103, 104, 105], 4350),
]


@pytest.mark.parametrize(("name", "rank", "world", "steps", "kernels"), HTA_FILES)
def test_hta_traces(shared_data, name, rank, world, steps, kernels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IngestWarning)
        df, report = read_kineto(shared_data / "kineto" / "hta" / name)
    assert set(df["rank"]) == {rank}
    assert report["world_size"] == world
    assert sorted(df["step"].unique()) == steps
    assert report["kernel_events"] == kernels
    n_kernel_rows = (~df["kernel"].astype(str).str.startswith(("Memcpy", "Memset"))).sum()
    # rank0 of negative_queue_length_values_check: 705 kernels launched before the first step.
    assert n_kernel_rows == kernels - (705 if "negative_queue" in name else 0)
    assert (df["duration_us"] > 0).all()
    assert df["kernel_class"].isin(schema.KERNEL_CLASSES).all()
    assert (df.groupby(["step", "kernel"], observed=True)["occurrence"].max() + 1
            == df.groupby(["step", "kernel"], observed=True).size()).all()


def test_hta_nccl_args_give_bytes_group_and_process_group(shared_data):
    with pytest.warns(IngestWarning, match="node taken as rank // 8"):
        df, _ = read_kineto(shared_data / "kineto/hta/nccl_parser_config/nccl_data.json.gz",
                            gpus_per_node=8)
    ar = df[df["kernel_class"] == "allreduce"]
    assert len(ar) == 15 and (df["kernel_class"] == "broadcast").sum() == 6
    assert set(ar["group_size"]) == {2} and set(ar["process_group"]) == {"0"}
    assert set(ar["dtype"]) == {"float32"}
    # "In msg nelems": 6,637,568 floats -> 26,550,272 bytes on the first AllReduce.
    assert 6637568 * 4 in set(ar["bytes"])


def test_ns_resolution_trace_keeps_fractional_microseconds(shared_data):
    df, report = read_kineto(
        shared_data / "kineto/hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    assert (df["duration_us"] % 1 != 0).any()
    assert set(df["node"]) == {"twshared39868.02.pnb3.facebook.com"}  # host_name metadata
    assert report["run_meta"]["platform"] == "Tesla V100-SXM2-32GB"


def test_all_shared_traces_with_one_call(shared_data, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IngestWarning)
        df = read_traces(shared_data / "kineto", progress=False)
    assert set(df["run"]) == {"param_dlrm_8rank", "trace_filter", "nccl_parser_config",
                              "negative_queue_length_values_check", "control",
                              "ns_resolution_trace"}
    notes = "\n".join(df.attrs["notes"])
    assert "run control: wait/transfer split of collectives not possible: only one rank" in notes
    assert "run trace_filter: wait/transfer split left empty for 20 collective rows" in notes
    split = df[df["run"] == "param_dlrm_8rank"]["transfer_us"].notna().sum()
    assert split == 64 and df["transfer_us"].notna().sum() == 64


def test_gzip_and_plain_json_give_the_same_rows(tmp_path):
    src = GOLDEN_FILES[0]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(src, tmp_path / "a" / src.name)
    (tmp_path / "b" / (src.name + ".gz")).write_bytes(gzip.compress(src.read_bytes()))
    d1, _ = read_kineto(tmp_path / "a" / src.name, run="r")
    d2, _ = read_kineto(tmp_path / "b" / (src.name + ".gz"), run="r")
    pd.testing.assert_frame_equal(d1.drop(columns="source"), d2.drop(columns="source"))


def test_gpu_user_annotation_ranges_when_launches_are_missing(tmp_path):
    data = json.loads(GOLDEN_FILES[1].read_text())
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") == "kernel"]
    data["traceEvents"] += [
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 7,
         "ts": 1090, "dur": 150},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 7,
         "ts": 1340, "dur": 100},
    ]
    path = tmp_path / "hostB_9.1.pt.trace.json"
    path.write_text(json.dumps(data))
    df, report = read_kineto(path)
    # Kernels at 1100, 1185 in step 3; 1250 starts after step 3 ends (1240); 1360 in step 4.
    assert df.sort_values("start_us")["step"].tolist() == [3, 3, 4]
    assert report["skipped"] == {"kernel outside any ProfilerStep": 1}


@pytest.mark.parametrize("slice_bytes", [4096, 1 << 20])
def test_streamed_decoding_equals_whole_file_decoding(shared_data, monkeypatch, slice_bytes):
    from bayesprism.ingest import kineto_json

    monkeypatch.setattr(kineto_json, "SLICE_BYTES", slice_bytes)
    dlrm = sorted((shared_data / "kineto" / "param_dlrm_8rank").glob("*.json.gz"))[:2]
    paths = [*dlrm, shared_data / "kineto/hta/nccl_parser_config/nccl_data.json.gz"]
    for path in paths:
        stream = kineto_json.StreamedTrace(path)
        streamed = kineto_json.scan_events(stream.slices())
        meta, events = kineto_json.load_trace(path)
        assert streamed.equals(kineto_json.scan_events(iter([events])))
        assert stream.metadata.distributedInfo == meta.distributedInfo
        assert stream.metadata.deviceProperties == meta.deviceProperties


@pytest.mark.parametrize("slice_bytes", [4096, 1 << 20])
def test_one_event_per_line_streams_too(tmp_path, monkeypatch, slice_bytes):
    """Issue 21: traces not in the profiler's own layout (one event per line, as the golden
    files and bayesprism's simulator write them) are decoded slice by slice as well (a 395 MB
    simulated trace: 1.58 GB and 34 s read whole, 0.84 GB and 3.8 s streamed), with the same
    result as whole-file decoding."""
    from bayesprism.ingest import kineto_json
    from bayesprism.simulate import simulate

    monkeypatch.setattr(kineto_json, "SLICE_BYTES", slice_bytes)
    simulate(tmp_path / "sim", nodes=1, gpus_per_node=1, steps=3, random_seed=0)
    for path in [*GOLDEN_FILES[:1], *sorted((tmp_path / "sim").glob("*.json.gz"))]:
        stream = kineto_json.StreamedTrace(path)
        streamed = kineto_json.scan_events(stream.slices())
        meta, events = kineto_json.load_trace(path)
        assert streamed.equals(kineto_json.scan_events(iter([events])))
        assert stream.metadata.distributedInfo == meta.distributedInfo


def test_streamed_decoding_keeps_columns_not_events(tmp_path, monkeypatch):
    """Issue 21: while a trace streams, each slice of events is reduced to compact columns
    before the next is read, so the decoding peak is the columns plus a few slices, not every
    event of the file (before: 39 MB here, ~1.3 kB per GPU activity; now ~8 MB); the table
    equals the one read by whole-file decoding."""
    import tracemalloc

    from bayesprism.ingest import kineto, kineto_json
    from bayesprism.simulate import simulate

    simulate(tmp_path / "sim", nodes=1, gpus_per_node=1, steps=150, random_seed=0)
    path = next((tmp_path / "sim").glob("*.json.gz"))
    tracemalloc.start()
    try:
        scan = kineto_json.scan_events(kineto_json.StreamedTrace(path).slices())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    columns = sum(v.nbytes for v in vars(scan).values() if isinstance(v, np.ndarray))
    assert len(scan.name_code) == 30_000 and columns < 3_000_000  # ~70 bytes per activity
    assert peak < columns + 8 * kineto_json.SLICE_BYTES, (peak, columns)
    streamed, _ = read_kineto(path, run="r")

    def whole_file(self):
        raise kineto_json.SliceLayoutError
        yield

    monkeypatch.setattr(kineto.StreamedTrace, "slices", whole_file)
    pd.testing.assert_frame_equal(streamed, read_kineto(path, run="r")[0])


def test_an_event_without_end_in_sight_is_not_searched_again_and_again(tmp_path, monkeypatch):
    """Issue 21: a file with no event boundary for MAX_EVENT_BYTES (one huge event, a run of
    whitespace) stops being sliced, rather than being searched again at every block (time
    quadratic in the run: a 1 GiB run of spaces took 6 minutes), and is read whole."""
    from bayesprism.ingest import kineto_json

    monkeypatch.setattr(kineto_json, "SLICE_BYTES", 4096)
    monkeypatch.setattr(kineto_json, "MAX_EVENT_BYTES", 64 << 10)
    data = json.loads(GOLDEN_FILES[0].read_text())
    expected, _ = read_kineto(GOLDEN_FILES[0], run="r")
    kernel = next(e for e in data["traceEvents"] if e.get("cat") == "cpu_op"
                  or e.get("cat") == "kernel")
    kernel.setdefault("args", {})["note"] = "x" * (200 << 10)
    path = tmp_path / GOLDEN_FILES[0].name
    path.write_text(json.dumps(data).replace('"traceEvents": [', '"traceEvents": [\n'))
    with pytest.raises(kineto_json.SliceLayoutError):
        list(kineto_json.StreamedTrace(path).slices())
    df, _ = read_kineto(path, run="r")
    pd.testing.assert_frame_equal(df, expected)


def test_compact_json_streams_too_and_a_false_cut_falls_back(tmp_path, monkeypatch):
    """Compact JSON (json.dump's default separators, no whitespace) streams slice by slice;
    a "},{" inside a string (C++ template kernel names have them) where a slice is cut fails
    to decode and the file is read whole: the same table either way."""
    from bayesprism.ingest import kineto_json

    monkeypatch.setattr(kineto_json, "SLICE_BYTES", 256)
    data = json.loads(GOLDEN_FILES[0].read_text())
    expected, _ = read_kineto(GOLDEN_FILES[0], run="r")
    compact = tmp_path / GOLDEN_FILES[0].name  # its name says the host
    compact.write_text(json.dumps(data, separators=(",", ":")))
    slices = list(kineto_json.StreamedTrace(compact).slices())
    assert len(slices) > 1
    assert sum(len(s) for s in slices) == len(data["traceEvents"])
    pd.testing.assert_frame_equal(read_kineto(compact, run="r")[0], expected)
    for event in data["traceEvents"]:  # a "},{" in every kernel's name
        if event.get("cat") == "kernel":
            event["name"] += "<{lambda()#1},{lambda()#2}>"
    (tmp_path / "tricky").mkdir()
    tricky = tmp_path / "tricky" / GOLDEN_FILES[0].name
    tricky.write_text(json.dumps(data, separators=(",", ":")))
    with pytest.raises(kineto_json.SliceLayoutError):
        list(kineto_json.StreamedTrace(tricky).slices())
    assert len(read_kineto(tricky, run="r")[0]) == len(expected)


def test_a_trace_of_mostly_unusable_kernels_is_refused_unless_accepted(tmp_path):
    # three of four kernels outside any ProfilerStep: an error naming the share and the
    # reason; accepted (not strict) it is read with its one usable kernel and the counts
    import json

    from bayesprism.errors import TraceFormatError
    from bayesprism.ingest.kineto import SKIP_OUTSIDE_STEP, read_kineto

    kernels = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": ts, "dur": 5.0, "pid": 0,
                "tid": 7, "args": {"device": 0, "correlation": i}}
               for i, ts in enumerate((10.0, 500.0, 600.0, 700.0))]
    step = {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "ts": 0.0,
            "dur": 100.0, "pid": 0, "tid": 7}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1},
                                "traceEvents": [step, *kernels]}))
    with pytest.raises(TraceFormatError, match=r"75% of its 4 GPU activities cannot be used "
                       r"\(kernel outside any ProfilerStep: 3\)"):
        read_kineto(path)
    df, report = read_kineto(path, accept_unusable=True)
    assert len(df) == 1 and report["skipped"] == {SKIP_OUTSIDE_STEP: 3}
