"""What a trace table holds, in a few numbers: runs, ranks, nodes, steps, kernel classes.

:func:`summarize_table` works on a DataFrame; :class:`SummaryAccumulator` builds the same
summary chunk by chunk, so streaming ingestion never has to read its output back.
"""

from __future__ import annotations

import pandas as pd


class SummaryAccumulator:
    """Incremental summary of trace-table chunks (memory grows with distinct keys only)."""

    def __init__(self) -> None:
        self.rows = 0
        self._ranks: set[tuple[str, int]] = set()
        self._nodes: set[tuple[str, str]] = set()
        self._steps: set[tuple[str, int]] = set()
        self._classes: dict[str, list[float]] = {}
        self._collective_rows = 0
        self._split_rows = 0

    def add(self, df: pd.DataFrame) -> None:
        """Account for one chunk of rows."""
        if len(df) == 0:
            return
        self.rows += len(df)
        run = df["run"].astype(str)
        for pairs, target in (((run, df["rank"]), self._ranks), ((run, df["node"].astype(str)),
                              self._nodes), ((run, df["step"]), self._steps)):
            unique = pd.DataFrame({"a": pairs[0].to_numpy(), "b": pairs[1].to_numpy()})
            target.update(map(tuple, unique.drop_duplicates().itertuples(index=False)))
        stats = df.groupby(df["kernel_class"].astype(str), observed=True)["duration_us"].agg(
            ["count", "sum"])
        for cls, (count, total) in stats.iterrows():
            acc = self._classes.setdefault(str(cls), [0, 0.0])
            acc[0] += int(count)
            acc[1] += float(total)
        if "transfer_us" in df:
            from bayesprism.schema import COLLECTIVE_CLASSES

            coll = df["kernel_class"].astype(str).isin(COLLECTIVE_CLASSES).to_numpy()
            self._collective_rows += int(coll.sum())
            self._split_rows += int((coll & df["transfer_us"].notna().to_numpy()).sum())

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
        }


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
    lines.append("kernel classes (count, total time):")
    for cls, stats in summary["kernel_classes"].items():
        lines.append(f"  {cls:<14} {stats['count']:>10,}  {stats['total_us'] / 1e3:>12,.3f} ms")
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


__all__ = ["SummaryAccumulator", "format_summary", "summarize_table"]
