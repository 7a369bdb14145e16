r"""The Gaussian-gated mixture of linear experts as a joint model of :math:`(X, Y)` (GLLiM), its sampler, its
log-likelihood and its maximum-likelihood EM.

The Gaussian-gated MoE of Xu, Jordan & Hinton (NeurIPS 1995) weights expert :math:`i` at input :math:`x` by
:math:`\pi_i \mathcal N(x; c_i, \Gamma_i) / \sum_j \pi_j \mathcal N(x; c_j, \Gamma_j)`.  Read as a model of the pair
:math:`(X, Y)` it is the Gaussian locally-linear mapping (GLLiM) of Deleforge, Forbes & Horaud (2015, Statistics and
Computing), whose joint density is

.. math:: p_G(x, y) = \sum_{i=1}^{K} \pi_i\, \mathcal N(x; c_i, \Gamma_i)\, \mathcal N(y; A_i x + b_i, \nu_i),
   \qquad x \in \mathbb R^d,\ y \in \mathbb R^l,

with weights :math:`\pi_i > 0` summing to one, input means :math:`c_i`, input covariances :math:`\Gamma_i`, slope
matrices :math:`A_i` (:math:`l \times d`), intercepts :math:`b_i` and expert covariances :math:`\nu_i`.  Its
conditional density :math:`p_G(y \mid x)` is the Gaussian-gated MoE; the marginal of :math:`X` is the Gaussian
mixture :math:`\sum_i \pi_i \mathcal N(x; c_i, \Gamma_i)`.  This is the model of Nguyen, Nguyen, Nguyen & Ho (AISTATS
2024), "Towards convergence rates for parameter estimation in Gaussian-gated mixture of experts", and of their code
(github.com/Trung-TinNGUYEN/CRPE-GMoE).

Why a joint model: the conditional density identifies the gate only through the differences of the quadratic
scores :math:`\log \pi_i - \tfrac12\log|\Gamma_i| - \tfrac12 (x - c_i)^\top\Gamma_i^{-1}(x - c_i)` (a softmax gate
with quadratic features), so :math:`(\pi_i, c_i, \Gamma_i)` themselves are identified — and have rates — only under
the joint likelihood, whose :math:`X`-marginal is the Gaussian mixture.  moestat's gate ``"gaussian"`` is the
conditional, unit-covariance form (a softmax gate); this module is the joint one.

* :class:`GLLiMParams` holds the parameters (optionally with a leading replicate axis);
* :func:`simulate_gllim` draws :math:`(X, Y)` from the joint model;
* :func:`gllim_loglik` evaluates the joint log-likelihood;
* :func:`fit_gllim` runs the closed-form EM (batched over replicates) and returns a :class:`GLLiMFit`.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._validation import check_choice, check_int

__all__ = ["BLOCKS", "METHODS", "GLLiMFit", "GLLiMParams", "fit_gllim", "gllim_loglik", "simulate_gllim"]

BLOCKS = ("pi", "c", "Gamma", "A", "b", "nu")
"""The parameter blocks of :class:`GLLiMParams`, in order."""

_CHUNK = 2_000_000
"""Largest ``replicates x n x K`` handled in one batched EM step (bounds the memory of the E-step arrays)."""


# ----------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class GLLiMParams:
    r"""Parameters of a GLLiM / Gaussian-gated MoE with :math:`K` components, :math:`d` inputs, :math:`l` outputs.

    Every block may carry one leading replicate axis of length :math:`R` (all blocks or none).

    Attributes
    ----------
    pi : ndarray, shape ([R,] K)
        Mixing weights :math:`\pi_i` (positive, summing to one).
    c : ndarray, shape ([R,] K, d)
        Input (gate) means :math:`c_i`.
    Gamma : ndarray, shape ([R,] K, d, d)
        Input (gate) covariances :math:`\Gamma_i` (symmetric positive definite).
    A : ndarray, shape ([R,] K, l, d)
        Expert slope matrices :math:`A_i`.
    b : ndarray, shape ([R,] K, l)
        Expert intercepts :math:`b_i`.
    nu : ndarray, shape ([R,] K, l, l)
        Expert covariances :math:`\nu_i` (symmetric positive definite).
    """

    pi: np.ndarray
    c: np.ndarray
    Gamma: np.ndarray
    A: np.ndarray
    b: np.ndarray
    nu: np.ndarray

    def __post_init__(self) -> None:
        for name in BLOCKS:
            value = np.asarray(getattr(self, name), dtype=float)
            if not np.isfinite(value).all():
                raise ValueError(f"GLLiMParams.{name} holds NaN or infinite values; pass finite parameters.")
            object.__setattr__(self, name, value)
        batch = self.pi.ndim - 1
        if batch not in (0, 1):
            raise ValueError(f"GLLiMParams.pi must have shape (K,) or (R, K), got {self.pi.shape}.")
        lead = self.pi.shape[:batch]
        k = self.pi.shape[-1]
        if self.c.ndim != batch + 2:
            raise ValueError(f"GLLiMParams.c must have shape {(*lead, k, 'd')}, got {self.c.shape}.")
        d = self.c.shape[-1]
        if self.b.ndim != batch + 2:
            raise ValueError(f"GLLiMParams.b must have shape {(*lead, k, 'l')}, got {self.b.shape}.")
        l_ = self.b.shape[-1]
        want = {"c": (*lead, k, d), "Gamma": (*lead, k, d, d), "A": (*lead, k, l_, d), "b": (*lead, k, l_),
                "nu": (*lead, k, l_, l_)}
        for name, shape in want.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"GLLiMParams.{name} must have shape {shape} (K={k}, d={d}, l={l_}), got "
                                 f"{getattr(self, name).shape}.")
        if (self.pi <= 0).any() or not np.allclose(self.pi.sum(-1), 1.0, atol=1e-8):
            raise ValueError(f"GLLiMParams.pi must be positive and sum to one over components, got {self.pi}; "
                             "normalise the weights.")
        for name in ("Gamma", "nu"):
            _check_spd(f"GLLiMParams.{name}", getattr(self, name))

    @property
    def k(self) -> int:
        """Number of components :math:`K`."""
        return int(self.pi.shape[-1])

    @property
    def d(self) -> int:
        """Input dimension :math:`d`."""
        return int(self.c.shape[-1])

    @property
    def l(self) -> int:  # noqa: E743 - the paper's name for the output dimension
        """Output dimension :math:`l`."""
        return int(self.b.shape[-1])

    @property
    def batched(self) -> bool:
        """Whether the blocks carry a leading replicate axis."""
        return self.pi.ndim == 2

    @property
    def reps(self) -> int:
        """Replicates :math:`R` (1 when unbatched)."""
        return int(self.pi.shape[0]) if self.batched else 1

    def as_dict(self) -> dict[str, np.ndarray]:
        """The blocks by name."""
        return {name: getattr(self, name) for name in BLOCKS}

    def tolist(self) -> dict[str, Any]:
        """The blocks as nested lists (JSON-serialisable)."""
        return {name: getattr(self, name).tolist() for name in BLOCKS}

    def take(self, index: int) -> GLLiMParams:
        """Replicate ``index`` of batched parameters, unbatched."""
        if not self.batched:
            raise ValueError("take(index) needs batched GLLiMParams (a leading replicate axis); these are unbatched.")
        return GLLiMParams(**{name: getattr(self, name)[index] for name in BLOCKS})

    def repeat(self, reps: int) -> GLLiMParams:
        """Unbatched parameters copied along a new replicate axis of length ``reps``."""
        reps = check_int("reps", reps)
        if self.batched:
            raise ValueError("repeat(reps) needs unbatched GLLiMParams; these already have a replicate axis.")
        return GLLiMParams(**{name: np.repeat(getattr(self, name)[None], reps, axis=0) for name in BLOCKS})

    @staticmethod
    def stack(items: Sequence[GLLiMParams]) -> GLLiMParams:
        """Unbatched parameters of equal shapes stacked along a new replicate axis."""
        if not items or any(p.batched for p in items):
            raise ValueError("stack needs a non-empty sequence of unbatched GLLiMParams.")
        return GLLiMParams(**{name: np.stack([getattr(p, name) for p in items]) for name in BLOCKS})

    @classmethod
    def from_mapping(cls, blocks: Mapping[str, Any]) -> GLLiMParams:
        """Parameters from a mapping with the keys of :data:`BLOCKS`."""
        missing = set(BLOCKS) - set(blocks)
        if missing:
            raise ValueError(f"GLLiM parameters need the blocks {list(BLOCKS)}; missing {sorted(missing)}.")
        return cls(**{name: np.asarray(blocks[name], dtype=float) for name in BLOCKS})


def _check_spd(name: str, mats: np.ndarray) -> None:
    sym = np.allclose(mats, np.swapaxes(mats, -1, -2), atol=1e-10 * max(1.0, float(np.abs(mats).max())))
    if not sym or (np.linalg.eigvalsh(0.5 * (mats + np.swapaxes(mats, -1, -2))) <= 0).any():
        raise ValueError(f"{name} must hold symmetric positive definite matrices; got eigenvalues <= 0 or an "
                         "asymmetric matrix. Pass covariances, not standard deviations or Cholesky factors.")


def _batched(params: GLLiMParams, reps: int | None = None) -> GLLiMParams:
    """``params`` with a replicate axis (copied ``reps`` times when unbatched)."""
    if params.batched:
        if reps is not None and params.reps != reps:
            raise ValueError(f"the parameters have {params.reps} replicates but the data have {reps}; pass one "
                             "parameter set per data set, or unbatched parameters.")
        return params
    return params.repeat(reps or 1)


# ----------------------------------------------------------------------------- data
def _generators(seed: Any, reps: int) -> list[np.random.Generator]:
    """One numpy generator per replicate: from a list of seed sequences, a seed sequence, an int or None."""
    if isinstance(seed, (list, tuple)):
        if len(seed) != reps:
            raise ValueError(f"seed holds {len(seed)} seed sequences but reps={reps}; pass one per replicate.")
        return [np.random.default_rng(s) for s in seed]
    if isinstance(seed, np.random.Generator):
        raise TypeError("seed must be an int, a numpy SeedSequence, a list of them (one per replicate) or None; "
                        "got a Generator. Pass its seed instead.")
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return [np.random.default_rng(s) for s in ss.spawn(reps)]


def simulate_gllim(params: GLLiMParams, n: int, reps: int | None = None, *, seed: Any = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Draw :math:`n` pairs :math:`(X, Y)` from the joint model, ``reps`` times.

    For each observation: the component :math:`z \sim \mathrm{Categorical}(\pi)`, the input
    :math:`x \sim \mathcal N(c_z, \Gamma_z)` and the response :math:`y \sim \mathcal N(A_z x + b_z, \nu_z)`.  (The
    CRPE-GMoE code draws :math:`x` from the mixture and then the expert from the gate's posterior given :math:`x`; the
    pair :math:`(x, z)` has the same law, :math:`\pi_z \mathcal N(x; c_z, \Gamma_z)`.)

    Parameters
    ----------
    params : GLLiMParams
        Unbatched (the same truth for every replicate) or batched with ``reps`` replicates.
    n : int
        Observations per data set.
    reps : int, optional
        Data sets (default 1, or the parameters' replicates).
    seed : int, numpy.random.SeedSequence, list of SeedSequence or None
        A list gives replicate ``r`` the stream ``seed[r]``; otherwise replicate ``r`` uses child ``r`` of the
        seed sequence.

    Returns
    -------
    X : ndarray, shape (reps, n, d)
    Y : ndarray, shape (reps, n, l)
    z : ndarray of int, shape (reps, n)
        The components drawn.
    """
    if not isinstance(params, GLLiMParams):
        raise TypeError(f"params must be a GLLiMParams, got {type(params).__name__}.")
    n = check_int("n", n)
    reps = check_int("reps", reps) if reps is not None else params.reps
    p = _batched(params, reps)
    gens = _generators(seed, reps)
    k, d, l_ = p.k, p.d, p.l
    X, Y, Z = np.empty((reps, n, d)), np.empty((reps, n, l_)), np.empty((reps, n), dtype=int)
    chol_g, chol_n = np.linalg.cholesky(p.Gamma), np.linalg.cholesky(p.nu)
    for r, rng in enumerate(gens):
        z = rng.choice(k, size=n, p=p.pi[r] / p.pi[r].sum())
        x = p.c[r][z] + np.einsum("nij,nj->ni", chol_g[r][z], rng.standard_normal((n, d)))
        mean = np.einsum("nij,nj->ni", p.A[r][z], x) + p.b[r][z]
        Y[r] = mean + np.einsum("nij,nj->ni", chol_n[r][z], rng.standard_normal((n, l_)))
        X[r], Z[r] = x, z
    return X, Y, Z


