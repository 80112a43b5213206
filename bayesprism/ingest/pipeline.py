"""Pipeline schedule, micro-batches and send/recv pairing from one stage's point-to-point ops.

A pipeline stage's GPU timeline in one step is compute separated by point-to-point operations
on its pipeline group: ``send``, ``recv``, or a ``coalesced`` pair (``batch_isend_irecv``: a
send and a receive launched as one NCCL kernel). The sequence of those operations follows from
the schedule, the number of micro-batches ``m``, the stage ``s`` and the number of stages
``pp``. :func:`schedule_ops` writes that sequence for GPipe and for Megatron's non-interleaved
1F1B (``forward_backward_pipelining_without_interleaving``: warm-up ``min(pp - s - 1, m)``
forwards, then one forward and one backward per iteration with the send of one direction and
the receive of the other coalesced, then the cool-down backwards); :func:`infer_schedule`
finds the ``(schedule, m)`` whose sequence equals the traced one, step by step.

The message count pins ``m``: a first or last stage exchanges ``2m`` messages per step, any
other ``4m`` (a coalesced op carries two). An interleaved schedule (``v`` model chunks per
stage) exchanges ``v`` times as many and matches neither candidate: it is reported as not
recognised, with the counts, rather than guessed.

Each message is identified by the stage boundary it crosses, its direction (activations
forward, gradients backward) and its micro-batch, so the two ends of a transfer (and both
halves of a coalesced pair) get the same instance number (:func:`message_instances`), which is
what the wait/transfer split pairs on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Work items of a chunk between two point-to-point ops: ("F" | "B", micro-batch).
Work = tuple[str, int]
#: A message: (boundary between stage b and b+1, "F" activations | "B" gradients, micro-batch).
Message = tuple[int, str, int]

SCHEDULE_CANDIDATES: tuple[str, ...] = ("1f1b", "gpipe")


def op_kind(collective_name: str | None) -> str | None:
    """``send``, ``recv`` or ``coalesced`` from a kernel's ``Collective name`` arg.

    Examples
    --------
    >>> op_kind("send"), op_kind("recv"), op_kind("coalesced"), op_kind("allreduce")
    ('send', 'recv', 'coalesced', None)
    """
    if not collective_name:
        return None
    text = str(collective_name).lower()
    if "coalesc" in text or "batch" in text or text in ("sendrecv", "send_recv"):
        return "coalesced"
    if text.startswith("send") or text == "isend":
        return "send"
    if text.startswith("recv") or text == "irecv":
        return "recv"
    return None


@dataclass
class StageSchedule:
    """One step of one stage: the ops (kind and messages) and the work between them."""

    ops: list[tuple[str, list[Message]]] = field(default_factory=list)
    #: chunks[i] is the work before ops[i]; chunks[len(ops)] the work after the last op
    chunks: list[list[Work]] = field(default_factory=lambda: [[]])

    def work(self, item: Work) -> None:
        self.chunks[-1].append(item)

    def op(self, kind: str, *messages: Message) -> None:
        self.ops.append((kind, list(messages)))
        self.chunks.append([])


def schedule_ops(schedule: str, stage: int, stages: int, microbatches: int) -> StageSchedule:
    """The point-to-point ops and work of one step of one stage under a schedule.

    Parameters
    ----------
    schedule
        ``"1f1b"`` (Megatron non-interleaved) or ``"gpipe"``.
    stage, stages
        This stage (0-based) and the number of stages.
    microbatches
        Micro-batches per step.

    Returns
    -------
    StageSchedule

    Examples
    --------
    >>> s = schedule_ops("1f1b", 0, 2, 3)
    >>> [kind for kind, _ in s.ops]
    ['send', 'coalesced', 'coalesced', 'recv']
    >>> s.chunks
    [[('F', 0)], [('F', 1)], [('B', 0), ('F', 2)], [('B', 1)], [('B', 2)]]
    """
    first, last = stage == 0, stage == stages - 1
    out = StageSchedule()

    def fwd_in(i: int) -> Message:
        return (stage - 1, "F", i)

    def fwd_out(i: int) -> Message:
        return (stage, "F", i)

    def bwd_in(i: int) -> Message:
        return (stage, "B", i)

    def bwd_out(i: int) -> Message:
        return (stage - 1, "B", i)

    def forward(i: int) -> None:  # receive the activations, compute, send them on
        if not first:
            out.op("recv", fwd_in(i))
        out.work(("F", i))
        if not last:
            out.op("send", fwd_out(i))

    def backward(i: int) -> None:  # receive the gradients, compute, send them back
        if not last:
            out.op("recv", bwd_in(i))
        out.work(("B", i))
        if not first:
            out.op("send", bwd_out(i))

    if schedule == "gpipe":
        for i in range(microbatches):
            forward(i)
        for i in range(microbatches):
            backward(i)
        return out
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULE_CANDIDATES}")
    warmup = min(stages - stage - 1, microbatches)
    steady = microbatches - warmup
    for i in range(warmup):
        forward(i)
    if steady > 0 and not first:
        out.op("recv", fwd_in(warmup))
    for i in range(steady):
        out.work(("F", warmup + i))
        if not last:
            out.op("coalesced", fwd_out(warmup + i), bwd_in(i))
        out.work(("B", i))
        if not first:
            if i == steady - 1:
                out.op("send", bwd_out(i))
            else:
                out.op("coalesced", bwd_out(i), fwd_in(warmup + i + 1))
    for i in range(steady, microbatches):
        backward(i)
    return out


def message_count(kinds: list[str]) -> int:
    """Messages carried by a list of op kinds (a coalesced op carries two)."""
    return sum(2 if k == "coalesced" else 1 for k in kinds)


def candidate_microbatches(kinds: list[str], stage: int, stages: int) -> int | None:
    """``m`` implied by one step's message count on a stage (None when it does not divide)."""
    per_mb = 2 if stage in (0, stages - 1) else 4
    n = message_count(kinds)
    return n // per_mb if n and n % per_mb == 0 else None


