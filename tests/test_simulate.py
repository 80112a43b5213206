"""Synthetic Kineto traces: structure, determinism, known truth visible in the written files."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from bayesprism.cli.main import main
from bayesprism.errors import InputError
from bayesprism.ingest.classify import normalize_kernel_name
from bayesprism.simulate import simulate

SIZE = dict(nodes=3, gpus_per_node=4, steps=4, kernels_per_step=120, degraded_nodes=1)
FILE_NAME = re.compile(r"^(node-\d{3})_(\d+)\.(\d+)\.pt\.trace\.json\.gz$")


@pytest.fixture(scope="session")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    truth = simulate(out, random_seed=11, **SIZE)
    traces = {}
    for name in truth["files"]:
        doc = json.loads(gzip.decompress((out / name).read_bytes()))
        traces[doc["distributedInfo"]["rank"]] = (name, doc)
    return out, truth, traces


@pytest.fixture(scope="session")
def simulated_table(simulated):
    """The simulated traces read back by ``bayesprism.read_traces`` (once a session)."""
    import bayesprism

    return bayesprism.read_traces([simulated[0]], progress=False)


def _kernels(doc):
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def test_files_are_kineto_shaped(simulated):
    out, truth, traces = simulated
    world = SIZE["nodes"] * SIZE["gpus_per_node"]
    assert sorted(traces) == list(range(world))
    assert sorted(p.name for p in out.glob("*.pt.trace.json.gz")) == sorted(truth["files"])
    for rank, (name, doc) in traces.items():
        host = FILE_NAME.match(name).group(1)
        assert host == f"node-{rank // SIZE['gpus_per_node']:03d}"
        assert doc["distributedInfo"] == {
            "backend": "nccl",
            "rank": rank,
            "world_size": world,
            "pg_count": 1,
            "nccl_version": "2.21.5",
        }
        assert len(doc["deviceProperties"]) == SIZE["gpus_per_node"]
        events = doc["traceEvents"]
        steps = [e for e in events if e.get("cat") == "user_annotation"]
        assert [e["name"] for e in steps] == [f"ProfilerStep#{s}" for s in range(SIZE["steps"])]
        kernels = _kernels(doc)
        assert len(kernels) == SIZE["steps"] * SIZE["kernels_per_step"]
        gpu = rank % SIZE["gpus_per_node"]
        assert {k["args"]["device"] for k in kernels} == {gpu}
        # every kernel is tied to a launch inside the ProfilerStep of its own step
        launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
        for i, kernel in enumerate(kernels):
            launch = launches[kernel["args"]["correlation"]]
            window = steps[i // SIZE["kernels_per_step"]]
            assert window["ts"] <= launch["ts"] < window["ts"] + window["dur"]
            assert launch["ts"] < kernel["ts"]
        nccl = [k for k in kernels if k["name"].startswith("ncclDevKernel_AllReduce")]
        assert len(nccl) == SIZE["steps"] * 4
        args = nccl[0]["args"]
        assert args["Collective name"] == "allreduce" and args["Group size"] == world
        assert args["In msg nelems"] == 25 * 2**20 // 2 and args["dtype"] == "BFloat16"
        # the compute stream runs kernels back to back: no overlap
        compute = sorted((k["ts"], k["dur"]) for k in kernels if k["tid"] == 7)
        ends = np.array([t + d for t, d in compute[:-1]])
        assert (np.array([t for t, _ in compute[1:]]) >= ends - 1e-3).all()


def test_truth_json(simulated):
    out, truth, _ = simulated
    on_disk = json.loads((out / "truth.json").read_text())
    assert on_disk == json.loads(json.dumps(truth))
    for key in (
        "kernels",
        "kernel_log_median",
        "class_scales",
        "node_effect",
        "gpu_effect",
        "step_effect",
        "gpustep_effect",
        "degraded_nodes",
        "collectives",
        "world_size",
        "plan",
        "hosts",
        "node_population",
    ):
        assert key in truth
    world = SIZE["nodes"] * SIZE["gpus_per_node"]
    assert truth["world_size"] == world and truth["plan"]["dp"] == world
    assert len(truth["degraded_nodes"]) == 1 and truth["degraded_nodes"][0] in truth["hosts"]
    assert set(truth["class_scales"]) == {
        "gemm",
        "attention",
        "norm",
        "elementwise",
        "optimizer",
        "other",
    }
    assert all(
        set(v) == {"node", "gpu", "step", "gpustep", "resid"}
        for v in truth["class_scales"].values()
    )
    ar = truth["collectives"]["allreduce"]
    assert ar["tier"] == "inter" and set(ar["latency_us"]) == {"intra", "inter"}
    assert sum(k["launches_per_step"] for k in truth["kernels"].values()) + 4 == 120


def test_same_seed_same_bytes(tmp_path):
    small = dict(nodes=2, gpus_per_node=2, steps=2, kernels_per_step=60)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    simulate(a, random_seed=5, **small)
    with pytest.warns(FutureWarning, match="'seed' is now 'random_seed'"):
        simulate(b, seed=5, **small)  # the earlier name, for one release
    simulate(c, random_seed=6, **small)
    files_a = sorted(p.name for p in a.iterdir())
    assert files_a == sorted(p.name for p in b.iterdir())
    for name in files_a:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "truth.json").read_bytes() != (c / "truth.json").read_bytes()


def test_degraded_node_is_slower_in_the_written_durations(simulated):
    _, truth, traces = simulated
    # log duration relative to each kernel's overall mean, averaged per host (compute kernels)
    logs = defaultdict(list)
    for name, doc in traces.values():
        host = FILE_NAME.match(name).group(1)
        for k in _kernels(doc):
            if k["tid"] == 7:
                logs[k["name"]].append((host, np.log(k["dur"])))
    per_host = defaultdict(list)
    for rows in logs.values():
        mean = np.mean([v for _, v in rows])
        for host, v in rows:
            per_host[host].append(v - mean)
    effect = {h: float(np.mean(v)) for h, v in per_host.items()}
    slow = truth["degraded_nodes"][0]
    assert effect[slow] > 0.05
    assert all(effect[slow] > effect[h] + 0.05 for h in effect if h != slow)


def test_kernel_medians_match_truth(simulated):
    _, truth, traces = simulated
    logs = defaultdict(list)
    for _, doc in traces.values():
        for k in _kernels(doc):
            logs[normalize_kernel_name(k["name"])].append(np.log(k["dur"]))
    for name, spec in truth["kernels"].items():
        # node effects include one degraded node: allow its pull on the median of log durations
        assert np.median(logs[name]) == pytest.approx(spec["log_median_us"], abs=0.12), name


def test_collectives_wait_for_the_last_rank(simulated):
    _, truth, traces = simulated
    calls = defaultdict(list)  # (step, call) -> [(start, end)]
    per_step = SIZE["kernels_per_step"]
    for _, doc in traces.values():
        nccl_seen = defaultdict(int)
        for i, k in enumerate(_kernels(doc)):
            if k["tid"] == 20:
                step = i // per_step
                calls[(step, nccl_seen[step])].append((k["ts"], k["ts"] + k["dur"]))
                nccl_seen[step] += 1
    transfer = truth["collectives"]["allreduce"]["transfer_us"]
    for (step, call), spans in calls.items():
        starts, ends = np.array(spans).T
        assert np.ptp(ends) < 2e-3  # every rank ends together
        # the last rank to arrive waits for nobody: its duration is the transfer
        assert ends.max() - starts.max() == pytest.approx(transfer[str(step)][call], abs=2e-3)
        assert starts.max() - starts.min() > 0  # others waited


def test_bad_arguments_raise_input_error(tmp_path):
    with pytest.raises(InputError, match="degraded_nodes: must be between 0 and nodes"):
        simulate(tmp_path, nodes=2, gpus_per_node=1, steps=1, degraded_nodes=3)


def test_cli(tmp_path, capsys):
    rc = main(
        [
            "simulate",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--steps",
            "2",
            "--kernels-per-step",
            "50",
            "--degraded-nodes",
            "1",
            "-o",
            str(tmp_path),
        ]
    )
    assert rc == 0
    assert "wrote 2 trace files and truth.json" in capsys.readouterr().out
    assert (tmp_path / "truth.json").is_file()
    assert (
        main(
            [
                "simulate",
                "--nodes",
                "0",
                "--gpus-per-node",
                "1",
                "--steps",
                "1",
                "-o",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "simulate: nodes: must be >= 1" in capsys.readouterr().err


def test_read_back_with_read_traces(simulated, simulated_table):
    _, truth, _ = simulated
    table = simulated_table
    world = truth["world_size"]
    assert sorted(table["rank"].unique()) == list(range(world))
    assert set(table["node"].astype(str)) == set(truth["hosts"])
    assert sorted(table["step"].unique()) == truth["steps"]
    counts = table.groupby(["rank", "step"], observed=True).size()
    assert (counts == SIZE["kernels_per_step"]).all()
    rank_node = table.drop_duplicates("rank").set_index("rank")["node"].astype(str)
    assert all(rank_node[r] == truth["hosts"][r // SIZE["gpus_per_node"]] for r in range(world))


def test_file_name_timestamp_is_deterministic(simulated):
    _, truth, _ = simulated
    stamps = {FILE_NAME.match(f).group(3) for f in truth["files"]}
    assert all(s.isdigit() and len(s) == 13 for s in stamps)
    assert Path(truth["files"][0]).suffixes[-3:] == [".trace", ".json", ".gz"]


def test_shipped_synthetic_sample_is_current(package_data, tmp_path):
    """data/synthetic is exactly what its documented command writes (regenerate if this fails)."""
    shipped = package_data / "synthetic"
    simulate(tmp_path, nodes=2, gpus_per_node=4, steps=5, degraded_nodes=1, random_seed=1,
             kernels_per_step=100)
    names = sorted(p.name for p in shipped.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    for name in names:
        # compare content, not gzip bytes: gzip headers differ between Python versions
        contents = [(folder / name).read_bytes() for folder in (shipped, tmp_path)]
        if name.endswith(".gz"):
            contents = [gzip.decompress(c) for c in contents]
        if name.endswith(".json"):  # floats to 1e-12: the last digit differs between libms
            shipped_json, written_json = (json.loads(c) for c in contents)
            assert _close(shipped_json, written_json), name
        else:
            assert contents[0] == contents[1], name


def _close(a, b) -> bool:
    """Nested JSON values equal, floats to a relative 1e-12."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=0.0)
    return a == b


