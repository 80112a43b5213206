"""HTML pieces of the report: number formats, escaped tables, one function per section.

Every text that comes from data (kernel names, node names, commands, problems) is escaped
here. Numbers are formatted the same way everywhere: durations with 3 significant digits in
a unit a person reads (µs, ms, s, min, h, d: :func:`format_duration`), probabilities with 3
decimals.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from bayesprism.forecast.forecasting import degraded_link_note

LEVEL_NAMES = {"node": "Node", "gpu": "GPU", "cabinet": "Cabinet"}
PLAN_FIELDS = ("gpus", "dp", "tp", "pp", "cp", "ep", "microbatches", "schedule")

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;color:#222;line-height:1.4;padding:0 1em}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2em}
table{border-collapse:collapse;margin:0.8em 0;font-size:0.9em}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f0f0f0}td.t,th.t{text-align:left}
.ok{color:#1e7b34;font-weight:bold}.bad{color:#b3261e;font-weight:bold}
img{max-width:100%;display:block;margin:0.8em 0}
pre{background:#f6f6f6;padding:0.8em;overflow-x:auto}
.note{color:#555;font-size:0.9em}
"""


# ------------------------------------------------------------------------------------ format
#: Units :func:`format_duration` prints, with the largest value (s) it prints in each.
_DISPLAY_UNITS = (("µs", 1e-6, 1e-3), ("ms", 1e-3, 1.0), ("s", 1.0, 120.0),
                  ("min", 60.0, 7200.0), ("h", 3600.0, 72 * 3600.0), ("d", 86400.0, math.inf))


def duration_unit(seconds: float) -> tuple[str, float]:
    """The unit to print ``seconds`` in (µs, ms, s, min, h, d) and its size in seconds.

    Examples
    --------
    >>> duration_unit(0.0193), duration_unit(19300.0), duration_unit(9e5)
    (('ms', 0.001), ('h', 3600.0), ('d', 86400.0))
    """
    size = abs(seconds) if math.isfinite(seconds) else 1.0
    for name, scale, below in _DISPLAY_UNITS:
        if size < below:
            return name, scale
    return _DISPLAY_UNITS[-1][:2]


def format_duration(seconds: float, unit: tuple[str, float] | None = None, *,
                    suffix: bool = True) -> str:
    """``seconds`` with three significant digits in a readable unit (or the one given).

    Examples
    --------
    >>> format_duration(0.019334), format_duration(19334.0), format_duration(2.5e6)
    ('19.3 ms', '5.37 h', '28.9 d')
    """
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if abs(seconds) < 1e-9:  # float round-off of a sum that is 0 (e.g. no pipeline bubble)
        return "0"
    name, scale = unit or duration_unit(seconds)
    value = seconds / scale
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return f"{text} {name}" if suffix else text


def format_interval(low: float, high: float) -> str:
    """A 90 % interval in the unit of its upper end, e.g. ``"18.1–21 ms"``.

    Examples
    --------
    >>> format_interval(0.0181, 0.021)
    '18.1–21 ms'
    """
    unit = duration_unit(high)
    return (f"{format_duration(low, unit, suffix=False)}–"
            f"{format_duration(high, unit, suffix=False)} {unit[0]}")


def fmt_s(x) -> str:
    """A duration in seconds, printed in a readable unit (:func:`format_duration`); ``–`` for
    missing values.

    Examples
    --------
    >>> fmt_s(0.01234), fmt_s(3.038e-20), fmt_s(None)
    ('12.3 ms', '0', '–')
    """
    if x is None:
        return "–"
    return format_duration(float(x))


