"""An ``xarray.Dataset`` as JSON and back, exactly: what a statistics artifact stores of the
traced run's inventory (:func:`bayesprism.inventory.kernel_inventory`).

Numeric arrays are stored as their little-endian bytes, zlib-compressed and base64-encoded
(the inventory's idle times are mostly NaN: 1.9 MB of floats become 0.1 MB on the dev traces),
so every value comes back bit for bit, NaN included; string (object) arrays as lists.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np
import xarray as xr


def _encode(values: np.ndarray) -> dict:
    values = np.asarray(values)
    if values.dtype.kind == "O" or values.dtype.kind == "U":
        return {"dtype": "str", "shape": list(values.shape),
                "values": [str(v) for v in values.ravel()]}
    little = values.astype(values.dtype.newbyteorder("<"), copy=False)
    return {"dtype": little.dtype.str, "shape": list(values.shape),
            "zlib": base64.b64encode(zlib.compress(np.ascontiguousarray(little).tobytes(), 6)
                                     ).decode("ascii")}


def _decode(entry: dict) -> np.ndarray:
    shape = tuple(int(n) for n in entry["shape"])
    if entry["dtype"] == "str":
        return np.array(list(entry["values"]), dtype=object).reshape(shape)
    raw = zlib.decompress(base64.b64decode(entry["zlib"], validate=True))
    values = np.frombuffer(raw, dtype=np.dtype(entry["dtype"])).reshape(shape)
    return values.astype(values.dtype.newbyteorder("="))


def dataset_to_json(ds: xr.Dataset) -> dict:
    """A JSON-able dict of ``ds``: variables and coordinates with their dims, and attrs.

    Examples
    --------
    >>> ds = xr.Dataset({"x": ("k", np.array([1.5, np.nan]))}, coords={"k": ["a", "b"]},
    ...                 attrs={"kind": "kernel"})
    >>> dataset_from_json(dataset_to_json(ds)).identical(ds)
    True
    """
    return {
        "coords": {str(name): {"dims": list(c.dims), **_encode(c.values)}
                   for name, c in ds.coords.items()},
        "data_vars": {str(name): {"dims": list(v.dims), **_encode(v.values)}
                      for name, v in ds.data_vars.items()},
        "attrs": dict(ds.attrs),
    }


def dataset_from_json(data: dict) -> xr.Dataset:
    """The dataset :func:`dataset_to_json` stored.

    Raises
    ------
    KeyError, ValueError, TypeError
        Not what :func:`dataset_to_json` writes.
    """
    coords = {name: (tuple(e["dims"]), _decode(e)) for name, e in data["coords"].items()}
    variables = {name: (tuple(e["dims"]), _decode(e)) for name, e in data["data_vars"].items()}
    return xr.Dataset(variables, coords=coords, attrs=dict(data["attrs"]))


__all__ = ["dataset_from_json", "dataset_to_json"]
