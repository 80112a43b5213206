"""Statistics artifacts (``bayesprism ingest --statistics``): a fit from them is the fit from
the traces, they record their inputs' digests and skips, Dask writes the same artifact, and a
bad artifact is refused with one line (exit 2)."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from bayesprism import inference
from bayesprism.cli.main import main
from bayesprism.errors import ArtifactError, InputError
from bayesprism.ingest import read_traces
from bayesprism.ingest.dispatch import SKIP_BAD_FILE
from bayesprism.io import load
from bayesprism.model import prepare, prepare_statistics
from bayesprism.schema import signature_as_kernel
from bayesprism.spec import ModelSpec
from bayesprism.statistics import (
    KIND,
    ingest_statistics,
    read_statistics,
    statistics_of,
    write_statistics,
)
from bayesprism.statistics.parquet import HEADER_KEY

#: Root attrs that say how the posterior was made, not what it is.
HOW = {"seconds", "input_kind", "statistics_source", "statistics_provenance"}


@pytest.fixture(scope="module")
def dev_table(dev_subset) -> pd.DataFrame:
    return read_traces([dev_subset], progress=False)


@pytest.fixture(scope="module")
def dev_statistics(dev_subset, tmp_path_factory):
    """The dev subset's statistics artifact, written by the CLI."""
    out = tmp_path_factory.mktemp("stats") / "stats.parquet"
    assert main(["ingest", str(dev_subset), "--statistics", "-o", str(out), "--quiet"]) == 0
    return out


def assert_same_prepared(a, b, rtol: float = 0.0) -> None:
    """The same prepared model: coordinates, shapes and integers exactly, floats bit for bit
    (``rtol=0``) or within ``rtol``."""
    assert a.coords.keys() == b.coords.keys() and a.data.keys() == b.data.keys()
    for key in a.coords:
        assert a.coords[key] == b.coords[key], key
    for key, value in a.data.items():
        x, y = np.asarray(value), np.asarray(b.data[key])
        assert x.dtype == y.dtype and x.shape == y.shape, key
        if rtol and x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol, err_msg=key)
        else:
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), key
    assert a.attrs == b.attrs and a.summary == b.summary


@pytest.mark.parametrize("spec", [
    ModelSpec.default(),
    ModelSpec(collective_model="none"),  # collectives fitted as kernels, from other cells
    ModelSpec(levels=("node", "gpu", "step")),
])
def test_the_model_is_prepared_from_the_artifact_as_from_the_traces(dev_table, dev_statistics,
                                                                    tmp_path, spec):
    from_tables = prepare([signature_as_kernel(dev_table)], spec)
    # the table's statistics, written and read back: bit for bit
    write_statistics(statistics_of(dev_table), tmp_path / "table.parquet")
    assert_same_prepared(prepare_statistics(read_statistics(tmp_path / "table.parquet").model,
                                            spec), from_tables)
    # streamed from the files: a signature's place keys summed in another order
    stats = read_statistics(dev_statistics)
    assert_same_prepared(prepare_statistics(stats.model, spec), from_tables, rtol=1e-12)
    assert stats.inventory.identical(statistics_of(dev_table).inventory)


