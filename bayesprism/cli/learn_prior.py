"""``bayesprism learn-prior``: learn the step model's layout-deviation and spike-growth priors
from several step-time ladders (``bayesprism.layout_prior``)."""

from __future__ import annotations

import argparse
import glob
from pathlib import Path

from bayesprism.cli._common import (
    add_common,
    add_sampler_options,
    check_counts,
    check_outputs,
    print_json,
)


def register(sub) -> None:
    parser = sub.add_parser(
        "learn-prior",
        help="learn the step model's layout-deviation prior from several ladders",
        description="Fit the step model to every run of each ladder (one model on one system "
        "at several scales) under flat priors and pool what they say about how far a layout "
        "deviates from the cost formula (config_sd) and how fast slow-step spikes grow with "
        "the node count (spike_slope). Writes the prior as JSON with its provenance; use it "
        "with '[step] layout_prior = \"FILE\"' in a spec.",
    )
    parser.add_argument("ladders", nargs="+", metavar="[NAME=]PATH",
                        help="one ladder per argument: a folder, file or glob of step-time "
                        "logs, optionally named (NAME=PATH); NAME defaults to the folder name")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="prior.json",
                        help="where to write the learned prior")
    parser.add_argument("--layout", action="append", default=[], metavar="NAME:KEY=VALUE",
                        help="a layout fact the logs of ladder NAME do not record (repeatable), "
                        "e.g. --layout gpt3:virtual_stages=12")
    add_sampler_options(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_common(parser)
    parser.set_defaults(func=run)


def parse_ladders(items: list[str], layout: list[str]) -> tuple[dict, dict]:
    """``[NAME=]PATH`` arguments and ``NAME:KEY=VALUE`` facts → ``({name: [path]}, facts)``.

    Raises
    ------
    InputError
        A ladder named twice, a missing path, or a fact that is not ``NAME:KEY=VALUE`` or
        names no ladder.

    Examples
    --------
    >>> parse_ladders(["a=.", "b=."], ["a:virtual_stages=12"])[1]
    {'a': {'virtual_stages': '12'}}
    """
    from bayesprism.errors import InputError, Problem

    ladders: dict[str, list[Path]] = {}
    problems = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = Path(item).resolve().name, item
        if not name or not path:
            problems.append(Problem("command line", "ladder", "expected [NAME=]PATH",
                                    example=item))
        elif name in ladders:
            problems.append(Problem("command line", "ladder", "names a ladder twice",
                                    example=name))
        elif not Path(path).exists() and not glob.glob(path):
            problems.append(Problem(path, "", "no such file or folder"))
        else:
            ladders[name] = [Path(path)]
    facts: dict[str, dict[str, str]] = {}
    for item in layout:
        name, sep, pair = item.partition(":")
        key, eq, value = pair.partition("=")
        if not sep or not eq or not key or not value:
            problems.append(Problem("command line", "--layout", "expected NAME:KEY=VALUE",
                                    example=item))
        elif name not in ladders and not problems:
            problems.append(Problem("command line", "--layout", "names no ladder",
                                    example=name))
        else:
            facts.setdefault(name, {})[key.strip()] = value.strip()
    if problems:
        raise InputError(problems)
    return ladders, facts


def _layout_values(facts: dict[str, dict[str, str]]) -> dict[str, dict]:
    """Facts as ``read_traces(layout=)`` takes them (checked and typed there)."""
    from bayesprism.ingest.layout import parse_layout_args

    return {name: parse_layout_args([f"{k}={v}" for k, v in pairs.items()])
            for name, pairs in facts.items()}


def run(args: argparse.Namespace) -> int:
    from bayesprism.learn_prior import learn_layout_prior

    check_counts(("--draws", args.draws, 1, None), ("--tune", args.tune, 1, None),
                 ("--chains", args.chains, 1, None))
    check_outputs((args.output, "--output"))
    ladders, facts = parse_ladders(args.ladders, args.layout)
    prior = learn_layout_prior(ladders, output=args.output, layout=_layout_values(facts),
                               draws=args.draws, tune=args.tune, chains=args.chains,
                               random_seed=args.random_seed, progress=not args.quiet)
    summary = {"output": str(args.output), **prior.summary()}
    if args.json:
        print_json(summary)
    elif not args.quiet:
        print(f"wrote {args.output}: config_sd median {summary['config_sd_median']:.4g} "
              f"(log sd {prior.config_sd_log_sd:.3g}), spike slope "
              f"{prior.spike_slope_mean:.3g} +- {prior.spike_slope_sd:.3g}, from "
              f"{len(prior.ladders)} ladder(s)")
    return 0
