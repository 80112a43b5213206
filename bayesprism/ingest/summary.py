"""What a trace table holds, in a few numbers: runs, ranks, nodes, steps, kernel classes.

:func:`summarize_table` works on a DataFrame; :class:`SummaryAccumulator` builds the same
summary chunk by chunk, so streaming ingestion never has to read its output back.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bayesprism.schema import COLLECTIVE_CLASSES, codes_and_labels


class Accumulator:
    """Statistics of one file, reduced where the file is read and merged across files.

    A reading's per-file function (``finish`` of :func:`bayesprism.ingest.dispatch.iter_frames`)
    returns a tuple; its accumulators are merged by the Dask engine's tree reduction on the
    cluster (:mod:`bayesprism.ingest.distributed`), so that the client never receives them
    file by file. A subclass is created empty by ``type(self)()`` and merges another of its
    kind into itself with :meth:`merge`.
    """

    def merge(self, other: Accumulator) -> None:
        """Add ``other`` (a later file's) into this one."""
        raise NotImplementedError


class SummaryAccumulator(Accumulator):
    """Incremental summary of trace-table chunks (memory grows with distinct keys only)."""

    def __init__(self) -> None:
        self.rows = 0
        self._ranks: set[tuple[str, int]] = set()
        self._nodes: set[tuple[str, str]] = set()
        self._steps: set[tuple[str, int]] = set()
        self._classes: dict[str, list[float]] = {}
        self._collective_rows = 0
        self._split_rows = 0
        self._roles: dict[str, list[float]] = {}
        self._signatures: set[tuple[str, str]] = set()

    def add(self, df: pd.DataFrame) -> None:
        """Account for one chunk of rows."""
        if len(df) == 0:
            return
        self.rows += len(df)
        # distinct (run, x) pairs from integer codes: no per-row strings
        run_codes, run_labels = codes_and_labels(df["run"], missing="nan")
        for column, target in (("rank", self._ranks), ("node", self._nodes),
                               ("step", self._steps)):
            codes, labels = codes_and_labels(df[column], missing="nan")
            pairs = np.unique(run_codes * (len(labels) + 1) + codes)
            target.update((run_labels[p // (len(labels) + 1)], labels[p % (len(labels) + 1)])
                          for p in pairs)
        class_codes, class_labels = codes_and_labels(df["kernel_class"], missing="nan")
        duration = df["duration_us"].to_numpy(dtype=np.float64)
        count = np.bincount(class_codes, minlength=len(class_labels))
        total = np.bincount(class_codes, weights=duration, minlength=len(class_labels))
        for i in np.flatnonzero(count):
            acc = self._classes.setdefault(str(class_labels[i]), [0, 0.0])
            acc[0] += int(count[i])
            acc[1] += float(total[i])
        if "transfer_us" in df:
            is_coll = np.isin(np.asarray(class_labels, dtype=object), COLLECTIVE_CLASSES)
            coll = is_coll[class_codes]
            self._collective_rows += int(coll.sum())
            self._split_rows += int((coll & df["transfer_us"].notna().to_numpy()).sum())
        if "role" in df and df["role"].notna().any():
            role_codes, role_labels = codes_and_labels(df["role"])
            nbytes = (np.nan_to_num(df["bytes"].to_numpy(dtype=np.float64, na_value=np.nan))
                      if "bytes" in df else np.zeros(len(df)))
            has_role = role_codes >= 0
            count = np.bincount(role_codes[has_role], minlength=len(role_labels))
            total = np.bincount(role_codes[has_role], weights=nbytes[has_role],
                                minlength=len(role_labels))
            for i in np.flatnonzero(count):
                acc = self._roles.setdefault(str(role_labels[i]), [0, 0.0])
                acc[0] += int(count[i])
                acc[1] += float(total[i])
        sig = df["signature"] if "signature" in df else None
        if sig is not None and isinstance(sig.dtype, pd.CategoricalDtype):
            names = sig.cat.categories
            pair = np.unique(class_codes * (len(names) + 1) + sig.cat.codes.to_numpy())
            c_codes, s_codes = np.divmod(pair, len(names) + 1)
            known = (s_codes < len(names)) & (c_codes >= 0)
            self._signatures.update(zip(
                [str(class_labels[c]) for c in c_codes[known]],
                names[s_codes[known]].astype(str).tolist(), strict=True))

    def count_split(self, rows: int) -> None:
        """Account for collective rows split into wait/transfer after their chunk was added."""
        self._split_rows += rows

    def merge(self, other: SummaryAccumulator) -> None:
        """Account for chunks summarised elsewhere (a worker process's)."""
        self.rows += other.rows
        self._ranks |= other._ranks
        self._nodes |= other._nodes
        self._steps |= other._steps
        self._signatures |= other._signatures
        self._collective_rows += other._collective_rows
        self._split_rows += other._split_rows
        for mine, theirs in ((self._classes, other._classes), (self._roles, other._roles)):
            for key, (count, total) in theirs.items():
                acc = mine.setdefault(key, [0, 0.0])
                acc[0] += count
                acc[1] += total

    def rename_signatures(self, mapping: dict[str, str]) -> None:
        """Replace place keys counted so far by their signatures.

        The mapping is :func:`bayesprism.ingest.signatures.signature_map`'s.
        """
        self._signatures = {(c, mapping.get(s, s)) for c, s in self._signatures}

    def result(self, attrs: dict | None = None) -> dict:
        """The summary as a JSON-ready dict."""
        attrs = attrs or {}
        ranks = [r for _, r in self._ranks if r >= 0]
        return {
            "rows": self.rows,
            "runs": len({run for run, _ in self._ranks}),
            "ranks": len({pair for pair in self._ranks if pair[1] >= 0}),
            "nodes": len({pair for pair in self._nodes if pair[1] != "*"}),
            "steps": len(self._steps),
            "rank_range": [int(min(ranks)), int(max(ranks))] if ranks else None,
            "kernel_classes": {
                cls: {"count": int(c), "total_us": float(t)}
                for cls, (c, t) in sorted(self._classes.items(), key=lambda kv: -kv[1][1])
            },
            "collective_rows": self._collective_rows,
            "collective_rows_with_wait_split": self._split_rows,
            "skipped": dict(attrs.get("skipped", {})),
            "notes": list(attrs.get("notes", [])),
            "per_run": {
                run: {k: meta.get(k) for k in ("format", "platform", "world_size",
                                               "gpus_per_node") if k in meta}
                | {"source_files": len(meta.get("source_files", []))}
                for run, meta in attrs.get("runs", {}).items()
            },
            "layout": {run: _layout_of(meta) for run, meta in attrs.get("runs", {}).items()
                       if meta.get("layout_sources")},
            "collective_roles": {role: {"count": int(c), "bytes": float(b)}
                                 for role, (c, b) in sorted(self._roles.items())},
            "signatures_per_class": _count_by_class(self._signatures),
        }


def _count_by_class(pairs: set[tuple[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for cls, _ in pairs:
        counts[cls] = counts.get(cls, 0) + 1
    return dict(sorted(counts.items()))


def _layout_of(meta: dict) -> dict:
    """A run's layout values with their provenance, and its rank-coordinate formula."""
    plan = meta.get("plan") or {}
    sources = meta.get("layout_sources") or {}
    out = {"values": {k: {"value": plan.get(k, meta.get(k)), "source": v}
                      for k, v in sources.items()}}
    if meta.get("rank_coordinates"):
        out["rank_coordinates"] = meta["rank_coordinates"]
    return out


def format_layout(layout: dict) -> list[str]:
    """Lines showing a run's layout with provenance and its rank-coordinate formula.

    Examples
    --------
    >>> format_layout({"values": {"tp": {"value": 8, "source": "trace"}},
    ...                "rank_coordinates": {"order": ["tp"], "strides": {"tp": 1},
    ...                                     "exceptions": 0}})
    ['  layout: tp 8 (trace)', '  ranks: rank = tp_rank']
    """
    order = ("tp", "pp", "dp", "cp", "ep", "microbatches", "schedule", "sharding",
             "virtual_stages", "micro_batch_size", "gpus_per_node")
    values = layout.get("values", {})
    keys = [k for k in order if k in values] + [k for k in values if k not in order]
    lines = ["  layout: " + ", ".join(f"{k} {values[k]['value']} ({values[k]['source']})"
                                      for k in keys)]
    coords = layout.get("rank_coordinates")
    if coords and coords.get("order"):
        names = {"tp": "tp_rank", "pp": "pp_stage", "dp": "dp_rank", "cp": "cp_rank"}
        terms = [names[d] if coords["strides"][d] == 1 else f"{coords['strides'][d]}·{names[d]}"
                 for d in coords["order"]]
        text = "  ranks: rank = " + " + ".join(terms)
        if coords.get("exceptions"):
            text += f" (except {coords['exceptions']} ranks)"
        lines.append(text)
    return lines


def summarize_table(df: pd.DataFrame) -> dict:
    """Summary of a trace table: counts of rows, runs, ranks, nodes and steps, kernel classes.

    Parameters
    ----------
    df
        A trace table (its ``attrs`` supply skipped counts, notes and run metadata).

    Returns
    -------
    dict
        Keys ``rows``, ``runs``, ``ranks``, ``nodes``, ``steps`` (ints), ``kernel_classes``
        (``{class: {"count": n, "total_us": t}}``), ``skipped`` (``{reason: count}``),
        ``notes``, ``rank_range``, ``collective_rows``, ``collective_rows_with_wait_split``,
        ``per_run``.

    Examples
    --------
    >>> import pandas as pd
    >>> from bayesprism.schema import validate_table
    >>> df = validate_table(pd.DataFrame({
    ...     "run": ["r"] * 4, "step": [0, 0, 1, 1], "rank": [0, 1, 0, 1], "node": ["n0"] * 4,
    ...     "gpu": [0, 1, 0, 1], "kernel": ["gemm_a"] * 4, "kernel_class": ["gemm"] * 4,
    ...     "duration_us": [10.0, 11.0, 10.5, 12.0]}))
    >>> summary = summarize_table(df)
    >>> summary["rows"], summary["ranks"], summary["steps"]
    (4, 2, 2)
    """
    acc = SummaryAccumulator()
    acc.add(df)
    return acc.result(df.attrs)


def format_summary(summary: dict) -> str:
    """Human-readable multi-line rendering of :func:`summarize_table`'s result."""
    lines = [
        f"rows: {summary['rows']:,}   runs: {summary['runs']}   ranks: {summary['ranks']}   "
        f"nodes: {summary['nodes']}   steps: {summary['steps']}",
    ]
    for run, meta in summary.get("per_run", {}).items():
        details = ", ".join(f"{k} {v}" for k, v in meta.items() if v is not None)
        lines.append(f"  run {run}: {details}")
    for run, layout in summary.get("layout", {}).items():
        lines.extend(line.replace("  layout:", f"  run {run} layout:", 1)
                     for line in format_layout(layout))
    signatures = summary.get("signatures_per_class", {})
    lines.append("kernel classes (count, total time" + (", signatures)" if signatures else "):"))
    for cls, stats in summary["kernel_classes"].items():
        extra = f"  {signatures[cls]:>5} sig." if cls in signatures else ""
        lines.append(f"  {cls:<14} {stats['count']:>10,}  {stats['total_us'] / 1e3:>12,.3f} ms"
                     + extra)
    if summary.get("collective_roles"):
        lines.append("collective roles (launches, bytes):")
        for role, stats in summary["collective_roles"].items():
            gib = stats["bytes"] / 2**30
            lines.append(f"  {role:<14} {stats['count']:>10,}  {gib:>12,.2f} GiB")
    if summary.get("collective_rows"):
        lines.append(f"collective rows with a wait/transfer split: "
                     f"{summary['collective_rows_with_wait_split']:,} of "
                     f"{summary['collective_rows']:,}")
    if summary["skipped"]:
        lines.append("skipped:")
        for reason, count in summary["skipped"].items():
            lines.append(f"  {count:>10,}  {reason}")
    else:
        lines.append("skipped: nothing")
    for note in summary.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


__all__ = ["SummaryAccumulator", "format_layout", "format_summary", "summarize_table"]
