r"""Shared pieces of the gated-network estimators: data checks, random starts, the gating likelihood
:math:`L_{\log}` and the result object.

Gate convention (makkuva2020 eq. 1): :math:`w_k = 0`; the free gate is :math:`W \in \mathbb R^{(k-1)\times d}`.
Tensors carry a replicate axis ``R`` and a restart axis ``S``: data ``X (R, n, d)``, ``y (R, n)``,
regressors ``A (R, S, k, d)``, free gate ``W (R, S, k-1, d)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from .._torch import resolve_device, resolve_dtype, to_numpy, to_tensor
from .._validation import as_numeric, check_finite, check_int
from ..exceptions import warn_user
from ..gates import log_mixture_weights
from ..metrics.gated import _gate_metrics, _regressor_metrics
from ..model import normal_log_density
from ..params import Params
from ..simulators.gated_nn import GatedNNTruth
from .base import FixedBudgetFit, add_settings, check_reps


# ----------------------------------------------------------------------------- data and starts
def prepare_data(X, y, k: int, device: str, dtype) -> tuple[torch.Tensor, torch.Tensor, bool, torch.device]:
    """Validate and convert ``X (n, d) | (R, n, d)``, ``y (n,) | (R, n)`` to batched tensors."""
    check_int("k", k, minimum=2)
    Xa, ya = as_numeric("X", X), as_numeric("y", y)
    if Xa.ndim not in (2, 3):
        raise ValueError(f"X must have shape (n, d) or (R, n, d), got {tuple(Xa.shape)}.")
    single = Xa.ndim == 2
    if single:
        Xa, ya = Xa[None], ya[None] if ya.ndim == 1 else ya
    if tuple(ya.shape) != tuple(Xa.shape[:2]):
        raise ValueError(f"y must have shape {tuple(Xa.shape[:2]) if not single else (Xa.shape[1],)} to match X, "
                         f"got {tuple(y.shape)}.")
    if Xa.shape[-2] < k:
        raise ValueError(f"X has {Xa.shape[-2]} observations, fewer than the k={k} experts; a gated network "
                         "needs n >= k (and the tensor method many more).")
    check_finite("X", Xa)
    check_finite("y", ya)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    return to_tensor(Xa, device=dev, dtype=dt), to_tensor(ya, device=dev, dtype=dt), single, dev


def warn_theory(X: torch.Tensor, k: int, *, check_inputs: bool) -> None:
    """Warn when 2k-1 < d fails (Assumption 3) or the inputs look non-Gaussian (Assumption 1)."""
    _R, _n, d = X.shape
    if not 2 * k - 1 < d:
        warn_user(f"d={d} <= 2k-1={2 * k - 1}: makkuva2020 Assumption 3 (2k-1 < d, gate orthogonal to the "
                      "regressors) cannot hold; the tensor method's guarantees do not apply.", UserWarning)
    if check_inputs and not looks_standard_gaussian(X):
        warn_user("X does not look like N(0, I_d) draws (mean, covariance or kurtosis off by more than "
                      "sampling error): the Hermite/score transforms of L4 assume x ~ N(0, I_d) (makkuva2020 "
                      "Assumption 1), so the L4 minimiser may be biased. Whiten the inputs if they are Gaussian "
                      "with another mean/covariance; pass check_inputs=False to silence this.", UserWarning)


def looks_standard_gaussian(X: torch.Tensor) -> bool:
    """Crude test of x ~ N(0, I_d) per replicate: mean, operator norm of cov - I, per-coordinate kurtosis.

    Thresholds are several times the sampling error of each statistic under N(0, I_d), so false alarms are
    rare for n >= 100.
    """
    _R, n, d = X.shape
    m = X.mean(1)                                                     # (R, d)
    if bool((m.norm(dim=-1) * math.sqrt(n) > math.sqrt(d) + 6.0).any()):
        return False
    C = X.transpose(1, 2) @ X / n - torch.eye(d, dtype=X.dtype, device=X.device)
    op = torch.linalg.matrix_norm(C, ord=2)
    if bool((op > 2.0 * (2.0 * math.sqrt(d / n) + d / n) + 6.0 / math.sqrt(n)).any()):
        return False
    kurt = (X**4).mean(1) - 3.0
    return not bool((kurt.abs() * math.sqrt(n / 96.0) > 8.0).any())


def gated_starts(R: int, S: int, k: int, d: int, seed: int | np.random.SeedSequence | None = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
    r"""Random starts shared by all gated estimators ("same starts").

    Returns ``A0 (R, S, k, d)`` with rows uniform on the unit sphere and ``W0 (R, S, k-1, d)`` with
    entries :math:`N(0, 1/d)`; replicate ``r`` uses ``SeedSequence(seed).spawn(R)[r]``.
    """
    root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    A0, W0 = [], []
    for child in root.spawn(R):
        rng = np.random.default_rng(child)
        a = rng.standard_normal((S, k, d))
        A0.append(a / np.linalg.norm(a, axis=-1, keepdims=True))
        W0.append(rng.standard_normal((S, k - 1, d)) / math.sqrt(d))
    return np.stack(A0), np.stack(W0)


def resolve_starts(init, R: int, S: int, k: int, d: int, seed, dev, dt) -> tuple[torch.Tensor, torch.Tensor]:
    """Starts from ``init=(A0, W0)`` (arrays (R,S,k,d), (R,S,k-1,d)) or :func:`gated_starts`."""
    if init is None:
        A0, W0 = gated_starts(R, S, k, d, seed)
    else:
        A0, W0 = (np.asarray(to_numpy(a), dtype=np.float64) for a in init)
        if A0.shape != (R, S, k, d) or W0.shape != (R, S, k - 1, d):
            raise ValueError(f"init must be (A0, W0) with shapes {(R, S, k, d)} and {(R, S, k - 1, d)}, got "
                             f"{A0.shape} and {W0.shape}; build them with moestat.fit.tensor.gated_starts.")
    return to_tensor(A0, device=dev, dtype=dt), to_tensor(W0, device=dev, dtype=dt)


def truth_arrays(truth) -> tuple[np.ndarray, np.ndarray] | None:
    """(A*, W*) with W* of shape (k, d), from a GatedNNTruth, a Params or an (A*, W*) pair."""
    if truth is None:
        return None
    if isinstance(truth, GatedNNTruth):
        return truth.regressors, truth.gate_weight
    if isinstance(truth, Params):
        return to_numpy(truth.expert_weight), to_numpy(truth.gate_weight)
    A, W = (np.asarray(to_numpy(t), dtype=np.float64) for t in truth)
    if W.shape[-2] == A.shape[-2] - 1:
        W = np.concatenate([W, np.zeros_like(W[..., :1, :])], axis=-2)
    return A, W


# ----------------------------------------------------------------------------- gating likelihood
def full_gate(W: torch.Tensor) -> torch.Tensor:
    """Append the reference row :math:`w_k = 0`: ``(..., k-1, d) -> (..., k, d)``."""
    return torch.cat([W, torch.zeros_like(W[..., :1, :])], dim=-2)


def project_rows(X: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    r""":math:`v_j^\top x_s` for ``X (R, n, d)`` and ``V (R, S, m, d)``, as ``(R, S, m, n)`` (expert axis before n).

    The (.., k, n) layout keeps reductions over the small expert axis fast on CPU (they are unrolled sums
    of contiguous slices)."""
    R, S, m, d = V.shape
    return (V.reshape(R, S * m, d) @ X.transpose(1, 2)).reshape(R, S, m, X.shape[1])


def sum_k(x: torch.Tensor) -> torch.Tensor:
    """Sum over the expert axis -2 of ``(..., k, n)``, unrolled (fast for small k on CPU)."""
    total = x[..., 0, :]
    for i in range(1, x.shape[-2]):
        total = total + x[..., i, :]
    return total


def exp_safe(x: torch.Tensor) -> torch.Tensor:
    """exp with arguments clamped at -700: avoids subnormal results (e^-700 ~ 1e-304), which are ~20x slower
    on CPU and change no result beyond 1e-300."""
    return x.clamp_min(-700.0).exp()


def logsumexp_k(x: torch.Tensor) -> torch.Tensor:
    """logsumexp over the expert axis -2 of ``(R, S, k, n)``, unrolled over k (k is small)."""
    m = x[..., 0, :]
    for i in range(1, x.shape[-2]):
        m = torch.maximum(m, x[..., i, :])
    return m + sum_k(exp_safe(x - m[..., None, :])).log()


def gate_logits_kn(W: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    r"""Logits :math:`w_i^\top x_s` with the reference row :math:`w_k = 0` and no intercepts, ``(R, S, k, n)``."""
    logits = project_rows(X, W)
    return torch.cat([logits, torch.zeros_like(logits[..., :1, :])], dim=-2)


def gate_log_prior(W: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    r""":math:`\log\mathrm{softmax}_i(Wx_s)` with :math:`w_k = 0`, ``(R, S, k, n)``: the softmax gate of
    :mod:`moestat.gates` on the network's logits."""
    return log_mixture_weights("softmax", gate_logits_kn(W, X), dim=-2)


