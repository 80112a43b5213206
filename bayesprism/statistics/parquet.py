"""Statistics artifacts on disk: one Parquet file, validated when read.

Rows are the cells of :class:`~bayesprism.model.statistics.ModelStatistics`, kernel cells
(``part == "kernel"``) then collective cells (``part == "collective"``), in one table whose
columns are the union of theirs (null where a part has no such column). The Parquet key-value
metadata holds the rest:

* ``bayesprism.statistics``: JSON of ``kind`` (:data:`KIND`), ``schema_version``
  (:data:`STATISTICS_SCHEMA_VERSION`), ``bayesprism_version``, ``input_digest``, the run
  metadata (``attrs``), ``node_cabinets``, ``benchmark_runs`` and the ``provenance``: inputs,
  files read with their size and SHA-256, skips with their reasons;
* ``bayesprism.inventory``: the traced run's inventory (:mod:`bayesprism.statistics.codec`).

Written to a temporary name and renamed (:func:`bayesprism.outputs.write_atomic`). Read
back, every problem is an :class:`~bayesprism.errors.ArtifactError` naming the file, the field
and the value (the CLI prints one line and exits 2).
"""

from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism._version import __version__
from bayesprism.errors import ArtifactError, Problem
from bayesprism.io import check_package_version
from bayesprism.model.statistics import (
    COLLECTIVE_CELL_COLUMNS,
    KERNEL_CELL_COLUMNS,
    ModelStatistics,
)
from bayesprism.outputs import check_output_path, write_atomic
from bayesprism.schema import ATTRS_KEY, _jsonable
from bayesprism.statistics.artifact import TraceStatistics
from bayesprism.statistics.codec import dataset_from_json, dataset_to_json

# pyarrow is imported where Parquet is read or written (start-up time).

#: What a statistics artifact says it is.
KIND = "bayesprism-statistics"
#: Version of the layout below; bumped when readers would break.
STATISTICS_SCHEMA_VERSION = 1
HEADER_KEY = b"bayesprism.statistics"
INVENTORY_KEY = b"bayesprism.inventory"
#: Column → Arrow type name of the cells table (the union of both parts).
COLUMN_TYPES: dict[str, str] = {
    "part": "string", "run": "string", "node": "string", "gpu": "int64", "step": "int64",
    "kernel": "string", "kernel_class": "string", "usable": "bool", "fixed_role": "bool",
    "collective": "string", "tier": "int64", "algorithm": "string", "group_size": "float64",
    "nodes": "int64", "bytes": "float64", "n": "int64", "transfer_n": "int64",
    "mean_log": "float64", "ss_log": "float64",
}
WRITER = "bayesprism ingest --statistics"


def _schema():
    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_(),
             "float64": pa.float64()}
    return pa.schema([pa.field(c, types[t]) for c, t in COLUMN_TYPES.items()])


