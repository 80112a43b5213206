"""Do a level's units slow down across kernel classes in the pattern its loadings share?

The kernel model gives a node (or a cabinet) one effect, times a loading per kernel class: a
node slow on GEMMs is slow on every class in the fleet's proportions (clock throttling slows
compute-bound GEMMs and attention more than memory-bound kernels). A node that is slow in a
pattern of its own (e.g. 10 % on every class alike, where the others differ 2.5 times more
on GEMMs than on element-wise kernels) cannot be held by that level: the fit then moves the
other nodes' differences into other levels and reads the node population from the outlier
alone, and it often does not converge (docs/status.md).

:func:`off_pattern_units` reads the fit's block statistics, takes each unit's mean deviation
per compute class once each step's class means are removed, and compares every unit with the
pattern of the others (their first principal direction): a unit whose class effects that
pattern leaves largely unexplained, by far more than it leaves of the others', is named.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism.model.start import class_means

#: Share of a unit's class effects (root sum of squares) the others' pattern leaves over,
#: above which the unit is off the pattern (10 % on every class alike, against the dev traces'
#: pattern of GEMM and attention 2.5x the memory-bound classes, leaves 0.48).
OFF_PATTERN_SHARE = 0.3
#: ... and by this many times the median leftover of the other units.
OFF_PATTERN_RATIO = 4.0


def unit_class_effects(posterior: xr.DataTree, level: str = "node") -> pd.DataFrame | None:
    """Per unit of ``level`` and compute class, the launch-weighted mean log deviation of its
    GPU-steps once each step's class means are removed, centred on the units' median.

    Compute classes are those the level loads on (a posterior ``{level}_scale`` above zero).
    None when the fit has no block statistics or no such level.

    Returns
    -------
    pandas.DataFrame or None
        Units (the level's coordinate) × compute classes.
    """
    if "constant_data" not in posterior.children or "posterior" not in posterior.children:
        return None
    data = posterior["constant_data"].to_dataset()
    post = posterior["posterior"].to_dataset()
    needed = ("block_dev_log", "block_n", "step_of_gpustep", f"{level}_of_gpustep")
    if any(name not in data for name in needed) or f"{level}_scale" not in post:
        return None
    block_n = data["block_n"].to_numpy().astype(float)
    unit = data[f"{level}_of_gpustep"].to_numpy().astype(np.int64)
    step = data["step_of_gpustep"].to_numpy().astype(np.int64)
    if block_n.shape[0] != unit.size:  # blocks not one per GPU-step: nothing to read
        return None
    loads = post[f"{level}_scale"].median(("chain", "draw"))
    classes = loads["kernel_class"].to_numpy()[loads.to_numpy() > 0]
    index = [list(data["kernel_class"].to_numpy()).index(c) for c in classes]
    n = block_n[:, index]
    deviation = np.divide(data["block_dev_log"].to_numpy()[:, index], n,
                          out=np.zeros_like(n), where=n > 0)
    deviation = deviation - class_means(deviation, n, step, int(step.max()) + 1)[0][step]
    effects, counts = class_means(deviation, n, unit, int(unit.max()) + 1)
    full = (counts > 0).all(axis=1)
    labels = np.asarray(post[level].to_numpy() if level in post.coords else
                        np.arange(effects.shape[0]))
    table = pd.DataFrame(effects[full], index=labels[full], columns=classes)
    # centred on the median unit: a mean would carry an outlier's share into every other unit
    return table - table.median(axis=0)


def off_pattern_units(posterior: xr.DataTree, level: str = "node") -> list[str]:
    """Notes naming the units of ``level`` whose class effects are not the others' pattern.

    Each unit's effects (:func:`unit_class_effects`) are projected on the first principal
    direction of the other units' effects; a unit is named when the leftover is more than
    :data:`OFF_PATTERN_SHARE` of its effects and :data:`OFF_PATTERN_RATIO` times the median
    leftover of the others (each against the pattern of all but itself). Needs four units and
    two compute classes.

    Returns
    -------
    list of str
        One note per unit named (empty when none or when the check does not apply).

    Examples
    --------
    >>> off_pattern_units(xr.DataTree())  # no block statistics: nothing to read
    []
    """
    effects = unit_class_effects(posterior, level)
    if effects is None or effects.shape[0] < 4 or effects.shape[1] < 2:
        return []
    shares, flagged = _off_pattern_rows(effects.to_numpy())
    notes = []
    for i in np.flatnonzero(flagged):
        per_class = ", ".join(f"{c} {100 * np.expm1(v):+.1f} %"
                              for c, v in effects.iloc[i].items())
        notes.append(
            f"{level} {effects.index[i]} is slow across kernel classes in a pattern of its own "
            f"({per_class}; {shares[i]:.0%} of it is not the other {level}s' pattern): one "
            f"{level} effect times per-class loadings cannot hold it, so the fit may put the "
            f"other {level}s' differences in other levels and read the {level} population's "
            "tail from this one; check its trace, or fit without it")
    return notes


def _off_pattern_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (unit), the share of its norm the other rows' first principal direction leaves
    over, and whether that makes it off the pattern (:data:`OFF_PATTERN_SHARE`,
    :data:`OFF_PATTERN_RATIO`).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> pattern = np.array([1.0, 1.0, 0.4, 0.4])   # GEMM-heavy, as throttling slows
    >>> effects = np.outer(rng.normal(0, 0.02, 8), pattern)
    >>> effects += rng.normal(0, 0.001, effects.shape)
    >>> effects[3] = 0.1                            # 10 % slower on every class alike
    >>> np.flatnonzero(_off_pattern_rows(effects)[1]).tolist()
    [3]
    >>> effects[3] = 0.1 * pattern                  # 10 % slower in the pattern
    >>> np.flatnonzero(_off_pattern_rows(effects)[1]).tolist()
    []
    """
    shares = _leftover_shares(values)
    leftover = shares * np.linalg.norm(values, axis=1)
    flagged = np.array([shares[i] > OFF_PATTERN_SHARE
                        and leftover[i] > OFF_PATTERN_RATIO * np.median(np.delete(leftover, i))
                        for i in range(len(values))], dtype=bool)
    return shares, flagged


def _leftover_shares(values: np.ndarray) -> np.ndarray:
    """Per row, the share of its norm left over by the first principal direction of the
    other rows (0 for a zero row)."""
    shares = np.zeros(values.shape[0])
    for i in range(values.shape[0]):
        others = np.delete(values, i, axis=0)
        direction = np.linalg.svd(others, full_matrices=False)[2][0]
        row = values[i]
        norm = float(np.linalg.norm(row))
        if norm > 0:
            shares[i] = float(np.linalg.norm(row - (row @ direction) * direction)) / norm
    return shares
