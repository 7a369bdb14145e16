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

from collections.abc import Sequence

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


def kmeans_init(spec: MoE, X: np.ndarray, y: np.ndarray, S: int = 1, *, scale: float = 0.0, seed=None,
                n_iter: int = 20, ridge: float = 1e-6) -> Params:
    """Data-driven starts from k-means clusters of (x, y) (see module docstring)."""
    R, n, d = X.shape
    k = spec.k
    if n < k:
        raise ValueError(f"init='kmeans' needs n >= k observations per replicate, got n={n} < k={k}.")
    gate_free, slope_free = _free_masks(spec)
    parts = []
    for r, rng in enumerate(_replicate_rngs(seed, R)):
        Z = np.concatenate([X[r], y[r][:, None]], 1)
        Zs = (Z - Z.mean(0)) / np.where(Z.std(0) > 0, Z.std(0), 1.0)
        Xa = np.concatenate([np.ones((n, 1)), X[r]], 1)
        for _ in range(S):
            centres = Zs[rng.choice(n, size=k, replace=False)]
            for _ in range(n_iter):
                lab = ((Zs[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
                for i in range(k):
                    if np.any(lab == i):
                        centres[i] = Zs[lab == i].mean(0)
            lab = ((Zs[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
            mu = np.stack([X[r][lab == i].mean(0) if np.any(lab == i) else X[r].mean(0) for i in range(k)])
            within = np.mean([(X[r][lab == i] - mu[i]).var(0).mean() for i in range(k) if np.sum(lab == i) > 1]
                             or [1.0])
            v = within if within > 0 else 1.0
            gw = mu / v
            gb = -(mu**2).sum(1) / (2 * v)
            if spec.gate == "sigmoid":
                logits = X[r] @ gw.T + gb
                gb = gb + np.log(1.0 / (k - 1)) - logits.mean(0) if k > 1 else gb - logits.mean(0)
            ew = np.zeros((k, d))
            eb = np.zeros(k)
            for i in range(k):
                sel = lab == i
                if not np.any(sel):
                    eb[i] = float(y[r].mean())
                    continue
                if spec.family.input_dependent:
                    A = Xa[sel]
                    coef = np.linalg.solve(A.T @ A + ridge * np.eye(d + 1), A.T @ y[r][sel])
                    eb[i], ew[i] = coef[0], coef[1:]
                else:
                    eb[i] = float(y[r][sel].mean())
            p = _finish(spec, gb, gw, ew, eb)
            if scale > 0:
                p = Params(p.gate_bias + rng.normal(0, scale, k) * gate_free,
                           p.gate_weight + rng.normal(0, scale, (k, d)) * gate_free[:, None],
                           p.expert_weight + rng.normal(0, scale, (k, d)) * slope_free,
                           p.expert_bias + rng.normal(0, scale, k))
            parts.append(p)
    return Params.stack(parts)


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
