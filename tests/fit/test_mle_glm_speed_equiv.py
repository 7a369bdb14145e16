"""The fused GLM paths of fit_mle equal their references: EM's fused IRLS expert step (moestat.fit.em.glm_expert_step)
against moestat.families.irls_weighted, and the analytic gradient of the GLM mixture log-likelihood used by the
L-BFGS phase (moestat.fit._glm_objective.GLMMixtureObjective) against scipy's pmfs, autograd through the generic
likelihood and finite differences."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.special import logsumexp

import moestat as ms
import moestat.fit.em as em
import moestat.fit.mle as mle
from moestat.families import get_family, irls_weighted
from moestat.fit._glm_objective import GLMMixtureObjective
from moestat.fit._layout import ParamLayout


def _glm_problem(family: str, seed: int, *, trials: bool = False, far: bool = False):
    """A = 6 pairs, k = 3 experts, n = 150, p = 3 (intercept + 2 slopes) in the em_fit layout."""
    g = torch.Generator().manual_seed(seed)
    A, k, n, p = 6, 3, 150, 3
    Ze = torch.cat([torch.ones(A, 1, n, dtype=torch.float64),
                    torch.randn(A, p - 1, n, generator=g, dtype=torch.float64)], dim=1)
    truth = 0.5 * torch.randn(A, 1, p, generator=g, dtype=torch.float64)
    eta_true = torch.bmm(truth, Ze)[:, 0]
    m = torch.randint(1, 8, (A, n), generator=g).to(torch.float64) if trials else None
    if family == "poisson":
        y = torch.poisson(eta_true.exp(), generator=g)
    else:
        prob = torch.sigmoid(eta_true)
        y = (torch.binomial(m, prob, generator=g) / m) if m is not None else torch.bernoulli(prob, generator=g)
    tau = torch.softmax(torch.randn(A, k, n, generator=g, dtype=torch.float64), dim=1)
    scale = 3.0 if far else 0.3  # a start far from the optimum makes the full Newton step fail (step halving)
    beta = scale * torch.randn(A, k, p, generator=g, dtype=torch.float64)
    return Ze, y, tau, beta, m


@pytest.mark.parametrize(("family", "trials", "far"), [("poisson", False, False), ("poisson", False, True),
                                                       ("binomial", False, False), ("binomial", True, True)])
def test_fused_glm_expert_step_is_one_irls_step(family, trials, far):
    Ze, y, tau, beta, m = _glm_problem(family, 3, trials=trials, far=far)
    glm = get_family(family)
    eps = 1e-8 * y.shape[-1]
    eta = torch.bmm(beta, Ze)
    new, new_eta = em.glm_expert_step(glm, Ze, em._second_moments(Ze), y, tau, beta, eta, glm.inverse_link(eta),
                                      eps, trials=m)
    ref = irls_weighted(Ze.transpose(1, 2), y, tau.transpose(1, 2).unsqueeze(1), beta.unsqueeze(1), glm,
                        max_iter=1, prox=eps, trials=m).squeeze(1)
    # the same Newton step and step size, summed in another order: rounding differences only
    np.testing.assert_allclose(new.numpy(), ref.numpy(), rtol=1e-10, atol=1e-12)
    # the returned linear predictor is the one of the returned coefficients
    np.testing.assert_allclose(new_eta.numpy(), torch.bmm(new, Ze).numpy(), rtol=1e-12, atol=1e-12)
    if far:  # the test exercises step halving: some full Newton step was rejected (else it could not fail there)
        full = beta + torch.linalg.solve(
            em._weighted_gram(tau * (m.unsqueeze(1) if m is not None else 1.0) * glm.variance(glm.inverse_link(eta)),
                              Ze, None) + eps * torch.eye(3, dtype=torch.float64),
            torch.bmm(tau * (m.unsqueeze(1) if m is not None else 1.0) * (y.unsqueeze(1) - glm.inverse_link(eta)),
                      Ze.transpose(1, 2)).unsqueeze(-1)).squeeze(-1)
        assert not torch.allclose(new, full, rtol=1e-6)


def test_fused_glm_expert_step_never_lowers_the_m_step_objective():
    Ze, y, tau, beta, _ = _glm_problem("poisson", 5, far=True)
    glm = get_family("poisson")
    eta = torch.bmm(beta, Ze)
    new, _ = em.glm_expert_step(glm, Ze, None, y, tau, beta, eta, eta.exp(), 0.0)

    def q(b: torch.Tensor) -> torch.Tensor:  # sum_t tau_tj [y_t eta_tj - exp(eta_tj)], written out
        e = torch.bmm(b, Ze)
        return (tau * (y.unsqueeze(1) * e - e.exp())).sum(-1)

    assert bool((q(new) >= q(beta)).all())
    assert bool((q(new) > q(beta) + 1e-6).any())  # and it moves: a step that did nothing would also pass the line


def _objective_case(response: str, *, trials: bool, weights: bool, shared: bool, seed: int = 7):
    """A = 4 problems, k = 3 softmax-gated GLM experts on d = 4 inputs: the gate on columns (0, 2), the experts on
    (0, 1), column 3 shared (when ``shared``); the layout, its packed vectors and the data in the engine's shapes."""
    g = torch.Generator().manual_seed(seed)
    A, k, n, d = 4, 3, 60, 4
    spec = ms.MoE(k=k, d=d, response=response)
    layout = ParamLayout(spec, gate_columns=[0, 2], expert_columns=[0, 1], shared_columns=[3] if shared else None)
    X = torch.randn(A, n, d, generator=g, dtype=torch.float64)
    m = torch.randint(1, 6, (A, n), generator=g).to(torch.float64) if trials else None
    if response == "poisson":
        y = torch.poisson(torch.full((A, n), 2.5, dtype=torch.float64), generator=g)
    else:
        y = torch.bernoulli(torch.full((A, n), 0.4, dtype=torch.float64), generator=g)
        if m is not None:
            y = torch.binomial(m, torch.full((A, n), 0.4, dtype=torch.float64), generator=g) / m
    w = torch.rand(A, n, generator=g, dtype=torch.float64) * 3 if weights else None
    theta = 0.4 * torch.randn(A, layout.size, generator=g, dtype=torch.float64)
    return spec, layout, X, y, m, w, theta


