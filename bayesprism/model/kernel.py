"""Kernel-level hierarchical model (DESIGN §5, docs/artifacts.md "model_kind == kernel").

Log duration (µs) of one launch of kernel k (class c) on GPU g of node n at step s::

    log d = a_k + λn_c·u_n + λg_c·v_g + λs_c·w_s + λgs_c·z_(g,s) + σ_c·ε

Fitting choices (measured, see the benchmark and tests):

* Gaussian residual (``likelihood = "lognormal"``): the likelihood is evaluated exactly from
  cell statistics (kernel × GPU × step: n, mean, SS). It is further collapsed: everything but
  the kernel baselines depends only on (class, GPU-step) blocks, so per cell only one
  gather/scatter of a_k remains, the SS terms sum per class, and the transient GPU×step effects
  z_(g,s) (one per GPU-step, shared by all its kernels) are integrated out in closed form
  (rank-one Gaussian update per GPU-step). Cost grows with cells, parameters do not grow with
  GPU-steps. The result equals the row likelihood exactly (test_kernel_model).
* Student-t or two-component (slow-launch mixture) residual: no sufficient statistics exist,
  so rows are used and z_(g,s) is sampled.
* Unit effects (node, gpu, step, cabinet): the likelihood sees them centred within their group
  (cabinets globally; nodes within cabinet when cabinets are given, unless their population is
  ``degraded``, else globally; GPUs within node; steps within run), so the location direction
  is prior-only and never forms a ridge with the kernel baselines. A level whose units carry
  many launches is sampled *centred* (log-scale offsets of the launch-weighted geometric-mean
  class with population scale ``{level}_scale_ref``, classes by centred loading ratios); a
  sparse level non-centred (standardised effects, per-class loadings).
  ``parameterisation = "auto"`` chooses per level.
* A level of one group (nodes without cabinets, cabinets) is reported uncentred with
  ``kernel_log_median`` shifted to match (a_k = free baseline − λ_c·mean(u)), so the
  population-location uncertainty stays in a_k; nested levels (GPUs, steps, nodes within
  cabinets) are zero-sum within their group (``bayesprism.model.effects.unit_level``).
* Collectives with ``transfer_us``: ring cost model (``bayesprism.costs.collectives``) per
  collective and tier, lognormal noise per collective, per-step congestion per collective and
  tier integrated out like z_(g,s).
  Latency and bandwidth are sampled as each (collective, tier)'s log transfer time at a
  reference point inside its data and the logit of the latency share there, whitened by the
  Gauss-Newton curvature at the mode (``_collective_part``): the same posterior as the plain
  parameters, without their ridge (dev traces, collective part alone, 2 × 1000 draws: R-hat
  1.23, bulk ESS 9, 816 leapfrog steps per draw → R-hat ≈ 1.006, ESS ≈ 550, 8). Benchmark
  runs (nccl-tests) share latency and bandwidth but have noise and congestion scales of their
  own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.linalg import helmert

from bayesprism.costs import collectives as coll
from bayesprism.errors import InputError, Problem
from bayesprism.model.cells import CellStats
from bayesprism.model.effects import (
    class_scales,
    data_scaled_half_normal,
    segment_sum,
    soft_scale_floor,
    unit_level,
)
from bayesprism.model.episodes import episode_chain_loglik, episode_sequences, step_lags
from bayesprism.model.prepared import PreparedData
from bayesprism.model.rows import row_likelihood
from bayesprism.model.start import (
    class_spread_start,
    episode_start,
    gpustep_core_start,
    gpustep_resolution,
    kernel_baseline_se,
    loading_ratio_start,
    robust_unit_effects,
    started_in_core,
    unit_effect_estimates,
    unit_resolution,
    within_cell_sd,
)
from bayesprism.model.statistics import (
    ModelStatistics,
    factorize,
    table_statistics,
)
from bayesprism.spec import EPISODE_POPULATIONS, ModelSpec

UNIT_LEVELS = ("cabinet", "node", "gpu", "step")
#: Cell fill (cells / (GPU-steps × kernels)) above which the collapsed likelihood uses a dense
#: matrix product, and the largest such matrix.
DENSE_FILL = 0.25
DENSE_MAX = 20_000_000
#: Largest (GPUs × steps) / GPU-steps ratio for which blocks are laid out as a full grid.
GRID_PADDING = 2.0
#: Share of (GPU-step, kernel class) pairs with launches below which the collapsed likelihood
#: keeps only those pairs rather than a dense (GPU-step × class) array.
SPARSE_FILL = 0.5
#: Largest table the row-level (Student-t, mixture) likelihoods accept.
MAX_ROWS = 2_000_000
#: Bound of the logit of a collective's latency share where it starts (|s| ≤ 20: shares
#: from 2e-9 to 1 − 2e-9).
LOGIT_LIMIT = 20.0
#: Most Gauss-Newton steps taken to centre the collective cost model's coordinates.
GAUSS_NEWTON_STEPS = 50
#: Units (benchmark sweeps, job runs) with inter-node transfers needed to fit degraded links.
DEGRADED_MIN_UNITS = 3


# ----------------------------------------------------------------------------- preparation
def prepare_kernel(
    tables: Sequence[pd.DataFrame], spec: ModelSpec, keep_rows: bool = False
) -> PreparedData:
    """Prepare trace tables (one or several sources) for the kernel-level model.

    The tables are reduced to their statistics (:func:`bayesprism.model.statistics.
    table_statistics`) and the model is prepared from those alone
    (:func:`prepare_kernel_statistics`): a fit from the tables and one from their saved
    statistics prepare the same arrays. ``keep_rows`` also keeps per-launch arrays, for the
    row-level likelihood (``build_kernel(..., rows=True)``; always kept for the Student-t and
    mixture residuals).

    Raises
    ------
    InputError
        Missing columns, bad durations, step-level rows, kernels with two classes, no usable
        rows, or (with the ``gpustep`` level) one launch per cell everywhere.
    """
    stats = table_statistics(tables, keep_rows=keep_rows or spec.fits_rows)
    return prepare_kernel_statistics(stats, spec, keep_rows=keep_rows)


def prepare_kernel_statistics(stats: ModelStatistics, spec: ModelSpec,
                              keep_rows: bool = False) -> PreparedData:
    """Prepare the kernel-level model from the statistics of trace tables.

    Parameters
    ----------
    stats
        :func:`bayesprism.model.statistics.table_statistics` of the tables, or the same read
        back from a statistics artifact (:mod:`bayesprism.statistics`).
    spec
        The model specification (``kind == "kernel"``).
    keep_rows
        Also keep per-launch arrays (needs statistics that kept the launches).

    Returns
    -------
    PreparedData

    Raises
    ------
    InputError
        A row-level residual (Student-t, mixture) from statistics without launches, kernels
        with two classes, no usable rows, one launch per cell everywhere with ``gpustep``.

    Examples
    --------
    >>> import pandas as pd
    >>> from bayesprism.model.statistics import table_statistics
    >>> table = pd.DataFrame({"run": ["r"] * 4, "step": [0, 0, 1, 1], "node": ["n0"] * 4,
    ...                       "gpu": [0, 1, 0, 1], "kernel": ["gemm"] * 4,
    ...                       "kernel_class": ["gemm"] * 4,
    ...                       "duration_us": [10.0, 11.0, 10.5, 12.0]})
    >>> spec = ModelSpec(levels=("gpu",))
    >>> prepare_kernel_statistics(table_statistics(table), spec).summary["cells"]
    4
    """
    if (spec.fits_rows or keep_rows) and not stats.has_rows:
        raise InputError(Problem(
            "statistics", "likelihood",
            f"the {spec.likelihood} residual is fitted on launches, which statistics do not "
            "hold: fit the traces or their trace table, or use a lognormal spec",
            example=spec.likelihood))
    kc = stats.kernel_cells
    cc = stats.collective_cells
    notes: list[str] = []
    skipped: dict[str, int] = {}
    ring = spec.collective_model == "ring"
    n_cell = kc["n"].to_numpy(dtype=np.int64)
    cell_class = kc["kernel_class"].astype(str).to_numpy()
    modelled = sorted(set(cc["collective"].astype(str))) if ring else []
    in_modelled = np.isin(cell_class, modelled)
    # Collectives of groups that keep their size and message when only data parallelism
    # grows (FIXED_GROUP_ROLES): their measured transfers are also fitted as kernels (one per
    # signature), which the forecast replays at the traced layout; the cost model covers
    # group sizes never measured.
    fixed_group = kc["fixed_role"].to_numpy(dtype=bool) & in_modelled
    unusable = in_modelled & ~kc["usable"].to_numpy(dtype=bool) & ~fixed_group
    if unusable.any():
        skipped["collective rows of a modelled class without a wait/transfer split (transfer_us: "
                "members without a trace file, see the ingest notes), bytes or group_size"] = (
            int(n_cell[unusable].sum()))
    kernel_cells = ~in_modelled | fixed_group
    fallback = sorted(set(cell_class[~in_modelled]) & set(coll.COLLECTIVE_CLASSES))
    fallback_cells = ~in_modelled & np.isin(cell_class, fallback)
    if fixed_group.any():
        notes.append(f"{int(n_cell[fixed_group].sum())} collective launches of tp/cp/ep groups "
                     "fitted as kernels too (their transfer per signature), besides the cost "
                     "model")
    if fallback:
        use_transfer = int(kc["transfer_n"].to_numpy(dtype=np.int64)[kernel_cells].sum())
        notes.append(
            "collective classes without a cost model (no bytes/group size) fitted as kernels: "
            + ", ".join(fallback) + f"; on transfer_us for {use_transfer} of "
            f"{int(n_cell[fallback_cells].sum())} launches (waiting split off at ingest), else "
            "on duration_us, which includes waiting")

    coords: dict[str, list] = {}
    data: dict[str, np.ndarray] = {}
    attrs: dict = {"model_kind": "kernel", "likelihood": spec.likelihood}
    summary: dict = {"rows": int(n_cell.sum()), "kernel_rows": int(n_cell[kernel_cells].sum())}
    if kernel_cells.any():
        part = _prepare_kernel_part(spec, stats, kernel_cells, keep_rows or spec.fits_rows)
        coords.update(part.coords)
        data.update(part.data)
        attrs.update(part.attrs)
        summary.update(part.summary)
        notes.extend(part.notes)
    if modelled:
        _prepare_collectives(stats, modelled, coords, data, summary)
    attrs["collective_model"] = modelled
    if not kernel_cells.any() and not modelled:
        raise InputError(Problem("tables", "", "no usable rows to fit"))
    attrs["notes"] = notes
    attrs["skipped"] = skipped
    return PreparedData(coords=coords, data=data, attrs=attrs, summary=summary)


def _labels(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes of string values on their sorted distinct labels."""
    codes, labels = factorize(values.astype(str).astype(object))
    return codes, [str(v) for v in labels]


