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
moment-matched the same way, times ``exp(coll_congestion * eta)`` with ``eta`` shared by the step.

A synchronisation ends when its last member arrives, plus the transfer: the tensor-parallel
group of a stage runs each micro-batch at the pace of its slowest member (max of sums over the
micro-batch, exact when variability persists over the step), the pipeline is the max-plus
recursion of ``bayesprism.schedules`` per data-parallel replica, the data-parallel collectives
start when the last replica finishes its backward, and the step ends after the slowest rank's
optimizer step (and the parameter AllGather under sharding).

Exact path and fast path
------------------------
The exact path simulates every rank (used up to :data:`EXACT_MAX_GPUS` GPUs by default); it
draws each posterior draw's cluster once and keeps it over the replicates. The fast path
never draws all ranks: the :data:`TOP_REPLICAS` slowest nodes are sampled as order statistics
of the N new nodes by inverse CDF of ``F^N`` (``bayesprism.extremes``; measured nodes are
simulated), land on random stages of random (groups of ep) replicas, slowing together the
replicas they share, whose other stages are ordinary simulated stage groups capped at the
slowest nodes' level (they hold none of them); the step is the slowest of these replicas.
Persistence over replicates: ordinary stages keep their node/GPU effects within a draw, and
the slowest nodes' order-statistic uniforms are correlated over replicates by a Gaussian
copula with the persistent share of a rank's log-multiplier variance. Neglected: replicas that
are slow without holding one of the slowest nodes, and the conditioning of ordinary stages
beyond the cap, both of order ``TOP_REPLICAS / N`` (the path is meant for N >= 256 nodes).
Checked against the exact path at 2,048 GPUs (tests/test_composition.py): quantiles p05-p95
within 1%, the 90% interval of the mean step within 3%.

Breakdown (sums to the step time exactly)
-----------------------------------------
``compute_s``: the mean rank's compute in the step (all micro-batches plus optimizer), plus the
traced GPU idle time inside a step (host work and launch gaps: the median over traced rank-steps
of the measured span minus the expected kernel time, carried over unchanged per step; zero when
the inventory has no ``traced_step_time_us``).
``exposed_comm_s``: stage collectives (TP/CP/EP) of all micro-batches plus the exposed
data-parallel collectives. ``bubble_s``: pipeline makespan with every stage at the mean rank's
pace minus that stage's busy time (fill/drain and point-to-point latency).
``wait_s``: the rest, i.e. waiting for stragglers (negative when the critical ranks happen to
run faster than the mean rank).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr
from scipy import special

from bayesprism.draws import StepDraws
from bayesprism.errors import InputError, Problem
from bayesprism.extremes import RankLaw, top_node_log_multipliers
from bayesprism.plan import Cluster, ParallelPlan, PlanWarning
from bayesprism.schedules import Schedule, build_schedule, pipeline_finish
from bayesprism.workload import PlanModel, build_plan_model, flat_draws

EXACT_MAX_GPUS = 2048
#: Replicas holding the slowest nodes that the fast path simulates.
TOP_REPLICAS = 3
#: Random numbers per chunk of the exact path (bounds memory).
_CHUNK_ELEMENTS = 1 << 22


# ---------------------------------------------------------------------------- sampling
@dataclass
class _Shared:
    """Step-shared quantities, shape (D, R)."""

    step_log: np.ndarray  # ls * w
    stage_f_us: np.ndarray  # stage collectives per micro-batch, forward
    stage_b_us: np.ndarray
    p2p_us: np.ndarray
    dp_us: np.ndarray  # exposed data-parallel communication per step
    fallback_us: np.ndarray


def rank_law(model: PlanModel) -> RankLaw:
    """The per-draw law of a rank's log-multiplier of a plan model (for the fast path)."""
    return RankLaw(model.loading["node"], model.loading["gpu"], model.loading["gpustep"],
                   model.resid_mu, model.resid_sd, model.gpus_per_node)


