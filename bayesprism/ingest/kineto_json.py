"""Decoding of PyTorch profiler (Kineto) trace JSON: what :mod:`bayesprism.ingest.kineto` reads.

``msgspec`` decodes against a schema of only the fields read, so the rest of each event (most of
a trace) is skipped without building Python objects. A file in the profiler's own layout is
read and decoded in slices of about 1 MB cut between two events (:class:`StreamedTrace`), so
memory does not grow with the file; any other file is decoded in one piece
(:func:`load_trace`), JSON with ``NaN`` literals (written by Python's ``json``, not valid
JSON) through the standard library.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from isal import igzip, isal_zlib

from bayesprism.errors import Problem, TraceFormatError
from bayesprism.ingest.files import DecompressionLimits, read_bytes

GPU_ACTIVITY_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
STEP_PREFIX = "ProfilerStep#"


class _Args(msgspec.Struct, gc=False):
    """The ``args`` fields read from GPU activities and launches (others are skipped)."""

    correlation: Any = None
    device: Any = None
    stream: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    process_group: Any = msgspec.field(default=None, name="Process Group Name")
    process_group_desc: Any = msgspec.field(default=None, name="Process Group Description")
    process_group_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    # any JSON value, arrays as tuples: launch configurations are hashed per launch
    grid: tuple | dict | str | int | float | bool | None = None
    block: tuple | dict | str | int | float | bool | None = None


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


class _Metadata(msgspec.Struct, gc=False):
    """Top-level keys of a trace read besides the events."""

    distributedInfo: Any = None
    deviceProperties: Any = None
    host_name: Any = None
    hostname: Any = None
    mast_job_name: Any = None
    tw_job: Any = None


class _TraceHeader(_Metadata, gc=False):
    # Raw: the event array is only located (zero copy), and decoded later in slices.
    traceEvents: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _TraceFull(_Metadata, gc=False):
    traceEvents: list[_Event] | None = None


_HEADER_DECODER = msgspec.json.Decoder(_TraceHeader)
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
#: The event array: opened by ARRAY_START, events separated by a boundary, closed by an end.
#: The profiler writes EVENT_BOUNDARY ("  }," and "  {" on lines of their own) and ARRAY_END;
#: other writers (one event per line, other indents) use the first separator the array shows
#: (BOUNDARY_PATTERN), kept for the whole file. A raw newline never occurs inside a JSON string,
#: so a boundary with one can only be structure; any other false cut (a "},{" inside a
#: string) fails to decode and the file is read whole.
ARRAY_START = b'"traceEvents": ['
EVENT_BOUNDARY = b"\n  },\n  {"
ARRAY_END = b"\n  }\n  ]"
BOUNDARY_PATTERN = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
END_PATTERN = re.compile(rb"\}[ \t\r\n]*\]")
SLICE_BYTES = 1 << 20


class SliceLayoutError(Exception):
    """The file is not in the profiler's layout (or is damaged): decode it whole instead."""


def _too_deep(source: str) -> TraceFormatError:
    # msgspec and the standard library stop at their recursion limit (about a thousand levels
    # here); a profiler trace nests fewer than ten
    return TraceFormatError(Problem(source, "", "JSON nested too deeply (arrays or objects "
                                    "inside each other beyond the parser's depth limit): not a "
                                    "PyTorch profiler trace"))

def _load_with_stdlib(raw: bytes, source: str) -> tuple[_Metadata, list[_Event]]:
    """Fallback decoder: accepts NaN/Infinity literals, names line and column of errors."""
    try:
        full = msgspec.convert(json.loads(raw), _TraceFull)
    except RecursionError:
        raise _too_deep(source) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceFormatError(Problem(source, "", f"invalid JSON: {exc}")) from None
    except msgspec.ValidationError as exc:
        raise TraceFormatError(Problem(source, "", f"not a PyTorch profiler trace: {exc}")
                               ) from None
    if full.traceEvents is None:
        raise TraceFormatError(Problem(source, "traceEvents",
                                       "missing: not a PyTorch profiler trace"))
    events = full.traceEvents
    full.traceEvents = None
    return full, events


