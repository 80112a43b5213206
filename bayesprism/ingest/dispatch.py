"""Find trace files, pick a reader by content, and assemble one validated trace table.

* :func:`expand_paths`: files, directories (searched recursively) and glob patterns.
* :func:`sniff`: the first 64 KiB of a file (decompressed when gzip) decide the reader; the
  extension alone never does. Readers are tried in :data:`READERS` order, each through its
  module's ``can_read(path, head)``.
* :func:`bayesprism.ingest.read.read_traces`: every file into one DataFrame (in memory).
* :func:`bayesprism.ingest.parquet.ingest_to_parquet`: the same, file by file into Parquet with
  bounded memory.
* Layout facts stated by the user (``layout=``) are checked and applied to every run by
  :mod:`bayesprism.ingest.layout`.

Problems are collected across all files and raised together as one
:class:`~bayesprism.errors.TraceFormatError` (one line per problem). Files found by searching a
directory that no reader recognises (a LICENSE, a README) are counted as skipped, not errors;
a file named explicitly that no reader recognises is an error.

Kineto runs: the files of one directory are one run, named after the directory (the path from
the common parent when two directories share a name). Within a run, the same rank twice, a
different world size, a different job name or a start more than :data:`MAX_RUN_SPREAD_US`
away from the other files are errors (files of different runs mixed).
"""

from __future__ import annotations

import glob
import importlib
import inspect
import multiprocessing
import os
import warnings
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism.errors import IngestWarning, InputError, Problem, TraceFormatError
from bayesprism.ingest.benchmarks import ID_COLUMNS
from bayesprism.ingest.files import paused_gc
from bayesprism.ingest.joblayout import reconcile_layout
from bayesprism.ingest.kineto import TRACE_HANDLER_NAME
from bayesprism.ingest.layout import report_with_layout
from bayesprism.ingest.signatures import SignatureStats, signature_map
from bayesprism.ingest.waits import split_notes, split_wait_transfer
from bayesprism.schema import (
    COLLECTIVE_CLASSES,
    REQUIRED_COLUMNS,
    category_in,
    empty_attrs,
    validate_table,
)

# tqdm is imported where a progress bar is shown (start-up time of the ingest workers).

HEAD_BYTES = 64 * 1024
#: Two files of one run whose first kernels are further apart than this are different jobs.
MAX_RUN_SPREAD_US = 3600e6
SKIP_UNRECOGNISED = "file of unrecognised format (found in a directory)"
FORMATS_READ = ("PyTorch profiler/Kineto JSON, MLPerf log, nccl-tests output, benchmark or tidy "
                "CSV/Parquet table")
SKIP_BAD_FILE = "file that cannot be read as a trace (skipped: not strict)"
#: (format name, module, reader function), in the order their ``can_read`` is asked.
READERS: tuple[tuple[str, str, str], ...] = (
    ("kineto", "bayesprism.ingest.kineto", "read_kineto"),
    ("mlperf", "bayesprism.ingest.mlperf", "read_mlperf"),
    ("nccl-tests", "bayesprism.ingest.nccltests", "read_nccl_tests"),
    ("gpu-benchmark", "bayesprism.ingest.benchmarks", "read_gpu_benchmark"),
    ("tabular", "bayesprism.ingest.tabular", "read_tabular"),
)


@dataclass(frozen=True)
class TraceFile:
    """One input file and whether it was named explicitly (or found in a directory)."""

    path: Path
    explicit: bool


