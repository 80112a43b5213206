"""What the traced run executed: the ``inventory`` group of a posterior (docs/artifacts.md).

NumPy/pandas only. Two kinds of inventory:

* **kernel tables** (:func:`kernel_inventory`): per kernel its class, launches per rank and step,
  message bytes, group size and parallel role; per rank its node and GPU; per (step, rank) the
  span of the rank's GPU work; ``attrs["traced_plan"]`` as JSON.
* **step-level tables** (MLPerf logs, every row ``kernel_class == "step"``,
  :func:`step_inventory`): per run its layout (``world_size``, ``gpus_per_node``, ``dp``, ``tp``,
  ``pp``, ``cp``, ``microbatches``, ``virtual_stages``, ``micro_batch_size``), the number of
  logged steps, and the observed step times ``step_time_s`` (run, step_index) in logged order,
  NaN-padded to the longest run (warm-up steps included: the inventory records what was logged,
  the model decides what to fit).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism.errors import InputError, Problem

COLLECTIVE_CLASSES: tuple[str, ...] = (
    "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv",
)

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
    return len(table) > 0 and bool((table["kernel_class"].astype(str) == "step").all())


def traced_plan(table: pd.DataFrame) -> dict:
    """The parallel plan of the traced run, from ``table.attrs`` (dp defaults to world size).

    Uses the run with the most rows when the table holds several. Keys: ``dp, tp, pp, cp, ep,
    microbatches, gpus_per_node, world_size`` (``microbatches`` None when unknown), ``known``
    (False when the trace carried no plan at all), and ``schedule`` and ``sharding`` where the
    run records them.
    """
    runs_meta = table.attrs.get("runs") or {}
    run = str(table["run"].astype(str).value_counts().index[0]) if len(table) else None
    meta = dict(runs_meta.get(run) or {})
    plan = dict(meta.get("plan") or {})
    ranks = table.loc[table["rank"] >= 0, "rank"]
    world = _positive_int(meta.get("world_size", plan.get("world_size")))
    if world is None:
        world = int(ranks.max()) + 1 if len(ranks) else 1
    sizes = {k: _positive_int(plan.get(k)) or 1 for k in ("tp", "pp", "cp", "ep")}
    dp = _positive_int(plan.get("dp")) or max(world // (sizes["tp"] * sizes["pp"] * sizes["cp"]), 1)
    gpus_per_node = _positive_int(meta.get("gpus_per_node", plan.get("gpus_per_node")))
    if gpus_per_node is None:
        per_node = table.loc[table["rank"] >= 0].groupby("node", observed=True)["gpu"].nunique()
        gpus_per_node = int(per_node.max()) if len(per_node) else 1
    out = {"dp": dp, **sizes, "microbatches": _positive_int(plan.get("microbatches")),
           "gpus_per_node": gpus_per_node, "world_size": world, "known": bool(plan)}
    # what the traces say of the schedule and the optimizer's sharding (bayesprism.ingest)
    for key in ("schedule", "sharding"):
        if isinstance(plan.get(key), str):
            out[key] = plan[key]
    return out


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


def _typical(values: pd.Series) -> float:
    values = values.dropna()
    if len(values) == 0:
        return float("nan")
    counts = values.value_counts()
    return float(counts.index[0])


def kernel_inventory(table: pd.DataFrame) -> xr.Dataset:
    """The inventory of a kernel-level trace table (docs/artifacts.md, ``inventory`` group).

    A step-level table (every row ``kernel_class == "step"``) gets :func:`step_inventory`.

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
        kernel of any rank to the last end, the longest over nodes); ``traced_idle_us``
        (step_unit, rank, sync) and ``sync_role`` (sync): the rank's host idle time before each
        synchronisation (:func:`_sync_idle`). attrs ``kind="kernel"``, ``traced_plan`` (JSON),
        ``run``, ``platform``.
    """
    if len(table) == 0:
        raise InputError(Problem("table", "", "the table has no rows"))
    if is_step_table(table):
        return step_inventory(table)
    rows = table.loc[table["kernel_class"].astype(str) != "step"]
    plan = traced_plan(rows)
    run = rows["run"].astype(str)
    step_unit = run + "/" + rows["step"].astype(str)
    kernels = sorted(rows["kernel"].astype(str).unique().tolist())
    ranks = sorted(int(r) for r in rows["rank"].unique())
    frame = pd.DataFrame({
        "kernel": rows["kernel"].astype(str).to_numpy(),
        "kernel_class": rows["kernel_class"].astype(str).to_numpy(),
        "rank": rows["rank"].to_numpy(dtype=np.int64),
        "step_unit": step_unit.to_numpy(),
    })
    steps_per_rank = frame.groupby("rank")["step_unit"].nunique().reindex(ranks)
    counts = frame.groupby(["kernel", "rank"]).size().unstack("rank", fill_value=0)
    counts = counts.reindex(index=kernels, columns=ranks, fill_value=0)
    launches = counts.to_numpy(dtype=float) / steps_per_rank.to_numpy(dtype=float)[None, :]
    kernel_class = frame.groupby("kernel")["kernel_class"].agg(lambda s: s.value_counts().index[0])
    kernel_class = kernel_class.reindex(kernels)
    is_collective = kernel_class.isin(COLLECTIVE_CLASSES).to_numpy()

    def per_kernel(column: str, how) -> np.ndarray:
        if column not in rows.columns:
            return np.full(len(kernels), np.nan)
        values = pd.Series(pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float),
                           index=frame["kernel"].to_numpy())
        out = values.groupby(level=0).agg(how).reindex(kernels).to_numpy(dtype=float)
        return np.where(is_collective, out, np.nan)

    bytes_per_launch = per_kernel("bytes", "mean")
    tail_share, stage_bytes, stages = _stage_details(rows, frame, kernels, is_collective)
    group_size = per_kernel("group_size", _typical)
    roles = [collective_role(c, g, plan) for c, g in zip(kernel_class, group_size, strict=True)]
    if "role" in rows.columns and rows["role"].notna().any():
        # roles read from the traces' process groups win over the group-size guess
        traced = (pd.Series(rows["role"].astype(object).to_numpy(), index=frame["kernel"])
                  .dropna().groupby(level=0).agg(lambda s: s.value_counts().index[0]))
        roles = [str(traced[k]) if k in traced.index and c in COLLECTIVE_CLASSES else r
                 for k, c, r in zip(kernels, kernel_class, roles, strict=True)]

    placement = rows.groupby("rank", observed=True)[["node", "gpu"]].first().reindex(ranks)
    if "pp_stage" in rows.columns and rows["pp_stage"].notna().any():
        stage_of_rank = (rows.groupby("rank", observed=True)["pp_stage"].first().reindex(ranks)
                         .astype("Float64").fillna(-1).to_numpy(dtype=np.int64))
    else:
        stage_of_rank = np.full(len(ranks), -1, dtype=np.int64)
    step_units = sorted(frame["step_unit"].unique().tolist(), key=_step_unit_key)
    if "start_us" in rows.columns and rows["start_us"].notna().any():
        start = rows["start_us"].to_numpy(dtype=float)
        spans = pd.DataFrame({"step_unit": frame["step_unit"], "rank": frame["rank"],
                              "start": start, "end": start + rows["duration_us"].to_numpy(float)})
        grouped = spans.groupby(["step_unit", "rank"])
        span = (grouped["end"].max() - grouped["start"].min()).unstack("rank")
        span = span.reindex(index=step_units, columns=ranks).to_numpy(dtype=float)
        # the step itself: first kernel of any rank to the last end, per node (ranks of a node
        # share its clock), so late-starting ranks' short spans do not hide the waiting
        spans["node"] = rows["node"].astype(str).to_numpy()
        by_node = spans.groupby(["step_unit", "node"])
        step_span = (by_node["end"].max() - by_node["start"].min()).unstack("node")
        step_span = step_span.reindex(index=step_units).max(axis=1).to_numpy(dtype=float)
        span_note = "span from start_us and duration_us"
    else:
        span = np.full((len(step_units), len(ranks)), np.nan)
        step_span = np.full(len(step_units), np.nan)
        span_note = "no start_us column: step spans unknown"

    idle, sync_role = _sync_idle(rows, frame, step_units, ranks, roles, kernels)
    platforms = sorted({str(m.get("platform")) for m in (rows.attrs.get("runs") or {}).values()
                        if m.get("platform")})
    plan_json = {k: v for k, v in plan.items() if k != "known"}
    ds = xr.Dataset(
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
            "traced_idle_us": (("step_unit", "rank", "sync"), idle),
            "sync_role": ("sync", sync_role),
        },
        coords={"kernel": np.array(kernels, dtype=object), "rank": np.array(ranks),
                "pp_stage": np.arange(stages),
                "step_unit": np.array(step_units, dtype=object),
                "sync": np.arange(idle.shape[-1])},
        attrs={"kind": "kernel", "traced_plan": json.dumps(plan_json, sort_keys=True),
               "plan_known": int(plan["known"]), "run": ",".join(sorted(run.unique())),
               "platform": ",".join(platforms), "traced_step_time_note": span_note},
    )
    return ds


def _stage_details(rows: pd.DataFrame, frame: pd.DataFrame, kernels: list[str],
                   is_collective: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per kernel, the share of its launches in the step's tail (``phase == "optimizer"``:
    the optimizer step after the last backward, ``bayesprism.ingest.annotate``; the class
    ``optimizer`` where the traces have no phases), and per kernel and traced pipeline stage
    the mean bytes of a collective launch (NaN elsewhere; one stage when none is known)."""
    classes = frame.groupby("kernel")["kernel_class"].first().reindex(kernels)
    if "phase" in rows.columns and rows["phase"].notna().any():
        tail = pd.Series((rows["phase"].astype(str) == "optimizer").to_numpy(),
                         index=frame["kernel"].to_numpy())
        share = tail.groupby(level=0).mean().reindex(kernels).to_numpy(dtype=float)
    else:
        share = (classes == "optimizer").to_numpy(dtype=float)
    if "pp_stage" not in rows.columns or rows["pp_stage"].isna().all():
        stage = np.zeros(len(rows), dtype=np.int64)
    else:
        stage = rows["pp_stage"].astype("Float64").fillna(0).to_numpy(dtype=np.int64)
    stages = int(stage.max()) + 1 if len(stage) else 1
    nbytes = (pd.to_numeric(rows["bytes"], errors="coerce").to_numpy(dtype=float)
              if "bytes" in rows.columns else np.full(len(rows), np.nan))
    by_stage = (pd.DataFrame({"kernel": frame["kernel"].to_numpy(), "stage": stage,
                              "bytes": nbytes})
                .groupby(["kernel", "stage"])["bytes"].mean().unstack("stage")
                .reindex(index=kernels, columns=range(stages)).to_numpy(dtype=float, copy=True))
    by_stage[~is_collective] = np.nan
    return share, by_stage, stages


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


