"""Ingest benchmark: bayesprism vs HolisticTraceAnalysis (HTA) on many Kineto rank files.

Two cases (``--cases``):

``synthetic``
    Generates ``--files`` rank files of a synthetic data-parallel job in the PyTorch profiler's
    Chrome-trace layout (``cpu_op`` → ``cuda_runtime`` launch → ``kernel`` with ``ac2g`` flow
    events, ``ProfilerStep#N`` annotations, NCCL kernels with the profiler's collective
    ``args``, memcpy/memset activities; ranks wait for each other inside collectives).
``dev``
    The real-size simulated Megatron 3D-parallel dev traces,
    ``../shared/data/simulated/megatron-3d-dev/traces`` beside the repository (``--dev-traces``):
    64 gzipped rank files, 12 steps, ~835k GPU kernels. Run by default when the folder exists.

and ingests each case's directory

* with bayesprism, ``ingest_to_parquet([DIR], OUT)`` (what ``bayesprism ingest DIR -o OUT``
  runs: streaming to Parquet) and ``read_traces([DIR])`` (one validated in-memory table), and
* with HTA, ``TraceAnalysis(trace_dir=DIR, include_last_profiler_step=True)`` (parses every
  rank into DataFrames with a process pool; the flag keeps the last profiled step, which HTA
  drops by default, so both tools keep every kernel). HTA reads ``*.json`` and ``*.json.gz``
  in place and takes each file's rank from ``distributedInfo``, so no copy is made.

HTA is a benchmark-only dependency, never one of the package: it lives in a separate virtual
environment outside the package's, found from ``--hta-python``, else ``$BAYESPRISM_HTA_PYTHON``,
else ``.venv-bench/bin/python`` in the repository, else ``/tmp/hta-venv/bin/python``; without
one, HTA is skipped with a message::

      PYENV_VERSION=3.12.1 pyenv exec python -m venv /tmp/hta-venv
      /tmp/hta-venv/bin/pip install holistictraceanalysis

Each tool runs in its own subprocess, started from a fresh measuring process; wall time, CPU
time (user + system, the tool and its children: HTA parses with a process pool) and the peak
resident set size (RSS high-water mark of the largest process of the tool, from
``getrusage(RUSAGE_CHILDREN)``) are printed in one table with the GPU kernels of the input
(kernel, memcpy and memset activities, counted from the files), the rows each tool kept, kernels
per wall-clock second and bayesprism's speed-up over HTA (wall clock and CPU time). On a shared
machine wall time depends on the load (printed with every run: 1-minute load average before →
after); CPU time much less. ``--repeat N`` keeps each tool's fastest of N runs.
Goals: synthetic, bayesprism ≥ 3× HTA's throughput at ≤ 1/3 of its peak memory; dev, ≥ 5×.

    python benchmarks/ingest.py                  # synthetic (64 files, ~1.4 GB of JSON) + dev
    python benchmarks/ingest.py --cases dev      # the dev traces only (~3 minutes)
    python benchmarks/ingest.py --quick          # 4 small synthetic files, well under a minute
    python benchmarks/ingest.py --cases dev --tools ingest --profile 25   # + cProfile of ingest

``--quick`` only shows that everything runs: on 10 MB, start-up (imports) dominates both tools,
so its ratios say nothing about the goal; the full sizes do. ``--profile N`` profiles
``ingest_to_parquet`` on the last case with cProfile (in a separate, untimed run) and prints
its top N functions in bayesprism code by cumulative time, then by own time (on Python 3.12,
cProfile attributes some time across generator resumptions and thread starts oddly: a
function's own time is the firmer figure).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEV_TRACES = REPO.parent / "shared" / "data" / "simulated" / "megatron-3d-dev" / "traces"
HTA_PYTHON_ENV = "BAYESPRISM_HTA_PYTHON"
HTA_PYTHON_CANDIDATES = (REPO / ".venv-bench" / "bin" / "python",
                         Path("/tmp/hta-venv/bin/python"))

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


#: GPU activities as the profiler writes them (what bayesprism keeps as rows).
GPU_EVENT = re.compile(rb'"cat":\s*"(?:kernel|gpu_memcpy|gpu_memset)"')
TRACE_SUFFIXES = (".json", ".json.gz")

OURS_INGEST = """
import json, sys
from bayesprism.ingest.parquet import ingest_to_parquet
summary = ingest_to_parquet([sys.argv[1]], sys.argv[2], progress=False)
print(json.dumps({"rows": int(summary["rows"])}))
"""
OURS_READ = """
import json, sys
from bayesprism import read_traces
print(json.dumps({"rows": len(read_traces([sys.argv[1]], progress=False))}))
"""
HTA_SNIPPET = """
import json, logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
ids = analysis.t.symbol_table.get_sym_id_map()
gpu = [ids[c] for c in ("kernel", "gpu_memcpy", "gpu_memset") if c in ids]
frames = list(analysis.t.traces.values())
print(json.dumps({"rows": sum(int(df["cat"].isin(gpu).sum()) for df in frames),
                  "all_rows": sum(len(df) for df in frames)}))
