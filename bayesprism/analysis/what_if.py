"""What if: forecast deltas of a plan under changes to kernels, links, nodes or the schedule.

:func:`what_if` applies a set of :class:`Changes` to the posterior, the plan and the cluster,
and recomposes with the same posterior draws and seed as the base forecast (common random
numbers), so the reported deltas are precise even when they are small.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from bayesprism.analysis.counterfactual import (
    THRESHOLDS,
    PerDraw,
    check_kernel_posterior,
    compose_with_seed,
    estimate,
    scale_variable,
    shift_variable,
    slowdown_ratios,
    summary,
)
from bayesprism.errors import InputError, Problem
from bayesprism.forecast.forecasting import threshold_key
from bayesprism.forecast.slots import cluster_nodes, drained_cluster, rank_nodes, with_nodes
from bayesprism.forecast.workload import collective_model_classes
from bayesprism.posterior import posterior_group, thin_draws, with_posterior_group

__all__ = ["Changes", "apply_changes", "what_if"]

_CHANGE_KEYS = ("faster", "bandwidth", "latency", "drain", "schedule", "microbatches")


@dataclass(frozen=True)
class Changes:
    """A set of changes applied together by :func:`what_if`.

    Attributes
    ----------
    faster
        Kernel class -> fraction x in [0, 1): every kernel of the class takes (1 − x) of its
        time (``kernel_log_median`` shifted by log(1 − x)). For a collective with the fitted
        cost model (``collective_model`` in the posterior group's attrs) its transfer time is scaled
        instead (latency × (1 − x), bandwidth ÷ (1 − x)).
    bandwidth
        Collective (``"allreduce"``) or collective and tier (``"allreduce/inter"``) ->
        multiplier of its bus bandwidth ``coll_bandwidth_gbps`` (2.0 = twice as fast links).
    latency
        Same keys -> multiplier of its per-step latency ``coll_latency_us``.
    drain
        Number of nodes to drain (the k slowest measured nodes by posterior mean node effect)
        or a list of node names, removed from the cluster's node list (default list: every
        measured node of the posterior, in its order; base and changed forecasts both use it).
        If the remaining nodes still hold the plan, it is unchanged (spares absorb the loss);
        otherwise dp shrinks and micro-batches grow to keep the global batch, see
        :func:`bayesprism.analysis.placement.drained_cluster`.
    schedule
        Pipeline schedule replacing the plan's (``"1f1b"``, ``"zero-bubble"``, ...).
    microbatches
        Micro-batch count replacing the plan's.

    Examples
    --------
    >>> Changes.from_dict({"faster": {"gemm": 0.1}, "drain": 2}).to_dict()
    {'faster': {'gemm': 0.1}, 'drain': 2}
    """

    faster: Mapping[str, float] = field(default_factory=dict)
    bandwidth: Mapping[str, float] = field(default_factory=dict)
    latency: Mapping[str, float] = field(default_factory=dict)
    drain: int | Sequence[str] = 0
    schedule: str | None = None
    microbatches: int | None = None

    @classmethod
    def from_dict(cls, changes: Mapping, source: str = "changes") -> Changes:
        """Build from a plain mapping (e.g. parsed TOML/JSON), reporting every bad entry at once."""
        problems = [
            Problem(source, str(key), f"unknown change; expected one of {_CHANGE_KEYS}")
            for key in changes
            if key not in _CHANGE_KEYS
        ]
        if problems:
            raise InputError(problems)
        return cls(**{k: changes[k] for k in _CHANGE_KEYS if k in changes}).validated(source)

    def validated(self, source: str = "changes") -> Changes:
        """Return self after checking every value; raises ``InputError`` listing all problems."""
        problems: list[Problem] = []
        for name in ("faster", "bandwidth", "latency"):
            mapping = getattr(self, name)
            if not isinstance(mapping, Mapping):
                problems.append(Problem(source, name, "must be a mapping", example=mapping))
                continue
            for key, value in mapping.items():
                ok = isinstance(value, (int, float)) and math.isfinite(value)
                if name == "faster" and not (ok and 0 <= value < 1):
                    problems.append(
                        Problem(
                            source, f"faster.{key}", "must be a fraction in [0, 1)", example=value
                        )
                    )
                elif name != "faster" and not (ok and value > 0):
                    problems.append(
                        Problem(
                            source, f"{name}.{key}", "must be a positive multiplier", example=value
                        )
                    )
        drain = self.drain
        if isinstance(drain, (int, np.integer)) and not isinstance(drain, bool):
            if drain < 0:
                problems.append(Problem(source, "drain", "must be >= 0", example=drain))
        elif isinstance(drain, str) or not isinstance(drain, Sequence):
            problems.append(
                Problem(
                    source, "drain", "must be a node count or a list of node names", example=drain
                )
            )
        if self.microbatches is not None and (
            not isinstance(self.microbatches, (int, np.integer)) or self.microbatches < 1
        ):
            problems.append(
                Problem(
                    source, "microbatches", "must be a positive integer", example=self.microbatches
                )
            )
        if problems:
            raise InputError(problems)
        return self

    def to_dict(self) -> dict:
        """JSON-ready form (only the changes that do something)."""
        out: dict = {}
        for key in _CHANGE_KEYS:
            value = getattr(self, key)
            if value in (None, 0, {}, [], ()):
                continue
            out[key] = (
                dict(value)
                if isinstance(value, Mapping)
                else (list(value) if isinstance(value, (list, tuple)) else value)
            )
        return out


def _collective_selection(group: xr.Dataset, name: str, key: str, field_name: str) -> dict:
    """Selection of ``group[name]`` named by ``"collective"`` or ``"collective/tier"``."""
    collective, _, tier = key.partition("/")
    if name not in group:
        raise InputError(
            Problem("posterior", name, "the posterior has no collective cost model", example=key)
        )
    known = [str(c) for c in group[name]["collective"].to_numpy()]
    if collective not in known:
        raise InputError(
            Problem(
                "changes",
                f"{field_name}.{key}",
                f"unknown collective; fitted: {known}",
                example=key,
            )
        )
    selection: dict = {"collective": collective}
    if tier:
        tiers = [str(t) for t in group[name]["tier"].to_numpy()]
        if tier not in tiers:
            raise InputError(
                Problem(
                    "changes", f"{field_name}.{key}", f"unknown tier; expected {tiers}", example=key
                )
            )
        selection["tier"] = tier
    return selection


def apply_changes(posterior: xr.DataTree, changes: Changes) -> xr.DataTree:
    """A copy of ``posterior`` with the kernel-speed and collective changes applied."""
    group = posterior_group(posterior)
    cost_model = collective_model_classes(posterior, group)
    for cls, fraction in changes.faster.items():
        if fraction == 0:
            continue
        if cls in cost_model and "coll_latency_us" in group:
            group = scale_variable(group, "coll_latency_us", 1.0 - fraction, collective=cls)
            group = scale_variable(
                group, "coll_bandwidth_gbps", 1.0 / (1.0 - fraction), collective=cls
            )
            continue
        if "inventory" not in posterior.children or "kernel_class" not in posterior["inventory"]:
            raise InputError(Problem("posterior", "inventory.kernel_class", "missing"))
        classes = posterior["inventory"]["kernel_class"].astype(str)
        if not bool((classes == cls).any()):
            known = sorted(set(classes.to_numpy().tolist()))
            raise InputError(
                Problem(
                    "changes",
                    f"faster.{cls}",
                    f"unknown kernel class; fitted: {known}",
                    example=cls,
                )
            )
        mask = (classes == cls).reindex(kernel=group["kernel"], fill_value=False)
        group = shift_variable(group, "kernel_log_median", math.log1p(-fraction), mask)
    for name, field_name in (("coll_bandwidth_gbps", "bandwidth"), ("coll_latency_us", "latency")):
        for key, multiplier in getattr(changes, field_name).items():
            selection = _collective_selection(group, name, key, field_name)
            group = scale_variable(group, name, multiplier, **selection)
    return with_posterior_group(posterior, group)


def _plan_summary(plan) -> dict:
    keys = ("dp", "tp", "pp", "cp", "ep", "microbatches", "virtual_stages", "schedule")
    return {k: getattr(plan, k) for k in keys if hasattr(plan, k)}


def what_if(
    posterior: xr.DataTree,
    plan,
    changes: Changes | Mapping,
    *,
    draws: int | None = 200,
    replicates: int = 64,
    random_seed: int = 0,
    cluster=None,
    thresholds: Sequence[float] = THRESHOLDS,
) -> dict:
    """Forecast deltas of a plan under a set of changes, against the unchanged plan.

    Parameters
    ----------
    posterior
        Kernel-level fit (docs/artifacts.md).
    plan
        ``bayesprism.plan.ParallelPlan`` (the base).
    changes
        :class:`Changes` or a mapping with its field names, e.g. ``{"faster": {"gemm": 0.1},
        "bandwidth": {"allreduce": 2.0}, "latency": {"allreduce/inter": 0.5}, "drain": 2,
        "schedule": "zero-bubble", "microbatches": 64}``. All changes are applied together.
    draws, replicates, random_seed, cluster, thresholds
        As in :func:`bayesprism.analysis.sensitivity.sensitivity`; both forecasts use the same draws
        and seed (common random numbers).

    Returns
    -------
    dict
        ``base`` and ``changed``: summaries (``mean_s``, ``p50_s``, ``p95_s``, ``slowdown_p``
        with ``*_ci90`` intervals and ``ideal_step_time_s``); ``deltas``: changed − base per
        posterior draw (negative = faster), as ``{"mean_s": {"estimate", "ci90"}, "p50_s": ...,
        "p95_s": ..., "slowdown_p": {"1.05": {"estimate", "ci90"}, ...}}``; ``relative``: the
        same for changed ÷ base of mean, p50 and p95; ``changes`` (as applied), ``plan`` and
        ``changed_plan``, ``drained`` (node names removed), ``draws``, ``replicates``,
        ``random_seed``. P(slowdown) of each forecast is relative to its own ideal step time,
        as in ``forecast``.

    Examples
    --------
    >>> import bayesprism as bp
    >>> posterior = bp.load("posterior.nc")  # doctest: +SKIP
    >>> faster = {"faster": {"gemm": 0.1}}
    >>> result = what_if(posterior, bp.ParallelPlan(dp=64), faster)  # doctest: +SKIP
    >>> result["deltas"]["p95_s"]["estimate"] < 0  # doctest: +SKIP
    True
    """
    check_kernel_posterior(posterior, "what-if")
    if not isinstance(changes, Changes):
        if not isinstance(changes, Mapping):
            raise InputError(
                Problem("changes", "", "must be a mapping or Changes", example=changes)
            )
        changes = Changes.from_dict(changes)
    else:
        changes = changes.validated()
    thresholds = slowdown_ratios(thresholds)
    thinned = thin_draws(posterior, draws)
    changed_tree = apply_changes(thinned, changes)

    changed_plan = plan
    updates = {}
    if changes.schedule is not None:
        updates["schedule"] = changes.schedule
    if changes.microbatches is not None:
        updates["microbatches"] = int(changes.microbatches)
    if updates:
        changed_plan = _replace_plan(plan, updates)
    changed_cluster, drained = cluster, []
    if changes.drain:
        ranking = rank_nodes(thinned)
        if not cluster_nodes(cluster):
            # Draining is about measured nodes: without a node list, both forecasts run on
            # every measured node in the posterior's order (new nodes beyond them).
            cluster = with_nodes(
                cluster, posterior_group(thinned)["node"].to_numpy().astype(str), plan
            )
        changed_cluster, changed_plan, drained = drained_cluster(
            cluster, changed_plan, changes.drain, ranking
        )

    def per_draw(tree, the_plan, the_cluster) -> PerDraw:
        step = compose_with_seed(
            tree, the_plan, replicates=replicates, random_seed=random_seed, cluster=the_cluster
        )
        return PerDraw.of(step, thresholds)

    base = per_draw(thinned, plan, cluster)
    changed = per_draw(changed_tree, changed_plan, changed_cluster)
    deltas: dict = {}
    relative: dict = {}
    for key in ("mean_s", "p50_s", "p95_s"):
        b, c = getattr(base, key), getattr(changed, key)
        deltas[key] = dict(zip(("estimate", "ci90"), estimate(c - b), strict=True))
        relative[key] = dict(zip(("estimate", "ci90"), estimate(c / b), strict=True))
    deltas["slowdown_p"] = {
        threshold_key(x): dict(
            zip(
                ("estimate", "ci90"),
                estimate(changed.slowdown_p[:, j] - base.slowdown_p[:, j]),
                strict=True,
            )
        )
        for j, x in enumerate(thresholds)
    }
    return {
        "base": summary(base, thresholds),
        "changed": summary(changed, thresholds),
        "deltas": deltas,
        "relative": relative,
        "changes": changes.to_dict(),
        "plan": _plan_summary(plan),
        "changed_plan": _plan_summary(changed_plan),
        "drained": drained,
        "thresholds": [float(x) for x in thresholds],
        "draws": int(base.p95_s.size),
        "replicates": int(replicates),
        "random_seed": int(random_seed),
    }


def _replace_plan(plan, updates: dict):
    """The plan with ``updates``; the plan's own validation reports impossible values."""
    try:
        return dataclasses.replace(plan, **updates)
    except TypeError as exc:  # not a dataclass or unknown field
        raise InputError(Problem("plan", ",".join(updates), str(exc))) from exc
