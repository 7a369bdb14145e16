r"""Expected (Fisher) information of a contaminated MoE, by quadrature: the local asymptotics behind the rates.

For one observation,

.. math::

    I(\vartheta) = \mathbb E_x\, \int p(y \mid x)\, s(x, y)\, s(x, y)^\top\, dy, \qquad
    s = \nabla_\vartheta \log p(y \mid x),

in the natural parameters :math:`\vartheta = (\lambda \text{ or } \beta, \tau;\ a, b, \nu)` (the order of
:meth:`moestat.contaminated.ContaminatedFit.names`).  The :math:`y` integral is a trapezoid rule on a fine grid, the
:math:`x` expectation Gauss-Legendre (uniform inputs, :math:`d = 1`), Gauss-Hermite (normal inputs, :math:`d = 1`)
or the average over given inputs.  :math:`\sqrt{[I^{-1}]_{jj}/n}` is the asymptotic standard deviation of the
maximum-likelihood estimate of coordinate :math:`j`: how it scales with :math:`\lambda^*` and with the distance
:math:`\lVert\theta^* - \theta_0\rVert` of the prompt from the frozen expert is what the losses of
:mod:`moestat.contaminated.losses` encode.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..experts import get_expert
from .model import ContaminatedMoE, ContaminatedParams

__all__ = ["asymptotic_sd", "fisher_information"]


def _x_nodes(model: ContaminatedMoE, X: Any, inputs: str, low: float, high: float, n_x: int
             ) -> tuple[np.ndarray, np.ndarray]:
    if X is not None:
        Xa = np.asarray(X, dtype=float)
        if Xa.ndim != 2 or Xa.shape[1] != model.d or not np.isfinite(Xa).all():
            raise ValueError(f"X must be finite inputs of shape (m, {model.d}), got shape {Xa.shape}.")
        return Xa, np.full(len(Xa), 1.0 / len(Xa))
    if model.d != 1:
        raise ValueError(f"the quadrature over x is built in for d = 1 only; give X (an (m, {model.d}) sample of "
                         "inputs) for d > 1.")
    if inputs == "uniform":
        t, w = np.polynomial.legendre.leggauss(n_x)
        return (low + (high - low) * (t + 1) / 2)[:, None], w / 2
    if inputs == "normal":
        t, w = np.polynomial.hermite_e.hermegauss(n_x)
        return t[:, None], w / w.sum()
    raise ValueError(f"inputs={inputs!r} is not supported; valid values are ['normal', 'uniform'].")


def _y_grid(model: ContaminatedMoE, params: ContaminatedParams, X: np.ndarray, n_y: int,
            y_range: Any) -> np.ndarray:
    if y_range is not None:
        lo, hi = (float(v) for v in y_range)
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise ValueError(f"y_range must be (low, high) with low < high, got {y_range!r}.")
        return np.linspace(lo, hi, n_y)
    mean = model.prompt_mean(params, X)[0]
    sd = math.sqrt(float(params.var[0]))
    lo, hi = mean.min() - 12 * sd, mean.max() + 12 * sd
    g = model.frozen.gaussian
    if g is not None:
        m0 = get_expert(g["expert"]).numpy(X @ np.asarray(g["weight"], float) + g["bias"])
        sd0 = math.sqrt(g["var"])
        lo, hi = min(lo, m0.min() - 12 * sd0), max(hi, m0.max() + 12 * sd0)
    elif model.frozen.sample is not None:
        rng = np.random.default_rng(0)
        draws = np.asarray(model.frozen.sample(np.repeat(X, 200, axis=0), rng), float)
        span = draws.max() - draws.min()
        lo, hi = min(lo, draws.min() - 0.5 * span), max(hi, draws.max() + 0.5 * span)
    else:
        raise ValueError(f"the frozen model {model.frozen.label!r} has no sampler to bound y; give y_range.")
    return np.linspace(lo, hi, n_y)


def fisher_information(model: ContaminatedMoE, params: ContaminatedParams, *, X: Any = None,
                       inputs: str = "uniform", low: float = -1.0, high: float = 1.0, n_x: int = 48,
                       n_y: int = 4001, y_range: Any = None) -> np.ndarray:
    r"""The expected information of one observation (module docstring), shape (p, p).

    Parameters
    ----------
    model : ContaminatedMoE
    params : ContaminatedParams
        One parameter set (unbatched, or R = 1).
    X : array (m, d), optional
        Inputs to average over (default: quadrature for ``inputs`` on ``[low, high]``, d = 1).
    inputs, low, high, n_x
        The input law (``"uniform"`` on ``[low, high]`` or ``"normal"``) and the number of quadrature nodes.
    n_y : int
        Points of the trapezoid rule in y.
    y_range : (float, float), optional
        The y interval (default: 12 standard deviations beyond every Gaussian component's mean, or a wide range of
        draws from the frozen model).

    Raises
    ------
    ValueError
        When the density does not integrate to 1 within 1e-4 on the grid (widen ``y_range`` or raise ``n_y``).
    """
    model.check_params(params)
    if params.n_reps != 1:
        raise ValueError(f"params must be one parameter set, got R={params.n_reps}; select one replicate.")
    Xn, wx = _x_nodes(model, X, inputs, low, high, n_x)
    ys = _y_grid(model, params, Xn, n_y, y_range)
    wy = np.full(len(ys), ys[1] - ys[0])
    wy[[0, -1]] /= 2
    Xf = np.repeat(Xn, len(ys), axis=0)
    yf = np.tile(ys, len(Xn))
    lf0 = np.asarray(model.frozen.log_density(Xf, yf), float)
    theta = np.concatenate([params.gate_vector(), params.theta()], axis=1)[0]
    from ..fit._derivatives import pointwise_gradients
    from .fit import natural_ll_terms

    args = [torch.as_tensor(a, dtype=torch.float64) for a in (Xf, yf, lf0)]
    t = torch.as_tensor(theta, dtype=torch.float64)
    values, grads = pointwise_gradients(natural_ll_terms(model), t, *args)  # each node's log density and score
    logp, scores = values.numpy(), grads.numpy()
    weight = (np.exp(logp) * np.tile(wy, len(Xn)) * np.repeat(wx, len(ys)))
    mass = weight.sum()
    if abs(mass - 1.0) > 1e-4:
        raise ValueError(f"the density integrates to {mass:.6f} on the y grid, not 1; widen y_range or raise n_y.")
    info: np.ndarray = (scores * weight[:, None]).T @ scores
    return info


def asymptotic_sd(model: ContaminatedMoE, params: ContaminatedParams, n: int | float, **kw: Any) -> np.ndarray:
    r""":math:`\sqrt{[I^{-1}]_{jj}/n}`: the asymptotic standard deviation of each maximum-likelihood estimate
    (order of :meth:`moestat.contaminated.ContaminatedFit.names`); ``kw`` go to :func:`fisher_information`."""
    info = fisher_information(model, params, **kw)
    out: np.ndarray = np.sqrt(np.diag(np.linalg.inv(info)) / float(n))
    return out
