r"""Dendrograms of mixing measures and the dendrogram selection criterion (DSC) for softmax-gated Gaussian MoE.

One over-specified maximum-likelihood fit with :math:`K` experts is the mixing measure

.. math:: \hat G = \sum_{i=1}^{K} e^{\beta_{0i}}\,\delta_{(\beta_{1i},\, a_i,\, b_i,\, \sigma_i^2)}

of the softmax-gated Gaussian MoE :math:`p(y\mid x) = \sum_i \mathrm{softmax}_i(\beta_{1}^\top x + \beta_{0})\,
\mathcal N(y; a_i^\top x + b_i, \sigma_i^2)`.  Merging its two closest atoms, again and again, gives a measure
:math:`G^{(\kappa)}` with :math:`\kappa` atoms for every :math:`\kappa = K, K-1, \dots, 1` (a dendrogram), without
refitting.  The rule (Do, Do, McKinley, Terhorst & Nguyen 2024, "Dendrogram of mixing measures", arXiv:2403.01684;
for softmax-gated MoE: Do Tien Hai, Trung Nguyen Mai, TrungTin Nguyen, Ho, Nguyen & Drovandi 2025, "Dendrograms of
mixing measures for softmax-gated Gaussian mixture of experts: consistency without model sweeps", arXiv:2510.12744):

* **dissimilarity** of two atoms, with :math:`\theta = (\beta_1, a, b)` and :math:`\nu = \sigma^2` (the form of
  Do et al. for location-scale Gaussian atoms, as the authors' notes in ``maitrungnguyen/Dendrogram_SGMoE`` state
  it; docs/dendrogram.md lists the variants in their code):

  .. math:: \mathsf d(i, j) = \frac{1}{e^{-\beta_{0i}} + e^{-\beta_{0j}}}
     \Big(\|\theta_i - \theta_j\|^2 + |\nu_i - \nu_j|\Big);

* **merge** of the closest pair: the gate masses add, :math:`e^{\beta_{0*}} = e^{\beta_{0i}} + e^{\beta_{0j}}`
  (so :math:`\beta_{0*} = \log(e^{\beta_{0i}} + e^{\beta_{0j}})`), and every other parameter (gate slope
  :math:`\beta_1`, expert slope :math:`a`, expert intercept :math:`b`, variance :math:`\sigma^2`) is the average
  weighted by :math:`e^{\beta_{0i}}` and :math:`e^{\beta_{0j}}`;
* **height** :math:`h^{(\kappa)}`: the smallest dissimilarity among the atoms of :math:`G^{(\kappa)}`, i.e. the
  height at which the dendrogram goes from :math:`\kappa` to :math:`\kappa - 1` atoms (:math:`\kappa \ge 2`);
* **DSC** (:func:`dsc`): :math:`\mathrm{DSC}(\kappa) = -\big(h^{(\kappa)} + \omega_n\,\bar\ell_n(G^{(\kappa)})\big)`
  with :math:`\bar\ell_n` the average log-likelihood and :math:`\omega_n = \log n` by default; the selected
  number of experts is :math:`\arg\min_{2\le\kappa\le K}\mathrm{DSC}(\kappa)`.

A softmax gate is unchanged by a common shift :math:`(t_0, t_1)` of every :math:`(\beta_{0i}, \beta_{1i})`.  The
merge commutes with such a shift, and the slope differences in :math:`\mathsf d` do not see :math:`t_1`, but
:math:`t_0` multiplies every height by :math:`e^{t_0}`.  With ``normalize="total"`` (default) the heights are
computed with the gate masses divided by their total :math:`S = \sum_i e^{\beta_{0i}}` (which merging preserves),
so they do not depend on the representative or on which expert is the reference; ``normalize="none"`` uses the
masses as given (the authors' code, on fits in the last-expert reference).  With a gate temperature
:math:`\tau`, every formula applies to the effective logits :math:`(\beta_1^\top x + \beta_0)/\tau`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ._torch import to_numpy
from .model import MoE
from .params import Params
from .report import Result

__all__ = ["Dendrogram", "dissimilarity", "dsc", "merge_atoms", "mixing_dendrogram"]

NORMALIZE = ("total", "none")
"""Scalings of the gate masses in the heights: divided by their total (default) or as given."""

_EXPERTS = ("linear", "constant")


# --------------------------------------------------------------------------------------------- validation
def _check_spec(spec: Any, *, where: str) -> MoE:
    """The spec must be a softmax-gated Gaussian MoE with linear (or constant) experts."""
    if not isinstance(spec, MoE):
        raise TypeError(f"{where}: spec must be a moestat.MoE, got {type(spec).__name__}; "
                        "e.g. spec=ms.MoE(gate='softmax', expert='linear', k=4, d=1).")
    if spec.gate != "softmax":
        raise ValueError(f"{where}: spec.gate={spec.gate!r} is not supported; the dendrogram merge adds the masses "
                         "exp(gate intercept) of a softmax gate, which no other gate has. Fit with gate='softmax'.")
    if spec.expert not in _EXPERTS:
        raise ValueError(f"{where}: spec.expert={spec.expert!r} is not supported; atoms are merged by averaging "
                         f"the expert parameters, which keeps the model only for experts linear in x: use one of "
                         f"{list(_EXPERTS)}.")
    if spec.response != "gaussian":
        raise ValueError(f"{where}: spec.response={spec.response!r} is not supported; the dissimilarity uses each "
                         "expert's noise variance, so the experts must be Gaussian (response='gaussian').")
    return spec


def _check_params(params: Any, *, where: str) -> Params:
    if not isinstance(params, Params):
        raise TypeError(f"{where}: params must be a moestat.Params, got {type(params).__name__}; pass fit.params "
                        "of a moestat.fit_mle fit.")
    if params.noise_sd is None:
        raise ValueError(f"{where}: params.noise_sd is None, but every atom needs its noise sd (the variance is an "
                         "atom parameter that is merged). Pass the Params of a Gaussian MoE fit (moestat.fit_mle "
                         "estimates it) or build Params(..., noise_sd=[...]).")
    return params.numpy()


def _check_normalize(normalize: Any) -> str:
    if not isinstance(normalize, str) or normalize not in NORMALIZE:
        raise ValueError(f"normalize={normalize!r} is not supported; valid values are {list(NORMALIZE)} "
                         "('total': gate masses divided by their sum; 'none': as given).")
    return normalize


# ------------------------------------------------------------------------------------------ atom algebra
@dataclass(frozen=True)
class _Atoms:
    """The atoms of one unbatched measure in effective (temperature-divided) coordinates."""

    log_mass: np.ndarray  # (k,)   beta_0 / tau
    gate_slope: np.ndarray  # (k, d) beta_1 / tau
    expert_slope: np.ndarray  # (k, d) a
    expert_bias: np.ndarray  # (k,)  b
    variance: np.ndarray  # (k,)  sigma^2

    @classmethod
    def from_params(cls, p: Params, temperature: float) -> _Atoms:
        assert p.noise_sd is not None
        return cls(np.asarray(p.gate_bias, float) / temperature, np.asarray(p.gate_weight, float) / temperature,
                   np.asarray(p.expert_weight, float), np.asarray(p.expert_bias, float),
                   np.asarray(p.noise_sd, float) ** 2)

    def to_params(self, temperature: float) -> Params:
        return Params(temperature * self.log_mass, temperature * self.gate_slope, self.expert_slope.copy(),
                      self.expert_bias.copy(), np.sqrt(self.variance))

    @property
    def theta(self) -> np.ndarray:
        """(k, 2d + 1): gate slope, expert slope, expert intercept."""
        return np.concatenate([self.gate_slope, self.expert_slope, self.expert_bias[:, None]], axis=1)


def _pair_distance(atoms: _Atoms, log_scale: float) -> np.ndarray:
    """(k, k) matrix of :math:`\\mathsf d(i, j)`, masses divided by :math:`e^{\\text{log\\_scale}}`; +inf on the
    diagonal."""
    lm = atoms.log_mass - log_scale
    harmonic = np.exp(lm[:, None] + lm[None, :] - np.logaddexp(lm[:, None], lm[None, :]))
    theta = atoms.theta
    sq = ((theta[:, None, :] - theta[None, :, :]) ** 2).sum(-1)
    out: np.ndarray = harmonic * (sq + np.abs(atoms.variance[:, None] - atoms.variance[None, :]))
    np.fill_diagonal(out, np.inf)
    return out


def _merge_pair(atoms: _Atoms, i: int, j: int) -> _Atoms:
    """Merge atoms ``i < j``: the result sits at position ``i``; ``j`` is removed."""
    total = np.logaddexp(atoms.log_mass[i], atoms.log_mass[j])
    wi, wj = math.exp(atoms.log_mass[i] - total), math.exp(atoms.log_mass[j] - total)
    keep = [m for m in range(len(atoms.log_mass)) if m != j]

    def combine(a: np.ndarray) -> np.ndarray:
        out = a.copy()
        out[i] = wi * a[i] + wj * a[j]
        kept: np.ndarray = out[keep]
        return kept

    log_mass = atoms.log_mass.copy()
    log_mass[i] = total
    return _Atoms(log_mass[keep], combine(atoms.gate_slope), combine(atoms.expert_slope),
                  combine(atoms.expert_bias), combine(atoms.variance))


def dissimilarity(params: Params, *, temperature: float = 1.0, normalize: str = "total") -> np.ndarray:
    r"""Pairwise dissimilarities :math:`\mathsf d(i, j)` of the atoms of one (unbatched) softmax-gated Gaussian MoE.

    .. math:: \mathsf d(i, j) = \frac{1}{1/m_i + 1/m_j}\Big(\|\beta_{1i} - \beta_{1j}\|^2 + \|a_i - a_j\|^2
       + (b_i - b_j)^2 + |\sigma_i^2 - \sigma_j^2|\Big),
       \qquad m_i = e^{\beta_{0i}/\tau} / S,

    with :math:`S = \sum_l e^{\beta_{0l}/\tau}` (``normalize="total"``) or :math:`S = 1` (``"none"``), and gate
    parameters divided by the temperature :math:`\tau`.  This is the dissimilarity of Do et al. (2024,
    arXiv:2403.01684) for a location-scale Gaussian atom (squared distance of the location parameters plus the
    distance of the variances), with the softmax masses :math:`e^{\beta_{0i}}` as weights, as in Do Tien Hai
    et al. (2025, arXiv:2510.12744).

    Returns
    -------
    ndarray, shape (k, k)
        Symmetric, ``inf`` on the diagonal.
    """
    p = _check_params(params, where="dissimilarity")
    if p.is_batched:
        raise ValueError("dissimilarity needs unbatched params; pass params.select(rep) for one replicate.")
    tau = _check_temperature(temperature)
    atoms = _Atoms.from_params(p, tau)
    return _pair_distance(atoms, _log_scale(atoms, _check_normalize(normalize)))


def merge_atoms(params: Params, i: int, j: int, *, temperature: float = 1.0) -> Params:
    r"""Merge atoms ``i`` and ``j`` of one (unbatched) softmax-gated Gaussian MoE into one atom.

    With :math:`m_i = e^{\beta_{0i}/\tau}` and :math:`w_i = m_i / (m_i + m_j)`:

    .. math:: \beta_{0*} = \tau\log(m_i + m_j),\quad \beta_{1*} = w_i\beta_{1i} + w_j\beta_{1j},\quad
       a_* = w_i a_i + w_j a_j,\quad b_* = w_i b_i + w_j b_j,\quad \sigma_*^2 = w_i\sigma_i^2 + w_j\sigma_j^2

    (the merge of Do et al. 2024 with softmax masses, Do Tien Hai et al. 2025).  The gate masses add, so the gate
    weights of the other atoms are unchanged; if atoms ``i`` and ``j`` differ only in :math:`\beta_0`, the density
    is unchanged.  The merged atom takes position ``min(i, j)``; the other atoms keep their order.
    """
    p = _check_params(params, where="merge_atoms")
    if p.is_batched:
        raise ValueError("merge_atoms needs unbatched params; pass params.select(rep) for one replicate.")
    k = p.k
    for name, v in (("i", i), ("j", j)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < k:
            raise ValueError(f"{name}={v!r} is not an atom index of params with k={k}; use 0 <= {name} < {k}.")
    if i == j:
        raise ValueError(f"i and j must be two different atoms, got i = j = {i}.")
    tau = _check_temperature(temperature)
    lo, hi = sorted((int(i), int(j)))
    return _merge_pair(_Atoms.from_params(p, tau), lo, hi).to_params(tau)


def _check_temperature(temperature: Any) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}; use the spec's "
                         "temperature (1.0 = none).")
    return float(temperature)


def _log_scale(atoms: _Atoms, normalize: str) -> float:
    if normalize == "none":
        return 0.0
    top = float(atoms.log_mass.max())
    return top + math.log(float(np.exp(atoms.log_mass - top).sum()))


# -------------------------------------------------------------------------------------------- dendrogram
@dataclass(frozen=True)
class _Tree:
    """The dendrogram of one replicate."""

    levels: dict[int, Params]
    heights: np.ndarray  # (K-1,) in merge order
    linkage: np.ndarray  # (K-1, 4) scipy linkage
    members: dict[int, tuple[tuple[int, ...], ...]]  # level -> leaves of each atom


def _build(p: Params, temperature: float, normalize: str) -> _Tree:
    atoms = _Atoms.from_params(p, temperature)
    log_scale = _log_scale(atoms, normalize)
    K = p.k
    levels = {K: atoms.to_params(temperature)}
    members: list[tuple[int, ...]] = [(i,) for i in range(K)]
    ids = list(range(K))
    all_members = {K: tuple(members)}
    heights, rows = [], []
    for step in range(K - 1):
        dist = _pair_distance(atoms, log_scale)
        flat = int(np.argmin(dist))  # first minimum in row-major order: ties go to the smallest (i, j)
        i, j = divmod(flat, dist.shape[0])
        i, j = min(i, j), max(i, j)
        h = float(dist[i, j])
        atoms = _merge_pair(atoms, i, j)
        merged = tuple(sorted(members[i] + members[j]))
        rows.append([ids[i], ids[j], h, len(merged)])
        heights.append(h)
        members = [merged if m == i else members[m] for m in range(len(members)) if m != j]
        ids = [K + step if m == i else ids[m] for m in range(len(ids)) if m != j]
        levels[K - step - 1] = atoms.to_params(temperature)
        all_members[K - step - 1] = tuple(members)
    linkage = np.asarray(rows, dtype=float).reshape(K - 1, 4)
    return _Tree(levels, np.asarray(heights, dtype=float), linkage, all_members)


@dataclass(frozen=True, eq=False)
class Dendrogram(Result):
    r"""The dendrogram of a mixing measure (:func:`mixing_dendrogram`); a :class:`moestat.report.Result`.

    Attributes
    ----------
    levels : dict[int, Params]
        :math:`\kappa \mapsto G^{(\kappa)}` for :math:`\kappa = K, \dots, 1`; ``levels[K]`` is the input measure.
        Batched (leading axis R) when the input was.  Gate parameters are on the input's scale (not divided by
        the temperature or normalised).
    heights : ndarray, shape (K-1,) or (R, K-1)
        Merge heights in merge order: ``heights[..., s]`` is :math:`h^{(K-s)}`, the height at which the
        dendrogram goes from :math:`K - s` to :math:`K - s - 1` atoms.  Not monotone in general (a merged atom
        can be closer to a third atom than its parts were).
    linkage : ndarray, shape (K-1, 4) or (R, K-1, 4)
        scipy linkage matrix (``scipy.cluster.hierarchy``): merged cluster ids, height, number of leaves; leaves
        are the input atoms ``0..K-1``, the cluster formed at step ``s`` has id ``K + s``.
    members : list of dict
        Per replicate: ``members[r][kappa]`` lists, for each atom of ``levels[kappa]``, the input atoms merged
        into it.
    temperature : float
        The gate temperature the formulas used.
    normalize : {"total", "none"}
        Whether the heights divide the gate masses by their total (see the module docstring).
    """

    levels: dict[int, Params]
    heights: np.ndarray
    linkage: np.ndarray
    members: list[dict[int, tuple[tuple[int, ...], ...]]]
    temperature: float = 1.0
    normalize: str = "total"
    _batched: bool = field(default=False, repr=False)

    @property
    def k_max(self) -> int:
        """Number of atoms :math:`K` of the input measure."""
        return max(self.levels)

    @property
    def is_batched(self) -> bool:
        return self._batched

    @property
    def n_reps(self) -> int | None:
        return len(self.members) if self._batched else None

    def level_height(self, k: int) -> float | np.ndarray:
        r""":math:`h^{(k)}`, the smallest dissimilarity among the atoms of ``levels[k]`` (``NaN`` for ``k = 1``).

        A float, or an array (R,) for a batched dendrogram."""
        K = self.k_max
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= K:
            raise ValueError(f"k={k!r} is not a level of this dendrogram; use 1 <= k <= {K}.")
        if k == 1:
            return np.full(len(self.members), np.nan) if self._batched else math.nan
        h = self.heights[..., K - k]
        return np.asarray(h, dtype=float) if self._batched else float(h)

    def _rep_linkage(self, rep: int) -> np.ndarray:
        if not self._batched:
            if rep != 0:
                raise ValueError(f"rep={rep} is out of range: this dendrogram has one replicate (rep=0).")
            return self.linkage
        R = len(self.members)
        if isinstance(rep, bool) or not isinstance(rep, (int, np.integer)) or not 0 <= rep < R:
            raise ValueError(f"rep={rep!r} is out of range for R={R} replicates; use 0 <= rep < {R}.")
        Z: np.ndarray = self.linkage[rep]
        return Z

    # ------------------------------------------------------------------------------------------- report
    def tidy(self) -> pd.DataFrame:
        """One row per (replicate, merge): ``rep``, ``step`` (1..K-1), ``k_from``, ``k_to``, ``height``, the merged
        cluster ids ``left`` and ``right`` (scipy's numbering), ``n_leaves`` and ``leaves`` (the input atoms in
        the merged atom, e.g. ``"0+2"``)."""
        K = self.k_max
        rows = []
        for r, mem in enumerate(self.members):
            Z = self._rep_linkage(r)
            for s in range(K - 1):
                merged = [m for m in mem[K - s - 1] if m not in mem[K - s]]
                rows.append({"rep": r, "step": s + 1, "k_from": K - s, "k_to": K - s - 1, "height": float(Z[s, 2]),
                             "left": int(Z[s, 0]), "right": int(Z[s, 1]), "n_leaves": int(Z[s, 3]),
                             "leaves": "+".join(str(a) for a in merged[0])})
        cols = ["rep", "step", "k_from", "k_to", "height", "left", "right", "n_leaves", "leaves"]
        return pd.DataFrame(rows, columns=cols)

    def glance(self) -> pd.DataFrame:
        """One row per replicate: ``K``, the largest height, whether the heights are monotone, the settings."""
        rows = []
        for r in range(len(self.members)):
            h = self._rep_linkage(r)[:, 2]
            rows.append({"rep": r, "K": self.k_max, "max_height": float(h.max()) if h.size else math.nan,
                         "monotone": bool(np.all(np.diff(h) >= 0)), "temperature": self.temperature,
                         "normalize": self.normalize})
        return pd.DataFrame(rows)

    def atoms(self) -> pd.DataFrame:
        """Long frame of every level's atoms (:meth:`moestat.Params.to_frame` plus ``level`` and ``leaves``)."""
        parts = []
        for k in sorted(self.levels, reverse=True):
            f = self.levels[k].to_frame()
            f.insert(0, "level", k)
            f["leaves"] = ["+".join(map(str, self.members[r][k][a])) for r, a in zip(f["rep"], f["atom"], strict=True)]
            parts.append(f)
        return pd.concat(parts, ignore_index=True)

    # ------------------------------------------------------------------------------------------- figure
    def plot(self, ax: Any = None, *, rep: int = 0, title: str | None = None) -> Any:
        """Draw the dendrogram of replicate ``rep`` (scipy's ``dendrogram``, in :mod:`moestat.figstyle`'s style).

        Leaves are the input atoms, labelled by index; the vertical axis is the merge height.  Returns ``ax``."""
        import matplotlib.pyplot as plt
        from scipy.cluster.hierarchy import dendrogram as draw

        from . import figstyle

        Z = self._rep_linkage(rep)
        K = self.k_max
        with figstyle.style():
            if ax is None:
                _, ax = plt.subplots(figsize=(figstyle.PAGE_WIDTH_IN, 3.6), layout="constrained")
            if K == 1:
                ax.text(0.5, 0.5, "one atom: nothing to merge", ha="center", va="center", transform=ax.transAxes)
            else:
                draw(Z, ax=ax, labels=[f"atom {i}" for i in range(K)], color_threshold=0.0,
                     above_threshold_color="C0")
            scale = "total gate mass 1" if self.normalize == "total" else "gate masses as fitted"
            figstyle.finish_axes(ax, title=title or f"Dendrogram of the mixing measure (K = {K}, {scale})",
                                 xlabel="fitted atom (expert)", ylabel=r"merge height $h$", raw=True)
        return ax


