"""The activation gate (Nguyen, Akbarian & Ho, ICML 2024) in the gate registry, and the registry's declaration of
which gates identify a fitted temperature: formulas against direct loops, validity at extreme inputs, gradients
against finite differences, the rank of the Jacobian with log(tau), the k = 2 sign symmetry, simulation with a
temperature, and noise-free least-squares recovery."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import moestat as ms
from moestat import gates

OPTIONS = {"topk": {"top_k": 4}, "normalized_sigmoid": {"n_shared": 1}}


def _weights(spec: ms.MoE, X, W, b, tau: float = 1.0) -> torch.Tensor:
    X, W, b = (torch.as_tensor(a, dtype=torch.float64) for a in (X, W, b))
    return gates.gate_weights(spec.gate, spec.gate_scores(X, W, b), top_k=spec.top_k, temperature=tau,
                              n_shared=spec.n_shared)


def test_activation_gate_is_registered_with_its_metadata():
    g = gates.GATES["activation"]
    assert g.scores is gates.activation_scores and "2401.13875" in g.reference
    assert (g.normalization, g.normalized, g.translation_invariant, g.input_affine) == ("softmax", True, False, False)
    assert g.gauge == "none" and g.n_redundant(4, 3) == 0 and g.options == ("temperature",)
    assert [name for name, gate in gates.GATES.items() if gate.temperature_identified] == \
        ["laplace", "cosine", "activation"]
    assert ms.MoE(gate="activation", k=3, d=2).n_params() == 3 * 3 + 3 * 3


def test_activation_scores_match_a_direct_loop():
    rng = np.random.default_rng(0)
    X, W, b = rng.normal(size=(7, 3)) * 2, rng.normal(size=(4, 3)), rng.normal(size=4)
    expected = np.array([[math.tanh(sum(X[t, j] * W[i, j] for j in range(3)) + b[i]) for i in range(4)]
                         for t in range(7)])
    got = gates.gate_scores("activation", *(torch.as_tensor(a) for a in (X, W, b))).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-15)  # float64 round-off of a 3-term sum
    s = expected / 0.4
    soft = np.exp(s - s.max(1, keepdims=True))
    np.testing.assert_allclose(_weights(ms.MoE(gate="activation", k=4, d=3), X, W, b, 0.4).numpy(),
                               soft / soft.sum(1, keepdims=True), rtol=1e-13)


def test_activation_weights_valid_and_finite_at_extreme_inputs():
    """Inputs and parameters of +-1e4 (the registry's check): weights in [0, 1] summing to one, finite gradients."""
    spec = ms.MoE(gate="activation", k=4, d=3)
    X = torch.tensor([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [1e4, 1e4, 1e4], [0.0, 0.0, 0.0], [3.0, -2e4, 5e3]],
                     dtype=torch.float64)
    W = torch.tensor([[1e4, 0.0, -1e4], [-1.0, 2.0, 0.5], [1e4, 1e4, 1e4], [0.0, -3.0, 1.0]], dtype=torch.float64,
                     requires_grad=True)
    b = torch.tensor([1e4, -1e4, 0.0, 5.0], dtype=torch.float64, requires_grad=True)
    for tau in (1e-3, 1.0, 1e3):
        w = gates.gate_weights("activation", spec.gate_scores(X, W, b), temperature=tau)
        assert torch.isfinite(w).all() and (w >= 0).all() and (w <= 1).all()
        np.testing.assert_allclose(w.sum(-1).detach().numpy(), 1.0, rtol=1e-12)
        (w * torch.arange(4.0, dtype=torch.float64)).sum().backward()
        assert torch.isfinite(W.grad).all() and torch.isfinite(b.grad).all()
        logw = gates.log_mixture_weights("activation", spec.gate_scores(X, W, b).detach(), temperature=tau)
        np.testing.assert_allclose(torch.logsumexp(logw, -1).numpy(), 0.0, atol=1e-12)


def test_activation_gradient_in_gate_parameters_and_log_temperature_matches_finite_differences():
    spec = ms.MoE(gate="activation", k=4, d=3)
    rng = np.random.default_rng(8)
    X = torch.as_tensor(rng.normal(size=(6, 3)) * 1.5)
    W0, b0 = torch.as_tensor(rng.normal(size=(4, 3))), torch.as_tensor(rng.normal(size=4))
    rho0 = torch.tensor(math.log(0.8), dtype=torch.float64)

    def weights(W: torch.Tensor, b: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
        return gates.gate_weights("activation", spec.gate_scores(X, W, b) / torch.exp(rho))

    args = tuple(a.clone().requires_grad_(True) for a in (W0, b0, rho0))
    assert torch.autograd.gradcheck(weights, args, eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("gate", list(gates.GATES))
def test_temperature_identified_is_the_rank_of_the_jacobian_with_log_temperature(gate):
    """Adding the column d pi / d log(tau) to the Jacobian in the gate parameters raises its numerical rank by one
    exactly for the gates declared temperature_identified (elsewhere tau * d/dtau is a combination of the gate
    parameters' columns: the scale invariance)."""
    k, d = 4, 3
    spec = ms.MoE(gate=gate, k=k, d=d, **OPTIONS.get(gate, {}))
    rng = np.random.default_rng(10)
    X = torch.as_tensor(rng.normal(size=(40, d)))
    theta0 = torch.as_tensor(np.concatenate([rng.normal(size=k * d), rng.normal(size=k), [math.log(0.7)]]))

    def weights(theta: torch.Tensor) -> torch.Tensor:
        W, b = theta[: k * d].reshape(k, d), theta[k * d : k * d + k]
        return gates.gate_weights(gate, spec.gate_scores(X, W, b) / torch.exp(theta[-1]), top_k=spec.top_k,
                                  n_shared=spec.n_shared).reshape(-1)

    J = torch.func.jacfwd(weights)(theta0)
    rank_gate = int(torch.linalg.matrix_rank(J[:, :-1], rtol=1e-9))  # invariances give singular values ~1e-16
    rank_all = int(torch.linalg.matrix_rank(J, rtol=1e-9))
    assert rank_gate == k * (d + 1) - gates.GATES[gate].n_redundant(k, d)
    assert rank_all == rank_gate + int(gates.GATES[gate].temperature_identified)


def test_activation_gate_changes_with_a_common_intercept_shift():
    spec = ms.MoE(gate="activation", k=4, d=3)
    rng = np.random.default_rng(3)
    X, W, b = rng.normal(size=(5, 3)), rng.normal(size=(4, 3)), rng.normal(size=4)
    for shift in (0.05, -2.0, 40.0):
        assert not np.allclose(_weights(spec, X, W, b + shift).numpy(), _weights(spec, X, W, b).numpy(), atol=1e-6)


def test_two_activation_experts_have_a_sign_symmetry_and_three_do_not():
    """tanh is odd: with k = 2 the rows (theta_0, theta_1) and (-theta_1, -theta_0) give the same weights (the reason
    fit_mle's random starts give the activation gate equal non-zero intercepts); with k = 3 the map changes them."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(9, 2))
    W, b = rng.normal(size=(2, 2)), rng.normal(size=2)
    spec = ms.MoE(gate="activation", k=2, d=2)
    np.testing.assert_allclose(_weights(spec, X, -W[::-1], -b[::-1], 0.7).numpy(), _weights(spec, X, W, b, 0.7).numpy(),
                               rtol=1e-13)
    W3, b3 = rng.normal(size=(3, 2)), rng.normal(size=3)
    spec3 = ms.MoE(gate="activation", k=3, d=2)
    assert not np.allclose(_weights(spec3, X, -W3[::-1], -b3[::-1]).numpy(), _weights(spec3, X, W3, b3).numpy(),
                           atol=1e-6)


@pytest.mark.parametrize("gate", ["activation", "softmax", "laplace"])
def test_simulate_divides_the_scores_by_the_spec_temperature(gate):
    """model='regression' with zero noise: y is the regression function with softmax(scores / tau), by hand."""
    spec = ms.MoE(gate=gate, k=2, d=1, temperature=0.4)
    p = ms.Params([0.5, -0.5], [[3.0], [-2.0]], [[1.0], [-1.5]], [0.5, -0.3], noise_sd=[0.0, 0.0])
    data = ms.simulate(spec, p, n=50, seed=0)
    X = data.X[0]
    z = X @ p.gate_weight.T + p.gate_bias
    s = {"activation": np.tanh(z), "softmax": z,
         "laplace": p.gate_bias - np.abs(X - p.gate_weight.T)}[gate] / 0.4
    pi = np.exp(s - s.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    f = (pi * (X @ p.expert_weight.T + p.expert_bias)).sum(1)
    np.testing.assert_allclose(data.y[0], f, rtol=1e-12, atol=1e-14)


def test_fit_lse_recovers_a_noise_free_activation_truth_from_a_near_truth_start():
    """k = k*, noise-free data: the least-squares fit reproduces the regression function (the registry's check:
    L2 < 1e-3), at a fixed temperature and with the temperature learned."""
    truth = ms.Params([0.5, 0.0], [[2.0, -1.0], [-1.0, 1.5]], [[1.0, 2.0], [-1.5, 0.5]], [0.5, -0.5])
    spec = ms.MoE(gate="activation", expert="linear", k=2, d=2, temperature=0.7)
    X = np.random.default_rng(0).uniform(-2, 2, (300, 2))
    X_new = np.random.default_rng(5).uniform(-2, 2, (2000, 2))
    for learn in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ms.exceptions.ConvergenceWarning)
            fit = ms.fit_lse(spec, X, spec.mean(truth, X), init="near_truth", truth=truth, seed=1, condition=False,
                             optimizer="lm", learn_temperature=learn)
        l2 = np.sqrt(np.mean((spec.mean(fit.params.select(0), X_new) - spec.mean(truth, X_new)) ** 2))
        assert l2 < 1e-3  # the threshold; a converged fit of noise-free data reaches ~1e-9
        assert fit.settings["kernel"] == "autograd"


def test_fit_mle_em_and_gradient_reach_the_same_maximum_for_the_activation_gate():
    """Two maximisers of one likelihood (EM's gradient gate step and L-BFGS), fixed temperature: same log-likelihood
    (tolerance: both stop at relative changes of 1e-12, far below 1e-6 of |loglik| ~ 400)."""
    spec = ms.MoE(gate="activation", k=2, d=1)
    truth = ms.Params([0.5, -0.5], [[3.0], [-2.0]], [[1.0], [-1.5]], [0.5, -0.3], noise_sd=[0.1, 0.1])
    data = ms.simulate(spec, truth, n=1000, seed=0, model="mixture")
    lls = [ms.fit_mle(spec, data.X[0], data.y[0], method=m, init=truth, restarts=0, tol=1e-12, gtol=1e-9).loglik
           for m in ("em", "gradient")]
    assert lls[0] == pytest.approx(lls[1], rel=1e-6)
