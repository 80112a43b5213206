"""Slow GPU-steps that last over consecutive steps (bayesprism.checks.persistence)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from posterior_builders import truth_posterior
from scipy import stats

from bayesprism.checks.diagnostics import diagnose
from bayesprism.checks.persistence import episode_persistence, slow_stretches

GPUS, STEPS = 16, 12


def _grid(seed: int = 0):
    gpu, step = np.divmod(np.arange(GPUS * STEPS), STEPS)
    deviation = np.random.default_rng(seed).normal(0.0, 0.002, gpu.size)
    gpu_labels = np.array([f"node/{g}" for g in range(GPUS)])
    step_labels = np.array([f"run/{s}" for s in range(100, 100 + STEPS)])
    return deviation, gpu, step, gpu_labels, step_labels


def test_a_stretch_to_the_end_of_the_trace_is_counted_against_independence():
    deviation, gpu, step, gpus, steps = _grid()
    deviation[(gpu == 3) & (step >= 8)] += 0.12      # 4 consecutive slow steps
    deviation[(gpu == 7) & np.isin(step, [2, 8])] += 0.08  # 2 slow steps apart
    found = slow_stretches(deviation, gpu, step, gpus, steps, "gemm")
    assert (found.gpu_steps, found.slow_gpu_steps, found.consecutive_pairs) == (192, 6, 3)
    # 16 GPUs x 11 consecutive pairs, each slow with probability (6 / 192)^2
    assert found.expected_pairs == pytest.approx(176 * (6 / 192) ** 2)
    assert found.p_value == pytest.approx(stats.poisson.sf(2, 176 * (6 / 192) ** 2))
    assert found.p_value < 1e-3 and found.persistent
    assert found.runs[["gpu", "first_step", "last_step", "steps"]].values.tolist() == [
        ["node/3", "run/108", "run/111", 4], ["node/7", "run/102", "run/102", 1],
        ["node/7", "run/108", "run/108", 1]]
    assert found.runs["slowdown"].iloc[0] == pytest.approx(np.expm1(0.12), abs=0.01)
    assert "GPU node/3, steps run/108 to run/111, +12." in found.message()


def test_two_pairs_among_many_slow_steps_are_chance():
    deviation, gpu, step, gpus, steps = _grid()
    deviation[(gpu == 3) & (step >= 9)] += 0.12
    deviation[(gpu == 7) & np.isin(step, [2, 8])] += 0.08
    found = slow_stretches(deviation, gpu, step, gpus, steps)
    assert (found.slow_gpu_steps, found.consecutive_pairs) == (5, 2)
    assert found.p_value == pytest.approx(stats.poisson.sf(1, 176 * (5 / 192) ** 2))
    assert 1e-3 < found.p_value < 0.01 and not found.persistent


def test_isolated_slow_steps_are_not_persistent():
    deviation, gpu, step, gpus, steps = _grid(1)
    for g, s in ((1, 2), (4, 7), (9, 0), (12, 11)):
        deviation[(gpu == g) & (step == s)] += 0.1
    found = slow_stretches(deviation, gpu, step, gpus, steps)
    assert (found.slow_gpu_steps, found.consecutive_pairs, found.persistent) == (4, 0, False)


def test_a_gpu_slow_over_the_whole_trace_is_its_own_pace_not_a_stretch():
    deviation, gpu, step, gpus, steps = _grid(2)
    deviation[gpu == 5] += 0.12
    found = slow_stretches(deviation, gpu, step, gpus, steps)
    assert found.slow_gpu_steps == 0 and not found.persistent
    assert found.message() == "no slow GPU-steps among 192 (all launches)"


def test_steps_of_different_runs_do_not_follow_each_other():
    deviation, gpu, step, gpus, _ = _grid(3)
    steps = np.array([f"first/{s}" for s in range(6)] + [f"second/{s}" for s in range(6, 12)])
    deviation[(gpu == 2) & np.isin(step, [5, 6])] += 0.1  # last of one run, first of the next
    found = slow_stretches(deviation, gpu, step, gpus, steps)
    assert (found.slow_gpu_steps, found.consecutive_pairs) == (2, 0)


def test_diagnose_notes_slow_gpu_steps_that_persist():
    fit = truth_posterior(seed=0)
    quiet = diagnose(fit)
    assert quiet.persistence is not None and not quiet.persistence.persistent
    assert not any("consecutive steps" in n for n in quiet.notes)

    slowed = fit.copy(deep=True)
    data = slowed["constant_data"].to_dataset()
    gpustep = data["cell_gpustep"].to_numpy()
    # three of the 12 GPUs slow on the last 3 of 6 steps (fewer are chance at 72 GPU-steps)
    hit = np.isin(data["gpu_of_gpustep"].to_numpy()[gpustep], [2, 5, 8]) & \
        np.isin(data["step_of_gpustep"].to_numpy()[gpustep], [3, 4, 5])
    data["cell_mean_log"] = data["cell_mean_log"] + np.where(hit, 1.0, 0.0)
    slowed["constant_data"] = data
    found, notes = episode_persistence(slowed)
    assert notes == [] and found.persistent
    labels = slowed["posterior"].coords["gpu_unit"].to_numpy().astype(str)
    assert found.runs[["gpu", "first_step", "last_step", "steps"]].values.tolist() == [
        [labels[g], "run1/4", "run1/6", 3] for g in (2, 5, 8)]
    assert (found.slow_gpu_steps, found.consecutive_pairs) == (9, 6)
    report = diagnose(slowed)
    assert any(n.startswith("GPU slowdowns last over consecutive steps") for n in report.notes)
    assert report.to_dict()["persistence"]["consecutive_pairs"] == 6
    assert "draws GPU×step episodes independently" in found.message()
    assert "--spec lasting" in found.message()  # the model that fits how long they last
    # a fit that learned how long episodes last says so instead
    posterior = slowed["posterior"].to_dataset()
    posterior["gpustep_episode_persistence"] = xr.full_like(
        posterior["gpu_scale"].isel(kernel_class=0), 0.8)
    slowed["posterior"] = posterior
    found, _ = episode_persistence(slowed)
    assert found.fitted_persistence == pytest.approx(0.8)
    assert "fits episodes that last (persistence 0.80: about 5.0 steps)" in found.message()
    assert "independently" not in found.message()


def test_a_fit_without_gpu_step_cells_says_the_check_was_skipped():
    fit = truth_posterior(seed=0)
    bare = fit.copy(deep=True)
    del bare["constant_data"]
    found, notes = episode_persistence(bare)
    assert found is None and notes == [
        "persistence of GPU slowdowns not checked: the fit has no GPU-step cells"]
