"""``bayesprism ingest PATH... -o table.parquet``: trace files → a Parquet trace table + summary."""

from __future__ import annotations

import argparse
import sys

from bayesprism.cli._common import add_common, print_json


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
    parser.add_argument("--layout", action="append", default=[], metavar="KEY=VALUE",
                        help="a layout fact the files do not record, applied to every run "
                        "(repeatable), e.g. --layout virtual_stages=12; keys: dp, tp, pp, cp, "
                        "ep, microbatches, virtual_stages, micro_batch_size, gpus_per_node, "
                        "schedule, sharding, overlap. Recorded with provenance 'user'.")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON object")
    add_common(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Ingest and print the summary; bad input raises InputError (exit 2 in main)."""
    from bayesprism.errors import InputError, Problem
    from bayesprism.ingest.dispatch import parse_layout_args
    from bayesprism.ingest.parquet import ingest_to_parquet
    from bayesprism.ingest.summary import format_summary

    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise InputError(Problem("command line", "--gpus-per-node",
                                 f"must be >= 1, got {args.gpus_per_node}"))
    layout = parse_layout_args(args.layout)
    summary = ingest_to_parquet(args.paths, args.output, gpus_per_node=args.gpus_per_node,
                                progress=not args.quiet)
    if layout:
        summary["runs"] = apply_layout_to_parquet(args.output, layout)
    if args.json:
        print_json(summary)
    else:
        sys.stdout.write(f"wrote {args.output}\n{format_summary(summary)}\n")
    return 0


def apply_layout_to_parquet(path, layout: dict) -> dict:
    """Set user-stated layout facts on every run of a written Parquet trace table.

    ``ingest_to_parquet`` streams files and writes the run metadata last; the rows are copied
    row group by row group (bounded memory) into a file whose metadata carries the runs with
    :func:`bayesprism.ingest.dispatch.apply_layout` applied, then renamed over ``path``.

    Returns
    -------
    dict
        The updated ``attrs["runs"]``.
    """
    import json
    from pathlib import Path

    import pyarrow.parquet as pq

    from bayesprism.ingest.dispatch import apply_layout
    from bayesprism.schema import ATTRS_KEY

    path = Path(path)
    source = pq.ParquetFile(path)
    meta = source.schema_arrow.metadata or {}
    attrs = json.loads(meta[ATTRS_KEY]) if ATTRS_KEY in meta else {}
    notes: list[str] = []
    attrs["runs"] = {run: apply_layout(run_meta, layout, notes)
                     for run, run_meta in (attrs.get("runs") or {}).items()}
    attrs["notes"] = [*attrs.get("notes", []), *dict.fromkeys(notes)]
    schema = source.schema_arrow.with_metadata({k: v for k, v in meta.items() if k != ATTRS_KEY})
    tmp = path.with_name(path.name + ".layout.tmp")
    try:
        with pq.ParquetWriter(tmp, schema, store_schema=False) as writer:
            for group in range(source.num_row_groups):
                writer.write_table(source.read_row_group(group).replace_schema_metadata(
                    schema.metadata))
            writer.add_key_value_metadata({ATTRS_KEY: json.dumps(attrs).encode()})
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return attrs["runs"]