def expert_loglik(y: torch.Tensor, E: torch.Tensor, sigma) -> torch.Tensor:
    r""":math:`\log N(y_s \mid g(a_i^\top x_s), \sigma^2)` for ``y (R, n)``, ``E = g(a_i^\top x_s)`` ``(R, S, k, n)``;
    ``sigma`` a float or a tensor broadcasting against ``(R, S, 1, 1)``."""
    return normal_log_density(y[:, None, None, :] - E, sd=sigma)


def llog_terms(W: torch.Tensor, X: torch.Tensor, log_lik: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""The negative log-likelihood :math:`L_{\log}` (makkuva2020 eq. 9), the prior and the posterior.

    .. math:: L_{\log}(W, A) = -\frac1n\sum_s \log\sum_i \mathrm{softmax}_i(W x_s)\,
              N(y_s \mid g(a_i^\top x_s), \sigma^2),

    computed in log space.  ``X (R, n, d)``, ``log_lik`` from :func:`expert_loglik` ``(R, S, k, n)``,
    ``W (R, S, k-1, d)``.  Returns ``loss (R, S)``, ``prior (R, S, k, n)``, ``post (R, S, k, n)``.
    """
    log_prior = gate_log_prior(W, X)
    joint = log_prior + log_lik
    lse = logsumexp_k(joint)
    return -lse.mean(-1), exp_safe(log_prior), exp_safe(joint - lse[..., None, :])


def llog_grad(X: torch.Tensor, prior: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    r""":math:`\nabla_{w_i} L_{\log} = -E[(P[z=i\mid x,y] - P[z=i\mid x])\,x]`, i < k (makkuva2020 D.3)."""
    R, S, k, n = post.shape
    diff = (post - prior)[:, :, : k - 1].reshape(R, S * (k - 1), n)
    return -(diff @ X).reshape(R, S, k - 1, X.shape[-1]) / n


def project_ball(W: torch.Tensor, radius: float) -> torch.Tensor:
    r""":math:`\Pi_\Omega`: each row onto the ball :math:`\|w_i\| \le R` (makkuva2020 §3.2)."""
    nrm = W.norm(dim=-1, keepdim=True)
    return W * torch.clamp(radius / nrm.clamp_min(1e-300), max=1.0)


# ----------------------------------------------------------------------------- history and result
class History:
    """Collects tidy history rows (rep, restart, stage, iter, metric, value) from batched tensors."""

    def __init__(self, truth: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.truth = truth
        self.parts: list[pd.DataFrame] = []

    def add(self, stage: str, it: int, values: dict[str, torch.Tensor | np.ndarray]) -> None:
        for name, v in values.items():
            arr = np.asarray(to_numpy(v), dtype=float)
            R, S = arr.shape
            r, s = np.meshgrid(np.arange(R), np.arange(S), indexing="ij")
            self.parts.append(pd.DataFrame({"rep": r.ravel(), "restart": s.ravel(), "stage": stage,
                                            "iter": it, "metric": name, "value": arr.ravel()}))

    def add_errors(self, stage: str, it: int, A: torch.Tensor | None = None, W: torch.Tensor | None = None,
                   perm_from: torch.Tensor | None = None, signed: bool = True) -> None:
        """Record E_reg / reg_l2 (regressors ``A``) and gate errors (full gate ``W``) against the truth."""
        if self.truth is None:
            return
        A_star, W_star = self.truth
        vals: dict[str, np.ndarray] = {}
        perm = None
        if A is not None:
            m, perm, _ = _regressor_metrics(to_numpy(A), A_star)
            vals.update({key: m[key] for key in (("E_reg", "reg_l2") if signed else ("E_reg",))})
        if W is not None:
            if perm is None:
                _, perm, _ = _regressor_metrics(to_numpy(perm_from), A_star)
            g = _gate_metrics(to_numpy(W), W_star, perm)
            vals.update({key: g[key] for key in ("E_gate", "gate_l2")})
        self.add(stage, it, vals)

    def frame(self) -> pd.DataFrame:
        if not self.parts:
            return pd.DataFrame(columns=["rep", "restart", "stage", "iter", "metric", "value"])
        return pd.concat(self.parts, ignore_index=True)


@dataclass
class GatedFit(FixedBudgetFit):
    """Result of a gated-network estimator (:func:`fit_tensor`, :func:`fit_em_gated`, :func:`fit_l2_gated`), a
    :class:`~moestat.fit.base.FitResult`.  The estimators run fixed iteration budgets (the papers' protocols):
    ``converged`` is False, as for the SGD protocol of :func:`moestat.fit_lse`, and ``n_iter`` is the budget.

    Attributes
    ----------
    method : str
        ``"tensor"``, ``"em"`` or ``"l2"``.
    regressors : ndarray, shape (R, k, d)
        Estimated expert vectors of the selected restart (unit rows for the tensor method).
    gate_weight : ndarray, shape (R, k, d)
        Estimated gate vectors, last row 0.
    restart_regressors, restart_gate_weight : ndarray, shape (R, S, k, d)
        Every restart's estimate.
    restart_objective : ndarray, shape (R, S)
        The selection criterion per restart (final :math:`L_{\\log}`, negative log-likelihood or
        squared error; lower is better); ``objective`` (R,) is the selected restart's.
    best_restart : ndarray of int, shape (R,)
    history : DataFrame
        Tidy trace: ``rep, restart, stage, iter, metric, value`` (errors against ``truth`` when given).
    config : dict
        Every knob of the fit.
    extras : dict
        Method-specific arrays (the raw L4 minimiser, the projection, the output transform, ...).
    """

    method: str
    regressors: np.ndarray
    gate_weight: np.ndarray
    restart_regressors: np.ndarray
    restart_gate_weight: np.ndarray
    restart_objective: np.ndarray
    best_restart: np.ndarray
    history: pd.DataFrame
    config: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def objective(self) -> np.ndarray:
        """(R,) the selection criterion of the selected restart."""
        return self.restart_objective[np.arange(self.restart_objective.shape[0]), self.best_restart]

    def _budget(self) -> int:
        """L4 plus gate iterations for the tensor method, ``iters`` for the baselines."""
        c = self.config
        return int(c.get("l4_iters", 0)) + int(c.get("gate_iters", 0)) or int(c.get("iters", 0))

    def glance(self) -> pd.DataFrame:
        """One row per replicate: method, objective, best restart, restarts and the scalar settings."""
        R = self.restart_objective.shape[0]
        frame = pd.DataFrame({"rep": np.arange(R), "method": self.method, "objective": self.objective,
                              "converged": self.converged, "n_iter": self.n_iter, "best_restart": self.best_restart,
                              "n_starts": self.restart_objective.shape[1]})
        return add_settings(frame, self.config, scalars_only=True)

    def select(self, rep) -> GatedFit:
        """The fit of replicate(s) ``rep`` (batched; restarts and history follow)."""
        R = self.restart_objective.shape[0]
        idx = check_reps(rep, R)
        renumber = {int(old): new for new, old in enumerate(idx)}
        hist = self.history[self.history["rep"].isin(idx)].copy() if len(self.history) else self.history.copy()
        if len(hist):
            hist["rep"] = hist["rep"].map(renumber)
        extras = {k: (v[idx] if isinstance(v, np.ndarray) and v.ndim and v.shape[0] == R else v)
                  for k, v in self.extras.items()}
        return GatedFit(self.method, self.regressors[idx], self.gate_weight[idx], self.restart_regressors[idx],
                        self.restart_gate_weight[idx], self.restart_objective[idx], self.best_restart[idx],
                        hist.reset_index(drop=True), dict(self.config), extras)

    @property
    def params(self) -> Params:
        """The selected estimates as batched :class:`moestat.Params` (zero biases, noise sd ``sigma``)."""
        R, k, _ = self.regressors.shape
        sigma = self.config.get("sigma")
        return Params(gate_bias=np.zeros((R, k)), gate_weight=self.gate_weight, expert_weight=self.regressors,
                      expert_bias=np.zeros((R, k)),
                      noise_sd=None if sigma is None else np.full((R, k), float(sigma)))

    def errors(self, truth, *, restarts: bool = False) -> pd.DataFrame:
        """Regressor and gate errors against ``truth`` (tidy; every restart with ``restarts=True``)."""
        A_star, W_star = truth_arrays(truth)
        A = self.restart_regressors if restarts else self.regressors
        W = self.restart_gate_weight if restarts else self.gate_weight
        from ..metrics.gated import gating_error, regressor_error
        out = pd.concat([regressor_error(A, A_star), gating_error(W, W_star, A_hat=A, A_star=A_star)],
                        ignore_index=True)
        out.insert(0, "method", self.method)
        return out

    def to_frame(self, truth=None) -> pd.DataFrame:
        """Tidy frame, one row per replicate x quantity: the objective, the chosen restart and, with
        ``truth``, the errors; configuration scalars are added as columns."""
        R = self.regressors.shape[0]
        rows = pd.concat([
            pd.DataFrame({"rep": np.arange(R), "metric": "objective",
                          "value": self.objective}),
            pd.DataFrame({"rep": np.arange(R), "metric": "best_restart", "value": self.best_restart.astype(float)}),
        ], ignore_index=True)
        rows.insert(0, "method", self.method)
        if truth is not None:
            rows = pd.concat([rows, self.errors(truth)], ignore_index=True)
        for key, val in self.config.items():
            if isinstance(val, (int, float, str, bool)) or val is None:
                rows[key] = val
        return rows


def select_best(objective: torch.Tensor, A: torch.Tensor, W_full: torch.Tensor
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per replicate, the restart with the lowest finite objective."""
    obj = torch.where(torch.isfinite(objective), objective, torch.full_like(objective, float("inf")))
    best = obj.argmin(dim=1)
    r = torch.arange(A.shape[0], device=A.device)
    return to_numpy(best), to_numpy(A[r, best]), to_numpy(W_full[r, best])
