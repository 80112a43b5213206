"""Parallel plans and clusters: the validated value types a forecast is asked about.

A :class:`ParallelPlan` says how one training step is laid out on GPUs (data, tensor, pipeline,
context and expert parallelism, micro-batches, pipeline schedule, optimizer sharding and how
much data-parallel communication is hidden behind compute). A :class:`Cluster` says what the
GPUs sit in (GPUs per node, optional link-tier overrides, optional measured nodes to use).

Both are frozen dataclasses validated on construction: every problem is collected and raised at
once as one :class:`~bayesprism.errors.PlanError` whose lines name the plan, the field and the
offending value. Questionable but possible layouts raise a :class:`PlanWarning` instead.

Plan files (TOML)
-----------------
One plan per file, as top-level keys or as a single ``[plan]`` table::

    name = "gpt-1k"
    dp = 16
    tp = 8
    pp = 8
    microbatches = 32
    schedule = "1f1b"

or several plans as an array of tables (each ``[[plan]]`` starts one plan)::

    [[plan]]
    name = "small"
    dp = 4
    [[plan]]
    name = "big"
    dp = 64

A file may also hold one ``[cluster]`` table, read by :meth:`Cluster.from_toml`.
Unknown keys are errors (a typo never silently falls back to a default).
"""

from __future__ import annotations

import math
import re
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from bayesprism.errors import PlanError, Problem

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
SHARDINGS: tuple[str, ...] = ("none", "zero1", "zero2", "fsdp")
#: Schedules that keep at most ``pp`` micro-batches in flight and need ``microbatches >= pp``
#: to reach their steady state.
ONE_F_ONE_B_SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved-1f1b", "zero-bubble")
TIER_KEYS: tuple[str, ...] = ("latency_us", "bandwidth_gbps")


_AUTO_NAME = re.compile(
    r"^dp\d+-tp\d+-pp\d+(-cp\d+)?(-ep\d+)?-m\d+(-v\d+)?"
    r"-(gpipe|1f1b|interleaved-1f1b|zero-bubble)(-(zero1|zero2|fsdp))?$"
)


def nodes_spanned(span: int, gpus_per_node: int) -> int:
    """Most nodes one group of ``span`` consecutive ranks covers.

    The groups tile the ranks from rank 0 and node ``i`` holds ranks ``i * gpus_per_node ...``.
    A group starts at a multiple of ``span``, so its offset within a node is a multiple of
    ``gcd(span, gpus_per_node)``, at most ``gpus_per_node - gcd``; a span that does not divide
    the node size leaves some group straddling a node boundary.

    Examples
    --------
    >>> nodes_spanned(8, 8), nodes_spanned(7, 8), nodes_spanned(16, 8), nodes_spanned(12, 8)
    (1, 2, 2, 2)
    """
    largest_offset = gpus_per_node - math.gcd(span, gpus_per_node)
    return (largest_offset + span - 1) // gpus_per_node + 1


class PlanWarning(UserWarning):
    """A plan is possible but likely wasteful or unusual (e.g. TP across nodes)."""


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: Plan fields checked one by one: positive integers (required / ``None`` allowed) and
#: positive numbers (``None`` allowed), in the order their problems are reported.
_REQUIRED_INTS = ("dp", "tp", "pp", "cp", "ep", "microbatches", "virtual_stages", "gpus_per_node")
_OPTIONAL_INTS = ("steps", "layers", "heads", "world_size", "nodes_per_leaf")
_OPTIONAL_NUMBERS = ("activation_bytes", "gradient_bytes", "micro_batch_size")
#: Largest world size a plan may ask about: 100 times the largest training clusters, so a typo
#: (dp = 10**12) is an error at the boundary rather than a failure deep in the fast path.
MAX_GPUS = 10_000_000
#: Largest allowed value of each numeric plan field (the smallest is 1, or above 0).
FIELD_MAX: dict[str, float] = {
    **dict.fromkeys(("dp", "tp", "pp", "cp", "ep", "world_size"), MAX_GPUS),
    "microbatches": 1_000_000, "virtual_stages": 10_000, "gpus_per_node": 1024,
    "steps": 10**12, "layers": 1_000_000, "heads": 1_000_000, "nodes_per_leaf": 1_000_000,
    "activation_bytes": 1e15, "gradient_bytes": 1e18, "micro_batch_size": 1e9,
}


