"""Composition of a traced multi-stage job on hand-computable cases: per-stage work read from
the traced stages, fixed-group collectives replayed from their fitted transfers, and collectives
of the whole job costed over every rank of the target."""

from __future__ import annotations

import numpy as np
import pytest
from posterior_builders import kernel_posterior, quiet_compose, tiny_kernel_table

from bayesprism.costs import collectives
from bayesprism.inventory import traced_plan
from bayesprism.plan import Cluster, ParallelPlan, PlanWarning


def _staged(post, stage_of_rank, launches_by_rank):
    """The posterior with per-rank launches and each rank's traced pipeline stage."""
    inv = post["inventory"].to_dataset()
    ranks = np.arange(len(stage_of_rank))
    inv = inv.assign_coords(rank=ranks)
    inv["launches"] = (("kernel", "rank"), np.asarray(launches_by_rank, dtype=float))
    inv["rank_pp_stage"] = ("rank", np.asarray(stage_of_rank))
    post["inventory"] = inv
    return post


def _step_us(post, plan, **options) -> float:
    draws = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(0), **options)
    values = draws.step_time_s * 1e6
    assert np.allclose(values, values.flat[0])
    return float(values.flat[0])


#: two stages' work: "a" 300 µs a micro-batch on stage 0, "b" 600 µs on stage 1
TWO_STAGES = {"a": {"class": "gemm", "launches": 1.0, "log_median": np.log(300.0)},
              "b": {"class": "gemm", "launches": 1.0, "log_median": np.log(600.0)}}


def _two_stage_step_us(extra: dict, extra_launches: list, tp: int = 1) -> float:
    """GPipe step (µs) of :data:`TWO_STAGES` plus ``extra`` kernels, 2 micro-batches, tp
    ranks a stage; ``extra_launches``: per extra kernel, its launches per step on each rank."""
    plan = {"pp": 2, "tp": tp, "microbatches": 2}
    ranks = 2 * tp
    post = kernel_posterior({**TWO_STAGES, **extra}, traced_plan=plan, gpus_per_node=ranks,
                            traced_ranks=ranks)
    stage0 = [2.0] * tp + [0.0] * tp
    post = _staged(post, [0] * tp + [1] * tp, [stage0, stage0[::-1], *extra_launches])
    target = ParallelPlan(pp=2, tp=tp, microbatches=2, schedule="gpipe", gpus_per_node=ranks)
    return _step_us(post, target)


def test_each_stage_runs_its_own_traced_work():
    # stage 0 runs "a" (300 µs a micro-batch), stage 1 runs "b" (600 µs): forward 1/3,
    # backward 2/3 of it. GPipe, 2 micro-batches, no transfers:
    #   s0 F [0,100] [100,200]; s1 F [100,300] [300,500]; s1 B [500,900] [900,1300];
    #   s0 B [900,1100] [1300,1500]  -> 1500 µs
    # (with the stages' mean work, 450 µs each, it would be 1350 µs)
    assert _two_stage_step_us({}, []) == pytest.approx(1500.0)
    # without stages in the inventory the stages share the mean work
    flat = kernel_posterior(TWO_STAGES, traced_plan={"pp": 2, "microbatches": 2},
                            gpus_per_node=2, traced_ranks=2)
    target = ParallelPlan(pp=2, microbatches=2, schedule="gpipe", gpus_per_node=2)
    assert _step_us(flat, target) == pytest.approx(1350.0)


