"""Sample complexity: the smallest n at which a metric reaches a target, and its scaling exponent.

chowdhury2023: n* is read off replicate-level accuracy curves with a bootstrap CI and
censoring, and ``log n*`` is regressed on the log of a design variable (l, n/l, k) for a scaling exponent.
The public names are re-exported by :mod:`moestat.rates`.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.regression.linear_model import OLS
from statsmodels.tools.tools import add_constant

from .._validation import (
    Choice,
    Integer,
    Optional,
    Real,
    Seed,
    keyword_only_options,
    renamed_arguments,
    validate_arguments,
)
from .._validation import column_list as _as_list
from ..exceptions import RateWarning, warn_user
from ..report import Result
from ._core import (
    _cells,
    _check_choice,
    _check_columns,
    _check_level,
    _check_nboot,
    _group_key,
    _key_text,
    _wls_slope,
    rao_wu,
)

__all__ = ["SampleComplexityResult", "sample_complexity", "scaling_exponent"]


def _crossing(curves: np.ndarray, log_n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First crossing of zero by each row of ``curves`` (B, m) (reached where >= 0), on the log-n scale.

    Returns log n* (B,) (``-inf``: reached at the smallest n, left-censored; ``+inf``: never reached,
    right-censored) and the censoring code (0 none, -1 left, +1 right).  Between the last grid point
    below the target and the first at or above it, log n* is interpolated linearly in log n.
    """
    reached = curves >= 0
    anyr = reached.any(axis=-1)
    first = np.argmax(reached, axis=-1)
    prev = np.maximum(first - 1, 0)
    rows = np.arange(curves.shape[0])
    s0, s1 = curves[rows, prev], curves[rows, first]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(s1 > s0, -s0 / (s1 - s0), 1.0)
    t = np.clip(t, 0.0, 1.0)
    out = log_n[prev] + t * (log_n[first] - log_n[prev])
    code = np.zeros(curves.shape[0], dtype=int)
    out = np.where(first == 0, -np.inf, out)
    code[anyr & (first == 0)] = -1
    out = np.where(anyr, out, np.inf)
    code[~anyr] = 1
    return out, code


