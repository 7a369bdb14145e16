r"""Starting values for the MoE least-squares (and likelihood) estimators.

All functions return numpy :class:`~moestat.Params` with a leading axis of size ``R * S``: replicate
``r``, restart ``s`` sits at row ``r * S + s``.  Replicate ``r`` draws its restarts from its own
stream ``numpy.random.default_rng(SeedSequence(seed).spawn(R)[r])``, so its starts do not depend on
how many other replicates are fitted alongside it.

* :func:`near_truth` — the papers' "initialisation near the true parameters" (nguyen2024 §4), with
  the over-specified atoms made explicit: ``duplicate`` lists the true atoms that receive an extra
  fitted copy (one entry per extra copy).  A true atom split into ``m`` copies keeps its total gate
  weight:

  - sigmoid: every copy gets :math:`\beta_0' = \operatorname{logit}(\sigma(\beta_0^*)/m)`, so the
    copies' weights :math:`\sigma(\beta_0')` sum to :math:`\sigma(\beta_0^*)` (always defined);
  - softmax / top-K: :math:`\beta_0' = \beta_0^* - \log m`, so the copies' unnormalised weights
    :math:`\exp(\beta_0')` sum to :math:`\exp(\beta_0^*)`.

  Then independent :math:`N(0, \text{scale}^2)` noise is added to every free coordinate.
* :func:`random_init` — data-scaled random start: gate intercepts :math:`N(0, s^2)`, gate slopes
  :math:`N(0, s^2/d)`, expert slopes :math:`N(0, s^2\,\mathrm{sd}(y)^2/d)`, expert intercepts
  :math:`N(\bar y, s^2\,\mathrm{sd}(y)^2)` with ``s = scale`` (default 1).
* :func:`kmeans_init` — data-driven: Lloyd's k-means on the standardised pairs (x, y) (random data
  points as centres), then per cluster a ridge least-squares line of y on x for the expert (the
  cluster mean for constant experts) and the nearest-centroid discriminant
  :math:`\ell_i(x) = (\mu_i^\top x - \|\mu_i\|^2/2)/v` for the gate (v: pooled within-cluster
  variance of x); sigmoid gates are shifted so each gate's average weight is :math:`1/k`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from .._validation import check_int
from ..model import MoE
from ..params import Params


def split_gate_bias(gate: str, bias: np.ndarray, m: np.ndarray | int) -> np.ndarray:
    r"""Weight-preserving gate intercept of each of ``m`` copies of an atom.

    sigmoid: :math:`\operatorname{logit}(\sigma(\beta_0)/m)`; softmax/top-K: :math:`\beta_0 - \log m`.
    """
    bias = np.asarray(bias, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    if gate == "sigmoid":
        # log sigma(b) - log m - log(1 - sigma(b)/m) in log space: logaddexp for log sigma, expm1 for the
        # complement (log1p(-exp(.)) rounds 1 - sigma(b) to 0 from b ~ 37 on); one copy keeps b exactly
        log_w = -np.logaddexp(0.0, -bias) - np.log(m)
        with np.errstate(divide="ignore"):
            split = log_w - np.log(-np.expm1(log_w))
        return np.where(m == 1, bias, split)
    return bias - np.log(m)


def check_duplicate(duplicate: Sequence[int] | None, k_true: int, k: int) -> list[int]:
    """Validate the list of true atoms that get extra fitted copies (``len == k - k_true``)."""
    extra = k - k_true
    if extra < 0:
        raise ValueError(f"the fitted model has k={k} experts, fewer than the truth's k*={k_true}; "
                         "near-truth starts need k >= k* (use init='random' or 'kmeans' for k < k*).")
    if duplicate is None:
        if extra == 0:
            return []
        raise ValueError(f"k={k} exceeds the truth's k*={k_true}: pass duplicate=, a list of {extra} true atom "
                         f"index(es) in range({k_true}) that get the extra fitted copies (the regime of an "
                         "over-specified fit depends on this choice; presets record a default in "
                         "truth.info['duplicate']).")
    dup = [int(j) for j in np.atleast_1d(np.asarray(duplicate)).ravel()] if not isinstance(duplicate, list) \
        else list(duplicate)
    for j in dup:
        if isinstance(j, bool) or not isinstance(j, (int, np.integer)):
            raise TypeError(f"duplicate must hold integer atom indices, got {j!r}.")
        if not 0 <= j < k_true:
            raise ValueError(f"duplicate index {j} is out of range for a truth with k*={k_true} atoms "
                             f"(valid: 0..{k_true - 1}).")
    if len(dup) != extra:
        raise ValueError(f"duplicate has {len(dup)} entries but k - k* = {k} - {k_true} = {extra} extra fitted "
                         f"atoms need exactly {extra}.")
    return [int(j) for j in dup]


def _replicate_rngs(seed, R: int) -> list[np.random.Generator]:
    from ..simulators.regression import replicate_seeds

    return [np.random.default_rng(s) for s in replicate_seeds(seed, R)]


def _free_masks(spec: MoE) -> tuple[np.ndarray, np.ndarray]:
    """Masks (k, d) for gate slopes/intercepts and expert slopes that are free parameters."""
    k, d = spec.k, spec.d
    gate_free = np.ones(k, dtype=bool)
    if spec.gate in ("softmax", "topk"):
        gate_free[-1] = False
    expert_slope_free = np.full((k, d), spec.family.input_dependent)
    return gate_free, expert_slope_free


def _finish(spec: MoE, gb, gw, ew, eb) -> Params:
    p = Params(gb, gw, ew, eb)
    if spec.gate in ("softmax", "topk"):
        p = p.normalize_softmax(-1)
    if not spec.family.input_dependent:
        p = Params(p.gate_bias, p.gate_weight, np.zeros_like(p.expert_weight), p.expert_bias)
    return p


def near_truth(spec: MoE, truth: Params, R: int, S: int = 1, *, duplicate: Sequence[int] | None = None,
               scale: float = 0.05, seed=None) -> Params:
    """Near-truth starts for R replicates x S restarts (see module docstring).

    Parameters
    ----------
    spec : MoE
        The *fitted* specification (its gate decides the split rule, its k the number of atoms).
    truth : Params
        True parameters with k* atoms, unbatched or batched with R replicates.
    duplicate : list of int
        ``k - k*`` true atom indices (repeats allowed) that receive the extra fitted copies.
        Fitted atoms ``0..k*-1`` are the true atoms in order, the extra copies follow in the order given.
    scale : float
        Standard deviation of the Gaussian perturbation of every free coordinate.
    """
    R, S = check_int("R", R), check_int("restarts", S)
    if not scale >= 0:
        raise ValueError(f"init_scale must be >= 0, got {scale}.")
    if truth.d != spec.d:
        raise ValueError(f"truth has input dimension d={truth.d} but the fitted spec has d={spec.d}.")
    if truth.is_batched and truth.n_reps != R:
        raise ValueError(f"truth has R={truth.n_reps} replicates but the data have R={R}; pass unbatched truth "
                         "or one per replicate.")
    t = truth.numpy().batched(R)
    dup = check_duplicate(duplicate, t.k, spec.k)
    order = list(range(t.k)) + dup
    m = np.bincount(np.asarray(order, dtype=np.int64), minlength=t.k)[order]
    gb = split_gate_bias(spec.gate, t.gate_bias[:, order], m)
    gw, ew, eb = t.gate_weight[:, order], t.expert_weight[:, order], t.expert_bias[:, order]
    gate_free, slope_free = _free_masks(spec)
    rngs = _replicate_rngs(seed, R)
    out = {"gb": [], "gw": [], "ew": [], "eb": []}
    for r, rng in enumerate(rngs):
        base = _finish(spec, gb[r], gw[r], ew[r], eb[r])
        k, d = spec.k, spec.d
        noise = rng.normal(0.0, scale, size=(S, k * (2 * d + 2)))
        n_gb, n_gw, n_ew, n_eb = np.split(noise, np.cumsum([k, k * d, k * d]), axis=1)
        out["gb"].append(base.gate_bias + n_gb * gate_free)
        out["gw"].append(base.gate_weight + n_gw.reshape(S, k, d) * gate_free[:, None])
        out["ew"].append(base.expert_weight + n_ew.reshape(S, k, d) * slope_free)
        out["eb"].append(base.expert_bias + n_eb)
    return Params(*(np.concatenate(out[b]) for b in ("gb", "gw", "ew", "eb")))


def random_init(spec: MoE, y: np.ndarray, S: int = 1, *, scale: float = 1.0, seed=None) -> Params:
    """Data-scaled random starts for ``y`` of shape (R, n) (see module docstring)."""
    R, k, d = y.shape[0], spec.k, spec.d
    if not scale > 0:
        raise ValueError(f"init_scale must be > 0 for init='random', got {scale}.")
    gate_free, slope_free = _free_masks(spec)
    parts = []
    for r, rng in enumerate(_replicate_rngs(seed, R)):
        ybar, ysd = float(y[r].mean()), float(y[r].std()) or 1.0
        gb = rng.normal(0.0, scale, size=(S, k)) * gate_free
        gw = rng.normal(0.0, scale / np.sqrt(d), size=(S, k, d)) * gate_free[:, None]
        ew = rng.normal(0.0, scale * ysd / np.sqrt(d), size=(S, k, d)) * slope_free
        eb = ybar + rng.normal(0.0, scale * ysd, size=(S, k))
        parts.append(Params(gb, gw, ew, eb))
    return Params.stack(parts)


#: Largest temporary (bytes) of one block of k-means problems: the (b, n, k, d + 1) differences of the distance step
#: and the cluster-masked inputs of the ridge fits.  Problems are independent, so blocking changes no result.
KMEANS_BLOCK_BYTES = 2**23


def kmeans_init(spec: MoE, X: np.ndarray, y: np.ndarray, S: int = 1, *, scale: float = 0.0, seed=None,
                n_iter: int = 20, ridge: float = 1e-6) -> Params:
    r"""Data-driven starts from k-means clusters of (x, y) (see module docstring), all replicates at once.

    Replicate ``r`` draws, restart by restart, ``k`` distinct data points as initial centres and (with
    ``scale > 0``) the noise of that restart from its own stream; those draws do not depend on the data, so they
    are taken first and the ``R * S`` clusterings then run together as array programs (:func:`lloyd_labels`,
    :func:`cluster_starts`), in blocks of at most :data:`KMEANS_BLOCK_BYTES` of temporaries.  The labels are
    those of one clustering at a time, bit for bit (same distances, same first-index tie rule, cluster means
    summed in observation order); the ridge fits agree with per-cluster solves to rounding.
    """
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    R, n, d = X.shape
    k = spec.k
    if n < k:
        raise ValueError(f"init='kmeans' needs n >= k observations per replicate, got n={n} < k={k}.")
    centre_idx, noise = _kmeans_draws(_replicate_rngs(seed, R), n, k, d, S, scale)
    rep = np.repeat(np.arange(R), S)  # problem b = r * S + s fits replicate r
    # per problem: its data, standardised and as coordinate planes (~4 (d + 1) n values), up to 9 + 1 distance
    # planes (10 k n) and the cluster statistics' temporaries (~4 (d + 1) n)
    step = max(1, KMEANS_BLOCK_BYTES // (8 * n * (10 * k + 8 * (d + 1))))
    blocks = []
    for lo in range(0, R * S, step):
        reps = rep[lo : lo + step]
        Xb, yb = X[reps], y[reps]
        Zs = standardise_pairs(Xb, yb)
        labels = lloyd_labels(Zs, Zs[np.arange(len(reps))[:, None], centre_idx[lo : lo + step]], n_iter)
        blocks.append(cluster_starts(spec, Xb, yb, labels, ridge))
    gb, gw, ew, eb = (np.concatenate(parts) for parts in zip(*blocks, strict=True))
    p = _finish(spec, gb, gw, ew, eb)
    if noise is None:
        return p
    gate_free, slope_free = _free_masks(spec)
    n_gb, n_gw, n_ew, n_eb = noise
    return Params(p.gate_bias + n_gb * gate_free, p.gate_weight + n_gw * gate_free[:, None],
                  p.expert_weight + n_ew * slope_free, p.expert_bias + n_eb)


def _kmeans_draws(rngs: list[np.random.Generator], n: int, k: int, d: int, S: int, scale: float
                  ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
    """Initial-centre indices (R * S, k) and, with ``scale > 0``, the noise blocks (gb, gw, ew, eb), each with a
    leading axis R * S: per replicate stream, restart by restart, the centres then the noise (the order in which
    one clustering at a time draws them)."""
    idx, noise = [], []
    for rng in rngs:
        for _ in range(S):
            idx.append(rng.choice(n, size=k, replace=False))
            if scale > 0:
                noise.append((rng.normal(0, scale, k), rng.normal(0, scale, (k, d)), rng.normal(0, scale, (k, d)),
                              rng.normal(0, scale, k)))
    blocks = tuple(np.stack(b) for b in zip(*noise, strict=True)) if noise else None
    return np.stack(idx), blocks


def standardise_pairs(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    r"""The pairs :math:`z_t = (x_t, y_t)` of each replicate centred and scaled column by column,
    :math:`(z_{tj} - \bar z_j)/\mathrm{sd}_j` (a constant column is only centred); ``X`` (R, n, d), ``y`` (R, n)
    give (R, n, d + 1)."""
    Z = np.concatenate([X, y[..., None]], -1)
    sd = Z.std(1, keepdims=True)
    return (Z - Z.mean(1, keepdims=True)) / np.where(sd > 0, sd, 1.0)


def cluster_means(V: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    r"""Per data set and cluster, the mean of the rows of ``V`` (b, n, m) with that label and the cluster sizes.

    :math:`\bar v_{bi} = \frac1{|C_{bi}|}\sum_{t \in C_{bi}} v_{bt}`, :math:`C_{bi} = \{t: \ell_{bt} = i\}`,
    summed in observation order (``numpy.bincount``), the order of ``V[b][labels[b] == i].mean(0)``; an empty
    cluster gets 0 (callers replace it).  Returns means (b, k, m) and sizes (b, k)."""
    b, m = V.shape[0], V.shape[2]
    seg = np.arange(b)[:, None] * k + labels  # (b, n): one bin per data set and cluster
    seg = seg.ravel()
    counts = np.bincount(seg, minlength=b * k).reshape(b, k)
    sums = np.stack([np.bincount(seg, weights=V[..., j].ravel(), minlength=b * k) for j in range(m)], -1)
    return sums.reshape(b, k, m) / np.maximum(counts, 1)[..., None], counts


def _pairwise_sum(term: Callable[[int], np.ndarray], lo: int, m: int) -> np.ndarray:
    """``term(lo) + ... + term(lo + m - 1)`` (fresh arrays, consumed in order) added in the order of numpy's
    pairwise summation of a contiguous axis of length ``m`` (numpy ``pairwise_sum``: sequential below 8 terms,
    8 interleaved accumulators up to 128, halves above), so that the planes of an array summed here equal numpy's
    ``sum`` over that axis bit for bit (:func:`_pairwise_order_holds` checks it for the numpy in use)."""
    if m < 8:
        res = term(lo)
        for j in range(lo + 1, lo + m):
            res += term(j)
        return res
    if m <= 128:
        acc = [term(lo + j) for j in range(8)]
        i = 8
        while i < m - m % 8:
            for j in range(8):
                acc[j] += term(lo + i + j)
            i += 8
        res = acc[0] + acc[1]
        res += acc[2] + acc[3]
        right = acc[4] + acc[5]
        right += acc[6] + acc[7]
        res += right
        for j in range(lo + i, lo + m):
            res += term(j)
        return res
    half = m // 2 - (m // 2) % 8
    res = _pairwise_sum(term, lo, half)
    res += _pairwise_sum(term, lo + half, m - half)
    return res


@cache
def _pairwise_order_holds(m: int) -> bool:
    """Does :func:`_pairwise_sum` reproduce ``numpy.sum`` over a last axis of length ``m`` exactly (checked once
    per length on non-negative terms spread over 16 orders of magnitude, where any other order shows)?"""
    rng = np.random.default_rng(m)
    a = rng.random((256, m)) * 10.0 ** rng.integers(-8, 8, size=(256, m))
    return bool(np.array_equal(a.sum(-1), _pairwise_sum(lambda j: a[:, j].copy(), 0, m)))


def nearest_centre(Zs: np.ndarray, centres: np.ndarray) -> np.ndarray:
    r"""Label of the nearest centre, :math:`\arg\min_i \sum_j (z_{btj} - c_{bij})^2` (first index on ties), for
    ``Zs`` (b, n, q) and ``centres`` (b, k, q): shape (b, n).

    The squared distances equal, bit for bit, those of ``((Z[:, None, :] - c[None]) ** 2).sum(-1)`` on one data
    set, so ties and near-ties resolve as one clustering at a time does; they are formed coordinate plane by plane
    in a (b, k, n) layout (observations contiguous) and added in numpy's summation order, several times faster
    than numpy's reduction over a short last axis (that reduction is the fallback where the order differs)."""
    return _nearest(np.ascontiguousarray(Zs.transpose(2, 0, 1)), centres)