def _three_stage_job():
    """Traced pp 3 at dp 2 (one GPU a node, 2 micro-batches): every stage runs "g" (300 µs a
    micro-batch: its layers), stage 0 also "emb" (30 µs), stage 2 also "head" (90 µs); each
    stage's gradient all-reduce carries 3 MB (its layers), 1 MB more on stage 0 and 2 MB more
    on stage 2, in one bucket."""
    kernels = {"g": {"class": "gemm", "launches": 1.0, "log_median": np.log(300.0)},
               "emb": {"class": "gemm", "launches": 1.0, "log_median": np.log(30.0)},
               "head": {"class": "gemm", "launches": 1.0, "log_median": np.log(90.0)},
               "ar [dp]": {"class": "allreduce", "role": "dp", "launches": 1.0,
                           "log_median": np.log(10.0), "bytes": 4e6, "group": 2.0}}
    post = kernel_posterior(kernels, traced_plan={"pp": 3, "dp": 2, "microbatches": 2},
                            gpus_per_node=1, traced_ranks=6)
    stage = [0, 0, 1, 1, 2, 2]
    post = _staged(post, stage, [[2] * 6, [2, 2, 0, 0, 0, 0], [0, 0, 0, 0, 2, 2], [1] * 6])
    inv = post["inventory"].to_dataset()
    stage_bytes = np.full((4, 3), np.nan)
    stage_bytes[3] = [4e6, 3e6, 5e6]
    inv["stage_bytes"] = (("kernel", "pp_stage"), stage_bytes)
    post = post.copy()
    post["inventory"] = inv
    return post


@pytest.mark.filterwarnings("ignore::bayesprism.plan.PlanWarning")
def test_another_pipeline_depth_keeps_the_first_and_last_stages_own_work():
    from bayesprism.forecast.workload import build_plan_model

    post = _three_stage_job()
    per_mb = {}
    for pp in (3, 6, 1):
        plan = ParallelPlan(pp=pp, dp=2, microbatches=2, schedule="gpipe", gpus_per_node=1)
        model = build_plan_model(post, plan)
        per_mb[pp] = (model.fwd_us + model.bwd_us)[0]
        dp = {t.stage: float(t.det_us[0]) for t in model.comms if t.where == "dp"}
        # the stages' gradients: 3 MB of layers split over the stages, the ends' own on them,
        # in the traced buckets, else buckets of the traced mean size (4 MB): one stage
        # holding all 12 MB sends three
        bytes_ = {3: [4e6, 3e6, 5e6], 6: [2.5e6, 1.5e6, 1.5e6, 1.5e6, 1.5e6, 3.5e6],
                  1: [12e6]}[pp]
        buckets = [1, 1, 1] if pp == 3 else [int(np.ceil(b / 4e6)) for b in bytes_]
        cost = [n * collectives.transfer_time_us("allreduce", 2, b / n, 10.0, 25.0)
                for b, n in zip(bytes_, buckets, strict=True)]
        assert [dp[s] for s in range(pp)] == pytest.approx(cost)
    # per micro-batch: the layers' 3 x 300 µs split over the stages, emb and head stay put
    # (the traced stages' mean on every stage would give 340 µs, 170 µs and 1,020 µs)
    assert per_mb[3] == pytest.approx([330.0, 300.0, 390.0])
    assert per_mb[6] == pytest.approx([180.0, 150.0, 150.0, 150.0, 150.0, 240.0])
    assert per_mb[1] == pytest.approx([1020.0])
    # tp 2 halves each stage's work, its own ends' included, and each GPU's gradients
    model = build_plan_model(post, ParallelPlan(tp=2, pp=3, dp=2, microbatches=2,
                                                schedule="gpipe", gpus_per_node=2))
    assert (model.fwd_us + model.bwd_us)[0] == pytest.approx([165.0, 150.0, 195.0])
    dp = [float(t.det_us[0]) for t in model.comms if t.where == "dp" and t.stage is not None]
    assert dp == pytest.approx([collectives.transfer_time_us("allreduce", 2, b, 10.0, 25.0)
                                for b in (2e6, 1.5e6, 2.5e6)])


def test_pipeline_transfers_follow_a_stages_place_not_its_layers():
    from bayesprism.forecast.workload import retarget_stages

    # send/recv per step: 2m on the first and last stage, 4m on the others (m = 8), whatever
    # the depth; the layers' work follows the depth
    launches = np.array([[16.0, 32.0, 32.0, 16.0], [8.0, 8.0, 8.0, 8.0]])
    transfers = np.array([True, False])
    own = retarget_stages(launches, 8, transfers) * 4 / 8
    assert own.tolist() == [[16.0] + [32.0] * 6 + [16.0], [4.0] * 8]
    assert retarget_stages(launches, 2, transfers)[0].tolist() == [8.0, 8.0]  # (x 4/2: 16)
    assert retarget_stages(launches, 1, transfers)[0].tolist() == [0.0]
    assert retarget_stages(launches[:, :2], 4, transfers) is None  # no middle stage traced


