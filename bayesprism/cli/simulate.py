"""``bayesprism simulate``: write synthetic multi-rank Kineto traces with known truth."""

from __future__ import annotations

from pathlib import Path

from bayesprism.cli._common import add_common, print_json


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="write synthetic Kineto traces (one file per rank) and truth.json",
        description="Write synthetic PyTorch-profiler traces of a data-parallel job from known "
        "parameters (DESIGN §5), one .pt.trace.json.gz per rank, plus truth.json.",
    )
    p.add_argument("--nodes", type=int, required=True, help="number of nodes")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs (ranks) per node")
    p.add_argument("--steps", type=int, required=True, help="profiled steps per rank")
    p.add_argument(
        "--degraded-nodes",
        type=int,
        default=0,
        help="nodes in the slow component of the node population (default 0)",
    )
    p.add_argument("--random-seed", "--seed", dest="random_seed", type=int,
                   default=0, help="random seed (default 0)")
    p.add_argument(
        "--kernels-per-step",
        type=int,
        default=200,
        help="GPU kernels per rank and step, collectives included (default 200)",
    )
    p.add_argument("-o", "--output", "--out", dest="output", type=Path, required=True,
                   help="output folder")
    p.add_argument("--json", action="store_true", help="print the truth as JSON")
    add_common(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from bayesprism.simulate import simulate

    truth = simulate(
        args.output,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        steps=args.steps,
        degraded_nodes=args.degraded_nodes,
        random_seed=args.random_seed,
        kernels_per_step=args.kernels_per_step,
        progress=not args.quiet,
    )
    if args.json:
        print_json(truth)
    elif not args.quiet:
        degraded = ", ".join(truth["degraded_nodes"]) or "none"
        print(
            f"wrote {len(truth['files'])} trace files and truth.json to {args.output} "
            f"(world size {truth['world_size']}, {len(truth['steps'])} steps, "
            f"degraded nodes: {degraded})"
        )
    return 0
