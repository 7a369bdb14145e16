"""SQUAREM acceleration of the batched EM (Varadhan & Roland 2008): the same maxima as plain EM in fewer
iterations, and a recorded log-likelihood that never decreases (a jump below theta_1 is refused)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import moestat as ms
from moestat.fit.em import em_fit
from moestat.fit.mle import random_starts

GAUSS = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
GAUSS_TRUTH = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.5])
POIS = ms.MoE(gate="softmax", expert="linear", k=2, d=1, response="poisson")


def _gaussian(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = ms.simulate(GAUSS, GAUSS_TRUTH, n=300, reps=2, seed=seed, model="mixture")
    return torch.as_tensor(data.X), torch.as_tensor(data.y)


def _poisson(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two overlapping Poisson experts (log-rates 1 + x and 1.6 - x) with a weak gate: EM converges slowly."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (2, 300, 1))
    first = rng.uniform(size=(2, 300)) < 1 / (1 + np.exp(-X[..., 0]))
    y = rng.poisson(np.where(first, np.exp(1 + X[..., 0]), np.exp(1.6 - X[..., 0]))).astype(float)
    return torch.as_tensor(X), torch.as_tensor(y)


@pytest.mark.parametrize(("spec", "make", "seed"), [(GAUSS, _gaussian, 0), (POIS, _poisson, 2)])
def test_squarem_reaches_plain_em_maxima_in_fewer_iterations_and_never_descends(spec, make, seed):
    X, y = make(seed)
    init = random_starts(spec, X, y, 4, np.random.SeedSequence(seed).spawn(2))
    floor = (1e-3 * y.std(1)) ** 2
    plain = em_fit(spec, X, y, init, var_floor=floor, tol=1e-10, max_iter=2000, accelerate=False)
    fast = em_fit(spec, X, y, init, var_floor=floor, tol=1e-10, max_iter=2000, accelerate=True)
    assert bool(plain.converged.all()) and bool(fast.converged.all())
    # the same maximum from every start: both stop where a step changes l by <= 1e-10 (1 + |l|) relative, so they
    # agree to far below 1e-6 of |l| ~ 1e3 unless one stopped at another stationary point
    np.testing.assert_allclose(fast.loglik.numpy(), plain.loglik.numpy(), rtol=1e-9, atol=1e-6)
    assert int(fast.n_iter.sum()) < 0.7 * int(plain.n_iter.sum()), (fast.n_iter, plain.n_iter)
    hist = fast.history.numpy()
    steps = np.diff(hist, axis=0)
    # exact ascent up to float64 rounding of a sum of n log terms, as for plain EM
    assert (steps >= -1e-9 * (1 + np.abs(hist[1:]))).all()


def test_squarem_refuses_a_jump_that_lowers_the_likelihood(monkeypatch):
    """A jump forced far out (alpha multiplied by 1e6) lands where l is lower; EM must fall back to theta_2 and the
    recorded log-likelihood still never decreases and reaches the plain EM maximum."""
    import moestat.fit.em as em

    X, y = _gaussian(4)
    init = random_starts(GAUSS, X, y, 3, np.random.SeedSequence(4).spawn(2))
    floor = (1e-3 * y.std(1)) ** 2
    plain = em_fit(GAUSS, X, y, init, var_floor=floor, tol=1e-10, max_iter=2000, accelerate=False)
    real_clamp = torch.Tensor.clamp_max

    def wild(self: torch.Tensor, value):  # only the step length alpha is clamped at -1 in em_fit
        out = real_clamp(self, value)
        return out * 1e6 if value == -1.0 else out

    monkeypatch.setattr(torch.Tensor, "clamp_max", wild)
    forced = em.em_fit(GAUSS, X, y, init, var_floor=floor, tol=1e-10, max_iter=2000, accelerate=True)
    monkeypatch.undo()
    fast = em_fit(GAUSS, X, y, init, var_floor=floor, tol=1e-10, max_iter=2000, accelerate=True)
    # every jump refused: the forced run is plain EM with an extra E-step per cycle, so it needs more iterations
    assert int(forced.n_iter.sum()) > int(fast.n_iter.sum())
    hist = forced.history.numpy()
    assert (np.diff(hist, axis=0) >= -1e-9 * (1 + np.abs(hist[1:]))).all()
    np.testing.assert_allclose(forced.loglik.numpy(), plain.loglik.numpy(), rtol=1e-9, atol=1e-6)
