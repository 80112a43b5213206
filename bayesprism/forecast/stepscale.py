"""Step-time forecasts at new scales from a step-level posterior (``model_kind == "step"``).

The posterior predictive of :mod:`bayesprism.model.step` at a target plan, vectorised over
posterior draws (NumPy only, no graph is compiled). Per posterior draw, for a plan with m
micro-batches, pp stages, v virtual stages, dp data-parallel ranks and R = world-size ranks:

* ``compute_s = m * c`` with ``c = exp(mb_log_median) * (w / w_ref) ** work_exponent`` the median
  per-micro-batch, per-stage time (``w = micro_batch_size / (tp * pp * cp)``);
* ``bubble_s = bubble_efficiency * (pp − 1) / v * c`` (the interleaved-1F1B bubble);
* ``exposed_comm_s``: the ring all-reduce of the gradients over p = dp * cp ranks,
  ``exp(mb_log_median) * (comm_latency * 2 (p − 1) + comm_tier * 2 (p − 1) / p * B)`` with the
  intra- or inter-node tier (``tp * cp * dp`` against ``plan.gpus_per_node``, default 8) and
  ``B = (tp * pp)_ref / (tp * pp)`` the relative gradient bytes per rank;
* with a stated fabric (``plan.nodes_per_leaf``, or the fitted runs' ``nodes_per_leaf``), a
  gradient group spanning more nodes than one leaf switch holds adds ``comm_leaf`` times the
  inter-node bandwidth factor (fitted, or drawn from its prior when no fitted run stated it);
* the step time ``exp(location + run_effect + noise)`` where ``location`` is the log of the
  structural median ``(compute + bubble) * exp(rank_sigma * E[max of R normals]) + comm``
  (plus a new configuration effect when the model has them, or the fitted one when the plan is
  a measured configuration), ``run_effect ~ N(0, run_sd)`` is drawn once per posterior draw (a
  new run: shared by its replicated steps) and ``noise`` is drawn from the fitted two-component
  mixture: Normal(0, s) with probability 1 − ``slow_weight``, else
  Normal(``slow_shift``, sqrt(s² + ``slow_spread``²)), s the scale the model gives at R ranks and
  ``m + bubble`` slots (finite mean, unlike exp of a Student-t); the spike weight is the fitted
  rate at the plan's node count, ``0.5 * sigmoid(spike_logit + spike_slope * log(nodes /
  reference_nodes))`` (:func:`spike_weight`);
* ``wait_s = step_time_s − compute_s − bubble_s − exposed_comm_s``: waiting for the slowest rank,
  the run's offset and step-to-step noise. It is negative for steps faster than the
  variability-free time (a fast run or a lucky step).

When every fitted run had one micro-batch count and the plan has another, a
:class:`SeparabilityWarning` says that the split of per-micro-batch and per-step cost comes from
the priors (the fit's notes say the same).

``ideal_step_time_s`` is the posterior median of ``compute_s + bubble_s + exposed_comm_s``.
The micro-batch size comes from ``plan.micro_batch_size`` when the plan has one, else the most
common one among the fitted runs.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter

import numpy as np
import xarray as xr
from scipy import special

from bayesprism.costs import step as formulas
from bayesprism.errors import InputError, Problem
from bayesprism.forecast.draws import StepDraws
from bayesprism.posterior import flat_draws, posterior_dataset

PARAMETERS: tuple[str, ...] = (
    "mb_log_median", "work_exponent", "bubble_efficiency", "rank_sigma", "comm_latency",
    "comm_intra", "comm_inter", "run_sd", "slot_noise", "step_noise",
)
#: the slow-step component of the noise mixture (absent when the fit used ``noise = "normal"``)
MIXTURE: tuple[str, ...] = ("slow_weight", "slow_shift", "slow_spread")
#: the spike rate's log-odds (of twice the rate) at the reference nodes and its growth per
#: e-fold of nodes (fits before the rate grew with scale have one scalar ``slow_weight``)
SPIKES: tuple[str, ...] = ("spike_logit", "spike_slope")


class SeparabilityWarning(UserWarning):
    """A forecast at a micro-batch count the fitted runs did not have, when every fitted run had
    the same one: the split of per-micro-batch and per-step cost comes from the priors."""


def spike_weight(ds: xr.Dataset, attrs: dict, nodes: float) -> np.ndarray:
    """Per-draw weight of the slow-step component at ``nodes`` nodes.

    ``0.5 * sigmoid(spike_logit + spike_slope * log(nodes / reference_nodes))``; a posterior
    with one scalar ``slow_weight`` (fits before spikes grew with scale) gives that.

    Parameters
    ----------
    ds
        The posterior dataset.
    attrs
        Its attrs (``reference_nodes``).
    nodes
        Node count of the target plan.

    Returns
    -------
    numpy.ndarray
        One weight per posterior draw (chain x draw flattened).

    Examples
    --------
    >>> ds = xr.Dataset({"spike_logit": (("chain", "draw"), [[0.0]]),
    ...                  "spike_slope": (("chain", "draw"), [[1.0]])})
    >>> float(spike_weight(ds, {"reference_nodes": 4.0}, 4.0)[0])
    0.25
    """
    if all(name in ds for name in SPIKES):
        reference = float(attrs.get("reference_nodes", nodes))
        eta = (flat_draws(ds["spike_logit"])
               + flat_draws(ds["spike_slope"]) * np.log(nodes / reference))
        return 0.5 * special.expit(eta)
    weight = flat_draws(ds["slow_weight"])
    return weight if weight.ndim == 1 else weight.mean(axis=1)


def _positive(plan, name: str, default: int | None = 1) -> int:
    value = getattr(plan, name, None)
    if value is None:
        value = default
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise InputError(Problem("plan", name, "must be a positive integer", example=value))
    return number


def target_layout(plan, posterior_attrs: dict) -> dict:
    """World size, dp, tp, pp, cp, microbatches, virtual_stages, micro_batch_size of a plan."""
    layout = {name: _positive(plan, name) for name in ("dp", "tp", "pp", "cp", "microbatches",
                                                        "virtual_stages")}
    layout["gpus_per_node"] = _positive(plan, "gpus_per_node", 8)
    world = getattr(plan, "world_size", None) or getattr(plan, "gpus", None)
    layout["world_size"] = int(world) if world else (layout["dp"] * layout["tp"] * layout["pp"]
                                                     * layout["cp"])
    mbs = getattr(plan, "micro_batch_size", None)
    if mbs is None:
        fitted = json.loads(posterior_attrs.get("run_layouts", "{}") or "{}")
        sizes = Counter(float(v["micro_batch_size"]) for v in fitted.values())
        mbs = sizes.most_common(1)[0][0] if sizes else 1.0
    layout["micro_batch_size"] = float(mbs)
    return layout


def _posterior_parts(posterior) -> tuple[xr.Dataset, dict]:
    ds = posterior_dataset(posterior)
    attrs = dict(ds.attrs)
    kind = attrs.get("model_kind")
    if kind is not None and kind != "step":
        raise InputError(Problem("posterior", "model_kind",
                                 "compose_steps needs a step-level posterior", example=kind))
    missing = [p for p in PARAMETERS if p not in ds]
    if missing:
        raise InputError(Problem("posterior", ", ".join(missing),
                                 "missing from the posterior: not a step-model fit"))
    return ds, attrs


def _stratified(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Uniforms in (0, 1), one stratum of width 1 / n per replicate of each row, shuffled.

    Element (i, j) is ``(perm_i[j] + U_ij) / n``: marginally uniform, and each row covers every
    stratum once.

    Examples
    --------
    >>> u = _stratified(np.random.default_rng(0), (2, 4))
    >>> sorted(np.floor(u[0] * 4).astype(int).tolist())
    [0, 1, 2, 3]
    """
    n = shape[1]
    strata = rng.permuted(np.broadcast_to(np.arange(n), shape), axis=1)
    return (strata + rng.uniform(1e-12, 1.0, size=shape)) / n


