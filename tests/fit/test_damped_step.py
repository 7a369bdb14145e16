"""The damped Newton / LM step of ``fit._optim`` (issue 21): on a CPU each problem is factored and solved by itself,
on a GPU the batch at once, and both give the same steps and damping as an independent dense solve; the helpers that
replaced ``torch.where`` on (A, F, F) batches give the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.fit._objective import LSProblem, MeanKernel
from moestat.fit._optim import _damped_solve, _take_accepted
from moestat.fit.lse import _free_mask


def _batch(seed: int, A: int, F: int, indefinite: list[int]) -> tuple[torch.Tensor, ...]:
    """A batch of symmetric matrices, positive definite except those in ``indefinite`` (a negative eigenvalue of
    size up to 50x the damping scale, so several tenfold raises of the damping are needed), with b and D."""
    gen = torch.Generator().manual_seed(seed)
    J = torch.randn(A, 2 * F, F, dtype=torch.float64, generator=gen)
    H = J.transpose(1, 2) @ J / F
    for a in indefinite:
        v = torch.randn(F, dtype=torch.float64, generator=gen)
        v /= v.norm()
        H[a] -= (H[a].diagonal().max() * 50 * torch.rand(1, dtype=torch.float64, generator=gen)) * torch.outer(v, v)
    b = torch.randn(A, F, dtype=torch.float64, generator=gen)
    D = H.diagonal(dim1=1, dim2=2).abs()
    lam = torch.full((A,), 1e-3, dtype=torch.float64)
    return H, b, lam, D


def _dense_reference(H, b, lam, D, tries):
    """Each problem alone with numpy: raise lambda tenfold while H + lambda D has a non-positive eigenvalue, then
    solve densely (the step's definition, independent of Cholesky)."""
    steps, lams = [], []
    for Ha, ba, la, Da in zip(H.numpy(), b.numpy(), lam.numpy().copy(), D.numpy(), strict=True):
        M = Ha + la * np.diag(Da)
        for _ in range(tries):
            M = Ha + la * np.diag(Da)
            if np.linalg.eigvalsh(M).min() > 0:
                break
            la *= 10.0
        steps.append(np.linalg.solve(M, -ba))
        lams.append(la)
    return np.array(steps), np.array(lams)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), A=st.integers(1, 6), F=st.integers(2, 12),
       indefinite=st.sets(st.integers(0, 5), max_size=3))
def test_per_problem_and_batched_damped_solves_agree_with_a_dense_solve(seed, A, F, indefinite):
    H, b, lam, D = _batch(seed, A, F, [a for a in indefinite if a < A])
    tries = 40
    step_cpu, lam_cpu = _damped_solve(H, b, lam, D, tries, per_problem=True)
    step_gpu_path, lam_gpu_path = _damped_solve(H, b, lam, D, tries, per_problem=False)
    # the same damping: both raise each problem's lambda until its own matrix factors
    assert torch.equal(lam_cpu, lam_gpu_path)
    # the same factorisations (LAPACK per matrix in both paths); 1e-12 relative leaves room for a batched solve
    # that orders its sums differently
    torch.testing.assert_close(step_cpu, step_gpu_path, rtol=1e-12, atol=1e-12)
    ref_step, ref_lam = _dense_reference(H, b, lam, D, tries)
    # Cholesky's verdict and the smallest eigenvalue agree except within rounding of 0: none of these draws sits
    # there (the indefinite shifts are O(1) against O(1e-3) damping steps)
    np.testing.assert_array_equal(lam_cpu.numpy(), ref_lam)
    # a dense solve of a well-conditioned system (condition <= ~1e6 here) agrees to ~1e-10 relative
    np.testing.assert_allclose(step_cpu.numpy(), ref_step, rtol=1e-8, atol=1e-10)
    assert torch.equal(lam, torch.full((A,), 1e-3, dtype=torch.float64))  # the caller's lambda is not modified


def test_damping_that_never_factors_raises_lambda_every_try_and_gives_a_zero_step():
    H = -torch.eye(3, dtype=torch.float64).expand(2, 3, 3).clone()  # negative definite, D = 0: never factors
    D = torch.zeros(2, 3, dtype=torch.float64)
    b = torch.ones(2, 3, dtype=torch.float64)
    lam = torch.tensor([1e-3, 1.0], dtype=torch.float64)
    for per_problem in (True, False):
        step, lam_out = _damped_solve(H, b, lam, D, 5, per_problem=per_problem)
        torch.testing.assert_close(lam_out, lam * 1e5, rtol=0, atol=0)
        assert torch.isfinite(step).all()  # an undefined step is replaced by 0, never NaN


def test_take_accepted_equals_torch_where():
    gen = torch.Generator().manual_seed(3)
    new, old = torch.randn(5, 4, 4, generator=gen, dtype=torch.float64), torch.randn(5, 4, 4, generator=gen,
                                                                                      dtype=torch.float64)
    for accept in (torch.tensor([True, False, True, True, False]), torch.ones(5, dtype=torch.bool)):
        expected = torch.where(accept.view(-1, 1, 1), new, old)
        got = _take_accepted(accept, new.clone(), old, int(accept.sum()))
        assert torch.equal(got, expected)


@pytest.mark.parametrize("max_bytes", [None, 40_000])
def test_hessian_written_into_a_spare_buffer_equals_a_fresh_one(max_bytes):
    spec = ms.MoE(gate="softmax", expert="gelu", k=3, d=4)
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(2, 50, 4, dtype=torch.float64, generator=gen)
    y = torch.randn(2, 50, dtype=torch.float64, generator=gen)
    prob = LSProblem(MeanKernel.from_spec(spec), X, y, 1, _free_mask(spec, torch.device("cpu")))
    theta = 0.5 * torch.randn(2, prob.P, dtype=torch.float64, generator=gen)
    f, H, b = prob.gauss_newton(theta, exact=True, max_bytes=max_bytes)
    spare = torch.full_like(H, float("nan"))
    f2, H2, b2 = prob.gauss_newton(theta, exact=True, max_bytes=max_bytes, out=spare)
    assert H2.data_ptr() == spare.data_ptr()
    assert torch.equal(H2, H) and torch.equal(f2, f) and torch.equal(b2, b)
    wrong = torch.empty(1, *H.shape[1:], dtype=H.dtype)  # another batch size: ignored, H is fresh
    assert prob.gauss_newton(theta, exact=True, max_bytes=max_bytes, out=wrong)[1].data_ptr() != wrong.data_ptr()
