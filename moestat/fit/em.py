r"""EM for gated Gaussian mixtures of linear (or constant) experts, batched: softmax gates and the gates not
affine in x.

The model (Jordan & Jacobs 1994) is
:math:`p(y\mid x) = \sum_{i=1}^k \pi_i(x)\,\mathcal N(y;\, a_i^\top x + b_i,\, \sigma_i^2)` with
:math:`\pi_i(x) = \mathrm{softmax}_i(\beta_{1}^\top x + \beta_{0})`.  Write :math:`z = (1, x)`.
One EM iteration (Jordan & Jacobs 1994 §4; McLachlan & Peel 2000 §5.13) is

* **E-step** — responsibilities
  :math:`\tau_{ti} = \pi_i(x_t)\,\mathcal N(y_t; \mu_i(x_t), \sigma_i^2) / p(y_t\mid x_t)`;
* **expert M-step** — for each expert a weighted least-squares fit
  :math:`(b_i, a_i) = (Z^\top T_i Z)^{-1} Z^\top T_i y` with :math:`T_i = \mathrm{diag}(\tau_{\cdot i})`,
  then :math:`\sigma_i^2 = \sum_t \tau_{ti}(y_t - \mu_i(x_t))^2 / \sum_t \tau_{ti}`;
* **GLM experts** (``MoE(response="poisson" | "binomial")``, :mod:`moestat.families`) — the expert M-step maximises
  each expert's responsibility-weighted GLM log-likelihood by a proximal IRLS (Newton) step with step halving
  (:func:`glm_expert_step`, the step of :func:`moestat.families.irls_weighted` fused into this layout), which
  never lowers it (a generalised EM step); there is no variance;
* **gate M-step** — the weighted multinomial logistic regression
  :math:`\max_\beta \sum_t\sum_i \tau_{ti} \log\pi_i(x_t;\beta)`, a concave problem solved by
  damped Newton (IRLS) steps with a backtracking line search that never lowers the objective
  (a generalised EM step), or exactly by cvxpy (``gate_solver="cvxpy"``, small problems and tests).
  Every other gate (Laplace, cosine, perturbed cosine, quadratic, Gaussian, whose scores are not affine in x, and
  the sigmoid, normalised-sigmoid and top-K gates, whose normalised weights are not a multinomial logit;
  :mod:`moestat.gates`) maximises the same :math:`\sum_t\sum_i\tau_{ti}\log\tilde\pi_i(x_t)` over its own
  parameters (the terms of :class:`moestat.fit._layout.ParamLayout`) by damped saddle-free Newton steps with the
  derivatives from autograd through the model's gate (:func:`gradient_gate_step`), again never lowering it.
  Top-K (and normalised sigmoid with ``top_k``): the derivatives hold each observation's selected set at the
  current parameters (the set is piecewise constant, so these are the derivatives wherever it does not change, as
  in the gradient path of :func:`moestat.fit_mle`), while the line search evaluates the objective with the sets
  selected at each candidate, so the ascent guarantee is on the true objective.

Safeguards, each keeping the EM ascent property :math:`\ell(\theta^{(t+1)}) \ge \ell(\theta^{(t)})`:

* the expert and variance updates maximise the M-step objective plus a proximal term
  :math:`-\tfrac{\epsilon}{2}\lVert\theta - \theta^{(t)}\rVert^2`-type penalty with
  :math:`\epsilon = 10^{-8} n`; because the penalty is zero at the old value the step still
  raises the M-step objective, fixed points are exactly the EM fixed points, and a component whose
  responsibilities vanish keeps its old parameters instead of producing 0/0.  Components are never
  dropped (flexmix's default ``minprior = 0.05`` removes them; moestat reports them instead);
* the variance floor :math:`\sigma_i \ge \sigma_{\min}` (a fraction of sd(y), see
  :func:`moestat.fit_mle`) keeps the likelihood bounded (it is unbounded as
  :math:`\sigma_i \to 0` on a single point); the floored update is the exact maximiser of the
  M-step objective over :math:`\sigma_i \ge \sigma_{\min}`.

All arrays carry leading axes (R, S) = (replicates, restarts); one tensor program runs every
(replicate, restart) pair, and pairs that have converged are frozen.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec

import numpy as np
import torch

from ..families import _MAX_HALVINGS, _ROUNDING, Family, irls_weighted
from ..gates import log_mixture_weights
from ..model import MoE, normal_log_density
from . import _native
from ._derivatives import hessian_rows
from ._layout import BlockParams, ParamLayout

P = ParamSpec("P")
_LINE_SEARCH = 12  # step sizes 1, 1/2, ..., 2^-11 in the gate Newton step
_GRAM_MAX_P2 = 64  # precompute z z^T per observation when (d+1)^2 is at most this
_GLM_NEWTON_STEPS = 1  # IRLS steps per EM iteration for GLM experts: one halved Newton step is a generalised M-step


@dataclass
class EMState:
    """Output of :func:`em_fit` (leading axes (R, S))."""

    params: BlockParams
    loglik: torch.Tensor
    converged: torch.Tensor
    n_iter: torch.Tensor
    history: torch.Tensor  # (T, R, S) log-likelihood before each iteration


def design(X: torch.Tensor, input_dependent: bool) -> torch.Tensor:
    """:math:`Z = (1, X)` of shape (R, n, d+1), or the intercept column (R, n, 1)."""
    ones = torch.ones(*X.shape[:-1], 1, dtype=X.dtype, device=X.device)
    return torch.cat([ones, X], dim=-1) if input_dependent else ones


def weighted_ls(Z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, beta_old: torch.Tensor,
                eps: float) -> torch.Tensor:
    r"""Proximal weighted least squares for every expert at once.

    Solves :math:`(Z^\top W_i Z + \epsilon I)\beta_i = Z^\top W_i y + \epsilon\beta_i^{old}`.

    Parameters
    ----------
    Z : (R, n, p); y : (R, n); w : (R, S, n, k); beta_old : (R, S, k, p)

    Returns
    -------
    (R, S, k, p)
    """
    Zw = w.transpose(-1, -2).unsqueeze(-1) * Z[:, None, None]  # (R,S,k,n,p)
    A = Zw.transpose(-1, -2) @ Z[:, None, None]  # (R,S,k,p,p)
    b = (Zw * y[:, None, None, :, None]).sum(-2)  # (R,S,k,p)
    eye = torch.eye(Z.shape[-1], dtype=Z.dtype, device=Z.device)
    return torch.linalg.solve(A + eps * eye, (b + eps * beta_old).unsqueeze(-1)).squeeze(-1)


def _gate_objective(Z: torch.Tensor, tau: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """:math:`\\sum_t\\sum_i \\tau_{ti}\\log\\pi_i` for gate rows ``theta`` (..., k-1, p); last row is 0."""
    logits = torch.einsum("rnp,rs...jp->rs...nj", Z, theta)
    logits = torch.cat([logits, torch.zeros_like(logits[..., :1])], dim=-1)
    return (tau * torch.log_softmax(logits, dim=-1)).sum((-1, -2))


def _second_moments(Zt: torch.Tensor) -> torch.Tensor | None:
    r"""Per-observation outer products :math:`z_t z_t^\top`, shape (B, n, p*p), when p is small (else None)."""
    B, p, n = Zt.shape
    if p * p > _GRAM_MAX_P2:
        return None
    return (Zt.transpose(1, 2).unsqueeze(-1) * Zt.transpose(1, 2).unsqueeze(-2)).reshape(B, n, p * p)


def _weighted_gram(w: torch.Tensor, Zt: torch.Tensor, ZZ: torch.Tensor | None) -> torch.Tensor:
    r""":math:`\sum_t w_{mt} z_t z_t^\top` for every row m of ``w`` (B, m, n): shape (B, m, p, p)."""
    B, m = w.shape[:2]
    p = Zt.shape[1]
    if ZZ is not None:
        return torch.bmm(w, ZZ).view(B, m, p, p)
    return (Zt.unsqueeze(1) * w.unsqueeze(2)) @ Zt.transpose(1, 2).unsqueeze(1)


def _gate_logits(theta_g: torch.Tensor, Zt: torch.Tensor) -> torch.Tensor:
    """Gate logits (B, k, n) from the free rows (B, k-1, p); the last (reference) row is zero."""
    free = torch.bmm(theta_g, Zt)
    ref = torch.zeros(free.shape[0], 1, free.shape[2], dtype=free.dtype, device=free.device)
    return torch.cat([free, ref], dim=1)


def _newton_gate_step(Zt: torch.Tensor, ZZ: torch.Tensor | None, tau: torch.Tensor, theta: torch.Tensor,
                      logw: torch.Tensor, obs_w: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""One damped Newton (IRLS) step of the weighted multinomial logit, in the (B, k, n) layout.

    ``logw`` are the log gate weights at ``theta``; returns the new rows and their log gate weights.
    ``tau`` are the case-weighted responsibilities :math:`c_t\tau_{ti}` and ``obs_w`` the case weights
    :math:`c_t` (B, n) (None: all one).  See :func:`gate_newton` for the formulas.
    """
    B, km1, p = theta.shape
    m = km1 * p
    q0 = (tau * logw).sum((1, 2))
    pi = logw[:, :-1].exp()
    pi_w = pi if obs_w is None else pi * obs_w.unsqueeze(1)
    grad = torch.bmm(tau[:, :-1] - pi_w, Zt.transpose(1, 2)).reshape(B, m)
    if km1 == 1:  # two experts: the one weight pi (1 - pi), written as below (the same rounding)
        H = _weighted_gram(pi_w - pi_w * pi, Zt, ZZ).view(B, p, p)
    else:
        W = -pi_w.unsqueeze(2) * pi.unsqueeze(1)  # (B, k-1, k-1, n)
        W.diagonal(dim1=1, dim2=2).add_(pi_w.transpose(1, 2))
        H = _weighted_gram(W.reshape(B, km1 * km1, -1), Zt, ZZ).view(B, km1, km1, p, p)
        H = H.permute(0, 1, 3, 2, 4).reshape(B, m, m)
    diag = H.diagonal(dim1=-2, dim2=-1)
    diag.add_(diag.mean(-1, keepdim=True).mul_(1e-10).add_(1e-9 * Zt.shape[-1]))  # diag(H) >= 0
    delta = torch.linalg.solve_ex(H, grad.unsqueeze(-1))[0].reshape(B, km1, p)
    full = theta + delta
    logw1 = torch.log_softmax(_gate_logits(full, Zt), dim=1)
    q1 = (tau * logw1).sum((1, 2))
    ok = q1 >= q0  # False where q1 is NaN; q1 <= 0 is never +inf
    if bool(ok.all()):  # the usual case for a concave objective: the full Newton step is accepted
        return full, logw1
    theta = torch.where(ok[:, None, None], full, theta).clone()
    logw = torch.where(ok[:, None, None], logw1, logw).clone()
    bad = (~ok).nonzero().squeeze(-1)
    t = 1.0
    for _ in range(_LINE_SEARCH - 1):  # backtrack t = 1/2, 1/4, ... on the rejected rows only
        t *= 0.5
        cand = theta[bad] + t * delta[bad]
        lw = torch.log_softmax(_gate_logits(cand, Zt[bad]), dim=1)
        qc = (tau[bad] * lw).sum((1, 2))
        acc = torch.isfinite(qc) & (qc >= q0[bad])
        theta[bad[acc]], logw[bad[acc]] = cand[acc], lw[acc]
        bad = bad[~acc]
        if bad.numel() == 0:
            break
    return theta, logw


