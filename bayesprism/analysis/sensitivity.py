"""Which variability drives the tail: counterfactual forecasts with one source of spread removed.

Each source of variability of a kernel-level posterior (docs/artifacts.md) is a loading: the
per-class scales of the node, GPU, step, GPU×step, residual (and cabinet) levels, and the noise
and congestion of each collective's cost model. Its *contribution* to the step time of a plan is
the change of the composed step time when that loading is set to zero ("removed") or halved
("halved"), everything else equal. Both forecasts use the same posterior draws and the same
random seed (common random numbers), so the difference is not drowned in Monte-Carlo noise.

High variance is not high impact: a class with a large CV that is overlapped with communication,
or that runs on a stage with slack, moves the composed step time little. The ranking therefore
comes from the composition, never from the kernel CVs.

Statistics per posterior draw and their summaries are those of
:mod:`bayesprism.analysis.counterfactual`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from bayesprism.analysis.counterfactual import (
    THRESHOLDS,
    PerDraw,
    check_kernel_posterior,
    compose_with_seed,
    reduction,
    scale_variable,
    slowdown_ratios,
    summary,
    zero_reduction,
)
from bayesprism.posterior import LEVEL_SCALES, posterior_group, thin_draws, with_posterior_group

#: Slow component of a ``mixture`` residual (docs/artifacts.md) in log-scale units: scaled
#: together with ``resid_scale`` (``resid_slow_extra`` is the sampled form of the slow sd).
RESID_SLOW_SCALED: tuple[str, ...] = ("resid_slow_shift", "resid_slow_sd", "resid_slow_extra")
#: Share of slow launches of a ``mixture`` residual: kept when the residual is scaled, zeroed
#: when it is removed.
RESID_SLOW_WEIGHT = "resid_slow_weight"
#: Posterior variables that make up the "collective" level (per-transfer noise, shared congestion).
COLLECTIVE_SPREAD: tuple[str, ...] = ("coll_noise", "coll_congestion")
#: The host-idle source (factor, level): each rank's GPU idle time before a synchronisation
#: (host work, launch gaps), learned from the inventory's ``traced_idle_us``
#: (``bayesprism.forecast.workload.fit_idle_law``); often the largest part of a host-bound step.
HOST_IDLE = ("host", "idle")
#: The degraded-link source (factor, level) and its variable: the chance per node that an
#: allocation's inter-node link is degraded (halved: half the rate; removed: never).
DEGRADED_LINK = ("fabric", "degraded_link")
DEGRADED_LINK_RATE = "coll_degraded_rate"
#: Multiplier that "removes" a loading: exactly 0 (the composition draws every source of
#: randomness from its own stream whatever the parameter values, so common random numbers hold).
REMOVED = 0.0


# --------------------------------------------------------------------------- sensitivity


@dataclass(frozen=True)
class Source:
    """One source of variability: ``factor`` (class, collective or "all") at ``level``.

    ``variables`` are log-scale spreads multiplied by the edit's multiplier; ``weights`` are
    mixture weights of the same source, left alone by a scaling and set to 0 by a removal (a
    removed source has no component left to mix).
    """

    factor: str
    level: str
    variables: tuple[str, ...]
    dim: str
    labels: tuple[str, ...] | None  # None: every label of ``dim``
    weights: tuple[str, ...] = ()

    def selection(self, var: xr.DataArray) -> dict:
        """The labels of ``var`` this source covers.

        All of them, its own, or, for a collective, its (collective, tier) pairs in a variable
        per pair (``coll_congestion``).
        """
        if self.labels is None:
            return {}
        if self.dim == "collective" and "coll_pair" in var.dims:
            pairs = [str(p) for p in var["coll_pair"].to_numpy()]
            return {"coll_pair": [p for p in pairs if p.split("/")[0] in self.labels]}
        return {self.dim: list(self.labels)}

    def edit(self, group: xr.Dataset, multiplier: float) -> xr.Dataset:
        """``group`` with this source's spread times ``multiplier`` (0: removed)."""
        for name in self.variables:
            group = scale_variable(group, name, multiplier, **self.selection(group[name]))
        if multiplier == REMOVED:
            for name in self.weights:
                group = scale_variable(group, name, REMOVED, **self.selection(group[name]))
        return group

    def has_spread(self, group: xr.Dataset) -> bool:
        """Whether any of the source's variables is non-zero in ``group``.

        Otherwise removing the source changes nothing, and it is not composed.
        """
        for name in self.variables:
            var = group[name]
            var = var.sel(self.selection(var))
            if bool((np.abs(var) > 0).any()):
                return True
        return False


