"""Posterior predictive checks of a kernel-level fit against the traced run it was fitted to.

Two checks, NumPy only (no PyMC graph is built):

* **cells** — per kernel class, the observed mean log duration of every cell (kernel × GPU ×
  step) against its posterior predictive distribution;
* **step time** — the traced step time (slowest rank per step) against the composition
  (``bayesprism.forecast.composition.compose``) of the traced plan on the traced nodes.

Cell statistics are read from ``constant_data``/``observed_data`` as the kernel model writes
them: ``cell_kernel`` (position in the ``kernel`` coordinate), ``cell_n`` (launches),
``cell_mean_log`` (mean log duration, µs) and ``cell_gpustep`` (position of the cell's GPU-step),
with the GPU-step's units in ``node_of_gpustep``, ``gpu_of_gpustep``, ``step_of_gpustep``,
``cabinet_of_gpustep`` (positions in ``node``, ``gpu_unit``, ``step_unit``, ``cabinet``).
Per-cell unit indices (``cell_node``, ``cell_gpu_unit``, ``cell_step_unit``,
``cell_cabinet``) are accepted too, as are labels instead of positions. A fitted level whose
units cannot be linked to the cells is predicted marginally over its measured units (said in
a note), which widens the predictive intervals rather than hiding the level.
"""

from __future__ import annotations

import warnings

import numpy as np
import xarray as xr
from scipy import stats

from bayesprism.forecast.composition import compose
from bayesprism.forecast.workload import RESID_SLOW_VARS, has_resid_slow, stretched_slow_sd
from bayesprism.inventory import traced_step_times_us
from bayesprism.plan import Cluster
from bayesprism.posterior import thin_draws, traced_plan

SAMPLE_DIMS = ("chain", "draw")

_CELL_MEAN_NAMES = ("cell_mean_log", "cell_mean", "mean_log")
_CELL_COUNT_NAMES = ("cell_n", "cell_count")
_CELL_KERNEL_NAMES = ("cell_kernel",)
# unit dim -> (effect variable, loading variable, per-cell index name, per-GPU-step index name)
_LEVEL_TERMS = {
    "node": ("node_effect", "node_scale", "cell_node", "node_of_gpustep"),
    "gpu_unit": ("gpu_effect", "gpu_scale", "cell_gpu_unit", "gpu_of_gpustep"),
    "step_unit": ("step_effect", "step_scale", "cell_step_unit", "step_of_gpustep"),
    "cabinet": ("cabinet_effect", "cabinet_scale", "cell_cabinet", "cabinet_of_gpustep"),
}
#: Predicted values kept per class for plots (an ECDF of a few thousand looks the same).
PLOT_VALUES = 4000


def _first(groups: list[xr.Dataset], names: tuple[str, ...]) -> xr.DataArray | None:
    for ds in groups:
        for name in names:
            if name in ds.data_vars or name in ds.coords:
                return ds[name]
    return None


def _positions(index: xr.DataArray, coord: np.ndarray) -> np.ndarray:
    """Integer positions into ``coord`` from an index array of positions or labels."""
    values = index.to_numpy()
    if np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating):
        return values.astype(int)
    lookup = {str(label): i for i, label in enumerate(coord)}
    labels = values.astype(str)
    missing = sorted({v for v in labels if v not in lookup})
    if missing:
        raise KeyError(f"{index.name} has labels not in the posterior: {missing[:3]}")
    return np.array([lookup[v] for v in labels], dtype=int)


def _unit_index(groups: list[xr.Dataset], dim: str, coord: np.ndarray) -> np.ndarray | None:
    """Position of every cell's unit of ``dim``, or None when the fit does not link them."""
    _, _, cell_name, gs_name = _LEVEL_TERMS[dim]
    direct = _first(groups, (cell_name,))
    if direct is not None:
        return _positions(direct, coord)
    gpustep = _first(groups, ("cell_gpustep",))
    of_gs = _first(groups, (gs_name,))
    if gpustep is None or of_gs is None:
        return None
    return _positions(of_gs, coord)[gpustep.to_numpy().astype(int)]


