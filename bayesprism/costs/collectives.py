"""Cost factors of collective algorithms, shared by the model and the composition.

Transfer time of one collective of ``p`` ranks on a buffer of ``b`` bytes is modelled as

    t_us = latency_us * latency_steps(p) + b * bandwidth_factor(p) / (bandwidth_gbps * 1e3)

with ring-algorithm factors (NCCL's default for large messages): an AllReduce moves
``2 (p-1)/p`` of the buffer in ``2 (p-1)`` steps, AllGather / ReduceScatter ``(p-1)/p`` in
``p-1`` steps (``b`` is the full, gathered buffer), AllToAll ``(p-1)/p`` in ``p-1`` steps,
Broadcast the buffer once in ``p-1`` pipelined steps, and SendRecv the buffer once in one step.
``bandwidth_gbps`` is therefore NCCL's *bus* bandwidth. A group that spans more than one node
uses the inter-node tier's parameters, whose bandwidth the fit and the forecast scale by
``(nodes / 2)^-γ`` with the nodes the group spans (``coll_fabric_exponent``,
``bayesprism.model.kernel``). A message below :data:`SMALL_MESSAGE_BYTES` takes its latency
steps at ``exp(ρ)`` times the per-step latency (``coll_small_latency_log_ratio``, per tier,
fitted where a collective of the tier is seen at both sizes): NCCL moves small buffers with
its low-latency protocols, whose steps are several times quicker than those of the
large-message protocol that sets the bandwidth. Works on scalars and NumPy arrays alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bayesprism.schema import COLLECTIVE_CLASSES

__all__ = [
    "COLLECTIVE_CLASSES",
    "LOG_ALGORITHMS",
    "SMALL_MESSAGE_BYTES",
    "TIERS",
    "algorithm_of",
    "bandwidth_factor",
    "is_small_message",
    "latency_steps",
    "launch_work_us",
    "tier_of",
    "transfer_time_us",
]
TIERS: tuple[str, ...] = ("intra", "inter")

#: Buffers below this many bytes are "small messages": NCCL's low-latency protocols (LL, LL128)
#: carry them, with per-step latencies well below the large-message protocol's (nccl-tests on
#: 8 H100s: ~1 µs per ring step at 16 KiB, ~2.5 µs from 1 MiB up). The switch-over sits between
#: a few tens of KiB and about a MiB depending on the system; 256 KiB splits what traces
#: (scalars, norms, tensor-parallel reductions of small activations) and nccl-tests sweeps
#: (1 MiB and up) usually hold.
SMALL_MESSAGE_BYTES: float = 256.0 * 1024.0


#: Algorithms whose latency grows with log2 of the group (NCCL's tree: a reduce up and a
#: broadcast down a binary tree), named in NCCL kernel names (``..._TREE_LL``).
LOG_ALGORITHMS: tuple[str, ...] = ("tree", "collnet", "nvls_tree")


def algorithm_of(kernel_name: str) -> str:
    """``"tree"``, ``"collnet"``, ``"nvls_tree"`` or ``"ring"`` from an NCCL kernel name.

    Examples
    --------
    >>> algorithm_of("ncclDevKernel_AllReduce_Sum_f32_TREE_LL"), algorithm_of("ncclKernel_x")
    ('tree', 'ring')
    """
    upper = str(kernel_name).upper()
    for name in ("NVLS_TREE", "COLLNET", "TREE"):
        if f"_{name}" in upper:
            return name.lower()
    return "ring"


def latency_steps(kind: str, group_size, algorithm: str = "ring"):
    """Number of sequential latency-bound steps of a collective: ring by default; an all-reduce
    of a tree algorithm (:data:`LOG_ALGORITHMS`) takes 2·log2(p) steps."""
    p = np.asarray(group_size, dtype=float)
    if kind == "allreduce" and algorithm in LOG_ALGORITHMS:
        return 2.0 * np.ceil(np.log2(np.maximum(p, 2.0)))
    if kind == "allreduce":
        return 2.0 * (p - 1.0)
    if kind in ("allgather", "reducescatter", "alltoall", "broadcast"):
        return p - 1.0
    if kind == "sendrecv":
        return np.ones_like(p)
    raise ValueError(f"unknown collective class {kind!r}; expected one of {COLLECTIVE_CLASSES}")


def is_small_message(nbytes):
    """Whether a buffer of ``nbytes`` bytes is a small message (:data:`SMALL_MESSAGE_BYTES`).

    Examples
    --------
    >>> bool(is_small_message(16384)), bool(is_small_message(1 << 20))
    (True, False)
    """
    return np.asarray(nbytes, dtype=float) < SMALL_MESSAGE_BYTES


def bandwidth_factor(kind: str, group_size):
    """Fraction of the buffer each rank sends over its link (bus-bandwidth convention)."""
    p = np.asarray(group_size, dtype=float)
    if kind == "allreduce":
        return 2.0 * (p - 1.0) / p
    if kind in ("allgather", "reducescatter", "alltoall"):
        return (p - 1.0) / p
    if kind in ("broadcast", "sendrecv"):
        return np.ones_like(p)
    raise ValueError(f"unknown collective class {kind!r}; expected one of {COLLECTIVE_CLASSES}")


def tier_of(group_size, gpus_per_node: int, nodes_spanned=None):
    """0 (intra-node) or 1 (inter-node): a group spans nodes when it has more ranks than a node."""
    if nodes_spanned is not None:
        return (np.asarray(nodes_spanned) > 1).astype(int)
    return (np.asarray(group_size) > gpus_per_node).astype(int)


def transfer_time_us(kind: str, group_size, nbytes, latency_us, bandwidth_gbps,
                     algorithm: str = "ring", small_latency_log_ratio=0.0):
    """Deterministic transfer time (µs) of a collective (ring unless ``algorithm`` says);
    broadcasts over arrays. ``small_latency_log_ratio``: ρ, the log ratio of a small message's
    per-step latency to ``latency_us`` (module docstring).

    Examples
    --------
    >>> float(transfer_time_us("allreduce", 8, 0.0, 2.0, 100.0))
    28.0
    >>> round(float(transfer_time_us("allreduce", 8, 0.0, 2.0, 100.0,
    ...                              small_latency_log_ratio=np.log(0.5))), 6)
    14.0
    """
    small = np.where(is_small_message(nbytes), np.exp(small_latency_log_ratio), 1.0)
    return latency_us * small * latency_steps(kind, group_size, algorithm) + np.asarray(
        nbytes, dtype=float) * (
        bandwidth_factor(kind, group_size)
    ) / (np.asarray(bandwidth_gbps, dtype=float) * 1e3)


def launch_work_us(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Duration (µs) of each launch without waiting for peers: what kernel models describe.

    A collective's measured duration includes waiting for the slowest participant, which is a
    property of the step (the composition re-creates it), not of the kernel. Where ingest split
    it off (``transfer_us`` finite and positive on a collective-class row) the transfer part is
    the launch's work; every other row keeps ``duration_us``.

    Returns
    -------
    (work_us, uses_transfer)
        Work per row and the mask of rows whose value is ``transfer_us``.
    """
    work = rows["duration_us"].to_numpy(dtype=float).copy()
    if "transfer_us" not in rows.columns:
        return work, np.zeros(len(rows), dtype=bool)
    transfer = pd.to_numeric(rows["transfer_us"], errors="coerce").to_numpy(dtype=float)
    uses_transfer = (rows["kernel_class"].astype(str).isin(COLLECTIVE_CLASSES).to_numpy()
                     & np.isfinite(transfer) & (transfer > 0))
    work[uses_transfer] = transfer[uses_transfer]
    return work, uses_transfer
