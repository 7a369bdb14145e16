r"""Exact representations of a MoE regression function, and errors measured against them.

An over-specified fit (k = k* + 1 atoms) can reproduce the true regression function :math:`f_{G^*}` in
more than one way.  Parameter errors measured against :math:`G^*` alone then charge a fit for sitting
on a different, equally exact representation, and their exponents describe where the optimiser
stopped, not the data.  This module lists the whole set

.. math:: \mathcal E_k(G^*) = \{ G \text{ with } k \text{ atoms} : f_G = f_{G^*} \ \mu\text{-a.e.} \}

for the gates and ridge experts :math:`h(x;\eta) = \varphi(a^\top x + b)`, :math:`\eta = (b, a)`, of
moestat, and measures a fit by its distance to the nearest member (:func:`representation_errors`).
The derivations are in the docs page "Exact representations"; each family is checked numerically by
the test-suite (members reproduce :math:`f_{G^*}` to 1e-12; no exact fit found by a brute-force search
lies outside the families for generic truths).

Families for one extra atom (k = k* + 1)
----------------------------------------
*Sigmoid gate* :math:`f_G = \sum_i \sigma(\beta_{0i} + \beta_{1i}^\top x)\, h(x;\eta_i)` (weights are not
normalised, so atoms interact only through the sum):

``split j`` (:math:`\beta^*_{1j} \ne 0`)
    both copies keep the true gate and split the expert,
    :math:`h(\cdot;\eta_a) + h(\cdot;\eta_b) = h(\cdot;\eta^*_j)`: for linear experts any
    :math:`\eta_a + \eta_b = \eta^*_j`; for relu :math:`\eta_a = t\eta^*_j, \eta_b = (1-t)\eta^*_j`,
    :math:`t \in [0, 1]` (positive homogeneity); no member for other activations.
``split j`` (:math:`\beta^*_{1j} = 0`, a constant gate)
    copies with zero slope, weights :math:`w_a = \sigma(\beta_{0a})`, :math:`w_b` and experts
    :math:`c_a\eta^*_j, c_b\eta^*_j` with :math:`w_a c_a + w_b c_b = \sigma(\beta^*_{0j})`: for any activation
    :math:`c_a = c_b = 1` (a weight split); relu any :math:`c \ge 0`; linear any
    :math:`w_a\eta_a + w_b\eta_b = \sigma(\beta^*_{0j})\eta^*_j`.  For homogeneous experts also the
    *reflection pair* :math:`(l', \sigma(\beta^*_{0j})\eta^*_j)`, :math:`(-l', \sigma(\beta^*_{0j})\eta^*_j)` for
    any gate :math:`l'`, since :math:`\sigma(l) + \sigma(-l) = 1`.
``dead``
    all true atoms plus an extra atom whose expert vanishes on the support of :math:`\mu`; its gate is
    arbitrary.  :math:`\eta = 0` for linear, gelu, tanh and polyP (:math:`\varphi(0) = 0`); for relu every
    :math:`(a, b)` with :math:`b + w\|a\|_1 \le 0` on :math:`[-w, w]^d` (:math:`a = 0, b \le 0` for Gaussian
    inputs); no member for sigmoid-activation experts (:math:`\varphi > 0`).
``reflection`` (linear experts)
    :math:`\sigma(l)\,\eta^\top\tilde x = \eta^\top\tilde x - \sigma(-l)\,\eta^\top\tilde x`: the atoms of any
    non-empty subset S replaced by :math:`(-\beta^*_0, -\beta^*_1, -\eta^*)`, the extra atom carrying
    :math:`\sum_{i \in S}\eta^*_i/\sigma(u)` on a constant gate :math:`(u, 0_d)`.
*orbit* (atoms with :math:`\beta^*_{1m} = 0` and homogeneous experts, every k)
    :math:`\sigma(u)\,h(x; c\eta^*_m) = \sigma(\beta^*_{0m})h(x;\eta^*_m)` with
    :math:`c = \sigma(\beta^*_{0m})/\sigma(u)`.

*Softmax gate*, compared on translation-centred parameters (:func:`moestat.center_softmax`):

``split j``
    copies :math:`(\beta^*_{0j} + \log s, \beta^*_{1j}, \eta_a)`, :math:`(\beta^*_{0j} + \log(1-s), \beta^*_{1j},
    \eta_b)`, :math:`s \in (0, 1)`, with :math:`s\,h(\cdot;\eta_a) + (1-s)\,h(\cdot;\eta_b) = h(\cdot;\eta^*_j)`:
    :math:`\eta_a = \eta_b = \eta^*_j` for non-homogeneous activations; relu :math:`\eta = c\eta^*_j` with
    :math:`c_a, c_b \ge 0`, :math:`sc_a + (1-s)c_b = 1`, or one copy dead on the support and the other
    :math:`\eta^*_j` divided by its share; linear any :math:`s\eta_a + (1-s)\eta_b = \eta^*_j`.
    Normalisation rules out dead atoms.

The distance
------------
Atom :math:`i` of the fit is paired with atom :math:`\pi(i)` of a member :math:`\tilde G` by the assignment
minimising the mass-weighted first-order distance (the :math:`D_3` terms of nguyen2024 eq. 12, weighted
as the weight factors of the softmax Voronoi loss)

.. math:: d(\hat G, \tilde G) = \min_{\pi} \sum_{i=1}^{k} \tilde m_{\pi(i)}\,\big(|\hat\beta_{0i} -
          \tilde\beta_{0\pi(i)}| + \|\hat\beta_{1i} - \tilde\beta_{1\pi(i)}\|
          + \|\hat\eta_i - \tilde\eta_{\pi(i)}\|\big) + |\hat m_i - \tilde m_{\pi(i)}|,
          \qquad \tilde m_j = \mathbb E_\mu[\tilde\pi_j(X)],

the mass of the member's atom under its own gate (softmax copies carry :math:`s` and :math:`1-s` of the
true atom's mass; sigmoid copies the whole of it) and :math:`\hat m_i` the fitted atom's.  An atom whose
gate the family leaves free (dead atoms, reflection pairs) is weighted by the fitted atom's mass and its
gate contributes 0.  The weights matter: a copy whose weight fades (:math:`s \to 0`) has an unidentified
expert, and an unweighted distance would be dominated by it; the mass gap (first order in the gate
parameters of a live atom, so it changes no rate) stops either side from hiding mass: a true atom cannot
be faded away, and a fitted atom with mass cannot sit on a faded member.
:func:`representation_errors` returns :math:`\inf_{\tilde G \in \mathcal E_k(G^*)} d(\hat G, \tilde G)`, split
into the atoms that the representation adds or changes (the two copies of a split, a dead atom, the
extra atom of a reflection: ``over``) and the atoms matched to unchanged true atoms (``exact``), with
gate-weighted expert-function errors at the nearest member.  Infima are exact for the closed forms and
otherwise found by a grid search with zoom on the one- or two-dimensional family parameter (convex
inner problems by golden section).  Misspecified limits (no exact member, e.g. a sigmoid gate with
sigmoid-activation experts) are passed as ``gbar`` (:func:`moestat.estimate_gbar`) and join the
candidates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.optimize import linear_sum_assignment
from scipy.stats import norm, qmc

from .._torch import to_numpy
from .._validation import Choice, Real, check_choice, validate_arguments
from ..exceptions import RepresentationWarning, warn_user
from ..model import MoE
from ..params import Params
from ._common import check_compatible, unpack
from .voronoi import center_softmax

GATES_SUPPORTED = ("sigmoid", "softmax")
_HOMOGENEOUS = ("linear", "relu")
_DT = torch.float64
_LOGIT_MAX = 30.0

# grid sizes: coarse points, zoom points, zoom rounds; each round shrinks the box to 4 steps, so the final
# resolution is the coarse step times (4 / (zoom_points - 1))**rounds: about 1e-14 for all three
_FINE = {"1d": {"points": 401, "zoom_points": 41, "rounds": 14},
         "1d_inner": {"points": 201, "zoom_points": 21, "rounds": 20},
         "2d": {"points": 61, "zoom_points": 21, "rounds": 20}}


# ---------------------------------------------------------------------------------------- small tools
def _norm(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dim=-1)


def _grid_min(cost: Callable[[torch.Tensor], torch.Tensor], lo: torch.Tensor, hi: torch.Tensor, *,
              points: int, zoom_points: int, rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimise ``cost`` over boxes [lo, hi] (B, D), vectorised: a grid, then ``rounds`` zoomed grids.

    ``cost`` maps points (B, G, D) to values (B, G).  Each zoom keeps a box of two grid steps around the
    best point.  Returns the minimum (B,) and the minimiser (B, D).
    """
    B, D = lo.shape
    lo0, hi0 = lo.clone(), hi.clone()
    best_v = torch.full((B,), float("inf"), dtype=lo.dtype)
    best_x = lo.clone()
    for r in range(rounds + 1):
        m = points if r == 0 else zoom_points
        axis = torch.linspace(0.0, 1.0, m, dtype=lo.dtype)
        mesh = torch.stack(torch.meshgrid(*([axis] * D), indexing="ij"), -1).reshape(-1, D)
        pts = lo.unsqueeze(1) + mesh.unsqueeze(0) * (hi - lo).unsqueeze(1)          # (B, G, D)
        v, idx = cost(pts).min(1)
        x = pts[torch.arange(B), idx]
        better = v < best_v
        best_v = torch.where(better, v, best_v)
        best_x = torch.where(better.unsqueeze(1), x, best_x)
        step = (hi - lo) / (m - 1)
        lo = torch.maximum(best_x - 2 * step, lo0)
        hi = torch.minimum(best_x + 2 * step, hi0)
    return best_v, best_x


