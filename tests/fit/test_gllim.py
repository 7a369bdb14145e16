"""The joint GLLiM (Gaussian-gated MoE) model: parameters, sampler, log-likelihood and the three optimisers, each
checked against an independent computation (scipy densities, scikit-learn's Gaussian-mixture EM, closed forms,
finite differences)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from moestat.fit import gllim as G
from moestat.fit.gllim import GLLiMParams, fit_gllim, gllim_loglik, simulate_gllim


def _truth_2d() -> GLLiMParams:
    """K = 2, d = 2, l = 2: full covariances and slopes (every block of the general code path)."""
    return GLLiMParams(pi=[0.4, 0.6], c=[[0.0, 1.0], [2.0, -1.0]],
                       Gamma=[[[1.0, 0.3], [0.3, 0.5]], [[0.6, -0.2], [-0.2, 0.8]]],
                       A=[[[1.0, -0.5], [0.2, 0.3]], [[-1.0, 0.0], [0.5, 1.5]]], b=[[0.5, -0.2], [1.0, 0.3]],
                       nu=[[[0.3, 0.1], [0.1, 0.2]], [[0.25, 0.0], [0.0, 0.4]]])


def _truth_1d() -> GLLiMParams:
    """K = 2, d = l = 1, well separated."""
    return GLLiMParams(pi=[0.45, 0.55], c=[[-1.0], [1.5]], Gamma=[[[0.3]], [[0.5]]], A=[[[2.0]], [[-1.0]]],
                       b=[[0.5], [1.0]], nu=[[[0.1]], [[0.2]]])


def _joint(p: GLLiMParams) -> tuple[np.ndarray, np.ndarray]:
    """The same mixture as a Gaussian mixture on z = (x, y): means (c, A c + b), covariances
    [[Gamma, Gamma A^T], [A Gamma, nu + A Gamma A^T]]."""
    means = np.concatenate([p.c, np.einsum("kld,kd->kl", p.A, p.c) + p.b], axis=1)
    ga = p.Gamma @ np.swapaxes(p.A, -1, -2)
    covs = np.block([[p.Gamma, ga], [np.swapaxes(ga, -1, -2), p.nu + p.A @ ga]])
    return means, covs


def _from_joint(weights: np.ndarray, means: np.ndarray, covs: np.ndarray, d: int) -> GLLiMParams:
    sxx, syx, syy = covs[:, :d, :d], covs[:, d:, :d], covs[:, d:, d:]
    a = syx @ np.linalg.inv(sxx)
    return GLLiMParams(pi=weights, c=means[:, :d], Gamma=sxx, A=a,
                       b=means[:, d:] - np.einsum("kld,kd->kl", a, means[:, :d]),
                       nu=syy - a @ np.swapaxes(syx, -1, -2))


# ----------------------------------------------------------------------------- parameters
def test_params_validate_shapes_weights_and_covariances():
    t = _truth_2d().as_dict()
    with pytest.raises(ValueError, match=r"GLLiMParams.A must have shape \(2, 2, 2\)"):
        GLLiMParams(**{**t, "A": np.zeros((2, 1, 2))})
    with pytest.raises(ValueError, match="sum to one"):
        GLLiMParams(**{**t, "pi": [0.5, 0.6]})
    with pytest.raises(ValueError, match=r"GLLiMParams\.nu must hold symmetric positive definite"):
        GLLiMParams(**{**t, "nu": -np.asarray(t["nu"])})
    with pytest.raises(ValueError, match="NaN"):
        GLLiMParams(**{**t, "b": [[np.nan, 0], [0, 0]]})
    p = _truth_2d()
    assert (p.k, p.d, p.l, p.batched) == (2, 2, 2, False)
    batch = GLLiMParams.stack([p, p])
    assert batch.batched and batch.reps == 2 and np.array_equal(batch.take(1).A, p.A)
    assert np.array_equal(p.repeat(3).c, np.stack([p.c] * 3))
    with pytest.raises(ValueError, match="unbatched"):
        batch.repeat(2)
    assert GLLiMParams.from_mapping(p.tolist()).k == 2


# ----------------------------------------------------------------------------- likelihood and sampler
def test_loglik_matches_scipy_densities():
    """sum_t log sum_i pi_i N(x; c_i, Gamma_i) N(y; A_i x + b_i, nu_i), with scipy's densities (d = l = 2)."""
    p = _truth_2d()
    X, Y, _ = simulate_gllim(p, 40, 2, seed=1)
    for r in range(2):
        dens = sum(p.pi[i] * multivariate_normal(p.c[i], p.Gamma[i]).pdf(X[r])
                   * np.array([multivariate_normal(p.A[i] @ x + p.b[i], p.nu[i]).pdf(y)
                               for x, y in zip(X[r], Y[r], strict=True)]) for i in range(2))
        assert gllim_loglik(p, X[r], Y[r])[0] == pytest.approx(np.log(dens).sum(), rel=1e-12)


