"""Decoding of PyTorch profiler (Kineto) trace JSON: what :mod:`bayesprism.ingest.kineto` reads.

``msgspec`` decodes against a schema of only the fields read, so the rest of each event (most of
a trace) is skipped without building Python objects. A file whose events are separated the
same way throughout (the profiler's layout, one event per line, compact JSON) is read and
decoded in slices of about 1 MB cut between two events (:class:`StreamedTrace`); any other
file, or one where a cut would fall inside a string, is decoded in one piece
(:func:`load_trace`), JSON with ``NaN`` literals (written by Python's ``json``, not valid JSON)
through the standard library.

Memory bound: :func:`scan_events` reduces each slice to compact columns (:class:`ScannedEvents`,
~70 bytes per GPU activity, 16 per launch) before the next slice is read, so a streamed file
peaks at those columns plus about 8 × :data:`SLICE_BYTES` (the raw buffer, one slice's decoded
events, and their reduction), not at its decoded events (~1.3 kB per GPU activity with its
launch). ``tests/test_kineto.py`` measures it.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
from isal import igzip, isal_zlib

from bayesprism.errors import Problem, TraceFormatError
from bayesprism.ingest.files import DecompressionLimits, ShortReads, read_bytes

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
#: The profiler writes EVENT_BOUNDARY ("  }," and "  {" on lines of their own); other writers
#: (one event per line, other indents, compact JSON) use the first separator the array shows
#: (BOUNDARY_PATTERN), kept for the whole file. A raw newline never occurs inside a JSON string,
#: so a boundary with one can only be structure; any other false cut (a "},{" inside a
#: string, as in a C++ kernel name) fails to decode and the file is read whole.
ARRAY_START = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
EVENT_BOUNDARY = b"\n  },\n  {"
BOUNDARY_PATTERN = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
END_PATTERN = re.compile(rb"\}[ \t\r\n]*\]")
SLICE_BYTES = 1 << 20
#: Bytes of one event (or of what lies between two) beyond which a file is not sliced: a
#: profiler event is under a few kB, and without a bound a file with no boundary in sight
#: (one huge event, a run of whitespace) would be searched again at every block (quadratic).
MAX_EVENT_BYTES = 16 << 20


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


def _boundary_of(buf: bytearray, pos: int) -> bytes | None:
    """The separator between two events in ``buf`` after ``pos``: the profiler's, else the
    first the array shows; None while it shows none."""
    if buf.find(EVENT_BOUNDARY, pos) >= 0:
        return EVENT_BOUNDARY
    found = BOUNDARY_PATTERN.search(buf, pos)
    return None if found is None else bytes(found.group(0))


class StreamedTrace:
    """Decode a trace file slice by slice while reading it, in the profiler's own layout.

    The profiler writes ``"traceEvents": [`` and then one event per block, blocks separated by
    ``EVENT_BOUNDARY`` (other writers: ``BOUNDARY_PATTERN``). The file (gzip or not) is read in
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
            fh = igzip.IGzipFile(fileobj=ShortReads(raw_fh)) if gz else raw_fh
            buf = bytearray(fh.read(SLICE_BYTES))
            read = len(buf)  # decompressed bytes so far, checked against the limits per block
            key = ARRAY_START.search(buf)
            if key is None:
                raise SliceLayoutError
            prefix = bytes(buf[:key.end() - 1])  # up to '"traceEvents": '
            # pos: the byte before the next event ("[" or ","). Each slice is decoded in place
            # as a JSON list by writing "[" there and "]" over the byte after its last event.
            pos = key.end() - 1
            boundary = None  # the file's separator, once the array shows one
            while True:
                if boundary is None:
                    boundary = _boundary_of(buf, pos)
                cut = buf.rfind(boundary, pos) if boundary else -1
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
                    comma = cut + boundary.index(b",")
                    yield self._decode(buf, pos, comma)
                    pos = comma  # the "," before the next event
                if len(buf) - pos > MAX_EVENT_BYTES:
                    raise SliceLayoutError  # no event boundary in sight: read it whole
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


#: JSON types a ``ts`` or ``dur`` may have (``null``: missing); anything else is refused.
NUMBER_TYPES = (int, float, type(None))
_NO_ARGS = _Args()


def as_float(values: list) -> np.ndarray:
    """``values`` as float64, NaN where missing or not a number.

    Examples
    --------
    >>> as_float([1, None, 2.5]).tolist()
    [1.0, nan, 2.5]
    >>> as_float([1, "x"]).tolist()
    [1.0, nan]
    """
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan)


