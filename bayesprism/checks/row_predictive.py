"""Posterior predictive of kernel-table rows, each in its own context (``predict_rows``).

Every row (one kernel launch, or one benchmark run on one GPU) is simulated from a kernel-level
posterior (or a baseline's degenerate posterior): the fitted effects where its node, GPU, step
or cabinet was fitted, new effects from the level's population
(``bayesprism.forecast.population.draw_effects``) where not, the fitted residual law, and with
``step_noise`` its step's residual stretch (a new step is a fitted one, level and noise
together, picked as often as its runs were measured). Used by ``bayesprism.checks.validate`` for
held-out scores and slowest-of-k.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism.forecast.composition import DEFAULT_MAX_SLOWDOWN
from bayesprism.forecast.population import draw_effects
from bayesprism.forecast.workload import (
    fitted_step_weights,
    has_resid_slow,
    stretched_slow_sd,
)
from bayesprism.posterior import flat_draws
from bayesprism.schema import signature_as_kernel

__all__ = ["predict_rows"]


class _DrawPicker:
    """Posterior draws used for n predictive draws; new units get fresh effects per use."""

    def __init__(self, n_samples: int, n: int, rng: np.random.Generator):
        reps = math.ceil(n / n_samples)
        order = np.concatenate([rng.permutation(n_samples) for _ in range(reps)])[:n]
        self.index = order
        self.occurrence = np.arange(n) // n_samples
        self.reps = reps
        self.n_samples = n_samples

    def take(self, flat: np.ndarray) -> np.ndarray:
        return flat[self.index]

    def new_effects(
        self, posterior: xr.Dataset, level: str, n_units: int, rng: np.random.Generator
    ) -> np.ndarray:
        if n_units == 0:
            return np.zeros((self.index.size, 0))
        if f"{level}_population" in posterior.attrs:
            z = draw_effects(posterior, level, n_units * self.reps, rng)
        else:  # levels without a recorded family (step, cabinet) are standard normal
            z = rng.standard_normal((self.n_samples, n_units * self.reps))
        z = z.reshape(self.n_samples, self.reps, n_units)
        return z[self.index, self.occurrence]


def _unit_values(posterior, picker, rng, effect_var, level, unit_dim, labels, resample=None):
    """``effect_var`` of each row's unit per (draw, row): its fitted value where the unit was
    fitted, else a fresh draw from the level's population, or with ``resample = (seed,
    weights)`` the value of a fitted unit picked per draw with those probabilities (None:
    equal; the same picks for every variable resampled with the same seed)."""
    codes, uniques = pd.factorize(pd.Series(labels, dtype=str), sort=True)
    values = np.empty((picker.index.size, len(uniques)))
    fitted = (
        set(posterior[effect_var].coords[unit_dim].to_numpy().astype(str))
        if effect_var in posterior
        else set()
    )
    known = np.array([u in fitted for u in uniques], dtype=bool)
    if known.any():
        da = posterior[effect_var].sel({unit_dim: list(uniques[known])})
        values[:, known] = picker.take(flat_draws(da))
    n_new = int((~known).sum())
    if resample is not None and n_new:
        seed, weights = resample
        every = picker.take(flat_draws(posterior[effect_var]))
        picks = np.random.default_rng(seed).choice(every.shape[1], p=weights,
                                                   size=(every.shape[0], n_new))
        values[:, ~known] = np.take_along_axis(every, picks, axis=1)
        return values[:, codes]
    values[:, ~known] = picker.new_effects(posterior, level, n_new, rng)
    return values[:, codes]


def _level_term(posterior, picker, rng, level, unit_dim, labels, class_codes, classes,
                resample=None):
    """loading[c] · effect[unit] per (draw, row), fitted effect where the unit was fitted."""
    loading = posterior[f"{level}_scale"].sel(kernel_class=classes)
    loading = picker.take(flat_draws(loading))[:, class_codes]
    return loading * _unit_values(posterior, picker, rng, f"{level}_effect", level, unit_dim,
                                  labels, resample=resample)


def predict_rows(
    posterior: xr.DataTree, rows: pd.DataFrame, *, draws: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior predictive draws of the duration (µs) of every row, in its own context.

    Parameters
    ----------
    posterior
        A kernel-level posterior (or a degenerate baseline posterior).
    rows
        Trace-table rows to predict (columns ``run, step, node, gpu, kernel, kernel_class``,
        optional ``cabinet``).
    draws
        Predictive draws per row (posterior draws are reused, new units redrawn, when fewer).
    rng
        Source of randomness.

    Returns
    -------
    (durations, predictable)
        ``durations`` of shape ``(draws, n_predictable)``, each at most
        ``DEFAULT_MAX_SLOWDOWN`` times its kernel's typical time (the composition's cap, see
        ``bayesprism.forecast.composition``), and the boolean mask of rows whose
        kernel has a ``kernel_log_median`` (kernels modelled only by the collective cost model,
        or never fitted, are not predicted here).
    """
    post = posterior["posterior"].to_dataset() if isinstance(posterior, xr.DataTree) else posterior
    post = post.assign_attrs({**dict(getattr(posterior, "attrs", {})), **dict(post.attrs)})
    kernels = post["kernel_log_median"].coords["kernel"].to_numpy().astype(str)
    rows = signature_as_kernel(rows)  # the fit's kernels are signatures (bayesprism.inference)
    row_kernels = rows["kernel"].astype(str).to_numpy()
    predictable = np.isin(row_kernels, kernels)
    rows = rows.loc[predictable]
    picker = _DrawPicker(post.sizes["chain"] * post.sizes["draw"], draws, rng)
    kernel_pos = pd.Index(kernels).get_indexer(row_kernels[predictable])
    log_median = picker.take(flat_draws(post["kernel_log_median"]))[:, kernel_pos]
    log_d = np.zeros_like(log_median)  # the launch's log multiplier, every level and residual
    class_codes, classes = pd.factorize(rows["kernel_class"].astype(str), sort=True)
    classes = list(classes)
    node = rows["node"].astype(str).to_numpy()
    gpu_unit = node + "/" + rows["gpu"].astype(str).to_numpy()
    step_unit = rows["run"].astype(str).to_numpy() + "/" + rows["step"].astype(str).to_numpy()
    levels = [
        ("node", "node", node),
        ("gpu", "gpu_unit", gpu_unit),
        ("step", "step_unit", step_unit),
    ]
    if "cabinet" in rows.columns:
        levels.append(("cabinet", "cabinet", rows["cabinet"].astype(str).to_numpy()))
    # With step_noise a new step is a fitted step, level and noise together (a warm-up repeat
    # is both slower and noisier; a normal population of each, drawn independently, knows
    # neither that nor that it happens once per run), picked as often as its runs were
    # measured (PAL Longhorn: two steps 2.5x slow, run by 24 of 1,404 GPU-steps).
    step_resample = ((int(rng.integers(2**63)), fitted_step_weights(posterior))
                     if "step_noise" in post else None)
    for level, unit_dim, labels in levels:
        if f"{level}_scale" in post:
            log_d += _level_term(post, picker, rng, level, unit_dim, labels, class_codes, classes,
                                 resample=step_resample if level == "step" else None)
    n = len(rows)
    if "gpustep_scale" in post:
        cell = pd.factorize(pd.Series(gpu_unit + "|" + step_unit))[0]
        n_cells = int(cell.max()) + 1 if n else 0
        loading = picker.take(flat_draws(post["gpustep_scale"].sel(kernel_class=classes)))
        log_d += loading[:, class_codes] * rng.standard_normal((draws, n_cells))[:, cell]
    stretch = None
    if "step_noise" in post:  # a noisy step stretches its residual (spec step_noise)
        stretch = np.exp(_unit_values(post, picker, rng, "step_noise", "step_noise",
                                      "step_unit", step_unit, resample=step_resample))
    log_d += _residual_draws(post, picker, classes, class_codes, rng, stretch)
    # As in the composition: a launch more than max_slowdown times its typical time is a dead
    # GPU, not a slow one (heavy-tailed populations fitted on few units reach e^40 otherwise).
    return np.exp(log_median + np.minimum(log_d, math.log(DEFAULT_MAX_SLOWDOWN))), predictable