def level_variables(group: xr.Dataset, level: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Posterior variables scaled, and mixture weights zeroed on removal, for one level.

    Every level but the residual is its loading alone. A ``mixture`` residual
    ``eps ~ (1 − w)·N(0, σ) + w·N(δ, s)`` is edited as ``m·eps``: σ, δ and s (and the sampled
    ``resid_slow_extra``) scale with the multiplier m, w is kept, so halving halves every launch's
    log deviation (its sd and every quantile, the slow launches' excess included) and removing
    (m = 0, w → 0 too) leaves no residual at all. A Student-t residual's ν is kept likewise.
    """
    names = (LEVEL_SCALES[level],)
    if level != "residual":
        return names, ()
    names += tuple(n for n in RESID_SLOW_SCALED if n in group)
    return names, tuple(n for n in (RESID_SLOW_WEIGHT,) if n in group)


def sources_of(group: xr.Dataset) -> list[Source]:
    """Every source of variability present in a kernel-level posterior group."""
    out: list[Source] = []
    for level, name in LEVEL_SCALES.items():
        if name not in group:
            continue
        names, weights = level_variables(group, level)
        classes = [str(c) for c in group[name]["kernel_class"].to_numpy()]
        out.append(Source("all", level, names, "kernel_class", None, weights))
        out.extend(Source(c, level, names, "kernel_class", (c,), weights) for c in classes)
    spread = tuple(name for name in COLLECTIVE_SPREAD if name in group)
    if spread:
        collectives = [str(c) for c in group.coords["collective"].to_numpy()]
        out.append(Source("all", "collective", spread, "collective", None))
        out.extend(Source(c, "collective", spread, "collective", (c,)) for c in collectives)
    if DEGRADED_LINK_RATE in group:  # fitted; a prior-only rate has no variable to edit
        out.append(Source(*DEGRADED_LINK, (DEGRADED_LINK_RATE,), "", None))
    return out


def idle_has_spread(posterior: xr.DataTree) -> bool:
    """Whether the traced host idle varies between ranks or steps (any synchronisation)."""
    if "inventory" not in posterior.children or "traced_idle_us" not in posterior["inventory"]:
        return False
    idle = posterior["inventory"]["traced_idle_us"]
    other = [d for d in idle.dims if d != "sync"]
    spread = idle.max(dim=other, skipna=True) - idle.min(dim=other, skipna=True)
    return bool((spread > 0).any())


def with_idle_scaled(posterior: xr.DataTree, multiplier: float) -> xr.DataTree:
    """A copy of ``posterior`` with the traced host idle's spread times ``multiplier``.

    Each rank's idle deviates from its synchronisation's mean ``multiplier`` times as much
    (0: every rank idles the mean; 0.5: half the spread).

    The idle law is fitted from these values (gamma with their mean and variance), so its mean
    is kept and its sd scales by ``multiplier``: removing the source keeps the host work and
    takes away only the waiting for the slowest host. For ``0 <= multiplier <= 1`` the values
    stay >= 0.

    Examples
    --------
    >>> import xarray as xr
    >>> inv = xr.Dataset({"traced_idle_us": (("rank", "sync"), [[0.0], [4.0]])})
    >>> tree = xr.DataTree.from_dict({"inventory": inv})
    >>> with_idle_scaled(tree, 0.5)["inventory"]["traced_idle_us"].values.ravel().tolist()
    [1.0, 3.0]
    """
    inventory = posterior["inventory"].to_dataset()
    idle = inventory["traced_idle_us"]
    mean = idle.mean(dim=[d for d in idle.dims if d != "sync"], skipna=True)
    scaled = (mean + multiplier * (idle - mean)).transpose(*idle.dims)
    tree = posterior.copy()
    tree["inventory"] = inventory.assign(traced_idle_us=idle.copy(data=scaled.to_numpy()))
    return tree


def _progress(items: Iterable, enabled: bool, desc: str) -> Iterable:
    if not enabled:
        return items
    from tqdm.auto import tqdm  # deferred: only with a progress bar (import time)

    return tqdm(list(items), desc=desc, leave=False)


def sensitivity(
    posterior: xr.DataTree,
    plan,
    *,
    draws: int | None = 200,
    replicates: int = 64,
    random_seed: int = 0,
    cluster=None,
    thresholds: Sequence[float] = THRESHOLDS,
    progress: bool = False,
) -> dict:
    """Contribution of each source of variability to the p95 step time and P(slowdown) of a plan.

    For every kernel class × level (``node``, ``gpu``, ``step``, ``gpustep``, ``residual``,
    ``cabinet`` when fitted), for every collective at level ``collective`` (its transfer noise
    and shared congestion together), for the ranks' host idle (factor ``host``, level ``idle``:
    the spread of the traced idle before each synchronisation, :func:`with_idle_scaled`), for
    degraded inter-node links when fitted (factor ``fabric``, level ``degraded_link``: their
    rate per node) and
    for ``factor="all"`` classes/collectives of each level,
    the plan is recomposed with that loading set to zero (:data:`REMOVED`) and to half its
    value, with the same
    posterior draws and seed as the base forecast (common random numbers).

    A ``mixture`` residual (slow launches, docs/artifacts.md) is edited as a whole, as the
    residual ``eps`` times the multiplier (:func:`level_variables`): "removed" leaves no
    residual variability (σ, the slow shift δ and sd s set to 0, and the slow weight w too), and
    "halved" halves σ, δ and s with w kept, i.e. halves each launch's log deviation, so the sd
    of the residual in log space, ``√((1−w)σ² + w·s² + w(1−w)δ²)``, is exactly halved.

    Parameters
    ----------
    posterior
        Kernel-level fit (docs/artifacts.md).
    plan
        ``bayesprism.plan.ParallelPlan``.
    draws
        Number of posterior draws used (evenly spaced; ``None`` for all).
    replicates
        Simulated steps per posterior draw.
    random_seed
        Seed of every composition (base and counterfactuals alike).
    cluster
        Optional ``bayesprism.plan.Cluster`` passed to the composition.
    thresholds
        Slowdown ratios x of P(step time > x × ideal step time) (1.05: 5 % over; the
        fraction spelling 0.05 of earlier releases still works, with a ``FutureWarning``).
    progress
        Show a progress bar over the counterfactual compositions.

    Returns
    -------
    dict
        ``base``: mean/p50/p95 step time and P(slowdown) of the plan with 90% intervals
        (``mean_s``, ``mean_ci90``, ``p50_s``, ``p95_s``, ``p95_ci90``, ``slowdown_p``,
        ``slowdown_p_ci90``, ``ideal_step_time_s``).
        ``contributions``: one entry per source, sorted by ``|p95_delta_s|`` descending, with
        ``factor``, ``level``, ``p95_delta_s`` (p95 with the source − p95 without it: the
        seconds of tail it causes, > 0 when it lengthens the tail), ``p95_delta_ci90``,
        ``mean_delta_s``, ``mean_delta_ci90``, ``slowdown_p_delta`` and
        ``slowdown_p_delta_ci90`` (dicts keyed by threshold, e.g. ``"1.05"``: base probability
        − probability without the source), ``p95_share_of_excess`` (``p95_delta_s`` divided by
        the base p95 minus the ideal step time), ``composed`` (false when the source has no
        spread in any draw, so every delta is exactly 0 without composing), and ``halved``: the
        same ``*_delta*`` keys for the loading halved instead of removed.
        Also ``thresholds``, ``draws``, ``replicates``, ``random_seed``.

    Examples
    --------
    >>> import bayesprism as bp
    >>> posterior = bp.load("posterior.nc")  # doctest: +SKIP
    >>> result = sensitivity(posterior, bp.ParallelPlan(dp=512))  # doctest: +SKIP
    >>> [(c["factor"], c["level"]) for c in result["contributions"][:2]]  # doctest: +SKIP
    [('gemm', 'gpustep'), ('all', 'node')]
    """
    check_kernel_posterior(posterior, "sensitivity")
    thresholds = slowdown_ratios(thresholds)
    thinned = thin_draws(posterior, draws)
    group = posterior_group(thinned)

    def per_draw(tree: xr.DataTree) -> PerDraw:
        step = compose_with_seed(
            tree, plan, replicates=replicates, random_seed=random_seed, cluster=cluster
        )
        return PerDraw.of(step, thresholds)

    base = per_draw(thinned)
    excess = float(np.mean(base.p95_s)) - base.ideal_step_time_s
    n_draws = base.p95_s.size
    # (factor, level, has spread, the tree with the source times a multiplier)
    edits: list[tuple[str, str, bool, Callable[[float], xr.DataTree]]] = [
        (source.factor, source.level, source.has_spread(group),
         lambda m, s=source: with_posterior_group(thinned, s.edit(group, m)))
        for source in sources_of(group)
    ]
    if "inventory" in thinned.children and "traced_idle_us" in thinned["inventory"]:
        edits.append((*HOST_IDLE, idle_has_spread(thinned),
                      lambda m: with_idle_scaled(thinned, m)))
    contributions = []
    for factor, level, spread, edited in _progress(edits, progress, "sensitivity"):
        entry: dict = {"factor": factor, "level": level}
        if spread:
            removed = per_draw(edited(REMOVED))
            halved = per_draw(edited(0.5))
            entry.update(reduction(base, removed, thresholds), composed=True)
            entry["halved"] = reduction(base, halved, thresholds)
        else:
            entry.update(zero_reduction(n_draws, thresholds), composed=False)
            entry["halved"] = zero_reduction(n_draws, thresholds)
        entry["p95_share_of_excess"] = entry["p95_delta_s"] / excess if excess > 0 else None
        contributions.append(entry)
    contributions.sort(key=lambda e: -abs(e["p95_delta_s"]))
    return {
        "base": summary(base, thresholds),
        "contributions": contributions,
        "thresholds": [float(x) for x in thresholds],
        "draws": int(n_draws),
        "replicates": int(replicates),
        "random_seed": int(random_seed),
    }

