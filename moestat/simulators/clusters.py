r"""Clustered-patch classification data (chen2022, Definition 3.1).

An example is :math:`x = (x^{(1)},\dots,x^{(P)}) \in (\mathbb R^d)^P` with label :math:`y \in \{\pm1\}`.
There are :math:`K` clusters, each with a unit *feature signal* :math:`v_k` and a unit *cluster-centre
signal* :math:`c_k`; the :math:`2K` vectors :math:`\{v_k\} \cup \{c_k\}` are orthonormal (so
:math:`d \ge 2K`).  One draw:

1. an ordered pair :math:`(k, k')`, :math:`k \ne k'`, uniform over the :math:`K(K-1)` pairs;
2. :math:`y` and :math:`\varepsilon` independent Rademacher signs;
3. strengths :math:`\alpha \sim \mathcal D_\alpha`, :math:`\beta \sim \mathcal D_\beta`,
   :math:`\gamma \sim \mathcal D_\gamma` (uniform laws in the paper's experiments);
4. patches: one feature signal :math:`y\alpha v_k`, one cluster centre :math:`\beta c_k`, one feature
   noise :math:`\varepsilon\gamma v_{k'}` and :math:`P-3` Gaussian noise patches
   :math:`\xi \sim N(0, \sigma_p^2/d\, I_d)`, in a uniformly shuffled order (App. A.2).

The presets are the paper's four synthetic settings (Table 3, App. A.2): :math:`K=4`, :math:`P=4`,
:math:`d=50`, :math:`\alpha \sim U(0.5,2)`, :math:`\beta \sim U(1,2)` and

========  ======================  ==============
setting   :math:`\gamma`          :math:`\sigma_p`
========  ======================  ==============
1         :math:`U(0.5, 3)`       1
2         :math:`U(0.5, 3)`       2
3         :math:`U(0.5, 2)`       1
4         :math:`U(0.5, 2)`       2
========  ======================  ==============

Only settings 3 and 4 satisfy :math:`\mathcal D_\alpha = \mathcal D_\gamma`, the hypothesis of
Theorem 4.1 (the 87.5% ceiling for patch-additive predictors).

Replicate ``r`` draws its signals and its data from its own stream
``default_rng(SeedSequence(seed).spawn(R)[r])``.  Train and test sets must share the signals: simulate
``n_train + n_test`` examples at once and call :meth:`ClusterData.split`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace
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

#: Patch roles recorded in :attr:`ClusterData.roles`.
ROLE_FEATURE, ROLE_CENTER, ROLE_FEATURE_NOISE, ROLE_NOISE = 0, 1, 2, 3
ROLE_NAMES = ("feature", "center", "feature_noise", "noise")

Strength = float | tuple[float, float]

#: The paper's synthetic settings (chen2022 Table 3 / App. A.2).
SETTINGS: dict[int, dict[str, Any]] = {
    1: dict(K=4, P=4, d=50, alpha=(0.5, 2.0), beta=(1.0, 2.0), gamma=(0.5, 3.0), sigma_p=1.0),
    2: dict(K=4, P=4, d=50, alpha=(0.5, 2.0), beta=(1.0, 2.0), gamma=(0.5, 3.0), sigma_p=2.0),
    3: dict(K=4, P=4, d=50, alpha=(0.5, 2.0), beta=(1.0, 2.0), gamma=(0.5, 2.0), sigma_p=1.0),
    4: dict(K=4, P=4, d=50, alpha=(0.5, 2.0), beta=(1.0, 2.0), gamma=(0.5, 2.0), sigma_p=2.0),
}

#: Size used by the paper for every synthetic setting (n_train = n_test = 16,000).
PAPER_N_TRAIN = 16_000
PAPER_N_TEST = 16_000


@dataclass(frozen=True)
class ClusterConfig:
    """The law of Definition 3.1.  Strengths are ``(low, high)`` uniform ranges or constants."""

    K: int = 4
    P: int = 4
    d: int = 50
    alpha: tuple[float, float] = (0.5, 2.0)
    beta: tuple[float, float] = (1.0, 2.0)
    gamma: tuple[float, float] = (0.5, 3.0)
    sigma_p: float = 1.0
    shuffle: bool = True
    basis: str = "random"
    noise_scale: float = 1.0
    setting: int | None = None

    @property
    def alpha_gamma_equal(self) -> bool:
        """Whether :math:`\\mathcal D_\\alpha = \\mathcal D_\\gamma` (the hypothesis of Theorem 4.1)."""
        return tuple(self.alpha) == tuple(self.gamma)

    def as_dict(self) -> dict[str, Any]:
        return {"K": self.K, "P": self.P, "d": self.d, "alpha": list(self.alpha), "beta": list(self.beta),
                "gamma": list(self.gamma), "sigma_p": self.sigma_p, "shuffle": self.shuffle, "basis": self.basis,
                "noise_scale": self.noise_scale, "setting": self.setting}


@dataclass(frozen=True)
class ClusterData(ReplicateShapes):
    """Clustered-patch data for ``R`` replicates (chen2022 Def. 3.1).

    Attributes
    ----------
    X : ndarray, shape (R, n, P, d)
        Patches.
    y : ndarray of int, shape (R, n)
        Labels in {-1, +1}.
    cluster, noise_cluster : ndarray of int, shape (R, n)
        :math:`k` (0-based cluster of the centre and feature signal) and :math:`k'` (cluster of the
        feature noise), :math:`k \\ne k'`.
    eps : ndarray of int, shape (R, n)
        Sign of the feature noise.
    alpha, beta, gamma : ndarray, shape (R, n)
        Strengths.
    roles : ndarray of int, shape (R, n, P)
        Role of each patch: 0 feature, 1 centre, 2 feature noise, 3 Gaussian noise.
    V, C : ndarray, shape (R, K, d)
        Feature and centre signals of each replicate (rows orthonormal together).
    config : ClusterConfig
    seeds : list of numpy.random.SeedSequence
    """

    X: np.ndarray
    y: np.ndarray
    cluster: np.ndarray
    noise_cluster: np.ndarray
    eps: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    gamma: np.ndarray
    roles: np.ndarray
    V: np.ndarray
    C: np.ndarray
    config: ClusterConfig
    seeds: list[np.random.SeedSequence] = field(repr=False)


    def _take(self, sl: slice) -> ClusterData:
        per_obs = {k: getattr(self, k)[:, sl] for k in
                   ("X", "y", "cluster", "noise_cluster", "eps", "alpha", "beta", "gamma", "roles")}
        return replace(self, **per_obs)

    def split(self, n_train: int) -> tuple[ClusterData, ClusterData]:
        """The first ``n_train`` examples and the rest (both keep the same signals)."""
        n_train = check_int("n_train", n_train)
        if n_train >= self.n:
            raise ValueError(f"n_train={n_train} must be smaller than n={self.n} to leave a test set.")
        return self._take(slice(0, n_train)), self._take(slice(n_train, None))

    def select(self, rep: int) -> ClusterData:
        """Replicate ``rep`` as a one-replicate ClusterData."""
        sl = slice(rep, rep + 1) if rep != -1 else slice(-1, None)
        fields = {k: getattr(self, k)[sl] for k in
                  ("X", "y", "cluster", "noise_cluster", "eps", "alpha", "beta", "gamma", "roles", "V", "C")}
        return replace(self, seeds=[self.seeds[rep]], **fields)

    def patch_sum(self) -> np.ndarray:
        """:math:`s(x) = \\sum_p x^{(p)}`, shape (R, n, d): what the router sees."""
        return self.X.sum(axis=2)

    def to_frame(self) -> pd.DataFrame:
        """One row per (rep, obs): latent structure and label (patches omitted; use ``X``)."""
        R, n = self.y.shape
        return pd.DataFrame({
            "rep": np.repeat(np.arange(R), n), "obs": np.tile(np.arange(n), R), "y": self.y.ravel(),
            "cluster": self.cluster.ravel(), "noise_cluster": self.noise_cluster.ravel(), "eps": self.eps.ravel(),
            "alpha": self.alpha.ravel(), "beta": self.beta.ravel(), "gamma": self.gamma.ravel(),
        })


def _check_strength(name: str, value: Any) -> tuple[float, float]:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        lo = hi = float(value)
    else:
        try:
            lo, hi = (float(v) for v in value)
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be a positive number or a (low, high) uniform range, "
                            f"got {value!r}.") from None
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo <= 0 or hi < lo:
        raise ValueError(f"{name}={value!r} must satisfy 0 < low <= high (Def. 3.1 needs positive strengths).")
    return lo, hi


def cluster_config(setting: int | None = None, **overrides: Any) -> ClusterConfig:
    """Build and validate a :class:`ClusterConfig` from a paper setting (1-4) and/or explicit values."""
    base: dict[str, Any] = {}
    if setting is not None:
        if isinstance(setting, bool) or not isinstance(setting, numbers.Integral) or int(setting) not in SETTINGS:
            raise ValueError(f"setting={setting!r} is not a paper setting; use 1, 2, 3 or 4 (chen2022 Table 3) "
                             "or None with explicit K, P, d, alpha, beta, gamma, sigma_p.")
        base = dict(SETTINGS[int(setting)], setting=int(setting))
    unknown = set(overrides) - set(ClusterConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown parameters {sorted(unknown)}; valid ones are "
                        f"{sorted(ClusterConfig.__dataclass_fields__)}.")
    base.update({k: v for k, v in overrides.items() if v is not None})
    if overrides and setting is not None and any(k in SETTINGS[int(setting)] for k in overrides
                                                 if overrides[k] is not None):
        base["setting"] = None  # a modified preset is no longer the paper's setting
    K = check_int("K", base.get("K", 4), minimum=2)
    P = base.get("P", 4)
    if isinstance(P, numbers.Integral) and not isinstance(P, bool) and P < 4:
        raise ValueError(f"P={P} patches is too few: Def. 3.1 needs a feature, a centre, a feature-noise patch and "
                         "at least one Gaussian noise patch, so P >= 4.")
    P = check_int("P", P, minimum=4)
    d = check_int("d", base.get("d", 50), minimum=1)
    if d < 2 * K:
        raise ValueError(f"d={d} < 2K={2 * K}: the 2K signals v_k, c_k must be orthonormal, so use d >= 2K.")
    sigma_p = base.get("sigma_p", 1.0)
    if not isinstance(sigma_p, numbers.Real) or isinstance(sigma_p, bool) or not np.isfinite(sigma_p) or sigma_p < 0:
        raise ValueError(f"sigma_p={sigma_p!r} must be a finite number >= 0 (noise patches are N(0, sigma_p^2/d I)).")
    noise_scale = float(base.get("noise_scale", 1.0))
    if not np.isfinite(noise_scale) or noise_scale < 0:
        raise ValueError(f"noise_scale={noise_scale!r} must be a finite number >= 0.")
    basis = check_choice("basis", base.get("basis", "random"), ("random", "canonical"))
    return ClusterConfig(K=K, P=P, d=d, alpha=_check_strength("alpha", base.get("alpha", (0.5, 2.0))),
                         beta=_check_strength("beta", base.get("beta", (1.0, 2.0))),
                         gamma=_check_strength("gamma", base.get("gamma", (0.5, 3.0))), sigma_p=float(sigma_p),
                         shuffle=bool(base.get("shuffle", True)), basis=basis, noise_scale=noise_scale,
                         setting=base.get("setting"))


def make_signals(rng: np.random.Generator, K: int, d: int, basis: str = "random") -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal ``V`` (K, d) and ``C`` (K, d): a Haar-random frame (QR of a Gaussian) or canonical vectors."""
    if basis == "canonical":
        E = np.eye(d)[: 2 * K]
    else:
        Q, R = np.linalg.qr(rng.standard_normal((d, 2 * K)))
        E = (Q * np.sign(np.diag(R))).T  # sign fix makes the frame Haar-distributed
    return E[:K].copy(), E[K:].copy()


