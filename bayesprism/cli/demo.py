"""``bayesprism demo``: the whole job on the shipped sample data.

ingest → fit → diagnose → forecast (several plans up to tens of thousands of GPUs) →
sensitivity (and placement, when the traces span several nodes) → one HTML report, for the
Kineto DLRM traces (kernel-level model); with ``--with-mlperf`` also for the MLPerf GPT-3 scale
ladder (step-level model, fitted on the two smallest scales). Each stage calls the public API and
writes its artifact into ``--out``; the commands a user would type are recorded in the report.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from bayesprism.cli._common import add_common, add_sampler_options, to_jsonable
from bayesprism.cli.forecast import baseline_step_time, baseline_text, format_table
from bayesprism.schema import select_runs

REPO_DATA = Path(__file__).resolve().parents[2] / "data"


def register(sub) -> None:
    p = sub.add_parser(
        "demo", help="run ingest → fit → diagnose → forecast → report on the sample data"
    )
    p.add_argument(
        "--data",
        type=Path,
        default=REPO_DATA,
        help="sample data folder (default: the repo's data/)",
    )
    p.add_argument("-o", "--output", "--out", dest="output", type=Path,
                   default=Path("out/demo"), help="output folder")
    # 4 chains: the max split R-hat over hundreds of parameters from 2 chains crosses 1.01 by
    # chance on well-mixed fits (measured on the DLRM fit: 1.014 on one seed in three)
    add_sampler_options(p, chains=4, random_seed=1)
    p.add_argument(
        "--forecast-draws", type=int, default=400, help="posterior draws used by forecasts"
    )
    p.add_argument(
        "--with-mlperf",
        action="store_true",
        help="also fit the step-level model on the MLPerf GPT-3 ladder (several minutes more)",
    )
    add_common(p)
    p.set_defaults(func=run)


class _Stage:
    """Prints one line per stage with its wall time, so a user sees progress."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __call__(self, text: str):
        return _Timed(text, self.quiet)


class _Timed:
    def __init__(self, text: str, quiet: bool):
        self.text, self.quiet = text, quiet

    def __enter__(self):
        self.t0 = time.perf_counter()
        if not self.quiet:
            print(f"==> {self.text} ...", flush=True)
        return self

    def __exit__(self, *exc):
        if not self.quiet and exc[0] is None:
            print(f"    done in {time.perf_counter() - self.t0:.1f} s", flush=True)
        return False


def _write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(to_jsonable(obj), indent=2) + "\n")
    return path