def _leaf_cost(ds: xr.Dataset, attrs: dict, plan, layout: dict, terms: dict,
               rng: np.random.Generator) -> np.ndarray | float:
    """Extra all-reduce cost (reference slots) of a gradient group that crosses leaf switches.

    ``nodes_per_leaf`` comes from the plan (``plan.nodes_per_leaf``), else from the fitted runs'
    stated fact (``attrs["nodes_per_leaf"]``, one value); without it there is no leaf tier (0).
    The cost ``comm_leaf`` is the fitted one, or drawn from its prior
    (:data:`bayesprism.costs.step.LEAF_PRIOR`) when the fit had no such fact: a user who knows
    the fabric can state it at forecast time.
    """
    per_leaf = getattr(plan, "nodes_per_leaf", None)
    if per_leaf is None:
        fitted = json.loads(attrs.get("nodes_per_leaf", "null") or "null") or []
        per_leaf = fitted[0] if len(fitted) == 1 else None
    if per_leaf is None:
        return 0.0
    valid = isinstance(per_leaf, (int, float, np.integer)) and not isinstance(per_leaf, bool) \
        and math.isfinite(per_leaf) and per_leaf >= 1 and int(per_leaf) == per_leaf
    if not valid:
        raise InputError(Problem("plan", "nodes_per_leaf", "must be a positive integer",
                                 example=per_leaf))
    group_nodes = math.ceil(layout["tp"] * layout["cp"] * layout["dp"] / layout["gpus_per_node"])
    if group_nodes <= per_leaf:
        return 0.0
    n_draws = flat_draws(ds["mb_log_median"]).shape[0]
    if "comm_leaf" in ds:
        cost = flat_draws(ds["comm_leaf"])
    else:
        mu, sigma = formulas.LEAF_PRIOR
        cost = np.exp(mu + sigma * rng.standard_normal(n_draws))
    return cost * float(terms["inter_bandwidth"])


