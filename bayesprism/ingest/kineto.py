"""PyTorch profiler (Kineto) Chrome-trace JSON → trace-table rows, one file per rank.

What is read, and how (DESIGN §4):

* rows are the GPU activities of ``traceEvents``: ``cat == "kernel"`` complete events
  (``ph == "X"``) and the ``gpu_memcpy`` / ``gpu_memset`` activities (class ``memcpy``: they
  occupy the GPU inside a step just like kernels);
* the step of a kernel is the ``ProfilerStep#N`` CPU ``user_annotation`` range that contains
  the CPU launch (``cuda_runtime``/``cuda_driver`` event with the kernel's ``correlation`` id);
  kernels whose launch is not in the trace fall back to ``gpu_user_annotation``
  ``ProfilerStep#N`` ranges on the GPU timeline; a kernel in neither is counted as skipped
  (``"kernel outside any ProfilerStep"``), never dropped silently;
* ``rank`` and ``world_size`` come from ``distributedInfo``. A trace without it is an error
  unless the caller passes ``rank=`` (then ``world_size=`` or 1);
* the node is, in order: ``node=``; ``rank_to_node[rank]``; the ``host_name`` metadata key;
  the host of the file name as ``torch.profiler.tensorboard_trace_handler`` writes it
  (``<host>_<pid>.<ms>.pt.trace.json``); else ``node<rank // gpus_per_node>`` with an
  :class:`~bayesprism.errors.IngestWarning` (``gpus_per_node`` from the option, else the number
  of ``deviceProperties`` entries, else 8);
* the local GPU is ``args.device``;
* NCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``): class from ``args["Collective name"]``
  when present, else from the kernel name; ``bytes`` = max(``In msg nelems``,
  ``Out msg nelems``) × dtype size (the full buffer, the convention of
  :mod:`bayesprism.costs.collectives`); ``group_size`` from ``Group size``; ``process_group`` from
  ``Process Group Name``; ``dtype`` from ``args["dtype"]`` or the kernel name;
* kernels with a missing, zero or negative duration, or without a timestamp, are counted as
  skipped (reason ``"kernel with missing (NaN) duration"`` / ``"kernel with zero or negative
  duration"`` / ``"kernel without a timestamp (ts)"``); a ``ts`` or ``dur`` that is not a
  number (a string, a bool), a duration longer than a day (``schema.MAX_DURATION_US``) or an
  infinite one, and a rank outside ``0 .. world_size - 1`` are errors naming the file, the
  field and an example;
* ``occurrence`` is the n-th (from 0) launch of the same normalised kernel name on the rank in
  the step, in GPU start order.

Decoding is in :mod:`bayesprism.ingest.kineto_json` (fast, slice by slice); each slice of
events is reduced to compact columns (:class:`~bayesprism.ingest.kineto_json.ScannedEvents`)
before the next is read, then everything is vectorised.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism.errors import IngestWarning, Problem, TraceFormatError
from bayesprism.ingest.annotate import annotate_rank, ordinals
from bayesprism.ingest.classify import (
    classify_kernel,
    collective_class,
    is_nccl_kernel,
    normalize_kernel_name,
)
from bayesprism.ingest.groups import collect_groups
from bayesprism.ingest.kineto_json import (
    STEP_PREFIX,
    ScannedEvents,
    SliceLayoutError,
    StreamedTrace,
    load_trace,
    scan_events,
)
from bayesprism.schema import KERNEL_CLASS_DTYPE, MAX_DURATION_US, coerce_table

DEFAULT_GPUS_PER_NODE = 8

SKIP_OUTSIDE_STEP = "kernel outside any ProfilerStep"
SKIP_NAN_DURATION = "kernel with missing (NaN) duration"
SKIP_NONPOSITIVE_DURATION = "kernel with zero or negative duration"
SKIP_MISSING_TS = "kernel without a timestamp (ts)"
#: Share of a file's GPU activities that may be unusable (skipped for a reason above) before
#: the file is refused rather than read with counts (real traces here: at most 20 %).
MAX_UNUSABLE_SHARE = 0.5

#: ``<host>_<pid>.<timestamp>.pt.trace.json[.gz]`` (torch.profiler.tensorboard_trace_handler).
TRACE_HANDLER_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.(?P<ts>\d+)\.pt\.trace\.json(\.gz)?$")

#: dtype spellings (profiler ``args["dtype"]`` and NCCL kernel-name suffixes) → (name, bytes).
DTYPES: dict[str, tuple[str, int]] = {
    "float": ("float32", 4), "float32": ("float32", 4), "f32": ("float32", 4),
    "half": ("float16", 2), "float16": ("float16", 2), "__half": ("float16", 2),
    "f16": ("float16", 2),
    "bfloat16": ("bfloat16", 2), "__nv_bfloat16": ("bfloat16", 2), "bf16": ("bfloat16", 2),
    "double": ("float64", 8), "float64": ("float64", 8), "f64": ("float64", 8),
    "char": ("int8", 1), "int8_t": ("int8", 1), "int8": ("int8", 1), "i8": ("int8", 1),
    "byte": ("uint8", 1), "uint8_t": ("uint8", 1), "uint8": ("uint8", 1), "u8": ("uint8", 1),
    "bool": ("bool", 1),
    "int": ("int32", 4), "int32_t": ("int32", 4), "int32": ("int32", 4), "i32": ("int32", 4),
    "uint32_t": ("uint32", 4), "u32": ("uint32", 4),
    "long": ("int64", 8), "int64_t": ("int64", 8), "int64": ("int64", 8), "i64": ("int64", 8),
    "uint64_t": ("uint64", 8), "u64": ("uint64", 8),
    "float8_e4m3fn": ("float8_e4m3", 1), "__nv_fp8_e4m3": ("float8_e4m3", 1),
    "f8e4m3": ("float8_e4m3", 1),
    "float8_e5m2": ("float8_e5m2", 1), "__nv_fp8_e5m2": ("float8_e5m2", 1),
    "f8e5m2": ("float8_e5m2", 1),
}
_NCCL_NAME_DTYPE = re.compile(r"_(?:Sum|Prod|Max|Min|PreMulSum|SumPostDiv|Avg)_(\w+)$")
_CLASS_INDEX = {c: i for i, c in enumerate(KERNEL_CLASS_DTYPE.categories)}


def can_read(path: Path, head: bytes) -> bool:
    """True when ``head`` (first 64 KiB, decompressed) looks like a Chrome-trace JSON object."""
    text = head.lstrip()
    if not text.startswith(b"{"):
        return False
    return any(key in head for key in (b'"traceEvents"', b'"distributedInfo"',
                                       b'"deviceProperties"', b'"schemaVersion"'))


def _step_ranges(events: list[tuple[str, float, float]]) -> tuple[np.ndarray, np.ndarray,
                                                                   np.ndarray]:
    """Sorted (start, end, step number) arrays of ProfilerStep#N ranges."""
    rows = []
    for name, ts, dur in events:
        try:
            rows.append((float(ts), float(ts) + float(dur), int(name[len(STEP_PREFIX):])))
        except (TypeError, ValueError):
            continue
    rows.sort()
    if not rows:
        return np.empty(0), np.empty(0), np.empty(0, dtype=np.int64)
    arr = np.array(rows, dtype=np.float64)
    return arr[:, 0], arr[:, 1], arr[:, 2].astype(np.int64)