def test_each_stage_waits_for_its_own_collectives():
    # as above, with a tensor-parallel all-gather (50 µs fitted transfer) that only stage 1
    # runs, once a micro-batch: stage 1 forward 200 + 25, backward 400 + 25.
    #   s0 F [0,100] [100,200]; s1 F [100,325] [325,550]; s1 B [550,975] [975,1400];
    #   s0 B [975,1175] [1400,1600]  -> 1600 µs
    # (spread over both stages, 12.5 µs each way on each, it would be 1575 µs)
    gather = {"ag [tp]": {"class": "allgather", "role": "tp", "launches": 1.0,
                          "log_median": np.log(50.0), "bytes": 1e6, "group": 2.0}}
    assert _two_stage_step_us(gather, [[0.0, 0.0, 2.0, 2.0]], tp=2) == pytest.approx(1600.0)


def test_pipeline_transfers_occupy_their_stages():
    # as above, with pipeline send/recv (fitted transfer 20 µs) launched twice a step on each
    # stage: h = 10 µs more in every forward and backward, no edge delay.
    #   s0 F ends 110, 220; s1 F 320, 530; s1 B 940, 1350; s0 B 1160, 1560  -> 1560 µs
    # (as a 20 µs delay on every edge between the stages: 1540 µs)
    transfers = {"sr [pp]": {"class": "sendrecv", "role": "pp", "launches": 2.0,
                             "log_median": np.log(20.0), "bytes": 1e6, "group": 2.0}}
    assert _two_stage_step_us(transfers, [[2.0, 2.0]]) == pytest.approx(1560.0)


def _tp_job(**cost):
    kernels = {"g": {"class": "gemm", "launches": 4.0, "log_median": np.log(100.0)},
               "ag [tp]": {"class": "allgather", "role": "tp", "launches": 4.0,
                           "log_median": np.log(50.0), "bytes": 1e6, "group": 2.0}}
    return kernel_posterior(kernels, traced_plan={"tp": 2, "microbatches": 2},
                            gpus_per_node=8, **cost)


def test_tensor_parallel_collectives_replay_their_fitted_transfer():
    # 4 GEMMs of 100 µs and 4 all-gathers whose fitted transfer is 50 µs: 600 µs, whatever
    # the cost model says (it is absurdly slow here)
    slow_model = {"latency_us": {"intra": 1e4, "inter": 1e4}}
    plan = ParallelPlan(tp=2, microbatches=2, gpus_per_node=8)
    assert _step_us(_tp_job(**slow_model), plan) == pytest.approx(600.0)
    assert _step_us(_tp_job(), plan) == pytest.approx(600.0)


def test_a_new_tensor_parallel_degree_uses_the_cost_model():
    # tp 4: the group was never measured; GEMM work halves (400 -> 200 µs) and the 4
    # all-gathers cost latency * 3 steps + bytes * 3/4 / bandwidth at the intra-node tier
    plan = ParallelPlan(tp=4, microbatches=2, gpus_per_node=8)
    per_launch = collectives.transfer_time_us("allgather", 4, 1e6, 5.0, 100.0)
    assert _step_us(_tp_job(), plan) == pytest.approx(200.0 + 4 * per_launch)


def test_tensor_parallel_groups_that_straddle_nodes_cost_at_the_inter_node_tier():
    # tp 3 on 8-GPU nodes: the group of ranks 6-8 spans two nodes, and the step waits for it,
    # so every all-gather costs at the inter-node tier (10 µs, 25 GB/s) over two nodes
    with pytest.warns(PlanWarning, match="straddle two nodes"):
        plan = ParallelPlan(tp=3, microbatches=2, gpus_per_node=8)
    per_launch = collectives.transfer_time_us("allgather", 3, 1e6, 10.0, 25.0)
    assert _step_us(_tp_job(), plan) == pytest.approx(800.0 / 3 + 4 * per_launch)


