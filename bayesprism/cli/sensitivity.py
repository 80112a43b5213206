"""``bayesprism sensitivity``: which kernel classes and levels of variability drive the tail."""

from __future__ import annotations

from pathlib import Path

from bayesprism.cli._common import add_common, check_counts, format_duration, print_json


def register(sub) -> None:
    parser = sub.add_parser(
        "sensitivity",
        help="rank sources of variability by their effect on p95 step time and P(slowdown)",
        description="Recompose the plan with each source of variability (kernel class x level: "
        "node, gpu, step, gpustep, residual; collective noise and congestion) removed and "
        "halved, with common random numbers, and rank the sources by how much p95 step time "
        "they cause. Intervals are 90% across posterior draws.",
    )
    add_plan_arguments(parser)
    parser.add_argument("--top", type=int, default=15, help="rows of the printed table")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print {base, contributions: [{factor, level, p95_delta_s, p95_delta_ci90, "
        "slowdown_p_delta, ..., halved}], ...} as JSON",
    )
    add_common(parser)
    parser.set_defaults(func=run)


def add_plan_arguments(parser) -> None:
    """Arguments shared with ``bayesprism place``: posterior, plan, cluster, draws, seed."""
    parser.add_argument("posterior", type=Path, metavar="POSTERIOR", help="fitted posterior (.nc)")
    parser.add_argument(
        "--plan", type=Path, required=True, metavar="PLAN.toml", help="plan file with one plan"
    )
    parser.add_argument(
        "--cluster",
        type=Path,
        default=None,
        metavar="CLUSTER.toml",
        help="file with a [cluster] table (default: the plan file's [cluster], if any)",
    )
    parser.add_argument("--draws", type=int, default=200, help="posterior draws used")
    parser.add_argument("--replicates", type=int, default=64, help="simulated steps per draw")
    parser.add_argument("--random-seed", "--seed", dest="random_seed", type=int,
                        default=0, help="seed of every composition")


def load_inputs(args):
    """Posterior, the one plan of ``--plan`` and the cluster (``--cluster`` or the plan file)."""
    from bayesprism.errors import PlanError, Problem
    from bayesprism.io import load
    from bayesprism.plan import Cluster, ParallelPlan

    check_counts(("--draws", args.draws, 1, None), ("--replicates", args.replicates, 1, None),
                 ("--drain", getattr(args, "drain", None), 0, None),
                 ("--top", getattr(args, "top", None), 1, None))
    plans = ParallelPlan.from_toml(args.plan)
    if len(plans) != 1:
        raise PlanError(
            Problem(str(args.plan), "plan", "give a file with exactly one plan", example=len(plans))
        )
    cluster = Cluster.from_toml(args.cluster if args.cluster is not None else args.plan)
    if args.cluster is not None and cluster is None:
        raise PlanError(Problem(str(args.cluster), "cluster", "no [cluster] table"))
    return load(args.posterior, expect="posterior"), plans[0], cluster


def _signed(seconds: float) -> str:
    """A signed duration in a readable unit, e.g. ``+1.2 ms``."""
    return ("-" if seconds < 0 else "+") + format_duration(abs(seconds))


def _interval(ci) -> str:
    return f"[{_signed(ci[0])}, {_signed(ci[1])}]"


def run(args) -> int:
    from bayesprism.analysis.sensitivity import sensitivity

    posterior, plan, cluster = load_inputs(args)
    result = sensitivity(
        posterior,
        plan,
        draws=args.draws,
        replicates=args.replicates,
        random_seed=args.random_seed,
        cluster=cluster,
        progress=not args.quiet,
    )
    if args.json:
        print_json(result)
        return 0
    print(format_table(result, plan.name, args.top))
    return 0


def format_table(result: dict, plan_name: str, top: int) -> str:
    """The printed report: base forecast, then the top sources by |p95 delta|."""
    base = result["base"]
    keys = list(base["slowdown_p"])
    lines = [
        f"plan {plan_name}: ideal {format_duration(base['ideal_step_time_s'])}, mean "
        f"{format_duration(base['mean_s'])}, p95 {format_duration(base['p95_s'])} "
        f"[{format_duration(base['p95_ci90'][0])}, {format_duration(base['p95_ci90'][1])}], "
        + ", ".join(f"P(>{float(k):g}x) {base['slowdown_p'][k]:.3f}" for k in keys),
        f"({result['draws']} draws x {result['replicates']} steps, seed {result['random_seed']}; "
        "deltas are what the source adds: with it minus without it)",
        "",
    ]
    header = f"{'factor':<16}{'level':<11}{'p95 delta':>13}  {'90% interval':<26}"
    header += "".join(f"{f'dP>{float(k):g}x':>10}" for k in keys) + f"{'halved p95':>13}"
    lines += [header, "-" * len(header)]
    shown = [e for e in result["contributions"] if e["composed"]]
    for entry in shown[:top]:
        row = f"{entry['factor']:<16}{entry['level']:<11}{_signed(entry['p95_delta_s']):>13}  "
        row += f"{_interval(entry['p95_delta_ci90']):<26}"
        row += "".join(f"{entry['slowdown_p_delta'][k]:>+10.3f}" for k in keys)
        row += f"{_signed(entry['halved']['p95_delta_s']):>13}"
        lines.append(row)
    if len(shown) > top:
        lines.append(f"... {len(shown) - top} more (use --top or --json)")
    flat = len(result["contributions"]) - len(shown)
    if flat:
        lines.append(f"({flat} sources have no spread in the posterior: their deltas are 0)")
    return "\n".join(lines)