def _residual_draws(
    post: xr.Dataset,
    picker: _DrawPicker,
    classes: list[str],
    class_codes: np.ndarray,
    rng: np.random.Generator,
    stretch: np.ndarray | None = None,
) -> np.ndarray:
    """One launch residual (log scale) per (draw, row) under the fitted residual distribution.

    ``lognormal``: ``resid_scale·N(0, 1)``; ``student_t`` (``resid_nu`` present):
    ``resid_scale·t(ν)``; ``mixture`` (``resid_slow_weight`` present): with probability
    ``resid_slow_weight`` a slow launch ``N(resid_slow_shift, resid_slow_sd)``, else the core
    ``N(0, resid_scale)``. ``stretch`` (draw, row): each row's step-noise factor, multiplying
    ``resid_scale`` (the slow component keeps its shift and extra spread).
    """

    def per_row(name: str) -> np.ndarray:
        da = post[name].broadcast_like(post["resid_scale"]).sel(kernel_class=classes)
        return picker.take(flat_draws(da))[:, class_codes]

    fitted_scale = per_row("resid_scale")
    scale = fitted_scale if stretch is None else fitted_scale * stretch
    if "resid_nu" in post:  # Student-t residual
        return scale * rng.standard_t(per_row("resid_nu"))
    residual = scale * rng.standard_normal(scale.shape)
    if has_resid_slow(post):  # two-component (slow-launch) residual
        slow = rng.random(scale.shape) < per_row("resid_slow_weight")
        slow_sd = stretched_slow_sd(per_row("resid_slow_sd"), fitted_scale, scale)
        slow_draws = per_row("resid_slow_shift") + slow_sd * rng.standard_normal(scale.shape)
        residual = np.where(slow, slow_draws, residual)
    return residual
