"""The gate registry: every gate against an independent formula, validity and stability at extreme inputs,
gradients against finite differences, declared invariances, likelihood normalisation, simulation and
noise-free least-squares recovery on the autograd reference path."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import multivariate_normal

import moestat as ms
from moestat import gates
from moestat.fit._objective import LSProblem, MeanKernel, ReferenceKernel

ALL = list(gates.GATES)
NEW = ["normalized_sigmoid", "laplace", "cosine", "perturbed_cosine", "quadratic", "gaussian"]
# gate -> MoE options used throughout (sparse variants of the normalised sigmoid are tested separately)
OPTIONS = {"topk": {"top_k": 2}, "normalized_sigmoid": {"top_k": 2, "n_shared": 1}}


def _spec(gate: str, k: int = 4, d: int = 3, **extra) -> ms.MoE:
    return ms.MoE(gate=gate, expert="linear", k=k, d=d, **{**OPTIONS.get(gate, {}), **extra})


def _gate_params(seed: int, k: int = 4, d: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(k, d)), rng.normal(size=k)


def _weights(spec: ms.MoE, X, W, b) -> torch.Tensor:
    X, W, b = (torch.as_tensor(a, dtype=torch.float64) for a in (X, W, b))
    return ms.gates.gate_weights(spec.gate, spec.gate_scores(X, W, b), top_k=spec.top_k,
                                 temperature=spec.temperature, n_shared=spec.n_shared)


def _np_softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ------------------------------------------------------------------ the registry
def test_registry_is_a_name_keyed_collection_of_gates():
    assert ALL == ["softmax", "sigmoid", "topk", *NEW, "activation"]
    for name, gate in gates.GATES.items():
        assert isinstance(gate, gates.Gate) and gate.name == name
        assert "temperature" in gate.options and gate.reference
        assert gate.normalization in ("softmax", "topk", "sigmoid", "normalized_sigmoid")
        assert gate.normalized == (gate.normalization != "sigmoid")
        assert gate.input_affine == (gate.scores is gates.gate_logits)
    assert "laplace" in ms.GATES and "gaussian" in list(ms.GATES)
    with pytest.raises(ValueError, match="valid values"):
        gates.get_gate("laplacian")
    with pytest.raises(ValueError, match="valid values"):
        ms.MoE(gate="laplacian")


# ------------------------------------------------------------------ formulas against independent computations
def test_score_formulas_match_direct_loops():
    rng = np.random.default_rng(0)
    X, (W, b) = rng.normal(size=(7, 3)) * 2, _gate_params(1)
    Xt, Wt, bt = (torch.as_tensor(a) for a in (X, W, b))
    eps = 0.3
    lap, cos, pcos, quad = (np.empty((7, 4)) for _ in range(4))
    for t in range(7):
        for i in range(4):
            x, w = X[t], W[i]
            lap[t, i] = b[i] - np.sqrt(sum((x[j] - w[j]) ** 2 for j in range(3)))
            cos[t, i] = b[i] + x @ w / (np.linalg.norm(x) * np.linalg.norm(w))
            pcos[t, i] = b[i] + x @ w / ((np.linalg.norm(x) + eps) * (np.linalg.norm(w) + eps))
            quad[t, i] = b[i] + x @ np.diag(w) @ x  # x^T A_i x with A_i = diag(w_i)
    # float64 round-off of sums of three terms
    np.testing.assert_allclose(gates.laplace_scores(Xt, Wt, bt).numpy(), lap, rtol=1e-13)
    np.testing.assert_allclose(gates.cosine_scores(Xt, Wt, bt).numpy(), cos, rtol=1e-13)
    np.testing.assert_allclose(gates.perturbed_cosine_scores(Xt, Wt, bt, eps=eps).numpy(), pcos, rtol=1e-13)
    np.testing.assert_allclose(gates.quadratic_scores(Xt, Wt, bt).numpy(), quad, rtol=1e-13)
    np.testing.assert_allclose(gates.gate_scores("perturbed_cosine", Xt, Wt, bt, eps=eps).numpy(), pcos, rtol=1e-13)


def test_gaussian_gate_is_the_posterior_of_a_unit_covariance_gaussian_mixture():
    """pi_i(x) = e^{b_i} N(x; w_i, I) / sum_j e^{b_j} N(x; w_j, I), with scipy's normal density."""
    rng = np.random.default_rng(2)
    X, (W, b) = rng.normal(size=(9, 3)), _gate_params(3)
    dens = np.stack([np.exp(b[i]) * multivariate_normal(W[i], np.eye(3)).pdf(X) for i in range(4)], -1)
    # float64 round-off of the densities' exponentials
    np.testing.assert_allclose(_weights(_spec("gaussian"), X, W, b).numpy(), dens / dens.sum(-1, keepdims=True),
                               rtol=1e-12)