def _lookup_step(times: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 numbers: np.ndarray) -> np.ndarray:
    """Step number of the range containing each time, -1 where none does (NaN times: -1)."""
    out = np.full(times.shape, -1, dtype=np.int64)
    if len(starts) == 0:
        return out
    idx = np.searchsorted(starts, times, side="right") - 1
    ok = (idx >= 0) & np.isfinite(times)
    idx_ok = np.where(ok, idx, 0)
    ok &= times <= ends[idx_ok]
    out[ok] = numbers[idx_ok[ok]]
    return out


def _node_of(path: Path, host, devices, rank: int, *, node, gpus_per_node, rank_to_node,
             host_from_file_name: bool, source: str,
             ) -> tuple[str | None, str | None, Problem | None]:
    """(node, note, problem) for this rank; the note says when the node was guessed."""
    if node is not None:
        return str(node), None, None
    if rank_to_node is not None:
        mapping = {int(k): v for k, v in dict(rank_to_node).items()}
        if rank not in mapping:
            return None, None, Problem(source, "rank_to_node", f"has no entry for rank {rank}")
        return str(mapping[rank]), None, None
    if isinstance(host, str) and host:
        return host, None, None
    match = TRACE_HANDLER_NAME.match(path.name) if host_from_file_name else None
    if match:
        return match.group("host"), None, None
    if gpus_per_node:
        gpn, why = int(gpus_per_node), "gpus_per_node"
    elif isinstance(devices, list) and devices:
        gpn, why = len(devices), "the number of deviceProperties entries"
    else:
        gpn, why = DEFAULT_GPUS_PER_NODE, "a default, nothing in the trace says"
    note = (f"node taken as rank // {gpn} ({gpn} GPUs per node from {why}): no host name in "
            "the file names or trace metadata; pass rank_to_node (or gpus_per_node) to say")
    return f"node{rank // gpn}", note, None


