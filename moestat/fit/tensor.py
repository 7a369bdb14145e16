r"""The two-stage tensor estimator of makkuva2020: :math:`L_4` for the experts, :math:`L_{\log}` for the gate.

**Stage 1 — experts** (makkuva2020 eq. 7).  With the output transforms :math:`Q_4, Q_2` and constants
:math:`c, c'` of :func:`moestat.hermite.output_transform`,

.. math::
    L_4(A) = \sum_{i\ne j} E[Q_4(y)\,t_1(a_i, a_j, x)] - \mu\sum_i E[Q_4(y)\,t_2(a_i, x)]
             + \lambda\sum_i \big(E[Q_2(y)\,t_3(a_i, x)] - 1\big)^2 + \tfrac{\delta}{2}\|A\|_F^2,

where :math:`c\,t_1(u,v,x) = \mathcal S_4(x)(u,u,v,v)`, :math:`c\,t_2(u,x) = \mathcal S_4(x)(u,u,u,u)` and
:math:`c'\,t_3(u,x) = \mathcal S_2(x)(u,u)` are projections of the Gaussian score functions.  The empirical loss
replaces :math:`E` by sample means and is evaluated per sample from :math:`U = XA^\top` and
:math:`G = AA^\top`, :math:`O(ndk + nk^2)` per step: the :math:`d^4` tensor is never formed.
In population (Theorem 5, eq. 8), with :math:`\alpha_m = E[p_m^*(x)]`,

.. math::
    L_4(A) = \sum_m \alpha_m \sum_{i\ne j}\langle a_m^*, a_i\rangle^2\langle a_m^*, a_j\rangle^2
             - \mu\sum_{m,i}\alpha_m\langle a_m^*, a_i\rangle^4
             + \lambda\sum_i\Big(\sum_m \alpha_m\langle a_m^*, a_i\rangle^2 - 1\Big)^2 + \tfrac{\delta}{2}\|A\|_F^2.

Its minimisers are a scaled *dual basis* of the regressors (Theorem 1: :math:`(A^\dagger)^\top = PD\Gamma A^*`), so
the regressors are recovered as the row-normalised :math:`(A^\dagger)^\top`, then signed (L4 is even in each
:math:`a_i`).  Optionally the data are first projected onto the top-k eigenvectors of
:math:`\hat{\mathcal T}_2 = \frac1{c'}[\overline{Q_2 xx^\top} - \overline{Q_2} I]`.

**Stage 2 — gate** (makkuva2020 eq. 9): projected gradient descent on :math:`L_{\log}(W, \hat A)` with the
experts frozen, :math:`W_{t+1} = \Pi_\Omega(W_t - \eta\nabla_W L_{\log})`, which in population is gradient EM
(App. D.3).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch

from .._random import fresh_seed
from .._torch import to_numpy, to_tensor
from .._validation import (
    Boolean,
    Device,
    Dtype,
    Integer,
    Optional,
    Real,
    Seed,
    check_choice,
    check_int,
    check_nonnegative,
    validate_arguments,
)
from ..hermite import OutputTransform, get_activation, hermite_moments, output_transform
from .gated import (
    GatedFit,
    History,
    expert_loglik,
    full_gate,
    gated_starts,
    llog_grad,
    llog_terms,
    prepare_data,
    project_ball,
    project_rows,
    resolve_starts,
    select_best,
    sum_k,
    truth_arrays,
    warn_theory,
)

__all__ = [
    "fit_gate",
    "fit_tensor",
    "gated_starts",
    "l4_loss",
    "l4_population",
    "minimise_l4_population",
    "recover_regressors",
]


# ----------------------------------------------------------------------------- the L4 loss
def _l4_batched(A: torch.Tensor, X: torch.Tensor, q4: torch.Tensor, q2: torch.Tensor, c4: float, c2: float,
                mu: float, lam: float, ridge: float) -> torch.Tensor:
    r"""Empirical L4 for ``A (R, S, k, d)``, ``X (R, n, d)``, ``q4 = Q4(y)``, ``q2 = Q2(y)`` (R, n) -> (R, S).

    Per sample, with :math:`U = XA^\top`, :math:`G = AA^\top`, :math:`N_i = G_{ii}`:
    :math:`\sum_{i\ne j} c\,t_1 = (\sum U_i^2)^2 - \sum U_i^4 - 2[(\sum N)(\sum U_i^2) - \sum N_iU_i^2]
    - 4[U^\top GU - \sum N_iU_i^2] + (\sum N)^2 - \sum N^2 + 2(\|G\|_F^2 - \sum N^2)`,
    :math:`\sum_i c\,t_2 = \sum U_i^4 - 6\sum N_iU_i^2 + 3\sum N_i^2`, :math:`c'\,t_3 = U_i^2 - N_i`.
    """
    n = X.shape[1]
    U = project_rows(X, A)                                         # (R, S, k, n)
    G = A @ A.transpose(-1, -2)                                    # (R, S, k, k)
    N = torch.diagonal(G, dim1=-2, dim2=-1)                        # (R, S, k)
    U2 = U * U
    S2 = sum_k(U2)
    S4 = sum_k(U2 * U2)
    NU2 = sum_k(U2 * N[..., None])
    UGU = sum_k((G @ U) * U)
    sN = N.sum(-1, keepdim=True)
    sN2 = (N * N).sum(-1, keepdim=True)
    G2 = (G * G).sum((-1, -2))[..., None]
    pairs = S2 * S2 - S4 - 2.0 * (sN * S2 - NU2) - 4.0 * (UGU - NU2) + (sN * sN - sN2) + 2.0 * (G2 - sN2)
    diag4 = S4 - 6.0 * NU2 + 3.0 * sN2
    q4b = q4[:, None, :]
    cross = (q4b * pairs).mean(-1) / c4
    quart = (q4b * diag4).mean(-1) / c4
    R, S, k, _ = U.shape
    second = ((U2.reshape(R, S * k, n) @ q2[..., None]).reshape(R, S, k) / n - q2.mean(-1)[:, None, None] * N) / c2
    return cross - mu * quart + lam * ((second - 1.0) ** 2).sum(-1) + 0.5 * ridge * (A * A).sum((-1, -2))


def _l4_moments(X: torch.Tensor, q4: torch.Tensor, q2: torch.Tensor) -> dict[str, torch.Tensor]:
    r"""Data moments of the tensor form: :math:`\overline{Q_4 x^{\otimes 4}}, \overline{Q_4 xx^\top}, \overline{Q_4}`
    and the :math:`Q_2` analogues, per replicate (``X (R, n, p)``; :math:`O(np^4)` once, for small p only)."""
    R, n, p = X.shape
    XX = (X[..., :, None] * X[..., None, :]).reshape(R, n, p * p)
    m4 = (XX.transpose(1, 2) @ (q4[..., None] * XX) / n).reshape(R, p, p, p, p)
    return {"m4": m4, "m2": torch.einsum("rn,rna,rnb->rab", q4, X, X) / n, "m0": q4.mean(-1),
            "s2": torch.einsum("rn,rna,rnb->rab", q2, X, X) / n, "s0": q2.mean(-1)}


def _l4_tensor_batched(A: torch.Tensor, mom: dict[str, torch.Tensor], c4: float, c2: float, mu: float, lam: float,
                       ridge: float) -> torch.Tensor:
    r"""The same empirical L4 as :func:`_l4_batched` from the moment tensors (tensor form):
    :math:`c\,\hat{\mathcal T}_4(a_i,a_i,a_j,a_j) = m_4(a_i,a_i,a_j,a_j) - N_i m_2(a_j,a_j) - 4G_{ij}m_2(a_i,a_j)
    - N_j m_2(a_i,a_i) + m_0(N_iN_j + 2G_{ij}^2)`; cost :math:`O(kp^4)` per step, independent of n."""
    m0 = mom["m0"][:, None, None, None]
    Y = torch.einsum("rabce,rsia,rsib->rsice", mom["m4"], A, A)
    F = torch.einsum("rsice,rsjc,rsje->rsij", Y, A, A)
    M2 = A @ mom["m2"][:, None] @ A.transpose(-1, -2)
    G = A @ A.transpose(-1, -2)
    N = torch.diagonal(G, dim1=-2, dim2=-1)
    dM = torch.diagonal(M2, dim1=-2, dim2=-1)
    C = (F - N[..., :, None] * dM[..., None, :] - 4.0 * G * M2 - N[..., None, :] * dM[..., :, None]
         + m0 * (N[..., :, None] * N[..., None, :] + 2.0 * G * G))
    diag = torch.diagonal(C, dim1=-2, dim2=-1).sum(-1)
    cross = (C.sum((-1, -2)) - diag) / c4
    quart = diag / c4
    S2 = torch.diagonal(A @ mom["s2"][:, None] @ A.transpose(-1, -2), dim1=-2, dim2=-1)
    second = (S2 - mom["s0"][:, None, None] * N) / c2
    return cross - mu * quart + lam * ((second - 1.0) ** 2).sum(-1) + 0.5 * ridge * (A * A).sum((-1, -2))


def l4_loss(A, X, y, *, activation: str = "linear", sigma: float = 0.05, mu: float = 0.1, lam: float = 10.0,
            ridge: float = 1.0) -> np.ndarray:
    r"""The empirical :math:`L_4` (makkuva2020 eq. 7) at ``A``.

    Parameters
    ----------
    A : array, shape (k, d), (R, k, d) or (R, S, k, d)
    X : array, shape (n, d) or (R, n, d)
    y : array, shape (n,) or (R, n)

    Returns
    -------
    ndarray
        The loss, shape ``A.shape[:-2]``.
    """
    T = output_transform(activation, sigma)
    At = to_tensor(A)
    Xt, yt = to_tensor(X), to_tensor(y)
    if Xt.ndim == 2:
        Xt, yt = Xt[None], yt[None]
    shape = At.shape[:-2]
    while At.ndim < 4:
        At = At[None] if At.ndim == 2 else At[:, None]
    out = _l4_batched(At, Xt, T.q4(yt), T.q2(yt), T.c4, T.c2, mu, lam, ridge)
    return to_numpy(out).reshape(shape)


def l4_population(A, A_star, alpha, *, mu: float = 0.1, lam: float = 10.0, ridge: float = 1.0):
    r"""Population :math:`L_4` in closed form (makkuva2020 Theorem 5, eq. 8).

    Parameters
    ----------
    A : array or tensor, shape (..., k, d)
    A_star : array, shape (k, d)
        Unit-norm true regressors.
    alpha : array, shape (k,)
        :math:`\alpha_m = E[p_m^*(x)]`.

    Returns
    -------
    Same type as ``A`` (torch in, torch out), shape ``A.shape[:-2]``.
    """
    torch_in = isinstance(A, torch.Tensor)
    At = A if torch_in else to_tensor(A)
    As = to_tensor(A_star, device=At.device, dtype=At.dtype)
    al = to_tensor(alpha, device=At.device, dtype=At.dtype)
    P = torch.einsum("md,...id->...mi", As, At) ** 2            # <a*_m, a_i>^2
    rowsum = P.sum(-1)
    cross = (al * (rowsum**2 - (P * P).sum(-1))).sum(-1)
    quart = (al[:, None] * P * P).sum((-1, -2))
    second = torch.einsum("m,...mi->...i", al, P)
    out = cross - mu * quart + lam * ((second - 1.0) ** 2).sum(-1) + 0.5 * ridge * (At * At).sum((-1, -2))
    return out if torch_in else to_numpy(out)


def recover_regressors(A_raw, *, method: str = "pinv"):
    r"""Regressors from an L4 minimiser: row-normalised :math:`(A^\dagger)^\top` (Theorem 1) or the rows.

    ``method="rows"`` reads the rows of ``A`` directly, which is only right for orthonormal regressors
    (the paper's experiments); the dual basis is the general answer.
    """
    check_choice("method", method, ("pinv", "rows"))
    torch_in = isinstance(A_raw, torch.Tensor)
    A = A_raw if torch_in else to_tensor(A_raw)
    B = torch.linalg.pinv(A).transpose(-1, -2) if method == "pinv" else A
    B = B / B.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return B if torch_in else to_numpy(B)


def _adam_minimise(loss_fn, A0: torch.Tensor, iters: int, lr: float, record, record_every: int,
                   optimizer: str = "adam", max_grad_norm: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimise ``loss_fn(A) -> (R, S)`` summed over the batch; independent per (R, S) entry."""
    A = A0.clone().requires_grad_(True)
    opt = torch.optim.Adam([A], lr=lr) if optimizer == "adam" else torch.optim.SGD([A], lr=lr)
    for it in range(iters + 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(A, it)
        if it % record_every == 0 or it == iters:
            record(it, loss.detach(), A.detach())
        if it == iters:
            break
        loss.sum().backward()
        if max_grad_norm is not None:
            with torch.no_grad():
                g = A.grad
                nrm = g.flatten(-2).norm(dim=-1)[..., None, None]
                A.grad = g * torch.clamp(max_grad_norm / nrm.clamp_min(1e-300), max=1.0)
        opt.step()
    return A.detach(), loss.detach()


def minimise_l4_population(A_star, alpha, *, restarts: int = 10, iters: int = 3000, lr: float = 0.01,
                           mu: float = 0.1, lam: float = 10.0, ridge: float = 0.1, seed: int = 0
                           ) -> dict[str, np.ndarray]:
    r"""Minimise the population :math:`L_4` (eq. 8) from random unit starts (landscape checks, Theorem 1).

    Returns ``{"raw": (S, k, d) minimisers, "regressors": row-normalised pinv, "loss": (S,)}``.
    """
    As = np.asarray(A_star, dtype=np.float64)
    k, d = As.shape
    rng = np.random.default_rng(seed)
    A0 = rng.standard_normal((1, restarts, k, d))
    A0 /= np.linalg.norm(A0, axis=-1, keepdims=True)
    A, loss = _adam_minimise(lambda A, it: l4_population(A, As, alpha, mu=mu, lam=lam, ridge=ridge),
                             to_tensor(A0), iters, lr, lambda *a: None, iters + 1)
    return {"raw": to_numpy(A[0]), "regressors": to_numpy(recover_regressors(A[0])), "loss": to_numpy(loss[0])}


# ----------------------------------------------------------------------------- stage helpers
def _top_eigvecs(X: torch.Tensor, q2: torch.Tensor, c2: float, k: int) -> torch.Tensor:
    r"""Top-k eigenvectors of :math:`\hat{\mathcal T}_2 = [\overline{Q_2 xx^\top} - \overline{Q_2} I]/c'`, (R, d, k)."""
    _R, n, d = X.shape
    T2 = (torch.einsum("rn,rnd,rne->rde", q2, X, X) / n
          - q2.mean(-1)[:, None, None] * torch.eye(d, dtype=X.dtype, device=X.device)) / c2
    _, vecs = torch.linalg.eigh(T2)
    return vecs[..., -k:].flip(-1)


def _signs_moment(A_hat: torch.Tensor, X: torch.Tensor, y: torch.Tensor, m11: float) -> torch.Tensor:
    r"""Signs from the first moment: :math:`E[yx] = E[g'(Z)]\sum_i \alpha_i a_i^*` under Assumptions 1–3
    (Stein's lemma), so the least-squares coefficients of :math:`\overline{yx}` on the rows of :math:`\hat A`
    carry the signs.  Returns ``(R, S, k)`` of +-1 (all +1 when :math:`E[g'(Z)] = 0`, where signs do not matter
    for even activations)."""
    if abs(m11) < 1e-10:
        return torch.ones(A_hat.shape[:-1], dtype=A_hat.dtype, device=A_hat.device)
    m = torch.einsum("rn,rnd->rd", y, X) / X.shape[1]
    coef = torch.einsum("rd,rsdk->rsk", m, torch.linalg.pinv(A_hat)) * math.copysign(1.0, m11)
    return torch.where(coef >= 0, 1.0, -1.0).to(A_hat.dtype)


def _gate_descent(W0: torch.Tensor, X: torch.Tensor, log_lik: torch.Tensor, iters: int, step: float, radius: float,
                  sample_split: bool, record, record_every: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Projected gradient descent on L_log with the experts frozen (``log_lik`` from ``expert_loglik``)."""
    W = project_ball(W0, radius)
    n = X.shape[1]
    bounds = np.linspace(0, n, iters + 1).astype(int)
    for it in range(iters + 1):
        due = it % record_every == 0 or it == iters
        if due or not sample_split:
            loss, prior, post = llog_terms(W, X, log_lik)
            if due:
                record(it, loss, W)
        if it == iters:
            return W, loss
        sl = slice(bounds[it], max(bounds[it + 1], bounds[it] + 1)) if sample_split else slice(None)
        if sample_split:
            _, prior, post = llog_terms(W, X[:, sl], log_lik[:, :, sl])
        W = project_ball(W - step * llog_grad(X[:, sl], prior, post), radius)
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------- the estimator
@validate_arguments(k=Integer(1), sigma=Real(0, open_low=True), restarts=Integer(1), project=Boolean(), mu=Real(0),
                    lam=Real(0), ridge=Optional(Real(0)), l4_iters=Integer(0), l4_lr=Real(0, open_low=True),
                    batch_size=Optional(Integer(1)), max_grad_norm=Optional(Real(0, open_low=True)),
                    gate_iters=Integer(0), gate_step=Real(0, open_low=True), gate_radius=Real(0, open_low=True),
                    sample_split=Boolean(), seed=Seed(), record_every=Integer(1), check_inputs=Boolean(),
                    device=Device(), dtype=Dtype())
def fit_tensor(X, y, k: int, *, activation: str = "linear", sigma: float = 0.05, restarts: int = 10,
               project: bool = True, mu: float = 0.1, lam: float = 10.0, ridge: float | None = None,
               l4_iters: int = 500, l4_lr: float = 0.02, optimizer: str = "adam", form: str = "auto",
               batch_size: int | None = None,
               max_grad_norm: float | None = None, recover: str = "pinv", sign: str = "moment",
               gate_iters: int = 300, gate_step: float = 2.0, gate_radius: float = 5.0, sample_split: bool = False,
               seed: int | np.random.SeedSequence | None = None, init=None, truth=None, record_every: int = 10,
               check_inputs: bool = True, device: str = "auto", dtype=None) -> GatedFit:
    r"""Two-stage tensor estimator of makkuva2020: L4 for the experts, then :math:`L_{\log}` for the gate.

    Parameters
    ----------
    X : array, shape (n, d) or (R, n, d)
        Inputs, assumed :math:`N(0, I_d)` (warns otherwise).
    y : array, shape (n,) or (R, n)
    k : int
        Number of experts.
    activation : str
        Expert activation (:data:`moestat.hermite.ACTIVATIONS`, formulas in :mod:`moestat.experts`).
    sigma : float
        Known noise sd (enters :math:`Q_4` and :math:`L_{\log}`).
    restarts : int
        Random starts S, fitted as one batched tensor program.
    project : bool
        Fit L4 in the span of the top-k eigenvectors of :math:`\hat{\mathcal T}_2` (beyond the paper).
    mu, lam, ridge : float
        :math:`\mu, \lambda, \delta` of eq. (7) (unreported in the paper).  ``ridge`` defaults to 0.01 with
        projection and 1.0 without (small ridges make the unprojected empirical loss fragile).
    l4_iters, l4_lr, optimizer : int, float, {"adam", "sgd"}
        Full-batch optimisation of the empirical L4 (the paper used mini-batch SGD; unreported step).
    form : {"auto", "samples", "tensor"}
        Evaluate the empirical L4 per sample (:math:`O(npk)` per step) or from the moment tensors of the
        working dimension p (:math:`O(np^4)` once, :math:`O(kp^4)` per step; identical values).  ``"auto"``
        uses the tensor form when :math:`p \le 6` (always with ``project=True`` and small k).
    batch_size : int, optional
        Mini-batch SGD/Adam on the sample form, one random batch (with replacement) per iteration, as in
        the paper's experiments (batch 1024, or 128 in its App. E).  The lambda-term is then a squared
        batch mean, biased by Var/batch.  Default: full batch.
    max_grad_norm : float, optional
        Clip each restart's gradient (plain GD on a quartic diverges at large steps).
    recover : {"pinv", "rows"}
        Regressors from the minimiser: row-normalised :math:`(A^\dagger)^\top` (Theorem 1) or its rows.
    sign : {"moment", "likelihood", "none"}
        Sign resolution (the paper defers it to Ge et al. 2018, Alg. 1): first-moment regression
        (:math:`E[yx] = E[g'(Z)]\sum_i\alpha_i a_i^*`), or all :math:`2^k` sign patterns through stage 2 keeping the
        highest likelihood.
    gate_iters, gate_step, gate_radius : int, float, float
        Projected GD on :math:`L_{\log}` with :math:`\Omega = \{\|w_i\| \le R\}`.
    sample_split : bool
        Fresh :math:`n/T` samples per gate step (the analysed algorithm of Theorem 4).
    seed, init
        Starts: ``init=(A0 (R,S,k,d), W0 (R,S,k-1,d))`` or :func:`moestat.fit.tensor.gated_starts` from ``seed``.
    truth : GatedNNTruth, Params or (A*, W*), optional
        When given, the history records the errors along the iterations.
    record_every : int
        History resolution (iterations).
    check_inputs : bool
        Warn when X does not look like :math:`N(0, I_d)`.
    device, dtype
        Torch device (``"auto"``: CUDA if present) and dtype (float64 on CPU).

    Returns
    -------
    GatedFit
        ``regressors (R, k, d)``, ``gate_weight (R, k, d)`` (last row 0), every restart's estimate, the
        tidy ``history`` and the ``config``; ``extras`` holds the raw L4 minimiser, the projection and the
        output transform.

    Examples
    --------
    >>> import moestat as ms
    >>> data = ms.simulate_gated_nn(n=20_000, reps=2, seed=0)
    >>> fit = ms.fit_tensor(data.X, data.y, k=2, sigma=0.05, restarts=4, seed=1)
    >>> fit.regressors.shape
    (2, 2, 10)
    """
    Xt, yt, _single, dev = prepare_data(X, y, k, device, dtype)
    R, n, d = Xt.shape
    S = check_int("restarts", restarts)
    check_choice("sign", sign, ("moment", "likelihood", "none"))
    check_choice("optimizer", optimizer, ("adam", "sgd"))
    check_choice("form", form, ("auto", "samples", "tensor"))
    if batch_size is not None:
        check_int("batch_size", batch_size)
    check_nonnegative("sigma", sigma)
    if sigma <= 0:
        raise ValueError("sigma must be > 0: it is the known noise sd in Q4 and in the likelihood L_log.")
    for name, v in (("l4_iters", l4_iters), ("gate_iters", gate_iters), ("record_every", record_every)):
        check_int(name, v, minimum=0 if name != "record_every" else 1)
    if k > d:
        raise ValueError(f"k={k} experts need k <= d={d} linearly independent regressors.")
    ridge = (0.01 if project else 1.0) if ridge is None else check_nonnegative("ridge", ridge)
    warn_theory(Xt, k, check_inputs=check_inputs)
    act = get_activation(activation)
    T: OutputTransform = output_transform(act, float(sigma))
    m11 = float(hermite_moments(act, p_max=1, j_max=1)[1, 1])
    dt = Xt.dtype
    seed = fresh_seed(seed)
    A0, W0 = resolve_starts(init, R, S, k, d, seed, dev, dt)
    truth_np = truth_arrays(truth)
    hist = History(truth_np)
    q4, q2 = T.q4(yt), T.q2(yt)

    # ---- stage 1: L4
    if project:
        V = _top_eigvecs(Xt, q2, T.c2, k)                         # (R, d, k)
        Xl4 = Xt @ V
        A_start = A0 @ V[:, None]                                  # (R, S, k, k)
    else:
        V, Xl4, A_start = None, Xt, A0

    def to_full(B: torch.Tensor) -> torch.Tensor:
        return B @ V[:, None].transpose(-1, -2) if project else B

    def rec1(it: int, loss: torch.Tensor, B: torch.Tensor) -> None:
        if batch_size is not None:   # record the full-data loss, not the mini-batch one
            loss = _l4_batched(B, Xl4, q4, q2, T.c4, T.c2, mu, lam, ridge)
        hist.add("l4", it, {"loss": loss})
        if truth_np is not None:
            hist.add_errors("l4", it, A=recover_regressors(to_full(B), method=recover), signed=False)

    p = Xl4.shape[-1]
    use_tensor = batch_size is None and (form == "tensor" or (form == "auto" and p <= 6))
    if batch_size is not None:
        gen = torch.Generator(device="cpu").manual_seed(int(np.random.SeedSequence(
            seed if not isinstance(seed, np.random.SeedSequence) else seed.entropy).generate_state(1)[0]))

        def l4_fn(B: torch.Tensor, it: int) -> torch.Tensor:
            idx = torch.randint(0, n, (batch_size,), generator=gen).to(dev)
            return _l4_batched(B, Xl4[:, idx], q4[:, idx], q2[:, idx], T.c4, T.c2, mu, lam, ridge)
    elif use_tensor:
        mom = _l4_moments(Xl4, q4, q2)

        def l4_fn(B: torch.Tensor, it: int) -> torch.Tensor:
            return _l4_tensor_batched(B, mom, T.c4, T.c2, mu, lam, ridge)
    else:
        def l4_fn(B: torch.Tensor, it: int) -> torch.Tensor:
            return _l4_batched(B, Xl4, q4, q2, T.c4, T.c2, mu, lam, ridge)

    B, l4_final = _adam_minimise(l4_fn, A_start, l4_iters, l4_lr, rec1, record_every, optimizer, max_grad_norm)
    A_raw = to_full(B)
    A_hat = recover_regressors(A_raw, method=recover)

    # ---- signs
    if sign == "moment":
        A_hat = A_hat * _signs_moment(A_hat, Xt, yt, m11)[..., None]
    P = 1
    if sign == "likelihood":
        pats = torch.tensor(list(itertools.product((1.0, -1.0), repeat=k)), dtype=dt, device=dev)   # (P, k)
        P = pats.shape[0]
        A_hat = (A_hat[:, :, None] * pats[None, None, :, :, None]).reshape(R, S * P, k, d)
        W0 = W0.repeat_interleave(P, dim=1)

    # ---- stage 2: L_log with the experts frozen
    E = act.activation(project_rows(Xt, A_hat))

    def rec2(it: int, loss: torch.Tensor, W: torch.Tensor) -> None:
        if P > 1:
            return
        hist.add("gate", l4_iters + it, {"loss": loss})
        if truth_np is not None:
            hist.add_errors("gate", l4_iters + it, A=A_hat, W=full_gate(W))

    W, llog_final = _gate_descent(W0, Xt, expert_loglik(yt, E, float(sigma)), gate_iters, gate_step, gate_radius,
                                  sample_split, rec2, record_every)
    if P > 1:   # keep, per restart, the sign pattern of highest likelihood
        llog_final = llog_final.reshape(R, S, P)
        pick = llog_final.argmin(-1)
        idx = pick[..., None, None, None].expand(R, S, 1, k, d)
        A_hat = A_hat.reshape(R, S, P, k, d).gather(2, idx)[:, :, 0]
        W = W.reshape(R, S, P, k - 1, d).gather(2, pick[..., None, None, None].expand(R, S, 1, k - 1, d))[:, :, 0]
        llog_final = llog_final.gather(-1, pick[..., None])[..., 0]
        hist.add("gate", l4_iters + gate_iters, {"loss": llog_final})
        if truth_np is not None:
            hist.add_errors("gate", l4_iters + gate_iters, A=A_hat, W=full_gate(W))
    W_full = full_gate(W)
    best, A_best, W_best = select_best(llog_final, A_hat, W_full)
    config: dict[str, Any] = {
        "method": "tensor", "activation": act.name, "sigma": float(sigma), "k": k, "d": d, "n": n, "reps": R,
        "restarts": S, "project": project, "mu": mu, "lam": lam, "ridge": ridge, "l4_iters": l4_iters,
        "l4_lr": l4_lr, "optimizer": optimizer, "form": "tensor" if use_tensor else "samples", "batch_size": batch_size,
        "max_grad_norm": max_grad_norm, "recover": recover, "sign": sign,
        "gate_iters": gate_iters, "gate_step": gate_step, "gate_radius": gate_radius, "sample_split": sample_split,
        "seed": seed if not isinstance(seed, np.random.SeedSequence) else repr(seed),
        "device": str(dev), "dtype": str(dt).replace("torch.", ""),
    }
    extras = {"raw_regressors": to_numpy(A_raw), "l4_objective": to_numpy(l4_final),
              "projection": None if V is None else to_numpy(V), "transform": T}
    return GatedFit("tensor", A_best, W_best, to_numpy(A_hat), to_numpy(W_full), to_numpy(llog_final), best,
                    hist.frame(), config, extras)


def fit_gate(X, y, regressors, *, activation: str = "linear", sigma: float = 0.05, restarts: int = 1,
             gate_iters: int = 100, gate_step: float = 2.0, gate_radius: float = 5.0, sample_split: bool = False,
             seed: int | np.random.SeedSequence | None = None, truth=None, record_every: int = 10,
             device: str = "auto", dtype=None) -> GatedFit:
    r"""Stage 2 alone: projected GD on :math:`L_{\log}(W, A)` with the regressors fixed at ``regressors``.

    This is makkuva2020 Fig. 2(b): the gate learnt with A fixed at :math:`A^*`, at the L4 estimate or at the
    :math:`\ell_2` estimate.  ``regressors`` has shape (k, d), (R, k, d) or (R, S, k, d) and must be signed and
    scaled (the likelihood depends on both).  Other arguments as :func:`fit_tensor`.
    """
    Xt, yt, _, dev = prepare_data(X, y, 2, device, dtype)
    R, n, d = Xt.shape
    A = to_tensor(regressors, device=dev, dtype=Xt.dtype)
    if A.ndim == 2:
        A = A[None]
    if A.ndim == 3:
        A = A[:, None] if A.shape[0] == R else A[None].expand(R, *A.shape)
        A = A.expand(R, check_int("restarts", restarts), *A.shape[-2:])
    if A.ndim != 4 or A.shape[0] != R or A.shape[-1] != d:
        raise ValueError(f"regressors must have shape (k, {d}), ({R}, k, {d}) or ({R}, S, k, {d}); got "
                         f"{tuple(to_tensor(regressors).shape)}.")
    S, k = A.shape[1], A.shape[2]
    if not sigma > 0:
        raise ValueError("sigma must be > 0: it is the known noise sd of the likelihood L_log.")
    act = get_activation(activation)
    seed = fresh_seed(seed)
    _, W0 = resolve_starts(None, R, S, k, d, seed, dev, Xt.dtype)
    hist = History(truth_arrays(truth))

    def rec(it: int, loss: torch.Tensor, W: torch.Tensor) -> None:
        hist.add("gate", it, {"loss": loss})
        hist.add_errors("gate", it, A=A, W=full_gate(W))

    ll = expert_loglik(yt, act.activation(project_rows(Xt, A)), float(sigma))
    W, final = _gate_descent(W0, Xt, ll, gate_iters, gate_step, gate_radius, sample_split, rec, record_every)
    W_full = full_gate(W)
    best, A_best, W_best = select_best(final, A, W_full)
    config = {"method": "gate", "activation": act.name, "sigma": float(sigma), "k": k, "d": d, "n": n, "reps": R,
              "restarts": S, "gate_iters": gate_iters, "gate_step": gate_step, "gate_radius": gate_radius,
              "sample_split": sample_split,
              "seed": seed if not isinstance(seed, np.random.SeedSequence) else repr(seed),
              "device": str(dev), "dtype": str(Xt.dtype).replace("torch.", "")}
    return GatedFit("gate", A_best, W_best, to_numpy(A), to_numpy(W_full), to_numpy(final), best, hist.frame(), config)
