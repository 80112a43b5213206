"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ...) → collective rows.

A result row of nccl-tests (``size count type redop root time algbw busbw #wrong`` for the
out-of-place and then the in-place run) becomes two trace-table rows, ``phase`` =
``"out-of-place"`` / ``"in-place"``, with ``kernel_class`` = the collective, ``kernel`` =
``"nccl-tests:<binary>"`` (e.g. ``nccl-tests:all_reduce_perf``), ``bytes`` = size, ``dtype`` =
type, ``group_size`` = the number of ranks listed under ``# Using devices`` and ``duration_us``
= the reported time (µs, the mean over the timed iterations).

Choices worth knowing:

* The benchmark starts every rank of an iteration together (it synchronises before timing), so
  its time is a pure transfer time: ``transfer_us = duration_us`` and ``wait_us = 0``.
* A row times the whole group, not one GPU: ``rank = 0``, ``gpu = 0`` and ``node`` = the host of
  rank 0 (the first ``#  Rank ... on <host>`` line). The hosts, ranks per host and GPU model are in
  the run metadata.
* ``step`` is the row index within the size sweep (0 = smallest size). A file with several
  sweeps (several ``# nThread`` headers) continues the numbering per collective, noted.
* The collective comes from the ``# Collective test starting: <binary>`` line (nccl-tests >= 2.13),
  else from a ``<collective>_perf`` token in the text before the table (an echoed command
  line), else from the file name; otherwise the file is refused. Rooted ``reduce_perf`` counts
  as ``broadcast`` and ``gather_perf``/``scatter_perf`` as ``allgather``/``broadcast`` (same
  cost shape, as in :mod:`bayesprism.ingest.classify`).
* Rows with a time that is not a positive number (``N/A``, ``0``) are skipped and counted; rows
  with a non-zero ``#wrong`` (validation errors) are kept and noted. Lines that are not table rows
  (MPI warnings interleaved with the output) are ignored.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism.errors import Problem, TraceFormatError
from bayesprism.ingest.files import read_text

BINARIES: dict[str, str] = {
    "all_reduce_perf": "allreduce",
    "all_gather_perf": "allgather",
    "reduce_scatter_perf": "reducescatter",
    "alltoall_perf": "alltoall",
    "broadcast_perf": "broadcast",
    "sendrecv_perf": "sendrecv",
    "reduce_perf": "broadcast",
    "gather_perf": "allgather",
    "scatter_perf": "broadcast",
}
PHASES = ("out-of-place", "in-place")
SKIP_BAD_TIME = "nccl-tests time is not a positive number"
SKIP_BAD_ROW = "nccl-tests row with an unexpected number of fields"

_BINARY = re.compile(
    r"(?<![A-Za-z])(" + "|".join(sorted(BINARIES, key=len, reverse=True)) + r")(?![A-Za-z])"
)
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_RANK = re.compile(
    r"^#\s+Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)"
    r"\s+device\s+(?P<device>\d+)\s+\[[^\]]*\]\s*(?P<gpu>.*)$"
)
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)")
_NCCL = re.compile(r"^NCCL version\s+(\S+)")


def can_read(path: Path, head: bytes) -> bool:
    """True for nccl-tests output (its ``# nThread`` header or its result table header)."""
    return b"# nThread" in head or (b"out-of-place" in head and b"busbw" in head)


def read_nccl_tests(path: Path, *, run: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Read the result tables of one nccl-tests output file.

    Parameters
    ----------
    path
        Text output of an nccl-tests binary (optionally gzipped); may hold several sweeps.
    run
        Run name; default: the file name without extensions.

    Returns
    -------
    (pandas.DataFrame, dict)
        Collective rows in the trace-table schema and the report (``run``, ``skipped``,
        ``notes``, ``run_meta``).

    Raises
    ------
    TraceFormatError
        Unreadable file, no result table, or a table whose collective cannot be determined.
    """
    path = Path(path)
    source = str(path)
    lines = read_text(path).splitlines()
    skipped: dict[str, int] = {}
    notes: list[str] = []
    run = run or _stem(path)

    sections = _split_sections(lines)
    records = []
    ranks: dict[int, tuple[str, str]] = {}
    versions = {"nccl_tests_version": None, "nccl_version": None}
    steps_by_kernel: dict[str, int] = {}
    collectives = []
    for number, section in enumerate(sections):
        binary = _binary(section, lines, path)
        if binary is None:
            continue
        header = None
        section_ranks: dict[int, tuple[str, str]] = {}
        for line in section:
            if (m := _RANK.match(line)) is not None:
                section_ranks[int(m["rank"])] = (m["host"], m["gpu"].strip())
                continue
            for pattern, key in ((_VERSION, "nccl_tests_version"), (_NCCL, "nccl_version")):
                if (m := pattern.match(line)) is not None:
                    versions[key] = versions[key] or m.group(1)
            if line.startswith("#") and " size " in f" {line[1:]} " and "time" in line:
                header = line.lstrip("#").split()
                continue
            if header is None or line.startswith("#"):
                continue
            fields = line.split()
            if not fields or not fields[0].isdigit():
                continue  # interleaved non-table output (MPI warnings, NCCL banners)
            if len(fields) != len(header):
                _count(skipped, SKIP_BAD_ROW)
                continue
            records.append((number, binary, dict(zip(_unique(header), fields, strict=True))))
        if not section_ranks and header is not None:
            raise TraceFormatError(
                Problem(
                    source,
                    "# Using devices",
                    "no '#  Rank ... on <host> device ...' lines before the result table",
                )
            )
        ranks = ranks or section_ranks
        if section_ranks and section_ranks != ranks:
            notes.append(
                f"{path.name}: sweeps with different device lists; group size and hosts "
                "are taken from the first"
            )
        if header is not None:
            collectives.append(binary)
    if not records:
        raise TraceFormatError(
            Problem(
                source,
                "",
                "no nccl-tests result rows (a table with "
                "'size count type redop root time algbw busbw #wrong')",
            )
        )
    if len(collectives) > len(set(collectives)):
        notes.append(
            f"{path.name}: several sweeps of the same collective; step continues across them"
        )

    hosts = [ranks[r][0] for r in sorted(ranks)]
    group_size = len(ranks)
    rows = []
    wrong_rows = 0
    for _, binary, rec in records:
        kernel = f"nccl-tests:{binary}"
        step = steps_by_kernel.get(kernel, 0)
        steps_by_kernel[kernel] = step + 1
        for i, phase in enumerate(PHASES):
            time = _number(rec.get(f"time#{i}"))
            if time is None or not np.isfinite(time) or time <= 0:
                _count(skipped, SKIP_BAD_TIME)
                continue
            if _number(rec.get(f"#wrong#{i}")) not in (None, 0.0):
                wrong_rows += 1
            rows.append(
                {
                    "run": run,
                    "step": step,
                    "rank": 0,
                    "node": hosts[0],
                    "gpu": 0,
                    "kernel": kernel,
                    "kernel_class": BINARIES[binary],
                    "duration_us": time,
                    "bytes": float(rec["size#0"]),
                    "dtype": rec.get("type#0"),
                    "group_size": group_size,
                    "wait_us": 0.0,
                    "transfer_us": time,
                    "phase": phase,
                }
            )
    if not rows:
        raise TraceFormatError(
            Problem(source, "time", "no row has a positive time", sum(skipped.values()))
        )
    if wrong_rows:
        notes.append(f"{path.name}: {wrong_rows} results with validation errors (#wrong > 0) kept")
    df = pd.DataFrame(rows)
    per_host = pd.Series(hosts).value_counts()
    meta = {
        "platform": ranks[min(ranks)][1] or None,
        "world_size": group_size,
        "gpus_per_node": int(per_host.max()),
        "nodes": len(per_host),
        "hosts": list(dict.fromkeys(hosts)),
        "collectives": sorted(set(collectives)),
        "plan": {"dp": group_size, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "microbatches": 1},
        "source_files": [source],
        **versions,
    }
    return df, {"run": run, "skipped": skipped, "notes": notes, "run_meta": meta}


# --------------------------------------------------------------------------- helpers


def _split_sections(lines: list[str]) -> list[list[str]]:
    """Sweeps: each ``# Collective test starting`` line, or a ``# nThread`` line not preceded
    by one in the same sweep, opens a new sweep."""
    sections: list[list[str]] = [[]]
    has_start = has_nthread = False
    for line in lines:
        is_start = bool(_STARTING.match(line))
        is_nthread = line.startswith("# nThread")
        if (is_start and (has_start or has_nthread)) or (is_nthread and has_nthread):
            sections.append([])
            has_start = has_nthread = False
        has_start |= is_start
        has_nthread |= is_nthread
        sections[-1].append(line)
    return [s for s in sections if s]


def _binary(section: list[str], lines: list[str], path: Path) -> str | None:
    for line in section:
        if (m := _STARTING.match(line)) is not None:
            name = Path(m.group(1)).name
            if name not in BINARIES:
                raise TraceFormatError(
                    Problem(
                        str(path),
                        "Collective test starting",
                        "unknown nccl-tests binary; known: " + ", ".join(BINARIES),
                        example=name,
                    )
                )
            return name
    has_table = any(line.startswith("#") and "busbw" in line for line in section)
    if not has_table:
        return None
    for line in section:
        if (m := _BINARY.search(line)) is not None:
            return m.group(1)
    if (m := _BINARY.search(path.name)) is not None:
        return m.group(1)
    raise TraceFormatError(
        Problem(
            str(path),
            "collective",
            "cannot tell which nccl-tests binary wrote this table: no "
            "'# Collective test starting' line, no binary name in the "
            "text or the file name (e.g. name it all_reduce_perf.log)",
        )
    )


def _unique(header: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in header:
        n = seen.get(name, 0)
        seen[name] = n + 1
        out.append(f"{name}#{n}")
    return out


def _number(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _count(skipped: dict[str, int], reason: str, n: int = 1) -> None:
    skipped[reason] = skipped.get(reason, 0) + n


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".log", ".txt", ".out"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name
