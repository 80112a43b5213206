"""Forecasts: step-time and training-time draws of parallel plans, and their summaries.

:func:`forecast` composes every plan (``bayesprism.composition.compose``, or
``bayesprism.stepscale.compose_steps`` for step-level posteriors) on the same thinned posterior
draws with the same seed (common random numbers, so plans are compared on equal footing) and
returns an ``xarray.DataTree`` laid out as in the "Forecast" section of ``docs/artifacts.md``.

Definitions (used by the report and the CLI):

* ``step_time_s`` quantiles (``mean``, ``p05`` ... ``p99``) are of the **posterior predictive
  distribution of a single step**: all draws x replicates pooled, i.e. step-to-step variability
  and parameter uncertainty together.
* ``ci90`` is the 90% credible interval of the **mean step time** (parameter uncertainty only):
  the 5% and 95% quantiles over posterior draws of each draw's mean over its replicates.
* ``ideal_step_time_s`` is the plan's variability-free step: every kernel at its typical
  duration (``exp(kernel_log_median)`` at the posterior median, times the mean of its
  launch-to-launch noise, as a step sums many launches), collectives at the median cost model,
  no node/GPU/step variability and no waiting (the schedule's structural bubble and every
  rank's mean host idle are included).
* ``slowdown_probability[x]`` = P(step > x * baseline), baseline = ideal step unless the user
  gives ``baseline_s``.
* ``training_time_s`` is the sum of ``steps`` step times of one run on one fixed cluster: one
  posterior draw, whose node and GPU effects persist over the run while step-level effects,
  congestion, transients and host idle vary from step to step (the spread between clusters is
  not averaged away by the number of steps). Up to :data:`SIMULATED_STEPS_MAX` steps it is
  simulated by summing ``steps`` steps resampled from that draw's replicates; beyond, it is
  normal with the draw's mean and variance (``steps * mean``, ``steps * var``; the central
  limit theorem, steps independent given the draw).
  ``finish_probability[T]`` = P(training time <= T).
* ``degraded_link_probability`` is P(the plan's nodes include one with a degraded inter-node
  link), averaged over posterior draws (``bayesprism.composition``); the step-time draws include
  those clusters. Absent for step-level posteriors.
* ``extrapolated`` lists what of the plan is scaled or costed by formula rather than replayed
  from the traced run (``bayesprism.forecast.workload.extrapolation_notes``): a new tensor- or
  pipeline-parallel degree, micro-batch count, schedule or sharding, and collectives over
  groups the traces did not have. Empty at the traced layout, and for step-level posteriors.
* ``breakdown_s`` holds the means of ``compute_s``, ``exposed_comm_s``, ``bubble_s`` and
  ``wait_s``, which add up to the step time draw by draw (see ``bayesprism.composition``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import xarray as xr

from bayesprism._version import __version__
from bayesprism.errors import InputError, Problem
from bayesprism.forecast.composition import compose
from bayesprism.forecast.draws import StepDraws
from bayesprism.forecast.slots import composition_path
from bayesprism.forecast.workload import posterior_arrays
from bayesprism.inventory import traced_step_times_us
from bayesprism.io import ARTIFACT_SCHEMA_VERSION
from bayesprism.plan import Cluster, ParallelPlan
from bayesprism.posterior import thin_draws

#: Training runs up to this many steps are simulated step by step; longer ones use a normal sum.
SIMULATED_STEPS_MAX = 256
QUANTILES = {"p05": 0.05, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p95": 0.95, "p99": 0.99}
COMPONENTS = ("compute_s", "exposed_comm_s", "bubble_s", "wait_s")
PLAN_COORDS = ("gpus", "dp", "tp", "pp", "cp", "ep", "microbatches", "virtual_stages",
               "schedule", "sharding", "overlap", "gpus_per_node")


def _as_plans(plans) -> list[ParallelPlan]:
    if isinstance(plans, ParallelPlan):
        return [plans]
    plans = list(plans)
    if not plans:
        raise InputError(Problem("arguments", "plans", "at least one plan is needed"))
    bad = [p for p in plans if not isinstance(p, ParallelPlan)]
    if bad:
        raise InputError(Problem("arguments", "plans", "must be ParallelPlan objects",
                                 len(bad), type(bad[0]).__name__))
    return plans


#: Plan fields the step-level model has no term for, with their neutral values: a step-level
#: posterior forecasting a plan that sets one would ignore it without a word.
STEP_MODEL_IGNORES: dict[str, object] = {
    "ep": 1, "sharding": "none", "overlap": 0.0, "activation_bytes": None,
    "gradient_bytes": None,
}


def check_plans_for_model(posterior: xr.DataTree, plans: Sequence[ParallelPlan],
                          cluster: Cluster | None = None) -> None:
    """Refuse plans (and a cluster) the posterior's kind of model cannot forecast.

    A step-level posterior (MLPerf-style step-time logs) knows the data-, tensor- and
    pipeline-parallel sizes, micro-batches and interleaving of its runs, nothing of expert
    parallelism, sharding, overlap, message sizes, link tiers or measured nodes: a plan or
    cluster that sets those asks a kernel-level question.

    Parameters
    ----------
    posterior
        The fit.
    plans
        The plans to forecast.
    cluster
        The cluster, if any.

    Raises
    ------
    InputError
        One problem per plan field (or cluster field) the model cannot use, naming the plan,
        the field and its value.
    """
    if posterior.attrs.get("model_kind") != "step":
        return
    problems = []
    for plan in plans:
        for name, neutral in STEP_MODEL_IGNORES.items():
            value = getattr(plan, name)
            if value != neutral:
                problems.append(Problem(
                    f"{plan.source} {plan.name!r}", name,
                    "a step-level posterior cannot forecast it (the step model has no term for "
                    "it; fit a kernel-level model on traces for this plan)", example=value))
    if cluster is not None:
        for name in ("tiers", "nodes"):
            if getattr(cluster, name):
                problems.append(Problem(cluster.source, name, "a step-level posterior cannot "
                                        "use it (it knows no link tiers or measured nodes)"))
    if problems:
        raise InputError(problems)


def _unique_names(plans: list[ParallelPlan]) -> list[str]:
    names, seen = [], {}
    for plan in plans:
        name = str(plan.name)
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return names


def _per_plan(value, n: int, field: str) -> list:
    if value is None or np.isscalar(value):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise InputError(Problem("arguments", field, f"needs one value per plan ({n})",
                                 example=len(values)))
    return values


def training_time_draws(
    step_time_s: np.ndarray, steps: int, rng: np.random.Generator
) -> np.ndarray:
    """Training time (s) of ``steps`` steps, shape (draw, replicate), from step draws of a plan.

    Each row is one run on one posterior draw: up to :data:`SIMULATED_STEPS_MAX` steps, the
    sum of ``steps`` steps resampled from the row; beyond, a normal with the row's mean and
    variance times ``steps``.
    """
    draws, replicates = step_time_s.shape
    if steps <= SIMULATED_STEPS_MAX:
        index = rng.integers(0, replicates, size=(draws, replicates, steps))
        return step_time_s[np.arange(draws)[:, None, None], index].sum(axis=-1)
    mean = step_time_s.mean(axis=1, keepdims=True)
    sd = step_time_s.std(axis=1, ddof=1, keepdims=True) if replicates > 1 else 0.0 * mean
    z = rng.standard_normal((draws, replicates))
    return steps * mean + np.sqrt(steps) * sd * z


def forecast(
    posterior: xr.DataTree,
    plans: ParallelPlan | Sequence[ParallelPlan],
    *,
    steps: int | None = None,
    draws: int | None = 1000,
    replicates: int = 8,
    random_seed: int = 0,
    baseline_s: float | Sequence[float] | None = None,
    deadlines_s: Sequence[float] | None = None,
    thresholds: Sequence[float] = (1.05, 1.10, 1.20),
    progress: bool = True,
    cluster: Cluster | None = None,
    exact: bool | None = None,
) -> xr.DataTree:
    """Posterior predictive step-time (and training-time) forecasts of parallel plans.

    Parameters
    ----------
    posterior
        A fit (``docs/artifacts.md``), kernel-level or step-level.
    plans
        One plan or several.
    steps
        Training steps; defaults to each plan's ``steps`` (no training time when neither).
    draws
        Posterior draws used (evenly thinned); ``None`` for all.
    replicates
        Simulated steps per posterior draw.
    random_seed
        Seed; every plan is composed with a generator seeded by it (common random numbers).
    baseline_s
        Step time the slowdown is measured against (one value or one per plan); the plan's
        ideal step time by default.
    deadlines_s
        Training-time budgets T for ``finish_probability`` (needs ``steps``).
    thresholds
        Slowdown factors x of ``slowdown_probability`` = P(step > x * baseline).
    progress
        Show a progress bar over plans.
    cluster
        Passed to the composition (GPUs per node, tiers, measured nodes).
    exact
        Exact or fast composition path; by scale when ``None``.

    Returns
    -------
    xarray.DataTree
        Root dataset with dims ``plan``, ``draw``, ``replicate`` (and ``threshold``,
        ``deadline``); plan fields are coordinates on ``plan``.

    Examples
    --------
    A step-level fit whose parameters are the same in every draw stands in for one of
    ``bayesprism.fit`` (which takes minutes; a real fit is read with ``bayesprism.load``):

    >>> import numpy as np
    >>> import xarray as xr
    >>> from bayesprism.forecast.stepscale import PARAMETERS
    >>> from bayesprism.plan import ParallelPlan
    >>> values = (-3.0, 1.0, 1.0, 0.01, 1e-4, 0.02, 0.1, 0.003, 0.01, 0.005)
    >>> posterior = xr.Dataset({k: (("chain", "draw"), np.full((2, 50), v))
    ...                         for k, v in zip(PARAMETERS, values, strict=True)},
    ...                        attrs={"model_kind": "step", "reference_work": 1.0,
    ...                               "fitted_microbatches": "[4]"})
    >>> fit = xr.DataTree.from_dict({"posterior": posterior})
    >>> fit.attrs["model_kind"] = "step"
    >>> plans = [ParallelPlan(name="dp8", dp=8, microbatches=4),
    ...          ParallelPlan(name="dp64", dp=64, microbatches=4)]
    >>> fc = forecast(fit, plans, steps=1000, draws=20, progress=False)
    >>> dict(fc["step_time_s"].sizes)
    {'plan': 2, 'draw': 20, 'replicate': 8}
    >>> [round(float(x), 3) for x in fc["ideal_step_time_s"]]
    [0.201, 0.21]
    """
    plans = _as_plans(plans)
    if not (isinstance(replicates, int) and replicates >= 1):
        raise InputError(Problem("arguments", "replicates", "must be a positive integer",
                                 example=replicates))
    thresholds = [float(x) for x in thresholds]
    deadlines = [float(x) for x in (deadlines_s or [])]
    plan_steps = [steps if steps is not None else p.steps for p in plans]
    if deadlines and any(s is None for s in plan_steps):
        raise InputError(Problem("arguments", "deadlines_s", "finish probabilities need steps"))
    baselines = _per_plan(baseline_s, len(plans), "baseline_s")
    check_plans_for_model(posterior, plans, cluster)
    thinned = thin_draws(posterior, draws)

    iterator = plans
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(plans, desc="forecast", unit="plan")
    results: list[StepDraws] = []
    paths: list[str] = []
    step_model = thinned.attrs.get("model_kind") == "step"
    # kernel-level: computed once for every plan
    per_forecast = {} if step_model else {"arrays": posterior_arrays(thinned),
                                          "idle_quantiles": {}}
    for plan in iterator:
        rng = np.random.default_rng(random_seed)
        results.append(compose(thinned, plan, replicates=replicates, rng=rng, cluster=cluster,
                               exact=exact, **per_forecast))
        paths.append("step-model" if step_model else composition_path(plan, cluster, exact))

    names = _unique_names(plans)
    dims = ("plan", "draw", "replicate")
    data = {name: (dims, np.stack([getattr(r, name) for r in results])) for name in
            ("step_time_s", *COMPONENTS)}
    ideal = np.array([r.ideal_step_time_s for r in results])
    data["ideal_step_time_s"] = ("plan", ideal)
    data["degraded_link_probability"] = ("plan", np.array(
        [r.degraded_link_probability for r in results]))
    data["extrapolated"] = ("plan", np.array([json.dumps(list(r.extrapolated))
                                              for r in results], dtype=str))
    base = np.array([ideal[i] if b is None else float(b) for i, b in enumerate(baselines)])
    data["baseline_step_time_s"] = ("plan", base)
    step = data["step_time_s"][1]
    exceed = [(step > x * base[:, None, None]).mean(axis=(1, 2)) for x in thresholds]
    data["slowdown_probability"] = (("plan", "threshold"), np.stack(exceed, axis=-1))
    if all(s is not None for s in plan_steps):
        rng = np.random.default_rng([random_seed, 1])
        training = np.stack([training_time_draws(r.step_time_s, int(s), rng)
                             for r, s in zip(results, plan_steps, strict=True)])
        data["training_time_s"] = (dims, training)
        data["steps"] = ("plan", np.array(plan_steps, dtype=np.int64))
        if deadlines:
            finish = [(training <= t).mean(axis=(1, 2)) for t in deadlines]
            data["finish_probability"] = (("plan", "deadline"), np.stack(finish, axis=-1))
    coords = {
        "plan": names,
        "draw": np.arange(step.shape[1]),
        "replicate": np.arange(step.shape[2]),
        "threshold": thresholds,
        "path": ("plan", paths),
    }
    for key in PLAN_COORDS:
        coords[key] = ("plan", [getattr(p, key) for p in plans])
    if deadlines:
        coords["deadline"] = deadlines
    attrs = {
        "bayesprism_version": _version(),
        "schema_version": ARTIFACT_SCHEMA_VERSION,
        "artifact": "forecast",
        "random_seed": int(random_seed),
        "replicates": int(replicates),
        "draws": int(step.shape[1]),
        "posterior_input_digest": str(posterior.attrs.get("input_digest", "")),
        "posterior_spec_hash": str(posterior.attrs.get("spec_hash", "")),
        "model_kind": str(posterior.attrs.get("model_kind", "kernel")),
        "baseline": "ideal" if baseline_s is None else "user",
        # degraded links learned from several allocations' transfers, or their priors only
        "degraded_link": ("fitted" if "coll_degraded_rate" in posterior["posterior"]
                          else "prior"),
    }
    return xr.DataTree(xr.Dataset(data, coords=coords, attrs=attrs))


def degraded_link_note(plans: Sequence[dict]) -> str | None:
    """One line on the chance of a degraded inter-node link in the summarised plans.

    It names the plans at 1 % or more (their step times include those clusters) and whether
    the chance was learned; None when no plan has one.

    Examples
    --------
    >>> degraded_link_note([{"name": "dp8", "degraded_link_probability": 0.06,
    ...                      "degraded_link": "fitted"}])
    'P(a node with a degraded link), included above (fitted): dp8 0.06'
    """
    links = [p for p in plans if p.get("degraded_link_probability", 0.0) >= 0.01]
    if not links:
        return None
    source = ("fitted" if all(p.get("degraded_link") == "fitted" for p in links) else
              "from the prior: fit nccl-tests sweeps of several allocations to learn it")
    return (f"P(a node with a degraded link), included above ({source}): "
            + ", ".join(f"{p['name']} {p['degraded_link_probability']:.2f}" for p in links))


def _extrapolated(text: str, plan: str) -> list[str]:
    """A plan's ``extrapolated`` variable (a JSON list of sentences), checked."""
    try:
        notes = json.loads(text)
    except json.JSONDecodeError:
        notes = None
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise InputError(Problem("forecast", "extrapolated",
                                 f"plan {plan!r}: not a JSON list of strings", example=text[:80]))
    return notes


