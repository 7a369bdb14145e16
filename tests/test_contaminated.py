"""The contaminated MoE (moestat.contaminated): density, simulation, the closed-form derivatives, EM and Newton, the
losses, truths indexed by n, the expected information, and bad input."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy import integrate, stats

import moestat as ms
from moestat.contaminated import (
    ContaminatedMoE,
    ContaminatedParams,
    FrozenExpert,
    asymptotic_sd,
    contaminated_errors,
    contaminated_truth,
    distinguishable_loss,
    fisher_information,
    fit_contaminated,
    nondistinguishable_loss,
    observed_information,
)
from moestat.contaminated.fit import _Data, _from_phi, _to_phi, derivatives

FROZEN = FrozenExpert.gaussian_expert([1.0], 0.0, 0.25)
TANH_MOE = (ms.MoE(gate="softmax", expert="tanh", k=2, d=1, noise_sd=0.3),
            ms.Params(gate_bias=[0.0, 0.0], gate_weight=[[1.5], [-1.5]], expert_weight=[[1.5], [-2.0]],
                      expert_bias=[0.5, 0.0], noise_sd=[0.3, 0.3]))


def _const(**kw):
    base = {"weight": [-1.0], "bias": 0.5, "var": 0.16, "lam": 0.3}
    return ContaminatedParams(**{**base, **kw})


def _soft(**kw):
    base = {"weight": [-1.0], "bias": 0.5, "var": 0.16, "gate_weight": [1.5], "gate_bias": -0.5}
    return ContaminatedParams(**{**base, **kw})


# ----------------------------------------------------------------------------- density
def test_density_is_the_hand_mixture_and_integrates_to_one():
    model = ContaminatedMoE(FROZEN, "softmax")
    p = _soft()
    x, y = 0.7, -0.2
    w = 1 / (1 + math.exp(-(1.5 * x - 0.5)))
    hand = (1 - w) * stats.norm.pdf(y, x, 0.5) + w * stats.norm.pdf(y, -x + 0.5, 0.4)
    got = model.log_density(p, [[x]], [y])
    assert got.shape == (1, 1) and math.exp(got[0, 0]) == pytest.approx(hand, rel=1e-12)
    # a density in y for every x (quadrature to 1e-8: both components are smooth Gaussians)
    for x in (-1.0, 0.3):
        mass, _ = integrate.quad(lambda t, x=x: math.exp(model.log_density(p, [[x]], [t])[0, 0]), -10, 10,
                                 epsabs=1e-12)
        assert mass == pytest.approx(1.0, abs=1e-8)


def test_frozen_from_moe_is_the_moe_likelihood_and_its_sampler_matches():
    spec, params = TANH_MOE
    f0 = FrozenExpert.from_moe(spec, params)
    X = np.linspace(-2, 2, 7)[:, None]
    y = np.linspace(-1, 1, 7)
    assert np.allclose(f0.log_density(X, y), spec.loglik(params, X, y, reduce="none"), atol=0, rtol=1e-13)
    assert f0.gaussian is None and ContaminatedMoE(f0).distinguishable
    # a frozen one-expert MoE is one Gaussian ridge expert: theta0 and the same density as gaussian_expert
    one = FrozenExpert.from_moe(ms.MoE(gate="softmax", expert="linear", k=1, d=1, noise_sd=0.5),
                                ms.Params(gate_bias=[0.0], gate_weight=[[0.0]], expert_weight=[[1.0]],
                                          expert_bias=[0.0], noise_sd=[0.5]))
    assert np.allclose(one.theta0(), FROZEN.theta0()) and np.allclose(one.log_density(X, y), FROZEN.log_density(X, y))
    assert not ContaminatedMoE(one).distinguishable and ContaminatedMoE(one, expert="tanh").distinguishable
    # sampler: at x = 0.3 the draws have the MoE's mean and variance (4e4 draws: 5 standard errors)
    rng = np.random.default_rng(0)
    draws = f0.sample(np.full((40000, 1), 0.3), rng)
    w = np.asarray(spec.gate_weights(params, [[0.3]]))[0]
    m = np.asarray(spec.expert_means(params, [[0.3]]))[0]
    mean, var = w @ m, w @ (m ** 2 + 0.09) - (w @ m) ** 2
    assert abs(draws.mean() - mean) < 5 * math.sqrt(var / 40000)
    assert abs(draws.var() - var) < 5 * var * math.sqrt(2 / 40000) * 1.5  # 1.5: a mixture's kurtosis > 3


def test_simulation_has_the_model_proportion_and_prompt_law():
    model = ContaminatedMoE(FROZEN, "softmax")
    p = _soft()
    data = model.simulate(p, 20000, reps=2, seed=3, inputs="uniform", low=-2, high=2)
    assert data.X.shape == (2, 20000, 1) and data.y.shape == (2, 20000) and data.z.dtype == bool
    assert (data.X >= -2).all() and (data.X <= 2).all()
    # the share of prompt draws equals the mean gate weight (4 binomial standard errors)
    w = model.prompt_weight(p, data.X)
    assert abs(data.z.mean() - w.mean()) < 4 * math.sqrt(0.25 / 40000)
    # prompt draws: residuals from -x + 0.5 are N(0, 0.16) (Kolmogorov-Smirnov at the 0.1% level)
    res = (data.y - (-data.X[..., 0] + 0.5))[data.z]
    assert stats.kstest(res / 0.4, "norm").pvalue > 1e-3
    # seeding: same seed same data; replicate 0 does not change when more replicates are drawn
    again = model.simulate(p, 20000, reps=3, seed=3, inputs="uniform", low=-2, high=2)
    assert np.array_equal(again.y[:2], data.y)


# ----------------------------------------------------------------------------- derivatives
def _torch_loglik(gate, expert, phi, X, y, lf0, floor):
    """An independent torch implementation of the log-likelihood in the unconstrained coordinates."""
    act = {"linear": lambda z: z, "tanh": torch.tanh, "gelu": torch.nn.functional.gelu}[expert]
    if gate == "constant":
        log_w, log_1mw, rest = (torch.nn.functional.logsigmoid(phi[0]), torch.nn.functional.logsigmoid(-phi[0]),
                                phi[1:])
    else:
        s = X[:, 0] * phi[0] + phi[1]
        log_w, log_1mw, rest = torch.nn.functional.logsigmoid(s), torch.nn.functional.logsigmoid(-s), phi[2:]
    var = floor + torch.exp(rest[2])
    dens = torch.distributions.Normal(act(X[:, 0] * rest[0] + rest[1]), torch.sqrt(var))
    return torch.logaddexp(log_1mw + lf0, log_w + dens.log_prob(y)).sum()


@pytest.mark.parametrize("gate", ["constant", "softmax"])
@pytest.mark.parametrize("expert", ["linear", "tanh", "gelu"])
def test_closed_form_derivatives_equal_autograd_and_finite_differences(gate, expert):
    rng = np.random.default_rng(1)
    model = ContaminatedMoE(FROZEN, gate, expert)
    n = 150
    X, y = rng.uniform(-2, 2, (1, n, 1)), rng.normal(size=(1, n))
    lf0 = model.frozen_log_density(X, y)
    data = _Data(X, np.concatenate([X, np.ones((1, n, 1))], axis=2), y, lf0)
    phi = 0.5 * rng.normal(size=(1, model.n_params))
    floor = 1e-6
    ll, g, H = derivatives(model, phi, data, floor)
    fn = lambda t: _torch_loglik(gate, expert, t, *(torch.as_tensor(a[0]) for a in (X, y, lf0)), floor)  # noqa: E731
    t = torch.as_tensor(phi[0])
    # autograd of an independent implementation: equal to rounding (1e-10 relative)
    assert ll[0] == pytest.approx(float(fn(t)), rel=1e-12)
    assert np.allclose(g[0], torch.func.grad(fn)(t).numpy(), rtol=1e-10, atol=1e-10)
    assert np.allclose(H[0], torch.func.hessian(fn)(t).numpy(), rtol=1e-10, atol=1e-9)
    # central finite differences of the closed-form value (step 1e-5: truncation ~1e-10, rounding ~1e-8)
    h = 1e-5
    for j in range(model.n_params):
        e = np.zeros_like(phi)
        e[0, j] = h
        fd = (derivatives(model, phi + e, data, floor, order=0)[0] - derivatives(model, phi - e, data, floor,
                                                                                     order=0)[0]) / (2 * h)
        assert fd[0] == pytest.approx(g[0, j], rel=1e-6, abs=1e-6)
        gd = (derivatives(model, phi + e, data, floor, order=1)[1] - derivatives(model, phi - e, data, floor,
                                                                                     order=1)[1]) / (2 * h)
        assert np.allclose(gd[0], H[0, j], rtol=1e-5, atol=1e-5)
    # the value is the model's log-likelihood at the same parameters
    params = _from_phi(phi, gate, 1, floor).params()
    assert ll[0] == pytest.approx(model.loglik(params, X, y)[0], rel=1e-12)
    assert np.allclose(_to_phi(_from_phi(phi, gate, 1, floor), floor), phi)


# ----------------------------------------------------------------------------- fitting
@pytest.fixture(scope="module")
def big_constant():
    """A well-separated truth and 60000 observations: the MLE sits within a few 1e-3 of the truth."""
    model = ContaminatedMoE(FrozenExpert.gaussian_expert([0.0], 0.0, 1.0))
    truth = ContaminatedParams(weight=[2.0], bias=1.0, var=0.25, lam=0.4)
    data = model.simulate(truth, 60000, reps=2, seed=11, inputs="uniform", low=-2, high=2)
    return model, truth, data


def test_em_never_lowers_the_likelihood_and_em_equals_newton(big_constant):
    model, _, data = big_constant
    X, y = data.X[:, :4000], data.y[:, :4000]
    em = fit_contaminated(model, X, y, method="em", seed=0, history=True, tol=1e-13)
    hist = em.history
    assert set(hist["stage"]) == {"em"}
    steps = hist.groupby(["rep", "start"])["loglik"].diff().dropna()
    assert (steps >= -1e-9).all()  # monotone up to rounding of sums of 4000 terms
    nt = fit_contaminated(model, X, y, method="newton", seed=0)
    assert em.converged.all() and nt.converged.all()
    # the same maximum: log-likelihoods to 1e-7 and parameters to 1e-4 (EM stops at a gain of 1e-13 per
    # observation; the remaining distance is about sqrt(gain / curvature))
    assert np.allclose(em.loglik, nt.loglik, rtol=0, atol=1e-6)
    assert np.allclose(em.params.theta(), nt.params.theta(), atol=1e-4)
    assert np.allclose(em.params.lam, nt.params.lam, atol=1e-4)
    # at the maximum the closed-form gradient vanishes
    idx = np.arange(2)
    Z = np.concatenate([X, np.ones((2, 4000, 1))], axis=2)
    g = derivatives(model, _to_phi(_State_of(nt.params), 1e-6), _Data(X, Z, y, model.frozen_log_density(X, y)),
                    1e-6, order=1)[1]
    assert np.abs(g[idx]).max() < 1e-5


def _State_of(params):
    from moestat.contaminated.fit import _State

    return _State.from_params(params)


def test_recovery_of_lambda_and_the_prompt_on_a_large_sample(big_constant):
    model, truth, data = big_constant
    fit = fit_contaminated(model, data.X, data.y, seed=1)
    assert fit.converged.all() and not fit.boundary.any()
    se = fit.std_error
    est = np.concatenate([fit.params.gate_vector(), fit.params.theta()], axis=1)
    tru = np.concatenate([truth.gate_vector(), truth.theta()], axis=1)
    # within 5 observed-information standard errors (each about 2-5e-3 at n = 60000)
    assert (np.abs(est - tru) < 5 * se).all() and (se < 0.01).all()
    # the MLE beats the truth's likelihood (it maximises it)
    assert (fit.loglik >= model.loglik(truth, data.X, data.y) - 1e-8).all()
    tidy = fit.tidy()
    assert list(tidy.columns) == ["rep", "block", "coef", "estimate", "std_error", "conf_low", "conf_high"]
    assert len(tidy) == 2 * 4 and set(fit.glance()["converged"]) == {True}
    one = fit.select(1)
    assert one.n_reps == 1 and one.loglik[0] == fit.loglik[1]
    assert "gate" in str(fit.summary())


def test_softmax_recovery_and_standard_errors_match_the_replicate_spread():
    model = ContaminatedMoE(FROZEN, "softmax")
    truth = _soft(gate_weight=[2.0], gate_bias=0.0, weight=[-1.0], bias=0.5, var=0.16)
    data = model.simulate(truth, 3000, reps=24, seed=5, inputs="uniform", low=-2, high=2)
    fit = fit_contaminated(model, data.X, data.y, init=["ols", truth], seed=0)
    assert fit.converged.all()
    est = np.concatenate([fit.params.gate_vector(), fit.params.theta()], axis=1)
    tru = np.concatenate([truth.gate_vector(), truth.theta()], axis=1)
    # the replicate sd of each estimate is the median observed-information se within a factor 1.6 (24
    # replicates: the sd of a sample sd is about 15%, so a factor 1.6 is 3 standard errors)
    ratio = est.std(axis=0, ddof=1) / np.median(fit.std_error, axis=0)
    assert ((ratio > 1 / 1.6) & (ratio < 1.6)).all(), ratio
    # no bias beyond 4 standard errors of the mean
    assert (np.abs(est.mean(axis=0) - tru[0]) < 4 * est.std(axis=0, ddof=1) / math.sqrt(24)).all()
    # the observed information is the negative Hessian: symmetric positive definite at the maximum
    info = observed_information(model, fit.params.select(0), data.X[:1], data.y[:1])[0]
    assert np.allclose(info, info.T) and np.linalg.eigvalsh(info).min() > 0


@pytest.mark.parametrize("gate", ["constant", "softmax"])
def test_observed_information_equals_torch_func_and_loads_no_compiler(gate):
    """The observed information by plain autograd (reverse over reverse) against ``torch.func``'s Hessian of one
    replicate's log-likelihood, and a fresh interpreter's first fit with standard errors and Fisher information
    leaves ``torch._dynamo`` unloaded (``torch.func`` loaded it: about 1 s)."""
    from moestat.contaminated.fit import _natural_ll_fn

    model = ContaminatedMoE(FROZEN, gate, "tanh")
    kw = ({"weight": [2.0], "bias": -0.5, "var": 0.04, "lam": 0.5} if gate == "constant" else
          {"weight": [2.0], "bias": 0.5, "var": 0.16, "gate_weight": [1.5], "gate_bias": -0.5})
    truth = ContaminatedParams(**kw)
    data = model.simulate(truth, 500, reps=2, seed=3, inputs="uniform", low=-2, high=2)
    info = observed_information(model, truth, data.X, data.y)
    theta = torch.as_tensor(np.concatenate([truth.gate_vector(), truth.theta()], axis=1)[0])
    lf0 = torch.as_tensor(model.frozen_log_density(data.X, data.y))
    for r in range(2):
        ref = -torch.func.hessian(_natural_ll_fn(model))(theta, torch.as_tensor(data.X[r]), torch.as_tensor(data.y[r]),
                                                          lf0[r]).numpy()
        # forward over reverse against reverse over reverse: rounding of sums over 500 observations
        np.testing.assert_allclose(info[r], ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    code = f"""
