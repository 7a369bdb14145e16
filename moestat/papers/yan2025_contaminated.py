r"""Contaminated mixtures of experts with a frozen expert: Yan, Nguyen, Le, Akbarian & Ho (AISTATS 2025) and Yan,
Nguyen, Le, Akbarian, Ho & Rinaldo (NeurIPS 2025) — their rates as data, the truths of the reproduction and the
:class:`moestat.Study` cell that runs it.

The model (:mod:`moestat.contaminated`) mixes a frozen, pre-trained model :math:`f_0` with one trainable Gaussian
prompt expert:

.. math::

    p(y \mid x) = (1 - w(x))\, f_0(y \mid x) + w(x)\,\mathcal N(y; a^\top x + b, \nu),

with a constant weight :math:`w = \lambda` (AISTATS 2025, arXiv:2410.12258) or a softmax gate
:math:`w(x) = \sigma(\beta^\top x + \tau)` (NeurIPS 2025, arXiv:2505.18455); the prompt and the gate are
estimated by maximum likelihood (:func:`moestat.contaminated.fit_contaminated`).

What the papers establish (from their abstracts; the theorem statements could not be read for this module): the
MLE's rates for the mixing proportion (or gate) and the prompt, with matching minimax lower bounds, depend on
whether :math:`\lambda^*` vanishes with :math:`n` ("prompt vanishing") and on whether the prompt's family can
reproduce :math:`f_0` ("distinguishability"); when it can and the prompt approaches :math:`f_0` ("prompt
merging"), the rates slow down with the distance :math:`\lVert\Delta^*\rVert = \lVert\theta^* - \theta_0\rVert`.
The exact exponents of :data:`THEORY` were derived here from the local expansion of :math:`p_{\hat G} - p_{G^*}`
(``docs/contaminated.md``) and checked against the expected information
(:func:`moestat.contaminated.fisher_information`) in the tests; their ``kind`` is ``derived`` except the softmax
gate's parametric rates under distinguishability, which the NeurIPS abstract states as minimax optimal.

* :data:`SETTINGS` and :func:`setting_truth`: the five truths of the vignette ``contaminated-moe`` (fixed and
  vanishing :math:`\lambda^*`, a merging prompt; the softmax gate with and without distinguishability);
* :func:`predicted_exponent` (the small-distance limit of the theory for any :math:`\gamma, \kappa`) and
  :func:`design_sizes` / :func:`design_exponents` (what the expected information predicts on a given n grid);
* :func:`contaminated_cell`: the study cell (simulate, fit, score).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..contaminated import (
    ContaminatedParams,
    ContaminatedTruth,
    FrozenExpert,
    contaminated_errors,
    contaminated_truth,
    fisher_information,
    fit_contaminated,
)
from ..model import MoE
from ..params import Params

if TYPE_CHECKING:
    from ..cells import CellContext

__all__ = ["FROZEN_GAUSSIAN", "FROZEN_MOE", "GAMMA", "INPUTS", "KAPPA", "KAPPA_SOFTMAX", "REFERENCE",
           "REFERENCE_SOFTMAX", "RESPONSES", "SETTINGS", "THEORY", "contaminated_cell", "design_exponents",
           "design_sizes", "frozen_expert", "predicted_exponent", "predicted_sizes", "setting_truth", "size_exponents"]

REFERENCE = ("Yan, F., Nguyen, H., Le, D., Akbarian, P. and Ho, N. (2025). Understanding expert structures on minimax "
             "parameter estimation in contaminated mixture of experts. Proceedings of the 28th International "
             "Conference on Artificial Intelligence and Statistics (AISTATS 2025); arXiv:2410.12258.")
REFERENCE_SOFTMAX = ("Yan, F., Nguyen, H., Le, D., Akbarian, P., Ho, N. and Rinaldo, A. (2025). On minimax estimation "
                     "of parameters in softmax-contaminated mixture of experts. Advances in Neural Information "
                     "Processing Systems 38 (NeurIPS 2025); arXiv:2505.18455.")

_SRC = "yan2025_contaminated"
GAMMA = 0.25
"""The vanishing rate :math:`\\gamma` of :math:`\\lambda^*_n` in the setting ``dist_vanishing``."""
KAPPA = 1.0 / 6.0
"""The merging rate :math:`\\kappa` of :math:`\\lVert\\Delta^*_n\\rVert` in ``nondist_merging`` (constant gate)."""
KAPPA_SOFTMAX = 0.25
"""The merging rate of ``softmax_nondist_merging``."""

RESPONSES = ("lam_err", "gate_err", "prompt_err", "loss_dist", "loss_nondist")
"""The error columns of :func:`contaminated_cell` that carry rates."""


def _row(result: str, gate: str, regime: str, quantity: str, response: str, rate: str, exponent: float, kind: str,
         note: str) -> tuple[Any, ...]:
    return (_SRC, result, gate, regime, "linear", "linear", quantity, response, "n", rate, exponent, "power",
            "decay", kind, note)


_DERIVED = ("derived here from the local expansion of p_G - p_G* (theorem text not read); the paper proves a "
            "matching minimax lower bound for its rates (abstract)")

# One row per result, in the columns of :data:`moestat.rates.theory.THEORY_COLUMNS`.
THEORY: list[tuple[Any, ...]] = [
    # AISTATS 2025: constant mixing weight
    _row("distinguishable, fixed truth", "constant", "lambda_fixed", "|lambda_hat - lambda*|", "lam_err",
         "n^{-1/2}", 0.5, "derived", "parametric: f0 is not in the prompt's family; " + _DERIVED),
    _row("distinguishable, fixed truth", "constant", "lambda_fixed", "||theta_hat - theta*||, theta = (a, b, nu)",
         "prompt_err", "n^{-1/2} / lambda*", 0.5, "derived", "parametric at fixed lambda*; " + _DERIVED),
    _row("distinguishable (any lambda*_n)", "constant", "lambda_fixed|lambda_vanishing",
         "|lambda_hat - lambda*| + lambda* ||theta_hat - theta*||", "loss_dist", "n^{-1/2}", 0.5, "derived",
         "uniform in lambda* (the loss weights the prompt by lambda*); " + _DERIVED),
    _row("distinguishable, lambda*_n = c n^{-gamma} (prompt vanishing)", "constant", "lambda_vanishing",
         "|lambda_hat - lambda*_n|", "lam_err", "n^{-1/2}", 0.5, "derived", _DERIVED),
    _row("distinguishable, lambda*_n = c n^{-gamma} (prompt vanishing)", "constant", "lambda_vanishing",
         "||theta_hat - theta*||", "prompt_err", "n^{-1/2} / lambda*_n = n^{-(1/2 - gamma)}", 0.5 - GAMMA,
         "derived", f"exponent 1/2 - gamma, here gamma = {GAMMA:g}; a worst case over prompts: a prompt that stands "
                    "out of f0 converges faster, like (lambda* n)^{-1/2}; " + _DERIVED),
    _row("non-distinguishable: ||theta*_n - theta0|| = c n^{-kappa} (prompt merging)", "constant", "merging",
         "|lambda_hat - lambda*|", "lam_err", "n^{-1/2} / ||Delta*||^2 = n^{-(1/2 - 2 kappa)}", 0.5 - 2 * KAPPA,
         "derived", f"exponent 1/2 - 2 kappa, here kappa = {KAPPA:.4g}; the first-order term identifies only "
                    "lambda Delta, lambda comes from the second-order term (needs a slope component: the Gaussian "
                    "PDE d2f/db2 = 2 df/dnu makes Delta = (0, db, dnu) slower); " + _DERIVED),
    _row("non-distinguishable: ||theta*_n - theta0|| = c n^{-kappa} (prompt merging)", "constant", "merging",
         "||theta_hat - theta*||", "prompt_err", "n^{-1/2} / (lambda* ||Delta*||) = n^{-(1/2 - kappa)}",
         0.5 - KAPPA, "derived", f"exponent 1/2 - kappa at fixed lambda*, here kappa = {KAPPA:.4g}; " + _DERIVED),
    _row("non-distinguishable (any Delta*_n, lambda*_n)", "constant", "merging",
         "|dlambda| ||Delta*||^2 + lambda* ||Delta*|| ||theta_hat - theta*||", "loss_nondist", "n^{-1/2}", 0.5,
         "derived", "uniform in Delta* and lambda*; " + _DERIVED),
    # NeurIPS 2025: softmax gate sigma(beta x + tau)
    _row("distinguishable, fixed truth (softmax gate)", "softmax", "lambda_fixed",
         "||beta_hat - beta*|| + |tau_hat - tau*|", "gate_err", "n^{-1/2}", 0.5, "upper_bound",
         "the NeurIPS 2025 abstract: minimax optimal rates for all gating and prompt parameters under "
         "distinguishability (a summary writes O~(n^{-1/2})); theorem number not read"),
    _row("distinguishable, fixed truth (softmax gate)", "softmax", "lambda_fixed", "||theta_hat - theta*||",
         "prompt_err", "n^{-1/2}", 0.5, "upper_bound", "as the gate row"),
    _row("distinguishable, fixed truth (softmax gate)", "softmax", "lambda_fixed",
         "||dbeta|| + |dtau| + ||theta_hat - theta*||", "loss_dist", "n^{-1/2}", 0.5, "upper_bound",
         "as the gate row"),
    _row("non-distinguishable: ||theta*_n - theta0|| = c n^{-kappa} (softmax gate)", "softmax", "merging",
         "||beta_hat - beta*|| + |tau_hat - tau*|", "gate_err", "n^{-1/2} / ||Delta*|| = n^{-(1/2 - kappa)}",
         0.5 - KAPPA_SOFTMAX, "derived",
         f"exponent 1/2 - kappa, here kappa = {KAPPA_SOFTMAX:g}: the first-order term is w(x) Delta, whose "
         "derivative in the gate is proportional to ||Delta||; the abstract: rates 'depend on the prompt "
         "convergence rate to the pre-trained model'; " + _DERIVED),
    _row("non-distinguishable: ||theta*_n - theta0|| = c n^{-kappa} (softmax gate)", "softmax", "merging",
         "||theta_hat - theta*||", "prompt_err", "n^{-1/2}", 0.5, "derived",
         "the prompt stays parametric: the x-shape of the gate separates w(x) from Delta; " + _DERIVED),
    _row("non-distinguishable (any Delta*_n, softmax gate)", "softmax", "merging",
         "||Delta*|| (||dbeta|| + |dtau|) + ||theta_hat - theta*||", "loss_nondist", "n^{-1/2}", 0.5, "derived",
         "uniform in Delta*; " + _DERIVED),
]
"""The rates as data (:func:`moestat.rates.theory_rates`); regime ``lambda_fixed``, ``lambda_vanishing`` or
``merging``; the exponents of the vanishing and merging rows are for :data:`GAMMA`, :data:`KAPPA` and
:data:`KAPPA_SOFTMAX` (:func:`predicted_exponent` gives any other)."""


def predicted_exponent(response: str, *, gate: str = "constant", distinguishable: bool = True, gamma: float = 0.0,
                       kappa: float = 0.0) -> float:
    r"""The small-distance limit of the theory: :math:`\alpha` in ``response`` :math:`\propto n^{-\alpha}` for
    :math:`\lambda^*_n \propto n^{-\gamma}` (constant gate) and :math:`\lVert\Delta^*_n\rVert \propto n^{-\kappa}`
    (non-distinguishable settings).

    ===================  ============================  =========================  ============================
    response             constant, distinguishable     constant, non-dist.        softmax (dist. / non-dist.)
    ===================  ============================  =========================  ============================
    ``lam_err``          1/2                           1/2 - 2 kappa              —
    ``gate_err``         —                             —                          1/2 / 1/2 - kappa
    ``prompt_err``       1/2 - gamma                   1/2 - kappa - gamma        1/2 / 1/2
    ``loss_dist``        1/2                           —                          1/2 / —
    ``loss_nondist``     —                             1/2                        — / 1/2
    ===================  ============================  =========================  ============================

    NaN where the response is not defined.
    """
    if gate not in ("constant", "softmax"):
        raise ValueError(f"gate={gate!r} is not supported; valid values are ['constant', 'softmax'].")
    if response not in RESPONSES:
        raise ValueError(f"response={response!r} is not supported; valid values are {list(RESPONSES)}.")
    for name, value in (("gamma", gamma), ("kappa", kappa)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < np.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
    if gate == "constant":
        table = {"lam_err": 0.5 if distinguishable else 0.5 - 2 * kappa,
                 "prompt_err": 0.5 - gamma if distinguishable else 0.5 - kappa - gamma,
                 "loss_dist": 0.5 if distinguishable else np.nan,
                 "loss_nondist": np.nan if distinguishable else 0.5}
    else:
        table = {"gate_err": 0.5 if distinguishable else 0.5 - kappa, "prompt_err": 0.5,
                 "loss_dist": 0.5 if distinguishable else np.nan, "loss_nondist": np.nan if distinguishable else 0.5}
    return float(table.get(response, np.nan))


# ----------------------------------------------------------------------------- the truths
FROZEN_MOE = {"gate_bias": [0.0, 0.0], "gate_weight": [[1.5], [-1.5]], "expert_weight": [[1.5], [-2.0]],
              "expert_bias": [0.5, 0.0], "noise_sd": [0.3, 0.3]}
"""The frozen model of the distinguishable settings: a two-expert softmax-gated moestat MoE with tanh experts
(:math:`d = 1`), a stand-in for a pre-trained model; a linear Gaussian prompt cannot reproduce it."""
FROZEN_GAUSSIAN: dict[str, Any] = {"weight": [1.0], "bias": 0.0, "var": 0.25}
r"""The frozen model of the non-distinguishable settings: :math:`\mathcal N(y; x, 0.25)`, a linear Gaussian expert
of the prompt's own family."""
INPUTS: dict[str, Any] = {"inputs": "uniform", "low": -2.0, "high": 2.0}
"""Inputs of every setting: :math:`x \\sim U[-2, 2]`."""

