"""Shared test configuration: cached PyTensor compilation, headless plots, data paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
# Outside the checkout, so fresh clones on this machine (CI) reuse compiled models.
os.environ.setdefault("PYTENSOR_FLAGS", f"base_compiledir={_CACHE / 'bayesprism' / 'pytensor'}")
os.environ.setdefault("MPLBACKEND", "Agg")

SHARED_DATA = REPO.parent / "shared" / "data"
PACKAGE_DATA = REPO / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The public traces in ../shared/data (skips when this checkout has no shared/ beside it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def package_data() -> Path:
    """The sample data shipped in this repository's data/ folder."""
    return PACKAGE_DATA
