"""Trace files → statistics without the trace table: what ``ingest --statistics`` runs.

The statistics of 10^4 rank files (10^8+ kernel launches) must not need the table in memory.
Each file is reduced where it is read (:func:`file_statistics`: a worker process of the
embedded engine, or a Dask worker, :mod:`bayesprism.ingest.distributed`):

* its compute rows to **kernel cells** keyed by the launch's place key
  (:func:`bayesprism.model.statistics.batch_statistics`): the kernel signatures are decided
  across all files at the end (:mod:`bayesprism.ingest.signatures`), and a signature is a set
  of place keys of one name, so cells of place keys are renamed and merged then
  (:func:`bayesprism.model.statistics.merge_statistics`: counts added, means and squared
  deviations pooled exactly);
* all its rows to an :class:`~bayesprism.inventory.InventoryPart` (launches per kernel and
  rank, spans, idle time before synchronisations), finished at the end the same way;
* its collective rows come back as rows: the wait/transfer split needs every participant's
  rows (:mod:`bayesprism.ingest.waits`). They wait in a side file (in the trace table's
  Arrow schema, as :func:`~bayesprism.ingest.parquet.ingest_to_parquet` keeps them) and are
  read back as one table, split, named and reduced at the end.

A place key launches about once per micro-batch, so a file's cells and launch counts are a
fraction of its rows but still grow with the files: the client writes them to a Parquet side
file as they come (:class:`SideFile`, one row group per file) and, once the signatures are
known, reads them back one file at a time, renamed and merged into signature cells. The rest
of the inventory is a :class:`StatisticsPart` (an :class:`~bayesprism.ingest.summary.
Accumulator`), merged by the Dask engine's tree reduction on the cluster. So the client holds
the collective rows, the job's signature cells and one file's cells: never a compute row. In-
memory tables go through the same reduction as one batch
(:func:`bayesprism.statistics.statistics_of`).

Every kernel cell is one GPU's, and a GPU's launches are in its rank's file, so cells are
never merged across files: the statistics equal those of the whole table but for the order
in which a signature's place keys are summed (relative differences of 1e-16 in means), and
are the same on both engines, bit for bit.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd

from bayesprism.errors import InputError, Problem
from bayesprism.ingest import dispatch
from bayesprism.ingest.distributed import ingest_engine
from bayesprism.ingest.layout import check_layout
from bayesprism.ingest.parquet import arrow_schema, to_arrow
from bayesprism.ingest.signatures import apply_signatures
from bayesprism.ingest.summary import Accumulator
from bayesprism.inventory import InventoryPart, is_step_table
from bayesprism.model.statistics import (
    ModelStatistics,
    batch_statistics,
    empty_collective_cells,
    merge_statistics,
)
from bayesprism.schema import signature_as_kernel, validate_table

#: Columns of the kernel cells of one file kept as categories (one label per distinct value).
_LABEL_COLUMNS = ("run", "node", "kernel", "kernel_class")
#: No collective cells (those of the files' kernel cells, which hold no collective rows).
_NO_CELLS = empty_collective_cells()


class StatisticsPart(Accumulator):
    """The statistics of some files or tables: kernel cells (one batch each) and the inventory.

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"] * 2, "step": [0, 1], "node": ["n0"] * 2,
    ...                       "gpu": [0, 0], "rank": [0, 0], "kernel": ["k"] * 2,
    ...                       "kernel_class": ["gemm"] * 2, "duration_us": [1.0, 2.0]})
    >>> part = StatisticsPart.of(table.iloc[:1])
    >>> part.merge(StatisticsPart.of(table.iloc[1:]))
    >>> len(part.cells)
    2
    """

    def __init__(self) -> None:
        self.cells: list[ModelStatistics] = []
        self.inventory = InventoryPart()

    def merge(self, other: StatisticsPart) -> None:
        """Add a later file's (or table's) statistics."""
        self.cells.extend(other.cells)
        self.inventory.merge(other.inventory)

    @classmethod
    def of(cls, table: pd.DataFrame) -> StatisticsPart:
        """The statistics of a whole trace table (collectives already split), kernels named
        by their signatures (:func:`~bayesprism.schema.signature_as_kernel`)."""
        table = signature_as_kernel(table)
        part = cls()
        part.inventory = InventoryPart.of(table)
        part.cells.append(batch_statistics(table))
        return part


def file_statistics(df: pd.DataFrame) -> tuple:
    """What the client takes of one file, computed where the file is read (the ``finish`` of
    :func:`bayesprism.ingest.dispatch.read_file`).

    Returns
    -------
    (collective rows, kernel cells, launch counts, part)
        The file's collective rows (None without any); the kernel cells of its other rows,
        by place key (None without any); the inventory's launches per kernel and rank; and
        a :class:`StatisticsPart` with the rest of its inventory, merged with the other files'
        on the cluster. Cells and launch counts grow with the files' place keys, so the
        client writes them to disk as they come (:class:`SideFile`) instead of holding them.

    Raises
    ------
    InputError
        Step-level logs (they have no kernel cells; fitted from the logs themselves): the
        file is then reported as a bad file with this reason.

    Examples
    --------
    >>> table = pd.DataFrame({"run": ["r"], "step": [0], "node": ["n0"], "gpu": [0],
    ...                       "rank": [0], "kernel": ["k"], "kernel_class": ["gemm"],
    ...                       "duration_us": [1.0], "start_us": [0.0]})
    >>> rows, cells, launches, part = file_statistics(table)
    >>> rows is None, int(cells["n"].sum()), launches["n"].tolist()
    (True, 1, [1])
    """
    if "kernel_class" in df and is_step_table(df):
        sources = [f for meta in (df.attrs.get("runs") or {}).values()
                   for f in (meta or {}).get("source_files") or []]
        raise step_logs_error(sources[0] if sources else "statistics")
    coll = dispatch.collective_mask(df)
    named = signature_as_kernel(df)
    part = StatisticsPart()
    part.inventory = InventoryPart.of(named)
    launches = part.inventory.frame("launches")
    part.inventory.frames["launches"] = []
    cells = None if coll.all() else _compact(batch_statistics(named.loc[~coll]).kernel_cells)
    return (df.loc[coll] if coll.any() else None), cells, launches, part


def step_logs_error(source: str) -> InputError:
    """The error for step-level logs given where statistics are made.

    Examples
    --------
    >>> str(step_logs_error("log.txt")).startswith("log.txt: kernel_class")
    True
    """
    return InputError(Problem(
        source, "kernel_class", "step-level logs have no kernel cells to summarise: fit the "
        "logs themselves (--spec step)", example="step"))


def _compact(cells: pd.DataFrame) -> pd.DataFrame:
    """A file's kernel cells with their labels as categories: a place key of 100-odd
    characters is held once per file, not once per cell."""
    return cells.astype({c: "category" for c in _LABEL_COLUMNS})


class SideFile:
    """Frames written to a Parquet file as they come, one row group each, and read back one
    at a time: what grows with the number of files stays on disk until it is reduced.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> side = SideFile(pathlib.Path(tempfile.mkdtemp()) / "cells.parquet")
    >>> side.write(pd.DataFrame({"k": pd.Categorical(["a"]), "n": [1]}))
    >>> side.write(pd.DataFrame({"k": pd.Categorical(["b", "c"]), "n": [2, 3]}))
    >>> [len(frame) for frame in side.frames()]
    [1, 2]
    """

    def __init__(self, path: Path, schema=None) -> None:
        self.path = path
        self._writer = None
        self._schema = schema
        self._rows = schema is not None  # trace-table rows (else any frames)
        #: the columns of the frames written
        self.columns: set[str] = set()

    def write(self, frame: pd.DataFrame) -> None:
        """Append one frame: as trace-table rows of ``schema`` when one was given, else with
        its categories as strings (the first frame's schema for all)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.columns.update(frame.columns)
        if self._rows:
            table = to_arrow(frame, self._schema)
        else:
            table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(
                None)
        if self._writer is None and self._rows:
            self._writer = pq.ParquetWriter(self.path, self._schema)
        elif self._writer is None:
            self._schema = pa.schema([
                pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
                for f in table.schema])
            self._writer = pq.ParquetWriter(self.path, self._schema)
        self._writer.write_table(table.cast(self._schema), row_group_size=max(len(frame), 1))

    def frames(self) -> Iterator[pd.DataFrame]:
        """The frames written, in order (after closing the writer)."""
        import pyarrow.parquet as pq

        if self._writer is None:
            return
        self._writer.close()
        found = pq.ParquetFile(self.path)
        for i in range(found.num_row_groups):
            yield found.read_row_group(i).to_pandas()

    def table(self) -> pd.DataFrame | None:
        """Every frame written, as one (None when none was), with the columns written only."""
        import pyarrow.parquet as pq

        if self._writer is None:
            return None
        self._writer.close()
        return pq.read_table(self.path, columns=[c for c in self._schema.names
                                                 if c in self.columns]).to_pandas()


def stream_statistics(paths, *, gpus_per_node: int | None = None,
                      column_map: dict | None = None, layout: Mapping | None = None,
                      progress: bool = True, engine: str = "embedded", client=None,
                      strict: bool | None = None, spill_dir: str | os.PathLike | None = None
                      ) -> tuple[StatisticsPart, dict, dict]:
    """Read trace files into their statistics, file by file (module docstring).

    Parameters
    ----------
    paths, gpus_per_node, column_map, layout, progress, engine, client, strict
        As in :func:`bayesprism.ingest.read_traces`.
    spill_dir
        Where the files' kernel cells and launch counts wait, on disk, for the kernel
        signatures (a temporary folder in it, removed on return; default: the system's).

    Returns
    -------
    (part, signatures, attrs)
        The statistics (kernels as place keys where the files have them), the place key →
        signature map, and the run metadata (``runs``, ``skipped``, ``notes``) that
        :func:`~bayesprism.ingest.read_traces` would give the table.

    Raises
    ------
    TraceFormatError
        Listing every problem in every file.

    Examples
    --------
    >>> part, signatures, attrs = stream_statistics(["traces/"])  # doctest: +SKIP
    """
    files, problems = dispatch.expand_paths(paths)
    collector = dispatch.IngestCollector(problems=list(problems))
    options = dispatch.reader_options(gpus_per_node, None, column_map, check_layout(layout))
    part = StatisticsPart()
    read_any = False
    with tempfile.TemporaryDirectory(prefix="bayesprism-statistics-", dir=spill_dir) as tmp, \
            ingest_engine(engine, client=client, progress=progress) as reads:
        cells, launches = SideFile(Path(tmp) / "cells.parquet"), SideFile(
            Path(tmp) / "launches.parquet")
        # on disk too: a few hundred rows of 27 columns per file cost more as frames
        collectives = SideFile(Path(tmp) / "collectives.parquet", arrow_schema())
        for rows, file_cells, file_launches, file_part in dispatch.iter_frames(
                files, options, collector, progress and reads is None,
                finish=file_statistics, read=reads,
                strict=dispatch.resolve_strict(strict, reads)):
            read_any = True
            part.merge(file_part)
            for side, frame in ((cells, file_cells), (launches, file_launches),
                                (collectives, rows)):
                if frame is not None and len(frame):
                    side.write(frame)
        if reads is not None:  # the inventory and place keys reduced on the cluster
            reads.add_totals(collector, part)
        signatures = collector.finish()
        dispatch.raise_problems(collector, read_any)
        # file by file, place keys renamed by signatures and their cells merged: what stays
        # in memory is the job's signature cells and launch counts
        for frame in cells.frames():
            part.cells.append(merge_statistics([ModelStatistics(frame, _NO_CELLS)],
                                               kernels=signatures))
        for frame in launches.frames():
            part.inventory.frames["launches"].append(_renamed_launches(frame, signatures))
        rows = collectives.table()
    if rows is not None:
        table = _collective_table(rows, collector, signatures)
        part.cells.append(batch_statistics(signature_as_kernel(table),
                                           gpus_per_node=_gpus_per_run(part)))
    return part, signatures, collector.attrs


def _renamed_launches(launches: pd.DataFrame, signatures: dict[str, str]) -> pd.DataFrame:
    """A file's launch counts by kernel signature, not place key."""
    if not signatures:
        return launches
    named = launches.assign(kernel=launches["kernel"].map(lambda k: signatures.get(k, k)))
    return named.groupby(["run", "kernel", "kernel_class", "rank"], sort=True)[
        ["n", "tail_n"]].sum().reset_index()


def _collective_table(table: pd.DataFrame, collector: dispatch.IngestCollector,
                      signatures: dict[str, str]) -> pd.DataFrame:
    """The collective rows of every file, named by their signatures, with their durations
    split into waiting and transfer (as :func:`read_traces` splits them)."""
    if signatures and "signature" in table:
        table["signature"] = apply_signatures(table["signature"], signatures)
    table["wait_us"], table["transfer_us"] = dispatch.split_collectives(table, collector)
    table = validate_table(table, source="collective rows")
    table.attrs = collector.attrs
    return table


def _gpus_per_run(part: StatisticsPart) -> dict[str, float]:
    """GPUs per node of each run, as the whole table says it without run metadata (largest
    local index + 1 over all rows; the collective rows alone may miss a GPU)."""
    gpus: dict[str, float] = {}
    for stats in part.cells:
        cells = stats.kernel_cells
        if len(cells):
            top = cells.groupby(cells["run"].astype(str), observed=True)["gpu"].max()
            for run, gpu in top.items():
                gpus[run] = max(gpus.get(run, 0.0), float(gpu) + 1)
    return gpus


__all__ = ["StatisticsPart", "file_statistics", "step_logs_error", "stream_statistics"]