SETTINGS: dict[str, dict[str, Any]] = {
    "dist_fixed": {"frozen": "moe", "gate": "constant", "lam": 0.3, "prompt": [0.5, 0.0, 0.09]},
    "dist_vanishing": {"frozen": "moe", "gate": "constant", "lam": 0.3 * 1000 ** GAMMA, "lam_rate": GAMMA,
                       "prompt": [0.5, 0.0, 0.09]},
    "nondist_merging": {"frozen": "gaussian", "gate": "constant", "lam": 0.5, "direction": [1.0, 0.0, 0.0],
                        "separation": 0.4 * 1000 ** KAPPA, "approach_rate": KAPPA},
    "softmax_dist": {"frozen": "moe", "gate": "softmax", "gate_weight": [2.0], "gate_bias": 0.0,
                     "prompt": [0.5, 0.0, 0.09]},
    "softmax_nondist_merging": {"frozen": "gaussian", "gate": "softmax", "gate_weight": [2.0], "gate_bias": 0.0,
                                "direction": [1.0, 0.0, 0.0], "separation": 0.8 * 1000 ** KAPPA_SOFTMAX,
                                "approach_rate": KAPPA_SOFTMAX},
}
r"""The truths of the reproduction (moestat's choices; the papers' simulation values could not be read).
:math:`\theta = (a, b, \nu)`.  ``dist_*``: the frozen MoE :data:`FROZEN_MOE` and the prompt
:math:`0.5x + \mathcal N(0, 0.09)`, which lies inside :math:`f_0`'s range.  ``dist_vanishing``:
:math:`\lambda^*_n = 0.3\,(n/1000)^{-1/4}`.  ``*_merging``: the frozen :data:`FROZEN_GAUSSIAN` and a prompt whose
slope is :math:`\lVert\Delta^*_n\rVert` above the frozen slope, :math:`0.4\,(n/1000)^{-1/6}` (constant gate,
:math:`\lambda^* = 0.5`) or :math:`0.8\,(n/1000)^{-1/4}` (softmax gate :math:`\sigma(2x)`)."""


