"""Hand-built artifacts that follow docs/artifacts.md, for tests of diagnostics, plots, reports.

The posterior is built from a known truth: every parameter's draws scatter independently around
its true value (a perfectly mixed sampler), and the observed cell statistics are simulated from
the same truth, so predictive checks must pass, and fail when the data are shifted.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

KERNELS = {
    "gemm_a": "gemm",
    "gemm_b": "gemm",
    "flash_fwd": "attention",
    "nccl_allreduce": "allreduce",
    "layernorm": "norm",
}
CLASSES = ["gemm", "attention", "allreduce", "norm"]
LOG_MEDIAN = {
    "gemm_a": 6.0,
    "gemm_b": 5.0,
    "flash_fwd": 6.5,
    "nccl_allreduce": 7.0,
    "layernorm": 3.0,
}
NODES = ["node0", "node1", "node2", "node3", "node4", "node5"]
GPUS_PER_NODE = 2
STEPS = [f"run1/{s}" for s in range(1, 7)]
SLOW_NODE = "node5"
LAUNCHES_PER_CELL = 4


def truth(seed: int = 0) -> dict:
    """True parameter values (node5 degraded: standardised effect +2.5)."""
    rng = np.random.default_rng(seed)
    gpus = [f"{n}/{g}" for n in NODES for g in range(GPUS_PER_NODE)]
    node_effect = rng.normal(0, 0.5, len(NODES))
    node_effect[NODES.index(SLOW_NODE)] = 2.5
    return {
        "kernel_log_median": np.array([LOG_MEDIAN[k] for k in KERNELS]),
        "node_scale": np.array([0.10, 0.05, 0.20, 0.02]),
        "gpu_scale": np.array([0.05, 0.05, 0.05, 0.05]),
        "step_scale": np.array([0.03, 0.03, 0.30, 0.02]),
        "resid_scale": np.array([0.10, 0.15, 0.40, 0.20]),
        "node_effect": node_effect,
        "gpu_effect": rng.normal(0, 1, len(gpus)),
        "step_effect": rng.normal(0, 1, len(STEPS)),
        "gpus": gpus,
    }


def make_posterior(
    seed: int = 0,
    chains: int = 4,
    draws: int = 500,
    shift_class: str | None = None,
    shift: float = 1.0,
    link_units: bool = True,
) -> xr.DataTree:
    """A kernel-model fit of the known truth.

    ``shift_class`` moves that class's observed cell means by ``shift`` (a misfit);
    ``link_units=False`` leaves out the GPU-step → unit maps (``*_of_gpustep``).
    """
    rng = np.random.default_rng(seed)
    t = truth(seed)
    kernels = list(KERNELS)
    gpus = t["gpus"]
    cls_index = np.array([CLASSES.index(KERNELS[k]) for k in kernels])

    def draws_of(value, sd, positive=False):
        value = np.asarray(value, dtype=float)
        x = value + sd * rng.standard_normal((chains, draws, *value.shape))
        return np.abs(x) if positive else x

    dims = {
        "kernel_log_median": ["kernel"],
        "node_effect": ["node"],
        "gpu_effect": ["gpu_unit"],
        "step_effect": ["step_unit"],
    }
    # effects are less certain than kernel medians: only clearly degraded units exclude zero
    post = {
        name: (
            ["chain", "draw", *dims[name]],
            draws_of(t[name], 0.03 if name == "kernel_log_median" else 0.15),
        )
        for name in dims
    }
    for level in ("node", "gpu", "step", "resid"):
        post[f"{level}_scale"] = (
            ["chain", "draw", "kernel_class"],
            draws_of(t[f"{level}_scale"], 0.005, positive=True),
        )
    post["node_nu"] = (["chain", "draw"], draws_of(4.0, 0.3, positive=True))
    coords = {
        "chain": np.arange(chains),
        "draw": np.arange(draws),
        "kernel": kernels,
        "kernel_class": CLASSES,
        "node": NODES,
        "gpu_unit": gpus,
        "step_unit": STEPS,
    }
    posterior = xr.Dataset(
        post, coords=coords, attrs={"node_population": "student_t", "gpu_population": "normal"}
    )

    # cells: kernel x gpu x step, simulated from the truth
    k_i, g_i, s_i = (
        a.reshape(-1)
        for a in np.meshgrid(
            np.arange(len(kernels)), np.arange(len(gpus)), np.arange(len(STEPS)), indexing="ij"
        )
    )
    n_i = np.array([gpus[g].split("/")[0] for g in g_i])
    node_i = np.array([NODES.index(n) for n in n_i])
    c_i = cls_index[k_i]
    mu = (
        t["kernel_log_median"][k_i]
        + t["node_scale"][c_i] * t["node_effect"][node_i]
        + t["gpu_scale"][c_i] * t["gpu_effect"][g_i]
        + t["step_scale"][c_i] * t["step_effect"][s_i]
    )
    n = np.full(k_i.size, LAUNCHES_PER_CELL)
    sd = t["resid_scale"][c_i]
    mean = mu + sd / np.sqrt(n) * rng.standard_normal(k_i.size)
    if shift_class is not None:
        mean = mean + shift * (np.array(CLASSES)[c_i] == shift_class)
    ss = sd**2 * rng.chisquare(n - 1)
    # stored as the kernel model stores them: cells point at GPU-steps, GPU-steps at units
    gs_i = g_i * len(STEPS) + s_i
    gs_gpu, gs_step = np.divmod(np.arange(len(gpus) * len(STEPS)), len(STEPS))
    gs_node = np.array([NODES.index(gpus[g].split("/")[0]) for g in gs_gpu])
    constant = xr.Dataset(
        {
            "cell_kernel": ("cell", k_i),
            "cell_gpustep": ("cell", gs_i),
            "cell_n": ("cell", n),
            "cell_mean_log": ("cell", mean),
            "cell_ss_log": ("cell", ss),
        },
        coords={"cell": np.arange(k_i.size)},
    )
    if link_units:
        constant["node_of_gpustep"] = ("gpustep", gs_node)
        constant["gpu_of_gpustep"] = ("gpustep", gs_gpu)
        constant["step_of_gpustep"] = ("gpustep", gs_step)

    energy = rng.standard_normal((chains, draws))
    sample_stats = xr.Dataset(
        {
            "diverging": (["chain", "draw"], np.zeros((chains, draws), dtype=bool)),
            "energy": (["chain", "draw"], energy),
        },
        coords={"chain": np.arange(chains), "draw": np.arange(draws)},
    )

    ranks = np.arange(len(gpus))
    launches_per_step = np.array([24.0, 24.0, 12.0, 2.0, 48.0])
    # each rank's step = its launches at their cell's mean duration (lognormal mean)
    cell_us = np.exp(mu + sd**2 / 2).reshape(len(kernels), len(gpus), len(STEPS))
    step_us = np.einsum("k,kgs->sg", launches_per_step, cell_us)
    inventory = xr.Dataset(
        {
            "kernel_class": ("kernel", [KERNELS[k] for k in kernels]),
            "launches_per_step": ("kernel", launches_per_step),
            "launches": (
                ("kernel", "rank"),
                np.tile([[24.0], [24.0], [12.0], [2.0], [48.0]], (1, len(ranks))),
            ),
            "bytes_per_launch": ("kernel", [np.nan, np.nan, np.nan, 2.0e8, np.nan]),
            "group_size": ("kernel", [np.nan, np.nan, np.nan, 12.0, np.nan]),
            "role": ("kernel", ["compute", "compute", "compute", "dp", "compute"]),
            "rank_node": ("rank", [g.split("/")[0] for g in gpus]),
            "rank_gpu": ("rank", [int(g.split("/")[1]) for g in gpus]),
            "traced_step_time_us": (("step_unit", "rank"), step_us),
        },
        coords={"kernel": kernels, "rank": ranks, "step_unit": STEPS},
        attrs={
            "traced_plan": json.dumps(
                {
                    "dp": 12,
                    "tp": 1,
                    "pp": 1,
                    "cp": 1,
                    "ep": 1,
                    "microbatches": 1,
                    "gpus_per_node": GPUS_PER_NODE,
                    "world_size": 12,
                }
            ),
            "run": "run1",
            "platform": "test-cluster",
        },
    )
    attrs = {
        "bayesprism_version": "0.1.0",
        "schema_version": 1,
        "model_kind": "kernel",
        **spec_attrs(),
        "input_digest": "f" * 16,
        "sampler": "pymc",
        "seconds": 1.0,
        "draws": draws,
        "tune": draws,
        "chains": chains,
        "random_seed": seed,
    }
    return xr.DataTree.from_dict(
        {
            "/": xr.Dataset(attrs=attrs),
            "posterior": posterior,
            "sample_stats": sample_stats,
            "constant_data": constant,
            "inventory": inventory,
        }
    )


def spec_attrs() -> dict[str, str]:
    """``spec`` and ``spec_hash`` root attrs of the default spec (``bayesprism.io.load`` checks
    that the spec hashes to the recorded hash)."""
    from bayesprism.spec import ModelSpec

    spec = ModelSpec.default()
    return {"spec": json.dumps(spec.to_dict()), "spec_hash": spec.spec_hash()}


PLAN_GPUS = [12, 96, 768, 6144]
STEPS_PER_RUN = 1000
DEADLINES_S = [330.0, 400.0]


def make_forecast(seed: int = 0, draws: int = 100, replicates: int = 8) -> xr.DataTree:
    """A forecast DataTree (as ``bayesprism.forecast.forecast`` writes it) of four
    data-parallel plans whose step time and tail grow with scale."""
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
    training = (
        STEPS_PER_RUN * step.mean(axis=2, keepdims=True) * np.exp(0.01 * rng.standard_normal(shape))
    )
    finish = np.stack([(training <= t).mean(axis=(1, 2)) for t in DEADLINES_S], axis=-1)
    dims3 = ("plan", "draw", "replicate")
    names = [f"dp{g}" for g in PLAN_GPUS]
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
        coords={
            "plan": names,
            "draw": np.arange(draws),
            "replicate": np.arange(replicates),
            "threshold": thresholds,
            "deadline": DEADLINES_S,
            "gpus": ("plan", PLAN_GPUS),
            "dp": ("plan", PLAN_GPUS),
            "tp": ("plan", [1] * n_plan),
            "pp": ("plan", [1] * n_plan),
            "cp": ("plan", [1] * n_plan),
            "ep": ("plan", [1] * n_plan),
            "microbatches": ("plan", [1] * n_plan),
            "schedule": ("plan", ["1f1b"] * n_plan),
        },
        attrs={
            "posterior_input_digest": "f" * 16,
            "random_seed": seed,
            "bayesprism_version": "0.1.0",
            # what bayesprism.io.load requires of every artifact
            "schema_version": 1,
        },
    )
    return xr.DataTree(ds)
