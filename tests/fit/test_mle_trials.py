"""Binomial experts with several trials per row in fit_mle (``trials=``; y = successes / trials)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

import moestat as ms


def _frame(n: int = 400, k: int = 2, seed: int = 0) -> pd.DataFrame:
    """Rows of m in 1..30 trials; two logistic experts split by a gate on x (k=1: the first expert only)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, n)
    m = rng.integers(1, 31, n).astype(float)
    first = (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * x))) if k == 2 else np.ones(n, bool)
    eta = np.where(first, 1.0 + 1.5 * x, -1.5 - 0.5 * x)
    s = rng.binomial(m.astype(int), 1 / (1 + np.exp(-eta)))
    return pd.DataFrame({"y": s / m, "x": x, "m": m})


def _mixture_loglik(fit: ms.MLEFit, df: pd.DataFrame) -> float:
    """Independent: sum_t log sum_j pi_j Bin(s_t; m_t, p_j(x_t)) by scipy, from the fit's gate and experts."""
    w, p = fit.gate_probs(df[["x"]]), fit.expert_means(df[["x"]])
    m, s = df["m"].to_numpy(), (df["y"] * df["m"]).round().to_numpy()
    return float(np.log((w * stats.binom.pmf(s[:, None], m[:, None], p)).sum(1)).sum())


def test_k1_equals_statsmodels_binomial_glm_with_var_weights():
    df = _frame(k=1)
    ref = sm.GLM(df["y"], sm.add_constant(df[["x"]]), family=sm.families.Binomial(), var_weights=df["m"]).fit(
        tol=1e-12)
    for method in ("em", "gradient"):
        fit = ms.fit_mle(formula="y ~ x", data=df, k=1, family="binomial", trials="m", method=method, seed=0)
        np.testing.assert_allclose(fit.theta, ref.params, atol=1e-5)  # gradient path: gtol 1e-7 -> ~1e-6
        np.testing.assert_allclose(fit.bse(), ref.bse, rtol=1e-4)
        # the log-likelihood is the full binomial log-pmf, log C(m, s) included
        s = (df["y"] * df["m"]).round()
        p = 1 / (1 + np.exp(-(ref.params["const"] + ref.params["x"] * df["x"])))
        assert fit.loglik == pytest.approx(stats.binom.logpmf(s, df["m"], p).sum(), abs=1e-6)


def test_k1_expanded_into_bernoulli_rows_differs_by_the_binomial_coefficients():
    df = _frame(n=120, k=1, seed=3)
    agg = ms.fit_mle(formula="y ~ x", data=df, k=1, family="binomial", trials="m", seed=0)
    s = (df["y"] * df["m"]).round().astype(int).to_numpy()
    m = df["m"].astype(int).to_numpy()
    x_long = np.repeat(df["x"].to_numpy(), m)
    y_long = np.concatenate([np.r_[np.ones(si), np.zeros(mi - si)] for si, mi in zip(s, m, strict=True)])
    long = ms.fit_mle(ms.MoE(k=1, d=1, response="binomial"), x_long[:, None], y_long, seed=0)
    np.testing.assert_allclose(agg.theta, long.theta, atol=1e-6)  # the same likelihood kernel: the same MLE
    log_choose = (stats.binom.logpmf(s, m, 0.5) - m * np.log(0.5)).sum()  # sum_t log C(m_t, s_t)
    assert agg.loglik - long.loglik == pytest.approx(log_choose, abs=1e-6)


def test_k2_em_and_gradient_agree_and_match_an_independent_loglik():
    df = _frame(n=600)
    em = ms.fit_mle(formula="y ~ x", data=df, k=2, family="binomial", trials="m", seed=1)
    gr = ms.fit_mle(formula="y ~ x", data=df, k=2, family="binomial", trials="m", method="gradient", seed=1)
    assert em.loglik == pytest.approx(gr.loglik, abs=1e-4)  # both stop at ~1e-8 relative of |loglik| ~ 1e3
    assert em.loglik == pytest.approx(_mixture_loglik(em, df), abs=1e-8)
    for kind in ("oim", "sandwich", "opg"):
        assert np.isfinite(em.bse(kind)).all()


def test_k2_recovers_the_experts():
    df = _frame(n=1500, seed=5)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, family="binomial", trials="m", seed=2)
    est, se = np.asarray(fit.theta), np.asarray(fit.bse())
    names = fit.param_names
    got = {(round(est[names.index(f"expert[{j}]:const")], 1)): j for j in range(2)}
    j1 = got[max(got)]  # the expert with the larger intercept is the truth's first (1.0 + 1.5 x)
    j2 = 1 - j1
    truth = {f"expert[{j1}]:const": 1.0, f"expert[{j1}]:x": 1.5, f"expert[{j2}]:const": -1.5,
             f"expert[{j2}]:x": -0.5}
    for term, value in truth.items():  # within 4 SE: a 4-sigma miss has probability 6e-5 per term
        i = names.index(term)
        assert abs(est[i] - value) < 4 * se[i], term


def test_trials_in_predict_simulate_posterior():
    df = _frame(n=300)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, family="binomial", trials="m", seed=1)
    draws = fit.simulate(n_draws=3, seed=0)  # default: the training trials
    assert np.allclose(draws * df["m"].to_numpy(), np.round(draws * df["m"].to_numpy()))
    assert not np.isin(draws, [0.0, 1.0]).all()  # proportions, not Bernoulli draws
    new = df.head(5)
    with pytest.raises(TypeError, match="needs trials="):
        fit.simulate(new.drop(columns="m"))
    # a frame holding the trials column ("m") gives its rows' trials, as trials=new["m"] does
    np.testing.assert_array_equal(fit.simulate(new, n_draws=4, seed=2), fit.simulate(new, n_draws=4, seed=2,
                                                                                      trials=new["m"]))
    sims = fit.simulate(new, n_draws=20000, seed=1, trials=new["m"])
    mean = fit.predict(new)
    assert np.all(np.abs(sims.mean(0) - mean) < 5 * 0.5 / np.sqrt(20000))  # 5 MC SEs (a proportion's sd <= 0.5)
    # the interval's ends are proportions of m trials and cover at least the level (discrete law)
    iv = fit.predict(new, "interval", confidence_level=0.8, trials=new["m"])
    assert np.allclose(iv * new["m"].to_numpy()[:, None], np.round(iv * new["m"].to_numpy()[:, None]))
    inside = ((sims >= iv[:, 0]) & (sims <= iv[:, 1])).mean(0)
    assert np.all(inside >= 0.8 - 0.02)  # 0.02 >> MC SE 0.003
    post = fit.posterior(new[["x"]], new["y"], trials=new["m"])
    np.testing.assert_allclose(post, fit.posterior_frame()[["posterior_0", "posterior_1"]].head(5), atol=1e-12)


def test_trials_errors():
    df = _frame(n=60)
    with pytest.raises(ValueError, match="trials= is for binomial experts"):
        ms.fit_mle(formula="y ~ x", data=df, k=2, trials="m")
    with pytest.raises(ValueError, match="not a column of data"):
        ms.fit_mle(formula="y ~ x", data=df, k=2, family="binomial", trials="n_trials")
    bad = df.assign(y=df["y"] + 0.5 / df["m"]).clip(upper=1)
    with pytest.raises(ValueError, match="whole numbers of successes"):
        ms.fit_mle(formula="y ~ x", data=bad, k=2, family="binomial", trials="m")
    with pytest.raises(TypeError, match="names a column"):
        ms.fit_mle(ms.MoE(k=2, d=1, response="binomial"), df[["x"]].to_numpy(), df["y"].to_numpy(), trials="m")
