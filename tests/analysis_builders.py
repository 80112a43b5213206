"""Hand-built kernel-level posteriors (docs/artifacts.md) with chosen spreads, for analysis tests.

Deterministic parts have scale 0; the spreads under test get chosen scales, identical in every
posterior draw unless a test says otherwise, so the answers are known from the construction.
The traced run is plain data parallelism on 2 GPUs per node with one micro-batch per step.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

#: kernel -> (class, role, log median µs, launches per step, bytes per launch)
KERNELS = {
    "gemm_main": ("gemm", "compute", np.log(2000.0), 10.0, np.nan),
    "norm_small": ("norm", "compute", np.log(20.0), 10.0, np.nan),
    "attn_main": ("attention", "compute", np.log(1000.0), 10.0, np.nan),
    "grad_allreduce": ("allreduce", "dp", np.log(5000.0), 2.0, 5.0e7),
    "pp_sendrecv": ("sendrecv", "pp", np.log(50.0), 2.0, 1.0e6),
}
CLASSES = ["gemm", "norm", "attention", "allreduce", "sendrecv"]
COLLECTIVES = ["allreduce", "sendrecv"]
GPUS_PER_NODE = 2


def make_posterior(
    *,
    chains: int = 1,
    draws: int = 40,
    scales: dict[str, dict[str, float]] | None = None,
    coll_noise: dict[str, float] | None = None,
    coll_congestion: dict[str, float] | None = None,
    node_effect: dict[str, float] | None = None,
    node_effect_sd: float = 0.0,
    seed: int = 0,
) -> xr.DataTree:
    """A kernel-level fit.

    Parameters
    ----------
    scales
        ``{level: {class: loading}}`` for levels ``node``, ``gpu``, ``step``, ``gpustep``,
        ``resid``; unlisted loadings are 0. Every level variable is present.
    coll_noise, coll_congestion
        Per collective; unlisted are 0.
    node_effect
        Standardised effects of the measured nodes (default: 4 nodes at 0).
    node_effect_sd
        Posterior sd of each node effect around its value (0: known exactly).
    """
    rng = np.random.default_rng(seed)
    scales = scales or {}
    node_effect = node_effect if node_effect is not None else {f"n{i}": 0.0 for i in range(4)}
    nodes = list(node_effect)
    kernels = list(KERNELS)
    shape = (chains, draws)

    def const(values, dims) -> tuple[list[str], np.ndarray]:
        values = np.asarray(values, dtype=float)
        return ["chain", "draw", *dims], np.broadcast_to(values, (*shape, *values.shape)).copy()

    post = {"kernel_log_median": const([KERNELS[k][2] for k in kernels], ["kernel"])}
    for level in ("node", "gpu", "step", "gpustep", "resid"):
        chosen = scales.get(level, {})
        post[f"{level}_scale"] = const([chosen.get(c, 0.0) for c in CLASSES], ["kernel_class"])
    u = np.array([node_effect[n] for n in nodes])
    post["node_effect"] = (
        ["chain", "draw", "node"],
        u + node_effect_sd * rng.standard_normal((*shape, len(nodes))),
    )
    post["step_effect"] = const(np.zeros(2), ["step_unit"])
    latency = np.array([[5.0, 20.0], [5.0, 10.0]])
    bandwidth = np.array([[100.0, 20.0], [100.0, 20.0]])
    post["coll_latency_us"] = const(latency, ["collective", "tier"])
    post["coll_bandwidth_gbps"] = const(bandwidth, ["collective", "tier"])
    post["coll_noise"] = const(
        [(coll_noise or {}).get(c, 0.0) for c in COLLECTIVES], ["collective"]
    )
    post["coll_congestion"] = const(
        [(coll_congestion or {}).get(c, 0.0) for c in COLLECTIVES], ["collective"]
    )
    coords = {
        "chain": np.arange(chains),
        "draw": np.arange(draws),
        "kernel": kernels,
        "kernel_class": CLASSES,
        "node": nodes,
        "step_unit": ["run/1", "run/2"],
        "collective": COLLECTIVES,
        "tier": ["intra", "inter"],
    }
    posterior = xr.Dataset(post, coords=coords)
    ranks = np.arange(2 * GPUS_PER_NODE)
    inventory = xr.Dataset(
        {
            "kernel_class": ("kernel", [KERNELS[k][0] for k in kernels]),
            "role": ("kernel", [KERNELS[k][1] for k in kernels]),
            "launches_per_step": ("kernel", [KERNELS[k][3] for k in kernels]),
            "launches": (
                ("kernel", "rank"),
                np.tile([[KERNELS[k][3]] for k in kernels], ranks.size),
            ),
            "bytes_per_launch": ("kernel", [KERNELS[k][4] for k in kernels]),
            "group_size": ("kernel", [np.nan, np.nan, np.nan, 4.0, 2.0]),
            "rank_node": ("rank", [f"n{r // GPUS_PER_NODE}" for r in ranks]),
            "rank_gpu": ("rank", ranks % GPUS_PER_NODE),
        },
        coords={"kernel": kernels, "rank": ranks},
        attrs={
            "traced_plan": json.dumps(
                {
                    "dp": 4,
                    "tp": 1,
                    "pp": 1,
                    "cp": 1,
                    "ep": 1,
                    "microbatches": 1,
                    "gpus_per_node": GPUS_PER_NODE,
                    "world_size": 4,
                }
            ),
            "run": "run",
            "platform": "test",
        },
    )
    attrs = {
        "bayesprism_version": "0.1.0",
        "schema_version": 1,
        "model_kind": "kernel",
        "node_population": "normal",
        "gpu_population": "normal",
        "collective_model": json.dumps(COLLECTIVES),
        "draws": draws,
        "chains": chains,
        "random_seed": seed,
    }
    return xr.DataTree.from_dict(
        {"/": xr.Dataset(attrs=attrs), "posterior": posterior, "inventory": inventory}
    )
