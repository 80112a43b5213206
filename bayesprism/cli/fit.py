"""``bayesprism fit``: fit a model to trace tables, raw traces or a statistics artifact
(``bayesprism ingest --statistics``) and save the posterior."""

from __future__ import annotations

import argparse
import json
import math
import warnings
from pathlib import Path

import numpy as np

from bayesprism.cli._common import (
    add_columns_option,
    add_common,
    add_layout_option,
    add_sampler_options,
    check_outputs,
    parse_columns,
    print_json,
)
from bayesprism.errors import ConvergenceWarning, InputError, Problem
from bayesprism.spec import BUILTIN_SPECS


def register(sub) -> None:
    parser = sub.add_parser(
        "fit",
        help="fit a model to trace tables or raw traces",
        description="Fit the Bayesian model to Parquet trace tables (bayesprism ingest) and/or "
        "raw traces and logs, or to one statistics artifact (bayesprism ingest --statistics: "
        "the same posterior without the traces), save the posterior (netCDF) and print "
        "convergence and variance components (coefficient of variation per level, posterior "
        "median).",
    )
    parser.add_argument("inputs", nargs="+", metavar="TABLE_OR_TRACES",
                        help="Parquet trace tables, trace files, folders or globs, or one "
                        "statistics artifact (STATS.parquet)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="posterior.nc",
                        help="where to save the posterior")
    parser.add_argument("--spec", "--model", dest="spec", default=None, metavar="NAME|FILE",
                        help="named spec (" + ", ".join(sorted(BUILTIN_SPECS)) + "; "
                        "models/NAME.toml) or a spec TOML file (default: 'default', or 'step' "
                        "when every row is a step-level row; --model: its earlier name)")
    add_sampler_options(parser)
    parser.add_argument("--target-accept", type=float, default=None, metavar="P",
                        help="NUTS target acceptance rate in (0, 1); raise it (e.g. 0.95) "
                        "when the fit reports divergences (default: the model's, 0.8 or 0.9)")
    parser.add_argument("--sampler", choices=("auto", "nutpie", "pymc", "advi"), default="auto",
                        help="sampler (default auto: nutpie when installed)")
    parser.add_argument("--population-prior", type=Path, default=None, metavar="FLEET.nc",
                        help="a fitted posterior of the same fleet (e.g. of its per-GPU "
                        "benchmark): its node, GPU and GPU-step episode populations become "
                        "this fit's prior (kernel-level specs)")
    add_layout_option(parser, "every run of the inputs, raw traces and Parquet tables "
                      "alike")
    add_columns_option(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_common(parser)
    parser.set_defaults(func=run)


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{100 * value:.1f}%"


def run(args: argparse.Namespace) -> int:
    from bayesprism.checks.class_pattern import off_pattern_notes
    from bayesprism.checks.diagnostics import level_cvs
    from bayesprism.inference import convergence_summary, fit
    from bayesprism.ingest.layout import parse_layout_args
    from bayesprism.ingest.parquet import read_inputs
    from bayesprism.io import save
    from bayesprism.statistics import is_statistics_file, read_statistics

    problems = [Problem("arguments", f"--{name}", "must be a positive integer", example=value)
                for name, value in (("draws", args.draws), ("chains", args.chains))
                if value is not None and value < 1]
    if args.tune is not None and args.tune < 0:
        problems.append(Problem("arguments", "--tune", "must be >= 0", example=args.tune))
    if args.target_accept is not None and not 0 < args.target_accept < 1:
        problems.append(Problem("arguments", "--target-accept", "must be between 0 and 1 "
                                "(exclusive)", example=args.target_accept))
    if args.population_prior is not None and not args.population_prior.is_file():
        problems.append(Problem(str(args.population_prior), "--population-prior",
                                "no such file"))
    try:
        check_outputs((args.output, "-o"))
    except InputError as exc:
        problems.extend(exc.problems)
    try:
        layout = parse_layout_args(args.layout)
    except InputError as exc:
        problems.extend(exc.problems)
    try:
        column_map = parse_columns(args.columns)
    except InputError as exc:
        problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    progress = not args.quiet
    statistics = [p for p in args.inputs if is_statistics_file(p)]
    if statistics:
        _check_statistics_inputs(args, statistics)
        tables = read_statistics(statistics[0])
    else:
        tables = read_inputs(args.inputs, layout=layout, column_map=column_map,
                             progress=progress)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = fit(tables, args.spec, draws=args.draws, tune=args.tune, chains=args.chains,
                   sampler=args.sampler, random_seed=args.random_seed, progress=progress,
                   target_accept=args.target_accept, population_prior=args.population_prior)
        # a node or GPU its level cannot hold distorts the fit (or keeps it from converging)
        off_pattern = off_pattern_notes(tree)
        for note in off_pattern:
            warnings.warn(note, UserWarning, stacklevel=1)
    notes = [str(w.message) for w in caught
             if issubclass(w.category, ConvergenceWarning) or str(w.message) in off_pattern
             or str(w.message).startswith("every row is a step-level row")]
    path = save(tree, args.output)
    conv = convergence_summary(tree)
    components = level_cvs(tree)
    summary = {
        "path": str(path),
        "model_kind": tree.attrs["model_kind"],
        "sampler": tree.attrs["sampler"],
        "max_rhat": conv["max_rhat"],
        "min_ess_bulk": conv["min_ess_bulk"],
        "divergences": conv["divergences"],
        "seconds": tree.attrs["seconds"],
        "variance_components": components,
        "skipped": _fit_attr(tree, "skipped", {}),
        "notes": _fit_attr(tree, "notes", []),
        "warnings": notes,
    }
    if args.json:
        # JSON carries its warnings in "warnings"; stderr stays as it was (nothing)
        print_json(summary)
        return 0
    # the command's warning summary (bayesprism.cli.main) prints them once, with what to do
    for record in caught:
        warnings.warn_explicit(record.message, record.category, record.filename, record.lineno)
    print(f"saved {path} ({summary['model_kind']} model, sampler {summary['sampler']}, "
          f"{summary['seconds']:.1f} s)")
    print(f"max R-hat {conv['max_rhat']:.3f}, min bulk ESS {conv['min_ess_bulk']:.0f}, "
          f"divergences {conv['divergences']}")
    if components:
        levels = list(dict.fromkeys(k for v in components.values() for k in v))
        width = max(len(c) for c in components) + 2
        print("variance components (CV per level, posterior median):")
        print(" " * width + "".join(f"{lvl:>10}" for lvl in levels))
        for cls, values in components.items():
            print(f"{cls:<{width}}" + "".join(f"{_fmt(values.get(lvl)):>10}" for lvl in levels))
    for reason, count in summary["skipped"].items():
        print(f"skipped: {count:,} {reason}")
    for note in summary["notes"]:
        print(f"note: {note}")
    return 0


def _fit_attr(tree, name: str, empty):
    """What the model's preparation recorded under ``name`` (rows it could not fit, by reason;
    notes on how it fitted the rest), as ``bayesprism.io`` stores attrs: a dict as JSON, a list
    of strings as itself (one string, or ``""`` when empty)."""
    value = tree["posterior"].attrs.get(name, empty)
    if isinstance(value, str):
        value = (json.loads(value) if value.strip()[:1] in ("{", "[")
                 else [value] if value else empty)
    elif isinstance(value, (list, tuple, np.ndarray)):
        value = [str(v) for v in value]
    return value if isinstance(value, type(empty)) else empty


def _check_statistics_inputs(args: argparse.Namespace, statistics: list[str]) -> None:
    """A statistics artifact is fitted alone, as it was written (its layout is recorded)."""
    problems = []
    others = [p for p in args.inputs if p not in statistics[:1]]
    if others:
        problems.append(Problem(statistics[0], "inputs", "a statistics artifact is fitted on "
                                "its own: write one artifact of all the inputs with `bayesprism "
                                "ingest --statistics`", example=others[0]))
    for option, value in (("--layout", args.layout), ("--columns", args.columns)):
        if value:
            problems.append(Problem(statistics[0], option, "applies to traces and tables; a "
                                    "statistics artifact records the layout it was written "
                                    "with: give it to `bayesprism ingest --statistics`",
                                    example=value[0] if isinstance(value, list) else value))
    if problems:
        raise InputError(problems)
