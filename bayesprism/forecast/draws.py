"""The value composition returns: posterior predictive draws of step time and its breakdown."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepDraws:
    """Draws of step time for one plan, shape ``(draw, replicate)``, in seconds.

    ``step_time_s == compute_s + exposed_comm_s + bubble_s + wait_s`` element-wise. The spread
    within a row is step-to-step variability for one posterior draw; the spread of row means is
    parameter uncertainty.
    """

    step_time_s: np.ndarray
    compute_s: np.ndarray
    exposed_comm_s: np.ndarray
    bubble_s: np.ndarray
    wait_s: np.ndarray
    ideal_step_time_s: float
    # P(the cluster has a node with a degraded inter-node link), averaged over posterior draws
    degraded_link_probability: float = float("nan")
    # what of the plan is scaled or costed by formula rather than replayed from the traces
    extrapolated: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        shape = self.step_time_s.shape
        for name in ("compute_s", "exposed_comm_s", "bubble_s", "wait_s"):
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected {shape}")