def _objective(spec, layout, X, y, m, w):
    Zt = mle.design(X, True).transpose(1, 2)
    cols = {"gate": [0, *(1 + c for c in layout.gate_columns)], "expert": [0, *(1 + c for c in layout.expert_columns)],
            "shared": [1 + c for c in layout.shared_columns]}
    Zs = Zt[:, cols["shared"]] if cols["shared"] else None
    return GLMMixtureObjective(Zt[:, cols["gate"]], Zt[:, cols["expert"]], Zs, y, m, w, spec.response, spec.k,
                               y.shape[-1])


def _reference_value(spec, layout, X, y, m, w, theta):
    """-(1/n) sum_t c_t log p(y_t | x_t) through the generic path: the layout's blocks and log_components."""
    lc = mle.log_components(spec, layout.unpack(theta), mle.design(X, True).transpose(1, 2), y, m)
    lse = torch.logsumexp(lc, dim=1)
    return -(lse if w is None else lse * w).sum(-1) / y.shape[-1]


CASES = [("poisson", False, False, False), ("poisson", False, True, True), ("binomial", False, False, True),
         ("binomial", True, True, False), ("binomial", True, False, True)]


@pytest.mark.parametrize(("response", "trials", "weights", "shared"), CASES)
def test_glm_mixture_objective_value_and_gradient(response, trials, weights, shared):
    spec, layout, X, y, m, w, theta = _objective_case(response, trials=trials, weights=weights, shared=shared)
    value, grad = _objective(spec, layout, X, y, m, w)(theta)
    # the value against scipy's pmfs (an independent implementation of the densities and the softmax gate)
    gate = np.zeros((4, spec.k, layout.pg))
    gate[:, :-1] = theta[:, :layout.n_gate].reshape(4, spec.k - 1, layout.pg).numpy()
    beta = theta[:, layout.n_gate:layout.n_gate + layout.n_expert].reshape(4, spec.k, layout.pe).numpy()
    Xn = X.numpy()
    zg = np.concatenate([np.ones((*Xn.shape[:2], 1)), Xn[..., list(layout.gate_columns)]], -1)
    ze = np.concatenate([np.ones((*Xn.shape[:2], 1)), Xn[..., list(layout.expert_columns)]], -1)
    a = np.einsum("anp,akp->ank", zg, gate)
    eta = np.einsum("anp,akp->ank", ze, beta)
    if shared:
        eta = eta + Xn[..., 3:4] * theta[:, -1].numpy()[:, None, None]
    yn = y.numpy()[..., None]
    if response == "poisson":
        logf = stats.poisson.logpmf(yn, np.exp(eta))
    else:
        mm = np.ones_like(yn) if m is None else m.numpy()[..., None]
        logf = stats.binom.logpmf(np.round(mm * yn), mm, 1 / (1 + np.exp(-eta)))
    ll = logsumexp(a - logsumexp(a, axis=-1, keepdims=True) + logf, axis=-1)
    c = np.ones_like(ll) if w is None else w.numpy()
    np.testing.assert_allclose(value.numpy(), -(c * ll).sum(-1) / ll.shape[-1], rtol=1e-12)  # double rounding only
    # the gradient against autograd through the generic likelihood (the path the other models take)
    t = theta.clone().requires_grad_(True)
    ref = _reference_value(spec, layout, X, y, m, w, t)
    (g_ref,) = torch.autograd.grad(ref.sum(), t)
    np.testing.assert_allclose(value.numpy(), ref.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(grad.numpy(), g_ref.numpy(), rtol=1e-9, atol=1e-13)  # rounding-level differences


def _assert_gradient_by_central_differences(objective, theta, h: float = 1e-6) -> None:
    """``objective``'s gradient at ``theta`` equals central differences of its value, coordinate by coordinate."""
    _, grad = objective(theta)
    for j in range(theta.shape[1]):  # central differences: error O(h^2) ~ 1e-12 times the third derivative
        e = torch.zeros_like(theta)
        e[:, j] = h
        fd = (objective(theta + e)[0] - objective(theta - e)[0]) / (2 * h)
        np.testing.assert_allclose(grad[:, j].numpy(), fd.numpy(), rtol=1e-6, atol=1e-9)


def test_glm_mixture_objective_gradient_by_finite_differences():
    spec, layout, X, y, m, w, theta = _objective_case("binomial", trials=True, weights=True, shared=True, seed=3)
    objective = _objective(spec, layout, X, y, m, w)
    _assert_gradient_by_central_differences(objective, theta)


def test_direct_glm_covers_only_the_models_it_computes():
    for spec in (ms.MoE(k=2, d=1, response="poisson"), ms.MoE(k=2, d=1), ms.MoE(k=3, d=2, expert="constant")):
        assert mle.direct_glm(spec, ParamLayout(spec))
    for spec in (ms.MoE(k=2, d=1, expert="relu"), ms.MoE(k=2, d=1, gate="sigmoid"),
                 ms.MoE(k=2, d=1, response="poisson", gate="sigmoid"),
                 ms.MoE(k=2, d=1, response="binomial", temperature=2.0), ms.MoE(k=2, d=1, temperature=0.5)):
        assert not mle.direct_glm(spec, ParamLayout(spec))


def _two_class_poisson(n: int = 200, seed: int = 17) -> pd.DataFrame:
    """NPreg-like data: two latent classes, Poisson log-rates 1.2 + 0.06 x and 1.9 - 0.16 x, x in (0, 10)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 10, n)
    first = rng.uniform(size=n) < 0.5
    y = rng.poisson(np.exp(np.where(first, 1.2 + 0.06 * x, 1.9 - 0.16 * x)))
    return pd.DataFrame({"y": y.astype(float), "x": x})


def _reference_step(glm, Ze, ZZ, y, tau, beta, eta, mu, prox, trials=None, offset=None):
    o4 = None if offset is None else offset[:, None, :, None]
    new = irls_weighted(Ze.transpose(1, 2), y, tau.transpose(1, 2).unsqueeze(1), beta.unsqueeze(1), glm,
                        max_iter=1, prox=prox, trials=trials, offset=o4).squeeze(1)
    return new, torch.bmm(new, Ze) if offset is None else torch.bmm(new, Ze) + offset.unsqueeze(1)


@pytest.mark.parametrize("formula, offset", [("y ~ x", None), ("y ~ x + I(x**2)", None), ("y ~ x", "np.log(t)")])
def test_fit_mle_fused_paths_reach_the_reference_maximum(formula, offset, monkeypatch):
    df = _two_class_poisson()
    df["t"] = np.random.default_rng(2).uniform(0.5, 2.0, len(df))  # an exposure, for the offset case
    kwargs = dict(formula=formula, data=df, k=2, family="poisson", gate_formula="~ 1", tol=1e-8, max_iter=2000,
                  restarts=10, seed=1, offset=offset)
    fast = ms.fit_mle(**kwargs)
    monkeypatch.setattr(em, "glm_expert_step", _reference_step)  # EM's step by irls_weighted, as before
    monkeypatch.setattr(mle, "direct_glm", lambda spec, layout: False)  # L-BFGS gradient by autograd
    ref = ms.fit_mle(**kwargs)
    # the benchmark's criterion: the same maximum to 1e-6 (rounding-level differences in the iterates)
    assert fast.loglik == pytest.approx(ref.loglik, abs=1e-6)
    np.testing.assert_allclose(np.asarray(fast.theta), np.asarray(ref.theta), atol=1e-4)  # flat likelihood
    assert fast.converged == ref.converged


def _assert_equals_autograd(objective, theta, reference) -> None:
    """The closed-form value and gradient of ``objective`` at ``theta`` equal ``reference`` (the generic likelihood)
    and its autograd gradient."""
    value, grad = objective(theta)
    t = theta.clone().requires_grad_(True)
    ref = reference(t)
    (g_ref,) = torch.autograd.grad(ref.sum(), t)
    np.testing.assert_allclose(value.numpy(), ref.detach().numpy(), rtol=1e-12)  # the same sums, another order
    np.testing.assert_allclose(grad.numpy(), g_ref.numpy(), rtol=1e-9, atol=1e-13)  # rounding-level differences


def _draw_columns(d: int, constant: bool, data) -> tuple[list[int], list[int] | None, list[int]]:
    """Hypothesis-drawn gate, expert and shared columns of d inputs (constant experts: no expert or shared ones)."""
    cols = list(range(d))
    gate_cols = sorted(data.draw(st.sets(st.sampled_from(cols)), label="gate columns"))
    shared = [] if constant else sorted(data.draw(st.sets(st.sampled_from(cols), max_size=d - 1), label="shared"))
    rest = [c for c in cols if c not in shared]
    expert_cols = None if constant else sorted(data.draw(st.sets(st.sampled_from(rest)), label="expert columns"))
    return gate_cols, expert_cols, shared


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 4), d=st.integers(1, 4), response=st.sampled_from(["poisson", "binomial"]),
       trials=st.booleans(), weights=st.booleans(), constant=st.booleans(), data=st.data())
def test_glm_mixture_objective_matches_autograd_on_any_layout(k, d, response, trials, weights, constant, data):
    """Any number of experts and inputs, any gate / expert / shared column split, constant or linear experts: the
    closed-form value and gradient equal autograd through the layout's blocks and the generic likelihood."""
    trials = trials and response == "binomial"
    gate_cols, expert_cols, shared = _draw_columns(d, constant, data)
    spec = ms.MoE(k=k, d=d, response=response, expert="constant" if constant else "linear")
    layout = ParamLayout(spec, gate_columns=gate_cols, expert_columns=expert_cols, shared_columns=shared or None)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    A, n = 3, 40
    X = torch.randn(A, n, d, generator=g, dtype=torch.float64)
    m = torch.randint(1, 6, (A, n), generator=g).to(torch.float64) if trials else None
    if response == "poisson":
        y = torch.poisson(torch.full((A, n), 2.0, dtype=torch.float64), generator=g)
    elif m is not None:
        y = torch.binomial(m, torch.full((A, n), 0.4, dtype=torch.float64), generator=g) / m
    else:
        y = torch.bernoulli(torch.full((A, n), 0.4, dtype=torch.float64), generator=g)
    w = torch.rand(A, n, generator=g, dtype=torch.float64) * 3 if weights else None
    theta = 0.5 * torch.randn(A, layout.size, generator=g, dtype=torch.float64)
    Zt = mle.design(X, True).transpose(1, 2)
    columns = mle.design_rows(layout)
    objective = GLMMixtureObjective(Zt[:, columns["gate"]], Zt[:, columns["expert"]],
                                    Zt[:, columns["shared"]] if columns["shared"] else None, y, m, w, response, k, n)
    _assert_equals_autograd(objective, theta, lambda t: _reference_value(spec, layout, X, y, m, w, t))


def _gaussian_case(k: int, d: int, *, weights: bool, shared: list[int], gate_cols: list[int],
                   expert_cols: list[int] | None, constant: bool, seed: int):
    """A = 3 problems of n = 40 observations with Gaussian experts, in gradient_fit's packed form: the layout's
    vector with the k noise entries replaced by log-scales rho_j, sd_j^2 = floor^2 + e^(2 rho_j)."""
    g = torch.Generator().manual_seed(seed)
    A, n = 3, 40
    spec = ms.MoE(k=k, d=d, expert="constant" if constant else "linear")
    layout = ParamLayout(spec, gate_columns=gate_cols, expert_columns=expert_cols, shared_columns=shared or None)
    X = torch.randn(A, n, d, generator=g, dtype=torch.float64)
    y = 2.0 * torch.randn(A, n, generator=g, dtype=torch.float64)
    w = torch.rand(A, n, generator=g, dtype=torch.float64) * 3 if weights else None
    v = 0.5 * torch.randn(A, layout.size, generator=g, dtype=torch.float64)
    floor2 = 0.1 * torch.rand(A, 1, generator=g, dtype=torch.float64)
    Zt = mle.design(X, True).transpose(1, 2)
    columns = mle.design_rows(layout)
    objective = GLMMixtureObjective(Zt[:, columns["gate"]], Zt[:, columns["expert"]],
                                    Zt[:, columns["shared"]] if columns["shared"] else None, y, None, w, "gaussian",
                                    k, n, None, floor2)
    return spec, layout, X, y, w, v, floor2, objective


def _gaussian_reference(spec, layout, X, y, w, v, floor2):
    """-(1/n) sum_t c_t log p(y_t | x_t) through the generic path, with gradient_fit's unpacking of the scales."""
    p = layout.unpack(v)
    p.noise_sd = torch.sqrt(floor2 + torch.exp(2 * v[..., -spec.k:]))
    lc = mle.log_components(spec, p, mle.design(X, True).transpose(1, 2), y)
    lse = torch.logsumexp(lc, dim=1)
    return -(lse if w is None else lse * w).sum(-1) / y.shape[-1]


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 4), d=st.integers(1, 4), weights=st.booleans(), constant=st.booleans(), data=st.data())
def test_gaussian_mixture_objective_matches_autograd_on_any_layout(k, d, weights, constant, data):
    """Gaussian experts, any column split: the closed-form value and gradient (log-scales included) equal autograd
    through the layout's blocks and the generic likelihood, which the L-BFGS phase used before."""
    gate_cols, expert_cols, shared = _draw_columns(d, constant, data)
    spec, layout, X, y, w, v, floor2, objective = _gaussian_case(
        k, d, weights=weights, shared=shared, gate_cols=gate_cols, expert_cols=expert_cols, constant=constant,
        seed=data.draw(st.integers(0, 2**31 - 1), label="seed"))
    _assert_equals_autograd(objective, v, lambda t: _gaussian_reference(spec, layout, X, y, w, t, floor2))