def test_refuses_a_folder_with_another_simulation(tmp_path):
    small = dict(nodes=1, gpus_per_node=2, steps=1, kernels_per_step=40)
    simulate(tmp_path, random_seed=1, **small)
    simulate(tmp_path, random_seed=1, **small)  # same arguments: same names, replaced
    with pytest.raises(InputError, match=r"out_dir: already holds 2 trace file\(s\)"):
        simulate(tmp_path, random_seed=2, **small)


def test_every_bucket_is_launched_when_buckets_outnumber_layers(tmp_path):
    truth = simulate(
        tmp_path, nodes=1, gpus_per_node=2, steps=1, kernels_per_step=60, allreduce_buckets=6
    )
    doc = json.loads(gzip.decompress((tmp_path / truth["files"][0]).read_bytes()))
    nccl = [k for k in _kernels(doc) if k["tid"] == 20]
    assert len(nccl) == 6 == truth["collectives"]["allreduce"]["calls_per_step"]
    assert len(_kernels(doc)) == 60
    assert truth["collectives"]["allreduce"]["tier"] == "intra"


def test_ingested_transfer_matches_truth(simulated, simulated_table):
    """The ingest wait/transfer split recovers the simulated transfer of every call."""
    _, truth, _ = simulated
    table = simulated_table
    coll = table[table["kernel_class"].astype(str) == "allreduce"].sort_values(["rank", "start_us"])
    call = coll.groupby(["rank", "step"], observed=True).cumcount().to_numpy()
    expected = [
        truth["collectives"]["allreduce"]["transfer_us"][str(s)][c]
        for s, c in zip(coll["step"], call, strict=True)
    ]
    assert np.allclose(coll["transfer_us"], expected, atol=5e-3)
    assert np.allclose(coll["wait_us"] + coll["transfer_us"], coll["duration_us"], atol=5e-3)
