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

from bayesprism.errors import InputError, Problem, SpecError
from bayesprism.model import step
from bayesprism.model.kernel import build_kernel, prepare_kernel, prepare_kernel_statistics
from bayesprism.model.prepared import PreparedData
from bayesprism.model.statistics import ModelStatistics
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


def prepare_statistics(stats: ModelStatistics, spec: ModelSpec,
                       source: str = "statistics") -> PreparedData:
    """Prepare the kernel-level model from the statistics of trace tables.

    Parameters
    ----------
    stats
        :func:`bayesprism.model.statistics.table_statistics` of the tables (or read back
        from a statistics artifact).
    spec
        A kernel-level model specification.
    source
        Named in errors (the artifact's path).

    Raises
    ------
    InputError
        A step-level spec, or statistics the spec cannot be fitted to.

    Examples
    --------
    >>> import pandas as pd
    >>> from bayesprism.model.statistics import table_statistics
    >>> table = pd.DataFrame({"run": ["r"] * 2, "step": [0, 1], "node": ["n0"] * 2,
    ...                       "gpu": [0, 0], "kernel": ["k"] * 2,
    ...                       "kernel_class": ["gemm"] * 2, "duration_us": [1.0, 2.0]})
    >>> spec = ModelSpec(levels=("step",))
    >>> prepare_statistics(table_statistics(table), spec).summary["cells"]
    2
    """
    _check_kind(spec)
    if spec.kind != "kernel":
        raise InputError(Problem(source, "spec", "statistics feed the kernel-level model; the "
                                 "step model is fitted to step-time logs themselves",
                                 example=spec.kind))
    try:
        return prepare_kernel_statistics(stats, spec)
    except InputError as exc:
        raise InputError([Problem(source, p.field, p.message, p.count, p.example)
                          if isinstance(p, Problem) and p.source in ("tables", "statistics")
                          else p for p in exc.problems]) from None


def build(prepared: PreparedData, spec: ModelSpec) -> pm.Model:
    """Build the PyMC model of ``spec.kind`` from prepared data."""
    _check_kind(spec)
    if spec.kind == "kernel":
        return build_kernel(prepared, spec)
    return step.build_step(prepared, spec)


__all__ = ["PreparedData", "build", "prepare", "prepare_statistics"]
