"""Parquet trace tables: streaming ingestion into one, and reading them back beside raw traces.

* :func:`ingest_to_parquet`: trace files → one Parquet trace table, file by file, bounded memory.
* :func:`read_inputs`: what a command is given (Parquet trace tables and raw traces or logs)
  → trace tables, with the user's layout facts applied to every run of either kind.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism.errors import InputError, Problem
from bayesprism.ingest.dispatch import (
    IngestCollector,
    collective_mask,
    expand_paths,
    iter_frames,
    raise_problems,
    reader_options,
    resolve_strict,
    split_collectives,
)
from bayesprism.ingest.distributed import ingest_engine
from bayesprism.ingest.layout import check_layout, table_with_layout
from bayesprism.ingest.read import read_traces
from bayesprism.ingest.summary import SummaryAccumulator
from bayesprism.outputs import check_output_path
from bayesprism.schema import ALL_COLUMNS, ATTRS_KEY, REQUIRED_COLUMNS, _jsonable, read_table

# pyarrow is imported inside the functions that write Parquet (start-up time of the workers).

#: Columns the wait/transfer split reads from the collective rows.
SPLIT_COLUMNS = ("run", "step", "rank", "node", "kernel", "occurrence", "process_group",
                 "group_size", "start_us", "duration_us")
#: File suffixes read by :func:`read_inputs` as whole trace tables (with their run metadata).
TABLE_SUFFIXES = (".parquet", ".pq")


def arrow_schema():
    """The Arrow schema of every trace-table column (categories as dictionaries)."""
    import pyarrow as pa

    types = {
        "category": pa.dictionary(pa.int32(), pa.string()),
        "int64": pa.int64(), "Int64": pa.int64(), "float64": pa.float64(),
    }
    fields = []
    for col, dtype in ALL_COLUMNS.items():
        kind = "category" if not isinstance(dtype, str) else dtype
        fields.append(pa.field(col, types[kind], nullable=col not in REQUIRED_COLUMNS))
    return pa.schema(fields)


def to_arrow(df: pd.DataFrame, schema):
    """A trace-table frame as an Arrow table of ``schema`` (absent columns all null)."""
    import pyarrow as pa

    arrays = []
    for fld in schema:
        if fld.name in df.columns:
            series = df[fld.name]
            if pa.types.is_dictionary(fld.type):
                if not isinstance(series.dtype, pd.CategoricalDtype):
                    series = series.astype("category")
                codes = series.cat.codes.to_numpy()
                arr = pa.DictionaryArray.from_arrays(
                    pa.array(codes.astype(np.int32), mask=codes < 0),
                    pa.array(series.cat.categories.astype(str).to_numpy(dtype=object),
                             type=pa.string()))
            elif pa.types.is_integer(fld.type):
                arr = pa.array(series.astype("Int64").to_numpy(dtype=object, na_value=None)
                               if series.hasnans else series.to_numpy(dtype=np.int64),
                               type=fld.type)
            else:
                arr = pa.array(series.to_numpy(dtype=np.float64, na_value=np.nan),
                               type=fld.type, from_pandas=True)
        else:
            arr = pa.nulls(len(df), type=fld.type)
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=schema)


def ingest_to_parquet(paths, out: str | Path, *, gpus_per_node: int | None = None,
                      rank_to_node: dict | None = None, column_map: dict | None = None,
                      layout: Mapping | None = None, progress: bool = True,
                      engine: str = "embedded", client=None, strict: bool | None = None) -> dict:
    """Read trace files one at a time into a Parquet trace table, with bounded memory.

    Pass 1 reads file by file: non-collective rows go straight to the output file, collective
    rows to a side file. Pass 2 reads the collective rows only, splits their durations into
    wait and transfer (:mod:`bayesprism.ingest.waits`) and appends them; where kernel
    signatures rename place keys (:mod:`bayesprism.ingest.signatures`), the rows written and
    the collective rows are streamed into the final file with their signatures in one pass
    (pass 2 and 3 together: the collective rows are written once). The run metadata is
    stored as :func:`bayesprism.schema.write_table` does, so
    :func:`bayesprism.schema.read_table` reads the file back (validated, attrs restored).
    Every optional schema column is present in the file (empty where no input had it).
    Written to a temporary name and renamed: a failure never leaves a partial ``out``.

    Parameters
    ----------
    paths, gpus_per_node, rank_to_node, column_map, layout, progress, engine, client, strict
        As in :func:`read_traces`: stated layout facts are set on each run as its files are
        read, so the run metadata written carries them (provenance ``"user"``). With
        ``engine="dask"`` the files are read on the cluster and their rows written here, in
        file order, so the table is the embedded engine's.
    out
        Output Parquet file.

    Returns
    -------
    dict
        The summary of the written table (:func:`bayesprism.ingest.summary.summarize_table`).

    Raises
    ------
    TraceFormatError
        Listing every problem in every file; nothing is written then.
    InputError
        A bad ``layout`` or a missing output folder; nothing is read then.
    """
    import pyarrow.parquet as pq

    out = Path(out)
    check_output_path(out, "output")
    options = reader_options(gpus_per_node, rank_to_node, column_map, check_layout(layout))
    files, problems = expand_paths(paths)
    collector = IngestCollector(problems=list(problems))
    schema = arrow_schema()
    tmp_out = out.with_name(out.name + ".tmp")
    tmp_coll = out.with_name(out.name + ".collectives.tmp")
    tmp_sig = out.with_name(out.name + ".signatures.tmp")
    summary = SummaryAccumulator()
    wrote = False
    # the Dask cluster (when one is started here) lives for pass 1 only
    engine_scope = contextlib.ExitStack()
    reads = engine_scope.enter_context(ingest_engine(engine, client=client, progress=progress))
    try:
        # store_schema=False: readers then take the schema metadata from the key-value metadata
        # added at the end (the attrs), instead of the Arrow schema frozen at the start.
        with pq.ParquetWriter(tmp_out, schema, store_schema=False) as writer, \
                pq.ParquetWriter(tmp_coll, schema) as coll_writer:
            for rest, coll, part in iter_frames(files, options, collector,
                                                progress and reads is None, finish=_file_parts,
                                                read=reads, strict=resolve_strict(strict, reads)):
                wrote = True
                summary.merge(part)
                if rest is not None:
                    writer.write_table(rest)
                if coll is not None:
                    coll_writer.write_table(coll)
            if reads is not None:  # the statistics reduced on the cluster
                reads.add_totals(collector, summary)
                engine_scope.close()
            coll_writer.close()
            signatures = collector.finish()
            raise_problems(collector, wrote)
            if not signatures:
                split = _split_side_file(tmp_coll, collector, summary)
                for batch in _collective_batches(tmp_coll, schema, split):
                    writer.write_batch(batch)
                writer.add_key_value_metadata(_attrs_metadata(collector))
        if signatures:
            # passes 2 and 3 in one: the written rows and then the collective rows (waits
            # split off), each batch with its place keys replaced by signatures. The split
            # runs in a thread while the written rows are rewritten (Arrow's reading and
            # writing release the GIL).
            with ThreadPoolExecutor(1) as pool:
                split = pool.submit(_split_side_file, tmp_coll, collector, summary)
                with pq.ParquetWriter(tmp_sig, schema, store_schema=False) as final:
                    # every categorical column read as a dictionary, as it is written: not
                    # decoded to strings and encoded again
                    for batch in pq.ParquetFile(tmp_out, read_dictionary=_dictionary_columns(
                            schema)).iter_batches(batch_size=1 << 18):
                        final.write_batch(_with_signatures(batch, schema, signatures))
                    for batch in _collective_batches(tmp_coll, schema, split.result()):
                        final.write_batch(_with_signatures(batch, schema, signatures))
                    final.add_key_value_metadata(_attrs_metadata(collector))
            summary.rename_signatures(signatures)
            tmp_sig.replace(tmp_out)
        tmp_out.replace(out)
    finally:
        engine_scope.close()
        for tmp in (tmp_out, tmp_coll, tmp_sig):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return summary.result(collector.attrs)


def _file_parts(df: pd.DataFrame) -> tuple:
    """One file's rows as Arrow tables, where the file was read (a worker process): the rows
    written at once and the collective rows kept for the wait/transfer split (None where
    there are none), and the summary of all (the split's transfers are counted after it)."""
    schema = arrow_schema()
    coll = collective_mask(df)
    rest = df.loc[~coll]
    summary = SummaryAccumulator()
    summary.add(df)
    return (to_arrow(rest, schema) if len(rest) else None,
            to_arrow(df.loc[coll], schema) if coll.any() else None, summary)


def _attrs_metadata(collector: IngestCollector) -> dict:
    """The run metadata as the Parquet key-value metadata :func:`read_table` restores."""
    return {ATTRS_KEY: json.dumps(_jsonable(collector.attrs)).encode()}


def _split_side_file(side_file: Path, collector: IngestCollector,
                     summary: SummaryAccumulator) -> tuple[np.ndarray, np.ndarray] | None:
    """Pass 2: the wait and transfer of every collective row of the side file
    (:mod:`bayesprism.ingest.waits`; the rows with a transfer counted in ``summary``), None
    when it has no rows."""
    import pyarrow.parquet as pq

    side = pq.ParquetFile(side_file)
    if side.metadata.num_rows == 0:
        return None
    wait, transfer = split_collectives(side.read(columns=list(SPLIT_COLUMNS)).to_pandas(),
                                       collector)
    summary.count_split(int(np.isfinite(transfer).sum()))
    return wait, transfer


def _collective_batches(side_file: Path, schema, split):
    """The collective rows of the side file as record batches, with the wait and transfer of
    ``split`` (:func:`_split_side_file`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if split is None:
        return
    wait, transfer = split
    i_wait, i_transfer = schema.get_field_index("wait_us"), schema.get_field_index("transfer_us")
    offset = 0
    for batch in pq.ParquetFile(side_file).iter_batches(batch_size=1 << 16):
        n = batch.num_rows
        columns = list(batch.columns)
        columns[i_wait] = pa.array(wait[offset:offset + n], type=pa.float64())
        columns[i_transfer] = pa.array(transfer[offset:offset + n], type=pa.float64())
        yield pa.RecordBatch.from_arrays(columns, schema=schema)
        offset += n


def _dictionary_columns(schema) -> list[str]:
    """The columns of ``schema`` stored as Arrow dictionaries (the categorical ones)."""
    import pyarrow as pa

    return [field.name for field in schema if pa.types.is_dictionary(field.type)]


def _with_signatures(batch, schema, mapping: dict[str, str]):
    """Pass 3: a batch with place keys replaced by signatures
    (:mod:`bayesprism.ingest.signatures`), in Arrow: only the signature column's dictionary
    indices change."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = schema.get_field_index("signature")
    sig = batch.column(column)
    if not pa.types.is_dictionary(sig.type):
        sig = sig.dictionary_encode()
    keys = sig.dictionary.to_pylist()
    names = [mapping.get(k, k) for k in keys]
    uniques = sorted(set(names))
    position = {name: i for i, name in enumerate(uniques)}
    index_map = pa.array([position[name] for name in names], type=pa.int32())
    indices = pc.take(index_map, sig.indices)
    new = pa.DictionaryArray.from_arrays(indices, pa.array(uniques, type=pa.string()))
    columns = list(batch.columns)
    columns[column] = new
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _read_table_file(path: Path, problems: list[Problem]) -> pd.DataFrame | None:
    """One Parquet trace table (attrs restored), or None with its problem collected."""
    if not path.is_file():
        problems.append(Problem(str(path), "", "no such file"))
        return None
    try:
        return read_table(path)
    except InputError as exc:
        problems.extend(exc.problems)
    except (OSError, ValueError) as exc:  # pyarrow: not a Parquet file
        problems.append(Problem(str(path), "", f"cannot be read as a Parquet table: {exc}"))
    return None


def read_inputs(paths: Sequence[str | Path], *, layout: Mapping | None = None,
                column_map: Mapping[str, str | None] | None = None,
                progress: bool = True, gpus_per_node: int | None = None,
                engine: str = "embedded", client=None,
                strict: bool | None = None) -> list[pd.DataFrame]:
    """Trace tables from Parquet trace tables (read whole) and raw traces or logs (ingested).

    What ``bayesprism fit`` and ``bayesprism validate`` are given: a Parquet file (a table
    written by ``bayesprism ingest``) keeps its rows and run metadata; every other path (file,
    folder, glob) is read by :func:`read_traces`, all of them into one table.

    Parameters
    ----------
    paths
        Parquet trace tables (:data:`TABLE_SUFFIXES`) and trace files, folders or globs.
    layout
        Layout facts the inputs do not record, applied to every run of both kinds with
        provenance ``"user"`` (:mod:`bayesprism.ingest.layout`).
    column_map
        ``{column in a table: schema column or None}`` for tables with other column names
        (``--columns``); given one, Parquet tables are read through the table readers too.
    progress
        Show a progress bar while ingesting raw traces.
    gpus_per_node, engine, client, strict
        As in :func:`read_traces`, for the raw inputs.

    Returns
    -------
    list of pandas.DataFrame
        The Parquet tables in the order given, then the table of the raw inputs (if any).

    Raises
    ------
    InputError
        Every problem at once: a bad ``layout``, a missing or unreadable table, bad rows, and
        the problems of the raw inputs.
    """
    layout = check_layout(layout)
    tables: list[pd.DataFrame] = []
    problems: list[Problem] = []
    whole = [] if column_map else [p for p in paths if Path(p).suffix.lower() in TABLE_SUFFIXES]
    raw = [p for p in paths if p not in whole]
    for path in (Path(p) for p in whole):
        table = _read_table_file(path, problems)
        if table is not None:
            tables.append(table_with_layout(table, layout))
    if raw:
        try:
            tables.append(read_traces(raw, layout=layout, column_map=column_map,
                                      progress=progress, gpus_per_node=gpus_per_node,
                                      engine=engine, client=client, strict=strict))
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    return tables
