"""A node or GPU slow across kernel classes in a pattern of its own is named
(checks.class_pattern)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from bayesprism.checks.class_pattern import off_pattern_units, unit_class_effects

CLASSES = ["gemm", "attention", "elementwise", "norm", "allgather"]
PATTERN = np.array([1.0, 1.0, 0.4, 0.4, 0.0])  # compute-bound classes slow 2.5x more
UNIFORM = np.where(PATTERN > 0, 0.1, 0.0)      # 10 % on every loaded class alike
NODES, GPUS, STEPS = 8, 4, 6


def _fit(node_outlier=0.0, gpu_outlier=0.0, seed: int = 0) -> xr.DataTree:
    """A fit's block statistics: 8 nodes x 4 GPUs x 6 steps; node and GPU effects in
    ``PATTERN`` (2 % and 1 % sd), node 5 slowed by ``node_outlier`` per class, GPU 2 of node 1
    by ``gpu_outlier``, step effects and launch noise."""
    rng = np.random.default_rng(seed)
    gpu = np.repeat(np.arange(NODES * GPUS), STEPS)
    node, step = gpu // GPUS, np.tile(np.arange(STEPS), NODES * GPUS)
    node_effect = np.outer(rng.normal(0, 0.02, NODES), PATTERN)
    node_effect[5] += node_outlier
    gpu_effect = np.outer(rng.normal(0, 0.01, NODES * GPUS), PATTERN)
    gpu_effect[GPUS + 2] += gpu_outlier
    n = np.full((gpu.size, len(CLASSES)), 200.0)
    mean = (node_effect[node] + gpu_effect[gpu] + rng.normal(0, 0.03, len(CLASSES)) * step[:, None]
            + rng.normal(0, 0.001, n.shape))
    scales = ("chain", "draw", "kernel_class"), np.tile(0.02 * PATTERN, (1, 2, 1))
    return xr.DataTree.from_dict({
        "posterior": xr.Dataset(
            {"node_scale": scales, "gpu_scale": scales},
            coords={"kernel_class": CLASSES, "node": [f"n{i}" for i in range(NODES)],
                    "gpu_unit": [f"n{i // GPUS}/{i % GPUS}" for i in range(NODES * GPUS)]}),
        "constant_data": xr.Dataset(
            {"block_dev_log": (("block", "kernel_class"), n * mean),
             "block_n": (("block", "kernel_class"), n), "step_of_gpustep": ("gpustep", step),
             "gpu_of_gpustep": ("gpustep", gpu), "node_of_gpustep": ("gpustep", node)},
            coords={"kernel_class": CLASSES}),
    })


def test_a_node_slow_on_every_class_alike_is_named_and_one_in_the_pattern_is_not():
    uniform = _fit(node_outlier=UNIFORM)
    effects = unit_class_effects(uniform)
    # the loaded classes only, centred on the median node; the slow node ~10 % on each
    # (plus its own in-pattern effect, about 2 %, and the median node's)
    assert list(effects.columns) == CLASSES[:4]
    np.testing.assert_allclose(effects.loc["n5"], 0.1, atol=0.05)
    notes = off_pattern_units(uniform)
    assert len(notes) == 1 and notes[0].startswith("node n5 is slow across kernel classes")
    assert "gemm +" in notes[0] and "not the other nodes' pattern" in notes[0]
    assert off_pattern_units(uniform, "gpu") == []
    assert off_pattern_units(_fit(node_outlier=0.1 * PATTERN)) == []  # throttled: the pattern
    assert off_pattern_units(_fit()) == []


def test_a_gpu_slow_on_every_class_alike_is_named_as_the_gpu_not_its_node():
    """Read within its node (less the node's median GPU), and its node read as its median
    GPU: the GPU is named, its node is not."""
    odd = _fit(gpu_outlier=UNIFORM)
    notes = off_pattern_units(odd, "gpu")
    assert len(notes) == 1 and notes[0].startswith("gpu n1/2 is slow across kernel classes")
    assert off_pattern_units(odd, "node") == []
    assert off_pattern_units(_fit(gpu_outlier=0.1 * PATTERN), "gpu") == []
    assert unit_class_effects(odd, "cabinet") is None  # nodes and GPUs only
