"""Unit effects (nodes, GPUs, steps, cabinets) with heavy-tailed populations, sampled so they mix.

The likelihood sees a level's effects only as deviations from their group mean (GPUs within
node, steps within run, nodes within cabinet or overall, cabinets overall). With thousands of
launches per unit those deviations are pinned by the data while each group mean is known only
from the population prior. Sampling the effects themselves leaves a narrow valley along the
all-ones direction that NUTS with a diagonal mass matrix crosses in tiny steps (measured: ~60
leapfrog steps per draw).
So the free coordinates are rotated: per group an orthonormal Helmert basis whose first vector
is the normalised all-ones vector, which separates the group-mean coordinate from the contrast
coordinates (the map is orthogonal: unit Jacobian). A level of one group keeps its mean
coordinate (the population location, standardised); nested levels drop theirs and are
zero-sum within their group, with the population density (Normal, Student-t with learned ν,
or a two-component mixture with a slow component) applied to the centred effects and the
zero-sum normaliser (:func:`unit_level`). Per-class scales are a reference scale times loading
ratios centred on the launch-weighted geometric-mean class (:func:`class_scales`).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import helmert

from bayesprism.model.start import (
    centred_share,
    loading_ratio_start,
    robust_spread,
    student_t_nu_start,
)
from bayesprism.spec import ModelSpec

# PyMC and PyTensor are imported inside the functions that build graphs (start-up time:
# importing bayesprism.model must not load them).

#: The soft floor of a population scale, in units of the data's per-unit resolution.
SCALE_FLOOR = 1.5
#: Robust sds from the median beyond which a ``degraded`` level's unit is sampled centred.
OUTLIER_SPREADS = 3.0
#: Total-variation distance between a unit's class mix and its level's pooled mix beyond which
#: the level's units are sampled in the units their own classes see (:func:`_launch_shares`).
OWN_UNITS_MIX_DISTANCE = 0.5


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


def grouped_helmert_inverse(effects: np.ndarray, group: np.ndarray) -> np.ndarray:
    """The free coordinates whose :func:`grouped_helmert` image is ``effects`` (NumPy)."""
    group = np.asarray(group, dtype=np.int64)
    sizes = np.bincount(group)
    free = np.zeros(len(group))
    for size in np.unique(sizes[group]):
        positions = np.stack([np.flatnonzero(group == g)
                              for g in np.flatnonzero(sizes == size)])
        # the basis is orthonormal: its transpose inverts it
        free[positions] = effects[positions] @ helmert(int(size), full=True).T
    return free


def population_logp(effects, family: str, level: str, scale, spec: ModelSpec, reference=None,
                    nu_start: float | None = None):
    """Log density of ``effects`` under a level's population at ``scale``; creates its parameters.

    ``student_t`` adds ``{level}_nu`` (ν = 1 + Gamma(2, rate): a finite mean, tails learned);
    ``mixture`` adds ``{level}_slow_weight`` ~ Beta(1, b) and ``{level}_slow_shift`` ≥ 0 (in
    population sds): z ~ (1 − w)·N(0, 1) + w·N(shift, 1). ``degraded`` adds the same weight and
    a degraded component with a log shift and an extra log spread of its own, half-normal on
    the reference class's log scale (``{level}_slow_shift_log``, ``{level}_slow_spread_log``):
    z ~ (1 − w)·N(0, 1) + w·N(shift, slow_sd), recorded in core sds as ``{level}_slow_shift``
    and ``{level}_slow_sd``. A near-identical fleet's degraded units sit 30 or more core sds
    out, beyond what a prior in core sds reaches. ``reference``: the log size of one unit of
    ``effects / scale`` for the reference class (``scale`` itself when omitted).
    """
    import pymc as pm
    import pytensor.tensor as pt

    if family == "normal":
        dist = pm.Normal.dist(0.0, scale)
    elif family == "student_t":
        nu_excess = pm.Gamma(f"{level}_nu_minus_one", 2.0, spec.prior("nu_rate"),
                             initval=nu_start)
        nu = pm.Deterministic(f"{level}_nu", 1.0 + nu_excess)
        dist = pm.StudentT.dist(nu=nu, mu=0.0, sigma=scale)
    elif family == "mixture":
        # written as before the degraded family (a shared form changed the rounding, and the
        # robust spec's fit of DLRM, already on an edge at 300 draws, fell into another mode)
        weight = pm.Beta(f"{level}_slow_weight", 1.0, spec.prior("slow_weight_beta"))
        shift = pm.HalfNormal(f"{level}_slow_shift", spec.prior("slow_shift_scale"))
        dist = pm.NormalMixture.dist(
            w=pt.stack([1.0 - weight, weight]),
            mu=pt.stack([pt.zeros(()), shift * scale]),
            sigma=pt.stack([scale, scale]) * pt.ones(2),
        )
    elif family == "degraded":
        reference = scale if reference is None else reference
        weight = pm.Beta(f"{level}_slow_weight", 1.0, spec.prior("slow_weight_beta"))
        shift_log = pm.HalfNormal(f"{level}_slow_shift_log", spec.prior("degraded_shift"))
        spread_log = pm.HalfNormal(f"{level}_slow_spread_log", spec.prior("degraded_spread"))
        shift = pm.Deterministic(f"{level}_slow_shift", shift_log / reference)
        slow_sd = pm.Deterministic(f"{level}_slow_sd",
                                   pt.sqrt(1.0 + pt.square(spread_log / reference)))
        dist = pm.NormalMixture.dist(
            w=pt.stack([1.0 - weight, weight]),
            mu=pt.stack([pt.zeros(()), shift * scale]),
            sigma=pt.stack([pt.ones(()), slow_sd]) * scale,
        )
    else:
        raise ValueError(f"unknown population family {family!r}")
    return pt.sum(pm.logp(dist, effects))


def unit_level(level: str, prepared, spec: ModelSpec, estimate=None, resolution=None,
               unit_estimate=None, data_starts: bool = False):
    """Per-class loadings and standardised unit effects of one level.

    Returns ``(loading, centred, mean_effect)``: loadings (``kernel_class``), the standardised
    effects (reported as ``{level}_effect``) centred within their groups, as the likelihood
    sees them, and the mean the kernel medians move by. When units launch different mixes of
    classes (:func:`_launch_shares`), ``centred`` is per unit and class and ``mean_effect``
    per class: each class's units centred on their own mean. Centred levels sample log-scale
    offsets of a reference class (the launch-weighted geometric mean of the classes, scale
    ``{level}_scale_ref``) and per-class loading ratios (:func:`class_scales`); non-centred
    levels sample standardised effects and per-class loadings. ``estimate``: the data's
    ``(effects, standard error)`` for a centred level (:mod:`bayesprism.model.start`); its
    contrast coordinates are then sampled as ``estimate + se × {level}_basis_coef`` (a constant
    affine map), times ``(scale / scale start) ** (1 - reliability)`` when the estimates are
    mostly noise (:func:`bayesprism.model.start.centred_share`): partially non-centred, with
    that map's Jacobian.

    ``resolution``: the standard error with which the data resolve one unit's effect
    (:func:`bayesprism.model.start.unit_resolution`). When given (``degraded`` populations, and
    cabinets above un-nested nodes), the population scale gets a soft floor: its prior is
    multiplied by s² / (s² + r²), r = :data:`SCALE_FLOOR` × resolution. A centred level whose
    scale falls far below what one unit's data resolve forms a funnel with it. Measured on half
    of PAL Frontera ResNet, ``degraded`` nodes, 4 chains x 1,000 draws: 65 divergences and
    R-hat 1.05 without a floor, 24-52 with it on nodes only, 1 (R-hat 1.04) on nodes and
    cabinets, none (R-hat 1.006) with the split below as well; the whole table: R-hat
    1.006-1.011, no divergences. The data cannot tell such small spreads apart, so the floor
    states what the prior there is: a spread the data do not resolve is not believed to be
    exactly zero.

    ``data_starts``: start the population scale (and a Student-t population's ν) at what the
    unit estimates say (:mod:`bayesprism.model.start`).

    ``unit_estimate``: robust per-unit estimates (``start.robust_unit_effects``). A centred
    ``degraded`` level of one group is then sampled per unit: units more than
    :data:`OUTLIER_SPREADS` robust sds (at least ``resolution``) from the median centred, in log
    units, as the data pin them; the others, whose core spread is at most what their data
    resolve, non-centred (standardised by the core scale).
    """
    import pymc as pm
    import pytensor.tensor as pt

    dim = {"gpu": "gpu_unit", "step": "step_unit"}.get(level, level)
    family = spec.population(level)
    group = prepared.data[f"{level}_group"]
    n_groups = int(group.max()) + 1
    is_group_mean = np.zeros(group.size, dtype=bool)
    is_group_mean[np.unique(group, return_index=True)[1]] = True
    nested = n_groups > 1
    centred_level = prepared.attrs["parameterisation"][level] != "noncentred"
    model = pm.modelcontext(None)
    model.add_coord(f"{level}_basis", list(range(int((~is_group_mean).sum()) if nested
                                                 else group.size)))
    basis = free = pm.Flat(f"{level}_basis_coef", dims=f"{level}_basis")
    if estimate is not None:
        effects = np.asarray(estimate[0], dtype=float)
        se = float(estimate[1]) if np.isfinite(estimate[1]) else 1.0  # unknown: unit steps
    if estimate is not None and centred_level:
        centre = grouped_helmert_inverse(effects, group)
        centre[is_group_mean] = 0.0  # prior-only coordinates (sampled as before)
        step = np.where(is_group_mean, 1.0, se)
        if nested:
            centre, step = centre[~is_group_mean], step[~is_group_mean]
        free = centre + step * free
    # starts (model.start): the unit estimates' robust spread and tail weight
    values = None
    if data_starts:
        values = unit_estimate if unit_estimate is not None else (
            None if estimate is None else estimate[0])
    scale_start = None if values is None else robust_spread(values, group if nested else None)
    scale = pm.HalfNormal(f"{level}_scale_ref", spec.prior("level_scale"),
                          initval=scale_start) if centred_level else 1.0
    if centred_level and resolution is not None:
        soft_scale_floor(level, scale, resolution)
    split = (not nested and centred_level and family == "degraded"
             and unit_estimate is not None)
    centring = 1.0
    if estimate is not None and centred_level and not split and scale_start is not None:
        centring = centred_share(scale_start, float(estimate[1]))
    if centring < 1.0:
        # partially non-centred: the contrasts are sampled on scale ** (1 - centring), with
        # that map's Jacobian, and start where the data put them
        factor = (scale / scale_start) ** (1.0 - centring)
        free = free * factor if nested else pt.where(is_group_mean, free, free * factor)
        pm.Potential(f"{level}_partial_centring_jacobian",
                     (1.0 - centring) * int((~is_group_mean).sum()) * pt.log(scale))
    if split:
        # per unit: degraded units centred (log units), the core non-centred (see above)
        values = np.asarray(unit_estimate, dtype=float)
        median = np.median(values)
        spread = max(1.4826 * float(np.median(np.abs(values - median))), float(resolution or 0))
        outlier = np.abs(values - median) > OUTLIER_SPREADS * spread
        pinned = basis
        if estimate is not None:
            pinned = effects + se * basis
        raw = pt.where(outlier, pinned, basis * scale)
        pm.Potential(f"{level}_noncentred_jacobian", float((~outlier).sum()) * pt.log(scale))
    elif nested:
        # Nested levels (GPUs within node, steps within run): the group means never reach the
        # likelihood and the parent level carries them, so the effects are zero-sum within
        # their group (contrast coordinates only). Sampling the group means instead left
        # prior-only, possibly bimodal coordinates (measured on the PAL tables: divergences
        # and R-hat 1.016 on them). The population density is applied to the centred effects
        # with the zero-sum normaliser (one scale factor less per group): exact for a normal
        # population, the Laplace approximation of integrating the group mean out otherwise.
        coef = pt.set_subtensor(pt.zeros(group.size)[np.flatnonzero(~is_group_mean)], free)
        raw = grouped_helmert(coef, group)
        if centred_level:
            pm.Potential(f"{level}_zero_sum_normaliser", n_groups * pt.log(scale))
    else:
        # One group: its mean is the population location seen only through the prior. Sampled
        # on the population scale it would form a funnel with the scale (measured: 40-150
        # leapfrog steps per draw, ESS ~30), so it is sampled standardised, with its Jacobian.
        raw = grouped_helmert(pt.where(is_group_mean, free * scale, free), group)
        if centred_level:
            pm.Potential(f"{level}_group_mean_jacobian", pt.log(scale))
    loading = reference = None
    jacobian = 0.0
    shares = _launch_shares(prepared, level) if centred_level and not split else None
    ratio_start = (loading_ratio_start(prepared.data, level)
                   if data_starts and centred_level else None)
    if shares is not None:
        loading = class_scales(level, scale, prepared, reference_only=True,
                               log_ratio_start=ratio_start)
        raw, jacobian = _in_reference_units(raw, shares, loading / scale, group, nested)
    if not centred_level and family == "degraded":
        # its priors are on the reference class's log scale: the launch-weighted geometric
        # mean of the loadings, as for centred levels (other families keep their variables in
        # the order they had)
        loading = _noncentred_loading(level, spec)
        weights = np.asarray(prepared.data["class_reference_weights"], dtype=float)
        reference = pt.exp(pt.dot(weights / weights.sum(), pt.log(loading)))
    nu_start = None
    if family == "student_t" and values is not None:
        nu_start = student_t_nu_start(values, group if nested else None)
    pm.Potential(f"{level}_population",
                 population_logp(raw, family, level, scale, spec, reference, nu_start)
                 + jacobian)
    centred = raw if nested else raw - pt.mean(raw)
    if not centred_level:
        loading = _noncentred_loading(level, spec) if loading is None else loading
        effect = pm.Deterministic(f"{level}_effect", raw, dims=dim)
        return loading, centred, pt.mean(effect)
    if loading is None:
        loading = class_scales(level, scale, prepared, reference_only=True,
                               log_ratio_start=ratio_start)
    effect = pm.Deterministic(f"{level}_effect", raw / scale, dims=dim)
    if shares is None or nested:
        return loading, centred / scale, pt.mean(effect)
    # Each class sees the units that launch it centred on their own mean: centred on every
    # unit's, a traced job's few nodes would share an offset that only a per-GPU benchmark of
    # those nodes pins, and the traced kernels' medians would follow it (a ridge of the node
    # ratio, those nodes' effects and the medians: dev traces with the fleet GEMM benchmark,
    # R-hat 1.35, bulk ESS 5).
    launches = np.ones((group.size, len(prepared.coords["kernel_class"])))
    launches[:, shares[0]] = shares[1] > 0
    class_mean = pt.dot(effect, launches) / launches.sum(axis=0)
    return loading, effect[:, None] - class_mean[None, :], class_mean


def _launch_shares(prepared, level: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The compute classes and each unit's shares of its launches over them, when units of the
    level launch different mixes of classes (a per-GPU benchmark beside a traced job), else
    None.

    Units whose share vectors are at most :data:`OWN_UNITS_MIX_DISTANCE` apart (total
    variation) from the level's pooled mix launch alike, and are sampled in reference units.
    """
    d = prepared.data
    compute = np.asarray(d["class_reference_weights"], dtype=float) > 0
    if compute.sum() < 2:
        return None
    counts = np.zeros((len(d[f"{level}_group"]), int(compute.sum())))
    np.add.at(counts, d[f"{level}_of_gpustep"], np.asarray(d["block_n"])[:, compute])
    total = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)
    pooled = counts.sum(axis=0) / counts.sum()
    distance = 0.5 * np.abs(shares - pooled).sum(axis=1)
    if distance[total[:, 0] > 0].max() <= OWN_UNITS_MIX_DISTANCE:
        return None
    return np.flatnonzero(compute), shares


