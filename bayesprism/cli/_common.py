"""Small helpers shared by the sub-command modules."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np


def add_common(parser) -> None:
    """Options every sub-command accepts."""
    parser.add_argument("--quiet", action="store_true", help="no progress bars or warnings")


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
