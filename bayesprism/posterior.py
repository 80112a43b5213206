"""Access to a fitted posterior (``docs/artifacts.md``): groups, draws, variable names and the
traced plan, in one place for every stage that reads a fit.

A *draw* is one joint sample of every parameter: the posterior's ``(chain, draw)`` dims, read
in chain-major order (:func:`flat_draws`). :func:`thin_draws` keeps evenly spaced draws as one
chain, deterministically, so a base forecast and its counterfactuals see the same draws.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from bayesprism.errors import InputError, Problem
from bayesprism.plan import ParallelPlan

SAMPLE_DIMS: tuple[str, str] = ("chain", "draw")

#: Level name used in results -> the posterior variable holding its per-class loading.
LEVEL_SCALES: dict[str, str] = {
    "node": "node_scale",
    "gpu": "gpu_scale",
    "step": "step_scale",
    "gpustep": "gpustep_scale",
    "residual": "resid_scale",
    "cabinet": "cabinet_scale",
}

#: Step-level model: level name -> the posterior variable of its log-scale spread.
STEP_LEVEL_SCALES: dict[str, str] = {
    "config": "config_sd",
    "run": "run_sd",
    "rank": "rank_sigma",
    "slot": "slot_noise",
    "step": "step_noise",
}


def posterior_group(posterior: xr.DataTree) -> xr.Dataset:
    """The ``posterior`` group of a fit as a Dataset.

    Raises
    ------
    InputError
        When ``posterior`` is not a DataTree with a ``posterior`` group.

    Examples
    --------
    >>> ds = xr.Dataset({"mu": (("chain", "draw"), [[0.0, 1.0]])})
    >>> list(posterior_group(xr.DataTree.from_dict({"posterior": ds})).data_vars)
    ['mu']
    """
    if not isinstance(posterior, xr.DataTree) or "posterior" not in posterior.children:
        raise InputError(
            Problem("posterior", "posterior", "not a fitted posterior (no 'posterior' group)")
        )
    return posterior["posterior"].to_dataset()


def posterior_dataset(posterior: xr.DataTree | xr.Dataset) -> xr.Dataset:
    """The ``posterior`` group as a Dataset carrying the root's attrs too (a group's attrs win),
    from a DataTree holding it, a DataTree without groups, or that Dataset itself."""
    if isinstance(posterior, xr.Dataset):
        return posterior
    if isinstance(posterior, xr.DataTree):
        if "posterior" in posterior.children:
            ds = posterior["posterior"].to_dataset()
            return ds.assign_attrs({**dict(posterior.attrs), **dict(ds.attrs)})
        return posterior.to_dataset()
    raise TypeError(f"expected an xarray Dataset or DataTree, got {type(posterior).__name__}")


def with_posterior_group(posterior: xr.DataTree, group: xr.Dataset) -> xr.DataTree:
    """A copy of ``posterior`` whose ``posterior`` group is ``group`` (other groups shared)."""
    tree = posterior.copy()
    tree["posterior"] = group
    return tree


def flat_draws(da: xr.DataArray) -> np.ndarray:
    """``(chain, draw, ...) -> (chain*draw, ...)`` in chain-major order, as floats.

    Examples
    --------
    >>> da = xr.DataArray([[[1, 2], [3, 4]]], dims=("chain", "draw", "kernel"))
    >>> flat_draws(da).tolist()
    [[1.0, 2.0], [3.0, 4.0]]
    """
    rest = [d for d in da.dims if d not in SAMPLE_DIMS]
    values = da.transpose(*SAMPLE_DIMS, *rest).to_numpy()
    return np.asarray(values, dtype=float).reshape(-1, *[da.sizes[d] for d in rest])


def draw_count(ds: xr.Dataset | xr.DataArray) -> int:
    """Number of draws (chains times draws per chain)."""
    return int(ds.sizes["chain"] * ds.sizes["draw"])


def thin_draws(posterior: xr.DataTree, draws: int | None) -> xr.DataTree:
    """Keep ``draws`` evenly spaced posterior draws (chain-major order), as one chain.

    Deterministic (no randomness), so a base forecast and its counterfactuals see the same
    draws. Every group with the posterior's ``chain`` and ``draw`` sizes is thinned the same
    way; groups of other draws (a fit's warm-up) are left out, since their draws are not
    posterior draws.

    Parameters
    ----------
    posterior
        A fit.
    draws
        Draws to keep (at least 1); ``None`` or more than there are: all of them.

    Examples
    --------
    >>> ds = xr.Dataset({"mu": (("chain", "draw"), [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])})
    >>> thin = thin_draws(xr.DataTree.from_dict({"posterior": ds}), 3)
    >>> thin["posterior"]["mu"].values.tolist()
    [[0.0, 2.0, 5.0]]
    """
    group = posterior_group(posterior)
    total = draw_count(group)
    if draws is not None and draws < 1:
        raise InputError(Problem("arguments", "draws", "must be at least 1", example=draws))
    if draws is None or draws >= total:
        keep = np.arange(total)
    else:
        keep = np.unique(np.linspace(0, total - 1, draws).round().astype(int))
    tree = posterior.copy()
    for name, child in posterior.children.items():
        ds = child.to_dataset()
        if "chain" not in ds.dims or "draw" not in ds.dims:
            continue
        if (ds.sizes["chain"], ds.sizes["draw"]) != (group.sizes["chain"], group.sizes["draw"]):
            tree = tree.drop_nodes(name)
            continue
        flat = ds.stack(sample=SAMPLE_DIMS).isel(sample=keep)
        flat = flat.drop_vars(["sample", "chain", "draw"]).rename({"sample": "draw"})
        flat = flat.expand_dims(chain=[0]).assign_coords(draw=np.arange(keep.size))
        tree[name] = flat.transpose("chain", "draw", ...).assign_attrs(ds.attrs)
    return tree


def recorded_traced_plan(inventory: xr.Dataset | xr.DataTree | None) -> dict:
    """The traced plan an inventory records (``attrs["traced_plan"]``, JSON), ``{}`` if none.

    Parameters
    ----------
    inventory
        A posterior's ``inventory`` group (Dataset or DataTree node), or None.

    Returns
    -------
    dict
        The decoded plan (null degrees stay None); ``bayesprism.io.load`` has checked that it
        parses to an object.

    Examples
    --------
    >>> recorded_traced_plan(xr.Dataset(attrs={"traced_plan": '{"dp": 2, "tp": null}'}))
    {'dp': 2, 'tp': None}
    """
    raw = inventory.attrs.get("traced_plan") if inventory is not None else None
    if not raw:
        return {}
    return json.loads(raw) if isinstance(raw, str) else dict(raw)


def traced_plan_values(posterior: xr.DataTree) -> dict:
    """The traced plan's ``ParallelPlan`` fields a fit records; an unknown degree (recorded as
    null) is left out, so the plan's default (1) stands in for it."""
    inventory = posterior["inventory"] if "inventory" in posterior.children else None
    known = set(ParallelPlan.__dataclass_fields__) - {"source"}
    return {k: v for k, v in recorded_traced_plan(inventory).items()
            if k in known and v is not None}


def traced_plan(posterior: xr.DataTree) -> ParallelPlan:
    """The traced run's ``ParallelPlan``, from ``inventory.attrs["traced_plan"]``.

    Examples
    --------
    >>> inv = xr.Dataset(attrs={"traced_plan": '{"dp": 2, "tp": 4, "cp": null}'})
    >>> plan = traced_plan(xr.DataTree.from_dict({"inventory": inv}))
    >>> (plan.dp, plan.tp, plan.cp)
    (2, 4, 1)
    """
    return ParallelPlan.from_dict(traced_plan_values(posterior), source="inventory.traced_plan")
