"""A gate temperature fitted jointly with the other parameters (learn_temperature=True of fit_mle and fit_lse;
Nguyen, Akbarian & Ho, ICML 2024): the layout term log(tau), derivatives against finite differences, the fixed-
temperature paths unchanged, recovery of a true temperature, the affine gate's non-identifiability, Params'
temperature, Study pass-through and bad input."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch

import moestat as ms
from moestat.fit._layout import ParamLayout
from moestat.fit._objective import LSProblem, MeanKernel, ReferenceKernel
from moestat.papers import nguyen2024_temperature as paper

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC = ms.MoE(gate="activation", expert="linear", k=2, d=1, temperature=0.8)
TRUTH = ms.Params([0.5, -0.5], [[3.0], [-2.0]], [[1.0], [-1.5]], [0.5, -0.3], noise_sd=[0.1, 0.2])


def _np_loglik(p: ms.Params, tau: float, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-observation log-likelihood by hand: pi = softmax(tanh(w x + b) / tau), Gaussian linear experts."""
    s = np.tanh(X @ p.gate_weight.T + p.gate_bias) / tau
    pi = np.exp(s - s.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    mu = X @ p.expert_weight.T + p.expert_bias
    dens = np.exp(-0.5 * ((y[:, None] - mu) / p.noise_sd) ** 2) / (np.sqrt(2 * np.pi) * p.noise_sd)
    return np.log((pi * dens).sum(1))


def _data(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    d = ms.simulate(SPEC, TRUTH, n=n, seed=seed, model="mixture")
    return d.X[0], d.y[0]


# ------------------------------------------------------------------ the model with a fitted temperature
def test_params_temperature_replaces_the_spec_temperature_in_the_model():
    X, y = _data()
    for tau in (0.3, 1.7):
        p = dataclasses.replace(TRUTH, temperature=tau)
        # float64 round-off of sums of n = 200 log-densities
        np.testing.assert_allclose(SPEC.loglik(p, X, y, reduce="none"), _np_loglik(TRUTH, tau, X, y), rtol=1e-12)
        fixed = dataclasses.replace(SPEC, temperature=tau)
        np.testing.assert_allclose(SPEC.mean(p, X), fixed.mean(TRUTH, X), rtol=1e-13)  # round-off of tau/tau
    batched = ms.Params.stack([dataclasses.replace(TRUTH, temperature=t) for t in (0.3, 1.7)])
    ll = SPEC.loglik(batched, X, y)
    np.testing.assert_allclose(ll, [_np_loglik(TRUTH, t, X, y).sum() for t in (0.3, 1.7)], rtol=1e-12)


def test_params_temperature_travels_with_select_stack_frames_and_permute():
    p = ms.Params.stack([dataclasses.replace(TRUTH, temperature=t) for t in (0.5, 2.0, 3.0)])
    assert p.temperature.tolist() == [0.5, 2.0, 3.0] and "temperature" in repr(p)
    assert float(p.select(1).temperature) == 2.0 and p.select([2, 0]).temperature.tolist() == [3.0, 0.5]
    assert p.permute([1, 0]).temperature.tolist() == [0.5, 2.0, 3.0]  # common to all experts: not permuted
    frame = p.to_frame()
    rows = frame[frame["block"] == "temperature"]
    assert rows["atom"].tolist() == [-1, -1, -1] and rows["value"].tolist() == [0.5, 2.0, 3.0]
    assert ms.Params.from_frame(frame).allclose(p)
    assert not p.allclose(dataclasses.replace(p, temperature=None))
    t = p.to_torch("cpu", torch.float64)
    assert isinstance(t.temperature, torch.Tensor) and t.numpy().allclose(p)
    assert TRUTH.batched(4).temperature is None


def test_params_temperature_bad_input():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        dataclasses.replace(TRUTH, temperature=-1.0)
    with pytest.raises(ValueError, match="temperature has shape"):
        dataclasses.replace(TRUTH, temperature=[1.0, 2.0])
    with pytest.raises(ValueError, match="NaN or infinite"):
        dataclasses.replace(TRUTH, temperature=np.inf)
    with pytest.raises(ValueError, match="temperature is set in some Params"):
        ms.Params.stack([TRUTH, dataclasses.replace(TRUTH, temperature=1.0)])


# ------------------------------------------------------------------ the layout and its derivatives
def test_layout_term_log_temperature():
    layout = ParamLayout(SPEC, learn_temperature=True)
    plain = ParamLayout(SPEC)
    assert layout.names == [*plain.names[:4], "gate:log_temperature", *plain.names[4:]]
    assert layout.size == plain.size + 1 and layout.n_gate == plain.n_gate + 1
    assert ("gate", -1, "log_temperature") in layout.term_info()
    theta = layout.pack(dataclasses.replace(TRUTH, temperature=0.6).to_torch("cpu", torch.float64))
    assert float(theta[4]) == pytest.approx(np.log(0.6), rel=1e-15)
    assert float(layout.unpack(theta).temperature) == pytest.approx(0.6, rel=1e-15)
    # a parameter set without a temperature is packed with the spec's
    assert float(layout.pack(TRUTH.to_torch("cpu", torch.float64))[4]) == pytest.approx(np.log(0.8), rel=1e-15)


def test_loglik_gradient_in_log_temperature_matches_finite_differences():
    """d loglik / d log(tau) by autograd (the path of fit_mle's gradient and MLEFit's Hessian) against central
    differences of the hand-written numpy log-likelihood."""
    X, y = _data()
    layout = ParamLayout(SPEC, learn_temperature=True)
    theta = layout.pack(dataclasses.replace(TRUTH, temperature=0.6).to_torch("cpu", torch.float64))
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    th = theta.clone().requires_grad_(True)
    total = torch.logsumexp(SPEC.log_density_components(layout.unpack(th), Xt, yt), -1).sum()
    (grad,) = torch.autograd.grad(total, th)
    h = 1e-5

    def numpy_ll(rho: float) -> float:
        return float(_np_loglik(TRUTH, np.exp(rho), X, y).sum())

    fd = (numpy_ll(np.log(0.6) + h) - numpy_ll(np.log(0.6) - h)) / (2 * h)
    assert float(total.detach()) == pytest.approx(numpy_ll(np.log(0.6)), rel=1e-12)
    # central differences: error O(h^2 f''') ~ 1e-9 relative, plus round-off 1e-16 * |ll| / h ~ 1e-9
    assert float(grad[4]) == pytest.approx(fd, rel=1e-6)


def test_lse_objective_gradient_in_log_temperature_matches_finite_differences():
    X, y = _data()
    y_t = torch.as_tensor(y)[None]
    kernel = MeanKernel.from_spec(SPEC, learn_temperature=True)
    assert isinstance(kernel, ReferenceKernel) and kernel.rows == 5
    free = torch.ones(5, 2, dtype=torch.bool)
    free[4, 1] = False
    prob = LSProblem(kernel, torch.as_tensor(X)[None], y_t, 1, free)
    table = np.array([[0.5, 3.0], [-0.5, -2.0], [0.5, 1.0], [-0.3, -1.5], [np.log(0.6), 0.0]])
    theta = torch.as_tensor(table.reshape(1, -1))
    loss, grad = prob.value_grad(theta)

    def numpy_objective(rho: float) -> float:
        s = np.tanh(X @ table[:2, 1:].T + table[:2, 0]) / np.exp(rho)
        pi = np.exp(s) / np.exp(s).sum(1, keepdims=True)
        f = (pi * (X @ table[2:4, 1:].T + table[2:4, 0])).sum(1)
        return float(np.mean((y - f) ** 2))

    h = 1e-5
    fd = (numpy_objective(table[4, 0] + h) - numpy_objective(table[4, 0] - h)) / (2 * h)
    assert float(loss[0]) == pytest.approx(numpy_objective(table[4, 0]), rel=1e-12)
    assert float(grad[0, 8]) == pytest.approx(fd, rel=1e-6)  # central differences, as above
    assert float(grad[0, 9]) == 0.0  # the held entries of the temperature row


# ------------------------------------------------------------------ the fixed-temperature paths
def test_fixed_temperature_objectives_equal_the_learned_ones_at_the_spec_temperature():
    """At log(tau) = log(spec.temperature) the learned-temperature objectives are the fixed-temperature ones (1e-12);
    with learn_temperature=False the kernels, layouts and tables are those of before (no extra term)."""
    X, y = _data()
    Xt, yt = torch.as_tensor(X)[None], torch.as_tensor(y)[None]
    table = torch.tensor([[0.5, 3.0], [-0.5, -2.0], [0.5, 1.0], [-0.3, -1.5]], dtype=torch.float64)
    fixed = LSProblem(MeanKernel.from_spec(SPEC), Xt, yt, 1, torch.ones(4, 2, dtype=torch.bool))
    assert fixed.P == 8 and not MeanKernel.from_spec(SPEC).learn_temperature
    learned = LSProblem(MeanKernel.from_spec(SPEC, learn_temperature=True), Xt, yt, 1,
                        torch.ones(5, 2, dtype=torch.bool))
    tau_row = torch.tensor([[np.log(0.8), 0.0]], dtype=torch.float64)
    a = fixed.value(table.reshape(1, -1))
    b = learned.value(torch.cat([table, tau_row]).reshape(1, -1))
    assert float(b[0]) == pytest.approx(float(a[0]), rel=1e-12)
    softmax = ms.MoE(gate="softmax", k=2, d=1)
    assert type(MeanKernel.from_spec(softmax)) is MeanKernel  # the fused kernel, as before
    assert "log_temperature" not in " ".join(ParamLayout(SPEC).names)
    layout = ParamLayout(SPEC, learn_temperature=True)
    p = TRUTH.to_torch("cpu", torch.float64)
    ll_fixed = torch.logsumexp(SPEC.log_density_components(p, torch.as_tensor(X), torch.as_tensor(y)), -1).sum()
    ll_learn = torch.logsumexp(SPEC.log_density_components(layout.unpack(layout.pack(p)), torch.as_tensor(X),
                                                           torch.as_tensor(y)), -1).sum()
    assert float(ll_learn) == pytest.approx(float(ll_fixed), rel=1e-12)


def test_learn_temperature_false_is_the_default_fit():
    X, y = _data()
    a = ms.fit_lse(SPEC, X, y, init="kmeans", seed=3, optimizer="lm", max_iter=20, condition=False)
    b = ms.fit_lse(SPEC, X, y, init="kmeans", seed=3, optimizer="lm", max_iter=20, condition=False,
                   learn_temperature=False)
    assert a.params.allclose(b.params, rtol=0, atol=0) and a.objective[0] == b.objective[0]
    assert b.params.temperature is None and "learn_temperature" not in b.settings
    m = ms.fit_mle(SPEC, X, y, method="gradient", restarts=1, seed=2, learn_temperature=False)
    assert m.params.temperature is None and "learn_temperature" not in m.settings
    assert "gate:log_temperature" not in m.param_names


# ------------------------------------------------------------------ recovery
def test_fit_lse_recovers_a_noise_free_temperature_from_a_near_truth_start():
    """Noise-free data, k = k*: the least-squares fit started at the true atoms and tau = 1.3 goes to tau* = 1."""
    spec, truth = paper.temperature_truth("activation", tau=1.0)
    X = np.random.default_rng(0).uniform(-1, 1, (300, 1))
    start = dataclasses.replace(spec, temperature=1.3)
    fit = ms.fit_lse(start, X, spec.mean(truth, X), init="near_truth", truth=truth, learn_temperature=True, seed=1,
                     optimizer="lm", condition=False)
    assert fit.converged[0] and fit.objective[0] < 1e-18  # noise-free: the minimum is 0
    assert fit.start_params.temperature.tolist() == [1.3]
    # a converged noise-free fit: measured |tau - 1| ~ 3e-7; the flat direction (cond ~ 2e8) allows ~1e-6
    assert abs(float(fit.params.temperature[0]) - 1.0) < 1e-4
    assert fit.settings["learn_temperature"] and fit.settings["kernel"] == "autograd"


def test_fit_mle_recovers_the_temperature_within_its_standard_errors():
    """Four replicates, n = 3000 (tau* = 1, where the saturated gate identifies tau well): each |log tau - 0| is
    within 4 observed-information standard errors (a 4-sigma band fails with probability 6e-5 per replicate)."""
    spec, truth = paper.temperature_truth("activation", tau=1.0)
    data = ms.simulate(spec, truth, n=3000, reps=4, seed=0, model="mixture")
    start = dataclasses.replace(spec, temperature=2.0)
    fit = ms.fit_mle(start, data.X, data.y, method="gradient", learn_temperature=True, restarts=2, seed=1)
    tidy = fit.tidy()
    row = tidy[tidy["term"] == "gate:log_temperature"]
    est, se = row["estimate"].to_numpy(), row["std_error"].to_numpy()
    np.testing.assert_allclose(np.exp(est), fit.params.temperature, rtol=1e-14)
    assert np.isfinite(se).all() and (se < 0.2).all()  # measured 0.06-0.15: identified here
    assert (np.abs(est) < 4 * se).all()
    assert fit.settings["learn_temperature"] and "gate:log_temperature" in fit.summary().coef.index
    # relabelling, alignment and selection keep the fitted temperature
    one = fit.select(1)
    assert one.params.temperature.tolist() == [fit.params.temperature[1]]
    aligned = one.align_to(truth)
    assert aligned.params.temperature.tolist() == one.params.temperature.tolist()
    assert np.allclose(aligned.theta[:, 4], est[1])


# ------------------------------------------------------------------ the affine gate
def test_affine_gate_temperature_is_not_identified():
    """(c beta_0, c beta_1, c tau) gives the softmax gate of (beta_0, beta_1, tau): weights and log-likelihood agree
    to round-off for every c; the same rescaling changes the activation gate (by more than 1e-2)."""
    X, y = _data()
    soft = ms.MoE(gate="softmax", k=2, d=1)
    base = dataclasses.replace(TRUTH, temperature=0.8)
    for c in (0.25, 3.0, 40.0):
        scaled = paper.rescale_gate(TRUTH, c, 0.8)
        np.testing.assert_allclose(soft.gate_weights(scaled, X), soft.gate_weights(base, X), rtol=1e-12, atol=1e-15)
        assert soft.loglik(scaled, X, y) == pytest.approx(soft.loglik(base, X, y), rel=1e-12)
        moved = np.abs(SPEC.gate_weights(scaled, X) - SPEC.gate_weights(base, X)).max()
        assert moved > 1e-2
    with pytest.raises(ValueError, match="learn_temperature=True: the temperature of gate='softmax' is not identified"):
        ms.fit_mle(soft, X, y, method="gradient", learn_temperature=True)
    with pytest.raises(ValueError, match="Fix the temperature"):
        ms.fit_lse(soft, X, y, learn_temperature=True)


# ------------------------------------------------------------------ bad input, Study
def test_learn_temperature_bad_input():
    X, y = _data()
    with pytest.raises(ValueError, match="method='gradient'"):
        ms.fit_mle(SPEC, X, y, learn_temperature=True)  # the default method is EM
    with pytest.raises((TypeError, ValueError), match="learn_temperature"):
        ms.fit_mle(SPEC, X, y, method="gradient", learn_temperature="yes")
    with pytest.raises((TypeError, ValueError), match="learn_temperature"):
        ms.fit_lse(SPEC, X, y, learn_temperature=1)
    with_tau = dataclasses.replace(TRUTH, temperature=0.5)
    with pytest.raises(ValueError, match="init carries a fitted temperature"):
        ms.fit_mle(SPEC, X, y, method="gradient", init=with_tau, restarts=0)
    with pytest.raises(ValueError, match="init carries a fitted temperature"):
        ms.fit_lse(SPEC, X, y, init=with_tau)
    with pytest.raises(TypeError, match="learn_temperature must be True or False"):
        ParamLayout(SPEC, learn_temperature=None)


def test_fit_mle_starts_at_an_init_temperature():
    """One L-BFGS iteration from the same atoms at tau = 0.5 and at tau = 3 keeps the two temperatures in order: the
    starts' temperatures were used (both differ from the spec's 0.8)."""
    X, y = _data()
    taus = []
    for tau0 in (0.5, 3.0):
        with pytest.warns(ms.exceptions.MLEConvergenceWarning, match="max_iter=1"):
            fit = ms.fit_mle(SPEC, X, y, method="gradient", init=dataclasses.replace(TRUTH, temperature=tau0),
                             restarts=0, learn_temperature=True, max_iter=1)
        taus.append(float(fit.params.temperature))
    assert taus[0] < 0.8 < taus[1]


def test_study_passes_learn_temperature_through(tmp_path):
    truth = {"label": "act", "gate": "activation", "expert": "linear", "k": 2, "d": 1, "temperature": 1.0,
             "model": "mixture", "params": {"gate_bias": [0.5, -0.5], "gate_weight": [[3.0], [-2.0]],
                                            "expert_weight": [[1.0], [-1.5]], "expert_bias": [0.5, -0.3],
                                            "noise_sd": [0.1, 0.1]}}
    study = ms.Study(name="tau", truth=truth, n=[300], reps=2, seed=4, threads=1,
                     fit={"estimator": "mle", "options": {"method": "gradient", "learn_temperature": True,
                                                          "restarts": 1}},
                     metrics=["l2", "moestat.papers.nguyen2024_temperature:temperature_error_metric"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = study.run(tmp_path, progress=False)
    assert frame["learn_temperature"].all()
    assert np.isfinite(frame["err_temperature"]).all() and (frame["err_temperature"] > 0).all()


# a distance gate can still run its slopes off to a step on these data (a degenerate fit, warned about); the test
# is about which weights gate_probs reports at whatever parameters were fitted, not about the fit
@pytest.mark.filterwarnings("ignore:the fit degenerated")
@pytest.mark.parametrize("gate", ["laplace", "cosine", "quadratic"])
def test_fitted_gate_probabilities_are_the_models_own_weights(gate):
    """``MLEFit.gate_probs`` / ``gate_probs_train`` use the gate's own scores (distances, cosines, quadratic forms),
    not affine logits: they equal ``MoE.gate_weights`` at the fitted parameters."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 2))
    spec = ms.MoE(gate=gate, expert="linear", k=2, d=2)
    first = rng.uniform(size=300) < 1 / (1 + np.exp(-2 * X[:, 0]))  # a smooth gate: no separating direction
    y = np.where(first, 1.0 + X[:, 1], -1.0 - X[:, 1]) + 0.3 * rng.normal(size=300)
    fit = ms.fit_mle(spec, X, y, method="gradient", restarts=2, seed=0)
    expected = np.asarray(spec.gate_weights(fit.params, X))
    np.testing.assert_allclose(fit.gate_probs(X), expected, atol=1e-12)
