"""GPU×step episodes (``gpustep_population = "degraded"``): the closed-form marginal of the
cell likelihood, and the episodes' share in composed transients."""

from __future__ import annotations

import numpy as np
import pytest
from posterior_builders import gemm_only
from scipy import integrate, stats

from bayesprism.spec import ModelSpec, SpecError


def _marginal(a: float, b: float, weight: float, shift: float, sd: float) -> float:
    """The model's log marginal of one GPU-step (bayesprism.model.kernel)."""
    from bayesprism.model.kernel import episode_log_marginal

    core = -0.5 * np.log1p(b) + a**2 / (2.0 * (1.0 + b))
    return float(episode_log_marginal(core, a, b, weight, shift, sd))


@pytest.mark.parametrize(("a", "b", "shift"), [(0.0, 0.0, 6.0), (3.0, 0.5, 6.0), (-2.0, 4.0, 6.0),
                                               (40.0, 9.0, 6.0), (-30.0, 9.0, 1.0),
                                               (-3.0, 0.5, 1.0)])
def test_episode_marginal_matches_quadrature(a, b, shift):
    """Shift 1 core sd with sd 1.5: a quarter of the untruncated episode law lies below zero;
    a = -30: a GPU-step whose launches put it far below its GPU's level, which an episode
    cannot explain."""
    weight, sd = 0.05, 1.5

    def integrand(z):
        # an episode is N(shift, sd²) truncated to z > 0: it only slows its GPU-step
        episode = stats.truncnorm.pdf(z, -shift / sd, np.inf, loc=shift, scale=sd)
        density = (1 - weight) * stats.norm.pdf(z) + weight * episode
        return density * np.exp(a * z - 0.5 * b * z**2)

    value, _ = integrate.quad(integrand, -40, 60, points=[0.0, shift], limit=200)
    assert _marginal(a, b, weight, shift, sd) == pytest.approx(np.log(value), rel=1e-6, abs=1e-9)


def test_episodes_need_the_cell_likelihood():
    with pytest.raises(SpecError, match="gpustep_population"):
        ModelSpec(gpustep_population="degraded", likelihood="mixture")


def test_composed_transients_hold_the_episodes():
    from bayesprism.forecast.composition import _transient
    from bayesprism.forecast.workload import build_plan_model
    from bayesprism.plan import ParallelPlan

    post = gemm_only(scales={"gpustep": {"gemm": 0.01}}, population_params={
        "gpustep_slow_weight": 0.03, "gpustep_slow_shift": 10.0, "gpustep_slow_sd": 1.0})
    model = build_plan_model(post, ParallelPlan(dp=8, gpus_per_node=8))
    t = _transient(model, np.random.default_rng(0), slice(None), (model.draws, 20_000))
    slowed = (t > 0.05).mean()  # an episode shifts by 10 core sds = 10 %
    assert slowed == pytest.approx(0.03, abs=0.005)
    plain = build_plan_model(gemm_only(scales={"gpustep": {"gemm": 0.01}}),
                             ParallelPlan(dp=8, gpus_per_node=8))
    assert (_transient(plain, np.random.default_rng(0), slice(None),
                       (plain.draws, 20_000)) > 0.05).mean() < 1e-3


EPISODES = {"gpustep_slow_weight": 0.002, "gpustep_slow_shift": 10.0, "gpustep_slow_sd": 1.0}


@pytest.mark.parametrize(("shift", "sd"), [(10.0, 1.0), (2.0, 4.0)])
def test_fast_path_maximum_holds_the_episodes_of_every_gpu_step(shift, sd):
    """The slowest node of N new nodes in a step, by order statistics, has the law of the
    maximum over all N*8 GPUs of the episode mixture (brute force over the same mixture;
    shift 2, sd 4: 31 % of the untruncated episode law lies below zero, where it may not)."""
    from bayesprism.forecast.composition import rank_law
    from bayesprism.forecast.extremes import top_node_log_multipliers
    from bayesprism.forecast.workload import build_plan_model
    from bayesprism.plan import ParallelPlan

    n_nodes, scale, w = 256, 0.01, 0.002
    post = gemm_only(draws=200, scales={"gpustep": {"gemm": scale}}, population_params={
        "gpustep_slow_weight": w, "gpustep_slow_shift": shift, "gpustep_slow_sd": sd})
    model = build_plan_model(post, ParallelPlan(dp=n_nodes * 8))
    top = top_node_log_multipliers(rank_law(model), post, n_nodes, 10, 1,
                                   np.random.default_rng(2))[..., 0].ravel()
    gpus = n_nodes * 8
    episode = stats.truncnorm(-shift / sd, np.inf, loc=shift, scale=sd)

    def cdf(x):
        z = x / scale
        return ((1 - w) * stats.norm.cdf(z) + w * episode.cdf(z)) ** gpus

    assert stats.kstest(top, cdf).pvalue > 0.01
    # with ~4 episodes among 2,048 GPU-steps the slowest GPU is nearly always in one
    assert np.median(top) > 0.8 * episode.median() * scale


@pytest.mark.parametrize("episodes", [EPISODES, {
    "gpustep_slow_weight": 0.002, "gpustep_slow_shift": 2.0, "gpustep_slow_sd": 4.0}])
def test_fast_path_agrees_with_exact_under_episodes(episodes):
    """The exact path draws episodes truncated to slow, the fast one weights the untruncated
    law's upper tail (population.episode_tail_weight): the same step-time law."""
    from posterior_builders import quiet_compose

    from bayesprism.plan import ParallelPlan

    post = gemm_only(draws=200, scales={"gpustep": {"gemm": 0.01}, "node": {"gemm": 0.01}},
                     population_params=episodes)
    plan = ParallelPlan(dp=64, tp=8, pp=4, microbatches=8)
    exact = quiet_compose(post, plan, replicates=8, rng=np.random.default_rng(3), exact=True)
    fast = quiet_compose(post, plan, replicates=8, rng=np.random.default_rng(3), exact=False)
    levels = [0.05, 0.5, 0.95]
    np.testing.assert_allclose(np.quantile(fast.step_time_s, levels),
                               np.quantile(exact.step_time_s, levels), rtol=0.01)
