"""Read MLPerf Training logs, fit the step-level model at small scales, forecast larger ones.

Uses the shipped GPT-3 175B ladder (NVIDIA Eos, MLPerf v3.1): fits the two smallest scales
(512 and 768 GPUs) and forecasts every logged layout, printing forecast vs measured median.
Run: ``.venv/bin/python examples/mlperf_logs.py``.
"""

import os
from pathlib import Path

import numpy as np

import bayesprism as bp
from bayesprism.forecast.forecasting import summarize_forecast
from bayesprism.plan import plan_from_run
from bayesprism.schema import select_runs

LADDER = Path(__file__).resolve().parents[1] / "data" / "mlperf"
DRAWS = int(os.environ.get("BAYESPRISM_EXAMPLE_DRAWS", "1000"))

table = bp.read_traces([LADDER], progress=False)
runs = table.attrs["runs"]
small = [run for run, meta in runs.items() if meta["world_size"] <= 768]
print(f"{len(table):,} timed steps in {len(runs)} runs; fitting {len(small)} runs at <= 768 GPUs")
posterior = bp.fit(select_runs(table, small), "step", draws=DRAWS, tune=DRAWS, random_seed=3,
                   progress=False)

plans = sorted({plan_from_run(meta) for meta in runs.values()}, key=lambda p: p.gpus)
summary = summarize_forecast(bp.forecast(posterior, plans, draws=min(DRAWS, 400), random_seed=3,
                                         progress=False))
world_size = table["run"].astype(str).map({run: meta["world_size"] for run, meta in runs.items()})
for plan, forecast in zip(plans, summary["plans"], strict=True):
    measured = table.loc[world_size == plan.gpus, "duration_us"].to_numpy() / 1e6
    step = forecast["step_time_s"]
    print(f"{plan.name:>11}: forecast p50 {step['p50']:.3f} s [p05 {step['p05']:.3f}, "
          f"p95 {step['p95']:.3f}]; measured median {np.median(measured):.3f} s")
