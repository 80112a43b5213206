"""A traced 3D-parallel job: layout, rank coordinates, collective roles, pipeline schedule and
kernel signatures read from the traces (issue: "Read a traced 3D-parallel job")."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from job_traces import write_job

import bayesprism as bp
from bayesprism.errors import InputError
from bayesprism.ingest.groups import Group, GroupUsage, description_dimension, fallback_dimensions
from bayesprism.ingest.pipeline import infer_schedule, message_instances, schedule_ops
from bayesprism.ingest.signatures import SignatureStats, signature_map

COLLECTIVES = ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv"]


@pytest.fixture(scope="module")
def dev(shared_data):
    folder = shared_data / "simulated" / "megatron-3d-dev"
    table = bp.read_traces([folder / "traces"], progress=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    return table, manifest


def _meta(table):
    (meta,) = table.attrs["runs"].values()
    return meta


# ------------------------------------------------------------------ the dev traces
def test_dev_layout_read_from_traces(dev):
    table, _ = dev
    meta = _meta(table)
    plan, sources = meta["plan"], meta["layout_sources"]
    assert {k: plan[k] for k in ("tp", "pp", "dp", "microbatches", "schedule")} == {
        "tp": 8, "pp": 4, "dp": 2, "microbatches": 8, "schedule": "1f1b"}
    assert {sources[k] for k in ("tp", "pp", "dp", "microbatches", "schedule")} == {"trace"}
    assert meta["rank_coordinates"] == {"order": ["tp", "dp", "pp"],
                                        "strides": {"tp": 1, "dp": 8, "pp": 16},
                                        "exceptions": 0}


def test_dev_rank_coordinates_match_manifest(dev):
    table, manifest = dev
    truth = pd.DataFrame(manifest["traced_run"]["trace_files"]).set_index("rank")
    got = table.groupby("rank")[["tp_rank", "pp_stage", "dp_rank", "node"]].first()
    assert len(got) == 64
    for column in ("tp_rank", "pp_stage", "dp_rank"):
        assert (got[column].astype(int) == truth.loc[got.index, column]).all(), column
    assert (got["node"].astype(str) == truth.loc[got.index, "hostname"]).all()


def test_dev_every_collective_has_a_role_and_a_split(dev):
    table, _ = dev
    coll = table["kernel_class"].astype(str).isin(COLLECTIVES)
    roles = table.loc[coll, "role"]
    assert roles.notna().all()
    counts = roles.value_counts()
    assert set(counts[counts > 0].index) == {"tp", "pp", "dp", "global"}
    assert table.attrs["skipped"] == {}
    # pipeline send/recv pairs are matched across stages: every collective has its split
    assert table.loc[coll, "transfer_us"].notna().all()
    pp = table.loc[coll & (table["role"] == "pp")]
    assert (pp["group_size"] == 2).all()
    dp = table.loc[coll & (table["role"] == "dp")]
    assert set(dp["kernel_class"].astype(str)) == {"reducescatter", "allgather"}
    assert _meta(table)["plan"]["sharding"] == "zero1"


def test_dev_microbatches_and_phases(dev):
    table, _ = dev
    compute = table[table["kernel_class"].astype(str) == "attention"]
    assert set(compute["microbatch"].dropna().astype(int)) == set(range(8))
    phases = set(compute["phase"].dropna().astype(str))
    assert {"forward", "backward"} <= phases
    adam = table[table["kernel_class"].astype(str) == "optimizer"]
    assert (adam["phase"].astype(str) == "optimizer").all()


def test_dev_gemm_signatures_have_small_residuals(dev):
    table, _ = dev
    gemm = table[table["kernel_class"].astype(str) == "gemm"].copy()
    gemm["y"] = np.log(gemm["duration_us"])

    def within_cell_sd(key: str) -> float:
        cell_mean = gemm.groupby([key, "rank", "step"], observed=True)["y"].transform("mean")
        return float((gemm["y"] - cell_mean).std())

    assert within_cell_sd("kernel") > 0.3  # one name, many shapes
    assert within_cell_sd("signature") < 0.03
    n_signatures = gemm["signature"].nunique()
    assert gemm["kernel"].nunique() < n_signatures <= 40


# ------------------------------------------------------------------ hand-written jobs
@pytest.mark.parametrize("names", ["megatron", "mesh", "none"])
def test_small_job_layout(tmp_path, names):
    write_job(tmp_path, tp=2, pp=2, dp=2, microbatches=4, names=names,
              describe_kernels=names != "none")
    table = bp.read_traces([tmp_path], progress=False)
    meta = _meta(table)
    plan, sources = meta["plan"], meta["layout_sources"]
    assert (plan["tp"], plan["pp"], plan["dp"], plan["microbatches"], plan["schedule"]) == (
        2, 2, 2, 4, "1f1b")
    expected = "inferred" if names == "none" else "trace"
    assert sources["tp"] == sources["dp"] == expected
    assert sources["microbatches"] == "trace"
    coords = table.groupby("rank")[["tp_rank", "dp_rank", "pp_stage"]].first().astype(int)
    for rank, row in coords.iterrows():
        assert rank == row["tp_rank"] + 2 * row["dp_rank"] + 4 * row["pp_stage"]
    coll = table["kernel_class"].astype(str).isin(COLLECTIVES)
    assert table.loc[coll, "role"].notna().all()
    assert table.loc[coll, "transfer_us"].notna().all()
    # two shapes under one GEMM name: two signatures
    gemm = table[table["kernel"].astype(str) == "gemm_bf16_kernel"]
    assert gemm["signature"].nunique() == 4  # 100/300 µs forward, 200/600 µs backward


def test_gpipe_is_recognised(tmp_path):
    write_job(tmp_path, tp=1, pp=4, dp=1, microbatches=6, schedule="gpipe")
    plan = _meta(bp.read_traces([tmp_path], progress=False))["plan"]
    assert (plan["pp"], plan["schedule"], plan["microbatches"]) == (4, "gpipe", 6)


def test_user_layout_wins_and_disagreement_is_noted(tmp_path):
    write_job(tmp_path)
    table = bp.read_traces([tmp_path], progress=False, layout={"microbatches": 8})
    meta = _meta(table)
    assert meta["plan"]["microbatches"] == 8
    assert meta["layout_sources"]["microbatches"] == "user"
    assert any("the traces say 4" in n and "user states 8" in n for n in table.attrs["notes"])


def test_inconsistent_groups_across_ranks_is_an_error(tmp_path):
    def edit(rank, trace):
        if rank == 3:  # rank 3 claims its TP group is ranks 2 and 3 ... and 1
            for g in trace["distributedInfo"]["pg_config"]:
                if g["pg_desc"] == "TENSOR_MODEL_PARALLEL_GROUP":
                    g["ranks"] = [1, 2, 3]
            for ev in trace["traceEvents"]:
                if ev.get("args", {}).get("Process Group Ranks") == "[2, 3]":
                    ev["args"]["Process Group Ranks"] = "[1, 2, 3]"
    write_job(tmp_path, edit=edit, describe_kernels=False)
    with pytest.raises(InputError) as err:
        bp.read_traces([tmp_path], progress=False)
    text = str(err.value)
    assert "host0_1003" in text and "pg_config" in text and "inconsistent groups" in text


def test_nccl_args_of_the_wrong_type_are_read_not_a_traceback(tmp_path):
    # a list where the profiler writes a count: the launch keeps no bytes, the rest reads on
    def edit(rank, trace):
        for ev in trace["traceEvents"]:
            if "In msg nelems" in ev.get("args", {}):
                ev["args"]["In msg nelems"] = [1, 2]
                ev["args"]["Out msg nelems"] = [1, 2]
    write_job(tmp_path, edit=edit)
    table = bp.read_traces([tmp_path], progress=False)
    collectives = table["role"].notna()
    assert collectives.any() and table.loc[collectives, "bytes"].isna().all()
    assert table.loc[collectives, "group_size"].notna().all()


def test_rank_missing_from_its_group_is_an_error(tmp_path):
    def edit(rank, trace):
        if rank == 5:  # rank 5's own trace drops its data-parallel group
            trace["distributedInfo"]["pg_config"] = [
                g for g in trace["distributedInfo"]["pg_config"]
                if g["pg_desc"] != "DATA_PARALLEL_GROUP"]
            for ev in trace["traceEvents"]:
                args = ev.get("args", {})
                if args.get("Process Group Description") == "DATA_PARALLEL_GROUP":
                    args.pop("Process Group Ranks")
    write_job(tmp_path, edit=edit)
    with pytest.raises(InputError) as err:
        bp.read_traces([tmp_path], progress=False)
    assert "host1_1005" in str(err.value) and "missing from its group" in str(err.value)


def test_group_without_the_rank_is_an_error(tmp_path):
    def edit(rank, trace):
        if rank == 0:
            trace["distributedInfo"]["pg_config"][1]["ranks"] = [6, 7]
    write_job(tmp_path, edit=edit)
    with pytest.raises(InputError) as err:
        bp.read_traces([tmp_path], progress=False)
    assert "host0_1000" in str(err.value) and "without this trace's rank 0" in str(err.value)


def test_missing_rank_files_are_counted(tmp_path):
    write_job(tmp_path)
    next(tmp_path.glob("host1_1007.*")).unlink()
    table = bp.read_traces([tmp_path], progress=False)
    assert any("1 ranks listed in process groups have no trace file (7)" in n
               for n in table.attrs["notes"])


# ------------------------------------------------------------------ units
@pytest.mark.parametrize(("text", "dim"), [
    ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
    ("DATA_PARALLEL_GROUP", "dp"), ("DATA_PARALLEL_GROUP_WITH_CP", "dp"),
    ("CONTEXT_PARALLEL_GROUP", "cp"), ("EXPERT_MODEL_PARALLEL_GROUP", "ep"),
    ("EXPERT_DATA_PARALLEL_GROUP", "edp"), ("MODEL_PARALLEL_GROUP", "other"),
    ("TENSOR_AND_DATA_PARALLEL_GROUP", "other"), ("EMBEDDING_GROUP", "other"),
    ("mesh_tp", "tp"), ("mesh_dp_shard", "dp"), ("mesh_dp_replicate", "dp"), ("mesh_cp", "cp"),
    ("mesh_pp", "pp"), ("mesh_ep", "ep"), ("mesh_dim_0", None), ("undefined", None),
    ("pipe", "pp"), ("model", "tp"), ("data", "dp"),
])
def test_descriptions(text, dim):
    assert description_dimension(text, 4, 64) == dim


def test_fallback_single_family_uses_position_in_step():
    groups = {"a": Group("a", None, (0, 1, 2, 3))}
    per_layer = {"a": GroupUsage(frozenset({"allreduce"}), 0.5)}
    at_end = {"a": GroupUsage(frozenset({"allreduce"}), 0.0)}
    assert fallback_dimensions(groups, ["a"], per_layer, 16) == {"a": "tp"}
    assert fallback_dimensions(groups, ["a"], at_end, 16) == {"a": "dp"}
    p2p = {"a": GroupUsage(frozenset({"sendrecv"}), 0.5)}
    assert fallback_dimensions(groups, ["a"], p2p, 16) == {"a": "pp"}


def test_send_recv_instances_pair_neighbouring_stages():
    stages, m = 4, 8
    for s in range(stages - 1):
        here = schedule_ops("1f1b", s, stages, m)
        there = schedule_ops("1f1b", s + 1, stages, m)
        # the ops of stage s that talk to s+1, and those of s+1 that talk to s
        up = [i for (_, msgs), i in zip(here.ops, message_instances(here, m), strict=True)
              if any(b == s for b, _, _ in msgs)]
        down = [i for (_, msgs), i in zip(there.ops, message_instances(there, m), strict=True)
                if any(b == s for b, _, _ in msgs)]
        assert up == down and len(set(up)) == len(up)


def test_interleaved_is_reported_not_guessed():
    kinds = [k for k, _ in schedule_ops("1f1b", 1, 4, 8).ops] * 2  # twice the traffic
    schedule, m, why = infer_schedule([kinds], 1, 4)
    assert schedule is None and m is None and "matches neither" in why


def test_signature_merge_is_bounded_by_the_tolerance():
    stats = SignatureStats()
    # a chain of keys 3 % apart: complete linkage never merges beyond 5 %
    for i, us in enumerate([100.0, 103.0, 106.1, 109.3, 112.6]):
        key = "\x1f".join(("k", "", "0", "0", str(i)))
        stats.count[key], stats.log_sum[key] = 1, math.log(us)
    mapping = signature_map(stats)
    assert len(set(mapping.values())) == 3
    for name in set(mapping.values()):
        us = [math.exp(stats.log_sum[k]) for k, v in mapping.items() if v == name]
        assert max(us) / min(us) <= 1.05


def test_reading_in_worker_processes_gives_the_same_table(tmp_path, monkeypatch):
    write_job(tmp_path, tp=2, pp=2, dp=2)
    tables = {}
    for workers in ("1", "2"):  # (unset is 1; the CLI sets "auto")
        monkeypatch.setenv("BAYESPRISM_INGEST_WORKERS", workers)
        tables[workers] = bp.read_traces([tmp_path], progress=False)
    pd.testing.assert_frame_equal(tables["1"], tables["2"])
    assert tables["1"].attrs == tables["2"].attrs
    # streaming to Parquet: each worker also splits, converts and summarises its file's rows
    from bayesprism.ingest.parquet import ingest_to_parquet
    from bayesprism.ingest.summary import summarize_table

    summary = ingest_to_parquet([tmp_path], tmp_path / "job.parquet", progress=False)
    order = ["rank", "step", "start_us"]
    streamed = bp.read_table(tmp_path / "job.parquet")[list(tables["1"].columns)]
    pd.testing.assert_frame_equal(streamed.sort_values(order, ignore_index=True),
                                  tables["1"].sort_values(order, ignore_index=True),
                                  check_categorical=False)
    assert summary == summarize_table(tables["1"])
    monkeypatch.setenv("BAYESPRISM_INGEST_WORKERS", "two")
    with pytest.raises(InputError, match="BAYESPRISM_INGEST_WORKERS"):
        bp.read_traces([tmp_path], progress=False)
