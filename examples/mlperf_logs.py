"""Read MLPerf Training logs, fit the step-level model across scales, forecast larger scales.

Uses the shipped GPT-3 175B ladder (NVIDIA Eos, MLPerf v3.1): fits the two smallest scales
(512 and 768 GPUs) and forecasts the logged larger ones, printing forecast vs measured median.
Run: ``.venv/bin/python examples/mlperf_logs.py``.
"""

import os
from pathlib import Path

import numpy as np

import bayesprism as bp
from bayesprism.forecast import summarize_forecast

LADDER = Path(__file__).resolve().parents[1] / "data" / "mlperf"
DRAWS = int(os.environ.get("BAYESPRISM_EXAMPLE_DRAWS", "500"))

table = bp.read_traces([LADDER], progress=False)
runs = table.attrs["runs"]
gpus = {run: meta["world_size"] for run, meta in runs.items()}
small = [run for run, n in gpus.items() if n <= 768]
fit_table = table[table["run"].astype(str).isin(small)].copy()
fit_table.attrs = {**table.attrs, "runs": {r: runs[r] for r in small}}
print(f"{len(table):,} timed steps in {len(runs)} runs; fitting {len(small)} runs at <= 768 GPUs")

posterior = bp.fit(fit_table, "step", draws=DRAWS, tune=DRAWS, random_seed=3, progress=False)

layouts = {}
for run, meta in runs.items():
    plan = meta["plan"]
    layouts.setdefault(meta["world_size"], (plan, run))
plans = [
    bp.ParallelPlan(name=f"{n} GPUs", dp=p["dp"], tp=p["tp"], pp=p["pp"], cp=p.get("cp", 1),
                    microbatches=p["microbatches"], gpus_per_node=runs[run]["gpus_per_node"],
                    virtual_stages=p.get("virtual_stages") or 1,
                    schedule="interleaved-1f1b" if (p.get("virtual_stages") or 1) > 1 else "1f1b",
                    micro_batch_size=p.get("micro_batch_size"))
    for n, (p, run) in sorted(layouts.items())
]
summary = summarize_forecast(bp.forecast(posterior, plans, draws=min(DRAWS, 400), random_seed=3,
                                         progress=False))
for plan, p in zip(plans, summary["plans"], strict=True):
    measured = table.loc[table["run"].astype(str).map(gpus) == plan.gpus, "duration_us"] / 1e6
    print(f"{plan.name:>12}: forecast p50 {p['step_time_s']['p50']:.3f} s "
          f"[p05 {p['step_time_s']['p05']:.3f}, p95 {p['step_time_s']['p95']:.3f}], "
          f"measured median {np.median(measured):.3f} s")
