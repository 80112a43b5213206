"""Synthetic multi-rank PyTorch-profiler (Kineto) traces with known truth.

:func:`simulate` writes one ``<host>_<pid>.<timestamp_ms>.pt.trace.json.gz`` per rank (the names
``torch.profiler.tensorboard_trace_handler`` gives) and ``truth.json`` with every parameter, so a
fit can be checked against the values that generated the data.

The generative model is DESIGN §5. A training step is a fixed program of GPU kernels (a
transformer-like sequence: per layer a forward and a backward pass of GEMM, attention, norm and
element-wise kernels; a loss; data-parallel gradient AllReduce buckets interleaved with the
backward pass; a fused optimizer). Launch *i* of compute kernel *k* (class *c*) on GPU *g* of node
*n* at step *s* lasts

    log d_i = a_k + λn_c·u_n + λg_c·v_g + λs_c·w_s + λgs_c·z_(g,s) + λε_c·ε_i      (µs)

with ``u_n ~ N(0, 1)`` for healthy nodes and ``N(degraded_shift, 0.5²)`` for the degraded ones
(a mixture population with a slow component), ``v_g, w_s, z_(g,s), ε_i ~ N(0, 1)``. Kernels run
back to back on one compute stream, separated by launch gaps. A collective *starts on each rank
when that rank arrives* (its previous kernel ended) and *ends on every rank at the latest arrival
plus the transfer time*, so ranks that arrive early wait inside the NCCL kernel exactly as in real
traces; the compute stream resumes when the collective ends. The transfer follows the ring cost
model of :mod:`bayesprism.costs.collectives` (inter-node tier when the group spans nodes) times
``exp(congestion_s + noise)``: a per-step congestion effect shared by every call of that
collective class in the step, and lognormal noise per call.

Everything is drawn from one ``numpy.random.Generator(seed)`` and written without wall-clock
data (gzip ``mtime = 0``), so the same arguments give byte-identical files.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bayesprism.costs.collectives import transfer_time_us
from bayesprism.errors import InputError, Problem, renamed_keyword
from bayesprism.ingest.classify import normalize_kernel_name

# tqdm is imported only when a progress bar is shown (start-up time).

#: Log-scale standard deviations of each level, per kernel class (the λ loadings of DESIGN §5).
DEFAULT_CLASS_SCALES: dict[str, dict[str, float]] = {
    "gemm": {"node": 0.03, "gpu": 0.02, "step": 0.01, "gpustep": 0.01, "resid": 0.02},
    "attention": {"node": 0.03, "gpu": 0.02, "step": 0.01, "gpustep": 0.01, "resid": 0.03},
    "norm": {"node": 0.02, "gpu": 0.015, "step": 0.01, "gpustep": 0.01, "resid": 0.04},
    "elementwise": {"node": 0.02, "gpu": 0.015, "step": 0.01, "gpustep": 0.01, "resid": 0.05},
    "optimizer": {"node": 0.025, "gpu": 0.02, "step": 0.01, "gpustep": 0.01, "resid": 0.03},
    "other": {"node": 0.02, "gpu": 0.015, "step": 0.01, "gpustep": 0.01, "resid": 0.05},
}
#: Ring cost-model parameters of the simulated collectives (per tier) and their noise.
DEFAULT_COLLECTIVES: dict[str, dict] = {
    "allreduce": {
        "latency_us": {"intra": 4.0, "inter": 10.0},
        "bandwidth_gbps": {"intra": 180.0, "inter": 45.0},
        "noise": 0.05,
        "congestion": 0.08,
    }
}
BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default gradient bucket size
COMPUTE_STREAM = 7
NCCL_STREAM = 20
CLOCK_START_US = 5_000_000_000.0  # profiler clock (µs); baseTimeNanoseconds maps it to Unix time
BASE_TIME_NS = 1_700_000_000_000_000_000

_GEMM = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_{}_n_tilesize{}_warpgroupsize{}"
    "_execute_segment_k_off_kernel__5x_cublas"
)
_ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<4, {f}, "
    "at::detail::Array<char*, {n}> >(int, {f}, at::detail::Array<char*, {n}>)"
)
_GELU = (
    "at::native::{}(at::TensorIteratorBase&, at::native::GeluType)::{{lambda()#2}}::"
    "operator()() const::{{lambda()#2}}::operator()() const::{{lambda({})#1}}"
)
_NORM = "void at::native::(anonymous namespace)::{}<c10::BFloat16, float>({})"
#: role -> (kernel name as the profiler writes it, class, typical duration in µs)
KERNEL_CATALOGUE: dict[str, tuple[str, str, float]] = {
    "qkv_fwd": (_GEMM.format("tn", "128x256x64", "2x1x1"), "gemm", 180.0),
    "proj_fwd": (_GEMM.format("tn", "128x128x64", "1x1x1"), "gemm", 70.0),
    "fc1_fwd": (_GEMM.format("tn", "256x128x64", "2x1x1"), "gemm", 240.0),
    "fc2_fwd": (_GEMM.format("tn", "128x256x128", "1x2x1"), "gemm", 230.0),
    "qkv_dgrad": (_GEMM.format("nn", "128x256x64", "2x1x1"), "gemm", 175.0),
    "qkv_wgrad": (_GEMM.format("nt", "128x256x64", "2x1x1"), "gemm", 190.0),
    "proj_dgrad": (_GEMM.format("nn", "128x128x64", "1x1x1"), "gemm", 72.0),
    "proj_wgrad": (_GEMM.format("nt", "128x128x64", "1x1x1"), "gemm", 75.0),
    "fc1_dgrad": (_GEMM.format("nn", "256x128x64", "2x1x1"), "gemm", 235.0),
    "fc1_wgrad": (_GEMM.format("nt", "256x128x64", "2x1x1"), "gemm", 250.0),
    "fc2_dgrad": (_GEMM.format("nn", "128x256x128", "1x2x1"), "gemm", 225.0),
    "fc2_wgrad": (_GEMM.format("nt", "128x256x128", "1x2x1"), "gemm", 245.0),
    "attn_fwd": (
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t>, false, true, false, false, true, true, false, false>"
        "(flash::Flash_fwd_params)",
        "attention",
        210.0,
    ),
    "attn_bwd": (
        "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, "
        "64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>, true, false, false, false, "
        "false, true, false>(flash::Flash_bwd_params)",
        "attention",
        520.0,
    ),
    "norm_fwd": (
        _NORM.format(
            "vectorized_layer_norm_kernel",
            "int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, "
            "float*, c10::BFloat16*",
        ),
        "norm",
        14.0,
    ),
    "norm_bwd_input": (
        _NORM.format(
            "layer_norm_grad_input_kernel_vectorized",
            "c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, "
            "c10::BFloat16 const*, c10::BFloat16*, int",
        ),
        "norm",
        22.0,
    ),
    "norm_bwd_gamma": (
        _NORM.format(
            "GammaBetaBackwardCUDAKernel_32x32",
            "long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, "
            "c10::BFloat16*, c10::BFloat16*",
        ),
        "norm",
        18.0,
    ),
    "gelu_fwd": (
        _ELEMENTWISE.format(f=_GELU.format("GeluCUDAKernelImpl", "c10::BFloat16"), n=2),
        "elementwise",
        28.0,
    ),
    "gelu_bwd": (
        _ELEMENTWISE.format(
            f=_GELU.format("GeluBackwardCUDAKernelImpl", "c10::BFloat16, c10::BFloat16"), n=3
        ),
        "elementwise",
        40.0,
    ),
    "add": (
        _ELEMENTWISE.format(f="at::native::CUDAFunctor_add<c10::BFloat16>", n=3),
        "elementwise",
        9.0,
    ),
    "fill": (_ELEMENTWISE.format(f="at::native::FillFunctor<float>", n=1), "elementwise", 3.0),
    "softmax_fwd": (
        "void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
        "other",
        95.0,
    ),
    "softmax_bwd": (
        "void (anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
        "(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, "
        "int)",
        "other",
        110.0,
    ),
    "grad_norm": (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
        "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
        "LpNormFunctor<float, (at::native::(anonymous namespace)::NormType)1, float, float>, "
        "float*, int>(at::native::(anonymous namespace)::TensorListMetadata<1>, at::native::"
        "(anonymous namespace)::LpNormFunctor<float, (at::native::(anonymous namespace)::"
        "NormType)1, float, float>, float*, int)",
        "optimizer",
        60.0,
    ),
    "adam": (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
        "(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
        "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, float, float, "
        "float, float, float, bool, float*, float*>(at::native::(anonymous namespace)::"
        "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, "
        "4, (at::native::ADAM_MODE)1, false>, float*, float, float, float, float, float, bool, "
        "float*, float*)",
        "optimizer",
        140.0,
    ),
}
_LAYER_FWD = (
    "norm_fwd",
    "qkv_fwd",
    "attn_fwd",
    "proj_fwd",
    "add",
    "norm_fwd",
    "fc1_fwd",
    "gelu_fwd",
    "fc2_fwd",
    "add",
)
_LAYER_BWD = (
    "fc2_dgrad",
    "fc2_wgrad",
    "gelu_bwd",
    "fc1_dgrad",
    "fc1_wgrad",
    "norm_bwd_input",
    "norm_bwd_gamma",
    "add",
    "proj_dgrad",
    "proj_wgrad",
    "attn_bwd",
    "qkv_dgrad",
    "qkv_wgrad",
    "norm_bwd_input",
    "norm_bwd_gamma",
    "add",
)
_OPTIMIZER = ("grad_norm", "adam", "adam", "adam")
_NCCL_NAME = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
_LEVELS = ("node", "gpu", "step", "gpustep", "resid")


def simulate(
    out_dir: str | Path,
    *,
    nodes: int,
    gpus_per_node: int,
    steps: int,
    degraded_nodes: int = 0,
    random_seed: int | None = None,
    kernels_per_step: int = 200,
    allreduce_buckets: int = 4,
    degraded_shift: float = 6.0,
    first_step: int = 0,
    class_scales: Mapping[str, Mapping[str, float]] | None = None,
    collectives: Mapping[str, Mapping] | None = None,
    gpu_name: str = "NVIDIA H100 80GB HBM3",
    progress: bool = False,
    seed: int | None = None,
) -> dict:
    """Write synthetic Kineto traces of a data-parallel job, one file per rank, plus truth.json.

    Parameters
    ----------
    out_dir
        Folder to write into (created if needed). It must not hold trace files of another
        simulation (files of the same names, from the same arguments, are replaced).
    nodes, gpus_per_node
        Cluster shape; ranks are numbered node-major (rank = node × gpus_per_node + gpu) and
        hosts are named ``node-000``, ``node-001``, ...
    steps
        Profiled steps per rank (``ProfilerStep#first_step`` ... ).
    degraded_nodes
        How many nodes belong to the slow component of the node population.
    random_seed
        Seed of the only random generator (default 0); same arguments and seed give identical
        bytes. ``seed``, its earlier name, is accepted with a ``FutureWarning`` for one
        release.
    kernels_per_step
        GPU kernels per rank and step, collectives included (at least 40).
    allreduce_buckets
        Gradient AllReduce calls per step (25 MiB buckets, DDP's default), over all ranks.
    degraded_shift
        Mean standardised node effect of a degraded node (healthy nodes: 0).
    first_step
        Number of the first ``ProfilerStep#N``.
    class_scales
        Per-class log-scale standard deviations ``{class: {"node", "gpu", "step", "gpustep",
        "resid"}}`` overriding :data:`DEFAULT_CLASS_SCALES`.
    collectives
        Cost-model parameters overriding :data:`DEFAULT_COLLECTIVES`.
    gpu_name
        Device name written to ``deviceProperties``.
    progress
        Show a progress bar over the rank files.

    Returns
    -------
    dict
        The truth, as written to ``out_dir/truth.json``.

    Raises
    ------
    InputError
        On impossible sizes (non-positive counts, too few kernels per step, more degraded
        nodes than nodes), or when ``out_dir`` already holds other trace files.

    Examples
    --------
    >>> import tempfile
    >>> truth = simulate(tempfile.mkdtemp(), nodes=2, gpus_per_node=2, steps=3, kernels_per_step=40)
    >>> truth["world_size"], len(truth["files"])
    (4, 4)
    """
    _check_arguments(
        nodes, gpus_per_node, steps, degraded_nodes, kernels_per_step, allreduce_buckets
    )
    seed = renamed_keyword("simulate", "random_seed", random_seed, "seed", seed, 0)
    # every step draws from this one generator, in this order: same seed, same bytes
    rng = np.random.default_rng(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    world = nodes * gpus_per_node
    scales, coll = _settings(class_scales, collectives)
    roles, bucket_bytes = _program(kernels_per_step, allreduce_buckets if world > 1 else 0)
    hosts = [f"node-{n:03d}" for n in range(nodes)]
    truth = _draw_truth(rng, roles, bucket_bytes, coll, nodes=nodes, world=world, steps=steps,
                        degraded_nodes=degraded_nodes, degraded_shift=degraded_shift)
    compute_dur, gaps, step_gap = _kernel_durations(rng, roles, scales, truth, gpus_per_node)
    start, dur = _timeline(rng, roles, compute_dur, gaps, step_gap, truth.transfer)
    host = _host_side(rng, start, gaps)
    pids = rng.integers(1000, 4_000_000, world)
    end_of_step = (start + dur).max(axis=2)
    files = [f"{hosts[rank // gpus_per_node]}_{int(pids[rank])}."
             f"{int((BASE_TIME_NS // 1000 + end_of_step[-1, rank]) // 1000)}.pt.trace.json.gz"
             for rank in range(world)]
    _check_out_dir(out, files)
    names = {r: KERNEL_CATALOGUE[r][0] for r in truth.role_names}
    names["allreduce"] = _NCCL_NAME
    _write_traces(out, files, progress, world=world, gpus_per_node=gpus_per_node, pids=pids,
                  roles=roles, names=names, bucket_bytes=bucket_bytes, first_step=first_step,
                  start=start, dur=dur, host=host, gpu_name=gpu_name)
    written = _truth(
        seed=seed, nodes=nodes, gpus_per_node=gpus_per_node, world=world, steps=steps,
        first_step=first_step, hosts=hosts, degraded_shift=degraded_shift, gpu_name=gpu_name,
        roles=roles, scales=scales, drawn=truth, coll=coll, bucket_bytes=bucket_bytes,
        files=files, kernels_per_step=len(roles),
    )
    (out / "truth.json").write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    return written


# --------------------------------------------------------------------------- the steps


@dataclass(frozen=True)
class _Drawn:
    """The random truth of one simulation: kernel medians, unit effects, collective costs."""

    role_names: list[str]
    log_median: dict[str, float]
    degraded: np.ndarray  # node indices of the slow component
    node_effect: np.ndarray  # (nodes,)
    gpu_effect: np.ndarray  # (world,)
    step_effect: np.ndarray  # (steps,)
    gpustep_effect: np.ndarray  # (steps, world)
    tier: str
    congestion: np.ndarray  # (steps,)
    transfer: np.ndarray  # (steps, buckets) µs

    @property
    def rank_node(self) -> np.ndarray:
        world, nodes = self.gpu_effect.size, self.node_effect.size
        return np.repeat(np.arange(nodes), world // nodes)


@dataclass(frozen=True)
class _HostSide:
    """Per (step, rank): the ProfilerStep window; per launch: the CPU launch and its length."""

    step_start: np.ndarray
    step_end: np.ndarray
    launch: np.ndarray
    launch_dur: np.ndarray


def _settings(class_scales, collectives) -> tuple[dict, dict]:
    """The per-class scales and collective parameters: the defaults with the overrides."""
    scales = {c: dict(v) for c, v in DEFAULT_CLASS_SCALES.items()}
    for cls, levels in (class_scales or {}).items():
        scales.setdefault(cls, dict(DEFAULT_CLASS_SCALES["other"])).update(levels)
    coll = {c: json.loads(json.dumps(v)) for c, v in DEFAULT_COLLECTIVES.items()}
    for cls, params in (collectives or {}).items():
        coll.setdefault(cls, json.loads(json.dumps(DEFAULT_COLLECTIVES["allreduce"]))).update(
            params
        )
    return scales, coll


def _draw_truth(rng: np.random.Generator, roles: list[str], bucket_bytes: list[float],
                coll: dict, *, nodes: int, world: int, steps: int, degraded_nodes: int,
                degraded_shift: float) -> _Drawn:
    """Kernel medians, node/GPU/step/GPU-step effects and every AllReduce's transfer time."""
    role_names = sorted(set(r for r in roles if r != "allreduce"))
    log_median = {
        r: float(np.log(KERNEL_CATALOGUE[r][2]) + rng.normal(0.0, 0.1)) for r in role_names
    }
    degraded = (
        np.sort(rng.choice(nodes, size=degraded_nodes, replace=False))
        if degraded_nodes
        else np.array([], dtype=int)
    )
    node_effect = rng.normal(0.0, 1.0, nodes)
    node_effect[degraded] = degraded_shift + rng.normal(0.0, 0.5, len(degraded))
    gpu_effect = rng.normal(0.0, 1.0, world)
    step_effect = rng.normal(0.0, 1.0, steps)
    gpustep_effect = rng.normal(0.0, 1.0, (steps, world))
    tier = "inter" if nodes > 1 else "intra"
    ar = coll["allreduce"]
    congestion = rng.normal(0.0, ar["congestion"], steps)
    call_noise = rng.normal(0.0, ar["noise"], (steps, len(bucket_bytes)))
    base_transfer = np.array(
        [
            transfer_time_us(
                "allreduce", world, b, ar["latency_us"][tier], ar["bandwidth_gbps"][tier]
            )
            for b in bucket_bytes
        ]
    )
    transfer = base_transfer[None, :] * np.exp(congestion[:, None] + call_noise)
    return _Drawn(role_names, log_median, degraded, node_effect, gpu_effect, step_effect,
                  gpustep_effect, tier, congestion, transfer)


def _kernel_durations(rng: np.random.Generator, roles: list[str], scales: dict, drawn: _Drawn,
                      gpus_per_node: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute kernels' durations, launch gaps and host work between steps (µs, vectorised).

    Shapes: (steps, ranks, compute launches), (steps, ranks, launches) and (steps, ranks).
    """
    steps, world = drawn.gpustep_effect.shape
    compute_roles = [r for r in roles if r != "allreduce"]
    cls_of = np.array([KERNEL_CATALOGUE[r][1] for r in compute_roles])
    lam = {lvl: np.array([scales[c][lvl] for c in cls_of]) for lvl in _LEVELS}
    a = np.array([drawn.log_median[r] for r in compute_roles])
    log_d = (
        a[None, None, :]
        + lam["node"][None, None, :] * drawn.node_effect[drawn.rank_node][None, :, None]
        + lam["gpu"][None, None, :] * drawn.gpu_effect[None, :, None]
        + lam["step"][None, None, :] * drawn.step_effect[:, None, None]
        + lam["gpustep"][None, None, :] * drawn.gpustep_effect[:, :, None]
        + lam["resid"][None, None, :] * rng.normal(0.0, 1.0, (steps, world, len(compute_roles)))
    )
    gaps = 1.0 + rng.exponential(1.5, (steps, world, len(roles)))  # launch gaps on the GPU
    step_gap = 150.0 + rng.exponential(50.0, (steps, world))  # host work between steps
    return np.exp(log_d), gaps, step_gap


def _timeline(rng: np.random.Generator, roles: list[str], compute_dur: np.ndarray,
              gaps: np.ndarray, step_gap: np.ndarray, transfer: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Start and duration (steps, ranks, launches) of every kernel.

    Compute kernels run back to back after their gaps; a collective starts at each rank's
    arrival and ends at the last one's plus the transfer.
    """
    steps, world, n_k = gaps.shape
    is_coll = np.array([r == "allreduce" for r in roles])
    start = np.zeros((steps, world, n_k))
    dur = np.zeros((steps, world, n_k))
    dur[:, :, ~is_coll] = compute_dur
    coll_pos = np.flatnonzero(is_coll)
    bounds = [0, *(coll_pos + 1).tolist(), n_k]
    clock = np.full(world, CLOCK_START_US) + rng.uniform(0.0, 20.0, world)
    for s in range(steps):
        clock = clock + step_gap[s]
        for j in range(len(bounds) - 1):
            lo, hi = bounds[j], bounds[j + 1]
            seg = slice(lo, hi - 1) if j < len(coll_pos) else slice(lo, hi)
            d, g = dur[s, :, seg], gaps[s, :, seg]
            ends = clock[:, None] + np.cumsum(g + d, axis=1)
            start[s, :, seg] = ends - d
            clock = ends[:, -1] if ends.shape[1] else clock
            if j < len(coll_pos):
                k = coll_pos[j]
                arrive = clock + gaps[s, :, k]
                end = arrive.max() + transfer[s, j]
                start[s, :, k] = arrive
                dur[s, :, k] = end - arrive
                clock = np.full(world, end)
    return start, dur


def _host_side(rng: np.random.Generator, start: np.ndarray, gaps: np.ndarray) -> _HostSide:
    """The CPU side: each rank's ProfilerStep windows and the launch of every kernel."""
    steps, world, n_k = start.shape
    lead = 40.0 + rng.uniform(0.0, 10.0, (steps, world))
    step_start = start[:, :, 0] - gaps[:, :, 0] - lead
    planned = step_start[:, :, None] + 8.0 + 6.0 * np.arange(n_k)[None, None, :]
    launch = np.minimum(planned, start - 3.0)
    launch_dur = np.minimum(3.0, np.diff(launch, axis=2, append=launch[:, :, -1:] + 3.0))
    launch_dur = np.maximum(launch_dur, 0.5)
    step_end = np.empty_like(step_start)
    step_end[:-1] = step_start[1:]
    step_end[-1] = launch[-1, :, -1] + launch_dur[-1, :, -1] + 20.0
    return _HostSide(step_start, step_end, launch, launch_dur)


def _check_out_dir(out: Path, files: list[str]) -> None:
    """Refuse a folder holding trace files of another simulation.

    A folder is one run for the readers: mixing two would corrupt it.
    """
    stale = sorted(p.name for p in out.glob("*.pt.trace.json*") if p.name not in files)
    if stale:
        raise InputError(
            Problem(
                str(out),
                "out_dir",
                f"already holds {len(stale)} trace file(s) "
                "of another simulation or job; use an empty folder",
                example=stale[0],
            )
        )


def _write_traces(out: Path, files: list[str], progress: bool, *, world, gpus_per_node, pids,
                  roles, names, bucket_bytes, first_step, start, dur, host: _HostSide,
                  gpu_name) -> None:
    """One gzip'd Kineto trace per rank (gzip ``mtime = 0``: no wall-clock data)."""
    from tqdm.auto import tqdm  # deferred: start-up time

    bar = tqdm(
        list(enumerate(files)), desc="simulate", unit="rank", disable=not progress, leave=False
    )
    for rank, fname in bar:
        text = _trace_text(
            rank=rank,
            world=world,
            gpu=rank % gpus_per_node,
            gpus_per_node=gpus_per_node,
            pid=int(pids[rank]),
            roles=roles,
            names=names,
            bucket_bytes=bucket_bytes,
            first_step=first_step,
            start=start[:, rank],
            dur=dur[:, rank],
            launch=host.launch[:, rank],
            launch_dur=host.launch_dur[:, rank],
            step_start=host.step_start[:, rank],
            step_end=host.step_end[:, rank],
            gpu_name=gpu_name,
            trace_name=fname,
        )
        (out / fname).write_bytes(gzip.compress(text.encode(), compresslevel=1, mtime=0))


# --------------------------------------------------------------------------- program


def _check_arguments(nodes, gpus_per_node, steps, degraded_nodes, kernels_per_step, buckets):
    problems = []
    for name, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("steps", steps)):
        if int(value) < 1:
            problems.append(Problem("simulate", name, "must be >= 1", example=value))
    if not 0 <= int(degraded_nodes) <= max(int(nodes), 0):
        problems.append(
            Problem(
                "simulate",
                "degraded_nodes",
                f"must be between 0 and nodes ({nodes})",
                example=degraded_nodes,
            )
        )
    if int(kernels_per_step) < 40:
        problems.append(
            Problem(
                "simulate",
                "kernels_per_step",
                "must be >= 40 (one layer, loss, optimizer and collectives)",
                example=kernels_per_step,
            )
        )
    if not 0 <= int(buckets) <= 16:
        problems.append(
            Problem("simulate", "allreduce_buckets", "must be between 0 and 16", example=buckets)
        )
    if problems:
        raise InputError(problems)


def _program(kernels_per_step: int, buckets: int) -> tuple[list[str], list[float]]:
    """Roles of the launches of one step (same on every rank) and the AllReduce bucket sizes."""
    fixed = 2 + 2 + len(_OPTIMIZER) + buckets  # fill + loss (fwd, bwd) + optimizer + buckets
    layers = max(1, (kernels_per_step - fixed) // (len(_LAYER_FWD) + len(_LAYER_BWD)))
    pad = kernels_per_step - fixed - layers * (len(_LAYER_FWD) + len(_LAYER_BWD))
    roles = ["fill"] * (2 + pad)  # zero_grad-style fills absorb the remainder
    for _ in range(layers):
        roles += _LAYER_FWD
    roles += ["softmax_fwd", "softmax_bwd"]
    # DDP reduces a bucket as soon as the backward of its layers is done
    done = np.ceil(np.arange(1, buckets + 1) * layers / buckets).astype(int) if buckets else []
    for layer in range(1, layers + 1):
        roles += _LAYER_BWD
        roles += ["allreduce"] * int(np.sum(np.asarray(done) == layer))
    roles += _OPTIMIZER
    return roles, [float(BUCKET_BYTES)] * buckets


# --------------------------------------------------------------------------- trace text


def _trace_text(
    *,
    rank,
    world,
    gpu,
    gpus_per_node,
    pid,
    roles,
    names,
    bucket_bytes,
    first_step,
    start,
    dur,
    launch,
    launch_dur,
    step_start,
    step_end,
    gpu_name,
    trace_name,
) -> str:
    steps, n_k = start.shape
    group = json.dumps(str(list(range(world))))
    static = {}
    bucket_of = np.cumsum([r == "allreduce" for r in roles]) - 1
    for k, role in enumerate(roles):
        if role == "allreduce":
            nelems = int(bucket_bytes[bucket_of[k]] // 2)
            static[k] = (
                json.dumps(names[role]),
                NCCL_STREAM,
                '"registers per thread": 96, "shared memory": 87568, "blocks per SM": 0.121212, '
                '"warps per SM": 0.484848, "grid": [16, 1, 1], "block": [512, 1, 1], '
                '"est. achieved occupancy %": 0, "Collective name": "allreduce", '
                f'"In msg nelems": {nelems}, "Out msg nelems": {nelems}, "Group size": {world}, '
                '"dtype": "BFloat16", "In split size": "[]", "Out split size": "[]", '
                '"Process Group Name": "0", "Process Group Description": "default_pg", '
                f'"Process Group Ranks": {group}',
            )
        else:
            static[k] = (
                json.dumps(names[role]),
                COMPUTE_STREAM,
                '"registers per thread": 128, "shared memory": 65536, "blocks per SM": 1, '
                '"warps per SM": 8, "grid": [132, 1, 1], "block": [256, 1, 1], '
                '"est. achieved occupancy %": 12',
            )
    events = [
        f'{{"name": "process_name", "ph": "M", "ts": {step_start[0]:.3f}, "pid": {pid}, "tid": 0, '
        '"args": {"name": "python"}}',
        f'{{"name": "process_labels", "ph": "M", "ts": {step_start[0]:.3f}, "pid": {pid}, '
        '"tid": 0, "args": {"labels": "CPU"}}',
        f'{{"name": "process_name", "ph": "M", "ts": {step_start[0]:.3f}, "pid": {gpu}, "tid": 0, '
        '"args": {"name": "python"}}',
        f'{{"name": "process_labels", "ph": "M", "ts": {step_start[0]:.3f}, "pid": {gpu}, '
        f'"tid": 0, "args": {{"labels": "GPU {gpu}"}}}}',
    ]
    for stream in (COMPUTE_STREAM, NCCL_STREAM):
        events.append(
            f'{{"name": "thread_name", "ph": "M", "ts": {step_start[0]:.3f}, '
            f'"pid": {gpu}, "tid": {stream}, "args": {{"name": "stream {stream} "}}}}'
        )
    corr = 1000 + rank  # different per rank, as in real traces
    for s in range(steps):
        events.append(
            f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{first_step + s}", '
            f'"pid": {pid}, "tid": {pid}, "ts": {step_start[s]:.3f}, '
            f'"dur": {step_end[s] - step_start[s]:.3f}, '
            f'"args": {{"External id": {corr}, "Record function id": 0, "Ev Idx": {corr}}}}}'
        )
        corr += 1
        st, du, la, ld = (
            start[s].tolist(),
            dur[s].tolist(),
            launch[s].tolist(),
            launch_dur[s].tolist(),
        )
        for k in range(n_k):
            name, stream, args = static[k]
            events.append(
                f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, '
                f'"tid": {pid}, "ts": {la[k]:.3f}, "dur": {ld[k]:.3f}, '
                f'"args": {{"External id": {corr}, "cbid": 211, "correlation": {corr}}}}}'
            )
            events.append(
                f'{{"ph": "s", "id": {corr}, "pid": {pid}, "tid": {pid}, "ts": {la[k]:.3f}, '
                '"cat": "ac2g", "name": "ac2g"}'
            )
            events.append(
                f'{{"ph": "X", "cat": "kernel", "name": {name}, "pid": {gpu}, "tid": {stream}, '
                f'"ts": {st[k]:.3f}, "dur": {du[k]:.3f}, "args": {{"External id": {corr}, '
                f'"queued": 0, "device": {gpu}, "context": 1, "stream": {stream}, '
                f'"correlation": {corr}, {args}}}}}'
            )
            events.append(
                f'{{"ph": "f", "id": {corr}, "pid": {gpu}, "tid": {stream}, "ts": {st[k]:.3f}, '
                '"cat": "ac2g", "name": "ac2g", "bp": "e"}'
            )
            corr += 1
    device = {
        "name": gpu_name,
        "totalGlobalMem": 85_045_870_592,
        "computeMajor": 9,
        "computeMinor": 0,
        "maxThreadsPerBlock": 1024,
        "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536,
        "warpSize": 32,
        "sharedMemPerBlock": 49152,
        "numSms": 132,
    }
    header = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": i, **device} for i in range(gpus_per_node)],
        "distributedInfo": {
            "backend": "nccl",
            "rank": rank,
            "world_size": world,
            "pg_count": 1,
            "nccl_version": "2.21.5",
        },
        "record_shapes": 0,
        "with_stack": 0,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_TIME_NS,
    }
    head = json.dumps(header)[:-1]
    return (
        f'{head}, "traceEvents": [\n'
        + ",\n".join(events)
        + f'\n], "traceName": {json.dumps(trace_name[:-3])}}}\n'
    )


# --------------------------------------------------------------------------- truth


def _truth(
    *,
    seed,
    nodes,
    gpus_per_node,
    world,
    steps,
    first_step,
    hosts,
    degraded_shift,
    gpu_name,
    roles,
    scales,
    drawn: _Drawn,
    coll,
    bucket_bytes,
    files,
    kernels_per_step,
) -> dict:
    role_names, log_median, degraded = drawn.role_names, drawn.log_median, drawn.degraded
    congestion, transfer, tier = drawn.congestion, drawn.transfer, drawn.tier
    node_effect, gpu_effect = drawn.node_effect, drawn.gpu_effect
    step_effect, gpustep_effect = drawn.step_effect, drawn.gpustep_effect
    launches = {r: roles.count(r) for r in set(roles)}
    kernels = {}
    for role in role_names:
        raw, cls, _ = KERNEL_CATALOGUE[role]
        kernels[normalize_kernel_name(raw)] = {
            "kernel_class": cls,
            "log_median_us": log_median[role],
            "median_us": float(np.exp(log_median[role])),
            "launches_per_step": launches[role],
            "raw_name": raw,
        }
    used = sorted({KERNEL_CATALOGUE[r][1] for r in role_names})
    step_numbers = [first_step + s for s in range(steps)]
    gpu_labels = [f"{hosts[r // gpus_per_node]}/{r % gpus_per_node}" for r in range(world)]
    collectives = {}
    if bucket_bytes:
        ar = coll["allreduce"]
        collectives["allreduce"] = {
            "kernel": normalize_kernel_name(_NCCL_NAME),
            "latency_us": ar["latency_us"],
            "bandwidth_gbps": ar["bandwidth_gbps"],
            "noise": ar["noise"],
            "congestion": ar["congestion"],
            "tier": tier,
            "group_size": world,
            "bytes": bucket_bytes,
            "calls_per_step": len(bucket_bytes),
            "congestion_effect": dict(
                zip(map(str, step_numbers), congestion.tolist(), strict=True)
            ),
            "transfer_us": {str(n): transfer[i].tolist() for i, n in enumerate(step_numbers)},
        }
    slow_weight = len(degraded) / nodes
    return {
        "generator": "bayesprism.simulate",
        "model": "log d = a_k + node_scale[c]*node_effect[n] + gpu_scale[c]*gpu_effect[g] + "
        "step_scale[c]*step_effect[s] + gpustep_scale[c]*gpustep_effect[g,s] + "
        "resid_scale[c]*eps (µs); collectives: start at arrival, end at the latest "
        "arrival + ring transfer * exp(congestion[s] + noise)",
        "seed": seed,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "world_size": world,
        "steps": step_numbers,
        "kernels_per_step": kernels_per_step,
        "hosts": hosts,
        "degraded_nodes": [hosts[i] for i in degraded],
        "platform": gpu_name,
        "plan": {"dp": world, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "microbatches": 1},
        "kernels": kernels,
        "kernel_log_median": {k: v["log_median_us"] for k, v in kernels.items()},
        "class_scales": {c: scales[c] for c in used},
        "node_population": {
            "family": "mixture" if len(degraded) else "normal",
            "slow_weight": slow_weight,
            "slow_shift": degraded_shift if len(degraded) else 0.0,
            "slow_sd": 0.5,
        },
        "node_effect": dict(zip(hosts, node_effect.tolist(), strict=True)),
        "gpu_effect": dict(zip(gpu_labels, gpu_effect.tolist(), strict=True)),
        "step_effect": dict(zip(map(str, step_numbers), step_effect.tolist(), strict=True)),
        "gpustep_effect": {g: gpustep_effect[:, i].tolist() for i, g in enumerate(gpu_labels)},
        "collectives": collectives,
        "files": files,
    }
