r"""Gating functions of a mixture of experts.

Each gate maps the logits :math:`\ell_i(x) = \beta_{1i}^\top x + \beta_{0i}` of the
``k`` experts to mixture weights.  All gates are pure torch functions of the
logits, numerically stable at logits of any magnitude, and take an optional
temperature :math:`\tau` that divides the logits.

* softmax (Jordan & Jacobs 1994; nguyen2024 eq. 14):
  :math:`\pi_i = \exp(\ell_i/\tau) / \sum_j \exp(\ell_j/\tau)`, computed with
  logsumexp, so rows sum to one.
* sigmoid (nguyen2024 eq. 2): :math:`\pi_i = 1/(1 + \exp(-\ell_i/\tau))`,
  one independent sigmoid per expert; weights need **not** sum to one.
* top-K sparse softmax (Shazeer et al. 2017): the softmax over the K largest
  logits of each row, exactly zero elsewhere.
"""

from __future__ import annotations

import torch

from ._validation import check_choice, check_int

GATES = ("softmax", "sigmoid", "topk")


def gate_logits(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    r"""Logits :math:`\ell_{ri}(x) = \beta_{1ri}^\top x + \beta_{0ri}`.

    Parameters
    ----------
    X : Tensor, shape (..., n, d)
    weight : Tensor, shape (..., k, d)
        Gate slopes :math:`\beta_1`.
    bias : Tensor, shape (..., k)
        Gate intercepts :math:`\beta_0`.

    Returns
    -------
    Tensor, shape (..., n, k)
    """
    return X @ weight.transpose(-1, -2) + bias.unsqueeze(-2)


def _check_temperature(temperature: float) -> float:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    return float(temperature)


def softmax_gate(logits: torch.Tensor, temperature: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Softmax gate :math:`\pi_i = \exp(\ell_i/\tau)/\sum_j \exp(\ell_j/\tau)` over the expert axis ``dim``."""
    return torch.softmax(logits / _check_temperature(temperature), dim=dim)


def sigmoid_gate(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    r"""Independent sigmoid gates :math:`\pi_i = \sigma(\ell_i/\tau)` (nguyen2024 eq. 2)."""
    return torch.sigmoid(logits / _check_temperature(temperature))


def _topk_mask(logits: torch.Tensor, top_k: int, dim: int = -1) -> torch.Tensor:
    k = logits.shape[dim]
    top_k = check_int("top_k", top_k)
    if top_k > k:
        raise ValueError(f"top_k={top_k} exceeds the number of experts k={k}; choose top_k <= k.")
    idx = logits.topk(top_k, dim=dim).indices
    mask = torch.zeros_like(logits, dtype=torch.bool)
    return mask.scatter(dim, idx, True)


def topk_softmax_gate(logits: torch.Tensor, top_k: int, temperature: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Top-K sparse softmax: softmax over the ``top_k`` largest logits of each row, zero elsewhere.

    :math:`\pi_i = \mathbb 1[i \in \mathrm{TopK}(\ell)]\, \exp(\ell_i/\tau) /
    \sum_{j \in \mathrm{TopK}(\ell)} \exp(\ell_j/\tau)`.  Ties are broken by
    :func:`torch.topk`.
    """
    mask = _topk_mask(logits, top_k, dim)
    masked = (logits / _check_temperature(temperature)).masked_fill(~mask, float("-inf"))
    return torch.softmax(masked, dim=dim)


def gate_weights(name: str, logits: torch.Tensor, *, top_k: int | None = None,
                 temperature: float = 1.0, dim: int = -1) -> torch.Tensor:
    """Dispatch to the gate called ``name`` (one of ``GATES``); ``dim`` is the expert axis of ``logits``."""
    check_choice("gate", name, GATES)
    if name == "softmax":
        return softmax_gate(logits, temperature, dim)
    if name == "sigmoid":
        return sigmoid_gate(logits, temperature)
    if top_k is None:
        raise ValueError("gate='topk' needs top_k (the number of active experts per input).")
    return topk_softmax_gate(logits, top_k, temperature, dim)


def log_mixture_weights(name: str, logits: torch.Tensor, *, top_k: int | None = None,
                        temperature: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Log of the *normalised* mixture weights used in a mixture density.

    A mixture density needs weights that sum to one.  Softmax and top-K gates
    already do.  Sigmoid gates are normalised over experts,
    :math:`\tilde\pi_i = \sigma(\ell_i)/\sum_j \sigma(\ell_j)`, which is the
    convention moestat uses for the Gaussian MoE likelihood with sigmoid gates.
    Experts outside the top-K get :math:`-\infty`.  ``dim`` is the expert axis (the likelihood engine
    keeps experts on axis 1 and observations last, where these reductions are several times faster
    on CPU than over a short last axis).
    """
    check_choice("gate", name, GATES)
    tau = _check_temperature(temperature)
    if name == "softmax":
        return torch.log_softmax(logits / tau, dim=dim)
    if name == "sigmoid":
        ls = torch.nn.functional.logsigmoid(logits / tau)
        return ls - torch.logsumexp(ls, dim=dim, keepdim=True)
    if top_k is None:
        raise ValueError("gate='topk' needs top_k (the number of active experts per input).")
    mask = _topk_mask(logits, top_k, dim)
    return torch.log_softmax((logits / tau).masked_fill(~mask, float("-inf")), dim=dim)
