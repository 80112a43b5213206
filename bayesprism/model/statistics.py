"""What the kernel model reads of trace tables: sufficient statistics of cells.

:func:`table_statistics` reduces trace tables to :class:`ModelStatistics`, and
:func:`bayesprism.model.kernel.prepare_kernel_statistics` prepares the model from them alone,
so a fit from the tables and a fit from their statistics (saved and read back,
:mod:`bayesprism.statistics`) prepare the same arrays, bit for bit.

* **Kernel cells**: every launch (collectives included) grouped by run, node, local GPU, step,
  kernel, class and two flags that decide, per spec, whether a launch is fitted as a kernel:
  ``usable`` (a collective the cost model can use: transfer, bytes and group size known) and
  ``fixed_role`` (a tp/cp/ep collective, fitted as a kernel too). Per cell: launches ``n``,
  those whose value is the transfer part (``transfer_n``), and the mean and sum of squared
  deviations of the log value (the transfer where ingest split off the waiting, else the
  duration). For Gaussian residuals on the log scale that is everything the rows carry.
* **Collective cells**: the usable collectives grouped by collective, tier, NCCL algorithm,
  group size, nodes spanned, bytes, run and step: ``n``, mean and spread of log transfer time.
  Tiers and nodes spanned are decided here, from each table's rows (GPUs per node, the nodes
  of each process group).
* **Facts**: the (node, cabinet) pairs and the runs of micro-benchmarks.

A launch sits in one kernel cell; the model's cell (kernel × GPU-step) is one such cell, or
several that differ in the flags only (then merged with the pooled-variance formula).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bayesprism.costs import collectives as coll
from bayesprism.errors import InputError, Problem
from bayesprism.model.cells import aggregate_cells

REQUIRED = ("run", "step", "node", "gpu", "kernel", "kernel_class", "duration_us")
#: Roles whose collectives keep their group and messages when data parallelism grows and run
#: inside one node's clock domain, so their measured transfers are trustworthy per launch.
#: Pipeline send/recv crosses nodes, whose clocks disagree by about a transfer's duration
#: (the wait/transfer split of one launch is then noise): the cost model alone covers it.
FIXED_GROUP_ROLES: tuple[str, ...] = ("tp", "cp", "ep")
#: Columns of :attr:`ModelStatistics.kernel_cells`, in order.
KERNEL_CELL_COLUMNS: tuple[str, ...] = (
    "run", "node", "gpu", "step", "kernel", "kernel_class", "usable", "fixed_role", "n",
    "transfer_n", "mean_log", "ss_log")
#: Columns of :attr:`ModelStatistics.collective_cells`, in order.
COLLECTIVE_CELL_COLUMNS: tuple[str, ...] = (
    "collective", "tier", "algorithm", "group_size", "nodes", "bytes", "run", "step", "n",
    "mean_log", "ss_log")


@dataclass(frozen=True)
class ModelStatistics:
    """Sufficient statistics of trace tables for the kernel model (module docstring).

    Attributes
    ----------
    kernel_cells
        One row per kernel cell, columns :data:`KERNEL_CELL_COLUMNS`.
    collective_cells
        One row per collective cell, columns :data:`COLLECTIVE_CELL_COLUMNS`.
    node_cabinets
        Distinct (node, cabinet) pairs of the tables' ``cabinet`` columns, None when no table
        has one.
    benchmark_runs
        Runs whose metadata marks them as micro-benchmarks (their collectives get noise and
        congestion scales of their own).
    row_cell, row_log
        Per launch, in table order: its kernel cell and log value (None for statistics read
        from a file: the row-level likelihoods need them).
    """

    kernel_cells: pd.DataFrame
    collective_cells: pd.DataFrame
    node_cabinets: tuple[tuple[str, str], ...] | None = None
    benchmark_runs: tuple[str, ...] = ()
    row_cell: np.ndarray | None = None
    row_log: np.ndarray | None = None

    @property
    def has_rows(self) -> bool:
        """Whether the launches themselves are kept (fits of the row likelihoods)."""
        return self.row_cell is not None

    def without_rows(self) -> ModelStatistics:
        """The same statistics without the per-launch arrays."""
        return ModelStatistics(self.kernel_cells, self.collective_cells, self.node_cabinets,
                               self.benchmark_runs)


# ----------------------------------------------------------------------------- helpers
def _categorical(series: pd.Series) -> tuple[np.ndarray, list[str]]:
    """Integer codes and string labels of a column (NaN → code -1)."""
    cat = series if isinstance(series.dtype, pd.CategoricalDtype) else series.astype("category")
    return cat.cat.codes.to_numpy().astype(np.int64), [str(c) for c in cat.cat.categories]


def _global_codes(parts: list[tuple[np.ndarray, list[str]]]) -> tuple[list[np.ndarray], list[str]]:
    """Re-code per-table categorical codes onto the sorted union of their labels."""
    labels = sorted({lab for _, labs in parts for lab in labs})
    index = {lab: i for i, lab in enumerate(labels)}
    out = []
    for codes, labs in parts:
        lookup = np.array([index[lab] for lab in labs] + [-1], dtype=np.int64)
        out.append(lookup[codes])  # code -1 picks the trailing -1
    return out, labels


def factorize(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of ``key`` on its sorted distinct values, and those values.

    Examples
    --------
    >>> codes, values = factorize(np.array([30, 10, 30]))
    >>> codes.tolist(), values.tolist()
    ([1, 0, 1], [10, 30])
    """
    codes, uniques = pd.factorize(key, sort=True)
    return codes.astype(np.int64), np.asarray(uniques)


