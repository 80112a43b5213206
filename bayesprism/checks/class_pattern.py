"""Do a level's units slow down across kernel classes in the pattern its loadings share?

The kernel model gives a node (or a cabinet) one effect, times a loading per kernel class: a
node slow on GEMMs is slow on every class in the fleet's proportions (clock throttling slows
compute-bound GEMMs and attention more than memory-bound kernels). A node that is slow in a
pattern of its own (e.g. 10 % on every class alike, where the others differ 2.5 times more
on GEMMs than on element-wise kernels) cannot be held by that level: the fit then moves the
other nodes' differences into other levels and reads the node population from the outlier
alone, and it often does not converge (docs/status.md).

The same holds for a GPU within its node. :func:`off_pattern_units` reads the fit's block
statistics, takes each unit's effect per compute class (:func:`unit_class_effects`), and
compares every unit with the pattern of the others (their first principal direction): a unit
whose class effects that pattern leaves largely unexplained, by far more than it leaves of
the others', is named.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism.model.start import gpu_class_effects

#: Share of a unit's class effects (root sum of squares) the others' pattern leaves over,
#: above which the unit is off the pattern (10 % on every class alike, against the dev traces'
#: pattern of GEMM and attention 2.5x the memory-bound classes, leaves 0.48).
OFF_PATTERN_SHARE = 0.3
#: ... and by this many times the median leftover of the other units.
OFF_PATTERN_RATIO = 4.0


def unit_class_effects(posterior: xr.DataTree, level: str = "node") -> pd.DataFrame | None:
    """Per node or GPU (``level``) and compute class, the effects the data show, in logs,
    centred on the median unit.

    A GPU's effect is the launch-weighted mean deviation of its GPU-steps once each step's
    class means are removed, less its node's median GPU (the GPU level holds GPUs within
    their node); a node's is its median GPU's, so that one odd GPU is read as the GPU's and
    not the node's. Compute classes are those the level loads on (a posterior
    ``{level}_scale`` above zero). None for other levels, or when the fit has no block
    statistics.

    Returns
    -------
    pandas.DataFrame or None
        Units (the level's coordinate) × compute classes.
    """
    if "constant_data" not in posterior.children or "posterior" not in posterior.children:
        return None
    data = posterior["constant_data"].to_dataset()
    post = posterior["posterior"].to_dataset()
    needed = ("block_dev_log", "block_n", "step_of_gpustep", "gpu_of_gpustep", "node_of_gpustep")
    if (level not in ("node", "gpu") or any(name not in data for name in needed)
            or f"{level}_scale" not in post):
        return None
    block_n = data["block_n"].to_numpy().astype(float)
    gpu = data["gpu_of_gpustep"].to_numpy().astype(np.int64)
    step = data["step_of_gpustep"].to_numpy().astype(np.int64)
    if block_n.shape[0] != gpu.size:  # blocks not one per GPU-step: nothing to read
        return None
    loads = post[f"{level}_scale"].median(("chain", "draw"))
    classes = loads["kernel_class"].to_numpy()[loads.to_numpy() > 0]
    index = [list(data["kernel_class"].to_numpy()).index(c) for c in classes]
    _, effects, counts = gpu_class_effects(data["block_dev_log"].to_numpy()[:, index],
                                           block_n[:, index], gpu, step)
    node_of_gpu = np.zeros(effects.shape[0], dtype=np.int64)
    node_of_gpu[gpu] = data["node_of_gpustep"].to_numpy().astype(np.int64)
    # medians, not means: a mean would spread one slow GPU over its node and the node's GPUs
    medians = np.stack([np.median(effects[node_of_gpu == k], axis=0)
                        for k in range(int(node_of_gpu.max()) + 1)])
    if level == "gpu":
        effects = effects - medians[node_of_gpu]
    else:
        node_counts = np.zeros_like(medians)
        np.add.at(node_counts, node_of_gpu, counts)
        effects, counts = medians, node_counts
    full = (counts > 0).all(axis=1)
    coord = {"gpu": "gpu_unit"}.get(level, level)
    labels = np.asarray(post[coord].to_numpy() if coord in post.coords else
                        np.arange(effects.shape[0]))
    table = pd.DataFrame(effects[full], index=labels[full], columns=classes)
    # centred on the median unit: a mean would carry an outlier's share into every other unit
    return table - table.median(axis=0)


def off_pattern_notes(posterior: xr.DataTree) -> list[str]:
    """:func:`off_pattern_units` of the nodes, then of the GPUs.

    Examples
    --------
    >>> off_pattern_notes(xr.DataTree())
    []
    """
    return [note for level in ("node", "gpu") for note in off_pattern_units(posterior, level)]


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

    Named rows leave the others' pattern one at a time, worst first: a large odd row would
    otherwise turn the direction the others are read against towards itself.

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
    rows = np.arange(len(values))
    named = np.zeros(len(values), dtype=bool)
    while True:
        shares = np.zeros(len(values))
        for i, row in enumerate(values):
            others = values[~named & (rows != i)]
            direction = np.linalg.svd(others, full_matrices=False)[2][0]
            norm = float(np.linalg.norm(row))
            if norm > 0:
                shares[i] = float(np.linalg.norm(row - (row @ direction) * direction)) / norm
        leftover = shares * np.linalg.norm(values, axis=1)
        candidates = [i for i in np.flatnonzero(~named) if shares[i] > OFF_PATTERN_SHARE
                      and leftover[i] > OFF_PATTERN_RATIO * np.median(
                          leftover[~named & (rows != i)])]
        if not candidates or (~named).sum() <= 3:
            return shares, named
        named[max(candidates, key=lambda i: leftover[i])] = True
