"""Maximum likelihood for Gaussian MoE: EM ascent, EM vs gradient, recovery, information matrix, bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.fit._layout import BlockParams, ParamLayout
from moestat.fit.em import _newton_gate_step, _second_moments, em_fit, gate_cvxpy, gate_newton, weighted_ls
from moestat.fit.mle import random_starts

SPEC2 = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
TRUTH2 = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.5])
SPEC3 = ms.MoE(gate="softmax", expert="linear", k=3, d=2)
TRUTH3 = ms.Params([1.0, 0.5, 0.0], [[2.0, -1.0], [-2.0, 1.0], [0.0, 0.0]],
                   [[1.0, 1.0], [-1.0, 0.5], [0.0, -1.0]], [2.0, -2.0, 0.0], noise_sd=[0.3, 0.4, 0.5])


def _data(spec, truth, n, reps=1, seed=0):
    return ms.simulate(spec, truth, n=n, reps=reps, seed=seed, model="mixture")


def _theta(spec, params):
    return ParamLayout(spec).pack(BlockParams.from_params(params.to_torch())).numpy()


@pytest.mark.parametrize(("spec", "truth", "seed"), [(SPEC2, TRUTH2, 0), (SPEC2, TRUTH2, 1), (SPEC3, TRUTH3, 2)])
def test_em_loglik_never_decreases_on_any_iteration(spec, truth, seed):
    data = _data(spec, truth, 300, reps=2, seed=seed)
    X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
    init = random_starts(spec, X, y, 4, np.random.SeedSequence(seed).spawn(2))
    floor = 1e-3 * y.std(1)
    st = em_fit(spec, X, y, init, var_floor=floor**2, tol=1e-12, max_iter=150)
    hist = st.history.numpy()  # (T, R, S): every iteration of every restart
    steps = np.diff(hist, axis=0)
    # exact ascent up to float64 rounding of a sum of n log terms (|ll| ~ 1e2-1e3, eps ~ 1e-16)
    assert (steps >= -1e-9 * (1 + np.abs(hist[1:]))).all()
    assert np.isfinite(hist).all()


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
def test_em_with_exact_cvxpy_gate_is_monotone_and_agrees_with_newton():
    data = _data(SPEC2, TRUTH2, 150, seed=3)
    f_cvx = ms.fit_mle(SPEC2, data.X[0], data.y[0], gate_solver="cvxpy", restarts=1, seed=4, max_iter=40,
                       tol=1e-9)
    assert (np.diff(f_cvx.history) >= -1e-9 * (1 + np.abs(f_cvx.history[1:]))).all()
    f_newton = ms.fit_mle(SPEC2, data.X[0], data.y[0], restarts=1, seed=4, tol=1e-12)
    f_cvx2 = ms.fit_mle(SPEC2, data.X[0], data.y[0], gate_solver="cvxpy", init=f_newton.params, restarts=0,
                        max_iter=5)
    # started at the Newton-EM optimum, exact gate steps stay there (same fixed point)
    assert abs(f_cvx2.loglik - f_newton.loglik) < 1e-6
    assert np.allclose(f_cvx2.theta, f_newton.theta, atol=1e-4)


@pytest.mark.parametrize("k", [2, 3])  # k = 2 takes the binary-logit branch of the Hessian
def test_gate_newton_reaches_cvxpy_solution_of_weighted_multinomial_logit(k):
    rng = np.random.default_rng(0)
    n, p = 120, 3
    Z = torch.as_tensor(np.c_[np.ones(n), rng.normal(size=(n, p - 1))])[None]
    tau = torch.as_tensor(rng.dirichlet(np.ones(k), size=n))[None, None]
    theta0 = torch.zeros(1, 1, k - 1, p, dtype=torch.float64)
    newton = gate_newton(Z, tau, theta0, steps=40)
    exact = gate_cvxpy(Z, tau, theta0)
    assert torch.allclose(newton, exact, atol=1e-5)


@pytest.mark.parametrize("k", [2, 3])
def test_one_gate_newton_step_is_the_exact_newton_step_of_the_weighted_objective(k):
    """The step's gradient and Hessian against autograd's of Q = sum_t sum_i c_t tau_ti log pi_ti (case weights c)."""
    rng = np.random.default_rng(k)
    n, p = 80, 3
    Zt = torch.as_tensor(np.c_[np.ones(n), rng.normal(size=(n, p - 1))].T.copy())[None]  # (1, p, n)
    c = torch.as_tensor(rng.integers(1, 4, n).astype(float))[None]
    tau = torch.as_tensor(rng.dirichlet(np.ones(k), size=n).T.copy())[None] * c[:, None]  # (1, k, n)
    theta = torch.as_tensor(0.3 * rng.normal(size=(1, k - 1, p)))

    def q(th):
        logits = torch.cat([th[0] @ Zt[0], torch.zeros(1, n, dtype=th.dtype)])
        return (tau[0] * torch.log_softmax(logits, dim=0)).sum()

    g = torch.autograd.functional.jacobian(q, theta).reshape(-1)
    H = -torch.autograd.functional.hessian(q, theta).reshape((k - 1) * p, (k - 1) * p)
    expected = theta + torch.linalg.solve(H, g).reshape(theta.shape)
    logw = torch.log_softmax(torch.cat([theta @ Zt, torch.zeros(1, 1, n, dtype=theta.dtype)], dim=1), dim=1)
    ZZ = _second_moments(Zt)
    stepped, _ = _newton_gate_step(Zt, ZZ, tau, theta, logw, c)
    # the step's damping (1e-10 of the mean curvature + 1e-9 n) moves it by ~1e-8 relative
    torch.testing.assert_close(stepped, expected, rtol=1e-6, atol=1e-8)


def test_weighted_least_squares_matches_numpy():
    rng = np.random.default_rng(1)
    n = 50
    Z = np.c_[np.ones(n), rng.normal(size=(n, 2))]
    y = rng.normal(size=n)
    w = rng.uniform(0.1, 1, size=(n, 2))
    beta = weighted_ls(torch.as_tensor(Z)[None], torch.as_tensor(y)[None], torch.as_tensor(w)[None, None],
                       torch.zeros(1, 1, 2, 3, dtype=torch.float64), 0.0).numpy()[0, 0]
    for i in range(2):
        sw = np.sqrt(w[:, i])
        ref = np.linalg.lstsq(Z * sw[:, None], y * sw, rcond=None)[0]
        assert np.allclose(beta[i], ref, atol=1e-10)


def test_em_and_gradient_reach_the_same_optimum():
    data = _data(SPEC3, TRUTH3, 800, seed=5)
    em = ms.fit_mle(SPEC3, data.X[0], data.y[0], seed=6, tol=1e-12, switch_after=None)  # pure EM
    gr = ms.fit_mle(SPEC3, data.X[0], data.y[0], seed=6, method="gradient", gtol=1e-9, tol=1e-12)
    assert em.converged and gr.converged
    assert abs(em.loglik - gr.loglik) < 1e-6 * abs(em.loglik)
    gr = gr.align_to(em.params)
    assert np.allclose(em.theta, gr.theta, atol=2e-4)


def test_em_with_constant_experts_uses_the_inputs_in_the_gate():
    # constant experts: a mixture of k Gaussians whose weights depend on x (the gate keeps its slopes)
    spec = ms.MoE(gate="softmax", expert="constant", k=2, d=1)
    truth = ms.Params([0.0, 0.0], [[4.0], [0.0]], [[0.0], [0.0]], [1.5, -1.5], noise_sd=[0.4, 0.4])
    data = _data(spec, truth, 600, seed=13)
    em = ms.fit_mle(spec, data.X[0], data.y[0], seed=14, tol=1e-12)
    gr = ms.fit_mle(spec, data.X[0], data.y[0], seed=14, method="gradient", gtol=1e-9, tol=1e-12)
    assert abs(em.loglik - gr.loglik) < 1e-6 * abs(em.loglik)
    em = em.align_to(truth)
    assert abs(em.params.gate_weight[0, 0] - em.params.gate_weight[1, 0] - 4.0) < 1.0  # ~5 standard errors at n=600


def test_batched_fit_equals_single_fit_for_replicate_zero():
    data = _data(SPEC2, TRUTH2, 300, reps=3, seed=7)
    batch = ms.fit_mle(SPEC2, data.X, data.y, seed=8, restarts=3)
    single = ms.fit_mle(SPEC2, data.X[0], data.y[0], seed=8, restarts=3)
    assert np.isclose(batch.loglik[0], single.loglik, rtol=1e-10)
    assert np.allclose(batch.theta[0], single.theta, atol=1e-8)


def test_planted_truth_is_recovered_at_large_n():
    data = _data(SPEC3, TRUTH3, 5000, seed=9)
    fit = ms.fit_mle(SPEC3, data.X[0], data.y[0], seed=10, restarts=3).align_to(TRUTH3)
    th0 = _theta(SPEC3, TRUTH3)
    z = (fit.theta - th0) / fit.bse()
    # each |z| is ~N(0,1); 4.5 bounds 20 terms with margin; the absolute error must also be small
    assert np.abs(z).max() < 4.5
    assert np.abs(fit.theta - th0).max() < 0.25


def test_loglik_matches_model_and_score_vanishes_at_the_mle():
    data = _data(SPEC2, TRUTH2, 500, seed=11)
    fit = ms.fit_mle(SPEC2, data.X[0], data.y[0], seed=12, tol=1e-13)
    assert np.isclose(fit.loglik, SPEC2.loglik(fit.params, data.X[0], data.y[0]), rtol=1e-12)
    score = fit.score_obs().sum(0)
    assert np.abs(score).max() < 1e-3


def test_autograd_hessian_matches_finite_differences_of_the_model_loglik():
    data = _data(SPEC3, TRUTH3, 200, seed=13)
    fit = ms.fit_mle(SPEC3, data.X[0], data.y[0], seed=14, restarts=2)
    lay = fit.layout
    X, y = data.X[0], data.y[0]

    def ll(th):
        p = lay.unpack(torch.as_tensor(th)).to_params().numpy()
        return float(SPEC3.loglik(p, X, y))

    th = fit.theta
    h = 1e-4
    P = len(th)
    num = np.empty((P, P))
    E = np.eye(P) * h
    for i in range(P):
        for j in range(i, P):
            num[i, j] = num[j, i] = (ll(th + E[i] + E[j]) - ll(th + E[i] - E[j]) - ll(th - E[i] + E[j])
                                     + ll(th - E[i] - E[j])) / (4 * h * h)
    H = fit.hessian()
    # central differences have O(h^2) error; relative to the Hessian's scale
    assert np.abs(H - num).max() < 1e-4 * np.abs(H).max()


def test_layout_round_trip_and_softmax_reference():
    lay = ParamLayout(SPEC3)
    shifted = ms.Params(TRUTH3.gate_bias + 3.0, TRUTH3.gate_weight + np.array([1.0, -2.0]), TRUTH3.expert_weight,
                        TRUTH3.expert_bias, TRUTH3.noise_sd)
    th = _theta(SPEC3, shifted)
    assert np.allclose(th, _theta(SPEC3, TRUTH3))  # translation-invariant gate: same identified vector
    back = lay.unpack(torch.as_tensor(th)).to_params().numpy()
    assert back.allclose(TRUTH3.normalize_softmax())
    assert len(lay.names) == lay.size == SPEC3.n_params() + SPEC3.k


def test_sandwich_close_to_oim_under_correct_specification():
    data = _data(SPEC2, TRUTH2, 3000, seed=15)
    fit = ms.fit_mle(SPEC2, data.X[0], data.y[0], seed=16, restarts=2)
    ratio = fit.bse("sandwich") / fit.bse("oim")
    # information equality holds asymptotically; at n=3000 the two estimates differ by O(n^-1/2) noise
    assert np.all(np.abs(ratio - 1) < 0.2)
    assert np.all(np.isfinite(fit.bse("opg")))


def test_wald_test_single_term_is_z_squared_and_multi_term_df():
    data = _data(SPEC2, TRUTH2, 400, seed=17)
    fit = ms.fit_mle(SPEC2, data.X[0], data.y[0], seed=18)
    names = fit.param_names
    w = fit.wald_test([names[1]])
    assert np.isclose(w.statistic, fit.tvalues()[1] ** 2)
    w2 = fit.wald_test(["expert[0]:x1", "expert[1]:x1"])
    assert w2.df == 2 and 0 <= w2.p_value <= 1
    M = np.zeros((1, len(names)))
    M[0, names.index("expert[0]:x1")], M[0, names.index("expert[1]:x1")] = 1, 1  # slopes sum to 0 in truth
    assert fit.wald_test(M).p_value > 1e-3
    with pytest.raises(ValueError, match="unknown terms"):
        fit.wald_test(["gate[5]:x1"])


def test_wald_test_takes_linear_equations_in_the_terms():
    data = _data(SPEC2, TRUTH2, 400, seed=17)
    fit = ms.fit_mle(SPEC2, data.X[0], data.y[0], seed=18)
    names = fit.param_names
    th, V = np.asarray(fit.theta), np.asarray(fit.cov_params())
    a, b = names.index("expert[0]:x1"), names.index("expert[1]:x1")
    # one equation by hand: (theta_a - theta_b)^2 / var(theta_a - theta_b)
    by_hand = (th[a] - th[b]) ** 2 / (V[a, a] + V[b, b] - 2 * V[a, b])
    w = fit.wald_test("expert[0]:x1 = expert[1]:x1")
    assert w.df == 1 and w.statistic == pytest.approx(by_hand, rel=1e-10)
    M = np.zeros((2, len(names)))
    M[0, a], M[0, b], M[1, a] = 1.0, 2.0, 1.0
    two = fit.wald_test(["expert[0]:x1 + 2 * expert[1]:x1 = 0.5", "expert[0]:x1 = 1"])
    assert two.df == 2 and two.statistic == pytest.approx(fit.wald_test(M, q=[0.5, 1.0]).statistic, rel=1e-10)
    assert fit.wald_test("expert[0]:x1").statistic == pytest.approx(fit.wald_test(["expert[0]:x1"]).statistic)
    with pytest.raises(ValueError, match="q= is for term names"):
        fit.wald_test("expert[0]:x1 = 1", q=2.0)
    with pytest.raises(ValueError, match="unknown terms or a malformed equation"):
        fit.wald_test("expert[0]:x1 == 1")


def test_results_frames_summary_predict_posterior():
    data = _data(SPEC2, TRUTH2, 300, seed=19)
    fit = ms.fit_mle(SPEC2, data.X[0], data.y[0], seed=20, feature_names=["income"])
    tf = fit.to_frame()
    assert list(tf["term"]) == fit.param_names and "expert[0]:income" in fit.param_names
    assert {"estimate", "std_error", "p_value", "conf_low", "conf_high", "method", "tol"} <= set(tf.columns)
    g = fit.glance()
    assert len(g) == 1 and np.isclose(g["bic"].iloc[0], fit.bic) and fit.icl >= fit.bic
    text = str(fit.summary())
    assert "expert[1]:log_sigma" in text and "reference" in text
    Xn = np.linspace(-1, 1, 7)[:, None]
    pred = fit.predict(Xn)
    assert np.allclose(pred, (fit.gate_probs(Xn) * fit.expert_means(Xn)).sum(-1))
    post = fit.posterior(Xn, pred)
    assert post.shape == (7, 2) and np.allclose(post.sum(-1), 1)
    assert np.allclose(fit.conf_int()[:, 0], fit.theta - 1.959963984540054 * fit.bse())


@pytest.mark.parametrize(("gate", "expert", "top_k", "k"), [
    ("sigmoid", "linear", None, 2), ("softmax", "tanh", None, 2), ("topk", "linear", 2, 3),
    ("softmax", "relu", None, 2)])
def test_gradient_mle_for_other_gates_and_experts(gate, expert, top_k, k):
    spec = ms.MoE(gate=gate, expert=expert, k=k, d=1, top_k=top_k)
    rng = np.random.default_rng(21)
    truth = ms.Params(rng.normal(size=k), rng.normal(size=(k, 1)) * 2, rng.normal(size=(k, 1)) * 2,
                      np.linspace(-1, 1, k), noise_sd=np.full(k, 0.3))
    data = _data(spec, truth, 600, seed=22)
    fit = ms.fit_mle(spec, data.X[0], data.y[0], method="gradient", init=truth, restarts=2, seed=23)
    assert fit.converged
    # the MLE beats the truth it was started from (and every other start)
    assert fit.loglik >= float(spec.loglik(truth, data.X[0], data.y[0])) - 1e-8
    assert np.isfinite(fit.bse()).all() or fit.information_singular


def test_sigmoid_gated_density_integrates_to_one():
    spec = ms.MoE(gate="sigmoid", expert="linear", k=3, d=1)
    p = ms.Params([0.3, -1.0, 2.0], [[1.0], [2.0], [-1.0]], [[1.0], [0.0], [-1.0]], [0.0, 1.0, -1.0],
                  noise_sd=[0.5, 0.3, 0.7])
    ygrid = np.linspace(-12, 12, 20001)
    for x in (-0.7, 0.2, 0.9):
        X = np.full((ygrid.size, 1), x)
        dens = np.exp(spec.loglik(p, X, ygrid, reduce="none"))
        assert abs(np.trapezoid(dens, ygrid) - 1) < 1e-6


@pytest.mark.filterwarnings("ignore::moestat.MLEConvergenceWarning")
def test_over_specified_fit_keeps_every_component():
    data = _data(SPEC2, TRUTH2, 400, seed=24)
    spec4 = SPEC2.with_k(4)
    fit = ms.fit_mle(spec4, data.X[0], data.y[0], seed=25, max_iter=300)
    assert fit.params.k == 4 and np.isfinite(fit.theta).all()
    comp = fit.components()
    assert len(comp) == 4 and {"small", "sigma_at_floor", "mean_weight"} <= set(comp.columns)
    assert np.isclose(comp["mean_weight"].sum(), 1)


def test_relabel_keeps_likelihood_and_permutes_terms():
    data = _data(SPEC3, TRUTH3, 500, seed=26)
    fit = ms.fit_mle(SPEC3, data.X[0], data.y[0], seed=27)
    re = fit.relabel([2, 0, 1])
    assert np.isclose(ms.MoE.loglik(SPEC3, re.params, data.X[0], data.y[0]), fit.loglik)
    se, se_re = dict(zip(fit.param_names, fit.bse(), strict=True)), dict(zip(re.param_names, re.bse(), strict=True))
    assert np.isclose(se_re["expert[0]:x1"], se["expert[2]:x1"], rtol=1e-6)


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.nan, X), y), "NaN or infinite"),
    (lambda X, y: (X, np.where(np.arange(y.size) == 0, np.inf, y)), "NaN or infinite"),
    (lambda X, y: (X[:5], y[:5]), "fewer than the 8 free parameters"),
    (lambda X, y: (X, np.full_like(y, 2.0)), "constant"),
    (lambda X, y: (np.zeros_like(X), y), "rank deficient"),
])
def test_bad_inputs_raise_clear_errors(mutate, match):
    data = _data(SPEC2, TRUTH2, 50, seed=28)
    X, y = mutate(data.X[0], data.y[0])
    with pytest.raises(ValueError, match=match):
        ms.fit_mle(SPEC2, X, y)


def test_more_experts_than_observations_and_other_argument_errors():
    X, y = np.linspace(0, 1, 3)[:, None], np.array([0.0, 1.0, 3.0])
    with pytest.raises(ValueError, match="exceed the n=3"):
        ms.fit_mle(SPEC2.with_k(4), X, y)
    with pytest.raises(ValueError, match="method='em' supports"):
        ms.fit_mle(ms.MoE(gate="sigmoid", k=2, d=1, expert="relu"), X, y)
    with pytest.raises(ValueError, match="columns"):
        ms.fit_mle(SPEC2, np.c_[X, X], y)
    with pytest.raises(ValueError, match="underdetermined"):
        ms.fit_mle(SPEC2, X, y, underdetermined="ignore")


def test_underdetermined_warn_gives_finite_fit():
    rng = np.random.default_rng(29)
    X, y = rng.normal(size=(6, 1)), rng.normal(size=6)
    with pytest.warns(UserWarning, match="fewer than"):
        fit = ms.fit_mle(SPEC2, X, y, underdetermined="warn", restarts=2, seed=0, max_iter=200)
    assert np.isfinite(fit.theta).all() and np.isfinite(fit.predict(X)).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), perm=st.permutations([0, 1, 2]))
def test_identified_vector_is_invariant_to_gate_translation_and_tracks_relabelling(seed, perm):
    rng = np.random.default_rng(seed)
    k, d = 3, 2
    p = ms.Params(rng.normal(size=k), rng.normal(size=(k, d)), rng.normal(size=(k, d)), rng.normal(size=k),
                  noise_sd=rng.uniform(0.2, 2, size=k))
    X, y = rng.uniform(-1, 1, size=(40, d)), rng.normal(size=40)
    lay = ParamLayout(SPEC3)
    th = _theta(SPEC3, p)
    shift = ms.Params(p.gate_bias + rng.normal(), p.gate_weight + rng.normal(size=d), p.expert_weight,
                      p.expert_bias, p.noise_sd)
    assert np.allclose(_theta(SPEC3, shift), th)
    back = lay.unpack(torch.as_tensor(th)).to_params().numpy()
    assert np.isclose(SPEC3.loglik(back, X, y), SPEC3.loglik(p, X, y))
    permuted = p.permute(list(perm))
    assert np.isclose(SPEC3.loglik(permuted, X, y), SPEC3.loglik(p, X, y))


def test_fit_mle_runs_on_one_thread_and_restores_torch_setting():
    data = _data(SPEC2, TRUTH2, 200, seed=15)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fit = ms.fit_mle(SPEC2, data.X[0], data.y[0], seed=16, restarts=2)
        assert torch.get_num_threads() == 2 and fit.settings["threads"] == 1
        with pytest.raises(ValueError, match="threads"):
            ms.fit_mle(SPEC2, data.X[0], data.y[0], seed=16, restarts=2, threads=0)
    finally:
        torch.set_num_threads(old)


def test_variance_collapse_is_flagged():
    """Over-specified fits (k = 3 to k* = 2 data) can stop where a component interpolates a few points with sigma
    near 0 but above the floor, which at_floor alone missed; collapsed flags it (Hathaway's ratio), glance counts it
    and summary says so, while a correctly specified fit flags nothing."""
    truth = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.5])
    data = ms.simulate(SPEC2, truth, n=200, reps=50, seed=0, model="mixture")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        over = ms.fit_mle(SPEC2.with_k(3), data.X, data.y, seed=1, restarts=5)
        right = ms.fit_mle(SPEC2, data.X, data.y, seed=1, restarts=2)
    comp = over.components()
    flagged = comp[comp["collapsed"]]
    # measured: 14 of 50 replicates, sigma 0.001-0.02 (true 0.5), 10 of them above the floor where at_floor said
    # nothing; the ratio sigma_min / sigma_max of the correctly specified fits is >= 0.73
    assert 3 <= flagged["rep"].nunique() <= 25
    assert (flagged["sigma"] < 0.025).all() and (~flagged["sigma_at_floor"]).sum() >= 3
    assert over.glance()["n_collapsed"].sum() == len(flagged)
    by_ratio = flagged[~flagged["sigma_at_floor"]]
    rep = int(by_ratio["rep"].iloc[0])
    text = over.summary(rep).as_text()
    assert f"expert(s) {sorted(by_ratio[by_ratio['rep'] == rep]['expert'].tolist())} have a collapsed variance" in text
    at_floor = flagged[flagged["sigma_at_floor"]]
    assert len(at_floor)  # measured: 4 of the 14 flagged experts sit at the floor
    if len(at_floor):  # the floor note names the expert; the collapsed note (on few observations) does not
        rep = int(at_floor["rep"].iloc[0])
        text = over.summary(rep).as_text()
        assert f"[{int(at_floor['expert'].iloc[0])}] have sigma at the variance floor" in text
    assert not np.asarray(right.collapsed).any()


def test_summary_names_tied_responses_not_few_observations():
    """An expert sitting on a point mass of tied responses (here 60% of y exactly 0) is at the variance floor with
    many observations: the summary names the point mass and its remedy, and does not call it a collapse on few
    observations."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=400)
    zero = rng.random(400) < 0.6
    df = pd.DataFrame({"x": x, "y": np.where(zero, 0.0, 2.0 + x + rng.normal(size=400))})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_mle(formula="y ~ x", data=df, k=2, restarts=4, seed=1)
    comp = fit.components()
    assert comp["sigma_at_floor"].sum() == 1
    i = int(comp.loc[comp["sigma_at_floor"], "expert"].iloc[0])
    text = fit.summary().as_text()
    assert f"expert(s) [{i}] have sigma at the variance floor" in text
    assert f"expert {i} has 100% of its responsibility on y = 0" in text and "count or hurdle family" in text
    assert "have a collapsed variance" not in text
