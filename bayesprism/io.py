"""Save and load bayesprism artifacts (posteriors, forecasts) as netCDF DataTrees.

Files are written with h5netcdf to a temporary name in the target folder and renamed, so a crash
never leaves half a file (:func:`write_atomic`, also used for JSON and HTML outputs). ``load``
reads the whole tree into memory and closes the file, then checks that it is a bayesprism
artifact of the expected kind (posterior or forecast) and of the current artifact schema, that
it was not written by a newer major version, that its model kind agrees with its spec and
inventory and, when it carries a spec, that the spec's JSON still hashes to the recorded
``spec_hash``.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from bayesprism._version import __version__
from bayesprism.errors import ArtifactError, ArtifactWarning, Problem
from bayesprism.outputs import check_output_path, write_atomic, write_text_atomic
from bayesprism.plan import field_problems
from bayesprism.spec import ModelSpec

#: Version of the artifact layout (docs/artifacts.md); bumped when readers would break.
ARTIFACT_SCHEMA_VERSION = 1
ENGINE = "h5netcdf"
#: Artifact kinds :func:`load` tells apart, with the command that writes each.
ARTIFACT_KINDS: dict[str, str] = {"posterior": "bayesprism fit", "forecast": "bayesprism forecast"}
MODEL_KINDS: tuple[str, ...] = ("kernel", "step")
__all__ = [
    "artifact_kind",
    "check_artifact",
    "check_output_path",
    "load",
    "save",
    "write_atomic",
    "write_text_atomic",
]
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


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


def clean_attrs(tree: xr.DataTree) -> xr.DataTree:
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

    Examples
    --------
    >>> import bayesprism as bp
    >>> posterior = bp.fit(table, random_seed=0)  # doctest: +SKIP
    >>> bp.save(posterior, "posterior.nc")  # doctest: +SKIP
    PosixPath('posterior.nc')
    """
    path = Path(path)
    if not isinstance(posterior, xr.DataTree) or "bayesprism_version" not in posterior.attrs:
        raise ArtifactError(Problem(str(path), "bayesprism_version",
                                    "not a bayesprism artifact (DataTree with bayesprism attrs)",
                                    example=type(posterior).__name__))
    if not path.parent.is_dir():
        raise ArtifactError(Problem(str(path), "", "the folder does not exist"))
    tree = clean_attrs(posterior)
    return write_atomic(path, lambda tmp: tree.to_netcdf(tmp, engine=ENGINE))


def load(path: str | os.PathLike, expect: str | None = None) -> xr.DataTree:
    """Read an artifact written by :func:`save` into memory (the file is closed on return).

    Parameters
    ----------
    path
        The netCDF file.
    expect
        ``"posterior"`` or ``"forecast"``: refuse any other kind of artifact, naming what the
        file is and what was expected; ``None`` accepts either.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ArtifactError
        If ``path`` is a directory, the file is not netCDF, not a bayesprism artifact, not of
        the expected kind, of another artifact schema version or a newer major package
        version, its model kind disagrees with its spec or inventory, or its spec does not
        match its recorded hash.

    Examples
    --------
    >>> import bayesprism as bp
    >>> posterior = bp.load("posterior.nc", expect="posterior")  # doctest: +SKIP
    >>> bp.load("posterior.nc", expect="forecast")  # doctest: +SKIP
    Traceback (most recent call last):
    ...
    bayesprism.errors.ArtifactError: posterior.nc: artifact: ... expected a forecast
    """
    path = Path(path)
    what = f"a {expect} file (netCDF written by `{ARTIFACT_KINDS[expect]}`)" if expect \
        else "a posterior or forecast file (netCDF)"
    if path.is_dir():
        raise ArtifactError(Problem(str(path), "", f"is a directory, expected {what}"))
    if not path.exists():
        raise FileNotFoundError(2, "No such file", str(path))
    try:
        with xr.open_datatree(path, engine=ENGINE) as opened:
            tree = opened.load().copy()
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ArtifactError(Problem(str(path), "", f"cannot be read as netCDF ({exc}); "
                                    f"expected {what}")) from None
    check_artifact(tree, str(path), expect=expect)
    return tree


def artifact_kind(tree: xr.DataTree) -> str:
    """``"posterior"``, ``"forecast"`` or a short description of what else ``tree`` is."""
    if tree.attrs.get("artifact") == "forecast" or "step_time_s" in tree.ds:
        return "forecast"
    if "posterior" in tree.children:
        return "posterior"
    if not tree.children and not tree.ds.data_vars:
        return "file with attributes only (no data)"
    return "file with neither a 'posterior' group nor forecast draws"


def _major(text: object) -> int | None:
    match = _VERSION.match(str(text))
    return int(match.group(1)) if match else None


