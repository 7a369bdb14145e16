r"""Patch-routing classification data (chowdhury2023, §4.2 and §5.1).

Each sample :math:`x = (x^{(1)}, \dots, x^{(n)})` holds ``n_patches`` patches in
:math:`\mathbb R^d`.  Exactly one patch is *class-discriminative*: :math:`o_1` when
:math:`y = +1` and :math:`o_2` when :math:`y = -1`, at a position uniform on :math:`[n]`,
with :math:`P(y = +1) = 1/2` and no label noise.  The other :math:`n - 1` patches are
*class-irrelevant*: drawn from :math:`p` pattern sets with the same law in both classes.

Two variants:

``variant="synthetic"`` (the paper's data model :math:`\mathcal D`)
    All patterns are unit vectors.  :math:`o_1 = e_1` and
    :math:`o_2 = \delta_d e_1 + \sqrt{1-\delta_d^2}\, e_2`, so :math:`\langle o_1, o_2\rangle = \delta_d`.
    The :math:`p` neutral set centres are random unit vectors orthogonal to
    :math:`\mathrm{span}(o_1, o_2)`.  Optional *confuser* sets (the patches counted by
    :math:`l^*` in Definition D.3) have centres :math:`c_\pm` with
    :math:`\langle o_1, c_\pm\rangle = \pm\delta_r` and :math:`\langle o_2, c_\pm\rangle = \mp\delta_r`,
    i.e. :math:`\langle o_1 - o_2, c_\pm\rangle = \pm 2\delta_r`; each sample carries
    ``n_confusers = (a, b)`` of them in both classes alike.  A set is the spherical cap
    :math:`q = (c + r u)/\sqrt{1 + r^2}` with :math:`u` uniform on the unit sphere of the
    orthogonal complement of :math:`\mathrm{span}(o_1, o_2, c)` and :math:`r` the radius of a
    uniform point in a ball of radius ``set_diameter / 2``; hence :math:`\|q\| = 1`,
    :math:`\|q - c\| \le r` and :math:`|\langle o_i, q\rangle| \le \delta_r` exactly.
    The default diameter is the paper's order :math:`\sqrt{(1-\delta_r^2)/(d p^2)}` (constant 1).

``variant="digits"`` (the real-data variant, after §5.1's MNIST composites)
    Patches are the 8x8 handwritten digits that scikit-learn ships
    (:func:`sklearn.datasets.load_digits`, no download), flattened to :math:`d = 64`:
    a digit "1" is :math:`o_1` (y=+1), a digit "0" is :math:`o_2` (y=-1), digits 2-9 are the
    :math:`p = 8` irrelevant sets (uniform over sets, uniform image within a set).  The images
    are split once (``split_seed``) into a training pool and a disjoint test pool, so test
    samples never reuse a training image.  ``scale="unit"`` normalises each patch to norm 1
    (the theory); ``scale="raw"`` divides pixels by 16 (the paper's code divides by 255).

The paper's :math:`n` (patches per sample) is ``n_patches`` here and its :math:`N` (samples)
is ``n``, matching :func:`moestat.simulate`.  Replicate ``r`` draws from
``default_rng(SeedSequence(seed).spawn(reps)[r])``; the pattern bank (the "truth":
:math:`o_1, o_2` and the set centres) comes from ``bank_seed`` and is shared by all
replicates, so training and test sets drawn with different ``seed`` share one distribution.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from .._validation import (
    Integer,
    Optional,
    Seed,
    check_choice,
    check_int,
    validate_arguments,
)
from ._shapes import ReplicateShapes
from .regression import SeedLike, replicate_seeds

#: ``set_id`` code of the discriminative patch.
DISCRIMINATIVE = -1


@dataclass(frozen=True)
class PatternBank:
    """The patterns that define a synthetic patch distribution.

    Attributes
    ----------
    o1, o2 : ndarray, shape (d,)
        Class-discriminative patterns (unit norm).
    centres : ndarray, shape (p + c, d)
        Centres of the irrelevant sets: rows ``0..p-1`` are neutral sets, then the confuser
        set closer to :math:`o_1` (row ``p``) and the one closer to :math:`o_2` (row ``p+1``)
        when confusers are used.
    diameter : float
        Diameter of every irrelevant set (the radius of the cap is ``diameter / 2``).
    """

    o1: np.ndarray
    o2: np.ndarray
    centres: np.ndarray
    diameter: float


@dataclass(frozen=True)
class PatchData(ReplicateShapes):
    """Patch-classification data for R replicates.

    Attributes
    ----------
    X : ndarray, shape (R, N, n_patches, d)
        Patches; row ``X[r, i, j]`` is :math:`x_i^{(j)}` of replicate ``r``.
    y : ndarray of int, shape (R, N)
        Labels in {+1, -1}.
    pos : ndarray of int, shape (R, N)
        Position :math:`j_{o}` of the discriminative patch.
    set_id : ndarray of int, shape (R, N, n_patches)
        ``-1`` for the discriminative patch, ``0..p-1`` for neutral sets (digits variant:
        digit minus 2), ``p`` / ``p+1`` for the confuser sets closer to :math:`o_1` / :math:`o_2`.
    seeds : list of numpy.random.SeedSequence
        The stream of each replicate.
    info : dict
        Every knob of the generator (variant, n_patches, d, p, delta_d, delta_r, ...).
    bank : PatternBank or None
        The synthetic patterns (None for the digits variant).
    """

    X: np.ndarray
    y: np.ndarray
    pos: np.ndarray
    set_id: np.ndarray
    seeds: list[np.random.SeedSequence]
    info: dict[str, Any] = field(default_factory=dict)
    bank: PatternBank | None = None


    @property
    def n_patches(self) -> int:
        """Number of patches per sample (the paper's n)."""
        return int(self.X.shape[2])

    @property
    def d(self) -> int:
        return int(self.X.shape[3])

    def confuser_counts(self, margin: float | None = None) -> np.ndarray:
        r"""Per-sample number of irrelevant patches in :math:`S_c(\delta')` (Definition D.2).

        A patch :math:`q` counts when :math:`|\langle o_1 - o_2, q\rangle| > \delta'`, with
        :math:`\delta' = (1 - \delta_d)/2` by default (Appendix D).  Synthetic variant only.

        Returns
        -------
        ndarray of int, shape (R, N)
        """
        if self.bank is None:
            raise ValueError("confuser_counts needs the synthetic variant (the digits patterns have no bank).")
        dd = float(self.info["delta_d"])
        margin = (1.0 - dd) / 2.0 if margin is None else float(margin)
        proj = np.abs(self.X @ (self.bank.o1 - self.bank.o2))
        return ((proj > margin) & (self.set_id != DISCRIMINATIVE)).sum(-1)

    def l_star(self, margin: float | None = None) -> int:
        r"""Empirical :math:`l^*` of Definition D.3: one plus the largest confuser count in the sample."""
        return int(self.confuser_counts(margin).max()) + 1

    def to_frame(self) -> pd.DataFrame:
        """Long frame, one row per (rep, sample): label, position of the discriminative patch, seed."""
        R, N = self.y.shape
        return pd.DataFrame({
            "rep": np.repeat(np.arange(R), N),
            "sample": np.tile(np.arange(N), R),
            "y": self.y.ravel(),
            "pos": self.pos.ravel(),
            "variant": self.info.get("variant"),
            "n_patches": self.n_patches,
            "d": self.d,
        })


def delta_of(delta_d: float, delta_r: float) -> float:
    r"""The pattern-separation constant of chowdhury2023 eq. (9): :math:`\delta = 1/(1-\max(\delta_d^2,\delta_r^2))`."""
    return 1.0 / (1.0 - max(delta_d**2, delta_r**2))


def default_set_diameter(d: int, p: int, delta_r: float) -> float:
    r"""The paper's order of the set diameter, :math:`\sqrt{(1-\delta_r^2)/(d p^2)}` (§4.2, constant 1)."""
    return float(np.sqrt((1.0 - delta_r**2) / (d * p**2)))


def _unit_perp(rng: np.random.Generator, d: int, avoid: np.ndarray, size: int) -> np.ndarray:
    """``size`` uniform unit vectors orthogonal to e1, e2 and to the rows of ``avoid`` (orthonormal)."""
    g = rng.standard_normal((size, d))
    g[:, :2] = 0.0
    if avoid.size:
        g -= (g @ avoid.T) @ avoid
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def make_pattern_bank(*, d: int, p: int, delta_d: float, delta_r: float, confusers: bool,
                      set_diameter: float, seed: int | np.random.SeedSequence | None) -> PatternBank:
    r"""Draw :math:`o_1, o_2` and the irrelevant set centres (see the module docstring)."""
    rng = np.random.default_rng(seed)
    o1 = np.zeros(d)
    o1[0] = 1.0
    o2 = np.zeros(d)
    o2[0], o2[1] = delta_d, np.sqrt(1.0 - delta_d**2)
    centres = [_unit_perp(rng, d, np.empty((0, d)), p)]
    if confusers:
        v = (o1 - o2) / np.linalg.norm(o1 - o2)  # <o1, v> = -<o2, v> = sqrt((1 - delta_d)/2)
        s = delta_r / np.sqrt((1.0 - delta_d) / 2.0)
        w = _unit_perp(rng, d, np.empty((0, d)), 2)
        centres.append(np.stack([s * v + np.sqrt(1 - s**2) * w[0], -s * v + np.sqrt(1 - s**2) * w[1]]))
    return PatternBank(o1, o2, np.concatenate(centres), float(set_diameter))


def _sample_sets(rng: np.random.Generator, bank: PatternBank, ids: np.ndarray) -> np.ndarray:
    """One point of set ``ids[...]`` for every entry: the cap (c + r u) / sqrt(1 + r^2)."""
    d = bank.o1.shape[0]
    flat = ids.ravel()
    c = bank.centres[flat]
    # orthonormal part of each centre outside span(e1, e2); u must avoid it to stay orthogonal to c
    c_perp = c.copy()
    c_perp[:, :2] = 0.0
    c_perp /= np.linalg.norm(c_perp, axis=1, keepdims=True)
    g = rng.standard_normal((flat.size, d))
    g[:, :2] = 0.0
    g -= np.sum(g * c_perp, axis=1, keepdims=True) * c_perp
    u = g / np.linalg.norm(g, axis=1, keepdims=True)
    dim = d - 3
    r = (bank.diameter / 2.0) * rng.uniform(size=(flat.size, 1)) ** (1.0 / dim)
    q = (c + r * u) / np.sqrt(1.0 + r**2)
    return q.reshape(*ids.shape, d)


@lru_cache(maxsize=4)
def _digit_pools(scale: str, split_seed: int, train_fraction: float) -> dict[str, dict[int, np.ndarray]]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    data = digits.data.astype(np.float64)
    if scale == "unit":
        data = data / np.linalg.norm(data, axis=1, keepdims=True)
    else:
        data = data / 16.0
    rng = np.random.default_rng(split_seed)
    pools: dict[str, dict[int, np.ndarray]] = {"train": {}, "test": {}}
    for k in range(10):
        idx = rng.permutation(np.flatnonzero(digits.target == k))
        cut = round(train_fraction * idx.size)
        pools["train"][k] = data[idx[:cut]]
        pools["test"][k] = data[idx[cut:]]
    return pools


@validate_arguments(n=Integer(1), reps=Optional(Integer(1)), seed=Seed())
def simulate_patches(n: int, reps: int | None = None, seed: SeedLike = None, *, variant: str = "synthetic",
                     n_patches: int = 16, d: int = 64, p: int = 8, delta_d: float = 0.0, delta_r: float = 0.3,
                     set_diameter: float | None = None, n_confusers: tuple[int, int] | int = (0, 0),
                     bank_seed: int = 0, split: str = "train", scale: str = "unit", split_seed: int = 0,
                     train_fraction: float = 0.7, balanced: bool = False, l: int | None = None) -> PatchData:
    r"""Simulate R replicate data sets of ``n`` patch-classification samples (chowdhury2023).

    Parameters
    ----------
    n : int
        Samples per replicate (the paper's :math:`N`).
    reps : int, optional
        Number of replicates (default 1, or the number of seed sequences given).
    seed : int, SeedSequence or list of SeedSequence
        Master seed; replicate r uses ``SeedSequence(seed).spawn(reps)[r]``.
    variant : {"synthetic", "digits"}
        The paper's unit-norm data model, or patches cut from scikit-learn's 8x8 digits.
    n_patches : int
        Patches per sample (the paper's :math:`n`), at least 2.
    d : int
        Patch dimension (synthetic; the digits variant has d = 64).  Needs ``d >= 4 + p``-ish room:
        at least 4.
    p : int
        Number of neutral irrelevant sets (synthetic; the digits variant has p = 8).
    delta_d : float
        :math:`\langle o_1, o_2\rangle \in (-1, 1)`.
    delta_r : float
        Bound on :math:`|\langle o_i, q\rangle|` for irrelevant :math:`q`, in [0, 1); confuser sets
        attain it.  Confusers need :math:`2\delta_r > (1-\delta_d)/2` to count in Definition D.3.
    set_diameter : float, optional
        Diameter of each irrelevant set (default :func:`default_set_diameter`).
    n_confusers : int or (int, int)
        Per-sample number of confuser patches closer to :math:`o_1` and to :math:`o_2`
        (same in both classes; an int means the same number on each side).
    bank_seed : int
        Seed of the pattern bank (synthetic), shared across replicates and across train/test draws.
    split : {"train", "test"}
        Digits variant: draw images from the training or the disjoint test pool.
    scale : {"unit", "raw"}
        Digits variant: unit-norm patches (theory) or pixels / 16.
    split_seed, train_fraction : int, float
        Digits variant: the fixed random split of each digit's images into the two pools.
    balanced : bool
        False (the theory): i.i.d. labels with :math:`P(y=+1) = 1/2`.  True (the authors' code,
        N/2 per class): labels come in random pairs (+1, -1) or (-1, +1), so every even-length
        prefix of a replicate — every nested training size — is exactly balanced.  With i.i.d.
        labels the separate router of loss (6) picks up :math:`(n-1)\bar y` times the mean
        irrelevant pattern, which can push one class's discriminative patch out of the top-l.
    l : int, optional
        If given, checked against ``n_patches`` (``l < n_patches`` is required by expert-choice
        top-l routing); convenient for validating a whole configuration at once.

    Returns
    -------
    PatchData
        ``X (R, n, n_patches, d)``, ``y (R, n)`` in {+1, -1}, ``pos``, ``set_id``, ``seeds``, ``info``.

    Examples
    --------
    >>> import moestat as ms
    >>> data = ms.simulate_patches(200, reps=3, seed=1, n_patches=16, d=32)
    >>> data.X.shape, sorted(set(data.y.ravel().tolist()))
    ((3, 200, 16, 32), [-1, 1])
    """
    n = check_int("n", n)
    check_choice("variant", variant, ("synthetic", "digits"))
    n_patches = check_int("n_patches", n_patches, minimum=2)
    if l is not None:
        l = check_int("l", l)
        if l >= n_patches:
            raise ValueError(f"l={l} must be smaller than n_patches={n_patches}: expert-choice routing keeps the "
                             "top-l of the n patches; lower l or use more patches.")
    if isinstance(n_confusers, numbers.Integral) and not isinstance(n_confusers, bool):
        n_confusers = (int(n_confusers), int(n_confusers))
    if (not isinstance(n_confusers, (tuple, list)) or len(n_confusers) != 2
            or any(isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 0 for c in n_confusers)):
        raise ValueError(f"n_confusers must be a non-negative int or a pair (closer to o1, closer to o2), "
                         f"got {n_confusers!r}.")
    n_conf = (int(n_confusers[0]), int(n_confusers[1]))
    seeds = replicate_seeds(seed, reps)
    rngs = [np.random.default_rng(s) for s in seeds]
    if variant == "digits":
        if n_conf != (0, 0):
            raise ValueError("n_confusers applies to the synthetic variant only; the digits variant has none.")
        return _simulate_digits(n, n_patches, seeds, rngs, split=split, scale=scale, split_seed=split_seed,
                                train_fraction=train_fraction, balanced=bool(balanced))

    d = check_int("d", d, minimum=4)
    p = check_int("p", p)
    if not -1.0 < delta_d < 1.0:
        raise ValueError(f"delta_d must lie in (-1, 1), got {delta_d}.")
    if not 0.0 <= delta_r < 1.0:
        raise ValueError(f"delta_r must lie in [0, 1), got {delta_r}.")
    if sum(n_conf) > n_patches - 1:
        raise ValueError(f"n_confusers={n_conf} leaves no room: at most n_patches - 1 = {n_patches - 1} "
                         "irrelevant patches per sample.")
    if sum(n_conf) and delta_r / np.sqrt((1.0 - delta_d) / 2.0) >= 1.0:
        raise ValueError(f"delta_r={delta_r} is infeasible for confusers with delta_d={delta_d}: need "
                         f"delta_r < sqrt((1 - delta_d)/2) = {np.sqrt((1 - delta_d) / 2):.4f}.")
    diam = default_set_diameter(d, p, delta_r) if set_diameter is None else float(set_diameter)
    if not np.isfinite(diam) or diam < 0:
        raise ValueError(f"set_diameter must be a finite non-negative number, got {set_diameter}.")
    bank = make_pattern_bank(d=d, p=p, delta_d=delta_d, delta_r=delta_r, confusers=sum(n_conf) > 0,
                             set_diameter=diam, seed=bank_seed)
    R = len(seeds)
    X = np.empty((R, n, n_patches, d))
    y = np.empty((R, n), dtype=np.int64)
    pos = np.empty((R, n), dtype=np.int64)
    set_id = np.empty((R, n, n_patches), dtype=np.int64)
    n_neutral = n_patches - 1 - sum(n_conf)
    for r, g in enumerate(rngs):
        y[r] = _labels(g, n, balanced)
        irr = np.concatenate([g.integers(0, p, size=(n, n_neutral)),
                              np.full((n, n_conf[0]), p), np.full((n, n_conf[1]), p + 1)], axis=1)
        irr = g.permuted(irr, axis=1)  # exchangeable positions for the irrelevant patches
        pos[r] = g.integers(0, n_patches, size=n)
        ids = _insert(irr, pos[r], DISCRIMINATIVE)
        set_id[r] = ids
        Xr = np.zeros((n, n_patches, d))
        mask = ids != DISCRIMINATIVE
        Xr[mask] = _sample_sets(g, bank, ids[mask])
        Xr[~mask] = np.where((y[r] == 1)[:, None], bank.o1, bank.o2)
        X[r] = Xr
    info = {"variant": "synthetic", "n": n, "n_patches": n_patches, "d": d, "p": p, "delta_d": float(delta_d),
            "delta_r": float(delta_r), "delta": delta_of(delta_d, delta_r), "set_diameter": diam,
            "n_confusers": list(n_conf), "bank_seed": bank_seed, "position": "uniform", "class_prior": 0.5,
            "balanced": bool(balanced)}
    return PatchData(X, y, pos, set_id, seeds, info, bank)


def _labels(g: np.random.Generator, n: int, balanced: bool) -> np.ndarray:
    """i.i.d. fair labels, or random (+1, -1) / (-1, +1) pairs (balanced even-length prefixes)."""
    if not balanced:
        return np.where(g.uniform(size=n) < 0.5, 1, -1)
    first = np.where(g.uniform(size=(n + 1) // 2) < 0.5, 1, -1)
    return np.stack([first, -first], axis=1).ravel()[:n]


def _insert(irr: np.ndarray, pos: np.ndarray, value: int) -> np.ndarray:
    """Insert ``value`` into row i of ``irr`` (N, n-1) at column ``pos[i]`` -> (N, n)."""
    m = irr.shape[1]
    cols = np.arange(m + 1)[None, :]
    src = cols - (cols > pos[:, None])
    out = np.take_along_axis(irr, np.clip(src, 0, m - 1), axis=1)
    out[cols == pos[:, None]] = value
    return out


def _simulate_digits(n: int, n_patches: int, seeds: list, rngs: list, *, split: str, scale: str,
                     split_seed: int, train_fraction: float, balanced: bool) -> PatchData:
    check_choice("split", split, ("train", "test"))
    check_choice("scale", scale, ("unit", "raw"))
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must lie in (0, 1), got {train_fraction}.")
    pools = _digit_pools(scale, int(split_seed), float(train_fraction))[split]
    R, d, p = len(seeds), 64, 8
    X = np.empty((R, n, n_patches, d))
    y = np.empty((R, n), dtype=np.int64)
    pos = np.empty((R, n), dtype=np.int64)
    set_id = np.empty((R, n, n_patches), dtype=np.int64)
    for r, g in enumerate(rngs):
        y[r] = _labels(g, n, balanced)
        irr = g.integers(0, p, size=(n, n_patches - 1))
        pos[r] = g.integers(0, n_patches, size=n)
        ids = _insert(irr, pos[r], DISCRIMINATIVE)
        set_id[r] = ids
        digit = np.where(ids == DISCRIMINATIVE, np.where(y[r] == 1, 1, 0)[:, None], ids + 2)
        for k in range(10):
            sel = digit == k
            if sel.any():
                X[r][sel] = pools[k][g.integers(0, pools[k].shape[0], size=int(sel.sum()))]
    info = {"variant": "digits", "n": n, "n_patches": n_patches, "d": d, "p": p, "scale": scale, "split": split,
            "split_seed": split_seed, "train_fraction": train_fraction, "disc_digits": [1, 0],
            "irrelevant_digits": list(range(2, 10)), "position": "uniform", "class_prior": 0.5,
            "balanced": balanced}
    return PatchData(X, y, pos, set_id, seeds, info, None)
