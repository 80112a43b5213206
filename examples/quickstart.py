"""Quick start: traces in, forecast with credible intervals out.

Reads the shipped 8-rank DLRM Kineto traces, fits the kernel-level model, checks the fit, and
forecasts the same job on 8 to 4,096 GPUs. Run: ``.venv/bin/python examples/quickstart.py``.
Set ``BAYESPRISM_EXAMPLE_DRAWS`` for a quicker (less precise) run.
"""

import os
from pathlib import Path

import bayesprism as bp
from bayesprism.forecast.forecasting import summarize_forecast

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto" / "param_dlrm_8rank"
DRAWS = int(os.environ.get("BAYESPRISM_EXAMPLE_DRAWS", "1000"))

table = bp.read_traces([DATA], progress=False)
print(f"{len(table):,} kernel launches from {table['rank'].nunique()} ranks")

# four chains: R-hat compares chains, and with two its sampling noise alone reaches the 1.01 bar
posterior = bp.fit(table, "default", draws=DRAWS, tune=DRAWS, chains=4, random_seed=1,
                   progress=False)
report = bp.diagnose(posterior)
print("fit can be trusted" if report.ok else "fit problems:\n  " + "\n  ".join(report.problems))

plans = [bp.ParallelPlan(name=f"dp{dp}", dp=dp, gpus_per_node=8) for dp in (8, 512, 4096)]
forecast = bp.forecast(posterior, plans, steps=10_000, draws=min(DRAWS, 400), random_seed=1,
                       progress=False)
for plan in summarize_forecast(forecast)["plans"]:
    step = plan["step_time_s"]
    print(
        f"{plan['name']:>8} {plan['gpus']:>6} GPUs: step {step['p50'] * 1e3:.2f} ms "
        f"(90% of steps {step['p05'] * 1e3:.2f}-{step['p95'] * 1e3:.2f} ms), "
        f"P(>10% slower than ideal) = {plan['slowdown_probability']['1.10']:.2f}"
    )
