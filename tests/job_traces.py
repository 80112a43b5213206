"""Small hand-written Kineto traces of a TP x PP x DP job, for the layout and role tests.

Each rank's step is its pipeline schedule (``bayesprism.ingest.pipeline.schedule_ops``): a
forward runs ``gemm`` (100 µs), a TP all-reduce and ``gemm`` again (300 µs: another shape under
the same name); a backward twice as long; point-to-point ops on the pipeline group; then the
gradient reduce-scatter and parameter all-gather on the data-parallel group, and the
optimizer. Ranks are ordered tp fastest, then dp, then pp (Megatron).
"""

from __future__ import annotations

import json
from pathlib import Path

from bayesprism.ingest.pipeline import schedule_ops

DESCRIPTIONS = {
    "megatron": {"tp": "TENSOR_MODEL_PARALLEL_GROUP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
                 "dp": "DATA_PARALLEL_GROUP"},
    "mesh": {"tp": "mesh_tp", "pp": "mesh_pp", "dp": "mesh_dp_shard"},
    "none": {"tp": "undefined", "pp": "undefined", "dp": "undefined"},
}


def rank_of(tp_rank: int, dp_rank: int, stage: int, tp: int, dp: int) -> int:
    return tp_rank + tp * (dp_rank + dp * stage)


def job_groups(tp: int, pp: int, dp: int) -> dict[str, list[list[int]]]:
    """Every group of each dimension, as rank lists."""
    out: dict[str, list[list[int]]] = {"tp": [], "pp": [], "dp": []}
    for s in range(pp):
        for d in range(dp):
            out["tp"].append([rank_of(t, d, s, tp, dp) for t in range(tp)])
    for s in range(pp):
        for t in range(tp):
            out["dp"].append([rank_of(t, d, s, tp, dp) for d in range(dp)])
    for d in range(dp):
        for t in range(tp):
            out["pp"].append([rank_of(t, d, s, tp, dp) for s in range(pp)])
    return out


def _group_name(dim: str, ranks: list[int]) -> str:
    return f"{dim}-{ranks[0]}-{ranks[-1]}"


class _Timeline:
    """One rank's GPU kernels, back to back."""

    def __init__(self, device: int, groups: dict, descriptions: dict | None) -> None:
        self.device, self.groups, self.descriptions = device, groups, descriptions
        self.events: list[dict] = []
        self.clock = 1_000_000.0

    def kernel(self, name: str, dur: float, *, dim: str | None = None, op: str | None = None,
               nelems: int = 0) -> None:
        args = {"device": self.device, "stream": 7 if dim is None else 20,
                "grid": [132, 1, 1], "block": [384, 1, 1]}
        if dim is not None:
            g = self.groups[dim]
            args.update({"Collective name": op, "In msg nelems": nelems,
                         "Out msg nelems": nelems, "Group size": len(g), "dtype": "BFloat16",
                         "Process Group Name": _group_name(dim, g),
                         "Process Group Ranks": json.dumps(g)})
            if self.descriptions is not None:
                args["Process Group Description"] = self.descriptions[dim]
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7,
                            "ts": self.clock, "dur": dur, "args": args})
        self.clock += dur + 2.0


def write_job(folder: Path, *, tp: int = 2, pp: int = 2, dp: int = 2, microbatches: int = 4,
              schedule: str = "1f1b", names: str = "megatron", steps: int = 2,
              describe_kernels: bool = True, gpus_per_node: int = 4,
              edit=None) -> Path:
    """Write one trace file per rank into ``folder`` and return it.

    ``names`` picks the group descriptions (:data:`DESCRIPTIONS`); ``describe_kernels=False``
    leaves ``Process Group Description`` out of the kernel args. ``edit(rank, trace)`` may
    change a rank's trace dict before it is written (to make bad input).
    """
    folder.mkdir(parents=True, exist_ok=True)
    world = tp * pp * dp
    groups = job_groups(tp, pp, dp)
    desc = DESCRIPTIONS[names]
    for rank in range(world):
        stage = rank // (tp * dp)
        mine = {dim: next(g for g in groups[dim] if rank in g) for dim in groups}
        pg_config = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": world,
                      "ranks": list(range(world))}]
        pg_config += [{"pg_name": _group_name(dim, g), "pg_desc": desc[dim], "pg_size": len(g),
                       "ranks": g} for dim, g in mine.items()]
        line = _Timeline(rank % gpus_per_node, mine, desc if describe_kernels else None)
        plan = schedule_ops(schedule, stage, pp, microbatches)
        for step in range(steps):
            start = line.clock
            for i, chunk in enumerate(plan.chunks):
                for phase, _ in chunk:
                    scale = 1.0 if phase == "F" else 2.0
                    line.kernel("gemm_bf16_kernel", 100 * scale)
                    if tp > 1:
                        line.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 30, dim="tp",
                                    op="allreduce", nelems=1 << 20)
                    line.kernel("gemm_bf16_kernel", 300 * scale)
                if i < len(plan.ops):
                    line.kernel("ncclDevKernel_SendRecv", 40, dim="pp", op=plan.ops[i][0],
                                nelems=1 << 20)
            if dp > 1:
                line.kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 500, dim="dp",
                            op="_reduce_scatter_base", nelems=1 << 24)
            line.kernel("multi_tensor_apply_kernel_AdamFunctor", 200)
            if dp > 1:
                line.kernel("ncclDevKernel_AllGather_RING_LL", 500, dim="dp",
                            op="_allgather_base", nelems=1 << 24)
            line.events.append({"ph": "X", "cat": "gpu_user_annotation",
                                "name": f"ProfilerStep#{step}", "pid": 0, "tid": 7,
                                "ts": start - 1, "dur": line.clock - start + 1})
        events = line.events
        trace = {"schemaVersion": 1,
                 "deviceProperties": [{"id": i, "name": "NVIDIA H100"} for i in
                                      range(gpus_per_node)],
                 "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world,
                                     "pg_config": pg_config},
                 "traceEvents": events}
        if edit is not None:
            edit(rank, trace)
        host = f"host{rank // gpus_per_node}"
        (folder / f"{host}_{1000 + rank}.1700000000000.pt.trace.json").write_text(
            json.dumps(trace))
    return folder
