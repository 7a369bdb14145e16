r"""Nguyen, Akbarian, Yan & Ho (2024), "Statistical perspective of top-K sparse softmax gating mixture of experts"
(ICLR 2024; arXiv:2309.13850): the rates it states, a top-K truth, and the study metrics of its reproduction.

The model is a Gaussian MoE whose gate keeps the :math:`K` largest softmax scores and renormalises them,
:math:`p_G(y\mid x) = \sum_{i\in T_K(x)} \mathrm{softmax}_{T_K(x)}(\beta_{1i}^\top x + \beta_{0i})\,
\mathcal N(y\mid a_i^\top x + b_i, \nu_i)` (moestat's gate ``"topk"``, :mod:`moestat.gates`; the selection ranks the
whole scores, as in Shazeer et al., ICLR 2017).

**What could be read of the paper.**  Only its abstract, the reviews of its ICLR submission and the structure of its
appendix (A: proofs for exact-specified models, B: over-specified, C: identifiability, D: simulations by EM on
synthetic data); its theorem statements, loss formulas and simulation settings could not be reached.  The abstract
says: when the number of experts :math:`k_*` is known (:math:`k = k_*`), density and parameter estimation are both
parametric in :math:`n`; when :math:`k > k_*`, the number :math:`\bar K` of experts the fitted gate selects "must
exceed the total cardinality of a certain number of Voronoi cells" for the density to converge, the density rate
stays parametric, and the parameter rates "become substantially slow" through the interaction of the softmax gate
and the Gaussian experts.  The rows of :data:`THEORY` say which of their exponents are read (the abstract) and which
are derived here: the over-specified exponents :math:`1/(2\bar r)` and :math:`1/\bar r` with :math:`\bar r(2) = 4`
follow because on each input region the top-K model is a softmax-gated MoE of the selected experts, whose exponents
are those of Nguyen, Nguyen & Ho (NeurIPS 2023) (:mod:`moestat.papers.nguyen2023`).

The losses are :mod:`moestat.metrics.topk_voronoi` (region-wise Voronoi losses, derived and checked numerically);
the study metrics are :func:`topk_metric` and :func:`hellinger_metric`; the reproduction is the vignette
``topk-moe``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .._validation import check_choice, check_int
from ..metrics.topk_voronoi import region_inputs, selection_match, selection_shares, topk_voronoi_frame, true_regions
from ..model import MoE
from ..params import Params
from ..simulators.truth import Truth

__all__ = ["ADMISSIBLE_SPLIT", "CRITERIA", "DISCONTINUOUS_PARAMS", "LAMBDA_PARAMS", "PARAMS", "PRESETS", "REFERENCE",
           "THEORY", "TOP_K", "TRUTHS", "decide", "expected_hellinger", "hellinger_metric", "topk_metric", "topk_truth"]

REFERENCE = ("Nguyen, H., Akbarian, P., Yan, F. and Ho, N. (2024). Statistical perspective of top-K sparse softmax "
             "gating mixture of experts. International Conference on Learning Representations (ICLR 2024); "
             "arXiv:2309.13850.")

_SRC = "nguyen2024_topk"
_READ = "read from the abstract"
_DERIVED = ("derived here, not read (the paper's text was unreachable): on each input region the top-K model is the "
            "softmax MoE of the selected experts, whose exponents are those of Nguyen, Nguyen & Ho (2023)")


def _row(result: str, regime: str, quantity: str, response: str, rate: str, exponent: float, note: str
         ) -> tuple[Any, ...]:
    return (_SRC, result, "topk", regime, "linear", "linear", quantity, response, "n", rate, exponent, "power_log",
            "decay", "upper_bound", note)


_BLOCK_WHAT = {"beta1": "gate slopes beta_1 (re-centred per region)", "a": "expert slopes a",
               "b": "expert intercepts b", "nu": "noise variances nu"}

# One row per result, in the columns of :data:`moestat.rates.theory.THEORY_COLUMNS`.
THEORY: list[tuple[Any, ...]] = [
    _row("density estimation, k = k*", "exact", "expected Hellinger distance of the conditional density",
         "hellinger", "(log n / n)^{1/2}", 0.5, f"{_READ}: 'parametric on the sample size'"),
    _row("parameter estimation, k = k*", "exact", "region-wise Voronoi loss (metrics.topk_voronoi)", "topk_voronoi",
         "(log n / n)^{1/2}", 0.5, f"{_READ} ('parametric'); the loss itself is moestat's derivation"),
    *[_row("parameter estimation, k = k*", "exact", _BLOCK_WHAT[b] + ", every atom", f"err_{b}_cell1",
           "(log n / n)^{1/2}", 0.5, f"{_READ} ('parametric')") for b in ("beta1", "a", "b", "nu")],
    _row("density estimation, k > k*", "over", "expected Hellinger distance of the conditional density",
         "hellinger", "(log n / n)^{1/2}", 0.5,
         f"{_READ}: parametric, provided the fitted gate selects as many experts as the Voronoi cells of the true "
         "experts active together hold (Kbar = |A_S|)"),
    _row("parameter estimation, k > k*", "over", "region-wise Voronoi loss with cell-size exponents",
         "topk_voronoi", "(log n / n)^{1/2}", 0.5, _DERIVED),
    *[_row("parameter estimation, k > k*", "over", _BLOCK_WHAT[b] + " in a cell of 2 fitted atoms",
           f"err_{b}_cell2", "n^{-1/8} (up to logs)", 1 / 8,
           f"{_DERIVED}; rbar(2) = 4: the D2 terms |d beta1|^4 and |d b|^4 fall like (log n / n)^(1/2); the "
           "abstract only says 'substantially slow'") for b in ("beta1", "b")],
    *[_row("parameter estimation, k > k*", "over", _BLOCK_WHAT[b] + " in a cell of 2 fitted atoms",
           f"err_{b}_cell2", "n^{-1/4} (up to logs)", 1 / 4,
           f"{_DERIVED}; rbar(2) = 4: the D2 terms |d a|^2 and |d nu|^2 fall like (log n / n)^(1/2)")
      for b in ("a", "nu")],
    *[_row("parameter estimation, k > k*", "over", _BLOCK_WHAT[b] + " of atoms alone in their cell",
           f"err_{b}_cell1", "(log n / n)^{1/2}", 0.5, _DERIVED) for b in ("beta1", "a", "b", "nu")],
]
"""The paper's rates as data (:func:`moestat.rates.theory_rates`)."""