def _in_reference_units(own, shares: tuple[np.ndarray, np.ndarray], ratio, group: np.ndarray,
                        nested: bool):
    """Centred unit effects sampled in the units their own launches see, returned in the
    reference class's units, with the log Jacobian of that map.

    The likelihood pins a unit's effect times the loading ratio of the classes it launches.
    Sampled in reference units, a change of a ratio needs every unit seen through those classes
    to move with it at once: with a per-GPU benchmark (its own class, thousands of GPUs) beside
    a traced job, the ratio between the two drifted along that ridge (dev traces with the fleet
    GEMM benchmark: R-hat 2.3, bulk ESS 3). A unit's coordinates here are its effect times
    ρ, the launch-weighted geometric mean of the ratios of the compute classes it launches, so
    a ratio moves alone. Nested levels take one ρ per group (their pooled launches): the
    effects stay zero-sum, and the map scales each group's size − 1 contrasts by 1 / ρ.
    """
    import pytensor.tensor as pt

    compute, weights = shares
    n_groups = int(group.max()) + 1
    if nested:
        pooled = np.zeros((n_groups, weights.shape[1]))
        np.add.at(pooled, group, weights)
        weights = (pooled / pooled.sum(axis=1, keepdims=True))[group]
    log_rho = pt.dot(weights, pt.log(ratio[compute]))
    free = np.ones(len(group))
    if nested:
        size = np.bincount(group, minlength=n_groups)[group]
        free = (size - 1.0) / size
    return own * pt.exp(-log_rho), -pt.sum(free * log_rho)


