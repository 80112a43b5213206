"""Variation-aware node placement: which measured node runs which ranks of a plan.

Ranks map to node slots as in Megatron-LM: tensor-parallel rank fastest, then context-parallel,
data-parallel, pipeline stage (``rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·stage))``);
node slot ``j`` holds ranks ``j·G … (j+1)·G − 1`` for G GPUs per node. A placement is the
ordered list of node names given to the composition as the cluster's nodes (slot j = j-th name;
names after the last slot are spares that run nothing).

The optimiser (scales to thousands of nodes: a handful of compositions per *slot class*, not
per node):

1. Nodes are ranked by posterior mean standardised node effect (loadings are ≥ 0, so a larger
   effect is slower for every kernel class in every draw); the slowest are the spares.
2. Slot classes: slots of the same stage and the same piece of the tensor×context block are
   exchangeable across data-parallel replicas. Each class is probed by composing with the
   slowest node in one of its slots; classes are ordered by the probe objective (most slack
   first).
3. Greedy: the slowest nodes fill the slots of the class with the most slack, then the next
   class, and so on (within a class, replica by replica).
4. Local search: swaps of each of the slowest nodes with a representative slot of every other
   class (and with the fastest spare), evaluated by composition with common random numbers,
   accepted when the objective improves, until no swap helps or the budget is spent.

Random placements (uniform permutations of all candidate nodes) and the worst placement found
by the same greedy in reverse (slowest nodes into the classes with least slack, fastest nodes
left as spares) are composed with the same draws and seed for the gains.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from bayesprism.errors import InputError, PlanError, Problem
from bayesprism.sensitivity import (
    PerDraw,
    check_kernel_posterior,
    compose_with_seed,
    estimate,
    posterior_group,
    thin_draws,
)

OBJECTIVES = ("mean", "p95")


# --------------------------------------------------------------------------- plan geometry


def _size(plan, name: str) -> int:
    return int(getattr(plan, name, 1) or 1)


def world_size(plan) -> int:
    """Number of ranks of a plan (dp · tp · pp · cp; expert parallelism reuses those ranks)."""
    return _size(plan, "dp") * _size(plan, "tp") * _size(plan, "pp") * _size(plan, "cp")


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
    tp, cp, dp = _size(plan, "tp"), _size(plan, "cp"), _size(plan, "dp")
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
        from bayesprism.plan import Cluster

        return Cluster(gpus_per_node=gpus_per_node_of(plan), nodes=tuple(nodes))
    return dataclasses.replace(cluster, nodes=tuple(nodes))


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
        model_parallel = world_size(plan) // _size(plan, "dp")
        new_dp = (len(remaining) * gpn) // model_parallel
        if new_dp < 1 or new_dp < _size(plan, "ep"):
            raise PlanError(
                Problem(
                    "plan",
                    "dp",
                    "no data-parallel replica fits on the remaining nodes",
                    example=len(remaining),
                )
            )
        # Expert parallelism is carved out of data parallelism: dp must stay a multiple of ep.
        new_dp -= new_dp % _size(plan, "ep")
        if new_dp < 1:
            raise PlanError(
                Problem(
                    "plan", "ep", "no data-parallel degree divisible by ep fits", example=plan.ep
                )
            )
        microbatches = _size(plan, "microbatches")
        updates = {
            "dp": new_dp,
            "microbatches": math.ceil(microbatches * _size(plan, "dp") / new_dp),
            "name": f"{plan.name} drained to dp{new_dp}",
            "world_size": None,
        }
        plan = dataclasses.replace(plan, **updates)
    return with_nodes(cluster, remaining, plan), plan, drained


# --------------------------------------------------------------------------- evaluation


class _Evaluator:
    """Composes placements with common random numbers and caches their per-draw statistics."""

    def __init__(self, posterior, plan, cluster, objective, replicates, random_seed):
        self.posterior, self.plan, self.cluster = posterior, plan, cluster
        self.objective, self.replicates, self.random_seed = objective, replicates, random_seed
        self.cache: dict[tuple[str, ...], PerDraw] = {}
        self.compositions = 0

    def stats(self, order: Sequence[str]) -> PerDraw:
        """Per-draw step-time statistics of a placement (composed once, then cached)."""
        key = tuple(order)
        if key not in self.cache:
            step = compose_with_seed(
                self.posterior,
                self.plan,
                replicates=self.replicates,
                random_seed=self.random_seed,
                cluster=with_nodes(self.cluster, key, self.plan),
            )
            self.cache[key] = PerDraw.of(step)
            self.compositions += 1
        return self.cache[key]

    def per_draw(self, order: Sequence[str]) -> np.ndarray:
        """Per-draw objective (mean or p95 step time over replicates) of a placement."""
        stats = self.stats(order)
        return stats.mean_s if self.objective == "mean" else stats.p95_s

    def value(self, order: Sequence[str]) -> float:
        return float(np.mean(self.per_draw(order)))


def _fill(slots: list[Slot], class_order: list[tuple], nodes_slowest_first: list[str]) -> list[str]:
    """Assign nodes (slowest first) to slots class by class; returns names in slot order."""
    by_class: dict[tuple, list[int]] = {}
    for slot in slots:
        by_class.setdefault(slot.kind, []).append(slot.index)
    placed: list[str | None] = [None] * len(slots)
    queue = iter(nodes_slowest_first)
    for kind in class_order:
        for index in by_class[kind]:
            placed[index] = next(queue)
    return [str(n) for n in placed]


@dataclass(frozen=True)
class _Search:
    order: list[str]  # optimised placement (slot order, then spares)
    greedy: list[str]  # the greedy placement before local search
    class_order: list[tuple]  # slot kinds, most slack first


def _optimise(
    evaluator: _Evaluator, slots: list[Slot], slowest_first: list[str], budget: int
) -> _Search:
    """Probe slot classes, fill greedily, then improve by pairwise swaps (module docstring)."""
    n_spare = len(slowest_first) - len(slots)
    spares, used = slowest_first[:n_spare], slowest_first[n_spare:]
    kinds = list(dict.fromkeys(slot.kind for slot in slots))
    class_order = kinds
    if len(kinds) > 1:
        # Probe: fastest node in slot 0 ... slowest in the last slot, then move the slowest
        # node into the first slot of each class by one swap, so only two nodes move.
        reference = used[::-1]
        probes = {}
        for kind in kinds:
            target = next(s.index for s in slots if s.kind == kind)
            order = list(reference)
            order[target], order[-1] = order[-1], order[target]
            probes[kind] = evaluator.value(order + spares)
        class_order = sorted(kinds, key=lambda k: probes[k])
    greedy = _fill(slots, class_order, used) + spares
    current, value = list(greedy), evaluator.value(greedy)
    rank = {name: i for i, name in enumerate(slowest_first)}
    improved = len(kinds) > 1 or bool(spares)
    while improved and evaluator.compositions < budget:
        improved = False
        for node in used[: min(len(used), 8)]:
            position = current.index(node)
            candidates = []
            if position < len(slots):
                for kind in kinds:
                    if kind == slots[position].kind:
                        continue
                    in_kind = [s.index for s in slots if s.kind == kind]
                    candidates.append(max(in_kind, key=lambda i: rank[current[i]]))
            candidates.extend(
                i for i in range(len(slots), len(current)) if rank[current[i]] > rank[node]
            )
            for other in candidates:
                if evaluator.compositions >= budget:
                    break
                trial = list(current)
                trial[position], trial[other] = trial[other], trial[position]
                trial_value = evaluator.value(trial)
                if trial_value < value * (1.0 - 1e-9):
                    current, value, improved = trial, trial_value, True
                    break
    return _Search(order=current, greedy=greedy, class_order=class_order)


def _throughput_ratio(base: PerDraw, base_plan, other: PerDraw, other_plan) -> np.ndarray:
    """Per-draw throughput per GPU of ``other`` ÷ ``base`` (micro-batches per second per GPU)."""

    def batch(plan) -> int:
        return _size(plan, "dp") * _size(plan, "microbatches")

    return (
        (batch(other_plan) / batch(base_plan))
        * (base.mean_s / other.mean_s)
        * (world_size(base_plan) / world_size(other_plan))
    )


def _drain_advice(
    evaluator: _Evaluator, greedy: list[str], cluster, plan, k: int, slowest_first: list[str]
):
    """The k slowest nodes, and the throughput per GPU after draining the first 1..k of them."""
    if k < 0 or k > len(slowest_first):
        raise InputError(
            Problem("arguments", "drain", f"must be between 0 and {len(slowest_first)}", example=k)
        )
    advice = slowest_first[:k]
    base = evaluator.stats(greedy)
    detail = []
    for j in range(1, k + 1):
        drained = advice[:j]
        new_cluster, new_plan, _ = drained_cluster(cluster, plan, drained, slowest_first)
        remaining = [n for n in slowest_first if n not in set(drained)]
        sub = _Evaluator(
            evaluator.posterior,
            new_plan,
            new_cluster,
            evaluator.objective,
            evaluator.replicates,
            evaluator.random_seed,
        )
        slots = slots_of(new_plan, gpus_per_node_of(new_plan, new_cluster))
        search = _optimise(sub, slots, remaining, budget=0)
        evaluator.compositions += sub.compositions
        stats = sub.stats(search.greedy)
        gain, ci = estimate(_throughput_ratio(base, plan, stats, new_plan))
        detail.append(
            {
                "node": drained[-1],
                "throughput_per_gpu_gain": gain,
                "ci90": ci,
                "improves": bool(gain > 1.0),
                "mean_step_s": float(np.mean(stats.mean_s)),
                "gpus": world_size(new_plan),
                "dp": _size(new_plan, "dp"),
                "microbatches": _size(new_plan, "microbatches"),
            }
        )
    return advice, detail


def place(
    posterior: xr.DataTree,
    plan,
    *,
    objective: str = "mean",
    drain: int = 0,
    cluster=None,
    draws: int | None = 100,
    replicates: int = 32,
    random_seed: int = 0,
    random_placements: int = 8,
    max_compositions: int = 200,
) -> dict:
    """Assign measured nodes to a plan's node slots to minimise expected or p95 step time.

    Parameters
    ----------
    posterior
        Kernel-level fit with measured node effects (``node_effect``).
    plan
        ``bayesprism.plan.ParallelPlan``.
    objective
        ``"mean"`` (expected step time) or ``"p95"`` (95th percentile over steps), averaged
        over posterior draws.
    drain
        Number k of nodes to advise draining (for the best throughput per GPU).
    cluster
        ``bayesprism.plan.Cluster`` listing the candidate nodes; default: every measured node.
        There may be more nodes than slots (the rest are spares).
    draws, replicates, random_seed
        Posterior draws used (evenly spaced), steps per draw, seed of every composition.
    random_placements
        Number of uniformly random placements averaged for ``gain_vs_random``.
    max_compositions
        Budget of compositions of the local search.

    Returns
    -------
    dict
        ``assignment``: node -> ``{"slot", "ranks": [first, last], "stage", "replica",
        "tp_group"}`` (a list where a node spans several); ``spares``: unused nodes;
        ``objective`` and ``objective_s`` (optimised, mean over draws) with
        ``objective_ci90``; ``random_s``, ``worst_s``; ``gain_vs_random`` (random ÷ optimised
        objective, per draw then averaged; ≥ 1 is better) with ``gain_vs_random_ci90``,
        ``gain_vs_worst`` with ``gain_vs_worst_ci90``; ``drain``: the nodes to drain, best
        first; ``drain_detail``: for j = 1..k, the cumulative effect of draining the first j
        (``node``, ``throughput_per_gpu_gain`` = drained ÷ undrained throughput per GPU in
        micro-batches per second per GPU, with ``ci90`` and ``improves``, both placed by the
        greedy; ``mean_step_s``, ``gpus``, ``dp``, ``microbatches`` of the drained plan, which
        shrinks dp only when no spare is left, see :func:`drained_cluster`; a smaller plan
        also changes bubble and data-parallel communication, which this gain includes);
        ``node_effect_mean``; ``compositions``; ``draws``, ``replicates``, ``random_seed``.
    """
    check_kernel_posterior(posterior, "placement")
    if objective not in OBJECTIVES:
        raise InputError(
            Problem("arguments", "objective", f"must be one of {OBJECTIVES}", example=objective)
        )
    thinned = thin_draws(posterior, draws)
    ranking = rank_nodes(thinned)
    candidates = cluster_nodes(cluster) or list(ranking)
    unknown = [n for n in candidates if n not in set(ranking)]
    if unknown:
        raise InputError(
            Problem(
                "cluster", "nodes", "node not measured in the posterior", len(unknown), unknown[0]
            )
        )
    gpn = gpus_per_node_of(plan, cluster)
    slots = slots_of(plan, gpn)
    if len(candidates) < len(slots):
        raise PlanError(
            Problem(
                "cluster",
                "nodes",
                f"the plan needs {len(slots)} nodes, the cluster lists",
                example=len(candidates),
            )
        )
    slowest_first = [n for n in ranking if n in set(candidates)]
    evaluator = _Evaluator(thinned, plan, cluster, objective, replicates, random_seed)

    search = _optimise(evaluator, slots, slowest_first, max_compositions)
    optimised, classes_by_slack = search.order, search.class_order
    # Worst: the slowest nodes run, in the classes with least slack; the fastest stay spare.
    worst = _fill(slots, classes_by_slack[::-1], slowest_first) + slowest_first[len(slots) :]
    rng = np.random.default_rng(random_seed)
    random_orders = [list(rng.permutation(candidates)) for _ in range(random_placements)]
    random_per_draw = np.mean([evaluator.per_draw(o) for o in random_orders], axis=0)
    best = evaluator.per_draw(optimised)
    worst_per_draw = evaluator.per_draw(worst)

    result: dict = {
        "objective": objective,
        "assignment": {name: slot.position() for name, slot in zip(optimised, slots, strict=False)},
        "spares": list(optimised[len(slots) :]),
    }
    result["objective_s"], result["objective_ci90"] = estimate(best)
    result["random_s"], result["random_ci90"] = estimate(random_per_draw)
    result["worst_s"], result["worst_ci90"] = estimate(worst_per_draw)
    result["gain_vs_random"], result["gain_vs_random_ci90"] = estimate(random_per_draw / best)
    result["gain_vs_worst"], result["gain_vs_worst_ci90"] = estimate(worst_per_draw / best)
    result["drain"], result["drain_detail"] = _drain_advice(
        evaluator, search.greedy, cluster, plan, drain, slowest_first
    )
    result["node_effect_mean"] = {
        n: v for n, v in node_means(thinned).items() if n in set(candidates)
    }
    result.update(
        compositions=evaluator.compositions,
        draws=int(best.size),
        replicates=int(replicates),
        random_seed=int(random_seed),
    )
    return result
