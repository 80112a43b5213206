"""A traced job's layout from its rank files: sizes, schedule, coordinates, checked across ranks.

Every Kineto file reports what it sees (:func:`bayesprism.ingest.annotate.annotate_rank`): its
process groups with their dimensions, its coordinates, and what its pipeline send/recv ops
say. :func:`reconcile_layout` merges those reports for one run:

* a process group must have the same ranks in every file that names it, and every rank it
  lists whose file was read must list it too (else an error naming both files);
* a dimension must have one size in every file, and no two ranks may share coordinates;
* the pipeline stages must agree on the schedule and the micro-batches per step;
* ranks that groups list but whose files are missing are counted in a note.

The result sets the run's ``plan`` (``tp pp dp cp ep microbatches schedule sharding``) with
``layout_sources`` (``trace`` where read from group descriptions and the send/recv pattern,
``inferred`` where guessed from rank layout and usage), and ``rank_coordinates``: the mixed-
radix formula ``rank = Σ coordinate × stride`` when every rank obeys one, else a count of the
ranks that do not. A value the user stated (provenance ``user``) wins; a disagreement with the
traces is noted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bayesprism.errors import Problem
from bayesprism.ingest.groups import COORDINATES, INFERRED, TRACE

SIZE_KEYS = ("tp", "pp", "dp", "cp", "ep")


def _rank_formula(coords_by_rank: Mapping[int, Mapping[str, int]], sizes: Mapping[str, int]
                  ) -> dict:
    """``{"order": [...], "strides": {...}, "exceptions": n}``: the dimensions from fastest to
    slowest varying and their strides, found from the ranks' coordinates."""
    dims = [d for d in SIZE_KEYS if sizes.get(d, 1) > 1 and d != "ep"]
    strides: dict[str, int] = {}

    def key(coords: Mapping[str, int], zero: str | None = None) -> tuple:
        return tuple(sorted((c, 0 if c == zero else v) for c, v in coords.items()
                            if c != "ep_rank"))

    index = {key(coords): rank for rank, coords in coords_by_rank.items()}
    for dim in dims:
        col = COORDINATES[dim]
        # the stride of a dimension: rank difference between two ranks that differ only in it
        for rank, coords in coords_by_rank.items():
            partner = index.get(key(coords, col)) if coords.get(col, 0) else None
            if partner is not None:
                strides[dim] = (rank - partner) // coords[col]
                break
    order = sorted(strides, key=strides.get)
    exceptions = sum(
        1 for rank, coords in coords_by_rank.items()
        if sum(coords.get(COORDINATES[d], 0) * strides[d] for d in order) != rank)
    return {"order": order, "strides": strides, "exceptions": exceptions}