def _draw_shared(model: PlanModel, replicates: int, rng: np.random.Generator) -> _Shared:
    d, r = model.draws, replicates
    w = rng.standard_normal((d, r))
    kinds = sorted({c.kind for c in model.comms})
    eta = {kind: rng.standard_normal((d, r)) for kind in kinds}
    totals = {key: np.zeros((d, r)) for key in ("stage", "p2p", "dp", "fallback")}
    for term in model.comms:
        xi = rng.standard_normal((d, r))
        factor = np.exp(
            term.noise_mean_log[:, None]
            + term.noise_sd_log[:, None] * xi
            + term.congestion_sd[:, None] * eta[term.kind]
        )
        totals[term.where] += term.det_us[:, None] * factor
    m = model.plan.microbatches
    return _Shared(
        step_log=model.loading["step"][:, None] * w,
        stage_f_us=totals["stage"] / (2.0 * m),
        stage_b_us=totals["stage"] / (2.0 * m),
        p2p_us=totals["p2p"],
        dp_us=(1.0 - float(model.plan.overlap)) * totals["dp"],
        fallback_us=totals["fallback"],
    )


def _posterior_subset(posterior: xr.DataTree, start: int, stop: int) -> xr.Dataset:
    """Posterior draws [start, stop) (chain-major) as a one-chain Dataset with the root attrs."""
    group = posterior["posterior"].to_dataset()
    flat = group.stack(sample=("chain", "draw")).isel(sample=slice(start, stop))
    flat = flat.drop_vars(["sample", "chain", "draw"]).rename({"sample": "draw"})
    flat = flat.expand_dims(chain=[0]).transpose("chain", "draw", ...)
    return flat.assign_attrs({**dict(posterior.attrs), **dict(group.attrs)})


def _new_effects(posterior, level: str, n: int, rng, loading: np.ndarray) -> np.ndarray:
    """Standardised effects of ``n`` new units per draw (zeros when the level is not fitted)."""
    from bayesprism.population import draw_effects

    draws = loading.shape[0]
    if n == 0 or not np.any(loading):
        return np.zeros((draws, n))
    try:
        return draw_effects(posterior, level, n, rng)
    except KeyError as exc:
        raise InputError(Problem("posterior", f"{level}_population", str(exc))) from None


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


def _rank_log_multipliers(model, posterior, cluster, replicates, rng, start, stop, persistent):
    """T for every rank, shape (stop-start, R, G) (without the shared step term)."""
    gpus = model.plan.gpus
    lg = model.loading["gpustep"][start:stop, None, None]
    z = rng.standard_normal((stop - start, replicates, gpus))
    rho = rng.standard_normal((stop - start, replicates, gpus))
    t = persistent[:, None, :] + lg * z
    t += model.resid_mu[start:stop, None, None] + model.resid_sd[start:stop, None, None] * rho
    return t


def _persistent(model: PlanModel, posterior, cluster, rng, start: int, stop: int) -> np.ndarray:
    """ln*u + lg*v of every rank for draws [start, stop), shape (n, G)."""
    plan, gpn = model.plan, model.gpus_per_node
    n_nodes = math.ceil(plan.gpus / gpn)
    subset = _posterior_subset(posterior, start, stop)
    lu = model.loading["node"][start:stop]
    lv = model.loading["gpu"][start:stop]
    u_meas, v_meas = _measured_effects(posterior, cluster, n_nodes, gpn, model.draws)
    u_meas, v_meas = u_meas[start:stop], v_meas[start:stop]
    n_meas = u_meas.shape[1]
    u = np.concatenate([u_meas, _new_effects(subset, "node", n_nodes - n_meas, rng, lu)], axis=1)
    v = _new_effects(subset, "gpu", n_nodes * gpn, rng, lv).reshape(stop - start, n_nodes, gpn)
    if n_meas:
        v[:, :n_meas] = np.where(np.isnan(v_meas), v[:, :n_meas], v_meas)
    per_rank = lu[:, None, None] * u[:, :, None] + lv[:, None, None] * v
    return per_rank.reshape(stop - start, -1)[:, : plan.gpus]


