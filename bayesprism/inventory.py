"""What the traced run executed: the ``inventory`` group of a posterior (docs/artifacts.md).

NumPy/pandas only. Two kinds of inventory:

* **kernel tables** (:func:`kernel_inventory`): per kernel its class, launches per rank and step,
  message bytes, group size and parallel role; per rank its node and GPU; per (step, rank) the
  span of the rank's GPU work; ``attrs["traced_plan"]`` as JSON. Built from
  :class:`InventoryPart` values, which reduce rows file by file and merge, so that streamed
  trace files (:mod:`bayesprism.statistics.stream`) get the table's inventory without the
  table (:func:`inventory_of_parts`); a table is one part.
* **step-level tables** (MLPerf logs, every row ``kernel_class == "step"``,
  :func:`step_inventory`): per run its layout (``world_size``, ``gpus_per_node``, ``dp``, ``tp``,
  ``pp``, ``cp``, ``microbatches``, ``virtual_stages``, ``micro_batch_size``), the number of
  logged steps, and the observed step times ``step_time_s`` (run, step_index) in logged order,
  NaN-padded to the longest run (warm-up steps included: the inventory records what was logged,
  the model decides what to fit).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism.errors import InputError, Problem
from bayesprism.schema import category_in, string_values

COLLECTIVE_CLASSES: tuple[str, ...] = (
    "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv",
)

#: Parallel roles whose collectives synchronise the ranks of one pipeline stage's group.
STAGE_GROUP_ROLES: tuple[str, ...] = ("tp", "cp", "ep")

#: Which parallel dimension a collective of each class most likely serves when the group size
#: matches several of them (e.g. dp == tp): first match wins.
ROLE_PREFERENCE: dict[str, tuple[str, ...]] = {
    "alltoall": ("ep", "cp", "tp", "dp"),
    "sendrecv": ("pp", "cp", "tp", "dp", "ep"),
    "allreduce": ("dp", "tp", "cp", "ep"),
    "allgather": ("dp", "tp", "cp", "ep"),
    "reducescatter": ("dp", "tp", "cp", "ep"),
    "broadcast": ("dp", "tp", "cp", "ep"),
}


def _positive_int(value) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 1 and number == float(value) else None


def run_layout(run: str, meta: dict, source: str = "table") -> tuple[dict, list[Problem]]:
    """The parallel layout of one run from its ``attrs["runs"][run]`` entry.

    Parameters
    ----------
    run
        Run label (used in messages).
    meta
        The run's metadata: ``world_size`` (or ``gpus``), ``gpus_per_node``,
        ``global_batch_size`` and ``plan`` (``dp``, ``tp``, ``pp``, ``cp``, ``ep``,
        ``microbatches``, ``virtual_stages``, ``micro_batch_size``).
    source
        Name used in problems.

    Returns
    -------
    (layout, problems)
        ``layout`` has ``world_size, gpus_per_node, dp, tp, pp, cp, ep, microbatches,
        virtual_stages, micro_batch_size`` (float) and ``micro_batch_size_known``; missing sizes
        default to 1 and ``dp`` to ``world_size / (tp·pp·cp)``. ``microbatches`` is None when
        not logged (a problem for the step model, reported in ``problems``).
    """
    problems: list[Problem] = []
    plan = dict(meta.get("plan") or {})
    field = f"attrs.runs[{run!r}]"
    layout: dict = {}

    def read(name: str, value, default=None):
        if value is None:
            return default
        number = _positive_int(value)
        if number is None:
            problems.append(Problem(source, f"{field}.{name}", "must be a positive integer",
                                    example=value))
        return number

    for name in ("tp", "pp", "cp", "ep", "virtual_stages"):
        layout[name] = read(f"plan.{name}", plan.get(name), 1) or 1
    layout["microbatches"] = read("plan.microbatches", plan.get("microbatches"))
    if layout["microbatches"] is None and "microbatches" not in plan:
        problems.append(Problem(source, f"{field}.plan.microbatches",
                                "is missing (gradient-accumulation steps per DP rank)"))
    world = read("world_size", meta.get("world_size", meta.get("gpus", plan.get("world_size"))))
    model_parallel = layout["tp"] * layout["pp"] * layout["cp"]
    dp = read("plan.dp", plan.get("dp"))
    if dp is None and world is not None:
        dp = max(world // model_parallel, 1)
    if world is None and dp is not None:
        world = dp * model_parallel
    if world is None:
        problems.append(Problem(source, f"{field}.world_size", "is missing (and plan.dp too)"))
    elif dp * model_parallel != world:
        problems.append(Problem(source, f"{field}.plan",
                                f"dp*tp*pp*cp = {dp * model_parallel} differs from world_size "
                                f"{world}", example=plan))
    layout["world_size"], layout["dp"] = world, dp
    layout["gpus_per_node"] = read("gpus_per_node",
                                   meta.get("gpus_per_node", plan.get("gpus_per_node")), 8) or 8
    mbs = plan.get("micro_batch_size", meta.get("micro_batch_size"))
    batch = meta.get("global_batch_size", meta.get("global_batch"))
    if mbs is None and batch is not None and dp and layout["microbatches"]:
        mbs = float(batch) / (dp * layout["microbatches"])
    layout["micro_batch_size"] = float(mbs) if mbs is not None else 1.0
    layout["micro_batch_size_known"] = mbs is not None
    return layout, problems


def is_step_table(table: pd.DataFrame) -> bool:
    """True when every row is a step-level row (``kernel_class == "step"``)."""
    return len(table) > 0 and bool(category_in(table["kernel_class"], ["step"]).all())


def traced_plan(table: pd.DataFrame) -> dict:
    """The parallel plan of the traced run, from ``table.attrs`` (dp defaults to world size).

    Uses the run with the most rows when the table holds several. Keys: ``dp, tp, pp, cp, ep,
    microbatches, gpus_per_node, world_size`` (``microbatches`` None when unknown), ``known``
    (False when the trace carried no plan at all), and ``schedule`` and ``sharding`` where the
    run records them.

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"], "rank": [3], "node": ["a"], "gpu": [0]})
    >>> table.attrs = {"runs": {"r": {"plan": {"tp": 2}}}}
    >>> {k: traced_plan(table)[k] for k in ("dp", "tp", "world_size")}
    {'dp': 2, 'tp': 2, 'world_size': 4}
    """
    placed = table.loc[table["rank"] >= 0]
    node_gpus = placed[["node", "gpu"]].astype({"node": str}).drop_duplicates()
    rows = table["run"].astype(str).value_counts(sort=False)
    return _plan(table.attrs.get("runs") or {}, rows,
                 int(placed["rank"].max()) if len(placed) else None, node_gpus)


def _plan(runs_meta: dict, rows_per_run: pd.Series, max_rank: int | None,
          node_gpus: pd.DataFrame) -> dict:
    """:func:`traced_plan` from what it reads of the rows: rows per run, the largest rank
    and the distinct (node, gpu) pairs of ranks >= 0."""
    run = _mode(rows_per_run) if len(rows_per_run) else None
    meta = dict(runs_meta.get(run) or {})
    plan = dict(meta.get("plan") or {})
    world = _positive_int(meta.get("world_size", plan.get("world_size")))
    if world is None:
        world = max_rank + 1 if max_rank is not None else 1
    sizes = {k: _positive_int(plan.get(k)) or 1 for k in ("tp", "pp", "cp", "ep")}
    dp = _positive_int(plan.get("dp")) or max(world // (sizes["tp"] * sizes["pp"] * sizes["cp"]), 1)
    gpus_per_node = _positive_int(meta.get("gpus_per_node", plan.get("gpus_per_node")))
    if gpus_per_node is None:
        per_node = node_gpus.drop_duplicates().groupby("node")["gpu"].nunique()
        gpus_per_node = int(per_node.max()) if len(per_node) else 1
    out = {"dp": dp, **sizes, "microbatches": _positive_int(plan.get("microbatches")),
           "gpus_per_node": gpus_per_node, "world_size": world, "known": bool(plan)}
    # what the traces say of the schedule and the optimizer's sharding (bayesprism.ingest)
    for key in ("schedule", "sharding"):
        if isinstance(plan.get(key), str):
            out[key] = plan[key]
    return out


def _mode(counts: pd.Series):
    """The label with the largest count (summed over repeated labels); ties: the smallest.

    Examples
    --------
    >>> _mode(pd.Series([2, 3, 3], index=["b", "c", "a"]))
    'a'
    """
    totals = counts.groupby(level=0).sum().sort_index()
    return totals.index[int(np.argmax(totals.to_numpy()))]


def collective_role(kernel_class: str, group_size: float, plan: dict) -> str:
    """The parallel role of a collective: which plan dimension its group size matches.

    Compute classes are ``"compute"``. With a known plan a group size equal to dp, tp, pp, cp or
    ep gives that role (ties broken by :data:`ROLE_PREFERENCE`; send/recv between pipeline
    stages is ``"pp"`` when pp > 1). Without a plan a world-size group is ``"dp"``. Anything else
    is ``"unknown"``.
    """
    if kernel_class not in COLLECTIVE_CLASSES:
        return "compute"
    if kernel_class == "sendrecv" and plan.get("known") and plan.get("pp", 1) > 1:
        return "pp"
    if group_size is None or not np.isfinite(group_size):
        return "unknown"
    size = int(group_size)
    if plan.get("known"):
        for role in ROLE_PREFERENCE[kernel_class]:
            if plan.get(role, 1) > 1 and plan[role] == size:
                return role
        return "unknown"
    return "dp" if size == plan.get("world_size") and size > 1 else "unknown"


def _typical(counts: pd.DataFrame, column: str, kernels: list[str]) -> pd.Series:
    """Per kernel, the most common value of ``column`` in ``counts`` (kernel, column, n);
    ties: the smallest (absent kernels: missing)."""
    if not len(counts):
        return pd.Series(index=pd.Index(kernels, dtype=object), dtype=object)
    totals = counts.groupby(["kernel", column], sort=True)["n"].sum().reset_index()
    # a stable sort by count keeps the smallest value first among ties
    best = totals.sort_values("n", ascending=False, kind="stable").drop_duplicates("kernel")
    return best.set_index("kernel")[column].reindex(kernels)


class InventoryPart:
    """What :func:`kernel_inventory` reads of a table's rows, reduced and mergeable.

    A trace file's rows reduce to a few small frames (launches per kernel and rank, the ranks'
    steps and placement, message bytes and group sizes per kernel, each rank-step's span and
    the idle time before its synchronisations) that merge across files, so the inventory of
    10^4 rank files is built without holding their rows: :func:`inventory_of_parts` finishes
    it. Kernels are labels as given (place keys while the signatures are not yet decided,
    renamed by ``inventory_of_parts(mapping=)``); every frame carries the run, so runs can be
    left out at the end (micro-benchmarks).

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"] * 2, "step": [0, 1], "node": ["a"] * 2,
    ...                       "gpu": [0, 0], "rank": [0, 0], "kernel": ["k"] * 2,
    ...                       "kernel_class": ["gemm"] * 2, "duration_us": [1.0, 2.0]})
    >>> part = InventoryPart.of(table.iloc[:1])
    >>> part.merge(InventoryPart.of(table.iloc[1:]))
    >>> inventory_of_parts(part, {})["launches"].values.tolist()
    [[1.0]]
    """

    FRAMES = ("launches", "steps", "placement", "node_gpus", "values", "group_sizes", "roles",
              "spans", "node_spans", "syncs")

    def __init__(self) -> None:
        self.frames: dict[str, list[pd.DataFrame]] = {name: [] for name in self.FRAMES}
        #: whether any rows had a ``phase`` / a ``pp_stage`` / a ``start_us``
        self.phases = self.stages = self.starts = False
        self.max_stage = 0

    #: Frames of one name kept apart before they are joined into one: a DataFrame costs ~40 kB
    #: beyond its rows, which for 10^3 files' parts (ten small frames each) was most of a
    #: merged part's memory (64 dev ranks: 31 MB merged, 4 MB of rows).
    JOIN_AT = 16

    def merge(self, other: InventoryPart) -> None:
        """Add another part's rows (kept in order: earlier parts first)."""
        for name in self.FRAMES:
            frames = self.frames[name]
            frames.extend(other.frames[name])
            if len(frames) >= self.JOIN_AT:
                self.frames[name] = [pd.concat(frames, ignore_index=True)]
        self.phases |= other.phases
        self.stages |= other.stages
        self.starts |= other.starts
        self.max_stage = max(self.max_stage, other.max_stage)

    def frame(self, name: str, runs: set[str] | None = None) -> pd.DataFrame:
        """One of :data:`FRAMES`, the parts' rows together (only ``runs`` when given)."""
        frames = self.frames[name]
        out = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (
            frames[0] if frames else pd.DataFrame({"run": pd.Series([], dtype=object)}))
        return out if runs is None else out.loc[out["run"].isin(runs)]

    @classmethod
    def of(cls, table: pd.DataFrame) -> InventoryPart:
        """The part of a table's kernel-level rows (step-level rows left out)."""
        part = cls()
        rows = table.loc[~category_in(table["kernel_class"], ["step"])]
        if not len(rows):
            return part
        base = pd.DataFrame({
            "run": string_values(rows["run"]),
            "kernel": string_values(rows["kernel"]),
            "kernel_class": string_values(rows["kernel_class"]),
            "rank": rows["rank"].to_numpy(dtype=np.int64),
            "step": rows["step"].to_numpy(dtype=np.int64),
        })
        part.phases = "phase" in rows.columns and bool(rows["phase"].notna().any())
        base["tail"] = category_in(rows["phase"], ["optimizer"]) if part.phases else False
        part.frames["launches"].append(
            base.groupby(["run", "kernel", "kernel_class", "rank"], sort=True)["tail"]
            .agg(n="size", tail_n="sum").reset_index())
        part.frames["steps"].append(base[["run", "rank", "step"]].drop_duplicates())
        part.stages = "pp_stage" in rows.columns and bool(rows["pp_stage"].notna().any())
        stage = (rows["pp_stage"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
                 if part.stages else np.full(len(rows), np.nan))
        part.max_stage = int(np.nan_to_num(stage, nan=0.0).max())
        node = string_values(rows["node"])
        gpu = rows["gpu"].to_numpy(dtype=np.int64)
        part.frames["placement"].append(
            pd.DataFrame({"run": base["run"], "rank": base["rank"], "node": node, "gpu": gpu,
                          "pp_stage": stage})
            .groupby("rank", sort=True).first().reset_index())
        placed = base["rank"].to_numpy() >= 0
        part.frames["node_gpus"].append(pd.DataFrame(
            {"run": base["run"].to_numpy()[placed], "node": node[placed],
             "gpu": gpu[placed]}).drop_duplicates())
        _add_kernel_values(part, rows, base, np.nan_to_num(stage, nan=0.0).astype(np.int64))
        if "start_us" in rows.columns and rows["start_us"].notna().any():
            part.starts = True
            _add_spans(part, rows, base, node)
        return part


def _add_kernel_values(part: InventoryPart, rows: pd.DataFrame, base: pd.DataFrame,
                       stage: np.ndarray) -> None:
    """Message bytes per (kernel, stage), group sizes and traced roles per kernel."""
    keys = ["run", "kernel"]
    if "bytes" in rows.columns:
        nbytes = pd.to_numeric(rows["bytes"], errors="coerce").to_numpy(dtype=float)
        has = ~np.isnan(nbytes)
        part.frames["values"].append(
            pd.DataFrame({"run": base["run"].to_numpy()[has],
                          "kernel": base["kernel"].to_numpy()[has], "stage": stage[has],
                          "bytes": nbytes[has]})
            .groupby([*keys, "stage"], sort=True)["bytes"].agg(bytes_sum="sum", bytes_n="size")
            .reset_index())
    for column, name in (("group_size", "group_sizes"), ("role", "roles")):
        if column not in rows.columns:
            continue
        values = (pd.to_numeric(rows[column], errors="coerce") if column == "group_size"
                  else rows[column].astype(object)).to_numpy()
        has = pd.notna(values)
        if has.any():
            part.frames[name].append(
                pd.DataFrame({"run": base["run"].to_numpy()[has],
                              "kernel": base["kernel"].to_numpy()[has], column: values[has]})
                .groupby([*keys, column], sort=True).size().rename("n").reset_index())


def _add_spans(part: InventoryPart, rows: pd.DataFrame, base: pd.DataFrame,
               node: np.ndarray) -> None:
    """First start and last end per rank-step and per node-step, and each rank-step's
    segments between synchronisations (:func:`_rank_segments`)."""
    start = rows["start_us"].to_numpy(dtype=float)
    end = start + rows["duration_us"].to_numpy(dtype=float)
    spans = pd.DataFrame({"run": base["run"], "step": base["step"], "rank": base["rank"],
                          "node": node, "start": start, "end": end})
    for name, keys in (("spans", ["run", "step", "rank"]), ("node_spans", ["run", "step", "node"])):
        grouped = spans.groupby(keys, sort=True)
        part.frames[name].append(pd.concat([grouped["start"].min(), grouped["end"].max()],
                                           axis=1).reset_index())
    is_coll = base["kernel_class"].isin(COLLECTIVE_CLASSES).to_numpy()
    # one string object per kernel name, shared by every sync that names it (pickled once: the
    # names of a part's syncs were most of its size)
    codes, names = pd.factorize(base["kernel"])
    kernels = names.to_numpy(dtype=object)[codes]
    syncs = []
    for (run, step, rank), ix in spans.groupby(["run", "step", "rank"], sort=True).indices.items():
        ix = ix[np.isfinite(start[ix])]
        if ix.size:
            syncs.append((run, step, rank, node[ix[0]],
                          *_rank_segments(ix, start, end, is_coll, kernels)))
    part.frames["syncs"].append(pd.DataFrame(
        syncs, columns=["run", "step", "rank", "node", "hi0", "cover0", "rest", "colls",
                        "covers"]))


def _rank_segments(ix: np.ndarray, start: np.ndarray, end: np.ndarray, is_coll: np.ndarray,
                   kernels: np.ndarray) -> tuple[float, float, np.ndarray, tuple, np.ndarray]:
    """One rank-step's segments between synchronisations (:func:`_sync_idle`), all but the
    first, whose start (the node's step start) needs the other ranks of the node: for it, its
    end and the time the rank's compute covers before it. The cover does not depend on where
    the segment starts, since every compute launch of the rank starts at or after the node's
    first one. Last, the compute each segment covers (the first's included), for
    :func:`_sync_segments`."""
    ix = ix[np.argsort(start[ix], kind="stable")]
    coll, comp = ix[is_coll[ix]], ix[~is_coll[ix]]
    lo = np.r_[start[ix[0]], end[coll]]
    hi = np.r_[start[coll], end[ix].max()]
    cover = _covered_lengths(start[comp], end[comp], lo, hi)
    length = hi[1:] - lo[1:]
    rest = np.where(length > 0, np.maximum(length - cover[1:], 0.0), 0.0)
    # an array, not a tuple of Python floats: 8 bytes a segment instead of 32, for every
    # rank-step of a merged part
    # the covers in float32 (a work-weighted mean of them is all that is kept)
    return float(hi[0]), float(cover[0]), rest, tuple(kernels[coll]), cover.astype(np.float32)


def kernel_inventory(table: pd.DataFrame) -> xr.Dataset:
    """The inventory of a kernel-level trace table (docs/artifacts.md, ``inventory`` group).

    A step-level table (every row ``kernel_class == "step"``) gets :func:`step_inventory`.
    Built as streamed tables are (:class:`InventoryPart` of the one table,
    :func:`inventory_of_parts`).

    Parameters
    ----------
    table
        A validated trace table; ``table.attrs`` may carry the traced plan (``runs``).

    Returns
    -------
    xarray.Dataset
        Variables ``kernel_class``, ``launches_per_step``, ``bytes_per_launch``, ``group_size``,
        ``role`` (kernel); ``launches`` (kernel, rank); ``rank_node``, ``rank_gpu``,
        ``rank_pp_stage`` (rank; -1 where the traces give no pipeline stage); ``tail_share``
        (kernel: share of launches in the step's tail, the optimizer step) and
        ``stage_bytes`` (kernel, pp_stage: mean bytes of a collective launch per stage);
        ``traced_step_time_us`` (step_unit, rank; NaN without ``start_us`` or where the rank ran
        nothing in that step); ``traced_step_span_us`` (step_unit: the step from the first
        kernel of any rank to the last end, the longest over nodes); ``traced_step_gap_us``
        (step_unit: the host time from the step's last kernel to the next step's first,
        :func:`_step_gaps`); ``traced_idle_us``
        (step_unit, rank, sync) and ``sync_role`` (sync): the rank's host idle time before each
        synchronisation (:func:`_sync_idle`). attrs ``kind="kernel"``, ``traced_plan`` (JSON),
        ``run``, ``platform``.

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"] * 3, "step": [0, 0, 1], "node": ["a"] * 3,
    ...                       "gpu": [0, 0, 0], "rank": [0, 0, 0], "kernel": ["k"] * 3,
    ...                       "kernel_class": ["gemm"] * 3, "duration_us": [1.0, 2.0, 3.0]})
    >>> kernel_inventory(table)["launches_per_step"].values.tolist()
    [1.5]
    """
    if len(table) == 0:
        raise InputError(Problem("table", "", "the table has no rows"))
    if is_step_table(table):
        return step_inventory(table)
    return inventory_of_parts(InventoryPart.of(table), table.attrs)


def inventory_of_parts(part: InventoryPart, attrs: dict, *, mapping: dict | None = None,
                       runs: set[str] | None = None) -> xr.Dataset:
    """The kernel inventory (:func:`kernel_inventory`) of merged :class:`InventoryPart`.

    Parameters
    ----------
    part
        The parts of every file or table, merged.
    attrs
        The run metadata (``runs``: the traced plan, platforms).
    mapping
        Kernel label → the name the inventory uses (place keys → kernel signatures,
        :func:`bayesprism.ingest.signatures.signature_map`); labels not in it are kept.
    runs
        The runs to describe (default: all).

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    InputError
        No kernel-level rows.

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"] * 2, "step": [0, 0], "node": ["a"] * 2,
    ...                       "gpu": [0, 0], "rank": [0, 0], "kernel": ["k1", "k2"],
    ...                       "kernel_class": ["gemm"] * 2, "duration_us": [1.0, 2.0]})
    >>> inv = inventory_of_parts(InventoryPart.of(table), {}, mapping={"k1": "k", "k2": "k"})
    >>> inv["launches_per_step"].values.tolist()
    [2.0]
    """

    def frame(name: str) -> pd.DataFrame:
        out = part.frame(name, runs)
        if mapping and "kernel" in out.columns:
            out = out.assign(kernel=out["kernel"].map(lambda k: mapping.get(k, k)))
        return out

    launch = frame("launches")
    if not len(launch):
        raise InputError(Problem("table", "", "the table has no rows"))
    kernels = sorted(launch["kernel"].unique().tolist())
    ranks = sorted(int(r) for r in launch["rank"].unique())
    steps = frame("steps").drop_duplicates()
    steps_per_rank = steps.groupby("rank").size().reindex(ranks)
    counts = (launch.groupby(["kernel", "rank"])["n"].sum().unstack("rank", fill_value=0)
              .reindex(index=kernels, columns=ranks, fill_value=0))
    launches = counts.to_numpy(dtype=float) / steps_per_rank.to_numpy(dtype=float)[None, :]
    kernel_class = _typical(launch, "kernel_class", kernels)
    is_collective = kernel_class.isin(COLLECTIVE_CLASSES).to_numpy()
    per_kernel = launch.groupby("kernel")[["n", "tail_n"]].sum().reindex(kernels)
    tail_share = (per_kernel["tail_n"].to_numpy(dtype=float) / per_kernel["n"].to_numpy(float)
                  if part.phases else (kernel_class == "optimizer").to_numpy(dtype=float))
    bytes_per_launch, stage_bytes = _bytes(frame("values"), kernels, is_collective,
                                           part.max_stage + 1)
    sizes = frame("group_sizes")
    group_size = np.where(is_collective, _typical(sizes, "group_size", kernels)
                          .to_numpy(dtype=float), np.nan)
    placement = frame("placement").groupby("rank", sort=True).first().reindex(ranks)
    rows_per_run = launch.groupby("run")["n"].sum()
    placed = [r for r in ranks if r >= 0]
    plan = _plan(attrs.get("runs") or {}, rows_per_run, max(placed) if placed else None,
                 frame("node_gpus")[["node", "gpu"]])
    roles = [collective_role(c, g, plan) for c, g in zip(kernel_class, group_size, strict=True)]
    traced = frame("roles")
    if len(traced):
        # roles read from the traces' process groups win over the group-size guess
        traced_role = _typical(traced, "role", kernels)
        roles = [str(traced_role[k]) if pd.notna(traced_role[k]) and c in COLLECTIVE_CLASSES
                 else r for k, c, r in zip(kernels, kernel_class, roles, strict=True)]
    stage_of_rank = (placement["pp_stage"].fillna(-1).to_numpy(dtype=np.int64)
                     if part.stages else np.full(len(ranks), -1, dtype=np.int64))
    step_units = sorted({f"{run}/{step}" for run, step in zip(steps["run"], steps["step"],
                                                              strict=True)},
                        key=_step_unit_key)
    span, step_span, span_note = _spans(part, frame, step_units, ranks)
    step_gap = _step_gaps(part, frame, step_units, step_span)
    role_of = dict(zip(kernels, roles, strict=True))
    idle, sync_role = _sync_idle(part, frame, step_units, ranks, role_of)
    segment_us, segment_share = _sync_segments(part, frame, role_of)
    run_names = sorted(set(launch["run"]))
    platforms = sorted({str(m.get("platform")) for m in (attrs.get("runs") or {}).values()
                        if m.get("platform")})
    plan_json = {k: v for k, v in plan.items() if k != "known"}
    return xr.Dataset(
        {
            "kernel_class": ("kernel", kernel_class.to_numpy(dtype=str).astype(object)),
            "launches_per_step": ("kernel", launches.mean(axis=1)),
            "launches": (("kernel", "rank"), launches),
            "bytes_per_launch": ("kernel", bytes_per_launch),
            "group_size": ("kernel", group_size),
            "role": ("kernel", np.array(roles, dtype=object)),
            "rank_node": ("rank", placement["node"].astype(str).to_numpy().astype(object)),
            "rank_gpu": ("rank", placement["gpu"].to_numpy(dtype=np.int64)),
            "rank_pp_stage": ("rank", stage_of_rank),
            "tail_share": ("kernel", tail_share),
            "stage_bytes": (("kernel", "pp_stage"), stage_bytes),
            "traced_step_time_us": (("step_unit", "rank"), span),
            "traced_step_span_us": ("step_unit", step_span),
            "traced_step_gap_us": ("step_unit", step_gap),
            "traced_idle_us": (("step_unit", "rank", "sync"), idle),
            "sync_role": ("sync", sync_role),
            "sync_segment_us": ((), segment_us),
            "sync_segment_share": ((), segment_share),
        },
        coords={"kernel": np.array(kernels, dtype=object), "rank": np.array(ranks),
                "pp_stage": np.arange(part.max_stage + 1),
                "step_unit": np.array(step_units, dtype=object),
                "sync": np.arange(idle.shape[-1])},
        attrs={"kind": "kernel", "traced_plan": json.dumps(plan_json, sort_keys=True),
               "plan_known": int(plan["known"]), "run": ",".join(run_names),
               "platform": ",".join(platforms), "traced_step_time_note": span_note},
    )


def _bytes(values: pd.DataFrame, kernels: list[str], is_collective: np.ndarray,
           stages: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean bytes of a launch per kernel, and per kernel and traced pipeline stage (NaN for
    kernels that are not collectives, and where no launch had bytes)."""
    if not len(values):
        return np.full(len(kernels), np.nan), np.full((len(kernels), stages), np.nan)
    per_kernel = values.groupby("kernel")[["bytes_sum", "bytes_n"]].sum().reindex(kernels)
    mean = per_kernel["bytes_sum"].to_numpy(dtype=float) / per_kernel["bytes_n"].to_numpy(float)
    by_stage = values.groupby(["kernel", "stage"])[["bytes_sum", "bytes_n"]].sum()
    by_stage = ((by_stage["bytes_sum"] / by_stage["bytes_n"]).unstack("stage")
                .reindex(index=kernels, columns=range(stages)).to_numpy(dtype=float, copy=True))
    by_stage[~is_collective] = np.nan
    return np.where(is_collective, mean, np.nan), by_stage


def _spans(part: InventoryPart, frame, step_units: list, ranks: list
           ) -> tuple[np.ndarray, np.ndarray, str]:
    """Each rank's span per step and the step's span (the longest over nodes, whose ranks
    share a clock), from the first start and last end of :class:`InventoryPart`."""
    if not part.starts:
        return (np.full((len(step_units), len(ranks)), np.nan),
                np.full(len(step_units), np.nan), "no start_us column: step spans unknown")
    out = []
    for name, column in (("spans", "rank"), ("node_spans", "node")):
        found = frame(name)
        unit = found["run"].astype(str) + "/" + found["step"].astype(str)
        grouped = found.assign(step_unit=unit).groupby(["step_unit", column])
        out.append((grouped["end"].max() - grouped["start"].min()).unstack(column)
                   .reindex(index=step_units))
    span = out[0].reindex(columns=ranks).to_numpy(dtype=float)
    return span, out[1].max(axis=1).to_numpy(dtype=float), "span from start_us and duration_us"


def traced_step_times_us(inventory: xr.Dataset) -> np.ndarray:
    """The traced steps as users time them, from one step's start to the next's (µs; NaN where
    unknown): each step's span (``traced_step_span_us``) plus its boundary gap
    (``traced_step_gap_us``; for a step without one, a run's last, the median of the others).
    Inventories written before the gap was recorded: the span.

    Examples
    --------
    >>> inv = xr.Dataset({"traced_step_span_us": ("step_unit", [300.0, 320.0, 310.0]),
    ...                   "traced_step_gap_us": ("step_unit", [10.0, 14.0, np.nan])})
    >>> traced_step_times_us(inv).tolist()
    [310.0, 334.0, 322.0]
    """
    span = inventory["traced_step_span_us"].to_numpy().astype(float)
    if "traced_step_gap_us" not in inventory:
        return span
    gap = inventory["traced_step_gap_us"].to_numpy().astype(float)
    typical = float(np.median(gap[np.isfinite(gap)])) if np.isfinite(gap).any() else 0.0
    return span + np.where(np.isfinite(gap), gap, typical)


def _step_gaps(part: InventoryPart, frame, step_units: list, step_span: np.ndarray
               ) -> np.ndarray:
    """Per traced step, the host time at its boundary: from the step's last kernel end to the
    next step's first kernel (µs; NaN for a run's last step, before a step not traced next,
    and without ``start_us``).

    A step as users time it runs from one step's start to the next's (``ProfilerStep`` to
    ``ProfilerStep``), which holds the host work between steps (the loss or grad-norm read
    back, ``zero_grad``, the next batch, the first launches) besides the span of GPU work.
    Hosts' clocks differ, so each node's period (first kernel of the next step minus first
    kernel of this one, on its own clock) is compared with the step's span (the longest
    over nodes): the gap is the median period over nodes minus the span (>= 0; steps that
    overlap have no gap).
    """
    if not part.starts:
        return np.full(len(step_units), np.nan)
    spans = frame("node_spans").groupby(["run", "step", "node"])["start"].min().reset_index()
    spans = spans.sort_values(["run", "node", "step"], kind="stable")
    following = spans.groupby(["run", "node"])["step"].shift(-1)
    period = spans.groupby(["run", "node"])["start"].shift(-1) - spans["start"]
    consecutive = following.to_numpy(dtype=float) == spans["step"].to_numpy(dtype=float) + 1
    spans = spans.assign(period=np.where(consecutive, period, np.nan))
    unit = spans["run"].astype(str) + "/" + spans["step"].astype(str)
    median_period = spans.assign(step_unit=unit).groupby("step_unit")["period"].median()
    period_us = median_period.reindex(step_units).to_numpy(dtype=float)
    return np.maximum(period_us - step_span, 0.0)


def _covered_lengths(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray
                     ) -> np.ndarray:
    """Length of the union of the intervals [starts, ends) inside each window [lo, hi).

    The union is merged once into disjoint runs; the length covered up to ``x`` is then a
    lookup (the runs before it plus the part of its own), so every window costs a binary
    search, not a pass over the intervals.

    Examples
    --------
    >>> _covered_lengths(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0]),
    ...                  np.array([0.0, 2.5]), np.array([10.0, 5.5])).tolist()
    [4.0, 1.0]
    """
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if not starts.size:
        return np.zeros(np.shape(lo))
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], np.maximum.accumulate(ends[order])
    # a new run of overlapping intervals starts where an interval begins after all earlier end
    fresh = np.r_[True, starts[1:] > ends[:-1]]
    run_start = starts[fresh]
    run_end = np.r_[ends[np.flatnonzero(fresh)[1:] - 1], ends[-1]]
    before = np.r_[0.0, np.cumsum(run_end - run_start)[:-1]]

    def covered_upto(x: np.ndarray) -> np.ndarray:
        i = np.maximum(np.searchsorted(run_start, x, side="right") - 1, 0)
        inside = np.clip(x - run_start[i], 0.0, run_end[i] - run_start[i])
        return np.where(x > run_start[0], before[i] + inside, 0.0)

    return np.maximum(covered_upto(hi) - covered_upto(lo), 0.0)


def _sync_idle(part: InventoryPart, frame, step_units: list, ranks: list,
               role_of: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Host idle time of each rank before each synchronisation of each step.

    A rank's step is cut at its collectives (in start order): segment ``j`` runs from the
    release of the previous collective (its end; for ``j = 0`` the start of the step, i.e. the
    earliest first kernel of the ranks of the same node, whose clock is shared) to the start
    of collective ``j`` (the rank's arrival), and the last segment from the last collective's
    end to the rank's last kernel end. The idle time of a segment is its length minus the time
    the rank's non-collective kernels cover in it (union of their intervals): host work and
    launch gaps, never the waiting inside collectives (which the composition recreates).
    Segments are aligned across ranks and steps by their order; a rank-step with fewer
    collectives has NaN in the missing ones. Collectives that overlap compute on another stream
    shorten segments (idle is then understated, never negative). Each rank-step's segments
    come from :func:`_rank_segments` (where its file was read); the first is finished here,
    where the node's step start is known.

    Returns
    -------
    (idle, sync_role)
        ``idle`` (step_unit, rank, sync) in µs, all NaN (one segment) without ``start_us``;
        ``sync_role`` (sync): the parallel role of the collective ending each segment (the most
        common over rank-steps), ``"step"`` for the last segment.
    """
    syncs = frame("syncs") if part.starts else None
    if syncs is None or not len(syncs):
        return (np.full((len(step_units), len(ranks), 1), np.nan),
                np.array(["step"], dtype=object))
    node_start = frame("node_spans").groupby(["run", "step", "node"])["start"].min()
    first = node_start.reindex(pd.MultiIndex.from_frame(syncs[["run", "step", "node"]]))
    unit_ix = {u: i for i, u in enumerate(step_units)}
    rank_ix = {r: i for i, r in enumerate(ranks)}
    width = 1 + max(len(rest) for rest in syncs["rest"])
    idle = np.full((len(step_units), len(ranks), width), np.nan)
    for row, a in zip(syncs.itertuples(index=False), first.to_numpy(dtype=float), strict=True):
        values = np.r_[max(0.0, (row.hi0 - a) - row.cover0) if row.hi0 > a else 0.0, row.rest]
        u, r = unit_ix[f"{row.run}/{row.step}"], rank_ix[int(row.rank)]
        idle[u, r, : len(values) - 1] = values[:-1]
        idle[u, r, width - 1] = values[-1]  # the step's end is the last segment of every rank
    sync_role = []
    for j in range(width - 1):
        found = [role_of[colls[j]] for colls in syncs["colls"] if len(colls) > j]
        sync_role.append(str(_mode(pd.Series(1, index=found))) if found else "unknown")
    return idle, np.array([*sync_role, "step"], dtype=object)


