"""Wait/transfer split of collectives: hand-computed cases."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bayesprism.ingest.waits import host_clock_offsets, split_notes, split_wait_transfer


def rows(*specs, run="r", step=0, kernel="ncclAllReduce", pg="0", group_size=None):
    """specs: (rank, occurrence, start, duration)."""
    return pd.DataFrame({
        "run": run, "step": step, "kernel": kernel, "process_group": pg,
        "rank": [s[0] for s in specs], "occurrence": [s[1] for s in specs],
        "start_us": [float(s[2]) for s in specs], "duration_us": [float(s[3]) for s in specs],
        "group_size": pd.array([group_size] * len(specs), dtype="Int64"),
    })


def test_three_ranks_aligned_ends():
    # Arrivals at 100, 130, 180; all end at 250 -> transfer 70, waits 80, 50, 0.
    df = rows((0, 0, 100, 150), (1, 0, 130, 120), (2, 0, 180, 70), group_size=3)
    wait, transfer, counts = split_wait_transfer(df)
    np.testing.assert_array_equal(wait, [80.0, 50.0, 0.0])
    np.testing.assert_array_equal(transfer, [70.0, 70.0, 70.0])
    assert counts["split_instances"] == 1 and counts["clock_anomaly_instances"] == 0


def test_ends_not_exactly_aligned_keep_wait_plus_transfer_equal_duration():
    # Ends 250 and 254: transfer is each rank's end minus the latest start (180).
    df = rows((0, 0, 100, 150), (1, 0, 180, 74), group_size=2)
    wait, transfer, _ = split_wait_transfer(df)
    np.testing.assert_array_equal(transfer, [70.0, 74.0])
    np.testing.assert_array_equal(wait, [80.0, 0.0])


def test_clock_anomaly_falls_back_to_shortest_duration():
    # Rank 0 ends at 130, before rank 1 starts at 140: clocks disagree.
    df = rows((0, 0, 100, 30), (1, 0, 140, 12), group_size=2)
    wait, transfer, counts = split_wait_transfer(df)
    np.testing.assert_array_equal(transfer, [12.0, 12.0])
    np.testing.assert_array_equal(wait, [18.0, 0.0])
    assert counts["clock_anomaly_instances"] == 1


def test_instances_matched_by_occurrence_step_and_group():
    a = rows((0, 0, 100, 50), (1, 0, 120, 30), (0, 1, 300, 20), (1, 1, 290, 30), group_size=2)
    b = rows((0, 0, 100, 10), (1, 0, 104, 6), pg="tp", group_size=2)  # another process group
    df = pd.concat([a, b], ignore_index=True)
    wait, transfer, counts = split_wait_transfer(df)
    np.testing.assert_array_equal(wait, [20.0, 0.0, 0.0, 10.0, 4.0, 0.0])
    np.testing.assert_array_equal(transfer, [30.0, 30.0, 20.0, 20.0, 6.0, 6.0])
    assert counts["instances"] == 3 == counts["split_instances"]


def test_missing_participant_leaves_nan_and_is_counted():
    # group_size 4 but only two ranks' files were read.
    df = rows((0, 0, 100, 50), (1, 0, 120, 30), group_size=4)
    wait, transfer, counts = split_wait_transfer(df)
    assert np.isnan(wait).all() and np.isnan(transfer).all()
    assert counts["incomplete_instances"] == 1 and counts["incomplete_rows"] == 2


def test_world_size_used_when_group_size_unknown():
    df = rows((0, 0, 100, 50), (1, 0, 120, 30))
    wait, _, _ = split_wait_transfer(df, {"r": 2})
    np.testing.assert_array_equal(wait, [20.0, 0.0])
    wait, _, counts = split_wait_transfer(df, {"r": 8})
    assert np.isnan(wait).all() and counts["incomplete_instances"] == 1


def test_same_rank_twice_in_an_instance_is_not_split():
    df = rows((0, 0, 100, 50), (0, 0, 120, 30), group_size=2)
    wait, _, counts = split_wait_transfer(df)
    assert np.isnan(wait).all() and counts["duplicate_rank_instances"] == 1


def test_notes_say_why():
    counts = {"instances": 3, "split_instances": 1, "incomplete_instances": 2,
              "incomplete_rows": 2, "duplicate_rank_instances": 0, "clock_anomaly_instances": 1}
    notes = split_notes({"a": counts, "b": counts}, {"a": 4, "b": 1})
    assert notes == [
        "run a: wait/transfer split left empty for 2 collective rows (2 of 3 instances): fewer "
        "participants in the files than the group has (group_size, else the world size)",
        "run a: 1 collective instances have a participant that ended before the last one "
        "started (rank clocks disagree): transfer taken as the shortest participant duration",
        "run b: wait/transfer split of collectives not possible: only one rank is present "
        "(wait_us and transfer_us left empty)",
    ]


def test_host_clock_offsets_are_recovered_from_the_collectives_end_times():
    # three hosts whose clocks run 0, +40 and -25 µs off; 300 instances, each over two of
    # them, ending together (within ±1 µs) on the true clock
    rng = np.random.default_rng(0)
    truth = np.array([0.0, 40.0, -25.0])
    pairs = rng.choice([(0, 1), (1, 2), (0, 2)], size=300)
    host = pairs.ravel()
    instance = np.repeat(np.arange(300), 2)
    end = np.repeat(rng.uniform(0, 1e6, 300), 2) + truth[host] + rng.uniform(-1, 1, 600)
    offsets = host_clock_offsets(host, instance, end)
    np.testing.assert_allclose(offsets - offsets[0], truth - truth[0], atol=0.5)
    # instances within one host say nothing about the others
    assert host_clock_offsets(np.array([0, 0, 1, 1]), np.array([0, 0, 1, 1]),
                              np.array([5.0, 6.0, 90.0, 91.0])).tolist() == [0.0, 0.0]


def test_hosts_clocks_are_aligned_before_the_split():
    # ranks 0 (host a) and 1 (host b, whose clock runs 60 µs ahead) arrive at 100 and 130 on
    # the true clock and end together at 250: transfer 120, rank 0 waits 30. On the raw
    # clocks rank 1 seems to start at 190 and end at 310 (transfer 60 and 120, wait 90).
    df = rows((0, 0, 100, 150), (1, 0, 190, 120), (0, 1, 400, 50), (1, 1, 470, 40),
              group_size=2)
    _, raw_transfer, _ = split_wait_transfer(df)
    np.testing.assert_array_equal(raw_transfer[:2], [60.0, 120.0])
    wait, transfer, counts = split_wait_transfer(df.assign(node=["a", "b", "a", "b"]))
    np.testing.assert_allclose(transfer, [120.0, 120.0, 40.0, 40.0])
    np.testing.assert_allclose(wait, [30.0, 0.0, 10.0, 0.0])
    assert counts["clock_offset_hosts"] == 2 and counts["clock_offset_max_us"] == 30
    note = [n for n in split_notes({"r": counts}, {"r": 2}) if "clocks aligned" in n]
    assert note == ["run r: host clocks aligned from the collectives' end times before the "
                    "wait/transfer split (2 hosts, offsets up to 30 µs)"]
    # one host: nothing to align
    _, same, counts = split_wait_transfer(df.assign(node="a"))
    np.testing.assert_array_equal(same, raw_transfer)
    assert counts["clock_offset_hosts"] == 0
