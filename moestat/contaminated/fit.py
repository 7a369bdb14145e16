r"""Maximum likelihood for a contaminated MoE with the frozen model held fixed: :func:`fit_contaminated`.

The log-likelihood :math:`\ell(\lambda \text{ or } \beta, \tau;\ a, b, \nu) = \sum_t \log p(y_t \mid x_t)` of
:mod:`moestat.contaminated.model` is maximised over the gate and the prompt only; :math:`\log f_0(y_t \mid x_t)` is
computed once and never changes.  Two algorithms, batched over replicates and starts:

* ``method="em"`` (linear prompts): the EM algorithm of a two-component mixture whose first component is known.
  E-step: :math:`r_t = w(x_t)\mathcal N(y_t; a^\top x_t + b, \nu) / p(y_t \mid x_t)`.  M-step: weighted least
  squares for :math:`(a, b)`, :math:`\nu = \sum_t r_t (y_t - a^\top x_t - b)^2 / \sum_t r_t`, and
  :math:`\lambda = \frac1n\sum_t r_t` (constant gate) or one Newton step with step halving on the weighted
  logistic log-likelihood :math:`\sum_t r_t \log w(x_t) + (1 - r_t)\log(1 - w(x_t))` (softmax gate; a generalised
  EM step).  Each step cannot lower :math:`\ell` (Dempster, Laird & Rubin 1977).
* ``method="newton"`` (any ridge prompt): a few EM steps for a linear prompt, then damped Newton (Levenberg-
  Marquardt, each step accepted only if it raises :math:`\ell`) on the unconstrained coordinates
  :math:`(\operatorname{logit}\lambda \text{ or } \beta, \tau;\ a, b, \log(\nu - \nu_{\min}))` with the exact
  gradient and Hessian in closed form (autograd for a prompt activation without one).

Standard errors come from the observed information (the autograd Hessian of :math:`\ell` in the natural
parameters :math:`\lambda` or :math:`(\beta, \tau)`, :math:`a, b, \nu`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy import special, stats

from .._validation import check_int
from ..exceptions import ConvergenceWarning, DegenerateFitWarning, warn_user
from ..experts import get_expert
from ..report import Result
from .model import _LOG_2PI, ContaminatedMoE, ContaminatedParams

__all__ = ["METHODS", "ContaminatedFit", "fit_contaminated"]

METHODS = ("em", "newton")
_BOUND = 30.0
"""A softmax gate coefficient beyond this in absolute value is a separating gate (a fit on the boundary)."""
_LAM_EDGE = 1e-8
"""lambda below this (or above 1 minus it) is a vanishing prompt or a vanishing frozen model (on the boundary)."""


# ----------------------------------------------------------------------------- result
@dataclass
class ContaminatedFit(Result):
    """A maximum-likelihood fit of a contaminated MoE, batched over R replicates (the best of several starts each).

    Attributes
    ----------
    model : ContaminatedMoE
    params : ContaminatedParams
        The estimates, one row per replicate.
    loglik : ndarray (R,)
        Maximised log-likelihood.
    converged : ndarray of bool (R,)
        The selected start met the tolerance.
    boundary : ndarray of bool (R,)
        The selected start ran to the boundary (lambda -> 0 or 1, a separating gate, the variance floor).
    n_iter : ndarray (R,)
        Iterations of the selected start (EM plus Newton).
    best_start : ndarray (R,)
        Index of the selected start.
    start_loglik : ndarray (R, S)
        Final log-likelihood of every start.
    std_error : ndarray (R, p)
        Observed-information standard errors in the order of :meth:`names` (NaN where the information is
        singular).
    settings : dict
        Every knob of the call.
    history : DataFrame
        With ``history=True``: ``rep, start, iter, stage, loglik`` of every iteration.
    wall_time : float
        Seconds.
    """

    model: ContaminatedMoE
    params: ContaminatedParams
    loglik: np.ndarray
    converged: np.ndarray
    boundary: np.ndarray
    n_iter: np.ndarray
    best_start: np.ndarray
    start_loglik: np.ndarray
    std_error: np.ndarray
    nobs: int
    settings: dict[str, Any] = field(default_factory=dict)
    history: pd.DataFrame = field(default_factory=pd.DataFrame)
    wall_time: float = float("nan")

    @property
    def n_reps(self) -> int:
        return int(self.loglik.shape[0])

    def names(self) -> list[str]:
        """Coefficient names in the order of ``std_error``: ``gate:lam`` or ``gate:x1..xd, gate:const``, then
        ``prompt:x1..xd, prompt:const, prompt:var``."""
        d = self.model.d
        gate = ["gate:lam"] if self.model.gate == "constant" else [*(f"gate:x{j + 1}" for j in range(d)),
                                                                    "gate:const"]
        return [*gate, *(f"prompt:x{j + 1}" for j in range(d)), "prompt:const", "prompt:var"]

    def tidy(self, confidence_level: float = 0.95) -> pd.DataFrame:
        """One row per replicate x coefficient: ``rep, block, coef, estimate, std_error, conf_low, conf_high``
        (Wald intervals from the observed information)."""
        if not 0 < confidence_level < 1:
            raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level!r}; e.g. 0.95.")
        est = np.concatenate([self.params.gate_vector(), self.params.theta()], axis=1)
        z = float(stats.norm.ppf(0.5 + confidence_level / 2))
        names = self.names()
        rows = []
        for r in range(self.n_reps):
            for j, name in enumerate(names):
                block, coef = name.split(":")
                e, s = float(est[r, j]), float(self.std_error[r, j])
                rows.append((r, block, coef, e, s, e - z * s, e + z * s))
        return pd.DataFrame(rows, columns=["rep", "block", "coef", "estimate", "std_error", "conf_low", "conf_high"])

    def glance(self) -> pd.DataFrame:
        """One row per replicate: ``loglik, aic, bic, converged, boundary, n_iter, best_start, nobs`` and the
        scalar settings."""
        p = self.model.n_params
        out = pd.DataFrame({"rep": np.arange(self.n_reps), "loglik": self.loglik,
                            "aic": -2 * self.loglik + 2 * p, "bic": -2 * self.loglik + p * math.log(self.nobs),
                            "converged": self.converged, "boundary": self.boundary, "n_iter": self.n_iter,
                            "best_start": self.best_start, "nobs": self.nobs, "gate": self.model.gate,
                            "expert": self.model.expert})
        for key, value in self.settings.items():
            if key not in out and (isinstance(value, (int, float, str, bool)) or value is None):
                out[key] = value
        return out

    def select(self, rep: int | Sequence[int] | np.ndarray) -> ContaminatedFit:
        """The fit restricted to replicate(s) ``rep`` (still batched)."""
        idx = np.atleast_1d(np.asarray(rep, dtype=np.int64))
        if idx.size == 0 or (idx < 0).any() or (idx >= self.n_reps).any():
            raise ValueError(f"rep must be in [0, {self.n_reps}), got {np.asarray(rep).tolist()}.")
        hist = self.history
        if len(hist):
            hist = hist[hist["rep"].isin(idx)].assign(rep=lambda h: h["rep"].map({int(o): i for i, o in
                                                                                  enumerate(idx)}))
        return ContaminatedFit(self.model, self.params.select(idx), self.loglik[idx], self.converged[idx],
                               self.boundary[idx], self.n_iter[idx], self.best_start[idx], self.start_loglik[idx],
                               self.std_error[idx], self.nobs, dict(self.settings), hist.reset_index(drop=True),
                               self.wall_time)


# ----------------------------------------------------------------------------- state (numpy, batched over runs)
@dataclass
class _State:
    """Natural parameters of B runs: gate (lam (B,) or beta (B, d), tau (B,)) and prompt (a (B, d), b, v)."""

    a: np.ndarray
    b: np.ndarray
    v: np.ndarray
    lam: np.ndarray | None = None
    beta: np.ndarray | None = None
    tau: np.ndarray | None = None

    def params(self) -> ContaminatedParams:
        return ContaminatedParams(weight=self.a, bias=self.b, var=self.v, lam=self.lam, gate_weight=self.beta,
                                  gate_bias=self.tau)

    def take(self, idx: np.ndarray) -> _State:
        def pick(x: np.ndarray | None) -> Any:
            return None if x is None else x[idx].copy()
        return _State(pick(self.a), pick(self.b), pick(self.v), pick(self.lam), pick(self.beta), pick(self.tau))

    def put(self, idx: np.ndarray, other: _State) -> None:
        for name in ("a", "b", "v", "lam", "beta", "tau"):
            mine = getattr(self, name)
            if mine is not None:
                mine[idx] = getattr(other, name)

    @classmethod
    def from_params(cls, p: ContaminatedParams) -> _State:
        def copy(x: np.ndarray | None) -> Any:
            return None if x is None else np.array(x, dtype=float)
        return cls(copy(p.weight), copy(p.bias), copy(p.var), copy(p.lam), copy(p.gate_weight), copy(p.gate_bias))


def _to_phi(s: _State, floor: float) -> np.ndarray:
    """Unconstrained coordinates (B, p): (logit lambda or beta, tau; a, b, log(nu - nu_min))."""
    if s.lam is not None:
        gate = special.logit(np.clip(s.lam, 1e-300, 1 - 1e-16))[:, None]
    else:
        assert s.beta is not None and s.tau is not None
        gate = np.concatenate([s.beta, s.tau[:, None]], axis=1)
    psi = np.log(np.maximum(s.v - floor, 1e-300))
    return np.concatenate([gate, s.a, s.b[:, None], psi[:, None]], axis=1)


def _from_phi(phi: np.ndarray, gate: str, d: int, floor: float) -> _State:
    if gate == "constant":
        lam, beta, tau, rest = special.expit(phi[:, 0]), None, None, phi[:, 1:]
    else:
        lam, beta, tau, rest = None, phi[:, :d].copy(), phi[:, d].copy(), phi[:, d + 1:]
    return _State(rest[:, :d].copy(), rest[:, d].copy(), floor + np.exp(rest[:, d + 1]), lam, beta, tau)


# ----------------------------------------------------------------------------- EM
@dataclass
class _Data:
    """The B runs' data: inputs ``X`` (B, n, d), their design ``Z = [X, 1]``, ``y`` and the frozen log-density."""

    X: np.ndarray
    Z: np.ndarray
    y: np.ndarray
    lf0: np.ndarray

    def take(self, idx: np.ndarray) -> _Data:
        return _Data(self.X[idx], self.Z[idx], self.y[idx], self.lf0[idx])