import sys, moestat as ms
from moestat.contaminated import ContaminatedMoE, ContaminatedParams, FrozenExpert, fit_contaminated, fisher_information
model = ContaminatedMoE(FrozenExpert.gaussian_expert([1.0], 0.0, 0.25), {gate!r}, "tanh")
truth = ContaminatedParams(**{kw!r})
data = model.simulate(truth, 300, reps=1, seed=2, inputs="uniform", low=-2, high=2)
fit = fit_contaminated(model, data.X, data.y, seed=0)
fisher_information(model, truth)
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_several_starts_keep_the_best_and_a_nonlinear_prompt_fits_by_newton():
    model = ContaminatedMoE(FROZEN, "constant", "tanh")
    truth = _const(weight=[2.0], bias=-0.5, var=0.04, lam=0.5)
    data = model.simulate(truth, 4000, reps=2, seed=2, inputs="uniform", low=-2, high=2)
    fit = fit_contaminated(model, data.X, data.y, init=["ols", "random", truth], restarts=2, seed=0)
    assert fit.start_loglik.shape == (2, 4) and np.allclose(fit.loglik, fit.start_loglik.max(axis=1))
    assert fit.converged.all() and np.allclose(fit.params.theta(), truth.theta(), atol=0.08)
    with pytest.raises(ValueError, match="method='em' needs a linear prompt"):
        fit_contaminated(model, data.X, data.y, method="em")


