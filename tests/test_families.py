"""GLM expert families and the batched IRLS M-step against statsmodels, scipy and hand-written numpy."""

import numpy as np
import pytest
import statsmodels.api as sm
import torch
from scipy import stats
from scipy.special import expit

from moestat.families import FAMILIES, Family, dispersion_update, get_family, initial_beta, irls_weighted

pytestmark = pytest.mark.usefixtures("one_thread")

SM_FAMILY = {"gaussian": sm.families.Gaussian, "poisson": sm.families.Poisson, "binomial": sm.families.Binomial}
TRUE_BETA = np.array([0.3, 0.8, -0.5])


def _t(a):
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


def _data(family, n=200, seed=0):
    rng = np.random.default_rng(seed)
    Z = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])
    eta = Z @ TRUE_BETA
    if family == "gaussian":
        y = eta + rng.normal(size=n)
    elif family == "poisson":
        y = rng.poisson(np.exp(eta)).astype(float)
    else:
        y = rng.binomial(1, expit(eta)).astype(float)
    return Z, y


def _fit_one(Z, y, w=None, family="gaussian", **kw):
    """irls_weighted on one lane (R = S = k = 1), returning numpy coefficients."""
    n, p = Z.shape
    w = np.ones(n) if w is None else w
    beta = irls_weighted(_t(Z)[None], _t(y)[None], _t(w).reshape(1, 1, n, 1), torch.zeros(1, 1, 1, p,
                         dtype=torch.float64), family, tol=1e-13, **kw)
    return beta[0, 0, 0].numpy()


def _sm_fit(Z, y, family, **kw):
    # statsmodels' IRLS stops on a deviance change of 1e-8 by default; 1e-14 makes it an exact reference
    return sm.GLM(y, Z, family=SM_FAMILY[family](), **kw).fit(tol=1e-14, maxiter=200).params


# ------------------------------------------------------------------ registry and response checks
def test_registry_and_unknown_family():
    assert set(FAMILIES) == {"gaussian", "poisson", "binomial"}
    assert [get_family(n).link for n in ("gaussian", "poisson", "binomial")] == ["identity", "log", "logit"]
    assert [get_family(n).has_dispersion for n in ("gaussian", "poisson", "binomial")] == [True, False, False]
    assert get_family(FAMILIES["poisson"]) is FAMILIES["poisson"]
    with pytest.raises(ValueError, match=r"family='gamma'.*\['binomial', 'gaussian', 'poisson'\]"):
        get_family("gamma")
    with pytest.raises(AttributeError):  # frozen
        FAMILIES["poisson"].name = "x"  # type: ignore[misc]
    assert isinstance(FAMILIES["gaussian"], Family)


@pytest.mark.parametrize(("family", "y", "trials", "match"), [
    ("poisson", [0.0, 1.5, 2.0], None, r"^y must hold non-negative integer counts.*e\.g\. 1\.5 at"),
    ("poisson", [0.0, -1.0, 2.0], None, r"^y must hold non-negative integer counts.*e\.g\. -1 at"),
    ("binomial", [0.0, 1.2], None, r"^y must be a proportion in \[0, 1\].*trials=m"),
    ("binomial", [0.0, -0.1], None, r"^y must be a proportion in \[0, 1\]"),
    ("binomial", [0.0, 0.5], None, r"^y must be 0 or 1 .*without trials"),
    ("binomial", [0.0, 0.3], [3.0, 3.0], r"^y \* trials must be whole numbers"),
    ("binomial", [0.0, 0.5], [2.0, 0.0], r"^trials must be positive integers"),
    ("gaussian", [0.0, np.nan], None, r"^y must be finite"),
    ("poisson", [0.0, np.inf], None, r"^y must be finite"),
    ("gaussian", [0.0, 1.0], [1.0, 1.0], r"^trials is only used by family='binomial'"),
])
def test_bad_responses_are_rejected_naming_y(family, y, trials, match):
    with pytest.raises(ValueError, match=match):
        get_family(family).check_response(np.array(y), None if trials is None else np.array(trials))


def test_good_responses_pass():
    get_family("gaussian").check_response(np.array([-1.5, 2.0]))
    get_family("poisson").check_response(torch.tensor([0.0, 3.0, 7.0]))
    get_family("binomial").check_response(np.array([0.0, 1.0]))
    get_family("binomial").check_response(np.array([1 / 3, 2 / 3, 1.0]), np.array([3, 3, 5]))
    with pytest.raises(TypeError, match=r"^y must hold real numbers"):
        get_family("gaussian").check_response(np.array(["a", "b"]))