def mixing_dendrogram(params: Params, spec: MoE | None = None, *, normalize: str = "total") -> Dendrogram:
    r"""The dendrogram of the mixing measure of a fitted softmax-gated Gaussian MoE (merge the closest atoms).

    Starting from the :math:`K` atoms of ``params`` (typically an over-specified :func:`moestat.fit_mle` fit), the
    two atoms with the smallest dissimilarity (:func:`dissimilarity`) are merged (:func:`merge_atoms`: gate masses
    :math:`e^{\beta_0}` add, the other parameters are mass-weighted averages), until one atom is left.  Method of Do,
    Do, McKinley, Terhorst & Nguyen (2024, arXiv:2403.01684) for finite mixtures, adapted to softmax-gated Gaussian
    MoE by Do Tien Hai, Trung Nguyen Mai, TrungTin Nguyen, Ho, Nguyen & Drovandi (2025, arXiv:2510.12744).

    Parameters
    ----------
    params : Params
        The fitted measure, with ``noise_sd``; batched (R, K) params give one dendrogram per replicate (a loop).
    spec : MoE, optional
        Checked when given: softmax gate, linear or constant Gaussian experts, matching ``k`` and ``d``; its
        temperature :math:`\tau` is used (gate parameters divided by :math:`\tau`).  Default: temperature 1.
    normalize : {"total", "none"}
        ``"total"`` (default) divides the gate masses by their sum in the heights, which makes the heights invariant
        to the softmax's common shift of the intercepts; ``"none"`` uses them as given (the authors' code).

    Returns
    -------
    Dendrogram
        ``levels`` (:math:`\kappa \mapsto G^{(\kappa)}`), ``heights``, ``linkage``, ``tidy()``, ``plot()``.

    Raises
    ------
    TypeError
        ``params`` not a :class:`moestat.Params` or ``spec`` not a :class:`moestat.MoE`.
    ValueError
        A gate other than softmax, non-linear or non-Gaussian experts, ``params.noise_sd`` missing, or ``params``
        not matching ``spec``.

    Examples
    --------
    >>> import moestat as ms
    >>> from moestat.dendrogram import mixing_dendrogram, dsc
    >>> spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
    >>> truth = ms.Params([0.0, 0.0], [[3.0], [0.0]], [[1.0], [-1.0]], [2.0, -2.0], noise_sd=[0.3, 0.3])
    >>> data = ms.simulate(spec, truth, n=1000, seed=0, model="mixture")
    >>> fit = ms.fit_mle(spec.with_k(4), data.X[0], data.y[0], seed=1)  # doctest: +SKIP
    >>> tree = mixing_dendrogram(fit.params, spec.with_k(4))  # doctest: +SKIP
    >>> dsc(tree, data.X[0], data.y[0], spec)  # doctest: +SKIP
    """
    p = _check_params(params, where="mixing_dendrogram")
    temperature = 1.0
    if spec is not None:
        _check_spec(spec, where="mixing_dendrogram")
        spec.check_params(p)
        temperature = _check_temperature(spec.temperature)
    normalize = _check_normalize(normalize)
    if not p.is_batched:
        tree = _build(p, temperature, normalize)
        return Dendrogram(tree.levels, tree.heights, tree.linkage, [tree.members], temperature, normalize, False)
    trees = [_build(p.select(r), temperature, normalize) for r in range(int(p.n_reps or 0))]
    levels = {k: Params.stack([t.levels[k] for t in trees]) for k in trees[0].levels}
    K = p.k
    heights = np.stack([t.heights for t in trees]).reshape(len(trees), K - 1)
    linkage = np.stack([t.linkage for t in trees]).reshape(len(trees), K - 1, 4)
    return Dendrogram(levels, heights, linkage, [t.members for t in trees], temperature, normalize, True)