def _prepare_kernel_part(spec: ModelSpec, stats: ModelStatistics, selected: np.ndarray,
                         keep_rows: bool) -> _KernelPart:
    """The kernel part of the prepared data, from the kernel cells ``selected`` (the launches
    the spec fits as kernels).

    Steps: kernels and their classes (:func:`_kernel_ids`), GPU, step and GPU-step units
    (:func:`_unit_keys`), the model's cells (kernel × GPU-step: :func:`_merge_cells`), the unit
    levels that can be fitted (:func:`_unit_levels`), the collapsed statistics
    (:func:`_collapsed_stats`), the sampler's attrs (:func:`_fit_attrs`).
    """
    kc = stats.kernel_cells
    # labels on all the statistics' runs, nodes and kernels (as the tables' global codes)
    run_all, run_labels = _labels(kc["run"].to_numpy())
    node_all, node_labels = _labels(kc["node"].to_numpy())
    kern_all, kernel_labels = _labels(kc["kernel"].to_numpy())
    cls_all, class_labels_all = _labels(kc["kernel_class"].to_numpy())
    sub = np.flatnonzero(selected)
    columns = {"run": run_all[sub], "node": node_all[sub], "kernel": kern_all[sub],
               "kernel_class": cls_all[sub], "gpu": kc["gpu"].to_numpy(dtype=np.int64)[sub],
               "step": kc["step"].to_numpy(dtype=np.int64)[sub]}
    n_sub = kc["n"].to_numpy(dtype=np.int64)[sub]
    ids = _kernel_ids(columns["kernel"], columns["kernel_class"], kernel_labels,
                      class_labels_all)
    keys = _unit_keys(columns, class_labels_all)
    cells = _merge_cells(ids.kernel_codes, len(ids.kernel_ids), keys.gs_codes,
                                      len(keys.gs_keys), n_sub,
                                      kc["mean_log"].to_numpy(dtype=float)[sub],
                                      kc["ss_log"].to_numpy(dtype=float)[sub])
    n_cells = len(cells)
    if "gpustep" in spec.levels and (cells.n == 1).all():
        raise InputError(Problem(
            "tables", "kernel",
            "every kernel × GPU × step cell has a single launch, so the residual cannot be "
            "separated from GPU×step effects; use the 'benchmark' spec or drop the gpustep level",
            n_cells))
    gpu_launches = np.bincount(keys.gpu_codes, weights=n_sub, minlength=len(keys.gpu_keys))
    levels = _unit_levels(spec, keys, node_labels, run_labels, stats.node_cabinets,
                          gpu_launches)
    n_classes = len(ids.class_ids)
    n_rows = int(n_sub.sum())

    coords: dict[str, list] = {
        "kernel": [kernel_labels[k] for k in ids.kernel_ids],
        "kernel_class": ids.class_labels,
        "cell": list(range(n_cells)),
        "gpustep": list(range(len(keys.gs_keys))),
    }
    for level, labels in levels.units.items():
        coords[{"gpu": "gpu_unit", "step": "step_unit"}.get(level, level)] = labels
    data = {"kernel_class_of_kernel": ids.kernel_class,
            **_collapsed_stats(cells, ids.kernel_class, len(ids.kernel_ids), n_classes,
                               len(keys.gs_keys)),
            "class_reference_weights": _reference_weights(ids.class_codes, n_sub, n_classes,
                                                          ids.class_labels)}
    # The likelihood adds per-GPU and per-step effect sums (small gathers) rather than
    # gathering every level to the GPU-steps.
    data["gpustep_gpu"], data["gpustep_step"] = keys.gs_gpu, keys.gs_step
    if spec.population("gpustep") == "lasting":  # episodes follow each GPU's steps in order
        data["step_lag"] = step_lags(keys.step_run, keys.step_local)
        data["gpustep_sequence"], data["gpustep_lag"] = episode_sequences(
            keys.gs_gpu, keys.gs_step, keys.step_run, keys.step_local)
    for level in levels.units:
        data[f"{level}_of_gpustep"] = levels.unit_of_gs[level]
        data[f"{level}_group"] = levels.group_of_unit[level]
        if level in levels.unit_of_gpu:
            data[f"{level}_of_gpu"] = levels.unit_of_gpu[level]
    if keep_rows:
        if spec.fits_rows and n_rows > MAX_ROWS:
            raise InputError(Problem(
                "tables", "duration_us",
                f"the {spec.likelihood} residual is fitted on rows and accepts at most "
                f"{MAX_ROWS} launches; use the default (lognormal) spec", n_rows))
        position = np.full(len(kc), -1, dtype=np.int64)
        position[sub] = np.arange(sub.size)
        at = position[stats.row_cell]
        rows = at >= 0
        coords["row"] = list(range(int(rows.sum())))
        data.update({"row_kernel": ids.kernel_codes[at[rows]],
                     "row_gpustep": keys.gs_codes[at[rows]],
                     "row_log_duration": stats.row_log[rows]})

    summary = {
        "cells": n_cells, "kernels": len(ids.kernel_ids), "kernel_classes": n_classes,
        "nodes": len(keys.node_ids), "gpus": len(keys.gpu_keys), "steps": len(keys.step_keys),
        "gpusteps": len(keys.gs_keys), "single_launch_cells": int((cells.n == 1).sum()),
    }
    return _KernelPart(coords=coords, data=data,
                       attrs=_fit_attrs(spec, levels, _parameterisation(spec, levels, n_rows)),
                       summary=summary, notes=levels.notes)


