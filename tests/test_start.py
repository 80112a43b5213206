"""Data estimates that centre and scale the kernel model's data-dominated coordinates."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import helmert
from test_kernel_model import simulate_trace

from bayesprism.model.effects import grouped_helmert_inverse
from bayesprism.model.kernel import prepare_kernel
from bayesprism.model.start import (
    MIN_SE,
    kernel_baseline_se,
    robust_unit_effects,
    unit_effect_estimates,
    unit_resolution,
)
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


def test_resolution_discounts_a_noisy_warm_up_step_and_robust_effects_find_a_slow_node():
    """One launch per GPU-step (a benchmark table): noise 0.01 on steps 1-5, a warm-up step 0
    twenty times noisier. A GPU's effect is resolved to about 0.01/√5 (the warm-up adds little)
    and a node's (4 GPUs) to 0.01/√20; a node 8 % slow stands out of the robust estimates."""
    table, _ = simulate_trace(nodes=12, gpus=4, steps=6, launches=1, node_sd=0.0, gpu_sd=0.0,
                              step_sd=0.0, gs_sd=0.01, resid=0.0, seed=5,
                              kernels=[("gemm_a", "gemm", 5.0)])
    warm = table["step"].to_numpy() == 0
    noise = np.random.default_rng(6).normal(0.0, 0.2, warm.sum())
    table.loc[warm, "duration_us"] *= np.exp(noise)
    table.loc[table["node"] == "n03", "duration_us"] *= 1.08
    spec = ModelSpec(levels=("node", "gpu", "step"), likelihood="mixture",
                     collective_model="none")
    prepared = prepare_kernel([table], spec)
    resolution = unit_resolution(prepared.data, prepared.attrs["levels"])
    assert resolution["gpu"] == pytest.approx(0.01 / np.sqrt(5), rel=0.35)
    assert resolution["node"] == pytest.approx(0.01 / np.sqrt(20), rel=0.35)
    # the weighted means' standard errors carry the warm-up noise: several times larger
    assert unit_effect_estimates(prepared.data, prepared.attrs["levels"])["node"][1] > \
        3 * resolution["node"]
    node = robust_unit_effects(prepared.data, "node")
    assert node[3] - np.median(node) == pytest.approx(np.log(1.08), abs=0.01)
    others = np.delete(node, 3)
    assert np.abs(others - np.median(others)).max() < 0.01


def test_resolution_of_units_with_one_block_is_their_launches_standard_error():
    """One step per GPU (a traced step): a GPU's effect is known from its launches' spread."""
    table, _ = simulate_trace(nodes=2, gpus=4, steps=1, launches=50, gs_sd=0.0, resid=0.1,
                              seed=7)
    spec = ModelSpec(levels=("gpu",), collective_model="none")
    prepared = prepare_kernel([table], spec)
    n_launches = len(table) / 8
    resolution = unit_resolution(prepared.data, prepared.attrs["levels"])["gpu"]
    assert resolution == pytest.approx(0.1 / np.sqrt(n_launches), rel=0.2)


def test_chains_start_around_the_data_estimates():
    """The population scales, tail weights, residual and class sds start at what the data say
    (nutpie jitters every coordinate around the start, ±1 on the unconstrained scale)."""
    from bayesprism.model.kernel import build_kernel
    from bayesprism.model.start import (
        class_spread_start,
        robust_spread,
        student_t_nu_start,
        within_cell_sd,
    )

    table, _ = simulate_trace(nodes=3, gpus=4, steps=5, launches=3)
    prepared = prepare_kernel([table], ModelSpec.default())
    d = prepared.data
    start = build_kernel(prepared, ModelSpec.default()).initial_point()
    assert np.allclose(np.exp(start["resid_scale_log__"]), within_cell_sd(d))
    cls = d["kernel_class_of_kernel"]
    assert np.allclose(np.exp(start["kernel_class_sd_log__"]),
                       class_spread_start(d["kernel_mean"], cls, int(cls.max()) + 1))
    gpu = robust_unit_effects(d, "gpu")
    assert np.exp(start["gpu_scale_ref_log__"]) == pytest.approx(
        robust_spread(gpu, d["gpu_group"]))
    assert np.exp(start["gpu_nu_minus_one_log__"]) == pytest.approx(
        student_t_nu_start(gpu, d["gpu_group"]))