def _golden(cost: Callable[[torch.Tensor], torch.Tensor], lo: torch.Tensor, hi: torch.Tensor,
            iters: int = 80) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimise a convex ``cost`` (shape-preserving map of x) over [lo, hi] elementwise by golden section."""
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo.clone(), hi.clone()
    for _ in range(iters):
        c = b - g * (b - a)
        d = a + g * (b - a)
        left = cost(c) <= cost(d)
        b = torch.where(left, d, b)
        a = torch.where(left, a, c)
    x = 0.5 * (a + b)
    ends = torch.stack([lo, x, hi])
    vals = torch.stack([cost(lo), cost(x), cost(hi)])
    i = vals.argmin(0, keepdim=True)
    return vals.gather(0, i).squeeze(0), ends.gather(0, i).squeeze(0)


def _logit(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p) - torch.log1p(-p)


def mu_sample(d: int, *, inputs: str = "uniform", low: float = -1.0, high: float = 1.0, size: int = 2**14,
              seed: int = 0) -> np.ndarray:
    r"""A scrambled Sobol sample of size ``size`` from :math:`\mu` (:math:`U[low, high]^d` or :math:`N(0, I_d)`).

    Quasi-Monte Carlo integrates the smooth gate masses and expert errors with error about
    :math:`O(\log(m)^d/m)` rather than :math:`O(m^{-1/2})`; the default points are fixed (seed 0), so every
    call scores fits against the same quadrature.
    """
    u = qmc.Sobol(d, scramble=True, seed=seed).random(size)
    if inputs == "gaussian":
        return norm.ppf(np.clip(u, 1e-12, 1 - 1e-12))
    return low + (high - low) * u


# ------------------------------------------------------------------------------------------ the atoms
@dataclass
class _Atoms:
    """Atoms as torch blocks: gate intercepts b0 (..., k), slopes b1 (..., k, d), experts eta (..., k, d+1)
    with eta = (b, a)."""

    b0: torch.Tensor
    b1: torch.Tensor
    eta: torch.Tensor

    @classmethod
    def of(cls, p: Params) -> _Atoms:
        q = p.numpy()
        t = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=_DT)  # noqa: E731
        return cls(t(q.gate_bias), t(q.gate_weight),
                   torch.cat([t(q.expert_bias).unsqueeze(-1), t(q.expert_weight)], -1))

    def params(self) -> Params:
        return Params(to_numpy(self.b0), to_numpy(self.b1), to_numpy(self.eta[..., 1:]), to_numpy(self.eta[..., 0]))

    def cost_to(self, other: _Atoms) -> torch.Tensor:
        """First-order distances between every atom of self (..., k) and of other (..., m): (..., k, m)."""
        return ((self.b0.unsqueeze(-1) - other.b0.unsqueeze(-2)).abs()
                + _norm(self.b1.unsqueeze(-2) - other.b1.unsqueeze(-3))
                + _norm(self.eta.unsqueeze(-2) - other.eta.unsqueeze(-3)))

    def gates(self, gate: str, X: torch.Tensor) -> torch.Tensor:
        """Gate weights (..., m, k) of the atoms on inputs X (m, d)."""
        logits = X @ self.b1.transpose(-1, -2) + self.b0.unsqueeze(-2)
        return torch.sigmoid(logits) if gate == "sigmoid" else torch.softmax(logits, dim=-1)


@dataclass
class _Special:
    """Minimised weighted cost of a family's special atoms for a batch of items, and the atoms attaining it."""

    cost: torch.Tensor          # (B,)
    atoms: _Atoms               # (B, m) with m = 2 (split, reflection pair) or 1 (dead, extra atom)
    free_gate: torch.Tensor     # (B, m) bool: the family leaves this atom's gate free
    xi: list[str]


def _pack(b0a, b1a, ea, b0b, b1b, eb) -> _Atoms:
    return _Atoms(torch.stack([b0a, b0b], 1), torch.stack([b1a, b1b], 1), torch.stack([ea, eb], 1))


def _fixed(B: int) -> torch.Tensor:
    return torch.zeros(B, 2, dtype=torch.bool)


# --------------------------------------------------------------------------------- family minimisers
def _split_sigmoid(f1: _Atoms, f2: _Atoms, m1: torch.Tensor, m2: torch.Tensor, t0: torch.Tensor, t1: torch.Tensor,
                   te: torch.Tensor, mt: torch.Tensor, expert: str, zero_slope: bool) -> _Special | None:
    """Sigmoid-gate split of true atom (t0, t1, te) of mass mt by fitted atoms f1, f2 (masses m1, m2)."""
    B = f1.b0.shape[0]
    if not zero_slope:  # both copies keep the true gate, so both carry the true mass
        gate = (f1.b0 - t0).abs() + (f2.b0 - t0).abs() + _norm(f1.b1 - t1) + _norm(f2.b1 - t1)
        gap = (m1 - mt).abs() + (m2 - mt).abs()
        if expert == "linear":  # eta_a + eta_b = eta*: inf ||e1 - eta_a|| + ||e2 - eta_b|| = ||e1 + e2 - eta*||
            r = f1.eta + f2.eta - te
            ea, eb = f1.eta - 0.5 * r, f2.eta - 0.5 * r
            return _Special(mt * (gate + _norm(r)) + gap, _pack(t0, t1, ea, t0, t1, eb), _fixed(B), [""] * B)
        if expert == "relu":  # eta_a = t eta*, eta_b = (1 - t) eta*, t in [0, 1]: convex in t
            def c(t):
                return _norm(f1.eta - t.unsqueeze(-1) * te) + _norm(f2.eta - (1 - t).unsqueeze(-1) * te)
            v, t = _golden(c, torch.zeros(B, dtype=_DT), torch.ones(B, dtype=_DT))
            ea, eb = t.unsqueeze(-1) * te, (1 - t).unsqueeze(-1) * te
            return _Special(mt * (gate + v) + gap, _pack(t0, t1, ea, t0, t1, eb), _fixed(B),
                            [f"t={x:.6g}" for x in to_numpy(t)])
        return None
    return _weight_split_sigmoid(f1, f2, m1, m2, t0, te, expert)


