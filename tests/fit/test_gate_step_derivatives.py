"""The derivatives of EM's gate step for gates other than softmax (``moestat.fit.em.gate_derivatives``).

They are plain autograd (reverse over reverse, the Hessian's rows in batched backward passes) instead of
``torch.func``, whose first use in a process imports torch's compiler.  Checked against ``torch.func`` and central
finite differences, for the chunking of the Hessian's rows and a pair's independence from the rest of its batch
(to the bit), and in a fresh interpreter.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import moestat as ms
from moestat.fit import _derivatives as derivatives
from moestat.fit import em
from moestat.fit._layout import ParamLayout

from .test_mle_gates import EM_GATES


def _problem(gate: str, A: int = 4, n: int = 300, seed: int = 0):
    """A gate, its layout, and A pairs of inputs, responsibilities (zero outside a top-K selection) and terms."""
    spec = ms.MoE(gate=gate, k=4, d=3, **({"top_k": 2} if gate == "topk" else {}))
    layout = ParamLayout(spec)
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(A, n, 3, generator=gen, dtype=torch.float64)
    tau = torch.softmax(torch.randn(A, 4, n, generator=gen, dtype=torch.float64), 1)
    theta = 0.5 * torch.randn(A, layout.n_gate, generator=gen, dtype=torch.float64)
    logw = em.gate_log_weights(spec, layout, theta, X)
    tau = torch.where(torch.isfinite(logw), tau, torch.zeros_like(tau))
    return spec, layout, X, tau, theta


def _q(spec, layout, X, tau, theta):
    return em.expected_gate_loglik(tau, em.gate_log_weights(spec, layout, theta, X))


@pytest.mark.parametrize("gate", EM_GATES)
def test_gate_derivatives_equal_torch_func(gate):
    spec, layout, X, tau, theta = _problem(gate)
    g, H = em.gate_derivatives(spec, layout, X, tau, theta)
    grad_one = torch.func.grad(lambda th, x, t: _q(spec, layout, x, t, th))
    g_ref = torch.func.vmap(grad_one)(theta, X, tau)
    H_ref = torch.func.vmap(torch.func.jacrev(grad_one))(theta, X, tau)
    # two batchings of the same double-precision derivatives: agreement to rounding (sums of 300 terms)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(H, H_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gate", ["sigmoid", "cosine", "gaussian", "topk"])
def test_gate_derivatives_match_finite_differences(gate):
    spec, layout, X, tau, theta = _problem(gate, A=2, n=200, seed=1)
    g, H = em.gate_derivatives(spec, layout, X, tau, theta)
    P, h = theta.shape[1], 1e-5
    eye = torch.eye(P, dtype=torch.float64)
    fd_g = torch.stack([(_q(spec, layout, X, tau, theta + h * eye[j]) - _q(spec, layout, X, tau, theta - h * eye[j]))
                        / (2 * h) for j in range(P)], -1)
    # central differences of Q (about -300 here): O(h^2) truncation plus 1e-16 * 300 / h rounding, about 1e-8
    torch.testing.assert_close(g, fd_g, rtol=0, atol=1e-6)
    fd_H = torch.stack([(em.gate_derivatives(spec, layout, X, tau, theta + h * eye[j])[0]
                         - em.gate_derivatives(spec, layout, X, tau, theta - h * eye[j])[0]) / (2 * h)
                        for j in range(P)], -1)
    torch.testing.assert_close(H, fd_H, rtol=0, atol=1e-5)


@pytest.mark.parametrize("gate", EM_GATES)
def test_a_pairs_derivatives_depend_neither_on_its_batch_nor_on_the_chunks(gate, monkeypatch):
    """The same numbers, to the bit, for two pairs in a batch of two and of five, and with the Hessian's rows in
    chunks of two or three instead of one pass: so a fit's arithmetic does not depend on how many pairs are active.
    (A pass with a single Hessian row gives other last bits for most gates at k = 4, d = 3, so chunks never have
    one; a batch of a single pair does too, as it did under ``torch.func``.)"""
    spec, layout, X, tau, theta = _problem(gate, A=5)
    g, H = em.gate_derivatives(spec, layout, X, tau, theta)
    g2, H2 = em.gate_derivatives(spec, layout, X[2:4], tau[2:4], theta[2:4])
    assert torch.equal(g[2:4], g2) and torch.equal(H[2:4], H2)
    monkeypatch.setitem(derivatives.HESSIAN_CHUNK_ELEMENTS, "cpu", 1)
    assert len(derivatives.hessian_chunks(theta.shape[1], 0)) > 1
    g_c, H_c = em.gate_derivatives(spec, layout, X, tau, theta)
    assert torch.equal(g_c, g) and torch.equal(H_c, H)


@given(st.integers(1, 200), st.integers(-1, 300))
def test_hessian_chunks_cover_every_row_in_balanced_chunks_of_at_least_two(P, rows):
    chunks = derivatives.hessian_chunks(P, rows)
    sizes = [stop - start for start, stop in chunks]
    assert chunks[0][0] == 0 and chunks[-1][1] == P
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 2 or P == 1
    assert max(sizes) <= max(rows, 2) or len(chunks) == max(1, P // 2)  # no larger than asked unless forced to


def test_a_sigmoid_em_fit_loads_no_compiler():
    """A process's first EM fit with a gate other than softmax leaves ``torch._dynamo`` unloaded (with
    ``torch.func`` it loaded it: about 1 s of the first fit)."""
    code = """
import sys, numpy as np, moestat as ms
rng = np.random.default_rng(0)
X = rng.normal(size=(200, 1)); y = np.where(X[:, 0] > 0, 1 + X[:, 0], -X[:, 0]) + 0.2 * rng.normal(size=200)
fit = ms.fit_mle(ms.MoE(gate="sigmoid", k=2, d=1), X, y, seed=0, method="em", restarts=2)
assert np.isfinite(fit.loglik)
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