def frozen_expert(kind: str) -> FrozenExpert:
    """The frozen model ``"moe"`` (:data:`FROZEN_MOE`, from a moestat MoE) or ``"gaussian"``
    (:data:`FROZEN_GAUSSIAN`)."""
    if kind == "moe":
        spec = MoE(gate="softmax", expert="tanh", k=2, d=1, noise_sd=0.3)
        params = Params(**{k: np.asarray(v, float) for k, v in FROZEN_MOE.items()})
        return FrozenExpert.from_moe(spec, params, label="frozen tanh MoE (k=2)")
    if kind == "gaussian":
        return FrozenExpert.gaussian_expert(FROZEN_GAUSSIAN["weight"], FROZEN_GAUSSIAN["bias"], FROZEN_GAUSSIAN["var"])
    raise ValueError(f"kind={kind!r} is not a frozen model of this module; valid values are ['gaussian', 'moe'].")


def setting_truth(setting: str, n: int, **overrides: Any) -> ContaminatedTruth:
    """The truth of ``setting`` (:data:`SETTINGS`) at sample size ``n``; ``overrides`` replace its knobs (any
    keyword of :func:`moestat.contaminated.contaminated_truth`, or ``frozen``)."""
    if setting not in SETTINGS:
        raise ValueError(f"setting={setting!r} is not known; valid values are {sorted(SETTINGS)}.")
    cfg = {**SETTINGS[setting], **overrides}
    frozen = frozen_expert(cfg.pop("frozen"))
    truth = contaminated_truth(n, frozen, **cfg)
    truth.info["setting"] = setting
    return truth


