"""Tidy CSV / Parquet tables → the trace table, with a column mapping and unit conversion.

The file holds one row per kernel execution (or per step) with the schema's columns, possibly
under other names: ``column_map={"their_name": "schema_name"}`` renames them, and mapping a
column to ``None`` drops it (the only way to drop one: an unknown column is an error listing the
unknown and the known names, never silently discarded). ``units`` converts time columns
(``duration_us``, ``start_us``, ``wait_us``, ``transfer_us``) given in ``ns``, ``ms`` or ``s``
to µs: ``units={"duration_us": "ms"}``, or ``units="ms"`` for ``duration_us`` alone.

Missing required columns are filled only where the value is unambiguous, and every fill is
reported in the notes:

* ``run``: the ``run=`` argument, else the file name without extensions.
* ``rank``, ``gpu``, ``node`` of a table whose every row is ``kernel_class == "step"``: the
  whole-job markers ``-1``, ``-1``, ``"*"`` (:data:`bayesprism.schema.ALL_RANKS`, ``ALL_NODES``).
* ``kernel_class`` from ``kernel`` by the same ordered rule table the Kineto reader uses
  (:func:`bayesprism.ingest.classify.classify_kernel`).

Anything else missing is an error. Rows whose duration is missing, infinite or <= 0 are
skipped and counted; if none remains, the file is refused. A Parquet file written by
:func:`bayesprism.schema.write_table` keeps its run metadata.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism.errors import Problem, TraceFormatError
from bayesprism.ingest.classify import classify_kernel
from bayesprism.ingest.files import read_bytes
from bayesprism.schema import ALL_COLUMNS, ALL_NODES, ALL_RANKS, ATTRS_KEY, REQUIRED_COLUMNS

# pyarrow is imported where a Parquet table is read (start-up time of the ingest workers).

UNIT_TO_US = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}
TIME_COLUMNS = ("duration_us", "start_us", "wait_us", "transfer_us")
SKIP_NAN = "duration_us missing (NaN)"
SKIP_NONPOSITIVE = "duration_us not finite or <= 0"
_SUFFIXES = (".csv", ".tsv", ".parquet", ".pq", ".csv.gz", ".tsv.gz")


def can_read(path: Path, head: bytes) -> bool:
    """True for Parquet files and for CSV/TSV files whose header names schema columns."""
    if head[:4] == b"PAR1":
        return True
    if not path.name.lower().endswith(_SUFFIXES):
        return False
    header = head.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    names = {c.strip().strip('"') for c in header.replace("\t", ",").split(",")}
    return "duration_us" in names or len(names & set(REQUIRED_COLUMNS)) >= 4


def read_tabular(
    path: Path,
    *,
    column_map: Mapping[str, str | None] | None = None,
    run: str | None = None,
    units: Mapping[str, str] | str | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Read a tidy CSV/TSV or Parquet trace table.

    Parameters
    ----------
    path
        ``.csv``, ``.tsv`` (optionally gzipped) or Parquet file.
    column_map
        ``{column in the file: schema column or None}``; ``None`` drops the column.
    run
        Run name for every row (overrides a ``run`` column, noted); default: the ``run`` column,
        else the file stem.
    units
        Unit of time columns in the file: ``{"duration_us": "ms", ...}`` or one unit string for
        ``duration_us``; converted to µs.

    Returns
    -------
    (pandas.DataFrame, dict)
        Rows in the schema (not yet validated) and the report (``run``, ``skipped``, ``notes``,
        ``run_meta``; plus ``runs`` with the metadata of every run when the file has several).

    Raises
    ------
    TraceFormatError
        Unreadable file, unknown columns, a mapping naming absent or non-schema columns, an
        unknown unit, missing required columns, or no row with a valid duration.
    """
    path = Path(path)
    source = str(path)
    table, stored_attrs = _read(path)
    notes: list[str] = []
    skipped: dict[str, int] = {}
    table = _apply_map(table, column_map or {}, source, notes)
    unknown = [str(c) for c in table.columns if c not in ALL_COLUMNS]
    if unknown:
        raise TraceFormatError(
            Problem(
                source,
                ", ".join(unknown),
                "unknown column(s); map them to schema columns with column_map={'name': "
                "'schema_column'} (or to None to drop them); known columns are "
                + ", ".join(ALL_COLUMNS),
            )
        )
    table = _convert_units(table, units, source, notes)
    table = _fill_defaults(table, path, run, notes)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise TraceFormatError(
            [
                Problem(source, c, "required column is missing (and has no unambiguous default)")
                for c in missing
            ]
        )

    duration = pd.to_numeric(table["duration_us"], errors="coerce")
    nan = duration.isna().to_numpy()
    bad = ~nan & ~(np.isfinite(duration.fillna(1.0)) & (duration.fillna(1.0) > 0)).to_numpy()
    if nan.any():
        skipped[SKIP_NAN] = int(nan.sum())
    if bad.any():
        skipped[SKIP_NONPOSITIVE] = int(bad.sum())
    keep = ~(nan | bad)
    if not keep.any():
        raise TraceFormatError(
            Problem(
                source,
                "duration_us",
                "no row has a valid duration (finite, > 0)",
                len(table),
                table["duration_us"].iloc[0] if len(table) else None,
            )
        )
    table = table.loc[keep].reset_index(drop=True)
    table["duration_us"] = duration[keep].to_numpy()

    runs = [str(r) for r in pd.unique(table["run"].astype(str))]
    stored_runs = (stored_attrs or {}).get("runs", {})
    metas = {
        r: _run_meta(table[table["run"].astype(str) == r], source, stored_runs.get(r), notes)
        for r in runs
    }
    report = {"run": runs[0], "skipped": skipped, "notes": notes, "run_meta": metas[runs[0]]}
    if len(runs) > 1:
        report["runs"] = metas
        notes.append(
            f"{path.name}: {len(runs)} runs in one table ({', '.join(runs[:5])}"
            + (", ..." if len(runs) > 5 else "")
            + ")"
        )
    if stored_attrs:
        notes.extend(n for n in stored_attrs.get("notes", []) if n not in notes)
    return table, report


