"""Ingest benchmark: bayesprism vs HolisticTraceAnalysis (HTA) on many synthetic Kineto rank files.

Generates ``--files`` rank files of a synthetic data-parallel job in the PyTorch profiler's
Chrome-trace layout (``cpu_op`` → ``cuda_runtime`` launch → ``kernel`` with ``ac2g`` flow
events, ``ProfilerStep#N`` annotations, NCCL kernels with the profiler's collective ``args``,
memcpy/memset activities; ranks wait for each other inside collectives), then ingests the
directory

* with bayesprism: ``bayesprism ingest DIR -o table.parquet`` (streaming to Parquet), and
* with HTA: ``TraceAnalysis(trace_dir=DIR)`` (parses every rank into DataFrames), run from the
  separate virtual environment ``.venv-bench`` (HTA is a benchmark-only dependency)::

      PYENV_VERSION=3.12.1 python3.12 -m venv .venv-bench
      .venv-bench/bin/pip install holistictraceanalysis

Each tool runs in its own subprocess; wall time, CPU time (user + system, the tool and its
children: HTA parses with a process pool) and the peak resident set size (RSS high-water mark of
the largest process of the tool, from ``getrusage(RUSAGE_CHILDREN)`` in a fresh measuring
process) are printed with throughput (MB of JSON per second) and the ratios. On a shared
machine, wall time depends on the load; CPU time much less.
Goal: bayesprism ≥ 3× HTA's throughput at ≤ 1/3 of its peak memory.

    python benchmarks/ingest.py            # 64 files, ~1.4 GB of JSON (several minutes)
    python benchmarks/ingest.py --quick    # 4 small files, well under a minute

``--quick`` only shows that everything runs: on 10 MB, start-up (imports) dominates both tools,
so its ratios say nothing about the goal; the full size does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BENCH_PYTHON = REPO / ".venv-bench" / "bin" / "python"

# (name, class-ish weight, median duration µs) of compute kernels, names as the profiler writes.
COMPUTE_KERNELS = (
    ("void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_tn_align8>"
     "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_tn_align8::Params)", 6, 180.0),
    ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_stage3_warpsize2x4x1_tensor16x8x16"
     "_kernel", 5, 240.0),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, "
     "false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, "
     "cutlass::bfloat16_t> >, true, false, false, false, true, true, false, false>"
     "(pytorch_flash::Flash_fwd_params)", 2, 310.0),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
     "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, "
     "float*, c10::BFloat16*)", 3, 25.0),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>"
     ", "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
     "at::detail::Array<char*, 3>)", 8, 12.0),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
     "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
     "{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >"
     "(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::"
     "{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::"
     "{lambda(c10::BFloat16)#1},"
     " at::detail::Array<char*, 2>)", 4, 30.0),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t"
     "<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::"
     "{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, "
     "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()("
     "at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)", 1, 15.0),
)
OPTIMIZER_KERNEL = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
    "<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, "
    "double, bool const*, float const*>(at::native::(anonymous namespace)::TensorListMetadata<4>, "
    "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, "
    "false>, float*, double, double, double, double, double, double, bool const*, float const*)")
NCCL_ALLREDUCE = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, "
                  "ncclWork*)")
NCCL_ALLGATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
CPU_OPS = ("aten::mm", "aten::addmm", "aten::add", "aten::gelu", "aten::native_layer_norm",
           "aten::_flash_attention_forward", "aten::sum", "aten::copy_")
KERNEL_ARGS = ('"queued": 0, "device": {dev}, "context": 1,      "stream": {stream}, '
               '"correlation": {corr},      "registers per thread": 128,      "shared memory": '
               '49152,      "blocks per SM": 1.6,      "warps per SM": 12.8,      "grid": [216, 1,'
               ' 1],      "block": [256, 1, 1],      "est. achieved occupancy %": 25')


def _schedule(rng: np.random.Generator, n_ranks: int, n_kernels: int):
    """Per-step kernel sequence shared by all ranks (index into a name table, collective flag)."""
    weights = np.array([w for _, w, _ in COMPUTE_KERNELS], dtype=float)
    seq = rng.choice(len(COMPUTE_KERNELS), size=n_kernels, p=weights / weights.sum())
    kind = np.zeros(n_kernels, dtype=np.int64)  # 0 compute, 1 allreduce, 2 allgather, 3 optimizer
    every = 40
    kind[every - 1::every] = 1
    kind[every // 2::every * 3] = 2
    kind[-8:] = 3
    return seq, kind


def generate(out_dir: Path, n_files: int, mb_per_file: float, seed: int = 0) -> int:
    """Write ``n_files`` rank traces to ``out_dir``; returns the total number of bytes written."""
    rng = np.random.default_rng(seed)
    gpus_per_node = 8
    n_steps = 4
    # ~1.1 kB of JSON per kernel (cpu_op + launch + kernel + two flow events).
    kernels_per_step = max(40, int(mb_per_file * 1e6 / 1150 / n_steps))
    seq, kind = _schedule(rng, n_files, kernels_per_step)
    base_us = 1_700_000_000_000_000.0
    rank_speed = np.exp(rng.normal(0.0, 0.05, n_files))
    # Simulate every rank's GPU timeline together so collectives end when the last rank arrives.
    starts = np.zeros((n_steps, kernels_per_step, n_files))
    durs = np.zeros_like(starts)
    t = np.full(n_files, base_us)
    step_bounds = []
    for s in range(n_steps):
        step_start = t.copy()
        med = np.array([COMPUTE_KERNELS[i][2] for i in seq])
        noise = np.exp(rng.normal(0.0, 0.08, (kernels_per_step, n_files)))
        comp = med[:, None] * rank_speed[None, :] * noise
        for k in range(kernels_per_step):
            if kind[k] in (1, 2):
                arrive = t + rng.uniform(1.0, 5.0, n_files)
                transfer = (400.0 if kind[k] == 1 else 250.0) * np.exp(rng.normal(0, 0.1))
                end = arrive.max() + transfer
                starts[s, k] = arrive
                durs[s, k] = end - arrive
                t = end
            else:
                starts[s, k] = t + rng.uniform(0.5, 3.0, n_files)
                durs[s, k] = comp[k] if kind[k] == 0 else 90.0 * noise[k]
                t = starts[s, k] + durs[s, k]
        step_bounds.append((step_start, t.copy()))
        t = t + 500.0

    total = 0
    for r in range(n_files):
        host = f"node{r // gpus_per_node:03d}"
        pid = 4000 + 17 * r
        path = out_dir / f"{host}_{pid}.{1700000000000 + r}.pt.trace.json"
        total += _write_rank(path, r, n_files, gpus_per_node, pid, seq, kind, starts[:, :, r],
                             durs[:, :, r], [(a[r], b[r]) for a, b in step_bounds])
    return total


def _write_rank(path: Path, rank: int, world: int, gpn: int, pid: int, seq, kind, starts, durs,
                bounds) -> int:
    dev = rank % gpn
    pid + 3
    parts = [
        '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n',
        ",\n".join(
            f'    {{\n      "id": {i}, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": '
            f'85029158912,\n      "computeMajor": 9, "computeMinor": 0,\n      "numSms": 132'
            '\n    }'
            for i in range(gpn)),
        '\n  ],\n  "distributedInfo": {"backend": "nccl", "rank": ' + str(rank)
        + ', "world_size": ' + str(world) + ', "pg_count": 1, "pg_config": [{"pg_name": "0", '
        '"pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": ' + str(world)
        + '}], "nccl_version": "2.21.5"},\n  "traceEvents": [\n',
    ]
    events = []
    # Correlation and external ids of a job that has run for a while (as in the real traces).
    corr = 1_800_000 + 37 * rank
    ext = 900_000 + 11 * rank
    for s, (t0, t1) in enumerate(bounds):
        cpu_t = t0 - 2000.0
        events.append(
            f'  {{\n    "ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{100 + s}", '
            f'"pid": {pid}, "tid": {pid},\n    "ts": {cpu_t:.3f}, "dur": {t1 - cpu_t:.3f},\n'
            f'    "args": {{\n      "External id": {ext},\n      "Record function id": 0, '
            f'"Ev Idx": {ext}\n    }}\n  }}')
        ext += 1
        for k in range(len(seq)):
            corr += 1
            ext += 1
            launch = cpu_t + 6.0 * k + 1.0
            if kind[k] == 1:
                name, stream = NCCL_ALLREDUCE, 21
                extra = (',      "Collective name": "allreduce",      "In msg nelems": 26214400, '
                         '"Out msg nelems": 26214400, "Group size": ' + str(world)
                         + ',      "dtype": "BFloat16",      "In split size": "[]",      '
                         '"Out split size": "[]",      "Process Group Name": "0",      '
                         '"Process Group Description": "default_pg",      '
                         '"Process Group Ranks": "[0, ..., ' + str(world - 1) + ']"')
                op = "nccl:all_reduce"
            elif kind[k] == 2:
                name, stream = NCCL_ALLGATHER, 21
                extra = (',      "Collective name": "_allgather_base",      "In msg nelems": '
                         '1048576, "Out msg nelems": ' + str(1048576 * world) + ', "Group size": '
                         + str(world) + ',      "dtype": "BFloat16",      "Process Group Name": '
                         '"0",      "Process Group Description": "default_pg"')
                op = "nccl:_all_gather_base"
            elif kind[k] == 3:
                name, stream, extra, op = OPTIMIZER_KERNEL, 7, "", "aten::_fused_adam_"
            else:
                name, stream, extra = COMPUTE_KERNELS[seq[k]][0], 7, ""
                op = CPU_OPS[seq[k] % len(CPU_OPS)]
            ts, dur = starts[s, k], durs[s, k]
            events.append(
                f'  {{\n    "ph": "X", "cat": "cpu_op", "name": "{op}", "pid": {pid}, '
                f'"tid": {pid},\n    "ts": {launch - 3.0:.3f}, "dur": 12.5,\n    "args": {{\n'
                f'      "External id": {ext},\n      "Record function id": 0, "Sequence number": '
                f'{ext}, "Fwd thread id": 0, "Ev Idx": {ext}\n    }}\n  }}')
            events.append(
                f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", '
                f'"pid": {pid}, "tid": {pid},\n    "ts": {launch:.3f}, "dur": 4.2,\n    "args": '
                f'{{\n      "External id": {ext},      "cbid": 211, "correlation": {corr}\n    }}'
                f'\n  }}')
            events.append(
                f'  {{\n    "ph": "s", "id": {corr}, "pid": {pid}, "tid": {pid}, "ts": '
                f'{launch:.3f},\n    "cat": "ac2g", "name": "ac2g"\n  }}')
            events.append(
                f'  {{\n    "ph": "X", "cat": "kernel", "name": "{name}", "pid": {dev}, '
                f'"tid": {stream},\n    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n'
                f'      "External id": {ext},      '
                + KERNEL_ARGS.format(dev=dev, stream=stream, corr=corr) + extra
                + '\n    }\n  }')
            events.append(
                f'  {{\n    "ph": "f", "id": {corr}, "pid": {dev}, "tid": {stream}, "ts": '
                f'{ts:.3f},\n    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }}')
        # A host-to-device copy at the start of each step (data loading).
        corr += 1
        events.append(
            f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": {pid}, '
            f'"tid": {pid},\n    "ts": {cpu_t + 0.5:.3f}, "dur": 6.1,\n    "args": {{\n      '
            f'"External id": {ext},      "cbid": 41, "correlation": {corr}\n    }}\n  }}')
        events.append(
            f'  {{\n    "ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", '
            f'"pid": {dev}, "tid": 22,\n    "ts": {t0 + 0.5:.3f}, "dur": 35.0,\n    "args": {{\n'
            f'      "External id": {ext},      "device": {dev}, "context": 1,      "stream": 22, '
            f'"correlation": {corr},      "bytes": 4194304, "memory bandwidth (GB/s)": 119.8\n'
            '    }\n  }')
    parts.append(",\n".join(events))
    parts.append('\n  ],\n  "traceName": "' + path.name + '",\n  "displayTimeUnit": "ms",\n'
                 '  "baseTimeNanoseconds": 1700000000000000000\n}\n')
    text = "".join(parts).encode()
    path.write_bytes(text)
    return len(text)


def _measure(cmd: list[str]) -> None:
    """Run ``cmd`` as a child; print wall time and the peak RSS of it and its children."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"returncode": proc.returncode, "seconds": wall,
                      "cpu_seconds": usage.ru_utime + usage.ru_stime,
                      "peak_rss_mb": usage.ru_maxrss / 1024, "stderr_tail": proc.stderr[-2000:]}))


