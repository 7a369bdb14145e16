"""The fused GLM paths of fit_mle equal their references: EM's fused IRLS expert step (moestat.fit.em.glm_expert_step)
against moestat.families.irls_weighted, and the analytic gradient of the Poisson mixture log-likelihood used by the
L-BFGS phase (moestat.fit.mle._PoissonMixtureLSE) against autograd through the generic likelihood."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from scipy.special import logsumexp

import moestat as ms
import moestat.fit.em as em
import moestat.fit.mle as mle
from moestat.families import get_family, irls_weighted


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


def _poisson_parts(seed: int, constant: bool = False):
    g = torch.Generator().manual_seed(seed)
    A, k, n = 4, 3, 120
    a = torch.randn(A, k, n, generator=g, dtype=torch.float64, requires_grad=True)
    eta = torch.randn(A, k, 1 if constant else n, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.poisson(torch.full((A, 1, n), 3.0, dtype=torch.float64), generator=g)
    return a, eta, y


@pytest.mark.parametrize("constant", [False, True])
def test_poisson_mixture_lse_value_and_gradient(constant):
    a, eta, y = _poisson_parts(7, constant)
    lgy = torch.lgamma(y + 1.0)
    out = mle._PoissonMixtureLSE.apply(a, eta, y, lgy)
    # the value against scipy's Poisson pmf (an independent implementation)
    an, en, yn = a.detach().numpy(), np.broadcast_to(eta.detach().numpy(), a.shape), y.numpy()
    logpi = an - logsumexp(an, axis=1, keepdims=True)
    ref = logsumexp(logpi + stats.poisson.logpmf(yn, np.exp(en)), axis=1)
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-12)  # double rounding only
    # the analytic gradient against autograd through the same formula (torch's own log-softmax and log-sum-exp)
    wts = torch.rand(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ga, ge = torch.autograd.grad((out * wts).sum(), (a, eta))
    auto = torch.logsumexp(torch.log_softmax(a, 1) + y * eta - eta.exp() - lgy, dim=1)
    ra, re = torch.autograd.grad((auto * wts).sum(), (a, eta))
    np.testing.assert_allclose(ga.numpy(), ra.numpy(), rtol=1e-10, atol=1e-13)  # rounding-level differences
    np.testing.assert_allclose(ge.numpy(), re.numpy(), rtol=1e-10, atol=1e-13)
    # and against finite differences (torch.autograd.gradcheck) on a slice
    a2 = a[:1, :, :8].detach().requires_grad_()
    e2 = eta[:1, :, :1 if constant else 8].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda a_, e_: mle._PoissonMixtureLSE.apply(a_, e_, y[:1, :, :8], lgy[:1, :, :8]),
                                    (a2, e2))


def _two_class_poisson(n: int = 200, seed: int = 17) -> pd.DataFrame:
    """NPreg-like data: two latent classes, Poisson log-rates 1.2 + 0.06 x and 1.9 - 0.16 x, x in (0, 10)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 10, n)
    first = rng.uniform(size=n) < 0.5
    y = rng.poisson(np.exp(np.where(first, 1.2 + 0.06 * x, 1.9 - 0.16 * x)))
    return pd.DataFrame({"y": y.astype(float), "x": x})


def _reference_step(glm, Ze, ZZ, y, tau, beta, eta, mu, prox, trials=None):
    new = irls_weighted(Ze.transpose(1, 2), y, tau.transpose(1, 2).unsqueeze(1), beta.unsqueeze(1), glm,
                        max_iter=1, prox=prox, trials=trials).squeeze(1)
    return new, torch.bmm(new, Ze)


@pytest.mark.parametrize("formula", ["y ~ x", "y ~ x + I(x**2)"])
def test_fit_mle_fused_paths_reach_the_reference_maximum(formula, monkeypatch):
    df = _two_class_poisson()
    kwargs = dict(formula=formula, data=df, k=2, family="poisson", gate_formula="~ 1", tol=1e-8, max_iter=2000,
                  restarts=10, seed=1)
    fast = ms.fit_mle(**kwargs)
    monkeypatch.setattr(em, "glm_expert_step", _reference_step)  # EM's step by irls_weighted, as before
    monkeypatch.setattr(mle, "_fused_poisson", lambda spec, trials: False)  # L-BFGS gradient by autograd
    ref = ms.fit_mle(**kwargs)
    # the benchmark's criterion: the same maximum to 1e-6 (rounding-level differences in the iterates)
    assert fast.loglik == pytest.approx(ref.loglik, abs=1e-6)
    np.testing.assert_allclose(np.asarray(fast.theta), np.asarray(ref.theta), atol=1e-4)  # flat likelihood
    assert fast.converged == ref.converged