def _source(table: pd.DataFrame, i: int) -> str:
    return str(table.attrs.get("source", f"table {i}"))


def check_tables(tables: Sequence[pd.DataFrame]) -> None:
    """Refuse tables the kernel model cannot read (every problem at once).

    Raises
    ------
    InputError
        No table, not a DataFrame, required columns or values missing, bad GPU or step
        indices or durations, step-level rows.

    Examples
    --------
    >>> check_tables([pd.DataFrame({"run": ["r"]})])
    Traceback (most recent call last):
    ...
    bayesprism.errors.InputError: table 0: step, ... required column(s) missing
    """
    problems: list[Problem] = []
    if not tables:
        raise InputError(Problem("tables", "", "no table given"))
    for i, t in enumerate(tables):
        src = _source(t, i) if isinstance(t, pd.DataFrame) else f"table {i}"
        if not isinstance(t, pd.DataFrame):
            problems.append(Problem(src, "", "is not a pandas DataFrame",
                                    example=type(t).__name__))
            continue
        missing = [c for c in REQUIRED if c not in t.columns]
        if missing:
            problems.append(Problem(src, ", ".join(missing), "required column(s) missing"))
            continue
        for col in ("run", "node", "kernel", "kernel_class"):
            missing_values = t[col].isna().to_numpy()
            if missing_values.any():
                problems.append(Problem(src, col, "is missing", int(missing_values.sum())))
        for col in ("gpu", "step"):
            values = pd.to_numeric(t[col], errors="coerce").to_numpy(dtype=float)
            bad = ~(np.isfinite(values) & (values >= 0) & (values == np.round(values)))
            if bad.any():
                problems.append(Problem(src, col, "must be an integer >= 0", int(bad.sum()),
                                        t[col].to_numpy()[bad][0]))
        d = pd.to_numeric(t["duration_us"], errors="coerce").to_numpy(dtype=float)
        bad = ~(np.isfinite(d) & (d > 0))
        if bad.any():
            problems.append(Problem(src, "duration_us", "must be a finite number > 0",
                                    int(bad.sum()), t["duration_us"].to_numpy()[bad][0]))
        kernel_class = t["kernel_class"]
        if isinstance(kernel_class.dtype, pd.CategoricalDtype):  # 10 M strings cost seconds
            step_code = (kernel_class.cat.categories.astype(str) == "step").nonzero()[0]
            step_rows = np.isin(kernel_class.cat.codes.to_numpy(), step_code)
        else:
            step_rows = (kernel_class.astype(str) == "step").to_numpy()
        if step_rows.any():
            problems.append(Problem(
                src, "kernel_class",
                "step-level rows belong to the step model: fit them with --spec step "
                "(ModelSpec.load('step'))", int(step_rows.sum()), "step"))
    if problems:
        raise InputError(problems)


