"""Cell sufficient statistics: exact against pandas and scipy, and fast at scale."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from scipy import stats

from bayesprism.model import cells as cells_mod
from bayesprism.model.cells import aggregate_cells


def gaussian_cell_loglik(n, mean, ss, mu, sigma) -> np.ndarray:
    """Exact log likelihood of each cell's rows under N(mu, sigma), from its statistics (the
    likelihood the kernel model writes in PyTensor)."""
    n = np.asarray(n, dtype=float)
    return (
        -0.5 * n * np.log(2.0 * np.pi)
        - n * np.log(sigma)
        - (np.asarray(ss) + n * (np.asarray(mean) - mu) ** 2) / (2.0 * np.asarray(sigma) ** 2)
    )


def _random_groups(n, rng):
    a = rng.integers(0, 7, n)
    b = rng.integers(0, 5, n)
    y = rng.normal(3.0, 0.4, n)
    return a, b, y


def test_statistics_match_pandas_groupby():
    rng = np.random.default_rng(0)
    a, b, y = _random_groups(5_000, rng)
    got = aggregate_cells({"a": a, "b": b}, {"a": 7, "b": 5}, y)
    ref = (pd.DataFrame({"a": a, "b": b, "y": y}).groupby(["a", "b"])["y"]
           .agg(n="count", mean="mean", var=lambda s: s.var(ddof=0)).reset_index())
    assert np.array_equal(got.codes["a"], ref["a"]) and np.array_equal(got.codes["b"], ref["b"])
    assert np.array_equal(got.n, ref["n"].to_numpy(float))
    assert np.allclose(got.mean, ref["mean"], rtol=1e-13)
    assert np.allclose(got.ss, ref["var"] * ref["n"], rtol=1e-10, atol=1e-12)


def test_empty_combinations_are_left_out_and_singletons_have_zero_spread():
    got = aggregate_cells({"k": np.array([0, 0, 3]), "g": np.array([1, 1, 0])},
                          {"k": 4, "g": 2}, np.array([1.0, 3.0, 5.0]))
    assert got.codes["k"].tolist() == [0, 3] and got.codes["g"].tolist() == [1, 0]
    assert got.n.tolist() == [2.0, 1.0]
    assert got.mean.tolist() == [2.0, 5.0]
    assert got.ss.tolist() == [2.0, 0.0]


def test_sorting_path_for_huge_key_spaces_agrees(monkeypatch):
    rng = np.random.default_rng(1)
    a, b, y = _random_groups(2_000, rng)
    dense = aggregate_cells({"a": a, "b": b}, {"a": 7, "b": 5}, y)
    monkeypatch.setattr(cells_mod, "_DENSE_KEY_LIMIT", 1)
    sparse = aggregate_cells({"a": a, "b": b}, {"a": 7, "b": 5}, y)
    for name in ("n", "mean", "ss"):
        assert np.allclose(getattr(dense, name), getattr(sparse, name))
    assert np.array_equal(dense.codes["a"], sparse.codes["a"])


def test_cell_loglik_equals_sum_of_row_logpdfs():
    rng = np.random.default_rng(2)
    a, b, y = _random_groups(3_000, rng)
    got = aggregate_cells({"a": a, "b": b}, {"a": 7, "b": 5}, y)
    mu = rng.normal(3.0, 0.2, len(got))
    sigma = rng.uniform(0.2, 0.6, len(got))
    cell_total = gaussian_cell_loglik(got.n, got.mean, got.ss, mu, sigma).sum()
    key = pd.MultiIndex.from_arrays([got.codes["a"], got.codes["b"]])
    row_cell = key.get_indexer(pd.MultiIndex.from_arrays([a, b]))
    row_total = stats.norm.logpdf(y, mu[row_cell], sigma[row_cell]).sum()
    assert np.isclose(cell_total, row_total, rtol=1e-12)


def test_ten_million_rows_aggregate_in_seconds():
    rng = np.random.default_rng(3)
    n = 10_000_000
    kernel = rng.integers(0, 20, n)
    gpustep = rng.integers(0, 10_240, n)
    y = rng.normal(size=n)
    start = time.perf_counter()
    got = aggregate_cells({"kernel": kernel, "gs": gpustep}, {"kernel": 20, "gs": 10_240}, y)
    seconds = time.perf_counter() - start
    assert got.n.sum() == n
    assert seconds < 10.0, f"aggregation took {seconds:.1f} s"
