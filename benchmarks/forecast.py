"""Benchmark: forecast time and memory from 512 to 65,536 GPUs (not a timed test).

A GPT-like kernel-level posterior is built by hand following docs/artifacts.md: a traced run of
64 GPUs (tp 8, pp 2, dp 4, 8 micro-batches, distributed optimizer) with per-layer GEMMs,
attention, element-wise and norm kernels, sequence-parallel TP AllGather/ReduceScatter, TP
AllReduce, PP send/recv, DP ReduceScatter/AllGather and optimizer kernels; 2 chains x 500
draws with posterior spread on every parameter and Student-t node and GPU populations.
Each target plan (tp 8, pp 16, 1F1B, 32 micro-batches, dp growing) is forecast with 1,000
draws; the script prints seconds per plan, peak traced memory and the ratio 65,536 / 512.

``--dev POSTERIOR``: the traced 3D job of ../shared/data/simulated instead (a posterior of it,
e.g. from ``bayesprism fit <traces> <nccl_bench.csv> -o post.nc``): five plans of the same job
at 64 to 16,384 GPUs (dp 2 to 512), 1,000 draws, seconds for the five together (the goal:
<= 10 s on 2 cores).

Run: ``.venv/bin/python benchmarks/forecast.py [--dev POSTERIOR]``
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import tracemalloc
import warnings

import numpy as np
import xarray as xr

from bayesprism import __version__
from bayesprism.forecast.forecasting import forecast
from bayesprism.plan import ParallelPlan, PlanWarning
from bayesprism.schema import SCHEMA_VERSION
from bayesprism.spec import ModelSpec

CLASSES = ("gemm", "attention", "elementwise", "norm", "optimizer", "allreduce", "allgather",
           "reducescatter", "sendrecv")
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")
TRACED = {"dp": 4, "tp": 8, "pp": 2, "cp": 1, "ep": 1, "microbatches": 8, "gpus_per_node": 8,
          "world_size": 64, "sharding": "zero1"}
LAYERS_PER_STAGE = 16  # a 32-layer model on 2 stages
HIDDEN_BYTES = 8 * 2048 * 4096 * 2  # micro-batch 8 x seq 2048 x hidden 4096, bf16, per layer
# (name, class, role, launches per layer per micro-batch, typical us, bytes per launch)
PER_LAYER = [
    ("gemm_qkv_fwd", "gemm", "compute", 1, 420.0, None),
    ("gemm_proj_fwd", "gemm", "compute", 1, 140.0, None),
    ("gemm_fc1_fwd", "gemm", "compute", 1, 560.0, None),
    ("gemm_fc2_fwd", "gemm", "compute", 1, 560.0, None),
    ("gemm_dgrad_bwd", "gemm", "compute", 4, 420.0, None),
    ("gemm_wgrad_bwd", "gemm", "compute", 4, 420.0, None),
    ("flash_attn_fwd", "attention", "compute", 1, 380.0, None),
    ("flash_attn_bwd", "attention", "compute", 1, 950.0, None),
    ("gelu_fwd", "elementwise", "compute", 1, 60.0, None),
    ("gelu_bwd", "elementwise", "compute", 1, 80.0, None),
    ("dropout_add", "elementwise", "compute", 4, 35.0, None),
    ("layernorm_fwd", "norm", "compute", 2, 30.0, None),
    ("layernorm_bwd", "norm", "compute", 2, 55.0, None),
    ("sp_allgather", "allgather", "tp", 4, 150.0, HIDDEN_BYTES),
    ("sp_reducescatter", "reducescatter", "tp", 4, 150.0, HIDDEN_BYTES),
]
PER_STEP = [
    ("pp_sendrecv", "sendrecv", "pp", 2 * TRACED["microbatches"], 300.0, HIDDEN_BYTES),
    ("dp_reducescatter", "reducescatter", "dp", 8, 9000.0, 100e6),
    ("dp_allgather", "allgather", "dp", 8, 9000.0, 100e6),
    ("adam_multi_tensor", "optimizer", "compute", 40, 90.0, None),
]
SCALES = {  # per-class loadings: node, gpu, step, gpustep, resid
    "gemm": (0.03, 0.015, 0.01, 0.01, 0.05),
    "attention": (0.03, 0.015, 0.01, 0.01, 0.06),
    "elementwise": (0.02, 0.01, 0.02, 0.01, 0.10),
    "norm": (0.02, 0.01, 0.02, 0.01, 0.10),
    "optimizer": (0.02, 0.01, 0.02, 0.01, 0.08),
}


def gpt_like_posterior(chains: int = 2, draws: int = 500, seed: int = 1) -> xr.DataTree:
    """The hand-built posterior described in the module docstring."""
    rng = np.random.default_rng(seed)
    rows = [(n, c, r, k * LAYERS_PER_STAGE * TRACED["microbatches"], t, b)
            for n, c, r, k, t, b in PER_LAYER] + PER_STEP
    names = [r[0] for r in rows]
    shape = (chains, draws)

    def around(value, sd, extra=()):
        return value * np.exp(sd * rng.standard_normal((*shape, *extra)))

    log_median = np.log([r[4] for r in rows]) + 0.01 * rng.standard_normal((*shape, len(rows)))
    post = {"kernel_log_median": (("chain", "draw", "kernel"), log_median)}
    for i, level in enumerate(("node", "gpu", "step", "gpustep", "resid")):
        values = np.array([SCALES.get(c, (0.02, 0.01, 0.02, 0.01, 0.1))[i] for c in CLASSES])
        post[f"{level}_scale"] = (("chain", "draw", "kernel_class"),
                                  values * around(1.0, 0.1, (len(CLASSES),)))
    post["node_nu"] = (("chain", "draw"), around(8.0, 0.2))
    post["gpu_nu"] = (("chain", "draw"), around(12.0, 0.2))
    latency = np.array([6.0, 12.0]) * np.ones((len(COLLECTIVES), 1))
    bandwidth = np.array([180.0, 40.0]) * np.ones((len(COLLECTIVES), 1))
    post["coll_latency_us"] = (("chain", "draw", "collective", "tier"),
                               around(1.0, 0.05, latency.shape) * latency)
    post["coll_bandwidth_gbps"] = (("chain", "draw", "collective", "tier"),
                                   around(1.0, 0.05, bandwidth.shape) * bandwidth)
    post["coll_noise"] = (("chain", "draw", "collective"), around(0.08, 0.1, (len(COLLECTIVES),)))
    post["coll_congestion"] = (("chain", "draw", "collective"),
                               around(0.04, 0.1, (len(COLLECTIVES),)))
    attrs = {"node_population": "student_t", "gpu_population": "student_t",
             "collective_model": json.dumps(["allreduce", "allgather", "reducescatter",
                                             "sendrecv"])}
    coords = {"chain": np.arange(chains), "draw": np.arange(draws), "kernel": names,
              "kernel_class": list(CLASSES), "collective": list(COLLECTIVES),
              "tier": ["intra", "inter"]}
    inventory = xr.Dataset(
        {
            "kernel_class": ("kernel", [r[1] for r in rows]),
            "role": ("kernel", [r[2] for r in rows]),
            "launches_per_step": ("kernel", [float(r[3]) for r in rows]),
            "bytes_per_launch": ("kernel", [np.nan if r[5] is None else float(r[5])
                                            for r in rows]),
            "group_size": ("kernel", [{"tp": 8.0, "pp": 2.0, "dp": 4.0}.get(r[2], np.nan)
                                      for r in rows]),
        },
        coords={"kernel": names},
        attrs={"traced_plan": json.dumps(TRACED), "run": "gpt-like", "platform": "synthetic"},
    )
    spec = ModelSpec.default()
    root = {"model_kind": "kernel", "bayesprism_version": __version__,
            "schema_version": SCHEMA_VERSION, "spec": json.dumps(spec.to_dict()),
            "spec_hash": spec.spec_hash(), "input_digest": "hand-built GPT-like benchmark",
            "sampler": "pymc", "seconds": 0.0, "draws": draws, "tune": 0, "chains": chains,
            "random_seed": seed, **attrs}
    return xr.DataTree.from_dict({"/": xr.Dataset(attrs=root),
                                  "posterior": xr.Dataset(post, coords=coords, attrs=attrs),
                                  "inventory": inventory})


def dev_case(path: str) -> None:
    """Five data-parallel scales of the traced job, forecast together."""
    from bayesprism.io import load

    posterior = load(path)
    traced = json.loads(posterior["inventory"].attrs["traced_plan"])
    layout = {k: traced[k] for k in ("tp", "pp", "cp", "microbatches", "gpus_per_node",
                                     "sharding", "schedule") if traced.get(k) is not None}
    plans = [ParallelPlan(name=f"{gpus} GPUs", dp=gpus // (traced["tp"] * traced["pp"]),
                          **layout) for gpus in (64, 256, 1024, 4096, 16384)]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        fc = forecast(posterior, plans, draws=1000, replicates=8, progress=False)
    seconds = time.perf_counter() - start
    ds = fc.to_dataset()
    for i, plan in enumerate(plans):
        step = ds["step_time_s"].isel(plan=i).values
        print(f"{plan.name:>11} ({ds['path'].isel(plan=i).item()} path): step p50 "
              f"{np.median(step):.4f} s, p95 {np.quantile(step, 0.95):.4f} s, ideal "
              f"{float(ds['ideal_step_time_s'].isel(plan=i)):.4f} s")
    print(f"five plans, 1,000 draws x 8 replicates: {seconds:.2f} s; process peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", metavar="POSTERIOR", default=None,
                        help="forecast the traced 3D job from this posterior instead")
    args = parser.parse_args()
    if args.dev:
        dev_case(args.dev)
        return
    posterior = gpt_like_posterior()
    seconds = {}
    for gpus in (512, 8192, 65536):
        plan = ParallelPlan(name=f"{gpus} GPUs", dp=gpus // (8 * 16), tp=8, pp=16,
                            microbatches=32, schedule="1f1b", sharding="zero1", overlap=0.5)
        tracemalloc.start()
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlanWarning)
            fc = forecast(posterior, plan, draws=1000, replicates=8, progress=False)
        seconds[gpus] = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        ds = fc.to_dataset().isel(plan=0)
        step = ds["step_time_s"].values
        print(f"{gpus:>6} GPUs ({ds['path'].item()} path): {seconds[gpus]:6.2f} s, "
              f"peak traced memory {peak / 2**20:7.1f} MiB; step p50 {np.median(step):.4f} s, "
              f"p95 {np.quantile(step, 0.95):.4f} s, ideal {float(ds['ideal_step_time_s']):.4f} s,"
              f" P(>5%) {float(ds['slowdown_probability'][0]):.3f}")
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"ratio 65,536 / 512 GPUs: {seconds[65536] / seconds[512]:.2f}; "
          f"process peak RSS {max_rss:.0f} MiB")


if __name__ == "__main__":
    main()