def kernel_classes(posterior: xr.DataTree, kernels: np.ndarray) -> np.ndarray:
    """Class label of each kernel: from the fit's ``kernel_class_of_kernel`` (constant data),
    else from the inventory (``kernel_class`` on dim ``kernel``; ``"unknown"`` for a kernel it
    does not list, such as a per-GPU benchmark's).

    Examples
    --------
    >>> import bayesprism as bp
    >>> fit = bp.load("posterior.nc")  # doctest: +SKIP
    >>> kernel_classes(fit, fit["posterior"].coords["kernel"].to_numpy())[:2]  # doctest: +SKIP
    array(['gemm', 'attention'], dtype='<U9')
    """
    if "constant_data" in posterior.children and \
            "kernel_class_of_kernel" in posterior["constant_data"].data_vars:
        index = posterior["constant_data"]["kernel_class_of_kernel"]
        labels = posterior["posterior"].coords["kernel_class"].to_numpy().astype(str)
        lookup = dict(zip(index.coords["kernel"].to_numpy().astype(str),
                          labels[index.to_numpy().astype(int)], strict=True))
        return np.array([lookup[str(kn)] for kn in kernels])
    if "inventory" in posterior.children and "kernel_class" in posterior["inventory"].data_vars:
        inv = posterior["inventory"]["kernel_class"]
        labels = inv.coords["kernel"].to_numpy().astype(str)
        lookup = dict(zip(labels, inv.to_numpy().astype(str), strict=True))
        return np.array([lookup.get(str(kn), "unknown") for kn in kernels])
    return np.full(len(kernels), "all")


def _gpustep_term(
    post: xr.Dataset, groups: list[xr.Dataset], flat, shape: tuple[int, int],
    rng: np.random.Generator,
) -> np.ndarray:
    """Standardised GPU×step effect of every cell, per draw (draws, cells).

    The Gaussian-residual model integrates it out, so it is drawn anew; the row-level
    likelihoods (Student-t, mixture) sample it as ``gpustep_z``, whose draws are then used,
    as the measured units' effects are.
    """
    gpustep = _first(groups, ("cell_gpustep",))
    if "gpustep_z" in post and gpustep is not None:
        return flat("gpustep_z")[:, gpustep.to_numpy().astype(int).reshape(-1)]
    return rng.standard_normal(shape)


def _residual_cell_mean(
    post: xr.Dataset, flat, c: np.ndarray, n: np.ndarray, rng: np.random.Generator,
    stretch: np.ndarray | None = None,
) -> np.ndarray:
    """Mean of the log residuals of a cell's n launches, drawn per posterior draw (draws, cells).

    Lognormal residual: ``resid_scale[c]·N(0, 1)/√n``. Two-component residual
    (``resid_slow_weight`` present, eps ~ (1 − w)·N(0, σ) + w·N(δ, s)): drawn exactly rather
    than by the CLT (cells often hold a few launches, and with rare slow launches the cell mean
    is far from normal): the number of slow launches is K ~ Binomial(n, w), and given K the
    mean is ``N(K·δ/n, √((n − K)·σ² + K·s²)/n)``. Its mean ``w·δ`` and variance
    ``((1 − w)σ² + w·s² + w(1 − w)δ²)/n`` are those of the mixture. ``stretch`` (draws,
    cells): the step-noise factor of each cell's step, multiplying σ (``s² − σ²`` is kept).
    """
    fitted_sigma = flat("resid_scale")[:, c]
    sigma = fitted_sigma if stretch is None else fitted_sigma * stretch
    noise = rng.standard_normal(sigma.shape)
    if not has_resid_slow(post):
        return sigma * noise / np.sqrt(n)
    weight, shift, slow_sd = (flat(v)[:, c] for v in RESID_SLOW_VARS)
    slow_sd = stretched_slow_sd(slow_sd, fitted_sigma, sigma)
    launches = np.maximum(np.rint(n), 1).astype(np.int64)
    slow = rng.binomial(np.broadcast_to(launches, weight.shape), np.clip(weight, 0.0, 1.0))
    spread = np.sqrt((launches - slow) * sigma**2 + slow * slow_sd**2) / launches
    return slow * shift / launches + spread * noise


