"""Held-out splits of a trace table, and joining tables (DESIGN §2.8; used by
:mod:`bayesprism.checks.validate`, which re-exports :func:`split_table` and :func:`concat_tables`).

``nodes`` / ``gpus`` / ``ranks``
    Fit some nodes (GPUs ``"<node>/<gpu>"``, global ranks) and predict the held-out ones as
    *new* units drawn from the fitted population.
``steps``
    Fit the first part of every run, predict its remaining steps.
``scale``
    Fit the runs at the smaller world sizes, forecast the runs at the larger ones.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from bayesprism.errors import InputError, Problem

SPLITS: tuple[str, ...] = ("nodes", "gpus", "ranks", "steps", "scale")


def _unit_labels(table: pd.DataFrame, by: str) -> pd.Series:
    """The held-out unit of every row under split ``by``."""
    if by in ("nodes", "gpus", "ranks"):
        whole_job = (table["kernel_class"] == "step").to_numpy()
        if whole_job.any():
            raise InputError(
                Problem(
                    "split",
                    "kernel_class",
                    f"a split by {by} needs per-rank rows, but the table "
                    "has step rows that time the whole job (use --split steps or scale)",
                    count=int(whole_job.sum()),
                    example="step",
                )
            )
        if by == "nodes":
            return table["node"].astype(str)
        if by == "gpus":
            return table["node"].astype(str) + "/" + table["gpu"].astype(str)
        return table["rank"].astype("int64")
    if by == "scale":
        runs = table.attrs.get("runs", {})
        sizes, missing = {}, []
        for run in table["run"].astype(str).unique():
            meta = runs.get(run, {})
            size = meta.get("world_size", meta.get("gpus"))
            if size is None:
                missing.append(run)
            else:
                sizes[run] = int(size)
        if missing:
            raise InputError(
                Problem(
                    "split",
                    "attrs.runs[...].world_size",
                    "is needed to split by scale",
                    len(missing),
                    missing[0],
                )
            )
        return table["run"].astype(str).map(sizes).astype("int64")
    return table["step"].astype("int64")


def _choose(units: list, fraction: float, largest: bool, rng: np.random.Generator) -> list:
    n_out = min(len(units) - 1, max(1, round(fraction * len(units))))
    if largest:
        return sorted(units)[len(units) - n_out :]
    order = rng.permutation(len(units))
    return sorted(units[i] for i in order[:n_out])


def split_table(
    table: pd.DataFrame,
    by: str,
    *,
    fraction: float | None = None,
    holdout: Sequence | None = None,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split a trace table into a fit part and a held-out part; no held-out unit is fitted.

    Parameters
    ----------
    table
        A validated trace table.
    by
        ``"nodes"``, ``"gpus"`` (labels ``"<node>/<gpu>"``), ``"ranks"``, ``"steps"`` or
        ``"scale"`` (world sizes, from ``attrs["runs"][run]["world_size"]``).
    fraction
        Share of units held out (default 0.5; at least one unit on each side). ``nodes``,
        ``gpus``, ``ranks``: a random choice (``seed``). ``steps``: the last ``fraction`` of
        every run's steps. ``scale``: the largest ``fraction`` of the world sizes.
    holdout
        Explicit units to hold out instead of ``fraction`` (node names, ``"node/gpu"`` labels,
        ranks, step numbers or world sizes).
    seed
        Seed of the random choice.

    Returns
    -------
    (fit_table, heldout_table)
        Row subsets with unused categories removed and ``attrs`` restricted to each side's runs;
        ``attrs["split"]`` records ``by``, the side and the held-out units, and a line is added
        to ``attrs["notes"]``.

    Raises
    ------
    InputError
        Unknown ``by``, units in ``holdout`` that are not in the table, a split that leaves
        one side empty, or a table that cannot be split that way.
    """
    if by not in SPLITS:
        raise InputError(Problem("split", "by", f"choose one of {', '.join(SPLITS)}", example=by))
    if fraction is not None and holdout is not None:
        raise InputError(Problem("split", "holdout", "give either fraction or holdout, not both"))
    fraction = 0.5 if fraction is None else float(fraction)
    if not 0.0 < fraction < 1.0:
        raise InputError(
            Problem("split", "fraction", "must lie strictly between 0 and 1", example=fraction)
        )
    labels = _unit_labels(table, by)
    if by == "steps" and holdout is None:
        held_mask = np.zeros(len(table), dtype=bool)
        for _, index in table.groupby(table["run"].astype(str), sort=True).groups.items():
            steps = sorted(table.loc[index, "step"].unique())
            if len(steps) < 2:
                continue
            late = set(_choose(steps, fraction, largest=True, rng=np.random.default_rng(seed)))
            held_mask[table.index.get_indexer(index)] |= table.loc[index, "step"].isin(late)
        held_units = sorted(int(s) for s in np.unique(labels.to_numpy()[held_mask]))
        if not held_mask.any():
            runs = table["run"].astype(str)
            raise InputError(
                Problem("split", "steps", f"each of the {runs.nunique()} run(s) has a single "
                        "step: there is no later part to hold out (split by nodes, gpus or "
                        "ranks instead)", example=runs.iloc[0])
            )
    else:
        units = sorted(pd.unique(labels).tolist())
        if holdout is not None:
            kind = type(units[0]) if units else str
            wanted = [kind(u) for u in holdout]
            unknown = [u for u in wanted if u not in set(units)]
            if unknown:
                raise InputError(
                    Problem(
                        "split", "holdout", f"not in the table (by {by})", len(unknown), unknown[0]
                    )
                )
            held_units = sorted(set(wanted))
        else:
            if len(units) < 2:
                raise InputError(
                    Problem(
                        "split",
                        by,
                        "need at least two units to split",
                        len(units),
                        units[0] if units else None,
                    )
                )
            held_units = _choose(units, fraction, by == "scale", np.random.default_rng(seed))
        held_mask = labels.isin(held_units).to_numpy()
    if held_mask.all() or not held_mask.any():
        raise InputError(
            Problem("split", "holdout", "the split leaves one side empty", example=held_units[:5])
        )
    parts = []
    for role, mask in (("fit", ~held_mask), ("heldout", held_mask)):
        part = table.loc[mask].copy()
        for col in part.columns:
            if isinstance(part[col].dtype, pd.CategoricalDtype) and col != "kernel_class":
                part[col] = part[col].cat.remove_unused_categories()
        attrs = copy.deepcopy(dict(table.attrs))
        present = set(part["run"].astype(str).unique())
        attrs["runs"] = {r: m for r, m in attrs.get("runs", {}).items() if r in present}
        attrs["notes"] = [
            *attrs.get("notes", []),
            f"split by {by}: {len(held_units)} unit(s) held out, this is the {role} part",
        ]
        attrs["split"] = {"by": by, "role": role, "heldout": [_plain(u) for u in held_units]}
        part.attrs = attrs
        parts.append(part)
    return parts[0], parts[1]


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def concat_tables(tables: pd.DataFrame | Sequence[pd.DataFrame]) -> pd.DataFrame:
    """One trace table from several, run metadata merged, skip counts added, notes joined."""
    if isinstance(tables, pd.DataFrame):
        return tables
    tables = list(tables)
    if len(tables) == 1:
        return tables[0]
    columns = list(dict.fromkeys(c for t in tables for c in t.columns))
    aligned = []
    for col in columns:
        series = [t[col] if col in t.columns else pd.Series(pd.NA, index=t.index) for t in tables]
        if all(isinstance(s.dtype, pd.CategoricalDtype) for s in series):
            aligned.append(pd.Series(union_categoricals(series, ignore_order=True), name=col))
        else:
            aligned.append(pd.concat(series, ignore_index=True).rename(col))
    out = pd.concat(aligned, axis=1)
    attrs = copy.deepcopy(dict(tables[0].attrs))
    for table in tables[1:]:
        attrs.setdefault("runs", {}).update(copy.deepcopy(table.attrs.get("runs", {})))
        for reason, count in table.attrs.get("skipped", {}).items():
            attrs.setdefault("skipped", {})[reason] = attrs["skipped"].get(reason, 0) + count
        attrs["notes"] = [*attrs.get("notes", []), *table.attrs.get("notes", [])]
    out.attrs = attrs
    return out
