"""Predictive variance, fitted values and residuals of an MLE fit: closed forms at k = 1, the law of total variance
written out by hand at k = 2, Monte Carlo draws from the fit, and the Pearson dispersion of predictive_checks."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import moestat as ms
from moestat.fit.checks import predictive_checks

SPEC = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
TRUTH = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.3])


def _fit(spec, X, y, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ms.fit_mle(spec, X, y, seed=1, restarts=3, **kw)


@pytest.fixture(scope="module")
def gaussian():
    data = ms.simulate(SPEC, TRUTH, n=4000, seed=0, model="mixture")
    X, y = data.X[0], data.y[0]  # one data set: results without the replicate axis
    return _fit(SPEC, X, y), (X, y)


def test_variance_is_the_law_of_total_variance_written_by_hand(gaussian):
    fit, _ = gaussian
    X_new = np.linspace(-1, 1, 7)[:, None]
    w, mu = fit.gate_probs(X_new), fit.expert_means(X_new)
    sd = np.asarray(fit.params.noise_sd, dtype=float)
    mean = (w * mu).sum(1)
    by_hand = (w * (sd**2 + mu**2)).sum(1) - mean**2
    np.testing.assert_allclose(fit.predict(X_new, "variance"), by_hand, rtol=1e-12)
    np.testing.assert_allclose(fit.predict(X_new), mean, rtol=1e-12)


def test_variance_matches_draws_from_the_fit(gaussian):
    fit, _ = gaussian
    X_new = np.array([[-0.8], [0.0], [0.6]])
    draws = fit.simulate(X_new, n_draws=40_000, seed=3)
    # the sample variance of 40,000 draws has relative SE sqrt((kurtosis - 1) / N), below 1.3% here (the mixtures'
    # kurtosis at these inputs is 1.7-7.7, measured on the draws); 6% is over four SEs
    np.testing.assert_allclose(draws.var(0), fit.predict(X_new, "variance"), rtol=0.06)


def test_fitted_values_and_residuals(gaussian):
    fit, (_, y) = gaussian
    np.testing.assert_array_equal(fit.fittedvalues, fit.predict(None))
    np.testing.assert_allclose(fit.resid, y - fit.fittedvalues, rtol=0, atol=1e-12)
    r = fit.resid_pearson
    np.testing.assert_allclose(r, fit.resid / np.sqrt(fit.predict(None, "variance")), rtol=1e-12)
    checks = predictive_checks(fit)
    dispersion = float((r**2).sum() / (fit.nobs - fit.df_model))
    assert dispersion == pytest.approx(float(checks["pearson_dispersion"].iloc[0]), rel=1e-10)
    # a correctly specified fit: Pearson residuals with mean about 0 and variance about 1 (n = 4,000: SEs 0.016 and
    # 0.037, the latter measured; the bounds are over three SEs)
    assert abs(r.mean()) < 0.07 and abs((r**2).mean() - 1) < 0.12


def test_k1_closed_forms_for_each_family():
    rng = np.random.default_rng(5)
    x = rng.normal(size=500)
    m = rng.integers(1, 8, size=500)
    df = pd.DataFrame({"x": x, "yn": 1 + 2 * x + 0.7 * rng.normal(size=500),
                       "yp": rng.poisson(np.exp(0.3 + 0.5 * x)),
                       "yb": rng.binomial(m, 1 / (1 + np.exp(-x))) / m, "m": m})
    g = ms.fit_mle(formula="yn ~ x", data=df, k=1, restarts=1, seed=0)
    assert "gate coefficients are relative" not in g.summary().as_text()  # one expert: no gate, no gate note
    sigma = float(np.asarray(g.params.noise_sd).ravel()[0])
    np.testing.assert_allclose(g.predict(df, "variance"), sigma**2, rtol=1e-12)
    p = ms.fit_mle(formula="yp ~ x", data=df, k=1, family="poisson", restarts=1, seed=0)
    np.testing.assert_allclose(p.predict(df, "variance"), p.predict(df), rtol=1e-12)
    b = ms.fit_mle(formula="yb ~ x", data=df, k=1, family="binomial", trials="m", restarts=1, seed=0)
    mu = b.fittedvalues
    np.testing.assert_allclose(b.predict(None, "variance"), mu * (1 - mu) / m, rtol=1e-12)
    np.testing.assert_allclose(b.predict(df, "variance", trials=m), mu * (1 - mu) / m, rtol=1e-12)
    # a new frame holding the fit's trials column gives its rows' trials, as an offset is read by name
    np.testing.assert_array_equal(b.predict(df, "variance"), b.predict(df, "variance", trials=m))
    np.testing.assert_array_equal(b.posterior(df), b.posterior(df, trials=m))
    with pytest.raises(TypeError, match="needs trials="):
        b.predict(df.drop(columns="m"), "variance")
    # the training inputs use the training trials for every kind (quantiles and intervals too)
    assert b.predict(None, "interval").shape == (500, 2)
    np.testing.assert_allclose(b.resid_pearson, (df["yb"] - mu) / np.sqrt(mu * (1 - mu) / m), rtol=1e-10)


def test_batched_shapes_and_missing_rows():
    data = ms.simulate(SPEC, TRUTH, n=300, reps=3, seed=2, model="mixture")
    fit = _fit(SPEC, data.X, data.y)
    assert fit.fittedvalues.shape == fit.resid.shape == fit.resid_pearson.shape == (3, 300)
    assert fit.predict(data.X[0], "variance").shape == (3, 300)
    df = pd.DataFrame({"x": data.X[0, :, 0], "y": data.y[0]})
    df.loc[[4, 9], "x"] = np.nan
    f = ms.fit_mle(formula="y ~ x", data=df, k=2, missing="drop", restarts=2, seed=1)
    assert f.fittedvalues.shape == (298,)
    var = f.predict(df, "variance")
    assert var.shape == (300,) and np.isnan(var[[4, 9]]).all() and np.isfinite(np.delete(var, [4, 9])).all()
    with pytest.raises(TypeError, match="q= is for kind='quantile'"):
        f.predict(df, "variance", q=0.5)


def test_wall_time_is_recorded():
    """fit_mle records the seconds it took (FitResult's wall_time); it was NaN."""
    data = ms.simulate(SPEC, TRUTH, n=300, seed=1, model="mixture")
    fit = _fit(SPEC, data.X[0], data.y[0])
    assert 0 < fit.wall_time < 60 and fit.settings["wall_time"] == fit.wall_time