"""
PROFILE_SNIPPET = """
import cProfile, pstats, sys
from bayesprism.ingest.parquet import ingest_to_parquet
profile = cProfile.Profile()
profile.runcall(ingest_to_parquet, [sys.argv[1]], sys.argv[2], progress=False)
stats = pstats.Stats(profile)
ours = r"[/\\\\]bayesprism[/\\\\]"
stats.sort_stats("cumulative").print_stats(ours, int(sys.argv[3]))
stats.sort_stats("tottime").print_stats(ours, int(sys.argv[3]))
"""
TOOLS = {  # --tools name: (label, bayesprism?)
    "ingest": ("bayesprism ingest_to_parquet", True),
    "read": ("bayesprism read_traces", True),
    "hta": ("HTA TraceAnalysis", False),
}
#: Goals per case: bayesprism's minimum speed-up over HTA, its maximum peak-memory ratio.
GOALS = {"synthetic": (3.0, 0.33), "dev": (5.0, None)}


def _measure(cmd: list[str]) -> None:
    """Run ``cmd`` as a child; print wall time, CPU time and the peak RSS of it and its
    children, with the last line it printed (a JSON object) as ``output``."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = proc.stdout.strip().splitlines()
    try:
        output = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        output = None
    print(json.dumps({"returncode": proc.returncode, "seconds": wall,
                      "cpu_seconds": usage.ru_utime + usage.ru_stime,
                      "peak_rss_mb": usage.ru_maxrss / 1024, "output": output,
                      "stderr_tail": proc.stderr[-2000:]}))


def run_measured(cmd: list[str]) -> dict:
    """Measure ``cmd`` from a fresh process, so peaks of earlier runs do not count; with the
    1-minute load average before and after."""
    load0 = os.getloadavg()[0]
    out = subprocess.run([sys.executable, __file__, "--measure", "--", *cmd],
                         capture_output=True, text=True, check=True, cwd=REPO)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["load"] = (load0, os.getloadavg()[0])
    return result


def find_hta_python(option: Path | None) -> Path | None:
    """The HTA environment's Python: the option, the environment variable, the candidates."""
    if option is not None:
        return option if option.exists() else None
    if os.environ.get(HTA_PYTHON_ENV):
        path = Path(os.environ[HTA_PYTHON_ENV])
        return path if path.exists() else None
    return next((p for p in HTA_PYTHON_CANDIDATES if p.exists()), None)


def trace_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.name.endswith(TRACE_SUFFIXES))


