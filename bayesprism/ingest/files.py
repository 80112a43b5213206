"""Reading input files whole, gzip or not, with errors that name the file."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from bayesprism.errors import Problem, TraceFormatError


def read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when it is gzip (by content, not by name).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    TraceFormatError
        If the gzip data is truncated or corrupt.
    """
    source = str(path)
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except EOFError:
            raise TraceFormatError(Problem(
                source, "", "truncated gzip: the compressed data ends before the end-of-stream "
                "marker (incomplete copy?)")) from None
        except (OSError, zlib.error) as exc:
            raise TraceFormatError(Problem(source, "", f"corrupt gzip data: {exc}")) from None
    return raw


def read_text(path: Path) -> str:
    """The file as UTF-8 text (gzip decompressed; undecodable bytes replaced)."""
    return read_bytes(path).decode("utf-8", errors="replace")
