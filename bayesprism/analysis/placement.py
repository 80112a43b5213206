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
   exchangeable across data-parallel replicas. Each class is probed by composing a posterior
   in which only the slowest node is degraded (every other measured node and GPU set to the
   population's centre), with that node in one slot of the class: the probe's step time says
   how much slack the class has for a slow node.
3. Greedy: stages in order of slack; within a stage, one replica's node group (its pieces,
   most slack first) before the next replica's. The slowest nodes take the slots in that
   order, so slow nodes share a tensor-parallel group and a pipeline (the group runs at its
   slowest member's pace anyway) instead of slowing many.
4. Local search: swaps of each of the slowest nodes with a representative slot of every other
   class (and with the fastest spare), evaluated by composition with common random numbers,
   accepted when the objective improves by more than :data:`MIN_IMPROVEMENT`, until no swap
   helps or the budget is spent.

Every placement is composed on the composition's exact path (every rank simulated), because
the fast path for very large plans does not keep node positions.

The placement reported is the best of every placement composed (greedy, local search, random),
the worst the worst of them (including the greedy in reverse: least slack first, slow nodes
spread over replicas, fastest nodes left as spares). Because picking the minimum of noisy
evaluations flatters it, the reported step times and gains come from recomposing the chosen,
the worst and the random placements with fresh random numbers (common to all three).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from bayesprism.analysis.counterfactual import (
    PerDraw,
    check_kernel_posterior,
    compose_with_seed,
    estimate,
)
from bayesprism.errors import InputError, Problem
from bayesprism.forecast.slots import (
    Slot,
    cluster_nodes,
    degree,
    drained_cluster,
    gpus_per_node_of,
    node_means,
    rank_nodes,
    slots_of,
    with_nodes,
    world_size,
)
from bayesprism.forecast.workload import posterior_arrays
from bayesprism.posterior import posterior_group, thin_draws, with_posterior_group

OBJECTIVES = ("mean", "p95")
#: Relative improvement a swap must bring to be accepted: smaller ones are mostly Monte-Carlo
#: noise of the replicates, and chasing them spends the budget on a random walk.
MIN_IMPROVEMENT = 1e-3


# --------------------------------------------------------------------------- evaluation


class _Evaluator:
    """Composes placements with common random numbers and caches their per-draw statistics."""

    def __init__(self, posterior, plan, cluster, objective, replicates, random_seed):
        self.posterior, self.plan, self.cluster = posterior, plan, cluster
        self.objective, self.replicates, self.random_seed = objective, replicates, random_seed
        self.cache: dict[tuple[str, ...], PerDraw] = {}
        self.compositions = 0
        # every placement composes the same posterior: its arrays are extracted once
        self.arrays = posterior_arrays(posterior)

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
                # the fast path puts the slowest node on a random stage: positions need exact
                exact=True,
                arrays=self.arrays,
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


def _probe_tree(posterior: xr.DataTree, node: str) -> xr.DataTree:
    """The posterior with every measured node (and its GPUs) typical except ``node``."""
    group = posterior_group(posterior)
    effect = group["node_effect"]
    group = group.assign(node_effect=effect.where(effect["node"] == node, 0.0))
    if "gpu_effect" in group:
        gpu = group["gpu_effect"]
        own = np.char.startswith(gpu["gpu_unit"].to_numpy().astype(str), f"{node}/")
        group = group.assign(gpu_effect=gpu.where(xr.DataArray(own, dims="gpu_unit"), 0.0))
    return with_posterior_group(posterior, group)


def _probe_kinds(
    evaluator: _Evaluator, slots: list[Slot], used: list[str], spares: list[str]
) -> dict[tuple, float]:
    """Objective with only the slowest node degraded, placed in one slot of each kind."""
    kinds = list(dict.fromkeys(slot.kind for slot in slots))
    if len(kinds) == 1:
        return {kinds[0]: 0.0}
    probe = _Evaluator(
        _probe_tree(evaluator.posterior, used[0]),
        evaluator.plan,
        evaluator.cluster,
        evaluator.objective,
        evaluator.replicates,
        evaluator.random_seed,
    )
    values = {}
    for kind in kinds:
        target = next(s.index for s in slots if s.kind == kind)
        order = used[1:]
        order.insert(target, used[0])
        values[kind] = probe.value(order + spares)
    evaluator.compositions += probe.compositions
    return values


def _fill_order(slots: list[Slot], probes: dict[tuple, float], best: bool) -> list[int]:
    """Slot indices in the order the slowest nodes take them.

    ``best``: stages by most slack (lowest probe); within a stage, one replica's node group
    (its pieces, most slack first) before the next replica, so slow nodes share tensor-parallel
    groups and pipelines instead of slowing many. Otherwise the reverse: least slack first and
    one slow node per replica before the next piece (spreading them).
    """
    stage_score: dict[tuple, float] = {}
    for slot in slots:
        score = probes[slot.kind]
        stage_score[slot.stages] = min(score, stage_score.get(slot.stages, np.inf))
    if best:
        key = lambda s: (stage_score[s.stages], s.stages, s.replicas, probes[s.kind], s.index)  # noqa: E731
    else:
        key = lambda s: (-stage_score[s.stages], s.stages, -probes[s.kind], s.replicas, s.index)  # noqa: E731
    return [s.index for s in sorted(slots, key=key)]


def _fill(order: list[int], nodes_slowest_first: list[str]) -> list[str]:
    """Names in slot order when the slots in ``order`` take the nodes slowest first."""
    placed = [""] * len(order)
    for index, node in zip(order, nodes_slowest_first, strict=False):
        placed[index] = node
    return placed


@dataclass(frozen=True)
class _Search:
    order: list[str]  # optimised placement (slot order, then spares)
    greedy: list[str]  # the greedy placement before local search
    worst: list[str]  # the greedy in reverse (least slack first, slow nodes spread)


def _optimise(
    evaluator: _Evaluator, slots: list[Slot], slowest_first: list[str], budget: int
) -> _Search:
    """Probe slot kinds, fill greedily, then improve by pairwise swaps (module docstring)."""
    n_spare = len(slowest_first) - len(slots)
    spares, used = slowest_first[:n_spare], slowest_first[n_spare:]
    probes = _probe_kinds(evaluator, slots, used, spares)
    greedy = _fill(_fill_order(slots, probes, best=True), used) + spares
    # the worst keeps the slowest nodes running and the fastest spare
    worst = (
        _fill(_fill_order(slots, probes, best=False), slowest_first) + slowest_first[len(slots) :]
    )
    current, value = list(greedy), evaluator.value(greedy)
    rank = {name: i for i, name in enumerate(slowest_first)}
    kinds = list(probes)
    improved = len(kinds) > 1 or bool(spares)
    while improved and evaluator.compositions < budget:
        improved = False
        for node in used[: min(len(used), 8)]:
            position = current.index(node)
            candidates = []
            for kind in kinds:
                if kind == slots[position].kind:
                    continue
                in_kind = [s.index for s in slots if s.kind == kind]
                candidates.append(max(in_kind, key=lambda i: rank[current[i]]))
            # a spare faster than this node (only after a swap moved a slow node to spares)
            candidates.extend(
                i for i in range(len(slots), len(current)) if rank[current[i]] > rank[node]
            )
            for other in candidates:
                if evaluator.compositions >= budget:
                    break
                trial = list(current)
                trial[position], trial[other] = trial[other], trial[position]
                trial_value = evaluator.value(trial)
                if trial_value < value * (1.0 - MIN_IMPROVEMENT):
                    current, value, improved = trial, trial_value, True
                    break
    return _Search(order=current, greedy=greedy, worst=worst)


def _throughput_ratio(base: PerDraw, base_plan, other: PerDraw, other_plan) -> np.ndarray:
    """Per-draw throughput per GPU of ``other`` ÷ ``base`` (micro-batches per second per GPU)."""

    def batch(plan) -> int:
        return degree(plan, "dp") * degree(plan, "microbatches")

    return (
        (batch(other_plan) / batch(base_plan))
        * (base.mean_s / other.mean_s)
        * (world_size(base_plan) / world_size(other_plan))
    )


def _drain_advice(
    evaluator: _Evaluator, greedy: list[str], cluster, plan, k: int, slowest_first: list[str],
    *, new_nodes: int = 0,
):
    """Throughput per GPU after draining 1..k of the k slowest nodes, and the drain advised.

    The advice is the first j of them with the best cumulative gain, when that gain is above 1
    (none otherwise), so it never contradicts its numbers.

    With ``new_nodes`` (a plan larger than the measured nodes), a drained node's slot runs a
    new node from the population and the plan is unchanged.
    """
    if k < 0 or k > len(slowest_first):
        raise InputError(
            Problem("arguments", "drain", f"must be between 0 and {len(slowest_first)}", example=k)
        )
    advice = slowest_first[:k]
    base = evaluator.stats(greedy)
    detail = []
    for j in range(1, k + 1):
        drained = advice[:j]
        remaining = [n for n in slowest_first if n not in set(drained)]
        if new_nodes:
            # at scale the pool is the population: a new node takes the drained one's place
            new_cluster, new_plan = with_nodes(cluster, remaining, plan), plan
        else:
            new_cluster, new_plan, _ = drained_cluster(cluster, plan, drained, slowest_first)
        sub = _Evaluator(
            evaluator.posterior,
            new_plan,
            new_cluster,
            evaluator.objective,
            evaluator.replicates,
            evaluator.random_seed,
        )
        slots = slots_of(new_plan, gpus_per_node_of(new_plan, new_cluster))[: len(remaining)]
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
                "dp": degree(new_plan, "dp"),
                "microbatches": degree(new_plan, "microbatches"),
            }
        )
    gains = [item["throughput_per_gpu_gain"] for item in detail]
    best = int(np.argmax(gains)) + 1 if gains and max(gains) > 1.0 else 0
    return advice[:best], detail


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
        "tp_group"}``: the node's slot (position in the cluster's node list), its first and
        last global rank, pipeline stage, data-parallel replica and tensor-parallel group
        (global index ``rank // tp``), each a list where the node holds several;
        ``spares``: unused nodes; ``local_search_improved``;
        ``objective`` and ``objective_s`` (optimised, mean over draws) with
        ``objective_ci90``; ``random_s``, ``worst_s``; ``gain_vs_random`` (random ÷ optimised
        objective, per draw then averaged; ≥ 1 is better) with ``gain_vs_random_ci90``,
        ``gain_vs_worst`` with ``gain_vs_worst_ci90``; ``drain``: the nodes to drain, slowest
        first: the first j of the k slowest whose draining gives the best throughput per GPU,
        when that beats not draining (empty otherwise); ``drain_detail``: for j = 1..k, the
        cumulative effect of draining the first j
        (``node``, ``throughput_per_gpu_gain`` = drained ÷ undrained throughput per GPU in
        micro-batches per second per GPU, with ``ci90`` and ``improves``, both placed by the
        greedy; ``mean_step_s``, ``gpus``, ``dp``, ``microbatches`` of the drained plan, which
        shrinks dp only when no spare is left, see :func:`drained_cluster`; a smaller plan
        also changes bubble and data-parallel communication, which this gain includes);
        ``node_effect_mean``; ``new_nodes``: slots run by new nodes drawn from the population
        (a plan larger than the measured nodes: those fill the first slots and keep their
        effects; a drained node is replaced by a new one and the plan is kept);
        ``compositions``; ``draws``, ``replicates``, ``random_seed``.

    Examples
    --------
    >>> import bayesprism as bp
    >>> posterior = bp.load("posterior.nc")  # doctest: +SKIP
    >>> advice = place(posterior, bp.ParallelPlan(dp=16), drain=2)  # doctest: +SKIP
    """
    if not (isinstance(drain, int) and not isinstance(drain, bool) and drain >= 0):
        raise InputError(Problem("arguments", "drain", "must be a whole number >= 0",
                                 example=drain))
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
    # A plan larger than the measured nodes (the usual case at the planned scale): the measured
    # nodes keep their effects in the slots the composition gives measured nodes (the first
    # ones), and the other slots run new nodes drawn from the fitted population.
    new_nodes = max(0, len(slots) - len(candidates))
    if new_nodes:
        slots = slots[: len(candidates)]
    slowest_first = [n for n in ranking if n in set(candidates)]
    if drain > len(slowest_first):
        # checked before the search: it takes most of the run
        raise InputError(Problem("arguments", "drain", f"must be between 0 and "
                                 f"{len(slowest_first)} (the measured nodes to place)",
                                 example=drain))
    evaluator = _Evaluator(thinned, plan, cluster, objective, replicates, random_seed)

    search = _optimise(evaluator, slots, slowest_first, max_compositions)
    rng = np.random.default_rng(random_seed)
    random_orders = [list(rng.permutation(candidates)) for _ in range(random_placements)]
    random_per_draw = np.mean([evaluator.per_draw(o) for o in random_orders], axis=0)
    evaluator.per_draw(search.worst)
    # Report the best and the worst of every placement composed (greedy, local search, random
    # and reverse greedy), so a heuristic miss never reports a gain below what was seen.
    optimised = min(evaluator.cache, key=evaluator.value)
    worst = max(evaluator.cache, key=evaluator.value)
    # Choosing the minimum of noisy evaluations flatters it; the reported values and gains are
    # therefore recomposed with fresh random numbers (common to the three comparisons).
    fresh_seed = int(np.random.SeedSequence([random_seed, 1]).generate_state(1)[0])
    check = _Evaluator(thinned, plan, cluster, objective, replicates, fresh_seed)
    best = check.per_draw(optimised)
    worst_per_draw = check.per_draw(worst)
    random_per_draw = np.mean([check.per_draw(o) for o in random_orders], axis=0)
    evaluator.compositions += check.compositions

    result: dict = {
        "objective": objective,
        "assignment": {name: slot.position() for name, slot in zip(optimised, slots, strict=False)},
        "spares": list(optimised[len(slots) :]),
        "local_search_improved": list(search.order) != list(search.greedy),
    }
    result["objective_s"], result["objective_ci90"] = estimate(best)
    result["random_s"], result["random_ci90"] = estimate(random_per_draw)
    result["worst_s"], result["worst_ci90"] = estimate(worst_per_draw)
    result["gain_vs_random"], result["gain_vs_random_ci90"] = estimate(random_per_draw / best)
    result["gain_vs_worst"], result["gain_vs_worst_ci90"] = estimate(worst_per_draw / best)
    result["drain"], result["drain_detail"] = _drain_advice(
        evaluator, search.greedy, cluster, plan, drain, slowest_first, new_nodes=new_nodes
    )
    result["new_nodes"] = new_nodes
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
