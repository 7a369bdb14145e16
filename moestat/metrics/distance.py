r"""Distances between regression functions and between experts.

* :func:`l2_distance`: the Monte-Carlo :math:`L^2(\mu)` distance
  :math:`\|f_{G_a} - f_{G_b}\|_{L^2(\mu)} \approx \big(\frac1m\sum_{t=1}^m (f_{G_a}(x_t) - f_{G_b}(x_t))^2\big)^{1/2}`
  on a fixed sample :math:`x_1,\dots,x_m \sim \mu` (nguyen2024 Theorem 1 and Corollary 1).  Use one
  large sample for every method compared (common random numbers).
* :func:`sup_expert_error`: :math:`\max_t |h(x_t, \eta_i) - h(x_t, \eta^*_{j(i)})|` for each fitted
  expert against the true expert of its Voronoi cell, the left-hand side of nguyen2024 eq. 7/10,
  approximated on a finite sample or grid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._torch import is_torch, to_numpy
from .._validation import Integer, validate_arguments
from ..model import MoE
from ..params import Params
from ._common import blocks, broadcast_reps, check_compatible, reference_device, unpack
from .voronoi import _assign


def _inputs(X: Any, d: int, name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    Xt = X.detach().to(device=device, dtype=dtype) if is_torch(X) else torch.as_tensor(
        np.asarray(X, dtype=np.float64), device=device, dtype=dtype)
    if Xt.ndim not in (2, 3) or Xt.shape[-1] != d:
        raise ValueError(f"{name} must have shape (m, {d}) or (R, m, {d}), got {tuple(Xt.shape)}.")
    if Xt.shape[-2] < 1:
        raise ValueError(f"{name} needs at least one row.")
    if not bool(torch.isfinite(Xt).all()):
        raise ValueError(f"{name} contains NaN or infinite values.")
    return Xt


def _spec(spec: Any, name: str) -> MoE:
    if not isinstance(spec, MoE):
        raise TypeError(f"{name} must be a moestat.MoE specification, got {type(spec).__name__}.")
    return spec


def _mean(spec: MoE, p: Params, X: torch.Tensor, dev: torch.device, dt: torch.dtype,
          chunk: int) -> torch.Tensor:
    """f_G on X (R or 1, m, d) in chunks of rows; returns (R', m)."""
    pt = p.batched().to_torch(dev, dt)
    X3 = X if X.ndim == 3 else X.unsqueeze(0)
    outs = [spec.mean_torch(pt, X3[:, s:s + chunk]) for s in range(0, X3.shape[1], chunk)]
    return torch.cat(outs, dim=-1)


@validate_arguments(chunk=Integer(1))
def l2_distance(spec: MoE, params_a: Params, params_b: Params, X_mc: Any, *,
                spec_b: MoE | None = None, chunk: int = 65536) -> np.ndarray | float:
    r"""Monte-Carlo :math:`L^2(\mu)` distance between two MoE regression functions, per replicate.

    .. math:: \hat d(G_a, G_b) = \Big(\frac1m \sum_{t=1}^m \big(f_{G_a}(x_t) - f_{G_b}(x_t)\big)^2\Big)^{1/2}

    Parameters
    ----------
    spec : MoE
        Specification of ``params_a`` (gate and expert family; ``k`` is taken from the Params).
    params_a, params_b : Params
        Unbatched or batched (R, ...); an unbatched one broadcasts against a batched one.
    X_mc : array, shape (m, d) or (R, m, d)
        The Monte-Carlo sample from :math:`\mu`; one shared sample gives common random numbers.
    spec_b : MoE, optional
        Specification of ``params_b`` when it differs (e.g. a softmax fit against a sigmoid truth);
        defaults to ``spec``.  The input dimension must agree.
    chunk : int
        Rows of ``X_mc`` evaluated at once (memory bound).

    Returns
    -------
    ndarray, shape (R,), or float
    """
    spec_a = _spec(spec, "spec")
    spec_b = spec_a if spec_b is None else _spec(spec_b, "spec_b")
    _, pa = unpack(params_a, "params_a")
    _, pb = unpack(params_b, "params_b")
    if spec_a.d != spec_b.d:
        raise ValueError(f"spec has d={spec_a.d} but spec_b has d={spec_b.d}; both functions must act on "
                         "the same input space.")
    for name, sp, p in (("params_a", spec_a, pa), ("params_b", spec_b, pb)):
        if p.d != sp.d:
            raise ValueError(f"{name} has d={p.d} but its spec has d={sp.d}.")
    dev, dt = reference_device(pa, pb)
    X = _inputs(X_mc, spec_a.d, "X_mc", dev, dt)
    ra = pa.n_reps or 1
    rb = pb.n_reps or 1
    R = broadcast_reps(ra, rb, ("params_a", "params_b"))
    if X.ndim == 3:
        R = broadcast_reps(R, X.shape[0], ("params", "X_mc"))
    diff = _mean(spec_a.with_k(pa.k), pa, X, dev, dt, chunk) - _mean(spec_b.with_k(pb.k), pb, X, dev, dt, chunk)
    out = to_numpy(torch.sqrt((diff * diff).mean(-1)))
    batched = pa.is_batched or pb.is_batched or X.ndim == 3
    return out if batched else float(out[0])


@validate_arguments()  # spec, params, truth and X are data, checked where they are read
def sup_expert_error(spec: MoE, params: Any, truth: Any, X: Any) -> np.ndarray:
    r"""Sup-norm error of each fitted expert against the true expert of its Voronoi cell.

    .. math:: e_i = \max_{t} |h(x_t, \eta_i) - h(x_t, \eta^*_{j(i)})|, \qquad i \in A_{j(i)},

    the quantity bounded in nguyen2024 eq. 7 (generic experts) and eq. 10 (ridge experts), on the
    finite sample or grid ``X``.

    Parameters
    ----------
    spec : MoE
        Specification (expert family).
    params : Params or (MoE, Params)
        Fitted parameters, unbatched or batched (R, k, ...).
    truth : Params or (MoE, Params)
        True parameters (k* atoms).
    X : array, shape (m, d)
        Points where the experts are compared.

    Returns
    -------
    ndarray, shape (R, k)
        One value per replicate and fitted atom (R = 1 when both inputs are unbatched).
    """
    spec = _spec(spec, "spec")
    spec_p, p = unpack(params, "params")
    spec_t, t = unpack(truth, "truth")
    check_compatible(spec_p or spec, p, spec_t or spec, t)
    dev, dt = reference_device(p, t)
    bp, bt = blocks(p, dev, dt), blocks(t, dev, dt)
    R = broadcast_reps(bp.b0.shape[0], bt.b0.shape[0], ("params", "truth"))
    Xt = _inputs(X, p.d, "X", dev, dt)
    if Xt.ndim != 2:
        raise ValueError("X must have shape (m, d) for sup_expert_error.")
    idx, _ = _assign(bp, bt)                               # (R, k)
    fam = spec.family
    h_fit = fam.evaluate(Xt, bp.a, bp.b)                               # (R', m, k)
    h_true = fam.evaluate(Xt, bt.a, bt.b)                              # (R'', m, k*)
    h_true = h_true.expand(R, *h_true.shape[1:])
    matched = h_true.gather(-1, idx.unsqueeze(-2).expand(R, Xt.shape[0], idx.shape[-1]))
    return to_numpy((h_fit - matched).abs().amax(dim=-2))
