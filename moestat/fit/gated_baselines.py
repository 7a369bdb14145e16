r"""Baselines for the gated network of makkuva2020: EM and plain least squares on the full model.

Both learn the experts and the gate jointly (as in the revised version's Fig. 1), from the same starts
as :func:`moestat.fit_tensor` (:func:`moestat.fit.tensor.gated_starts`), batched over replicates and
restarts.  Neither is specified in the papers; the choices here are documented in ``config``.

* **Least squares** (makkuva2020 §3.1):
  :math:`\ell_2(A, W) = \frac1n\sum_s \big(y_s - \sum_i \mathrm{softmax}_i(Wx_s)\,g(a_i^\top x_s)\big)^2`,
  minimised by full-batch Adam (or SGD).
* **EM** for the Gaussian mixture of experts with known :math:`\sigma` (optionally learnt): E-step
  :math:`h_{si} = P[z_s = i \mid x_s, y_s]` in log space; M-step for linear experts the weighted least
  squares :math:`a_i = (\sum_s h_{si}x_sx_s^\top)^{-1}\sum_s h_{si}x_s y_s` (other activations: gradient steps
  on the weighted squared error); for the gate ``gate_steps`` gradient steps on
  :math:`\sum_s\sum_i h_{si}\log \mathrm{softmax}_i(Wx_s)` (one step is gradient EM, makkuva2020 D.3).
"""

from __future__ import annotations

import numpy as np
import torch

from .._random import fresh_seed
from .._torch import to_numpy
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
from ..hermite import get_activation
from ..model import MoE
from .gated import (
    GatedFit,
    History,
    exp_safe,
    expert_loglik,
    full_gate,
    gate_log_prior,
    gate_logits_kn,
    llog_grad,
    llog_terms,
    prepare_data,
    project_rows,
    resolve_starts,
    select_best,
    truth_arrays,
)

__all__ = ["fit_em_gated", "fit_l2_gated"]


def _mean_fn(A: torch.Tensor, W: torch.Tensor, X: torch.Tensor, spec: MoE) -> torch.Tensor:
    r""":math:`\hat y = \sum_i \mathrm{softmax}_i(Wx)\,g(a_i^\top x)`, shape (R, S, n): the network is the
    softmax MoE ``spec`` with zero intercepts."""
    return spec.mean_from_linear(gate_logits_kn(W, X), project_rows(X, A), dim=-2)


def _config(method: str, act, sigma, k, X, S, seed, dev, **kw) -> dict:
    R, n, d = X.shape
    return {"method": method, "activation": act.name, "sigma": None if sigma is None else float(sigma), "k": k,
            "d": d, "n": n, "reps": R, "restarts": S,
            "seed": seed if not isinstance(seed, np.random.SeedSequence) else repr(seed),
            "device": str(dev), "dtype": str(X.dtype).replace("torch.", ""), **kw}


@validate_arguments(k=Integer(1), sigma=Optional(Real(0, open_low=True)), restarts=Integer(1), iters=Integer(0),
                    lr=Real(0, open_low=True), seed=Seed(), record_every=Integer(1), device=Device(), dtype=Dtype())
def fit_l2_gated(X, y, k: int, *, activation: str = "linear", sigma: float | None = None, restarts: int = 10,
                 iters: int = 600, lr: float = 0.02, optimizer: str = "adam", seed=None, init=None, truth=None,
                 record_every: int = 10, device: str = "auto", dtype=None) -> GatedFit:
    r"""Plain least squares on the full gated model (the :math:`\ell_2` baseline of makkuva2020).

    Parameters
    ----------
    X, y, k, activation
        As :func:`moestat.fit_tensor`.
    sigma : float, optional
        Only recorded (and stored as the noise sd of ``.params``); least squares does not use it.
    restarts, iters, lr, optimizer
        Batched random starts; full-batch Adam/SGD iterations and step.
    seed, init, truth, record_every, device, dtype
        As :func:`moestat.fit_tensor`.

    Returns
    -------
    GatedFit
        ``method="l2"``; ``restart_objective`` (``objective`` for the selected restart) is the final mean squared error.
    """
    Xt, yt, _, dev = prepare_data(X, y, k, device, dtype)
    R, _n, d = Xt.shape
    S = check_int("restarts", restarts)
    check_int("iters", iters, minimum=0)
    check_choice("optimizer", optimizer, ("adam", "sgd"))
    act = get_activation(activation)
    spec = MoE(gate="softmax", expert=act.name, k=k, d=d)
    seed = fresh_seed(seed)
    A0, W0 = resolve_starts(init, R, S, k, d, seed, dev, Xt.dtype)
    hist = History(truth_arrays(truth))
    A = A0.clone().requires_grad_(True)
    W = W0.clone().requires_grad_(True)
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)([A, W], lr=lr)
    for it in range(iters + 1):
        opt.zero_grad(set_to_none=True)
        loss = ((yt[:, None] - _mean_fn(A, W, Xt, spec)) ** 2).mean(-1)
        if it % record_every == 0 or it == iters:
            hist.add("joint", it, {"loss": loss.detach()})
            hist.add_errors("joint", it, A=A.detach(), W=full_gate(W.detach()))
        if it == iters:
            break
        loss.sum().backward()
        opt.step()
    A, W_full, loss = A.detach(), full_gate(W.detach()), loss.detach()
    best, A_best, W_best = select_best(loss, A, W_full)
    cfg = _config("l2", act, sigma, k, Xt, S, seed, dev, iters=iters, lr=lr, optimizer=optimizer)
    return GatedFit("l2", A_best, W_best, to_numpy(A), to_numpy(W_full), to_numpy(loss), best, hist.frame(), cfg)