def test_a_global_collective_spans_every_rank_of_the_target():
    # a gradient-norm all-reduce over the whole job: its ring cost grows with the world size
    kernels = {"g": {"class": "gemm", "launches": 1.0, "log_median": np.log(1000.0)},
               "norm [global]": {"class": "allreduce", "role": "global", "launches": 1.0,
                                 "log_median": np.log(10.0), "bytes": 4.0, "group": 8.0}}
    post = kernel_posterior(kernels, traced_plan={"dp": 8}, gpus_per_node=8)
    steps = {dp: _step_us(post, ParallelPlan(dp=dp, gpus_per_node=8)) for dp in (8, 64)}
    expected = {dp: 1000.0 + collectives.transfer_time_us("allreduce", dp, 4.0, 5.0 if dp == 8
                                                          else 10.0, 100.0 if dp == 8 else 25.0)
                for dp in (8, 64)}
    assert steps == pytest.approx(expected)


def test_traced_sharding_and_schedule_come_with_the_traced_plan():
    table = tiny_kernel_table()
    (run,) = table["run"].astype(str).unique()
    table.attrs["runs"] = {run: {"world_size": 4, "plan": {"dp": 4, "sharding": "zero1",
                                                           "schedule": "gpipe"}}}
    plan = traced_plan(table)
    assert (plan["sharding"], plan["schedule"]) == ("zero1", "gpipe")


def test_a_tree_all_reduce_grows_with_log2_of_the_ranks():
    # NCCL's tree (named in the kernel) takes 2·log2(p) latency steps: at 1,024 ranks 20, where
    # a ring would take 2,046
    kernels = {"g": {"class": "gemm", "launches": 1.0, "log_median": np.log(1000.0)},
               "ncclDevKernel_AllReduce_Sum_f32_TREE_LL [global]": {
                   "class": "allreduce", "role": "global", "launches": 1.0,
                   "log_median": np.log(10.0), "bytes": 4.0, "group": 8.0}}
    post = kernel_posterior(kernels, traced_plan={"dp": 8}, gpus_per_node=8)
    step = _step_us(post, ParallelPlan(dp=1024, gpus_per_node=8))
    assert step == pytest.approx(1000.0 + 20 * 10.0 + 4.0 * 2 * 1023 / 1024 / (25.0 * 1e3))


def test_inter_node_bandwidth_falls_with_the_nodes_a_ring_spans():
    # a 1 GB gradient all-reduce over data-parallel replicas of one GPU per node: at 8 nodes
    # the fitted inter-node bandwidth (25 GB/s) times (8 / 2)^-0.1; a stated link overrides it
    kernels = {"g": {"class": "gemm", "launches": 1.0, "log_median": np.log(1000.0)},
               "ar [dp]": {"class": "allreduce", "role": "dp", "launches": 1.0,
                           "log_median": np.log(10.0), "bytes": 1e9, "group": 2.0}}
    post = kernel_posterior(kernels, traced_plan={"dp": 2}, gpus_per_node=1)
    group = post["posterior"].to_dataset()
    shape = (group.sizes["chain"], group.sizes["draw"])
    post["posterior"] = group.assign(coll_fabric_exponent=(("chain", "draw"),
                                                           np.full(shape, 0.1)))
    plan = ParallelPlan(dp=8, gpus_per_node=1)
    bandwidth = 25.0 * 4.0**-0.1
    expected = 1000.0 + collectives.transfer_time_us("allreduce", 8, 1e9, 10.0, bandwidth)
    assert _step_us(post, plan) == pytest.approx(expected)
    stated = Cluster(gpus_per_node=1, tiers={"inter": {"bandwidth_gbps": 25.0}})
    assert _step_us(post, plan, cluster=stated) == pytest.approx(
        1000.0 + collectives.transfer_time_us("allreduce", 8, 1e9, 10.0, 25.0))