def _collective_fields(args) -> tuple:
    """(collective class or None, dtype name or None, bytes or NaN, group size or NaN,
    process group name or None, collective name) of one collective's profiler args."""
    spelled = args.dtype
    name, size = (DTYPES.get(str(spelled).lower(), (str(spelled).lower(), 0))
                  if spelled is not None else (None, 0))
    nelems = [v for v in (args.in_nelems, args.out_nelems) if isinstance(v, (int, float))]
    nbytes = float(max(nelems)) * size if nelems and size else np.nan
    gs = args.group_size
    group = float(gs) if isinstance(gs, (int, float)) else np.nan
    pg = args.process_group
    return (collective_class(args.collective), name, nbytes, group,
            None if pg is None else str(pg), args.collective)


def read_kineto(path: str | Path, *, node: str | None = None, gpus_per_node: int | None = None,
                rank_to_node: dict | None = None, run: str | None = None,
                rank: int | None = None, world_size: int | None = None,
                host_from_file_name: bool = True, accept_unusable: bool = False
                ) -> tuple[pd.DataFrame, dict]:
    """Read one PyTorch profiler (Kineto) trace file into trace-table rows.

    Parameters
    ----------
    path
        ``.json`` or ``.json.gz`` Chrome trace of one rank.
    node
        Node name of this rank (overrides everything else).
    gpus_per_node
        Used only when no host name is known: node = ``rank // gpus_per_node``.
    rank_to_node
        Mapping global rank → node name.
    run
        Run name (default: the name of the file's directory).
    rank, world_size
        Used only when the trace has no ``distributedInfo``.
    host_from_file_name
        Take the host from a ``<host>_<pid>.<ms>.pt.trace.json`` file name. The dispatcher
        turns this off for a run whose file names all carry the same "pid" (then the names
        were chosen by hand, e.g. ``worker3_step_12.<ms>.pt.trace.json``, and say no host).
    accept_unusable
        Read a file more than :data:`MAX_UNUSABLE_SHARE` of whose GPU activities cannot be
        used (the skips above), with their counts, instead of refusing it.

    Returns
    -------
    (pandas.DataFrame, dict)
        Rows in the trace-table schema (``wait_us``/``transfer_us`` empty: they need all ranks,
        see :mod:`bayesprism.ingest.waits`), and a report with keys ``run``, ``skipped``
        ``{reason: count}``, ``notes``, ``run_meta``, plus ``rank``, ``world_size``,
        ``start_us`` (first kernel start), ``job`` (job name from metadata, or None),
        ``gpu_events`` (GPU activities read) and ``kernel_events`` (of which ``cat == "kernel"``).

    Raises
    ------
    TraceFormatError
        Unreadable file, missing ``distributedInfo``, no kernels, no ProfilerStep annotations.
    """
    path = Path(path)
    source = str(path)
    data, scan = _scan(path)
    run = run if run is not None else (path.resolve().parent.name or "run")
    info = data.distributedInfo
    rank, world_size, problems, notes = _identity(info, rank, world_size, path)
    devices_meta = data.deviceProperties
    host_meta = data.host_name or data.hostname
    job = data.mast_job_name or data.tw_job
    del data

    problems += _event_problems(scan, rank, world_size, source, checked=not problems)
    if rank is not None and not problems:
        node_name, node_note, node_problem = _node_of(
            path, host_meta, devices_meta, rank, node=node, gpus_per_node=gpus_per_node,
            rank_to_node=rank_to_node, host_from_file_name=host_from_file_name, source=source)
        if node_problem is not None:
            problems.append(node_problem)
        if node_note is not None:
            warnings.warn(node_note, IngestWarning, stacklevel=2)
            notes.append(node_note)
    if problems:
        raise TraceFormatError(problems)

    start, duration, usable, skipped = _times(scan, source)
    step = _kernel_steps(scan, start)
    keep = _kept(usable, step, skipped, source, accept_unusable)
    kernels = _kernel_codes(scan)
    coll = _collective_details(scan, kernels)
    dev, strm = _devices(scan)
    # the kept rows in time order within each step (sorted before the frame is built: one
    # gather per array rather than a reindex of every column)
    kept = np.flatnonzero(keep)
    rows = kept[np.lexsort((start[kept], step[kept]))]
    df = _frame(rows, run=run, rank=rank, node=node_name, source=path.name, step=step,
                dev=dev, strm=strm, kernels=kernels, coll=coll, start=start,
                duration=duration)
    groups, group_problems = collect_groups(
        info.get("pg_config") if isinstance(info, dict) else None, coll.groups.values(),
        source)
    df, layout, rank_problems = annotate_rank(
        df, groups=groups, rank=rank, world_size=world_size,
        op_names=coll.op_name[rows], launch=scan.launch_labels[scan.launch_code[rows]],
        source=source)
    if group_problems or rank_problems:
        raise TraceFormatError(group_problems + rank_problems)
    df = coerce_table(df, source)

    run_meta = {
        "format": "kineto",
        "platform": _platform(devices_meta, dev),
        "world_size": world_size,
        "gpus_per_node": _gpus_per_node(gpus_per_node, devices_meta),
        "source_files": [source],
    }
    if isinstance(info, dict):
        for key in ("backend", "nccl_version"):
            if info.get(key) is not None:
                run_meta[key] = info[key]
    report = {
        "run": run,
        "skipped": skipped,
        "notes": notes,
        "run_meta": run_meta,
        "rank": rank,
        "world_size": world_size,
        "start_us": float(np.nanmin(start)) if np.isfinite(start).any() else None,
        "job": job,
        "gpu_events": len(scan.name_code),
        "kernel_events": int(scan.is_kernel.sum()),
        "layout": layout,
    }
    return df, report


