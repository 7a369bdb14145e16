"""Hermite moments and output transforms of makkuva2020 App. B (moestat.hermite)."""

import math

import numpy as np
import pytest
from numpy.polynomial import hermite_e
from scipy import integrate

from moestat.hermite import ACTIVATIONS, Activation, get_activation, hermite_he, hermite_moments, output_transform

SIGMA = 0.05


def _double_factorial(m: int) -> int:
    return 1 if m <= 0 else m * _double_factorial(m - 2)


def _normal_moment(q: int) -> float:
    return 0.0 if q % 2 else float(_double_factorial(q - 1))


def _he_coefs(j: int) -> np.ndarray:
    """Monomial coefficients of He_j."""
    c = np.zeros(j + 1)
    c[j] = 1.0
    return hermite_e.herme2poly(c)


def test_identity_moments_closed_form():
    m = hermite_moments("linear")
    for p in range(5):
        for j in range(5):
            exact = sum(c * _normal_moment(p + q) for q, c in enumerate(_he_coefs(j)))
            assert m[p, j] == pytest.approx(exact, abs=1e-10)
    assert (m[1, 1], m[2, 2], m[3, 3], m[4, 4]) == pytest.approx((1, 2, 6, 24), abs=1e-10)


def test_relu_moments_closed_form():
    # makkuva2020's Example 2: E[g(Z)^p Z^q] = (p+q-1)!!/2 * (sqrt(2/pi) if p+q odd else 1), p >= 1
    def relu_moment(p: int, q: int) -> float:
        if p == 0:
            return _normal_moment(q)
        s = p + q
        return _double_factorial(s - 1) / 2 * (math.sqrt(2 / math.pi) if s % 2 else 1.0)

    m = hermite_moments("relu")
    for p in range(5):
        for j in range(5):
            exact = sum(c * relu_moment(p, q) for q, c in enumerate(_he_coefs(j)))
            assert m[p, j] == pytest.approx(exact, abs=1e-10)


@pytest.mark.parametrize("name", ["tanh", "sigmoid", "softplus", "leaky_relu"])
def test_smooth_moments_match_adaptive_quadrature(name):
    act = get_activation(name)
    m = hermite_moments(name)
    for p, j in [(1, 1), (2, 2), (3, 1), (4, 4), (4, 2)]:
        def f(z, p=p, j=j):
            return float(act.numpy(np.array(z)) ** p * hermite_he(np.array(z), j)) * math.exp(-z * z / 2)

        ref = sum(integrate.quad(f, a, b, epsabs=1e-13, epsrel=1e-12)[0] for a, b in [(-np.inf, 0), (0, np.inf)])
        assert m[p, j] == pytest.approx(ref / math.sqrt(2 * math.pi), abs=1e-9)


def test_identity_transform_matches_paper_example1():
    T = output_transform("id", SIGMA)
    assert (T.q4_alpha, T.q4_gamma, T.q2_delta) == pytest.approx((0, 0, 0), abs=1e-10)
    assert T.q4_beta == pytest.approx(-6 * (1 + SIGMA**2), abs=1e-10)
    assert (T.c4, T.c2) == pytest.approx((24.0, 2.0), abs=1e-9)


def test_relu_transform_matches_corrected_system_not_the_printed_one():
    T = output_transform("relu", SIGMA)
    s2, r = SIGMA**2, math.sqrt(2 / math.pi)
    # corrected values of the paper's constants (solved independently with sympy + quadrature)
    assert T.q4_alpha == pytest.approx(-5.352483, abs=1e-6)
    assert T.q4_beta == pytest.approx(8.125027 - 6 * s2, abs=1e-6)
    assert T.q4_gamma == pytest.approx(-3.291295 + 16.057449 * s2, abs=1e-6)
    assert T.q2_delta == pytest.approx(-2 * r, abs=1e-10)
    assert T.c4 == pytest.approx(0.501047, abs=1e-6)
    assert T.c2 == pytest.approx(1 - 2 / math.pi, abs=1e-10)
    # the paper's printed matrix (App. B) gives a different solution for sigma > 0
    printed = np.array([[1.5 + 1.5 * s2, r + s2, 0.5], [3 * r * (1 + s2 / 2), 1 + s2, 0.5 * r], [3, r + s2, 0]])
    rhs = -np.array([r * (4 + 6 * s2), 6 + 6 * s2, r * (12 + 6 * s2)])
    sol = np.linalg.solve(printed, rhs)
    assert abs(sol[1] - T.q4_beta) > 1e-3


def _conditions_by_double_quadrature(name, sigma):
    """E[Q4(Y) He_j(Z)], E[Q2(Y) He_j(Z)] with Y = g(Z) + sigma*xi, both integrals by quadrature."""
    T = output_transform(name, sigma)
    act = get_activation(name)
    xi, wx = hermite_e.hermegauss(40)
    wx = wx / math.sqrt(2 * math.pi)
    u, wu = np.polynomial.legendre.leggauss(300)
    z = np.concatenate([7 * (u - 1), 7 * (u + 1)])           # two pieces, split at the kink z = 0
    wz = 7 * np.concatenate([wu, wu]) * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    Y = act.numpy(z)[:, None] + sigma * xi[None, :]
    q4 = (Y**4 + T.q4_alpha * Y**3 + T.q4_beta * Y**2 + T.q4_gamma * Y) @ wx
    q2 = (Y**2 + T.q2_delta * Y) @ wx
    return T, [float(np.sum(wz * q4 * hermite_he(z, j))) for j in range(5)], \
        [float(np.sum(wz * q2 * hermite_he(z, j))) for j in range(3)]


@pytest.mark.parametrize(("name", "sigma"), [(a, 0.05) for a in sorted(ACTIVATIONS)] + [("relu", 0.5), ("tanh", 0.5)])
def test_conditions_hold_for_noisy_outputs(name, sigma):
    T, e4, e2 = _conditions_by_double_quadrature(name, sigma)
    scale = max(1.0, abs(T.c4))
    assert max(abs(v) for v in e4[1:4]) < 1e-6 * scale      # Condition 1 (quadrature accuracy ~1e-10)
    assert e4[4] == pytest.approx(T.c4, rel=1e-6)
    assert abs(e2[1]) < 1e-8                                 # Condition 2
    assert e2[2] == pytest.approx(T.c2, rel=1e-6)


def test_constants_do_not_depend_on_sigma():
    a, b = output_transform("sigmoid", 0.01), output_transform("sigmoid", 0.7)
    assert (a.c4, a.c2, a.q4_alpha, a.q2_delta) == pytest.approx((b.c4, b.c2, b.q4_alpha, b.q2_delta), rel=1e-12)
    assert a.q4_beta - b.q4_beta == pytest.approx(6 * (0.7**2 - 0.01**2), rel=1e-10)


def test_unsupported_activation_names_the_supported_ones():
    with pytest.raises(ValueError, match=r"supported activations are.*relu.*tanh"):
        output_transform("gelu", 0.05)


def test_vanishing_coefficient_raises_naming_it():
    const = Activation("constant", lambda z: z * 0 + 1, homogeneous=False)
    with pytest.raises(ValueError, match=r"4th-order Hermite coefficient c = E\[S4"):
        output_transform(const, 0.05)


def test_even_activation_is_rank_deficient_but_valid():
    square = Activation("square", lambda z: z**2, homogeneous=False)
    T = output_transform(square, 0.1)
    assert T.rank4 < 3 and T.rank2 == 0
    assert abs(T.c4) > 1 and abs(T.c2) > 1
