"""A stage group waits at each of its collectives for its slowest member's compute since the
previous one (``bayesprism.forecast.groupwait``): checked against brute-force simulation of
the segments and, through ``compose``, against the hand-computed cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bayesprism.forecast.groupwait import expected_max_normal, group_pace
from bayesprism.plan import ParallelPlan
from tests.posterior_builders import kernel_posterior, quiet_compose


def test_the_expected_maximum_matches_brute_force_for_unequal_members():
    rng = np.random.default_rng(0)
    means = rng.normal(0.0, 1.0, size=(200, 8))
    brute = (means[:, None, :] + rng.standard_normal((200, 20_000, 8))).max(axis=-1).mean(axis=1)
    np.testing.assert_allclose(expected_max_normal(means), brute, atol=0.03)
    # eight equal members: E[max] = 1.4236 (tables of normal order statistics)
    assert float(expected_max_normal(np.zeros(8))) == pytest.approx(1.4236, abs=0.01)


@pytest.mark.parametrize("spread", [0.0, 0.005, 0.05])
def test_the_group_pace_is_the_sum_of_the_segments_maxima(spread):
    """Members 0.5 % / 5 % apart, 1 % noise per segment, 400 segments, 70 % of the work in
    them: the simulated step's mean over 2,000 steps against the pace."""
    rng = np.random.default_rng(1)
    members = 1.0 + spread * rng.standard_normal(8)
    kappa, share, segments = 0.01, 0.7, 400
    noise = kappa * rng.standard_normal((2_000, segments, 8))
    waited = (members + noise).max(axis=-1).mean(axis=1)  # per unit of segment work
    simulated = share * waited + (1.0 - share) * members.max()
    pace = group_pace(members, np.array(kappa), share)
    assert float(pace) == pytest.approx(simulated.mean(), abs=1.5e-4)
    if spread == 0.0:
        assert float(pace) - 1.0 == pytest.approx(share * kappa * 1.4236, rel=0.01)


def test_a_single_member_or_no_noise_waits_for_the_slowest_only():
    members = np.array([[1.0, 1.1], [1.2, 0.9]])
    np.testing.assert_array_equal(group_pace(members, None, 1.0), [1.1, 1.2])
    np.testing.assert_array_equal(group_pace(members, np.zeros(2), 1.0), [1.1, 1.2])
    np.testing.assert_array_equal(group_pace(members[:, :1], np.array(0.01), 1.0), [1.0, 1.2])


def _tp_pair(segment_us: float | None, share: float = 1.0):
    """Two TP ranks of one GEMM (400 launches of 100 µs a step, launch noise 5 %): a traced
    TP 2 job whose compute lies in segments of ``segment_us`` between TP collectives."""
    kernels = {"gemm0": {"class": "gemm", "launches": 400.0, "log_median": math.log(100.0)}}
    post = kernel_posterior(kernels, traced_plan={"tp": 2}, traced_ranks=2, draws=400,
                            scales={"resid": {"gemm": 0.05}})
    if segment_us is not None:
        inventory = post["inventory"].to_dataset()
        post["inventory"] = inventory.assign(sync_segment_us=((), segment_us),
                                             sync_segment_share=((), share))
    return post


def test_a_tensor_parallel_pair_pays_the_segments_maxima():
    """Segments of 4 launches (400 µs) of 100 µs with a lognormal launch noise of 5 %: a
    segment's relative sd is ``kappa = s' / sqrt(4)`` (``s'`` the sd of a launch's factor over
    its mean). Two equal members wait ``kappa / sqrt(pi)`` of each segment, so a step of
    ``W = 40 ms`` of work takes ``W (1 + kappa / sqrt(pi))``: 568 µs more. Without the
    segments the pair waits for the slower of its two step factors only, whose sd is
    ``s' / sqrt(400)``: ``W (1 + s' / (20 sqrt(pi)))``, 57 µs more (the members' step factors
    are part of their segments' noise, so they do not add)."""
    plan = ParallelPlan(name="tp2", tp=2, dp=1, pp=1, microbatches=1, gpus_per_node=8)

    def mean_step_us(post):
        draws = quiet_compose(post, plan, replicates=64, rng=np.random.default_rng(3))
        return float(draws.step_time_s.mean()) * 1e6

    s2 = 0.05**2
    factor_mean = math.exp(s2 / 2)
    factor_sd = math.sqrt(math.expm1(s2) * math.exp(s2)) / factor_mean
    work = 400 * 100.0 * factor_mean
    kappa = factor_sd / math.sqrt(4)
    waited = work * (1.0 + kappa / math.sqrt(math.pi))
    slower = work * (1.0 + factor_sd / math.sqrt(400) / math.sqrt(math.pi))
    assert mean_step_us(_tp_pair(None)) == pytest.approx(slower, abs=5.0)
    assert mean_step_us(_tp_pair(400.0)) == pytest.approx(waited, abs=5.0)
    # half the work between the collectives: half the segments' waiting
    assert mean_step_us(_tp_pair(400.0, share=0.5)) == pytest.approx((waited + slower) / 2,
                                                                     abs=5.0)
