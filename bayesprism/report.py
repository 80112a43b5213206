"""One self-contained HTML report of a fit and its forecasts.

The file embeds its figures as base64 PNG and its style inline; it loads nothing from the
network and needs no JavaScript, so it can be mailed or archived as is. Every text that comes
from data (kernel names, node names, commands, problems) is HTML-escaped. Numbers are formatted
the same way everywhere: durations with 3 significant digits in a readable unit (µs … days,
``report_sections.format_duration``), probabilities with 3 decimals. The first section is the
answer (per plan: step time, training time, P(slowdown), P(finish by the deadline) and one
figure); the data summary and the diagnostics it rests on follow.
"""

from __future__ import annotations

import datetime as _dt
import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from bayesprism.report_sections import (
    CSS,
    PLAN_FIELDS,
    esc,
    fmt_p,
    fmt_s,
    section_answer,
    section_data,
    section_diagnostics,
    section_forecast,
    section_placement,
    section_sensitivity,
    section_slowdown,
    section_variance,
)

__all__ = ["data_summary", "fmt_p", "fmt_s", "forecast_summary", "write_report"]

QUANTILE_KEYS = {"p05": 0.05, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p95": 0.95, "p99": 0.99}


# ------------------------------------------------------------------------------- values used
def data_summary(posterior: xr.DataTree) -> dict:
    """What the fit was fitted on, from its ``inventory`` group and root attrs.

    Returns
    -------
    dict
        ``runs``, ``ranks``, ``nodes``, ``gpus``, ``steps``, ``kernels``, ``kernel_classes``
        (list), ``platform``, ``traced_plan`` (dict), plus ``model_kind``, ``sampler``,
        ``draws``, ``chains``, ``bayesprism_version``, ``spec_hash``, ``input_digest``.
        Counts are None when the inventory does not record them.
    """
    attrs = dict(posterior.attrs)
    out: dict = {
        key: attrs.get(key)
        for key in (
            "model_kind",
            "sampler",
            "draws",
            "tune",
            "chains",
            "bayesprism_version",
            "spec_hash",
            "input_digest",
            "seconds",
        )
    }
    inv = posterior["inventory"] if "inventory" in posterior.children else None
    post = posterior["posterior"] if "posterior" in posterior.children else None

    def size(node, dim):
        return int(node.sizes[dim]) if node is not None and dim in node.sizes else None

    runs = inv.attrs.get("run") if inv is not None else None
    out["runs"] = (
        [
            str(r)
            for r in np.atleast_1d(
                json.loads(runs) if isinstance(runs, str) and runs.startswith("[") else runs
            )
        ]
        if runs is not None
        else []
    )
    out["ranks"] = size(inv, "rank")
    out["nodes"] = (
        len(np.unique(inv["rank_node"].to_numpy().astype(str)))
        if inv is not None and "rank_node" in inv.data_vars
        else size(post, "node")
    )
    out["gpus"] = size(post, "gpu_unit")
    out["steps"] = size(inv, "step_unit") or size(post, "step_unit")
    out["kernels"] = size(inv, "kernel") or size(post, "kernel")
    out["kernel_classes"] = (
        sorted(np.unique(inv["kernel_class"].to_numpy().astype(str)).tolist())
        if inv is not None and "kernel_class" in inv.data_vars
        else []
    )
    out["platform"] = inv.attrs.get("platform") if inv is not None else None
    plan = inv.attrs.get("traced_plan") if inv is not None else None
    out["traced_plan"] = json.loads(plan) if isinstance(plan, str) else (plan or {})
    return out


def _stats(values: np.ndarray) -> dict:
    """Quantiles over (draw, replicate); ``ci90``: 90 % interval of the per-draw mean."""
    q = np.quantile(values.reshape(-1), list(QUANTILE_KEYS.values()))
    out = {"mean": float(np.mean(values))}
    out.update({key: float(v) for key, v in zip(QUANTILE_KEYS, q, strict=True)})
    out["ci90"] = [float(x) for x in np.quantile(values.mean(axis=-1), [0.05, 0.95])]
    return out


def _threshold_key(x: float) -> str:
    """``1.05 -> "1.05"``, ``1.1 -> "1.10"`` (two decimals unless more are needed)."""
    return f"{x:.2f}" if abs(x * 100 - round(x * 100)) < 1e-9 else f"{x:g}"


def _summarize_forecast(forecast: xr.DataTree) -> dict:
    """The forecast JSON summary computed from the DataTree (used when
    ``bayesprism.forecast.summarize_forecast`` is not available); same keys."""
    ds = forecast.to_dataset() if isinstance(forecast, xr.DataTree) else forecast
    plans = []
    for i in range(ds.sizes["plan"]):
        one = ds.isel(plan=i)
        plan: dict = {
            "name": str(one["name"].item()) if "name" in one.coords else str(one["plan"].item())
        }
        for key in PLAN_FIELDS:
            if key in one.coords:
                value = one[key].item()
                plan[key] = value if isinstance(value, str) else int(value)
        plan["step_time_s"] = _stats(one["step_time_s"].transpose("draw", "replicate").to_numpy())
        plan["ideal_step_time_s"] = (
            float(one["ideal_step_time_s"]) if "ideal_step_time_s" in one else None
        )
        if "slowdown_probability" in one:
            sp = one["slowdown_probability"]
            plan["slowdown_probability"] = {
                _threshold_key(float(t)): float(p)
                for t, p in zip(sp["threshold"].to_numpy(), sp.to_numpy(), strict=True)
            }
        plan["breakdown_s"] = {
            key: float(one[f"{key}_s"].mean())
            for key in ("compute", "exposed_comm", "bubble", "wait")
            if f"{key}_s" in one
        }
        if "training_time_s" in one:
            plan["training_time_s"] = _stats(
                one["training_time_s"].transpose("draw", "replicate").to_numpy()
            )
            if "steps" in one:
                plan["steps"] = int(one["steps"])
        if "finish_probability" in one:
            fp = one["finish_probability"]
            plan["finish_probability"] = {
                f"{float(t):g}": float(p)
                for t, p in zip(fp["deadline"].to_numpy(), fp.to_numpy(), strict=True)
            }
        plans.append(plan)
    return {"plans": plans}


def forecast_summary(forecast: xr.DataTree) -> dict:
    """``bayesprism.forecast.summarize_forecast`` when available, else the same dict here."""
    try:
        from bayesprism.forecast import summarize_forecast
    except ImportError:
        return _summarize_forecast(forecast)
    return summarize_forecast(forecast)


# ---------------------------------------------------------------------------------- the report
def _figures(posterior, diagnosis, summary, workdir: Path) -> dict[str, Path]:
    """Draw every figure the report shows into ``workdir``."""
    from bayesprism import plots
    from bayesprism.diagnostics import worst_draws

    out: dict[str, Path] = {}
    jobs: list[tuple[str, Callable[[], Path]]] = []
    if len(diagnosis.convergence):
        draws = worst_draws(posterior, diagnosis, k=4)
        jobs += [
            ("trace", lambda: plots.plot_trace(draws, workdir / "trace.png")),
            ("rank", lambda: plots.plot_rank(draws, workdir / "rank.png")),
        ]
    if diagnosis.ppc_values:
        jobs.append(
            (
                "ppc",
                lambda: plots.plot_ppc(diagnosis.ppc_values, diagnosis.ppc, workdir / "ppc.png"),
            )
        )
    if len(diagnosis.variance_components):
        jobs.append(
            (
                "variance",
                lambda: plots.plot_variance_components(
                    diagnosis.variance_components, workdir / "variance.png"
                ),
            )
        )
    for level, table in diagnosis.unit_effects.items():
        jobs.append(
            (
                f"effects_{level}",
                lambda t=table, lv=level: plots.plot_unit_effects(
                    t, workdir / f"effects_{lv}.png", level=lv
                ),
            )
        )
    if summary and summary["plans"]:
        jobs += [
            ("answer", lambda: plots.plot_answer(summary, workdir / "answer.png")),
            ("breakdown", lambda: plots.plot_breakdown(summary, workdir / "breakdown.png")),
        ]
        # the fan (quartiles and ideal over GPUs) and the slowdown curves need several scales;
        # one scale is the answer figure's
        several = len({p["gpus"] for p in summary["plans"]}) >= 2
        if several:
            jobs.append(("fan", lambda: plots.plot_forecast_fan(summary, workdir / "fan.png")))
        if several and summary["plans"][0].get("slowdown_probability"):
            jobs.append(
                ("slowdown", lambda: plots.plot_slowdown(summary, workdir / "slowdown.png"))
            )
    for key, job in jobs:
        out[key] = job()
    return out


def write_report(
    posterior: xr.DataTree,
    path: str | Path,
    *,
    forecast: xr.DataTree | Mapping | None = None,
    diagnosis=None,
    sensitivity: Mapping | None = None,
    placement: Mapping | None = None,
    commands: Sequence[str] | None = None,
) -> Path:
    """Write one self-contained HTML report.

    Parameters
    ----------
    posterior
        The fit.
    path
        Output ``.html`` file (parent directories are created).
    forecast
        A forecast DataTree, or its JSON summary ``{"plans": [...]}``.
    diagnosis
        A ``DiagnosisReport``; computed with ``bayesprism.diagnose`` when omitted.
    sensitivity
        JSON of ``bayesprism sensitivity --json`` (``{"contributions": [...]}``).
    placement
        JSON of ``bayesprism place --json``.
    commands
        The commands that produced the inputs and this report, shown verbatim.

    Returns
    -------
    pathlib.Path
        The written file.
    """
    if diagnosis is None:
        from bayesprism.diagnostics import diagnose

        diagnosis = diagnose(posterior)
    summary = None
    if forecast is not None:
        # a DataTree is itself a Mapping: test for it first
        summary = (
            forecast_summary(forecast)
            if isinstance(forecast, (xr.DataTree, xr.Dataset))
            else dict(forecast)
        )
        if "baseline" not in summary and isinstance(forecast, (xr.DataTree, xr.Dataset)):
            # the forecast records whether the slowdown baseline was the ideal step
            kind = forecast.attrs.get("baseline", "ideal")
            summary["baseline"] = {"kind": "ideal" if kind == "ideal" else "given"}
    with tempfile.TemporaryDirectory(prefix="bayesprism-report-") as tmp:
        figures = _figures(posterior, diagnosis, summary, Path(tmp))
        # the answer first (one screen: table and figure), then what it rests on
        sections = [] if summary is None else [section_answer(summary, figures)]
        sections += [
            section_data(data_summary(posterior)),
            section_diagnostics(diagnosis, figures),
            section_variance(diagnosis, figures),
        ]
        if summary is not None:
            sections += [section_forecast(summary, figures), section_slowdown(summary, figures)]
        if sensitivity is not None:
            sections.append(section_sensitivity(sensitivity))
        if placement is not None:
            sections.append(section_placement(placement))
    sections.append(
        "<h2 id='commands'>Commands</h2>"
        + (
            "<pre>" + "\n".join(esc(c) for c in commands) + "</pre>"
            if commands
            else "<p class='note'>No commands were recorded.</p>"
        )
    )
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    document = (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<title>bayesprism report</title>"
        f"<style>{CSS}</style></head><body>"
        f"<h1>bayesprism report</h1><p class='note'>Written {stamp} by bayesprism "
        f"{esc(_version())}.</p>" + "\n".join(sections) + "</body></html>\n"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from bayesprism.outputs import write_text_atomic

    return write_text_atomic(path, document)


def _version() -> str:
    from bayesprism import __version__

    return __version__