def load_trace(path: Path, limits: DecompressionLimits | None = None
               ) -> tuple[_Metadata, list[_Event]]:
    """Parse a whole trace file at once: its metadata and its events.

    Raises TraceFormatError naming the file and what is wrong (truncated gzip, invalid JSON,
    not a profiler trace, decompressing beyond ``limits``).
    """
    source = str(path)
    raw = read_bytes(path, limits)
    try:
        header = _HEADER_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(Problem(source, "", f"not a PyTorch profiler trace: {exc}")
                               ) from None
    except msgspec.DecodeError:
        header = None
    except RecursionError:
        raise _too_deep(source) from None
    if header is None:
        return _load_with_stdlib(raw, source)
    array = header.traceEvents
    if len(array) == 0:
        raise TraceFormatError(Problem(source, "traceEvents",
                                       "missing: not a PyTorch profiler trace"))
    header.traceEvents = msgspec.Raw()
    try:
        events = _EVENTS_DECODER.decode(array)
    except RecursionError:
        raise _too_deep(source) from None
    except msgspec.ValidationError as exc:
        raise TraceFormatError(Problem(source, "traceEvents",
                                       f"not a PyTorch profiler trace: {exc}")) from None
    return header, events


class StreamedTrace:
    """Decode a trace file slice by slice while reading it, in the profiler's own layout.

    The profiler writes ``"traceEvents": [`` and then one event per block, blocks separated by
    ``EVENT_BOUNDARY`` and the array closed by ``ARRAY_END``. The file (gzip or not) is read in
    blocks of about 1 MB; each run of whole events is decoded as one list, so memory holds one
    slice of raw JSON and its events, whatever the file size. The keys around the array are
    decoded at the end (``metadata``). Anything unexpected raises :class:`SliceLayoutError`,
    and the caller falls back to :func:`load_trace` (which also names real errors).
    """

    def __init__(self, path: Path, limits: DecompressionLimits | None = None) -> None:
        self.path = path
        self.metadata: _Metadata | None = None
        self.limits = DecompressionLimits.from_env() if limits is None else limits

    def slices(self) -> Iterator[list[_Event]]:
        """Lists of events in file order; ``metadata`` is set once this is exhausted."""
        try:
            yield from self._slices()
        except (OSError, EOFError, zlib.error, isal_zlib.error, msgspec.DecodeError,
                msgspec.ValidationError, RecursionError):
            raise SliceLayoutError from None

    def _slices(self) -> Iterator[list[_Event]]:
        with self.path.open("rb") as raw_fh:
            gz = raw_fh.read(2) == b"\x1f\x8b"
            raw_fh.seek(0)
            fh = igzip.IGzipFile(fileobj=raw_fh) if gz else raw_fh
            buf = bytearray(fh.read(SLICE_BYTES))
            read = len(buf)  # decompressed bytes so far, checked against the limits per block
            key = buf.find(ARRAY_START)
            if key < 0:
                raise SliceLayoutError
            prefix = bytes(buf[:key + len(ARRAY_START) - 1])  # up to '"traceEvents": '
            # pos: the byte before the next event ("[" or ","). Each slice is decoded in place
            # as a JSON list by writing "[" there and "]" over the byte after its last event.
            pos = key + len(ARRAY_START) - 1
            boundary = EVENT_BOUNDARY
            if buf.find(boundary, pos) < 0 and (found := BOUNDARY_PATTERN.search(buf, pos)):
                boundary = bytes(found.group(0))
            comma = boundary.index(b",")  # from a boundary's start to its comma
            while True:
                cut = buf.rfind(boundary, pos)
                # The array ends after its last event, so only the tail needs searching.
                last = END_PATTERN.search(buf, max(pos, cut))
                if last is not None:
                    close = last.start() + 1  # the byte after the last event's "}"
                    if buf[pos + 1:close].strip():
                        yield self._decode(buf, pos, close)
                    trailer = bytearray(buf[last.end():])
                    while block := fh.read(SLICE_BYTES):
                        trailer += block
                        if gz:
                            read += len(block)
                            self.limits.check(str(self.path), read, raw_fh.tell())
                    trailer = bytes(trailer)
                    self.metadata = _HEADER_DECODER.decode(prefix + b"[]" + trailer)
                    return
                if cut > pos:
                    yield self._decode(buf, pos, cut + comma)
                    pos = cut + comma  # the "," before the next event
                block = fh.read(SLICE_BYTES)
                if not block:
                    raise SliceLayoutError  # no end of the array
                if gz:
                    read += len(block)
                    self.limits.check(str(self.path), read, raw_fh.tell())
                del buf[:pos]
                pos = 0
                buf += block

    @staticmethod
    def _decode(buf: bytearray, before: int, after: int) -> list[_Event]:
        """Decode the events between ``buf[before]`` and ``buf[after]`` (both overwritten)."""
        buf[before] = 0x5B  # "["
        buf[after] = 0x5D  # "]"
        with memoryview(buf) as view:
            return _EVENTS_DECODER.decode(view[before:after + 1])


