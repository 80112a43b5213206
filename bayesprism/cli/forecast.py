"""``bayesprism forecast``: step-time and training-time forecasts of parallel plans."""

from __future__ import annotations

import argparse
import math
import warnings
from pathlib import Path

from bayesprism.cli._common import (
    add_common,
    check_counts,
    check_outputs,
    format_duration,
    format_interval,
    parse_duration,
    parse_number_list,
    print_json,
)
from bayesprism.errors import InputError, PlanError, Problem

#: Layout flags -> ParallelPlan fields.
LAYOUT_FLAGS = {
    "dp": int, "tp": int, "pp": int, "cp": int, "ep": int, "microbatches": int,
    "schedule": str, "sharding": str, "overlap": float, "gpus_per_node": int,
    "virtual_stages": int,
}


def register(sub) -> None:
    parser = sub.add_parser(
        "forecast",
        help="forecast step time and training time of parallel plans",
        description="Posterior predictive step time (median, 90% interval, P(slowdown)) of "
        "parallel plans from --plan files and/or layout flags (flags override every file's "
        "plans; without either, the traced plan is forecast).",
    )
    # optional for argparse only: ``--json POSTERIOR`` (the flag before it) is sorted out in run
    parser.add_argument("posterior", type=Path, nargs="?", default=None, metavar="POSTERIOR",
                        help="fitted posterior")
    parser.add_argument("--plan", type=Path, action="append", default=[], metavar="PLAN.toml",
                        help="plan file ([[plan]] tables or one plan); repeatable")
    parser.add_argument("--cluster", type=Path, default=None, metavar="CLUSTER.toml",
                        help="file with a [cluster] table (default: a plan file's [cluster])")
    for flag, kind in LAYOUT_FLAGS.items():
        if flag == "dp":
            # repeated flags add up (argparse would keep the last and drop the others)
            parser.add_argument("--dp", type=dp_values, action="extend", default=None,
                                metavar="DP[,DP...]",
                                help="data-parallel replicas; a comma-separated list (or the "
                                "flag repeated) forecasts each (a weak-scaling sweep, e.g. "
                                "--dp 2,8,32,128,512)")
            continue
        parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=kind, default=None)
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (for training time and --deadline)")
    parser.add_argument("--samples", type=float, default=None, metavar="N",
                        help="training samples instead of --steps: steps = N / --global-batch")
    parser.add_argument("--tokens", type=float, default=None, metavar="N",
                        help="training tokens instead of --steps: steps = N / (--global-batch "
                        "x --seq-length)")
    parser.add_argument("--global-batch", type=int, default=None, metavar="SAMPLES",
                        help="samples per step (global batch), with --samples or --tokens")
    parser.add_argument("--seq-length", type=int, default=None, metavar="TOKENS",
                        help="tokens per sample, with --tokens")
    parser.add_argument("--deadline", action="append", default=[], metavar="T[,T...]",
                        help="training-time budget for P(finish <= T), e.g. 36h, 14d, 90m or "
                        "seconds; comma-separated or repeated; needs --steps")
    parser.add_argument("--baseline", default="auto", metavar="auto|ideal|traced|TIME",
                        help="step time P(slowdown) is measured against: 'traced' (the median "
                        "measured step of the traced run), 'ideal' (each plan's "
                        "variability-free step), a time such as 250ms, or 'auto' (the "
                        "default: traced when the posterior records a measured step, else "
                        "ideal)")
    parser.add_argument("--thresholds", default="1.05,1.10,1.20", metavar="X[,X...]",
                        help="slowdown factors x of P(step > x * baseline), e.g. 1.1,1.5 or "
                        "10%%,50%% (default 1.05,1.10,1.20)")
    parser.add_argument("--draws", type=int, default=1000, help="posterior draws (default 1000)")
    parser.add_argument("--replicates", type=int, default=8, help="steps per draw (default 8)")
    parser.add_argument("--random-seed", "--seed", dest="random_seed", type=int,
                        default=0, help="random seed (default 0)")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="",
                        help="print the summary as one JSON object on stdout (instead of the "
                        "table); write it to a file with -o PATH.json")
    parser.add_argument("-o", "--output", type=Path, action="append", default=[],
                        metavar="PATH", help="write the summary as JSON (PATH.json) or save the "
                        "forecast DataTree (netCDF, any other name); repeatable")
    parser.add_argument("--include-draws", action="store_true",
                        help="add every step-time draw to the JSON")
    add_common(parser)
    parser.set_defaults(func=run)


