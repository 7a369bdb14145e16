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

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ._torch import Array, is_torch, to_numpy, to_tensor

Tensor = torch.Tensor
Activation = Callable[[Tensor], Tensor]
ValueAndDerivative = tuple[Tensor, Tensor | None]
FusedActivation = Callable[[Tensor, Tensor, Tensor, Tensor], ValueAndDerivative]

_SQRT_2PI = math.sqrt(2.0 * math.pi)
LEAKY_SLOPE = 0.1
"""Negative-side slope of the ``leaky_relu`` family."""


# ------------------------------------------------------------------ closed forms, one place
# phi, phi' and phi'' of every built-in family (torch).  The fused variants write phi and phi' into workspace
# buffers without allocating (the least-squares kernel's element-wise pass, moestat.fit._objective).

def _identity(z: torch.Tensor) -> torch.Tensor:
    return z


def _gelu(z: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(z)


def _gelu_d1(z: torch.Tensor) -> torch.Tensor:
    r""":math:`\Phi(z) + z\phi(z)`."""
    cdf = 0.5 * (1.0 + torch.erf(z * (1.0 / math.sqrt(2.0))))
    return cdf + z * torch.exp(-0.5 * z * z) * (1.0 / _SQRT_2PI)


def _gelu_d2(z: torch.Tensor) -> torch.Tensor:
    r""":math:`\phi(z)(2 - z^2)`."""
    return torch.exp(-0.5 * z * z).mul_(1.0 / _SQRT_2PI).mul_(2.0 - z * z)


def _relu_d1(z: torch.Tensor) -> torch.Tensor:
    return (z > 0).to(z.dtype)  # phi'(0) = 0


def _tanh_d1(z: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(z)
    return 1.0 - t * t


def _tanh_d2(z: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(z)
    return -2.0 * t * (1.0 - t * t)


def _sigmoid_d1(z: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(z)
    return s * (1.0 - s)


def _sigmoid_d2(z: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(z)
    return s * (1.0 - s) * (1.0 - 2.0 * s)


def _leaky_relu(z: torch.Tensor) -> torch.Tensor:
    return torch.where(z > 0, z, LEAKY_SLOPE * z)


def _leaky_relu_d1(z: torch.Tensor) -> torch.Tensor:
    return torch.where(z > 0, torch.ones_like(z), torch.full_like(z, LEAKY_SLOPE))


def _fused_linear(z: Tensor, h: Tensor, dh: Tensor, tmp: Tensor) -> ValueAndDerivative:
    return z, None


def _fused_relu(z: Tensor, h: Tensor, dh: Tensor, tmp: Tensor) -> ValueAndDerivative:
    torch.clamp_min(z, 0.0, out=h)
    torch.sign(h, out=dh)  # h >= 0, so sign(h) is the indicator z > 0 (phi'(0) = 0)
    return h, dh


def _fused_tanh(z: Tensor, h: Tensor, dh: Tensor, tmp: Tensor) -> ValueAndDerivative:
    torch.tanh(z, out=h)
    torch.mul(h, h, out=dh)
    dh.neg_().add_(1.0)
    return h, dh


def _fused_sigmoid(z: Tensor, h: Tensor, dh: Tensor, tmp: Tensor) -> ValueAndDerivative:
    torch.sigmoid(z, out=h)
    torch.neg(h, out=dh).add_(1.0)
    dh.mul_(h)
    return h, dh


def _fused_gelu(z: Tensor, h: Tensor, dh: Tensor, tmp: Tensor) -> ValueAndDerivative:
    torch.mul(z, 1.0 / math.sqrt(2.0), out=dh)
    dh.erf_().add_(1.0).mul_(0.5)  # Phi(z)
    torch.mul(z, dh, out=h)  # z Phi(z)
    torch.mul(z, z, out=tmp)
    tmp.mul_(-0.5).exp_().mul_(1.0 / _SQRT_2PI).mul_(z)  # z phi(z)
    dh.add_(tmp)
    return h, dh


def _power(p: int) -> tuple[Activation, Activation, Activation, FusedActivation]:
    """phi, phi', phi'' and the fused evaluator of :math:`z^p`."""
    def phi(z: torch.Tensor) -> torch.Tensor:
        return z**p

    def d1(z: torch.Tensor) -> torch.Tensor:
        return p * z ** (p - 1)

    def d2(z: torch.Tensor) -> torch.Tensor:
        return torch.full_like(z, 2.0) if p == 2 else p * (p - 1) * z ** (p - 2)

    def fused(z: Tensor, h: Tensor, dh: Tensor, tmp: Tensor) -> ValueAndDerivative:
        torch.pow(z, p - 1, out=dh)
        torch.mul(dh, z, out=h)
        dh.mul_(float(p))
        return h, dh

    phi.__name__ = f"poly{p}"
    return phi, d1, d2, fused


@dataclass(frozen=True)
class ExpertFamily:
    r"""A parametric expert family :math:`x \mapsto h(x; \eta)`: the one registry of activations.

    Every part of moestat that evaluates an activation (the models, the least-squares kernels, Hermite
    quadrature of the tensor method, the deep cluster MoE) reads it from here.

    Attributes
    ----------
    name : str
        Registry name, e.g. ``"relu"``.
    activation : callable
        The torch activation :math:`\varphi`.
    homogeneous : bool
        True when :math:`\varphi` is positively 1-homogeneous (linear, relu, leaky_relu).
    input_dependent : bool
        False for the constant expert :math:`h(x;b) = b`.
    derivative : callable, optional
        Closed-form :math:`\varphi'` (torch); ``None``: autograd (:meth:`phi_prime`).
    second_derivative : callable, optional
        Closed-form :math:`\varphi''` (torch); ``None``: autograd unless ``piecewise_linear``.
    piecewise_linear : bool
        :math:`\varphi'' \equiv 0` away from the kinks (linear, relu, leaky_relu, constant).
    kinks : tuple of float
        Points where :math:`\varphi` is not smooth (quadrature is split there).
    odd : bool
        :math:`\varphi(-z) = -\varphi(z)`.
    fused : callable, optional
        In-place evaluator ``fused(z, h, dh, tmp) -> (phi(z), phi'(z))`` writing into the workspace tensors ``h``,
        ``dh`` (and scratch ``tmp``); a returned derivative ``None`` means :math:`\varphi' \equiv 1`.
    native : str, optional
        The same pair in C++ for the native least-squares kernel (:mod:`moestat.fit._native`): statements that
        set ``h`` and ``dh`` from ``z``, all ``V = at::vec::Vectorized<T>`` (``one`` and ``zero`` are in
        scope).  ``None``: the native kernel does not take this family and the eager kernel runs.
    native_second : str, optional
        :math:`\varphi''` in C++ for the native Newton loop (:mod:`moestat.fit._native`): statements that set ``d2h``
        from ``z``, ``h`` and ``dh`` (the values ``native`` set).  Piecewise-linear families need none
        (:math:`\varphi'' \equiv 0`); another family without it runs the tensor Newton loop.
    """

    name: str
    activation: Activation
    homogeneous: bool
    input_dependent: bool = True
    derivative: Activation | None = None
    second_derivative: Activation | None = None
    piecewise_linear: bool = False
    kinks: tuple[float, ...] = ()
    odd: bool = False
    fused: FusedActivation | None = None
    native: str | None = None
    native_second: str | None = None

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
            lead = torch.broadcast_shapes(X.shape[:-2], bias.shape[:-1])  # type: ignore[no-untyped-call]
            return bias.unsqueeze(-2).expand(*lead, X.shape[-2], bias.shape[-1])
        z = X @ weight.transpose(-1, -2) + bias.unsqueeze(-2)
        return self.activation(z)

    def numpy(self, z: Array) -> np.ndarray:
        """:math:`\\varphi(z)` on a numpy array (float64, through the torch formula)."""
        return to_numpy(self.activation(torch.as_tensor(np.asarray(z, dtype=np.float64))))

    def phi_prime(self, z: torch.Tensor) -> torch.Tensor:
        """:math:`\\varphi'(z)`: the closed form, else autograd."""
        if self.derivative is not None:
            return self.derivative(z)
        with torch.enable_grad():
            zz = z.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(self.activation(zz).sum(), zz)
        return g.detach()

    def phi_second(self, z: torch.Tensor) -> torch.Tensor | None:
        """:math:`\\varphi''(z)`, or ``None`` where it vanishes (piecewise-linear families): the closed form, else
        double autograd."""
        if self.piecewise_linear:
            return None
        if self.second_derivative is not None:
            return self.second_derivative(z)
        with torch.enable_grad():
            zz = z.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(self.activation(zz).sum(), zz, create_graph=True)
            (g2,) = torch.autograd.grad(g.sum(), zz)
        return g2.detach()

    def value_and_derivative_into(self, z: torch.Tensor, h: torch.Tensor, dh: torch.Tensor, tmp: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(phi(z), phi'(z))`` written into the workspace tensors ``h`` and ``dh`` (``fused`` where the family
        has one, else the closed forms or autograd); a derivative ``None`` means :math:`\\varphi' \\equiv 1`."""
        if self.fused is not None:
            return self.fused(z, h, dh, tmp)
        h.copy_(self.activation(z))
        dh.copy_(self.phi_prime(z))
        return h, dh


# C++ (at::vec) forms of phi and phi' for the native kernel; 1/sqrt(2) and 1/sqrt(2 pi) to 20 digits
_NATIVE_GELU = ("const V cdf = V(T(0.5)) * (one + (z * V(T(0.70710678118654752440))).erf()); h = z * cdf; "
                "dh = cdf + z * (V(T(-0.5)) * z * z).exp() * V(T(0.39894228040143267794));")

_NATIVE_GELU_D2 = "d2h = (V(T(-0.5)) * z * z).exp() * V(T(0.39894228040143267794)) * (V(T(2)) - z * z);"

# softplus as torch computes it (beta 1, threshold 20: z itself above 20), phi' = sigmoid, phi'' = s (1 - s)
_NATIVE_SOFTPLUS = ("h = V::blendv(z.exp().log1p(), z, z > V(T(20))); dh = one / (one + z.neg().exp());")
# celu with alpha = 1: expm1(z) below 0; phi' = exp(z) and phi'' = exp(z) there, 1 and 0 above
_NATIVE_CELU = "const V e = z.exp(); h = V::blendv(z.expm1(), z, z > zero); dh = V::blendv(e, one, z > zero);"
_NATIVE_LEAKY_RELU = (f"h = V::blendv(z * V(T({LEAKY_SLOPE!r})), z, z > zero); "
                      f"dh = V::blendv(V(T({LEAKY_SLOPE!r})), one, z > zero);")

_FAMILIES: dict[str, ExpertFamily] = {
    "linear": ExpertFamily("linear", _identity, homogeneous=True, derivative=torch.ones_like, piecewise_linear=True,
                           odd=True, fused=_fused_linear, native="h = z; dh = one;"),
    "relu": ExpertFamily("relu", torch.relu, homogeneous=True, derivative=_relu_d1, piecewise_linear=True, kinks=(0.0,),
                         fused=_fused_relu,
                         native="h = at::vec::maximum(z, zero); dh = V::blendv(zero, one, z > zero);"),
    "leaky_relu": ExpertFamily("leaky_relu", _leaky_relu, homogeneous=True, derivative=_leaky_relu_d1,
                               piecewise_linear=True, kinks=(0.0,), native=_NATIVE_LEAKY_RELU),
    "gelu": ExpertFamily("gelu", _gelu, homogeneous=False, derivative=_gelu_d1, second_derivative=_gelu_d2,
                         fused=_fused_gelu, native=_NATIVE_GELU, native_second=_NATIVE_GELU_D2),
    "tanh": ExpertFamily("tanh", torch.tanh, homogeneous=False, derivative=_tanh_d1, second_derivative=_tanh_d2,
                         odd=True, fused=_fused_tanh, native="h = z.tanh(); dh = one - h * h;",
                         native_second="d2h = V(T(-2)) * h * dh;"),
    "sigmoid": ExpertFamily("sigmoid", torch.sigmoid, homogeneous=False, derivative=_sigmoid_d1,
                            second_derivative=_sigmoid_d2, fused=_fused_sigmoid,
                            native="h = one / (one + z.neg().exp()); dh = h * (one - h);",
                            native_second="d2h = dh * (one - V(T(2)) * h);"),
    "softplus": ExpertFamily("softplus", torch.nn.functional.softplus, homogeneous=False, derivative=torch.sigmoid,
                             second_derivative=_sigmoid_d1, native=_NATIVE_SOFTPLUS,
                             native_second="d2h = dh * (one - dh);"),
    "celu": ExpertFamily("celu", torch.nn.functional.celu, homogeneous=False, native=_NATIVE_CELU,
                         native_second="d2h = V::blendv(dh, zero, z > zero);"),  # dh = exp(z) below 0
    "constant": ExpertFamily("constant", _identity, homogeneous=False, input_dependent=False,
                             derivative=torch.ones_like, piecewise_linear=True, fused=_fused_linear),
}
_ALIASES = {"id": "linear", "identity": "linear", "cubic": "poly3"}


def registered_families() -> tuple[ExpertFamily, ...]:
    """The named expert families of the registry (without the ``polyP`` family made on demand), in order."""
    return tuple(_FAMILIES.values())


#: Polynomial degrees whose families the native C++ kernels are built with (the papers' ``poly2`` and ``poly3``);
#: other degrees run the eager kernels.
NATIVE_POLY_DEGREES = (2, 3)


def native_families() -> tuple[ExpertFamily, ...]:
    """The families with C++ forms (``native``) that the native kernels are built with, in a fixed order: the
    registered ones, then ``polyP`` for P in :data:`NATIVE_POLY_DEGREES`."""
    polys = tuple(_poly_family(p) for p in NATIVE_POLY_DEGREES)
    return tuple(f for f in (*registered_families(), *polys) if f.native is not None)


_POLY = re.compile(r"^poly([1-9][0-9]*)$")

EXPERTS = ("linear", "relu", "gelu", "tanh", "sigmoid", "poly2", "poly3", "constant")
"""The expert families of the nguyen2024-style ridge MoE (:func:`get_expert` also knows ``leaky_relu`` (slope
0.1), ``softplus``, ``celu``, any ``polyP`` and the aliases ``id``/``identity`` (linear) and ``cubic`` (poly3))."""

ACTIVATION_NAMES = tuple(sorted({*_FAMILIES, *_ALIASES, "poly2", "poly3"} - {"constant"}))
"""Every activation name :func:`get_expert` resolves (besides ``polyP`` for any P and the constant expert)."""


@functools.cache
def _poly_family(p: int) -> ExpertFamily:
    """The family ``polyP`` (one object per degree, so families compare equal)."""
    phi, d1, d2, fused = _power(p)
    native, native_second = _native_power(p) if p in NATIVE_POLY_DEGREES else (None, None)
    return ExpertFamily(f"poly{p}", phi, homogeneous=False, derivative=d1, second_derivative=d2, odd=p % 2 == 1,
                        fused=fused, native=native, native_second=native_second)


def _native_power(p: int) -> tuple[str, str]:
    r"""C++ forms of :math:`z^p`, :math:`pz^{p-1}` and :math:`p(p-1)z^{p-2}` (p >= 2) by repeated multiplication, as
    torch computes the low powers of the fused evaluator."""

    def power(q: int) -> str:
        return " * ".join(["z"] * q) if q else "one"

    native = f"dh = {power(p - 1)}; h = dh * z; dh = dh * V(T({p}));"
    return native, f"d2h = V(T({p * (p - 1)})) * {power(p - 2)};"


def get_expert(name: str | ExpertFamily) -> ExpertFamily:
    """Look up an expert family by name (``"relu"``, ``"poly3"``, ``"identity"``, ...)."""
    if isinstance(name, ExpertFamily):
        return name
    if isinstance(name, str):
        name = _ALIASES.get(name, name)
        if name in _FAMILIES:
            return _FAMILIES[name]
        m = _POLY.match(name)
        if m:
            p = int(m.group(1))
            if p == 1:
                return _FAMILIES["linear"]
            return _poly_family(p)
    raise ValueError(
        f"expert={name!r} is not a known expert family; valid names are "
        f"{list(EXPERTS)} (or 'polyP' for any integer degree P >= 1; also {sorted(set(_FAMILIES) - set(EXPERTS))} "
        f"and the aliases {sorted(_ALIASES)})."
    )


def expert_values(name: str | ExpertFamily, X: Array, weight: Array, bias: Array) -> Array:
    """Evaluate the experts of family ``name``; shorthand for ``get_expert(name)(X, weight, bias)``."""
    return get_expert(name)(X, weight, bias)


def activation_numpy(name: str, z: np.ndarray) -> np.ndarray:
    """The activation of family ``name`` applied to a numpy array (through the torch formula)."""
    return get_expert(name).numpy(z)
