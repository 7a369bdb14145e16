"""The compact L-BFGS product H g (shared by the least-squares and likelihood engines) vs dense BFGS updates."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moestat.fit import _optim
from moestat.fit._optim import lbfgs_direction


def _dense_inverse_bfgs(pairs: list[tuple[np.ndarray, np.ndarray]], gamma: float, P: int) -> np.ndarray:
    """H from H0 = gamma I by the inverse BFGS update H <- (I - r s y')H(I - r y s') + r s s', oldest pair first."""
    H = gamma * np.eye(P)
    for s, y in pairs:
        r = 1.0 / (s @ y)
        V = np.eye(P) - r * np.outer(y, s)
        H = V.T @ H @ V + r * np.outer(s, s)
    return H


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(1, 8), n_pairs=st.integers(0, 12), P=st.integers(1, 9),
       skipped=st.integers(0, 3), compact=st.booleans())
def test_direction_equals_dense_bfgs_inverse(seed, m, n_pairs, P, skipped, compact):
    rng = np.random.default_rng(seed)
    A = 3
    Sh = np.zeros((A, m, P))
    Yh = np.zeros((A, m, P))
    rho = np.zeros((A, m))
    kept: list[list] = [[] for _ in range(A)]
    ptr = 0
    skip_at = set(rng.choice(max(n_pairs, 1), size=min(skipped, n_pairs), replace=False).tolist()) if n_pairs else set()
    for t in range(n_pairs):
        for a in range(A):
            s = rng.normal(size=P)
            y = s * rng.uniform(0.5, 2.0, size=P) + 0.1 * rng.normal(size=P)  # positive curvature s'y > 0
            if t in skip_at:  # a pair that failed the curvature test is stored as zeros with rho = 0
                Sh[a, ptr], Yh[a, ptr], rho[a, ptr] = 0.0, 0.0, 0.0
                kept[a].append(None)
            else:
                Sh[a, ptr], Yh[a, ptr], rho[a, ptr] = s, y, 1.0 / (s @ y)
                kept[a].append((s, y))
        ptr = (ptr + 1) % m
    gamma = rng.uniform(0.2, 3.0, size=A)
    g = rng.normal(size=(A, P))
    # both evaluations (the size switch picks one; force each in turn)
    fn = _optim._compact_direction if compact else _two_loop_only
    got = fn(*(torch.as_tensor(a) for a in (g, Sh, Yh, rho, gamma)), ptr).numpy()
    for a in range(A):
        recent = [p for p in kept[a][-m:] if p is not None]  # the ring buffer holds the last m slots
        H = _dense_inverse_bfgs(recent, gamma[a], P)
        np.testing.assert_allclose(got[a], H @ g[a], rtol=1e-8, atol=1e-10)


def _two_loop_only(*args):
    old = _optim._COMPACT_MAX_ELEMS
    _optim._COMPACT_MAX_ELEMS = -1
    try:
        return lbfgs_direction(*args)
    finally:
        _optim._COMPACT_MAX_ELEMS = old


def test_empty_memory_gives_scaled_gradient():
    g = torch.randn(4, 5, dtype=torch.float64)
    Sh = torch.zeros(4, 3, 5, dtype=torch.float64)
    gamma = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    out = lbfgs_direction(g, Sh, Sh.clone(), torch.zeros(4, 3, dtype=torch.float64), gamma, 0)
    assert torch.allclose(out, gamma[:, None] * g)
