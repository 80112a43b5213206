"""Layout facts a user states because the traces do not record them (``layout=``, ``--layout``).

NVIDIA's GPT-3 MLPerf logs, for instance, never say that the model ran with 12 virtual pipeline
stages: ``read_traces(..., layout={"virtual_stages": 12})`` or ``--layout virtual_stages=12``
states it. The same facts apply to every run read, whatever its format, and to the runs of
Parquet trace tables written before (:func:`table_with_layout`).

* :func:`check_layout`: keys and values checked; each value by
  :func:`bayesprism.plan.field_problems`, the same check a :class:`~bayesprism.plan.ParallelPlan`
  makes, so a fact accepted here is a valid plan field.
* :func:`parse_layout_args`: ``["virtual_stages=12", ...]`` from the command line → checked facts.
* :func:`apply_layout`: one run's metadata with the facts set (provenance :data:`USER` in
  ``layout_sources``); :func:`report_with_layout` and :func:`table_with_layout` do it for every
  run of a reader's report or of a trace table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from bayesprism.errors import InputError, Problem
from bayesprism.plan import field_problems

if TYPE_CHECKING:
    import pandas as pd

#: Layout facts a user may state: parallel sizes and the pipeline schedule go in a run's
#: ``plan``, ``gpus_per_node`` in the run's metadata. Every key is a ParallelPlan field.
LAYOUT_INT_KEYS: tuple[str, ...] = ("dp", "tp", "pp", "cp", "ep", "microbatches",
                                    "virtual_stages", "micro_batch_size", "gpus_per_node",
                                    "nodes_per_leaf")
LAYOUT_KEYS: tuple[str, ...] = (*LAYOUT_INT_KEYS, "schedule", "sharding", "overlap")
#: provenance label of layout facts stated by the user
USER = "user"
#: layout keys whose change re-derives dp from the world size (dp = world / (tp·pp·cp))
MODEL_PARALLEL_KEYS: tuple[str, ...] = ("tp", "pp", "cp")


def _number(value: object) -> object:
    """A numeric value as int when integral, else float; non-numbers are returned unchanged.

    The command line gives strings ("12") and TOML/JSON may give 12.0: both mean 12. Booleans
    stay booleans so that the plan check refuses them.
    """
    if isinstance(value, bool):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    if not math.isfinite(number):
        return value  # "inf"/"nan" stay as given, for the plan check to refuse and show
    return int(number) if number.is_integer() else number


def check_layout(layout: Mapping | None, source: str = "layout") -> dict:
    """Validated layout facts stated by a user (``read_traces(..., layout=...)``).

    Parameters
    ----------
    layout
        Mapping of :data:`LAYOUT_KEYS` to values, e.g. ``{"virtual_stages": 12}``; numbers
        may be given as strings (as the CLI passes them). ``None`` gives ``{}``.
    source
        Where the layout came from, named in error messages (e.g. ``"--layout"``).

    Returns
    -------
    dict
        The converted values (int when integral, float otherwise, str for names).

    Raises
    ------
    InputError
        One line per unknown key or bad value (naming key and value), all at once.
    """
    if layout is None:
        return {}
    if not isinstance(layout, Mapping):
        raise InputError(Problem(source, "layout", "must be a mapping of layout keys to values",
                                 example=layout))
    unknown = [Problem(source, str(key), "unknown layout key; allowed: " + ", ".join(LAYOUT_KEYS))
               for key in layout if key not in LAYOUT_KEYS]
    checked = {key: (str(value) if key in ("schedule", "sharding") else _number(value))
               for key, value in layout.items() if key in LAYOUT_KEYS}
    problems = unknown + field_problems(checked, source)
    if problems:
        raise InputError(problems)
    return checked


def parse_layout_args(items: Iterable[str] | None, source: str = "--layout") -> dict:
    """``["virtual_stages=12", "schedule=interleaved-1f1b"]`` → checked layout facts.

    Parameters
    ----------
    items
        ``KEY=VALUE`` strings as given on the command line (``None``: no facts).
    source
        Named in error messages.

    Returns
    -------
    dict
        As :func:`check_layout`.

    Raises
    ------
    InputError
        An item without ``=``, a key given twice, an unknown key or a bad value.
    """
    raw: dict[str, str] = {}
    problems: list[Problem] = []
    for item in items or []:
        key, sep, value = str(item).partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            problems.append(Problem(source, str(item), "expected KEY=VALUE, e.g. "
                                    "virtual_stages=12"))
        elif key in raw:
            problems.append(Problem(source, key, "is given twice", example=item))
        else:
            raw[key] = value
    try:
        checked = check_layout(raw, source)
    except InputError as exc:
        problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    return checked


def _rederive_dp(meta: dict, plan: dict, layout: Mapping, note: list[str] | None) -> None:
    """dp = world size / (tp·pp·cp) after a stated model-parallel size (unless dp is stated)."""
    changed = set(MODEL_PARALLEL_KEYS) & set(layout)
    world = meta.get("world_size")
    if not changed or "dp" in layout or not world:
        return
    model_parallel = 1
    for key in MODEL_PARALLEL_KEYS:
        model_parallel *= int(plan.get(key) or 1)
    if int(world) % model_parallel == 0:
        plan["dp"] = int(world) // model_parallel
    elif note is not None:
        note.append(f"{world} GPUs are not divisible by the stated "
                    f"{'·'.join(sorted(changed))} layout (tp·pp·cp = {model_parallel})")


def apply_layout(meta: Mapping, layout: Mapping, note: list[str] | None = None) -> dict:
    """A run's metadata with stated layout facts set (provenance ``"user"``).

    Plan keys go in ``meta["plan"]``, ``gpus_per_node`` in ``meta`` itself; each key is recorded
    in ``meta["layout_sources"]``. When tp, pp or cp change and dp was not stated, dp is
    re-derived from the world size. More than one virtual stage without a stated schedule means
    ``"interleaved-1f1b"``. A stated value that differs from a recorded one wins and is
    described in ``note`` (when given).

    Parameters
    ----------
    meta
        One run's ``attrs["runs"][run]`` (not modified).
    layout
        Checked layout facts (:func:`check_layout`).
    note
        List that receives one text per overridden value.

    Returns
    -------
    dict
        A new metadata dict.
    """
    out = dict(meta)
    plan = dict(out.get("plan") or {})
    sources = dict(out.get("layout_sources") or {})
    for key, value in layout.items():
        target = out if key == "gpus_per_node" else plan
        old = target.get(key)
        if note is not None and old is not None and old != value:
            note.append(f"{key}: the run records {old}, the user states {value}; using {value}")
        target[key] = value
        sources[key] = USER
    _rederive_dp(out, plan, layout, note)
    if layout.get("virtual_stages", 1) > 1 and "schedule" not in layout:
        plan["schedule"] = "interleaved-1f1b"
    out["plan"] = plan
    out["layout_sources"] = sources
    return out


def _runs_with_layout(runs: Mapping, layout: Mapping, notes: list[str]) -> dict:
    return {run: apply_layout(meta or {}, layout, notes) for run, meta in runs.items()}


def report_with_layout(report: Mapping, layout: Mapping, source: str) -> dict:
    """A reader's report with the layout facts applied to each run it describes.

    A tidy table's reader reports several runs (``report["runs"]``), the others one
    (``report["run_meta"]``); each override note is prefixed with ``source`` (the file).
    """
    notes: list[str] = []
    out = dict(report)
    if out.get("runs"):
        out["runs"] = _runs_with_layout(out["runs"], layout, notes)
    else:
        out["run_meta"] = apply_layout(out.get("run_meta") or {}, layout, notes)
    out["notes"] = [*(out.get("notes") or []), *(f"{source}: {n}" for n in notes)]
    return out


def table_with_layout(table: pd.DataFrame, layout: Mapping) -> pd.DataFrame:
    """``table`` with the layout facts applied to every run of ``attrs["runs"]`` (in place).

    For trace tables read back whole (e.g. a Parquet table written by ``bayesprism ingest``):
    the rows do not change, only the run metadata and the notes.
    """
    if not layout:
        return table
    notes: list[str] = []
    table.attrs["runs"] = _runs_with_layout(table.attrs.get("runs") or {}, layout, notes)
    table.attrs["notes"] = [*table.attrs.get("notes", []), *dict.fromkeys(notes)]
    return table


__all__ = ["LAYOUT_KEYS", "USER", "apply_layout", "check_layout", "parse_layout_args",
           "report_with_layout", "table_with_layout"]