@pytest.mark.parametrize("gate", ["laplace", "cosine", "perturbed_cosine", "quadratic"])
def test_softmax_family_weights_and_temperature(gate):
    """pi = softmax(s / tau) of the scores, rows sum to one."""
    rng = np.random.default_rng(4)
    X, (W, b) = rng.normal(size=(6, 3)), _gate_params(5)
    s = gates.gate_scores(gate, *(torch.as_tensor(a) for a in (X, W, b))).numpy()
    for tau in (1.0, 0.4):
        w = _weights(_spec(gate, temperature=tau), X, W, b).numpy()
        np.testing.assert_allclose(w, _np_softmax(s / tau), rtol=1e-13)  # float64 round-off
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-14)


def _brute_normalized_sigmoid(s: np.ndarray, top_k: int | None, n_shared: int) -> np.ndarray:
    out = np.zeros_like(s)
    for t, row in enumerate(s):
        routed = list(range(n_shared, len(row)))
        if top_k is not None:
            routed = sorted(routed, key=lambda i: -row[i])[:top_k]
        active = list(range(n_shared)) + routed
        sig = 1 / (1 + np.exp(-row[active]))
        out[t, active] = sig / sig.sum()
    return out


@pytest.mark.parametrize(("top_k", "n_shared"), [(None, 0), (2, 0), (1, 1), (2, 2), (None, 1)])
def test_normalized_sigmoid_matches_brute_force(top_k, n_shared):
    rng = np.random.default_rng(6)
    s = rng.normal(size=(8, 5)) * 2
    w = gates.gate_weights("normalized_sigmoid", torch.as_tensor(s), top_k=top_k, n_shared=n_shared).numpy()
    expected = _brute_normalized_sigmoid(s, top_k, n_shared)
    np.testing.assert_allclose(w, expected, rtol=1e-13, atol=1e-300)  # float64 round-off
    assert ((w > 0).sum(-1) == n_shared + (5 - n_shared if top_k is None else top_k)).all()
    # the expert axis may be any axis
    wt = gates.gate_weights("normalized_sigmoid", torch.as_tensor(s.T), top_k=top_k, n_shared=n_shared, dim=0)
    np.testing.assert_allclose(wt.numpy().T, expected, rtol=1e-13, atol=1e-300)


def test_dense_normalized_sigmoid_equals_the_sigmoid_likelihood_weights():
    z = torch.as_tensor(np.random.default_rng(7).normal(size=(5, 4)))
    np.testing.assert_allclose(gates.gate_weights("normalized_sigmoid", z).numpy(),
                               gates.log_mixture_weights("sigmoid", z).exp().numpy(), rtol=1e-13)


# ------------------------------------------------------------------ validity and stability
@pytest.mark.parametrize("gate", ALL)
def test_weights_valid_and_finite_at_extreme_inputs(gate):
    """Inputs and parameters of +-1e4: weights in [0, 1], rows summing to one where normalised, finite gradients."""
    spec = _spec(gate)
    X = torch.tensor([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [1e4, 1e4, 1e4], [0.0, 0.0, 0.0], [3.0, -2e4, 5e3]],
                     dtype=torch.float64)
    W = torch.tensor([[1e4, 0.0, -1e4], [-1.0, 2.0, 0.5], [1e4, 1e4, 1e4], [0.0, -3.0, 1.0]], dtype=torch.float64,
                     requires_grad=True)
    b = torch.tensor([1e4, -1e4, 0.0, 5.0], dtype=torch.float64, requires_grad=True)
    w = ms.gates.gate_weights(gate, spec.gate_scores(X, W, b), top_k=spec.top_k, n_shared=spec.n_shared)
    assert torch.isfinite(w).all() and (w >= 0).all() and (w <= 1).all()
    if gates.GATES[gate].normalized:
        np.testing.assert_allclose(w.sum(-1).detach().numpy(), 1.0, rtol=1e-12)
    (w * torch.arange(4.0, dtype=torch.float64)).sum().backward()
    assert torch.isfinite(W.grad).all() and torch.isfinite(b.grad).all()
    logw = gates.log_mixture_weights(gate, spec.gate_scores(X, W, b).detach(), top_k=spec.top_k,
                                     n_shared=spec.n_shared)
    assert not torch.isnan(logw).any()
    np.testing.assert_allclose(torch.logsumexp(logw, -1).numpy(), 0.0, atol=1e-12)


