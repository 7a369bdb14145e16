"""Region-wise Voronoi losses of the top-K gated Gaussian MoE: brute force, the dense case, invariances, regions,
routing diagnostics, the local inequality D <~ h, bad input."""

import itertools
import math

import numpy as np
import pytest

import moestat as ms
from moestat.metrics.gaussian_voronoi import gaussian_voronoi_loss
from moestat.metrics.topk_voronoi import (
    region_inputs,
    selection_match,
    selection_shares,
    topk_voronoi_frame,
    topk_voronoi_loss,
    true_regions,
)
from moestat.papers.nguyen2024_topk import LAMBDA_PARAMS, PARAMS, expected_hellinger

# Sums of a few dozen float64 terms: agreement to 1e-11 relative leaves room only for rounding.
RTOL = 1e-11


def _truth(values=PARAMS):
    return ms.Params(**{k: np.asarray(v, float) for k, v in values.items()})


TRUTH = _truth()


def _jitter(truth, R, scale, seed, split=()):
    """R fits near ``truth``: atoms ``split`` duplicated (weight halved), every coordinate jittered."""
    rng = np.random.default_rng(seed)
    order = list(range(truth.k)) + list(split)
    b0 = np.asarray(truth.gate_bias, float)[order].copy()
    for j in set(split):
        b0[[i for i, o in enumerate(order) if o == j]] -= math.log(order.count(j))
    k = len(order)

    def noisy(v, shape):
        return np.asarray(v, float)[None, ...] + scale * rng.standard_normal((R, *shape))

    return ms.Params(gate_bias=noisy(b0, (k,)),
                     gate_weight=noisy(np.asarray(truth.gate_weight, float)[order], (k, 1)),
                     expert_weight=noisy(np.asarray(truth.expert_weight, float)[order], (k, 1)),
                     expert_bias=noisy(np.asarray(truth.expert_bias, float)[order], (k,)),
                     noise_sd=np.abs(noisy(np.asarray(truth.noise_sd, float)[order], (k,))))


# ------------------------------------------------------------------ independent reference implementation
def _atoms(p, r):
    q = p.numpy().batched()
    return [(float(q.gate_bias[r, i]), [float(v) for v in q.gate_weight[r, i]],
             [float(v) for v in q.expert_weight[r, i]], float(q.expert_bias[r, i]), float(q.noise_sd[r, i]) ** 2)
            for i in range(q.k)]


def _center(atoms):
    m = max(a[0] for a in atoms)
    lse = m + math.log(sum(math.exp(a[0] - m) for a in atoms))
    pis = [math.exp(a[0] - lse) for a in atoms]
    shift = [sum(pi * a[1][c] for pi, a in zip(pis, atoms, strict=True)) for c in range(len(atoms[0][1]))]
    return [(a[0] - lse, [a[1][c] - shift[c] for c in range(len(shift))], *a[2:]) for a in atoms]


def _dist(u, v):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(u, v, strict=True)))


def brute_force(fit, truth, regions, r=0, kind="exact"):
    """Straight from the definition: global cells, per region re-centring, D = max_S D_S (loops only)."""
    F, T = _atoms(fit, r), _atoms(truth, 0)
    Fc, Tc = _center(F), _center(T)
    cells = []
    for f in Fc:
        d = [math.sqrt(_dist(f[1], t[1]) ** 2 + _dist(f[2], t[2]) ** 2 + (f[3] - t[3]) ** 2 + (f[4] - t[4]) ** 2)
             for t in Tc]
        cells.append(d.index(min(d)))
    size = {j: cells.count(j) for j in range(len(T))}
    worst = 0.0
    for S in regions:
        idx = [i for i, c in enumerate(cells) if c in S]
        sub_f = dict(zip(idx, _center([F[i] for i in idx]), strict=True))
        sub_t = dict(zip(S, _center([T[j] for j in S]), strict=True))
        total = 0.0
        for j in S:
            mine = [i for i in idx if cells[i] == j]
            total += abs(sum(math.exp(sub_f[i][0]) for i in mine) - math.exp(sub_t[j][0]))
            r1 = {2: 4.0, 3: 6.0}[size[j]] if kind == "over" and size[j] >= 2 else 1.0
            r2 = r1 / 2 if r1 > 1 else 1.0
            for i in mine:
                f, t = sub_f[i], sub_t[j]
                total += math.exp(f[0]) * (_dist(f[1], t[1]) ** r1 + _dist(f[2], t[2]) ** r2 + abs(f[3] - t[3]) ** r1
                                           + abs(f[4] - t[4]) ** r2)
        worst = max(worst, total)
    return worst


