"""``bayesprism what-if``: a plan's step time under a set of changes (``bp.what_if``)."""

from __future__ import annotations

import argparse
import math
import tomllib
from pathlib import Path

from bayesprism.cli._common import add_common, format_duration, print_json
from bayesprism.cli.sensitivity import add_plan_arguments, load_inputs
from bayesprism.errors import InputError, Problem


def register(sub) -> None:
    parser = sub.add_parser(
        "what-if",
        help="forecast a plan under changes (faster kernels, links, draining, schedule)",
        description="Recompose the plan with the changes applied together (the same posterior "
        "draws and seed as the unchanged plan, so small differences are precise) and print "
        "mean, median, p95 step time and P(slowdown) before and after, with 90% intervals "
        "across posterior draws. Mirrors bayesprism.what_if.",
    )
    add_plan_arguments(parser)
    parser.add_argument("--faster", action="append", default=[], metavar="CLASS=X",
                        help="kernel class takes (1 - X) of its time, e.g. gemm=0.1 (repeatable)")
    parser.add_argument("--bandwidth", action="append", default=[], metavar="COLL[/TIER]=M",
                        help="multiply a collective's bus bandwidth, e.g. allreduce/inter=2")
    parser.add_argument("--latency", action="append", default=[], metavar="COLL[/TIER]=M",
                        help="multiply a collective's latency, e.g. allreduce=0.5")
    parser.add_argument("--drain", default=None, metavar="K|NODE[,NODE...]",
                        help="drain the K slowest measured nodes, or the named nodes")
    parser.add_argument("--schedule", default=None, help="pipeline schedule to use instead")
    parser.add_argument("--microbatches", type=int, default=None,
                        help="micro-batches per step to use instead")
    parser.add_argument("--changes", type=Path, default=None, metavar="CHANGES.toml",
                        help="changes as a TOML table (keys faster, bandwidth, latency, drain, "
                        "schedule, microbatches); flags add to it")
    parser.add_argument("--json", action="store_true", help="print bayesprism.what_if's result")
    add_common(parser)
    parser.set_defaults(func=run)


def _pairs(values: list[str], option: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for text in values:
        key, sep, number = (part.strip() for part in text.partition("="))
        try:
            value = float(number)
        except ValueError:
            value = math.nan
        if not sep or not key or not math.isfinite(value):
            raise InputError(Problem("command line", option, "expected NAME=NUMBER",
                                     example=text))
        out[key] = value
    return out


def build_changes(args: argparse.Namespace) -> dict:
    """The changes of ``--changes`` and the flags, as the mapping :func:`bayesprism.what_if` takes.

    Examples
    --------
    >>> ns = argparse.Namespace(changes=None, faster=["gemm=0.1"], bandwidth=[], latency=[],
    ...                         drain="2", schedule=None, microbatches=None)
    >>> build_changes(ns)
    {'faster': {'gemm': 0.1}, 'drain': 2}
    """
    changes: dict = {}
    if args.changes is not None:
        try:
            changes = tomllib.loads(Path(args.changes).read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError(Problem(str(args.changes), "", f"not a TOML file ({exc})")) from None
    for name in ("faster", "bandwidth", "latency"):
        given = _pairs(getattr(args, name), f"--{name}")
        if given:
            changes[name] = {**changes.get(name, {}), **given}
    if args.drain is not None:
        text = args.drain.strip()
        changes["drain"] = int(text) if text.isdigit() else [
            n.strip() for n in text.split(",") if n.strip()]
    if args.schedule is not None:
        changes["schedule"] = args.schedule
    if args.microbatches is not None:
        changes["microbatches"] = args.microbatches
    if not changes:
        raise InputError(Problem("command line", "changes", "give at least one change (--faster, "
                                 "--bandwidth, --latency, --drain, --schedule, --microbatches or "
                                 "--changes)"))
    return changes


def run(args) -> int:
    from bayesprism.analysis.what_if import what_if

    changes = build_changes(args)
    posterior, plan, cluster = load_inputs(args)
    result = what_if(posterior, plan, changes, draws=args.draws, replicates=args.replicates,
                     random_seed=args.random_seed, cluster=cluster)
    if args.json:
        print_json(result)
        return 0
    print(format_table(result, plan.name))
    return 0


def format_table(result: dict, plan_name: str) -> str:
    """Before, after and the change of mean, median and p95 step time and P(slowdown)."""
    base, changed = result["base"], result["changed"]
    lines = [f"plan {plan_name}, changes {result['changes']}"
             + (f", drained {', '.join(result['drained'])}" if result["drained"] else ""),
             f"{'':<14}{'before':>12}{'after':>12}{'change':>12}  {'90% interval':<22}"
             f"{'ratio':>8}"]
    for key, label in (("mean_s", "mean step"), ("p50_s", "median step"),
                       ("p95_s", "p95 step")):
        delta = result["deltas"][key]
        lo, hi = delta["ci90"]
        lines.append(
            f"{label:<14}{format_duration(base[key]):>12}{format_duration(changed[key]):>12}"
            f"{_signed(delta['estimate']):>12}  {_signed(lo) + ' to ' + _signed(hi):<22}"
            f"{result['relative'][key]['estimate']:>8.3f}")
    for k, delta in result["deltas"]["slowdown_p"].items():
        lo, hi = delta["ci90"]
        label = f"P(>{float(k):g}x ideal)"
        lines.append(f"{label:<14}{base['slowdown_p'][k]:>12.2f}{changed['slowdown_p'][k]:>12.2f}"
                     f"{delta['estimate']:>+12.2f}  {f'{lo:+.2f} to {hi:+.2f}':<22}")
    lines.append(f"({result['draws']} draws x {result['replicates']} steps, seed "
                 f"{result['random_seed']}; change = after - before per draw, negative is "
                 "faster)")
    return "\n".join(lines)


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + format_duration(abs(seconds))
