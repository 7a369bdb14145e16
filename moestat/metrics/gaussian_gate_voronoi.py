r"""Voronoi losses of the Gaussian-gated mixture of experts (Type I and Type II settings).

The model (Nguyen, Nguyen, Nguyen & Ho, AISTATS 2024, "Towards convergence rates for parameter estimation in
Gaussian-gated mixture of experts") is the joint density

$$p_G(x, y) = \sum_{i=1}^{K} \pi_i\, \mathcal N(x; c_i, \Gamma_i)\, \mathcal N(y; A_i x + b_i, \nu_i)$$

(:mod:`moestat.fit.gllim`).  Fitted atoms :math:`\theta_i = (c_i, \Gamma_i, A_i, b_i, \nu_i)` are put in the Voronoi
cells :math:`\mathcal A_j` of the true atoms :math:`\theta^*_j` (nearest true atom; an atom equidistant from several
joins the lowest-index one), by the Euclidean distance of the stacked blocks (``cell_distance="euclidean"``) or by
the sum of the block norms (``"sum"``, the convention of the authors' code CRPE-GMoE, ``discrepancies.py``).  With
:math:`\Delta c_{ij} = c_i - c^*_j` and likewise for the other blocks (Euclidean norms of vectors, Frobenius norms of
matrices), the loss is

$$\mathcal D(G, G^*) = \sum_{j=1}^{K^*}\Big|\sum_{i\in\mathcal A_j}\pi_i - \pi^*_j\Big|
 + \sum_{j:|\mathcal A_j|=1}\sum_{i\in\mathcal A_j}\pi_i\big(\|\Delta c_{ij}\| + \|\Delta\Gamma_{ij}\|
 + \|\Delta A_{ij}\| + \|\Delta b_{ij}\| + \|\Delta\nu_{ij}\|\big)
 + \sum_{j:|\mathcal A_j|\ge 2}\sum_{i\in\mathcal A_j}\pi_i\big(\|\Delta c_{ij}\|^{r_j}
 + \|\Delta\Gamma_{ij}\|^{r_j/2} + \|\Delta A_{ij}\|^{s_j} + \|\Delta b_{ij}\|^{r_j}
 + \|\Delta\nu_{ij}\|^{r_j/2}\big),$$

where a cell of :math:`m = |\mathcal A_j| \ge 2` atoms has

* **Type I** (its true gate mean :math:`c^*_j \ne 0`): :math:`r_j = \bar r(m)` and :math:`s_j = 2`;
* **Type II** (:math:`c^*_j = 0`): :math:`r_j = \tilde r(m)` and :math:`s_j = \tilde r(m)/2`.

The paper's loss :math:`\overline{\mathcal D}` (every :math:`c^*_j \ne 0`) and :math:`\widetilde{\mathcal D}` (some
:math:`c^*_j = 0`) are the two cases of this one formula.  :math:`\bar r(m)` is the smallest :math:`r` for which the
system of polynomial equations of Ho & Nguyen (2016, Ann. Statist., Proposition 2.1) has only the trivial solution:
:math:`\bar r(2) = 4`, :math:`\bar r(3) = 6`.  The exponents used here for both :math:`\bar r` and
:math:`\tilde r` are those of the authors' code (``rbar = rtilde = [0, 1, 4, 6]``); the paper characterises
:math:`\tilde r` by a second system, whose values were not checked against its text.  Cells of :math:`m \ge 4`
atoms need ``rbar`` / ``rtilde`` (no value is known).

Why the exponents: with :math:`u = \mathcal N(x; c, \Gamma)\mathcal N(y; A x + b, \nu)` one has
:math:`\partial u/\partial A = x\,\partial u/\partial b` and :math:`x\,\mathcal N(x; c, \Gamma) =
c\,\mathcal N + \Gamma\,\partial\mathcal N/\partial c`, so :math:`\partial u/\partial A = c\,\partial u/\partial b
+ \Gamma\,\partial^2 u/\partial c\,\partial b`: when :math:`c = 0` the slope interacts with the gate mean through a
second-order PDE (Type II), otherwise a first-order term remains (Type I).  The loss falls like
:math:`\sqrt{\log n / n}` for the maximum-likelihood estimator in both settings; each term then bounds its block's
rate (e.g. :math:`\|\Delta c\| \lesssim n^{-1/(2\bar r(m))}` in a Type I cell of :math:`m` atoms).

Gaussian-gated (joint) mixtures are identifiable without a translation: no centring is applied (unlike
:func:`moestat.gaussian_voronoi_loss` for softmax gates).  Parameters are passed as any object with the attributes
``pi, c, Gamma, A, b, nu`` (e.g. :class:`moestat.fit.gllim.GLLiMParams`) or a mapping with those keys, with an
optional leading replicate axis.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from .._validation import check_choice

__all__ = ["CELL_DISTANCES", "GG_BLOCKS", "KNOWN_RBAR", "KNOWN_RTILDE", "gaussian_gate_cell_errors",
           "gaussian_gate_cells", "gaussian_gate_voronoi_frame", "gaussian_gate_voronoi_loss"]

GG_BLOCKS = ("c", "Gamma", "A", "b", "nu")
"""The atom blocks of the loss, in order (the weights enter through the cell sums)."""

CELL_DISTANCES = ("euclidean", "sum")
"""Cell-assignment distances: the Euclidean norm of all block differences, or the sum of the block norms (the
authors' code)."""

KNOWN_RBAR: dict[int, float] = {2: 4.0, 3: 6.0}
r""":math:`\bar r(m)` for Type I cells (Ho & Nguyen 2016)."""

KNOWN_RTILDE: dict[int, float] = {2: 4.0, 3: 6.0}
r""":math:`\tilde r(m)` for Type II cells, as in the authors' code (CRPE-GMoE ``discrepancies.py``)."""

RArg = Mapping[int, float] | Callable[[int], float] | None


# ----------------------------------------------------------------------------- inputs
def _read(obj: Any, name: str) -> dict[str, np.ndarray]:
    """The blocks of ``obj`` with a leading replicate axis: pi (R, K) and each atom block flattened to (R, K, p)."""
    keys = ("pi", *GG_BLOCKS)
    if isinstance(obj, Mapping):
        missing = [k for k in keys if k not in obj]
        get = obj.__getitem__
    else:
        missing = [k for k in keys if not hasattr(obj, k)]
        get = lambda k: getattr(obj, k)  # noqa: E731
    if missing:
        raise TypeError(f"{name} must have the GLLiM blocks pi, c, Gamma, A, b, nu (e.g. moestat.fit.gllim."
                        f"GLLiMParams or a dict); missing {missing}.")
    pi = np.asarray(get("pi"), dtype=float)
    if pi.ndim not in (1, 2):
        raise ValueError(f"{name}.pi must have shape (K,) or (R, K), got {pi.shape}.")
    lead = 1 if pi.ndim == 1 else 0
    ndims = {"c": 2, "Gamma": 3, "A": 3, "b": 2, "nu": 3}
    out = {"pi": pi[None] if lead else pi}
    R, K = out["pi"].shape
    for key in GG_BLOCKS:
        arr = np.asarray(get(key), dtype=float)
        if arr.ndim != ndims[key] + 1 - lead:
            raise ValueError(f"{name}.{key} must have {ndims[key]} axes (K, ...) or {ndims[key] + 1} with a replicate "
                             f"axis, got shape {arr.shape}.")
        arr = arr[None] if lead else arr
        if arr.shape[:2] != (R, K):
            raise ValueError(f"{name}.{key} has {arr.shape[:2]} (replicates, components) but {name}.pi has {(R, K)}.")
        out[key] = arr.reshape(R, K, -1)
    for key, arr in out.items():
        if not np.isfinite(arr).all():
            raise ValueError(f"{name}.{key} holds NaN or infinite values; pass finite parameters.")
    return out


def _pair(fitted: Any, truth: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], bool]:
    """Fitted blocks (R, K, .), true blocks (K*, .) and whether the fit was batched."""
    f = _read(fitted, "fitted")
    t = _read(truth, "truth")
    if t["pi"].shape[0] != 1:
        raise ValueError(f"truth must be one parameter set (no replicate axis), got {t['pi'].shape[0]} replicates.")
    t = {k: v[0] for k, v in t.items()}
    for key in GG_BLOCKS:
        if f[key].shape[-1] != t[key].shape[-1]:
            raise ValueError(f"fitted.{key} has {f[key].shape[-1]} entries per atom but truth.{key} has "
                             f"{t[key].shape[-1]}: the fit and the truth must have the same d and l.")
    batched = np.asarray(fitted["pi"] if isinstance(fitted, Mapping) else fitted.pi).ndim == 2
    return f, t, batched


