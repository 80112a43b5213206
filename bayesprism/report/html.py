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

from bayesprism._version import __version__
from bayesprism.checks.diagnostics import diagnose, worst_draws
from bayesprism.forecast.forecasting import summarize_forecast
from bayesprism.outputs import write_text_atomic
from bayesprism.posterior import recorded_traced_plan
from bayesprism.report import plots
from bayesprism.report.sections import (
    CSS,
    esc,
    section_answer,
    section_data,
    section_diagnostics,
    section_forecast,
    section_placement,
    section_sensitivity,
    section_slowdown,
    section_variance,
)

__all__ = ["data_summary", "write_report"]

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
    out["traced_plan"] = recorded_traced_plan(inv)
    return out


# ---------------------------------------------------------------------------------- the report
def _figures(posterior, diagnosis, summary, workdir: Path) -> dict[str, Path]:
    """Draw every figure the report shows into ``workdir``."""
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

    Examples
    --------
    >>> import bayesprism as bp
    >>> posterior = bp.load("posterior.nc")  # doctest: +SKIP
    >>> plans = [bp.ParallelPlan(dp=8), bp.ParallelPlan(dp=512)]
    >>> forecast = bp.forecast(posterior, plans)  # doctest: +SKIP
    >>> write_report(posterior, "report.html", forecast=forecast)  # doctest: +SKIP
    PosixPath('report.html')
    """
    if diagnosis is None:
        diagnosis = diagnose(posterior)
    summary = None
    if forecast is not None:
        # a DataTree is itself a Mapping: test for it first
        summary = (
            summarize_forecast(forecast)
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
        f"{esc(__version__)}.</p>" + "\n".join(sections) + "</body></html>\n"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, document)
