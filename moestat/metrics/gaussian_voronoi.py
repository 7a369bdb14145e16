r"""Voronoi losses of the softmax-gated Gaussian mixture of experts (exact- and over-specified).

The model (Nguyen, Nguyen & Ho, "Demystifying Softmax Gating Function in Gaussian Mixture of
Experts", NeurIPS 2023) is

$$p_G(y \mid x) = \sum_{i=1}^{k} \mathrm{softmax}_i\big(\beta_{1i}^\top x + \beta_{0i}\big)\,
\mathcal N\big(y \mid a_i^\top x + b_i,\ \nu_i\big),$$

with noise **variance** $\nu_i$ (moestat stores the standard deviation, ``Params.noise_sd``, so
$\nu_i = \mathrm{noise\_sd}_i^2$).  Fitted atoms $\theta_i = (\beta_{1i}, a_i, b_i, \nu_i)$ are put in
the Voronoi cells of the true atoms $\theta^*_j$,

$$A_j = \{\, i : \|\theta_i - \theta^*_j\| \le \|\theta_i - \theta^*_\ell\|\ \forall \ell \ne j \,\},$$

(Euclidean; an atom equidistant from several true atoms joins the lowest-index one).  With
$\Delta\beta_{1ij} = \beta_{1i} - \beta^*_{1j}$ and likewise $\Delta a_{ij}, \Delta b_{ij},
\Delta\nu_{ij}$, the **exact-specified** loss ($k = k^*$) is

$$D_1(G,G^*) = \sum_{j=1}^{k^*}\Big|\sum_{i\in A_j} e^{\beta_{0i}} - e^{\beta^*_{0j}}\Big|
 + \sum_{j=1}^{k^*}\sum_{i\in A_j} e^{\beta_{0i}}\big(\|\Delta\beta_{1ij}\| + \|\Delta a_{ij}\|
 + |\Delta b_{ij}| + |\Delta\nu_{ij}|\big),$$

and the **over-specified** loss ($k > k^*$) raises the terms of a cell with $|A_j| \ge 2$ atoms to
the cell-size exponent $\bar r = \bar r(|A_j|)$:

$$D_2(G,G^*) = \sum_{j}\Big|\sum_{i\in A_j} e^{\beta_{0i}} - e^{\beta^*_{0j}}\Big|
 + \sum_{j:|A_j|\ge 2}\sum_{i\in A_j} e^{\beta_{0i}}\big(\|\Delta\beta_{1ij}\|^{\bar r}
 + \|\Delta a_{ij}\|^{\bar r/2} + |\Delta b_{ij}|^{\bar r} + |\Delta\nu_{ij}|^{\bar r/2}\big)
 + \sum_{j:|A_j|=1}\sum_{i\in A_j} e^{\beta_{0i}}\big(\|\Delta\beta_{1ij}\| + \|\Delta a_{ij}\|
 + |\Delta b_{ij}| + |\Delta\nu_{ij}|\big).$$

$\bar r(m)$ is the smallest $r$ for which the paper's system of polynomial equations (the one of
Ho & Nguyen, Ann. Statist. 2016, for location-scale Gaussian mixtures) has no non-trivial solution:
$\bar r(2) = 4$, $\bar r(3) = 6$; no closed form is given for $m \ge 4$, so such cells need ``rbar``.
The half exponents on $a$ and $\nu$ come from the PDEs
$\partial^2 u/\partial\beta_1\partial b = \partial u/\partial a$ and
$\partial^2 u/\partial b^2 = 2\,\partial u/\partial\nu$ of
$u = e^{\beta_1^\top x} \mathcal N(y \mid a^\top x + b, \nu)$.

Softmax gates are identified only up to a common translation $(t_0, t_1)$ of all
$(\beta_{0i}, \beta_{1i})$; the paper takes an infimum over translations inside the loss.  This module
instead evaluates the loss on the translation-centred representatives of both measures
(:func:`moestat.metrics.voronoi.center_softmax`: $\sum_i e^{\beta_{0i}} = 1$,
$\sum_i \pi_i\beta_{1i} = 0$), which is invariant under translations, relabelling and splitting an
atom into copies; ``translation="none"`` uses the parameters as given.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from .._torch import is_torch, to_numpy
from .._validation import Boolean, check_choice, validate_arguments
from ..model import MoE
from ..params import BLOCKS, Params
from .voronoi import center_softmax

GAUSSIAN_KINDS = ("exact", "over", "auto")
"""Values of ``kind`` accepted by :func:`gaussian_voronoi_loss`."""

CELL_DISTANCES = ("euclidean", "sum")
"""Cell-assignment distances: the paper's Euclidean norm, or the sum of block norms of the research code."""

