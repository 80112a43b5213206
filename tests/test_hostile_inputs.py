"""Hostile and broken inputs through the CLI (issue 21): no traceback, no silent acceptance.

Every case runs ``bayesprism.cli.main`` in-process and asserts exit 2 (or a documented exit 0
with the problem named), no ``Traceback`` on stderr, and a message that names the file or the
field. Inputs are tiny and built in ``tmp_path``; the decompression bomb is made on the fly with
a low limit set for the test.
"""

from __future__ import annotations

import copy
import json
import os
import re
import zlib
from pathlib import Path

import pytest
from posterior_builders import analysis_posterior, forecast_tree, gemm_only

from bayesprism import io
from bayesprism.cli.main import main
from bayesprism.spec import ModelSpec

GOLDEN = Path(__file__).parent / "data" / "kineto_golden"
RANK0 = json.loads((GOLDEN / "hostA_101.1700000000000.pt.trace.json").read_text())
DEEP = "[" * 100_000 + "]" * 100_000


def run(capsys, *argv) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of one in-process CLI call (``--quiet`` added)."""
    code = main([str(a) for a in argv] + ["--quiet"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    return code, out, err


def refused(capsys, *argv, names: tuple[str, ...]) -> str:
    """Assert exit 2 with a message naming every string of ``names``; returns stderr."""
    code, _, err = run(capsys, *argv)
    assert code == 2, err
    assert err.startswith("error: "), err
    for name in names:
        assert name in err, (name, err)
    return err


def kernels(data: dict) -> list[dict]:
    return [e for e in data["traceEvents"] if e.get("cat") == "kernel"]


def trace_with(tmp_path: Path, name: str, change) -> Path:
    """The golden rank-0 trace with ``change(data)`` applied, written to ``tmp_path/name``."""
    data = copy.deepcopy(RANK0)
    change(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    """A kernel posterior, a forecast, a placement posterior, a step-kind posterior, plans."""
    root = tmp_path_factory.mktemp("artifacts")
    paths = {"post": io.save(gemm_only(draws=4), root / "post.nc"),
             "forecast": io.save(forecast_tree(draws=10), root / "forecast.nc"),
             "placed": io.save(analysis_posterior(), root / "placed.nc")}
    step = gemm_only(draws=4)
    spec = ModelSpec.load("step")
    step.attrs.update(model_kind="step", spec=json.dumps(spec.to_dict()),
                      spec_hash=spec.spec_hash())
    paths["step"] = io.save(step, root / "step.nc")
    for name, text in {"ok": "dp = 2\n", "overlap": "dp = 8\noverlap = 0.8\n"}.items():
        paths[name] = root / f"{name}.toml"
        paths[name].write_text(text)
    return paths


def tampered(tmp_path: Path, source: Path, name: str, root=None, inventory=None,
             posterior=None) -> Path:
    """A copy of a saved posterior with root, inventory and/or posterior-group attrs changed."""
    tree = io.load(source)
    tree.attrs.update(root or {})
    if posterior:
        tree["posterior"].attrs = {**tree["posterior"].attrs, **posterior}
    if inventory:
        ds = tree["inventory"].to_dataset()
        ds.attrs.update(inventory)
        tree["inventory"] = ds
    return io.save(tree, tmp_path / name)


# --------------------------------------------------------------------------- traces


@pytest.mark.parametrize(("change", "names"), [
    (lambda d: kernels(d)[0].__setitem__("dur", "12"), ("traceEvents.dur", "str", "'12'")),
    (lambda d: kernels(d)[0].__setitem__("dur", True), ("traceEvents.dur", "bool", "True")),
    (lambda d: kernels(d)[0].__setitem__("dur", 1e300), ("traceEvents.dur", "longer than a day")),
    (lambda d: kernels(d)[0].__setitem__("ts", "abc"), ("traceEvents.ts", "str", "'abc'")),
    (lambda d: d["distributedInfo"].__setitem__("rank", 5),
     ("distributedInfo.rank", "world_size - 1 = 1", "5")),
    (lambda d: d["distributedInfo"].__setitem__("rank", -1), ("distributedInfo.rank",)),
], ids=["dur-string", "dur-bool", "dur-1e300", "ts-string", "rank-beyond-world", "rank-negative"])
def test_bad_trace_values_are_errors(tmp_path, capsys, change, names):
    path = trace_with(tmp_path, "trace.json", change)
    refused(capsys, "ingest", path, "-o", tmp_path / "t.parquet", names=(str(path), *names))
    assert not (tmp_path / "t.parquet").exists()


def test_kernel_without_ts_is_skipped_under_its_own_reason(tmp_path, capsys):
    path = trace_with(tmp_path, "trace.json", lambda d: kernels(d)[0].pop("ts"))
    code, out, err = run(capsys, "ingest", path, "-o", tmp_path / "t.parquet", "--json")
    assert code == 0, err
    skipped = json.loads(out)["skipped"]
    assert skipped["kernel without a timestamp (ts)"] == 1
    assert "kernel with missing (NaN) duration" not in skipped


@pytest.mark.parametrize("where", ["document", "args"])
def test_deeply_nested_json_is_one_clear_error(tmp_path, capsys, where):
    text = json.dumps(RANK0)
    if where == "document":
        text = '{"traceEvents": ' + DEEP + "}"
    else:
        text = text.replace('"correlation": 1}', f'"correlation": 1, "x": {DEEP}}}', 1)
    path = tmp_path / "deep.json"
    path.write_text(text)
    refused(capsys, "ingest", path, "-o", tmp_path / "t.parquet",
            names=(str(path), "nested too deeply"))


def test_rank_without_kernels_and_other_step_counts_are_named(tmp_path, capsys):
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    for src in GOLDEN.glob("*.pt.trace.json"):
        data = json.loads(src.read_text())
        if data["distributedInfo"]["rank"] == 1:
            data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "kernel"]
            data["traceEvents"].append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD",
                                        "ts": 1100, "dur": 5,
                                        "args": {"device": 1, "stream": 7, "correlation": 11}})
        (run_dir / src.name).write_text(json.dumps(data))
    code, out, err = run(capsys, "ingest", run_dir, "-o", tmp_path / "t.parquet")
    assert code == 0, err
    assert "1 of 2 ranks without GPU kernels" in out and "rank 1 (" in out
    # another step window on rank 1: named with its step count
    data = json.loads((run_dir / "hostB_202.1700000000001.pt.trace.json").read_text())
    data["traceEvents"] = json.loads((GOLDEN / "hostB_202.1700000000001.pt.trace.json"
                                      ).read_text())["traceEvents"]
    extra = copy.deepcopy(data["traceEvents"])
    for event in extra:
        event["ts"] += 5000
        if event.get("name") == "ProfilerStep#7":
            event["name"] = "ProfilerStep#8"
        if isinstance(event.get("args"), dict) and "correlation" in event["args"]:
            event["args"]["correlation"] += 100
    data["traceEvents"] += extra
    (run_dir / "hostB_202.1700000000001.pt.trace.json").write_text(json.dumps(data))
    code, out, err = run(capsys, "ingest", run_dir, "-o", tmp_path / "t.parquet")
    assert code == 0, err
    assert "1 of 2 ranks with another number of steps" in out, out


def test_a_run_without_any_kernel_is_an_error(tmp_path, capsys):
    """Issue 21: a trace whose GPU activities are all memory copies became a table of memcpy
    rows with a note only (exit 0)."""
    def no_kernels(data):
        data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "kernel"]
        data["traceEvents"].append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD",
                                    "ts": 1100, "dur": 5,
                                    "args": {"device": 0, "stream": 7, "correlation": 11}})
    path = trace_with(tmp_path, "trace.json", no_kernels)
    refused(capsys, "ingest", path, "-o", tmp_path / "t.parquet",
            names=(str(path), "traceEvents", "has a GPU kernel", "only memory copies"))


def test_unreadable_and_empty_directories(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(capsys, "ingest", empty, "-o", tmp_path / "t.parquet",
            names=(str(empty), "no files"))
    # only files of no known format: each is named (was "inputs: no trace file found")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("hello")
    refused(capsys, "ingest", notes, "-o", tmp_path / "t.parquet",
            names=(str(notes / "readme.txt"), "not a recognised trace format"))
    if os.geteuid() == 0:
        return  # root reads any directory
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "trace.json").write_text("{}")
    locked.chmod(0)
    try:
        refused(capsys, "ingest", locked, "-o", tmp_path / "t.parquet",
                names=(str(locked), "cannot be read"))
    finally:
        locked.chmod(0o755)


# --------------------------------------------------------------------------- bounded input


def _bomb(path: Path, mib: int, head: bytes, tail: bytes) -> Path:
    """A gzip file of ``head``, ``mib`` MiB of spaces and ``tail`` (about 1 KB per MiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (1 << 20)
    parts = [packer.compress(head), *(packer.compress(block) for _ in range(mib)),
             packer.compress(tail), packer.flush()]
    path.write_bytes(b"".join(parts))
    return path


@pytest.mark.parametrize("layout", ["profiler", "one-line"])
def test_decompression_bomb_is_stopped(tmp_path, capsys, layout):
    head, tail = ((b'{"traceEvents": [\n  {"ph": "X"', b"}\n  ]}") if layout == "profiler"
                  else (b'{"traceEvents": [{"ph": "X"', b"}]}"))
    path = _bomb(tmp_path / "bomb.json.gz", 40, head, tail)
    assert path.stat().st_size < 100_000
    err = refused(capsys, "ingest", path, "-o", tmp_path / "t.parquet",
                  names=(str(path), "decompression bomb", "BAYESPRISM_MAX_COMPRESSION_RATIO"))
    # stopped soon after the 16 MiB from which the ratio is judged, having read less than half
    # of the bomb: the gzip reader gets its input 8 kB at a time (it took 512 kB, which a bomb
    # turns into 512 MB, so a 1 GiB bomb was seen only at ~100 MB, and this one at its end)
    found = re.search(r"([\d,]+) compressed bytes gave ([\d,]+) bytes", err)
    read, gave = (int(g.replace(",", "")) for g in found.groups())
    assert read < path.stat().st_size / 2 and gave < 24 << 20, err


def test_decompressed_size_cap_is_configurable(tmp_path, capsys, monkeypatch):
    path = _bomb(tmp_path / "big.json.gz", 3, b'{"traceEvents": [\n  {"ph": "X"', b"}\n  ]}")
    monkeypatch.setenv("BAYESPRISM_MAX_DECOMPRESSED_BYTES", "1000000")
    refused(capsys, "ingest", path, "-o", tmp_path / "t.parquet",
            names=(str(path), "1,000,000 bytes", "BAYESPRISM_MAX_DECOMPRESSED_BYTES"))
    monkeypatch.setenv("BAYESPRISM_MAX_DECOMPRESSED_BYTES", "lots")
    refused(capsys, "ingest", path, "-o", tmp_path / "t.parquet",
            names=("BAYESPRISM_MAX_DECOMPRESSED_BYTES", "'lots'"))


def test_gzip_decompresses_into_one_buffer_of_its_size(tmp_path):
    """Issue 21: a gzip input is decompressed into one buffer sized by its trailer, so the peak
    is the output about once (chunks and their join held it twice); several members and a
    trailer that lies still read right or fail with a clear error."""
    import gzip
    import os
    import tracemalloc

    from bayesprism.errors import TraceFormatError
    from bayesprism.ingest.files import read_bytes

    line = b'{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 1234.5, "dur": 12.5},\n'
    data = line * (60_000_000 // len(line))
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(data, 1))
    tracemalloc.start()
    try:
        out = read_bytes(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out == data
    assert peak < 1.3 * len(data)  # was 2x: the chunks, then their join
    noise = os.urandom(3 << 20)
    members = tmp_path / "members.gz"
    members.write_bytes(gzip.compress(b"head ", 1) + gzip.compress(noise, 1))
    assert bytes(read_bytes(members)) == b"head " + noise
    lying = bytearray(gzip.compress(noise, 1))
    lying[-4:] = (5).to_bytes(4, "little")  # the trailer's size is a hint, never trusted
    (tmp_path / "lying.gz").write_bytes(lying)
    with pytest.raises(TraceFormatError, match="corrupt gzip"):
        read_bytes(tmp_path / "lying.gz")


# --------------------------------------------------------------------------- tables


def test_fractional_step_and_huge_duration_in_a_table(tmp_path, capsys):
    header = "run,step,rank,node,gpu,kernel,kernel_class,duration_us\n"
    frac = tmp_path / "frac.csv"
    frac.write_text(header + "r,10.5,0,n0,0,k,gemm,12\nr,11,0,n0,0,k,gemm,13\n")
    refused(capsys, "ingest", frac, "-o", tmp_path / "t.parquet",
            names=(str(frac), "step", "whole numbers", "10.5"))
    huge = tmp_path / "huge.csv"
    huge.write_text(header + "r,10,0,n0,0,k,gemm,1e300\nr,11,0,n0,0,k,gemm,13\n")
    refused(capsys, "ingest", huge, "-o", tmp_path / "t.parquet",
            names=(str(huge), "duration_us", "longer than a day"))


def test_benchmark_id_columns_and_column_map(tmp_path, capsys):
    pal = tmp_path / "sgemm.csv"
    pal.write_text("node_id,dev_id,time_ms\n1,0,5.0\n1,1,5.5\n2,0,6.0\n2,1,5.2\n")
    code, out, err = run(capsys, "ingest", pal, "-o", tmp_path / "t.parquet")
    assert code == 0, err
    assert "ranks: 4   nodes: 2" in out
    odd = tmp_path / "odd.csv"
    odd.write_text("box,slot,time_ms\n1,0,5.0\n1,1,5.5\n2,0,6.0\n2,1,5.2\n")
    refused(capsys, "ingest", odd, "-o", tmp_path / "t.parquet",
            names=(str(odd), "box, slot, time_ms", "node column", "--columns"))
    code, out, err = run(capsys, "ingest", odd, "-o", tmp_path / "t.parquet",
                         "--columns", "box=node", "--columns", "slot=gpu")
    assert code == 0, err
    assert "ranks: 4   nodes: 2" in out
    refused(capsys, "ingest", odd, "-o", tmp_path / "t.parquet", "--columns", "box",
            names=("--columns", "THEIRS=OURS"))


#: The header of PAL's own SGEMM table (hal-uw/blox-pal, aggregated_data/sim/
#: sgemm-longhorn-agg.csv): cabinet and node are -1, dev_id is 0, the uuid names the GPU.
PAL_SGEMM = ("exp,input_size,reps,uuid,cabinet,node,ts,kern,kern_min_start,kern_max_start,"
             "num_kerns,perf,freq,memfreq,temp,pwr,dev_id\n")


def _sgemm_row(uuid: str, ts: int, perf: float, cabinet="-1", node="-1", dev="0") -> str:
    return (f"sgemm,25536,100,GPU-{uuid},{cabinet},{node},{ts},volta_sgemm_128x32_sliced1x4_nn,"
            f"290.3,533.3,100,{perf},1350,877,73,296.79,{dev}\n")


def test_pal_sgemm_layout_is_read_by_gpu_uuid(tmp_path, capsys):
    """Issue 21: PAL's SGEMM table was read as ONE GPU (node "-1--1", dev_id 0 for all)."""
    pal = tmp_path / "sgemm-longhorn-agg.csv"
    pal.write_text(PAL_SGEMM + _sgemm_row("e134", 1591118862, 2454.7)
                   + _sgemm_row("ac95", 1591244317, 2382.7)
                   + _sgemm_row("2ce0", 1589952841, 2368.0)
                   + _sgemm_row("e134", 1591142201, 2441.8))
    out_path = tmp_path / "t.parquet"
    code, out, err = run(capsys, "ingest", pal, "-o", out_path)
    assert code == 0, err
    assert "ranks: 3   nodes: 3   steps: 2" in out, out
    assert "GPUs identified by their uuid" in out and "unknown node" in out
    import pandas as pd

    table = pd.read_parquet(out_path).sort_values(["rank", "step"])
    assert table["node"].astype(str).tolist() == ["GPU-2ce0", "GPU-ac95", "GPU-e134",
                                                 "GPU-e134"]
    assert table["duration_us"].tolist() == [2368e3, 2382.7e3, 2454.7e3, 2441.8e3]
    assert table["cabinet"].isna().all()  # all -1: no made-up cabinet
    # on a known node, uuids sharing a device id are numbered within the node
    known = tmp_path / "known.csv"
    known.write_text(PAL_SGEMM + _sgemm_row("bb", 1, 2400.0, "c001", "4")
                     + _sgemm_row("aa", 2, 2500.0, "c001", "4"))
    code, out, err = run(capsys, "ingest", known, "-o", out_path)
    assert code == 0, err
    assert "ranks: 2   nodes: 1" in out, out
    # a uuid and no node column at all
    bare = tmp_path / "bare.csv"
    bare.write_text("uuid,dev_id,time_ms\nGPU-a,0,5.0\nGPU-b,0,5.5\nGPU-a,0,5.1\n")
    code, out, err = run(capsys, "ingest", bare, "-o", out_path)
    assert code == 0, err
    assert "ranks: 2   nodes: 2" in out, out


# --------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("command", ["ingest", "fit", "report", "forecast-json"])
def test_output_directory_is_refused_before_the_work(tmp_path, capsys, artifacts, command):
    out_dir = tmp_path / "outdir"
    out_dir.mkdir()
    argv = {"ingest": ["ingest", GOLDEN, "-o", out_dir],
            "fit": ["fit", GOLDEN, "-o", out_dir],
            "report": ["report", artifacts["post"], "-o", out_dir],
            "forecast-json": ["forecast", artifacts["post"], "-o", out_dir]}[command]
    refused(capsys, *argv, names=(str(out_dir), "is a directory"))
    assert list(out_dir.iterdir()) == []


def test_atomic_writes_keep_the_old_file_and_leave_no_temporary(tmp_path, capsys, artifacts):
    target = tmp_path / "f.json"
    code, _, err = run(capsys, "forecast", artifacts["post"], "--draws", "2", "-o", target)
    assert code == 0, err
    good = target.read_text()
    assert json.loads(good)["plans"]
    # a write that fails half-way leaves the old file and no temporary
    def fail(tmp: Path) -> None:
        tmp.write_text("partial")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        io.write_atomic(target, fail)
    assert target.read_text() == good
    # a temporary of a killed writer (its process gone) is removed by the next write
    stale = tmp_path / f".{target.name}.999999999.tmp"
    stale.write_text("orphan")
    io.write_text_atomic(target, good)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


_KILLED_WRITER = """
import os, sys, time
from bayesprism.cli.main import main
os.replace = lambda *a: time.sleep(120)  # stuck just before the rename: the temporary exists
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_terminated_write_leaves_the_old_file_and_no_temporary(tmp_path, artifacts, sig):
    """Issue 21: ``kill`` (SIGTERM), or a closed terminal (SIGHUP), during ``forecast -o``
    removes the write's temporary and keeps the old file; Python's default ended the
    process without cleanup and the temporary stayed."""
    import signal
    import subprocess
    import sys
    import time

    target = tmp_path / "f.json"
    target.write_text("old")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, "forecast", str(artifacts["post"]), "--draws",
         "2", "-o", str(target), "--quiet"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".f.json.*.tmp")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        proc.send_signal(getattr(signal, sig))
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert code == 128 + getattr(signal, sig)
    assert "terminated by signal" in proc.stderr.read()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    assert target.read_text() == "old"


# --------------------------------------------------------------------------- artifacts


def test_wrong_artifacts_are_named(tmp_path, capsys, artifacts):
    refused(capsys, "forecast", artifacts["forecast"],
            names=(str(artifacts["forecast"]), "is a forecast", "expected a posterior"))
    refused(capsys, "report", artifacts["post"], "--forecast", artifacts["post"],
            "-o", tmp_path / "r.html",
            names=(str(artifacts["post"]), "is a posterior", "expected a forecast"))
    refused(capsys, "forecast", tmp_path, names=(str(tmp_path), "is a directory"))
    attrs_only = tmp_path / "attrs.nc"
    tree = io.load(artifacts["forecast"])
    import xarray as xr

    io.save(xr.DataTree(xr.Dataset(attrs=dict(tree.attrs))), attrs_only)
    refused(capsys, "forecast", attrs_only,
            names=(str(attrs_only), "attributes only", "expected a posterior"))
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(("root", "inventory", "names"), [
    ({"bayesprism_version": "9.9.9"}, None, ("bayesprism_version", "newer major", "9.9.9")),
    ({"bayesprism_version": "garbage"}, None, ("bayesprism_version", "not a version")),
    ({"model_kind": "step"}, None, ("model_kind", "stored spec's kind")),
    (None, {"kind": "step"}, ("inventory.kind", "disagrees")),
    (None, {"traced_plan": '{"dp": 8,'}, ("inventory.traced_plan", "not valid JSON")),
    (None, {"traced_plan": '{"dp": 0}'}, ("inventory.traced_plan", "dp", "positive integer")),
], ids=["newer-version", "garbage-version", "model-kind", "inventory-kind", "plan-json",
        "plan-dp0"])
def test_tampered_posteriors_are_refused(tmp_path, capsys, artifacts, root, inventory, names):
    path = tampered(tmp_path, artifacts["post"], "bad.nc", root, inventory)
    refused(capsys, "forecast", path, names=(str(path), *names))


@pytest.mark.parametrize(("posterior", "names"), [
    ({"likelihood": "student_t"}, ("posterior.likelihood", "'lognormal'", "student_t")),
    ({"model_kind": "step"}, ("posterior.model_kind", "'kernel'", "step")),
    ({"node_population": "degraded"}, ("posterior.node_population", "'normal'", "degraded")),
], ids=["likelihood", "model-kind", "node-population"])
def test_edited_fit_record_is_refused(tmp_path, capsys, artifacts, posterior, names):
    """Issue 21: the posterior group's likelihood (kind, population), edited, was used without
    a word."""
    path = tampered(tmp_path, artifacts["post"], "bad.nc", posterior=posterior)
    refused(capsys, "forecast", path, names=(str(path), *names))


def test_older_version_is_read_with_a_warning(tmp_path, artifacts):
    from bayesprism.errors import ArtifactWarning

    path = tampered(tmp_path, artifacts["post"], "old.nc", {"bayesprism_version": "0.0.1"})
    with pytest.warns(ArtifactWarning, match="written by bayesprism 0.0.1"):
        io.load(path, expect="posterior")


def test_step_posterior_refuses_a_kernel_level_plan(capsys, artifacts):
    refused(capsys, "forecast", artifacts["step"], "--plan", artifacts["overlap"],
            names=(str(artifacts["overlap"]), "overlap", "step-level posterior"))


# --------------------------------------------------------------------------- plans and numbers


@pytest.mark.parametrize(("content", "names"), [
    (b"dp = 1000000000000\n", ("dp", "<= 10,000,000")),
    (b'name = "\xff\xfe"\ndp = 2\n', ("not UTF-8",)),
    (b"", ("no plan fields",)),
    (b"a = " + b"[" * 100_000 + b"]" * 100_000, ("nested too deeply",)),
    (b"dp = 100000\ntp = 1000\n", ("dp", "exceeds the largest plan")),
], ids=["dp-1e12", "non-utf8", "empty", "deep", "product-too-large"])
def test_bad_plan_files(tmp_path, capsys, artifacts, content, names):
    plan = tmp_path / "plan.toml"
    plan.write_bytes(content)
    refused(capsys, "forecast", artifacts["post"], "--plan", plan, names=(str(plan), *names))


@pytest.mark.parametrize(("argv", "names"), [
    (["forecast", "{post}", "--steps", "-5"], ("--steps", "-5")),
    (["forecast", "{post}", "--replicates", "0"], ("--replicates",)),
    (["forecast", "{post}", "--dp", "0"], ("dp", "positive integer")),
    (["forecast", "{post}", "--dp", "1000000000000"], ("dp", "<= 10,000,000")),
    (["forecast", "{post}", "--plan", "{tmp}"], ("is a directory",)),
    (["place", "{placed}", "--plan", "{ok}", "--drain", "-1"], ("--drain", "-1")),
    (["place", "{placed}", "--plan", "{ok}", "--drain", "1000"], ("drain", "between 0 and")),
], ids=["steps", "replicates", "dp", "dp-1e12", "plan-dir", "drain-negative", "drain-too-many"])
def test_command_line_numbers(tmp_path, capsys, artifacts, argv, names):
    values = {"post": artifacts["post"], "placed": artifacts["placed"], "ok": artifacts["ok"],
              "tmp": tmp_path}
    refused(capsys, *[a.format(**values) for a in argv], names=names)


def test_diagnose_out_given_a_file(tmp_path, capsys, artifacts):
    plots = tmp_path / "plots"
    plots.write_text("not a folder")
    refused(capsys, "diagnose", artifacts["post"], "--out", plots,
            names=(str(plots), "-o", "is a file"))
