"""Process groups of a traced job → parallel dimensions, collective roles and rank coordinates.

A PyTorch-profiler trace of a distributed job names its process groups twice: in
``distributedInfo.pg_config`` (every group the rank created: ``pg_name``, ``pg_desc``,
``pg_size``, ``ranks``) and in each NCCL kernel's args (``Process Group Name``, ``Process Group
Description``, ``Process Group Ranks``). This module turns them into

* a **dimension** per group: ``tp``, ``pp``, ``dp``, ``cp``, ``ep`` (the parallel sizes of the
  layout), ``edp``/``etp`` (expert data / tensor parallel: roles ``dp``/``tp`` without setting a
  size), ``global`` (the world group) or ``other`` (model-parallel, embedding, amax, ... groups);
* the **role** of every collective (:data:`ROLES`: the dimension with the expert variants folded);
* each rank's **coordinates** (``tp_rank``, ``pp_stage``, ``dp_rank``, ``cp_rank``,
  ``ep_rank``): its index in the rank list of its group of that dimension.

Descriptions are recognised first (:data:`DESCRIPTION_PATTERNS`): Megatron-LM / NeMo
(``TENSOR_MODEL_PARALLEL_GROUP``, ``PIPELINE_MODEL_PARALLEL_GROUP``, ``DATA_PARALLEL_GROUP``,
``CONTEXT_PARALLEL_GROUP``, ``EXPERT_MODEL_PARALLEL_GROUP``, ...), torch DeviceMesh as torchtitan
uses it (``mesh_tp``, ``mesh_pp``, ``mesh_dp_shard``, ``mesh_dp_replicate``, ``mesh_cp``,
``mesh_ep``, ...) and DeepSpeed-style words (``pipe``, ``model``, ``data``, ``expert``). A group
whose description is absent or generic (``default_pg`` of a sub-group, ``undefined``, a number,
``mesh_dim_0``) is classified from what runs on it and how its ranks are laid out
(:func:`fallback_dimensions`): point-to-point traffic makes it ``pp``, all-to-all ``ep``, the
whole world ``global``; of the remaining families of groups (same size and rank stride) the
one with the smallest stride is ``tp`` and the next ``dp`` (every common launcher orders ranks
tensor-parallel fastest, pipeline slowest), and a lone family is ``tp`` when it communicates
early in the step (per layer) and ``dp`` otherwise (gradient buckets). Those values carry the
provenance ``inferred``; those read from descriptions ``trace``. A job with no group of any
parallel dimension is plain data parallelism: its world group is then ``dp``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from bayesprism.errors import Problem

#: Roles of collectives (the ``role`` column); compute rows have none.
ROLES: tuple[str, ...] = ("tp", "pp", "dp", "cp", "ep", "global", "other")
#: Dimensions that set a size of the layout, and the coordinate column of each.
COORDINATES: dict[str, str] = {"tp": "tp_rank", "pp": "pp_stage", "dp": "dp_rank",
                               "cp": "cp_rank", "ep": "ep_rank"}
#: Dimension → role (expert variants fold into the role they play).
DIMENSION_ROLE: dict[str, str] = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep",
                                  "edp": "dp", "etp": "tp", "global": "global", "other": "other"}
TRACE = "trace"
INFERRED = "inferred"

#: Ordered (pattern, dimension) pairs matched against a group's description; first match wins.
#: Composite groups (model-parallel = tp x pp, tensor-and-data, embedding) come before the
#: single dimensions their names contain.
DESCRIPTION_PATTERNS: tuple[tuple[re.Pattern, str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), dim) for p, dim in (
        # Megatron-LM / NeMo (megatron.core.parallel_state group_desc)
        (r"EXPERT.*DATA|EXPT.*DP|^mesh_.*\bedp\b", "edp"),
        (r"EXPERT.*TENSOR|^mesh_.*\betp\b", "etp"),
        (r"TENSOR_AND|DATA_AND|AND_DATA|AND_CONTEXT|TENSOR_MODEL_PARALLEL_GROUP_WITH|"
         r"^MODEL_PARALLEL_GROUP|EMBEDDING|AMAX|HIERARCHICAL|PARTIAL|INTER_|INTRA_", "other"),
        (r"EXPERT", "ep"),
        (r"DATA_PARALLEL", "dp"),
        (r"CONTEXT_PARALLEL", "cp"),
        (r"PIPELINE", "pp"),
        (r"TENSOR_MODEL_PARALLEL|TENSOR_PARALLEL", "tp"),
        # torch DeviceMesh: group_desc "mesh_<dim name>" (torchtitan: dp_replicate, dp_shard,
        # dp_shard_cp, dp_cp, cp, tp, pp, ep, ...); "mesh_dim_0" names no dimension
        (r"^mesh_(?:dim_?\d+)$", ""),
        (r"^mesh_(?:.*_)?(?:pp|pipe|pipeline)(?:_|$)", "pp"),
        (r"^mesh_(?:.*_)?(?:ep|expert)(?:_|$)", "ep"),
        (r"^mesh_(?:dp|fsdp|ddp|hsdp|shard|replicate|data|batch)", "dp"),
        (r"^mesh_(?:cp|context|sp|seq)", "cp"),
        (r"^mesh_(?:tp|tensor|model)", "tp"),
        # DeepSpeed-style topology axis names
        (r"^(?:pipe|pipeline)(?:_parallel)?(?:_group)?$", "pp"),
        (r"^(?:model|tensor|slice)(?:_parallel)?(?:_group)?$", "tp"),
        (r"^(?:data|dp)(?:_parallel)?(?:_group)?$", "dp"),
        (r"^(?:seq|sequence|context)(?:_parallel)?(?:_group)?$", "cp"),
        (r"^(?:expert|ep)(?:_parallel)?(?:_group)?$", "ep"),
    ))


@dataclass(frozen=True)
class Group:
    """One process group as the traces describe it."""

    name: str
    description: str | None
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)


def description_dimension(description: str | None, size: int, world_size: int | None
                          ) -> str | None:
    """The dimension a group's description names, or None when it names none.

    ``default_pg`` (and ``WORLD``) is ``global`` when the group is the whole world.

    Examples
    --------
    >>> description_dimension("TENSOR_MODEL_PARALLEL_GROUP", 8, 64)
    'tp'
    >>> description_dimension("mesh_dp_shard", 4, 32)
    'dp'
    >>> description_dimension("default_pg", 64, 64)
    'global'
    >>> description_dimension("undefined", 8, 64) is None
    True
    """
    if description is None:
        return "global" if world_size and size == world_size and size > 1 else None
    text = str(description).strip()
    if text.lower() in ("default_pg", "world", "global", "default"):
        return "global" if world_size and size == world_size else None
    for pattern, dim in DESCRIPTION_PATTERNS:
        if pattern.search(text):
            return dim or None
    return None


def parse_ranks(value) -> tuple[int, ...] | None:
    """Rank list from ``pg_config``'s list or a kernel arg's ``"[0, 1, 2]"`` string."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, (list, tuple)):
        return None
    try:
        ranks = tuple(int(r) for r in value)
    except (TypeError, ValueError):
        return None
    return ranks