def test_student_t_and_episode_starts_read_the_data():
    """ν starts low for a population with an outlier and high without; the episode share,
    shift and spread start at the GPU-steps that stand out from their GPU and step."""
    from bayesprism.model.start import episode_start, student_t_nu_start

    rng = np.random.default_rng(1)
    core = 0.01 * rng.standard_normal(64)
    assert student_t_nu_start(np.r_[core[:63], 0.12]) < 3.0 < student_t_nu_start(core)
    table, _ = simulate_trace(nodes=2, gpus=4, steps=10, launches=20, gs_sd=0.002, resid=0.01)
    slow = (table["node"] == "n00") & (table["gpu"] == 1) & table["step"].isin([7, 8])
    table.loc[slow, "duration_us"] *= np.exp(0.06)
    prepared = prepare_kernel([table], ModelSpec(levels=("node", "gpu", "step", "gpustep")))
    share, shift, _ = episode_start(prepared.data)
    assert share == pytest.approx(2 / 80)
    assert shift == pytest.approx(0.06, abs=0.01)


def test_unit_levels_load_on_compute_classes_only():
    """Persistent and step levels: the reference is the launch-weighted geometric mean of the
    compute classes and collectives get no loading; the GPU×step level keeps a free log ratio
    for each collective on an axis of its own."""
    from types import SimpleNamespace

    import pymc as pm

    from bayesprism.model.effects import class_scales

    prepared = SimpleNamespace(coords={"kernel_class": ["allgather", "gemm", "norm"]},
                               data={"class_reference_weights": np.array([0.0, 3.0, 1.0])})
    with pm.Model(coords={"kernel_class": prepared.coords["kernel_class"]}):
        unit = class_scales("gpu", 0.02, prepared, reference_only=True)
        cell = class_scales("gpustep", 0.02, prepared)
    point = {"gpu_log_ratio_coef": np.array([0.7]), "gpustep_log_ratio_coef": np.array([0.7, -2.0])}
    gpu = unit.eval({k: v for k, v in point.items() if k.startswith("gpu_")})
    assert gpu[0] == 0.0
    assert np.exp((3 * np.log(gpu[1]) + np.log(gpu[2])) / 4) == pytest.approx(0.02)
    gpustep = cell.eval({k: v for k, v in point.items() if k.startswith("gpustep")})
    assert gpustep[0] == pytest.approx(0.02 * np.exp(-2.0))
    assert np.exp((3 * np.log(gpustep[1]) + np.log(gpustep[2])) / 4) == pytest.approx(0.02)


def test_loading_ratio_start_recovers_known_class_loadings():
    """Node and GPU effects that load twice as hard on attention kernels as on GEMMs and half
    as hard on elementwise ones: the slopes give those log ratios (weighted zero-sum over the
    compute classes) with a standard error, the model's ratio coefficients start at their
    projection, and a run's steps get no start."""
    from bayesprism.model.kernel import build_kernel
    from bayesprism.model.start import loading_ratio_start

    table, truth = simulate_trace(nodes=6, gpus=8, steps=6, launches=10, resid=0.01,
                                  gs_sd=0.002)
    loading = {"gemm": 1.0, "attention": 2.0, "elementwise": 0.5}
    node = table["node"].cat.codes.to_numpy()
    unit_effect = 0.10 * truth["u"][node] + 0.05 * truth["v"][node, table["gpu"].to_numpy()]
    extra = table["kernel_class"].map(loading).astype(float).to_numpy() - 1.0
    table["duration_us"] *= np.exp(extra * unit_effect)
    spec = ModelSpec(levels=("node", "gpu", "step"))
    prepared = prepare_kernel([table], spec)
    d = prepared.data
    weights = np.asarray(d["class_reference_weights"], dtype=float)
    classes = list(prepared.coords["kernel_class"])
    log_loading = np.log([loading[c] for c in classes])
    compute = weights > 0
    expected = np.where(compute, log_loading - np.average(log_loading[compute],
                                                          weights=weights[compute]), 0.0)
    for level in ("node", "gpu"):
        log_ratio, se = loading_ratio_start(d, level)
        assert np.allclose(log_ratio, expected, atol=0.03), level
        assert 1e-3 <= se < 0.03
    assert loading_ratio_start(d, "step") is None
    model = build_kernel(prepared, spec)
    [ratios] = model.replace_rvs_by_values([model["gpu_log_ratio_coef"]])
    ratios = model.compile_fn(ratios, inputs=model.value_vars,
                              on_unused_input="ignore")(model.initial_point())
    assert np.abs(ratios).max() > 0.3  # not the prior's zero
    from scipy.linalg import null_space
    basis = null_space(weights[compute][None, :])
    assert np.allclose(basis @ ratios, loading_ratio_start(d, "gpu")[0][compute])


