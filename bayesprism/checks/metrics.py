"""Scores of a predictive distribution, given as draws, against held-out measurements.

Every function takes ``predicted`` either as a 1-D array of draws shared by all observations,
or as a 2-D array of shape ``(n_draws, n_observed)`` whose column j is the predictive
distribution of observation j (e.g. each held-out row predicted in its own context). Scores
that need one distribution for all observations (KS distance, quantile errors) use the
*mixture* of the columns, i.e. all draws pooled, which is the predictive distribution of a
held-out observation picked at random.

Definitions (F is the predictive distribution, y_1..y_m the held-out measurements):

``ks``
    Two-sample Kolmogorov–Smirnov distance sup_x |F̂_pred(x) − F̂_obs(x)| between the
    empirical CDF of the predictive draws and that of the observations (0 = identical,
    1 = disjoint).
``coverage_50``, ``coverage_90``
    Fraction of observations inside the central 50% / 90% predictive interval
    [q_{(1−p)/2}, q_{(1+p)/2}] of their predictive distribution. A calibrated forecast covers
    about p. Observations tied with predictive draws (whole-µs durations) count with the
    probability that their randomised PIT falls inside (:func:`interval_coverage`).
``crps``
    Continuous ranked probability score, mean over observations of
    CRPS(F, y) = E|X − y| − ½ E|X − X'| (X, X' independent draws from F), in the units of
    the data (lower is better; equals the absolute error for a point forecast).
``p50_error``, ``p95_error``
    Signed relative error of a quantile: (q̂_pred − q̂_obs) / q̂_obs for the median and the
    95th percentile. Positive means the forecast is slower (pessimistic) than measured.
``pit``
    Probability integral transform F(y_j) of each observation (ties counted half); uniform on
    [0, 1] for a calibrated forecast, U-shaped when the forecast is too narrow, humped when too
    wide.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

#: Metric names of :func:`score`, in table order.
METRICS: tuple[str, ...] = ("ks", "coverage_50", "coverage_90", "crps", "p50_error", "p95_error")


def _as_arrays(predicted, observed) -> tuple[np.ndarray, np.ndarray]:
    pred = np.asarray(predicted, dtype=float)
    obs = np.asarray(observed, dtype=float).reshape(-1)
    if pred.ndim not in (1, 2):
        raise ValueError(f"predicted must be 1-D or 2-D (draws, observations), got {pred.shape}")
    if pred.ndim == 2 and pred.shape[1] != obs.size:
        raise ValueError(
            f"predicted has {pred.shape[1]} columns but there are {obs.size} observations"
        )
    if pred.shape[0] == 0 or obs.size == 0:
        raise ValueError("need at least one predictive draw and one observation")
    if not (np.all(np.isfinite(pred)) and np.all(np.isfinite(obs))):
        raise ValueError("predicted draws and observations must be finite")
    return pred, obs


def ks_distance(predicted, observed) -> float:
    """Two-sample Kolmogorov–Smirnov distance between predictive draws and observations.

    Parameters
    ----------
    predicted
        Draws, 1-D or ``(n_draws, n_observed)`` (pooled into the mixture).
    observed
        Held-out measurements.

    Returns
    -------
    float
        sup_x |F̂_pred(x) − F̂_obs(x)| in [0, 1] (``scipy.stats.ks_2samp``).
    """
    pred, obs = _as_arrays(predicted, observed)
    # only the statistic is used: the asymptotic method skips the exact p-value, which scipy
    # computes for samples up to 10,000 at up to ~0.1 s a call
    return float(stats.ks_2samp(pred.reshape(-1), obs, method="asymp").statistic)


def interval_coverage(predicted, observed, level: float) -> float:
    """Fraction of observations inside the central ``level`` predictive interval.

    An observation y is inside when its PIT lies in [(1 − level)/2, (1 + level)/2]. When
    predictive draws tie with y (durations recorded on a timer grid, point forecasts), its PIT
    is uniform on [F̂(y−), F̂(y)] (the randomised PIT of discrete forecasts) and it counts with
    the probability that this PIT falls inside, so a calibrated forecast of whole-µs
    durations covers ``level`` instead of more. Without ties this is the fraction inside
    [q_{(1−level)/2}, q_{(1+level)/2}] of its predictive draws.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    below, at_most = _cdf_bounds(*_as_arrays(predicted, observed))
    lo, hi = (1.0 - level) / 2.0, (1.0 + level) / 2.0
    width = at_most - below
    overlap = np.clip(np.minimum(at_most, hi) - np.maximum(below, lo), 0.0, None)
    inside = np.where(width > 0, overlap / np.where(width > 0, width, 1.0),
                      (below >= lo) & (below <= hi))
    return float(np.mean(inside))


