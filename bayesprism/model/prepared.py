"""What every model builder gets from :func:`bayesprism.model.prepare`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PreparedData:
    """Everything a model builder needs, computed once from the input tables.

    Attributes
    ----------
    coords
        Named dims for ``pm.Model(coords=...)``.
    data
        Arrays that become ``pm.Data`` / constants / observed values.
    attrs
        JSON-able facts for ``posterior.attrs`` (populations, fitted levels, collective model).
    summary
        Counts for messages (rows, cells, kernels, nodes, gpus, steps, ...).
    """

    coords: dict[str, list]
    data: dict[str, np.ndarray]
    attrs: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
