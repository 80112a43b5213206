"""Model specifications: a frozen, hashable description of which model to fit (DESIGN §5).

A spec names only entries of closed registries (likelihoods, populations, levels,
parameterisations, collective cost models); it never names an import path. Named specs live as
TOML in the repository's ``models/`` folder and are also built into the code, so an installed
package without the folder still knows them.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bayesprism.errors import Problem, SpecError

KINDS: tuple[str, ...] = ("kernel", "step")
#: Residual distributions of one launch's log duration.
LIKELIHOODS: tuple[str, ...] = ("lognormal", "student_t", "mixture")
#: Likelihoods without sufficient statistics: fitted on rows (one term per launch).
ROW_LIKELIHOODS: tuple[str, ...] = ("student_t", "mixture")
#: Population families of standardised unit effects (see ``bayesprism.forecast.population``).
POPULATIONS: tuple[str, ...] = ("normal", "student_t", "mixture", "degraded")
#: Families of GPU×step (transient) effects: ``degraded`` adds episodes, GPU-steps slowed by a
#: shift and spread of their own (thermal or power throttling), marginalised in closed form.
GPUSTEP_POPULATIONS: tuple[str, ...] = ("normal", "degraded", "lasting")
#: GPU×step populations with episodes (``lasting``: episodes whose state persists over steps)
EPISODE_POPULATIONS: tuple[str, ...] = ("degraded", "lasting")
#: Variance-component levels of the kernel model.
LEVELS: tuple[str, ...] = ("node", "gpu", "step", "gpustep", "cabinet")
PARAMETERISATIONS: tuple[str, ...] = ("auto", "centred", "noncentred")
COLLECTIVE_MODELS: tuple[str, ...] = ("ring", "none")

#: Prior scales (all on the log-duration scale unless the name carries a unit).
DEFAULT_PRIORS: dict[str, float] = {
    "kernel_log_median_sd": 5.0,  # sd of a class mean of log µs around log(100 µs)
    "kernel_class_sd": 1.0,  # within-class sd of kernel medians: Gamma(2) with the mean of a
    # half-normal of this scale
    "level_scale": 0.2,  # half-normal scale of every loading (node/gpu/step/gpustep/cabinet)
    "resid_scale": 0.5,  # half-normal scale of the per-class residual sd
    "nu_rate": 0.1,  # Gamma(2, rate) prior on Student-t degrees of freedom (mean 20)
    "slow_weight_beta": 19.0,  # Beta(1, b) prior on the slow mixture weight (mean 5 %)
    "slow_shift_scale": 4.0,  # half-normal scale of the slow component's shift (in pop. sds)
    # degraded population: degraded units on the reference class's log scale (not in core sds)
    "degraded_shift": 0.1,  # half-normal scale of their log shift (0.1: ~10 % slow)
    "degraded_spread": 0.05,  # half-normal scale of their extra log sd (degraded units differ)
    "episode_weight_beta": 49.0,  # Beta(1, b) prior on the share of GPU-steps in an episode
    # Beta(1, b) prior on the lag-one correlation of a GPU's episode state over its steps
    # (1.0: uniform, from independent steps to run-long episodes)
    "episode_persistence_beta": 1.0,
    # mixture residual: ε ~ (1 − w)·N(0, σ) + w·N(δ, √(σ² + τ²)), per class (log scale)
    "resid_slow_weight_beta": 19.0,  # Beta(1, b) prior on w, the share of slow launches (5 %)
    "resid_slow_shift": 0.5,  # half-normal scale of δ ≥ 0, the slow launches' log shift
    "resid_slow_sd": 0.5,  # half-normal scale of τ, the slow launches' extra log sd
    "step_noise_scale": 1.0,  # half-normal scale of the sd of steps' log residual-scale factors
    "coll_latency_us": 10.0,  # prior median of the per-step collective latency
    "coll_bandwidth_gbps": 50.0,  # prior median of the bus bandwidth
    "coll_log_sd": 2.0,  # sd of log latency / log bandwidth around their medians
    "inter_bandwidth_ratio": 0.25,  # prior median of inter/intra bandwidth (unobserved tier)
    "inter_latency_ratio": 3.0,  # prior median of inter/intra latency (unobserved tier)
    # sd of log of those ratios, and of an unobserved (collective, tier)'s ratio to the
    # collectives observed at that tier
    "tier_ratio_log_sd": 1.0,
    # sd of ρ ~ N(0, sd), the log ratio of a small message's per-step latency to a large one's
    # (bayesprism.costs.collectives.SMALL_MESSAGE_BYTES; fitted where a collective has both sizes)
    "small_latency_log_sd": 1.0,
    # half-normal scale of γ: inter-node bus bandwidth falls as (nodes / 2)^-γ (0.05: a ring
    # over 512 nodes at ~0.8x the 2-node bandwidth, at the prior median)
    "fabric_exponent": 0.05,
    # degraded links: a node's inter-node link is degraded in an allocation with probability
    # r ~ Beta(1, b) (b = 499: one node in 500), and a collective then moves its bytes
    # exp(δ) times slower, δ ~ half-normal (1.0: ~2x at the prior median)
    "degraded_link_beta": 499.0,
    "degraded_link_slowdown": 1.0,
    "coll_noise": 0.3,  # half-normal scale of the lognormal transfer noise
    "coll_congestion": 0.2,  # half-normal scale of the per-step congestion sd
}

#: Units per group above which a level's effects are fitted centred (``parameterisation=auto``).
DEFAULT_DENSE_LAUNCHES = 20.0


def _error(field_name: str, message: str, example: object = None) -> SpecError:
    return SpecError(Problem("model spec", field_name, message, example=example))


@dataclass(frozen=True)
class ModelSpec:
    """Which model to fit and with which priors.

    Parameters
    ----------
    name
        Label of the spec (``"default"``, ``"robust"``, ...), informational.
    kind
        ``"kernel"`` (kernel-level hierarchical model) or ``"step"`` (step-time model).
    likelihood
        Residual of one launch's log duration: ``"lognormal"`` (Gaussian on the log scale, fitted
        on exact sufficient statistics), ``"student_t"`` (heavy-tailed, fitted on rows; its
        ``exp`` has no finite mean, so expected maxima of durations are infinite) or
        ``"mixture"`` (two lognormal components, a core and a share of slow launches shifted
        by δ ≥ 0 and wider, fitted on rows; finite moments).
    node_population, gpu_population
        Family of the standardised node / GPU effects: ``"normal"``, ``"student_t"``,
        ``"mixture"`` (a slow component one core sd wide, shifted by a few core sds) or
        ``"degraded"`` (a tight core of healthy units and a share of degraded ones with a shift
        and a spread of their own on the log scale, however many core sds out they sit: per-GPU
        benchmark tables of a near-identical fleet). See ``bayesprism.model.effects``.
    gpustep_population
        Family of the transient GPU×step effects: ``"normal"``, ``"degraded"`` (episodes:
        a share of GPU-steps slowed by a log shift and spread of their own, as throttling
        does; the lognormal cell likelihood integrates both components out in closed form) or
        ``"lasting"`` (the same episodes, with a GPU's episode state a Markov chain over its
        steps whose persistence is fitted: ``bayesprism.model.episodes``).
    levels
        Variance components to fit, a subset of :data:`LEVELS`.
    parameterisation
        ``"centred"``, ``"noncentred"`` or ``"auto"`` (per level, centred when its units have
        at least ``dense_launches`` launches each on average).
    collective_model
        ``"ring"`` (cost model of ``bayesprism.costs.collectives`` on ``transfer_us``) or
        ``"none"``.
    step_noise
        Steps differ in how noisy they are, not only in level (warm-up repeats, interference):
        the residual sd of every launch of step s (the core's, for ``mixture``) is scaled by
        ``exp(step_noise[s])``, a centred zero-sum effect with sd ``step_noise_scale``.
        Needs the ``step`` level and a row likelihood (``student_t`` or ``mixture``): the
        cell likelihood pools squared deviations over steps.
    priors
        Named prior scales overriding :data:`DEFAULT_PRIORS`.
    dense_launches
        Threshold of the ``auto`` parameterisation.
    step
        Options of the step-level model (``kind = "step"``), read by ``bayesprism.model.step``.

    Examples
    --------
    >>> ModelSpec.load("default").kind
    'kernel'
    >>> ModelSpec.load("step").kind
    'step'
    """

    name: str = "default"
    kind: str = "kernel"
    likelihood: str = "lognormal"
    node_population: str = "student_t"
    gpu_population: str = "student_t"
    gpustep_population: str = "normal"
    levels: tuple[str, ...] = ("node", "gpu", "step", "gpustep")
    parameterisation: str = "auto"
    collective_model: str = "ring"
    step_noise: bool = False
    priors: dict[str, float] = field(default_factory=dict)
    dense_launches: float = DEFAULT_DENSE_LAUNCHES
    step: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems: list[Problem] = []

        def closed(name: str, value: object, allowed: tuple[str, ...]) -> None:
            if value not in allowed:
                problems.append(
                    Problem(
                        "model spec",
                        name,
                        "unknown value; allowed: " + ", ".join(allowed),
                        example=value,
                    )
                )

        closed("kind", self.kind, KINDS)
        closed("likelihood", self.likelihood, LIKELIHOODS)
        closed("node_population", self.node_population, POPULATIONS)
        closed("gpu_population", self.gpu_population, POPULATIONS)
        closed("gpustep_population", self.gpustep_population, GPUSTEP_POPULATIONS)
        if self.gpustep_population != "normal" and self.likelihood != "lognormal":
            problems.append(Problem("model spec", "gpustep_population",
                                    "episodes need the lognormal cell likelihood",
                                    example=self.gpustep_population))
        closed("parameterisation", self.parameterisation, PARAMETERISATIONS)
        closed("collective_model", self.collective_model, COLLECTIVE_MODELS)
        levels = self.levels
        if isinstance(levels, str) or not all(isinstance(v, str) for v in levels):
            problems.append(
                Problem("model spec", "levels", "must be a list of level names", example=levels)
            )
        else:
            object.__setattr__(self, "levels", tuple(levels))
            for level in levels:
                closed("levels", level, LEVELS)
            if len(set(levels)) != len(levels):
                problems.append(
                    Problem("model spec", "levels", "a level is listed twice", example=list(levels))
                )
        if not isinstance(self.priors, dict):
            problems.append(
                Problem("model spec", "priors", "must be a table of numbers", example=self.priors)
            )
        else:
            for key, value in self.priors.items():
                if key not in DEFAULT_PRIORS:
                    problems.append(
                        Problem(
                            "model spec",
                            f"priors.{key}",
                            "unknown prior; allowed: " + ", ".join(DEFAULT_PRIORS),
                        )
                    )
                elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    problems.append(
                        Problem(
                            "model spec",
                            f"priors.{key}",
                            "must be a positive number",
                            example=value,
                        )
                    )
        if (
            isinstance(self.dense_launches, bool)
            or not isinstance(self.dense_launches, (int, float))
            or self.dense_launches <= 0
        ):
            problems.append(
                Problem(
                    "model spec",
                    "dense_launches",
                    "must be a positive number",
                    example=self.dense_launches,
                )
            )
        if not isinstance(self.step_noise, bool):
            problems.append(Problem("model spec", "step_noise", "must be true or false",
                                    example=self.step_noise))
        elif self.step_noise and self.kind == "kernel" and (
                "step" not in self.levels or self.likelihood not in ROW_LIKELIHOODS):
            problems.append(Problem(
                "model spec", "step_noise",
                "needs the 'step' level and a row likelihood ("
                + " or ".join(ROW_LIKELIHOODS) + "): the cell likelihood pools squared "
                "deviations over steps", example=f"likelihood={self.likelihood}, "
                f"levels={list(self.levels)}"))
        if not isinstance(self.step, dict):
            problems.append(Problem("model spec", "step", "must be a table", example=self.step))
        if problems:
            raise SpecError(problems)

    def __hash__(self) -> int:  # dict fields are unhashable; hash the canonical form instead
        return hash(self.spec_hash())

    # -- derived values ---------------------------------------------------------------------
    def prior(self, name: str) -> float:
        """The prior scale ``name`` (spec override or :data:`DEFAULT_PRIORS`)."""
        if name not in DEFAULT_PRIORS:
            raise KeyError(f"unknown prior {name!r}")
        return float(self.priors.get(name, DEFAULT_PRIORS[name]))

    @property
    def fits_rows(self) -> bool:
        """True when the residual has no sufficient statistics and is fitted on launches."""
        return self.likelihood in ROW_LIKELIHOODS

    def population(self, level: str) -> str:
        """Population family of a level (node, GPU, GPU×step; other levels are normal)."""
        return {"node": self.node_population, "gpu": self.gpu_population,
                "gpustep": self.gpustep_population}.get(level, "normal")

    # -- (de)serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/TOML-able dict (lists, not tuples)."""
        out = asdict(self)
        out["levels"] = list(self.levels)
        out["priors"] = dict(sorted(self.priors.items()))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """Build from a dict such as :meth:`to_dict` returns; unknown keys raise ``SpecError``."""
        if not isinstance(data, dict):
            raise _error("", "a model spec must be a table of fields", example=data)
        known = {f.name for f in fields(cls)}
        unknown = [k for k in data if k not in known]
        if unknown:
            raise SpecError(
                [
                    Problem(
                        "model spec", key, "unknown field; allowed: " + ", ".join(sorted(known))
                    )
                    for key in unknown
                ]
            )
        values = dict(data)
        if "levels" in values and isinstance(values["levels"], list):
            values["levels"] = tuple(values["levels"])
        try:
            return cls(**values)
        except TypeError as exc:  # wrong value types caught by dataclass construction
            raise _error("", str(exc)) from None

    def spec_hash(self) -> str:
        """Stable hex digest of :meth:`to_dict` (key order and tuple/list independent)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_toml(self) -> str:
        """TOML text that :meth:`load` reads back to an equal spec."""
        d = self.to_dict()
        lines = []
        for key, value in d.items():
            if isinstance(value, dict):
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        for key in ("priors", "step"):
            if d[key]:
                lines.append("")
                lines.append(f"[{key}]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in d[key].items())
        return "\n".join(lines) + "\n"

    @classmethod
    def default(cls) -> ModelSpec:
        """The default kernel-level spec (equal to ``models/default.toml``)."""
        return BUILTIN_SPECS["default"]

    @classmethod
    def load(cls, name_or_path: str | Path) -> ModelSpec:
        """Load a spec from a TOML file, or by bare name from ``models/`` (else the built-ins).

        Raises
        ------
        SpecError
            If the file cannot be read or parsed, a field is unknown, or the name is unknown.
        """
        text = str(name_or_path)
        path = Path(text)
        looks_like_path = path.suffix == ".toml" or "/" in text or path.exists()
        if not looks_like_path:
            candidate = MODELS_DIR / f"{text}.toml"
            if candidate.is_file():
                path = candidate
            elif text in BUILTIN_SPECS:
                return BUILTIN_SPECS[text]
            else:
                raise SpecError(
                    Problem(
                        "model spec",
                        "name",
                        "no such named spec; known: " + ", ".join(sorted(_known_names())),
                        example=text,
                    )
                )
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SpecError(Problem(str(path), "", "spec file not found")) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(Problem(str(path), "", f"cannot read spec file: {exc}")) from None
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(Problem(str(path), "", f"invalid TOML: {exc}")) from None
        try:
            return cls.from_dict(raw)
        except SpecError as exc:
            raise SpecError(
                [
                    Problem(str(path), p.field, p.message, p.count, p.example)
                    if isinstance(p, Problem)
                    else p
                    for p in exc.problems
                ]
            ) from None


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


#: The repository's ``models/`` folder (absent in an installed package: built-ins are used).
MODELS_DIR = Path(__file__).resolve().parents[1] / "models"


def _known_names() -> set[str]:
    names = set(BUILTIN_SPECS)
    if MODELS_DIR.is_dir():
        names.update(p.stem for p in MODELS_DIR.glob("*.toml"))
    return names


BUILTIN_SPECS: dict[str, ModelSpec] = {
    # GPU×step episodes (throttling) are what the largest jobs meet most often
    "default": ModelSpec(gpustep_population="degraded"),
    # ... and they last over steps (bayesprism.model.episodes)
    "lasting": ModelSpec(name="lasting", gpustep_population="lasting"),
    "robust": ModelSpec(
        name="robust",
        likelihood="mixture",
        node_population="student_t",
        gpu_population="mixture",
    ),
    "step": ModelSpec(
        name="step",
        kind="step",
        levels=(),
        collective_model="none",
    ),
    "benchmark": ModelSpec(
        name="benchmark",
        likelihood="mixture",
        node_population="degraded",
        levels=("cabinet", "node", "gpu", "step"),
        collective_model="none",
        step_noise=True,
    ),
}
