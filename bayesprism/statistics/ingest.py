"""Trace files → a statistics artifact: :func:`ingest_statistics`
(``bayesprism ingest PATH... --statistics -o stats.parquet``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from bayesprism.ingest.distributed import dask_client
from bayesprism.ingest.parquet import read_inputs
from bayesprism.ingest.provenance import input_provenance
from bayesprism.outputs import check_output_path
from bayesprism.statistics.artifact import statistics_of
from bayesprism.statistics.parquet import write_statistics


def ingest_statistics(paths: Sequence[str | os.PathLike] | str | os.PathLike,
                      out: str | os.PathLike, *, gpus_per_node: int | None = None,
                      column_map: dict | None = None, layout: Mapping | None = None,
                      progress: bool = True, engine: str = "embedded", client=None,
                      scheduler: str | None = None, strict: bool | None = None,
                      digests: bool = True) -> dict:
    """Read traces (or Parquet trace tables) and write their statistics artifact.

    The files are read as :func:`bayesprism.fit` reads them from the command line (raw traces
    with :func:`bayesprism.ingest.read_traces`, on Dask with ``engine="dask"``; Parquet trace
    tables whole), reduced to what a kernel-level fit needs
    (:func:`bayesprism.statistics.statistics_of`), and written with their provenance: every
    file read with its size and SHA-256 (computed on the Dask workers when on Dask), and what
    was skipped, with the reasons.

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
    options = {"layout": layout, "column_map": column_map, "progress": progress,
               "gpus_per_node": gpus_per_node, "strict": strict}
    if engine == "dask":
        with dask_client(client, scheduler) as dask:
            tables = read_inputs(paths, engine="dask", client=dask, **options)
            provenance = input_provenance(tables, paths, engine=engine, client=dask,
                                          digests=digests)
    else:
        tables = read_inputs(paths, engine=engine, client=client, **options)
        provenance = input_provenance(tables, paths, engine=engine, digests=digests)
    stats = statistics_of(tables, provenance=provenance)
    path = write_statistics(stats, out)
    return {"path": str(path), "bytes": Path(path).stat().st_size, **stats.summary()}


__all__ = ["ingest_statistics"]
