"""What a fit reads of trace tables, as one value: :class:`TraceStatistics`.

:func:`statistics_of` reduces trace tables to the model's sufficient statistics
(:func:`bayesprism.model.statistics.table_statistics`), the inventory of the traced run and
the tables' digest, exactly as :func:`bayesprism.fit` computes them from the tables: a fit
from the statistics is the fit from the tables, draw for draw.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import xarray as xr

from bayesprism.errors import InputError, Problem
from bayesprism.inventory import is_step_table, kernel_inventory
from bayesprism.model.statistics import ModelStatistics, table_statistics
from bayesprism.schema import select_runs, signature_as_kernel

#: Run formats of micro-benchmarks: fitted with the traces (they inform collective costs and
#: the node population) but not part of the traced job whose inventory the forecast replays.
BENCHMARK_FORMATS = ("nccl-tests", "benchmark")


@dataclass(frozen=True)
class TraceStatistics:
    """The input of a kernel-level fit without the launches (:mod:`bayesprism.statistics`).

    Attributes
    ----------
    model
        The model's sufficient statistics (kernel and collective cells, cabinets, benchmark
        runs).
    inventory
        The traced run's inventory (``inventory`` group of the posterior).
    input_digest
        :func:`input_digest` of the tables summarised (the posterior's ``input_digest``).
    attrs
        The tables' run metadata, skipped counts and notes (``runs``, ``skipped``, ``notes``).
    provenance
        Inputs, files read with their SHA-256, skips with reasons
        (:func:`bayesprism.ingest.provenance.input_provenance`); empty when not recorded.
    source
        The file the statistics were read from (``""`` when built in memory).
    """

    model: ModelStatistics
    inventory: xr.Dataset
    input_digest: str
    attrs: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    source: str = ""

    def summary(self) -> dict:
        """Counts for messages: launches, kernel and collective cells, runs, files, skips.

        Examples
        --------
        >>> table = pd.DataFrame({"run": ["r"] * 2, "step": [0, 1], "node": ["n0"] * 2,
        ...                       "gpu": [0, 0], "kernel": ["k"] * 2,
        ...                       "kernel_class": ["gemm"] * 2, "duration_us": [1.0, 2.0],
        ...                       "rank": [0, 0]})
        >>> statistics_of(table).summary()["kernel_cells"]
        2
        """
        kc, cc = self.model.kernel_cells, self.model.collective_cells
        return {
            "launches": int(kc["n"].sum()), "kernel_cells": len(kc),
            "collective_cells": len(cc), "collective_launches": int(cc["n"].sum()),
            "runs": sorted(set(kc["run"].astype(str))),
            "files": len(self.provenance.get("files", [])),
            "files_digested": sum(1 for f in self.provenance.get("files", []) if "sha256" in f),
            "skipped": dict(self.provenance.get("skipped", self.attrs.get("skipped", {}))),
            "input_digest": self.input_digest,
        }


def input_digest(tables: Sequence[pd.DataFrame]) -> str:
    """SHA-256 (16 hex digits) of the tables' content: columns, dtypes, values and attrs.

    Independent of the process (pandas' row hashing uses a fixed key), so the same input gives
    the same digest in every run.

    Examples
    --------
    >>> table = pd.DataFrame({"x": [1.0]})
    >>> input_digest([table]) == input_digest([table.copy()])
    True
    """
    digest = hashlib.sha256()
    for table in tables:
        digest.update(json.dumps([[str(c), str(t)] for c, t in table.dtypes.items()]).encode())
        digest.update(pd.util.hash_pandas_object(table, index=False).to_numpy().tobytes())
        digest.update(json.dumps(table.attrs, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def _traced_tables(tables: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """The tables (or runs) of the traced job, without micro-benchmark runs.

    All of them when every run is a benchmark.
    """
    out = []
    for table in tables:
        runs = table.attrs.get("runs") or {}
        bench = {r for r, meta in runs.items() if (meta or {}).get("benchmark")
                 or (meta or {}).get("format") in BENCHMARK_FORMATS}
        if not bench:
            out.append(table)
        elif len(bench) < len(runs):
            out.append(select_runs(table, [r for r in runs if r not in bench]))
    return out or tables


def _combined_table(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """One table with the union of the tables' run metadata (for the inventory)."""
    if len(tables) == 1:
        return tables[0]
    combined = pd.concat(tables, ignore_index=True)
    runs: dict = {}
    notes: list = []
    for t in tables:
        runs.update(t.attrs.get("runs") or {})
        notes.extend(t.attrs.get("notes") or [])
    combined.attrs = {**tables[0].attrs, "runs": runs, "notes": notes}
    return combined


def traced_inventory(tables: list[pd.DataFrame]) -> xr.Dataset:
    """The inventory a fit of ``tables`` records (the traced job's, benchmarks left out).

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"] * 2, "step": [0, 1], "node": ["n0"] * 2,
    ...                       "gpu": [0, 0], "kernel": ["k"] * 2, "rank": [0, 0],
    ...                       "kernel_class": ["gemm"] * 2, "duration_us": [1.0, 2.0]})
    >>> traced_inventory([table])["launches_per_step"].values.tolist()
    [1.0]
    """
    return kernel_inventory(_combined_table(_traced_tables(tables)))


def statistics_of(tables: Sequence[pd.DataFrame] | pd.DataFrame, *,
                  provenance: dict | None = None) -> TraceStatistics:
    """The statistics a kernel-level fit reads of trace tables.

    Parameters
    ----------
    tables
        One trace table or several (as given to :func:`bayesprism.fit`).
    provenance
        Where they came from (:func:`bayesprism.ingest.provenance.input_provenance`).

    Returns
    -------
    TraceStatistics

    Raises
    ------
    InputError
        Tables the kernel model cannot read, or step-level logs (fitted from the logs: they
        are small, and the step model reads every step).

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"] * 3, "step": [0, 0, 1], "node": ["n0"] * 3,
    ...                       "gpu": [0, 0, 0], "kernel": ["k"] * 3,
    ...                       "kernel_class": ["gemm"] * 3, "duration_us": [1.0, 2.0, 3.0],
    ...                       "rank": [0, 0, 0]})
    >>> stats = statistics_of(table)
    >>> stats.summary()["launches"], len(stats.input_digest)
    (3, 16)
    """
    if isinstance(tables, pd.DataFrame):
        tables = [tables]
    if not isinstance(tables, (list, tuple)) or not all(
            isinstance(t, pd.DataFrame) for t in tables):
        raise InputError(Problem("statistics", "tables",
                                 "expected a DataFrame or a list of DataFrames",
                                 example=type(tables).__name__))
    tables = [signature_as_kernel(t) for t in tables]
    step_tables = [i for i, t in enumerate(tables) if "kernel_class" in t and is_step_table(t)]
    if step_tables:
        raise InputError(Problem(
            str(tables[step_tables[0]].attrs.get("source", f"table {step_tables[0]}")),
            "kernel_class", "step-level logs have no kernel cells to summarise: fit the logs "
            "themselves (--spec step)", example="step"))
    model = table_statistics(tables)
    return TraceStatistics(model=model, inventory=traced_inventory(tables),
                           input_digest=input_digest(tables), attrs=_merged_attrs(tables),
                           provenance=dict(provenance or {}))


def _merged_attrs(tables: list[pd.DataFrame]) -> dict:
    runs: dict = {}
    skipped: dict = {}
    notes: list = []
    for t in tables:
        runs.update(t.attrs.get("runs") or {})
        for reason, count in (t.attrs.get("skipped") or {}).items():
            skipped[str(reason)] = skipped.get(str(reason), 0) + int(count)
        notes.extend(str(n) for n in t.attrs.get("notes") or [])
    return {"runs": runs, "skipped": skipped, "notes": notes}


__all__ = ["BENCHMARK_FORMATS", "TraceStatistics", "input_digest", "statistics_of",
           "traced_inventory"]
