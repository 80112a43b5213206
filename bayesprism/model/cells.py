"""Sufficient statistics of log durations per cell (DESIGN §5): count, mean and spread.

For Gaussian residuals on the log scale, a cell of n launches with mean m and sum of squared
deviations SS carries all the information of its rows:

    Σ log N(y_i | μ, s) = −n log s − (SS + n (m − μ)²) / (2 s²) + const,

so the model's cost grows with cells, not launches. Aggregation is one pass of ``np.bincount``
over integer cell keys (10^7 rows in about a second), never a Python loop or an object groupby.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

#: Above this many possible keys, cells are found by sorting instead of a dense bincount.
_DENSE_KEY_LIMIT = 50_000_000


@dataclass(frozen=True)
class CellStats:
    """Per-cell statistics of values grouped by several integer code arrays.

    Attributes
    ----------
    codes
        For each grouping name, the code of every cell (arrays of length ``n_cells``).
    n
        Number of values in each cell (float64, ≥ 1).
    mean
        Mean value of each cell.
    ss
        Sum of squared deviations from the cell mean (0 for single-value cells).
    of_value
        The cell of each value (None where the values are not known).
    """

    codes: dict[str, np.ndarray]
    n: np.ndarray
    mean: np.ndarray
    ss: np.ndarray
    of_value: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.n.size)


def aggregate_cells(
    codes: Mapping[str, np.ndarray], sizes: Mapping[str, int], values: np.ndarray
) -> CellStats:
    """Group ``values`` by the combination of integer codes and return per-cell statistics.

    Parameters
    ----------
    codes
        Name → integer array of codes in ``[0, sizes[name])``, one per value.
    sizes
        Number of distinct codes of each grouping.
    values
        The values to aggregate (e.g. log durations), float array of the same length.

    Returns
    -------
    CellStats
        Only cells that hold at least one value, in increasing order of the combined key
        (the first grouping varies slowest).
    """
    names = list(codes)
    values = np.asarray(values, dtype=np.float64)
    key = np.zeros(values.shape[0], dtype=np.int64)
    n_keys = 1
    for name in names:
        c = np.asarray(codes[name], dtype=np.int64)
        if c.shape != values.shape:
            raise ValueError(f"codes[{name!r}] has shape {c.shape}, values {values.shape}")
        key = key * int(sizes[name]) + c
        n_keys *= int(sizes[name])
    if n_keys <= _DENSE_KEY_LIMIT:
        count = np.bincount(key, minlength=n_keys)
        present = np.flatnonzero(count)
        compact = np.full(n_keys, -1, dtype=np.int64)
        compact[present] = np.arange(present.size)
        cell_of_value = compact[key]
        n = count[present].astype(np.float64)
        cell_keys = present
    else:
        cell_keys, cell_of_value, count = np.unique(key, return_inverse=True, return_counts=True)
        n = count.astype(np.float64)
    total = np.bincount(cell_of_value, weights=values, minlength=n.size)
    mean = total / n
    # Two-pass spread: deviations from the cell mean avoid the cancellation of Σy² − n m².
    dev = values - mean[cell_of_value]
    ss = np.bincount(cell_of_value, weights=dev * dev, minlength=n.size)
    out_codes: dict[str, np.ndarray] = {}
    rest = cell_keys.copy()
    for name in reversed(names):
        out_codes[name] = rest % int(sizes[name])
        rest //= int(sizes[name])
    return CellStats(codes={k: out_codes[k] for k in names}, n=n, mean=mean, ss=ss,
                     of_value=cell_of_value)
