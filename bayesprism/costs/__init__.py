"""NumPy cost formulas shared by the model and the forecast (``docs/architecture.md``).

Nothing here imports ``bayesprism.model`` or ``bayesprism.forecast``: the PyMC model and the
NumPy forecast both read their formulas from this stage.
"""
