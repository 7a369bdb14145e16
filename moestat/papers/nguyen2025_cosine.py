r"""Nguyen, Akbarian, Pham, Nguyen, Zhang & Ho (2025), "Statistical advantages of perturbing cosine router in
mixture of experts" (ICLR 2025; arXiv:2405.14131): the rates it proves, a simulation truth, and a matched-atom
parameter error for the cosine routers, as data and functions.

The model is a least-squares MoE regression :math:`Y = f_{G_*}(X) + \varepsilon` with
:math:`f_G(x) = \sum_i \mathrm{softmax}_i(s(x))\, h(x, \eta_i)` and router scores

* cosine router: :math:`s_i(x) = \beta_{0i} + \beta_{1i}^\top x / (\lVert\beta_{1i}\rVert\,\lVert x\rVert)`;
* perturbed cosine router: small positive constants added to the two :math:`L^2` norms of the cosine.

moestat's gates ``cosine`` and ``perturbed_cosine`` (:mod:`moestat.gates`) implement these scores, the perturbed
one as :math:`\beta_{0i} + \beta_{1i}^\top x / ((\lVert\beta_{1i}\rVert + \varepsilon)(\lVert x\rVert +
\varepsilon))` with one constant :math:`\varepsilon` (``gate_eps``, default
:data:`moestat.gates.PERTURBED_COSINE_EPS` = 0.1) for both norms (whether the paper allows two different constants
was not checked); a softmax temperature, where used, divides the whole score.

What the paper proves (rows of :data:`THEORY`): the regression function converges at :math:`(\log n/n)^{1/2}` in
:math:`L^2(\mu)` under both routers; under the cosine router the parameters and experts can converge as slowly as
:math:`O(1/\log^{\tau} n)` for some unknown :math:`\tau > 0` (a minimax lower bound slower than every polynomial
rate, caused by the interaction :math:`\beta_1^\top \partial u/\partial\beta_1 = 0` of the router's parameters);
under the perturbed router with strongly identifiable experts the rates are polynomial, between
:math:`(\log n/n)^{1/4}` (atoms of over-specified Voronoi cells) and :math:`(\log n/n)^{1/2}` (exact-specified
atoms).

The rows' ``response`` names are the columns that :func:`router_error_metric` writes (``err_exact_*``, one fitted
atom per true atom, :math:`k = k^*`) and ``l2`` (:func:`moestat.cells.l2_metric`).  The reproduction is the
vignette ``cosine-router``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .._validation import check_choice
from ..gates import PERTURBED_COSINE_EPS
from ..model import MoE
from ..params import Params
from ..simulators.truth import Truth

__all__ = ["BLOCKS", "GATES", "PARAMS", "REFERENCE", "THEORY", "cosine_router_truth", "perturbed_map",
           "router_error_metric", "router_errors"]

REFERENCE = ("Nguyen, H., Akbarian, P., Pham, T., Nguyen, T., Zhang, S. and Ho, N. (2025). Statistical advantages "
             "of perturbing cosine router in mixture of experts. International Conference on Learning "
             "Representations (ICLR 2025); arXiv:2405.14131.")

GATES = ("cosine", "perturbed_cosine", "softmax")
"""The routers :func:`cosine_router_truth` and :func:`router_errors` accept (softmax: the linear router, a
reference)."""

BLOCKS = ("gate_bias", "gate_slope", "expert", "param")
"""The identified error blocks of :func:`router_errors` (``gate_norm`` is added for the cosine router)."""

_SRC = "nguyen2025_cosine"
_STRONG = "gelu|tanh|sigmoid"


def _rows(gate: str, result: str, rate: str, exponent: float, rate_model: str, kind: str, examples: str,
          expert: str, note: str, prefix: str = "err_exact_", blocks: tuple[str, ...] = BLOCKS
          ) -> list[tuple[Any, ...]]:
    """One theory row per parameter-error block (``blocks``) of :func:`router_errors`."""
    what = {"gate_bias": "router intercepts beta_0 (translation removed)",
            "gate_slope": "router slopes beta_1 (identified part: direction for the cosine router, centred "
                          "w/(||w|| + eps) for the perturbed router)",
            "expert": "expert parameters eta", "param": "all parameters of an atom (largest over atoms)"}
    return [(_SRC, result, gate, "", expert, examples, what[block], f"{prefix}{block}", "n", rate, exponent,
             rate_model, "decay", kind, note) for block in blocks]


# One row per result, in the columns of :data:`moestat.rates.theory.THEORY_COLUMNS`.
THEORY: list[tuple[Any, ...]] = [
    (_SRC, "regression estimation", "cosine", "", "any", "", "L2(mu) distance of the fitted regression function",
     "l2", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", "least squares, any k >= k*"),
    (_SRC, "regression estimation", "perturbed_cosine", "", "any", "",
     "L2(mu) distance of the fitted regression function", "l2", "n", "(log n / n)^{1/2}", 0.5, "power_log",
     "decay", "upper_bound", "least squares, any k >= k*"),
    *_rows("cosine", "parameter and expert estimation (cosine router)", "O(1/log^{tau} n), tau > 0 unknown",
           np.nan, "inverse_log", "slower_than_polynomial", "", "any",
           "minimax lower bound: slower than n^{-1/(2r)} for every r >= 1, whatever the experts; the router's "
           "parameters interact through the PDE beta_1^T du/dbeta_1 = 0 (the scores ignore ||beta_1||)"),
    *_rows("perturbed_cosine", "parameter and expert estimation (perturbed cosine router), exact-specified atoms",
           "(log n / n)^{1/2}", 0.5, "power_log", "upper_bound", _STRONG, "strongly_identifiable",
           "atoms alone in their Voronoi cell (every atom when k = k*)"),
    *_rows("perturbed_cosine", "parameter and expert estimation (perturbed cosine router), over-specified atoms",
           "(log n / n)^{1/4}", 0.25, "power_log", "upper_bound", _STRONG, "strongly_identifiable",
           "atoms of Voronoi cells with two or more fitted atoms (k > k*; their intercepts have no rate, only the "
           "cell's weight sum); not recorded by the cosine-router vignette, which fits k = k*", prefix="err_over_",
           blocks=("gate_slope", "expert")),
]
"""The paper's rates as data (:func:`moestat.rates.theory_rates`)."""


