"""Data estimates that centre and scale the kernel model's data-dominated coordinates."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import helmert
from test_kernel_model import simulate_trace

from bayesprism.model.effects import grouped_helmert_inverse
from bayesprism.model.kernel import prepare_kernel
from bayesprism.model.start import MIN_SE, kernel_baseline_se, unit_effect_estimates
from bayesprism.spec import ModelSpec


def test_noise_free_effects_are_recovered_exactly():
    """Additive node/GPU/step effects without noise: the sweep returns them (centred as the
    likelihood sees them: a node's effect includes its GPUs' mean), and the se floor."""
    table, truth = simulate_trace(nodes=3, gpus=4, steps=5, launches=2, gs_sd=0.0, resid=0.0)
    spec = ModelSpec(levels=("node", "gpu", "step"))
    prepared = prepare_kernel([table], spec)
    estimates = unit_effect_estimates(prepared.data, prepared.attrs["levels"])
    node_total = 0.10 * truth["u"] + 0.05 * truth["v"].mean(axis=1)
    assert np.allclose(estimates["node"][0], node_total - node_total.mean(), atol=1e-12)
    gpu = 0.05 * (truth["v"] - truth["v"].mean(axis=1, keepdims=True))
    assert np.allclose(estimates["gpu"][0], gpu.ravel(), atol=1e-12)
    one = table[(table["node"] == "n00") & (table["gpu"] == 0) & (table["kernel"] == "add")]
    step = np.log(one.groupby("step")["duration_us"].first().to_numpy())
    assert np.allclose(estimates["step"][0], step - step.mean(), atol=1e-12)
    for _, se in estimates.values():
        assert se == MIN_SE
    # kernel contrasts are noise-free; the all-kernels mean moves with the blocks' spread
    se = kernel_baseline_se(prepared.data)
    assert (se[1:] == MIN_SE).all() and se[0] > 10 * MIN_SE


def test_standard_errors_match_the_noise_of_the_unit_means():
    """GPU×step noise of sd 0.02 over 6 steps: a GPU's mean is known to about 0.02/√6."""
    table, _ = simulate_trace(nodes=4, gpus=4, steps=6, launches=5, gs_sd=0.02, resid=0.001,
                              seed=3)
    spec = ModelSpec(levels=("node", "gpu", "step"))
    prepared = prepare_kernel([table], spec)
    estimates = unit_effect_estimates(prepared.data, prepared.attrs["levels"])
    # residual degrees of freedom shrink the within-unit spread a little: within a factor 2
    assert estimates["gpu"][1] == pytest.approx(0.02 / np.sqrt(6), rel=0.5)
    assert estimates["node"][1] == pytest.approx(0.02 / np.sqrt(24), rel=0.5)
    assert estimates["step"][1] == pytest.approx(0.02 / np.sqrt(16), rel=0.5)


def test_grouped_helmert_inverse_inverts_the_map():
    group = np.array([0, 0, 1, 1, 1, 0, 2])
    effects = np.arange(7.0)
    free = grouped_helmert_inverse(effects, group)
    rebuilt = np.zeros(7)
    for g in range(3):
        where = np.flatnonzero(group == g)
        rebuilt[where] = free[where] @ helmert(where.size, full=True)
    assert np.allclose(rebuilt, effects)
