"""Per-GPU benchmark tables (a timing per GPU and repeat, keyed by cabinet/node/GPU ids).

Rows become ``kernel_class = "benchmark"`` with ``kernel`` = the workload (``exp``/``model``
column, else the file stem), ``duration_us`` = the timing column converted from its unit,
``node`` = ``"<cabinet>-<node>"`` (globally unique, as PAL's ``uuid`` builds it; the node number
is written without leading zeros so ``"004"`` and ``"4"`` are the same node), ``gpu`` = the device
index within the node, ``cabinet``, ``step`` = the repeat index of that GPU, ``rank`` = a dense
GPU index (sorted by cabinet, node, device) and ``run = "<cluster>/<workload>"``.

The timing column is chosen by ``value_column`` (with ``unit``), or recognised from the layouts
of the PAL data (``hal-uw/blox-pal``, see ``data/README.md``):

=============================  ======================  =======  =================================
layout (recognised by)         timing column           unit     note
=============================  ======================  =======  =================================
``mean_iter_dur_mean`` (LS6)   ``mean_iter_dur_mean``  s        one aggregated row per GPU
Longhorn (``perf``, ``freq``)  ``perf``                ms       ``warmup`` rows skipped, counted
Frontera PageRank              ``perf``                ns       unit undocumented upstream: ns is
(``perf``, ``perf_avg``)                                        an assumption (noted); only ratios
                                                                between GPUs are meaningful
Frontera (``mean_iter_dur``,   ``mean_iter_dur``       s        ``reps`` is the repeat index
``reps``)
any other                      one ``time_<unit>``     from     e.g. ``time_us``; also
                               column                  name     ``elapsed_``, ``latency_``,
                                                                ``runtime_``, ``kernel_time_``
=============================  ======================  =======  =================================

Choices worth knowing:

* The repeat index (``step``) is the ``reps``/``run`` column when it is unique per GPU, else the
  order of the runs in time (``ts``), else the row order within the GPU (noted). A ``session``
  column (a benchmark launched several times, each time repeating the kernel a few times) is
  the step instead: the repeats of a GPU in one session are launches of one GPU-step, so the
  model can tell a session's transient state of a GPU from the GPU itself.
* Node and GPU ids: ``node``/``node_id``/``hostname``/``host``/... and
  ``device``/``gpu``/``gpu_index``/``gpu_id``/``dev_id``/``device_id``/``local_rank``/...
  (:data:`ID_COLUMNS`); a GPU column of uuids (strings) is numbered within each node in sorted
  order (noted). ``column_map={"their_name": "node"}`` names any other column.
* A GPU ``uuid`` column next to numeric ids is the GPU's identity when the ids do not tell the
  uuids apart, as in PAL's own SGEMM table (``sim/sgemm-longhorn-agg.csv``: ``cabinet`` and
  ``node`` are ``-1``, ``dev_id`` is 0 for every GPU): a GPU whose node is unknown (``-1``,
  empty) is a node of its own named by its uuid (GPU 0); on a known node, the uuids are numbered
  0, 1, ... in sorted order. A table with a uuid and no node column reads the same way. Both
  are noted: node and GPU effects cannot be told apart for such GPUs. A node
  named like a traced host (``dgx-h100-0568``) is the same node in a joint fit with the traces,
  so its benchmark timings and its kernels share one node effect.
* A ``kernel`` column (the benchmarked kernel's name) is the workload when no ``exp``/``model``
  column is given, suffixed with the shape columns (``m``, ``n``, ``k``, ``dtype``) where present:
  the benchmark's kernel is a signature of its own and never collides with a traced kernel of
  the same name (which has another class). The run is then ``<cluster>``.
* Rows flagged ``warmup`` are skipped and counted (``"warm-up run (warmup flag)"``) unless
  ``keep_warmup=True``: they are the first runs on a GPU, which the PAL authors mark as warm-up.
* ``32gpu-variability.csv`` (``PerfVar_class*`` columns) holds *slowdown factors* relative to the
  median GPU, not durations: it is refused with an error that says so. Passing
  ``value_column=`` and ``unit=`` reads any column anyway, on the user's responsibility.
* Non-schema columns (telemetry such as clocks, temperature, power) are not carried into the
  trace table; the report's notes list them.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism.errors import Problem, TraceFormatError
from bayesprism.ingest.files import read_bytes

UNIT_TO_US = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}
SKIP_BAD_VALUE = "timing value missing, non-finite or <= 0"
SKIP_WARMUP = "warm-up run (warmup flag)"

ID_COLUMNS = {
    "cabinet": ("cabinet", "cab", "rack"),
    "node": ("node", "node_id", "nodeid", "node_name", "nodename", "host", "hostname",
             "host_name", "machine"),
    # numeric ids first; a GPU uuid (a string) is numbered within its node
    "gpu": ("device", "gpu", "local_gpu_id", "gpu_index", "gpu_id", "dev_id", "device_id",
            "device_index", "local_rank", "cuda_device", "gpu_uuid", "uuid"),
    "uuid": ("uuid", "gpu_uuid"),
    "workload": ("exp", "model", "workload", "benchmark", "app"),
    "repeat": ("reps", "rep", "repeat", "run", "trial"),
    "session": ("session", "session_id"),
    "time": ("ts", "timestamp"),
    "cluster": ("cluster", "system"),
    "kernel": ("kernel", "kernel_name"),
}
#: Node or cabinet ids that mean "not known" (PAL writes -1).
_UNKNOWN_IDS = frozenset({"-1", "", "nan", "none", "unknown", "na", "n/a"})
#: Shape columns appended to a ``kernel`` column's name (``name[m=..,n=..,k=..,dtype]``).
_SHAPE_COLUMNS = ("m", "n", "k", "dtype")
#: Generic timing columns: ``<stem>_<unit>``, recognised when no PAL layout matches.
_TIMING = re.compile(r"^(time|elapsed|latency|runtime|kernel_time)_(ns|us|ms|s)$", re.IGNORECASE)
#: (layout name, columns that identify it, timing column, unit, note or None)
PAL_LAYOUTS: tuple[tuple[str, frozenset, str, str, str | None], ...] = (
    ("PAL Lonestar6 aggregate", frozenset({"mean_iter_dur_mean"}), "mean_iter_dur_mean", "s", None),
    ("PAL Longhorn", frozenset({"perf", "freq", "kern_max_start"}), "perf", "ms", None),
    (
        "PAL Frontera PageRank",
        frozenset({"perf", "perf_avg"}),
        "perf",
        "ns",
        "the unit of perf in PAL's Frontera PageRank table is not documented upstream; it is "
        "read as ns (an assumption: only ratios between GPUs are meaningful)",
    ),
    ("PAL Frontera", frozenset({"mean_iter_dur", "reps"}), "mean_iter_dur", "s", None),
)
#: GPU model of the TACC clusters in the PAL data (from TACC's documentation, not in the files).
TACC_GPUS = {
    "frontera": "NVIDIA Quadro RTX 5000",
    "longhorn": "NVIDIA Tesla V100",
    "ls6": "NVIDIA A100",
}
_TIDY_COLUMNS = {"run", "step", "rank", "node", "gpu", "kernel", "kernel_class"}
_STEM_NOISE = {"agg", "aggregated", "data", "results", "perf", "benchmark"}


def can_read(path: Path, head: bytes) -> bool:
    """True for a CSV whose header names a node and a GPU column (and is not a tidy table)."""
    if path.suffix.lower() not in (".csv", ".tsv", ".txt") and not path.name.endswith(".csv.gz"):
        return False
    header = head.split(b"\n", 1)[0].decode("utf-8", errors="replace").lower()
    names = {c.strip().strip('"') for c in re.split(r"[,\t]", header)}
    if "duration_us" in names or len(names & _TIDY_COLUMNS) >= 4:
        return False  # a tidy trace table (the tabular reader's)
    has_node = bool(names & set(ID_COLUMNS["node"])) or bool(names & set(ID_COLUMNS["uuid"]))
    return has_node and bool(names & set(ID_COLUMNS["gpu"]))


def read_gpu_benchmark(
    path: Path,
    *,
    value_column: str | None = None,
    unit: str | None = None,
    run: str | None = None,
    keep_warmup: bool = False,
    column_map: Mapping[str, str | None] | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Read a per-GPU benchmark table into ``kernel_class = "benchmark"`` rows.

    Parameters
    ----------
    path
        CSV file (optionally gzipped) with a header row.
    value_column
        Timing column to use; default: recognised from the PAL layouts (module docstring).
    unit
        Unit of ``value_column`` (``ns``, ``us``, ``ms``, ``s``); may be omitted when the column
        name ends in ``_ns``/``_us``/``_ms``/``_s``.
    run
        Run name; default ``"<cluster>/<workload>"``.
    keep_warmup
        Keep rows flagged ``warmup`` (default: skip and count them).
    column_map
        ``{column in the file: our name or None}``: renames (e.g. ``{"slot": "gpu"}``) before
        the id and timing columns are recognised; ``None`` drops a column.

    Returns
    -------
    (pandas.DataFrame, dict)
        Trace-table rows and the report (``run``, ``skipped``, ``notes``, ``run_meta``).

    Raises
    ------
    TraceFormatError
        Unreadable CSV, missing node/GPU columns, no recognisable timing column, an unknown
        unit, or no valid timing at all.
    """
    path = Path(path)
    source = str(path)
    table = _read_csv(path)
    if column_map:
        table = _renamed(table, column_map, source)
    notes: list[str] = []
    skipped: dict[str, int] = {}
    cols = _find_id_columns(table)
    missing = [k for k in ("node", "gpu") if k not in cols
               and not (k == "node" and "uuid" in cols)]
    if missing:
        raise TraceFormatError(
            [
                Problem(
                    source,
                    k,
                    f"no {k} column (expected one of {', '.join(ID_COLUMNS[k])}); "
                    f"columns are {', '.join(map(str, table.columns))}",
                )
                for k in missing
            ]
        )
    value_column, unit = _timing_column(table, value_column, unit, source, notes)
    factor = UNIT_TO_US[unit]

    if "warmup" in table.columns and not keep_warmup:
        flag = table["warmup"].astype(str).str.strip().str.lower().isin(("true", "1", "yes"))
        if flag.any():
            skipped[SKIP_WARMUP] = int(flag.sum())
            table = table.loc[~flag]
    values = pd.to_numeric(table[value_column], errors="coerce").to_numpy(dtype=float) * factor
    good = np.isfinite(values) & (values > 0)
    if (~good).any():
        skipped[SKIP_BAD_VALUE] = int((~good).sum())
    table, values = table.loc[good], values[good]
    if len(table) == 0:
        raise TraceFormatError(
            Problem(
                source, value_column, "no valid (finite, > 0) timing value", sum(skipped.values())
            )
        )

    node_number = (table[cols["node"]].map(_node_label) if "node" in cols
                   else pd.Series("-1", index=table.index))
    cabinet = table[cols["cabinet"]].astype(str).str.strip() if "cabinet" in cols else None
    if cabinet is not None and cabinet.str.lower().isin(_UNKNOWN_IDS).all():
        cabinet = None  # PAL's -1: one made-up cabinet would pool unrelated nodes
    node = node_number if cabinet is None else cabinet + "-" + node_number
    gpu = pd.to_numeric(table[cols["gpu"]], errors="coerce")
    if gpu.isna().all():
        gpu = _numbered_within_node(table[cols["gpu"]], node)
        notes.append(f"{path.name}: GPU column {cols['gpu']!r} holds names, not indices: GPUs "
                     "numbered 0, 1, ... within each node in sorted order")
    if gpu.isna().any() or (gpu < 0).any():
        bad = table[cols["gpu"]][gpu.isna() | (gpu < 0)].iloc[0]
        raise TraceFormatError(
            Problem(
                source,
                cols["gpu"],
                "GPU index must be an integer >= 0",
                int((gpu.isna() | (gpu < 0)).sum()),
                bad,
            )
        )
    gpu = gpu.astype("int64")
    by_uuid = "uuid" in cols and cols["uuid"] != cols["gpu"]
    if by_uuid:
        before = len(notes)
        node, gpu = _uuid_identity(table[cols["uuid"]], node, node_number, gpu, path.name,
                                   notes)
        by_uuid = len(notes) > before  # the uuids were needed (and said so)
        if cabinet is not None:
            cabinet = cabinet.where(~node_number.str.lower().isin(_UNKNOWN_IDS), "")
    if "workload" in cols:
        workload = table[cols["workload"]].astype(str)
    elif "kernel" in cols:
        workload = _kernel_signature(table, cols["kernel"])
    else:
        workload = pd.Series(_stem(path), index=table.index)
    workloads = sorted(workload.unique())
    cluster = _cluster(table, cols, path, workloads)
    if run is None:
        if "workload" not in cols and "kernel" in cols:
            run = cluster
        else:
            run = (f"{cluster}/{workloads[0]}" if len(workloads) == 1
                   else f"{cluster}/{_stem(path)}")

    units = pd.DataFrame({"node": node.to_numpy(), "gpu": gpu.to_numpy()}, index=table.index)
    order = units.assign(
        cab=cabinet if cabinet is not None else "",
        num=pd.to_numeric(node_number, errors="coerce").fillna(-1),
    )
    ranked = order.drop_duplicates(["node", "gpu"]).sort_values(["cab", "num", "node", "gpu"])
    pairs = zip(ranked["node"], ranked["gpu"], strict=True)
    rank_of = {(n, g): i for i, (n, g) in enumerate(pairs)}
    rank = np.array(
        [rank_of[(n, g)] for n, g in zip(units["node"], units["gpu"], strict=True)], dtype=np.int64
    )
    if "session" in cols:
        step = _session_index(table, cols["session"], source)
        notes.append(f"{path.name}: step = the benchmark session ({cols['session']}); the "
                     "repeats of a GPU within a session are its launches")
    else:
        step = _repeat_index(table, cols, rank, notes)

    out = pd.DataFrame(
        {
            "run": run,
            "step": step,
            "rank": rank,
            "node": node.to_numpy(),
            "gpu": gpu.to_numpy(),
            "kernel": workload.to_numpy(),
            "kernel_class": "benchmark",
            "duration_us": values,
        }
    )
    if cabinet is not None:
        out["cabinet"] = cabinet.to_numpy()
    out = out.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)

    used = {value_column, *cols.values(), "warmup"} - (
        {cols["uuid"]} if "uuid" in cols and not by_uuid and cols["uuid"] != cols["gpu"]
        else set())
    if "kernel" in cols and "workload" not in cols:
        used |= {c for c in table.columns if str(c).lower() in _SHAPE_COLUMNS}
    dropped = [str(c) for c in table.columns if c not in used and not str(c).startswith("Unnamed")]
    if dropped:
        notes.append(f"{path.name}: columns not carried into the trace table: {', '.join(dropped)}")
    gpus_per_node = int(out.groupby("node")["gpu"].nunique().max())
    meta = {
        "platform": TACC_GPUS.get(cluster.lower()),
        "cluster": cluster,
        "workloads": workloads,
        "world_size": len(rank_of),
        "gpus_per_node": gpus_per_node,
        "nodes": int(out["node"].nunique()),
        "cabinets": int(out["cabinet"].nunique()) if cabinet is not None else None,
        "value_column": value_column,
        "unit": unit,
        "plan": {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "microbatches": 1},
        "independent_gpus": True,
        "benchmark": True,
        "source_files": [source],
    }
    return out, {"run": run, "skipped": skipped, "notes": notes, "run_meta": meta}