# ----------------------------------------------------------------------------- the truths
TOP_K = 2
"""The truth's number of selected experts :math:`K` (of :data:`PARAMS`)."""

PARAMS = {"gate_bias": [1.0, 0.0, -3.0], "gate_weight": [[-4.0], [0.0], [4.0]],
          "expert_weight": [[-2.0], [2.0], [4.0]], "expert_bias": [4.0, -1.0, 1.0], "noise_sd": [0.3, 0.4, 0.3]}
r"""The ``chain`` truth: :math:`d = 1`, :math:`k^* = 3`, :math:`K = 2`, inputs :math:`U[0, 1]`.  Scores
:math:`1 - 4x`, :math:`0`, :math:`-3 + 4x`: expert 2 is selected everywhere, with expert 1 on :math:`x < 1/2` and
expert 3 on :math:`x > 1/2` (two regions that share expert 2, so the gate is identified); inside a region the weights
vary between 0.27 and 0.73.  Experts :math:`4 - 2x`, :math:`2x - 1`, :math:`1 + 4x` with sds 0.3, 0.4, 0.3: experts
1 and 3 meet at :math:`x = 1/2` with equal sds, so the conditional density is continuous where the weight 0.27 passes
from expert 1 to expert 3 (:data:`DISCONTINUOUS_PARAMS` is the variant with a jump there)."""