def traced_step_time_s(posterior: xr.DataTree, *, source: str = "posterior") -> float:
    """The measured step time of the traced run (s): the baseline ``traced`` of the CLI.

    Kernel-level fits: the median over traced steps of one step's start to the next's
    (``inventory.traced_step_span_us``, first kernel start of any rank to the last kernel end,
    plus the host time at the step's boundary;
    :func:`bayesprism.inventory.traced_step_times_us`). Step-level fits: the median logged step
    time, when every fitted run has one layout (several layouts have no single traced step).

    Parameters
    ----------
    posterior
        A fit (``docs/artifacts.md``).
    source
        Where the posterior came from, for the error message.

    Raises
    ------
    InputError
        The posterior records no measured step (traces without start times), or several
        layouts (step-level fits of a ladder of scales).

    Examples
    --------
    >>> import xarray as xr
    >>> inv = xr.Dataset({"traced_step_span_us": ("step_unit", [19000.0, 21000.0, 20000.0])})
    >>> traced_step_time_s(xr.DataTree.from_dict({"inventory": inv}))
    0.02
    """
    inventory = posterior["inventory"].to_dataset() if "inventory" in posterior.children else None
    values = np.array([])
    if inventory is not None and "traced_step_span_us" in inventory:
        values = traced_step_times_us(inventory) / 1e6
    elif inventory is not None and "step_time_s" in inventory:
        layouts = {tuple(int(inventory[f].values[i]) for f in ("dp", "tp", "pp", "cp")
                         if f in inventory) for i in range(inventory.sizes.get("run", 0))}
        if len(layouts) > 1:
            raise InputError(Problem(source, "baseline", "the fit holds runs at several "
                                     "layouts, so there is no single traced step; give a step "
                                     "time (e.g. 2.5s)", count=len(layouts)))
        values = inventory["step_time_s"].to_numpy().astype(float).reshape(-1)
    values = values[np.isfinite(values) & (values > 0)]
    if values.size == 0:
        raise InputError(Problem(source, "baseline", "the posterior records no measured step "
                                 "time (traces without start times); give a step time or "
                                 "'ideal'", example="traced"))
    return float(np.median(values))


