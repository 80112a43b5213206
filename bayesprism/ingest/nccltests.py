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
  the run metadata, with ``benchmark = True``: the collective model fits latency and bandwidth
  on benchmark and traced transfers together, but gives benchmark runs noise and congestion
  scales of their own (:mod:`bayesprism.model.kernel`).
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

CSV sweeps (one measurement per line, as cluster acceptance scripts collect nccl-tests results)
are read too: a header naming at least ``collective``, ``size_bytes`` (or ``size``),
``time_us`` and ``gpus`` (or ``ranks``/``nranks``); optional ``nodes``, ``hostnames`` (hosts
separated by ``;``, ``,`` or spaces), ``dtype``, ``run`` (repeat index), ``iters``,
``algbw_GBps``, ``busbw_GBps``. One line becomes one row:

* ``kernel_class`` from ``collective`` (``all_reduce``, ``all_gather_perf``, ``allgather``,
  ... as the binaries above), ``kernel = "nccl-tests:<binary>"``, ``bytes = size_bytes``,
  ``group_size = gpus``, ``duration_us = transfer_us = time_us``, ``wait_us = 0``.
* The size is nccl-tests' ``size`` column, ``max(sendBytes, recvBytes)``: the *full* buffer, i.e.
  the gathered output of an AllGather and the input of a ReduceScatter, the convention of
  :mod:`bayesprism.costs.collectives` (``b`` = full buffer, bus bytes = ``b·(p−1)/p``). Where
  ``algbw_GBps`` is given it must equal ``size_bytes / time_us`` (nccl-tests' definition);
  a table whose sizes are per-rank fails that check and is refused.
* ``step`` numbers the *sweeps*: one ``(nodes, hostnames, run)`` combination, i.e. one launch of
  the benchmark on one set of nodes, whose sizes ran back to back. The cost model shares its
  per-step congestion among a step's transfers, so a sweep on a congested or degraded set of
  nodes moves all its sizes together rather than looking like independent noise.
* A group spans nodes when ``nodes > 1`` (else when ``hostnames`` lists several hosts): the
  run's ``gpus_per_node`` is ``ceil(gpus / nodes)``, which the model compares with
  ``group_size`` to choose the inter-node tier. Lines with different GPUs per node go to runs
  of their own (``<file stem>/<k>-gpus-per-node``) so that this holds for every line. Without
  ``nodes`` and ``hostnames`` every group is taken as one node (noted).
* ``node`` is the first host of ``hostnames`` (the benchmark times the group, not one GPU),
  ``gpu = 0`` and ``rank`` = the sweep's number: each sweep's rank 0 is a process of its own.
  ``time_us`` is nccl-tests' mean over ``iters`` timed iterations, so its spread between lines
  is smaller than a single launch's would be.
"""

from __future__ import annotations

import io
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
SKIP_BAD_SIZE = "nccl-tests size is not a positive number"
#: CSV layout: role → accepted column names (lower case); the CSV_REQUIRED roles must be
#: present.
CSV_COLUMNS: dict[str, tuple[str, ...]] = {
    "collective": ("collective",),
    "size": ("size_bytes", "size"),
    "time": ("time_us",),
    "gpus": ("gpus", "ranks", "nranks"),
    "nodes": ("nodes", "nnodes"),
    "hosts": ("hostnames", "hosts"),
    "dtype": ("dtype", "type"),
    "repeat": ("run", "repeat", "trial"),
    "algbw": ("algbw_gbps",),
}
CSV_REQUIRED = ("collective", "size", "time", "gpus")
#: Largest relative disagreement of ``algbw_GBps`` with ``size_bytes / time_us`` tolerated
#: (the printed values are rounded to 2-3 decimals).
ALGBW_TOLERANCE = 0.05

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
    """True for nccl-tests output (its ``# nThread`` header or its result table header) or a
    CSV sweep whose header names a collective, a size, a time in µs and a GPU count."""
    if b"# nThread" in head or (b"out-of-place" in head and b"busbw" in head):
        return True
    return _csv_columns(head.split(b"\n", 1)[0].decode("utf-8", errors="replace")) is not None


def read_nccl_tests(path: Path, *, run: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Read the result tables of one nccl-tests output file.

    Parameters
    ----------
    path
        Text output of an nccl-tests binary (optionally gzipped), which may hold several
        sweeps, or a CSV of sweeps (module docstring).
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
        Unreadable file, no result table, or a table whose collective cannot be determined;
        for a CSV also an unknown collective, a GPU count that is not an integer >= 1, a host
        list that contradicts ``nodes``, or sizes that are not nccl-tests' (``algbw_GBps``).
    """
    path = Path(path)
    source = str(path)
    text = read_text(path)
    columns = _csv_columns(text.split("\n", 1)[0])
    if columns is not None:
        return _read_csv_sweeps(path, text, columns, run=run)
    lines = text.splitlines()
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
        "format": "nccl-tests",
        "benchmark": True,
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
    for suffix in (".gz", ".log", ".txt", ".out", ".csv"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


# --------------------------------------------------------------------------- CSV sweeps


def _csv_columns(header: str) -> dict[str, str] | None:
    """Role → column name of a CSV header in the sweep layout, or None if it is not one."""
    if "," not in header:
        return None
    names = [c.strip().strip('"') for c in header.strip().split(",")]
    lower = {n.lower(): n for n in names}
    found = {}
    for role, aliases in CSV_COLUMNS.items():
        for alias in aliases:
            if alias in lower:
                found[role] = lower[alias]
                break
    return found if all(r in found for r in CSV_REQUIRED) else None


def _collective_binary(value: str) -> str | None:
    """nccl-tests binary of a collective as a CSV names it (``all_gather``, ``allgather``,
    ``all_gather_perf``), or None."""
    text = str(value).strip().lower()
    text = text[: -len("_perf")] if text.endswith("_perf") else text
    squashed = text.replace("_", "").replace("-", "")
    for binary in BINARIES:
        if squashed == binary[: -len("_perf")].replace("_", ""):
            return binary
    return None


def _read_csv_sweeps(path: Path, text: str, columns: dict[str, str], *,
                     run: str | None) -> tuple[pd.DataFrame, dict]:
    """Read a CSV of nccl-tests results, one measurement per line (module docstring)."""
    source = str(path)
    run = run or _stem(path)
    try:
        table = pd.read_csv(io.StringIO(text), skipinitialspace=True)
    except (ValueError, pd.errors.ParserError) as exc:
        raise TraceFormatError(Problem(source, "", f"cannot read as CSV: {exc}")) from None
    table.columns = [str(c).strip() for c in table.columns]
    if len(table) == 0:
        raise TraceFormatError(Problem(source, "", "the table has no rows"))
    skipped: dict[str, int] = {}
    notes: list[str] = []
    problems: list[Problem] = []

    name = table[columns["collective"]].astype(str)
    binary = name.map(_collective_binary)
    unknown = binary.isna().to_numpy()
    if unknown.any():
        problems.append(Problem(
            source, columns["collective"],
            "unknown collective; expected one of " + ", ".join(b[: -len("_perf")]
                                                                for b in BINARIES),
            int(unknown.sum()), name[unknown].iloc[0]))
    gpus = pd.to_numeric(table[columns["gpus"]], errors="coerce").to_numpy(dtype=float)
    bad = ~(np.isfinite(gpus) & (gpus >= 1) & (gpus == np.round(gpus)))
    if bad.any():
        problems.append(Problem(source, columns["gpus"], "must be an integer >= 1",
                                int(bad.sum()), table[columns["gpus"]].to_numpy()[bad][0]))
    hosts = (table[columns["hosts"]].fillna("").astype(str).map(
        lambda s: [h for h in re.split(r"[;,\s]+", s) if h]) if "hosts" in columns else None)
    if "nodes" in columns:
        nodes = pd.to_numeric(table[columns["nodes"]], errors="coerce").to_numpy(dtype=float)
        bad = ~(np.isfinite(nodes) & (nodes >= 1) & (nodes == np.round(nodes)))
        if bad.any():
            problems.append(Problem(source, columns["nodes"], "must be an integer >= 1",
                                    int(bad.sum()), table[columns["nodes"]].to_numpy()[bad][0]))
        if hosts is not None:
            listed = hosts.map(len).to_numpy()
            clash = (listed > 0) & (listed != nodes)
            if clash.any():
                problems.append(Problem(
                    source, columns["hosts"], f"the number of hosts differs from "
                    f"{columns['nodes']!r}", int(clash.sum()), hosts[clash].iloc[0]))
    elif hosts is not None:
        nodes = np.maximum(hosts.map(len).to_numpy(dtype=float), 1.0)
    else:
        nodes = np.ones(len(table))
        notes.append(f"{path.name}: no nodes or hostnames column: every group is taken as "
                     "one node (intra-node tier)")
    if problems:
        raise TraceFormatError(problems)

    time = pd.to_numeric(table[columns["time"]], errors="coerce").to_numpy(dtype=float)
    size = pd.to_numeric(table[columns["size"]], errors="coerce").to_numpy(dtype=float)
    good_time = np.isfinite(time) & (time > 0)
    good_size = np.isfinite(size) & (size > 0)
    if (~good_time).any():
        _count(skipped, SKIP_BAD_TIME, int((~good_time).sum()))
    if (good_time & ~good_size).any():
        _count(skipped, SKIP_BAD_SIZE, int((good_time & ~good_size).sum()))
    keep = good_time & good_size
    if not keep.any():
        raise TraceFormatError(Problem(source, columns["time"],
                                       "no row has a positive time and size", len(table)))
    if "algbw" in columns:
        # nccl-tests' algbw is size / time: a table of per-rank sizes fails this
        algbw = pd.to_numeric(table[columns["algbw"]], errors="coerce").to_numpy(dtype=float)
        check = keep & np.isfinite(algbw) & (algbw > 0)
        ratio = size[check] / time[check] / 1e3 / algbw[check]
        if check.any() and abs(float(np.median(ratio)) - 1.0) > ALGBW_TOLERANCE:
            raise TraceFormatError(Problem(
                source, columns["size"],
                f"{columns['size']} / {columns['time']} is {float(np.median(ratio)):.3g} x "
                f"{columns['algbw']} (median): sizes must be nccl-tests' full buffer "
                "(algbw = size / time)", int(check.sum()), float(size[check][0])))

    table = table.loc[keep].reset_index(drop=True)
    binary, gpus, nodes = binary[keep].reset_index(drop=True), gpus[keep], nodes[keep]
    time, size = time[keep], size[keep]
    hosts = hosts[keep].reset_index(drop=True) if hosts is not None else None
    host_text = hosts.map(";".join) if hosts is not None else pd.Series("", index=table.index)
    repeat = (table[columns["repeat"]].astype(str) if "repeat" in columns
              else pd.Series("", index=table.index))
    sweep, _ = pd.factorize(pd.Series(
        [f"{n:g}|{h}|{r}" for n, h, r in zip(nodes, host_text, repeat, strict=True)]))
    per_node = np.ceil(gpus / nodes).astype(np.int64)
    names = sorted(set(per_node.tolist()))
    run_of = ({names[0]: run} if len(names) == 1
              else {k: f"{run}/{k}-gpus-per-node" for k in names})
    if len(names) > 1:
        notes.append(f"{path.name}: lines with {len(names)} different GPUs per node are read as "
                     "runs of their own: " + ", ".join(run_of.values()))
    node = (hosts.map(lambda h: h[0] if h else None) if hosts is not None
            else pd.Series(None, index=table.index, dtype=object))
    node = node.where(node.notna(), pd.Series([f"{run}:sweep{s}" for s in sweep]))
    df = pd.DataFrame({
        "run": [run_of[k] for k in per_node],
        "step": sweep.astype(np.int64),
        "rank": sweep.astype(np.int64),
        "node": node.astype(str).to_numpy(),
        "gpu": 0,
        "kernel": ["nccl-tests:" + b for b in binary],
        "kernel_class": [BINARIES[b] for b in binary],
        "duration_us": time,
        "bytes": size,
        "group_size": gpus.astype(np.int64),
        "wait_us": 0.0,
        "transfer_us": time,
    })
    if "dtype" in columns:
        df["dtype"] = table[columns["dtype"]].astype(str).to_numpy()
    runs = {}
    for k, name in run_of.items():
        mine = per_node == k
        listed = ([h for hs in hosts[mine] for h in hs] if hosts is not None else [])
        runs[name] = {
            "platform": None,
            "world_size": int(gpus[mine].max()),
            "gpus_per_node": int(k),
            "nodes": len(set(listed)) if listed else int(nodes[mine].max()),
            "hosts": list(dict.fromkeys(listed)),
            "collectives": sorted(set(binary[mine])),
            "plan": {"dp": int(gpus[mine].max()), "tp": 1, "pp": 1, "cp": 1, "ep": 1,
                     "microbatches": 1},
            "source_files": [source],
            "format": "nccl-tests",
            "benchmark": True,
        }
    report = {"run": run_of[names[0]], "skipped": skipped, "notes": notes,
              "run_meta": runs[run_of[names[0]]]}
    if len(runs) > 1:
        report["runs"] = runs
    return df, report
