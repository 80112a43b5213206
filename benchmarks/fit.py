"""Benchmark: fit the kernel-level model to 10 million synthetic kernel launches.

Generates a trace table of 512 GPUs (64 nodes × 8) × 20 steps × 1,000 launches per rank-step
(20 kernels in 5 classes, 50 launches each) with known node / GPU / step / GPU×step effects and
one degraded node, then times the end-to-end fit: aggregation to cell statistics, model build,
nutpie compilation (JAX backend when installed, as ``bayesprism.fit`` does) and sampling
(2 chains), printing each phase as it ends. Prints seconds, max R-hat and min bulk ESS of the
variance components, the recovered scales against the truth, and the cost per launch of one
log-density + gradient evaluation of the cell likelihood against the row-level likelihood of
the same model on a subsample.

    python benchmarks/fit.py            # 10.24 M launches
    python benchmarks/fit.py --quick    # 64 GPUs × 10 steps × 200 launches (128 k)
    python benchmarks/fit.py --dev      # the traced 3D job of ../shared/data/simulated
    python benchmarks/fit.py --dev --with-nccl   # ... fitted jointly with its nccl-tests sweep
    python benchmarks/fit.py --dev --with-nccl --with-fleet  # ... and the fleet GEMM benchmark
    python benchmarks/fit.py --dev --spec lasting   # ... with another model spec
    python benchmarks/fit.py --dev --fleet-prior    # ... the fleet benchmark fitted first, its
                                                    # populations as the traces' prior

``--dev`` fits the traced TP 8 × PP 4 × DP 2 job (64 Kineto rank files, 835 k launches; with
``--with-nccl`` also its nccl-tests sweep, as benchmarks before this option did; with
``--with-fleet`` the per-GPU GEMM benchmark of 512 fleet nodes, 61 k rows) end to end
with ``bayesprism.fit`` (its default draws and warm-up; the default spec unless ``--spec``)
and prints ingest and fit seconds and the convergence of every variable (the goal, for the
traces: converged in <= 60 s on 2 cores). The fit line says whether XLA compiled the log
density (a first fit of these data: cold) or found it in JAX's compilation cache (a refit).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

TRUTH = {"node": 0.08, "gpu": 0.04, "step": 0.03, "gpustep": 0.02, "resid": 0.05}
CLASSES = ["gemm", "attention", "elementwise", "norm", "optimizer"]


def synthetic_table(nodes: int, gpus: int, steps: int, kernels: int, launches: int,
                    seed: int = 0) -> pd.DataFrame:
    """A trace table with known effects; node 0 is degraded (+6 population sds)."""
    rng = np.random.default_rng(seed)
    log_median = rng.uniform(np.log(5.0), np.log(500.0), size=kernels)
    kclass = np.arange(kernels) % len(CLASSES)
    u = rng.standard_normal(nodes)
    u[0] = 6.0
    v = rng.standard_normal(nodes * gpus)
    w = rng.standard_normal(steps)
    z = rng.standard_normal(nodes * gpus * steps)
    per_gs = kernels * launches
    n_rows = nodes * gpus * steps * per_gs
    gs = np.repeat(np.arange(nodes * gpus * steps, dtype=np.int64), per_gs)
    gpu_unit = gs // steps
    step = (gs % steps).astype(np.int64)
    node = gpu_unit // gpus
    kernel = np.tile(np.repeat(np.arange(kernels), launches), nodes * gpus * steps)
    y = log_median[kernel]
    y += TRUTH["node"] * u[node] + TRUTH["gpu"] * v[gpu_unit] + TRUTH["step"] * w[step]
    y += TRUTH["gpustep"] * z[gs]
    y += TRUTH["resid"] * rng.standard_normal(n_rows)
    return pd.DataFrame({
        "run": pd.Categorical.from_codes(np.zeros(n_rows, dtype=np.int8), ["bench"]),
        "step": step,
        "rank": gpu_unit,
        "node": pd.Categorical.from_codes(node, [f"node{i:03d}" for i in range(nodes)]),
        "gpu": (gpu_unit % gpus).astype(np.int64),
        "kernel": pd.Categorical.from_codes(kernel, [f"k{i:02d}" for i in range(kernels)]),
        "kernel_class": pd.Categorical.from_codes(kclass[kernel], CLASSES),
        "duration_us": np.exp(y),
    })


def logp_grad_seconds(model, repeats: int = 20) -> float:
    """Seconds per joint log-density + gradient evaluation at the initial point."""
    import pytensor.tensor as pt

    logp = model.logp()
    fn = model.compile_fn([logp, *pt.grad(logp, model.value_vars)], point_fn=True)
    point = model.initial_point()
    fn(point)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(point)
    return (time.perf_counter() - start) / repeats


DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "simulated" / "megatron-3d-dev"


def _jax_cache_entries() -> set[str]:
    """Names of the files in JAX's persistent compilation cache (empty without one)."""
    from bayesprism.inference import jax_compilation_cache, nutpie_backend

    directory = jax_compilation_cache() if nutpie_backend() == "jax" else None
    return {p.name for p in Path(directory).iterdir()} if directory and Path(directory).is_dir() \
        else set()


