"""``bayesprism ingest PATH... -o table.parquet``: trace files → a Parquet trace table + summary.

``--statistics`` writes the statistics a fit needs instead (a statistics artifact,
:mod:`bayesprism.statistics`), with the files' SHA-256 and what was skipped;
``--engine dask [--scheduler ADDRESS]`` reads the files on a Dask cluster
(:mod:`bayesprism.ingest.distributed`); the table and the statistics are the same.
"""

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
        "ranks, nodes, steps, kernel classes, what was skipped and why. With --statistics, "
        "write what a fit needs instead: the sufficient statistics of kernel x GPU x step "
        "cells, the collective cells and the traced run's inventory, with every input "
        "file's SHA-256 and the skips; `bayesprism fit STATS.parquet` fits them without "
        "the traces (the same posterior).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="trace file, directory (searched recursively) or glob pattern")
    parser.add_argument("-o", "--output", required=True, metavar="TABLE.parquet",
                        help="Parquet file to write")
    parser.add_argument("--statistics", action="store_true",
                        help="write a statistics artifact (what `bayesprism fit` needs, with "
                        "the inputs' SHA-256 and skips) instead of the row table; Parquet "
                        "trace tables are accepted as inputs too")
    parser.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                        help="GPUs per node, to place ranks on nodes when traces name no host")
    add_layout_option(parser, "every run")
    add_columns_option(parser)
    parser.add_argument("--engine", choices=("embedded", "dask"), default="embedded",
                        help="embedded: this machine (worker processes, one per core); dask: "
                        "one task per file on a Dask cluster (pip install 'bayesprism[dask]')")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="with --engine dask: the Dask scheduler to run on (e.g. "
                        "tcp://head:8786; workers must see the files at the same paths); "
                        "default: a local cluster with one worker per core")
    parser.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                        help="a file that cannot be read fails the whole ingest (--strict) or "
                        "is skipped and named with its reason in the summary (--no-strict); "
                        "default: strict with the embedded engine, not with dask")
    parser.add_argument("--skip-bad", dest="strict", action="store_false",
                        help="the same as --no-strict: ingest the rest and count what was skipped")
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
    if args.scheduler is not None and args.engine != "dask":
        raise InputError(Problem("command line", "--scheduler", "needs --engine dask",
                                 example=args.scheduler))
    check_outputs((args.output, "-o"))
    options = {"gpus_per_node": args.gpus_per_node, "column_map": parse_columns(args.columns),
               "layout": parse_layout_args(args.layout), "progress": not args.quiet,
               "strict": args.strict}
    if args.statistics:
        return _statistics(args, options)
    if args.engine == "dask":
        from bayesprism.ingest.distributed import dask_client

        with dask_client(scheduler=args.scheduler) as client:
            summary = ingest_to_parquet(args.paths, args.output, engine="dask", client=client,
                                        **options)
    else:
        summary = ingest_to_parquet(args.paths, args.output, **options)
    if args.json:
        print_json(summary)
    else:
        sys.stdout.write(f"wrote {args.output}\n{format_summary(summary)}\n")
    return 0


def _statistics(args: argparse.Namespace, options: dict) -> int:
    """``--statistics``: write the statistics artifact and print what it holds."""
    from bayesprism.statistics import ingest_statistics

    summary = ingest_statistics(args.paths, args.output, engine=args.engine,
                                scheduler=args.scheduler, **options)
    if args.json:
        print_json(summary)
        return 0
    skipped = summary["skipped"]
    lines = [
        f"wrote {summary['path']} ({summary['bytes'] / 1e6:,.2f} MB): statistics of "
        f"{summary['launches']:,} launches in {summary['kernel_cells']:,} kernel cells and "
        f"{summary['collective_cells']:,} collective cells (runs: "
        f"{', '.join(summary['runs'])})",
        f"inputs: {summary['files']} files, {summary['files_digested']} with SHA-256; input "
        f"digest {summary['input_digest']}",
        "skipped: " + ("nothing" if not skipped else "; ".join(
            f"{count:,} {reason}" for reason, count in skipped.items())),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