def _uniform(rng: np.random.Generator, rng_lohi: tuple[float, float], n: int) -> np.ndarray:
    lo, hi = rng_lohi
    return np.full(n, lo) if lo == hi else rng.uniform(lo, hi, size=n)


def _simulate_one(cfg: ClusterConfig, n: int, rng: np.random.Generator,
                  signals: tuple[np.ndarray, np.ndarray] | None) -> dict[str, np.ndarray]:
    K, P, d = cfg.K, cfg.P, cfg.d
    V, C = make_signals(rng, K, d, cfg.basis) if signals is None else signals
    k = rng.integers(0, K, size=n)
    k2 = (k + rng.integers(1, K, size=n)) % K  # uniform over the K-1 other clusters
    y = rng.choice(np.array([-1, 1]), size=n)
    eps = rng.choice(np.array([-1, 1]), size=n)
    a, b, g = _uniform(rng, cfg.alpha, n), _uniform(rng, cfg.beta, n), _uniform(rng, cfg.gamma, n)
    X = np.empty((n, P, d))
    X[:, 0] = (y * a)[:, None] * V[k]
    X[:, 1] = b[:, None] * C[k]
    X[:, 2] = (eps * g)[:, None] * V[k2]
    X[:, 3:] = rng.standard_normal((n, P - 3, d)) * (cfg.noise_scale * cfg.sigma_p / np.sqrt(d))
    roles = np.broadcast_to(np.array([0, 1, 2] + [3] * (P - 3)), (n, P)).copy()
    if cfg.shuffle:
        perm = np.argsort(rng.random((n, P)), axis=1)
        X = np.take_along_axis(X, perm[:, :, None], axis=1)
        roles = np.take_along_axis(roles, perm, axis=1)
    return dict(X=X, y=y, cluster=k, noise_cluster=k2, eps=eps, alpha=a, beta=b, gamma=g, roles=roles, V=V, C=C)


