r"""Region-wise Voronoi losses of the top-K sparse softmax-gated Gaussian mixture of experts.

The model (Shazeer et al., ICLR 2017; the gate ``"topk"`` of :mod:`moestat.gates`) is

$$p_G(y \mid x) = \sum_{i \in T_K(x)} \frac{\exp(\beta_{1i}^\top x + \beta_{0i})}
{\sum_{\ell \in T_K(x)} \exp(\beta_{1\ell}^\top x + \beta_{0\ell})}\,
\mathcal N\big(y \mid a_i^\top x + b_i,\ \nu_i\big),$$

with $T_K(x)$ the $K$ experts of largest score $\beta_{1i}^\top x + \beta_{0i}$.  The selection cuts the input
space into **regions**: on the region of a $K$-subset $S$ of the true experts, $T_K(x) = S$ and the true model is a
softmax-gated MoE of the experts of $S$ alone.  Nguyen, Akbarian, Yan & Ho (ICLR 2024, "Statistical perspective of
top-K sparse softmax gating mixture of experts", arXiv:2309.13850) build their losses region by region for that
reason (their abstract: "novel loss functions among parameters to capture different behaviors of the input
regions"); the paper's own formulas could not be read for this module, so the loss below is **derived here** from
that structure and checked numerically (tests/metrics/test_topk_voronoi.py), not copied.

Fitted atoms $\theta_i = (\beta_{1i}, a_i, b_i, \nu_i)$ are put in the Voronoi cells $A_j$ of the true atoms (Euclidean
distance, gates translation-centred over all atoms, exactly as :func:`moestat.gaussian_voronoi_loss`).  For a realised
true region $S$ (a $K$-subset that is the true top-$K$ set on inputs of positive probability) the atoms of
$A_S = \bigcup_{j\in S} A_j$ and the true atoms of $S$ are each re-centred **within the region**
($\sum_{i \in A_S} e^{\beta_{0i}} = 1$, $\sum_{i\in A_S} \pi_i \beta_{1i} = 0$ with $\pi$ the softmax of the
intercepts over $A_S$; likewise over $S$), because on that region the model is the softmax MoE of those atoms,
identified up to its own translation.  With $\Delta$ the differences of the re-centred parameters,

$$D_S(G, G^*) = \sum_{j\in S}\Big|\sum_{i\in A_j} e^{\beta_{0i}} - e^{\beta^*_{0j}}\Big|
 + \sum_{j \in S}\sum_{i\in A_j} e^{\beta_{0i}}\big(\|\Delta\beta_{1ij}\|^{r_j} + \|\Delta a_{ij}\|^{s_j}
 + |\Delta b_{ij}|^{r_j} + |\Delta\nu_{ij}|^{s_j}\big),$$

with $r_j = s_j = 1$ for the exact-specified loss ($k = k^*$) and for cells of one atom, and
$r_j = \bar r(|A_j|)$, $s_j = \bar r(|A_j|)/2$ for cells of two or more atoms in the over-specified loss
($\bar r(2) = 4$, $\bar r(3) = 6$: the softmax-gated exponents of Nguyen, Nguyen & Ho, NeurIPS 2023, which apply
inside a region because the model is a softmax MoE there).  The loss is the worst region,

$$D(G, G^*) = \max_{S \text{ realised}} D_S(G, G^*).$$

With $K = k^*$ (a dense softmax gate) there is one region, $S = \{1,\dots,k^*\}$, and $D$ is
:func:`moestat.gaussian_voronoi_loss` ($D_1$ / $D_2$).  Properties (tested): invariant under relabelling the fitted
atoms and under the top-K gate's translation $(\beta_{0i}, \beta_{1i}) \mapsto (\beta_{0i} + t_0, \beta_{1i} + t_1)$;
zero at the truth.  $D = 0$ identifies the gate when the regions chain the experts together (every two experts are
linked by a path of regions sharing an expert): with $K = 1$ no region holds two experts, the gate is then seen only
through the region boundaries, and $D$ charges the experts alone.

The loss assumes a fit near the truth whose own top-$\bar K$ set on region $S$ is exactly $A_S$ (the fitted
$\bar K = \max_S |A_S|$; the paper's over-specified condition on "the total cardinality of a certain number of
Voronoi cells").  :func:`selection_match` measures how far that holds.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .._validation import check_choice, check_int
from ..params import Params
from .gaussian_voronoi import RbarArg, _rbar_function

__all__ = ["BLOCK_NAMES", "region_inputs", "selection_match", "selection_shares", "topk_voronoi_frame",
           "topk_voronoi_loss", "true_regions"]

BLOCK_NAMES = ("beta1", "a", "b", "nu")
"""The parameter blocks of an atom, in the order of the loss terms."""

Region = tuple[int, ...]


# ------------------------------------------------------------------------------------ inputs
def _blocks(p: Params, name: str) -> dict[str, np.ndarray]:
    """b0 (R,k), b1 (R,k,d), a (R,k,d), b (R,k), nu (R,k) of batched or unbatched Params (numpy float64)."""
    if not isinstance(p, Params):
        raise TypeError(f"{name} must be a moestat.Params, got {type(p).__name__}.")
    if p.noise_sd is None:
        raise ValueError(f"{name} has no noise_sd; the top-K Voronoi loss needs the noise variance nu = noise_sd^2 "
                         "of every atom: pass Params(..., noise_sd=...).")
    q = p.numpy().batched()
    return {"b0": np.asarray(q.gate_bias, float), "b1": np.asarray(q.gate_weight, float),
            "a": np.asarray(q.expert_weight, float), "b": np.asarray(q.expert_bias, float),
            "nu": np.asarray(q.noise_sd, float) ** 2}


def _check_top_k(top_k: Any, k: int, what: str = "top_k") -> int:
    value = int(check_int(what, top_k))
    if not 1 <= value <= k:
        raise ValueError(f"{what}={value} must be between 1 and the number of experts k={k}.")
    return value


def region_inputs(low: float = 0.0, high: float = 1.0, size: int = 2001) -> np.ndarray:
    r"""Midpoint grid of ``size`` inputs on $[\mathrm{low}, \mathrm{high}]$, shape (size, 1): the uniform input law
    of a one-dimensional design, for :func:`true_regions` and :func:`selection_match`."""
    size = check_int("size", size)
    if not (isinstance(low, numbers.Real) and isinstance(high, numbers.Real) and low < high):
        raise ValueError(f"need low < high, got low={low!r}, high={high!r}.")
    return (low + (np.arange(size) + 0.5) * (high - low) / size)[:, None]


def _top_sets(b0: np.ndarray, b1: np.ndarray, X: np.ndarray, top_k: int) -> np.ndarray:
    """Boolean (R, n, k): whether atom i is among the top_k scores at input x (ties: lowest index first)."""
    scores = np.einsum("nd,rkd->rnk", X, b1) + b0[:, None, :]
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :top_k]
    out = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(out, order, True, axis=-1)
    return out


def true_regions(truth: Params, top_k: int, X: np.ndarray) -> dict[Region, float]:
    r"""The realised regions of a top-K truth: every $K$-subset $S$ that is the true top-$K$ set at some input of
    ``X`` (n, d), with the share of ``X`` in it, sorted by first appearance.

    Parameters
    ----------
    truth : Params
        The true mixing measure (unbatched).
    top_k : int
        The truth's $K$.
    X : array (n, d)
        Inputs standing for the input law (e.g. :func:`region_inputs`).
    """
    t = _blocks(truth, "truth")
    if t["b0"].shape[0] != 1:
        raise ValueError("truth must be unbatched (one true mixing measure).")
    X = _check_X(X, t["b1"].shape[-1])
    top_k = _check_top_k(top_k, t["b0"].shape[-1])
    sets = _top_sets(t["b0"], t["b1"], X, top_k)[0]
    out: dict[Region, float] = {}
    for row in sets:
        key = tuple(int(i) for i in np.flatnonzero(row))
        out[key] = out.get(key, 0.0) + 1.0 / len(sets)
    return out


def _check_X(X: Any, d: int) -> np.ndarray:
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[1] != d or X.shape[0] == 0:
        raise ValueError(f"X must be an array of shape (n, d={d}) with n >= 1, got shape {X.shape}.")
    if not np.isfinite(X).all():
        raise ValueError("X has non-finite values; pass finite inputs.")
    return np.asarray(X)


# ----------------------------------------------------------------------------- geometry
def _centred(b0: np.ndarray, b1: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Translation-centred (b0, b1) of the atoms in ``mask`` (R, k): sum exp(b0) = 1 and pi-weighted mean b1 = 0
    over the masked atoms (others: NaN).  A replicate with an empty mask gets NaN everywhere."""
    masked = np.where(mask, b0, -np.inf)
    top = np.max(masked, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    w = np.where(mask, np.exp(masked - top), 0.0)
    total = w.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = top + np.log(total)
        pi = w / total
    c0 = np.where(mask, b0 - lse, np.nan)
    shift = np.einsum("rk,rkd->rd", np.nan_to_num(pi), b1)[:, None, :]
    c1 = np.where(mask[..., None], b1 - shift, np.nan)
    return c0, c1


def _cells(f: dict[str, np.ndarray], t: dict[str, np.ndarray]) -> np.ndarray:
    """Cell (true atom index) of every fitted atom, (R, k): Euclidean on (beta1, a, b, nu), gates centred over all
    atoms; the lowest true index on ties (as gaussian_voronoi_loss)."""
    _, fc1 = _centred(f["b0"], f["b1"], np.ones(f["b0"].shape, bool))
    _, tc1 = _centred(t["b0"], t["b1"], np.ones(t["b0"].shape, bool))
    sq = (np.sum((fc1[:, :, None, :] - tc1[:, None, :, :]) ** 2, -1)
          + np.sum((f["a"][:, :, None, :] - t["a"][:, None, :, :]) ** 2, -1)
          + (f["b"][:, :, None] - t["b"][:, None, :]) ** 2 + (f["nu"][:, :, None] - t["nu"][:, None, :]) ** 2)
    return np.asarray(np.argmin(sq, axis=-1))


def _broadcast_truth(t: dict[str, np.ndarray], reps: int) -> dict[str, np.ndarray]:
    return {key: np.broadcast_to(v, (reps, *v.shape[1:])) for key, v in t.items()}


def _prepare(fitted: Params, truth: Params, top_k: int, regions: Any, X: Any, kind: str
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[Region], str]:
    f, t = _blocks(fitted, "fitted"), _blocks(truth, "truth")
    if t["b0"].shape[0] != 1:
        raise ValueError("truth must be unbatched (one true mixing measure).")
    if f["b1"].shape[-1] != t["b1"].shape[-1]:
        raise ValueError(f"fitted has input dimension d={f['b1'].shape[-1]} but truth has d={t['b1'].shape[-1]}; "
                         "both measures must live on the same input space.")
    k, k_true = f["b0"].shape[-1], t["b0"].shape[-1]
    top_k = _check_top_k(top_k, k_true)
    if k < k_true:
        raise ValueError(f"fitted has k={k} < k*={k_true} atoms (under-specified); the loss needs k >= k*.")
    check_choice("kind", kind, ("auto", "exact", "over"))
    kind = ("exact" if k == k_true else "over") if kind == "auto" else kind
    if regions is None:
        if X is None:
            raise ValueError("pass the true regions (regions=[(0, 1), ...]) or inputs X to find them "
                             "(e.g. X=moestat.metrics.topk_voronoi.region_inputs()).")
        found = list(true_regions(truth, top_k, X))
    else:
        found = [tuple(sorted(int(j) for j in S)) for S in regions]
        bad = [S for S in found if len(S) != top_k or len(set(S)) != top_k or not all(0 <= j < k_true for j in S)]
        if bad or not found:
            raise ValueError(f"regions must be non-empty {top_k}-subsets of the true atoms 0..{k_true - 1}, got "
                             f"{regions!r}.")
    return f, _broadcast_truth(t, f["b0"].shape[0]), found, kind


# ---------------------------------------------------------------------------------- terms
def _region_terms(f: dict[str, np.ndarray], t: dict[str, np.ndarray], cell: np.ndarray, S: Region,
                  expo: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """D_S per replicate (R,) and the per-atom block distances (R, k) of the atoms in A_S (NaN elsewhere)."""
    k_true = t["b0"].shape[-1]
    in_S = np.isin(cell, S)
    true_in = np.isin(np.arange(k_true), S)[None, :].repeat(cell.shape[0], 0)
    f0, f1 = _centred(f["b0"], f["b1"], in_S)
    t0, t1 = _centred(t["b0"], t["b1"], true_in)

    def own(v: np.ndarray) -> np.ndarray:  # (R, k*) -> (R, k): the value at each atom's cell
        return np.asarray(np.take_along_axis(v, cell, -1))

    def own_d(v: np.ndarray) -> np.ndarray:  # (R, k*, d) -> (R, k, d)
        return np.asarray(np.take_along_axis(v, cell[..., None], -2))

    dist = {"beta1": np.linalg.norm(f1 - own_d(np.nan_to_num(t1)), axis=-1),
            "a": np.linalg.norm(f["a"] - own_d(t["a"]), axis=-1),
            "b": np.abs(f["b"] - own(t["b"])), "nu": np.abs(f["nu"] - own(t["nu"]))}
    dist = {key: np.where(in_S, v, np.nan) for key, v in dist.items()}
    r = np.take_along_axis(expo, cell, -1)
    s = np.where(r > 1, r / 2, 1.0)
    w = np.where(in_S, np.exp(np.nan_to_num(f0, nan=-np.inf)), 0.0)
    terms = dist["beta1"] ** r + dist["a"] ** s + dist["b"] ** r + dist["nu"] ** s
    param = np.nansum(np.where(in_S, w * terms, 0.0), -1)
    onehot = (cell[..., None] == np.arange(k_true)).astype(float)
    mass = np.einsum("rk,rkj->rj", w, onehot)
    gap = np.abs(mass - np.where(true_in, np.exp(np.nan_to_num(t0, nan=-np.inf)), 0.0))
    return param + np.where(true_in, gap, 0.0).sum(-1), dist


def _exponents(sizes: np.ndarray, kind: str, rbar: RbarArg) -> np.ndarray:
    """rbar(|A_j|) for cells of >= 2 atoms in the over-specified loss, 1 otherwise; shape (R, k*)."""
    out = np.ones(sizes.shape)
    if kind == "over":
        fn = _rbar_function(rbar)
        for m in np.unique(sizes[sizes >= 2]):
            out[sizes == m] = fn(int(m))
    return out


def _compute(fitted: Params, truth: Params, top_k: int, regions: Any, X: Any, kind: str, rbar: RbarArg
             ) -> dict[str, Any]:
    f, t, found, kind = _prepare(fitted, truth, top_k, regions, X, kind)
    cell = _cells(f, t)
    k_true = t["b0"].shape[-1]
    sizes = (cell[..., None] == np.arange(k_true)).sum(-2)
    expo = _exponents(sizes, kind, rbar)
    per_region, dists = {}, []
    for S in found:
        per_region[S], dist = _region_terms(f, t, cell, S, expo)
        dists.append(dist)
    loss = np.max(np.stack(list(per_region.values())), axis=0)
    # each atom's block distance: the worst over the regions that contain its cell (gates re-centred per region)
    block = {name: np.nanmax(np.stack([d[name] for d in dists]), axis=0) if any(
        np.isfinite(d[name]).any() for d in dists) else np.full(cell.shape, np.nan) for name in BLOCK_NAMES}
    return {"loss": loss, "regions": per_region, "cell": cell, "sizes": sizes, "kind": kind, "block": block,
            "k": f["b0"].shape[-1], "k_true": k_true}


# ----------------------------------------------------------------------------------- public
def topk_voronoi_loss(fitted: Params, truth: Params, top_k: int, *, regions: Sequence[Sequence[int]] | None = None,
                      X: Any = None, kind: str = "auto", rbar: RbarArg = None) -> np.ndarray:
    r"""Region-wise Voronoi loss $D = \max_S D_S$ of a top-K sparse softmax-gated Gaussian MoE (module docstring).

    Parameters
    ----------
    fitted : Params
        Fitted mixing measure ($k \ge k^*$ atoms), unbatched or batched (R, k, ...), with ``noise_sd``.
    truth : Params
        True mixing measure ($k^*$ atoms, unbatched), with ``noise_sd``.
    top_k : int
        The truth's $K$ (defines the regions).
    regions : sequence of K-subsets, optional
        The realised true regions; default: found from ``X`` by :func:`true_regions`.
    X : array (n, d), optional
        Inputs standing for the input law, used when ``regions`` is not given.
    kind : {"auto", "exact", "over"}
        ``"exact"``: first-order terms in every cell; ``"over"``: exponents $\bar r(|A_j|)$ and $\bar r/2$ in cells of
        two or more atoms; ``"auto"``: exact when $k = k^*$.
    rbar : mapping or callable, optional
        $\bar r(m)$ for cells of $m \ge 2$ atoms (default: $\bar r(2) = 4$, $\bar r(3) = 6$).

    Returns
    -------
    ndarray, shape (R,)

    Examples
    --------
    >>> import moestat as ms
    >>> from moestat.metrics.topk_voronoi import topk_voronoi_loss
    >>> truth = ms.Params([1.0, 0.0, -3.0], [[-4.0], [0.0], [4.0]], [[-2.0], [2.0], [1.0]], [4.0, -1.0, -4.0],
    ...                   noise_sd=[0.3, 0.4, 0.3])
    >>> float(topk_voronoi_loss(truth, truth, 2, regions=[(0, 1), (1, 2)])[0])
    0.0
    """
    return np.asarray(_compute(fitted, truth, top_k, regions, X, kind, rbar)["loss"], dtype=float)


def topk_voronoi_frame(fitted: Params, truth: Params, top_k: int, *, regions: Sequence[Sequence[int]] | None = None,
                       X: Any = None, kind: str = "auto", rbar: RbarArg = None) -> pd.DataFrame:
    r"""The loss of :func:`topk_voronoi_loss` per replicate, with its cell pattern, region parts and the block errors
    by cell size.

    Arguments as in :func:`topk_voronoi_loss`.

    Returns
    -------
    DataFrame
        One row per replicate: ``rep``, ``kind``, ``k``, ``k_true``, ``loss``, ``cell_sizes`` (sizes $|A_j|$ joined by
        ``"-"`` in true-atom order), ``n_empty``, ``region_<S>`` ($D_S$ per realised region, e.g. ``region_0_1``) and
        ``err_<block>_cell<m>`` for ``block`` in :data:`BLOCK_NAMES` and $m = 1$ and every larger cell size present:
        the largest distance $\|\Delta\|$ of that block over the fitted atoms in cells of $m$ atoms (gates re-centred
        per region, the worst region of the atom's cell; NaN when no cell has $m$ atoms).
    """
    out = _compute(fitted, truth, top_k, regions, X, kind, rbar)
    reps = out["cell"].shape[0]
    frame = pd.DataFrame({"rep": np.arange(reps), "kind": out["kind"], "k": out["k"], "k_true": out["k_true"],
                          "loss": out["loss"],
                          "cell_sizes": ["-".join(str(int(s)) for s in row) for row in out["sizes"]],
                          "n_empty": (out["sizes"] == 0).sum(-1)})
    for S, value in out["regions"].items():
        frame["region_" + "_".join(map(str, S))] = value
    atom_size = np.take_along_axis(out["sizes"], out["cell"], -1)
    for m in sorted({1, *(int(s) for s in np.unique(out["sizes"]) if s >= 2)}):
        sel = atom_size == m
        for name in BLOCK_NAMES:
            values = np.where(sel, out["block"][name], np.nan)
            frame[f"err_{name}_cell{m}"] = [float(np.nanmax(v)) if np.isfinite(v).any() else np.nan for v in values]
    return frame


def selection_match(fitted: Params, truth: Params, top_k: int, fitted_top_k: int, X: Any) -> np.ndarray:
    r"""Share of the inputs ``X`` at which the fitted top-$\bar K$ set equals $A_S$, the union of the Voronoi cells of
    the true top-$K$ set $S$ there, per replicate (R,).

    1 means the fit routes every input like the truth, atom cell by atom cell (the setting of the over-specified loss
    and of the paper's condition on $\bar K$); a fit that had to select an atom of another cell, or to drop one of a
    split cell, falls below 1 on the inputs where that happens.
    """
    f, t = _blocks(fitted, "fitted"), _blocks(truth, "truth")
    if t["b0"].shape[0] != 1:
        raise ValueError("truth must be unbatched (one true mixing measure).")
    X = _check_X(X, t["b1"].shape[-1])
    k, k_true = f["b0"].shape[-1], t["b0"].shape[-1]
    top_k = _check_top_k(top_k, k_true)
    fitted_top_k = _check_top_k(fitted_top_k, k, "fitted_top_k")
    cell = _cells(f, _broadcast_truth(t, f["b0"].shape[0]))
    true_sets = _top_sets(t["b0"], t["b1"], X, top_k)[0]                      # (n, k*)
    want = np.take_along_axis(np.broadcast_to(true_sets, (cell.shape[0], *true_sets.shape)),
                              np.broadcast_to(cell[:, None, :], (cell.shape[0], X.shape[0], k)), -1)  # (R, n, k)
    got = _top_sets(f["b0"], f["b1"], X, fitted_top_k)
    return np.asarray(np.all(want == got, axis=-1).mean(-1), dtype=float)



def selection_shares(params: Params, top_k: int, X: Any) -> np.ndarray:
    r"""Share of the inputs ``X`` (n, d) at which each atom is among the ``top_k`` largest scores, shape (R, k): 0
    for an atom the gate never selects (its parameters then do not enter the density)."""
    p = _blocks(params, "params")
    X = _check_X(X, p["b1"].shape[-1])
    top_k = _check_top_k(top_k, p["b0"].shape[-1])
    return np.asarray(_top_sets(p["b0"], p["b1"], X, top_k).mean(-2), dtype=float)
