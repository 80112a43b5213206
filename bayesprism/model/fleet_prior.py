"""A fleet's fitted populations as potentials of a kernel-level model
(:mod:`bayesprism.population_prior`)."""

from __future__ import annotations

from bayesprism.model.prepared import PreparedData
from bayesprism.population_prior import NU_FAMILIES, PopulationPrior, transformed
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
    carried = ", ".join(f"{p.name} {_shown(p)}" for p in used) or "nothing"
    notes = [f"population prior from {prior.source} (class {prior.kernel_class}): {carried}"]
    notes += [f"population prior: not carried over, {reason}" for reason in skipped]
    return notes


def _shown(parameter) -> str:
    """A parameter's fleet median as the notes print it."""
    value = parameter.median
    if parameter.transform == "log_minus_one":
        return f"{value:.3g}"
    return f"{100 * value:.3g} %"