@dataclass
class ScannedEvents:
    """Flat lists of what one pass over the events collects."""

    names: list = field(default_factory=list)
    is_kernel: list = field(default_factory=list)
    ts: list = field(default_factory=list)
    dur: list = field(default_factory=list)
    device: list = field(default_factory=list)
    stream: list = field(default_factory=list)
    corr: list = field(default_factory=list)
    grid: list = field(default_factory=list)
    block: list = field(default_factory=list)
    coll_rows: list = field(default_factory=list)
    coll_args: list = field(default_factory=list)
    launch_corr: list = field(default_factory=list)
    launch_ts: list = field(default_factory=list)
    cpu_steps: list = field(default_factory=list)
    gpu_steps: list = field(default_factory=list)


def scan_events(chunks: Iterator[list[_Event]]) -> ScannedEvents:
    """One pass over the events: GPU activities, launches and ProfilerStep ranges."""
    out = ScannedEvents()
    gpu: list[_Event] = []
    launches: list[_Event] = []
    add_gpu, add_launch = gpu.append, launches.append
    for chunk in chunks:
        for ev in chunk:
            cat = ev.cat
            if cat in LAUNCH_CATEGORIES:
                add_launch(ev)
            elif cat in GPU_ACTIVITY_CATEGORIES:
                if ev.ph == "X":
                    add_gpu(ev)
            elif cat == "user_annotation" or cat == "gpu_user_annotation":
                name = ev.name
                if isinstance(name, str) and name.startswith(STEP_PREFIX):
                    (out.cpu_steps if cat == "user_annotation" else out.gpu_steps).append(
                        (name, ev.ts, ev.dur))
    # Field by field over the kept events only: faster than appending inside the loop.
    no_args = _Args()
    args = [ev.args or no_args for ev in gpu]
    out.names = [ev.name for ev in gpu]
    out.is_kernel = [ev.cat == "kernel" for ev in gpu]
    out.ts = [ev.ts for ev in gpu]
    out.dur = [ev.dur for ev in gpu]
    out.device = [a.device for a in args]
    out.stream = [a.stream for a in args]
    out.corr = [a.correlation for a in args]
    out.grid = [a.grid for a in args]
    out.block = [a.block for a in args]
    out.coll_rows = [i for i, a in enumerate(args)
                     if a.collective is not None or a.in_nelems is not None]
    out.coll_args = [args[i] for i in out.coll_rows]
    launch_args = [(ev.args, ev.ts) for ev in launches if ev.args is not None]
    out.launch_corr = [a.correlation for a, _ in launch_args if a.correlation is not None]
    out.launch_ts = [t for a, t in launch_args if a.correlation is not None]
    return out