def dp_values(text: str) -> list[int]:
    """``--dp``: one whole number or a comma-separated list of them.

    Examples
    --------
    >>> dp_values("2,8, 32")
    [2, 8, 32]
    """
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(
            f"expected a whole number or a comma-separated list of them, e.g. 2,8,32 (got "
            f"{text!r})")
    return values


def build_plans(args: argparse.Namespace, posterior=None) -> tuple[list, object]:
    """Plans and cluster from ``--plan`` files and layout flags (the traced plan otherwise);
    every plan once per ``--dp`` value."""
    from bayesprism.plan import Cluster, ParallelPlan

    flags = {k: getattr(args, k) for k in LAYOUT_FLAGS if getattr(args, k, None) is not None}
    dps = flags.pop("dp", None)
    dps = [None] if dps is None else [dps] if isinstance(dps, int) else list(dps)
    sweep = len(dps) > 1

    def variants(values: dict, source: str) -> list[ParallelPlan]:
        out = []
        for dp in dps:
            one = {**values, **flags, **({} if dp is None else {"dp": dp})}
            if sweep and "name" in one:
                one["name"] = f"{one['name']}-dp{dp}"
            out.append(ParallelPlan.from_dict(one, source=source))
        return out

    plans: list[ParallelPlan] = []
    clusters = []
    problems = []
    for path in args.plan:
        try:
            for plan in ParallelPlan.from_toml(path):
                if flags or dps != [None]:
                    plans.extend(variants(plan.to_dict(), f"{path} + flags"))
                else:
                    plans.append(plan)
            cluster = Cluster.from_toml(path)
            if cluster is not None:
                clusters.append(cluster)
        except PlanError as exc:
            problems.extend(exc.problems)
    if problems:
        raise PlanError(problems)
    if not args.plan:
        # flags change the traced layout (e.g. --dp 32: the same job on more replicas)
        values = _traced_plan_values(posterior) if posterior is not None else {}
        if flags or dps != [None]:
            values.pop("name", None)
        # the traced values were checked when the posterior was loaded: a bad value here
        # comes from the flags
        source = ("command line" if flags or dps != [None] or posterior is None
                  else f"{args.posterior} inventory.traced_plan")
        plans.extend(variants(values, source))
    if args.cluster is not None:
        cluster = Cluster.from_toml(args.cluster)
        if cluster is None:
            raise PlanError(Problem(str(args.cluster), "cluster", "no [cluster] table found"))
    elif len({repr(c) for c in clusters}) > 1:
        raise PlanError(Problem("--plan", "cluster", "plan files give different [cluster] "
                                "tables; pass one with --cluster"))
    else:
        cluster = clusters[0] if clusters else None
    return plans, cluster


def _traced_plan_values(posterior) -> dict:
    from bayesprism.posterior import traced_plan_values

    values = traced_plan_values(posterior)
    values.pop("world_size", None)  # the flags may change the degrees
    values.setdefault("name", "traced")
    return values