def _noncentred_loading(level: str, spec: ModelSpec):
    import pymc as pm

    return pm.HalfNormal(f"{level}_scale", spec.prior("level_scale"), dims="kernel_class")


def data_scaled_half_normal(name: str, prior_sd: float, start: np.ndarray, log_se: np.ndarray,
                            dims: str):
    """A scale with a half-normal prior sampled as ``exp(log(start) + log_se · z)``, z flat.

    Parameters
    ----------
    name
        The scale's name (a Deterministic); ``{name}_z`` is the sampled coordinate and
        ``{name}_prior`` the half-normal prior with the change of variables' Jacobian.
    prior_sd
        Scale of the half-normal prior.
    start, log_se
        The data's estimate of the scale and the standard error of its log: a scale the data
        pin to a fraction of a percent (a residual sd over 10^5 launches) then moves about
        ``z`` = ±1 per posterior sd, so a sampler's start jitter of ±1 stays in the typical
        set instead of hundreds of sds (10^5 log units) away. A change of coordinates, not of
        model.
    dims
        The scale's dims.

    Examples
    --------
    >>> import pymc as pm
    >>> with pm.Model(coords={"collective": ["allreduce"]}) as model:
    ...     noise = data_scaled_half_normal("noise", 0.3, np.array([0.02]), np.array([0.01]),
    ...                                     "collective")
    >>> sorted(model.named_vars)
    ['noise', 'noise_prior', 'noise_z']
    >>> [start] = model.replace_rvs_by_values([noise])
    >>> model.compile_fn(start, inputs=model.value_vars)(model.initial_point()).round(3)
    array([0.02])
    """
    import pymc as pm
    import pytensor.tensor as pt

    log_scale = np.log(start) + log_se * pm.Flat(f"{name}_z", dims=dims)
    scale = pm.Deterministic(name, pt.exp(log_scale), dims=dims)
    pm.Potential(f"{name}_prior", pt.sum(-0.5 * pt.square(scale / prior_sd) + log_scale))
    return scale


