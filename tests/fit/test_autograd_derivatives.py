"""The plain-autograd derivatives of MLE fit results: replicate Hessians and pointwise gradients.

``moestat.fit._derivatives.replicate_hessians`` and ``pointwise_gradients`` replace ``torch.func`` transforms, whose
first use loads ``torch._dynamo`` (about 1 s).  Each is checked against an independent computation: ``torch.func``
itself, one autograd call per row, and central finite differences.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from moestat.fit._derivatives import pointwise_gradients, replicate_hessians


def _quartic(theta: torch.Tensor) -> torch.Tensor:
    """Per-replicate terms that couple every pair of coordinates, summed over R replicates."""
    return (torch.logsumexp(theta[:, :, None] * theta[:, None, :], dim=(1, 2)) + theta.sin().prod(-1)).sum()


def test_replicate_hessians_equal_torch_func_and_finite_differences():
    theta = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    H = replicate_hessians(_quartic, theta)
    ref = torch.func.vmap(torch.func.hessian(lambda t: _quartic(t.unsqueeze(0))))(theta)
    # two orders of the same double-precision derivative: agreement to rounding
    torch.testing.assert_close(H, ref, rtol=1e-12, atol=1e-12)
    h, eye = 1e-4, torch.eye(5, dtype=torch.float64)
    fd = torch.empty_like(H)
    for r in range(4):
        one = lambda t: float(_quartic(t.unsqueeze(0)))  # noqa: E731
        for i in range(5):
            for j in range(5):
                e, f = h * eye[i], h * eye[j]
                fd[r, i, j] = (one(theta[r] + e + f) - one(theta[r] + e - f) - one(theta[r] - e + f)
                               + one(theta[r] - e - f)) / (4 * h * h)
    # central differences: O(h^2) = 1e-8 truncation plus 1e-16 / h^2 = 1e-8 rounding
    torch.testing.assert_close(H, fd, rtol=0, atol=1e-6)


def test_pointwise_gradients_equal_one_autograd_call_per_row():
    gen = torch.Generator().manual_seed(1)
    theta = torch.randn(3, dtype=torch.float64, generator=gen)
    X = torch.randn(9000, 2, dtype=torch.float64, generator=gen)  # three chunks of rows

    def fn(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # (A, P), (A, 1, 2) -> (A, 1)
        return torch.tanh(x @ t[:, :2, None]).squeeze(-1) * t[:, 2:] ** 2

    values, grads = pointwise_gradients(fn, theta, X)
    assert values.shape == (9000,) and grads.shape == (9000, 3)
    for t in (0, 4095, 4096, 8999):  # either side of a chunk boundary
        th = theta.clone().requires_grad_(True)
        v = fn(th.unsqueeze(0), X[t].reshape(1, 1, 2))[0, 0]
        (g,) = torch.autograd.grad(v, th)
        assert float(values[t]) == pytest.approx(float(v), rel=1e-14)
        torch.testing.assert_close(grads[t], g, rtol=1e-13, atol=1e-15)


def test_standard_errors_and_predictions_load_no_compiler():
    """A fit's first standard errors, scores and delta-method predictions in a fresh interpreter leave
    ``torch._dynamo`` unloaded (with ``torch.func`` they loaded it: about 1 s of the first call)."""
    code = """
import sys, numpy as np, moestat as ms
rng = np.random.default_rng(0)
X = rng.normal(size=(200, 1)); y = np.where(X[:, 0] > 0, 1 + X[:, 0], -X[:, 0]) + 0.2 * rng.normal(size=200)
fit = ms.fit_mle(ms.MoE(k=2, d=1), X, y, seed=0)
fit.bse(); fit.bse("sandwich"); fit.predict(X[:5], "mean_ci")
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_fit_hessian_is_symmetric_and_matches_torch_func_on_a_batched_fit():
    import moestat as ms

    rng = np.random.default_rng(2)
    X = rng.normal(size=(3, 300, 2))
    y = np.where(X[..., 0] > 0, 1 + X[..., 1], -X[..., 0]) + 0.3 * rng.normal(size=(3, 300))
    fit = ms.fit_mle(ms.MoE(k=2, d=2), X, y, seed=0)
    H = torch.as_tensor(fit.hessian())
    f, (Xt, yt, w) = fit._f_obs(), fit._data_args()
    ref = torch.func.vmap(torch.func.hessian(lambda t, x, yy, ww: (f(t, x, yy) * ww).sum()))(fit._theta, Xt, yt, w)
    torch.testing.assert_close(H, ref, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(H, H.transpose(1, 2), rtol=1e-13, atol=1e-9)