# --------------------------------------------------------------------------- steps


def _read(path: Path) -> tuple[pd.DataFrame, dict | None]:
    try:
        raw = path.read_bytes()
        if raw[:4] == b"PAR1":
            import pyarrow.parquet as pq

            arrow = pq.read_table(io.BytesIO(raw))
            meta = arrow.schema.metadata or {}
            attrs = json.loads(meta[ATTRS_KEY]) if ATTRS_KEY in meta else None
            return arrow.to_pandas(), attrs
        if raw[:2] == b"\x1f\x8b":
            raw = read_bytes(path)
        table = pd.read_csv(io.BytesIO(raw), sep=None, engine="python")
    except (FileNotFoundError, TraceFormatError):
        raise
    except Exception as exc:  # pyarrow, zlib and the CSV parser raise many types
        raise TraceFormatError(Problem(str(path), "", f"cannot read as a table: {exc}")) from None
    if len(table.columns) == 0 or len(table) == 0:
        raise TraceFormatError(Problem(str(path), "", "the table has no rows"))
    return table, None


def _apply_map(
    table: pd.DataFrame, column_map: Mapping, source: str, notes: list[str]
) -> pd.DataFrame:
    absent = [k for k in column_map if k not in table.columns]
    targets = [v for v in column_map.values() if v is not None and v not in ALL_COLUMNS]
    problems = []
    if absent:
        problems.append(
            Problem(
                source,
                "column_map",
                "names column(s) not in the file: "
                + ", ".join(map(str, absent))
                + "; the file has "
                + ", ".join(map(str, table.columns)),
            )
        )
    if targets:
        problems.append(
            Problem(
                source,
                "column_map",
                "maps to non-schema column(s): "
                + ", ".join(map(str, targets))
                + "; known columns are "
                + ", ".join(ALL_COLUMNS),
            )
        )
    if problems:
        raise TraceFormatError(problems)
    dropped = [k for k, v in column_map.items() if v is None]
    if dropped:
        notes.append(f"columns dropped as asked (column_map to None): {', '.join(dropped)}")
    renamed = table.drop(columns=dropped).rename(
        columns={k: v for k, v in column_map.items() if v is not None}
    )
    duplicated = renamed.columns[renamed.columns.duplicated()].tolist()
    if duplicated:
        raise TraceFormatError(
            Problem(
                source,
                "column_map",
                "two columns end up with the same name: " + ", ".join(map(str, duplicated)),
            )
        )
    return renamed


