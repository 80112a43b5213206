"""Figures of diagnostics and forecasts (matplotlib / ArviZ 1.x, headless).

Plotting code draws values computed elsewhere (``bayesprism.checks.diagnostics``, the forecast
summary of ``bayesprism.forecast.forecasting``, ``bayesprism.analysis.what_if``); it computes no
statistics. Every function takes the values and an output path, saves one PNG and returns its
path. The figure's title is also written into the PNG's ``Title`` metadata, so a reader (or a
test) can tell which figure a file holds.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from bayesprism.outputs import write_atomic
from bayesprism.report.sections import duration_unit

# arviz_plots is imported inside the figures that use it (start-up time).

LEVEL_COLORS = {
    "node": "#1f77b4",
    "gpu": "#ff7f0e",
    "step": "#2ca02c",
    "gpustep": "#9467bd",
    "cabinet": "#8c564b",
    "resid": "#7f7f7f",
}
BREAKDOWN_PARTS = (
    ("compute", "compute", "#4c72b0"),
    ("exposed_comm", "exposed communication", "#dd8452"),
    ("bubble", "pipeline bubble", "#55a868"),
    ("wait", "waiting for peers", "#c44e52"),
)
LEVEL_NAMES = {"node": "Node", "gpu": "GPU", "cabinet": "Cabinet"}
SLOW_COLOR, FAST_COLOR, NEUTRAL_COLOR = "#c0392b", "#2471a3", "#7f8c8d"


def _save(fig: Figure, path: str | Path, title: str) -> Path:
    """Title the figure, write it as PNG (title in the metadata) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.suptitle(title, fontsize=13)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tight_layout warns on axes it cannot fit; harmless
        fig.tight_layout(rect=(0, 0, 1, 0.95))
    # atomic: a killed write never leaves half a figure under the final name
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight",
                                               metadata={"Title": title}))
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- MCMC diagnostics
def plot_trace(
    draws: xr.DataTree,
    path: str | Path,
    *,
    title: str = "Trace and marginal density of the worst-mixing parameters",
) -> Path:
    """Trace and per-chain density (``arviz_plots.plot_trace_dist``) of selected elements.

    Parameters
    ----------
    draws
        DataTree with a ``posterior`` group of (chain, draw) variables, typically
        ``bayesprism.checks.diagnostics.worst_draws(posterior, report)``.
    path
        Output PNG.
    """
    import arviz_plots as azp

    pc = azp.plot_trace_dist(draws, backend="matplotlib", compact=True)
    fig = pc.viz["figure"].item()
    for name, row in pc.viz["plot"].to_dataset().data_vars.items():
        dist_ax, trace_ax = row.sel(column="dist").item(), row.sel(column="trace").item()
        dist_ax.set_title(str(name), fontsize=10)
        trace_ax.set_title(str(name), fontsize=10)
        dist_ax.set_xlabel("value (model units)")
        dist_ax.set_ylabel("density")
        trace_ax.set_xlabel("draw")
        trace_ax.set_ylabel("value")
    # chains differ by line style (colour marks the parameter)
    styles = ["-", "--", ":", "-."]
    _chain_legend(fig, draws, lambda i: {"color": "black", "linestyle": styles[i % 4]})
    return _save(fig, path, title)


