"""Small helpers shared by the sub-command modules."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

# duration_unit, format_duration, format_interval: shared with the report (a lower layer)
from bayesprism.report.sections import duration_unit, format_duration, format_interval


def add_common(parser) -> None:
    """Options every sub-command accepts."""
    parser.add_argument("--quiet", action="store_true", help="no progress bars or warnings")


def add_sampler_options(parser: argparse.ArgumentParser, *, chains: int = 2,
                        random_seed: int = 0) -> None:
    """``--draws``, ``--tune``, ``--chains`` and ``--random-seed`` of the fits a command runs.

    Parameters
    ----------
    parser
        The sub-command's parser; the values land in ``args.draws``, ``args.tune`` (``None``:
        the model's, :func:`bayesprism.inference.default_length`), ``args.chains`` and
        ``args.random_seed``.
    chains, random_seed
        The command's defaults.
    """
    parser.add_argument("--draws", type=int, default=None,
                        help="draws per chain (default: the model's, 1000, or 1500 for models "
                             "of up to 1,000 coordinates under nutpie's low-rank mass matrix)")
    parser.add_argument("--tune", type=int, default=None,
                        help="warm-up per chain (default: the model's, 1000, or 600 for "
                             "models of up to 1,000 coordinates under nutpie's low-rank mass "
                             "matrix)")
    parser.add_argument("--chains", type=int, default=chains,
                        help=f"chains, 2 at a time on 2 cores (default {chains})")
    parser.add_argument("--random-seed", "--seed", dest="random_seed", type=int,
                        default=random_seed, metavar="SEED",
                        help=f"random seed (default {random_seed})")


def add_layout_option(parser: argparse.ArgumentParser, applies_to: str) -> None:
    """``--layout KEY=VALUE`` (repeatable), the same on every command that reads traces.

    Parameters
    ----------
    parser
        The sub-command's parser; the facts land in ``args.layout`` (a list of strings, checked
        by :func:`bayesprism.ingest.layout.parse_layout_args`).
    applies_to
        What the facts apply to, for the help text (e.g. ``"every run"``).
    """
    from bayesprism.ingest.layout import LAYOUT_KEYS

    parser.add_argument("--layout", action="append", default=[], metavar="KEY=VALUE",
                        help=f"a layout fact the inputs do not record, applied to {applies_to} "
                        "(repeatable), e.g. --layout virtual_stages=12; keys: "
                        f"{', '.join(LAYOUT_KEYS)}. Recorded with provenance 'user'.")


def add_columns_option(parser: argparse.ArgumentParser) -> None:
    """``--columns THEIRS=OURS`` (repeatable), the same on every command that reads tables.

    The pairs land in ``args.columns`` (strings, checked by :func:`parse_columns`).
    """
    parser.add_argument("--columns", action="append", default=[], metavar="THEIRS=OURS",
                        help="read the tables' column THEIRS as our column OURS (repeatable), "
                        "e.g. --columns dev_id=gpu --columns elapsed=duration_us; "
                        "THEIRS= (nothing after '=') drops the column")


def parse_columns(pairs: list[str]) -> dict[str, str | None] | None:
    """``--columns`` pairs as a column map ``{theirs: ours or None}`` (None: no pairs).

    Raises
    ------
    InputError
        One problem per pair that is not ``THEIRS=OURS``, names a column twice, or maps to a
        name that is neither a trace-table column nor a benchmark id (node, gpu, cabinet).

    Examples
    --------
    >>> parse_columns(["dev_id=gpu", "junk="])
    {'dev_id': 'gpu', 'junk': None}
    """
    from bayesprism.errors import InputError, Problem
    from bayesprism.schema import ALL_COLUMNS

    if not pairs:
        return None
    allowed = {*ALL_COLUMNS, "cabinet"}
    mapping: dict[str, str | None] = {}
    problems = []
    for pair in pairs:
        theirs, sep, ours = (part.strip() for part in pair.partition("="))
        if not sep or not theirs:
            problems.append(Problem("command line", "--columns", "expected THEIRS=OURS",
                                    example=pair))
        elif theirs in mapping:
            problems.append(Problem("command line", "--columns", "names a column twice",
                                    example=theirs))
        elif ours and ours not in allowed:
            problems.append(Problem("command line", "--columns", "OURS must be one of "
                                    f"{', '.join(sorted(allowed))}", example=ours))
        else:
            mapping[theirs] = ours or None
    if problems:
        raise InputError(problems)
    return mapping


def to_jsonable(obj):
    """Convert NumPy scalars/arrays and non-finite floats to plain JSON values."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def print_json(obj, path: str | Path | None = None) -> None:
    """Print ``obj`` as one JSON object (or write it to ``path``)."""
    text = json.dumps(to_jsonable(obj), indent=2)
    if path is None or str(path) == "-":
        sys.stdout.write(text + "\n")
    else:
        from bayesprism.outputs import write_text_atomic

        write_text_atomic(path, text + "\n")