def test_a_vanishing_prompt_is_reported_on_the_boundary():
    """A prompt started far from every observation loses all responsibility: lambda runs to 0 and the fit says so
    (boundary, not a converged interior maximum)."""
    model = ContaminatedMoE(FROZEN)
    data = model.simulate(_const(lam=1e-12), 2000, reps=1, seed=4)
    far = _const(weight=[0.0], bias=25.0, var=0.01, lam=0.2)
    for method in ("em", "newton"):
        fit = fit_contaminated(model, data.X, data.y, init=[far], method=method, warn=False, max_iter=3000)
        assert fit.boundary[0] and fit.params.lam[0] < 1e-10, method
    with pytest.warns(ms.exceptions.ConvergenceWarning, match="did not converge"):
        fit_contaminated(model, data.X, data.y, init=["ols"], method="em", max_iter=3)


# ----------------------------------------------------------------------------- losses
def test_losses_by_hand_and_by_brute_force():
    est = ContaminatedParams(weight=[[1.0], [2.0]], bias=[0.0, 1.0], var=[1.0, 0.5], lam=[0.5, 0.2])
    tru = ContaminatedParams(weight=[1.0], bias=0.4, var=1.3, lam=0.4)
    theta0 = np.array([1.0, 0.0, 1.0])
    # replicate 0 by hand: |dlam| = 0.1, ||dtheta|| = ||(0, -0.4, -0.3)|| = 0.5, ||Delta*|| = ||(0, 0.4, 0.3)|| = 0.5
    assert distinguishable_loss(est, tru)[0] == pytest.approx(0.1 + 0.4 * 0.5)
    assert nondistinguishable_loss(est, tru, theta0)[0] == pytest.approx(0.1 * 0.25 + 0.4 * 0.5 * 0.5)
    # brute force over replicates with plain Python
    for r in range(2):
        dth = math.dist([est.weight[r, 0], est.bias[r], est.var[r]], [1.0, 0.4, 1.3])
        dl = abs(est.lam[r] - 0.4)
        assert distinguishable_loss(est, tru)[r] == pytest.approx(dl + 0.4 * dth)
        assert nondistinguishable_loss(est, tru, theta0)[r] == pytest.approx(dl * 0.25 + 0.4 * 0.5 * dth)
    sest = ContaminatedParams(weight=[1.0], bias=0.0, var=1.0, gate_weight=[2.0], gate_bias=0.5)
    stru = ContaminatedParams(weight=[1.0], bias=0.4, var=1.3, gate_weight=[1.0], gate_bias=0.0)
    assert distinguishable_loss(sest, stru)[0] == pytest.approx(1.0 + 0.5 + 0.5)
    assert nondistinguishable_loss(sest, stru, theta0)[0] == pytest.approx(0.5 * 1.5 + 0.5)
    errs = contaminated_errors(est, tru, theta0)
    assert set(errs) == {"lam_err", "prompt_err", "loss_dist", "delta", "loss_nondist"}
    assert np.allclose(errs["delta"], 0.5) and np.isnan(contaminated_errors(est, tru)["loss_nondist"]).all()
    # zero at the truth
    assert distinguishable_loss(tru, tru)[0] == 0 and nondistinguishable_loss(tru, tru, theta0)[0] == 0
    with pytest.raises(ValueError, match="theta0 must be"):
        nondistinguishable_loss(est, tru, [1.0, 0.0])
    with pytest.raises(ValueError, match="gate='softmax'"):
        distinguishable_loss(est, stru)