def _part_table(frame: pd.DataFrame, part: str, schema):
    import pyarrow as pa

    arrays = []
    for fld in schema:
        if fld.name == "part":
            arrays.append(pa.array([part] * len(frame), type=fld.type))
        elif fld.name in frame.columns:
            values = frame[fld.name].to_numpy()
            if pa.types.is_string(fld.type):
                values = values.astype(str).astype(object)
            arrays.append(pa.array(values, type=fld.type))
        else:
            arrays.append(pa.nulls(len(frame), type=fld.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def write_statistics(stats: TraceStatistics, path: str | os.PathLike) -> Path:
    """Write a statistics artifact (Parquet) atomically.

    Parameters
    ----------
    stats
        From :func:`bayesprism.statistics.statistics_of` or
        :func:`bayesprism.statistics.read_statistics`.
    path
        The Parquet file to write (its folder must exist).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import pandas as pd
    >>> from bayesprism.statistics import statistics_of
    >>> table = pd.DataFrame({"run": ["r"] * 2, "step": [0, 1], "node": ["n0"] * 2,
    ...                       "gpu": [0, 0], "kernel": ["k"] * 2, "rank": [0, 0],
    ...                       "kernel_class": ["gemm"] * 2, "duration_us": [1.0, 2.0]})
    >>> write_statistics(statistics_of(table), "stats.parquet")  # doctest: +SKIP
    PosixPath('stats.parquet')
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = check_output_path(path, "output")
    schema = _schema()
    model = stats.model
    table = pa.concat_tables([_part_table(model.kernel_cells, "kernel", schema),
                              _part_table(model.collective_cells, "collective", schema)])
    header = {
        "kind": KIND, "schema_version": STATISTICS_SCHEMA_VERSION,
        "bayesprism_version": __version__, "writer": WRITER,
        "input_digest": stats.input_digest,
        "node_cabinets": None if model.node_cabinets is None else [
            list(p) for p in model.node_cabinets],
        "benchmark_runs": list(model.benchmark_runs),
        "attrs": _jsonable(stats.attrs), "provenance": _jsonable(stats.provenance),
    }
    metadata = {
        HEADER_KEY: json.dumps(header, sort_keys=True).encode(),
        INVENTORY_KEY: json.dumps(dataset_to_json(stats.inventory)).encode(),
    }

    def write(tmp: Path) -> None:
        # store_schema=False: the key-value metadata once, not again inside the Arrow schema
        with pq.ParquetWriter(tmp, schema, compression="zstd", store_schema=False) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata(metadata)

    return write_atomic(path, write)


def _metadata(path: Path) -> dict | None:
    """The Parquet key-value metadata of ``path``; None when it is not a Parquet file."""
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).metadata or {}
    except (OSError, ValueError):  # pyarrow: not Parquet, truncated, unreadable
        return None


def is_statistics_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a Parquet file carrying a statistics artifact's header (valid or
    not: :func:`read_statistics` says what is wrong).

    Examples
    --------
    >>> is_statistics_file("no-such-file.parquet")
    False
    """
    path = Path(path)
    if not path.is_file():
        return False
    metadata = _metadata(path)
    return bool(metadata) and HEADER_KEY in metadata


def read_statistics(path: str | os.PathLike) -> TraceStatistics:
    """Read a statistics artifact written by :func:`write_statistics`, validated.

    Parameters
    ----------
    path
        The Parquet file.

    Returns
    -------
    TraceStatistics
        With ``source`` the path read.

    Raises
    ------
    ArtifactError
        Naming the file, field and value: not a file, not Parquet, a trace table or another
        Parquet file, another ``kind``, another ``schema_version``, a newer major
        ``bayesprism_version``, bad JSON in the metadata, missing columns or bad cells.

    Warns
    -----
    ArtifactWarning
        Written by another bayesprism version of the same major version.

    Examples
    --------
    >>> import bayesprism as bp
    >>> stats = bp.read_statistics("stats.parquet")                   # doctest: +SKIP
    >>> posterior = bp.fit(stats, random_seed=0)                       # doctest: +SKIP
    """
    import pyarrow.parquet as pq

    path = Path(path)
    source = str(path)
    expected = f"expected a statistics artifact (Parquet written by `{WRITER}`)"
    if path.is_dir():
        raise ArtifactError(Problem(source, "", f"is a directory, {expected}"))
    if not path.is_file():
        raise ArtifactError(Problem(source, "", f"no such file, {expected}"))
    metadata = _metadata(path)
    if metadata is None:
        raise ArtifactError(Problem(source, "", f"cannot be read as Parquet, {expected}"))
    if HEADER_KEY not in metadata:
        what = ("a trace table (written by `bayesprism ingest` without --statistics)"
                if ATTRS_KEY in metadata else "a Parquet file without a statistics header")
        raise ArtifactError(Problem(source, HEADER_KEY.decode(), f"is {what}, {expected}"))
    header = _json(metadata[HEADER_KEY], source, HEADER_KEY.decode())
    _check_header(header, source)
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        raise ArtifactError(Problem(source, "", f"cannot be read as Parquet ({exc}), "
                                    f"{expected}")) from None
    frame = table.to_pandas()
    model = _model_statistics(frame, header, source)
    try:
        inventory = dataset_from_json(_json(metadata.get(INVENTORY_KEY, b""), source,
                                            INVENTORY_KEY.decode()))
    except (KeyError, ValueError, TypeError, zlib.error) as exc:
        raise ArtifactError(Problem(source, INVENTORY_KEY.decode(),
                                    f"is not an inventory ({exc}): the file was altered")) \
            from None
    return TraceStatistics(model=model, inventory=inventory,
                           input_digest=str(header["input_digest"]),
                           attrs=dict(header.get("attrs") or {}),
                           provenance=dict(header.get("provenance") or {}), source=source)


def _json(raw: bytes, source: str, key: str) -> dict:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ArtifactError(Problem(source, key, "is not valid JSON: the file was altered",
                                    example=raw[:40])) from None
    if not isinstance(value, dict):
        raise ArtifactError(Problem(source, key, "is not a JSON object: the file was altered",
                                    example=type(value).__name__))
    return value


def _check_header(header: dict, source: str) -> None:
    """Kind, schema version, package version and digest of a statistics header."""
    if header.get("kind") != KIND:
        raise ArtifactError(Problem(source, "kind", f"is not {KIND!r}: not a statistics "
                                    "artifact", example=header.get("kind")))
    version = header.get("schema_version")
    if version != STATISTICS_SCHEMA_VERSION:
        raise ArtifactError(Problem(
            source, "schema_version", f"is not supported; this bayesprism reads version "
            f"{STATISTICS_SCHEMA_VERSION}: write the statistics again with `{WRITER}`",
            example=version))
    check_package_version(header.get("bayesprism_version"), source, stacklevel=4)
    digest = header.get("input_digest")
    if digest is None:
        raise ArtifactError(Problem(source, "input_digest", "is missing: the file was altered"))
    if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{16}", digest)):
        raise ArtifactError(Problem(source, "input_digest", "must be 16 hex digits",
                                    example=digest))


def _model_statistics(frame: pd.DataFrame, header: dict, source: str) -> ModelStatistics:
    """The cells of the file, checked: columns, parts, counts and values."""
    missing = [c for c in COLUMN_TYPES if c not in frame.columns]
    if missing:
        raise ArtifactError(Problem(source, ", ".join(missing), "column(s) missing: the file "
                                    "was altered"))
    problems: list[Problem] = []
    part = frame["part"]
    unknown = ~part.isin(["kernel", "collective"])
    if unknown.any():
        problems.append(Problem(source, "part", "must be 'kernel' or 'collective'",
                                int(unknown.sum()), part[unknown].iloc[0]))
    kernel = frame.loc[part == "kernel", list(KERNEL_CELL_COLUMNS)].reset_index(drop=True)
    collective = frame.loc[part == "collective",
                           list(COLLECTIVE_CELL_COLUMNS)].reset_index(drop=True)
    for name, cells, columns in (("kernel", kernel, KERNEL_CELL_COLUMNS),
                                 ("collective", collective, COLLECTIVE_CELL_COLUMNS)):
        for col in columns:
            bad = cells[col].isna().to_numpy()
            if bad.any():
                problems.append(Problem(source, col, f"is missing in {name} cells",
                                        int(bad.sum())))
        n = cells["n"].to_numpy(dtype=float, na_value=np.nan)
        bad = ~(n >= 1)
        if bad.any():
            problems.append(Problem(source, "n", f"must be >= 1 in {name} cells",
                                    int(bad.sum()), n[bad][0]))
        mean = cells["mean_log"].to_numpy(dtype=float, na_value=np.nan)
        ss = cells["ss_log"].to_numpy(dtype=float, na_value=np.nan)
        bad = ~(np.isfinite(mean) & np.isfinite(ss) & (ss >= 0))
        if bad.any():
            problems.append(Problem(source, "mean_log, ss_log", f"must be finite (ss_log >= 0) "
                                    f"in {name} cells", int(bad.sum())))
    if not len(kernel):
        problems.append(Problem(source, "part", "holds no kernel cells"))
    if problems:
        raise ArtifactError(problems)
    kernel = kernel.astype({"gpu": np.int64, "step": np.int64, "usable": bool,
                            "fixed_role": bool, "n": np.int64, "transfer_n": np.int64})
    collective = collective.astype({"tier": np.int64, "nodes": np.int64, "step": np.int64,
                                    "n": np.int64})
    cabinets = header.get("node_cabinets")
    return ModelStatistics(
        kernel_cells=kernel, collective_cells=collective,
        node_cabinets=None if cabinets is None else tuple(
            (str(a), str(b)) for a, b in cabinets),
        benchmark_runs=tuple(str(r) for r in header.get("benchmark_runs") or ()))


__all__ = ["KIND", "STATISTICS_SCHEMA_VERSION", "is_statistics_file", "read_statistics",
           "write_statistics"]
