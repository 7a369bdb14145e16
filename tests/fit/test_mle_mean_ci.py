"""Standard errors and confidence intervals of the fitted mean E[y | x] (predict kinds "mean_se" and "mean_ci"):
statsmodels' get_prediction at k = 1 for each family, finite differences of the mean at k = 2, and coverage."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf
import torch

import moestat as ms

SPEC = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
TRUTH = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.3])
X0 = np.array([[-0.5], [0.0], [0.5]])


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(5)
    x = rng.normal(size=500)
    m = rng.integers(1, 8, size=500)
    return pd.DataFrame({"x": x, "yn": 1 + 2 * x + 0.7 * rng.normal(size=500),
                         "yp": rng.poisson(np.exp(0.3 + 0.5 * x)), "yb": rng.binomial(1, 1 / (1 + np.exp(-x))),
                         "m": m})


@pytest.mark.parametrize("family, response", [("poisson", "yp"), ("binomial", "yb")])
def test_k1_equals_statsmodels_get_prediction(frame, family, response):
    fit = ms.fit_mle(formula=f"{response} ~ x", data=frame, k=1, family=family, restarts=1, seed=0)
    glm_family = sm.families.Poisson() if family == "poisson" else sm.families.Binomial()
    ref = smf.glm(f"{response} ~ x", frame, family=glm_family).fit().get_prediction(frame.head(8))
    table = ref.summary_frame(alpha=0.10)
    # both sides maximise the same likelihood to about 1e-8 in the coefficients; the SEs agree to that order
    np.testing.assert_allclose(fit.predict(frame.head(8)), table["mean"], rtol=1e-6)
    np.testing.assert_allclose(fit.predict(frame.head(8), "mean_se"), table["mean_se"], rtol=1e-5)
    ci = fit.predict(frame.head(8), "mean_ci", confidence_level=0.90)
    np.testing.assert_allclose(ci, table[["mean_ci_lower", "mean_ci_upper"]], rtol=1e-5)


def test_k1_gaussian_is_ols_with_the_ml_variance(frame):
    """At k = 1 the observed information of the coefficients is X'X / sigma_ML^2 (the log sigma block is
    orthogonal), so the SE of the mean is OLS's times sqrt((n - p) / n)."""
    fit = ms.fit_mle(formula="yn ~ x", data=frame, k=1, restarts=1, seed=0)
    table = smf.ols("yn ~ x", frame).fit().get_prediction(frame.head(8)).summary_frame()
    np.testing.assert_allclose(fit.predict(frame.head(8), "mean_se"), table["mean_se"] * np.sqrt(498 / 500),
                               rtol=1e-6)


def test_mean_se_is_the_delta_method_with_a_finite_difference_gradient():
    data = ms.simulate(SPEC, TRUTH, n=600, seed=4, model="mixture")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_mle(SPEC, data.X[0], data.y[0], restarts=3, seed=1)
    theta = torch.as_tensor(np.asarray(fit.theta, dtype=float))[None]
    Xt = torch.as_tensor(X0)[None]

    def mean(t: torch.Tensor) -> np.ndarray:
        b = fit.layout.unpack(t)
        return (fit._weights_t(b, Xt) * fit._means_t(b, Xt)).sum(-1)[0].numpy()

    h = 1e-6
    G = np.stack([(mean(theta + h * e) - mean(theta - h * e)) / (2 * h)
                  for e in torch.eye(theta.shape[-1], dtype=theta.dtype)], axis=-1)
    for kind in ("oim", "sandwich"):
        V = np.asarray(fit.cov_params(kind))
        # central differences at h = 1e-6 carry relative errors near 1e-9; 1e-6 leaves room for V's conditioning
        np.testing.assert_allclose(fit.predict(X0, "mean_se", cov=kind), np.sqrt(np.einsum("mp,pq,mq->m", G, V, G)),
                                   rtol=1e-6)
    np.testing.assert_allclose(mean(theta), fit.predict(X0), rtol=1e-12)


def _coverage(reps: int, seed: int) -> np.ndarray:
    data = ms.simulate(SPEC, TRUTH, n=400, reps=reps, seed=seed, model="mixture")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_mle(SPEC, data.X, data.y, init=TRUTH, restarts=0, seed=1)
    ci = fit.predict(X0, "mean_ci")
    true = np.asarray(SPEC.mean(TRUTH, X0))
    return ((ci[..., 0] <= true) & (true <= ci[..., 1])).mean(0)


def test_mean_ci_covers_the_true_regression_function():
    """400 replicates (binomial SE of a 95% coverage 1.1%; about 3 s): coverage within 0.95 -+ 0.035 at three inputs
    (measured 0.925-0.975 on another 200)."""
    cover = _coverage(400, 12)
    assert (np.abs(cover - 0.95) <= 0.035).all(), cover


def test_mean_uncertainty_arguments(frame):
    fit = ms.fit_mle(formula="yp ~ x", data=frame, k=1, family="poisson", restarts=1, seed=0)
    with pytest.raises(ValueError, match="cov"):
        fit.predict(frame, "mean_se", cov="robust")
    with pytest.raises(ValueError, match="confidence_level"):
        fit.predict(frame, "mean_ci", confidence_level=95)
    with pytest.raises(TypeError, match="q= is for kind='quantile'"):
        fit.predict(frame, "mean_ci", q=0.5)
    assert fit.predict(None, "mean_ci").shape == (500, 2)