@dataclass
class BadNumbers:
    """``ts`` or ``dur`` values of another JSON type than a number: how many, the first, and
    their type names (never converted: ``true`` would become 1 µs)."""

    count: int = 0
    example: Any = None
    kinds: set[str] = field(default_factory=set)


@dataclass
class ScannedEvents:
    """The GPU activities and launches of one trace as compact columns (one row per GPU
    activity, ``launch_*`` one per CPU launch with a correlation id).

    Names, launch configurations and collective args are stored once per distinct value
    (``names``, ``launch_labels``, ``coll_args``) with an integer code per row, so the columns
    take about 60 bytes per GPU activity and 16 per launch, whatever the trace's JSON holds.
    """

    name_code: np.ndarray  # int32, -1: the name is not a string
    names: list[str]  # distinct names, in order of first appearance
    is_kernel: np.ndarray  # bool: cat == "kernel" (else memcpy/memset)
    ts: np.ndarray  # float64 µs, NaN where missing (or not a number: see bad)
    dur: np.ndarray
    bad: dict[str, BadNumbers]  # "ts"/"dur" -> values that are not JSON numbers
    device: np.ndarray  # float64, NaN where missing
    stream: np.ndarray
    corr: np.ndarray
    launch_code: np.ndarray  # int32 -> launch_labels
    launch_labels: np.ndarray  # "132x1x1/384x1x1" per distinct grid/block
    coll_rows: np.ndarray  # int64: the rows with collective args
    coll_code: np.ndarray  # int64, per coll_rows -> coll_args
    coll_args: list[_Args]  # the first args of each distinct set of collective fields
    launch_corr: np.ndarray  # float64
    launch_ts: np.ndarray
    cpu_steps: list  # (name, ts, dur) of ProfilerStep#N CPU ranges
    gpu_steps: list  # ... and GPU ranges

    def equals(self, other: ScannedEvents) -> bool:
        """True when every column and list is equal (NaN equal to NaN)."""
        for name in self.__dataclass_fields__:
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, np.ndarray):
                if not np.array_equal(mine, theirs, equal_nan=mine.dtype.kind == "f"):
                    return False
            elif mine != theirs:
                return False
        return True


def _launch_text(value) -> str:
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value)
    return "" if value is None else str(value)


def _hashable(key):
    """``key`` itself, or its text when it cannot be hashed (a list where a trace should hold
    numbers), so that such values are still grouped."""
    try:
        hash(key)
    except TypeError:
        return ("\x00repr", repr(key))
    return key


