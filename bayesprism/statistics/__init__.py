"""Statistics artifacts: what a kernel-level fit needs of traces, without the traces.

A job traced on every rank leaves far more trace data than the model reads: it fits cells of
kernel × GPU × step (launches, mean and spread of log duration), collective cells and the
traced run's inventory. A statistics artifact holds exactly those, with their provenance
(files read and their SHA-256, skips with reasons), in one Parquet file; ``bayesprism fit``
reads it in place of the traces and gives the same posterior, draw for draw.

* :func:`statistics_of` (tables → :class:`TraceStatistics`),
  :func:`ingest_statistics` (trace files → artifact; ``bayesprism ingest --statistics``);
* :func:`write_statistics`, :func:`read_statistics` (validated), :func:`is_statistics_file`.
"""

from bayesprism.statistics.artifact import TraceStatistics, input_digest, statistics_of
from bayesprism.statistics.ingest import ingest_statistics
from bayesprism.statistics.parquet import (
    KIND,
    STATISTICS_SCHEMA_VERSION,
    is_statistics_file,
    read_statistics,
    write_statistics,
)

__all__ = ["KIND", "STATISTICS_SCHEMA_VERSION", "TraceStatistics", "ingest_statistics",
           "input_digest", "is_statistics_file", "read_statistics", "statistics_of",
           "write_statistics"]
