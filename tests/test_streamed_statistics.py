"""Statistics streamed file by file (``ingest --statistics``): the whole table's statistics on
both engines, partial cells merged in any grouping, and a client that never holds a compute
row."""

from __future__ import annotations

import pickle
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from bayesprism.ingest import read_traces
from bayesprism.ingest.dispatch import collective_mask
from bayesprism.inventory import InventoryPart, inventory_of_parts, kernel_inventory
from bayesprism.model.statistics import batch_statistics, merge_statistics, table_statistics
from bayesprism.schema import signature_as_kernel
from bayesprism.statistics import ingest_statistics, statistics_of
from bayesprism.statistics.artifact import statistics_of_part
from bayesprism.statistics.stream import StatisticsPart, stream_statistics

KEYS = ["run", "node", "gpu", "step", "kernel", "kernel_class", "usable", "fixed_role"]


@pytest.fixture(scope="module")
def dev_table(dev_subset) -> pd.DataFrame:
    return read_traces([dev_subset], progress=False)


def assert_same_cells(streamed: pd.DataFrame, whole: pd.DataFrame, rtol: float = 1e-12) -> None:
    """Keys and counts identical, means and spreads up to the order of summation."""
    assert list(streamed.columns) == list(whole.columns)
    assert (streamed.dtypes == whole.dtypes).all()
    counts = [c for c in whole.columns if c not in ("mean_log", "ss_log")]
    pd.testing.assert_frame_equal(streamed[counts], whole[counts], check_exact=True)
    for column in ("mean_log", "ss_log"):
        np.testing.assert_allclose(streamed[column], whole[column], rtol=rtol, atol=rtol)


@pytest.mark.parametrize("engine", ["embedded", "dask"])
def test_streamed_statistics_are_the_whole_tables(request, dev_subset, dev_table, engine):
    client = request.getfixturevalue("dask_client") if engine == "dask" else None
    part, signatures, attrs = stream_statistics([dev_subset], engine=engine, client=client,
                                                progress=False)
    streamed = statistics_of_part(part, attrs, kernels=signatures)
    whole = statistics_of(dev_table)
    assert_same_cells(streamed.model.kernel_cells, whole.model.kernel_cells)
    pd.testing.assert_frame_equal(streamed.model.collective_cells,
                                  whole.model.collective_cells, check_exact=True)
    assert streamed.inventory.identical(whole.inventory)
    assert streamed.attrs == whole.attrs
    # a cell of one place key (most of them) is the table's, bit for bit
    exact = streamed.model.kernel_cells["mean_log"] == whole.model.kernel_cells["mean_log"]
    assert exact.mean() > 0.3


def test_both_engines_stream_the_same_statistics_bit_for_bit(dask_client, dev_subset,
                                                              tmp_path):
    embedded = ingest_statistics([dev_subset], tmp_path / "e.parquet", progress=False)
    dask = ingest_statistics([dev_subset], tmp_path / "d.parquet", engine="dask",
                             client=dask_client, progress=False)
    assert embedded["input_digest"] == dask["input_digest"]


def _batches(table: pd.DataFrame, groups: np.ndarray) -> list:
    return [batch_statistics(table.loc[groups == g]) for g in np.unique(groups)]


def test_merging_partial_cells_in_any_grouping_gives_the_same_cells(dev_table):
    table = signature_as_kernel(dev_table)
    whole = table_statistics(table)
    rng = np.random.default_rng(0)
    for trial in range(4):
        # rows of one cell split over batches (unlike files, where a GPU's rows are in one)
        groups = rng.integers(0, 3 + trial, size=len(table))
        parts = _batches(table, groups)
        order = rng.permutation(len(parts))
        flat = merge_statistics([parts[i] for i in order])
        nested = merge_statistics([merge_statistics([parts[i] for i in order[:2]]),
                                   merge_statistics([parts[i] for i in order[2:]])])
        for merged in (flat, nested):
            assert_same_cells(merged.kernel_cells, whole.kernel_cells)
            assert_same_cells(merged.collective_cells, whole.collective_cells)
    # one batch: bit for bit
    pd.testing.assert_frame_equal(merge_statistics([batch_statistics(table)]).kernel_cells,
                                  whole.kernel_cells, check_exact=True)