REGIONS = [(0, 1), (1, 2)]


@pytest.mark.parametrize("split, scale", [((), 0.2), ((1,), 0.15), ((0,), 0.3), ((1, 1), 0.1), ((), 1.5)])
def test_matches_brute_force(split, scale):
    fit = _jitter(TRUTH, 4, scale, seed=len(split) + int(10 * scale), split=split)
    kind = "exact" if not split else "over"
    got = topk_voronoi_loss(fit, TRUTH, 2, regions=REGIONS)
    want = [brute_force(fit, TRUTH, REGIONS, r, kind) for r in range(4)]
    np.testing.assert_allclose(got, want, rtol=RTOL)


def test_dense_gate_is_the_gaussian_voronoi_loss():
    """K = k*: one region holding every expert, so D is D1 (k = k*) or D2 (k > k*) of gaussian_voronoi_loss."""
    for split in ((), (1,), (0, 2)):
        fit = _jitter(TRUTH, 5, 0.2, seed=3, split=split)
        np.testing.assert_allclose(topk_voronoi_loss(fit, TRUTH, 3, X=region_inputs()),
                                   gaussian_voronoi_loss(fit, TRUTH), rtol=RTOL)


def test_zero_at_the_truth_and_at_an_exact_split():
    assert topk_voronoi_loss(TRUTH, TRUTH, 2, regions=REGIONS)[0] == pytest.approx(0.0, abs=1e-15)
    split = _jitter(TRUTH, 1, 0.0, seed=0, split=(1,))        # expert 2 as two identical half-weight copies
    assert topk_voronoi_loss(split, TRUTH, 2, regions=REGIONS)[0] == pytest.approx(0.0, abs=1e-14)


def test_invariant_to_relabelling_and_translation():
    fit = _jitter(TRUTH, 3, 0.2, seed=7, split=(1,))
    base = topk_voronoi_loss(fit, TRUTH, 2, regions=REGIONS)
    for perm in itertools.permutations(range(4)):
        p = list(perm)
        moved = ms.Params(fit.gate_bias[:, p], fit.gate_weight[:, p], fit.expert_weight[:, p],
                          fit.expert_bias[:, p], noise_sd=fit.noise_sd[:, p])
        np.testing.assert_allclose(topk_voronoi_loss(moved, TRUTH, 2, regions=REGIONS), base, rtol=RTOL)
    shifted = ms.Params(fit.gate_bias + 3.7, fit.gate_weight - 2.5, fit.expert_weight, fit.expert_bias,
                        noise_sd=fit.noise_sd)
    np.testing.assert_allclose(topk_voronoi_loss(shifted, TRUTH, 2, regions=REGIONS), base, rtol=1e-10)
    # the translation leaves the top-K gate itself unchanged (what makes it an invariance)
    spec = ms.MoE(gate="topk", top_k=3, expert="linear", k=4, d=1)
    X = region_inputs(size=101)
    np.testing.assert_allclose(spec.gate_weights(shifted, X), spec.gate_weights(fit, X), atol=1e-12)


def test_regions_of_the_truths():
    # chain: scores 1 - 4x, 0, -3 + 4x -> {1, 2} below x = 1/2, {2, 3} above (hand calculation)
    regions = true_regions(TRUTH, 2, region_inputs(size=1000))
    assert list(regions) == [(0, 1), (1, 2)] and regions[(0, 1)] == pytest.approx(0.5)
    # lambda, top-1: expert 2 below x = 8 / 25 = 0.32, expert 1 above
    lam = true_regions(_truth(LAMBDA_PARAMS), 1, region_inputs(size=10000))
    assert list(lam) == [(1,), (0,)] and lam[(1,)] == pytest.approx(0.32, abs=1e-4)
    # the default regions are the realised ones: the frame reports one part per region
    frame = topk_voronoi_frame(_jitter(TRUTH, 2, 0.1, seed=1), TRUTH, 2, X=region_inputs())
    assert {"region_0_1", "region_1_2"} <= set(frame.columns)
    np.testing.assert_allclose(frame["loss"], frame[["region_0_1", "region_1_2"]].max(axis=1))


