"""``bayesprism forecast``: step-time and training-time forecasts of parallel plans."""

from __future__ import annotations

import argparse
from pathlib import Path

from bayesprism.cli._common import add_common, check_counts, check_outputs, print_json
from bayesprism.errors import PlanError, Problem

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
    parser.add_argument("posterior", type=Path, metavar="POSTERIOR", help="fitted posterior")
    parser.add_argument("--plan", type=Path, action="append", default=[], metavar="PLAN.toml",
                        help="plan file ([[plan]] tables or one plan); repeatable")
    parser.add_argument("--cluster", type=Path, default=None, metavar="CLUSTER.toml",
                        help="file with a [cluster] table (default: a plan file's [cluster])")
    for flag, kind in LAYOUT_FLAGS.items():
        if flag == "dp":
            parser.add_argument("--dp", type=dp_values, default=None, metavar="DP[,DP...]",
                                help="data-parallel replicas; a comma-separated list forecasts "
                                "each (a weak-scaling sweep, e.g. --dp 2,8,32,128,512)")
            continue
        parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=kind, default=None)
    parser.add_argument("--steps", type=int, default=None, help="training steps")
    parser.add_argument("--draws", type=int, default=1000, help="posterior draws (default 1000)")
    parser.add_argument("--replicates", type=int, default=8, help="steps per draw (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT.json",
                        help="write the summary as JSON ('-' for stdout)")
    parser.add_argument("-o", "--output", type=Path, default=None, metavar="forecast.nc",
                        help="save the forecast DataTree (netCDF)")
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
    import json

    from bayesprism.plan import ParallelPlan

    raw = posterior["inventory"].attrs.get("traced_plan", "{}") if (
        "inventory" in posterior.children) else "{}"
    # bayesprism.io.load has checked that the JSON parses to an object
    traced = json.loads(raw or "{}") if isinstance(raw, str) else dict(raw)
    accepted = set(ParallelPlan.__dataclass_fields__) - {"source", "world_size"}
    values = {k: v for k, v in traced.items() if k in accepted and v is not None}
    values.setdefault("name", "traced")
    return values


def format_table(summary: dict) -> str:
    """Plan, GPUs, median and 90% interval of step time, P(slowdown > 5%, 10%)."""
    header = (f"{'plan':<32}{'GPUs':>8}{'median s':>12}{'90% interval s':>24}"
              f"{'P(>5%)':>9}{'P(>10%)':>9}")
    lines = [header]
    for plan in summary["plans"]:
        step = plan["step_time_s"]
        slow = plan["slowdown_probability"]
        interval = f"[{step['p05']:.4g}, {step['p95']:.4g}]"
        lines.append(
            f"{plan['name'][:31]:<32}{plan['gpus']:>8}{step['p50']:>12.4g}{interval:>24}"
            f"{_fmt(slow.get('1.05')):>9}{_fmt(slow.get('1.10')):>9}"
        )
        if plan.get("degraded_link_probability", 0.0) >= 0.01:
            source = ("fitted" if plan.get("degraded_link") == "fitted" else
                      "from the prior: fit nccl-tests sweeps of several allocations to learn it")
            lines.append(f"{'':<32}{'':>8}  P(a node with a degraded link): "
                         f"{plan['degraded_link_probability']:.2f}, included above ({source})")
        if "training_time_s" in plan:
            train = plan["training_time_s"]
            lines.append(f"{'':<32}{'':>8}  training ({plan['steps']} steps): median "
                         f"{train['p50']:.4g} s, 90% [{train['p05']:.4g}, {train['p95']:.4g}]")
    return "\n".join(lines)


def _fmt(p) -> str:
    return "-" if p is None else f"{p:.3f}"


def run(args) -> int:
    from bayesprism.forecast import forecast, summarize_forecast
    from bayesprism.io import load, save

    check_counts(("--steps", args.steps, 1, None), ("--draws", args.draws, 1, None),
                 ("--replicates", args.replicates, 1, None))
    check_outputs((args.json, "--json"), (args.output, "-o"))
    posterior = load(args.posterior, expect="posterior")
    plans, cluster = build_plans(args, posterior)
    result = forecast(
        posterior,
        plans,
        steps=args.steps,
        draws=args.draws,
        replicates=args.replicates,
        random_seed=args.seed,
        progress=not args.quiet,
        cluster=cluster,
    )
    summary = summarize_forecast(result, include_draws=args.include_draws)
    if args.output is not None:
        save(result, args.output)
    if args.json is not None:
        print_json(summary, args.json)
        if str(args.json) == "-":
            return 0
    print(format_table(summary))
    return 0