def expand_paths(paths: str | Path | Iterable[str | Path]) -> tuple[list[TraceFile],
                                                                    list[Problem]]:
    """Files behind ``paths`` (files, directories searched recursively, glob patterns).

    Hidden files and directories (name starting with ``.``) are ignored. Returns the files in a
    stable order (sorted within each argument, duplicates removed) and the problems found:
    a path that does not exist, a pattern that matches nothing, an empty directory.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[TraceFile] = []
    seen: set[Path] = set()
    problems: list[Problem] = []

    def add(path: Path, explicit: bool) -> None:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            files.append(TraceFile(path, explicit))

    for entry in paths:
        text = str(entry)
        path = Path(text)
        if path.is_dir() and not os.access(path, os.R_OK | os.X_OK):
            problems.append(Problem(text, "", "directory cannot be read (permission denied)"))
        elif path.is_dir():
            found = sorted(
                p for p in path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in
                                           p.relative_to(path).parts)
            )
            if not found:
                problems.append(Problem(text, "", "directory contains no files"))
            for p in found:
                add(p, False)
        elif path.is_file():
            add(path, True)
        elif glob.has_magic(text):
            matched = sorted(Path(p) for p in glob.glob(text, recursive=True))
            matched_files = [p for p in matched if p.is_file()]
            for d in (p for p in matched if p.is_dir()):
                matched_files.extend(sorted(q for q in d.rglob("*") if q.is_file()))
            if not matched_files:
                problems.append(Problem(text, "", "no file matches this pattern"))
            for p in matched_files:
                add(p, True)
        else:
            problems.append(Problem(text, "", "no such file or directory"))
    return files, problems


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    """First ``size`` bytes of a file, decompressed when it is gzip (partial data tolerated;
    OSError when not one byte decompresses)."""
    with path.open("rb") as fh:
        raw = fh.read(size)
        if raw[:2] != b"\x1f\x8b":
            return raw
        decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = b""
        while len(out) < size:
            try:
                out += decomp.decompress(raw, size - len(out))
            except zlib.error as exc:
                if not out:  # nothing readable at all: not an empty file
                    raise OSError(0, f"corrupt gzip data: {exc}") from None
                return out
            raw = decomp.unconsumed_tail or fh.read(size)
            if not raw or decomp.eof:
                break
        return out


def _reader_modules() -> Iterator[tuple[str, object, str]]:
    for fmt, module_name, func_name in READERS:
        yield fmt, importlib.import_module(module_name), func_name


def sniff(path: Path, head: bytes | None = None) -> tuple[str, Callable] | None:
    """(format name, reader function) for a file, chosen by its content; None if unknown."""
    head = read_head(path) if head is None else head
    for fmt, module, func_name in _reader_modules():
        can_read = getattr(module, "can_read", None)
        if can_read is not None and can_read(path, head):
            return fmt, getattr(module, func_name)
    return None


_TABLE_SUFFIXES = (".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz", ".txt.gz")


def header_columns(head: bytes) -> list[str]:
    """Column names of a delimited text table's first line (comma or tab separated)."""
    line = head.split(b"\n", 1)[0].decode("utf-8", errors="replace").rstrip("\r")
    sep = "\t" if line.count("\t") > line.count(",") else ","
    return [c.strip().strip('"') for c in line.split(sep)]


def mapped_head(head: bytes, column_map: Mapping[str, str | None]) -> bytes:
    """``head`` with its header line's columns renamed by ``column_map``, so that a table
    with other column names is recognised as its reader will see it after renaming."""
    line, sep_nl, rest = head.partition(b"\n")
    names = header_columns(line)
    if not any(n in column_map for n in names):
        return head
    sep = b"\t" if line.count(b"\t") > line.count(b",") else b","
    renamed = [column_map.get(n, n) if n in column_map else n for n in names]
    return sep.join(n.encode() for n in renamed if n is not None) + sep_nl + rest


