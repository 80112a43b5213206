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
        Path(path).write_text(text + "\n")