def test_simulation_has_the_model_moments():
    """Mean of x is sum_i pi_i c_i; within component i the least-squares line of y on x is (A_i, b_i)."""
    p = _truth_1d()
    X, Y, Z = simulate_gllim(p, 20000, 1, seed=3)
    x, y, z = X[0, :, 0], Y[0, :, 0], Z[0]
    mean_x = float((p.pi * p.c[:, 0]).sum())
    var_x = float((p.pi * (p.Gamma[:, 0, 0] + p.c[:, 0] ** 2)).sum() - mean_x ** 2)
    assert abs(x.mean() - mean_x) < 4 * np.sqrt(var_x / 20000)  # 4 standard errors of the sample mean
    assert abs((z == 0).mean() - 0.45) < 4 * np.sqrt(0.45 * 0.55 / 20000)  # 4 binomial standard errors
    for i in range(2):
        slope, icpt = np.polyfit(x[z == i], y[z == i], 1)
        # OLS standard error of the slope is sqrt(nu / (n_i var x_i)) ~ 0.005: 0.03 is 6 of them
        assert slope == pytest.approx(p.A[i, 0, 0], abs=0.03) and icpt == pytest.approx(p.b[i, 0], abs=0.05)


def test_simulation_seeds():
    p = _truth_1d()
    a = simulate_gllim(p, 50, 3, seed=7)
    b = simulate_gllim(p, 50, 3, seed=np.random.SeedSequence(7))
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
    # a list of seed sequences gives replicate r the stream seed[r]: child r of the parent
    children = np.random.SeedSequence(7).spawn(3)
    one = simulate_gllim(p, 50, 1, seed=[children[2]])
    assert np.array_equal(one[0][0], a[0][2])
    with pytest.raises(ValueError, match="one per replicate"):
        simulate_gllim(p, 50, 2, seed=children)
    with pytest.raises(TypeError, match="GLLiMParams"):
        simulate_gllim({"pi": [1.0]}, 10)


# ----------------------------------------------------------------------------- EM
def _start(p: GLLiMParams, rng: np.random.Generator, jitter: float = 0.2) -> GLLiMParams:
    return GLLiMParams(pi=p.pi, c=p.c + jitter * rng.standard_normal(p.c.shape), Gamma=p.Gamma * 1.3,
                       A=p.A + jitter * rng.standard_normal(p.A.shape), b=p.b + jitter * rng.standard_normal(p.b.shape),
                       nu=p.nu * 0.8)


