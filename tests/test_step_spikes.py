"""Slow-step spikes whose rate grows with the node count: recovery of the rate and its growth on
a synthetic ladder with known truth, and forecasts that carry the growth to larger scales."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit

from bayesprism.schema import empty_attrs, validate_table

#: spike log-odds (of twice the rate) = SPIKE_A + SPIKE_B * log(nodes): 1.6 % of steps at 2
#: nodes, 11 % at 32
SPIKE_A, SPIKE_B = -4.0, 0.8
SLOT, SHIFT, SPREAD, NOISE, RUN_SD = 0.05, 0.2, 0.04, 0.01, 0.003
# (world size, dp, microbatches); tp = pp = cp = 1, 8 GPUs per node: 2-32 nodes
LADDER = [(16, 16, 4), (32, 32, 4), (64, 64, 2), (128, 128, 2), (256, 256, 2)]


def spike_rate(nodes) -> np.ndarray:
    """The truth's share of slow steps at ``nodes`` nodes."""
    return 0.5 * expit(SPIKE_A + SPIKE_B * np.log(nodes))


def spiky_ladder(runs_per_scale: int, steps: int, seed: int) -> pd.DataFrame:
    """Step rows: a tight lognormal core per run plus spikes at :func:`spike_rate`."""
    rng = np.random.default_rng(seed)
    rows, runs = [], {}
    for world, dp, m in LADDER:
        rate = spike_rate(world / 8)
        for r in range(runs_per_scale):
            run = f"n{world}/run{r}"
            level = np.log(SLOT * m * (1 + 0.02 * np.log2(dp))) + RUN_SD * rng.normal()
            log_t = level + NOISE * rng.standard_normal(steps)
            slow = rng.random(steps) < rate
            log_t += slow * (SHIFT + SPREAD * rng.standard_normal(steps))
            rows += [(run, s, float(np.exp(v) * 1e6)) for s, v in enumerate(log_t)]
            runs[run] = {"platform": "synthetic", "world_size": world, "gpus_per_node": 8,
                         "global_batch": dp * m, "plan": {"dp": dp, "tp": 1, "pp": 1, "cp": 1,
                                                          "microbatches": m}}
    df = pd.DataFrame(rows, columns=["run", "step", "duration_us"])
    df = df.assign(rank=-1, node="*", gpu=-1, kernel="train_step", kernel_class="step")
    df.attrs = {**empty_attrs(), "runs": runs}
    return validate_table(df)


@pytest.fixture(scope="module")
def spiky_fit():
    from bayesprism import fit
    from bayesprism.spec import ModelSpec

    base = ModelSpec.load("step")
    # the builtin slope prior Normal(0, 1): the growth must come from the data
    spec = dataclasses.replace(base, step={**base.step, "layout_prior": "builtin"})
    table = spiky_ladder(3, 150, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return table, fit(table, spec, draws=300, tune=300, chains=2, sampler="nutpie",
                          random_seed=2, progress=False)


def test_spike_rate_and_its_growth_with_scale_are_recovered(spiky_fit):
    _, tree = spiky_fit
    post = tree["posterior"]
    reference_nodes = float(post.attrs["reference_nodes"])
    slope = post["spike_slope"].to_numpy().ravel()
    lo, hi = np.quantile(slope, [0.01, 0.99])
    assert lo < SPIKE_B < hi, (lo, hi)
    assert np.quantile(slope, 0.05) > 0.2  # the rate grows with scale, clearly
    logit = post["spike_logit"].to_numpy().ravel()
    truth = SPIKE_A + SPIKE_B * np.log(reference_nodes)
    lo, hi = np.quantile(logit, [0.01, 0.99])
    assert lo < truth < hi, (lo, hi, truth)
    # the per-run weights follow the truth at every scale (within a factor 1.6)
    weight = post["slow_weight"].median(("chain", "draw")).to_series()
    for world, _, _ in LADDER:
        runs = [r for r in weight.index if r.startswith(f"n{world}/")]
        assert weight[runs].mean() == pytest.approx(spike_rate(world / 8), rel=0.6)


@dataclass
class _Plan:
    dp: int
    microbatches: int
    pp: int = 1
    tp: int = 1
    cp: int = 1
    virtual_stages: int = 1


def test_forecast_spike_share_grows_beyond_the_ladder(spiky_fit):
    from bayesprism.forecast.stepscale import compose_steps, spike_weight

    _, tree = spiky_fit
    post = tree["posterior"].to_dataset()
    attrs = dict(tree["posterior"].attrs)
    at_32, at_256 = (np.median(spike_weight(post, attrs, n)) for n in (32.0, 256.0))
    assert at_256 > 1.5 * at_32
    assert at_256 == pytest.approx(spike_rate(256), rel=0.6)
    # the share of steps > 10 % above the draw's median follows (spike shift 0.2)
    plan = _Plan(dp=2048, microbatches=2)  # 2048 GPUs, 256 nodes: 8x the largest fitted
    step = compose_steps(tree, plan, replicates=200, rng=np.random.default_rng(0)).step_time_s
    slow = (step > 1.1 * np.median(step, axis=1, keepdims=True)).mean()
    assert slow == pytest.approx(spike_rate(256), rel=0.4)