def check_counts(*values: tuple[str, int | None, int, int | None]) -> None:
    """Refuse command-line numbers outside their allowed range, before any work starts.

    Parameters
    ----------
    values
        ``(option, value, lowest, highest)``; ``None`` values are skipped, ``highest`` may be
        ``None`` (no upper bound).

    Raises
    ------
    InputError
        One problem per value out of range, naming the option, the range and the value.

    Examples
    --------
    >>> check_counts(("--steps", 10, 1, None))
    """
    from bayesprism.errors import InputError, Problem

    problems = []
    for option, value, lowest, highest in values:
        if value is None:
            continue
        if value < lowest or (highest is not None and value > highest):
            allowed = f">= {lowest}" if highest is None else f"between {lowest} and {highest}"
            problems.append(Problem("command line", option, f"must be {allowed}",
                                    example=value))
    if problems:
        raise InputError(problems)


def check_outputs(*paths: tuple[str | Path | None, str]) -> None:
    """Refuse unwritable output paths (a directory, a missing folder) before any work starts.

    Parameters
    ----------
    paths
        ``(path, option)`` pairs; ``None`` paths and ``"-"`` (stdout) are skipped.

    Raises
    ------
    InputError
        One problem per unwritable path, naming the path and the option.
    """
    from bayesprism.errors import InputError
    from bayesprism.outputs import check_output_path

    problems = []
    for path, option in paths:
        if path is None or str(path) == "-":
            continue
        try:
            check_output_path(path, option)
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)


# -- durations: parsed from the command line, printed in a unit a person reads ---------------------

#: Unit suffixes accepted by :func:`parse_duration`, in seconds.
DURATION_UNITS: dict[str, float] = {
    "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
    "d": 86400.0, "w": 7 * 86400.0,
}
def parse_duration(text: str, option: str) -> float:
    """Seconds from ``"36h"``, ``"14d"``, ``"250ms"``, ``"90 min"`` or a bare number of seconds.

    Parameters
    ----------
    text
        A positive number with an optional unit (``us ms s m min h d w``).
    option
        The command-line option, for the error message.

    Raises
    ------
    InputError
        Not a positive finite number with a known unit.

    Examples
    --------
    >>> parse_duration("36h", "--deadline"), parse_duration("1.5e3", "--deadline")
    (129600.0, 1500.0)
    >>> parse_duration("250ms", "--baseline")
    0.25
    """
    from bayesprism.errors import InputError, Problem

    raw = text.strip().lower()
    number, unit = raw, "s"
    for suffix in sorted(DURATION_UNITS, key=len, reverse=True):
        # "1e3" ends in no unit; "3ms" must not be read as "3m" + "s"
        if raw.endswith(suffix) and raw[: -len(suffix)].strip():
            number, unit = raw[: -len(suffix)].strip(), suffix
            break
    try:
        value = float(number) * DURATION_UNITS[unit]
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(Problem("command line", option, "expected a positive duration such "
                                 "as 36h, 14d, 250ms or seconds", example=text))
    return value


def parse_number_list(text: str, option: str, *, lowest: float, exclusive: bool = True
                      ) -> list[float]:
    """Comma-separated numbers above ``lowest`` (a ``%`` suffix: ``10%`` is ``1.10``).

    Examples
    --------
    >>> parse_number_list("1.05, 10%", "--thresholds", lowest=1.0)
    [1.05, 1.1]
    """
    from bayesprism.errors import InputError, Problem

    values = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            # a slowdown given in percent is a factor over the baseline
            value = 1 + float(part[:-1]) / 100 if part.endswith("%") else float(part)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < lowest or (exclusive and value == lowest):
            raise InputError(Problem("command line", option, f"expected numbers above {lowest:g} "
                                     "(comma-separated; 10% means 1.10)", example=part))
        values.append(round(value, 12))
    if not values:
        raise InputError(Problem("command line", option, "expected at least one value",
                                 example=text))
    return values


