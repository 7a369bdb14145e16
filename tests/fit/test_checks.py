"""Predictive checks of a fitted mixture (moestat.fit.checks): the mixture moments against brute-force sums, scipy
and Monte-Carlo draws from ``fit.simulate``; the check table against hand computations; the statsmodels rows
against closed forms and statsmodels' own statistics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf
from scipy import integrate, stats

import moestat as ms
from moestat.fit.checks import (
    CHECK_COLUMNS,
    compare_glm,
    count_model_checks,
    mixture_moments,
    predictive_checks,
    restart_logliks,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _frame(n: int = 500, seed: int = 0) -> pd.DataFrame:
    """Experts on x, gate on w; a count response with more zeros and spread than one Poisson, a Gaussian one, and
    binomial successes out of m trials."""
    rng = np.random.default_rng(seed)
    x, w = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-2 * w))
    visits = rng.poisson(np.where(first, np.exp(-0.5 + 0.5 * x), np.exp(1.8 - 0.5 * x)))
    y = np.where(first, 1 + 2 * x, -1 - x) + 0.4 * rng.normal(size=n)
    m = rng.integers(1, 21, n).astype(float)
    s = rng.binomial(m.astype(int), 1 / (1 + np.exp(-np.where(first, 1 + x, -1.5))))
    return pd.DataFrame({"visits": visits, "y": y, "p": s / m, "m": m, "x": x, "w": w})


@pytest.fixture(scope="module")
def data() -> pd.DataFrame:
    return _frame()


@pytest.fixture(scope="module")
def poisson_fit(data):
    return ms.fit_mle(formula="visits ~ x", data=data, k=2, gate_formula="~ w", family="poisson", restarts=2, seed=1)


# ------------------------------------------------------------------------------------------- mixture_moments
def test_poisson_and_binomial_moments_equal_sums_over_the_pmf():
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(3), size=6)
    rate = rng.uniform(0.1, 20, (6, 3))
    ys = np.arange(300)  # rates below 20: the Poisson pmf beyond 300 is below 1e-200
    pmf = (w[:, None, :] * stats.poisson.pmf(ys[None, :, None], rate[:, None, :])).sum(-1)
    mean, var, p0 = mixture_moments(w, rate, response="poisson")
    # sums of a few hundred floats against closed forms: 1e-10 relative is rounding, not approximation
    np.testing.assert_allclose(mean, pmf @ ys, rtol=1e-10)
    np.testing.assert_allclose(var, pmf @ ys ** 2 - (pmf @ ys) ** 2, rtol=1e-10)
    np.testing.assert_allclose(p0, pmf[:, 0], rtol=1e-12)

    prob, m = rng.uniform(0.05, 0.95, (6, 3)), rng.integers(1, 30, 6).astype(float)
    mean, var, p0 = mixture_moments(w, prob, response="binomial", trials=m)
    for t in range(6):  # the proportion s/m, s = 0..m enumerated
        s = np.arange(m[t] + 1)
        pmf_t = (w[t] * stats.binom.pmf(s[:, None], m[t], prob[t])).sum(-1)
        prop = s / m[t]
        assert mean[t] == pytest.approx(pmf_t @ prop, rel=1e-12)  # exact enumeration: rounding only
        assert var[t] == pytest.approx(pmf_t @ prop ** 2 - (pmf_t @ prop) ** 2, rel=1e-10)
        assert p0[t] == pytest.approx(pmf_t[0], rel=1e-12)


def test_one_component_moments_equal_scipy():
    mu, m = np.array([[0.3], [4.0], [17.5]]), np.array([1.0, 7.0, 30.0])
    one = np.ones_like(mu)
    mean, var, p0 = mixture_moments(one, mu, response="poisson")
    law = stats.poisson(mu[:, 0])
    # closed forms on both sides: agreement to 1e-12 relative is rounding only
    np.testing.assert_allclose(np.c_[mean, var, p0], np.c_[law.mean(), law.var(), law.pmf(0)], rtol=1e-12)
    prob = np.array([[0.1], [0.5], [0.93]])
    mean, var, p0 = mixture_moments(one, prob, response="binomial", trials=m)
    law = stats.binom(m, prob[:, 0])
    np.testing.assert_allclose(np.c_[mean, var, p0], np.c_[law.mean() / m, law.var() / m ** 2, law.pmf(0)],
                               rtol=1e-12)
    mean, var, p0 = mixture_moments(one, mu, sd=np.array([[0.5], [2.0], [3.0]]), response="gaussian")
    law = stats.norm(mu[:, 0], [0.5, 2.0, 3.0])
    np.testing.assert_allclose(np.c_[mean, var], np.c_[law.mean(), law.var()], rtol=1e-12)
    assert np.isnan(p0).all()  # a continuous response puts no mass at 0


def test_gaussian_mixture_moments_equal_quadrature():
    w, mu, sd = np.array([0.2, 0.5, 0.3]), np.array([-2.0, 0.5, 3.0]), np.array([0.4, 1.0, 2.5])
    mean, var, _ = mixture_moments(w, mu, sd, response="gaussian")

    def dens(y: float) -> float:
        return float((w * stats.norm.pdf(y, mu, sd)).sum())

    m1 = integrate.quad(lambda y: y * dens(y), -np.inf, np.inf, epsabs=1e-13)[0]
    m2 = integrate.quad(lambda y: y * y * dens(y), -np.inf, np.inf, epsabs=1e-13)[0]
    # adaptive quadrature of smooth integrands: its error estimate is below 1e-10
    assert mean == pytest.approx(m1, abs=1e-9) and var == pytest.approx(m2 - m1 ** 2, abs=1e-9)


def test_mixture_moments_refuses_bad_input():
    with pytest.raises(ValueError, match="response"):
        mixture_moments(np.ones((2, 1)), np.ones((2, 1)), response="gamma")
    with pytest.raises(ValueError, match="same shape"):
        mixture_moments(np.ones((2, 2)), np.ones((2, 3)), response="poisson")


# --------------------------------------------------------------------------------------- predictive_checks
def test_fitted_moments_agree_with_draws_from_the_fit(poisson_fit, data):
    rows = data.iloc[:40]
    checks = predictive_checks(poisson_fit, rows)
    draws = poisson_fit.simulate(rows, n_draws=20_000, seed=3)  # (20000, 40)
    pooled = draws.ravel()  # every row equally often: the sample's marginal distribution
    n = pooled.size
    row = checks.iloc[0]
    # Monte Carlo with 8e5 draws: standard errors sd/sqrt(n); 5 SEs keep a false failure below 1e-6
    sd = np.sqrt(row["fitted_variance"])
    assert abs(pooled.mean() - row["fitted_mean"]) < 5 * sd / np.sqrt(n)
    p0 = row["fitted_zero_share"]
    assert abs((pooled == 0).mean() - p0) < 5 * np.sqrt(p0 * (1 - p0) / n)
    # the variance's SE is sqrt((m4 - var^2) / n), m4 the fourth central moment estimated from the draws
    m4 = np.mean((pooled - pooled.mean()) ** 4)
    assert abs(pooled.var() - row["fitted_variance"]) < 5 * np.sqrt((m4 - pooled.var() ** 2) / n)
    # per row: E[y|x] and Var[y|x] against the row's 20,000 draws (40 rows x 2 statistics, 5 SEs each)
    mean, var, _ = mixture_moments(poisson_fit.gate_probs(rows), poisson_fit.expert_means(rows), response="poisson")
    assert np.all(np.abs(draws.mean(0) - mean) < 5 * np.sqrt(var / draws.shape[0]))


def test_check_row_by_hand_and_loglik_by_scipy(poisson_fit, data):
    own = predictive_checks(poisson_fit).iloc[0]
    assert list(predictive_checks(poisson_fit).columns) == ["rep", *CHECK_COLUMNS]
    y = data["visits"].to_numpy(float)
    pi, mu = poisson_fit.gate_probs(data), poisson_fit.expert_means(data)
    mean = (pi * mu).sum(1)
    var = (pi * (mu + mu ** 2)).sum(1) - mean ** 2
    n, df = len(y), poisson_fit.df_model
    hand = {"n": n, "df": df, "loglik": poisson_fit.loglik, "bic": poisson_fit.bic, "observed_mean": y.mean(),
            "fitted_mean": mean.mean(), "observed_variance": y.var(), "fitted_variance": var.mean() + mean.var(),
            "observed_zero_share": np.mean(y == 0), "fitted_zero_share": (pi * np.exp(-mu)).sum(1).mean(),
            "pearson_dispersion": ((y - mean) ** 2 / var).sum() / (n - df)}
    for key, value in hand.items():
        assert own[key] == pytest.approx(value, rel=1e-12), key  # the same sums in another order: rounding only
    # on rows passed in, the log-likelihood is scipy's, independent of the fit's torch code: rounding only
    passed = predictive_checks(poisson_fit, data).iloc[0]
    assert passed["loglik"] == pytest.approx(poisson_fit.loglik, rel=1e-12)
    y_only = predictive_checks(poisson_fit, data[["x", "w"]], data["visits"]).iloc[0]
    assert y_only.drop("rep").equals(passed.drop("rep"))


def test_gaussian_and_binomial_fits(data):
    gfit = ms.fit_mle(formula="y ~ x", data=data, k=2, gate_formula="~ w", restarts=2, seed=1)
    g = predictive_checks(gfit, data).iloc[0]
    assert g["loglik"] == pytest.approx(gfit.loglik, rel=1e-12)  # scipy's normal log-density vs torch: rounding
    assert np.isnan(g["observed_zero_share"]) and np.isnan(g["fitted_zero_share"])
    # k = 1 is least squares: residuals sum to zero (fitted mean = ybar) and the ML variance RSS/n plus the
    # spread of the fitted values is the total variance (TSS = ESS + RSS); exact up to the fit's tolerance
    ols = predictive_checks(ms.fit_mle(formula="y ~ x", data=data, k=1, restarts=1, seed=0)).iloc[0]
    assert ols["fitted_mean"] == pytest.approx(ols["observed_mean"], abs=1e-8)
    assert ols["fitted_variance"] == pytest.approx(ols["observed_variance"], rel=1e-8)
    assert ols["pearson_dispersion"] == pytest.approx(len(data) / (len(data) - 3), rel=1e-8)  # RSS/sigma^2 = n

    bfit = ms.fit_mle(formula="p ~ x", data=data, k=2, gate_formula="~ w", family="binomial", trials="m",
                      restarts=2, seed=1)
    own = predictive_checks(bfit).iloc[0]
    again = predictive_checks(bfit, data, trials=data["m"]).iloc[0]
    # the binomial log-pmf of the successes by scipy against the fit's own (log C(m, s) included): rounding only
    assert again["loglik"] == pytest.approx(bfit.loglik, rel=1e-12)
    pd.testing.assert_series_equal(own.drop(["rep", "loglik"]), again.drop(["rep", "loglik"]), rtol=1e-12)
    draws = bfit.simulate(n_draws=4000, seed=5).ravel()
    # 2e6 draws, 5 standard errors (see the Poisson test)
    p0 = own["fitted_zero_share"]
    assert abs((draws == 0).mean() - p0) < 5 * np.sqrt(p0 * (1 - p0) / draws.size)
    assert abs(draws.mean() - own["fitted_mean"]) < 5 * np.sqrt(own["fitted_variance"] / draws.size)


def test_case_weights_count_rows_like_repeated_rows(data):
    sub = data.iloc[:200].assign(c=np.random.default_rng(2).integers(1, 4, 200).astype(float))
    fit = ms.fit_mle(formula="visits ~ x", data=sub, k=2, gate_formula="~ w", family="poisson", weights="c",
                     restarts=1, seed=0)
    weighted = predictive_checks(fit).iloc[0]
    long = sub.loc[sub.index.repeat(sub["c"].astype(int))]
    repeated = predictive_checks(fit, long).iloc[0]
    assert weighted["n"] == len(long) == repeated["n"]
    # weights c_t against c_t copies of row t: the same sums in another order, rounding only
    pd.testing.assert_series_equal(weighted.drop("rep"), repeated.drop("rep"), rtol=1e-10)


def test_batched_fit_has_one_row_per_replicate():
    frames = [_frame(n=300, seed=s) for s in range(3)]
    X = np.stack([f[["x"]].to_numpy() for f in frames])  # (3, 300, 1): three data sets
    y = np.stack([f["visits"].to_numpy(float) for f in frames])
    fit = ms.fit_mle(ms.MoE(k=2, d=1, response="poisson"), X, y, restarts=1, seed=0)
    table = predictive_checks(fit)
    assert list(table["rep"]) == [0, 1, 2]
    for r in range(3):  # replicate r of the batch is the fit of data set r alone
        one = predictive_checks(fit.select(r)).iloc[0]
        pd.testing.assert_series_equal(table.iloc[r].drop("rep"), one.drop("rep"), rtol=1e-12, check_names=False)


def test_predictive_checks_refuses_bad_input(poisson_fit, data):
    with pytest.raises(TypeError, match="MLEFit"):
        predictive_checks("not a fit")
    with pytest.raises(TypeError, match="y= and trials= go with X="):
        predictive_checks(poisson_fit, y=data["visits"])
    with pytest.raises(ValueError, match=r"y must have shape \(500,\), got \(10,\)"):
        predictive_checks(poisson_fit, data[["x", "w"]], data["visits"].iloc[:10])
    with pytest.raises(TypeError, match="needs y="):
        predictive_checks(poisson_fit, data[["x", "w"]].to_numpy(copy=True))


# ------------------------------------------------------------------------------------- statsmodels references
def test_nb2_row_equals_its_closed_forms_and_scipy(data):
    nb = smf.negativebinomial("visits ~ x + w", data).fit(disp=0, maxiter=200)
    row = count_model_checks(nb).iloc[0]
    alpha, mu = float(nb.params["alpha"]), np.asarray(nb.predict())
    law = stats.nbinom(1 / alpha, 1 / (1 + alpha * mu))  # scipy's (n, p) form of NB2 with mean mu
    y = data["visits"].to_numpy(float)
    np.testing.assert_allclose(law.mean(), mu, rtol=1e-12)  # the parametrisation itself
    var, p0 = mu + alpha * mu ** 2, (1 + alpha * mu) ** (-1 / alpha)  # NB2 closed forms
    np.testing.assert_allclose(law.var(), var, rtol=1e-12)
    np.testing.assert_allclose(law.pmf(0), p0, rtol=1e-12)
    assert row["df"] == 4 and row["loglik"] == pytest.approx(nb.llf, rel=1e-14)  # 3 coefficients and alpha
    assert row["loglik"] == pytest.approx(law.logpmf(y).sum(), rel=1e-10)  # scipy's log-pmf: rounding only
    assert row["bic"] == pytest.approx(-2 * nb.llf + 4 * np.log(len(y)), rel=1e-14)
    # statsmodels' variance and pmf against the closed forms: rounding only
    assert row["fitted_zero_share"] == pytest.approx(p0.mean(), rel=1e-12)
    assert row["fitted_variance"] == pytest.approx(var.mean() + mu.var(), rel=1e-12)
    assert row["pearson_dispersion"] == pytest.approx(((y - mu) ** 2 / var).sum() / (len(y) - 4), rel=1e-12)


def test_poisson_row_dispersion_equals_statsmodels_pearson_chi2(data):
    pois = smf.poisson("visits ~ x + w", data).fit(disp=0)
    glm = smf.glm("visits ~ x + w", data, family=sm.families.Poisson()).fit()
    row = count_model_checks(pois).iloc[0]
    # statsmodels' GLM Pearson chi^2 / residual df: the same estimate from another fitting routine (1e-8)
    assert row["pearson_dispersion"] == pytest.approx(glm.pearson_chi2 / glm.df_resid, rel=1e-8)
    with pytest.raises(TypeError, match="statsmodels count model"):
        count_model_checks(object())


def test_compare_glm_k1_poisson(data):
    fit = ms.fit_mle(formula="visits ~ x + w", data=data, k=1, family="poisson", restarts=1, seed=0)
    glm = smf.glm("visits ~ x + w", data, family=sm.families.Poisson()).fit(tol=1e-12)
    table = compare_glm(fit, glm).set_index("term")
    assert list(table.index) == ["Intercept", "x", "w", "loglik"]
    # k = 1 is the Poisson GLM: a strictly concave log-likelihood with one maximum that both reach (IRLS to
    # tolerance 1e-8 or below), and SEs from the same observed information
    assert table["abs_diff"].max() < 1e-6 and table["se_rel_diff"].max() < 1e-5
    assert table.loc["x", "statsmodels"] == glm.params["x"]
    k2 = ms.fit_mle(formula="visits ~ x", data=data, k=2, family="poisson", restarts=1, seed=0)
    with pytest.raises(ValueError, match="k = 1"):
        compare_glm(k2, glm)
    with pytest.raises(ValueError, match="no term"):
        compare_glm(fit, smf.glm("visits ~ x", data, family=sm.families.Poisson()).fit())
    with pytest.raises(TypeError, match="named params"):
        compare_glm(fit, sm.GLM(data["visits"].to_numpy(), sm.add_constant(data[["x", "w"]].to_numpy()),
                                family=sm.families.Poisson()).fit())


def test_restart_logliks(poisson_fit):
    table = restart_logliks(poisson_fit)
    ll = np.asarray(poisson_fit.restart_loglik)
    assert list(table.columns) == ["rep", "start", "loglik", "gap_to_best"] and len(table) == ll.size
    np.testing.assert_array_equal(table["loglik"], ll)
    np.testing.assert_array_equal(table["gap_to_best"], ll.max() - ll)
    assert table["gap_to_best"].min() == 0 and (table["gap_to_best"] >= 0).all()