def _sync_segments(part: InventoryPart, frame, role_of: dict[str, str]) -> tuple[float, float]:
    """How a rank's compute falls between the synchronisations of its stage group.

    The ranks of a tensor-, context- or expert-parallel group (:data:`STAGE_GROUP_ROLES`) meet
    at each of their collectives, so each waits there for the slowest member's compute since
    the previous one: a segment is the compute a rank covers from one such collective to the
    next (other collectives, e.g. pipeline transfers, do not end it). Over all traced
    rank-steps, the work-weighted mean segment length ``sum b^2 / sum b`` (µs) and the share
    of the ranks' compute in segments that end at a group collective; both NaN without
    ``start_us`` or without such collectives. The composition turns them into the waiting
    that launch-to-launch noise adds at every such collective
    (``bayesprism.forecast.composition``).

    Examples
    --------
    3 µs of compute before a TP collective, 1 µs before a pipeline transfer and 1 µs more
    before the next TP collective (one segment of 2 µs), 2 µs after it to the step's end:

    >>> import types
    >>> syncs = pd.DataFrame({"covers": [np.array([3.0, 1.0, 1.0, 2.0])],
    ...                       "colls": [("ag", "send", "ag")]})
    >>> part = types.SimpleNamespace(starts=True)
    >>> _sync_segments(part, lambda name: syncs, {"ag": "tp", "send": "pp"})
    (2.6, 0.7142857142857143)
    """
    syncs = frame("syncs") if part.starts else None
    if syncs is None or not len(syncs) or "covers" not in syncs:
        return math.nan, math.nan
    grouped = {name for name, role in role_of.items() if role in STAGE_GROUP_ROLES}
    total, work, square = [], [], []
    for covers, colls in zip(syncs["covers"], syncs["colls"], strict=True):
        ends = np.flatnonzero(np.fromiter((name in grouped for name in colls), bool,
                                          len(colls)))
        total.append(float(covers.sum()))
        if ends.size:
            done = np.cumsum(covers)[ends]
            segments = np.diff(done, prepend=0.0)
            work.append(float(done[-1]))
            square.append(float(segments @ segments))
    # exact sums: the same whatever order the parts of a streamed ingest arrive in
    work_us = math.fsum(work)
    if work_us <= 0.0:
        return math.nan, math.nan
    return math.fsum(square) / work_us, work_us / math.fsum(total)


