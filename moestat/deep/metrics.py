r"""Metrics for the clustered-patch MoE experiments (chen2022 §4, §6 and Appendix A).

* :func:`accuracy` — :math:`\frac1n\sum_i 1[y_i F(x_i) > 0]` (ties are errors, as in Thm 4.2).
* :func:`dispatch_counts` / :func:`dispatch_table` — the cluster x expert cross-tab :math:`n_{k,m}`
  (Tables 4-6).
* :func:`dispatch_entropy` — eq. (6.1), the conditional entropy of cluster given expert in nats:
  :math:`-\sum_{m: n_m>0} \frac{n_m}{n}\sum_k \frac{n_{k,m}}{n_m}\log\frac{n_{k,m}}{n_m}`.
  It is 0 when every used expert sees one cluster only and at most :math:`H(\text{cluster}) \approx \log K`;
  a total collapse onto one expert *also* gives :math:`H(\text{cluster})` — it measures purity, not load.
* :func:`dispatch_spread` — how each cluster spreads over experts and how pure the experts are: the mean
  number of experts holding more than a share ``threshold`` of a cluster, and the purity
  :math:`\sum_m\max_k n_{k,m}/n`.
* :func:`expert_alignment` / :func:`router_alignment` / :func:`alignment_frame` — Figs. 4-5:
  :math:`\max_j |\langle w_{m,j}, v_k\rangle|`, :math:`\max_j |\langle w_{m,j}, c_k\rangle|`,
  :math:`\langle\theta_m, c_k\rangle`, :math:`\langle\theta_m, v_k\rangle`.
* Theorem 4.1 (the 87.5% ceiling for patch-additive predictors when :math:`\mathcal D_\alpha =
  \mathcal D_\gamma`): :func:`patch_additive_ceiling`, :func:`ceiling_check` (one-sided Clopper-Pearson),
  :func:`thm41_orbit_margins` (the proof's 4-point orbit, whose signed margins sum to exactly 0 for any
  patch-additive predictor), :func:`patch_additive_oracle` (a step-function predictor attaining 87.5%)
  and :func:`moe_oracle` (route by :math:`\arg\max_k\langle c_k, s\rangle`, predict
  :math:`\mathrm{sign}\langle v_k, s\rangle`: the Bayes-like reference, ~100%).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from .._torch import to_numpy
from ..simulators.clusters import ClusterConfig, ClusterData

#: chen2022 Thm 4.1: any patch-additive predictor has test error >= 1/8 when D_alpha = D_gamma.
THM41_CEILING = 0.875


def _as_batched(a: Any, ndim: int) -> np.ndarray:
    a = to_numpy(a)
    return a[None] if a.ndim == ndim - 1 else a


def accuracy(y: Any, score: Any) -> np.ndarray:
    """Share of examples with :math:`y F(x) > 0`, per replicate: shape (R,) for (R, n) inputs."""
    y, score = _as_batched(y, 2), _as_batched(score, 2)
    return (y * score > 0).mean(axis=-1)


def dispatch_counts(cluster: Any, expert: Any, K: int, M: int) -> np.ndarray:
    """Cluster x expert counts :math:`n_{k,m}`, shape (R, K, M), from (R, n) cluster and expert labels."""
    cluster, expert = _as_batched(cluster, 2).astype(np.int64), _as_batched(expert, 2).astype(np.int64)
    if cluster.shape != expert.shape:
        raise ValueError(f"cluster {cluster.shape} and expert {expert.shape} must have the same shape.")
    if cluster.size and (cluster.min() < 0 or cluster.max() >= K or expert.min() < 0 or expert.max() >= M):
        raise ValueError(f"cluster labels must lie in [0, K={K}) and expert labels in [0, M={M}).")
    R = cluster.shape[0]
    flat = (np.arange(R)[:, None] * K * M + cluster * M + expert).ravel()
    return np.bincount(flat, minlength=R * K * M).reshape(R, K, M)


def dispatch_entropy(counts: Any) -> np.ndarray:
    """Dispatch entropy (chen2022 eq. 6.1) in nats from counts of shape (..., K, M).

    :math:`H(\\text{cluster}\\mid\\text{expert}) = -\\sum_{m:n_m>0}\\frac{n_m}{n}\\sum_k
    \\frac{n_{k,m}}{n_m}\\log\\frac{n_{k,m}}{n_m}` with :math:`0\\log 0 = 0`.
    """
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim < 2:
        raise ValueError("counts must have shape (..., K, M): rows are clusters, columns experts.")
    if (c < 0).any():
        raise ValueError("counts must be non-negative.")
    n_m = c.sum(axis=-2, keepdims=True)
    n = c.sum(axis=(-2, -1))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(n_m > 0, c / n_m, 0.0)
        plogp = np.where(q > 0, q * np.log(q), 0.0)
        h = -(n_m[..., 0, :] * plogp.sum(axis=-2)).sum(axis=-1) / n
    return h + 0.0  # turns -0.0 into 0.0


def dispatch_table(counts: Any) -> pd.DataFrame:
    """Tidy dispatch table: one row per (rep, cluster, expert) with ``count``."""
    c = _as_batched(counts, 3)
    R, K, M = c.shape
    r, k, m = np.meshgrid(np.arange(R), np.arange(K), np.arange(M), indexing="ij")
    return pd.DataFrame({"rep": r.ravel(), "cluster": k.ravel(), "expert": m.ravel(), "count": c.ravel()})


def load_summary(counts: Any) -> pd.DataFrame:
    """Per replicate: number of experts that receive no example and the largest load share."""
    c = _as_batched(counts, 3)
    loads = c.sum(axis=1)
    return pd.DataFrame({"rep": np.arange(c.shape[0]), "n_dead_experts": (loads == 0).sum(axis=1),
                         "max_load_share": loads.max(axis=1) / np.maximum(loads.sum(axis=1), 1)})


def dispatch_spread(counts: Any, threshold: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    r"""How clusters spread over experts, per replicate, from the dispatch table :math:`n_{k,m}`.

    Two summaries of a cluster x expert table (chen2022 Tables 4-6 read as statistics):

    * experts per cluster :math:`\frac1K\sum_k \#\{m : n_{k,m}/n_k > \tau\}` with :math:`n_k = \sum_m n_{k,m}`
      (1 when every cluster goes to one expert; up to M when a cluster is spread over all of them);
    * purity :math:`\sum_m \max_k n_{k,m} / n`, the share of examples whose expert's majority cluster is their
      own (1 for a perfectly specialised router, about 1/K when every expert sees the cluster mix).

    A cluster with no example counts as spread over no expert.

    Parameters
    ----------
    counts : array, shape (R, K, M) or (K, M)
        Dispatch counts (:func:`dispatch_counts`).
    threshold : float
        Share :math:`\tau \in [0, 1)` of a cluster an expert must exceed to count (default 5%).

    Returns
    -------
    experts_per_cluster, purity : ndarray, shape (R,)
    """
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim == 2:
        c = c[None]
    if c.ndim != 3:
        raise ValueError(f"counts has shape {c.shape}; it must be (R, K, M) or (K, M): rows clusters, columns "
                         "experts (moestat.deep.metrics.dispatch_counts).")
    if (c < 0).any() or not np.isfinite(c).all():
        raise ValueError("counts must be finite and non-negative; pass dispatch counts n_{k,m}.")
    if not (isinstance(threshold, (int, float, np.floating)) and 0 <= threshold < 1):
        raise ValueError(f"threshold={threshold!r} must be a share in [0, 1), e.g. 0.05.")
    share = c / np.maximum(c.sum(axis=2, keepdims=True), 1)
    total = c.sum(axis=(1, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        purity = np.where(total > 0, c.max(axis=1).sum(axis=1) / total, np.nan)
    return (share > threshold).sum(axis=2).mean(axis=1), purity


def expert_alignment(W: Any, V: Any, C: Any) -> tuple[np.ndarray, np.ndarray]:
    """Expert-signal alignment (Figs. 4-5): :math:`\\max_j|\\langle w_{m,j}, v_k\\rangle|` and the same for
    :math:`c_k`.

    Parameters
    ----------
    W : array, shape (R, M, d, J)
        Expert filters (a single CNN is ``M = 1``).
    V, C : array, shape (R, K, d)

    Returns
    -------
    feature, center : ndarray, shape (R, M, K)
    """
    W, V, C = _as_batched(W, 4), _as_batched(V, 3), _as_batched(C, 3)
    feat = np.abs(np.einsum("rmdj,rkd->rmkj", W, V)).max(axis=-1)
    cent = np.abs(np.einsum("rmdj,rkd->rmkj", W, C)).max(axis=-1)
    return feat, cent


def router_alignment(Theta: Any, V: Any, C: Any) -> tuple[np.ndarray, np.ndarray]:
    """Router-signal inner products :math:`\\langle\\theta_m, c_k\\rangle` and :math:`\\langle\\theta_m, v_k\\rangle`.

    ``Theta`` has shape (R, d, M); returns (center, feature), each (R, M, K).
    """
    Theta, V, C = _as_batched(Theta, 3), _as_batched(V, 3), _as_batched(C, 3)
    return np.einsum("rdm,rkd->rmk", Theta, C), np.einsum("rdm,rkd->rmk", Theta, V)


def alignment_frame(W: Any, Theta: Any | None, V: Any, C: Any, iteration: int) -> pd.DataFrame:
    """Long frame of the four alignment statistics: rep, iteration, component, signal, expert, cluster, value."""
    feat, cent = expert_alignment(W, V, C)
    blocks = [("expert", "feature", feat), ("expert", "center", cent)]
    if Theta is not None:
        rc, rf = router_alignment(Theta, V, C)
        blocks += [("router", "center", rc), ("router", "feature", rf)]
    frames = []
    for component, signal, a in blocks:
        R, M, K = a.shape
        r, m, k = np.meshgrid(np.arange(R), np.arange(M), np.arange(K), indexing="ij")
        frames.append(pd.DataFrame({"rep": r.ravel(), "iteration": iteration, "component": component,
                                    "signal": signal, "expert": m.ravel(), "cluster": k.ravel(),
                                    "value": a.ravel()}))
    return pd.concat(frames, ignore_index=True)


def expert_groups_from_init(W0: Any, V: Any) -> np.ndarray:
    """Initial owner cluster of each expert (chen2022 Def. D.3), shape (R, M).

    :math:`(k^*_m, j^*_m) = \\arg\\max_{k,j}\\langle v_k, w^{(0)}_{m,j}\\rangle` (signed inner product);
    :math:`\\mathcal M_k = \\{m : k^*_m = k\\}`.  ``W0`` is (R, M, d, J), ``V`` (R, K, d).
    """
    W0, V = _as_batched(W0, 4), _as_batched(V, 3)
    ip = np.einsum("rmdj,rkd->rmkj", W0, V)
    return ip.max(axis=-1).argmax(axis=-1)


def all_groups_nonempty(groups: Any, K: int) -> np.ndarray:
    """Whether every cluster owns at least one expert at initialisation (Lemma D.4 (iii)), shape (R,)."""
    g = _as_batched(groups, 2)
    return np.array([len(np.unique(row)) == K for row in g])


def prob_all_groups_nonempty(K: int, M: int) -> float:
    """:math:`P(\\text{all } \\mathcal M_k \\ne \\emptyset)` = surjections :math:`[M]\\to[K]` / :math:`K^M`
    (each :math:`k^*_m` uniform on :math:`[K]`); 0.623 for K = 4, M = 8."""
    from math import comb

    return sum((-1) ** i * comb(K, i) * (K - i) ** M for i in range(K + 1)) / K ** M


def patch_additive_ceiling(config: ClusterConfig) -> float | None:
    """0.875 when :math:`\\mathcal D_\\alpha = \\mathcal D_\\gamma` (Thm 4.1 applies), else ``None``
    (no proven bound)."""
    return THM41_CEILING if config.alpha_gamma_equal else None


def ceiling_check(acc: Any, n_test: int, ceiling: float = THM41_CEILING, level: float = 0.99) -> pd.DataFrame:
    """Is each observed accuracy consistent with a true accuracy <= ``ceiling``?

    Uses the one-sided Clopper-Pearson lower confidence bound at ``level``: the check fails
    (``consistent=False``) only if the lower bound exceeds the ceiling.
    """
    acc = np.atleast_1d(np.asarray(acc, dtype=np.float64))
    k = np.round(acc * n_test)
    lower = np.where(k > 0, stats.beta.ppf(1 - level, k, n_test - k + 1), 0.0)
    return pd.DataFrame({"accuracy": acc, "n_test": n_test, "lower_bound": lower, "ceiling": ceiling,
                         "level": level, "consistent": lower <= ceiling})


def _canonical_patches(data: ClusterData) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian noise patches of each example (R, n, P-3, d) and the mask that selected them."""
    noise_mask = data.roles == 3
    R, n, P, d = data.X.shape
    xi = data.X[noise_mask].reshape(R, n, P - 3, d)
    return xi, noise_mask