def dev_case(draws: int | None, tune: int | None, seed: int, with_nccl: bool = False,
             with_fleet: bool = False, spec: str | None = None,
             fleet_prior: str | None = None) -> int:
    """Ingest and fit the traced 3D job (and its nccl-tests sweep, its fleet GEMM benchmark);
    print seconds and convergence. ``None``: ``bayesprism.fit``'s default draws, warm-up or
    spec. ``fleet_prior``: a fitted fleet posterior whose populations are the traces' prior,
    or ``""``: fit the fleet GEMM benchmark first (timed apart)."""
    import bayesprism as bp
    from bayesprism.inference import convergence_summary

    prior = None
    if fleet_prior == "":
        t0 = time.perf_counter()
        prior = bp.fit(bp.read_traces(DEV / "fleet_gemm_bench.csv.gz", progress=False),
                       random_seed=seed, progress=False)
        conv = convergence_summary(prior)
        print(f"fleet benchmark fit {time.perf_counter() - t0:.1f} s: max R-hat "
              f"{conv['max_rhat']:.3f}, min bulk ESS {conv['min_ess_bulk']:.0f}, divergences "
              f"{conv['divergences']}", flush=True)
    elif fleet_prior is not None:
        prior = fleet_prior
    t0 = time.perf_counter()
    inputs = [DEV / "traces", *([DEV / "nccl_bench.csv"] if with_nccl else []),
              *([DEV / "fleet_gemm_bench.csv.gz"] if with_fleet else [])]
    table = bp.read_traces(inputs, progress=False)
    t1 = time.perf_counter()
    print(f"ingest {t1 - t0:.1f} s: {len(table):,} rows", flush=True)
    given = {k: v for k, v in (("draws", draws), ("tune", tune)) if v is not None}
    cached = _jax_cache_entries()
    post = bp.fit(table, spec, **given, random_seed=seed, progress=False,
                  population_prior=prior)
    t2 = time.perf_counter()
    conv = convergence_summary(post)
    # a refit of the same model and data finds XLA's compile in JAX's cache (inference.py)
    compile_ = ("compiled, now cached" if _jax_cache_entries() - cached
                else "no new JAX cache entry: compiled from the cache" if cached
                else "no JAX cache")
    print(f"fit {t2 - t1:.1f} s (spec {spec or 'default'}, sampler {post.attrs.get('sampler')}, "
          f"{post.attrs.get('seconds', float('nan')):.1f} s in fit(), {compile_}), draws "
          f"{post.attrs['draws']}, tune {post.attrs['tune']}")
    print("convergence: " + ", ".join(f"{k} {v}" for k, v in conv.items()
                                      if not isinstance(v, (dict, list))))
    return 0


