"""Compare parallel layouts of one job on the same posterior (common random numbers).

Fits the shipped DLRM traces, then compares plans from ``examples/plans/dlrm-data-parallel.toml``
and a what-if (GEMMs 20% faster) on the largest plan. Run:
``.venv/bin/python examples/compare_plans.py``.
"""

import os
from pathlib import Path

import bayesprism as bp
from bayesprism.forecast.forecasting import summarize_forecast

ROOT = Path(__file__).resolve().parents[1]
DRAWS = int(os.environ.get("BAYESPRISM_EXAMPLE_DRAWS", "1000"))

table = bp.read_traces([ROOT / "data" / "kineto" / "param_dlrm_8rank"], progress=False)
posterior = bp.fit(table, draws=DRAWS, tune=DRAWS, random_seed=2, progress=False)

plans = bp.ParallelPlan.from_toml(ROOT / "examples" / "plans" / "dlrm-data-parallel.toml")
summary = summarize_forecast(bp.forecast(posterior, plans, draws=min(DRAWS, 300), random_seed=2,
                                         progress=False))
print(f"{'plan':>24} {'GPUs':>6} {'p50 ms':>8} {'p95 ms':>8} {'P(>5%)':>7}")
for p in summary["plans"]:
    print(f"{p['name']:>24} {p['gpus']:>6} {p['step_time_s']['p50'] * 1e3:8.3f} "
          f"{p['step_time_s']['p95'] * 1e3:8.3f} {p['slowdown_probability']['1.05']:7.2f}")

largest = max(plans, key=lambda p: p.gpus)
delta = bp.what_if(posterior, largest, {"faster": {"gemm": 0.2}}, draws=min(DRAWS, 200),
                   random_seed=2)
mean = delta["deltas"]["mean_s"]
print(f"GEMMs 20% faster on {largest.name}: mean step changes by {mean['estimate'] * 1e3:+.3f} ms "
      f"(90% interval {mean['ci90'][0] * 1e3:+.3f} to {mean['ci90'][1] * 1e3:+.3f} ms)")
