"""Pipeline schedules: hand-computable makespans of the max-plus recursion."""

from __future__ import annotations

import numpy as np
import pytest

from bayesprism.forecast.schedules import build_schedule, pipeline_finish

F, B = 1.0, 2.0


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(1, 4), (2, 2), (4, 8), (4, 3), (8, 16)])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_slots(schedule, p, m):
    sched = build_schedule(schedule, p, m)
    finish = pipeline_finish(sched, np.full(p, F), np.full(p, B))
    assert finish.max() == pytest.approx((m + p - 1) * (F + B))
    # the first stage finishes last; every device is busy m*(F+B)
    assert finish.argmax() == 0


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 3)])
def test_interleaving_divides_the_bubble_by_v(p, m, v):
    sched = build_schedule("interleaved-1f1b", p, m, v)
    finish = pipeline_finish(sched, np.full(p, F / v), np.full(p, B / v))
    assert finish.max() - m * (F + B) == pytest.approx((p - 1) * (F + B) / v)


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 8), (8, 16), (3, 7)])
def test_zero_bubble_bubble_is_p_minus_1_times_f_plus_b_minus_w(p, m):
    f = b = w = 1.0
    sched = build_schedule("zero-bubble", p, m)
    finish = pipeline_finish(sched, np.full(p, f), np.full(p, b), np.full(p, w))
    assert finish.max() == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w))
    one_f_one_b = pipeline_finish(build_schedule("1f1b", p, m), np.full(p, f), np.full(p, b + w))
    assert one_f_one_b.max() - finish.max() == pytest.approx(2 * (p - 1) * w)


def test_gpipe_with_point_to_point_transfers():
    p, m, c = 4, 6, 0.25
    sched = build_schedule("gpipe", p, m)
    finish = pipeline_finish(sched, np.full(p, F), np.full(p, B), transfer=c)
    # fill (p-1)(F+c), m forwards and m backwards on the last stage, drain (p-1)(B+c)
    assert finish.max() == pytest.approx((m + p - 1) * (F + B) + 2 * (p - 1) * c)


def test_one_slow_stage_sets_the_steady_state_of_1f1b():
    p, m = 4, 16
    forward = np.full(p, F)
    backward = np.full(p, B)
    forward[2], backward[2] = 2 * F, 2 * B  # stage 2 twice as slow
    finish = pipeline_finish(build_schedule("1f1b", p, m), forward, backward)
    # the slow stage's work m*(2F+2B), the fill before it (forwards of stages 0-1: 2F), the
    # drain after it (backwards of stages 1-0: 2B) and one idle wait for the first backward
    # of stage 3 (its F+B = 3 while stage 2 runs one forward of 2F = 2): 96 + 2 + 4 + 1
    assert finish.max() == pytest.approx(m * 2 * (F + B) + 2 * F + 2 * B + (F + B - 2 * F))


def test_vectorised_over_a_batch_of_draws():
    p, m = 4, 8
    rng = np.random.default_rng(0)
    forward = rng.uniform(0.5, 1.5, size=(5, 3, p))
    backward = 2 * forward
    sched = build_schedule("1f1b", p, m)
    batch = pipeline_finish(sched, forward, backward)
    for i in range(5):
        for j in range(3):
            one = pipeline_finish(sched, forward[i, j], backward[i, j])
            np.testing.assert_allclose(batch[i, j], one)
    # equal-stage rows still obey the formula
    equal = pipeline_finish(sched, np.full((2, p), 0.5), np.full((2, p), 1.0))
    np.testing.assert_allclose(equal.max(axis=-1), (m + p - 1) * 1.5)


def test_every_device_runs_each_micro_batch_once():
    sched = build_schedule("interleaved-1f1b", 4, 8, 2)
    for d, ops in enumerate(sched.device_ops):
        forwards = sorted((k, j) for kind, k, j in ops if kind == "F")
        assert forwards == sorted((c * 4 + d, j) for c in range(2) for j in range(8))
    zb = build_schedule("zero-bubble", 4, 8)
    for ops in zb.device_ops:
        assert sorted(kind for kind, _, _ in ops) == ["B"] * 8 + ["F"] * 8 + ["W"] * 8
