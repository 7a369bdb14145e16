"""The residual Jacobian and exact Hessian of ``fit_lse``'s autograd reference path (``ReferenceKernel``).

Gates the fused kernels do not know (cosine, perturbed cosine, Laplace, Gaussian, quadratic, normalised sigmoid)
and a learned temperature take Newton's and Levenberg-Marquardt's J and H from
``ReferenceKernel.residual_derivatives``: plain autograd, each observation at its own copy of the parameters for J
(linear in n; ``torch.func.vmap(jacrev)`` was quadratic) and reverse over reverse for H.  Checked against
``torch.func``, central finite differences, the chunking over observations, and in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import moestat as ms
from moestat.fit import _objective
from moestat.fit._objective import ReferenceKernel

GATES = ["cosine", "perturbed_cosine", "laplace", "gaussian", "quadratic", "normalized_sigmoid"]


def _problem(gate: str, learn_temperature: bool = False, A: int = 3, n: int = 200, seed: int = 0):
    kernel = ReferenceKernel(ms.MoE(gate=gate, k=3, d=2, expert="gelu"), learn_temperature=learn_temperature)
    gen = torch.Generator().manual_seed(seed)
    theta = 0.7 * torch.randn(A, kernel.rows, 3, generator=gen, dtype=torch.float64)
    X = torch.cat([torch.ones(A, n, 1, dtype=torch.float64),
                   torch.rand(A, n, 2, generator=gen, dtype=torch.float64) * 2 - 1], -1)
    y = torch.randn(A, n, generator=gen, dtype=torch.float64)
    return kernel, theta, X, y


def _torch_func(kernel: ReferenceKernel, theta, X, y):
    """J and H the way the reference path took them before: ``torch.func`` per problem."""
    def resid(t, x, yy):
        return kernel._f(t[None, None], x[None])[0, 0] - yy

    A, n = y.shape
    P = theta[0].numel()
    J = torch.func.vmap(torch.func.jacrev(resid))(theta, X, y).reshape(A, n, P)
    H = torch.func.vmap(torch.func.hessian(lambda t, x, yy: 0.5 * resid(t, x, yy).square().sum()))(theta, X, y)
    return J, H.reshape(A, P, P)


@pytest.mark.parametrize(("gate", "learn_temperature"), [(g, False) for g in GATES] + [("softmax", True)])
def test_residual_derivatives_equal_torch_func(gate, learn_temperature):
    kernel, theta, X, y = _problem(gate, learn_temperature)
    r, J, H = kernel.residual_derivatives(theta, X, y, exact=True)
    J_ref, H_ref = _torch_func(kernel, theta, X, y)
    assert torch.equal(r, kernel.mean(theta.unsqueeze(1), X)[:, 0] - y)
    # the same double-precision derivatives in other orders of operations: agreement to rounding
    torch.testing.assert_close(J, J_ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(H, H_ref, rtol=1e-12, atol=1e-12)
    assert kernel.residual_derivatives(theta, X, y, exact=False)[2] is None


@pytest.mark.parametrize("gate", ["cosine", "laplace"])
def test_residual_derivatives_match_finite_differences(gate):
    kernel, theta, X, y = _problem(gate, A=2, n=60, seed=1)
    _, J, H = kernel.residual_derivatives(theta, X, y, exact=True)
    P, h = theta[0].numel(), 1e-6
    step = torch.eye(P, dtype=torch.float64).reshape(P, *theta.shape[1:])

    def residuals(th):
        return kernel.mean(th.unsqueeze(1), X)[:, 0] - y

    fd_J = torch.stack([(residuals(theta + h * step[j]) - residuals(theta - h * step[j])) / (2 * h)
                        for j in range(P)], -1)
    # central differences of residuals of order 1: O(h^2) truncation plus 1e-16 / h rounding, about 1e-10
    torch.testing.assert_close(J, fd_J, rtol=0, atol=1e-8)

    def gradient(th):  # of half the sum of squares: J^T r
        _, Jt, _ = kernel.residual_derivatives(th, X, y, exact=False)
        return (Jt.transpose(1, 2) @ residuals(th).unsqueeze(-1)).squeeze(-1)

    fd_H = torch.stack([(gradient(theta + h * step[j]) - gradient(theta - h * step[j])) / (2 * h) for j in range(P)],
                       -1)
    # differences of a gradient summed over 60 observations: about 60 x the rounding above
    torch.testing.assert_close(H, fd_H, rtol=0, atol=1e-6)


@pytest.mark.parametrize("gate", ["cosine", "gaussian"])
def test_jacobian_is_the_same_in_chunks_of_observations(gate, monkeypatch):
    kernel, theta, X, y = _problem(gate, A=3, n=100)
    _, J, _ = kernel.residual_derivatives(theta, X, y, exact=False)
    monkeypatch.setitem(_objective.JACOBIAN_CHUNK_ELEMENTS, "cpu", 3 * theta[0].numel() * 7)  # 7 observations
    _, J_chunks, _ = kernel.residual_derivatives(theta, X, y, exact=False)
    # the same formula per observation; torch's batched kernels round some entries differently at another batch
    # length (measured: up to 7e-17 relative, on about 4 % of the entries)
    torch.testing.assert_close(J_chunks, J, rtol=1e-15, atol=1e-15)


def test_a_cosine_least_squares_fit_loads_no_compiler():
    """A process's first Newton fit on the reference path (with its curvature certificate) leaves
    ``torch._dynamo`` unloaded (``torch.func`` loaded it: about 1 s of the first fit)."""
    code = """
import sys, numpy as np, moestat as ms
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, size=(300, 2)); y = np.tanh(X[:, 0]) + 0.1 * rng.normal(size=300)
fit = ms.fit_lse(ms.MoE(gate="cosine", k=2, d=2, expert="gelu"), X, y, seed=0, optimizer="newton")
assert np.isfinite(fit.objective).all() and fit.settings["kernel"] == "autograd"
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