def unrecognised_table(path: Path, head: bytes) -> str | None:
    """For a file that looks like a delimited text table: the columns found and what each
    table reader needs, to replace "not a recognised trace format"; None otherwise."""
    if not path.name.lower().endswith(_TABLE_SUFFIXES):
        return None
    found = [c for c in header_columns(head) if c]
    if len(found) < 2:
        return None
    lower = {c.lower() for c in found}
    needs = [f"a {role} column (one of {', '.join(ID_COLUMNS[role])})"
             for role in ("node", "gpu") if not lower & set(ID_COLUMNS[role])]
    return ("a table with columns " + ", ".join(found[:20]) + (" ..." if len(found) > 20 else "")
            + " that no reader recognises: a per-GPU benchmark table lacks "
            + " and ".join(needs or ["nothing here (check the file name ends in .csv/.tsv)"])
            + "; a tidy trace table needs duration_us, or 4 of "
            + ", ".join(c for c in REQUIRED_COLUMNS if c != "duration_us")
            + ". Map yours with --columns THEIRS=OURS (column_map= in Python)")


def _call_reader(reader: Callable, path: Path, options: dict) -> tuple[pd.DataFrame, dict]:
    """Call a reader with the options its signature accepts."""
    params = inspect.signature(reader).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        accepted = options
    else:
        accepted = {k: v for k, v in options.items() if k in params}
    return reader(path, **accepted)


def _kineto_run_names(files: list[Path]) -> dict[Path, str]:
    """Run name of each file: its directory name, or the path from the common parent."""
    parents = sorted({f.resolve().parent for f in files})
    by_name: dict[str, list[Path]] = {}
    for p in parents:
        by_name.setdefault(p.name, []).append(p)
    if len(parents) > 1:
        common = Path(os.path.commonpath([str(p) for p in parents]))
    else:
        common = parents[0].parent if parents else Path("/")
    names = {}
    for p in parents:
        if len(by_name[p.name]) > 1:
            names[p] = str(p.relative_to(common)) or p.name
        else:
            names[p] = p.name or "run"
    return {f: names[f.resolve().parent] for f in files}


def _host_names_usable(files: list[Path]) -> dict[Path, bool]:
    """Whether the ``<host>_<pid>.<ms>.pt.trace.json`` names of a run's files name hosts.

    Hand-chosen names such as ``worker3_step_12.<ms>.pt.trace.json`` fit the pattern with the
    same "pid" in every file; real process ids differ between the ranks of a job.
    """
    by_dir: dict[Path, list[Path]] = {}
    for f in files:
        by_dir.setdefault(f.resolve().parent, []).append(f)
    usable: dict[Path, bool] = {}
    for group in by_dir.values():
        matches = [TRACE_HANDLER_NAME.match(f.name) for f in group]
        pids = {m.group("pid") for m in matches if m}
        hosts = {m.group("host") for m in matches if m}
        ok = not (len(group) > 1 and len(pids) == 1 and len(hosts) == len(group))
        usable.update(dict.fromkeys(group, ok))
    return usable


@dataclass
class FileFacts:
    """What the collector needs of one file's rows, taken where the file is read (a worker
    process), so that its frame need not travel for it: the ranks it holds and the launches
    of its place keys (:class:`~bayesprism.ingest.signatures.SignatureStats`)."""

    ranks: set[int] = field(default_factory=set)
    signatures: SignatureStats = field(default_factory=SignatureStats)
    steps: int = 0

    @classmethod
    def of(cls, df: pd.DataFrame) -> FileFacts:
        facts = cls()
        if "rank" in df:
            facts.ranks = {int(r) for r in pd.unique(df["rank"]) if r >= 0}
        if "step" in df:
            facts.steps = len(pd.unique(df["step"]))
        facts.signatures.add(df)
        return facts