def collect_groups(pg_config, kernel_groups: Iterable[tuple], source: str
                   ) -> tuple[dict[str, Group], list[Problem]]:
    """Groups of one rank's trace: ``pg_config`` entries and the NCCL kernels' group args.

    Parameters
    ----------
    pg_config
        ``distributedInfo.pg_config`` (list of dicts) or None.
    kernel_groups
        ``(name, description, ranks)`` from kernel args (ranks as given: list or string).
    source
        The file, named in problems.

    Returns
    -------
    (groups, problems)
        Groups by name; a problem where the two sources disagree on a group's ranks.
    """
    groups: dict[str, Group] = {}
    problems: list[Problem] = []

    def add(name, description, ranks, field: str) -> None:
        if name is None:
            return
        name = str(name)
        parsed = parse_ranks(ranks)
        if parsed is None:
            return
        old = groups.get(name)
        if old is None:
            groups[name] = Group(name, None if description is None else str(description), parsed)
        elif old.ranks != parsed:
            problems.append(Problem(source, field, f"process group {name!r} has ranks "
                                    f"{_short(parsed)} here but {_short(old.ranks)} elsewhere "
                                    "in the same file"))
        elif old.description is None and description is not None:
            groups[name] = Group(name, str(description), parsed)

    if isinstance(pg_config, list):
        for entry in pg_config:
            if isinstance(entry, Mapping):
                add(entry.get("pg_name"), entry.get("pg_desc"), entry.get("ranks"),
                    "distributedInfo.pg_config")
    elif isinstance(pg_config, Mapping):  # some PyTorch versions write {name: {...}}
        for name, entry in pg_config.items():
            if isinstance(entry, Mapping):
                add(entry.get("pg_name", name), entry.get("pg_desc"), entry.get("ranks"),
                    "distributedInfo.pg_config")
    for name, description, ranks in kernel_groups:
        add(name, description, ranks, "Process Group Ranks")
    return groups, problems


def _short(ranks: tuple[int, ...]) -> str:
    return str(list(ranks)) if len(ranks) <= 8 else f"[{ranks[0]}, {ranks[1]}, ..., {ranks[-1]}]"


def _stride(ranks: tuple[int, ...]) -> int | None:
    """Common difference of a sorted rank list (None when not evenly spaced)."""
    ordered = sorted(ranks)
    if len(ordered) < 2:
        return None
    steps = set(np.diff(ordered).tolist())
    return int(steps.pop()) if len(steps) == 1 else None


@dataclass(frozen=True)
class GroupUsage:
    """What one rank's trace runs on a group: classes of its collectives and where in the step.

    ``early_share`` is the share of the group's launches that start in the first half of the
    rank's step (by kernel order): per-layer (tensor-parallel) traffic is spread over the
    step, gradient buckets come at its end.
    """

    classes: frozenset[str]
    early_share: float