def compose_steps(posterior, plan, *, replicates: int = 8,
                  rng: np.random.Generator | None = None) -> StepDraws:
    """Posterior predictive step-time draws of a step-level posterior at a target plan.

    Parameters
    ----------
    posterior
        A step-model fit (DataTree from ``bayesprism.fit``, or its ``posterior`` Dataset with
        the model attrs).
    plan
        Target layout (``bayesprism.plan.ParallelPlan`` or any object with ``dp``, ``tp``,
        ``pp``, ``cp``, ``microbatches`` and optionally ``virtual_stages``,
        ``micro_batch_size``, ``world_size``).
    replicates
        Simulated steps per posterior draw (all from the same new run).
    rng
        Random generator (default ``numpy.random.default_rng(0)``).

    Returns
    -------
    StepDraws
        Arrays of shape (draw, replicate), seconds; breakdown as in the module docstring.
    """
    if isinstance(replicates, bool) or int(replicates) != replicates or replicates < 1:
        raise InputError(Problem("arguments", "replicates", "must be a positive integer",
                                 example=replicates))
    rng = np.random.default_rng(0) if rng is None else rng
    ds, attrs = _posterior_parts(posterior)
    layout = target_layout(plan, attrs)
    fitted_mb = json.loads(attrs.get("fitted_microbatches", "[]") or "[]")
    if len(fitted_mb) == 1 and layout["microbatches"] != fitted_mb[0]:
        note = formulas.separability_note(fitted_mb[0])
        warnings.warn(f"forecast at {layout['microbatches']} micro-batch(es): {note}",
                      SeparabilityWarning, stacklevel=2)
    p = {name: flat_draws(ds[name]) for name in PARAMETERS}
    n_draws = p["mb_log_median"].shape[0]
    if "reference_work" not in attrs:
        raise InputError(Problem("posterior", "attrs.reference_work",
                                 "is missing: not a step-model fit by bayesprism.fit"))
    reference_work = float(attrs["reference_work"])
    work = layout["micro_batch_size"] / (layout["tp"] * layout["pp"] * layout["cp"])
    emax, smax = (float(v) for v in formulas.max_normal_moments(layout["world_size"]))

    slot = np.exp(p["mb_log_median"] + p["work_exponent"] * np.log(work / reference_work))
    bubble_slots = p["bubble_efficiency"] * formulas.schedule_bubble_slots(
        layout["pp"], layout["virtual_stages"])
    slots = layout["microbatches"] + bubble_slots
    compute = layout["microbatches"] * slot
    bubble = bubble_slots * slot
    terms = formulas.comm_terms(layout["dp"] * layout["cp"], layout["tp"], layout["pp"],
                                layout["tp"] * layout["cp"] * layout["dp"],
                                layout["gpus_per_node"],
                                float(attrs.get("reference_tp_pp", layout["tp"] * layout["pp"])))
    comm = np.exp(p["mb_log_median"]) * (p["comm_latency"] * terms["latency_steps"]
                                         + p["comm_intra"] * terms["intra_bandwidth"]
                                         + p["comm_inter"] * terms["inter_bandwidth"])
    comm = comm + _leaf_cost(ds, attrs, plan, layout, terms, rng) * np.exp(p["mb_log_median"])
    location = np.log((compute + bubble) * np.exp(p["rank_sigma"] * emax) + comm)
    if "config_sd" in ds:
        label = formulas.config_label(layout)
        configs = [str(c) for c in ds["config"].to_numpy()] if "config" in ds.coords else []
        if label in configs and "config_log_median" in ds:
            location = flat_draws(ds["config_log_median"])[:, configs.index(label)]
        else:
            location = location + flat_draws(ds["config_sd"]) * rng.standard_normal(n_draws)
    run_effect = p["run_sd"] * rng.standard_normal(n_draws)
    noise_sd = np.sqrt((p["rank_sigma"] ** 2 * smax**2 + p["slot_noise"] ** 2) / slots
                       + p["step_noise"] ** 2)
    shape = (n_draws, replicates)
    # step-to-step noise from stratified uniforms (each draw's replicates cover the quantiles
    # evenly, every value is still marginally exact): a draw's mean over its replicates then
    # carries almost no Monte Carlo noise, so ``ci90`` (spread of those means) shows the
    # uncertainty of the level (new layout, new run, parameters) on its own
    log_step = (location + run_effect)[:, None] + noise_sd[:, None] * special.ndtri(
        _stratified(rng, shape))
    if all(name in ds for name in MIXTURE):
        nodes = max(math.ceil(layout["world_size"] / layout["gpus_per_node"]), 1)
        weight = spike_weight(ds, attrs, float(nodes))[:, None]
        shift, spread = (flat_draws(ds[name])[:, None] for name in MIXTURE[1:])
        slow = _stratified(rng, shape) < weight
        # the slow component: shifted by slow_shift, spread sqrt(noise_sd^2 + slow_spread^2)
        extra = shift + spread * rng.standard_normal(shape)
        log_step = log_step + np.where(slow, extra, 0.0)
    step = np.exp(log_step)

    compute_s = np.broadcast_to(compute[:, None], shape).copy()
    bubble_s = np.broadcast_to(bubble[:, None], shape).copy()
    comm_s = np.broadcast_to(comm[:, None], shape).copy()
    return StepDraws(
        step_time_s=step,
        compute_s=compute_s,
        exposed_comm_s=comm_s,
        bubble_s=bubble_s,
        wait_s=step - compute_s - bubble_s - comm_s,
        ideal_step_time_s=float(np.median(compute + bubble + comm)),
    )
