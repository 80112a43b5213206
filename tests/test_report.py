"""write_report(): one self-contained HTML file whose numbers match the JSON outputs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from posterior_builders import forecast_tree, truth_posterior

from bayesprism.checks.diagnostics import diagnose
from bayesprism.cli.main import main
from bayesprism.forecast.forecasting import summarize_forecast
from bayesprism.report.html import data_summary
from bayesprism.report.html import write_report as write
from bayesprism.report.sections import fmt_p, fmt_s

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
    # answer, trace, rank, ppc, variance, node, gpu, fan, breakdown, slowdown
    assert html.count("data:image/png;base64,") == 10


def test_forecast_numbers_match_the_summary_json(html, inputs):
    _, forecast, _ = inputs
    summary = summarize_forecast(forecast)
    assert len(summary["plans"]) == 4
    for plan in summary["plans"]:
        s = plan["step_time_s"]
        for key in ("p05", "p50", "p95", "p99", "mean"):
            assert f"<td>{fmt_s(s[key])}</td>" in html, (plan["name"], key)
        for threshold, p in plan["slowdown_probability"].items():
            assert f"<td>{fmt_p(p)}</td>" in html, (plan["name"], threshold)
        assert f"<td>{fmt_s(plan['breakdown_s']['wait'])}</td>" in html


def test_summary_is_hand_computable(inputs):
    _, forecast, _ = inputs
    summary = summarize_forecast(forecast)
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
    p50 = summarize_forecast(forecast)["plans"][0]["step_time_s"]["p50"]
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


# -- the answer first -----------------------------------------------------------------------------
def test_the_answer_opens_the_report_then_data_then_diagnostics(html, inputs):
    _, forecast, _ = inputs
    order = [html.index(f"id='{s}'") for s in ("answer", "data", "diagnostics", "forecast")]
    assert order == sorted(order)
    answer = html[order[0]:order[1]]
    # one figure, the table with units, P(slowdown) and P(finish) per deadline
    assert answer.count("data:image/png;base64,") == 1
    assert "P(finish ≤ 5.5 min)" in answer and "P(slowdown &gt; 1.05×)" in answer
    plan = summarize_forecast(forecast)["plans"][3]
    assert f"<td>{fmt_s(plan['step_time_s']['p50'])}</td>" in answer
    assert fmt_s(plan["step_time_s"]["p50"]).endswith(" ms")
    assert f"<td>{fmt_p(plan['finish_probability']['330'])}</td>" in answer
    # no seconds in scientific notation anywhere in the forecast tables
    assert not re.search(r"<td>-?\d\.\d+e[-+]\d+</td>", html)


def test_single_plan_report_draws_the_answer_without_a_gpu_axis(inputs, tmp_path):
    from figures import png_title

    fit, forecast, diagnosis = inputs
    one = forecast.to_dataset().isel(plan=[0])
    html = write(fit, tmp_path / "one.html", forecast=one, diagnosis=diagnosis).read_text()
    assert "id='answer'" in html and "dp12" in html
    # the fan and slowdown curves need several scales: the answer figure stands for them
    answer = html[html.index("id='answer'"):html.index("id='data'")]
    assert answer.count("data:image/png;base64,") == 1
    assert html.count("data:image/png;base64,") == 8
    from bayesprism.report import plots

    summary = summarize_forecast(one)
    path = plots.plot_answer(summary, tmp_path / "answer.png")
    assert png_title(path) == "Step time and training time vs number of GPUs"


def test_report_renders_in_a_headless_browser(html, tmp_path):
    """Chromium (Debian's package; .ci/run installs it) renders the report: every figure
    decodes and the answer table is on the first screen."""
    import shutil
    import subprocess

    browser = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                    if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    # a script appended to a copy reports, in the DOM the browser dumps, what it rendered
    probe = html.replace("</body>", """<script>
      const imgs = [...document.images];
      const table = document.querySelector('#answer + p + table');
      const box = table.getBoundingClientRect();
      const out = document.createElement('pre'); out.id = 'probe';
      out.textContent = JSON.stringify({images: imgs.length,
        decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
        tableBottom: box.bottom, viewport: window.innerHeight});
      document.body.appendChild(out);
    </script></body>""")
    page.write_text(probe, encoding="utf-8")
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    match = re.search(r"<pre id=\"probe\">(.*?)</pre>", result.stdout)
    assert match, result.stderr[-2000:]
    facts = json.loads(match.group(1).replace("&quot;", '"'))
    assert facts["images"] == 10 and facts["decoded"] == 10
    assert facts["tableBottom"] <= facts["viewport"]  # the answer table is on the first screen


def test_the_answer_names_what_each_plan_takes_from_formulas_and_degraded_links():
    from bayesprism.report.sections import section_answer

    step = {"p50": 0.4, "p05": 0.39, "p95": 0.43}
    plans = [{"name": "dp2", "gpus": 64, "step_time_s": step, "extrapolated": []},
             {"name": "dp32", "gpus": 1024, "step_time_s": step,
              "extrapolated": ["data-parallel allreduce over 32 ranks (traced 2)", "x < y"]}]
    answer = section_answer({"plans": plans}, {})
    assert ("<li>dp32: data-parallel allreduce over 32 ranks (traced 2); x &lt; y</li>"
            in answer)
    assert "dp2:" not in answer
    assert "By formula" not in section_answer({"plans": plans[:1]}, {})
    # and the chance of a degraded link the forecast includes, with where it comes from
    plans[0].update(degraded_link_probability=0.004, degraded_link="prior")
    plans[1].update(degraded_link_probability=0.2, degraded_link="prior")
    answer = section_answer({"plans": plans}, {})
    assert "P(a node with a degraded link), included above (from the prior" in answer
    assert "dp32 0.20." in answer and "dp2 " not in answer
