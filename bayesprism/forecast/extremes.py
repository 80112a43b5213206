"""Order statistics of the slowest nodes of a large cluster, without drawing every node.

A rank's log-multiplier is ``T = ln*u + lg*v + lgs*z + rho`` (node effect u and GPU effect v
from the posterior's populations, ``bayesprism.forecast.population``; rho normal, z normal or,
under an episode population, a two-component normal mixture: a share of GPU-steps shifted and
wider).
A node's slowest GPU gives ``Y = ln*u + M`` with ``M = max over its GPUs of e``,
``e = lg*v + lgs*z + rho``.
With N independent new nodes the maximum has CDF ``F^N``: a uniform U maps to the x with
``P(Y > x) = 1 - U^(1/N)``, and the next order statistics follow those of uniforms,
``F(x_i) = F(x_(i-1)) U_i^(1/(N-i+1))``. ``F`` is computed per posterior draw: the wider of
``ln*u`` and ``M`` stays in closed form and the other is integrated by quadrature in
probability space (geometric in the upper tail down to 1e-4/N), on an x grid geometric in the
distance to the maxima's lower bound and refined twice at evenly spaced log-tail levels of the
maxima's range (so power-law tails, e.g. Student-t with nu near 1, whose maxima spread over
decades, are inverted as accurately as light ones). Cost does not depend on N.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special
from scipy.interpolate import CubicSpline

from bayesprism.errors import InputError, Problem
from bayesprism.forecast.population import (
    episode_tail_weight,
    mixture_sf,
    population_parameters,
    population_quantile,
)


@dataclass(frozen=True)
class RankLaw:
    """Per-draw parameters of a rank's log-multiplier (arrays of length D)."""

    node: np.ndarray  # ln
    gpu: np.ndarray  # lg
    gpustep: np.ndarray  # lgs
    resid_mu: np.ndarray
    resid_sd: np.ndarray
    gpus_per_node: int
    # GPU x step episodes (weight, shift, sd of z in an episode), or None: z standard normal
    episode: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def draws(self) -> int:
        return int(self.node.shape[0])

    def transient_components(self, rows=slice(None)) -> list[tuple[np.ndarray, ...]]:
        """Normal components (weight, mean, sd) of the transient ``lgs*z + rho`` per draw; an
        episode's with the upper tail of the truncated law (``population.episode_tail_weight``:
        exact where maxima land)."""
        lgs, mu, rs = self.gpustep[rows], self.resid_mu[rows], self.resid_sd[rows]
        core = np.sqrt(lgs**2 + rs**2)
        if self.episode is None:
            return [(np.ones_like(mu), mu, core)]
        weight, shift, sd = (a[rows] for a in self.episode)
        # the episode (truncated to slow) as the untruncated normal with its upper tail
        weight = episode_tail_weight(weight, shift, sd)
        return [(1.0 - weight, mu, core),
                (weight, mu + lgs * shift, np.sqrt((lgs * sd) ** 2 + rs**2))]

    def transient_variance(self) -> np.ndarray:
        """Variance of the transient ``lgs*z + rho`` per draw (of the mixture, episodes
        included)."""
        components = self.transient_components()
        mean = sum(w * mu for w, mu, _ in components)
        return sum(w * (sd**2 + (mu - mean) ** 2) for w, mu, sd in components)


_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(16)
_GH_W = _GH_W / _GH_W.sum()


def _unit_sf(params: dict, z: np.ndarray) -> np.ndarray:
    """Population survival function with per-draw arguments z of shape (D, ...)."""
    family = params["family"]
    if family == "normal":
        return special.ndtr(-z)
    shape = (-1,) + (1,) * (z.ndim - 1)
    if family == "student_t":
        return special.stdtr(params["nu"].reshape(shape), -z)
    return mixture_sf(*(params[k].reshape(shape) for k in ("weight", "shift", "slow_sd")), z)