def test_inventory_parts_merge_to_the_tables_inventory(dev_table):
    table = signature_as_kernel(dev_table)
    whole = kernel_inventory(table)
    ranks = np.sort(table["rank"].unique())
    for order in (ranks, ranks[::-1], np.roll(ranks, 3)):
        part = InventoryPart()
        for pair in np.array_split(order, 3):  # a part holds whole ranks, as a file does
            part.merge(InventoryPart.of(table.loc[table["rank"].isin(pair)]))
        assert inventory_of_parts(part, table.attrs).identical(whole)


def test_statistics_parts_of_tables_name_place_keys_at_the_end():
    table = pd.DataFrame({"run": ["r"] * 3, "step": [0] * 3, "node": ["n"] * 3,
                          "gpu": [0] * 3, "rank": [0] * 3, "kernel": ["g"] * 3,
                          "signature": ["g\x1fa", "g\x1fb", "g\x1fa"],
                          "kernel_class": ["gemm"] * 3, "duration_us": [1.0, 2.0, 4.0]})
    part = StatisticsPart.of(table.iloc[:2])
    part.merge(StatisticsPart.of(table.iloc[2:]))
    stats = statistics_of_part(part, {}, kernels={"g\x1fa": "g", "g\x1fb": "g"})
    cells = stats.model.kernel_cells
    assert cells[["kernel", "n"]].to_numpy().tolist() == [["g", 3]]
    logs = np.log([1.0, 2.0, 4.0])
    assert cells["mean_log"].iloc[0] == pytest.approx(logs.mean(), rel=1e-15)
    assert cells["ss_log"].iloc[0] == pytest.approx(((logs - logs.mean()) ** 2).sum(),
                                                    rel=1e-12)
    assert stats.inventory["launches"].values.tolist() == [[3.0]]


def _taken(value, kind) -> list:
    """The values of ``kind`` in what the client took of one task: a file's result (its rows,
    or the tuple its ``finish`` made of them) or the reduction's (accumulators, keys)."""
    first = value[0] if isinstance(value, tuple) and value else None
    items = first if isinstance(first, tuple) else (first,)
    return [p for p in items if isinstance(p, kind)]


def test_the_client_holds_no_compute_rows(dask_client, dev_subset, dev_table, tmp_path,
                                          monkeypatch):
    from bayesprism.ingest import distributed

    received = []
    result = distributed._result

    def spy(future, source):  # everything the client takes from the cluster
        value = result(future, source)
        received.append(value)
        return value

    monkeypatch.setattr(distributed, "_result", spy)
    ingest_statistics([dev_subset], tmp_path / "warm.parquet", engine="dask",
                      client=dask_client, progress=False, digests=False)
    received.clear()
    tracemalloc.start()
    try:
        ingest_statistics([dev_subset], tmp_path / "stats.parquet", engine="dask",
                          client=dask_client, progress=False, digests=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    frames = [p for value in received for p in _taken(value, pd.DataFrame)]
    rows = [f for f in frames if "duration_us" in f.columns]
    assert len(rows) == 8 and all(collective_mask(f).all() for f in rows)  # collectives only
    # the rest: each file's kernel cells (by place key) and launch counts, written to disk
    others = [f for f in frames if "duration_us" not in f.columns]
    assert len(others) == 16
    assert all("mean_log" in f.columns or "tail_n" in f.columns for f in others)
    parts = [p for value in received for p in _taken(value, StatisticsPart)]
    assert len(parts) == 9 and not any(p.cells for p in parts)
    compute = dev_table.loc[~collective_mask(dev_table)]
    assert sum(len(pickle.dumps(v)) for v in received) < compute.memory_usage(deep=True).sum()
    # the whole table held on the client took 4.8 times its size; streamed, 1.7 times
    assert peak < 2.5 * dev_table.memory_usage(deep=True).sum()


def test_an_inventory_part_is_small_beside_its_syncs(dev_files):
    """Issue 20: a Dask worker merging inventory parts grew with the number of files (610 MB
    at 1,024 generated rank files, 213 MB at 64): a part held each sync's idle as a Python
    float and each synchronising kernel's name as its own string. A rank file's part now
    pickles to about 12 bytes a sync segment (its idle, and its compute cover in float32)
    plus one pointer a name (was ~2x that)."""
    import pickle

    import bayesprism as bp
    from bayesprism.inventory import InventoryPart

    table = bp.read_traces([dev_files[0]], progress=False)
    part = InventoryPart.of(table)
    syncs = part.frame("syncs")
    segments = sum(len(rest) + 1 for rest in syncs["rest"])
    assert len(pickle.dumps(part)) < 24 * segments