def check_package_version(written: object, source: str, stacklevel: int = 2) -> None:
    """Refuse an artifact written by a newer major version of bayesprism, or with no version.

    Warn (``ArtifactWarning``) when it was written by another version.

    Examples
    --------
    >>> check_package_version(__version__, "post.nc")
    >>> check_package_version("99.0", "post.nc")
    Traceback (most recent call last):
    ...
    bayesprism.errors.ArtifactError: post.nc: bayesprism_version: written by a newer major ...
    """
    written = str(written)
    if _major(written) is None:
        raise ArtifactError(Problem(source, "bayesprism_version", "is not a version number: "
                                    "the file was altered", example=written))
    if _major(written) > (_major(__version__) or 0):
        raise ArtifactError(Problem(source, "bayesprism_version",
                                    f"written by a newer major version; this is bayesprism "
                                    f"{__version__}: upgrade bayesprism", example=written))
    if written != __version__:
        warnings.warn(f"{source}: written by bayesprism {written}, read by {__version__}",
                      ArtifactWarning, stacklevel=stacklevel + 1)


def check_artifact(tree: xr.DataTree, source: str = "artifact", expect: str | None = None
                   ) -> None:
    """Refuse a tree that is not a current bayesprism artifact (see :func:`load`)."""
    attrs = tree.attrs
    if "bayesprism_version" not in attrs:
        raise ArtifactError(Problem(source, "bayesprism_version",
                                    "not a bayesprism artifact (the attribute is missing)"))
    found = artifact_kind(tree)
    if expect is not None and found != expect:
        writer = f" (written by `{ARTIFACT_KINDS[found]}`)" if found in ARTIFACT_KINDS else ""
        raise ArtifactError(Problem(source, "", f"is a {found}{writer}, expected a {expect} "
                                    f"(written by `{ARTIFACT_KINDS[expect]}`)"))
    check_package_version(attrs["bayesprism_version"], source, stacklevel=4)
    version = attrs.get("schema_version")
    version = version.item() if hasattr(version, "item") else version
    if version is None or str(version) != str(ARTIFACT_SCHEMA_VERSION):
        raise ArtifactError(Problem(source, "schema_version",
                                    f"artifact schema version {version!r} is not supported; this "
                                    f"bayesprism reads version {ARTIFACT_SCHEMA_VERSION}: refit "
                                    "with this version"))
    spec = None
    if "spec" in attrs:
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
        if "model_kind" in attrs and attrs["model_kind"] != spec.kind:
            raise ArtifactError(Problem(source, "model_kind",
                                        f"disagrees with the stored spec's kind {spec.kind!r}: "
                                        "the file was altered", example=attrs["model_kind"]))
    if found == "posterior":
        _check_posterior_attrs(tree, source, spec)


def _check_fit_record(tree: xr.DataTree, source: str, spec: ModelSpec | None) -> None:
    """Check the posterior group's record of the model against the root attrs and the spec.

    Its kind, its likelihood and its populations: an edited one would be used without a word
    otherwise.
    """
    record = tree["posterior"].attrs
    expected = {"model_kind": tree.attrs.get("model_kind", "kernel")}
    if spec is not None:
        expected["likelihood"] = spec.likelihood
        if expected["model_kind"] == "kernel":
            expected.update({f"{level}_population": spec.population(level)
                             for level in ("node", "gpu", "gpustep")})
    for key, value in expected.items():
        if key in record and str(record[key]) != str(value):
            raise ArtifactError(Problem(source, f"posterior.{key}",
                                        f"disagrees with the stored spec's {value!r}: the file "
                                        "was altered", example=record[key]))


def _check_posterior_attrs(tree: xr.DataTree, source: str, spec: ModelSpec | None = None
                           ) -> None:
    """Check a posterior's model kind, likelihood and inventory.

    Known values that agree with each other and with the stored spec.
    """
    kind = tree.attrs.get("model_kind", "kernel")
    if kind not in MODEL_KINDS:
        raise ArtifactError(Problem(source, "model_kind", f"unknown model kind; expected one of "
                                    f"{', '.join(MODEL_KINDS)}", example=kind))
    _check_fit_record(tree, source, spec)
    if "inventory" not in tree.children:
        return
    inventory = tree["inventory"].attrs
    if "kind" in inventory and inventory["kind"] != kind:
        raise ArtifactError(Problem(source, "inventory.kind",
                                    f"disagrees with model_kind {kind!r}: the file was altered",
                                    example=inventory["kind"]))
    raw = inventory.get("traced_plan")
    if raw is None or raw == "":
        return
    try:
        plan = json.loads(raw) if isinstance(raw, str) else raw
    except (ValueError, RecursionError) as exc:
        raise ArtifactError(Problem(source, "inventory.traced_plan",
                                    f"is not valid JSON ({exc}): the file was altered",
                                    example=str(raw)[:40])) from None
    if not isinstance(plan, dict):
        raise ArtifactError(Problem(source, "inventory.traced_plan",
                                    "is not a JSON object: the file was altered",
                                    example=str(raw)[:40]))
    problems = field_problems({k: v for k, v in plan.items() if v is not None},
                              f"{source} inventory.traced_plan")
    if problems:
        raise ArtifactError(problems)