# ----------------------------------------------------------------------------- predictions of the information
def predicted_sizes(truth: ContaminatedTruth, n: int, info: np.ndarray) -> dict[str, float]:
    r"""Asymptotic size of each response of :func:`contaminated_cell` at ``n`` from the expected information ``info``
    of one observation at ``truth``: with :math:`\Sigma = I^{-1}/n`, ``prompt_err`` is
    :math:`\sqrt{\operatorname{tr}\Sigma_{\theta\theta}}`, ``lam_err`` :math:`\sqrt{\Sigma_{\lambda\lambda}}`,
    ``gate_err`` :math:`\sqrt{\Sigma_{\beta\beta}} + \sqrt{\Sigma_{\tau\tau}}`, and the losses combine these with
    their weights (NaN where :math:`\theta_0` is not defined)."""
    cov = np.linalg.inv(info) / n
    q = truth.model.n_gate
    prompt = float(np.sqrt(np.trace(cov[q:, q:])))
    gate = float(np.sqrt(np.diag(cov[:q, :q])).sum())
    out = {"prompt_err": prompt}
    theta0 = truth.theta0()
    delta = float(np.linalg.norm(truth.params.theta()[0] - theta0)) if theta0 is not None else np.nan
    if truth.model.gate == "constant":
        lam = float(truth.params.lam[0])
        out.update(lam_err=gate, loss_dist=gate + lam * prompt, loss_nondist=gate * delta ** 2 + lam * delta * prompt)
    else:
        out.update(gate_err=gate, loss_dist=gate + prompt, loss_nondist=delta * gate + prompt)
    return out


