"""A fleet's unit populations, learned by one fit, as the prior of another fit on that fleet.

A traced job holds a few nodes: 8 nodes and 64 GPUs say little about how often a node or a GPU
of the fleet is slow, which is what a forecast on new nodes at 10^4 GPUs turns on. A per-GPU
benchmark of the fleet (``fleet_gemm_bench.csv``: hundreds of nodes, a few sessions each) does
say it, and its own fit (``bayesprism fit bench.csv -o fleet.nc``) takes minutes on its
thousands of unit effects. This module summarises such a fitted posterior's population
parameters so that the traced job's fit uses them as its prior (sequential Bayes, with the
fleet's posterior approximated parameter by parameter):

* ``node_scale``, ``gpu_scale``: the population scale of the class both fits launch
  (:attr:`PopulationPrior.kernel_class`; a benchmark's ``"benchmark"`` rows are read as the class
  of their kernel), lognormal;
* ``node_nu``, ``gpu_nu``: a Student-t population's ν, ``log(ν − 1)`` normal;
* ``gpustep_slow_weight``: the share of GPU-steps in an episode, logit-normal (a benchmark
  session is one GPU-step: its repeats are launches of one state of the GPU);
* ``gpustep_episode_shift``, ``gpustep_episode_spread``: an episode's log shift and extra log
  sd in the class's units (``gpustep_slow_shift`` and ``√(gpustep_slow_sd² − 1)`` times the
  class's GPU×step scale), lognormal.

The core scale of the GPU×step level is not carried over: a benchmark session lasts seconds of
one kernel, a training step a mix of kernels, and their GPU-step noises differ (dev fleet:
0.07 % against 0.01 % in its traced run).

The fleet's measurements of the traced job's own nodes and GPUs are carried over too
(:class:`UnitPrior`): the same node name is the same node, with one effect in both fits. A
traced job of a dozen steps cannot tell a GPU slowed for the whole trace (an episode) from a
GPU of slow silicon; the fleet's sessions of that GPU can (dev fleet: one traced GPU's GEMMs
14 % slower than its node's other GPUs' in all 12 steps, 0.5 % in the benchmark). What is
carried is each unit's log effect on the class, centred within the traced fit's groups (GPUs
within their node, nodes among the traced nodes) as its likelihood sees them, with the
population's part of the fleet's posterior divided out (normal approximations), so the
population is not counted twice.

The second fit adds each normal as a potential on the transformed parameter, so the fleet's
posterior multiplies the traced fit's own (weak) prior rather than replacing it; over the range
of a fleet posterior from hundreds of nodes those priors are nearly flat.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np
import xarray as xr

from bayesprism.errors import InputError, Problem
from bayesprism.posterior import flat_draws
from bayesprism.spec import EPISODE_POPULATIONS

#: Transforms under which a parameter's fleet posterior is taken as normal.
TRANSFORMS: tuple[str, ...] = ("log", "log_minus_one", "logit")
#: Population families whose ν is a parameter.
NU_FAMILIES: tuple[str, ...] = ("student_t",)
#: A unit is carried over when the fleet's measurement of it is worth at least this share of
#: its population's precision (a unit the fleet barely measured says nothing worth carrying).
MIN_UNIT_INFORMATION = 0.25


def transformed(value, transform: str, xp=np):
    """``(z, log |dz/dx|)`` of a parameter ``value`` under ``transform``, with the array module
    ``xp`` (NumPy, or PyTensor's ``tensor`` inside a model).

    Examples
    --------
    >>> z, log_jacobian = transformed(np.array([0.25]), "logit")
    >>> round(float(z[0]), 6), round(float(log_jacobian[0]), 6)
    (-1.098612, 1.673976)
    """
    if transform == "log":
        return xp.log(value), -xp.log(value)
    if transform == "log_minus_one":
        return xp.log(value - 1.0), -xp.log(value - 1.0)
    return xp.log(value) - xp.log1p(-value), -xp.log(value) - xp.log1p(-value)


@dataclass(frozen=True)
class ParameterPrior:
    """Normal approximation of one parameter's fleet posterior under ``transform``.

    Examples
    --------
    >>> ParameterPrior("gpu_scale", "log", math.log(0.014), 0.02).median
    0.014
    """

    name: str
    transform: str
    mean: float
    sd: float

    def __post_init__(self) -> None:
        if self.transform not in TRANSFORMS:
            raise ValueError(f"{self.name}: transform {self.transform!r} is not one of "
                             f"{', '.join(TRANSFORMS)}")
        if not (math.isfinite(self.mean) and math.isfinite(self.sd) and self.sd > 0):
            raise ValueError(f"{self.name}: the normal needs a finite mean and an sd > 0, got "
                             f"{self.mean}, {self.sd}")

    @property
    def median(self) -> float:
        """The parameter's median on its own scale."""
        value = {"log": math.exp, "log_minus_one": lambda m: 1.0 + math.exp(m),
                 "logit": lambda m: 1.0 / (1.0 + math.exp(-m))}[self.transform](self.mean)
        return round(value, 12)


@dataclass(frozen=True)
class UnitPrior:
    """What a fleet fit measured of some units of one level, as normal likelihoods.

    Attributes
    ----------
    level
        ``"node"`` or ``"gpu"``.
    units
        The units' names (the same in both fits).
    groups
        The traced fit's group of each unit; the effects are centred within groups over these
        units, as the traced fit's likelihood sees them.
    mean, sd
        Per unit, the normal likelihood of its centred log effect on the carried class (the
        fleet's posterior with the population's part divided out).

    Examples
    --------
    >>> prior = UnitPrior("gpu", ("n1/0", "n1/1"), (0, 0), (0.004, -0.004), (0.003, 0.003))
    >>> prior.units[0], prior.mean[0]
    ('n1/0', 0.004)
    """

    level: str
    units: tuple[str, ...]
    groups: tuple[int, ...]
    mean: tuple[float, ...]
    sd: tuple[float, ...]

    def __post_init__(self) -> None:
        sizes = {len(self.units), len(self.groups), len(self.mean), len(self.sd)}
        if len(sizes) != 1:
            raise ValueError(f"{self.level}: units, groups, mean and sd differ in length")
        if not all(math.isfinite(m) for m in self.mean) or \
                not all(math.isfinite(s) and s > 0 for s in self.sd):
            raise ValueError(f"{self.level}: unit likelihoods need finite means and sds > 0")


@dataclass(frozen=True)
class PopulationPrior:
    """The population parameters of a fitted fleet, for another fit of the same fleet.

    Attributes
    ----------
    source
        Where the fleet posterior came from (a path), for notes and messages.
    kernel_class
        The class the scales and episode sizes are measured on (a class of the traced job).
    families
        Population family of each level in the fleet fit (``{"node": "student_t", ...}``).
    parameters
        One :class:`ParameterPrior` per carried-over parameter.
    input_digest
        The fleet posterior's input digest (its data), so that a fit records which fleet
        informed it.
    units
        One :class:`UnitPrior` per level whose units the fleet measured among the fit's.

    Examples
    --------
    >>> prior = PopulationPrior("fleet.nc", "gemm", {"gpu": "student_t"},
    ...                         (ParameterPrior("gpu_scale", "log", -4.3, 0.03),), "abc")
    >>> PopulationPrior.from_json(prior.to_json()) == prior
    True
    """

    source: str
    kernel_class: str
    families: dict
    parameters: tuple[ParameterPrior, ...]
    input_digest: str = ""
    units: tuple[UnitPrior, ...] = ()

    def to_json(self) -> str:
        """The prior as one JSON string (stored in a posterior's attrs)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PopulationPrior:
        """Read back :meth:`to_json`."""
        data = json.loads(text)
        data["parameters"] = tuple(ParameterPrior(**p) for p in data["parameters"])
        data["units"] = tuple(UnitPrior(**{k: tuple(v) if isinstance(v, list) else v
                                           for k, v in u.items()})
                              for u in data.get("units", ()))
        return cls(**data)

    def parameter(self, name: str) -> ParameterPrior | None:
        """The prior of ``name``, or ``None`` when the fleet fit did not carry it."""
        return next((p for p in self.parameters if p.name == name), None)


def _normal_of(name: str, transform: str, values: np.ndarray) -> ParameterPrior:
    """Moments of the transformed draws (finite ones) as a :class:`ParameterPrior`."""
    z, _ = transformed(np.asarray(values, dtype=float), transform)
    z = z[np.isfinite(z)]
    return ParameterPrior(name, transform, float(z.mean()), float(max(z.std(ddof=1), 1e-6)))


def check_kernel_posterior(posterior: xr.DataTree, source: str) -> None:
    """Raise :class:`InputError` unless ``posterior`` is a fitted kernel-level posterior.

    Examples
    --------
    >>> try:
    ...     check_kernel_posterior(xr.DataTree(), "fleet.nc")
    ... except InputError as exc:
    ...     print(exc)
    fleet.nc: model_kind: a population prior needs a kernel-level posterior
    """
    if posterior.attrs.get("model_kind") != "kernel" or "posterior" not in posterior.children:
        raise InputError(Problem(source, "model_kind", "a population prior needs a kernel-level "
                                 "posterior", example=posterior.attrs.get("model_kind")))


def fleet_classes(posterior: xr.DataTree) -> list[str]:
    """Kernel classes of a fitted kernel-level posterior, most launches first.

    Examples
    --------
    >>> tree = xr.DataTree.from_dict({"posterior": xr.Dataset(coords={
    ...     "kernel_class": ["gemm", "norm"]})})
    >>> fleet_classes(tree)
    ['gemm', 'norm']
    """
    post = posterior["posterior"].to_dataset()
    classes = [str(c) for c in post["kernel_class"].to_numpy()] if "kernel_class" in post.coords \
        else []
    if "constant_data" in posterior.children and classes:
        data = posterior["constant_data"].to_dataset()
        if {"kernel_class_of_kernel", "cell_kernel", "cell_n"} <= set(data.data_vars):
            per_kernel = np.bincount(data["cell_kernel"].to_numpy(),
                                     weights=data["cell_n"].to_numpy(),
                                     minlength=data.sizes["kernel"])
            launches = np.bincount(data["kernel_class_of_kernel"].to_numpy(),
                                   weights=per_kernel, minlength=len(classes))
            classes = [classes[i] for i in np.argsort(-launches, kind="stable")]
    return classes


def _population_sd(post: xr.Dataset, family: str, level: str, scale: np.ndarray) -> float:
    """The sd of a level's population at the fleet's medians (a Student-t's, for ν > 2)."""
    sd = float(np.median(scale))
    if family in NU_FAMILIES and f"{level}_nu" in post:
        nu = float(np.median(flat_draws(post[f"{level}_nu"])))
        sd *= math.sqrt(nu / (nu - 2.0)) if nu > 2.0 else math.inf
    return sd


def unit_prior_from(post: xr.Dataset, family: str, level: str, fleet_class: str,
                    units: tuple[list[str], np.ndarray]) -> UnitPrior | None:
    """The fleet's measurements of the units ``units = (names, groups)`` of a traced fit's
    ``level``, or None when it measured none of them (:class:`UnitPrior`).

    Each unit's log effect on ``fleet_class`` is centred within its traced group over the units
    carried, and the population's normal part (its variance times 1 − 1/k for k units in the
    group) divided out of the moments of the centred draws. A group with one carried unit says
    nothing of contrasts and is left out, as are units the fleet barely measured
    (:data:`MIN_UNIT_INFORMATION`).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> post = xr.Dataset({
    ...     "gpu_effect": (("chain", "draw", "gpu_unit"), rng.normal([[[1.0, -1.0, 0.0]]], 0.1,
    ...                                                              (1, 400, 3))),
    ...     "gpu_scale": (("chain", "draw", "kernel_class"), np.full((1, 400, 1), 0.01))},
    ...     coords={"gpu_unit": ["a/0", "a/1", "b/0"], "kernel_class": ["benchmark"]})
    >>> prior = unit_prior_from(post, "normal", "gpu", "benchmark",
    ...                         (["a/0", "a/1", "b/0", "c/0"], np.array([0, 0, 1, 2])))
    >>> prior.units, [round(m, 3) for m in prior.mean]
    (('a/0', 'a/1'), [0.01, -0.01])
    """
    dim = {"gpu": "gpu_unit"}.get(level, level)
    if f"{level}_effect" not in post or f"{level}_scale" not in post or dim not in post.coords:
        return None
    names, groups = units
    known = set(map(str, post[dim].to_numpy()))
    scale = flat_draws(post[f"{level}_scale"].sel(kernel_class=fleet_class))
    population_sd = _population_sd(post, family, level, scale)
    chosen = [(name, int(group)) for name, group in zip(names, groups, strict=True)
              if name in known]
    if not chosen or not math.isfinite(population_sd) or population_sd <= 0:
        return None
    effects = flat_draws(post[f"{level}_effect"].sel({dim: [n for n, _ in chosen]}))
    log_effect = effects * scale[:, None]
    # barely measured: a posterior nearly as wide as the population
    measured = log_effect.var(axis=0, ddof=1) * (1.0 + MIN_UNIT_INFORMATION) \
        < population_sd**2
    group = np.array([g for _, g in chosen])
    sizes = np.bincount(group, weights=measured)
    keep = measured & (sizes[group] >= 2)
    if not keep.any():
        return None
    log_effect, group = log_effect[:, keep], group[keep]
    centred = log_effect - group_means(log_effect, group)
    _, codes, counts = np.unique(group, return_inverse=True, return_counts=True)
    prior_var = population_sd**2 * (1.0 - 1.0 / counts[codes])
    post_var = centred.var(axis=0, ddof=1)
    precision = np.maximum(1.0 / post_var - 1.0 / prior_var,
                           MIN_UNIT_INFORMATION / prior_var)
    mean = centred.mean(axis=0) / post_var / precision
    kept = [name for (name, _), k in zip(chosen, keep, strict=True) if k]
    return UnitPrior(level, tuple(kept), tuple(int(g) for g in group),
                     tuple(float(m) for m in mean), tuple(float(v) for v in precision**-0.5))


def group_means(values, group: np.ndarray, xp=np):
    """The mean of ``values`` (``(..., units)``) over each unit's group, per unit, with the
    array module ``xp`` (NumPy, or PyTensor's ``tensor`` inside a model).

    Examples
    --------
    >>> group_means(np.array([1.0, 3.0, 5.0]), np.array([7, 7, 2])).tolist()
    [2.0, 2.0, 5.0]
    """
    codes = np.unique(group, return_inverse=True)[1]
    one_hot = np.eye(int(codes.max()) + 1)[codes]  # (units, groups)
    return xp.dot(xp.dot(values, one_hot / one_hot.sum(axis=0)), one_hot.T)


def population_prior_from(posterior: xr.DataTree, kernel_class: str, fleet_class: str,
                          source: str = "population prior",
                          units: dict[str, tuple[list[str], np.ndarray]] | None = None,
                          ) -> PopulationPrior:
    """Summarise a fitted kernel-level posterior's populations as a :class:`PopulationPrior`.

    Parameters
    ----------
    posterior
        A posterior of ``bayesprism.fit`` (kernel-level), typically of a fleet benchmark.
    kernel_class
        The class of the fit that will use the prior which ``fleet_class`` measures.
    fleet_class
        The posterior's class whose scales are carried over (see :func:`fleet_classes`).
    source
        Named in notes and errors.
    units
        Per level (``"node"``, ``"gpu"``), the fit's units and their groups
        (``(names, groups)``): what the fleet measured of them is carried over
        (:func:`unit_prior_from`).

    Raises
    ------
    InputError
        Not a kernel-level posterior, ``fleet_class`` not among its classes, or no population
        level fitted.

    Examples
    --------
    >>> import bayesprism as bp  # doctest: +SKIP
    >>> fleet = bp.load("fleet.nc")  # doctest: +SKIP
    >>> population_prior_from(fleet, "gemm", "benchmark", "fleet.nc").families  # doctest: +SKIP
    {'gpu': 'student_t', 'gpustep': 'degraded', 'node': 'student_t'}
    """
    check_kernel_posterior(posterior, source)
    post = posterior["posterior"].to_dataset()
    attrs = {**dict(posterior.attrs), **dict(post.attrs)}
    classes = [str(c) for c in post["kernel_class"].to_numpy()] \
        if "kernel_class" in post.coords else []
    if fleet_class not in classes:
        raise InputError(Problem(source, "kernel_class", "not a class of the posterior "
                                 f"(it has {', '.join(classes) or 'none'})", example=fleet_class))

    def at_class(name: str) -> np.ndarray:
        return flat_draws(post[name].sel(kernel_class=fleet_class))

    families: dict[str, str] = {}
    parameters: list[ParameterPrior] = []
    for level in ("node", "gpu"):
        family = attrs.get(f"{level}_population")
        if family is None or f"{level}_scale" not in post:
            continue
        families[level] = str(family)
        parameters.append(_normal_of(f"{level}_scale", "log", at_class(f"{level}_scale")))
        if family in NU_FAMILIES and f"{level}_nu" in post:
            parameters.append(_normal_of(f"{level}_nu", "log_minus_one",
                                         flat_draws(post[f"{level}_nu"])))
    family = attrs.get("gpustep_population")
    if family in EPISODE_POPULATIONS and "gpustep_slow_weight" in post:
        families["gpustep"] = str(family)
        scale = at_class("gpustep_scale")
        extra_sd = np.sqrt(np.maximum(flat_draws(post["gpustep_slow_sd"]) ** 2 - 1.0, 0.0))
        parameters += [
            _normal_of("gpustep_slow_weight", "logit", flat_draws(post["gpustep_slow_weight"])),
            _normal_of("gpustep_episode_shift", "log",
                       flat_draws(post["gpustep_slow_shift"]) * scale),
            _normal_of("gpustep_episode_spread", "log", extra_sd * scale)]
    if not parameters:
        raise InputError(Problem(source, "populations", "the posterior fitted no node, GPU or "
                                 "GPU-step population to carry over"))
    unit_priors = []
    for level, fit_units in (units or {}).items():
        if level in families:
            carried = unit_prior_from(post, families[level], level, fleet_class, fit_units)
            unit_priors += [] if carried is None else [carried]
    return PopulationPrior(source=source, kernel_class=kernel_class, families=families,
                           parameters=tuple(parameters),
                           input_digest=str(posterior.attrs.get("input_digest", "")),
                           units=tuple(unit_priors))
