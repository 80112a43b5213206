"""Composition: posterior draws of a kernel-level model -> step-time draws of a target plan.

NumPy only (never PyMC), vectorised over posterior draws. :func:`compose` reads the posterior
and ``inventory`` groups of ``docs/artifacts.md`` and returns a
:class:`~bayesprism.draws.StepDraws` of shape (draw, replicate): every posterior draw gets its
own cluster (new nodes and GPUs drawn from its population; measured nodes listed by the
:class:`~bayesprism.plan.Cluster` keep their own effects) and ``replicates`` simulated steps.

How the target plan's work and communication follow from the traced run (every scaling
assumption) is documented in ``bayesprism.workload``.

Variability
-----------
A rank's compute time in a step is its typical time times ``exp(T)`` with
``T = ln*u_node + lg*v_gpu + ls*w_step + lgs*z + rho``. The loadings are the work-weighted
averages, per draw, of the per-class loadings (a first-order treatment of the class mix);
``u``, ``v`` are persistent (fixed per posterior draw: the cluster), ``w`` (``step_effect``)
and collective congestion are shared by all ranks of a step, ``z`` (GPU x step) and ``rho``
are per rank and step. ``rho`` is the sum of the residuals of all the rank's launches in the
step, moment-matched by one lognormal factor (mean ``E[exp(resid)]``, relative variance
``sum_k n_k d_k^2 (e^{s^2}-1) e^{s^2} / (sum_k n_k d_k e^{s^2/2})^2``); fluctuations from one
micro-batch to the next within a step are therefore neglected (CV ~ s/sqrt(n), below 1% for
hundreds of launches). Collective transfers get one lognormal noise factor per step per term,
moment-matched the same way, times ``exp(coll_congestion * eta)`` with ``eta`` shared by all
traffic of the tier in the step. A stage's own data-parallel collectives are
:func:`ring_count` concurrent rings (one data-parallel group per tensor-parallel rank), each
drawing its own noise factor, and the stage's data-parallel phase ends with the slowest ring:
on the dev job's traces the per-launch noise of the data-parallel transfers (2 % beside a
3 % step-shared part) is independent between the groups of a stage.
A degraded inter-node link is a property of a node in the cluster (the draw), each node's with
probability ``coll_degraded_rate``, and it slows what crosses that node's links:
:func:`degraded_stages` draws which pipeline stages hold such a node (the stages a node's
ranks belong to, in rank order; ``1 - (1 - rate)^n`` for a stage on ``n`` nodes of its own).
In every step of such a cluster, the inter-node transfers of those stages (their data-parallel
gradient collectives, every data-parallel ring of the stage passing through the node, and
their pipeline transfers) move their bytes ``exp(coll_degraded_log_slowdown)`` times slower,
and so do the collectives over all ranks. A stage whose data-parallel collectives start early
(the last stage of a 1F1B pipeline finishes its backward first) can hide part of the extra
time behind the other stages' backward, as the per-stage finish times below say.

A synchronisation ends when its last member arrives, plus the transfer: the tensor-parallel
group of a stage runs each micro-batch at the pace of its slowest member, and at each of its
collectives waits for the member whose compute since the previous one came out slowest: the
launch-to-launch noise of a segment (relative sd ``kappa`` from the launches' residual
variance per µs of work and the traced work-weighted mean segment between the group's
collectives, ``sync_segment_us`` of the inventory; ``bayesprism.forecast.workload``) adds
``kappa * E[max_r((m_r - M) / kappa + z_r)]`` to the group's multiplier ``M = max_r m_r`` on
the share of the work in such segments (``bayesprism.forecast.groupwait``: the sum of the
segments' maxima, not the maximum of the sums, which equal members' noise makes the larger
by about ``1.4 kappa`` of the work for 8 members), the pipeline is the max-plus
recursion of ``bayesprism.schedules`` per data-parallel replica, the data-parallel collectives
start when the last replica finishes its backward, and the step ends after the slowest rank's
optimizer step (and the parameter AllGather under sharding).

Host idle and synchronisation
-----------------------------
GPU idle time inside a step (host work, data loading, launch gaps) is a random quantity per
rank and step. The traced step of each rank is cut at its collectives (``traced_idle_us`` of
the inventory, ``bayesprism.inventory``): before synchronisation ``j`` a rank idles ``I_j``,
gamma-distributed with the traced segment's mean and variance (parameter uncertainty by
Bayesian bootstrap over the traced rank-steps, ``bayesprism.workload.fit_idle_law``),
independent over ranks, steps and segments. A synchronous step waits at each synchronisation
for the slowest of the ``g_j`` ranks it joins (the collective's group in the target plan;
every rank at the step's end and for collectives of unknown role), so the step adds
``sum_j max_{g_j ranks} I_j``, each maximum drawn exactly by inverse CDF (``F^-1(U^(1/g))``),
identically in the exact and the fast path. The host time between steps (from the step's last
kernel to the next step's first: the loss read back, the next batch, the first launches;
``traced_step_gap_us``) is one more segment, of role ``boundary``, drawn once per step
(``g = 1``): the traces time it for the step as a whole, not per host, so it is carried over
as traced rather than grown with the hosts of the plan. Assumptions: the idle maxima add to the
kernels' critical path (an upper bound of the maximum of the sums, exact when either dominates; it
neglects that a rank slow in compute may idle little); a synchronisation of a sub-group waits
for one group's slowest rank (the spread between groups' sums is neglected); idle is carried
over per step unchanged (not scaled with the plan's work) and each rank's idle is capped at
``max_slowdown`` times its segment's mean. On the DLRM traces (8 ranks, one node, ~1.3 ms of
kernels a step, ranks starting up to 7.6 ms apart) this reproduces the traced step, 19.4 ms
from the first rank's first kernel to the last rank's end, and the ~5.9 ms a rank waits inside
collectives; per-rank spans (11-18.5 ms) are shorter because late ranks do not wait.

Random streams (common random numbers)
--------------------------------------
Every source of randomness (step-shared terms, new nodes' effects, new GPUs' effects,
transients, the fast path's order-statistic uniforms and its placement of the slowest nodes)
draws from its own generator, spawned from a ``SeedSequence`` seeded by the caller's ``rng``.
Shapes depend on the plan only, and effects of a fitted level are drawn even when its loading
is 0, so recomposing with a parameter changed (e.g. a loading set to exactly 0 by
``bayesprism.sensitivity``) and the same seed reuses every other number: counterfactuals are on
common random numbers even when a source consumes a parameter-dependent amount of its stream
(Student-t draws reject).

Slowdown cap
------------
A multiplicative slowdown of a rank's kernels cannot grow without bound: a node 100x slower is
dead (drained, or the job fails), not slow, and a heavy-tailed population fitted on a few
nodes (Student-t with nu near 1 and a poorly identified scale) otherwise yields maxima of
``exp(T)`` of 1e40 over 10^4 nodes. Each rank's log-multiplier ``T`` (every level and the
step's shared term together) is therefore capped at ``log(max_slowdown)``
(:data:`DEFAULT_MAX_SLOWDOWN` = 20x its typical pace, a ``compose`` argument) before any
maximum, mean or schedule: identically in the exact and fast paths (the cap is monotone, so it
commutes with the fast path's order statistics and the paths still agree). The share of
posterior draws in which the cap binds for some rank is counted; above :data:`CAP_WARN_SHARE`
a ``PlanWarning`` names the share and the level whose largest unit is typically the slowest
(loading times the population's 1 - 1/N quantile), whose tail fit deserves a look.

Exact path and fast path
------------------------
The exact path simulates every rank (used up to
:data:`~bayesprism.forecast.slots.EXACT_MAX_GPUS` GPUs by default; the rule is
:func:`~bayesprism.forecast.slots.composition_path`); it draws each posterior draw's cluster
once and keeps it over the replicates. The fast path
never draws all ranks: the :data:`TOP_REPLICAS` slowest nodes are sampled as order statistics
of the N new nodes by inverse CDF of ``F^N`` (``bayesprism.forecast.extremes``; their law holds the
GPU×step episode mixture, so every GPU-step of the cluster may bring an episode), land on
random stages of random (groups of ep) replicas, slowing together the replicas they share,
whose other stages are ordinary simulated stage groups capped at the slowest nodes' level
(they hold none of them); the step is the slowest of these replicas.
Measured nodes: when the :class:`~bayesprism.plan.Cluster` lists measured nodes (a placement:
node i of the list holds ranks ``i*gpus_per_node ...``), their positions matter, which the fast
path cannot represent; ``compose`` then always takes the exact path (``exact=False`` warns).
Persistence over replicates: ordinary stages keep their node/GPU effects within a draw, and
the slowest nodes' order-statistic uniforms are correlated over replicates by a Gaussian
copula with the persistent share of a rank's log-multiplier variance. Neglected: replicas that
are slow without holding one of the slowest nodes, and the conditioning of ordinary stages
beyond the cap, both of order ``TOP_REPLICAS / N`` (the path is meant for N >= 256 nodes).
Checked against the exact path at 2,048 GPUs (tests/test_composition.py): quantiles p05-p95
within 1%, the 90% interval of the mean step within 3%; with a Student-t (nu = 1.1) node
population whose cap binds in ~30% of steps, the capped share within 0.05 (the fast path's
is ~0.02 lower: the neglected replicas above) and p05-p50 within 15%, the sampling noise of
1,000 draws of so heavy a tail (tests/test_composition_regressions.py).

Breakdown (sums to the step time exactly)
-----------------------------------------
``compute_s``: the mean rank's compute in the step (all micro-batches plus optimizer), plus the
mean rank's host idle (below).
``exposed_comm_s``: stage collectives (TP/CP/EP) of all micro-batches plus the exposed
data-parallel collectives. ``bubble_s``: pipeline makespan with every stage at the mean rank's
pace minus that stage's busy time (fill/drain and point-to-point latency).
``wait_s``: the rest, i.e. waiting for stragglers, including the slowest ranks' host idle in
excess of the mean rank's (negative when the critical ranks happen to run faster than the mean
rank).

Training time (``bayesprism.forecast``): the replicates of one posterior draw share its
cluster (node and GPU effects are drawn once per draw in both paths; the fast path's slowest
nodes are correlated over replicates by their persistent variance share), so summing steps
resampled from a draw's replicates is one run on one fixed cluster.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import xarray as xr
from scipy import special

from bayesprism.errors import InputError, Problem
from bayesprism.forecast.draws import StepDraws
from bayesprism.forecast.extremes import RankLaw, top_node_log_multipliers
from bayesprism.forecast.groupwait import group_pace
from bayesprism.forecast.population import (
    draw_effects,
    episode_effect,
    population_family,
    population_quantile,
)
from bayesprism.forecast.schedules import Schedule, build_schedule, pipeline_finish
from bayesprism.forecast.slots import composition_path
from bayesprism.forecast.stepscale import compose_steps
from bayesprism.forecast.workload import (
    PlanModel,
    PosteriorArrays,
    build_plan_model,
    posterior_arrays,
)
from bayesprism.plan import Cluster, ParallelPlan, PlanWarning
from bayesprism.posterior import flat_draws

#: Default bound on a rank's slowdown: its compute multiplier ``exp(T)`` is capped at this.
DEFAULT_MAX_SLOWDOWN = 20.0
#: Share of posterior draws in which the cap binds above which ``compose`` warns.
CAP_WARN_SHARE = 0.01
#: Replicas holding the slowest nodes that the fast path simulates.
TOP_REPLICAS = 3
#: Random numbers per chunk of the exact path (bounds memory).
_CHUNK_ELEMENTS = 1 << 22


# ---------------------------------------------------------------------------- sampling
@dataclass
class _Shared:
    """Step-shared quantities, shape (D, R)."""

    step_log: np.ndarray  # ls * w
    # (D, R, pp) each stage's own collectives and pipeline transfers per micro-batch, forward
    stage_f_us: np.ndarray
    stage_b_us: np.ndarray
    p2p_us: np.ndarray
    dp_us: np.ndarray  # exposed data-parallel communication per step
    fallback_us: np.ndarray
    # (D, R, pp) data-parallel communication of each stage's own gradients, after its own
    # pipeline end (zeros when the plan model has no per-stage traffic)
    dp_stage_us: np.ndarray


@dataclass(frozen=True)
class _Streams:
    """One independent generator per source of randomness, so the numbers a source draws never
    depend on what (or whether) another source drew: counterfactuals with the same seed are on
    common random numbers whatever their parameter values."""

    shared: np.random.Generator  # step effect, congestion, collective noise
    node: np.random.Generator  # new nodes' effects
    gpu: np.random.Generator  # new GPUs' effects
    transient: np.random.Generator  # GPU x step effects and launch residuals
    order: np.random.Generator  # fast path: order-statistic uniforms of the slowest nodes
    layout: np.random.Generator  # fast path: replicas and stages of the slowest nodes
    idle: np.random.Generator  # host idle before synchronisations (order statistics)
    fabric: np.random.Generator  # which stages hold a node with a degraded link

    @classmethod
    def from_generator(cls, rng: np.random.Generator) -> _Streams:
        # seeded from the generator's state (not its seed sequence), so the same state gives
        # the same streams and successive calls with one generator get fresh streams
        root = np.random.SeedSequence(rng.integers(0, 2**63, size=4).tolist())
        # spawn keys are stable: adding a stream never changes the numbers of earlier ones
        return cls(*(np.random.default_rng(child) for child in root.spawn(8)))


def rank_law(model: PlanModel) -> RankLaw:
    """The per-draw law of a rank's log-multiplier of a plan model (for the fast path)."""
    return RankLaw(model.loading["node"], model.loading["gpu"], model.loading["gpustep"],
                   model.resid_mu, model.resid_sd, model.gpus_per_node, model.gpustep_slow)


