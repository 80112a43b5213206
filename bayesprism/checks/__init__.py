"""Checks stage: is the fit trustworthy, and how well does it predict held-out data?

:mod:`~bayesprism.checks.diagnostics` (convergence, variance components, predictive checks),
:mod:`~bayesprism.checks.validate` (held-out validation with
:mod:`~bayesprism.checks.splits`, :mod:`~bayesprism.checks.baselines` and
:mod:`~bayesprism.checks.metrics`).
"""
