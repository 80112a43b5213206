"""``bayesprism validate``: score bayesprism and the baselines on held-out measurements."""

from __future__ import annotations

from pathlib import Path

from bayesprism.cli._common import (
    add_columns_option,
    add_common,
    add_layout_option,
    check_counts,
    check_outputs,
    parse_columns,
    print_json,
)


def register(sub) -> None:
    parser = sub.add_parser(
        "validate",
        help="score forecasts against held-out measurements (KS, coverage, CRPS, quantiles)",
        description="Fit the --fit data, predict the --heldout data, and print one row per "
        "method (bayesprism and the pooled and deterministic baselines) with the KS distance, "
        "the coverage of the 50% and 90% central intervals, the CRPS and the signed relative "
        "errors of the median and p95. With --split the held-out part is split off the --fit "
        "data (nodes/gpus/ranks: a random half of the units, steps: the second half of every "
        "run, scale: the larger half of the world sizes; see --fraction) and --heldout may be "
        "omitted.",
    )
    parser.add_argument("--fit", nargs="+", type=Path, required=True, metavar="PATH",
                        help="traces, logs or Parquet trace tables to fit")
    parser.add_argument("--heldout", nargs="+", type=Path, metavar="PATH",
                        help="traces, logs or Parquet trace tables to predict")
    parser.add_argument("--spec", "--model", dest="spec", default=None, metavar="NAME",
                        help="named model spec (default: 'default', or 'step' for step logs; "
                        "--model: its earlier name)")
    parser.add_argument("--split", choices=("nodes", "gpus", "ranks", "steps", "scale"),
                        help="split the held-out part off the --fit data")
    parser.add_argument("--fraction", type=float, default=None,
                        help="share of units held out by --split (default 0.5)")
    parser.add_argument("--methods", nargs="+", default=["bayesprism", "pooled", "deterministic"],
                        choices=("bayesprism", "pooled", "deterministic"),
                        help="methods to score (default: all three)")
    add_layout_option(parser, "every run of --fit and --heldout")
    add_columns_option(parser)
    parser.add_argument("--random-seed", "--seed", dest="random_seed", type=int,
                        default=0, help="seed of split, fit and draws")
    parser.add_argument("--draws", type=int, default=500,
                        help="posterior draws per chain, and predictive draws per observation")
    parser.add_argument("--json", action="store_true",
                        help="print {method: {ks, coverage_50, coverage_90, crps, p50_error, "
                        "p95_error}} as JSON")
    parser.add_argument("--pit", type=Path, default=None, metavar="PNG",
                        help="also write the PIT histogram of every method to this file")
    add_common(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from bayesprism.checks.metrics import METRICS
    from bayesprism.checks.validate import validate
    from bayesprism.errors import InputError, Problem
    from bayesprism.ingest.layout import parse_layout_args
    from bayesprism.ingest.parquet import read_inputs
    from bayesprism.report.plots import plot_pit_histogram

    if args.heldout is None and args.split is None:
        raise InputError(Problem("validate", "--heldout", "give --heldout PATH... or --split"))
    check_counts(("--draws", args.draws, 1, None))
    check_outputs((args.pit, "--pit"))
    layout = parse_layout_args(args.layout)
    columns = parse_columns(args.columns)
    progress = not args.quiet
    fit_tables = read_inputs(args.fit, layout=layout, column_map=columns, progress=progress)
    heldout = read_inputs(args.heldout, layout=layout, column_map=columns,
                          progress=progress) if args.heldout else None
    table = validate(fit_tables, heldout, spec=args.spec, split=args.split,
                     fraction=args.fraction, random_seed=args.random_seed, draws=args.draws,
                     methods=tuple(args.methods), progress=progress)
    if args.pit is not None:
        plot_pit_histogram(table.attrs["pit"], args.pit, title="PIT of held-out observations")
    if args.json:
        print_json({method: {m: row[m] for m in METRICS} for method, row in table.iterrows()})
        return 0
    unit = table.attrs.get("unit")
    print(f"held-out observations: {int(table['n_observed'].iloc[0])} ({unit})")
    for method, skipped in table.attrs.get("skipped", {}).items():
        for reason, count in skipped.items():
            if count:
                print(f"not scored for {method}: {count} ({reason})")
    if table.attrs.get("on_transfer"):
        print(f"collective launches scored on transfer_us (their waiting for peers belongs to "
              f"the step time): {table.attrs['on_transfer']}")
    print(table[list(METRICS)].to_string(float_format=lambda v: f"{v:.4g}"))
    if args.pit is not None:
        print(f"PIT histogram: {args.pit}")
    return 0
