"""Reading back the figures of ``bayesprism.report.plots`` in tests."""

from __future__ import annotations

from pathlib import Path

from PIL import Image


def png_title(path: str | Path) -> str:
    """The title ``bayesprism.report.plots`` stores in a PNG's ``Title`` metadata."""
    with Image.open(path) as image:
        return str(image.text.get("Title", ""))