def _check_data(X: Any, Y: Any) -> tuple[np.ndarray, np.ndarray]:
    X, Y = np.asarray(X, dtype=float), np.asarray(Y, dtype=float)
    if X.ndim == 2:
        X = X[None]
    if Y.ndim == 2:
        Y = Y[None]
    if X.ndim != 3 or Y.ndim != 3 or X.shape[:2] != Y.shape[:2]:
        raise ValueError(f"X and Y must have shapes ([R,] n, d) and ([R,] n, l) with the same R and n; got "
                         f"{X.shape} and {Y.shape}. Reshape a one-dimensional x to (n, 1).")
    if not (np.isfinite(X).all() and np.isfinite(Y).all()):
        raise ValueError("X and Y must be finite; remove or impute NaN and infinite entries before fitting.")
    return X, Y


# ----------------------------------------------------------------------------- likelihood
def _log_gauss(diff: np.ndarray, cov: np.ndarray) -> np.ndarray:
    r""":math:`\log \mathcal N(\text{diff}; 0, \text{cov})` for diff (R, n, K, p) and cov (R, K, p, p): (R, n, K).

    The quadratic form is summed entry by entry of the precision matrix (p is the small input or output dimension),
    which keeps every operation elementwise on (R, n, K) arrays."""
    p = diff.shape[-1]
    prec = np.linalg.inv(cov)
    logdet = np.linalg.slogdet(cov)[1]
    maha = np.zeros(diff.shape[:-1])
    for i in range(p):
        maha += diff[..., i] ** 2 * prec[:, None, :, i, i]
        for j in range(i + 1, p):
            maha += 2.0 * diff[..., i] * diff[..., j] * prec[:, None, :, i, j]
    out: np.ndarray = -0.5 * maha - 0.5 * logdet[:, None, :] - 0.5 * p * np.log(2.0 * np.pi)
    return out


