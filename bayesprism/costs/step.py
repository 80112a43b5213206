"""Cost formulas of the step-level model (:mod:`bayesprism.model.step`), in NumPy: the PyMC
model fits them and the forecast (:mod:`bayesprism.forecast.stepscale`) evaluates them at a
target plan, from this one definition.

* :func:`max_normal_moments`: mean and sd of the slowest of R ranks (standard normals);
* :func:`schedule_bubble_slots`: idle micro-batch slots of an (interleaved) 1F1B step;
* :func:`comm_terms`: the ring all-reduce factors of the data-parallel gradient reduction
  (:mod:`bayesprism.costs.collectives`), on the intra- or inter-node tier;
* :data:`LEAF_PRIOR`: the prior of the leaf-switch tier's cost (the model samples it; a
  forecast draws it when the fit had no such fact);
* :func:`config_label` and :func:`separability_note`: the label of a layout and the note that
  the fitted runs cannot separate per-micro-batch from per-step cost, shared by the fit's notes
  and the forecast's warning.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy import special

from bayesprism.costs.collectives import bandwidth_factor, latency_steps, tier_of

#: LogNormal (mu, sigma) of ``comm_leaf``, the extra ring all-reduce cost (reference slots per
#: unit of bandwidth factor) once the data-parallel group spans more nodes than one leaf switch
#: holds (``nodes_per_leaf``, a fact the user states): traffic then crosses the spine, often
#: oversubscribed; from a few % to a few times the inter-node cost (median half of it).
LEAF_PRIOR: tuple[float, float] = (float(np.log(0.25)), 1.2)


@lru_cache(maxsize=4096)
def _max_normal_moments_one(n: int) -> tuple[float, float]:
    if n <= 1:
        return 0.0, 1.0
    x = np.linspace(-8.0, 12.0, 40001)
    log_density = np.log(n) + special.log_ndtr(x) * (n - 1) - 0.5 * x**2 - 0.5 * np.log(2 * np.pi)
    density = np.exp(log_density)
    dx = x[1] - x[0]
    mean = float(np.sum(x * density) * dx)
    var = float(np.sum((x - mean) ** 2 * density) * dx)
    return mean, float(np.sqrt(var))


def max_normal_moments(n) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of the maximum of ``n`` iid standard normals.

    Exact up to quadrature error (< 1e-6); ``n = 1`` gives (0, 1).

    Parameters
    ----------
    n
        Number of ranks (scalar or array of positive integers).

    Returns
    -------
    (mean, sd)
        Arrays with the shape of ``n``.
    """
    arr = np.asarray(n, dtype=np.int64)
    flat = arr.reshape(-1)
    moments = np.array([_max_normal_moments_one(int(k)) for k in flat]).reshape(flat.size, 2)
    return moments[:, 0].reshape(arr.shape), moments[:, 1].reshape(arr.shape)


def separability_note(microbatches: int) -> str:
    """The note that per-micro-batch and per-step costs were not separated by the fitted runs.

    Examples
    --------
    >>> separability_note(128)[:40]
    'every fitted run has 128 micro-batch(es)'
    """
    return (f"every fitted run has {int(microbatches)} micro-batch(es) per step: the runs "
            "cannot separate per-micro-batch from per-step cost (pipeline bubble, gradient "
            "reduction, optimizer); a forecast at another micro-batch count carries the "
            "priors' split of the two, not a measured one")


def schedule_bubble_slots(pp, virtual_stages) -> np.ndarray:
    """Idle micro-batch slots of a (interleaved) 1F1B pipeline step: (pp - 1) / v."""
    return (np.asarray(pp, dtype=float) - 1.0) / np.asarray(virtual_stages, dtype=float)


def config_label(layout: dict) -> str:
    """Label of a layout: its world size, parallel sizes, micro-batches and micro-batch size."""
    return (f"gpus{int(layout['world_size'])}-dp{int(layout['dp'])}-tp{int(layout['tp'])}"
            f"-pp{int(layout['pp'])}-cp{int(layout['cp'])}-m{int(layout['microbatches'])}"
            f"-v{int(layout['virtual_stages'])}-mbs{layout['micro_batch_size']:g}")


def comm_terms(dp_group, tp, pp, tp_cp_dp, gpus_per_node, reference_tp_pp):
    """Ring all-reduce factors of the data-parallel gradient reduction of a layout.

    Parameters
    ----------
    dp_group
        Ranks in the gradient all-reduce group (``dp * cp``: context-parallel ranks hold
        replicas of the same parameters).
    tp, pp
        Tensor- and pipeline-parallel sizes (gradient bytes per rank scale as 1 / (tp * pp)).
    tp_cp_dp
        ``tp * cp * dp``: the contiguous block of ranks the group is spread over (Megatron rank
        order tp, cp, dp, pp), which decides whether it leaves a node.
    gpus_per_node
        GPUs per node.
    reference_tp_pp
        ``tp * pp`` of the reference configuration.

    Returns
    -------
    dict of arrays
        ``latency_steps`` (2 (p - 1)), ``intra_bandwidth`` and ``inter_bandwidth`` (the
        bandwidth factor 2 (p - 1) / p times the relative gradient bytes, on the tier the group
        uses, 0 on the other tier).
    """
    p = np.asarray(dp_group, dtype=float)
    relative_bytes = float(reference_tp_pp) / (np.asarray(tp, dtype=float)
                                               * np.asarray(pp, dtype=float))
    inter = tier_of(np.asarray(tp_cp_dp), np.asarray(gpus_per_node)).astype(float)
    bandwidth = bandwidth_factor("allreduce", p) * relative_bytes
    return {"latency_steps": latency_steps("allreduce", p),
            "intra_bandwidth": bandwidth * (1.0 - inter),
            "inter_bandwidth": bandwidth * inter}