def test_an_unfitted_fabric_exponent_keeps_its_prior():
    # no group of the fit spanned more than two nodes: γ per draw from its half-normal prior
    from bayesprism.forecast.workload import posterior_arrays
    from bayesprism.spec import DEFAULT_PRIORS

    kernels = {"g": {"class": "gemm", "launches": 1.0, "log_median": np.log(1000.0)},
               "ar [dp]": {"class": "allreduce", "role": "dp", "launches": 1.0,
                           "log_median": np.log(10.0), "bytes": 1e9, "group": 2.0}}
    gamma = posterior_arrays(kernel_posterior(kernels, draws=2000)).fabric_exponent
    scale = DEFAULT_PRIORS["fabric_exponent"]
    assert np.mean(gamma) == pytest.approx(scale * np.sqrt(2.0 / np.pi), rel=0.01)
    assert np.quantile(gamma, 0.95) == pytest.approx(scale * 1.96, rel=0.02)


def _gradient_job(degraded_link, draws=10):
    kernels = {"g": {"class": "gemm", "launches": 1.0, "log_median": np.log(1000.0)},
               "ar [dp]": {"class": "allreduce", "role": "dp", "launches": 1.0,
                           "log_median": np.log(10.0), "bytes": 1e9, "group": 2.0}}
    post = kernel_posterior(kernels, traced_plan={"dp": 2}, gpus_per_node=1,
                            degraded_link=degraded_link, draws=draws)
    group = post["posterior"].to_dataset()  # a flat fabric: bandwidth independent of nodes
    post["posterior"] = group.assign(coll_fabric_exponent=(
        ("chain", "draw"), np.zeros((group.sizes["chain"], group.sizes["draw"]))))
    return post


def test_a_degraded_link_slows_the_inter_node_transfers_of_every_step():
    # rate 1: every cluster has one; the 1 GB all-reduce over 8 nodes then moves its bytes at
    # a third of the bandwidth, in every step; rate 0: never
    plan = ParallelPlan(dp=8, gpus_per_node=1)
    clean = 1000.0 + collectives.transfer_time_us("allreduce", 8, 1e9, 10.0, 25.0)
    slowed = 1000.0 + collectives.transfer_time_us("allreduce", 8, 1e9, 10.0, 25.0 / 3.0)
    assert _step_us(_gradient_job((0.0, np.log(3.0))), plan) == pytest.approx(clean)
    assert _step_us(_gradient_job((1.0, np.log(3.0))), plan) == pytest.approx(slowed)
    # the typical (variability-free) step never has one
    draws = quiet_compose(_gradient_job((1.0, np.log(3.0))), plan, replicates=2,
                          rng=np.random.default_rng(0))
    assert draws.ideal_step_time_s * 1e6 == pytest.approx(clean)
    assert draws.degraded_link_probability == 1.0


def test_the_chance_of_a_degraded_link_grows_with_the_nodes():
    # P = 1 - (1 - r)^nodes per cluster: r = 0.01 over 8 nodes (one GPU each) is 7.7 %, and
    # the clusters drawn with one are that share of the draws
    post = _gradient_job((0.01, np.log(3.0)))
    plan = ParallelPlan(dp=8, gpus_per_node=1)
    draws = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(0))
    assert draws.degraded_link_probability == pytest.approx(1.0 - 0.99**8)
    post = _gradient_job((0.01, np.log(3.0)), draws=4000)
    steps = quiet_compose(post, plan, replicates=2, rng=np.random.default_rng(1)).step_time_s
    clean = 1000.0 + collectives.transfer_time_us("allreduce", 8, 1e9, 10.0, 25.0)
    slow_share = float((steps[:, 0] * 1e6 > clean * 1.01).mean())
    assert slow_share == pytest.approx(1.0 - 0.99**8, abs=0.015)
    assert np.all(steps[:, 0] == steps[:, 1])  # a property of the cluster, not of a step


