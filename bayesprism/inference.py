"""``fit()``: sample a model's posterior and return a self-describing DataTree (docs/artifacts.md).

Samplers: ``nutpie`` (default when installed), PyMC's own NUTS (``pymc``), mean-field ADVI
(``advi``: ``pm.fit`` then ``approx.sample``). ``pathfinder`` needs pymc-extras, which today
pins an older PyMC; it is refused with a clear message unless pymc-extras is importable.

Convergence thresholds (a :class:`~bayesprism.errors.ConvergenceWarning` names the parameters):
any divergent transition, rank-normalised split R-hat above :data:`RHAT_MAX` (1.01), or bulk
effective sample size below :data:`ESS_PER_CHAIN` (100) × chains. ADVI draws are independent
draws of an approximation: only NUTS runs are checked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism._version import __version__
from bayesprism.errors import ConvergenceWarning, InputError, Problem
from bayesprism.ingest.classify import classify_kernel
from bayesprism.io import ARTIFACT_SCHEMA_VERSION, clean_attrs, load
from bayesprism.model import build, prepare, prepare_statistics
from bayesprism.model.fleet_prior import add_population_prior, mark_units_to_start_in_core
from bayesprism.population_prior import (
    PopulationPrior,
    check_kernel_posterior,
    fleet_classes,
    population_prior_from,
)
from bayesprism.schema import COLLECTIVE_CLASSES, signature_as_kernel
from bayesprism.spec import ModelSpec
from bayesprism.statistics.artifact import TraceStatistics, input_digest, traced_inventory

# PyMC, nutpie and ArviZ are imported inside the functions that sample: start-up time
# (`import bayesprism.inference` must not load them; nutpie and pymc-extras are optional).

RHAT_MAX = 1.01
ESS_PER_CHAIN = 100
#: Up to here, with enough ESS and no divergences, an R-hat above :data:`RHAT_MAX` from 2 chains
#: is often chance: the largest of hundreds of coordinates' split R-hats crossed 1.01 on about
#: half the seeds of the traced 3D job's fit (1.011-1.016, each time on another coordinate).
RHAT_BORDERLINE = 1.02
#: Chains whose mean log densities differ by more than this many within-chain standard
#: deviations sit in different modes, which sampling longer does not join (a traced job twice
#: the dev job's size: 35, with R-hat 1.83; the dev traces: 0.02; a slowly mixing fit, R-hat
#: 1.06: 0.14).
MODE_GAP_SDS = 3.0
#: ... and a chain whose mode holds this many log units less posterior mass than the best
#: chain's sits in a mode of negligible mass: the gap of mean log densities, less what a wider
#: mode makes up (the sum over unconstrained coordinates of the log ratio of the chains'
#: posterior sds, a Gaussian approximation of each mode). ``fit`` then samples again with
#: every chain started at the best chain's last draw (the traced job twice the dev job's size:
#: a gap of 429; sampled again, R-hat 1.006 instead of 1.83; the dev traces at some seeds: a
#: chain 104-172 log units (10-17 sds) lower, in a mode where a traced GPU's effect sits 4 sds
#: off, its mass e^-81 and e^-142 of the best chain's). Smaller gaps (a fleet benchmark GPU's
#: minor mode, 19) are only reported.
DECISIVE_LOG_MASS_GAP = 20.0
SAMPLERS: tuple[str, ...] = ("auto", "nutpie", "pymc", "advi", "pathfinder")
#: Iterations of ADVI (stops earlier when the parameters converge).
ADVI_ITERATIONS = 30_000
#: Warm-up iterations and draws per chain by nutpie mass-matrix adaptation (``fit(tune=None,
#: draws=None)``, :func:`default_length`). The low-rank adaptation learns its matrix from draws
#: and gradients in windows and settles sooner than the diagonal one (nutpie's own default is
#: 800 against 400 for its diagonal); on the traced 3D job (193 coordinates, seeds 0-6) 600
#: warm-up draws gave the same max R-hat (mean 1.011 against 1.011) and bulk ESS (690 against
#: 700) as 1000, no divergences, in 29 % less time. A low-rank warm-up iteration costs about
#: twice a sampling one, so the time saved buys 1500 draws: with 1000, the largest of the 193
#: split R-hats of 2 chains crossed 1.01 by chance on about half of those seeds (up to 1.016, each
#: time another coordinate); with 1500 it stayed at 1.005-1.008 on all 7 (bulk ESS 496-1390),
#: for 6-9 s more. The diagonal adaptation keeps PyMC's 1000 and 1000: the DLRM sample at a
#: warm-up of 600 reached R-hat 1.012-1.014 against 1.010 (seeds 0-1).
DEFAULT_LENGTH = {"diag": (1000, 1000), "low_rank": (600, 1500)}
#: Models with more coordinates keep 1000 and 1000 under the low-rank matrix too: the traced 3D
#: job fitted with its fleet GEMM benchmark (4,299 coordinates, seed 0) reached R-hat 1.042
#: and bulk ESS 51 at a warm-up of 600 against 1.018 and 71 at 1000.
SHORT_WARMUP_MAX_COORDINATES = 1000
#: Regularisation of nutpie's low-rank mass-matrix estimate (its ``mass_matrix_gamma``, 1e-5 by
#: default). With nutpie's default, a dozen of the warm-up's updates of the traced 3D job's
#: matrix stall for 2.5-5.5 s each in nutpie's compiled code (iterations 200-325 of 400),
#: 16-18 s a chain against 7 s of log-density evaluations; at 1e-2 (one chain) they were
#: gone, and at 1e-3 the 2-chain fit took 56-68 s instead of 73-88 s (seeds 0-3, same R-hat).
LOW_RANK_GAMMA = 1e-3


def default_length(model, mass_matrix: str) -> tuple[int, int]:
    """Warm-up iterations and draws per chain for a PyMC model sampled under ``mass_matrix``.

    :data:`DEFAULT_LENGTH` of the adaptation, but the diagonal's for models of more than
    :data:`SHORT_WARMUP_MAX_COORDINATES` unconstrained coordinates.

    Examples
    --------
    >>> import pymc as pm
    >>> with pm.Model() as model:
    ...     effect = pm.Normal("effect", shape=8)
    >>> default_length(model, "low_rank"), default_length(model, "diag")
    ((600, 1500), (1000, 1000))
    """
    if model_coordinates(model) > SHORT_WARMUP_MAX_COORDINATES:
        return DEFAULT_LENGTH["diag"]
    return DEFAULT_LENGTH[mass_matrix]


def model_coordinates(model) -> int:
    """Unconstrained coordinates of a PyMC model (what its sampler moves).

    Examples
    --------
    >>> import pymc as pm
    >>> with pm.Model() as model:
    ...     effect = pm.Normal("effect", shape=8)
    ...     scale = pm.HalfNormal("scale")
    >>> model_coordinates(model)
    9
    """
    shapes = model.eval_rv_shapes()
    return sum(int(np.prod(shapes[v.name])) for v in model.value_vars)


def _as_tables(tables) -> list[pd.DataFrame]:
    if isinstance(tables, pd.DataFrame):
        return [tables]
    tables = list(tables)
    bad = [type(t).__name__ for t in tables if not isinstance(t, pd.DataFrame)]
    if not tables or bad:
        raise InputError(Problem("fit", "tables", "expected a DataFrame or a list of DataFrames",
                                 example=bad[0] if bad else "[]"))
    return tables


def _resolve_spec(spec, tables: list[pd.DataFrame]):
    if spec is None:
        all_steps = all(
            "kernel_class" in t.columns and len(t)
            and bool((t["kernel_class"].astype(str) == "step").all())
            for t in tables
        )
        if all_steps:
            warnings.warn("every row is a step-level row: fitting the step model "
                          "(ModelSpec.load('step'))", UserWarning, stacklevel=3)
            return ModelSpec.load("step")
        return ModelSpec.default()
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, (str, Path)):
        return ModelSpec.load(spec)
    raise InputError(Problem("fit", "spec", "expected a ModelSpec, a spec name or a TOML path",
                             example=type(spec).__name__))


def _resolve_sampler(sampler: str) -> str:
    if sampler not in SAMPLERS:
        raise InputError(Problem("fit", "sampler", "unknown sampler; choose one of "
                                 + ", ".join(SAMPLERS), example=sampler))
    if sampler == "auto":
        return "nutpie" if importlib.util.find_spec("nutpie") else "pymc"
    if sampler == "nutpie" and not importlib.util.find_spec("nutpie"):
        raise InputError(Problem("fit", "sampler", "nutpie is not installed; use 'pymc'",
                                 example=sampler))
    if sampler == "pathfinder" and not importlib.util.find_spec("pymc_extras"):
        import pymc as pm

        raise InputError(Problem(
            "fit", "sampler",
            "pathfinder needs pymc-extras, which is not installed; installing it would "
            f"downgrade PyMC (pymc-extras pins pymc<6.4, installed {pm.__version__}): use 'advi' "
            "for a fast approximation", example=sampler))
    return sampler


#: nutpie-compiled models of this process by (spec hash, input digest, backend): refitting the
#: same data with another seed or length skips the compile (the slowest part of a small fit).
#: The package's one module-level mutable state, bounded; why it is not an ``lru_cache`` or a
#: caller-owned object: docs/architecture.md ("Layer rule").
_COMPILED: dict[tuple[str, ...], object] = {}
_COMPILED_MAX = 4


def nutpie_backend() -> str:
    """The backend nutpie compiles with: ``"jax"`` when JAX is installed, else ``"numba"``.

    The environment variable ``BAYESPRISM_NUTPIE_BACKEND=jax|numba`` overrides.

    Measured on the 10 M-launch benchmark model (204,800 cells, 584 parameters): JAX compiles
    in ~2 s where numba's LLVM build of nutpie's callback takes 24-106 s; a log-density +
    gradient costs ~4 ms against ~1.5 ms, so the whole fit took 172 s against 207 s. Small
    models compile in ~2 s instead of 10-25 s.
    """
    chosen = os.environ.get("BAYESPRISM_NUTPIE_BACKEND", "").strip().lower()
    if chosen in ("jax", "numba"):
        return chosen
    return "jax" if importlib.util.find_spec("jax") else "numba"


#: Bytes that the JAX compilation cache set up by :func:`jax_compilation_cache` may hold
#: before JAX drops its least recently used entries (the dev job's model takes 0.4 MB).
JAX_CACHE_MAX_BYTES = 1 << 30


def jax_compilation_cache() -> str | None:
    """The directory of JAX's persistent compilation cache, set up if JAX has none.

    XLA's compilation of a model's log density and gradient is most of a fit's fixed cost (the
    dev traces' model: 5-9 s of a 50 s fit) and is the same whenever the same model is fitted
    to the same data again, with another seed, length or chain count. JAX keeps such
    executables on disk once a directory is set; bayesprism sets
    ``$XDG_CACHE_HOME/bayesprism/jax`` (``~/.cache`` without it), bounded by
    :data:`JAX_CACHE_MAX_BYTES`, unless ``JAX_COMPILATION_CACHE_DIR`` (or
    ``jax.config``) already names one, or ``JAX_ENABLE_COMPILATION_CACHE=false`` turns
    the cache off (then None).

    Examples
    --------
    >>> import jax
    >>> jax.config.update("jax_compilation_cache_dir", "/tmp/jax-cache")  # doctest: +SKIP
    >>> jax_compilation_cache()  # doctest: +SKIP
    '/tmp/jax-cache'
    """
    import jax

    if not jax.config.jax_enable_compilation_cache:
        return None
    if jax.config.jax_compilation_cache_dir:
        return str(jax.config.jax_compilation_cache_dir)
    directory = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bayesprism"
    jax.config.update("jax_compilation_cache_dir", str(directory / "jax"))
    jax.config.update("jax_compilation_cache_max_size", JAX_CACHE_MAX_BYTES)
    return str(directory / "jax")


def _compiled_nutpie(model, key: tuple[str, str] | None, start: dict | None = None):
    """The nutpie-compiled ``model``, cached under ``key``.

    With ``start`` (values of the free variables) every chain starts there, without jitter,
    and nothing is cached.
    """
    import nutpie

    backend = nutpie_backend()
    key = None if key is None or start is not None else (*key, backend)
    if key is not None and key in _COMPILED:
        return _COMPILED[key]
    options = {} if start is None else {"initial_points": start, "jitter_rvs": set()}
    if backend == "jax":
        jax_compilation_cache()
    compiled = nutpie.compile_pymc_model(model, backend=backend, gradient_backend=
                                         "jax" if backend == "jax" else "pytensor", **options)
    if key is not None:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = compiled
    return compiled


def _sample(model, sampler: str, *, draws: int, tune: int, chains: int, random_seed: int,
            progress: bool, cache_key: tuple[str, str] | None = None,
            target_accept: float = 0.8, mass_matrix: str = "diag",
            start: dict | None = None) -> xr.DataTree:
    import pymc as pm

    if sampler == "nutpie":
        import nutpie

        compiled = _compiled_nutpie(model, cache_key, start)
        adaptation = ({"adaptation": "low_rank", "mass_matrix_gamma": LOW_RANK_GAMMA}
                      if mass_matrix == "low_rank" else {"adaptation": "diag"})
        tree = nutpie.sample(compiled, draws=draws, tune=tune, chains=chains,
                             cores=min(chains, 2), seed=random_seed, progress_bar=progress,
                             target_accept=target_accept, **adaptation)
        return _add_data_groups(tree, model)
    if sampler == "pymc":
        with model:
            return pm.sample(draws=draws, tune=tune, chains=chains, cores=min(chains, 2),
                             random_seed=random_seed, nuts_sampler="pymc",
                             target_accept=target_accept,
                             progressbar=progress, compute_convergence_checks=False)
    if sampler == "advi":
        from pymc.variational.callbacks import CheckParametersConvergence

        with model:
            approx = pm.fit(ADVI_ITERATIONS, method="advi", random_seed=random_seed,
                            progressbar=progress,
                            callbacks=[CheckParametersConvergence(tolerance=1e-3,
                                                                  diff="relative")])
            tree = approx.sample(draws * chains, random_seed=random_seed)
        return _add_data_groups(tree, model)
    import pymc_extras as pmx  # pathfinder, only reachable when pymc-extras is importable

    with model:
        tree = pmx.fit(method="pathfinder", num_draws=draws * chains, random_seed=random_seed,
                       parallel=False)
    return _add_data_groups(tree, model)


def _add_data_groups(tree: xr.DataTree, model) -> xr.DataTree:
    """Add ``observed_data``/``constant_data`` from the model when the sampler did not."""
    import pymc
    from pymc.backends.arviz import (
        coords_and_dims_for_inferencedata,
        dict_to_dataset,
        find_constants,
        find_observations,
    )

    coords, dims = coords_and_dims_for_inferencedata(model)
    for group, values in (("constant_data", find_constants), ("observed_data", find_observations)):
        if group not in tree.children:
            tree[group] = xr.DataTree(dict_to_dataset(values(model), inference_library=pymc,
                                                      coords=coords, dims=dims, sample_dims=[]))
    return tree


def convergence_summary(tree: xr.DataTree) -> dict:
    """Max R-hat, min bulk ESS, divergences and the parameters failing the thresholds.

    Returns
    -------
    dict
        ``max_rhat``, ``min_ess_bulk``, ``divergences`` (int), ``failing`` (list of
        ``"name: reason"`` strings), ``checked`` (False for ADVI/pathfinder draws) and
        ``chain_logp_gap`` / ``chain_logp_gap_sds`` (:func:`chain_logp_gap`; NaN without
        two chains' log densities).
    """
    import arviz as az

    posterior = tree["posterior"].to_dataset()
    chains = int(posterior.sizes.get("chain", 1))
    sampler = str(tree.attrs.get("sampler", ""))
    divergences = 0
    if "sample_stats" in tree.children and "diverging" in tree["sample_stats"]:
        divergences = int(tree["sample_stats"]["diverging"].sum())
    gap = chain_logp_gap(tree)
    result = {"max_rhat": float("nan"), "min_ess_bulk": float("nan"),
              "divergences": divergences, "failing": [],
              "checked": sampler in ("nutpie", "pymc") and chains > 1,
              "chain_logp_gap": gap[0], "chain_logp_gap_sds": gap[1]}
    if posterior.sizes.get("draw", 0) < 4:
        return result
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rhat = az.rhat(posterior)
        ess = az.ess(posterior, method="bulk")
    rhat = rhat.to_dataset() if isinstance(rhat, xr.DataTree) else rhat
    ess = ess.to_dataset() if isinstance(ess, xr.DataTree) else ess
    max_rhat, min_ess = [], []
    for name in posterior.data_vars:
        r = np.asarray(rhat[name], dtype=float)
        e = np.asarray(ess[name], dtype=float)
        r_max = float(np.nanmax(r)) if np.isfinite(r).any() else float("nan")
        e_min = float(np.nanmin(e)) if np.isfinite(e).any() else float("nan")
        max_rhat.append(r_max)
        min_ess.append(e_min)
        if r_max > RHAT_MAX:
            result["failing"].append(f"{name}: R-hat {r_max:.3f}")
        if e_min < ESS_PER_CHAIN * chains:
            result["failing"].append(f"{name}: bulk ESS {e_min:.0f}")
    finite_r = [v for v in max_rhat if np.isfinite(v)]
    finite_e = [v for v in min_ess if np.isfinite(v)]
    result["max_rhat"] = max(finite_r) if finite_r else float("nan")
    result["min_ess_bulk"] = min(finite_e) if finite_e else float("nan")
    return result


def _chain_logp(tree: xr.DataTree) -> np.ndarray | None:
    """Log densities of the draws, (chain, draw), or None without two chains of them."""
    if "sample_stats" not in tree.children:
        return None
    stats = tree["sample_stats"].to_dataset()
    name = next((n for n in ("logp", "lp") if n in stats), None)
    if name is None or stats.sizes.get("chain", 1) < 2 or stats.sizes.get("draw", 0) < 4:
        return None
    return stats[name].transpose("chain", "draw").to_numpy().astype(float)


def chain_logp_gap(tree: xr.DataTree) -> tuple[float, float]:
    """The largest difference between two chains' mean log densities, and that in sds.

    Returns the difference in log units and in pooled within-chain standard deviations; NaNs
    without two chains' log densities (``sample_stats`` ``logp`` of nutpie, ``lp`` of PyMC).

    Chains in one mode differ by a small fraction of a standard deviation; chains in different
    modes by several (:data:`MODE_GAP_SDS`).

    Examples
    --------
    >>> logp = np.stack([np.random.default_rng(0).normal(0.0, 10.0, 500),
    ...                  np.random.default_rng(1).normal(-400.0, 10.0, 500)])
    >>> tree = xr.DataTree.from_dict({"sample_stats": xr.Dataset(
    ...     {"logp": (("chain", "draw"), logp)})})
    >>> [round(v) for v in chain_logp_gap(tree)]
    [400, 41]
    """
    logp = _chain_logp(tree)
    if logp is None:
        return float("nan"), float("nan")
    means = logp.mean(axis=1)
    gap = float(means.max() - means.min())
    within = float(np.sqrt(logp.var(axis=1, ddof=1).mean()))
    return gap, gap / within if within > 0 else float("inf")


def minor_mode_restart(tree: xr.DataTree, model) -> dict | None:
    """Where to sample again when a chain sat in a mode of negligible mass, or None.

    A chain whose mean log density lies more than :data:`MODE_GAP_SDS` within-chain sds below
    the best chain's, and whose mode's mass (:func:`mode_mass_gap`) lies more than
    :data:`DECISIVE_LOG_MASS_GAP` log units below it, is in such a mode.

    Returns
    -------
    dict or None
        ``start`` (the best chain's last draw of every free variable), ``best_chain``,
        ``gap``, ``gap_sds`` and ``mass_gap``.

    Examples
    --------
    >>> import pymc as pm
    >>> with pm.Model() as model:
    ...     effect = pm.Normal("effect")
    >>> rng = np.random.default_rng(0)
    >>> logp = np.stack([rng.normal(0.0, 1.0, 100), rng.normal(-40.0, 1.0, 100)])
    >>> effect = np.stack([rng.normal(5.0, 0.1, 100), rng.normal(-5.0, 0.1, 100)])
    >>> tree = xr.DataTree.from_dict({  # chain 1 in a mode 40 lower, as wide
    ...     "sample_stats": xr.Dataset({"logp": (("chain", "draw"), logp)}),
    ...     "posterior": xr.Dataset({"effect": (("chain", "draw"), effect)})})
    >>> restart = minor_mode_restart(tree, model)
    >>> restart["best_chain"], round(float(restart["start"]["effect"]))
    (0, 5)
    """
    gap, gap_sds = chain_logp_gap(tree)
    if not gap_sds > MODE_GAP_SDS:  # one mode (or one chain): nothing else to look at
        return None
    best, mass_gap = mode_mass_gap(tree, model)
    if not mass_gap > DECISIVE_LOG_MASS_GAP:
        return None
    posterior = tree["posterior"]
    start = {rv.name: posterior[rv.name].isel(chain=best, draw=-1).to_numpy()
             for rv in model.free_RVs}
    return {"start": start, "best_chain": best, "gap": gap, "gap_sds": gap_sds,
            "mass_gap": mass_gap}


def mode_mass_gap(tree: xr.DataTree, model) -> tuple[int, float]:
    """The best chain and how many log units less posterior mass the worst chain's mode holds.

    Each chain's mode is taken as Gaussian with the chain's own marginal sds in the sampler's
    unconstrained coordinates: its log mass is its mean log density plus the sum of its log
    sds (up to a constant the chains share), so a lower mode that is wider makes up part of
    its gap.

    Examples
    --------
    >>> import pymc as pm
    >>> with pm.Model() as model:
    ...     effect = pm.Normal("effect")
    >>> rng = np.random.default_rng(0)
    >>> logp = np.stack([rng.normal(0.0, 1.0, 4000), rng.normal(-3.0, 1.0, 4000)])
    >>> effect = np.stack([rng.normal(5.0, 0.1, 4000), rng.normal(-5.0, 1.0, 4000)])
    >>> tree = xr.DataTree.from_dict({  # chain 1: 3 lower, 10 times wider (log 10 = 2.3)
    ...     "sample_stats": xr.Dataset({"logp": (("chain", "draw"), logp)}),
    ...     "posterior": xr.Dataset({"effect": (("chain", "draw"), effect)})})
    >>> best, gap = mode_mass_gap(tree, model)
    >>> best, round(gap, 1)
    (0, 0.7)
    """
    logp = _chain_logp(tree)
    means = logp.mean(axis=1)
    log_sd = np.zeros(means.size)
    posterior = tree["posterior"]
    for rv in model.free_RVs:
        if rv.name not in posterior:
            continue
        values = _unconstrained(model, rv, posterior[rv.name].to_numpy())
        sd = values.reshape(values.shape[0], values.shape[1], -1).std(axis=1, ddof=1)
        usable = (sd > 0).all(axis=0)  # a coordinate a chain never moved says nothing
        log_sd += np.log(sd[:, usable]).sum(axis=1)
    mass = means + log_sd
    best = int(mass.argmax())
    return best, float(mass[best] - mass.min())


def _unconstrained(model, rv, values: np.ndarray) -> np.ndarray:
    """Draws (chain, draw, ...) of a free variable in the sampler's coordinates."""
    transform = model.rvs_to_transforms.get(rv)
    if transform is None:
        return values
    import pytensor.tensor as pt

    try:
        return np.asarray(transform.forward(pt.as_tensor(values), *rv.owner.inputs).eval())
    except Exception:  # a transform needing more than the values: as drawn
        return values


def _warn_convergence(tree: xr.DataTree) -> None:
    summary = convergence_summary(tree)
    if not summary["checked"]:
        return
    problems = list(summary["failing"])
    if summary["divergences"]:
        problems.insert(0, f"{summary['divergences']} divergent transitions")
    if problems:
        chains = int(tree["posterior"].sizes["chain"])
        borderline = (not summary["divergences"] and summary["max_rhat"] <= RHAT_BORDERLINE
                      and summary["min_ess_bulk"] >= ESS_PER_CHAIN * chains)
        advice = "Sample longer (draws/tune) before trusting forecasts."
        if borderline and chains <= 2:
            advice = (f"Only R-hat, and at most {RHAT_BORDERLINE}: with {chains} chains the "
                      "largest of many coordinates' R-hats crosses 1.01 by chance on some "
                      "well-mixed fits; refit with 4 chains (or another seed) to tell chance "
                      "from a real problem.")
        elif summary["chain_logp_gap_sds"] > MODE_GAP_SDS:
            advice = (f"The chains sit in different modes: their mean log densities differ by "
                      f"{summary['chain_logp_gap']:.0f} ({summary['chain_logp_gap_sds']:.0f} "
                      "within-chain sds), which sampling longer does not join, and forecasts "
                      "mix the modes. The parameters above are where they disagree; refit "
                      "with more chains to see how many modes there are.")
        warnings.warn(
            "the fit did not converge (R-hat must be <= "
            f"{RHAT_MAX}, bulk ESS >= {ESS_PER_CHAIN * chains}, no divergences): "
            + "; ".join(problems) + ". " + advice,
            ConvergenceWarning, stacklevel=3)


def population_prior_for(prior, prepared, source: str = "population prior") -> PopulationPrior:
    """The :class:`~bayesprism.population_prior.PopulationPrior` a fit of ``prepared`` uses.

    ``prior`` is one already, or a fitted kernel-level posterior (a DataTree or the path of
    one, e.g. a fleet benchmark's): its class with the most launches that the fit also launches
    is carried over, a benchmark's ``"benchmark"`` rows counting as the class of their kernel
    (a GEMM benchmark measures the ``gemm`` class).

    Raises
    ------
    InputError
        The file is not a posterior, or no class of the prior is a compute class of the fit.

    Examples
    --------
    >>> prior = population_prior_for("fleet.nc", prepared)  # doctest: +SKIP
    >>> prior.kernel_class  # doctest: +SKIP
    'gemm'
    """
    compute = [c for c in prepared.coords.get("kernel_class", [])
               if c not in COLLECTIVE_CLASSES]
    if isinstance(prior, PopulationPrior):
        if prior.kernel_class not in compute:
            raise InputError(Problem(prior.source, "kernel_class", "not a compute class of the "
                                     f"fit (it has {', '.join(compute) or 'none'})",
                                     example=prior.kernel_class))
        return prior
    if isinstance(prior, (str, os.PathLike)):
        source = str(prior)
        try:
            prior = load(prior, expect="posterior")
        except FileNotFoundError:
            raise InputError(Problem(source, "", "no such file")) from None
    elif source == "population prior" and prior.attrs.get("input_digest"):
        source = f"the posterior of input {prior.attrs['input_digest']}"
    check_kernel_posterior(prior, source)
    units = {level: (list(prepared.coords[dim]), np.asarray(prepared.data[f"{level}_group"]))
             for level, dim in (("node", "node"), ("gpu", "gpu_unit"))
             if dim in prepared.coords and f"{level}_group" in getattr(prepared, "data", {})}
    for fleet_class in fleet_classes(prior):
        own = _measured_class(prior, fleet_class)
        if own in compute:
            return population_prior_from(prior, own, fleet_class, source, units)
    raise InputError(Problem(source, "kernel_class", "no class of the population prior is a "
                             f"compute class of the fit ({', '.join(compute) or 'none'})",
                             example=", ".join(fleet_classes(prior)) or "none"))


def _measured_class(posterior: xr.DataTree, fleet_class: str) -> str:
    """The class a posterior's ``fleet_class`` measures.

    Itself, or for ``"benchmark"`` rows the class of their kernel when all its kernels classify
    alike (a GEMM benchmark measures ``gemm``).
    """
    kernels = posterior["constant_data"].to_dataset() \
        if "constant_data" in posterior.children else None
    if fleet_class != "benchmark" or kernels is None or "kernel_class_of_kernel" not in kernels:
        return fleet_class
    index = list(posterior["posterior"]["kernel_class"].to_numpy()).index(fleet_class)
    names = kernels["kernel"].to_numpy()[kernels["kernel_class_of_kernel"].to_numpy() == index]
    # a benchmark's kernel is named with its shape appended ("<kernel>[m=..,n=..,k=..]")
    kinds = {classify_kernel(str(name).split("[")[0]) for name in names}
    return kinds.pop() if len(kinds) == 1 else fleet_class


def fit(tables, spec=None, *, draws: int | None = None, tune: int | None = None,
        chains: int = 2, sampler: str = "auto", random_seed: int = 0, progress: bool = True,
        target_accept: float | None = None, population_prior=None) -> xr.DataTree:
    """Fit a model to trace tables and return its posterior as a self-describing DataTree.

    Parameters
    ----------
    tables
        One trace table or a list of them (``bayesprism.schema``), or their statistics
        (:class:`~bayesprism.statistics.TraceStatistics`, e.g.
        :func:`~bayesprism.statistics.read_statistics` of a statistics artifact: the same
        posterior as from the tables, for the kernel-level model with a lognormal residual).
    spec
        A :class:`~bayesprism.spec.ModelSpec`, a spec name (``"default"``, ``"step"``, ...) or a
        TOML path. ``None`` means ``ModelSpec.default()``, or the step spec when every row is a
        step-level row (``kernel_class == "step"``; a ``UserWarning`` says so).
    draws, tune, chains
        Posterior draws and warm-up iterations per chain, and the number of chains. ``None``:
        the model's (:func:`default_length`: 1000 each, or 1500 draws after a warm-up of 600
        for models of up to 1,000 coordinates that nutpie samples with its low-rank mass
        matrix).
    sampler
        ``"auto"`` (nutpie when installed, else PyMC), ``"nutpie"``, ``"pymc"``, ``"advi"``,
        ``"pathfinder"`` (only with pymc-extras importable).
    random_seed
        Seed of the sampler: the same seed gives the same draws.
    progress
        Show the sampler's progress bar.
    target_accept
        NUTS target acceptance rate in (0, 1) (nutpie and PyMC); higher takes smaller steps,
        the usual cure for divergent transitions. ``None``: the model's choice (0.8, or 0.9
        for models whose geometry needs it).
    population_prior
        A fitted posterior of the same fleet (path or DataTree; typically a per-GPU benchmark
        of many nodes) or a :class:`~bayesprism.population_prior.PopulationPrior`: its node,
        GPU and GPU×step-episode population parameters become the prior of this fit's
        (:mod:`bayesprism.population_prior`; kernel-level models). The notes say what was
        carried over.

    Returns
    -------
    xarray.DataTree
        Groups ``posterior``, ``sample_stats``, ``observed_data``, ``constant_data`` and
        ``inventory``; root attrs as in docs/artifacts.md.

    Raises
    ------
    InputError
        Bad tables, spec or arguments (one problem per line; never a PyMC traceback).

    Warns
    -----
    ConvergenceWarning
        Divergences, R-hat > 1.01 or bulk ESS < 100 × chains (NUTS samplers).
    UserWarning
        nutpie sampled twice: a chain sat in a mode of negligible mass
        (:func:`minor_mode_restart`), so every chain was sampled again from the best chain's
        last draw (``posterior.attrs["minor_mode_restart"]``).

    Examples
    --------
    >>> import bayesprism as bp
    >>> table = bp.read_traces("data/kineto/param_dlrm_8rank", progress=False)  # doctest: +SKIP
    >>> posterior = bp.fit(table, "default", random_seed=0)  # doctest: +SKIP
    >>> posterior.attrs["model_kind"]  # doctest: +SKIP
    'kernel'
    >>> stats = bp.read_statistics("stats.parquet")  # doctest: +SKIP
    >>> bp.fit(stats, "default", random_seed=0).attrs["input_kind"]  # doctest: +SKIP
    'statistics'
    """
    stats = tables if isinstance(tables, TraceStatistics) else None
    if stats is None:
        tables = [signature_as_kernel(t) for t in _as_tables(tables)]
    given = ([] if draws is None else [("draws", draws)]) + [("chains", chains)]
    problems = [
        Problem("fit", name, "must be a positive integer", example=value)
        for name, value in given
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
    ]
    if tune is not None and (isinstance(tune, bool) or not isinstance(tune, (int, np.integer))
                             or tune < 0):
        problems.append(Problem("fit", "tune", "must be an integer >= 0", example=tune))
    if target_accept is not None and not (
            isinstance(target_accept, (int, float, np.floating)) and not isinstance(
                target_accept, bool) and 0 < float(target_accept) < 1):
        problems.append(Problem("fit", "target_accept", "must be a number in (0, 1)",
                                example=target_accept))
    if problems:
        raise InputError(problems)
    if stats is None:
        spec = _resolve_spec(spec, tables)
    else:  # statistics hold kernel cells only
        spec = ModelSpec.default() if spec is None else _resolve_spec(spec, [])
    sampler = _resolve_sampler(sampler)
    if sampler == "nutpie" and tune == 0:  # nutpie's adaptation panics without warm-up
        raise InputError(Problem("fit", "tune", "nutpie needs tune >= 1; use sampler='pymc' "
                                 "to sample without warm-up", example=tune))
    if stats is None:
        prepared = prepare(tables, spec)
        inventory = traced_inventory(tables)
        digest = input_digest(tables)
    else:  # the same arrays, inventory and digest as from the tables summarised
        prepared = prepare_statistics(stats.model, spec, source=stats.source or "statistics")
        inventory = stats.inventory.copy()
        digest = stats.input_digest
    prior = None
    if population_prior is not None:
        if spec.kind != "kernel":
            raise InputError(Problem("fit", "population_prior", "needs a kernel-level spec",
                                     example=spec.name))
        prior = population_prior_for(population_prior, prepared)
        start_notes = mark_units_to_start_in_core(prior, prepared)
    model = build(prepared, spec)
    prior_key = ""
    if prior is not None:
        notes = add_population_prior(prior, prepared, spec, model) + start_notes
        prepared.attrs["notes"] = [*prepared.attrs.get("notes", []), *notes]
        prior_key = prior.to_json()
        prepared.attrs["population_prior"] = prior_key
    mass_matrix = str(prepared.attrs.get("mass_matrix", "diag"))
    if tune is None or draws is None:  # the model's size and adaptation decide
        default_tune, default_draws = default_length(
            model, mass_matrix if sampler == "nutpie" else "diag")
        tune = default_tune if tune is None else tune
        draws = default_draws if draws is None else draws

    start = time.perf_counter()
    options = {"draws": int(draws), "tune": int(tune), "chains": int(chains),
               "random_seed": int(random_seed), "progress": progress,
               "target_accept": float(target_accept if target_accept is not None
                                      else prepared.attrs.get("target_accept", 0.8)),
               "mass_matrix": mass_matrix}
    tree = _sample(model, sampler, cache_key=(spec.spec_hash(), digest + prior_key), **options)
    restart = minor_mode_restart(tree, model) if sampler == "nutpie" else None
    if restart is not None:
        tree = _sample(model, sampler, start=restart.pop("start"), **options)
    seconds = time.perf_counter() - start

    tree["inventory"] = inventory
    posterior_attrs = {k: v for k, v in tree["posterior"].attrs.items()
                       if k not in ("created_at", "arviz_version")}
    posterior_attrs.update(prepared.attrs)
    if target_accept is not None:
        posterior_attrs["target_accept"] = float(target_accept)
    if restart is not None:
        posterior_attrs["minor_mode_restart"] = json.dumps(restart)
    tree["posterior"].attrs = posterior_attrs
    spec_dict = spec.to_dict()
    tree.attrs = {
        "bayesprism_version": __version__,
        "schema_version": ARTIFACT_SCHEMA_VERSION,
        "model_kind": spec.kind,
        "spec": json.dumps(spec_dict, sort_keys=True),
        "spec_hash": spec.spec_hash(),
        "input_digest": digest,
        "sampler": sampler,
        "sampler_backend": nutpie_backend() if sampler == "nutpie" else "pytensor",
        "seconds": float(seconds),
        "draws": int(draws),
        "tune": int(tune),
        "chains": int(chains),
        "random_seed": int(random_seed),
        "fit_summary": json.dumps(prepared.summary, sort_keys=True, default=str),
        "input_kind": "tables" if stats is None else "statistics",
    }
    if stats is not None:
        tree.attrs["statistics_source"] = stats.source
        tree.attrs["statistics_provenance"] = json.dumps(stats.provenance, sort_keys=True,
                                                         default=str)
    if restart is not None:
        warnings.warn(
            f"the chains first sat in different modes (mean log densities "
            f"{restart['gap']:.0f} apart, {restart['gap_sds']:.0f} within-chain sds; the "
            f"lower mode's mass about e^-{restart['mass_gap']:.0f} of the other's): the lower "
            f"one holds a negligible share of the posterior, so every chain was sampled again "
            f"from chain "
            f"{restart['best_chain']}'s last draw", UserWarning, stacklevel=2)
    _warn_convergence(tree)
    # netCDF stores no dicts, None or mixed lists (the model's attrs hold some): store them as
    # bayesprism.io.save writes them (JSON), so what fit returns equals what load gives back and
    # xarray users can call DataTree.to_netcdf on it directly
    return clean_attrs(tree)