def _merge_cells(kernel: np.ndarray, n_kernels: int, gs: np.ndarray, n_gs: int,
                 n: np.ndarray, mean: np.ndarray, ss: np.ndarray) -> CellStats:
    """The model's cells (kernel × GPU-step, in increasing key order, kernel slowest) from
    statistics cells that may split one of them by flags.

    A model cell of one statistics cell keeps its values bit for bit; several are pooled:
    n = Σ n_i, mean = Σ n_i·m_i / n, SS = Σ (SS_i + n_i (m_i − mean)²).
    """
    key = kernel * n_gs + gs
    cell_keys, of_sub = np.unique(key, return_inverse=True)
    count = np.bincount(of_sub, minlength=cell_keys.size)
    total_n = np.bincount(of_sub, weights=n, minlength=cell_keys.size)
    pooled = np.bincount(of_sub, weights=n * mean, minlength=cell_keys.size) / total_n
    dev = mean - pooled[of_sub]
    pooled_ss = np.bincount(of_sub, weights=ss + n * dev * dev, minlength=cell_keys.size)
    single = count == 1
    first = np.zeros(cell_keys.size, dtype=np.int64)
    first[of_sub[::-1]] = np.arange(of_sub.size)[::-1]
    cell_mean = np.where(single, mean[first], pooled)
    cell_ss = np.where(single, ss[first], pooled_ss)
    return CellStats(codes={"kernel": cell_keys // n_gs, "gs": cell_keys % n_gs},
                     n=total_n.astype(np.float64), mean=cell_mean, ss=cell_ss)


@dataclass(frozen=True)
class _KernelPart:
    """What :func:`_prepare_kernel_part` adds to the prepared data, and its notes."""

    coords: dict[str, list]
    data: dict[str, np.ndarray]
    attrs: dict
    summary: dict
    notes: list[str]


@dataclass(frozen=True)
class _KernelIds:
    """Kernels and classes of the kernel cells as codes (a kernel name has one class)."""

    kernel_codes: np.ndarray  # per cell
    kernel_ids: np.ndarray  # global kernel code of each kernel
    class_codes: np.ndarray  # per cell
    class_ids: np.ndarray  # global class code of each class
    kernel_class: np.ndarray  # class of each kernel
    class_labels: list[str]


def _kernel_ids(kern: np.ndarray, cls: np.ndarray, kernel_labels: list[str],
                class_labels_all: list[str]) -> _KernelIds:
    """The cells' kernels and classes, refusing a kernel that appears with two classes."""
    kernel_codes, kernel_ids = factorize(kern)
    class_codes, class_ids = factorize(cls)
    pair = np.unique(kernel_codes * len(class_ids) + class_codes)
    per_kernel = np.bincount(pair // len(class_ids), minlength=len(kernel_ids))
    if (per_kernel > 1).any():
        k = int(np.flatnonzero(per_kernel > 1)[0])
        raise InputError(Problem("tables", "kernel_class", "a kernel appears with two classes",
                                 int((per_kernel > 1).sum()), kernel_labels[kernel_ids[k]]))
    kernel_class = np.zeros(len(kernel_ids), dtype=np.int64)
    kernel_class[pair // len(class_ids)] = pair % len(class_ids)
    class_labels = [class_labels_all[c] for c in class_ids]
    return _KernelIds(kernel_codes, kernel_ids, class_codes, class_ids, kernel_class,
                      class_labels)


@dataclass(frozen=True)
class _UnitKeys:
    """GPU, step and GPU-step units of the kernel rows (codes per row, keys per unit)."""

    gpu_codes: np.ndarray
    gpu_keys: np.ndarray
    gpu_bench: np.ndarray  # 1: the GPU unit of a per-GPU benchmark
    gpu_node: np.ndarray
    gpu_local: np.ndarray
    mixed_sources: bool  # benchmark and traced rows together
    step_keys: np.ndarray
    step_run: np.ndarray
    step_local: np.ndarray
    gs_codes: np.ndarray
    gs_keys: np.ndarray
    gs_gpu: np.ndarray
    gs_step: np.ndarray
    node_ids: np.ndarray
    node_of_gpu: np.ndarray


def _unit_keys(columns: dict[str, np.ndarray], class_labels_all: list[str]) -> _UnitKeys:
    """Units: GPU = (node, local gpu), step = (run, step), GPU-step = (GPU, step).

    A GPU timed by a per-GPU benchmark and by traced kernels is two units under its one node:
    one effect for both made them correlate fully, and they need not (dev fleet GEMM benchmark
    against the traced job's GPU effects: correlation 0.54, nodes 0.86; one shared effect
    tripled the traced classes' GPU scale, 0.012 -> 0.037, to fit both). Nodes, and the GPU
    population (its tail), stay shared.
    """
    node, gpu, run, step = columns["node"], columns["gpu"], columns["run"], columns["step"]
    bench = np.isin(columns["kernel_class"], [i for i, c in enumerate(class_labels_all)
                                              if c == "benchmark"]).astype(np.int64)
    n_local = int(gpu.max()) + 1
    gpu_codes, gpu_keys = factorize((node * n_local + gpu) * 2 + bench)
    gpu_node = gpu_keys // 2 // n_local
    step_codes, step_keys = factorize(run * (int(step.max()) + 1) + step)
    gs_codes, gs_keys = factorize(gpu_codes * len(step_keys) + step_codes)
    node_ids, node_of_gpu = np.unique(gpu_node, return_inverse=True)
    return _UnitKeys(
        gpu_codes=gpu_codes, gpu_keys=gpu_keys, gpu_bench=gpu_keys % 2, gpu_node=gpu_node,
        gpu_local=gpu_keys // 2 % n_local, mixed_sources=bool(bench.any() and not bench.all()),
        step_keys=step_keys, step_run=step_keys // (int(step.max()) + 1),
        step_local=step_keys % (int(step.max()) + 1), gs_codes=gs_codes, gs_keys=gs_keys,
        gs_gpu=gs_keys // len(step_keys), gs_step=gs_keys % len(step_keys),
        node_ids=node_ids, node_of_gpu=node_of_gpu)


@dataclass(frozen=True)
class _Levels:
    """The unit levels that can be fitted (at least two units to compare) and their maps."""

    units: dict[str, list[str]]  # level -> unit labels
    unit_of_gs: dict[str, np.ndarray]  # level -> unit of each GPU-step
    unit_of_gpu: dict[str, np.ndarray]  # persistent levels: unit of each GPU
    group_of_unit: dict[str, np.ndarray]
    fitted: list[str]
    notes: list[str]  # levels dropped, and why


def _unit_levels(spec: ModelSpec, keys: _UnitKeys, node_labels: list[str],
                 run_labels: list[str], node_cabinets: Sequence[tuple[str, str]] | None,
                 gpu_launches: np.ndarray) -> _Levels:
    """Which of the spec's unit levels can be fitted, with their units and groups
    (``gpu_launches``: the launches of each GPU unit)."""
    unit_of_gs: dict[str, np.ndarray] = {}
    unit_of_gpu: dict[str, np.ndarray] = {}
    units: dict[str, list[str]] = {}
    group_of_unit: dict[str, np.ndarray] = {}
    fitted: list[str] = []
    notes: list[str] = []
    node_ids, node_of_gpu, gs_gpu = keys.node_ids, keys.node_of_gpu, keys.gs_gpu
    for level in spec.levels:
        if level == "node":
            if len(node_ids) < 2:
                notes.append("node level dropped: fewer than 2 nodes")
                continue
            units[level] = [node_labels[i] for i in node_ids]
            unit_of_gpu[level] = node_of_gpu
            group_of_unit[level] = np.zeros(len(node_ids), dtype=np.int64)
        elif level == "gpu":
            per_node = np.bincount(node_of_gpu)
            if (per_node < 2).all():
                notes.append("gpu level dropped: no node with 2 or more GPUs")
                continue
            if (gpu_launches < 2).all():
                # a GPU's one launch is all its data: its effect and its residual are the same
                # number, a ridge the sampler cannot mix (PAL LS6: R-hat 1.05, ESS 26)
                notes.append("gpu level dropped: every GPU has a single launch, so its effect "
                             "cannot be told from the launch's residual")
                continue
            units[level] = [f"{node_labels[n]}/{g}" + ("/benchmark" if b and keys.mixed_sources
                                                       else "")
                            for n, g, b in zip(keys.gpu_node, keys.gpu_local, keys.gpu_bench,
                                               strict=True)]
            unit_of_gpu[level] = np.arange(len(keys.gpu_keys))
            # a node's traced and benchmarked GPUs are zero-sum each: each measurement's GPUs
            # deviate from the node's one effect, and a group of units that launch the same
            # classes can be sampled in the units those classes see (effects.unit_level)
            group_of_unit[level] = np.unique(node_of_gpu * 2 + keys.gpu_bench,
                                             return_inverse=True)[1]
        elif level == "step":
            if (np.bincount(keys.step_run) < 2).all():
                notes.append("step level dropped: no run with 2 or more steps"
                             + (" (and with it step_noise: no repeats to differ in noise)"
                                if spec.step_noise else ""))
                continue
            units[level] = [f"{run_labels[r]}/{s}" for r, s in zip(keys.step_run,
                                                                     keys.step_local,
                                                                     strict=True)]
            unit_of_gs[level] = keys.gs_step
            group_of_unit[level] = np.unique(keys.step_run, return_inverse=True)[1]
        elif level == "cabinet":
            cab = _cabinet_of_node(node_cabinets, node_ids, node_labels, notes)
            if cab is None:
                continue
            cab_codes, cab_labels = cab
            units[level] = cab_labels
            unit_of_gpu[level] = cab_codes[node_of_gpu]
            group_of_unit[level] = np.zeros(len(cab_labels), dtype=np.int64)
        elif level == "gpustep" and len(keys.gs_keys) < 2:
            notes.append("gpustep level dropped: a single GPU-step")
            continue
        elif level == "gpustep" and (np.bincount(gs_gpu) < 2).all():
            # One step per GPU: a transient GPU×step effect is indistinguishable from the
            # GPU's persistent effect, and fitting both leaves a ridge the sampler cannot mix.
            notes.append("gpustep level dropped: every GPU was traced at a single step, so "
                         "transient GPU×step effects cannot be told from persistent GPU effects")
            continue
        fitted.append(level)
        if level in unit_of_gpu:
            unit_of_gs[level] = unit_of_gpu[level][gs_gpu]
    if "cabinet" in units and "node" in units and _nodes_nest_in_cabinets(spec):
        # Nodes nest in cabinets: otherwise a cabinet's effect and the mean of its nodes'
        # effects form a ridge only the priors split (measured on PAL: divergences, R-hat 1.02).
        # Not for a degraded node population: nested effects are zero-sum within their cabinet
        # and the population density is applied to them, exact only for a normal one. A
        # cabinet holding two nodes 10 % slow then fits its other nodes 1-2 % fast and the
        # core widens to cover them (PAL Frontera ResNet: core sd 1.7 % against 0.1 % un-nested,
        # KS of held-out GPUs 0.21 against 0.08); un-nested, the cabinet scale gets the soft
        # floor that keeps the ridge sampleable (effects.unit_level).
        group_of_unit["node"] = cab_codes
    if keys.mixed_sources and "gpu" in fitted:
        # the joint fit's thousands of benchmark effects are slow and have minor modes
        # (docs/status.md); the two-stage fit carries the same populations over
        notes.append("per-GPU benchmark rows fitted jointly with traced kernels: fitting the "
                     "benchmark alone and passing its posterior as --population-prior "
                     "(fit(population_prior=...)) carries its populations over, faster and "
                     "converging more reliably")
    return _Levels(units, unit_of_gs, unit_of_gpu, group_of_unit, fitted, notes)


def _parameterisation(spec: ModelSpec, levels: _Levels, n_rows: int) -> dict[str, str]:
    """Centred or non-centred effects per level (by launches per unit when ``auto``)."""
    param: dict[str, str] = {}
    for level in levels.units:
        density = n_rows / len(levels.units[level])
        if spec.parameterisation == "auto":
            param[level] = "centred" if density >= spec.dense_launches else "noncentred"
        else:
            param[level] = spec.parameterisation
    return param


def _reference_weights(class_codes: np.ndarray, launches: np.ndarray, n_classes: int,
                       class_labels: list[str]) -> np.ndarray:
    """Launches per class weighting the reference class of each level's loadings.

    The reference class of each level's loadings (``{level}_scale_ref``) is the launch-weighted
    geometric mean of the compute classes: a collective's transfer (measured after its last
    member arrives) barely loads on a GPU's or node's speed, so with collectives in the mean,
    that mean (and every standardised effect) would follow their nearly unidentified loadings.
    """
    launches_per_class = np.bincount(class_codes, weights=launches,
                                     minlength=n_classes).astype(np.int64)
    is_compute = np.array([c not in coll.COLLECTIVE_CLASSES for c in class_labels])
    reference_weights = launches_per_class * is_compute
    if reference_weights.sum() == 0:
        reference_weights = launches_per_class
    return reference_weights


def _collapsed_stats(cells, kernel_class: np.ndarray, n_kernels: int, n_classes: int,
                     n_gs: int) -> dict[str, np.ndarray]:
    """Collapsed statistics (see module docstring): per kernel, cell, GPU-step × class block
    and class."""
    C = n_classes
    kernel_n = np.bincount(cells.codes["kernel"], weights=cells.n, minlength=n_kernels)
    kernel_mean = np.bincount(cells.codes["kernel"], weights=cells.n * cells.mean,
                              minlength=n_kernels) / kernel_n
    cell_dev = cells.mean - kernel_mean[cells.codes["kernel"]]
    cell_class = kernel_class[cells.codes["kernel"]]
    block = cells.codes["gs"] * C + cell_class
    block_n = np.bincount(block, weights=cells.n, minlength=n_gs * C).reshape(-1, C)
    block_dev = np.bincount(block, weights=cells.n * cell_dev,
                            minlength=n_gs * C).reshape(-1, C)
    class_q = np.bincount(cell_class, weights=cells.ss + cells.n * cell_dev**2, minlength=C)
    class_n = np.bincount(cell_class, weights=cells.n, minlength=C)
    return {
        "kernel_n": kernel_n, "kernel_mean": kernel_mean,
        "cell_kernel": cells.codes["kernel"], "cell_gpustep": cells.codes["gs"],
        "cell_n": cells.n, "cell_mean": cells.mean, "cell_ss": cells.ss,
        "cell_dev": cell_dev, "block_n": block_n, "block_dev": block_dev,
        "class_q": class_q, "class_n": class_n,
    }


def _fit_attrs(spec: ModelSpec, levels: _Levels, param: dict[str, str]) -> dict:
    """Attrs of the kernel part: fitted levels, parameterisation, sampler settings, the
    levels' populations."""
    fitted = levels.fitted
    attrs: dict = {"levels": fitted, "parameterisation": param}
    if spec.step_noise and "step" in fitted:
        # a noisy step pins its level ~30x less tightly than the others, which ties the
        # baselines to the step contrasts: diagonal mass matrix on PAL, 4 chains x 1000 draws:
        # R-hat 1.016, ESS 105; low-rank: R-hat 1.008, ESS 904
        attrs["mass_matrix"] = "low_rank"
    if "gpustep" in fitted and spec.population("gpustep") in EPISODE_POPULATIONS:
        # the kernel baselines share a common direction that no single coordinate follows
        # (dev traces, 2 chains x 1000 draws, seeds 0 and 2: the all-kernels mean at bulk ESS
        # 50-70, correlated 0.9 with most contrasts, under a diagonal mass matrix; low-rank:
        # min ESS 277-508, no divergences, ~6 s more)
        attrs["mass_matrix"] = "low_rank"
    if spec.likelihood == "mixture":
        # with few slow launches the slow component's shift and spread are nearly prior-only,
        # and at target 0.8 a chain occasionally diverges there (1 in 2,000 draws at w = 0)
        attrs["target_accept"] = 0.9
    attrs["gpustep"] = ("marginalised" if spec.likelihood == "lognormal" else "sampled"
                        ) if "gpustep" in fitted else "absent"
    for level in ("node", "gpu"):
        if level in levels.units:
            attrs[f"{level}_population"] = spec.population(level)
    if "gpustep" in fitted:
        attrs["gpustep_population"] = spec.population("gpustep")
    return attrs


def _nodes_nest_in_cabinets(spec: ModelSpec) -> bool:
    """Whether node effects are zero-sum within their cabinet (the preparation's comment says
    why, and why not for a ``degraded`` node population)."""
    return spec.node_population != "degraded"


def _cabinet_of_node(node_cabinets, node_ids, node_labels, notes):
    """Cabinet code of every node, or None (with a note) when the level cannot be fitted.

    ``node_cabinets``: the tables' distinct (node, cabinet) pairs, None without a cabinet
    column (:class:`~bayesprism.model.statistics.ModelStatistics`).
    """
    if node_cabinets is None:
        notes.append("cabinet level dropped: no table has a cabinet column")
        return None
    mapping = pd.DataFrame(list(node_cabinets), columns=["node", "cabinet"], dtype=object)
    if mapping["node"].duplicated().any():
        bad = mapping.loc[mapping["node"].duplicated(), "node"].iloc[0]
        raise InputError(Problem("tables", "cabinet", "a node appears in two cabinets",
                                 example=bad))
    lookup = dict(zip(mapping["node"], mapping["cabinet"], strict=True))
    names = [node_labels[i] for i in node_ids]
    missing = [n for n in names if n not in lookup]
    if missing:
        notes.append(f"cabinet level dropped: {len(missing)} node(s) without a cabinet, "
                     f"e.g. {missing[0]!r}")
        return None
    cab_labels = sorted(set(lookup[n] for n in names))
    if len(cab_labels) < 2:
        notes.append("cabinet level dropped: fewer than 2 cabinets")
        return None
    idx = {c: i for i, c in enumerate(cab_labels)}
    return np.array([idx[lookup[n]] for n in names], dtype=np.int64), cab_labels


def _prepare_collectives(stats: ModelStatistics, modelled: list[str], coords, data,
                         summary) -> None:
    """Cells of the collectives' log transfer times and the cost model's reference points.

    Cells are (collective, tier, algorithm, group size, nodes spanned, bytes, step); the
    ``coll_cell_*`` arrays carry the cost factors of each (ring, or log2 latency steps for an
    all-reduce whose NCCL kernel names a tree algorithm). Every observed (collective, tier)
    *pair* gets a reference point, the geometric mean of its cells' latency steps and bus bytes,
    where :func:`_collective_part` places its coordinates; ``coll_cell_log_latency_rel`` /
    ``coll_cell_log_bytes_rel`` are the cells' latency steps and bus bytes relative to that
    point (log); ``coll_cell_log_nodes_rel`` is log(nodes / 2) of inter-node cells (0 for
    intra-node ones), the argument of the fabric exponent. ``coll_cell_scale`` indexes the
    noise scales: the collective's, or for cells of benchmark runs of a collective the job
    also shows, the ``coll_benchmarked`` ones after them. ``coll_cell_congestion`` indexes the
    congestion scales: the (collective, tier) pair's, or those benchmark cells' own after the
    pairs'; the congestion groups ``coll_cell_group`` are (congestion scale, step).
    """
    cc = stats.collective_cells
    kc = stats.kernel_cells
    run_labels = sorted(set(kc["run"].astype(str)))
    run_index = {r: i for i, r in enumerate(run_labels)}
    j = np.array([modelled.index(c) for c in cc["collective"].astype(str)], dtype=np.int64)
    p_codes, p_vals = factorize(cc["group_size"].to_numpy(dtype=float))
    n_codes, n_vals = factorize(cc["nodes"].to_numpy(dtype=float))
    b_codes, b_vals = factorize(cc["bytes"].to_numpy(dtype=float))
    step = cc["step"].to_numpy(dtype=np.int64)
    run = np.array([run_index[r] for r in cc["run"].astype(str)], dtype=np.int64)
    stride = int(step.max()) + 1  # (run, step) -> one code: run * stride + step
    s_codes, s_keys = factorize(run * stride + step)
    # The algorithm NCCL names in the kernel (``..._TREE_LL``: log2 latency steps), decided
    # per kernel name: the forecast costs such a collective with the same steps.
    algorithms = ("ring", *coll.LOG_ALGORITHMS)
    alg = np.array([algorithms.index(a) for a in cc["algorithm"].astype(str)], dtype=np.int64)
    tier = cc["tier"].to_numpy(dtype=np.int64)
    # the cells in increasing order of (collective, tier, algorithm, p, nodes, bytes, step),
    # as aggregating the launches orders them
    order = np.lexsort((s_codes, b_codes, n_codes, p_codes, alg, tier, j))
    cells = CellStats(
        codes={"coll": j[order], "tier": tier[order], "alg": alg[order], "p": p_codes[order],
               "n": n_codes[order], "b": b_codes[order], "s": s_codes[order]},
        n=cc["n"].to_numpy(dtype=np.int64)[order].astype(np.float64),
        mean=cc["mean_log"].to_numpy(dtype=float)[order],
        ss=cc["ss_log"].to_numpy(dtype=float)[order])
    cj, ct = cells.codes["coll"], cells.codes["tier"]
    p = p_vals[cells.codes["p"]]
    b = b_vals[cells.codes["b"]]
    lat_steps = np.empty(len(cells))
    bw_factor = np.empty(len(cells))
    for k, name in enumerate(modelled):
        for a, algorithm in enumerate(algorithms):
            m = (cj == k) & (cells.codes["alg"] == a)
            lat_steps[m] = coll.latency_steps(name, p[m], algorithm)
        m = cj == k
        bw_factor[m] = coll.bandwidth_factor(name, p[m])
    # Benchmark runs (run metadata ``benchmark``, e.g. nccl-tests) time transfers on other
    # nodes, in other sessions, averaged over iterations: they pin latency and bandwidth, but
    # their spread is not the traced job's. Where a collective has both, the benchmark cells
    # get noise and congestion scales of their own, so the public ones stay the job's.
    bench_runs = set(stats.benchmark_runs)
    bench_run = np.array([label in bench_runs for label in run_labels] + [False])
    cell_bench = bench_run[s_keys[cells.codes["s"]] // stride]
    has_job = np.zeros(len(modelled), dtype=bool)
    has_job[cj[~cell_bench]] = True
    benchmarked = np.flatnonzero(has_job & np.isin(np.arange(len(modelled)), cj[cell_bench]))
    scale = cj.copy()
    split = cell_bench & np.isin(cj, benchmarked)
    scale[split] = len(modelled) + np.searchsorted(benchmarked, cj[split])
    pair, pair_keys = factorize(cj * 2 + ct)
    # Congestion per (collective, tier): one collective's tiers are different networks (the
    # dev job's data-parallel transfers move by 3 % from step to step, its intra-node tensor-
    # parallel collectives hold still, and one scale for both took the first for the second).
    # Benchmark cells of a collective the job also shows keep a scale of their own, as for the
    # noise. A group is (congestion scale, step).
    congestion = pair.copy()
    congestion[split] = len(pair_keys) + np.searchsorted(benchmarked, cj[split])
    congestion_group, _ = factorize(congestion * len(s_keys) + cells.codes["s"])

    # Degraded-link units: the transfers that one allocation of nodes times together, all
    # slow at once when one of its nodes has a degraded link. A benchmark sweep is one
    # allocation (its run and step); a job's run is one for all its steps. A unit's
    # exposure is the nodes it spans: a sweep's, or every node a job's run has rows from.
    s_of_cell = s_keys[cells.codes["s"]]
    run_of_cell = s_of_cell // stride
    unit, _ = factorize(np.where(cell_bench, s_of_cell, -1 - run_of_cell))
    pairs = kc[["run", "node"]].astype(str).drop_duplicates()
    run_nodes = pd.Series(pairs.groupby("run")["node"].nunique().reindex(run_labels).to_numpy(),
                          index=np.arange(len(run_labels)))
    unit_nodes = np.zeros(int(unit.max()) + 1)
    np.maximum.at(unit_nodes, unit, np.where(
        cell_bench, n_vals[cells.codes["n"]],
        np.maximum(run_nodes.reindex(run_of_cell).fillna(1).to_numpy(), n_vals[cells.codes["n"]])))
    unit_inter = np.zeros(unit_nodes.size, dtype=bool)
    unit_inter[unit[ct == 1]] = True

    # Reference point of each observed (collective, tier): the geometric mean of its cells'
    # latency steps and bus bytes (each cell, i.e. each step of each size, one vote): inside
    # the data, so the log transfer time there is what they pin, whatever the latency share.
    pair_coll, pair_tier = pair_keys // 2, pair_keys % 2
    per_pair = np.bincount(pair).astype(float)
    ref_steps = np.exp(np.bincount(pair, weights=np.log(lat_steps)) / per_pair)
    ref_factor = np.exp(np.bincount(pair, weights=np.log(b * bw_factor)) / per_pair)

    coords["collective"] = list(modelled)
    coords["tier"] = list(coll.TIERS)
    coords["coll_cell"] = list(range(len(cells)))
    coords["coll_pair"] = [f"{modelled[c]}/{coll.TIERS[t]}"
                           for c, t in zip(pair_coll, pair_tier, strict=True)]
    if benchmarked.size:
        coords["coll_benchmarked"] = [modelled[c] for c in benchmarked]
    observed_tiers = np.zeros((len(modelled), 2), dtype=bool)
    observed_tiers[cj, ct] = True
    data.update({
        "coll_cell_collective": cj, "coll_cell_tier": ct,
        "coll_cell_latency_steps": lat_steps,
        "coll_cell_bytes_factor": b * bw_factor,
        "coll_cell_group": congestion_group, "coll_cell_n": cells.n,
        "coll_cell_mean": cells.mean, "coll_cell_ss": cells.ss,
        "coll_observed_tiers": observed_tiers,
        "coll_cell_pair": pair, "coll_cell_scale": scale, "coll_cell_benchmark": cell_bench,
        "coll_cell_congestion": congestion,
        "coll_cell_log_latency_rel": np.log(lat_steps / ref_steps[pair]),
        "coll_cell_log_bytes_rel": np.log(b * bw_factor / ref_factor[pair]),
        "coll_cell_log_nodes_rel": np.where(
            ct == 1, np.log(np.maximum(n_vals[cells.codes["n"]], 2.0) / 2.0), 0.0),
        "coll_cell_algorithm": cells.codes["alg"],
        "coll_cell_small": coll.is_small_message(b).astype(float),
        "coll_pair_collective": pair_coll, "coll_pair_tier": pair_tier,
        "coll_pair_latency_steps": ref_steps, "coll_pair_bytes_factor": ref_factor,
        "coll_cell_unit": unit, "coll_unit_nodes": unit_nodes, "coll_unit_inter": unit_inter,
    })
    summary.update({"collective_rows": int(cc["n"].sum()), "collective_cells": len(cells),
                    "collective_pairs": len(pair_keys)})


# ----------------------------------------------------------------------------- model
def build_kernel(prepared: PreparedData, spec: ModelSpec, rows: bool = False):
    """Build the kernel-level PyMC model from :func:`prepare_kernel` output.

    ``rows=True`` writes the Gaussian likelihood per launch with the GPU×step effects sampled
    (the reference the collapsed cell likelihood is checked and benchmarked against; needs
    ``prepare_kernel(..., keep_rows=True)``). The Student-t and mixture residuals always use rows.
    """
    import pymc as pm

    if (rows or spec.fits_rows) and "row" not in prepared.coords:
        raise ValueError("row-level likelihood needs prepare_kernel(..., keep_rows=True)")
    with pm.Model(coords=prepared.coords) as model:
        if "kernel" in prepared.coords:
            _kernel_part(prepared, spec, rows)
        if "collective" in prepared.coords:
            _collective_part(prepared, spec)
    return model


def _kernel_baselines(kernel_mean: np.ndarray, cls: np.ndarray, n_classes: int, spec: ModelSpec,
                      se=1.0, data_start: bool = False):
    """Kernel baselines a_k pooled within class, the class mean integrated out.

    a_k ~ N(m_c, sd_c), m_c ~ N(loc, τ): per class the baselines are jointly normal with
    covariance sd_c²·I + τ²·11ᵀ, evaluated in closed form (matrix determinant lemma). Sampling
    m_c instead puts a funnel between m_c and sd_c for classes with one or two kernels.
    ``se``: the data's standard errors of the baselines' Helmert coordinates, the units of
    ``kernel_log_median_coef``; ``data_start``: start the class sds at the kernels' spread.
    """
    import pymc as pm
    import pytensor.tensor as pt

    loc = float(np.median(kernel_mean))
    tau2 = spec.prior("kernel_log_median_sd") ** 2
    # Gamma(2) rather than half-normal: a class of two or three kernels with near-equal medians
    # (a TP all-reduce) otherwise lets its sd wander towards zero, where the baselines, pinned by
    # their launches, make a wall (dev traces: the divergences sat at sd 7e-5 against 0.016)
    prior_mean = spec.prior("kernel_class_sd") * np.sqrt(2.0 / np.pi)
    class_sd = pm.Gamma("kernel_class_sd", 2.0, 2.0 / prior_mean, dims="kernel_class",
                        initval=class_spread_start(kernel_mean, cls, n_classes)
                        if data_start else None)
    # Data-dominated baselines, sampled as the observed means plus standard errors times
    # kernel_log_median_coef (bayesprism.model.start), in an orthonormal basis whose first
    # vector is the all-kernels mean: the mean of the integrated GPU×step effects shifts every
    # baseline alike, and a diagonal mass matrix handles that common direction only when it is
    # a coordinate of its own.
    basis = helmert(len(kernel_mean), full=True)
    pm.modelcontext(None).add_coord("kernel_basis", list(range(len(kernel_mean))))
    coef = pm.Flat("kernel_log_median_coef", dims="kernel_basis")
    a_free = loc + pt.dot(basis @ (np.asarray(kernel_mean, dtype=float) - loc) + se * coef, basis)
    count = np.bincount(cls, minlength=n_classes).astype(float)
    dev = a_free - loc
    var = class_sd**2
    sum_dev = segment_sum(dev, cls, n_classes)
    # within-class sum of squares and the class mean's term, each finite as var -> 0 (the
    # textbook sum_sq/var - tau2*sum_dev²/(var*denom) cancels catastrophically there, and a
    # chain that wandered to a tiny class sd got NaN gradients and a step size of 1e-17)
    within = segment_sum((dev - (sum_dev / count)[cls]) ** 2, cls, n_classes)
    denom = var + count * tau2
    logp = pt.sum(
        -0.5 * count * np.log(2.0 * np.pi)
        - 0.5 * ((count - 1.0) * pt.log(var) + pt.log(denom))
        - 0.5 * (within / var + sum_dev**2 / (count * denom))
    )
    pm.Potential("kernel_class_prior", logp)
    return a_free


def _kernel_part(prepared: PreparedData, spec: ModelSpec, rows: bool) -> None:
    import pymc as pm
    import pytensor.tensor as pt

    d = prepared.data
    attrs = prepared.attrs
    cls = d["kernel_class_of_kernel"]
    n_classes = len(prepared.coords["kernel_class"])
    n_gs = len(prepared.coords["gpustep"])

    # Cell statistics as fitted, for the constant_data group. Large arrays enter the graph as
    # data (shared variables), never as constants: numba would embed constants in the
    # compiled code and LLVM then spends minutes on them.
    cell_kernel = pm.Data("cell_kernel", d["cell_kernel"], dims="cell")
    # each kernel's class, for checks of kernels the job's inventory does not list (a per-GPU
    # benchmark's)
    pm.Data("kernel_class_of_kernel", cls, dims="kernel")
    pm.Data("cell_gpustep", d["cell_gpustep"], dims="cell")
    cell_n = pm.Data("cell_n", d["cell_n"], dims="cell")
    pm.Data("cell_mean_log", d["cell_mean"], dims="cell")
    pm.Data("cell_ss_log", d["cell_ss"], dims="cell")

    # Data-centred coordinates (bayesprism.model.start) for the cell likelihood only: row
    # fits are small enough not to need them. (With them, PAL's row mixture fit once left a
    # chain in a second node-population mode, R-hat 1.5; without step_noise that mode also
    # appears with the plain coordinates, so it was the model, not the coordinates.)
    centred_coords = not spec.fits_rows
    a_free = _kernel_baselines(d["kernel_mean"], cls, n_classes, spec,
                               kernel_baseline_se(d) if centred_coords else 1.0,
                               data_start=centred_coords)
    # data starts (model.start) on the cell likelihood, as its centred coordinates: row fits
    # are small and start well from the priors (and a row mixture's scale is its core's
    # alone, which the within-cell sd does not measure)
    resid = pm.HalfNormal("resid_scale", spec.prior("resid_scale"), dims="kernel_class",
                          initval=within_cell_sd(d) if centred_coords else None)

    # Persistent levels (cabinet, node, GPU) summed per GPU, steps per step unit: the
    # GPU-steps then need one (GPU, step) broadcast or two gathers, not a gather per level
    # (measured: no faster on its own under JAX; it is what lets blocks form a grid).
    n_gpu, n_step = int(d["gpustep_gpu"].max()) + 1, int(d["gpustep_step"].max()) + 1
    gpu_part = pt.zeros((n_gpu, n_classes))
    step_part = pt.zeros((n_step, n_classes))
    shift = pt.zeros(len(cls))
    estimates = unit_effect_estimates(d, attrs["levels"]) if centred_coords else {}
    floored = {level for level in ("node", "gpu")
               if level in attrs["levels"] and spec.population(level) == "degraded"}
    if {"node", "cabinet"} <= set(attrs["levels"]) and not _nodes_nest_in_cabinets(spec):
        floored.add("cabinet")  # the ridge with un-nested nodes needs the floor
    if "step" in attrs["levels"] and centred_coords:
        # a few profiled steps of one run often share no slowdown beyond what their launches
        # resolve: a step scale free to reach zero forms a funnel with the step effects (dev
        # traces: step effects at R-hat 1.83, the scale at 3e-5 against a resolution of 1e-4)
        floored.add("step")
    resolution = unit_resolution(d, attrs["levels"]) if floored else {}
    for level in attrs["levels"]:
        if level == "gpustep":
            continue
        estimate = estimates.get(level)
        unit_estimate = robust_unit_effects(d, level) if level != "step" and (
            centred_coords or spec.population(level) == "degraded") else None
        if f"{level}_start_effect" in d:  # a population prior measured these units
            estimate, unit_estimate = started_in_core(estimate, unit_estimate,
                                                      d[f"{level}_start_effect"],
                                                      d[f"{level}_group"])
        loading, centred, mean_effect = unit_level(
            level, prepared, spec, estimate,
            resolution=resolution[level] if level in floored else None,
            unit_estimate=unit_estimate, data_starts=centred_coords)
        pm.Data(f"{level}_of_gpustep", d[f"{level}_of_gpustep"], dims="gpustep")
        if level != "step":
            centred = centred[d[f"{level}_of_gpu"]]
        part = (centred if centred.ndim == 2 else centred[:, None]) * loading[None, :]
        if level == "step":
            step_part = step_part + part
        else:
            gpu_part = gpu_part + part
        # The likelihood sees effects centred on the fitted units; a level with one group (one
        # run's steps, one node's GPUs) keeps their mean as a prior-only coordinate. The
        # contract adds loading·effect to kernel_log_median, so the median moves by that mean
        # (zero for nested levels): fitted units then predict their own fitted level, and a
        # new unit's deviation from the fitted ones carries the mean's uncertainty. (Units
        # launching different class mixes: per class, over the units that launch it.)
        shift = shift + loading[cls] * (mean_effect[cls] if mean_effect.ndim else mean_effect)
    pm.Deterministic("kernel_log_median", a_free - shift, dims="kernel")
    gpustep = gpustep_ref = None
    if "gpustep" in attrs["levels"]:
        gpustep_ref = pm.HalfNormal("gpustep_scale_ref", spec.prior("level_scale"),
                                    initval=gpustep_core_start(d) if centred_coords else None)
        if spec.population("gpustep") in EPISODE_POPULATIONS:
            # episodes are defined in core sds: a core scale below what one GPU-step's
            # launches resolve lets the sampler wander off to a zero core (and the episodes'
            # shift to infinity); the floor of a degraded unit population
            soft_scale_floor("gpustep", gpustep_ref, gpustep_resolution(d))
        gpustep = class_scales("gpustep", gpustep_ref, prepared, log_ratio_start=(
            loading_ratio_start(d, "gpustep") if centred_coords else None))

    beta_per_gpustep = gpu_part[d["gpustep_gpu"]] + step_part[d["gpustep_step"]]
    if rows or spec.fits_rows:
        row_likelihood(prepared, spec, a_free, beta_per_gpustep, resid, gpustep)
        return
    # Exact collapsed Gaussian likelihood (module docstring), on blocks laid out as a
    # (GPU × step) grid when GPU-steps fill most of it (absent blocks count zero launches and
    # add nothing), else one row per GPU-step.
    position = d["gpustep_gpu"] * n_step + d["gpustep_step"]
    grid = n_gpu * n_step <= GRID_PADDING * n_gs
    if not grid and np.count_nonzero(d["block_n"]) < SPARSE_FILL * d["block_n"].size:
        _sparse_loglik(d, cls, cell_n, cell_kernel, a_free, gpu_part, step_part, resid,
                       gpustep, gpustep_ref, spec)
        return
    n_blocks = n_gpu * n_step if grid else n_gs
    if grid:
        beta = (gpu_part[:, None, :] + step_part[None, :, :]).reshape((n_blocks, n_classes))
    else:
        position = np.arange(n_gs)
        beta = beta_per_gpustep
    pm.modelcontext(None).add_coord("block", list(range(n_blocks)))

    def blocks(values: np.ndarray) -> np.ndarray:
        out = np.zeros((n_blocks, *values.shape[1:]))
        out[position] = values
        return out

    delta = d["kernel_mean"] - a_free
    block_dev = pm.Data("block_dev_log", blocks(d["block_dev"]), dims=("block", "kernel_class"))
    block_n = pm.Data("block_n", blocks(d["block_n"]), dims=("block", "kernel_class"))
    n_kernels = len(cls)
    if len(d["cell_n"]) >= DENSE_FILL * n_blocks * n_kernels and \
            n_blocks * n_kernels <= DENSE_MAX:
        counts = np.zeros((n_blocks, n_kernels))
        counts[position[d["cell_gpustep"]], d["cell_kernel"]] = d["cell_n"]
        class_delta = delta[:, None] * np.eye(n_classes)[cls]  # (kernel, kernel_class)
        # Training steps repeat the same kernels: blocks share a few launch-count patterns,
        # and a product with the patterns replaces the (block × kernel) product (measured on
        # the fit benchmark: JAX logp+grad 2.6 -> 2.2 ms).
        patterns, pattern_of_block = np.unique(counts, axis=0, return_inverse=True)
        if len(patterns) == 1:
            r0 = block_dev + pt.dot(patterns[0], class_delta)[None, :]
        elif 2 * len(patterns) <= n_kernels:
            pm.modelcontext(None).add_coord("count_pattern", list(range(len(patterns))))
            member = pm.Data("block_count_pattern",
                             np.eye(len(patterns))[pattern_of_block.ravel()],
                             dims=("block", "count_pattern"))
            r0 = block_dev + pt.dot(member, pt.dot(patterns, class_delta))
        else:
            # Most blocks run most kernels: one dense (block × kernel) matrix product is far
            # cheaper than a scatter over cells, and so is its gradient.
            counts = pm.Data("launch_count", counts, dims=("block", "kernel"))
            r0 = block_dev + pt.dot(counts, class_delta)
    else:
        flat_block = pm.Data("cell_block", position[d["cell_gpustep"]] * n_classes
                             + cls[d["cell_kernel"]], dims="cell")
        r0 = block_dev + segment_sum(
            cell_n * delta[cell_kernel], flat_block, n_blocks * n_classes
        ).reshape((n_blocks, n_classes))
    quad = (
        d["class_q"]
        + segment_sum(d["kernel_n"] * delta**2, cls, n_classes)
        - 2.0 * pt.sum(beta * r0, axis=0)
        + pt.sum(block_n * beta**2, axis=0)
    )
    var = resid**2
    logp = pt.sum(-d["class_n"] * pt.log(resid) - quad / (2.0 * var))
    logp = logp - 0.5 * float(d["class_n"].sum()) * np.log(2.0 * np.pi)
    if gpustep is not None:
        resid_block = r0 - block_n * beta
        a_gs = pt.sum(resid_block * (gpustep / var)[None, :], axis=1)
        b_gs = pt.sum(block_n * (gpustep**2 / var)[None, :], axis=1)
        core = -0.5 * pt.log1p(b_gs) + a_gs**2 / (2.0 * (1.0 + b_gs))
        if spec.population("gpustep") in EPISODE_POPULATIONS:
            logp = logp + _episode_loglik(core, a_gs, b_gs, gpustep_ref, spec, d,
                                          grid=(n_gpu, n_step) if grid else None)
        else:
            logp = logp + pt.sum(core)
    pm.Potential("kernel_loglik", logp)


def _sparse_loglik(d: dict, cls: np.ndarray, cell_n, cell_kernel, a_free, gpu_part, step_part,
                   resid, gpustep, gpustep_ref, spec: ModelSpec) -> None:
    """The collapsed likelihood of :func:`_kernel_part` on the (GPU-step, kernel class) pairs
    with launches only: the same sums, for fits where most GPU-steps run few of the classes
    (a per-GPU benchmark's sessions beside a traced job: dev traces with the fleet GEMM
    benchmark fill 15 % of the dense array)."""
    import pymc as pm
    import pytensor.tensor as pt

    n_gs, n_classes = d["block_n"].shape
    gs, klass = np.nonzero(d["block_n"])
    pair_of = np.full((n_gs, n_classes), -1, dtype=np.int64)
    pair_of[gs, klass] = np.arange(gs.size)
    pm.modelcontext(None).add_coord("pair", list(range(gs.size)))
    pair_n = pm.Data("pair_n", d["block_n"][gs, klass], dims="pair")
    pair_dev = pm.Data("pair_dev_log", d["block_dev"][gs, klass], dims="pair")
    pair_gs = pm.Data("pair_gpustep", gs, dims="pair")
    gpu_index = pm.Data("pair_gpu_part", d["gpustep_gpu"][gs] * n_classes + klass, dims="pair")
    step_index = pm.Data("pair_step_part", d["gpustep_step"][gs] * n_classes + klass,
                         dims="pair")
    cell_pair = pm.Data("cell_pair", pair_of[d["cell_gpustep"], cls[d["cell_kernel"]]],
                        dims="cell")
    beta = gpu_part.ravel()[gpu_index] + step_part.ravel()[step_index]
    delta = d["kernel_mean"] - a_free
    r0 = pair_dev + segment_sum(cell_n * delta[cell_kernel], cell_pair, gs.size)
    # sums over a pair's class and gathers of per-class values as products with the pairs'
    # one-hot classes (dense products rather than scatter-adds; no faster measured, within noise)
    one_hot = pm.Data("pair_class_one_hot", np.eye(n_classes)[klass],
                      dims=("pair", "kernel_class"))
    quad = (
        d["class_q"]
        + segment_sum(d["kernel_n"] * delta**2, cls, n_classes)
        + pt.dot(pair_n * beta**2 - 2.0 * beta * r0, one_hot)
    )
    var = resid**2
    logp = pt.sum(-d["class_n"] * pt.log(resid) - quad / (2.0 * var))
    logp = logp - 0.5 * float(d["class_n"].sum()) * np.log(2.0 * np.pi)
    if gpustep is not None:
        a_gs = segment_sum((r0 - pair_n * beta) * pt.dot(one_hot, gpustep / var), pair_gs, n_gs)
        b_gs = segment_sum(pair_n * pt.dot(one_hot, gpustep**2 / var), pair_gs, n_gs)
        core = -0.5 * pt.log1p(b_gs) + a_gs**2 / (2.0 * (1.0 + b_gs))
        if spec.population("gpustep") in EPISODE_POPULATIONS:
            logp = logp + _episode_loglik(core, a_gs, b_gs, gpustep_ref, spec, d)
        else:
            logp = logp + pt.sum(core)
    pm.Potential("kernel_loglik", logp)


def _episode_loglik(core, a_gs, b_gs, scale_ref, spec: ModelSpec, d: dict,
                    grid: tuple[int, int] | None = None):
    """Log likelihood of the GPU-steps under a GPU×step population with episodes.

    The standardised effect z of a GPU-step is N(0, 1) outside an episode, and N(δ, τ²)
    truncated to z > 0 in one (``gpustep_slow_shift`` and ``gpustep_slow_sd``, in core sds;
    the shift and extra spread have half-normal priors on the reference class's log scale, as
    the ``degraded`` unit population's). A share ``gpustep_slow_weight`` of GPU-steps is in an
    episode: independently per GPU-step (``degraded``), or (``lasting``) with the state a
    Markov chain over each GPU's steps of lag-one correlation ``gpustep_episode_persistence``
    (``bayesprism.model.episodes``). An episode slows its GPU-step: untruncated, a wide one
    could also make it faster than the core allows, and a GPU slow in two of three benchmark
    sessions then fitted as "a slow GPU with one fast episode" as well as "a normal GPU with
    two slow ones" (dev fleet benchmark: chains in each, R-hat 1.8 on that GPU's effect).
    ``core`` is each GPU-step's log marginal outside an episode; inside,
    :func:`episode_slow_log`. ``grid``: (GPUs, steps) when ``core``, ``a_gs`` and ``b_gs`` are
    laid out on the (GPU × step) grid, else they are per GPU-step.
    """
    import pymc as pm
    import pytensor.tensor as pt

    weight_start, shift_start, spread_start = episode_start(d)
    weight = pm.Beta("gpustep_slow_weight", 1.0, spec.prior("episode_weight_beta"),
                     initval=weight_start)
    shift_log = pm.HalfNormal("gpustep_episode_shift_log", spec.prior("degraded_shift"),
                              initval=shift_start)
    spread_log = pm.HalfNormal("gpustep_episode_spread_log", spec.prior("degraded_spread"),
                               initval=spread_start)
    delta = pm.Deterministic("gpustep_slow_shift", shift_log / scale_ref)
    tau = pm.Deterministic("gpustep_slow_sd", pt.sqrt(1.0 + (spread_log / scale_ref) ** 2))
    if spec.population("gpustep") != "lasting":  # independent steps: a mixture each
        return pt.sum(episode_log_marginal(core, a_gs, b_gs, weight, delta, tau, pt))
    # started near independent steps, where the share, shift and spread starts are computed:
    # from the prior mean (0.5) a dev-traces chain found a trap where half the GPUs sit in
    # run-long episodes of no shift (persistence 0.996, log density 1,600 below the other)
    persistence = pm.Beta("gpustep_episode_persistence", 1.0,
                          spec.prior("episode_persistence_beta"), initval=0.1)
    slow = episode_slow_log(a_gs, b_gs, delta, tau, pt)
    if grid is not None:  # a GPU's row is its steps in order
        return episode_chain_loglik(core.reshape(grid), slow.reshape(grid), weight,
                                    persistence, d["step_lag"], pt)
    pad = np.zeros(1)  # the sequences' padding: no observation
    index = d["gpustep_sequence"]
    return episode_chain_loglik(pt.concatenate([core, pad])[index],
                                pt.concatenate([slow, pad])[index], weight, persistence,
                                d["gpustep_lag"], pt)


def episode_slow_log(a, b, delta, tau, xp=np):
    """log E[exp(a z − b z²/2)] for z ~ N(δ, τ²) truncated to z > 0: a GPU-step's log
    marginal in an episode (:func:`_episode_loglik`; ``a``, ``b``: the sums of the collapsed
    likelihood), with the array module ``xp`` (NumPy or PyTensor's ``tensor``). In closed form
    exp(L²/(2P) − δ²/(2τ²)) / (τ √P) · Φ(L/√P) / Φ(δ/τ), P = 1/τ² + b, L = δ/τ² + a. A
    GPU-step without launches (a = b = 0) gives 0.

    Examples
    --------
    >>> round(float(episode_slow_log(0.0, 0.0, 5.0, 2.0)), 12)
    0.0
    """
    precision = 1.0 / tau**2 + b
    linear = delta / tau**2 + a
    return (-xp.log(tau) - 0.5 * xp.log(precision) + linear**2 / (2.0 * precision)
            - delta**2 / (2.0 * tau**2)
            + log_ndtr(linear / xp.sqrt(precision), xp) - log_ndtr(delta / tau, xp))


def episode_log_marginal(core, a, b, weight, delta, tau, xp=np):
    """log[(1 − w)·exp(core) + w·exp(:func:`episode_slow_log`)]: a GPU-step's log marginal
    when its episode state is drawn independently of its GPU's other steps (persistence 0).

    Examples
    --------
    >>> round(float(episode_log_marginal(0.0, 0.0, 0.0, 0.1, 5.0, 2.0)), 12)  # no launches
    0.0
    """
    return xp.logaddexp(xp.log1p(-weight) + core,
                        xp.log(weight) + episode_slow_log(a, b, delta, tau, xp))


def log_ndtr(x, xp=np):
    """log Φ(x), the standard normal log CDF, stable in both tails, with the array module
    ``xp`` (NumPy or PyTensor's ``tensor``, which has no ``log_ndtr``: the scaled
    complementary error function keeps the lower tail, log Φ(x) = log(erfcx(−x/√2)/2) − x²/2).

    Examples
    --------
    >>> round(float(log_ndtr(0.0)), 12) == round(float(np.log(0.5)), 12)
    True
    >>> round(float(log_ndtr(-40.0)), 3)
    -804.608
    """
    if xp is np:
        from scipy import special

        return special.log_ndtr(x)
    lower = xp.minimum(x, 0.0)
    upper = xp.maximum(x, 0.0)
    return xp.where(x < 0.0,
                    xp.log(0.5 * xp.erfcx(-lower / np.sqrt(2.0))) - 0.5 * lower**2,
                    xp.log1p(-0.5 * xp.erfc(upper / np.sqrt(2.0))))


def _normal_logp(x, mu: float, sd: float):
    """Sum of Normal(mu, sd) log densities of a tensor's entries."""
    import pytensor.tensor as pt

    return pt.sum(-0.5 * ((x - mu) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2.0 * np.pi))


def _prior_medians(d: dict, spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    """Prior medians of log latency and log bandwidth of each pair (inter tier: times the
    prior inter/intra ratios)."""
    inter = d["coll_pair_tier"] == 1
    log_lat = np.log(spec.prior("coll_latency_us")) + np.where(
        inter, np.log(spec.prior("inter_latency_ratio")), 0.0)
    log_bw = np.log(spec.prior("coll_bandwidth_gbps")) + np.where(
        inter, np.log(spec.prior("inter_bandwidth_ratio")), 0.0)
    return log_lat, log_bw


def _log_share_shape(logit: np.ndarray, log_latency_rel: np.ndarray,
                     log_bytes_rel: np.ndarray) -> np.ndarray:
    """log(σ(s)·ℓ + (1 − σ(s))·f): a cell's log transfer time minus its pair's reference one."""
    return np.logaddexp(-np.logaddexp(0.0, -logit) + log_latency_rel,
                        -np.logaddexp(0.0, logit) + log_bytes_rel)


def small_latency_tiers(d: dict) -> np.ndarray:
    """Tiers (0 intra, 1 inter) whose ρ, the small messages' latency ratio, the cost model
    fits: those where some collective is seen at small and at large sizes
    (``bayesprism.costs.collectives``). In the others small and large messages share one per-step
    latency, as the data cannot tell them apart."""
    small = d.get("coll_cell_small")
    if small is None:
        return np.zeros(0, dtype=np.int64)
    pair = d["coll_cell_pair"]
    per_pair = np.bincount(pair, weights=small)
    mixed = (per_pair > 0) & (per_pair < np.bincount(pair))
    return np.unique(d["coll_pair_tier"][mixed]).astype(np.int64)


def _small_latency_index(d: dict, tiers: np.ndarray) -> np.ndarray:
    """Per cell, the position of its tier's ρ in ``tiers``, or ``len(tiers)`` (no ρ: a large
    message, or a tier whose ρ is not fitted)."""
    position = np.full(2, tiers.size)
    position[tiers] = np.arange(tiers.size)
    return np.where(d["coll_cell_small"] > 0, position[d["coll_cell_tier"]], tiers.size)


def _collective_start(d: dict, spec: ModelSpec) -> tuple[np.ndarray, ...]:
    """Centre and whitening of the cost model's coordinates, and start values of its noise and
    congestion scales (NumPy only).

    The coordinates are, per pair, the log transfer time ``m`` at its reference point and the
    logit ``s`` of its latency share there. Their posterior is far from independent: a pair
    whose sizes are observed unevenly ties ``m`` to ``s``, and the small-message ratio ρ ties
    the pairs of a tier together. A diagonal mass matrix cannot follow
    that, so the model samples ``θ = θ̂ + L·z`` with ``θ̂`` the mode and ``L Lᵀ`` the inverse
    Gauss-Newton information there: of the likelihood with the congestion integrated out
    (exactly as the model does, with noise and congestion scales estimated from the residuals)
    plus the log-latency and log-bandwidth priors, so that a pair with one size, whose ``s``
    the data cannot inform, keeps the prior's scale.

    Where a collective is seen at small and large sizes in a tier (:func:`small_latency_tiers`),
    that tier's ρ, the log ratio of the small messages' per-step latency to the large ones', is
    one more coordinate: the start takes each pair's ``m`` and ``s`` from its large messages
    where it has both, ρ from what its small ones then leave to their latency, and whitens all
    jointly.

    Returns
    -------
    (theta, chol, noise, noise_log_se, congestion)
        ``theta``: the ``m`` of every pair, then the ``s`` of every pair, then the fitted ρ;
        ``chol``: the lower Cholesky factor of their approximate posterior covariance;
        ``noise`` and ``congestion``: the scales estimated from the residuals at the mode, per
        noise scale (``coll_cell_scale``: the collectives, then the benchmarked ones) and per
        congestion scale (``coll_cell_congestion``: the pairs, then the benchmarked), starts
        for the sampler; ``noise_log_se``: the standard error of each noise's log.
    """
    pair = d["coll_cell_pair"]
    n_pairs = len(d["coll_pair_collective"])
    y, n, ss = d["coll_cell_mean"], d["coll_cell_n"], d["coll_cell_ss"]
    lat_rel, bytes_rel = d["coll_cell_log_latency_rel"], d["coll_cell_log_bytes_rel"]
    coll_of_cell, group = d["coll_cell_scale"], d["coll_cell_group"]
    n_coll = int(coll_of_cell.max()) + 1  # noise scales, one per collective+source
    n_groups = int(group.max()) + 1
    n_cong = int(d["coll_cell_congestion"].max()) + 1  # congestion scales: pairs, benchmarks
    cong_of_group = np.zeros(n_groups, dtype=np.int64)
    cong_of_group[group] = d["coll_cell_congestion"]
    launches = np.maximum(np.bincount(coll_of_cell, weights=n, minlength=n_coll), 1.0)
    log_steps = np.log(d["coll_pair_latency_steps"])
    log_factor = np.log(d["coll_pair_bytes_factor"] / 1e3)
    prior_lat, prior_bw = _prior_medians(d, spec)
    prior_prec = 1.0 / spec.prior("coll_log_sd") ** 2
    logit = np.clip(prior_lat + log_steps - (log_factor - prior_bw), -LOGIT_LIMIT, LOGIT_LIMIT)
    rho_tiers = small_latency_tiers(d)
    n_rho = rho_tiers.size
    rho_of_cell = _small_latency_index(d, rho_tiers) if n_rho else np.zeros(y.size, dtype=int)
    small = (rho_of_cell < n_rho).astype(float)  # small messages of a tier with a ρ
    rho_prec = 1.0 / spec.prior("small_latency_log_sd") ** 2
    n_par = 2 * n_pairs + n_rho
    per_pair = np.bincount(pair, weights=small, minlength=n_pairs)
    mixed = (per_pair > 0) & (per_pair < np.bincount(pair, minlength=n_pairs))

    # Starting point: per pair, the logit within the data's profile-likelihood interval
    # nearest to the prior's (the prior's where the pair has one size), unweighted; a pair
    # with small and large messages from its large ones.
    log_time = np.empty(n_pairs)
    grid = np.linspace(-LOGIT_LIMIT, LOGIT_LIMIT, 801)
    for k in range(n_pairs):
        m = (pair == k) & ~(mixed[k] & (small > 0))
        resid = y[m][None, :] - _log_share_shape(grid[:, None], lat_rel[m][None, :],
                                                 bytes_rel[m][None, :])
        rss = ((resid - resid.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
        if np.ptp(rss) > 1e-9 * (1.0 + rss.max()):
            scale = max(rss.min() / m.sum(), 1e-12)
            near = (rss - rss.min()) / (2.0 * scale) <= 2.0
            logit[k] = grid[near][np.argmin(np.abs(grid[near] - logit[k]))]
        log_time[k] = np.mean(y[m] - _log_share_shape(logit[k], lat_rel[m], bytes_rel[m]))
    # ρ: what the small messages of mixed pairs leave to their latency steps, over what the
    # large ones' latency would take there (per tier)
    rho = np.zeros(n_rho)
    for i in range(n_rho):
        m = mixed[pair] & (rho_of_cell == i)
        k = pair[m]
        rest = np.exp(y[m] - log_time[k]) - np.exp(-np.logaddexp(0.0, logit[k]) + bytes_rel[m])
        rho[i] = np.median(np.log(np.maximum(rest, 1e-3)) + np.logaddexp(0.0, -logit[k])
                           - lat_rel[m])
    rho_cells = np.eye(n_rho + 1)[rho_of_cell][:, :n_rho]  # (cell, ρ) indicator

    # Gauss-Newton on the collapsed likelihood (cell means ȳ ~ N(μ, noise²/n) plus a shared
    # N(0, congestion²) shift per group; Woodbury per group) and the priors.
    cols = np.arange(pair.size)

    def information(log_time: np.ndarray, logit: np.ndarray,
                    rho: np.ndarray) -> tuple[np.ndarray, ...]:
        """Gauss-Newton information and score of (m, s[, ρ]), the noise and congestion
        variances (per scale) re-estimated at the point, floored, and the noise's unfloored."""
        share = 1.0 / (1.0 + np.exp(-logit))
        lat_eff = lat_rel + rho_cells @ rho
        h = _log_share_shape(logit[pair], lat_eff, bytes_rel)
        r = y - log_time[pair] - h
        # scales: pooled within-group spread per collective, and the groups' mean shifts per
        # congestion scale
        n_g = np.bincount(group, weights=n, minlength=n_groups)
        r_g = np.bincount(group, weights=n * r, minlength=n_groups) / n_g
        spread = ss + n * (r - r_g[group]) ** 2
        # floors (noise 1 %, congestion 0.1 %): without replicates the data give no scale,
        # and a zero one would make the whitening collapse the coordinates
        noise2_data = np.bincount(coll_of_cell, weights=spread, minlength=n_coll) / launches
        noise2 = np.maximum(noise2_data, 1e-4)
        noise2_g = (np.bincount(group, weights=n * noise2[coll_of_cell], minlength=n_groups)
                    / n_g)
        shift2 = np.maximum(r_g**2 - noise2_g / n_g, 0.0)
        cong2 = np.maximum(np.bincount(cong_of_group, weights=shift2, minlength=n_cong)
                           / np.maximum(np.bincount(cong_of_group, minlength=n_cong), 1), 1e-6)
        jac = np.zeros((pair.size, n_par))
        jac[cols, pair] = 1.0
        # d log(σℓ + (1−σ)f) / ds = (latency share at the cell) − (share at the reference)
        cell_share = np.exp(-np.logaddexp(0.0, -logit[pair]) + lat_eff - h)
        jac[cols, n_pairs + pair] = cell_share - share[pair]
        jac[:, 2 * n_pairs:] = rho_cells * cell_share[:, None]
        u = n / noise2[coll_of_cell]
        a_g = np.zeros((n_groups, n_par))
        np.add.at(a_g, group, u[:, None] * jac)
        u_g = np.bincount(group, weights=u, minlength=n_groups)
        ru_g = np.bincount(group, weights=u * r, minlength=n_groups)
        k_g = cong2[cong_of_group] / (1.0 + cong2[cong_of_group] * u_g)
        info = jac.T @ (u[:, None] * jac) - (a_g * k_g[:, None]).T @ a_g
        score = jac.T @ (u * r) - (a_g * k_g[:, None]).T @ ru_g
        # priors on log latency = m + log σ(s) − log steps, log bandwidth = log f − m − log(1−σ)
        dev_lat = log_time - np.logaddexp(0.0, -logit) - log_steps - prior_lat
        dev_bw = log_factor - log_time + np.logaddexp(0.0, logit) - prior_bw
        im, is_ = np.arange(n_pairs), n_pairs + np.arange(n_pairs)
        info[im, im] += 2.0 * prior_prec
        info[is_, is_] += ((1.0 - share) ** 2 + share**2) * prior_prec
        info[im, is_] += (1.0 - 2.0 * share) * prior_prec
        info[is_, im] += (1.0 - 2.0 * share) * prior_prec
        score[:n_pairs] -= (dev_lat - dev_bw) * prior_prec
        score[n_pairs:2 * n_pairs] -= ((1.0 - share) * dev_lat + share * dev_bw) * prior_prec
        rho_at = 2 * n_pairs + np.arange(n_rho)
        info[rho_at, rho_at] += rho_prec
        score[rho_at] -= rho * rho_prec
        return info, score, noise2, cong2, noise2_data

    for _ in range(GAUSS_NEWTON_STEPS):
        info, score, *_ = information(log_time, logit, rho)
        step = np.clip(np.linalg.solve(info, score), -1.0, 1.0)  # damped: s can meet a wall
        log_time = log_time + step[:n_pairs]
        logit = np.clip(logit + step[n_pairs:2 * n_pairs], -LOGIT_LIMIT, LOGIT_LIMIT)
        rho = rho + step[2 * n_pairs:]
        if np.abs(step).max() < 1e-8:
            break
    info, _, noise2, cong2, noise2_data = information(log_time, logit, rho)
    lat_rel = lat_rel + rho_cells @ rho
    try:
        cov = np.linalg.inv(info)
    except np.linalg.LinAlgError:
        cov = np.diag(1.0 / np.maximum(np.diag(info), 1e-12))
    cov = 0.5 * (cov + cov.T)

    # The curvature at the mode describes the logit s badly where the data bound the latency
    # share on one side only (two sizes, both bandwidth-bound: a steep wall above, the prior's
    # slope below) or not at all (one size: the prior's skewed shape). Centre and scale each
    # s by its profile posterior on a grid instead (m profiled out, congestion integrated as
    # above, the other pairs held at the mode), keeping the correlations of the curvature.
    fine = np.sqrt(np.maximum(np.diag(cov)[n_pairs:], 1e-12))
    for k in range(n_pairs):
        m = pair == k
        grid = np.unique(np.concatenate([
            np.linspace(-LOGIT_LIMIT, LOGIT_LIMIT, 801),
            np.clip(logit[k] + fine[k] * np.linspace(-10.0, 10.0, 401), -LOGIT_LIMIT,
                    LOGIT_LIMIT)]))
        r = y[m][None, :] - _log_share_shape(grid[:, None], lat_rel[m][None, :],
                                             bytes_rel[m][None, :])
        u = n[m] / noise2[coll_of_cell[m]]
        g_codes, g = np.unique(group[m], return_inverse=True)
        onehot = np.zeros((m.sum(), g_codes.size))
        onehot[np.arange(m.sum()), g] = 1.0
        u_g = u @ onehot
        k_g = cong2[cong_of_group[g_codes]] / (1.0 + cong2[cong_of_group[g_codes]] * u_g)
        # m̂(s): the generalised least squares level of the pair's cells
        r_g = (r * u) @ onehot
        level = ((r_g * (1.0 - k_g * u_g)).sum(axis=1)
                 / (u_g * (1.0 - k_g * u_g)).sum())
        e = r - level[:, None]
        quad = (u * e**2).sum(axis=1) - (k_g * ((e * u) @ onehot) ** 2).sum(axis=1)
        lat = level - np.logaddexp(0.0, -grid) - log_steps[k] - prior_lat[k]
        bw = log_factor[k] - level + np.logaddexp(0.0, grid) - prior_bw[k]
        lp = -0.5 * quad - 0.5 * prior_prec * (lat**2 + bw**2)
        weight = np.exp(lp - lp.max()) * np.gradient(grid)
        weight /= weight.sum()
        centre = float(weight @ grid)
        sd = float(np.sqrt(weight @ (grid - centre) ** 2))
        if sd > 0.0:
            scale = sd / np.sqrt(cov[n_pairs + k, n_pairs + k])
            cov[n_pairs + k, :] *= scale
            cov[:, n_pairs + k] *= scale
            logit[k] = centre
            log_time[k] = float(np.interp(centre, grid, level))
    theta = np.concatenate([log_time, logit, rho])
    try:
        chol = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        chol = np.diag(np.sqrt(np.maximum(np.diag(cov), 1e-12)))
    # start scales: the noise unfloored (a start, not a whitening; 1e-4 keeps its log finite),
    # with the standard error of its log, 1 / sqrt(2 n)
    return (theta, chol, np.sqrt(np.maximum(noise2_data, 1e-8)), 1.0 / np.sqrt(2.0 * launches),
            np.sqrt(cong2))


def _collective_part(prepared: PreparedData, spec: ModelSpec) -> None:
    """Ring cost model per (collective, tier), sampled at data-centred reference points.

    The latency/bandwidth ridge (``t = α·steps(p) + b·factor(p)/β``) is parameterised per
    observed (collective, tier) pair by the log transfer time ``m`` at the pair's reference
    point (:func:`_prepare_collectives`) and the logit ``s`` of the latency share there:
    ``log α = m + log σ(s) − log steps_ref``, ``log β = log bytes_ref − m − log(1 − σ(s))``.
    The data pin ``m``; ``s`` only as far as the sizes around the reference differ, and where
    they do not (one group size and bytes value) it is prior-only, a smooth direction with no
    funnel. The map has Jacobian 1, so the priors on log latency, log bandwidth and the
    inter/intra ratios (``ModelSpec`` priors) are the same densities as on the plain
    parameters: this is a change of coordinates, not of model. A tier never observed for a
    collective is the mean of the collectives observed at that tier times a sampled ratio (of
    prior median 1), else its observed tier times the prior inter/intra ratio, sampled. Noise
    and the per-step congestion (integrated out in closed form) are as before.

    Fabric: an inter-node group spanning ``n`` nodes moves its bytes at the tier's bandwidth
    times ``(n / 2)^-γ`` (``coll_fabric_exponent``, one for the whole network, half-normal
    prior): rings over more nodes cross more switches and share more links, so bus bandwidth
    falls with the nodes spanned (nccl-tests sweeps over node counts pin γ; a trace of one
    group size leaves it to its prior, and forecasts at many more nodes carry that).

    Small messages (``costs.collectives.SMALL_MESSAGE_BYTES``) take their latency steps at
    ``exp(ρ)`` times the per-step latency, ``ρ = coll_small_latency_log_ratio`` ~ N(0,
    ``small_latency_log_sd``), one per tier for all its collectives, where a collective of the
    tier is seen at both sizes (a traced tensor-parallel all-reduce of 16 KiB beside nccl-tests
    from 1 MiB); 0 in a tier without. One per-step latency for both sizes made a bimodal
    posterior on the dev job, each mode misfitting one of them; one ρ for both tiers left the
    nccl-tests' intra-node all-reduce 40 % slower than fitted (their small-message ratios
    differ: 0.43 intra, 0.69 inter). ``coll_latency_us`` is the large messages' latency.
    """
    import pymc as pm
    import pytensor.tensor as pt

    d = prepared.data
    n_coll = len(prepared.coords["collective"])
    pair = d["coll_cell_pair"]
    pair_coll, pair_tier = d["coll_pair_collective"], d["coll_pair_tier"]
    n_pairs = len(pair_coll)
    pm.Data("coll_cell_n", d["coll_cell_n"], dims="coll_cell")
    pm.Data("coll_cell_mean_log", d["coll_cell_mean"], dims="coll_cell")
    pm.Data("coll_cell_ss_log", d["coll_cell_ss"], dims="coll_cell")
    pm.Data("coll_reference_latency_steps", d["coll_pair_latency_steps"], dims="coll_pair")
    pm.Data("coll_reference_bus_bytes", d["coll_pair_bytes_factor"], dims="coll_pair")

    theta_hat, chol, noise_start, noise_se, congestion_start = _collective_start(d, spec)
    rho_tiers = small_latency_tiers(d)
    pm.modelcontext(None).add_coord(
        "coll_coef", [f"{kind}:{label}" for kind in ("log_time", "logit_share")
                      for label in prepared.coords["coll_pair"]]
        + [f"small_latency_log_ratio:{coll.TIERS[t]}" for t in rho_tiers])
    theta = theta_hat + pt.dot(chol, pm.Flat("coll_cost_coef", dims="coll_coef"))
    log_time, logit = theta[:n_pairs], theta[n_pairs:2 * n_pairs]
    # small messages' latency steps at exp(ρ) times the per-step latency (collectives); a
    # tier without a fitted ρ keeps 0, one latency for both sizes
    log_latency_rel = d["coll_cell_log_latency_rel"]
    rho_prior = 0.0
    if rho_tiers.size:
        rho = pt.zeros(2)[rho_tiers].set(theta[2 * n_pairs:])
        pm.Deterministic("coll_small_latency_log_ratio", rho, dims="tier")
        log_latency_rel = log_latency_rel + pt.concatenate([rho[rho_tiers], pt.zeros(1)])[
            _small_latency_index(d, rho_tiers)]
        rho_prior = _normal_logp(rho[rho_tiers], 0.0, spec.prior("small_latency_log_sd"))
    log_share, log_rest = -pt.softplus(-logit), -pt.softplus(logit)
    pm.Deterministic("coll_reference_us", pt.exp(log_time), dims="coll_pair")
    pm.Deterministic("coll_latency_share", pt.sigmoid(logit), dims="coll_pair")
    pair_log_lat = log_time + log_share - np.log(d["coll_pair_latency_steps"])
    pair_log_bw = np.log(d["coll_pair_bytes_factor"] / 1e3) - log_time - log_rest

    # (collective, tier) → position in the pairs, then in the extrapolated tiers.
    where = np.full((n_coll, 2), -1, dtype=np.int64)
    where[pair_coll, pair_tier] = np.arange(n_pairs)
    one_tier = np.flatnonzero((where < 0).any(axis=1))
    lat_parts, bw_parts = [pair_log_lat], [pair_log_bw]
    lat_mu, bw_mu = np.log(spec.prior("coll_latency_us")), np.log(spec.prior("coll_bandwidth_gbps"))
    ratio_lat = np.log(spec.prior("inter_latency_ratio"))
    ratio_bw = np.log(spec.prior("inter_bandwidth_ratio"))
    sd, rsd = spec.prior("coll_log_sd"), spec.prior("tier_ratio_log_sd")
    borrowed_intra = np.zeros(0, dtype=np.int64)  # collectives whose intra tier is borrowed
    if one_tier.size:
        # A tier never observed for a collective is, where other collectives were observed at
        # it, their mean (log) latency and bandwidth times a ratio of prior median 1: a tier's
        # links and NICs set every ring's bus bandwidth (the dev job's inter-node all-gather,
        # reduce-scatter and pipeline transfers: 43-50 GB/s), where the intra-node tier says
        # little of them (NVLink's 400-480 GB/s there). Else it is the collective's observed
        # tier times an inter/intra ratio with a prior.
        pm.modelcontext(None).add_coord(
            "coll_extrapolated", [prepared.coords["collective"][c] for c in one_tier])
        missing = (where[one_tier] < 0).argmax(axis=1)
        source = where[one_tier, 1 - missing]
        sign = np.where(missing == 1, 1.0, -1.0)
        donors = [where[where[:, t] >= 0, t] for t in range(2)]
        borrowed = np.array([donors[t].size > 0 for t in missing])
        r_lat = pm.Normal("coll_log_latency_ratio", np.where(borrowed, 0.0, ratio_lat), rsd,
                          dims="coll_extrapolated")
        r_bw = pm.Normal("coll_log_bandwidth_ratio", np.where(borrowed, 0.0, ratio_bw), rsd,
                         dims="coll_extrapolated")
        for parts, pair_log, ratio in ((lat_parts, pair_log_lat, r_lat),
                                       (bw_parts, pair_log_bw, r_bw)):
            tier_mean = pt.stack([pt.mean(pair_log[d]) if d.size else pt.constant(0.0)
                                  for d in donors])
            parts.append(pt.where(borrowed, tier_mean[missing], pair_log[source])
                         + pt.where(borrowed, 1.0, sign) * ratio)
        where[one_tier, missing] = n_pairs + np.arange(one_tier.size)
        borrowed_intra = one_tier[borrowed & (missing == 0)]
    log_lat = pt.concatenate(lat_parts)[where]
    log_bw = pt.concatenate(bw_parts)[where]
    # The priors of the plain parameters: intra latency and bandwidth, and the inter/intra
    # ratios of collectives with both tiers observed (the others sample their ratio above).
    # A collective observed across nodes only whose intra tier is borrowed from the others
    # (above) keeps the prior its intra tier would have given it: N(intra prior + ratio prior,
    # sd² + ratio sd²) on its inter tier, else the logit of a single-size pair is improper.
    both = np.flatnonzero((where < n_pairs).all(axis=1))
    own = np.setdiff1d(np.arange(n_coll), borrowed_intra)
    inter_sd = float(np.hypot(sd, rsd))
    prior = (_normal_logp(log_lat[own, 0], lat_mu, sd) + _normal_logp(log_bw[own, 0], bw_mu, sd)
             + _normal_logp(log_lat[borrowed_intra, 1], lat_mu + ratio_lat, inter_sd)
             + _normal_logp(log_bw[borrowed_intra, 1], bw_mu + ratio_bw, inter_sd)
             + _normal_logp(log_lat[both, 1] - log_lat[both, 0], ratio_lat, rsd)
             + _normal_logp(log_bw[both, 1] - log_bw[both, 0], ratio_bw, rsd) + rho_prior)
    pm.Potential("coll_prior", prior)
    pm.Deterministic("coll_latency_us", pt.exp(log_lat), dims=("collective", "tier"))
    pm.Deterministic("coll_bandwidth_gbps", pt.exp(log_bw), dims=("collective", "tier"))
    # Start the scales at the residuals' estimates: the prior's support point (noise 0.3)
    # sits ~500k log units below the typical set of the dev traces' collective launches (noise
    # ≈ 0.02), which cost nutpie's first 50 warm-up draws about 270 leapfrog steps each. The
    # noise, pinned by each collective's launches, is sampled in data-scaled coordinates.
    # (Every collective and benchmarked collective has cells: the starts cover all scales.)
    noise = data_scaled_half_normal("coll_noise", spec.prior("coll_noise"),
                                    noise_start[:n_coll], noise_se[:n_coll], "collective")
    congestion = pm.HalfNormal("coll_congestion", spec.prior("coll_congestion"),
                               dims="coll_pair", initval=congestion_start[:n_pairs])
    if "coll_benchmarked" in prepared.coords:
        noise = pt.concatenate([noise, data_scaled_half_normal(
            "coll_bench_noise", spec.prior("coll_noise"), noise_start[n_coll:],
            noise_se[n_coll:], "coll_benchmarked")])
        congestion = pt.concatenate([congestion, pm.HalfNormal(
            "coll_bench_congestion", spec.prior("coll_congestion"), dims="coll_benchmarked",
            initval=congestion_start[n_pairs:])])

    log_bytes_rel = d["coll_cell_log_bytes_rel"]
    if np.any(d["coll_cell_log_nodes_rel"] > 0):  # else the prior alone (forecast.workload)
        fabric = pm.HalfNormal("coll_fabric_exponent", spec.prior("fabric_exponent"))
        log_bytes_rel = log_bytes_rel + fabric * d["coll_cell_log_nodes_rel"]
    j = d["coll_cell_scale"]
    mu = log_time[pair] + pt.logaddexp(log_share[pair] + log_latency_rel,
                                       log_rest[pair] + log_bytes_rel)
    n, mean, ss = d["coll_cell_n"], d["coll_cell_mean"], d["coll_cell_ss"]
    var = noise[j] ** 2
    group = d["coll_cell_group"]
    n_groups = int(group.max()) + 1
    c = congestion[d["coll_cell_congestion"]]
    b_g = segment_sum(c**2 * n / var, group, n_groups)
    unit, inter_unit = d["coll_cell_unit"], d["coll_unit_inter"]
    n_units = inter_unit.size
    unit_of_group = np.zeros(n_groups, dtype=np.int64)
    unit_of_group[group] = unit

    def unit_loglik(mu):
        """Log likelihood of each degraded-link unit's cells given their log means, with the
        per-step congestion of each (collective, tier) integrated out."""
        cell = (-0.5 * n * np.log(2.0 * np.pi) - n * pt.log(noise[j])
                - (ss + n * (mean - mu) ** 2) / (2.0 * var))
        a_g = segment_sum(c * n * (mean - mu) / var, group, n_groups)
        shared = -0.5 * pt.log1p(b_g) + a_g**2 / (2.0 * (1.0 + b_g))
        return (segment_sum(cell, unit, n_units)
                + segment_sum(shared, unit_of_group, n_units))

    normal = unit_loglik(mu)
    if inter_unit.sum() < DEGRADED_MIN_UNITS:
        pm.Potential("collective_loglik", pt.sum(normal))
        return
    # Degraded links (a mixture over units, marginalised): each node of a unit's allocation
    # has a degraded inter-node link with probability r, independently; a unit with one
    # moves the bytes of all its inter-node transfers exp(δ) times slower. Only with several
    # units: with one (a lone traced job), "degraded at a higher bandwidth" fits its transfers
    # as well as "normal", and with two "which one" is a second mode; r and δ then keep their
    # priors (bayesprism.forecast.workload).
    rate = pm.Beta("coll_degraded_rate", 1.0, spec.prior("degraded_link_beta"))
    slowdown = pm.HalfNormal("coll_degraded_log_slowdown", spec.prior("degraded_link_slowdown"))
    inter_cell = (d["coll_cell_tier"] == 1).astype(float)
    mu_slow = log_time[pair] + pt.logaddexp(log_share[pair] + log_latency_rel,
                                            log_rest[pair] + log_bytes_rel + slowdown * inter_cell)
    slow = unit_loglik(mu_slow)
    log_clean = d["coll_unit_nodes"][inter_unit] * pt.log1p(-rate)
    mixed = pt.logaddexp(log_clean + normal[inter_unit],
                         pt.log(-pt.expm1(log_clean)) + slow[inter_unit])
    pm.Potential("collective_loglik", pt.sum(normal[~inter_unit]) + pt.sum(mixed))