@pytest.mark.parametrize("gate", ALL)
def test_weights_valid_at_extreme_scores(gate):
    z = torch.tensor([[1e4, -1e4, 0.0, 5e3], [-1e4, -1e4, -1e4, -1e4], [1e4, 1e4, -1e4, 1e4]], dtype=torch.float64)
    spec = _spec(gate)
    w = gates.gate_weights(gate, z, top_k=spec.top_k, n_shared=spec.n_shared)
    assert torch.isfinite(w).all() and (w >= 0).all()
    if gates.GATES[gate].normalized:
        np.testing.assert_allclose(w.sum(-1).numpy(), 1.0, rtol=1e-12)


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("gate", ALL)
def test_gradient_in_gate_parameters_matches_finite_differences(gate):
    spec = _spec(gate, temperature=0.8)
    rng = np.random.default_rng(8)
    X = torch.as_tensor(rng.normal(size=(6, 3)) * 1.5)
    W0, b0 = (torch.as_tensor(a).requires_grad_(True) for a in _gate_params(9))

    def weights(W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return gates.gate_weights(gate, spec.gate_scores(X, W, b), top_k=spec.top_k, temperature=spec.temperature,
                                  n_shared=spec.n_shared)

    assert torch.autograd.gradcheck(weights, (W0, b0), eps=1e-6, atol=1e-8, rtol=1e-6)


# ------------------------------------------------------------------ invariances
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), shift=st.floats(-50, 50), gate=st.sampled_from(ALL))
def test_declared_translation_invariance(seed, shift, gate):
    """A gate declared translation-invariant ignores a common intercept shift, and its row shift (where it has
    one) leaves the weights unchanged; a gate declared otherwise changes."""
    spec, g = _spec(gate), gates.GATES[gate]
    rng = np.random.default_rng(seed)
    X, (W, b) = rng.normal(size=(5, 3)), _gate_params(seed % 1000)
    base = _weights(spec, X, W, b).numpy()
    moved = _weights(spec, X, W, b + shift).numpy()
    if g.translation_invariant:
        np.testing.assert_allclose(moved, base, atol=1e-10)  # float64 round-off after a shift of up to 50
    elif abs(shift) > 1e-2:
        assert not np.allclose(moved, base, atol=1e-6)
    if g.row_shift is not None:
        t = rng.normal(size=3) * 2.0
        if gate == "perturbed_cosine":  # a local invariance: g(w_i) + t must stay in the unit ball
            norms = np.linalg.norm(W, axis=1)
            t *= 0.5 * (1 - (norms / (norms + gates.PERTURBED_COSINE_EPS)).max()) / np.linalg.norm(t)
        t = torch.as_tensor(t)
        W2, b2 = g.row_shift(torch.as_tensor(W), torch.as_tensor(b), t)
        assert not np.allclose(W2.numpy(), W)
        np.testing.assert_allclose(_weights(spec, X, W2, b2).numpy(), base, atol=1e-10)


@pytest.mark.parametrize("gate", ALL)
def test_n_params_is_the_rank_of_the_gate_jacobian(gate):
    """k(d+1) - n_redundant equals the numerical rank of d pi(x) / d(gate parameters) over many inputs."""
    k, d = 4, 3
    spec = ms.MoE(gate=gate, expert="linear", k=k, d=d, top_k=4 if gate == "topk" else None)
    rng = np.random.default_rng(10)
    X = torch.as_tensor(rng.normal(size=(40, d)))
    W, b = (torch.as_tensor(a) for a in _gate_params(11, k, d))

    def weights(theta: torch.Tensor) -> torch.Tensor:
        return _weights(spec, X, theta[: k * d].reshape(k, d), theta[k * d:]).reshape(-1)

    J = torch.func.jacfwd(weights)(torch.cat([W.reshape(-1), b]))
    rank = int(torch.linalg.matrix_rank(J, rtol=1e-9))  # singular values of an invariance are ~1e-16
    assert rank == k * (d + 1) - gates.GATES[gate].n_redundant(k, d)
    assert spec.n_params() - spec.n_params(identified=False) == rank - k * (d + 1)


