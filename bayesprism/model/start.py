"""Data estimates that centre and scale the data-dominated coordinates of the kernel model.

With millions of launches, kernel baselines and unit effects are pinned by the data to a tiny
fraction of their prior width (measured on the fit benchmark: GPU effects ±0.004 against a
population sd of 0.04, kernel baselines ±1e-4). Sampled as raw values, nutpie's start jitter
(±1 on every unconstrained coordinate) puts them hundreds of posterior sds away, and the
warm-up transient leaks into the mass-matrix estimate: one chain of the benchmark adapted to 59
leapfrog steps per draw, the other to 15. So these coordinates are sampled as
``estimate + standard_error × z`` with both taken from the data by simple weighted means (a
constant affine map: the posterior is unchanged, only its coordinates move), which makes the
jitter a few posterior sds and the start nearly stationary.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# scipy.stats is imported where a start value needs it (start-up time).

#: Smallest standard error used to scale a coordinate (log units).
MIN_SE = 1e-6
#: Smallest standard error of a log loading ratio's start (a ratio the data pin exactly
#: still moves by a tenth of a percent per unit of its coordinate).
MIN_RATIO_SE = 1e-3
#: Reliability of the unit estimates from which a level is sampled fully centred
#: (:func:`centred_share`).
CENTRED_RELIABILITY = 0.95


def _weighted_mean(values, weights, index, size):
    total = np.bincount(index, weights=weights, minlength=size)
    return np.bincount(index, weights=weights * values, minlength=size) / np.maximum(total, 1e-300)


def _within_se(values, weights, index, size, unknown: float = 1.0) -> float:
    """Typical standard error of a per-unit weighted mean of ``values`` (median over units);
    ``unknown`` when no unit has two values."""
    mean = _weighted_mean(values, weights, index, size)
    count = np.bincount(index, minlength=size)
    var = _weighted_mean((values - mean[index]) ** 2, weights, index, size)
    ok = count > 1
    if not ok.any():
        return unknown
    return float(max(np.median(np.sqrt(var[ok] / count[ok])), MIN_SE))


def _centre(values, weights, group):
    """Subtract each group's weighted mean (the likelihood sees effects centred in groups)."""
    group = np.asarray(group)
    return values - _weighted_mean(values, weights, group, int(group.max()) + 1)[group]


def _reference_classes(data: dict) -> np.ndarray:
    """Mask of the kernel classes whose loadings define the reference class (the compute
    classes when there are any: ``class_reference_weights``)."""
    weights = data.get("class_reference_weights")
    if weights is None:
        return np.ones(data["block_n"].shape[1], dtype=bool)
    return np.asarray(weights) > 0


def _block_residuals(data: dict) -> tuple[np.ndarray, np.ndarray]:
    """Launches per GPU-step and their mean log deviation from their kernels' means, over the
    reference classes (a collective's transfer barely moves with its GPU: pooled in, it would
    pull every unit's estimate towards zero and inflate a GPU-step's noise)."""
    mask = _reference_classes(data)
    block_n = data["block_n"][:, mask].sum(axis=1)
    return block_n, data["block_dev"][:, mask].sum(axis=1) / np.maximum(block_n, 1e-300)


def unit_effect_estimates(data: dict, levels: list[str]) -> dict[str, tuple[np.ndarray, float]]:
    """Per level, the estimated unit effects (centred in their groups) and their standard error.

    Block residuals (mean log deviation of a GPU-step's launches from their kernels' means,
    all classes pooled) are swept into step, cabinet, node and GPU effects by weighted means;
    a unit's standard error is the spread of what remains over its blocks (NaN when no unit
    has two blocks, e.g. one profiled step per GPU).
    """
    block_n, block_r = _block_residuals(data)
    gs_gpu, gs_step = data["gpustep_gpu"], data["gpustep_step"]
    n_gpu, n_step = int(gs_gpu.max()) + 1, int(gs_step.max()) + 1
    effects: dict[str, np.ndarray] = {}
    unit_of_block: dict[str, np.ndarray] = {}
    remaining = block_r.copy()
    if "step" in levels:
        step_n = np.bincount(gs_step, weights=block_n, minlength=n_step)
        effects["step"] = _centre(_weighted_mean(block_r, block_n, gs_step, n_step), step_n,
                                  data["step_group"])
        unit_of_block["step"] = gs_step
        remaining = remaining - effects["step"][gs_step]
    gpu_total = _weighted_mean(remaining, block_n, gs_gpu, n_gpu)
    gpu_n = np.bincount(gs_gpu, weights=block_n, minlength=n_gpu)
    for level in ("cabinet", "node", "gpu"):
        if level not in levels:
            continue
        unit = data[f"{level}_of_gpu"]
        size = int(unit.max()) + 1
        effects[level] = _centre(_weighted_mean(gpu_total, gpu_n, unit, size),
                                 np.bincount(unit, weights=gpu_n, minlength=size),
                                 data[f"{level}_group"])
        unit_of_block[level] = unit[gs_gpu]
        gpu_total = gpu_total - effects[level][unit]
        remaining = remaining - effects[level][unit][gs_gpu]
    return {level: (effect, _within_se(remaining, block_n, unit_of_block[level],
                                       len(effect), unknown=np.nan))
            for level, effect in effects.items()}


