"""MoE model layer: mean, residual loss, Gaussian MoE log-likelihood, array contracts, errors."""

import numpy as np
import pytest
import torch
from scipy.special import expit, logsumexp, softmax
from scipy.stats import norm

import moestat as ms
from tests.test_params import make_params


def test_one_expert_mean_equals_the_expert():
    p = make_params(k=1, d=3, seed=1)
    X = np.random.default_rng(0).normal(size=(40, 3))
    spec = ms.MoE(gate="softmax", expert="tanh", k=1, d=3)
    expected = np.tanh(X @ p.expert_weight[0] + p.expert_bias[0])
    np.testing.assert_allclose(spec.mean(p, X), expected, rtol=1e-13)


def test_sigmoid_mean_equals_hand_sum():
    p = make_params(k=3, d=2, seed=2)
    X = np.random.default_rng(1).uniform(-1, 1, size=(25, 2))
    spec = ms.MoE(gate="sigmoid", expert="relu", k=3, d=2)
    hand = sum(expit(X @ p.gate_weight[i] + p.gate_bias[i]) *
               np.maximum(X @ p.expert_weight[i] + p.expert_bias[i], 0) for i in range(3))
    np.testing.assert_allclose(spec.mean(p, X), hand, rtol=1e-13)


def test_softmax_and_topk_mean_equal_hand_sum():
    p = make_params(k=4, d=2, seed=3)
    X = np.random.default_rng(2).normal(size=(30, 2))
    logits = X @ p.gate_weight.T + p.gate_bias
    h = X @ p.expert_weight.T + p.expert_bias
    np.testing.assert_allclose(ms.MoE(gate="softmax", k=4, d=2).mean(p, X),
                               (softmax(logits, axis=1) * h).sum(1), rtol=1e-13)
    top2 = np.argsort(-logits, axis=1)[:, :2]
    w = np.zeros_like(logits)
    np.put_along_axis(w, top2, softmax(np.take_along_axis(logits, top2, 1), axis=1), 1)
    np.testing.assert_allclose(ms.MoE(gate="topk", top_k=2, k=4, d=2).mean(p, X), (w * h).sum(1), rtol=1e-13)


def test_batched_params_broadcast_over_shared_X_and_per_replicate_X():
    p = make_params(R=3, k=2, d=2)
    spec = ms.MoE(gate="sigmoid", expert="linear", k=2, d=2)
    X = np.random.default_rng(0).normal(size=(10, 2))
    out = spec.mean(p, X)
    assert out.shape == (3, 10)
    np.testing.assert_allclose(out[1], spec.mean(p.select(1), X), rtol=1e-14)
    X3 = np.random.default_rng(1).normal(size=(3, 10, 2))
    np.testing.assert_allclose(spec.mean(p, X3)[2], spec.mean(p.select(2), X3[2]), rtol=1e-14)


def test_numpy_in_numpy_out_torch_in_torch_out():
    p = make_params(R=2, k=2, d=2)
    spec = ms.MoE(gate="softmax", expert="gelu", k=2, d=2)
    X = np.random.default_rng(0).normal(size=(2, 7, 2))
    y = np.random.default_rng(1).normal(size=(2, 7))
    a = spec.mean(p, X)
    b = spec.mean(p, torch.as_tensor(X))
    assert isinstance(a, np.ndarray) and isinstance(b, torch.Tensor) and b.device.type == "cpu"
    np.testing.assert_allclose(b.numpy(), a, rtol=1e-14)
    lt = spec.loglik(p, torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32))
    assert lt.dtype == torch.float32 and lt.shape == (2,)


def test_residual_loss_is_mean_squared_residual():
    p = make_params(R=2, k=2, d=2)
    spec = ms.MoE(gate="sigmoid", expert="relu", k=2, d=2)
    X = np.random.default_rng(0).normal(size=(2, 20, 2))
    y = np.random.default_rng(1).normal(size=(2, 20))
    np.testing.assert_allclose(spec.residual_loss(p, X, y), ((y - spec.mean(p, X)) ** 2).mean(1), rtol=1e-14)


