"""Shared test configuration: cached PyTensor compilation, headless plots, data paths."""

from __future__ import annotations

import os
import shutil
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


#: Files of the dev traces in :func:`dev_subset` (all 64 are read by the slow tests only).
DEV_SUBSET = 8


@pytest.fixture(scope="module")
def dev_files(shared_data) -> list[Path]:
    """The simulated Megatron dev traces (64 rank files; skips when absent)."""
    folder = shared_data / "simulated" / "megatron-3d-dev" / "traces"
    if not folder.is_dir():
        pytest.skip("dev traces not present")
    return sorted(folder.iterdir())


@pytest.fixture(scope="module")
def dev_subset(dev_files, tmp_path_factory) -> Path:
    """The first :data:`DEV_SUBSET` files of the dev traces, in a folder of their own (one
    run)."""
    folder = tmp_path_factory.mktemp("dev") / "traces"
    folder.mkdir()
    for f in dev_files[:DEV_SUBSET]:
        shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="module")
def dask_client():
    """A Dask local cluster of 2 single-threaded worker processes, shared by the module."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as c:
        yield c
