"""bayesprism: Bayesian forecasts of step time and training time of distributed training runs.

The public API is imported lazily, so ``import bayesprism`` stays fast and PyMC is only loaded
when a model is built or fitted.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    # ingestion and the trace table
    "read_traces": "bayesprism.ingest",
    "validate_table": "bayesprism.schema",
    "read_table": "bayesprism.schema",
    "write_table": "bayesprism.schema",
    "summarize_table": "bayesprism.ingest.summary",
    # models and fitting
    "ModelSpec": "bayesprism.spec",
    "fit": "bayesprism.inference",
    "save": "bayesprism.io",
    "load": "bayesprism.io",
    "simulate": "bayesprism.simulate",
    # plans, composition and forecasts
    "ParallelPlan": "bayesprism.plan",
    "Cluster": "bayesprism.plan",
    "forecast": "bayesprism.forecast",
    # diagnostics, reports, validation, decisions
    "diagnose": "bayesprism.diagnostics",
    "write_report": "bayesprism.report",
    "validate": "bayesprism.validate",
    "sensitivity": "bayesprism.analysis",
    "what_if": "bayesprism.analysis",
    "place": "bayesprism.analysis",
}

__all__ = ["__version__", *_API]

# These functions share their module's name: importing the submodule (anywhere) would rebind
# the package attribute to the module, so they are bound eagerly. None of them imports PyMC.
from bayesprism.forecast import forecast  # noqa: E402, F401
from bayesprism.sensitivity import sensitivity  # noqa: E402, F401
from bayesprism.simulate import simulate  # noqa: E402, F401
from bayesprism.validate import validate  # noqa: E402, F401


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bayesprism' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