def kernel_baseline_se(data: dict) -> np.ndarray:
    """Standard errors of the kernel baselines' Helmert coordinates (all-kernels mean first).

    The all-kernels mean moves with everything the GPU-steps share: the spread of the pooled
    block means over the blocks. The contrasts between kernels move only with the launches'
    own noise: cell deviations from their block's pooled mean (unit effects cancel), averaged
    over a kernel's cells.
    """
    block_n, block_r = _block_residuals(data)
    used = block_n > 0
    n_blocks = int(used.sum())
    mean_se = MIN_SE
    if n_blocks > 1:
        r, n = block_r[used], block_n[used]
        spread = np.sqrt(np.average((r - np.average(r, weights=n)) ** 2, weights=n))
        mean_se = max(float(spread / np.sqrt(n_blocks)), MIN_SE)
    kernel = data["cell_kernel"]
    n_kernels = int(kernel.max()) + 1
    values = data["cell_dev"] - block_r[data["cell_gpustep"]]
    contrast_se = _within_se(values, data["cell_n"], kernel, n_kernels) if n_kernels > 1 else 1.0
    return np.r_[mean_se, np.full(n_kernels - 1, contrast_se)]


def _medians(values: np.ndarray, index: np.ndarray, size: int) -> np.ndarray:
    """Median of ``values`` per ``index`` bucket (0 for empty buckets)."""
    return pd.Series(values).groupby(index).median().reindex(range(size), fill_value=0.0
                                                            ).to_numpy()