def infer_schedule(kinds_by_step: list[list[str]], stage: int, stages: int
                   ) -> tuple[str | None, int | None, str | None]:
    """``(schedule, microbatches, why_not)`` from the op kinds of each traced step of a stage.

    Every step must have the same sequence, equal to a candidate schedule's. ``why_not`` says
    what was seen when no candidate matches (then schedule and micro-batches are None).

    Examples
    --------
    >>> kinds = [k for k, _ in schedule_ops("1f1b", 1, 4, 8).ops]
    >>> infer_schedule([kinds, kinds], 1, 4)
    ('1f1b', 8, None)
    """
    steps = [tuple(k) for k in kinds_by_step if k]
    if not steps:
        return None, None, "no point-to-point operation on the pipeline group"
    if len(set(steps)) > 1:
        counts = sorted({message_count(list(s)) for s in steps})
        return None, None, (f"steps differ in their send/recv sequence (messages per step: "
                            f"{counts})")
    kinds = list(steps[0])
    m = candidate_microbatches(kinds, stage, stages)
    if m is None:
        return None, None, (f"{message_count(kinds)} messages per step on stage {stage} of "
                            f"{stages} fit no whole number of micro-batches")
    for schedule in SCHEDULE_CANDIDATES:
        if [k for k, _ in schedule_ops(schedule, stage, stages, m).ops] == kinds:
            return schedule, m, None
    return None, None, (f"the send/recv sequence of stage {stage} ({len(kinds)} ops, "
                        f"{message_count(kinds)} messages) matches neither GPipe nor "
                        f"non-interleaved 1F1B with {m} micro-batches (interleaved schedules "
                        "are not recognised)")


def message_instances(schedule: StageSchedule, microbatches: int) -> list[int]:
    """Instance number of each op: equal on both ends of a transfer (and of a coalesced pair).

    The instance of an op is the smallest code ``(2 * boundary + direction) * m + micro-batch``
    among its messages; both halves of a coalesced pair (a forward send with the matching
    backward receive) are met by the same coalesced op on the neighbouring stage.
    """
    out = []
    for _, messages in schedule.ops:
        codes = [(2 * b + (0 if d == "F" else 1)) * microbatches + i for b, d, i in messages]
        out.append(min(codes))
    return out


def chunk_label(work: list[Work]) -> tuple[str | None, int | None]:
    """``(phase, micro-batch)`` of a chunk: ``forward``, ``backward``, or both joined by ``+``
    in execution order (the micro-batch of the first item)."""
    if not work:
        return None, None
    names = {"F": "forward", "B": "backward"}
    return "+".join(names[d] for d, _ in work), work[0][1]


__all__ = ["SCHEDULE_CANDIDATES", "StageSchedule", "candidate_microbatches", "chunk_label",
           "infer_schedule", "message_count", "message_instances", "op_kind", "schedule_ops"]
