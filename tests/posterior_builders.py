"""Hand-built posteriors and forecasts that follow docs/artifacts.md, shared by the tests.

* :func:`kernel_posterior`: a kernel-level fit whose variables are constant over draws (unless a
  test asks for spread node effects), so what is composed from it is known by construction:
  scale 0 gives deterministic kernels, chosen scales give known distributions.
  :func:`gemm_only` (composition/forecast tests) and :func:`analysis_posterior`
  (sensitivity/placement/what-if tests) are its two presets.
* :func:`truth_posterior`: a fit of a known truth with the observed cells simulated from it (a
  perfectly mixed sampler), for diagnostics, plots and reports: predictive checks must pass, and
  fail when a class's data are shifted.
* :func:`forecast_tree`: a forecast of four data-parallel plans, as
  ``bayesprism.forecast.forecasting`` writes.
* :func:`tiny_kernel_table`, :func:`tiny_spec`, :func:`fitted`: a tiny synthetic trace table and
  one real fit of it per session, for the fit/io/CLI tests.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism import __version__
from bayesprism.schema import SCHEMA_VERSION, empty_attrs, validate_table

#: every kernel class a hand-built posterior carries loadings for, unless a test chooses
ALL_CLASSES = ("gemm", "attention", "elementwise", "norm", "optimizer", "allreduce", "allgather",
               "reducescatter", "sendrecv", "alltoall")
#: every collective a hand-built posterior carries cost parameters for, unless a test chooses
ALL_COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")
#: the collectives whose transfers follow the cost model (``collective_model`` attr) by default
COST_MODEL = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")
LEVELS = ("node", "gpu", "step", "gpustep", "resid")
TIERS = ("intra", "inter")


def spec_attrs(**fields) -> dict[str, str]:
    """``spec`` and ``spec_hash`` root attrs of the default spec with ``fields`` changed
    (``bayesprism.io.load`` checks that the spec hashes to the recorded hash, and that the
    posterior group's populations are the spec's)."""
    import dataclasses

    from bayesprism.spec import ModelSpec

    spec = dataclasses.replace(ModelSpec.default(), **fields)
    return {"spec": json.dumps(spec.to_dict()), "spec_hash": spec.spec_hash()}


def _root_attrs(*, draws: int, chains: int, seed: int, **overrides) -> dict:
    """The root attrs every fit carries (docs/artifacts.md); ``overrides`` change or add some."""
    return {"model_kind": "kernel", "bayesprism_version": __version__,
            "schema_version": SCHEMA_VERSION, **spec_attrs(), "input_digest": "hand-built",
            "sampler": "pymc", "seconds": 0.0, "draws": draws, "tune": 0, "chains": chains,
            "random_seed": seed, **overrides}


def full_plan(gpus_per_node: int, **plan) -> dict:
    """A traced plan with every degree (1 unless given) and ``world_size`` = dp·tp·pp·cp."""
    plan = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "microbatches": 1,
            "gpus_per_node": gpus_per_node, **plan}
    plan.setdefault("world_size", plan["dp"] * plan["tp"] * plan["pp"] * plan["cp"])
    return plan


def inventory_dataset(
    kernels: Mapping[str, Mapping],
    traced_plan: dict,
    *,
    run: str,
    platform: str,
    rank_node: Sequence[str] | None = None,
    rank_gpu: Sequence[int] | None = None,
    ranks: int | None = None,
    step_time_us: np.ndarray | None = None,
    step_units: Sequence[str] | None = None,
) -> xr.Dataset:
    """The ``inventory`` group of a kernel fit.

    ``kernels`` maps a name to ``{"class", "launches", "role", "bytes", "group"}`` (role
    ``compute`` and NaN bytes/group size unless given). With ``ranks`` every traced rank launches
    ``launches`` of each kernel per step; ``rank_node``/``rank_gpu`` place the ranks and
    ``step_time_us`` (step unit × rank) gives each rank's traced step span.
    """
    names = list(kernels)
    launches = np.array([float(kernels[k]["launches"]) for k in names])
    data = {
        "kernel_class": ("kernel", [kernels[k]["class"] for k in names]),
        "role": ("kernel", [kernels[k].get("role", "compute") for k in names]),
        "launches_per_step": ("kernel", launches),
        "bytes_per_launch": ("kernel", [float(kernels[k].get("bytes", np.nan)) for k in names]),
        "group_size": ("kernel", [float(kernels[k].get("group", np.nan)) for k in names]),
    }
    coords: dict = {"kernel": names}
    if ranks is not None:
        data["launches"] = (("kernel", "rank"), np.repeat(launches[:, None], ranks, axis=1))
        coords["rank"] = np.arange(ranks)
    if rank_node is not None:
        data["rank_node"] = ("rank", list(rank_node))
        data["rank_gpu"] = ("rank", np.asarray(rank_gpu))
    if step_time_us is not None:
        data["traced_step_time_us"] = (("step_unit", "rank"), np.asarray(step_time_us, float))
        coords["step_unit"] = list(step_units)
    return xr.Dataset(data, coords=coords, attrs={"traced_plan": json.dumps(traced_plan),
                                                  "run": run, "platform": platform})


def _per_collective(value: float | Mapping[str, float], collectives: Sequence[str]) -> list:
    """One value per collective: a number shared by all, or a mapping (unlisted: 0)."""
    if isinstance(value, Mapping):
        return [value.get(c, 0.0) for c in collectives]
    return [value] * len(collectives)


def _per_pair(value: float | Mapping[str, float], collectives: Sequence[str]) -> list:
    """One value per (collective, tier) pair, as a fit has ``coll_congestion``: a number shared
    by all, or a mapping by ``"collective/tier"`` or by collective for both tiers (unlisted: 0)."""
    if not isinstance(value, Mapping):
        return [value] * (2 * len(collectives))
    return [value.get(f"{c}/{t}", value.get(c, 0.0)) for c in collectives for t in TIERS]


def kernel_posterior(
    kernels: Mapping[str, Mapping],
    *,
    classes: Sequence[str] = ALL_CLASSES,
    collectives: Sequence[str] = ALL_COLLECTIVES,
    collective_model: Sequence[str] = COST_MODEL,
    chains: int = 1,
    draws: int = 10,
    seed: int = 0,
    scales: Mapping[str, Mapping[str, float]] | None = None,
    node_population: str = "normal",
    gpu_population: str = "normal",
    population_params: Mapping[str, float] | None = None,
    measured_nodes: Mapping[str, float] | None = None,
    node_effect_sd: float = 0.0,
    step_units: Sequence[str] | None = None,
    latency_us: Mapping[str, float | Sequence[float]] | None = None,
    bandwidth_gbps: Mapping[str, float | Sequence[float]] | None = None,
    coll_noise: float | Mapping[str, float] = 0.0,
    coll_congestion: float | Mapping[str, float] = 0.0,
    degraded_link: tuple[float, float] | None = (0.0, 0.0),
    traced_plan: Mapping[str, int] | None = None,
    gpus_per_node: int = 8,
    traced_ranks: int | None = None,
    place_ranks: bool = False,
    spans_us: Sequence[float] | None = None,
    run: str = "synthetic",
    model_attrs_on_posterior: bool = True,
) -> xr.DataTree:
    """A kernel-level fit whose variables are the same in every draw (but the node effects'
    spread, ``node_effect_sd``).

    Parameters
    ----------
    kernels
        Kernel name → ``{"class", "launches", "log_median", "role", "bytes", "group"}``; role,
        bytes and group (size) only matter for collectives.
    classes, collectives
        The ``kernel_class`` and ``collective`` coordinates.
    collective_model
        The collectives with the cost model (the ``collective_model`` attr).
    scales
        ``{level: {class: loading}}`` for the levels ``node``, ``gpu``, ``step``, ``gpustep``,
        ``resid``; unlisted loadings are 0 and every level variable is present.
    population_params
        Scalar population parameters (``node_nu``, ``node_slow_weight``, ...).
    measured_nodes
        Standardised effect of each measured node (``node_effect``); none when not given.
    node_effect_sd
        Posterior sd of each node effect around its value (normal draws from ``seed``).
    step_units
        Adds ``step_effect`` (0) over these step units.
    latency_us, bandwidth_gbps
        Collective cost parameters per tier (``{"intra": .., "inter": ..}``), each a number shared
        by every collective or one value per collective.
    coll_noise, coll_congestion
        A number shared by every collective, or per collective (unlisted: 0).
    degraded_link
        ``(coll_degraded_rate, coll_degraded_log_slowdown)``; None: absent (their priors).
    traced_plan
        Degrees of the traced plan (unlisted: 1; see :func:`full_plan`).
    traced_ranks
        Adds ``launches`` per traced rank (each launching ``launches`` of every kernel).
    place_ranks
        Adds ``rank_node`` (``n0``, ``n1``, ...) and ``rank_gpu``: ``gpus_per_node`` ranks a node.
    spans_us
        One traced step's span on each traced rank (sets ``traced_ranks``), as
        ``traced_step_time_us`` of the step unit ``{run}/0``.
    model_attrs_on_posterior
        Put ``node_population``, ``gpu_population`` and ``collective_model`` on the posterior
        group only, as a real fit does; False: on the root only.
    """
    plan = full_plan(gpus_per_node, **(traced_plan or {}))
    names = list(kernels)
    shape = (chains, draws)

    def const(value, *dims):
        value = np.asarray(value, dtype=float)
        return ("chain", "draw", *dims), np.broadcast_to(value, (*shape, *value.shape)).copy()

    latency_us = latency_us or {"intra": 5.0, "inter": 10.0}
    bandwidth_gbps = bandwidth_gbps or {"intra": 100.0, "inter": 25.0}

    def per_tier(cost):
        return np.stack([np.broadcast_to(np.asarray(cost[t], float), len(collectives))
                         for t in TIERS], axis=-1)

    post = {
        "kernel_log_median": const([kernels[k]["log_median"] for k in names], "kernel"),
        "coll_latency_us": const(per_tier(latency_us), "collective", "tier"),
        "coll_bandwidth_gbps": const(per_tier(bandwidth_gbps), "collective", "tier"),
        "coll_noise": const(_per_collective(coll_noise, collectives), "collective"),
        "coll_congestion": const(_per_pair(coll_congestion, collectives), "coll_pair"),
    }
    if degraded_link is not None:
        post["coll_degraded_rate"] = const(degraded_link[0])
        post["coll_degraded_log_slowdown"] = const(degraded_link[1])
    for level in LEVELS:
        chosen = (scales or {}).get(level, {})
        post[f"{level}_scale"] = const([chosen.get(c, 0.0) for c in classes], "kernel_class")
    coords: dict = {"chain": np.arange(chains), "draw": np.arange(draws), "kernel": names,
                    "kernel_class": list(classes), "collective": list(collectives),
                    "tier": list(TIERS),
                    "coll_pair": [f"{c}/{t}" for c in collectives for t in TIERS]}
    for name, value in (population_params or {}).items():
        post[name] = const(value)
    if measured_nodes:
        effects = np.array(list(measured_nodes.values()), dtype=float)
        noise = np.random.default_rng(seed).standard_normal((*shape, effects.size))
        post["node_effect"] = (("chain", "draw", "node"), effects + node_effect_sd * noise)
        coords["node"] = list(measured_nodes)
    if step_units is not None:
        post["step_effect"] = const(np.zeros(len(step_units)), "step_unit")
        coords["step_unit"] = list(step_units)
    model_attrs = {"node_population": node_population, "gpu_population": gpu_population,
                   "collective_model": json.dumps(list(collective_model))}
    posterior = xr.Dataset(post, coords=coords,
                           attrs=model_attrs if model_attrs_on_posterior else {})

    ranks = np.arange(len(spans_us) if spans_us is not None else traced_ranks or 0)
    inventory = inventory_dataset(
        kernels, plan, run=run, platform="test",
        ranks=ranks.size if (spans_us is not None or traced_ranks) else None,
        rank_node=[f"n{r // gpus_per_node}" for r in ranks] if place_ranks else None,
        rank_gpu=ranks % gpus_per_node,
        step_time_us=None if spans_us is None else np.asarray(spans_us, float)[None, :],
        step_units=[f"{run}/0"],
    )
    # A real fit keeps the model attrs on the posterior group only (bayesprism.inference).
    root = _root_attrs(draws=draws, chains=chains, seed=seed,
                       **spec_attrs(node_population=node_population,
                                    gpu_population=gpu_population),
                       **({} if model_attrs_on_posterior else model_attrs))
    return xr.DataTree.from_dict({"/": xr.Dataset(attrs=root), "posterior": posterior,
                                  "inventory": inventory})


def gemm_only(log_median: float = np.log(100.0), launches: float = 10.0, **options) -> xr.DataTree:
    """One GEMM kernel, nothing else: a rank's step is ``launches * exp(log_median)`` µs.

    ``options`` go to :func:`kernel_posterior` (one chain, 8 GPUs a node, no measured nodes).
    """
    kernels = {"gemm0": {"class": "gemm", "launches": launches, "log_median": log_median}}
    return kernel_posterior(kernels, **options)


#: loadings of every level on the GEMM class that make :func:`gemm_only` a spread-out fit
GEMM_SPREAD = {"node": {"gemm": 0.08}, "gpu": {"gemm": 0.04}, "gpustep": {"gemm": 0.02},
               "resid": {"gemm": 0.3}, "step": {"gemm": 0.02}}


def quiet_compose(*args, **kwargs):
    """``bayesprism.forecast.composition.compose`` without the PlanWarnings of the tests'
    sketchy plans."""
    from bayesprism.forecast.composition import compose
    from bayesprism.plan import PlanWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        return compose(*args, **kwargs)


#: the kernels of :func:`analysis_posterior`: 20.2 ms of compute per step, a 50 MB gradient
#: AllReduce over the 4 data-parallel ranks and a 1 MB pipeline send/receive
ANALYSIS_KERNELS = {
    "gemm_main": {"class": "gemm", "log_median": np.log(2000.0), "launches": 10.0},
    "norm_small": {"class": "norm", "log_median": np.log(20.0), "launches": 10.0},
    "attn_main": {"class": "attention", "log_median": np.log(1000.0), "launches": 10.0},
    "grad_allreduce": {"class": "allreduce", "role": "dp", "log_median": np.log(5000.0),
                       "launches": 2.0, "bytes": 5.0e7, "group": 4.0},
    "pp_sendrecv": {"class": "sendrecv", "role": "pp", "log_median": np.log(50.0),
                    "launches": 2.0, "bytes": 1.0e6, "group": 2.0},
}
ANALYSIS_COLLECTIVES = ("allreduce", "sendrecv")


def analysis_posterior(
    *,
    chains: int = 1,
    draws: int = 40,
    scales: Mapping[str, Mapping[str, float]] | None = None,
    coll_noise: Mapping[str, float] | None = None,
    coll_congestion: Mapping[str, float] | None = None,
    node_effect: Mapping[str, float] | None = None,
    node_effect_sd: float = 0.0,
    seed: int = 0,
) -> xr.DataTree:
    """The analysis tests' fit: :data:`ANALYSIS_KERNELS` traced with plain data parallelism on
    4 ranks of 2 GPUs a node, one micro-batch a step.

    ``node_effect`` defaults to 4 measured nodes ``n0``..``n3`` at 0; the other arguments are
    those of :func:`kernel_posterior`. Population and cost-model attrs sit on the posterior
    group, as in a real fit (docs/artifacts.md).
    """
    nodes = node_effect if node_effect is not None else {f"n{i}": 0.0 for i in range(4)}
    return kernel_posterior(
        ANALYSIS_KERNELS, classes=("gemm", "norm", "attention", "allreduce", "sendrecv"),
        collectives=ANALYSIS_COLLECTIVES, collective_model=ANALYSIS_COLLECTIVES,
        chains=chains, draws=draws, seed=seed, scales=scales, measured_nodes=nodes,
        node_effect_sd=node_effect_sd, step_units=("run/1", "run/2"),
        latency_us={"intra": 5.0, "inter": (20.0, 10.0)},
        bandwidth_gbps={"intra": 100.0, "inter": 20.0},
        coll_noise=coll_noise or {}, coll_congestion=coll_congestion or {},
        traced_plan={"dp": 4}, gpus_per_node=2, traced_ranks=4, place_ranks=True, run="run",
        model_attrs_on_posterior=True,
    )


def analysis_plan(**plan):
    """A ``ParallelPlan`` on :func:`analysis_posterior`'s 2-GPU nodes, built without the
    PlanWarnings its defaults raise (the tests check results, not those warnings)."""
    from bayesprism.plan import ParallelPlan, PlanWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        return ParallelPlan(gpus_per_node=2, **plan)


# -- a fit of a known truth, with its observed cells ---------------------------------------------

#: kernel -> (class, log median µs, launches per step)
TRUTH_KERNELS = {
    "gemm_a": ("gemm", 6.0, 24.0),
    "gemm_b": ("gemm", 5.0, 24.0),
    "flash_fwd": ("attention", 6.5, 12.0),
    "nccl_allreduce": ("allreduce", 7.0, 2.0),
    "layernorm": ("norm", 3.0, 48.0),
}
TRUTH_CLASSES = ["gemm", "attention", "allreduce", "norm"]
TRUTH_NODES = ["node0", "node1", "node2", "node3", "node4", "node5"]
TRUTH_GPUS_PER_NODE = 2
TRUTH_STEPS = [f"run1/{s}" for s in range(1, 7)]
SLOW_NODE = "node5"
LAUNCHES_PER_CELL = 4


def truth(seed: int = 0) -> dict:
    """True parameter values of :func:`truth_posterior` (node5 degraded: effect +2.5)."""
    rng = np.random.default_rng(seed)
    gpus = [f"{n}/{g}" for n in TRUTH_NODES for g in range(TRUTH_GPUS_PER_NODE)]
    node_effect = rng.normal(0, 0.5, len(TRUTH_NODES))
    node_effect[TRUTH_NODES.index(SLOW_NODE)] = 2.5
    return {
        "kernel_log_median": np.array([TRUTH_KERNELS[k][1] for k in TRUTH_KERNELS]),
        "node_scale": np.array([0.10, 0.05, 0.20, 0.02]),
        "gpu_scale": np.array([0.05, 0.05, 0.05, 0.05]),
        "step_scale": np.array([0.03, 0.03, 0.30, 0.02]),
        "resid_scale": np.array([0.10, 0.15, 0.40, 0.20]),
        "node_effect": node_effect,
        "gpu_effect": rng.normal(0, 1, len(gpus)),
        "step_effect": rng.normal(0, 1, len(TRUTH_STEPS)),
        "gpus": gpus,
    }


def truth_posterior(
    seed: int = 0,
    chains: int = 4,
    draws: int = 500,
    shift_class: str | None = None,
    shift: float = 1.0,
    link_units: bool = True,
    slow_residual: tuple[float, float, float] | None = None,
) -> xr.DataTree:
    """A kernel-model fit of :func:`truth` with its cells (kernel × GPU × step).

    ``shift_class`` moves that class's observed cell means by ``shift`` (a misfit);
    ``link_units=False`` leaves out the GPU-step → unit maps (``*_of_gpustep``).
    ``slow_residual = (w, δ, s)`` makes the residual of every class the two-component
    ``mixture`` (docs/artifacts.md): eps ~ (1 − w)·N(0, resid_scale) + w·N(δ, s), in the
    posterior (``resid_slow_*``) and in the cells, simulated launch by launch.
    """
    rng = np.random.default_rng(seed)
    t = truth(seed)
    kernels = list(TRUTH_KERNELS)
    gpus = t["gpus"]
    cls_index = np.array([TRUTH_CLASSES.index(TRUTH_KERNELS[k][0]) for k in kernels])

    def draws_of(value, sd, positive=False):
        value = np.asarray(value, dtype=float)
        x = value + sd * rng.standard_normal((chains, draws, *value.shape))
        return np.abs(x) if positive else x

    dims = {"kernel_log_median": ["kernel"], "node_effect": ["node"],
            "gpu_effect": ["gpu_unit"], "step_effect": ["step_unit"]}
    # effects are less certain than kernel medians: only clearly degraded units exclude zero
    post = {name: (["chain", "draw", *dims[name]],
                   draws_of(t[name], 0.03 if name == "kernel_log_median" else 0.15))
            for name in dims}
    for level in ("node", "gpu", "step", "resid"):
        post[f"{level}_scale"] = (["chain", "draw", "kernel_class"],
                                  draws_of(t[f"{level}_scale"], 0.005, positive=True))
    post["node_nu"] = (["chain", "draw"], draws_of(4.0, 0.3, positive=True))
    slow_names = ("resid_slow_weight", "resid_slow_shift", "resid_slow_sd")
    for name, value in zip(slow_names, slow_residual or (), strict=False):
        post[name] = (["chain", "draw", "kernel_class"],
                      draws_of(np.full(len(TRUTH_CLASSES), value), 0.005, positive=True))
    coords = {"chain": np.arange(chains), "draw": np.arange(draws), "kernel": kernels,
              "kernel_class": TRUTH_CLASSES, "node": TRUTH_NODES, "gpu_unit": gpus,
              "step_unit": TRUTH_STEPS}
    posterior = xr.Dataset(
        post, coords=coords, attrs={"node_population": "student_t", "gpu_population": "normal"}
    )

    # cells: kernel x gpu x step, simulated from the truth
    k_i, g_i, s_i = (a.reshape(-1) for a in np.meshgrid(
        np.arange(len(kernels)), np.arange(len(gpus)), np.arange(len(TRUTH_STEPS)),
        indexing="ij"))
    node_i = np.array([TRUTH_NODES.index(gpus[g].split("/")[0]) for g in g_i])
    c_i = cls_index[k_i]
    mu = (t["kernel_log_median"][k_i] + t["node_scale"][c_i] * t["node_effect"][node_i]
          + t["gpu_scale"][c_i] * t["gpu_effect"][g_i]
          + t["step_scale"][c_i] * t["step_effect"][s_i])
    n = np.full(k_i.size, LAUNCHES_PER_CELL)
    sd = t["resid_scale"][c_i]
    if slow_residual is None:
        mean = mu + sd / np.sqrt(n) * rng.standard_normal(k_i.size)
        ss = sd**2 * rng.chisquare(n - 1)
    else:  # every launch from the mixture, then the cell statistics
        weight, slow_shift, slow_sd = slow_residual
        shape = (k_i.size, LAUNCHES_PER_CELL)
        slow = rng.random(shape) < weight
        eps = np.where(slow, slow_shift + slow_sd * rng.standard_normal(shape),
                       sd[:, None] * rng.standard_normal(shape))
        mean = mu + eps.mean(axis=1)
        ss = ((eps - eps.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    if shift_class is not None:
        mean = mean + shift * (np.array(TRUTH_CLASSES)[c_i] == shift_class)
    # stored as the kernel model stores them: cells point at GPU-steps, GPU-steps at units
    gs_gpu, gs_step = np.divmod(np.arange(len(gpus) * len(TRUTH_STEPS)), len(TRUTH_STEPS))
    constant = xr.Dataset(
        {"cell_kernel": ("cell", k_i), "cell_gpustep": ("cell", g_i * len(TRUTH_STEPS) + s_i),
         "cell_n": ("cell", n), "cell_mean_log": ("cell", mean), "cell_ss_log": ("cell", ss)},
        coords={"cell": np.arange(k_i.size)},
    )
    if link_units:
        gs_node = np.array([TRUTH_NODES.index(gpus[g].split("/")[0]) for g in gs_gpu])
        constant["node_of_gpustep"] = ("gpustep", gs_node)
        constant["gpu_of_gpustep"] = ("gpustep", gs_gpu)
        constant["step_of_gpustep"] = ("gpustep", gs_step)

    sample_stats = xr.Dataset(
        {"diverging": (["chain", "draw"], np.zeros((chains, draws), dtype=bool)),
         "energy": (["chain", "draw"], rng.standard_normal((chains, draws)))},
        coords={"chain": np.arange(chains), "draw": np.arange(draws)},
    )

    inventory_kernels = {k: {"class": cls, "launches": launches}
                         for k, (cls, _, launches) in TRUTH_KERNELS.items()}
    inventory_kernels["nccl_allreduce"].update(role="dp", bytes=2.0e8, group=12.0)
    launches_per_step = np.array([TRUTH_KERNELS[k][2] for k in kernels])
    # each rank's step = its launches at their cell's mean duration (mean of exp(eps))
    from bayesprism.forecast.workload import residual_moments

    slow = None if slow_residual is None else tuple(np.full(sd.shape, v) for v in slow_residual)
    cell_us = (np.exp(mu) * residual_moments(sd, slow)[0]).reshape(
        len(kernels), len(gpus), len(TRUTH_STEPS))
    inventory = inventory_dataset(
        inventory_kernels, full_plan(TRUTH_GPUS_PER_NODE, dp=12), run="run1",
        platform="test-cluster", ranks=len(gpus), rank_node=[g.split("/")[0] for g in gpus],
        rank_gpu=[int(g.split("/")[1]) for g in gpus],
        step_time_us=np.einsum("k,kgs->sg", launches_per_step, cell_us), step_units=TRUTH_STEPS,
    )
    attrs = _root_attrs(draws=draws, chains=chains, seed=seed, input_digest="f" * 16,
                        seconds=1.0, tune=draws, **spec_attrs(gpu_population="normal"))
    return xr.DataTree.from_dict({"/": xr.Dataset(attrs=attrs), "posterior": posterior,
                                  "sample_stats": sample_stats, "constant_data": constant,
                                  "inventory": inventory})


# -- a forecast -----------------------------------------------------------------------------------

PLAN_GPUS = [12, 96, 768, 6144]
STEPS_PER_RUN = 1000
DEADLINES_S = [330.0, 400.0]


def forecast_tree(seed: int = 0, draws: int = 100, replicates: int = 8) -> xr.DataTree:
    """A forecast DataTree (as ``bayesprism.forecast.forecasting.forecast`` writes it) of four
    data-parallel plans (:data:`PLAN_GPUS`) whose step time and tail grow with scale."""
    rng = np.random.default_rng(seed)
    n_plan = len(PLAN_GPUS)
    growth = np.log2(np.array(PLAN_GPUS) / PLAN_GPUS[0])[:, None, None]
    shape = (n_plan, draws, replicates)
    compute = 0.30 * np.exp(0.05 * rng.standard_normal(shape))
    exposed = 0.02 * (1 + 0.2 * growth) * np.exp(0.2 * rng.standard_normal(shape))
    bubble = np.zeros(shape)
    wait = 0.01 * growth * np.abs(rng.standard_normal(shape)) + 0.002
    step = compute + exposed + bubble + wait
    ideal = np.full(n_plan, 0.31)
    thresholds = np.array([1.05, 1.10, 1.20])
    slow = (step[..., None] > ideal[:, None, None, None] * thresholds).mean(axis=(1, 2))
    # training time: the per-draw mean step time times the steps, with a little noise
    training = (STEPS_PER_RUN * step.mean(axis=2, keepdims=True)
                * np.exp(0.01 * rng.standard_normal(shape)))
    finish = np.stack([(training <= t).mean(axis=(1, 2)) for t in DEADLINES_S], axis=-1)
    dims3 = ("plan", "draw", "replicate")
    ones = ("plan", [1] * n_plan)
    ds = xr.Dataset(
        {
            "step_time_s": (dims3, step),
            "compute_s": (dims3, compute),
            "exposed_comm_s": (dims3, exposed),
            "bubble_s": (dims3, bubble),
            "wait_s": (dims3, wait),
            "ideal_step_time_s": ("plan", ideal),
            "baseline_step_time_s": ("plan", ideal),
            "slowdown_probability": (("plan", "threshold"), slow),
            "training_time_s": (dims3, training),
            "steps": ("plan", np.full(n_plan, STEPS_PER_RUN)),
            "finish_probability": (("plan", "deadline"), finish),
        },
        coords={"plan": [f"dp{g}" for g in PLAN_GPUS], "draw": np.arange(draws),
                "replicate": np.arange(replicates), "threshold": thresholds,
                "deadline": DEADLINES_S, "gpus": ("plan", PLAN_GPUS), "dp": ("plan", PLAN_GPUS),
                "tp": ones, "pp": ones, "cp": ones, "ep": ones, "microbatches": ones,
                "schedule": ("plan", ["1f1b"] * n_plan)},
        # bayesprism.io.load requires the version attrs of every artifact
        attrs={"posterior_input_digest": "f" * 16, "random_seed": seed,
               "bayesprism_version": __version__, "schema_version": SCHEMA_VERSION},
    )
    return xr.DataTree(ds)


# -- a tiny trace table and one real fit of it ----------------------------------------------------

#: Kernels of the tiny table: (name, class, median µs).
TINY_KERNELS = (("gemm_a", "gemm", 200.0), ("ew_b", "elementwise", 30.0),
                ("nccl_ar", "allreduce", 80.0))
#: log-scale GPU effects, zero-sum within each node (as the kernel model reports them)
GPU_EFFECT = {("n0", 0): 0.1, ("n0", 1): -0.1, ("n1", 0): 0.05, ("n1", 1): -0.05}


def tiny_kernel_table(seed: int = 0, steps: int = 8, occurrences: int = 3) -> pd.DataFrame:
    """2 nodes × 2 GPUs × 3 kernels (one an AllReduce) × ``steps`` steps, lognormal launches."""
    rng = np.random.default_rng(seed)
    rows = []
    for (node, gpu), effect in GPU_EFFECT.items():
        rank = 2 * int(node[1]) + gpu
        start = 0.0
        for step in range(steps):
            for kernel, cls, median in TINY_KERNELS:
                for occ in range(occurrences):
                    duration = median * np.exp(effect + rng.normal(0.0, 0.05))
                    row = {"run": "r0", "step": step, "rank": rank, "node": node, "gpu": gpu,
                           "kernel": kernel, "kernel_class": cls, "duration_us": duration,
                           "start_us": start, "occurrence": occ}
                    if cls == "allreduce":
                        row.update(bytes=1e6, group_size=4)
                    rows.append(row)
                    start += duration + 5.0
    table = pd.DataFrame(rows)
    table.attrs = {**empty_attrs(), "runs": {"r0": {
        "platform": "test-gpu", "world_size": 4, "gpus_per_node": 2,
        "plan": {"dp": 4, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "microbatches": 1}}}}
    return validate_table(table)


def tiny_spec():
    """A small kernel-level spec that mixes quickly on the tiny table (GPU level only)."""
    from bayesprism.spec import ModelSpec

    return ModelSpec(name="tiny", levels=("gpu",), node_population="normal",
                     gpu_population="normal", collective_model="none")


@functools.cache
def fitted(sampler: str = "pymc", draws: int = 200, tune: int = 200, seed: int = 0):
    """One fit of the tiny table per argument set and session (the compile is shared too);
    returns the tree and the warnings it raised."""
    from bayesprism import fit

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = fit(tiny_kernel_table(), tiny_spec(), draws=draws, tune=tune, chains=2,
                   sampler=sampler, random_seed=seed, progress=False)
    return tree, list(caught)


def unit_grid_table(nodes: int, gpus: int, steps: int, launches: int, log_us,
                    kernel: str = "gemm") -> pd.DataFrame:
    """One GEMM kernel's ``launches`` per GPU-step on a nodes × GPUs × steps grid (one run);
    ``log_us(node, gpu, step)`` gives each launch's log duration from their index arrays."""
    nn, gg, ss, _ = (a.ravel() for a in np.meshgrid(
        np.arange(nodes), np.arange(gpus), np.arange(steps), np.arange(launches),
        indexing="ij"))
    table = pd.DataFrame({
        "run": pd.Categorical(np.full(nn.size, "r0")), "step": ss, "rank": nn * gpus + gg,
        "node": pd.Categorical([f"n{n:02d}" for n in nn]), "gpu": gg,
        "kernel": pd.Categorical(np.full(nn.size, kernel)),
        "kernel_class": pd.Categorical(np.full(nn.size, "gemm")),
        "duration_us": np.exp(log_us(nn, gg, ss)),
    })
    table.attrs = {"schema_version": 1, "skipped": {}, "notes": [], "runs": {}}
    return validate_table(table)