def stage_node_blocks(plan: ParallelPlan, gpus_per_node: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Nodes grouped by the pipeline stages their ranks belong to (Megatron rank order: a
    stage's ranks are consecutive): the count of nodes of each group and its stage mask.

    Returns
    -------
    counts : numpy.ndarray
        (B,) nodes in each group.
    stages : numpy.ndarray
        (B, pp) bool: the stages the group's nodes hold ranks of.

    Examples
    --------
    >>> from bayesprism.plan import ParallelPlan
    >>> counts, stages = stage_node_blocks(ParallelPlan(dp=2, tp=8, pp=4, microbatches=8), 8)
    >>> counts.tolist(), stages.sum(axis=1).tolist()
    ([2, 2, 2, 2], [1, 1, 1, 1])
    >>> counts, stages = stage_node_blocks(ParallelPlan(dp=1, tp=4, pp=4, microbatches=8), 8)
    >>> counts.tolist(), stages.astype(int).tolist()
    ([1, 1], [[1, 1, 0, 0], [0, 0, 1, 1]])
    """
    per_stage = plan.gpus // plan.pp
    nodes = np.arange(math.ceil(plan.gpus / gpus_per_node))
    first = nodes * gpus_per_node // per_stage
    last = (np.minimum((nodes + 1) * gpus_per_node, plan.gpus) - 1) // per_stage
    # both are non-decreasing in the node: each group is a run of consecutive nodes
    starts = np.flatnonzero(np.r_[True, (np.diff(first) != 0) | (np.diff(last) != 0)])
    counts = np.diff(np.r_[starts, nodes.size])
    stage = np.arange(plan.pp)
    mask = (first[starts, None] <= stage) & (stage <= last[starts, None])
    return counts, mask


def degraded_stages(model: PlanModel, rng: np.random.Generator) -> np.ndarray:
    """(D, pp) bool: whether each pipeline stage of the cluster of each draw holds a node
    with a degraded inter-node link (none when the plan model has no degraded links).

    One uniform per draw and group of :func:`stage_node_blocks`, compared with
    ``1 - (1 - rate)^n`` for the group's ``n`` nodes: the numbers drawn depend on the plan
    only, and a higher rate never un-degrades a stage (common random numbers).
    """
    d, pp = model.draws, model.plan.pp
    if model.degraded_rate is None:
        return np.zeros((d, pp), dtype=bool)
    counts, mask = stage_node_blocks(model.plan, model.gpus_per_node)
    held = 1.0 - (1.0 - model.degraded_rate[:, None]) ** counts  # (D, B)
    hit = rng.random((d, len(counts))) < held
    return (hit[:, :, None] & mask).any(axis=1)


def degraded_link_probability(model: PlanModel) -> np.ndarray | None:
    """(D,) P(the plan's cluster has a node with a degraded link), None without them."""
    if model.degraded_rate is None:
        return None
    nodes = math.ceil(model.plan.gpus / model.gpus_per_node)
    return 1.0 - (1.0 - model.degraded_rate) ** nodes


def _draw_shared(model: PlanModel, replicates: int, rng: np.random.Generator,
                 fabric: np.random.Generator) -> _Shared:
    d, r = model.draws, replicates
    # a degraded link is a property of the cluster (the draw): every step of it pays, in the
    # stages that hold the node (collectives over every rank: in any of them)
    degraded = degraded_stages(model, fabric)
    degraded_any = degraded.any(axis=1)
    w = rng.standard_normal((d, r))
    keys = sorted({c.congestion_key for c in model.comms})
    eta = {key: rng.standard_normal((d, r)) for key in keys}
    totals = {key: np.zeros((d, r)) for key in ("stage", "p2p", "dp", "fallback")}
    per_stage = {"stage": np.zeros((d, r, model.plan.pp))}
    # a stage's data-parallel collectives run as one ring per tensor-parallel rank, each with
    # its own launch noise (the congestion is the tier's): the stage waits for the slowest ring
    rings = np.zeros((d, r, model.plan.pp, ring_count(model.plan)))
    for term in model.comms:
        own_rings = term.where == "dp" and term.stage is not None
        xi = rng.standard_normal((d, r, rings.shape[-1] if own_rings else 1))
        factor = np.exp(
            term.noise_mean_log[:, None, None]
            + term.noise_sd_log[:, None, None] * xi
            + (term.congestion_sd[:, None] * eta[term.congestion_key])[..., None]
        )
        det = term.det_us
        if term.degraded_extra_us is not None:
            slowed = degraded_any if term.stage is None else degraded[:, term.stage]
            det = det + np.where(slowed, term.degraded_extra_us, 0.0)
        if own_rings:
            rings[..., term.stage, :] += det[:, None, None] * factor
        elif term.stage is None:
            totals[term.where] += det[:, None] * factor[..., 0]
        else:
            per_stage[term.where][..., term.stage] += det[:, None] * factor[..., 0]
    per_stage["dp"] = rings.max(axis=-1)
    return _shared_of(model, model.loading["step"][:, None] * w, totals, per_stage)


def ring_count(plan: ParallelPlan) -> int:
    """Data-parallel groups a pipeline stage of one replica holds: one per tensor-parallel
    rank (the group spans the dp x cp ranks of that position), each its own ring.

    Examples
    --------
    >>> ring_count(ParallelPlan(tp=8, pp=4, dp=2))
    8
    """
    return plan.tp


def _shared_of(model: PlanModel, step_log: np.ndarray, totals: dict, per_stage: dict
               ) -> _Shared:
    """Totals per step (D, R) and per stage (D, R, pp) of every kind of traffic -> _Shared."""
    m = model.plan.microbatches
    exposed = 1.0 - float(model.plan.overlap)
    stage_mb = (totals["stage"][..., None] + per_stage["stage"]) / (2.0 * m)
    return _Shared(
        step_log=step_log,
        stage_f_us=stage_mb,
        stage_b_us=stage_mb,
        p2p_us=totals["p2p"],
        dp_us=exposed * totals["dp"],
        fallback_us=totals["fallback"],
        dp_stage_us=exposed * per_stage["dp"],
    )


def _posterior_subset(posterior: xr.DataTree, start: int, stop: int) -> xr.Dataset:
    """Posterior draws [start, stop) (chain-major) as a one-chain Dataset with the root attrs."""
    group = posterior["posterior"].to_dataset()
    flat = group.stack(sample=("chain", "draw")).isel(sample=slice(start, stop))
    flat = flat.drop_vars(["sample", "chain", "draw"]).rename({"sample": "draw"})
    flat = flat.expand_dims(chain=[0]).transpose("chain", "draw", ...)
    return flat.assign_attrs({**dict(posterior.attrs), **dict(group.attrs)})


def _new_effects(posterior, level: str, n: int, rng, loading: np.ndarray) -> np.ndarray:
    """Standardised effects of ``n`` new units per draw.

    Drawn whenever the level has a population, whatever its loading (a loading of exactly 0
    still consumes the same numbers of its stream); zeros only when the level was not fitted
    and carries no loading.
    """

    draws = loading.shape[0]
    if n == 0:
        return np.zeros((draws, n))
    try:
        population_family(posterior, level)
    except KeyError as exc:
        if not np.any(loading):
            return np.zeros((draws, n))
        raise InputError(Problem("posterior", f"{level}_population", str(exc))) from None
    return draw_effects(posterior, level, n, rng)


def _measured_effects(
    posterior: xr.DataTree, cluster: Cluster | None, n_nodes: int, gpn: int, draws: int
):
    """Measured node effects (D, M) and GPU effects (D, M, gpn) with NaN where not measured."""
    names = list(cluster.nodes[:n_nodes]) if cluster is not None else []
    if not names:
        return np.zeros((draws, 0)), np.zeros((draws, 0, gpn))
    group = posterior["posterior"].to_dataset()
    if "node_effect" not in group:
        raise InputError(
            Problem(
                cluster.source, "nodes", "the posterior has no measured node effects (node_effect)"
            )
        )
    known = set(group["node"].to_numpy().astype(str))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(
            Problem(
                cluster.source,
                "nodes",
                "not a measured node of the posterior",
                len(unknown),
                unknown[0],
            )
        )
    u = flat_draws(group["node_effect"].sel(node=names))
    v = np.full((draws, len(names), gpn), np.nan)
    if "gpu_effect" in group:
        labels = {str(x): i for i, x in enumerate(group["gpu_unit"].to_numpy())}
        gpu = flat_draws(group["gpu_effect"])
        for i, node in enumerate(names):
            for g in range(gpn):
                j = labels.get(f"{node}/{g}")
                if j is not None:
                    v[:, i, g] = gpu[:, j]
    return u, v


def _persistent(model: PlanModel, posterior, measured, streams, start: int, stop: int):
    """ln*u + lg*v of every rank for draws [start, stop), shape (n, G)."""
    plan, gpn = model.plan, model.gpus_per_node
    n_nodes = math.ceil(plan.gpus / gpn)
    d = model.draws
    subset = posterior if (start, stop) == (0, d) else _posterior_subset(posterior, start, stop)
    lu = model.loading["node"][start:stop]
    lv = model.loading["gpu"][start:stop]
    u_meas, v_meas = measured[0][start:stop], measured[1][start:stop]
    n_meas = u_meas.shape[1]
    u_new = _new_effects(subset, "node", n_nodes - n_meas, streams.node, lu)
    u = np.concatenate([u_meas, u_new], axis=1)
    v = _new_effects(subset, "gpu", n_nodes * gpn, streams.gpu, lv)
    v = v.reshape(stop - start, n_nodes, gpn)
    if n_meas:
        v[:, :n_meas] = np.where(np.isnan(v_meas), v[:, :n_meas], v_meas)
    per_rank = lu[:, None, None] * u[:, :, None] + lv[:, None, None] * v
    return per_rank.reshape(stop - start, -1)[:, : plan.gpus]


def _transient(model: PlanModel, rng, rows, shape) -> np.ndarray:
    """lgs*z + rho of rank-steps, ``shape`` = (draws of ``rows``, ...): GPU x step effects
    (with episodes under a ``degraded`` GPU×step population) and launch residuals."""
    ix = (rows,) + (None,) * (len(shape) - 1)
    z = rng.standard_normal(shape)
    rho = rng.standard_normal(shape)
    if model.gpustep_slow is not None:  # episodes: a share of GPU-steps shifted and wider
        weight, shift, sd = (values[ix] for values in model.gpustep_slow)
        z = np.where(rng.random(shape) < weight, episode_effect(shift, sd, z), z)
    return model.loading["gpustep"][ix] * z + model.resid_mu[ix] + model.resid_sd[ix] * rho


def _stage_times(model: PlanModel, shared: _Shared, multiplier: np.ndarray, sl):
    """Per-chunk forward/backward/weight durations from stage multipliers (..., pp)."""
    v = model.plan.virtual_stages if model.plan.schedule == "interleaved-1f1b" else 1
    ndim = multiplier.ndim
    per_stage = (-1,) + (1,) * (ndim - 2) + (model.fwd_us.shape[-1],)
    fwd = model.fwd_us[sl].reshape(per_stage)
    bwd = model.bwd_us[sl].reshape(per_stage)
    # (n, R, pp) -> (n, R, 1 ..., pp) against multipliers (n, R, ..., pp)
    comm_shape = shared.stage_f_us[sl].shape[:2] + (1,) * (ndim - 3) + (model.plan.pp,)
    comm_f = shared.stage_f_us[sl].reshape(comm_shape)
    comm_b = shared.stage_b_us[sl].reshape(comm_shape)
    f = (fwd * multiplier + comm_f) / v
    if model.plan.schedule == "zero-bubble":
        return f, (0.5 * bwd * multiplier + comm_b) / v, 0.5 * bwd * multiplier / v
    return f, (bwd * multiplier + comm_b) / v, None


def _noise_of(model: PlanModel, sl: slice, trailing: int) -> np.ndarray | None:
    """The plan's segment noise of draws ``sl``, against (draws, ``trailing`` more axes)."""
    if model.sync_noise is None:
        return None
    return model.sync_noise[sl].reshape((-1,) + (1,) * trailing)


def _exact(model, posterior, cluster, schedule, shared, replicates, streams, log_cap):
    """Simulate every rank: slowest finish, mean and max rank multiplier (D, R) and whether
    the slowdown cap bound in each draw (D,)."""
    plan = model.plan
    d_total, gpus = model.draws, plan.gpus
    chunk = max(1, _CHUNK_ELEMENTS // max(1, replicates * gpus))
    finish = np.empty((d_total, replicates))
    mean_mult = np.empty_like(finish)
    max_mult = np.empty_like(finish)
    capped = np.zeros(d_total, dtype=bool)
    q = plan.tp * plan.cp
    n_nodes = math.ceil(gpus / model.gpus_per_node)
    measured = _measured_effects(posterior, cluster, n_nodes, model.gpus_per_node, d_total)
    for start in range(0, d_total, chunk):
        stop = min(d_total, start + chunk)
        sl = slice(start, stop)
        persistent = _persistent(model, posterior, measured, streams, start, stop)
        t = _transient(model, streams.transient, sl, (stop - start, replicates, gpus))
        t += persistent[:, None, :]
        t += shared.step_log[sl][:, :, None]
        capped[sl] = (t > log_cap).any(axis=(1, 2))
        np.minimum(t, log_cap, out=t)
        mult = np.exp(t)
        mean_mult[sl] = mult.mean(axis=-1)
        max_mult[sl] = mult.max(axis=-1)
        groups = group_pace(mult.reshape(stop - start, replicates, plan.pp, plan.dp, q),
                            _noise_of(model, sl, 3), model.sync_share)
        if plan.ep > 1:  # expert all-to-all: ep replicas of a stage advance together
            shape = groups.shape
            coupled = groups.reshape(*shape[:-1], plan.dp // plan.ep, plan.ep).max(axis=-1)
            groups = np.repeat(coupled, plan.ep, axis=-1).reshape(shape)
        groups = np.swapaxes(groups, -1, -2)  # (n, R, dp, pp)
        f, b, w = _stage_times(model, shared, groups, sl)
        ends = pipeline_finish(schedule, f, b, w, shared.p2p_us[sl][..., None])
        finish[sl] = (ends + shared.dp_stage_us[sl][:, :, None, :]).max(axis=(-1, -2))
    return finish, mean_mult, max_mult, capped


def _fast(model, posterior, schedule, shared, replicates, streams, log_cap):
    """Slowest finish, mean and max rank multiplier (D, R) without simulating every rank, and
    whether the slowdown cap bound in each draw (D,). Every node is new (measured nodes go to
    the exact path, which keeps their positions).

    The ``TOP_REPLICAS`` slowest nodes (order statistics by inverse CDF) sit on random stages
    of random replicas (sharing a replica when they draw the same one), whose other stages are
    ordinary simulated stage groups; the step is the slowest of these ``TOP_REPLICAS`` replicas.
    """
    plan, gpn = model.plan, model.gpus_per_node
    d, r = model.draws, replicates
    n_nodes = math.ceil(plan.gpus / gpn)  # the cluster may override the plan's GPUs per node
    top = max(1, min(TOP_REPLICAS, n_nodes))  # slowest nodes placed explicitly
    sets = max(1, plan.dp // plan.ep)  # independent (groups of) replicas
    n_rep = min(top, sets)  # replicas simulated
    ln, lg = model.loading["node"], model.loading["gpu"]

    # one cluster per posterior draw: the slowest nodes' order-statistic uniforms are
    # correlated over replicates by the persistent share of a rank's log-multiplier
    # variance (Gaussian copula), so the same nodes tend to be slowest in every step
    law = rank_law(model)
    persistent_var = ln**2 + lg**2
    share = persistent_var / np.maximum(persistent_var + law.transient_variance(), 1e-300)
    share = np.sqrt(share)[:, None, None]
    z = share * streams.order.standard_normal((d, 1, top)) + np.sqrt(1.0 - share**2) * (
        streams.order.standard_normal((d, r, top)))
    slowest = top_node_log_multipliers(law, posterior, n_nodes, r, top,
                                       streams.order, uniforms=special.ndtr(z))

    # ordinary stage groups of q consecutive ranks (redrawn per replicate); with expert
    # parallelism a stage advances with its ep partner replicas, whose groups follow it in
    # rank order: the stage is the slowest of ep*q consecutive ranks, on their shared nodes
    q, ep = plan.tp * plan.cp, plan.ep
    members = ep * q
    nodes_per_stage = math.ceil(members / gpn)
    stages = r * n_rep * plan.pp
    groups = np.empty((d, r, n_rep, plan.pp))
    mean_mult = np.empty((d, r))
    capped = np.zeros(d, dtype=bool)
    chunk = max(1, _CHUNK_ELEMENTS // (stages * members))  # bounds memory
    for start in range(0, d, chunk):
        sl = slice(start, min(d, start + chunk))
        n = sl.stop - sl.start
        subset = posterior if n == d else _posterior_subset(posterior, sl.start, sl.stop)
        # persistent effects once per draw (the cluster), transients per replicate
        u = _new_effects(subset, "node", n_rep * plan.pp * nodes_per_stage, streams.node, ln[sl])
        u = u.reshape(n, 1, n_rep, plan.pp, nodes_per_stage)
        v = _new_effects(subset, "gpu", n_rep * plan.pp * members, streams.gpu, lg[sl])
        v = v.reshape(n, 1, n_rep, plan.pp, members)
        ix = (sl, None, None, None, None)
        t = _transient(model, streams.transient, sl, (n, r, n_rep, plan.pp, members))
        t += ln[ix] * u[..., np.arange(members) // gpn] + lg[ix] * v
        t += shared.step_log[sl][:, :, None, None, None]
        capped[sl] = (t > log_cap).any(axis=(1, 2, 3, 4))
        mult = np.exp(np.minimum(t, log_cap))
        # (n, R, n_rep, pp)
        groups[sl] = group_pace(mult, _noise_of(model, sl, 3), model.sync_share)
        mean_mult[sl] = mult.mean(axis=(-1, -2, -3))
    slowest = slowest + shared.step_log[..., None]
    capped |= (slowest > log_cap).any(axis=(1, 2))
    slow = np.exp(np.minimum(slowest, log_cap))  # (D, R, top)
    # ordinary stages hold none of the slowest nodes: cap them at the top-th slowest (their
    # conditional law given that, to first order in top/N per node)
    groups = np.minimum(groups, slow[..., -1:, None])
    # each slow node lands on a random stage of a random one of the dp/ep independent
    # (groups of) replicas; slow nodes that share a replica slow it together
    replica = np.broadcast_to(streams.layout.integers(0, sets, size=(d, 1, top)), (d, r, top))
    position = np.broadcast_to(streams.layout.integers(0, plan.pp, size=(d, 1, top)),
                               (d, r, top))
    slot = np.zeros((d, r, top), dtype=np.int64)  # dense index of each node's replica
    fresh = np.zeros((d, r), dtype=np.int64)
    for k in range(top):
        same = replica[..., :k] == replica[..., k : k + 1]
        seen = same.any(axis=-1)
        earlier = np.take_along_axis(slot[..., :k], same.argmax(axis=-1)[..., None], axis=-1)[
            ..., 0] if k else fresh
        slot[..., k] = np.where(seen, earlier, fresh)
        fresh = fresh + ~seen
    stage_mult = groups.reshape(d, r, n_rep * plan.pp).copy()
    for k in range(top):
        cell = (slot[..., k] * plan.pp + position[..., k])[..., None]
        current = np.take_along_axis(stage_mult, cell, axis=-1)
        np.put_along_axis(stage_mult, cell, np.maximum(current, slow[..., k, None]), axis=-1)
    stage_mult = stage_mult.reshape(d, r, n_rep, plan.pp)
    f, b, w = _stage_times(model, shared, stage_mult, slice(None))
    ends = pipeline_finish(schedule, f, b, w, shared.p2p_us[..., None])
    finish = (ends + shared.dp_stage_us[:, :, None, :]).max(axis=(-1, -2))
    max_mult = np.maximum(slow.max(axis=-1), groups.max(axis=(-1, -2)))
    return finish, mean_mult, max_mult, capped


# ---------------------------------------------------------------------------- assembly
def _schedule_for(model: PlanModel, typical_model: PlanModel) -> Schedule:
    plan = model.plan
    typical = None
    if plan.schedule == "zero-bubble":
        shared = _typical_shared(typical_model)
        f, b, w = _stage_times(typical_model, shared, np.ones((1, 1, plan.pp)), slice(None))
        typical = (f[0, 0], b[0, 0], w[0, 0], float(shared.p2p_us[0, 0]))
    return build_schedule(plan.schedule, plan.pp, plan.microbatches, plan.virtual_stages, typical)


def _typical_shared(model: PlanModel) -> _Shared:
    totals = {key: np.zeros((model.draws, 1)) for key in ("stage", "p2p", "dp", "fallback")}
    per_stage = {key: np.zeros((model.draws, 1, model.plan.pp)) for key in ("stage", "dp")}
    for term in model.comms:
        if term.stage is None:
            totals[term.where] += term.det_us[:, None]
        else:
            per_stage[term.where][..., term.stage] += term.det_us[:, None]
    return _shared_of(model, np.zeros((model.draws, 1)), totals, per_stage)


def _idle_law(model: PlanModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and variance of the idle segments (D, k) and the ranks each one waits for (k,)."""
    if model.idle_mean is None or model.idle_group is None:
        empty = np.zeros((model.draws, 0))
        return empty, empty, np.zeros(0, dtype=np.int64)
    return model.idle_mean, model.idle_var, model.idle_group


def _idle_draws(model: PlanModel, replicates: int, rng: np.random.Generator, log_cap: float,
                quantiles: dict | None = None):
    """Host idle a step adds, (D, R), and the mean rank's idle per step, (D,).

    At synchronisation ``j`` the step waits for the slowest of the ``g_j`` ranks of its group:
    the maximum of ``g_j`` i.i.d. gamma idle times, drawn exactly by inverse CDF,
    ``F^-1(U^(1/g))`` (the same numbers in the exact and the fast path). Each rank's idle is
    capped at ``max_slowdown`` times the segment's mean (as kernel multipliers are capped), and
    the mean rank's idle is the mean of that capped gamma. ``quantiles``: a memo of the
    inverse per segment, shared by the plans of one forecast (see :func:`compose`).
    """
    mean, var, group = _idle_law(model)
    u = rng.random((model.draws, replicates, group.size))
    spread = var > 0
    shape = np.where(spread, mean**2 / np.where(spread, var, 1.0), 1.0)[:, None, :]
    scale = np.where(spread, var / np.where(mean > 0, mean, 1.0), 0.0)[:, None, :]
    # upper tail 1 - U^(1/g) = -expm1(log(U) / g), exact even for g in the millions
    tail = -np.expm1(np.log(np.maximum(u, 1e-300)) / np.maximum(group, 1))
    x = _memo_upper_quantile(np.broadcast_to(shape, tail.shape), tail, quantiles) * scale
    cap = math.exp(log_cap) * mean[:, None, :]
    x = np.where(spread[:, None, :], np.minimum(np.nan_to_num(x, nan=np.inf), cap),
                 mean[:, None, :])
    # E[min(X, c)] = mean * P(k + 1, c/scale) + c * (1 - P(k, c/scale))
    k, theta, c = shape[:, 0], scale[:, 0], cap[:, 0]
    ratio = c / np.where(theta > 0, theta, 1.0)
    capped_mean = mean * special.gammainc(k + 1.0, ratio) + c * special.gammaincc(k, ratio)
    return x.sum(axis=-1), np.where(spread, capped_mean, mean).sum(axis=-1)


def _memo_upper_quantile(shape: np.ndarray, tail: np.ndarray, memo: dict | None) -> np.ndarray:
    """:func:`_gamma_upper_quantile` of (D, R, k) arrays, each of the k columns looked up in
    ``memo`` by its content (shape and tail) first and stored there after.

    The plans of one forecast draw the same uniforms (common random numbers), and a segment
    whose group and law do not change with the plan (tensor- and pipeline-parallel ones when
    only data parallelism grows) has the same quantiles in every plan: computed once.
    """
    if memo is None:
        return _gamma_upper_quantile(shape, tail)
    keys = [hashlib.blake2b(np.ascontiguousarray(shape[:, 0, j]).tobytes()
                            + np.ascontiguousarray(tail[..., j]).tobytes(),
                            digest_size=16).digest() for j in range(tail.shape[-1])]
    missing = [j for j, key in enumerate(keys) if key not in memo]
    if missing:
        fresh = _gamma_upper_quantile(shape[..., missing], tail[..., missing])
        for column, j in enumerate(missing):
            memo[keys[j]] = fresh[..., column]
    out = np.empty(tail.shape)  # (D, R, 0) when the job has no idle segments
    for j, key in enumerate(keys):
        out[..., j] = memo[key]
    return out


def _gamma_upper_quantile(shape: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """``special.gammainccinv(shape, tail)``, in blocks of rows on the machine's cores.

    The inverse is the forecast's costliest step when a job has hundreds of idle segments
    (dev traces: 311 segments x 1,000 draws x 8 replicates, 1.5 s of the 2 s per plan); the
    ufunc releases the GIL, so threads share it out. Element by element, hence the same
    numbers as one call.
    """
    # the cores this process may use (a container's share, not the host's count)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    workers = min(cores, 8, shape.shape[0])
    out = np.empty(tail.shape)

    def block(rows: slice) -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            out[rows] = special.gammainccinv(shape[rows], tail[rows])

    if workers <= 1 or tail.size < 100_000:
        block(slice(None))
        return out
    edges = np.linspace(0, shape.shape[0], workers + 1).astype(int)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(block, [slice(a, b) for a, b in itertools.pairwise(edges)]))
    return out


def _assemble(model, shared, schedule, finish, mean_mult, max_mult, idle, ideal_s):
    m = model.plan.microbatches
    after = shared.dp_us + shared.fallback_us
    step_idle, mean_idle = idle
    step_us = finish + after + model.opt_us[:, None] * max_mult + step_idle
    per_mb = (model.fwd_us + model.bwd_us).mean(axis=-1)[:, None]  # the mean stage's rank
    compute_us = (m * per_mb + model.opt_us[:, None]) * mean_mult
    compute_us = compute_us + mean_idle[:, None]
    stage_comm_us = (shared.stage_f_us + shared.stage_b_us).mean(axis=-1)  # the mean stage's
    exposed_us = (m * stage_comm_us + after
                  + shared.dp_stage_us.mean(axis=-1))
    uniform = np.broadcast_to(mean_mult[..., None], (*mean_mult.shape, model.plan.pp))
    f, b, w = _stage_times(model, shared, uniform, slice(None))
    makespan = pipeline_finish(schedule, f, b, w, shared.p2p_us).max(axis=-1)
    busy = m * per_mb * mean_mult + m * stage_comm_us
    bubble_us = np.maximum(makespan - busy, 0.0)
    wait_us = step_us - compute_us - exposed_us - bubble_us
    return StepDraws(
        step_us / 1e6, compute_us / 1e6, exposed_us / 1e6, bubble_us / 1e6, wait_us / 1e6, ideal_s
    )


def ideal_step_time(
    posterior: xr.DataTree, plan: ParallelPlan, cluster: Cluster | None = None
) -> float:
    """Variability-free step time (s) of ``plan``: every kernel at its typical duration
    (``exp(kernel_log_median)`` at the posterior median, times the mean of its launch-to-launch
    noise, since a step sums many launches), collectives at the median cost model, no unit,
    step or transient effects and no waiting (the schedule's structural bubble and every
    rank's mean host idle are included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        arrays = posterior_arrays(posterior)
        model = build_plan_model(posterior, plan, cluster, typical=True, arrays=arrays)
        full = build_plan_model(posterior, plan, cluster, arrays=arrays)
    return _ideal_from_model(model, _residual_mean(full))


def _residual_mean(model: PlanModel) -> float:
    """A step sums hundreds of launches, so the ideal step takes launch-to-launch noise at its
    mean E[exp(resid)] (posterior median), as the draws do: only unit, step and transient
    variability and waiting are left out of it."""
    return float(np.median(np.exp(model.resid_mu + 0.5 * model.resid_sd**2)))


def _ideal_from_model(model: PlanModel, residual_mean: float) -> float:
    schedule = _schedule_for(model, model)
    shared = _typical_shared(model)
    finish = (pipeline_finish(
        schedule,
        *_stage_times(model, shared, np.full((1, 1, model.plan.pp), residual_mean),
                      slice(None)),
        shared.p2p_us,
    ) + shared.dp_stage_us).max(axis=-1)
    step = finish + shared.dp_us + shared.fallback_us + model.opt_us[:, None] * residual_mean
    mean, _, _ = _idle_law(model)
    step = step + mean.sum(axis=-1, keepdims=True)
    return float(step[0, 0]) / 1e6


def _dominant_level(model: PlanModel, posterior, n_nodes: int) -> str:
    """The level whose largest unit is typically the slowest: per level, the loading times the
    population's 1 - 1/N quantile over its N units (median over draws)."""

    gpus = model.plan.gpus
    spans = {}
    for level, units in (("node", n_nodes), ("gpu", gpus)):
        loading = model.loading[level]
        if not np.any(loading):
            continue
        try:
            top = population_quantile(posterior, level, 1.0 - 1.0 / (units + 1.0))
        except KeyError:
            continue
        spans[level] = float(np.median(loading * top))
    transient = np.sqrt(model.loading["gpustep"] ** 2 + model.resid_sd**2)
    spans["transient (GPU x step, launch residual)"] = float(
        np.median(model.resid_mu + transient * special.ndtri(1.0 - 1.0 / (gpus + 1.0))))
    return max(spans, key=spans.get)


def _warn_if_capped(model, posterior, capped: np.ndarray, max_slowdown: float) -> None:
    share = float(np.mean(capped)) if capped.size else 0.0
    if share > CAP_WARN_SHARE:
        n_nodes = math.ceil(model.plan.gpus / model.gpus_per_node)
        level = _dominant_level(model, posterior, n_nodes)
        warnings.warn(
            f"{model.plan.name}: the slowdown cap (max_slowdown = {max_slowdown:g}x a rank's "
            f"typical pace) binds in {share:.0%} of posterior draws; the slowest units come "
            f"from the {level} level, whose fitted tail would make them slower still "
            "(check that population's fit)",
            PlanWarning,
            stacklevel=3,
        )


def compose(
    posterior: xr.DataTree,
    plan: ParallelPlan,
    *,
    replicates: int = 4,
    rng: np.random.Generator,
    cluster: Cluster | None = None,
    exact: bool | None = None,
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
    arrays: PosteriorArrays | None = None,
    idle_quantiles: dict | None = None,
) -> StepDraws:
    """Posterior predictive step-time draws of ``plan``, shape (chain*draw, replicates).

    Parameters
    ----------
    posterior
        A fit (``docs/artifacts.md``); every posterior draw is used (thin it beforehand).
        Step-kind posteriors are composed by ``bayesprism.stepscale.compose_steps``.
    plan
        The target layout.
    replicates
        Simulated steps per posterior draw.
    rng
        Source of randomness (same generator state, same numbers; every source of randomness
        gets its own stream seeded from it, so parameter values never shift another source's
        numbers).
    cluster
        GPUs per node, link-tier overrides and measured nodes to use.
    exact
        Simulate every rank (True), use the order-statistics fast path (False) or decide by
        scale (None: exact up to :data:`~bayesprism.forecast.slots.EXACT_MAX_GPUS` GPUs), as
        :func:`~bayesprism.forecast.slots.composition_path` decides. Measured nodes listed by
        the cluster always take the exact path, which keeps their positions (``False`` then
        warns).
    max_slowdown
        Largest multiplier of a rank's compute time (> 1); a rank's log-multiplier is capped
        at ``log(max_slowdown)`` in both paths, with a ``PlanWarning`` when the cap binds in
        more than :data:`CAP_WARN_SHARE` of the posterior draws.
    arrays
        ``bayesprism.workload.posterior_arrays(posterior)`` when the caller composes several
        plans on one posterior (extracted here otherwise).
    idle_quantiles
        An empty dict shared by the calls composing several plans on one posterior, each with
        a generator in the same state: the host idle's inverse-CDF values of a segment the
        plans share are computed once (the same numbers as without it).
    """
    if posterior.attrs.get("model_kind") == "step":

        return compose_steps(posterior, plan, replicates=replicates, rng=rng)
    if not (isinstance(replicates, int) and replicates >= 1):
        raise InputError(
            Problem("arguments", "replicates", "must be a positive integer", example=replicates)
        )
    if not (isinstance(max_slowdown, int | float) and max_slowdown > 1.0):
        raise InputError(
            Problem("arguments", "max_slowdown", "must be a number above 1", example=max_slowdown)
        )
    log_cap = math.log(max_slowdown)
    arrays = posterior_arrays(posterior) if arrays is None else arrays
    model = build_plan_model(posterior, plan, cluster, arrays=arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        typical_model = build_plan_model(posterior, plan, cluster, typical=True, arrays=arrays)
    ideal_s = _ideal_from_model(typical_model, _residual_mean(model))
    schedule = _schedule_for(model, typical_model)
    streams = _Streams.from_generator(rng)
    shared = _draw_shared(model, replicates, streams.shared, streams.fabric)
    use_exact = composition_path(plan, cluster, exact) == "exact"
    if use_exact and exact is False:
        warnings.warn(
            f"{plan.name}: the fast path cannot keep measured node positions; "
            "composed exactly (every rank simulated)",
            PlanWarning,
            stacklevel=2,
        )
    if use_exact:
        finish, mean_mult, max_mult, capped = _exact(
            model, posterior, cluster, schedule, shared, replicates, streams, log_cap)
    else:
        finish, mean_mult, max_mult, capped = _fast(
            model, posterior, schedule, shared, replicates, streams, log_cap)
    _warn_if_capped(model, posterior, capped, max_slowdown)
    idle = _idle_draws(model, replicates, streams.idle, log_cap, idle_quantiles)
    draws = _assemble(model, shared, schedule, finish, mean_mult, max_mult, idle, ideal_s)
    link = degraded_link_probability(model)
    if link is not None:
        draws = dataclasses.replace(draws, degraded_link_probability=float(link.mean()))
    return dataclasses.replace(draws, extrapolated=model.extrapolated)