def run(args) -> int:
    import bayesprism as bp
    from bayesprism.forecast.forecasting import summarize_forecast
    from bayesprism.plan import ParallelPlan

    out: Path = args.output
    out.mkdir(parents=True, exist_ok=True)
    stage = _Stage(args.quiet)
    progress = not args.quiet
    fit_kw = dict(
        draws=args.draws, tune=args.tune, chains=args.chains, random_seed=args.random_seed,
        progress=progress,
    )
    commands: list[str] = []

    # --- Kineto: kernel-level model --------------------------------------------------------
    traces = args.data / "kineto" / "param_dlrm_8rank"
    with stage(f"ingest {traces}"):
        table = bp.read_traces([traces], progress=progress)
        bp.write_table(table, out / "dlrm_table.parquet")
    commands.append(f"bayesprism ingest {traces} -o {out / 'dlrm_table.parquet'}")

    with stage("fit the kernel-level model (nutpie)"):
        posterior = bp.fit(table, "default", **fit_kw)
        bp.save(posterior, out / "dlrm_posterior.nc")
    commands.append(
        f"bayesprism fit {out / 'dlrm_table.parquet'} -o {out / 'dlrm_posterior.nc'} "
        f"{'' if args.draws is None else f'--draws {args.draws} '}"
        f"{'' if args.tune is None else f'--tune {args.tune} '}"
        f"--chains {args.chains} "
        f"--random-seed {args.random_seed}"
    )

    with stage("diagnose"):
        diagnosis = bp.diagnose(posterior)
        _write_json(out / "dlrm_diagnosis.json", diagnosis.to_dict())
    commands.append(f"bayesprism diagnose {out / 'dlrm_posterior.nc'} --json")

    plans = [
        ParallelPlan(name=f"dp{dp}", dp=dp, gpus_per_node=8) for dp in (8, 64, 512, 4096, 16384)
    ]
    # P(slowdown) against the measured step of the traced run: against each plan's
    # variability-free step it reads ~1.00 everywhere and answers nothing
    baseline, baseline_s = baseline_step_time("auto", posterior)
    with stage(f"forecast {len(plans)} plans (8 to {plans[-1].gpus:,} GPUs)"):
        fc = bp.forecast(
            posterior,
            plans,
            steps=10_000,
            draws=args.forecast_draws,
            random_seed=args.random_seed,
            progress=progress,
            baseline_s=baseline_s,
        )
        summary = summarize_forecast(fc)
        _write_json(out / "dlrm_forecast.json", summary)
        bp.save(fc, out / "dlrm_forecast.nc")
    commands.append(
        f"bayesprism forecast {out / 'dlrm_posterior.nc'} --dp 16384 --gpus-per-node 8 "
        f"--steps 10000 --draws {args.forecast_draws} "
        f"--random-seed {args.random_seed}"
    )

    with stage("sensitivity at 512 GPUs"):
        sens = bp.sensitivity(
            posterior, plans[2], draws=min(args.forecast_draws, 200), random_seed=args.random_seed
        )
        _write_json(out / "dlrm_sensitivity.json", sens)
        # the plan as a file, so the command below runs as printed
        plan_file = out / "dlrm_plan_512.toml"
        plan_file.write_text(f'name = "{plans[2].name}"\ndp = {plans[2].dp}\n'
                             f"gpus_per_node = {plans[2].gpus_per_node}\n")
    commands.append(f"bayesprism sensitivity {out / 'dlrm_posterior.nc'} --plan {plan_file} "
                    "--json")
    placement = None
    if "node_effect" in posterior["posterior"]:
        with stage("placement and draining advice"):
            placement = bp.place(
                posterior, plans[0], draws=min(args.forecast_draws, 200),
                random_seed=args.random_seed)
            _write_json(out / "dlrm_placement.json", placement)
    elif not args.quiet:
        print(
            "    (placement skipped: the traced ranks ran on one node, so there are no measured "
            "node effects to place; `bayesprism place` needs a multi-node trace)"
        )

    with stage("report"):
        report = bp.write_report(
            posterior,
            out / "report.html",
            forecast=fc,
            diagnosis=diagnosis,
            sensitivity=sens,
            placement=placement,
            commands=commands,
        )

    # --- MLPerf: step-level model across scales ---------------------------------------------
    mlperf_report = None
    ladder = args.data / "mlperf"
    if args.with_mlperf and ladder.is_dir():
        with stage(f"ingest the MLPerf ladder in {ladder}"):
            steps_table = bp.read_traces([ladder], progress=progress)
        runs = steps_table.attrs["runs"]
        smallest = sorted({meta["world_size"] for meta in runs.values()})[:2]
        fit_runs = [run for run, meta in runs.items() if meta["world_size"] in smallest]
        with stage(f"fit the step-level model on the {smallest} GPU runs"):
            step_post = bp.fit(select_runs(steps_table, fit_runs), "step", **fit_kw)
            bp.save(step_post, out / "mlperf_posterior.nc")
        step_plans = _mlperf_plans(runs)
        with stage(f"forecast {len(step_plans)} MLPerf plans (up to {step_plans[-1].gpus:,} GPUs)"):
            step_fc = bp.forecast(
                step_post,
                step_plans,
                draws=args.forecast_draws,
                random_seed=args.random_seed,
                progress=progress,
            )
            _write_json(out / "mlperf_forecast.json", summarize_forecast(step_fc))
        with stage("MLPerf report"):
            mlperf_report = bp.write_report(
                step_post,
                out / "mlperf_report.html",
                forecast=step_fc,
                diagnosis=bp.diagnose(step_post),
                commands=[f"bayesprism fit {ladder} --spec step -o {out / 'mlperf_posterior.nc'}"],
            )

    if not args.quiet:
        # the answer: step and training time, P(slowdown) per plan of the traced DLRM job
        print("\n" + format_table(summary))
        print(f"P(>x): P(step > x * baseline), baseline = {baseline_text(baseline)}")
        print(f"\nReport: {report.resolve()}")
        if mlperf_report is not None:
            print(f"MLPerf report: {mlperf_report.resolve()}")
        print(f"All outputs: {out.resolve()}")
        if not diagnosis.ok:
            print("warning: the fit has problems:\n  " + "\n  ".join(diagnosis.problems))
    return 0


def _mlperf_plans(runs: dict) -> list:
    """Every logged layout of the ladder, plus 2x and 4x the largest one's data parallelism."""
    from bayesprism.plan import plan_from_run

    plans = sorted({plan_from_run(meta) for meta in runs.values()}, key=lambda p: p.gpus)
    largest = plans[-1]
    for factor in (2, 4):
        bigger = replace(largest, dp=largest.dp * factor, name=None)
        plans.append(replace(bigger, name=f"{bigger.gpus} GPUs"))
    return plans
