"""Tidy CSV / Parquet reader: mapping, units, defaults, skipped rows and exact error messages."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bayesprism.errors import TraceFormatError
from bayesprism.ingest.tabular import can_read, read_tabular
from bayesprism.schema import validate_table, write_table

ROWS = (
    "run,step,rank,node,gpu,kernel,kernel_class,duration_us\n"
    "r1,0,0,n0,0,gemm_a,gemm,10.5\n"
    "r1,0,1,n0,1,gemm_a,gemm,11.0\n"
    "r1,1,0,n0,0,gemm_a,gemm,\n"
    "r1,1,1,n0,1,gemm_a,gemm,-2\n"
)


def test_tidy_csv_round_trip(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(ROWS)
    assert can_read(path, path.read_bytes())
    df, report = read_tabular(path)
    df = validate_table(df, source=str(path))
    assert df["duration_us"].tolist() == [10.5, 11.0]
    assert report["skipped"] == {
        "duration_us missing (NaN)": 1,
        "duration_us not finite or <= 0": 1,
    }
    assert report["run"] == "r1"
    meta = report["run_meta"]
    assert meta["world_size"] == 2 and meta["gpus_per_node"] == 2 and meta["plan"]["dp"] == 2


def test_column_map_units_and_defaults(tmp_path):
    path = tmp_path / "myjob.csv"
    path.write_text(
        "iteration,global_rank,host,local_gpu,name,ms,comment\n"
        "0,0,h0,0,ampere_sgemm_128x64_tn,0.25,x\n"
        "0,1,h1,0,ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*),1.5,y\n"
    )
    mapping = {
        "iteration": "step",
        "global_rank": "rank",
        "host": "node",
        "local_gpu": "gpu",
        "name": "kernel",
        "ms": "duration_us",
        "comment": None,
    }
    df, report = read_tabular(path, column_map=mapping, units="ms")
    df = validate_table(df)
    assert df["duration_us"].tolist() == [250.0, 1500.0]
    assert df["run"].unique().tolist() == ["myjob"]
    assert df["kernel_class"].astype(str).tolist() == ["gemm", "allreduce"]
    text = " ".join(report["notes"])
    assert "no run column; run = 'myjob'" in text and "classified from kernel names" in text
    assert "columns dropped as asked (column_map to None): comment" in text
    assert "duration_us converted from ms to µs" in text


def test_step_level_table_gets_whole_job_markers(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text(
        "run,step,kernel,kernel_class,duration_us\nA,0,train_step,step,1e6\n"
        "A,1,train_step,step,1.1e6\n"
    )
    df, report = read_tabular(path, run="B")
    df = validate_table(df)
    assert (df["rank"] == -1).all() and (df["gpu"] == -1).all() and (df["node"] == "*").all()
    assert set(df["run"]) == {"B"} and "run column replaced by run='B'" in report["notes"]


def test_parquet_keeps_stored_metadata(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text(ROWS)
    df, _ = read_tabular(csv)
    df = validate_table(df)
    df.attrs = {
        "schema_version": 1,
        "runs": {
            "r1": {"platform": "H100", "world_size": 2, "gpus_per_node": 2, "plan": {"dp": 2}}
        },
        "skipped": {},
        "notes": ["stored note"],
    }
    pq = tmp_path / "t.parquet"
    write_table(df, pq)
    assert can_read(pq, pq.read_bytes()[:64])
    back, report = read_tabular(pq)
    assert len(back) == 2 and report["run_meta"]["platform"] == "H100"
    assert report["run_meta"]["source_files"] == [str(pq)]
    assert "stored note" in report["notes"]


def test_several_runs_are_reported(tmp_path):
    path = tmp_path / "two.csv"
    path.write_text(ROWS.replace("r1,1,", "r2,1,").replace(",\n", ",5\n").replace("-2", "6"))
    _, report = read_tabular(path)
    assert set(report["runs"]) == {"r1", "r2"} and report["run"] == "r1"


def test_errors_are_exact(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(
        "run,step,rank,node,gpu,kernel,kernel_class,duration_us,extra,more\n"
        "r,0,0,n,0,k,gemm,1,2,3\n"
    )
    with pytest.raises(
        TraceFormatError,
        match=r"bad.csv: extra, more: unknown column\(s\); map "
        r"them .* known columns are run, step, rank",
    ):
        read_tabular(path)
    with pytest.raises(
        TraceFormatError,
        match=r"column_map: names column\(s\) not in the file: "
        r"nope",
    ):
        read_tabular(path, column_map={"nope": "step"})
    with pytest.raises(
        TraceFormatError,
        match=r"column_map: maps to non-schema column\(s\): "
        r"flops",
    ):
        read_tabular(path, column_map={"extra": "flops", "more": None})
    with pytest.raises(TraceFormatError, match=r"units: unknown unit.*'hours'"):
        read_tabular(path, column_map={"extra": None, "more": None}, units="hours")
    missing = tmp_path / "m.csv"
    missing.write_text("run,kernel,duration_us\nr,k,1\n")
    with pytest.raises(TraceFormatError) as err:
        read_tabular(missing)
    assert err.value.lines() == [
        f"{missing}: {c}: required column is missing (and has no unambiguous default)"
        for c in ("step", "rank", "node", "gpu")
    ]
    nothing = tmp_path / "n.csv"
    nothing.write_text(
        "run,step,rank,node,gpu,kernel,kernel_class,duration_us\nr,0,0,n,0,k,gemm,0\n"
    )
    with pytest.raises(TraceFormatError, match=r"n\.csv: duration_us: no row has a valid duration"):
        read_tabular(nothing)
    assert not can_read(Path("x.json"), b"{}")
    assert not can_read(Path("x.csv"), b"a,b,c\n1,2,3\n")


def test_dispatcher_uses_column_map(tmp_path):
    bp = pytest.importorskip("bayesprism")
    path = tmp_path / "job.csv"
    path.write_text("run,step,rank,node,gpu,kernel,kernel_class,dur\nr,0,0,n,0,k,gemm,3\n")
    table = bp.read_traces([path], column_map={"dur": "duration_us"}, progress=False)
    assert table["duration_us"].tolist() == [3.0]
    assert isinstance(table, pd.DataFrame)


def test_read_traces_keeps_metadata_of_every_run_in_one_table(tmp_path):
    import bayesprism as bp

    path = tmp_path / "multi.csv"
    pd.DataFrame({
        "run": ["a", "a", "b"], "step": [0, 1, 0], "rank": [0, 0, 0], "node": ["n"] * 3,
        "gpu": [0] * 3, "kernel": ["k"] * 3, "kernel_class": ["gemm"] * 3,
        "duration_us": [1.0, 2.0, 3.0],
    }).to_csv(path, index=False)
    table = bp.read_traces([path], progress=False)
    assert sorted(table.attrs["runs"]) == ["a", "b"]
    assert table.attrs["runs"]["b"]["source_files"] == [str(path)]
