"""Gates against direct formulas, normalisation, sparsity, stability and translation invariance."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from moestat import gates


def _logits(seed=0, shape=(4, 7, 5)):
    return torch.as_tensor(np.random.default_rng(seed).normal(size=shape) * 3, dtype=torch.float64)


def test_softmax_matches_direct_formula_and_rows_sum_to_one():
    z = _logits()
    e = np.exp(z.numpy())
    direct = e / e.sum(-1, keepdims=True)
    out = gates.softmax_gate(z)
    np.testing.assert_allclose(out.numpy(), direct, rtol=1e-13)
    np.testing.assert_allclose(out.sum(-1).numpy(), 1.0, rtol=1e-14)


def test_temperature_divides_logits():
    z = _logits(1)
    np.testing.assert_allclose(gates.softmax_gate(z, temperature=2.5).numpy(),
                               gates.softmax_gate(z / 2.5).numpy(), rtol=1e-14)
    np.testing.assert_allclose(gates.sigmoid_gate(z, temperature=0.5).numpy(),
                               1 / (1 + np.exp(-z.numpy() / 0.5)), rtol=1e-13)


def test_sigmoid_is_independent_per_expert():
    z = _logits(2)
    out = gates.sigmoid_gate(z).numpy()
    np.testing.assert_allclose(out, 1 / (1 + np.exp(-z.numpy())), rtol=1e-13)
    assert not np.allclose(out.sum(-1), 1.0)  # weights need not sum to one


@pytest.mark.parametrize("top_k", [1, 2, 4, 5])
def test_topk_has_exactly_k_nonzeros_and_matches_formula(top_k):
    z = _logits(3)
    out = gates.topk_softmax_gate(z, top_k).numpy()
    assert ((out > 0).sum(-1) == top_k).all()
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-14)
    zn = z.numpy()
    order = np.argsort(-zn, axis=-1)[..., :top_k]
    expected = np.zeros_like(zn)
    sel = np.take_along_axis(zn, order, -1)
    w = np.exp(sel - sel.max(-1, keepdims=True))
    np.put_along_axis(expected, order, w / w.sum(-1, keepdims=True), -1)
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize("name", ["softmax", "sigmoid", "topk"])
def test_stable_at_huge_logits(name):
    z = torch.tensor([[1e4, -1e4, 0.0, 5e3], [-1e4, -1e4, -1e4, -1e4]], dtype=torch.float64,
                     requires_grad=True)
    out = gates.gate_weights(name, z, top_k=2)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(z.grad).all()
    logw = gates.log_mixture_weights(name, z.detach(), top_k=2)
    assert not torch.isnan(logw).any()
    np.testing.assert_allclose(torch.logsumexp(logw, -1).numpy(), 0.0, atol=1e-12)


@given(arrays(np.float64, (3, 6), elements=st.floats(-50, 50)), st.floats(-1e3, 1e3))
def test_softmax_translation_invariance(z, shift):
    zt = torch.as_tensor(z)
    a = gates.softmax_gate(zt).numpy()
    b = gates.softmax_gate(zt + shift).numpy()
    np.testing.assert_allclose(a, b, atol=1e-12)


@given(arrays(np.float64, (6,), elements=st.floats(-20, 20)))
def test_log_mixture_weights_normalise_sigmoid(z):
    zt = torch.as_tensor(z)
    w = torch.exp(gates.log_mixture_weights("sigmoid", zt)).numpy()
    s = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(w, s / s.sum(), rtol=1e-12)


def test_gate_errors():
    z = _logits()
    with pytest.raises(ValueError, match="top_k=9 exceeds"):
        gates.topk_softmax_gate(z, 9)
    with pytest.raises(ValueError, match="valid values"):
        gates.gate_weights("laplacian", z)
    with pytest.raises(ValueError, match="needs top_k"):
        gates.gate_weights("topk", z)
    with pytest.raises(ValueError, match="temperature"):
        gates.softmax_gate(z, temperature=0.0)