def _order_stat_interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval by order statistics (works with +-inf draws from censored resamples)."""
    s = np.sort(draws)
    b = len(s)
    a = (1 - level) / 2
    lo = s[max(int(np.floor(a * b)), 0)]
    hi = s[min(int(np.ceil((1 - a) * b)) - 1, b - 1)]
    return float(lo), float(hi)


@dataclass
class SampleComplexityResult(Result):
    """Result of :func:`sample_complexity` (a :class:`moestat.report.Result`).

    Attributes
    ----------
    table : DataFrame
        One row per group: ``by`` columns, ``metric, target, direction, rule, n_star, ci_low, ci_high,
        censored`` (``"none"``, ``"left"``: reached at the smallest n, ``n_star`` is an upper bound;
        ``"right"``: never reached, ``n_star = inf`` and ``n_max`` is a lower bound), ``p_reached`` (share
        of bootstrap draws reaching the target inside the grid), ``n_min, n_max, n_values, replicates``.
    draws : dict
        ``group key -> (n_resamples,)`` bootstrap draws of ``log n*`` (``+-inf`` for censored draws).
    config : dict
    """

    table: pd.DataFrame
    draws: dict[tuple, np.ndarray]
    config: dict[str, Any]

    def to_frame(self) -> pd.DataFrame:
        return self.table.copy()

    def tidy(self) -> pd.DataFrame:
        """One row per group: the ``by`` columns, ``metric, term`` (``"n_star"``), ``estimate, conf_low,
        conf_high`` and ``censored``."""
        t = self.table
        by = self.config.get("by", [])
        return pd.DataFrame({**{c: t[c] for c in by}, "metric": t["metric"], "term": "n_star",
                             "estimate": t["n_star"], "conf_low": t["ci_low"], "conf_high": t["ci_high"],
                             "censored": t["censored"]}).reset_index(drop=True)

    def glance(self) -> pd.DataFrame:
        """One row per group: ``table`` (target, rule, censoring, p_reached, the n grid)."""
        return self.table.copy()

    def scaling(self, design: str, **kwargs: Any) -> pd.DataFrame:
        """Shorthand for :func:`scaling_exponent` on this result."""
        return scaling_exponent(self, design, **kwargs)

    def plot(self, ax: Any = None, **kwargs: Any) -> Any:
        """n* with its CI against a design column; see :func:`moestat.rates.plots.plot_sample_complexity`."""
        from .plots import plot_sample_complexity

        return plot_sample_complexity(self, ax=ax, **kwargs)


@keyword_only_options
@renamed_arguments(n_boot="n_resamples", ci="confidence_level")
@validate_arguments(target=Real(), q=Real(0, 1), confidence_level=Real(0, 1, open_low=True, open_high=True),
                    n_resamples=Integer(100), seed=Seed(), direction=Choice("above", "below"))
def sample_complexity(frame: pd.DataFrame, metric: str, target: float, *, by: str | Sequence[str] | None = None,
                      x: str = "n", rep: str | None = "rep", direction: str = "above", rule: str = "mean",
                      q: float = 0.5, confidence_level: float = 0.95, n_resamples: int = 2000,
                      seed: int | None = 0) -> SampleComplexityResult:
    """Smallest n at which ``metric`` reaches ``target``, with a bootstrap CI and censoring.

    With ``rule="mean"`` the curve is the replicate mean of ``metric`` at each n; with
    ``rule="fraction"`` it is the share of replicates whose metric reaches the target, and n* is where
    that share first reaches ``q`` (chowdhury2023 Fig. 5: ``q = 1`` for "all runs succeed").  n* is the
    first crossing on the sorted n grid, interpolated linearly in ``log n`` between the two grid points
    that bracket it.  The CI resamples replicates within each n (``n_resamples`` draws, curve deviations rescaled
    by sqrt(R/(R-1)) as in :func:`fit_rate`) and takes order statistics of the draws of ``log n*``, widened
    about the estimate by ``t_nu / z`` with ``nu`` the replicate degrees of freedom of the two bracketing
    cells; draws that never reach the target count as ``+inf``, so ``ci_high = inf`` says the grid is too
    short to bound n* at this level.  The estimand is the grid-interpolated crossing of the population
    curve (what the method would report with infinitely many replicates on this grid).

    Parameters
    ----------
    frame : DataFrame
        Tidy frame, one row per (cell, replicate).
    metric : str
        Column, e.g. test accuracy or a success indicator.
    target : float
        Level to reach.
    by : str or list of str, optional
        Grouping columns (e.g. ``["model", "l"]``).
    direction : {"above", "below"}
        ``above``: reached when metric >= target (accuracy); ``below``: metric <= target (an error).

    Returns
    -------
    SampleComplexityResult
    """
    by_cols = _as_list("by", by)
    _check_columns(frame, {"metric": [metric], "x": [x], "by": by_cols})
    _check_choice("direction", direction, ("above", "below"))
    _check_choice("rule", rule, ("mean", "fraction"))
    level = _check_level(confidence_level)
    n_resamples = _check_nboot(n_resamples)
    if isinstance(target, bool) or not isinstance(target, numbers.Real) or not np.isfinite(target):
        raise ValueError(f"target must be a finite number, got {target!r}.")
    if rule == "fraction" and not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1] for rule='fraction', got {q!r}.")
    if rep is not None and rep not in frame.columns and rep == "rep":
        rep = None
    vals = frame[metric].to_numpy(dtype=np.float64)
    if not np.isfinite(vals).all():
        raise ValueError(f"column {metric!r} has NaN/inf values; drop failed rows explicitly first.")
    sign = 1.0 if direction == "above" else -1.0
    outer = frame.groupby(by_cols, sort=True, dropna=False) if by_cols else [((), frame)]
    groups = [(_group_key(k, by_cols), sub) for k, sub in outer]
    seqs = np.random.SeedSequence(seed).spawn(len(groups))
    rows, draws = [], {}
    for (key, sub), ss in zip(groups, seqs, strict=True):
        cells = _cells(sub, x, metric, rep)
        if len(cells.ns) < 2:
            raise ValueError(f"{_key_text(key, by_cols)} has {len(cells.ns)} distinct {x} value; interpolating "
                             "n* needs at least 2.")
        if (cells.counts < 2).any():
            raise ValueError(f"{_key_text(key, by_cols)} has a single replicate at {x} = "
                             f"{cells.ns[cells.counts < 2].tolist()}; the bootstrap CI needs >= 2 per n.")
        rng = np.random.default_rng(ss)
        log_n = np.log(cells.ns)
        point = np.empty(len(cells.ns))
        boot = np.empty((n_resamples, len(cells.ns)))
        for i, v in enumerate(cells.values):
            s = sign * (v - target)
            if rule == "fraction":
                s = (s >= 0).astype(np.float64)
            r = len(s)
            resampled = s[rng.integers(0, r, size=(n_resamples, r))].mean(axis=1)
            point[i] = s.mean()
            boot[:, i] = rao_wu(point[i], resampled, r)
        thr = q if rule == "fraction" else 0.0
        est, code = _crossing((point - thr)[None, :], log_n)
        bdraw, _ = _crossing(boot - thr, log_n)
        lo, hi = _order_stat_interval(bdraw, level)
        if code[0] == 0:
            # widen the percentile interval by t_nu / z, nu = replicate df of the two bracketing cells, as the
            # rate intervals do: with few replicates the curve's variance is itself noisy
            j = int(np.searchsorted(log_n, est[0]))
            j = min(max(j, 1), len(log_n) - 1)
            nu = float(cells.counts[j - 1] + cells.counts[j] - 2)
            kappa = stats.t.ppf((1 + level) / 2, nu) / stats.norm.ppf((1 + level) / 2)
            lo = est[0] - kappa * (est[0] - lo) if np.isfinite(lo) else lo
            hi = est[0] + kappa * (hi - est[0]) if np.isfinite(hi) else hi
        draws[key] = bdraw
        rows.append({**dict(zip(by_cols, key, strict=True)), "metric": metric, "target": float(target),
                     "direction": direction, "rule": rule if rule == "mean" else f"fraction>={q:g}",
                     "n_star": float(np.exp(est[0])) if code[0] == 0 else (cells.ns[0] if code[0] < 0 else np.inf),
                     "ci_low": float(np.exp(lo)), "ci_high": float(np.exp(hi)),
                     "censored": {0: "none", -1: "left", 1: "right"}[int(code[0])],
                     "p_reached": float((bdraw < np.inf).mean()),
                     "n_min": cells.ns.min(), "n_max": cells.ns.max(), "n_values": len(cells.ns),
                     "replicates": int(cells.counts.min())})
    config = {"metric": metric, "target": target, "by": by_cols, "x": x, "rep": rep, "direction": direction,
              "rule": rule, "q": q, "ci": level, "n_resamples": n_resamples, "seed": seed}
    return SampleComplexityResult(pd.DataFrame(rows), draws, config)


@renamed_arguments(ci="confidence_level")
@validate_arguments(confidence_level=Optional(Real(0, 1, open_low=True, open_high=True)),
                    censored=Choice("drop", "tobit"))
def scaling_exponent(result: SampleComplexityResult, design: str, *, confidence_level: float | None = None,
                     censored: str = "drop") -> pd.DataFrame:
    """Scaling exponent ``b`` in ``log n* = a + b log(design)`` (e.g. design ``l`` or ``n/l``, chowdhury2023 §4.2).

    ``design`` must be one of the ``by`` columns of the sample-complexity result; the remaining ``by``
    columns define separate regressions.  The slope is OLS on the uncensored points.  Its CI is a
    percentile interval from refitting the slope on the joint bootstrap draws of every point's
    ``log n*`` (the groups were resampled independently); draws with a censored point are skipped
    and counted (``boot_used``).  ``censored="tobit"`` instead fits a right-censored normal regression
    (Tobit, statsmodels ``GenericLikelihoodModel``; censored points enter as ``log n* > log n_max``) with a
    Wald CI from the observed information.  Compare the slope with the bound in :func:`theory_rates`
    (the bounds are upper bounds: test ``slope <= bound``, not equality).

    Returns
    -------
    DataFrame
        Other ``by`` columns, ``design, exponent, se, ci_low, ci_high, intercept, r2, n_points,
        n_censored, method, boot_used``.
    """
    if not isinstance(result, SampleComplexityResult):
        raise TypeError(f"result must be a SampleComplexityResult, got {type(result).__name__}.")
    by_cols = result.config["by"]
    if design not in by_cols:
        raise ValueError(f"design={design!r} must be one of the by columns of the sample-complexity result "
                         f"({by_cols}); add it to by= when calling sample_complexity.")
    _check_choice("censored", censored, ("drop", "tobit"))
    level = _check_level(result.config["ci"] if confidence_level is None else confidence_level)
    rest = [c for c in by_cols if c != design]
    tab = result.table.copy()
    tab["_key"] = [tuple(r[c] for c in by_cols) for _, r in tab.iterrows()]
    outer = tab.groupby(rest, sort=True) if rest else [((), tab)]
    rows = []
    for key, sub in outer:
        key = _group_key(key, rest)
        xv = sub[design].to_numpy(dtype=np.float64)
        if (xv <= 0).any():
            raise ValueError(f"design column {design!r} must be positive to take logs.")
        ok = (sub["censored"] == "none").to_numpy()
        n_cens = int((~ok).sum())
        lx = np.log(xv)
        base = {**dict(zip(rest, key, strict=True)), "design": design, "n_points": len(sub), "n_censored": n_cens}
        if censored == "drop":
            if n_cens:
                warn_user(f"{_key_text(key, rest)}: {n_cens} censored n* value(s) dropped from the scaling "
                              "regression; right-censored points are the hardest designs, so dropping them biases "
                              "the slope down. Widen the n grid or use censored='tobit'.", RateWarning)
            if ok.sum() < 3:
                raise ValueError(f"{_key_text(key, rest)}: only {int(ok.sum())} uncensored n* values; the scaling "
                                 "regression needs >= 3 (widen the n grid or use censored='tobit').")
            ly = np.log(sub["n_star"].to_numpy(dtype=np.float64)[ok])
            fit = OLS(ly, add_constant(lx[ok], has_constant="add")).fit()
            boot = np.column_stack([result.draws[k] for k in sub["_key"][ok]])
            good = np.isfinite(boot).all(axis=1)
            _, slopes = _wls_slope(lx[ok], boot[good], np.ones(int(ok.sum())))
            lo, hi = (np.quantile(slopes, [(1 - level) / 2, (1 + level) / 2]) if good.sum() >= 100
                      else (np.nan, np.nan))
            rows.append({**base, "exponent": float(fit.params[1]), "se": float(slopes.std(ddof=1)),
                         "ci_low": float(lo), "ci_high": float(hi), "intercept": float(fit.params[0]),
                         "r2": float(fit.rsquared), "method": "ols+bootstrap", "boot_used": int(good.sum())})
            if good.mean() < 0.9:
                warn_user(f"{_key_text(key, rest)}: {100 * (1 - good.mean()):.0f}% of bootstrap draws had a "
                              "censored n*; the interval conditions on the rest.", RateWarning)
        else:
            finite = np.isfinite(sub["n_star"].to_numpy(dtype=np.float64)) & (sub["censored"] != "left").to_numpy()
            ly = np.where(finite, np.log(np.where(finite, sub["n_star"], 1.0)), np.log(sub["n_max"]))
            res = _tobit(ly, lx, ~finite)
            q = stats.norm.ppf((1 + level) / 2)
            rows.append({**base, "exponent": float(res.params[1]), "se": float(res.bse[1]),
                         "ci_low": float(res.params[1] - q * res.bse[1]),
                         "ci_high": float(res.params[1] + q * res.bse[1]), "intercept": float(res.params[0]),
                         "r2": np.nan, "method": "tobit", "boot_used": 0})
    return pd.DataFrame(rows)


def _tobit(ly: np.ndarray, lx: np.ndarray, right: np.ndarray) -> Any:
    """Right-censored normal regression log n* = a + b log x + e, e ~ N(0, s^2) (s on the log scale)."""
    from statsmodels.base.model import GenericLikelihoodModel

    class _Tobit(GenericLikelihoodModel):
        def loglikeobs(self, params: np.ndarray) -> np.ndarray:
            mu = self.exog @ params[:2]
            s = np.exp(params[2])
            z = (self.endog - mu) / s
            return np.where(right, stats.norm.logsf(z), stats.norm.logpdf(z) - params[2])

    exog = add_constant(lx, has_constant="add")
    if (~right).sum() < 3:
        raise ValueError("the Tobit scaling fit needs at least 3 uncensored n* values.")
    start = OLS(ly[~right], exog[~right]).fit()
    s0 = np.log(max(np.sqrt(start.scale), 1e-3))
    model = _Tobit(ly, exog, extra_params_names=["log_sigma"])
    return model.fit(start_params=np.r_[start.params, s0], method="bfgs", disp=False, maxiter=500)