# ------------------------------------------------------------------ the model
@pytest.mark.parametrize("gate", ALL)
def test_loglik_is_the_normalised_mixture_density(gate):
    spec = _spec(gate)
    rng = np.random.default_rng(12)
    W, b = _gate_params(13)
    p = ms.Params(b, W, rng.normal(size=(4, 3)), rng.normal(size=4), noise_sd=[0.5, 0.8, 1.0, 1.3])
    X, y = rng.normal(size=(10, 3)), rng.normal(size=10)
    w = _weights(spec, X, W, b).numpy()
    w = w / w.sum(-1, keepdims=True)  # the mixture weights: sigmoid gates divided by their sum, others as they are
    mu = X @ p.expert_weight.T + p.expert_bias
    dens = np.exp(-0.5 * ((y[:, None] - mu) / p.noise_sd) ** 2) / (np.sqrt(2 * np.pi) * p.noise_sd)
    expected = np.log((w * dens).sum(-1))
    np.testing.assert_allclose(spec.loglik(p, X, y, reduce="none"), expected, rtol=1e-12)  # float64 round-off
    np.testing.assert_allclose(spec.mean(p, X), (_weights(spec, X, W, b).numpy() * mu).sum(-1), rtol=1e-12)


@pytest.mark.parametrize("gate", NEW)
@pytest.mark.parametrize("model", ["regression", "mixture"])
def test_simulate_every_gate(gate, model):
    spec = _spec(gate)
    W, b = _gate_params(14)
    p = ms.Params(b, W, np.ones((4, 3)), np.arange(4.0), noise_sd=[0.1] * 4)
    data = ms.simulate(spec, p, n=50, reps=2, seed=0, model=model)
    assert data.X.shape == (2, 50, 3) and np.isfinite(data.y).all()


def test_moe_gate_options_are_checked():
    with pytest.raises(ValueError, match="only used with gate='topk' or gate='normalized_sigmoid', not gate='laplace'"):
        ms.MoE(gate="laplace", k=3, top_k=2)
    with pytest.raises(ValueError, match="n_shared is only used"):
        ms.MoE(gate="softmax", k=3, n_shared=1)
    with pytest.raises(ValueError, match="gate_eps is only used"):
        ms.MoE(gate="cosine", k=3, gate_eps=0.1)
    with pytest.raises(ValueError, match="gate_eps must be a finite number > 0"):
        ms.MoE(gate="perturbed_cosine", k=3, gate_eps=0.0)
    with pytest.raises(ValueError, match="leaves no routed expert"):
        ms.MoE(gate="normalized_sigmoid", k=3, n_shared=3)
    with pytest.raises(ValueError, match="top_k=3 exceeds the k - n_shared = 2 routed experts"):
        ms.MoE(gate="normalized_sigmoid", k=3, n_shared=1, top_k=3)
    with pytest.raises(ValueError, match="top_k=2 exceeds the k - n_shared = 1 routed"):
        gates.gate_weights("normalized_sigmoid", torch.zeros(2, 3), top_k=2, n_shared=2)
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        gates.perturbed_cosine_scores(torch.ones(2, 1), torch.ones(3, 1), torch.zeros(3), eps=-1.0)
    spec = ms.MoE(gate="normalized_sigmoid", k=3, n_shared=1, top_k=2)
    with pytest.raises(ValueError, match="smaller than top_k=2 \\+ n_shared=1"):
        spec.with_k(2)
    eps = ms.MoE(gate="perturbed_cosine", k=2, d=2, gate_eps=0.5)
    X, W, b = torch.ones(1, 2), torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.zeros(2)
    np.testing.assert_allclose(eps.gate_scores(X, W, b).numpy(),
                               [[1 / ((1.5) * (np.sqrt(2) + 0.5)), 2 / (2.5 * (np.sqrt(2) + 0.5))]], rtol=1e-6)


