"""forecast(), summarize_forecast() and the ``bayesprism forecast`` command."""

from __future__ import annotations

import argparse
import inspect
import json
import warnings

import numpy as np
import pytest
from posterior_builders import GEMM_SPREAD, gemm_only

from bayesprism.cli import forecast as cli_forecast
from bayesprism.errors import InputError
from bayesprism.forecast.forecasting import SIMULATED_STEPS_MAX, forecast, summarize_forecast
from bayesprism.plan import Cluster, ParallelPlan, PlanWarning

STEP_KEYS = {"mean", "p05", "p25", "p50", "p75", "p95", "p99", "ci90"}


@pytest.fixture(autouse=True)
def _no_plan_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        yield


def test_forecast_layout_follows_the_contract():
    post = gemm_only(draws=20, scales=GEMM_SPREAD)
    plans = [ParallelPlan(name="a", dp=2, pp=2, microbatches=4),
             ParallelPlan(name="b", dp=4, tp=8, microbatches=2, steps=10)]
    fc = forecast(post, plans, draws=10, replicates=3, progress=False, steps=50,
                  deadlines_s=[1.0])
    ds = fc.to_dataset()
    assert dict(ds.sizes) == {"plan": 2, "draw": 10, "replicate": 3, "threshold": 3,
                              "deadline": 1}
    for name in ("step_time_s", "compute_s", "exposed_comm_s", "bubble_s", "wait_s",
                 "training_time_s"):
        assert ds[name].dims == ("plan", "draw", "replicate")
    assert ds["ideal_step_time_s"].dims == ("plan",)
    assert ds["slowdown_probability"].dims == ("plan", "threshold")
    assert ds["finish_probability"].dims == ("plan", "deadline")
    assert list(ds["plan"].values) == ["a", "b"]
    assert list(ds["gpus"].values) == [4, 32]
    assert list(ds["schedule"].values) == ["1f1b", "1f1b"]
    assert list(ds["path"].values) == ["exact", "exact"]
    assert fc.attrs["random_seed"] == 0 and fc.attrs["posterior_input_digest"] == "hand-built"
    parts = sum(ds[n] for n in ("compute_s", "exposed_comm_s", "bubble_s", "wait_s"))
    np.testing.assert_allclose(parts, ds["step_time_s"])


def test_deterministic_training_time_slowdown_and_finish_probabilities():
    post = gemm_only(draws=4)
    plan = ParallelPlan(pp=4, microbatches=8)
    step = 11 * 250e-6  # (m + p - 1) slots of 250 us
    for steps in (10, 10_000):  # simulated sum and normal sum
        fc = forecast(post, plan, steps=steps, draws=4, replicates=2, progress=False,
                      deadlines_s=[steps * step * 0.999, steps * step * 1.001])
        ds = fc.to_dataset()
        np.testing.assert_allclose(ds["training_time_s"], steps * step)
        np.testing.assert_allclose(ds["finish_probability"].values, [[0.0, 1.0]])
        np.testing.assert_allclose(ds["slowdown_probability"], 0.0)
    baseline = forecast(post, plan, baseline_s=2.6e-3, draws=4, replicates=2, progress=False)
    # step / baseline = 1.0577: above 5%, below 10% and 20%
    np.testing.assert_allclose(baseline["slowdown_probability"].values, [[1.0, 0.0, 0.0]])
    assert baseline.attrs["baseline"] == "user"


def test_slowdown_probability_is_the_fraction_of_draws_above():
    post = gemm_only(draws=30, scales=GEMM_SPREAD)
    fc = forecast(post, ParallelPlan(dp=8, tp=8), draws=30, replicates=4, progress=False,
                  thresholds=(1.4, 1.6))
    ds = fc.to_dataset().isel(plan=0)
    ideal = float(ds["ideal_step_time_s"])
    for x, p in zip((1.4, 1.6), ds["slowdown_probability"].values, strict=True):
        assert p == pytest.approx(float((ds["step_time_s"] > x * ideal).mean()))
    low, high = ds["slowdown_probability"].values
    assert 0.0 < high < low < 1.0


def test_same_seed_same_numbers():
    post = gemm_only(draws=20, scales=GEMM_SPREAD)
    plans = [ParallelPlan(dp=4, tp=8, pp=2, microbatches=4)]
    a = forecast(post, plans, draws=20, replicates=4, random_seed=11, progress=False, steps=500)
    b = forecast(post, plans, draws=20, replicates=4, random_seed=11, progress=False, steps=500)
    c = forecast(post, plans, draws=20, replicates=4, random_seed=12, progress=False, steps=500)
    for name in ("step_time_s", "wait_s", "training_time_s"):
        np.testing.assert_array_equal(a[name].values, b[name].values)
        assert not np.array_equal(a[name].values, c[name].values)
    assert summarize_forecast(a) == summarize_forecast(b)