def test_gaussian_mixture_objective_against_scipy_and_finite_differences():
    spec, layout, X, y, w, v, floor2, objective = _gaussian_case(
        3, 4, weights=True, shared=[3], gate_cols=[0, 2], expert_cols=[0, 1], constant=False, seed=11)
    value, _ = objective(v)
    # the value against scipy's normal pdf and an explicit softmax (independent of moestat's densities)
    A, k = v.shape[0], spec.k
    gate = np.zeros((A, k, layout.pg))
    gate[:, :-1] = v[:, :layout.n_gate].reshape(A, k - 1, layout.pg).numpy()
    beta = v[:, layout.n_gate:layout.n_gate + layout.n_expert].reshape(A, k, layout.pe).numpy()
    Xn = X.numpy()
    zg = np.concatenate([np.ones((*Xn.shape[:2], 1)), Xn[..., [0, 2]]], -1)
    ze = np.concatenate([np.ones((*Xn.shape[:2], 1)), Xn[..., [0, 1]]], -1)
    a = np.einsum("anp,akp->ank", zg, gate)
    gamma = v[:, layout.n_gate + layout.n_expert].numpy()[:, None, None]  # the shared slope on column 3
    eta = np.einsum("anp,akp->ank", ze, beta) + Xn[..., 3:4] * gamma
    sd = np.sqrt(floor2.numpy() + np.exp(2 * v[:, -k:].numpy()))[:, None, :]
    logf = stats.norm.logpdf(y.numpy()[..., None], eta, sd)
    ll = logsumexp(a - logsumexp(a, axis=-1, keepdims=True) + logf, axis=-1)
    np.testing.assert_allclose(value.numpy(), -(w.numpy() * ll).sum(-1) / ll.shape[-1], rtol=1e-12)
    _assert_gradient_by_central_differences(objective, v)