def _staged_gradient_job(rate: float, draws: int):
    """:data:`TWO_STAGES` traced at dp 2 on one-GPU nodes, with each stage's gradient
    all-reduce (1 launch a step: 4 MB on stage 0, 10 MB on stage 1) and degraded links at
    ``rate`` that move bytes 3x slower."""
    ar = {"ar [dp]": {"class": "allreduce", "role": "dp", "launches": 1.0,
                      "log_median": np.log(10.0), "bytes": 7e6, "group": 2.0}}
    post = kernel_posterior({**TWO_STAGES, **ar}, traced_plan={"pp": 2, "dp": 2,
                                                               "microbatches": 2},
                            gpus_per_node=1, traced_ranks=4, draws=draws,
                            degraded_link=(rate, np.log(3.0)))
    # ranks tp fastest, then dp, then pp: ranks 0, 1 run stage 0
    post = _staged(post, [0, 0, 1, 1], [[2, 2, 0, 0], [0, 0, 2, 2], [1, 1, 1, 1]])
    inv = post["inventory"].to_dataset()
    stage_bytes = np.full((3, 2), np.nan)
    stage_bytes[2] = [4e6, 1e7]
    inv["stage_bytes"] = (("kernel", "pp_stage"), stage_bytes)
    group = post["posterior"].to_dataset()  # a flat fabric: bandwidth independent of nodes
    post = post.copy()
    post["inventory"] = inv
    post["posterior"] = group.assign(coll_fabric_exponent=(
        ("chain", "draw"), np.zeros((group.sizes["chain"], group.sizes["draw"]))))
    return post


def test_a_degraded_link_slows_the_stage_that_holds_the_node():
    # dp 4 on one-GPU nodes: each stage's ring all-reduce spans its 4 nodes (4 MB on stage 0,
    # 10 MB on stage 1, 10 µs latency, 25 GB/s) after its own last backward (GPipe, 2
    # micro-batches: stage 1 ends at 1300 µs, stage 0 at 1500 µs). A degraded node slows the
    # rings of its own stage only (3x slower bytes), so a degraded node on stage 0 costs
    # less than one on stage 1: stage 0's collective ends later but moves less.
    def ring(nbytes, slowdown=1.0):
        return collectives.transfer_time_us("allreduce", 4, nbytes, 10.0, 25.0 / slowdown)

    clean = [1500.0 + ring(4e6), 1300.0 + ring(1e7)]
    slowed = [1500.0 + ring(4e6, 3.0), 1300.0 + ring(1e7, 3.0)]
    outcomes = {"none": max(clean), "stage 0": max(slowed[0], clean[1]),
                "stage 1": max(clean[0], slowed[1])}
    assert outcomes["none"] < outcomes["stage 0"] < outcomes["stage 1"] == max(slowed)
    plan = ParallelPlan(pp=2, dp=4, microbatches=2, schedule="gpipe", gpus_per_node=1)
    assert _step_us(_staged_gradient_job(0.0, 10), plan) == pytest.approx(outcomes["none"])
    assert _step_us(_staged_gradient_job(1.0, 10), plan) == pytest.approx(max(slowed))
    # rate 0.1: each stage (4 nodes) holds one with p = 1 - 0.9^4, independently
    draws = quiet_compose(_staged_gradient_job(0.1, 4000), plan, replicates=2,
                          rng=np.random.default_rng(3))
    assert draws.degraded_link_probability == pytest.approx(1.0 - 0.9**8)
    steps = draws.step_time_s[:, 0] * 1e6
    p = 1.0 - 0.9**4
    shares = {name: float(np.isclose(steps, value).mean()) for name, value in outcomes.items()}
    assert shares == pytest.approx({"none": (1 - p) ** 2, "stage 0": p * (1 - p),
                                    "stage 1": p}, abs=0.025)


@pytest.mark.filterwarnings("ignore::bayesprism.plan.PlanWarning")
def test_what_a_plan_takes_from_formulas_rather_than_the_traces_is_named():
    post = _staged_gradient_job(0.0, 2)

    def notes(**plan) -> tuple[str, ...]:
        plan = {"pp": 2, "dp": 2, "microbatches": 2, "gpus_per_node": 1, **plan}
        return quiet_compose(post, ParallelPlan(**plan), replicates=1,
                             rng=np.random.default_rng(0)).extrapolated

    assert notes() == ()  # the traced layout: every part of the step as traced
    assert notes(dp=4) == ("data-parallel allreduce from the collective cost model over 4 "
                           "ranks, inter-node (traced 2)",)
    fewer_stages = notes(pp=1)
    assert fewer_stages[0].startswith("layers per stage scaled by pp 2 -> 1: every stage the "
                                      "traced stages' mean work")
    assert fewer_stages[1:] == ("data-parallel allreduce from the collective cost model over "
                                "2 ranks, inter-node (traced 2; the gradients of 1/1 of the "
                                "model, traced 1/2)",)
    assert notes(microbatches=4) == ("micro-batches 2 -> 4: the traced work per micro-batch in "
                                     "the schedule's recursion",)
    assert notes(tp=2)[0] == "compute per GPU scaled by tp x cp 1 -> 2 (work / 2)"
    assert notes(sharding="zero1")[0].startswith("sharding zero1 (traced none)")


