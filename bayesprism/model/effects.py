"""Unit effects (nodes, GPUs, steps, cabinets) with heavy-tailed populations, sampled so they mix.

The likelihood sees a level's effects only as deviations from their group mean (GPUs within
node, steps within run, nodes and cabinets overall). With thousands of launches per unit those
deviations are pinned by the data while each group mean is known only from the population
prior. Sampling the effects themselves leaves a narrow valley along the all-ones direction that
NUTS with a diagonal mass matrix crosses in tiny steps (measured: ~60 leapfrog steps per draw).
So the free coordinates are rotated: per group an orthonormal Helmert basis whose first vector
is the normalised all-ones vector. The group-mean coordinate and the contrast coordinates are
then separate, axis-aligned parameters; the map is orthogonal (unit Jacobian), so the
population prior (Normal, Student-t with learned ν, or a two-component mixture with a slow
component) is applied to the effects themselves as a potential and stays exactly as specified.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import helmert

from bayesprism.spec import ModelSpec


def segment_sum(values, index: np.ndarray, size: int):
    """Sum ``values`` into ``size`` buckets by ``index`` (a PyTensor scatter-add)."""
    import pytensor.tensor as pt

    return pt.inc_subtensor(pt.zeros(size)[index], values)


def grouped_helmert(free, group: np.ndarray):
    """Map free coordinates to unit effects through a per-group orthonormal basis.

    Parameters
    ----------
    free
        Tensor of length ``len(group)``; for each group, its first unit (in order of
        appearance) holds the group-mean coordinate (the mean times √size), the other units the
        within-group contrasts.
    group
        Group index of every unit.

    Returns
    -------
    Tensor of unit effects (same length), an orthogonal transform of ``free``.
    """
    import pytensor.tensor as pt

    group = np.asarray(group, dtype=np.int64)
    sizes = np.bincount(group)
    parts, order = [], []
    for size in np.unique(sizes[group]):
        groups = np.flatnonzero(sizes == size)
        # (groups, size) positions of the units of every group with this many units
        positions = np.stack([np.flatnonzero(group == g) for g in groups])
        basis = helmert(int(size), full=True)  # row 0 = ones / sqrt(size)
        parts.append(pt.dot(free[positions.ravel()].reshape(positions.shape), basis).ravel())
        order.append(positions.ravel())
    # Gathers only (no scatter): cheaper to compile and to differentiate.
    inverse = np.argsort(np.concatenate(order))
    stacked = parts[0] if len(parts) == 1 else pt.concatenate(parts)
    return stacked[inverse]


def population_logp(effects, family: str, level: str, scale, spec: ModelSpec):
    """Log density of ``effects`` under a level's population at ``scale``; creates its parameters.

    ``student_t`` adds ``{level}_nu`` (ν = 1 + Gamma(2, rate): a finite mean, tails learned);
    ``mixture`` adds ``{level}_slow_weight`` ~ Beta(1, b) and ``{level}_slow_shift`` ≥ 0 (in
    population sds): z ~ (1 − w)·N(0, 1) + w·N(shift, 1).
    """
    import pymc as pm
    import pytensor.tensor as pt

    if family == "normal":
        dist = pm.Normal.dist(0.0, scale)
    elif family == "student_t":
        nu_excess = pm.Gamma(f"{level}_nu_minus_one", 2.0, spec.prior("nu_rate"))
        nu = pm.Deterministic(f"{level}_nu", 1.0 + nu_excess)
        dist = pm.StudentT.dist(nu=nu, mu=0.0, sigma=scale)
    elif family == "mixture":
        weight = pm.Beta(f"{level}_slow_weight", 1.0, spec.prior("slow_weight_beta"))
        shift = pm.HalfNormal(f"{level}_slow_shift", spec.prior("slow_shift_scale"))
        dist = pm.NormalMixture.dist(
            w=pt.stack([1.0 - weight, weight]),
            mu=pt.stack([pt.zeros(()), shift * scale]),
            sigma=pt.stack([scale, scale]) * pt.ones(2),
        )
    else:
        raise ValueError(f"unknown population family {family!r}")
    return pt.sum(pm.logp(dist, effects))


def unit_level(level: str, prepared, spec: ModelSpec):
    """Per-class loadings and standardised unit effects of one level.

    Returns ``(loading, effect, centred)``: loadings (``kernel_class``), the standardised
    effects reported as ``{level}_effect``, and the effects centred within their groups (what
    the likelihood sees). Centred levels sample log-scale offsets of the class with the most
    launches (scale ``{level}_scale_ref``) and loading ratios of the other classes;
    non-centred levels sample standardised effects and per-class loadings.
    """
    import pymc as pm
    import pytensor.tensor as pt

    dim = {"gpu": "gpu_unit", "step": "step_unit"}.get(level, level)
    family = spec.population(level)
    classes = prepared.coords["kernel_class"]
    group = prepared.data[f"{level}_group"]
    model = pm.modelcontext(None)
    model.add_coord(f"{level}_basis", list(range(group.size)))
    free = pm.Flat(f"{level}_basis_coef", dims=f"{level}_basis")
    raw = grouped_helmert(free, group)
    n_groups = int(group.max()) + 1
    group_mean = (segment_sum(raw, group, n_groups) / np.bincount(group, minlength=n_groups))
    if prepared.attrs["parameterisation"][level] == "noncentred":
        loading = pm.HalfNormal(f"{level}_scale", spec.prior("level_scale"), dims="kernel_class")
        pm.Potential(f"{level}_population", population_logp(raw, family, level, 1.0, spec))
        effect = pm.Deterministic(f"{level}_effect", raw, dims=dim)
        return loading, effect, raw - group_mean[group]
    ref = int(np.argmax(prepared.data["launches_per_class"]))
    scale_ref = pm.HalfNormal(f"{level}_scale_ref", spec.prior("level_scale"))
    pm.Potential(f"{level}_population", population_logp(raw, family, level, scale_ref, spec))
    ratio = pt.ones(len(classes))
    if len(classes) > 1:
        others = [c for c in range(len(classes)) if c != ref]
        model.add_coord(f"{level}_ratio_class", [classes[c] for c in others])
        ratio_free = pm.LogNormal(f"{level}_loading_ratio", 0.0, 1.0,
                                  dims=f"{level}_ratio_class")
        ratio = pt.set_subtensor(ratio[np.array(others)], ratio_free)
    loading = pm.Deterministic(f"{level}_scale", scale_ref * ratio, dims="kernel_class")
    effect = pm.Deterministic(f"{level}_effect", raw / scale_ref, dims=dim)
    centred = (raw - group_mean[group]) / scale_ref
    return loading, effect, centred
