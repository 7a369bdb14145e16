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
        experts.get_expert("swish")


# ------------------------------------------------------------------ the one activation registry
ALL = [*sorted(set(experts.ACTIVATION_NAMES) - {"id", "identity", "cubic"}), "poly4"]
SMOOTH_POINTS = torch.tensor([-2.3, -0.7, -0.05, 0.04, 0.6, 1.9], dtype=torch.float64)  # away from kinks at 0


@pytest.mark.parametrize("name", ALL)
def test_registry_derivatives_match_autograd(name):
    """phi' and phi'' (closed forms where the family has them) against autograd of phi itself, away from kinks."""
    fam = experts.get_expert(name)
    z = SMOOTH_POINTS.clone().requires_grad_(True)
    (d1,) = torch.autograd.grad(fam.activation(z).sum(), z, create_graph=True)
    d2 = torch.autograd.grad(d1.sum(), z)[0] if d1.requires_grad else torch.zeros_like(d1)  # relu: d1 constant
    torch.testing.assert_close(fam.phi_prime(SMOOTH_POINTS), d1.detach(), rtol=1e-12, atol=1e-14)
    second = fam.phi_second(SMOOTH_POINTS)
    if fam.piecewise_linear:
        assert second is None and torch.all(d2 == 0)
    else:
        torch.testing.assert_close(second, d2, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ALL)
def test_registry_fused_and_numpy_agree_with_the_torch_formula(name):
    """The in-place evaluator of the least-squares kernel and the numpy entry give phi and phi' of the family."""
    fam = experts.get_expert(name)
    z = SMOOTH_POINTS.reshape(2, 3)
    h, dh, tmp = torch.empty_like(z), torch.empty_like(z), torch.empty_like(z)
    val, der = fam.value_and_derivative_into(z, h, dh, tmp)
    torch.testing.assert_close(val, fam.activation(z), rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(torch.ones_like(z) if der is None else der, fam.phi_prime(z), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(fam.numpy(z.numpy()), fam.activation(z).numpy(), rtol=1e-15)


def test_registry_flags_and_aliases():
    z = torch.linspace(-3, 3, 61, dtype=torch.float64)
    for name in ALL:
        fam = experts.get_expert(name)
        assert fam.odd == torch.allclose(fam.activation(-z), -fam.activation(z)), name
        kinked = not torch.allclose(fam.phi_prime(torch.tensor([-1e-9], dtype=torch.float64)),
                                    fam.phi_prime(torch.tensor([1e-9], dtype=torch.float64)))
        assert kinked == (0.0 in fam.kinks), name
    assert experts.get_expert("identity") is experts.get_expert("linear")
    assert experts.get_expert("cubic").name == "poly3"
    np.testing.assert_allclose(experts.get_expert("leaky_relu").numpy([-2.0, 3.0]), [-2.0 * experts.LEAKY_SLOPE, 3.0])


def test_every_module_reads_activations_from_the_registry():
    """The tensor method's and the cluster MoE's activation names resolve to registry families (no second table)."""
    from moestat import hermite
    from moestat.deep import cluster_moe

    for name in hermite.ACTIVATIONS:
        assert hermite.get_activation(name) is experts.get_expert(name)
    for name in cluster_moe.ACTIVATIONS:
        assert cluster_moe._phi(name) is experts.get_expert(name).activation