@pytest.mark.parametrize("gate", ["softmax", "sigmoid", "topk"])
def test_loglik_matches_direct_scipy_computation(gate):
    p = make_params(R=2, k=3, d=2, noise=True, seed=4)
    spec = ms.MoE(gate=gate, expert="linear", k=3, d=2, top_k=2 if gate == "topk" else None)
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(2, 15, 2)), rng.normal(size=(2, 15))
    expected = []
    for r in range(2):
        logits = X[r] @ p.gate_weight[r].T + p.gate_bias[r]
        if gate == "softmax":
            w = softmax(logits, axis=1)
        elif gate == "sigmoid":
            s = expit(logits)
            w = s / s.sum(1, keepdims=True)
        else:
            w = np.zeros_like(logits)
            top = np.argsort(-logits, axis=1)[:, :2]
            np.put_along_axis(w, top, softmax(np.take_along_axis(logits, top, 1), axis=1), 1)
        mu = X[r] @ p.expert_weight[r].T + p.expert_bias[r]
        with np.errstate(divide="ignore"):
            dens = np.log(w) + norm.logpdf(y[r][:, None], mu, p.noise_sd[r])
        expected.append(logsumexp(dens, axis=1).sum())
    np.testing.assert_allclose(spec.loglik(p, X, y), expected, rtol=1e-12)


def test_loglik_uses_spec_noise_when_params_have_none():
    p = make_params(k=2, d=1, seed=6)
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1, noise_sd=0.3)
    X, y = np.array([[0.2], [-0.5]]), np.array([0.1, 0.4])
    with_sd = ms.Params(p.gate_bias, p.gate_weight, p.expert_weight, p.expert_bias, noise_sd=np.full(2, 0.3))
    np.testing.assert_allclose(spec.loglik(p, X, y), spec.loglik(with_sd, X, y), rtol=1e-14)


def test_with_k_and_n_params():
    spec = ms.MoE(gate="softmax", expert="relu", k=8, d=32)
    assert spec.with_k(9).k == 9 and spec.with_k(9).gate == "softmax"
    assert spec.n_params() == 7 * 33 + 8 * 33
    assert ms.MoE(gate="sigmoid", expert="constant", k=2, d=3).n_params() == 2 * 4 + 2


@pytest.mark.parametrize("kwargs, match", [
    (dict(gate="gausian"), "valid values"),
    (dict(expert="swish"), "valid names"),
    (dict(k=0), "k must be"),
    (dict(noise_sd=-0.1), "noise_sd"),
    (dict(gate="topk", k=2, top_k=3), "top_k=3 exceeds"),
    (dict(gate="topk", k=2), "needs top_k"),
    (dict(gate="softmax", top_k=1), "only used with gate='topk'"),
])
def test_bad_spec_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ms.MoE(**kwargs)


def test_bad_data_raise():
    p = make_params(k=2, d=2)
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=2)
    with pytest.raises(ValueError, match="X has 3 columns"):
        spec.mean(p, np.zeros((4, 3)))
    with pytest.raises(ValueError, match="X contains NaN"):
        spec.mean(p, np.array([[np.nan, 0.0]]))
    with pytest.raises(ValueError, match="y contains NaN"):
        spec.residual_loss(p, np.zeros((2, 2)), np.array([np.inf, 0.0]))
    with pytest.raises(ValueError, match="y has shape"):
        spec.residual_loss(p, np.zeros((2, 2)), np.zeros(3))
    with pytest.raises(ValueError, match="k=3 experts"):
        spec.mean(make_params(k=3, d=2), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="d=4"):
        spec.mean(make_params(k=2, d=4), np.zeros((2, 2)))
    with pytest.raises(TypeError, match=r"moestat\.Params"):
        spec.mean({"gate_bias": 0}, np.zeros((2, 2)))


def test_cpu_threads_sets_and_restores_torch_threads():
    from moestat._torch import cpu_threads

    before = torch.get_num_threads()
    with cpu_threads(1, torch.device("cpu")):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with cpu_threads(None, torch.device("cpu")):
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be"):
        with cpu_threads(0, torch.device("cpu")):
            pass


def test_normal_log_density_matches_scipy_for_sd_var_and_floats():
    from scipy.stats import norm

    from moestat.model import normal_log_density

    rng = np.random.default_rng(0)
    r = torch.tensor(rng.normal(size=(3, 5)), dtype=torch.float64)
    sd = torch.tensor(rng.uniform(0.2, 2.0, size=(3, 1)), dtype=torch.float64)
    expected = norm.logpdf(r.numpy(), scale=sd.numpy())
    np.testing.assert_allclose(normal_log_density(r, sd=sd).numpy(), expected, rtol=1e-13)
    np.testing.assert_allclose(normal_log_density(r, var=sd**2).numpy(), expected, rtol=1e-13)
    np.testing.assert_allclose(normal_log_density(r, sd=0.7).numpy(), norm.logpdf(r.numpy(), scale=0.7), rtol=1e-13)
    with pytest.raises(TypeError, match="exactly one"):
        normal_log_density(r)
    with pytest.raises(TypeError, match="exactly one"):
        normal_log_density(r, sd=sd, var=sd**2)