def count_gpu_events(files: list[Path]) -> int:
    """GPU kernel, memcpy and memset activities in the trace files (untimed)."""
    total = 0
    for path in files:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        total += len(GPU_EVENT.findall(data))
    return total


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def run_case(name: str, trace_dir: Path, tools: list[str], hta_python: Path | None,
             repeat: int, work: Path) -> tuple[list[dict], bool]:
    """Measure each tool on ``trace_dir`` ``repeat`` times (interleaved); keep each tool's
    fastest run. Returns the table rows and whether every run succeeded."""
    files = trace_files(trace_dir)
    t0 = time.perf_counter()
    kernels = count_gpu_events(files)
    print(f"[{name}] {len(files)} files, {kernels:,} GPU kernels in {trace_dir} (counted in "
          f"{time.perf_counter() - t0:.1f} s)", flush=True)
    commands = {
        "ingest": [sys.executable, "-c", OURS_INGEST, str(trace_dir),
                   str(work / f"{name}.parquet")],
        "read": [sys.executable, "-c", OURS_READ, str(trace_dir)],
    }
    if "hta" in tools:
        if hta_python is None:
            where = ", ".join(map(str, HTA_PYTHON_CANDIDATES))
            print(f"[{name}] HTA not measured: no HTA environment (give --hta-python or "
                  f"${HTA_PYTHON_ENV}, or create one of {where}; see this script's docstring)",
                  flush=True)
        else:
            commands["hta"] = [str(hta_python), "-c", HTA_SNIPPET, str(trace_dir)]
    best: dict[str, dict] = {}
    ok = True
    for i in range(repeat):
        for tool in [t for t in tools if t in commands]:
            result = run_measured(commands[tool])
            label = TOOLS[tool][0]
            if result["returncode"] != 0 or result["output"] is None:
                print(f"[{name}] {label} failed (exit {result['returncode']}):\n"
                      + result["stderr_tail"], flush=True)
                commands.pop(tool)
                ok = False
                continue
            print(f"[{name}] run {i + 1}/{repeat} {label:<29} {result['seconds']:7.1f} s wall "
                  f"{result['cpu_seconds']:7.1f} s CPU {result['peak_rss_mb']:7.0f} MB peak RSS  "
                  f"load {result['load'][0]:.2f} -> {result['load'][1]:.2f}", flush=True)
            if tool not in best or result["seconds"] < best[tool]["seconds"]:
                best[tool] = result
        (work / f"{name}.parquet").unlink(missing_ok=True)
    rows = [{"case": name, "tool": TOOLS[tool][0], "ours": TOOLS[tool][1], "files": len(files),
             "kernels": kernels, "rows": best[tool]["output"]["rows"],
             "wall_s": best[tool]["seconds"], "cpu_s": best[tool]["cpu_seconds"],
             "peak_rss_mb": best[tool]["peak_rss_mb"], "load": best[tool]["load"]}
            for tool in tools if tool in best]
    return rows, ok


def print_table(rows: list[dict]) -> None:
    header = (f"{'case':<10} {'tool':<29} {'files':>5} {'kernels':>9} {'rows':>9} {'wall s':>7} "
              f"{'CPU s':>7} {'peak RSS MB':>11} {'kernels/s':>10} {'speed-up vs HTA':>22} "
              f"{'load':>12}")
    print(header)
    print("-" * len(header))
    for row in rows:
        hta = next((r for r in rows if r["case"] == row["case"] and not r["ours"]), None)
        if hta is None:
            speedup = "(no HTA run)"
        elif row["ours"]:
            speedup = (f"{hta['wall_s'] / row['wall_s']:.1f}x wall, "
                       f"{hta['cpu_s'] / row['cpu_s']:.1f}x CPU")
        else:
            speedup = "1.0x"
        print(f"{row['case']:<10} {row['tool']:<29} {row['files']:>5} {row['kernels']:>9,} "
              f"{row['rows']:>9,} {row['wall_s']:>7.1f} {row['cpu_s']:>7.1f} "
              f"{row['peak_rss_mb']:>11.0f} {row['kernels'] / row['wall_s']:>10,.0f} "
              f"{speedup:>22} {row['load'][0]:>5.2f}->{row['load'][1]:<5.2f}")


def print_goals(rows: list[dict]) -> None:
    for case, (min_speedup, max_memory) in GOALS.items():
        hta = next((r for r in rows if r["case"] == case and not r["ours"]), None)
        ours = next((r for r in rows if r["case"] == case and r["tool"] == TOOLS["ingest"][0]),
                    None)
        if hta is None or ours is None:
            continue
        speed = hta["wall_s"] / ours["wall_s"]
        cpu_speed = hta["cpu_s"] / ours["cpu_s"]
        memory = ours["peak_rss_mb"] / hta["peak_rss_mb"]
        met = speed >= min_speedup and (max_memory is None or memory <= max_memory)
        print(f"{case}: ingest_to_parquet vs HTA {speed:.1f}x wall clock, {cpu_speed:.1f}x per CPU "
              f"second (goal >= {min_speedup:g}x); peak memory ratio {memory:.2f}"
              + (f" (goal <= {max_memory:g})" if max_memory is not None else "")
              + f": {'met' if met else 'NOT met'}")


