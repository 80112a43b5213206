"""Composition: posterior draws of a kernel-level model -> step-time draws of a target plan.

NumPy only (never PyMC), vectorised over posterior draws. :func:`compose` reads the posterior
and ``inventory`` groups of ``docs/artifacts.md`` and returns a
:class:`~bayesprism.draws.StepDraws` of shape (draw, replicate): every posterior draw gets its
own cluster (new nodes and GPUs drawn from its population; measured nodes listed by the
:class:`~bayesprism.plan.Cluster` keep their own effects) and ``replicates`` simulated steps.

Scaling from the traced run to the target plan
----------------------------------------------
Notation: the traced plan (``inventory.attrs["traced_plan"]``) is ``dp0, tp0, pp0, cp0, m0``
(missing entries are 1); the target is ``dp, tp, pp, cp, m``. Work per kernel is
``launches_per_step * exp(kernel_log_median)``.

* The micro-batch size is the traced one; the target's global batch is ``dp * m`` of them.
* The traced rank's per-step compute is ``m0`` micro-batches of one pipeline stage of a
  ``tp0 * cp0``-sharded model. Compute kernels (``gemm``, ``attention``, ``elementwise``,
  ``norm``, ``memcpy``, ``other``) therefore cost, per micro-batch on one target GPU,
  ``work * tp0*cp0*pp0 / (m0 * tp*cp*pp)``: GEMM/attention work divides by ``tp`` and ``cp``;
  element-wise and norm kernels too (sequence parallelism alongside TP, sequence split by CP);
  a stage holds ``1/pp`` of the layers. With a plain-DP traced run this is the per-GPU compute
  of one model replica divided across ``tp * cp * pp``.
* Forward : backward compute = 1 : 2 (the backward computes input and weight gradients); the
  zero-bubble schedule splits the backward into equal input-gradient and weight-gradient halves.
* ``optimizer`` kernels run once per step on the rank's parameter shard:
  ``work * tp0*pp0 / (tp*pp)``, divided further by ``dp*cp`` under zero1/zero2/fsdp sharding
  (and multiplied by the traced ``dp0*cp0`` if the traced run was sharded).
* Collectives with the cost model (``posterior.attrs["collective_model"]``), by ``role``:
  ``tp`` (group ``tp``), ``cp`` (group ``cp``) and ``ep`` (all-to-all, group ``ep``) keep their
  launches per layer: ``launches_per_step * pp0 / (m0 * pp)`` per micro-batch, half in the
  forward, half in the backward, message bytes ``* cp0/cp`` (tokens per rank); they block the
  stage's compute. ``pp`` send/recv: one per micro-batch per stage boundary and direction,
  bytes ``* cp0/cp``. ``dp``: the traced gradient bytes per rank (AllReduce + ReduceScatter
  launches) are the parameters of a ``tp0*pp0`` shard, so the target sends
  ``bytes * tp0*pp0 / (tp*pp)`` in as many buckets as traced, over a group of ``dp*cp``:
  ``none`` AllReduce; ``zero1``/``zero2`` ReduceScatter + AllGather of the updated parameters;
  ``fsdp`` ReduceScatter + two parameter AllGathers (forward and backward, parameters kept
  across micro-batches). ``overlap`` hides that fraction of the data-parallel time.
  Roles the traced run lacks are synthesised only from the plan's ``activation_bytes``
  (TP: 4 AllReduces per layer, needs ``layers``; PP: one send/recv) or ``gradient_bytes``
  (DP, 25 MB buckets); otherwise they are left out with a ``PlanWarning``.
  ReduceScatter/AllGather without fitted cost parameters use the AllReduce parameters.
* A group spans nodes (inter tier) when its rank span exceeds ``gpus_per_node``; ranks are
  ordered tp fastest, then cp, dp, pp (Megatron), node = rank // gpus_per_node.
* Collective kernels without a cost model keep their kernel-model duration
  (``exp(kernel_log_median)``, group size as traced) and are counted as exposed communication.

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
The exact path simulates every rank (used up to :data:`EXACT_MAX_GPUS` GPUs by default). The
fast path never draws all ranks: the slowest node's log-multiplier is sampled by inverse CDF of
``F^N`` (N new nodes), with ``F`` computed on a fine grid per posterior draw from the
populations (node effect by quadrature in probability space, max over the node's GPUs in closed
form); measured nodes are simulated. The replica holding that node runs it on a random stage
and ``pp - 1`` ordinary, simulated stages; the step is that replica's pipeline. This neglects
(i) other replicas that are slow without holding the slowest node and (ii) the persistence of
the slowest node across the replicates of one draw (the fast path redraws it per replicate, so
the marginal step distribution is the same but the spread of row means is smaller).

Breakdown (sums to the step time exactly)
-----------------------------------------
``compute_s``: the mean rank's compute in the step (all micro-batches plus optimizer).
``exposed_comm_s``: stage collectives (TP/CP/EP) of all micro-batches plus the exposed
data-parallel collectives. ``bubble_s``: pipeline makespan with every stage at the mean rank's
pace minus that stage's busy time (fill/drain and point-to-point latency).
``wait_s``: the rest, i.e. waiting for stragglers (negative when the critical ranks happen to
run faster than the mean rank).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import xarray as xr
from scipy import special

from bayesprism import collectives
from bayesprism.draws import StepDraws
from bayesprism.errors import InputError, Problem
from bayesprism.plan import Cluster, ParallelPlan, PlanWarning
from bayesprism.schedules import Schedule, build_schedule, pipeline_finish

#: Plans up to this many GPUs use the exact path when ``exact=None``.
EXACT_MAX_GPUS = 2048
#: Replicas holding the slowest nodes that the fast path simulates.
TOP_REPLICAS = 3
#: Random numbers per chunk of the exact path (bounds memory).
_CHUNK_ELEMENTS = 1 << 22
MICROBATCH_CLASSES = ("gemm", "attention", "elementwise", "norm", "memcpy", "other")
COMM_ROLES = ("tp", "cp", "ep", "pp", "dp")
DDP_BUCKET_BYTES = 25 * 2**20
LEVELS = ("node", "gpu", "step", "gpustep")


# ---------------------------------------------------------------------------- reading
def _flat(da: xr.DataArray) -> np.ndarray:
    """(chain, draw, ...) -> (chain*draw, ...) in chain-major order."""
    rest = [d for d in da.dims if d not in ("chain", "draw")]
    return da.transpose("chain", "draw", *rest).to_numpy().reshape(-1, *da.shape[2:])


def _traced_plan(inventory: xr.Dataset) -> dict:
    raw = inventory.attrs.get("traced_plan", "{}")
    plan = json.loads(raw) if isinstance(raw, str) else dict(raw)
    out = {k: int(plan.get(k) or 1) for k in ("dp", "tp", "pp", "cp", "ep", "microbatches")}
    out["sharding"] = plan.get("sharding") or "none"
    return out


def _collective_model(posterior: xr.DataTree, group: xr.Dataset) -> set[str]:
    raw = posterior.attrs.get("collective_model", group.attrs.get("collective_model"))
    if raw is None:
        return (
            set(group["coll_latency_us"]["collective"].to_numpy().astype(str))
            if ("coll_latency_us" in group)
            else set()
        )
    if isinstance(raw, str):
        raw = json.loads(raw) if raw.strip().startswith("[") else raw.split(",")
    return {str(c).strip() for c in np.atleast_1d(raw) if str(c).strip()}


@dataclass
class CommTerm:
    """One kind of collective traffic of the target plan, deterministic per draw."""

    kind: str  # collective class, for congestion
    where: str  # "stage" (per micro-batch, blocks compute), "p2p", "dp", "fallback"
    det_us: np.ndarray  # (D,) total per step for the rank (per micro-batch & direction for p2p)
    noise_mean_log: np.ndarray  # (D,)
    noise_sd_log: np.ndarray  # (D,)
    congestion_sd: np.ndarray  # (D,)


@dataclass
class PlanModel:
    """Per-draw deterministic quantities of one plan (arrays of length D = chain*draw)."""

    plan: ParallelPlan
    gpus_per_node: int
    fwd_us: np.ndarray  # typical compute of one micro-batch forward on one GPU
    bwd_us: np.ndarray
    opt_us: np.ndarray  # optimizer per step per GPU
    loading: dict[str, np.ndarray]  # level -> effective loading
    resid_mu: np.ndarray  # mean of the per-rank-step residual log factor
    resid_sd: np.ndarray
    comms: list[CommTerm] = field(default_factory=list)

    @property
    def draws(self) -> int:
        return int(self.fwd_us.shape[0])


def build_plan_model(
    posterior: xr.DataTree,
    plan: ParallelPlan,
    cluster: Cluster | None = None,
    *,
    typical: bool = False,
) -> PlanModel:
    """Deterministic per-draw quantities of ``plan`` from a kernel-level posterior.

    With ``typical=True`` a single "draw" is built from the posterior medians with every
    variability scale set to zero: the plan's variability-free step.
    """
    if "posterior" not in posterior.children or "inventory" not in posterior.children:
        raise InputError(
            Problem(
                "posterior",
                "groups",
                "needs the 'posterior' and 'inventory' "
                "groups of a kernel-level fit (docs/artifacts.md)",
            )
        )
    group = posterior["posterior"].to_dataset()
    inventory = posterior["inventory"].to_dataset()
    traced = _traced_plan(inventory)
    gpn = cluster.gpus_per_node if cluster is not None else plan.gpus_per_node
    if cluster is not None and cluster.gpus_per_node != plan.gpus_per_node:
        warnings.warn(
            f"{plan.name}: cluster gpus_per_node = {cluster.gpus_per_node} overrides "
            f"the plan's {plan.gpus_per_node}",
            PlanWarning,
            stacklevel=3,
        )

    def per_draw(da: xr.DataArray) -> np.ndarray:
        values = _flat(da)
        return np.median(values, axis=0, keepdims=True) if typical else values

    kernels = inventory["kernel_class"]["kernel"].to_numpy().astype(str)
    classes = inventory["kernel_class"].to_numpy().astype(str)
    roles = (
        inventory["role"].to_numpy().astype(str)
        if "role" in inventory
        else np.full(kernels.shape, "unknown")
    )
    launches = inventory["launches_per_step"].to_numpy().astype(float)
    nbytes = (
        inventory["bytes_per_launch"].to_numpy().astype(float)
        if "bytes_per_launch" in inventory
        else np.full(kernels.shape, np.nan)
    )
    modelled = _collective_model(posterior, group)
    median_kernels = set(group["kernel_log_median"]["kernel"].to_numpy().astype(str))

    draws = 1 if typical else int(group.sizes["chain"] * group.sizes["draw"])
    class_names = (
        group["kernel_class"].to_numpy().astype(str)
        if "kernel_class" in group.coords
        else np.array([], dtype=str)
    )

    def class_scale(level: str, cls: str) -> np.ndarray:
        name = f"{level}_scale"
        if typical or name not in group or cls not in class_names:
            return np.zeros(draws)
        return _flat(group[name].sel(kernel_class=cls))

    tp0, pp0, cp0, m0 = traced["tp"], traced["pp"], traced["cp"], traced["microbatches"]
    tp, pp, cp, m = plan.tp, plan.pp, plan.cp, plan.microbatches
    shard = plan.dp * plan.cp if plan.sharding != "none" else 1
    shard0 = traced["dp"] * traced["cp"] if traced["sharding"] != "none" else 1
    microbatch_factor = tp0 * cp0 * pp0 / (m0 * tp * cp * pp)
    per_mb_launch_factor = pp0 / (m0 * pp)
    duration_factor = tp0 * cp0 / (tp * cp)

    fwd_bwd = np.zeros(draws)
    opt = np.zeros(draws)
    # work-weighted sums for the effective loadings and the residual moments
    weight_sum = np.zeros(draws)
    loading_sums = {level: np.zeros(draws) for level in LEVELS}
    mean_inflation = np.zeros(draws)
    var_sum = np.zeros(draws)
    fallback: list[tuple[str, np.ndarray]] = []
    skipped: list[str] = []
    # (collective kind, where, group size, bytes per launch, launches per step, tier)
    comm_specs: list[tuple[str, str, int, float, float, str]] = []

    for k, (name, cls, role) in enumerate(zip(kernels, classes, roles, strict=True)):
        is_coll = cls in collectives.COLLECTIVE_CLASSES
        if is_coll and cls in modelled and role in COMM_ROLES:
            continue  # handled with the cost model below
        if name not in median_kernels:
            skipped.append(name)
            continue
        typical_us = np.exp(per_draw(group["kernel_log_median"].sel(kernel=name)))
        if is_coll:
            count = launches[k] * (1.0 if role == "dp" else m * per_mb_launch_factor)
            if role in ("tp", "cp", "ep") and getattr(plan, role) == 1:
                continue
            if role == "pp" and pp == 1:
                continue
            inflation = np.exp(0.5 * class_scale("resid", cls) ** 2)
            fallback.append((cls, count * typical_us * inflation))
            continue
        if cls == "optimizer":
            n_step = launches[k]
            dur = typical_us * tp0 * pp0 / (tp * pp) * shard0 / shard
            opt = opt + n_step * dur
        else:
            n_step = launches[k] * m * per_mb_launch_factor
            dur = typical_us * duration_factor
            fwd_bwd = fwd_bwd + launches[k] * typical_us * microbatch_factor
        work = n_step * dur
        sd = class_scale("resid", cls)
        weight_sum += work
        for level in LEVELS:
            loading_sums[level] += work * class_scale(level, cls)
        mean_inflation += work * np.exp(0.5 * sd**2)
        if n_step > 0:
            var_sum += work**2 / n_step * np.expm1(sd**2) * np.exp(sd**2)
    if skipped:
        warnings.warn(
            f"{len(skipped)} inventory kernels have no kernel_log_median in the "
            f"posterior and were left out, e.g. {skipped[0]!r}",
            PlanWarning,
            stacklevel=3,
        )
    safe = np.where(weight_sum > 0, weight_sum, 1.0)
    loading = {level: loading_sums[level] / safe for level in LEVELS}
    inflation = np.where(weight_sum > 0, mean_inflation / safe, 1.0)
    rel_var = np.where(weight_sum > 0, var_sum / np.maximum(mean_inflation, 1e-300) ** 2, 0.0)
    s2 = np.log1p(rel_var)
    resid_mu = np.log(inflation) - 0.5 * s2
    resid_sd = np.sqrt(s2)

    # ---- collectives with the cost model
    def span_tier(span: int) -> str:
        return "inter" if span > gpn else "intra"

    role_rows = {
        r: [
            k
            for k in range(len(kernels))
            if roles[k] == r
            and classes[k] in modelled
            and classes[k] in collectives.COLLECTIVE_CLASSES
        ]
        for r in COMM_ROLES
    }
    stage_roles = (("tp", tp, tp), ("cp", cp, tp * cp), ("ep", plan.ep, tp * cp * plan.ep))
    for role, degree, span in stage_roles:
        if degree == 1:
            continue
        rows = role_rows[role]
        if rows:
            for k in rows:
                count = launches[k] * per_mb_launch_factor * m
                size = nbytes[k] * traced["cp"] / cp if np.isfinite(nbytes[k]) else 0.0
                comm_specs.append((classes[k], "stage", degree, size, count, span_tier(span)))
        elif role == "tp" and plan.activation_bytes and plan.layers:
            count = 4.0 * plan.layers / pp * m
            comm_specs.append(
                ("allreduce", "stage", tp, plan.activation_bytes / cp, count, span_tier(span))
            )
        else:
            warnings.warn(
                f"{plan.name}: the traced run has no {role.upper()} collectives and the "
                f"plan gives no activation_bytes/layers to synthesise them: "
                f"{role.upper()} communication is left out",
                PlanWarning,
                stacklevel=3,
            )
    if pp > 1:
        rows = role_rows["pp"]
        tier = "inter" if tp * cp * plan.dp >= gpn else "intra"
        if rows:
            size = float(np.nanmean([nbytes[k] for k in rows])) * traced["cp"] / cp
            comm_specs.append(("sendrecv", "p2p", 2, size, 1.0, tier))
        elif plan.activation_bytes:
            comm_specs.append(("sendrecv", "p2p", 2, plan.activation_bytes / cp, 1.0, tier))
        else:
            warnings.warn(
                f"{plan.name}: the traced run has no pipeline send/recv and the plan "
                "gives no activation_bytes: pipeline transfers are left out",
                PlanWarning,
                stacklevel=3,
            )
    dp_group = plan.dp * cp
    if dp_group > 1:
        rows = [k for k in role_rows["dp"] if classes[k] in ("allreduce", "reducescatter")]
        if rows:
            grad_bytes = sum(launches[k] * nbytes[k] for k in rows if np.isfinite(nbytes[k]))
            grad_bytes *= tp0 * pp0 / (tp * pp)
            buckets = max(1.0, float(sum(launches[k] for k in rows)))
        elif plan.gradient_bytes:
            grad_bytes = plan.gradient_bytes / (tp * pp)
            buckets = max(1.0, math.ceil(grad_bytes / DDP_BUCKET_BYTES))
        else:
            grad_bytes = 0.0
            warnings.warn(
                f"{plan.name}: the traced run has no data-parallel gradient "
                "collectives and the plan gives no gradient_bytes: data-parallel "
                "communication is left out",
                PlanWarning,
                stacklevel=3,
            )
        if grad_bytes > 0:
            tier = span_tier(tp * cp * plan.dp)
            per_bucket = grad_bytes / buckets
            kinds = {
                "none": ["allreduce"],
                "zero1": ["reducescatter", "allgather"],
                "zero2": ["reducescatter", "allgather"],
                "fsdp": ["reducescatter", "allgather", "allgather"],
            }[plan.sharding]
            for kind in kinds:
                comm_specs.append((kind, "dp", dp_group, per_bucket, buckets, tier))

    comms = [_comm_term(group, spec, per_draw, typical, cluster) for spec in comm_specs]
    for cls, det in fallback:
        zeros = np.zeros(draws)
        comms.append(CommTerm(cls, "fallback", det, zeros, zeros, zeros))
    return PlanModel(
        plan=plan,
        gpus_per_node=gpn,
        fwd_us=fwd_bwd / 3.0,
        bwd_us=2.0 * fwd_bwd / 3.0,
        opt_us=opt,
        loading=loading,
        resid_mu=resid_mu,
        resid_sd=resid_sd,
        comms=comms,
    )


def _comm_term(group: xr.Dataset, spec, per_draw, typical: bool, cluster: Cluster | None):
    kind, where, size, nbytes, count, tier = spec
    if "coll_latency_us" not in group:
        raise InputError(
            Problem(
                "posterior",
                "coll_latency_us",
                "the plan needs the collective cost model, absent from the fit",
            )
        )
    available = set(group["coll_latency_us"]["collective"].to_numpy().astype(str))
    source = kind if kind in available else "allreduce"
    if source not in available:
        raise InputError(
            Problem(
                "posterior",
                "coll_latency_us",
                f"no cost parameters for {kind!r} (nor 'allreduce')",
                example=sorted(available),
            )
        )
    latency = per_draw(group["coll_latency_us"].sel(collective=source, tier=tier))
    bandwidth = per_draw(group["coll_bandwidth_gbps"].sel(collective=source, tier=tier))
    if cluster is not None and cluster.tiers and tier in cluster.tiers:
        override = cluster.tiers[tier]
        if "latency_us" in override:
            latency = np.full_like(latency, float(override["latency_us"]))
        if "bandwidth_gbps" in override:
            bandwidth = np.full_like(bandwidth, float(override["bandwidth_gbps"]))
    one = collectives.transfer_time_us(kind, size, nbytes, latency, bandwidth)
    draws = one.shape[0]

    def scalar(name: str) -> np.ndarray:
        if typical or name not in group:
            return np.zeros(draws)
        return _flat(group[name].sel(collective=source))

    noise = scalar("coll_noise")
    launches = max(count, 1.0)
    rel_var = np.expm1(noise**2) / launches
    s2 = np.log1p(rel_var)
    return CommTerm(
        kind, where, count * one, 0.5 * noise**2 - 0.5 * s2, np.sqrt(s2), scalar("coll_congestion")
    )


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
    u = _flat(group["node_effect"].sel(node=names))
    v = np.full((draws, len(names), gpn), np.nan)
    if "gpu_effect" in group:
        labels = {str(x): i for i, x in enumerate(group["gpu_unit"].to_numpy())}
        gpu = _flat(group["gpu_effect"])
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
        groups = np.swapaxes(groups, -1, -2)  # (n, R, dp, pp)
        f, b, w = _stage_times(model, shared, groups, sl)
        ends = pipeline_finish(schedule, f, b, w, shared.p2p_us[sl][..., None])
        finish[sl] = ends.max(axis=(-1, -2))
    return finish, mean_mult, max_mult


# ---------------------------------------------------------------------------- fast path
_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(24)
_GH_W = _GH_W / _GH_W.sum()


def _unit_sf(params: dict, z: np.ndarray) -> np.ndarray:
    """Population survival function with per-draw arguments z of shape (D, ...)."""
    family = params["family"]
    if family == "normal":
        return special.ndtr(-z)
    shape = (-1,) + (1,) * (z.ndim - 1)
    if family == "student_t":
        return special.stdtr(params["nu"].reshape(shape), -z)
    w = params["weight"].reshape(shape)
    shift = params["shift"].reshape(shape)
    return (1.0 - w) * special.ndtr(-z) + w * special.ndtr(shift - z)


def _population(posterior, level: str, loading: np.ndarray):
    from bayesprism.population import population_parameters

    if not np.any(loading):
        return {"family": "normal"}
    try:
        return population_parameters(posterior, level)
    except KeyError as exc:
        raise InputError(Problem("posterior", f"{level}_population", str(exc))) from None


def _gpu_term_sf(y, lg, transient_sd, mu, gpu_params):
    """P(e > y) for e = lg*v + N(mu, transient_sd^2), per draw; y has shape (D, ...)."""
    shape = (-1,) + (1,) * (y.ndim - 1)
    lg, sd, mu = (a.reshape(shape) for a in (lg, transient_sd, mu))
    if gpu_params["family"] == "normal":
        scale = np.sqrt(lg**2 + sd**2)
        return special.ndtr(-(y - mu) / np.where(scale > 0, scale, 1e-300))
    out = np.zeros(y.shape)
    safe_lg = np.where(lg > 0, lg, 1e-300)
    for x, w in zip(_GH_X, _GH_W, strict=True):
        out += w * _unit_sf(gpu_params, (y - mu - sd * x) / safe_lg)
    return out


def _node_quadrature(posterior, ln: np.ndarray, n_new: int):
    """Probability-space nodes (D, n_u) and weights (n_u,) of the node effect, dense in the tail."""
    from bayesprism.population import population_quantile

    params = _population(posterior, "node", ln)
    n_low, n_high = 8, 56
    upper = np.geomspace(1e-4 / n_new, 0.5, n_high)
    edges = np.concatenate([[0.0], np.sqrt(upper[:-1] * upper[1:]), [0.5]])
    q = np.concatenate([0.5 - (np.arange(n_low) + 0.5) / (2 * n_low), 1.0 - upper])
    weights = np.concatenate([np.full(n_low, 0.5 / n_low), np.diff(edges)])
    if params["family"] == "normal":
        nodes = np.broadcast_to(special.ndtri(q), (ln.shape[0], q.size))
    else:
        nodes = population_quantile(posterior, "node", q)
    return np.where(np.isfinite(nodes), nodes, 0.0), weights


def _log_sf_node_max(x, ln, u_nodes, weights, y_lo, y_hi, log_sf_max):
    """log P(Y > x) for Y = ln*u + (max over a node's GPUs), x of shape (D, n_x)."""
    n_y = log_sf_max.shape[1]
    arg = x[:, :, None] - ln[:, None, None] * u_nodes[:, None, :]
    pos = (arg - y_lo[:, None, None]) / (y_hi - y_lo)[:, None, None] * (n_y - 1)
    np.clip(pos, 0.0, n_y - 1.000001, out=pos)
    idx = pos.astype(np.int64)
    pos -= idx
    rows = np.arange(x.shape[0])[:, None, None]
    below = log_sf_max[rows, idx]
    log_sf = below + (log_sf_max[rows, idx + 1] - below) * pos
    sf = (np.exp(log_sf) * weights).sum(axis=-1)
    sf = np.minimum.accumulate(np.maximum(sf, 1e-300), axis=1)  # monotone despite rounding
    return np.log(sf)


def _top_node_log_multipliers(model, posterior, n_new, size, top, rng):
    """Inverse-CDF draws (D, size, top) of the ``top`` largest of ``n_new`` new nodes' Y.

    Y = ln*u + (max over the node's GPUs of lg*v + transient). P(max <= x) = F(x)^N, so the
    largest is the x with F(x) = U1^(1/N); the next ones follow the order statistics of
    uniforms, F(x_i) = F(x_(i-1)) * U_i^(1/(N-i+1)). F is computed per posterior draw on a grid
    (coarse, then refined around the range of the maxima), never by drawing N values.
    """
    d, gpn = model.draws, model.gpus_per_node
    ln, lg, lgs = model.loading["node"], model.loading["gpu"], model.loading["gpustep"]
    sd = np.sqrt(lgs**2 + model.resid_sd**2)
    mu = model.resid_mu
    gpu_params = _population(posterior, "gpu", lg)
    u_nodes, weights = _node_quadrature(posterior, ln, n_new)
    spread = np.maximum(np.sqrt(lg**2 + sd**2), 1e-9)
    y_lo, y_hi = mu - 9.0 * spread, mu + 12.0 * spread
    if gpu_params["family"] != "normal":
        from bayesprism.population import population_quantile

        v = population_quantile(posterior, "gpu", np.array([1e-9, 1.0 - 1e-6 / (n_new * gpn)]))
        y_lo = np.minimum(y_lo, mu + lg * v[:, 0] - 9.0 * sd)
        y_hi = np.maximum(y_hi, mu + lg * v[:, 1] + 9.0 * sd)
    n_y = 2048
    y = y_lo[:, None] + (y_hi - y_lo)[:, None] * np.linspace(0.0, 1.0, n_y)
    sf_e = np.clip(_gpu_term_sf(y, lg, sd, mu, gpu_params), 0.0, 1.0 - 1e-16)
    log_sf_max = np.log(np.maximum(-np.expm1(gpn * np.log1p(-sf_e)), 1e-300))

    log_cdf = np.cumsum(np.log(rng.random((d, size, top))) / (n_new - np.arange(top)), axis=-1)
    target = np.log(np.maximum(-np.expm1(log_cdf), 1e-300)).reshape(d, size * top)
    out = np.empty((d, size * top))
    median_u = u_nodes[:, -1]
    chunk = max(1, (1 << 21) // (160 * u_nodes.shape[1]))
    for start in range(0, d, chunk):
        sl = slice(start, min(d, start + chunk))
        args = (ln[sl], u_nodes[sl], weights, y_lo[sl], y_hi[sl], log_sf_max[sl])
        lo = ln[sl] * median_u[sl] + y_lo[sl]
        hi = ln[sl] * u_nodes[sl].max(axis=1) + y_hi[sl]
        x = lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, 48)
        log_sf = _log_sf_node_max(x, *args)
        # refine between the levels 60/N and 1e-4/N of the survival function
        bounds = np.log([min(0.5, (60.0 + 10 * top) / n_new), 1e-4 / n_new])
        ref = np.array(
            [np.interp(bounds, ls[::-1], xi[::-1]) for ls, xi in zip(log_sf, x, strict=True)]
        )
        x_fine = ref[:, :1] + (ref[:, 1:] - ref[:, :1]) * np.linspace(0.0, 1.0, 96)
        log_sf_fine = _log_sf_node_max(x_fine, *args)
        for i, row in enumerate(range(sl.start, sl.stop)):
            inside = (target[row] <= bounds[0]) & (target[row] >= bounds[1])
            coarse = np.interp(target[row], log_sf[i, ::-1], x[i, ::-1])
            fine = np.interp(target[row], log_sf_fine[i, ::-1], x_fine[i, ::-1])
            out[row] = np.where(inside, fine, coarse)
    return out.reshape(d, size, top)


def _fast(model, posterior, cluster, schedule, shared, replicates, rng):
    """Slowest finish, mean and max rank multiplier (D, R) without simulating every rank.

    The ``TOP_REPLICAS`` slowest nodes (order statistics, new nodes by inverse CDF, measured
    nodes simulated) each sit on a random stage of their own replica, whose other stages are
    ordinary simulated stage groups; the step is the slowest of these replicas.
    """
    plan, gpn = model.plan, model.gpus_per_node
    d, r = model.draws, replicates
    n_nodes = plan.nodes
    u_meas, v_meas = _measured_effects(posterior, cluster, n_nodes, gpn, d)
    n_meas = u_meas.shape[1]
    n_new = n_nodes - n_meas
    top = max(1, min(TOP_REPLICAS, plan.dp, n_nodes))
    ln, lg, lgs = model.loading["node"], model.loading["gpu"], model.loading["gpustep"]

    def transient(shape):
        z = rng.standard_normal((d, r, *shape))
        rho = rng.standard_normal((d, r, *shape))
        ix = (slice(None), None) + (None,) * len(shape)
        return lgs[ix] * z + model.resid_mu[ix] + model.resid_sd[ix] * rho

    candidates = []
    if n_new > 0:
        candidates.append(_top_node_log_multipliers(model, posterior, n_new, r,
                                                    min(top, n_new), rng))
    if n_meas:
        v_new = _new_effects(posterior, "gpu", n_meas * gpn, rng, lg).reshape(d, n_meas, gpn)
        v = np.where(np.isnan(v_meas), v_new, v_meas)
        persistent = ln[:, None, None] * u_meas[:, :, None] + lg[:, None, None] * v
        candidates.append((persistent[:, None] + transient((n_meas, gpn))).max(axis=-1))
    slowest = np.sort(np.concatenate(candidates, axis=-1), axis=-1)[..., ::-1][..., :top]

    # ordinary stage groups of q ranks on their own nodes (redrawn per replicate)
    q = plan.tp * plan.cp
    nodes_per_group = math.ceil(q / gpn)
    shape = (top, plan.pp)
    u = _new_effects(posterior, "node", r * top * plan.pp * nodes_per_group, rng, ln)
    u = u.reshape(d, r, *shape, nodes_per_group)
    v = _new_effects(posterior, "gpu", r * top * plan.pp * q, rng, lg).reshape(d, r, *shape, q)
    ix = (slice(None), None, None, None, None)
    t = ln[ix] * u[..., np.arange(q) // gpn] + lg[ix] * v + transient((*shape, q))
    t += shared.step_log[:, :, None, None, None]
    mult = np.exp(t)
    groups = mult.max(axis=-1)  # (D, R, top, pp)
    mean_mult = mult.mean(axis=(-1, -2, -3))
    slow = np.exp(slowest + shared.step_log[..., None])  # (D, R, top)
    position = rng.integers(0, plan.pp, size=(d, r, top))
    stage_mult = groups.copy()
    np.put_along_axis(stage_mult, position[..., None], slow[..., None], axis=-1)
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
    step_us = finish + after + model.opt_us[:, None] * max_mult
    compute_us = (m * (model.fwd_us + model.bwd_us)[:, None] + model.opt_us[:, None]) * mean_mult
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
