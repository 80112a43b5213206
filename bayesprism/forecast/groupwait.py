"""The pace of a stage group that meets at every one of its collectives.

The ranks of a tensor-parallel group (or CP/EP) synchronise at each of their collectives, so a
micro-batch of the group takes, segment by segment, the slowest member's compute since the
previous collective. A member's compute in a segment of typical length ``b`` is
``(m_r + kappa * z) * b``: ``m_r`` its multiplier of the step (node, GPU, GPU×step effects),
``kappa`` the segment's relative launch-to-launch noise and ``z`` standard normal, independent
over members and segments (the noise of a member ``m_r`` times slower is ``m_r`` times wider:
neglected, second order in the members' differences). Summed over many segments, the
group's time is its work times

    ``pace = M + share * kappa * E[max_r((m_r - M) / kappa + z_r)]``,  ``M = max_r m_r``,

where ``share`` is the part of the work in segments that end at a group collective. With one
member much slower than the rest the pace is its multiplier (the noise rarely changes which
member is last); with equal members each segment costs ``kappa * E[max of q normals]`` more
(``q = 8``: 1.42 kappa), the sum of the segments' maxima rather than the maximum of the
sums. The expectation over ``z`` is Clark's moment matching of the maximum of independent
normals (Clark 1961: exact for two members; within 0.01 sd of the exact mean for eight).
"""

from __future__ import annotations

import numpy as np
from scipy import special

_INV_SQRT_2PI = 1.0 / np.sqrt(2.0 * np.pi)


def expected_max_normal(means: np.ndarray, axis: int = -1) -> np.ndarray:
    """E[max_r (means_r + z_r)] for independent standard normal z, by Clark's method.

    Members are merged one at a time: the maximum of two normals is matched by a normal of the
    same mean and variance.

    Parameters
    ----------
    means
        The members' means, any shape; ``axis`` runs over the members.
    axis
        The members' axis.

    Returns
    -------
    numpy.ndarray
        ``means`` without ``axis``.

    Examples
    --------
    Two equal members: E[max] = 1/sqrt(pi).

    >>> round(float(expected_max_normal(np.zeros(2))), 6)
    0.56419
    >>> round(float(expected_max_normal(np.array([0.0, -50.0]))), 6)  # one far behind
    0.0
    """
    members = np.moveaxis(np.asarray(means, dtype=float), axis, 0)
    mean, var = members[0], np.ones_like(members[0])
    for other in members[1:]:
        theta = np.sqrt(var + 1.0)
        a = (mean - other) / theta
        ahead = special.ndtr(a)
        behind = 1.0 - ahead
        density = _INV_SQRT_2PI * np.exp(-0.5 * a * a)
        first = mean * ahead + other * behind + theta * density
        second = ((mean * mean + var) * ahead + (other * other + 1.0) * behind
                  + (mean + other) * theta * density)
        mean, var = first, np.maximum(second - first * first, 1e-12)
    return mean


def group_pace(multipliers: np.ndarray, noise: np.ndarray | None, share: float) -> np.ndarray:
    """A stage group's compute multiplier: its members' (last axis) slowest, plus the waiting
    that segment-to-segment noise adds at the group's collectives.

    Parameters
    ----------
    multipliers
        Members' multipliers of the step, (..., q).
    noise
        ``kappa``, the relative launch-to-launch noise of one segment, broadcastable to
        ``multipliers[..., 0]``; None or 0: no waiting beyond the slowest member.
    share
        Share of the work in segments that end at a group collective (0 to 1).

    Returns
    -------
    numpy.ndarray
        (...,) the group's multiplier.

    Examples
    --------
    Two equal members, 1 % noise per segment, all work between group collectives:

    >>> round(float(group_pace(np.ones(2), np.array(0.01), 1.0)), 6)
    1.005642
    >>> float(group_pace(np.array([1.0, 1.2]), np.array(0.01), 1.0))  # one far slower
    1.2
    """
    slowest = multipliers.max(axis=-1)
    if noise is None or share <= 0.0 or multipliers.shape[-1] < 2:
        return slowest
    kappa = np.broadcast_to(np.asarray(noise, dtype=float), slowest.shape)
    positive = kappa > 0.0
    safe = np.where(positive, kappa, 1.0)
    # in units of the noise behind the slowest member (no cancellation of large means)
    behind = (multipliers - slowest[..., None]) / safe[..., None]
    return np.where(positive, slowest + share * safe * expected_max_normal(behind), slowest)
