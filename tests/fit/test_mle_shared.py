"""Coefficients shared across experts in fit_mle (flexmix's FLXMRglmfix(fixed = ~ z)): layout, EM, gradient, SEs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import torch

import moestat as ms
from moestat.families import get_family
from moestat.fit._layout import ParamLayout
from moestat.fit.em import design, shared_newton_step
from moestat.fit.mle import log_components


def _two_expert_frame(n: int = 800, gamma: float = 1.5, seed: int = 0) -> pd.DataFrame:
    """Two linear experts in x (gate on x) plus a slope ``gamma`` on z common to both."""
    rng = np.random.default_rng(seed)
    x, z = rng.uniform(-1, 1, n), rng.normal(size=n)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-3 * x))
    y = np.where(first, 1 + 2 * x, -1 - x) + gamma * z + 0.3 * rng.normal(size=n)
    return pd.DataFrame({"y": y, "x": x, "z": z})


def _poisson_frame(n: int = 800, gamma: float = 0.4, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x, z = rng.uniform(-1, 1, n), rng.normal(size=n)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-3 * x))
    eta = np.where(first, 1.5 + 0.5 * x, 0.2 - 0.8 * x) + gamma * z
    return pd.DataFrame({"y": rng.poisson(np.exp(eta)).astype(float), "x": x, "z": z})


# ------------------------------------------------------------------------------------------------ layout
def test_layout_names_and_round_trip():
    spec = ms.MoE(k=3, d=3)
    lay = ParamLayout(spec, ["x", "z", "w"], shared_columns=[1])
    assert lay.expert_columns == (0, 2) and lay.shared_columns == (1,)
    assert [n for n in lay.names if n.startswith("shared")] == ["shared:z"]
    # 2 gate rows x 4 + 3 experts x 3 + 1 shared + 3 log sigmas
    assert lay.size == 2 * 4 + 3 * 3 + 1 + 3 == len(lay.names)
    theta = torch.randn(lay.size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    blocks = lay.unpack(theta)
    assert torch.equal(blocks.expert_weight[:, 1], theta[17].expand(3))  # gamma written into every expert
    assert torch.allclose(lay.pack(blocks), theta)


def test_layout_rejects_a_column_both_shared_and_expert_specific():
    with pytest.raises(ValueError, match=r"columns \[1\] are in both expert_columns and shared_columns"):
        ParamLayout(ms.MoE(k=2, d=2), shared_columns=[1], expert_columns=[0, 1])
    with pytest.raises(ValueError, match="needs experts with slopes"):
        ParamLayout(ms.MoE(k=2, d=2, expert="constant"), shared_columns=[1])


# ------------------------------------------------------------------------------------------------ M-step
def test_gaussian_joint_m_step_is_the_stacked_weighted_least_squares_solution():
    rng = np.random.default_rng(0)
    n, k, p, q = 60, 3, 2, 2
    Ze = np.vstack([np.ones(n), rng.normal(size=n)])
    Zs = rng.normal(size=(q, n))
    y = rng.normal(size=n)
    tau = rng.dirichlet(np.ones(k), size=n).T  # (k, n)
    var = np.array([0.5, 1.0, 2.0])
    t = lambda a: torch.as_tensor(a, dtype=torch.float64)[None]  # noqa: E731
    beta, gamma = shared_newton_step(t(Ze), t(Zs), t(y), t(tau), t(rng.normal(size=(k, p))), t(rng.normal(size=q)),
                                     0.0, var=t(var))
    # independent: the response stacked k times on the block design [e_j (x) z_t, s_t], weights tau / sigma_j^2
    rows = [np.concatenate([np.kron(np.eye(k)[j], Ze[:, i]), Zs[:, i]]) for j in range(k) for i in range(n)]
    w = np.concatenate([tau[j] / var[j] for j in range(k)])
    A = np.asarray(rows) * np.sqrt(w)[:, None]
    coef = np.linalg.lstsq(A, np.tile(y, k) * np.sqrt(w), rcond=None)[0]
    np.testing.assert_allclose(beta[0].numpy().ravel(), coef[: k * p], atol=1e-10)
    np.testing.assert_allclose(gamma[0].numpy(), coef[k * p:], atol=1e-10)


def test_poisson_joint_m_step_converges_to_the_stacked_weighted_glm():
    rng = np.random.default_rng(1)
    n, k = 80, 2
    x, s = rng.uniform(-1, 1, n), rng.normal(size=n)
    y = rng.poisson(np.exp(0.5 + 0.3 * x + 0.4 * s)).astype(float)
    Ze, Zs = np.vstack([np.ones(n), x]), s[None]
    tau = rng.dirichlet(np.ones(k), size=n).T
    t = lambda a: torch.as_tensor(a, dtype=torch.float64)[None]  # noqa: E731
    beta, gamma = t(np.zeros((k, 2))), t(np.zeros(1))
    for _ in range(30):  # Newton steps: quadratic convergence from zero in a handful
        beta, gamma = shared_newton_step(t(Ze), t(Zs), t(y), t(tau), beta, gamma, 0.0, glm=get_family("poisson"))
    rows = [np.concatenate([np.kron(np.eye(k)[j], Ze[:, i]), Zs[:, i]]) for j in range(k) for i in range(n)]
    ref = sm.GLM(np.tile(y, k), np.asarray(rows), family=sm.families.Poisson(), var_weights=tau.ravel()).fit(
        tol=1e-13)
    np.testing.assert_allclose(np.r_[beta[0].numpy().ravel(), gamma[0].numpy()], ref.params, atol=1e-8)


# ------------------------------------------------------------------------------------------------ k = 1
def test_k1_gaussian_equals_ols_on_x_and_z():
    df = _two_expert_frame(n=300)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=1, shared="~ z", seed=0)
    ols = sm.OLS(df["y"], sm.add_constant(df[["x", "z"]])).fit()
    est = dict(zip(fit.param_names, fit.theta, strict=True))
    np.testing.assert_allclose([est["expert[0]:const"], est["expert[0]:x"], est["shared:z"]], ols.params,
                               rtol=1e-6, atol=1e-7)
    # observed information of the Gaussian MLE: sigma_ML^2 (X'X)^-1 = OLS covariance x (n - p) / n
    n, p = len(df), 3
    se = dict(zip(fit.param_names, fit.bse(), strict=True))
    np.testing.assert_allclose([se["expert[0]:const"], se["expert[0]:x"], se["shared:z"]],
                               ols.bse * np.sqrt((n - p) / n), rtol=1e-5)
    # sandwich and OPG include gamma too: HC0 is the sandwich of the coefficient block
    sand = dict(zip(fit.param_names, fit.bse("sandwich"), strict=True))
    hc0 = sm.OLS(df["y"], sm.add_constant(df[["x", "z"]])).fit(cov_type="HC0").bse
    np.testing.assert_allclose(sand["shared:z"], hc0["z"], rtol=1e-4)  # HC0 = sandwich at the MLE
    assert np.isfinite(fit.bse("opg")).all()


def test_k1_poisson_equals_glm_on_x_and_z():
    df = _poisson_frame(n=400)
    for method in ("em", "gradient"):
        fit = ms.fit_mle(formula="y ~ x", data=df, k=1, shared="~ z", family="poisson", method=method, seed=0)
        ref = sm.GLM(df["y"], sm.add_constant(df[["x", "z"]]), family=sm.families.Poisson()).fit(tol=1e-12)
        est = dict(zip(fit.param_names, fit.theta, strict=True))
        se = dict(zip(fit.param_names, fit.bse(), strict=True))
        names = ["expert[0]:const", "expert[0]:x", "shared:z"]
        # gradient path: gtol 1e-7 on the per-observation scale moves estimates by ~1e-6
        np.testing.assert_allclose([est[t] for t in names], ref.params, atol=1e-5)
        np.testing.assert_allclose([se[t] for t in names], ref.bse, rtol=1e-4)
        assert fit.loglik == pytest.approx(ref.llf, abs=1e-6)


# ------------------------------------------------------------------------------------------------ k = 2
@pytest.mark.parametrize("family, frame", [("gaussian", _two_expert_frame), ("poisson", _poisson_frame)])
def test_em_and_gradient_reach_the_same_loglik(family, frame):
    df = frame()
    em = ms.fit_mle(formula="y ~ x", data=df, k=2, shared="~ z", family=family, seed=1)
    gr = ms.fit_mle(formula="y ~ x", data=df, k=2, shared="~ z", family=family, method="gradient", seed=1)
    # both stop at relative changes of ~1e-8 of |loglik| (a few hundred): 1e-4 absolute is well above that
    assert em.loglik == pytest.approx(gr.loglik, abs=1e-4)
    g_em = dict(zip(em.param_names, em.theta, strict=True))["shared:z"]
    g_gr = dict(zip(gr.param_names, gr.theta, strict=True))["shared:z"]
    assert g_em == pytest.approx(g_gr, abs=1e-3)


def test_loglik_matches_the_model_and_the_gradient_in_gamma_matches_finite_differences():
    df = _two_expert_frame(n=300)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, shared="~ z", seed=1)
    j = fit.param_names.index("shared:z")
    spec = fit.spec
    X, y = df[["x", "z"]].to_numpy(), df["y"].to_numpy()

    def model_loglik(theta: np.ndarray) -> float:  # independent: MoE.loglik with gamma in both experts' rows
        b = fit.layout.unpack(torch.tensor(theta))
        return float(spec.loglik(b.to_params().numpy(), X, y))

    assert model_loglik(np.asarray(fit.theta)) == pytest.approx(fit.loglik, abs=1e-8)
    theta = np.asarray(fit.theta) + 0.05  # off the optimum, where the gradient is not zero
    # the gradient path's objective: log_components of the unpacked layout (mle.gradient_fit), by autograd
    t = torch.tensor(theta[None], device=fit._X.device, requires_grad=True)  # the fit's device (CUDA under "auto")
    Zt = design(fit._X, True).transpose(1, 2)
    torch.logsumexp(log_components(spec, fit.layout.unpack(t), Zt, fit._y), dim=1).sum().backward()
    h = 1e-5
    fd = (model_loglik(theta + h * np.eye(len(theta))[j]) - model_loglik(theta - h * np.eye(len(theta))[j])) / (2 * h)
    assert t.grad[0, j].item() == pytest.approx(fd, rel=1e-6)  # central differences: O(h^2) ~ 1e-10 relative error
    assert abs(t.grad[0, j].item()) > 1.0  # the check is not vacuous


def test_a_shared_slope_is_recovered():
    df = _two_expert_frame(n=2000, gamma=1.5, seed=7)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, shared="~ z", seed=0)
    est, se = dict(zip(fit.param_names, fit.theta, strict=True)), dict(zip(fit.param_names, fit.bse(), strict=True))
    # within 4 standard errors (a 4-sigma miss has probability 6e-5 if the SEs are right) ...
    assert abs(est["shared:z"] - 1.5) < 4 * se["shared:z"]
    # ... and the SE is that of a regression on n = 2000 points with noise sd 0.3 and sd(z) = 1: about 0.3 / sqrt(n)
    assert se["shared:z"] == pytest.approx(0.3 / np.sqrt(2000), rel=0.25)
    slopes = sorted([est["expert[0]:x"], est["expert[1]:x"]])
    np.testing.assert_allclose(slopes, [-1.0, 2.0], atol=0.15)  # per-expert slopes, SE ~0.03: 5 SE


# ------------------------------------------------------------------------------------------------ output
def test_tidy_summary_predict_posterior_simulate():
    df = _two_expert_frame(n=400)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, shared="~ z", seed=1)
    tidy = fit.tidy()
    shared = tidy[tidy["block"] == "shared"]
    assert list(shared["term"]) == ["shared:z"] and (shared["atom"] == -1).all()
    text = fit.summary().as_text()
    assert "Shared: coefficients common to every expert" in text and text.count("shared:z") == 1
    # predictions by hand: the gate on x, each expert b_j + a_j x + gamma z
    est = dict(zip(fit.param_names, fit.theta, strict=True))
    new = df.head(7)
    g = est["gate[0]:const"] + est["gate[0]:x"] * new["x"].to_numpy()
    pi0 = 1 / (1 + np.exp(-g))
    mu = [est[f"expert[{j}]:const"] + est[f"expert[{j}]:x"] * new["x"].to_numpy() + est["shared:z"] * new["z"]
          for j in range(2)]
    np.testing.assert_allclose(fit.predict(new), pi0 * mu[0] + (1 - pi0) * mu[1], rtol=1e-10)
    post = fit.posterior_frame(new)
    np.testing.assert_allclose(post[["posterior_0", "posterior_1"]].sum(axis=1), 1.0)
    draws = fit.simulate(new, n_draws=4000, seed=0)
    # the simulated mean is within 5 Monte Carlo SEs (mixture sd <= ~3) of the predicted mean
    assert np.all(np.abs(draws.mean(0) - fit.predict(new)) < 5 * 3 / np.sqrt(4000))


def test_array_interface_equals_the_formula_fit():
    df = _two_expert_frame(n=300)
    f1 = ms.fit_mle(formula="y ~ x", data=df, k=2, shared="~ z", seed=3)
    f2 = ms.fit_mle(ms.MoE(k=2, d=2), df[["x", "z"]].to_numpy(), df["y"].to_numpy(), gate_columns=[0],
                    shared_columns=[1], seed=3, feature_names=["x", "z"])
    assert f2.param_names == f1.param_names
    np.testing.assert_allclose(f2.theta, f1.theta, atol=1e-10)


def test_shared_argument_errors():
    df = _two_expert_frame(n=50)
    with pytest.raises(ValueError, match="both contain"):
        ms.fit_mle(formula="y ~ x + z", data=df, k=2, shared="~ z")
    with pytest.raises(TypeError, match="shared= needs formula="):
        ms.fit_mle(ms.MoE(k=2, d=2), df[["x", "z"]].to_numpy(), df["y"].to_numpy(), shared="~ z")
    with pytest.raises(TypeError, match="shared_columns are for arrays"):
        ms.fit_mle(formula="y ~ x", data=df, k=2, shared_columns=[1])