def _e_step(s: _State, data: _Data) -> tuple[np.ndarray, np.ndarray]:
    """(responsibilities (B, n), log-likelihood (B,)) of a linear prompt, one exponential per observation."""
    coef = np.concatenate([s.a, s.b[:, None]], axis=1)
    resid = data.y - np.matmul(data.Z, coef[..., None])[..., 0]
    v = s.v[:, None]
    log_fp = (-0.5 * (_LOG_2PI + np.log(v))) - resid * resid * (0.5 / v)
    if s.lam is not None:
        l0 = np.log1p(-s.lam)[:, None] + data.lf0
        diff = log_fp - data.lf0
        diff += (np.log(s.lam) - np.log1p(-s.lam))[:, None]
    else:
        assert s.beta is not None and s.tau is not None
        score = np.matmul(data.X, s.beta[..., None])[..., 0] + s.tau[:, None]
        l0 = data.lf0 - _softplus(score)
        diff = score + log_fp - data.lf0
    e = np.exp(-np.abs(diff))
    r = np.where(diff > 0, 1.0, e) / (1.0 + e)
    ll = (l0 + np.maximum(diff, 0.0) + np.log1p(e)).sum(axis=1)
    return r, ll


def _softplus(x: np.ndarray) -> np.ndarray:
    """:math:`\\log(1 + e^x)`, stable for either sign."""
    out: np.ndarray = np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))
    return out