# ------------------------------------------------------------------ densities against scipy
def test_log_densities_match_scipy():
    rng = np.random.default_rng(3)
    eta = rng.normal(size=50)
    # Gaussian: dispersion is the variance
    y = rng.normal(size=50)
    var = rng.uniform(0.2, 3.0, size=50)
    got = get_family("gaussian").log_density(_t(y), _t(eta), _t(var)).numpy()
    np.testing.assert_allclose(got, stats.norm.logpdf(y, eta, np.sqrt(var)), rtol=1e-13)
    # Poisson, with its -lgamma(y + 1)
    yc = rng.poisson(3.0, size=50).astype(float)
    got = get_family("poisson").log_density(_t(yc), _t(eta)).numpy()
    np.testing.assert_allclose(got, stats.poisson.logpmf(yc, np.exp(eta)), rtol=1e-12)
    # binomial: y is the proportion of m trials; the log binomial coefficient is included
    m = rng.integers(1, 12, size=50).astype(float)
    s = rng.binomial(m.astype(int), 0.4).astype(float)
    got = get_family("binomial").log_density(_t(s / m), _t(eta), None, _t(m)).numpy()
    np.testing.assert_allclose(got, stats.binom.logpmf(s, m, expit(eta)), rtol=1e-12)
    yb = rng.binomial(1, 0.5, size=50).astype(float)
    got = get_family("binomial").log_density(_t(yb), _t(eta)).numpy()
    np.testing.assert_allclose(got, stats.binom.logpmf(yb, 1, expit(eta)), rtol=1e-12)


def test_log_density_needs_variance_and_broadcasts():
    with pytest.raises(ValueError, match="dispersion"):
        get_family("gaussian").log_density(_t([0.0]), _t([0.0]))
    y = torch.zeros(2, 1, 5, 1)  # (R, 1, n, 1) against eta (R, S, n, k) and variance (R, S, 1, k)
    out = get_family("gaussian").log_density(y, torch.zeros(2, 3, 5, 4, dtype=torch.float64),
                                             torch.ones(2, 3, 1, 4, dtype=torch.float64))
    assert out.shape == (2, 3, 5, 4)
    np.testing.assert_allclose(out.numpy(), -0.5 * np.log(2 * np.pi), rtol=1e-15)


def test_working_response_and_weights():
    """Canonical-link IRLS quantities against their closed forms (McCullagh & Nelder 1989, §2.5)."""
    eta = np.array([-1.0, 0.2, 1.5])
    y = np.array([0.0, 1.0, 1.0])
    z, w = get_family("binomial").working(_t(y), _t(eta), _t([2.0, 2.0, 2.0]))
    mu = expit(eta)
    np.testing.assert_allclose(w.numpy(), 2 * mu * (1 - mu), rtol=1e-14)
    np.testing.assert_allclose(z.numpy(), eta + (y - mu) / (mu * (1 - mu)), rtol=1e-14)
    z, w = get_family("poisson").working(_t([2.0, 0.0, 5.0]), _t(eta))
    np.testing.assert_allclose(w.numpy(), np.exp(eta), rtol=1e-14)
    np.testing.assert_allclose(z.numpy(), eta + (np.array([2.0, 0.0, 5.0]) - np.exp(eta)) / np.exp(eta), rtol=1e-14)


# ------------------------------------------------------------------ IRLS against statsmodels
@pytest.mark.parametrize("family", ["gaussian", "poisson", "binomial"])
def test_k1_matches_statsmodels(family):
    Z, y = _data(family)
    # both solvers are iterated to machine precision; 1e-8 relative leaves room for the conditioning of Z'WZ
    np.testing.assert_allclose(_fit_one(Z, y, family=family), _sm_fit(Z, y, family), rtol=1e-8)


@pytest.mark.parametrize("family", ["gaussian", "poisson", "binomial"])
def test_integer_case_weights_equal_repeated_rows(family):
    Z, y = _data(family, n=80, seed=1)
    c = np.random.default_rng(2).integers(0, 4, size=80)
    weighted = _fit_one(Z, y, c.astype(float), family=family)
    repeated = _fit_one(np.repeat(Z, c, axis=0), np.repeat(y, c), family=family)
    reference = _sm_fit(Z, y, family, freq_weights=c)
    np.testing.assert_allclose(weighted, repeated, rtol=1e-8)  # same equations, summed in another order
    np.testing.assert_allclose(weighted, reference, rtol=1e-8)