__all__ = [
    "add_columns_option", "add_common", "add_layout_option", "check_counts", "check_outputs",
    "duration_unit", "format_duration", "format_interval", "parse_columns", "parse_duration",
    "parse_number_list", "print_json", "print_warnings", "summarize_warnings", "to_jsonable",
]


# -- warnings: gathered during a command, printed once at its end ----------------------------------

#: (phrase in the message or category name, what to do), most important first: the order of the
#: printed list. Messages matching none keep their place after these.
WARNING_ADVICE: tuple[tuple[str, str], ...] = (
    ("is left out", "give the plan's activation_bytes/gradient_bytes and layers (plan file) "
     "so this communication is costed, or read the forecast as a lower bound"),
    ("in a pattern of its own", "look at that unit's trace; to forecast the fleet without it, "
     "fit the other nodes' traces"),
    ("Only R-hat, and at most", "refit with --chains 4 (or another --random-seed); `bayesprism "
     "diagnose` names the coordinates"),
    ("sampled again from chain", "none needed: the posterior is the second sampling's, every "
     "chain in the higher mode; its convergence is checked as any fit's (docs/status.md)"),
    ("sit in different modes", "refit with --chains 4: chains that keep to different modes "
     "mean the model cannot tell the data's explanations apart (docs/status.md); read the "
     "forecast as a mixture of them"),
    ("ConvergenceWarning", "sample longer (--draws/--tune) or raise --target-accept (e.g. "
     "0.95); check with `bayesprism diagnose`"),
    ("slowdown cap", "the tail is extrapolated far beyond the measured units: measure more "
     "nodes, or read the high quantiles as a bound"),
    ("keep their traced duration", "give nccl-tests sweeps or message sizes so these "
     "collectives follow the cost model"),
    ("ArtifactWarning", "re-run `bayesprism fit` with this version to refresh the artifact"),
    ("IngestWarning", "check the inputs (`bayesprism ingest` prints what was skipped)"),
)



def summarize_warnings(caught) -> list[str]:
    """De-duplicated warning lines, most important first, each with what to do.

    A message that several plans raise (``"dp8: ... left out"``, ``"dp512: ... left out"``) is
    printed once with the plans listed.

    Parameters
    ----------
    caught
        ``warnings.WarningMessage`` records (``warnings.catch_warnings(record=True)``).

    Returns
    -------
    list of str
        One entry per distinct message (possibly two lines: the message and ``what to do``).

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     for plan in ("dp8", "dp64"):
    ...         warnings.warn(f"{plan}: TP communication is left out")
    >>> summarize_warnings(caught)[0].splitlines()[0]
    'dp8, dp64: TP communication is left out'
    """
    prefixed = re.compile(r"^([^\s:]+): (.+)$", re.DOTALL)
    groups: dict[tuple[str, str], list[str]] = {}
    for record in caught:
        message = " ".join(str(record.message).split())
        category = getattr(record.category, "__name__", "Warning")
        match = prefixed.match(message)
        who, text = (match.group(1), match.group(2)) if match else ("", message)
        names = groups.setdefault((category, text), [])
        if who not in names:
            names.append(who)

    def rank(item) -> int:
        (category, text), _ = item
        for i, (phrase, _) in enumerate(WARNING_ADVICE):
            if phrase in text or phrase == category:
                return i
        return len(WARNING_ADVICE)

    lines = []
    for (category, text), names in sorted(groups.items(), key=rank):
        who = ", ".join(n for n in names if n)
        if len(names) > 4 and all(names):
            who = f"{', '.join(names[:3])} and {len(names) - 3} more plans"
        line = f"{who}: {text}" if who else text
        index = rank(((category, text), names))
        if index < len(WARNING_ADVICE):
            line += f"\n    what to do: {WARNING_ADVICE[index][1]}"
        lines.append(line)
    return lines


def print_warnings(caught, file=None) -> None:
    """Print :func:`summarize_warnings` as a short list on stderr (nothing when empty).

    The list starts on a line of its own, after any progress bar has finished.
    """
    lines = summarize_warnings(caught)
    if not lines:
        return
    out = file or sys.stderr
    out.write(f"\nwarnings ({len(lines)}):\n")
    for line in lines:
        out.write(f"  - {line}\n")
    out.flush()
