"""Convergence diagnostics and posterior predictive checks of a fitted posterior.

``diagnose(posterior)`` answers one question: can the fit be trusted? It collects R-hat, bulk
and tail ESS (ArviZ), divergences and BFMI, and checks the model against the traced run it was
fitted to: per kernel class, the observed cell means of log duration against their posterior
predictive distribution (drawn here with NumPy from the posterior, no PyMC), and, when the
composition is available, the traced step time against the composed prediction for the traced
plan. It also prepares the tidy tables the plots and the report draw (variance components, unit
effects), so that plotting code computes nothing.

Cell statistics read from the fit (names as written by the kernel model; alternatives accepted):
``observed_data.cell_mean`` (mean log duration in µs of one kernel × GPU × step cell),
``constant_data.cell_count`` (launches in the cell) and the cell's unit indices
``constant_data.cell_kernel``, ``cell_node``, ``cell_gpu_unit``, ``cell_step_unit``,
``cell_cabinet`` (integer positions into the posterior coordinates, or the labels themselves).
"""

from __future__ import annotations

import inspect
import json
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats

SAMPLE_DIMS = ("chain", "draw")
#: Levels of the kernel model with a per-class loading ``{level}_scale``; order used in tables.
LEVELS = ("node", "gpu", "step", "gpustep", "cabinet", "resid")
#: Unit-effect variables and their unit dims.
UNIT_EFFECTS = {
    "node": ("node_effect", "node"),
    "gpu": ("gpu_effect", "gpu_unit"),
    "cabinet": ("cabinet_effect", "cabinet"),
}
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)

_CELL_MEAN_NAMES = ("cell_mean", "mean_log", "cell_mean_log", "mean_log_duration")
_CELL_COUNT_NAMES = ("cell_count", "cell_n", "n", "count")
# (posterior coordinate dim, accepted names of the cell's index into it)
_CELL_INDEX_NAMES = {
    "kernel": ("cell_kernel", "kernel_idx", "kernel_index"),
    "node": ("cell_node", "node_idx", "node_index"),
    "gpu_unit": ("cell_gpu_unit", "gpu_unit_idx", "gpu_unit_index", "cell_gpu"),
    "step_unit": ("cell_step_unit", "step_unit_idx", "step_unit_index", "cell_step"),
    "cabinet": ("cell_cabinet", "cabinet_idx", "cabinet_index"),
}
# effect variable -> (its unit dim, the class loading that multiplies it)
_EFFECT_TERMS = {
    "node": ("node_effect", "node_scale"),
    "gpu_unit": ("gpu_effect", "gpu_scale"),
    "step_unit": ("step_effect", "step_scale"),
    "cabinet": ("cabinet_effect", "cabinet_scale"),
}


