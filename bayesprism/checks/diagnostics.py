"""Convergence diagnostics of a fitted posterior, and the tables its figures draw.

``diagnose(posterior)`` answers one question: can the fit be trusted? It collects R-hat, bulk
and tail ESS (ArviZ), divergences and BFMI, and runs the posterior predictive checks of
``bayesprism.checks.predictive_checks`` against the traced run (cell durations per kernel class, and
the traced step time). It also prepares the tidy tables the
plots and the report draw (variance components, unit effects, worst-mixing draws), so that
plotting code computes nothing.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism.checks.class_pattern import off_pattern_notes
from bayesprism.checks.persistence import PersistentSlowdowns, episode_persistence
from bayesprism.checks.predictive_checks import cell_predictive_check, step_time_check
from bayesprism.errors import ArtifactError, Problem
from bayesprism.forecast.workload import RESID_SLOW_VARS
from bayesprism.posterior import LEVEL_SCALES, SAMPLE_DIMS, STEP_LEVEL_SCALES

# arviz is imported inside the functions that use it: start-up time of `bayesprism diagnose`.

#: Levels of the kernel model with a per-class loading ``{level}_scale``; order used in tables.
LEVELS = ("node", "gpu", "step", "gpustep", "cabinet", "resid")
#: Unit-effect variables and their unit dims.
UNIT_EFFECTS = {
    "node": ("node_effect", "node"),
    "gpu": ("gpu_effect", "gpu_unit"),
    "cabinet": ("cabinet_effect", "cabinet"),
}
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


@dataclass
class DiagnosisReport:
    """What ``diagnose`` found; ``ok`` is False when the fit cannot be trusted.

    Attributes
    ----------
    ok
        True when no problem was found.
    max_rhat, min_ess_bulk, min_ess_tail
        Worst values over all non-constant posterior elements (NaN when there are none;
        ``max_rhat`` is ``inf`` when a chain is stuck, written as ``null`` in JSON).
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
    persistence
        Slow GPU-steps and whether they last over consecutive steps
        (:func:`bayesprism.checks.persistence.episode_persistence`), or None when not checked;
        a note says so when they do.
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
    persistence: PersistentSlowdowns | None = None

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
            "persistence": None if self.persistence is None else self.persistence.to_dict(),
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

    Examples
    --------
    >>> import bayesprism as bp
    >>> report = diagnose(bp.load("posterior.nc"))  # doctest: +SKIP
    >>> report.ok, report.max_rhat  # doctest: +SKIP
    (True, 1.004)
    """
    if "posterior" not in posterior.children:
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
    # a stuck chain gives R-hat = inf: kept, it is the worst possible value
    max_rhat = float(table["r_hat"].max()) if len(table) else math.nan
    min_bulk = float(table["ess_bulk"].min()) if len(table) else math.nan
    min_tail = float(table["ess_tail"].min()) if len(table) else math.nan

    divergences = _count_divergences(posterior)
    if divergences:
        problems.append(
            f"{divergences} divergent transitions; the sampler did not explore the "
            "posterior reliably: raise target_accept (e.g. 0.95) or use --spec "
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
    ppc, ppc_values, ppc_notes = cell_predictive_check(posterior, rng, max_draws=ppc_draws)
    notes += ppc_notes
    for cls, numbers in ppc.items():
        if numbers["n_cells"] >= 10 and numbers["coverage_90"] < coverage_90_min:
            problems.append(
                f"90% predictive intervals cover only {numbers['coverage_90']:.0%} of the "
                f"observed {cls} cells (KS distance {numbers['ks_distance']:.2f}); the model "
                "misfits this class: try --spec robust or check the trace for outliers"
            )
    step_check, step_notes = step_time_check(posterior, rng)
    notes += step_notes
    persistence, persistence_notes = episode_persistence(posterior)
    notes += persistence_notes
    notes += off_pattern_notes(posterior)
    if persistence is not None and persistence.persistent:
        notes.append(persistence.message())
    notes += _restart_notes(post)

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
        persistence=persistence,
    )


def _restart_notes(post) -> list[str]:
    """What ``fit`` did when a chain sat in a mode of negligible mass.

    From ``posterior.attrs["minor_mode_restart"]`` (``bayesprism.inference.minor_mode_restart``).
    """
    raw = post.attrs.get("minor_mode_restart")
    if not raw:
        return []
    restart = json.loads(raw)  # fit stores it as JSON (netCDF has no dicts)
    # posteriors before stop 29 judged the gap per coordinate, later ones by the modes' mass
    share = (f"its mass about e^-{restart['mass_gap']:.0f} of that chain's"
             if "mass_gap" in restart else f"over {restart['coordinates']} coordinates")
    return [f"the draws are a second sampling: in the first, a chain sat in a mode "
            f"{restart['gap']:.0f} log units ({restart['gap_sds']:.0f} within-chain sds) below "
            f"chain {restart['best_chain']}'s, {share}, a negligible share of the posterior, "
            "so every chain was started again at that chain's last draw"]


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
    with warnings.catch_warnings():
        # constant or stuck elements divide by a zero within-chain variance; handled below
        warnings.simplefilter("ignore", RuntimeWarning)
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
    """One problem per failed check, naming the worst element and the variables of the others."""
    problems = []
    checks = (
        (
            "r_hat",
            lambda s: s > rhat_max,
            False,
            lambda v: (
                f"R-hat {_fmt_rhat(v)} > {rhat_max}"
                if np.isfinite(v)
                else "R-hat is infinite (a chain is stuck)"
            ),
            "run more tuning draws or use --spec robust",
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
        failing = table[bad(table[column])].sort_values(column, ascending=ascending, kind="stable")
        if not len(failing):
            continue
        worst = failing.iloc[0]
        text = f"{what(float(worst[column]))} for {_short(worst['element'])}"
        others = failing.iloc[1:]
        if len(others):
            names = list(dict.fromkeys(others["variable"]))
            shown = ", ".join(_short(n, 40) for n in names[:4]) + (", …" if len(names) > 4 else "")
            text += f" and {len(others)} more elements ({shown})"
        problems.append(f"{text}; {advice}")
    return problems


def _short(label: str, width: int = 60) -> str:
    """A label cut to ``width`` characters (C++ kernel names run to hundreds)."""
    return label if len(label) <= width else label[: width - 1] + "…"


def _fmt_rhat(value: float) -> str:
    """3 decimals near 1 (so 1.014 is not shown as 1.01), 3 significant digits when huge."""
    return f"{value:.3f}" if value < 10 else f"{value:.3g}"


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


def residual_log_sd(post: xr.Dataset) -> xr.DataArray:
    """Per-class sd of one launch's log residual, per draw.

    ``resid_scale`` for a lognormal residual; for a two-component residual
    (``resid_slow_weight`` present, eps ~ (1 − w)·N(0, σ) + w·N(δ, s)) the mixture's sd
    ``√((1 − w)σ² + w·s² + w(1 − w)δ²)``, so the slow launches count in the variance shares.
    (A Student-t residual's sd is ``resid_scale``·√(ν/(ν − 2)), infinite for ν ≤ 2; its
    ``resid_scale`` is reported as the loading.)
    """
    sigma = post["resid_scale"]
    if "resid_slow_weight" not in post:
        return sigma
    w, shift, slow_sd = (post[name] for name in RESID_SLOW_VARS)
    return np.sqrt((1 - w) * sigma**2 + w * slow_sd**2 + w * (1 - w) * shift**2)


def variance_components(posterior: xr.DataTree) -> pd.DataFrame:
    """Posterior quantiles of every per-class loading ``{level}_scale`` (log-scale sd).

    The ``resid`` loading is the residual's log-scale sd (:func:`residual_log_sd`: with a
    two-component residual it includes the slow launches, not only the core ``resid_scale``).

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
    loads = xr.concat(
        [residual_log_sd(post) if lv == "resid" else post[f"{lv}_scale"] for lv in levels],
        dim=pd.Index(levels, name="level"),
    )
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


