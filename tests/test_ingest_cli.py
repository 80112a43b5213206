"""``bayesprism ingest``: output, summary, and one clear line per problem on bad input."""

from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bayesprism import schema
from bayesprism.cli.main import main

GOLDEN = Path(__file__).parent / "data" / "kineto_golden"
RANK0, RANK1 = sorted(GOLDEN.glob("*.pt.trace.json"))


def trace(rank: int = 0) -> dict:
    return json.loads((RANK0 if rank == 0 else RANK1).read_text())


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["ingest", *map(str, argv), "--quiet"])
    out, err = capsys.readouterr()
    return code, out, err


def test_ingest_writes_parquet_and_json_summary(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    code, stdout, err = run_cli(capsys, RANK0, RANK1, "-o", out, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["rows"] == 9 and summary["runs"] == 1 and summary["ranks"] == 2
    assert summary["nodes"] == 2 and summary["steps"] == 1
    assert summary["kernel_classes"]["gemm"] == {"count": 4, "total_us": 215.0}
    assert summary["kernel_classes"]["allreduce"] == {"count": 4, "total_us": 210.0}
    assert summary["kernel_classes"]["memcpy"] == {"count": 1, "total_us": 10.0}
    assert summary["skipped"] == {"kernel with zero or negative duration": 1,
                                  "kernel outside any ProfilerStep": 1}
    assert summary["collective_rows_with_wait_split"] == 4
    table = schema.read_table(out)
    assert len(table) == 9 and table.attrs["runs"]["kineto_golden"]["world_size"] == 2


def test_ingest_into_a_missing_folder_is_one_clear_error(tmp_path, capsys):
    out = tmp_path / "missing" / "t.parquet"
    code, _, err = run_cli(capsys, RANK0, "-o", out)
    assert code == 2
    assert err.strip() == f"error: {out}: -o: the output folder does not exist"


def test_ingest_text_summary(tmp_path, capsys):
    code, stdout, _ = run_cli(capsys, GOLDEN, "-o", tmp_path / "t.parquet")
    assert code == 0
    assert "rows: 9   runs: 1   ranks: 2   nodes: 2   steps: 1" in stdout
    assert "gemm" in stdout and "kernel outside any ProfilerStep" in stdout
    # The README next to the traces is not a trace: skipped and said so, not an error.
    assert "file of unrecognised format (found in a directory)" in stdout
    assert "note: files not recognised as traces and skipped:" in stdout


def test_bad_durations_are_skipped_and_reported(tmp_path, capsys):
    data = trace()
    kernels = [e for e in data["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["dur"] = -5
    del kernels[1]["dur"]  # a missing field
    text = json.dumps(data).replace('"dur": 100,', '"dur": NaN,')  # NaN literal (allreduce #0)
    path = write(tmp_path / "r" / "hostA_1.1.pt.trace.json", text)
    # five of the file's seven GPU activities unusable: refused, unless not strict
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "t.parquet", "--json")
    assert code == 2 and "71% of its 7 GPU activities cannot be used" in err
    code, stdout, err = run_cli(capsys, path, "-o", tmp_path / "t.parquet", "--json",
                                "--no-strict")
    assert code == 0, err
    skipped = json.loads(stdout)["skipped"]
    assert skipped == {"kernel with zero or negative duration": 2,  # -5 and the golden 0
                       "kernel with missing (NaN) duration": 2,  # missing and NaN
                       "kernel outside any ProfilerStep": 1}


def problem_cases(tmp_path: Path) -> dict[str, tuple[list[Path], list[str]]]:
    """name -> (paths to ingest, expected stderr lines)."""
    cases = {}
    good = trace()
    raw = json.dumps(good).encode()

    truncated = tmp_path / "trunc" / "r0.json.gz"
    truncated.parent.mkdir()
    truncated.write_bytes(gzip.compress(raw)[: len(gzip.compress(raw)) // 2])
    cases["truncated gzip"] = ([truncated], [
        f"error: {truncated}: truncated gzip: the compressed data ends before the end-of-stream "
        "marker (incomplete copy?)"])

    corrupt = tmp_path / "corrupt" / "r0.json.gz"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"\x1f\x8b\x08\x00" + b"not deflate data" * 4)
    cases["corrupt gzip"] = ([corrupt], [f"error: {corrupt}: cannot be read: corrupt gzip data: "])

    invalid = write(tmp_path / "invalid" / "r0.json", json.dumps(good)[:-40])
    cases["invalid json"] = ([invalid], [f"error: {invalid}: invalid JSON: "])

    no_kernels = copy.deepcopy(good)
    no_kernels["traceEvents"] = [e for e in no_kernels["traceEvents"]
                                 if e.get("cat") not in ("kernel", "gpu_memcpy")]
    nk = write(tmp_path / "nokernels" / "r0.json", no_kernels)
    cases["no kernels"] = ([nk], [
        f"error: {nk}: traceEvents: no GPU kernel events (cat 'kernel', ph 'X'): nothing to read"])

    no_info = copy.deepcopy(good)
    del no_info["distributedInfo"]
    ni = write(tmp_path / "noinfo" / "r0.json", no_info)
    cases["missing distributedInfo"] = ([ni], [
        f"error: {ni}: distributedInfo: missing: the trace does not say its rank (record it with "
        "a distributed backend, or pass rank= to read_kineto)"])

    no_steps = copy.deepcopy(good)
    no_steps["traceEvents"] = [e for e in no_steps["traceEvents"]
                               if not str(e.get("name", "")).startswith("ProfilerStep")]
    ns = write(tmp_path / "nosteps" / "r0.json", no_steps)
    cases["no ProfilerStep"] = ([ns], [
        f"error: {ns}: traceEvents: no ProfilerStep#N annotation: kernels cannot be assigned to "
        "steps (profile with torch.profiler.schedule / prof.step())"])

    no_name = copy.deepcopy(good)
    next(e for e in no_name["traceEvents"] if e.get("cat") == "kernel").pop("name")
    nn = write(tmp_path / "noname" / "r0.json", no_name)
    cases["kernel without name"] = ([nn], [
        f"error: {nn}: traceEvents.name: GPU events without a kernel name (1 row)"])

    a = write(tmp_path / "twice" / "a.json", good)
    b = write(tmp_path / "twice" / "b.json", good)
    cases["same rank twice"] = ([a, b], [
        f"error: {b}: distributedInfo.rank: rank 0 of run 'twice' is also in {a}: the same rank "
        "twice"])

    other = trace(1)
    other["distributedInfo"]["world_size"] = 4
    m0 = write(tmp_path / "mixed" / "a.json", good)
    m1 = write(tmp_path / "mixed" / "b.json", other)
    cases["different world size"] = ([m0, m1], [
        f"error: {m1}: distributedInfo.world_size: is 4, but {m0} of the same run 'mixed' has 2: "
        "files of different runs are mixed"])

    later = trace(1)
    for ev in later["traceEvents"]:
        ev["ts"] = ev["ts"] + 5 * 3600e6
    j0 = write(tmp_path / "jobs" / "a.json", good)
    j1 = write(tmp_path / "jobs" / "b.json", later)
    cases["different jobs"] = ([j0, j1], [
        f"error: {j1}: traceEvents.ts: starts 5.0 h away from {j0} of the same run 'jobs': "
        "files of different jobs are mixed (one directory per run)"])

    empty = tmp_path / "emptydir"
    empty.mkdir()
    cases["empty directory"] = ([empty], [f"error: {empty}: directory contains no files"])

    missing = tmp_path / "nope.json"
    cases["missing file"] = ([missing], [f"error: {missing}: no such file or directory"])
    pattern = tmp_path / "none*.json"
    cases["glob without match"] = ([pattern], [f"error: {pattern}: no file matches this pattern"])

    text = write(tmp_path / "notes" / "notes.txt", "just some text\n")
    cases["unrecognised explicit file"] = ([text], [
        f"error: {text}: not a recognised trace format (PyTorch profiler/Kineto JSON, MLPerf "
        "log, nccl-tests output, benchmark or tidy CSV/Parquet table)"])
    return cases


CASES = ["truncated gzip", "corrupt gzip", "invalid json", "no kernels", "missing distributedInfo",
         "no ProfilerStep", "kernel without name", "same rank twice", "different world size",
         "different jobs", "empty directory", "missing file", "glob without match",
         "unrecognised explicit file"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gives_one_line_per_problem_and_exit_2(tmp_path, capsys, case):
    paths, expected = problem_cases(tmp_path)[case]
    out = tmp_path / "out.parquet"
    code, _stdout, err = run_cli(capsys, *paths, "-o", out)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == len(expected), err
    for line, want in zip(lines, expected, strict=True):
        assert line.startswith(want), (line, want)
    assert "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob("out.parquet*"))


def test_problems_in_several_files_are_reported_together(tmp_path, capsys):
    cases = problem_cases(tmp_path)
    paths = (cases["truncated gzip"][0] + cases["invalid json"][0]
             + cases["missing distributedInfo"][0] + [RANK1])
    code, _, err = run_cli(capsys, *paths, "-o", tmp_path / "t.parquet")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 3
    assert "truncated gzip" in lines[0] and "invalid JSON" in lines[1]
    assert "distributedInfo: missing" in lines[2]


def test_cli_process_exit_code_and_no_traceback(tmp_path):
    bad = write(tmp_path / "x" / "r0.json", '{"traceEvents": [')
    proc = subprocess.run([sys.executable, "-m", "bayesprism.cli.main", "ingest", str(bad), "-o",
                           str(tmp_path / "t.parquet")], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {bad}: invalid JSON: ")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_ingest_records_stated_layout_in_the_parquet_runs(tmp_path, capsys):
    """The facts are written with the run metadata as the files stream in (one pass)."""
    out = tmp_path / "t.parquet"
    code, stdout, err = run_cli(capsys, RANK0, RANK1, "-o", out, "--layout", "tp=2",
                                "--layout", "schedule=gpipe", "--json")
    assert code == 0, err
    assert json.loads(stdout)["rows"] == 9  # the rows are those of a plain ingest
    table = schema.read_table(out)
    meta = table.attrs["runs"]["kineto_golden"]
    # 2 ranks, tp 2 stated: dp re-derived as 2 / 2
    assert (meta["plan"]["tp"], meta["plan"]["dp"], meta["plan"]["schedule"]) == (2, 1, "gpipe")
    assert meta["layout_sources"] == {"tp": "user", "schedule": "user"}
    assert not list(tmp_path.glob("*.tmp"))


def test_ingest_to_parquet_layout_matches_read_traces(tmp_path):
    from bayesprism.ingest import ingest_to_parquet, read_traces

    layout = {"virtual_stages": 2, "pp": 2}
    ingest_to_parquet([RANK0, RANK1], tmp_path / "t.parquet", layout=layout, progress=False)
    streamed = schema.read_table(tmp_path / "t.parquet").attrs["runs"]
    assert streamed == read_traces([RANK0, RANK1], layout=layout, progress=False).attrs["runs"]
    assert streamed["kineto_golden"]["plan"]["schedule"] == "interleaved-1f1b"


@pytest.mark.parametrize("command", [
    ["ingest", str(RANK0), "-o", "{tmp}/t.parquet"],
    ["fit", str(RANK0), "-o", "{tmp}/p.nc"],
    ["validate", "--fit", str(RANK0), "--split", "steps"],
])
@pytest.mark.parametrize(("fact", "message"), [
    ("virtual=12", "error: --layout: virtual: unknown layout key; allowed: dp, tp, pp, cp, ep, "
     "microbatches, virtual_stages, micro_batch_size, gpus_per_node, nodes_per_leaf, "
     "schedule, sharding, "
     "overlap"),
    ("virtual_stages=0", "error: --layout: virtual_stages: must be a positive integer, got 0"),
])
def test_every_command_that_reads_traces_refuses_a_bad_layout(tmp_path, capsys, command, fact,
                                                               message):
    argv = [a.format(tmp=tmp_path) for a in command]
    assert main([*argv, "--layout", "tp=2", "--layout", fact, "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [message]
    assert not list(tmp_path.iterdir())  # refused before anything is read or written


def test_skip_bad_ingests_the_rest_of_a_folder(shared_data, tmp_path, capsys):
    # --skip-bad (= --no-strict): the good file is ingested, the broken one named and counted;
    # by default the broken file fails the ingest
    import shutil

    folder = tmp_path / "traces"
    folder.mkdir()
    good = sorted((shared_data / "simulated" / "megatron-3d-dev" / "traces").glob("*.gz"))[0]
    shutil.copy(good, folder / good.name)
    (folder / "broken.pt.trace.json").write_text('{"traceEvents": [')
    out = tmp_path / "table.parquet"
    assert main(["ingest", str(folder), "-o", str(out), "--quiet"]) == 2
    assert "broken.pt.trace.json" in capsys.readouterr().err
    assert main(["ingest", str(folder), "-o", str(out), "--skip-bad", "--json", "--quiet"]) == 0
    assert "broken.pt.trace.json" in capsys.readouterr().out and out.exists()
