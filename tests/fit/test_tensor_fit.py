"""The two-stage tensor estimator of makkuva2020 (moestat.fit.tensor) and its baselines."""

import itertools
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.fit.gated import expert_loglik, gated_starts, llog_grad, llog_terms
from moestat.fit.tensor import (
    _l4_batched,
    _l4_moments,
    _l4_tensor_batched,
    l4_loss,
    l4_population,
    minimise_l4_population,
    recover_regressors,
)
from moestat.hermite import output_transform


def _values(frame):
    return frame.groupby("metric")["value"].max().to_dict()


def _dense_score4(x):
    """Multivariate He4 score S4(x) built from its definition, for one sample."""
    d = len(x)
    eye = np.eye(d)
    t = np.einsum("a,b,c,e->abce", x, x, x, x)
    for (i, j), (p, q) in [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2)),
                           ((1, 2), (0, 3)), ((1, 3), (0, 2)), ((2, 3), (0, 1))]:
        idx = ["a", "b", "c", "e"]
        t -= np.einsum(f"{idx[i]}{idx[j]},{idx[p]},{idx[q]}->abce", eye, x, x)
    t += (np.einsum("ab,ce->abce", eye, eye) + np.einsum("ac,be->abce", eye, eye)
          + np.einsum("ae,bc->abce", eye, eye))
    return t


def test_l4_sample_form_matches_dense_score_tensor_and_tensor_form():
    rng = np.random.default_rng(0)
    n, d, k = 200, 3, 2
    X, y = rng.standard_normal((n, d)), rng.standard_normal(n)
    A = rng.standard_normal((k, d))
    T = output_transform("relu", 0.1)
    yt = torch.tensor(y)
    q4, q2 = T.q4(yt).numpy(), T.q2(yt).numpy()
    T4 = np.mean([q * _dense_score4(x) for q, x in zip(q4, X, strict=True)], axis=0) / T.c4
    T2 = (np.einsum("n,na,nb->ab", q2, X, X) / n - q2.mean() * np.eye(d)) / T.c2
    mu, lam, ridge = 0.3, 2.0, 0.5
    ref = sum(np.einsum("abce,a,b,c,e->", T4, A[i], A[i], A[j], A[j]) for i, j in itertools.permutations(range(k), 2))
    ref -= mu * sum(np.einsum("abce,a,b,c,e->", T4, a, a, a, a) for a in A)
    ref += lam * sum((a @ T2 @ a - 1) ** 2 for a in A) + ridge / 2 * np.sum(A**2)
    got = l4_loss(A, X, y, activation="relu", sigma=0.1, mu=mu, lam=lam, ridge=ridge)
    assert got == pytest.approx(ref, rel=1e-10)
    Xt, At = torch.tensor(X)[None], torch.tensor(A)[None, None]
    tens = _l4_tensor_batched(At, _l4_moments(Xt, T.q4(yt)[None], T.q2(yt)[None]), T.c4, T.c2, mu, lam, ridge)
    assert float(tens) == pytest.approx(ref, rel=1e-10)


def test_l4_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    X = torch.tensor(rng.standard_normal((1, 300, 4)))
    y = torch.tensor(rng.standard_normal((1, 300)))
    A = torch.tensor(rng.standard_normal((1, 2, 3, 4)), requires_grad=True)

    def f(a):
        return _l4_batched(a, X, y**4 - 6 * y**2, y**2, 24.0, 2.0, 0.1, 10.0, 1.0).sum()

    (g,) = torch.autograd.grad(f(A), A)
    h = 1e-6
    fd = torch.zeros_like(g)
    for idx in itertools.product(*(range(s) for s in A.shape)):
        e = torch.zeros_like(A)
        e[idx] = h
        fd[idx] = (f(A.detach() + e) - f(A.detach() - e)) / (2 * h)
    assert torch.allclose(g, fd, rtol=1e-6, atol=1e-6)


def test_llog_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    R, S, n, k, d = 1, 2, 400, 3, 4
    X = torch.tensor(rng.standard_normal((R, n, d)))
    y = torch.tensor(rng.standard_normal((R, n)))
    E = torch.tensor(rng.standard_normal((R, S, k, n)))
    ll = expert_loglik(y, E, 0.7)
    W = torch.tensor(rng.standard_normal((R, S, k - 1, d)))
    _, prior, post = llog_terms(W, X, ll)
    g = llog_grad(X, prior, post)
    h = 1e-6
    for idx in itertools.product(*(range(s) for s in W.shape)):
        e = torch.zeros_like(W)
        e[idx] = h
        fd = (llog_terms(W + e, X, ll)[0].sum() - llog_terms(W - e, X, ll)[0].sum()) / (2 * h)
        assert float(g[idx]) == pytest.approx(float(fd), abs=1e-7)


