"""Params: validation, replicate axis, permutation, softmax normalisation, tidy frames."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import moestat as ms


def make_params(R=None, k=3, d=2, seed=0, noise=False):
    rng = np.random.default_rng(seed)
    lead = () if R is None else (R,)
    return ms.Params(
        gate_bias=rng.normal(size=(*lead, k)), gate_weight=rng.normal(size=(*lead, k, d)),
        expert_weight=rng.normal(size=(*lead, k, d)), expert_bias=rng.normal(size=(*lead, k)),
        noise_sd=rng.uniform(0.1, 1, size=(*lead, k)) if noise else None,
    )


def test_shapes_and_properties():
    p = make_params(R=4, k=3, d=2)
    assert (p.k, p.d, p.n_reps, p.is_batched) == (3, 2, 4, True)
    q = make_params(k=5, d=7)
    assert (q.k, q.d, q.n_reps, q.is_batched) == (5, 7, None, False)


def test_to_frame_roundtrip_and_columns():
    p = make_params(R=2, k=3, d=4, noise=True)
    f = p.to_frame()
    assert list(f.columns) == ["rep", "atom", "block", "coord", "value"]
    assert len(f) == 2 * 3 * (1 + 4 + 4 + 1 + 1)
    assert ms.Params.from_frame(f).allclose(p, rtol=0, atol=0)
    row = f[(f.block == "gate_weight") & (f.rep == 1) & (f.atom == 2) & (f.coord == 3)]
    assert row["value"].item() == p.gate_weight[1, 2, 3]


def test_select_stack_batched():
    p = make_params(R=3)
    assert p.select(1).allclose(ms.Params.stack([p.select(1)]).select(0))
    assert ms.Params.stack([p.select(i) for i in range(3)]).allclose(p)
    b = make_params().batched(5)
    assert b.n_reps == 5 and np.allclose(b.gate_weight[4], b.gate_weight[0])
    assert p.select([2, 0]).allclose(ms.Params.stack([p.select(2), p.select(0)]))


def test_torch_roundtrip_keeps_values():
    p = make_params(R=2, noise=True)
    t = p.to_torch("cpu", torch.float64)
    assert t.is_torch and isinstance(t.gate_weight, torch.Tensor)
    assert t.numpy().allclose(p, rtol=0, atol=0)


@given(st.permutations(list(range(4))))
def test_permute_relabels_and_inverts(perm):
    p = make_params(R=2, k=4)
    q = p.permute(perm)
    np.testing.assert_array_equal(q.expert_weight[:, 0], p.expert_weight[:, perm[0]])
    inverse = np.argsort(perm)
    assert q.permute(inverse).allclose(p, rtol=0, atol=0)


def test_per_replicate_permutation():
    p = make_params(R=2, k=3)
    perm = np.array([[2, 0, 1], [0, 1, 2]])
    q = p.permute(perm)
    np.testing.assert_array_equal(q.gate_bias[0], p.gate_bias[0][[2, 0, 1]])
    np.testing.assert_array_equal(q.gate_bias[1], p.gate_bias[1])


def test_permutation_leaves_the_model_invariant():
    p = make_params(R=2, k=4, d=3)
    X = np.random.default_rng(5).uniform(-1, 1, size=(2, 50, 3))
    for gate in ("softmax", "sigmoid"):
        spec = ms.MoE(gate=gate, expert="gelu", k=4, d=3)
        np.testing.assert_allclose(spec.mean(p.permute([3, 1, 0, 2]), X), spec.mean(p, X), rtol=1e-13)


def test_normalize_softmax_removes_translation():
    p = make_params(R=2, k=4, d=3)
    q = p.normalize_softmax(ref=-1)
    assert np.allclose(q.gate_bias[:, -1], 0) and np.allclose(q.gate_weight[:, -1], 0)
    shifted = ms.Params(p.gate_bias + 3.0, p.gate_weight + np.array([1.0, -2.0, 0.5]),
                        p.expert_weight, p.expert_bias)
    assert shifted.normalize_softmax().allclose(q)
    spec = ms.MoE(gate="softmax", expert="linear", k=4, d=3)
    X = np.random.default_rng(0).normal(size=(2, 30, 3))
    np.testing.assert_allclose(spec.mean(q, X), spec.mean(p, X), rtol=1e-12)


def test_perturb_is_seeded_and_scaled():
    p = make_params(R=2)
    a, b = p.perturb(0.1, seed=3), p.perturb(0.1, seed=3)
    assert a.allclose(b, rtol=0, atol=0) and not a.allclose(p)
    assert p.perturb(0.0, seed=1).allclose(p, rtol=0, atol=0)


@pytest.mark.parametrize("bad, match", [
    (dict(gate_weight=np.zeros((3, 5))), "gate_bias"),  # k mismatch
    (dict(expert_weight=np.zeros((2, 3))), "expert_weight"),  # d mismatch
    (dict(expert_bias=np.zeros(4)), "expert_bias"),
    (dict(noise_sd=np.array([0.1, -1.0])), "non-negative"),
    (dict(gate_bias=np.array([np.nan, 0.0])), "NaN"),
    (dict(gate_bias=np.zeros((1, 1, 2))), r"shape \(k,\) or \(R, k\)"),
])
def test_inconsistent_params_raise(bad, match):
    base = dict(gate_bias=np.zeros(2), gate_weight=np.zeros((2, 2)), expert_weight=np.zeros((2, 2)),
                expert_bias=np.zeros(2))
    base.update(bad)
    with pytest.raises(ValueError, match=match):
        ms.Params(**base)


def test_bad_permutation_and_select():
    p = make_params(R=2, k=3)
    with pytest.raises(ValueError, match="permutation"):
        p.permute([0, 0, 1])
    with pytest.raises(IndexError):
        p.select(5)
    with pytest.raises(ValueError, match="batched"):
        make_params().select(0)
