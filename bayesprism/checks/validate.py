"""Held-out validation: split a trace table, predict the held-out part, score it (DESIGN §2.8).

Splits (``nodes``, ``gpus``, ``ranks``, ``steps``, ``scale``): :func:`split_table`, defined in
:mod:`bayesprism.checks.splits` and re-exported here.

Predictions (:func:`predict_heldout`): for kernel-level posteriors every held-out row (one
kernel launch, or one benchmark run on one GPU) is simulated in its own context
(:func:`bayesprism.checks.row_predictive.predict_rows`, re-exported here). For step-level
posteriors the step time of every held-out layout is forecast with
``bayesprism.forecast.forecasting`` at the logged layout of the run.
Scores are those of :mod:`bayesprism.checks.metrics`; baselines are in
:mod:`bayesprism.checks.baselines`; the splits and table concatenation live in
:mod:`bayesprism.checks.splits` (re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism.checks import metrics
from bayesprism.checks.baselines import (
    BASELINES,
    degenerate_posterior,
    run_layouts,
    step_baseline_draws,
    timed_steps,
)
from bayesprism.checks.row_predictive import predict_rows
from bayesprism.checks.splits import concat_tables, split_table
from bayesprism.costs.collectives import launch_work_us
from bayesprism.errors import InputError, Problem, renamed_keyword
from bayesprism.forecast.forecasting import forecast
from bayesprism.inference import fit
from bayesprism.inventory import is_step_table
from bayesprism.model.rows import timer_resolution
from bayesprism.plan import plan_from_run
from bayesprism.posterior import traced_plan

__all__ = [
    "METHODS", "HeldoutPrediction", "fit_bayesprism", "predict_heldout",
    "predict_rank_step_times", "predict_step_layouts", "predicted_slowest", "rank_step_times",
    "resampled_slowest", "validate",
]

METHODS: tuple[str, ...] = ("bayesprism", *BASELINES)


# --------------------------------------------------------------------------------------------
# predictions


@dataclass
class HeldoutPrediction:
    """Predictive draws and the held-out observations they are scored against.

    ``groups`` holds ``(draws, observed)`` pairs: for kernel tables one pair whose draws have
    shape ``(n_draws, n_rows)`` (column j predicts row j); for step tables one pair per held-out
    layout with 1-D draws. ``skipped`` counts observations that could not be scored, by reason;
    ``on_transfer`` those scored on their transfer part (collective launches whose waiting for
    peers was split off at ingest, :func:`bayesprism.costs.collectives.launch_work_us`).
    """

    groups: list[tuple[np.ndarray, np.ndarray]]
    unit: str
    skipped: dict[str, int] = field(default_factory=dict)
    on_transfer: int = 0

    @property
    def n_observed(self) -> int:
        """Held-out observations scored."""
        return int(sum(np.size(obs) for _, obs in self.groups))

    def scores(self, rng: np.random.Generator) -> dict[str, float]:
        """Metrics of :mod:`bayesprism.checks.metrics` over all groups."""
        if len(self.groups) == 1:
            return metrics.score(*self.groups[0])
        return metrics.score_groups(self.groups, rng)

    def pit(self) -> np.ndarray:
        """PIT value of every observation."""
        return metrics.pit_groups(self.groups)


def _layout_key(layout: dict) -> tuple:
    return tuple(
        layout.get(k)
        for k in ("dp", "tp", "pp", "cp", "microbatches", "virtual_stages", "gpus_per_node")
    )


def predict_step_layouts(
    method: str,
    posterior: xr.DataTree | None,
    fit_table: pd.DataFrame,
    heldout: pd.DataFrame,
    *,
    draws: int,
    rng: np.random.Generator,
    seed: int,
) -> HeldoutPrediction:
    """Step-time draws (s) at each held-out run's logged layout, paired with its timed steps.

    Held-out runs with the same layout are one group. The first timed step of every run is
    warm-up and not scored (counted in ``skipped``), as in the step model's fit.
    """
    steps, warmup = timed_steps(heldout)
    layouts = run_layouts(heldout)
    metas = heldout.attrs.get("runs", {})
    by_layout: dict[tuple, list[str]] = {}
    for run, layout in layouts.items():
        by_layout.setdefault(_layout_key(layout), []).append(run)
    keys = sorted(by_layout)
    groups = []
    if method == "bayesprism":
        plans = [plan_from_run(metas.get(by_layout[k][0], {}), run=by_layout[k][0])
                 for k in keys]
        fc = forecast(posterior, plans, draws=draws, random_seed=seed, progress=False)
        step_time = fc["step_time_s"] if "step_time_s" in fc else fc.to_dataset()["step_time_s"]
        for i, key in enumerate(keys):
            obs = steps.loc[steps["run"].isin(by_layout[key]), "duration_us"].to_numpy() / 1e6
            groups.append((step_time.isel(plan=i).to_numpy().reshape(-1), obs))
    else:
        for key in keys:
            obs = steps.loc[steps["run"].isin(by_layout[key]), "duration_us"].to_numpy() / 1e6
            pred = step_baseline_draws(
                fit_table, layouts[by_layout[key][0]], method, max(draws, 1) * 50, rng
            )
            groups.append((pred, obs))
    groups = [(p, o) for p, o in groups if np.size(o)]
    return HeldoutPrediction(groups, unit="step_time_s", skipped={"warm-up steps": warmup})


def rank_step_times(table: pd.DataFrame, others: pd.DataFrame | None = None) -> np.ndarray:
    """Measured step time (s) of every (run, rank, step) of ``table``.

    Without ``others``: the span of the rank's GPU work, max(start_us + duration_us) −
    min(start_us) over the kernels of that rank and step. With ``others`` (e.g. the fitted
    ranks of the same trace): from the step's start on the rank's node, the earliest kernel of
    any rank of that node in either table (ranks of a node share its clock), to the rank's last
    end; synchronised ranks that start late otherwise show short spans that no step has.
    """
    def usable(frame: pd.DataFrame) -> pd.DataFrame:
        if "start_us" not in frame.columns or frame["start_us"].isna().all():
            raise InputError(
                Problem(
                    "validate",
                    "start_us",
                    "rank step times need kernel start times (Kineto traces have them)",
                )
            )
        return frame.loc[frame["start_us"].notna() & (frame["kernel_class"] != "step")]

    rows = usable(table)
    end = rows["start_us"] + rows["duration_us"]
    keys = [rows["run"].astype(str), rows["rank"], rows["step"]]
    last_end = end.groupby(keys).max()
    first = rows["start_us"].groupby(keys).min()
    if others is None:
        return (last_end - first).to_numpy(dtype=float) / 1e6
    both = pd.concat([rows[["run", "node", "step", "start_us"]],
                      usable(others)[["run", "node", "step", "start_us"]]])
    step_start = both.groupby([both["run"].astype(str), both["node"].astype(str),
                               both["step"]])["start_us"].min()
    node_of = rows.groupby(keys)["node"].first().astype(str)
    index = pd.MultiIndex.from_arrays([last_end.index.get_level_values(0), node_of.to_numpy(),
                                       last_end.index.get_level_values(2)])
    start = step_start.reindex(index).to_numpy(dtype=float)
    return (last_end.to_numpy(dtype=float) - start) / 1e6


def predict_rank_step_times(
    posterior: xr.DataTree, heldout: pd.DataFrame, *, draws: int, seed: int,
    others: pd.DataFrame | None = None,
) -> HeldoutPrediction:
    """Forecast step time (s) of the traced plan against the held-out ranks' step times.

    The forecast is ``bayesprism.forecast.forecasting`` of the posterior (bayesprism or a degenerate
    baseline with the same ``inventory``) at the traced plan; the observations are
    :func:`rank_step_times` of the held-out ranks (from the step's start on their node when
    ``others``, the fitted ranks of the same trace, are given).
    """
    fc = forecast(
        posterior, [traced_plan(posterior)], draws=draws, random_seed=seed, progress=False
    )
    step_time = fc["step_time_s"] if "step_time_s" in fc else fc.to_dataset()["step_time_s"]
    pred = step_time.isel(plan=0).to_numpy().reshape(-1)
    return HeldoutPrediction([(pred, rank_step_times(heldout, others))], unit="step_time_s")


def predict_heldout(
    method: str,
    posterior: xr.DataTree | None,
    fit_table: pd.DataFrame,
    heldout: pd.DataFrame,
    *,
    draws: int,
    rng: np.random.Generator,
    seed: int = 0,
) -> HeldoutPrediction:
    """Predictive draws of the held-out observations under one method.

    Kernel tables: every held-out row's duration (µs), :func:`predict_rows` on ``posterior``
    (the bayesprism fit or a baseline's degenerate posterior), rounded to the fitted traces'
    timer resolution when they have one (:func:`bayesprism.model.rows.timer_resolution`: the
    predicted quantity is the recorded duration); a collective launch is scored on
    its transfer part where ingest split off its waiting for peers (what every kernel model and
    baseline fits: the wait belongs to the step and is scored with step times). Step tables:
    the step time (s) at each held-out layout (:func:`predict_step_layouts`).
    """
    if is_step_table(heldout):
        return predict_step_layouts(
            method, posterior, fit_table, heldout, draws=draws, rng=rng, seed=seed
        )
    rows = heldout.loc[heldout["kernel_class"] != "step"]
    pred, predictable = predict_rows(posterior, rows, draws=draws, rng=rng)
    resolution = timer_resolution(launch_work_us(fit_table.loc[fit_table["kernel_class"]
                                                               != "step"])[0])
    if resolution > 0:
        # Predict the recorded value: the held-out launches went through the fitted traces'
        # timer (Kineto: whole µs), which rounds and never records less than one tick.
        pred = np.maximum(np.round(pred / resolution), 1.0) * resolution
    work_us, uses_transfer = launch_work_us(rows)
    observed = work_us[predictable]
    skipped = {}
    if (~predictable).any():
        skipped["kernel without kernel_log_median"] = int((~predictable).sum())
    if (heldout["kernel_class"] == "step").any():
        skipped["step rows in a kernel table"] = int((heldout["kernel_class"] == "step").sum())
    if observed.size == 0:
        raise InputError(
            Problem(
                "validate",
                "kernel",
                "no held-out row has a fitted kernel",
                len(rows),
                rows["kernel"].astype(str).iloc[0] if len(rows) else None,
            )
        )
    return HeldoutPrediction([(pred, observed)], unit="duration_us", skipped=skipped,
                             on_transfer=int(uses_transfer[predictable].sum()))


# --------------------------------------------------------------------------------------------
# validate


def fit_bayesprism(
    table: pd.DataFrame,
    spec: str | None,
    *,
    draws: int | None,
    tune: int | None,
    chains: int,
    random_seed: int,
    progress: bool,
) -> xr.DataTree:
    """Bayesprism's fit of ``table`` (``spec``, or the step spec for step tables)."""
    spec = spec if spec is not None else ("step" if is_step_table(table) else None)
    return fit(table, spec, draws=draws, tune=tune, chains=chains, random_seed=random_seed,
               progress=progress)


def validate(
    fit_tables: pd.DataFrame | Sequence[pd.DataFrame],
    heldout_tables: pd.DataFrame | Sequence[pd.DataFrame] | None = None,
    *,
    spec: str | None = None,
    split: str | None = None,
    fraction: float | None = None,
    random_seed: int | None = None,
    draws: int = 500,
    tune: int | None = None,
    chains: int = 2,
    methods: Sequence[str] = METHODS,
    posterior: xr.DataTree | None = None,
    progress: bool = False,
    model: str | None = None,
    seed: int | None = None,
) -> pd.DataFrame:
    """Score bayesprism and the baselines on held-out measurements (method × metric).

    Parameters
    ----------
    fit_tables
        Trace table(s) to fit.
    heldout_tables
        Trace table(s) to predict. May be omitted when ``split`` is given: the held-out part is
        then split off the fit tables (:func:`split_table` with ``fraction`` and ``seed``).
    spec
        Named model spec for bayesprism (default: ``"default"`` for kernel tables, ``"step"``
        for step tables).
    split
        ``"nodes"``, ``"gpus"``, ``"ranks"``, ``"steps"`` or ``"scale"``.
    random_seed
        Seed of the split, the fit and the predictive draws (default 0).
    draws, tune, chains
        Sampler settings of the bayesprism fit (``tune`` defaults to ``draws``); ``draws`` is
        also the number of predictive draws per held-out row.
    methods
        Any of ``"bayesprism"``, ``"pooled"``, ``"deterministic"``.
    posterior
        An existing bayesprism fit of ``fit_tables`` to use instead of fitting.
    model, seed
        Earlier names of ``spec`` and ``random_seed``, accepted with a ``FutureWarning`` for
        one release.

    Returns
    -------
    pandas.DataFrame
        Index ``method``; columns :data:`bayesprism.checks.metrics.METRICS` plus ``n_observed``.
        ``attrs`` hold ``pit`` (method → PIT values), ``skipped`` (method → reason → count),
        ``on_transfer`` (collective launches scored on their transfer part),
        ``unit`` and ``split``.

    Examples
    --------
    >>> import bayesprism as bp
    >>> from bayesprism.checks.splits import split_table
    >>> table = bp.read_traces("data/kineto/param_dlrm_8rank", progress=False)  # doctest: +SKIP
    >>> fit_part, heldout = split_table(table, "ranks", fraction=0.25)  # doctest: +SKIP
    >>> scores = validate(fit_part, heldout)  # doctest: +SKIP
    """
    spec = renamed_keyword("validate", "spec", spec, "model", model, None)
    seed = renamed_keyword("validate", "random_seed", random_seed, "seed", seed, 0)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise InputError(
            Problem(
                "validate", "methods", f"choose from {', '.join(METHODS)}", len(unknown), unknown[0]
            )
        )
    fit_table = concat_tables(fit_tables)
    if heldout_tables is None:
        if split is None:
            raise InputError(
                Problem("validate", "heldout", "give held-out tables or a split of the fit tables")
            )
        fit_table, heldout = split_table(fit_table, split, fraction=fraction, seed=seed)
    else:
        heldout = concat_tables(heldout_tables)
    rng = np.random.default_rng(seed)
    if "bayesprism" in methods and posterior is None:
        posterior = fit_bayesprism(
            fit_table,
            spec,
            draws=draws,
            tune=tune or draws,
            chains=chains,
            random_seed=seed,
            progress=progress,
        )
    rows, pits, skipped, on_transfer, unit = [], {}, {}, 0, None
    for method in methods:
        if method == "bayesprism" or is_step_table(fit_table):
            used = posterior if method == "bayesprism" else None
        else:
            used = degenerate_posterior(fit_table, method, reference=posterior)
        prediction = predict_heldout(
            method, used, fit_table, heldout, draws=draws, rng=rng, seed=seed
        )
        rows.append(
            {"method": method, **prediction.scores(rng), "n_observed": prediction.n_observed}
        )
        pits[method] = prediction.pit()
        skipped[method] = prediction.skipped
        on_transfer, unit = prediction.on_transfer, prediction.unit
    table = pd.DataFrame(rows).set_index("method")
    table.attrs = {
        "pit": pits,
        "skipped": skipped,
        "on_transfer": on_transfer,
        "unit": unit,
        "split": heldout.attrs.get("split"),
    }
    return table


# --------------------------------------------------------------------------------------------
# slowest of k GPUs


def _gpus_per_node(table: pd.DataFrame) -> int:
    per_node = table.groupby(table["node"].astype(str))["gpu"].nunique()
    return int(per_node.max())


def predicted_slowest(
    posterior: xr.DataTree,
    heldout: pd.DataFrame,
    ks: Sequence[int],
    *,
    draws: int,
    rng: np.random.Generator,
    kernel: str | None = None,
) -> dict[int, np.ndarray]:
    """Draws of the slowest of k new GPUs (one run each), for each k.

    The k GPUs sit on ``ceil(k / gpus_per_node)`` new nodes (``gpus_per_node`` as in
    ``heldout``); each runs ``kernel`` (default: the most frequent held-out kernel) once, at its
    own time (independent step effects), like a benchmark run on each GPU. New nodes are placed
    in cabinets picked at random among the fitted ones when the posterior has cabinets.
    """
    kernel = kernel or str(heldout["kernel"].astype(str).value_counts().index[0])
    klass = str(heldout.loc[heldout["kernel"].astype(str) == kernel, "kernel_class"].iloc[0])
    gpn = _gpus_per_node(heldout)
    post = posterior["posterior"]
    cabinets = (
        post["cabinet_effect"].coords["cabinet"].to_numpy().astype(str)
        if "cabinet_effect" in post
        else None
    )
    out = {}
    for k in ks:
        n_nodes = math.ceil(k / gpn)
        gpu = np.arange(k)
        rows = pd.DataFrame(
            {
                "run": "new",
                "step": gpu,
                "node": [f"new-node-{i // gpn}" for i in gpu],
                "gpu": gpu % gpn,
                "kernel": kernel,
                "kernel_class": klass,
            }
        )
        if cabinets is not None:
            rows["cabinet"] = rng.choice(cabinets, n_nodes)[gpu // gpn]
        pred, _ = predict_rows(posterior, rows, draws=draws, rng=rng)
        out[int(k)] = pred.max(axis=1)
    return out


def resampled_slowest(
    heldout: pd.DataFrame,
    ks: Sequence[int],
    *,
    resamples: int,
    rng: np.random.Generator,
    kernel: str | None = None,
) -> dict[int, np.ndarray]:
    """The slowest of k held-out GPUs by resampling.

    ``ceil(k/gpn)`` held-out nodes drawn with replacement, their first k GPUs, one random run
    of ``kernel`` on each; the maximum.
    """
    kernel = kernel or str(heldout["kernel"].astype(str).value_counts().index[0])
    rows = heldout.loc[heldout["kernel"].astype(str) == kernel]
    gpn = _gpus_per_node(heldout)
    values = rows["duration_us"].to_numpy(dtype=float)
    nodes = rows["node"].astype(str).to_numpy()
    gpus = rows["gpu"].to_numpy()
    by_gpu = pd.Series(np.arange(len(rows))).groupby([nodes, gpus]).apply(np.asarray)
    node_gpus: dict[str, list[np.ndarray]] = {}
    for (node, _), idx in by_gpu.items():
        node_gpus.setdefault(node, []).append(idx)
    names = sorted(node_gpus)
    out = {}
    for k in ks:
        maxima = np.empty(resamples)
        for r in range(resamples):
            chosen = rng.choice(len(names), math.ceil(k / gpn))
            pools = [p for i in chosen for p in node_gpus[names[i]]][:k]
            maxima[r] = max(values[rng.choice(p)] for p in pools)
        out[int(k)] = maxima
    return out
