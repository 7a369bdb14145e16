r"""The sample size at which a stochastic metric reaches a target: stochastic root finding on log n.

In the spirit of R SimDesign's ``SimSolve`` (Chalmers 2024, "Solving variables with Monte Carlo simulation
experiments: a stochastic root-solving approach", *Psychological Methods*, doi:10.1037/met0000689): instead of a
fixed grid of n, each evaluation of the metric is placed where the current estimate of the root lies, and a
monotone model fitted to *all* evaluations so far interpolates between them.  Two criteria:

* **mean**: $\mathrm E[V(n)] = t$, with the power-law model $\log \mathrm E[V(n)] = a + b \log n$ fitted by
  weighted least squares to the per-evaluation log means;
* **probability**: $P(V(n) < t) = p$, with the binomial model $g(P) = a + b\log n$ (logit link by default; probit,
  complementary log-log) fitted by maximum likelihood (statsmodels GLM) to the replicate indicators.

The root is $\log n^* = (y_t - a)/b$ with $y_t = \log t$ or $g(p)$; its interval comes from the fitted model's
parameter covariance by the delta method (see :func:`solve_n`).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.genmod import families
from statsmodels.genmod.generalized_linear_model import GLM
from statsmodels.regression.linear_model import OLS, WLS
from statsmodels.tools.sm_exceptions import PerfectSeparationWarning

from ._validation import Choice, Integer, Optional, Real, Seed, validate_arguments
from .exceptions import MoestatWarning, warn_user
from .report import Result, Summary

__all__ = ["LINKS", "SolveNResult", "solve_n"]

#: Links of the probability criterion's binomial model.
LINKS: dict[str, Callable[[], Any]] = {
    "logit": families.links.Logit,
    "probit": families.links.Probit,
    "cloglog": families.links.CLogLog,
}
#: Why a search stopped (``SolveNResult.status``).
STATUSES = ("converged", "max_evals", "not_bracketed", "flat")


@dataclass
class _Fit:
    """One fit of the root model: log n*, its SE, the coefficients and their covariance (or a bisection bracket)."""

    log_root: float
    log_se: float
    log_low: float
    log_high: float
    method: str
    coef: np.ndarray = field(default_factory=lambda: np.full(2, np.nan))
    cov: np.ndarray = field(default_factory=lambda: np.full((2, 2), np.nan))
    dispersion: float = math.nan


@dataclass
class SolveNResult(Result):
    """Result of :func:`solve_n` (a :class:`moestat.report.Result`).

    Attributes
    ----------
    estimate : float
        The root $n^*$ (a real number; round it up for a sample size).
    conf_low, conf_high : float
        Its interval at ``confidence_level`` (delta method on $\\log n^*$, or the bisection bracket).
    std_error : float
        Delta-method SE of $n^*$ ($n^*$ times the SE of $\\log n^*$); NaN for a bracket.
    status : str
        Why the search stopped: ``"converged"`` (interval narrower than ``rtol``), ``"max_evals"``,
        ``"not_bracketed"`` (every evaluation on one side of the target: no root in ``n_range`` seen) or
        ``"flat"`` (fitted slope 0).
    history : DataFrame
        Every replicate value: ``step, n, rep, value`` (plus ``hit`` = value < target for the probability
        criterion).
    trace : DataFrame
        One row per evaluation: ``step, n, reps, summary`` (mean or share of hits), and the root estimate and
        interval after it (``n_star, conf_low, conf_high, method``).
    coef : DataFrame
        The final model's ``intercept`` and ``slope`` (on log n) with SEs (empty for a bracket).
    config : dict
        The settings (criterion, target, prob, link, n_range, reps_per_step, max_evals, rtol, confidence_level).
    """

    estimate: float
    conf_low: float
    conf_high: float
    std_error: float
    status: str
    method: str
    history: pd.DataFrame
    trace: pd.DataFrame
    coef: pd.DataFrame
    dispersion: float
    config: dict[str, Any]

    @property
    def in_range(self) -> bool:
        """Whether the estimate lies inside ``n_range`` (outside, it is an extrapolation of the model)."""
        lo, hi = self.config["n_range"]
        return bool(lo <= self.estimate <= hi)

    def tidy(self) -> pd.DataFrame:
        """Term ``n`` (the root, with ``std_error, conf_low, conf_high``), then the model's ``intercept`` and
        ``slope`` (on log n) with Wald intervals."""
        rows = [{"term": "n", "estimate": self.estimate, "std_error": self.std_error, "conf_low": self.conf_low,
                 "conf_high": self.conf_high}]
        z = stats.norm.ppf(0.5 + self.config["confidence_level"] / 2)
        for term, r in self.coef.iterrows():
            est, se = r["estimate"], r["std_error"]
            rows.append({"term": str(term), "estimate": est, "std_error": se, "conf_low": est - z * se,
                         "conf_high": est + z * se})
        return pd.DataFrame(rows)

    def glance(self) -> pd.DataFrame:
        """One row: criterion, target, prob, link, status, interval method, evaluations, replicates, range."""
        c = self.config
        return pd.DataFrame([{
            "criterion": c["criterion"], "target": c["target"], "prob": c["prob"], "link": c["link"],
            "status": self.status, "interval": self.method, "in_range": self.in_range,
            "n_evals": len(self.trace), "total_reps": len(self.history), "dispersion": self.dispersion,
            "confidence_level": c["confidence_level"], "n_low": c["n_range"][0], "n_high": c["n_range"][1]}])

    def summary(self) -> Summary:
        s = super().summary()
        s.title = "solve_n: sample size at which the metric reaches its target"
        s.notes.append("interval: " + {"delta": "delta method on log n* from the model's parameter covariance",
                                       "bracket": "bisection bracket (the model could not be fitted)"}.get(
                                           self.method, self.method))
        return s


# ----------------------------------------------------------------------------------------------- model fits
def _delta(target_y: float, coef: np.ndarray, cov: np.ndarray, z: float, method: str,
           dispersion: float) -> _Fit:
    r"""Root $x^* = (y_t - a)/b$ and its delta-method SE: gradient $(-1/b, -(y_t-a)/b^2)$."""
    a, b = float(coef[0]), float(coef[1])
    if b == 0 or not np.isfinite(b):
        return _Fit(math.nan, math.nan, math.nan, math.nan, "flat", coef, cov, dispersion)
    root = (target_y - a) / b
    grad = np.array([-1.0 / b, -root / b])
    se = math.sqrt(max(float(grad @ cov @ grad), 0.0))
    return _Fit(root, se, root - z * se, root + z * se, method, coef, cov, dispersion)


def _fit_mean(x: np.ndarray, means: np.ndarray, cv2: np.ndarray, reps: np.ndarray, target: float, z: float) -> _Fit:
    r"""WLS of $\log \bar V_j$ on $\log n_j$ with weights $1/\widehat{\mathrm{Var}}(\log\bar V_j)$,
    $\widehat{\mathrm{Var}}(\log\bar V_j) = s_j^2/(r_j\bar V_j^2)$ (delta method).  The covariance is the
    known-variance one, inflated by the residual dispersion when it exceeds 1 (lack of fit of the power law).
    When some evaluation has no spread (a deterministic metric), OLS with the residual variance."""
    X = np.column_stack([np.ones_like(x), x])
    if np.all(np.isfinite(cv2) & (cv2 > 0)):
        pooled = float(np.sum((reps - 1) * cv2) / np.sum(reps - 1))
        y = np.log(means) + pooled / (2 * reps)
        res = WLS(y, X, weights=reps / pooled).fit()
        dispersion = float(res.scale) if res.df_resid > 0 else 1.0
        cov = np.asarray(res.normalized_cov_params) * max(1.0, dispersion)
    else:
        res = OLS(np.log(means), X).fit()
        dispersion = float(res.scale)
        cov = np.asarray(res.cov_params())
    return _delta(math.log(target), np.asarray(res.params), cov, z, "delta", dispersion)


def _separated(x: np.ndarray, hits: np.ndarray, m: np.ndarray) -> bool:
    """Whether the hits and misses are (quasi-)separated on x, so that the binomial MLE does not exist."""
    has_hit, has_miss = hits > 0, hits < m
    if not has_hit.any() or not has_miss.any():
        return True
    return bool(x[has_miss].max() <= x[has_hit].min() or x[has_hit].max() <= x[has_miss].min())


def _bracket(x: np.ndarray, hits: np.ndarray, m: np.ndarray, prob: float) -> tuple[float, float] | None:
    """Bisection bracket on log n from the pooled shares of hits: (last x below prob, first x at or above it),
    in the direction the shares move; None when every share is on one side of ``prob``."""
    xs = np.unique(x)
    share = np.array([hits[x == v].sum() / m[x == v].sum() for v in xs])
    above = share >= prob
    if above.all() or not above.any():
        return None
    rising = share[-1] >= share[0] if share[-1] != share[0] else xs[above].mean() > xs[~above].mean()
    if rising:
        return float(xs[~above].max()), float(xs[above].min())
    return float(xs[above].max()), float(xs[~above].min())


def _fit_prob(x: np.ndarray, hits: np.ndarray, m: np.ndarray, prob: float, link: str, z: float,
              start: np.ndarray | None = None) -> _Fit:
    r"""Binomial GLM $g(P(V<t)) = a + b\log n$ on the aggregated hits; covariance inflated by the Pearson
    dispersion when it exceeds 1.  Under (quasi-)separation the MLE does not exist: bisection bracket instead."""
    if not _separated(x, hits, m):
        X = np.column_stack([np.ones_like(x), x])
        family = families.Binomial(link=LINKS[link]())
        with warnings.catch_warnings():  # fitted shares of 0 or 1 at far design points are expected, not separation
            warnings.simplefilter("ignore", PerfectSeparationWarning)
            res = GLM(np.column_stack([hits, m - hits]), X, family=family).fit(start_params=start)
        if res.converged and np.all(np.isfinite(res.params)):
            dispersion = float(res.pearson_chi2 / res.df_resid) if res.df_resid > 0 else 1.0
            cov = np.asarray(res.cov_params()) * max(1.0, dispersion)
            return _delta(float(family.link(np.array([prob]))[0]), np.asarray(res.params), cov, z, "delta",
                          dispersion)
    br = _bracket(x, hits, m, prob)
    if br is None:
        return _Fit(math.nan, math.nan, math.nan, math.nan, "not_bracketed")
    lo, hi = min(br), max(br)
    return _Fit((lo + hi) / 2, math.nan, lo, hi, "bracket")


# ----------------------------------------------------------------------------------------------- search
def _root_sequence(seed: Any) -> np.random.SeedSequence:
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, (list, tuple)):
        return np.random.SeedSequence([int(s.generate_state(1)[0]) for s in seed])
    return np.random.SeedSequence(seed)


def _check_range(n_range: Any) -> tuple[int, int]:
    ok = (isinstance(n_range, (tuple, list)) and len(n_range) == 2
          and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in n_range))
    if not ok:
        raise TypeError(f"n_range must be a pair of integers (lo, hi), got {n_range!r}.")
    lo, hi = int(n_range[0]), int(n_range[1])
    if not 1 <= lo < hi:
        raise ValueError(f"n_range must satisfy 1 <= lo < hi, got {n_range!r}.")
    return lo, hi


def _criterion(target: float, quantile: float | None, prob: float | None) -> tuple[str, float | None]:
    if quantile is not None and prob is not None:
        raise ValueError(f"give prob= or quantile= (the same criterion, P(value < target) = prob), not both; got "
                         f"prob={prob!r}, quantile={quantile!r}.")
    p = prob if prob is not None else quantile
    if p is None:
        if target <= 0:
            raise ValueError(f"target must be > 0 for the mean criterion (the model fits log mean), got {target!r}.")
        return "mean", None
    return "probability", float(p)


def _evaluate(metric: Callable[..., Any], n: int, reps: int, seed: np.random.SeedSequence, step: int) -> np.ndarray:
    values = np.asarray(metric(n, reps, seed), dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError(f"metric({n}, {reps}, seed) returned no values at step {step}; it must return an array of "
                         "per-replicate values.")
    if not np.isfinite(values).all():
        raise ValueError(f"metric({n}, {reps}, seed) returned {int((~np.isfinite(values)).sum())} non-finite "
                         f"value(s) at step {step}; handle failed replicates inside the metric.")
    return values


def _cell_summary(values: list[np.ndarray], criterion: str, target: float) -> tuple[np.ndarray, ...]:
    if criterion == "mean":
        means = np.array([v.mean() for v in values])
        if (means <= 0).any():
            raise ValueError(f"the mean criterion fits log(mean value), but the mean at some n is "
                             f"{means[means <= 0][0]!r} <= 0; use the probability criterion (prob=) instead.")
        cv2 = np.array([v.var(ddof=1) / v.mean() ** 2 if len(v) > 1 else np.nan for v in values])
        return means, cv2, np.array([len(v) for v in values], dtype=np.float64)
    hits = np.array([(v < target).sum() for v in values], dtype=np.float64)
    return hits, np.array([len(v) for v in values], dtype=np.float64), np.array([])


def _next_n(fit: _Fit, lo: int, hi: int) -> int:
    return int(np.clip(round(math.exp(np.clip(fit.log_root, math.log(lo), math.log(hi)))), lo, hi))


def _stop(fit: _Fit, rtol: float, next_n: int, evaluated: set[int]) -> bool:
    if fit.method in ("not_bracketed", "flat"):
        return True
    if fit.method == "bracket":  # deterministic bisection: stop when the midpoint adds nothing new
        low, high = math.exp(fit.log_low), math.exp(fit.log_high)
        return high / low - 1 <= rtol or next_n in evaluated
    return math.exp(fit.log_high - fit.log_low) - 1 <= rtol


@validate_arguments(target=Real(), quantile=Optional(Real(0, 1, open_low=True, open_high=True)),
                    prob=Optional(Real(0, 1, open_low=True, open_high=True)), reps_per_step=Integer(2),
                    max_evals=Integer(4), n_init=Integer(3), seed=Seed(),
                    confidence_level=Real(0, 1, open_low=True, open_high=True), rtol=Real(0, open_low=True),
                    link=Choice(*LINKS))
def solve_n(metric: Callable[[int, int, np.random.SeedSequence], Any], target: float, *,
            quantile: float | None = None, prob: float | None = None, n_range: tuple[int, int] = (10, 10_000),
            reps_per_step: int = 100, max_evals: int = 20, n_init: int = 3, rtol: float = 0.05,
            link: str = "logit", seed: Any = None, confidence_level: float = 0.95) -> SolveNResult:
    r"""Sample size $n^*$ at which a stochastic metric reaches ``target``, by stochastic root finding on log n.

    ``metric(n, reps, seed)`` returns ``reps`` per-replicate values at sample size ``n`` (e.g. the Voronoi loss of
    ``reps`` fits on fresh data sets), drawing its randomness from ``seed`` (a :class:`numpy.random.SeedSequence`,
    e.g. ``np.random.default_rng(seed)``).  The criterion is

    * ``mean`` (neither ``prob`` nor ``quantile``): $\mathrm E[V(n^*)] = $ ``target``, with the model
      $\log\mathrm E[V(n)] = a + b\log n$ fitted by WLS to the log mean of each evaluation, weights the inverse
      delta-method variances $r_j\bar V_j^2/s_j^2$;
    * ``probability`` (``prob=p``): $P(V(n^*) < $ ``target``$) = p$, e.g. "Voronoi loss below eps with 80%
      probability", with the binomial GLM $g(P) = a + b\log n$ (``link``: logit, probit or cloglog) fitted to the
      replicate indicators.  ``quantile=q`` states the same criterion as "the q-quantile of V is ``target``".

    The algorithm (after SimDesign's ``SimSolve``, Chalmers 2024, which uses probabilistic bisection with
    interpolation; here the interpolating model drives the search from the start):

    1. evaluate the metric at ``n_init`` sample sizes spread geometrically over ``n_range``;
    2. fit the model to all evaluations so far and solve $\log n^* = (y_t - a)/b$, $y_t = \log$ ``target`` or
       $g(p)$;
    3. stop when the interval's ratio ``conf_high / conf_low - 1 <= rtol`` or after ``max_evals`` evaluations;
       else evaluate at $n^*$ clipped to ``n_range`` and rounded, and go to 2.

    **Interval**: delta method on $\log n^*$ from the fitted model's parameter covariance $\Sigma$,
    $\mathrm{SE}(\log n^*)^2 = \nabla^\top\Sigma\nabla$ with $\nabla = (-1/b, -\log n^*/b)$, then
    $\exp(\log n^* \pm z\,\mathrm{SE})$.  $\Sigma$ is inflated by the model's dispersion (residual mean square of
    the WLS, Pearson $\chi^2/\mathrm{df}$ of the GLM) when it exceeds 1, so lack of fit of the model widens the
    interval (McCullagh & Nelder 1989, *Generalized Linear Models*, §4.5).  While the hits and misses of the
    probability criterion are separated in n (a deterministic metric; few replicates far from the root) the
    binomial MLE does not exist: the search then bisects the bracket of the shares on log n and reports the
    bracket as the interval (``method="bracket"``).  The interval is conditional on the model holding near the
    root: the evaluations concentrate there, but a curved $\log\mathrm E[V]$ or a poorly chosen link biases it.

    Reproducibility: evaluation ``j`` receives child ``j`` of ``SeedSequence(seed)`` (``spawn``), so the same seed
    gives the same search.

    Parameters
    ----------
    metric : callable
        ``metric(n: int, reps: int, seed: SeedSequence) -> array`` of per-replicate values; finite.
    target : float
        The level of the mean (> 0), or the threshold ``V < target`` of the probability criterion.
    quantile, prob : float in (0, 1), optional
        The probability criterion's $p$ (give one; both None is the mean criterion).
    n_range : (int, int)
        Range ``(lo, hi)`` of sample sizes searched; the estimate may lie outside it (``in_range`` says).
    reps_per_step : int
        Replicates per evaluation.
    max_evals : int
        Evaluations at most (including the ``n_init`` initial ones).
    n_init : int
        Initial evaluations, geometrically spaced from ``lo`` to ``hi`` (at least 3, so the model has residual
        degrees of freedom).
    rtol : float
        Stop when ``conf_high / conf_low - 1 <= rtol``.
    link : {"logit", "probit", "cloglog"}
        Link of the probability model.  ``cloglog`` is exact when $V \propto n^{-\beta}$ times an exponential
        variable; logit is the usual choice for power-type curves.
    seed : int, SeedSequence or None
    confidence_level : float

    Returns
    -------
    SolveNResult
        ``estimate, conf_low, conf_high, status, history, trace`` (see :class:`SolveNResult`).
    """
    if not callable(metric):
        raise TypeError(f"metric must be a callable metric(n, reps, seed) -> values, got {type(metric).__name__}.")
    lo, hi = _check_range(n_range)
    if n_init > max_evals:
        raise ValueError(f"n_init={n_init} exceeds max_evals={max_evals}; raise max_evals or lower n_init.")
    criterion, p = _criterion(float(target), quantile, prob)
    z = float(stats.norm.ppf(0.5 + confidence_level / 2))
    children = _root_sequence(seed).spawn(max_evals)
    design = [int(np.rint(v)) for v in np.geomspace(lo, hi, n_init)]
    ns: list[int] = []
    values: list[np.ndarray] = []
    trace: list[dict[str, Any]] = []
    fit = _Fit(math.nan, math.nan, math.nan, math.nan, "none")
    next_n = design[0]
    for step in range(max_evals):
        n = design[step] if step < n_init else next_n
        values.append(_evaluate(metric, n, reps_per_step, children[step], step))
        ns.append(n)
        a, b, r = _cell_summary(values, criterion, float(target))
        summary = float(a[-1] if criterion == "mean" else a[-1] / b[-1])
        row: dict[str, Any] = {"step": step, "n": n, "reps": len(values[-1]), "summary": summary}
        if step + 1 >= n_init:
            x = np.log(np.asarray(ns, dtype=np.float64))
            if p is None:
                fit = _fit_mean(x, a, b, r, float(target), z)
            else:  # warm start from the previous fit: fewer IRLS iterations, the same optimum
                fit = _fit_prob(x, a, b, p, link, z, fit.coef if fit.method == "delta" else None)
            next_n = _next_n(fit, lo, hi) if np.isfinite(fit.log_root) else n
            row |= {"n_star": math.exp(fit.log_root), "conf_low": math.exp(fit.log_low),
                    "conf_high": math.exp(fit.log_high), "method": fit.method}
        trace.append(row)
        if fit.method in ("not_bracketed", "flat"):
            status = fit.method
            break
        if step + 1 > n_init and _stop(fit, rtol, next_n, set(ns)):
            status = "converged"
            break
    else:
        status = "max_evals"
    settings = {"target": float(target), "link": link if criterion == "probability" else None,
                "n_range": (lo, hi), "reps_per_step": reps_per_step, "max_evals": max_evals, "n_init": n_init,
                "confidence_level": confidence_level}
    return _result(fit, status, ns, values, trace, criterion, p, rtol, locals_=settings)


def _result(fit: _Fit, status: str, ns: list[int], values: list[np.ndarray], trace: list[dict[str, Any]],
            criterion: str, p: float | None, rtol: float, locals_: dict[str, Any]) -> SolveNResult:
    target = locals_["target"]
    hist = pd.DataFrame({"step": np.repeat(np.arange(len(ns)), [len(v) for v in values]),
                         "n": np.repeat(ns, [len(v) for v in values]),
                         "rep": np.concatenate([np.arange(len(v)) for v in values]),
                         "value": np.concatenate(values)})
    if criterion == "probability":
        hist["hit"] = hist["value"] < target
    estimate = math.exp(fit.log_root) if np.isfinite(fit.log_root) else math.nan
    coef = pd.DataFrame(columns=["estimate", "std_error"], dtype=np.float64)
    if fit.method == "delta":
        coef = pd.DataFrame({"estimate": fit.coef, "std_error": np.sqrt(np.diag(fit.cov))},
                            index=pd.Index(["intercept", "slope"], name="term"))
    config = {"criterion": criterion, "prob": p, "rtol": rtol, **locals_}
    lo, hi = locals_["n_range"]
    if status == "not_bracketed":
        warn_user(f"solve_n: every evaluation in n_range=({lo}, {hi}) lies on one side of the target; no root "
                  "was bracketed. Widen n_range.", MoestatWarning)
    elif status == "flat":
        warn_user("solve_n: the fitted slope on log n is 0 (the metric does not change with n); no root.",
                  MoestatWarning)
    elif np.isfinite(estimate) and not lo <= estimate <= hi:
        warn_user(f"solve_n: the root estimate n* = {estimate:.4g} lies outside n_range=({lo}, {hi}); it is an "
                  "extrapolation of the fitted model. Widen n_range.", MoestatWarning)
    return SolveNResult(
        estimate=estimate, conf_low=math.exp(fit.log_low) if np.isfinite(fit.log_low) else math.nan,
        conf_high=math.exp(fit.log_high) if np.isfinite(fit.log_high) else math.nan,
        std_error=estimate * fit.log_se if fit.method == "delta" else math.nan, status=status, method=fit.method,
        history=hist, trace=pd.DataFrame(trace), coef=coef, dispersion=fit.dispersion, config=config)
