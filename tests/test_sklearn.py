"""MoERegressor with fit_mle's options: GLM families, separate gate/expert columns, sample weights, DataFrame
column names, and the scikit-learn estimator contract."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import moestat as ms

pytest.importorskip("sklearn")
pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n: int = 300, seed: int = 0) -> pd.DataFrame:
    """Experts on income, gate on age (a concomitant variable); a Gaussian and a count response."""
    rng = np.random.default_rng(seed)
    income, age = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-4 * age))
    y = np.where(first, 1 + 2 * income, -1 - income) + 0.25 * rng.normal(size=n)
    visits = rng.poisson(np.where(first, np.exp(0.5 + income), np.exp(2 - income)))
    return pd.DataFrame({"income": income, "age": age, "y": y, "visits": visits})


@pytest.mark.parametrize("options", [{}, {"shared_columns": [0]}], ids=["default", "shared_columns"])
def test_estimator_contract(options):
    from sklearn.utils.estimator_checks import check_estimator

    # sklearn's weights-vs-repeats check fits 15 rows with 30 columns: an MoE there is not identified (and its
    # design is rank deficient), so the weighted and repeated fits cannot be compared; test_sample_weight_* below
    # checks the equivalence on identified data
    expected = {"check_sample_weight_equivalence_on_dense_data":
                "15 rows x 30 columns: the mixture of experts is not identified"}
    results = check_estimator(ms.MoERegressor(restarts=2, **options), on_fail=None, expected_failed_checks=expected)
    failures = [r for r in results if r["status"] == "failed"]
    assert not failures, [(r["check_name"], str(r["exception"])[:200]) for r in failures]


def test_options_are_fit_mles():
    df = _data()
    X = df[["income", "age"]].to_numpy()
    est = ms.MoERegressor(n_experts=2, random_state=0, family="poisson", gate_columns=[1], expert_columns=[0])
    est.fit(X, df["visits"].to_numpy())
    seed = int(np.random.RandomState(0).randint(np.iinfo(np.int32).max))  # the estimator's seed for fit_mle
    ref = ms.fit_mle(ms.MoE(k=2, d=2), X, df["visits"].to_numpy(), family="poisson", gate_columns=[1],
                     expert_columns=[0], seed=seed, restarts=5, tol=1e-8)
    assert est.fit_.spec.response == "poisson" and est.loglik_ == pytest.approx(float(ref.loglik), rel=1e-12)
    p = est.params_
    assert np.all(p.gate_weight[:, 0] == 0) and np.all(p.expert_weight[:, 1] == 0)  # restricted columns
    np.testing.assert_allclose(est.predict(X[:20]), ref.predict(X[:20]), rtol=1e-12)
    # the Poisson mixture's predictions are rates: sum_i pi_i(age) exp(b_i + a_i income), written out by hand
    logits = p.gate_bias + X[:20] @ p.gate_weight.T
    pi = np.exp(logits - logits.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    np.testing.assert_allclose(est.predict(X[:20]), (pi * np.exp(p.expert_bias + X[:20] @ p.expert_weight.T)).sum(1),
                               rtol=1e-10)
    iv = est.predict_interval(X[:20], confidence_level=0.9)
    assert iv.shape == (20, 2) and np.all(iv[:, 0] <= est.predict_quantile(X[:20], 0.5))
    # return_std (scikit-learn's BayesianRidge convention): the SD of the Poisson mixture, written out by hand
    rate = np.exp(p.expert_bias + X[:20] @ p.expert_weight.T)
    mean, std = est.predict(X[:20], return_std=True)
    np.testing.assert_array_equal(mean, est.predict(X[:20]))
    np.testing.assert_allclose(std**2, (pi * (rate + rate**2)).sum(1) - mean**2, rtol=1e-10)
    with pytest.raises(ValueError, match="response"):
        ms.MoERegressor(family="gamma").fit(X, df["y"].to_numpy())


def test_sample_weight_equals_repeated_rows():
    df = _data(200, seed=1)
    X, y = df[["income"]].to_numpy(), df["y"].to_numpy()
    counts = np.random.default_rng(2).integers(0, 4, len(y))
    weighted = ms.MoERegressor(n_experts=2, random_state=0).fit(X, y, sample_weight=counts)
    repeated = ms.MoERegressor(n_experts=2, random_state=0).fit(np.repeat(X, counts, 0), np.repeat(y, counts))
    # different random starts (they depend on n) reach the same maximum; EM's relative tolerance 1e-8
    assert weighted.loglik_ == pytest.approx(repeated.loglik_, rel=1e-6)
    assert weighted.fit_.nobs == counts.sum()
    np.testing.assert_allclose(weighted.predict(X), repeated.predict(X), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"[Nn]egative"):
        ms.MoERegressor().fit(X, y, sample_weight=-np.ones(len(y)))


def test_dataframe_columns_name_the_summary():
    df = _data(200, seed=3)
    est = ms.MoERegressor(n_experts=2, random_state=0).fit(df[["income", "age"]], df["y"])
    assert list(est.feature_names_in_) == ["income", "age"]
    assert "expert[0]:income" in est.fit_.param_names and "gate[0]:age" in est.fit_.param_names
    text = str(est.summary())
    assert "expert[1]:income" in text and "Expert 1:" in text
    assert est.summary().header["Dep. Variable"] == "y"  # the name of the Series y
    spend = df["y"].rename("spending")
    named = ms.MoERegressor(n_experts=2, random_state=0).fit(df[["income", "age"]], spend)
    assert named.summary().header["Dep. Variable"] == "spending"
    assert named.loglik_ == est.loglik_  # the name changes nothing else
    direct = ms.fit_mle(ms.MoE(k=2, d=2), df[["income", "age"]], spend, seed=0, restarts=2)
    assert direct.summary().header["Dep. Variable"] == "spending"
    plain = ms.MoERegressor(n_experts=2, random_state=0).fit(df[["income", "age"]].to_numpy(), spend.to_numpy())
    assert plain.summary().header["Dep. Variable"] == "y"


def test_shared_columns_are_fit_mles_shared_coefficients():
    rng = np.random.default_rng(4)
    n = 300
    df = _data(n, seed=4).assign(z=rng.normal(size=n))
    y = df["y"].to_numpy() + 1.5 * df["z"].to_numpy()  # one slope on z common to both experts
    X = df[["income", "z"]]
    est = ms.MoERegressor(n_experts=2, random_state=0, shared_columns=[1]).fit(X, y)
    names = est.fit_.param_names
    assert names.count("shared:z") == 1 and "expert[0]:z" not in names and "gate[0]:z" in names
    seed = int(np.random.RandomState(0).randint(np.iinfo(np.int32).max))  # the estimator's seed for fit_mle
    ref = ms.fit_mle(ms.MoE(k=2, d=2), X.to_numpy(), y, shared_columns=[1], seed=seed, restarts=5, tol=1e-8)
    assert est.loglik_ == pytest.approx(float(ref.loglik), rel=1e-12)  # the same fit: options passed through
    p = est.params_
    assert p.expert_weight[0, 1] == p.expert_weight[1, 1]  # the constraint holds in the fitted blocks
    # one expert with a shared column is the linear regression y ~ income + z: its slopes are least squares
    one = ms.MoERegressor(n_experts=1, random_state=0, shared_columns=[1]).fit(X, y)
    Z = np.c_[np.ones(n), X.to_numpy()]
    # one EM step solves the normal equations exactly; 1e-9 relative leaves room for rounding only
    np.testing.assert_allclose(one.fit_.theta[:3], np.linalg.lstsq(Z, y, rcond=None)[0], rtol=1e-9)
    with pytest.raises(ValueError, match="both expert_columns and shared_columns"):
        ms.MoERegressor(expert_columns=[0, 1], shared_columns=[1]).fit(X, y)


def _binomial_trials(n: int = 300, seed: int = 11) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two logistic experts (gate on x), m_t in 5..30 trials; y is the proportion of successes."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, n)
    m = rng.integers(5, 31, n).astype(float)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-(0.3 + 2.0 * x)))
    eta = np.where(first, 1.0 + 1.5 * x, -1.0 - 1.0 * x)
    return x[:, None], rng.binomial(m.astype(int), 1 / (1 + np.exp(-eta))) / m, m


def test_trials_is_a_per_row_fit_parameter():
    from scipy import stats
    from sklearn.model_selection import cross_validate
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    X, y, m = _binomial_trials()
    est = ms.MoERegressor(n_experts=2, family="binomial", random_state=0).fit(X, y, trials=m)
    # loglik() with trials sums scipy's binomial pmf over the mixture (another implementation than the fit's)
    assert est.loglik(X, y, trials=m) == pytest.approx(est.loglik_, rel=1e-10)
    # k = 1 is the binomial GLM with m_t trials: statsmodels' GLM(var_weights=m) reaches the same unique MLE (strictly
    # concave log-likelihood); both stop on tolerances ~1e-8, hence 1e-6
    sm = pytest.importorskip("statsmodels.api")
    one = ms.MoERegressor(n_experts=1, family="binomial", random_state=0).fit(X, y, trials=m)
    glm = sm.GLM(y, sm.add_constant(X), family=sm.families.Binomial(), var_weights=m).fit(tol=1e-12)
    np.testing.assert_allclose(one.fit_.theta, glm.params, rtol=1e-6)
    # the log-likelihood with trials is the full binomial log-pmf, sum_t log Bin(m_t y_t; m_t, mu_t), here with
    # scipy at statsmodels' estimate (the estimates agree to ~1e-8, the log-likelihood is flat there: 1e-8)
    mu = 1 / (1 + np.exp(-(glm.params[0] + glm.params[1] * X[:, 0])))
    assert one.loglik_ == pytest.approx(stats.binom.logpmf(np.rint(y * m), m, mu).sum(), rel=1e-8)
    # scikit-learn routes per-row fit parameters: through a Pipeline and sliced per fold by cross_validate
    pipe = make_pipeline(FunctionTransformer(), ms.MoERegressor(n_experts=2, family="binomial", random_state=0))
    assert pipe.fit(X, y, moeregressor__trials=m)[-1].loglik_ == est.loglik_
    cv = cross_validate(ms.MoERegressor(n_experts=2, family="binomial", restarts=2, random_state=0), X, y, cv=3,
                        params={"trials": m})  # a fold given all n trials would raise (shape mismatch)
    assert np.isfinite(cv["test_score"]).all()
    _, std = est.predict(X[:5], return_std=True, trials=m[:5])
    assert std.shape == (5,) and np.isfinite(std).all()
    with pytest.raises(TypeError, match="needs trials="):
        est.predict(X[:5], return_std=True)
    iv = est.predict_interval(X[:5], trials=m[:5])
    assert iv.shape == (5, 2) and np.allclose((iv * m[:5, None]) % 1, 0)  # proportions of m_t trials
    assert est.posterior(X[:5], y[:5], trials=m[:5]).shape == (5, 2)
    with pytest.raises(TypeError, match="needs trials="):
        est.predict_interval(X[:5])
    with pytest.raises(TypeError, match="needs trials="):
        est.loglik(X, y)
    with pytest.raises(ValueError, match="trials has shape"):
        ms.MoERegressor(family="binomial").fit(X, y, trials=m[:10])
    with pytest.raises(ValueError, match="trials= is for binomial experts"):
        ms.MoERegressor().fit(X, y, trials=m)
    with pytest.raises(ValueError, match="trials must be positive integers"):
        ms.MoERegressor(family="binomial").fit(X, y, trials=m + 0.5)