def fmt_p(x) -> str:
    """A probability with 3 decimals; ``–`` for missing values."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{float(x):.3f}"


def esc(value) -> str:
    """HTML-escaped text of any value (quotes too)."""
    return html.escape(str(value), quote=True)


def _table(header: Sequence[str], rows: Sequence[Sequence], text_columns: int = 1) -> str:
    """An HTML table; the first ``text_columns`` columns are left-aligned. Cells are escaped."""

    def cell(tag: str, i: int, value) -> str:
        cls = ' class="t"' if i < text_columns else ""
        return f"<{tag}{cls}>{esc(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


# ----------------------------------------------------------------------------------- sections
def section_data(summary: dict) -> str:
    """Data summary table (``report.data_summary`` values)."""
    plan = summary["traced_plan"]
    rows = [
        ("runs", ", ".join(summary["runs"]) or "–"),
        ("platform", summary["platform"] or "–"),
        ("ranks traced", summary["ranks"] if summary["ranks"] is not None else "–"),
        ("nodes", summary["nodes"] if summary["nodes"] is not None else "–"),
        ("GPUs with fitted effects", summary["gpus"] if summary["gpus"] is not None else "–"),
        ("steps", summary["steps"] if summary["steps"] is not None else "–"),
        ("kernels", summary["kernels"] if summary["kernels"] is not None else "–"),
        ("kernel classes", ", ".join(summary["kernel_classes"]) or "–"),
        ("traced plan", " ".join(f"{k}={v}" for k, v in plan.items()) or "–"),
        ("model", summary["model_kind"] or "–"),
        (
            "sampler",
            f"{summary['sampler']} ({summary['chains']} chains × {summary['draws']} "
            f"draws, {summary['tune']} tuning)",
        ),
        ("bayesprism version", summary["bayesprism_version"] or "–"),
        ("spec hash / input digest", f"{summary['spec_hash']} / {summary['input_digest']}"),
    ]
    return "<h2 id='data'>Data summary</h2>" + _table(["item", "value"], rows, text_columns=2)


def section_diagnostics(diagnosis, figures: dict[str, Path]) -> str:
    """Verdict, convergence numbers, problems, predictive checks and unit-effect figures."""
    verdict = (
        "<p class='ok'>The fit passed every check.</p>"
        if diagnosis.ok
        else "<p class='bad'>The fit cannot be trusted yet; see the problems below.</p>"
    )
    t = diagnosis.thresholds
    rows = [
        ("max R-hat", f"{diagnosis.max_rhat:.3f}", f"≤ {t.get('rhat_max', '–')}"),
        ("min bulk ESS", f"{diagnosis.min_ess_bulk:.0f}", f"≥ {t.get('min_ess', 0):.0f}"),
        ("min tail ESS", f"{diagnosis.min_ess_tail:.0f}", f"≥ {t.get('min_ess', 0):.0f}"),
        ("divergences", diagnosis.divergences, "0"),
        (
            "min BFMI",
            "–" if diagnosis.bfmi_min is None else f"{diagnosis.bfmi_min:.2f}",
            f"≥ {t.get('bfmi_min', '–')}",
        ),
    ]
    parts = [
        "<h2 id='diagnostics'>Fit diagnostics</h2>",
        verdict,
        _table(["check", "value", "limit"], rows),
    ]
    if diagnosis.problems:
        parts.append(
            "<h3>Problems</h3><ul>"
            + "".join(f"<li>{esc(p)}</li>" for p in diagnosis.problems)
            + "</ul>"
        )
    if diagnosis.notes:
        parts.append(
            "<ul class='note'>" + "".join(f"<li>{esc(n)}</li>" for n in diagnosis.notes) + "</ul>"
        )
    worst = diagnosis.convergence.head(10)
    if len(worst):
        parts.append(
            "<h3>Worst-mixing parameters</h3>"
            + _table(
                ["parameter", "R-hat", "bulk ESS", "tail ESS"],
                [
                    (r.element, f"{r.r_hat:.3f}", f"{r.ess_bulk:.0f}", f"{r.ess_tail:.0f}")
                    for r in worst.itertuples()
                ],
            )
        )
    for key, alt in (("trace", "trace plot"), ("rank", "rank plot")):
        if key in figures:
            parts.append(_img(figures[key], alt))
    if diagnosis.ppc:
        parts.append(
            "<h3>Posterior predictive check against the traced run</h3>"
            + _table(
                [
                    "kernel class",
                    "cells",
                    "KS distance",
                    "50% coverage",
                    "90% coverage",
                    "observed median (µs)",
                    "predicted median (µs)",
                ],
                [
                    (
                        cls,
                        v["n_cells"],
                        f"{v['ks_distance']:.3f}",
                        f"{v['coverage_50']:.0%}",
                        f"{v['coverage_90']:.0%}",
                        f"{v['observed_median_us']:.4g}",
                        f"{v['predicted_median_us']:.4g}",
                    )
                    for cls, v in diagnosis.ppc.items()
                ],
            )
        )
        if "ppc" in figures:
            parts.append(_img(figures["ppc"], "posterior predictive check"))
    if diagnosis.step_time_check:
        s = diagnosis.step_time_check
        parts.append(
            "<h3>Traced step time vs prediction</h3>"
            + _table(
                [
                    "steps",
                    "observed median (s)",
                    "predicted median (s)",
                    "predicted 90% interval (s)",
                    "90% coverage",
                    "KS distance",
                ],
                [
                    (
                        s["n_steps"],
                        fmt_s(s["observed_median_s"]),
                        fmt_s(s["predicted_median_s"]),
                        f"{fmt_s(s['predicted_p05_s'])} – {fmt_s(s['predicted_p95_s'])}",
                        f"{s['coverage_90']:.0%}",
                        f"{s['ks_distance']:.3f}",
                    )
                ],
            )
        )
    for level in diagnosis.unit_effects:
        if f"effects_{level}" in figures:
            table = diagnosis.unit_effects[level]
            marked = table[table["excludes_zero"]]
            parts.append(
                f"<h3>{esc(LEVEL_NAMES.get(level, level))} effects</h3><p>"
                f"{len(marked)} of {len(table)} units have a 90% interval that "
                "excludes 0"
                + (": " + esc(", ".join(marked["unit"].head(20))) if len(marked) else "")
                + ".</p>"
            )
            parts.append(_img(figures[f"effects_{level}"], f"{level} effects"))
    return "\n".join(parts)


def section_variance(diagnosis, figures: dict[str, Path]) -> str:
    """Variance-decomposition table and forest plot."""
    table = diagnosis.variance_components
    if not len(table):
        return (
            "<h2 id='variance'>Variance decomposition</h2><p class='note'>This posterior has "
            "no per-class loadings.</p>"
        )
    rows = [
        (
            r.kernel_class,
            r.level,
            f"{r.q50:.3g}",
            f"{r.q05:.3g} – {r.q95:.3g}",
            f"{r.share_q50:.0%}",
            f"{r.share_q05:.0%} – {r.share_q95:.0%}",
        )
        for r in table.itertuples()
    ]
    parts = [
        "<h2 id='variance'>Variance decomposition</h2>",
        "<p>Loading of each level (sd of log duration it contributes) and its share of the "
        "class's log-duration variance; medians with 90% intervals.</p>",
        _table(
            ["kernel class", "level", "loading", "loading 90%", "share", "share 90%"],
            rows,
            text_columns=2,
        ),
    ]
    if "variance" in figures:
        parts.append(_img(figures["variance"], "variance components"))
    return "\n".join(parts)


def _plan_label(plan: Mapping) -> str:
    return " ".join(f"{k}={plan[k]}" for k in PLAN_FIELDS[1:] if k in plan)


def baseline_text(summary: Mapping) -> str:
    """What P(slowdown) is measured against, in words (``summary["baseline"]``; ideal when
    absent).

    Examples
    --------
    >>> baseline_text({"baseline": {"kind": "traced", "step_time_s": 0.0193}})
    'the measured step of the traced run (19.3 ms)'
    """
    baseline = summary.get("baseline") or {"kind": "ideal"}
    kind = baseline.get("kind", "ideal")
    if kind == "ideal":
        return "each plan's variability-free (ideal) step time"
    value = baseline.get("step_time_s")
    if kind == "traced":
        return f"the measured step of the traced run ({fmt_s(value)})"
    return f"a given step time ({fmt_s(value)})" if value is not None else "a given step time"


def section_answer(summary: dict, figures: dict[str, Path]) -> str:
    """The first screen: per plan, step time and training time (median, 90 % interval),
    P(slowdown > x) against the baseline and P(finish within T), and the answer figure."""
    plans = summary["plans"]
    thresholds = list(dict.fromkeys(k for p in plans for k in p.get("slowdown_probability", {})))
    deadlines = list(dict.fromkeys(k for p in plans for k in p.get("finish_probability", {})))
    training = any("training_time_s" in p for p in plans)
    header = ["plan", "GPUs", "step time: median", "step time: 90% interval"]
    if training:
        header += ["steps", "training time: median", "training time: 90% interval"]
    header += [f"P(slowdown > {float(t):g}×)" for t in thresholds]
    header += [f"P(finish ≤ {fmt_s(float(d))})" for d in deadlines]
    rows = []
    for p in plans:
        step = p["step_time_s"]
        row = [p.get("name", ""), f"{p.get('gpus', 0):,}", fmt_s(step["p50"]),
               format_interval(step["p05"], step["p95"])]
        if training:
            train = p.get("training_time_s")
            row += ([f"{p.get('steps', 0):,}", fmt_s(train["p50"]),
                     format_interval(train["p05"], train["p95"])] if train else ["–"] * 3)
        row += [fmt_p(p.get("slowdown_probability", {}).get(t)) for t in thresholds]
        row += [fmt_p(p.get("finish_probability", {}).get(d)) for d in deadlines]
        rows.append(row)
    parts = [
        "<h2 id='answer'>The answer</h2>",
        "<p>Per plan: the time of one training step (median and 90% interval: parameter "
        "uncertainty and step-to-step variability together)"
        + (", the training run's time on one cluster" if training else "")
        + (f"; P(slowdown &gt; x) = P(step &gt; x × {esc(baseline_text(summary))})"
           if thresholds else "")
        + (", and the probability of finishing within each deadline" if deadlines else "")
        + ". Details follow below the data summary and the diagnostics.</p>",
        _table(header, rows),
    ]
    link = degraded_link_note(plans)
    if link:
        parts.append(f"<p>{esc(link)}.</p>")
    formulas = [(p.get("name", ""), p["extrapolated"]) for p in plans if p.get("extrapolated")]
    if formulas:
        parts.append("<p>By formula, not as traced:</p><ul>" + "".join(
            f"<li>{esc(name)}: {esc('; '.join(notes))}</li>" for name, notes in formulas)
            + "</ul>")
    if "answer" in figures:
        parts.append(_img(figures["answer"], "step time and training time vs GPUs"))
    return "\n".join(parts)


def section_forecast(summary: dict, figures: dict[str, Path]) -> str:
    """Step-time quantiles, training time, finish probabilities and breakdown per plan."""
    plans = summary["plans"]
    rows = []
    for p in plans:
        s = p["step_time_s"]
        rows.append(
            (
                p.get("name", ""),
                _plan_label(p),
                p.get("gpus", "–"),
                fmt_s(s["mean"]),
                fmt_s(s["p05"]),
                fmt_s(s["p50"]),
                fmt_s(s["p95"]),
                fmt_s(s["p99"]),
                f"{fmt_s(s['ci90'][0])} – {fmt_s(s['ci90'][1])}",
                fmt_s(p.get("ideal_step_time_s")),
            )
        )
    parts = [
        "<h2 id='forecast'>Forecasts in detail</h2>",
        "<p>Step time: posterior predictive quantiles over parameter "
        "uncertainty and step-to-step variability; <em>mean: 90% CI</em> is the credible "
        "interval of the mean step time (parameter uncertainty only); <em>ideal</em> is the "
        "variability-free step time of the plan.</p>",
        _table(
            ["plan", "layout", "GPUs", "mean", "p05", "p50", "p95", "p99", "mean: 90% CI", "ideal"],
            rows,
            text_columns=2,
        ),
    ]
    if "fan" in figures:
        parts.append(_img(figures["fan"], "forecast fan chart"))
    if any("training_time_s" in p for p in plans):
        parts.append(
            "<h3>Training time</h3>"
            + _table(
                ["plan", "p05", "p50", "p95", "mean: 90% CI"],
                [
                    (
                        p.get("name", ""),
                        fmt_s(p["training_time_s"]["p05"]),
                        fmt_s(p["training_time_s"]["p50"]),
                        fmt_s(p["training_time_s"]["p95"]),
                        f"{fmt_s(p['training_time_s']['ci90'][0])} – "
                        f"{fmt_s(p['training_time_s']['ci90'][1])}",
                    )
                    for p in plans
                    if "training_time_s" in p
                ],
            )
        )
    deadlines = list(plans[0].get("finish_probability", {})) if plans else []
    if deadlines:
        parts.append(
            "<h3>Probability of finishing within the deadline</h3>"
            + _table(
                ["plan", *(f"P(≤ {fmt_s(float(d))})" for d in deadlines)],
                [
                    (p.get("name", ""), *(fmt_p(p["finish_probability"].get(d)) for d in deadlines))
                    for p in plans
                ],
            )
        )
    parts.append(
        "<h3>Where the time goes (mean per step)</h3>"
        + _table(
            ["plan", "compute", "exposed communication", "bubble", "waiting"],
            [
                (
                    p.get("name", ""),
                    *(
                        fmt_s(p.get("breakdown_s", {}).get(k))
                        for k in ("compute", "exposed_comm", "bubble", "wait")
                    ),
                )
                for p in plans
            ],
        )
    )
    if "breakdown" in figures:
        parts.append(_img(figures["breakdown"], "step-time breakdown"))
    return "\n".join(parts)


def section_slowdown(summary: dict, figures: dict[str, Path]) -> str:
    """Slowdown-probability table and figure."""
    plans = summary["plans"]
    thresholds = list(plans[0].get("slowdown_probability", {})) if plans else []
    parts = [
        "<h2 id='slowdown'>Slowdown probabilities</h2>",
        f"<p>P(step time &gt; x × {esc(baseline_text(summary))}).</p>",
    ]
    if thresholds:
        parts.append(
            _table(
                ["plan", "GPUs", *(f"P(> {t}×)" for t in thresholds)],
                [
                    (
                        p.get("name", ""),
                        p.get("gpus", "–"),
                        *(fmt_p(p["slowdown_probability"].get(t)) for t in thresholds),
                    )
                    for p in plans
                ],
            )
        )
    if "slowdown" in figures:
        parts.append(_img(figures["slowdown"], "slowdown probability"))
    return "\n".join(parts)


def _per_threshold(value) -> dict:
    """``slowdown_p_delta`` is a dict keyed by threshold (older JSON: one number)."""
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    return {"": value}


def _share_over(key: str) -> float:
    """The share over the ideal step of a threshold key: ``"1.10"`` (a ratio) -> 0.1; older
    sensitivity JSON keyed fractions (``"0.1"``)."""
    x = float(key)
    return x - 1.0 if x >= 1.0 else x


def section_sensitivity(sensitivity: Mapping) -> str:
    """Sensitivity contributions (JSON of ``bayesprism sensitivity --json``)."""
    contributions = list(sensitivity.get("contributions", []))
    thresholds = sorted(
        {t for c in contributions for t in _per_threshold(c.get("slowdown_p_delta"))}
    )
    rows = []
    for c in contributions:
        ci = c.get("p95_delta_ci90") or [None, None]
        deltas = _per_threshold(c.get("slowdown_p_delta"))
        rows.append(
            (
                c.get("factor", ""),
                c.get("level", ""),
                fmt_s(c.get("p95_delta_s")),
                f"{fmt_s(ci[0])} – {fmt_s(ci[1])}",
                *(fmt_p(deltas.get(t)) for t in thresholds),
            )
        )
    slowdown_headers = [
        f"Δ P(slowdown > {_share_over(t):.0%})" if t else "Δ P(slowdown)" for t in thresholds
    ]
    return (
        "<h2 id='sensitivity'>Sensitivity: what drives the tail</h2>"
        "<p>Change of the p95 step time and of the slowdown probabilities when the factor's "
        "variability is removed (common random numbers; intervals over posterior draws).</p>"
        + _table(
            ["factor", "level", "Δ p95 (s)", "Δ p95 90% interval (s)", *slowdown_headers],
            rows,
            text_columns=2,
        )
    )


def section_placement(placement: Mapping) -> str:
    """Placement gains, nodes to drain and assignment (JSON of ``bayesprism place --json``)."""

    def ratio(key: str) -> str:
        value = placement.get(key)
        ci = placement.get(f"{key}_ci90")
        if not ci:
            return fmt_ratio(value)
        return f"{fmt_ratio(value)} (90% interval {fmt_ratio(ci[0])} – {fmt_ratio(ci[1])})"

    rows = [
        ("step-time ratio random ÷ optimised (≥ 1 is a gain)", ratio("gain_vs_random")),
        ("step-time ratio worst ÷ optimised", ratio("gain_vs_worst")),
    ]
    parts = ["<h2 id='placement'>Node placement</h2>", _table(["quantity", "value"], rows)]
    drain = placement.get("drain") or []
    drained = esc(", ".join(str(d) for d in drain)) or "none"
    parts.append(f"<p>Nodes to drain, best first: {drained}.</p>")
    assignment = placement.get("assignment") or {}
    items = (
        list(assignment.items()) if isinstance(assignment, Mapping) else list(enumerate(assignment))
    )
    if items:
        shown = [(node, _describe_position(pos)) for node, pos in items[:50]]
        parts.append(_table(["node", "position"], shown, text_columns=2))
        if len(items) > len(shown):
            parts.append(
                f"<p class='note'>… {len(items) - len(shown)} more assignments in the "
                "placement JSON.</p>"
            )
    return "\n".join(parts)


def _describe_position(position) -> str:
    if not isinstance(position, Mapping):
        return str(position)
    keys = ("stage", "replica", "tp_group")
    return ", ".join(f"{k.replace('_', ' ')} {position[k]}" for k in keys if k in position)


def fmt_ratio(x) -> str:
    """A ratio with 3 decimals; ``–`` for missing values."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{float(x):.3f}"
