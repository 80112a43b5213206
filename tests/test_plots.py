"""Every figure renders to a non-empty PNG carrying its title; big unit sets stay readable."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from figures import png_title
from PIL import Image
from posterior_builders import forecast_tree, truth_posterior

from bayesprism.checks.diagnostics import diagnose, worst_draws
from bayesprism.forecast.forecasting import summarize_forecast
from bayesprism.report import plots


@pytest.fixture(scope="module")
def fit_and_report():
    fit = truth_posterior(seed=1)
    return fit, diagnose(fit)


@pytest.fixture(scope="module")
def summary():
    return summarize_forecast(forecast_tree(seed=1))


def _check_png(path, title: str) -> None:
    assert path.exists() and path.stat().st_size > 5000
    assert png_title(path) == title
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size[0] > 300 and image.size[1] > 150


def test_trace_and_rank_plots(fit_and_report, tmp_path):
    fit, report = fit_and_report
    draws = worst_draws(fit, report, k=3)
    _check_png(
        plots.plot_trace(draws, tmp_path / "trace.png"),
        "Trace and marginal density of the worst-mixing parameters",
    )
    _check_png(
        plots.plot_rank(draws, tmp_path / "rank.png"), "Rank plots of the worst-mixing parameters"
    )


def test_variance_components_forest(fit_and_report, tmp_path):
    _, report = fit_and_report
    path = plots.plot_variance_components(report.variance_components, tmp_path / "sub" / "v.png")
    _check_png(path, "Variance components by kernel class and level")


def test_ppc_plot(fit_and_report, tmp_path):
    _, report = fit_and_report
    _check_png(
        plots.plot_ppc(report.ppc_values, report.ppc, tmp_path / "ppc.png"),
        "Posterior predictive check: cell mean duration per kernel class",
    )


def test_unit_effect_caterpillars(fit_and_report, tmp_path):
    _, report = fit_and_report
    _check_png(
        plots.plot_unit_effects(report.unit_effects["node"], tmp_path / "n.png"),
        "Node effects (90% and 50% intervals; slowest first)",
    )
    _check_png(
        plots.plot_unit_effects(report.unit_effects["gpu"], tmp_path / "g.png", level="gpu"),
        "GPU effects (90% and 50% intervals; slowest first)",
    )


def test_caterpillar_with_many_units_shows_only_the_extremes(tmp_path):
    rng = np.random.default_rng(0)
    median = np.sort(rng.normal(size=2000))[::-1]
    table = pd.DataFrame(
        {
            "unit": [f"node{i:04d}" for i in range(2000)],
            "mean": median,
            "q05": median - 0.3,
            "q25": median - 0.1,
            "q50": median,
            "q75": median + 0.1,
            "q95": median + 0.3,
        }
    )
    table["excludes_zero"] = (table["q05"] > 0) | (table["q95"] < 0)
    few = plots.plot_unit_effects(table.iloc[:30], tmp_path / "few.png", k=15)
    many = plots.plot_unit_effects(table, tmp_path / "many.png", k=15)
    with Image.open(few) as a, Image.open(many) as b:
        # 2000 units drawn as 30 rows plus a summary row: about the same height as 30 units
        assert b.size[1] < 1.15 * a.size[1]


def test_forecast_figures(summary, tmp_path):
    _check_png(
        plots.plot_forecast_fan(summary, tmp_path / "fan.png"),
        "Forecast step time vs number of GPUs",
    )
    _check_png(
        plots.plot_slowdown(summary, tmp_path / "slow.png"),
        "Probability of slowdown vs number of GPUs",
    )
    _check_png(
        plots.plot_breakdown(summary, tmp_path / "bd.png"), "Mean step-time breakdown per plan"
    )


def test_custom_title_is_used(summary, tmp_path):
    path = plots.plot_breakdown(summary, tmp_path / "bd.png", title="Where <the> time goes")
    assert png_title(path) == "Where <the> time goes"


# ------------------------------------------------------------------- legends never cover data
def _dense(xy: np.ndarray, per_segment: int = 40) -> np.ndarray:
    """Points along a polyline's segments (display coordinates), so that a segment crossing
    a legend counts, not only its vertices."""
    if len(xy) < 2:
        return xy
    t = np.linspace(0.0, 1.0, per_segment)[None, :, None]
    return (xy[:-1, None, :] * (1.0 - t) + xy[1:, None, :] * t).reshape(-1, 2)


def _points_under_legends(fig) -> list[str]:
    """What a legend covers, in display coordinates once laid out as saved: lines (along their
    segments) and markers, scatter points, filled bands (edges or interior) and bars."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [leg for ax in fig.axes if (leg := ax.get_legend()) is not None] + list(
        fig.legends)
    covered = []
    for legend in legends:
        box = legend.get_window_extent(renderer)
        probes = np.array([[box.x0, box.y0], [box.x1, box.y1], [box.x0, box.y1],
                           [box.x1, box.y0], [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]])
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            points, bands = [], 0
            for line in ax.get_lines():
                xy = np.asarray(line.get_xydata(), dtype=float)
                # reference lines (axhline/axvline: two points in axes coordinates) are not data
                if len(xy) <= 2 and line.get_marker() in ("None", None, ""):
                    continue
                xy = line.get_transform().transform(xy[np.isfinite(xy).all(axis=1)])
                points.append(_dense(xy) if line.get_linestyle() not in ("None", "") else xy)
            for coll in ax.collections:
                offsets = np.asarray(coll.get_offsets(), dtype=float)
                if offsets.size and len(offsets) > 1:
                    points.append(coll.get_offset_transform().transform(offsets))
                for path in coll.get_paths():
                    shape = path.transformed(coll.get_transform())
                    points.append(_dense(shape.vertices))
                    bands += bool(shape.contains_points(probes).any())
            inside = [p for p in points if len(p) and (
                (p[:, 0] > box.x0) & (p[:, 0] < box.x1)
                & (p[:, 1] > box.y0) & (p[:, 1] < box.y1)).any()]
            bars = [patch for patch in ax.patches
                    if patch.get_window_extent(renderer).overlaps(box)]
            if inside or bands or bars:
                covered.append(f"{ax.get_title() or ax.get_ylabel()}: {len(inside)} lines or "
                               f"point sets, {bands} bands, {len(bars)} bars")
    return covered


