"""GPU×step episodes (``gpustep_population = "degraded"`` or ``"lasting"``): the closed-form
marginal of the cell likelihood, episodes that last (a Markov chain over a GPU's steps), and the
episodes' share in composed transients."""

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


def test_episode_chain_sums_every_state_sequence():
    """The chain's likelihood is the sum over all 2^n episode-state sequences of a GPU's
    steps: steps 3, 4, 6 of run 0 (a one-step gap: the state is kept with λ²) and step 0 of
    run 1 (drawn afresh), against a brute-force sum with the transition written out."""
    from itertools import product

    from bayesprism.model.episodes import episode_chain_loglik, episode_sequences, step_lags

    rng = np.random.default_rng(0)
    gs_gpu, gs_step = np.array([0, 0, 0, 0, 1]), np.array([0, 1, 2, 3, 1])
    step_run, step_local = np.array([0, 0, 0, 1]), np.array([3, 4, 6, 0])
    index, lag = episode_sequences(gs_gpu, gs_step, step_run, step_local)
    assert lag.tolist() == [[0, 1, 2, 0], [0, 0, 0, 0]]
    core, slow = rng.normal(0, 2, 5), rng.normal(0, 2, 5)
    pad = np.zeros(1)  # GPU 1's sequence is padded with "no observation"
    w, lam = 0.2, 0.7
    share = np.array([1 - w, w])

    def transition(k):  # P(state j | state i) over a gap of k steps (0: a new run)
        keep = lam**k if k else 0.0
        return keep * np.eye(2) + (1 - keep) * share[None, :]

    emission = np.stack([core, slow], axis=1)
    total = 0.0
    for gpu in (0, 1):
        members = [i for i in range(5) if gs_gpu[i] == gpu]
        gaps = {0: [0, 1, 2, 0], 1: [0]}[gpu]
        likelihood = 0.0
        for states in product((0, 1), repeat=len(members)):
            p = share[states[0]] * np.exp(emission[members[0], states[0]])
            for k in range(1, len(members)):
                p *= transition(gaps[k])[states[k - 1], states[k]]
                p *= np.exp(emission[members[k], states[k]])
            likelihood += p
        total += np.log(likelihood)
    chain = episode_chain_loglik(np.r_[core, pad][index], np.r_[slow, pad][index], w, lam, lag)
    assert chain == pytest.approx(total, rel=1e-12)
    # the same GPU-steps on the (GPU × step) grid, GPU 1's other steps without observations
    grid_core, grid_slow = np.zeros((2, 4)), np.zeros((2, 4))
    grid_core[gs_gpu, gs_step], grid_slow[gs_gpu, gs_step] = core, slow
    lags = step_lags(step_run, step_local)
    assert episode_chain_loglik(grid_core, grid_slow, w, lam, lags) == pytest.approx(total,
                                                                                  rel=1e-12)


def test_lasting_episodes_are_learned():
    """A stretch of slow steps on one GPU is read as a lasting episode, and isolated slow
    steps are not: the log likelihood ratio of persistence 0.9 against 0 (the same share)
    is positive for the stretch and negative for the isolated steps."""
    from bayesprism.model.episodes import episode_chain_loglik

    gpus, steps = 4, 7
    lag = np.r_[0, np.ones(steps - 1, dtype=int)]
    core, slow = np.zeros((gpus, steps)), np.full((gpus, steps), -6.0)
    stretch, isolated = core.copy(), core.copy()
    stretch[0, 2:6] = -12.0  # GPU 0 slow at steps 2-5: the core cannot explain it
    isolated[[0, 1, 2, 3], [2, 5, 0, 6]] = -12.0  # one slow step on each GPU
    for data, sign in ((stretch, 1), (isolated, -1)):
        ratio = (episode_chain_loglik(data, slow, 0.1, 0.9, lag)
                 - episode_chain_loglik(data, slow, 0.1, 0.0, lag))
        assert sign * ratio > 1.0


PERSISTENCE, SHARE, EPISODE_SHIFT = 0.85, 0.08, 0.08


def episode_table(nodes: int = 16, gpus: int = 2, steps: int = 32, seed: int = 5):
    """Two GEMM shapes, 3 launches each per GPU-step; GPU-steps throttled by 8 % in episodes
    that last (a Markov chain per GPU: state kept with PERSISTENCE, else drawn with SHARE).
    Returns the table and the realised episode states (GPU, step)."""
    import pandas as pd

    from bayesprism.schema import validate_table

    rng = np.random.default_rng(seed)
    n_gpu = nodes * gpus
    state = np.zeros((n_gpu, steps), dtype=bool)
    state[:, 0] = rng.random(n_gpu) < SHARE
    for s in range(1, steps):
        fresh = rng.random(n_gpu) < SHARE
        state[:, s] = np.where(rng.random(n_gpu) < PERSISTENCE, state[:, s - 1], fresh)
    gpustep = 0.002 * rng.standard_normal((n_gpu, steps)) + EPISODE_SHIFT * state
    g, s, k, _ = (a.ravel() for a in np.meshgrid(np.arange(n_gpu), np.arange(steps),
                                                  np.arange(2), np.arange(3), indexing="ij"))
    log_us = (np.log([300.0, 800.0])[k] + 0.004 * rng.standard_normal(n_gpu)[g]
              + 0.003 * rng.standard_normal(steps)[s] + gpustep[g, s]
              + 0.01 * rng.standard_normal(g.size))
    table = pd.DataFrame({
        "run": pd.Categorical(np.full(g.size, "r0")), "step": s, "rank": g,
        "node": pd.Categorical([f"n{n:02d}" for n in g // gpus]), "gpu": g % gpus,
        "kernel": pd.Categorical(np.array(["gemm_a", "gemm_b"])[k]),
        "kernel_class": pd.Categorical(np.full(g.size, "gemm")),
        "duration_us": np.exp(log_us),
    })
    table.attrs = {"schema_version": 1, "skipped": {}, "notes": [], "runs": {}}
    return validate_table(table), state


@pytest.mark.filterwarnings("ignore::bayesprism.errors.ConvergenceWarning")
def test_episode_persistence_and_share_are_recovered():
    """Known truth: episodes kept from step to step with probability 0.85 (about 7 steps
    each). The fitted persistence covers it and is far from independent steps; the share
    covers the generating one (this draw realised 15 % of GPU-steps in episodes, some as a GPU
    slow for most of its steps, which one run cannot tell from the GPU's own speed)."""
    from bayesprism.inference import fit

    table, state = episode_table()
    spec = ModelSpec(levels=("node", "gpu", "step", "gpustep"), gpustep_population="lasting")
    post = fit(table, spec, draws=300, tune=300, chains=2, random_seed=1,
               progress=False)["posterior"]
    lo, hi = np.quantile(post["gpustep_episode_persistence"], [0.05, 0.95])
    assert lo < PERSISTENCE < hi and lo > 0.5, (lo, hi)
    lo, hi = np.quantile(post["gpustep_slow_weight"], [0.05, 0.95])
    assert lo < SHARE < hi, (lo, hi, state.mean())
