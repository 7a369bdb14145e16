"""Batched k-means starts (issue 21): ``kmeans_init`` runs the Lloyd iterations of all replicates and restarts as
array programs; these tests hold it to the replicate-by-replicate loop it replaced (kept below as the reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import moestat as ms
from moestat.fit import init
from moestat.fit.init import (
    _finish,
    _free_masks,
    _pairwise_sum,
    _replicate_rngs,
    _ridge_per_cluster,
    cluster_means,
    kmeans_init,
    lloyd_labels,
    nearest_centre,
)
from moestat.params import Params

BLOCKS = ("gate_bias", "gate_weight", "expert_weight", "expert_bias")


def reference_lloyd(Zs: np.ndarray, centres: np.ndarray, n_iter: int) -> np.ndarray:
    """The Lloyd iterations of the per-replicate ``kmeans_init`` on one data set (labels of the final centres)."""
    centres = centres.copy()
    for _ in range(n_iter):
        lab = ((Zs[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
        for i in range(centres.shape[0]):
            if np.any(lab == i):
                centres[i] = Zs[lab == i].mean(0)
    return ((Zs[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)


def reference_kmeans_init(spec, X, y, S=1, *, scale=0.0, seed=None, n_iter=20, ridge=1e-6) -> Params:
    """``kmeans_init`` as it was before issue 21: one replicate, one restart and one cluster at a time."""
    R, n, d = X.shape
    k = spec.k
    gate_free, slope_free = _free_masks(spec)
    parts = []
    for r, rng in enumerate(_replicate_rngs(seed, R)):
        Z = np.concatenate([X[r], y[r][:, None]], 1)
        Zs = (Z - Z.mean(0)) / np.where(Z.std(0) > 0, Z.std(0), 1.0)
        Xa = np.concatenate([np.ones((n, 1)), X[r]], 1)
        for _ in range(S):
            centres = Zs[rng.choice(n, size=k, replace=False)]
            lab = reference_lloyd(Zs, centres, n_iter)
            mu = np.stack([X[r][lab == i].mean(0) if np.any(lab == i) else X[r].mean(0) for i in range(k)])
            within = np.mean([(X[r][lab == i] - mu[i]).var(0).mean() for i in range(k) if np.sum(lab == i) > 1]
                             or [1.0])
            v = within if within > 0 else 1.0
            gw = mu / v
            gb = -(mu**2).sum(1) / (2 * v)
            if spec.gate == "sigmoid":
                logits = X[r] @ gw.T + gb
                gb = gb + np.log(1.0 / (k - 1)) - logits.mean(0) if k > 1 else gb - logits.mean(0)
            ew = np.zeros((k, d))
            eb = np.zeros(k)
            for i in range(k):
                sel = lab == i
                if not np.any(sel):
                    eb[i] = float(y[r].mean())
                    continue
                if spec.family.input_dependent:
                    A = Xa[sel]
                    coef = np.linalg.solve(A.T @ A + ridge * np.eye(d + 1), A.T @ y[r][sel])
                    eb[i], ew[i] = coef[0], coef[1:]
                else:
                    eb[i] = float(y[r][sel].mean())
            p = _finish(spec, gb, gw, ew, eb)
            if scale > 0:
                p = Params(p.gate_bias + rng.normal(0, scale, k) * gate_free,
                           p.gate_weight + rng.normal(0, scale, (k, d)) * gate_free[:, None],
                           p.expert_weight + rng.normal(0, scale, (k, d)) * slope_free,
                           p.expert_bias + rng.normal(0, scale, k))
            parts.append(p)
    return Params.stack(parts)


def assert_same_starts(new: Params, ref: Params) -> None:
    # 1e-12: the labels are identical (tested exactly below); what remains is the order of a few float sums
    # (numpy sums a 1-column cluster pairwise, bincount sequentially), at most a few ulps (measured <= 1e-15)
    for name in BLOCKS:
        a, b = getattr(new, name), getattr(ref, name)
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)


def _data(seed: int, R: int, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(R, n, d))
    y = X.sum(-1) * np.sign(X[..., 0]) + 0.3 * rng.normal(size=(R, n))
    return X, y


# top-K with K = 2 needs k >= 3 experts, so its cases start at k = 3
_CASES = [(gate, expert, k, d) for gate, expert in [("softmax", "linear"), ("sigmoid", "linear"),
                                                     ("sigmoid", "constant"), ("topk", "relu")]
          for k, d in [(1, 2), (2, 1), (3, 2), (5, 8), (4, 9)] if not (gate == "topk" and k < 3)]


@pytest.mark.parametrize("gate,expert,k,d", _CASES)
@pytest.mark.parametrize("R,S", [(1, 1), (3, 2)])
@pytest.mark.parametrize("seed", [0, 7])
def test_batched_equals_per_replicate_loop(gate, expert, k, d, R, S, seed):
    spec = ms.MoE(gate=gate, expert=expert, k=k, d=d, top_k=2 if gate == "topk" else None)
    X, y = _data(seed, R, 60, d)
    for scale in (0.0, 0.1):
        assert_same_starts(kmeans_init(spec, X, y, S, scale=scale, seed=seed),
                           reference_kmeans_init(spec, X, y, S, scale=scale, seed=seed))


def test_small_clusters_below_d_plus_one_points():
    """n = 12 points, k = 4, d = 8: clusters hold fewer than d + 1 points, so only the ridge conditions the expert
    fits; the normal equations are formed from the same rows in the same order, so even they agree."""
    spec = ms.MoE(gate="softmax", expert="linear", k=4, d=8)
    X, y = _data(3, 2, 12, 8)
    assert_same_starts(kmeans_init(spec, X, y, 3, seed=1), reference_kmeans_init(spec, X, y, 3, seed=1))


def _tied_data() -> tuple[np.ndarray, np.ndarray]:
    """Two distinct points, each repeated 4 times, and a lattice whose points are equidistant from several
    centres: k = 3 random centres must repeat a point (a tie at every step and an empty cluster)."""
    pts = np.array([[0.0, 0.0], [1.0, 1.0]])
    X1 = np.repeat(pts, 4, axis=0)
    y1 = np.repeat([0.0, 2.0], 4)
    grid = np.array([[a, b] for a in (-1.0, 0.0, 1.0) for b in (-1.0, 0.0, 1.0)] * 2)[:8]
    return np.stack([X1, grid]), np.stack([y1, np.zeros(8)])


def test_ties_and_empty_clusters():
    X, y = _tied_data()
    for gate in ("softmax", "sigmoid"):
        spec = ms.MoE(gate=gate, expert="linear", k=3, d=2)
        for seed in range(6):
            assert_same_starts(kmeans_init(spec, X, y, 4, scale=0.05, seed=seed),
                               reference_kmeans_init(spec, X, y, 4, scale=0.05, seed=seed))
    # the case is exercised: some restart ends with an empty cluster (the labels take fewer than k values)
    Z = np.concatenate([X[0], y[0][:, None]], 1)
    Zs = (Z - Z.mean(0)) / Z.std(0)
    lab = lloyd_labels(Zs[None], Zs[None, [0, 1, 4]], 20)[0]
    assert len(np.unique(lab)) < 3
    np.testing.assert_array_equal(lab, reference_lloyd(Zs, Zs[[0, 1, 4]], 20))


@pytest.mark.parametrize("q", [2, 3, 8, 9, 17, 33])
def test_lloyd_labels_equal_loop_exactly(q):
    """Same initial centres give the same labels, bit for bit, for every data set of the batch."""
    rng = np.random.default_rng(q)
    b, n, k = 6, 150, 4
    Zs = rng.normal(size=(b, n, q))
    Zs[:, ::7] = np.round(Zs[:, ::7])  # repeated coordinates: exact distance ties
    centres = np.stack([Zs[j, rng.choice(n, size=k, replace=False)] for j in range(b)])
    got = lloyd_labels(Zs, centres, 20)
    for j in range(b):
        np.testing.assert_array_equal(got[j], reference_lloyd(Zs[j], centres[j], 20))


def test_blocking_and_fallback_change_nothing(monkeypatch):
    spec = ms.MoE(gate="softmax", expert="linear", k=3, d=2)
    X, y = _data(11, 5, 50, 2)
    full = kmeans_init(spec, X, y, 3, scale=0.1, seed=2)
    monkeypatch.setattr(init, "KMEANS_BLOCK_BYTES", 1)  # one problem per block
    assert_same_starts(kmeans_init(spec, X, y, 3, scale=0.1, seed=2), full)
    monkeypatch.setattr(init, "_pairwise_order_holds", lambda m: False)  # numpy's own reduction
    assert_same_starts(kmeans_init(spec, X, y, 3, scale=0.1, seed=2), full)


def test_replicate_start_does_not_depend_on_the_batch():
    """Replicate r fitted alone with the r-th child seed gets the rows it gets in the batch."""
    spec = ms.MoE(gate="sigmoid", expert="linear", k=3, d=2)
    X, y = _data(5, 4, 40, 2)
    full = kmeans_init(spec, X, y, 2, scale=0.1, seed=9)
    children = np.random.SeedSequence(9).spawn(4)
    for r in range(4):
        alone = kmeans_init(spec, X[r : r + 1], y[r : r + 1], 2, scale=0.1, seed=[children[r]])
        for name in BLOCKS:
            np.testing.assert_array_equal(getattr(alone, name), getattr(full, name)[2 * r : 2 * r + 2])


def test_cluster_means_brute_force():
    rng = np.random.default_rng(0)
    V = rng.normal(size=(3, 30, 4))
    labels = rng.integers(0, 5, size=(3, 30))
    labels[1] = np.minimum(labels[1], 2)  # clusters 3 and 4 empty in data set 1
    means, counts = cluster_means(V, labels, 5)
    for j in range(3):
        for i in range(5):
            rows = [V[j, t] for t in range(30) if labels[j, t] == i]
            assert counts[j, i] == len(rows)
            expect = [math.fsum(col) / len(rows) for col in zip(*rows, strict=True)] if rows else [0.0] * 4
            # 1e-14: fsum is exactly rounded, the bincount sum sequential over <= 30 terms of size ~1
            np.testing.assert_allclose(means[j, i], expect, rtol=0, atol=1e-14)


def test_nearest_centre_brute_force():
    rng = np.random.default_rng(1)
    Zs = np.round(rng.normal(size=(2, 40, 3)), 1)  # one decimal: many exact ties
    centres = np.round(rng.normal(size=(2, 4, 3)), 1)
    lab = nearest_centre(Zs, centres)
    for j in range(2):
        for t in range(40):
            dist = [sum((Zs[j, t, c] - centres[j, i, c]) ** 2 for c in range(3)) for i in range(4)]
            best = min(dist)
            # the first centre within rounding of the smallest distance (exact ties pick the lower index)
            assert lab[j, t] == next(i for i in range(4) if dist[i] <= best + 1e-12)


@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 16, 17, 127, 128, 129, 300])
def test_pairwise_sum_matches_numpy_and_fsum(m):
    rng = np.random.default_rng(m)
    a = rng.random((20, m)) * 10.0 ** rng.integers(-3, 3, size=(20, m))
    got = _pairwise_sum(lambda j: a[:, j].copy(), 0, m)
    np.testing.assert_array_equal(got, a.sum(-1))
    # independent: the exactly rounded sum, to the error bound of pairwise summation (m * eps relative)
    np.testing.assert_allclose(got, [math.fsum(row) for row in a], rtol=m * 2.3e-16)


def test_lloyd_recovers_separated_clusters():
    """Three well-separated blobs from one point of each: k-means assigns every point to its own blob."""
    rng = np.random.default_rng(4)
    truth = np.repeat(np.arange(3), 30)
    Zs = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])[truth] + rng.normal(size=(90, 2))
    lab = lloyd_labels(Zs[None], Zs[None, [0, 30, 60]], 20)[0]
    np.testing.assert_array_equal(lab, truth)


def test_ridge_fits_against_augmented_least_squares():
    """Ridge = least squares on the rows stacked with sqrt(ridge) I (an independent solver, lstsq)."""
    rng = np.random.default_rng(6)
    X = rng.normal(size=(2, 25, 3))
    y = rng.normal(size=(2, 25))
    labels = rng.integers(0, 3, size=(2, 25))
    labels[0] = np.where(labels[0] == 2, 1, labels[0])  # cluster 2 empty in data set 0
    empty = np.stack([np.bincount(lab, minlength=3) == 0 for lab in labels])
    ridge = 0.3
    coef = _ridge_per_cluster(X, y, labels, 3, ridge, empty)
    for j in range(2):
        for i in range(3):
            sel = labels[j] == i
            if not sel.any():
                np.testing.assert_array_equal(coef[j, i], 0.0)
                continue
            A = np.concatenate([np.ones((sel.sum(), 1)), X[j][sel]], 1)
            A_aug = np.concatenate([A, np.sqrt(ridge) * np.eye(4)])
            expect = np.linalg.lstsq(A_aug, np.concatenate([y[j][sel], np.zeros(4)]), rcond=None)[0]
            np.testing.assert_allclose(coef[j, i], expect, rtol=1e-10, atol=1e-12)  # two solvers' rounding


def test_too_few_observations():
    spec = ms.MoE(gate="softmax", expert="linear", k=5, d=1)
    with pytest.raises(ValueError, match=r"n >= k"):
        kmeans_init(spec, np.zeros((1, 3, 1)), np.zeros((1, 3)))


def test_lloyd_stops_at_a_fixed_point_with_the_labels_of_the_full_run(monkeypatch):
    """Labels that repeat make the next centres the current ones bit for bit, so lloyd_labels stops there: on well
    separated clusters it labels twice or three times instead of n_iter + 1, with the labels of the full run."""
    from moestat.fit import init

    rng = np.random.default_rng(0)
    Zs = np.concatenate([rng.normal(loc=c, scale=0.1, size=(40, 2)) for c in (-3.0, 0.0, 3.0)])[None]
    centres = Zs[:, [0, 1, 2]]  # all three in the first cluster: a few iterations to move them apart
    calls = []
    nearest = init._nearest
    monkeypatch.setattr(init, "_nearest", lambda *a: calls.append(1) or nearest(*a))
    got = lloyd_labels(Zs, centres, 200)
    assert 2 <= len(calls) < 20
    np.testing.assert_array_equal(got[0], reference_lloyd(Zs[0], centres[0], 200))
