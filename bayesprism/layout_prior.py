"""The step model's learned priors: how far a layout deviates from the cost formula, and how
fast slow-step spikes become more frequent with scale, learned across MLPerf-style ladders.

With two or three measured layouts per ladder, the step model (:mod:`bayesprism.model.step`)
cannot learn ``config_sd`` (the log-sd of a layout's level around the structural formula) or
``spike_slope`` (growth of the spike log-odds per e-fold of nodes) from its own runs; their
priors then set the width of every forecast at a new scale. Both are one quantity across
systems and benchmarks up to a between-ladder spread, so they are learned hierarchically:

1. **Evidence per ladder** (:func:`ladder_evidence`): the step model is fitted to *every* run of
   the ladder under a flat prior on ``log config_sd`` (over the model's integration range) and
   a wide ``Normal(0, 2)`` prior on ``spike_slope``. The posterior of ``log config_sd`` is then
   proportional to its marginal likelihood; it is kept as a smoothed log density on
   :data:`EVIDENCE_GRID`. The slope's likelihood is the normal whose product with the wide
   prior gives the posterior's mean and sd.
2. **Pooling** (:func:`pool_evidence`): ``log config_sd_l ~ Normal(mu, tau)`` over ladders l,
   ``mu ~ Normal(log 0.03, 1.5)``, ``tau ~ HalfNormal(0.5)`` (systems differ by a factor of a
   few, not by orders of magnitude), and the same for ``spike_slope_l ~ Normal(mu_b, tau_b)``
   with ``mu_b ~ Normal(0, 1)``, ``tau_b ~ HalfNormal(0.5)``; computed exactly on grids (no
   sampler). The shipped prior is the predictive of a **new** ladder, moment-matched: a
   lognormal ``config_sd`` and a normal ``spike_slope``.

The result is a small JSON file (:data:`DEFAULT_PATH`, shipped in the package) holding the
prior, the per-ladder evidence (so that pooling is reproducible without refitting) and the
provenance of every ladder (runs, layouts, source files with their SHA-256, the snapshot
commit from ``MANIFEST.tsv`` when the files carry one).
:func:`bayesprism.learn_prior.learn_layout_prior` (CLI ``bayesprism learn-prior``) refits
it from a user's own ladders (step 1 fits models, so it lives above the model, in
:mod:`bayesprism.learn_prior`; this module is the file format, its reader and the pooling).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bayesprism.errors import InputError, Problem

# scipy.stats is imported where pooling needs it (start-up time of the step model's import).

#: The shipped learned prior (read-only package data).
DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "step_layout_prior.json"
FORMAT = "bayesprism-step-layout-prior"
FORMAT_VERSION = 1
#: Log config_sd grid (natural log) of the per-ladder evidence: 1e-4 to 1, 0.1 apart.
EVIDENCE_GRID: tuple[float, float, int] = (math.log(1e-4), 0.0, 93)
#: Gaussian smoothing (log units) of the posterior draws of log config_sd: the draws come
#: from a quadrature grid 0.064 apart and 1000-4000 of them resolve ~0.1-0.2.
EVIDENCE_BANDWIDTH = 0.15
#: Wide prior of spike_slope in the evidence fits; divided out of the posterior.
EVIDENCE_SLOPE_SD = 2.0
#: Hyperpriors of the pooling (module docstring).
MU_PRIOR: tuple[float, float] = (math.log(0.03), 1.5)
TAU_SCALE = 0.5
SLOPE_MU_PRIOR: tuple[float, float] = (0.0, 1.0)
SLOPE_TAU_SCALE = 0.5


@dataclass(frozen=True)
class LayoutPrior:
    """Learned priors of the step model (see the module docstring).

    Attributes
    ----------
    config_sd_log_mean, config_sd_log_sd
        ``log config_sd ~ Normal(config_sd_log_mean, config_sd_log_sd)`` (a lognormal).
    spike_slope_mean, spike_slope_sd
        ``spike_slope ~ Normal(spike_slope_mean, spike_slope_sd)``.
    ladders
        Per-ladder evidence and provenance, as stored in the file.
    source
        Where the prior came from (file path, or ``"learned"`` before it is written).
    """

    config_sd_log_mean: float
    config_sd_log_sd: float
    spike_slope_mean: float
    spike_slope_sd: float
    ladders: tuple[dict, ...] = field(default_factory=tuple)
    source: str = "learned"

    def to_json(self) -> str:
        """The file's JSON text (prior, hyperpriors, per-ladder evidence and provenance)."""
        body = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "prior": {"config_sd_log_mean": self.config_sd_log_mean,
                      "config_sd_log_sd": self.config_sd_log_sd,
                      "spike_slope_mean": self.spike_slope_mean,
                      "spike_slope_sd": self.spike_slope_sd},
            "method": {"evidence_grid": list(EVIDENCE_GRID),
                       "evidence_bandwidth": EVIDENCE_BANDWIDTH,
                       "evidence_slope_sd": EVIDENCE_SLOPE_SD,
                       "mu_prior": list(MU_PRIOR), "tau_scale": TAU_SCALE,
                       "slope_mu_prior": list(SLOPE_MU_PRIOR),
                       "slope_tau_scale": SLOPE_TAU_SCALE},
            "ladders": list(self.ladders),
        }
        return json.dumps(body, indent=1, sort_keys=True) + "\n"

    def summary(self) -> dict:
        """Plain numbers: the prior, its median config_sd and the ladders it was learned from.

        Examples
        --------
        >>> LayoutPrior(-4.0, 0.5, 0.3, 0.2).summary()["config_sd_median"]
        0.0183
        """
        values = asdict(self)
        values.pop("ladders")
        values["config_sd_median"] = round(math.exp(self.config_sd_log_mean), 4)
        values["ladders"] = [{k: v for k, v in ladder.items() if k in
                              ("name", "runs", "layouts", "world_sizes")}
                             for ladder in self.ladders]
        return values