@dataclass
class IngestCollector:
    """Merges per-file reports into attrs and checks the files of each Kineto run agree."""

    attrs: dict = field(default_factory=empty_attrs)
    problems: list[Problem] = field(default_factory=list)
    kineto_ranks: dict[tuple[str, int], str] = field(default_factory=dict)
    kineto_first: dict[str, dict] = field(default_factory=dict)
    ranks_by_run: dict[str, set] = field(default_factory=dict)
    unrecognised: list[str] = field(default_factory=list)
    layouts: dict[str, list[tuple[str, int, dict]]] = field(default_factory=dict)
    signature_stats: SignatureStats = field(default_factory=SignatureStats)
    #: run -> rank -> (file, GPU kernels read, steps kept): ranks unlike the others are named
    rank_files: dict[str, dict[int, tuple[str, int, int]]] = field(default_factory=dict)
    #: problems of the files skipped when not strict (raised when no file was read at all)
    bad_files: list[Problem] = field(default_factory=list)

    def skip(self, reason: str, count: int = 1) -> None:
        self.attrs["skipped"][reason] = self.attrs["skipped"].get(reason, 0) + count

    def skip_file(self, problems: list[Problem]) -> None:
        """Skip one file that cannot be read (not strict): counted, and each of its problems
        kept as a note naming the file and the reason."""
        self.bad_files.extend(problems)
        self.skip(SKIP_BAD_FILE)
        for p in problems:
            self.note(f"skipped {p}")

    def note(self, text: str) -> None:
        if text not in self.attrs["notes"]:
            self.attrs["notes"].append(text)

    def _merge_run(self, run: str, meta: dict, source: str) -> None:
        runs = self.attrs["runs"]
        if run not in runs:
            runs[run] = {**meta, "source_files": list(meta.get("source_files", [source]))}
            return
        entry = runs[run]
        entry.setdefault("source_files", []).extend(meta.get("source_files", [source]))
        for key, value in meta.items():
            if key != "source_files" and entry.get(key) in (None, "unknown"):
                entry[key] = value

    def add(self, path: Path, fmt: str, facts: FileFacts, report: dict) -> bool:
        """Merge one file's report and facts; False when it conflicts with the files read
        before."""
        source = str(path)
        run = str(report.get("run"))
        ok = True
        if fmt == "kineto":
            ok = self._check_kineto(source, run, report)
            self.rank_files.setdefault(run, {})[int(report["rank"])] = (
                source, int(report.get("kernel_events") or 0), facts.steps)
        for reason, count in (report.get("skipped") or {}).items():
            self.skip(reason, int(count))
        for text in report.get("notes") or []:
            self.note(text)
        # A tidy table may hold several runs: its reader reports each run's metadata.
        metas = dict(report.get("runs") or {run: report.get("run_meta") or {}})
        for run_name, run_meta in metas.items():
            self._merge_run(str(run_name), dict(run_meta or {}), source)
        if facts.ranks:
            self.ranks_by_run.setdefault(run, set()).update(facts.ranks)
        if report.get("layout") is not None:
            self.layouts.setdefault(run, []).append((source, int(report["rank"]),
                                                     report["layout"]))
        self.signature_stats.merge(facts.signatures)
        return ok

    def finish(self) -> dict[str, str]:
        """Reconcile each traced run's layout over its files (run metadata, problems, notes)
        and return the place key → signature map (:mod:`bayesprism.ingest.signatures`)."""
        runs = self.attrs["runs"]
        for run, reports in self.layouts.items():
            meta, problems, notes = reconcile_layout(run, reports, runs.get(run, {}),
                                                     runs.get(run, {}).get("world_size"))
            runs[run] = meta
            self.problems.extend(problems)
            for text in notes:
                self.note(text)
        for run, ranks in self.rank_files.items():
            if not any(kernels for _, kernels, _ in ranks.values()):
                # a table of memory copies alone: nothing of the step's compute to model
                self.problems.append(Problem(
                    min(src for src, _, _ in ranks.values()), "traceEvents",
                    f"run {run}: none of its {len(ranks)} rank file(s) has a GPU kernel (cat "
                    "'kernel', ph 'X'), only memory copies or sets: not a usable trace"))
                continue
            for text in unusual_ranks(run, ranks):
                self.note(text)
        return signature_map(self.signature_stats)

    def _check_kineto(self, source: str, run: str, report: dict) -> bool:
        rank = report.get("rank")
        ok = True
        key = (run, rank)
        if key in self.kineto_ranks:
            self.problems.append(Problem(
                source, "distributedInfo.rank",
                f"rank {rank} of run '{run}' is also in {self.kineto_ranks[key]}: the same rank "
                "twice"))
            ok = False
        else:
            self.kineto_ranks[key] = source
        first = self.kineto_first.get(run)
        if first is None:
            self.kineto_first[run] = {"source": source, **report}
            return ok
        if report.get("world_size") != first.get("world_size"):
            self.problems.append(Problem(
                source, "distributedInfo.world_size",
                f"is {report.get('world_size')}, but {first['source']} of the same run '{run}' "
                f"has {first.get('world_size')}: files of different runs are mixed"))
            ok = False
        if report.get("job") and first.get("job") and report["job"] != first["job"]:
            self.problems.append(Problem(
                source, "mast_job_name",
                f"is {report['job']!r}, but {first['source']} of the same run '{run}' has "
                f"{first['job']!r}: files of different jobs are mixed"))
            ok = False
        a, b = report.get("start_us"), first.get("start_us")
        if a is not None and b is not None and abs(a - b) > MAX_RUN_SPREAD_US:
            self.problems.append(Problem(
                source, "traceEvents.ts",
                f"starts {abs(a - b) / 3600e6:.1f} h away from {first['source']} of the same "
                f"run '{run}': files of different jobs are mixed (one directory per run)"))
            ok = False
        return ok