def soft_scale_floor(level: str, scale, resolution: float) -> None:
    """Multiply the prior of a population ``scale`` by s² / (s² + r²), r = :data:`SCALE_FLOOR`
    × ``resolution`` (the standard error with which the data resolve one unit): spreads the
    data cannot tell apart from zero are not explored down to zero."""
    import pymc as pm
    import pytensor.tensor as pt

    floor = SCALE_FLOOR * float(resolution)
    pm.Potential(f"{level}_scale_floor", 2.0 * pt.log(scale) - pt.log(pt.square(scale) + floor**2))


def class_scales(name: str, scale_ref, prepared, reference_only: bool = False,
                 log_ratio_start: np.ndarray | None = None):
    """Per-class scales ``{name}_scale`` = ``scale_ref`` × loading ratio, ratios centred.

    The log loading ratios sum to zero with the launch weights of the compute classes (so
    ``scale_ref`` is the scale of their launch-weighted geometric-mean class), sampled as iid
    N(0, 1) coefficients of an orthonormal basis of that subspace; each other class's log ratio
    is a coefficient of its own or, with ``reference_only``, its scale is zero. Persistent and
    step levels are fitted with ``reference_only``: their standardised effects are one vector
    shared by all classes, and two collectives whose transfers vary from step to step in
    different patterns could each claim it (dev traces: the step effects followed the
    all-gathers in one chain and the reduce-scatters in the other, R-hat 1.83); a transfer,
    timed after its group's last member arrives, is not slowed by its GPU's compute anyway.
    Tying the ratios to one reference class instead makes them all move together with that
    class's noise (a correlated direction a diagonal mass matrix cannot follow: measured ~2x
    more leapfrog steps).

    ``log_ratio_start``: per class, a start for the log loading ratios and its standard error
    (:func:`bayesprism.model.start.loading_ratio_start`). The coefficients are then sampled
    as ``start + se × {name}_log_ratio_z`` (a constant affine map, with their N(0, 1) prior as
    ``{name}_log_ratio_prior``), as the other data-dominated coordinates
    (:mod:`bayesprism.model.start`): on the dev traces they sit near -0.6 with posterior sds of
    0.004-0.06, where the zero start cost 36k log units and nutpie's ±1 start jitter up to 72k.
    """
    import pymc as pm
    import pytensor.tensor as pt
    from scipy.linalg import null_space

    classes = prepared.coords["kernel_class"]
    if len(classes) == 1:
        return pm.Deterministic(f"{name}_scale", scale_ref * pt.ones(1), dims="kernel_class")
    weights = np.asarray(prepared.data["class_reference_weights"], dtype=float)
    reference = weights > 0
    # (classes, classes - 1): an orthonormal basis of the reference classes' weighted zero-sum
    # subspace, and each other class on an axis of its own, so that a collective's nearly
    # unidentified loading stays one coordinate instead of leaking into every ratio
    n_ref = int(reference.sum())
    others = np.flatnonzero(~reference)
    basis = np.zeros((weights.size, n_ref - 1 + (0 if reference_only else others.size)))
    basis[np.ix_(reference, np.arange(n_ref - 1))] = null_space(weights[reference][None, :])
    if not reference_only:
        basis[others, np.arange(n_ref - 1, basis.shape[1])] = 1.0
    loads = np.where(reference | (not reference_only), 1.0, 0.0)
    if basis.shape[1] == 0:
        return pm.Deterministic(f"{name}_scale", scale_ref * loads, dims="kernel_class")
    model = pm.modelcontext(None)
    model.add_coord(f"{name}_ratio_basis", list(range(basis.shape[1])))
    if log_ratio_start is None:
        coef = pm.Normal(f"{name}_log_ratio_coef", 0.0, 1.0, dims=f"{name}_ratio_basis")
    else:
        start = basis.T @ np.asarray(log_ratio_start[0], float)
        coef = pm.Deterministic(f"{name}_log_ratio_coef", start + log_ratio_start[1] * pm.Flat(
            f"{name}_log_ratio_z", dims=f"{name}_ratio_basis"), dims=f"{name}_ratio_basis")
        pm.Potential(f"{name}_log_ratio_prior", -0.5 * pt.sum(pt.square(coef)))
    return pm.Deterministic(f"{name}_scale", scale_ref * loads * pt.exp(pt.dot(basis, coef)),
                            dims="kernel_class")
