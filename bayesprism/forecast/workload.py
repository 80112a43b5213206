"""Workload of a target plan: what one rank computes and communicates, per posterior draw.

:func:`build_plan_model` turns a kernel-level posterior (``docs/artifacts.md``: ``posterior`` and
``inventory`` groups) and a :class:`~bayesprism.plan.ParallelPlan` into per-draw typical times:
forward/backward compute per micro-batch, optimizer time, every collective's transfer time by
the ring cost model of ``bayesprism.costs.collectives``, and the effective variability loadings that
``bayesprism.forecast.composition`` samples from. NumPy only. What it reads from the fit is
extracted into a :class:`PosteriorArrays` (:func:`posterior_arrays`), which callers that
recompose one posterior (several plans, placement search, sensitivity, what-if) extract once
and pass on (``arrays=``), so that recomposing costs no xarray selections.

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
* Collectives with the cost model (``posterior.attrs["collective_model"]``), by ``role``: ``tp``
  (group ``tp``), ``cp`` (group ``cp``) and ``ep`` (all-to-all, group ``ep``) keep their launches
  per layer: ``launches_per_step * pp0 / (m0 * pp)`` per micro-batch, half in the forward, half in
  the backward, message bytes ``* cp0/cp`` (tokens per rank); they block the stage's compute. ``pp``
  send/recv: one per micro-batch per stage boundary and direction, bytes ``* cp0/cp``, a delay on
  every edge between stages. When the inventory says which stage each rank ran, every stage
  instead keeps its own traced launches of its compute, these collectives (the last stage runs
  more TP collectives) and its data-parallel gradients, and its pipeline transfers occupy its
  own stream (part of its forward and backward, no edge delay): in the 1F1B steady state the
  bottleneck stage pays its transfers once per micro-batch, which an edge delay hides (another
  ``tp`` or ``cp`` scales each stage's work, message bytes and gradients as above). Another
  ``pp`` (from at least three traced stages) gives each stage ``1/pp`` of the layers' work (the
  middle traced stages' mean) and keeps the first and last stages' own extra work (embedding;
  output layer and loss) on them (:func:`retarget_stages`). ``dp``: the traced gradient bytes
  per rank (AllReduce + ReduceScatter launches) are the parameters of a ``tp0*pp0`` shard, so the
  target sends ``bytes * tp0*pp0 / (tp*pp)`` in as many buckets as traced, over a group of
  ``dp*cp``: ``none`` AllReduce; ``zero1``/``zero2`` ReduceScatter + AllGather of the updated
  parameters; ``fsdp`` ReduceScatter + two parameter AllGathers (forward and backward, parameters
  kept across micro-batches). ``overlap`` hides that fraction of the data-parallel time. Roles the
  traced run lacks are synthesised only from the plan's ``activation_bytes`` (TP: 4 AllReduces per
  layer, needs ``layers``; PP: one send/recv) or ``gradient_bytes`` (DP, 25 MB buckets); otherwise
  they are left out with a ``PlanWarning``. ReduceScatter/AllGather without fitted cost parameters
  use the AllReduce parameters.
* A group spans nodes (inter tier) when some group of its kind covers two or more nodes: its
  rank span exceeds ``gpus_per_node`` or does not divide it (``plan.nodes_spanned``); ranks
  are ordered tp fastest, then cp, dp, pp (Megatron), node = rank // gpus_per_node.
* GPU idle time inside a traced step (host work, launch gaps): a random quantity per rank,
  step and synchronisation, gamma per segment of the traced step between collectives
  (:class:`IdleLaw`, :func:`fit_idle_law` on the inventory's ``traced_idle_us``), carried over
  per step unchanged (not scaled with the plan's work); each synchronisation waits for the
  slowest of the ranks of its group in the target plan (:func:`sync_group`). Older inventories
  without ``traced_idle_us``: one segment, each traced rank-step's span minus its expected
  kernel time (which also holds the waiting inside cost-modelled collectives).
* Collective kernels without a cost model keep their kernel-model duration
  (``exp(kernel_log_median)``, group size as traced) and are counted as exposed communication.
* Compute segments between a stage group's collectives (the inventory's ``sync_segment_us``
  and ``sync_segment_share``) keep their traced length, scaled as a launch's duration (by
  ``tp0*cp0 / (tp*cp)``); their relative noise ``kappa`` follows from the launches' residual
  variance per µs of work (:func:`_segment_noise`), and the composition makes the group wait at
  each segment for its slowest member (``bayesprism.forecast.groupwait``).

Effective loadings
------------------
A rank's compute mixes kernel classes with different loadings; per draw, each level's loading
(node, GPU, step, GPU x step) is the work-weighted average of the class loadings (first order in
their differences). The residuals of the rank's launches in one step are moment-matched by one
lognormal factor: mean ``sum_k w_k m_k / sum_k w_k`` and relative variance
``sum_k (w_k^2 / n_k) v_k / (sum_k w_k m_k)^2`` (``w_k`` work and ``n_k`` launches of kernel k
per step; ``m_k``, ``v_k`` mean and variance of one launch's residual factor ``exp(eps)`` of
its class, :func:`residual_moments`: ``e^{s^2/2}`` and ``(e^{s^2}-1) e^{s^2}`` for the lognormal
residual of sd ``s = resid_scale``, the closed-form mixture of two lognormals for the
``mixture`` residual).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from bayesprism.costs import collectives
from bayesprism.errors import InputError, Problem
from bayesprism.plan import Cluster, ParallelPlan, PlanWarning, nodes_spanned
from bayesprism.posterior import flat_draws, recorded_traced_plan
from bayesprism.spec import DEFAULT_PRIORS, ModelSpec

MICROBATCH_CLASSES = ("gemm", "attention", "elementwise", "norm", "memcpy", "other")
COMM_ROLES = ("tp", "cp", "ep", "pp", "dp")
#: Roles whose traced collectives are replayed from their fitted transfer per signature when
#: the target keeps their group (``bayesprism.model.statistics.FIXED_GROUP_ROLES``); "pp" is
#: replayed too when a fit has kernel medians for its send/recv.
REPLAYED_ROLES = ("tp", "cp", "ep", "pp")
DDP_BUCKET_BYTES = 25 * 2**20
LEVELS = ("node", "gpu", "step", "gpustep")


# ---------------------------------------------------------------------------- reading
#: Posterior variables of the slow component of a ``mixture`` residual (docs/artifacts.md).
RESID_SLOW_VARS = ("resid_slow_weight", "resid_slow_shift", "resid_slow_sd")


def stretched_slow_sd(slow_sd, fitted_scale, scale):
    """The slow component's sd when the core sd ``fitted_scale`` is stretched to ``scale``
    (spec ``step_noise``): the slow launches keep their extra spread ``slow_sd² − σ²``."""
    return np.sqrt(np.asarray(slow_sd) ** 2 - np.asarray(fitted_scale) ** 2
                   + np.asarray(scale) ** 2)


def has_resid_slow(group: xr.Dataset) -> bool:
    """True when ``group`` holds a ``mixture`` residual (all of :data:`RESID_SLOW_VARS`).

    Raises
    ------
    InputError
        When only some of them are present (a damaged posterior).
    """
    present = [name for name in RESID_SLOW_VARS if name in group]
    if present and len(present) < len(RESID_SLOW_VARS):
        missing = [name for name in RESID_SLOW_VARS if name not in group]
        raise InputError(Problem("posterior", ", ".join(missing),
                                 "a mixture residual needs all of " + ", ".join(RESID_SLOW_VARS),
                                 example=present))
    return bool(present)


def fitted_step_weights(posterior: xr.DataTree) -> np.ndarray | None:
    """Share of the fitted GPU-steps (one GPU's run of one step) in each step unit, in the
    order of the posterior's ``step_unit`` coordinate: the chance that a measured run picked
    at random is in that step. None when the fit has no steps or does not record them."""
    if (not isinstance(posterior, xr.DataTree) or "constant_data" not in posterior.children
            or "step_of_gpustep" not in posterior["constant_data"]
            or "step_unit" not in posterior["posterior"].coords):
        return None
    steps = posterior["constant_data"]["step_of_gpustep"].to_numpy().astype(int)
    counts = np.bincount(steps, minlength=posterior["posterior"].sizes["step_unit"])
    return counts / counts.sum()


def residual_moments(
    scale: np.ndarray,
    slow: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    step_noise: np.ndarray | None = None,
    step_weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of one launch's residual factor ``exp(eps)``, per draw.

    Parameters
    ----------
    scale
        ``resid_scale`` of the class (sd of the core, log scale), shape (D,).
    slow
        ``(weight, shift, slow_sd)`` of a ``mixture`` residual, each (D,), or None (lognormal):
        ``eps ~ (1 - weight) N(0, scale) + weight N(shift, slow_sd)``.
    step_noise
        ``step_noise`` (D, S) of a fit with ``step_noise`` (the S fitted steps' log
        residual-scale factors), or None: a new step is one of the fitted steps, picked with
        ``step_weights`` (S,; default equal, see :func:`fitted_step_weights`) as in
        ``bayesprism.row_predictive.predict_rows``, its core sd ``exp(lam) * scale``
        (the slow component keeps its shift and extra spread); the moments are those of a
        launch in such a step (the mean of the steps' moments, plus the variance of their
        means). Launches of one step share ``lam``; a sum over them treated as independent
        understates that shared part.

    Returns
    -------
    (mean, variance)
        Closed form: a lognormal component of log mean ``m`` and sd ``s`` has mean
        ``e^{m + s^2/2}`` and variance ``(e^{s^2} - 1) e^{2m + s^2}``; the mixture's variance is
        the weighted within-component variances plus ``w (1 - w)`` times the squared
        difference of the component means (no cancellation for small sds).
    """
    scale = np.asarray(scale, dtype=float)
    if step_noise is not None:
        factor = np.exp(np.asarray(step_noise, dtype=float))  # (D, S)
        core = scale[:, None] * factor
        stretched = None if slow is None else (
            np.asarray(slow[0], dtype=float)[:, None],
            np.asarray(slow[1], dtype=float)[:, None],
            stretched_slow_sd(np.asarray(slow[2], dtype=float)[:, None], scale[:, None], core))
        mean, var = residual_moments(core, stretched)
        weights = (np.full(factor.shape[1], 1.0 / factor.shape[1]) if step_weights is None
                   else np.asarray(step_weights, dtype=float))
        marginal_mean = mean @ weights
        return marginal_mean, var @ weights + ((mean - marginal_mean[:, None]) ** 2) @ weights
    core_mean = np.exp(0.5 * scale**2)
    core_var = np.expm1(scale**2) * np.exp(scale**2)
    if slow is None:
        return core_mean, core_var
    weight, shift, slow_sd = (np.asarray(v, dtype=float) for v in slow)
    slow_mean = np.exp(shift + 0.5 * slow_sd**2)
    slow_var = np.expm1(slow_sd**2) * np.exp(2.0 * shift + slow_sd**2)
    mean = (1.0 - weight) * core_mean + weight * slow_mean
    var = ((1.0 - weight) * core_var + weight * slow_var
           + weight * (1.0 - weight) * (slow_mean - core_mean) ** 2)
    return mean, var


def _resid_slow(group: xr.Dataset) -> dict:
    """Kernel class -> (weight, shift, slow_sd) draws of a ``mixture`` residual ({} otherwise;
    a partial one raises, :func:`has_resid_slow`)."""
    if not has_resid_slow(group):
        return {}
    values = [flat_draws(group[name].transpose("chain", "draw", "kernel_class"))
              for name in RESID_SLOW_VARS]
    classes = group["resid_slow_weight"]["kernel_class"].to_numpy().astype(str)
    return {c: tuple(v[:, i] for v in values) for i, c in enumerate(classes)}


def _traced_plan(inventory: xr.Dataset) -> dict:
    plan = recorded_traced_plan(inventory)
    out = {k: int(plan.get(k) or 1) for k in ("dp", "tp", "pp", "cp", "ep", "microbatches")}
    out["sharding"] = plan.get("sharding") or "none"
    out["gpus_per_node"] = int(plan.get("gpus_per_node") or 8)
    out["schedule"] = plan.get("schedule")
    return out


@dataclass(frozen=True)
class IdleLaw:
    """Host idle time of a rank before each synchronisation of a step, per posterior draw.

    Segment ``j``'s idle is gamma with mean ``mean[:, j]`` and variance ``var[:, j]``,
    independent over ranks and steps; ``roles[j]`` is the parallel role of the collective that
    ends the segment (``"step"``: the step's end).
    """

    mean: np.ndarray  # (D, k)
    var: np.ndarray  # (D, k)
    roles: tuple[str, ...]

    @classmethod
    def none(cls, draws: int) -> IdleLaw:
        return cls(np.zeros((draws, 0)), np.zeros((draws, 0)), ())


#: Seed of the idle law's parameter draws (fixed: the same fit gives the same law).
_IDLE_SEED = 0x1D1E


def fit_idle_law(values: np.ndarray, roles: list[str], draws: int) -> IdleLaw:
    """Gamma idle law per segment with its parameter uncertainty, ``draws`` draws.

    ``values[:, j]`` holds the traced idle times (µs) of segment ``j`` over the traced
    (step, rank) units (NaN where a unit has none). Each draw reweights the units with
    Dirichlet(1, ..., 1) weights (Bayesian bootstrap over rank-steps, one weight vector for all
    segments, so a rank-step that idles long everywhere moves them together) and takes each
    segment's weighted mean and (``n/(n-1)``-corrected) variance over its finite values: a few
    traced ranks give a wide law, without assuming a family for the parameters. The gamma
    (moment-matched per draw) has an exponential upper tail: lighter than a lognormal's, which
    overstated the slowest of the traced ranks' host idle (the first segment of the DLRM traces
    is skewed to the left in logs), heavier than a normal's. One value (or equal values): that
    value, variance 0. Segments with no value are dropped.

    Examples
    --------
    >>> law = fit_idle_law(np.array([[10.0, 5.0], [10.0, 7.0]]), ["tp", "step"], draws=3)
    >>> law.mean[:, 0].tolist(), law.var[:, 0].tolist(), law.roles
    ([10.0, 10.0, 10.0], [0.0, 0.0, 0.0], ('tp', 'step'))
    """
    values = np.asarray(values, dtype=float).reshape(len(values), -1)
    finite = np.isfinite(values)
    keep = finite.any(axis=0)
    if not keep.any():
        return IdleLaw.none(draws)
    finite, roles = finite[:, keep], [str(r) for r, k in zip(roles, keep, strict=True) if k]
    seg = np.where(finite, np.maximum(np.nan_to_num(values[:, keep]), 0.0), 0.0)
    # Dirichlet(1, ..., 1) = normalised standard exponentials
    w = np.random.default_rng(_IDLE_SEED).standard_exponential((draws, seg.shape[0]))
    total = w @ finite  # (D, J): each segment's weights sum over its finite units
    mean = (w @ seg) / total
    second = (w @ seg**2) / total
    n = finite.sum(axis=0)
    spread = (np.ptp(np.where(finite, seg, seg.max(axis=0)), axis=0) > 0) & (n > 1)
    var = np.where(spread, np.maximum(second - mean**2, 0.0) * n / np.maximum(n - 1, 1), 0.0)
    # constant segments: exactly their value (no rounding from the weights)
    constant = seg.sum(axis=0) / n
    mean = np.where(spread, mean, constant)
    return IdleLaw(mean, var, tuple(roles))


def _traced_idle_law(group: xr.Dataset, inventory: xr.Dataset, modelled: set[str],
                     traced_gpn: int) -> IdleLaw:
    """The idle law of the traced run: from ``traced_idle_us`` (per synchronisation), or, for
    inventories without it, one segment per step from the rank-step gaps of
    :func:`_traced_gaps_us` (span minus expected busy time, posterior median); then the host
    time at the step's boundary (``traced_step_gap_us``), one segment of role ``boundary``."""
    draws = int(group.sizes["chain"] * group.sizes["draw"])
    if "traced_idle_us" in inventory and np.isfinite(inventory["traced_idle_us"]).any():
        idle = inventory["traced_idle_us"].transpose("step_unit", "rank", "sync").to_numpy()
        roles = list(inventory["sync_role"].to_numpy().astype(str) if "sync_role" in inventory
                     else ["unknown"] * (idle.shape[-1] - 1) + ["step"])
    else:
        gaps = _traced_gaps_us(group, inventory, modelled, traced_gpn)
        if gaps is None:
            return IdleLaw.none(draws)
        idle = np.asarray(gaps, dtype=float).reshape(inventory.sizes.get("step_unit", 1), -1, 1)
        roles = ["step"]
    if "traced_step_gap_us" in inventory:
        # one boundary gap per traced step (the first rank's row holds it): the step's, shared
        # by its ranks (the traces show the step's gap, not each host's)
        boundary = np.full((*idle.shape[:2], 1), np.nan)
        boundary[:, 0, 0] = inventory["traced_step_gap_us"].to_numpy().astype(float)
        idle, roles = np.concatenate([idle, boundary], axis=-1), [*roles, "boundary"]
    return fit_idle_law(idle.reshape(-1, idle.shape[-1]), roles, draws)


def _traced_gaps_us(
    group: xr.Dataset, inventory: xr.Dataset, modelled: set[str], traced_gpn: int
) -> np.ndarray | None:
    """Per traced (step, rank), span minus expected busy time (>= 0, posterior median; NaN
    where the span is unknown).

    The busy time of a traced rank is the sum over its kernels of launches times the mean
    duration (``exp(kernel_log_median + resid_scale^2 / 2)``; cost-modelled collectives: the
    mean ring transfer at the traced group size and bytes). None when the inventory has no
    ``traced_step_time_us`` or ``launches``.
    """
    draws = int(group.sizes["chain"] * group.sizes["draw"])
    if "traced_step_time_us" not in inventory or "launches" not in inventory:
        return None
    launches = inventory["launches"].fillna(0.0)
    names = launches["kernel"].to_numpy().astype(str)
    classes = inventory["kernel_class"].sel(kernel=names).to_numpy().astype(str)
    medians = set(group["kernel_log_median"]["kernel"].to_numpy().astype(str))
    class_names = (set(group["kernel_class"].to_numpy().astype(str))
                   if "kernel_class" in group.coords else set())
    mean_us = np.zeros((draws, names.size))
    slow = _resid_slow(group)
    # the traced steps are the fitted ones: each counts once
    step_noise = flat_draws(group["step_noise"]) if "step_noise" in group else None
    small_latency = _small_latency(group)
    for k, (name, cls) in enumerate(zip(names, classes, strict=True)):
        if name in medians:
            typical_us = np.exp(flat_draws(group["kernel_log_median"].sel(kernel=name)))
            if "resid_scale" in group and cls in class_names:
                resid = flat_draws(group["resid_scale"].sel(kernel_class=cls))
                typical_us = typical_us * residual_moments(resid, slow.get(cls), step_noise)[0]
            mean_us[:, k] = typical_us
        elif cls in modelled and "coll_latency_us" in group:
            size = float(inventory["group_size"].sel(kernel=name)) if (
                "group_size" in inventory) else 2.0
            nbytes = float(inventory["bytes_per_launch"].sel(kernel=name)) if (
                "bytes_per_launch" in inventory) else 0.0
            size = size if np.isfinite(size) and size >= 2 else 2.0
            tier = "inter" if size > traced_gpn else "intra"
            source = cls if cls in group["coll_latency_us"]["collective"] else "allreduce"
            params = {name: flat_draws(group[name].sel(collective=source, tier=tier))
                      for name in ("coll_latency_us", "coll_bandwidth_gbps")}
            mean_us[:, k] = collectives.transfer_time_us(
                cls, size, np.nan_to_num(nbytes), params["coll_latency_us"],
                params["coll_bandwidth_gbps"],
                small_latency_log_ratio=small_latency.get(tier, 0.0))
    busy = xr.DataArray(mean_us, dims=("sample", "kernel"), coords={"kernel": names})
    busy = (busy * launches).sum("kernel")
    gap = (inventory["traced_step_time_us"] - busy).median("sample")
    return np.clip(gap.to_numpy().ravel(), 0.0, None)


def _small_latency(group: xr.Dataset) -> dict:
    """Tier -> (D,) fitted ρ of small messages (``coll_small_latency_log_ratio``; 0 in a tier
    whose ρ the fit left out)."""
    if "coll_small_latency_log_ratio" not in group:
        return {}
    da = group["coll_small_latency_log_ratio"].transpose("chain", "draw", "tier")
    values = flat_draws(da)
    return {str(t): values[:, i] for i, t in enumerate(da["tier"].to_numpy())}


def collective_model_classes(posterior: xr.DataTree, group: xr.Dataset) -> set[str]:
    """Collective classes that have the ring cost model (posterior group attrs, contract)."""
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


@dataclass(frozen=True)
class PosteriorArrays:
    """What :func:`build_plan_model` reads from a kernel-level fit, as NumPy arrays flattened
    over (chain, draw) in chain-major order: extracted once per posterior object
    (:func:`posterior_arrays`), since xarray selections per kernel and class dominated the cost
    of a composition."""

    draws: int
    traced: dict
    modelled: frozenset
    kernels: np.ndarray  # inventory kernels, with their class, role, launches, sizes, bytes
    classes: np.ndarray
    roles: np.ndarray
    launches: np.ndarray
    stage_launches: np.ndarray | None  # (kernel, traced stage) launches per step, or None
    stage_bytes: np.ndarray | None  # (kernel, traced stage) bytes per collective launch
    tail_share: np.ndarray  # (kernel,) share of launches in the step's tail (optimizer step)
    group_sizes: np.ndarray
    nbytes: np.ndarray
    log_median: dict  # kernel -> (D,)
    class_scale: dict  # (level, kernel class) -> (D,), levels of LEVELS and "resid"
    coll_cost: dict  # (variable, collective, tier) -> (D,)
    # tier -> (D,) ρ, the log ratio of a small message's per-step latency (collectives); a
    # tier without one (not fitted) costs small messages at the one latency
    small_latency: dict
    fabric_exponent: np.ndarray | None  # (D,) γ of the inter-node bandwidth, None: not fitted
    # (rate, log slowdown), each (D,): a node's link is degraded in an allocation with
    # probability ``rate``, and inter-node transfers then move their bytes exp(slowdown) times
    # slower (bayesprism.model.kernel); None without a cost model
    degraded_link: tuple[np.ndarray, np.ndarray] | None
    # (variable, key) -> (D,): ("coll_noise", collective), ("coll_congestion",
    # "collective/tier") (older posteriors, with one congestion per collective: by collective)
    coll_spread: dict
    idle: IdleLaw
    # the traced ranks' work-weighted mean compute segment between stage-group collectives
    # (µs) and the share of their compute in such segments (inventory ``sync_segment_us``,
    # ``sync_segment_share``; NaN: not known, no waiting from segment noise)
    sync_segment_us: float = math.nan
    sync_segment_share: float = math.nan
    # kernel class -> (resid_slow_weight, resid_slow_shift, resid_slow_sd), each (D,): the slow
    # component of a ``mixture`` residual (empty for other likelihoods)
    resid_slow: dict = field(default_factory=dict)
    # (D, S) fitted steps' log residual-scale factors (spec ``step_noise``), else None, and
    # (S,) the share of fitted GPU-steps in each (:func:`fitted_step_weights`)
    step_noise: np.ndarray | None = None
    step_weights: np.ndarray | None = None
    # (weight, shift, sd) of GPU×step episodes in core sds, each (D,), or None (normal)
    gpustep_slow: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # (collective, tier) pairs whose transfers the fit measured; the fit extrapolates the
    # others (bayesprism.model.kernel._collective_part), which extrapolation_notes names
    measured_tiers: frozenset = frozenset()


def _check_groups(posterior) -> None:
    if (not isinstance(posterior, xr.DataTree) or "posterior" not in posterior.children
            or "inventory" not in posterior.children):
        raise InputError(
            Problem(
                "posterior",
                "groups",
                "needs the 'posterior' and 'inventory' "
                "groups of a kernel-level fit (docs/artifacts.md)",
            )
        )


def posterior_arrays(posterior: xr.DataTree) -> PosteriorArrays:
    """The arrays of ``posterior`` that plan models need (about 0.1 s for the dev job's fit):
    extract them once and pass them to every :func:`build_plan_model` /
    ``bayesprism.composition.compose`` call on the same posterior.

    Examples
    --------
    >>> arrays = posterior_arrays(posterior)  # doctest: +SKIP
    >>> model = build_plan_model(posterior, plan, arrays=arrays)  # doctest: +SKIP
    """
    _check_groups(posterior)
    return _extract_arrays(posterior)


def _spec_prior(posterior: xr.DataTree, name: str) -> float:
    """Prior ``name`` of the spec the posterior was fitted with (the default when absent)."""

    stored = posterior.attrs.get("spec")
    return ModelSpec.from_dict(json.loads(stored)).prior(name) if stored \
        else DEFAULT_PRIORS[name]


def _stratified_levels(rng: np.random.Generator, draws: int) -> np.ndarray:
    """Probability levels (i + 0.5) / draws in a shuffled order: prior quantiles drawn this way
    cover the prior evenly whatever the number of draws, independent of the fitted values."""
    return (rng.permutation(draws) + 0.5) / draws


def _fabric_exponent(posterior: xr.DataTree, group: xr.Dataset, costed: bool
                     ) -> np.ndarray | None:
    """γ per draw (inter-node bandwidth times (nodes / 2)^-γ): fitted, or, where the fit saw no
    group spanning more than two nodes, its half-normal prior (stratified quantiles in a fixed
    shuffled order, independent of the other parameters); None without a cost model."""
    if "coll_fabric_exponent" in group:
        return flat_draws(group["coll_fabric_exponent"])
    if not costed:
        return None
    from scipy import special

    draws = group.sizes["chain"] * group.sizes["draw"]
    level = _stratified_levels(np.random.default_rng(draws), draws)
    return _spec_prior(posterior, "fabric_exponent") * special.ndtri(0.5 + 0.5 * level)


def _degraded_link(posterior: xr.DataTree, group: xr.Dataset, costed: bool
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """(rate, log slowdown) per draw of degraded inter-node links: fitted, or, where the fit
    saw no inter-node transfer, their priors (stratified quantiles in fixed shuffled orders,
    independent of each other and of the other parameters); None without a cost model."""
    if "coll_degraded_rate" in group:
        return (flat_draws(group["coll_degraded_rate"]),
                flat_draws(group["coll_degraded_log_slowdown"]))
    if not costed:
        return None
    from scipy import special

    draws = group.sizes["chain"] * group.sizes["draw"]
    rng = np.random.default_rng([draws, 1])
    beta = _spec_prior(posterior, "degraded_link_beta")
    rate = -np.expm1(np.log1p(-_stratified_levels(rng, draws)) / beta)  # Beta(1, b) quantile
    scale = _spec_prior(posterior, "degraded_link_slowdown")
    return rate, scale * special.ndtri(0.5 + 0.5 * _stratified_levels(rng, draws))


def _extract_arrays(posterior: xr.DataTree) -> PosteriorArrays:
    group = posterior["posterior"].to_dataset()
    inventory = posterior["inventory"].to_dataset()
    traced = _traced_plan(inventory)
    kernels = inventory["kernel_class"]["kernel"].to_numpy().astype(str)
    n = kernels.shape

    def column(name: str, default) -> np.ndarray:
        return inventory[name].to_numpy() if name in inventory else np.full(n, default)

    modelled = collective_model_classes(posterior, group)
    medians = group["kernel_log_median"]
    flat_medians = flat_draws(medians)
    log_median = {str(k): flat_medians[:, i]
                  for i, k in enumerate(medians["kernel"].to_numpy().astype(str))}
    class_scale = {}
    if "kernel_class" in group.coords:
        class_names = group["kernel_class"].to_numpy().astype(str)
        for level in (*LEVELS, "resid"):
            name = f"{level}_scale"
            if name in group and "kernel_class" in group[name].dims:
                values = flat_draws(group[name].transpose("chain", "draw", "kernel_class"))
                class_scale.update({(level, c): values[:, i] for i, c in enumerate(class_names)})
    coll_cost, coll_spread = {}, {}
    for name in ("coll_latency_us", "coll_bandwidth_gbps"):
        if name in group:
            da = group[name].transpose("chain", "draw", "collective", "tier")
            values = flat_draws(da)
            for i, c in enumerate(da["collective"].to_numpy().astype(str)):
                for j, t in enumerate(da["tier"].to_numpy().astype(str)):
                    coll_cost[(name, c, t)] = values[:, i, j]
    for name in ("coll_noise", "coll_congestion"):
        if name in group:
            by = "coll_pair" if "coll_pair" in group[name].dims else "collective"
            da = group[name].transpose("chain", "draw", by)
            values = flat_draws(da)
            for i, c in enumerate(da[by].to_numpy().astype(str)):
                coll_spread[(name, c)] = values[:, i]
    return PosteriorArrays(
        resid_slow=_resid_slow(group),
        step_noise=flat_draws(group["step_noise"]) if "step_noise" in group else None,
        step_weights=fitted_step_weights(posterior),
        gpustep_slow=(tuple(flat_draws(group[f"gpustep_slow_{name}"])
                            for name in ("weight", "shift", "sd"))
                      if "gpustep_slow_weight" in group else None),
        draws=int(group.sizes["chain"] * group.sizes["draw"]),
        traced=traced,
        modelled=frozenset(modelled),
        kernels=kernels,
        classes=inventory["kernel_class"].to_numpy().astype(str),
        roles=column("role", "unknown").astype(str),
        launches=inventory["launches_per_step"].to_numpy().astype(float),
        stage_launches=_stage_launches(inventory),
        stage_bytes=(inventory["stage_bytes"].transpose("kernel", "pp_stage").to_numpy()
                     if "stage_bytes" in inventory else None),
        tail_share=(inventory["tail_share"].to_numpy().astype(float) if "tail_share" in inventory
                    else (inventory["kernel_class"].to_numpy().astype(str) == "optimizer"
                          ).astype(float)),
        group_sizes=column("group_size", np.nan).astype(float),
        nbytes=column("bytes_per_launch", np.nan).astype(float),
        log_median=log_median,
        class_scale=class_scale,
        coll_cost=coll_cost,
        small_latency=_small_latency(group),
        fabric_exponent=_fabric_exponent(posterior, group, bool(modelled)),
        degraded_link=_degraded_link(posterior, group, bool(modelled)),
        coll_spread=coll_spread,
        measured_tiers=frozenset(
            tuple(str(label).split("/", 1))
            for label in (group["coll_pair"].to_numpy() if "coll_pair" in group.coords else ())
            if "/" in str(label)),
        idle=_traced_idle_law(group, inventory, modelled, traced["gpus_per_node"]),
        sync_segment_us=_scalar(inventory, "sync_segment_us"),
        sync_segment_share=_scalar(inventory, "sync_segment_share"),
    )


def _scalar(inventory: xr.Dataset, name: str) -> float:
    return float(inventory[name]) if name in inventory else math.nan


def _stage_gradients(arrays: PosteriorArrays, rows: list[int], pp: int, shard: float
                     ) -> list[tuple[float, float]] | None:
    """(gradient bytes, buckets) per step of each of the target's ``pp`` stages from the
    traced stages' data-parallel collectives, times ``shard`` (``tp0 / tp``: a GPU's share of
    its stage's parameters); another ``pp`` or ``tp``: :func:`retarget_stages`, in buckets of
    the traced mean size. None when the inventory has no per-stage launches and bytes."""
    if arrays.stage_launches is None or arrays.stage_bytes is None:
        return None
    traced = []
    for stage in range(arrays.stage_launches.shape[1]):
        launches = np.array([arrays.stage_launches[k, stage] for k in rows])
        nbytes = np.array([arrays.stage_bytes[k, stage] for k in rows])
        ok = np.isfinite(nbytes) & (launches > 0)
        if not ok.any():
            return None
        traced.append((float((launches[ok] * nbytes[ok]).sum()),
                       max(1.0, float(launches[ok].sum()))))
    pp0 = len(traced)
    if pp == pp0 and shard == 1.0:
        return traced
    grads = retarget_stages(np.array([[g for g, _ in traced]]), pp)
    if grads is None:
        return None
    bucket = sum(g for g, _ in traced) / sum(b for _, b in traced)
    return [(float(g), max(1.0, math.ceil(g / bucket - 1e-9)))
            for g in grads[0] * shard * pp0 / pp]


def retarget_stages(per_stage: np.ndarray, pp: int,
                    per_boundary: np.ndarray | None = None) -> np.ndarray | None:
    """Per-traced-stage quantities ``(kernel, pp0)`` on the ``pp`` stages of a target, in the
    traced stages' units (a target stage's value times ``pp0 / pp`` is its own): the middle
    stages' mean is work that follows the layers (``1/pp`` of them a stage), and what the first
    and the last stage run beyond it (the embedding; the output layer and the loss) stays on
    the first and last stage. Rows flagged ``per_boundary`` (pipeline send/recv: per stage
    boundary, not per layer) keep the first, middle and last stages' own counts.

    None when the stages cannot be told apart that way (fewer than three traced stages and
    another ``pp``).

    Examples
    --------
    >>> import numpy as np
    >>> work = np.array([[4.0, 4.0, 4.0, 4.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    >>> own = retarget_stages(work, 8) * 4 / 8  # a target stage's own: half the layers
    >>> own[:, [0, 1, 6, 7]].tolist()  # the first, two middle and the last of 8 stages
    [[2.0, 2.0, 2.0, 2.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]]
    >>> (retarget_stages(work, 1) * 4).tolist()  # one stage holds every layer and both ends
    [[16.0], [1.0], [2.0]]
    """
    pp0 = per_stage.shape[1]
    if pp == pp0:
        return per_stage
    if pp0 < 3:
        return None
    body = per_stage[:, 1:-1].mean(axis=1)
    out = np.repeat(body[:, None], pp, axis=1)
    out[:, 0] += (pp / pp0) * (per_stage[:, 0] - body)
    out[:, -1] += (pp / pp0) * (per_stage[:, -1] - body)
    if per_boundary is not None and per_boundary.any():
        # a stage's transfers per micro-batch depend on its place, not on its layers (a
        # single stage sends none)
        place = np.repeat(body[:, None], pp, axis=1)
        place[:, 0], place[:, -1] = per_stage[:, 0], per_stage[:, -1]
        out[per_boundary] = 0.0 if pp == 1 else (pp / pp0) * place[per_boundary]
    return np.maximum(out, 0.0)


def _stage_launches(inventory: xr.Dataset) -> np.ndarray | None:
    """Launches per step of each kernel on each traced pipeline stage (mean over the stage's
    ranks), or None when the inventory does not say which stage each rank ran."""
    if "rank_pp_stage" not in inventory or "launches" not in inventory:
        return None
    stage = inventory["rank_pp_stage"].to_numpy()
    if (stage < 0).any():
        return None
    launches = inventory["launches"].transpose("kernel", "rank").to_numpy()
    stages = int(stage.max()) + 1
    return np.stack([launches[:, stage == s].mean(axis=1) for s in range(stages)], axis=1)


@dataclass
class CommTerm:
    """One kind of collective traffic of the target plan, deterministic per draw."""

    # what shares the step's congestion draw: the tier (all its bandwidth-bound transfers move
    # together from step to step, on the dev job's traces), or a class of its own
    congestion_key: str
    where: str  # "stage" (per micro-batch, blocks compute), "p2p", "dp", "fallback"
    det_us: np.ndarray  # (D,) total per step for the rank (per micro-batch & direction for p2p)
    noise_mean_log: np.ndarray  # (D,)
    noise_sd_log: np.ndarray  # (D,)
    congestion_sd: np.ndarray  # (D,)
    # the pipeline stage whose own traffic it is ("dp", "stage"), None: every stage
    stage: int | None = None
    # (D,) extra time when the allocation has a degraded link (inter-node terms), None: none
    degraded_extra_us: np.ndarray | None = None


@dataclass
class PlanModel:
    """Per-draw deterministic quantities of one plan (arrays of length D = chain*draw)."""

    plan: ParallelPlan
    gpus_per_node: int
    fwd_us: np.ndarray  # (D, pp) typical compute of one micro-batch forward on one GPU per stage
    bwd_us: np.ndarray
    opt_us: np.ndarray  # optimizer per step per GPU
    loading: dict[str, np.ndarray]  # level -> effective loading
    resid_mu: np.ndarray  # mean of the per-rank-step residual log factor
    resid_sd: np.ndarray
    comms: list[CommTerm] = field(default_factory=list)
    # host idle before each synchronisation (gamma per segment, (D, k)) and the number of
    # ranks each synchronisation waits for in the target plan (k,)
    idle_mean: np.ndarray | None = None
    idle_var: np.ndarray | None = None
    idle_group: np.ndarray | None = None
    # (D,) relative launch-to-launch noise of one compute segment between the stage group's
    # collectives, and the share of the work in such segments (bayesprism.forecast.groupwait);
    # None: the group waits for its slowest member's step multiplier only
    sync_noise: np.ndarray | None = None
    sync_share: float = 0.0
    # GPU×step episodes (weight, shift, sd in core sds), each (D,); None: normal transients
    gpustep_slow: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # (D,) probability that a node of the plan's allocation has a degraded link; None: never
    degraded_rate: np.ndarray | None = None
    # what of the plan is not the traced run's own structure: scaled or costed by formula
    extrapolated: tuple[str, ...] = ()

    @property
    def draws(self) -> int:
        return int(self.fwd_us.shape[0])


def build_plan_model(
    posterior: xr.DataTree,
    plan: ParallelPlan,
    cluster: Cluster | None = None,
    *,
    typical: bool = False,
    arrays: PosteriorArrays | None = None,
) -> PlanModel:
    """Deterministic per-draw quantities of ``plan`` from a kernel-level posterior.

    With ``typical=True`` a single "draw" is built from the posterior medians with every
    variability scale set to zero: the plan's variability-free step. ``arrays``: the
    posterior's :func:`posterior_arrays`, when the caller already has them.

    Steps: the GPUs per node (:func:`_gpus_per_node`); the inventory's kernels summed onto the
    target's ranks (:func:`_kernel_sums`: compute work, replayed and fallback collectives);
    the work-weighted loadings and residual law (:func:`_effective_residual`); the collectives
    the cost model prices (:func:`_cost_model_specs`, :func:`_comm_terms`); per-stage compute
    (:func:`_stage_compute`).
    """
    arrays = posterior_arrays(posterior) if arrays is None else arrays
    gpn = _gpus_per_node(plan, cluster)
    reading = _Reading(arrays, typical)
    scaling = _Scaling.of(arrays.traced, plan, arrays)
    sums = _kernel_sums(reading, plan, scaling)
    _warn_left_out(plan, arrays.traced, sums, typical)
    loading, resid_mu, resid_sd = _effective_residual(sums)
    specs = _cost_model_specs(arrays, plan, gpn, sums.replayed, scaling.stage_launches,
                              sums.fallback_names)
    comms = _comm_terms(reading, specs, sums, cluster)
    fwd_bwd_stage, opt = _stage_compute(sums, scaling.by_stage, plan.pp)
    sync_noise, sync_share = _segment_noise(arrays, sums, scaling)
    law = arrays.idle
    return PlanModel(
        plan=plan,
        gpus_per_node=gpn,
        fwd_us=fwd_bwd_stage / 3.0,
        bwd_us=2.0 * fwd_bwd_stage / 3.0,
        opt_us=opt,
        loading=loading,
        resid_mu=resid_mu,
        resid_sd=resid_sd,
        comms=comms,
        idle_mean=reading.per_draw(law.mean),
        idle_var=np.zeros((reading.draws, len(law.roles))) if typical else law.var,
        idle_group=np.array([sync_group(plan, role) for role in law.roles], dtype=np.int64),
        sync_noise=sync_noise,
        sync_share=sync_share,
        gpustep_slow=None if typical else arrays.gpustep_slow,
        degraded_rate=(None if typical or arrays.degraded_link is None
                       else arrays.degraded_link[0]),
        extrapolated=() if typical else extrapolation_notes(arrays, plan, scaling, sums, specs),
    )


def _segment_noise(arrays: PosteriorArrays, sums: _KernelSums, scaling: _Scaling
                   ) -> tuple[np.ndarray | None, float]:
    """``kappa`` (D,), the relative sd of one compute segment between stage-group
    collectives, and the share of the work in such segments.

    A rank's launch-to-launch variance per µs of work is ``var_sum / mean_inflation`` (the
    residual moments of :func:`_effective_residual`); a segment of length ``b`` then has
    variance ``b`` times that, so with segments of the traced work-weighted mean length
    ``L`` (scaled like every launch, by the tensor/context-parallel degrees),
    ``kappa^2 = var_sum / (mean_inflation * L)``. None when the traces give no segments.
    """
    length, share = arrays.sync_segment_us, arrays.sync_segment_share
    if not (np.isfinite(length) and length > 0 and np.isfinite(share) and share > 0):
        return None, 0.0
    per_us = np.where(sums.mean_inflation > 0,
                      sums.var_sum / np.maximum(sums.mean_inflation, 1e-300), 0.0)
    return np.sqrt(per_us / (length * scaling.duration_factor)), float(min(share, 1.0))


def _spans_nodes(span: int, gpus_per_node: int) -> bool:
    """Whether some group spread over ``span`` consecutive ranks crosses nodes (inter tier):
    one that straddles a node boundary is enough, as the step waits for it."""
    return nodes_spanned(span, gpus_per_node) > 1


_ROLE_NAMES = (("tp", "tensor-parallel"), ("cp", "context-parallel"), ("ep", "expert-parallel"))


def extrapolation_notes(arrays: PosteriorArrays, plan: ParallelPlan, scaling: _Scaling,
                        sums: _KernelSums, specs: list[CommSpec]) -> tuple[str, ...]:
    """What of ``plan``'s step is scaled or costed by formula rather than replayed from the
    traced run (none at the traced layout but the data-parallel group's measured size): one
    short sentence per kind, for the forecast's output.

    The module docstring has the formulas; these say which of them a plan uses.
    """
    traced = arrays.traced
    notes = []
    width0, width = traced["tp"] * traced["cp"], plan.tp * plan.cp
    if width != width0:
        notes.append(f"compute per GPU scaled by tp x cp {width0} -> {width} (work / {width})")
    if plan.pp != traced["pp"]:
        if scaling.by_stage:
            spread = (": the middle stages' work per layer, the first and last stages' own "
                      "extra work (embedding, output layer, loss) kept on them")
        elif arrays.stage_launches is not None:
            spread = (": every stage the traced stages' mean work (the first and last stages' "
                      "extra work spread over all)")
        else:
            spread = ""
        notes.append(f"layers per stage scaled by pp {traced['pp']} -> {plan.pp}{spread}")
    if plan.microbatches != traced["microbatches"]:
        notes.append(f"micro-batches {traced['microbatches']} -> {plan.microbatches}: the "
                     "traced work per micro-batch in the schedule's recursion")
    if traced["schedule"] and plan.schedule != traced["schedule"]:
        notes.append(f"schedule {plan.schedule} (traced {traced['schedule']}): its recursion "
                     "with the traced work per micro-batch")
    if plan.sharding != traced["sharding"]:
        notes.append(f"sharding {plan.sharding} (traced {traced['sharding']}): optimizer work "
                     "and data-parallel collectives by formula")
    roles = set(arrays.roles)
    tokens = (f", message bytes x {traced['cp']}/{plan.cp}" if plan.cp != traced["cp"] else "")
    for role, name in _ROLE_NAMES:
        degree = getattr(plan, role)
        if role in roles and degree > 1 and role not in sums.replayed:
            notes.append(f"{name} collectives from the collective cost model over {degree} "
                         f"ranks (traced {traced[role]}{tokens})")
    if plan.pp > 1 and "pp" in roles and not scaling.by_stage:
        notes.append("pipeline transfers from the collective cost model, one per micro-batch, "
                     "stage boundary and direction, as a delay on every edge")
    group, group0 = plan.dp * plan.cp, traced["dp"] * traced["cp"]
    shard, shard0 = plan.tp * plan.pp, traced["tp"] * traced["pp"]
    dp_specs = [spec for spec in specs if spec.where == "dp" and spec.size == group]
    inter = any(spec.tier == "inter" for spec in dp_specs)
    inter0 = _spans_nodes(width0 * traced["dp"], traced["gpus_per_node"])  # as traced
    if dp_specs and (group != group0 or shard != shard0 or inter != inter0):
        kinds = " + ".join(dict.fromkeys(spec.kind for spec in dp_specs))
        tiers = {True: "inter-node", False: "intra-node"}
        traced_tier = "" if inter == inter0 else f" {tiers[inter0]}"
        scaled = (f"; the gradients of 1/{shard} of the model, traced 1/{shard0}"
                  if shard != shard0 else "")
        notes.append(f"data-parallel {kinds} from the collective cost model over {group} "
                     f"ranks, {tiers[inter]} (traced {group0}{traced_tier}{scaled})")
    unmeasured = sorted({(spec.tier, spec.kind) for spec in specs
                         if (spec.kind, spec.tier) not in arrays.measured_tiers}
                        if arrays.measured_tiers else ())
    for tier in dict.fromkeys(tier for tier, _ in unmeasured):
        kinds = ", ".join(kind for t, kind in unmeasured if t == tier)
        # as the fit extrapolates (bayesprism.model.kernel): from the collectives measured at
        # the tier, else from the collective's other tier
        donors = sorted(kind for kind, t in arrays.measured_tiers if t == tier)
        source = (f"the {', '.join(donors)} there times a ratio of prior median 1" if donors
                  else "the prior's inter/intra ratio")
        notes.append(f"{kinds} at the {tier}-node tier from {source}: the fit measured none "
                     "of their transfers there (e.g. ranks of their groups without trace files, "
                     "whose waits cannot be split off); fit nccl-tests sweeps to learn it")
    return tuple(notes)


def _gpus_per_node(plan: ParallelPlan, cluster: Cluster | None) -> int:
    """The cluster's GPUs per node when given (warning when it overrides the plan's)."""
    gpn = cluster.gpus_per_node if cluster is not None else plan.gpus_per_node
    if cluster is not None and cluster.gpus_per_node != plan.gpus_per_node:
        warnings.warn(
            f"{plan.name}: cluster gpus_per_node = {cluster.gpus_per_node} overrides "
            f"the plan's {plan.gpus_per_node}",
            PlanWarning,
            stacklevel=4,  # the caller of compose (build_plan_model's caller's caller)
        )
    return gpn


class _Reading:
    """How :func:`build_plan_model` reads the posterior arrays: every draw, or (``typical``)
    one "draw" of the posterior medians with every variability scale zero."""

    def __init__(self, arrays: PosteriorArrays, typical: bool):
        self.arrays = arrays
        self.typical = typical
        self.draws = 1 if typical else arrays.draws
        self._moments: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def per_draw(self, values: np.ndarray) -> np.ndarray:
        return np.median(values, axis=0, keepdims=True) if self.typical else values

    def class_scale(self, level: str, cls: str) -> np.ndarray:
        values = self.arrays.class_scale.get((level, cls))
        if self.typical or values is None:
            return np.zeros(self.draws)
        return values

    def resid_moments(self, cls: str) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of the class's residual factor (computed once per class)."""
        if cls not in self._moments:
            # typical: no variability at all, the slow component included
            slow = None if self.typical else self.arrays.resid_slow.get(cls)
            step_noise = None if self.typical else self.arrays.step_noise
            self._moments[cls] = residual_moments(self.class_scale("resid", cls), slow,
                                                  step_noise, self.arrays.step_weights)
        return self._moments[cls]


@dataclass(frozen=True)
class _Scaling:
    """The traced plan's and the target plan's degrees that rescale a traced kernel."""

    traced: dict
    plan: ParallelPlan
    shard: int  # ranks the optimizer state is sharded over, in the target and in the trace
    shard0: int
    microbatch_factor: float  # a kernel's forward/backward time per micro-batch, relative
    per_mb_launch_factor: float  # traced launches per step -> per target micro-batch
    duration_factor: float
    # (kernel, target stage) launches per step in the traced stages' units
    # (:func:`retarget_stages`): stages differ (the first runs the embedding, the last the
    # output layer and the loss); None (no stage of each traced rank, or another pp from fewer
    # than three traced stages): every stage the mean traced rank's
    stage_launches: np.ndarray | None

    @property
    def by_stage(self) -> bool:
        return self.stage_launches is not None

    @classmethod
    def of(cls, traced: dict, plan: ParallelPlan, arrays: PosteriorArrays) -> _Scaling:
        tp0, pp0, cp0, m0 = traced["tp"], traced["pp"], traced["cp"], traced["microbatches"]
        tp, pp, cp = plan.tp, plan.pp, plan.cp
        stage_launches = None
        if arrays.stage_launches is not None:
            stage_launches = retarget_stages(arrays.stage_launches, pp, arrays.roles == "pp")
        return cls(
            traced=traced,
            plan=plan,
            shard=plan.dp * plan.cp if plan.sharding != "none" else 1,
            shard0=traced["dp"] * traced["cp"] if traced["sharding"] != "none" else 1,
            microbatch_factor=tp0 * cp0 * pp0 / (m0 * tp * cp * pp),
            per_mb_launch_factor=pp0 / (m0 * pp),
            duration_factor=tp0 * cp0 / (tp * cp),
            stage_launches=stage_launches,
        )

    def replays(self, role: str) -> bool:
        """Whether a fixed-group collective of ``role`` keeps its traced transfer."""
        plan, traced = self.plan, self.traced
        return (role in REPLAYED_ROLES and getattr(plan, role) == traced[role]
                and plan.cp == traced["cp"] and (role != "pp" or plan.pp == traced["pp"]))


@dataclass
class _KernelSums:
    """What :func:`_kernel_sums` gathers over the inventory's kernels (arrays of length D)."""

    fwd_bwd: np.ndarray  # (D,) forward + backward per micro-batch
    opt: np.ndarray  # (D,) the step's tail (optimizer)
    fwd_bwd_stage: np.ndarray  # (D, pp) the same per traced stage (when by stage)
    opt_stage: np.ndarray
    # work-weighted sums for the effective loadings and the residual moments
    weight_sum: np.ndarray
    loading_sums: dict[str, np.ndarray]
    mean_inflation: np.ndarray
    var_sum: np.ndarray
    # fixed-group collectives replayed from their fitted per-signature transfer: their roles,
    # (class, total per step, the stage whose own traffic it is or None for every stage) and
    # the pipeline transfers
    replayed: set[str] = field(default_factory=set)
    replayed_stage: list[tuple[str, np.ndarray, int | None]] = field(default_factory=list)
    replayed_p2p: list[np.ndarray] = field(default_factory=list)
    # collectives keeping their traced duration (class, total per step), and their names
    fallback: list[tuple[str, np.ndarray]] = field(default_factory=list)
    fallback_names: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # kernels without a fitted median

    @classmethod
    def zeros(cls, draws: int, pp: int) -> _KernelSums:
        return cls(fwd_bwd=np.zeros(draws), opt=np.zeros(draws),
                   fwd_bwd_stage=np.zeros((draws, pp)), opt_stage=np.zeros((draws, pp)),
                   weight_sum=np.zeros(draws),
                   loading_sums={level: np.zeros(draws) for level in LEVELS},
                   mean_inflation=np.zeros(draws), var_sum=np.zeros(draws))


def _kernel_sums(reading: _Reading, plan: ParallelPlan, scaling: _Scaling) -> _KernelSums:
    """Every inventory kernel on the target's ranks: replayed collectives, collectives left to
    the cost model, fallback collectives, compute kernels (and those without a median)."""
    arrays = reading.arrays
    sums = _KernelSums.zeros(reading.draws, plan.pp)
    for k, (name, cls, role) in enumerate(
            zip(arrays.kernels, arrays.classes, arrays.roles, strict=True)):
        is_coll = cls in collectives.COLLECTIVE_CLASSES
        if is_coll and name in arrays.log_median and scaling.replays(role):
            _add_replayed(sums, reading, scaling, k, name, cls, role)
        elif is_coll and cls in arrays.modelled and role in (*COMM_ROLES, "global"):
            continue  # handled with the cost model (_cost_model_specs)
        elif name not in arrays.log_median:
            sums.skipped.append(name)
        elif is_coll:
            _add_fallback(sums, reading, scaling, k, name, cls, role)
        else:
            _add_compute(sums, reading, scaling, k, name, cls)
    return sums


def _add_replayed(sums: _KernelSums, reading: _Reading, scaling: _Scaling, k: int, name: str,
                  cls: str, role: str) -> None:
    """A fixed-group collective at its fitted per-signature transfer."""
    typical_us = np.exp(reading.per_draw(reading.arrays.log_median[name]))
    typical_us = typical_us * reading.resid_moments(cls)[0]
    count = scaling.plan.microbatches * scaling.per_mb_launch_factor
    stage_launches = scaling.stage_launches
    if scaling.by_stage:
        # each stage's own launches (the last stage runs more TP collectives; its pipeline
        # transfers occupy its stream once per micro-batch, and the bottleneck stage's
        # occupancy is what the steady state pays)
        sums.replayed_stage.extend((cls, stage_launches[k, s] * count * typical_us, s)
                                   for s in range(scaling.plan.pp))
    elif role == "pp":
        sums.replayed_p2p.append(typical_us)  # one transfer between neighbouring stages
    else:
        sums.replayed_stage.append((cls, reading.arrays.launches[k] * count * typical_us, None))
    sums.replayed.add(role)


def _add_fallback(sums: _KernelSums, reading: _Reading, scaling: _Scaling, k: int, name: str,
                  cls: str, role: str) -> None:
    """A collective without cost model or role: its traced duration at the traced group size."""
    plan, traced = scaling.plan, scaling.traced
    # a role's collectives vanish when the target drops a parallelism the trace had
    if role in ("tp", "cp", "ep", "pp") and getattr(plan, role) == 1 and traced[role] > 1:
        return
    typical_us = np.exp(reading.per_draw(reading.arrays.log_median[name]))
    count = reading.arrays.launches[k] * (
        1.0 if role == "dp" else plan.microbatches * scaling.per_mb_launch_factor)
    inflation = reading.resid_moments(cls)[0]
    sums.fallback.append((cls, count * typical_us * inflation))
    sums.fallback_names.append(str(name))


def _add_compute(sums: _KernelSums, reading: _Reading, scaling: _Scaling, k: int, name: str,
                 cls: str) -> None:
    """A compute kernel: the step's tail (optimizer step on the rank's parameter shard) and the
    micro-batches, and its work in the weighted loadings and residual moments."""
    arrays, plan, traced = reading.arrays, scaling.plan, scaling.traced
    typical_us = np.exp(reading.per_draw(arrays.log_median[name]))
    launches, stage_launches = arrays.launches, scaling.stage_launches
    tail = float(arrays.tail_share[k])
    tail_dur = (typical_us * traced["tp"] * traced["pp"] / (plan.tp * plan.pp)
                * scaling.shard0 / scaling.shard)
    tail_n = launches[k] * tail
    mb_n = launches[k] * (1.0 - tail) * plan.microbatches * scaling.per_mb_launch_factor
    sums.opt = sums.opt + tail_n * tail_dur
    sums.fwd_bwd = (sums.fwd_bwd
                    + launches[k] * (1.0 - tail) * typical_us * scaling.microbatch_factor)
    if scaling.by_stage:
        sums.opt_stage += np.outer(tail_dur, stage_launches[k] * tail)
        sums.fwd_bwd_stage += np.outer(typical_us * scaling.microbatch_factor,
                                       stage_launches[k] * (1.0 - tail))
    n_step = tail_n + mb_n
    work = tail_n * tail_dur + mb_n * typical_us * scaling.duration_factor
    factor_mean, factor_var = reading.resid_moments(cls)
    sums.weight_sum += work
    for level in LEVELS:
        sums.loading_sums[level] += work * reading.class_scale(level, cls)
    sums.mean_inflation += work * factor_mean
    if n_step > 0:
        sums.var_sum += work**2 / n_step * factor_var


def _warn_left_out(plan: ParallelPlan, traced: dict, sums: _KernelSums, typical: bool) -> None:
    """Warn of collectives kept at their traced duration and of kernels without a median."""
    same_layout = all(getattr(plan, k) == traced[k] for k in ("dp", "tp", "pp", "cp", "ep"))
    if sums.fallback_names and not same_layout and not typical:
        warnings.warn(
            f"{plan.name}: {len(sums.fallback_names)} collective kernels have no cost model or "
            f"no parallel role (group size/bytes unknown) and keep their traced duration at the "
            f"traced group size, e.g. {sums.fallback_names[0]!r}: their growth with the plan "
            "is not forecast",
            PlanWarning,
            stacklevel=4,  # the caller of compose
        )
    if sums.skipped:
        warnings.warn(
            f"{len(sums.skipped)} inventory kernels have no kernel_log_median in the "
            f"posterior and were left out, e.g. {sums.skipped[0]!r}",
            PlanWarning,
            stacklevel=4,
        )


def _effective_residual(sums: _KernelSums) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                     np.ndarray]:
    """Work-weighted loadings of each level, and the rank-step residual's log-normal law
    (``resid_mu``, ``resid_sd``) matching the weighted mean and variance of the factors."""
    weight_sum, mean_inflation = sums.weight_sum, sums.mean_inflation
    safe = np.where(weight_sum > 0, weight_sum, 1.0)
    loading = {level: sums.loading_sums[level] / safe for level in LEVELS}
    inflation = np.where(weight_sum > 0, mean_inflation / safe, 1.0)
    rel_var = np.where(weight_sum > 0,
                       sums.var_sum / np.maximum(mean_inflation, 1e-300) ** 2, 0.0)
    s2 = np.log1p(rel_var)
    return loading, np.log(inflation) - 0.5 * s2, np.sqrt(s2)


def _comm_terms(reading: _Reading, specs: list[CommSpec], sums: _KernelSums,
                cluster: Cluster | None) -> list[CommTerm]:
    """The plan's communication: cost-model terms, then fallback, replayed and p2p terms."""
    comms = [_comm_term(reading.arrays, spec, reading.per_draw, reading.typical, cluster)
             for spec in specs]
    zeros = np.zeros(reading.draws)
    for cls, det in sums.fallback:
        comms.append(CommTerm(cls, "fallback", det, zeros, zeros, zeros))
    for cls, det, stage in sums.replayed_stage:
        comms.append(CommTerm(cls, "stage", det, zeros, zeros, zeros, stage))
    if sums.replayed_p2p:
        comms.append(CommTerm("sendrecv", "p2p", np.mean(sums.replayed_p2p, axis=0), zeros,
                              zeros, zeros))
    return comms


def _stage_compute(sums: _KernelSums, by_stage: bool, pp: int) -> tuple[np.ndarray, np.ndarray]:
    """Forward + backward per micro-batch of each stage (D, pp), and the optimizer tail (D,):
    per traced stage (the slowest stage's tail), else the same on every stage."""
    if by_stage:
        return sums.fwd_bwd_stage, sums.opt_stage.max(axis=1)
    return np.repeat(sums.fwd_bwd[:, None], pp, axis=1), sums.opt


def _cost_model_specs(arrays: PosteriorArrays, plan: ParallelPlan, gpn: int, replayed: set[str],
                      stage_launches: np.ndarray | None,
                      fallback_names: list[str]) -> list[CommSpec]:
    """The collectives of ``plan`` that the collective cost model prices, before costing.

    Stage roles (tp, cp, ep) and pipeline transfers the plan does not replay from the traced
    signatures (``replayed``), the data-parallel gradient buckets (per stage given the
    target's ``stage_launches``, :class:`_Scaling`) and the whole job's collectives (a
    gradient-norm all-reduce); synthesised from the plan's ``activation_bytes`` /
    ``gradient_bytes`` where the trace has none, else left out with a :class:`PlanWarning`
    (``fallback_names``: traced collectives that already stand in for the data-parallel
    ones).
    """
    traced = arrays.traced
    kernels, classes, roles = arrays.kernels, arrays.classes, arrays.roles
    launches, group_sizes, nbytes = arrays.launches, arrays.group_sizes, arrays.nbytes
    modelled, by_stage = arrays.modelled, stage_launches is not None
    tp0, pp0 = traced["tp"], traced["pp"]
    tp, pp, cp, m = plan.tp, plan.pp, plan.cp, plan.microbatches
    per_mb_launch_factor = pp0 / (traced["microbatches"] * pp)
    comm_specs: list[CommSpec] = []
    def placed(span: int, degree: int) -> dict:
        """Tier and nodes spanned of a group of ``degree`` ranks spread evenly over ``span``
        consecutive ranks."""
        if not _spans_nodes(span, gpn):
            return {"tier": "intra", "nodes": 1}
        return {"tier": "inter", "nodes": min(int(degree), nodes_spanned(span, gpn))}

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
        rows = role_rows[role]
        if role in replayed:
            continue
        if rows and traced[role] == 1:
            # groups of a role the traced plan does not have (an inconsistent inventory): the
            # traced groups are kept as they ran, whatever the target's degree
            for k in rows:
                size = float(group_sizes[k]) if np.isfinite(group_sizes[k]) else 2.0
                count = launches[k] * per_mb_launch_factor * m
                nbytes_k = float(np.nan_to_num(nbytes[k]))
                comm_specs.append(CommSpec(classes[k], "stage", int(size), nbytes_k, count,
                                           **placed(int(size), int(size))))
            continue
        if degree == 1:
            continue
        if rows:
            for k in rows:
                count = launches[k] * per_mb_launch_factor * m
                size = nbytes[k] * traced["cp"] / cp if np.isfinite(nbytes[k]) else 0.0
                if by_stage:  # each stage its own launches (the last stage runs more)
                    comm_specs.extend(
                        CommSpec(classes[k], "stage", degree, size,
                                 stage_launches[k, s] * per_mb_launch_factor * m, stage=s,
                                 **placed(span, degree)) for s in range(pp))
                else:
                    comm_specs.append(CommSpec(classes[k], "stage", degree, size, count,
                                               **placed(span, degree)))
        elif role == "tp" and plan.activation_bytes and plan.layers:
            count = 4.0 * plan.layers / pp * m
            comm_specs.append(CommSpec("allreduce", "stage", tp, plan.activation_bytes / cp,
                                       count, **placed(span, tp)))
        else:
            warnings.warn(
                f"{plan.name}: the traced run has no {role.upper()} collectives and the "
                f"plan gives no activation_bytes/layers to synthesise them: "
                f"{role.upper()} communication is left out",
                PlanWarning,
                stacklevel=4,
            )
    if pp > 1 and "pp" not in replayed:
        rows = role_rows["pp"]
        # neighbouring stages are tp*cp*dp ranks apart: two nodes once that is a node or more
        hop = ({"tier": "inter", "nodes": 2} if tp * cp * plan.dp >= gpn
               else {"tier": "intra", "nodes": 1})
        if rows and by_stage:
            # each transfer occupies the stream of the stage that sends or receives it: the
            # stage's own traced transfers per step, part of its busy time (in the steady
            # state the bottleneck stage pays them once per micro-batch), no edge latency
            for k in rows:
                size = float(np.nan_to_num(nbytes[k])) * traced["cp"] / cp
                comm_specs.extend(CommSpec("sendrecv", "stage", 2, size,
                                           stage_launches[k, s] * m * per_mb_launch_factor,
                                           stage=s, **hop) for s in range(pp))
        elif rows:
            size = float(np.nanmean([nbytes[k] for k in rows])) * traced["cp"] / cp
            comm_specs.append(CommSpec("sendrecv", "p2p", 2, size, 1.0, **hop))
        elif plan.activation_bytes:
            comm_specs.append(CommSpec("sendrecv", "p2p", 2, plan.activation_bytes / cp, 1.0,
                                       **hop))
        else:
            warnings.warn(
                f"{plan.name}: the traced run has no pipeline send/recv and the plan "
                "gives no activation_bytes: pipeline transfers are left out",
                PlanWarning,
                stacklevel=4,
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
            if not fallback_names:  # otherwise the traced collectives stand in (warned above)
                warnings.warn(
                    f"{plan.name}: the traced run has no data-parallel gradient "
                    "collectives and the plan gives no gradient_bytes: data-parallel "
                    "communication is left out",
                    PlanWarning,
                    stacklevel=4,
                )
        if grad_bytes > 0:
            group = placed(tp * cp * plan.dp, dp_group)
            kinds = {
                "none": ["allreduce"],
                "zero1": ["reducescatter", "allgather"],
                "zero2": ["reducescatter", "allgather"],
                "fsdp": ["reducescatter", "allgather", "allgather"],
            }[plan.sharding]
            per_stage = (_stage_gradients(arrays, rows, pp, tp0 / tp) if by_stage else None)
            if per_stage is None:
                for kind in kinds:
                    comm_specs.append(CommSpec(kind, "dp", dp_group, grad_bytes / buckets,
                                               buckets, **group))
            else:  # each stage's own gradients, after its own last backward
                for stage, (stage_bytes, stage_buckets) in enumerate(per_stage):
                    for kind in kinds:
                        comm_specs.append(CommSpec(kind, "dp", dp_group,
                                                   stage_bytes / stage_buckets, stage_buckets,
                                                   stage=stage, **group))

    # collectives of the whole job (a global gradient-norm all-reduce): after the pipeline,
    # over every rank of the target
    for k in range(len(kernels)):
        if (roles[k] == "global" and classes[k] in modelled
                and classes[k] in collectives.COLLECTIVE_CLASSES):
            # a tiny all-reduce (a gradient norm) runs NCCL's tree when the trace says so:
            # log2 latency steps, not the ring's 2(p - 1), which at 10^4 ranks is seconds
            comm_specs.append(CommSpec(classes[k], "dp", plan.gpus,
                                       float(np.nan_to_num(nbytes[k])), launches[k],
                                       algorithm=collectives.algorithm_of(kernels[k]),
                                       **placed(plan.gpus, plan.gpus)))
    return comm_specs


def sync_group(plan: ParallelPlan, role: str) -> int:
    """Ranks a synchronisation of ``role`` waits for in ``plan``: its collective's group (tp,
    cp, ep; 2 for pipeline send/recv; dp*cp for data-parallel), one for the step's boundary
    (the host time between steps, measured for the step as a whole), every rank for the step's
    end and for collectives of unknown role."""
    groups = {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "pp": 2 if plan.pp > 1 else 1,
              "dp": plan.dp * plan.cp, "boundary": 1}
    return int(groups.get(role, plan.gpus))


@dataclass(frozen=True)
class CommSpec:
    """One kind of collective traffic of the target plan, before costing."""

    kind: str  # collective class
    where: str  # as CommTerm.where
    size: int  # ranks in the group
    nbytes: float  # bytes per launch
    count: float  # launches per step
    tier: str  # "intra" or "inter"
    nodes: int = 1  # nodes the group spans (the fabric exponent's argument)
    stage: int | None = None  # as CommTerm.stage
    algorithm: str = "ring"


def _comm_term(arrays: PosteriorArrays, spec: CommSpec, per_draw, typical: bool,
               cluster: Cluster | None):
    kind, where, size, nbytes, count = spec.kind, spec.where, spec.size, spec.nbytes, spec.count
    tier, stage = spec.tier, spec.stage
    if not arrays.coll_cost:
        raise InputError(
            Problem(
                "posterior",
                "coll_latency_us",
                "the plan needs the collective cost model, absent from the fit",
            )
        )
    available = {c for (name, c, _) in arrays.coll_cost if name == "coll_latency_us"}
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
    latency = per_draw(arrays.coll_cost[("coll_latency_us", source, tier)])
    bandwidth = per_draw(arrays.coll_cost[("coll_bandwidth_gbps", source, tier)])
    override = cluster.tiers.get(tier, {}) if cluster is not None and cluster.tiers else {}
    if "latency_us" in override:
        latency = np.full_like(latency, float(override["latency_us"]))
    if "bandwidth_gbps" in override:  # the link as stated, at the target's scale
        bandwidth = np.full_like(bandwidth, float(override["bandwidth_gbps"]))
    elif tier == "inter" and arrays.fabric_exponent is not None:
        # rings over more nodes: bus bandwidth times (nodes / 2)^-γ (bayesprism.model.kernel)
        bandwidth = bandwidth * (max(spec.nodes, 2) / 2.0) ** -per_draw(arrays.fabric_exponent)
    rho = per_draw(arrays.small_latency[tier]) if tier in arrays.small_latency else 0.0
    one = collectives.transfer_time_us(kind, size, nbytes, latency, bandwidth, spec.algorithm,
                                       rho)
    draws = one.shape[0]
    extra = None
    if tier == "inter" and arrays.degraded_link is not None and not typical:
        slowed = bandwidth * np.exp(-arrays.degraded_link[1])
        extra = count * (collectives.transfer_time_us(kind, size, nbytes, latency, slowed,
                                                      spec.algorithm, rho) - one)

    def scalar(name: str, key: str) -> np.ndarray:
        values = arrays.coll_spread.get((name, key))
        if typical or values is None:
            return np.zeros(draws)
        return values

    noise = scalar("coll_noise", source)
    launches = max(count, 1.0)
    rel_var = np.expm1(noise**2) / launches
    s2 = np.log1p(rel_var)
    return CommTerm(tier, where, count * one, 0.5 * noise**2 - 0.5 * s2, np.sqrt(s2),
                    scalar("coll_congestion", _congestion_key(arrays.coll_spread, source, tier)),
                    stage, extra)


def _congestion_key(spread: dict, collective: str, tier: str) -> str:
    """Whose fitted congestion scale a collective's transfers in a tier take: their own pair's,
    else the collective's other tier's (as its cost is extrapolated from that tier), else the
    collective's (older posteriors)."""
    for key in (f"{collective}/{tier}", *(f"{collective}/{t}" for t in collectives.TIERS),
                collective):
        if ("coll_congestion", key) in spread:
            return key
    return collective
