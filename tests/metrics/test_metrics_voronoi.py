"""Voronoi cells and losses: hand-computed values, brute-force reference, symmetries, bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.metrics import center_softmax, voronoi_cells, voronoi_loss, voronoi_losses

pytestmark = pytest.mark.usefixtures("one_thread")


def sig(t):
    return 1.0 / (1.0 + math.exp(-t))


# ------------------------------------------------------------------ the hand-computed k*=2, k=3, d=1 case
# truth atoms (beta0, beta1, a, b):  j=0: (0, 0, 1, 0);  j=1: (1, 2, -1, 1)
TRUTH = ms.Params([0.0, 1.0], [[0.0], [2.0]], [[1.0], [-1.0]], [0.0, 1.0])
# fitted atoms: i=0 (-1, 0.1, 1, 0.2) and i=1 (0.5, -0.1, 0.9, 0) fall in A_0; i=2 (1.2, 2, -1, 0.7) in A_1.
FIT = ms.Params([-1.0, 0.5, 1.2], [[0.1], [-0.1], [2.0]], [[1.0], [0.9], [-1.0]], [0.2, 0.0, 0.7])
# G-bar for D3 (k=3): omega-bar = (0.1, 1, 0), (-0.1, 1, 0), (2, -1, 1); beta0-bar = (-0.8, 0.4, 1.0).
GBAR = ms.Params([-0.8, 0.4, 1.0], [[0.1], [-0.1], [2.0]], [[1.0], [1.0], [-1.0]], [0.0, 0.0, 1.0])


def test_cells_hand_case():
    cells = voronoi_cells(FIT, TRUTH)
    assert cells.assignment.tolist() == [[0, 0, 1]]
    assert cells.sizes.tolist() == [[2, 1]]
    np.testing.assert_allclose(cells.distance[0], [math.sqrt(0.01 + 0.04), math.sqrt(0.01 + 0.01), 0.3])
    assert cells.specification.tolist() == [["over", "exact"]]
    frame = cells.to_frame()
    assert frame["members"].tolist() == ["0,1", "2"]


def test_d1_hand_value():
    # over cell A_0: |sig(-1) + sig(0.5) - sig(0)| + (0.1^2 + 0.2^2) + (0.1^2 + 0.1^2)
    # exact cell A_1: |1.2 - 1| + |2 - 2| + ||(0, -0.3)|| = 0.2 + 0 + 0.3
    expected = abs(sig(-1) + sig(0.5) - sig(0)) + (0.01 + 0.04) + (0.01 + 0.01) + (0.2 + 0.0 + 0.3)
    assert voronoi_loss(FIT, TRUTH, "D1") == pytest.approx(expected, rel=1e-13)
    assert expected == pytest.approx(0.9614007525718497, rel=1e-12)


def test_d2_hand_value():
    r = 1.5
    over = (0.1**r + 0.0**r + 0.2**r) + (0.1**r + 0.1**r + 0.0**r)
    exact = 0.2 + 0.0 + 0.0 + 0.3          # |db0| + ||db1|| + ||da|| + |db|
    expected = abs(sig(-1) + sig(0.5) - sig(0)) + over + exact
    assert voronoi_loss(FIT, TRUTH, "D2", r=r) == pytest.approx(expected, rel=1e-13)
    # r = 2 coincides with D1 on the over-specified cell; only the exact cell differs (||dEta|| vs |da|+|db|)
    assert voronoi_loss(FIT, TRUTH, "D2", r=2) == pytest.approx(voronoi_loss(FIT, TRUTH, "D1"), rel=1e-13)


def test_d3_hand_value_and_infimum():
    # fitted i=0 -> Gbar atom 0 (distance 0.2 < 0.283), i=1 -> atom 1 (0.1 < 0.224), i=2 -> atom 2
    expected = (abs(-1 + 0.8) + 0.0 + 0.2) + (abs(0.5 - 0.4) + 0.0 + 0.1) + (abs(1.2 - 1.0) + 0.0 + 0.3)
    assert voronoi_loss(FIT, None, "D3", gbar=GBAR) == pytest.approx(expected, rel=1e-13)
    assert expected == pytest.approx(1.1)
    far = GBAR.perturb(1.0, seed=3)
    near = ms.Params(FIT.gate_bias, FIT.gate_weight, FIT.expert_weight, FIT.expert_bias)
    for gset in ([GBAR, far], [far, GBAR], ms.Params.stack([far, GBAR])):
        assert voronoi_loss(FIT, None, "D3", gbar=gset) == pytest.approx(expected, rel=1e-13)
    assert voronoi_loss(FIT, None, "D3", gbar=[far, near, GBAR]) == 0.0


def test_softmax_hand_value_without_centering():
    e = math.exp
    gaps = abs(e(-1) + e(0.5) - e(0)) + abs(e(1.2) - e(1.0))
    over = e(-1) * (0.1**2 + 0.2**2) + e(0.5) * (0.1**2 + 0.1**2)
    exact = e(1.2) * (0.0 + 0.3)
    expected = gaps + over + exact
    assert voronoi_loss(FIT, TRUTH, "softmax", translation="none") == pytest.approx(expected, rel=1e-13)
    assert expected == pytest.approx(2.6658377, rel=1e-6)


def test_softmax_centered_matches_manual_centering():
    def centre(p):
        b0 = np.asarray(p.gate_bias)
        lse = np.log(np.sum(np.exp(b0)))
        pi = np.exp(b0 - lse)
        return ms.Params(b0 - lse, p.gate_weight - pi @ p.gate_weight, p.expert_weight, p.expert_bias)

    manual = voronoi_loss(centre(FIT), centre(TRUTH), "softmax", translation="none")
    assert voronoi_loss(FIT, TRUTH, "softmax") == pytest.approx(manual, rel=1e-13)
    c = center_softmax(FIT)
    assert np.exp(c.gate_bias).sum() == pytest.approx(1.0)
    np.testing.assert_allclose(np.exp(c.gate_bias) @ c.gate_weight, 0.0, atol=1e-15)


def test_strict_charges_empty_cells_only():
    # the truth gains a third atom far from every fitted atom -> empty exact cell
    t3 = ms.Params([0.0, 1.0, 0.7], [[0.0], [2.0], [9.0]], [[1.0], [-1.0], [9.0]], [0.0, 1.0, 9.0])
    base = voronoi_loss(FIT, t3, "D1")
    assert base == pytest.approx(voronoi_loss(FIT, TRUTH, "D1"), rel=1e-13)      # papers' D1: empty cell free
    assert voronoi_loss(FIT, t3, "D1", strict=True) == pytest.approx(base + sig(0.7), rel=1e-13)
    assert voronoi_loss(FIT, t3, "D2", r=1, strict=True) == pytest.approx(
        voronoi_loss(FIT, t3, "D2", r=1) + sig(0.7), rel=1e-13)
    # no empty cell: strict changes nothing
    assert voronoi_loss(FIT, TRUTH, "D1", strict=True) == voronoi_loss(FIT, TRUTH, "D1")
    # softmax already charges an empty cell through its weight-sum term
    assert voronoi_loss(FIT, t3, "softmax", translation="none") > voronoi_loss(
        FIT, TRUTH, "softmax", translation="none")


def test_ties_go_to_lowest_index():
    truth = ms.Params([0.0, 0.0], [[1.0], [-1.0]], [[0.0], [0.0]], [0.0, 0.0])
    fit = ms.Params([0.0], [[0.0]], [[0.0]], [0.0])           # equidistant from both true atoms
    assert voronoi_cells(fit, truth).assignment.tolist() == [[0]]
    swapped = truth.permute([1, 0])
    assert voronoi_cells(fit, swapped).assignment.tolist() == [[0]]


# --------------------------------------------------------------------- brute-force reference (loops)
def reference_loss(fit, truth, kind, r=None, strict=False, weight=sig):
    """Plain-Python transcription of the formulas: loops over atoms, no vectorisation."""
    f = fit.numpy()
    t = truth.numpy()

    def atom(p, i):
        return (float(p.gate_bias[i]), np.asarray(p.gate_weight[i]), np.asarray(p.expert_weight[i]),
                float(p.expert_bias[i]))

    fits = [atom(f, i) for i in range(f.k)]
    trues = [atom(t, j) for j in range(t.k)]
    cells = {j: [] for j in range(t.k)}
    for i, (_, b1, a, b) in enumerate(fits):
        dists = [math.sqrt(sum((b1 - tb1) ** 2) + sum((a - ta) ** 2) + (b - tb) ** 2) for _, tb1, ta, tb in trues]
        cells[dists.index(min(dists))].append(i)
    total = 0.0
    for j, members in cells.items():
        b0s, b1s, as_, bs = trues[j]
        gap = abs(sum(weight(fits[i][0]) for i in members) - weight(b0s))
        if kind == "softmax" or (kind in ("D1", "D2") and len(members) >= 2) or (strict and not members):
            total += gap
        for i in members:
            b0, b1, a, b = fits[i]
            db0, db1 = abs(b0 - b0s), math.sqrt(sum((b1 - b1s) ** 2))
            da, db = math.sqrt(sum((a - as_) ** 2)), abs(b - bs)
            deta = math.sqrt(da**2 + db**2)
            over = len(members) >= 2
            if kind == "D1":
                total += db1**2 + deta**2 if over else db0 + db1 + deta
            elif kind == "D2":
                total += db1**r + da**r + db**r if over else db0 + db1 + da + db
            elif kind == "D3":
                total += db0 + db1 + deta
            else:
                w = math.exp(b0)
                total += w * (db1**r + deta**r) if over else w * (db1 + deta)
    return total


def random_params(rng, k, d, scale=1.0):
    return ms.Params(rng.normal(0, scale, k), rng.normal(0, scale, (k, d)), rng.normal(0, scale, (k, d)),
                     rng.normal(0, scale, k))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), k_star=st.integers(1, 4), extra=st.integers(0, 3), d=st.integers(1, 3),
       strict=st.booleans())
def test_vectorised_matches_brute_force(seed, k_star, extra, d, strict):
    rng = np.random.default_rng(seed)
    truth = random_params(rng, k_star, d)
    fits = [random_params(rng, k_star + extra, d) for _ in range(3)]
    batch = ms.Params.stack(fits)
    for kind, r in (("D1", None), ("D2", 1.5), ("softmax", 2.0), ("softmax", 3.0)):
        got = voronoi_loss(batch, truth, kind, r=r, strict=strict, translation="none")
        want = [reference_loss(f, truth, kind, r=r, strict=strict, weight=math.exp if kind == "softmax" else sig)
                for f in fits]
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-13)
    gbar = random_params(rng, k_star + extra, d)
    got = voronoi_loss(batch, None, "D3", gbar=gbar, strict=strict)
    np.testing.assert_allclose(got, [reference_loss(f, gbar, "D3", strict=strict) for f in fits], rtol=1e-11)


# -------------------------------------------------------------------------------- symmetries
ALL = (("D1", None), ("D2", 1.0), ("D2", 2.0), ("softmax", None))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 6), d=st.integers(1, 4))
def test_zero_at_truth_and_any_relabelling(seed, k, d):
    rng = np.random.default_rng(seed)
    truth = random_params(rng, k, d)
    perm = rng.permutation(k)
    for kind, r in ALL:
        assert voronoi_loss(truth, truth, kind, r=r) == 0.0
        assert voronoi_loss(truth.permute(perm), truth, kind, r=r) == pytest.approx(0.0, abs=1e-14)
    assert voronoi_loss(truth.permute(perm), None, "D3", gbar=truth) == 0.0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), k_star=st.integers(1, 4), extra=st.integers(0, 3), d=st.integers(1, 3))
def test_permutation_invariance(seed, k_star, extra, d):
    rng = np.random.default_rng(seed)
    truth = random_params(rng, k_star, d)
    fit = random_params(rng, k_star + extra, d).batched(2).perturb(0.3, seed=seed)
    perm_fit = np.stack([rng.permutation(k_star + extra) for _ in range(2)])
    perm_truth = rng.permutation(k_star)
    for kind, r in ALL:
        base = voronoi_loss(fit, truth, kind, r=r)
        np.testing.assert_allclose(voronoi_loss(fit.permute(perm_fit), truth, kind, r=r), base, rtol=1e-12)
        # relabelling the truth changes nothing unless a fitted atom is exactly equidistant (probability 0)
        np.testing.assert_allclose(voronoi_loss(fit, truth.permute(perm_truth), kind, r=r), base, rtol=1e-12)
    gbar = random_params(rng, k_star + extra, d)
    np.testing.assert_allclose(voronoi_loss(fit.permute(perm_fit), None, "D3", gbar=gbar.permute(
        rng.permutation(k_star + extra))), voronoi_loss(fit, None, "D3", gbar=gbar), rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), k_star=st.integers(1, 4), extra=st.integers(0, 2), d=st.integers(1, 3),
       t0=st.floats(-5, 5), t1=st.lists(st.floats(-5, 5), min_size=3, max_size=3))
def test_softmax_translation_invariance(seed, k_star, extra, d, t0, t1):
    rng = np.random.default_rng(seed)
    truth = random_params(rng, k_star, d)
    fit = random_params(rng, k_star + extra, d)
    shift = np.asarray(t1[:d])

    def translate(p):
        return ms.Params(p.gate_bias + t0, p.gate_weight + shift, p.expert_weight, p.expert_bias)

    base = voronoi_loss(fit, truth, "softmax")
    assert voronoi_loss(translate(fit), truth, "softmax") == pytest.approx(base, rel=1e-9, abs=1e-12)
    assert voronoi_loss(fit, translate(truth), "softmax") == pytest.approx(base, rel=1e-9, abs=1e-12)
    assert voronoi_loss(translate(truth), truth, "softmax") == pytest.approx(0.0, abs=1e-12)


def test_positive_under_perturbation():
    _, truth = ms.presets.sigmoid_vs_softmax(regime=1, expert="gelu", seed=0)
    for scale in (1e-6, 1e-3, 1e-1):
        fit = truth.batched(4).perturb(scale, seed=1)
        for kind, r in ALL:
            assert np.all(voronoi_loss(fit, truth, kind, r=r) > 0)
        assert np.all(voronoi_loss(fit, None, "D3", gbar=truth) > 0)


def test_exact_split_of_an_atom_gives_zero():
    """Splitting a zero-slope true atom's weight between two identical copies reproduces f_G* exactly."""
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=1, expert="relu", seed=0)
    j = 7   # regime 1 of the preset: atoms 6 and 7 have zero gate slope
    idx = [*range(8), j]
    w = sig(truth.gate_bias[j]) / 2
    gb = truth.gate_bias[idx].copy()
    gb[[j, 8]] = math.log(w / (1 - w))
    split = ms.Params(gb, truth.gate_weight[idx], truth.expert_weight[idx], truth.expert_bias[idx])
    assert voronoi_loss(split, truth, "D1") == pytest.approx(0.0, abs=1e-15)
    X = np.random.default_rng(0).uniform(-1, 1, (500, 32))
    assert ms.l2_distance(spec, split, truth, X, spec_b=spec) < 1e-14
    # softmax: the same split is beta0 - log 2 on both copies
    gb = truth.gate_bias[idx].copy()
    gb[[j, 8]] -= math.log(2)
    soft = ms.Params(gb, truth.gate_weight[idx], truth.expert_weight[idx], truth.expert_bias[idx])
    assert voronoi_loss(soft, truth, "softmax") == pytest.approx(0.0, abs=1e-14)