DISCONTINUOUS_PARAMS = {**PARAMS, "expert_weight": [[-2.0], [2.0], [1.0]], "expert_bias": [4.0, -1.0, -4.0]}
r"""The ``chain`` truth with expert 3 :math:`= -4 + x`: the density jumps at the region boundary :math:`x = 1/2`
(6.5 units between experts 1 and 3).  The likelihood of a fit then jumps whenever its boundary crosses an
observation, and moestat's top-K likelihood fits, which hold each observation's selected set in the derivatives,
cannot move that boundary (the vignette's pilot)."""

LAMBDA_PARAMS = {"gate_bias": [-8.0, 0.0], "gate_weight": [[25.0], [0.0]], "expert_weight": [[-20.0], [20.0]],
                 "expert_bias": [15.0, -5.0], "noise_sd": [0.3, 0.4]}
r"""The ``lambda`` truth (the softmax benchmark of Nguyen, Nguyen & Ho 2023) under a top-1 gate: expert 2 on
:math:`x < 0.32`, expert 1 above; a third-party reproduction script used it with :math:`K = 1`.  Under a top-1 gate
its gate is identified only through the switch point."""

TRUTHS: dict[str, tuple[dict[str, Any], int]] = {"chain": (PARAMS, TOP_K), "chain_jump": (DISCONTINUOUS_PARAMS, TOP_K),
                                                  "lambda": (LAMBDA_PARAMS, 1)}
"""Truth name -> (parameters, K)."""

ADMISSIBLE_SPLIT = {"chain": [1], "chain_jump": [1], "lambda": [0]}
r"""Per truth, the true atom whose Voronoi cell the over-specified fits split by default: for ``chain`` expert 2, the
one selected on every region, so that a fit with :math:`\bar K = K + 1` selects on each region exactly the atoms of
the cells of the true experts active there; ``lambda`` has no such split for :math:`\bar K = 2` (see the vignette)."""


def topk_truth(name: str = "chain") -> Truth:
    r"""A top-K truth of the reproduction (``name`` a key of :data:`TRUTHS`: ``chain``, ``chain_jump`` or ``lambda``):
    :math:`d = 1`, inputs :math:`U[0, 1]`, responses from the mixture.

    The paper's own simulation truth could not be read; ``chain`` (:data:`PARAMS`) is moestat's stand-in, chosen so
    that the gate is identified (:math:`K = 2`, regions sharing an expert) and one split (expert 2) meets the paper's
    over-specified condition; ``lambda`` (:data:`LAMBDA_PARAMS`, :math:`K = 1`) is the truth a third-party script
    used, kept to show why a top-1 truth does not fit this design; ``chain_jump`` (:data:`DISCONTINUOUS_PARAMS`) is
    the pilot's variant with a density jump at the region boundary.

    Returns
    -------
    Truth
        ``info``: ``source``, ``inputs``, ``regions`` (the realised top-K sets with their input shares) and
        ``duplicate`` (:data:`ADMISSIBLE_SPLIT`).
    """
    check_choice("name", name, TRUTHS)
    values, top_k = TRUTHS[name]
    params = Params(**{key: np.asarray(v, dtype=float) for key, v in values.items()})
    spec = MoE(gate="topk", top_k=top_k, expert="linear", k=params.k, d=1)
    regions = true_regions(params, top_k, region_inputs())
    info = {"source": f"moestat stand-in for the simulation of {_SRC} (ICLR 2024)", "name": name,
            "inputs": "uniform[0,1]", "regions": {"-".join(map(str, S)): round(s, 4) for S, s in regions.items()},
            "duplicate": list(ADMISSIBLE_SPLIT[name])}
    return Truth(spec, params, info)


PRESETS = {"topk_gaussian": topk_truth}
"""Preset name -> constructor: a study truth ``{"preset": "topk_gaussian", "name": "chain", "inputs": "uniform",
"low": 0.0, "high": 1.0, "model": "mixture"}``."""