@pytest.mark.parametrize("steps", [1, 25])
def test_em_equals_scikit_learn_gaussian_mixture_em(steps):
    """With unconstrained Gamma, A, nu, GLLiM EM is EM for a full-covariance Gaussian mixture on (x, y): the same
    iterates as scikit-learn's GaussianMixture from the same start (reg_covar=0)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    p = _truth_2d()
    X, Y, _ = simulate_gllim(p, 300, 1, seed=11)
    start = _start(p, np.random.default_rng(0))
    mine = fit_gllim(X, Y, start, method="em", max_iter=steps, tol=0.0, var_floor=0.0, reg=0.0).params.take(0)
    means, covs = _joint(start)
    gm = GaussianMixture(2, covariance_type="full", weights_init=start.pi, means_init=means,
                         precisions_init=np.linalg.inv(covs), reg_covar=0.0, max_iter=steps, tol=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm.fit(np.concatenate([X[0], Y[0]], axis=1))
    ref = _from_joint(gm.weights_, gm.means_, gm.covariances_, 2)
    for name in G.BLOCKS:
        np.testing.assert_allclose(getattr(mine, name), getattr(ref, name), rtol=1e-7, atol=1e-9, err_msg=name)


def test_one_component_is_the_closed_form_mle():
    """K = 1: one EM step from any start gives the sample mean and covariance of x and the least-squares line of y
    on x with its mean squared residual (computed here with numpy's lstsq)."""
    p = GLLiMParams(pi=[1.0], c=[[0.5]], Gamma=[[[2.0]]], A=[[[1.5]]], b=[[-1.0]], nu=[[[0.3]]])
    X, Y, _ = simulate_gllim(p, 500, 1, seed=5)
    start = GLLiMParams(pi=[1.0], c=[[3.0]], Gamma=[[[9.0]]], A=[[[0.0]]], b=[[0.0]], nu=[[[5.0]]])
    fit = fit_gllim(X, Y, start, method="em", max_iter=1, tol=0.0, var_floor=0.0, reg=0.0).params.take(0)
    x, y = X[0, :, 0], Y[0, :, 0]
    design = np.column_stack([x, np.ones_like(x)])
    (slope, icpt), *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ np.array([slope, icpt])
    assert fit.c[0, 0] == pytest.approx(x.mean(), rel=1e-12)
    assert fit.Gamma[0, 0, 0] == pytest.approx(x.var(), rel=1e-10)
    assert fit.A[0, 0, 0] == pytest.approx(slope, rel=1e-10) and fit.b[0, 0] == pytest.approx(icpt, rel=1e-10)
    assert fit.nu[0, 0, 0] == pytest.approx((resid ** 2).mean(), rel=1e-9)


@pytest.mark.parametrize("method", ["em", "squarem"])
def test_em_never_lowers_the_likelihood(method):
    p = _truth_1d()
    X, Y, _ = simulate_gllim(p, 400, 3, seed=2)
    start = GLLiMParams.stack([_start(p, np.random.default_rng(r), 0.5) for r in range(3)])
    fit = fit_gllim(X, Y, start, method=method, max_iter=300, tol=1e-12)
    for h in fit.history:
        assert len(h) > 2 and np.diff(h).min() > -1e-9 * abs(h[-1])  # rounding of sums of 400 log-densities
    assert np.allclose(fit.loglik, gllim_loglik(fit.params, X, Y))


def test_lbfgs_gradient_matches_finite_differences():
    p = _truth_2d()
    X, Y, _ = simulate_gllim(p, 60, 1, seed=4)
    coords = G._LogChol(2, 2, 2)
    theta = coords.pack(p.as_dict()) + 0.1 * np.random.default_rng(1).standard_normal(
        sum(coords.sizes))
    feats = G._features(X, Y)[0]
    _, grad = G._objective(theta, coords, X[0], Y[0], feats)
    h = 1e-6
    num = np.array([(G._objective(theta + h * e, coords, X[0], Y[0], feats)[0]
                     - G._objective(theta - h * e, coords, X[0], Y[0], feats)[0]) / (2 * h)
                    for e in np.eye(theta.size)])
    np.testing.assert_allclose(grad, num, atol=1e-7)  # central differences: error O(h^2) + rounding 1e-16 / h


def test_optimisers_reach_the_same_maximum_when_well_specified():
    """K = K*: the likelihood has an isolated maximum near the truth; L-BFGS, SQUAREM and plain EM agree."""
    p = _truth_1d()
    X, Y, _ = simulate_gllim(p, 800, 2, seed=9)
    start = GLLiMParams.stack([_start(p, np.random.default_rng(r)) for r in range(2)])
    fits = {m: fit_gllim(X, Y, start, method=m, max_iter=5000, tol=1e-12 if m != "lbfgs" else 1e-10)
            for m in G.METHODS}
    for m, f in fits.items():
        assert f.converged.all(), m
        np.testing.assert_allclose(f.loglik, fits["lbfgs"].loglik, rtol=1e-8, err_msg=m)
        np.testing.assert_allclose(f.params.c, fits["lbfgs"].params.c, atol=1e-4, err_msg=m)
    assert fits["squarem"].n_iter.max() < fits["em"].n_iter.max()


def test_variance_floor():
    # the constrained M-step: in one dimension max(S, floor); in two, S - D is positive semi-definite and S is
    # unchanged when it already is
    S = np.array([[[[0.5]], [[2.0]]]])
    np.testing.assert_allclose(G._clip_cov(S, np.array([[[1.0]]])), [[[[1.0]], [[2.0]]]])
    M = np.array([[[[1.0, 0.9], [0.9, 1.0]]]])
    D = np.array([[[0.5, 0.5]]])
    out = G._clip_cov(M, D)
    assert np.linalg.eigvalsh(out[0, 0] - np.diag(D[0, 0])).min() > -1e-12
    np.testing.assert_allclose(G._clip_cov(np.array([[[[2.0, 0.1], [0.1, 2.0]]]]), D), [[[[2.0, 0.1], [0.1, 2.0]]]])
    # an over-specified fit at small n: every variance respects its floor, and a fit sitting on it is flagged
    p = _truth_1d()
    X, Y, _ = simulate_gllim(p, 40, 6, seed=8)
    start = GLLiMParams(pi=[0.2, 0.25, 0.25, 0.3], c=[[-1.0], [-0.9], [1.5], [1.6]],
                        Gamma=[[[0.3]], [[0.3]], [[0.5]], [[0.5]]], A=[[[2.0]], [[2.1]], [[-1.0]], [[-1.1]]],
                        b=[[0.5], [0.4], [1.0], [1.1]], nu=[[[0.1]], [[0.1]], [[0.2]], [[0.2]]])
    floor = 0.003
    for method in G.METHODS:
        fit = fit_gllim(X, Y, start, method=method, var_floor=floor, max_iter=3000)
        low = floor * Y.var(1)[:, None, :] * (1 - 1e-9)
        assert (fit.params.nu[..., 0] >= low).all(), method
        hits = (fit.params.nu[..., 0] <= 1.01 * floor * Y.var(1)[:, None, :]).any((-1, -2)) | (
            fit.params.Gamma[..., 0] <= 1.01 * floor * X.var(1)[:, None, :]).any((-1, -2))
        assert np.array_equal(fit.at_floor, hits), method
        assert 0 < fit.at_floor.sum() < 6, method  # this seed gives fits on the floor and fits off it


def test_bad_input():
    p = _truth_1d()
    X, Y, _ = simulate_gllim(p, 30, 1, seed=0)
    with pytest.raises(ValueError, match="same R and n"):
        fit_gllim(X, Y[:, :20], p)
    with pytest.raises(ValueError, match="method='newton' is not supported"):
        fit_gllim(X, Y, p, method="newton")
    with pytest.raises(ValueError, match="tol must be a finite number >= 0"):
        fit_gllim(X, Y, p, tol=-1.0)
    with pytest.raises(TypeError, match="start must be a GLLiMParams"):
        fit_gllim(X, Y, p.as_dict())
    with pytest.raises(ValueError, match="d=1, l=1 but X has 2 columns"):
        fit_gllim(np.concatenate([X, X], -1), Y, p)
    with pytest.raises(ValueError, match="2 replicates but the data have 1"):
        fit_gllim(X, Y, p.repeat(2))
    with pytest.raises(ValueError, match="finite"):
        fit_gllim(np.full_like(X, np.nan), Y, p)