def test_binomial_trials_match_statsmodels_var_weights():
    rng = np.random.default_rng(4)
    n = 120
    Z = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])
    m = rng.integers(1, 9, size=n).astype(float)
    y = rng.binomial(m.astype(int), expit(Z @ TRUE_BETA)) / m
    got = irls_weighted(_t(Z)[None], _t(y)[None], torch.ones(1, 1, n, 1, dtype=torch.float64),
                        torch.zeros(1, 1, 1, 3, dtype=torch.float64), "binomial", tol=1e-13, trials=_t(m)[None])
    # statsmodels' convention: proportions with var_weights = trials
    np.testing.assert_allclose(got[0, 0, 0].numpy(), _sm_fit(Z, y, "binomial", var_weights=m), rtol=1e-8)
    # and the 2-column (successes, failures) form of the same model
    np.testing.assert_allclose(got[0, 0, 0].numpy(), _sm_fit(Z, np.column_stack([m * y, m - m * y]), "binomial"),
                               rtol=1e-8)


def test_poisson_offset_matches_statsmodels():
    Z, y = _data("poisson", n=150, seed=5)
    off = np.random.default_rng(6).uniform(-0.5, 0.5, size=150)
    got = irls_weighted(_t(Z)[None], _t(y)[None], torch.ones(1, 1, 150, 1, dtype=torch.float64),
                        torch.zeros(1, 1, 1, 3, dtype=torch.float64), "poisson", tol=1e-13,
                        offset=_t(off).reshape(1, 1, 150, 1))
    np.testing.assert_allclose(got[0, 0, 0].numpy(), _sm_fit(Z, y, "poisson", offset=off), rtol=1e-8)


@pytest.mark.parametrize("family", ["gaussian", "poisson", "binomial"])
def test_batched_solver_equals_per_lane_solves(family):
    R, S, k, n = 2, 3, 2, 90
    rng = np.random.default_rng(7)
    data = [_data(family, n=n, seed=10 + r) for r in range(R)]
    Z = np.stack([d[0] for d in data])
    y = np.stack([d[1] for d in data])
    w = rng.uniform(0.05, 1.0, size=(R, S, n, k))  # responsibilities-like positive weights
    beta0 = 0.1 * rng.normal(size=(R, S, k, 3))
    batched = irls_weighted(_t(Z), _t(y), _t(w), _t(beta0), family, tol=1e-13).numpy()
    for r in range(R):
        for s in range(S):
            for j in range(k):
                lane = _fit_one(Z[r], y[r], w[r, s, :, j], family=family)
                np.testing.assert_allclose(batched[r, s, j], lane, rtol=1e-9, atol=1e-12)  # same optimum
    # and one lane against statsmodels with the weights as var_weights (the same score equations)
    np.testing.assert_allclose(batched[1, 2, 1], _sm_fit(Z[1], y[1], family, var_weights=w[1, 2, :, 1]), rtol=1e-8)


def test_gaussian_is_weighted_least_squares_in_one_step():
    Z, y = _data("gaussian", n=60, seed=8)
    w = np.random.default_rng(9).uniform(0.1, 1.0, size=60)
    closed = np.linalg.solve((Z * w[:, None]).T @ Z, (Z * w[:, None]).T @ y)
    beta = irls_weighted(_t(Z)[None], _t(y)[None], _t(w).reshape(1, 1, 60, 1),
                         torch.zeros(1, 1, 1, 3, dtype=torch.float64), "gaussian", max_iter=1)
    np.testing.assert_allclose(beta[0, 0, 0].numpy(), closed, rtol=1e-11)  # one exact Newton step
    start = initial_beta(_t(Z)[None], _t(y)[None], _t(w).reshape(1, 1, 60, 1), "gaussian")
    np.testing.assert_allclose(start[0, 0, 0].numpy(), closed, rtol=1e-11)


@pytest.mark.parametrize("family", ["poisson", "binomial"])
def test_initial_beta_then_irls_reaches_the_mle(family):
    Z, y = _data(family, n=100, seed=11)
    Zt, yt, w = _t(Z)[None], _t(y)[None], torch.ones(1, 1, 100, 1, dtype=torch.float64)
    start = initial_beta(Zt, yt, w, family)
    assert start.shape == (1, 1, 1, 3) and torch.isfinite(start).all()
    beta = irls_weighted(Zt, yt, w, start, family, tol=1e-13)
    np.testing.assert_allclose(beta[0, 0, 0].numpy(), _sm_fit(Z, y, family), rtol=1e-8)


