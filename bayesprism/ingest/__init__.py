"""Ingestion: trace files of any supported format → the validated trace table.

``read_traces`` (in memory) and ``ingest_to_parquet`` (streaming, bounded memory) recognise each
file's format from its content (:mod:`bayesprism.ingest.dispatch`).
"""

from __future__ import annotations

from bayesprism.ingest.dispatch import read_traces
from bayesprism.ingest.parquet import ingest_to_parquet

__all__ = ["ingest_to_parquet", "read_traces"]
