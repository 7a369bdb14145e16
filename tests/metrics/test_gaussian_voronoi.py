"""Gaussian MoE Voronoi losses D1/D2: brute force, hand values, symmetries, exponents, bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.metrics.gaussian_voronoi import gaussian_voronoi_frame, gaussian_voronoi_loss

pytestmark = pytest.mark.usefixtures("one_thread")

# Results are sums of a few dozen float64 terms; agreement to 1e-12 relative leaves room only for rounding.
RTOL = 1e-12


# ------------------------------------------------------------------ independent reference implementation
def _atoms_list(p, rep):
    """Plain python atoms [(beta0, beta1 list, a list, b, nu or None)] of replicate ``rep``."""
    q = p.numpy().batched()
    r = min(rep, q.gate_bias.shape[0] - 1)
    out = []
    for i in range(q.k):
        nu = None if q.noise_sd is None else float(q.noise_sd[r, i]) ** 2
        out.append((float(q.gate_bias[r, i]), [float(v) for v in q.gate_weight[r, i]],
                    [float(v) for v in q.expert_weight[r, i]], float(q.expert_bias[r, i]), nu))
    return out


def _center(atoms):
    """sum_i exp(beta0_i) = 1 and sum_i pi_i beta1_i = 0, computed with math only."""
    m = max(a[0] for a in atoms)
    lse = m + math.log(sum(math.exp(a[0] - m) for a in atoms))
    pis = [math.exp(a[0] - lse) for a in atoms]
    d = len(atoms[0][1])
    shift = [sum(pi * a[1][c] for pi, a in zip(pis, atoms, strict=True)) for c in range(d)]
    return [(a[0] - lse, [a[1][c] - shift[c] for c in range(d)], a[2], a[3], a[4]) for a in atoms]


def _norm(u, v):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(u, v, strict=True)))


def brute_force(fit, truth, rep=0, *, kind="over", variance=True, translation="center", cell="euclidean",
                rbar=None):
    """Loop over atoms and true atoms, straight from the definitions."""
    rbar = rbar or (lambda m: {2: 4.0, 3: 6.0}[m])
    F, T = _atoms_list(fit, rep), _atoms_list(truth, rep)
    if translation == "center":
        F, T = _center(F), _center(T)

    def blocks(f, t):
        parts = [_norm(f[1], t[1]), _norm(f[2], t[2]), abs(f[3] - t[3])]
        if variance:
            parts.append(abs(f[4] - t[4]))
        return parts

    cells = []
    for f in F:
        ds = []
        for t in T:
            parts = blocks(f, t)
            ds.append(math.sqrt(sum(x * x for x in parts)) if cell == "euclidean" else sum(parts))
        best = min(ds)
        cells.append(ds.index(best))                # first minimum: the lowest-index true atom
    loss = 0.0
    for j, t in enumerate(T):
        members = [i for i, c in enumerate(cells) if c == j]
        loss += abs(sum(math.exp(F[i][0]) for i in members) - math.exp(t[0]))
        size = len(members)
        fast = 1.0 if (kind == "exact" or size <= 1) else rbar(size)
        slow = 1.0 if fast == 1.0 else fast / 2
        for i in members:
            parts = blocks(F[i], t)
            expo = [fast, slow, fast, slow][: len(parts)]
            loss += math.exp(F[i][0]) * sum(x**e for x, e in zip(parts, expo, strict=True))
    return loss


def random_params(rng, reps, k, d, scale=1.0, noise=True):
    # noise sds >= 0.6 stay positive under near_truth_fit's Gaussian jitter (<= 0.1): a negative draw needs 6 sd
    return ms.Params(
        rng.normal(0, scale, (reps, k)), rng.normal(0, scale, (reps, k, d)), rng.normal(0, scale, (reps, k, d)),
        rng.normal(0, scale, (reps, k)), noise_sd=rng.uniform(0.6, 1.5, (reps, k)) if noise else None,
    )


def near_truth_fit(truth, k, reps, rng, jitter=0.05):
    """Fits with k >= k* atoms: every true atom copied once, the extra atoms copy random true atoms."""
    t = truth.numpy()
    kt = t.k
    src = np.concatenate([np.arange(kt), rng.integers(0, kt, k - kt)])
    counts = np.bincount(src, minlength=kt)
    gb = t.gate_bias[src] - np.log(counts[src])            # split weights evenly
    p = ms.Params(gb, t.gate_weight[src], t.expert_weight[src], t.expert_bias[src], noise_sd=t.noise_sd[src])
    return p.batched(reps).perturb(jitter, seed=int(rng.integers(1 << 30)),
                                   blocks=("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd"))


# ------------------------------------------------------------------------------ brute force agreement
@pytest.mark.parametrize("d,k_true,extra", [(1, 1, 0), (1, 2, 0), (1, 2, 1), (2, 2, 2), (3, 3, 1), (2, 3, 2)])
@pytest.mark.parametrize("kind", ["exact", "over"])
@pytest.mark.parametrize("variance", [True, False])
def test_matches_brute_force_near_truth(d, k_true, extra, kind, variance):
    rng = np.random.default_rng(100 * d + 10 * k_true + extra)
    truth = random_params(rng, 1, k_true, d, scale=2.0).select(0)
    fit = near_truth_fit(truth, k_true + extra, 6, rng)
    got = gaussian_voronoi_loss(fit, truth, kind=kind, variance=variance)
    want = [brute_force(fit, truth, r, kind=kind, variance=variance) for r in range(6)]
    np.testing.assert_allclose(got, want, rtol=RTOL)


@pytest.mark.parametrize("translation", ["center", "none"])
@pytest.mark.parametrize("cell", ["euclidean", "sum"])
def test_matches_brute_force_random_far_fits(translation, cell):
    # arbitrary fits (not near the truth): cells of any size up to k, empty cells, batched truth
    rng = np.random.default_rng(7)
    truth = random_params(rng, 8, 3, 2)
    fit = random_params(rng, 8, 5, 2)
    rbar = lambda m: 2.0 * m + 0.5  # noqa: E731 - any positive exponents, so cells of 4-5 atoms are defined
    got = gaussian_voronoi_loss(fit, truth, kind="over", translation=translation, cell_distance=cell, rbar=rbar)
    want = [brute_force(fit, truth, r, translation=translation, cell=cell, rbar=rbar) for r in range(8)]
    np.testing.assert_allclose(got, want, rtol=RTOL)


# ------------------------------------------------------------------------------ hand-computed examples
# truth (d=1), already centred: weights 0.5/0.5, beta1 = (1, -1) so sum_i pi_i beta1_i = 0.
TRUTH = ms.Params(np.log([0.5, 0.5]), [[1.0], [-1.0]], [[2.0], [-1.0]], [0.0, 3.0], noise_sd=[1.0, 0.5])
# fit: atoms 0, 1 split true atom 0 (weights 0.3, 0.2; beta1 1.2, 0.7 keep the fit centred:
# 0.3*1.2 + 0.2*0.7 + 0.5*(-1) = 0); atom 2 sits on true atom 1.
FIT = ms.Params(np.log([0.3, 0.2, 0.5]), [[1.2], [0.7], [-1.0]], [[2.1], [1.8], [-1.0]], [0.1, -0.2, 3.05],
                noise_sd=[math.sqrt(1.2), math.sqrt(0.9), math.sqrt(0.25 + 0.02)])


def test_hand_value_two_one_cells():
    # cell 0 (2 atoms, rbar = 4): dbeta1, b to the 4th power, da, dnu squared; cell 1 (1 atom): first order.
    # weight gaps: |0.3 + 0.2 - 0.5| = 0 and |0.5 - 0.5| = 0.
    c0 = 0.3 * (0.2**4 + 0.1**2 + 0.1**4 + 0.2**2) + 0.2 * (0.3**4 + 0.2**2 + 0.2**4 + 0.1**2)
    c1 = 0.5 * (0.0 + 0.0 + 0.05 + 0.02)
    frame = gaussian_voronoi_frame(FIT, TRUTH)
    assert frame["kind"].item() == "over" and frame["cell_sizes"].item() == "2-1"
    assert frame["exponents"].item() == "4-1"
    assert frame["cell_0"].item() == pytest.approx(c0, rel=1e-10)
    assert frame["cell_1"].item() == pytest.approx(c1, rel=1e-10)
    assert gaussian_voronoi_loss(FIT, TRUTH)[0] == pytest.approx(c0 + c1, rel=1e-10)
    assert c0 + c1 == pytest.approx(0.06245, rel=1e-12)
    # the exact-specified loss charges the same cells to the first order
    c0_exact = 0.3 * (0.2 + 0.1 + 0.1 + 0.2) + 0.2 * (0.3 + 0.2 + 0.2 + 0.1)
    assert gaussian_voronoi_loss(FIT, TRUTH, kind="exact")[0] == pytest.approx(c0_exact + c1, rel=1e-10)


def test_hand_value_three_atom_cell_and_weight_gap():
    # d=1, translation="none": true atom 0 split three ways (rbar(3) = 6, half exponent 3), weight gaps nonzero.
    truth = ms.Params([0.0, 1.0], [[0.0], [4.0]], [[0.0], [4.0]], [0.0, 4.0], noise_sd=[1.0, 1.0])
    fit = ms.Params([-1.0, -1.5, -2.0, 0.9], [[0.5], [-0.5], [0.0], [4.0]], [[0.0], [0.5], [0.0], [4.0]],
                    [0.0, 0.0, -0.5, 4.0], noise_sd=[1.0, 1.0, math.sqrt(1.5), math.sqrt(0.8)])
    w = np.exp([-1.0, -1.5, -2.0, 0.9])
    gap0 = abs(w[0] + w[1] + w[2] - 1.0)
    gap1 = abs(w[3] - math.e)
    over = w[0] * 0.5**6 + w[1] * (0.5**6 + 0.5**3) + w[2] * (0.5**6 + 0.5**3)
    exact = w[3] * 0.2
    frame = gaussian_voronoi_frame(fit, truth, translation="none")
    assert frame["cell_sizes"].item() == "3-1" and frame["exponents"].item() == "6-1"
    assert frame["weight_gap"].item() == pytest.approx(gap0 + gap1, rel=1e-12)
    assert frame["loss"].item() == pytest.approx(gap0 + gap1 + over + exact, rel=1e-12)


def test_cell_distance_sum_vs_euclidean_assigns_differently():
    # fitted atom: (dbeta1, da) = (0.6, 0.6) from true atom 0 -> Euclid 0.849, sum 1.2;
    # dbeta1 = 1.0 from true atom 1 -> 1.0 either way.  Euclid picks 0, the block sum picks 1.
    truth = ms.Params([0.0, 0.0], [[0.0], [1.6]], [[0.0], [0.6]], [0.0, 0.0], noise_sd=[1.0, 1.0])
    fit = ms.Params([0.0], [[0.6]], [[0.6]], [0.0], noise_sd=[1.0])
    euc = gaussian_voronoi_frame(fit, truth, translation="none", kind="over")
    tot = gaussian_voronoi_frame(fit, truth, translation="none", kind="over", cell_distance="sum")
    assert euc["cell_sizes"].item() == "1-0" and tot["cell_sizes"].item() == "0-1"
    assert euc["loss"].item() == pytest.approx(0.0 + 1.0 + 1.2, rel=1e-12)   # gaps |1-1| + |0-1|; 0.6 + 0.6
    assert tot["loss"].item() == pytest.approx(1.0 + 0.0 + 1.0, rel=1e-12)   # gaps |0-1| + |1-1|; 1.0


# ------------------------------------------------------------------------------------ symmetries
@settings(max_examples=25)
@given(seed=st.integers(0, 2**31 - 1), k_true=st.integers(1, 3), extra=st.integers(0, 2),
       data=st.data())
def test_permutation_invariance(seed, k_true, extra, data):
    rng = np.random.default_rng(seed)
    truth = random_params(rng, 1, k_true, 2, scale=2.0).select(0)
    fit = near_truth_fit(truth, k_true + extra, 3, rng, jitter=0.1)
    perm = data.draw(st.permutations(list(range(k_true + extra))))
    base = gaussian_voronoi_loss(fit, truth)
    # same fitted atoms in another order: same loss (fp sums in another order: rounding only)
    np.testing.assert_allclose(gaussian_voronoi_loss(fit.permute(perm), truth), base, rtol=1e-10)
    tperm = data.draw(st.permutations(list(range(k_true))))
    np.testing.assert_allclose(gaussian_voronoi_loss(fit, truth.permute(tperm)), base, rtol=1e-10)


@settings(max_examples=25)
@given(seed=st.integers(0, 2**31 - 1), t0=st.floats(-5, 5), s0=st.floats(-5, 5),
       t1=st.lists(st.floats(-5, 5), min_size=2, max_size=2), s1=st.lists(st.floats(-5, 5), min_size=2, max_size=2))
def test_translation_invariance(seed, t0, s0, t1, s1):
    rng = np.random.default_rng(seed)
    truth = random_params(rng, 1, 2, 2, scale=2.0).select(0)
    fit = near_truth_fit(truth, 3, 2, rng, jitter=0.1)
    moved_fit = ms.Params(fit.gate_bias + t0, fit.gate_weight + np.asarray(t1), fit.expert_weight, fit.expert_bias,
                          noise_sd=fit.noise_sd)
    moved_truth = ms.Params(truth.gate_bias + s0, truth.gate_weight + np.asarray(s1), truth.expert_weight,
                            truth.expert_bias, noise_sd=truth.noise_sd)
    # translating by up to 5 in logits changes exp(beta0) by up to e^5; centring removes it up to rounding
    np.testing.assert_allclose(gaussian_voronoi_loss(moved_fit, moved_truth), gaussian_voronoi_loss(fit, truth),
                               rtol=1e-9, atol=1e-12)


def test_translation_matters_without_centring():
    # the invariance test above can fail: without centring a shifted gate intercept changes the loss
    rng = np.random.default_rng(3)
    truth = random_params(rng, 1, 2, 1).select(0)
    moved = ms.Params(truth.gate_bias + 1.0, truth.gate_weight, truth.expert_weight, truth.expert_bias,
                      noise_sd=truth.noise_sd)
    assert gaussian_voronoi_loss(moved, truth)[0] == pytest.approx(0.0, abs=1e-12)
    assert gaussian_voronoi_loss(moved, truth, translation="none")[0] > 0.1


@pytest.mark.parametrize("kind", ["exact", "over", "auto"])
def test_zero_at_truth_and_at_exact_splits(kind):
    rng = np.random.default_rng(11)
    truth = random_params(rng, 1, 3, 2, scale=2.0).select(0)
    assert gaussian_voronoi_loss(truth, truth, kind=kind)[0] == pytest.approx(0.0, abs=1e-12)
    # splitting true atom 1 into three equal-weight copies is the same model: zero loss
    t = truth.numpy()
    src = [0, 1, 1, 1, 2]
    split = ms.Params(t.gate_bias[src] - np.log([1, 3, 3, 3, 1]), t.gate_weight[src], t.expert_weight[src],
                      t.expert_bias[src], noise_sd=t.noise_sd[src])
    assert gaussian_voronoi_loss(split, truth, kind=kind)[0] == pytest.approx(0.0, abs=1e-12)
    assert gaussian_voronoi_frame(split, truth)["cell_sizes"].item() == "1-3-1"


def test_exact_and_over_agree_with_singleton_cells_only():
    rng = np.random.default_rng(5)
    truth = random_params(rng, 1, 3, 2, scale=3.0).select(0)
    fit = near_truth_fit(truth, 3, 10, rng)
    frame = gaussian_voronoi_frame(fit, truth, kind="over")
    assert (frame["cell_sizes"] == "1-1-1").all()
    np.testing.assert_allclose(gaussian_voronoi_loss(fit, truth, kind="exact"), frame["loss"], rtol=RTOL)
    # ... and differ once a cell holds two atoms (so the agreement above is not vacuous)
    fit4 = near_truth_fit(truth, 4, 10, rng)
    assert not np.allclose(gaussian_voronoi_loss(fit4, truth, kind="exact"),
                           gaussian_voronoi_loss(fit4, truth, kind="over"))


def test_auto_picks_exact_iff_k_equals_k_true():
    rng = np.random.default_rng(9)
    truth = random_params(rng, 1, 2, 1, scale=2.0).select(0)
    f2, f3 = near_truth_fit(truth, 2, 4, rng), near_truth_fit(truth, 3, 4, rng)
    np.testing.assert_array_equal(gaussian_voronoi_loss(f2, truth), gaussian_voronoi_loss(f2, truth, kind="exact"))
    np.testing.assert_array_equal(gaussian_voronoi_loss(f3, truth), gaussian_voronoi_loss(f3, truth, kind="over"))
    assert set(gaussian_voronoi_frame(f3, truth)["kind"]) == {"over"}


# ------------------------------------------------------------------------------ inputs and frame
def test_frame_columns_and_grouping():
    rng = np.random.default_rng(21)
    truth = random_params(rng, 1, 2, 1, scale=2.0).select(0)
    fit = near_truth_fit(truth, 4, 12, rng)
    frame = gaussian_voronoi_frame(fit, truth)
    assert list(frame.columns) == ["rep", "kind", "k", "k_true", "loss", "cell_sizes", "n_empty", "exponents",
                                   "weight_gap", "param_term", "cell_0", "cell_1"]
    np.testing.assert_allclose(frame["cell_0"] + frame["cell_1"], frame["loss"], rtol=RTOL)
    np.testing.assert_allclose(frame["weight_gap"] + frame["param_term"], frame["loss"], rtol=RTOL)
    sizes = frame["cell_sizes"].str.split("-").map(lambda s: [int(x) for x in s])
    assert all(sum(s) == 4 for s in sizes)
    assert (frame["n_empty"] == sizes.map(lambda s: s.count(0))).all()
    assert frame.groupby("cell_sizes")["loss"].mean().notna().all()


def test_torch_dict_and_pair_inputs():
    rng = np.random.default_rng(4)
    truth = random_params(rng, 1, 2, 2, scale=2.0).select(0)
    fit = near_truth_fit(truth, 3, 3, rng)
    base = gaussian_voronoi_loss(fit, truth)
    np.testing.assert_allclose(gaussian_voronoi_loss(fit.to_torch(), truth.to_torch()), base, rtol=1e-12)
    as_dict = {name: np.asarray(v) for name, v in truth.blocks()}
    np.testing.assert_allclose(gaussian_voronoi_loss(fit, as_dict), base, rtol=1e-12)
    # a (MoE, Params) pair supplies a common noise sd; temperature tau divides the gate parameters
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=2, noise_sd=0.7)
    no_sd = ms.Params(truth.gate_bias, truth.gate_weight, truth.expert_weight, truth.expert_bias)
    with_sd = ms.Params(truth.gate_bias, truth.gate_weight, truth.expert_weight, truth.expert_bias,
                        noise_sd=[0.7, 0.7])
    np.testing.assert_allclose(gaussian_voronoi_loss(fit, (spec, no_sd)), gaussian_voronoi_loss(fit, with_sd))
    hot = ms.MoE(gate="softmax", expert="linear", k=2, d=2, noise_sd=0.7, temperature=2.0)
    doubled = ms.Params(2 * truth.gate_bias, 2 * truth.gate_weight, truth.expert_weight, truth.expert_bias,
                        noise_sd=[0.7, 0.7])
    np.testing.assert_allclose(gaussian_voronoi_loss(fit, (hot, doubled)), gaussian_voronoi_loss(fit, with_sd),
                               rtol=1e-12)


def test_unbatched_returns_length_one_array():
    out = gaussian_voronoi_loss(FIT, TRUTH)
    assert isinstance(out, np.ndarray) and out.shape == (1,)


# ------------------------------------------------------------------------------------- bad input
def test_mismatched_dimension():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"fitted has input dimension d=2 but truth has d=1"):
        gaussian_voronoi_loss(random_params(rng, 1, 2, 2).select(0), random_params(rng, 1, 2, 1).select(0))


def test_missing_noise_sd():
    no_sd = ms.Params(TRUTH.gate_bias, TRUTH.gate_weight, TRUTH.expert_weight, TRUTH.expert_bias)
    with pytest.raises(ValueError, match=r"truth has no noise_sd.*variance=False"):
        gaussian_voronoi_loss(FIT, no_sd)
    with pytest.raises(ValueError, match=r"fitted has no noise_sd"):
        gaussian_voronoi_loss(no_sd, TRUTH)
    # without the variance term it is fine, and equals the brute force without nu
    got = gaussian_voronoi_loss(no_sd, TRUTH, variance=False)[0]
    assert got == pytest.approx(brute_force(no_sd, TRUTH, variance=False, kind="exact"), rel=RTOL)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"kind='D1' is not supported"):
        gaussian_voronoi_loss(FIT, TRUTH, kind="D1")
    with pytest.raises(ValueError, match=r"translation='inf'"):
        gaussian_voronoi_loss(FIT, TRUTH, translation="inf")
    with pytest.raises(ValueError, match=r"cell_distance='l1'"):
        gaussian_voronoi_loss(FIT, TRUTH, cell_distance="l1")
    with pytest.raises(TypeError, match=r"fitted must be a moestat.Params"):
        gaussian_voronoi_loss(np.zeros(3), TRUTH)
    with pytest.raises(TypeError, match=r"variance must be True or False"):
        gaussian_voronoi_loss(FIT, TRUTH, variance="yes")
    with pytest.raises(ValueError, match=r"unknown block names \['sd'\]"):
        gaussian_voronoi_loss(FIT, {"sd": [1.0]})
    sig = ms.MoE(gate="sigmoid", expert="linear", k=2, d=1)
    with pytest.raises(ValueError, match=r"gate='sigmoid'.*voronoi_loss"):
        gaussian_voronoi_loss(FIT, (sig, TRUTH))
    relu = ms.MoE(gate="softmax", expert="relu", k=2, d=1)
    with pytest.raises(ValueError, match=r"expert='relu'"):
        gaussian_voronoi_loss(FIT, (relu, TRUTH))
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"fitted has R=3 replicates but truth has R=2"):
        gaussian_voronoi_loss(random_params(rng, 3, 2, 1), random_params(rng, 2, 2, 1))


def test_rbar_needed_for_cells_of_four():
    t = TRUTH.numpy()
    src = [0, 0, 0, 0, 1]
    split = ms.Params(t.gate_bias[src] - np.log([4, 4, 4, 4, 1]), t.gate_weight[src], t.expert_weight[src],
                      t.expert_bias[src], noise_sd=t.noise_sd[src]).perturb(0.05, seed=1)
    with pytest.raises(ValueError, match=r"holds 4 fitted atoms.*rbar=\{4: value\}"):
        gaussian_voronoi_loss(split, TRUTH)
    got = gaussian_voronoi_loss(split, TRUTH, rbar={4: 8})[0]
    assert got == pytest.approx(brute_force(split, TRUTH, rbar=lambda m: {2: 4, 3: 6, 4: 8}[m]), rel=RTOL)
    assert gaussian_voronoi_loss(split, TRUTH, rbar=lambda m: 2 * m)[0] == pytest.approx(got, rel=RTOL)
    with pytest.raises(ValueError, match=r"rbar\(4\) must be a finite number > 0"):
        gaussian_voronoi_loss(split, TRUTH, rbar={4: -1})
    with pytest.raises(TypeError, match=r"rbar must be None, a mapping"):
        gaussian_voronoi_loss(split, TRUTH, rbar=8)


def test_strict_checks():
    rng = np.random.default_rng(2)
    truth = random_params(rng, 1, 3, 1, scale=2.0).select(0)
    fit4 = near_truth_fit(truth, 4, 2, rng)
    with pytest.raises(ValueError, match=r"strict=True: kind='exact' is the loss for k = k\*"):
        gaussian_voronoi_loss(fit4, truth, kind="exact", strict=True)
    assert np.all(np.isfinite(gaussian_voronoi_loss(fit4, truth, strict=True)))
    t2 = ms.Params(truth.gate_bias[:2], truth.gate_weight[:2], truth.expert_weight[:2], truth.expert_bias[:2],
                   noise_sd=truth.noise_sd[:2])
    small = near_truth_fit(t2, 2, 2, rng)
    with pytest.raises(ValueError, match=r"k=2 < k\*=3"):
        gaussian_voronoi_loss(small, truth, kind="over", strict=True)
    # an empty cell: both fitted atoms sit on true atom 0 -> allowed by default, refused by strict
    t = truth.numpy()
    both0 = ms.Params(t.gate_bias[[0, 0, 0]], t.gate_weight[[0, 0, 0]], t.expert_weight[[0, 0, 0]],
                      t.expert_bias[[0, 0, 0]], noise_sd=t.noise_sd[[0, 0, 0]])
    frame = gaussian_voronoi_frame(both0, truth)
    assert frame["n_empty"].item() == 2 and frame["cell_sizes"].item() == "3-0-0"
    with pytest.raises(ValueError, match=r"replicates \[0\] leave a true atom with an empty Voronoi cell"):
        gaussian_voronoi_loss(both0, truth, strict=True)


def test_torch_grad_inputs_are_detached():
    rng = np.random.default_rng(8)
    truth = random_params(rng, 1, 2, 1).select(0)
    tt = truth.to_torch()
    tt = ms.Params(tt.gate_bias.requires_grad_(), tt.gate_weight, tt.expert_weight, tt.expert_bias,
                   noise_sd=tt.noise_sd)
    assert isinstance(tt.gate_bias, torch.Tensor)
    assert gaussian_voronoi_loss(tt, truth)[0] == pytest.approx(0.0, abs=1e-12)
