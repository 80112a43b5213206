"""MLPerf Training log reader: both public scale ladders against the numbers in the data README."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bayesprism.errors import TraceFormatError
from bayesprism.ingest.mlperf import can_read, read_mlperf
from bayesprism.schema import validate_table

GPT3 = "mlperf/training_results_v3.1/NVIDIA/results"
LLAMA = "mlperf/training_results_v5.1/University-of-Florida/results"

# system folder: nodes, GPUs, DP, global batch, micro-batches, (min, max) steps per run, median s
GPT3_LADDER = {
    "eos_n64_ngc23.09_nemo": (64, 512, 16, 2048, 128, (288, 288), 11.05),
    "eos_n96_ngc23.09_nemo": (96, 768, 24, 3072, 128, (200, 200), 11.08),
    "eos-dfw_n512_ngc23.09_nemo": (512, 4096, 128, 2048, 16, (288, 288), 1.609),
    "eos-dfw_n768_ngc23.09_nemo": (768, 6144, 192, 3072, 16, (200, 200), 1.615),
    "eos-dfw_n1024_ngc23.09_nemo": (1024, 8192, 256, 4096, 16, (156, 162), 1.619),
    "eos-dfw_n1280_ngc23.09_nemo": (1280, 10240, 320, 2560, 8, (230, 230), 0.926),
    "eos-dfw_n1344_ngc23.09_nemo": (1344, 10752, 336, 2688, 8, (220, 220), 0.930),
}
# system folder: nodes, GPUs, (tp, pp, cp), DP, global batch, (min, max) steps, median s
LLAMA_LADDER = {
    "hpg.dgxb200x8.n1": (1, 8, (1, 1, 1), 8, 16, (312, 312), 0.544),
    "hpg.dgxb200x8.n2": (2, 16, (1, 1, 1), 16, 32, (192, 192), 0.574),
    "hpg.dgxb200x8.n4": (4, 32, (1, 1, 2), 16, 16, (324, 336), 0.188),
    "hpg.dgxb200x8.n8": (8, 64, (1, 1, 2), 32, 32, (168, 180), 0.189),
    "hpg.dgxb200x8.n16": (16, 128, (1, 1, 2), 64, 64, (108, 120), 0.193),
    "hpg.dgxb200x8.n32": (32, 256, (1, 1, 2), 128, 128, (84, 84), 0.221),
}


def _read_scale(folder: Path) -> tuple[list[pd.DataFrame], list[dict]]:
    tables, reports = [], []
    for log in sorted(folder.glob("result_*.txt.gz")):
        df, report = read_mlperf(log)
        tables.append(df)
        reports.append(report)
    return tables, reports


def _median_without_first(tables: list[pd.DataFrame]) -> float:
    kept = [t.sort_values("step")["duration_us"].to_numpy()[1:] for t in tables]
    return float(np.median(np.concatenate(kept))) / 1e6


@pytest.mark.parametrize("system", list(GPT3_LADDER))
def test_gpt3_ladder_matches_readme(shared_data, system):
    nodes, gpus, dp, gbs, micro, (lo, hi), median = GPT3_LADDER[system]
    tables, reports = _read_scale(shared_data / GPT3 / system / "gpt3")
    assert len(tables) == 3
    for df, report in zip(tables, reports, strict=True):
        meta = report["run_meta"]
        assert report["run"].startswith(f"{system}/gpt3/result_")
        assert (meta["nodes"], meta["world_size"], meta["gpus_per_node"]) == (nodes, gpus, 8)
        assert meta["plan"]["dp"] == dp and meta["plan"]["tp"] == 4 and meta["plan"]["pp"] == 8
        assert meta["global_batch"] == gbs and meta["plan"]["microbatches"] == micro
        assert meta["platform"] == "NVIDIA H100-SXM5-80GB"
        assert lo <= len(df) <= hi
        assert report["skipped"] == {}
        # GPT-3 logs count tokens in metadata.step: steps become 0, 1, 2, ...
        assert df["step"].tolist() == list(range(len(df)))
        assert set(df["kernel"]) == {"train_step"} and set(df["kernel_class"]) == {"step"}
        assert (df["rank"] == -1).all() and (df["gpu"] == -1).all() and (df["node"] == "*").all()
        validate_table(df)
    assert _median_without_first(tables) == pytest.approx(median, rel=0.01)


@pytest.mark.parametrize("system", list(LLAMA_LADDER))
def test_llama_ladder_matches_readme(shared_data, system):
    nodes, gpus, (tp, pp, cp), dp, gbs, (lo, hi), median = LLAMA_LADDER[system]
    tables, reports = _read_scale(shared_data / LLAMA / system / "llama31_8b")
    assert len(tables) == 10
    for df, report in zip(tables, reports, strict=True):
        meta = report["run_meta"]
        plan = meta["plan"]
        assert (meta["nodes"], meta["world_size"]) == (nodes, gpus)
        assert (plan["tp"], plan["pp"], plan["cp"], plan["dp"]) == (tp, pp, cp, dp)
        assert meta["global_batch"] == gbs and plan["microbatches"] == 1
        assert lo <= len(df) <= hi
        # every 32nd step, as logged (LOG_EVERY_N_STEPS=32)
        assert df["step"].iloc[0] == 31 and (np.diff(df["step"]) == 32).all()
        # the per-block train_step_time entries have no metadata.step: skipped and counted
        assert report["skipped"]["train_step_time without metadata.step (per-block summary)"] > 0
    assert _median_without_first(tables) == pytest.approx(median, rel=0.01)


def test_metadata_sources_and_config_quirk(shared_data):
    log = shared_data / GPT3 / "eos_n64_ngc23.09_nemo" / "gpt3" / "result_0.txt.gz"
    _, report = read_mlperf(log)
    sources = [Path(s).name for s in report["run_meta"]["source_files"]]
    assert sources[:3] == [
        "result_0.txt.gz",
        "config_DGXH100_64x8x192x4x8_mbs1.sh",
        "eos_n64_ngc23.09_nemo.json",
    ]
    assert "config_common.sh" in sources and "config_fp8.sh" in sources
    # MINIBS=192 in the config disagrees with the logged global batch: the log wins, noted.
    assert any("global batch: log says 2048" in n for n in report["notes"])


def test_can_read_sniffs_mllog():
    assert can_read(Path("x.txt"), b'garbage\n:::MLLOG {"key": "run_start"}\n')
    assert not can_read(Path("x.txt"), b'{"traceEvents": []}')


def _write_log(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _ev(key, value=None, **meta) -> str:
    import json

    event = {
        "time_ms": meta.pop("time_ms", 0),
        "event_type": "POINT_IN_TIME",
        "key": key,
        "value": value,
        "metadata": meta,
    }
    return ":::MLLOG " + json.dumps(event)


def test_hand_written_log_outside_repo_layout(tmp_path):
    log = _write_log(
        tmp_path / "myrun.txt",
        [
            "some other output",
            _ev("global_batch_size", 8),
            _ev("tracked_stats", {"train_step_time": 0.5}, step=3),
            _ev("tracked_stats", {"train_step_time": float("nan")}, step=4),
            _ev("tracked_stats", {"train_step_time": 0.25}, step=5),
            _ev("tracked_stats", {"train_step_time": 0.3}),
            ":::MLLOG {not json",
        ],
    )
    df, report = read_mlperf(log)
    assert report["run"] == f"{tmp_path.name}/myrun"
    assert df["step"].tolist() == [3, 5]
    assert df["duration_us"].tolist() == [500_000.0, 250_000.0]
    assert report["skipped"] == {
        "step time is missing, non-finite or <= 0": 1,
        "train_step_time without metadata.step (per-block summary)": 1,
        "unparseable :::MLLOG line": 1,
    }
    assert report["run_meta"]["global_batch"] == 8


def test_block_times_when_no_step_timing(tmp_path):
    log = _write_log(
        tmp_path / "result_0.txt",
        [
            _ev("block_start", time_ms=1000),
            _ev("block_stop", time_ms=3500),
            _ev("block_start", time_ms=4000),
            _ev("block_stop", time_ms=5000),
        ],
    )
    df, report = read_mlperf(log)
    assert df["kernel"].tolist() == ["train_block", "train_block"]
    assert df["duration_us"].tolist() == [2_500_000.0, 1_000_000.0]
    assert any("training blocks" in n for n in report["notes"])


def test_errors_name_the_file(tmp_path):
    empty = _write_log(tmp_path / "empty.txt", ["hello"])
    with pytest.raises(TraceFormatError, match=r"empty\.txt: :::MLLOG: no :::MLLOG lines"):
        read_mlperf(empty)
    no_timing = _write_log(tmp_path / "nt.txt", [_ev("global_batch_size", 8)])
    with pytest.raises(TraceFormatError, match=r"nt\.txt: tracked_stats: no train_step_time"):
        read_mlperf(no_timing)
    truncated = tmp_path / "cut.txt.gz"
    truncated.write_bytes(gzip.compress(b":::MLLOG {}\n" * 1000)[:60])
    with pytest.raises(TraceFormatError, match=r"cut\.txt\.gz: truncated gzip"):
        read_mlperf(truncated)


def test_shipped_gpt3_ladder(package_data):
    results = package_data / GPT3
    logs = sorted(results.glob("*/gpt3/result_*.txt.gz"))
    assert len(logs) == 21
    plans = {}
    for log in logs:
        _, report = read_mlperf(log)
        meta = report["run_meta"]
        plans[meta["world_size"]] = (meta["plan"]["dp"], meta["plan"]["microbatches"])
    assert plans == {v[1]: (v[2], v[4]) for v in GPT3_LADDER.values()}


def test_config_env_follows_sources_and_ignores_conditionals(tmp_path):
    from bayesprism.ingest.mlperf import _read_config_env

    impl = tmp_path / "impl"
    (impl / "a").mkdir(parents=True)
    (impl / "common").mkdir()
    (impl / "common" / "config_common.sh").write_text(
        'export MICRO_BATCH_SIZE=2\n: "${CONTEXT_PARALLEL:=1}"\n'
    )
    config = impl / "a" / "config_X_2x8x4xtp2pp1cp2.sh"
    config.write_text(
        "source $(dirname ${BASH_SOURCE[0]})/config_common.sh\n"
        "export TENSOR_MODEL_PARALLEL=2   # comment\n"
        'export DGXNNODES="${DGXNNODES:-2}"\n'
        'if [[ "${X:-0}" == "1" ]]; then\n  export TENSOR_MODEL_PARALLEL=8\nfi\n'
        "if [[ 1 ]]; then export MINIBS=99; fi\n"
        "export MICRO_BATCH_SIZE=1\n"
        "export DGXSYSTEM=$(basename $(readlink -f ${BASH_SOURCE[0]}))\n"
    )
    sources: list[str] = []
    env = _read_config_env(config, sources)
    assert env == {
        "MICRO_BATCH_SIZE": "1",
        "CONTEXT_PARALLEL": "1",
        "TENSOR_MODEL_PARALLEL": "2",
        "DGXNNODES": "2",
    }
    assert sources == [str(impl / "common" / "config_common.sh")]


def test_user_layout_overrides_with_provenance(shared_data):
    """NVIDIA's GPT-3 logs and configs do not record the interleaving: the user states it."""
    from bayesprism.ingest import read_traces
    from bayesprism.plan import plan_from_run

    folder = shared_data / GPT3 / "eos_n64_ngc23.09_nemo"
    table = read_traces([folder], progress=False, layout={"virtual_stages": "12", "tp": 8})
    meta = next(iter(table.attrs["runs"].values()))
    # tp 8 (user) instead of 4 (config): dp re-derived from 512 GPUs / (8 * 8)
    assert meta["plan"]["virtual_stages"] == 12 and meta["plan"]["tp"] == 8
    assert meta["plan"]["dp"] == 8
    assert meta["layout_sources"]["virtual_stages"] == "user"
    assert meta["layout_sources"]["tp"] == "user"
    assert meta["layout_sources"]["pp"] == "config"
    assert meta["layout_sources"]["microbatches"] == "log"
    assert "TP: user says 8, config says 4; using 8 (user)" in table.attrs["notes"]
    plan = plan_from_run(meta)
    assert (plan.virtual_stages, plan.schedule, plan.dp) == (12, "interleaved-1f1b", 8)
    plain = read_traces([folder], progress=False)
    assert "virtual_stages" not in next(iter(plain.attrs["runs"].values()))["plan"]