def _stage_times(model: PlanModel, shared: _Shared, multiplier: np.ndarray, sl):
    """Per-chunk forward/backward/weight durations from stage multipliers (..., pp)."""
    v = model.plan.virtual_stages if model.plan.schedule == "interleaved-1f1b" else 1
    ndim = multiplier.ndim
    fwd = model.fwd_us[sl].reshape((-1,) + (1,) * (ndim - 1))
    bwd = model.bwd_us[sl].reshape((-1,) + (1,) * (ndim - 1))
    comm_f = shared.stage_f_us[sl].reshape(shared.stage_f_us[sl].shape + (1,) * (ndim - 2))
    comm_b = shared.stage_b_us[sl].reshape(shared.stage_b_us[sl].shape + (1,) * (ndim - 2))
    f = (fwd * multiplier + comm_f) / v
    if model.plan.schedule == "zero-bubble":
        return f, (0.5 * bwd * multiplier + comm_b) / v, 0.5 * bwd * multiplier / v
    return f, (bwd * multiplier + comm_b) / v, None


def _exact(model, posterior, cluster, schedule, shared, replicates, rng):
    """Slowest finish (D, R), mean and max rank multiplier (D, R) by simulating every rank."""
    plan = model.plan
    d_total, gpus = model.draws, plan.gpus
    chunk = max(1, _CHUNK_ELEMENTS // max(1, replicates * gpus))
    finish = np.empty((d_total, replicates))
    mean_mult = np.empty_like(finish)
    max_mult = np.empty_like(finish)
    q = plan.tp * plan.cp
    for start in range(0, d_total, chunk):
        stop = min(d_total, start + chunk)
        sl = slice(start, stop)
        persistent = _persistent(model, posterior, cluster, rng, start, stop)
        t = _rank_log_multipliers(
            model, posterior, cluster, replicates, rng, start, stop, persistent
        )
        t += shared.step_log[sl][:, :, None]
        mult = np.exp(t)
        mean_mult[sl] = mult.mean(axis=-1)
        max_mult[sl] = mult.max(axis=-1)
        groups = mult.reshape(stop - start, replicates, plan.pp, plan.dp, q).max(axis=-1)
        if plan.ep > 1:  # expert all-to-all: ep replicas of a stage advance together
            shape = groups.shape
            coupled = groups.reshape(*shape[:-1], plan.dp // plan.ep, plan.ep).max(axis=-1)
            groups = np.repeat(coupled, plan.ep, axis=-1).reshape(shape)
        groups = np.swapaxes(groups, -1, -2)  # (n, R, dp, pp)
        f, b, w = _stage_times(model, shared, groups, sl)
        ends = pipeline_finish(schedule, f, b, w, shared.p2p_us[sl][..., None])
        finish[sl] = ends.max(axis=(-1, -2))
    return finish, mean_mult, max_mult


def _fast(model, posterior, cluster, schedule, shared, replicates, rng):
    """Slowest finish, mean and max rank multiplier (D, R) without simulating every rank.

    The ``TOP_REPLICAS`` slowest nodes (order statistics, new nodes by inverse CDF, measured
    nodes simulated) sit on random stages of random replicas (sharing a replica when they draw
    the same one), whose other stages are ordinary simulated stage groups; the step is the
    slowest of these ``TOP_REPLICAS`` replicas.
    """
    plan, gpn = model.plan, model.gpus_per_node
    d, r = model.draws, replicates
    n_nodes = math.ceil(plan.gpus / gpn)  # the cluster may override the plan's GPUs per node
    u_meas, v_meas = _measured_effects(posterior, cluster, n_nodes, gpn, d)
    n_meas = u_meas.shape[1]
    n_new = n_nodes - n_meas
    top = max(1, min(TOP_REPLICAS, n_nodes))  # slowest nodes placed explicitly
    sets = max(1, plan.dp // plan.ep)  # independent (groups of) replicas
    n_rep = min(top, sets)  # replicas simulated
    ln, lg, lgs = model.loading["node"], model.loading["gpu"], model.loading["gpustep"]

    def transient(shape):
        z = rng.standard_normal((d, r, *shape))
        rho = rng.standard_normal((d, r, *shape))
        ix = (slice(None), None) + (None,) * len(shape)
        return lgs[ix] * z + model.resid_mu[ix] + model.resid_sd[ix] * rho

    candidates = []
    if n_new > 0:
        # one cluster per posterior draw: the slowest nodes' order-statistic uniforms are
        # correlated over replicates by the persistent share of a rank's log-multiplier
        # variance (Gaussian copula), so the same nodes tend to be slowest in every step
        k = min(top, n_new)
        persistent_var = ln**2 + lg**2
        share = persistent_var / np.maximum(persistent_var + lgs**2 + model.resid_sd**2, 1e-300)
        share = np.sqrt(share)[:, None, None]
        z = share * rng.standard_normal((d, 1, k)) + np.sqrt(1.0 - share**2) * (
            rng.standard_normal((d, r, k)))
        candidates.append(top_node_log_multipliers(rank_law(model), posterior, n_new, r, k,
                                                   rng, uniforms=special.ndtr(z)))
    if n_meas:
        v_new = _new_effects(posterior, "gpu", n_meas * gpn, rng, lg).reshape(d, n_meas, gpn)
        v = np.where(np.isnan(v_meas), v_new, v_meas)
        persistent = ln[:, None, None] * u_meas[:, :, None] + lg[:, None, None] * v
        candidates.append((persistent[:, None] + transient((n_meas, gpn))).max(axis=-1))
    slowest = np.sort(np.concatenate(candidates, axis=-1), axis=-1)[..., ::-1][..., :top]

    # ordinary stage groups of q consecutive ranks (redrawn per replicate); with expert
    # parallelism a stage advances with its ep partner replicas, whose groups follow it in
    # rank order: the stage is the slowest of ep*q consecutive ranks, on their shared nodes
    q, ep = plan.tp * plan.cp, plan.ep
    members = ep * q
    nodes_per_stage = math.ceil(members / gpn)
    stages = r * n_rep * plan.pp
    groups = np.empty((d, r, n_rep, plan.pp))
    mean_mult = np.empty((d, r))
    chunk = max(1, _CHUNK_ELEMENTS // (stages * members))  # bounds memory
    for start in range(0, d, chunk):
        sl = slice(start, min(d, start + chunk))
        n = sl.stop - sl.start
        subset = posterior if n == d else _posterior_subset(posterior, sl.start, sl.stop)
        # persistent effects once per draw (the cluster), transients per replicate
        u = _new_effects(subset, "node", n_rep * plan.pp * nodes_per_stage, rng, ln[sl])
        u = u.reshape(n, 1, n_rep, plan.pp, nodes_per_stage)
        v = _new_effects(subset, "gpu", n_rep * plan.pp * members, rng, lg[sl])
        v = v.reshape(n, 1, n_rep, plan.pp, members)
        ix = (sl, None, None, None, None)
        t = np.broadcast_to(ln[ix] * u[..., np.arange(members) // gpn] + lg[ix] * v,
                            (n, r, n_rep, plan.pp, members))
        t = t + lgs[ix] * rng.standard_normal(t.shape) + model.resid_mu[ix]
        t += model.resid_sd[ix] * rng.standard_normal(t.shape)
        t += shared.step_log[sl][:, :, None, None, None]
        mult = np.exp(t)
        groups[sl] = mult.max(axis=-1)  # (n, R, n_rep, pp)
        mean_mult[sl] = mult.mean(axis=(-1, -2, -3))
    slow = np.exp(slowest + shared.step_log[..., None])  # (D, R, top)
    # ordinary stages hold none of the slowest nodes: cap them at the top-th slowest (their
    # conditional law given that, to first order in top/N per node)
    groups = np.minimum(groups, slow[..., -1:, None])
    # each slow node lands on a random stage of a random one of the dp/ep independent
    # (groups of) replicas; slow nodes that share a replica slow it together
    replica = np.broadcast_to(rng.integers(0, sets, size=(d, 1, top)), (d, r, top))
    position = np.broadcast_to(rng.integers(0, plan.pp, size=(d, 1, top)), (d, r, top))
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
    finish = ends.max(axis=(-1, -2))
    max_mult = np.maximum(slow.max(axis=-1), groups.max(axis=(-1, -2)))
    return finish, mean_mult, max_mult


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
    for term in model.comms:
        totals[term.where] += term.det_us[:, None]
    m = model.plan.microbatches
    return _Shared(
        np.zeros((model.draws, 1)),
        totals["stage"] / (2 * m),
        totals["stage"] / (2 * m),
        totals["p2p"],
        (1.0 - float(model.plan.overlap)) * totals["dp"],
        totals["fallback"],
    )


def _assemble(model, shared, schedule, finish, mean_mult, max_mult, ideal_s):
    m = model.plan.microbatches
    after = shared.dp_us + shared.fallback_us
    idle = np.broadcast_to(np.asarray(model.idle_us, dtype=float), model.fwd_us.shape)[:, None]
    step_us = finish + after + model.opt_us[:, None] * max_mult + idle
    compute_us = (m * (model.fwd_us + model.bwd_us)[:, None] + model.opt_us[:, None]) * mean_mult
    compute_us = compute_us + idle
    exposed_us = m * (shared.stage_f_us + shared.stage_b_us) + after
    uniform = np.broadcast_to(mean_mult[..., None], (*mean_mult.shape, model.plan.pp))
    f, b, w = _stage_times(model, shared, uniform, slice(None))
    makespan = pipeline_finish(schedule, f, b, w, shared.p2p_us).max(axis=-1)
    busy = m * (model.fwd_us + model.bwd_us)[:, None] * mean_mult + m * (
        shared.stage_f_us + shared.stage_b_us
    )
    bubble_us = np.maximum(makespan - busy, 0.0)
    wait_us = step_us - compute_us - exposed_us - bubble_us
    return StepDraws(
        step_us / 1e6, compute_us / 1e6, exposed_us / 1e6, bubble_us / 1e6, wait_us / 1e6, ideal_s
    )


def ideal_step_time(
    posterior: xr.DataTree, plan: ParallelPlan, cluster: Cluster | None = None
) -> float:
    """Variability-free step time (s) of ``plan``: every kernel at ``exp(kernel_log_median)``
    at the posterior median, collectives at the median cost model, no noise and no waiting
    (the schedule's structural bubble is included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        model = build_plan_model(posterior, plan, cluster, typical=True)
    return _ideal_from_model(model)


def _ideal_from_model(model: PlanModel) -> float:
    schedule = _schedule_for(model, model)
    shared = _typical_shared(model)
    ones = np.ones((1, 1))
    finish = pipeline_finish(
        schedule,
        *_stage_times(model, shared, np.ones((1, 1, model.plan.pp)), slice(None)),
        shared.p2p_us,
    ).max(axis=-1)
    step = finish + shared.dp_us + shared.fallback_us + model.opt_us[:, None] * ones
    step = step + np.asarray(model.idle_us, dtype=float).reshape(-1, 1)
    return float(step[0, 0]) / 1e6


def compose(
    posterior: xr.DataTree,
    plan: ParallelPlan,
    *,
    replicates: int = 4,
    rng: np.random.Generator,
    cluster: Cluster | None = None,
    exact: bool | None = None,
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
        Source of randomness (same generator state, same numbers).
    cluster
        GPUs per node, link-tier overrides and measured nodes to use.
    exact
        Simulate every rank (True), use the order-statistics fast path (False) or decide by
        scale (None: exact up to :data:`EXACT_MAX_GPUS` GPUs).
    """
    if posterior.attrs.get("model_kind") == "step":
        from bayesprism.stepscale import compose_steps

        return compose_steps(posterior, plan, replicates=replicates, rng=rng)
    if not (isinstance(replicates, int) and replicates >= 1):
        raise InputError(
            Problem("arguments", "replicates", "must be a positive integer", example=replicates)
        )
    model = build_plan_model(posterior, plan, cluster)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        typical_model = build_plan_model(posterior, plan, cluster, typical=True)
    ideal_s = _ideal_from_model(typical_model)
    schedule = _schedule_for(model, typical_model)
    shared = _draw_shared(model, replicates, rng)
    use_exact = plan.gpus <= EXACT_MAX_GPUS if exact is None else bool(exact)
    path = _exact if use_exact else _fast
    finish, mean_mult, max_mult = path(model, posterior, cluster, schedule, shared, replicates, rng)
    return _assemble(model, shared, schedule, finish, mean_mult, max_mult, ideal_s)