# ----------------------------------------------------------------------------- truths indexed by n
def test_truths_indexed_by_n():
    a = contaminated_truth(100, FROZEN, lam=0.9, lam_rate=0.25, direction=[1.0, 0.0, 0.0], separation=2.0,
                           approach_rate=0.5)
    b = contaminated_truth(10000, FROZEN, lam=0.9, lam_rate=0.25, direction=[1.0, 0.0, 0.0], separation=2.0,
                           approach_rate=0.5)
    # lambda_n = 0.9 n^-1/4 and ||Delta_n|| = 2 n^-1/2, by hand
    assert a.info["lam_n"] == pytest.approx(0.9 / 100 ** 0.25) and b.info["lam_n"] == pytest.approx(0.09)
    assert a.info["delta_n"] == pytest.approx(0.2) and b.info["delta_n"] == pytest.approx(0.02)
    assert np.allclose(b.params.theta()[0], [1.02, 0.0, 0.25])
    assert not a.info["distinguishable"]
    fixed = contaminated_truth(50, FrozenExpert.from_moe(*TANH_MOE), prompt=[0.5, 0.0, 0.09], gate="softmax",
                               gate_weight=[2.0])
    assert fixed.info["distinguishable"] and np.isnan(fixed.info["delta_n"]) and fixed.theta0() is None
    with pytest.raises(ValueError, match="must lie in \\(0, 1\\)"):
        contaminated_truth(10, FROZEN, lam=2.0, prompt=[0.5, 0.0, 0.09])
    with pytest.raises(ValueError, match="one Gaussian ridge expert"):
        contaminated_truth(10, FrozenExpert.from_moe(*TANH_MOE), direction=[1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="variance"):
        contaminated_truth(10, FROZEN, direction=[0.0, 0.0, -1.0], separation=1.0)


# ----------------------------------------------------------------------------- expected information
def test_fisher_information_matches_the_score_variance_by_monte_carlo():
    model = ContaminatedMoE(FROZEN, "constant")
    p = _const(weight=[0.0], bias=1.0, var=0.3, lam=0.4)
    info = fisher_information(model, p)
    # Monte Carlo: covariance of the per-observation scores at the truth (2e5 draws; 4% relative tolerance is
    # about 5 standard errors for these entries)
    data = model.simulate(p, 200000, seed=9)
    from moestat.contaminated.fit import _natural_ll_fn

    fn = _natural_ll_fn(model)
    theta = torch.as_tensor(np.concatenate([p.gate_vector(), p.theta()], axis=1)[0])
    Xt, yt = torch.as_tensor(data.X[0]), torch.as_tensor(data.y[0])
    lf0 = torch.as_tensor(model.frozen_log_density(data.X, data.y)[0])
    per = torch.func.vmap(torch.func.grad(lambda t, x, y, l0: fn(t, x[None], y[None], l0[None])),
                          in_dims=(None, 0, 0, 0))(theta, Xt, yt, lf0).numpy()
    mc = per.T @ per / len(per)
    assert np.abs(per.mean(axis=0)).max() < 5 * np.sqrt(np.diag(mc) / len(per)).max()  # scores have mean 0
    assert np.allclose(info, mc, rtol=0.04, atol=0.04 * np.abs(np.diag(info)).min())


def test_information_scaling_behind_the_rates():
    """The exponents of the theory rows, from the expected information: constant gate, prompt merging with
    ||Delta|| -> 0: sd(lambda) ~ ||Delta||^-2, sd(prompt) ~ ||Delta||^-1; softmax gate: sd(gate) ~ ||Delta||^-1,
    sd(prompt) bounded; prompt vanishing: sd(lambda) bounded."""
    u = np.array([1.0, -0.5, 0.25]) / np.linalg.norm([1.0, -0.5, 0.25])

    def sds(gate, delta, **kw):
        th = FROZEN.theta0() + delta * u
        params = ContaminatedParams(weight=th[:1], bias=th[1], var=th[2], **kw)
        return asymptotic_sd(ContaminatedMoE(FROZEN, gate), params, 1.0)

    c1, c2 = sds("constant", 0.04, lam=0.5), sds("constant", 0.02, lam=0.5)
    slope = np.log(c2 / c1) / np.log(0.5)  # local exponent of sd in ||Delta||
    assert slope[0] == pytest.approx(-2.0, abs=0.1)  # lambda: ||Delta||^-2 (0.1: the limit is approached)
    assert slope[1:] == pytest.approx([-1.0, -1.0, -1.0], abs=0.15)
    s1, s2 = sds("softmax", 0.04, gate_weight=[2.0], gate_bias=0.0), sds("softmax", 0.02, gate_weight=[2.0],
                                                                       gate_bias=0.0)
    slope = np.log(s2 / s1) / np.log(0.5)
    assert slope[:2] == pytest.approx([-1.0, -1.0], abs=0.1) and np.abs(slope[2:]).max() < 0.1


# ----------------------------------------------------------------------------- bad input
def test_bad_input_names_the_argument():
    model = ContaminatedMoE(FROZEN)
    X, y = np.zeros((20, 1)), np.zeros(20)
    with pytest.raises(ValueError, match="gate='sigmoid'"):
        ContaminatedMoE(FROZEN, "sigmoid")
    with pytest.raises(ValueError, match="expert='constant' has no slope"):
        ContaminatedMoE(FROZEN, expert="constant")
    with pytest.raises(ValueError, match="d=1 inputs but the contaminated MoE has d=2"):
        ContaminatedMoE(FROZEN, d=2)
    with pytest.raises(TypeError, match="frozen must be a FrozenExpert"):
        ContaminatedMoE(lambda X, y: y)
    with pytest.raises(ValueError, match="var must be > 0"):
        _const(var=-1.0)
    with pytest.raises(ValueError, match="lam must lie in \\[0, 1\\]"):
        _const(lam=1.5)
    with pytest.raises(ValueError, match="either lam"):
        ContaminatedParams(weight=[1.0], bias=0.0, var=1.0, lam=0.5, gate_weight=[1.0], gate_bias=0.0)
    with pytest.raises(ValueError, match="method='bfgs'"):
        fit_contaminated(model, X, y, method="bfgs")
    with pytest.raises(ValueError, match="tol must be a finite number > 0"):
        fit_contaminated(model, X, y, tol=0)
    with pytest.raises(ValueError, match="y has shape"):
        fit_contaminated(model, X, np.zeros(19))
    with pytest.raises(ValueError, match="X contains NaN"):
        fit_contaminated(model, np.full((20, 1), np.nan), y)
    with pytest.raises(ValueError, match="init entry 'truth'"):
        fit_contaminated(model, X, y, init=["truth"])
    with pytest.raises(ValueError, match="gate='softmax' but the model has gate='constant'"):
        model.loglik(_soft(), X, y)
    with pytest.raises(ValueError, match="n=2 observations"):
        fit_contaminated(model, X[:2], y[:2])
    with pytest.raises(ValueError, match="needs n"):
        model.simulate(_const())
    with pytest.raises(ValueError, match="no sampler"):
        ContaminatedMoE(FrozenExpert(lambda X, y: -0.5 * y ** 2, d=1)).simulate(_const(), 10)
    with pytest.raises(ValueError, match="var must be a finite variance > 0"):
        FrozenExpert.gaussian_expert([1.0], 0.0, 0.0)