# ------------------------------------------------------------------------------ batching, types
def test_batched_truth_broadcast_and_torch_inputs():
    rng = np.random.default_rng(0)
    truths = ms.Params.stack([random_params(rng, 2, 2) for _ in range(3)])
    fits = truths.perturb(0.1, seed=1)
    batched = voronoi_loss(fits, truths, "D1")
    one_by_one = [voronoi_loss(fits.select(i), truths.select(i), "D1") for i in range(3)]
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-14)
    np.testing.assert_allclose(voronoi_loss(fits.to_torch(), truths.to_torch(), "D1"), batched, rtol=1e-14)
    f32 = voronoi_loss(fits.to_torch(dtype=torch.float32), truths.to_torch(dtype=torch.float32), "D1")
    np.testing.assert_allclose(f32, batched, rtol=1e-5)
    assert isinstance(voronoi_loss(fits.select(0), truths.select(0), "D1"), float)
    assert voronoi_loss(fits.select(0), truths, "D1").shape == (3,)


def test_truth_pair_accepted_and_losses_frame():
    truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    fit = truth.params.batched(2).perturb(0.01, seed=0)
    assert voronoi_loss(fit, truth, "D1").shape == (2,)
    frame = voronoi_losses(fit, truth, ["D1", "D2", "softmax", "D3"], r=2, gbar=truth.params)
    assert set(frame.columns) == {"rep", "loss", "value", "r", "strict", "translation"}
    assert len(frame) == 8
    d3 = frame[frame.loss == "D3"]["value"].to_numpy()
    np.testing.assert_allclose(d3, voronoi_loss(fit, None, "D3", gbar=truth.params))