def unusual_ranks(run: str, ranks: Mapping[int, tuple[str, int, int]]) -> list[str]:
    """Notes naming the ranks of a traced run without GPU kernels, or with another number of
    steps than most ranks (a rank profiled over another window, or a damaged file).

    Parameters
    ----------
    run
        The run's name.
    ranks
        rank -> (file, GPU kernels read, steps kept).

    Returns
    -------
    list of str
        One note per kind of unusual rank (none when all ranks look alike).

    Examples
    --------
    >>> unusual_ranks("r", {0: ("a.json", 10, 5), 1: ("b.json", 0, 5), 2: ("c.json", 9, 3)})
    ... # doctest: +NORMALIZE_WHITESPACE
    ["run r: 1 of 3 ranks without GPU kernels (cat 'kernel'; only memory copies or nothing
    kept): rank 1 (b.json)", 'run r: 1 of 3 ranks with another number of steps than the 2
    others (5 steps): rank 2 has 3 (c.json)']
    """
    notes = []

    def listed(items: list[str]) -> str:
        return ", ".join(items[:5]) + (f" and {len(items) - 5} more" if len(items) > 5 else "")

    empty = [f"rank {r} ({src})" for r, (src, kernels, _) in sorted(ranks.items()) if not kernels]
    if empty:
        notes.append(f"run {run}: {len(empty)} of {len(ranks)} ranks without GPU kernels (cat "
                     f"'kernel'; only memory copies or nothing kept): {listed(empty)}")
    counts = pd.Series({r: steps for r, (_, _, steps) in ranks.items()})
    if counts.nunique() > 1:
        usual = int(counts.mode().max())
        odd = [f"rank {r} has {int(n)} ({ranks[r][0]})" for r, n in counts.sort_index().items()
               if n != usual]
        notes.append(f"run {run}: {len(odd)} of {len(ranks)} ranks with another number of steps "
                     f"than the {len(ranks) - len(odd)} others ({usual} steps): {listed(odd)}")
    return notes