def test_tensor_identities_lemma1_at_large_n():
    # E[Q2 t3(a1*)] = E[Q4 t2(a1*)] = alpha_1 = 1/2 (Lemma 1 / Theorem 5; orthogonal gate, so E[p_1] = 1/2)
    data = ms.simulate_gated_nn(n=200_000, seed=3)
    A = data.truth.regressors
    pop = l4_population(A[None], A, [0.5, 0.5], mu=0.0, lam=0.0, ridge=0.0)
    emp = l4_loss(A, data.X[0], data.y[0], sigma=0.05, mu=0.0, lam=0.0, ridge=0.0)
    # the cross term sum_{i != j} E[Q4 t1(a_i, a_j)] is 0 in population; per-sample sd/|c| ~ 24,
    # so its standard error at n = 2e5 is ~ 2 * 24 / sqrt(2e5) = 0.11: allow 4 standard errors
    assert pop == pytest.approx(0.0, abs=1e-12)
    assert abs(emp - pop) < 0.45
    emp_q = l4_loss(A, data.X[0], data.y[0], sigma=0.05, mu=1.0, lam=0.0, ridge=0.0) - emp
    assert -emp_q == pytest.approx(1.0, abs=0.45)      # sum_i E[Q4 t2(a_i*)] = sum_i alpha_i = 1


@pytest.mark.parametrize("regressors", ["orthonormal", "skewed"])
def test_population_minima_are_the_truth_up_to_permutation_and_sign(regressors):
    A_star = np.eye(4)[:2] if regressors == "orthonormal" else np.array([[1, 0, 0, 0], [1, 1, 0, 0]]) / [[1], [2**0.5]]
    out = minimise_l4_population(A_star, [0.5, 0.5], restarts=8, iters=1500, lr=0.02, ridge=0.1, seed=0)
    e = ms.regressor_error(out["regressors"], A_star).query("metric == 'E_reg'")["value"]
    # every restart reaches a global minimum; for non-orthogonal regressors the penalised minimiser is biased by
    # O(mu, ridge) (Theorem 1's eps_0; E_reg = 2.7e-4 measured with these mu, lam, ridge)
    assert e.max() < (1e-6 if regressors == "orthonormal" else 5e-4)
    assert np.ptp(out["loss"]) < 1e-8                     # ... with the same loss value (no spurious minima)
    if regressors == "skewed":                            # rows are a dual basis: reading them directly is wrong
        rows = ms.regressor_error(recover_regressors(out["raw"], method="rows"), A_star)
        assert rows.query("metric == 'E_reg'")["value"].min() > 0.1
    # matched entries of A* A^T are about +-1/sqrt(alpha) (Theorem 1)
    M = np.abs(A_star @ out["raw"][0].T)
    assert np.sort(M.ravel())[-2:] == pytest.approx([2**0.5] * 2, rel=0.02)


@pytest.fixture(scope="module")
def planted():
    return ms.simulate_gated_nn(n=20_000, reps=1, seed=11)


def test_planted_recovery_default_size(planted):
    fit = ms.fit_tensor(planted.X, planted.y, 2, sigma=0.05, restarts=2, l4_iters=400, gate_iters=40, seed=1,
                        truth=planted.truth, record_every=100)
    v = _values(fit.errors(planted.truth))
    # at n = 2e4 the L4 moments have relative error ~ 24/sqrt(n) ~ 0.17 per coordinate -> E_reg ~ 1e-2
    assert v["E_reg"] < 0.02 and v["reg_l2"] < 0.2 and v["gate_l2"] < 0.2
    assert fit.regressors.shape == (1, 2, 10) and fit.gate_weight.shape == (1, 2, 10)
    assert np.allclose(fit.gate_weight[:, -1], 0)
    assert {"l4", "gate"} <= set(fit.history["stage"])
    frame = fit.to_frame(planted.truth)
    assert {"method", "rep", "metric", "value", "n", "restarts"} <= set(frame.columns)


@pytest.mark.slow
def test_planted_recovery_large_n():
    data = ms.simulate_gated_nn(n=200_000, reps=1, seed=12)
    fit = ms.fit_tensor(data.X, data.y, 2, sigma=0.05, restarts=2, gate_iters=60, seed=2)
    v = _values(fit.errors(data.truth))
    # measured (projected L4): E_reg 8.5e-4 at n = 1e5 and 2.0e-4 at n = 1e6; the oracle gate error at n = 2e5
    # is ~ 0.01, plus the floor from the regressor error
    assert v["E_reg"] < 2e-3 and v["gate_l2"] < 0.06