def _step_unit_key(label: str) -> tuple[str, int]:
    run, _, step = label.rpartition("/")
    return run, int(step)


def step_inventory(table: pd.DataFrame) -> xr.Dataset:
    """The inventory of a step-level table: one entry per logged run.

    Parameters
    ----------
    table
        Rows with ``kernel_class == "step"``; ``attrs["runs"][run]`` as in :func:`run_layout`.

    Returns
    -------
    xarray.Dataset
        Per ``run``: ``platform`` (str), ``world_size``, ``gpus_per_node``, ``dp``, ``tp``,
        ``pp``, ``cp``, ``ep``, ``microbatches`` (−1 when not logged), ``virtual_stages``,
        ``micro_batch_size``, ``steps_logged``, ``step_time_median_s``; ``step_time_s`` (run,
        step_index): every logged step time in seconds, ordered by ``step``, NaN-padded.
        attrs ``kind="step"``, ``run`` (comma-separated run labels), ``platform``.
    """
    runs_meta = table.attrs.get("runs") or {}
    run_col = table["run"].astype(str)
    runs = sorted(run_col.unique().tolist())
    ordered = pd.DataFrame({"run": run_col.to_numpy(), "step": table["step"].to_numpy(),
                            "t": table["duration_us"].to_numpy(dtype=float) * 1e-6})
    ordered = ordered.sort_values(["run", "step"], kind="stable")
    ordered["index"] = ordered.groupby("run").cumcount()
    times = ordered.pivot(index="run", columns="index", values="t").reindex(runs)
    fields = ("world_size", "gpus_per_node", "dp", "tp", "pp", "cp", "ep", "microbatches",
              "virtual_stages")
    values: dict[str, list] = {f: [] for f in fields}
    mbs, platforms = [], []
    for run in runs:
        meta = runs_meta.get(run) or {}
        layout, _ = run_layout(run, meta)
        for f in fields:
            values[f].append(-1 if layout.get(f) is None else int(layout[f]))
        mbs.append(layout["micro_batch_size"] if layout["micro_batch_size_known"] else np.nan)
        platforms.append(str(meta.get("platform", "")))
    data = {f: ("run", np.array(v, dtype=np.int64)) for f, v in values.items()}
    data.update({
        "platform": ("run", np.array(platforms, dtype=object)),
        "micro_batch_size": ("run", np.array(mbs, dtype=float)),
        "steps_logged": ("run", times.notna().sum(axis=1).to_numpy(dtype=np.int64)),
        "step_time_median_s": ("run", times.median(axis=1).to_numpy(dtype=float)),
        "step_time_s": (("run", "step_index"), times.to_numpy(dtype=float)),
    })
    return xr.Dataset(
        data,
        coords={"run": np.array(runs, dtype=object),
                "step_index": np.arange(times.shape[1])},
        attrs={"kind": "step", "run": ",".join(runs),
               "platform": ",".join(sorted({p for p in platforms if p}))},
    )