def plot_rank(
    draws: xr.DataTree,
    path: str | Path,
    *,
    title: str = "Rank plots of the worst-mixing parameters",
) -> Path:
    """Per-chain fractional-rank ECDFs (``arviz_plots.plot_rank``); uniform when chains agree."""
    import arviz_plots as azp

    n_panels = len(draws["posterior"].data_vars)
    pc = azp.plot_rank(
        draws,
        backend="matplotlib",
        col_wrap=2,
        figure_kwargs={"figsize": (10, 2.6 * max(1, -(-n_panels // 2)))},
    )
    fig = pc.viz["figure"].item()
    for ax in fig.axes:
        ax.set_xlabel("fractional rank of the draw (all chains pooled)")
        ax.set_ylabel("ECDF − uniform")
    _chain_legend(fig, draws, lambda i: {"color": f"C{i}"})
    return _save(fig, path, title)


def _chain_legend(fig, draws: xr.DataTree, style) -> None:
    """One legend entry per chain, outside the panels; ``style(i)`` gives the line keywords."""
    chains = draws["posterior"].coords["chain"].to_numpy()
    fig.legend(
        handles=[Line2D([], [], label=f"chain {c}", **style(i)) for i, c in enumerate(chains)],
        loc="upper left",
        bbox_to_anchor=(1.0, 0.95),
        fontsize=8,
    )


def plot_variance_components(
    table: pd.DataFrame,
    path: str | Path,
    *,
    title: str = "Variance components by kernel class and level",
) -> Path:
    """Forest of per-class loadings (``diagnostics.variance_components`` table).

    Dot: median; thick bar: 50 % interval; thin bar: 90 % interval.
    """
    rows = table.reset_index(drop=True)
    height = 1.2 + 0.28 * max(len(rows), 1)
    fig, ax = plt.subplots(figsize=(8, height))
    y = np.arange(len(rows))[::-1]
    colors = [LEVEL_COLORS.get(lv, "black") for lv in rows["level"]]
    ax.hlines(y, rows["q05"], rows["q95"], colors=colors, linewidth=1.2)
    ax.hlines(y, rows["q25"], rows["q75"], colors=colors, linewidth=4)
    ax.scatter(rows["q50"], y, color="white", edgecolor=colors, zorder=3, s=25)
    ax.set_yticks(
        y,
        [f"{c} · {lv}" for c, lv in zip(rows["kernel_class"], rows["level"], strict=True)],
        fontsize=8,
    )
    # separate classes with faint lines so the groups read at a glance
    boundaries = np.flatnonzero(
        rows["kernel_class"].to_numpy()[1:] != rows["kernel_class"].to_numpy()[:-1]
    )
    for b in boundaries:
        ax.axhline(y[b] - 0.5, color="0.85", linewidth=0.8)
    ax.set_xlabel("loading: sd of log duration contributed by the level (log µs)")
    ax.set_ylabel("kernel class · level")
    ax.set_xlim(left=0)
    present = [lv for lv in LEVEL_COLORS if lv in set(rows["level"])]
    ax.legend(
        handles=[Patch(color=LEVEL_COLORS[lv], label=lv) for lv in present],
        title="level",
        loc="lower right",
        fontsize=8,
    )
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path, title)


def plot_ppc(
    values: Mapping[str, tuple[np.ndarray, np.ndarray]],
    numbers: Mapping[str, Mapping[str, float]],
    path: str | Path,
    *,
    title: str = "Posterior predictive check: cell mean duration per kernel class",
) -> Path:
    """Observed vs predicted ECDFs of cell mean duration, one panel per class.

    Parameters
    ----------
    values
        ``DiagnosisReport.ppc_values``: per class ``(observed_us, predicted_us)``.
    numbers
        ``DiagnosisReport.ppc``: per class ``coverage_90`` and ``ks_distance`` (panel titles).
    """
    classes = list(values)
    ncols = min(3, max(len(classes), 1))
    nrows = max(1, int(np.ceil(len(classes) / ncols)))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows), squeeze=False)
    for ax, cls in zip(axes.flat, classes, strict=False):
        observed, predicted = values[cls]
        ax.ecdf(predicted, color="#1f77b4", linewidth=2, alpha=0.7, label="predicted")
        ax.ecdf(observed, color="black", linewidth=1.2, label="observed")
        ax.set_xscale("log")
        # narrow ranges on a log axis get crowded minor labels: label 1-2-3-5 ticks only
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        n = numbers.get(cls, {})
        ax.set_title(
            f"{cls}: 90% coverage {n.get('coverage_90', np.nan):.0%}, "
            f"KS {n.get('ks_distance', np.nan):.2f}",
            fontsize=9,
        )
        ax.set_xlabel("cell mean duration (µs)")
        ax.set_ylabel("share of cells ≤ x")
    for ax in list(axes.flat)[len(classes) :]:
        ax.set_visible(False)
    if not classes:
        axes[0, 0].set_visible(True)
        axes[0, 0].text(0.5, 0.5, "no cell statistics in the fit", ha="center")
    axes[0, 0].legend(fontsize=8, loc="upper left")
    return _save(fig, path, title)


def plot_unit_effects(
    table: pd.DataFrame,
    path: str | Path,
    *,
    level: str = "node",
    k: int = 15,
    title: str | None = None,
) -> Path:
    """Caterpillar of unit effects (``diagnostics.unit_effects`` table, sorted slowest first).

    Units whose 90 % interval excludes 0 are coloured (red slower, blue faster). With more than
    ``2k`` units only the ``k`` slowest and ``k`` fastest are drawn, with a note of how many were
    left out and how many of those are highlighted.
    """
    name = LEVEL_NAMES.get(level, level)
    title = title or f"{name} effects (90% and 50% intervals; slowest first)"
    rows = table.reset_index(drop=True)
    omitted = pd.DataFrame()
    if len(rows) > 2 * k:
        omitted = rows.iloc[k:-k]
        rows = pd.concat([rows.iloc[:k], rows.iloc[-k:]], ignore_index=True)
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.26 * len(rows)))
    y = np.arange(len(rows))[::-1].astype(float)
    if len(omitted):
        y[k:] -= 1.0  # leave a gap row for the omitted units
    colors = np.where(
        rows["q05"] > 0, SLOW_COLOR, np.where(rows["q95"] < 0, FAST_COLOR, NEUTRAL_COLOR)
    )
    ax.hlines(y, rows["q05"], rows["q95"], colors=colors, linewidth=1.2)
    ax.hlines(y, rows["q25"], rows["q75"], colors=colors, linewidth=4)
    ax.scatter(rows["q50"], y, color="white", edgecolor=colors, zorder=3, s=22)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y, rows["unit"].tolist(), fontsize=7 if len(rows) > 20 else 9)
    if len(omitted):
        n_marked = int(omitted["excludes_zero"].sum())
        ax.text(
            0.02,
            (y[k - 1] + y[k]) / 2,
            f"… {len(omitted)} units not shown ({n_marked} of them exclude 0)",
            transform=ax.get_yaxis_transform(),
            va="center",
            fontsize=8,
            style="italic",
        )
    ax.set_xlabel(
        f"standardised {name if level == 'gpu' else level} effect (population sd; > 0 means slower)"
    )
    ax.set_ylabel(level)
    ax.legend(
        handles=[
            Patch(color=SLOW_COLOR, label="slower (interval > 0)"),
            Patch(color=FAST_COLOR, label="faster (interval < 0)"),
            Patch(color=NEUTRAL_COLOR, label="interval includes 0"),
        ],
        fontsize=8,
        loc="lower right",
    )
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path, title)


