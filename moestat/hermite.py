r"""Hermite moments of activations and the output transforms of the tensor (L4) method.

For an expert activation :math:`g` and :math:`Z \sim N(0,1)` write

.. math:: m_{p,j} = E[g(Z)^p\,\mathrm{He}_j(Z)], \qquad p, j = 0, \dots, 4,

with the probabilists' Hermite polynomials :math:`\mathrm{He}_1 = z`, :math:`\mathrm{He}_2 = z^2-1`,
:math:`\mathrm{He}_3 = z^3-3z`, :math:`\mathrm{He}_4 = z^4-6z^2+3`.  The moments are computed by
Gauss–Hermite quadrature (``numpy.polynomial.hermite_e``) for smooth activations and by
Gauss–Legendre quadrature on each smooth piece for activations with kinks (ReLU, leaky ReLU), where
Gauss–Hermite converges only algebraically.

Output transforms (makkuva2020 eq. 6 and App. B):
:math:`Q_4(y) = y^4 + \alpha y^3 + \beta y^2 + \gamma y` and :math:`Q_2(y) = y^2 + \delta y`, with
coefficients chosen so that, for :math:`Y \mid Z \sim N(g(Z), \sigma^2)`,
:math:`S_4(Z) = E[Q_4(Y)\mid Z]` has zero Hermite coefficients of orders 1–3 and a non-zero order-4
coefficient (Condition 1) and :math:`S_2(Z) = E[Q_2(Y)\mid Z]` has a zero order-1 and non-zero order-2
coefficient (Condition 2).  Writing :math:`P(g) = g^4 + \alpha_0 g^3 + \beta_0 g^2 + \gamma_0 g`, Condition 1
is the linear system

.. math:: [m_{3,j},\, m_{2,j},\, m_{1,j}]\,(\alpha_0, \beta_0, \gamma_0)^\top = -m_{4,j}, \quad j = 1, 2, 3,

after which :math:`c = E[S_4 \mathrm{He}_4] = m_{4,4} + \alpha_0 m_{3,4} + \beta_0 m_{2,4} + \gamma_0 m_{1,4}`,
:math:`\delta = -m_{2,1}/m_{1,1}`, :math:`c' = m_{2,2} + \delta m_{1,2}`, and the noise enters only through
:math:`\beta = \beta_0 - 6\sigma^2`, :math:`\gamma = \gamma_0 - 3\alpha_0\sigma^2`.  The system is solved
numerically: the paper's printed ReLU matrix (App. B, Example 2) has a wrong :math:`\beta` column for
:math:`\sigma > 0`.  For the identity :math:`\alpha=\gamma=\delta=0`, :math:`\beta=-6(1+\sigma^2)`,
:math:`c = 24`, :math:`c' = 2`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.polynomial import hermite_e, legendre

from .experts import ExpertFamily, get_expert

__all__ = [
    "ACTIVATIONS",
    "Activation",
    "OutputTransform",
    "get_activation",
    "hermite_he",
    "hermite_moments",
    "output_transform",
]


Activation = ExpertFamily
"""An activation of the tensor method: an :class:`moestat.experts.ExpertFamily` (``name``, ``numpy``,
``activation`` and ``kinks`` are what quadrature and the fitters read)."""

ACTIVATIONS: tuple[str, ...] = ("leaky_relu", "linear", "relu", "sigmoid", "softplus", "tanh")
"""The activations whose output transforms the tensor method supports (leaky_relu has slope 0.1); their formulas
live in :mod:`moestat.experts`.  ``"id"`` and ``"identity"`` alias ``"linear"``."""


def get_activation(activation: str | ExpertFamily) -> ExpertFamily:
    """Look up an activation of :data:`ACTIVATIONS` by name (or pass an :class:`~moestat.experts.ExpertFamily`
    through).

    Raises
    ------
    ValueError
        If the name is unknown; the message lists the supported names.
    """
    if isinstance(activation, ExpertFamily):
        return activation
    if isinstance(activation, str) and activation in (*ACTIVATIONS, "id", "identity"):
        return get_expert(activation)
    raise ValueError(
        f"activation={activation!r} is not supported; supported activations are "
        f"{list(ACTIVATIONS)} (aliases 'id', 'identity' for 'linear'), or pass a moestat.experts.ExpertFamily."
    )


def hermite_he(z: np.ndarray, j: int) -> np.ndarray:
    """Probabilists' Hermite polynomial :math:`\\mathrm{He}_j(z)` (``numpy.polynomial.hermite_e``)."""
    coef = np.zeros(j + 1)
    coef[j] = 1.0
    return hermite_e.hermeval(z, coef)