# --------------------------------------------------------------------------------------------------- DSC
def dsc(dendrogram: Dendrogram, X: Any, y: Any, spec: MoE, *, omega: float | None = None) -> pd.DataFrame:
    r"""Dendrogram selection criterion of every level, and the number of experts it selects.

    .. math:: \mathrm{DSC}(\kappa) = -\Big(h^{(\kappa)} + \omega_n\,\bar\ell_n\big(G^{(\kappa)}\big)\Big),
       \qquad \bar\ell_n(G) = \frac1n\sum_{t=1}^n \log p_G(y_t\mid x_t),
       \qquad \hat\kappa = \arg\min_{2\le\kappa\le K}\mathrm{DSC}(\kappa),

    where :math:`h^{(\kappa)}` is the height at which the dendrogram leaves level :math:`\kappa`
    (:meth:`Dendrogram.level_height`) and the log-likelihood is ``spec.with_k(k).loglik(levels[k], X, y)``
    (:meth:`moestat.MoE.loglik`).  Do et al. (2024, arXiv:2403.01684) for mixtures and Do Tien Hai et al. (2025,
    arXiv:2510.12744) for softmax-gated MoE: at levels above the true :math:`\kappa_0` the height tends to zero (two
    fitted atoms of one true expert merge) while the likelihood stays at its maximum; below it the average
    log-likelihood drops by a constant, which :math:`\omega_n \to \infty` amplifies; at :math:`\kappa_0` the height is
    the separation of two true experts.  The default :math:`\omega_n = \log n` is the value the authors' code
    (``maitrungnguyen/Dendrogram_SGMoE``) uses.  Level 1 has no
    height: its row reports the log-likelihood with ``dsc`` NaN and is never selected.

    Parameters
    ----------
    dendrogram : Dendrogram
        From :func:`mixing_dendrogram`.
    X : array, shape (n, d) or (R, n, d)
    y : array, shape (n,) or (R, n)
        The data the measure was fitted to; a batched dendrogram takes one data set per replicate (or one shared).
    spec : MoE
        Softmax gate, linear or constant Gaussian experts, the dendrogram's temperature (any ``k``).
    omega : float, optional
        The weight :math:`\omega_n > 0`; default :math:`\log n`.

    Returns
    -------
    DataFrame
        One row per (replicate, level), levels from K down to 1: ``rep``, ``k``, ``height``, ``loglik`` (summed),
        ``avg_loglik``, ``omega``, ``dsc`` and ``selected`` (True on the chosen level of each replicate).
        ``frame.attrs["best_k"]`` is the chosen k (an int; a list over replicates for a batched dendrogram).

    Raises
    ------
    TypeError, ValueError
        A wrong type, a spec the dendrogram cannot use, a temperature that differs from the dendrogram's, a
        dendrogram with one atom, or ``omega <= 0``.
    """
    if not isinstance(dendrogram, Dendrogram):
        raise TypeError(f"dsc: dendrogram must be a moestat.dendrogram.Dendrogram, got {type(dendrogram).__name__}; "
                        "build it with mixing_dendrogram(fit.params, spec).")
    _check_spec(spec, where="dsc")
    if not math.isclose(spec.temperature, dendrogram.temperature, rel_tol=1e-12):
        raise ValueError(f"dsc: spec.temperature={spec.temperature} differs from the dendrogram's temperature "
                         f"{dendrogram.temperature}; build the dendrogram with the same spec.")
    K = dendrogram.k_max
    if K < 2:
        raise ValueError("dsc: the dendrogram has one atom, so there is no level to choose; fit an over-specified "
                         "model (k >= 2, e.g. spec.with_k(4)) and build its dendrogram.")
    X_shape = tuple(X.shape) if hasattr(X, "shape") else np.shape(X)
    if len(X_shape) not in (2, 3):
        raise ValueError(f"dsc: X must have shape (n, d) or (R, n, d), got shape {X_shape}.")
    n = int(X_shape[-2])
    if n < 1:
        raise ValueError("dsc: X has no observations (n = 0).")
    if omega is None:
        omega = math.log(n)
    elif isinstance(omega, bool) or not isinstance(omega, (int, float)) or not 0 < omega < math.inf:
        raise ValueError(f"dsc: omega={omega!r} must be a finite number > 0 (the weight of the average "
                         "log-likelihood); leave it None for log(n).")
    R = len(dendrogram.members)
    rows = []
    for k in range(K, 0, -1):
        ll = np.asarray(to_numpy(spec.with_k(k).loglik(dendrogram.levels[k], X, y)), dtype=float).reshape(-1)
        if ll.size != R:
            raise ValueError(f"dsc: the log-likelihood has {ll.size} values but the dendrogram has {R} replicate(s); "
                             "pass one data set, or one per replicate (X of shape (R, n, d)).")
        h = np.asarray(dendrogram.level_height(k), dtype=float).reshape(-1)
        for r in range(R):
            crit = -(h[r] + omega * ll[r] / n) if k >= 2 else math.nan
            rows.append({"rep": r, "k": k, "height": h[r], "loglik": ll[r], "avg_loglik": ll[r] / n,
                         "omega": float(omega), "dsc": crit})
    frame = pd.DataFrame(rows).sort_values(["rep", "k"], ascending=[True, False], kind="stable")
    frame = frame.reset_index(drop=True)
    frame["selected"] = False
    best = []
    for r in range(R):
        sub = frame[(frame["rep"] == r) & (frame["k"] >= 2)]
        idx = sub["dsc"].idxmin()
        frame.loc[idx, "selected"] = True
        best.append(int(frame.loc[idx, "k"]))
    frame.attrs["best_k"] = best if dendrogram.is_batched else best[0]
    return frame
