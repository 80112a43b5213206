"""A fleet's fitted populations as potentials of a kernel-level model
(:mod:`bayesprism.population_prior`)."""

from __future__ import annotations

from bayesprism.model.effects import OUTLIER_SPREADS
from bayesprism.model.prepared import PreparedData
from bayesprism.model.start import MIN_SE, robust_unit_effects
from bayesprism.population_prior import (
    NU_FAMILIES,
    PopulationPrior,
    UnitPrior,
    group_means,
    transformed,
)
from bayesprism.spec import EPISODE_POPULATIONS, ModelSpec


def _transformed_logp(value, parameter):
    """Log density of ``value`` when its transform is N(mean, sd): the normal's log density
    plus the log Jacobian of the transform, so the potential is a density of the parameter."""
    import pymc as pm
    import pytensor.tensor as pt

    z, log_jacobian = transformed(value, parameter.transform, pt)
    return pm.logp(pm.Normal.dist(parameter.mean, parameter.sd), z) + log_jacobian


def _class_parameters(prior: PopulationPrior, spec: ModelSpec, levels: list[str], model,
                      class_index: int) -> tuple[dict, list[str]]:
    """The model's tensor of each parameter the prior carries, and why the others are not used."""
    import pytensor.tensor as pt

    values: dict = {}
    skipped: list[str] = []
    for level in ("node", "gpu"):
        if level not in prior.families:
            continue
        family = spec.population(level)
        if level not in levels or f"{level}_scale" not in model.named_vars:
            skipped.append(f"{level}: the level is not fitted here")
            continue
        if family != prior.families[level]:
            skipped.append(f"{level}: population {family} here, {prior.families[level]} in the "
                           "fleet fit")
            continue
        values[f"{level}_scale"] = model[f"{level}_scale"][class_index]
        if family in NU_FAMILIES:
            values[f"{level}_nu"] = model[f"{level}_nu"]
    if "gpustep" in prior.families:
        if spec.population("gpustep") not in EPISODE_POPULATIONS or \
                "gpustep_slow_weight" not in model.named_vars:
            skipped.append("gpustep: no GPU×step episodes fitted here")
        else:
            scale = model["gpustep_scale"][class_index]
            values["gpustep_slow_weight"] = model["gpustep_slow_weight"]
            values["gpustep_episode_shift"] = model["gpustep_slow_shift"] * scale
            values["gpustep_episode_spread"] = scale * pt.sqrt(
                pt.square(model["gpustep_slow_sd"]) - 1.0)
    return values, skipped


def add_population_prior(prior: PopulationPrior, prepared: PreparedData, spec: ModelSpec,
                         model) -> list[str]:
    """Add the fleet's population parameters as potentials of ``model`` (a kernel-level model
    built from ``prepared``); return notes saying what was carried over and what was not.

    Parameters
    ----------
    prior
        :func:`bayesprism.population_prior.population_prior_from` of the fleet's posterior.
    prepared, spec, model
        The kernel-level fit: its prepared data, spec and built PyMC model.

    Raises
    ------
    ValueError
        ``prior.kernel_class`` is not a class of ``prepared`` (the caller checks first).

    Examples
    --------
    >>> from bayesprism.population_prior import ParameterPrior  # doctest: +SKIP
    >>> prior = PopulationPrior("fleet.nc", "gemm", {"gpu": "student_t"},
    ...                         (ParameterPrior("gpu_scale", "log", -4.3, 0.03),))  # doctest: +SKIP
    >>> add_population_prior(prior, prepared, spec, model)  # doctest: +SKIP
    ['population prior from fleet.nc (class gemm): gpu_scale 1.36 % ...']
    """
    import pymc as pm

    classes = list(prepared.coords.get("kernel_class", []))
    if prior.kernel_class not in classes:
        raise ValueError(f"{prior.kernel_class!r} is not a class of the fit")
    levels = list(prepared.attrs.get("levels", []))
    with model:
        values, skipped = _class_parameters(prior, spec, levels, model,
                                            classes.index(prior.kernel_class))
        used = []
        for parameter in prior.parameters:
            if parameter.name not in values:
                continue
            pm.Potential(f"population_prior_{parameter.name}",
                         _transformed_logp(values[parameter.name], parameter))
            used.append(parameter)
        unit_notes = [_add_unit_prior(units, prepared, model, classes.index(prior.kernel_class))
                      for units in prior.units if units.level in levels]
    carried = ", ".join(f"{p.name} {_shown(p)}" for p in used) or "nothing"
    notes = [f"population prior from {prior.source} (class {prior.kernel_class}): {carried}"]
    notes += [f"population prior: not carried over, {reason}" for reason in skipped]
    if any(unit_notes):
        notes.append("population prior: the fleet's measurements of the fit's own "
                     + " and ".join(n for n in unit_notes if n) + " carried over (one effect "
                     "per unit in both fits)")
    return notes