KNOWN_RBAR: dict[int, float] = {2: 4.0, 3: 6.0}
r"""Known values of $\bar r(m)$ (Ho & Nguyen 2016; used by Nguyen, Nguyen & Ho 2023)."""

RbarArg = Mapping[int, float] | Callable[[int], float] | None


# ------------------------------------------------------------------------------------ inputs
@dataclass(frozen=True)
class _Atoms:
    """Atoms of a mixing measure with a replicate axis: b0 (R,k), b1 (R,k,d), a (R,k,d), b (R,k), nu (R,k)."""

    b0: np.ndarray
    b1: np.ndarray
    a: np.ndarray
    b: np.ndarray
    nu: np.ndarray | None

    @property
    def k(self) -> int:
        return int(self.b0.shape[-1])

    @property
    def reps(self) -> int:
        return int(self.b0.shape[0])


def _as_params(obj: Any, name: str) -> tuple[MoE | None, Params]:
    """A Params, a (MoE, Params) pair or a mapping of block arrays -> (spec, numpy Params)."""
    spec: MoE | None = None
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], MoE) and isinstance(obj[1], Params):
        spec, obj = obj
    elif isinstance(obj, Mapping):
        unknown = set(obj) - set(BLOCKS)
        if unknown:
            raise ValueError(f"{name} has unknown block names {sorted(unknown)}; valid names are {list(BLOCKS)}.")
        try:
            obj = Params(**{key: to_numpy(v) if is_torch(v) else v for key, v in obj.items()})
        except TypeError as exc:
            raise TypeError(f"{name}: {exc} Pass gate_bias, gate_weight, expert_weight and expert_bias.") from exc
    if not isinstance(obj, Params):
        raise TypeError(
            f"{name} must be a moestat.Params, a (MoE, Params) pair or a dict of block arrays "
            f"({', '.join(BLOCKS)}), got {type(obj).__name__}."
        )
    return spec, obj.detach().numpy()


def _apply_spec(spec: MoE | None, p: Params, name: str) -> Params:
    """Check the spec is a softmax-gated linear-expert model; fold in its temperature and noise sd."""
    if spec is None:
        return p
    if spec.gate != "softmax":
        raise ValueError(
            f"{name} uses gate={spec.gate!r}; the Gaussian MoE Voronoi losses are for softmax gates. "
            "Use moestat.metrics.voronoi_loss for sigmoid gates."
        )
    if spec.expert != "linear":
        raise ValueError(
            f"{name} uses expert={spec.expert!r}; these losses are for linear Gaussian experts "
            "N(y | a^T x + b, nu). Use moestat.metrics.voronoi_loss for other expert families."
        )
    if spec.d != p.d:
        raise ValueError(f"{name}: the spec has d={spec.d} but its Params have d={p.d}.")
    if spec.temperature != 1.0:
        p = replace(p, gate_bias=p.gate_bias / spec.temperature, gate_weight=p.gate_weight / spec.temperature)
    if p.noise_sd is None:
        p = replace(p, noise_sd=np.full(p.gate_bias.shape, float(spec.noise_sd)))
    return p


def _atoms(p: Params, variance: bool) -> _Atoms:
    q = p.batched()
    nu = np.asarray(q.noise_sd, dtype=np.float64) ** 2 if variance else None
    return _Atoms(np.asarray(q.gate_bias), np.asarray(q.gate_weight), np.asarray(q.expert_weight),
                  np.asarray(q.expert_bias), nu)


def _broadcast(x: _Atoms, reps: int) -> _Atoms:
    if x.reps == reps:
        return x

    def rep(v: np.ndarray | None) -> np.ndarray | None:
        return None if v is None else np.broadcast_to(v, (reps, *v.shape[1:]))

    return _Atoms(*(rep(v) for v in (x.b0, x.b1, x.a, x.b, x.nu)))  # type: ignore[arg-type]