def test_likelihood_sign_resolution_and_random_regressors():
    data = ms.simulate_gated_nn(n=15_000, seed=5, regressors="random", truth_seed=4)
    fit = ms.fit_tensor(data.X, data.y, 2, sigma=0.05, restarts=1, l4_iters=400, gate_iters=40, sign="likelihood",
                        seed=0)
    v = _values(fit.errors(data.truth))
    assert v["E_reg"] < 0.02 and v["reg_l2"] < 0.2 and v["gate_l2"] < 0.3
    none = ms.fit_tensor(data.X, data.y, 2, sigma=0.05, restarts=2, l4_iters=400, gate_iters=5, sign="none",
                         init=gated_starts(1, 2, 2, 10, seed=0))
    flips = ms.regressor_error(none.restart_regressors, data.truth.regressors)
    assert flips.query("metric == 'reg_l2_unsigned'")["value"].max() < 0.2


def test_unprojected_fit_sample_and_tensor_forms_agree():
    data = ms.simulate_gated_nn(n=3_000, seed=6, d=4, k=2)
    kw = dict(sigma=0.05, restarts=2, project=False, l4_iters=100, gate_iters=3, seed=4)
    a = ms.fit_tensor(data.X, data.y, 2, form="samples", **kw)
    b = ms.fit_tensor(data.X, data.y, 2, form="tensor", **kw)
    assert a.config["form"] == "samples" and b.config["form"] == "tensor" and a.config["ridge"] == 1.0
    assert np.allclose(a.extras["raw_regressors"], b.extras["raw_regressors"], atol=1e-8)


def test_baselines_share_starts_and_em_recovers():
    data = ms.simulate_gated_nn(n=5_000, seed=7)
    init = gated_starts(1, 3, 2, 10, seed=3)
    em = ms.fit_em_gated(data.X, data.y, 2, sigma=0.05, restarts=3, iters=30, init=init, truth=data.truth)
    l2 = ms.fit_l2_gated(data.X, data.y, 2, restarts=3, iters=50, init=init, truth=data.truth)
    first = [f.history.query("iter == 0 and metric == 'E_reg'")["value"].to_numpy() for f in (em, l2)]
    assert np.allclose(first[0], first[1])               # same starts
    assert _values(em.errors(data.truth))["E_reg"] < 1e-3
    assert l2.restart_regressors.shape == (1, 3, 2, 10) and l2.method == "l2"