# ----------------------------------------------------------------------------- the simulation truth
PARAMS = {"gate_bias": [0.3, 0.0], "gate_weight": [[1.5, 0.5], [-0.5, 1.5]],
          "expert_weight": [[1.0, -0.8], [-0.6, 1.2]], "expert_bias": [0.2, -0.3]}
"""The true atoms of :func:`cosine_router_truth`: :math:`d = 2`, :math:`k^* = 2`, gate directions 90 degrees apart,
ridge experts kinked inside :math:`[-1, 1]^2`."""


def cosine_router_truth(gate: str = "perturbed_cosine", expert: str = "gelu", *, noise_sd: float = 0.1) -> Truth:
    r"""The true model of the cosine-router reproduction: :math:`d = 2`, :math:`k^* = 2` atoms of :data:`PARAMS`,
    inputs :math:`U[-1, 1]^2`, Gaussian noise of sd ``noise_sd``.

    The paper's own simulation values could not be read for this module, so this is moestat's stand-in for its
    synthetic setting (least-squares regression, a few atoms, strongly identifiable experts, uniform inputs):
    one parameter set used with every router, so that the cosine, perturbed cosine and softmax truths differ only
    in the router (paired designs share inputs and noise).  Both gate vectors are non-zero (the cosine of a zero
    vector is undefined) and point 90 degrees apart.

    Parameters
    ----------
    gate : {"cosine", "perturbed_cosine", "softmax"}
        The router of the truth (``perturbed_cosine`` uses :data:`moestat.gates.PERTURBED_COSINE_EPS`).
    expert : str
        Expert family; ``"gelu"`` (default) is strongly identifiable.
    noise_sd : float
        Noise standard deviation (> 0).

    Returns
    -------
    Truth
        ``info`` records the source, the inputs and ``gate_eps``.
    """
    check_choice("gate", gate, GATES)
    if isinstance(noise_sd, bool) or not isinstance(noise_sd, (int, float)) or not 0 < noise_sd < np.inf:
        raise ValueError(f"noise_sd must be a finite number > 0, got {noise_sd!r}; e.g. noise_sd=0.1.")
    spec = MoE(gate=gate, expert=expert, k=2, d=2, noise_sd=float(noise_sd))
    params = Params(**{key: np.asarray(value, dtype=float) for key, value in PARAMS.items()})
    info = {"source": "moestat stand-in for the synthetic setting of nguyen2025_cosine (ICLR 2025)", "gate": gate,
            "expert": expert, "inputs": "uniform[-1,1]", "noise_sd": float(noise_sd),
            "gate_eps": PERTURBED_COSINE_EPS if gate == "perturbed_cosine" else None, "duplicate": []}
    return Truth(spec, params, info)