def iter_frames(files: list[TraceFile], options: dict, collector: IngestCollector,
               progress: bool, finish: Callable | None = None,
               read: Callable[[list[tuple]], Iterator[tuple]] | None = None,
               strict: bool = True) -> Iterator:
    """Read each file with its reader; yields validated frames, collects problems.

    ``finish``: a module-level function applied to each validated frame where it was read
    (in the worker process when there are several); its results are yielded instead.
    ``read``: runs the :func:`read_file` tasks and yields their results in task order
    (default: here or in local worker processes; :mod:`bayesprism.ingest.distributed` on Dask).
    ``strict=False``: a file that cannot be read is skipped (counted, named in a note) instead
    of failing the whole read.
    """
    from tqdm.auto import tqdm

    def bad_file(problems: list[Problem]) -> None:
        if strict:
            collector.problems.extend(problems)
        else:
            collector.skip_file(problems)

    paths = [f.path for f in files]
    sniffed: list[tuple[TraceFile, tuple[str, Callable] | None]] = []
    for f in files:
        try:
            head = read_head(f.path)
        except OSError as exc:
            bad_file([Problem(str(f.path), "", f"cannot be read: {exc.strerror}")])
            continue
        if not head:
            if f.explicit:
                bad_file([Problem(str(f.path), "", "the file is empty")])
            else:
                collector.skip(SKIP_UNRECOGNISED)
                collector.unrecognised.append(str(f.path))
            continue
        if options.get("column_map"):
            head = mapped_head(head, options["column_map"])
        found = sniff(f.path, head)
        if found is None:
            if f.explicit:
                table = unrecognised_table(f.path, head)
                bad_file([Problem(
                    str(f.path), "", table or f"not a recognised trace format ({FORMATS_READ})"
                )])
            else:
                collector.skip(SKIP_UNRECOGNISED)
                collector.unrecognised.append(str(f.path))
            continue
        sniffed.append((f, found))
    kineto_files = [f.path for f, (fmt, _) in sniffed if fmt == "kineto"]
    run_names = _kineto_run_names(kineto_files) if kineto_files else {}
    host_ok = _host_names_usable(kineto_files) if kineto_files else {}
    del paths

    # disable=None: a bar only on a terminal, so logs and pipes get no progress noise.
    bar = tqdm(sniffed, desc="ingest", unit="file", disable=None if progress else True,
               leave=False)
    def task(item) -> tuple:
        f, (fmt, reader) = item
        file_options = dict(options)
        if fmt == "kineto":
            file_options["run"] = run_names[f.path]
            file_options["host_from_file_name"] = host_ok[f.path]
            # not strict: a file mostly of unusable kernels is read with counts, not refused
            file_options["accept_unusable"] = not strict
        return reader, f.path, file_options, finish

    for (f, (fmt, _)), (part, facts, report, problems) in zip(
            bar, (read or _read_in_order)([task(item) for item in sniffed]), strict=True):
        if problems:
            bad_file(problems)
            continue
        if options.get("layout") and not report.get("layout_applied"):
            report = report_with_layout(report, options["layout"], str(f.path))
        if collector.add(f.path, fmt, facts, report) and not collector.problems:
            yield part
    if collector.unrecognised:
        shown = ", ".join(collector.unrecognised[:5])
        more = len(collector.unrecognised) - 5
        collector.note(f"files not recognised as traces and skipped: {shown}"
                       + (f" and {more} more" if more > 0 else ""))
    for text in collector.attrs["notes"]:
        if text.startswith("node taken as"):
            warnings.warn(text, IngestWarning, stacklevel=3)


def read_file(reader: Callable, path: Path, options: dict, finish: Callable | None = None
              ) -> tuple:
    """``(table, facts, report, problems)`` of one file (``finish(table)`` in place of the
    table when given, :class:`FileFacts` of its rows): bad input comes back as problems (so a
    worker process can return it), anything else raises."""
    try:
        with warnings.catch_warnings(), paused_gc():
            # Collected as notes and re-emitted once per distinct message after the loop.
            warnings.simplefilter("ignore", IngestWarning)
            df, report = _call_reader(reader, path, options)
            df = validate_table(df, source=str(path))
            return (df if finish is None else finish(df)), FileFacts.of(df), report, []
    except InputError as exc:
        return None, None, None, [p if isinstance(p, Problem) else Problem(str(path), "", str(p))
                                  for p in exc.problems]
    except (OSError, UnicodeDecodeError) as exc:
        return None, None, None, [Problem(str(path), "", f"cannot be read: {exc}")]