def test_ridge_solves_the_penalised_score_equations():
    Z, y = _data("gaussian", n=50, seed=12)
    lam = 7.0
    ridge_closed = np.linalg.solve(Z.T @ Z + lam * np.eye(3), Z.T @ y)
    np.testing.assert_allclose(_fit_one(Z, y, family="gaussian", ridge=lam), ridge_closed, rtol=1e-11)
    Zp, yp = _data("poisson", n=50, seed=13)
    b = _fit_one(Zp, yp, family="poisson", ridge=lam)
    score = Zp.T @ (yp - np.exp(Zp @ b)) - lam * b  # penalised score, computed independently in numpy
    np.testing.assert_allclose(score, 0.0, atol=1e-8)


def test_prox_keeps_a_component_without_weight_in_place():
    Z, y = _data("poisson", n=40, seed=14)
    w = np.ones((1, 1, 40, 2))
    w[..., 1] = 0.0  # a vanished expert: its Newton system is singular without prox
    beta0 = np.array([[[[0.1, 0.2, 0.3], [0.4, -0.5, 0.6]]]])
    for prox in (0.0, 1e-6):
        out = irls_weighted(_t(Z)[None], _t(y)[None], _t(w), _t(beta0), "poisson", prox=prox, tol=1e-13).numpy()
        np.testing.assert_array_equal(out[0, 0, 1], beta0[0, 0, 1])
        assert np.isfinite(out).all()
    # prox is zero at the start, so it does not move the optimum of a well-posed lane by more than O(prox)
    np.testing.assert_allclose(out[0, 0, 0], _sm_fit(Z, y, "poisson"), rtol=1e-5)


