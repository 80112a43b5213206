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