def format_table(summary: dict) -> str:
    """The answer per plan, in readable units: GPUs, step time (median and 90 % interval of a
    single step), training time (median and 90 % interval, with steps), P(slowdown > x) against
    the baseline and P(finish <= T) per deadline.

    Examples
    --------
    >>> plan = {"name": "dp8", "gpus": 8, "step_time_s": {"p50": 0.0193, "p05": 0.018,
    ...         "p95": 0.021}, "slowdown_probability": {"1.10": 0.25}}
    >>> print(format_table({"plans": [plan]}))  # doctest: +NORMALIZE_WHITESPACE
    plan  GPUs  step median  step 90%  P(>1.1x)
    dp8      8      19.3 ms  18–21 ms      0.25
    """
    plans = summary["plans"]
    thresholds = list(dict.fromkeys(k for p in plans for k in p["slowdown_probability"]))
    deadlines = list(dict.fromkeys(k for p in plans for k in p.get("finish_probability", {})))
    columns: list[tuple[str, str]] = [("plan", "<"), ("GPUs", ">"), ("step median", ">"),
                                      ("step 90%", "<")]
    training = any("training_time_s" in p for p in plans)
    if training:
        columns += [("steps", ">"), ("training median", ">"), ("training 90%", "<")]
    columns += [(f"P(>{_factor(k)}x)", ">") for k in thresholds]
    columns += [(f"P(<={_deadline(k)})", ">") for k in deadlines]
    rows = []
    for plan in plans:
        step = plan["step_time_s"]
        row = [plan["name"], str(plan["gpus"]), format_duration(step["p50"]),
               format_interval(step["p05"], step["p95"])]
        if training:
            train = plan.get("training_time_s")
            row += ([f"{plan['steps']:,}", format_duration(train["p50"]),
                     format_interval(train["p05"], train["p95"])] if train else ["-"] * 3)
        row += [_prob(plan["slowdown_probability"].get(k)) for k in thresholds]
        row += [_prob(plan.get("finish_probability", {}).get(k)) for k in deadlines]
        rows.append(row)
    widths = [max(len(name), *(len(r[i]) for r in rows)) for i, (name, _) in
              enumerate(columns)]
    lines = ["  ".join(f"{name:{align}{w}}" for (name, align), w in zip(columns, widths,
                                                                          strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(f"{cell:{align}{w}}" for cell, (_, align), w in
                               zip(row, columns, widths, strict=True)).rstrip())
    from bayesprism.forecast.forecasting import degraded_link_note

    link = degraded_link_note(plans)
    if link:
        lines.append(link)
    for plan in plans:
        if plan.get("extrapolated"):
            lines.append(f"{plan['name']}: by formula, not as traced: "
                         + "; ".join(plan["extrapolated"]))
    baseline = summary.get("baseline")
    if baseline and thresholds:
        lines.append(f"P(>x): P(step > x * baseline), baseline = {baseline_text(baseline)}")
    return "\n".join(lines)


def _factor(key: str) -> str:
    return f"{float(key):g}"


def _deadline(key: str) -> str:
    return format_duration(float(key)).replace(" ", "")


def _prob(p) -> str:
    return "-" if p is None else f"{p:.2f}"


def baseline_text(baseline: dict) -> str:
    """What P(slowdown) compares with, in words (``baseline_step_time``'s first value)."""
    kind = baseline.get("kind")
    if kind == "ideal":
        return "each plan's variability-free (ideal) step"
    value = format_duration(baseline.get("step_time_s"))
    return f"the measured step of the traced run ({value})" if kind == "traced" else value


def baseline_step_time(text: str, posterior, source: str = "posterior"
                       ) -> tuple[dict, float | None]:
    """``--baseline``: ``{"kind", "step_time_s"}`` and the value for ``forecast(baseline_s=)``
    (``auto``: ``traced`` where the posterior records a measured step, else ``ideal``).

    Raises
    ------
    InputError
        Not ``ideal``, ``traced`` or a duration; ``traced`` on a posterior without a measured
        step (see :func:`bayesprism.forecast.forecasting.traced_step_time_s`).
    """
    from bayesprism.forecast.forecasting import traced_step_time_s

    choice = text.strip().lower()
    if choice == "auto":
        # the measured step answers "slower than what we see today?"; against each plan's
        # variability-free step P(slowdown) reads ~1 for every plan and answers nothing
        try:
            return baseline_step_time("traced", posterior, source)
        except InputError:
            return baseline_step_time("ideal", posterior, source)
    if choice == "ideal":
        return {"kind": "ideal", "step_time_s": None}, None
    if choice == "traced":
        value = traced_step_time_s(posterior, source=source)
        return {"kind": "traced", "step_time_s": value}, value
    if not choice[:1].isdigit() and not choice.startswith("."):
        raise InputError(Problem("command line", "--baseline", "expected auto, ideal, traced "
                                 "or a step time such as 250ms or 1.2s", example=text))
    value = parse_duration(text, "--baseline")
    return {"kind": "given", "step_time_s": value}, value


def training_steps(args: argparse.Namespace) -> int | None:
    """``--steps``, or the steps that ``--samples``/``--tokens`` take at ``--global-batch``.

    Raises
    ------
    InputError
        Both steps and an amount, an amount without the batch, or values out of range.

    Examples
    --------
    >>> ns = argparse.Namespace(steps=None, samples=None, tokens=3e9, global_batch=1024,
    ...                         seq_length=2048)
    >>> training_steps(ns)
    1431
    """
    given = [name for name in ("steps", "samples", "tokens") if getattr(args, name) is not None]
    if len(given) > 1:
        raise InputError(Problem("command line", "--" + given[1], "give one of --steps, "
                                 "--samples and --tokens", example=getattr(args, given[1])))
    check_counts(("--global-batch", args.global_batch, 1, None),
                 ("--seq-length", args.seq_length, 1, None))
    if not given or given[0] == "steps":
        return args.steps
    amount = getattr(args, given[0])
    option = f"--{given[0]}"
    if not (math.isfinite(amount) and amount > 0):
        raise InputError(Problem("command line", option, "must be a positive number",
                                 example=amount))
    if args.global_batch is None:
        raise InputError(Problem("command line", "--global-batch", f"{option} needs the "
                                 "global batch (samples per step)"))
    per_step = args.global_batch
    if given[0] == "tokens":
        if args.seq_length is None:
            raise InputError(Problem("command line", "--seq-length", "--tokens needs the "
                                     "sequence length (tokens per sample)"))
        per_step *= args.seq_length
    return max(1, math.ceil(amount / per_step))


def output_paths(args: argparse.Namespace) -> tuple[bool, list[tuple[Path, str]]]:
    """Whether to print JSON on stdout, and the files to write as ``(path, option)``.

    ``--json`` is a flag. ``--json PATH`` is the spelling of earlier releases (a file): still
    written, with a ``FutureWarning``; ``--json POSTERIOR`` with no other positional is the flag
    before the posterior.

    Examples
    --------
    >>> ns = argparse.Namespace(posterior=None, json="post.nc", output=[Path("f.json")])
    >>> output_paths(ns), ns.posterior
    ((True, [(PosixPath('f.json'), '-o')]), PosixPath('post.nc'))
    """
    outputs = [(Path(path), "-o") for path in args.output]
    if args.json in (None, "-"):
        return args.json == "-", outputs
    if args.posterior is None:
        args.posterior = Path(args.json)
        return True, outputs
    warnings.warn(f"--json {args.json}: --json is a flag now (JSON on stdout); write the file "
                  f"with -o {args.json} (the path after --json works for one more release)",
                  FutureWarning, stacklevel=2)
    return False, [*outputs, (Path(args.json), "--json")]


def run(args) -> int:
    from bayesprism.forecast.forecasting import forecast, summarize_forecast
    from bayesprism.io import load, save

    to_stdout, outputs = output_paths(args)
    if args.posterior is None:
        raise InputError(Problem("command line", "POSTERIOR", "the fitted posterior is required"))
    check_counts(("--steps", args.steps, 1, None), ("--draws", args.draws, 1, None),
                 ("--replicates", args.replicates, 1, None))
    check_outputs(*outputs)
    steps = training_steps(args)
    thresholds = parse_number_list(args.thresholds, "--thresholds", lowest=0.0)
    deadlines = [t for text in args.deadline for part in text.split(",") if part.strip()
                 for t in [parse_duration(part, "--deadline")]]
    if deadlines and steps is None:
        raise InputError(Problem("command line", "--deadline", "needs --steps (or --samples/"
                                 "--tokens with --global-batch) to forecast training time",
                                 example=args.deadline[0]))
    posterior = load(args.posterior, expect="posterior")
    baseline, baseline_s = baseline_step_time(args.baseline, posterior, str(args.posterior))
    plans, cluster = build_plans(args, posterior)
    result = forecast(
        posterior,
        plans,
        steps=steps,
        draws=args.draws,
        replicates=args.replicates,
        random_seed=args.random_seed,
        baseline_s=baseline_s,
        deadlines_s=deadlines or None,
        thresholds=thresholds,
        progress=not args.quiet,
        cluster=cluster,
    )
    summary = {**summarize_forecast(result, include_draws=args.include_draws),
               "baseline": baseline, "thresholds": thresholds, "deadlines_s": deadlines}
    for path, option in outputs:
        if option == "--json" or path.suffix.lower() == ".json":
            print_json(summary, path)
        else:
            save(result, path)
    if to_stdout:
        print_json(summary)
        return 0
    print(format_table(summary))
    return 0
