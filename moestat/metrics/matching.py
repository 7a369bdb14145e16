r"""Label alignment of fitted atoms to true atoms, and permutation-invariant parameter errors.

A fitted MoE is identified only up to relabelling of its experts.  Two alignments:

* ``"hungarian"``: the injective map :math:`\pi` from true atoms to fitted atoms minimising
  :math:`\sum_j \|\theta_{\pi(j)} - \theta^*_j\|^2` (``scipy.optimize.linear_sum_assignment``);
  with :math:`k > k^*` the :math:`k - k^*` unmatched fitted atoms are listed after the matched ones.
* ``"voronoi"``: every fitted atom goes to the true atom of its Voronoi cell
  (:func:`moestat.metrics.voronoi_cells`); the permutation sorts the fitted atoms by (cell, distance),
  so the nearest atom of each cell comes first within it.

Distances use :math:`\omega = (\beta_1, a, b)` by default, as the Voronoi cells do; pass
``blocks`` to include the gate intercept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.optimize import linear_sum_assignment

from .._torch import to_numpy
from .._validation import Boolean, Choice, check_choice, validate_arguments
from ._common import Blocks, broadcast_reps, check_compatible, reference_device, unpack
from ._common import blocks as to_blocks
from .voronoi import center_softmax

ALL_BLOCKS = ("gate_bias", "gate_weight", "expert_weight", "expert_bias")
CELL_BLOCKS = ("gate_weight", "expert_weight", "expert_bias")


def optimal_assignment(cost: np.ndarray) -> np.ndarray:
    r"""Minimum-cost assignment of reference items to candidates, batched: the one atom matcher.

    ``cost`` has shape (..., m, k) with :math:`m \le k` (cost of pairing reference item ``i`` with candidate
    ``j``); returns ``match`` of shape (..., m), the candidate assigned to each reference item, minimising
    :math:`\sum_i \text{cost}_{i, \text{match}_i}` over injective maps (Hungarian algorithm,
    ``scipy.optimize.linear_sum_assignment``, one small problem per leading index).  Used to align fitted atoms
    with true atoms (:func:`match_atoms`), an MLE fit with a reference (:meth:`moestat.MLEFit.align_to`) and
    bootstrap refits with the original fit.
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim < 2 or cost.shape[-2] > cost.shape[-1]:
        raise ValueError(f"cost must have shape (..., m, k) with m <= k, got {cost.shape}.")
    flat = cost.reshape(-1, *cost.shape[-2:])
    match = np.empty(flat.shape[:2], dtype=np.int64)
    for b, c in enumerate(flat):
        rows, cols = linear_sum_assignment(c)
        match[b, rows] = cols
    return match.reshape(cost.shape[:-1])


def _stack_blocks(b: Blocks, names: Sequence[str]) -> torch.Tensor:
    parts = {"gate_bias": b.b0.unsqueeze(-1), "gate_weight": b.b1, "expert_weight": b.a,
             "expert_bias": b.b.unsqueeze(-1)}
    return torch.cat([parts[n] for n in names], dim=-1)


def _check_blocks(blocks_: Sequence[str]) -> tuple[str, ...]:
    names = tuple(blocks_)
    bad = [n for n in names if n not in ALL_BLOCKS]
    if not names or bad:
        raise ValueError(f"blocks must be a non-empty subset of {list(ALL_BLOCKS)}, got {list(names)}.")
    return names