def cell_predictive_check(
    posterior: xr.DataTree, rng: np.random.Generator, *, max_draws: int = 400
) -> tuple[dict[str, dict[str, float]], dict[str, tuple[np.ndarray, np.ndarray]], list[str]]:
    """Observed cell means of log duration vs their posterior predictive, per kernel class.

    In every posterior draw the predicted mean log duration of a cell of n launches of kernel k
    (class c) is ``a_k + Σ_level scale_level[c]·effect_level[unit] + gpustep_scale[c]·z
    + resid_scale[c]·ε/√n`` with fresh z, ε ~ N(0, 1) (the transient GPU-step effect is
    integrated out by the Gaussian-residual model, so it is drawn anew; a row-level fit's
    sampled ``gpustep_z`` is used instead). A two-component (slow-launch) residual replaces the
    last term by the exact mean of n mixture residuals (:func:`_residual_cell_mean`). Per
    class: the two-sample KS distance
    between observed and predicted cell means, and the share of observed cells inside their own
    50 % and 90 % predictive intervals.

    Parameters
    ----------
    posterior
        A kernel-level fit.
    rng
        Source of randomness (subsample of draws, z, ε).
    max_draws
        Posterior draws used (a random subsample when there are more).

    Returns
    -------
    (ppc, values, notes)
        ``ppc[class]`` with ``n_cells``, ``ks_distance``, ``coverage_50``, ``coverage_90``,
        ``observed_median_us``, ``predicted_median_us``; ``values[class] = (observed_us,
        predicted_us)`` for plots; notes on what could not be checked or linked.
    """
    post = posterior["posterior"].to_dataset()
    if posterior.attrs.get("model_kind", "kernel") != "kernel" or "kernel_log_median" not in post:
        return {}, {}, ["cell predictive check skipped: not a kernel-level posterior"]
    groups = [
        posterior[g].to_dataset()
        for g in ("constant_data", "observed_data")
        if g in posterior.children
    ]
    observed = _first(groups, _CELL_MEAN_NAMES)
    kernel_index = _first(groups, _CELL_KERNEL_NAMES)
    if observed is None or kernel_index is None:
        return (
            {},
            {},
            [
                "cell predictive check skipped: the fit stores no cell statistics (looked for "
                f"{_CELL_MEAN_NAMES[0]} and {_CELL_KERNEL_NAMES[0]} in constant_data/observed_data)"
            ],
        )
    count = _first(groups, _CELL_COUNT_NAMES)
    y = observed.to_numpy().astype(float).reshape(-1)
    n = np.ones_like(y) if count is None else count.to_numpy().astype(float).reshape(-1)
    notes: list[str] = []

    total = post.sizes["chain"] * post.sizes["draw"]
    take = np.sort(rng.choice(total, size=min(max_draws, total), replace=False))

    def flat(name: str) -> np.ndarray:  # (draws, elements)
        da = post[name]
        rest = [d for d in da.dims if d not in SAMPLE_DIMS]
        return da.transpose(*SAMPLE_DIMS, *rest).to_numpy().reshape(total, -1)[take]

    kernels = post["kernel_log_median"].coords["kernel"].to_numpy()
    k = _positions(kernel_index, kernels)
    class_of_kernel = kernel_classes(posterior, kernels)
    class_names = (
        post.coords["kernel_class"].to_numpy().astype(str)
        if "kernel_class" in post.coords
        else np.unique(class_of_kernel)
    )
    class_pos = {c: i for i, c in enumerate(class_names)}
    c = np.array([class_pos.get(class_of_kernel[i], -1) for i in k])
    n_cells = len(k)
    checked = slice(None)
    if (c < 0).any():
        # a kernel of no known class has no scales to predict with: its cells are left out
        # rather than read with another class's scales
        unknown = c < 0
        notes.append(f"{int(unknown.sum())} cells of kernels the inventory does not list (e.g. "
                     f"{str(kernels[k[unknown][0]])!r}) were not checked: the fit did not store "
                     "their class")
        checked = np.flatnonzero(~unknown)
        y, n, k, c = y[checked], n[checked], k[checked], c[checked]

    mu = flat("kernel_log_median")[:, k]
    for dim, (effect, scale, _, _) in _LEVEL_TERMS.items():
        if effect not in post or scale not in post:
            continue
        effects = flat(effect)
        units = _unit_index(groups, dim, post[effect].coords[dim].to_numpy())
        if units is None:
            notes.append(
                f"cells are not linked to their {dim} (no {_LEVEL_TERMS[dim][3]} in "
                f"constant_data): predicted marginally over the measured {dim} units"
            )
            units_by_draw = rng.integers(effects.shape[1], size=mu.shape)
            level_term = np.take_along_axis(effects, units_by_draw, axis=1)
        else:
            level_term = effects[:, units[checked]]
        mu = mu + flat(scale)[:, c] * level_term
    if "gpustep_scale" in post:
        gpustep = _gpustep_term(post, groups, flat, (mu.shape[0], n_cells), rng)[:, checked]
        mu = mu + flat("gpustep_scale")[:, c] * gpustep
    if "resid_scale" in post:
        stretch = None
        if "step_noise" in post:  # a cell's launches share their step's residual stretch
            units = _unit_index(groups, "step_unit",
                                post["step_noise"].coords["step_unit"].to_numpy())
            if units is None:
                notes.append("cells are not linked to their step: the residual is predicted "
                             "without its step's noise factor")
            else:
                stretch = np.exp(flat("step_noise")[:, units[checked]])
        mu = mu + _residual_cell_mean(post, flat, c, n, rng, stretch)
    if "resid_nu" in post:
        notes.append("Student-t residual: cell means are predicted with a normal residual of sd "
                     "resid_scale/√n (the tails of the cell means are not checked)")
    predicted = mu

    pit = (predicted < y).mean(axis=0)
    ppc: dict[str, dict[str, float]] = {}
    values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    cell_class = np.asarray(class_of_kernel)[k]
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
        shown = pred if pred.size <= PLOT_VALUES else rng.choice(pred, PLOT_VALUES, replace=False)
        values[str(cls)] = (np.exp(y[sel]), np.exp(shown))
    return ppc, values, notes


