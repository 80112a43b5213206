"""``bayesprism place``: assign measured nodes to pipeline stages and replicas, advise draining."""

from __future__ import annotations

from bayesprism.cli._common import add_common, format_duration, print_json
from bayesprism.cli.sensitivity import add_plan_arguments, load_inputs


def register(sub) -> None:
    parser = sub.add_parser(
        "place",
        help="place measured nodes on a plan's stages/replicas to minimise step time",
        description="Assign the measured nodes of the posterior (or of the cluster's node list) "
        "to the plan's node slots (Megatron-LM rank order: tp, cp, dp, pp) to minimise the "
        "expected or p95 step time; compare with random and worst placements and advise which "
        "nodes to drain.",
    )
    add_plan_arguments(parser)
    parser.add_argument("--objective", choices=("mean", "p95"), default="mean")
    parser.add_argument("--drain", type=int, default=0, metavar="K", help="advise K nodes to drain")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print {assignment, gain_vs_random, gain_vs_random_ci90, gain_vs_worst, drain, ...}",
    )
    add_common(parser)
    parser.set_defaults(func=run, draws=100, replicates=32)


def run(args) -> int:
    from bayesprism.analysis.placement import place

    posterior, plan, cluster = load_inputs(args)
    result = place(
        posterior,
        plan,
        objective=args.objective,
        drain=args.drain,
        cluster=cluster,
        draws=args.draws,
        replicates=args.replicates,
        random_seed=args.random_seed,
    )
    if args.json:
        print_json(result)
        return 0
    print(format_table(result, plan.name))
    return 0


def _where(position: dict) -> str:
    return "  ".join(f"{k} {position[k]}" for k in ("stage", "replica", "tp_group"))


def format_table(result: dict, plan_name: str) -> str:
    """The printed report: gains, the assignment (slowest nodes first) and the drain advice."""
    effect = result["node_effect_mean"]
    lo, hi = result["gain_vs_random_ci90"]
    wlo, whi = result["gain_vs_worst_ci90"]
    lines = [
        f"plan {plan_name}: optimised {result['objective']} step time "
        f"{format_duration(result['objective_s'])} (random "
        f"{format_duration(result['random_s'])}, worst {format_duration(result['worst_s'])})",
        f"gain vs random {result['gain_vs_random']:.4f} [{lo:.4f}, {hi:.4f}], "
        f"gain vs worst {result['gain_vs_worst']:.4f} [{wlo:.4f}, {whi:.4f}] "
        f"({result['draws']} draws, {result['compositions']} compositions)",
        "",
        f"{'node':<20}{'effect':>8}  {'slot':>5}  position",
    ]
    ordered = sorted(result["assignment"], key=lambda n: -effect.get(n, 0.0))
    for node in ordered:
        position = result["assignment"][node]
        lines.append(
            f"{node:<20}{effect.get(node, 0.0):>+8.2f}  {position['slot']:>5}  " + _where(position)
        )
    for node in result["spares"]:
        lines.append(f"{node:<20}{effect.get(node, 0.0):>+8.2f}  {'-':>5}  spare")
    if result.get("new_nodes"):
        lines.append(f"(+ {result['new_nodes']} new nodes drawn from the fitted population in "
                     "the other slots)")
    if result["drain_detail"]:
        lines += ["", "draining the slowest nodes (cumulative throughput per GPU vs not "
                  "draining; > 1 is better):"]
        for item in result["drain_detail"]:
            lo, hi = item["ci90"]
            verdict = "better" if item["improves"] else "no better"
            lines.append(
                f"  {item['node']:<20}{item['throughput_per_gpu_gain']:.4f} "
                f"[{lo:.4f}, {hi:.4f}]  dp {item['dp']}  {verdict}"
            )
        lines.append("advice: drain " + ", ".join(result["drain"]) if result["drain"] else
                     "advice: drain nothing (no drain improves throughput per GPU)")
    return "\n".join(lines)
