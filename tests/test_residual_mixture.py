"""Two-component (slow-launch) residual: its moments in the workload, its draws in predictions.

The ``mixture`` likelihood gives one launch's log residual
eps ~ (1 - w)·N(0, σ) + w·N(δ, s) per kernel class (``resid_scale`` = σ,
``resid_slow_weight`` = w, ``resid_slow_shift`` = δ, ``resid_slow_sd`` = s). Its consumers use
the closed-form moments of exp(eps) (workload, composition) or sample it (validate).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from posterior_builders import gemm_only

from bayesprism.errors import InputError
from bayesprism.forecast.composition import ideal_step_time
from bayesprism.forecast.workload import build_plan_model, residual_moments
from bayesprism.plan import ParallelPlan, PlanWarning

SIGMA, WEIGHT, SHIFT, SLOW_SD = 0.05, 0.1, 0.6, 0.3


def monte_carlo_factor(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    slow = rng.random(n) < WEIGHT
    eps = np.where(slow, SHIFT + SLOW_SD * rng.standard_normal(n), SIGMA * rng.standard_normal(n))
    return np.exp(eps)


def with_mixture(tree, weight=WEIGHT, shift=SHIFT, slow_sd=SLOW_SD, names=None):
    """``tree`` (hand-built, resid_scale set) with a mixture residual on every class."""
    post = tree["posterior"].to_dataset()
    shape = post["resid_scale"].shape
    values = {"resid_slow_weight": weight, "resid_slow_shift": shift, "resid_slow_sd": slow_sd}
    for name in names or values:
        post[name] = (post["resid_scale"].dims, np.full(shape, values[name]))
    tree = tree.copy()
    tree["posterior"] = post
    return tree


def test_residual_moments_equal_monte_carlo_moments_of_the_mixture():
    mean, var = residual_moments(np.array([SIGMA]), (np.array([WEIGHT]), np.array([SHIFT]),
                                                     np.array([SLOW_SD])))
    factor = monte_carlo_factor(2_000_000)
    assert mean[0] == pytest.approx(factor.mean(), rel=2e-3)
    assert var[0] == pytest.approx(factor.var(), rel=2e-2)
    # hand value of the mean: 0.9·e^{0.05²/2} + 0.1·e^{0.6 + 0.3²/2}
    assert mean[0] == pytest.approx(0.9 * np.exp(0.00125) + 0.1 * np.exp(0.645), rel=1e-12)


def test_residual_moments_reduce_to_the_lognormal():
    sd = np.array([0.0, 0.01, 0.3])
    mean, var = residual_moments(sd)
    np.testing.assert_allclose(mean, np.exp(sd**2 / 2))
    np.testing.assert_allclose(var, (np.exp(sd**2) - 1) * np.exp(sd**2))
    zero = np.zeros(3)
    # no slow launches, or slow launches identical to the core: the lognormal again
    for slow in ((zero, zero + 1.0, zero + 0.5), (zero + 0.3, zero, sd)):
        m, v = residual_moments(sd, slow)
        np.testing.assert_allclose(m, mean, rtol=1e-14)
        np.testing.assert_allclose(v, var, rtol=1e-12, atol=1e-300)


def test_plan_model_moment_matches_the_mixture_per_rank_step():
    launches = 10.0
    tree = with_mixture(gemm_only(draws=4, launches=launches, scales={"resid": {"gemm": SIGMA}}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        model = build_plan_model(tree, ParallelPlan(dp=8))
        typical = build_plan_model(tree, ParallelPlan(dp=8), typical=True)
    mean, var = residual_moments(np.array(SIGMA), (WEIGHT, SHIFT, SLOW_SD))
    # one kernel: the rank-step factor is the mean of `launches` iid factors
    s2 = np.log1p(var / launches / mean**2)
    np.testing.assert_allclose(model.resid_sd, np.sqrt(s2))
    np.testing.assert_allclose(model.resid_mu, np.log(mean) - s2 / 2)
    # the variability-free plan has no slow launches either
    np.testing.assert_allclose(typical.resid_mu, 0.0, atol=1e-15)
    np.testing.assert_allclose(typical.resid_sd, 0.0, atol=1e-15)


def test_ideal_step_carries_the_mean_slow_launch_cost():
    tree = gemm_only(draws=4, scales={"resid": {"gemm": SIGMA}})
    plan = ParallelPlan(dp=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        plain = ideal_step_time(tree, plan)
        mixed = ideal_step_time(with_mixture(tree), plan)
    mean = residual_moments(np.array(SIGMA), (WEIGHT, SHIFT, SLOW_SD))[0]
    assert plain == pytest.approx(10 * 100e-6 * np.exp(SIGMA**2 / 2))
    assert mixed == pytest.approx(10 * 100e-6 * mean)


def test_a_partial_mixture_residual_is_refused_naming_the_missing_variables():
    tree = with_mixture(gemm_only(draws=2), names=["resid_slow_weight"])
    with pytest.raises(InputError, match="resid_slow_shift, resid_slow_sd: a mixture residual"):
        build_plan_model(tree, ParallelPlan(dp=8))