def test_a_tier_the_fit_never_measured_is_named_as_from_its_prior():
    # the gradient all-reduce crosses nodes, but the fit measured it within a node only (its
    # inter-node rows had no wait/transfer split): its cost there is the prior's ratio's
    post = _staged_gradient_job(0.0, 2)
    group = post["posterior"].to_dataset()
    intra = [p for p in group["coll_pair"].to_numpy() if str(p).endswith("/intra")]
    post["posterior"] = group.sel(coll_pair=intra)
    draws = quiet_compose(post, ParallelPlan(pp=2, dp=2, microbatches=2, gpus_per_node=1),
                          replicates=1, rng=np.random.default_rng(0))
    assert draws.extrapolated == (
        "allreduce at the inter-node tier from the prior's inter/intra ratio: the fit "
        "measured none of their transfers there (e.g. ranks of their groups without trace "
        "files, whose waits cannot be split off); fit nccl-tests sweeps to learn it",)
    # with another collective measured across nodes, the fit takes that one's link
    post["posterior"] = group.assign_coords(coll_pair=[
        "allreduce/intra" if str(p).startswith("allreduce/intra") else "sendrecv/inter"
        for p in group["coll_pair"].to_numpy()])
    draws = quiet_compose(post, ParallelPlan(pp=2, dp=2, microbatches=2, gpus_per_node=1),
                          replicates=1, rng=np.random.default_rng(0))
    assert draws.extrapolated[0].startswith(
        "allreduce at the inter-node tier from the sendrecv there times a ratio of prior "
        "median 1: the fit measured none")


def test_nodes_that_hold_ranks_of_two_stages_degrade_both():
    from bayesprism.forecast.composition import degraded_stages, stage_node_blocks
    from bayesprism.forecast.workload import PlanModel

    # tp 4 on 8-GPU nodes, dp 1: each node holds two stages (0-1, 2-3); pp 4, dp 2: one
    # node per replica and stage
    plan = ParallelPlan(tp=4, pp=4, microbatches=8, gpus_per_node=8)
    counts, stages = stage_node_blocks(plan, 8)
    assert counts.tolist() == [1, 1] and stages.sum(axis=1).tolist() == [2, 2]
    wide = ParallelPlan(dp=3, tp=8, pp=4, microbatches=8, gpus_per_node=8)
    counts, stages = stage_node_blocks(wide, 8)
    assert counts.tolist() == [3, 3, 3, 3] and np.array_equal(stages, np.eye(4, dtype=bool))
    # ranks of a stage not a multiple of the node: tp 4, dp 3 -> 12 ranks a stage on 8-GPU
    # nodes; the nodes holding ranks of stages 0 and 1 count for both
    odd = ParallelPlan(dp=3, tp=4, pp=2, microbatches=8, gpus_per_node=8)
    counts, stages = stage_node_blocks(odd, 8)
    assert counts.tolist() == [1, 1, 1]
    assert stages.astype(int).tolist() == [[1, 0], [1, 1], [0, 1]]

    def model(rate: float) -> PlanModel:
        d = 20_000
        zeros = np.zeros(d)
        return PlanModel(plan=plan, gpus_per_node=8, fwd_us=np.zeros((d, 4)),
                         bwd_us=np.zeros((d, 4)), opt_us=zeros, loading={}, resid_mu=zeros,
                         resid_sd=zeros, degraded_rate=np.full(d, rate))

    hit = degraded_stages(model(0.2), np.random.default_rng(0))
    assert np.array_equal(hit[:, 0], hit[:, 1]) and np.array_equal(hit[:, 2], hit[:, 3])
    assert hit[:, [0, 2]].mean(axis=0) == pytest.approx([0.2, 0.2], abs=0.01)
    assert np.corrcoef(hit[:, 0], hit[:, 2])[0, 1] == pytest.approx(0.0, abs=0.03)
    # common random numbers: a higher rate degrades a superset of the stages
    more = degraded_stages(model(0.4), np.random.default_rng(0))
    assert np.all(more >= hit) and more.mean() > hit.mean()


