"""Decoding of PyTorch profiler (Kineto) trace JSON: what :mod:`bayesprism.ingest.kineto` reads.

``msgspec`` decodes against a schema of only the fields read, so the rest of each event (most of
a trace) is skipped without building Python objects. The event array is located without
decoding it and then decoded in slices of about 1 MB cut between two events where the
profiler's layout puts them, so only one slice of event objects is alive at a time; a file in
another layout is decoded in one piece, and JSON with ``NaN`` literals (written by Python's
``json``, not valid JSON) goes through the standard library.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bayesprism.errors import Problem, TraceFormatError

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
#: Between two events as the profiler writes them ("  }," and "  {" on lines of their own). A raw
#: newline never occurs inside a JSON string, so this can only be structure.
EVENT_BOUNDARY = b"\n  },\n  {"
SLICE_BYTES = 1 << 20


class SliceLayoutError(Exception):
    """A slice of the event array did not decode: the layout is not the profiler's."""

def _read_bytes(path: Path) -> bytes:
    source = str(path)
    raw = path.read_bytes()
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


def _load_with_stdlib(raw: bytes, source: str):
    """Fallback decoder: accepts NaN/Infinity literals, names line and column of errors."""
    try:
        full = msgspec.convert(json.loads(raw), _TraceFull)
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
    return full, lambda sliced=True: iter([events])


def load_trace(path: Path) -> tuple[_Metadata, Callable[[bool], Iterator[list[_Event]]]]:
    """Parse one trace file: its metadata, and ``events(sliced)`` yielding its events in lists.

    Decoding the events slice by slice (about 1 MB of JSON each, cut between two events where
    the profiler's layout puts them) keeps only one slice of event objects alive at a time. A
    file in another layout is decoded in one piece. Raises TraceFormatError naming the file.
    """
    source = str(path)
    raw = _read_bytes(path)
    try:
        header = _HEADER_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(Problem(source, "", f"not a PyTorch profiler trace: {exc}")
                               ) from None
    except msgspec.DecodeError:
        header = None
    if header is None:
        return _load_with_stdlib(raw, source)
    array = header.traceEvents
    if len(array) == 0:
        raise TraceFormatError(Problem(source, "traceEvents",
                                       "missing: not a PyTorch profiler trace"))
    header.traceEvents = msgspec.Raw()

    def whole() -> Iterator[list[_Event]]:
        try:
            yield _EVENTS_DECODER.decode(array)
        except msgspec.ValidationError as exc:
            raise TraceFormatError(Problem(source, "traceEvents",
                                           f"not a PyTorch profiler trace: {exc}")) from None

    def slices() -> Iterator[list[_Event]]:
        view = memoryview(array)
        n = len(view)
        first = raw.find(b"[", raw.find(b'"traceEvents"'))
        if n < 2 * SLICE_BYTES or first < 0 or raw[first:first + 64] != bytes(view[:64]):
            yield from whole()
            return
        begin = 1  # after "["
        while begin < n - 1:
            cut = raw.find(EVENT_BOUNDARY, first + begin + SLICE_BYTES, first + n)
            end = n - 1 if cut < 0 else cut - first + 4  # through "  }"
            try:
                yield _EVENTS_DECODER.decode(b"[" + view[begin:end].tobytes() + b"]")
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise SliceLayoutError from None
            begin = end + 1  # past ","

    def events(sliced: bool = True) -> Iterator[list[_Event]]:
        return slices() if sliced else whole()

    return header, events


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
    out.coll_rows = [i for i, a in enumerate(args)
                     if a.collective is not None or a.in_nelems is not None]
    out.coll_args = [args[i] for i in out.coll_rows]
    launch_args = [(ev.args, ev.ts) for ev in launches if ev.args is not None]
    out.launch_corr = [a.correlation for a, _ in launch_args if a.correlation is not None]
    out.launch_ts = [t for a, t in launch_args if a.correlation is not None]
    return out