def step_time_check(
    posterior: xr.DataTree, rng: np.random.Generator, *, max_draws: int = 200
) -> tuple[dict[str, float] | None, list[str]]:
    """Traced step time (first kernel to last end of the step) vs the composition for the
    traced plan.

    The traced plan runs on the traced nodes (their own posterior effects), composed from a
    thinned posterior (at most ``max_draws`` draws, 4 simulated steps each).

    Returns
    -------
    (numbers, notes)
        ``numbers`` (``n_steps``, ``observed_median_s``, ``predicted_median_s``,
        ``predicted_p05_s``, ``predicted_p95_s``, ``coverage_90``, ``ks_distance``) or None
        when the check cannot run; notes say why, or carry the composition's warnings and a
        warning when the traced median lies outside the predicted 90 % interval.
    """
    if (
        "inventory" not in posterior.children
        or "traced_step_time_us" not in posterior["inventory"].data_vars
    ):
        return None, ["step-time check skipped: the inventory has no traced_step_time_us"]
    inventory = posterior["inventory"]
    try:
        plan = traced_plan(posterior)
        nodes = (
            list(dict.fromkeys(inventory["rank_node"].to_numpy().astype(str)))
            if "rank_node" in inventory.data_vars
            else []
        )
        post = posterior["posterior"]
        measured = set(post.coords["node"].to_numpy().astype(str)) if "node" in post.coords else ()
        cluster = Cluster(
            gpus_per_node=plan.gpus_per_node, nodes=tuple(n for n in nodes if n in measured)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            draws = compose(thin_draws(posterior, max_draws), plan, rng=rng, cluster=cluster)
    except Exception as exc:  # a diagnostic must report a failed composition, not crash
        return None, [f"step-time check skipped: composing the traced plan failed ({exc})"]
    if "traced_step_span_us" in inventory.data_vars:  # one step's start to the next's
        traced_s = traced_step_times_us(inventory.to_dataset()) / 1e6
    else:  # inventories written before it: the slowest rank's span
        traced_s = inventory["traced_step_time_us"].max("rank").to_numpy() / 1e6
    traced_s = traced_s[np.isfinite(traced_s)]
    if not traced_s.size:
        return None, ["step-time check skipped: no traced step has a measured time"]
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
    if not lo <= numbers["observed_median_s"] <= hi:
        notes.append(
            f"warning: the traced median step time {numbers['observed_median_s']:.4g} s "
            f"lies outside the predicted 90% interval {lo:.4g}–{hi:.4g} s for the traced plan "
            "(idle gaps, overlap or collectives the composition does not model?)"
        )
    messages = sorted({str(w.message) for w in caught})
    if messages:
        notes.append("step-time check: composition warned: " + "; ".join(messages))
    return numbers, notes