def test_normal_sum_matches_the_simulated_sum_of_steps():
    post = gemm_only(draws=200, scales=GEMM_SPREAD)
    plan = ParallelPlan(dp=2, tp=8)
    short = forecast(post, plan, steps=SIMULATED_STEPS_MAX, draws=200, replicates=16,
                     progress=False)["training_time_s"].values / SIMULATED_STEPS_MAX
    long = forecast(post, plan, steps=SIMULATED_STEPS_MAX + 1, draws=200, replicates=16,
                    progress=False)["training_time_s"].values / (SIMULATED_STEPS_MAX + 1)
    assert long.mean() == pytest.approx(short.mean(), rel=2e-3)
    assert long.std() == pytest.approx(short.std(), rel=0.15)


@pytest.mark.parametrize("exact", [True, False])
def test_training_time_runs_on_one_fixed_cluster(exact):
    # node effects only (loading 0.5), no step, GPU x step or launch variability: a draw's
    # cluster is fixed, so its steps are all equal and training time is steps x that step
    post = gemm_only(draws=40, scales={"node": {"gemm": 0.5}})
    plan = ParallelPlan(dp=16 if exact else 4096)
    fc = forecast(post, plan, steps=100, draws=40, replicates=6, progress=False, exact=exact)
    step = fc["step_time_s"].values[0]
    training = fc["training_time_s"].values[0]
    np.testing.assert_allclose(step, step[:, :1] * np.ones_like(step))
    np.testing.assert_allclose(training, 100 * step)
    # the clusters' spread is not averaged away over the steps: training time varies across
    # draws exactly as much as one step does (relative spread), and well above 0
    spread = np.std(training[:, 0] / 100) / np.mean(training[:, 0] / 100)
    assert spread == pytest.approx(np.std(step[:, 0]) / np.mean(step[:, 0]))
    assert spread > 0.05


def test_summary_has_the_documented_keys():
    post = gemm_only(draws=20, scales=GEMM_SPREAD)
    fc = forecast(post, ParallelPlan(name="p", dp=4, tp=8, microbatches=2), draws=20,
                  replicates=4, progress=False, steps=100, deadlines_s=[0.5])
    summary = summarize_forecast(fc, include_draws=True)
    (plan,) = summary["plans"]
    assert set(plan) == {"name", "gpus", "dp", "tp", "pp", "cp", "ep", "microbatches",
                         "schedule", "step_time_s", "ideal_step_time_s", "baseline_step_time_s",
                         "degraded_link_probability", "degraded_link", "extrapolated",
                         "slowdown_probability", "breakdown_s", "training_time_s", "steps",
                         "finish_probability", "draws_s"}
    assert set(plan["step_time_s"]) == STEP_KEYS == set(plan["training_time_s"])
    assert set(plan["slowdown_probability"]) == {"1.05", "1.10", "1.20"}
    assert set(plan["breakdown_s"]) == {"compute", "exposed_comm", "bubble", "wait"}
    assert len(plan["draws_s"]) == 80
    step = plan["step_time_s"]
    assert step["p05"] <= step["p50"] <= step["p95"] <= step["p99"]
    lo, hi = step["ci90"]  # interval of the mean: inside the predictive spread
    assert step["p05"] <= lo <= step["mean"] <= hi <= step["p95"]
    assert json.loads(json.dumps(summary)) == summary
    assert sum(plan["breakdown_s"].values()) == pytest.approx(step["mean"])


def test_bad_arguments():
    post = gemm_only(draws=2)
    with pytest.raises(InputError, match="finish probabilities need steps"):
        forecast(post, ParallelPlan(), deadlines_s=[1.0], progress=False)
    with pytest.raises(InputError, match="must be ParallelPlan objects"):
        forecast(post, [{"dp": 2}], progress=False)
    with pytest.raises(InputError, match="needs one value per plan"):
        forecast(post, [ParallelPlan(), ParallelPlan(dp=2)], baseline_s=[1.0], progress=False)