def _gpus_per_node(table: pd.DataFrame, run_codes: np.ndarray, run_labels: list[str],
                   gpu: np.ndarray, stated: dict[str, float] | None = None) -> np.ndarray:
    """GPUs per node of each row's run: from run metadata, else ``stated``, else the largest
    local index + 1."""
    runs_meta = table.attrs.get("runs", {}) if isinstance(table.attrs, dict) else {}
    per_run = np.zeros(len(run_labels) + 1, dtype=float)
    for r, label in enumerate(run_labels):
        meta = runs_meta.get(label, {}) if isinstance(runs_meta, dict) else {}
        value = meta.get("gpus_per_node") if isinstance(meta, dict) else None
        value = value or (stated or {}).get(label)
        if value:
            per_run[r] = float(value)
        else:
            mask = run_codes == r
            per_run[r] = float(gpu[mask].max() + 1) if mask.any() else 1.0
    return per_run[run_codes]


def _collective_rows(t: pd.DataFrame, classes: np.ndarray, class_labels: list[str],
                     gpus_per_node: dict[str, float] | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Collective rows usable by the cost model, every row's tier and nodes spanned.

    A row is usable with a collective class, a positive ``transfer_us`` and ``bytes`` and
    ``group_size >= 2``. Its tier is inter-node (1) when its group has more ranks than a node
    of its run has GPUs (``gpus_per_node`` of the run metadata, else the largest local GPU
    index + 1), or when its ``process_group`` has rows from several nodes in this table; else
    intra-node (0). The ``role`` column is not used: a pipeline send/recv pair of
    ``group_size`` 2 is inter-node when its process group's rows come from two nodes. The nodes
    a row's group spans are the larger of ``ceil(group_size / gpus_per_node)`` and its process
    group's nodes in this table (a data-parallel group of one GPU per node spans as many nodes
    as it has ranks); a send/recv spans at most two.

    Returns
    -------
    (usable, tier, nodes)
        Boolean mask, integer tiers and nodes spanned (at least 1), one per row.
    """
    n = len(t)
    # Look up per class code, never per row: 10^7 string comparisons cost seconds.
    is_coll = np.array([c in coll.COLLECTIVE_CLASSES for c in class_labels] + [False])[classes]
    if not {"transfer_us", "bytes", "group_size"} <= set(t.columns):
        return np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)
    transfer = pd.to_numeric(t["transfer_us"], errors="coerce").to_numpy(dtype=float)
    nbytes = pd.to_numeric(t["bytes"], errors="coerce").to_numpy(dtype=float)
    group = pd.to_numeric(t["group_size"], errors="coerce").to_numpy(dtype=float)
    usable = (is_coll & np.isfinite(transfer) & (transfer > 0) & np.isfinite(nbytes)
              & (nbytes > 0) & np.isfinite(group) & (group >= 2))
    run_codes, run_labels = _categorical(t["run"])
    gpu = t["gpu"].to_numpy(dtype=np.int64)
    per_node = _gpus_per_node(t, run_codes, run_labels, gpu, gpus_per_node)
    tier = (np.nan_to_num(group, nan=1.0) > per_node).astype(np.int64)
    nodes = np.maximum(np.ceil(np.nan_to_num(group, nan=1.0) / per_node), 1.0).astype(np.int64)
    named = usable & t["process_group"].notna().to_numpy() if "process_group" in t.columns \
        else np.zeros(n, dtype=bool)
    if named.any():
        # A process group whose rows in this table come from several nodes spans nodes. Rows
        # without a group name (benchmarks, which time a whole group from one host) are no
        # group of their own (said explicitly: whether astype(str) keeps NaN or writes "nan",
        # which would pool them into one group spanning all hosts, depends on pandas).
        spans = (
            t.loc[named, ["run", "process_group", "node"]]
            .astype(str)
            .groupby(["run", "process_group"])["node"]
            .transform("nunique")
            .to_numpy()
        )
        tier[named] = np.maximum(tier[named], (spans > 1).astype(np.int64))
        nodes[named] = np.maximum(nodes[named], spans)
    # A send/recv moves its bytes between two ranks, over one link whatever its process group
    # spans (a pipeline group spans a node per stage): at most two nodes, as the forecast
    # costs it; the fabric exponent's argument was log(4 / 2) for the dev job's.
    is_p2p = np.array([c == "sendrecv" for c in class_labels] + [False])[classes]
    nodes[is_p2p] = np.minimum(nodes[is_p2p], 2)
    return usable, tier, nodes


def _numeric(tables: Sequence[pd.DataFrame], column: str) -> np.ndarray:
    return np.concatenate([
        pd.to_numeric(t[column], errors="coerce").to_numpy(dtype=float)
        if column in t.columns else np.full(len(t), np.nan) for t in tables])


# ----------------------------------------------------------------------------- reduction
def table_statistics(tables: Sequence[pd.DataFrame] | pd.DataFrame,
                     keep_rows: bool = False) -> ModelStatistics:
    """Reduce trace tables to the statistics the kernel model reads (module docstring).

    The streaming reduction (:func:`batch_statistics`, :func:`merge_statistics`) applied to
    one batch: the tables.

    Parameters
    ----------
    tables
        Trace tables (one or several sources), with ``kernel`` the name the model fits (the
        signature: :func:`bayesprism.schema.signature_as_kernel`).
    keep_rows
        Also keep each launch's cell and log value (the row-level likelihoods).

    Returns
    -------
    ModelStatistics

    Raises
    ------
    InputError
        Tables the kernel model cannot read (:func:`check_tables`).

    Examples
    --------
    >>> import pandas as pd
    >>> table = pd.DataFrame({"run": ["r"] * 3, "step": [0, 0, 1], "node": ["n0"] * 3,
    ...                       "gpu": [0, 0, 0], "kernel": ["gemm"] * 3,
    ...                       "kernel_class": ["gemm"] * 3, "duration_us": [10.0, 20.0, 5.0]})
    >>> stats = table_statistics(table)
    >>> stats.kernel_cells[["step", "n"]].to_numpy().tolist()
    [[0, 2], [1, 1]]
    """
    batch = batch_statistics(tables, keep_rows=keep_rows)
    merged, cell_of = _merged(batch.kernel_cells, KERNEL_KEYS)
    collective, _ = _merged(batch.collective_cells, COLLECTIVE_KEYS)
    return ModelStatistics(
        kernel_cells=merged, collective_cells=collective, node_cabinets=batch.node_cabinets,
        benchmark_runs=batch.benchmark_runs,
        row_cell=None if batch.row_cell is None else cell_of[batch.row_cell],
        row_log=batch.row_log)


def batch_statistics(tables: Sequence[pd.DataFrame] | pd.DataFrame, keep_rows: bool = False,
                     *, gpus_per_node: dict[str, float] | None = None) -> ModelStatistics:
    """The statistics of one batch of rows (a file, or whole tables), to be merged with
    those of other batches by :func:`merge_statistics`.

    Kernel cells are labelled by the ``kernel`` column as given: place keys, in a file read
    before the kernel signatures are decided across all files (renamed by
    :func:`merge_statistics`). Cells are sorted as :func:`table_statistics` sorts them.

    Parameters
    ----------
    tables, keep_rows
        As in :func:`table_statistics`.
    gpus_per_node
        Run → GPUs per node, where the run metadata lacks it and the batch does not hold all
        of the run's GPUs (the collective rows of a streamed read): decides the collectives'
        tiers as the whole table would.

    Returns
    -------
    ModelStatistics

    Examples
    --------
    >>> import pandas as pd
    >>> table = pd.DataFrame({"run": ["r"] * 2, "step": [0, 0], "node": ["n0"] * 2,
    ...                       "gpu": [0, 0], "kernel": ["k1", "k2"],
    ...                       "kernel_class": ["gemm"] * 2, "duration_us": [10.0, 20.0]})
    >>> merge_statistics([batch_statistics(table)], kernels={"k1": "k", "k2": "k"}
    ...                  ).kernel_cells[["kernel", "n"]].to_numpy().tolist()
    [['k', 2]]
    """
    if isinstance(tables, pd.DataFrame):
        tables = [tables]
    tables = list(tables)
    check_tables(tables)
    glob = {c: _global_codes([_categorical(t[c]) for t in tables])
            for c in ("run", "node", "kernel", "kernel_class")}
    class_labels = glob["kernel_class"][1]
    usable, tier, nodes = (np.concatenate(parts) for parts in zip(*(
        _collective_rows(t, glob["kernel_class"][0][i], class_labels, gpus_per_node)
        for i, t in enumerate(tables)), strict=True))
    fixed_role = np.concatenate([
        t["role"].astype(object).isin(FIXED_GROUP_ROLES).to_numpy() if "role" in t.columns
        else np.zeros(len(t), dtype=bool) for t in tables])
    # Waiting for the slowest peer is re-created by the composition: where ingest split it
    # off, a launch's value is its transfer part, so waiting is not counted twice.
    work = [coll.launch_work_us(t) for t in tables]
    uses_transfer = np.concatenate([uses for _, uses in work])
    log_value = np.log(np.concatenate([t["duration_us"].to_numpy(dtype=float) for t in tables]))
    log_value[uses_transfer] = np.log(np.concatenate([w for w, _ in work])[uses_transfer])
    run, node, kernel, cls = (np.concatenate(glob[c][0])
                              for c in ("run", "node", "kernel", "kernel_class"))
    gpu = np.concatenate([t["gpu"].to_numpy(dtype=np.int64) for t in tables])
    step = np.concatenate([t["step"].to_numpy(dtype=np.int64) for t in tables])

    gpu_code, gpu_key = factorize(node * (int(gpu.max()) + 1) + gpu)
    step_code, step_key = factorize(run * (int(step.max()) + 1) + step)
    kc_code, kc_key = factorize(kernel * len(class_labels) + cls)
    flags = usable.astype(np.int64) * 2 + fixed_role
    cells = aggregate_cells({"kc": kc_code, "gpu": gpu_code, "step": step_code, "flags": flags},
                            {"kc": len(kc_key), "gpu": len(gpu_key), "step": len(step_key),
                             "flags": 4}, log_value)
    g, s, kc, f = (cells.codes[k] for k in ("gpu", "step", "kc", "flags"))
    run_labels, node_labels = np.array(glob["run"][1], dtype=object), np.array(
        glob["node"][1], dtype=object)
    kernel_cells = pd.DataFrame({
        "run": run_labels[step_key[s] // (int(step.max()) + 1)],
        "node": node_labels[gpu_key[g] // (int(gpu.max()) + 1)],
        "gpu": gpu_key[g] % (int(gpu.max()) + 1),
        "step": step_key[s] % (int(step.max()) + 1),
        "kernel": np.array(glob["kernel"][1], dtype=object)[kc_key[kc] // len(class_labels)],
        "kernel_class": np.array(class_labels, dtype=object)[kc_key[kc] % len(class_labels)],
        "usable": f >= 2, "fixed_role": f % 2 == 1,
        "n": cells.n.astype(np.int64),
        "transfer_n": np.bincount(cells.of_value, weights=uses_transfer,
                                  minlength=len(cells)).astype(np.int64),
        "mean_log": cells.mean, "ss_log": cells.ss,
    }, columns=list(KERNEL_CELL_COLUMNS))
    collective_cells = _collective_cells(tables, glob, usable, tier, nodes, run, step, cls)
    bench_runs = sorted({str(r) for t in tables for r, meta in (t.attrs.get("runs") or {}).items()
                         if isinstance(meta, dict) and meta.get("benchmark")})
    return ModelStatistics(
        kernel_cells=kernel_cells, collective_cells=collective_cells,
        node_cabinets=_node_cabinets(tables), benchmark_runs=tuple(bench_runs),
        row_cell=cells.of_value if keep_rows else None,
        row_log=log_value if keep_rows else None)


def _collective_cells(tables, glob, usable, tier, nodes, run, step, cls) -> pd.DataFrame:
    """Cells of the usable collectives' log transfer times (module docstring)."""
    idx = np.flatnonzero(usable)
    if not idx.size:
        return empty_collective_cells()
    log_transfer = np.log(_numeric(tables, "transfer_us")[idx])
    nbytes, group = _numeric(tables, "bytes")[idx], _numeric(tables, "group_size")[idx]
    algorithms = ("ring", *coll.LOG_ALGORITHMS)
    alg_of_kernel = np.array([algorithms.index(coll.algorithm_of(k)) for k in glob["kernel"][1]]
                             + [0], dtype=np.int64)
    alg = alg_of_kernel[np.concatenate(glob["kernel"][0])[idx]]
    c_codes, c_vals = factorize(cls[idx])
    p_codes, p_vals = factorize(group)
    n_codes, n_vals = factorize(nodes[idx])
    b_codes, b_vals = factorize(nbytes)
    stride = int(step[idx].max()) + 1
    s_codes, s_keys = factorize(run[idx] * stride + step[idx])
    cells = aggregate_cells(
        {"coll": c_codes, "tier": tier[idx], "alg": alg, "p": p_codes, "n": n_codes,
         "b": b_codes, "s": s_codes},
        {"coll": len(c_vals), "tier": 2, "alg": len(algorithms), "p": len(p_vals),
         "n": len(n_vals), "b": len(b_vals), "s": len(s_keys)},
        log_transfer)
    k = cells.codes
    labels = np.array(glob["kernel_class"][1], dtype=object)
    return pd.DataFrame({
        "collective": labels[c_vals[k["coll"]]], "tier": k["tier"],
        "algorithm": np.array(algorithms, dtype=object)[k["alg"]],
        "group_size": p_vals[k["p"]], "nodes": n_vals[k["n"]].astype(np.int64),
        "bytes": b_vals[k["b"]],
        "run": np.array(glob["run"][1], dtype=object)[s_keys[k["s"]] // stride],
        "step": s_keys[k["s"]] % stride,
        "n": cells.n.astype(np.int64), "mean_log": cells.mean, "ss_log": cells.ss,
    }, columns=list(COLLECTIVE_CELL_COLUMNS))


def merge_statistics(parts: Sequence[ModelStatistics], *,
                     kernels: dict[str, str] | None = None) -> ModelStatistics:
    """Statistics of several batches (:func:`batch_statistics`) as one.

    Cells with the same key (after renaming kernels) are merged exactly: counts added, means
    weighted by counts and the sums of squared deviations pooled,
    ``SS = Σ SS_i + n_i (m_i − m)²`` (the parallel formula of Chan et al.). A cell found in one
    batch only is kept as it is, bit for bit, so the merge of a trace's files equals the
    reduction of its whole table wherever a cell's launches are in one file (every kernel cell
    is one GPU's, and a GPU's launches are in its rank's file): up to the order of summation
    where one signature joins several place keys. Cells come out in :func:`table_statistics`'
    order; launch arrays (``row_cell``) are not kept.

    Parameters
    ----------
    parts
        Statistics of batches, in order.
    kernels
        Kernel label → the name the model fits (place key → signature,
        :func:`bayesprism.ingest.signatures.signature_map`); others are kept.

    Returns
    -------
    ModelStatistics

    Examples
    --------
    >>> import pandas as pd
    >>> table = pd.DataFrame({"run": ["r"] * 3, "step": [0, 0, 0], "node": ["n0"] * 3,
    ...                       "gpu": [0, 0, 0], "kernel": ["k"] * 3,
    ...                       "kernel_class": ["gemm"] * 3, "duration_us": [1.0, 2.0, 4.0]})
    >>> whole = table_statistics(table).kernel_cells
    >>> parts = merge_statistics([batch_statistics(table.iloc[:1]),
    ...                           batch_statistics(table.iloc[1:])]).kernel_cells
    >>> bool(np.allclose(whole[["n", "mean_log", "ss_log"]], parts[["n", "mean_log", "ss_log"]]))
    True
    """
    parts = list(parts)
    if not parts:
        raise InputError(Problem("statistics", "", "no batch to merge"))
    kernel = _concat([p.kernel_cells for p in parts])
    if kernels and len(kernel):
        labels, codes = _labels(kernel["kernel"])
        renamed = np.array([kernels.get(k, k) for k in labels], dtype=object)
        kernel = kernel.assign(kernel=renamed[codes])
    cabinets = [p.node_cabinets for p in parts if p.node_cabinets is not None]
    return ModelStatistics(
        kernel_cells=_merged(kernel, KERNEL_KEYS)[0],
        collective_cells=_merged(_concat([p.collective_cells for p in parts]),
                                 COLLECTIVE_KEYS)[0],
        node_cabinets=tuple(sorted({c for found in cabinets for c in found})) if cabinets
        else None,
        benchmark_runs=tuple(sorted({r for p in parts for r in p.benchmark_runs})))


#: The key of a kernel cell, in the order cells are sorted.
KERNEL_KEYS: tuple[str, ...] = ("kernel", "kernel_class", "node", "gpu", "run", "step",
                                "usable", "fixed_role")
#: The key of a collective cell, in the order cells are sorted.
COLLECTIVE_KEYS: tuple[str, ...] = ("collective", "tier", "algorithm", "group_size", "nodes",
                                    "bytes", "run", "step")
#: Strings columns of cells (object arrays in :class:`ModelStatistics`).
_LABELS = ("run", "node", "kernel", "kernel_class", "collective", "algorithm")


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The frames' rows (empty frames left out: they would change pandas' column types)."""
    full = [f for f in frames if len(f)] or frames[:1]
    return full[0] if len(full) == 1 else pd.concat(full, ignore_index=True)


def _labels(series: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Distinct labels of a string column and each row's index into them."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        return (series.cat.categories.astype(str).to_numpy(dtype=object),
                series.cat.codes.to_numpy())
    codes, labels = pd.factorize(series.to_numpy(dtype=object))
    return np.asarray(labels, dtype=object), codes


def _sort_codes(series: pd.Series, column: str) -> np.ndarray:
    """Integer codes that sort a key column as :func:`batch_statistics` sorts cells."""
    if column == "algorithm":  # in the order of the collective model's algorithms
        order = {a: i for i, a in enumerate(("ring", *coll.LOG_ALGORITHMS))}
        labels, codes = _labels(series)
        return np.array([order[str(a)] for a in labels], dtype=np.int64)[codes]
    if column in _LABELS:
        labels, codes = _labels(series)
        rank = np.empty(len(labels), dtype=np.int64)
        rank[np.argsort(labels.astype(str), kind="stable")] = np.arange(len(labels))
        return rank[codes]
    return pd.factorize(series.to_numpy(), sort=True)[0]


def _merged(cells: pd.DataFrame, keys: Sequence[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """Cells sorted by ``keys``, those with equal keys merged (:func:`merge_statistics`);
    and each input cell's row in the result."""
    if not len(cells):
        return cells.reset_index(drop=True), np.zeros(0, dtype=np.int64)
    codes = [_sort_codes(cells[k], k) for k in keys]
    order = np.lexsort(codes[::-1])
    ordered = np.stack([c[order] for c in codes])
    fresh = np.r_[True, (ordered[:, 1:] != ordered[:, :-1]).any(axis=0)]
    group = np.cumsum(fresh) - 1
    n = cells["n"].to_numpy(dtype=np.float64)[order]
    mean = cells["mean_log"].to_numpy(dtype=np.float64)[order]
    ss = cells["ss_log"].to_numpy(dtype=np.float64)[order]
    total = np.bincount(group, weights=n)
    pooled = np.bincount(group, weights=n * mean) / total
    single = np.bincount(group) == 1
    # a cell of one batch keeps its mean bit for bit ((n m) / n need not be m)
    pooled[single] = mean[fresh][single]
    out = cells.iloc[order[fresh]].reset_index(drop=True)
    for column in _LABELS:
        if column in out.columns:
            out[column] = out[column].astype(str).to_numpy(dtype=object)
    out["n"] = total.astype(np.int64)
    if "transfer_n" in out.columns:
        out["transfer_n"] = np.bincount(group, weights=cells["transfer_n"].to_numpy(
            dtype=np.float64)[order]).astype(np.int64)
    out["mean_log"] = pooled
    out["ss_log"] = np.bincount(group, weights=ss + n * (mean - pooled[group]) ** 2)
    cell_of = np.empty(len(cells), dtype=np.int64)
    cell_of[order] = group
    return out, cell_of


