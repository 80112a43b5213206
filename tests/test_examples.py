"""The examples run end to end (tiny draws: they check the API wiring, not the numbers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    "script",
    ["quickstart.py", "compare_plans.py",
     # the step-level fit of the GPT-3 ladder takes minutes even with tiny draws
     pytest.param("mlperf_logs.py", marks=pytest.mark.slow)],
)
def test_example_runs(script):
    env = {**os.environ, "BAYESPRISM_EXAMPLE_DRAWS": "60"}
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stdout.strip(), "the example printed nothing"


@pytest.mark.parametrize("path", sorted((EXAMPLES / "plans").glob("*.toml")), ids=lambda p: p.name)
def test_example_plan_files_read(path):
    from bayesprism.plan import ParallelPlan

    plans = ParallelPlan.from_toml(path)
    assert plans and all(plan.gpus >= 1 for plan in plans)
