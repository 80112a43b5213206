"""Where a trace table came from: its input files with their SHA-256, and what was skipped.

A statistics artifact (:mod:`bayesprism.statistics`) replaces the traces it summarises, so it
records them: every file read (path, size, SHA-256 of its bytes as stored, compressed or
not), the Parquet tables given, and the files and launches skipped with their reasons. The
digests are computed where the files were read: on the Dask cluster when one is given
(workers see the files at the same paths), else in this process.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

#: Bytes read at a time while hashing a file.
CHUNK_BYTES = 8 * 1024 * 1024
#: Prefix of the notes naming a file skipped with its reason (``dispatch.IngestCollector``).
SKIPPED_NOTE = "skipped "


def file_digest(path: str | os.PathLike) -> dict:
    """Size and SHA-256 of one file, or ``missing`` with the reason it cannot be read.

    Parameters
    ----------
    path
        The file.

    Returns
    -------
    dict
        ``{"path", "bytes", "sha256"}``, or ``{"path", "missing"}``.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile(delete=False) as fh:
    ...     _ = fh.write(b"abc")
    >>> file_digest(fh.name)["sha256"][:16]
    'ba7816bf8f01cfea'
    """
    digest = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        return {"path": str(path), "missing": exc.strerror or str(exc)}
    return {"path": str(path), "bytes": size, "sha256": digest.hexdigest()}


def file_digests(paths: Sequence[str], client=None) -> list[dict]:
    """:func:`file_digest` of each path, in order: on the Dask ``client``'s workers when one
    is given, else here.

    Examples
    --------
    >>> file_digests([])
    []
    """
    if client is None or not paths:
        return [file_digest(p) for p in paths]
    return client.gather(client.map(file_digest, list(paths), pure=False))


def source_files(tables: Iterable[pd.DataFrame]) -> list[str]:
    """The files the tables were read from (``attrs["runs"][run]["source_files"]``), each
    once, in the order recorded.

    Examples
    --------
    >>> table = pd.DataFrame()
    >>> table.attrs = {"runs": {"r": {"source_files": ["a.json", "b.json", "a.json"]}}}
    >>> source_files([table])
    ['a.json', 'b.json']
    """
    found: dict[str, None] = {}
    for table in tables:
        for meta in (table.attrs.get("runs") or {}).values():
            for path in (meta or {}).get("source_files") or []:
                found.setdefault(str(path), None)
    return list(found)


def input_provenance(tables: Sequence[pd.DataFrame], inputs: Sequence[str | os.PathLike], *,
                     engine: str = "embedded", client=None, digests: bool = True) -> dict:
    """The provenance of trace tables: inputs given, files read with their digests, skips.

    Parameters
    ----------
    tables
        The tables read from ``inputs``.
    inputs
        The paths given (trace files, folders, globs, Parquet trace tables).
    engine
        The ingest engine that read them (recorded).
    client
        A ``distributed.Client``: the digests are computed on its workers.
    digests
        Compute the files' SHA-256 (False: paths only).

    Returns
    -------
    dict
        ``inputs``; ``engine``; ``files``: ``{"path", "bytes", "sha256"}`` (or ``missing``)
        of every file read and of every Parquet table given; ``skipped``: ``{reason: count}``
        (files and launches); ``skipped_files``: one line per file skipped, with its reason.

    Examples
    --------
    >>> table = pd.DataFrame()
    >>> table.attrs = {"runs": {}, "skipped": {"bad file": 1},
    ...                "notes": ["skipped x.json: not a trace"]}
    >>> input_provenance([table], ["traces/"], digests=False)["skipped_files"]
    ['x.json: not a trace']
    """
    given = [str(p) for p in inputs]
    tables_given = [p for p in given if Path(p).is_file() and Path(p).suffix.lower()
                    in (".parquet", ".pq")]
    paths = list(dict.fromkeys([*tables_given, *source_files(tables)]))
    files = file_digests(paths, client) if digests else [{"path": p} for p in paths]
    skipped: dict[str, int] = {}
    skipped_files: list[str] = []
    for table in tables:
        for reason, count in (table.attrs.get("skipped") or {}).items():
            skipped[str(reason)] = skipped.get(str(reason), 0) + int(count)
        skipped_files.extend(note[len(SKIPPED_NOTE):] for note in table.attrs.get("notes") or []
                             if str(note).startswith(SKIPPED_NOTE))
    return {"inputs": given, "engine": engine, "files": files, "skipped": skipped,
            "skipped_files": skipped_files}


__all__ = ["file_digest", "file_digests", "input_provenance", "source_files"]