# --------------------------------------------------------------------------- the steps


def _scan(path: Path):
    """The trace's metadata and its scanned GPU events: streamed slice by slice (each slice
    reduced to compact columns before the next is read), or read whole when the file's layout
    does not allow slicing."""
    stream = StreamedTrace(path)
    try:
        scan = scan_events(stream.slices())
        return stream.metadata, scan
    except SliceLayoutError:
        data, events = load_trace(path)
        scan = scan_events(iter([events]))
        del events
        return data, scan


def _identity(info, rank: int | None, world_size: int | None, path: Path
              ) -> tuple[int | None, int | None, list[Problem], list[str]]:
    """This file's rank and world size: from ``distributedInfo``, else from the options."""
    problems: list[Problem] = []
    notes: list[str] = []
    if isinstance(info, dict) and "rank" in info:
        try:
            rank = int(info["rank"])
            world_size = int(info.get("world_size", world_size or rank + 1))
        except (TypeError, ValueError):
            problems.append(Problem(str(path), "distributedInfo.rank",
                                    f"is not an integer: {info.get('rank')!r}"))
    elif rank is None:
        problems.append(Problem(
            str(path), "distributedInfo",
            "missing: the trace does not say its rank (record it with a distributed backend, "
            "or pass rank= to read_kineto)"))
    else:
        rank, world_size = int(rank), int(world_size or 1)
        notes.append(f"{path.name}: no distributedInfo; rank {rank} and world size "
                     f"{world_size} taken from the options")
    return rank, world_size, problems, notes