def _asinh(z: np.ndarray) -> np.ndarray:
    """asinh(z) = sign(z) log(|z| + sqrt(z^2 + 1)), to 1e-13: ~1.5x faster than ``np.arcsinh``
    (whose float64 kernel is not vectorised), and every table lookup warps its argument.
    |z| is capped at 1e150 (asinh 346) so z^2 stays finite; tables saturate long before."""
    a = np.minimum(np.abs(z), 1e150)
    out = a * a
    out += 1.0
    np.sqrt(out, out=out)
    out += a
    np.log(out, out=out)
    return np.copysign(out, z, out=out)


class _TabulatedSF:
    """Population survival function per draw on a uniform grid over [lo, hi], interpolated in
    log space. Student-t ``stdtr`` costs ~0.25 us a call, so many arguments per draw are cheaper
    from a table (interpolation error below 1e-3 relative); other families stay closed-form.
    Ranges wider than :attr:`LINEAR_SPAN` (power-law tails, nu near 1, whose maxima spread over
    decades) are tabulated on a uniform grid in ``asinh(z)`` instead, dense near 0 and
    logarithmic in the tails, where a power-law log-survival is linear in it.

    Only every :attr:`FILL_STRIDE`-th grid point is computed exactly; a cubic spline through
    them fills the rest. The log-survival is smooth on either grid, so the fill is over 20x
    more accurate than the linear interpolation between grid points that every lookup already
    makes (both measured against ``stdtr`` for nu from 1.02 to 30), at a third of the cost.
    """

    LINEAR_SPAN = 60.0
    FILL_STRIDE = 3

    def __init__(self, params: dict, lo: np.ndarray, hi: np.ndarray, points: int = 768):
        self.params = params
        self.tabulated = params["family"] == "student_t"
        if self.tabulated:
            self.warped = bool(np.any(hi - lo > self.LINEAR_SPAN))
            self.lo, self.hi = self._warp(lo), np.maximum(self._warp(hi), self._warp(lo) + 1e-9)
            exact = np.unique(np.append(np.arange(0, points, self.FILL_STRIDE), points - 1))
            grid = self.lo[:, None] + (self.hi - self.lo)[:, None] * (exact / (points - 1))
            z = np.sinh(grid) if self.warped else grid
            known = np.log(np.maximum(_unit_sf(params, z), 1e-300))
            # row-major, as lookups read it flat (the spline returns it transposed)
            table = np.ascontiguousarray(CubicSpline(exact, known, axis=1)(np.arange(points)))
            # a log-survival is <= 0 and falls with z; keep the spline's rounding-level
            # overshoot from breaking either (lookups and quantile inversions rely on both)
            self.table = np.minimum.accumulate(np.minimum(table, 0.0, out=table), axis=1,
                                               out=table)

    def _warp(self, z: np.ndarray) -> np.ndarray:
        return _asinh(z) if self.warped else z

    def __call__(self, z: np.ndarray) -> np.ndarray:
        if not self.tabulated:
            return _unit_sf(self.params, z)
        # the warp's result is a fresh array the interpolation may overwrite (saves a pass)
        out = _interp_rows(self._warp(z), self.lo, self.hi, self.table, scratch=self.warped)
        return np.exp(out, out=out)


def population_params(posterior, level: str, loading: np.ndarray) -> dict:
    """Family and per-draw parameters of a level's population ({"family": "normal"} when the
    level carries no loading in any draw, so an unfitted level needs no population)."""
    if not np.any(loading):
        return {"family": "normal"}
    try:
        return population_parameters(posterior, level)
    except KeyError as exc:
        raise InputError(Problem("posterior", f"{level}_population", str(exc))) from None


def _gpu_term_sf(y, lg, components, gpu_params):
    """P(e > y) for e = lg*v + a transient, a mixture of normal ``components`` (weight, mean,
    sd) per draw; y has shape (D, ...)."""
    out = np.zeros(y.shape)
    shape = (-1,) + (1,) * (y.ndim - 1)
    for weight, mu, sd in components:
        out += weight.reshape(shape) * _gpu_normal_sf(y, lg, sd, mu, gpu_params)
    return out