def empty_collective_cells() -> pd.DataFrame:
    """No collective cells, with the columns and types of some.

    Examples
    --------
    >>> empty_collective_cells()["n"].dtype
    dtype('int64')
    """
    return pd.DataFrame({c: [] for c in COLLECTIVE_CELL_COLUMNS}).astype({
        "tier": np.int64, "group_size": float, "nodes": np.int64, "bytes": float,
        "step": np.int64, "n": np.int64, "mean_log": float, "ss_log": float})


def _node_cabinets(tables: Sequence[pd.DataFrame]) -> tuple[tuple[str, str], ...] | None:
    """Distinct (node, cabinet) pairs, None when no table has a cabinet column."""
    pairs = [t[["node", "cabinet"]].dropna().astype(str).drop_duplicates()
             for t in tables if "cabinet" in t.columns]
    if not pairs:
        return None
    found = pd.concat(pairs).drop_duplicates()
    return tuple(sorted(zip(found["node"], found["cabinet"], strict=True)))


__all__ = ["COLLECTIVE_CELL_COLUMNS", "COLLECTIVE_KEYS", "FIXED_GROUP_ROLES",
           "KERNEL_CELL_COLUMNS", "KERNEL_KEYS", "ModelStatistics", "batch_statistics",
           "check_tables", "empty_collective_cells", "merge_statistics",
           "table_statistics"]