def _cdf_bounds(pred: np.ndarray, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """F̂(y−) and F̂(y) of each observation under its predictive draws (1-D: shared)."""
    if pred.ndim == 1:
        x = np.sort(pred)
        below = np.searchsorted(x, obs, side="left")
        at_most = np.searchsorted(x, obs, side="right")
        return below / x.size, at_most / x.size
    below = np.sum(pred < obs[None, :], axis=0)
    at_most = below + np.sum(pred == obs[None, :], axis=0)
    return below / pred.shape[0], at_most / pred.shape[0]


def _mean_abs_difference(sorted_draws: np.ndarray) -> np.ndarray:
    """E|X − X'| of the empirical distribution of sorted draws (along axis 0), O(n) after sort.

    For sorted x_(1) <= ... <= x_(n): Σ_i Σ_j |x_i − x_j| = 2 Σ_i (2i − n − 1) x_(i).
    """
    n = sorted_draws.shape[0]
    weights = 2.0 * np.arange(1, n + 1) - n - 1.0
    weights = weights.reshape((n,) + (1,) * (sorted_draws.ndim - 1))
    return 2.0 * np.sum(weights * sorted_draws, axis=0) / (n * n)


def crps_values(predicted, observed) -> np.ndarray:
    """CRPS of every observation, energy form E|X − y| − ½ E|X − X'| over the draws.

    Computed in O(n log n) for n draws: the draws are sorted once, E|X − X'| comes from the
    sorted order, and (for shared 1-D draws) E|X − y| from cumulative sums at the insertion
    point of y, never from the n² pairs.

    Parameters
    ----------
    predicted
        Draws, 1-D (shared) or ``(n_draws, n_observed)``.
    observed
        Held-out measurements.

    Returns
    -------
    numpy.ndarray
        One CRPS per observation, in the units of the data.
    """
    pred, obs = _as_arrays(predicted, observed)
    x = np.sort(pred, axis=0)
    n = x.shape[0]
    spread = _mean_abs_difference(x)
    if x.ndim == 1:
        below = np.searchsorted(x, obs, side="left")  # draws strictly below y
        cumsum = np.concatenate([[0.0], np.cumsum(x)])
        sum_below = cumsum[below]
        sum_above = cumsum[-1] - sum_below
        abs_error = (obs * below - sum_below + sum_above - obs * (n - below)) / n
    else:
        abs_error = np.mean(np.abs(x - obs[None, :]), axis=0)
    return abs_error - 0.5 * spread


def crps(predicted, observed) -> float:
    """Mean CRPS over the observations (see :func:`crps_values`)."""
    return float(np.mean(crps_values(predicted, observed)))


def quantile_error(predicted, observed, q: float) -> float:
    """Signed relative error of quantile ``q``: (q̂_pred − q̂_obs) / q̂_obs.

    The predictive quantile is taken over all draws (the mixture when ``predicted`` is 2-D);
    both quantiles use linear interpolation (``numpy.quantile``). Positive = forecast slower.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must lie in (0, 1), got {q}")
    pred, obs = _as_arrays(predicted, observed)
    q_obs = float(np.quantile(obs, q))
    if q_obs == 0.0:
        raise ValueError(f"the observed {q}-quantile is 0: a relative error is undefined")
    return (float(np.quantile(pred, q)) - q_obs) / q_obs


def pit_values(predicted, observed) -> np.ndarray:
    """Probability integral transform F̂(y) of each observation under its predictive draws.

    F̂(y) = (#{x < y} + ½ #{x = y}) / n, so a point forecast equal to y gives ½. Uniform on
    [0, 1] when the forecast is calibrated.
    """
    below, at_most = _cdf_bounds(*_as_arrays(predicted, observed))
    return 0.5 * (below + at_most)


def score(predicted, observed) -> dict[str, float]:
    """All scores of :data:`METRICS` for one predictive distribution and its observations.

    Returns
    -------
    dict
        ``{"ks", "coverage_50", "coverage_90", "crps", "p50_error", "p95_error"}`` as floats
        (definitions in this module's docstring).
    """
    pred, obs = _as_arrays(predicted, observed)
    return {
        "ks": ks_distance(pred, obs),
        "coverage_50": interval_coverage(pred, obs, 0.5),
        "coverage_90": interval_coverage(pred, obs, 0.9),
        "crps": crps(pred, obs),
        "p50_error": quantile_error(pred, obs, 0.5),
        "p95_error": quantile_error(pred, obs, 0.95),
    }


def mixture_draws(
    groups: Sequence[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator, size: int = 20_000
) -> np.ndarray:
    """Draws of the mixture of several predictive distributions, weighted by their observations.

    Group g (``(draws_g, observed_g)``) gets ``size · n_g / N`` draws, resampled from its own
    draws, so the mixture is the predictive distribution of an observation picked at random.
    """
    counts = np.array([np.size(obs) for _, obs in groups], dtype=float)
    take = np.maximum(1, np.round(size * counts / counts.sum())).astype(int)
    parts = [
        rng.choice(np.asarray(pred, dtype=float).reshape(-1), n, replace=True)
        for (pred, _), n in zip(groups, take, strict=True)
    ]
    return np.concatenate(parts)


def score_groups(
    groups: Sequence[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator
) -> dict[str, float]:
    """:func:`score` for observations in groups, each with its own predictive draws.

    Coverage and CRPS are computed per observation against its own group's draws and averaged
    over all observations; KS distance and quantile errors compare all observations with the
    mixture of the groups' predictive distributions (:func:`mixture_draws`).

    Parameters
    ----------
    groups
        ``(draws, observed)`` pairs; ``draws`` 1-D (shared by the group's observations).
    rng
        Used to resample the mixture.
    """
    if not groups:
        raise ValueError("need at least one group of observations")
    observed = np.concatenate([np.asarray(obs, dtype=float).reshape(-1) for _, obs in groups])
    n = observed.size
    result = {}
    for level, key in ((0.5, "coverage_50"), (0.9, "coverage_90")):
        result[key] = sum(interval_coverage(p, o, level) * np.size(o) for p, o in groups) / n
    result["crps"] = float(np.concatenate([crps_values(p, o) for p, o in groups]).mean())
    mixture = mixture_draws(groups, rng)
    result["ks"] = ks_distance(mixture, observed)
    result["p50_error"] = quantile_error(mixture, observed, 0.5)
    result["p95_error"] = quantile_error(mixture, observed, 0.95)
    return {key: float(result[key]) for key in METRICS}


def pit_groups(groups: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """PIT values of every observation under its own group's draws (see :func:`pit_values`)."""
    return np.concatenate([pit_values(p, o) for p, o in groups])


def level_and_shape(predicted, observed) -> dict[str, float]:
    """Split the miss of a step forecast into its level and its within-layout shape.

    A forecast at a new layout integrates over that layout's unknown level; within one
    held-out layout, whose runs share one realised level, the pooled scores then mix two
    questions: where the level is, and how the steps spread around it. Here each posterior
    draw's level is its median over replicates (a forecast's replicates are one new run,
    stratified over the noise quantiles), so

    * ``level_error`` is the relative error of the median level, and ``level_lo`` /
      ``level_hi`` the 5 % / 95 % quantiles of the draws' levels relative to the measured
      median (the level's 90 % interval);
    * the shape scores (``shape_ks``, ``shape_coverage_90``, ``shape_p95_error``) are those of
      the forecast with every draw moved to the measured median, i.e. of the within-layout
      spread alone (what the noise and spike model control).

    Parameters
    ----------
    predicted
        Draws of shape ``(n_draws, n_replicates)``, several replicates per draw (more
        replicates, less noise in each draw's level).
    observed
        The held-out measurements of one layout (all of its runs).

    Returns
    -------
    dict
        ``level_error``, ``level_lo``, ``level_hi``, ``shape_ks``, ``shape_coverage_90`` and
        ``shape_p95_error`` as floats.

    Raises
    ------
    ValueError
        ``predicted`` is not 2-D with at least two replicates, or values are not finite.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> noise = np.exp(0.01 * rng.standard_normal((400, 64)))
    >>> predicted = 1.1 * noise                   # right spread, level 10 % high
    >>> observed = np.exp(0.01 * rng.standard_normal(500))
    >>> split = level_and_shape(predicted, observed)
    >>> round(split["level_error"], 2), split["shape_ks"] < 0.1
    (0.1, True)
    """
    pred = np.asarray(predicted, dtype=float)
    obs = np.asarray(observed, dtype=float).reshape(-1)
    if pred.ndim != 2 or pred.shape[1] < 2:
        raise ValueError(f"predicted must be (draws, replicates) with >= 2 replicates, "
                         f"got shape {pred.shape}")
    _as_arrays(pred.reshape(-1), obs)
    level = np.median(pred, axis=1)
    measured = float(np.median(obs))
    moved = (pred / level[:, None] * measured).reshape(-1)
    lo, mid, hi = np.quantile(level, [0.05, 0.5, 0.95]) / measured - 1.0
    return {"level_error": float(mid), "level_lo": float(lo), "level_hi": float(hi),
            "shape_ks": ks_distance(moved, obs),
            "shape_coverage_90": interval_coverage(moved, obs, 0.9),
            "shape_p95_error": quantile_error(moved, obs, 0.95)}


def cluster_sample_check(reference, clusters, observed_clusters: Sequence, *,
                         resamples: int = 500, random_seed: int = 0) -> dict[str, float]:
    """How the scores against a clustered truth compare with those of the forecast itself.

    A truth made of a few clusters (new random nodes, many steps each) is a small sample: its
    steps share each cluster's nodes. A forecast scored against it can miss a KS goal by
    chance alone, and a wrong spread between clusters hides in the pooled scores. Here
    ``len(observed_clusters)`` whole clusters are drawn from the forecast's own simulated ones,
    each cut to its observed cluster's length, and scored against the pooled forecast; the
    observed sample is compared with that sampling distribution. The truth's clusters share
    one fleet (its hidden parameters), so a calibrated sample takes all its clusters from one
    posterior draw when ``clusters`` is grouped by draw (3-D); clusters of different draws
    also differ by the posterior's uncertainty, which the truth's do not, and then a right
    forecast looks too spread between clusters.

    * ``ks`` and ``ks_null_q50`` / ``ks_null_q90``: the observed KS distance and the median /
      90th percentile of a calibrated sample's; ``ks_p_value``: the share of calibrated
      samples at least as far off (small: the miss is the forecast's, not chance);
    * ``spread`` and ``spread_null_q50``: the interquartile range of the clusters' median
      steps relative to their median, observed and the forecast's typical one;
      ``spread_p_low`` / ``spread_p_high``: the shares of calibrated samples at most / at
      least as spread (small ``spread_p_low``: the forecast's clusters differ more than the
      truth's);
    * ``p50_error`` / ``p95_error``, ``p50_null_q05`` … ``p95_null_q95`` and ``p50_p_value`` /
      ``p95_p_value``: the observed quantile errors (:func:`quantile_error`), the 5 % and 95 %
      quantiles of a calibrated sample's error, and the two-sided share of calibrated samples
      at least as far out (a few clusters' 95th percentile scatters by several per cent);
    * ``coverage_90``, ``coverage_90_null_q05`` / ``coverage_90_null_q95`` and
      ``coverage_90_p_value``: the same for the share of the truth's steps inside the pooled
      forecast's central 90 % interval (:func:`interval_coverage`): a few clusters, each
      with its own nodes, are inside together or outside together.

    Parameters
    ----------
    reference
        The pooled predictive draws of one step (1-D), e.g. ``step_time_s`` of the plan.
    clusters
        Simulated clusters of the same forecast, shape ``(n_draws, n_clusters, n_steps)``:
        per posterior draw, clusters on new nodes and their consecutive steps, at least as
        many clusters per draw as observed ones and as many steps as the longest observed
        cluster. Shape ``(n_clusters, n_steps)``: each cluster of its own draw.
    observed_clusters
        The truth's clusters: one 1-D array of step times per cluster.
    resamples
        Calibrated samples drawn.
    random_seed
        Seed of the resampling.

    Returns
    -------
    dict
        ``ks``, ``ks_null_q50``, ``ks_null_q90``, ``ks_p_value``, ``spread``,
        ``spread_null_q50``, ``spread_p_low``, ``spread_p_high``, for ``p50`` and ``p95``
        ``*_error``, ``*_null_q05``, ``*_null_q95`` and ``*_p_value``, and ``coverage_90`` with
        its ``_null_q05``, ``_null_q95`` and ``_p_value``, as floats.

    Raises
    ------
    ValueError
        Fewer simulated clusters (per draw) than observed ones, simulated clusters shorter
        than an observed one, or values that are not finite.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> def simulate(n, spread):  # cluster levels, then steps around them
    ...     return np.exp(spread * rng.standard_normal((n, 1))
    ...                   + 0.01 * rng.standard_normal((n, 100)))
    >>> forecast = simulate(400, 0.02)
    >>> truth = list(simulate(12, 0.002))           # clusters 10x closer than forecast
    >>> check = cluster_sample_check(forecast.ravel(), forecast, truth, resamples=200)
    >>> check["spread_p_low"] < 0.01
    True
    """
    pooled = np.asarray(reference, dtype=float).reshape(-1)
    simulated = np.asarray(clusters, dtype=float)
    observed = [np.asarray(c, dtype=float).reshape(-1) for c in observed_clusters]
    grouped = simulated.ndim == 3
    per_sample = simulated.shape[-2] if grouped else simulated.shape[0]
    if simulated.ndim not in (2, 3) or per_sample < len(observed):
        raise ValueError(f"need (clusters, steps) or (draws, clusters, steps) with at least "
                         f"{len(observed)} simulated clusters (per draw), got shape "
                         f"{simulated.shape}")
    longest = max(c.size for c in observed)
    if simulated.shape[-1] < longest:
        raise ValueError(f"simulated clusters have {simulated.shape[-1]} steps, an observed one "
                         f"{longest}")
    observed_steps = np.concatenate(observed)
    _as_arrays(pooled, observed_steps)
    _as_arrays(simulated.reshape(-1), observed_steps)

    def spread(groups) -> float:
        medians = np.array([np.median(g) for g in groups])
        q25, q50, q75 = np.quantile(medians, [0.25, 0.5, 0.75])
        return float((q75 - q25) / q50)

    # scores of a sample compared two-sided with a calibrated sample's
    two_sided = {"p50_error": lambda sample: quantile_error(pooled, sample, 0.5),
                 "p95_error": lambda sample: quantile_error(pooled, sample, 0.95),
                 "coverage_90": lambda sample: interval_coverage(pooled, sample, 0.9)}
    rng = np.random.default_rng(random_seed)
    null_ks, null_spread = np.empty(resamples), np.empty(resamples)
    null_score = {name: np.empty(resamples) for name in two_sided}
    for i in range(resamples):
        pool = simulated[rng.integers(simulated.shape[0])] if grouped else simulated
        picked = [pool[j, :c.size] for j, c in
                  zip(rng.choice(pool.shape[0], len(observed), replace=False), observed,
                      strict=True)]
        sample = np.concatenate(picked)
        null_ks[i] = ks_distance(pooled, sample)
        null_spread[i] = spread(picked)
        for name, statistic in two_sided.items():
            null_score[name][i] = statistic(sample)
    ks = ks_distance(pooled, observed_steps)
    observed_spread = spread(observed)
    checks = {"ks": ks, "ks_null_q50": float(np.median(null_ks)),
              "ks_null_q90": float(np.quantile(null_ks, 0.9)),
              "ks_p_value": float(np.mean(null_ks >= ks)),
              "spread": observed_spread, "spread_null_q50": float(np.median(null_spread)),
              "spread_p_low": float(np.mean(null_spread <= observed_spread)),
              "spread_p_high": float(np.mean(null_spread >= observed_spread))}
    for name, statistic in two_sided.items():
        value, null = statistic(observed_steps), null_score[name]
        low, high = np.quantile(null, [0.05, 0.95])
        # p50_error -> p50_null_q05; coverage_90 -> coverage_90_null_q05
        prefix = name.removesuffix("_error")
        checks |= {name: value, f"{prefix}_null_q05": float(low),
                   f"{prefix}_null_q95": float(high),
                   f"{prefix}_p_value": float(min(1.0, 2 * min(np.mean(null <= value),
                                                               np.mean(null >= value))))}
    return checks