#: Levels in :func:`level_cvs` of a kernel-level fit (``gpustep`` only when fitted).
CV_LEVELS = ("node", "gpu", "step", "gpustep", "residual")


def _median_cv(sigma: np.ndarray) -> float:
    """Posterior median of the coefficient of variation of a lognormal level."""
    return float(np.median(np.sqrt(np.expm1(np.asarray(sigma, dtype=float) ** 2))))


def level_cvs(posterior: xr.DataTree) -> dict:
    """``{class: {level: CV}}``: CV = sqrt(exp(σ²) − 1) of each level's loading, median.

    Kernel posteriors give ``node``, ``gpu``, ``step``, ``residual`` (None when the level was not
    fitted) and ``gpustep`` when fitted; step posteriors give one class ``step`` with ``run``,
    ``rank``, ``slot``, ``step`` (and ``config`` when fitted). The residual's σ is its log sd
    (:func:`residual_log_sd`). ``bayesprism fit`` prints this table.

    Examples
    --------
    >>> post = xr.Dataset({"gpu_scale": (("chain", "draw", "kernel_class"), [[[0.1], [0.1]]])},
    ...                   coords={"kernel_class": ["gemm"]})
    >>> level_cvs(xr.DataTree.from_dict({"posterior": post}))["gemm"]["gpu"]
    0.10025...
    """
    group = posterior["posterior"].to_dataset()
    if posterior.attrs.get("model_kind") == "step":
        return {"step": {level: _median_cv(group[name].to_numpy()) for level, name in
                         STEP_LEVEL_SCALES.items() if name in group}}
    if "resid_scale" in group:
        # a two-component residual's log sd includes its slow launches
        group["resid_scale"] = residual_log_sd(group)
    names = {level: LEVEL_SCALES[level] for level in CV_LEVELS}
    classes = []
    for name in names.values():
        if name in group and "kernel_class" in group[name].dims:
            classes = [str(c) for c in group[name]["kernel_class"].to_numpy()]
            break
    out: dict = {}
    for cls in classes:
        levels: dict = {}
        for level, name in names.items():
            if name in group and cls in group[name]["kernel_class"]:
                levels[level] = _median_cv(group[name].sel(kernel_class=cls).to_numpy())
            elif level != "gpustep":
                levels[level] = None
        out[cls] = levels
    return out


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


def worst_draws(posterior: xr.DataTree, report: DiagnosisReport, k: int = 6) -> xr.DataTree:
    """The draws of the ``k`` worst-mixing elements, one variable per element, for trace plots.

    Returns a DataTree with a ``posterior`` group whose variables are named by
    :func:`plot_label` of the element label (e.g. ``node_scale[gemm]``) and have dims
    ``chain``, ``draw`` only.
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
        chosen[plot_label(label)] = xr.DataArray(
            flat[:, :, position],
            dims=SAMPLE_DIMS,
            coords={d: post.coords[d] for d in SAMPLE_DIMS if d in post.coords},
        )
    return xr.DataTree.from_dict({"posterior": xr.Dataset(chosen)})


def plot_label(label: str, width: int = 48) -> str:
    """An element label fit for a panel title and a DataTree variable name.

    Long labels (C++ kernel names) keep their start and end around a middle ellipsis; ``/``
    (in GPU and step labels) becomes the look-alike ``∕`` (U+2215), since DataTree variable
    names cannot hold ``/``.
    """
    if len(label) > width:
        head = width * 2 // 3
        label = label[:head] + "…" + label[-(width - head - 1) :]
    return label.replace("/", "\u2215")