def _gpu_normal_sf(y, lg, transient_sd, mu, gpu_params):
    """P(e > y) for e = lg*v + N(mu, transient_sd^2), per draw; y has shape (D, ...)."""
    shape = (-1,) + (1,) * (y.ndim - 1)
    lg, sd, mu = (a.reshape(shape) for a in (lg, transient_sd, mu))
    if gpu_params["family"] == "normal":
        scale = np.sqrt(lg**2 + sd**2)
        return special.ndtr(-(y - mu) / np.where(scale > 0, scale, 1e-300))
    out = np.zeros(y.shape)
    safe_lg = np.where(lg > 0, lg, 1e-300)
    flat = y.reshape(y.shape[0], -1)
    lo = ((flat.min(axis=1) - mu.ravel() - sd.ravel() * _GH_X.max()) / safe_lg.ravel())
    hi = ((flat.max(axis=1) - mu.ravel() - sd.ravel() * _GH_X.min()) / safe_lg.ravel())
    sf = _TabulatedSF(gpu_params, lo, hi)
    centred, step = (y - mu) / safe_lg, sd / safe_lg  # the argument of node x is centred - step*x
    for x, w in zip(_GH_X, _GH_W, strict=True):
        term = sf(centred - step * x)
        term *= w
        out += term
    return out


def _tail_quadrature(n_new: int) -> tuple[np.ndarray, np.ndarray]:
    """Probability levels and weights on (0, 1), geometric in the upper tail down to 1e-4/N."""
    n_low, n_high = 8, 56
    upper = np.geomspace(1e-4 / n_new, 0.5, n_high)
    edges = np.concatenate([[0.0], np.sqrt(upper[:-1] * upper[1:]), [0.5]])
    q = np.concatenate([0.5 - (np.arange(n_low) + 0.5) / (2 * n_low), 1.0 - upper])
    return q, np.concatenate([np.full(n_low, 0.5 / n_low), np.diff(edges)])


def _interp_rows(
    x: np.ndarray, grid_lo, grid_hi, values: np.ndarray, scratch: bool = False
) -> np.ndarray:
    """Linear interpolation of per-row tables on uniform grids; x of shape (D, ...).

    ``scratch``: x is a temporary the result may overwrite. The tables are read through flat
    indices (``take``), much cheaper than broadcast row/column fancy indexing on these sizes.
    """
    n = values.shape[1]
    shape = (-1,) + (1,) * (x.ndim - 1)
    pos = x if scratch else x.copy()
    pos -= grid_lo.reshape(shape)
    pos *= ((n - 1) / (grid_hi - grid_lo)).reshape(shape)
    np.clip(pos, 0.0, n - 1.000001, out=pos)
    idx = pos.astype(np.int64)
    pos -= idx
    idx += (np.arange(x.shape[0]) * n).reshape(shape)
    flat = values.reshape(-1)
    below = flat.take(idx)
    idx += 1
    out = flat.take(idx)
    out -= below
    out *= pos
    out += below
    return out


@dataclass(frozen=True)
class _Populations:
    """Node and GPU populations of every posterior draw and the quantiles :class:`_NodeMaxLaw`
    needs, computed once for all chunks of draws (a Student-t quantile costs ~1 us)."""

    node: dict
    gpu: dict
    node_quantiles: np.ndarray | None  # (D, Q) at the tail quadrature's levels
    gpu_range: np.ndarray | None  # (D, 2) bounding the GPU effects of N new nodes

    @classmethod
    def of(cls, law: RankLaw, posterior, n_new: int) -> _Populations:
        node = population_params(posterior, "node", law.node)
        gpu = population_params(posterior, "gpu", law.gpu)
        node_quantiles = gpu_range = None
        if node["family"] != "normal":
            node_quantiles = population_quantile(posterior, "node", _tail_quadrature(n_new)[0])
        if gpu["family"] != "normal":
            levels = np.array([1e-9, 1.0 - 1e-6 / (n_new * law.gpus_per_node)])
            gpu_range = population_quantile(posterior, "gpu", levels)
        return cls(node, gpu, node_quantiles, gpu_range)


