"""Counterfactual forecasts: edit a posterior, recompose a plan on common random numbers, and
summarise per posterior draw (the toolkit of sensitivity, what-if and placement).

Statistics are computed per posterior draw (over that draw's replicates, i.e. step-to-step
variability), then summarised across draws: the point estimate is the mean over draws of the
per-draw value, the interval the 5%–95% quantiles across draws (parameter uncertainty).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from bayesprism.errors import InputError, Problem
from bayesprism.forecast.composition import compose
from bayesprism.forecast.draws import StepDraws

#: Slowdown thresholds reported by default: P(step time > (1 + x) × ideal step time).
THRESHOLDS: tuple[float, ...] = (0.05, 0.10)

__all__ = [
    "THRESHOLDS", "PerDraw", "check_kernel_posterior", "compose_with_seed", "estimate",
    "reduction", "scale_variable", "shift_variable", "summary", "threshold_key",
    "zero_reduction",
]


# --------------------------------------------------------------------------- posterior editing


def scale_variable(
    group: xr.Dataset, name: str, factor: float, **selection: str | Sequence[str]
) -> xr.Dataset:
    """A copy of ``group`` with ``group[name]`` times ``factor`` where ``selection`` holds."""
    out = group.copy()
    var = out[name]
    if not selection:
        out[name] = var * factor
        return out
    mask = xr.ones_like(var, dtype=bool)
    for dim, labels in selection.items():
        labels = [labels] if isinstance(labels, str) else list(labels)
        mask = mask & var[dim].isin(labels)
    out[name] = xr.where(mask, var * factor, var).assign_attrs(var.attrs)
    return out


def shift_variable(group: xr.Dataset, name: str, shift: float, mask: xr.DataArray) -> xr.Dataset:
    """A copy of ``group`` with ``shift`` added to ``group[name]`` where ``mask`` is true."""
    out = group.copy()
    var = out[name]
    out[name] = (var + shift * mask).assign_attrs(var.attrs)
    return out


# --------------------------------------------------------------------------- composing


def compose_with_seed(
    posterior: xr.DataTree,
    plan,
    *,
    replicates: int,
    random_seed: int,
    cluster=None,
    exact: bool | None = None,
    arrays=None,
) -> StepDraws:
    """Compose ``plan`` with a fresh generator seeded by ``random_seed`` (common random numbers);
    ``arrays``: the posterior's ``bayesprism.forecast.workload.posterior_arrays``, when the caller
    composes it many times.

    Counterfactual analyses compose the same plan dozens of times: the warnings of each
    composition are re-issued from this one place, so the default warnings filter shows each
    distinct message once rather than once per composition.
    """
    rng = np.random.default_rng(random_seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = compose(posterior, plan, replicates=replicates, rng=rng, cluster=cluster,
                        exact=exact, arrays=arrays)
    for warning in caught:
        # from one place, so the warnings filter's registry passes each message on once
        warnings.warn(warning.message, warning.category, stacklevel=2)
    return steps


@dataclass(frozen=True)
class PerDraw:
    """Per-posterior-draw statistics of step time over that draw's replicates (arrays ``(draw,)``).

    ``slowdown_p`` has shape ``(draw, threshold)``: the fraction of replicates slower than
    ``(1 + threshold) × ideal_step_time_s``.
    """

    mean_s: np.ndarray
    p50_s: np.ndarray
    p95_s: np.ndarray
    slowdown_p: np.ndarray
    ideal_step_time_s: float

    @classmethod
    def of(cls, step: StepDraws, thresholds: Sequence[float] = THRESHOLDS) -> PerDraw:
        times = np.asarray(step.step_time_s, dtype=float)
        limits = (1.0 + np.asarray(thresholds, dtype=float)) * step.ideal_step_time_s
        return cls(
            mean_s=times.mean(axis=1),
            p50_s=np.quantile(times, 0.5, axis=1),
            p95_s=np.quantile(times, 0.95, axis=1),
            slowdown_p=(times[:, :, None] > limits[None, None, :]).mean(axis=1),
            ideal_step_time_s=float(step.ideal_step_time_s),
        )


def estimate(values: np.ndarray) -> tuple[float, list[float]]:
    """Mean across draws and the 90% interval (5% and 95% quantiles) across draws."""
    values = np.asarray(values, dtype=float)
    lo, hi = np.quantile(values, [0.05, 0.95])
    return float(values.mean()), [float(lo), float(hi)]


def threshold_key(threshold: float) -> str:
    """JSON key of a slowdown threshold: ``0.05 -> "0.05"``, ``0.1 -> "0.1"``."""
    return f"{threshold:g}"


def summary(stats: PerDraw, thresholds: Sequence[float] = THRESHOLDS) -> dict:
    """Point estimates and 90% intervals of one forecast's mean, p50, p95 and P(slowdown)."""
    out: dict = {"ideal_step_time_s": stats.ideal_step_time_s}
    for key in ("mean_s", "p50_s", "p95_s"):
        out[key], out[f"{key[:-2]}_ci90"] = estimate(getattr(stats, key))
    out["slowdown_p"], out["slowdown_p_ci90"] = {}, {}
    for j, x in enumerate(thresholds):
        k = threshold_key(x)
        out["slowdown_p"][k], out["slowdown_p_ci90"][k] = estimate(stats.slowdown_p[:, j])
    return out


def reduction(base: PerDraw, other: PerDraw, thresholds: Sequence[float] = THRESHOLDS) -> dict:
    """How much ``other`` lowers base's p95, mean and P(slowdown): ``base − other`` per draw."""
    out: dict = {}
    out["p95_delta_s"], out["p95_delta_ci90"] = estimate(base.p95_s - other.p95_s)
    out["mean_delta_s"], out["mean_delta_ci90"] = estimate(base.mean_s - other.mean_s)
    out["slowdown_p_delta"], out["slowdown_p_delta_ci90"] = {}, {}
    for j, x in enumerate(thresholds):
        k = threshold_key(x)
        diff = base.slowdown_p[:, j] - other.slowdown_p[:, j]
        out["slowdown_p_delta"][k], out["slowdown_p_delta_ci90"][k] = estimate(diff)
    return out


def zero_reduction(n_draws: int, thresholds: Sequence[float] = THRESHOLDS) -> dict:
    """The reduction of a source that has no spread in any draw (exactly zero, not composed)."""
    zeros = np.zeros(n_draws)
    stats = PerDraw(zeros, zeros, zeros, np.zeros((n_draws, len(thresholds))), 0.0)
    return reduction(stats, stats, thresholds)


def check_kernel_posterior(posterior: xr.DataTree, what: str) -> None:
    """Refuse a posterior this analysis cannot edit (step-level fits have no per-class loadings)."""
    kind = posterior.attrs.get("model_kind", "kernel")
    if kind != "kernel":
        raise InputError(
            Problem(
                "posterior",
                "model_kind",
                f"{what} needs a kernel-level posterior (per-class loadings)",
                example=kind,
            )
        )