def gate_newton(Z: torch.Tensor, tau: torch.Tensor, theta: torch.Tensor, steps: int) -> torch.Tensor:
    r"""Damped Newton (IRLS) steps for the weighted multinomial logit, reference = last expert.

    Gradient :math:`g_j = \sum_t (\tau_{tj} - \pi_{tj}) z_t`; negative Hessian
    :math:`H_{jl} = \sum_t \pi_{tj}(\delta_{jl} - \pi_{tl}) z_t z_t^\top` (positive semidefinite;
    a damping of :math:`10^{-10}\,\overline{\mathrm{diag}\,H} + 10^{-9} n` bounds the step under
    separation).  Each step tries :math:`t = 1, 1/2, \ldots, 2^{-11}` and keeps the longest step that
    does not lower the objective; if none does, the row stays put.

    Parameters
    ----------
    Z : (R, n, p); tau : (R, S, n, k); theta : (R, S, k-1, p)
    """
    R, S, km1, p = theta.shape
    Zt = Z.transpose(1, 2).repeat_interleave(S, dim=0).contiguous()
    ZZ = _second_moments(Zt)
    tau_b = tau.reshape(R * S, *tau.shape[2:]).transpose(1, 2).contiguous()
    th = theta.reshape(R * S, km1, p)
    logw = torch.log_softmax(_gate_logits(th, Zt), dim=1)
    for _ in range(steps):
        th, logw = _newton_gate_step(Zt, ZZ, tau_b, th, logw)
    return th.reshape(R, S, km1, p)


def _glm_kernel_terms(glm: Family, y: torch.Tensor, eta: torch.Tensor, tau: torch.Tensor,
                      trials: torch.Tensor | None, mu: torch.Tensor | None = None) -> torch.Tensor:
    r"""Terms :math:`w_{tj} m_t [y_t\eta_{tj} - b(\eta_{tj})]` (A, k, n); Poisson reuses :math:`b(\eta) = \mu`
    when the mean ``mu`` is given."""
    cum = mu if glm.name == "poisson" and mu is not None else glm.cumulant(eta)
    kern = y.unsqueeze(1) * eta - cum
    return tau * (kern if trials is None else trials.unsqueeze(1) * kern)


