"""Plan geometry and measured-node lists: which ranks a node slot runs, node rankings, draining.

Ranks map to node slots as in Megatron-LM (and ``bayesprism.forecast.composition``): tensor-parallel
rank fastest, then context-parallel, data-parallel, pipeline stage
(``rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·stage))``); node slot ``j`` holds ranks
``j·G … (j+1)·G − 1`` for G GPUs per node, and runs on the j-th node of the cluster's node list
(nodes after the last slot are spares).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from bayesprism.errors import InputError, PlanError, Problem
from bayesprism.plan import Cluster
from bayesprism.posterior import posterior_group

#: Largest plan (in GPUs) :func:`bayesprism.forecast.composition.compose` simulates rank by
#: rank when not told which path to take (:func:`composition_path`).
EXACT_MAX_GPUS = 2048

# --------------------------------------------------------------------------- plan geometry


def degree(plan, name: str) -> int:
    """A plan's integer field (``dp``, ``tp``, ``microbatches``, ...), 1 when absent."""
    return int(getattr(plan, name, 1) or 1)


def world_size(plan) -> int:
    """Number of ranks of a plan (dp · tp · pp · cp; expert parallelism reuses those ranks)."""
    return degree(plan, "dp") * degree(plan, "tp") * degree(plan, "pp") * degree(plan, "cp")


def gpus_per_node_of(plan, cluster=None) -> int:
    """GPUs per node: the cluster's when given, else the plan's."""
    value = getattr(cluster, "gpus_per_node", None) or getattr(plan, "gpus_per_node", None)
    if not value:
        raise PlanError(Problem("plan", "gpus_per_node", "unknown: give it in the plan or cluster"))
    return int(value)


@dataclass(frozen=True)
class Slot:
    """What one node slot runs: its ranks and their stages, replicas and tensor-parallel groups."""

    index: int
    first_rank: int
    last_rank: int
    stages: tuple[int, ...]
    replicas: tuple[int, ...]
    tp_groups: tuple[int, ...]
    piece: int  # which node-sized piece of its tp×cp block (0 when a block fits in a node)

    @property
    def kind(self) -> tuple:
        """Slots of equal kind are exchangeable (they differ only by data-parallel replica)."""
        return (self.stages, self.piece)

    def position(self) -> dict:
        def one(values: tuple[int, ...]):
            return values[0] if len(values) == 1 else list(values)

        return {
            "slot": self.index,
            "ranks": [self.first_rank, self.last_rank],
            "stage": one(self.stages),
            "replica": one(self.replicas),
            "tp_group": one(self.tp_groups),
        }