def fallback_dimensions(groups: Mapping[str, Group], undecided: Iterable[str],
                        usage: Mapping[str, GroupUsage], world_size: int | None
                        ) -> dict[str, str]:
    """Dimensions of groups whose descriptions name none, from usage and rank layout.

    Parameters
    ----------
    groups
        All groups of the rank.
    undecided
        Names of the groups to classify.
    usage
        What the rank runs on each group (groups it never uses are ``other``).
    world_size
        The job's world size.

    Returns
    -------
    dict
        Group name → dimension.

    Examples
    --------
    >>> g = {"1": Group("1", None, (0, 1, 2, 3)), "2": Group("2", None, (0, 4))}
    >>> u = {"1": GroupUsage(frozenset({"allreduce"}), 0.5),
    ...      "2": GroupUsage(frozenset({"allreduce"}), 0.0)}
    >>> fallback_dimensions(g, ["1", "2"], u, 8)
    {'1': 'tp', '2': 'dp'}
    """
    out: dict[str, str] = {}
    families: dict[tuple[int, int | None], list[str]] = {}
    for name in undecided:
        group = groups[name]
        use = usage.get(name)
        if world_size and group.size == world_size and group.size > 1:
            out[name] = "global"
        elif use is None or group.size < 2:
            out[name] = "other"
        elif "sendrecv" in use.classes:
            out[name] = "pp"
        elif "alltoall" in use.classes:
            out[name] = "ep"
        else:
            families.setdefault((group.size, _stride(group.ranks)), []).append(name)
    ordered = sorted(families, key=lambda key: (key[1] is None, key[1] or 0))
    if len(ordered) == 1:
        names = families[ordered[0]]
        early = np.mean([usage[n].early_share for n in names])
        dims = ["tp" if early > 0.2 else "dp"]
    else:
        dims = ["tp", "dp"] + ["other"] * max(len(ordered) - 2, 0)
    for key, dim in zip(ordered, dims, strict=False):
        for name in families[key]:
            out[name] = dim
    return out


def rank_dimensions(groups: Mapping[str, Group], rank: int, world_size: int | None,
                    usage: Mapping[str, GroupUsage]) -> tuple[dict[str, str], dict[str, str]]:
    """Dimension and provenance of each group of one rank's trace.

    Returns
    -------
    (dimension, provenance)
        Both keyed by group name; provenance :data:`TRACE` (description) or :data:`INFERRED`.
    """
    dimension: dict[str, str] = {}
    provenance: dict[str, str] = {}
    undecided = []
    for name, group in groups.items():
        dim = description_dimension(group.description, group.size, world_size)
        if dim is None:
            undecided.append(name)
        else:
            dimension[name], provenance[name] = dim, TRACE
    # A sized dimension named by a description is settled: fallbacks never claim it again.
    claimed = {d for d in dimension.values() if d in COORDINATES}
    for name, dim in fallback_dimensions(groups, undecided, usage, world_size).items():
        if dim in claimed and dim in COORDINATES:
            dim = "other"
        dimension[name], provenance[name] = dim, INFERRED
    if not any(dim in COORDINATES for dim in dimension.values()):
        # plain data parallelism: the world group is the data-parallel group
        for name, dim in dimension.items():
            if dim == "global":
                dimension[name] = "dp"
    return dimension, provenance


def rank_coordinates(groups: Mapping[str, Group], dimension: Mapping[str, str], rank: int,
                     source: str) -> tuple[dict[str, int], dict[str, int], list[Problem]]:
    """This rank's coordinate and the size of each sized dimension.

    When a dimension has several groups on the rank (e.g. ``DATA_PARALLEL_GROUP`` and
    ``DATA_PARALLEL_GROUP_WITH_CP``) the smallest is the dimension itself.

    Returns
    -------
    (coordinates, sizes, problems)
        ``coordinates`` keyed by :data:`COORDINATES` column; problems name a group of the rank's
        own trace that does not contain the rank.
    """
    coords: dict[str, int] = {}
    sizes: dict[str, int] = {}
    problems: list[Problem] = []
    chosen: dict[str, Group] = {}
    for name, dim in dimension.items():
        if dim not in COORDINATES:
            continue
        group = groups[name]
        if rank not in group.ranks:
            problems.append(Problem(source, "distributedInfo.pg_config",
                                    f"group {name!r} ({group.description}) lists ranks "
                                    f"{_short(group.ranks)} without this trace's rank {rank}"))
            continue
        if dim not in chosen or group.size < chosen[dim].size:
            chosen[dim] = group
    for dim, group in chosen.items():
        coords[COORDINATES[dim]] = group.ranks.index(rank)
        sizes[dim] = group.size
    return coords, sizes, problems


__all__ = ["COORDINATES", "DESCRIPTION_PATTERNS", "DIMENSION_ROLE", "INFERRED", "ROLES",
           "TRACE", "Group", "GroupUsage", "collect_groups", "description_dimension",
           "fallback_dimensions", "parse_ranks", "rank_coordinates", "rank_dimensions"]
