"""Held-out splits, baselines as degenerate posteriors, held-out predictions and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from bayesprism.checks.baselines import degenerate_posterior, step_baseline_draws, step_slots
from bayesprism.checks.metrics import METRICS
from bayesprism.checks.row_predictive import predict_rows
from bayesprism.checks.splits import split_table
from bayesprism.checks.validate import (
    predict_heldout,
    predicted_slowest,
    rank_step_times,
    resampled_slowest,
    validate,
)
from bayesprism.cli.main import main
from bayesprism.errors import InputError
from bayesprism.report.plots import plot_pit_histogram
from bayesprism.schema import validate_table, write_table

KERNEL_MEDIANS_US = {"gemm_a": 100.0, "gemm_b": 400.0, "add": 20.0}
KERNEL_CLASSES = {"gemm_a": "gemm", "gemm_b": "gemm", "add": "elementwise"}


@pytest.fixture(scope="module")
def kernel_table() -> pd.DataFrame:
    """8 nodes x 4 GPUs x 6 steps x 3 kernels x 2 launches, lognormal with per-class sd, no unit
    effects."""
    rng = np.random.default_rng(7)
    nodes, gpus, steps = 8, 4, 6
    grid = pd.MultiIndex.from_product(
        [range(nodes), range(gpus), range(steps), list(KERNEL_MEDIANS_US), range(2)],
        names=["n", "gpu", "step", "kernel", "launch"],
    ).to_frame(index=False)
    sd = grid["kernel"].map({"gemm_a": 0.1, "gemm_b": 0.1, "add": 0.3})
    grid["duration_us"] = grid["kernel"].map(KERNEL_MEDIANS_US) * np.exp(
        sd * rng.standard_normal(len(grid))
    )
    table = pd.DataFrame({
        "run": "job",
        "step": grid["step"],
        "rank": grid["n"] * gpus + grid["gpu"],
        "node": "node" + grid["n"].astype(str),
        "gpu": grid["gpu"],
        "kernel": grid["kernel"],
        "kernel_class": grid["kernel"].map(KERNEL_CLASSES),
        "duration_us": grid["duration_us"],
    })
    table.attrs = {"schema_version": 1, "skipped": {}, "notes": [],
                   "runs": {"job": {"world_size": 32, "gpus_per_node": 4,
                                    "plan": {"dp": 32, "microbatches": 1}}}}
    return validate_table(table)


def step_table(sizes=(8, 16, 32), slot_s=0.01, steps=12, seed=3) -> pd.DataFrame:
    """Step rows of one run per world size; slot time ``slot_s``, pp = 2, m = 4 or 8."""
    rng = np.random.default_rng(seed)
    frames, runs = [], {}
    for size in sizes:
        micro = 8 if size < 32 else 4
        run = f"n{size}"
        slots = micro + 1  # pp = 2, one virtual stage
        frames.append(pd.DataFrame({
            "run": run, "step": np.arange(steps), "rank": -1, "node": "*", "gpu": -1,
            "kernel": "train_step", "kernel_class": "step",
            "duration_us": 1e6 * slots * slot_s * np.exp(0.02 * rng.standard_normal(steps)),
        }))
        runs[run] = {"world_size": size, "gpus_per_node": 8,
                     "plan": {"dp": size // 2, "tp": 1, "pp": 2, "cp": 1, "microbatches": micro}}
    table = pd.concat(frames, ignore_index=True)
    table.attrs = {"schema_version": 1, "skipped": {}, "notes": [], "runs": runs}
    return validate_table(table)


# -- splits ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("by", "unit"),
    [
        ("nodes", lambda t: t["node"].astype(str)),
        ("gpus", lambda t: t["node"].astype(str) + "/" + t["gpu"].astype(str)),
        ("ranks", lambda t: t["rank"]),
    ],
)
def test_unit_split_never_leaks_heldout_units_into_the_fit(kernel_table, by, unit):
    fit, held = split_table(kernel_table, by, fraction=0.25, seed=5)
    fit_units, held_units = set(unit(fit)), set(unit(held))
    assert fit_units and held_units
    assert not fit_units & held_units
    assert len(fit) + len(held) == len(kernel_table)
    all_units = set(unit(kernel_table))
    assert len(held_units) == round(0.25 * len(all_units))
    assert fit.attrs["split"] == {"by": by, "role": "fit",
                                  "heldout": sorted(held_units)}
    if by == "nodes":  # held-out nodes are not even categories of the fit table
        assert not set(fit["node"].cat.categories) & held_units
    assert fit.attrs["runs"] == kernel_table.attrs["runs"]
    assert kernel_table.attrs.get("split") is None  # the input is untouched


def test_split_is_seeded_and_accepts_an_explicit_holdout(kernel_table):
    a = split_table(kernel_table, "nodes", seed=1)[1]
    b = split_table(kernel_table, "nodes", seed=1)[1]
    assert a.equals(b)
    fit, held = split_table(kernel_table, "nodes", holdout=["node2", "node5"])
    assert sorted(held["node"].unique()) == ["node2", "node5"]
    assert "node2" not in set(fit["node"])


def test_split_rejects_unknown_units_and_impossible_splits(kernel_table):
    with pytest.raises(InputError) as err:
        split_table(kernel_table, "nodes", holdout=["node2", "node99"])
    assert err.value.lines() == ["split: holdout: not in the table (by nodes) (1 row), "
                                 "got 'node99'"]
    with pytest.raises(InputError, match="needs per-rank rows"):
        split_table(step_table(), "nodes")
    with pytest.raises(InputError, match="choose one of nodes, gpus, ranks, steps, scale"):
        split_table(kernel_table, "racks")
    one_step = kernel_table[kernel_table["step"] == 0]
    with pytest.raises(InputError, match="run\\(s\\) has a single step"):
        split_table(one_step, "steps")


def test_step_split_keeps_the_first_part_of_each_run(kernel_table):
    fit, held = split_table(kernel_table, "steps", fraction=1 / 3)
    assert sorted(fit["step"].unique()) == [0, 1, 2, 3]
    assert sorted(held["step"].unique()) == [4, 5]


def test_scale_split_fits_the_small_scales_and_keeps_attrs_consistent():
    table = step_table(sizes=(8, 16, 32, 64))
    fit, held = split_table(table, "scale")
    assert set(fit["run"]) == {"n8", "n16"} and set(held["run"]) == {"n32", "n64"}
    assert set(fit.attrs["runs"]) == {"n8", "n16"}
    assert set(held.attrs["runs"]) == {"n32", "n64"}
    assert held.attrs["split"]["heldout"] == [32, 64]
    fit, held = split_table(table, "scale", holdout=[64])
    assert set(held["run"]) == {"n64"} and "n64" not in set(fit["run"].cat.categories)


# -- baselines ---------------------------------------------------------------------------------


def test_pooled_baseline_is_a_degenerate_posterior_with_the_mle(kernel_table):
    tree = degenerate_posterior(kernel_table, "pooled")
    post = tree["posterior"]
    assert set(post.data_vars) == {"kernel_log_median", "resid_scale"}
    assert dict(post.sizes) == {"chain": 1, "draw": 1, "kernel": 3, "kernel_class": 2}
    assert tree.attrs["model_kind"] == "kernel" and tree.attrs["draws"] == 1
    assert "node_population" not in post.attrs and post.attrs["collective_model"] == []
    assert set(tree.children) == {"posterior", "sample_stats", "observed_data", "constant_data",
                                  "inventory"}
    log_d = np.log(kernel_table["duration_us"].to_numpy())
    kernel = kernel_table["kernel"].astype(str).to_numpy()
    for name in KERNEL_MEDIANS_US:
        expected = log_d[kernel == name].mean()
        got = post["kernel_log_median"].sel(kernel=name).item()
        assert got == pytest.approx(expected, rel=1e-12)
    add = log_d[kernel == "add"]
    expected_sd = np.sqrt(np.mean((add - add.mean()) ** 2))  # ML: divide by n
    assert post["resid_scale"].sel(kernel_class="elementwise").item() == pytest.approx(expected_sd)


def test_deterministic_baseline_has_mean_times_and_no_spread(kernel_table):
    tree = degenerate_posterior(kernel_table, "deterministic")
    post = tree["posterior"]
    assert np.all(post["resid_scale"].to_numpy() == 0.0)
    mean_add = kernel_table.loc[kernel_table["kernel"] == "add", "duration_us"].mean()
    assert np.exp(post["kernel_log_median"].sel(kernel="add").item()) == pytest.approx(mean_add)
    rows = kernel_table.head(5)
    pred, ok = predict_rows(tree, rows, draws=50, rng=np.random.default_rng(0))
    assert ok.all() and pred.shape == (50, 5)
    assert np.allclose(pred, pred[0])


def test_pooled_predictions_follow_the_fitted_lognormal(kernel_table):
    tree = degenerate_posterior(kernel_table, "pooled")
    rows = kernel_table.loc[kernel_table["kernel"] == "gemm_b"].head(3)
    pred, _ = predict_rows(tree, rows, draws=20_000, rng=np.random.default_rng(1))
    mu = tree["posterior"]["kernel_log_median"].sel(kernel="gemm_b").item()
    sd = tree["posterior"]["resid_scale"].sel(kernel_class="gemm").item()
    assert np.median(np.log(pred)) == pytest.approx(mu, abs=0.01)
    assert np.log(pred).std() == pytest.approx(sd, rel=0.03)


def test_step_baselines_rescale_the_slot_time_by_the_plan():
    table = step_table(sizes=(8, 16))
    target = {"microbatches": 4, "pp": 2, "virtual_stages": 1}
    assert step_slots(target) == 5.0
    rng = np.random.default_rng(0)
    det = step_baseline_draws(table, target, "deterministic", 10, rng)
    assert np.allclose(det, 5 * 0.01, rtol=0.01)
    pooled = step_baseline_draws(table, target, "pooled", 20_000, rng)
    assert np.median(pooled) == pytest.approx(0.05, rel=0.01)
    assert np.log(pooled).std() == pytest.approx(0.02, rel=0.25)


# -- predictions with unit levels (a posterior written by hand per docs/artifacts.md) -----------


def hand_posterior(node_scale: float, resid: float) -> xr.DataTree:
    post = xr.Dataset(
        {
            "kernel_log_median": (("chain", "draw", "kernel"), np.full((1, 4, 1), np.log(100.0))),
            "node_scale": (("chain", "draw", "kernel_class"), np.full((1, 4, 1), node_scale)),
            "node_effect": (("chain", "draw", "node"), np.tile([2.0, -1.0], (1, 4, 1))),
            "resid_scale": (("chain", "draw", "kernel_class"), np.full((1, 4, 1), resid)),
        },
        coords={"chain": [0], "draw": np.arange(4), "kernel": ["gemm_a"],
                "kernel_class": ["gemm"], "node": ["node0", "node1"]},
        attrs={"node_population": "normal"},
    )
    tree = xr.DataTree(children={"posterior": xr.DataTree(post)})
    tree.attrs["model_kind"] = "kernel"
    return tree


def test_rows_on_fitted_nodes_use_their_effects_and_new_nodes_the_population(kernel_table):
    tree = hand_posterior(node_scale=0.5, resid=0.0)
    rows = kernel_table.loc[kernel_table["kernel"] == "gemm_a"]
    rows = rows.loc[rows["node"].isin(["node0", "node1", "node6"])].head(200)
    pred, ok = predict_rows(tree, rows, draws=4000, rng=np.random.default_rng(2))
    assert ok.all()
    node = rows["node"].astype(str).to_numpy()
    assert np.allclose(np.log(pred[:, node == "node0"]), np.log(100.0) + 0.5 * 2.0)
    assert np.allclose(np.log(pred[:, node == "node1"]), np.log(100.0) - 0.5)
    new = np.log(pred[:, node == "node6"][:, 0]) - np.log(100.0)
    assert new.std() == pytest.approx(0.5, rel=0.05)
    # all GPUs of a new node share its effect within a draw
    assert np.allclose(np.log(pred[:, node == "node6"]).std(axis=1), 0.0)


def test_slowest_of_k_grows_with_k_and_matches_resampling_for_a_calibrated_model(kernel_table):
    rng = np.random.default_rng(4)
    rows = kernel_table.loc[kernel_table["kernel"] == "gemm_b"]
    tree = degenerate_posterior(rows, "pooled")
    predicted = predicted_slowest(tree, rows, [4, 16], draws=4000, rng=rng)
    resampled = resampled_slowest(rows, [4, 16], resamples=2000, rng=rng)
    assert predicted[16].mean() > predicted[4].mean()
    for k in (4, 16):  # iid lognormal data: the plugged-in lognormal is nearly exact
        assert predicted[k].mean() == pytest.approx(resampled[k].mean(), rel=0.02)


# -- validate and the CLI ----------------------------------------------------------------------


def test_validate_scores_baselines_on_a_node_split(kernel_table):
    result = validate(kernel_table, split="nodes", seed=0, draws=400,
                      methods=("pooled", "deterministic"))
    assert list(result.index) == ["pooled", "deterministic"]
    assert list(result.columns) == [*METRICS, "n_observed"]
    assert result.loc["pooled", "n_observed"] == len(kernel_table) // 2
    # iid data without unit effects: the pooled lognormal is the truth
    assert result.loc["pooled", "coverage_90"] == pytest.approx(0.9, abs=0.05)
    assert result.loc["pooled", "ks"] < 0.1
    assert result.loc["deterministic", "coverage_90"] < 0.1
    assert result.loc["pooled", "crps"] < result.loc["deterministic", "crps"]
    assert set(result.attrs["pit"]) == {"pooled", "deterministic"}


def test_collectives_are_scored_on_their_transfer_and_whole_us_timers_on_their_grid(
        kernel_table):
    """Kineto-like data: whole-µs durations, an AllReduce whose waiting was split off."""
    rng = np.random.default_rng(11)
    table = kernel_table.copy()
    table["duration_us"] = np.maximum(np.round(table["duration_us"]), 1.0)
    n_ar = table["rank"].nunique() * table["step"].nunique()
    ar = table.drop_duplicates(["rank", "step"]).head(n_ar).copy()
    ar["kernel"], ar["kernel_class"] = "ncclAllReduce", "allreduce"
    ar["transfer_us"] = np.round(50.0 * np.exp(0.05 * rng.standard_normal(len(ar))))
    ar["wait_us"] = np.round(rng.uniform(100.0, 2000.0, len(ar)))
    ar["duration_us"] = ar["transfer_us"] + ar["wait_us"]
    table = pd.concat([table, ar], ignore_index=True)
    table["kernel_class"] = table["kernel_class"].astype(str)
    table.attrs = kernel_table.attrs
    table = validate_table(table)
    result = validate(table, split="nodes", seed=0, draws=400, methods=("pooled",))
    held = split_table(table, "nodes", seed=0)[1]
    assert result.attrs["on_transfer"] == int((held["kernel_class"] == "allreduce").sum()) > 0
    # the pooled AllReduce is fitted on its transfer (~50 µs), not on transfer + wait: scored
    # on the same quantity it is calibrated; on durations its 90% intervals would miss them all
    assert result.loc["pooled", "coverage_90"] == pytest.approx(0.9, abs=0.05)
    assert result.loc["pooled", "ks"] < 0.1
    fit_table = split_table(table, "nodes", seed=0)[0]
    prediction = predict_heldout("pooled", degenerate_posterior(fit_table, "pooled"), fit_table,
                                 held, draws=50, rng=np.random.default_rng(0))
    draws = prediction.groups[0][0]
    assert np.array_equal(draws, np.round(draws)) and draws.min() >= 1.0


def test_validate_needs_heldout_data_or_a_split(kernel_table):
    with pytest.raises(InputError, match="give held-out tables or a split"):
        validate(kernel_table, methods=("pooled",))


def test_pit_histogram_is_written(tmp_path):
    rng = np.random.default_rng(0)
    path = plot_pit_histogram({"a": rng.random(100), "b": rng.random(100)}, tmp_path / "pit.png")
    assert path.stat().st_size > 1000


def test_cli_json_has_the_documented_keys(kernel_table, tmp_path, capsys):
    path = write_table(kernel_table, tmp_path / "table.parquet")
    code = main(["validate", "--fit", str(path), "--split", "nodes", "--json", "--draws", "200",
                 "--methods", "pooled", "deterministic", "--quiet"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"pooled", "deterministic"}
    for scores in out.values():
        assert list(scores) == ["ks", "coverage_50", "coverage_90", "crps", "p50_error",
                                "p95_error"]


def test_cli_without_heldout_or_split_exits_2(kernel_table, tmp_path, capsys):
    path = write_table(kernel_table, tmp_path / "table.parquet")
    assert main(["validate", "--fit", str(path), "--quiet"]) == 2
    assert "give --heldout PATH... or --split" in capsys.readouterr().err


@pytest.mark.slow  # a real fit: ~30-90 s, mostly compilation
def test_cli_json_with_the_bayesprism_fit(kernel_table, tmp_path, capsys):
    path = write_table(kernel_table, tmp_path / "table.parquet")
    code = main(["validate", "--fit", str(path), "--split", "nodes", "--json", "--draws", "50",
                 "--quiet"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"bayesprism", "pooled", "deterministic"}
    assert all(list(v) == list(METRICS) for v in out.values())


def test_rank_step_times_from_the_rank_span_or_from_the_step_start_on_its_node():
    # node a: rank 0 runs 0-30 us, rank 1 starts late (10) and ends last (34); node b: rank 2
    # runs 5-20 on its own clock
    rows = [(0, "a", 0, 0.0, 10.0), (0, "a", 0, 12.0, 18.0), (1, "a", 1, 10.0, 24.0),
            (2, "b", 0, 5.0, 15.0)]
    table = pd.DataFrame(rows, columns=["rank", "node", "gpu", "start_us", "duration_us"])
    table = table.assign(run="r", step=0, kernel="g", kernel_class="gemm")
    spans = rank_step_times(table)
    np.testing.assert_allclose(spans, [30e-6, 24e-6, 15e-6])
    held, fitted = table[table["rank"] != 0], table[table["rank"] == 0]
    # rank 1's step starts at rank 0's first kernel (same node); rank 2's node has no other rank
    np.testing.assert_allclose(rank_step_times(held, others=fitted), [34e-6, 15e-6])


# -- two-component (slow-launch) residual ------------------------------------------------------


def mixture_posterior(table, scale=0.02, weight=0.2, shift=0.7, slow_sd=0.1) -> xr.DataTree:
    """The pooled baseline of ``table`` with a mixture residual of known parameters."""
    tree = degenerate_posterior(table, "pooled")
    post = tree["posterior"].to_dataset()
    dims, shape = post["resid_scale"].dims, post["resid_scale"].shape
    post["resid_scale"] = (dims, np.full(shape, scale))
    for name, value in (("resid_slow_weight", weight), ("resid_slow_shift", shift),
                        ("resid_slow_sd", slow_sd)):
        post[name] = (dims, np.full(shape, value))
    tree["posterior"] = post
    return tree


def test_mixture_residual_predictions_draw_the_fitted_share_of_slow_launches(kernel_table):
    tree = mixture_posterior(kernel_table)
    rows = kernel_table.loc[kernel_table["kernel"] == "gemm_b"].head(4)
    pred, ok = predict_rows(tree, rows, draws=50_000, rng=np.random.default_rng(3))
    assert ok.all()
    mu = tree["posterior"]["kernel_log_median"].sel(kernel="gemm_b").item()
    eps = np.log(pred) - mu
    slow = eps > 0.35  # 17 core sds above, 3.5 slow sds below the slow mean
    assert slow.mean() == pytest.approx(0.2, abs=0.005)
    assert eps[slow].mean() == pytest.approx(0.7, abs=0.005)
    assert eps[slow].std() == pytest.approx(0.1, rel=0.03)
    assert eps[~slow].std() == pytest.approx(0.02, rel=0.03)


def test_slowest_of_k_under_a_mixture_residual_is_the_finite_expected_maximum(kernel_table):
    from scipy import integrate, stats

    rows = kernel_table.loc[kernel_table["kernel"] == "gemm_b"]
    tree = mixture_posterior(rows)
    mu = tree["posterior"]["kernel_log_median"].sel(kernel="gemm_b").item()
    predicted = predicted_slowest(tree, rows, [16], draws=20_000, rng=np.random.default_rng(5))

    def cdf(log_d):  # of one run's log duration
        return (0.8 * stats.norm.cdf(log_d, mu, 0.02)
                + 0.2 * stats.norm.cdf(log_d, mu + 0.7, 0.1))

    # E[max] = ∫ P(max > d) dd over durations, here in log duration: ∫ (1 - F^16) e^x dx
    tail, _ = integrate.quad(lambda x: (1 - cdf(x) ** 16) * np.exp(x), mu - 1, mu + 2,
                             points=[mu, mu + 0.7])
    expected = np.exp(mu - 1) + tail
    assert predicted[16].mean() == pytest.approx(expected, rel=0.01)