def slots_of(plan, gpus_per_node: int) -> list[Slot]:
    """Node slots of a plan in Megatron-LM rank order (see module docstring)."""
    tp, cp, dp = degree(plan, "tp"), degree(plan, "cp"), degree(plan, "dp")
    world = world_size(plan)
    block = tp * cp
    out = []
    for j in range(math.ceil(world / gpus_per_node)):
        ranks = np.arange(j * gpus_per_node, min((j + 1) * gpus_per_node, world))
        out.append(
            Slot(
                index=j,
                first_rank=int(ranks[0]),
                last_rank=int(ranks[-1]),
                stages=tuple(np.unique(ranks // (block * dp)).tolist()),
                replicas=tuple(np.unique((ranks // block) % dp).tolist()),
                tp_groups=tuple(np.unique(ranks // tp).tolist()),
                piece=int((ranks[0] % block) // gpus_per_node) if block > gpus_per_node else 0,
            )
        )
    return out


# --------------------------------------------------------------------------- nodes and clusters


def rank_nodes(posterior: xr.DataTree) -> list[str]:
    """Measured nodes, slowest first, by posterior mean standardised node effect."""
    group = posterior_group(posterior)
    if "node_effect" not in group:
        raise InputError(
            Problem("posterior", "node_effect", "placement and draining need measured node effects")
        )
    mean = group["node_effect"].mean(("chain", "draw"))
    order = np.argsort(-mean.to_numpy(), kind="stable")
    return [str(mean["node"].to_numpy()[i]) for i in order]


def node_means(posterior: xr.DataTree) -> dict[str, float]:
    """Posterior mean standardised effect of each measured node."""
    mean = posterior_group(posterior)["node_effect"].mean(("chain", "draw"))
    return {str(n): float(v) for n, v in zip(mean["node"].to_numpy(), mean.to_numpy(), strict=True)}


def cluster_nodes(cluster) -> list[str] | None:
    """The measured node names a cluster lists (``None`` when it lists none)."""
    nodes = getattr(cluster, "nodes", None)
    return None if nodes is None else [str(n) for n in nodes]


def with_nodes(cluster, nodes: Sequence[str], plan=None):
    """A cluster running ``nodes`` (slot order); built from the plan's GPUs per node if needed."""
    if cluster is None:
        return Cluster(gpus_per_node=gpus_per_node_of(plan), nodes=tuple(nodes))
    return dataclasses.replace(cluster, nodes=tuple(nodes))


def composition_path(plan, cluster=None, exact: bool | None = None) -> str:
    """The path :func:`bayesprism.forecast.composition.compose` takes: ``"exact"`` or ``"fast"``.

    By scale when ``exact`` is None (exact up to
    :data:`EXACT_MAX_GPUS` GPUs), else as asked; a cluster
    listing measured nodes for the plan's node slots always takes the exact path, which keeps
    their positions.

    Examples
    --------
    >>> from bayesprism.plan import Cluster, ParallelPlan
    >>> composition_path(ParallelPlan(dp=16), exact=False)
    'fast'
    >>> composition_path(ParallelPlan(dp=16), Cluster(nodes=("a", "b")), exact=False)
    'exact'
    """
    use_exact = plan.gpus <= EXACT_MAX_GPUS if exact is None else bool(exact)
    nodes = math.ceil(plan.gpus / gpus_per_node_of(plan, cluster))
    if cluster is not None and cluster.nodes[:nodes]:
        use_exact = True
    return "exact" if use_exact else "fast"


def drained_cluster(cluster, plan, drain, ranking: Sequence[str]):
    """Remove nodes from a measured cluster and adapt the plan.

    Parameters
    ----------
    cluster
        Cluster listing measured nodes (``None``: every measured node in ``ranking``).
    plan
        The plan to run.
    drain
        Number k (the k slowest listed nodes in ``ranking`` order) or node names.
    ranking
        Measured nodes, slowest first (:func:`rank_nodes`).

    Returns
    -------
    tuple
        ``(cluster, plan, drained_names)``. When the remaining nodes still hold the plan's
        world size, the plan is unchanged and the remaining nodes run it in their listed order
        (the surplus stays spare). Otherwise data parallelism shrinks to the largest dp the
        remaining GPUs hold, and micro-batches grow to ``ceil(microbatches · dp / dp')`` so
        the global batch is kept (at least) constant.
    """
    nodes = cluster_nodes(cluster) or list(ranking)
    if isinstance(drain, (int, np.integer)):
        if drain > len(nodes):
            raise InputError(
                Problem(
                    "changes",
                    "drain",
                    f"cannot drain more than the {len(nodes)} nodes",
                    example=drain,
                )
            )
        drained = [n for n in ranking if n in set(nodes)][: int(drain)]
    else:
        unknown = [n for n in drain if n not in nodes]
        if unknown:
            raise InputError(
                Problem("changes", "drain", "not a node of the cluster", len(unknown), unknown[0])
            )
        drained = [str(n) for n in drain]
    remaining = [n for n in nodes if n not in set(drained)]
    gpn = gpus_per_node_of(plan, cluster)
    needed = math.ceil(world_size(plan) / gpn)
    if len(remaining) < needed:
        model_parallel = world_size(plan) // degree(plan, "dp")
        new_dp = (len(remaining) * gpn) // model_parallel
        if new_dp < 1 or new_dp < degree(plan, "ep"):
            raise PlanError(
                Problem(
                    "plan",
                    "dp",
                    "no data-parallel replica fits on the remaining nodes",
                    example=len(remaining),
                )
            )
        # Expert parallelism is carved out of data parallelism: dp must stay a multiple of ep.
        new_dp -= new_dp % degree(plan, "ep")
        if new_dp < 1:
            raise PlanError(
                Problem(
                    "plan", "ep", "no data-parallel degree divisible by ep fits", example=plan.ep
                )
            )
        microbatches = degree(plan, "microbatches")
        updates = {
            "dp": new_dp,
            "microbatches": math.ceil(microbatches * degree(plan, "dp") / new_dp),
            "name": f"{plan.name} drained to dp{new_dp}",
            "world_size": None,
        }
        plan = dataclasses.replace(plan, **updates)
    return with_nodes(cluster, remaining, plan), plan, drained