@dataclass(frozen=True)
class Matching:
    """Alignment of fitted atoms to true atoms, per replicate.

    Attributes
    ----------
    perm : ndarray, shape (R, k)
        ``params.permute(perm)`` puts the fitted atom matched to true atom ``j`` at position ``j``
        (Hungarian, ``j < min(k, k*)``); unmatched fitted atoms follow.  For ``"voronoi"`` the atoms are
        sorted by (cell, distance).
    truth_index : ndarray, shape (R, k)
        The true atom matched to each fitted atom (original labels); -1 if unmatched.
    cost : ndarray, shape (R,)
        Sum of squared distances over matched pairs.
    method : str
    """

    perm: np.ndarray
    truth_index: np.ndarray
    cost: np.ndarray
    method: str

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame: one row per (rep, fitted_atom) with its matched ``true_atom`` and ``position``."""
        R, k = self.truth_index.shape
        position = np.argsort(self.perm, axis=1)
        return pd.DataFrame({
            "rep": np.repeat(np.arange(R), k), "fitted_atom": np.tile(np.arange(k), R),
            "true_atom": self.truth_index.ravel(), "position": position.ravel(), "method": self.method,
        })


@validate_arguments(method=Choice("hungarian", "voronoi"), softmax=Boolean())
def match_atoms(params: Any, truth: Any, method: str = "hungarian", *,
                blocks: Sequence[str] = CELL_BLOCKS, softmax: bool = False) -> Matching:
    r"""Align fitted atoms to true atoms, replicate by replicate.

    Parameters
    ----------
    params : Params or (MoE, Params)
        Fitted parameters (k atoms), unbatched or batched (R, k, ...).
    truth : Params or (MoE, Params)
        True parameters (k* atoms), unbatched or one per replicate.
    method : {"hungarian", "voronoi"}
        Optimal injective assignment (``scipy.optimize.linear_sum_assignment`` on squared Euclidean
        costs) or nearest-true-atom (Voronoi) assignment.
    blocks : sequence of str
        Parameter blocks entering the distance (default: the Voronoi atoms :math:`(\beta_1, a, b)`).
    softmax : bool
        Centre softmax gate parameters first (:func:`moestat.metrics.center_softmax`).

    Returns
    -------
    Matching
    """
    check_choice("method", method, ("hungarian", "voronoi"))
    names = _check_blocks(blocks)
    spec_p, p = unpack(params, "params")
    spec_t, t = unpack(truth, "truth")
    check_compatible(spec_p, p, spec_t, t)
    if softmax:
        p, t = center_softmax(p), center_softmax(t)
    dev, dt = reference_device(p, t)
    bp, bt = to_blocks(p, dev, dt), to_blocks(t, dev, dt)
    R = broadcast_reps(bp.b0.shape[0], bt.b0.shape[0], ("params", "truth"))
    fp, ft = _stack_blocks(bp, names), _stack_blocks(bt, names)
    fp, ft = fp.expand(R, *fp.shape[1:]), ft.expand(R, *ft.shape[1:])
    cost = to_numpy(torch.cdist(fp, ft, compute_mode="donot_use_mm_for_euclid_dist") ** 2)   # (R, k, k*)
    k = cost.shape[1]
    perm = np.empty((R, k), dtype=np.int64)
    truth_index = np.full((R, k), -1, dtype=np.int64)
    total = np.empty(R)
    if method == "hungarian":
        tc = np.swapaxes(cost, 1, 2)                    # (R, k*, k): true atoms are the reference items
        if tc.shape[1] <= tc.shape[2]:
            fitted_of_true = optimal_assignment(tc)                 # (R, k*)
        else:                                           # fewer fitted than true atoms: assign the fitted ones
            true_of_fitted = optimal_assignment(cost)               # (R, k)
            fitted_of_true = np.full(tc.shape[:2], -1, dtype=np.int64)
            np.put_along_axis(fitted_of_true, true_of_fitted, np.arange(k)[None].repeat(R, 0), -1)
        for rep in range(R):
            matched = fitted_of_true[rep][fitted_of_true[rep] >= 0]
            cols = np.flatnonzero(fitted_of_true[rep] >= 0)
            perm[rep] = np.concatenate([matched, np.setdiff1d(np.arange(k), matched)])
            truth_index[rep, matched] = cols
            total[rep] = cost[rep, matched, cols].sum()
    else:
        assign = cost.argmin(-1)                                  # first minimum: lowest index on ties
        dist = np.take_along_axis(cost, assign[..., None], -1)[..., 0]
        perm[:] = np.lexsort((np.arange(k)[None].repeat(R, 0), dist, assign), axis=-1)
        truth_index[:] = assign
        total[:] = dist.sum(-1)
    return Matching(perm, truth_index, total, method)


@validate_arguments(softmax=Boolean())
def permutation_invariant_error(params: Any, truth: Any, *, blocks: Sequence[str] = ALL_BLOCKS,
                                softmax: bool = False) -> np.ndarray | float:
    r"""Parameter error minimised over relabellings, one value per replicate.

    .. math::

        \min_{\pi} \Big(\sum_{j=1}^{k^*} \|\theta_{\pi(j)} - \theta^*_j\|^2\Big)^{1/2},

    the minimum over injective maps :math:`\pi: [k^*] \to [k]` (all permutations when
    :math:`k = k^*`), where :math:`\theta` stacks the chosen ``blocks``.  Computed exactly with the
    Hungarian algorithm.  With :math:`k > k^*` the extra fitted atoms are ignored: use
    :func:`voronoi_loss` or :func:`parameter_errors` for over-specified fits.

    Parameters
    ----------
    params, truth : Params or (MoE, Params)
    blocks : sequence of str
        Blocks compared (default: all four mean-parameter blocks).
    softmax : bool
        Centre softmax gate parameters first (translation invariance).
    """
    names = _check_blocks(blocks)
    m = match_atoms(params, truth, "hungarian", blocks=names, softmax=softmax)
    out = np.sqrt(m.cost)
    _, p = unpack(params, "params")
    _, t = unpack(truth, "truth")
    return out if (p.is_batched or t.is_batched) else float(out[0])
