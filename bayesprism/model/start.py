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

#: Smallest standard error used to scale a coordinate (log units).
MIN_SE = 1e-6


def _weighted_mean(values, weights, index, size):
    total = np.bincount(index, weights=weights, minlength=size)
    return np.bincount(index, weights=weights * values, minlength=size) / np.maximum(total, 1e-300)


def _within_se(values, weights, index, size) -> float:
    """Typical standard error of a per-unit weighted mean of ``values`` (median over units)."""
    mean = _weighted_mean(values, weights, index, size)
    count = np.bincount(index, minlength=size)
    var = _weighted_mean((values - mean[index]) ** 2, weights, index, size)
    ok = count > 1
    if not ok.any():
        return 1.0
    return float(max(np.median(np.sqrt(var[ok] / count[ok])), MIN_SE))


def _centre(values, weights, group):
    """Subtract each group's weighted mean (the likelihood sees effects centred in groups)."""
    group = np.asarray(group)
    return values - _weighted_mean(values, weights, group, int(group.max()) + 1)[group]


def _block_residuals(data: dict) -> tuple[np.ndarray, np.ndarray]:
    """Launches per GPU-step and their mean log deviation from their kernels' means."""
    block_n = data["block_n"].sum(axis=1)
    return block_n, data["block_dev"].sum(axis=1) / np.maximum(block_n, 1e-300)


def unit_effect_estimates(data: dict, levels: list[str]) -> dict[str, tuple[np.ndarray, float]]:
    """Per level, the estimated unit effects (centred in their groups) and their standard error.

    Block residuals (mean log deviation of a GPU-step's launches from their kernels' means,
    all classes pooled) are swept into step, cabinet, node and GPU effects by weighted means;
    a unit's standard error is the spread of what remains over its blocks.
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
                                       len(effect)))
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


def _gpustep_se(data: dict, block_n: np.ndarray, block_r: np.ndarray) -> np.ndarray:
    """Standard error of each GPU-step's mean log residual from its own launches."""
    cell_block = data["cell_gpustep"]
    spread = np.bincount(cell_block, weights=data["cell_ss"] + data["cell_n"] * (
        data["cell_dev"] - block_r[cell_block]) ** 2, minlength=block_n.size)
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