def design_sizes(setting: str, ns: Any, *, n_y: int = 2001, **overrides: Any) -> pd.DataFrame:
    r"""The asymptotic size of every response (:func:`predicted_sizes`) at each :math:`n` of ``ns``, from the expected
    information (:func:`moestat.contaminated.fisher_information`) of the truth :math:`G^*_n` of ``setting``.

    Returns
    -------
    DataFrame
        ``setting, n, response, size`` (responses that are not defined for the setting are left out).
    """
    grid = np.asarray(list(ns), dtype=float)
    if grid.ndim != 1 or len(grid) < 2 or not (grid > 1).all():
        raise ValueError(f"ns must be at least two sample sizes > 1, got {grid.tolist()}.")
    rows = []
    for n in grid.astype(int):
        truth = setting_truth(setting, int(n), **overrides)
        info = fisher_information(truth.model, truth.params, inputs=INPUTS["inputs"], low=INPUTS["low"],
                                  high=INPUTS["high"], n_y=n_y)
        rows += [{"setting": setting, "n": int(n), "response": key, "size": value}
                 for key, value in predicted_sizes(truth, int(n), info).items() if np.isfinite(value)]
    return pd.DataFrame(rows)


def size_exponents(sizes: pd.DataFrame) -> pd.DataFrame:
    """The exponent of a least-squares line through log size against log n, per setting and response of a
    :func:`design_sizes` frame: ``setting, response, exponent, n_min, n_max, size_at_n_min, size_at_n_max``."""
    rows = []
    for (setting, response), sub in sizes.groupby(["setting", "response"], sort=False):
        sub = sub.sort_values("n")
        slope = float(np.polyfit(np.log(sub["n"]), np.log(sub["size"]), 1)[0])
        rows.append({"setting": setting, "response": response, "exponent": -slope, "n_min": int(sub["n"].min()),
                     "n_max": int(sub["n"].max()), "size_at_n_min": float(sub["size"].iloc[0]),
                     "size_at_n_max": float(sub["size"].iloc[-1])})
    return pd.DataFrame(rows)