def _convert_units(table: pd.DataFrame, units, source: str, notes: list[str]) -> pd.DataFrame:
    if units is None:
        return table
    if isinstance(units, str):
        units = {"duration_us": units}
    for column, unit in units.items():
        if column not in TIME_COLUMNS:
            raise TraceFormatError(
                Problem(
                    source,
                    "units",
                    "only time columns can be converted (" + ", ".join(TIME_COLUMNS) + ")",
                    example=column,
                )
            )
        if unit not in UNIT_TO_US:
            raise TraceFormatError(
                Problem(
                    source,
                    "units",
                    "unknown unit; expected one of " + ", ".join(UNIT_TO_US),
                    example=unit,
                )
            )
        if column in table.columns and UNIT_TO_US[unit] != 1.0:
            table[column] = pd.to_numeric(table[column], errors="coerce") * UNIT_TO_US[unit]
            notes.append(f"{column} converted from {unit} to µs")
    return table


def _fill_defaults(
    table: pd.DataFrame, path: Path, run: str | None, notes: list[str]
) -> pd.DataFrame:
    if run is not None:
        if "run" in table.columns:
            notes.append(f"run column replaced by run={run!r}")
        table["run"] = run
    elif "run" not in table.columns:
        stem = path.name
        for suffix in (".gz", ".csv", ".tsv", ".parquet", ".pq"):
            stem = stem[: -len(suffix)] if stem.endswith(suffix) else stem
        table["run"] = stem
        notes.append(f"{path.name}: no run column; run = {stem!r} (the file name)")
    if "kernel_class" not in table.columns and "kernel" in table.columns:
        table["kernel_class"] = [classify_kernel(str(k)) for k in table["kernel"]]
        notes.append(f"{path.name}: no kernel_class column; classified from kernel names")
    if "kernel_class" in table.columns and (table["kernel_class"].astype(str) == "step").all():
        for column, value in (("rank", ALL_RANKS), ("gpu", ALL_RANKS), ("node", ALL_NODES)):
            if column not in table.columns:
                table[column] = value
                notes.append(
                    f"{path.name}: step-level table without {column}; {column} = "
                    f"{value!r} (whole job)"
                )
    return table


def _run_meta(rows: pd.DataFrame, source: str, stored: dict | None, notes: list[str]) -> dict:
    if stored:
        return {**stored, "source_files": [source]}
    ranks = pd.to_numeric(rows["rank"], errors="coerce")
    world = int(ranks[ranks >= 0].nunique()) or None
    placed = rows[ranks.to_numpy() >= 0]
    gpus_per_node = (
        int(placed.groupby(placed["node"].astype(str))["gpu"].nunique().max())
        if len(placed)
        else None
    )
    notes.append(
        f"{Path(source).name}: no parallel plan in a tidy table; assumed data parallel "
        "over the ranks present (dp = world size)"
    )
    return {
        "platform": None,
        "world_size": world,
        "gpus_per_node": gpus_per_node,
        "plan": {"dp": world or 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "microbatches": 1},
        "source_files": [source],
    }
