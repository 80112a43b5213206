"""Tiny synthetic trace tables and a once-per-session kernel fit shared by the fit/io/CLI tests."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pandas as pd

from bayesprism.schema import empty_attrs, validate_table

#: Kernels of the tiny table: (name, class, median µs).
KERNELS = (("gemm_a", "gemm", 200.0), ("ew_b", "elementwise", 30.0),
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
            for kernel, cls, median in KERNELS:
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
    """One fit per argument set and session (the compile is shared too)."""
    from bayesprism import fit

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = fit(tiny_kernel_table(), tiny_spec(), draws=draws, tune=tune, chains=2,
                   sampler=sampler, random_seed=seed, progress=False)
    return tree, [w for w in caught]