def _loop_selection(fit, truth, top_k, fit_top_k, X, r):
    """selection_match by loops: global cells, then per input compare the fitted top set with the cells' atoms."""
    F, T = _atoms(fit, r), _atoms(truth, 0)
    Fc, Tc = _center(F), _center(T)
    cells = []
    for f in Fc:
        d = [_dist(f[1], t[1]) ** 2 + _dist(f[2], t[2]) ** 2 + (f[3] - t[3]) ** 2 + (f[4] - t[4]) ** 2 for t in Tc]
        cells.append(d.index(min(d)))
    hits = 0
    for x in X[:, 0]:
        ts = sorted(range(len(T)), key=lambda j: -(T[j][0] + T[j][1][0] * x))[:top_k]
        fs = sorted(range(len(F)), key=lambda i: -(F[i][0] + F[i][1][0] * x))[:fit_top_k]
        hits += set(fs) == {i for i, c in enumerate(cells) if c in ts}
    return hits / len(X)


def test_selection_match_and_shares():
    X = region_inputs(size=400)
    split2 = _jitter(TRUTH, 1, 0.0, seed=0, split=(1,))
    assert selection_match(split2, TRUTH, 2, 3, X)[0] == 1.0            # the admissible split routes like the truth
    assert selection_match(split2, TRUTH, 2, 2, X)[0] == 0.0            # Kbar = 2 drops one of its copies everywhere
    fits = _jitter(TRUTH, 3, 0.3, seed=5, split=(0,))
    got = selection_match(fits, TRUTH, 2, 3, X)
    np.testing.assert_allclose(got, [_loop_selection(fits, TRUTH, 2, 3, X, r) for r in range(3)])
    assert got.max() < 1.0                                               # split 1 cannot route like the truth
    # shares: expert 2 on every input, experts 1 and 3 on half of them (hand calculation)
    np.testing.assert_allclose(selection_shares(TRUTH, 2, X)[0], [0.5, 1.0, 0.5])


def test_loss_is_bounded_by_the_hellinger_distance_near_the_truth():
    """The rate transfer needs D <~ h near the truth: along random directions D / h stays bounded as the step
    shrinks (gate moves shift the region boundary, which costs h ~ step^(1/2): there D / h even falls)."""
    spec = ms.MoE(gate="topk", top_k=2, expert="linear", k=3, d=1)
    X = region_inputs(size=200)
    rng = np.random.default_rng(11)
    for _ in range(3):
        v = {key: rng.standard_normal(np.shape(val)) for key, val in PARAMS.items()}
        ratios = []
        for eps in (1e-1, 3e-2, 1e-2, 3e-3):
            p = ms.Params(**{key: np.asarray(val, float) + eps * v[key] for key, val in PARAMS.items()})
            h = expected_hellinger(spec, p, spec, TRUTH, X)[0]
            ratios.append(topk_voronoi_loss(p, TRUTH, 2, regions=REGIONS)[0] / h)
        # bounded: the ratio does not grow as eps falls 30-fold (a loss of the wrong order would grow like
        # eps^-1/2 or faster); 1.5 allows the curvature of h between eps = 0.1 and 0.003
        assert max(ratios) <= 1.5 * ratios[0] and all(np.isfinite(ratios))


def test_bad_input():
    fit = _jitter(TRUTH, 2, 0.1, seed=0)
    with pytest.raises(ValueError, match="top_k=4"):
        topk_voronoi_loss(fit, TRUTH, 4, regions=REGIONS)
    with pytest.raises(ValueError, match="regions"):
        topk_voronoi_loss(fit, TRUTH, 2, regions=[(0, 1, 2)])
    with pytest.raises(ValueError, match="pass the true regions"):
        topk_voronoi_loss(fit, TRUTH, 2)
    with pytest.raises(ValueError, match="noise_sd"):
        topk_voronoi_loss(ms.Params(TRUTH.gate_bias, TRUTH.gate_weight, TRUTH.expert_weight, TRUTH.expert_bias),
                          TRUTH, 2, regions=REGIONS)
    with pytest.raises(ValueError, match="under-specified"):
        topk_voronoi_loss(ms.Params(TRUTH.gate_bias[:2], TRUTH.gate_weight[:2], TRUTH.expert_weight[:2],
                                    TRUTH.expert_bias[:2], noise_sd=TRUTH.noise_sd[:2]), TRUTH, 2, regions=REGIONS)
    with pytest.raises(ValueError, match="shape"):
        true_regions(TRUTH, 2, np.zeros((5, 2)))
    with pytest.raises(ValueError, match="kind"):
        topk_voronoi_loss(fit, TRUTH, 2, regions=REGIONS, kind="dense")
    with pytest.raises(TypeError, match="Params"):
        topk_voronoi_loss({"gate_bias": [0.0]}, TRUTH, 2, regions=REGIONS)