def _exponent(table: RArg, defaults: dict[int, float], m: int, name: str) -> float:
    if callable(table):
        value = float(table(m))
    else:
        merged = {**defaults, **(dict(table) if table else {})}
        if m not in merged:
            raise ValueError(f"a Voronoi cell has {m} fitted atoms and no {name}({m}) is known; pass "
                             f"{name}={{{m}: value}} (e.g. {2 * m}, the pattern 2m of m = 2, 3).")
        value = float(merged[m])
    if not value > 0:
        raise ValueError(f"{name}({m}) must be > 0, got {value}.")
    return value


def _check_rtable(name: str, table: RArg) -> None:
    if table is None or callable(table):
        return
    if not isinstance(table, Mapping) or not all(
            isinstance(k, numbers.Integral) and not isinstance(v, bool) and isinstance(v, numbers.Real)
            for k, v in table.items()):
        raise TypeError(f"{name} must map cell sizes (int) to exponents (float), e.g. {{4: 8.0}}, or be a callable; "
                        f"got {table!r}.")


# ----------------------------------------------------------------------------- cells
def _block_distances(f: dict[str, np.ndarray], t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Norm of every block difference between fitted atom i and true atom j: each (R, K, K*)."""
    return {key: np.linalg.norm(f[key][:, :, None, :] - t[key][None, None, :, :], axis=-1) for key in GG_BLOCKS}


def _assign(dist: dict[str, np.ndarray], cell_distance: str) -> np.ndarray:
    stacked = np.stack(list(dist.values()))
    total = np.sqrt((stacked ** 2).sum(0)) if cell_distance == "euclidean" else stacked.sum(0)
    out: np.ndarray = np.argmin(total, axis=-1)  # ties: the lowest-index true atom
    return out


def gaussian_gate_cells(fitted: Any, truth: Any, *, cell_distance: str = "euclidean") -> np.ndarray:
    """The Voronoi cell (index of the nearest true atom) of every fitted atom, shape (R, K) (or (K,) unbatched).

    ``cell_distance``: ``"euclidean"`` (the norm of all stacked block differences) or ``"sum"`` (the sum of the
    block norms, as in CRPE-GMoE)."""
    check_choice("cell_distance", cell_distance, CELL_DISTANCES)
    f, t, batched = _pair(fitted, truth)
    cells = _assign(_block_distances(f, t), cell_distance)
    return cells if batched else cells[0]


def _geometry(fitted: Any, truth: Any, cell_distance: str, zero_atol: float) -> tuple[dict[str, Any], bool]:
    """Cells, cell sizes, block errors and weight sums per replicate and fitted atom (no exponents)."""
    check_choice("cell_distance", cell_distance, CELL_DISTANCES)
    if isinstance(zero_atol, bool) or not isinstance(zero_atol, numbers.Real) or not 0 <= zero_atol < np.inf:
        raise ValueError(f"zero_atol must be a finite number >= 0, got {zero_atol!r}.")
    f, t, batched = _pair(fitted, truth)
    dist = _block_distances(f, t)
    cells = _assign(dist, cell_distance)  # (R, K)
    onehot = cells[..., None] == np.arange(t["pi"].shape[0])  # (R, K, K*)
    sizes = onehot.sum(1)  # (R, K*)
    zero = np.linalg.norm(t["c"], axis=-1) <= zero_atol  # (K*,)
    err = {key: np.take_along_axis(d, cells[..., None], axis=-1)[..., 0] for key, d in dist.items()}
    weight_sum = (f["pi"][..., None] * onehot).sum(1)  # (R, K*)
    return {"cells": cells, "onehot": onehot, "sizes": sizes, "zero": zero, "err": err, "pi": f["pi"],
            "weight_gap": np.abs(weight_sum - t["pi"][None]), "m": np.take_along_axis(sizes, cells, axis=-1)}, batched


def _atom_terms(g: dict[str, Any], rbar: RArg, rtilde: RArg) -> np.ndarray:
    r"""The term of every fitted atom, :math:`\pi_i \sum_{\text{blocks}} \|\Delta\|^{\text{power}}`, (R, K)."""
    _check_rtable("rbar", rbar)
    _check_rtable("rtilde", rtilde)
    m, z = g["m"], g["zero"][g["cells"]]
    r, s = np.ones(m.shape), np.ones(m.shape)
    for size in np.unique(m[m >= 2]):
        at = m == size
        if (at & ~z).any():
            r[at & ~z], s[at & ~z] = _exponent(rbar, KNOWN_RBAR, int(size), "rbar"), 2.0
        if (at & z).any():
            r_tilde = _exponent(rtilde, KNOWN_RTILDE, int(size), "rtilde")
            r[at & z], s[at & z] = r_tilde, r_tilde / 2.0
    half = np.where(m >= 2, r / 2.0, 1.0)
    powers = {"c": r, "Gamma": half, "A": s, "b": r, "nu": half}
    out: np.ndarray = g["pi"] * sum(g["err"][key] ** powers[key] for key in GG_BLOCKS)
    return out


def gaussian_gate_voronoi_loss(fitted: Any, truth: Any, *, rbar: RArg = None, rtilde: RArg = None,
                               cell_distance: str = "euclidean", zero_atol: float = 0.0) -> Any:
    r"""The Voronoi loss :math:`\mathcal D(G, G^*)` of the Gaussian-gated MoE (module docstring).

    Parameters
    ----------
    fitted : GLLiMParams or mapping
        Fitted parameters with blocks ``pi, c, Gamma, A, b, nu``, optionally with a leading replicate axis.
    truth : GLLiMParams or mapping
        True parameters (no replicate axis).
    rbar, rtilde : mapping of int to float or callable, optional
        Exponents :math:`\bar r(m)` (Type I cells) and :math:`\tilde r(m)` (Type II cells) added to or replacing
        :data:`KNOWN_RBAR` / :data:`KNOWN_RTILDE`; needed for cells of 4 or more atoms.
    cell_distance : {"euclidean", "sum"}
        How fitted atoms are assigned to cells (see :func:`gaussian_gate_cells`).
    zero_atol : float
        A true gate mean with :math:`\|c^*_j\| \le` ``zero_atol`` makes its cell Type II (default: exactly 0).

    Returns
    -------
    float or ndarray of shape (R,)
    """
    g, batched = _geometry(fitted, truth, cell_distance, zero_atol)
    loss = g["weight_gap"].sum(-1) + _atom_terms(g, rbar, rtilde).sum(-1)
    return loss if batched else float(loss[0])


def _pattern(sizes: np.ndarray) -> list[str]:
    return ["-".join(map(str, row)) for row in sizes]


def gaussian_gate_voronoi_frame(fitted: Any, truth: Any, *, rbar: RArg = None, rtilde: RArg = None,
                                cell_distance: str = "euclidean", zero_atol: float = 0.0) -> pd.DataFrame:
    """The loss of :func:`gaussian_gate_voronoi_loss` and its parts, one row per replicate.

    Columns: ``loss``; ``weight_gap`` (the first sum); ``exact_part`` and ``over_part`` (the atom terms of cells with
    one and with several atoms); ``cell_sizes`` (the number of fitted atoms in each true atom's cell, e.g. ``"2-1-1"``);
    ``cell_<j>`` (the atom terms of true atom j's cell); ``empty_cells`` (true atoms no fitted atom is nearest to).
    """
    g, _ = _geometry(fitted, truth, cell_distance, zero_atol)
    atom, m, onehot = _atom_terms(g, rbar, rtilde), g["m"], g["onehot"]
    gap = g["weight_gap"].sum(-1)
    frame = pd.DataFrame({"loss": gap + atom.sum(-1), "weight_gap": gap,
                          "exact_part": np.where(m == 1, atom, 0.0).sum(-1),
                          "over_part": np.where(m >= 2, atom, 0.0).sum(-1),
                          "cell_sizes": _pattern(g["sizes"]),
                          "empty_cells": (g["sizes"] == 0).sum(-1)})
    for j in range(onehot.shape[-1]):
        frame[f"cell_{j}"] = (atom * onehot[..., j]).sum(-1)
    return frame


def gaussian_gate_cell_errors(fitted: Any, truth: Any, *, cell_distance: str = "euclidean",
                              zero_atol: float = 0.0) -> pd.DataFrame:
    r"""Per replicate and true atom: its cell's size, type, weight-sum error and largest block errors.

    One row per replicate ``rep`` and true atom ``atom``: ``cell_size`` (:math:`|\mathcal A_j|`),
    ``zero_location`` (:math:`c^*_j = 0`, a Type II cell), ``weight_sum_error``
    (:math:`|\sum_{i\in\mathcal A_j}\pi_i - \pi^*_j|`) and, for every block of :data:`GG_BLOCKS`, ``err_<block>``:
    :math:`\max_{i\in\mathcal A_j}` of the block's norm difference (NaN for an empty cell).  These are the
    quantities whose rates the loss implies (module docstring)."""
    g, _ = _geometry(fitted, truth, cell_distance, zero_atol)
    onehot, err = g["onehot"], g["err"]
    R, _, k_star = onehot.shape
    cols: dict[str, Any] = {"rep": np.repeat(np.arange(R), k_star), "atom": np.tile(np.arange(k_star), R),
                            "cell_size": g["sizes"].ravel(), "zero_location": np.tile(g["zero"], R),
                            "weight_sum_error": g["weight_gap"].ravel()}
    for key in GG_BLOCKS:
        masked = np.where(onehot, err[key][..., None], -np.inf).max(1)  # (R, K*)
        cols[f"err_{key}"] = np.where(np.isfinite(masked), masked, np.nan).ravel()
    return pd.DataFrame(cols)
