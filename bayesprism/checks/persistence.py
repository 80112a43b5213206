"""Do a fit's GPU slowdowns last over consecutive steps?

Real slowdowns (thermal or power throttling, a noisy neighbour) start, last a while and end,
so a traced GPU can be slow from one step to the end of the trace. Under a ``lasting``
GPU×step population the kernel model fits how long episodes last
(``gpustep_episode_persistence``, ``bayesprism.model.episodes``); under ``degraded`` it draws
each GPU-step on its own. Either way a GPU slow for the whole traced run may be taken for that
GPU's own speed, which widens the GPU population, hence the spread between clusters of new
nodes; and forecasts draw each step's episodes at their share, so a composed run's steps are
less correlated than lasting episodes make them.

:func:`episode_persistence` reads the fit's cell statistics, removes each GPU's and each
step's median, flags GPU-steps slower than the rest by many robust spreads, and counts the
flagged pairs of consecutive steps of one GPU against what independent GPU-steps with the same
share flagged would give (Poisson).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats

from bayesprism.checks.predictive_checks import kernel_classes
from bayesprism.schema import COLLECTIVE_CLASSES

#: Robust spreads (1.4826 MAD of the GPU-steps' residuals) above which a GPU-step is slow.
SLOW_SPREADS = 6.0
#: ... and at least this log-slowdown: below it a slowdown does not matter to a forecast.
MIN_SLOWDOWN = 0.01
#: Consecutive slow pairs this unlikely under independent GPU-steps count as persistence.
P_VALUE_MAX = 1e-3


@dataclass
class PersistentSlowdowns:
    """Slow GPU-steps of a fit and how they follow each other.

    Attributes
    ----------
    kernel_class
        The class whose launches measure a GPU-step's pace.
    gpu_steps, slow_gpu_steps
        GPU-steps checked and those flagged slow.
    consecutive_pairs, expected_pairs
        Pairs of consecutive steps of one GPU (same run) both slow, and their expected number
        were slow GPU-steps independent.
    p_value
        P(at least ``consecutive_pairs``) under independence (Poisson).
    runs
        One row per maximal stretch of slow consecutive steps: ``gpu``, ``first_step``,
        ``last_step``, ``steps``, ``slowdown`` (median, as a fraction).
    """

    kernel_class: str
    gpu_steps: int
    slow_gpu_steps: int
    consecutive_pairs: int
    expected_pairs: float
    p_value: float
    runs: pd.DataFrame
    #: posterior median of the fitted lag-one correlation of episodes, or None (not fitted)
    fitted_persistence: float | None = None

    @property
    def persistent(self) -> bool:
        """True when slow GPU-steps follow each other far more than chance allows."""
        return self.consecutive_pairs >= 2 and self.p_value < P_VALUE_MAX

    def to_dict(self) -> dict:
        """JSON-ready summary (the stretches as a list of records)."""
        return {"kernel_class": self.kernel_class, "gpu_steps": self.gpu_steps,
                "slow_gpu_steps": self.slow_gpu_steps,
                "consecutive_pairs": self.consecutive_pairs,
                "expected_pairs": self.expected_pairs, "p_value": self.p_value,
                "persistent": self.persistent, "runs": self.runs.to_dict("records"),
                "fitted_persistence": self.fitted_persistence}

    def message(self) -> str:
        """One line: what was found and what it means for forecasts."""
        if self.runs.empty:
            return f"no slow GPU-steps among {self.gpu_steps} ({self.kernel_class} launches)"
        longest = self.runs.sort_values(["steps", "slowdown"], ascending=False).iloc[0]
        return (
            f"GPU slowdowns last over consecutive steps: {self.slow_gpu_steps} of "
            f"{self.gpu_steps} GPU-steps slow ({self.kernel_class} launches), in "
            f"{len(self.runs)} stretches (e.g. GPU {longest['gpu']}, steps "
            f"{longest['first_step']} to {longest['last_step']}, "
            f"+{100 * longest['slowdown']:.1f} %); {self.consecutive_pairs} slow pairs of "
            f"consecutive steps where independent GPU-steps would give "
            f"{self.expected_pairs:.2g} (p = {self.p_value:.1g}). " + self._what_the_fit_does()
            + " A longer trace, or per-GPU benchmark sessions fitted with it, tells a run-long "
            "episode from a slow GPU"
        )

    def _what_the_fit_does(self) -> str:
        if self.fitted_persistence is None:
            return ("The model draws GPU×step episodes independently per step and takes a GPU "
                    "slow over the whole trace for its own speed: forecast steps of one run "
                    "are less correlated, and clusters of new nodes more spread, than such "
                    "episodes make them (the model spec \"lasting\", e.g. bayesprism fit "
                    "--spec lasting, fits how long episodes last).")
        lam = self.fitted_persistence
        return (f"The model fits episodes that last (persistence {lam:.2f}: about "
                f"{1.0 / (1.0 - lam):.1f} steps), but may still take a GPU slow over the whole "
                "trace for its own speed, and forecasts draw each step's episodes at their "
                "share: forecast steps of one run are less correlated than such episodes make "
                "them.")


def slow_stretches(
    deviation: np.ndarray, gpu: np.ndarray, step: np.ndarray,
    gpu_labels: np.ndarray, step_labels: np.ndarray, kernel_class: str = "all",
) -> PersistentSlowdowns | None:
    """Flag slow GPU-steps and count those on consecutive steps of one GPU.

    Parameters
    ----------
    deviation
        Log pace of each GPU-step (NaN: no launches), any common offset.
    gpu, step
        Positions of each GPU-step in ``gpu_labels`` and ``step_labels``.
    gpu_labels, step_labels
        Unit labels; a step label ``run/number`` is consecutive to ``run/number+1``.
    kernel_class
        Reported as the class the paces come from.

    Returns
    -------
    PersistentSlowdowns or None
        None when fewer than 2 steps per GPU leave nothing to compare.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> gpu, step = np.divmod(np.arange(16 * 12), 12)
    >>> dev = rng.normal(0.0, 0.002, gpu.size)
    >>> dev[(gpu == 3) & (step >= 9)] += 0.12  # GPU 3 slow from step 9 to the end
    >>> found = slow_stretches(dev, gpu, step, np.array([f"n/{g}" for g in range(16)]),
    ...                        np.array([f"run/{s}" for s in range(100, 112)]))
    >>> found.slow_gpu_steps, found.consecutive_pairs, found.persistent
    (3, 2, True)
    >>> found.runs[["gpu", "first_step", "last_step", "steps"]].values.tolist()
    [['n/3', 'run/109', 'run/111', 3]]
    """
    ok = np.isfinite(deviation)
    deviation, gpu, step = deviation[ok], gpu[ok], step[ok]
    if deviation.size == 0 or np.bincount(gpu).max() < 2:
        return None
    residual = deviation - _group_median(deviation, gpu)
    residual = residual - _group_median(residual, step)
    spread = 1.4826 * float(np.median(np.abs(residual)))
    slow = residual > max(SLOW_SPREADS * spread, MIN_SLOWDOWN)

    run, number = (codes[step] for codes in _run_and_number(step_labels))
    order = np.lexsort((number, run, gpu))
    g, r, k, s = gpu[order], run[order], number[order], slow[order]
    follows = (g[1:] == g[:-1]) & (r[1:] == r[:-1]) & (k[1:] == k[:-1] + 1)
    joined = follows & s[1:] & s[:-1]  # consecutive steps of one GPU, both slow
    pairs = int(np.count_nonzero(joined))
    share = float(slow.mean())
    expected = float(np.count_nonzero(follows)) * share**2
    p_value = float(stats.poisson.sf(pairs - 1, expected)) if expected > 0 else \
        float(pairs == 0)

    # a stretch starts at a slow GPU-step that does not follow a slow one, ends at one that
    # no slow one follows
    first = s & ~np.concatenate([[False], joined])
    last = s & ~np.concatenate([joined, [False]])
    stretches = zip(np.flatnonzero(first), np.flatnonzero(last), strict=True)
    res = residual[order]
    steps_sorted = step[order]
    runs = pd.DataFrame(
        [{"gpu": str(gpu_labels[g[a]]), "first_step": str(step_labels[steps_sorted[a]]),
          "last_step": str(step_labels[steps_sorted[b]]), "steps": int(b - a + 1),
          "slowdown": float(np.expm1(np.median(res[a:b + 1])))} for a, b in stretches],
        columns=["gpu", "first_step", "last_step", "steps", "slowdown"])
    return PersistentSlowdowns(kernel_class, int(slow.size), int(slow.sum()), pairs, expected,
                               p_value, runs)


def episode_persistence(posterior: xr.DataTree) -> tuple[PersistentSlowdowns | None, list[str]]:
    """:func:`slow_stretches` on a kernel fit's cells, measured on one compute class.

    The class is the compute class the GPU level moves most (largest posterior median
    ``gpu_scale``; without a GPU level, the one with most launches).

    Returns
    -------
    (PersistentSlowdowns or None, notes)
        None with a note saying why when the fit has no GPU-step cells.

    Examples
    --------
    >>> import bayesprism as bp
    >>> found, notes = episode_persistence(bp.load("posterior.nc"))  # doctest: +SKIP
    >>> found.persistent  # doctest: +SKIP
    True
    """
    needed = ("cell_kernel", "cell_gpustep", "cell_n", "cell_mean_log", "gpu_of_gpustep",
              "step_of_gpustep")
    if "constant_data" not in posterior.children or any(
            name not in posterior["constant_data"].data_vars for name in needed):
        return None, ["persistence of GPU slowdowns not checked: the fit has no GPU-step cells"]
    data = posterior["constant_data"].to_dataset()
    post = posterior["posterior"]
    if "gpu_unit" not in post.coords or "step_unit" not in post.coords:
        return None, ["persistence of GPU slowdowns not checked: the fit has no GPU and "
                      "step units"]
    kernel = data["cell_kernel"].to_numpy().astype(int)
    gpustep = data["cell_gpustep"].to_numpy().astype(int)
    n = data["cell_n"].to_numpy().astype(float)
    mean = data["cell_mean_log"].to_numpy().astype(float)
    # cell_kernel counts positions on the model's kernel coordinate
    kernels = post.coords["kernel"] if "kernel" in post.coords else data.coords.get("kernel")
    classes = np.full(kernel.size, "all") if kernels is None else \
        kernel_classes(posterior, kernels.to_numpy())[kernel]
    compute = ~np.isin(classes, list(COLLECTIVE_CLASSES))
    if not compute.any():
        return None, ["persistence of GPU slowdowns not checked: no compute launches"]
    chosen = _measuring_class(post, classes[compute], n[compute])
    pick = classes == chosen
    n_kernels = int(kernel.max()) + 1
    kernel_n = np.bincount(kernel[pick], weights=n[pick], minlength=n_kernels)
    kernel_mean = np.bincount(kernel[pick], weights=n[pick] * mean[pick],
                              minlength=n_kernels) / np.maximum(kernel_n, 1.0)
    n_gs = data.sizes["gpustep"]
    weight = np.bincount(gpustep[pick], weights=n[pick], minlength=n_gs)
    total = np.bincount(gpustep[pick], weights=n[pick] * (mean[pick] - kernel_mean[kernel[pick]]),
                        minlength=n_gs)
    with np.errstate(invalid="ignore", divide="ignore"):
        deviation = np.where(weight > 0, total / weight, np.nan)
    found = slow_stretches(
        deviation, data["gpu_of_gpustep"].to_numpy().astype(int),
        data["step_of_gpustep"].to_numpy().astype(int),
        post.coords["gpu_unit"].to_numpy().astype(str),
        post.coords["step_unit"].to_numpy().astype(str), chosen)
    if found is None:
        return None, ["persistence of GPU slowdowns not checked: fewer than 2 steps per GPU"]
    if "gpustep_episode_persistence" in post.data_vars:
        found.fitted_persistence = float(post["gpustep_episode_persistence"].median())
    return found, []


def _measuring_class(post: xr.DataTree, classes: np.ndarray, n: np.ndarray) -> str:
    if "gpu_scale" in post.data_vars:
        scale = post["gpu_scale"].median(("chain", "draw"))
        present = [c for c in np.unique(classes) if c in scale.coords["kernel_class"]]
        if present:
            return str(max(present, key=lambda c: float(scale.sel(kernel_class=c))))
    labels, codes = np.unique(classes, return_inverse=True)
    return str(labels[np.argmax(np.bincount(codes, weights=n))])


def _group_median(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    frame = pd.Series(values).groupby(group).transform("median")
    return frame.to_numpy()


def _run_and_number(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run code and step number of ``run/number`` labels (a label without a number is its own
    run, so it follows nothing)."""
    run, number = [], []
    for i, label in enumerate(labels.astype(str)):
        head, _, tail = label.rpartition("/")
        if head and tail.lstrip("-").isdigit():
            run.append(head)
            number.append(int(tail))
        else:
            run.append(f"\0{i}")
            number.append(0)
    return pd.factorize(np.array(run))[0], np.array(number)
