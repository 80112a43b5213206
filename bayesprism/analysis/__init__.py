"""Analysis stage: counterfactual forecasts that answer "what drives the tail" and "what if".

:mod:`~bayesprism.analysis.sensitivity` (remove or halve one source of variability),
:mod:`~bayesprism.analysis.what_if` (faster kernels, links, drained nodes, another schedule)
and :mod:`~bayesprism.analysis.placement` (which measured nodes to use or drain). Built on the
forecast stage only.
"""
