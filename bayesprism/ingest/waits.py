"""Split each collective's measured duration into waiting for peers and transferring data.

A collective kernel starts on a rank when that rank reaches it and ends (nearly) together on all
participants once the slowest one has arrived and the data has moved. So for one collective
*instance* with participants ``i`` (start ``s_i``, duration ``d_i``, end ``e_i = s_i + d_i``)
and latest start ``S = max_i s_i``::

    transfer_i = e_i - S          # time after the last participant arrived
    wait_i     = d_i - transfer_i = S - s_i

so the last arriver waits 0 and ``wait_i + transfer_i == d_i`` exactly.

Instances are matched across the rank files of a run by (run, step, process group, kernel
name, occurrence): the n-th launch of the same NCCL kernel in the same step and group. A trace
without ``Process Group Name`` puts all its collectives in one unnamed group. An instance is
*complete* when it has exactly one row per participant and as many participants as its group
(``group_size``, or the run's world size when the trace does not say). Incomplete instances
(ranks missing from the files, a rank with an extra launch) get NaN, and are counted.

Clocks. Ranks on one node share the host clock, but the hosts' clocks differ (NTP keeps them
within about 0.1 ms, which is a large share of a 200 µs pipeline transfer). When the rows name
their node, each host's clock offset is estimated first from the collectives themselves
(:func:`host_clock_offsets`: the participants of an instance end together, so a host's ends run
early or late by its offset, by median polish of the end times over instances and hosts), and
starts and ends are compared on the aligned clocks. When the data still contradict agreeing
clocks for an instance (some participant *ends before* the latest start), the instance falls
back to a clock-free estimate: every participant's transfer is the shortest duration among them
(the participant that waited least) and the rest of its duration is waiting. Such instances are
counted as clock anomalies.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

MATCH_COLUMNS = ("run", "step", "process_group", "kernel", "occurrence")


def split_wait_transfer(
    rows: pd.DataFrame, world_sizes: Mapping[str, int | None] | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Wait and transfer time of every collective row.

    Parameters
    ----------
    rows
        Collective rows of one or more runs, with columns ``run``, ``step``, ``rank``,
        ``kernel``, ``occurrence``, ``start_us``, ``duration_us`` and optionally
        ``process_group`` and ``group_size``.
    world_sizes
        World size of each run: the number of participants of an instance whose
        ``group_size`` is unknown.

    Returns
    -------
    (wait_us, transfer_us, counts)
        Arrays aligned with ``rows`` (NaN where the split is not possible) and counts:
        ``instances``, ``split_instances``, ``incomplete_instances``, ``incomplete_rows``,
        ``duplicate_rank_instances``, ``clock_anomaly_instances``.
    """
    n = len(rows)
    wait = np.full(n, np.nan)
    transfer = np.full(n, np.nan)
    counts = dict.fromkeys(("instances", "split_instances", "incomplete_instances",
                            "incomplete_rows", "duplicate_rank_instances",
                            "clock_anomaly_instances", "clock_offset_hosts",
                            "clock_offset_max_us"), 0)
    if n == 0:
        return wait, transfer, counts
    # Integer codes of the matching keys: cheap to group, no strings materialised.
    keys = pd.DataFrame({col: _codes(rows[col]) if col in rows else np.zeros(n, dtype=np.int64)
                         for col in MATCH_COLUMNS})
    group = keys.groupby(list(MATCH_COLUMNS), sort=False).ngroup().to_numpy()
    start = rows["start_us"].to_numpy(dtype=np.float64, na_value=np.nan)
    duration = rows["duration_us"].to_numpy(dtype=np.float64, na_value=np.nan)
    end = start + duration
    rank = rows["rank"].to_numpy()

    if "node" in rows:
        offset, counts["clock_offset_hosts"], counts["clock_offset_max_us"] = (
            _aligned_offsets(rows["node"], group, end))
        start, end = start - offset, end - offset
    frame = pd.DataFrame({"g": group, "rank": rank, "start": start, "end": end, "dur": duration})
    by = frame.groupby("g", sort=False)
    n_rows = by["rank"].transform("size").to_numpy()
    n_ranks = by["rank"].transform("nunique").to_numpy()
    latest_start = by["start"].transform("max").to_numpy()
    earliest_end = by["end"].transform("min").to_numpy()
    shortest = by["dur"].transform("min").to_numpy()

    if "group_size" in rows:
        expected = rows["group_size"].astype("float64").to_numpy(na_value=np.nan)
    else:
        expected = np.full(n, np.nan)
    sizes = world_sizes or {}
    run_size = rows["run"].astype(str).map(lambda r: sizes.get(r) or np.nan).to_numpy(
        dtype=np.float64)
    expected = np.where(np.isnan(expected), run_size, expected)

    duplicate = n_rows != n_ranks
    complete = ~duplicate & (n_ranks >= 2) & (n_ranks == expected) & np.isfinite(end)
    anomaly = complete & (earliest_end < latest_start)

    measured = np.clip(end - latest_start, 0.0, duration)
    est_transfer = np.where(anomaly, shortest, measured)
    transfer[complete] = est_transfer[complete]
    wait[complete] = duration[complete] - est_transfer[complete]

    first = ~pd.Series(group).duplicated().to_numpy()
    counts["instances"] = int(first.sum())
    counts["split_instances"] = int((first & complete).sum())
    counts["incomplete_instances"] = int((first & ~complete & ~duplicate).sum())
    counts["incomplete_rows"] = int((~complete & ~duplicate).sum())
    counts["duplicate_rank_instances"] = int((first & duplicate).sum())
    counts["clock_anomaly_instances"] = int((first & anomaly).sum())
    return wait, transfer, counts