def _expert_mean(p: GLLiMParams, X: np.ndarray) -> np.ndarray:
    """:math:`A_i x_t + b_i`, shape (R, n, K, l)."""
    mean = np.broadcast_to(p.b[:, None], (X.shape[0], X.shape[1], p.k, p.l)).copy()
    for j in range(X.shape[-1]):
        mean += p.A[:, None, :, :, j] * X[:, :, None, None, j]
    out: np.ndarray = mean
    return out


def _log_joint(p: GLLiMParams, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    r""":math:`\log \pi_i + \log\mathcal N(x; c_i, \Gamma_i) + \log\mathcal N(y; A_i x + b_i, \nu_i)`, (R, n, K)."""
    dx = X[:, :, None, :] - p.c[:, None, :, :]
    dy = Y[:, :, None, :] - _expert_mean(p, X)
    out: np.ndarray = np.log(p.pi)[:, None, :] + _log_gauss(dx, p.Gamma) + _log_gauss(dy, p.nu)
    return out


def _logsumexp(a: np.ndarray) -> np.ndarray:
    top = a.max(-1, keepdims=True)
    out: np.ndarray = (top + np.log(np.exp(a - top).sum(-1, keepdims=True)))[..., 0]
    return out


def gllim_loglik(params: GLLiMParams, X: Any, Y: Any) -> np.ndarray:
    r"""Joint log-likelihood :math:`\sum_{t=1}^n \log p_G(x_t, y_t)` of each data set.

    Parameters
    ----------
    params : GLLiMParams
        Unbatched (one model for every data set) or batched (one per data set).
    X, Y : array, shapes ([R,] n, d) and ([R,] n, l)

    Returns
    -------
    ndarray, shape (R,)
    """
    X, Y = _check_data(X, Y)
    p = _batched(params, X.shape[0])
    _check_dims(p, X, Y)
    out: np.ndarray = _logsumexp(_log_joint(p, X, Y)).sum(-1)
    return out


def _check_dims(p: GLLiMParams, X: np.ndarray, Y: np.ndarray) -> None:
    if p.d != X.shape[-1] or p.l != Y.shape[-1]:
        raise ValueError(f"the parameters have d={p.d}, l={p.l} but X has {X.shape[-1]} columns and Y "
                         f"{Y.shape[-1]}; pass data of the model's dimensions.")


# ----------------------------------------------------------------------------- EM
@dataclass
class GLLiMFit:
    """Result of :func:`fit_gllim`.

    Attributes
    ----------
    params : GLLiMParams
        Fitted parameters, batched (R, ...).
    loglik : ndarray, shape (R,)
        Joint log-likelihood at ``params``.
    n_iter : ndarray of int, shape (R,)
        L-BFGS iterations, or EM steps (one E-step and one M-step each; a SQUAREM cycle takes three or four).
    converged : ndarray of bool, shape (R,)
        Whether the stopping rule was met before ``max_iter``.
    at_floor : ndarray of bool, shape (R,)
        Whether a variance of the fit lies within 1% of its lower bound (``var_floor``; a component collapsing on a
        few points).
    history : list of ndarray
        Per replicate, the log-likelihood at the start of every step of the scheme and at the end (L-BFGS: at the
        start and at the end only).
    settings : dict
        ``max_iter``, ``tol``, ``var_floor``, ``reg``, ``method``.
    """

    params: GLLiMParams
    loglik: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray
    at_floor: np.ndarray
    history: list[np.ndarray] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)


