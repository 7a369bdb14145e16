"""Clustered-patch simulator (chen2022 Def. 3.1) and the dispatch / ceiling metrics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import moestat as ms
from moestat.deep import metrics as mt
from moestat.simulators.clusters import ROLE_CENTER, ROLE_FEATURE, ROLE_FEATURE_NOISE, ROLE_NOISE, SETTINGS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def big():
    return ms.simulate_clusters(setting=1, n=20_000, reps=2, seed=11)


def _role_patch(data, role):
    idx = np.argmax(data.roles == role, axis=2)
    return np.take_along_axis(data.X, idx[..., None, None], axis=2)[:, :, 0]


def test_shapes_and_presets(big):
    assert big.X.shape == (2, 20_000, 4, 50)
    assert big.y.shape == big.cluster.shape == big.roles.shape[:2] == (2, 20_000)
    assert big.V.shape == big.C.shape == (2, 4, 50)
    for s, cfg in SETTINGS.items():
        c = ms.simulate_clusters(setting=s, n=10, seed=0).config
        assert (c.gamma, c.sigma_p, c.setting) == (cfg["gamma"], cfg["sigma_p"], s)
    assert not ms.simulate_clusters(setting=1, n=5, seed=0).config.alpha_gamma_equal
    assert ms.simulate_clusters(setting=3, n=5, seed=0).config.alpha_gamma_equal


def test_signals_orthonormal(big):
    E = np.concatenate([big.V, big.C], axis=1)
    np.testing.assert_allclose(E @ np.swapaxes(E, 1, 2), np.broadcast_to(np.eye(8), (2, 8, 8)), atol=1e-12)
    can = ms.simulate_clusters(setting=1, n=5, seed=0, basis="canonical")
    np.testing.assert_array_equal(np.concatenate([can.V[0], can.C[0]]), np.eye(50)[:8])


def test_patches_match_definition(big):
    rr = np.arange(2)[:, None]
    np.testing.assert_allclose(_role_patch(big, ROLE_FEATURE), (big.y * big.alpha)[..., None] * big.V[rr, big.cluster])
    np.testing.assert_allclose(_role_patch(big, ROLE_CENTER), big.beta[..., None] * big.C[rr, big.cluster])
    np.testing.assert_allclose(_role_patch(big, ROLE_FEATURE_NOISE),
                               (big.eps * big.gamma)[..., None] * big.V[rr, big.noise_cluster])
    assert (big.roles == ROLE_NOISE).sum(axis=2).max() == 1  # P - 3 = 1 Gaussian patch
    assert np.all(big.cluster != big.noise_cluster)
    for name, (lo, hi) in (("alpha", (0.5, 2)), ("beta", (1, 2)), ("gamma", (0.5, 3))):
        v = getattr(big, name)
        assert v.min() >= lo and v.max() <= hi


def test_label_rule(big):
    # y = sign <v_k, feature patch>, with k the cluster identified by the centre patch.
    feat, cent = _role_patch(big, ROLE_FEATURE), _role_patch(big, ROLE_CENTER)
    k_from_centre = np.einsum("rnd,rkd->rnk", cent, big.C).argmax(-1)
    np.testing.assert_array_equal(k_from_centre, big.cluster)
    rr = np.arange(2)[:, None]
    np.testing.assert_array_equal(np.sign(np.einsum("rnd,rnd->rn", feat, big.V[rr, k_from_centre])), big.y)


def test_label_and_cluster_frequencies(big):
    n = big.y.size
    # P(y=1) = 1/2 and P(eps=1) = 1/2: 4.5 binomial standard errors (two-sided p ~ 7e-6, fixed seed).
    se = np.sqrt(0.25 / n)
    assert abs((big.y == 1).mean() - 0.5) < 4.5 * se
    assert abs((big.eps == 1).mean() - 0.5) < 4.5 * se
    # (k, k') uniform over the K(K-1) = 12 ordered pairs: chi-square goodness of fit at level 1e-4.
    pairs = pd.crosstab(big.cluster.ravel(), big.noise_cluster.ravel()).to_numpy()
    obs = pairs[~np.eye(4, dtype=bool)]
    assert stats.chisquare(obs).pvalue > 1e-4
    # y independent of the cluster (chi-square independence test at level 1e-4).
    assert stats.chi2_contingency(pd.crosstab(big.cluster.ravel(), big.y.ravel())).pvalue > 1e-4


def test_noise_patch_law(big):
    xi = big.X[big.roles == ROLE_NOISE]  # (R*n, d): N(0, sigma_p^2/d I) with sigma_p = 1
    # E||xi||^2 = sigma_p^2 = 1; sd of ||xi||^2 is sqrt(2/d) per patch -> 5 se of the mean over 40,000 patches.
    sq = (xi ** 2).sum(axis=1)
    assert abs(sq.mean() - 1.0) < 5 * np.sqrt(2 / 50) / np.sqrt(sq.size)
    # <v_1, xi> ~ N(0, 1/d): Kolmogorov-Smirnov at level 1e-4.
    proj = xi[: big.n] @ big.V[0, 0]
    assert stats.kstest(proj, stats.norm(0, 1 / np.sqrt(50)).cdf).pvalue > 1e-4


def test_seed_streams_and_split():
    five = ms.simulate_clusters(setting=2, n=50, reps=5, seed=3)
    two = ms.simulate_clusters(setting=2, n=50, reps=2, seed=3)
    np.testing.assert_array_equal(five.X[:2], two.X)
    alone = ms.simulate_clusters(setting=2, n=50, seed=[five.seeds[3]])
    np.testing.assert_array_equal(alone.X[0], five.X[3])
    tr, te = five.split(30)
    assert tr.n == 30 and te.n == 20 and np.array_equal(tr.V, te.V)
    np.testing.assert_array_equal(te.y, five.y[:, 30:])
    assert five.select(1).X.shape == (1, 50, 4, 50)
    assert len(five.to_frame()) == 250


def test_explicit_parameters_and_signals():
    d = ms.simulate_clusters(None, n=100, seed=0, K=3, P=6, d=6, alpha=1.0, beta=(1, 1.5), gamma=1.0, sigma_p=0.0)
    assert d.X.shape == (1, 100, 6, 6) and d.config.setting is None
    assert np.all(d.alpha == 1.0)
    assert np.allclose(d.X[d.roles == ROLE_NOISE], 0.0)
    V, C = np.eye(6)[:3], np.eye(6)[3:]
    e = ms.simulate_clusters(None, n=10, seed=0, K=3, d=6, signals=(V, C))
    np.testing.assert_array_equal(e.V[0], V)
    assert ms.simulate_clusters(setting=1, n=5, seed=0, sigma_p=3.0).config.setting is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(P=3), "P >= 4"),
    (dict(K=4, d=7), "d >= 2K"),
    (dict(K=1, d=10), "K must be"),
    (dict(alpha=(-1, 2)), "alpha"),
    (dict(gamma="big"), "gamma"),
    (dict(sigma_p=-1.0), "sigma_p"),
    (dict(basis="sphere"), "basis"),
])
def test_bad_input(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ms.simulate_clusters(setting=1, n=10, seed=0, **kwargs)


def test_bad_setting_and_signals():
    with pytest.raises(ValueError, match="setting"):
        ms.simulate_clusters(setting=5, n=10)
    with pytest.raises(ValueError, match="orthonormal"):
        ms.simulate_clusters(None, n=10, K=2, d=4, signals=(np.ones((2, 4)), np.ones((2, 4))))
    with pytest.raises(ValueError, match="n_train"):
        ms.simulate_clusters(setting=1, n=10, seed=0).split(10)
    with pytest.raises(TypeError, match="n must be"):
        ms.simulate_clusters(setting=1, n=2.5)


# --- dispatch entropy against the paper's Tables 4-6 (and 11) ---------------------------------------

TABLE4 = [[0, 0, 0, 0, 0, 3971, 0, 0], [0, 0, 4009, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 4041],
          [0, 3979, 0, 0, 0, 0, 0, 0]]
TABLE5 = [[0, 0, 3971, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 4, 4005, 0], [8, 4, 4, 6, 0, 1304, 4, 2711],
          [3979, 0, 0, 0, 0, 0, 0, 0]]
TABLE6 = [[0, 630, 1629, 1298, 27, 87, 4, 296], [136, 1107, 1884, 651, 0, 0, 0, 231],
          [0, 594, 1976, 1471, 0, 0, 0, 0], [0, 377, 1480, 1891, 0, 0, 0, 231]]
TABLE11 = [[1374, 3745, 2999, 31882], [23470, 3335, 13182, 13], [833, 9405, 7723, 39]]


@pytest.mark.parametrize("table, expected", [(TABLE4, 0.0), (TABLE5, 0.0093), (TABLE6, 1.3146), (TABLE11, 0.4934)])
def test_dispatch_entropy_paper_tables(table, expected):
    # Values recomputed from the published counts; 4 decimals as published.
    assert round(float(mt.dispatch_entropy(np.array(table))), 4) == expected


def test_dispatch_entropy_batched_and_extremes():
    tables = np.stack([np.array(TABLE4), np.array(TABLE6)])
    np.testing.assert_allclose(mt.dispatch_entropy(tables), [0.0, mt.dispatch_entropy(np.array(TABLE6))])
    collapse = np.zeros((4, 8))
    collapse[:, 2] = [10, 20, 30, 40]
    p = np.array([10, 20, 30, 40]) / 100
    assert np.isclose(mt.dispatch_entropy(collapse), -(p * np.log(p)).sum())  # H(cluster): blind to collapse


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=12, max_size=12).filter(lambda v: sum(v) > 0),
       st.permutations(range(3)), st.permutations(range(4)))
def test_dispatch_entropy_is_conditional_entropy(counts, perm_k, perm_m):
    c = np.array(counts, dtype=float).reshape(3, 4)
    n = c.sum()
    brute = sum(c[:, m].sum() / n * stats.entropy(c[:, m]) for m in range(4) if c[:, m].sum() > 0)
    h = mt.dispatch_entropy(c)
    assert np.isclose(h, brute)
    assert np.isclose(mt.dispatch_entropy(c[list(perm_k)][:, list(perm_m)]), h)  # label-switching invariant
    assert -1e-12 <= h <= stats.entropy(c.sum(axis=1)) + 1e-12


def test_dispatch_counts_match_crosstab():
    rng = np.random.default_rng(0)
    k, m = rng.integers(0, 4, (3, 500)), rng.integers(0, 8, (3, 500))
    counts = mt.dispatch_counts(k, m, 4, 8)
    for r in range(3):
        ref = pd.crosstab(k[r], m[r]).reindex(index=range(4), columns=range(8), fill_value=0).to_numpy()
        np.testing.assert_array_equal(counts[r], ref)
    tab = mt.dispatch_table(counts)
    assert len(tab) == 3 * 32 and tab["count"].sum() == 1500
    with pytest.raises(ValueError, match="expert labels"):
        mt.dispatch_counts(k, m + 8, 4, 8)


# --- Theorem 4.1 --------------------------------------------------------------------------------------

def test_oracles_and_ceiling():
    data = ms.simulate_clusters(setting=3, n=20_000, seed=5)
    acc_pa = mt.accuracy(data.y, mt.patch_additive_oracle(data))[0]
    # The step predictor attains 7/8 up to noise crossings; 4 binomial se (se = 0.0023).
    assert abs(acc_pa - 0.875) < 4 * np.sqrt(0.875 * 0.125 / 20_000)
    assert mt.accuracy(data.y, mt.moe_oracle(data))[0] > 0.995
    assert mt.patch_additive_ceiling(data.config) == 0.875
    assert mt.patch_additive_ceiling(ms.simulate_clusters(setting=1, n=5, seed=0).config) is None
    chk = mt.ceiling_check([0.80, 0.875, 0.95], 16_000)
    assert chk["consistent"].tolist() == [True, True, False]


def test_orbit_margins_sum_to_zero_for_patch_additive():
    data = ms.simulate_clusters(setting=3, n=400, reps=2, seed=2)
    rng = np.random.default_rng(0)
    w = rng.normal(size=(50, 7))

    def cnn(X):  # an arbitrary patch-additive predictor: sum_p sum_j a_j tanh(<w_j, x_p> + 0.3)
        return (np.tanh(X @ w + 0.3) * np.arange(1, 8)).sum(axis=(-1, -2))

    m = mt.thm41_orbit_margins(cnn, data)
    assert m.shape[0] == 2 and m.shape[2] == 4 and m.shape[1] > 150
    np.testing.assert_allclose(m.sum(axis=-1), 0.0, atol=1e-9)
    assert (m <= 0).any(axis=-1).all()  # at least one error in every orbit
    # the MoE oracle is not patch-additive: its margins do not cancel
    assert np.abs(mt.thm41_orbit_margins(lambda X: mt.moe_oracle(_wrap(data, X)), data).sum(-1)).max() > 0.1


def _wrap(data, X):
    from dataclasses import replace
    return replace(data, X=X)


def test_alignment_statistics():
    data = ms.simulate_clusters(setting=1, n=5, seed=0)
    W = np.zeros((1, 2, 50, 3))
    W[0, 0, :, 1] = -2 * data.V[0, 1]
    W[0, 1, :, 0] = 0.5 * data.C[0, 3]
    feat, cent = mt.expert_alignment(W, data.V, data.C)
    assert feat[0, 0, 1] == pytest.approx(2.0) and cent[0, 1, 3] == pytest.approx(0.5)
    assert feat.sum() == pytest.approx(2.0) and cent.sum() == pytest.approx(0.5)
    Theta = np.zeros((1, 50, 2))
    Theta[0, :, 1] = data.C[0, 2] - data.V[0, 0]
    rc, rf = mt.router_alignment(Theta, data.V, data.C)
    assert rc[0, 1, 2] == pytest.approx(1.0) and rf[0, 1, 0] == pytest.approx(-1.0)
    frame = mt.alignment_frame(W, Theta, data.V, data.C, iteration=7)
    assert set(frame["component"]) == {"expert", "router"} and len(frame) == 4 * 2 * 4