# ---------------------------------------------------------------------------------- forecasts
def _layout_label(plan: Mapping) -> str:
    return (
        f"tp{plan.get('tp', 1)} pp{plan.get('pp', 1)} cp{plan.get('cp', 1)} "
        f"ep{plan.get('ep', 1)} {plan.get('schedule', '')}".strip()
    )


def _by_layout(plans: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    """Plans grouped by layout (everything but the data-parallel size), ordered by GPUs."""
    groups: dict[str, list[Mapping]] = {}
    for plan in plans:
        groups.setdefault(_layout_label(plan), []).append(plan)
    return {label: sorted(ps, key=lambda p: p["gpus"]) for label, ps in groups.items()}


def plot_forecast_fan(
    summary: Mapping, path: str | Path, *, title: str = "Forecast step time vs number of GPUs"
) -> Path:
    """Fan chart of step time: median with 50 % and 90 % bands, one fan per layout.

    ``summary`` is the forecast summary ``{"plans": [...]}`` (``step_time_s`` quantiles).
    """
    fig, ax = plt.subplots(figsize=(8, 4.8))
    lows, highs = [], []
    unit, size = _time_axis([p["step_time_s"]["p95"] for p in summary["plans"]])
    for i, (label, plans) in enumerate(_by_layout(summary["plans"]).items()):
        color = f"C{i}"
        gpus = [p["gpus"] for p in plans]
        q = {
            key: [p["step_time_s"][key] / size for p in plans]
            for key in ("p05", "p25", "p50", "p75", "p95")
        }
        lows += q["p05"]
        highs += q["p95"]
        ax.fill_between(
            gpus, q["p05"], q["p95"], color=color, alpha=0.18, label=f"{label}: 90% interval"
        )
        ax.fill_between(
            gpus, q["p25"], q["p75"], color=color, alpha=0.38, label=f"{label}: 50% interval"
        )
        ax.plot(gpus, q["p50"], color=color, marker="o", label=f"{label}: median")
        ideal = [p.get("ideal_step_time_s") for p in plans]
        if all(v is not None for v in ideal):
            ideal = [v / size for v in ideal]
            ax.plot(
                gpus, ideal, color=color, linestyle=":", label=f"{label}: ideal (no variability)"
            )
    ax.set_xscale("log")
    ax.set_xlabel("GPUs (log scale)")
    # step time growing by orders of magnitude flattens the small plans: switch to log y
    if lows and min(lows) > 0 and max(highs) / min(lows) > 20:
        ax.set_yscale("log")
        ax.set_ylabel(f"step time ({unit}, log scale)")
    else:
        ax.set_ylabel(f"step time ({unit})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # never over the data
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path, title)


def _time_axis(values: Sequence[float]) -> tuple[str, float]:
    """Unit (and its size in s) of a time axis, from the largest value it shows."""
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return duration_unit(max(finite)) if finite else ("s", 1.0)


def plot_answer(
    summary: Mapping, path: str | Path, *,
    title: str = "Step time and training time vs number of GPUs",
) -> Path:
    """The answer at a glance: step time (and training time, when forecast) against GPUs.

    Medians with 90 % intervals of a single step (p05–p95) and of the run's training time, in a
    readable unit. Several GPU counts of one layout are drawn as a line with a band over a log
    GPU axis; one plan, or plans at the same GPU count, as points with interval bars over their
    names, so a single plan is never one point on a log axis. Legends sit outside the axes.
    """
    plans = sorted(summary["plans"], key=lambda p: (p["gpus"], str(p.get("name", ""))))
    training = [p for p in plans if "training_time_s" in p]
    panels = [("step_time_s", "step time", plans)]
    if training:
        panels.append(("training_time_s", "training time", training))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 2.2, 4.2),
                             squeeze=False)
    gpu_counts = {p["gpus"] for p in plans}
    # a GPU axis only says something with several scales; otherwise one slot per plan
    scaling = len(gpu_counts) >= 2
    for ax, (key, label, chosen) in zip(axes[0], panels, strict=True):
        unit, size = _time_axis([p[key]["p95"] for p in chosen])
        if scaling:
            for i, (layout, group) in enumerate(_by_layout(chosen).items()):
                gpus = [p["gpus"] for p in group]
                med = [p[key]["p50"] / size for p in group]
                lo = [p[key]["p05"] / size for p in group]
                hi = [p[key]["p95"] / size for p in group]
                ax.fill_between(gpus, lo, hi, color=f"C{i}", alpha=0.25,
                                label=f"{layout}: 90% interval")
                ax.plot(gpus, med, color=f"C{i}", marker="o", label=f"{layout}: median")
            ax.set_xscale("log")
            ax.set_xlabel("GPUs (log scale)")
            ticks = sorted(gpu_counts)
            if len(ticks) <= 8:
                ax.set_xticks(ticks, [f"{g:,}" for g in ticks])
                ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            x = np.arange(len(chosen))
            med = np.array([p[key]["p50"] for p in chosen]) / size
            lo = np.array([p[key]["p05"] for p in chosen]) / size
            hi = np.array([p[key]["p95"] for p in chosen]) / size
            ax.errorbar(x, med, yerr=[med - lo, hi - med], fmt="o", color="C0", capsize=6,
                        markersize=7, label="median, 90% interval")
            ax.set_xticks(x, [f"{p.get('name', '')}\n{p['gpus']:,} GPUs" for p in chosen],
                          fontsize=8)
            ax.set_xlim(-0.6, len(chosen) - 0.4)
            ax.set_xlabel("plan")
        ax.set_ylabel(f"{label} ({unit})")
        top = max(p[key]["p95"] for p in chosen) / size
        ax.set_ylim(0, top * 1.12)  # from 0: the size of the spread reads against the whole
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 0.9))
    return _save(fig, path, title)