def _gated_two_class_data(family: str) -> tuple[pd.DataFrame, np.ndarray]:
    """Two classes chosen by a logistic gate on w, experts on x, a shared slope on s and case weights c."""
    rng = np.random.default_rng(5 if family == "binomial" else 8)
    n = 300
    df = pd.DataFrame({"x": rng.normal(size=n), "w": rng.normal(size=n), "s": rng.normal(size=n)})
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-1.5 * df["w"]))
    eta = np.where(first, -1.0 + 2.0 * df["x"], 1.0 - 1.5 * df["x"]) + 0.5 * df["s"]
    if family == "binomial":
        df["y"] = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(float)
    else:
        df["y"] = eta + np.where(first, 0.5, 1.0) * rng.normal(size=n)
    return df, rng.integers(1, 4, n).astype(float)


@pytest.mark.parametrize("family", ["binomial", "gaussian"])
def test_fit_mle_l_bfgs_phase_matches_autograd(family, monkeypatch):
    """A fit with a gate covariate, case weights and a shared slope whose slow starts reach the L-BFGS phase: the
    closed-form gradient and autograd's reach the same maximum.

    The two gradients differ by rounding only, and so do the iterates (measured: binomial 4e-15 in theta and the
    same log-likelihood to every digit, Gaussian 4e-16 and 1e-13).  Wrong gradients stop elsewhere: the binomial
    shared slope's halved, 2e-7 lower; the Gaussian log-scale score without its case weights, 0.018 lower.  (A wrong
    positive factor on a gradient block keeps its zeros: the value and gradient tests above catch that.)"""
    df, c = _gated_two_class_data(family)
    kwargs = dict(formula="y ~ x", data=df, k=2, family=family, gate_formula="~ w", shared="~ s", weights=c,
                  tol=1e-8, restarts=8, seed=3, switch_after=5)
    calls, evaluations = [], []
    real, real_call = mle.gradient_fit, GLMMixtureObjective.__call__
    monkeypatch.setattr(mle, "gradient_fit", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(GLMMixtureObjective, "__call__",
                        lambda self, theta: evaluations.append(1) or real_call(self, theta))
    fast = ms.fit_mle(**kwargs)
    assert calls  # the L-BFGS phase ran (else the comparison below would not test it)
    assert evaluations  # ... on the closed form (else both fits below would take autograd's gradient)
    monkeypatch.setattr(mle, "direct_glm", lambda spec, layout: False)
    evaluations.clear()
    ref = ms.fit_mle(**kwargs)
    assert not evaluations
    assert fast.loglik == pytest.approx(ref.loglik, abs=1e-9)
    np.testing.assert_allclose(np.asarray(fast.theta), np.asarray(ref.theta), atol=1e-8)
    assert fast.converged and ref.converged
