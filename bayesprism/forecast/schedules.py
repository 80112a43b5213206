"""Pipeline schedules as max-plus recursions over (stage, micro-batch).

A schedule is, for every pipeline device, a fixed sequence of operations on micro-batches:
``F`` (forward of one model chunk), ``B`` (backward; in zero-bubble schedules only the
input-gradient part) and ``W`` (weight-gradient part, zero-bubble only). An operation starts
when its device is free *and* its data dependency has arrived:

    start(op) = max(end(previous op on the device), end(dependency) + transfer)
    end(op)   = start(op) + duration(op)

with dependencies ``F(k, j) <- F(k-1, j)``, ``B(k, j) <- B(k+1, j)`` (``B(K-1, j) <- F(K-1, j)``
on the last virtual stage, no transfer) and ``W(k, j) <- B(k, j)`` over virtual stages
``k = chunk * pp + device`` (Megatron's interleaving: chunk ``c`` of device ``d`` is virtual
stage ``c*pp + d``) and micro-batches ``j``. The transfer is the point-to-point send/recv time
between neighbouring stages. Durations are arrays over any batch shape (posterior draws,
replicates, data-parallel replicas), so one pass evaluates every draw at once.

Orders:

``gpipe``
    all forwards, then all backwards (micro-batch order).
``1f1b``
    device ``d`` runs ``pp - d - 1`` warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards (PipeDream-flush / Megatron).
``interleaved-1f1b``
    Megatron's interleaved schedule with ``v`` chunks per device: forwards walk groups of
    ``pp`` micro-batches chunk by chunk, warm-up ``2 (pp - d - 1) + (v - 1) pp`` forwards.
    Chunks hold ``1/v`` of a device's layers, so for equal stages the bubble shrinks by ``v``.
``zero-bubble``
    our ZB-H1-style variant: the backward is split into ``B`` (input gradient, on the critical
    path) and ``W`` (weight gradient, free to move). The per-device order is fixed in advance by
    a greedy list schedule run once on the plan's *typical* durations (as zero-bubble
    implementations do from profiled times): a free device runs, in priority, a ready ``B``,
    then a ready ``F`` while fewer than ``pp - d`` micro-batches await their ``B`` (1F1B's
    in-flight bound; deferred ``W`` s hold some extra weight-gradient inputs, as in ZB-H1),
    then a pending ``W``; otherwise it waits for the earliest arrival. That order is then
    replayed on random durations by the recursion above. For
    equal stages and ``F = B = W = t`` it reaches the ZB-H1 step ``(3m + pp - 1) t``: the
    bubble is ``(pp - 1)(F + B - W)`` instead of 1F1B's ``(pp - 1)(F + B + W)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Op = tuple[str, int, int]  # (kind, virtual stage, micro-batch)


@dataclass(frozen=True)
class Schedule:
    """Operation order of every pipeline device and a dependency-respecting evaluation order."""

    pp: int
    microbatches: int
    virtual_stages: int
    split_backward: bool
    device_ops: tuple[tuple[Op, ...], ...]
    evaluation: tuple[tuple[int, Op], ...]


def _forward_order_interleaved(d: int, p: int, m: int, v: int, backward: bool) -> list[Op]:
    ops = []
    for i in range(m * v):
        group, r = divmod(i, p * v)
        chunk = r // p
        if backward:
            chunk = v - 1 - chunk
        ops.append(("B" if backward else "F", chunk * p + d, group * p + r % p))
    return ops


def _one_f_one_b(forwards: list[Op], backwards: list[Op], warmup: int) -> list[Op]:
    warmup = min(warmup, len(forwards))
    ops = list(forwards[:warmup])
    steady = len(forwards) - warmup
    for i in range(steady):
        ops.append(forwards[warmup + i])
        ops.append(backwards[i])
    ops.extend(backwards[steady:])
    return ops


def _dependency(op: Op, n_virtual: int) -> tuple[Op | None, bool]:
    """The op this op waits for, and whether a point-to-point transfer lies in between."""
    kind, k, j = op
    if kind == "F":
        return (("F", k - 1, j), True) if k > 0 else (None, False)
    if kind == "B":
        return (("B", k + 1, j), True) if k < n_virtual - 1 else (("F", k, j), False)
    return ("B", k, j), False


def _evaluation_order(device_ops: list[list[Op]], n_virtual: int) -> list[tuple[int, Op]]:
    """Topological order of all ops consistent with the per-device sequences."""
    done: set[Op] = set()
    pointers = [0] * len(device_ops)
    order: list[tuple[int, Op]] = []
    total = sum(len(ops) for ops in device_ops)
    while len(order) < total:
        progressed = False
        for d, ops in enumerate(device_ops):
            while pointers[d] < len(ops):
                op = ops[pointers[d]]
                dep, _ = _dependency(op, n_virtual)
                if dep is not None and dep not in done:
                    break
                order.append((d, op))
                done.add(op)
                pointers[d] += 1
                progressed = True
        if not progressed:  # pragma: no cover - an order bug, never bad input
            raise RuntimeError("pipeline schedule deadlocks: per-device orders are inconsistent")
    return order


def _zero_bubble_orders(
    p: int, m: int, f: np.ndarray, b: np.ndarray, w: np.ndarray, comm: float
) -> list[list[Op]]:
    """Greedy ZB-H1-style per-device orders from typical per-stage durations."""
    end: dict[Op, float] = {}
    free = [0.0] * p
    next_f = [0] * p
    next_b = [0] * p
    next_w = [0] * p
    orders: list[list[Op]] = [[] for _ in range(p)]

    def ready(op: Op) -> float | None:
        dep, transfer = _dependency(op, p)
        if dep is None:
            return 0.0
        if dep not in end:
            return None
        return end[dep] + (comm if transfer else 0.0)

    while any(next_w[d] < m for d in range(p)):
        best = None  # (start, priority, device, op)
        for d in range(p):
            candidates = []
            if next_b[d] < m:
                t = ready(("B", d, next_b[d]))
                if t is not None:
                    candidates.append((max(free[d], t), 0, ("B", d, next_b[d])))
            if next_f[d] < m and next_f[d] - next_b[d] < p - d:
                t = ready(("F", d, next_f[d]))
                if t is not None:
                    candidates.append((max(free[d], t), 1, ("F", d, next_f[d])))
            if next_w[d] < next_b[d]:
                candidates.append((free[d], 2, ("W", d, next_w[d])))
            for start, priority, op in candidates:
                key = (start, priority, d)
                if best is None or key < best[:3]:
                    best = (start, priority, d, op)
        if best is None:  # pragma: no cover - cannot happen for valid inputs
            raise RuntimeError("zero-bubble greedy schedule deadlocks")
        start, _, d, op = best
        # A device that would idle waiting picks, among ops ready at that same instant, the
        # highest priority; ops of other devices may still be scheduled before it.
        duration = {"F": f[d], "B": b[d], "W": w[d]}[op[0]]
        end[op] = start + duration
        free[d] = end[op]
        orders[d].append(op)
        if op[0] == "F":
            next_f[d] += 1
        elif op[0] == "B":
            next_b[d] += 1
        else:
            next_w[d] += 1
    return orders


def build_schedule(
    schedule: str,
    pp: int,
    microbatches: int,
    virtual_stages: int = 1,
    typical: tuple[np.ndarray, np.ndarray, np.ndarray, float] | None = None,
) -> Schedule:
    """Per-device operation orders of a pipeline schedule.

    Parameters
    ----------
    schedule
        ``gpipe``, ``1f1b``, ``interleaved-1f1b`` or ``zero-bubble``.
    pp, microbatches, virtual_stages
        Pipeline devices, micro-batches per step, chunks per device (interleaved only).
    typical
        ``(F, B, W, transfer)`` typical per-stage durations (arrays of length ``pp``) used to
        fix the zero-bubble order; equal unit durations when omitted.
    """
    p, m, v = pp, microbatches, virtual_stages
    device_ops: list[list[Op]] = []
    if schedule == "zero-bubble":
        if typical is None:
            ones = np.ones(p)
            typical = (ones, ones, ones, 0.0)
        f, b, w, comm = typical
        device_ops = _zero_bubble_orders(
            p, m, np.asarray(f), np.asarray(b), np.asarray(w), float(comm)
        )
        v = 1
    else:
        if schedule != "interleaved-1f1b":
            v = 1
        for d in range(p):
            forwards = _forward_order_interleaved(d, p, m, v, backward=False)
            backwards = _forward_order_interleaved(d, p, m, v, backward=True)
            if schedule == "gpipe":
                device_ops.append(forwards + backwards)
            elif schedule == "1f1b":
                device_ops.append(_one_f_one_b(forwards, backwards, p - d - 1))
            elif schedule == "interleaved-1f1b":
                warmup = 2 * (p - d - 1) + (v - 1) * p
                device_ops.append(_one_f_one_b(forwards, backwards, warmup))
            else:
                raise ValueError(f"unknown schedule {schedule!r}")
    evaluation = _evaluation_order(device_ops, p * v)
    return Schedule(
        pp=p,
        microbatches=m,
        virtual_stages=v,
        split_backward=schedule == "zero-bubble",
        device_ops=tuple(tuple(ops) for ops in device_ops),
        evaluation=tuple(evaluation),
    )


def pipeline_finish(
    schedule: Schedule,
    forward,
    backward,
    weight=None,
    transfer=0.0,
) -> np.ndarray:
    """End time of the last operation of every device, by the max-plus recursion.

    Parameters
    ----------
    schedule
        From :func:`build_schedule`.
    forward, backward, weight
        Duration of one operation of one *chunk* on each device, arrays of shape
        ``(..., pp)`` (constant over micro-batches). ``backward`` is the whole backward, or the
        input-gradient part when the schedule splits it (``weight`` then holds the rest).
    transfer
        Point-to-point transfer time between neighbouring stages, broadcastable to ``(...)``.

    Returns
    -------
    numpy.ndarray
        Shape ``(..., pp)``: when each device finishes its last operation (time 0 = step start).
    """
    p = schedule.pp
    n_virtual = p * schedule.virtual_stages
    forward = np.asarray(forward, dtype=float)
    backward = np.asarray(backward, dtype=float)
    batch = forward.shape[:-1]
    weight = np.zeros_like(forward) if weight is None else np.asarray(weight, dtype=float)
    transfer = np.broadcast_to(np.asarray(transfer, dtype=float), batch)
    # one contiguous array per device, not strided views of the last axis: every op below
    # is a pass over the batch, thousands of them for long pipelines
    durations = {kind: list(np.moveaxis(a, -1, 0).copy())
                 for kind, a in (("F", forward), ("B", backward), ("W", weight))}
    consumers: dict[Op, int] = {}
    for _, op in schedule.evaluation:
        dep, _ = _dependency(op, n_virtual)
        if dep is not None:
            consumers[dep] = consumers.get(dep, 0) + 1
    free = [np.zeros(batch) for _ in range(p)]
    end: dict[Op, np.ndarray] = {}
    for d, op in schedule.evaluation:
        dep, with_transfer = _dependency(op, n_virtual)
        if dep is None:
            finish = free[d] + durations[op[0]][d]
        else:
            arrival = end[dep] + transfer if with_transfer else end[dep]
            finish = np.maximum(free[d], arrival)
            finish += durations[op[0]][d]  # in place: finish is a fresh array
            consumers[dep] -= 1
            if consumers[dep] == 0:
                del end[dep]  # bounded memory: keep only ends still awaited
        free[d] = finish
        if consumers.get(op, 0):
            end[op] = finish
    return np.stack(free, axis=-1)