def _interp_each_row(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """``np.interp(x[i], xp[i], fp[i])`` per row, for knots xp *decreasing* along each row (a
    survival function against x); x is (n_x,) or (D, n_x). The knots are reversed into
    contiguous arrays once, not by each of thousands of calls."""
    xp, fp = xp[:, ::-1].copy(), fp[:, ::-1].copy()
    x = np.broadcast_to(x, (xp.shape[0], np.shape(x)[-1]))
    return np.array([np.interp(*row) for row in zip(x, xp, fp, strict=True)])


class _NodeMaxLaw:
    """Survival function of Y = ln*u + M per posterior draw, M = max over a node's GPUs of
    e = lg*v + N(mu, sd^2), u from the node population.

    The wider of the two parts stays in closed form and the other is integrated by quadrature
    in probability space (dense in the upper tail), so the result is smooth in x whichever part
    dominates: P(Y > x) = sum_j w_j S_u((x - Q_M(q_j)) / ln) when ``ln`` >= the spread of e,
    else sum_j w_j S_M(x - ln Q_u(q_j)) with S_M tabulated on a fine grid.
    """

    #: S_u's table spans all of :meth:`bounds`, wider than the refined x of a later call;
    #: twice the points keep the maxima at least as accurate as a 768-point table per call
    #: (checked against exact ``stdtr`` for Student-t nu from 1.1 to 12)
    NODE_TABLE_POINTS = 1536

    def __init__(self, law: RankLaw, populations: _Populations, n_new: int, rows: slice):
        gpn = law.gpus_per_node
        self.ln = law.node[rows]
        lg = law.gpu[rows]
        components = law.transient_components(rows)
        self.node_params = _subset_params(populations.node, rows)
        gpu_params = _subset_params(populations.gpu, rows)
        # every component's range is covered; the widest decides which part stays in closed
        # form
        width = [np.maximum(np.sqrt(lg**2 + sd**2), 1e-12) for _, _, sd in components]
        spread = np.max(width, axis=0)
        self.y_lo = np.min([mu - 9.0 * w for (_, mu, _), w in zip(components, width,
                                                                   strict=True)], axis=0)
        self.y_hi = np.max([mu + 12.0 * w for (_, mu, _), w in zip(components, width,
                                                                    strict=True)], axis=0)
        if gpu_params["family"] != "normal":
            v = populations.gpu_range[rows]
            for _, mu, sd in components:
                self.y_lo = np.minimum(self.y_lo, mu + lg * v[:, 0] - 9.0 * sd)
                self.y_hi = np.maximum(self.y_hi, mu + lg * v[:, 1] + 9.0 * sd)
        y = self.y_lo[:, None] + (self.y_hi - self.y_lo)[:, None] * np.linspace(0.0, 1.0, 768)
        sf_e = np.clip(_gpu_term_sf(y, lg, components, gpu_params), 0.0, 1.0 - 1e-16)
        self.log_sf_m = np.log(np.maximum(-np.expm1(gpn * np.log1p(-sf_e)), 1e-300))
        self.q, self.weights = _tail_quadrature(n_new)
        self.u_closed = self.ln >= spread
        # quantiles of M (for the u-closed form) from its tabulated survival function
        log_tail = np.log1p(-self.q)
        self.m_nodes = _interp_each_row(log_tail, self.log_sf_m, y)
        if self.node_params["family"] == "normal":
            self.u_nodes = np.broadcast_to(special.ndtri(self.q), (self.ln.size, self.q.size))
        else:
            self.u_nodes = populations.node_quantiles[rows]
        self.u_nodes = np.where(np.isfinite(self.u_nodes), self.u_nodes, 0.0)
        self.node_sf = self._node_table() if np.any(self.u_closed) else None

    def _node_table(self) -> _TabulatedSF:
        """The node population's survival function at every argument (x - Q_M(q_j)) / ln of
        the u-closed draws with x in :meth:`bounds`, tabulated once for all calls of
        :meth:`log_sf` rather than once per call over that call's arguments."""
        closed = self.u_closed
        lo, hi = (b[closed] for b in self.bounds())
        m = self.m_nodes[closed]
        ln = self.ln[closed]
        params = _subset_params(self.node_params, closed)
        return _TabulatedSF(params, (lo - m.max(axis=1)) / ln, (hi - m.min(axis=1)) / ln,
                            points=self.NODE_TABLE_POINTS)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """A range of x certain to hold the maximum of N nodes (per draw)."""
        lo = self.ln * self.u_nodes[:, -1] + self.m_nodes[:, -1]
        hi = self.ln * self.u_nodes.max(axis=1) + self.y_hi
        return lo, hi

    def log_sf(self, x: np.ndarray) -> np.ndarray:
        """log P(Y > x), x of shape (D, n_x) within :meth:`bounds`, monotone in x."""
        out = np.empty(x.shape)
        closed = self.u_closed
        if np.any(closed):
            ln = self.ln[closed][:, None, None]
            z = x[closed][:, :, None] - self.m_nodes[closed][:, None, :]
            z /= ln
            out[closed] = self.node_sf(z) @ self.weights
        if not np.all(closed):
            rest = ~closed
            arg = x[rest][:, :, None] - self.ln[rest][:, None, None] * self.u_nodes[rest][:, None]
            log_sf = _interp_rows(arg, self.y_lo[rest], self.y_hi[rest], self.log_sf_m[rest],
                                  scratch=True)
            out[rest] = np.exp(log_sf, out=log_sf) @ self.weights
        out = np.minimum.accumulate(np.maximum(out, 1e-300), axis=1)  # monotone despite rounding
        return np.log(out)


def _subset_params(params: dict, rows) -> dict:
    return {k: (v[rows] if isinstance(v, np.ndarray) and v.ndim == 1 else v)
            for k, v in params.items()}


def top_node_log_multipliers(
    law: RankLaw,
    posterior,
    n_new: int,
    size: int,
    top: int,
    rng: np.random.Generator,
    uniforms: np.ndarray | None = None,
) -> np.ndarray:
    """Inverse-CDF draws (D, size, top) of the ``top`` largest of ``n_new`` new nodes' Y.

    Y = ln*u + (max over the node's GPUs of lg*v + transient). P(max <= x) = F(x)^N, so the
    largest is the x with F(x) = U1^(1/N); the next ones follow the order statistics of
    uniforms, F(x_i) = F(x_(i-1)) * U_i^(1/(N-i+1)). F is computed per posterior draw
    (:class:`_NodeMaxLaw`) on an x grid, coarse then refined around the range of the maxima,
    never by drawing N values. ``uniforms`` (D, size, top) replaces the generator's uniforms
    (e.g. correlated over replicates for a persistent cluster).
    """
    d = law.draws
    if uniforms is None:
        uniforms = rng.random((d, size, top))
    log_u = np.log(np.clip(uniforms, 1e-300, 1.0))
    log_cdf = np.cumsum(log_u / (n_new - np.arange(top)), axis=-1)
    target = np.log(np.maximum(-np.expm1(log_cdf), 1e-300)).reshape(d, size * top)
    out = np.empty((d, size * top))
    levels = np.linspace(np.log(min(0.5, (60.0 + 10 * top) / n_new)), np.log(1e-4 / n_new), 48)
    # a grid dense near the lower bound (geometric in the distance to it, six decades), then
    # twice refined at evenly spaced log-tail levels: heavy (power-law) tails put the maxima's
    # range decades above its lower end, which a uniform grid in x misses
    spacing = np.concatenate([[0.0], np.geomspace(1e-6, 1.0, 39)])
    chunk = 256
    populations = _Populations.of(law, posterior, n_new)
    for start in range(0, d, chunk):
        rows = slice(start, min(d, start + chunk))
        node_max = _NodeMaxLaw(law, populations, n_new, rows)
        lo, hi = node_max.bounds()
        x = lo[:, None] + (hi - lo)[:, None] * spacing
        log_sf = node_max.log_sf(x)
        for _ in range(2):
            x_new = _interp_each_row(levels, log_sf, x)
            x = np.concatenate([x, x_new], axis=1)
            log_sf = np.concatenate([log_sf, node_max.log_sf(x_new)], axis=1)
            order = np.argsort(x, axis=1, kind="stable")
            x = np.take_along_axis(x, order, axis=1)
            log_sf = np.minimum.accumulate(np.take_along_axis(log_sf, order, axis=1), axis=1)
        out[rows] = _interp_each_row(target[rows], log_sf, x)
    return out.reshape(d, size, top)