def _event_problems(scan, rank: int | None, world_size: int | None, source: str,
                    checked: bool) -> list[Problem]:
    """No kernels, unnamed kernels, no ProfilerStep; a rank outside the world size (when the
    identity had no problem: ``checked``)."""
    problems: list[Problem] = []
    unnamed = int((scan.name_code < 0).sum())
    if not len(scan.name_code):
        problems.append(Problem(source, "traceEvents",
                                "no GPU kernel events (cat 'kernel', ph 'X'): nothing to read"))
    elif unnamed:
        problems.append(Problem(source, "traceEvents.name", "GPU events without a kernel name",
                                unnamed))
    if not scan.cpu_steps and not scan.gpu_steps:
        problems.append(Problem(source, "traceEvents",
                                "no ProfilerStep#N annotation: kernels cannot be assigned to "
                                "steps (profile with torch.profiler.schedule / prof.step())"))
    if rank is not None and world_size is not None and checked and not problems:
        if not 1 <= world_size:
            problems.append(Problem(source, "distributedInfo.world_size",
                                    "must be a positive integer", example=world_size))
        elif not 0 <= rank < world_size:
            problems.append(Problem(source, "distributedInfo.rank",
                                    f"must be between 0 and world_size - 1 = {world_size - 1}",
                                    example=rank))
    return problems


def _not_numbers(scan: ScannedEvents, source: str) -> list[Problem]:
    """A problem for ``ts`` and for ``dur`` when some are of another JSON type than a number
    (a string such as ``"12"``, a bool): those are never converted, since ``true`` would
    become 1 µs."""
    return [Problem(source, f"traceEvents.{name}",
                    f"GPU activities' {name} must be a JSON number (µs), found "
                    f"{', '.join(sorted(bad.kinds))}", bad.count, bad.example)
            for name, bad in scan.bad.items() if bad.count]


