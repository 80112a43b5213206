"""The learned step-model prior (``bayesprism.layout_prior``): the shipped file loads with its
provenance, pooling its evidence reproduces it, step fits use it by default, bad files and
command lines are refused cleanly, and refitting a ladder reproduces its evidence (slow)."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest

from bayesprism.errors import InputError
from bayesprism.layout_prior import (
    DEFAULT_PATH,
    EVIDENCE_GRID,
    evidence_from_draws,
    evidence_grid,
    load_layout_prior,
    pool_evidence,
)


def test_the_shipped_prior_loads_with_its_provenance():
    prior = load_layout_prior()
    assert prior.source == str(DEFAULT_PATH)
    assert 1e-4 < math.exp(prior.config_sd_log_mean) < 0.2
    assert 0 < prior.config_sd_log_sd < 3 and 0 < prior.spike_slope_sd < 3
    names = [ladder["name"] for ladder in prior.ladders]
    assert names == ["gpt3-175b-eos-h100", "llama31-8b-hipergator-b200"]
    for ladder in prior.ladders:
        assert ladder["runs"] >= 20 and ladder["layouts"] >= 6
        logs = [f for f in ladder["files"] if "/results/" in f["path"]]
        assert len(logs) == ladder["runs"]  # every result log, with its digest and commit
        assert all(len(f["sha256"]) == 64 and len(f.get("commit", "")) == 40 for f in logs)
        assert len(ladder["config_sd_loglik"]) == EVIDENCE_GRID[2]


def test_pooling_the_shipped_evidence_reproduces_the_prior():
    prior = load_layout_prior()
    again = pool_evidence(prior.ladders)
    assert (again.config_sd_log_mean, again.config_sd_log_sd, again.spike_slope_mean,
            again.spike_slope_sd) == (prior.config_sd_log_mean, prior.config_sd_log_sd,
                                      prior.spike_slope_mean, prior.spike_slope_sd)
    assert json.loads(again.to_json())["ladders"] == list(prior.ladders)


def test_pooling_follows_agreeing_ladders_and_widens_for_disagreeing_ones():
    rng = np.random.default_rng(0)

    def ladder(log_sd: float, slope: float) -> dict:
        return evidence_from_draws(rng.normal(log_sd, 0.3, 4000), rng.normal(slope, 0.1, 4000))

    agree = pool_evidence([ladder(-4.0, 0.5), ladder(-4.1, 0.6), ladder(-3.9, 0.5)])
    assert agree.config_sd_log_mean == pytest.approx(-4.0, abs=0.3)
    assert agree.spike_slope_mean == pytest.approx(0.53, abs=0.15)
    apart = pool_evidence([ladder(-5.5, -0.5), ladder(-3.0, 1.5)])
    assert apart.config_sd_log_sd > 1.5 * agree.config_sd_log_sd
    assert apart.spike_slope_sd > 2 * agree.spike_slope_sd
    # a flat posterior says nothing: the evidence is flat and the slope carries no likelihood
    flat = evidence_from_draws(rng.uniform(evidence_grid()[0], 0.0, 20000),
                               rng.normal(0.0, 2.0, 20000))
    assert np.ptp(flat["config_sd_loglik"][5:-5]) < 0.3 and flat["spike_slope_lik"] is None


def test_step_fits_use_the_learned_prior_by_default_and_note_it():
    from test_step_model import synthetic_ladder

    from bayesprism.model import prepare
    from bayesprism.model.step import resolve_layout_prior
    from bayesprism.spec import ModelSpec

    spec = ModelSpec.load("step")
    prepared = prepare(synthetic_ladder(2, 5), spec)
    used = json.loads(prepared.attrs["layout_prior"])
    prior = load_layout_prior()
    assert used["kind"] == "lognormal"
    assert used["config_sd"] == [prior.config_sd_log_mean, prior.config_sd_log_sd]
    assert used["spike_slope"] == [prior.spike_slope_mean, prior.spike_slope_sd]
    assert any("learned (ladders: gpt3-175b-eos-h100" in n for n in prepared.summary["notes"])
    builtin = dataclasses.replace(spec, step={"layout_prior": "builtin"})
    assert resolve_layout_prior(builtin)["kind"] == "gamma"
    with pytest.raises(InputError, match=r"step\.layout_prior: names no file"):
        resolve_layout_prior(dataclasses.replace(spec, step={"layout_prior": "nope.json"}))


def test_one_microbatch_count_is_said_in_the_notes_and_the_forecast():
    from test_step_model import LADDER, _Plan, synthetic_ladder

    from bayesprism.forecast.stepscale import SeparabilityWarning, compose_steps
    from bayesprism.model import prepare
    from bayesprism.spec import ModelSpec

    spec = ModelSpec.load("step")
    same = [(w, dp, pp, 4) for w, dp, pp, _ in LADDER[:2]]
    notes = prepare(synthetic_ladder(2, 5, ladder=same), spec).summary["notes"]
    assert any("cannot separate per-micro-batch from per-step cost" in n for n in notes)
    varied = prepare(synthetic_ladder(2, 5), spec).summary["notes"]
    assert not any("cannot separate" in n for n in varied)

    import xarray as xr

    names = ("mb_log_median", "work_exponent", "bubble_efficiency", "rank_sigma",
             "comm_latency", "comm_intra", "comm_inter", "run_sd", "slot_noise", "step_noise")
    ds = xr.Dataset({n: (("chain", "draw"), np.full((1, 4), v)) for n, v in
                     zip(names, (-3.0, 1.0, 1.0, 0.01, 1e-4, 0.02, 0.1, 0.003, 0.01, 0.005),
                         strict=True)},
                    attrs={"model_kind": "step", "reference_work": 1.0,
                           "fitted_microbatches": "[4]"})
    with pytest.warns(SeparabilityWarning, match="cannot separate"):
        compose_steps(ds, _Plan(dp=64, pp=2, microbatches=8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SeparabilityWarning)
        compose_steps(ds, _Plan(dp=64, pp=2, microbatches=4))


def test_bad_prior_files_are_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(InputError, match="is not JSON"):
        load_layout_prior(bad)
    body = json.loads(DEFAULT_PATH.read_text())
    body["prior"]["config_sd_log_sd"] = -1.0
    bad.write_text(json.dumps(body))
    with pytest.raises(InputError, match=r"prior\.config_sd_log_sd: must be > 0"):
        load_layout_prior(bad)


def test_cli_refuses_bad_input_with_one_line_and_exit_2(tmp_path, capsys):
    from bayesprism.cli.main import main

    code = main(["learn-prior", str(tmp_path / "missing"), "-o", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("error:")] == \
        [f"error: {tmp_path / 'missing'}: no such file or folder"]
    code = main(["learn-prior", f"a={tmp_path}", "--layout", "b:virtual_stages=12", "-o",
                 str(tmp_path / "p.json")])
    assert code == 2 and "--layout: names no ladder, got 'b'" in capsys.readouterr().err


@pytest.mark.slow
def test_refitting_a_shipped_ladder_reproduces_its_evidence(shared_data, tmp_path):
    """One call refits the Llama 3.1 8B ladder (about a minute) and writes a prior whose
    evidence for it matches the shipped one; pooled with the shipped GPT-3 evidence it gives
    the shipped prior (within the sampler's Monte Carlo error)."""
    from bayesprism.learn_prior import learn_layout_prior

    folder = shared_data / "mlperf/training_results_v5.1"
    if not folder.exists():
        pytest.skip("no shared MLPerf data")
    shipped = {ladder["name"]: ladder for ladder in load_layout_prior().ladders}
    name = "llama31-8b-hipergator-b200"
    refit = learn_layout_prior({name: [folder]}, output=tmp_path / "prior.json",
                               random_seed=0)
    assert load_layout_prior(tmp_path / "prior.json").ladders[0]["name"] == name
    new, old = refit.ladders[0], shipped[name]
    assert [f["sha256"] for f in new["files"]] == [f["sha256"] for f in old["files"]]
    grid = evidence_grid()

    def moments(loglik):
        w = np.exp(np.asarray(loglik))
        w /= w.sum()
        mean = float(np.sum(w * grid))
        return mean, float(np.sqrt(np.sum(w * grid**2) - mean**2))

    np.testing.assert_allclose(moments(new["config_sd_loglik"]),
                               moments(old["config_sd_loglik"]), atol=0.1)
    np.testing.assert_allclose(new["spike_slope_lik"], old["spike_slope_lik"], atol=0.05)
    pooled = pool_evidence([shipped["gpt3-175b-eos-h100"], new])
    prior = load_layout_prior()
    assert pooled.config_sd_log_mean == pytest.approx(prior.config_sd_log_mean, abs=0.1)
    assert pooled.spike_slope_mean == pytest.approx(prior.spike_slope_mean, abs=0.05)


def test_a_stated_leaf_switch_size_adds_a_cost_tier_beyond_it():
    import xarray as xr
    from test_step_model import LADDER, _Plan, synthetic_ladder

    from bayesprism.forecast.stepscale import compose_steps
    from bayesprism.model import build, prepare
    from bayesprism.spec import ModelSpec

    # 16-64 GPUs, pp = 2: gradient groups of dp = 8, 16, 32 ranks on 1, 2 and 4 nodes
    table = synthetic_ladder(2, 5, ladder=LADDER[:3])
    for meta in table.attrs["runs"].values():
        meta["nodes_per_leaf"] = 2
    prepared = prepare(table, ModelSpec.load("step"))
    crossing = prepared.data["leaf_bandwidth"] > 0
    runs = prepared.coords["run"]
    assert crossing.tolist() == [r.startswith("n64/") for r in runs]
    assert "comm_leaf" in build(prepared, ModelSpec.load("step")).named_vars

    names = ("mb_log_median", "work_exponent", "bubble_efficiency", "rank_sigma",
             "comm_latency", "comm_intra", "comm_inter", "run_sd", "slot_noise", "step_noise")
    ds = xr.Dataset({n: (("chain", "draw"), np.full((1, 200), v)) for n, v in
                     zip(names, (-3.0, 1.0, 1.0, 0.01, 1e-4, 0.02, 0.1, 0.003, 0.01, 0.005),
                         strict=True)},
                    attrs={"model_kind": "step", "reference_work": 1.0})

    @dataclasses.dataclass
    class LeafPlan(_Plan):
        nodes_per_leaf: int | None = None

    def median(plan) -> float:
        return float(np.median(compose_steps(ds, plan).exposed_comm_s))

    inside = median(LeafPlan(dp=128, pp=1, microbatches=4, nodes_per_leaf=16))
    assert inside == pytest.approx(median(_Plan(dp=128, pp=1, microbatches=4)))
    beyond = median(LeafPlan(dp=256, pp=1, microbatches=4, nodes_per_leaf=16))
    assert beyond > 1.5 * median(_Plan(dp=256, pp=1, microbatches=4))
    with pytest.raises(InputError, match="nodes_per_leaf: must be a positive integer"):
        compose_steps(ds, LeafPlan(dp=256, pp=1, microbatches=4, nodes_per_leaf=0))


def test_the_leaf_switch_size_can_be_stated_as_a_layout_fact_and_in_a_plan(tmp_path):
    # `--layout nodes_per_leaf=N` reaches the runs the step model reads it from; a plan file
    # carries it to the forecast, and a nonsense value is refused at the boundary
    from test_step_model import LADDER, synthetic_ladder

    from bayesprism.ingest.layout import check_layout, table_with_layout
    from bayesprism.model.step import leaf_sizes
    from bayesprism.plan import ParallelPlan, PlanError

    table = synthetic_ladder(2, 5, ladder=LADDER[:2])
    stated = table_with_layout(table, check_layout({"nodes_per_leaf": 16}))
    runs = list(stated.attrs["runs"])
    assert leaf_sizes(stated.attrs["runs"], runs).tolist() == [16] * len(runs)
    (tmp_path / "plan.toml").write_text("dp = 256\nnodes_per_leaf = 16\n")
    (plan,) = ParallelPlan.from_toml(tmp_path / "plan.toml")
    assert plan.nodes_per_leaf == 16
    with pytest.raises(PlanError, match="nodes_per_leaf: must be a positive integer"):
        ParallelPlan(dp=2, nodes_per_leaf=0)
