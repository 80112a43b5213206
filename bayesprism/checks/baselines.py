"""Baselines scored next to bayesprism on the same held-out data (``bayesprism.checks.validate``).

``pooled``
    The approach of PRISM (arXiv 2510.15596): each kernel's duration is a lognormal fitted by
    maximum likelihood, parameters plugged in, no hierarchy and no parameter uncertainty, and
    the variability is sampled by Monte Carlo through the same composition. It is written as a
    *degenerate posterior* following docs/artifacts.md (one chain, one draw, the point
    estimates as that draw, no node/GPU/step levels, all spread in ``resid_scale``), so the code
    that composes a bayesprism posterior runs on it unchanged.
``deterministic``
    Mean kernel times through the same composition: ``kernel_log_median = log(mean duration)``
    and every scale 0.

The contract's residual scale is per kernel *class*, so ``pooled`` uses the maximum-likelihood
lognormal of each kernel with one log-sd per class (the pooled within-kernel sd of the class).

For step-time logs (``model_kind == "step"``) the baselines work per micro-batch slot and unit
of work: a step of a run with m micro-batches and pp pipeline stages (v virtual stages) has
``slots = m + (pp − 1)/v`` slots (plain 1F1B), each slot does ``work = micro_batch_size /
(tp·pp·cp)`` sequences per GPU (the logged layout, as in the step model), the time
``step_time / (slots · work)`` of the fitted runs' steps is fitted by a lognormal (``pooled``) or
averaged (``deterministic``), and rescaled by the slots and work of the target plan. These draws
are computed directly (:func:`step_baseline_draws`), without a posterior object.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import xarray as xr

from bayesprism._version import __version__
from bayesprism.costs.collectives import launch_work_us
from bayesprism.errors import InputError, Problem
from bayesprism.inventory import kernel_inventory, run_layout
from bayesprism.io import ARTIFACT_SCHEMA_VERSION

BASELINES: tuple[str, ...] = ("pooled", "deterministic")
#: Timed steps dropped at the start of every run (warm-up), as the step model does.
WARMUP_STEPS = 1


def _check_method(method: str) -> None:
    if method not in BASELINES:
        raise InputError(
            Problem(
                "validate",
                "method",
                f"unknown baseline; choose from {', '.join(BASELINES)}",
                example=method,
            )
        )


def _table_digest(table: pd.DataFrame) -> str:
    hashed = pd.util.hash_pandas_object(
        table[["run", "step", "rank", "kernel", "duration_us"]], index=False
    )
    return hashlib.sha256(hashed.to_numpy().tobytes()).hexdigest()[:16]


def kernel_point_estimates(table: pd.DataFrame, method: str) -> tuple[pd.DataFrame, pd.Series]:
    """Per-kernel log median and per-class log-sd of a baseline, fitted to ``table``.

    Returns
    -------
    (kernels, resid_scale)
        ``kernels``: one row per kernel with ``kernel_class``, ``log_median``, ``launches``,
        ``mean_log``, ``ss_log``; ``resid_scale`` indexed by kernel class.
    """
    _check_method(method)
    rows = table.loc[table["kernel_class"] != "step"]
    if rows.empty:
        raise InputError(
            Problem(
                "validate",
                "kernel_class",
                "kernel baselines need kernel rows; the table has only steps",
            )
        )
    # the same launch work as the kernel model: the composition adds waiting for peers
    work_us, _ = launch_work_us(rows)
    frame = pd.DataFrame(
        {
            "kernel": rows["kernel"].astype(str).to_numpy(),
            "kernel_class": rows["kernel_class"].astype(str).to_numpy(),
            "log_d": np.log(work_us),
            "d": work_us,
        }
    )
    grouped = frame.groupby("kernel", sort=True)
    kernels = pd.DataFrame(
        {
            "kernel_class": grouped["kernel_class"].first(),
            "launches": grouped["log_d"].size(),
            "mean_log": grouped["log_d"].mean(),
            "mean": grouped["d"].mean(),
        }
    )
    frame["dev2"] = (frame["log_d"] - frame["kernel"].map(kernels["mean_log"])) ** 2
    kernels["ss_log"] = frame.groupby("kernel", sort=True)["dev2"].sum()
    # Maximum likelihood: the sd divides by n (not n − 1), pooled over the kernels of a class.
    by_class = frame.groupby("kernel_class", sort=True)["dev2"].mean()
    if method == "pooled":
        kernels["log_median"] = kernels["mean_log"]
        resid = np.sqrt(by_class)
    else:
        kernels["log_median"] = np.log(kernels["mean"])
        resid = by_class * 0.0
    return kernels, resid


def degenerate_posterior(
    table: pd.DataFrame, method: str, *, reference: xr.DataTree | None = None
) -> xr.DataTree:
    """A baseline as a kernel-level posterior with one draw (docs/artifacts.md).

    Parameters
    ----------
    table
        The fitted trace table (kernel rows; step rows are ignored).
    method
        ``"pooled"`` or ``"deterministic"``.
    reference
        A bayesprism posterior fitted on the same table; its ``inventory`` group (the traced
        run's kernels, launches and plan) is copied, so compositions of the baseline and of the
        model describe the same step. Without it the inventory is built with
        ``bayesprism.inventory.kernel_inventory``.

    Returns
    -------
    xarray.DataTree
        Root attrs ``model_kind="kernel"``, ``sampler=method``, ``draws=chains=1``; group
        ``posterior`` with ``kernel_log_median`` (chain, draw, kernel) and ``resid_scale``
        (chain, draw, kernel_class) only: node, GPU, step and collective levels are absent.
    """
    kernels, resid = kernel_point_estimates(table, method)
    kernel_names = kernels.index.to_numpy(dtype=str)
    classes = resid.index.to_numpy(dtype=str)
    posterior = xr.Dataset(
        {
            "kernel_log_median": (
                ("chain", "draw", "kernel"),
                kernels["log_median"].to_numpy()[None, None, :],
            ),
            "resid_scale": (("chain", "draw", "kernel_class"), resid.to_numpy()[None, None, :]),
        },
        coords={"chain": [0], "draw": [0], "kernel": kernel_names, "kernel_class": classes},
        attrs={"collective_model": [], "baseline": method},
    )
    sample_stats = xr.Dataset(
        {"diverging": (("chain", "draw"), np.zeros((1, 1), dtype=bool))},
        coords={"chain": [0], "draw": [0]},
    )
    observed = xr.Dataset(
        {
            "kernel_mean_log": ("kernel", kernels["mean_log"].to_numpy()),
            "kernel_ss_log": ("kernel", kernels["ss_log"].to_numpy()),
        },
        coords={"kernel": kernel_names},
    )
    constant = xr.Dataset(
        {
            "kernel_launches": ("kernel", kernels["launches"].to_numpy()),
            "kernel_class": ("kernel", kernels["kernel_class"].to_numpy(dtype=str)),
        },
        coords={"kernel": kernel_names},
    )
    spec = {"name": method, "kind": "kernel", "levels": [], "baseline": True}
    spec_json = json.dumps(spec, sort_keys=True)
    attrs = {
        "bayesprism_version": __version__,
        "schema_version": ARTIFACT_SCHEMA_VERSION,
        "model_kind": "kernel",
        "spec": spec_json,
        "spec_hash": hashlib.sha256(spec_json.encode()).hexdigest()[:16],
        "input_digest": _table_digest(table),
        "sampler": method,
        "seconds": 0.0,
        "draws": 1,
        "tune": 0,
        "chains": 1,
        "random_seed": 0,
    }
    children = {
        "posterior": xr.DataTree(posterior),
        "sample_stats": xr.DataTree(sample_stats),
        "observed_data": xr.DataTree(observed),
        "constant_data": xr.DataTree(constant),
    }
    inventory = _inventory(table, reference)
    if inventory is not None:
        children["inventory"] = xr.DataTree(inventory)
    tree = xr.DataTree(children=children)
    tree.attrs = attrs
    return tree


def _inventory(table: pd.DataFrame, reference: xr.DataTree | None) -> xr.Dataset | None:
    if reference is not None and "inventory" in reference.children:
        return reference["inventory"].to_dataset()
    return kernel_inventory(table)


def step_slots(layout: dict) -> float:
    """Micro-batch slots of one step under plain 1F1B: ``m + (pp − 1)/v``."""
    return float(layout["microbatches"]) + (float(layout.get("pp") or 1) - 1.0) / float(
        layout.get("virtual_stages") or 1
    )


def slot_work(layout: dict) -> float:
    """Sequences per GPU in one micro-batch slot: ``micro_batch_size / (tp · pp · cp)``."""
    parallel = (
        float(layout.get("tp") or 1) * float(layout.get("pp") or 1) * float(layout.get("cp") or 1)
    )
    return float(layout.get("micro_batch_size") or 1.0) / parallel


def run_layouts(table: pd.DataFrame) -> dict[str, dict]:
    """The logged layout of every run of a step table (``bayesprism.model.step.run_layout``)."""
    runs_meta = table.attrs.get("runs", {})
    layouts: dict[str, dict] = {}
    problems: list = []
    for run in sorted(table["run"].astype(str).unique()):
        layout, found = run_layout(run, runs_meta.get(run, {}), source="validate")
        layouts[run] = layout
        problems.extend(found)
    if problems:
        raise InputError(problems)
    return layouts


def timed_steps(table: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Step rows without each run's first :data:`WARMUP_STEPS` timed steps, and how many went."""
    rows = table.loc[table["kernel_class"] == "step", ["run", "step", "duration_us"]].copy()
    rows["run"] = rows["run"].astype(str)
    rank = rows.groupby("run")["step"].rank(method="first")
    kept = rows.loc[rank > WARMUP_STEPS]
    return kept, len(rows) - len(kept)


def step_baseline_draws(
    fit_table: pd.DataFrame,
    target_layout: dict,
    method: str,
    n: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Step-time draws (s) of a baseline at a target layout, from the fitted runs' steps.

    The unit time of each fitted step is ``step_time / (slots · work)`` (:func:`step_slots`,
    :func:`slot_work` of its run); ``pooled`` draws ``slots_t · work_t · LogNormal(µ̂, σ̂)``
    with the maximum-likelihood µ̂, σ̂ of the log unit times, ``deterministic`` returns
    ``slots_t · work_t`` times their mean (n copies), t the target layout.
    """
    _check_method(method)
    steps, _ = timed_steps(fit_table)
    if steps.empty:
        raise InputError(Problem("validate", "kernel_class", "the fit table has no timed steps"))
    layouts = run_layouts(fit_table)
    size = steps["run"].map({run: step_slots(lay) * slot_work(lay) for run, lay in layouts.items()})
    slot_s = steps["duration_us"].to_numpy(dtype=float) / 1e6 / size.to_numpy(dtype=float)
    target = step_slots(target_layout) * slot_work(target_layout)
    if method == "deterministic":
        return np.full(n, target * slot_s.mean())
    log_slot = np.log(slot_s)
    return target * np.exp(rng.normal(log_slot.mean(), log_slot.std(), size=n))
