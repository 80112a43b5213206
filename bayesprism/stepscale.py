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
* the step time ``exp(location + run_effect + noise)`` where ``location`` is the log of the
  structural median ``(compute + bubble) * exp(rank_sigma * E[max of R normals]) + comm``
  (plus a new configuration effect when the model has them, or the fitted one when the plan is
  a measured configuration), ``run_effect ~ N(0, run_sd)`` is drawn once per posterior draw (a
  new run: shared by its replicated steps) and ``noise`` is drawn from the fitted two-component
  mixture: Normal(0, s) with probability 1 − ``slow_weight``, else
  Normal(``slow_shift``, sqrt(s² + ``slow_spread``²)), s the scale the model gives at R ranks and
  ``m + bubble`` slots (finite mean, unlike exp of a Student-t);
* ``wait_s = step_time_s − compute_s − bubble_s − exposed_comm_s``: waiting for the slowest rank,
  the run's offset and step-to-step noise. It is negative for steps faster than the
  variability-free time (a fast run or a lucky step).

``ideal_step_time_s`` is the posterior median of ``compute_s + bubble_s + exposed_comm_s``.
The micro-batch size comes from ``plan.micro_batch_size`` when the plan has one, else the most
common one among the fitted runs.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import xarray as xr

from bayesprism.draws import StepDraws
from bayesprism.errors import InputError, Problem

PARAMETERS: tuple[str, ...] = (
    "mb_log_median", "work_exponent", "bubble_efficiency", "rank_sigma", "comm_latency",
    "comm_intra", "comm_inter", "run_sd", "slot_noise", "step_noise",
)
#: the slow-step component of the noise mixture (absent when the fit used ``noise = "normal"``)
MIXTURE: tuple[str, ...] = ("slow_weight", "slow_shift", "slow_spread")


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
    if isinstance(posterior, xr.DataTree):
        ds = posterior["posterior"].to_dataset() if "posterior" in posterior.children \
            else posterior.to_dataset()
        attrs = {**dict(posterior.attrs), **dict(ds.attrs)}
    elif isinstance(posterior, xr.Dataset):
        ds, attrs = posterior, dict(posterior.attrs)
    else:
        raise TypeError(f"expected a DataTree or Dataset, got {type(posterior).__name__}")
    kind = attrs.get("model_kind")
    if kind is not None and kind != "step":
        raise InputError(Problem("posterior", "model_kind",
                                 "compose_steps needs a step-level posterior", example=kind))
    missing = [p for p in PARAMETERS if p not in ds]
    if missing:
        raise InputError(Problem("posterior", ", ".join(missing),
                                 "missing from the posterior: not a step-model fit"))
    return ds, attrs


def _flat(ds: xr.Dataset, name: str) -> np.ndarray:
    var = ds[name]
    extra = [d for d in var.dims if d not in ("chain", "draw")]
    return var.transpose("chain", "draw", *extra).to_numpy().reshape(
        (-1, *var.shape[2:])).astype(float)


def _config_label(layout: dict) -> str:
    from bayesprism.model.step import config_label

    return config_label(layout)


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
    from bayesprism.model.step import comm_terms, max_normal_moments, schedule_bubble_slots

    if isinstance(replicates, bool) or int(replicates) != replicates or replicates < 1:
        raise InputError(Problem("arguments", "replicates", "must be a positive integer",
                                 example=replicates))
    rng = np.random.default_rng(0) if rng is None else rng
    ds, attrs = _posterior_parts(posterior)
    layout = target_layout(plan, attrs)
    p = {name: _flat(ds, name) for name in PARAMETERS}
    n_draws = p["mb_log_median"].shape[0]
    if "reference_work" not in attrs:
        raise InputError(Problem("posterior", "attrs.reference_work",
                                 "is missing: not a step-model fit by bayesprism.fit"))
    reference_work = float(attrs["reference_work"])
    work = layout["micro_batch_size"] / (layout["tp"] * layout["pp"] * layout["cp"])
    emax, smax = (float(v) for v in max_normal_moments(layout["world_size"]))

    slot = np.exp(p["mb_log_median"] + p["work_exponent"] * np.log(work / reference_work))
    bubble_slots = p["bubble_efficiency"] * schedule_bubble_slots(layout["pp"],
                                                                  layout["virtual_stages"])
    slots = layout["microbatches"] + bubble_slots
    compute = layout["microbatches"] * slot
    bubble = bubble_slots * slot
    terms = comm_terms(layout["dp"] * layout["cp"], layout["tp"], layout["pp"],
                       layout["tp"] * layout["cp"] * layout["dp"], layout["gpus_per_node"],
                       float(attrs.get("reference_tp_pp", layout["tp"] * layout["pp"])))
    comm = np.exp(p["mb_log_median"]) * (p["comm_latency"] * terms["latency_steps"]
                                         + p["comm_intra"] * terms["intra_bandwidth"]
                                         + p["comm_inter"] * terms["inter_bandwidth"])
    location = np.log((compute + bubble) * np.exp(p["rank_sigma"] * emax) + comm)
    if "config_sd" in ds:
        label = _config_label(layout)
        configs = [str(c) for c in ds["config"].to_numpy()] if "config" in ds.coords else []
        if label in configs and "config_log_median" in ds:
            location = _flat(ds, "config_log_median")[:, configs.index(label)]
        else:
            location = location + _flat(ds, "config_sd") * rng.standard_normal(n_draws)
    run_effect = p["run_sd"] * rng.standard_normal(n_draws)
    noise_sd = np.sqrt((p["rank_sigma"] ** 2 * smax**2 + p["slot_noise"] ** 2) / slots
                       + p["step_noise"] ** 2)
    shape = (n_draws, replicates)
    log_step = (location + run_effect)[:, None] + noise_sd[:, None] * rng.standard_normal(shape)
    if all(name in ds for name in MIXTURE):
        weight, shift, spread = (_flat(ds, name)[:, None] for name in MIXTURE)
        slow = rng.random(shape) < weight
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