def _wls(X: torch.Tensor, y: torch.Tensor, H: torch.Tensor, ridge: float) -> torch.Tensor:
    """Weighted least squares per expert: (R, S, k, d) from weights H (R, S, k, n)."""
    _R, n, d = X.shape
    eye = torch.eye(d, dtype=X.dtype, device=X.device)
    out = []
    for i in range(H.shape[-2]):       # k is small; each solve is batched over (R, S)
        Xh = X[:, None] * H[:, :, i, :, None]                             # (R, S, n, d)
        gram = Xh.transpose(-1, -2) @ X[:, None] / n + ridge * eye
        rhs = (Xh.transpose(-1, -2) @ y[:, None, :, None]) / n
        out.append(torch.linalg.solve(gram, rhs)[..., 0])
    return torch.stack(out, dim=-2)


@validate_arguments(k=Integer(1), sigma=Real(0, open_low=True), restarts=Integer(1), iters=Integer(0),
                    gate_steps=Integer(0), gate_step=Real(0, open_low=True), expert_steps=Integer(0),
                    expert_step=Real(0, open_low=True), learn_sigma=Boolean(), ridge=Real(0), seed=Seed(),
                    record_every=Integer(1), device=Device(), dtype=Dtype())
def fit_em_gated(X, y, k: int, *, activation: str = "linear", sigma: float = 0.05, restarts: int = 10,
                 iters: int = 100, gate_steps: int = 5, gate_step: float = 2.0, expert_steps: int = 5,
                 expert_step: float = 0.5, learn_sigma: bool = False, ridge: float = 1e-8, seed=None, init=None,
                 truth=None, record_every: int = 1, device: str = "auto", dtype=None) -> GatedFit:
    r"""EM for the gated network (the EM baseline of the revised makkuva2020), experts and gate jointly.

    Parameters
    ----------
    X, y, k, activation
        As :func:`moestat.fit_tensor`.
    sigma : float
        Noise sd; known (the paper's assumption) unless ``learn_sigma=True`` (then the starting value).
    restarts, iters
        Batched random starts and EM iterations.
    gate_steps, gate_step
        Gradient steps (and their size) on the expected complete-data gate log-likelihood per M-step.
    expert_steps, expert_step
        Gradient steps on the weighted squared error for non-linear experts (linear: exact weighted LS).
    learn_sigma : bool
        Update :math:`\sigma^2 = \frac1n\sum_{s,i} h_{si}(y_s - g(a_i^\top x_s))^2` (beyond the paper).
    ridge : float
        Tikhonov term of the weighted least squares (numerical safety).
    seed, init, truth, record_every, device, dtype
        As :func:`moestat.fit_tensor`.

    Returns
    -------
    GatedFit
        ``method="em"``; ``restart_objective`` (``objective`` for the selected restart) is the final negative
        log-likelihood :math:`L_{\log}`.
    """
    Xt, yt, _, dev = prepare_data(X, y, k, device, dtype)
    R, n, d = Xt.shape
    S = check_int("restarts", restarts)
    check_int("iters", iters, minimum=0)
    check_nonnegative("sigma", sigma)
    if sigma <= 0:
        raise ValueError("sigma must be > 0 (the noise sd, or its starting value with learn_sigma=True).")
    act = get_activation(activation)
    linear = act.name == "linear"
    seed = fresh_seed(seed)
    A, W = resolve_starts(init, R, S, k, d, seed, dev, Xt.dtype)
    sig = torch.full((R, S, 1, 1), float(sigma), dtype=Xt.dtype, device=dev)
    hist = History(truth_arrays(truth))
    for it in range(iters + 1):
        loss, _, post = llog_terms(W, Xt, expert_loglik(yt, act.activation(project_rows(Xt, A)), sig))
        if it % record_every == 0 or it == iters:
            hist.add("joint", it, {"loss": loss})
            hist.add_errors("joint", it, A=A, W=full_gate(W))
        if it == iters:
            break
        if linear:
            A = _wls(Xt, yt, post, ridge)
        else:
            for _ in range(expert_steps):
                Ag = A.clone().requires_grad_(True)
                res = yt[:, None, None, :] - act.activation(project_rows(Xt, Ag))
                obj = (post * res**2).sum((-1, -2)) / n
                (grad,) = torch.autograd.grad(obj.sum(), Ag)
                A = (Ag - expert_step * grad).detach()
        for _ in range(gate_steps):
            W = W - gate_step * llog_grad(Xt, exp_safe(gate_log_prior(W, Xt)), post)
        if learn_sigma:
            E = act.activation(project_rows(Xt, A))
            var = (post * (yt[:, None, None, :] - E) ** 2).sum((-1, -2)) / n
            sig = var.clamp_min(1e-12).sqrt()[..., None, None]
    W_full = full_gate(W)
    best, A_best, W_best = select_best(loss, A, W_full)
    cfg = _config("em", act, sigma, k, Xt, S, seed, dev, iters=iters, gate_steps=gate_steps, gate_step=gate_step,
                  expert_steps=expert_steps, expert_step=expert_step, learn_sigma=learn_sigma, ridge=ridge)
    extras = {"sigma": to_numpy(sig[..., 0, 0])}
    return GatedFit("em", A_best, W_best, to_numpy(A), to_numpy(W_full), to_numpy(loss), best, hist.frame(), cfg,
                    extras)
