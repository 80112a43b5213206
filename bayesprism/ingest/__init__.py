"""Ingestion: trace files of any supported format → the validated trace table.

``read_traces`` (in memory) and ``ingest_to_parquet`` (streaming, bounded memory) recognise each
file's format from its content (:mod:`bayesprism.ingest.dispatch`); ``read_inputs`` reads
Parquet trace tables back beside raw traces. All three take ``layout=``, facts the traces do not
record (:mod:`bayesprism.ingest.layout`).
"""

from __future__ import annotations

from bayesprism.ingest.parquet import ingest_to_parquet, read_inputs
from bayesprism.ingest.read import read_traces

__all__ = ["ingest_to_parquet", "read_inputs", "read_traces"]