def _add_unit_prior(units: UnitPrior, prepared: PreparedData, model,
                    class_index: int) -> str:
    """Add the fleet's likelihood of the fit's units' centred log effects as one potential;
    return what was carried (``"64 of 64 GPUs"``), or ``""`` when no unit is in the fit."""
    import numpy as np
    import pymc as pm
    import pytensor.tensor as pt

    dim = {"gpu": "gpu_unit"}.get(units.level, units.level)
    names = list(prepared.coords.get(dim, []))
    position = {name: i for i, name in enumerate(names)}
    carried = [i for i, name in enumerate(units.units) if name in position]
    if f"{units.level}_effect" not in model.named_vars or len(carried) < 2:
        return ""
    index = np.array([position[units.units[i]] for i in carried])
    groups = np.array(units.groups)[carried]
    log_effect = model[f"{units.level}_scale"][class_index] \
        * model[f"{units.level}_effect"][index]
    centred = log_effect - group_means(log_effect, groups, xp=pt)
    mean, sd = np.array(units.mean)[carried], np.array(units.sd)[carried]
    pm.Potential(f"population_prior_{units.level}_units",
                 pm.logp(pm.Normal.dist(mean, sd), centred).sum())
    label = {"gpu": "GPUs", "node": "nodes"}[units.level]
    return f"{len(carried)} of {len(names)} {label}"


def _shown(parameter) -> str:
    """A parameter's fleet median as the notes print it."""
    value = parameter.median
    if parameter.transform == "log_minus_one":
        return f"{value:.3g}"
    return f"{100 * value:.3g} %"


def mark_units_to_start_in_core(prior: PopulationPrior, prepared: PreparedData) -> list[str]:
    """Start the fit's units that the traced data put far slower than the fleet measured them
    where the fleet measured them (``prepared.data["{level}_start_effect"]``,
    :func:`bayesprism.model.start.started_in_core`); return a note naming them.

    The traced effects (robust per-unit estimates, centred in their groups) follow the fleet's
    up to a factor (the traced classes' mix against the carried class), fitted by least
    squares over the units that agree; a unit whose traced effect lies more than
    :data:`~bayesprism.model.effects.OUTLIER_SPREADS` spreads above its fleet measurement
    (the larger of those residuals' robust sd and the population's scale) was slow through
    the trace, not for good: its posterior puts the slowness in the GPU-step level (an
    episode), and so does its start. Call before the model is built.

    Examples
    --------
    >>> mark_units_to_start_in_core(prior, prepared)  # doctest: +SKIP
    ['population prior: dgx-h100-3285/3 ran 9.2 % slower through the trace than the fleet
    measured it: slow for a while, not for good (started as measured)']
    """
    import numpy as np
    import pandas as pd

    notes = []
    data = prepared.data
    for units in prior.units:
        dim = {"gpu": "gpu_unit"}.get(units.level, units.level)
        names = list(prepared.coords.get(dim, []))
        position = {name: i for i, name in enumerate(names)}
        carried = [i for i, name in enumerate(units.units) if name in position]
        if units.level not in prepared.attrs.get("levels", []) or len(carried) < 3:
            continue
        index = np.array([position[units.units[i]] for i in carried])
        group = np.asarray(data[f"{units.level}_group"])
        traced = pd.Series(robust_unit_effects(data, units.level))
        traced = (traced - traced.groupby(group).transform("median")).to_numpy()[index]
        fleet = np.array(units.mean)[carried]
        scale = prior.parameter(f"{units.level}_scale")
        agree = np.ones(len(index), dtype=bool)
        for _ in range(3):  # least squares on the agreeing units, then who disagrees
            if agree.sum() < 3:
                break
            factor = float(traced[agree] @ fleet[agree] / max(fleet[agree] @ fleet[agree],
                                                              1e-300))
            residual = traced - factor * fleet
            centre = np.median(residual[agree])
            # beyond the residuals' spread and the population's: not a unit's own effect
            spread = max(1.4826 * float(np.median(np.abs(residual[agree] - centre))),
                         factor * (scale.median if scale is not None else 0.0), MIN_SE)
            agree = residual - centre <= OUTLIER_SPREADS * spread
        slower = ~agree
        if not slower.any() or agree.sum() < 3 or factor <= 0:
            continue
        start = np.full(len(names), np.nan)
        start[index[slower]] = factor * fleet[slower]
        data[f"{units.level}_start_effect"] = start
        shown = [f"{names[index[i]]} ran {100 * residual[i]:.1f} % slower through the trace "
                 "than the fleet measured it" for i in np.flatnonzero(slower)]
        notes.append(f"population prior: {', '.join(shown[:5])}"
                     + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
                     + ": slow for a while, not for good (started as measured)")
    return notes