def _weight_split_sigmoid(f1: _Atoms, f2: _Atoms, m1: torch.Tensor, m2: torch.Tensor, t0: torch.Tensor,
                          te: torch.Tensor, expert: str) -> _Special:
    """A constant true gate w* = sigma(t0): copies with zero slopes, constant weights wa, wb (their masses) and
    experts ca eta*, cb eta* with wa ca + wb cb = w*; for homogeneous experts also the reflection pair."""
    B = f1.b0.shape[0]
    ws = torch.sigmoid(t0)
    zero = torch.zeros_like(f1.b1)
    if expert not in _HOMOGENEOUS:  # ca = cb = 1: wa + wb = w*, one parameter v = wa / w*
        def c1(x):
            v = x[..., 0]
            wa, wb = v * ws.unsqueeze(1), (1 - v) * ws.unsqueeze(1)
            return (wa * ((f1.b0.unsqueeze(1) - _logit(wa)).abs() + _norm(f1.b1).unsqueeze(1)
                          + _norm(f1.eta - te).unsqueeze(1))
                    + wb * ((f2.b0.unsqueeze(1) - _logit(wb)).abs() + _norm(f2.b1).unsqueeze(1)
                            + _norm(f2.eta - te).unsqueeze(1))
                    + (m1.unsqueeze(1) - wa).abs() + (m2.unsqueeze(1) - wb).abs())
        eps = 1e-12
        v, x = _grid_min(c1, torch.full((B, 1), eps, dtype=_DT), torch.full((B, 1), 1 - eps, dtype=_DT),
                         **_FINE["1d"])
        vv = x[:, 0]
        return _Special(v, _pack(_logit(vv * ws), zero, te, _logit((1 - vv) * ws), zero, te), _fixed(B),
                        [f"w_share={a:.6g}" for a in to_numpy(vv)])

    def experts(wa, wb):  # wa, wb (B, G)
        if expert == "linear":  # inf wa||u|| + wb||v|| s.t. wa u + wb v = r is ||r|| (triangle inequality)
            r = wa.unsqueeze(-1) * f1.eta.unsqueeze(1) + wb.unsqueeze(-1) * f2.eta.unsqueeze(1) - \
                ws.reshape(-1, 1, 1) * te.unsqueeze(1)
            return _norm(r), r
        # relu: share p of w* carried by copy a: ca = p w*/wa, cb = (1-p) w*/wb; convex in p
        def cp(p):
            ca = p * ws.unsqueeze(1) / wa
            cb = (1 - p) * ws.unsqueeze(1) / wb
            return (wa * _norm(f1.eta.unsqueeze(1) - ca.unsqueeze(-1) * te.unsqueeze(1))
                    + wb * _norm(f2.eta.unsqueeze(1) - cb.unsqueeze(-1) * te.unsqueeze(1)))
        return _golden(cp, torch.zeros_like(wa), torch.ones_like(wa), iters=60)

    def c2(x):
        ua, ub = x[..., 0], x[..., 1]
        wa, wb = torch.sigmoid(ua), torch.sigmoid(ub)
        ev, _ = experts(wa, wb)
        return (wa * ((f1.b0.unsqueeze(1) - ua).abs() + _norm(f1.b1).unsqueeze(1))
                + wb * ((f2.b0.unsqueeze(1) - ub).abs() + _norm(f2.b1).unsqueeze(1)) + ev
                + (m1.unsqueeze(1) - wa).abs() + (m2.unsqueeze(1) - wb).abs())

    lo = torch.full((B, 2), -_LOGIT_MAX, dtype=_DT)
    v, x = _grid_min(c2, lo, -lo, **_FINE["2d"])
    ua, ub = x[:, 0], x[:, 1]
    wa, wb = torch.sigmoid(ua), torch.sigmoid(ub)
    if expert == "linear":
        _, r = experts(wa.unsqueeze(1), wb.unsqueeze(1))
        r = r[:, 0]
        big_a = (wa >= wb).unsqueeze(-1)  # the residual goes to the copy with the larger weight
        ea = torch.where(big_a, f1.eta - r / wa.unsqueeze(-1), f1.eta)
        eb = torch.where(big_a, f2.eta, f2.eta - r / wb.unsqueeze(-1))
        xi = [f"w_a={a:.6g},w_b={b:.6g}" for a, b in zip(to_numpy(wa), to_numpy(wb), strict=True)]
    else:
        _, p = experts(wa.unsqueeze(1), wb.unsqueeze(1))
        p = p[:, 0]
        ea = (p * ws / wa).unsqueeze(-1) * te
        eb = ((1 - p) * ws / wb).unsqueeze(-1) * te
        xi = [f"w_a={a:.6g},w_b={b:.6g},share={c:.6g}"
              for a, b, c in zip(to_numpy(wa), to_numpy(wb), to_numpy(p), strict=True)]
    out = _Special(v, _pack(ua, zero, ea, ub, zero, eb), _fixed(B), xi)
    # reflection pair (l', w* eta*), (-l', w* eta*) for any l': the gates are free, so the copies are weighted by
    # the fitted masses; inf over l' of m1|g1 - l'| + m2|g2 + l'| = min(m1, m2)|g1 + g2| (attained at the heavier)
    we = ws.unsqueeze(-1) * te
    light = torch.minimum(m1, m2)
    refl = (light * ((f1.b0 + f2.b0).abs() + _norm(f1.b1 + f2.b1)) + m1 * _norm(f1.eta - we) + m2 * _norm(f2.eta - we))
    better = refl < out.cost
    if bool(better.any()):
        heavy1 = (m1 >= m2)
        l0 = torch.where(heavy1, f1.b0, -f2.b0)
        l1 = torch.where(heavy1.unsqueeze(-1), f1.b1, -f2.b1)
        ref = _pack(l0, l1, we, -l0, -l1, we)
        b = better.unsqueeze(-1)
        out = _Special(torch.where(better, refl, out.cost),
                       _Atoms(torch.where(b, ref.b0, out.atoms.b0), torch.where(b.unsqueeze(-1), ref.b1, out.atoms.b1),
                              torch.where(b.unsqueeze(-1), ref.eta, out.atoms.eta)),
                       torch.where(b, torch.ones_like(out.free_gate), out.free_gate),
                       ["reflection pair" if bb else x for bb, x in zip(better.tolist(), out.xi, strict=True)])
    return out


def _split_softmax(f1: _Atoms, f2: _Atoms, m1: torch.Tensor, m2: torch.Tensor, t0: torch.Tensor, t1: torch.Tensor,
                   te: torch.Tensor, mt: torch.Tensor, expert: str, dead: Callable | None = None) -> _Special:
    """Softmax split (centred parameters): copies at log s and log(1-s) with masses s mt and (1-s) mt and
    s h_a + (1-s) h_b = h*."""
    B = f1.b0.shape[0]
    s1, s2 = _norm(f1.b1 - t1), _norm(f2.b1 - t1)

    def gate(u):  # u = logit(s), (B, G): gate terms weighted by the copies' shares, and the mass gaps / mt
        s = torch.sigmoid(u)
        ls, l1s = torch.nn.functional.logsigmoid(u), torch.nn.functional.logsigmoid(-u)
        mtu = mt.unsqueeze(1)
        return (s * ((f1.b0.unsqueeze(1) - t0.unsqueeze(1) - ls).abs() + s1.unsqueeze(1))
                + (1 - s) * ((f2.b0.unsqueeze(1) - t0.unsqueeze(1) - l1s).abs() + s2.unsqueeze(1))
                + ((m1.unsqueeze(1) - s * mtu).abs() + (m2.unsqueeze(1) - (1 - s) * mtu).abs()) / mtu)

    lo = torch.full((B, 1), -_LOGIT_MAX, dtype=_DT)
    if expert == "relu":  # experts c eta* with s ca + (1 - s) cb = 1; v = s ca in [0, 1], convex in v for fixed s
        def inner(u):
            s = torch.sigmoid(u)

            def cv(v):
                ca, cb = v / s, (1 - v) / (1 - s)
                return (s * _norm(f1.eta.unsqueeze(1) - ca.unsqueeze(-1) * te.unsqueeze(1))
                        + (1 - s) * _norm(f2.eta.unsqueeze(1) - cb.unsqueeze(-1) * te.unsqueeze(1)))
            return _golden(cv, torch.zeros_like(u), torch.ones_like(u), iters=60)

        v, x = _grid_min(lambda x: gate(x[..., 0]) + inner(x[..., 0])[0], lo, -lo, **_FINE["1d_inner"])
        u = x[:, 0]
        s = torch.sigmoid(u)
        vv = inner(u.unsqueeze(1))[1][:, 0]
        ea, eb = (vv / s).unsqueeze(-1) * te, ((1 - vv) / (1 - s)).unsqueeze(-1) * te
        xi = [f"s={a:.6g},c_a={b:.6g}" for a, b in zip(to_numpy(s), to_numpy(vv / s), strict=True)]
        if dead is not None:  # one copy dead on the support (any dead vector), the other eta* / its share
            for which in (0, 1):
                dist, proj = dead(f1.eta if which == 0 else f2.eta)
                other = f2.eta if which == 0 else f1.eta

                def cd(x, dist=dist, other=other, which=which):
                    u = x[..., 0]
                    s_dead = torch.sigmoid(u) if which == 0 else torch.sigmoid(-u)
                    share = 1 - s_dead
                    return (gate(u) + s_dead * dist.unsqueeze(1)
                            + share * _norm(other.unsqueeze(1) - (1.0 / share).unsqueeze(-1) * te.unsqueeze(1)))
                vd, xd = _grid_min(cd, lo, -lo, **_FINE["1d"])
                better = vd < v
                if bool(better.any()):
                    ud = xd[:, 0]
                    sd = torch.sigmoid(ud)
                    live = (te / (1 - sd).unsqueeze(-1)) if which == 0 else (te / sd.unsqueeze(-1))
                    na, nb = (proj, live) if which == 0 else (live, proj)
                    v, u = torch.where(better, vd, v), torch.where(better, ud, u)
                    ea = torch.where(better.unsqueeze(-1), na, ea)
                    eb = torch.where(better.unsqueeze(-1), nb, eb)
                    xi = [f"s={float(a):.6g},dead_copy={'ab'[which]}" if bb else x
                          for a, bb, x in zip(sd, better.tolist(), xi, strict=True)]
    else:
        def experts(u):
            s = torch.sigmoid(u)
            if expert == "linear":  # inf s||u_a|| + (1-s)||u_b|| s.t. s u_a + (1 - s) u_b = r is ||r||
                r = s.unsqueeze(-1) * f1.eta.unsqueeze(1) + (1 - s).unsqueeze(-1) * f2.eta.unsqueeze(1) - \
                    te.unsqueeze(1)
                return _norm(r), r
            return s * _norm(f1.eta - te).unsqueeze(1) + (1 - s) * _norm(f2.eta - te).unsqueeze(1), None

        v, x = _grid_min(lambda x: gate(x[..., 0]) + experts(x[..., 0])[0], lo, -lo, **_FINE["1d"])
        u = x[:, 0]
        s = torch.sigmoid(u)
        if expert == "linear":
            _, r = experts(u.unsqueeze(1))
            r = r[:, 0]
            big_a = (s >= 0.5).unsqueeze(-1)  # the residual goes to the heavier copy
            ea = torch.where(big_a, f1.eta - r / s.unsqueeze(-1), f1.eta)
            eb = torch.where(big_a, f2.eta, f2.eta - r / (1 - s).unsqueeze(-1))
        else:
            ea = eb = te
        xi = [f"s={a:.6g}" for a in to_numpy(s)]
    ua = t0 + torch.nn.functional.logsigmoid(u)
    ub = t0 + torch.nn.functional.logsigmoid(-u)
    return _Special(mt * v, _pack(ua, t1, ea, ub, t1, eb), _fixed(B), xi)


