"""``bayesprism diagnose POSTERIOR``: can this fit be trusted? Convergence and predictive checks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bayesprism.cli._common import add_common, print_json

#: Exit code when ``--strict`` is given and the fit cannot be trusted (see cli/main.py).
EXIT_UNTRUSTED = 3


def register(subparsers) -> None:
    """Add the ``diagnose`` sub-command."""
    parser = subparsers.add_parser(
        "diagnose",
        help="convergence diagnostics and posterior predictive checks of a fit",
        description="Check a saved posterior: R-hat, bulk/tail ESS, divergences, BFMI, and "
        "posterior predictive checks against the traced run (per kernel class, and step time "
        "when the composition is available). Prints a verdict with what to do about each "
        "problem.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("posterior", metavar="POSTERIOR", help="posterior file written by fit")
    parser.add_argument(
        "-o", "--output", "--out",
        dest="output",
        metavar="DIR",
        default=None,
        help="write the diagnostic plots (PNG) into this directory",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument(
        "--strict",
        action="store_true",
        help=f"exit {EXIT_UNTRUSTED} when the fit cannot be trusted",
    )
    add_common(parser)
    parser.set_defaults(func=run)


def load_artifact(path: str | Path, expect: str | None = None):
    """Load a saved posterior or forecast with ``bayesprism.io.load``.

    Parameters
    ----------
    path
        The netCDF file.
    expect
        ``"posterior"`` or ``"forecast"``: any other kind of artifact is an error naming the
        file, what it is and what was expected.
    """
    from bayesprism.io import load

    return load(Path(path), expect=expect)


def write_plots(posterior, report, out_dir: str | Path) -> list[Path]:
    """Draw every diagnostic figure of ``report`` into ``out_dir``; returns the files."""
    from bayesprism.checks.diagnostics import worst_draws
    from bayesprism.report import plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if len(report.convergence):
        draws = worst_draws(posterior, report, k=4)
        written += [
            plots.plot_trace(draws, out / "trace.png"),
            plots.plot_rank(draws, out / "rank.png"),
        ]
    if report.ppc_values:
        written.append(plots.plot_ppc(report.ppc_values, report.ppc, out / "ppc.png"))
    if len(report.variance_components):
        written.append(
            plots.plot_variance_components(
                report.variance_components, out / "variance_components.png"
            )
        )
    for level, table in report.unit_effects.items():
        written.append(plots.plot_unit_effects(table, out / f"{level}_effects.png", level=level))
    return written


def format_report(report) -> str:
    """The human-readable summary printed by the command."""
    lines = [
        "fit OK: no problem found"
        if report.ok
        else f"fit NOT trustworthy: {len(report.problems)} problem(s)"
    ]
    bfmi = "n/a" if report.bfmi_min is None else f"{report.bfmi_min:.2f}"
    lines += [
        f"  max R-hat      {report.max_rhat:.3f}",
        f"  min ESS bulk   {report.min_ess_bulk:.0f}",
        f"  min ESS tail   {report.min_ess_tail:.0f}",
        f"  divergences    {report.divergences}",
        f"  min BFMI       {bfmi}",
    ]
    if report.ppc:
        lines.append("posterior predictive check (cell mean duration per kernel class):")
        for cls, v in report.ppc.items():
            lines.append(
                f"  {cls:<14} cells {v['n_cells']:>6}  KS {v['ks_distance']:.3f}  "
                f"50% cover {v['coverage_50']:.0%}  90% cover {v['coverage_90']:.0%}  "
                f"median obs/pred {v['observed_median_us']:.4g}/"
                f"{v['predicted_median_us']:.4g} µs"
            )
    if report.step_time_check:
        s = report.step_time_check
        lines.append(
            f"step time: observed median {s['observed_median_s']:.4g} s, predicted "
            f"{s['predicted_median_s']:.4g} s (90% interval {s['predicted_p05_s']:.4g}"
            f"–{s['predicted_p95_s']:.4g} s), 90% coverage {s['coverage_90']:.0%}"
        )
    lines += [f"problem: {p}" for p in report.problems]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Diagnose and print; exit 3 with ``--strict`` when the fit cannot be trusted."""
    from bayesprism.checks.diagnostics import diagnose
    from bayesprism.errors import InputError, Problem

    if args.output and Path(args.output).exists() and not Path(args.output).is_dir():
        raise InputError(Problem(str(args.output), "-o", "is a file; give a directory for "
                                 "the plots"))
    posterior = load_artifact(args.posterior, expect="posterior")
    report = diagnose(posterior)
    written = write_plots(posterior, report, args.output) if args.output else []
    if args.json:
        print_json({**report.to_dict(), "plots": [str(p) for p in written]})
    else:
        text = format_report(report)
        if written:
            text += f"\nwrote {len(written)} plots to {args.output}"
        sys.stdout.write(text + "\n")
    return EXIT_UNTRUSTED if args.strict and not report.ok else 0
