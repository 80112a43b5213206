"""Ingest and aggregate on Dask: one task per trace file, a tree reduction of the statistics.

A job profiled on every rank of 10^4 GPUs leaves 10^4 trace files, terabytes of JSON: more than
one machine parses in reasonable time. ``engine="dask"`` (``bayesprism ingest --engine dask``)
runs the embedded engine's per-file work on a Dask cluster, and nothing else changes:

* **one task per file**: :func:`bayesprism.ingest.dispatch.read_file` (read → validated rows →
  the file's partial statistics: its :class:`~bayesprism.ingest.summary.Accumulator` values,
  such as the :class:`~bayesprism.ingest.summary.SummaryAccumulator` of the rows written or
  the kernel cells and inventory of ``ingest --statistics``
  (:class:`bayesprism.statistics.stream.StatisticsPart`), and the
  :class:`~bayesprism.ingest.signatures.SignatureStats` of its place keys), exactly the
  function the embedded engine's worker processes run;
* **a tree reduction** of the partial statistics on the cluster (:class:`TreeReduction`:
  groups of :data:`FAN_IN` consecutive files merged by the same ``merge`` methods the embedded
  engine calls, then groups of groups), so the client never receives one file's statistics;
* the rows come back to the client **in file order**, where
  :func:`bayesprism.ingest.dispatch.iter_frames` checks each file against the others of its
  run and the caller writes them (:func:`~bayesprism.ingest.parquet.ingest_to_parquet`) or
  joins them (:func:`~bayesprism.ingest.read.read_traces`) as the embedded engine does. For
  statistics (:func:`bayesprism.statistics.ingest_statistics`,
  :mod:`bayesprism.statistics.stream`) the compute rows never come back: the workers reduce
  them to kernel cells by place key, which come back file by file (cells of different GPUs
  never merge, so a tree would only gather them) and wait on the client's disk for the kernel
  signatures; only the collective rows come back as rows (the wait/transfer split needs every
  participant's), and the inventory is merged by the tree reduction.

So the table is the embedded engine's, row for row. The statistics are the same sums added in
another order: counts are equal, and floating-point sums equal to the last bit or two (bit for
bit when there are at most :data:`FAN_IN` files, where the tree is one sequential merge).

Failures. A file that cannot be read comes back as problems, not an exception: it is skipped
and named with its reason (``strict=False``, the default here) or fails the read (``strict``).
A worker that dies (killed, out of memory) loses its running task and the results it held;
the scheduler runs those tasks again elsewhere (up to ``distributed.scheduler.allowed-failures``
times). Each file's result is one task's output, taken once by the client and once by the
reduction, so a file read twice is still counted once.

Memory. Each worker runs one task at a time (one thread per worker process: parsing holds the
GIL) and at most :data:`AHEAD` files per worker thread are submitted ahead of the client, so a
worker holds one file being parsed and a few files' rows: bounded by the largest file, not by
the number of files. The client holds one file's rows at a time (plus the collective rows, as
the embedded engine does); reading statistics, it never holds compute rows at all.

On a cluster, every worker must have bayesprism installed and see the trace files at the same
paths as the client (a shared file system; give absolute paths).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from bayesprism.errors import InputError, Problem, TraceFormatError
from bayesprism.ingest.dispatch import FileFacts, IngestCollector, read_file
from bayesprism.ingest.signatures import SignatureStats
from bayesprism.ingest.summary import Accumulator

# dask and distributed are optional (`bayesprism[dask]`): imported where the engine is used.

#: Ingest engines: this machine (processes per ``BAYESPRISM_INGEST_WORKERS``), or Dask.
ENGINES: tuple[str, ...] = ("embedded", "dask")
#: Partial statistics merged per reduction task.
FAN_IN = 16
#: Files submitted ahead of the client per worker thread (bounds what workers hold).
AHEAD = 2

#: (the file's accumulators, in the order of its result, its place keys)
Statistics = tuple[tuple[Accumulator, ...], SignatureStats]


@contextlib.contextmanager
def ingest_engine(engine: str = "embedded", *, client=None, scheduler: str | None = None,
                  progress: bool = True, fan_in: int = FAN_IN,
                  task: Callable = read_file) -> Iterator[DaskReads | None]:
    """The ``read`` of :func:`~bayesprism.ingest.dispatch.iter_frames` for an engine.

    Parameters
    ----------
    engine
        ``"embedded"`` (yields None: the default reading) or ``"dask"``.
    client
        A ``distributed.Client`` to use (not closed here).
    scheduler
        Address of a Dask scheduler to connect to (``tcp://host:8786``), when no client is
        given; with neither, a local cluster with one single-threaded worker process per core
        is started, and closed on exit.
    progress
        Show files done out of the total (on a terminal).
    fan_in, task
        As in :class:`DaskReads`.

    Yields
    ------
    DaskReads or None

    Raises
    ------
    InputError
        An unknown engine, a client or scheduler with the embedded engine, Dask not installed,
        a scheduler that cannot be reached.

    Examples
    --------
    >>> with ingest_engine("embedded") as reads:
    ...     reads is None
    True
    """
    if engine not in ENGINES:
        raise InputError(Problem("engine", "", f"must be one of {', '.join(ENGINES)}",
                                 example=engine))
    if engine == "embedded":
        if client is not None or scheduler is not None:
            raise InputError(Problem("engine", "", "a Dask client or scheduler needs "
                                     "engine 'dask'", example=engine))
        yield None
        return
    with dask_client(client, scheduler) as dask:
        yield DaskReads(dask, progress=progress, fan_in=fan_in, task=task)


@contextlib.contextmanager
def dask_client(client=None, scheduler: str | None = None, *,
                workers: int | None = None) -> Iterator:
    """A ``distributed.Client``: ``client`` itself, one connected to ``scheduler``, or one of
    a local cluster of ``workers`` single-threaded worker processes (default: one per core),
    closed on exit.

    Raises
    ------
    InputError
        Dask not installed, or the scheduler cannot be reached.

    Examples
    --------
    >>> from bayesprism.ingest import ingest_to_parquet                      # doctest: +SKIP
    >>> with dask_client(scheduler="tcp://head:8786") as client:             # doctest: +SKIP
    ...     summary = ingest_to_parquet(["/shared/traces"], "table.parquet", engine="dask",
    ...                                 client=client)
    """
    try:
        import distributed
    except ModuleNotFoundError:
        raise InputError(Problem("engine", "dask", "needs Dask, which is not installed: "
                                 "pip install 'bayesprism[dask]'")) from None
    if client is not None:
        if not isinstance(client, distributed.Client):
            raise InputError(Problem("client", "", "must be a distributed.Client",
                                     example=type(client).__name__))
        yield client
        return
    if scheduler:
        try:
            connected = distributed.Client(scheduler, timeout="20s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(Problem(scheduler, "--scheduler",
                                     f"cannot connect to a Dask scheduler: {exc}")) from None
        with connected:
            yield connected
        return
    import dask

    # One thread per process: reading a trace is Python code holding the GIL. No dashboard, so
    # no statistical profiler feeding it either (it samples every worker's stack each 10 ms:
    # 5-10 % of the workers' time on the 64 dev trace files, 2 cores); the workers take the
    # config as they start.
    with dask.config.set({"distributed.worker.profile.enabled": False}):
        cluster = distributed.LocalCluster(n_workers=workers or os.cpu_count() or 1,
                                           threads_per_worker=1,
                                           processes=True, dashboard_address=None)
    with cluster, distributed.Client(cluster) as local:
        yield local


class DaskReads:
    """Runs :func:`~bayesprism.ingest.dispatch.read_file` tasks on Dask, one per file.

    Called with the tasks of :func:`~bayesprism.ingest.dispatch.iter_frames`, it yields their
    results in task order, each with its statistics taken out (empty accumulators, no place
    keys): those are reduced on the cluster, and :meth:`add_totals` adds the reduction to the
    caller's collector and accumulators afterwards.

    Parameters
    ----------
    client
        A ``distributed.Client``.
    progress
        Show files done out of the total (a bar on a terminal).
    fan_in
        Partial statistics merged per reduction task (≥ 2).
    task
        The per-file function, ``read_file``'s signature and result (a test makes one that
        kills its worker).

    Examples
    --------
    >>> from distributed import Client                                   # doctest: +SKIP
    >>> from bayesprism.ingest.parquet import ingest_to_parquet          # doctest: +SKIP
    >>> with Client(n_workers=2, threads_per_worker=1) as client:        # doctest: +SKIP
    ...     summary = ingest_to_parquet(["traces/"], "table.parquet", engine="dask",
    ...                                 client=client)
    """

    def __init__(self, client, *, progress: bool = True, fan_in: int = FAN_IN,
                 task: Callable = read_file) -> None:
        if fan_in < 2:
            raise InputError(Problem("fan_in", "", "must be at least 2", example=fan_in))
        self.client = client
        self.progress = progress
        self.fan_in = int(fan_in)
        self.task = task
        #: files whose result was handed on, out of ``files_total`` (of the last call)
        self.files_done = 0
        self.files_total = 0
        self._total = None

    def _window(self) -> int:
        threads = sum(self.client.nthreads().values()) or 1
        return max(2, AHEAD * threads)

    def __call__(self, tasks: list[tuple]) -> Iterator[tuple]:
        """``read_file(*t)`` of each task ``t``, in order, read on the cluster."""
        from tqdm.auto import tqdm

        client = self.client
        self.files_done, self.files_total, self._total = 0, len(tasks), None
        reduction = TreeReduction(client, self.fan_in)
        window = self._window()
        pending: dict[int, object] = {}
        bar = tqdm(total=len(tasks), desc="ingest (dask)", unit="file",
                   disable=None if self.progress else True, leave=False)

        closed = False

        def done(_future) -> None:  # on the client's callback thread, as each file finishes
            if not closed:
                bar.update(1)

        def submit(i: int) -> None:
            # The file's full result stays on its worker: the client takes the rows, the
            # reduction the statistics; it is released once both have them.
            full = client.submit(self.task, *tasks[i], pure=False)
            pending[i] = client.submit(_without_statistics, full, pure=False)
            pending[i].add_done_callback(done)
            reduction.add(client.submit(_statistics, full, pure=False))

        try:
            for i in range(min(window, len(tasks))):
                submit(i)
            for i in range(len(tasks)):
                if i + window < len(tasks):
                    submit(i + window)
                future = pending.pop(i)
                result = _result(future, tasks[i][1])
                future.release()
                self.files_done += 1
                yield result
            self._total = reduction.result()
        finally:
            closed = True
            bar.close()
            for future in pending.values():  # a consumer that stopped early: cancel the rest
                future.cancel()

    def add_totals(self, collector: IngestCollector, *accumulators: Accumulator) -> None:
        """Add the reduced statistics of the files read to ``collector`` (place keys) and
        ``accumulators`` (one per accumulator of a file's result, in order), what the
        embedded engine merges file by file."""
        if self._total is None:
            return
        totals, signatures = _result(self._total, "the reduction of the statistics")
        self._total = None
        collector.signature_stats.merge(signatures)
        # no totals when no file was read: strict=False leaves the accumulators empty
        for target, total in zip(accumulators, totals, strict=False):
            target.merge(total)


class TreeReduction:
    """Merges futures of partial statistics on the cluster, :data:`FAN_IN` at a time.

    Groups are consecutive (in the order added) and their shape depends on the number of
    inputs only, so the result is the same from run to run whatever the scheduling.
    """

    def __init__(self, client, fan_in: int = FAN_IN) -> None:
        self.client = client
        self.fan_in = int(fan_in)
        self.levels: list[list] = []

    def add(self, future, level: int = 0) -> None:
        """Add a future of :data:`Statistics`; merge a full group as soon as it is one."""
        while len(self.levels) <= level:
            self.levels.append([])
        self.levels[level].append(future)
        if len(self.levels[level]) == self.fan_in:
            group, self.levels[level] = self.levels[level], []
            self.add(self.client.submit(merge_statistics, *group, pure=False), level + 1)

    def result(self):
        """A future of the merge of everything added (None when nothing was)."""
        # the higher levels hold the earlier files: merged first, to keep file order
        rest = [f for level in reversed(self.levels) for f in level]
        self.levels = []
        if not rest:
            return None
        if len(rest) == 1:
            return rest[0]
        return self.client.submit(merge_statistics, *rest, pure=False)


def merge_statistics(*parts: Statistics) -> Statistics:
    """Partial statistics merged in order, into new accumulators (inputs untouched: Dask may
    hand them to a retried task again).

    Examples
    --------
    >>> a, b = SignatureStats({"k": 1}, {"k": 2.0}, {"k": 4.0}), SignatureStats({"k": 2},
    ...     {"k": 3.0}, {"k": 5.0})
    >>> totals, keys = merge_statistics(((), a), ((), b))
    >>> totals, keys.count, keys.log_sum
    ((), {'k': 3}, {'k': 5.0})
    """
    merged: list[Accumulator] = []
    signatures = SignatureStats()
    for accumulators, part_signatures in parts:
        if accumulators and not merged:
            merged = [type(a)() for a in accumulators]
        for total, accumulator in zip(merged, accumulators, strict=False):
            total.merge(accumulator)
        signatures.merge(part_signatures)
    return tuple(merged), signatures


def _statistics(result: tuple) -> Statistics:
    """The partial statistics of one file's :func:`read_file` result (empty for a bad file)."""
    part, facts, _report, _problems = result
    if facts is None:
        return (), SignatureStats()
    return _accumulators(part), facts.signatures


def _accumulators(part) -> tuple[Accumulator, ...]:
    """The accumulators of a file's result (a tuple whose other items are rows)."""
    return tuple(p for p in part if isinstance(p, Accumulator)) if isinstance(
        part, tuple) else ()


def _without_statistics(result: tuple) -> tuple:
    """One file's :func:`read_file` result without what the reduction carries: empty
    accumulators in place of the file's, its ranks and steps without the place keys."""
    part, facts, report, problems = result
    if facts is None:
        return result
    if isinstance(part, tuple):
        part = tuple(type(p)() if isinstance(p, Accumulator) else p for p in part)
    return part, FileFacts(ranks=facts.ranks, steps=facts.steps), report, problems


def _result(future, source) -> object:
    """A future's result; a task that killed every worker it ran on names its file."""
    from distributed import KilledWorker

    try:
        return future.result()
    except KilledWorker as exc:
        raise TraceFormatError(Problem(
            str(source), "", f"killed the Dask workers that read it ({exc}); out of memory? "
            "give workers more memory")) from None


__all__ = ["AHEAD", "ENGINES", "FAN_IN", "DaskReads", "TreeReduction", "dask_client",
           "ingest_engine", "merge_statistics"]