def profile_ingest(trace_dir: Path, top: int, work: Path) -> None:
    """cProfile of ``ingest_to_parquet`` on ``trace_dir`` (untimed): top functions in bayesprism
    code by cumulative time."""
    print(f"\ncProfile of ingest_to_parquet on {trace_dir} ({uptime()}):", flush=True)
    proc = subprocess.run([sys.executable, "-c", PROFILE_SNIPPET, str(trace_dir),
                           str(work / "profile.parquet"), str(top)],
                          capture_output=True, text=True, check=False, cwd=REPO)
    print(proc.stdout.rstrip() if proc.returncode == 0 else "profile failed:\n" + proc.stderr)
    (work / "profile.parquet").unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None,
                        help="comma-separated cases: synthetic, dev (default: both when the dev "
                             "traces exist, else synthetic; with --quick: synthetic)")
    parser.add_argument("--tools", default="ingest,read,hta",
                        help="comma-separated tools: ingest (ingest_to_parquet), read "
                             "(read_traces), hta (default: all)")
    parser.add_argument("--quick", action="store_true", help="4 small synthetic files (< 1 min)")
    parser.add_argument("--files", type=int, default=64, help="synthetic: number of rank files")
    parser.add_argument("--mb-per-file", type=float, default=17.0,
                        help="synthetic: JSON MB per rank file")
    parser.add_argument("--keep", type=Path, default=None,
                        help="synthetic: write traces here and keep them")
    parser.add_argument("--dev-traces", type=Path, default=DEV_TRACES,
                        help=f"dev: trace directory (default {DEV_TRACES})")
    parser.add_argument("--hta-python", type=Path, default=None,
                        help=f"Python of the HTA environment (default ${HTA_PYTHON_ENV}, else "
                             f"the first existing of {', '.join(map(str, HTA_PYTHON_CANDIDATES))})")
    parser.add_argument("--no-hta", action="store_true", help="measure bayesprism only")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each tool, the fastest kept (default 1)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also cProfile ingest_to_parquet on the last case; print top N")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("cmd", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure(args.cmd)
        return 0
    if args.quick:
        args.files, args.mb_per_file = 4, 2.0
    if args.cases is None:
        cases = ["synthetic"] + (["dev"] if args.dev_traces.is_dir() and not args.quick else [])
    else:
        cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if args.no_hta and "hta" in tools:
        tools.remove("hta")
    for bad, known in ((set(cases) - set(GOALS), "cases"), (set(tools) - set(TOOLS), "tools")):
        if bad:
            parser.error(f"unknown {known}: {', '.join(sorted(bad))}")
    if "dev" in cases and not args.dev_traces.is_dir():
        print(f"dev traces not found: {args.dev_traces} (give --dev-traces)")
        return 1
    hta_python = find_hta_python(args.hta_python) if "hta" in tools else None
    if "hta" in tools and args.hta_python is not None and hta_python is None:
        print(f"--hta-python {args.hta_python} does not exist")

    print(f"{os.cpu_count()} cores; {uptime()}")
    print(f"bayesprism: {sys.executable}; HTA: {hta_python or 'not measured'}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bayesprism-bench-"))
    rows: list[dict] = []
    ok = True
    last_dir = None
    try:
        for case in cases:
            if case == "synthetic":
                trace_dir = args.keep or (tmp / "traces")
                trace_dir.mkdir(parents=True, exist_ok=True)
                t0 = time.perf_counter()
                nbytes = generate(trace_dir, args.files, args.mb_per_file)
                print(f"[synthetic] generated {args.files} rank files, {nbytes / 1e6:,.1f} MB of "
                      f"JSON in {time.perf_counter() - t0:.1f} s", flush=True)
            else:
                trace_dir = args.dev_traces
            case_rows, case_ok = run_case(case, trace_dir, tools, hta_python, args.repeat, tmp)
            rows += case_rows
            ok = ok and case_ok
            last_dir = trace_dir
        print(f"\n{uptime()}")
        print_table(rows)
        print_goals(rows)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        if args.profile and last_dir is not None:
            profile_ingest(last_dir, args.profile, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