# ---------------------------------------------------------------------------- CLI
def cli_args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_forecast.register(parser.add_subparsers())
    argv = ["forecast", "post.nc"]
    args = parser.parse_args(argv)
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_cli_builds_plans_from_flags_files_and_the_traced_plan(tmp_path):
    path = tmp_path / "plans.toml"
    path.write_text('[[plan]]\nname = "x"\ndp = 2\n[[plan]]\ndp = 4\npp = 2\nmicrobatches = 4\n')
    plans, cluster = cli_forecast.build_plans(cli_args(plan=[path], gpus_per_node=4))
    assert [p.name for p in plans] == ["x", "dp4-tp1-pp2-m4-1f1b"]
    assert {p.gpus_per_node for p in plans} == {4} and cluster is None
    plans, _ = cli_forecast.build_plans(cli_args(dp=8, tp=2, schedule="gpipe"))
    assert (plans[0].dp, plans[0].tp, plans[0].schedule) == (8, 2, "gpipe")
    post = gemm_only(draws=2, traced_plan={"dp": 8, "microbatches": 2})
    plans, _ = cli_forecast.build_plans(cli_args(), post)
    assert (plans[0].name, plans[0].dp, plans[0].microbatches) == ("traced", 8, 2)


def test_cli_dp_list_forecasts_a_weak_scaling_sweep(tmp_path, capsys):
    post = gemm_only(draws=2, traced_plan={"dp": 8, "tp": 2, "microbatches": 2})
    plans, _ = cli_forecast.build_plans(cli_args(dp=[2, 8, 32]), post)
    assert [(p.dp, p.tp, p.microbatches) for p in plans] == [(2, 2, 2), (8, 2, 2), (32, 2, 2)]
    assert len({p.name for p in plans}) == 3
    path = tmp_path / "plans.toml"
    path.write_text('[[plan]]\nname = "x"\ndp = 2\n')
    plans, _ = cli_forecast.build_plans(cli_args(plan=[path], dp=[4, 16]))
    assert [(p.name, p.dp) for p in plans] == [("x-dp4", 4), ("x-dp16", 16)]
    from bayesprism.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["forecast", str(tmp_path / "post.nc"), "--dp", "2,x"])
    assert exit_info.value.code == 2
    assert "comma-separated list" in capsys.readouterr().err


def test_cli_table_lists_every_plan():
    post = gemm_only(draws=10, scales=GEMM_SPREAD)
    fc = forecast(post, [ParallelPlan(name="small", dp=2), ParallelPlan(name="big", dp=512)],
                  draws=10, replicates=2, progress=False)
    table = cli_forecast.format_table(summarize_forecast(fc))
    lines = table.splitlines()
    assert lines[0].split() == ["plan", "GPUs", "step", "median", "step", "90%", "P(>1.05x)",
                                "P(>1.1x)", "P(>1.2x)"]
    assert lines[1].split()[:2] == ["small", "2"] and lines[2].split()[:2] == ["big", "512"]


def test_recorded_path_is_the_one_the_composition_takes_with_measured_nodes():
    """A cluster listing measured nodes makes compose take the exact path (it keeps their
    positions) whatever the scale or ``exact=False`` says; the forecast records that path."""
    post = gemm_only(draws=4, scales={"node": {"gemm": 0.1}},
                     measured_nodes={"fast": 0.0, "slow": 5.0})
    measured = Cluster(nodes=("fast", "slow"))
    with pytest.warns(PlanWarning, match="composed exactly"):
        fc = forecast(post, ParallelPlan(dp=16), draws=None, replicates=2, progress=False,
                      cluster=measured, exact=False)
    assert fc["path"].values.tolist() == ["exact"]
    # the plain cases: by scale, or as asked
    for exact, path in ((None, "exact"), (False, "fast")):
        fc = forecast(post, ParallelPlan(dp=16), draws=None, replicates=2, progress=False,
                      exact=exact)
        assert fc["path"].values.tolist() == [path]


def test_cli_end_to_end_json_and_netcdf(tmp_path, capsys):
    from bayesprism import io
    from bayesprism.cli.main import main

    post_path = tmp_path / "post.nc"
    io.save(gemm_only(draws=20, scales=GEMM_SPREAD), post_path)
    plan_path = tmp_path / "plans.toml"
    plan_path.write_text('[[plan]]\nname = "a"\ndp = 2\n[[plan]]\nname = "b"\ndp = 16\n')
    out_json, out_nc = tmp_path / "fc.json", tmp_path / "fc.nc"
    code = main(["forecast", str(post_path), "--plan", str(plan_path), "--steps", "100",
                 "--draws", "10", "-o", str(out_json), "-o", str(out_nc),
                 "--include-draws", "--quiet"])
    assert code == 0
    summary = json.loads(out_json.read_text())
    assert [p["name"] for p in summary["plans"]] == ["a", "b"]
    assert {"step_time_s", "training_time_s", "draws_s", "slowdown_probability"} <= set(
        summary["plans"][0])
    import xarray as xr

    saved = xr.open_datatree(out_nc)
    assert list(saved["plan"].values) == ["a", "b"]
    assert "median" in capsys.readouterr().out
    code = main(["forecast", str(post_path), "--dp", "0", "--quiet"])
    assert code == 2
    assert "command line: dp: must be a positive integer, got 0" in capsys.readouterr().err


