r"""Permutation- and sign-aware errors for gated networks (makkuva2020 §4, "Error metric").

Regressors (experts) :math:`a_i` are identified up to a permutation and, by the tensor loss, up to
sign.  The paper's error (rows normalised to unit norm) is

.. math:: \mathcal E_{\mathrm{reg}} = 1 - \max_{\pi \in S_k} \min_{i} |\langle \hat a_{\pi(i)}, a_i^*\rangle|,

a bottleneck assignment.  The gate is identified up to the same permutation and a common shift;
after relabelling by the regressor matching :math:`\pi` it is re-referenced so that the last gate
vector is zero: :math:`w'_i = \hat w_{\pi(i)} - \hat w_{\pi(k)}`.  For ``k = 2`` a swap maps
:math:`w^*` to :math:`-w^*`, which a sign-blind cosine cannot see, so the signed
:math:`\max_i \|w'_i - w_i^*\|_2` (the norm of makkuva2020 Theorems 3–4) is reported next to the cosine error.

All functions accept a single fit ``(k, d)``, replicates ``(R, k, d)`` or replicates x restarts
``(R, S, k, d)`` and return tidy frames with columns ``rep`` (``restart``), ``metric``, ``value``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from .._torch import to_numpy
from .._validation import validate_arguments

__all__ = ["gating_error", "match_regressors", "regressor_error"]

_BRUTE_FORCE_MAX_K = 7


def _as_batch(name: str, a, d: int | None = None) -> tuple[np.ndarray, tuple[int, ...]]:
    arr = np.asarray(to_numpy(a), dtype=np.float64)
    if arr.ndim not in (2, 3, 4):
        raise ValueError(f"{name} must have shape (k, d), (R, k, d) or (R, S, k, d), got {arr.shape}.")
    if d is not None and arr.shape[-1] != d:
        raise ValueError(f"{name} has dimension d={arr.shape[-1]} but the other argument has d={d}.")
    return arr, arr.shape[:-2]


def _unit(A: np.ndarray) -> np.ndarray:
    nrm = np.linalg.norm(A, axis=-1, keepdims=True)
    return A / np.where(nrm > 0, nrm, 1.0)


def _bottleneck_perm(C: np.ndarray) -> np.ndarray:
    """Permutation maximising min_i C[perm[i], i] (ties broken by the largest sum), for one (k, k) matrix."""
    k = C.shape[0]
    thresholds = np.unique(C)
    lo, hi = 0, len(thresholds) - 1
    best = None
    while lo <= hi:  # largest threshold admitting a perfect matching
        mid = (lo + hi) // 2
        graph = csr_matrix((C >= thresholds[mid]).astype(np.int8))
        match = maximum_bipartite_matching(graph, perm_type="row")   # match[j] = row matched to column j
        if (match >= 0).all():
            best, lo = match, mid + 1
        else:
            hi = mid - 1
    return np.asarray(best if best is not None else np.arange(k), dtype=np.int64)


def match_regressors(A_hat, A_star) -> tuple[np.ndarray, np.ndarray]:
    r"""Bottleneck matching of estimated to true regressors.

    Parameters
    ----------
    A_hat : array, shape (..., k, d)
        Estimated regressors (rows), any scale and sign.
    A_star : array, shape (k, d) or matching the leading axes of ``A_hat``
        True regressors.

    Returns
    -------
    E_reg : ndarray, shape (...)
        :math:`1 - \max_\pi \min_i |\cos(\hat a_{\pi(i)}, a^*_i)|`.
    perm : ndarray of int, shape (..., k)
        ``perm[i]`` is the estimated expert matched to true expert ``i`` (so ``A_hat[perm]`` aligns with
        ``A_star``).  Exact: brute force over :math:`k!` permutations for :math:`k \le 7`, binary search on the
        bottleneck threshold with bipartite matching (scipy) above.
    """
    Ah, batch = _as_batch("A_hat", A_hat)
    As = np.asarray(to_numpy(A_star), dtype=np.float64)
    if As.shape[-2:] != Ah.shape[-2:]:
        raise ValueError(f"A_star has shape {As.shape} but A_hat rows are {Ah.shape[-2:]}; they must share (k, d).")
    As = np.broadcast_to(As.reshape(As.shape[:-2] + (1,) * (len(batch) - (As.ndim - 2)) + As.shape[-2:]),
                         Ah.shape)
    C = np.abs(np.einsum("...id,...jd->...ij", _unit(Ah), _unit(As)))   # C[..., hat i, true j]
    k = Ah.shape[-2]
    flat = C.reshape(-1, k, k)
    if k <= _BRUTE_FORCE_MAX_K:
        perms = np.array(list(itertools.permutations(range(k))), dtype=np.int64)   # (P, k)
        vals = flat[:, perms, np.arange(k)]                                           # (B, P, k)
        mins, sums = vals.min(-1), vals.sum(-1)
        best_min = mins.max(-1, keepdims=True)
        score = np.where(mins >= best_min - 1e-12, sums, -np.inf)
        perm = perms[score.argmax(-1)]
    else:
        perm = np.stack([_bottleneck_perm(c) for c in flat])
    emin = flat[np.arange(flat.shape[0])[:, None], perm, np.arange(k)[None, :]].min(-1)
    return (1.0 - emin).reshape(batch), perm.reshape(*batch, k)


def _frame(batch: tuple[int, ...], metrics: dict[str, np.ndarray]) -> pd.DataFrame:
    if len(batch) == 0:
        idx = {"rep": np.array([0])}
    elif len(batch) == 1:
        idx = {"rep": np.arange(batch[0])}
    else:
        r, s = np.meshgrid(np.arange(batch[0]), np.arange(batch[1]), indexing="ij")
        idx = {"rep": r.ravel(), "restart": s.ravel()}
    parts = [pd.DataFrame({**idx, "metric": name, "value": np.asarray(v, dtype=float).ravel()})
             for name, v in metrics.items()]
    return pd.concat(parts, ignore_index=True)


def _regressor_metrics(A_hat, A_star) -> tuple[dict[str, np.ndarray], np.ndarray, tuple[int, ...]]:
    Ah, batch = _as_batch("A_hat", A_hat)
    As = np.asarray(to_numpy(A_star), dtype=np.float64)
    e_reg, perm = match_regressors(Ah, As)
    As_b = np.broadcast_to(As.reshape(As.shape[:-2] + (1,) * (len(batch) - (As.ndim - 2)) + As.shape[-2:]),
                           Ah.shape)
    aligned = np.take_along_axis(Ah, perm[..., None], axis=-2)
    diff = np.linalg.norm(aligned - As_b, axis=-1)
    diff_flip = np.linalg.norm(aligned + As_b, axis=-1)
    cos = np.clip(1.0 - e_reg, 0.0, 1.0)
    metrics = {
        "E_reg": e_reg,
        "reg_angle": np.arccos(cos),
        "reg_l2": diff.max(-1),
        "reg_l2_unsigned": np.minimum(diff, diff_flip).max(-1),
    }
    return metrics, perm, batch


@validate_arguments()  # A_hat and A_star are data, checked where they are read
def regressor_error(A_hat, A_star) -> pd.DataFrame:
    r"""Regressor errors of makkuva2020 plus :math:`\ell_2` parameter errors, as a tidy frame.

    Metrics (``metric`` column):

    * ``E_reg`` — the paper's :math:`1 - \max_\pi\min_i |\cos|` (sign- and permutation-invariant);
    * ``reg_angle`` — the largest matched angle :math:`\arccos(1 - \mathcal E_{\mathrm{reg}})` in radians
      (:math:`\mathcal E_{\mathrm{reg}} \approx \theta^2/2`, so its rate exponent is twice the angle's);
    * ``reg_l2`` — :math:`\max_i \|\hat a_{\pi(i)} - a_i^*\|_2`, signed (a sign flip counts as an error);
    * ``reg_l2_unsigned`` — the same with the best sign per expert.

    Parameters
    ----------
    A_hat : array, shape (k, d), (R, k, d) or (R, S, k, d)
    A_star : array, shape (k, d) or (R, k, d)

    Returns
    -------
    DataFrame
        Columns ``rep`` (``restart`` for 4-d input), ``metric``, ``value``.
    """
    metrics, _, batch = _regressor_metrics(A_hat, A_star)
    return _frame(batch, metrics)


def _gate_metrics(W_hat, W_star, perm) -> dict[str, np.ndarray]:
    Wh, batch = _as_batch("W_hat", W_hat)
    Ws = np.asarray(to_numpy(W_star), dtype=np.float64)
    if Ws.shape[-2:] != Wh.shape[-2:]:
        raise ValueError(f"W_star has shape {Ws.shape} but W_hat rows are {Wh.shape[-2:]}; pass both with all k "
                         "gate vectors (the reference row included).")
    Ws = np.broadcast_to(Ws.reshape(Ws.shape[:-2] + (1,) * (len(batch) - (Ws.ndim - 2)) + Ws.shape[-2:]), Wh.shape)
    k = Wh.shape[-2]
    perm = np.broadcast_to(np.asarray(perm, dtype=np.int64), (*batch, k))
    Wp = np.take_along_axis(Wh, perm[..., None], axis=-2)
    Wp = Wp - Wp[..., -1:, :]
    Wt = Ws - Ws[..., -1:, :]
    diff = np.linalg.norm(Wp - Wt, axis=-1)[..., : k - 1]
    cos = np.abs(np.einsum("...id,...id->...i", _unit(Wp), _unit(Wt)))[..., : k - 1]
    has = np.linalg.norm(Wt, axis=-1)[..., : k - 1] > 0
    cos = np.where(has, cos, np.nan)
    return {
        "E_gate": 1.0 - (np.nanmin(cos, axis=-1) if k > 1 else np.zeros(batch)),
        "gate_l2": diff.max(-1) if k > 1 else np.zeros(batch),
        "gate_fro": np.sqrt((diff**2).sum(-1)),
    }


@validate_arguments()  # W_hat, W_star, perm, A_hat and A_star are data, checked where they are read
def gating_error(W_hat, W_star, *, perm=None, A_hat=None, A_star=None) -> pd.DataFrame:
    r"""Gate errors after relabelling and re-referencing, as a tidy frame.

    The estimated gate is relabelled by ``perm`` (or by the regressor matching of ``A_hat`` to
    ``A_star``), then both gates are re-referenced to their last expert,
    :math:`w'_i = \hat w_{\pi(i)} - \hat w_{\pi(k)}`.  Metrics:

    * ``E_gate`` — :math:`1 - \min_{i<k} |\cos(w'_i, w_i^*)|`, the paper's "defined similarly" gate error
      (sign-blind; ignores :math:`\|w\|`);
    * ``gate_l2`` — :math:`\max_{i<k}\|w'_i - w_i^*\|_2`, the norm of makkuva2020 Theorems 3–4;
    * ``gate_fro`` — :math:`\|W' - W^*\|_F`.

    Parameters
    ----------
    W_hat, W_star : array, shape (..., k, d)
        All k gate vectors (any reference; the paper's convention has the last row 0).
    perm : array of int, shape (k,) or (..., k), optional
        ``perm[i]`` = estimated expert matched to true expert ``i``.
    A_hat, A_star : array, optional
        Regressors used to find ``perm`` when it is not given.  With neither ``perm`` nor regressors the
        permutation minimising ``gate_fro`` is used (gate-only matching).
    """
    Wh, batch = _as_batch("W_hat", W_hat)
    k = Wh.shape[-2]
    if perm is None:
        if A_hat is not None and A_star is not None:
            _, perm = match_regressors(A_hat, A_star)
        else:
            best, perm = None, None
            for p in itertools.permutations(range(k)):
                fro = _gate_metrics(Wh, W_star, np.array(p))["gate_fro"]
                if best is None:
                    best, perm = fro, np.broadcast_to(np.array(p), (*batch, k)).copy()
                else:
                    better = fro < best
                    perm[better] = p
                    best = np.where(better, fro, best)
    return _frame(batch, _gate_metrics(Wh, W_star, perm))
