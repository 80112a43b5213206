"""Populations of new units: draws, tail quantiles and the max over units, against scipy.stats."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from scipy import stats

from bayesprism.forecast.population import draw_effects, population_family, population_quantile


def _posterior(family: str, **params) -> xr.Dataset:
    """A posterior Dataset with 2 chains x 3 draws of the given scalar parameters."""
    data = {
        name: (("chain", "draw"), np.asarray(v, dtype=float).reshape(2, 3))
        for name, v in params.items()
    }
    # every real posterior has chain/draw dims; a loading supplies them for the normal family
    data["node_scale"] = (("chain", "draw"), np.full((2, 3), 0.1))
    return xr.Dataset(data, attrs={"node_population": family})


NU = [2.5, 3.0, 5.0, 10.0, 30.0, 4.0]
W = [0.01, 0.02, 0.05, 0.1, 0.0, 0.3]
SHIFT = [3.0, 4.0, 2.0, 6.0, 1.0, 0.5]
SLOW_SD = [1.0, 8.0, 2.0, 30.0, 1.5, 4.0]  # degraded units spread out, up to 30 core sds
FAMILIES = ["normal", "student_t", "mixture", "degraded"]


def _family_posterior(family: str) -> xr.Dataset:
    return _posterior(family, node_nu=NU, node_slow_weight=W, node_slow_shift=SHIFT,
                      node_slow_sd=SLOW_SD)


def _reference_cdf(family: str, i: int):
    """SciPy's CDF of posterior draw ``i``'s population."""
    if family == "normal":
        return stats.norm().cdf
    if family == "student_t":
        return stats.t(NU[i]).cdf
    w, s = W[i], SHIFT[i]
    sd = SLOW_SD[i] if family == "degraded" else 1.0

    def cdf(x, w=w, s=s, sd=sd):
        return (1 - w) * stats.norm.cdf(x) + w * stats.norm.cdf(x, s, sd)

    return cdf


def test_family_is_read_from_attrs_and_missing_level_is_a_key_error():
    post = _posterior("student_t", node_nu=NU)
    assert population_family(post, "node") == "student_t"
    with pytest.raises(KeyError, match="gpu_population"):
        population_family(post, "gpu")
    bad = post.assign_attrs(node_population="cauchy")
    with pytest.raises(ValueError, match="cauchy"):
        population_family(bad, "node")


def test_datatree_is_accepted_with_family_on_root():
    post = _posterior("normal")
    tree = xr.DataTree.from_dict({"posterior": post.assign_attrs({})})
    tree.attrs["node_population"] = "normal"
    assert draw_effects(tree, "node", 4, np.random.default_rng(0)).shape == (6, 4)


@pytest.mark.parametrize("family", FAMILIES)
def test_draws_follow_each_posterior_draws_population(family):
    post = _family_posterior(family)
    rng = np.random.default_rng(1)
    z = draw_effects(post, "node", 40_000, rng)
    assert z.shape == (6, 40_000)
    for i in range(6):
        assert stats.kstest(z[i], _reference_cdf(family, i)).pvalue > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_quantile_inverts_cdf_and_matches_scipy(family):
    post = _family_posterior(family)
    q = np.array([0.01, 0.5, 0.9, 0.999, 1 - 1e-9])
    x = population_quantile(post, "node", q)
    assert x.shape == (6, 5)
    # each draw's CDF evaluated at that draw's own quantiles
    cdf = np.stack([_reference_cdf(family, i)(x[i]) for i in range(6)])
    assert np.allclose(cdf, q[None, :], rtol=0, atol=1e-10)
    if family == "student_t":
        expected = np.array([stats.t(nu).ppf(q) for nu in NU])
        assert np.allclose(x, expected, rtol=1e-8)
    if family == "normal":
        assert np.allclose(x, stats.norm.ppf(q)[None, :], rtol=1e-10)