# ----------------------------------------------------------------------------- matched-atom errors
def perturbed_map(w: np.ndarray, eps: float = PERTURBED_COSINE_EPS) -> np.ndarray:
    r""":math:`g(w) = w / (\lVert w\rVert + \varepsilon)` along the last axis: the perturbed router's score is
    :math:`\beta_0 + g(\beta_1)^\top x/(\lVert x\rVert + \varepsilon)`, so :math:`g(\beta_1)` is what the data see."""
    w = np.asarray(w, dtype=float)
    out: np.ndarray = w / (np.linalg.norm(w, axis=-1, keepdims=True) + eps)
    return out


def _slope_features(gate: str, w: np.ndarray, ref: int, eps: float) -> np.ndarray:
    """Identified slope coordinates of every atom, centred at atom ``ref``: directions w/||w|| (cosine), g(w)
    (perturbed), w (softmax)."""
    if gate == "cosine":
        u = w / np.maximum(np.linalg.norm(w, axis=-1, keepdims=True), 1e-12)
    else:
        u = perturbed_map(w, eps) if gate == "perturbed_cosine" else w
    centred: np.ndarray = u - u[..., ref:ref + 1, :]
    return centred


def router_errors(fitted: Params, truth: Params, gate: str, *, eps: float = PERTURBED_COSINE_EPS
                  ) -> dict[str, np.ndarray]:
    r"""Largest per-atom errors of a fit with :math:`k = k^*` atoms, after matching atoms and removing the router's
    invariances.  One value per replicate in each column.

    The fitted atoms are matched one to one to the true atoms by the permutation :math:`\pi` that minimises the
    summed squared distance of the identified coordinates below (exhaustive over the :math:`k!` permutations).
    With :math:`r = k^*` the reference (last) true atom and :math:`\hat\imath = \pi(j)`:

    * ``err_exact_gate_bias``: :math:`\max_j |(\hat\beta_{0\hat\imath} - \hat\beta_{0\pi(r)}) - (\beta^*_{0j} -
      \beta^*_{0r})|` (softmax routers are invariant to a common intercept shift);
    * ``err_exact_gate_slope``: the identified part of :math:`\beta_1`,
      :math:`\max_j \lVert (\hat u_{\hat\imath} - \hat u_{\pi(r)}) - (u^*_j - u^*_r)\rVert` with
      :math:`u = \beta_1/\lVert\beta_1\rVert` for the cosine router (its scores ignore :math:`\lVert\beta_1\rVert`),
      :math:`u = g(\beta_1)` (:func:`perturbed_map`) for the perturbed router and :math:`u = \beta_1` for softmax:
      the scores enter the softmax only through their differences, so only the differences
      :math:`u_i - u_r` are seen.  For the cosine router this matters beyond the norms: unit vectors
      :math:`u_i + t` (all still of norm one) give the same model, so with :math:`k = 2` the pair
      :math:`(u_1, u_2)` and :math:`(-u_2, -u_1)` are the same router (and for :math:`k \le d` such shifts exist
      generically);
    * ``err_exact_expert``: :math:`\max_j \lVert\hat\eta_{\hat\imath} - \eta^*_j\rVert`, :math:`\eta = (a, b)`;
    * ``err_exact_param``: :math:`\max_j` of the Euclidean norm of all of an atom's identified differences above;
    * ``err_exact_gate_norm`` (cosine router only): :math:`\max_j |\lVert\hat\beta_{1\hat\imath}\rVert -
      \lVert\beta^*_{1j}\rVert|`, the part of :math:`\beta_1` the data cannot see (it stays where the optimiser
      left it).

    Parameters
    ----------
    fitted : Params
        Fitted parameters, unbatched or batched (R, k, ...), with :math:`k = k^*`.
    truth : Params
        True parameters (unbatched).
    gate : {"cosine", "perturbed_cosine", "softmax"}
    eps : float
        The perturbed router's constant (``gate_eps``).

    Returns
    -------
    dict of str to ndarray, each (R,)
    """
    check_choice("gate", gate, GATES)
    f, t = fitted.numpy(), truth.numpy()
    fb, fw, fa, fe = (np.asarray(getattr(f, b), float) for b in ("gate_bias", "gate_weight", "expert_weight",
                                                                  "expert_bias"))
    if fb.ndim == 1:
        fb, fw, fa, fe = fb[None], fw[None], fa[None], fe[None]
    k, k_star = fb.shape[-1], np.asarray(t.gate_bias).shape[-1]
    if k != k_star:
        raise ValueError(f"router_errors matches one fitted atom to each true atom; the fit has k={k} atoms and the "
                         f"truth k*={k_star}: fit k = k* (over-specified fits need Voronoi-cell errors).")
    if k > 8:
        raise ValueError(f"router_errors matches atoms exhaustively (k! permutations); k={k} is too many (at most 8).")
    tb, tw = np.asarray(t.gate_bias, float), np.asarray(t.gate_weight, float)
    t_eta = np.concatenate([np.asarray(t.expert_weight, float), np.asarray(t.expert_bias, float)[:, None]], -1)
    f_eta = np.concatenate([fa, fe[..., None]], -1)
    ref = k_star - 1
    t_slope, t_bias = _slope_features(gate, tw, ref, eps), tb - tb[ref]
    best_cost = np.full(fb.shape[0], np.inf)
    out: dict[str, np.ndarray] = {}
    for perm in itertools.permutations(range(k)):
        p = list(perm)
        slope = _slope_features(gate, fw[:, p], ref, eps)
        d_bias = np.abs((fb[:, p] - fb[:, p][:, ref:ref + 1]) - t_bias)
        d_slope = np.linalg.norm(slope - t_slope, axis=-1)
        d_eta = np.linalg.norm(f_eta[:, p] - t_eta, axis=-1)
        total = np.sqrt(d_bias ** 2 + d_slope ** 2 + d_eta ** 2)
        cost = (total ** 2).sum(-1)
        better = cost < best_cost
        best_cost = np.where(better, cost, best_cost)
        cols = {"gate_bias": d_bias, "gate_slope": d_slope, "expert": d_eta, "param": total}
        if gate == "cosine":
            cols["gate_norm"] = np.abs(np.linalg.norm(fw[:, p], axis=-1) - np.linalg.norm(tw, axis=-1))
        for name, value in cols.items():
            key = f"err_exact_{name}"
            out[key] = np.where(better, value.max(-1), out.get(key, np.full(fb.shape[0], np.nan)))
    return out


def router_error_metric(ctx: Any) -> dict[str, np.ndarray]:
    """Study metric (``metrics=["moestat.papers.nguyen2025_cosine:router_error_metric"]``): :func:`router_errors`
    of the cell's fits with the fitted router's gate and ``gate_eps``; ``err_exact_gate_norm`` is NaN for routers
    other than the cosine router.  Needs ``k = k*`` and a fitted router equal to the truth's."""
    gate = ctx.fit_spec.gate
    if gate != ctx.truth_spec.gate:
        raise ValueError(f"router_error_metric compares a fit with the truth's router; the fit uses {gate!r} and the "
                         f"truth {ctx.truth_spec.gate!r}: fit each truth with its own gate (leave the fit's gate out).")
    eps = ctx.fit_spec.gate_eps if getattr(ctx.fit_spec, "gate_eps", None) is not None else PERTURBED_COSINE_EPS
    out = router_errors(ctx.fit.params, ctx.truth, gate, eps=eps)
    if "err_exact_gate_norm" not in out:
        out["err_exact_gate_norm"] = np.full(len(out["err_exact_param"]), np.nan)
    return out