def test_barely_resolved_steps_are_sampled_partially_noncentred_with_the_same_density(
        monkeypatch):
    """Step effects (sd 0.001) under GPU-step noise 20× larger: their estimates are mostly
    noise, so the contrasts are sampled on scale ** (1 - reliability). The chains start at the
    data's estimates as before, and the posterior is the centred model's: at matched points
    the log densities differ by exactly the map's Jacobian, k (1 - reliability) log(s / s0)."""
    from bayesprism.model import effects as effects_module
    from bayesprism.model.kernel import build_kernel
    from bayesprism.model.start import centred_share, robust_spread

    table, _ = simulate_trace(nodes=3, gpus=4, steps=8, launches=3, step_sd=0.001, gs_sd=0.02,
                              seed=2)
    spec = ModelSpec(levels=("node", "gpu", "step"))
    prepared = prepare_kernel([table], spec)
    d = prepared.data
    effects, se = unit_effect_estimates(d, prepared.attrs["levels"])["step"]
    start = robust_spread(effects)
    reliability = centred_share(start, se)
    assert 0.0 <= reliability < 0.5
    partial = build_kernel(prepared, spec)
    assert "step_partial_centring_jacobian" in partial.named_vars
    with monkeypatch.context() as patch:
        patch.setattr(effects_module, "centred_share", lambda spread, se: 1.0)
        centred = build_kernel(prepared, spec)
    assert "step_partial_centring_jacobian" not in centred.named_vars
    point = partial.initial_point()
    [effect] = partial.replace_rvs_by_values([partial["step_effect"]])
    at_start = partial.compile_fn(effect, inputs=partial.value_vars,
                                  on_unused_input="ignore")(point)
    assert np.allclose(at_start * start, effects - effects.mean(), atol=1e-12)

    centre = grouped_helmert_inverse(effects, d["step_group"])
    centre[0] = 0.0  # the group mean: prior-only, standardised in both
    z_centred = np.random.default_rng(0).standard_normal(len(effects))
    contrasts = len(effects) - 1
    logp_partial, logp_centred = partial.compile_logp(), centred.compile_logp()
    gaps = []
    for scale in (start / 3.0, start, 2.0 * start):
        factor = (scale / start) ** (1.0 - reliability)
        z_partial = z_centred.copy()
        z_partial[1:] = ((centre[1:] + se * z_centred[1:]) / factor - centre[1:]) / se
        gaps.append(logp_partial({**point, "step_basis_coef": z_partial,
                                  "step_scale_ref_log__": np.log(scale)})
                    - logp_centred({**point, "step_basis_coef": z_centred,
                                    "step_scale_ref_log__": np.log(scale)}))
    # the same density up to a constant: the gaps move by the Jacobian alone
    expected = contrasts * (1.0 - reliability) * np.log([1.0 / 3.0, 2.0])
    assert np.allclose(np.array(gaps)[[0, 2]] - gaps[1], expected, atol=1e-6)


def test_one_block_per_gpu_leaves_the_se_unknown_and_the_level_centred():
    """One profiled step per GPU (the DLRM sample's shape): nothing measures a GPU effect's
    standard error, so it is NaN, not a number read as 'all noise', and the level stays
    centred (a partially non-centred GPU level made the DLRM fit diverge 83 times)."""
    from bayesprism.model.kernel import build_kernel

    table, _ = simulate_trace(nodes=1, gpus=8, steps=1, launches=20, resid=0.01, seed=1)
    spec = ModelSpec(levels=("gpu",))
    prepared = prepare_kernel([table], spec)
    assert prepared.attrs["parameterisation"]["gpu"] == "centred"
    effects, se = unit_effect_estimates(prepared.data, prepared.attrs["levels"])["gpu"]
    assert np.isnan(se) and np.isfinite(effects).all()
    model = build_kernel(prepared, spec)
    assert "gpu_partial_centring_jacobian" not in model.named_vars
    [effect] = model.replace_rvs_by_values([model["gpu_effect"]])
    point = model.initial_point()
    scale = np.exp(point["gpu_scale_ref_log__"])
    at_start = model.compile_fn(effect, inputs=model.value_vars,
                                on_unused_input="ignore")(point)
    assert np.allclose(at_start * scale, effects - effects.mean(), atol=1e-9)
