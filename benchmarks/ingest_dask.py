"""Ingest benchmark, embedded engine vs Dask: files per second and peak memory per worker.

For each N of ``--files`` (default 64, 256, 1024) it generates N rank files of a synthetic
data-parallel job (``generate`` of ``benchmarks/ingest.py``: the PyTorch profiler's
Chrome-trace layout, ``--mb-per-file`` of JSON each, default 17 MB, about 15k GPU kernels: the
size of a real rank file of a few profiled steps), then ingests the folder into Parquet

* ``embedded``: ``ingest_to_parquet([DIR], OUT)`` with ``BAYESPRISM_INGEST_WORKERS`` worker
  processes (``--workers``, default the machine's cores; what ``bayesprism ingest`` runs), and
* ``dask``: the same with ``engine="dask"`` on a local cluster of as many single-threaded
  worker processes (``dask_client``: what ``bayesprism ingest --engine dask`` runs without
  ``--scheduler``),

each in a fresh process, and prints wall time, files per second, CPU seconds (the client's and
the workers'), the peak resident memory of the largest worker and of the client (the process
that writes the Parquet file; the Dask scheduler runs in it too), and the 1-minute load average
before → after. A worker's peak should stay near what one file needs whatever N is (memory
bounded by the largest file); the client's grows with the collective rows, as in the embedded
engine. Files are deleted after each N unless ``--keep``. On a shared machine wall time
depends on the load; CPU time much less.

``--statistics`` measures ``ingest_statistics([DIR], OUT)`` instead (``bayesprism ingest
--statistics``, file digests off): the compute rows are reduced to kernel cells where each file
is read, so the client's peak grows with the cells and collective rows only; the ``rows``
column counts launches.

    python benchmarks/ingest_dask.py                         # N = 64, 256, 1024 (~30 GB, long)
    python benchmarks/ingest_dask.py --files 64 --mb-per-file 4   # a quick look
    python benchmarks/ingest_dask.py --files 64,256 --mb-per-file 4 --statistics
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("embedded", "dask")


def _generator():
    """``generate`` of benchmarks/ingest.py (the synthetic rank files), imported by path."""
    spec = importlib.util.spec_from_file_location("ingest_benchmark",
                                                  Path(__file__).with_name("ingest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate


def measure(engine: str, trace_dir: Path, out: Path, workers: int,
            statistics: bool = False) -> dict:
    """Ingest ``trace_dir`` with ``engine`` in this process; wall/CPU time and peak memory."""
    from bayesprism.ingest.parquet import ingest_to_parquet
    from bayesprism.statistics import ingest_statistics

    def ingest(*args, **options) -> dict:
        if statistics:
            summary = ingest_statistics(*args, digests=False, **options)
            return {**summary, "rows": summary["launches"]}
        return ingest_to_parquet(*args, **options)

    def peak_mb(who: int) -> float:
        return resource.getrusage(who).ru_maxrss / 1024

    def cpu_s(who: int) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    if engine == "embedded":
        os.environ["BAYESPRISM_INGEST_WORKERS"] = str(workers)
        t0 = time.perf_counter()
        summary = ingest([trace_dir], out, progress=False)
        wall = time.perf_counter() - t0
        worker_peaks = [peak_mb(resource.RUSAGE_CHILDREN)] if workers > 1 else []
        worker_cpu = cpu_s(resource.RUSAGE_CHILDREN)
        startup = 0.0
    else:
        from bayesprism.ingest.distributed import dask_client

        t0 = time.perf_counter()
        with dask_client(workers=workers) as client:
            client.wait_for_workers(workers)
            startup = time.perf_counter() - t0
            t0 = time.perf_counter()
            summary = ingest([trace_dir], out, progress=False, engine="dask", client=client)
            wall = time.perf_counter() - t0
            worker_peaks = list(client.run(peak_mb, resource.RUSAGE_SELF).values())
            worker_cpu = sum(client.run(cpu_s, resource.RUSAGE_SELF).values())
    return {"engine": engine, "rows": int(summary["rows"]), "wall_s": wall,
            "startup_s": startup, "client_cpu_s": cpu_s(resource.RUSAGE_SELF),
            "worker_cpu_s": worker_cpu, "client_peak_mb": peak_mb(resource.RUSAGE_SELF),
            "worker_peak_mb": max(worker_peaks) if worker_peaks else None}


def run_measured(engine: str, trace_dir: Path, out: Path, workers: int,
                 statistics: bool = False) -> dict:
    """:func:`measure` in a fresh process (peaks of earlier runs do not count), with the load."""
    load0 = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, __file__, "--measure", engine, str(trace_dir),
                           str(out), str(workers), "statistics" if statistics else "table"],
                          capture_output=True, text=True, cwd=REPO, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{engine} on {trace_dir} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["load"] = (load0, os.getloadavg()[0])
    return result


def print_row(n: int, mb: float, largest_mb: float, r: dict) -> None:
    worker = f"{r['worker_peak_mb']:8.0f}" if r["worker_peak_mb"] is not None else "       -"
    print(f"{n:>6} {mb:>8,.0f} {largest_mb:>7.1f} {r['engine']:<9} {r['rows']:>11,} "
          f"{r['wall_s']:>7.1f} {n / r['wall_s']:>7.2f} {r['client_cpu_s']:>7.1f} "
          f"{r['worker_cpu_s']:>7.1f} {worker} {r['client_peak_mb']:>8.0f} "
          f"{r['startup_s']:>5.1f} {r['load'][0]:>5.2f}->{r['load'][1]:<5.2f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default="64,256,1024",
                        help="comma-separated numbers of rank files")
    parser.add_argument("--mb-per-file", type=float, default=17.0, help="JSON MB per rank file")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="worker processes of either engine")
    parser.add_argument("--keep", type=Path, default=None, help="generate the files here, keep")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--statistics", action="store_true",
                        help="measure ingest --statistics (a statistics artifact), not a table")
    parser.add_argument("--measure", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        engine, trace_dir, out, workers, mode = args.measure
        print(json.dumps(measure(engine, Path(trace_dir), Path(out), int(workers),
                                 statistics=mode == "statistics")))
        return 0

    generate = _generator()
    engines = [e for e in args.engines.split(",") if e]
    work = args.keep or Path(tempfile.mkdtemp(prefix="bayesprism-dask-bench-"))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    print(f"{os.cpu_count()} cores, {args.workers} workers per engine; "
          f"{'statistics' if args.statistics else 'table'}; {uptime.stdout.strip()}")
    print(f"{'files':>6} {'JSON MB':>8} {'max MB':>7} {'engine':<9} {'rows':>11} {'wall s':>7} "
          f"{'files/s':>7} {'cli CPU':>7} {'wrk CPU':>7} {'wrk peak':>8} {'cli peak':>8} "
          f"{'start':>5} {'load':>11}")
    rows = []
    try:
        for n in (int(x) for x in args.files.split(",") if x):
            trace_dir = work / f"n{n}"
            if not trace_dir.is_dir():
                trace_dir.mkdir(parents=True)
                generate(trace_dir, n, args.mb_per_file)
            sizes = [p.stat().st_size / 1e6 for p in trace_dir.iterdir()]
            for engine in engines:
                result = run_measured(engine, trace_dir, work / "out.parquet", args.workers,
                                      args.statistics)
                (work / "out.parquet").unlink(missing_ok=True)
                print_row(n, sum(sizes), max(sizes), result)
                rows.append({"files": n, "json_mb": sum(sizes), "largest_file_mb": max(sizes),
                             "statistics": args.statistics, **result})
            if args.keep is None:
                shutil.rmtree(trace_dir)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip())
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