# ------------------------------------------------------------------ monotonicity on a hard case
def _near_separated(n=60, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = (x + 0.15 * rng.normal(size=n) > 0).astype(float)  # few overlapping points: huge, flat MLE
    return np.column_stack([np.ones(n), x]), y


def _logistic_q(Z, y, b):
    e = Z @ b
    return np.sum(y * e - np.logaddexp(0.0, e))


def test_objective_never_decreases_where_plain_newton_does():
    Z, y = _near_separated()
    start = np.array([1.0, -3.0])
    # plain Newton (independent numpy implementation) from this start lowers the objective at some step
    b, plain = start.copy(), [_logistic_q(Z, y, start)]
    for _ in range(3):
        mu = expit(Z @ b)
        b = b + np.linalg.solve((Z * (mu * (1 - mu))[:, None]).T @ Z, Z.T @ (y - mu))
        plain.append(_logistic_q(Z, y, b))
    assert np.min(np.diff(plain)) < -1000.0
    # step halving: every iterate raises (or keeps) the objective, checked by running 1, 2, ... iterations
    Zt, yt, w = _t(Z)[None], _t(y)[None], torch.ones(1, 1, len(y), 1, dtype=torch.float64)
    q_by_iters = []
    for t in range(0, 30):
        b_t = irls_weighted(Zt, yt, w, _t(start).reshape(1, 1, 1, 2), "binomial", max_iter=t, tol=1e-13)
        q_by_iters.append(_logistic_q(Z, y, b_t[0, 0, 0].numpy()))
    # recomputing Q in numpy differs from the solver's own sum by rounding (~1e-15 relative) once it has converged
    assert np.all(np.diff(q_by_iters) >= -1e-12 * np.abs(q_by_iters[-1]))
    beta, info = irls_weighted(Zt, yt, w, _t(start).reshape(1, 1, 1, 2), "binomial", max_iter=100, tol=1e-13,
                               return_info=True)
    h = info.history[:, 0, 0, 0].numpy()
    assert np.all(np.diff(h) >= -1e-13 * np.abs(h[-1]))  # the unchecked final Newton steps move Q by rounding only
    assert np.all(np.diff(h[:10]) > 0.0)  # and the steps that matter raise it strictly
    assert bool(info.converged.all())
    np.testing.assert_allclose(info.objective[0, 0, 0].item(), _logistic_q(Z, y, beta[0, 0, 0].numpy()), rtol=1e-12)
    np.testing.assert_allclose(beta[0, 0, 0].numpy(), _sm_fit(Z, y, "binomial"), rtol=1e-7)  # flat optimum


def test_poisson_overflowing_start_is_recovered():
    """A start with tiny means makes the full Newton step overflow exp(eta); halving keeps the ascent."""
    Z, y = _data("poisson", n=100, seed=15)
    y = y + 5.0
    start = np.array([[[[-6.0, 0.0, 0.0]]]])
    beta, info = irls_weighted(_t(Z)[None], _t(y)[None], torch.ones(1, 1, 100, 1, dtype=torch.float64),
                               _t(start), "poisson", max_iter=200, tol=1e-13, return_info=True)
    h = info.history[:, 0, 0, 0].numpy()
    assert np.isfinite(h).all() and np.all(np.diff(h) >= -1e-13 * np.abs(h[-1]))  # rounding of the last steps
    np.testing.assert_allclose(beta[0, 0, 0].numpy(), _sm_fit(Z, y, "poisson"), rtol=1e-8)


def test_converged_lanes_are_frozen():
    R, S, k, n = 1, 2, 1, 80
    Z, y = _data("poisson", n=n, seed=16)
    w = np.ones((R, S, n, k))
    exact = _sm_fit(Z, y, "poisson")
    beta0 = np.stack([exact, np.zeros(3)])[None, :, None, :]  # lane 0 starts at the optimum
    _, info = irls_weighted(_t(Z)[None], _t(y)[None], _t(w), _t(beta0), "poisson", tol=1e-8, return_info=True)
    assert info.n_iter[0, 0, 0].item() <= 1 < info.n_iter[0, 1, 0].item()
    assert bool(info.converged.all())


def test_shape_errors_name_the_argument():
    Z = torch.zeros(1, 5, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^y must have shape \(R, n\)"):
        irls_weighted(Z, torch.zeros(5), torch.ones(1, 1, 5, 1), torch.zeros(1, 1, 1, 2), "gaussian")
    with pytest.raises(ValueError, match=r"^beta_init must have shape"):
        irls_weighted(Z, torch.zeros(1, 5), torch.ones(1, 1, 5, 1), torch.zeros(1, 1, 2, 2), "gaussian")
    with pytest.raises(ValueError, match=r"ridge and prox must be finite and >= 0"):
        irls_weighted(Z, torch.zeros(1, 5), torch.ones(1, 1, 5, 1), torch.zeros(1, 1, 1, 2), "gaussian", ridge=-1.0)


# ------------------------------------------------------------------ Gaussian variance update
def test_dispersion_update_is_the_weighted_mean_square():
    rng = np.random.default_rng(17)
    R, S, n, k = 2, 2, 30, 3
    y = rng.normal(size=(R, n))
    mu = rng.normal(size=(R, S, n, k))
    w = rng.uniform(size=(R, S, n, k))
    got = dispersion_update(_t(y), _t(mu), _t(w)).numpy()
    for r in range(R):
        for s in range(S):
            for j in range(k):
                np.testing.assert_allclose(got[r, s, j], np.average((y[r] - mu[r, s, :, j]) ** 2,
                                                                    weights=w[r, s, :, j]), rtol=1e-13)
    floored = dispersion_update(_t(y), _t(mu), _t(w), floor=10.0).numpy()
    np.testing.assert_array_equal(floored, np.maximum(got, 10.0))
    w0 = w.copy()
    w0[..., 0] = 0.0
    old = np.full((R, S, k), 0.7)
    prox = dispersion_update(_t(y), _t(mu), _t(w0), old=_t(old), prox=1e-3).numpy()
    np.testing.assert_allclose(prox[..., 0], 0.7, rtol=1e-14)  # no weight: the old variance is kept
    with pytest.raises(ValueError, match="old="):
        dispersion_update(_t(y), _t(mu), _t(w), prox=1.0)


def test_dispersion_update_maximises_the_weighted_gaussian_loglik():
    rng = np.random.default_rng(18)
    y, mu, w = rng.normal(size=(1, 40)), rng.normal(size=(1, 1, 40, 1)), rng.uniform(size=(1, 1, 40, 1))
    s2 = dispersion_update(_t(y), _t(mu), _t(w)).item()
    fam = get_family("gaussian")

    def q(v):
        return (_t(w[0, 0, :, 0]) * fam.log_density(_t(y[0]), _t(mu[0, 0, :, 0]), _t(v))).sum().item()

    assert q(s2) > max(q(s2 * 1.01), q(s2 / 1.01))  # a strict maximum in the variance


def test_binomial_log_density_is_exact_at_large_linear_predictors():
    """log(1 + e^eta) must not be cut off at eta > 20 (torch's softplus threshold): an error of e^-20 per point."""
    eta = np.array([-40.0, -21.0, 21.0, 40.0])
    y = np.array([1.0, 1.0, 0.0, 0.0])
    got = get_family("binomial").log_density(_t(y), _t(eta)).numpy()
    expected = -np.logaddexp(0.0, np.abs(eta))  # log(1 - expit(|eta|)), computed stably in numpy
    np.testing.assert_allclose(got, expected, rtol=1e-15)
