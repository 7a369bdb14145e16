r"""Batched L-BFGS: many independent smooth minimisations in one tensor program.

Each problem ``b`` has its own iterate, its own curvature pairs and its own backtracking (Armijo)
line search; problems that have converged are frozen.  This is Nocedal & Wright (2006) Algorithm 7.4
(two-loop recursion, :math:`H_0 = \gamma I` with :math:`\gamma = s^\top y / y^\top y`) with Algorithm
3.1 (backtracking) applied row-wise; a pair is stored only when :math:`s^\top y > 10^{-10}\lVert
s\rVert\lVert y\rVert` (the safeguard for non-convex objectives).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _value_grad(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.enable_grad():
        xv = x.detach().requires_grad_(True)
        fx = f(xv)
        (g,) = torch.autograd.grad(fx.sum(), xv)
    return fx.detach(), g.detach()


def lbfgs_batched(f: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, *, max_iter: int = 500,
                  gtol: float = 1e-7, ftol: float = 1e-10, history: int = 20, max_backtrack: int = 40,
                  c1: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Minimise ``f`` row-wise.

    Parameters
    ----------
    f : callable
        Maps x of shape (B..., P) to values (B...); problems must be independent (separable).
    x0 : Tensor (B..., P)
    gtol : float
        A problem has converged when ``max |grad| <= gtol`` ...
    ftol : float
        ... or when an accepted step lowers f by at most ``ftol * max(|f_old|, |f_new|, 1)`` (the
        relative-reduction test of scipy's L-BFGS-B, needed for objectives with kinks such as ReLU
        experts or top-K gates, where the gradient need not vanish at the optimum).

    Returns
    -------
    x, f(x), converged (bool), n_iter (per problem)
    """
    lead, P = x0.shape[:-1], x0.shape[-1]
    x = x0.detach().reshape(-1, P).clone()
    B = x.shape[0]

    def fb(z: torch.Tensor) -> torch.Tensor:
        return f(z.reshape(*lead, P)).reshape(-1)

    fx, g = _value_grad(fb, x)
    m = history
    S = torch.zeros(m, B, P, dtype=x.dtype, device=x.device)
    Y = torch.zeros_like(S)
    rho = torch.zeros(m, B, dtype=x.dtype, device=x.device)
    gamma = torch.ones(B, dtype=x.dtype, device=x.device)
    n_stored = 0
    conv = g.abs().amax(-1) <= gtol
    active = ~conv & torch.isfinite(fx)
    n_iter = torch.zeros(B, dtype=torch.long, device=x.device)
    for it in range(max_iter):
        if not bool(active.any()):
            break
        # two-loop recursion over stored pairs, newest first
        q = g.clone()
        alphas = []
        order = [(n_stored - 1 - j) % m for j in range(min(n_stored, m))]
        for i in order:
            a = rho[i] * (S[i] * q).sum(-1)
            q = q - a[:, None] * Y[i]
            alphas.append(a)
        r = gamma[:, None] * q
        for i, a in zip(reversed(order), reversed(alphas), strict=True):
            b = rho[i] * (Y[i] * r).sum(-1)
            r = r + (a - b)[:, None] * S[i]
        d = -r
        gd = (g * d).sum(-1)
        bad_dir = ~(gd < 0) | ~torch.isfinite(gd)
        d = torch.where(bad_dir[:, None], -g, d)
        gd = torch.where(bad_dir, -(g * g).sum(-1), gd)
        t = torch.ones(B, dtype=x.dtype, device=x.device)
        if it == 0 or n_stored == 0:
            t = torch.clamp(1.0 / g.abs().sum(-1).clamp_min(1e-300), max=1.0)
        done = ~active
        for _ in range(max_backtrack):
            with torch.no_grad():
                fn = fb(x + t[:, None] * d)
            ok = torch.isfinite(fn) & (fn <= fx + c1 * t * gd)
            done = done | ok
            if bool(done.all()):
                break
            t = torch.where(done, t, 0.5 * t)
        moved = active & done
        stuck = active & ~done
        xn = torch.where(moved[:, None], x + t[:, None] * d, x)
        fn, gn = _value_grad(fb, xn)
        s, yv = xn - x, gn - g
        sy = (s * yv).sum(-1)
        keep = moved & (sy > 1e-10 * s.norm(dim=-1) * yv.norm(dim=-1)) & (sy > 0)
        slot = n_stored % m
        S[slot] = torch.where(keep[:, None], s, torch.zeros_like(s))
        Y[slot] = torch.where(keep[:, None], yv, torch.zeros_like(yv))
        rho[slot] = torch.where(keep, 1.0 / torch.where(keep, sy, torch.ones_like(sy)), torch.zeros_like(sy))
        gamma = torch.where(keep, sy / (yv * yv).sum(-1).clamp_min(1e-300), gamma)
        n_stored += 1
        x = xn
        fx_old = fx
        fx = torch.where(moved, fn, fx)
        g = torch.where(moved[:, None], gn, g)
        n_iter = n_iter + moved.long()
        small_step = (fx_old - fx) <= ftol * torch.maximum(torch.maximum(fx_old.abs(), fx.abs()),
                                                            torch.ones_like(fx))
        conv = conv | (moved & ((g.abs().amax(-1) <= gtol) | small_step))
        active = active & ~conv & ~stuck
    conv = conv | (g.abs().amax(-1) <= gtol)
    return x.reshape(*lead, P), fx.reshape(lead), conv.reshape(lead), n_iter.reshape(lead)