def _dead_projection(eta: torch.Tensor, expert: str, inputs: str, half_width: float
                     ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Euclidean projection of experts eta = (b, a) (B, d+1) onto the experts that vanish on the support.

    relu on [-w, w]^d: minimise ||a - a0||^2 + (b - b0)^2 s.t. b + w||a||_1 <= 0; the KKT point is
    a = soft(a0, lam w), b = b0 - lam with lam the root of b0 - lam + w sum (|a0| - lam w)_+ = 0 (bisection).
    Returns (distance, projected eta) or None when the family has no vanishing expert.
    """
    if expert in ("linear", "gelu", "tanh") or (expert.startswith("poly") and expert[4:].isdigit()):
        return _norm(eta), torch.zeros_like(eta)
    if expert != "relu":
        return None
    b0, a0 = eta[:, 0], eta[:, 1:]
    if inputs == "gaussian":  # dead on R^d only when a = 0 and b <= 0
        proj = torch.cat([torch.clamp(b0, max=0.0).unsqueeze(-1), torch.zeros_like(a0)], -1)
        return _norm(eta - proj), proj
    w = half_width
    lo = torch.zeros_like(b0)
    hi = torch.clamp(b0 + w * a0.abs().sum(-1), min=0.0)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        g = b0 - mid + w * torch.clamp(a0.abs() - mid.unsqueeze(-1) * w, min=0.0).sum(-1)
        lo = torch.where(g > 0, mid, lo)
        hi = torch.where(g > 0, hi, mid)
    lam = hi
    a = torch.sign(a0) * torch.clamp(a0.abs() - lam.unsqueeze(-1) * w, min=0.0)
    proj = torch.cat([(b0 - lam).unsqueeze(-1), a], -1)
    return _norm(eta - proj), proj


def _orbit_costs(fit: _Atoms, m_fit: torch.Tensor, t0: torch.Tensor, te: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted cost of each fitted atom (R, k) to the orbit sigma(u) h(c eta*) = sigma(b0*) h(eta*) of one
    zero-slope true atom (homogeneous experts; the member's mass is sigma(u)), and the optimal u."""
    R, k = fit.b0.shape
    ws = torch.sigmoid(t0)
    b0, b1, eta = fit.b0.reshape(-1), fit.b1.reshape(R * k, -1), fit.eta.reshape(R * k, -1)
    mf = m_fit.reshape(-1)

    def cost(x):
        u = x[..., 0]
        w = torch.sigmoid(u)
        return w * ((b0.unsqueeze(1) - u).abs() + _norm(b1).unsqueeze(1)
                    + _norm(eta.unsqueeze(1) - (ws / w).unsqueeze(-1) * te)) + (mf.unsqueeze(1) - w).abs()
    lo = torch.full((R * k, 1), float(t0), dtype=_DT)
    v, x = _grid_min(cost, lo, torch.full_like(lo, _LOGIT_MAX), **_FINE["1d"])
    return v.reshape(R, k), x[:, 0].reshape(R, k)


# ------------------------------------------------------------------------------------------- result
@dataclass
class RepresentationErrors:
    r"""Errors of fitted mixing measures against the nearest exact representation of the truth.

    Attributes
    ----------
    summary : DataFrame
        One row per replicate: ``rep``, ``family`` (``"split"``, ``"dead"``, ``"reflection"``, ``"truth"``
        (k = k*) or ``"gbar"``), ``atom`` (the true atom split, or the gbar member; -1 otherwise), ``xi``
        (the family parameter of the nearest member), ``over_param`` (mass-weighted first-order error of
        the atoms the representation adds or changes), ``exact_param`` (the same over atoms matched to
        unchanged true atoms), ``param`` (their sum, the infimum), ``over_sup``, ``over_l2``,
        ``exact_sup``, ``exact_l2`` (largest gate-weighted expert-function error of an atom of that role,
        :math:`\sup_x \tilde\pi(x)|h - \tilde h|` and :math:`(\mathbb E_\mu[\tilde\pi (h - \tilde h)^2])^{1/2}`),
        ``over_param_raw``, ``exact_param_raw`` (unweighted first-order errors at the same member) and
        ``candidates`` (members compared).
    atoms : DataFrame
        One row per replicate x fitted atom: ``rep``, ``fitted_atom``, ``role`` (``over``/``exact``),
        ``true_atom`` (the true atom it stands for, -1 for a dead or extra atom), ``mass`` (of the member's
        atom, the weight used), ``fitted_mass``, block errors ``gate_bias``, ``gate_weight``,
        ``expert_weight``, ``expert_bias``, ``expert`` (:math:`\|\Delta\eta\|`), ``first_order``,
        ``mass_gap``, ``weighted`` (``mass * first_order + mass_gap``, the atom's term of the distance), and
        ``expert_sup``, ``expert_l2`` (gate-weighted).
    nearest : Params
        Batched (R, k, ...): the nearest member, atoms aligned with the fitted atoms (softmax: centred).
    settings : dict
    """

    summary: pd.DataFrame
    atoms: pd.DataFrame
    nearest: Params
    settings: dict

    def to_frame(self) -> pd.DataFrame:
        """The per-replicate summary (a copy)."""
        return self.summary.copy()


# ------------------------------------------------------------------------------------------ main API
def _check_spec(spec: MoE) -> None:
    check_choice("gate", spec.gate, GATES_SUPPORTED)
    if abs(float(spec.temperature) - 1.0) > 0:
        raise ValueError("representation_errors needs temperature 1 (the families are written for tau = 1).")
    if not spec.family.input_dependent:
        raise ValueError("representation_errors covers ridge experts phi(a^T x + b); constant experts are not "
                         "supported (use voronoi_loss).")


@validate_arguments(inputs=Choice("uniform", "gaussian"), low=Real(), high=Real(), zero_slope_tol=Real(0))
def representation_errors(params: Any, truth: Any, *, spec: MoE | None = None, gbar: Params | None = None,
                          X: Any = None, inputs: str = "uniform", low: float = -1.0, high: float = 1.0,
                          zero_slope_tol: float = 0.0) -> RepresentationErrors:
    r"""Distance of fitted mixing measures to the nearest exact representation of the truth.

    The functional is :math:`\inf_{\tilde G \in \mathcal E_k(G^*)} d(\hat G, \tilde G)` with the mass-weighted,
    matched first-order distance :math:`d` and the families of exact k-atom representations of the module
    docstring: one formula for both gates, each gate's own exact set.  It is zero exactly when
    :math:`f_{\hat G} = f_{G^*}`, does not change along the exact continua that make Voronoi losses against
    :math:`G^*` depend on the optimiser, and splits into ``over`` (atoms the representation adds or changes)
    and ``exact`` parts whose rates the theories predict separately.

    Parameters
    ----------
    params : Params or (MoE, Params)
        Fitted parameters with k = k* or k* + 1 atoms, unbatched or batched (R, k, ...).
    truth : Params or (MoE, Params)
        True parameters (k* atoms, unbatched).
    spec : MoE, optional
        Gate and expert family (taken from a ``(MoE, Params)`` pair if not given): a sigmoid or softmax gate
        with temperature 1 and a ridge expert family.
    gbar : Params, optional
        Batched (S, k, ...) misspecified limits (:func:`moestat.estimate_gbar`), added as candidates.
    X : array (m, d), optional
        A sample from :math:`\mu` for the gate masses and the expert-function errors; default
        :func:`mu_sample` (2^14 scrambled Sobol points of ``inputs``).
    inputs, low, high :
        The input distribution :math:`\mu`: ``"uniform"`` on :math:`[low, high]^d` (symmetric, ``low = -high``,
        for the dead relu family) or ``"gaussian"``.
    zero_slope_tol : float
        True atoms with :math:`\|\beta^*_1\| \le` this count as constant gates (their own families).

    Returns
    -------
    RepresentationErrors

    Raises
    ------
    ValueError
        Unsupported gate, temperature or expert; params and truth with different gates; k - k* not in {0, 1};
        no candidate (no exact representation exists and no ``gbar`` was given); an asymmetric uniform
        support with relu experts.
    """
    spec_p, p = unpack(params, "params")
    spec_t, t = unpack(truth, "truth")
    check_compatible(spec_p, p, spec_t, t)
    if spec_p is not None and spec_t is not None and spec_p.gate != spec_t.gate:
        raise ValueError(f"params use gate={spec_p.gate!r} but truth uses gate={spec_t.gate!r}; exact representations "
                         "are taken within one gate family (compare regression functions with l2_distance).")
    spec = spec or spec_p or spec_t
    if spec is None:
        raise ValueError("pass spec=MoE(...) or (MoE, Params) pairs: the families depend on the gate and expert.")
    _check_spec(spec)
    check_choice("inputs", inputs, ("uniform", "gaussian"))
    expert = spec.family.name
    if t.is_batched:
        raise ValueError("truth must be unbatched (one true mixing measure).")
    if inputs == "uniform" and expert == "relu" and not math.isclose(low, -high):
        raise ValueError(f"dead relu experts are derived for symmetric cubes [-w, w]^d; got low={low}, high={high}.")
    p = p.numpy().batched()
    R, k, k_star = p.n_reps, p.k, t.k
    if k - k_star not in (0, 1):
        raise ValueError(f"representation_errors handles k = k* or k* + 1 fitted atoms (got k={k}, k*={k_star}); "
                         "more extra atoms multiply the families.")
    Xn = mu_sample(p.d, inputs=inputs, low=low, high=high) if X is None else np.asarray(X, dtype=np.float64)
    if Xn.ndim != 2 or Xn.shape[1] != p.d:
        raise ValueError(f"X must have shape (m, {p.d}), got {Xn.shape}.")
    Xt = torch.as_tensor(Xn, dtype=_DT)
    softmax = spec.gate == "softmax"
    if softmax:
        p, t = center_softmax(p), center_softmax(t.numpy())
    fit, tru = _Atoms.of(p), _Atoms.of(t.numpy())
    m_fit = fit.gates(spec.gate, Xt).mean(-2)           # (R, k) masses of the fitted atoms
    m_true = tru.gates(spec.gate, Xt).mean(-2)          # (k*,)
    zero = (_norm(tru.b1) <= zero_slope_tol).tolist()
    _warn_larger_sets(spec, tru, zero, inputs, low, high)
    half = 0.5 * (high - low)
    dead = None if softmax else (lambda e: _dead_projection(e, expert, inputs, half))

    # weighted costs of fitted atoms to unchanged true atoms; zero-slope atoms of homogeneous sigmoid fits may move
    # along their orbit
    C = (fit.cost_to(_Atoms(tru.b0.expand(R, -1), tru.b1.expand(R, -1, -1), tru.eta.expand(R, -1, -1))) * m_true
         + (m_fit.unsqueeze(-1) - m_true).abs())
    orbit_u = {}
    if not softmax and expert in _HOMOGENEOUS:
        for m in range(k_star):
            if zero[m]:
                c_orb, u_orb = _orbit_costs(fit, m_fit, tru.b0[m], tru.eta[m])
                C[:, :, m] = torch.minimum(C[:, :, m], c_orb)
                orbit_u[m] = u_orb
    Cn = to_numpy(C)

    cands: list[dict] = []
    if k == k_star:
        for r in range(R):
            rows, cols = linear_sum_assignment(Cn[r])
            cands.append({"rep": r, "family": "truth", "atom": -1, "cost": float(Cn[r][rows, cols].sum()),
                          "special_rows": [], "match": dict(zip(rows.tolist(), cols.tolist(), strict=True)),
                          "xi": "", "special": None})
    else:
        cands += _split_candidates(fit, tru, m_fit, m_true, Cn, R, k, k_star, softmax, expert, zero, inputs, half)
        if dead is not None:
            cands += _dead_candidates(fit, m_fit, Cn, R, k, dead(fit.eta.reshape(R * k, -1)))
        if not softmax and expert == "linear" and not any(zero):
            cands += _reflection_candidates(fit, tru, m_fit, m_true, Cn, R, k, k_star)
    if gbar is not None:
        cands += _gbar_candidates(fit, m_fit, gbar, t, spec.gate, Xt, softmax, R, k)
    if not cands:
        raise ValueError(f"no exact k-atom representation exists for gate={spec.gate!r}, expert={expert!r} with "
                         f"k = k* + 1 (the extra atom can neither split a true atom nor vanish); pass gbar= "
                         "(moestat.estimate_gbar) to measure against the misspecified limit.")
    return _assemble(cands, fit, tru, m_fit, R, k, spec, orbit_u, Xt, inputs, low, high)


def _split_candidates(fit: _Atoms, tru: _Atoms, m_fit: torch.Tensor, m_true: torch.Tensor, Cn: np.ndarray,
                      R: int, k: int, k_star: int, softmax: bool, expert: str, zero: list[bool], inputs: str,
                      half: float) -> list[dict]:
    """One candidate per (replicate, split true atom, unordered pair of fitted atoms playing the copies)."""
    pairs = [(i1, i2) for i1 in range(k) for i2 in range(i1 + 1, k)]
    i1 = torch.tensor([a for a, _ in pairs])
    i2 = torch.tensor([b for _, b in pairs])
    B = R * len(pairs)
    f1 = _Atoms(fit.b0[:, i1].reshape(-1), fit.b1[:, i1].reshape(B, -1), fit.eta[:, i1].reshape(B, -1))
    f2 = _Atoms(fit.b0[:, i2].reshape(-1), fit.b1[:, i2].reshape(B, -1), fit.eta[:, i2].reshape(B, -1))
    m1, m2 = m_fit[:, i1].reshape(-1), m_fit[:, i2].reshape(-1)
    out: list[dict] = []
    for j in range(k_star):
        t0, t1, te, mt = tru.b0[j].expand(B), tru.b1[j].expand(B, -1), tru.eta[j].expand(B, -1), m_true[j].expand(B)
        if softmax:
            dead = (lambda e: _dead_projection(e, expert, inputs, half)) if expert == "relu" else None
            sp = _split_softmax(f1, f2, m1, m2, t0, t1, te, mt, expert, dead)
        else:
            sp = _split_sigmoid(f1, f2, m1, m2, t0, t1, te, mt, expert, zero[j])
        if sp is None:
            continue
        cost = to_numpy(sp.cost).reshape(R, len(pairs))
        rest_cols = [m for m in range(k_star) if m != j]
        for r in range(R):
            for q, (a, b) in enumerate(pairs):
                rest_rows = [i for i in range(k) if i not in (a, b)]
                sub = Cn[r][np.ix_(rest_rows, rest_cols)]
                rr, cc = linear_sum_assignment(sub)
                out.append({"rep": r, "family": "split", "atom": j, "cost": float(cost[r, q] + sub[rr, cc].sum()),
                            "special_rows": [a, b],
                            "match": {rest_rows[x]: rest_cols[y] for x, y in zip(rr, cc, strict=True)},
                            "xi": sp.xi[r * len(pairs) + q], "special": (sp, r * len(pairs) + q)})
    return out


def _dead_candidates(fit: _Atoms, m_fit: torch.Tensor, Cn: np.ndarray, R: int, k: int,
                     dead: tuple[torch.Tensor, torch.Tensor] | None) -> list[dict]:
    """Sigmoid gate: all true atoms plus one fitted atom projected onto the dead experts (its gate is free, so it is
    weighted by its own mass)."""
    if dead is None:
        return []
    dist, proj = dead
    wdist = to_numpy(dist * m_fit.reshape(-1)).reshape(R, k)
    sp = _Special(torch.as_tensor(wdist.reshape(-1)), _Atoms(fit.b0.reshape(-1, 1), fit.b1.reshape(R * k, 1, -1),
                                                            proj.unsqueeze(1)),
                  torch.ones(R * k, 1, dtype=torch.bool), [""] * (R * k))
    out = []
    for r in range(R):
        for i in range(k):
            rest_rows = [x for x in range(k) if x != i]
            sub = Cn[r][rest_rows]
            rr, cc = linear_sum_assignment(sub)
            out.append({"rep": r, "family": "dead", "atom": -1, "cost": float(wdist[r, i] + sub[rr, cc].sum()),
                        "special_rows": [i], "match": {rest_rows[a]: int(b) for a, b in zip(rr, cc, strict=True)},
                        "xi": "", "special": (sp, r * k + i)})
    return out


def _reflection_candidates(fit: _Atoms, tru: _Atoms, m_fit: torch.Tensor, m_true: torch.Tensor, Cn: np.ndarray,
                           R: int, k: int, k_star: int) -> list[dict]:
    r"""Sigmoid gate, linear experts: the true atoms of a non-empty subset S replaced by their reflections (mass
    :math:`1 - m^*_i`), the extra atom carrying :math:`\sum_{i \in S}\eta^*_i/\sigma(u)` on a constant gate
    :math:`(u, 0_d)` of mass :math:`\sigma(u)`.  One candidate per (S, fitted atom playing the extra atom)."""
    refl = _Atoms(-tru.b0, -tru.b1, -tru.eta)
    Cr = to_numpy(fit.cost_to(_Atoms(refl.b0.expand(R, -1), refl.b1.expand(R, -1, -1), refl.eta.expand(R, -1, -1)))
                  * (1.0 - m_true) + (m_fit.unsqueeze(-1) - (1.0 - m_true)).abs())
    e_b0, e_b1, e_eta = fit.b0.reshape(-1), fit.b1.reshape(R * k, -1), fit.eta.reshape(R * k, -1)
    e_m = m_fit.reshape(-1)
    out: list[dict] = []
    for mask in range(1, 2**k_star):
        S = [m for m in range(k_star) if mask >> m & 1]
        total = tru.eta[S].sum(0)

        def cost(x, total=total):
            u = x[..., 0]
            w = torch.sigmoid(u)
            return w * ((e_b0.unsqueeze(1) - u).abs() + _norm(e_b1).unsqueeze(1)
                        + _norm(e_eta.unsqueeze(1) - (1.0 / w).unsqueeze(-1) * total)) + (e_m.unsqueeze(1) - w).abs()
        lo = torch.full((R * k, 1), -_LOGIT_MAX, dtype=_DT)
        v, x = _grid_min(cost, lo, -lo, **_FINE["1d"])
        v, u = to_numpy(v).reshape(R, k), x[:, 0].reshape(R, k)
        mixed = np.where(np.isin(np.arange(k_star), S)[None, None], Cr, Cn)          # (R, k, k*)
        for r in range(R):
            for e in range(k):
                rest = [i for i in range(k) if i != e]
                sub = mixed[r][rest]
                rr, cc = linear_sum_assignment(sub)
                ue = u[r, e]
                extra = _Atoms(ue.reshape(1, 1), torch.zeros(1, 1, fit.b1.shape[-1], dtype=_DT),
                               ((1.0 / torch.sigmoid(ue)) * total).reshape(1, 1, -1))
                sp = _Special(torch.tensor([v[r, e]]), extra, torch.zeros(1, 1, dtype=torch.bool), [""])
                out.append({"rep": r, "family": "reflection", "atom": -1, "cost": float(v[r, e] + sub[rr, cc].sum()),
                            "special_rows": [e], "match": {rest[a]: int(b) for a, b in zip(rr, cc, strict=True)},
                            "xi": "S=" + ",".join(map(str, S)) + f";u={float(ue):.6g}", "special": (sp, 0),
                            "reflected": S})
    return out


def _gbar_candidates(fit: _Atoms, m_fit: torch.Tensor, gbar: Params, p: Params, gate: str, Xt: torch.Tensor,
                     softmax: bool, R: int, k: int) -> list[dict]:
    g = gbar.numpy().batched()
    if g.k != k or g.d != p.d:
        raise ValueError(f"gbar has k={g.k}, d={g.d}; it must match the fit (k={k}, d={p.d}).")
    if softmax:
        g = center_softmax(g)
    ga = _Atoms.of(g)
    mg = ga.gates(gate, Xt).mean(-2)                                            # (S, k)
    f = _Atoms(fit.b0.unsqueeze(1), fit.b1.unsqueeze(1), fit.eta.unsqueeze(1))
    Cg = to_numpy(f.cost_to(_Atoms(ga.b0.unsqueeze(0), ga.b1.unsqueeze(0), ga.eta.unsqueeze(0)))
                  * mg.unsqueeze(0).unsqueeze(2)
                  + (m_fit.unsqueeze(1).unsqueeze(-1) - mg.unsqueeze(0).unsqueeze(2)).abs())  # (R, S, k, k)
    over = [_gbar_split_atoms(g, p, s) for s in range(g.n_reps)]
    out = []
    for r in range(R):
        for s in range(g.n_reps):
            rr, cc = linear_sum_assignment(Cg[r, s])
            out.append({"rep": r, "family": "gbar", "atom": s, "cost": float(Cg[r, s][rr, cc].sum()),
                        "special_rows": [], "match": dict(zip(rr.tolist(), cc.tolist(), strict=True)),
                        "xi": "", "special": None, "gbar": ga, "member": s, "over": over[s]})
    return out


def _gbar_split_atoms(g: Params, truth: Params, s: int) -> tuple[dict[int, int], set[int]]:
    """(true atom of each gbar atom, the gbar atoms of the split cell) for member ``s`` (both normalised alike).

    The k gbar atoms are matched to the k* true atoms by parameter distance (Hungarian); the unmatched
    atom and the atom matched to the true atom nearest to it form the split (the atoms the limit adds or
    changes, role ``over``)."""
    t = truth.numpy()

    def flat(q: Any, idx: Any) -> np.ndarray:
        return np.concatenate([np.asarray(q.gate_bias)[idx][..., None], np.asarray(q.gate_weight)[idx],
                               np.asarray(q.expert_weight)[idx], np.asarray(q.expert_bias)[idx][..., None]], -1)

    ug, ut = flat(g, s), flat(t, slice(None))                                  # (k, q), (k*, q)
    dist = np.linalg.norm(ug[:, None] - ut[None], axis=-1)
    rows, cols = linear_sum_assignment(dist)
    owner = dict(zip(rows.tolist(), cols.tolist(), strict=True))
    over: set[int] = set()
    for i in sorted(set(range(len(ug))) - set(owner)):
        j = int(np.argmin(dist[i]))
        owner[i] = j
        over |= {i, *(a for a, b in owner.items() if b == j)}
    return owner, over


def _warn_larger_sets(spec: MoE, tru: _Atoms, zero: list[bool], inputs: str, low: float, high: float) -> None:
    expert = spec.family.name
    if spec.gate == "sigmoid" and expert == "linear" and any(zero):
        warn_user("a sigmoid-gated linear truth with a zero-slope atom: sigma(l) + sigma(-l) = 1 lets that atom's "
                      "expert merge additively with any gate shared by two fitted atoms, a family not searched here; "
                      "the errors are upper bounds of the distance to the exact set.", RepresentationWarning)
    if spec.gate == "softmax" and expert == "linear" and tru.b0.shape[-1] == 2:
        warn_user("softmax-gated linear experts with k* = 2: multiplying numerator and denominator by "
                      "1 + c exp(l_1 - l_0) gives a further exact family with a convex combination of the two experts "
                      "(it needs k* + 2 atoms when k* >= 3), not searched here; the errors are upper bounds.",
                      RepresentationWarning)
    if expert == "relu" and inputs == "uniform":
        w = 0.5 * (high - low)
        reach = w * tru.eta[:, 1:].abs().sum(-1)
        b = tru.eta[:, 0]
        flat = ((b - reach) >= 0) | ((b + reach) <= 0)
        if bool(flat.any()):
            atoms = torch.nonzero(flat).squeeze(1).tolist()
            warn_user(f"true relu expert(s) {atoms} have no kink inside the support [{low}, {high}]^d (always "
                          "active or always zero there): their exact splits form a larger family than the one "
                          "searched; the errors are upper bounds.", RepresentationWarning)


def _assemble(cands: list[dict], fit: _Atoms, tru: _Atoms, m_fit: torch.Tensor, R: int, k: int, spec: MoE,
              orbit_u: dict, Xt: torch.Tensor, inputs: str, low: float, high: float) -> RepresentationErrors:
    by_rep: dict[int, list[dict]] = {}
    for c in cands:
        by_rep.setdefault(c["rep"], []).append(c)
    near = _Atoms(fit.b0.clone(), fit.b1.clone(), fit.eta.clone())
    role = np.full((R, k), "exact", dtype=object)
    true_atom = np.full((R, k), -1)
    free_gate = np.zeros((R, k), dtype=bool)
    rows = []
    for r in range(R):
        best = min(by_rep[r], key=lambda c: c["cost"])
        for i, m in best["match"].items():
            true_atom[r, i] = m
            if best["family"] == "gbar":
                ga, s = best["gbar"], best["member"]
                near.b0[r, i], near.b1[r, i], near.eta[r, i] = ga.b0[s, m], ga.b1[s, m], ga.eta[s, m]
                owner, over = best["over"]
                true_atom[r, i] = owner[m]
                if m in over:
                    role[r, i] = "over"
                continue
            if m in orbit_u:  # a zero-slope atom's orbit point, when it is nearer than the atom itself
                u = orbit_u[m][r, i]
                w = torch.sigmoid(u)
                c = torch.sigmoid(tru.b0[m]) / w
                mf = m_fit[r, i]
                orb = w * ((fit.b0[r, i] - u).abs() + _norm(fit.b1[r, i]) + _norm(fit.eta[r, i] - c * tru.eta[m])) + \
                    (mf - w).abs()
                ws = torch.sigmoid(tru.b0[m])
                plain = ((fit.b0[r, i] - tru.b0[m]).abs() + _norm(fit.b1[r, i] - tru.b1[m])
                         + _norm(fit.eta[r, i] - tru.eta[m])) * ws + (mf - ws).abs()
                if orb < plain:
                    near.b0[r, i], near.b1[r, i], near.eta[r, i] = u, torch.zeros_like(tru.b1[m]), c * tru.eta[m]
                    continue
            sign = -1.0 if m in best.get("reflected", ()) else 1.0
            near.b0[r, i], near.b1[r, i], near.eta[r, i] = sign * tru.b0[m], sign * tru.b1[m], sign * tru.eta[m]
        if best["special"] is not None:
            sp, q = best["special"]
            for slot, i in enumerate(best["special_rows"]):
                near.b0[r, i], near.b1[r, i], near.eta[r, i] = (sp.atoms.b0[q, slot], sp.atoms.b1[q, slot],
                                                                sp.atoms.eta[q, slot])
                role[r, i] = "over"
                true_atom[r, i] = best["atom"] if best["family"] == "split" else -1
                free_gate[r, i] = bool(sp.free_gate[q, slot])
        rows.append({"rep": r, "family": best["family"], "atom": best["atom"], "xi": best["xi"],
                     "param": best["cost"], "candidates": len(by_rep[r])})
    # per-atom errors at the nearest member; free gates take the fitted gate (distance 0, the fitted mass)
    fg = torch.as_tensor(free_gate)
    near.b0 = torch.where(fg, fit.b0, near.b0)
    near.b1 = torch.where(fg.unsqueeze(-1), fit.b1, near.b1)
    gates_near = near.gates(spec.gate, Xt)                                      # (R, m, k)
    mass = gates_near.mean(-2)
    d_b0 = (fit.b0 - near.b0).abs()
    d_b1 = _norm(fit.b1 - near.b1)
    d_a = _norm(fit.eta[..., 1:] - near.eta[..., 1:])
    d_b = (fit.eta[..., 0] - near.eta[..., 0]).abs()
    d_eta = _norm(fit.eta - near.eta)
    first = d_b0 + d_b1 + d_eta
    fam = spec.family
    h_fit = fam.evaluate(Xt, fit.eta[..., 1:], fit.eta[..., 0])                  # (R, m, k)
    h_near = fam.evaluate(Xt, near.eta[..., 1:], near.eta[..., 0])
    diff = (h_fit - h_near).abs()
    sup = (gates_near * diff).amax(-2)
    l2 = torch.sqrt((gates_near * diff * diff).mean(-2))
    atoms = pd.DataFrame({
        "rep": np.repeat(np.arange(R), k), "fitted_atom": np.tile(np.arange(k), R), "role": role.ravel(),
        "true_atom": true_atom.ravel(), "mass": to_numpy(mass).ravel(), "fitted_mass": to_numpy(m_fit).ravel(),
        "gate_bias": to_numpy(d_b0).ravel(), "gate_weight": to_numpy(d_b1).ravel(),
        "expert_weight": to_numpy(d_a).ravel(), "expert_bias": to_numpy(d_b).ravel(), "expert": to_numpy(d_eta).ravel(),
        "first_order": to_numpy(first).ravel(), "mass_gap": to_numpy((m_fit - mass).abs()).ravel(),
        "weighted": to_numpy(first * mass + (m_fit - mass).abs()).ravel(),
        "expert_sup": to_numpy(sup).ravel(), "expert_l2": to_numpy(l2).ravel(),
    })
    summary = pd.DataFrame(rows)
    for name in ("over", "exact"):
        g = atoms[atoms["role"] == name].groupby("rep")
        summary[f"{name}_param"] = g["weighted"].sum().reindex(range(R)).to_numpy()
        summary[f"{name}_sup"] = g["expert_sup"].max().reindex(range(R)).to_numpy()
        summary[f"{name}_l2"] = g["expert_l2"].max().reindex(range(R)).to_numpy()
        summary[f"{name}_param_raw"] = g["first_order"].sum().reindex(range(R)).to_numpy()
    nearest = near.params()
    settings = {"gate": spec.gate, "expert": fam.name, "k": k, "k_true": int(tru.b0.shape[-1]),
                "inputs": inputs, "low": low, "high": high, "mu_points": int(Xt.shape[0]),
                "translation": "center" if spec.gate == "softmax" else "none", "weights": "member gate mass"}
    cols = ["rep", "family", "atom", "xi", "over_param", "exact_param", "param", "over_sup", "over_l2", "exact_sup",
            "exact_l2", "over_param_raw", "exact_param_raw", "candidates"]
    return RepresentationErrors(summary[cols], atoms, nearest, settings)


# ------------------------------------------------------------------------------------------ members
def split_family(truth: Params, duplicate: Sequence[int], ts: Sequence[float] | np.ndarray) -> Params:
    r"""Exact over-specified representations of a sigmoid MoE with positively homogeneous experts.

    For :math:`\varphi` positively 1-homogeneous (linear, relu), duplicating true atom :math:`j` with its
    gate unchanged and its expert split,

    .. math:: \sigma(\beta^*_{1j}{}^\top x + \beta^*_{0j})\,[\varphi(t z) + \varphi((1-t) z)]
              = \sigma(\beta^*_{1j}{}^\top x + \beta^*_{0j})\,\varphi(z),\qquad z = a^{*\top}_j x + b^*_j,

    for every :math:`t \in [0, 1]`, so :math:`f_{\bar G_t} = f_{G^*}` with :math:`k^* + 1` atoms
    ([exact representations](../representations.md)).
    The regime-2 limit :math:`\bar G` of nguyen2024 Thm 5 is therefore not unique; this returns the family
    :math:`\{\bar G_t\}` on the grid ``ts`` as batched Params (S, k* + 1, ...), the set over which
    :func:`moestat.voronoi_loss` (``kind="D3"``, ``gbar=``) takes the infimum; :func:`sample_representations`
    draws random members of the same family.  For linear experts every
    additive split :math:`\eta_a + \eta_b = \eta^*` is exact, so the infimum over this sub-family is an
    upper bound of :math:`\inf_{\bar G} D_3`.
    """
    dup = [int(j) for j in duplicate]
    if len(dup) != 1:
        raise ValueError(f"split_family handles one duplicated atom (k = k* + 1); got duplicate={dup}.")
    p = truth.numpy()
    if p.is_batched:
        raise ValueError("split_family needs unbatched true Params.")
    j = dup[0]
    if not 0 <= j < p.k:
        raise ValueError(f"duplicate atom {j} is out of range for k*={p.k}.")
    t = np.asarray(ts, dtype=float)
    S = len(t)
    order = [*range(p.k), j]

    def tile(a: np.ndarray) -> np.ndarray:
        return np.repeat(a[order][None], S, axis=0)

    ew, eb = tile(p.expert_weight), tile(p.expert_bias)
    ew[:, j] *= t[:, None]
    eb[:, j] *= t
    ew[:, -1] *= (1 - t)[:, None]
    eb[:, -1] *= 1 - t
    return Params(tile(p.gate_bias), tile(p.gate_weight), ew, eb)


def sample_representations(spec: MoE, truth: Params, family: str, atom: int = 0, *, size: int = 100,
                           seed: Any = None, scale: float = 1.0, inputs: str = "uniform",
                           half_width: float = 1.0) -> Params:
    r"""Random members of one family of exact representations of :math:`f_{G^*}`.

    ``family="split"`` splits true atom ``atom`` (copy a replaces it, copy b is appended);
    ``family="dead"`` appends a dead atom (sigmoid gate only); ``family="orbit"`` moves the zero-slope true
    atom ``atom`` along its weight-scale orbit (sigmoid gate, homogeneous experts; k* atoms).  Family
    parameters are drawn uniformly (t, s, weight shares) or from :math:`N(0, \mathrm{scale}^2)` (free vectors
    and gates).  Softmax members are returned centred.  Every member satisfies :math:`f_G = f_{G^*}`; the
    test-suite checks it to 1e-12.

    Returns
    -------
    Params
        Batched (size, k, ...).
    """
    _check_spec(spec)
    check_choice("family", family, ("split", "dead", "orbit"))
    rng = np.random.default_rng(seed)
    t = truth.numpy()
    if spec.gate == "softmax":
        t = center_softmax(t)
    expert = spec.family.name
    k_star, d = t.k, t.d
    if not 0 <= atom < k_star:
        raise ValueError(f"atom={atom} is out of range for k*={k_star}.")
    gb = np.repeat(t.gate_bias[None], size, 0)
    gw = np.repeat(t.gate_weight[None], size, 0)
    eta = np.repeat(np.concatenate([t.expert_bias[:, None], t.expert_weight], 1)[None], size, 0)
    es = eta[:, atom].copy()
    zero_slope = bool(np.all(t.gate_weight[atom] == 0))

    def sig(z):
        return 1.0 / (1.0 + np.exp(-z))

    def logit(q):
        return np.log(q) - np.log1p(-q)

    if family == "orbit":
        if spec.gate != "sigmoid" or expert not in _HOMOGENEOUS or not zero_slope:
            raise ValueError("the orbit family needs a sigmoid gate, a homogeneous expert and a zero-slope atom.")
        ws = sig(t.gate_bias[atom])
        w = rng.uniform(ws, 1.0, size)
        gb[:, atom] = logit(w)
        eta[:, atom] = (ws / w)[:, None] * es
        return Params(gb, gw, eta[..., 1:], eta[..., 0])
    if family == "dead":
        if spec.gate != "sigmoid":
            raise ValueError("dead atoms exist only under the sigmoid gate (softmax weights are normalised).")
        if expert == "relu":
            a = rng.normal(0.0, scale, (size, d))
            b = -half_width * np.abs(a).sum(1) - np.abs(rng.normal(0.0, scale, size))
            if inputs == "gaussian":
                a[:] = 0.0
            e_new = np.concatenate([b[:, None], a], 1)
        elif _dead_projection(torch.zeros(1, d + 1, dtype=_DT), expert, inputs, half_width) is not None:
            e_new = np.zeros((size, d + 1))
        else:
            raise ValueError(f"expert {expert!r} has no vanishing member (phi > 0 everywhere): no dead family.")
        g_new = rng.normal(0.0, scale, size)
        w_new = rng.normal(0.0, scale, (size, d))
        return Params(np.concatenate([gb, g_new[:, None]], 1), np.concatenate([gw, w_new[:, None]], 1),
                      np.concatenate([eta[..., 1:], e_new[:, None, 1:]], 1),
                      np.concatenate([eta[..., 0], e_new[:, None, 0]], 1))
    ga, gwa = gb[:, atom].copy(), gw[:, atom].copy()
    gbb, gwb = ga.copy(), gwa.copy()
    if spec.gate == "softmax":
        s = rng.uniform(0.02, 0.98, size)
        ga, gbb = ga + np.log(s), gbb + np.log1p(-s)
        if expert == "relu":
            v = rng.uniform(0.0, 1.0, size)
            ea, eb = (v / s)[:, None] * es, ((1 - v) / (1 - s))[:, None] * es
        elif expert == "linear":
            ea = es + rng.normal(0.0, scale, (size, d + 1))
            eb = (es - s[:, None] * ea) / (1 - s)[:, None]
        else:
            ea = eb = es
    elif not zero_slope:
        if expert == "relu":
            tt = rng.uniform(0.0, 1.0, size)
            ea, eb = tt[:, None] * es, (1 - tt)[:, None] * es
        elif expert == "linear":
            ea = 0.5 * es + rng.normal(0.0, scale, (size, d + 1))
            eb = es - ea
        else:
            raise ValueError(f"a sigmoid-gated {expert!r} expert with a non-zero gate slope has no exact split "
                             "(h(eta_a) + h(eta_b) = h(eta*) needs a homogeneous activation).")
    else:
        ws = sig(t.gate_bias[atom])
        if expert in _HOMOGENEOUS:
            wa, wb = rng.uniform(0.05, 0.95, size), rng.uniform(0.05, 0.95, size)
            if expert == "relu":
                share = rng.uniform(0.0, 1.0, size)
                ea, eb = (share * ws / wa)[:, None] * es, ((1 - share) * ws / wb)[:, None] * es
            else:
                ea = es + rng.normal(0.0, scale, (size, d + 1))
                eb = (ws * es - wa[:, None] * ea) / wb[:, None]
        else:
            v = rng.uniform(0.02, 0.98, size)
            wa, wb = v * ws, (1 - v) * ws
            ea = eb = es
        ga, gbb = logit(wa), logit(wb)
    gb[:, atom], gw[:, atom], eta[:, atom] = ga, gwa, ea
    return Params(np.concatenate([gb, gbb[:, None]], 1), np.concatenate([gw, gwb[:, None]], 1),
                  np.concatenate([eta[..., 1:], eb[:, None, 1:]], 1), np.concatenate([eta[..., 0], eb[:, None, 0]], 1))
