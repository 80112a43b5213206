"""Ingest on Dask (``engine="dask"``): the embedded engine's table and statistics, bad files
skipped with their reason, a worker killed mid-run without anything counted twice."""

from __future__ import annotations

import functools
import gzip
import math
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from bayesprism.errors import InputError, TraceFormatError
from bayesprism.ingest import ingest_to_parquet, read_traces
from bayesprism.ingest.dispatch import SKIP_BAD_FILE, read_file
from bayesprism.ingest.distributed import FAN_IN
from bayesprism.schema import read_table

#: Files of the dev traces read by the default tests (conftest's ``dev_subset``; all 64 in
#: the slow one).
SUBSET = 8


@pytest.fixture(scope="module")
def client(dask_client):
    """The module's local cluster of 2 workers (conftest)."""
    return dask_client


@pytest.fixture(scope="module")
def subset(dev_subset) -> Path:
    return dev_subset


def assert_same_summary(embedded: dict, dask: dict) -> None:
    """Equal, but for the last bits of the sums (added in another order by the reduction)."""
    def close(a, b) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return math.isclose(a, b, rel_tol=1e-12)
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        return a == b

    for key in embedded:
        assert close(embedded[key], dask[key]), (key, embedded[key], dask[key])
    assert embedded.keys() == dask.keys()


def assert_same_parquet(a: Path, b: Path) -> None:
    ta, tb = read_table(a), read_table(b)
    pd.testing.assert_frame_equal(ta, tb)
    assert ta.attrs == tb.attrs


def test_dev_subset_same_table_and_statistics(client, subset, tmp_path):
    embedded = ingest_to_parquet([subset], tmp_path / "e.parquet", progress=False)
    dask = ingest_to_parquet([subset], tmp_path / "d.parquet", progress=False, engine="dask",
                             client=client)
    assert dask["rows"] == embedded["rows"] > 0 and dask["skipped"] == embedded["skipped"]
    assert_same_summary(embedded, dask)
    if SUBSET <= FAN_IN:  # one merge of the files in order, as the embedded engine's
        assert dask == embedded
    assert_same_parquet(tmp_path / "e.parquet", tmp_path / "d.parquet")
    # the in-memory table too
    table = read_traces([subset], progress=False, engine="dask", client=client)
    pd.testing.assert_frame_equal(table, read_traces([subset], progress=False))


@pytest.mark.slow
def test_all_dev_traces_same_table_and_statistics(client, dev_files, tmp_path):
    folder = dev_files[0].parent
    embedded = ingest_to_parquet([folder], tmp_path / "e.parquet", progress=False)
    dask = ingest_to_parquet([folder], tmp_path / "d.parquet", progress=False, engine="dask",
                             client=client)
    assert dask["rows"] == embedded["rows"] == 835_584
    assert_same_summary(embedded, dask)
    assert_same_parquet(tmp_path / "e.parquet", tmp_path / "d.parquet")