def _logistic_q(beta: np.ndarray, tau: np.ndarray, X: np.ndarray, r: np.ndarray) -> np.ndarray:
    s = np.matmul(X, beta[..., None])[..., 0] + tau[:, None]
    out: np.ndarray = (r * s - _softplus(s)).sum(axis=1)
    return out


def _gate_step(s: _State, data: _Data, r: np.ndarray) -> None:
    """One Newton step with step halving on the weighted logistic log-likelihood (never lowers it)."""
    assert s.beta is not None and s.tau is not None
    X, Z = data.X, data.Z
    B, n, d = X.shape
    score = np.matmul(X, s.beta[..., None])[..., 0] + s.tau[:, None]
    p = special.expit(score)
    g = np.matmul((r - p)[:, None, :], Z)[:, 0]
    H = np.matmul(Z.transpose(0, 2, 1) * (p * (1 - p))[:, None, :], Z) + 1e-10 * n * np.eye(d + 1)
    step = np.linalg.solve(H, g[..., None])[..., 0]
    q0 = (r * score - _softplus(score)).sum(axis=1)
    t = np.ones(B)
    for _ in range(30):
        beta, tau = s.beta + t[:, None] * step[:, :d], s.tau + t * step[:, d]
        ok = _logistic_q(beta, tau, X, r) >= q0 - 1e-12 * np.abs(q0)
        if ok.all():
            break
        t = np.where(ok, t, t / 2)
    s.beta, s.tau = np.where(ok[:, None], beta, s.beta), np.where(ok, tau, s.tau)


def _m_step(s: _State, data: _Data, r: np.ndarray, floor: float) -> None:
    d = data.X.shape[2]
    if s.lam is not None:
        s.lam = np.clip(r.mean(axis=1), 1e-300, 1.0 - 1e-16)
    else:
        _gate_step(s, data, r)
    Zr = data.Z.transpose(0, 2, 1) * r[:, None, :]
    A = np.matmul(Zr, data.Z)
    rhs = np.matmul(Zr, data.y[..., None])[..., 0]
    A = A + (1e-12 * np.trace(A, axis1=1, axis2=2)[:, None, None] + 1e-300) * np.eye(d + 1)
    coef = np.linalg.solve(A, rhs[..., None])[..., 0]
    s.a, s.b = coef[:, :d], coef[:, d]
    resid = data.y - np.matmul(data.Z, coef[..., None])[..., 0]
    s.v = np.maximum((r * resid ** 2).sum(axis=1) / np.maximum(r.sum(axis=1), 1e-300), floor)