def _nodes(act: Activation, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Quadrature nodes and weights for E[f(Z)], Z ~ N(0, 1)."""
    if not act.kinks:
        z, w = hermite_e.hermegauss(n_nodes)
        return z, w / math.sqrt(2.0 * math.pi)
    # Gauss-Legendre on each smooth piece of [-L, L]; the Gaussian mass beyond L = 14 is < 1e-44.
    L = 14.0
    cuts = [-L, *sorted(k for k in act.kinks if -L < k < L), L]
    x, w = legendre.leggauss(n_nodes)
    zs, ws = [], []
    for lo, hi in itertools.pairwise(cuts):
        z = 0.5 * (hi - lo) * x + 0.5 * (hi + lo)
        zs.append(z)
        ws.append(0.5 * (hi - lo) * w * np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi))
    return np.concatenate(zs), np.concatenate(ws)


def hermite_moments(activation: str | Activation, *, p_max: int = 4, j_max: int = 4,
                    n_nodes: int = 200) -> np.ndarray:
    r"""The Hermite moments :math:`m_{p,j} = E[g(Z)^p \mathrm{He}_j(Z)]`, :math:`Z \sim N(0,1)`.

    Parameters
    ----------
    activation : str or Activation
    p_max, j_max : int
        Largest power of :math:`g` and largest Hermite order.
    n_nodes : int
        Quadrature nodes (per smooth piece for kinked activations).

    Returns
    -------
    ndarray, shape (p_max + 1, j_max + 1)
        ``m[p, j]``; :math:`m_{p,j}/j!` is the order-:math:`j` Hermite coefficient of :math:`g^p`.
    """
    act = get_activation(activation)
    z, w = _nodes(act, n_nodes)
    g = act.numpy(z)
    powers = np.stack([g**p for p in range(p_max + 1)])          # (P, N)
    he = np.stack([hermite_he(z, j) for j in range(j_max + 1)])  # (J, N)
    out: np.ndarray = (powers * w) @ he.T
    return out


@dataclass(frozen=True)
class OutputTransform:
    r"""Coefficients of :math:`Q_4(y) = y^4 + \alpha y^3 + \beta y^2 + \gamma y` and :math:`Q_2(y) = y^2 + \delta y`.

    Attributes
    ----------
    q4_alpha, q4_beta, q4_gamma, q2_delta : float
        The paper's :math:`(\alpha, \beta, \gamma, \delta)` at noise sd ``sigma``.
    c4, c2 : float
        :math:`c_{g,\sigma} = E[S_4(Z)\mathrm{He}_4(Z)]` and :math:`c'_{g,\sigma} = E[S_2(Z)\mathrm{He}_2(Z)]`
        (independent of :math:`\sigma`).
    sigma : float
    activation : str
    rank4, rank2 : int
        Ranks of the Condition-1 (3x3) and Condition-2 (1x1) systems; below full rank for even activations.
    residual : float
        Largest absolute Condition-1/2 residual (should be ~0).
    """

    q4_alpha: float
    q4_beta: float
    q4_gamma: float
    q2_delta: float
    c4: float
    c2: float
    sigma: float
    activation: str
    rank4: int
    rank2: int
    residual: float

    def q4(self, y: torch.Tensor) -> torch.Tensor:
        """:math:`Q_4(y)` (torch, elementwise)."""
        return y * (y * (y * (y + self.q4_alpha) + self.q4_beta) + self.q4_gamma)

    def q2(self, y: torch.Tensor) -> torch.Tensor:
        """:math:`Q_2(y)` (torch, elementwise)."""
        return y * (y + self.q2_delta)

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def output_transform(activation: str | Activation, sigma: float, *, n_nodes: int = 200,
                     tol: float = 1e-8) -> OutputTransform:
    r"""Solve makkuva2020 App. B for the output transforms of ``activation`` at noise sd ``sigma``.

    The Condition-1 system is solved by least squares with a rank check (even activations make it
    rank-deficient; the minimum-norm solution is used, which is valid because the vanishing rows are
    identically zero), then the noise shift is applied (module docstring).

    Raises
    ------
    ValueError
        If Condition 1 or 2 cannot be met, or if the needed Hermite coefficient :math:`c` (4th order,
        of :math:`Q_4\circ g`) or :math:`c'` (2nd order, of :math:`Q_2\circ g`) vanishes, which makes the
        tensor method inapplicable to ``activation``.
    """
    if not (isinstance(sigma, (int, float)) and np.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite noise standard deviation >= 0, got {sigma!r}.")
    act = get_activation(activation)
    m = hermite_moments(act, p_max=4, j_max=4, n_nodes=n_nodes)
    scale = max(1.0, float(np.abs(m).max()))
    M = np.array([[m[3, j], m[2, j], m[1, j]] for j in (1, 2, 3)])
    b = -np.array([m[4, j] for j in (1, 2, 3)])
    U, sv, Vt = np.linalg.svd(M)
    keep = sv > tol * scale            # absolute threshold: rows that vanish by symmetry are ~1e-16, not 0
    rank4 = int(keep.sum())
    sol = Vt[keep].T @ ((U[:, keep].T @ b) / sv[keep])
    res4 = float(np.abs(M @ sol - b).max())
    if res4 > 1e-6 * scale:
        raise ValueError(f"activation {act.name!r}: Condition 1 of makkuva2020 App. B (zero Hermite coefficients "
                         f"of orders 1-3 of Q4(g(Z))) has no solution (residual {res4:.3g}); the tensor method "
                         "does not apply to this activation.")
    a0, b0, g0 = (float(v) for v in sol)
    c4 = m[4, 4] + a0 * m[3, 4] + b0 * m[2, 4] + g0 * m[1, 4]
    if abs(m[1, 1]) > tol * scale:
        delta, rank2 = -m[2, 1] / m[1, 1], 1
    elif abs(m[2, 1]) <= tol * scale:
        delta, rank2 = 0.0, 0
    else:
        raise ValueError(f"activation {act.name!r}: Condition 2 (E[S2(Z) Z] = 0) has no solution because "
                         "E[g(Z) Z] = 0 while E[g(Z)^2 Z] != 0; the tensor method does not apply.")
    c2 = m[2, 2] + delta * m[1, 2]
    res2 = abs(m[2, 1] + delta * m[1, 1])
    # Size of P(g(Z)) and g^2 + delta g, to judge whether c4, c2 are numerically zero.
    size4 = _poly_norm(act, (1.0, a0, b0, g0, 0.0), n_nodes)
    size2 = _poly_norm(act, (0.0, 0.0, 1.0, delta, 0.0), n_nodes)
    if abs(c4) <= 1e-6 * math.sqrt(24.0) * max(size4, 1e-300):
        raise ValueError(f"activation {act.name!r}: the 4th-order Hermite coefficient c = E[S4(Z) He4(Z)] of "
                         f"Q4(g(Z)) vanishes (c = {c4:.3g}); L4 cannot identify the regressors with this activation.")
    if abs(c2) <= 1e-6 * math.sqrt(2.0) * max(size2, 1e-300):
        raise ValueError(f"activation {act.name!r}: the 2nd-order Hermite coefficient c' = E[S2(Z) He2(Z)] of "
                         f"Q2(g(Z)) vanishes (c' = {c2:.3g}); L4 cannot identify the regressors with this activation.")
    s2 = float(sigma) ** 2
    return OutputTransform(q4_alpha=a0, q4_beta=b0 - 6.0 * s2, q4_gamma=g0 - 3.0 * a0 * s2, q2_delta=float(delta),
                           c4=float(c4), c2=float(c2), sigma=float(sigma), activation=act.name,
                           rank4=rank4, rank2=rank2, residual=max(res4, float(res2)))


def _poly_norm(act: Activation, coef: tuple[float, ...], n_nodes: int) -> float:
    """sqrt(E[P(g(Z))^2]) for P(g) = coef[0] g^4 + coef[1] g^3 + coef[2] g^2 + coef[3] g + coef[4]."""
    z, w = _nodes(act, n_nodes)
    g = act.numpy(z)
    p = (((coef[0] * g + coef[1]) * g + coef[2]) * g + coef[3]) * g + coef[4]
    return float(math.sqrt(max(float(np.sum(w * p**2)), 0.0)))