def main(argv: list[str] | None = None) -> int:
    import arviz as az
    import nutpie

    from bayesprism.inference import nutpie_backend
    from bayesprism.model.kernel import build_kernel, prepare_kernel
    from bayesprism.spec import ModelSpec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small table for a smoke run")
    parser.add_argument("--draws", type=int, default=None,
                        help="draws per chain (default 1000; --dev: bayesprism.fit's)")
    # data-centred coordinates start the chains near the posterior: 300 warm-up draws suffice
    parser.add_argument("--tune", type=int, default=None,
                        help="warm-up per chain (default 300; --dev: bayesprism.fit's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dev", action="store_true",
                        help="fit the traced 3D job of ../shared/data/simulated instead")
    parser.add_argument("--with-nccl", action="store_true",
                        help="with --dev: fit its nccl-tests sweep jointly")
    parser.add_argument("--with-fleet", action="store_true",
                        help="with --dev: fit its fleet GEMM benchmark jointly")
    parser.add_argument("--fleet-prior", nargs="?", const="", default=None, metavar="FLEET.nc",
                        help="with --dev: the fleet benchmark's populations as the traces' "
                        "prior (a fitted fleet posterior, or no value: fit the benchmark first)")
    parser.add_argument("--spec", default=None, metavar="NAME|FILE",
                        help="with --dev: the model spec (default: bayesprism.fit's)")
    args = parser.parse_args(argv)
    if args.spec is not None and not args.dev:
        parser.error("--spec is for --dev (the synthetic case fits the default spec)")
    if args.dev:
        return dev_case(args.draws, args.tune, args.seed, args.with_nccl, args.with_fleet,
                        args.spec, args.fleet_prior)
    args.draws = 1000 if args.draws is None else args.draws
    args.tune = 300 if args.tune is None else args.tune
    shape = (8, 8, 10, 10, 20) if args.quick else (64, 8, 20, 20, 50)
    table = synthetic_table(*shape)
    print(f"table: {len(table):,} launches ({shape[0]} nodes × {shape[1]} GPUs × {shape[2]} "
          f"steps × {shape[3]} kernels × {shape[4]} launches)")
    spec = ModelSpec.default()

    t0 = time.perf_counter()
    prepared = prepare_kernel([table], spec)
    t1 = time.perf_counter()
    print(f"aggregate {t1 - t0:.1f} s", flush=True)
    model = build_kernel(prepared, spec)
    t2 = time.perf_counter()
    print(f"build {t2 - t1:.1f} s", flush=True)
    backend = nutpie_backend()
    compiled = nutpie.compile_pymc_model(
        model, backend=backend, gradient_backend="jax" if backend == "jax" else "pytensor")
    t3 = time.perf_counter()
    print(f"compile ({backend}) {t3 - t2:.1f} s", flush=True)
    cpu3 = time.process_time()
    fit = nutpie.sample(compiled, draws=args.draws, tune=args.tune, chains=2, cores=2,
                        seed=args.seed, progress_bar=False)
    t4 = time.perf_counter()
    # CPU seconds of this process while sampling: on a shared machine, half of it is what
    # the 2 chains need on 2 idle cores
    sample_cpu = time.process_time() - cpu3
    print(f"cells: {prepared.summary['cells']:,}  parameters: "
          f"{sum(v.size for v in model.initial_point().values()):,}  "
          f"parameterisation: {prepared.attrs['parameterisation']}")
    print(f"aggregate {t1 - t0:.1f} s | build {t2 - t1:.1f} s | compile {t3 - t2:.1f} s | "
          f"sample {t4 - t3:.1f} s (CPU {sample_cpu:.1f} s) | total {t4 - t0:.1f} s")
    components = [v for v in ("node_scale", "gpu_scale", "step_scale", "gpustep_scale",
                              "resid_scale", "node_nu", "gpu_nu", "kernel_class_sd")
                  if v in fit.posterior]
    summary = az.summary(fit, var_names=components, round_to="none")
    print(f"variance components: max R-hat {summary['r_hat'].max():.4f} "
          f"({summary['r_hat'].idxmax()}), min bulk ESS "
          f"{summary['ess_bulk'].min():.0f}, divergences "
          f"{int(fit.sample_stats['diverging'].sum())}, mean leapfrog steps per chain "
          + ", ".join(f"{x:.1f}" for x in fit.sample_stats["n_steps"].mean("draw").to_numpy()))
    post = fit.posterior
    for level in ("node", "gpu", "step", "gpustep"):
        est = post[f"{level}_scale"].mean(("chain", "draw")).to_numpy()
        print(f"  {level}_scale: truth {TRUTH[level]:.3f}, posterior mean per class "
              + ", ".join(f"{x:.3f}" for x in est))
    est = post["resid_scale"].mean(("chain", "draw")).to_numpy()
    print(f"  resid_scale: truth {TRUTH['resid']:.3f}, posterior mean per class "
          + ", ".join(f"{x:.3f}" for x in est))
    slow = float((post["node_effect"].isel(node=0) > 3.0).mean())
    print(f"  degraded node0: P(node_effect > 3) = {slow:.3f}")

    # Cost per launch: cell likelihood on all launches vs row likelihood on a subsample.
    cell_eval = logp_grad_seconds(model)
    sub = table[table["step"] < 2]
    sub_prep = prepare_kernel([sub], spec, keep_rows=True)
    row_eval = logp_grad_seconds(build_kernel(sub_prep, spec, rows=True), repeats=5)
    per_cell_launch = cell_eval / len(table)
    per_row_launch = row_eval / len(sub)
    print(f"logp+grad: cells {cell_eval * 1e3:.2f} ms for {len(table):,} launches "
          f"({per_cell_launch * 1e9:.2f} ns/launch); rows {row_eval * 1e3:.1f} ms for "
          f"{len(sub):,} launches ({per_row_launch * 1e9:.1f} ns/launch); "
          f"ratio {per_row_launch / per_cell_launch:.0f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
