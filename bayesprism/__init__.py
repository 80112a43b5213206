"""bayesprism: Bayesian forecasts of step time and training time of distributed training runs.

The public API is imported lazily, so ``import bayesprism`` stays fast and PyMC is only loaded
when a model is built or fitted.
"""

from __future__ import annotations

import importlib
import sys
import types

from bayesprism._version import __version__

_API = {
    # ingestion and the trace table
    "read_traces": "bayesprism.ingest",
    "validate_table": "bayesprism.schema",
    "read_table": "bayesprism.schema",
    "write_table": "bayesprism.schema",
    "summarize_table": "bayesprism.ingest.summary",
    # statistics artifacts: a fit's input without the traces
    "statistics_of": "bayesprism.statistics",
    "ingest_statistics": "bayesprism.statistics",
    "read_statistics": "bayesprism.statistics",
    "write_statistics": "bayesprism.statistics",
    # models and fitting
    "ModelSpec": "bayesprism.spec",
    "fit": "bayesprism.inference",
    "save": "bayesprism.io",
    "load": "bayesprism.io",
    "simulate": "bayesprism.simulate",
    "learn_layout_prior": "bayesprism.learn_prior",
    # plans, composition and forecasts
    "ParallelPlan": "bayesprism.plan",
    "Cluster": "bayesprism.plan",
    "forecast": "bayesprism.forecast.forecasting",
    "summarize_forecast": "bayesprism.forecast.forecasting",
    "sensitivity": "bayesprism.analysis.sensitivity",
    # diagnostics, reports, validation, decisions
    "diagnose": "bayesprism.checks.diagnostics",
    "write_report": "bayesprism.report.html",
    "validate": "bayesprism.checks.validate",
    "what_if": "bayesprism.analysis.what_if",
    "Changes": "bayesprism.analysis.what_if",
    "place": "bayesprism.analysis.placement",
}

__all__ = ["__version__", *_API]


class _Package(types.ModuleType):
    """The package module, which keeps the API's functions over same-named submodules.

    The import system binds every submodule as an attribute of its package, and four functions
    of the API share their module's name (``forecast``, ``sensitivity``, ``simulate``,
    ``validate``); for those the function is kept. Binding them eagerly instead imported xarray
    and SciPy (~1.5 s) with any submodule, the ingest workers' included.
    """

    def __setattr__(self, name: str, value) -> None:
        if name in _API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bayesprism' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
