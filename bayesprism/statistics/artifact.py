"""What a fit reads of trace tables, as one value: :class:`TraceStatistics`.

:func:`statistics_of` reduces trace tables to the model's sufficient statistics
(:func:`bayesprism.model.statistics.table_statistics`), the inventory of the traced run and
the tables' digest, exactly as :func:`bayesprism.fit` computes them from the tables: a fit
from the statistics is the fit from the tables, draw for draw.

:func:`statistics_of_part` finishes the same statistics from the streamed reduction of trace
files (:mod:`bayesprism.statistics.stream`), where no table is ever assembled: equal to those
of the table up to the order of floating-point sums, and digested by their content
(:func:`statistics_digest`) since there is no table to digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import xarray as xr

from bayesprism.errors import InputError, Problem
from bayesprism.inventory import inventory_of_parts, is_step_table, kernel_inventory
from bayesprism.model.statistics import ModelStatistics, merge_statistics, table_statistics
from bayesprism.schema import select_runs, signature_as_kernel
from bayesprism.statistics.codec import dataset_to_json
from bayesprism.statistics.stream import StatisticsPart, step_logs_error

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


def is_benchmark_run(meta: dict | None) -> bool:
    """Whether a run's metadata marks a micro-benchmark (flag or format), not the traced job.

    Examples
    --------
    >>> is_benchmark_run({"format": "nccl-tests"}), is_benchmark_run(None)
    (True, False)
    """
    meta = meta or {}
    return bool(meta.get("benchmark")) or meta.get("format") in BENCHMARK_FORMATS


def _traced_tables(tables: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """The tables (or runs) of the traced job, without micro-benchmark runs.

    All of them when every run is a benchmark.
    """
    out = []
    for table in tables:
        runs = table.attrs.get("runs") or {}
        bench = {r for r, meta in runs.items() if is_benchmark_run(meta)}
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
    merged = merged_attrs(tables)
    combined.attrs = {**tables[0].attrs, "runs": merged["runs"], "notes": merged["notes"]}
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
    refuse_step_tables(tables)
    model = table_statistics(tables)
    return TraceStatistics(model=model, inventory=traced_inventory(tables),
                           input_digest=input_digest(tables), attrs=merged_attrs(tables),
                           provenance=dict(provenance or {}))


def refuse_step_tables(tables: Sequence[pd.DataFrame]) -> None:
    """Refuse step-level logs: they have no kernel cells to summarise.

    Raises
    ------
    InputError
        Naming the first step-level table.

    Examples
    --------
    >>> refuse_step_tables([pd.DataFrame({"kernel_class": ["gemm"]})])
    """
    step_tables = [i for i, t in enumerate(tables) if "kernel_class" in t and is_step_table(t)]
    if step_tables:
        raise step_logs_error(
            str(tables[step_tables[0]].attrs.get("source", f"table {step_tables[0]}")))


def statistics_of_part(part: StatisticsPart, attrs: dict, *,
                       kernels: dict[str, str] | None = None,
                       provenance: dict | None = None) -> TraceStatistics:
    """The statistics of streamed trace files (:mod:`bayesprism.statistics.stream`).

    Parameters
    ----------
    part
        The merged statistics of every file and table read.
    attrs
        Their run metadata, skips and notes (``runs``, ``skipped``, ``notes``).
    kernels
        Place key → kernel signature (:func:`bayesprism.ingest.signatures.signature_map`).
    provenance
        As in :func:`statistics_of`.

    Returns
    -------
    TraceStatistics
        With ``input_digest`` the :func:`statistics_digest` of the statistics.

    Raises
    ------
    InputError
        No kernel-level rows.

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"] * 2, "step": [0, 1], "node": ["n0"] * 2,
    ...                       "gpu": [0, 0], "kernel": ["k"] * 2, "rank": [0, 0],
    ...                       "kernel_class": ["gemm"] * 2, "duration_us": [1.0, 2.0]})
    >>> stats = statistics_of_part(StatisticsPart.of(table), {})
    >>> stats.summary()["launches"]
    2
    """
    if not part.cells:
        raise InputError(Problem("statistics", "", "no kernel-level rows to summarise"))
    model = merge_statistics(part.cells, kernels=kernels)
    runs = {str(r) for r in model.kernel_cells["run"].unique()}
    metas = attrs.get("runs") or {}
    bench = {r for r, meta in metas.items() if (meta or {}).get("benchmark")}
    model = ModelStatistics(model.kernel_cells, model.collective_cells, model.node_cabinets,
                            tuple(sorted(set(model.benchmark_runs) | bench)))
    inventory = inventory_of_parts(part.inventory, attrs, mapping=kernels,
                                   runs=traced_runs(attrs, runs))
    merged = {"runs": dict(metas), "skipped": dict(attrs.get("skipped") or {}),
              "notes": [str(n) for n in attrs.get("notes") or []]}
    return TraceStatistics(model=model, inventory=inventory,
                           input_digest=statistics_digest(model, inventory, merged),
                           attrs=merged, provenance=dict(provenance or {}))


def traced_runs(attrs: dict, runs: set[str]) -> set[str]:
    """The runs of the traced job: ``runs`` without micro-benchmarks (all of them when every
    run is one), as :func:`traced_inventory` selects them.

    Examples
    --------
    >>> sorted(traced_runs({"runs": {"b": {"format": "nccl-tests"}}}, {"a", "b"}))
    ['a']
    """
    metas = attrs.get("runs") or {}
    return {r for r in runs if not is_benchmark_run(metas.get(r))} or runs


def statistics_digest(model: ModelStatistics, inventory: xr.Dataset, attrs: dict) -> str:
    """SHA-256 (16 hex digits) of statistics: their cells, inventory and run metadata.

    The digest of streamed statistics, whose table is never assembled: the same files read
    by either engine give the same digest.

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"], "step": [0], "node": ["n0"], "gpu": [0],
    ...                       "kernel": ["k"], "kernel_class": ["gemm"],
    ...                       "duration_us": [1.0], "rank": [0]})
    >>> stats = statistics_of(table)
    >>> len(statistics_digest(stats.model, stats.inventory, stats.attrs))
    16
    """
    digest = hashlib.sha256()
    for cells in (model.kernel_cells, model.collective_cells):
        digest.update(json.dumps([[str(c), str(t)] for c, t in cells.dtypes.items()]).encode())
        digest.update(pd.util.hash_pandas_object(cells, index=False).to_numpy().tobytes())
    digest.update(json.dumps([model.node_cabinets, model.benchmark_runs, attrs,
                              dataset_to_json(inventory)], sort_keys=True,
                             default=str).encode())
    return digest.hexdigest()[:16]


def merged_attrs(tables: list[pd.DataFrame]) -> dict:
    """The run metadata, skips and notes of several tables as one ``attrs``.

    Examples
    --------
    >>> merged_attrs([])
    {'runs': {}, 'skipped': {}, 'notes': []}
    """
    runs: dict = {}
    skipped: dict = {}
    notes: list = []
    for t in tables:
        runs.update(t.attrs.get("runs") or {})
        for reason, count in (t.attrs.get("skipped") or {}).items():
            skipped[str(reason)] = skipped.get(str(reason), 0) + int(count)
        notes.extend(str(n) for n in t.attrs.get("notes") or [])
    return {"runs": runs, "skipped": skipped, "notes": notes}


__all__ = ["BENCHMARK_FORMATS", "TraceStatistics", "input_digest", "is_benchmark_run",
           "merged_attrs",
           "refuse_step_tables", "statistics_digest", "statistics_of", "statistics_of_part",
           "traced_inventory", "traced_runs"]
