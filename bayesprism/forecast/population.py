"""Populations of standardised unit effects (nodes, GPUs): draws and tail quantiles for new units.

A fitted kernel-level posterior describes each level's *population* of standardised effects
(location 0, scale 1) by a family named in ``posterior.attrs[f"{level}_population"]``:

``normal``
    z ~ N(0, 1).
``student_t``
    z ~ t(ν, 0, 1) with ν = ``{level}_nu`` in every posterior draw.
``mixture``
    z ~ (1 − w)·N(0, 1) + w·N(shift, 1), w = ``{level}_slow_weight``,
    shift = ``{level}_slow_shift`` (the slow, degraded component).
``degraded``
    z ~ (1 − w)·N(0, 1) + w·N(shift, slow_sd): as ``mixture``, but the degraded component has a
    spread of its own, slow_sd = ``{level}_slow_sd`` ≥ 1 (shift and slow_sd in core sds).

Forecasts at scales never measured draw new units from these populations, once per posterior
draw, so the uncertainty of the tail (ν, w, shift) carries into the maximum over 10^4 GPUs.
NumPy/SciPy only: no graph is ever compiled here.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from bayesprism.posterior import draw_count, flat_draws, posterior_dataset

POPULATION_FAMILIES: tuple[str, ...] = ("normal", "student_t", "mixture", "degraded")
#: Families of two normal components: a core N(0, 1) and a slow one N(shift, slow_sd).
TWO_COMPONENT: tuple[str, ...] = ("mixture", "degraded")


def population_family(posterior, level: str) -> str:
    """The population family of ``level`` (``"node"``, ``"gpu"``, ...) recorded in the posterior.

    Raises
    ------
    KeyError
        If the posterior has no ``{level}_population`` attribute (the level was not fitted).
    ValueError
        If the family is not one of :data:`POPULATION_FAMILIES`.
    """
    ds = posterior_dataset(posterior)
    key = f"{level}_population"
    if key not in ds.attrs:
        raise KeyError(f"posterior has no attribute {key!r}: level {level!r} was not fitted")
    family = str(ds.attrs[key])
    if family not in POPULATION_FAMILIES:
        raise ValueError(f"{key} = {family!r}; expected one of {POPULATION_FAMILIES}")
    return family


def population_parameters(posterior, level: str) -> dict[str, np.ndarray | str]:
    """Family and per-draw parameters of a level's population (arrays of shape (chain*draw,))."""
    ds = posterior_dataset(posterior)
    family = population_family(ds, level)
    params: dict[str, np.ndarray | str] = {"family": family}
    if family == "student_t":
        params["nu"] = flat_draws(ds[f"{level}_nu"])
    elif family in TWO_COMPONENT:
        params["weight"] = flat_draws(ds[f"{level}_slow_weight"])
        params["shift"] = flat_draws(ds[f"{level}_slow_shift"])
        params["slow_sd"] = (flat_draws(ds[f"{level}_slow_sd"]) if family == "degraded"
                             else np.ones_like(params["shift"]))
    params["n_draws"] = np.asarray(draw_count(ds))
    return params


def draw_effects(posterior, level: str, n_units: int, rng: np.random.Generator) -> np.ndarray:
    """Standardised effects of ``n_units`` *new* units, drawn from each posterior draw's population.

    Parameters
    ----------
    posterior
        The ``posterior`` group (Dataset) or the whole fit (DataTree).
    level
        ``"node"`` or ``"gpu"`` (any level with a ``{level}_population`` attribute).
    n_units
        Number of new units per posterior draw.
    rng
        Source of randomness.

    Returns
    -------
    numpy.ndarray
        Shape ``(chain*draw, n_units)``; row i uses the population of posterior draw i
        (chain-major). Multiply by the level's loading (e.g. ``node_scale[c]``) for log effects.
    """
    if n_units < 0:
        raise ValueError(f"n_units must be >= 0, got {n_units}")
    p = population_parameters(posterior, level)
    n = int(p["n_draws"])
    if p["family"] == "normal":
        return rng.standard_normal((n, n_units))
    if p["family"] == "student_t":
        return rng.standard_t(p["nu"][:, None], size=(n, n_units))
    slow = rng.random((n, n_units)) < p["weight"][:, None]
    spread = np.where(slow, p["slow_sd"][:, None], 1.0)
    return rng.standard_normal((n, n_units)) * spread + slow * p["shift"][:, None]