def ingest_workers(files: int) -> int:
    """Processes that read files at once, from ``BAYESPRISM_INGEST_WORKERS``: a number, or
    ``auto`` (the machine's cores, at most 8, for 8 files or more; what the CLI sets). Unset:
    1, since worker processes are spawned and re-import the caller's main module, which a
    script without an ``if __name__ == "__main__":`` guard would run again."""
    stated = os.environ.get("BAYESPRISM_INGEST_WORKERS", "1").strip().lower()
    if stated == "auto":
        return min(os.cpu_count() or 1, 8) if files >= 8 else 1
    try:
        return max(1, int(stated))
    except ValueError:
        raise InputError(Problem("BAYESPRISM_INGEST_WORKERS", "", "must be a whole number of "
                                 "processes or 'auto'", example=stated)) from None


def _read_in_order(tasks: list[tuple]) -> Iterator[tuple]:
    """:func:`read_file` of each task, in order; with several workers, files are read in
    spawned processes, at most two per worker ahead of the consumer (bounded memory)."""
    workers = ingest_workers(len(tasks))
    if workers <= 1:
        yield from (read_file(*t) for t in tasks)
        return
    # spawn, not fork: the caller may have imported JAX or started threads
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: deque = deque()
        for t in tasks:
            pending.append(pool.submit(read_file, *t))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def raise_problems(collector: IngestCollector, found_any: bool) -> None:
    """Raise the collected problems; with nothing read, the files that were not traces are
    the problem (bad ones when not strict, else those of unrecognised format, named)."""
    if not found_any and not collector.problems:
        collector.problems.extend(collector.bad_files or _nothing_read(collector.unrecognised))
    if collector.problems:
        raise TraceFormatError(collector.problems)


def _nothing_read(unrecognised: list[str]) -> list[Problem]:
    """Why nothing was read: each file of unrecognised format (the first five), else none."""
    if not unrecognised:
        return [Problem("inputs", "", "no trace file found")]
    problems = [Problem(path, "", f"not a recognised trace format ({FORMATS_READ}); no input "
                        "file was a trace") for path in unrecognised[:5]]
    if len(unrecognised) > 5:
        problems.append(Problem("inputs", "", f"and {len(unrecognised) - 5} more files of "
                                "unrecognised format"))
    return problems


def reader_options(gpus_per_node, rank_to_node, column_map, layout=None) -> dict:
    options: dict = {}
    if layout:
        options["layout"] = dict(layout)
    if gpus_per_node is not None:
        options["gpus_per_node"] = int(gpus_per_node)
    if rank_to_node is not None:
        options["rank_to_node"] = dict(rank_to_node)
    if column_map is not None:
        options["column_map"] = dict(column_map)
    return options


def split_collectives(coll: pd.DataFrame, collector: IngestCollector
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Wait and transfer time of collective rows, run by run; notes go to the collector."""
    wait = np.full(len(coll), np.nan)
    transfer = np.full(len(coll), np.nan)
    if len(coll) == 0:
        return wait, transfer
    world = {run: meta.get("world_size") for run, meta in collector.attrs["runs"].items()}
    counts_by_run = {}
    for run, idx in coll.groupby(coll["run"].astype(str), observed=True).indices.items():
        wait[idx], transfer[idx], counts_by_run[run] = split_wait_transfer(coll.iloc[idx], world)
    ranks = {run: len(r) for run, r in collector.ranks_by_run.items()}
    for text in split_notes(counts_by_run, ranks):
        collector.note(text)
    return wait, transfer


def collective_mask(df: pd.DataFrame) -> np.ndarray:
    """Rows of a collective class with a start time (what the wait/transfer split reads)."""
    return category_in(df["kernel_class"], COLLECTIVE_CLASSES) & (
        df["start_us"].notna().to_numpy() if "start_us" in df else False)


def resolve_strict(strict: bool | None, reads) -> bool:
    """``strict`` as given, else the engine's default: strict embedded, lenient on Dask."""
    return (reads is None) if strict is None else bool(strict)
