"""Permutation- and sign-aware errors for gated networks (moestat.metrics.gated)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.metrics import gated
from moestat.metrics.gated import match_regressors


def _values(frame):
    return frame.set_index("metric")["value"].to_dict()


def _truth(k=3, d=8):
    A = np.eye(d)[:k]
    W = np.zeros((k, d))
    W[: k - 1] = np.eye(d)[k: 2 * k - 1]
    return A, W


def test_sign_flip_scores_zero_paper_error_but_not_signed_l2():
    A, _ = _truth()
    flipped = A * np.array([[-1.0], [1.0], [-1.0]])
    v = _values(ms.regressor_error(flipped, A))
    assert v["E_reg"] == pytest.approx(0, abs=1e-12) and v["reg_l2_unsigned"] == pytest.approx(0, abs=1e-12)
    assert v["reg_l2"] == pytest.approx(2.0)


def test_relabelled_solution_scores_zero_everywhere():
    A, W = _truth()
    perm = np.array([2, 0, 1])
    inv = np.argsort(perm)
    A_hat = A[inv]                     # estimated expert perm[i] is true expert i
    W_hat = W[inv] - W[inv][-1] + 0.7  # relabelled, re-referenced elsewhere, common shift added
    v = {**_values(ms.regressor_error(A_hat, A)), **_values(ms.gating_error(W_hat, W, A_hat=A_hat, A_star=A))}
    assert all(abs(x) < 1e-12 for x in v.values()), v
    _, p = match_regressors(A_hat, A)
    assert p.tolist() == perm.tolist()


def test_k2_swap_maps_gate_to_its_negative():
    A, W = _truth(k=2)
    A_sw, W_sw = A[::-1], (W[::-1] - W[::-1][-1])
    assert np.allclose(W_sw[0], -W[0])
    assert _values(ms.gating_error(W_sw, W, A_hat=A_sw, A_star=A))["gate_l2"] == pytest.approx(0, abs=1e-12)
    # the same gate with unswapped regressors is wrong: the cosine error cannot see it, the signed l2 error can
    v = _values(ms.gating_error(W_sw, W, A_hat=A, A_star=A))
    assert v["E_gate"] == pytest.approx(0, abs=1e-12) and v["gate_l2"] == pytest.approx(2.0)


def test_wrong_solution_scores_positive():
    A, W = _truth()
    rot = A.copy()
    rot[0] = (A[0] + A[1]) / np.sqrt(2)
    assert _values(ms.regressor_error(rot, A))["E_reg"] == pytest.approx(1 - 1 / np.sqrt(2))
    assert _values(ms.gating_error(W * 1.1, W, perm=np.arange(3)))["gate_l2"] == pytest.approx(0.1)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(2, 5), seed=st.integers(0, 10_000))
def test_invariance_to_permutation_sign_and_scale(k, seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((k, 6))
    perm = rng.permutation(k)
    A_hat = A[perm] * rng.choice([-1.0, 1.0], size=(k, 1)) * rng.uniform(0.5, 2.0, size=(k, 1))
    e, p = match_regressors(A_hat, A)
    assert e == pytest.approx(0, abs=1e-10)
    assert np.allclose(np.abs(np.sum(A_hat[p] * A, 1)), np.linalg.norm(A_hat[p], axis=1) * np.linalg.norm(A, axis=1))


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 6), seed=st.integers(0, 10_000))
def test_bottleneck_matching_equals_brute_force(k, seed):
    rng = np.random.default_rng(seed)
    A_hat, A = rng.standard_normal((4, k, 5)), rng.standard_normal((k, 5))
    e_brute, _ = match_regressors(A_hat, A)
    saved = gated._BRUTE_FORCE_MAX_K
    gated._BRUTE_FORCE_MAX_K = 0
    try:
        e_bottle, _ = match_regressors(A_hat, A)
    finally:
        gated._BRUTE_FORCE_MAX_K = saved
    assert np.allclose(e_brute, e_bottle)
    # direct definition: 1 - max over permutations of min |cos|
    C = np.abs(np.einsum("bid,jd->bij", A_hat / np.linalg.norm(A_hat, axis=-1, keepdims=True),
                         A / np.linalg.norm(A, axis=-1, keepdims=True)))
    ref = 1 - np.max([C[:, list(p), range(k)].min(-1) for p in itertools.permutations(range(k))], axis=0)
    assert np.allclose(e_brute, ref)


def test_frames_are_tidy_with_restart_axis():
    A, W = _truth(k=2)
    A4 = np.broadcast_to(A, (3, 4, 2, 8))
    f = ms.regressor_error(A4, A)
    assert list(f.columns) == ["rep", "restart", "metric", "value"]
    assert len(f) == 3 * 4 * 4
    g = ms.gating_error(np.broadcast_to(W, (3, 2, 8)), W, A_hat=np.broadcast_to(A, (3, 2, 8)), A_star=A)
    assert set(g["metric"]) == {"E_gate", "gate_l2", "gate_fro"} and list(g.columns) == ["rep", "metric", "value"]


def test_shape_errors_name_the_argument():
    with pytest.raises(ValueError, match="A_star"):
        ms.regressor_error(np.zeros((2, 3)), np.zeros((3, 3)))