@validate_arguments(n=Integer(1), reps=Optional(Integer(1)), seed=Seed())
def simulate_clusters(setting: int | None = 1, n: int = PAPER_N_TRAIN + PAPER_N_TEST, reps: int | None = None,
                      seed: SeedLike = None, *, K: int | None = None, P: int | None = None, d: int | None = None,
                      alpha: Strength | None = None, beta: Strength | None = None, gamma: Strength | None = None,
                      sigma_p: float | None = None, shuffle: bool | None = None, basis: str | None = None,
                      noise_scale: float | None = None,
                      signals: tuple[np.ndarray, np.ndarray] | None = None) -> ClusterData:
    """Simulate clustered-patch classification data (chen2022 Definition 3.1).

    Parameters
    ----------
    setting : {1, 2, 3, 4} or None
        A paper preset (module docstring table); ``None`` uses the defaults of :class:`ClusterConfig`.
        Keyword arguments override preset values (the result is then not labelled as the paper setting).
    n : int
        Examples per replicate (draw train + test together, then :meth:`ClusterData.split`).
    reps : int, optional
        Number of replicates ``R`` (default 1; the replicate axis is always present).
    seed : int, SeedSequence or list of SeedSequence
        Root seed; replicate ``r`` uses ``SeedSequence(seed).spawn(R)[r]``.
    K, P, d, alpha, beta, gamma, sigma_p : optional
        Clusters (>= 2), patches (>= 4), dimension (>= 2K), uniform strength ranges ``(low, high)``
        (or constants) and the Gaussian-noise scale (noise patches are :math:`N(0, \\sigma_p^2/d\\, I)`).
    shuffle : bool
        Shuffle the patch order of every example (App. A.2; default True).
    basis : {"random", "canonical"}
        Haar-random orthonormal signals (default) or the first 2K canonical vectors.
    noise_scale : float
        Extra factor on the Gaussian patches (the paper uses 3 only for the Fig. 1 t-SNE).
    signals : (V, C), optional
        Fixed signals (arrays of shape (K, d) or (R, K, d)) instead of drawing them per replicate.

    Returns
    -------
    ClusterData
    """
    cfg = cluster_config(setting, K=K, P=P, d=d, alpha=alpha, beta=beta, gamma=gamma, sigma_p=sigma_p,
                         shuffle=shuffle, basis=basis, noise_scale=noise_scale)
    n = check_int("n", n)
    seqs = replicate_seeds(seed, reps)
    R = len(seqs)
    sig = None
    if signals is not None:
        V, C = (np.asarray(s, dtype=np.float64) for s in signals)
        V, C = (np.broadcast_to(s, (R, cfg.K, cfg.d)) if s.ndim == 2 else s for s in (V, C))
        if V.shape != (R, cfg.K, cfg.d) or C.shape != (R, cfg.K, cfg.d):
            raise ValueError(f"signals must be two arrays of shape (K, d)=({cfg.K}, {cfg.d}) or (R, K, d); "
                             f"got {V.shape} and {C.shape}.")
        E = np.concatenate([V, C], axis=1)
        gram = E @ np.swapaxes(E, 1, 2)
        if not np.allclose(gram, np.eye(2 * cfg.K), atol=1e-8):
            raise ValueError("signals must be orthonormal together: the 2K rows of V and C need <u, w> = 1[u = w].")
        sig = (V, C)
    parts = [_simulate_one(cfg, n, np.random.default_rng(s), None if sig is None else (sig[0][r], sig[1][r]))
             for r, s in enumerate(seqs)]
    stacked = {key: np.stack([p[key] for p in parts]) for key in parts[0]}
    return ClusterData(config=cfg, seeds=seqs, **stacked)