def thm41_orbit_margins(predict: Callable[[np.ndarray], Any], data: ClusterData) -> np.ndarray:
    """The 4-point orbit of the proof of Theorem 4.1, for every example with :math:`\\varepsilon = -y`.

    For an example :math:`(\\alpha y v_k, \\beta c_k, -\\gamma y v_{k'}, \\xi)` with label :math:`y` the orbit is
    :math:`x_1` = itself (label :math:`y`), :math:`x_2 = (-\\alpha y v_k, \\beta c_k, \\gamma y v_{k'}, \\xi)`
    (label :math:`-y`), :math:`x_3 = (\\gamma y v_{k'}, \\beta c_{k'}, -\\alpha y v_k, \\xi)` (label :math:`y`) and
    :math:`x_4 = (-\\gamma y v_{k'}, \\beta c_{k'}, \\alpha y v_k, \\xi)` (label :math:`-y`); all four are in the
    support when :math:`\\mathcal D_\\alpha = \\mathcal D_\\gamma`.  For a patch-additive
    :math:`F(x) = \\sum_p f(x^{(p)})` the signed margins :math:`\\pm y F(x_i)` sum to exactly 0, so one of
    them is :math:`\\le 0`: error >= 1/8.

    Parameters
    ----------
    predict : callable
        Maps patches (R, n', P, d) to scores F (R, n').
    data : ClusterData

    Returns
    -------
    ndarray, shape (R, n', 4)
        Signed margins :math:`(y F(x_1), -y F(x_2), y F(x_3), -y F(x_4))` over the examples with
        :math:`\\varepsilon = -y` (``n'`` = the smallest such count over replicates).
    """
    sel = data.eps == -data.y
    n_sel = int(sel.sum(axis=1).min())
    idx = np.stack([np.flatnonzero(s)[:n_sel] for s in sel])
    take = lambda a: np.take_along_axis(a, idx, axis=1)  # noqa: E731
    y, k, k2 = take(data.y), take(data.cluster), take(data.noise_cluster)
    a, b, g = take(data.alpha), take(data.beta), take(data.gamma)
    xi, _ = _canonical_patches(data)
    xi = np.take_along_axis(xi, idx[:, :, None, None], axis=1)
    R = data.n_reps
    rr = np.arange(R)[:, None]
    vk, vk2, ck, ck2 = data.V[rr, k], data.V[rr, k2], data.C[rr, k], data.C[rr, k2]
    yv = y[..., None]

    def build(p0, p1, p2):
        return np.concatenate([np.stack([p0, p1, p2], axis=2), xi], axis=2)

    x1 = build(yv * a[..., None] * vk, b[..., None] * ck, -yv * g[..., None] * vk2)
    x2 = build(-yv * a[..., None] * vk, b[..., None] * ck, yv * g[..., None] * vk2)
    x3 = build(yv * g[..., None] * vk2, b[..., None] * ck2, -yv * a[..., None] * vk)
    x4 = build(-yv * g[..., None] * vk2, b[..., None] * ck2, yv * a[..., None] * vk)
    F = [to_numpy(predict(x)) for x in (x1, x2, x3, x4)]
    return np.stack([y * F[0], -y * F[1], y * F[2], -y * F[3]], axis=-1)