def _times(scan: ScannedEvents, source: str
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Start and duration (µs) of every GPU activity, which of them are usable, and the
    counts of the unusable ones by reason; refuses non-numbers, infinities, durations over a
    day."""
    start, duration = scan.ts, scan.dur
    problems = _not_numbers(scan, source)
    with np.errstate(invalid="ignore"):
        too_long = ~(duration <= MAX_DURATION_US) & ~np.isnan(duration)
        endless = np.isinf(start)
    if too_long.any():
        problems.append(Problem(source, "traceEvents.dur", "GPU activity longer than a day "
                                f"({MAX_DURATION_US:.0f} µs) or infinite: not a duration in µs",
                                int(too_long.sum()), duration[too_long][0]))
    if endless.any():
        problems.append(Problem(source, "traceEvents.ts", "GPU activity timestamp is infinite",
                                int(endless.sum()), start[endless][0]))
    if problems:
        raise TraceFormatError(problems)
    skipped: dict[str, int] = {}
    no_ts = np.isnan(start)
    nan_dur = np.isnan(duration) & ~no_ts
    bad_dur = ~nan_dur & ~no_ts & ~(duration > 0)
    if no_ts.any():
        skipped[SKIP_MISSING_TS] = int(no_ts.sum())
    if nan_dur.any():
        skipped[SKIP_NAN_DURATION] = int(nan_dur.sum())
    if bad_dur.any():
        skipped[SKIP_NONPOSITIVE_DURATION] = int(bad_dur.sum())
    nan_dur |= no_ts  # not usable either way, counted once above
    return start, duration, ~nan_dur & ~bad_dur, skipped


def _kernel_steps(scan, start: np.ndarray) -> np.ndarray:
    """Step of each kernel: its CPU launch inside a CPU ProfilerStep range, else its start
    inside a GPU one; -1 outside any."""
    corr_arr = scan.corr
    step = np.full(len(scan.name_code), -1, dtype=np.int64)
    launched = np.zeros(len(scan.name_code), dtype=bool)
    if len(scan.launch_corr):
        l_corr, l_ts = scan.launch_corr, scan.launch_ts
        order = np.argsort(l_corr, kind="stable")
        l_corr, l_ts = l_corr[order], l_ts[order]
        pos = np.clip(np.searchsorted(l_corr, corr_arr), 0, len(l_corr) - 1)
        launched = l_corr[pos] == corr_arr
        launch_time = np.where(launched, l_ts[pos], np.nan)
        step = _lookup_step(launch_time, *_step_ranges(scan.cpu_steps))
    if scan.gpu_steps:
        fallback = ~launched
        step[fallback] = _lookup_step(start[fallback], *_step_ranges(scan.gpu_steps))
    return step


def _kept(usable: np.ndarray, step: np.ndarray, skipped: dict[str, int], source: str,
          accept_unusable: bool) -> np.ndarray:
    """The rows read: usable and inside a step (the others counted in ``skipped``); a file
    most of whose activities are unusable is refused unless ``accept_unusable``."""
    outside = usable & (step < 0)
    if outside.any():
        skipped[SKIP_OUTSIDE_STEP] = int(outside.sum())
    keep = usable & (step >= 0)
    unusable = keep.size - int(keep.sum())
    if keep.size and unusable > MAX_UNUSABLE_SHARE * keep.size and not accept_unusable:
        reason, count = max(skipped.items(), key=lambda item: item[1])
        raise TraceFormatError(Problem(
            source, "traceEvents", f"{unusable / keep.size:.0%} of its {keep.size:,} GPU "
            f"activities cannot be used ({reason}: {count:,}): not a usable trace; "
            f"--no-strict (strict=False) accepts its {keep.size - unusable:,} usable ones",
            unusable))
    return keep


@dataclass
class _Kernels:
    """Kernel names of the activities, each distinct raw name normalised and classified once."""

    codes: np.ndarray  # activity -> distinct raw name
    uniques: np.ndarray  # the distinct raw names
    norm: np.ndarray  # their normalised names
    names: np.ndarray  # the distinct normalised names (the table's categories)
    code: np.ndarray  # activity -> normalised name
    kclass: np.ndarray  # activity -> kernel class code (collectives' refined from their args)


def _kernel_codes(scan: ScannedEvents) -> _Kernels:
    codes = scan.name_code.astype(np.intp)
    uniques = np.array(scan.names, dtype=object)
    norm = np.array([normalize_kernel_name(u) for u in uniques], dtype=object)
    kernel_names, norm_code = np.unique(norm, return_inverse=True)
    class_code = np.array([_CLASS_INDEX[classify_kernel(u)] for u in uniques], dtype=np.int8)
    return _Kernels(codes, uniques, norm, kernel_names, norm_code[codes], class_code[codes])


@dataclass
class _Collectives:
    """Per activity: bytes, group size, process group, dtype and collective name (where the
    profiler recorded them); the process groups the kernels name, with their ranks."""

    nbytes: np.ndarray
    group_size: np.ndarray
    process_group: np.ndarray
    dtype: np.ndarray
    op_name: np.ndarray
    groups: dict[str, tuple]


def _collective_details(scan, kernels: _Kernels) -> _Collectives:
    """Collective details of the activities; refines ``kernels.kclass`` of the NCCL kernels
    whose args name their collective."""
    n = len(scan.name_code)
    codes = kernels.codes
    out = _Collectives(np.full(n, np.nan), np.full(n, np.nan), np.full(n, None, dtype=object),
                       np.full(n, None, dtype=object), np.full(n, None, dtype=object), {})
    nccl_unique = np.array([is_nccl_kernel(u) for u in kernels.uniques], dtype=bool)
    is_nccl = nccl_unique[codes]
    if is_nccl.any():
        dtype_unique = np.array([_dtype_from_name(u) for u in kernels.norm], dtype=object)
        out.dtype[is_nccl] = dtype_unique[codes[is_nccl]]
    if not len(scan.coll_rows):
        return out
    # a step repeats the same few collectives: each distinct set of fields is read once
    rows, key_code = scan.coll_rows, scan.coll_code
    classes, dtypes, sizes, groups_of, pgs, ops = zip(
        *(_collective_fields(args) for args in scan.coll_args), strict=True)

    def per_row(values) -> np.ndarray:
        one = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):  # one by one: a list value stays one element
            one[i] = value
        return one[key_code]

    cls_code = np.array([_CLASS_INDEX.get(c, -1) for c in classes])[key_code]
    nccl_class = (cls_code >= 0) & is_nccl[rows]
    kernels.kclass[rows[nccl_class]] = cls_code[nccl_class]
    spelled = np.array([d is not None for d in dtypes])[key_code]
    out.dtype[rows[spelled]] = per_row(dtypes)[spelled]
    out.nbytes[rows] = np.asarray(sizes, dtype=float)[key_code]
    out.group_size[rows] = np.asarray(groups_of, dtype=float)[key_code]
    out.process_group[rows] = per_row(pgs)
    out.op_name[rows] = per_row(ops)
    for args in scan.coll_args:
        pg = args.process_group
        if pg is not None and str(pg) not in out.groups and args.process_group_ranks is not None:
            out.groups[str(pg)] = (str(pg), args.process_group_desc, args.process_group_ranks)
    return out


def _devices(scan) -> tuple[np.ndarray, np.ndarray]:
    """Device (a missing one: the most common) and stream of every activity."""
    dev = scan.device.copy()
    if np.isnan(dev).any():
        known = dev[~np.isnan(dev)]
        dev[np.isnan(dev)] = np.bincount(known.astype(np.int64)).argmax() if len(known) else 0
    return dev, scan.stream


def _frame(rows: np.ndarray, *, run: str, rank: int, node: str, source: str, step, dev, strm,
           kernels: _Kernels, coll: _Collectives, start, duration) -> pd.DataFrame:
    """The trace-table rows of the activities ``rows`` (in that order)."""
    n_keep = len(rows)

    def constant(value: str) -> pd.Categorical:
        return pd.Categorical.from_codes(np.zeros(n_keep, dtype=np.int8), categories=[value])

    kernel_rows = kernels.code[rows]
    step_rows = step[rows]
    return pd.DataFrame({
        "run": constant(run),
        "step": step_rows,
        "rank": rank,
        "node": constant(node),
        "gpu": dev[rows].astype(np.int64),
        "kernel": pd.Categorical.from_codes(kernel_rows, categories=kernels.names),
        "kernel_class": pd.Categorical.from_codes(kernels.kclass[rows], dtype=KERNEL_CLASS_DTYPE),
        "duration_us": duration[rows],
        "start_us": start[rows],
        "stream": pd.array(strm[rows], dtype="Int64"),
        "bytes": coll.nbytes[rows],
        "dtype": pd.Categorical(coll.dtype[rows]),
        "group_size": coll.group_size[rows],
        "process_group": pd.Categorical(coll.process_group[rows]),
        "wait_us": np.nan,
        "transfer_us": np.nan,
        "source": constant(source),
        "occurrence": pd.arrays.IntegerArray(
            ordinals(step_rows * len(kernels.names) + kernel_rows),
            np.zeros(n_keep, dtype=bool)),
    })


def _dtype_from_name(name: str) -> str | None:
    match = _NCCL_NAME_DTYPE.search(name)
    if not match:
        return None
    return DTYPES.get(match.group(1).lower(), (match.group(1).lower(), 0))[0]


def _platform(devices, dev: np.ndarray) -> str:
    if isinstance(devices, list) and devices:
        ids = dev[~np.isnan(dev)]
        local = int(ids[0]) if len(ids) else 0
        for entry in devices:
            if isinstance(entry, dict) and entry.get("id") == local and entry.get("name"):
                return str(entry["name"])
        first = devices[0]
        if isinstance(first, dict) and first.get("name"):
            return str(first["name"])
    return "unknown"


def _gpus_per_node(option, devices) -> int | None:
    if option:
        return int(option)
    if isinstance(devices, list) and devices:
        return len(devices)
    return None
