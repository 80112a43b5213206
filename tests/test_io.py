"""save/load of artifacts: round trip and refusals."""

from __future__ import annotations

import json

import pytest
import xarray as xr
from posterior_builders import fitted

from bayesprism.errors import ArtifactError
from bayesprism.io import load, save


def test_round_trip_keeps_groups_attrs_and_string_coordinates(tmp_path):
    tree, _ = fitted("pymc")
    path = save(tree, tmp_path / "post.nc")
    assert [p.name for p in tmp_path.iterdir()] == ["post.nc"]  # no temporary file left
    back = load(path)
    assert dict(back.attrs) == dict(tree.attrs)
    for group in ("posterior", "sample_stats", "constant_data", "inventory"):
        xr.testing.assert_allclose(back[group].to_dataset(), tree[group].to_dataset())
    inv = back["inventory"]
    assert list(inv["kernel"].values) == ["ew_b", "gemm_a", "nccl_ar"]
    assert list(inv["role"].values) == ["compute", "compute", "dp"]
    assert inv.attrs["traced_plan"] == tree["inventory"].attrs["traced_plan"]
    assert list(back["posterior"]["gpu_unit"].values) == ["n0/0", "n0/1", "n1/0", "n1/1"]
    assert back["posterior"].attrs["gpu_population"] == "normal"


def _altered(tree, tmp_path, **attrs):
    altered = tree.copy()
    altered.attrs = {**tree.attrs, **attrs}
    return save(altered, tmp_path / "altered.nc")


def test_load_refuses_other_schema_versions(tmp_path):
    tree, _ = fitted("pymc")
    path = _altered(tree, tmp_path, schema_version=99)
    with pytest.raises(ArtifactError, match="artifact schema version 99 is not supported"):
        load(path)


def test_load_refuses_a_spec_that_does_not_match_its_hash(tmp_path):
    tree, _ = fitted("pymc")
    spec = json.loads(tree.attrs["spec"])
    spec["gpu_population"] = "student_t"
    path = _altered(tree, tmp_path, spec=json.dumps(spec))
    with pytest.raises(ArtifactError, match="spec_hash: the stored spec hashes to"):
        load(path)


def test_load_refuses_foreign_files(tmp_path):
    plain = tmp_path / "plain.nc"
    xr.Dataset({"x": ("a", [1.0, 2.0])}).to_netcdf(plain, engine="h5netcdf")
    with pytest.raises(ArtifactError, match="not a bayesprism artifact"):
        load(plain)
    text = tmp_path / "text.nc"
    text.write_text("hello")
    with pytest.raises(ArtifactError, match="cannot be read as netCDF"):
        load(text)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.nc")
    with pytest.raises(ArtifactError, match="not a bayesprism artifact"):
        save(xr.DataTree(), tmp_path / "x.nc")