def test_unfitted_degraded_links_keep_their_priors():
    # a fit without several units of inter-node transfers: r ~ Beta(1, b), δ ~ half-normal
    from bayesprism.forecast.workload import posterior_arrays
    from bayesprism.spec import DEFAULT_PRIORS

    kernels = {"g": {"class": "gemm", "launches": 1.0, "log_median": np.log(1000.0)},
               "ar [dp]": {"class": "allreduce", "role": "dp", "launches": 1.0,
                           "log_median": np.log(10.0), "bytes": 1e9, "group": 2.0}}
    rate, slowdown = posterior_arrays(
        kernel_posterior(kernels, draws=2000, degraded_link=None)).degraded_link
    b, scale = DEFAULT_PRIORS["degraded_link_beta"], DEFAULT_PRIORS["degraded_link_slowdown"]
    assert np.mean(rate) == pytest.approx(1.0 / (1.0 + b), rel=0.02)
    assert np.median(rate) == pytest.approx(1.0 - 0.5 ** (1.0 / b), rel=0.02)
    assert np.mean(slowdown) == pytest.approx(scale * np.sqrt(2.0 / np.pi), rel=0.01)
    assert abs(np.corrcoef(rate, slowdown)[0, 1]) < 0.1


@pytest.mark.filterwarnings("ignore::bayesprism.plan.PlanWarning")
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_stage_waits_for_the_slowest_of_its_data_parallel_rings(tp):
    # each of a stage's tp data-parallel groups is its own ring with its own launch noise
    # (lognormal, sd 0.1 in logs); the congestion of the step moves them together. Two
    # independent rings: E[max(e^{sX1}, e^{sX2})] = 2 e^{s^2/2} Phi(s/sqrt2) = 1.0618 at
    # s = 0.1, against the single ring's e^{s^2/2} = 1.0050; four: 1.1057 (numerically).
    import dataclasses

    from scipy import integrate, stats

    from bayesprism.forecast import composition
    from bayesprism.forecast.workload import build_plan_model

    s = 0.1
    model = build_plan_model(_three_stage_job(), ParallelPlan(
        tp=tp, pp=3, dp=2, microbatches=2, schedule="gpipe", gpus_per_node=tp))
    noisy = [dataclasses.replace(t, noise_mean_log=np.zeros(model.draws),
                                 noise_sd_log=np.full(model.draws, s))
             for t in model.comms]
    model = dataclasses.replace(model, comms=noisy)
    det = {t.stage: float(t.det_us[0]) for t in model.comms if t.where == "dp"}

    def expected_max(rings):  # E[max of `rings` iid lognormals], by quadrature
        def integrand(z):
            return np.exp(s * z) * rings * stats.norm.pdf(z) * stats.norm.cdf(z) ** (rings - 1)
        return integrate.quad(integrand, -10, 10)[0]

    assert expected_max(2) == pytest.approx(2 * np.exp(s**2 / 2) * stats.norm.cdf(s / np.sqrt(2)))
    rng = np.random.default_rng(0)
    shared = composition._draw_shared(model, 20_000, rng, np.random.default_rng(1))
    mean = shared.dp_stage_us.mean(axis=(0, 1))
    assert mean == pytest.approx([det[k] * expected_max(tp) for k in range(3)], rel=2e-3)
    # congestion alone moves every ring of the step together: no wait between them
    congested = [dataclasses.replace(t, noise_sd_log=np.zeros(model.draws),
                                     congestion_sd=np.full(model.draws, s)) for t in noisy]
    shared = composition._draw_shared(dataclasses.replace(model, comms=congested), 20_000, rng,
                                      np.random.default_rng(1))
    assert shared.dp_stage_us.mean(axis=(0, 1)) == pytest.approx(
        [det[k] * np.exp(s**2 / 2) for k in range(3)], rel=2e-3)