def test_bad_input_warns_and_errors():
    with pytest.warns(UserWarning, match="2k-1"):
        small = ms.simulate_gated_nn(n=2_000, seed=8, d=3, gate="random")
    with pytest.warns(UserWarning, match="2k-1"):
        ms.fit_tensor(small.X, small.y, 2, sigma=0.05, restarts=1, l4_iters=5, gate_iters=2, seed=0)
    mix = ms.simulate_gated_nn(n=5_000, seed=9, inputs="mixture", mixture_mu=1.0)
    with pytest.warns(UserWarning, match=r"assume x ~ N\(0, I_d\)"):
        ms.fit_tensor(mix.X, mix.y, 2, sigma=0.05, restarts=1, l4_iters=5, gate_iters=2, seed=0)
    gauss = ms.simulate_gated_nn(n=5_000, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ms.fit_tensor(gauss.X, gauss.y, 2, sigma=0.05, restarts=1, l4_iters=5, gate_iters=2, seed=0)
    with pytest.raises(ValueError, match="supported activations are"):
        ms.fit_tensor(gauss.X, gauss.y, 2, activation="swish", sigma=0.05, seed=0)
    with pytest.raises(ValueError, match="y must have shape"):
        ms.fit_tensor(gauss.X, gauss.y[:, :10], 2, seed=0)
    with pytest.raises(ValueError, match="sigma must be a positive"):
        ms.fit_tensor(gauss.X, gauss.y, 2, sigma=0.0, seed=0)


def test_simulator_settings_and_streams():
    a = ms.simulate_gated_nn(n=50, reps=2, seed=1)
    b = ms.simulate_gated_nn(n=50, reps=3, seed=1)
    assert np.array_equal(a.X, b.X[:2]) and np.array_equal(a.y, b.y[:2])
    t = a.truth
    assert np.array_equal(t.regressors, np.eye(10)[:2]) and np.array_equal(t.gate_weight[0], np.eye(10)[2])
    r = ms.simulate_gated_nn(n=10, seed=1, k=3, regressors="random").truth
    assert np.allclose(r.gate_weight @ r.regressors.T, 0) and np.allclose(np.linalg.norm(r.regressors, axis=1), 1)
    assert isinstance(t.to_params(), ms.Params)
    z = ms.simulate_gated_nn(n=20_000, seed=2, sigma=0.0).truth
    d = ms.simulate_gated_nn(n=20_000, seed=2, sigma=0.0)
    resid = d.y[0] - np.take_along_axis(d.X[0] @ z.regressors.T, d.z[0][:, None], 1)[:, 0]
    assert np.abs(resid).max() < 1e-12
    assert abs(d.z.mean() - 0.5) < 0.02                  # orthogonal gate: E[p_2] = 1/2; sd of the mean 0.0035
    with pytest.raises(ValueError, match="gate='orthogonal' needs d >= 2k-1"), pytest.warns(UserWarning):
        ms.simulate_gated_nn(n=10, d=3, k=3, regressors="random")


def test_minibatch_l4_as_in_the_paper():
    # App. E setting: d = 5, k = 2, mini-batches; Adam here (the paper's optimiser/step for d = 10 are unreported)
    data = ms.simulate_gated_nn(n=20_000, seed=13, d=5)
    fit = ms.fit_tensor(data.X, data.y, 2, sigma=0.05, restarts=2, batch_size=1024, l4_iters=400, l4_lr=0.01,
                        gate_iters=30, truth=data.truth, record_every=100, seed=0)
    assert fit.config["batch_size"] == 1024 and fit.config["form"] == "samples"
    # mini-batch noise adds to the moment noise: E_reg ~ 1e-2 at this n (full batch gives ~5e-3)
    assert _values(fit.errors(data.truth))["E_reg"] < 0.05


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 1000))
def test_l4_is_invariant_to_row_signs_and_order(seed):
    rng = np.random.default_rng(seed)
    X, y = rng.standard_normal((100, 4)), rng.standard_normal(100)
    A = rng.standard_normal((3, 4))
    B = A[rng.permutation(3)] * rng.choice([-1.0, 1.0], size=(3, 1))
    assert l4_loss(A, X, y, sigma=0.1) == pytest.approx(l4_loss(B, X, y, sigma=0.1), rel=1e-10)


@pytest.mark.parametrize("activation", ["linear", "relu", "tanh"])
def test_gated_network_formulas_are_the_moe_model_with_zero_biases(activation):
    """The gated network's engine quantities (layout (R, S, k, n)) equal the MoE model's own mean and log-likelihood
    for ``truth.to_params()``: one formula, two layouts."""
    from moestat.fit.gated_baselines import _mean_fn

    data = ms.simulate_gated_nn(n=300, reps=1, seed=3, d=6, k=3, activation=activation, sigma=0.3)
    truth = data.truth
    spec, params = truth.spec, truth.to_params()
    X = torch.as_tensor(data.X, dtype=torch.float64)
    y = torch.as_tensor(data.y, dtype=torch.float64)
    A = torch.as_tensor(truth.regressors)[None, None]
    W = torch.as_tensor(truth.gate_weight[:-1])[None, None]
    mean_engine = _mean_fn(A, W, X, spec)[0, 0]
    np.testing.assert_allclose(mean_engine.numpy(), spec.mean(params, data.X[0]), rtol=1e-12, atol=1e-14)
    E = spec.family.activation(torch.einsum("rnd,skd->rskn", X, A[0]))
    loss, _, _ = llog_terms(W, X, expert_loglik(y, E, truth.sigma))
    np.testing.assert_allclose(-loss[0, 0].item() * data.X.shape[1], spec.loglik(params, data.X[0], data.y[0]),
                               rtol=1e-12)



def test_seed_none_draws_fresh_starts_and_records_their_entropy():
    """seed=None (the default, as in fit_lse, fit_mle and numpy) gives fresh starts; the settings record the drawn
    SeedSequence, and passing it back repeats the fit exactly."""
    data = ms.simulate_gated_nn(n=2_000, seed=3, d=4)
    kw = dict(sigma=0.05, restarts=2, l4_iters=30, gate_iters=3)
    a, b = ms.fit_tensor(data.X, data.y, 2, **kw), ms.fit_tensor(data.X, data.y, 2, **kw)
    assert not np.allclose(a.extras["raw_regressors"], b.extras["raw_regressors"])
    entropy = int(a.config["seed"].split("entropy=")[1].split(",")[0].rstrip(")"))
    again = ms.fit_tensor(data.X, data.y, 2, seed=np.random.SeedSequence(entropy), **kw)
    np.testing.assert_array_equal(again.extras["raw_regressors"], a.extras["raw_regressors"])
