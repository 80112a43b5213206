"""Collective cost model: exact change of coordinates, recovery of latency and bandwidth, mixing
on the latency/bandwidth ridge, tiers, and benchmark runs with scales of their own."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from bayesprism.costs import collectives as coll
from bayesprism.model import build, prepare
from bayesprism.spec import ModelSpec

COLUMNS = ["run", "step", "rank", "node", "gpu", "kernel", "kernel_class", "duration_us",
           "transfer_us", "bytes", "group_size"]


def collective_table(sizes, *, latency, bandwidth, steps=8, launches=20, noise=0.02,
                     congestion=0.01, seed=0, run="job", kind="allreduce",
                     gpus_per_node=8, fabric=0.0, small_ratio=1.0) -> pd.DataFrame:
    """Transfers of one collective from the ring cost model with known parameters.

    ``sizes``: (group size, bytes) pairs; ``latency``/``bandwidth``: per tier (0 intra, 1 inter,
    a group larger than ``gpus_per_node`` is inter, its bandwidth times
    ``(nodes / 2)^-fabric``; a small message's latency times ``small_ratio``). Each step
    shifts all transfers of a tier by one congestion draw of the tier (``congestion``: one sd,
    or (intra, inter)); each launch has lognormal noise.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        shift = np.broadcast_to(congestion, 2) * rng.standard_normal(2)  # per tier
        for p, nbytes in sizes:
            tier = int(p > gpus_per_node)
            nodes = max(2.0, np.ceil(p / gpus_per_node)) if tier else 2.0
            t_us = coll.transfer_time_us(kind, p, nbytes, latency[tier],
                                         bandwidth[tier] * (nodes / 2.0) ** -fabric,
                                         small_latency_log_ratio=np.log(small_ratio))
            for _ in range(launches):
                t = t_us * np.exp(shift[tier] + noise * rng.standard_normal())
                rows.append((run, step, 0, "n00", 0, f"nccl:{kind}", kind, t * 1.2, t,
                             float(nbytes), p))
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.attrs["runs"] = {run: {"gpus_per_node": gpus_per_node}}
    return table


def _sample(model, draws=600, tune=400, seed=1):
    """PyMC NUTS, 2 chains: R-hat <= 1.01 is only a meaningful bar with ~1000 draws each
    (with 300 it scatters to 1.02 on a well-mixing chain); 600 keep it below."""
    import pymc as pm

    with model:
        return pm.sample(draws, tune=tune, chains=2, cores=1, nuts_sampler="pymc",
                         random_seed=seed, progressbar=False, compute_convergence_checks=False)


def _convergence(tree, names):
    import arviz as az

    summary = az.summary(tree, var_names=names, round_to="none")
    return (float(summary["r_hat"].max()), float(summary["ess_bulk"].min()),
            int(tree.sample_stats["diverging"].sum()))


# ---------------------------------------------------------------- the model is unchanged
def test_coordinates_change_the_parameterisation_not_the_density():
    """Between two points the model's log density changes exactly as the plain model's does:
    latency and bandwidth with their priors (intra tier, inter/intra ratio) and the collapsed
    likelihood with the congestion integrated out."""
    table = pd.concat([
        collective_table([(4, 1e6), (8, 1e8)], latency=(5.0, 12.0), bandwidth=(200.0, 40.0)),
        collective_table([(16, 1e8)], latency=(5.0, 12.0), bandwidth=(200.0, 40.0), seed=1),
        collective_table([(8, 3e7)], latency=(5.0, 12.0), bandwidth=(200.0, 40.0), seed=2,
                         kind="allgather"),
    ], ignore_index=True)
    table.attrs["runs"] = {"job": {"gpus_per_node": 8}}
    spec = ModelSpec()
    prepared = prepare([table], spec)
    d = prepared.data
    assert d["coll_observed_tiers"].tolist() == [[True, False], [True, True]]  # ag, ar
    model = build(prepared, spec)
    logp = model.compile_logp()
    values = model.compile_fn(
        model.replace_rvs_by_values([model["coll_latency_us"], model["coll_bandwidth_gbps"],
                                     model["coll_noise"], model["coll_congestion"]]),
        inputs=model.value_vars, on_unused_input="ignore")
    rng = np.random.default_rng(5)

    def plain(lat, bw, noise, congestion):
        sd, rsd = spec.prior("coll_log_sd"), spec.prior("tier_ratio_log_sd")
        # the all-reduce has both tiers; the all-gather, observed within a node only, takes
        # the all-reduce's inter-node tier times a ratio of prior median 1
        both, borrowed = [1], [0]
        out = (stats.norm.logpdf(np.log(lat[:, 0]), np.log(spec.prior("coll_latency_us")), sd)
               + stats.norm.logpdf(np.log(bw[:, 0]), np.log(spec.prior("coll_bandwidth_gbps")),
                                   sd)).sum()
        out += (stats.norm.logpdf(np.log(lat[both, 1] / lat[both, 0]),
                                  np.log(spec.prior("inter_latency_ratio")), rsd)
                + stats.norm.logpdf(np.log(bw[both, 1] / bw[both, 0]),
                                    np.log(spec.prior("inter_bandwidth_ratio")), rsd)).sum()
        out += (stats.norm.logpdf(np.log(lat[borrowed, 1] / lat[both, 1]), 0.0, rsd)
                + stats.norm.logpdf(np.log(bw[borrowed, 1] / bw[both, 1]), 0.0, rsd)).sum()
        j, t = d["coll_cell_collective"], d["coll_cell_tier"]
        mu = np.log(lat[j, t] * d["coll_cell_latency_steps"]
                    + d["coll_cell_bytes_factor"] / (bw[j, t] * 1e3))
        n, mean, ss = d["coll_cell_n"], d["coll_cell_mean"], d["coll_cell_ss"]
        var = noise[j] ** 2
        out += np.sum(-0.5 * n * np.log(2 * np.pi) - n * np.log(noise[j])
                      - (ss + n * (mean - mu) ** 2) / (2 * var))
        g, c = d["coll_cell_group"], congestion[d["coll_cell_congestion"]]
        a = np.bincount(g, weights=c * n * (mean - mu) / var)
        b = np.bincount(g, weights=c**2 * n / var)
        out += np.sum(-0.5 * np.log1p(b) + a**2 / (2 * (1 + b)))
        # the noise is sampled in log coordinates scaled by a constant: half-normal prior
        # times the Jacobian d noise / d z ∝ noise
        return out + np.sum(stats.halfnorm.logpdf(noise, scale=spec.prior("coll_noise"))
                            + np.log(noise))

    base = model.initial_point()
    diffs = []
    for _ in range(3):
        point = dict(base)
        for name in ("coll_cost_coef", "coll_log_latency_ratio", "coll_log_bandwidth_ratio",
                     "coll_noise_z"):
            point[name] = base[name] + rng.normal(0, 0.5, base[name].shape)
        lat, bw, noise, congestion = values(point)
        diffs.append((logp(point) - logp(base),
                      plain(lat, bw, noise, congestion) - plain(*values(base))))
    for model_diff, plain_diff in diffs:
        assert model_diff == pytest.approx(plain_diff, rel=1e-7, abs=1e-6)


# ---------------------------------------------------------------- recovery and mixing
def test_recovers_latency_and_bandwidth_of_both_tiers():
    truth_lat, truth_bw = (4.0, 15.0), (300.0, 40.0)
    sizes = [(p, b) for p in (4, 8, 16, 32) for b in (1e5, 1e7, 1e9)]
    table = collective_table(sizes, latency=truth_lat, bandwidth=truth_bw, steps=12,
                             launches=3, noise=0.03, congestion=0.02, seed=3)
    spec = ModelSpec()
    # 1000 draws: with 600 the max R-hat over 20 elements lands at 1.011 on some CPUs
    tree = _sample(build(prepare([table], spec), spec), draws=1000, seed=3)
    post = tree.posterior
    for t, tier in enumerate(coll.TIERS):
        lat = post["coll_latency_us"].sel(collective="allreduce", tier=tier)
        bw = post["coll_bandwidth_gbps"].sel(collective="allreduce", tier=tier)
        assert float(lat.mean()) == pytest.approx(truth_lat[t], rel=0.1)
        assert float(bw.mean()) == pytest.approx(truth_bw[t], rel=0.05)
    assert float(post["coll_noise"].mean()) == pytest.approx(0.03, rel=0.1)
    r_hat, ess, divergences = _convergence(
        tree, ["coll_latency_us", "coll_bandwidth_gbps", "coll_noise", "coll_congestion"])
    assert r_hat <= 1.01 and ess >= 200 and divergences == 0


def test_congestion_is_recovered_per_tier():
    """Inter-node transfers that move together by 4 % from step to step while the intra-node
    ones hold still (the dev job's data-parallel vs tensor-parallel traffic): each tier's
    congestion is its own. One scale per collective, for both tiers, fitted 0.027 for both."""
    table = collective_table([(8, 1e8), (16, 1e8), (32, 1e9)], latency=(4.0, 15.0),
                             bandwidth=(300.0, 40.0), steps=16, launches=20, noise=0.02,
                             congestion=(0.0, 0.04), seed=11)
    spec = ModelSpec()
    tree = _sample(build(prepare([table], spec), spec), draws=300, tune=300, seed=11)
    congestion = tree.posterior["coll_congestion"]
    assert congestion.dims[-1] == "coll_pair"
    inter = congestion.sel(coll_pair="allreduce/inter")
    assert float(inter.mean()) == pytest.approx(0.04, rel=0.35)
    assert float(congestion.sel(coll_pair="allreduce/intra").quantile(0.95)) < 0.01


def test_recovers_the_quicker_latency_steps_of_small_messages():
    """Small messages (16 KiB, below collectives.SMALL_MESSAGE_BYTES) at 0.4x the per-step
    latency of the large ones (1 MiB-1 GiB), as a traced tensor-parallel all-reduce beside
    nccl-tests: ρ, latency and bandwidth recovered, and one mode (a shared latency made two,
    each misfitting one size range)."""
    truth_lat, truth_bw = (2.5, 6.0), (360.0, 40.0)
    sizes = [(8, 16384.0)] + [(p, b) for p in (8, 16, 32) for b in (1 << 20, 1 << 24, 1 << 30)]
    table = collective_table(sizes, latency=truth_lat, bandwidth=truth_bw, steps=12,
                             launches=3, noise=0.03, congestion=0.02, seed=4, small_ratio=0.4,
                             fabric=0.03)  # (γ = 0 sits on its prior's boundary)
    spec = ModelSpec()
    prepared = prepare([table], spec)
    assert prepared.data["coll_cell_small"].sum() == 12  # the 16 KiB cells, one per step
    tree = _sample(build(prepared, spec), seed=4)
    post = tree.posterior
    rho = post["coll_small_latency_log_ratio"]
    assert float(rho.sel(tier="intra").mean()) == pytest.approx(np.log(0.4), abs=0.05)
    assert float(rho.sel(tier="inter").std()) == 0.0  # no small inter-node messages: none
    for t, tier in enumerate(coll.TIERS):
        lat = post["coll_latency_us"].sel(collective="allreduce", tier=tier)
        bw = post["coll_bandwidth_gbps"].sel(collective="allreduce", tier=tier)
        assert float(lat.mean()) == pytest.approx(truth_lat[t], rel=0.1)
        assert float(bw.mean()) == pytest.approx(truth_bw[t], rel=0.05)
    r_hat, ess, divergences = _convergence(
        tree, ["coll_small_latency_log_ratio", "coll_latency_us", "coll_bandwidth_gbps"])
    assert r_hat <= 1.01 and ess >= 200 and divergences == 0


def test_small_messages_share_the_latency_where_no_collective_shows_both_sizes():
    """Only small messages of a collective: nothing tells their latency from a large one's, so
    ρ is not fitted and the forecast costs both with the one fitted latency."""
    table = collective_table([(8, 16384.0), (16, 32768.0)], latency=(1.0, 3.0),
                             bandwidth=(300.0, 40.0))
    spec = ModelSpec()
    model = build(prepare([table], spec), spec)
    assert "coll_small_latency_log_ratio" not in model.named_vars


def test_recovers_how_inter_node_bandwidth_falls_with_the_nodes_spanned():
    # an nccl-tests-like sweep over 2-32 nodes whose bus bandwidth falls as (n / 2)^-0.1
    truth_lat, truth_bw, truth_fabric = (4.0, 15.0), (300.0, 40.0), 0.1
    sizes = [(p, b) for p in (8, 16, 32, 64, 128, 256) for b in (1e6, 1e8, 1e9)]
    table = collective_table(sizes, latency=truth_lat, bandwidth=truth_bw, steps=8,
                             launches=3, noise=0.03, congestion=0.02, seed=5,
                             fabric=truth_fabric)
    spec = ModelSpec()
    # 1,000 draws: with 600 the inter-node bandwidth's R-hat scattered to 1.012 (ESS 900)
    tree = _sample(build(prepare([table], spec), spec), draws=1000, seed=5)
    post = tree.posterior
    fabric = post["coll_fabric_exponent"].to_numpy()
    assert float(fabric.mean()) == pytest.approx(truth_fabric, abs=0.01)
    bw = post["coll_bandwidth_gbps"].sel(collective="allreduce", tier="inter")
    assert float(bw.mean()) == pytest.approx(truth_bw[1], rel=0.05)
    r_hat, ess, divergences = _convergence(
        tree, ["coll_latency_us", "coll_bandwidth_gbps", "coll_fabric_exponent"])
    assert r_hat <= 1.01 and ess >= 200 and divergences == 0


def test_ridge_of_few_sizes_mixes_and_falls_back_to_the_prior():
    """Two tiers observed in the same steps with one group size and two or three bytes values
    each (as a traced job's TP and DP collectives): the data pin each tier's time at its sizes
    and the tiers' ratio to 1e-4, not latency against bandwidth. The plain parameters mixed
    badly here (R-hat 1.2, divergences); the reference-point coordinates mix, and the single-size
    collective's latency keeps the prior's spread."""
    lat, bw = (3.0, 8.0), (350.0, 45.0)
    table = pd.concat([
        collective_table([(8, 6.4e7), (8, 1.28e8)], latency=lat, bandwidth=bw, steps=12,
                         launches=200, noise=0.02, congestion=0.01, seed=4, kind="allgather"),
        collective_table([(16, 4.3e8), (16, 5.6e8), (16, 7e8)], latency=lat, bandwidth=bw,
                         steps=12, launches=20, noise=0.02, congestion=0.01, seed=5,
                         kind="allgather"),
        collective_table([(8, 1.6e4)], latency=lat, bandwidth=bw, steps=12, launches=50,
                         noise=0.02, congestion=0.01, seed=6, kind="allreduce"),
    ], ignore_index=True)
    table.attrs["runs"] = {"job": {"gpus_per_node": 8}}
    spec = ModelSpec()
    tree = _sample(build(prepare([table], spec), spec), draws=1000, tune=500, seed=4)
    names = ["coll_latency_us", "coll_bandwidth_gbps", "coll_noise", "coll_congestion"]
    r_hat, ess, divergences = _convergence(tree, names)
    assert divergences == 0 and r_hat <= 1.01 and ess >= 200
    post = tree.posterior
    # the transfer time of the single size is pinned, its latency/bandwidth split is not
    single = post["coll_latency_us"].sel(collective="allreduce", tier="intra")
    time = (single * coll.latency_steps("allreduce", 8) + 1.6e4 * coll.bandwidth_factor(
        "allreduce", 8) / (post["coll_bandwidth_gbps"].sel(collective="allreduce",
                                                           tier="intra") * 1e3))
    truth = coll.transfer_time_us("allreduce", 8, 1.6e4, lat[0], bw[0])
    assert float(np.log(time).std()) < 0.01 and float(time.mean()) == pytest.approx(truth,
                                                                                    rel=0.01)
    # ... the bandwidth's only bound is that the latency term cannot exceed that time
    # (its 99th percentile: the time itself varies ~1 % between draws)
    assert float(single.quantile(0.99)) <= truth / coll.latency_steps("allreduce", 8) * 1.02
    single_bw = post["coll_bandwidth_gbps"].sel(collective="allreduce", tier="intra")
    assert float(np.log(single_bw).std()) > 1.0
    # bandwidth-dominated sizes pin the bandwidth of both tiers
    for t, tier in enumerate(coll.TIERS):
        fitted = post["coll_bandwidth_gbps"].sel(collective="allgather", tier=tier)
        assert float(fitted.mean()) == pytest.approx(bw[t], rel=0.05)


# ---------------------------------------------------------------- tiers and sources
def test_tiers_from_group_size_and_spanning_process_groups_not_roles():
    table = collective_table([(2, 1e6)], latency=(5.0, 10.0), bandwidth=(100.0, 40.0),
                             steps=2, launches=2, kind="sendrecv")
    table["process_group"] = "pp"
    table.loc[table.index % 2 == 1, "node"] = "n01"  # the pair's two ranks on two nodes
    # a benchmark run's rows carry no process group and come from many hosts: not a group
    bench = collective_table([(8, 1e6), (16, 1e6)], latency=(5.0, 10.0),
                             bandwidth=(100.0, 40.0), steps=3, launches=1, run="bench")
    bench["node"] = [f"h{i}" for i in range(len(bench))]
    both = pd.concat([table, bench], ignore_index=True)
    both.attrs["runs"] = {"job": {"gpus_per_node": 8}, "bench": {"gpus_per_node": 8}}
    prepared = prepare([both], ModelSpec())
    assert prepared.coords["collective"] == ["allreduce", "sendrecv"]
    # p = 8 of the benchmark is intra: rows without a process group are no group of their own
    assert prepared.data["coll_observed_tiers"].tolist() == [[True, True], [False, True]]
    assert prepared.coords["coll_pair"] == ["allreduce/intra", "allreduce/inter",
                                            "sendrecv/inter"]
    # the same p2p rows in one node only: intra
    table["node"] = "n00"
    assert prepare([table], ModelSpec()).data["coll_observed_tiers"].tolist() == [[True, False]]


def test_a_tier_never_observed_for_a_collective_comes_from_the_others_at_that_tier():
    """All-gathers measured within a node only, pipeline transfers across nodes only (a job
    traced on ranks whose data-parallel peers have no trace files): the all-gather's
    inter-node latency and bandwidth are the send/recv's there times a sampled ratio of prior
    median 1, and the send/recv's intra-node ones the all-gather's; not a collective's own
    other tier times an inter/intra ratio (NVLink's bandwidth says little of the NICs')."""
    gather = collective_table([(8, 4e8)], latency=(5.0, 10.0), bandwidth=(400.0, 40.0),
                              steps=2, launches=4, kind="allgather")
    p2p = collective_table([(2, 8e6)], latency=(5.0, 10.0), bandwidth=(400.0, 40.0),
                           steps=2, launches=4, kind="sendrecv", run="job")
    p2p["node"] = [f"n0{i % 2}" for i in range(len(p2p))]
    p2p["process_group"] = "pp"
    table = pd.concat([gather, p2p], ignore_index=True)
    table.attrs["runs"] = {"job": {"gpus_per_node": 8}}
    prepared = prepare([table], ModelSpec())
    assert prepared.coords["coll_pair"] == ["allgather/intra", "sendrecv/inter"]
    model = build(prepared, ModelSpec())
    values = model.compile_fn(
        model.replace_rvs_by_values([model["coll_latency_us"], model["coll_bandwidth_gbps"],
                                     model["coll_log_latency_ratio"],
                                     model["coll_log_bandwidth_ratio"]]),
        inputs=model.value_vars, on_unused_input="ignore")
    point = dict(model.initial_point())
    point["coll_log_latency_ratio"] = np.array([0.3, -0.2])
    point["coll_log_bandwidth_ratio"] = np.array([-0.4, 0.1])
    lat, bw, r_lat, r_bw = values(point)
    gather_i, p2p_i = (prepared.coords["collective"].index(c) for c in ("allgather", "sendrecv"))
    assert list(model.coords["coll_extrapolated"]) == ["allgather", "sendrecv"]
    assert lat[gather_i, 1] == pytest.approx(lat[p2p_i, 1] * np.exp(r_lat[0]))
    assert bw[gather_i, 1] == pytest.approx(bw[p2p_i, 1] * np.exp(r_bw[0]))
    assert lat[p2p_i, 0] == pytest.approx(lat[gather_i, 0] * np.exp(r_lat[1]))
    assert bw[p2p_i, 0] == pytest.approx(bw[gather_i, 0] * np.exp(r_bw[1]))
    # the ratios' prior is centred on 1 (log 0), not on the inter/intra prior ratio
    prior_mean = model["coll_log_bandwidth_ratio"].owner.inputs[-2].eval()
    assert np.broadcast_to(prior_mean, 2).tolist() == [0.0, 0.0]


def test_a_send_recv_spans_two_nodes_whatever_its_process_group_spans():
    """A pipeline group spans a node per stage, but each send/recv crosses one link between
    two of them, as the forecast costs it: the fabric exponent's argument is log(2 / 2) = 0.
    It was log(4 / 2) on the dev job, which tied the send/recv level to the exponent (posterior
    correlation -0.69, the whitened coordinate at sd 2.4)."""
    table = collective_table([(2, 8e6)], latency=(5.0, 10.0), bandwidth=(100.0, 40.0),
                             steps=2, launches=4, kind="sendrecv")
    table["process_group"] = "pp"
    table["node"] = [f"n0{i % 4}" for i in range(len(table))]  # a 4-stage group, 4 nodes
    d = prepare([table], ModelSpec()).data
    assert d["coll_cell_tier"].tolist() == [1] * len(d["coll_cell_tier"])
    assert np.all(d["coll_cell_log_nodes_rel"] == 0.0)


def job_and_sweeps(lat=(3.0, 8.0), bw=(350.0, 45.0)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A traced job's all-gathers (noise 0.02, congestion 0.002) and an nccl-tests sweep of
    the same collective (one launch per size and step; noise 0.05, congestion 0.2)."""
    job = collective_table([(8, 6.4e7), (16, 4.3e8)], latency=lat, bandwidth=bw, steps=8,
                           launches=30, noise=0.02, congestion=0.002, seed=7, kind="allgather")
    sweeps = [(p, b) for p in (8, 16, 32) for b in (1e6, 1.6e7, 2.6e8)]
    bench = collective_table(sweeps, latency=lat, bandwidth=bw, steps=6, launches=1,
                             noise=0.05, congestion=0.2, seed=8, kind="allgather", run="bench")
    bench.attrs["runs"] = {"bench": {"gpus_per_node": 8, "benchmark": True}}
    return job, bench


def test_noise_and_congestion_start_at_the_residuals_estimates():
    """The sampler starts the scales where the transfers put them, not at the prior's support
    point (noise 0.3): with thousands of launches that is ~10^4 log units off, and nutpie's
    first warm-up draws then take hundreds of leapfrog steps each. The noise is sampled in
    coordinates where its posterior sd is about one, so the start jitter of ±1 stays near."""
    job, bench = job_and_sweeps()
    spec = ModelSpec()
    model = build(prepare([job, bench], spec), spec)
    start = model.initial_point()
    noise, bench_noise, congestion, bench_congestion = model.compile_fn(
        model.replace_rvs_by_values([model["coll_noise"], model["coll_bench_noise"],
                                     model["coll_congestion"], model["coll_bench_congestion"]]),
        inputs=model.value_vars, on_unused_input="ignore")(start)
    assert float(noise[0]) == pytest.approx(0.02, rel=0.15)
    # one launch per size and step: the benchmark's scales only roughly (the prior's: 0.3, 0.2)
    assert 0.03 < float(bench_noise[0]) < 0.15
    assert 0.1 < float(bench_congestion[0]) < 0.4
    assert float(np.max(congestion)) < 0.02
    # a unit step of the noise's coordinate is about one posterior sd: 1 / sqrt(2 · launches)
    step = dict(start)
    step["coll_noise_z"] = start["coll_noise_z"] + 1.0
    moved = model.compile_fn(model.replace_rvs_by_values([model["coll_noise"]])[0],
                             inputs=model.value_vars, on_unused_input="ignore")(step)
    assert np.log(moved[0] / noise[0]) == pytest.approx(1.0 / np.sqrt(2 * 2 * 8 * 30), rel=1e-6)


def test_benchmark_runs_get_noise_and_congestion_of_their_own():
    lat, bw = (3.0, 8.0), (350.0, 45.0)
    job, bench = job_and_sweeps(lat, bw)
    spec = ModelSpec()
    prepared = prepare([job, bench], spec)
    assert prepared.coords["coll_benchmarked"] == ["allgather"]
    tree = _sample(build(prepared, spec), draws=300, tune=300, seed=5)
    post = tree.posterior
    # the job's own spread, not the benchmark's, is what forecasts read
    assert float(post["coll_congestion"].mean()) < 0.02
    assert float(post["coll_bench_congestion"].mean()) > 0.1
    assert float(post["coll_noise"].mean()) == pytest.approx(0.02, rel=0.1)
    # both sources pin one latency and bandwidth
    inter_bw = post["coll_bandwidth_gbps"].sel(collective="allgather", tier="inter")
    assert float(inter_bw.mean()) == pytest.approx(bw[1], rel=0.05)
    # a benchmark alone keeps the public scales
    alone = prepare([bench], spec)
    assert "coll_benchmarked" not in alone.coords


def test_recovers_degraded_links_from_benchmark_sweeps():
    # nccl-tests-like sweeps on 2-32 nodes, 8 each, bus bandwidth falling as (n / 2)^-0.05;
    # three of them ran on an allocation with a degraded link (bandwidth halved for every
    # size). The mixture finds the slowdown, the rate per node stays near 3 in the 496 nodes
    # swept, and the slow sweeps do not inflate the congestion or bias the bandwidth.
    lat, bw, slowdown = (3.0, 8.0), (350.0, 45.0), np.log(2.0)
    degraded = {7, 21, 38}
    parts = []
    for i, nodes in enumerate(np.repeat([2, 4, 8, 16, 32], 8)):
        part = collective_table(
            [(8 * nodes, b) for b in (1e6, 1e8, 1e9)], latency=lat,
            bandwidth=(bw[0], bw[1] / (2.0 if i in degraded else 1.0)), steps=1, launches=1,
            noise=0.03, congestion=0.02, seed=100 + i, kind="allgather", run="bench",
            fabric=0.05)
        parts.append(part.assign(step=i, rank=i))
    table = pd.concat(parts, ignore_index=True)
    table.attrs["runs"] = {"bench": {"gpus_per_node": 8, "benchmark": True}}
    spec = ModelSpec()
    tree = _sample(build(prepare([table], spec), spec), seed=6)
    post = tree.posterior
    assert float(post["coll_degraded_log_slowdown"].mean()) == pytest.approx(slowdown, abs=0.1)
    rate = post["coll_degraded_rate"].to_numpy()
    assert 0.002 < float(np.median(rate)) < 0.02
    assert float(post["coll_congestion"].mean()) < 0.05
    assert float(post["coll_fabric_exponent"].mean()) == pytest.approx(0.05, abs=0.015)
    inter_bw = post["coll_bandwidth_gbps"].sel(collective="allgather", tier="inter")
    assert float(inter_bw.mean()) == pytest.approx(bw[1], rel=0.05)
    r_hat, ess, divergences = _convergence(
        tree, ["coll_degraded_rate", "coll_degraded_log_slowdown", "coll_bandwidth_gbps"])
    assert r_hat <= 1.01 and ess >= 200 and divergences == 0