def _prepare(fitted: Any, truth: Any, variance: bool, translation: str) -> tuple[_Atoms, _Atoms, bool]:
    """Validate and convert both measures; returns (fitted atoms, true atoms, batched)."""
    spec_f, pf = _as_params(fitted, "fitted")
    spec_t, pt = _as_params(truth, "truth")
    pf, pt = _apply_spec(spec_f, pf, "fitted"), _apply_spec(spec_t, pt, "truth")
    if pf.d != pt.d:
        raise ValueError(
            f"fitted has input dimension d={pf.d} but truth has d={pt.d}; both measures must live on the "
            "same input space."
        )
    if variance:
        for name, p in (("fitted", pf), ("truth", pt)):
            if p.noise_sd is None:
                raise ValueError(
                    f"{name} has no noise_sd, but variance=True needs the noise variance nu = noise_sd^2 of "
                    "every atom. Pass Params(..., noise_sd=...), a (MoE, Params) pair whose spec gives "
                    "noise_sd, or variance=False to drop the variance term."
                )
    if translation == "center":
        pf, pt = center_softmax(pf), center_softmax(pt)
    af, at = _atoms(pf, variance), _atoms(pt, variance)
    if af.reps != at.reps and 1 not in (af.reps, at.reps):
        raise ValueError(
            f"fitted has R={af.reps} replicates but truth has R={at.reps}; pass one truth (unbatched) or one "
            "per replicate."
        )
    reps = max(af.reps, at.reps)
    return _broadcast(af, reps), _broadcast(at, reps), pf.is_batched or pt.is_batched


# ------------------------------------------------------------------------------ exponents
def _rbar_function(rbar: RbarArg) -> Callable[[int], float]:
    """The map m -> rbar(m) for cells of m >= 2 atoms (known values unless overridden)."""
    if rbar is None:
        table: dict[int, float] = dict(KNOWN_RBAR)
    elif isinstance(rbar, Mapping):
        table = {**KNOWN_RBAR, **{int(m): v for m, v in rbar.items()}}
    elif callable(rbar):
        return lambda m: _check_rbar_value(m, rbar(m))
    else:
        raise TypeError(
            f"rbar must be None, a mapping {{cell size: exponent}} or a callable m -> exponent, got "
            f"{type(rbar).__name__}."
        )

    def lookup(m: int) -> float:
        if m not in table:
            raise ValueError(
                f"a Voronoi cell holds {m} fitted atoms, but rbar({m}) is not known in closed form (only "
                f"rbar(2)=4 and rbar(3)=6 are). Pass rbar={{{m}: value}} or a callable such as "
                "rbar=lambda m: 2 * m (the choice of the Dendrogram_SGMoE research code), or fit fewer experts."
            )
        return _check_rbar_value(m, table[m])

    return lookup


def _check_rbar_value(m: int, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"rbar({m}) must be a positive number, got {value!r}.")
    if not np.isfinite(float(value)) or value <= 0:
        raise ValueError(f"rbar({m}) must be a finite number > 0 (the known values are 4 and 6), got {value}.")
    return float(value)


def _exponents(sizes: np.ndarray, kind: str, rbar: RbarArg) -> np.ndarray:
    """Per-cell exponent rbar(|A_j|) of the beta_1 and b terms (1 for exact-specified cells), shape (R, k*)."""
    out = np.ones(sizes.shape, dtype=np.float64)
    if kind == "exact":
        return out
    fn = _rbar_function(rbar)
    for m in np.unique(sizes[sizes >= 2]):
        out[sizes == m] = fn(int(m))
    return out


# ---------------------------------------------------------------------------------- losses
@dataclass(frozen=True)
class _Pieces:
    """Cell assignment and the loss split per cell; all arrays carry the replicate axis first."""

    cell: np.ndarray        # (R, k) index of the true atom whose cell holds fitted atom i
    sizes: np.ndarray       # (R, k*) |A_j|
    exponent: np.ndarray    # (R, k*) rbar(|A_j|) or 1
    gap: np.ndarray         # (R, k*) |sum_{A_j} exp(beta0_i) - exp(beta0*_j)|
    param: np.ndarray       # (R, k*) sum_{i in A_j} exp(beta0_i) (...) terms

    @property
    def loss(self) -> np.ndarray:
        return np.asarray((self.gap + self.param).sum(-1), dtype=np.float64)


def _pairwise(f: _Atoms, t: _Atoms) -> dict[str, np.ndarray]:
    """Block distances (R, k, k*) between every fitted and every true atom."""
    out = {
        "b1": np.linalg.norm(f.b1[:, :, None, :] - t.b1[:, None, :, :], axis=-1),
        "a": np.linalg.norm(f.a[:, :, None, :] - t.a[:, None, :, :], axis=-1),
        "b": np.abs(f.b[:, :, None] - t.b[:, None, :]),
    }
    if f.nu is not None and t.nu is not None:
        out["nu"] = np.abs(f.nu[:, :, None] - t.nu[:, None, :])
    return out