def design_exponents(setting: str, ns: Any, *, n_y: int = 2001, **overrides: Any) -> pd.DataFrame:
    r"""What the expected information predicts for ``setting`` on the grid ``ns``: :func:`size_exponents` of
    :func:`design_sizes`.  This is the local asymptotics of the actual design (finite :math:`\lVert\Delta^*_n\rVert`
    and :math:`\lambda^*_n`), where :func:`predicted_exponent` is the theory's small-distance limit."""
    return size_exponents(design_sizes(setting, ns, n_y=n_y, **overrides))


# ----------------------------------------------------------------------------- the study cell
_FIT_KEYS = ("method", "init", "restarts", "jitter", "tol", "gtol", "max_iter", "em_iter", "sd_floor")


def _near_truth(params: ContaminatedParams, R: int, jitter: float, rng: np.random.Generator) -> ContaminatedParams:
    """R starts near the truth: slopes and intercepts plus N(0, jitter^2), the variance, lambda's logit and the gate
    moved by the same relative amount."""
    d = params.d
    kw: dict[str, Any] = {"weight": params.weight[0] + jitter * rng.standard_normal((R, d)),
                          "bias": params.bias[0] + jitter * rng.standard_normal(R),
                          "var": params.var[0] * np.exp(jitter * rng.standard_normal(R))}
    if params.lam is not None:
        logit = np.log(params.lam[0] / (1 - params.lam[0]))
        kw["lam"] = 1.0 / (1.0 + np.exp(-(logit + jitter * rng.standard_normal(R))))
    else:
        kw["gate_weight"] = params.gate_weight[0] + jitter * rng.standard_normal((R, d))
        kw["gate_bias"] = params.gate_bias[0] + jitter * rng.standard_normal(R)
    return ContaminatedParams(**kw)