# --------------------------------------------------------------------------- helpers


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        table = pd.read_csv(io.BytesIO(read_bytes(path)), sep=None, engine="python")
    except (EOFError, OSError, ValueError, pd.errors.ParserError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise TraceFormatError(Problem(str(path), "", f"cannot read as CSV: {exc}")) from None
    if len(table) == 0:
        raise TraceFormatError(Problem(str(path), "", "the table has no rows"))
    return table


def _renamed(table: pd.DataFrame, column_map: Mapping[str, str | None], source: str
             ) -> pd.DataFrame:
    """``table`` with ``column_map`` applied; a key naming no column is an error."""
    absent = [k for k in column_map if k not in table.columns]
    if absent:
        raise TraceFormatError(Problem(source, "column_map", "names column(s) not in the file: "
                                       f"{', '.join(map(str, absent))}; the file has "
                                       f"{', '.join(map(str, table.columns))}"))
    drop = [k for k, v in column_map.items() if v is None]
    return table.drop(columns=drop).rename(
        columns={k: v for k, v in column_map.items() if v is not None})


def _numbered_within_node(ids: pd.Series, node: pd.Series) -> pd.Series:
    """Dense 0-based index of each distinct id within its node, in sorted id order."""
    pairs = pd.DataFrame({"node": node.to_numpy(), "id": ids.astype(str).to_numpy()},
                         index=ids.index)
    return pairs.groupby("node")["id"].rank(method="dense").astype("int64") - 1


def _uuid_identity(uuid: pd.Series, node: pd.Series, node_number: pd.Series, gpu: pd.Series,
                   name: str, notes: list[str]) -> tuple[pd.Series, pd.Series]:
    """Node and GPU of each row when a uuid column names the GPUs the ids do not tell apart.

    Where (node, GPU id) pairs each hold one uuid the ids stand. Else a GPU on an unknown node
    (``-1``, empty) is a node of its own named by its uuid, with GPU 0, and the uuids on a
    known node are numbered 0, 1, ... in sorted order.

    Examples
    --------
    >>> uuid = pd.Series(["GPU-b", "GPU-a", "GPU-b", "GPU-c"])
    >>> node, gpu = _uuid_identity(uuid, pd.Series(["-1", "-1", "-1", "n7"]),
    ...                            pd.Series(["-1", "-1", "-1", "7"]), pd.Series([0, 0, 0, 0]),
    ...                            "t.csv", [])
    >>> node.tolist(), gpu.tolist()
    (['GPU-b', 'GPU-a', 'GPU-b', 'n7'], [0, 0, 0, 0])
    """
    ids = uuid.astype(str).str.strip()
    unknown = node_number.str.lower().isin(_UNKNOWN_IDS)
    pairs = pd.DataFrame({"node": node.to_numpy(), "gpu": gpu.to_numpy(), "id": ids.to_numpy()})
    shared = pairs.groupby(["node", "gpu"])["id"].nunique().max() > 1
    if not shared and not unknown.any():
        return node, gpu
    node = node.where(~unknown, ids)
    gpu = _numbered_within_node(ids, node) if shared else gpu.where(~unknown, 0)
    notes.append(f"{name}: GPUs identified by their uuid ({uuid.name}): the node and GPU ids "
                 "do not tell them apart" + (f"; {int(ids[unknown].nunique())} GPUs on an "
                 "unknown node (-1) are each a node of their own, so node and GPU effects "
                 "cannot be told apart for them" if unknown.any() else ""))
    return node, gpu


def _find_id_columns(table: pd.DataFrame) -> dict[str, str]:
    lower = {str(c).strip().lower(): c for c in table.columns}
    found = {}
    for role, names in ID_COLUMNS.items():
        for name in names:
            if name in lower:
                found[role] = lower[name]
                break
    return found


def _timing_column(table, value_column, unit, source, notes) -> tuple[str, str]:
    columns = set(map(str, table.columns))
    if value_column is None:
        for name, needed, column, layout_unit, note in PAL_LAYOUTS:
            if needed <= columns:
                value_column, unit = column, unit or layout_unit
                notes.append(f"layout {name}: timing column {column!r} in {unit}")
                if note and unit == layout_unit:
                    notes.append(note)
                break
        else:
            timing = sorted(c for c in columns if _TIMING.match(c))
            factors = sorted(c for c in columns if c.lower().startswith("perfvar"))
            if len(timing) == 1:
                value_column = timing[0]
                unit = unit or _TIMING.match(value_column).group(2).lower()
                notes.append(f"timing column {value_column!r} in {unit}")
            elif len(timing) > 1:
                raise TraceFormatError(
                    Problem(
                        source,
                        "value_column",
                        "several timing columns; pass value_column= to choose one",
                        example=", ".join(timing),
                    )
                )
            elif factors:
                raise TraceFormatError(
                    Problem(
                        source,
                        ", ".join(factors),
                        "these are per-GPU slowdown factors relative to the median GPU, not "
                        "durations; this file is not a benchmark timing table (pass value_column= "
                        "and unit= to read a column anyway)",
                    )
                )
            else:
                raise TraceFormatError(
                    Problem(
                        source,
                        "value_column",
                        "no timing column recognised; pass value_column= and unit=; columns "
                        "are " + ", ".join(map(str, table.columns)),
                    )
                )
    if value_column not in columns:
        raise TraceFormatError(
            Problem(
                source,
                value_column,
                "no such column; columns are " + ", ".join(map(str, table.columns)),
            )
        )
    if unit is None:
        suffix = re.search(r"_(ns|us|ms|s)$", value_column)
        if not suffix:
            raise TraceFormatError(
                Problem(
                    source,
                    "unit",
                    f"unit of {value_column!r} unknown; pass unit= (ns, us, ms or s)",
                )
            )
        unit = suffix.group(1)
    if unit not in UNIT_TO_US:
        raise TraceFormatError(
            Problem(
                source,
                "unit",
                "unknown unit; expected one of " + ", ".join(UNIT_TO_US),
                example=unit,
            )
        )
    return value_column, unit


def _kernel_signature(table: pd.DataFrame, column: str) -> pd.Series:
    """The kernel column's names with the shape columns appended: ``name[m=8192,...,bf16]``."""
    lower = {str(c).lower(): c for c in table.columns}
    shape = [lower[c] for c in _SHAPE_COLUMNS if c in lower]
    name = table[column].astype(str).str.strip()
    if not shape:
        return name
    parts = [table[c].astype(str).str.strip() if c == lower.get("dtype")
             else f"{str(c).lower()}=" + table[c].astype(str).str.strip() for c in shape]
    joined = parts[0]
    for part in parts[1:]:
        joined = joined + "," + part
    return name + "[" + joined + "]"


def _session_index(table: pd.DataFrame, column: str, source: str) -> np.ndarray:
    """Step of each row: its session, as an integer >= 0 (dense codes if not numeric)."""
    values = pd.to_numeric(table[column], errors="coerce")
    if values.notna().all() and (values >= 0).all() and (values == values.round()).all():
        return values.astype("int64").to_numpy()
    if table[column].isna().any():
        raise TraceFormatError(Problem(source, column, "session is missing",
                                       int(table[column].isna().sum())))
    codes, _ = pd.factorize(table[column].astype(str), sort=True)
    return codes.astype(np.int64)


def _node_label(value) -> str:
    text = str(value).strip()
    return str(int(text)) if text.isdigit() else text


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".csv", ".tsv", ".txt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _cluster(table, cols, path: Path, workloads: list[str]) -> str:
    if "cluster" in cols:
        names = table[cols["cluster"]].astype(str).unique()
        if len(names) == 1:
            return str(names[0])
    drop = {w.lower() for w in workloads} | _STEM_NOISE
    tokens = [t for t in re.split(r"[-_.]", _stem(path)) if t and t.lower() not in drop]
    return "-".join(tokens) if tokens else path.parent.name


def _repeat_index(table, cols, rank, notes) -> np.ndarray:
    keys = pd.Series(rank, index=table.index)
    if "repeat" in cols:
        rep = pd.to_numeric(table[cols["repeat"]], errors="coerce")
        unique = rep.notna().all() and not pd.DataFrame({"r": keys, "v": rep}).duplicated().any()
        if unique and (rep >= 0).all() and (rep == rep.round()).all():
            return rep.astype("int64").to_numpy()
    if "time" in cols:
        order = pd.DataFrame(
            {
                "rank": keys,
                "t": pd.to_numeric(table[cols["time"]], errors="coerce"),
                "row": np.arange(len(table)),
            },
            index=table.index,
        )
        order = order.sort_values(["rank", "t", "row"])
        step = order.groupby("rank").cumcount()
        notes.append(f"repeat index of each GPU = order of its runs in time ({cols['time']})")
        return step.reindex(table.index).to_numpy(dtype=np.int64)
    step = keys.groupby(keys).cumcount()
    if (step > 0).any():
        notes.append("repeat index of each GPU = row order in the file")
    return step.to_numpy(dtype=np.int64)