def _pieces(f: _Atoms, t: _Atoms, kind: str, cell_distance: str, rbar: RbarArg) -> _Pieces:
    dist = _pairwise(f, t)
    stacked = np.stack(list(dist.values()))                           # (blocks, R, k, k*)
    cell_d = np.sqrt((stacked**2).sum(0)) if cell_distance == "euclidean" else stacked.sum(0)
    cell = np.argmin(cell_d, axis=-1)                                 # first minimum: lowest index on ties
    onehot = cell[..., None] == np.arange(t.k)                        # (R, k, k*)
    sizes = onehot.sum(-2)
    exponent = _exponents(sizes, kind, rbar)
    own = {key: np.take_along_axis(v, cell[..., None], -1)[..., 0] for key, v in dist.items()}   # (R, k)
    e_fast = np.take_along_axis(exponent, cell, -1)                   # beta_1 and b
    e_slow = np.where(e_fast > 1, e_fast / 2, 1.0)                    # a and nu
    terms = own["b1"] ** e_fast + own["a"] ** e_slow + own["b"] ** e_fast
    if "nu" in own:
        terms = terms + own["nu"] ** e_slow
    w = np.exp(f.b0)
    param = np.einsum("rk,rkj->rj", w * terms, onehot.astype(np.float64))
    gap = np.abs(np.einsum("rk,rkj->rj", w, onehot.astype(np.float64)) - np.exp(t.b0))
    return _Pieces(cell, sizes, exponent, gap, param)


def _resolve_kind(kind: str, k: int, k_true: int) -> str:
    check_choice("kind", kind, GAUSSIAN_KINDS)
    if kind == "auto":
        return "exact" if k == k_true else "over"
    return kind


def _check_strict(pc: _Pieces, kind: str, k: int, k_true: int) -> None:
    if kind == "exact" and k != k_true:
        raise ValueError(
            f"strict=True: kind='exact' is the loss for k = k* but fitted has k={k} and truth k*={k_true}; "
            "use kind='over' (or 'auto') for k > k*."
        )
    if k < k_true:
        raise ValueError(
            f"strict=True: fitted has k={k} < k*={k_true} atoms (under-specified); these losses assume k >= k*."
        )
    empty = np.flatnonzero((pc.sizes == 0).any(-1))
    if empty.size:
        raise ValueError(
            f"strict=True: replicates {empty[:10].tolist()} leave a true atom with an empty Voronoi cell "
            "(no fitted atom near it); pass strict=False to charge only its weight gap, or refit."
        )