def load_layout_prior(path: str | Path | None = None) -> LayoutPrior:
    """Read a learned step-model prior (default: the one shipped in the package).

    Parameters
    ----------
    path
        A file written by :func:`bayesprism.learn_prior.learn_layout_prior`; ``None`` reads
        :data:`DEFAULT_PATH`.

    Returns
    -------
    LayoutPrior

    Raises
    ------
    InputError
        The file is not JSON, not this format, or its prior values are missing or not finite.

    Examples
    --------
    >>> prior = load_layout_prior()
    >>> 0.0 < prior.config_sd_log_sd and len(prior.ladders) >= 1
    True
    """
    where = Path(DEFAULT_PATH if path is None else path)
    try:
        body = json.loads(where.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(Problem(str(where), "", f"is not JSON ({exc.msg})")) from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise InputError(Problem(str(where), "format", f"must be {FORMAT!r}",
                                 example=body.get("format") if isinstance(body, dict) else None))
    prior = body.get("prior") or {}
    names = ("config_sd_log_mean", "config_sd_log_sd", "spike_slope_mean", "spike_slope_sd")
    problems = [Problem(str(where), f"prior.{n}", "must be a finite number", example=prior.get(n))
                for n in names if not _finite(prior.get(n))]
    problems += [Problem(str(where), f"prior.{n}", "must be > 0", example=prior[n])
                 for n in ("config_sd_log_sd", "spike_slope_sd")
                 if _finite(prior.get(n)) and prior[n] <= 0]
    if problems:
        raise InputError(problems)
    return LayoutPrior(*(float(prior[n]) for n in names),
                       ladders=tuple(body.get("ladders") or ()), source=str(where))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def evidence_grid() -> np.ndarray:
    """The log config_sd grid of the per-ladder evidence (:data:`EVIDENCE_GRID`)."""
    lo, hi, n = EVIDENCE_GRID
    return np.linspace(lo, hi, int(n))


def evidence_from_draws(log_config_sd: np.ndarray, spike_slope: np.ndarray) -> dict:
    """Per-ladder evidence from posterior draws of a flat-prior fit (module docstring, step 1).

    Parameters
    ----------
    log_config_sd
        Posterior draws of ``log config_sd`` under a prior flat in it.
    spike_slope
        Posterior draws of ``spike_slope`` under ``Normal(0, EVIDENCE_SLOPE_SD)``.

    Returns
    -------
    dict
        ``config_sd_loglik`` (smoothed log density on :func:`evidence_grid`, max 0, rounded to
        4 decimals) and ``spike_slope_lik`` (``[mean, sd]`` of the normal likelihood, or
        ``None`` when the data say nothing beyond the prior).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> ev = evidence_from_draws(rng.normal(-4, 0.3, 2000), rng.normal(0.5, 0.4, 2000))
    >>> int(np.argmax(ev["config_sd_loglik"])) == int(np.argmin(abs(evidence_grid() + 4)))
    True
    """
    grid = evidence_grid()
    u = np.asarray(log_config_sd, dtype=float).ravel()
    z = (grid[:, None] - u[None, :]) / EVIDENCE_BANDWIDTH
    density = np.exp(-0.5 * z**2).mean(axis=1)
    # a floor: a likelihood is never exactly 0 where no draw landed, only small
    log_density = np.log(np.maximum(density, 1e-8 * density.max()))
    log_density -= log_density.max()
    slope = np.asarray(spike_slope, dtype=float).ravel()
    mean, var = float(slope.mean()), float(slope.var())
    precision = 1.0 / var - 1.0 / EVIDENCE_SLOPE_SD**2
    # the data must at least halve the prior variance to count as a measurement
    if precision <= 1.0 / EVIDENCE_SLOPE_SD**2:
        slope_lik = None
    else:
        slope_lik = [round(mean / var / precision, 5), round(1.0 / math.sqrt(precision), 5)]
    return {"config_sd_loglik": [round(float(v), 4) for v in log_density],
            "spike_slope_lik": slope_lik}


def pool_evidence(ladders: Sequence[Mapping]) -> LayoutPrior:
    """Pool per-ladder evidence into the prior of a new ladder (module docstring, step 2).

    Deterministic (grids, no sampling): the same evidence gives the same prior.

    Parameters
    ----------
    ladders
        Dicts with ``config_sd_loglik`` and ``spike_slope_lik`` (:func:`evidence_from_draws`);
        other keys (provenance) are carried into the result.

    Returns
    -------
    LayoutPrior

    Raises
    ------
    InputError
        No ladders, or evidence of the wrong length.

    Examples
    --------
    >>> flat = {"config_sd_loglik": [0.0] * int(EVIDENCE_GRID[2]), "spike_slope_lik": None}
    >>> prior = pool_evidence([flat])
    >>> abs(prior.spike_slope_mean) < 1e-9   # no evidence: the hyperprior's predictive
    True
    """
    from scipy import stats

    if not ladders:
        raise InputError(Problem("layout prior", "ladders", "needs at least one ladder"))
    grid = evidence_grid()
    problems = [Problem("layout prior", f"ladders[{i}].config_sd_loglik",
                        f"must have {len(grid)} values", example=len(ev.get("config_sd_loglik")
                                                                     or []))
                for i, ev in enumerate(ladders) if len(ev.get("config_sd_loglik") or []) !=
                len(grid)]
    if problems:
        raise InputError(problems)
    step = grid[1] - grid[0]
    # config_sd: hyper-grid (mu, tau); each ladder's level integrated over the evidence grid
    mu = np.linspace(grid[0], grid[-1], 121)
    tau = np.linspace(0.01, 4 * TAU_SCALE, 120)
    m, t = np.meshgrid(mu, tau, indexing="ij")
    log_post = stats.norm.logpdf(m, *MU_PRIOR) + stats.halfnorm.logpdf(t, scale=TAU_SCALE)
    for ev in ladders:
        loglik = np.asarray(ev["config_sd_loglik"], dtype=float)
        kernel = stats.norm.logpdf(grid[None, None, :], m[..., None], t[..., None])
        log_post = log_post + _logsumexp(kernel + loglik, axis=-1) + math.log(step)
    weight = np.exp(log_post - log_post.max())
    weight /= weight.sum()
    # predictive of a new ladder's log config_sd: a mixture of Normal(mu, tau)
    mean = float(np.sum(weight * m))
    var = float(np.sum(weight * (t**2 + m**2)) - mean**2)
    # spike slope: the same with normal likelihoods (conjugate inside, grid over the hypers)
    mu_b = np.linspace(-4.0, 4.0, 321)
    tau_b = np.linspace(0.005, 4 * SLOPE_TAU_SCALE, 160)
    mb, tb = np.meshgrid(mu_b, tau_b, indexing="ij")
    log_post_b = stats.norm.logpdf(mb, *SLOPE_MU_PRIOR) \
        + stats.halfnorm.logpdf(tb, scale=SLOPE_TAU_SCALE)
    for ev in ladders:
        if ev.get("spike_slope_lik"):
            b, s = (float(v) for v in ev["spike_slope_lik"])
            log_post_b = log_post_b + stats.norm.logpdf(b, mb, np.sqrt(tb**2 + s**2))
    weight_b = np.exp(log_post_b - log_post_b.max())
    weight_b /= weight_b.sum()
    mean_b = float(np.sum(weight_b * mb))
    var_b = float(np.sum(weight_b * (tb**2 + mb**2)) - mean_b**2)
    return LayoutPrior(round(mean, 4), round(math.sqrt(var), 4), round(mean_b, 4),
                       round(math.sqrt(var_b), 4), ladders=tuple(dict(ev) for ev in ladders))


def _logsumexp(values: np.ndarray, axis: int) -> np.ndarray:
    top = values.max(axis=axis, keepdims=True)
    return np.squeeze(top, axis=axis) + np.log(np.exp(values - top).sum(axis=axis))
