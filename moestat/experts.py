r"""Expert families of a mixture of experts.

A *ridge expert* is :math:`h(x; a, b) = \varphi(a^\top x + b)` with
:math:`(a, b) \in \mathbb R^d \times \mathbb R` (nguyen2024 §2.4: a single ridge
unit, no hidden width).  The activations are

======== ================================ =========================
name     :math:`\varphi(z)`               positively 1-homogeneous
======== ================================ =========================
linear   :math:`z`                        yes
relu     :math:`\max(z, 0)`               yes
gelu     :math:`z\,\Phi(z)` (exact, erf)  no
tanh     :math:`\tanh z`                  no
sigmoid  :math:`1/(1+e^{-z})`             no
polyP    :math:`z^P` (e.g. poly2, poly3)  no (P-homogeneous)
======== ================================ =========================

The *constant* (input-independent) expert is :math:`h(x; b) = b`, the
:math:`a = 0_d` case that is neither strongly nor weakly identifiable.

Positive 1-homogeneity, :math:`\varphi(tz) = t\varphi(z)` for :math:`t > 0`, gives the
Euler identity :math:`h = a^\top\partial_a h + b\,\partial_b h`, which breaks the
strong/weak identifiability conditions of nguyen2024 at atoms with a zero gate
slope.  Each family reports it as ``homogeneous``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ._torch import Array, is_torch, to_numpy, to_tensor

Activation = Callable[[torch.Tensor], torch.Tensor]


def _identity(z: torch.Tensor) -> torch.Tensor:
    return z


def _gelu(z: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(z)


def _power(p: int) -> Activation:
    def phi(z: torch.Tensor) -> torch.Tensor:
        return z**p

    phi.__name__ = f"poly{p}"
    return phi


@dataclass(frozen=True)
class ExpertFamily:
    r"""A parametric expert family :math:`x \mapsto h(x; \eta)`.

    Attributes
    ----------
    name : str
        Registry name, e.g. ``"relu"``.
    activation : callable
        The torch activation :math:`\varphi`.
    homogeneous : bool
        True when :math:`\varphi` is positively 1-homogeneous (linear, relu).
    input_dependent : bool
        False for the constant expert :math:`h(x;b) = b`.
    """

    name: str
    activation: Activation
    homogeneous: bool
    input_dependent: bool = True

    def n_params(self, d: int) -> int:
        """Number of free parameters of one expert in dimension ``d`` (``d + 1`` or 1)."""
        return d + 1 if self.input_dependent else 1

    def __call__(self, X: Array, weight: Array, bias: Array) -> Array:
        r"""Evaluate all experts: :math:`h_{i}(x_n) = \varphi(a_i^\top x_n + b_i)`.

        Parameters
        ----------
        X : array, shape (..., n, d)
        weight : array, shape (..., k, d)
            Expert slopes :math:`a_i` (ignored by the constant expert).
        bias : array, shape (..., k)
            Expert intercepts :math:`b_i`.

        Returns
        -------
        array, shape (..., n, k)
            numpy in, numpy out; torch in, torch out (device and dtype kept).
        """
        if is_torch(X):
            return self.evaluate(X, to_tensor(weight, device=X.device, dtype=X.dtype),
                                 to_tensor(bias, device=X.device, dtype=X.dtype))
        out = self.evaluate(to_tensor(X), to_tensor(weight), to_tensor(bias))
        return to_numpy(out)

    def evaluate(self, X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Torch-only evaluation (no conversions); see ``__call__``."""
        if not self.input_dependent:
            lead = torch.broadcast_shapes(X.shape[:-2], bias.shape[:-1])
            return bias.unsqueeze(-2).expand(*lead, X.shape[-2], bias.shape[-1])
        z = X @ weight.transpose(-1, -2) + bias.unsqueeze(-2)
        return self.activation(z)


_FAMILIES: dict[str, ExpertFamily] = {
    "linear": ExpertFamily("linear", _identity, homogeneous=True),
    "relu": ExpertFamily("relu", torch.relu, homogeneous=True),
    "gelu": ExpertFamily("gelu", _gelu, homogeneous=False),
    "tanh": ExpertFamily("tanh", torch.tanh, homogeneous=False),
    "sigmoid": ExpertFamily("sigmoid", torch.sigmoid, homogeneous=False),
    "constant": ExpertFamily("constant", _identity, homogeneous=False, input_dependent=False),
}
_POLY = re.compile(r"^poly([1-9][0-9]*)$")

EXPERTS = ("linear", "relu", "gelu", "tanh", "sigmoid", "poly2", "poly3", "constant")
"""Names accepted by :func:`get_expert` (``polyP`` works for any integer P >= 1)."""


def get_expert(name: str | ExpertFamily) -> ExpertFamily:
    """Look up an expert family by name (``"relu"``, ``"poly3"``, ...)."""
    if isinstance(name, ExpertFamily):
        return name
    if isinstance(name, str):
        if name in _FAMILIES:
            return _FAMILIES[name]
        m = _POLY.match(name)
        if m:
            p = int(m.group(1))
            if p == 1:
                return _FAMILIES["linear"]
            return ExpertFamily(name, _power(p), homogeneous=False)
    raise ValueError(
        f"expert={name!r} is not a known expert family; valid names are "
        f"{list(EXPERTS)} (or 'polyP' for any integer degree P >= 1)."
    )


def expert_values(name: str | ExpertFamily, X: Array, weight: Array, bias: Array) -> Array:
    """Evaluate the experts of family ``name``; shorthand for ``get_expert(name)(X, weight, bias)``."""
    return get_expert(name)(X, weight, bias)


def activation_numpy(name: str, z: np.ndarray) -> np.ndarray:
    """The activation of family ``name`` applied to a numpy array (through the torch formula)."""
    fam = get_expert(name)
    return to_numpy(fam.activation(to_tensor(z)))
