"""Hand-built kernel-level posteriors following docs/artifacts.md, for composition tests.

Every variable is constant over draws unless a test passes arrays, so the composition's output
can be computed by hand (scales 0: deterministic kernels) or from known distributions.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from bayesprism import __version__
from bayesprism.schema import SCHEMA_VERSION
from bayesprism.spec import ModelSpec

CLASSES = ("gemm", "attention", "elementwise", "norm", "optimizer", "allreduce", "allgather",
           "reducescatter", "sendrecv", "alltoall")
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")


def kernel_posterior(
    kernels: dict[str, dict],
    *,
    traced_plan: dict | None = None,
    draws: int = 10,
    scales: dict[str, dict[str, float]] | None = None,
    node_population: str = "normal",
    gpu_population: str = "normal",
    population_params: dict[str, float] | None = None,
    latency_us: dict[str, float] | None = None,
    bandwidth_gbps: dict[str, float] | None = None,
    coll_noise: float = 0.0,
    coll_congestion: float = 0.0,
    measured_nodes: dict[str, float] | None = None,
    gpus_per_node: int = 8,
    spans_us: list[float] | None = None,
) -> xr.DataTree:
    """A one-chain kernel-level posterior.

    ``kernels`` maps a kernel name to ``{"class", "role", "launches", "log_median", "bytes",
    "group"}`` (the last two for collectives). ``scales`` maps a level (``node``, ``gpu``,
    ``step``, ``gpustep``, ``resid``) to per-class loadings (missing classes: 0). Collective
    cost parameters are per tier (``{"intra": .., "inter": ..}``) and shared by every class.
    ``spans_us`` gives one traced step's span on each traced rank (every rank launching
    ``launches_per_step`` of each kernel), which adds ``launches`` and ``traced_step_time_us``.
    """
    traced_plan = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "microbatches": 1,
                   "gpus_per_node": gpus_per_node, **(traced_plan or {})}
    traced_plan.setdefault("world_size", traced_plan["dp"] * traced_plan["tp"]
                           * traced_plan["pp"] * traced_plan["cp"])
    names = list(kernels)
    dims2 = ("chain", "draw")

    def const(value, *extra_dims, shape=()):
        arr = np.broadcast_to(np.asarray(value, dtype=float), (1, draws, *shape)).copy()
        return (dims2 + extra_dims, arr)

    latency_us = latency_us or {"intra": 5.0, "inter": 10.0}
    bandwidth_gbps = bandwidth_gbps or {"intra": 100.0, "inter": 25.0}
    posterior = {
        "kernel_log_median": const([kernels[k]["log_median"] for k in names], "kernel",
                                   shape=(len(names),)),
        "coll_latency_us": const([[latency_us["intra"], latency_us["inter"]]] * len(COLLECTIVES),
                                 "collective", "tier", shape=(len(COLLECTIVES), 2)),
        "coll_bandwidth_gbps": const([[bandwidth_gbps["intra"], bandwidth_gbps["inter"]]]
                                     * len(COLLECTIVES), "collective", "tier",
                                     shape=(len(COLLECTIVES), 2)),
        "coll_noise": const(coll_noise, "collective", shape=(len(COLLECTIVES),)),
        "coll_congestion": const(coll_congestion, "collective", shape=(len(COLLECTIVES),)),
    }
    for level in ("node", "gpu", "step", "gpustep", "resid"):
        values = (scales or {}).get(level, {})
        posterior[f"{level}_scale"] = const([values.get(c, 0.0) for c in CLASSES],
                                            "kernel_class", shape=(len(CLASSES),))
    coords = {"chain": [0], "draw": np.arange(draws), "kernel": names,
              "kernel_class": list(CLASSES), "collective": list(COLLECTIVES),
              "tier": ["intra", "inter"]}
    for name, value in (population_params or {}).items():
        posterior[name] = const(value)
    if measured_nodes:
        posterior["node_effect"] = const(list(measured_nodes.values()), "node",
                                         shape=(len(measured_nodes),))
        coords["node"] = list(measured_nodes)
    attrs = {"node_population": node_population, "gpu_population": gpu_population,
             "collective_model": json.dumps(["allreduce", "allgather", "reducescatter",
                                             "alltoall", "sendrecv"])}
    post = xr.Dataset(posterior, coords=coords, attrs=attrs)

    inventory = xr.Dataset(
        {
            "kernel_class": ("kernel", [kernels[k]["class"] for k in names]),
            "role": ("kernel", [kernels[k].get("role", "compute") for k in names]),
            "launches_per_step": ("kernel", [float(kernels[k]["launches"]) for k in names]),
            "bytes_per_launch": ("kernel", [float(kernels[k].get("bytes", np.nan)) for k in names]),
            "group_size": ("kernel", [float(kernels[k].get("group", np.nan)) for k in names]),
        },
        coords={"kernel": names},
        attrs={"traced_plan": json.dumps(traced_plan), "run": "synthetic", "platform": "test"},
    )
    if spans_us is not None:
        ranks = np.arange(len(spans_us))
        per_kernel = inventory["launches_per_step"].to_numpy()[:, None]
        inventory["launches"] = (("kernel", "rank"), np.repeat(per_kernel, ranks.size, axis=1))
        inventory["traced_step_time_us"] = (("step_unit", "rank"),
                                            np.asarray(spans_us, dtype=float)[None, :])
        inventory = inventory.assign_coords(rank=ranks, step_unit=["synthetic/0"])
    spec = ModelSpec.default()
    root_attrs = {"model_kind": "kernel", "bayesprism_version": __version__,
                  "schema_version": SCHEMA_VERSION, "spec": json.dumps(spec.to_dict()),
                  "spec_hash": spec.spec_hash(), "input_digest": "hand-built", "sampler": "pymc",
                  "seconds": 0.0, "draws": draws, "tune": 0, "chains": 1, "random_seed": 0,
                  **attrs}
    return xr.DataTree.from_dict({"/": xr.Dataset(attrs=root_attrs), "posterior": post,
                                  "inventory": inventory})


def gemm_only(log_median: float = np.log(100.0), launches: float = 10.0, **kwargs) -> xr.DataTree:
    """One GEMM kernel, nothing else: a rank's step is ``launches * exp(log_median)`` µs."""
    kernels = {"gemm0": {"class": "gemm", "launches": launches, "log_median": log_median}}
    return kernel_posterior(kernels, **kwargs)
