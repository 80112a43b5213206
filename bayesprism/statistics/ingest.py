"""Trace files → a statistics artifact: :func:`ingest_statistics`
(``bayesprism ingest PATH... --statistics -o stats.parquet``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from bayesprism.ingest.distributed import dask_client
from bayesprism.ingest.layout import check_layout
from bayesprism.ingest.parquet import TABLE_SUFFIXES, read_inputs
from bayesprism.ingest.provenance import input_provenance
from bayesprism.outputs import check_output_path
from bayesprism.statistics.artifact import merged_attrs, refuse_step_tables, statistics_of_part
from bayesprism.statistics.parquet import write_statistics
from bayesprism.statistics.stream import StatisticsPart, stream_statistics


def ingest_statistics(paths: Sequence[str | os.PathLike] | str | os.PathLike,
                      out: str | os.PathLike, *, gpus_per_node: int | None = None,
                      column_map: dict | None = None, layout: Mapping | None = None,
                      progress: bool = True, engine: str = "embedded", client=None,
                      scheduler: str | None = None, strict: bool | None = None,
                      digests: bool = True) -> dict:
    """Read traces (or Parquet trace tables) and write their statistics artifact.

    Raw traces are streamed (:mod:`bayesprism.statistics.stream`): each file is reduced to
    kernel cells and an inventory part where it is read (a worker process, or a Dask worker
    with ``engine="dask"``), only the collective rows are kept (for the wait/transfer split),
    and the kernel signatures rename the cells at the end; so memory grows with the cells
    and the collective rows, never with the compute launches. Parquet trace tables are read
    whole and reduced as one batch each. The statistics equal those of
    :func:`bayesprism.statistics.statistics_of` of the table :func:`bayesprism.fit` would read
    (counts exactly, means and spreads up to the order of floating-point sums), and are
    written with their provenance: every file read with its size and SHA-256 (computed on the
    Dask workers when on Dask), and what was skipped, with the reasons. Their
    ``input_digest`` is that of the statistics (:func:`~bayesprism.statistics.artifact.
    statistics_digest`): there is no table to digest.

    Parameters
    ----------
    paths
        Trace files, folders, globs and Parquet trace tables.
    out
        The statistics artifact to write (Parquet).
    gpus_per_node, column_map, layout, progress, engine, client, strict
        As in :func:`bayesprism.ingest.read_traces`.
    scheduler
        With ``engine="dask"`` and no client: the Dask scheduler to connect to (default: a
        local cluster, one worker per core).
    digests
        Record each file's SHA-256 (False: paths only).

    Returns
    -------
    dict
        :meth:`~bayesprism.statistics.TraceStatistics.summary` plus ``path`` and ``bytes``
        (the artifact's size).

    Raises
    ------
    InputError
        Every problem of the inputs at once; an output folder that does not exist.

    Examples
    --------
    >>> from bayesprism.statistics import ingest_statistics
    >>> ingest_statistics(["traces/"], "stats.parquet", progress=False)  # doctest: +SKIP
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = check_output_path(out, "output")
    layout = check_layout(layout)
    whole = [] if column_map else [p for p in paths if Path(p).suffix.lower() in TABLE_SUFFIXES]
    raw = [p for p in paths if p not in whole]
    options = {"layout": layout, "column_map": column_map, "progress": progress,
               "gpus_per_node": gpus_per_node, "strict": strict}
    with contextlib.ExitStack() as scope:
        dask = (scope.enter_context(dask_client(client, scheduler)) if engine == "dask"
                else client)
        tables = read_inputs(whole, layout=layout) if whole else []
        refuse_step_tables(tables)
        part, signatures = StatisticsPart(), {}
        for table in tables:
            part.merge(StatisticsPart.of(table))
        if raw:
            # the files' cells wait for the signatures beside the output, as its temporary
            streamed, signatures, streamed_attrs = stream_statistics(
                raw, engine=engine, client=dask, spill_dir=out.parent, **options)
            part.merge(streamed)
            tables.append(_attrs_only(streamed_attrs))
        attrs = merged_attrs(tables)
        provenance = input_provenance(tables, paths, engine=engine,
                                      client=dask if engine == "dask" else None,
                                      digests=digests)
    stats = statistics_of_part(part, attrs, kernels=signatures, provenance=provenance)
    path = write_statistics(stats, out)
    return {"path": str(path), "bytes": Path(path).stat().st_size, **stats.summary()}


def _attrs_only(attrs: dict) -> pd.DataFrame:
    """An empty table carrying run metadata (what provenance and attrs are read from)."""
    table = pd.DataFrame()
    table.attrs = attrs
    return table


__all__ = ["ingest_statistics"]