def _aligned_offsets(node: pd.Series, group: np.ndarray, end: np.ndarray
                     ) -> tuple[np.ndarray, int, int]:
    """Each row's host clock offset (µs), the hosts aligned and the largest |offset| (whole
    µs, for the notes)."""
    host = _codes(node)
    finite = np.isfinite(end)
    none = (np.zeros(host.size), 0, 0)
    if not finite.any() or host.max() < 1:
        return none
    host, group, end = host[finite], group[finite], end[finite]
    offsets = host_clock_offsets(host, group, end)
    # aligned only where the offsets explain most of the disagreement of the instances' ends
    # (a few instances whose ends disagree at random are no evidence of skewed clocks)
    spans = _spans_hosts(host, group)
    g, e = group[spans], end[spans]
    if not _end_spread(g, e - offsets[host[spans]]) < 0.5 * _end_spread(g, e):
        return none
    shift = np.zeros(finite.size)
    shift[finite] = offsets[host]
    return shift, int(offsets.size), round(float(np.abs(offsets).max()))


def _spans_hosts(host: np.ndarray, instance: np.ndarray) -> np.ndarray:
    """Mask of the rows whose instance has participants on two or more hosts."""
    return pd.Series(host).groupby(instance).transform("nunique").to_numpy() >= 2


def _end_spread(instance: np.ndarray, end: np.ndarray) -> float:
    """Median absolute deviation of the ends from their instance's median (0 without rows)."""
    if end.size == 0:
        return 0.0
    ends = pd.Series(end)
    return float((ends - ends.groupby(instance).transform("median")).abs().median())


def host_clock_offsets(host: np.ndarray, instance: np.ndarray, end_us: np.ndarray,
                       iterations: int = 20) -> np.ndarray:
    """Clock offset of each host (µs, median host 0) from the end times of collective instances.

    The participants of a collective end (nearly) together, so ``end = E_instance + o_host``
    plus a small noise; median polish (alternate medians over instances and over hosts) fits
    that robustly. Only instances spanning two or more hosts inform it; a host sharing none
    with the others keeps offset 0.

    Parameters
    ----------
    host, instance
        Integer codes (0 .. n-1) of each row's host and collective instance.
    end_us
        Each row's end time on its host's clock.

    Returns
    -------
    numpy.ndarray
        Offset per host code, to subtract from that host's timestamps.

    Examples
    --------
    Two instances over hosts 0 and 1, whose clock runs 40 µs ahead:

    >>> host_clock_offsets(np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]),
    ...                    np.array([100.0, 140.0, 300.0, 341.0])).round(1).tolist()
    [-20.2, 20.2]
    """
    offsets = np.zeros(int(host.max()) + 1 if host.size else 0)
    spans = _spans_hosts(host, instance)
    if not spans.any():
        return offsets
    host, instance = host[spans], instance[spans]
    end = pd.Series(np.asarray(end_us, dtype=float)[spans])
    for _ in range(iterations):
        common = (end - offsets[host]).groupby(instance).transform("median")
        update = (end - common).groupby(host).median()
        new = offsets.copy()
        new[update.index] = update.to_numpy()
        new -= np.median(new[update.index])
        converged = np.allclose(new, offsets, atol=1e-3)
        offsets = new
        if converged:
            break
    return offsets


def _codes(values: pd.Series) -> np.ndarray:
    """Integer code per value (missing values share one code)."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        return values.cat.codes.to_numpy()
    codes, _ = pd.factorize(values, use_na_sentinel=False)
    return codes


def split_notes(counts_by_run: Mapping[str, dict[str, int]],
                ranks_by_run: Mapping[str, int]) -> list[str]:
    """Plain-language notes on what the split could and could not do, one per issue and run."""
    notes = []
    for run, counts in counts_by_run.items():
        n_ranks = ranks_by_run.get(run, 0)
        if counts["instances"] == 0:
            continue
        if n_ranks < 2:
            notes.append(f"run {run}: wait/transfer split of collectives not possible: only one "
                         "rank is present (wait_us and transfer_us left empty)")
            continue
        if counts["incomplete_instances"]:
            notes.append(
                f"run {run}: wait/transfer split left empty for {counts['incomplete_rows']} "
                f"collective rows ({counts['incomplete_instances']} of {counts['instances']} "
                "instances): fewer participants in the files than the group has (group_size, "
                "else the world size)")
        if counts["duplicate_rank_instances"]:
            notes.append(
                f"run {run}: {counts['duplicate_rank_instances']} collective instances have two "
                "rows of the same rank (ambiguous matching): wait/transfer left empty")
        if counts.get("clock_offset_hosts"):
            notes.append(
                f"run {run}: host clocks aligned from the collectives' end times before the "
                f"wait/transfer split ({counts['clock_offset_hosts']} hosts, offsets up to "
                f"{counts['clock_offset_max_us']} µs)")
        if counts["clock_anomaly_instances"]:
            notes.append(
                f"run {run}: {counts['clock_anomaly_instances']} collective instances have a "
                "participant that ended before the last one started (rank clocks disagree): "
                "transfer taken as the shortest participant duration")
    return notes
