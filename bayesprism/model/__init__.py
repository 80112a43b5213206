"""PyMC models of bayesprism: registry and dispatch on ``ModelSpec.kind``.

``prepare`` turns trace tables into the arrays a model needs (cell statistics, unit indices,
collective cost-model cells) and refuses input that cannot be fitted with a clear
``InputError``; ``build`` turns prepared data into a ``pymc.Model``: the kernel-level model
(:mod:`bayesprism.model.kernel`) or the step-level one (:mod:`bayesprism.model.step`). PyMC
itself is imported only when a graph is built (``import bayesprism.model`` stays light).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from bayesprism.errors import Problem, SpecError
from bayesprism.model import step
from bayesprism.model.kernel import build_kernel, prepare_kernel
from bayesprism.model.prepared import PreparedData
from bayesprism.spec import ModelSpec

if TYPE_CHECKING:
    import pymc as pm


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
        return prepare_kernel(tables, spec)
    return step.prepare_step(tables, spec)


def build(prepared: PreparedData, spec: ModelSpec) -> pm.Model:
    """Build the PyMC model of ``spec.kind`` from prepared data."""
    _check_kind(spec)
    if spec.kind == "kernel":
        return build_kernel(prepared, spec)
    return step.build_step(prepared, spec)


__all__ = ["PreparedData", "build", "prepare"]