def _run_em(s: _State, data: _Data, *, max_iter: int, tol: float, floor: float,
            record: list[tuple[int, int, str, float]] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EM on all runs until each run's mean log-likelihood gains less than ``tol`` in an iteration.  Returns
    (loglik, converged, iterations); the log-likelihood is that of the final parameters."""
    B, n = data.y.shape
    r, ll = _e_step(s, data)
    conv, iters = np.zeros(B, bool), np.zeros(B, int)
    if record is not None:
        record += [(b, 0, "em", float(ll[b])) for b in range(B)]
    act = np.arange(B)
    for it in range(1, max_iter + 1):
        full = act.size == B
        sub, dsub = (s, data) if full else (s.take(act), data.take(act))
        _m_step(sub, dsub, r, floor)
        r, ll_new = _e_step(sub, dsub)
        if not full:
            s.put(act, sub)
        gain = (ll_new - ll[act]) / n
        ll[act] = ll_new
        iters[act] = it
        conv[act] = gain < tol
        if record is not None:
            record += [(int(b), it, "em", float(v)) for b, v in zip(act, ll_new, strict=True)]
        keep = ~conv[act]
        act, r = act[keep], r[keep]
        if act.size == 0:
            break
    return ll, conv, iters


# ----------------------------------------------------------------------------- Newton (analytic derivatives)
def _activation(family: Any, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r""":math:`(\varphi, \varphi', \varphi'')` of a ridge family on a numpy array (closed forms, else autograd)."""
    if family.name == "linear":
        return z, np.ones_like(z), np.zeros_like(z)
    zt = torch.as_tensor(z)
    second = family.phi_second(zt)
    return (family.activation(zt).numpy(), family.phi_prime(zt).numpy(),
            np.zeros_like(z) if second is None else second.numpy())


def derivatives(model: ContaminatedMoE, phi: np.ndarray, data: _Data, floor: float, *, order: int = 2
                ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    r"""Log-likelihood, gradient and Hessian in the unconstrained coordinates :math:`\phi` (B runs), in closed form.

    With :math:`l_0 = \log(1 - w) + \log f_0`, :math:`u = \log w + \log f_p - l_0` and :math:`r = \sigma(u)`
    (the prompt's responsibility), each observation contributes :math:`\ell = l_0 + \log(1 + e^u)`,

    .. math::

        \nabla\ell = \nabla l_0 + r\,\nabla u, \qquad
        \nabla^2\ell = \nabla^2 l_0 + r\,\nabla^2 u + r(1 - r)\,\nabla u\,\nabla u^\top,

    where the gate enters through the score :math:`s` (:math:`\operatorname{logit}\lambda` or
    :math:`\beta^\top x + \tau`: :math:`\partial l_0/\partial s = -\sigma(s)`, :math:`\partial u/\partial s = 1`) and
    the prompt through :math:`\log f_p = -\tfrac12\log(2\pi\nu) - e^2/(2\nu)`, :math:`e = y - \varphi(z^\top c)`,
    :math:`z = (x, 1)`, :math:`c = (a, b)`, :math:`\nu = \nu_{\min} + e^{\psi}`.  Returns sums over observations:
    (B,), (B, p), (B, p, p); ``order`` 0 or 1 stops after the value or the gradient (None for the rest).
    """
    B, n, d = data.X.shape
    q = model.n_gate
    c, psi = phi[:, q:q + d + 1], phi[:, -1]
    kappa = np.exp(np.minimum(psi, 700.0))
    nu = (floor + kappa)[:, None]
    kap = kappa[:, None]
    zc = np.matmul(data.Z, c[..., None])[..., 0]
    family = get_expert(model.expert)
    linear = family.name == "linear"
    mu = zc if linear else family.numpy(zc)
    e = data.y - mu
    log_fp = -0.5 * (_LOG_2PI + np.log(nu)) - e * e / (2.0 * nu)
    if model.gate == "constant":
        score = phi[:, :1]
        l0 = data.lf0 - _softplus(score)
    else:
        score = np.matmul(data.X, phi[:, :d, None])[..., 0] + phi[:, d:d + 1]
        l0 = data.lf0 - _softplus(score)
    u = score + log_fp - data.lf0
    a = np.exp(-np.abs(u))
    ll = (l0 + np.maximum(u, 0.0) + np.log1p(a)).sum(axis=1)
    if order == 0:
        return ll, None, None
    r = np.where(u > 0, 1.0, a) / (1.0 + a)
    sig = np.broadcast_to(special.expit(score), (B, n))
    _, d1, d2 = _activation(family, zc)
    gate_z = np.ones((B, n, 1)) if model.gate == "constant" else data.Z
    dc = (e / nu * d1)[..., None] * data.Z
    dpsi = kap * (-0.5 / nu + e ** 2 / (2.0 * nu ** 2))
    G = np.concatenate([gate_z, dc, dpsi[..., None]], axis=2)  # grad of u
    grad_l = np.concatenate([((r - sig)[..., None] * gate_z).sum(axis=1),
                             (r[..., None] * G[..., q:]).sum(axis=1)], axis=1)
    if order == 1:
        return ll, grad_l, None
    w = r * (1.0 - r)
    H = np.matmul(G.transpose(0, 2, 1) * w[:, None, :], G)
    gg = np.matmul(gate_z.transpose(0, 2, 1) * (sig * (1.0 - sig))[:, None, :], gate_z)
    H[:, :q, :q] -= gg
    cc = np.matmul(data.Z.transpose(0, 2, 1) * (r * (e * d2 - d1 ** 2) / nu)[:, None, :], data.Z)
    H[:, q:q + d + 1, q:q + d + 1] += cc
    cp = (data.Z * (-r * kap * e * d1 / nu ** 2)[..., None]).sum(axis=1)
    H[:, q:q + d + 1, -1] += cp
    H[:, -1, q:q + d + 1] += cp
    H[:, -1, -1] += (r * (kap * (-0.5 / nu + e ** 2 / (2.0 * nu ** 2))
                          + kap ** 2 * (0.5 / nu ** 2 - e ** 2 / nu ** 3))).sum(axis=1)
    return ll, grad_l, H


def _on_boundary(s: _State, floor: float) -> np.ndarray:
    """Runs at the edge of the parameter space: lambda within :data:`_LAM_EDGE` of 0 or 1, a softmax gate
    coefficient beyond :data:`_BOUND`, or the variance within 1e-6 (relative) of its floor."""
    out = s.v <= floor * (1 + 1e-6)
    if s.lam is not None:
        return out | (s.lam < _LAM_EDGE) | (s.lam > 1 - _LAM_EDGE)
    assert s.beta is not None and s.tau is not None
    edge: np.ndarray = out | (np.abs(np.concatenate([s.beta, s.tau[:, None]], axis=1)).max(axis=1) > _BOUND)
    return edge


_MAX_STEP = 5.0
"""Largest Newton step in any unconstrained coordinate (a logit or a log-variance changes by at most e^5)."""


def _cap(step: np.ndarray) -> np.ndarray:
    """Steps shrunk (direction kept) so that no coordinate moves by more than :data:`_MAX_STEP`."""
    big = np.abs(step).max(axis=1, keepdims=True)
    out: np.ndarray = step * np.minimum(1.0, _MAX_STEP / np.maximum(big, 1e-300))
    return out


def _run_newton(model: ContaminatedMoE, s: _State, data: _Data, *, max_iter: int, tol: float, gtol: float,
                floor: float, record: list[tuple[int, int, str, float]] | None, offset: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Damped Newton (Levenberg-Marquardt; a step is kept only if it raises the log-likelihood).  Tolerances are on
    the mean log-likelihood.  Returns (loglik, converged, iterations, boundary)."""
    B, n, d = data.X.shape
    phi = _to_phi(s, floor)
    p = phi.shape[1]
    eye = np.eye(p)
    val, _, _ = derivatives(model, phi, data, floor, order=0)
    conv, bound = np.zeros(B, bool), np.zeros(B, bool)
    iters = np.zeros(B, int)
    mu = np.zeros(B)
    for it in range(1, max_iter + 1):
        act = np.flatnonzero(~(conv | bound))
        if act.size == 0:
            break
        dsub = data.take(act) if act.size < B else data
        ph = phi[act]
        _, g, H = derivatives(model, ph, dsub, floor)
        assert g is not None and H is not None
        g, neg = g / n, -0.5 * (H + H.transpose(0, 2, 1)) / n
        evals = np.linalg.eigvalsh(neg)
        scale = np.maximum(np.abs(evals).max(axis=1), 1e-12)
        m = np.maximum(mu[act], np.maximum(-evals.min(axis=1), 0.0) + 1e-10 * scale)
        step = np.linalg.solve(neg + m[:, None, None] * eye, g[..., None])[..., 0]
        done = ((evals.min(axis=1) > 0) & (0.5 * (g * step).sum(axis=1) < tol)) | (np.abs(g).max(axis=1) < gtol)
        step = _cap(step)
        base = val[act].copy()
        accepted = np.zeros(act.size, bool)
        new = ph.copy()
        for _ in range(40):
            trial = ph + step
            fv, _, _ = derivatives(model, trial, dsub, floor, order=0)
            ok = np.isfinite(fv) & (fv >= base) & ~accepted
            new[ok], base[ok] = trial[ok], fv[ok]
            accepted |= ok
            if accepted.all():
                break
            m = np.where(accepted, m, 10.0 * m + 1e-8 * scale)
            redo = ~accepted
            step[redo] = _cap(np.linalg.solve(neg[redo] + m[redo, None, None] * eye, g[redo, :, None])[..., 0])
        phi[act], val[act] = new, base
        mu[act] = np.where(accepted, m / 10.0, m)
        iters[act] = it
        conv[act] = done | (~accepted & (np.abs(g).max(axis=1) < 1e3 * gtol))
        bound[act] = _on_boundary(_from_phi(new, model.gate, d, floor), floor)
        if record is not None:
            record += [(int(b), int(offset[b] + it), "newton", float(v)) for b, v in zip(act, base, strict=True)]
    out = _from_phi(phi, model.gate, d, floor)
    s.a, s.b, s.v, s.lam, s.beta, s.tau = out.a, out.b, out.v, out.lam, out.beta, out.tau
    return val, conv, iters, bound


# ----------------------------------------------------------------------------- starts
def _ols(X: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Weighted) least squares of y on [X, 1] per replicate: slope (R, d), intercept (R,), residual variance."""
    R, n, d = X.shape
    w = np.ones_like(y) if w is None else w
    Z = np.concatenate([X, np.ones((R, n, 1))], axis=2)
    Zw = Z.transpose(0, 2, 1) * w[:, None, :]
    A = np.matmul(Zw, Z) + 1e-10 * n * np.eye(d + 1)
    coef = np.linalg.solve(A, np.matmul(Zw, y[..., None]))[..., 0]
    resid = y - np.matmul(Z, coef[..., None])[..., 0]
    return coef[:, :d], coef[:, d], (w * resid ** 2).sum(axis=1) / w.sum(axis=1)


def _starts(model: ContaminatedMoE, X: np.ndarray, y: np.ndarray, init: Sequence[Any], restarts: int,
            rng: np.random.Generator, floor: float) -> list[ContaminatedParams]:
    """Every start as R-batched parameters, in the order of ``init`` (``"random"`` gives ``restarts`` of them)."""
    R, n, d = X.shape
    out: list[ContaminatedParams] = []

    def gate_kw(lam: Any, beta: Any, tau: Any) -> dict[str, Any]:
        return {"lam": lam} if model.gate == "constant" else {"gate_weight": beta, "gate_bias": tau}

    for entry in init:
        if isinstance(entry, ContaminatedParams):
            model.check_params(entry)
            if entry.n_reps not in (1, R):
                raise ValueError(f"an init ContaminatedParams has R={entry.n_reps} replicates but the data have R={R}"
                                 "; give one parameter set or one per replicate.")
            out.append(entry if entry.n_reps == R else entry.select(np.zeros(R, dtype=np.int64)))
        elif entry == "ols":
            a, b, v = _ols(X, y)
            out.append(ContaminatedParams(weight=a, bias=b, var=np.maximum(v, floor),
                                          **gate_kw(np.full(R, 0.5), np.zeros((R, d)), np.zeros(R))))
        elif entry == "random":
            for _ in range(restarts):
                a, b, v = _ols(X, y, rng.random((R, n)) ** 4)
                out.append(ContaminatedParams(weight=a, bias=b, var=np.maximum(v * rng.uniform(0.5, 1.5, R), floor),
                                              **gate_kw(rng.uniform(0.1, 0.9, R), rng.standard_normal((R, d)),
                                                        rng.standard_normal(R))))
        else:
            raise ValueError(f"init entry {entry!r} is not valid; use 'ols', 'random' or a ContaminatedParams "
                             "(e.g. a start near the truth).")
    if not out:
        raise ValueError("init gave no start; use e.g. init=('ols', 'random').")
    return out


# ----------------------------------------------------------------------------- inference
def natural_ll_terms(model: ContaminatedMoE) -> Any:
    r"""Per-observation log-likelihood terms in the natural parameters (gate, a, b, nu), batched:
    ``fn(theta (A, p), X (A, n, d), y (A, n), lf0 (A, n)) -> (A, n)``, each row of ``theta`` with its own data,
    :math:`\log[(1 - w(x_t))f_0(y_t\mid x_t) + w(x_t)\,\mathcal N(y_t;\varphi(a^\top x_t + b), \nu)]`."""
    d = model.d
    family = get_expert(model.expert)

    def fn(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor, lf0: torch.Tensor) -> torch.Tensor:
        if model.gate == "constant":
            lam = theta[:, :1]
            log_w, log_1mw, rest = torch.log(lam), torch.log1p(-lam), theta[:, 1:]
        else:
            score = (X @ theta[:, :d, None])[..., 0] + theta[:, d, None]
            log_w = torch.nn.functional.logsigmoid(score)
            log_1mw = torch.nn.functional.logsigmoid(-score)
            rest = theta[:, d + 1:]
        mean = family.activation((X @ rest[:, :d, None])[..., 0] + rest[:, d, None])
        var = rest[:, d + 1, None]
        log_fp = -0.5 * (math.log(2 * math.pi) + torch.log(var)) - (y - mean) ** 2 / (2.0 * var)
        return torch.logaddexp(log_1mw + lf0, log_w + log_fp)
    return fn


def _natural_ll_fn(model: ContaminatedMoE) -> Any:
    """Total log-likelihood of one replicate in the natural parameters (gate, a, b, nu): ``fn(theta (p,), X (n, d),
    y (n,), lf0 (n,))``, the sum of :func:`natural_ll_terms`."""
    terms = natural_ll_terms(model)

    def fn(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor, lf0: torch.Tensor) -> torch.Tensor:
        total: torch.Tensor = terms(theta[None], X[None], y[None], lf0[None]).sum()
        return total
    return fn


def observed_information(model: ContaminatedMoE, params: ContaminatedParams, X: Any, y: Any) -> np.ndarray:
    r"""Observed information :math:`-\nabla^2 \ell` in the natural parameters (order of
    :meth:`ContaminatedFit.names`), shape (R, p, p), by torch autograd (reverse over reverse,
    :func:`moestat.fit._derivatives.replicate_hessians`)."""
    from ..fit._derivatives import replicate_hessians

    model.check_params(params)
    Xa, ya = model._data(X, y)
    assert ya is not None
    lf0 = model.frozen_log_density(Xa, ya)
    theta = np.concatenate([params.gate_vector(), params.theta()], axis=1)
    if theta.shape[0] != Xa.shape[0]:
        theta = np.repeat(theta, Xa.shape[0], axis=0)
    th, Xt, yt, l0 = (torch.as_tensor(a, dtype=torch.float64) for a in (theta, Xa, ya, lf0))
    terms = natural_ll_terms(model)
    H = replicate_hessians(lambda t: terms(t, Xt, yt, l0).sum(), th)
    out: np.ndarray = -H.numpy()
    return out


def _std_errors(info: np.ndarray) -> np.ndarray:
    out = np.full(info.shape[:2], np.nan)
    for r, M in enumerate(info):
        M = 0.5 * (M + M.T)
        if np.all(np.isfinite(M)) and np.linalg.eigvalsh(M).min() > 1e-12 * max(np.abs(M).max(), 1e-300):
            out[r] = np.sqrt(np.diag(np.linalg.inv(M)))
    return out


# ----------------------------------------------------------------------------- the estimator
def fit_contaminated(model: ContaminatedMoE, X: Any, y: Any, *, method: str = "newton",
                     init: Sequence[Any] = ("ols", "random"), restarts: int = 3, seed: Any = None,
                     tol: float = 1e-12, gtol: float = 1e-9, max_iter: int | None = None, em_iter: int = 10,
                     sd_floor: float = 1e-3, history: bool = False, std_errors: bool = True,
                     warn: bool = True) -> ContaminatedFit:
    r"""Maximum-likelihood fit of a contaminated MoE (frozen model fixed), batched over replicates and starts.

    Parameters
    ----------
    model : ContaminatedMoE
        The frozen model, the gate and the prompt's family.
    X : array, shape (n, d) or (R, n, d)
    y : array, shape (n,) or (R, n)
    method : {"newton", "em"}
        ``"em"``: EM to convergence (linear prompts; :math:`\ell` never decreases).  ``"newton"``: ``em_iter`` EM
        steps (linear prompts) then damped Newton with the autograd Hessian.
    init : sequence
        Starts: ``"ols"`` (the prompt at the least-squares line, :math:`\lambda = 1/2` or a flat gate),
        ``"random"`` (``restarts`` starts: the prompt fitted to randomly weighted data, random gate), or
        :class:`ContaminatedParams` (one set for all replicates, or one per replicate).  Each replicate keeps the
        start with the highest final log-likelihood.
    restarts : int
        Random starts per ``"random"`` entry.
    seed : int, SeedSequence or None
        Seed of the random starts.
    tol : float
        Convergence: EM stops when an iteration raises the mean log-likelihood by less than ``tol``; Newton when its
        decrement :math:`g^\top(-H)^{-1}g/2` (the predicted gain in mean log-likelihood) is below ``tol`` at a
        negative-definite Hessian, or the largest gradient entry is below ``gtol``.
    gtol : float
        Gradient tolerance of Newton (mean log-likelihood, unconstrained coordinates).
    max_iter : int, optional
        Iteration cap (default 5000 for EM, 200 Newton steps).
    em_iter : int
        EM warm-up steps before Newton (linear prompts only).
    sd_floor : float
        Lower bound on the prompt's standard deviation (the likelihood is unbounded as :math:`\nu \to 0`).
    history : bool
        Record every iteration's log-likelihood (``fit.history``).
    std_errors : bool
        Compute observed-information standard errors (NaN when False; skipping them saves an autograd Hessian).
    warn : bool
        Warn (:class:`moestat.exceptions.ConvergenceWarning`) when a replicate's best start did not converge.

    Returns
    -------
    ContaminatedFit

    Examples
    --------
    >>> import numpy as np
    >>> from moestat.contaminated import ContaminatedMoE, ContaminatedParams, FrozenExpert, fit_contaminated
    >>> model = ContaminatedMoE(FrozenExpert.gaussian_expert([0.0], 0.0, 1.0))
    >>> truth = ContaminatedParams(weight=[2.0], bias=1.0, var=0.25, lam=0.4)
    >>> data = model.simulate(truth, 4000, seed=0)
    >>> fit = fit_contaminated(model, data.X, data.y, seed=0)
    >>> bool(abs(fit.params.lam[0] - 0.4) < 0.05)
    True
    """
    t0 = time.perf_counter()
    if not isinstance(model, ContaminatedMoE):
        raise TypeError(f"model must be a ContaminatedMoE, got {type(model).__name__}.")
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not supported; valid values are {list(METHODS)}.")
    linear = get_expert(model.expert).name == "linear"
    if method == "em" and not linear:
        raise ValueError(f"method='em' needs a linear prompt (its M-step is weighted least squares), got "
                         f"expert={model.expert!r}; use method='newton'.")
    restarts = check_int("restarts", restarts)
    em_iter = check_int("em_iter", em_iter, minimum=0)
    for name, value in (("tol", tol), ("gtol", gtol), ("sd_floor", sd_floor)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    if isinstance(init, (str, ContaminatedParams)):
        init = [init]
    Xa, ya = model._data(X, y)
    assert ya is not None
    R, n, _ = Xa.shape
    if n < model.n_params + 1:
        raise ValueError(f"n={n} observations cannot identify {model.n_params} parameters; give more data.")
    floor = float(sd_floor) ** 2
    rng = np.random.default_rng(seed)
    lf0 = model.frozen_log_density(Xa, ya)
    starts = _starts(model, Xa, ya, list(init), restarts, rng, floor)
    S = len(starts)
    # runs are start-major: run = s * R + r
    state = _State.from_params(ContaminatedParams.stack(starts))
    state.v = np.maximum(state.v, floor * (1 + 1e-6))
    Xb, yb, lb = (np.concatenate([arr] * S, axis=0) for arr in (Xa, ya, lf0))
    data = _Data(Xb, np.concatenate([Xb, np.ones((S * R, n, 1))], axis=2), yb, lb)
    record: list[tuple[int, int, str, float]] | None = [] if history else None
    if method == "em":
        ll, conv, iters = _run_em(state, data, max_iter=max_iter or 5000, tol=tol, floor=floor, record=record)
    else:
        iters = np.zeros(S * R, int)
        if linear and em_iter > 0:
            _, _, iters = _run_em(state, data, max_iter=em_iter, tol=tol, floor=floor, record=record)
        state.v = np.maximum(state.v, floor * (1 + 1e-6))
        ll, conv, it_n, bound = _run_newton(model, state, data, max_iter=max_iter or 200, tol=tol, gtol=gtol,
                                            floor=floor, record=record, offset=iters)
        iters = iters + it_n
    bound = _on_boundary(state, floor)
    ll_rs = ll.reshape(S, R).T
    safe = np.where(np.isfinite(ll_rs), ll_rs, -np.inf)
    best = safe.argmax(axis=1)
    run = best * R + np.arange(R)
    params = state.params().select(run)
    se = _std_errors(observed_information(model, params, Xa, ya)) if std_errors else \
        np.full((R, model.n_params), np.nan)
    hist = pd.DataFrame(record or [], columns=["run", "iter", "stage", "loglik"])
    if len(hist):
        hist.insert(0, "start", hist["run"] // R)
        hist.insert(0, "rep", hist["run"] % R)
        hist = hist.drop(columns="run").sort_values(["rep", "start", "iter"], kind="stable").reset_index(drop=True)
    settings = {"method": method, "init": [e if isinstance(e, str) else "params" for e in init],
                "restarts": restarts, "tol": tol, "gtol": gtol, "max_iter": max_iter, "em_iter": em_iter,
                "sd_floor": sd_floor, "starts": S}
    fit = ContaminatedFit(model, params, ll[run], conv[run], bound[run], iters[run], best, ll_rs,
                          se, n, settings, hist, time.perf_counter() - t0)
    if warn and not fit.converged.all():
        warn_user(f"fit_contaminated: {int((~fit.converged).sum())} of {R} replicate(s) did not converge "
                  f"(method={method!r}); raise max_iter or check fit.boundary.", ConvergenceWarning)
    if warn and fit.boundary.any():
        warn_user(f"fit_contaminated: {int(fit.boundary.sum())} of {R} replicate(s) ended on the boundary (a "
                  "vanishing prompt or frozen model, a separating gate, or the variance floor); see fit.boundary.",
                  DegenerateFitWarning)
    return fit