def _version() -> str:

    return __version__


def _quantiles(values: np.ndarray) -> dict:
    out = {"mean": float(values.mean())}
    qs = np.quantile(values.reshape(-1), list(QUANTILES.values()))
    out.update({k: float(v) for k, v in zip(QUANTILES, qs, strict=True)})
    row_means = values.mean(axis=-1)
    out["ci90"] = [float(x) for x in np.quantile(row_means, [0.05, 0.95])]
    return out


def threshold_key(x: float) -> str:
    """The JSON key of a slowdown threshold: two decimals unless more are needed.

    Examples
    --------
    >>> threshold_key(1.05), threshold_key(1.1), threshold_key(1.125)
    ('1.05', '1.10', '1.125')
    """
    return f"{x:.2f}" if abs(x * 100 - round(x * 100)) < 1e-9 else f"{x:g}"


def summarize_forecast(forecast_dt: xr.DataTree, *, include_draws: bool = False) -> dict:
    """The forecast as plain JSON-able numbers (the report and the CLI both print this).

    Returns ``{"plans": [{"name", "gpus", "dp", "tp", "pp", "cp", "ep", "microbatches",
    "schedule", "step_time_s": {"mean", "p05", "p25", "p50", "p75", "p95", "p99", "ci90"},
    "ideal_step_time_s", "slowdown_probability": {"1.05": p, ...}, "breakdown_s": {"compute",
    "exposed_comm", "bubble", "wait"}, "training_time_s": {...} (with steps),
    "finish_probability": {T: p} (with deadlines), "baseline_step_time_s" (the step P(slowdown)
    is measured against), "draws_s": [...] (include_draws)}]}``.

    Examples
    --------
    On a forecast of a step-level fit with fixed parameters (as in :func:`forecast`):

    >>> import numpy as np
    >>> import xarray as xr
    >>> from bayesprism.forecast.stepscale import PARAMETERS
    >>> from bayesprism.plan import ParallelPlan
    >>> fixed = dict(zip(PARAMETERS, (-3.0, 1.0, 1.0, 0.01, 1e-4, 0.02, 0.1, 0.003, 0.01, 0.005)))
    >>> fit = xr.DataTree.from_dict({"posterior": xr.Dataset(
    ...     {k: (("chain", "draw"), np.full((1, 10), v)) for k, v in fixed.items()},
    ...     attrs={"model_kind": "step", "reference_work": 1.0, "fitted_microbatches": "[4]"})})
    >>> fit.attrs["model_kind"] = "step"
    >>> fc = forecast(fit, ParallelPlan(name="dp64", dp=64, microbatches=4), steps=1000,
    ...               deadlines_s=[200.0, 250.0], progress=False)
    >>> plan = summarize_forecast(fc)["plans"][0]
    >>> plan["name"], plan["gpus"], round(plan["step_time_s"]["p50"], 2)
    ('dp64', 64, 0.21)
    >>> plan["slowdown_probability"], plan["finish_probability"]
    ({'1.05': 0.0, '1.10': 0.0, '1.20': 0.0}, {'200': 0.0, '250': 1.0})
    """
    ds = forecast_dt.to_dataset() if isinstance(forecast_dt, xr.DataTree) else forecast_dt
    plans = []
    for i, name in enumerate(ds["plan"].to_numpy()):
        one = ds.isel(plan=i)
        entry = {"name": str(name)}
        for key in ("gpus", "dp", "tp", "pp", "cp", "ep", "microbatches"):
            entry[key] = int(one[key])
        entry["schedule"] = str(one["schedule"].item())
        step = one["step_time_s"].transpose("draw", "replicate").to_numpy()
        entry["step_time_s"] = _quantiles(step)
        entry["ideal_step_time_s"] = float(one["ideal_step_time_s"])
        if "baseline_step_time_s" in one:
            entry["baseline_step_time_s"] = float(one["baseline_step_time_s"])
        if np.isfinite(one.get("degraded_link_probability", np.nan)):
            entry["degraded_link_probability"] = float(one["degraded_link_probability"])
            entry["degraded_link"] = str(ds.attrs.get("degraded_link", "prior"))
        if "extrapolated" in one:
            entry["extrapolated"] = _extrapolated(str(one["extrapolated"].item()), str(name))
        entry["slowdown_probability"] = {
            threshold_key(float(x)): float(p)
            for x, p in zip(ds["threshold"].to_numpy(), one["slowdown_probability"].to_numpy(),
                            strict=True)
        }
        entry["breakdown_s"] = {key.removesuffix("_s"): float(one[key].mean())
                                for key in COMPONENTS}
        if "training_time_s" in ds:
            entry["training_time_s"] = _quantiles(
                one["training_time_s"].transpose("draw", "replicate").to_numpy())
            entry["steps"] = int(one["steps"])
        if "finish_probability" in ds:
            entry["finish_probability"] = {
                f"{float(t):g}": float(p)
                for t, p in zip(ds["deadline"].to_numpy(), one["finish_probability"].to_numpy(),
                                strict=True)
            }
        if include_draws:
            entry["draws_s"] = [float(x) for x in step.reshape(-1)]
        plans.append(entry)
    return {"plans": plans}