def reconcile_layout(run: str, reports: Sequence[tuple[str, int, dict]], meta: dict,
                     world_size: int | None) -> tuple[dict, list[Problem], list[str]]:
    """The run's metadata with its layout read from every rank's layout report.

    Parameters
    ----------
    run
        Run name (in notes).
    reports
        ``(file, rank, layout)`` per file of the run.
    meta
        The run's metadata (``attrs["runs"][run]``), not modified; values with provenance
        ``user`` in its ``layout_sources`` win.
    world_size
        The run's world size.

    Returns
    -------
    (meta, problems, notes)
    """
    problems: list[Problem] = []
    notes: list[str] = []
    seen_group: dict[str, tuple[str, tuple, str | None]] = {}
    groups_of_rank: dict[int, set[str]] = {}
    file_of_rank: dict[int, str] = {}
    for source, rank, layout in reports:
        file_of_rank[rank] = source
        groups_of_rank[rank] = set(layout.get("groups", {}))
        for name, g in layout.get("groups", {}).items():
            ranks = tuple(g["ranks"])
            if name in seen_group and seen_group[name][1] != ranks:
                problems.append(Problem(source, "distributedInfo.pg_config",
                                        f"process group {name!r} has ranks {_short(ranks)}, but "
                                        f"{seen_group[name][0]} gives {_short(seen_group[name][1])}"
                                        ": inconsistent groups across ranks"))
            seen_group.setdefault(name, (source, ranks, g.get("dimension")))
    missing: set[int] = set()
    for name, (source, ranks, _) in seen_group.items():
        for r in ranks:
            if r not in file_of_rank:
                missing.add(r)
            elif name not in groups_of_rank[r] and _lists_groups(reports, r):
                problems.append(Problem(file_of_rank[r], "distributedInfo.pg_config",
                                        f"does not list process group {name!r}, which {source} "
                                        f"says contains rank {r}: a rank missing from its group"))
    if missing:
        shown = ", ".join(map(str, sorted(missing)[:8])) + (" ..." if len(missing) > 8 else "")
        notes.append(f"run {run}: {len(missing)} ranks listed in process groups have no trace "
                     f"file ({shown}): their coordinates and collectives are unknown")

    sizes: dict[str, int] = {}
    size_source: dict[str, str] = {}
    provenance: dict[str, str] = {}
    for source, _, layout in reports:
        for dim, size in layout.get("sizes", {}).items():
            if dim in sizes and sizes[dim] != size:
                problems.append(Problem(source, "distributedInfo.pg_config",
                                        f"its {dim} group has {size} ranks, but {size_source[dim]}"
                                        f"'s has {sizes[dim]}: inconsistent groups across ranks"))
            sizes.setdefault(dim, size)
            size_source.setdefault(dim, source)
            prov = layout.get("size_provenance", {}).get(dim, INFERRED)
            provenance[dim] = TRACE if prov == TRACE and provenance.get(dim) != INFERRED else prov

    coords_by_rank = {rank: layout.get("coordinates", {}) for _, rank, layout in reports}
    owner: dict[tuple, int] = {}
    for rank, coords in coords_by_rank.items():
        key = tuple(coords.get(COORDINATES[d], 0) for d in ("tp", "pp", "dp", "cp"))
        if coords and key in owner:
            problems.append(Problem(file_of_rank[rank], "distributedInfo.pg_config",
                                    f"rank {rank} has the coordinates of rank {owner[key]} "
                                    f"(tp, pp, dp, cp = {key}): inconsistent groups"))
        owner.setdefault(key, rank)

    schedule, microbatches = _pipeline(run, reports, notes)
    plan_found: dict = {dim: sizes[dim] for dim in SIZE_KEYS if dim in sizes}
    sources_found = {dim: provenance[dim] for dim in plan_found}
    if sizes and world_size:
        product = 1
        for dim in ("tp", "pp", "dp", "cp"):
            product *= sizes.get(dim, 1)
        if "dp" not in sizes and world_size % product == 0:
            plan_found["dp"], sources_found["dp"] = world_size // product, INFERRED
        elif product != world_size:
            notes.append(f"run {run}: tp·pp·dp·cp = {product} from the process groups differs "
                         f"from the world size {world_size}")
        for dim in ("tp", "pp", "cp", "ep"):
            if dim not in plan_found:
                plan_found[dim], sources_found[dim] = 1, sources_found.get("dp", INFERRED)
    if schedule is not None:
        plan_found.update(schedule=schedule, microbatches=microbatches)
        sources_found.update(schedule=TRACE, microbatches=TRACE)
    sharding = _sharding(reports)
    if sharding is not None:
        plan_found["sharding"], sources_found["sharding"] = sharding, INFERRED
    out = _merge_user(run, meta, plan_found, sources_found, notes)
    if coords_by_rank and any(coords_by_rank.values()):
        out["rank_coordinates"] = _rank_formula(coords_by_rank, sizes)
    return out, problems, notes


def _lists_groups(reports, rank: int) -> bool:
    """Whether the rank's own trace lists process groups at all (older traces do not)."""
    return any(r == rank and layout.get("groups") for _, r, layout in reports)


def _pipeline(run: str, reports, notes: list[str]) -> tuple[str | None, int | None]:
    found = {}
    for source, _, layout in reports:
        pipe = layout.get("pipeline")
        if not pipe:
            continue
        if pipe["schedule"] is None:
            notes.append(f"run {run}: pipeline schedule and micro-batches not read from "
                         f"{source}: {pipe['note']}")
            continue
        found[(pipe["schedule"], pipe["microbatches"])] = source
    if len(found) > 1:
        listed = "; ".join(f"{s} with {m} micro-batches in {f}" for (s, m), f in found.items())
        notes.append(f"run {run}: the pipeline stages disagree on the schedule: {listed}; "
                     "none is used (state it with --layout)")
        return None, None
    if not found:
        return None, None
    (schedule, microbatches), = found
    return schedule, microbatches


def _sharding(reports) -> str | None:
    """Distributed optimizer / ZeRO (gradient reduce-scatter and parameter all-gather on the
    data-parallel group) vs plain data parallelism (all-reduce), from the dp groups' usage."""
    for _, _, layout in reports:
        for g in layout.get("groups", {}).values():
            if g.get("dimension") == "dp" and g.get("classes"):
                classes = set(g["classes"])
                if {"reducescatter", "allgather"} <= classes:
                    return "zero1"
                if "allreduce" in classes:
                    return "none"
    return None


def _merge_user(run: str, meta: dict, found: dict, sources: dict, notes: list[str]) -> dict:
    out = dict(meta)
    plan = dict(out.get("plan") or {})
    layout_sources = dict(out.get("layout_sources") or {})
    for key, value in found.items():
        if layout_sources.get(key) == "user":
            if plan.get(key) != value:
                notes.append(f"run {run}: {key}: the traces say {value} "
                             f"({sources[key]}), the user states {plan.get(key)}; using "
                             f"{plan.get(key)}")
            continue
        plan[key] = value
        layout_sources[key] = sources[key]
    out["plan"] = plan
    out["layout_sources"] = layout_sources
    return out


def _short(ranks: tuple) -> str:
    return str(list(ranks)) if len(ranks) <= 8 else f"[{ranks[0]}, {ranks[1]}, ..., {ranks[-1]}]"


__all__ = ["reconcile_layout"]
