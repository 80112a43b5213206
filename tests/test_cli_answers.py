"""The planning answer on the command line: forecast flags (steps from tokens, deadlines,
baselines, thresholds) in text and JSON, ``what-if``, ``fit --target-accept``, the warning
summary, and what ``fit`` returns written with ``DataTree.to_netcdf``."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import xarray as xr
from posterior_builders import GEMM_SPREAD, analysis_posterior, gemm_only

from bayesprism.cli._common import (
    format_duration,
    parse_duration,
    parse_number_list,
    summarize_warnings,
)
from bayesprism.cli.main import main
from bayesprism.errors import InputError
from bayesprism.io import save


@pytest.fixture(scope="module")
def gemm_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("post") / "gemm.nc"
    save(gemm_only(draws=20, scales=GEMM_SPREAD), path)
    return path


@pytest.fixture(scope="module")
def traced_path(tmp_path_factory):
    """The analysis fit with a measured step of 50 ms (median of 40, 50 and 70 ms)."""
    tree = analysis_posterior(draws=10)
    inventory = tree["inventory"].to_dataset()
    inventory["traced_step_span_us"] = ("step_unit", [40e3, 50e3, 70e3])
    tree["inventory"] = inventory
    path = tmp_path_factory.mktemp("post") / "traced.nc"
    save(tree, path)
    return path


def run_json(capsys, *argv) -> dict:
    assert main([*map(str, argv), "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


# -- parsing and units ----------------------------------------------------------------------------
def test_durations_parse_with_units_and_print_readably():
    assert parse_duration("36h", "--deadline") == 36 * 3600
    assert parse_duration("14d", "--deadline") == 14 * 86400
    assert parse_duration("90m", "--deadline") == 5400
    assert parse_duration("250ms", "--baseline") == pytest.approx(0.25)
    assert parse_duration("7200", "--deadline") == 7200
    for bad in ("-1h", "soon", "0", "nan", "1e400"):
        with pytest.raises(InputError, match="--deadline"):
            parse_duration(bad, "--deadline")
    assert format_duration(0.0193) == "19.3 ms"
    assert format_duration(19330.0) == "5.37 h"
    assert format_duration(3.0e6) == "34.7 d"
    assert format_duration(45e-6) == "45 µs"
    assert parse_number_list("1.05,10%", "--thresholds", lowest=0.0) == [1.05, 1.1]


# -- forecast -------------------------------------------------------------------------------------
def test_forecast_prints_step_and_training_time_in_readable_units(gemm_path, capsys):
    code = main(["forecast", str(gemm_path), "--dp", "2,64", "--steps", "200000", "--draws",
                 "10", "--deadline", "36h,3m", "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    header, first = out.splitlines()[:2]
    assert "step median" in header and "training median" in header
    assert "P(<=36h)" in header and "P(<=3min)" in header
    assert "P(>1.05x)" in header and "P(>1.2x)" in header
    # a ~1 ms step in ms, 200,000 of them (~3.6 min) in minutes
    assert " ms" in first and " min" in first and "200,000" in first
    assert "e+0" not in out and "e-0" not in out


def test_forecast_says_what_a_plan_takes_from_formulas(gemm_path, capsys):
    # the GEMM fit's traced run is one GPU: tp 8 divides its work, the traced plan itself
    # needs no formula
    assert main(["forecast", str(gemm_path), "--tp", "8", "--draws", "5", "--quiet"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "by formula" in line]
    assert lines == ["dp1-tp8-pp1-m1-1f1b: by formula, not as traced: compute per GPU scaled "
                     "by tp x cp 1 -> 8 (work / 8)"]
    assert main(["forecast", str(gemm_path), "--draws", "5", "--quiet"]) == 0
    assert "by formula" not in capsys.readouterr().out


def test_forecast_names_the_chance_of_a_degraded_link_once_for_all_plans():
    from bayesprism.cli.forecast import format_table

    step = {"p50": 0.4, "p05": 0.39, "p95": 0.43}

    def plan(name, p):
        return {"name": name, "gpus": 8, "step_time_s": step, "slowdown_probability": {},
                "degraded_link_probability": p, "degraded_link": "prior"}

    lines = format_table({"plans": [plan("a", 0.004), plan("b", 0.06), plan("c", 0.2)]})
    links = [line for line in lines.splitlines() if "degraded link" in line]
    assert links == ["P(a node with a degraded link), included above (from the prior: fit "
                     "nccl-tests sweeps of several allocations to learn it): b 0.06, c 0.20"]
    assert "degraded" not in format_table({"plans": [plan("a", 0.004)]})


def test_repeated_dp_flags_all_count(gemm_path, capsys):
    """``--dp 2 --dp 8,64`` forecasts three plans: argparse alone kept the last flag and
    dropped the others without a word."""
    code = main(["forecast", str(gemm_path), "--dp", "2", "--dp", "8,64", "--draws", "5",
                 "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert all(f"dp{dp}-" in out for dp in (2, 8, 64))


def test_forecast_json_carries_deadline_baseline_and_threshold_answers(gemm_path, capsys):
    summary = run_json(capsys, "forecast", gemm_path, "--dp", "2", "--steps", "200000",
                       "--draws", "10", "--deadline", "1h", "--deadline", "2m",
                       "--baseline", "1.2ms", "--thresholds", "0.5,10%")
    plan = summary["plans"][0]
    assert summary["deadlines_s"] == [3600.0, 120.0]
    assert summary["baseline"] == {"kind": "given", "step_time_s": pytest.approx(0.0012)}
    assert plan["baseline_step_time_s"] == pytest.approx(0.0012)
    assert set(plan["slowdown_probability"]) == {"0.50", "1.10"}
    # every ~1 ms step is above 0.5 x 1.2 ms; 200,000 of them take ~3.5 min
    assert plan["slowdown_probability"]["0.50"] == 1.0
    assert plan["finish_probability"] == {"3600": 1.0, "120": 0.0}
    assert plan["training_time_s"]["p50"] == pytest.approx(200_000 * plan["step_time_s"]["mean"],
                                                           rel=0.05)


def test_forecast_baseline_traced_is_the_measured_step(traced_path, capsys):
    summary = run_json(capsys, "forecast", traced_path, "--dp", "4", "--draws", "5",
                       "--replicates", "2", "--baseline", "traced", "--thresholds", "0.1,1.0")
    plan = summary["plans"][0]
    assert summary["baseline"] == {"kind": "traced", "step_time_s": pytest.approx(0.05)}
    assert plan["baseline_step_time_s"] == pytest.approx(0.05)
    # the ~40 ms step is above 0.1 x 50 ms and below 1.0 x 50 ms
    assert plan["slowdown_probability"] == {"0.10": 1.0, "1.00": 0.0}
    main(["forecast", str(traced_path), "--dp", "4", "--draws", "5", "--replicates", "2",
          "--baseline", "traced", "--quiet"])
    assert "the measured step of the traced run (50 ms)" in capsys.readouterr().out


def test_forecast_baseline_by_default_is_the_measured_step_where_there_is_one(
        traced_path, gemm_path, capsys):
    """Issue 19: against each plan's ideal step P(slowdown) reads ~1 for every plan; by default
    the CLI compares with the traced run's measured step, and falls back to the ideal step
    when the posterior records none."""
    traced = run_json(capsys, "forecast", traced_path, "--dp", "4", "--draws", "5",
                      "--replicates", "2")
    assert traced["baseline"] == {"kind": "traced", "step_time_s": pytest.approx(0.05)}
    plain = run_json(capsys, "forecast", gemm_path, "--draws", "5", "--replicates", "2")
    assert plain["baseline"]["kind"] == "ideal"


def test_forecast_steps_from_tokens_and_the_global_batch(gemm_path, capsys):
    summary = run_json(capsys, "forecast", gemm_path, "--tokens", "3e9", "--global-batch",
                       "1024", "--seq-length", "2048", "--draws", "5", "--replicates", "2")
    assert summary["plans"][0]["steps"] == 1431  # ceil(3e9 / (1024 * 2048))
    summary = run_json(capsys, "forecast", gemm_path, "--samples", "1000", "--global-batch",
                       "64", "--draws", "5", "--replicates", "2")
    assert summary["plans"][0]["steps"] == 16


@pytest.mark.parametrize(("argv", "message"), [
    (["--deadline", "36h"], "--deadline: needs --steps"),
    (["--steps", "10", "--deadline", "tomorrow"], "--deadline: expected a positive duration"),
    (["--baseline", "fast"], "--baseline: expected auto, ideal, traced or a step time"),
    (["--baseline", "traced"], "baseline: the posterior records no measured step"),
    (["--thresholds", "1.1,x"], "--thresholds: expected numbers above 0"),
    (["--tokens", "1e9"], "--global-batch: --tokens needs the global batch"),
    (["--tokens", "1e9", "--global-batch", "8"], "--seq-length: --tokens needs"),
    (["--steps", "10", "--samples", "100"], "give one of --steps, --samples and --tokens"),
])
def test_forecast_bad_answers_flags_exit_2_with_one_line(gemm_path, capsys, argv, message):
    assert main(["forecast", str(gemm_path), "--draws", "5", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


# -- what-if --------------------------------------------------------------------------------------
def test_what_if_cli_mirrors_the_python_api(traced_path, tmp_path, capsys):
    from bayesprism.analysis.what_if import what_if
    from bayesprism.io import load
    from bayesprism.plan import ParallelPlan, PlanWarning

    plan_path = tmp_path / "plan.toml"
    plan_path.write_text("dp = 8\ngpus_per_node = 2\n")
    result = run_json(capsys, "what-if", traced_path, "--plan", plan_path, "--faster",
                      "gemm=0.2", "--bandwidth", "allreduce=2", "--draws", "5",
                      "--replicates", "4")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        expected = what_if(load(traced_path), ParallelPlan(dp=8, gpus_per_node=2),
                           {"faster": {"gemm": 0.2}, "bandwidth": {"allreduce": 2.0}},
                           draws=5, replicates=4)
    assert result["changes"] == {"faster": {"gemm": 0.2}, "bandwidth": {"allreduce": 2.0}}
    assert result["deltas"]["mean_s"]["estimate"] == pytest.approx(
        expected["deltas"]["mean_s"]["estimate"])
    assert result["deltas"]["mean_s"]["estimate"] < 0  # 20 % faster GEMMs
    assert main(["what-if", str(traced_path), "--plan", str(plan_path), "--faster", "gemm=0.2",
                 "--draws", "5", "--replicates", "4", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "mean step" in out and " ms" in out
    assert main(["what-if", str(traced_path), "--plan", str(plan_path), "--faster",
                 "gemm=2"]) == 2
    assert "faster.gemm: must be a fraction in [0, 1)" in capsys.readouterr().err


# -- fit --target-accept --------------------------------------------------------------------------
class _Stop(Exception):
    pass


def test_fit_passes_target_accept_to_the_sampler(monkeypatch, tmp_path, capsys):
    from posterior_builders import tiny_kernel_table, tiny_spec

    import bayesprism.inference as inference

    seen = {}

    def fake_sample(model, sampler, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(inference, "_sample", fake_sample)
    with pytest.raises(_Stop):
        inference.fit(tiny_kernel_table(), tiny_spec(), target_accept=0.97, progress=False)
    assert seen["target_accept"] == 0.97
    with pytest.raises(_Stop):
        inference.fit(tiny_kernel_table(), tiny_spec(), progress=False)
    assert seen["target_accept"] == 0.8  # the model's default
    with pytest.raises(InputError, match="target_accept: must be a number in"):
        inference.fit(tiny_kernel_table(), tiny_spec(), target_accept=1.5)
    table = tmp_path / "t.parquet"
    from bayesprism.schema import write_table

    write_table(tiny_kernel_table(), table)
    assert main(["fit", str(table), "-o", str(tmp_path / "p.nc"), "--target-accept", "1"]) == 2
    assert "--target-accept: must be between 0 and 1" in capsys.readouterr().err
    with pytest.raises(_Stop):
        main(["fit", str(table), "-o", str(tmp_path / "p.nc"), "--target-accept", "0.95",
              "--quiet"])
    assert seen["target_accept"] == 0.95


# -- warnings -------------------------------------------------------------------------------------
def test_warning_summary_groups_plans_orders_by_importance_and_says_what_to_do():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("dp8: minor thing", stacklevel=1)
        for plan in ("dp8", "dp64", "dp512"):
            warnings.warn(f"dp{plan[2:]}: the traced run has no TP collectives: TP "
                          "communication is left out", stacklevel=1)
        warnings.warn("dp8: minor thing", stacklevel=1)
    lines = summarize_warnings(caught)
    assert len(lines) == 2
    first = lines[0].splitlines()
    assert first[0] == ("dp8, dp64, dp512: the traced run has no TP collectives: TP "
                        "communication is left out")
    assert first[1].strip().startswith("what to do:")
    assert lines[1] == "dp8: minor thing"


def test_commands_print_each_warning_once_after_the_output(gemm_path, capsys):
    # gemm_only traces no data-parallel collectives: every dp plan warns that they are left out
    assert main(["forecast", str(gemm_path), "--dp", "2,8,64", "--draws", "5",
                 "--replicates", "2"]) == 0
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("data-parallel communication is left out") == 1
    assert "warnings (1):" in err and "what to do:" in err
    assert ".py:" not in err  # no source paths or lines
    tail = err[err.index("warnings (1):") - 1:]
    assert tail.startswith("\n")  # on a line of its own, never after a progress bar
    assert main(["forecast", str(gemm_path), "--dp", "2,8", "--draws", "5", "--replicates",
                 "2", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["forecast", str(gemm_path), "--dp", "2", "--draws", "5", "--replicates", "2",
                 "--json", "-", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["plans"]


# -- ecosystem ------------------------------------------------------------------------------------
def test_fit_result_round_trips_through_datatree_to_netcdf(tmp_path):
    from posterior_builders import fitted

    tree, _ = fitted("pymc")
    path = tmp_path / "plain.nc"
    tree.to_netcdf(path)  # as an xarray user saves, default engine
    back = xr.open_datatree(path)
    np.testing.assert_allclose(back["posterior"]["kernel_log_median"].to_numpy(),
                               tree["posterior"]["kernel_log_median"].to_numpy())
    assert json.loads(back["posterior"].attrs["parameterisation"]) == {"gpu": "centred"}
    assert dict(back.attrs) == dict(tree.attrs)
    from bayesprism.io import load

    assert load(path, expect="posterior").attrs["spec_hash"] == tree.attrs["spec_hash"]


def test_public_api_exports_what_the_readme_uses():
    import bayesprism as bp
    from bayesprism.forecast.forecasting import summarize_forecast

    assert bp.summarize_forecast is summarize_forecast
    assert "summarize_forecast" in dir(bp) and "what_if" in dir(bp)