@pytest.fixture()
def with_bad_files(subset, tmp_path) -> tuple[Path, list[Path]]:
    """Four good rank files, a truncated gzip copy of another and a JSON that is no trace."""
    folder = tmp_path / "traces"
    folder.mkdir()
    files = sorted(subset.iterdir())
    for f in files[:4]:
        shutil.copy(f, folder / f.name)
    truncated = folder / files[4].name
    truncated.write_bytes(files[4].read_bytes()[: files[4].stat().st_size // 2])
    broken = folder / "dgx-h100-9999_1.1764016804433.pt.trace.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "cat": "kernel", '))
    good = tmp_path / "good"
    good.mkdir()
    for f in files[:4]:
        shutil.copy(f, good / f.name)
    return folder, [truncated, broken]


def test_bad_files_reported_and_skipped(client, with_bad_files, tmp_path):
    folder, bad = with_bad_files
    summary = ingest_to_parquet([folder], tmp_path / "d.parquet", progress=False,
                                engine="dask", client=client)
    assert summary["skipped"][SKIP_BAD_FILE] == 2
    for path in bad:
        assert any(note.startswith(f"skipped {path}: ") for note in summary["notes"]), path
    assert any("truncated gzip" in note for note in summary["notes"])
    good = ingest_to_parquet([folder.parent / "good"], tmp_path / "e.parquet", progress=False)
    assert summary["rows"] == good["rows"]
    assert summary["kernel_classes"] == good["kernel_classes"]  # 4 files: one merge, exact
    # --strict: the same files fail the whole read, each named
    with pytest.raises(TraceFormatError) as err:
        ingest_to_parquet([folder], tmp_path / "s.parquet", progress=False, engine="dask",
                          client=client, strict=True)
    assert all(any(str(path) in line for line in err.value.lines()) for path in bad)
    assert not (tmp_path / "s.parquet").exists()


def test_embedded_not_strict_skips_bad_files_too(with_bad_files):
    folder, _ = with_bad_files
    with pytest.raises(TraceFormatError):
        read_traces([folder], progress=False)  # the embedded default stays strict
    table = read_traces([folder], progress=False, strict=False)
    assert table.attrs["skipped"][SKIP_BAD_FILE] == 2
    assert table["rank"].nunique() == 4


def test_every_file_bad_is_an_error(tmp_path):
    bad = tmp_path / "r.pt.trace.json"
    bad.write_text('{"traceEvents": [')
    with pytest.raises(TraceFormatError, match=r"r\.pt\.trace\.json"):
        read_traces([bad], progress=False, strict=False)


def _read_or_die(target: str, marker: Path, reader, path, options, finish=None):
    """``read_file``, but the first attempt at ``target`` kills its worker process (the
    ``marker`` file says it was done)."""
    if str(path) == target and not marker.exists():
        marker.write_text("killed")
        os._exit(1)
    return read_file(reader, path, options, finish)


def test_worker_killed_mid_run_gives_the_right_totals(client, subset, tmp_path):
    import cloudpickle

    from bayesprism.ingest.dispatch import IngestCollector, expand_paths, iter_frames
    from bayesprism.ingest.distributed import DaskReads, ingest_engine
    from bayesprism.ingest.parquet import _file_parts
    from bayesprism.ingest.summary import SummaryAccumulator

    # the workers cannot import this test module: send the task function by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    files, _ = expand_paths([subset])
    target = str(files[len(files) // 2].path)
    marker = tmp_path / "killed"
    try:
        collector = IngestCollector()
        summary = SummaryAccumulator()
        with ingest_engine("dask", client=client, progress=False, fan_in=4,
                           task=functools.partial(_read_or_die, target, marker)) as reads:
            assert isinstance(reads, DaskReads)
            for _rest, _coll, part in iter_frames(files, {}, collector, False,
                                                  finish=_file_parts, read=reads):
                summary.merge(part)
            reads.add_totals(collector, summary)
            assert reads.files_done == reads.files_total == SUBSET
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        client.wait_for_workers(2, timeout=60)  # the nanny restarted the killed one
    assert marker.exists(), "no worker was killed"
    assert not collector.problems
    embedded = ingest_to_parquet([subset], tmp_path / "e.parquet", progress=False)
    dask = summary.result(collector.attrs)
    assert dask["rows"] == embedded["rows"]
    assert {c: v["count"] for c, v in dask["kernel_classes"].items()} == {
        c: v["count"] for c, v in embedded["kernel_classes"].items()}
    assert_same_summary({k: embedded[k] for k in ("ranks", "steps", "kernel_classes")},
                        {k: dask[k] for k in ("ranks", "steps", "kernel_classes")})
    assert sum(collector.signature_stats.count.values()) > 0


def test_cli_on_a_scheduler(client, subset, tmp_path, capsys):
    from bayesprism.cli.main import main

    out = tmp_path / "t.parquet"
    code = main(["ingest", str(subset), "-o", str(out), "--engine", "dask", "--scheduler",
                 client.scheduler.address, "--json", "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert '"rows": ' in captured.out
    assert read_table(out)["rank"].nunique() == SUBSET


def test_cli_scheduler_needs_dask_engine(subset, tmp_path, capsys):
    from bayesprism.cli.main import main

    code = main(["ingest", str(subset), "-o", str(tmp_path / "t.parquet"), "--scheduler",
                 "tcp://localhost:1", "--quiet"])
    assert code == 2
    assert "--scheduler: needs --engine dask" in capsys.readouterr().err


def test_unknown_engine_and_missing_dask(subset, monkeypatch):
    with pytest.raises(InputError, match="engine: must be one of embedded, dask"):
        read_traces([subset], engine="spark")
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    with pytest.raises(InputError, match=r"bayesprism\[dask\]"):
        read_traces([subset], engine="dask")


def test_tree_reduction_counts_every_part_once(client):
    from bayesprism.ingest.distributed import TreeReduction, merge_statistics
    from bayesprism.ingest.signatures import SignatureStats

    def part(i: int):
        return (), SignatureStats({"k": 1, f"own{i}": 1}, {"k": float(i), f"own{i}": 0.0},
                                    {"k": 0.0, f"own{i}": 0.0})

    reduction = TreeReduction(client, fan_in=3)
    for i in range(37):  # three levels of full groups and leftovers on each
        reduction.add(client.submit(part, i, pure=False))
    accumulators, stats = reduction.result().result()
    assert accumulators == ()
    assert stats.count["k"] == 37 and stats.log_sum["k"] == sum(range(37))
    assert len(stats.count) == 38
    assert merge_statistics() == ((), SignatureStats())