def test_benchmark_baseline_agrees_with_batched_loss():
    """The benchmark's per-replicate numpy baseline computes the same D1 (so its ratios compare like with like)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "metrics_voronoi.py"
    spec_ = importlib.util.spec_from_file_location("metrics_voronoi_bench", path)
    bench = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(bench)
    _, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    idx = [*range(8), 0]
    fit = ms.Params(truth.gate_bias[idx], truth.gate_weight[idx], truth.expert_weight[idx],
                    truth.expert_bias[idx]).batched(5).perturb(0.01, seed=0)
    np.testing.assert_allclose(bench.baseline_d1(fit, truth), voronoi_loss(fit, truth, "D1"), rtol=1e-12)


def test_d3_chunking_matches_single_pass():
    rng = np.random.default_rng(1)
    gset = ms.Params.stack([random_params(rng, 3, 2) for _ in range(7)])
    fit = ms.Params.stack([random_params(rng, 3, 2) for _ in range(5)])
    whole = voronoi_loss(fit, None, "D3", gbar=gset)
    tiny = voronoi_loss(fit, None, "D3", gbar=gset, chunk_elements=1)
    np.testing.assert_array_equal(whole, tiny)
    direct = np.min([voronoi_loss(fit, None, "D3", gbar=gset.select(s)) for s in range(7)], axis=0)
    np.testing.assert_allclose(whole, direct, rtol=1e-15)


# ---------------------------------------------------------------------------------- bad input
def test_bad_input():
    other_d = ms.Params([0.0], [[0.0, 0.0]], [[1.0, 0.0]], [0.0])
    with pytest.raises(ValueError, match="input dimension"):
        voronoi_loss(other_d, TRUTH, "D1")
    relu = ms.MoE(gate="sigmoid", expert="relu", k=2, d=1)
    gelu = ms.MoE(gate="sigmoid", expert="gelu", k=3, d=1)
    with pytest.raises(ValueError, match="expert family"):
        voronoi_loss((gelu, FIT), (relu, TRUTH), "D1")
    with pytest.raises(ValueError, match="kind"):
        voronoi_loss(FIT, TRUTH, "D4")
    for r in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="r must be"):
            voronoi_loss(FIT, TRUTH, "D2", r=r)
    with pytest.raises(ValueError, match="needs the exponent r"):
        voronoi_loss(FIT, TRUTH, "D2")
    with pytest.raises(ValueError, match="only used by"):
        voronoi_loss(FIT, TRUTH, "D1", r=2)
    with pytest.raises(ValueError, match="needs gbar"):
        voronoi_loss(FIT, TRUTH, "D3")
    with pytest.raises(ValueError, match="only used by kind='D3'"):
        voronoi_loss(FIT, TRUTH, "D1", gbar=GBAR)
    with pytest.raises(TypeError, match="Params"):
        voronoi_loss(np.zeros(3), TRUTH, "D1")
    with pytest.raises(ValueError, match="replicates"):
        voronoi_loss(FIT.batched(3), TRUTH.batched(2), "D1")
    with pytest.raises(ValueError, match="translation"):
        voronoi_loss(FIT, TRUTH, "softmax", translation="ref")