# ----------------------------------------------------------------------------- density distance
def _mixture_parts(spec: MoE, params: Params, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gate weights, expert means (R, n, k) and noise sds (R, 1, k) of a linear-expert Gaussian MoE."""
    p = params.numpy().batched()
    if p.noise_sd is None:
        raise ValueError("the Hellinger distance needs noise_sd on both measures; pass Params(..., noise_sd=...).")
    reps = int(np.shape(p.gate_bias)[0])
    w = np.asarray(spec.gate_weights(p, X), float).reshape(reps, X.shape[0], -1)
    mu = np.asarray(spec.expert_means(p, X), float).reshape(reps, X.shape[0], -1)
    sd = np.asarray(p.noise_sd, float)[:, None, :]
    return w, mu, sd


def _density(w: np.ndarray, mu: np.ndarray, sd: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mixture density (n, m) on the grid y (m,) for one replicate: w, mu (n, k), sd (1, k)."""
    z = (y[None, :, None] - mu[:, None, :]) / sd[:, None, :]
    return np.asarray(np.einsum("nmk,nk->nm", np.exp(-0.5 * z * z) / (np.sqrt(2 * np.pi) * sd[:, None, :]), w))


def expected_hellinger(spec_f: MoE, params_f: Params, spec_t: MoE, params_t: Params, X: np.ndarray, *,
                       points_per_sd: int = 12, max_points: int = 20_000) -> np.ndarray:
    r"""Expected Hellinger distance :math:`\frac1m\sum_{x\in X} h\big(p_{\hat G}(\cdot\mid x),
    p_{G^*}(\cdot\mid x)\big)` of two linear-expert Gaussian MoEs, per replicate of ``params_f``.

    :math:`h^2(p, q) = 1 - \int\sqrt{p(y)q(y)}\,dy` (the paper's normalisation, :math:`h^2 = \frac12\int(\sqrt p -
    \sqrt q)^2`), the integral by the trapezoid rule on one grid per replicate spanning every component's mean
    :math:`\pm 9` sds with ``points_per_sd`` points per smallest sd (at most ``max_points``).  ``X`` (m, d) stands
    for the input law (e.g. a midpoint grid of a uniform law).

    Returns
    -------
    ndarray, shape (R,)
    """
    X = np.asarray(X, float)
    points_per_sd, max_points = check_int("points_per_sd", points_per_sd), check_int("max_points", max_points)
    wf, muf, sdf = _mixture_parts(spec_f, params_f, X)
    wt, mut, sdt = _mixture_parts(spec_t, params_t, X)
    out = np.empty(wf.shape[0])
    for r in range(wf.shape[0]):
        t = 0 if wt.shape[0] == 1 else r
        mus = np.concatenate([muf[r], mut[t]], -1)
        sds = np.broadcast_to(np.concatenate([sdf[r], sdt[t]], -1), mus.shape)
        lo, hi = float((mus - 9 * sds).min()), float((mus + 9 * sds).max())
        m = int(min(max_points, max(200, np.ceil((hi - lo) / sds.min() * points_per_sd))))
        y = np.linspace(lo, hi, m)
        bc = np.trapezoid(np.sqrt(_density(wf[r], muf[r], sdf[r], y) * _density(wt[t], mut[t], sdt[t], y)), y,
                          axis=-1)
        out[r] = float(np.mean(np.sqrt(np.clip(1.0 - bc, 0.0, None))))
    return out


# ----------------------------------------------------------------------------- study metrics
def _truth_params(ctx: Any) -> Params:
    p: Params = ctx.truth.numpy()
    if p.noise_sd is None:
        raise ValueError("the top-K metrics need the truth's noise_sd in its Params (an explicit truth with "
                         "params.noise_sd).")
    return p


def topk_metric(ctx: Any, low: float = 0.0, high: float = 1.0, grid: int = 2001) -> dict[str, np.ndarray]:
    r"""Study metric (``metrics=["moestat.papers.nguyen2024_topk:topk_metric"]``) for top-K fits of a top-K truth.

    Columns: ``topk_voronoi`` (:func:`moestat.metrics.topk_voronoi.topk_voronoi_loss`, exact-specified for
    :math:`k = k^*`, over-specified otherwise, regions of the truth on the input grid), ``cell_sizes``, the block
    errors ``err_<block>_cell1`` and ``err_<block>_cell2`` (NaN when no cell has that size), ``selection_match``
    (:func:`moestat.metrics.topk_voronoi.selection_match`), ``min_selected_share`` (the smallest share of inputs on
    which a fitted atom is selected: 0 for an atom the gate never uses) and ``loglik_gap``
    :math:`\ell_n(\hat G) - \ell_n(G^*)` on the cell's data (a maximum-likelihood fit is at least 0: a negative gap
    flags a fit short of the maximum).  Inputs: the midpoint grid of ``grid`` points on [``low``, ``high``] (the
    uniform input law).
    """
    truth = _truth_params(ctx)
    X = region_inputs(low, high, grid)
    fitted = ctx.fit.params.numpy()
    frame = topk_voronoi_frame(fitted, truth, ctx.truth_spec.top_k, X=X)
    R = len(frame)
    out: dict[str, np.ndarray] = {"topk_voronoi": frame["loss"].to_numpy(float),
                                  "cell_sizes": frame["cell_sizes"].to_numpy(object)}
    for m in (1, 2):
        for block in ("beta1", "a", "b", "nu"):
            col = f"err_{block}_cell{m}"
            out[col] = frame[col].to_numpy(float) if col in frame else np.full(R, np.nan)
    fit_top_k = ctx.fit_spec.top_k if ctx.fit_spec.gate == "topk" else ctx.fit_spec.k
    out["selection_match"] = selection_match(fitted, truth, ctx.truth_spec.top_k, fit_top_k, X)
    out["min_selected_share"] = selection_shares(fitted, fit_top_k, X).min(-1)
    ll_fit = np.asarray(ctx.fit_spec.loglik(fitted, ctx.data.X, ctx.data.y), float).reshape(R)
    ll_true = np.asarray(ctx.truth_spec.loglik(truth, ctx.data.X, ctx.data.y), float).reshape(R)
    out["loglik_gap"] = ll_fit - ll_true
    return out


def hellinger_metric(ctx: Any, low: float = 0.0, high: float = 1.0, grid: int = 200) -> np.ndarray:
    """Study metric ``hellinger``: :func:`expected_hellinger` of each fit against the truth on the midpoint grid of
    ``grid`` inputs on [``low``, ``high``]."""
    return expected_hellinger(ctx.fit_spec, ctx.fit.params, ctx.truth_spec, _truth_params(ctx),
                              region_inputs(low, high, grid))


hellinger_metric.__name__ = "hellinger"


# ----------------------------------------------------------------------------- success criteria
CRITERIA = {
    "loglik_gap_floor": -1.0,
    "min_share_reaching_truth": 0.9,
    "selection_match_floor": 0.95,
    "density_floor_ratio": 0.7,
}
"""Pre-specified thresholds of the reproduction: a fit reaches the maximum when its ``loglik_gap`` is at least
``loglik_gap_floor`` nats; a cell's fits are usable when at least ``min_share_reaching_truth`` of them do; a fit
routes like the truth when ``selection_match`` is at least ``selection_match_floor``; the density of an inadmissible
fit has stopped converging when its mean Hellinger distance at the largest n is at least ``density_floor_ratio``
times the one at the smallest n."""

_UNDECIDED = ("range too narrow", "no decay", "curved: exponent is local")


def decide(row: pd.Series) -> str:
    """The pre-specified decision for one rate row (``verdict``, ``ci_low``, ``ci_high``, ``theory_exponent``, and
    optionally ``model``): the theory's rates are upper bounds, so an interval above the bound is consistent with
    it and only an interval below it contradicts it."""
    expo = row.get("theory_exponent", np.nan)
    if not np.isfinite(expo) or row.get("model", "power_log") != "power_log":
        return ""
    if row["verdict"] in _UNDECIDED:
        return f"undecided ({row['verdict']})"
    if row["ci_low"] > expo:
        return "faster than the bound (consistent)"
    if row["ci_high"] < expo:
        return "slower than the bound (contradicts)"
    return "agrees"