def contaminated_cell(ctx: CellContext) -> pd.DataFrame:
    r"""A :class:`moestat.Study` cell: simulate a contaminated MoE, fit it by maximum likelihood, score the fits.

    The truth's ``data`` table holds ``setting`` (a key of :data:`SETTINGS`) and optional overrides of its knobs
    (keywords of :func:`moestat.contaminated.contaminated_truth`); the inputs are :data:`INPUTS`.  The truth is
    rebuilt for the cell's ``n`` (truths indexed by :math:`n`).  The fit's ``options`` hold keywords of
    :func:`moestat.contaminated.fit_contaminated` (``method``, ``restarts``, ``tol``, ...); ``init`` may name
    ``"near_truth"`` (the truth with noise of sd ``jitter``, default 0.05) besides ``"ols"`` and ``"random"``.

    Returns
    -------
    DataFrame
        One row per replicate: the errors of :func:`moestat.contaminated.contaminated_errors` (``lam_err`` or
        ``gate_err``/``beta_err``/``tau_err``, ``prompt_err``, ``loss_dist``, ``loss_nondist``, ``delta``), the truth
        (``lam_n``, ``delta_n``), the estimates (``est_*``), ``loglik``, ``loglik_gap`` (fitted minus true
        log-likelihood: negative means the optimiser missed the truth's likelihood), ``converged``, ``boundary``,
        ``n_iter``, ``best_start`` and ``start_spread`` (best minus worst final log-likelihood over the starts: above
        about 1e-6 some start stopped at another stationary point).
    """
    data_cfg = dict(ctx.truth_cfg["data"])
    setting = data_cfg.pop("setting", None)
    if setting is None:
        raise ValueError("the truth's data table needs 'setting', one of " + str(sorted(SETTINGS)) + ".")
    truth = setting_truth(setting, ctx.n, **data_cfg)
    opts = dict(ctx.fit_cfg.get("options", {}))
    unknown = sorted(set(opts) - set(_FIT_KEYS))
    if unknown:
        raise ValueError(f"fit options {unknown} are not used by contaminated_cell; valid keys are {list(_FIT_KEYS)}.")
    data = truth.model.simulate(truth.params, ctx.n, reps=ctx.reps, seed=ctx.data_seed, **INPUTS)
    rng = np.random.default_rng(ctx.fit_seed)
    jitter = float(opts.pop("jitter", 0.05))
    init = [_near_truth(truth.params, ctx.reps, jitter, rng) if e == "near_truth" else e
            for e in opts.pop("init", ["near_truth", "ols"])]
    fit = fit_contaminated(truth.model, data.X, data.y, init=init, seed=rng, std_errors=False, warn=False, **opts)
    errors = contaminated_errors(fit.params, truth.params, truth.theta0())
    frame = pd.DataFrame({"rep": np.arange(ctx.reps), **errors})
    for col in ("lam_err", "gate_err", "beta_err", "tau_err"):
        if col not in frame:
            frame[col] = np.nan
    frame["lam_n"] = truth.info["lam_n"]
    frame["delta_n"] = truth.info["delta_n"]
    est = pd.DataFrame(np.concatenate([fit.params.gate_vector(), fit.params.theta()], axis=1),
                       columns=["est_" + name.replace(":", "_") for name in fit.names()])
    frame = pd.concat([frame, est], axis=1)
    frame["loglik"] = fit.loglik
    frame["loglik_gap"] = fit.loglik - truth.model.loglik(truth.params, data.X, data.y)
    frame["converged"] = fit.converged
    frame["boundary"] = fit.boundary
    frame["n_iter"] = fit.n_iter
    frame["best_start"] = fit.best_start
    frame["start_spread"] = fit.start_loglik.max(axis=1) - fit.start_loglik.min(axis=1)
    return frame