def patch_additive_oracle(data: ClusterData, tau: float = 0.45) -> np.ndarray:
    """A patch-additive step predictor that attains the 87.5% ceiling (scores, shape (R, n)).

    :math:`f(z) = \\sum_k k\\,1[\\langle v_k, z\\rangle > \\tau]
    + \\sum_k (0.5 - k)\\,1[\\langle c_k, z\\rangle > \\tau]`
    with 1-based :math:`k`: right on every :math:`\\varepsilon = y` example, and on :math:`\\varepsilon = -y`
    examples exactly when :math:`y = 1` or :math:`k > k'` — accuracy :math:`1/2 + 1/4 + 1/8 = 7/8`.
    """
    K = data.config.K
    w = np.arange(1, K + 1, dtype=np.float64)
    pv = np.einsum("rnpd,rkd->rnpk", data.X, data.V) > tau
    pc = np.einsum("rnpd,rkd->rnpk", data.X, data.C) > tau
    return (pv * w).sum(axis=(2, 3)) + (pc * (0.5 - w)).sum(axis=(2, 3))


def moe_oracle(data: ClusterData) -> np.ndarray:
    """Oracle MoE scores: route by :math:`\\arg\\max_k\\langle c_k, s\\rangle`, score
    :math:`\\langle v_k, s\\rangle`."""
    s = data.patch_sum()
    k = np.einsum("rnd,rkd->rnk", s, data.C).argmax(axis=-1)
    rr = np.arange(data.n_reps)[:, None]
    return np.einsum("rnd,rnd->rn", s, data.V[rr, k])