@dataclass
class DiagnosisReport:
    """What ``diagnose`` found; ``ok`` is False when the fit cannot be trusted.

    Attributes
    ----------
    ok
        True when no problem was found.
    max_rhat, min_ess_bulk, min_ess_tail
        Worst values over all non-constant posterior elements (NaN when there are none).
    divergences
        Number of divergent transitions after tuning.
    bfmi_min
        Smallest per-chain BFMI, or None when ``sample_stats`` has no ``energy``.
    problems
        Plain-language problems, each with what to do about it.
    notes
        Checks that were skipped and why; elements ignored as constant.
    ppc
        Per kernel class: ``n_cells``, ``ks_distance``, ``coverage_50``, ``coverage_90``,
        ``observed_median_us``, ``predicted_median_us``.
    step_time_check
        Traced step time vs the composed prediction for the traced plan, or None if skipped.
    convergence
        One row per posterior element: ``variable``, ``element``, ``r_hat``, ``ess_bulk``,
        ``ess_tail`` (sorted worst R-hat first; constant elements excluded).
    variance_components
        Tidy quantile table of the per-class loadings (see :func:`variance_components`).
    unit_effects
        Per level (``node``, ``gpu``, ``cabinet``) the table of :func:`unit_effects`.
    ppc_values
        Per class ``(observed_us, predicted_us)`` arrays for the predictive-check plot.
    thresholds
        The limits the verdict used.
    """

    ok: bool
    max_rhat: float
    min_ess_bulk: float
    min_ess_tail: float
    divergences: int
    bfmi_min: float | None
    problems: list[str]
    notes: list[str] = field(default_factory=list)
    ppc: dict[str, dict[str, float]] = field(default_factory=dict)
    step_time_check: dict[str, float] | None = None
    convergence: pd.DataFrame = field(default_factory=pd.DataFrame)
    variance_components: pd.DataFrame = field(default_factory=pd.DataFrame)
    unit_effects: dict[str, pd.DataFrame] = field(default_factory=dict)
    ppc_values: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready summary (NaN stays a float; the CLI turns it into ``null``)."""
        return {
            "ok": bool(self.ok),
            "max_rhat": float(self.max_rhat),
            "min_ess_bulk": float(self.min_ess_bulk),
            "min_ess_tail": float(self.min_ess_tail),
            "divergences": int(self.divergences),
            "bfmi_min": None if self.bfmi_min is None else float(self.bfmi_min),
            "problems": list(self.problems),
            "notes": list(self.notes),
            "ppc": {c: dict(v) for c, v in self.ppc.items()},
            "step_time_check": None if self.step_time_check is None else dict(self.step_time_check),
            "thresholds": dict(self.thresholds),
        }

    def worst_elements(self, k: int = 6) -> list[tuple[str, str]]:
        """``(variable, element label)`` of the ``k`` elements with the highest R-hat."""
        head = self.convergence.head(k)
        return list(zip(head["variable"], head["element"], strict=True))


def diagnose(
    posterior: xr.DataTree,
    *,
    rhat_max: float = 1.01,
    min_ess: float | None = None,
    bfmi_min: float = 0.3,
    coverage_90_min: float = 0.7,
    ppc_draws: int = 400,
    random_seed: int = 0,
) -> DiagnosisReport:
    """Check convergence and fit of a posterior written by ``bayesprism.fit``.

    Parameters
    ----------
    posterior
        The fit (DataTree with ``posterior``, ``sample_stats`` and, for predictive checks,
        ``observed_data``/``constant_data`` and ``inventory``).
    rhat_max
        Largest acceptable rank-normalised split R-hat.
    min_ess
        Smallest acceptable bulk and tail ESS; default 100 per chain.
    bfmi_min
        Smallest acceptable per-chain Bayesian fraction of missing information.
    coverage_90_min
        Smallest acceptable share of observed cells inside their 90 % predictive interval.
    ppc_draws
        Posterior draws used by the predictive checks (a seeded subsample).
    random_seed
        Seed of the predictive draws.

    Returns
    -------
    DiagnosisReport
    """
    if "posterior" not in posterior.children:
        from bayesprism.errors import ArtifactError, Problem

        raise ArtifactError(Problem("posterior", "posterior", "the fit has no posterior group"))
    post = posterior["posterior"].to_dataset()
    n_chains = int(post.sizes.get("chain", 1))
    min_ess = 100.0 * n_chains if min_ess is None else float(min_ess)
    thresholds = {
        "rhat_max": rhat_max,
        "min_ess": min_ess,
        "bfmi_min": bfmi_min,
        "coverage_90_min": coverage_90_min,
    }
    problems: list[str] = []
    notes: list[str] = []

    table, n_constant = convergence_table(posterior)
    if n_constant:
        notes.append(
            f"{n_constant} constant posterior elements (fixed or zero-sum-determined "
            "values) were left out of R-hat/ESS"
        )
    problems += _convergence_problems(table, rhat_max, min_ess)
    finite = table.replace([np.inf, -np.inf], np.nan)
    max_rhat = float(finite["r_hat"].max()) if len(table) else math.nan
    min_bulk = float(finite["ess_bulk"].min()) if len(table) else math.nan
    min_tail = float(finite["ess_tail"].min()) if len(table) else math.nan

    divergences = _count_divergences(posterior)
    if divergences:
        problems.append(
            f"{divergences} divergent transitions; the sampler did not explore the "
            "posterior reliably: raise target_accept (e.g. 0.95) or use --model "
            "robust"
        )
    bfmi = _bfmi_min(posterior)
    if bfmi is None:
        notes.append("BFMI not computed: sample_stats has no energy")
    elif bfmi < bfmi_min:
        problems.append(
            f"BFMI {bfmi:.2f} < {bfmi_min} in at least one chain; the energy "
            "distribution is poorly explored: reparameterise or run longer"
        )

    rng = np.random.default_rng(random_seed)
    ppc, ppc_values, ppc_note = cell_predictive_check(posterior, rng, max_draws=ppc_draws)
    if ppc_note:
        notes.append(ppc_note)
    for cls, numbers in ppc.items():
        if numbers["n_cells"] >= 10 and numbers["coverage_90"] < coverage_90_min:
            problems.append(
                f"90% predictive intervals cover only {numbers['coverage_90']:.0%} of the "
                f"observed {cls} cells (KS distance {numbers['ks_distance']:.2f}); the model "
                "misfits this class: try --model robust or check the trace for outliers"
            )
    step_check, step_note = step_time_check(posterior, rng)
    if step_note:
        notes.append(step_note)

    return DiagnosisReport(
        ok=not problems,
        max_rhat=max_rhat,
        min_ess_bulk=min_bulk,
        min_ess_tail=min_tail,
        divergences=divergences,
        bfmi_min=bfmi,
        problems=problems,
        notes=notes,
        ppc=ppc,
        step_time_check=step_check,
        convergence=table,
        variance_components=variance_components(posterior),
        unit_effects={
            level: unit_effects(posterior, level)
            for level in UNIT_EFFECTS
            if UNIT_EFFECTS[level][0] in post
        },
        ppc_values=ppc_values,
        thresholds=thresholds,
    )


# --------------------------------------------------------------------------------- convergence
def _element_labels(da: xr.DataArray) -> list[str]:
    """``name[a,b]`` labels of every element of a variable without its sample dims."""
    dims = [d for d in da.dims if d not in SAMPLE_DIMS]
    if not dims:
        return [str(da.name)]
    index = pd.MultiIndex.from_product(
        [da.coords[d].to_numpy() if d in da.coords else np.arange(da.sizes[d]) for d in dims]
    )
    return [f"{da.name}[{','.join(str(v) for v in key)}]" for key in index]


def convergence_table(posterior: xr.DataTree) -> tuple[pd.DataFrame, int]:
    """R-hat and bulk/tail ESS of every posterior element that varies over the draws.

    Elements constant over all draws (a fixed value, or the last coordinate of a zero-sum
    vector stored with a degenerate dimension) have undefined R-hat and are left out; their
    number is returned. Elements that vary but have non-finite R-hat (a stuck chain) stay in
    with ``r_hat = inf``.

    Returns
    -------
    (pandas.DataFrame, int)
        Columns ``variable``, ``element``, ``r_hat``, ``ess_bulk``, ``ess_tail``, sorted by
        R-hat (worst first); the number of constant elements left out.
    """
    import arviz as az

    post = posterior["posterior"].to_dataset()
    names = [v for v in post.data_vars if set(SAMPLE_DIMS) <= set(post[v].dims)]
    if not names:
        return pd.DataFrame(columns=["variable", "element", "r_hat", "ess_bulk", "ess_tail"]), 0
    rhat = az.rhat(post, var_names=names)
    bulk = az.ess(post, var_names=names, method="bulk")
    tail = az.ess(post, var_names=names, method="tail")
    rows = []
    n_constant = 0
    for name in names:
        da = post[name]
        spread = (da.max(SAMPLE_DIMS) - da.min(SAMPLE_DIMS)).to_numpy().reshape(-1)
        scale = np.abs(da).max(SAMPLE_DIMS).to_numpy().reshape(-1)
        constant = ~(spread > 1e-12 * np.maximum(scale, 1.0))
        n_constant += int(constant.sum())
        r = _values(rhat, name)
        b = _values(bulk, name)
        t = _values(tail, name)
        for i, label in enumerate(_element_labels(da)):
            if constant[i]:
                continue
            rows.append((name, label, r[i] if np.isfinite(r[i]) else np.inf, b[i], t[i]))
    table = pd.DataFrame(rows, columns=["variable", "element", "r_hat", "ess_bulk", "ess_tail"])
    table = table.sort_values("r_hat", ascending=False, kind="stable").reset_index(drop=True)
    return table, n_constant


def _values(result, name: str) -> np.ndarray:
    """Flattened values of one variable from an ``az.rhat``/``az.ess`` result."""
    ds = result.to_dataset() if isinstance(result, xr.DataTree) else result
    return np.asarray(ds[name].to_numpy(), dtype=float).reshape(-1)


def _convergence_problems(table: pd.DataFrame, rhat_max: float, min_ess: float) -> list[str]:
    """One problem per variable with the worst element, in plain words."""
    problems = []
    checks = (
        (
            "r_hat",
            lambda s: s > rhat_max,
            False,
            lambda v: (
                f"R-hat {v:.3g} > {rhat_max}"
                if np.isfinite(v)
                else "R-hat is infinite (a chain is stuck)"
            ),
            "run more tuning draws or use --model robust",
        ),
        (
            "ess_bulk",
            lambda s: ~(s >= min_ess),
            True,
            lambda v: f"bulk ESS {v:.0f} < {min_ess:.0f}",
            "run more draws; means and intervals are not reliable yet",
        ),
        (
            "ess_tail",
            lambda s: ~(s >= min_ess),
            True,
            lambda v: f"tail ESS {v:.0f} < {min_ess:.0f}",
            "run more draws; the 5%/95% quantiles are not reliable yet",
        ),
    )
    for column, bad, ascending, what, advice in checks:
        failing = table[bad(table[column])]
        for variable, rows in failing.groupby("variable", sort=False):
            rows = rows.sort_values(column, ascending=ascending, kind="stable")
            worst = rows.iloc[0]
            more = f" (and {len(rows) - 1} more elements of {variable})" if len(rows) > 1 else ""
            problems.append(f"{what(float(worst[column]))} for {worst['element']}{more}; {advice}")
    return problems


def _count_divergences(posterior: xr.DataTree) -> int:
    if "sample_stats" not in posterior.children:
        return 0
    ss = posterior["sample_stats"]
    if "diverging" not in ss.data_vars:
        return 0
    return int(ss["diverging"].to_numpy().astype(bool).sum())


def _bfmi_min(posterior: xr.DataTree) -> float | None:
    """Smallest per-chain BFMI, or None without an ``energy`` statistic."""
    if (
        "sample_stats" not in posterior.children
        or "energy" not in posterior["sample_stats"].data_vars
    ):
        return None
    import arviz as az

    result = az.bfmi(posterior)
    ds = result.to_dataset() if isinstance(result, xr.DataTree) else result
    values = np.asarray(ds["energy"].to_numpy(), dtype=float)
    values = values[np.isfinite(values)]
    return float(values.min()) if values.size else None


# ----------------------------------------------------------------------------- summary tables
def _quantile_columns(da: xr.DataArray, keep: list[str]) -> pd.DataFrame:
    """Mean and QUANTILES of ``da`` over the sample dims, one row per element of ``keep`` dims."""
    stacked = da.stack(sample=SAMPLE_DIMS).transpose(*keep, "sample").to_numpy()
    stacked = stacked.reshape(-1, stacked.shape[-1])
    q = np.quantile(stacked, QUANTILES, axis=-1)
    frame = pd.DataFrame({"mean": stacked.mean(axis=-1)})
    for level, values in zip(QUANTILES, q, strict=True):
        frame[f"q{round(level * 100):02d}"] = values
    return frame


def variance_components(posterior: xr.DataTree) -> pd.DataFrame:
    """Posterior quantiles of every per-class loading ``{level}_scale`` (log-scale sd).

    Returns
    -------
    pandas.DataFrame
        One row per (``kernel_class``, ``level``) with ``mean``, ``q05``, ``q25``, ``q50``,
        ``q75``, ``q95`` of the loading and ``share_q50``, ``share_q05``, ``share_q95``: the
        level's share of the class's log-duration variance (loading² / sum of loadings²).
        Empty when the posterior has no loadings (step-level models).
    """
    post = posterior["posterior"].to_dataset()
    levels = [
        lv for lv in LEVELS if f"{lv}_scale" in post and "kernel_class" in post[f"{lv}_scale"].dims
    ]
    columns = [
        "kernel_class",
        "level",
        "mean",
        "q05",
        "q25",
        "q50",
        "q75",
        "q95",
        "share_q05",
        "share_q50",
        "share_q95",
    ]
    if not levels:
        return pd.DataFrame(columns=columns)
    loads = xr.concat([post[f"{lv}_scale"] for lv in levels], dim=pd.Index(levels, name="level"))
    loads = loads.transpose("kernel_class", "level", *SAMPLE_DIMS)
    share = loads**2 / (loads**2).sum("level")
    frame = _quantile_columns(loads, ["kernel_class", "level"])
    shares = _quantile_columns(share, ["kernel_class", "level"])
    index = pd.MultiIndex.from_product(
        [loads.coords["kernel_class"].to_numpy().astype(str), levels],
        names=["kernel_class", "level"],
    ).to_frame(index=False)
    frame = pd.concat([index, frame], axis=1)
    for q in ("q05", "q50", "q95"):
        frame[f"share_{q}"] = shares[q].to_numpy()
    return frame[columns]


def unit_effects(posterior: xr.DataTree, level: str) -> pd.DataFrame:
    """Posterior quantiles of the standardised effects of the measured units of ``level``.

    Positive effects mean slower (longer log duration, scaled by the class loading).

    Returns
    -------
    pandas.DataFrame
        Columns ``unit``, ``mean``, ``q05`` … ``q95`` and ``excludes_zero`` (the 90 % interval
        lies on one side of 0), sorted by median, slowest first.
    """
    name, dim = UNIT_EFFECTS[level]
    da = posterior["posterior"].to_dataset()[name]
    frame = _quantile_columns(da.transpose(dim, *SAMPLE_DIMS), [dim])
    frame.insert(
        0,
        "unit",
        da.coords[dim].to_numpy().astype(str)
        if dim in da.coords
        else np.arange(da.sizes[dim]).astype(str),
    )
    frame["excludes_zero"] = (frame["q05"] > 0) | (frame["q95"] < 0)
    return frame.sort_values("q50", ascending=False, kind="stable").reset_index(drop=True)


# ------------------------------------------------------------------- posterior predictive checks
def _first(ds_list: list[xr.Dataset], names: tuple[str, ...]) -> xr.DataArray | None:
    for ds in ds_list:
        for name in names:
            if name in ds.data_vars or name in ds.coords:
                return ds[name]
    return None


def _positions(index: xr.DataArray, coord: np.ndarray) -> np.ndarray:
    """Integer positions into ``coord`` from an index array of positions or labels."""
    values = index.to_numpy()
    if np.issubdtype(values.dtype, np.integer):
        return values.astype(int)
    lookup = {str(label): i for i, label in enumerate(coord)}
    labels = values.astype(str)
    missing = sorted({v for v in labels if v not in lookup})
    if missing:
        raise KeyError(f"{index.name} has labels not in the posterior: {missing[:3]}")
    return np.array([lookup[v] for v in labels], dtype=int)


def cell_predictive_check(
    posterior: xr.DataTree, rng: np.random.Generator, *, max_draws: int = 400
) -> tuple[dict[str, dict[str, float]], dict[str, tuple[np.ndarray, np.ndarray]], str | None]:
    """Observed cell means of log duration vs their posterior predictive, per kernel class.

    For every posterior draw the predicted mean log duration of a cell of n launches of kernel
    k (class c) is ``a_k + Σ_level scale_level[c]·effect_level[unit] + gpustep_scale[c]·z
    + resid_scale[c]·ε/√n`` with fresh z, ε ~ N(0, 1) (z only when the fit has no per-GPU-step
    effect variable). Per class: two-sample KS distance between observed and predicted cell
    means, and the share of observed cells inside their own 50 % and 90 % predictive intervals.

    Returns
    -------
    (ppc, values, note)
        ``ppc[class]`` numbers, ``values[class] = (observed_us, predicted_us)`` for plots, and
        a note when the check could not run (else None).
    """
    post = posterior["posterior"].to_dataset()
    if posterior.attrs.get("model_kind", "kernel") != "kernel" or "kernel_log_median" not in post:
        return {}, {}, "cell predictive check skipped: not a kernel-level posterior"
    groups = [
        posterior[g].to_dataset()
        for g in ("observed_data", "constant_data")
        if g in posterior.children
    ]
    observed = _first(groups, _CELL_MEAN_NAMES)
    kernel_index = _first(groups, _CELL_INDEX_NAMES["kernel"])
    if observed is None or kernel_index is None:
        return (
            {},
            {},
            (
                "cell predictive check skipped: the fit stores no cell means and kernel "
                f"indices (looked for {_CELL_MEAN_NAMES[0]} and "
                f"{_CELL_INDEX_NAMES['kernel'][0]} in observed_data/constant_data)"
            ),
        )
    count = _first(groups, _CELL_COUNT_NAMES)
    y = observed.to_numpy().astype(float).reshape(-1)
    n = np.ones_like(y) if count is None else count.to_numpy().astype(float).reshape(-1)

    total = post.sizes["chain"] * post.sizes["draw"]
    take = np.sort(rng.choice(total, size=min(max_draws, total), replace=False))

    def flat(name: str) -> np.ndarray:  # (draws, elements)
        da = post[name]
        rest = [d for d in da.dims if d not in SAMPLE_DIMS]
        arr = da.transpose(*SAMPLE_DIMS, *rest).to_numpy().reshape(total, -1)
        return arr[take]

    kernels = post["kernel_log_median"].coords["kernel"].to_numpy()
    k = _positions(kernel_index, kernels)
    cls_of_kernel = _kernel_classes(posterior, kernels)
    cls_names = (
        post.coords["kernel_class"].to_numpy().astype(str)
        if "kernel_class" in post.coords
        else np.unique(cls_of_kernel)
    )
    class_pos = {c: i for i, c in enumerate(cls_names)}
    c = np.array([class_pos.get(cls_of_kernel[i], -1) for i in k])

    mu = flat("kernel_log_median")[:, k]
    for dim, (effect, scale) in _EFFECT_TERMS.items():
        if effect not in post or scale not in post:
            continue
        index = _first(groups, _CELL_INDEX_NAMES[dim])
        if index is None:
            continue
        u = _positions(index, post[effect].coords[dim].to_numpy())
        mu = mu + flat(scale)[:, c] * flat(effect)[:, u]
    noise_sd = np.zeros_like(mu)
    if "gpustep_scale" in post:
        noise_sd = noise_sd + flat("gpustep_scale")[:, c] ** 2
    if "resid_scale" in post:
        noise_sd = noise_sd + flat("resid_scale")[:, c] ** 2 / n
    predicted = mu + np.sqrt(noise_sd) * rng.standard_normal(mu.shape)

    pit = (predicted < y).mean(axis=0)
    ppc: dict[str, dict[str, float]] = {}
    values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    cell_class = np.asarray(cls_of_kernel)[k]
    for cls in np.unique(cell_class):
        sel = cell_class == cls
        pred = predicted[:, sel].reshape(-1)
        if pred.size > 20_000:
            pred = rng.choice(pred, 20_000, replace=False)
        ppc[str(cls)] = {
            "n_cells": int(sel.sum()),
            "ks_distance": float(stats.ks_2samp(y[sel], pred).statistic),
            "coverage_50": float(np.mean((pit[sel] >= 0.25) & (pit[sel] <= 0.75))),
            "coverage_90": float(np.mean((pit[sel] >= 0.05) & (pit[sel] <= 0.95))),
            "observed_median_us": float(np.exp(np.median(y[sel]))),
            "predicted_median_us": float(np.exp(np.median(pred))),
        }
        values[str(cls)] = (np.exp(y[sel]), np.exp(pred))
    return ppc, values, None


def _kernel_classes(posterior: xr.DataTree, kernels: np.ndarray) -> np.ndarray:
    """Class label of each kernel, from the inventory (``kernel_class`` on dim ``kernel``)."""
    if "inventory" in posterior.children and "kernel_class" in posterior["inventory"].data_vars:
        inv = posterior["inventory"]["kernel_class"]
        lookup = dict(
            zip(
                inv.coords["kernel"].to_numpy().astype(str), inv.to_numpy().astype(str), strict=True
            )
        )
        return np.array([lookup.get(str(kn), "unknown") for kn in kernels])
    return np.full(len(kernels), "all")


def step_time_check(
    posterior: xr.DataTree, rng: np.random.Generator, *, max_draws: int = 200
) -> tuple[dict[str, float] | None, str | None]:
    """Traced step time (slowest rank per step) vs the composition for the traced plan.

    The traced plan runs on the traced nodes (their own posterior effects), composed from a
    thinned posterior (at most ``max_draws`` draws, 4 simulated steps each).

    Returns ``(numbers, note)``: numbers are None when the check cannot run (no inventory,
    composition not available, or the traced plan cannot be composed); the note says why, or
    carries the composition's warnings.
    """
    if (
        "inventory" not in posterior.children
        or "traced_step_time_us" not in posterior["inventory"].data_vars
    ):
        return None, "step-time check skipped: the inventory has no traced_step_time_us"
    try:
        from bayesprism.composition import compose
        from bayesprism.plan import Cluster, ParallelPlan
    except ImportError as exc:
        return None, f"step-time check skipped: composition not available ({exc})"
    inventory = posterior["inventory"]
    try:
        traced = json.loads(inventory.attrs.get("traced_plan", "{}"))
        known = {f for f in inspect.signature(ParallelPlan).parameters if f != "source"}
        plan = ParallelPlan.from_dict(
            {k: v for k, v in traced.items() if k in known}, source="inventory.traced_plan"
        )
        nodes = (
            list(dict.fromkeys(inventory["rank_node"].to_numpy().astype(str)))
            if "rank_node" in inventory.data_vars
            else []
        )
        measured = (
            set(posterior["posterior"].coords["node"].to_numpy().astype(str))
            if "node" in posterior["posterior"].coords
            else set()
        )
        cluster = Cluster(
            gpus_per_node=plan.gpus_per_node, nodes=tuple(n for n in nodes if n in measured)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            draws = compose(_thinned(posterior, max_draws), plan, rng=rng, cluster=cluster)
    except Exception as exc:  # a diagnostic must report a failed composition, not crash
        return None, f"step-time check skipped: composing the traced plan failed ({exc})"
    traced_s = inventory["traced_step_time_us"].max("rank").to_numpy() / 1e6
    traced_s = traced_s[np.isfinite(traced_s)]
    predicted = np.asarray(draws.step_time_s, dtype=float)
    lo, hi = np.quantile(predicted, [0.05, 0.95])
    numbers = {
        "n_steps": int(traced_s.size),
        "observed_median_s": float(np.median(traced_s)),
        "predicted_median_s": float(np.median(predicted)),
        "predicted_p05_s": float(lo),
        "predicted_p95_s": float(hi),
        "coverage_90": float(np.mean((traced_s >= lo) & (traced_s <= hi))),
        "ks_distance": float(stats.ks_2samp(traced_s, predicted.reshape(-1)).statistic),
    }
    notes = []
    if numbers["n_steps"] and not lo <= numbers["observed_median_s"] <= hi:
        notes.append(f"warning: the traced median step time {numbers['observed_median_s']:.4g} s "
                     f"lies outside the predicted 90% interval {lo:.4g}–{hi:.4g} s for the "
                     "traced plan (idle gaps or overlap the composition does not model?)")
    messages = sorted({str(w.message) for w in caught})
    if messages:
        notes.append("step-time check: composition warned: " + "; ".join(messages))
    return numbers, "; ".join(notes) or None


def _thinned(posterior: xr.DataTree, max_draws: int) -> xr.DataTree:
    """The fit with its posterior thinned to at most ``max_draws`` (chain × draw) draws."""
    post = posterior["posterior"]
    total = post.sizes["chain"] * post.sizes["draw"]
    if total <= max_draws:
        return posterior
    stride = int(np.ceil(total / max_draws))
    thinned = posterior.copy()
    thinned["posterior"] = post.to_dataset().isel(draw=slice(None, None, stride))
    return thinned


def worst_draws(posterior: xr.DataTree, report: DiagnosisReport, k: int = 6) -> xr.DataTree:
    """The draws of the ``k`` worst-mixing elements, one variable per element, for trace plots.

    Returns a DataTree with a ``posterior`` group whose variables are named by element label
    (e.g. ``node_scale[gemm]``) and have dims ``chain``, ``draw`` only.
    """
    post = posterior["posterior"].to_dataset()
    chosen = {}
    for variable, label in report.worst_elements(k):
        da = post[variable]
        rest = [d for d in da.dims if d not in SAMPLE_DIMS]
        flat = (
            da.transpose(*SAMPLE_DIMS, *rest)
            .to_numpy()
            .reshape(da.sizes["chain"], da.sizes["draw"], -1)
        )
        position = _element_labels(da).index(label)
        chosen[label] = xr.DataArray(
            flat[:, :, position],
            dims=SAMPLE_DIMS,
            coords={d: post.coords[d] for d in SAMPLE_DIMS if d in post.coords},
        )
    return xr.DataTree.from_dict({"posterior": xr.Dataset(chosen)})
