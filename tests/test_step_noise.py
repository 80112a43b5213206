"""Steps that differ in noise (spec ``step_noise``): the spec's checks, the fit's recovery of a
noisy step, and the consumers (held-out predictions, workload moments)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from bayesprism.errors import SpecError
from bayesprism.forecast.workload import residual_moments
from bayesprism.schema import validate_table
from bayesprism.spec import ModelSpec

NOISY_STEP_FACTOR = 6.0
CORE_SD = 0.02


def test_step_noise_needs_a_row_likelihood_and_the_step_level():
    with pytest.raises(SpecError, match=r"step_noise.*row likelihood"):
        ModelSpec(likelihood="lognormal", step_noise=True)
    with pytest.raises(SpecError, match="step_noise"):
        ModelSpec(likelihood="mixture", levels=("node", "gpu"), step_noise=True)
    with pytest.raises(SpecError, match="true or false"):
        ModelSpec(likelihood="mixture", step_noise="yes")
    spec = dataclasses.replace(ModelSpec.load("benchmark"), step_noise=True)
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    assert "step_noise = true" in spec.to_toml()


def test_a_table_of_single_steps_drops_the_step_level_and_step_noise_with_a_note():
    """One run per GPU, one repeat each (PAL's LS6 table): the spec asks for step_noise, but
    there are no repeats to differ in noise; the model builds without it (it raised a KeyError
    from inside PyMC)."""
    from bayesprism.model import build, prepare

    rng = np.random.default_rng(0)
    n = 24
    table = validate_table(pd.DataFrame({
        "run": pd.Categorical(np.full(n, "r0")), "step": np.zeros(n, dtype=int),
        "rank": np.arange(n), "node": pd.Categorical([f"n{i // 4}" for i in range(n)]),
        "gpu": np.arange(n) % 4, "kernel": pd.Categorical(np.full(n, "gemm")),
        "kernel_class": pd.Categorical(np.full(n, "gemm")),
        "duration_us": np.exp(rng.normal(np.log(500.0), 0.01, n)),
        "cabinet": [f"c{i // 12}" for i in range(n)],
    }))
    spec = ModelSpec.load("benchmark")
    prepared = prepare([table], spec)
    # nor has a GPU of one launch an effect apart from that launch's residual
    assert prepared.attrs["levels"] == ["cabinet", "node"]
    assert any("step_noise" in note for note in prepared.attrs["notes"])
    assert any("every GPU has a single launch" in note for note in prepared.attrs["notes"])
    model = build(prepared, spec)
    assert "step_noise" not in model.named_vars and "node_slow_weight" in model.named_vars


def test_workload_moments_average_the_fitted_steps():
    # two fitted steps, core sd 0.1 stretched x2 and x0.5: the moments of a launch in a step
    # picked at random are the average of the two lognormals' (plus the spread of their means)
    scale = np.array([0.1])
    lam = np.log([[2.0, 0.5]])
    mean, var = residual_moments(scale, step_noise=lam)
    m2, v2 = residual_moments(np.array([0.2, 0.05]))
    assert mean[0] == pytest.approx(m2.mean(), rel=1e-12)
    assert var[0] == pytest.approx(v2.mean() + m2.var(), rel=1e-12)
    # steps weighted by how many runs were measured in each
    mean_w, _ = residual_moments(scale, step_noise=lam, step_weights=np.array([0.75, 0.25]))
    assert mean_w[0] == pytest.approx(0.75 * m2[0] + 0.25 * m2[1], rel=1e-12)
    # a mixture keeps its shift and its extra spread; only the core is stretched
    slow = (np.array([0.1]), np.array([0.5]), np.array([np.hypot(0.1, 0.3)]))
    mean, _ = residual_moments(scale, slow, step_noise=lam)
    expected = [residual_moments(np.array([s]), (np.array([0.1]), np.array([0.5]),
                                                 np.array([np.hypot(s, 0.3)])))[0][0]
                for s in (0.2, 0.05)]
    assert mean[0] == pytest.approx(np.mean(expected), rel=1e-12)


def noisy_step_table(seed: int = 5) -> pd.DataFrame:
    """Benchmark repeats: 6 nodes x 4 GPUs x 5 repeats x 4 runs of one kernel; repeat 0 is
    ``NOISY_STEP_FACTOR`` times noisier than the others (and 20 % slower)."""
    rng = np.random.default_rng(seed)
    nodes, gpus, steps, launches = 6, 4, 5, 4
    n, g, s, _ = (a.ravel() for a in np.meshgrid(np.arange(nodes), np.arange(gpus),
                                                  np.arange(steps), np.arange(launches),
                                                  indexing="ij"))
    node_effect = 0.03 * rng.standard_normal(nodes)
    sd = np.where(s == 0, NOISY_STEP_FACTOR * CORE_SD, CORE_SD)
    log_d = np.log(1e4) + node_effect[n] + np.where(s == 0, 0.2, 0.0) + sd * rng.standard_normal(
        n.size)
    table = pd.DataFrame({
        "run": "bench", "step": s, "rank": n * gpus + g, "node": [f"n{i}" for i in n], "gpu": g,
        "kernel": "gemm", "kernel_class": "gemm", "duration_us": np.exp(log_d),
    })
    table.attrs = {"schema_version": 1, "skipped": {}, "notes": [], "runs": {}}
    return validate_table(table)


@pytest.fixture(scope="module")
def noisy_fit():
    # 300 draws: the single run's prior-only step-mean coordinate (and kernel_log_median,
    # which carries it) reach R-hat ~1.05; the assertions below hold with wide margins
    from bayesprism.inference import fit

    spec = dataclasses.replace(ModelSpec.load("benchmark"), levels=("node", "step"),
                               step_noise=True)
    return noisy_step_table(), fit(noisy_step_table(), spec, draws=300, tune=300, chains=2,
                                   random_seed=3, progress=False)


@pytest.mark.filterwarnings("ignore::bayesprism.errors.ConvergenceWarning")
def test_a_noisy_repeat_is_recovered_and_predicted_with_its_own_spread(noisy_fit):
    from bayesprism.checks.row_predictive import predict_rows

    table, tree = noisy_fit
    post = tree["posterior"]
    lam = post["step_noise"].to_numpy().reshape(-1, 5)
    # repeat 0 vs the mean of the others: log(6) = 1.79, within the 95 % interval
    contrast = lam[:, 0] - lam[:, 1:].mean(axis=1)
    lo, hi = np.quantile(contrast, [0.025, 0.975])
    assert lo < np.log(NOISY_STEP_FACTOR) < hi and lo > 1.0
    # new GPUs on fitted repeats: each repeat is predicted with its own spread
    rows = table.loc[table["node"].isin(["n0"])].assign(node="new-node")
    pred, _ = predict_rows(tree, rows, draws=400, rng=np.random.default_rng(0))
    log_pred = np.log(pred)
    step = rows["step"].to_numpy()
    # spread across a repeat's launches, per draw (the new node's effect is shared by them)
    within = [np.std(log_pred[:, step == k], axis=1).mean() for k in range(5)]
    assert within[0] > 3.0 * max(within[1:])
    # new repeats are fitted repeats picked at random: about 1 in 5 is the noisy one
    new = rows.loc[rows["step"] == 1].assign(run="another", step=100)
    log_new = np.log(predict_rows(tree, new, draws=2000, rng=np.random.default_rng(1))[0])
    spread = np.std(log_new, axis=1)
    share_noisy = np.mean(spread > 3.0 * np.median(spread))
    assert 0.1 < share_noisy < 0.35


@pytest.mark.filterwarnings("ignore::bayesprism.errors.ConvergenceWarning")
def test_fitted_steps_and_nodes_are_predicted_at_their_own_level(noisy_fit):
    # one run: the step effects' mean is a prior-only coordinate, which kernel_log_median
    # absorbs; without that the prediction of a fitted step carried it (sd ~0.05 here)
    from bayesprism.checks.row_predictive import predict_rows

    table, tree = noisy_fit
    rows = table.loc[(table["node"] == "n0") & (table["step"] == 3)]
    log_pred = np.log(predict_rows(tree, rows, draws=400, rng=np.random.default_rng(2))[0])
    level = np.median(log_pred, axis=1)  # per draw: the launches' typical log duration
    assert np.std(level) < 0.015
    assert np.median(level) == pytest.approx(np.median(np.log(rows["duration_us"])), abs=0.02)


def test_plan_models_carry_the_fitted_steps_noise():
    import warnings

    from posterior_builders import gemm_only

    from bayesprism.forecast.workload import build_plan_model
    from bayesprism.plan import ParallelPlan, PlanWarning

    launches, sigma = 10.0, 0.05
    tree = gemm_only(draws=4, launches=launches, scales={"resid": {"gemm": sigma}})
    post = tree["posterior"].to_dataset()
    lam = np.log([2.0, 0.5, 1.0])
    post["step_noise"] = (("chain", "draw", "step_unit"),
                          np.broadcast_to(lam, (*post["resid_scale"].shape[:2], 3)).copy())
    post = post.assign_coords(step_unit=["r/0", "r/1", "r/2"])
    noisy = tree.copy()
    noisy["posterior"] = post
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        model = build_plan_model(noisy, ParallelPlan(dp=8))
        plain = build_plan_model(tree, ParallelPlan(dp=8))
    mean, var = residual_moments(np.array([sigma]), step_noise=lam[None, :])
    s2 = np.log1p(var / launches / mean**2)  # one kernel: mean of `launches` factors
    np.testing.assert_allclose(model.resid_sd, np.sqrt(s2[0]))
    assert np.all(model.resid_sd > plain.resid_sd)


def test_fitted_step_weights_count_the_gpu_steps_of_each_step():
    import xarray as xr

    from bayesprism.forecast.workload import fitted_step_weights

    tree = xr.DataTree.from_dict({
        "posterior": xr.Dataset(coords={"step_unit": ["r/0", "r/1", "r/2"]}),
        "constant_data": xr.Dataset({"step_of_gpustep": ("gpustep", [0, 0, 0, 1, 0, 1])}),
    })
    np.testing.assert_allclose(fitted_step_weights(tree), [4 / 6, 2 / 6, 0.0])
    assert fitted_step_weights(xr.DataTree.from_dict({"posterior": xr.Dataset()})) is None


@pytest.mark.filterwarnings("ignore::bayesprism.errors.ConvergenceWarning")
def test_default_warmup_and_draws_are_the_mass_matrix_adaptations():
    """``tune=None, draws=None``: 600 warm-up draws and 1500 draws under nutpie's low-rank
    mass matrix (a noisy step), 1000 and 1000 under the diagonal one."""
    from posterior_builders import tiny_kernel_table, tiny_spec

    from bayesprism.inference import DEFAULT_LENGTH, fit

    noisy = dataclasses.replace(ModelSpec.load("benchmark"), levels=("node", "step"),
                                step_noise=True)
    for table, spec, mass_matrix, length in (
            (noisy_step_table(), noisy, "low_rank", (600, 1500)),
            (tiny_kernel_table(), tiny_spec(), "diag", (1000, 1000))):
        tree = fit(table, spec, chains=1, sampler="nutpie", random_seed=0, progress=False)
        assert tree["posterior"].attrs.get("mass_matrix", "diag") == mass_matrix
        assert (tree.attrs["tune"], tree.attrs["draws"]) == length == DEFAULT_LENGTH[mass_matrix]
        assert tree["warmup_sample_stats"].sizes["draw"] == length[0]
        assert tree["posterior"].sizes["draw"] == length[1]