def run_measured(cmd: list[str]) -> dict:
    """Measure ``cmd`` from a fresh process, so peaks of earlier runs do not count."""
    out = subprocess.run([sys.executable, __file__, "--measure", "--", *cmd],
                         capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


HTA_SNIPPET = """
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
print(sum(len(df) for df in analysis.t.traces.values()))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 small files (< 1 min)")
    parser.add_argument("--files", type=int, default=64, help="number of rank files")
    parser.add_argument("--mb-per-file", type=float, default=17.0, help="JSON MB per rank file")
    parser.add_argument("--keep", type=Path, default=None, help="write traces here and keep them")
    parser.add_argument("--no-hta", action="store_true", help="measure bayesprism only")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("cmd", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure(args.cmd)
        return 0
    if args.quick:
        args.files, args.mb_per_file = 4, 2.0

    tmp = Path(tempfile.mkdtemp(prefix="bayesprism-bench-"))
    trace_dir = args.keep or (tmp / "traces")
    trace_dir.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        nbytes = generate(trace_dir, args.files, args.mb_per_file)
        mb = nbytes / 1e6
        print(f"generated {args.files} rank files, {mb:,.1f} MB of JSON in "
              f"{time.perf_counter() - t0:.1f} s ({trace_dir})")

        ours = run_measured([sys.executable, "-m", "bayesprism.cli.main", "ingest",
                             str(trace_dir), "-o", str(tmp / "table.parquet"), "--quiet"])
        if ours["returncode"] != 0:
            print("bayesprism ingest failed:\n" + ours["stderr_tail"])
            return 1
        _report("bayesprism", ours, mb)
        import pyarrow.parquet as pq

        print(f"  table: {pq.ParquetFile(tmp / 'table.parquet').metadata.num_rows:,} rows")
        if args.no_hta:
            return 0
        if not BENCH_PYTHON.exists():
            print(f"HTA not measured: {BENCH_PYTHON} missing (see this script's docstring)")
            return 0
        hta = run_measured([str(BENCH_PYTHON), "-c", HTA_SNIPPET, str(trace_dir)])
        if hta["returncode"] != 0:
            print("HTA failed:\n" + hta["stderr_tail"])
            return 1
        _report("HTA TraceAnalysis", hta, mb)
        speed = hta["seconds"] / ours["seconds"]
        cpu_speed = hta["cpu_seconds"] / ours["cpu_seconds"]
        memory = ours["peak_rss_mb"] / hta["peak_rss_mb"]
        print(f"throughput ratio (bayesprism / HTA): {speed:.1f}x wall clock, {cpu_speed:.1f}x per "
              "CPU second   (goal >= 3x)")
        print(f"peak memory ratio (bayesprism / HTA): {memory:.2f}   (goal <= 0.33)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _report(label: str, result: dict, mb: float) -> None:
    print(f"{label:<18} {result['seconds']:8.1f} s wall {mb / result['seconds']:8.1f} MB/s   "
          f"{result['cpu_seconds']:8.1f} s CPU {mb / result['cpu_seconds']:8.1f} MB/s   "
          f"peak RSS {result['peak_rss_mb']:8.0f} MB")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
