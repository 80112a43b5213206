"""A fleet of near-identical nodes with a few degraded ones: the ``degraded`` node population
(its core recovered, not widened to cover them; the degraded share and shift recovered)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from posterior_builders import unit_grid_table

from bayesprism.forecast.population import draw_effects
from bayesprism.spec import ModelSpec

CORE_SD = 0.01
DEGRADED = {0: 0.15, 1: 0.12, 2: 0.18}  # node -> log slowdown


def fleet_table(nodes: int = 30, gpus: int = 2, steps: int = 4, seed: int = 3) -> pd.DataFrame:
    """One GEMM per GPU-step (3 launches); node effects N(0, CORE_SD) but for DEGRADED."""
    rng = np.random.default_rng(seed)
    node = CORE_SD * rng.standard_normal(nodes)
    for n, slow in DEGRADED.items():
        node[n] = slow
    return unit_grid_table(
        nodes, gpus, steps, 3,
        lambda nn, gg, ss: (np.log(500.0) + node[nn]
                            + 0.003 * rng.standard_normal((nodes, gpus))[nn, gg]
                            + 0.005 * rng.standard_normal(steps)[ss]
                            + 0.01 * rng.standard_normal(nn.size)))


@pytest.fixture(scope="module")
def fleet_fit():
    from bayesprism.inference import fit

    spec = ModelSpec(levels=("node", "gpu", "step"), node_population="degraded",
                     gpu_population="normal")
    return fit(fleet_table(), spec, draws=300, tune=300, chains=2, random_seed=2,
               progress=False)


def test_degraded_nodes_form_the_slow_component_not_a_wide_core(fleet_fit):
    post = fleet_fit.posterior
    assert int(fleet_fit.sample_stats["diverging"].sum()) == 0

    def interval(name):
        return np.quantile(post[name], [0.025, 0.975])

    # a core as wide as the degraded nodes' spread would put the core sd near 0.05
    lo, hi = interval("node_scale_ref")
    assert lo < CORE_SD < hi and hi < 2 * CORE_SD
    lo, hi = interval("node_slow_shift_log")
    assert lo < np.mean(list(DEGRADED.values())) < hi
    lo, hi = interval("node_slow_weight")
    assert lo < len(DEGRADED) / 30 < hi
    # recorded standardised: shift = shift_log / scale, slow_sd = sqrt(1 + (spread_log/scale)²)
    shift = post["node_slow_shift_log"] / post["node_scale_ref"]
    assert np.allclose(post["node_slow_shift"], shift)
    slow_sd = np.sqrt(1 + (post["node_slow_spread_log"] / post["node_scale_ref"]) ** 2)
    assert np.allclose(post["node_slow_sd"], slow_sd)


def test_new_nodes_are_degraded_as_often_as_the_fitted_ones(fleet_fit):
    z = draw_effects(fleet_fit, "node", 2000, np.random.default_rng(0))
    log_effect = z * fleet_fit.posterior["node_scale_ref"].to_numpy().reshape(-1, 1)
    share_slow = np.mean(log_effect > 0.06)  # beyond 6 core sds
    assert share_slow == pytest.approx(len(DEGRADED) / 30, abs=0.05)
