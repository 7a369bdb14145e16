"""Offsets (a known term of every expert's linear predictor, coefficient 1): statsmodels' GLM with offset= at k = 1
for each family and both methods, the formula and array interfaces against each other, EM against L-BFGS with shared
slopes, predictions read from a new frame by name, the inference functions, and bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf

import moestat as ms


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    n = 600
    df = pd.DataFrame({"x": rng.normal(size=n), "t": rng.uniform(0.5, 5.0, n), "z": rng.normal(size=n),
                       "m": rng.integers(1, 6, n)})
    upper = rng.random(n) < 1 / (1 + np.exp(-2 * df["z"]))
    df["c"] = rng.poisson(df["t"] * np.exp(np.where(upper, 1.0 + 0.5 * df["x"], -0.5 - 0.3 * df["x"])))
    df["yn"] = 1 + 2 * df["x"] + np.log(df["t"]) + 0.5 * rng.normal(size=n)
    df["b"] = rng.binomial(1, 1 / (1 + np.exp(-(0.3 * df["x"] + np.log(df["t"]) - 1))))
    return df


@pytest.mark.parametrize("method", ["em", "gradient"])
@pytest.mark.parametrize("family, response", [("poisson", "c"), ("binomial", "b")])
def test_k1_equals_statsmodels_glm_with_offset(frame, method, family, response):
    fit = ms.fit_mle(formula=f"{response} ~ x", data=frame, k=1, family=family, offset="np.log(t)", restarts=2,
                     seed=0, method=method)
    glm_family = sm.families.Poisson() if family == "poisson" else sm.families.Binomial()
    ref = smf.glm(f"{response} ~ x", frame, family=glm_family, offset=np.log(frame["t"])).fit(tol=1e-12)
    # one concave likelihood, both sides stop on tolerances near 1e-8 (L-BFGS's gradient test leaves ~1e-7)
    np.testing.assert_allclose(fit.theta, ref.params, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(fit.bse(), ref.bse, rtol=1e-5)
    assert float(fit.loglik) == pytest.approx(ref.llf, rel=1e-10)
    assert fit.param_names == ["expert[0]:const", "expert[0]:x"]  # the offset has no coefficient
    new = frame.iloc[:7]
    np.testing.assert_allclose(fit.predict(new), ref.predict(new, offset=np.log(new["t"])), rtol=1e-6)


def test_k1_gaussian_is_least_squares_on_the_response_net_of_the_offset(frame):
    fit = ms.fit_mle(formula="yn ~ x", data=frame, k=1, offset="np.log(t)", restarts=2, seed=0)
    ols = smf.ols("I(yn - np.log(t)) ~ x", frame).fit()
    np.testing.assert_allclose(np.asarray(fit.theta)[:2], ols.params, rtol=1e-10)


def test_formula_offset_equals_an_offset_column_of_arrays(frame):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = ms.fit_mle(formula="c ~ x", data=frame, k=2, family="poisson", offset="np.log(t)", gate_formula="~ z",
                       restarts=4, seed=0)
        X = np.c_[frame["x"], frame["z"], np.log(frame["t"])]
        a = ms.fit_mle(ms.MoE(k=2, d=3), X, frame["c"].to_numpy(), family="poisson", gate_columns=[1],
                       expert_columns=[0], offset_column=2, restarts=4, seed=0)
    assert f.layout.feature_names[-1] == "offset(np.log(t))" and f.layout.offset_column == 2
    np.testing.assert_allclose(f.theta, a.theta, rtol=1e-12)
    assert float(f.loglik) == float(a.loglik)
    # the mixture mean written out: sum_i pi_i(z) t exp(b_i + a_i x), read from a new frame by column name
    p = f.params
    new = frame.iloc[:9][["t", "z", "x"]]
    logits = p.gate_bias + np.c_[new["x"], new["z"], np.log(new["t"])] @ p.gate_weight.T
    pi = np.exp(logits - logits.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    rates = new["t"].to_numpy()[:, None] * np.exp(p.expert_bias + new["x"].to_numpy()[:, None] * p.expert_weight[:, 0])
    np.testing.assert_allclose(f.predict(new), (pi * rates).sum(1), rtol=1e-10)
    assert np.all(p.expert_weight[:, 2] == 1.0) and np.all(p.gate_weight[:, 2] == 0.0)
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['t'\]"):
        f.predict(new.drop(columns="t"))
    assert "offset: offset(np.log(t)) is added to every expert's linear predictor" in f.summary().as_text()


def test_em_and_lbfgs_agree_with_shared_slopes_and_an_offset(frame):
    """The offset enters the joint (shared-slope) Newton M-step of EM and the closed-form gradient of L-BFGS."""
    kw = dict(formula="c ~ x", data=frame, k=2, family="poisson", offset="np.log(t)", shared="~ z", restarts=4,
              seed=2, tol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        em = ms.fit_mle(**kw, switch_after=None, max_iter=5000)
        lb = ms.fit_mle(**kw, method="gradient", init=em.params)
    assert float(em.loglik) == pytest.approx(float(lb.loglik), abs=1e-6)
    np.testing.assert_allclose(em.theta, lb.theta, atol=1e-4)


def test_missing_offset_rows_follow_the_missing_policy(frame):
    df = frame.copy()
    df.loc[[3, 8], "t"] = np.nan
    with pytest.raises(ValueError, match="'t' \\(2 missing\\)"):
        ms.fit_mle(formula="c ~ x", data=df, k=1, family="poisson", offset="np.log(t)")
    fit = ms.fit_mle(formula="c ~ x", data=df, k=1, family="poisson", offset="np.log(t)", missing="drop",
                     restarts=1, seed=0)
    assert fit.nobs == len(df) - 2 and np.isnan(fit.predict(df.iloc[:10])[[3, 8]]).all()


def test_inference_keeps_the_offset(frame):
    kw = dict(formula="c ~ x", data=frame, family="poisson", offset="np.log(t)", gate_formula="~ z")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_mle(**kw, k=2, restarts=4, seed=0)
        boot = ms.bootstrap(fit, n_resamples=10, seed=1, progress=False)
        sel = ms.select_k(**kw, ks=(1, 2), restarts=2, seed=0, progress=False)
        lrt = ms.test_n_experts(**kw, k0=1, k1=2, n_resamples=4, seed=0, progress=False)
    ok = ~boot.failed
    assert ok.sum() >= 8 and np.isfinite(boot.draws[ok]).all() and boot.names == fit.param_names
    assert sel.best_k == 2 and float(sel.table.loc[sel.table["k"] == 2, "loglik"].iloc[0]) == pytest.approx(
        float(fit.loglik), abs=1e-6)
    assert lrt.fit1.layout.offset_column == 2 and lrt.statistic > 100


def test_bad_offsets_are_named(frame):
    X = np.c_[frame["x"], np.log(frame["t"])]
    with pytest.raises(TypeError, match="offset_column=<its index>"):
        ms.fit_mle(ms.MoE(k=1, d=2), X, frame["c"].to_numpy(), family="poisson", offset="t")
    with pytest.raises(TypeError, match="offset_column= is for arrays"):
        ms.fit_mle(formula="c ~ x", data=frame, k=1, family="poisson", offset_column=1)
    with pytest.raises(ValueError, match="one numeric column"):
        ms.fit_mle(formula="c ~ x", data=frame.assign(g=list("ab") * 300), k=1, family="poisson", offset="g")
    with pytest.raises(ValueError, match="uses the column 'exposure'"):
        ms.fit_mle(formula="c ~ x", data=frame, k=1, family="poisson", offset="np.log(exposure)")
    with pytest.raises(ValueError, match="also in gate_columns"):
        ms.fit_mle(ms.MoE(k=2, d=2), X, frame["c"].to_numpy(), family="poisson", offset_column=1, gate_columns=[0, 1])
    with pytest.raises(ValueError, match="offset_column must be a column index"):
        ms.fit_mle(ms.MoE(k=1, d=2), X, frame["c"].to_numpy(), family="poisson", offset_column=2)
    with pytest.raises(ValueError, match="distances and norms read every input column"):
        ms.fit_mle(ms.MoE(k=2, d=3, gate="laplace"), np.c_[X, frame["z"]], frame["yn"].to_numpy(), offset_column=1,
                   method="gradient")


def test_moe_regressor_takes_an_offset_column(frame):
    X = np.c_[frame["x"], frame["z"], np.log(frame["t"])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = ms.MoERegressor(n_experts=2, family="poisson", gate_columns=[1], expert_columns=[0], offset_column=2,
                              random_state=0).fit(X, frame["c"].to_numpy())
    assert est.get_params()["offset_column"] == 2 and est.fit_.layout.offset_column == 2
    np.testing.assert_allclose(est.params_.expert_weight[:, 2], 1.0)
    assert est.predict(X[:5]).shape == (5,)


def test_plot_holds_the_offset_like_a_covariate(frame):
    df = frame.assign(log_t=np.log(frame["t"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_mle(formula="c ~ x", data=df, k=2, family="poisson", offset="log_t", gate_formula="~ z",
                         restarts=4, seed=0)
    fig = fit.plot("x", at={"log_t": 0.0})  # rates per unit of exposure; a plain-column offset needs no data=
    assert "log_t = 0" in " ".join(t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text")))
    with pytest.raises(ValueError, match=r"raw column\(s\) \['t'\]"):
        ms.fit_mle(formula="c ~ x", data=frame, k=1, family="poisson", offset="np.log(t)", restarts=1,
                   seed=0).plot("x")


def test_an_offset_may_repeat_a_covariate_or_be_constant(frame):
    """The offset is not estimated, so the design's rank check leaves it out: log(t) as a covariate and as the offset
    is the covariate's slope shifted by 1, and a constant offset shifts the intercepts."""
    a = ms.fit_mle(formula="c ~ x + np.log(t)", data=frame, k=1, family="poisson", offset="np.log(t)", restarts=1,
                   seed=0)
    b = ms.fit_mle(formula="c ~ x + np.log(t)", data=frame, k=1, family="poisson", restarts=1, seed=0)
    assert float(a.loglik) == pytest.approx(float(b.loglik), rel=1e-10)
    np.testing.assert_allclose(np.asarray(a.theta) + np.array([0.0, 0.0, 1.0]), b.theta, rtol=1e-6, atol=1e-7)
    c = ms.fit_mle(formula="c ~ x", data=frame.assign(two=2.0), k=1, family="poisson", offset="two", restarts=1,
                   seed=0)
    d = ms.fit_mle(formula="c ~ x", data=frame, k=1, family="poisson", restarts=1, seed=0)
    np.testing.assert_allclose(np.asarray(c.theta) + np.array([2.0, 0.0]), d.theta, rtol=1e-6, atol=1e-7)
