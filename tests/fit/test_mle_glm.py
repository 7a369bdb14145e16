"""GLM experts in fit_mle: Poisson and binomial mixtures of experts (EM with IRLS expert steps, L-BFGS, SEs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats
from scipy.special import logsumexp

import moestat as ms


def _poisson_moe(n: int = 600, seed: int = 0) -> pd.DataFrame:
    """Two Poisson experts, log-rates 1 + x and 2 - x, gated by w."""
    rng = np.random.default_rng(seed)
    x, w = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-3 * w))
    y = rng.poisson(np.where(first, np.exp(1 + x), np.exp(2 - x)))
    return pd.DataFrame({"y": y.astype(float), "x": x, "w": w})


@pytest.mark.parametrize(("family", "sm_family"), [("poisson", sm.families.Poisson()),
                                                   ("binomial", sm.families.Binomial())])
def test_one_glm_expert_is_statsmodels_glm(family, sm_family):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 2))
    eta = 0.3 + X @ np.array([0.5, -0.4])
    y = rng.poisson(np.exp(eta)) if family == "poisson" else (rng.uniform(size=400) < 1 / (1 + np.exp(-eta)))
    y = y.astype(float)
    fit = ms.fit_mle(ms.MoE(k=1, d=2), X, y, family=family, seed=0)
    ref = sm.GLM(y, sm.add_constant(X), family=sm_family).fit()
    # the same likelihood maximised: coefficients to the optimisers' tolerances, observed-information SEs to 1e-6
    np.testing.assert_allclose(np.asarray(fit.theta), ref.params, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(fit.bse(), ref.bse, rtol=1e-5)
    assert fit.loglik == pytest.approx(ref.llf, rel=1e-10)
    assert fit.param_names == ["expert[0]:const", "expert[0]:x1", "expert[0]:x2"]


@pytest.mark.parametrize("method", ["em", "gradient"])
def test_poisson_mixture_of_experts_with_a_gate_formula(method):
    df = _poisson_moe()
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", family="poisson", method=method, seed=2)
    assert fit.converged and "log_sigma" not in " ".join(fit.param_names)
    g0, gw, b0, a0, b1, a1 = np.asarray(fit.theta)
    x, w, y = (df[c].to_numpy() for c in ("x", "w", "y"))
    logpi = np.stack([g0 + gw * w, np.zeros_like(w)], 1)
    logpi -= logsumexp(logpi, axis=1, keepdims=True)
    mu = np.exp(np.stack([b0 + a0 * x, b1 + a1 * x], 1))
    # the log-likelihood written with scipy's Poisson pmf
    assert fit.loglik == pytest.approx(logsumexp(logpi + stats.poisson.logpmf(y[:, None], mu), axis=1).sum(),
                                       rel=1e-10)
    # the truth within 4 SEs (log-rates 1 + x and 2 - x in some labelling; gate slope +-3)
    est = {round(b0): (b0, a0), round(b1): (b1, a1)}
    se = fit.bse()
    assert set(est) == {1, 2}
    assert abs(est[1][1] - 1) < 4 * se[3] + 4 * se[5] and abs(est[2][1] + 1) < 4 * se[3] + 4 * se[5]
    assert abs(abs(gw) - 3) < 4 * se[1]
    # predictions: the mixture mean of the Poisson rates
    np.testing.assert_allclose(fit.predict(df.head(5)), (np.exp(logpi) * mu)[:5].sum(1), rtol=1e-10)
    assert "Poisson mixture of experts" in str(fit.summary())


def test_em_and_gradient_reach_the_same_poisson_maximum():
    df = _poisson_moe(seed=3)
    em = ms.fit_mle(formula="y ~ x", data=df, k=2, family="poisson", seed=4)
    gr = ms.fit_mle(formula="y ~ x", data=df, k=2, family="poisson", method="gradient", init=em.params, seed=4)
    assert gr.loglik == pytest.approx(em.loglik, rel=1e-7)


def test_poisson_weights_equal_repeated_rows():
    df = _poisson_moe(n=300, seed=5)
    c = np.random.default_rng(6).integers(1, 4, len(df))
    a = ms.fit_mle(formula="y ~ x", data=df, k=2, family="poisson", weights=c, seed=0)
    # restarts=0: only the warm start from a's maximum (a random start may reach the same maximum with the experts
    # in the other order, which would permute the SEs)
    b = ms.fit_mle(formula="y ~ x", data=df.loc[df.index.repeat(c)], k=2, family="poisson", init=a.params,
                   restarts=0, seed=0)
    assert a.loglik == pytest.approx(b.loglik, rel=1e-8)
    np.testing.assert_allclose(a.bse(), b.bse(), rtol=1e-3)


@pytest.mark.parametrize(("family", "y", "match"), [
    ("poisson", np.full(50, 1.5), "y"),
    ("poisson", -np.ones(50), "y"),
    ("binomial", np.full(50, 2.0), "y"),
    ("negbin", np.ones(50), "response"),
])
def test_bad_responses_for_a_family_are_refused(family, y, match):
    X = np.linspace(-1, 1, 50)[:, None]
    with pytest.raises(ValueError, match=match):
        ms.fit_mle(ms.MoE(k=2, d=1), X, y, family=family)


def test_glm_experts_need_a_linear_predictor():
    with pytest.raises(ValueError, match="expert='linear'"):
        ms.MoE(k=2, d=1, expert="relu", response="poisson")


def test_bootstrap_select_k_and_lrt_keep_the_poisson_family():
    df = _poisson_moe(n=300, seed=7)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", family="poisson", seed=0)
    boot = ms.bootstrap(fit, n_resamples=10, seed=1)
    # parametric resamples are Poisson counts refitted as Poisson: SE ratios near 1 (10 resamples: a factor 2.5
    # covers the sampling spread of an SD from 10 draws)
    ok = ~boot.failed
    ratio = boot.draws[ok].std(0, ddof=1) / fit.bse()
    assert ok.sum() >= 9 and np.all((ratio > 0.4) & (ratio < 2.5)), ratio
    sel = ms.select_k(formula="y ~ x", data=df, gate_formula="~ w", ks=(1, 2), family="poisson", seed=0)
    assert sel.best_k == 2 and sel.fits[2].spec.response == "poisson"
    lrt = ms.test_n_experts(formula="y ~ x", data=df, gate_formula="~ w", k0=1, k1=2, n_resamples=5,
                            family="poisson", seed=0)
    assert lrt.fit0.spec.response == "poisson" and lrt.p_value == pytest.approx(1 / 6)
