"""Experts against direct numpy/scipy formulas; numpy and torch entry points agree."""

import numpy as np
import pytest
import torch
from scipy.special import erf, expit

from moestat import experts

DIRECT = {
    "linear": lambda z: z,
    "relu": lambda z: np.maximum(z, 0.0),
    "gelu": lambda z: 0.5 * z * (1 + erf(z / np.sqrt(2))),
    "tanh": np.tanh,
    "sigmoid": expit,
    "poly2": lambda z: z**2,
    "poly3": lambda z: z**3,
}


def _inputs(seed=0, R=3, n=11, k=4, d=5):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(R, n, d)), rng.normal(size=(R, k, d)), rng.normal(size=(R, k))


@pytest.mark.parametrize("name", sorted(DIRECT))
def test_ridge_expert_matches_direct_formula(name):
    X, W, b = _inputs()
    z = np.einsum("rnd,rkd->rnk", X, W) + b[:, None, :]
    out = experts.get_expert(name)(X, W, b)
    assert isinstance(out, np.ndarray) and out.shape == (3, 11, 4)
    np.testing.assert_allclose(out, DIRECT[name](z), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", [*sorted(DIRECT), "constant"])
def test_numpy_and_torch_entry_points_agree(name):
    X, W, b = _inputs(1)
    fam = experts.get_expert(name)
    out_np = fam(X, W, b)
    out_t = fam(torch.as_tensor(X), torch.as_tensor(W), torch.as_tensor(b))
    assert isinstance(out_t, torch.Tensor) and out_t.dtype == torch.float64
    np.testing.assert_allclose(out_t.numpy(), out_np, rtol=1e-12, atol=1e-12)


def test_constant_expert_ignores_inputs():
    X, W, b = _inputs(2)
    out = experts.get_expert("constant")(X, W, b)
    np.testing.assert_array_equal(out, np.broadcast_to(b[:, None, :], out.shape))


def test_family_metadata():
    assert experts.get_expert("relu").homogeneous and experts.get_expert("linear").homogeneous
    assert not experts.get_expert("gelu").homogeneous
    assert experts.get_expert("relu").n_params(32) == 33
    assert experts.get_expert("constant").n_params(32) == 1
    assert experts.get_expert("poly5").activation(torch.tensor(2.0)).item() == 32.0
    assert experts.get_expert("poly1") is experts.get_expert("linear")


def test_homogeneity_flag_is_true_to_the_activation():
    z = torch.linspace(-3, 3, 101, dtype=torch.float64)
    for name in experts.EXPERTS:
        fam = experts.get_expert(name)
        if not fam.input_dependent:
            continue
        homogeneous = torch.allclose(fam.activation(2.5 * z), 2.5 * fam.activation(z))
        assert homogeneous == fam.homogeneous, name


def test_unknown_expert_lists_valid_names():
    with pytest.raises(ValueError, match="valid names are"):
        experts.get_expert("softplus")