def test_a_fit_from_the_artifact_is_the_fit_from_the_traces(dev_subset, dev_statistics,
                                                             tmp_path, monkeypatch, capsys):
    common = ["--draws", "15", "--tune", "25", "--chains", "1", "--sampler", "nutpie",
              "--random-seed", "7", "--quiet"]
    monkeypatch.setattr(inference, "_COMPILED", {})  # nothing compiled reused between fits
    assert main(["fit", str(dev_subset), "-o", str(tmp_path / "traces.nc"), *common]) == 0
    monkeypatch.setattr(inference, "_COMPILED", {})
    assert main(["fit", str(dev_statistics), "-o", str(tmp_path / "stats.nc"), *common]) == 0
    capsys.readouterr()
    a, b = load(tmp_path / "traces.nc"), load(tmp_path / "stats.nc")
    for group in ("posterior", "sample_stats", "observed_data", "constant_data", "inventory"):
        x, y = a[group].to_dataset(), b[group].to_dataset()
        # the streamed cells differ from the table's by the order of sums (1e-16); the draws
        # follow them only until that rounding flips one of the sampler's discrete choices
        # (a U-turn, an acceptance), which happens within 40 iterations on some CPUs: the
        # draws' layout is compared here, the density they sample below
        assert_same_values(x, y, group, values=group not in ("posterior", "sample_stats"))
        assert ({k: v for k, v in x.attrs.items() if k != "created_at"}
                == {k: v for k, v in y.attrs.items() if k != "created_at"}), group
    # streamed statistics are digested by their content (no table is assembled)
    assert {k: v for k, v in a.attrs.items() if k not in HOW | {"input_digest"}} == {
        k: v for k, v in b.attrs.items() if k not in HOW | {"input_digest"}}
    assert b.attrs["input_digest"] == read_statistics(dev_statistics).input_digest
    assert (a.attrs["input_kind"], b.attrs["input_kind"]) == ("tables", "statistics")
    assert b.attrs["statistics_source"] == str(dev_statistics)
    recorded = json.loads(b.attrs["statistics_provenance"])
    assert len(recorded["files"]) == 8 and all("sha256" in f for f in recorded["files"])


def test_the_model_from_the_artifact_has_the_traces_model_density(dev_table, dev_statistics):
    from bayesprism.model import build

    spec = ModelSpec.default()
    models = [build(prepare([signature_as_kernel(dev_table)], spec), spec),
              build(prepare_statistics(read_statistics(dev_statistics).model, spec), spec)]
    assert [v.name for v in models[0].value_vars] == [v.name for v in models[1].value_vars]
    logps = [m.compile_logp() for m in models]
    base = models[0].initial_point()
    rng = np.random.default_rng(3)
    for k in range(4):
        point = {name: value + (k > 0) * rng.normal(0.0, 0.05, np.shape(value))
                 for name, value in base.items()}
        assert logps[1](point) == pytest.approx(logps[0](point), rel=1e-9)


def assert_same_values(x, y, group: str, values: bool = True) -> None:
    """Two datasets with the same variables, coordinates and shapes; with ``values``, the
    same integers and floats to 1e-3 (data summed in another order)."""
    assert x.keys() == y.keys() and x.coords.keys() == y.coords.keys(), group
    for name in [*x.coords, *x.data_vars]:
        u, v = x[name].to_numpy(), y[name].to_numpy()
        assert u.shape == v.shape, (group, name)
        if not values and name not in x.coords:
            continue
        if u.dtype.kind == "f":
            np.testing.assert_allclose(u, v, rtol=1e-3, atol=1e-5, err_msg=f"{group}.{name}")
        else:
            assert np.array_equal(u, v), (group, name)


