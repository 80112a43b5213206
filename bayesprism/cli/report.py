"""``bayesprism report POSTERIOR -o report.html``: one self-contained HTML report."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from bayesprism.cli._common import add_common


def register(subparsers) -> None:
    """Add the ``report`` sub-command."""
    parser = subparsers.add_parser(
        "report",
        help="write one self-contained HTML report of a fit and its forecasts",
        description="Write one HTML file (figures embedded, no network needed) with the data "
        "summary, fit diagnostics, variance decomposition, forecasts with intervals, slowdown "
        "probabilities and, when given, sensitivity and placement results.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("posterior", metavar="POSTERIOR", help="posterior file written by fit")
    parser.add_argument(
        "--forecast", metavar="FORECAST.nc", default=None, help="forecast file written by forecast"
    )
    parser.add_argument(
        "--sensitivity",
        metavar="S.json",
        default=None,
        help="output of `bayesprism sensitivity --json`",
    )
    parser.add_argument(
        "--placement", metavar="P.json", default=None, help="output of `bayesprism place --json`"
    )
    parser.add_argument(
        "--command",
        action="append",
        default=[],
        metavar="CMD",
        help="a command that produced the inputs, shown in the report (repeatable)",
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="report.html", help="HTML file to write"
    )
    add_common(parser)
    parser.set_defaults(func=run)


def read_json(path: str, option: str, required_key: str) -> dict:
    """Read a JSON object produced by another sub-command; bad files raise InputError."""
    from bayesprism.errors import InputError, Problem

    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(
            Problem(path, option, f"not UTF-8 text (byte {exc.start}: {exc.reason})")
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(
            Problem(path, option, f"not valid JSON ({exc.msg} at line {exc.lineno})")
        ) from None
    except RecursionError:
        raise InputError(Problem(path, option, "JSON nested too deeply to be a bayesprism "
                                 "output")) from None
    if not isinstance(value, dict) or required_key not in value:
        raise InputError(
            Problem(
                path,
                option,
                f"expected a JSON object with key {required_key!r}",
                example=type(value).__name__ if not isinstance(value, dict) else sorted(value)[:5],
            )
        )
    return value


def run(args: argparse.Namespace) -> int:
    """Load the inputs and write the report."""
    from bayesprism.cli.diagnose import load_artifact
    from bayesprism.outputs import check_output_path
    from bayesprism.report.html import write_report

    check_output_path(args.output, "-o")
    posterior = load_artifact(args.posterior, expect="posterior")
    forecast = load_artifact(args.forecast, expect="forecast") if args.forecast else None
    sensitivity = (
        read_json(args.sensitivity, "--sensitivity", "contributions") if args.sensitivity else None
    )
    placement = read_json(args.placement, "--placement", "assignment") if args.placement else None
    this_command = shlex.join(["bayesprism", *sys.argv[1:]]) if sys.argv[1:] else None
    commands = [*args.command, *([this_command] if this_command else [])]
    path = write_report(
        posterior,
        args.output,
        forecast=forecast,
        sensitivity=sensitivity,
        placement=placement,
        commands=commands,
    )
    if not args.quiet:
        sys.stdout.write(f"wrote {path}\n")
    return 0