def test_layout_keys_and_values_are_checked():
    from bayesprism.errors import InputError
    from bayesprism.ingest.layout import check_layout, parse_layout_args

    assert parse_layout_args(["virtual_stages=12", "schedule=zero-bubble", "overlap=0.5",
                              "micro_batch_size=2.0"]) == {
        "virtual_stages": 12, "schedule": "zero-bubble", "overlap": 0.5, "micro_batch_size": 2}
    with pytest.raises(InputError) as err:
        parse_layout_args(["virtual=12", "tp=0", "pp", "overlap=2", "tp=1", "dp=two"])
    assert err.value.lines() == [
        "--layout: pp: expected KEY=VALUE, e.g. virtual_stages=12",
        "--layout: tp: is given twice, got 'tp=1'",
        "--layout: virtual: unknown layout key; allowed: dp, tp, pp, cp, ep, "
        "microbatches, virtual_stages, micro_batch_size, gpus_per_node, nodes_per_leaf, "
        "schedule, sharding, "
        "overlap",
        "--layout: dp: must be a positive integer, got 'two'",
        "--layout: tp: must be a positive integer, got 0",
        "--layout: overlap: must be a fraction between 0 and 1, got 2",
    ]
    for layout, message in (
            ({"schedule": "2f2b"}, "layout: schedule: unknown schedule; allowed: gpipe, 1f1b"),
            ({"virtual_stages": 1.5}, "layout: virtual_stages: must be a positive integer, "
             "got 1.5"),
            ({"pp": True}, "layout: pp: must be a positive integer, got True"),
            ({"micro_batch_size": "inf"}, "layout: micro_batch_size: must be a positive "
             "number, got 'inf'")):
        with pytest.raises(InputError) as err:
            check_layout(layout)
        assert err.value.lines()[0].startswith(message)