def _expand(param: np.ndarray, x: np.ndarray) -> np.ndarray:
    return param.reshape((-1,) + (1,) * x.ndim)


def episode_effect(shift, sd, z) -> np.ndarray:
    """A GPU×step episode's standardised effect from standard normal draws ``z``: N(shift,
    sd²) truncated to > 0 (``bayesprism.model.kernel``: an episode slows its GPU-step), by
    the inverse CDF, so a larger ``z`` gives a larger effect (arguments broadcast).

    Examples
    --------
    >>> episode_effect(10.0, 1.0, np.array([-1.0, 0.0, 1.0])).round(6).tolist()
    [9.0, 10.0, 11.0]
    >>> round(float(episode_effect(1.0, 2.0, -40.0)), 9)  # the truncation point
    0.0
    """
    upper = special.ndtr(-np.asarray(z, dtype=float)) * special.ndtr(np.divide(shift, sd))
    return np.maximum(shift - sd * special.ndtri(upper), 0.0)


def episode_tail_weight(weight, shift, sd) -> np.ndarray:
    """Weight of an untruncated N(shift, sd²) component whose upper tail is the truncated
    episode's (:func:`episode_effect`): ``weight / Φ(shift/sd)``, at most 1. The truncation
    only removes the episode's lower tail, where no maximum lands.

    Examples
    --------
    >>> float(episode_tail_weight(0.01, 0.0, 1.0))
    0.02
    """
    return np.minimum(np.divide(weight, special.ndtr(np.divide(shift, sd))), 1.0)


def mixture_sf(weight, shift, slow_sd, x) -> np.ndarray:
    """P(z > x) of z ~ (1 − w)·N(0, 1) + w·N(shift, slow_sd) (arguments broadcast)."""
    return (1.0 - weight) * special.ndtr(-x) + weight * special.ndtr((shift - x) / slow_sd)


def _isf(p: dict, tail: np.ndarray) -> np.ndarray:
    """Inverse survival function: x with P(z > x) = tail, per draw; tail broadcast to (n, ...)."""
    if p["family"] == "normal":
        return -special.ndtri(tail)
    if p["family"] == "student_t":
        nu = p["nu"].reshape((-1,) + (1,) * (tail.ndim - 1))
        return -special.stdtrit(nu, tail)
    # Mixture: no closed form. The quantile lies between the component quantiles, so bisect
    # in that bracket (60 halvings reach machine precision for any bracket width used here).
    w, shift, slow_sd = (p[k].reshape((-1,) + (1,) * (tail.ndim - 1))
                         for k in ("weight", "shift", "slow_sd"))
    base = -special.ndtri(tail)
    lo = np.minimum(base, shift + slow_sd * base)
    hi = np.maximum(base, shift + slow_sd * base)
    lo, hi = np.broadcast_arrays(lo, hi)
    lo, hi = lo.copy(), hi.copy()
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        sf_mid = mixture_sf(w, shift, slow_sd, mid)
        above = sf_mid > tail  # quantile is further right
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return 0.5 * (lo + hi)


def population_quantile(posterior, level: str, q) -> np.ndarray:
    """Quantile(s) ``q`` of the population in every posterior draw.

    Returns an array of shape ``(chain*draw,) + np.shape(q)``. Upper quantiles are computed
    from the survival side, so q = 1 − 1e-12 keeps its precision.
    """
    q = np.asarray(q, dtype=float)
    if np.any((q <= 0) | (q >= 1)):
        raise ValueError("quantile levels must lie strictly between 0 and 1")
    p = population_parameters(posterior, level)
    n = int(p["n_draws"])
    tail = np.broadcast_to(1.0 - q, (n, *q.shape))
    return _isf(p, tail)