def glm_expert_step(glm: Family, Ze: torch.Tensor, ZZ: torch.Tensor | None, y: torch.Tensor, tau: torch.Tensor,
                    beta: torch.Tensor, eta: torch.Tensor, mu: torch.Tensor, prox: float,
                    trials: torch.Tensor | None = None, offset: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""One proximal IRLS (Newton) step with step halving on every GLM expert, in the (A, k, n) layout.

    The same step as :func:`moestat.families.irls_weighted` with ``max_iter=1`` (the EM expert M-step), fused for
    the layout of :func:`em_fit`: it starts from the linear predictor :math:`\eta = B Z` and mean
    :math:`\mu = g^{-1}(\eta)` the E-step already computed, forms the gradient
    :math:`g_j = \sum_t \tau_{tj} m_t (y_t - \mu_{tj}) z_t` and negative Hessian
    :math:`H_j = \sum_t \tau_{tj} m_t V(\mu_{tj}) z_t z_t^\top + \rho I` (McCullagh & Nelder 1989, §2.5) from the
    per-observation products :math:`z_t z_t^\top` (``ZZ``, when p is small), and tries
    :math:`\beta + t\delta`, :math:`t = 1, 1/2, \ldots, 2^{-29}`, :math:`\delta = H^{-1}g`, keeping the longest step
    that does not lower :math:`Q_j(\beta) - \tfrac\rho2\lVert\beta - \beta^{old}\rVert^2`; the full step is
    taken unchecked when the predicted increase :math:`g^\top\delta` is below 64 ulps of
    :math:`\sum_t|\tau_{tj}\,\mathrm{kernel}_{tj}|`.  A lane whose solve fails stays put.  Since the objective
    never decreases, this is a generalised M-step (Dempster, Laird & Rubin 1977, JRSS-B, §3).

    Shapes: ``Ze`` (A, p, n), ``ZZ`` (A, n, p*p) or None, ``y`` (A, n), ``tau`` (A, k, n), ``beta`` (A, k, p),
    ``eta`` / ``mu`` (A, k, n) at ``beta``, ``trials`` (A, n), ``offset`` (A, n) (added to every candidate's linear
    predictor; ``eta`` includes it).  Returns the new ``beta`` and its linear predictor.
    """
    terms = _glm_kernel_terms(glm, y, eta, tau, trials, mu)
    q, scale = terms.sum(-1), terms.abs().sum(-1)
    wm = tau if trials is None else tau * trials.unsqueeze(1)
    grad = torch.bmm(wm * (y.unsqueeze(1) - mu), Ze.transpose(1, 2))  # (A, k, p)
    v = mu if glm.name == "poisson" else glm.variance(mu)
    H = _weighted_gram(wm * v, Ze, ZZ)
    if prox:
        H = H + prox * torch.eye(Ze.shape[1], dtype=Ze.dtype, device=Ze.device)
    delta, info = torch.linalg.solve_ex(H, grad.unsqueeze(-1))
    delta = delta.squeeze(-1)
    ok = (info == 0) & torch.isfinite(delta).all(-1)
    delta = torch.where(ok.unsqueeze(-1), delta, torch.zeros_like(delta))
    unmeasurable = (grad * delta).sum(-1) <= _ROUNDING * torch.finfo(q.dtype).eps * scale
    todo = ok & torch.isfinite(q)
    beta0 = beta
    t = 1.0
    for _ in range(_MAX_HALVINGS):
        if not bool(todo.any()):
            break
        cand = beta + t * delta
        eta_c = torch.bmm(cand, Ze) if offset is None else torch.bmm(cand, Ze) + offset.unsqueeze(1)
        qc = _glm_kernel_terms(glm, y, eta_c, tau, trials).sum(-1)
        if prox:
            qc = qc - 0.5 * prox * ((cand - beta0) ** 2).sum(-1)
        acc = todo & torch.isfinite(qc) & ((qc >= q) | unmeasurable)
        if t == 1.0 and bool(acc.all()):  # the usual case: every full Newton step is accepted
            return cand, eta_c
        beta = torch.where(acc.unsqueeze(-1), cand, beta)
        eta = torch.where(acc.unsqueeze(-1), eta_c, eta)
        q = torch.where(acc, qc, q)
        unmeasurable = torch.zeros_like(unmeasurable)  # only the full step is taken unmeasured
        todo = todo & ~acc
        t *= 0.5
    return beta, eta


def gate_cvxpy(Z: torch.Tensor, tau: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    r"""Exact weighted multinomial-logit gate step by cvxpy (one convex program per (replicate, restart)).

    Maximises :math:`\sum_t [\sum_i \tau_{ti}\ell_{ti} - \log\sum_i e^{\ell_{ti}}]` over the free rows
    (the last row is the zero reference); uses :math:`\sum_i\tau_{ti} = 1`.  Reference solver for tests
    and small problems; keeps the current rows if the solver fails or returns a worse point.
    """
    import cvxpy as cp

    R, S, km1, p = theta.shape
    Zn, Tn = Z.detach().cpu().numpy(), tau.detach().cpu().numpy()
    out = theta.detach().cpu().numpy().copy()
    for r in range(R):
        for s in range(S):
            B = cp.Variable((p, km1))
            L = Zn[r] @ B
            full = cp.hstack([L, np.zeros((Zn.shape[1], 1))])
            obj = cp.sum(cp.multiply(Tn[r, s], full)) - cp.sum(cp.log_sum_exp(full, axis=1))
            prob = cp.Problem(cp.Maximize(obj))
            try:
                prob.solve(solver=cp.CLARABEL)
            except cp.error.SolverError:
                continue
            if B.value is not None and np.isfinite(B.value).all():
                out[r, s] = B.value.T
    new = torch.as_tensor(out, dtype=theta.dtype, device=theta.device)
    better = _gate_objective(Z, tau, new) >= _gate_objective(Z, tau, theta)  # guard against inaccurate solves
    return torch.where(better[..., None, None], new, theta)


def _shared_objective(glm: Family | None, y: torch.Tensor, eta: torch.Tensor, tau: torch.Tensor,
                      wt: torch.Tensor, trials: torch.Tensor | None) -> torch.Tensor:
    r"""The expert part of the M-step objective, (A,): :math:`\sum_{t,j} w_{tj}\,\mathrm{kernel}(y_t, \eta_{tj})`."""
    if glm is None:
        r = y.unsqueeze(1) - eta
        return -0.5 * (wt * r * r).sum((1, 2))
    return (tau * glm.log_kernel(y.unsqueeze(1), eta, None if trials is None else trials.unsqueeze(1))).sum((1, 2))


def shared_newton_step(Ze: torch.Tensor, Zs: torch.Tensor, y: torch.Tensor, tau: torch.Tensor, beta: torch.Tensor,
                       gamma: torch.Tensor, prox: float, *, glm: Family | None = None, var: torch.Tensor | None = None,
                       trials: torch.Tensor | None = None, offset: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Joint expert M-step with coefficients :math:`\gamma` shared by all experts (flexmix's ``FLXMRglmfix``).

    The linear predictor of expert :math:`j` is :math:`\eta_{tj} = z_t^\top\beta_j + s_t^\top\gamma`, so the M-step
    maximises :math:`Q(\beta_1, \ldots, \beta_k, \gamma) = \sum_j\sum_t w_{tj}\,\kappa(y_t, \eta_{tj})` jointly: the
    regression of the response stacked :math:`k` times on the block design

    .. math:: \begin{pmatrix} Z & & & S\ & \ddots & & \vdots\ & & Z & S \end{pmatrix}
              \begin{pmatrix}\beta_1\ \vdots\ \beta_k\ \gamma\end{pmatrix},
              \qquad H = \begin{pmatrix} A_1 & & & C_1\ & \ddots & & \vdots\ & & A_k & C_k\
              C_1^\top & \cdots & C_k^\top & D\end{pmatrix},

    :math:`A_j = \sum_t h_{tj} z_tz_t^\top + \epsilon I`, :math:`C_j = \sum_t h_{tj} z_ts_t^\top`,
    :math:`D = \sum_{j,t} h_{tj} s_ts_t^\top + \epsilon I`.  The Newton step :math:`H\delta = g` is solved exactly
    through the Schur complement of the block-diagonal part,
    :math:`(D - \sum_j C_j^\top A_j^{-1}C_j)\,\delta_\gamma = g_\gamma - \sum_j C_j^\top A_j^{-1}g_{\beta_j}` and
    :math:`\delta_{\beta_j} = A_j^{-1}(g_{\beta_j} - C_j\delta_\gamma)`: :math:`k` solves of size :math:`p` and one of
    size :math:`q` instead of one of size :math:`kp + q`.

    * **Gaussian experts** (``glm=None``; ``var`` the current variances): :math:`\kappa = -(y-\eta)^2/(2\sigma_j^2)`,
      weights :math:`h_{tj} = w_{tj}\,\sigma_{\min}^2/\sigma_j^2` (a common factor, so :math:`\epsilon` keeps the
      scale of the unshared M-step).  :math:`Q` is quadratic, so this one step is the exact weighted least-squares
      solution given the variances; the variances are then updated given the coefficients.  Together the two are
      the conditional-maximisation steps of ECM (Meng & Rubin 1993, Biometrika 80), which keep the EM ascent
      property.
    * **GLM experts**: :math:`\kappa = m_t[y_t\eta - b(\eta)]`, :math:`h_{tj} = w_{tj} m_t V(\mu_{tj})` (the IRLS
      weights, McCullagh & Nelder 1989, §2.5), and the step is halved (:math:`t = 1, 1/2, \ldots`) until
      :math:`Q` does not decrease: a generalised M-step.

    The proximal term :math:`-\tfrac\epsilon2\lVert(\beta,\gamma) - (\beta,\gamma)^{old}
Vert^2` (``prox``) is zero
    at the start, as in :func:`em_fit`.  Shapes (A pairs): ``Ze`` (A, p, n), ``Zs`` (A, q, n), ``y`` (A, n),
    ``tau`` (A, k, n) (responsibilities times case weights), ``beta`` (A, k, p), ``gamma`` (A, q), ``var`` (A, k),
    ``trials`` (A, n), ``offset`` (A, n) (a known term of every expert's linear predictor).  Returns the new
    ``beta`` and ``gamma``.
    """
    def linear(b: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        eta = torch.bmm(b, Ze) + torch.bmm(g.unsqueeze(1), Zs)
        return eta if offset is None else eta + offset.unsqueeze(1)

    eta = linear(beta, gamma)
    if glm is None:
        if var is None:
            raise ValueError("shared_newton_step with Gaussian experts needs var=, the current variances (A, k).")
        wt = tau * (var.amin(-1, keepdim=True) / var).unsqueeze(-1)
        resid, hw = y.unsqueeze(1) - eta, wt
    else:
        mu = glm.inverse_link(eta)
        wt = tau if trials is None else tau * trials.unsqueeze(1)
        resid = y.unsqueeze(1) - mu
        hw = wt * glm.variance(mu).clamp_min(torch.finfo(eta.dtype).tiny)
    g_b = torch.einsum("akn,apn->akp", wt * resid, Ze)
    g_s = torch.einsum("akn,aqn->aq", wt * resid, Zs)
    p, q = Ze.shape[1], Zs.shape[1]
    eye_p = torch.eye(p, dtype=Ze.dtype, device=Ze.device)
    eye_q = torch.eye(q, dtype=Ze.dtype, device=Ze.device)
    A = torch.einsum("akn,apn,arn->akpr", hw, Ze, Ze) + prox * eye_p
    C = torch.einsum("akn,apn,aqn->akpq", hw, Ze, Zs)
    D = torch.einsum("an,aqn,arn->aqr", hw.sum(1), Zs, Zs) + prox * eye_q
    Ainv_g = torch.linalg.solve(A, g_b.unsqueeze(-1)).squeeze(-1)  # (A, k, p)
    Ainv_C = torch.linalg.solve(A, C)  # (A, k, p, q)
    schur = D - torch.einsum("akpq,akpr->aqr", C, Ainv_C)
    rhs = g_s - torch.einsum("akpq,akp->aq", C, Ainv_g)
    d_s, info = torch.linalg.solve_ex(schur, rhs.unsqueeze(-1))
    d_s = d_s.squeeze(-1)
    d_b = Ainv_g - torch.einsum("akpq,aq->akp", Ainv_C, d_s)
    ok = (info == 0) & torch.isfinite(d_s).all(-1) & torch.isfinite(d_b).flatten(1).all(-1)
    d_b = torch.where(ok[:, None, None], d_b, torch.zeros_like(d_b))
    d_s = torch.where(ok[:, None], d_s, torch.zeros_like(d_s))
    if glm is None:  # a quadratic: the full step is the exact maximiser
        return beta + d_b, gamma + d_s
    q0 = _shared_objective(glm, y, eta, tau, wt, trials)
    step_sq = (d_b * d_b).sum((1, 2)) + (d_s * d_s).sum(-1)
    todo = ok.clone()
    t = 1.0
    for _ in range(_LINE_SEARCH + 18):  # t down to 2^-29, as irls_weighted
        if not bool(todo.any()):
            break
        cb, cs = beta + t * d_b, gamma + t * d_s
        qc = _shared_objective(glm, y, linear(cb, cs), tau, wt, trials)
        qc = qc - 0.5 * prox * t * t * step_sq
        acc = todo & torch.isfinite(qc) & (qc >= q0)
        beta = torch.where(acc[:, None, None], cb, beta)
        gamma = torch.where(acc[:, None], cs, gamma)
        todo &= ~acc
        t *= 0.5
    return beta, gamma


def gate_log_weights(spec: MoE, layout: ParamLayout, theta_g: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    r"""Log mixture weights :math:`\log\tilde\pi_i(x_t)` (..., k, n) of the gate terms ``theta_g`` (..., n_gate)
    of ``layout`` at inputs ``X`` (..., n, d): the model's :meth:`moestat.MoE.gate_scores` normalised by
    :func:`moestat.gates.log_mixture_weights` with the spec's options, the gate part of
    :meth:`moestat.MoE.log_joint_from_linear`."""
    gb, gw = layout.unpack_gate(theta_g)
    scores = spec.gate_scores(X, gw, gb).transpose(-1, -2)
    return log_mixture_weights(spec.gate, scores, top_k=spec.top_k, temperature=spec.temperature, dim=-2,
                               n_shared=spec.n_shared)


def expected_gate_loglik(tau: torch.Tensor, logw: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum_t\sum_i \tau_{ti}\log\tilde\pi_i(x_t)` over the last two axes, with :math:`0\log 0 = 0`.

    Sparse gates (top-K, normalised sigmoid with ``top_k``) give an expert outside an observation's selected set
    :math:`\log\tilde\pi_i = -\infty`, and its responsibility is then exactly 0; the term is 0 (the complete-data
    log-likelihood of Dempster, Laird & Rubin 1977 never counts an allocation of probability 0).  A selected set
    that drops an expert with :math:`\tau_{ti} > 0` gives :math:`-\infty`.  Elsewhere equal to
    ``(tau * logw).sum((-1, -2))``.
    """
    return torch.where(tau > 0, tau * logw, torch.zeros_like(logw)).sum((-1, -2))


#: The expert families of the C++ EM loop and their codes there.
NATIVE_FAMILIES = {"gaussian": 0, "poisson": 1, "binomial": 2}


def glm_density_constant(spec: MoE, y: torch.Tensor, trials: torch.Tensor | None) -> torch.Tensor:
    r"""The part of a GLM expert's log-density free of the linear predictor, :math:`c_t` in
    :math:`\log f = m_t[y_t\eta - b(\eta)] + c_t` (:math:`-\log y_t!` for Poisson, :math:`\log\binom{m_t}{m_t y_t}`
    for binomial), from the family: computed once by the callers of the C++ EM and L-BFGS loops."""
    zero = torch.zeros_like(y)
    return spec.glm.log_density(y, zero, trials=trials) - spec.glm.log_kernel(y, zero, trials)


def native_applies(spec: MoE, X: torch.Tensor, gate_solver: str = "newton",
                   shared_columns: Sequence[int] | None = None) -> bool:
    """Whether :func:`em_fit` can run in the fused C++ kernel: a CPU, float64, Gaussian, Poisson or binomial experts
    (linear or constant, shared slopes allowed), a softmax gate with at most 64 experts and Newton gate steps (a C++
    compiler is needed as well).  ``shared_columns`` is accepted for the callers' uniformity; every layout of
    columns is covered."""
    return (X.device.type == "cpu" and X.dtype == torch.float64 and spec.gate == "softmax"
            and spec.response in NATIVE_FAMILIES and spec.expert in ("linear", "constant") and spec.k <= 64
            and gate_solver == "newton")


def _observed_loglik(logw: torch.Tensor, log_expert: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    r""":math:`\ell = \sum_t c_t\log\sum_i\tilde\pi_i(x_t)\,f_i(y_t\mid x_t)` (A,) from log gate weights and log
    expert densities (A, k, n); case weights ``weights`` (A, n) or None (all one)."""
    lse = torch.logsumexp(logw + log_expert, dim=1)
    return lse.sum(-1) if weights is None else (lse * weights).sum(-1)


def gate_derivatives(spec: MoE, layout: ParamLayout, X: torch.Tensor, tau: torch.Tensor, theta_g: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Gradient (A, P) and Hessian (A, P, P) of each pair's :math:`Q(\theta_g) = \sum_t\sum_i
    \tau_{ti}\log\tilde\pi_i(x_t;\theta_g)` (:func:`expected_gate_loglik` of :func:`gate_log_weights`) at its gate
    terms ``theta_g`` (A, P), by plain autograd, reverse over reverse: one backward pass of the summed :math:`Q`
    gives every pair's gradient (the pairs share no parameter), batched backward passes of that gradient the
    Hessian's rows (:func:`moestat.fit._derivatives.hessian_rows`, in chunks that stay in cache).

    The same numbers as ``torch.func.vmap`` over ``grad`` and ``jacrev`` of one pair's :math:`Q` (to the bit for the
    top-K, Laplace, Gaussian and quadratic gates; to a relative :math:`10^{-14}` for the sigmoid and cosine gates),
    without ``torch.func``, whose first use in a process imports torch's compiler (about 1 s).
    """
    th = theta_g.detach().requires_grad_(True)
    with torch.enable_grad():
        q = expected_gate_loglik(tau, gate_log_weights(spec, layout, th, X)).sum()
        (g,) = torch.autograd.grad(q, th, create_graph=True)
        H = hessian_rows(g, th, per_row=th.shape[0] * tau.shape[-2] * tau.shape[-1])
    return g.detach(), H


def gradient_gate_step(spec: MoE, layout: ParamLayout, X: torch.Tensor, tau: torch.Tensor, theta_g: torch.Tensor,
                       logw: torch.Tensor, steps: int = 1, log_expert: torch.Tensor | None = None,
                       weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Generalised-EM gate step for any differentiable gate: damped Newton steps on
    :math:`Q(\theta_g) = \sum_t\sum_i \tau_{ti}\log\tilde\pi_i(x_t;\theta_g)` that never lower it.

    The gradient :math:`g` and Hessian :math:`H` of :math:`Q` come from autograd through the model's gate
    (:func:`gate_derivatives`).  :math:`Q` need not be concave for a gate not
    affine in x, so the step is the saddle-free Newton direction
    :math:`\delta = V\,\mathrm{diag}(1/\max(|\lambda_j|, \epsilon))\,V^\top g` (:math:`H = V\Lambda V^\top`,
    :math:`\epsilon = 10^{-8}\max_j|\lambda_j| + 10^{-12}`; Dauphin et al. 2014, NeurIPS), an ascent direction;
    each step tries :math:`t = 1, 1/2, \ldots, 2^{-29}` and keeps the first that does not lower :math:`Q`, else
    the pair stays put.  :math:`Q` uses :math:`0\log 0 = 0` (:func:`expected_gate_loglik`).  Since the expert
    M-step does not lower the expected complete-data log-likelihood either, every EM iteration raises the
    log-likelihood or keeps it (Dempster, Laird & Rubin 1977, JRSS-B, §3: a generalised EM algorithm).

    Top-K gates (and the normalised sigmoid with ``top_k``): :func:`torch.topk`'s indices carry no derivative, so
    :math:`g` and :math:`H` are those of :math:`Q` with each observation's selected set frozen at the current
    parameters (as the gradient path of :func:`moestat.fit_mle` differentiates the likelihood); the line search
    evaluates :math:`Q` at each candidate with the sets selected there, so an accepted step never lowers the true
    :math:`Q`.  A step that moves an expert with positive responsibility out of a set gives :math:`Q = -\infty`,
    so on :math:`Q` alone no selected set could ever change; with ``log_expert`` (the log expert densities
    :math:`\log f_i(y_t\mid x_t)` (A, k, n) at the experts of this iteration's M-step) a candidate is also accepted
    when it does not lower the observed log-likelihood
    :math:`\ell = \sum_t c_t\log\sum_i\tilde\pi_i(x_t)f_i(y_t\mid x_t)` (case weights ``weights`` (A, n)) at
    those experts.  Either test keeps the EM ascent property: the expert M-step already raised :math:`\ell` with
    the gate held, and a gate step then raises :math:`Q` (DLR 1977) or :math:`\ell` itself.  With
    ``top_k = 1`` the gate's derivatives vanish almost everywhere and the gate stays put.

    Shapes (A pairs): ``X`` (A, n, d), ``tau`` (A, k, n) (responsibilities times case weights), ``theta_g``
    (A, n_gate), ``logw`` (A, k, n) the log weights at ``theta_g``.  Returns the new gate terms and log weights.
    """
    for _ in range(steps):
        q0 = expected_gate_loglik(tau, logw)
        g, H = gate_derivatives(spec, layout, X, tau, theta_g)
        # a pair whose derivatives are not finite (a kink, e.g. a cosine/norm at w = 0) takes a gradient step
        ok = torch.isfinite(H).flatten(1).all(-1) & torch.isfinite(g).all(-1)
        eye = torch.eye(H.shape[-1], dtype=H.dtype, device=H.device)
        H = torch.where(ok[:, None, None], 0.5 * (H + H.transpose(-1, -2)), -eye)
        g = torch.where(ok[:, None], g, torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0))
        lam, V = torch.linalg.eigh(H)
        floor = 1e-8 * lam.abs().amax(-1, keepdim=True) + 1e-12
        delta = (V @ ((V.transpose(-1, -2) @ g.unsqueeze(-1)).squeeze(-1) / lam.abs().clamp_min(floor)).unsqueeze(-1)
                 ).squeeze(-1)
        delta = torch.where(torch.isfinite(delta), delta, torch.zeros_like(delta))
        todo = torch.ones_like(q0, dtype=torch.bool)
        ll0 = None if log_expert is None else _observed_loglik(logw, log_expert, weights)
        t = 1.0
        for _ in range(_LINE_SEARCH + 18):
            cand = theta_g + t * delta
            lw = gate_log_weights(spec, layout, cand, X)
            qc = expected_gate_loglik(tau, lw)
            up = torch.isfinite(qc) & (qc >= q0)
            if ll0 is not None and log_expert is not None:  # sparse gates: or the observed likelihood does not fall
                llc = _observed_loglik(lw, log_expert, weights)
                up |= torch.isfinite(llc) & (llc >= ll0)
            acc = todo & up
            theta_g = torch.where(acc[:, None], cand, theta_g)
            logw = torch.where(acc[:, None, None], lw, logw)
            todo &= ~acc
            if not bool(todo.any()):
                break
            t *= 0.5
    return theta_g, logw


def _without_autograd(fit: Callable[P, EMState]) -> Callable[P, EMState]:
    """Run a softmax-gated EM in inference mode (no autograd bookkeeping on its many small tensor operations, a
    fifth of an iteration's time at n = 200), returning ordinary tensors.  Other gates differentiate the gate in
    their M-step (:func:`gradient_gate_step`) and run as they are."""
    @functools.wraps(fit)
    def run(*args: P.args, **kwargs: P.kwargs) -> EMState:
        spec = args[0] if args else kwargs.get("spec")  # em_fit's first argument, by position or by name
        if not isinstance(spec, MoE) or spec.gate != "softmax" or torch.is_inference_mode_enabled():
            return fit(*args, **kwargs)
        with torch.inference_mode():
            st = fit(*args, **kwargs)
        return EMState(st.params.map(torch.clone), st.loglik.clone(), st.converged.clone(), st.n_iter.clone(),
                       st.history.clone())
    return run


@_without_autograd
def em_fit(spec: MoE, X: torch.Tensor, y: torch.Tensor, init: BlockParams, *, var_floor: torch.Tensor,
           tol: float, max_iter: int, gate_steps: int = 2, gate_solver: str = "newton",
           prox: float = 1e-8, gate_columns: Sequence[int] | None = None,
           expert_columns: Sequence[int] | None = None, weights: torch.Tensor | None = None,
           shared_columns: Sequence[int] | None = None, trials: torch.Tensor | None = None,
           callback: Callable[[int, torch.Tensor], None] | None = None,
           layout: ParamLayout | None = None, accelerate: bool = True,
           offset_column: int | None = None, native: bool = False) -> EMState:
    r"""Run batched EM from ``init`` (leading axes (R, S)) on data X (R, n, d), y (R, n).

    Convergence of a (replicate, restart) pair: :math:`|\ell_t - \ell_{t-1}| \le
    \mathrm{tol}\,(1 + |\ell_t|)`; converged pairs are frozen.  ``var_floor`` has shape (R,).

    ``gate_columns`` / ``expert_columns`` restrict the gate and the experts to some input columns (the other
    slopes stay zero; :class:`moestat.fit._layout.ParamLayout`).  Case weights ``weights`` (R, n) multiply each
    observation's log-likelihood, :math:`\ell = \sum_t c_t \log p(y_t\mid x_t)`: every M-step then uses the
    weighted responsibilities :math:`c_t\tau_{ti}` (integer weights give the fit of the data with repeated rows).

    ``shared_columns`` are input columns whose expert slope :math:`\gamma` is common to all experts; the expert
    M-step then solves for every expert's own coefficients and :math:`\gamma` jointly (:func:`shared_newton_step`).
    ``trials`` (R, n) are binomial trials :math:`m_t` (binomial experts; ``y`` is then the proportion of successes).
    ``offset_column``: the input column :math:`o_t` added to every expert's linear predictor with coefficient 1
    (:class:`moestat.fit._layout.ParamLayout`); for Gaussian experts that is EM on :math:`y_t - o_t`, for GLM experts
    the offset enters the IRLS step's linear predictor.
    ``callback(iteration, keep)``, if given, is called after every E-step with the mask of the active pairs that
    iterate on (:func:`moestat.fit_mle`'s progress bar); it cannot change the fit.  ``layout`` (every gate but
    softmax): the :class:`moestat.fit._layout.ParamLayout` whose gate terms the gradient gate step moves
    (:func:`gradient_gate_step`); default the layout of ``spec`` and the columns given.

    ``accelerate`` (softmax gates): SQUAREM, the squared iterative extrapolation of Varadhan & Roland (2008,
    *Scand. J. Statist.* 35:335), scheme S3, on the EM map :math:`M`.  A cycle takes two EM steps
    :math:`\theta_1 = M(\theta_0)`, :math:`\theta_2 = M(\theta_1)`, sets :math:`r = \theta_1 - \theta_0`,
    :math:`v = \theta_2 - 2\theta_1 + \theta_0`, :math:`\alpha = \min(-\lVert r\rVert/\lVert v\rVert, -1)` and
    jumps to :math:`\theta' = \theta_0 - 2\alpha r + \alpha^2 v`, whose EM step :math:`M(\theta')` starts the next
    cycle; the jump is kept only where :math:`\ell(\theta') \ge \ell(\theta_1)` and is replaced by
    :math:`\theta_2` elsewhere, so the recorded log-likelihoods still never decrease.  :math:`\theta` holds the gate
    terms, the expert coefficients (and shared slopes) and the log variances (Gaussian experts; a jump is floored
    at ``var_floor``).  Each iteration is still one E-step and one M-step (plus an E-step at :math:`\theta_2` in an
    iteration where a jump is refused); EM's slow linear convergence then takes a fraction of the iterations.

    Every per-observation array is laid out (pairs, k, n), observations last, so the reductions over
    experts run along a strided axis instead of a length-k inner axis (several times faster on CPU).
    The expert M-step uses the weighted Gram matrices :math:`\sum_t \tau_{ti} z_t z_t^\top`, formed as
    one product of the responsibilities with the per-observation outer products :math:`z_t z_t^\top`
    when :math:`(d+1)^2` is small; the gate Hessian reuses the same products.  A softmax-gated fit runs in
    ``torch.inference_mode`` and returns ordinary (cloned) tensors (:func:`_without_autograd`); pairs' iteration
    counts and convergence flags are written in the iterations where some pair stops.

    ``native=True``: where :func:`native_applies` (a CPU, float64, Gaussian, Poisson or binomial experts with
    trials, offsets, case weights and shared slopes, a softmax gate, Newton gate steps), the whole loop runs in the
    fused C++ kernel ``moestat/fit/_em_native.cpp``, one pair after another with each pair's arrays in cache, and no
    tensor operation per step: the same iteration (the GLM experts' step is :func:`glm_expert_step`'s, the shared
    slopes' :func:`shared_newton_step`'s), stopping rule and SQUAREM cycle, solved by Cholesky instead of LU (the
    estimates agree with the tensor loop's to rounding).
    ``callback`` is then called once, at the end.  Elsewhere, or without a C++ compiler, the tensor loop runs.
    """
    generic = spec.gate != "softmax"  # gradient gate step (gradient_gate_step) instead of IRLS
    sparse = spec.gate == "topk" or (spec.gate == "normalized_sigmoid" and spec.top_k is not None)
    if spec.expert not in ("linear", "constant"):
        raise ValueError("method='em' supports expert='linear' or 'constant' (with any gate); "
                         f"got gate={spec.gate!r}, expert={spec.expert!r}. Use method='gradient'.")
    if generic and layout is None:
        layout = ParamLayout(spec, gate_columns=gate_columns, expert_columns=expert_columns,
                             shared_columns=shared_columns)
    R, n, d = X.shape
    k = spec.k
    S = init.gate_bias.shape[1]
    B = R * S
    dependent = spec.family.input_dependent
    # flat (replicate, restart) pairs; each iteration works on the still-active pairs only
    oc = [] if offset_column is None else [offset_column]
    gcols = [j for j in range(d) if j not in oc] if gate_columns is None else list(gate_columns)
    scols = [] if shared_columns is None else list(shared_columns)
    ecols = [j for j in range(d) if j not in scols + oc] if expert_columns is None else list(expert_columns)
    same_cols = gcols == ecols
    if oc and spec.has_noise_sd:  # N(y; eta + o, var) = N(y - o; eta, var): EM on the response net of the offset
        y = y - X[..., offset_column]
    of = X[..., offset_column].repeat_interleave(S, dim=0) if oc and not spec.has_noise_sd else None
    yf = y.repeat_interleave(S, dim=0)
    floor_f = var_floor.repeat_interleave(S, dim=0)
    wf = None if weights is None else weights.repeat_interleave(S, dim=0)
    mf = None if trials is None else trials.repeat_interleave(S, dim=0)
    # shared design (B, q, n), no intercept; None without shared columns
    Zs = X[..., scols].transpose(1, 2).repeat_interleave(S, dim=0).contiguous() if scols else None
    Zg = design(X[..., gcols], True).transpose(1, 2).repeat_interleave(S, dim=0).contiguous()  # gate (B, pg, n)
    if not dependent:
        Ze = Zg[:, :1].contiguous()  # expert design (B, pe, n)
    elif same_cols:
        Ze = Zg
    else:
        Ze = design(X[..., ecols], True).transpose(1, 2).repeat_interleave(S, dim=0).contiguous()
    ZZg = _second_moments(Zg)
    ZZe = (ZZg if same_cols else _second_moments(Ze)) if dependent else None
    Zy = (Ze * yf.unsqueeze(1)).transpose(1, 2).contiguous()  # (B, n, p): z_t y_t
    eps = prox * n
    flat = init.map(lambda a: a.reshape(B, *a.shape[2:]))
    gb, gw = flat.gate_bias, flat.gate_weight
    gw = gw[..., gcols]
    if generic and layout is not None:  # the layout's gate terms (reference expert, cosine angles)
        theta_g = layout.pack_gate(gb, flat.gate_weight).contiguous()
        Xg: torch.Tensor | None = X.repeat_interleave(S, dim=0)
    else:
        theta_g = torch.cat([(gb - gb[..., -1:]).unsqueeze(-1), gw - gw[..., -1:, :]], dim=-1)[..., :-1, :].contiguous()
        Xg = None
    if dependent:
        beta = torch.cat([flat.expert_bias.unsqueeze(-1), flat.expert_weight[..., ecols]], dim=-1).contiguous()
    else:
        beta = flat.expert_bias.unsqueeze(-1).clone()  # a copy: the final write-back must not reach init
    p_e = beta.shape[-1]
    # shared slopes: the mean over experts projects a start onto the constraint (all experts equal)
    gamma = flat.expert_weight[..., scols].mean(-2).contiguous() if scols else None
    var = (flat.noise_sd**2).contiguous()
    eps_eye = eps * torch.eye(p_e, dtype=X.dtype, device=X.device)
    converged = torch.zeros(B, dtype=torch.bool, device=X.device)
    n_iter = torch.zeros(B, dtype=torch.long, device=X.device)
    ll_all = torch.full((B,), -torch.inf, dtype=X.dtype, device=X.device)
    history = []
    idx = torch.arange(B, device=X.device)
    every = True  # every pair still iterates (idx is all of them)
    ll_prev = None

    def blocks(theta_g: torch.Tensor, beta: torch.Tensor, var: torch.Tensor) -> BlockParams:
        ew = torch.zeros(*beta.shape[:-1], d, dtype=X.dtype, device=X.device)
        if dependent:
            ew[..., ecols] = beta[..., 1:]
        if gamma is not None:
            ew[..., scols] = gamma.unsqueeze(-2).expand(*beta.shape[:-1], len(scols))
        if oc:
            ew[..., oc] = 1.0
        if generic and layout is not None:
            gb, gw = layout.unpack_gate(theta_g)
            return BlockParams(gb, gw, ew, beta[..., 0], var.sqrt())
        zero = torch.zeros(*theta_g.shape[:-2], 1, theta_g.shape[-1], dtype=theta_g.dtype, device=theta_g.device)
        g = torch.cat([theta_g, zero], dim=-2)
        gw = torch.zeros(*g.shape[:-1], d, dtype=X.dtype, device=X.device)
        gw[..., gcols] = g[..., 1:]
        return BlockParams(g[..., 0], gw, ew, beta[..., 0], var.sqrt())

    def unflat(a: torch.Tensor) -> torch.Tensor:
        return a.reshape(R, S, *a.shape[1:])

    applies = native and native_applies(spec, X, gate_solver, shared_columns) and _native.compiler_available()
    kernel = _native.load_em() if applies else None
    if kernel is not None:
        none = yf.new_empty(0)
        constant = none if spec.has_noise_sd else glm_density_constant(spec, yf, mf)
        tg_n, beta_n, var_n, ll_n, conv_n, it_n, hist_n, gm_n = kernel.em_softmax(
            yf, none if wf is None else wf, Zg, Ze, theta_g, beta, var, floor_f, float(tol), int(max_iter),
            float(eps), int(gate_steps), bool(accelerate), NATIVE_FAMILIES[spec.response],
            none if mf is None else mf, none if of is None else of, constant, none if Zs is None else Zs,
            none if gamma is None else gamma)
        if gamma is not None:
            gamma = gm_n  # blocks() writes it into every expert's shared columns
        if callback is not None:
            callback(int(it_n.max()), torch.zeros_like(conv_n))
        return EMState(blocks(tg_n, beta_n, var_n).map(unflat), unflat(ll_n), unflat(conv_n), unflat(it_n),
                       hist_n.reshape(hist_n.shape[0], R, S))

    ya, Zga, Zea, ZZga, ZZea, Zya, fl, wa, ma, Zsa, oa = yf, Zg, Ze, ZZg, ZZe, Zy, floor_f, wf, mf, Zs, of
    tg_a, beta_a, var_a = theta_g.clone(), beta.clone(), var.clone()
    gm_a = None if gamma is None else gamma.clone()
    Xa = Xg
    if Xa is not None and layout is not None:
        logw = gate_log_weights(spec, layout, tg_a, Xa)  # (A, k, n)
    else:
        logw = torch.log_softmax(_gate_logits(tg_a, Zga), dim=1)  # (A, k, n)
    glm = None if spec.has_noise_sd else spec.glm

    def linear_predictor() -> torch.Tensor:
        eta = torch.bmm(beta_a, Zea)
        eta = eta if gm_a is None else eta + torch.bmm(gm_a.unsqueeze(1), Zsa)
        return eta if oa is None else eta + oa.unsqueeze(1)

    def expert_log_density() -> torch.Tensor:
        """Log expert densities (A, k, n) at the current expert parameters (as in the E-step)."""
        eta = linear_predictor()
        if glm is None:
            return normal_log_density(ya.unsqueeze(1) - eta, var=var_a.unsqueeze(-1))
        return glm.log_density(ya.unsqueeze(1), eta, trials=None if ma is None else ma.unsqueeze(1))

    # GLM experts without shared slopes: the fused IRLS step (glm_expert_step) reuses the E-step's linear predictor
    # and mean, and hands back the linear predictor at the new coefficients for the next E-step
    fused = glm is not None and gm_a is None
    eta_a: torch.Tensor | None = None  # linear predictor (A, k, n) at beta_a, when the last M-step computed it
    lg_a = torch.lgamma(ya + 1.0) if fused and glm is not None and glm.name == "poisson" else None
    resid_a: torch.Tensor | None = None  # Gaussian experts: y - eta (A, k, n) at beta_a, from the last M-step

    def e_step() -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(log joint (A, k, n), linear predictor, mean) at the current parameters; GLM experts reuse ``eta_a``,
        Gaussian experts the M-step's residuals ``resid_a``."""
        if glm is None:
            resid = ya.unsqueeze(1) - linear_predictor() if resid_a is None else resid_a
            return logw + normal_log_density(resid, var=var_a.unsqueeze(-1)), None, None
        if fused:
            eta = linear_predictor() if eta_a is None else eta_a
            mu = glm.inverse_link(eta)
            if lg_a is not None:  # Poisson: y eta - e^eta - log y!, with log y! computed once
                return logw + (ya.unsqueeze(1) * eta - mu - lg_a.unsqueeze(1)), eta, mu
            return logw + glm.log_density(ya.unsqueeze(1), eta, trials=None if ma is None else ma.unsqueeze(1)), eta, mu
        # GLM experts with shared slopes: the family's log-density at the linear predictor
        return logw + glm.log_density(ya.unsqueeze(1), linear_predictor(),
                                      trials=None if ma is None else ma.unsqueeze(1)), None, None

    accel = accelerate and not generic and k > 1
    shapes = [tuple(tg_a.shape[1:]), tuple(beta_a.shape[1:]), tuple(var_a.shape[1:]) if glm is None else None,
              None if gm_a is None else tuple(gm_a.shape[1:])]

    def pack() -> torch.Tensor:
        """The active pairs' EM parameters as rows (A, P): gate terms, expert coefficients, log variances, shared."""
        parts = [tg_a.flatten(1), beta_a.flatten(1)]
        if glm is None:
            parts.append(var_a.log().flatten(1))
        if gm_a is not None:
            parts.append(gm_a.flatten(1))
        return torch.cat(parts, dim=1)

    sizes = [0 if shape is None else math.prod(shape) for shape in shapes]

    def unpack(theta: torch.Tensor) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        at = 0
        for shape, size in zip(shapes, sizes, strict=True):
            if shape is None:
                out.append(None)
                continue
            out.append(theta[:, at:at + size].reshape(-1, *shape))
            at += size
        return out

    def adopt(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                                             torch.Tensor]:
        """The active pairs' parameters at the packed point ``theta`` (A, P) (a SQUAREM jump, or theta_2 where it was
        refused): gate terms, expert coefficients, variances floored at ``var_floor``, shared slopes, and the log gate
        weights there."""
        tg_j, beta_j, lv_j, gm_j = unpack(theta)
        assert tg_j is not None and beta_j is not None
        tg = tg_j.contiguous()
        var = var_a if lv_j is None else torch.maximum(lv_j.exp(), fl.unsqueeze(-1))
        return (tg, beta_j.contiguous(), var, gm_a if gm_j is None else gm_j.contiguous(),
                torch.log_softmax(_gate_logits(tg, Zga), dim=1))

    phase, sq0, sq1, sq2, ll_mid = 0, None, None, None, None  # SQUAREM: cycle phase, theta_0..2, l(theta_1)
    for it in range(max_iter + 1):
        logc, eta_a, mu_a = e_step()
        lse = torch.logsumexp(logc, dim=1)
        ll = lse.sum(-1) if wa is None else (lse * wa).sum(-1)
        if accel and phase == 2 and sq2 is not None and ll_mid is not None:
            refused = ~(torch.isfinite(ll) & (ll >= ll_mid))
            if bool(refused.any()):  # back to theta_2 where the jump lowered the likelihood
                tg_a, beta_a, var_a, gm_a, logw = adopt(torch.where(refused[:, None], sq2, pack()))
                eta_a = resid_a = None
                logc, eta_a, mu_a = e_step()
                lse = torch.logsumexp(logc, dim=1)
                ll = lse.sum(-1) if wa is None else (lse * wa).sum(-1)
        if every:  # no pair has stopped yet: the active log-likelihoods are all of them
            ll_all = ll
            history.append(ll)
        else:
            ll_all[idx] = ll
            history.append(ll_all.clone())
        # the change over a SQUAREM jump is not an EM step's: a jump that lands level with theta_1 says nothing
        # about convergence, so only EM steps are tested.  ll_prev is finite (a pair whose l is not leaves), so
        # "not converged" is a change above the threshold
        tested = ll_prev is not None and not (accel and phase == 2)
        keep = torch.isfinite(ll)
        if tested:
            keep &= (ll - ll_prev).abs_() > ll.abs().add_(1.0).mul_(tol)
        if callback is not None:
            callback(it, keep)
        kept_all = bool(keep.all())
        if not kept_all:
            if tested:
                converged[idx[torch.isfinite(ll) & ~keep]] = True
            n_iter[idx[~keep]] = it  # M-steps taken: one in each iteration before this one
        if it == max_iter or (not kept_all and not bool(keep.any())):
            break
        if not kept_all:  # drop finished pairs from the working set
            if every:
                ll_all, every = ll_all.clone(), False
            theta_g[idx], beta[idx], var[idx] = tg_a, beta_a, var_a
            if gamma is not None and gm_a is not None and Zsa is not None:
                gamma[idx] = gm_a
                gm_a, Zsa = gm_a[keep], Zsa[keep]
            idx, logc, lse, ll, logw = idx[keep], logc[keep], lse[keep], ll[keep], logw[keep]
            ya, Zga, Zya, fl = ya[keep], Zga[keep], Zya[keep], fl[keep]
            Xa = None if Xa is None else Xa[keep]
            wa = None if wa is None else wa[keep]
            ma = None if ma is None else ma[keep]
            oa = None if oa is None else oa[keep]
            Zea = Zga if dependent and same_cols else Zea[keep]
            ZZga = None if ZZga is None else ZZga[keep]
            ZZea = (ZZga if same_cols else (None if ZZea is None else ZZea[keep])) if dependent else None
            tg_a, beta_a, var_a = tg_a[keep], beta_a[keep], var_a[keep]
            eta_a = None if eta_a is None else eta_a[keep]
            resid_a = None if resid_a is None else resid_a[keep]
            mu_a = None if mu_a is None else mu_a[keep]
            lg_a = None if lg_a is None else lg_a[keep]
            sq0, sq1, ll_mid = (None if a is None else a[keep] for a in (sq0, sq1, ll_mid))
            sq2 = None if sq2 is None else sq2[keep]
        if accel:
            if phase == 0:
                sq0 = pack()
            elif phase == 1:
                sq1, ll_mid = pack(), ll
        tau = torch.exp(logc - lse.unsqueeze(1))  # (A, k, n) responsibilities
        if wa is not None:
            tau = tau * wa.unsqueeze(1)
        if gm_a is not None and Zsa is not None:
            # shared slopes: one joint (proximal) Newton step on every expert's coefficients and gamma; exact
            # weighted least squares for Gaussian experts (at the current variances), step-halved IRLS for GLMs
            beta_a, gm_a = shared_newton_step(Zea, Zsa, ya, tau, beta_a, gm_a, eps, glm=glm, var=var_a, trials=ma,
                                              offset=oa)
            if glm is None:
                resid = ya.unsqueeze(1) - linear_predictor()
                ssq = (tau * resid * resid).sum(-1)
                var_a = torch.maximum((ssq + eps * var_a) / (tau.sum(-1) + eps), fl.unsqueeze(-1))
        elif glm is not None and eta_a is not None and mu_a is not None and _GLM_NEWTON_STEPS == 1:
            # GLM experts: a proximal IRLS (Newton) step on each expert's weighted log-likelihood, which never
            # lowers it (step halving): a generalised M-step; fused with the E-step's linear predictor
            beta_a, eta_a = glm_expert_step(glm, Zea, ZZea, ya, tau, beta_a, eta_a, mu_a, eps, trials=ma, offset=oa)
        elif glm is not None:
            beta_a = irls_weighted(Zea.transpose(1, 2), ya, tau.transpose(1, 2).unsqueeze(1), beta_a.unsqueeze(1),
                                   glm, max_iter=_GLM_NEWTON_STEPS, prox=eps, trials=ma,
                                   offset=None if oa is None else oa[:, None, :, None]).squeeze(1)
        else:
            # expert M-step: proximal weighted least squares, then the floored proximal variance update
            gram = _weighted_gram(tau, Zea, ZZea) + eps_eye
            rhs = torch.bmm(tau, Zya) + eps * beta_a
            beta_a = torch.linalg.solve_ex(gram, rhs.unsqueeze(-1))[0].squeeze(-1)
            resid_a = ya.unsqueeze(1) - torch.bmm(beta_a, Zea)  # the next E-step's residuals unless a jump moves beta
            ssq = (tau * resid_a * resid_a).sum(-1)
            var_a = torch.maximum((ssq + eps * var_a) / (tau.sum(-1) + eps), fl.unsqueeze(-1))
        if k > 1:
            if Xa is not None and layout is not None:
                # sparse gates (selected sets): the line search may also accept on the observed likelihood
                le = expert_log_density() if sparse else None
                tg_a, logw = gradient_gate_step(spec, layout, Xa, tau, tg_a, logw, gate_steps, le, wa)
            elif gate_solver == "cvxpy":
                tg_a = gate_cvxpy(Zga.transpose(1, 2), tau.transpose(1, 2).unsqueeze(1), tg_a.unsqueeze(1)).squeeze(1)
                logw = torch.log_softmax(_gate_logits(tg_a, Zga), dim=1)
            else:
                for _ in range(gate_steps):
                    tg_a, logw = _newton_gate_step(Zga, ZZga, tau, tg_a, logw, wa)
        if accel and phase == 1 and sq0 is not None and sq1 is not None:
            sq2 = pack()
            r, v = sq1 - sq0, sq2 - 2.0 * sq1 + sq0
            rn, vn = torch.linalg.vector_norm(r, dim=1), torch.linalg.vector_norm(v, dim=1)
            alpha = torch.where(vn > 0, -rn / vn, -1.0)
            alpha = alpha.clamp_max(-1.0).unsqueeze(1)
            jump = sq0 - 2.0 * alpha * r + alpha * alpha * v
            jump = torch.where(torch.isfinite(jump).all(1, keepdim=True), jump, sq2)
            tg_a, beta_a, var_a, gm_a, logw = adopt(jump)
            eta_a = resid_a = None
        if accel:
            phase = (phase + 1) % 3
        ll_prev = ll
    n_iter[idx] = it
    theta_g[idx], beta[idx], var[idx] = tg_a, beta_a, var_a
    if gamma is not None:
        gamma[idx] = gm_a

    hist = torch.stack(history).reshape(len(history), R, S)
    return EMState(blocks(theta_g, beta, var).map(unflat), unflat(ll_all), unflat(converged), unflat(n_iter), hist)