def _sync_idle(rows: pd.DataFrame, frame: pd.DataFrame, step_units: list, ranks: list,
               roles: list, kernels: list) -> tuple[np.ndarray, np.ndarray]:
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
    shorten segments (idle is then understated, never negative).

    Returns
    -------
    (idle, sync_role)
        ``idle`` (step_unit, rank, sync) in µs, all NaN (one segment) without ``start_us``;
        ``sync_role`` (sync): the parallel role of the collective ending each segment (the most
        common over rank-steps), ``"step"`` for the last segment.
    """
    if "start_us" not in rows.columns or not rows["start_us"].notna().any():
        return (np.full((len(step_units), len(ranks), 1), np.nan),
                np.array(["step"], dtype=object))
    start = rows["start_us"].to_numpy(dtype=float)
    end = start + rows["duration_us"].to_numpy(dtype=float)
    node = rows["node"].astype(str).to_numpy()
    is_coll = frame["kernel_class"].isin(COLLECTIVE_CLASSES).to_numpy()
    role_of = dict(zip(kernels, roles, strict=True))
    keys = pd.DataFrame({"u": frame["step_unit"].to_numpy(), "n": node, "s": start})
    node_start = keys.groupby(["u", "n"])["s"].transform("min").to_numpy()
    unit_ix = {u: i for i, u in enumerate(step_units)}
    rank_ix = {r: i for i, r in enumerate(ranks)}
    segments: dict[tuple[int, int], list[float]] = {}
    seg_roles: dict[tuple[int, int], list[str]] = {}
    names = frame["kernel"].to_numpy()
    for (unit, rank), ix in frame.groupby(["step_unit", "rank"]).indices.items():
        ix = ix[np.isfinite(start[ix])]
        if not ix.size:
            continue
        ix = ix[np.argsort(start[ix], kind="stable")]
        coll, comp = ix[is_coll[ix]], ix[~is_coll[ix]]
        lo = np.r_[node_start[ix[0]], end[coll]]
        hi = np.r_[start[coll], end[ix].max()]
        key = (unit_ix[unit], rank_ix[int(rank)])
        length = hi - lo
        segments[key] = np.where(
            length > 0, np.maximum(length - _covered_lengths(start[comp], end[comp], lo, hi),
                                   0.0), 0.0).tolist()
        seg_roles[key] = [role_of[names[k]] for k in coll]
    if not segments:
        return (np.full((len(step_units), len(ranks), 1), np.nan),
                np.array(["step"], dtype=object))
    width = max(len(v) for v in segments.values())
    idle = np.full((len(step_units), len(ranks), width), np.nan)
    for (u, r), values in segments.items():
        idle[u, r, : len(values) - 1] = values[:-1]
        idle[u, r, width - 1] = values[-1]  # the step's end is the last segment of every rank
    sync_role = []
    for j in range(width - 1):
        found = pd.Series([v[j] for v in seg_roles.values() if len(v) > j])
        sync_role.append(str(found.value_counts().index[0]) if len(found) else "unknown")
    return idle, np.array([*sync_role, "step"], dtype=object)


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
