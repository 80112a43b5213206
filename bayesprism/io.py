"""Save and load bayesprism artifacts (posteriors, forecasts) as netCDF DataTrees.

Files are written with h5netcdf to a temporary name in the target folder and renamed, so a crash
never leaves half a file. ``load`` reads the whole tree into memory and closes the file, then
checks that it is a bayesprism artifact of the current artifact schema and, when it carries a
spec, that the spec's JSON still hashes to the recorded ``spec_hash``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import xarray as xr

from bayesprism.errors import ArtifactError, Problem

#: Version of the artifact layout (docs/artifacts.md); bumped when readers would break.
ARTIFACT_SCHEMA_VERSION = 1
ENGINE = "h5netcdf"


def _netcdf_attr(value):
    """An attribute value netCDF can store (bools → int, dicts/lists of mixed → JSON)."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value) or all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            return list(value) if value else ""
        return json.dumps(list(value), default=str)
    if value is None:
        return ""
    return value


def _clean_attrs(tree: xr.DataTree) -> xr.DataTree:
    """A copy of ``tree`` whose attrs (root, groups and variables) netCDF can store."""
    tree = tree.copy()
    for node in tree.subtree:
        node.attrs = {str(k): _netcdf_attr(v) for k, v in node.attrs.items()}
        for name in list(node.variables):
            var = node.variables[name]
            var.attrs = {str(k): _netcdf_attr(v) for k, v in var.attrs.items()}
    return tree


def save(posterior: xr.DataTree, path: str | os.PathLike) -> Path:
    """Write an artifact to ``path`` (netCDF, h5netcdf engine) atomically.

    Parameters
    ----------
    posterior
        A DataTree returned by ``bayesprism.fit`` (or a forecast); it must carry the root
        attribute ``bayesprism_version``.
    path
        Target file; its folder must exist.

    Returns
    -------
    pathlib.Path
        The written path.

    Raises
    ------
    ArtifactError
        If ``posterior`` is not a bayesprism DataTree.
    """
    path = Path(path)
    if not isinstance(posterior, xr.DataTree) or "bayesprism_version" not in posterior.attrs:
        raise ArtifactError(Problem(str(path), "bayesprism_version",
                                    "not a bayesprism artifact (DataTree with bayesprism attrs)",
                                    example=type(posterior).__name__))
    if not path.parent.is_dir():
        raise ArtifactError(Problem(str(path), "", "the folder does not exist"))
    tree = _clean_attrs(posterior)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        tree.to_netcdf(tmp, engine=ENGINE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(path: str | os.PathLike) -> xr.DataTree:
    """Read an artifact written by :func:`save` into memory (the file is closed on return).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ArtifactError
        If the file is not netCDF, not a bayesprism artifact, of another artifact schema
        version, or its spec does not match its recorded hash.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    try:
        with xr.open_datatree(path, engine=ENGINE) as opened:
            tree = opened.load().copy()
    except (OSError, ValueError) as exc:
        raise ArtifactError(Problem(str(path), "", f"cannot be read as netCDF: {exc}")) from None
    check_artifact(tree, str(path))
    return tree


def check_artifact(tree: xr.DataTree, source: str = "artifact") -> None:
    """Refuse a tree that is not a current bayesprism artifact (see :func:`load`)."""
    attrs = tree.attrs
    if "bayesprism_version" not in attrs:
        raise ArtifactError(Problem(source, "bayesprism_version",
                                    "not a bayesprism artifact (the attribute is missing)"))
    version = attrs.get("schema_version")
    version = version.item() if hasattr(version, "item") else version
    if version is None or str(version) != str(ARTIFACT_SCHEMA_VERSION):
        raise ArtifactError(Problem(source, "schema_version",
                                    f"artifact schema version {version!r} is not supported; this "
                                    f"bayesprism reads version {ARTIFACT_SCHEMA_VERSION}: refit "
                                    "with this version"))
    if "spec" in attrs:
        from bayesprism.spec import ModelSpec

        try:
            spec = ModelSpec.from_dict(json.loads(attrs["spec"]))
        except (ValueError, TypeError) as exc:
            raise ArtifactError(Problem(source, "spec", f"the stored spec is invalid: {exc}")) \
                from None
        recorded = attrs.get("spec_hash")
        if spec.spec_hash() != recorded:
            raise ArtifactError(Problem(source, "spec_hash",
                                        f"the stored spec hashes to {spec.spec_hash()}, not to "
                                        "the recorded hash: the file was altered",
                                        example=recorded))