def test_layout_values_are_checked_as_plan_fields_are():
    """One range check: every value check_layout refuses, ParallelPlan refuses with the same
    words, and every value it accepts makes a valid plan field."""
    from bayesprism.errors import InputError
    from bayesprism.ingest.layout import check_layout
    from bayesprism.plan import ParallelPlan, PlanError

    bad = {"tp": 0, "micro_batch_size": -1, "overlap": 1.5, "sharding": "zero4"}
    for key, value in bad.items():
        with pytest.raises(InputError) as layout_err:
            check_layout({key: value}, source="s")
        with pytest.raises(PlanError) as plan_err:
            ParallelPlan.from_dict({key: value}, source="s")
        assert layout_err.value.lines() == plan_err.value.lines()
    good = check_layout({"tp": "2", "micro_batch_size": "0.5", "overlap": "1", "ep": 1.0})
    assert good == {"tp": 2, "micro_batch_size": 0.5, "overlap": 1, "ep": 1}
    assert ParallelPlan(dp=2, **good).gpus == 4


def test_layout_applies_to_runs_of_every_kind_of_input(tmp_path, shared_data):
    """apply_layout by hand; read_inputs gives the facts to a Parquet table's runs and to the
    runs of raw logs alike (provenance "user"), without changing the rows."""
    from bayesprism.ingest import read_inputs
    from bayesprism.ingest.layout import apply_layout
    from bayesprism.schema import empty_attrs, write_table

    notes: list[str] = []
    meta = apply_layout({"world_size": 64, "plan": {"dp": 64, "tp": 1}},
                        {"tp": 4, "virtual_stages": 2}, notes)
    assert meta["plan"] == {"dp": 16, "tp": 4, "virtual_stages": 2,
                            "schedule": "interleaved-1f1b"}
    assert meta["layout_sources"] == {"tp": "user", "virtual_stages": "user"}
    assert notes == ["tp: the run records 1, the user states 4; using 4"]
    df = pd.DataFrame({"run": ["a"] * 3, "step": [0, 1, 2], "rank": -1, "node": "*", "gpu": -1,
                       "kernel": "train_step", "kernel_class": "step",
                       "duration_us": [1.0, 2.0, 3.0]})
    df = validate_table(df)
    df.attrs = {**empty_attrs(), "runs": {"a": {"world_size": 8, "plan": {"dp": 8}}}}
    path = write_table(df, tmp_path / "t.parquet")
    log = shared_data / GPT3 / "eos_n64_ngc23.09_nemo" / "gpt3" / "result_0.txt.gz"
    table, logs = read_inputs([path, log], layout={"pp": 2}, progress=False)
    assert table.attrs["runs"]["a"]["plan"] == {"dp": 4, "pp": 2}
    assert table.attrs["runs"]["a"]["layout_sources"] == {"pp": "user"}
    assert table["duration_us"].tolist() == [1.0, 2.0, 3.0]
    (meta,) = logs.attrs["runs"].values()
    # 512 GPUs, tp 4 from the config, pp 2 stated: dp = 512 / 8
    assert meta["plan"]["pp"] == 2 and meta["plan"]["dp"] == 64
    assert meta["layout_sources"]["pp"] == "user"