def test_legends_never_cover_data(fit_and_report, summary, tmp_path, monkeypatch):
    """Issue 19: every figure of the report, laid out as saved, keeps its legends off the
    plotted points, bands and bars."""
    saved = {}
    save = plots._save

    def capture(fig, path, title):
        saved[title] = _points_under_legends(fig)
        return save(fig, path, title)

    monkeypatch.setattr(plots, "_save", capture)
    fit, report = fit_and_report
    draws = worst_draws(fit, report, k=3)
    plots.plot_trace(draws, tmp_path / "trace.png")
    plots.plot_rank(draws, tmp_path / "rank.png")
    plots.plot_variance_components(report.variance_components, tmp_path / "v.png")
    plots.plot_ppc(report.ppc_values, report.ppc, tmp_path / "ppc.png")
    plots.plot_unit_effects(report.unit_effects["node"], tmp_path / "n.png")
    plots.plot_unit_effects(report.unit_effects["gpu"], tmp_path / "g.png", level="gpu")
    plots.plot_forecast_fan(summary, tmp_path / "fan.png")
    plots.plot_slowdown(summary, tmp_path / "slow.png")
    plots.plot_breakdown(summary, tmp_path / "bd.png")
    plots.plot_answer(summary, tmp_path / "answer.png")
    assert len(saved) == 10
    assert {title: covered for title, covered in saved.items() if covered} == {}