def test_cli_json_is_a_flag_and_the_old_json_path_still_writes_with_a_warning(tmp_path, capsys):
    from bayesprism import io
    from bayesprism.cli.main import main

    post_path = tmp_path / "post.nc"
    io.save(gemm_only(draws=5), post_path)
    common = ["--dp", "2", "--draws", "3", "--replicates", "2"]
    # the flag, after or before the posterior: one JSON object on stdout, nothing on stderr
    for argv in (["forecast", str(post_path), *common, "--json"],
                 ["forecast", "--json", str(post_path), *common]):
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["plans"][0]["name"] and "FutureWarning" not in err
    # the spelling of earlier releases: the file is written, the table printed, a warning said
    old = tmp_path / "old.txt"
    assert main(["forecast", str(post_path), *common, "--json", str(old)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(old.read_text())["plans"] and "median" in out
    assert f"--json {old}: --json is a flag now" in err and f"-o {old}" in err


# ---------------------------------------------------------------------------- real traces
@pytest.mark.slow
def test_traced_plan_forecast_reproduces_the_traced_dlrm_steps(shared_data):
    """Posterior predictive check: forecasting the traced plan reproduces the traced step.

    The 8 DLRM ranks (one host, one clock) are mostly idle on the GPU (~1.3 ms of kernels a
    step) and start their step up to 7.6 ms apart; they synchronise at 8 collectives and all
    end within 0.9 ms. A rank's span (first to last kernel) is therefore not a step time: it
    is short on the ranks that started late (10.97-18.47 ms). The step itself runs from the
    first rank's first kernel to the last rank's end (19.40 ms). The composition draws each
    rank's host idle before each synchronisation from the traced idle and waits for the
    slowest rank at each: it must reproduce the step and how long ranks wait for each other.
    """
    from bayesprism import inference, ingest

    files = sorted((shared_data / "kineto" / "param_dlrm_8rank").glob("*.json.gz"))
    table = ingest.read_traces(files)
    wanted = {"draws": 300, "tune": 300, "chains": 2, "random_seed": 1, "progress": False}
    accepted = inspect.signature(inference.fit).parameters
    posterior = inference.fit(table, **{k: v for k, v in wanted.items() if k in accepted})
    traced = cli_forecast._traced_plan_values(posterior)
    fc = forecast(posterior, ParallelPlan.from_dict(traced), draws=300, replicates=8,
                  progress=False)
    predicted = fc["step_time_s"].values.ravel()
    end = table["start_us"] + table["duration_us"]
    step_s = float(end.max() - table["start_us"].min()) / 1e6  # one step, one host clock
    spans = posterior["inventory"]["traced_step_time_us"].values.ravel() / 1e6
    lo, median, hi = np.quantile(predicted, [0.05, 0.5, 0.95])
    assert median == pytest.approx(step_s, rel=0.10)
    assert lo <= step_s <= hi
    # the spread between ranks: the mean rank waits (inside collectives) as long as traced
    waited_s = table.groupby("rank")["wait_us"].sum().mean() / 1e6
    assert float(fc["wait_s"].mean()) == pytest.approx(waited_s, rel=0.25)
    # a step is never shorter than a rank's span, and the interval is not degenerate
    assert lo >= spans.max() * 0.8 and hi - lo > 0.1 * median


def test_a_forecast_whose_formula_notes_are_garbled_is_refused_in_one_line():
    post = gemm_only(draws=5)
    fc = forecast(post, ParallelPlan(name="p", dp=2), draws=5, replicates=2, progress=False)
    assert summarize_forecast(fc)["plans"][0]["extrapolated"] == []
    ds = fc.to_dataset()
    ds["extrapolated"] = ("plan", np.array(["{not json"]))
    with pytest.raises(InputError, match="extrapolated: plan 'p': not a JSON list of strings"):
        summarize_forecast(ds)
