"""PyMC models of bayesprism: registry and dispatch on ``ModelSpec.kind``.

``prepare`` turns trace tables into the arrays a model needs (cell statistics, unit indices,
collective cost-model cells) and refuses input that cannot be fitted with a clear
``InputError``; ``build`` turns prepared data into a ``pymc.Model``. The step-level model lives
in ``bayesprism.model.step`` and is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from bayesprism.errors import Problem, SpecError
from bayesprism.spec import ModelSpec

if TYPE_CHECKING:
    import pymc as pm


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


def _check_kind(spec: ModelSpec) -> None:
    if not isinstance(spec, ModelSpec):
        raise SpecError(Problem("model spec", "", "expected a ModelSpec",
                                example=type(spec).__name__))


def prepare(tables: Sequence[pd.DataFrame] | pd.DataFrame, spec: ModelSpec) -> PreparedData:
    """Prepare one or several trace tables for the model named by ``spec.kind``.

    Parameters
    ----------
    tables
        Trace tables (``bayesprism.schema``); several sources inform the same populations.
    spec
        The model specification.

    Raises
    ------
    InputError
        If the tables cannot be fitted by this model (reasons listed one per line).
    """
    _check_kind(spec)
    if isinstance(tables, pd.DataFrame):
        tables = [tables]
    tables = list(tables)
    if spec.kind == "kernel":
        from bayesprism.model.kernel import prepare_kernel

        return prepare_kernel(tables, spec)
    from bayesprism.model import step

    return step.prepare_step(tables, spec)


def build(prepared: PreparedData, spec: ModelSpec) -> pm.Model:
    """Build the PyMC model of ``spec.kind`` from prepared data."""
    _check_kind(spec)
    if spec.kind == "kernel":
        from bayesprism.model.kernel import build_kernel

        return build_kernel(prepared, spec)
    from bayesprism.model import step

    return step.build_step(prepared, spec)


__all__ = ["PreparedData", "build", "prepare"]
