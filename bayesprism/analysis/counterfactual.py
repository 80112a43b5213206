"""Counterfactual forecasts: edit a posterior, recompose a plan on common random numbers, and
summarise per posterior draw (the toolkit of sensitivity, what-if and placement).

Statistics are computed per posterior draw (over that draw's replicates, i.e. step-to-step
variability), then summarised across draws: the point estimate is the mean over draws of the
per-draw value, the interval the 5%–95% quantiles across draws (parameter uncertainty).

Slowdown thresholds are ratios, as in ``bayesprism.forecast``: 1.05 asks for P(step time >
1.05 × ideal step time), i.e. 5 % over, and results are keyed ``"1.05"``. The fraction spelling
of earlier releases (0.05) is still accepted, with a ``FutureWarning``
(:func:`slowdown_ratios`).
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
from bayesprism.forecast.forecasting import threshold_key

#: Slowdown thresholds reported by default, as ratios: P(step time > x × ideal step time).
THRESHOLDS: tuple[float, ...] = (1.05, 1.10)

__all__ = [
    "THRESHOLDS", "PerDraw", "check_kernel_posterior", "compose_with_seed", "estimate",
    "reduction", "scale_variable", "shift_variable", "slowdown_ratios", "summary",
    "zero_reduction",
]


def slowdown_ratios(thresholds: Sequence[float]) -> list[float]:
    """Slowdown thresholds as ratios (1.05: 5 % over the ideal step time).

    A value below 1 is the fraction spelling of earlier releases (0.05 for 5 % over): it is
    read as ``1 + x`` with a ``FutureWarning``; it will be an error in the next release.

    Examples
    --------
    >>> slowdown_ratios([1.05, 1.1])
    [1.05, 1.1]
    """
    ratios = [float(x) for x in thresholds]
    bad = [x for x in ratios if not x > 0]
    if bad:
        raise InputError(Problem("arguments", "thresholds", "must be ratios above 0 (1.05: "
                                 "5 % over the ideal step time)", example=bad[0]))
    old = [x for x in ratios if x < 1]
    if old:
        warnings.warn(
            f"thresholds {', '.join(f'{x:g}' for x in old)} read as fractions over the ideal "
            f"step time ({', '.join(f'{1 + x:g}' for x in old)} as ratios); thresholds are "
            "ratios now (1.05 = 5 % over), give those: fractions will be an error in the next "
            "release", FutureWarning, stacklevel=3)
    return [1.0 + x if x < 1 else x for x in ratios]


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
    ``threshold × ideal_step_time_s`` (a ratio: 1.05 is 5 % over).
    """

    mean_s: np.ndarray
    p50_s: np.ndarray
    p95_s: np.ndarray
    slowdown_p: np.ndarray
    ideal_step_time_s: float

    @classmethod
    def of(cls, step: StepDraws, thresholds: Sequence[float] = THRESHOLDS) -> PerDraw:
        times = np.asarray(step.step_time_s, dtype=float)
        limits = np.asarray(thresholds, dtype=float) * step.ideal_step_time_s
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