# ------------------------------------------------------------------ least squares on the reference path
def test_reference_kernel_matches_the_fused_kernel_on_a_softmax_gate():
    """Two implementations of the same objective: autograd + torch.func against the hand-derived kernel."""
    spec = ms.MoE(gate="softmax", expert="tanh", k=3, d=2, temperature=0.7)
    torch.manual_seed(0)
    R, S, n = 2, 2, 80
    X, y = torch.rand(R, n, 2, dtype=torch.float64) * 2 - 1, torch.randn(R, n, dtype=torch.float64)
    free = torch.ones(6, 3, dtype=torch.bool)
    fused = LSProblem(MeanKernel.from_spec(spec), X, y, S, free)
    ref = LSProblem(ReferenceKernel(spec), X, y, S, free)
    theta = torch.randn(R * S, 18, dtype=torch.float64)
    for a, b in zip(fused.value_grad(theta), ref.value_grad(theta), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)  # float64 round-off of sums over n = 80
    for exact in (False, True):
        for a, b in zip(fused.gauss_newton(theta, exact=exact), ref.gauss_newton(theta, exact=exact), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


_TRUTH = {  # k* = 2 or 3 atoms in d = 2, experts distinct; the cosine gate needs d >= 2 (in d = 1 it is sign(w x))
    "normalized_sigmoid": ([0.5, 0.0, -0.3], [[2.0, -1.0], [-1.0, 1.5], [0.5, 0.5]]),
    "laplace": ([0.5, 0.0], [[1.0, -0.5], [-1.0, 0.5]]),
    "cosine": ([0.5, 0.0], [[1.0, -0.5], [-1.0, 1.5]]),
    "perturbed_cosine": ([0.5, 0.0], [[2.0, -1.0], [-1.0, 1.5]]),
    "quadratic": ([0.5, 0.0], [[2.0, -1.0], [-1.0, 1.5]]),
    "gaussian": ([0.5, 0.0], [[1.0, -0.5], [-1.0, 0.5]]),
}


@pytest.mark.parametrize("gate", NEW)
def test_fit_lse_recovers_a_noise_free_truth_from_a_near_truth_start(gate):
    """k = k*, noise-free data: the least-squares fit reproduces the regression function (issue check: L2 < 1e-3)."""
    gb, gw = _TRUTH[gate]
    k = len(gb)
    truth = ms.Params(gb, gw, [[1.0, 2.0], [-1.5, 0.5], [0.0, 1.0]][:k], [0.5, -0.5, 0.2][:k])
    spec = ms.MoE(gate=gate, expert="linear", k=k, d=2)  # dense: top-K selections make the objective discontinuous
    X = np.random.default_rng(0).uniform(-2, 2, (300, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ms.exceptions.ConvergenceWarning)
        fit = ms.fit_lse(spec, X, spec.mean(truth, X), init="near_truth", truth=truth, seed=1, condition=False)
    X_new = np.random.default_rng(5).uniform(-2, 2, (2000, 2))
    l2 = np.sqrt(np.mean((spec.mean(fit.params.select(0), X_new) - spec.mean(truth, X_new)) ** 2))
    assert l2 < 1e-3  # the threshold; a converged fit of noise-free data reaches ~1e-9
    assert fit.settings["kernel"] == "autograd" and gate in fit.settings["kernel_note"]


def test_fit_lse_fits_non_affine_gates_on_the_inputs_as_given():
    """Rescaling the inputs is exact only for gates affine in x: a Laplace fit at input scale 1e3 is not rescaled."""
    spec = ms.MoE(gate="laplace", expert="linear", k=2, d=1)
    truth = ms.Params([0.3, 0.0], [[500.0], [-500.0]], [[0.002], [-0.001]], [0.5, -0.5])
    X = np.random.default_rng(1).uniform(-2000, 2000, (200, 1))
    fit = ms.fit_lse(spec, X, spec.mean(truth, X), init=truth, seed=0, condition=False, max_iter=3)
    assert fit.settings["input_scale"] is None
    # started at the truth: the objective of noise-free data is 0 up to round-off
    assert fit.objective[0] < 1e-20