def _field_problem(name: str, value: object) -> str | None:
    """Why one plan field's value is out of range, or None when it is fine."""
    if name in _REQUIRED_INTS or (name in _OPTIONAL_INTS and value is not None):
        if not _is_positive_int(value):
            return "must be a positive integer"
        return None if value <= FIELD_MAX[name] else \
            f"must be a positive integer <= {FIELD_MAX[name]:,}"
    if name in _OPTIONAL_NUMBERS and value is not None:
        if not (_is_number(value) and math.isfinite(value) and value > 0):
            return "must be a positive number"
        return None if value <= FIELD_MAX[name] else \
            f"must be a positive number <= {FIELD_MAX[name]:g}"
    if name == "name" and value is not None and not isinstance(value, str):
        return "must be a string"
    if name == "overlap" and not (_is_number(value) and 0.0 <= float(value) <= 1.0):
        return "must be a fraction between 0 and 1"
    if name == "schedule" and value not in SCHEDULES:
        return f"unknown schedule; allowed: {', '.join(SCHEDULES)}"
    if name == "sharding" and value not in SHARDINGS:
        return f"unknown sharding; allowed: {', '.join(SHARDINGS)}"
    return None


def field_problems(values: Mapping[str, Any], where: str = "plan") -> list[Problem]:
    """Range problems of :class:`ParallelPlan` field values, each field on its own.

    The one check of single values, shared by plans and by layout facts a user states for a
    traced run (:mod:`bayesprism.ingest.layout`); relations between fields (``world_size``,
    ``ep`` dividing ``dp``, interleaving) are checked by :class:`ParallelPlan` alone.

    Parameters
    ----------
    values
        Some or all plan fields, e.g. ``{"virtual_stages": 12, "schedule": "1f1b"}``; keys
        that are not plan fields are ignored.
    where
        Named in each problem (file, plan).

    Returns
    -------
    list of Problem
        One per bad value (field, message, value), in plan field order.
    """
    order = (*_REQUIRED_INTS, *_OPTIONAL_INTS, *_OPTIONAL_NUMBERS, "name", "overlap",
             "schedule", "sharding")
    problems = []
    for name in (n for n in order if n in values):
        message = _field_problem(name, values[name])
        if message is not None:
            problems.append(Problem(where, name, message, example=values[name]))
    return problems


