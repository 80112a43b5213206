"""A node slow across kernel classes in a pattern of its own is named (checks.class_pattern)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from bayesprism.checks.class_pattern import off_pattern_units, unit_class_effects

CLASSES = ["gemm", "attention", "elementwise", "norm", "allgather"]
PATTERN = np.array([1.0, 1.0, 0.4, 0.4, 0.0])  # compute-bound classes slow 2.5x more


def _fit(outlier: np.ndarray, seed: int = 0) -> xr.DataTree:
    """A fit's block statistics: 8 nodes x 4 GPUs x 6 steps; node effects in ``PATTERN``
    (2 % sd), node 5 slowed by ``outlier`` per class, step effects and launch noise."""
    rng = np.random.default_rng(seed)
    nodes, gpus, steps = 8, 4, 6
    node = np.repeat(np.arange(nodes), gpus * steps)
    step = np.tile(np.arange(steps), nodes * gpus)
    node_effect = np.outer(rng.normal(0, 0.02, nodes), PATTERN)
    node_effect[5] += outlier
    n = np.full((node.size, len(CLASSES)), 200.0)
    mean = (node_effect[node] + rng.normal(0, 0.03, len(CLASSES))[None, :] * step[:, None]
            + rng.normal(0, 0.001, n.shape))
    return xr.DataTree.from_dict({
        "posterior": xr.Dataset(
            {"node_scale": (("chain", "draw", "kernel_class"),
                            np.tile(0.02 * PATTERN, (1, 2, 1)))},
            coords={"kernel_class": CLASSES, "node": [f"n{i}" for i in range(nodes)]}),
        "constant_data": xr.Dataset(
            {"block_dev_log": (("block", "kernel_class"), n * mean),
             "block_n": (("block", "kernel_class"), n),
             "step_of_gpustep": ("gpustep", step), "node_of_gpustep": ("gpustep", node)},
            coords={"kernel_class": CLASSES}),
    })


def test_a_node_slow_on_every_class_alike_is_named_and_one_in_the_pattern_is_not():
    uniform = _fit(np.where(PATTERN > 0, 0.1, 0.0))
    effects = unit_class_effects(uniform)
    # the loaded classes only, centred on the median node; the slow node ~10 % on each
    assert list(effects.columns) == CLASSES[:4]
    # (plus its own in-pattern effect, about 2 %, and the median node's)
    np.testing.assert_allclose(effects.loc["n5"], 0.1, atol=0.05)
    notes = off_pattern_units(uniform)
    assert len(notes) == 1 and notes[0].startswith("node n5 is slow across kernel classes")
    assert "gemm +" in notes[0] and "not the other nodes' pattern" in notes[0]
    assert off_pattern_units(_fit(0.1 * PATTERN)) == []   # throttled: the fleet's pattern
    assert off_pattern_units(_fit(np.zeros(len(CLASSES)))) == []