def _features(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Per observation the entries of x, y, x x^T, y x^T and y y^T, shape (R, n, d + l + d^2 + l d + l^2): the
    M-step's weighted moments are then one batched matrix product with the responsibilities."""
    R, n, d = X.shape
    l_ = Y.shape[-1]
    xx = (X[..., :, None] * X[..., None, :]).reshape(R, n, d * d)
    yx = (Y[..., :, None] * X[..., None, :]).reshape(R, n, l_ * d)
    yy = (Y[..., :, None] * Y[..., None, :]).reshape(R, n, l_ * l_)
    return np.concatenate([X, Y, xx, yx, yy], axis=-1)


def _clip_cov(S: np.ndarray, floor: np.ndarray | None) -> np.ndarray:
    r"""The covariance nearest :math:`S` (in likelihood) with :math:`S \succeq D = \mathrm{diag}(\text{floor})`:
    the eigenvalues of :math:`D^{-1/2} S D^{-1/2}` raised to at least 1 (the constrained Gaussian M-step).  In one
    dimension this is :math:`\max(S, \text{floor})`.  ``floor`` (R, K or 1, p) or None (no constraint)."""
    if floor is None:
        return S
    scale = np.sqrt(floor)
    Z = S / (scale[..., :, None] * scale[..., None, :])
    vals, vecs = np.linalg.eigh(0.5 * (Z + np.swapaxes(Z, -1, -2)))
    if (vals >= 1.0).all():
        return S
    Z = (vecs * np.maximum(vals, 1.0)[..., None, :]) @ np.swapaxes(vecs, -1, -2)
    out: np.ndarray = Z * (scale[..., :, None] * scale[..., None, :])
    return out


def _m_step(w: np.ndarray, F: np.ndarray, d: int, l_: int, reg: float,
            floors: tuple[np.ndarray, np.ndarray] | None = None) -> GLLiMParams:
    r"""Closed-form M-step from responsibilities ``w`` (R, n, K) and the features ``F`` of :func:`_features`.

    With the :math:`r_{\cdot i}`-weighted means :math:`\bar x_i, \bar y_i` and centred second moments
    :math:`C_{xx,i}, C_{yx,i}, C_{yy,i}`: :math:`\Gamma_i = C_{xx,i}`, :math:`A_i = C_{yx,i} C_{xx,i}^{-1}`,
    :math:`b_i = \bar y_i - A_i \bar x_i` and :math:`\nu_i` the weighted covariance of the residuals
    :math:`y - A_i x - b_i`, i.e. :math:`C_{yy} - A C_{xy} - C_{yx} A^\top + A C_{xx} A^\top`."""
    n = w.shape[1]
    nk = np.maximum(w.sum(1), 1e-300)  # (R, K)
    M = np.matmul(np.swapaxes(w, 1, 2), F) / nk[..., None]  # (R, K, m): weighted means of the features
    R, K = nk.shape
    o = np.cumsum([0, d, l_, d * d, l_ * d, l_ * l_])
    ex, ey = M[..., o[0]:o[1]], M[..., o[1]:o[2]]
    cxx = M[..., o[2]:o[3]].reshape(R, K, d, d) - ex[..., :, None] * ex[..., None, :]
    cyx = M[..., o[3]:o[4]].reshape(R, K, l_, d) - ey[..., :, None] * ex[..., None, :]
    cyy = M[..., o[4]:o[5]].reshape(R, K, l_, l_) - ey[..., :, None] * ey[..., None, :]
    eye_d, eye_l = np.eye(d), np.eye(l_)
    a = np.swapaxes(np.linalg.solve(cxx + reg * eye_d, np.swapaxes(cyx, -1, -2)), -1, -2)
    b = ey - np.einsum("rkld,rkd->rkl", a, ex)
    cxy = np.swapaxes(cyx, -1, -2)
    nu = cyy - a @ cxy - cyx @ np.swapaxes(a, -1, -2) + a @ cxx @ np.swapaxes(a, -1, -2) + reg * eye_l
    gamma = cxx + reg * eye_d
    if floors is not None:
        gamma, nu = _clip_cov(gamma, floors[0][:, None, :]), _clip_cov(nu, floors[1][:, None, :])
    pi = nk / n
    return _unchecked(pi=pi / pi.sum(-1, keepdims=True), c=ex, Gamma=0.5 * (gamma + np.swapaxes(gamma, -1, -2)),
                      A=a, b=b, nu=0.5 * (nu + np.swapaxes(nu, -1, -2)))


def _unchecked(**blocks: np.ndarray) -> GLLiMParams:
    """Parameters built without the checks of ``__post_init__``: EM iterates are valid by construction, and a
    collapsed component's zero weight would fail the positivity check."""
    out = object.__new__(GLLiMParams)
    for name in BLOCKS:
        object.__setattr__(out, name, blocks[name])
    return out


METHODS = ("lbfgs", "squarem", "em")
"""Optimisers of :func:`fit_gllim`: L-BFGS on the log-likelihood (default), SQUAREM-accelerated EM, plain EM."""


def _flat(p: dict[str, np.ndarray]) -> np.ndarray:
    """The blocks of every replicate as one vector, (R, P)."""
    return np.concatenate([p[name].reshape(p[name].shape[0], -1) for name in BLOCKS], axis=1)


def _unflat(v: np.ndarray, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for name in BLOCKS:
        shape = like[name].shape
        size = int(np.prod(shape[1:]))
        out[name] = v[:, at:at + size].reshape(v.shape[0], *shape[1:])
        at += size
    return out


def _valid(p: dict[str, np.ndarray]) -> np.ndarray:
    """Per replicate: positive weights and positive definite covariances (an extrapolated point may have neither)."""
    ok: np.ndarray = np.asarray((p["pi"] > 0).all(-1))
    for name in ("Gamma", "nu"):
        sym = 0.5 * (p[name] + np.swapaxes(p[name], -1, -2))
        ok = ok & (np.linalg.eigvalsh(sym) > 0).all(axis=(-1, -2))
    return ok


class _EMMap:
    """The EM map on centred data: ``(params of some replicates) -> (next params, log-likelihood at the input)``."""

    def __init__(self, X: np.ndarray, Y: np.ndarray, reg: float, var_floor: float) -> None:
        self.X, self.Y, self.F, self.reg = X, Y, _features(X, Y), reg
        self.d, self.l = X.shape[-1], Y.shape[-1]
        self.floors = (var_floor * X.var(1), var_floor * Y.var(1)) if var_floor > 0 else None

    def __call__(self, p: dict[str, np.ndarray], rows: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        logj = _log_joint(_unchecked(**p), self.X[rows], self.Y[rows])
        norm = _logsumexp(logj)
        floors = None if self.floors is None else (self.floors[0][rows], self.floors[1][rows])
        new = _m_step(np.exp(logj - norm[..., None]), self.F[rows], self.d, self.l, self.reg, floors)
        return new.as_dict(), norm.sum(-1)

    def loglik(self, p: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
        out: np.ndarray = _logsumexp(_log_joint(_unchecked(**p), self.X[rows], self.Y[rows])).sum(-1)
        return out


def _squarem_step(em: _EMMap, p0: dict[str, np.ndarray], rows: np.ndarray
                  ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    r"""One SQUAREM cycle (Varadhan & Roland 2008, Scand. J. Statist., scheme S3) from ``p0``.

    :math:`\theta_1 = M(\theta_0)`, :math:`\theta_2 = M(\theta_1)`, :math:`r = \theta_1 - \theta_0`,
    :math:`v = \theta_2 - \theta_1 - r`, :math:`\alpha = -\min(\|r\|/\|v\|, \cdot)\le -1`,
    :math:`\theta' = \theta_0 - 2\alpha r + \alpha^2 v`, then one EM step from :math:`\theta'`.  Where
    :math:`\theta'` is not a valid parameter or its log-likelihood is below :math:`\ell(\theta_1)`, the
    cycle falls back to :math:`\theta' = \theta_2` (three plain EM steps), so the log-likelihood never falls.
    Returns (next params, log-likelihood at ``p0``, EM steps used per replicate)."""
    p1, ll0 = em(p0, rows)
    p2, ll1 = em(p1, rows)
    v0, v1, v2 = _flat(p0), _flat(p1), _flat(p2)
    r, v = v1 - v0, v2 - 2 * v1 + v0
    rn, vn = np.linalg.norm(r, axis=1), np.linalg.norm(v, axis=1)
    alpha = -np.where(vn > 0, rn / np.where(vn > 0, vn, 1.0), 1.0)
    alpha = np.minimum(alpha, -1.0)[:, None]
    ext = _unflat(v0 - 2 * alpha * r + alpha ** 2 * v, p0)
    ext["pi"] = ext["pi"] / ext["pi"].sum(-1, keepdims=True)
    ok = _valid(ext)
    trial = {name: np.where(ok.reshape(-1, *[1] * (ext[name].ndim - 1)), ext[name], p2[name]) for name in BLOCKS}
    p3, ll_trial = em(trial, rows)
    worse = ok & ~(ll_trial >= ll1)
    if worse.any():  # the extrapolation lowered the likelihood: redo those replicates from theta_2
        idx = np.flatnonzero(worse)
        redo, _ = em({name: p2[name][idx] for name in BLOCKS}, rows[idx])
        for name in BLOCKS:
            p3[name][idx] = redo[name]
    return p3, ll0, 3 + worse.astype(int)


def _em_chunk(X: np.ndarray, Y: np.ndarray, start: GLLiMParams, max_iter: int, tol: float, reg: float,
              method: str, var_floor: float
              ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """EM on a chunk of replicates; replicates stop individually (the active ones are iterated together).

    The data are centred per replicate first (the MLE is equivariant: :math:`c_i` moves with the inputs'
    mean and :math:`b_i` by :math:`A_i m_x - m_y`), which keeps the moment differences of the M-step accurate."""
    R, n = X.shape[:2]
    mx, my = X.mean(1), Y.mean(1)  # (R, d), (R, l)
    em = _EMMap(X - mx[:, None], Y - my[:, None], reg, var_floor)
    cur = {name: getattr(start, name).copy() for name in BLOCKS}
    cur["c"] = cur["c"] - mx[:, None]
    cur["b"] = cur["b"] + np.einsum("rkld,rd->rkl", cur["A"], mx) - my[:, None]
    n_iter = np.zeros(R, dtype=int)
    converged = np.zeros(R, dtype=bool)
    hist: list[list[float]] = [[] for _ in range(R)]
    active = np.arange(R)
    while active.size:
        p = {name: cur[name][active] for name in BLOCKS}
        cycle = 3 if method == "squarem" and max_iter - n_iter[active].min() >= 3 else 1
        if cycle == 3:
            new, ll, used = _squarem_step(em, p, active)
        else:
            (new, ll), used = em(p, active), np.ones(active.size, dtype=int)
        stop = np.zeros(active.size, dtype=bool)
        for j, r in enumerate(active):
            if hist[r] and (ll[j] - hist[r][-1]) / n <= tol:
                converged[r] = stop[j] = True
            hist[r].append(float(ll[j]))
        step = ~stop
        for name in BLOCKS:
            cur[name][active[step]] = new[name][step]
        n_iter[active[step]] += used[step]
        stop |= n_iter[active] >= max_iter
        done = active[stop & ~converged[active]]
        if done.size:  # max_iter reached: the log-likelihood of the last iterate
            last = em.loglik({name: cur[name][done] for name in BLOCKS}, done)
            for j, r in enumerate(done):
                converged[r] = (last[j] - hist[r][-1]) / n <= tol
                hist[r].append(float(last[j]))
        active = active[~stop]
    loglik = np.array([h[-1] for h in hist])
    cur["c"] = cur["c"] + mx[:, None]
    cur["b"] = cur["b"] - np.einsum("rkld,rd->rkl", cur["A"], mx) + my[:, None]
    return cur, loglik, n_iter, converged, [np.asarray(h) for h in hist]


# ----------------------------------------------------------------------------- L-BFGS
def _moments(r: np.ndarray, F: np.ndarray, d: int, l_: int) -> tuple[np.ndarray, ...]:
    """Responsibility-weighted sums of the features (n, m): N_i, S_x, S_y, S_xx, S_yx, S_yy per component."""
    K = r.shape[1]
    M = r.T @ F
    o = np.cumsum([0, d, l_, d * d, l_ * d, l_ * l_])
    return (r.sum(0), M[:, o[0]:o[1]], M[:, o[1]:o[2]], M[:, o[2]:o[3]].reshape(K, d, d),
            M[:, o[3]:o[4]].reshape(K, l_, d), M[:, o[4]:o[5]].reshape(K, l_, l_))


class _LogChol:
    r"""The unconstrained coordinates of L-BFGS: weight logits :math:`w` (:math:`\pi = \mathrm{softmax}(w)`),
    :math:`c, A, b` as they are, and each covariance as its Cholesky factor :math:`L` with log-diagonal."""

    def __init__(self, k: int, d: int, l_: int) -> None:
        self.k, self.d, self.l = k, d, l_
        self.tri = {p: np.tril_indices(p) for p in (d, l_)}
        self.sizes = [k, k * d, k * d * (d + 1) // 2, k * l_ * d, k * l_, k * l_ * (l_ + 1) // 2]

    def _to_tri(self, L: np.ndarray, p: int) -> np.ndarray:
        i, j = self.tri[p]
        v: np.ndarray = L[:, i, j].copy()
        v[:, i == j] = np.log(v[:, i == j])
        return v

    def _from_tri(self, v: np.ndarray, p: int) -> np.ndarray:
        i, j = self.tri[p]
        L = np.zeros((self.k, p, p))
        w = v.copy()
        w[:, i == j] = np.exp(w[:, i == j])
        L[:, i, j] = w
        return L

    def pack(self, p: dict[str, np.ndarray]) -> np.ndarray:
        lg, ln = np.linalg.cholesky(p["Gamma"]), np.linalg.cholesky(p["nu"])
        return np.concatenate([np.log(p["pi"]), p["c"].ravel(), self._to_tri(lg, self.d).ravel(), p["A"].ravel(),
                               p["b"].ravel(), self._to_tri(ln, self.l).ravel()])

    def unpack(self, theta: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        k, d, l_ = self.k, self.d, self.l
        w, c, tg, a, b, tn = np.split(theta, np.cumsum(self.sizes)[:-1])
        lg, ln = self._from_tri(tg.reshape(k, -1), d), self._from_tri(tn.reshape(k, -1), l_)
        pi = np.exp(w - w.max())
        params = {"pi": pi / pi.sum(), "c": c.reshape(k, d), "Gamma": lg @ np.swapaxes(lg, -1, -2),
                  "A": a.reshape(k, l_, d), "b": b.reshape(k, l_), "nu": ln @ np.swapaxes(ln, -1, -2)}
        return params, lg, ln

    def chain(self, grad_cov: np.ndarray, L: np.ndarray, p: int) -> np.ndarray:
        r"""Gradient in the log-Cholesky coordinates from the symmetric gradient :math:`G` in the covariance:
        :math:`\partial\ell/\partial L = 2 G L`, times :math:`L_{jj}` on the log-diagonal."""
        dL = 2.0 * grad_cov @ L
        i, j = self.tri[p]
        v: np.ndarray = dL[:, i, j]
        v[:, i == j] *= L[:, i[i == j], j[i == j]]
        return v


def _objective(theta: np.ndarray, coords: _LogChol, X: np.ndarray, Y: np.ndarray, F: np.ndarray
               ) -> tuple[float, np.ndarray]:
    r"""Minus the mean joint log-likelihood and its gradient in the coordinates of :class:`_LogChol`.

    By Fisher's identity the gradient is the responsibility-weighted score of the complete data; with the weighted
    sums :math:`N_i, S` of :func:`_moments` (residuals :math:`e = y - A_i x - b_i`):
    :math:`\partial_{w_i} = N_i - n\pi_i`, :math:`\partial_{c_i} = \Gamma_i^{-1}\sum_t r_{ti}(x_t - c_i)`,
    :math:`\partial_{\Gamma_i} = \tfrac12\Gamma_i^{-1}(S_{c,i} - N_i\Gamma_i)\Gamma_i^{-1}` with
    :math:`S_{c,i} = \sum_t r_{ti}(x_t - c_i)(x_t - c_i)^\top`, :math:`\partial_{A_i} = \nu_i^{-1}\sum_t r_{ti}
    e_t x_t^\top`, :math:`\partial_{b_i} = \nu_i^{-1}\sum_t r_{ti} e_t` and
    :math:`\partial_{\nu_i} = \tfrac12\nu_i^{-1}(Q_i - N_i\nu_i)\nu_i^{-1}`,
    :math:`Q_i = \sum_t r_{ti} e_t e_t^\top`."""
    n = X.shape[0]
    p, lg, ln = coords.unpack(theta)
    logj = _log_joint(_unchecked(**{key: v[None] for key, v in p.items()}), X[None], Y[None])[0]
    norm = _logsumexp(logj)
    nk, sx, sy, sxx, syx, syy = _moments(np.exp(logj - norm[:, None]), F, coords.d, coords.l)
    c, a, b = p["c"], p["A"], p["b"]
    g_inv, n_inv = np.linalg.inv(p["Gamma"]), np.linalg.inv(p["nu"])
    outer = np.einsum
    ex = sx - nk[:, None] * c
    s_c = sxx - outer("ki,kj->kij", sx, c) - outer("ki,kj->kij", c, sx) + nk[:, None, None] * outer("ki,kj->kij", c, c)
    at = np.swapaxes(a, -1, -2)
    ey = sy - outer("kld,kd->kl", a, sx) - nk[:, None] * b
    eyx = syx - a @ sxx - outer("kl,kd->kld", b, sx)
    ax = outer("kld,kd->kl", a, sx)
    q = (syy - syx @ at - a @ np.swapaxes(syx, -1, -2) + a @ sxx @ at - outer("kl,km->klm", sy, b)
         - outer("kl,km->klm", b, sy) + outer("kl,km->klm", ax, b) + outer("kl,km->klm", b, ax)
         + nk[:, None, None] * outer("kl,km->klm", b, b))
    grad = np.concatenate([
        nk - n * p["pi"], outer("kij,kj->ki", g_inv, ex).ravel(),
        coords.chain(0.5 * g_inv @ (s_c - nk[:, None, None] * p["Gamma"]) @ g_inv, lg, coords.d).ravel(),
        (n_inv @ eyx).ravel(), outer("kij,kj->ki", n_inv, ey).ravel(),
        coords.chain(0.5 * n_inv @ (q - nk[:, None, None] * p["nu"]) @ n_inv, ln, coords.l).ravel()])
    return -float(norm.sum()) / n, -grad / n


def _bounds(coords: _LogChol, vx: np.ndarray, vy: np.ndarray, var_floor: float) -> list[tuple[Any, Any]] | None:
    """L-BFGS-B bounds: the log-diagonal of each Cholesky factor at least half the log of ``var_floor`` times the
    coordinate's sample variance (no bound on the other coordinates)."""
    if var_floor <= 0:
        return None
    lows = []
    for p, var in ((coords.d, vx), (coords.l, vy)):
        i, j = coords.tri[p]
        row = [0.5 * np.log(var_floor * var[a]) if a == b else None for a, b in zip(i, j, strict=True)]
        lows.append(np.array(row * coords.k, dtype=object))
    k, d, l_ = coords.k, coords.d, coords.l
    low = np.concatenate([np.full(k + k * d, None, dtype=object), lows[0], np.full(k * l_ * d + k * l_, None,
                                                                                    dtype=object), lows[1]])
    return [(lo, None) for lo in low]


def _lbfgs_chunk(X: np.ndarray, Y: np.ndarray, start: GLLiMParams, max_iter: int, tol: float, var_floor: float
                 ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """L-BFGS-B on every replicate in turn, on centred data (bounds of :func:`_bounds`)."""
    from scipy.optimize import minimize

    R, n = X.shape[:2]
    coords = _LogChol(start.k, X.shape[-1], Y.shape[-1])
    out = {name: np.empty_like(getattr(start, name)) for name in BLOCKS}
    loglik, n_iter, converged, hist = np.empty(R), np.zeros(R, dtype=int), np.zeros(R, dtype=bool), []
    for r in range(R):
        mx, my = X[r].mean(0), Y[r].mean(0)
        xc, yc = X[r] - mx, Y[r] - my
        s = {name: getattr(start, name)[r] for name in BLOCKS}
        s["c"] = s["c"] - mx
        s["b"] = s["b"] + s["A"] @ mx - my
        bounds = _bounds(coords, xc.var(0), yc.var(0), var_floor)
        theta0 = coords.pack(s)
        if bounds is not None:
            low = np.array([-np.inf if lo is None else lo for lo, _ in bounds])
            theta0 = np.maximum(theta0, low)
        feats = _features(xc[None], yc[None])[0]
        f0 = _objective(theta0, coords, xc, yc, feats)[0]
        res = minimize(_objective, theta0, args=(coords, xc, yc, feats), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": max_iter, "maxfun": 2 * max_iter, "ftol": 1e-15, "gtol": tol,
                                "maxcor": 20})
        p, _, _ = coords.unpack(res.x)
        p["c"] = p["c"] + mx
        p["b"] = p["b"] - p["A"] @ mx + my
        for name in BLOCKS:
            out[name][r] = p[name]
        loglik[r], n_iter[r], converged[r] = -res.fun * n, res.nit, bool(res.success)
        hist.append(np.array([-f0 * n, -res.fun * n]))
    return out, loglik, n_iter, converged, hist


def _at_floor(p: GLLiMParams, X: np.ndarray, Y: np.ndarray, var_floor: float) -> np.ndarray:
    """Per replicate: some diagonal entry of a Gamma_i or nu_i within 1% of ``var_floor`` times the sample variance."""
    if var_floor <= 0:
        return np.zeros(X.shape[0], dtype=bool)
    near = np.zeros(X.shape[0], dtype=bool)
    for cov, data in ((p.Gamma, X), (p.nu, Y)):
        diag = np.diagonal(cov, axis1=-2, axis2=-1)  # (R, K, p)
        near |= (diag <= 1.01 * var_floor * data.var(1)[:, None, :]).any(axis=(-1, -2))
    return near


def fit_gllim(X: Any, Y: Any, start: GLLiMParams, *, method: str = "lbfgs", max_iter: int = 5000,
              tol: float = 1e-8, var_floor: float = 1e-3, reg: float = 1e-10) -> GLLiMFit:
    r"""Maximum-likelihood fit of the joint GLLiM density from ``start``, one fit per data set.

    ``method="lbfgs"`` (default) maximises the joint log-likelihood by L-BFGS (scipy's L-BFGS-B) in unconstrained
    coordinates: weight logits, :math:`c_i, A_i, b_i`, and log-Cholesky factors of :math:`\Gamma_i, \nu_i`, with
    the analytic gradient (Fisher's identity).  It stops when the largest gradient entry of the mean log-likelihood
    is at most ``tol`` (or when a step changes it by less than machine precision) or after ``max_iter`` iterations.
    ``"squarem"`` and ``"em"`` run the EM algorithm below.  All three are local ascent methods from ``start``; in
    over-specified models (more components than the truth) the likelihood is nearly flat along the directions that
    split an atom, plain EM crawls along them (thousands of iterations), and the three can stop at different points
    of such a ridge.

    E-step: responsibilities :math:`r_{ti} \propto \pi_i \mathcal N(x_t; c_i, \Gamma_i)
    \mathcal N(y_t; A_i x_t + b_i, \nu_i)`.  M-step (closed form, :math:`n_i = \sum_t r_{ti}`):
    :math:`\pi_i = n_i / n`; :math:`c_i = \bar x_i` and :math:`\Gamma_i` the :math:`r_{\cdot i}`-weighted mean and
    covariance of :math:`x`; :math:`A_i = S_{yx,i} S_{xx,i}^{-1}` and :math:`b_i = \bar y_i - A_i \bar x_i` the
    weighted least-squares line; :math:`\nu_i` the weighted covariance of its residuals (Deleforge, Forbes & Horaud
    2015, Statistics and Computing, Section 3; the same updates as CRPE-GMoE's ``em_GLLiM``).  With unconstrained
    :math:`\Gamma_i, A_i, \nu_i` this is a reparameterisation of EM for a Gaussian mixture on :math:`(x, y)` with full
    covariances, so every iteration raises the joint log-likelihood (Dempster, Laird & Rubin 1977).

    ``method="squarem"`` (default) accelerates EM by SQUAREM (Varadhan & Roland 2008, Scand. J. Statist.; scheme S3):
    each cycle takes two EM steps, extrapolates along them and takes one EM step from the extrapolated point, falling
    back to plain EM steps where the extrapolation is not a valid parameter or lowers the likelihood, so the
    log-likelihood still never falls.  Over-specified mixtures converge sublinearly under EM (the likelihood is flat
    along the directions that split an atom), where SQUAREM needs far fewer EM steps to reach the same maximum.
    ``method="em"`` iterates the plain EM map.

    EM stopping rule: a replicate stops when one step of the scheme (one EM iteration, or one SQUAREM cycle) raises
    its log-likelihood by at most ``tol`` per observation, :math:`(\ell_{t+1} - \ell_t)/n \le \mathrm{tol}`, or after
    ``max_iter`` EM steps.  ``max_iter=1`` is a single EM step from ``start`` (what CRPE-GMoE's stored fits are; see
    the vignette ``gaussian-gated-moe``).

    Parameters
    ----------
    X, Y : array, shapes ([R,] n, d) and ([R,] n, l)
        The data sets (a leading axis of R data sets, or one).
    start : GLLiMParams
        Starting values: batched (one start per data set) or unbatched (the same start for all).
    method : {"lbfgs", "squarem", "em"}
        Optimiser (see above).
    max_iter : int
        Maximum L-BFGS iterations or EM steps (>= 1; a SQUAREM cycle counts its three or four EM steps).
    tol : float
        L-BFGS: the largest gradient entry (of the mean log-likelihood) at which it stops.  EM: the per-observation
        log-likelihood increase below which it stops (0 runs ``max_iter`` steps unless the likelihood stops rising).
        (>= 0.)
    var_floor : float
        Lower bound on the variances, as a fraction of each coordinate's sample variance (default :math:`10^{-3}`;
        0 switches it off).  The Gaussian-mixture likelihood is unbounded — a component whose variance shrinks to
        0 on a few points drives it to infinity — and the theory's MLE is over a compact set with variances bounded
        away from 0.  L-BFGS bounds the diagonal of each Cholesky factor (:math:`L_{jj}^2 \ge` floor
        :math:`\times` variance of coordinate :math:`j`); EM raises the eigenvalues of
        :math:`D^{-1/2}\Sigma D^{-1/2}` to at least 1 with :math:`D` the diagonal of floors (the constrained
        M-step).  For :math:`d = l = 1` both are the constraint variance :math:`\ge` floor :math:`\times` sample
        variance.
    reg : float
        Ridge added to the diagonal of every :math:`\Gamma_i` and :math:`\nu_i` (and of the weighted input
        covariance inverted for :math:`A_i`) so that a component that captures fewer than :math:`d + 1` points stays
        non-singular.
        EM only; the default :math:`10^{-10}` is far below the covariances of the CRPE-GMoE settings
        (:math:`\ge 0.0017`).

    Returns
    -------
    GLLiMFit
    """
    X, Y = _check_data(X, Y)
    if not isinstance(start, GLLiMParams):
        raise TypeError(f"start must be a GLLiMParams, got {type(start).__name__}.")
    max_iter = check_int("max_iter", max_iter)
    check_choice("method", method, METHODS)
    for name, value in (("tol", tol), ("reg", reg), ("var_floor", var_floor)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < np.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
    p0 = _batched(start, X.shape[0])
    _check_dims(p0, X, Y)
    R, n = X.shape[:2]
    step = max(1, _CHUNK // max(1, n * p0.k))
    parts = []
    for lo in range(0, R, step):
        sl = slice(lo, min(R, lo + step))
        sub = _unchecked(**{k: v[sl] for k, v in p0.as_dict().items()})
        if method == "lbfgs":
            parts.append(_lbfgs_chunk(X[sl], Y[sl], sub, max_iter, float(tol), float(var_floor)))
        else:
            parts.append(_em_chunk(X[sl], Y[sl], sub, max_iter, float(tol), float(reg), method, float(var_floor)))
    blocks = {name: np.concatenate([part[0][name] for part in parts]) for name in BLOCKS}
    params = _unchecked(**blocks)
    return GLLiMFit(params=params, loglik=np.concatenate([part[1] for part in parts]),
                    n_iter=np.concatenate([part[2] for part in parts]),
                    converged=np.concatenate([part[3] for part in parts]),
                    at_floor=_at_floor(params, X, Y, float(var_floor)),
                    history=[h for part in parts for h in part[4]],
                    settings={"max_iter": max_iter, "tol": float(tol), "var_floor": float(var_floor),
                              "reg": float(reg), "method": method})
