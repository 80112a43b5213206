"""Small helpers shared by the sub-command modules."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np


def add_common(parser) -> None:
    """Options every sub-command accepts."""
    parser.add_argument("--quiet", action="store_true", help="no progress bars or warnings")


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
