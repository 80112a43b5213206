"""Forecast stage: posterior draws -> step-time and training-time draws of target plans.

NumPy only: nothing here imports ``bayesprism.model`` or PyMC (a forecast at 10^5 GPUs never
compiles a graph). :func:`forecast` and :func:`summarize_forecast` (the public API, also
``bayesprism.forecast(...)``) live in :mod:`bayesprism.forecast.forecasting`; the composition
of one plan in :mod:`bayesprism.forecast.composition` (kernel-level fits) and
:mod:`bayesprism.forecast.stepscale` (step-level fits).
"""

from bayesprism.forecast.forecasting import forecast, summarize_forecast

__all__ = ["forecast", "summarize_forecast"]