def test_the_provenance_lists_files_with_digests_and_skips(dev_subset, tmp_path, capsys):
    folder = tmp_path / "traces"
    shutil.copytree(dev_subset, folder)
    bad = folder / "zz_truncated.pt.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "cat": "kernel"')[:-8])
    out = tmp_path / "stats.parquet"
    code = main(["ingest", str(folder), "--statistics", "--no-strict", "-o", str(out), "--json",
                 "--quiet"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["files"] == summary["files_digested"] == 8
    assert summary["skipped"] == {SKIP_BAD_FILE: 1}
    provenance = read_statistics(out).provenance
    good = sorted(p for p in folder.iterdir() if p != bad)
    assert [f["path"] for f in provenance["files"]] == [str(p) for p in good]
    for entry, path in zip(provenance["files"], good, strict=True):
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert entry["bytes"] == path.stat().st_size
    assert provenance["skipped"] == {SKIP_BAD_FILE: 1}
    assert [line.split(":")[0] for line in provenance["skipped_files"]] == [str(bad)]
    assert provenance["inputs"] == [str(folder)] and provenance["engine"] == "embedded"


def test_dask_writes_the_same_artifact(dask_client, dev_subset, dev_statistics, tmp_path):
    out = tmp_path / "dask.parquet"
    summary = ingest_statistics([dev_subset], out, engine="dask", client=dask_client,
                                progress=False)
    dask, embedded = read_statistics(out), read_statistics(dev_statistics)
    pd.testing.assert_frame_equal(dask.model.kernel_cells, embedded.model.kernel_cells)
    pd.testing.assert_frame_equal(dask.model.collective_cells,
                                  embedded.model.collective_cells)
    assert dask.inventory.identical(embedded.inventory)
    assert dask.input_digest == embedded.input_digest == summary["input_digest"]
    assert dask.provenance["files"] == embedded.provenance["files"]
    assert dask.provenance["engine"] == "dask"


def _with_header(src, dst, **changes) -> None:
    """A copy of the artifact ``src`` with header fields changed."""
    table = pq.read_table(src)
    metadata = dict(pq.read_schema(src).metadata)
    header = json.loads(metadata[HEADER_KEY]) | changes
    metadata[HEADER_KEY] = json.dumps(header).encode()
    pq.write_table(table.replace_schema_metadata(metadata), dst)


@pytest.mark.parametrize(("change", "expected"), [
    ({"kind": "bayesprism-table"}, "kind: is not 'bayesprism-statistics': not a statistics "
     "artifact, got 'bayesprism-table'"),
    ({"schema_version": 99}, "schema_version: is not supported"),
    ({"bayesprism_version": "99.0.0"}, "bayesprism_version: written by a newer major version"),
    ({"input_digest": None}, "input_digest: is missing"),
    ({"input_digest": "xyz"}, "input_digest: must be 16 hex digits, got 'xyz'"),
])
def test_a_wrong_artifact_is_refused_in_one_line(dev_statistics, tmp_path, capsys, change,
                                                 expected):
    bad = tmp_path / "bad.parquet"
    _with_header(dev_statistics, bad, **change)
    code = main(["fit", str(bad), "-o", str(tmp_path / "p.nc"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"error: {bad}: {expected}")
    assert not (tmp_path / "p.nc").exists()


def test_a_corrupted_artifact_is_refused_in_one_line(dev_statistics, tmp_path, capsys):
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(dev_statistics.read_bytes()[:-100])
    code = main(["fit", str(truncated), "-o", str(tmp_path / "p.nc"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {truncated}: ")
    with pytest.raises(ArtifactError, match="cannot be read as Parquet"):
        read_statistics(truncated)
    # cells altered: a count of zero launches
    table = pq.read_table(dev_statistics)
    frame = table.to_pandas()
    frame.loc[0, "n"] = 0
    altered = tmp_path / "altered.parquet"
    pq.write_table(pq.read_table(dev_statistics).from_pandas(frame, preserve_index=False)
                   .replace_schema_metadata(table.schema.metadata), altered)
    code = main(["fit", str(altered), "-o", str(tmp_path / "p.nc"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"error: {altered}: n: must be >= 1 in kernel cells (1 row), "
                                 "got 0.0"]


def test_a_trace_table_is_not_an_artifact(dev_table, tmp_path):
    from bayesprism.schema import write_table

    path = tmp_path / "table.parquet"
    write_table(dev_table, path)
    with pytest.raises(ArtifactError, match="is a trace table"):
        read_statistics(path)


def test_what_statistics_cannot_fit_is_said(dev_statistics, dev_subset, tmp_path, capsys):
    stats = read_statistics(dev_statistics)
    with pytest.raises(InputError, match="fitted on launches, which statistics do not hold"):
        inference.fit(stats, ModelSpec(likelihood="student_t"), draws=5, tune=5)
    with pytest.raises(InputError, match="statistics feed the kernel-level model"):
        inference.fit(stats, "step", draws=5, tune=5)
    code = main(["fit", str(dev_statistics), str(dev_subset), "-o", str(tmp_path / "p.nc")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "fitted on its own" in err[0]
    # written in memory and read back: the same statistics
    again = tmp_path / "again.parquet"
    write_statistics(stats, again)
    assert read_statistics(again).model.kernel_cells.equals(stats.model.kernel_cells)
    assert KIND == "bayesprism-statistics"