def _others_median(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Per element, the median of the *other* elements of its bucket (its own value when
    alone). Leaving the element out keeps a few blocks per unit from shrinking their deviations
    (with its own 6 values in the median, a unit's spread came out 40 % small)."""
    out = values.copy()
    order = np.argsort(index, kind="stable")
    for part in np.split(order, np.flatnonzero(np.diff(index[order])) + 1):
        x = values[part]
        if x.size > 64:  # one value barely moves the median of many
            out[part] = np.median(x)
        elif x.size > 1:
            out[part] = [np.median(np.delete(x, i)) for i in range(x.size)]
    return out


def _robust_block_deviations(data: dict, block_n: np.ndarray, block_r: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray]:
    """Mask of GPU-steps with launches, and their residuals (:func:`_block_residuals`) less
    their step unit's median."""
    used = block_n > 0
    step = data["gpustep_step"][used]
    r = block_r[used]
    return used, r - _medians(r, step, int(data["gpustep_step"].max()) + 1)[step]


def robust_unit_effects(data: dict, level: str) -> np.ndarray:
    """Per unit of a persistent level (cabinet, node, GPU), the median of its GPU-steps'
    residuals less their step's median: robust to a noisy warm-up step and to slow repeats,
    which the weighted means of :func:`unit_effect_estimates` are not."""
    used, dev = _robust_block_deviations(data, *_block_residuals(data))
    unit_of_gpu = data[f"{level}_of_gpu"]
    unit = unit_of_gpu[data["gpustep_gpu"][used]]
    return _medians(dev, unit, int(unit_of_gpu.max()) + 1)


def started_in_core(estimate: tuple[np.ndarray, float] | None, unit_estimate: np.ndarray | None,
                    start: np.ndarray, group: np.ndarray):
    """The data's unit estimates with some units started elsewhere: ``start`` holds, per unit,
    its effect centred in its group (NaN: the data's estimate).

    A start, not a model: a unit the traced data put far from what a benchmark of the same unit
    measured (``bayesprism.model.fleet_prior.mark_units_to_start_in_core``) was slow for a
    while, not for good, and its effect starts where its measurement says it is. Started at
    the data's estimate, a chain can stay in that mode of negligible mass (dev traces with the
    fleet benchmark: one chain 810 log units below the other, sampled twice).

    Examples
    --------
    >>> started_in_core((np.array([0.01, -0.01, 0.12]), 0.002), None,
    ...                 np.array([np.nan, np.nan, 0.005]), np.zeros(3, dtype=int))[0][0].tolist()
    [0.01, -0.01, 0.005]
    """
    moved = np.isfinite(start)
    if estimate is not None:
        estimate = (np.where(moved, start, estimate[0]), estimate[1])
    if unit_estimate is not None:
        unit_estimate = np.asarray(unit_estimate, dtype=float).copy()
        for g in np.unique(group[moved]):
            others = (group == g) & ~moved
            centre = np.median(unit_estimate[others]) if others.any() else 0.0
            unit_estimate[(group == g) & moved] = centre + start[(group == g) & moved]
    return estimate, unit_estimate


def _gpustep_se(data: dict, block_n: np.ndarray, block_r: np.ndarray) -> np.ndarray:
    """Standard error of each GPU-step's mean log residual from its own launches."""
    cell_block = data["cell_gpustep"]
    used = _reference_classes(data)[data["kernel_class_of_kernel"][data["cell_kernel"]]]
    spread = np.bincount(cell_block, weights=used * (data["cell_ss"] + data["cell_n"] * (
        data["cell_dev"] - block_r[cell_block]) ** 2), minlength=block_n.size)
    return np.sqrt(spread) / np.maximum(block_n, 1)


def gpustep_resolution(data: dict) -> float:
    """The standard error with which one GPU-step's effect is resolved by its own launches
    (median over GPU-steps with launches; log units)."""
    block_n, block_r = _block_residuals(data)
    within = _gpustep_se(data, block_n, block_r)
    return max(float(np.median(within[block_n > 0])), MIN_SE)


def unit_resolution(data: dict, levels: list[str]) -> dict[str, float]:
    """Per level, the standard error with which the data resolve one unit's effect (median
    over its units; log units).

    A GPU-step's noise is the larger of (a) the robust spread (1.4826 MAD) of its step unit's
    residuals once step and GPU medians are removed (a noisy warm-up step counts for what it
    is worth) and (b) the standard error of its own launches' mean. A unit's precision sums
    1 / noise² over its GPU-steps.
    """
    block_n, block_r = _block_residuals(data)
    used, dev = _robust_block_deviations(data, block_n, block_r)
    gpu, step = data["gpustep_gpu"][used], data["gpustep_step"][used]
    n_step = int(data["gpustep_step"].max()) + 1
    dev = np.abs(dev - _others_median(dev, gpu))
    pooled = max(1.4826 * float(np.median(dev)), MIN_SE)
    per_step = 1.4826 * _medians(dev, step, n_step)
    enough = np.bincount(step, minlength=n_step) >= 3
    between = np.where(enough, np.maximum(per_step, MIN_SE), pooled)[step]
    within = _gpustep_se(data, block_n, block_r)[used]
    weight = 1.0 / np.maximum(between, within) ** 2
    out = {}
    for level in levels:
        if level == "step":
            unit = step
        elif f"{level}_of_gpu" in data:
            unit = data[f"{level}_of_gpu"][gpu]
        else:
            continue
        precision = np.bincount(unit, weights=weight)
        out[level] = float(np.median(1.0 / np.sqrt(precision[precision > 0])))
    return out


def _less_group_medians(values: np.ndarray, group: np.ndarray | None) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if group is None or x.size == 0:
        return x
    return x - _medians(x, group, int(group.max()) + 1)[group]


def student_t_nu_start(values: np.ndarray, group: np.ndarray | None = None) -> float:
    """A start for a Student-t population's ``ν − 1``: the maximum-likelihood ν of the robust
    unit estimates (centred within their groups), between 0.5 and 60.

    Where the sampler starts ν decides which explanation of an outlying unit it settles in: a
    heavy-tailed population, or the transient component of another level claiming every step of
    that unit. Both are local modes; starting at what the unit estimates themselves say puts
    the chains in the one the data point at (the prior mean, ν = 21, points at light tails
    whatever the data).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> heavy = student_t_nu_start(rng.standard_t(3.0, 2000))
    >>> light = student_t_nu_start(rng.standard_normal(2000))
    >>> heavy < 5.0 < light
    True
    """
    from scipy import stats

    x = _less_group_medians(values, group)
    x = x[np.isfinite(x)]
    spread = 1.4826 * float(np.median(np.abs(x - np.median(x)))) if x.size else 0.0
    if x.size < 8 or spread <= 0.0:
        return 20.0  # nothing to say: the prior mean
    nu, _, _ = stats.t.fit(x / spread, floc=0.0)
    return float(np.clip(nu - 1.0, 0.5, 60.0))


def centred_share(spread: float, se: float) -> float:
    """How centred to sample a level's effects: the unit estimates' reliability
    ``1 - se² / spread²`` (the share of their spread that is signal, by moments), in [0, 1];
    1 from :data:`CENTRED_RELIABILITY` up, and when the se is unknown (NaN: no unit measured
    twice), which says nothing against the centred form.

    With effects pinned by their data (reliability near 1) the centred form mixes; with
    effects the data barely resolve against their spread, the non-centred one (else the scale
    and the effects form a funnel). In between, the effects' contrasts are sampled on
    ``scale ** (1 - share)`` (:func:`bayesprism.model.effects.unit_level`), the partially
    non-centred form whose best exponent, for normal effects, is the reliability.

    Examples
    --------
    >>> centred_share(0.01, 0.0001), centred_share(0.0002, 0.0004)
    (1.0, 0.0)
    >>> round(centred_share(0.002, 0.001), 2), centred_share(0.002, float("nan"))
    (0.75, 1.0)
    """
    if not np.isfinite(se):
        return 1.0
    share = max(1.0 - (se / spread) ** 2, 0.0) if spread > 0 else 0.0
    return 1.0 if share >= CENTRED_RELIABILITY else share


def robust_spread(values: np.ndarray, group: np.ndarray | None = None) -> float:
    """1.4826 × the median absolute deviation of ``values`` from their group medians (log
    units; at least :data:`MIN_SE`): a start for a population scale.

    Examples
    --------
    >>> round(robust_spread(np.array([0.0, 0.01, -0.01, 0.02, -0.02, 0.5])), 4)
    0.0222
    """
    x = _less_group_medians(values, group)
    if x.size == 0:
        return MIN_SE
    return max(1.4826 * float(np.median(np.abs(x - np.median(x)))), MIN_SE)


def gpustep_deviations(data: dict) -> np.ndarray:
    """Each GPU-step's residual less its step's and its GPU's medians (GPU-steps with
    launches)."""
    used, dev = _robust_block_deviations(data, *_block_residuals(data))
    gpu = data["gpustep_gpu"][used]
    return dev - _medians(dev, gpu, int(data["gpustep_gpu"].max()) + 1)[gpu]


def episode_start(data: dict, spreads: float = 5.0) -> tuple[float, float, float]:
    """Starts for the GPU×step episodes: their share, log shift and extra log spread.

    Episode GPU-steps are those whose residual, less its step's and its GPU's medians, lies
    more than ``spreads`` robust sds (at least one GPU-step's resolution) above zero; the share
    is kept between 0.5 / GPU-steps and 0.5, the shift is their median excess and the spread
    their robust sd (defaults 0.05 and 0.02 when there are none).

    Starting the weight and shift at their prior means lets the episodes claim a persistently
    slow GPU's every step before its GPU effect is found (see :func:`student_t_nu_start`).

    Examples
    --------
    Four GPUs × four steps, one GPU-step 10 % slow:

    >>> dev = np.r_[np.zeros(15), 0.1]
    >>> data = {"block_n": np.ones((16, 1)), "block_dev": dev[:, None],
    ...         "gpustep_gpu": np.arange(16) // 4, "gpustep_step": np.arange(16) % 4,
    ...         "cell_gpustep": np.arange(16), "cell_kernel": np.zeros(16, dtype=int),
    ...         "kernel_class_of_kernel": np.zeros(1, dtype=int), "cell_n": np.ones(16),
    ...         "cell_ss": np.zeros(16), "cell_dev": dev}
    >>> [round(v, 4) for v in episode_start(data)]
    [0.0625, 0.1, 0.02]
    """
    dev = gpustep_deviations(data)
    if dev.size == 0:
        return 0.02, 0.05, 0.02
    spread = max(robust_spread(dev), gpustep_resolution(data))
    slow = dev[dev > spreads * spread]
    share = float(np.clip(slow.size / dev.size, 0.5 / dev.size, 0.5))
    if slow.size == 0:
        return share, 0.05, 0.02
    extra = robust_spread(slow) if slow.size >= 3 else 0.02
    return share, float(np.median(slow)), extra


def within_cell_sd(data: dict) -> np.ndarray:
    """Per kernel class, the pooled sd of launches about their cell's mean (log units; at
    least 1e-3): a start for the residual scales."""
    cls = data["kernel_class_of_kernel"][data["cell_kernel"]]
    size = data["block_n"].shape[1]
    ss = np.bincount(cls, weights=data["cell_ss"], minlength=size)
    dof = np.bincount(cls, weights=np.maximum(data["cell_n"] - 1.0, 0.0), minlength=size)
    return np.maximum(np.sqrt(ss / np.maximum(dof, 1.0)), 1e-3)


def class_spread_start(kernel_mean: np.ndarray, cls: np.ndarray, n_classes: int) -> np.ndarray:
    """Per kernel class, the sd of its kernels' mean log durations (classes of one kernel take
    the median of the others; at least 1e-3): a start for ``kernel_class_sd``.

    Examples
    --------
    >>> class_spread_start(np.log([10.0, 20.0, 5.0]), np.array([0, 0, 1]), 2).round(3)
    array([0.49, 0.49])
    """
    sd = np.full(n_classes, np.nan)
    for c in range(n_classes):
        x = kernel_mean[cls == c]
        if x.size >= 2:
            sd[c] = np.std(x, ddof=1)
    fallback = float(np.nanmedian(sd)) if np.isfinite(sd).any() else 1.0
    return np.maximum(np.where(np.isfinite(sd), sd, fallback), 1e-3)


def gpustep_core_start(data: dict) -> float:
    """A start for the GPU×step core scale: the excess of the GPU-steps' robust spread
    (:func:`gpustep_deviations`) over what their own launches resolve, at least a twentieth of
    that resolution.

    A core started wider than the data allow leaves each GPU-step free to drift from its GPU
    while the episodes' share and shift are still moving: a chain then let the episodes claim
    every step of a persistently slow GPU (dev traces, 1 chain in 5).
    """
    spread, resolution = robust_spread(gpustep_deviations(data)), gpustep_resolution(data)
    return float(max(np.sqrt(max(spread**2 - resolution**2, 0.0)), 0.05 * resolution))


def class_means(values: np.ndarray, weights: np.ndarray, index: np.ndarray,
                size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per ``index`` bucket (rows of the result) and kernel class (columns), the weighted mean
    of ``values`` and the weights' total.

    Examples
    --------
    >>> means, total = class_means(np.array([[1.0], [3.0], [5.0]]), np.array([[1.0], [3.0],
    ...                            [2.0]]), np.array([0, 0, 1]), 2)
    >>> means.ravel().tolist(), total.ravel().tolist()
    ([2.5, 5.0], [4.0, 2.0])
    """
    total = np.zeros((size, values.shape[1]))
    summed = np.zeros_like(total)
    np.add.at(total, index, weights)
    np.add.at(summed, index, weights * values)
    return summed / np.maximum(total, 1e-300), total


def gpu_class_effects(block_dev: np.ndarray, block_n: np.ndarray, gpu: np.ndarray,
                      step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The GPU-steps' mean log deviations per kernel class less each step's class means, and
    per GPU their launch-weighted means and launch counts.

    ``block_dev`` and ``block_n``: per GPU-step (rows) and class, the summed deviations and
    the launches; ``gpu`` and ``step``: each GPU-step's GPU and step.

    Examples
    --------
    >>> dev = np.array([[0.02], [0.04], [0.0], [0.02]])   # 2 GPUs x 2 steps, 1 launch each
    >>> residual, gpu_mean, gpu_n = gpu_class_effects(dev, np.ones((4, 1)),
    ...                                               np.array([0, 0, 1, 1]),
    ...                                               np.array([0, 1, 0, 1]))
    >>> np.round(gpu_mean.ravel(), 3).tolist(), gpu_n.ravel().tolist()
    ([0.01, -0.01], [2.0, 2.0])
    """
    residual = np.divide(block_dev, block_n, out=np.zeros_like(block_n, dtype=float),
                         where=block_n > 0)
    residual = residual - class_means(residual, block_n, step, int(step.max()) + 1)[0][step]
    gpu_mean, gpu_n = class_means(residual, block_n, gpu, int(gpu.max()) + 1)
    return residual, gpu_mean, gpu_n


def loading_ratio_start(data: dict, level: str) -> tuple[np.ndarray, float] | None:
    """A start for a persistent level's (cabinet, node, GPU) or the GPU-steps' per-class log
    loading ratios, and its standard error: the slope of each compute class's unit effects on
    the reference class's (their launch-weighted mean), in logs, centred with the reference
    weights, zero for the other classes; the median over classes of the slopes' relative
    standard errors (at least :data:`MIN_RATIO_SE`).

    Unit effects per class are weighted means of the GPU-steps' per-class residuals once each
    class's step means (and, for GPU-steps, GPU means) are removed, centred within the level's
    groups; only units that launch every compute class count. None for other levels (a run's
    dozen steps, whose effects sit near what their launches resolve, give slopes worse than
    no start: dev traces, 660 log units against 36), when fewer than three units count, the
    level's effects are flat, or a slope is not positive (the ratios then start at 1).
    A regression slope rather than a ratio of spreads: the classes' launch noise is
    independent, so it does not bias the slope as it inflates a spread.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> gpu = np.repeat(np.arange(16), 4)
    >>> slow = rng.normal(0, 0.02, 16)[gpu]
    >>> data = {"class_reference_weights": np.array([3.0, 1.0]),
    ...         "block_n": np.full((64, 2), 100.0),
    ...         "block_dev": 100.0 * np.stack([slow, 0.5 * slow], axis=1),
    ...         "gpustep_gpu": gpu, "gpustep_step": np.tile(np.arange(4), 16),
    ...         "gpu_of_gpu": np.arange(16), "gpu_group": np.zeros(16, dtype=int)}
    >>> log_ratio, se = loading_ratio_start(data, "gpu")
    >>> round(float(np.exp(log_ratio[0] - log_ratio[1])), 3), se
    (2.0, 0.001)
    """
    if level != "gpustep" and f"{level}_of_gpu" not in data:
        return None
    weights = np.asarray(data["class_reference_weights"], dtype=float)
    compute = weights > 0
    block_n = np.asarray(data["block_n"], dtype=float)
    gpu = data["gpustep_gpu"]
    residual, gpu_mean, gpu_n = gpu_class_effects(data["block_dev"], block_n, gpu,
                                                  data["gpustep_step"])
    if level == "gpustep":
        effects = residual - gpu_mean[gpu]
        counts, group = block_n, np.zeros(len(gpu), dtype=int)
    else:
        unit = np.asarray(data[f"{level}_of_gpu"])
        effects, counts = class_means(gpu_mean, gpu_n, unit, int(unit.max()) + 1)
        group = np.asarray(data[f"{level}_group"])
    full = (counts[:, compute] > 0).all(axis=1)
    if full.sum() < 3:
        return None
    effects, counts, group = effects[full][:, compute], counts[full][:, compute], group[full]
    n_groups = int(group.max()) + 1
    effects = effects - class_means(effects, counts, group, n_groups)[0][group]
    reference = effects @ (weights[compute] / weights[compute].sum())
    spread = float(np.sum(reference**2))
    if spread <= 0.0:
        return None
    slope = effects.T @ reference / spread
    if not (slope > 0).all():
        return None
    resid = effects - reference[:, None] * slope[None, :]
    slope_se = np.sqrt((resid**2).sum(axis=0) / max(len(reference) - 1, 1) / spread)
    log_ratio = np.log(slope)
    out = np.zeros(weights.size)
    out[compute] = log_ratio - np.average(log_ratio, weights=weights[compute])
    return out, float(max(np.median(slope_se / slope), MIN_RATIO_SE))
