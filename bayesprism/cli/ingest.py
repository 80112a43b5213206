"""``bayesprism ingest PATH... -o table.parquet``: trace files → a Parquet trace table + summary."""

from __future__ import annotations

import argparse
import sys

from bayesprism.cli._common import (
    add_columns_option,
    add_common,
    add_layout_option,
    check_outputs,
    parse_columns,
    print_json,
)


def register(subparsers) -> None:
    """Add the ``ingest`` sub-command."""
    parser = subparsers.add_parser(
        "ingest",
        help="read trace files (Kineto JSON, MLPerf logs, tables) into a Parquet trace table",
        description="Read trace files, directories or glob patterns (format recognised from "
        "the content) file by file into one Parquet trace table, and print a summary: runs, "
        "ranks, nodes, steps, kernel classes, what was skipped and why.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="trace file, directory (searched recursively) or glob pattern")
    parser.add_argument("-o", "--output", required=True, metavar="TABLE.parquet",
                        help="Parquet file to write")
    parser.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                        help="GPUs per node, to place ranks on nodes when traces name no host")
    add_layout_option(parser, "every run")
    add_columns_option(parser)
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON object")
    add_common(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Ingest and print the summary; bad input raises InputError (exit 2 in main)."""
    from bayesprism.errors import InputError, Problem
    from bayesprism.ingest.layout import parse_layout_args
    from bayesprism.ingest.parquet import ingest_to_parquet
    from bayesprism.ingest.summary import format_summary

    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise InputError(Problem("command line", "--gpus-per-node",
                                 f"must be >= 1, got {args.gpus_per_node}"))
    check_outputs((args.output, "-o"))
    summary = ingest_to_parquet(args.paths, args.output, gpus_per_node=args.gpus_per_node,
                                column_map=parse_columns(args.columns),
                                layout=parse_layout_args(args.layout), progress=not args.quiet)
    if args.json:
        print_json(summary)
    else:
        sys.stdout.write(f"wrote {args.output}\n{format_summary(summary)}\n")
    return 0
