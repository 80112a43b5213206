"""write_report(): one self-contained HTML file whose numbers match the JSON outputs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from posterior_builders import forecast_tree, truth_posterior

from bayesprism.cli.main import main
from bayesprism.diagnostics import diagnose
from bayesprism.report import _summarize_forecast, data_summary, fmt_p, fmt_s, forecast_summary
from bayesprism.report import write_report as write

SENSITIVITY = {
    "contributions": [
        {
            "factor": "gemm",
            "level": "node",
            "p95_delta_s": 0.01234,
            "p95_delta_ci90": [0.01, 0.015],
            "slowdown_p_delta": {"0.05": 0.25, "0.1": 0.125},
        },
        {
            "factor": "allreduce<script>",
            "level": "step",
            "p95_delta_s": 0.0042,
            "p95_delta_ci90": [0.001, 0.007],
            "slowdown_p_delta": {"0.05": 0.05, "0.1": 0.0},
        },
    ]
}
PLACEMENT = {
    "assignment": {
        "node1": {"slot": 0, "ranks": [0, 7], "stage": 0, "replica": 0, "tp_group": 0},
        "node2": {"slot": 1, "ranks": [8, 15], "stage": 1, "replica": 0, "tp_group": 1},
    },
    "gain_vs_random": 1.0234,
    "gain_vs_random_ci90": [1.011, 1.035],
    "gain_vs_worst": 1.0721,
    "drain": ["node5"],
}


@pytest.fixture(scope="module")
def inputs():
    fit = truth_posterior(seed=2)
    forecast = forecast_tree(seed=2)
    return fit, forecast, diagnose(fit)


@pytest.fixture(scope="module")
def html(inputs, tmp_path_factory):
    fit, forecast, diagnosis = inputs
    path = tmp_path_factory.mktemp("report") / "out" / "report.html"
    written = write(
        fit,
        path,
        forecast=forecast,
        diagnosis=diagnosis,
        sensitivity=SENSITIVITY,
        placement=PLACEMENT,
        commands=[
            "bayesprism fit t.parquet -o fit.nc",
            "bayesprism forecast fit.nc --plans 'a&b' -o f.nc",
        ],
    )
    assert written == path
    return path.read_text(encoding="utf-8")


def test_report_has_every_section(html):
    for section in (
        "data",
        "diagnostics",
        "variance",
        "forecast",
        "slowdown",
        "sensitivity",
        "placement",
        "commands",
    ):
        assert f"id='{section}'" in html


def test_report_is_self_contained(html):
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    # trace, rank, ppc, variance, node, gpu, fan, breakdown, slowdown
    assert html.count("data:image/png;base64,") == 9


def test_forecast_numbers_match_the_summary_json(html, inputs):
    _, forecast, _ = inputs
    summary = forecast_summary(forecast)
    assert len(summary["plans"]) == 4
    for plan in summary["plans"]:
        s = plan["step_time_s"]
        for key in ("p05", "p50", "p95", "p99", "mean"):
            assert f"<td>{fmt_s(s[key])}</td>" in html, (plan["name"], key)
        for threshold, p in plan["slowdown_probability"].items():
            assert f"<td>{fmt_p(p)}</td>" in html, (plan["name"], threshold)
        assert f"<td>{fmt_s(plan['breakdown_s']['wait'])}</td>" in html


def test_fallback_summary_is_hand_computable(inputs):
    _, forecast, _ = inputs
    summary = _summarize_forecast(forecast)
    plan = summary["plans"][2]
    values = forecast["step_time_s"].isel(plan=2).to_numpy()
    assert plan["name"] == "dp768" and plan["gpus"] == 768 and plan["schedule"] == "1f1b"
    assert plan["step_time_s"]["p50"] == pytest.approx(np.median(values))
    # ci90: interval of the mean step time (row means over replicates)
    assert plan["step_time_s"]["ci90"] == pytest.approx(
        np.quantile(values.mean(axis=1), [0.05, 0.95])
    )
    assert plan["breakdown_s"]["compute"] == pytest.approx(
        forecast["compute_s"].isel(plan=2).mean().item()
    )
    assert set(plan["slowdown_probability"]) == {"1.05", "1.10", "1.20"}


def test_diagnostics_and_data_numbers_appear(html, inputs):
    fit, _, diagnosis = inputs
    assert f"<td>{diagnosis.max_rhat:.3f}</td>" in html
    assert "The fit passed every check." in html
    facts = data_summary(fit)
    assert facts["ranks"] == 12 and facts["nodes"] == 6 and facts["steps"] == 6
    assert facts["kernel_classes"] == ["allreduce", "attention", "gemm", "norm"]
    assert '<td class="t">allreduce, attention, gemm, norm</td>' in html
    row = diagnosis.variance_components.iloc[0]
    assert f"<td>{row.q50:.3g}</td>" in html


def test_sensitivity_placement_and_commands_are_escaped(html):
    assert "allreduce&lt;script&gt;" in html
    assert f"<td>{fmt_s(0.01234)}</td>" in html and f"<td>{fmt_p(0.25)}</td>" in html
    assert f"<td>{fmt_p(0.125)}</td>" in html and "P(slowdown &gt; 10%)" in html
    assert "1.023 (90% interval 1.011 – 1.035)" in html and "node5" in html
    assert '<td class="t">node2</td><td class="t">stage 1, replica 0, tp group 1</td>' in html
    assert "bayesprism forecast fit.nc --plans &#x27;a&amp;b&#x27; -o f.nc" in html


def test_report_without_forecast_or_extras(inputs, tmp_path):
    fit, _, diagnosis = inputs
    html = write(fit, tmp_path / "r.html", diagnosis=diagnosis).read_text()
    assert "id='diagnostics'" in html and "id='forecast'" not in html
    assert "id='sensitivity'" not in html and "No commands were recorded." in html


def test_cli_report(inputs, tmp_path, capsys):
    fit, forecast, _ = inputs
    fit.to_netcdf(tmp_path / "fit.nc")
    forecast.to_netcdf(tmp_path / "forecast.nc")
    (tmp_path / "s.json").write_text(json.dumps(SENSITIVITY))
    (tmp_path / "p.json").write_text(json.dumps(PLACEMENT))
    out = tmp_path / "report.html"
    code = main(
        [
            "report",
            str(tmp_path / "fit.nc"),
            "--forecast",
            str(tmp_path / "forecast.nc"),
            "--sensitivity",
            str(tmp_path / "s.json"),
            "--placement",
            str(tmp_path / "p.json"),
            "-o",
            str(out),
        ]
    )
    assert code == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    html = out.read_text()
    p50 = forecast_summary(forecast)["plans"][0]["step_time_s"]["p50"]
    assert f"<td>{fmt_s(p50)}</td>" in html
    assert "id='placement'" in html


def test_cli_report_rejects_bad_json(inputs, tmp_path, capsys):
    fit, _, _ = inputs
    fit.to_netcdf(tmp_path / "fit.nc")
    (tmp_path / "s.json").write_text("{not json")
    code = main(
        [
            "report",
            str(tmp_path / "fit.nc"),
            "--sensitivity",
            str(tmp_path / "s.json"),
            "-o",
            str(tmp_path / "r.html"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 's.json'}: --sensitivity: not valid JSON")
    assert not (tmp_path / "r.html").exists()