class _Columns:
    """Reduces batches of decoded events to :class:`ScannedEvents` columns as they come.

    Each batch's events are dropped once reduced, so memory holds the compact columns and
    one batch of events, never every event of the file (a 395 MB trace held ~700 MB of event
    objects until the end).
    """

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {}
        self.name_index: dict[str, int] = {}
        self.launch_index: dict = {}
        self.launch_first: list[tuple] = []
        self.coll_index: dict = {}
        self.coll_args: list[_Args] = []
        self.bad = {"ts": BadNumbers(), "dur": BadNumbers()}
        self.rows = 0
        self.cpu_steps: list = []
        self.gpu_steps: list = []

    def add(self, chunk: list[_Event]) -> None:
        """Reduce one batch of events (GPU activities, launches, step ranges)."""
        gpu: list[_Event] = []
        launches: list[_Event] = []
        add_gpu, add_launch = gpu.append, launches.append
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
                    (self.cpu_steps if cat == "user_annotation" else self.gpu_steps).append(
                        (name, ev.ts, ev.dur))
        if gpu:
            self._add_gpu(gpu)
        if launches:
            self._add_launches(launches)

    def _put(self, name: str, values: np.ndarray) -> None:
        self.parts.setdefault(name, []).append(values)

    def _add_gpu(self, gpu: list[_Event]) -> None:
        # field by field over the kept events only: faster than appending inside the loop
        args = [ev.args or _NO_ARGS for ev in gpu]
        names = self.name_index
        self._put("name_code", np.fromiter(
            (names.setdefault(ev.name, len(names)) if ev.name.__class__ is str else -1
             for ev in gpu), dtype=np.int32, count=len(gpu)))
        self._put("is_kernel", np.fromiter((ev.cat == "kernel" for ev in gpu), dtype=bool,
                                           count=len(gpu)))
        self._put("ts", self._numbers([ev.ts for ev in gpu], "ts"))
        self._put("dur", self._numbers([ev.dur for ev in gpu], "dur"))
        self._put("device", as_float([a.device for a in args]))
        self._put("stream", as_float([a.stream for a in args]))
        self._put("corr", as_float([a.correlation for a in args]))
        self._put("launch_code", np.fromiter(
            (self._launch_code(a.grid, a.block) for a in args), dtype=np.int32,
            count=len(args)))
        rows = [i for i, a in enumerate(args) if a.collective is not None
                or a.in_nelems is not None]
        self._put("coll_rows", np.asarray(rows, dtype=np.int64) + self.rows)
        self._put("coll_code", np.fromiter((self._coll_code(args[i]) for i in rows),
                                           dtype=np.int64, count=len(rows)))
        self.rows += len(gpu)

    def _add_launches(self, launches: list[_Event]) -> None:
        with_corr = [(ev.args.correlation, ev.ts) for ev in launches
                     if ev.args is not None and ev.args.correlation is not None]
        self._put("launch_corr", as_float([c for c, _ in with_corr]))
        self._put("launch_ts", as_float([t for _, t in with_corr]))

    def _numbers(self, values: list, name: str) -> np.ndarray:
        kinds = set(map(type, values))  # one C-level pass; the rest only on a mismatch
        if kinds.issubset(NUMBER_TYPES):
            return as_float(values)
        bad = [v for v in values if type(v) not in NUMBER_TYPES]
        record = self.bad[name]
        if not record.count:
            record.example = bad[0]
        record.count += len(bad)
        record.kinds |= {type(v).__name__ for v in bad}
        return np.full(len(values), np.nan)

    def _launch_code(self, grid, block) -> int:
        key = _hashable((grid, block))
        code = self.launch_index.get(key)
        if code is None:
            code = self.launch_index[key] = len(self.launch_first)
            self.launch_first.append((grid, block))
        return code

    def _coll_code(self, a: _Args) -> int:
        # a step repeats the same few collectives: each distinct set of fields is read once
        key = _hashable((a.collective, a.dtype, a.in_nelems, a.out_nelems, a.group_size,
                         a.process_group, a.process_group_ranks is not None))
        code = self.coll_index.get(key)
        if code is None:
            code = self.coll_index[key] = len(self.coll_args)
            self.coll_args.append(a)
        return code

    def finish(self) -> ScannedEvents:
        """The columns of every batch added, joined."""
        dtypes = {"name_code": np.int32, "is_kernel": bool, "launch_code": np.int32,
                  "coll_rows": np.int64, "coll_code": np.int64}
        columns = {}
        for name in ("name_code", "is_kernel", "ts", "dur", "device", "stream", "corr",
                     "launch_code", "coll_rows", "coll_code", "launch_corr", "launch_ts"):
            parts = self.parts.pop(name, [])
            columns[name] = (np.concatenate(parts) if parts
                             else np.empty(0, dtype=dtypes.get(name, np.float64)))
        labels = np.array(["" if g is None and b is None
                           else f"{_launch_text(g)}/{_launch_text(b)}"
                           for g, b in self.launch_first], dtype=object)
        return ScannedEvents(names=list(self.name_index), bad=self.bad,
                             launch_labels=labels, coll_args=self.coll_args,
                             cpu_steps=self.cpu_steps, gpu_steps=self.gpu_steps, **columns)


def scan_events(chunks: Iterable[list[_Event]]) -> ScannedEvents:
    """One pass over the events, batch by batch: GPU activities, launches and ProfilerStep
    ranges as compact columns (:class:`ScannedEvents`).

    Each batch is reduced before the next is read, so peak memory is the columns plus about
    one batch of decoded events (the streamed reader's slices are ~1 MB of JSON).

    Examples
    --------
    >>> ev = _Event(ph="X", cat="kernel", name="gemm", ts=10.0, dur=2.5, args=_Args(device=0))
    >>> scan = scan_events([[ev, ev]])
    >>> scan.names, scan.name_code.tolist(), scan.dur.tolist()
    (['gemm'], [0, 0], [2.5, 2.5])
    """
    columns = _Columns()
    for chunk in chunks:
        columns.add(chunk)
    return columns.finish()
