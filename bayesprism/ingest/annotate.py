"""One rank's trace rows → roles, coordinates, micro-batches and place keys (DESIGN §3, §4).

:func:`annotate_rank` runs once per Kineto file, after its rows are read, with what only that
file knows: its process groups (``distributedInfo.pg_config`` and the NCCL kernels' group
args), the ``Collective name`` of each NCCL kernel and each kernel's grid/block. It sets

* ``role`` of every collective row (:data:`bayesprism.ingest.groups.ROLES`) and the rank's
  coordinates ``tp_rank``, ``pp_stage``, ``dp_rank``, ``cp_rank``, ``ep_rank``
  (:mod:`bayesprism.ingest.groups`);
* for pipeline send/recv rows whose schedule is recognised (:mod:`bayesprism.ingest.pipeline`):
  ``group_size`` 2 (a transfer has two ends, whatever the pipeline group's size) and
  ``occurrence`` = the transfer's instance number, equal on both ends, so that
  :mod:`bayesprism.ingest.waits` pairs a receiver with its sender;
* ``microbatch`` and ``phase`` (``forward``, ``backward``, ``forward+backward`` /
  ``backward+forward`` where the schedule runs two without a send/recv between them, or
  ``optimizer`` for the step's tail from its first data-parallel or global collective or
  optimizer kernel on);
* ``signature``: for compute kernels, a *place key* (kernel name, grid/block, pipeline stage,
  the kind of chunk between two send/recv ops, and the launch's ordinal among same-named
  launches in that chunk) that :mod:`bayesprism.ingest.signatures` turns into the kernel's
  signature once every file is read; for collectives, the kernel name and its role
  (``name [dp]``: their work is the cost model's, in bytes and group size).

It returns a layout report for the file, which
:func:`bayesprism.ingest.joblayout.reconcile_layout` merges over the run's files.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bayesprism.errors import Problem
from bayesprism.ingest import pipeline
from bayesprism.ingest.groups import (
    COORDINATES,
    DIMENSION_ROLE,
    ROLES,
    Group,
    GroupUsage,
    rank_coordinates,
    rank_dimensions,
)
from bayesprism.schema import COLLECTIVE_CLASSES, category_in, codes_and_labels

#: Separates the fields of a place key (never in a kernel name).
KEY_SEP = "\x1f"
#: Kernel classes whose first launch opens the step's tail (with dp/global collectives).
TAIL_CLASSES = ("optimizer",)
ROLE_DTYPE = pd.CategoricalDtype(list(ROLES))


def _usage(df: pd.DataFrame) -> dict[str, GroupUsage]:
    """What the rank runs on each of its groups, and how early in the step."""
    pg_codes, pg_names = codes_and_labels(df["process_group"])
    mask = pg_codes >= 0
    if not mask.any():
        return {}
    order_in_step = df.groupby("step", sort=False).cumcount().to_numpy()
    size_of_step = df.groupby("step", sort=False)["step"].transform("size").to_numpy()
    early = order_in_step < 0.5 * size_of_step
    class_codes, class_names = codes_and_labels(df["kernel_class"])
    out = {}
    for code in np.unique(pg_codes[mask]):
        rows = pg_codes == code
        classes = frozenset(class_names[c] for c in np.unique(class_codes[rows]) if c >= 0)
        out[pg_names[code]] = GroupUsage(classes, float(early[rows].mean()))
    return out


def _chunks(df: pd.DataFrame, is_op: np.ndarray) -> np.ndarray:
    """Chunk index of every row in its step: point-to-point ops seen before it (the op itself
    closes the chunk before it). Rows are in step order."""
    step = df["step"].to_numpy()
    total = np.cumsum(is_op.astype(np.int64))
    first = np.r_[True, step[1:] != step[:-1]]
    before_step = (total - is_op)[np.maximum.accumulate(np.where(first, np.arange(len(step)), 0))]
    return (total - is_op - before_step).astype(np.int64)


def _combined(*codes: np.ndarray) -> np.ndarray:
    """One int64 key per row from non-negative integer columns (mixed radix)."""
    key = np.zeros(len(codes[0]), dtype=np.int64)
    for column in codes:
        key = key * (int(column.max(initial=0)) + 1) + column
    return key


def _split(key: np.ndarray, *codes: np.ndarray) -> list[tuple[int, ...]]:
    """The columns of :func:`_combined` keys back (``codes``: the columns it was made of)."""
    radices = [int(c.max(initial=0)) + 1 for c in codes]
    parts = []
    rest = key.copy()
    for radix in reversed(radices):
        parts.append(rest % radix)
        rest = rest // radix
    return list(zip(*(p.tolist() for p in reversed(parts)), strict=True))


def ordinals(key: np.ndarray) -> np.ndarray:
    """Each row's rank among the earlier rows with the same key (a cumulative count).

    Examples
    --------
    >>> ordinals(np.array([5, 3, 5, 5, 3])).tolist()
    [0, 0, 1, 2, 1]
    """
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    index = np.arange(len(key))
    start = np.r_[True, sorted_key[1:] != sorted_key[:-1]] if len(key) else np.zeros(0, bool)
    rank = index - np.maximum.accumulate(np.where(start, index, 0))
    out = np.empty_like(rank)
    out[order] = rank
    return out


def _chunk_kinds(step: np.ndarray, chunk: np.ndarray, kernel_code: np.ndarray) -> np.ndarray:
    """A code per (step, chunk) for its content: chunks running the same kernels in the same
    order share it (every micro-batch's forward on a stage, for instance). Rows are in time
    order within a step, so each chunk is one contiguous run of rows."""
    kinds = np.empty(len(step), dtype=np.int64)
    if len(step) == 0:
        return kinds
    starts = np.flatnonzero(np.r_[True, (np.diff(step) != 0) | (np.diff(chunk) != 0)])
    ends = np.r_[starts[1:], len(step)]
    codes = kernel_code.astype(np.int32)
    kind_of_content: dict[bytes, int] = {}
    for a, b in zip(starts, ends, strict=True):
        kinds[a:b] = kind_of_content.setdefault(codes[a:b].tobytes(), len(kind_of_content))
    return kinds


def launch_config(grid: list, block: list) -> np.ndarray:
    """A short grid/block text per row (``"132x1x1/384x1x1"``; "" when the trace has none).

    Examples
    --------
    >>> launch_config([[132, 1, 1], None], [[384, 1, 1], None]).tolist()
    ['132x1x1/384x1x1', '']
    """
    def text(value) -> str:
        if isinstance(value, (list, tuple)):
            return "x".join(str(v) for v in value)
        return "" if value is None else str(value)

    # hash the values once per row (the trace reader gives tuples; lists, as a caller may
    # pass, are compared by their text), format the few distinct ones
    codes, first = distinct_codes(list(zip(grid, block, strict=True)))
    labels = np.array(["" if grid[i] is None and block[i] is None
                       else f"{text(grid[i])}/{text(block[i])}" for i in first], dtype=object)
    return labels[codes]


def distinct_codes(keys: list) -> tuple[np.ndarray, np.ndarray]:
    """An integer code per key (equal keys, equal codes, in order of first appearance) and
    the position of each code's first key. A dict, faster here than factorizing a Series of
    tuples; keys that cannot be hashed (lists or dicts where a trace should hold numbers)
    are compared by their text instead.

    Examples
    --------
    >>> codes, first = distinct_codes([("a", 1), ("b", 2), ("a", 1), ([3], None)])
    >>> codes.tolist(), first.tolist()
    ([0, 1, 0, 2], [0, 1, 3])
    """
    distinct: dict = {}
    try:
        codes = np.fromiter((distinct.setdefault(k, len(distinct)) for k in keys),
                            dtype=np.int64, count=len(keys))
    except TypeError:
        distinct = {}
        codes = np.fromiter((distinct.setdefault(repr(k), len(distinct)) for k in keys),
                            dtype=np.int64, count=len(keys))
    return codes, np.unique(codes, return_index=True)[1]


def annotate_rank(df: pd.DataFrame, *, groups: dict[str, Group], rank: int,
                  world_size: int | None, op_names: np.ndarray, launch: np.ndarray,
                  source: str) -> tuple[pd.DataFrame, dict, list[Problem]]:
    """Roles, coordinates, micro-batches, phases and place keys of one rank's rows.

    Parameters
    ----------
    df
        The rank's trace rows sorted by step and start time.
    groups
        The rank's process groups (:func:`bayesprism.ingest.groups.collect_groups`).
    rank, world_size
        From ``distributedInfo``.
    op_names
        ``Collective name`` of each row (None for compute kernels).
    launch
        Grid/block text of each row (:func:`launch_config`).
    source
        The file, named in problems and notes.

    Returns
    -------
    (df, layout, problems)
        ``layout``: the file's groups with dimension and provenance, coordinates, sizes, and
        what its pipeline ops say (``schedule``, ``microbatches`` or ``schedule_note``).
    """
    df = df.copy()
    n = len(df)
    usage = _usage(df)
    dimension, provenance = rank_dimensions(groups, rank, world_size, usage)
    coords, sizes, problems = rank_coordinates(groups, dimension, rank, source)
    layout: dict = {
        "groups": {name: {"description": g.description, "ranks": list(g.ranks),
                          "dimension": dimension.get(name), "provenance": provenance.get(name),
                          "classes": sorted(usage[name].classes) if name in usage else []}
                   for name, g in groups.items()},
        "coordinates": coords, "sizes": sizes,
        "size_provenance": {dim: min(provenance[name] for name, d in dimension.items()
                                     if d == dim) for dim in sizes},
    }
    pg_codes, pg_names = codes_and_labels(df["process_group"])
    role_of_group = np.array([DIMENSION_ROLE.get(dimension.get(str(p))) for p in pg_names]
                             + [None], dtype=object)
    role = role_of_group[pg_codes]
    coll = category_in(df["kernel_class"], COLLECTIVE_CLASSES)
    size = df["group_size"].astype("float64").to_numpy(na_value=np.nan)
    if world_size:
        role[coll & pd.isna(role) & (size == world_size)] = "global"
    df["role"] = pd.Categorical(role, dtype=ROLE_DTYPE)
    for column in COORDINATES.values():
        df[column] = pd.arrays.IntegerArray(np.full(n, coords.get(column, 0), dtype=np.int64),
                                            np.full(n, column not in coords))

    kinds = np.full(n, None, dtype=object)
    for i in np.flatnonzero(coll & (role == "pp")):
        kinds[i] = pipeline.op_kind(op_names[i])
    is_op = kinds != None  # noqa: E711 (element-wise on an object array)
    chunk = _chunks(df, is_op) if is_op.any() else np.zeros(n, dtype=np.int64)
    step = df["step"].to_numpy()
    if is_op.any() and "pp" in sizes and "pp_stage" in coords:
        _label_pipeline(df, step, chunk, is_op, kinds, role, coords["pp_stage"], sizes["pp"],
                        layout)

    kernel_code, kernel_names = codes_and_labels(df["kernel"])
    # The chunk's phase joins its content: a forward and a backward may launch the same names
    phase_code = (codes_and_labels(df["phase"])[0] + 1 if "phase" in df
                  else np.zeros(n, dtype=np.int64))
    kind = _chunk_kinds(step, chunk, kernel_code * 16 + phase_code % 16)
    stage = coords.get("pp_stage", 0)
    launch_code, launch_names = pd.factorize(launch)
    step_code = pd.factorize(step)[0]
    ordinal = ordinals(_combined(step_code, chunk, kernel_code, launch_code))
    key = _combined(kernel_code, launch_code, kind, ordinal)
    key_values, key_codes = np.unique(key, return_inverse=True)
    key_uniques = _split(key_values, kernel_code, launch_code, kind, ordinal)
    launch_of = np.asarray(launch_names, dtype=object)
    labels = [KEY_SEP.join((kernel_names[k], launch_of[lc], str(stage), str(c), str(o)))
              for k, lc, c, o in key_uniques]
    # Collectives: the kernel name and the role, since one NCCL kernel serves several groups
    # (a ReduceScatter of TP activations and of DP gradients); codes past the place keys
    # index these labels.
    coll_label, coll_code = np.unique(np.array(
        [f"{kernel_names[k]} [{r}]" if r is not None else kernel_names[k]
         for k, r in zip(kernel_code[coll], role[coll], strict=True)], dtype=object),
        return_inverse=True)
    codes = key_codes.copy()
    codes[coll] = len(labels) + coll_code
    df["signature"] = pd.Categorical.from_codes(
        codes, categories=labels + list(coll_label)).remove_unused_categories()
    return df, layout, problems


def _label_pipeline(df, step, chunk, is_op, kinds, role, stage: int, stages: int,
                    layout: dict) -> None:
    """Micro-batch, phase and send/recv pairing from the recognised schedule (in place)."""
    steps = pd.unique(step)
    kinds_by_step = [list(kinds[is_op & (step == s)]) for s in steps]
    schedule, microbatches, why_not = pipeline.infer_schedule(kinds_by_step, stage, stages)
    layout["pipeline"] = {"stage": stage, "schedule": schedule, "microbatches": microbatches,
                          "note": why_not}
    if schedule is None:
        return
    plan = pipeline.schedule_ops(schedule, stage, stages, microbatches)
    instances = np.array(pipeline.message_instances(plan, microbatches), dtype=np.int64)
    labels = [pipeline.chunk_label(work) for work in plan.chunks]
    phase_of_chunk = np.array([p for p, _ in labels], dtype=object)
    mb_of_chunk = np.array([-1 if m is None else m for _, m in labels], dtype=np.int64)
    op_index = (pd.Series(is_op.astype(np.int64)).groupby(step).cumsum().to_numpy() - 1)
    occurrence = df["occurrence"].to_numpy(dtype="float64", na_value=np.nan).copy()
    occurrence[is_op] = instances[op_index[is_op]]
    df["occurrence"] = pd.array(occurrence, dtype="Float64").astype("Int64")
    group_size = df["group_size"].to_numpy(dtype="float64", na_value=np.nan).copy()
    group_size[is_op] = 2
    df["group_size"] = pd.array(group_size, dtype="Float64").astype("Int64")
    phase = phase_of_chunk[chunk]
    microbatch = mb_of_chunk[chunk].astype("float64")
    # The step's tail: from the last chunk's first data-parallel/global collective or
    # optimizer kernel on (the optimizer step, gradient and parameter collectives).
    last = chunk == len(plan.ops)
    opener = last & ((role == "dp") | (role == "global")
                     | category_in(df["kernel_class"], TAIL_CLASSES))
    tail = np.zeros(len(df), dtype=bool)
    for s in steps:
        rows = np.flatnonzero((step == s) & opener)
        if len(rows):
            tail[rows[0]:np.flatnonzero(step == s)[-1] + 1] = True
    phase[tail] = "optimizer"
    microbatch[tail | (microbatch < 0) | is_op] = np.nan
    df["phase"] = pd.Categorical(phase)
    df["microbatch"] = pd.array(microbatch, dtype="Float64").astype("Int64")


__all__ = ["KEY_SEP", "annotate_rank", "distinct_codes", "launch_config", "ordinals"]
