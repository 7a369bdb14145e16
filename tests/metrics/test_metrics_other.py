"""Matching, per-atom errors, L2(mu) distance, sup expert error, identifiability checks."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.metrics import (
    check_identifiability,
    homogeneity_orbit,
    l2_distance,
    match_atoms,
    parameter_errors,
    permutation_invariant_error,
    sup_expert_error,
    voronoi_loss,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def random_params(rng, k, d, scale=1.0):
    return ms.Params(rng.normal(0, scale, k), rng.normal(0, scale, (k, d)), rng.normal(0, scale, (k, d)),
                     rng.normal(0, scale, k))


# ----------------------------------------------------------------------------------- matching
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 7), d=st.integers(1, 4))
def test_matching_recovers_planted_permutation(seed, k, d):
    rng = np.random.default_rng(seed)
    truth = random_params(rng, k, d)
    perms = np.stack([rng.permutation(k) for _ in range(4)])
    fit = truth.batched(4).permute(perms).perturb(1e-4, seed=seed)   # small noise: atoms stay nearest
    for method in ("hungarian", "voronoi"):
        m = match_atoms(fit, truth, method)
        aligned = fit.permute(m.perm).numpy()
        np.testing.assert_allclose(aligned.gate_bias, np.broadcast_to(truth.gate_bias, (4, k)), atol=1e-3)
        # truth_index inverts the planted relabelling: fitted atom i is true atom perms[r, i]
        np.testing.assert_array_equal(m.truth_index, perms)


def test_hungarian_is_optimal_by_brute_force():
    rng = np.random.default_rng(3)
    truth = random_params(rng, 3, 2)
    fit = random_params(rng, 5, 2).batched(2).perturb(0.5, seed=1)
    m = match_atoms(fit, truth, "hungarian", blocks=ms.metrics.matching.ALL_BLOCKS)
    f = fit.numpy()
    for r in range(2):
        theta = np.concatenate([f.gate_bias[r][:, None], f.gate_weight[r], f.expert_weight[r],
                                f.expert_bias[r][:, None]], 1)
        theta_s = np.concatenate([truth.gate_bias[:, None], truth.gate_weight, truth.expert_weight,
                                  truth.expert_bias[:, None]], 1)
        best = min(sum(((theta[i] - theta_s[j]) ** 2).sum() for j, i in enumerate(choice))
                   for choice in itertools.permutations(range(5), 3))
        assert m.cost[r] == pytest.approx(best, rel=1e-12)
        assert permutation_invariant_error(fit, truth)[r] == pytest.approx(math.sqrt(best), rel=1e-12)
    frame = m.to_frame()
    assert len(frame) == 10 and (frame["true_atom"] == -1).sum() == 4


def test_permutation_invariant_error_zero_under_relabelling_and_softmax_translation():
    rng = np.random.default_rng(0)
    truth = random_params(rng, 4, 3)
    assert permutation_invariant_error(truth.permute([2, 0, 3, 1]), truth) == pytest.approx(0.0, abs=1e-15)
    shifted = ms.Params(truth.gate_bias + 2.0, truth.gate_weight - 1.5, truth.expert_weight, truth.expert_bias)
    assert permutation_invariant_error(shifted, truth) > 1
    assert permutation_invariant_error(shifted, truth, softmax=True) == pytest.approx(0.0, abs=1e-12)


# ----------------------------------------------------------------------------- parameter errors
def test_parameter_errors_hand_case():
    truth = ms.Params([0.0, 1.0], [[0.0], [2.0]], [[1.0], [-1.0]], [0.0, 1.0])
    fit = ms.Params([-1.0, 0.5, 1.2], [[0.1], [-0.1], [2.0]], [[1.0], [0.9], [-1.0]], [0.2, 0.0, 0.7])
    e = parameter_errors(fit, truth)
    assert len(e) == 3 * 5 + 2
    over = e[(e.specified == "over")]
    assert set(over.fitted_atom) == {-1, 0, 1} and set(over.cell_size) == {2}
    get = e.set_index(["fitted_atom", "block"])["error"].to_dict()  # a dict: a scalar per key in every pandas
    assert get[(0, "gate_weight")] == pytest.approx(0.1)
    assert get[(0, "expert")] == pytest.approx(0.2)
    assert get[(1, "expert_weight")] == pytest.approx(0.1)
    assert get[(2, "gate_bias")] == pytest.approx(0.2)
    assert get[(2, "expert_bias")] == pytest.approx(0.3)
    ws = e[e.block == "weight_sum"].set_index("true_atom")["error"]
    sig = lambda t: 1 / (1 + math.exp(-t))  # noqa: E731
    assert ws[0] == pytest.approx(abs(sig(-1) + sig(0.5) - sig(0)))
    assert ws[1] == pytest.approx(abs(sig(1.2) - sig(1.0)))
    soft = parameter_errors(fit, truth, gate="softmax")
    assert (soft["gate"] == "softmax").all()


def test_parameter_errors_reassemble_d1_and_flag_empty_cells():
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=1, expert="gelu", seed=0)
    idx = [*range(8), 7]
    fit = ms.Params(truth.gate_bias[idx], truth.gate_weight[idx], truth.expert_weight[idx],
                    truth.expert_bias[idx]).batched(3).perturb(0.02, seed=4)
    e = parameter_errors(fit, (spec, truth))
    for r in range(3):
        er = e[e.rep == r]
        over = er[er.specified == "over"]
        exact = er[er.specified == "exact"]
        d1 = (over[over.block == "weight_sum"].error.sum()
              + (over[over.block.isin(["gate_weight", "expert"])].error ** 2).sum()
              + exact[exact.block.isin(["gate_bias", "gate_weight", "expert"])].error.sum())
        assert d1 == pytest.approx(voronoi_loss(fit, truth, "D1")[r], rel=1e-12)
    # a truth with an extra far atom shows up as an empty cell with its weight as the gap
    far = ms.Params(np.r_[truth.gate_bias, 0.3], np.r_[truth.gate_weight, np.full((1, 32), 5.0)],
                    np.r_[truth.expert_weight, np.full((1, 32), 5.0)], np.r_[truth.expert_bias, 5.0])
    e2 = parameter_errors(fit, far)
    empty = e2[e2.specified == "empty"]
    assert set(empty.block) == {"weight_sum"} and len(empty) == 3
    np.testing.assert_allclose(empty.error, 1 / (1 + math.exp(-0.3)))


# ------------------------------------------------------------------------------------ distances
def test_l2_distance_linear_experts_constant_gates_closed_form():
    """Constant gates + linear experts: f_a - f_b = c^T x + e, so E(c^T X + e)^2 = e^2 + |c|^2/3 on U[-1,1]^d."""
    rng = np.random.default_rng(0)
    d, k = 3, 2
    spec = ms.MoE(gate="softmax", expert="linear", k=k, d=d)
    pa = ms.Params(rng.normal(size=k), np.zeros((k, d)), rng.normal(size=(k, d)), rng.normal(size=k))
    pb = ms.Params(rng.normal(size=k), np.zeros((k, d)), rng.normal(size=(k, d)), rng.normal(size=k))
    wa, wb = np.exp(pa.gate_bias) / np.exp(pa.gate_bias).sum(), np.exp(pb.gate_bias) / np.exp(pb.gate_bias).sum()
    c = wa @ pa.expert_weight - wb @ pb.expert_weight
    e = wa @ pa.expert_bias - wb @ pb.expert_bias
    X = rng.uniform(-1, 1, size=(200_000, d))
    got = l2_distance(spec, pa, pb, X)
    # exact identity on the sample: mean (c^T x + e)^2 = c^T S c + 2 e c^T xbar + e^2
    S, xbar = X.T @ X / len(X), X.mean(0)
    assert got**2 == pytest.approx(c @ S @ c + 2 * e * c @ xbar + e**2, rel=1e-10)
    # population value; tolerance: 5 Monte-Carlo standard errors of the mean of (c^T X + e)^2
    pop = e**2 + c @ c / 3
    vals = (X @ c + e) ** 2
    assert abs(got**2 - pop) < 5 * vals.std() / math.sqrt(len(X))
    # batched: per-replicate values, and an unbatched partner broadcasts
    batch = ms.Params.stack([pa, pb])
    np.testing.assert_allclose(l2_distance(spec, batch, pb, X), [got, 0.0], atol=1e-15)
    np.testing.assert_allclose(l2_distance(spec, batch, pb, torch.as_tensor(X)), [got, 0.0], atol=1e-15)


def test_l2_distance_sigmoid_constant_gates_closed_form():
    """Sigmoid gates with zero slope are constants sigma(beta0): f(x) = sum_i sigma(beta0_i) (a_i^T x + b_i)."""
    rng = np.random.default_rng(5)
    d, k = 2, 3
    spec = ms.MoE(gate="sigmoid", expert="linear", k=k, d=d)
    pa, pb = (ms.Params(rng.normal(size=k), np.zeros((k, d)), rng.normal(size=(k, d)), rng.normal(size=k))
              for _ in range(2))
    sa, sb = 1 / (1 + np.exp(-pa.gate_bias)), 1 / (1 + np.exp(-pb.gate_bias))
    c = sa @ pa.expert_weight - sb @ pb.expert_weight
    e = sa @ pa.expert_bias - sb @ pb.expert_bias
    X = rng.uniform(-1, 1, size=(50_000, d))
    got = l2_distance(spec, pa, pb, X)
    assert got**2 == pytest.approx(np.mean((X @ c + e) ** 2), rel=1e-10)
    vals = (X @ c + e) ** 2
    assert abs(got**2 - (e**2 + c @ c / 3)) < 5 * vals.std() / math.sqrt(len(X))   # 5 Monte-Carlo SEs


def test_l2_distance_across_gates_and_bad_input():
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    soft = ms.MoE(gate="softmax", expert="relu", k=8, d=32)
    X = np.random.default_rng(1).uniform(-1, 1, (1000, 32))
    assert l2_distance(soft, truth, truth, X, spec_b=spec) > 0
    with pytest.raises(ValueError, match="shape"):
        l2_distance(spec, truth, truth, X[:, :5])
    with pytest.raises(ValueError, match="d="):
        l2_distance(spec, truth, truth, X, spec_b=ms.MoE(gate="sigmoid", expert="relu", k=8, d=3))
    with pytest.raises(TypeError, match="MoE"):
        l2_distance("sigmoid", truth, truth, X)


def test_parameter_errors_expert_sup_block():
    spec = ms.MoE(gate="sigmoid", expert="linear", k=2, d=1)
    truth = ms.Params([0.0, 0.0], [[0.0], [3.0]], [[1.0], [-1.0]], [0.0, 1.0])
    fit = ms.Params([0.0, 0.0], [[0.0], [3.0]], [[1.2], [-1.0]], [-0.1, 1.5])
    X = np.linspace(-1, 1, 201)[:, None]
    e = parameter_errors(fit, truth, X=X, spec=spec)
    sup = e[e.block == "expert_sup"].set_index("fitted_atom")["error"]
    np.testing.assert_allclose(sup.loc[[0, 1]], [0.3, 0.5], rtol=1e-12)
    with pytest.raises(ValueError, match="expert family"):
        parameter_errors(fit, truth, X=X)


def test_sup_expert_error_linear_closed_form():
    """For linear experts on [-1, 1], max |da x + db| = |da| + |db| (attained at x = +-1)."""
    spec = ms.MoE(gate="sigmoid", expert="linear", k=2, d=1)
    truth = ms.Params([0.0, 0.0], [[0.0], [3.0]], [[1.0], [-1.0]], [0.0, 1.0])
    fit = ms.Params([0.0, 0.0], [[0.0], [3.0]], [[1.2], [-1.0]], [-0.1, 1.5])
    X = np.linspace(-1, 1, 201)[:, None]
    np.testing.assert_allclose(sup_expert_error(spec, fit, truth, X), [[0.2 + 0.1, 0.5]], rtol=1e-12)


# ------------------------------------------------------------------------------- identifiability
X2 = np.random.default_rng(0).uniform(-1, 1, size=(1500, 2))
ATOMS = ms.Params([0.3, -0.2], [[0.0, 0.0], [0.8, -0.5]], [[1.5, -1.0], [-0.7, 1.2]], [0.2, -0.4])


@pytest.mark.parametrize("expert", ["relu", "linear"])
@pytest.mark.parametrize("kind", ["strong", "weak"])
def test_homogeneous_experts_fail_at_zero_slope(expert, kind):
    spec = ms.MoE(gate="sigmoid", expert=expert, k=2, d=2)
    res = check_identifiability(spec, ATOMS, kind, X2)
    assert not res.identifiable
    assert res.relative[-1] < 1e-13            # an exact identity: machine precision, not conditioning
    null = res.null_vectors[res.null_vectors.direction == 0]
    # the dependence lives on the zero-slope atom 0 (Euler identity h = a.dh/da + b dh/db)
    assert null.loc[null.coefficient.abs() > 1e-6, "atom"].unique().tolist() == [0]
    frame = res.to_frame()
    assert frame["deficient"].sum() == len(res.singular_values) - res.rank


def test_euler_identity_is_the_null_combination_for_relu_weak():
    """Weak family at beta1 = 0: dF/dbeta0 = (1 - sigma(beta0)) (a . dF/da + b dF/db)."""
    spec = ms.MoE(gate="sigmoid", expert="relu", k=2, d=2)
    res = check_identifiability(spec, ATOMS, "weak", X2)
    null = res.null_vectors[(res.null_vectors.direction == 0) & (res.null_vectors.atom == 0)]
    raw = null.set_index("function")["coefficient_raw"]
    s = 1 / (1 + math.exp(-0.3))
    ratio = -raw["dF/da[0]"] / raw["dF/dbeta0"]
    assert ratio == pytest.approx((1 - s) * 1.5, rel=1e-8)
    assert -raw["dF/db"] / raw["dF/dbeta0"] == pytest.approx((1 - s) * 0.2, rel=1e-8)


@pytest.mark.parametrize("expert", ["gelu", "tanh"])
@pytest.mark.parametrize("kind", ["strong", "weak"])
def test_non_homogeneous_experts_pass(expert, kind):
    spec = ms.MoE(gate="sigmoid", expert=expert, k=2, d=2)
    res = check_identifiability(spec, ATOMS, kind, X2)
    assert res.identifiable
    assert res.relative[-1] > 1e-7             # far above the exact-identity level of the relu case


def test_strong_family_structure_and_relu_second_derivative_dropped():
    spec = ms.MoE(gate="sigmoid", expert="relu", k=1, d=1)
    atom = ms.Params([0.3], [[0.0]], [[1.0]], [0.2])
    res = check_identifiability(spec, atom, "strong", np.random.default_rng(0).uniform(-1, 1, (400, 1)))
    cols = res.columns
    # d=1, eta=(a,b): {x^nu phi^(tau)}: nu in 0..2 for tau = 0, 1, 2 -> 9 distinct functions
    assert len(cols) == 9
    dropped = cols[cols.status != "kept"]
    assert len(dropped) == 3 and dropped.function.str.startswith("d^2h").all()
    assert not res.identifiable


def test_derivative_family_matches_finite_differences_and_closed_forms():
    """Autograd columns vs central differences of an independent numpy F, and GELU derivative formulas."""
    from scipy.special import ndtr

    spec = ms.MoE(gate="sigmoid", expert="gelu", k=2, d=2)
    X = X2[:200]
    gelu = lambda z: z * ndtr(z)  # noqa: E731
    dens = lambda z: np.exp(-z**2 / 2) / np.sqrt(2 * np.pi)  # noqa: E731

    def F(theta):   # theta = (beta1[0], beta1[1], beta0, a[0], a[1], b)
        gate = 1 / (1 + np.exp(-(X @ theta[:2] + theta[2])))
        return gate * gelu(X @ theta[3:5] + theta[5])

    M, cols = ms.metrics.derivative_family(spec, ATOMS, "weak", X)
    names = ["beta1[0]", "beta1[1]", "beta0", "a[0]", "a[1]", "b"]
    theta = np.r_[ATOMS.gate_weight[1], ATOMS.gate_bias[1], ATOMS.expert_weight[1], ATOMS.expert_bias[1]]
    eps = 1e-6
    for c, name in enumerate(names):
        e = np.zeros(6)
        e[c] = eps
        fd = (F(theta + e) - F(theta - e)) / (2 * eps)
        col = cols[(cols.atom == 1) & (cols.function == f"dF/d{name}")].column.item()
        np.testing.assert_allclose(M[:, col], fd, rtol=1e-7, atol=1e-9)   # O(eps^2) truncation, rounding 1e-10

    M, cols = ms.metrics.derivative_family(spec, ATOMS, "strong", X)
    z = X @ ATOMS.expert_weight[0] + ATOMS.expert_bias[0]
    d1, d2 = ndtr(z) + z * dens(z), (2 - z**2) * dens(z)
    expected = {"h": gelu(z), "x[1]*h": X[:, 1] * gelu(z), "d^1h/da[0]": X[:, 0] * d1, "d^1h/db": d1,
                "d^2h/dbdb": d2, "d^2h/da[0]da[1]": X[:, 0] * X[:, 1] * d2, "x[0]*x[1]*h": X[:, 0] * X[:, 1] * gelu(z)}
    s1 = cols[cols.atom == 0]
    assert (s1["class"] == "S1").all() and len(s1) == 18      # 3 orders x 6 monomials of degree <= 2 in d=2
    for label, want in expected.items():
        np.testing.assert_allclose(M[:, s1[s1.function == label].column.item()], want, rtol=1e-12, atol=1e-14)


def test_constant_expert_never_identifiable():
    spec = ms.MoE(gate="sigmoid", expert="constant", k=1, d=2)
    atom = ms.Params([0.1], [[0.0, 0.0]], [[0.0, 0.0]], [1.0])
    assert not check_identifiability(spec, atom, "strong", X2).identifiable


def test_identifiability_bad_input():
    spec = ms.MoE(gate="sigmoid", expert="gelu", k=2, d=2)
    with pytest.raises(ValueError, match="sigmoid"):
        check_identifiability(ms.MoE(gate="softmax", expert="gelu", k=2, d=2), ATOMS, "strong", X2)
    with pytest.raises(ValueError, match="kind"):
        check_identifiability(spec, ATOMS, "medium", X2)
    with pytest.raises(ValueError, match="rows"):
        check_identifiability(spec, ATOMS, "strong", X2[:10])
    with pytest.raises(ValueError, match="shape"):
        check_identifiability(spec, ATOMS, "strong", X2[:, :1])
    with pytest.raises(ValueError, match="unbatched"):
        check_identifiability(spec, ATOMS.batched(2), "strong", X2)


# ------------------------------------------------------------ the exact non-identifiable orbit (C1)
def test_relu_homogeneity_orbit_is_invisible_to_f_but_not_to_d1():
    """Limitation of D1 with relu experts: sigma(b0') relu(t z) == sigma(b0) relu(z) when sigma(b0') = sigma(b0)/t."""
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=1, expert="relu", seed=0)
    orbit = homogeneity_orbit(truth, atom=7, t=1.7)
    X = np.random.default_rng(2).uniform(-1, 1, size=(20_000, 32))
    diff = np.abs(spec.mean(orbit, X) - spec.mean(truth, X)).max()
    assert diff < 1e-12
    assert l2_distance(spec, orbit, truth, X) < 1e-12
    assert voronoi_loss(orbit, truth, "D1") > 0.1
    with pytest.raises(ValueError, match="constant gate"):
        homogeneity_orbit(truth, atom=0, t=2.0)
    with pytest.raises(ValueError, match="t must exceed"):
        homogeneity_orbit(truth, atom=7, t=0.1)


def test_frames_are_tidy():
    spec = ms.MoE(gate="sigmoid", expert="gelu", k=2, d=2)
    res = check_identifiability(spec, ATOMS, "strong", X2)
    assert isinstance(res.to_frame(), pd.DataFrame)
    assert {"direction", "atom", "function", "coefficient", "coefficient_raw"} <= set(res.null_vectors.columns)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 4), extra=st.integers(0, 2), batch=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_optimal_assignment_matches_brute_force(m, extra, batch, seed):
    """The one atom matcher: the minimum-cost injective map from m reference items to k >= m candidates, per batch
    entry, equals the brute-force minimum over all injective maps."""
    from moestat.metrics.matching import optimal_assignment

    k = m + extra
    cost = np.random.default_rng(seed).exponential(size=(batch, m, k))
    match = optimal_assignment(cost)
    assert match.shape == (batch, m)
    for b in range(batch):
        assert len(set(match[b])) == m
        best = min(sum(cost[b, i, p[i]] for i in range(m)) for p in itertools.permutations(range(k), m))
        assert math.isclose(cost[b, np.arange(m), match[b]].sum(), best, rel_tol=1e-12)
    with pytest.raises(ValueError, match="m <= k"):
        optimal_assignment(np.ones((3, 2)))


def test_metrics_take_a_fit_result_as_its_params():
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
    truth = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.5])
    data = ms.simulate(spec, truth, n=300, reps=2, seed=0, model="mixture")
    lse = ms.fit_lse(spec, data.X, data.y, init="near_truth", truth=truth, seed=1)
    mle = ms.fit_mle(spec, data.X, data.y, seed=1, restarts=2)
    for fit in (lse, mle):
        np.testing.assert_array_equal(ms.voronoi_loss(fit, (spec, truth), kind="D1"),
                                      ms.voronoi_loss(fit.params, (spec, truth), kind="D1"))
        pd.testing.assert_frame_equal(ms.parameter_errors(fit, (spec, truth)),
                                      ms.parameter_errors(fit.params, (spec, truth)))
    with pytest.raises(TypeError, match="a fit result"):
        ms.voronoi_loss(np.zeros(3), (spec, truth))