def plot_slowdown(
    summary: Mapping, path: str | Path, *, title: str = "Probability of slowdown vs number of GPUs"
) -> Path:
    """P(step time > x · ideal) against GPUs, one line per threshold x (and per layout)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    groups = _by_layout(summary["plans"])
    styles = ["-", "--", ":", "-."]
    for g, (label, plans) in enumerate(groups.items()):
        gpus = [p["gpus"] for p in plans]
        thresholds = list(plans[0].get("slowdown_probability", {}))
        for i, threshold in enumerate(thresholds):
            probs = [p["slowdown_probability"][threshold] for p in plans]
            name = f"x = {threshold}" + (f" ({label})" if len(groups) > 1 else "")
            ax.plot(
                gpus,
                probs,
                color=f"C{i}",
                linestyle=styles[g % len(styles)],
                marker="o",
                label=name,
            )
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("GPUs (log scale)")
    ax.set_ylabel("P(step time > x × baseline step time)")
    ax.legend(fontsize=8, title="slowdown threshold", loc="upper left",
              bbox_to_anchor=(1.01, 1.0))  # outside the axes: never over the data
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path, title)


def plot_breakdown(
    summary: Mapping, path: str | Path, *, title: str = "Mean step-time breakdown per plan"
) -> Path:
    """Stacked bars of mean compute, exposed communication, bubble and waiting per plan."""
    plans = sorted(summary["plans"], key=lambda p: (p["gpus"], str(p.get("name", ""))))
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.42 * max(len(plans), 1)))
    y = np.arange(len(plans))[::-1]
    left = np.zeros(len(plans))
    unit, size = _time_axis([sum(p["breakdown_s"].values()) for p in plans])
    for key, label, color in BREAKDOWN_PARTS:
        widths = np.array([p["breakdown_s"].get(key, 0.0) for p in plans], dtype=float) / size
        ax.barh(y, widths, left=left, color=color, label=label, height=0.7)
        left = left + widths
    ax.set_yticks(y, [f"{p.get('name', '')} ({p['gpus']} GPUs)" for p in plans], fontsize=8)
    ax.set_xlabel(f"mean time per step ({unit})")
    ax.set_ylabel("plan")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path, title)


def plot_pit_histogram(
    pits: dict[str, np.ndarray], path, *, bins: int = 10, title: str | None = None
):
    """Histogram of PIT values per method (flat = calibrated), written to ``path``
    (``bayesprism.checks.validate`` computes them)."""
    fig, axes = plt.subplots(
        1, len(pits), figsize=(3.2 * len(pits), 2.8), squeeze=False, sharey=True
    )
    for ax, (method, values) in zip(axes[0], pits.items(), strict=True):
        ax.hist(values, bins=bins, range=(0, 1), density=True, color="#4c72b0", edgecolor="white")
        ax.axhline(1.0, color="black", lw=1, ls="--")
        ax.set_title(method)
        ax.set_xlabel("PIT")
    axes[0][0].set_ylabel("density")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format=Path(path).suffix[1:] or "png",
                                               dpi=120))
    plt.close(fig)
    return path