@dataclass(frozen=True)
class ParallelPlan:
    """How one training step is laid out on ``dp * tp * pp * cp`` GPUs.

    Parameters
    ----------
    dp, tp, pp, cp, ep
        Data-, tensor-, pipeline-, context- and expert-parallel degrees (``ep`` divides ``dp``;
        expert ranks are carved out of the data-parallel ranks).
    microbatches
        Micro-batches per step per data-parallel rank (gradient-accumulation steps). The
        micro-batch size is the traced run's (see ``bayesprism.forecast.composition``).
    virtual_stages
        Model chunks per pipeline rank; only with ``schedule="interleaved-1f1b"``.
    schedule
        One of :data:`SCHEDULES`.
    sharding
        Optimizer/parameter sharding, one of :data:`SHARDINGS`.
    overlap
        Fraction (0-1) of data-parallel communication hidden behind compute.
    gpus_per_node
        GPUs per node (decides which groups cross nodes); a :class:`Cluster` overrides it.
    name
        Label; defaults to a description of the layout.
    steps
        Training steps, for training-time forecasts (optional).
    layers
        Model depth, to check that every (virtual) pipeline stage gets a layer (optional).
    heads
        Attention heads, or key/value heads (query groups) with grouped-query attention: tensor
        parallelism splits them, so ``tp`` must divide them (optional).
    world_size
        When given, must equal ``dp * tp * pp * cp``.
    activation_bytes
        Bytes of one micro-batch's activation at a layer boundary; needed only when the target
        uses tensor/pipeline parallelism the traced run did not have (optional).
    gradient_bytes
        Bytes of the whole model's gradients; needed only when the traced run had no
        data-parallel collectives and the target has ``dp * cp > 1`` (optional).
    micro_batch_size
        Samples per micro-batch; defaults to the traced (or fitted) runs' micro-batch size.
        Step-level forecasts scale per-micro-batch work with it (optional).
    nodes_per_leaf
        Nodes under one leaf switch (or scalable unit) of the fabric: step-level forecasts add
        a cost tier when a gradient group spans more (``bayesprism.forecast.stepscale``; optional).
    source
        Where the plan came from (file path), used in error messages.

    Examples
    --------
    >>> plan = ParallelPlan(dp=8, tp=4, pp=2, microbatches=8)
    >>> plan.gpus, plan.name
    (64, 'dp8-tp4-pp2-m8-1f1b')
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    microbatches: int = 1
    virtual_stages: int = 1
    schedule: str = "1f1b"
    sharding: str = "none"
    overlap: float = 0.0
    gpus_per_node: int = 8
    name: str | None = None
    steps: int | None = None
    layers: int | None = None
    heads: int | None = None
    world_size: int | None = None
    activation_bytes: float | None = None
    gradient_bytes: float | None = None
    micro_batch_size: float | None = None
    nodes_per_leaf: int | None = None
    source: str = field(default="plan", compare=False, repr=False)

    def __post_init__(self) -> None:
        problems, notes = self._check()
        if problems:
            raise PlanError(problems)
        for note in notes:
            warnings.warn(note, PlanWarning, stacklevel=3)
        # a generated name follows the layout, also through dataclasses.replace
        if self.name is None or (_AUTO_NAME.match(self.name) and self.name != self.describe()):
            object.__setattr__(self, "name", self.describe())

    # ------------------------------------------------------------------ validation
    def _where(self) -> str:
        return f"{self.source} {self.name!r}" if self.name else self.source

    def _check(self) -> tuple[list[Problem], list[str]]:
        where = self._where()
        problems: list[Problem] = []
        notes: list[str] = []

        def bad(name: str, message: str, value: object) -> None:
            problems.append(Problem(where, name, message, example=value))

        problems.extend(field_problems({f.name: getattr(self, f.name) for f in fields(self)},
                                       where))
        if problems:  # the relations below need valid numbers
            return problems, notes

        gpus = self.gpus
        if gpus > MAX_GPUS:
            bad("dp", f"dp*tp*pp*cp = {gpus:,} GPUs exceeds the largest plan allowed, "
                f"{MAX_GPUS:,} GPUs", self.dp)
        if self.world_size is not None and self.world_size != gpus:
            bad(
                "world_size",
                f"must equal dp*tp*pp*cp = {self.dp}*{self.tp}*{self.pp}*{self.cp} = {gpus}",
                self.world_size,
            )
        if self.dp % self.ep:
            bad("ep", f"must divide the data-parallel degree dp = {self.dp}", self.ep)
        interleaved = self.schedule == "interleaved-1f1b"
        if self.virtual_stages > 1 and not interleaved:
            bad(
                "virtual_stages",
                f"only used by schedule 'interleaved-1f1b', not {self.schedule!r}",
                self.virtual_stages,
            )
        if interleaved:
            if self.pp < 2:
                bad("pp", "schedule 'interleaved-1f1b' needs pp >= 2", self.pp)
            if self.virtual_stages < 2:
                bad("virtual_stages", "schedule 'interleaved-1f1b' needs >= 2", self.virtual_stages)
            if self.microbatches % self.pp:
                bad(
                    "microbatches",
                    f"schedule 'interleaved-1f1b' needs a multiple of pp = {self.pp}",
                    self.microbatches,
                )
        if self.layers is not None and self.pp * self.virtual_stages > self.layers:
            bad(
                "pp",
                f"pp*virtual_stages = {self.pp * self.virtual_stages} stages exceed "
                f"layers = {self.layers}",
                self.pp,
            )
        if self.schedule in ONE_F_ONE_B_SCHEDULES and self.microbatches < self.pp:
            notes.append(
                f"{where}: microbatches = {self.microbatches} < pp = {self.pp}: schedule "
                f"{self.schedule!r} never reaches its steady state (the bubble dominates)"
            )
        if self.heads is not None and self.heads % self.tp:
            bad("tp", f"must divide heads = {self.heads} (tensor parallelism splits the "
                "attention heads)", self.tp)
        if self.tp > self.gpus_per_node:
            notes.append(
                f"{where}: tp = {self.tp} > gpus_per_node = {self.gpus_per_node}: "
                "tensor-parallel collectives cross nodes (tp <= gpus_per_node is recommended)"
            )
        elif self.gpus_per_node % self.tp:
            notes.append(
                f"{where}: tp = {self.tp} does not divide gpus_per_node = "
                f"{self.gpus_per_node}: some tensor-parallel groups straddle two nodes, and "
                "every step waits for their inter-node collectives"
            )
        return problems, notes

    # ------------------------------------------------------------------ derived values
    @property
    def gpus(self) -> int:
        """World size ``dp * tp * pp * cp``."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def nodes(self) -> int:
        """Nodes needed at ``gpus_per_node`` GPUs per node (the last one may be partial)."""
        return math.ceil(self.gpus / self.gpus_per_node)

    def describe(self) -> str:
        """A compact label such as ``dp16-tp8-pp8-m32-1f1b``."""
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        parts += [f"{k}{getattr(self, k)}" for k in ("cp", "ep") if getattr(self, k) != 1]
        parts.append(f"m{self.microbatches}")
        if self.virtual_stages > 1:
            parts.append(f"v{self.virtual_stages}")
        parts.append(self.schedule)
        if self.sharding != "none":
            parts.append(self.sharding)
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain fields (without ``source``), JSON-serialisable."""
        out = asdict(self)
        out.pop("source")
        return out

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "plan") -> ParallelPlan:
        """Build a plan from a mapping; unknown keys are reported with the other problems."""
        known = {f.name for f in fields(cls)} - {"source"}
        unknown = sorted(set(values) - known)
        label = values.get("name")
        where = f"{source} {label!r}" if isinstance(label, str) else source
        problems = [
            Problem(where, key, f"unknown plan field; allowed: {', '.join(sorted(known))}")
            for key in unknown
        ]
        kwargs = {k: v for k, v in values.items() if k in known}
        try:
            plan = cls(**kwargs, source=source)
        except PlanError as exc:
            raise PlanError(problems + exc.problems) from None
        if problems:
            raise PlanError(problems)
        return plan

    @classmethod
    def from_toml(cls, path: str | Path) -> list[ParallelPlan]:
        """All plans of a TOML file (see the module docstring for the layout)."""
        path = Path(path)
        data = _read_toml(path)
        data.pop("cluster", None)
        if "plan" in data:
            rest = sorted(set(data) - {"plan"})
            if rest:
                raise PlanError(
                    Problem(str(path), key, "unexpected top-level key beside [plan] tables")
                    for key in rest
                )
            tables = data["plan"]
            tables = [tables] if isinstance(tables, dict) else tables
        else:
            tables = [data]
        if not tables or not all(isinstance(t, dict) for t in tables):
            raise PlanError(Problem(str(path), "plan", "no plan table found"))
        empty = [i for i, t in enumerate(tables) if not t]
        if empty:
            where = str(path) if len(tables) == 1 else f"{path}[plan {empty[0]}]"
            # an empty table would silently forecast the default 1-GPU plan
            raise PlanError(Problem(where, "plan", "no plan fields (the file or table is "
                                    "empty); give at least dp, e.g. dp = 8"))
        plans: list[ParallelPlan] = []
        problems: list[Problem | str] = []
        for index, table in enumerate(tables):
            source = str(path) if len(tables) == 1 else f"{path}[plan {index}]"
            try:
                plans.append(cls.from_dict(table, source=source))
            except PlanError as exc:
                problems.extend(exc.problems)
        if problems:
            raise PlanError(problems)
        return plans


def _read_toml(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise PlanError(Problem(str(path), "", "is a directory, expected a plan file (TOML)"))
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(Problem(str(path), "", f"invalid TOML: {exc}")) from None
    except UnicodeDecodeError as exc:
        raise PlanError(Problem(str(path), "", f"not UTF-8 text (byte {exc.start}: "
                                f"{exc.reason}); TOML files are UTF-8")) from None
    except RecursionError:
        raise PlanError(Problem(str(path), "", "invalid TOML: nested too deeply")) from None


@dataclass(frozen=True)
class Cluster:
    """What the plan runs on.

    Parameters
    ----------
    gpus_per_node
        GPUs per node; overrides the plan's ``gpus_per_node``.
    tiers
        Optional link-tier overrides ``{"intra"|"inter": {"latency_us": .., "bandwidth_gbps": ..}}``
        replacing the posterior's collective cost parameters of that tier in every draw (noise
        and congestion are kept), e.g. to ask about a faster fabric.
    nodes
        Names of *measured* nodes (as in the posterior's ``node`` coordinate) to run on: the
        first nodes of the plan use their own posterior effects; further nodes are new ones
        drawn from the population.
    source
        Where the cluster came from, for error messages.

    Examples
    --------
    >>> Cluster(gpus_per_node=4, nodes=("n1", "n2")).nodes
    ('n1', 'n2')
    """

    gpus_per_node: int = 8
    tiers: Mapping[str, Mapping[str, float]] | None = None
    nodes: tuple[str, ...] = ()
    source: str = field(default="cluster", compare=False, repr=False)

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        if not _is_positive_int(self.gpus_per_node):
            problems.append(
                Problem(
                    self.source,
                    "gpus_per_node",
                    "must be a positive integer",
                    example=self.gpus_per_node,
                )
            )
        object.__setattr__(self, "nodes", tuple(self.nodes))
        for node in self.nodes:
            if not isinstance(node, str):
                problems.append(Problem(self.source, "nodes", "must be node names", example=node))
        if len(set(self.nodes)) != len(self.nodes):
            problems.append(Problem(self.source, "nodes", "lists a node twice"))
        if self.tiers is not None:
            tiers = {}
            for tier, values in dict(self.tiers).items():
                if tier not in ("intra", "inter"):
                    problems.append(
                        Problem(
                            self.source,
                            "tiers",
                            "unknown tier; allowed: intra, inter",
                            example=tier,
                        )
                    )
                    continue
                values = dict(values)
                for key, value in values.items():
                    if key not in TIER_KEYS:
                        problems.append(
                            Problem(
                                self.source,
                                f"tiers.{tier}",
                                f"unknown key; allowed: {', '.join(TIER_KEYS)}",
                                example=key,
                            )
                        )
                    elif not (_is_number(value) and value > 0):
                        problems.append(
                            Problem(
                                self.source,
                                f"tiers.{tier}.{key}",
                                "must be a positive number",
                                example=value,
                            )
                        )
                tiers[tier] = values
            object.__setattr__(self, "tiers", tiers)
        if problems:
            raise PlanError(problems)

    @classmethod
    def from_toml(cls, path: str | Path) -> Cluster | None:
        """The ``[cluster]`` table of a TOML file, or ``None`` when it has none."""
        path = Path(path)
        table = _read_toml(path).get("cluster")
        if table is None:
            return None
        allowed = ("gpus_per_node", "tiers", "nodes")
        unknown = sorted(set(table) - set(allowed))
        if unknown:
            raise PlanError(
                Problem(
                    f"{path} [cluster]",
                    key,
                    f"unknown cluster field; allowed: {', '.join(allowed)}",
                )
                for key in unknown
            )
        return cls(**table, source=f"{path} [cluster]")


def plan_from_run(meta: Mapping[str, Any], *, name: str | None = None,
                  run: str | None = None) -> ParallelPlan:
    """The layout a logged or traced run used, as a plan.

    The sizes are those of :func:`bayesprism.inventory.run_layout` (what the step model fits):
    ``dp`` derived from the world size when not recorded, the micro-batch size from the global
    batch when the launch config did not give it. The plan's ``schedule``, ``sharding``,
    ``overlap`` and ``ep`` are taken when the run records them (e.g. stated by the user with
    ``read_traces(..., layout=...)``); more than one virtual stage means
    ``"interleaved-1f1b"`` unless a schedule is recorded, else ``"1f1b"``.

    Parameters
    ----------
    meta
        One run's metadata, ``table.attrs["runs"][run]``: its ``plan`` (dp, tp, pp, cp, ep,
        microbatches, micro_batch_size, virtual_stages, schedule, sharding, overlap),
        ``world_size``, ``gpus_per_node`` and ``global_batch``.
    name
        Label; defaults to ``"<GPUs> GPUs"``.
    run
        The run's label, named in error messages.

    Raises
    ------
    PlanError
        If the run carries no usable layout (no dp and no world size, or sizes that are not
        positive integers or do not multiply to the world size).
    """
    # deferred for start-up time: ingest workers import this module, inventory loads xarray
    from bayesprism.inventory import run_layout

    label = run or str(meta.get("system_id") or "run")
    recorded = dict(meta.get("plan") or {})
    layout, problems = run_layout(label, meta, source="run metadata")
    # a plan without micro-batches is still a plan (1 per step); the step model asks for them
    problems = [p for p in problems if not str(p.field).endswith("plan.microbatches")]
    if problems or not layout.get("dp"):
        raise PlanError(problems or Problem(label, "plan", "the run's metadata has no parallel "
                                            "layout (dp and world_size missing)"))
    values = {key: int(layout[key]) for key in ("dp", "tp", "pp", "cp", "ep", "virtual_stages")}
    values["microbatches"] = int(layout["microbatches"] or 1)
    if layout.get("micro_batch_size_known"):
        values["micro_batch_size"] = layout["micro_batch_size"]
    for key in ("sharding", "overlap"):
        if recorded.get(key) is not None:
            values[key] = recorded[key]
    schedule = recorded.get("schedule")
    values["schedule"] = schedule or ("interleaved-1f1b" if values["virtual_stages"] > 1
                                      else "1f1b")
    plan = ParallelPlan(**values, gpus_per_node=int(layout["gpus_per_node"]))
    return replace(plan, name=name or f"{plan.gpus} GPUs")