def _compute(fitted: Any, truth: Any, kind: str, variance: bool, strict: bool, translation: str,
             cell_distance: str, rbar: RbarArg) -> tuple[_Pieces, str, int, int, bool]:
    check_choice("translation", translation, ("center", "none"))
    check_choice("cell_distance", cell_distance, CELL_DISTANCES)
    for name, flag in (("variance", variance), ("strict", strict)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {flag!r}.")
    f, t, batched = _prepare(fitted, truth, bool(variance), translation)
    kind = _resolve_kind(kind, f.k, t.k)
    pc = _pieces(f, t, kind, cell_distance, rbar)
    if strict:
        _check_strict(pc, kind, f.k, t.k)
    return pc, kind, f.k, t.k, batched


@validate_arguments(variance=Boolean(), strict=Boolean())
def gaussian_voronoi_loss(fitted: Any, truth: Any, *, kind: str = "auto", variance: bool = True,
                          strict: bool = False, translation: str = "center", cell_distance: str = "euclidean",
                          rbar: RbarArg = None) -> np.ndarray:
    r"""Voronoi loss $D_1$ (exact-specified) or $D_2$ (over-specified) of a softmax-gated Gaussian MoE.

    Formulas in the module docstring (Nguyen, Nguyen & Ho, NeurIPS 2023).

    Parameters
    ----------
    fitted : Params, (MoE, Params) or dict of block arrays
        Fitted mixing measure $G$ with $k$ atoms, unbatched or batched ``(R, k, ...)``.  A spec must be
        ``gate="softmax"``, ``expert="linear"``; its ``temperature`` divides the gate parameters and its
        ``noise_sd`` is used when the Params have none.
    truth : Params, (MoE, Params) or dict of block arrays
        True mixing measure $G^*$ ($k^*$ atoms), unbatched or one per replicate.
    kind : {"auto", "exact", "over"}
        ``"exact"``: $D_1$ (first-order terms in every cell); ``"over"``: $D_2$ (cell-size exponents);
        ``"auto"``: ``"exact"`` when $k = k^*$, else ``"over"``.
    variance : bool
        Include the noise variance $\nu = \mathrm{noise\_sd}^2$ in the cells and the loss (needs
        ``noise_sd`` on both measures).  ``False`` drops every $\nu$ term.
    strict : bool
        Check the setting the loss is meant for: raise if ``kind="exact"`` with $k \ne k^*$, if
        $k < k^*$, or if a true atom has an empty cell in some replicate.  With ``False`` an empty cell
        is charged its weight gap $e^{\beta^*_{0j}}$ only.
    translation : {"center", "none"}
        Evaluate on the translation-centred representatives (default) or on the parameters as given.
    cell_distance : {"euclidean", "sum"}
        Distance assigning atoms to cells: Euclidean on $\theta = (\beta_1, a, b, \nu)$ as in the paper,
        or the sum of block norms $\|\Delta\beta_1\| + \|\Delta a\| + |\Delta b| + |\Delta\nu|$ as in the
        authors' research code.
    rbar : mapping or callable, optional
        $\bar r(m)$ for cells of $m \ge 2$ atoms; defaults to $\bar r(2)=4$, $\bar r(3)=6$.  Cells of
        4 or more atoms need it (no closed form is known).

    Returns
    -------
    ndarray, shape (R,)
        One loss per replicate (R = 1 when both measures are unbatched).

    Raises
    ------
    ValueError
        Different input dimensions, missing ``noise_sd`` with ``variance=True``, a non-softmax or
        non-linear spec, replicate counts that do not broadcast, unknown ``kind``, a cell of
        $m \ge 4$ atoms without ``rbar``, or a ``strict`` check failing.
    TypeError
        Inputs that are not Params, pairs or block dicts; a bad ``rbar``.

    Examples
    --------
    >>> import numpy as np, moestat as ms
    >>> from moestat.metrics.gaussian_voronoi import gaussian_voronoi_loss
    >>> truth = ms.Params([-8.0, 0.0], [[25.0], [0.0]], [[-20.0], [20.0]], [15.0, -5.0], noise_sd=[0.3, 0.4])
    >>> float(gaussian_voronoi_loss(truth, truth)[0])
    0.0
    """
    pc, _, _, _, _ = _compute(fitted, truth, kind, variance, strict, translation, cell_distance, rbar)
    return pc.loss


@validate_arguments(variance=Boolean(), strict=Boolean())
def gaussian_voronoi_frame(fitted: Any, truth: Any, *, kind: str = "auto", variance: bool = True,
                           strict: bool = False, translation: str = "center", cell_distance: str = "euclidean",
                           rbar: RbarArg = None) -> pd.DataFrame:
    r"""The loss of :func:`gaussian_voronoi_loss` per replicate with its cell pattern and per-cell parts.

    Arguments as in :func:`gaussian_voronoi_loss`.

    Returns
    -------
    DataFrame
        One row per replicate: ``rep``, ``kind`` (``"exact"``/``"over"`` after resolving ``"auto"``),
        ``k``, ``k_true``, ``loss``, ``cell_sizes`` (the sizes $|A_j|$ joined by ``"-"`` in true-atom order,
        e.g. ``"2-1"``), ``n_empty`` (true atoms with an empty cell), ``exponents`` (the exponent of the
        $\beta_1$/$b$ terms per cell, e.g. ``"4-1"``; 0 for empty cells), ``weight_gap`` and ``param_term``
        (the two sums of the loss), and per true atom ``j`` the cell's contribution ``cell_j`` $=
        |\sum_{i\in A_j} e^{\beta_{0i}} - e^{\beta^*_{0j}}| + \sum_{i\in A_j} e^{\beta_{0i}}(\dots)$;
        the ``cell_j`` add up to ``loss``.  Group by ``cell_sizes`` to fit rates per pattern.
    """
    pc, kind, k, k_true, _ = _compute(fitted, truth, kind, variance, strict, translation, cell_distance, rbar)
    reps = pc.sizes.shape[0]
    expo = np.where(pc.sizes == 0, 0.0, pc.exponent)
    frame = pd.DataFrame({
        "rep": np.arange(reps),
        "kind": kind,
        "k": k,
        "k_true": k_true,
        "loss": pc.loss,
        "cell_sizes": ["-".join(str(int(s)) for s in row) for row in pc.sizes],
        "n_empty": (pc.sizes == 0).sum(-1),
        "exponents": ["-".join(f"{e:g}" for e in row) for row in expo],
        "weight_gap": pc.gap.sum(-1),
        "param_term": pc.param.sum(-1),
    })
    contrib = pc.gap + pc.param
    for j in range(k_true):
        frame[f"cell_{j}"] = contrib[:, j]
    return frame
