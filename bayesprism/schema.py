"""The trace table: the one contract between ingestion and everything else (DESIGN §3).

One row per executed GPU kernel (or per step, for step-level logs; or per GPU and repeat, for
benchmark tables). Run-level metadata lives in ``DataFrame.attrs``::

    attrs = {
        "schema_version": 1,
        "runs": {run: {"platform": str, "world_size": int, "gpus_per_node": int,
                       "plan": {"dp", "tp", "pp", "cp", "ep", "microbatches", ...},
                       "source_files": [str, ...], ...}},
        "skipped": {reason: count},
        "notes": [str, ...],          # e.g. "wait/transfer split not possible: one rank"
    }

Step-level rows (``kernel_class == "step"``) that time the whole job use ``rank = -1``,
``gpu = -1`` and ``node = "*"`` (:data:`ALL_RANKS`, :data:`ALL_NODES`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism.errors import Problem, TableValidationError

# pyarrow is imported where tables are written or read (start-up time of `import bayesprism`).

SCHEMA_VERSION = 1
ALL_RANKS = -1
ALL_NODES = "*"

KERNEL_CLASSES: tuple[str, ...] = (
    "gemm",
    "attention",
    "elementwise",
    "norm",
    "optimizer",
    "memcpy",
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "broadcast",
    "sendrecv",
    "step",
    "benchmark",
    "other",
)
COLLECTIVE_CLASSES: tuple[str, ...] = (
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "broadcast",
    "sendrecv",
)
COMPUTE_CLASSES: tuple[str, ...] = tuple(
    c for c in KERNEL_CLASSES if c not in COLLECTIVE_CLASSES and c not in ("step", "benchmark")
)

KERNEL_CLASS_DTYPE = pd.CategoricalDtype(list(KERNEL_CLASSES), ordered=False)

#: Required columns and their dtypes.
REQUIRED_COLUMNS: dict[str, object] = {
    "run": "category",
    "step": "int64",
    "rank": "int64",
    "node": "category",
    "gpu": "int64",
    "kernel": "category",
    "kernel_class": KERNEL_CLASS_DTYPE,
    "duration_us": "float64",
}

#: Optional columns and their dtypes (nullable where a value may be unknown).
OPTIONAL_COLUMNS: dict[str, object] = {
    "start_us": "float64",
    "stream": "Int64",
    "occurrence": "Int64",
    "bytes": "float64",
    "dtype": "category",
    "group_size": "Int64",
    "process_group": "category",
    "wait_us": "float64",
    "transfer_us": "float64",
    "microbatch": "Int64",
    "layer": "Int64",
    "phase": "category",
    "cabinet": "category",
    "source": "category",
    "role": "category",
    "signature": "category",
    "tp_rank": "Int64",
    "pp_stage": "Int64",
    "dp_rank": "Int64",
    "cp_rank": "Int64",
    "ep_rank": "Int64",
}

ALL_COLUMNS: dict[str, object] = {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}


#: Longest duration a row may have: a day, in µs. Longer is a unit mix-up or a damaged file.
MAX_DURATION_US = 86_400e6


def signature_as_kernel(table: pd.DataFrame) -> pd.DataFrame:
    """The table with each row's ``signature`` as its ``kernel`` (DESIGN §3).

    A signature is what the model and the inventory treat as one kernel. Rows without a
    signature keep their kernel name.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"kernel": pd.Categorical(["gemm", "gemm"]),
    ...                   "signature": pd.Categorical(["gemm #1", None])})
    >>> signature_as_kernel(t)["kernel"].tolist()
    ['gemm #1', 'gemm']
    """
    if "signature" not in table.columns or table["signature"].isna().all():
        return table
    out = table.copy()
    kernel = table["signature"].astype(object).where(table["signature"].notna(),
                                                     table["kernel"].astype(object))
    out["kernel"] = kernel.astype("category")
    out.attrs = table.attrs
    return out


def codes_and_labels(values: pd.Series, missing: str | None = None) -> tuple[np.ndarray, list]:
    """Integer codes of a column and the labels they index, without per-row strings.

    Missing values get code -1, or, with ``missing``, a label of their own (appended).
    Categories come back as strings, other values as Python scalars.

    Examples
    --------
    >>> codes, labels = codes_and_labels(pd.Series(["a", None, "b", "a"]), missing="nan")
    >>> codes.tolist(), labels
    ([0, 2, 1, 0], ['a', 'b', 'nan'])
    """
    if isinstance(values.dtype, pd.CategoricalDtype):
        codes = values.cat.codes.to_numpy().astype(np.int64)
        labels: list = [str(c) for c in values.cat.categories]
    else:
        codes, uniques = pd.factorize(values)
        codes = codes.astype(np.int64)
        labels = [u.item() if hasattr(u, "item") else u for u in uniques]
    if missing is not None and (codes < 0).any():
        codes = np.where(codes < 0, len(labels), codes)
        labels.append(missing)
    return codes, labels


def string_values(values: pd.Series) -> np.ndarray:
    """A column as a NumPy array of each value's ``str``, missing values as ``"nan"``.

    Built from the distinct values (:func:`codes_and_labels`), not per row: a categorical
    column of 835 k rows takes milliseconds, where ``astype(str)`` takes 0.2-0.8 s.

    Examples
    --------
    >>> string_values(pd.Series(pd.Categorical(["a", None, "b", "a"]))).tolist()
    ['a', 'nan', 'b', 'a']
    >>> string_values(pd.Series([3, 1])).tolist()
    ['3', '1']
    """
    codes, labels = codes_and_labels(values, missing="nan")
    return np.array([str(label) for label in labels], dtype=object)[codes]


def category_in(values: pd.Series, allowed) -> np.ndarray:
    """Boolean mask of the rows whose value is one of ``allowed`` (missing: False).

    Decided once per distinct value (:func:`codes_and_labels`), not per row.

    Examples
    --------
    >>> category_in(pd.Series(["gemm", None, "allgather"], dtype="category"), ("allgather",))
    array([False, False,  True])
    """
    codes, labels = codes_and_labels(values)
    return np.isin(np.asarray([*labels, None], dtype=object), list(allowed))[codes]


def empty_attrs() -> dict:
    """Fresh run metadata with the current schema version."""
    return {"schema_version": SCHEMA_VERSION, "runs": {}, "skipped": {}, "notes": []}


def coerce_table(df: pd.DataFrame, source: str = "table") -> pd.DataFrame:
    """Cast known columns to their schema dtypes, keeping attrs; unknown columns raise.

    Raises
    ------
    TableValidationError
        If a column is unknown or cannot be cast (every such column is reported).
    """
    problems: list[Problem] = []
    unknown = [c for c in df.columns if c not in ALL_COLUMNS]
    if unknown:
        problems.append(
            Problem(source, ", ".join(map(str, unknown)), "unknown column(s); known columns are "
                    + ", ".join(ALL_COLUMNS))
        )
    out = {}
    for col in df.columns:
        if col in unknown:
            continue
        dtype = ALL_COLUMNS[col]
        series = df[col]
        if _has_dtype(series, dtype):  # a reader's own frame: nothing to cast
            out[col] = series
            continue
        try:
            if dtype in ("int64", "Int64", "float64"):
                if pd.api.types.is_bool_dtype(series):
                    problems.append(Problem(source, col, "must be numbers, not true/false",
                                            example=series.iloc[0]))
                    continue
                series = pd.to_numeric(series, errors="raise")
                if dtype != "float64" and pd.api.types.is_float_dtype(series):
                    values = series.to_numpy(dtype=np.float64, na_value=np.nan)
                    # a cast would truncate 10.5 to 10 without a word
                    fractional = np.isfinite(values) & (values != np.round(values))
                    if fractional.any():
                        problems.append(Problem(source, col, "must be whole numbers",
                                                int(fractional.sum()),
                                                values[fractional][0]))
                        continue
            if dtype == "category" and not isinstance(series.dtype, pd.CategoricalDtype):
                series = series.astype(str)
            out[col] = series.astype(dtype)
        except (ValueError, TypeError) as exc:
            bad = _first_uncastable(df[col], dtype)
            problems.append(Problem(source, col, f"cannot be read as {dtype}: {exc}", example=bad))
    if problems:
        raise TableValidationError(problems)
    result = pd.DataFrame(out, index=df.index)
    result.attrs = {**empty_attrs(), **dict(df.attrs)}
    return result


def _has_dtype(series: pd.Series, dtype: object) -> bool:
    """Whether ``series`` already has the schema ``dtype`` (any categories for "category")."""
    if isinstance(dtype, pd.CategoricalDtype):  # before ==: it equals "category" too
        return isinstance(series.dtype, pd.CategoricalDtype) and series.dtype == dtype
    if dtype == "category":
        return isinstance(series.dtype, pd.CategoricalDtype)
    return str(series.dtype) == dtype


def _first_uncastable(series: pd.Series, dtype: object) -> object:
    for value in series.head(10_000):
        try:
            pd.Series([value]).astype(dtype)
        except (ValueError, TypeError):
            return value
    return None


def validate_table(df: pd.DataFrame, source: str = "table") -> pd.DataFrame:
    """Check a trace table against the schema and report every problem at once.

    Parameters
    ----------
    df
        Candidate trace table.
    source
        Name used in messages (file path or description).

    Returns
    -------
    pandas.DataFrame
        The same table, columns cast to their schema dtypes.

    Raises
    ------
    TableValidationError
        Listing each problem with its column, row count and an example value.

    Examples
    --------
    >>> import pandas as pd
    >>> df = pd.DataFrame({"run": ["r"], "step": [0], "rank": [0], "node": ["n0"], "gpu": [0],
    ...                    "kernel": ["gemm_a"], "kernel_class": ["gemm"], "duration_us": [12.5]})
    >>> validate_table(df)["kernel_class"].dtype.name
    'category'
    >>> validate_table(df.assign(duration_us=-1.0))
    Traceback (most recent call last):
    ...
    bayesprism.errors.TableValidationError: table: duration_us: must be > 0 µs (1 row), got -1.0
    """
    problems: list[Problem] = []
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    for col in missing:
        problems.append(Problem(source, col, "required column is missing"))
    if len(df) == 0:
        problems.append(Problem(source, "", "the table has no rows"))
    unknown = [c for c in df.columns if c not in ALL_COLUMNS]
    if unknown:
        problems.append(
            Problem(source, ", ".join(map(str, unknown)), "unknown column(s); known columns are "
                    + ", ".join(ALL_COLUMNS))
        )
        df = df.drop(columns=unknown)
    try:
        df = coerce_table(df, source)
    except TableValidationError as exc:
        raise TableValidationError(problems + exc.problems) from None
    if missing or len(df) == 0:
        raise TableValidationError(problems)

    def check(mask: pd.Series | np.ndarray, col: str, message: str) -> None:
        mask = np.asarray(mask, dtype=bool)
        n = int(mask.sum())
        if n:
            problems.append(Problem(source, col, message, n, df[col].to_numpy()[mask][0]))

    dur = df["duration_us"]
    check(dur.isna(), "duration_us", "is missing (NaN)")
    check(~np.isfinite(dur.fillna(1.0)), "duration_us", "is infinite")
    check(dur.fillna(1.0) <= 0, "duration_us", "must be > 0 µs")
    check(np.isfinite(dur.fillna(1.0)) & (dur.fillna(1.0) > MAX_DURATION_US), "duration_us",
          f"is longer than a day ({MAX_DURATION_US:.0f} µs): not a duration in µs")
    for col in ("run", "node", "kernel", "kernel_class"):
        check(df[col].isna(), col, "is missing")
    step_rows = (df["kernel_class"] == "step").to_numpy()
    check((df["rank"] < 0) & ~step_rows, "rank", "must be >= 0 (only step rows may use -1)")
    check((df["gpu"] < 0) & ~step_rows, "gpu", "must be >= 0 (only step rows may use -1)")
    check(df["step"] < 0, "step", "must be >= 0")
    for col in ("wait_us", "transfer_us", "bytes", "start_us"):
        if col in df.columns:
            v = df[col]
            check(v.notna() & (v < 0), col, "must be >= 0")
    if "group_size" in df.columns:
        g = df["group_size"]
        check(g.notna() & (g < 1), "group_size", "must be >= 1")
    # One node per rank within a run.
    ranked = df.loc[~step_rows, ["run", "rank", "node"]]
    if len(ranked):
        nodes_per_rank = ranked.groupby(["run", "rank"], observed=True)["node"].nunique()
        bad = nodes_per_rank[nodes_per_rank > 1]
        if len(bad):
            problems.append(
                Problem(source, "node", "a rank appears on more than one node", len(bad),
                        f"run={bad.index[0][0]} rank={bad.index[0][1]}")
            )
    if problems:
        raise TableValidationError(problems)
    return df


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


ATTRS_KEY = b"bayesprism.attrs"


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a trace table to Parquet, attrs included (as JSON in the file metadata).

    The file is written to a temporary name and renamed, so a crash never leaves half a file.

    Examples
    --------
    >>> import pandas as pd
    >>> df = pd.DataFrame({"run": ["r"], "step": [0], "rank": [0], "node": ["n0"], "gpu": [0],
    ...                    "kernel": ["gemm_a"], "kernel_class": ["gemm"], "duration_us": [12.5]})
    >>> import pathlib, tempfile
    >>> path = write_table(validate_table(df), pathlib.Path(tempfile.mkdtemp()) / "t.parquet")
    >>> read_table(path)["duration_us"].tolist()
    [12.5]
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[ATTRS_KEY] = json.dumps(_jsonable(df.attrs)).encode()
    table = table.replace_schema_metadata(meta)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a Parquet trace table written by :func:`write_table` (attrs restored, validated).

    Examples
    --------
    >>> table = read_table("table.parquet")  # doctest: +SKIP
    >>> table.attrs["runs"]  # doctest: +SKIP

    :func:`write_table` shows a round trip.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    df = table.to_pandas()
    attrs = json.loads(meta[ATTRS_KEY]) if ATTRS_KEY in meta else empty_attrs()
    df.attrs = attrs
    return validate_table(df, source=str(path))


def select_runs(table: pd.DataFrame, runs) -> pd.DataFrame:
    """The rows of ``runs`` only, with ``attrs["runs"]`` restricted to them (other attrs kept)."""
    keep = {str(r) for r in runs}
    out = table[table["run"].astype(str).isin(keep)].copy()
    for col in out.select_dtypes("category"):
        if col != "kernel_class":
            out[col] = out[col].cat.remove_unused_categories()
    out.attrs = {**table.attrs,
                 "runs": {r: m for r, m in table.attrs.get("runs", {}).items() if r in keep}}
    return out