def _nearest(cols: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """:func:`nearest_centre` with the data as coordinate planes ``cols`` (q, b, n)."""
    q = cols.shape[0]
    if not _pairwise_order_holds(q):
        return ((cols.transpose(1, 2, 0)[:, :, None, :] - centres[:, None]) ** 2).sum(-1).argmin(-1)

    def plane(j: int) -> np.ndarray:
        diff = cols[j][:, None, :] - centres[:, :, j, None]  # (b, k, n)
        return np.multiply(diff, diff, out=diff)

    return _first_argmin(_pairwise_sum(plane, 0, q))


def _first_argmin(dist: np.ndarray) -> np.ndarray:
    """``dist.argmin(1)`` for finite ``dist`` (b, k, n) (the first index on ties), as k passes over contiguous
    (b, n) planes: numpy's argmin over a middle axis is several times slower."""
    best = dist[:, 0].copy()
    label = np.zeros(best.shape, dtype=np.intp)
    for i in range(1, dist.shape[1]):
        closer = dist[:, i] < best  # strict: an equal distance keeps the lower index
        label[closer] = i
        np.copyto(best, dist[:, i], where=closer)
    return label


def lloyd_labels(Zs: np.ndarray, centres: np.ndarray, n_iter: int) -> np.ndarray:
    r"""Lloyd's k-means (Lloyd 1982, IEEE Trans. Inf. Theory 28(2)) for b data sets at once.

    ``n_iter`` times: label every point by its nearest centre (:func:`nearest_centre`), then move each centre to
    the mean of its points, :math:`c_{bi} \leftarrow \frac1{|C_{bi}|}\sum_{t\in C_{bi}} z_{bt}` (summed in
    observation order, as ``Z[labels == i].mean(0)`` does); a cluster left empty keeps its centre.  Returns the
    labels of the final centres, (b, n).  ``Zs`` (b, n, q), ``centres`` (b, k, q) (not modified).

    Once an iteration labels every point as the one before did, the centres it computes are the ones it started
    from, bit for bit (the same sums in the same order; an empty cluster kept its centre both times), so every later
    iteration repeats it: the loop stops there and returns those labels, which the remaining iterations would
    have returned.
    """
    b, k, q = centres.shape
    cols = np.ascontiguousarray(Zs.transpose(2, 0, 1))  # (q, b, n)
    offset = (np.arange(b) * k)[:, None]
    centres = centres.copy()
    previous = None
    for _ in range(n_iter):
        seg = (_nearest(cols, centres) + offset).ravel()  # one bin per data set and cluster
        if previous is not None and np.array_equal(seg, previous):
            return seg.reshape(b, -1) - offset
        previous = seg
        counts = np.bincount(seg, minlength=b * k).reshape(b, k)
        sums = np.stack([np.bincount(seg, weights=cols[j].ravel(), minlength=b * k) for j in range(q)], -1)
        means = sums.reshape(b, k, q) / np.maximum(counts, 1)[..., None]
        centres = np.where(counts[..., None] > 0, means, centres)
    return _nearest(cols, centres)


def _mean_over(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row means of ``values`` (b, k) over the entries where ``mask`` holds, 1.0 for a row without any; rows that
    share a mask are reduced together, so each mean is numpy's own mean of the selected entries."""
    out = np.ones(values.shape[0])
    for pattern in np.unique(mask, axis=0):
        if pattern.any():
            rows = (mask == pattern).all(1)
            out[rows] = values[rows][:, pattern].mean(1)
    return out


def cluster_starts(spec: MoE, X: np.ndarray, y: np.ndarray, labels: np.ndarray, ridge: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    r"""Gate and expert starting values from cluster labels, for b data sets at once.

    With :math:`\mu_i` the mean of :math:`x` over cluster :math:`i` (the overall mean for an empty one) and
    :math:`v` the pooled within-cluster variance (mean over the clusters with at least two points of the mean
    per-coordinate variance; 1 where there is none or it is 0): gate :math:`\beta_{1i} = \mu_i/v`,
    :math:`\beta_{0i} = -\|\mu_i\|^2/(2v)` (the nearest-centroid discriminant; sigmoid gates shifted so that
    each gate's average logit is :math:`\log(1/(k-1))`); expert :math:`(b_i, a_i)` the ridge fit
    :math:`(\tilde X_i^\top\tilde X_i + \lambda I)^{-1}\tilde X_i^\top y_i` on the cluster's points (its mean
    for constant experts; :math:`(\bar y, 0)` for an empty cluster).  ``X`` (b, n, d), ``y`` (b, n), ``labels``
    (b, n); returns (gate_bias, gate_weight, expert_weight, expert_bias) with a leading axis b.
    """
    k = spec.k
    b, d = X.shape[0], X.shape[2]
    mu, counts = cluster_means(X, labels, k)
    empty = counts == 0
    mu = np.where(empty[..., None], X.mean(1)[:, None], mu)
    dev = X - np.take_along_axis(mu, labels[..., None], 1)            # x_t - mu_{l_t}
    centred = dev - np.take_along_axis(cluster_means(dev, labels, k)[0], labels[..., None], 1)
    spread = cluster_means(centred * centred, labels, k)[0].mean(-1)  # per cluster: mean variance over x
    within = _mean_over(spread, counts > 1)
    v = np.where(within > 0, within, 1.0)
    gw = mu / v[:, None, None]
    gb = -(mu**2).sum(-1) / (2 * v[:, None])
    if spec.gate == "sigmoid":
        logits = X @ gw.transpose(0, 2, 1) + gb[:, None, :]
        gb = gb + np.log(1.0 / (k - 1)) - logits.mean(1) if k > 1 else gb - logits.mean(1)
    ybar = y.mean(1)[:, None]
    if spec.family.input_dependent:
        coef = _ridge_per_cluster(X, y, labels, k, ridge, empty)
        eb, ew = coef[..., 0], coef[..., 1:]
    else:
        eb, ew = cluster_means(y[..., None], labels, k)[0][..., 0], np.zeros((b, k, d))
    return gb, gw, np.where(empty[..., None], 0.0, ew), np.where(empty, ybar, eb)


def _ridge_per_cluster(X: np.ndarray, y: np.ndarray, labels: np.ndarray, k: int, ridge: float,
                       empty: np.ndarray) -> np.ndarray:
    r"""Ridge coefficients :math:`(\tilde X_i^\top \tilde X_i + \lambda I)^{-1} \tilde X_i^\top y_i` of every
    cluster, (b, k, d + 1); empty clusters get 0.

    The normal equations are formed cluster by cluster from the cluster's rows in observation order (so a cluster
    with fewer than d + 1 points, whose system is conditioned only by the ridge, gets the coefficients of a
    one-clustering-at-a-time fit to the last bit) and solved in one batched call."""
    b, n, d = X.shape
    q = d + 1
    gram = np.broadcast_to(np.eye(q), (b, k, q, q)).copy()
    rhs = np.zeros((b, k, q))
    for j in range(b):
        Xa = np.concatenate([np.ones((n, 1)), X[j]], 1)
        for i in np.flatnonzero(~empty[j]):
            sel = labels[j] == i
            A = Xa[sel]
            gram[j, i] = A.T @ A + ridge * np.eye(q)
            rhs[j, i] = A.T @ y[j][sel]
    return np.linalg.solve(gram, rhs[..., None])[..., 0]


def from_params(spec: MoE, init: Params, R: int, S: int = 1, *, scale: float = 0.0, seed=None) -> Params:
    """User-given starting values: unbatched (shared) or batched with R (or R*S) rows.

    With ``S > 1`` restart 0 is the given start and restarts 1..S-1 add :math:`N(0, \\text{scale}^2)`
    noise to every free coordinate (``scale`` must then be > 0).
    """
    spec.check_params(init)
    p = init.numpy()
    if p.is_batched and p.n_reps == R * S:
        return _normalise_rows(spec, p)
    if p.is_batched and p.n_reps != R:
        raise ValueError(f"init has {p.n_reps} rows; expected 1 (unbatched), R={R} or R*restarts={R * S}.")
    p = p.batched(R)
    if S > 1 and not scale > 0:
        raise ValueError("restarts > 1 from a user-given init need init_scale > 0 to make the restarts differ.")
    gate_free, slope_free = _free_masks(spec)
    rows = []
    for r, rng in enumerate(_replicate_rngs(seed, R)):
        base = _normalise_rows(spec, p.select([r]))
        for s in range(S):
            if s == 0:
                rows.append(base)
                continue
            k, d = spec.k, spec.d
            rows.append(Params(base.gate_bias + rng.normal(0, scale, (1, k)) * gate_free,
                               base.gate_weight + rng.normal(0, scale, (1, k, d)) * gate_free[:, None],
                               base.expert_weight + rng.normal(0, scale, (1, k, d)) * slope_free,
                               base.expert_bias + rng.normal(0, scale, (1, k))))
    return Params.stack(rows)


def _normalise_rows(spec: MoE, p: Params) -> Params:
    p = Params(p.gate_bias, p.gate_weight, p.expert_weight, p.expert_bias)
    if spec.gate in ("softmax", "topk"):
        p = p.normalize_softmax(-1)
    if not spec.family.input_dependent:
        p = Params(p.gate_bias, p.gate_weight, np.zeros_like(p.expert_weight), p.expert_bias)
    return p
