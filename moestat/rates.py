"""Convergence exponents and sample complexity, with confidence intervals, tests and diagnostics.

A rate study produces a tidy long frame: one row per (cell, replicate) with the sample size ``n``, a
replicate id ``rep`` and metric columns (a Voronoi loss, a parameter error, an accuracy).  This module
estimates the exponent ``alpha`` of ``error ~ C n^-alpha`` from such frames, with intervals that respect
the replicate structure, tests on exponents, model-fit and window diagnostics, and sample complexities.

Rate models (every model regresses ``log y`` on a transform ``u(n)``, so their AICs are comparable):

============== ===================================== ====================================================
model          equation                              use
============== ===================================== ====================================================
``power``      ``log y = c - alpha log n``           parametric rates ``n^-alpha``
``power_log``  ``log y = c - alpha log(n / log n)``  bounds with a log factor, ``(log n / n)^alpha``
``inverse_log`` ``log y = c - alpha log log n``      slow rates ``(log n)^-alpha``; ``alpha = 1`` is the
                                                     ``1 / log n`` rate of polynomial / input-independent
                                                     experts (nguyen2024 Table 1)
============== ===================================== ====================================================

The exponent reported is always ``alpha`` (positive for a decaying error).  Sources: nguyen2024 §4, §6 and
notes §5.2, §7.6, §8 C5/C7; the fragility of window choice is shown in peers-and-conventions B.8.
"""

from __future__ import annotations

import itertools
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import stats

__all__ = [
    "RATE_MODELS",
    "RateResult",
    "RateWarning",
    "SampleComplexityResult",
    "WindowSensitivity",
    "calibrate_design",
    "compare_models",
    "compare_rates",
    "fit_rate",
    "sample_complexity",
    "scaling_exponent",
    "simulate_rate_frame",
    "test_exponent",
    "theory_rates",
    "window_sensitivity",
]

from ._ratecore import (
    _AGGS,
    _INTERVALS,
    _METHODS,
    _RESAMPLE,
    MIN_CLUSTERS,
    MIN_N_VALUES,
    RATE_MODELS,
    RECOMMENDED_N_VALUES,
    TABLE_COLUMNS,
    RateWarning,
    _as_list,
    _cell_stat,
    _Cells,
    _cells,
    _check_choice,
    _check_columns,
    _check_level,
    _check_models,
    _check_nboot,
    _group_key,
    _key_text,
    _prepare,
    _wls_slope,
    regressor,
)
from .sample_complexity import SampleComplexityResult, sample_complexity, scaling_exponent

# --------------------------------------------------------------------------------------------------
# bootstrap and the per-group fit

HUBER_C = 1.345
_MAD_NORMAL = 0.6744897501960817


def _huber_fit(u: np.ndarray, y: np.ndarray, c: float = HUBER_C, max_iter: int = 200,
               tol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """Huber M-estimate of ``y = b0 + b1 u`` by IRLS, batched over the rows of ``y`` (B, N).

    The same iteration as statsmodels ``RLM(norm=HuberT(c))`` with ``scale_est="mad"`` (scale
    ``median|r| / 0.6745`` re-estimated every step, OLS start), run on every bootstrap draw at once; rows
    whose coefficients moved less than ``tol`` leave the active set.
    """
    y = np.atleast_2d(y)
    du = u - u.mean()
    b1 = (y * du).sum(axis=1) / (du * du).sum()
    b0 = y.mean(axis=1) - b1 * u.mean()
    active = np.arange(y.shape[0])
    for _ in range(max_iter):
        ya, a0, a1 = y[active], b0[active], b1[active]
        r = ya - a0[:, None] - a1[:, None] * u
        scale = np.maximum(np.median(np.abs(r), axis=1) / _MAD_NORMAL, 1e-300)
        a = np.abs(r) / scale[:, None]
        w = np.where(a <= c, 1.0, c / np.maximum(a, 1e-300))
        sw = w.sum(axis=1)
        ub, yb = (w * u).sum(axis=1) / sw, (w * ya).sum(axis=1) / sw
        duw = u - ub[:, None]
        n1 = (w * duw * (ya - yb[:, None])).sum(axis=1) / (w * duw * duw).sum(axis=1)
        n0 = yb - n1 * ub
        moving = (np.abs(n1 - a1) >= tol) | (np.abs(n0 - a0) >= tol)
        b0[active], b1[active] = n0, n1
        active = active[moving]
        if active.size == 0:
            break
    return b0, b1


def _boot_rows(cells: _Cells, n_boot: int, rng: np.random.Generator, resample: str) -> np.ndarray:
    """Bootstrap draws of every replicate's log y (B, N), rows in cell order, rescaled around the cell median.

    Used by the Huber fit, which needs rows rather than per-n statistics; the deviation from the cell
    median is multiplied by sqrt(R/(R-1)) as in :func:`_boot_cell_stats`.
    """
    out = []
    if resample == "rep":
        g = len(cells.reps[0])
        pick = rng.integers(0, g, size=(n_boot, g))
    for i, v in enumerate(cells.values):
        logv = np.log(v)
        r = len(v)
        if resample == "rep":
            draw = logv[np.argsort(cells.reps[i])][pick]
        else:
            draw = logv[rng.integers(0, r, size=(n_boot, r))]
        centre = np.median(logv)
        out.append(centre + np.sqrt(r / (r - 1)) * (draw - centre))
    return np.concatenate(out, axis=1)


def _boot_cell_stats(cells: _Cells, agg: str | None, n_boot: int, rng: np.random.Generator,
                     resample: str) -> np.ndarray:
    """Rescaled bootstrap draws z*_n (B, m) of the per-n statistics.

    ``within_n`` resamples replicates independently within each n; ``rep`` resamples whole replicate ids
    (the same draw at every n, for nested designs where replicate r at different n shares data).  The
    deviation of each draw from the sample statistic is multiplied by sqrt(R/(R-1)) so that the bootstrap
    variance of a mean is the unbiased s^2/R (the rescaling bootstrap of Rao & Wu 1988).
    """
    z0 = np.array([_cell_stat(v, agg) for v in cells.values])
    m = len(cells.ns)
    out = np.empty((n_boot, m))
    if resample == "within_n":
        for i, v in enumerate(cells.values):
            r = len(v)
            draw = v[rng.integers(0, r, size=(n_boot, r))]
            out[:, i] = z0[i] + np.sqrt(r / (r - 1)) * (_cell_stat(draw, agg) - z0[i])
        return out
    ids = cells.reps[0]
    for i, reps in enumerate(cells.reps):
        if len(reps) != len(ids) or not np.array_equal(np.sort(reps), np.sort(ids)):
            raise ValueError("resample='rep' needs the same replicate ids at every n (a nested design); "
                             f"n={cells.ns[i]:g} has a different set. Use resample='within_n'.")
    g = len(ids)
    pick = rng.integers(0, g, size=(n_boot, g))
    for i, v in enumerate(cells.values):
        order = np.argsort(cells.reps[i])
        draw = v[order][pick]
        out[:, i] = z0[i] + np.sqrt(g / (g - 1)) * (_cell_stat(draw, agg) - z0[i])
    return out


@dataclass
class _GroupFit:
    row: dict[str, Any]
    draws: np.ndarray | None = None        # bootstrap exponents (B,)
    var_terms: np.ndarray | None = None     # c_n^2 v_n per cell (Satterthwaite pieces)
    var_df: np.ndarray | None = None        # degrees of freedom per cell


def _robust_cov(rep_labels: np.ndarray | None, cluster: str | None) -> tuple[str, dict[str, Any]]:
    if cluster is not None and rep_labels is not None and len(np.unique(rep_labels)) >= 2:
        return "cluster", {"groups": pd.factorize(rep_labels)[0]}
    return "HC3", {}


def _satterthwaite(terms: np.ndarray, dfs: np.ndarray) -> float:
    terms = np.asarray(terms, dtype=np.float64)
    denom = float(np.sum(terms ** 2 / dfs))
    return float(np.sum(terms) ** 2 / denom) if denom > 0 else float(np.sum(dfs))


def _interval(est: float, se: float, df: float, draws: np.ndarray | None, level: float,
              interval: str) -> tuple[float, float]:
    a = 1 - level
    if interval == "percentile" and draws is not None:
        lo, hi = np.quantile(draws, [a / 2, 1 - a / 2])
        return float(lo), float(hi)
    q = stats.t.ppf(1 - a / 2, df)
    return est - q * se, est + q * se


def _fit_group(cells: _Cells, model: str, agg: str | None, method: str, level: float, interval: str,
               zboot: np.ndarray | None, cluster: str | None, resample: str = "within_n",
               estimator: str = "ols", rows_boot: np.ndarray | None = None) -> _GroupFit:
    counts = cells.counts
    u_cell = regressor(model, cells.ns)
    if agg is None:
        endog = np.log(np.concatenate(cells.values))
        exog_u = np.repeat(u_cell, counts)
        reps = np.concatenate(cells.reps)
        w = counts.astype(np.float64)
    else:
        endog = np.array([_cell_stat(v, agg) for v in cells.values])
        exog_u = u_cell
        reps = None
        w = np.ones(len(cells.ns))
    exog = sm.add_constant(exog_u, has_constant="add")
    ols = sm.OLS(endog, exog).fit()
    row: dict[str, Any] = {"model": model, "exponent": -float(ols.params[1]), "intercept": float(ols.params[0]),
                           "r2": float(ols.rsquared), "aic": float(ols.aic), "bic": float(ols.bic),
                           "n_values": len(cells.ns), "replicates": int(counts.min()), "rows": int(counts.sum())}
    fit = _GroupFit(row)
    if estimator == "huber":
        rlm = sm.RLM(endog, exog, M=sm.robust.norms.HuberT(t=HUBER_C)).fit(conv="coefs", tol=1e-10, maxiter=200)
        row.update(exponent=-float(rlm.params[1]), intercept=float(rlm.params[0]), r2=np.nan, aic=np.nan,
                   bic=np.nan)
    if method == "robust" and estimator == "huber":
        se = float(rlm.bse[1])
        df = float(len(endog) - 2)
        row.update(se=se, df=df, cov_type="huber_H1")
        lo, hi = _interval(row["exponent"], se, df, None, level, "t")
    elif method == "robust":
        cov_type, kwds = _robust_cov(reps, cluster)
        rob = sm.OLS(endog, exog).fit(cov_type=cov_type, cov_kwds=kwds or None, use_t=True)
        df = float(getattr(rob, "df_resid_inference", None) or rob.df_resid)
        se = float(rob.bse[1])
        row.update(se=se, df=df, cov_type=cov_type)
        lo, hi = _interval(row["exponent"], se, df, None, level, "t")
    else:
        if estimator == "huber":  # 1e-7 on coefficients is far below any bootstrap SE
            _, slopes = _huber_fit(exog_u, rows_boot, tol=1e-7)
        else:
            _, slopes = _wls_slope(u_cell, zboot, w)
        draws = -slopes
        wn = w / w.sum()
        du = u_cell - (wn * u_cell).sum()
        c = wn * du / (wn * du * du).sum()
        v = zboot.var(axis=0, ddof=1)
        terms = c ** 2 * v
        if resample == "within_n":
            dfs = counts - 1.0
            df = _satterthwaite(terms, dfs)
        else:  # whole replicate ids resampled: one cluster-level variance estimate with G - 1 df
            dfs = np.full(len(counts), len(cells.reps[0]) - 1.0)
            df = float(len(cells.reps[0]) - 1)
        se = float(draws.std(ddof=1))
        row.update(se=se, df=df, cov_type="bootstrap")
        lo, hi = _interval(row["exponent"], se, df, draws, level, interval)
        fit.draws, fit.var_terms, fit.var_df = draws, terms, dfs
    row.update(ci_low=lo, ci_high=hi)
    return fit


def _curvature(cells: _Cells, agg: str | None, cluster: str | None) -> tuple[float, float]:
    """Coefficient and p-value of a centred (log n)^2 term added to the power model (robust SEs)."""
    if len(cells.ns) < 4:
        return np.nan, np.nan
    ln = np.log(cells.ns)
    ln = ln - ln.mean()
    if agg is None:
        endog = np.log(np.concatenate(cells.values))
        t = np.repeat(ln, cells.counts)
        reps = np.concatenate(cells.reps)
    else:
        endog = np.array([_cell_stat(v, agg) for v in cells.values])
        t, reps = ln, None
    exog = np.column_stack([np.ones_like(t), t, t ** 2])
    cov_type, kwds = _robust_cov(reps, cluster)
    res = sm.OLS(endog, exog).fit(cov_type=cov_type, cov_kwds=kwds or None, use_t=True)
    return float(res.params[2]), float(res.pvalues[2])


# --------------------------------------------------------------------------------------------------
# results


@dataclass
class RateResult:
    """Result of :func:`fit_rate`.

    Attributes
    ----------
    table : DataFrame
        One row per group x model: the ``by`` columns, then ``model, exponent, se, ci_low, ci_high,
        intercept, r2, aic, n_values, replicates`` (``replicates`` is the smallest replicate count over n).
    details : DataFrame
        ``table`` plus ``df`` (degrees of freedom of the t reference), ``bic``, ``rows``, ``cov_type``,
        ``x_min``, ``x_max``, ``decades``, ``delta_aic`` (to the best model of the group), ``best_model``,
        ``curvature`` and ``curvature_p`` (centred (log n)^2 term in the power model), ``warnings``.
    data : DataFrame
        The rows used: ``by`` columns, ``x``, ``rep`` (if any) and ``y``.
    config : dict
        Every knob of the fit (y, x, by, rep, models, agg, ci, method, interval, n_boot, seed, resample, cluster,
        estimator, na, dropped_na).
    draws : dict
        ``(group key, model) -> (n_boot,)`` bootstrap exponents (bootstrap method only).
    """

    table: pd.DataFrame
    details: pd.DataFrame
    data: pd.DataFrame
    config: dict[str, Any]
    draws: dict[tuple, np.ndarray] = field(default_factory=dict, repr=False)
    _var: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def to_frame(self, *, details: bool = False, config: bool = False) -> pd.DataFrame:
        """The tidy ``table`` (a copy); ``details=True`` gives ``details`` instead; ``config=True`` appends the
        fit's knobs (``y, x, agg, ci, method, interval, n_boot, seed, resample, cluster, estimator``) as
        columns, for a
        ``rates.csv`` that records how it was made."""
        out = (self.details if details else self.table).copy()
        if config:
            for k in ("y", "x", "agg", "ci", "method", "interval", "n_boot", "seed", "resample", "cluster",
                      "estimator"):
                out[k if k not in out.columns else f"config_{k}"] = self.config[k]
        return out

    def summary(self) -> str:
        """A printable report: the table, the method, AIC comparison, curvature and warnings."""
        cfg = self.config
        fitted_on = "replicate-level logs" if cfg["agg"] is None else f"per-n {cfg['agg']}"
        if cfg["estimator"] == "huber":
            fitted_on += ", Huber M-estimate"
        how = (f"{cfg['n_boot']} draws, resample={cfg['resample']}, interval={cfg['interval']}, seed={cfg['seed']}"
               if cfg["method"] == "cluster_bootstrap" else f"cluster={cfg['cluster']}")
        head = (f"Rate fit of {cfg['y']} on {cfg['x']} ({fitted_on}); {round(cfg['ci'] * 100)}% intervals by "
                f"{cfg['method']} ({how})")
        cols = [*cfg["by"], "model", "exponent", "se", "ci_low", "ci_high", "r2", "aic", "delta_aic",
                "n_values", "replicates", "decades", "curvature_p"]
        body = self.details[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}")
        lines = [head, "models: " + "; ".join(f"{m}: {RATE_MODELS[m]}" for m in cfg["models"]), body]
        warns = [w for w in self.details["warnings"] if w]
        if warns:
            lines.append("warnings:")
            lines += [f"  - {w}" for w in dict.fromkeys(warns)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        cfg = self.config
        return (f"RateResult(y={cfg['y']!r}, by={cfg['by']}, models={cfg['models']}, agg={cfg['agg']!r}, "
                f"method={cfg['method']!r}, rows={len(self.table)})\n{self.table.to_string(index=False)}")

    def plot(self, ax: Any = None, **kwargs: Any) -> Any:
        """Log-log plot in the papers' Figure 1 style; see :func:`moestat.plots.plot_rate`."""
        from .plots import plot_rate

        return plot_rate(self, ax=ax, **kwargs)

    def test_exponent(self, value: float, **kwargs: Any) -> pd.DataFrame:
        """Shorthand for :func:`test_exponent` on this result."""
        return test_exponent(self, value, **kwargs)


def fit_rate(frame: pd.DataFrame, y: str, x: str = "n", by: str | Sequence[str] | None = None,
             model: str | Sequence[str] = "power", agg: str | None = None, ci: float = 0.95,
             method: str = "cluster_bootstrap", n_boot: int = 2000, seed: int | None = 0, *,
             rep: str | None = "rep", interval: str = "t", resample: str = "within_n",
             cluster: str | None = "auto", estimator: str = "ols", na: str = "raise",
             warn: bool = True) -> RateResult:
    """Estimate convergence exponents ``alpha`` in ``y ~ C n^-alpha`` (or a log variant) with intervals.

    Each model regresses ``log y`` on ``u(n)`` by ordinary least squares (statsmodels ``OLS``):
    ``power`` ``u = log n``; ``power_log`` ``u = log(n / log n)`` (nguyen2024 Thm 1-5 bounds
    ``(log n / n)^{1/2}``; notes §8 C7); ``inverse_log`` ``u = log log n`` (``y = C (log n)^-alpha``;
    ``alpha = 1`` is the ``1/log n`` rate of nguyen2024 Table 1).  ``exponent = -slope``.

    Parameters
    ----------
    frame : DataFrame
        Tidy long frame, one row per (cell, replicate), never only means.
    y, x : str
        Response column (must be > 0) and sample-size column.
    by : str or list of str, optional
        Grouping columns; one fit per group (e.g. ``["gate", "expert"]``).
    model : str or list of str
        ``"power"``, ``"power_log"``, ``"inverse_log"``, a list of them, or ``"all"``.
    agg : {None, "mean", "median", "logmean"}
        ``None`` (default) fits every replicate's ``log y``; otherwise fits one point per n:
        ``log mean y`` (the papers' way, reproduced for comparison; biased for skewed losses, B.8),
        ``log median y`` or ``mean log y``.
    ci : float
        Confidence level.
    method : {"cluster_bootstrap", "robust"}
        ``cluster_bootstrap``: resample replicates within each n (``resample="within_n"``) or whole
        replicate ids (``resample="rep"``, for nested designs), with the sqrt(R/(R-1)) rescaling;
        ``se`` is the bootstrap SD.  ``robust``: statsmodels OLS with a cluster-robust covariance
        clustered on ``rep`` (replicate-level fits with >= 10 replicate ids, or ``cluster="rep"``),
        else HC3; t reference with G-1 (cluster) or residual df.
    n_boot, seed : int
        Bootstrap draws and seed (numpy ``SeedSequence``; one child stream per group).
    rep : str or None
        Replicate-id column (``None``: rows are replicates).
    interval : {"t", "percentile"}
        Bootstrap interval: ``t`` (default) is ``exponent -/+ t_{nu} se`` with Satterthwaite degrees of
        freedom ``nu = (sum_n c_n^2 v_n)^2 / sum_n (c_n^2 v_n)^2 / (R_n - 1)`` (``c_n`` the WLS slope
        weights, ``v_n`` the bootstrap variance of the per-n statistic); it keeps 95% coverage with few
        replicates, where the percentile interval under-covers.  ``percentile`` is the plain percentile
        interval of the draws.
    cluster : {"auto", "rep", None}
        Clustering for ``method="robust"``: ``auto`` clusters on ``rep`` when it has >= 10 ids.
    estimator : {"ols", "huber"}
        ``huber``: Huber M-estimate (statsmodels ``RLM``, ``HuberT(1.345)``, MAD scale) of the replicate-level
        line, for losses with a few outlying replicates (fits stuck in a bad local optimum).  Its bootstrap
        refits every draw by batched IRLS (rows rescaled around the cell median; t reference with the OLS
        Satterthwaite df as an approximation); ``method="robust"`` uses the RLM sandwich (H1) SE with
        N - 2 df.  ``r2`` and ``aic`` are not defined for it (NaN).  Replicate-level only (``agg=None``).
    na : {"raise", "drop"}
        Rows whose ``y`` is NaN (e.g. failed fits): ``raise`` (default) or ``drop`` them with a
        :class:`RateWarning` giving the count, recorded in ``config["dropped_na"]``.
    warn : bool
        Emit :class:`RateWarning` for fits spanning < 1 decade of n or with < 5 n values.

    Returns
    -------
    RateResult
    """
    _check_columns(frame, {"y": [y]})
    _check_choice("na", na, ("raise", "drop"))
    dropped_na = 0
    if na == "drop":
        bad = frame[y].isna()
        dropped_na = int(bad.sum())
        if dropped_na:
            frame = frame[~bad]
            if warn:
                warnings.warn(f"dropped {dropped_na} row(s) with NaN {y!r} (na='drop').", RateWarning, stacklevel=2)
    by_cols = _as_list("by", by)
    models = _check_models(model)
    _check_choice("agg", agg, _AGGS)
    level = _check_level(ci)
    _check_choice("method", method, _METHODS)
    _check_choice("interval", interval, _INTERVALS)
    _check_choice("resample", resample, _RESAMPLE)
    _check_choice("cluster", cluster, ("auto", "rep", None))
    _check_choice("estimator", estimator, ("ols", "huber"))
    if estimator == "huber" and agg is not None:
        raise ValueError(f"estimator='huber' fits replicate-level rows; use agg=None (got agg={agg!r}), or "
                         "agg='median' for a robust per-n line.")
    if method == "cluster_bootstrap":
        n_boot = _check_nboot(n_boot)
    if rep is not None and rep not in frame.columns and rep == "rep":
        rep = None  # default rep column absent: rows are the replicates
    groups = _prepare(frame, y, x, by_cols, rep, models)
    if method == "cluster_bootstrap":
        for key, cells in groups.items():
            if resample == "within_n" and (cells.counts < 2).any():
                bad = cells.ns[cells.counts < 2]
                raise ValueError(f"{_key_text(key, by_cols)} has a single replicate at {x} = {bad.tolist()}; the "
                                 "cluster bootstrap resamples replicates within each n and needs >= 2. Use "
                                 "method='robust' or add replicates.")
            if resample == "rep" and len(cells.reps[0]) < 2:
                raise ValueError(f"{_key_text(key, by_cols)} has one replicate id; resample='rep' needs >= 2.")
    seqs = np.random.SeedSequence(seed).spawn(len(groups))
    rows, draws, var = [], {}, {}
    for (key, cells), ss in zip(groups.items(), seqs, strict=True):
        eff_cluster = None
        if method == "robust" and agg is None and rep is not None:
            n_ids = len(np.unique(np.concatenate(cells.reps)))
            eff_cluster = "rep" if cluster == "rep" or (cluster == "auto" and n_ids >= MIN_CLUSTERS) else None
        rng = np.random.default_rng(ss)
        zboot = _boot_cell_stats(cells, agg, n_boot, rng, resample) if method == "cluster_bootstrap" else None
        rows_boot = (_boot_rows(cells, n_boot, rng, resample)
                     if method == "cluster_bootstrap" and estimator == "huber" else None)
        decades = float(np.log10(cells.ns.max() / cells.ns.min()))
        msgs = []
        if decades < 1:
            msgs.append(f"{_key_text(key, by_cols)}: the {x} range [{cells.ns.min():g}, {cells.ns.max():g}] spans "
                        f"{decades:.2f} < 1 decade; exponents over such ranges are mostly curvature, not rate.")
        if len(cells.ns) < RECOMMENDED_N_VALUES:
            msgs.append(f"{_key_text(key, by_cols)}: only {len(cells.ns)} distinct {x} values; use >= "
                        f"{RECOMMENDED_N_VALUES} to check curvature and window sensitivity.")
        curv, curv_p = _curvature(cells, agg, eff_cluster)
        group_rows = []
        for m in models:
            fit = _fit_group(cells, m, agg, method, level, interval, zboot, eff_cluster, resample, estimator,
                             rows_boot)
            if method == "cluster_bootstrap" and agg is not None and interval == "percentile":
                lo, hi = np.quantile(fit.draws, [(1 - level) / 2, (1 + level) / 2])
                if not lo <= fit.row["exponent"] <= hi:
                    msgs.append(f"{_key_text(key, by_cols)}, {m}: the point estimate lies outside its percentile "
                                f"interval (log of a per-n {agg} of skewed values is biased); prefer agg=None.")
            row = dict(zip(by_cols, key, strict=True))
            row.update(fit.row)
            row.update(x_min=cells.ns.min(), x_max=cells.ns.max(), decades=decades,
                       curvature=curv, curvature_p=curv_p)
            group_rows.append(row)
            if fit.draws is not None:
                draws[(key, m)] = fit.draws
                var[(key, m)] = (fit.var_terms, fit.var_df)
        scored = [r for r in group_rows if np.isfinite(r["aic"])]
        best = min(scored, key=lambda r: r["aic"]) if scored else None
        for r in group_rows:
            r["delta_aic"] = r["aic"] - best["aic"] if best else np.nan
            r["best_model"] = best["model"] if best else None
            r["warnings"] = " | ".join(dict.fromkeys(msgs))
        rows += group_rows
        if warn:
            for msg in dict.fromkeys(msgs):
                warnings.warn(msg, RateWarning, stacklevel=2)
    details = pd.DataFrame(rows)
    order = [*by_cols, *TABLE_COLUMNS]
    extra = [c for c in details.columns if c not in order]
    details = details[order + extra]
    keep = [*by_cols, x, *([rep] if rep else []), y]
    config = {"y": y, "x": x, "by": by_cols, "rep": rep, "models": models, "agg": agg, "ci": level,
              "method": method, "interval": interval if method == "cluster_bootstrap" else "t",
              "n_boot": n_boot if method == "cluster_bootstrap" else None, "seed": seed,
              "resample": resample if method == "cluster_bootstrap" else None,
              "cluster": cluster if method == "robust" else None, "estimator": estimator, "na": na,
              "dropped_na": dropped_na}
    return RateResult(table=details[order].copy(), details=details, data=frame[keep].copy(), config=config,
                      draws=draws, _var=var)


# --------------------------------------------------------------------------------------------------
# tests on exponents


def test_exponent(result: RateResult, value: float, *, model: str | None = None,
                  alternative: str = "two-sided") -> pd.DataFrame:
    """Test H0: alpha = ``value`` for every group x model of a :class:`RateResult`.

    The statistic is ``t = (alpha_hat - value) / se`` referred to a t distribution with the result's
    degrees of freedom (Satterthwaite for the bootstrap, G-1 or residual df for robust fits).
    ``alternative="greater"`` tests H1: alpha > value (a faster rate); ``"less"`` H1: alpha < value
    (e.g. "the estimated exponent is below the bound", chowdhury2023 §4.2).

    Returns
    -------
    DataFrame
        ``by`` columns, ``model, exponent, value, difference, se, df, statistic, p_value, ci_low,
        ci_high, reject`` (``reject`` at level ``1 - ci``).
    """
    if not isinstance(result, RateResult):
        raise TypeError(f"result must be a RateResult from fit_rate, got {type(result).__name__}.")
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise ValueError(f"value must be a finite number (the exponent under H0, e.g. 0.5), got {value!r}.")
    _check_choice("alternative", alternative, ("two-sided", "greater", "less"))
    d = result.details
    if model is not None:
        if model not in set(d["model"]):
            raise ValueError(f"model={model!r} was not fitted; fitted models are {sorted(set(d['model']))}.")
        d = d[d["model"] == model]
    out = d[[*result.config["by"], "model", "exponent", "se", "df", "ci_low", "ci_high"]].copy()
    out.insert(out.columns.get_loc("exponent") + 1, "value", float(value))
    out["difference"] = out["exponent"] - value
    out["statistic"] = out["difference"] / out["se"]
    if alternative == "two-sided":
        p = 2 * stats.t.sf(np.abs(out["statistic"]), out["df"])
    elif alternative == "greater":
        p = stats.t.sf(out["statistic"], out["df"])
    else:
        p = stats.t.cdf(out["statistic"], out["df"])
    out["p_value"] = np.minimum(p, 1.0)
    out["reject"] = out["p_value"] < 1 - result.config["ci"]
    cols = [*result.config["by"], "model", "exponent", "value", "difference", "se", "df", "statistic", "p_value",
            "ci_low", "ci_high", "reject"]
    return out[cols].reset_index(drop=True)


test_exponent.__test__ = False  # not a pytest test despite the name


def compare_rates(frame: pd.DataFrame, y: str, between: str = "gate", by: str | Sequence[str] | None = None,
                  x: str = "n", model: str = "power", agg: str | None = None, ci: float = 0.95,
                  method: str = "both", n_boot: int = 2000, seed: int | None = 0, *, rep: str | None = "rep",
                  levels: Sequence[Any] | None = None, cluster: str | None = "auto",
                  paired: bool = False, na: str = "raise") -> pd.DataFrame:
    """Difference of convergence exponents between two levels of ``between``, with CI and p-value.

    For every ``by`` group and every pair ``(a, b)`` of levels (or the given ``levels``), estimate
    ``difference = alpha_a - alpha_b`` (positive: ``a`` converges faster) two ways:

    * ``interaction``: one OLS ``log y = c + g_a c_a - (alpha_b + g_a delta) u(n)`` on both groups'
      replicate-level rows (``g_a`` indicates level ``a``); ``difference = delta``; cluster-robust
      covariance on ``rep`` (>= 10 ids; this also accounts for two fits on the same data when they share
      rep ids), else HC3; t reference.
    * ``bootstrap``: replicates resampled within each n and group (the :func:`fit_rate` bootstrap);
      ``se`` is the SD of the difference of the draws; CI ``difference -/+ t_nu se`` with
      Satterthwaite ``nu`` over every cell of both groups; p-value from the same t reference.

    ``paired=True`` is for two fits of the *same* data sets (sigmoid and softmax fitted to replicate r at
    each n, with matching ``rep`` ids): the bootstrap then draws one set of replicate ids per n and uses it
    for both groups (method ``paired_bootstrap``), so the positive correlation of the two errors narrows the
    interval instead of being ignored; Satterthwaite ``nu`` uses the per-n variances of the paired
    contributions ``c_{a,n} z_{a,n} - c_{b,n} z_{b,n}``.  ``na="drop"`` drops rows whose ``y`` is NaN first
    (default: raise).

    Returns
    -------
    DataFrame
        ``by`` columns, ``between, level_a, level_b, model, method, exponent_a, exponent_b, difference,
        se, df, ci_low, ci_high, p_value``.
    """
    by_cols = _as_list("by", by)
    _check_columns(frame, {"between": [between], "y": [y]})
    _check_choice("na", na, ("raise", "drop"))
    if na == "drop":
        frame = frame[frame[y].notna()]
    if between in by_cols:
        raise ValueError(f"between={between!r} must not also be in by={by_cols}.")
    if not isinstance(model, str):
        raise TypeError("compare_rates compares one model at a time; pass model as a single name.")
    _check_models(model)
    _check_choice("method", method, ("both", "interaction", "bootstrap"))
    level = _check_level(ci)
    all_levels = list(pd.unique(frame[between]))
    if levels is not None:
        pairs_levels = list(levels)
        if len(pairs_levels) != 2:
            raise ValueError(f"levels must name exactly two levels of {between!r}, got {levels!r}.")
        for lv in pairs_levels:
            if lv not in all_levels:
                raise ValueError(f"level {lv!r} is not in column {between!r}; levels are {all_levels}.")
        frame = frame[frame[between].isin(pairs_levels)]
        pairs = [tuple(pairs_levels)]
    else:
        if len(all_levels) < 2:
            raise ValueError(f"column {between!r} has a single level {all_levels}; compare_rates needs two.")
        pairs = list(itertools.combinations(sorted(all_levels, key=str), 2))
    if rep is not None and rep not in frame.columns and rep == "rep":
        rep = None
    do_boot = method in ("both", "bootstrap")
    res = fit_rate(frame, y, x=x, by=[*by_cols, between], model=model, agg=agg, ci=level,
                   method="cluster_bootstrap" if do_boot else "robust", n_boot=n_boot, seed=seed, rep=rep,
                   cluster=cluster, warn=False)
    keys = zip(*(res.details[c] for c in [*by_cols, between]), strict=True)
    expo = dict(zip(keys, res.details["exponent"].astype(float), strict=True))
    rows = []
    outer = frame.groupby(by_cols, sort=True) if by_cols else [((), frame)]
    for key, sub in outer:
        key = _group_key(key, by_cols)
        for a, b in pairs:
            ka, kb = (*key, a), (*key, b)
            if ka not in expo or kb not in expo:
                continue
            ea, eb = expo[ka], expo[kb]
            base = {**dict(zip(by_cols, key, strict=True)), "between": between, "level_a": a, "level_b": b,
                    "model": model}
            if method in ("both", "interaction"):
                rows.append({**base, "method": "interaction",
                             **_interaction(sub, y, x, between, a, b, model, agg, rep, cluster, level)})
            if do_boot:
                if paired:
                    pseed = np.random.SeedSequence([0 if seed is None else seed, len(rows), 7])
                    diff, terms, dfs = _paired_boot(sub, y, x, rep, between, a, b, model, agg, n_boot,
                                                    np.random.default_rng(pseed))
                else:
                    diff = res.draws[(ka, model)] - res.draws[(kb, model)]
                    ta, dfa = res._var[(ka, model)]
                    tb, dfb = res._var[(kb, model)]
                    terms, dfs = np.concatenate([ta, tb]), np.concatenate([dfa, dfb])
                se = float(diff.std(ddof=1))
                df = _satterthwaite(terms, dfs)
                est = ea - eb
                lo, hi = _interval(est, se, df, None, level, "t")
                p = float(2 * stats.t.sf(abs(est) / se, df)) if se > 0 else float(est == 0)
                rows.append({**base, "method": "paired_bootstrap" if paired else "bootstrap", "exponent_a": ea,
                             "exponent_b": eb, "difference": est,
                             "se": se, "df": df, "ci_low": lo, "ci_high": hi, "p_value": p})
    if not rows:
        raise ValueError(f"no by-group has both levels of {between!r} to compare.")
    return pd.DataFrame(rows)


def _paired_boot(sub: pd.DataFrame, y: str, x: str, rep: str | None, between: str, a: Any, b: Any, model: str,
                 agg: str | None, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bootstrap of alpha_a - alpha_b drawing the same replicate ids for both groups at each n."""
    if rep is None:
        raise ValueError("paired=True needs a replicate-id column (rep=) that matches rows of the two groups.")
    ca = _cells(sub[sub[between] == a], x, y, rep)
    cb = _cells(sub[sub[between] == b], x, y, rep)
    if not np.array_equal(ca.ns, cb.ns) or any(not np.array_equal(ra, rb) for ra, rb in zip(ca.reps, cb.reps,
                                                                                         strict=True)):
        raise ValueError(f"paired=True needs the same {x} values and the same {rep!r} ids in levels {a!r} and "
                         f"{b!r} (two fits of the same data sets); use paired=False otherwise.")
    u = regressor(model, ca.ns)
    w = ca.counts.astype(np.float64) if agg is None else np.ones(len(ca.ns))
    wn = w / w.sum()
    du = u - (wn * u).sum()
    c = wn * du / (wn * du * du).sum()
    contrib = np.empty((n_boot, len(ca.ns)))
    for i, (va, vb) in enumerate(zip(ca.values, cb.values, strict=True)):
        r = len(va)
        idx = rng.integers(0, r, size=(n_boot, r))
        za0, zb0 = _cell_stat(va, agg), _cell_stat(vb, agg)
        za = za0 + np.sqrt(r / (r - 1)) * (_cell_stat(va[idx], agg) - za0)
        zb = zb0 + np.sqrt(r / (r - 1)) * (_cell_stat(vb[idx], agg) - zb0)
        contrib[:, i] = -c[i] * (za - zb)  # exponent = -slope
    return contrib.sum(axis=1), contrib.var(axis=0, ddof=1), ca.counts - 1.0


def _interaction(sub: pd.DataFrame, y: str, x: str, between: str, a: Any, b: Any, model: str, agg: str | None,
                 rep: str | None, cluster: str | None, level: float) -> dict[str, float]:
    sub = sub[sub[between].isin([a, b])]
    if agg is None:
        endog = np.log(sub[y].to_numpy(dtype=np.float64))
        u = regressor(model, sub[x].to_numpy(dtype=np.float64))
        ga = (sub[between] == a).to_numpy(dtype=np.float64)
        reps = sub[rep].to_numpy() if rep else None
    else:
        cells = sub.groupby([between, x], sort=True)[y].apply(lambda v: float(_cell_stat(v.to_numpy(float), agg)))
        cells = cells.reset_index()
        endog = cells[y].to_numpy(dtype=np.float64)
        u = regressor(model, cells[x].to_numpy(dtype=np.float64))
        ga = (cells[between] == a).to_numpy(dtype=np.float64)
        reps = None
    exog = np.column_stack([np.ones_like(u), ga, u, ga * u])
    eff = None
    if reps is not None and (cluster == "rep" or (cluster == "auto" and len(np.unique(reps)) >= MIN_CLUSTERS)):
        eff = "rep"
    cov_type, kwds = _robust_cov(reps, eff)
    fit = sm.OLS(endog, exog).fit(cov_type=cov_type, cov_kwds=kwds or None, use_t=True)
    diff = -float(fit.params[3])
    se = float(fit.bse[3])
    df = float(getattr(fit, "df_resid_inference", None) or fit.df_resid)
    lo, hi = _interval(diff, se, df, None, level, "t")
    return {"exponent_a": -float(fit.params[2] + fit.params[3]), "exponent_b": -float(fit.params[2]),
            "difference": diff, "se": se, "df": df, "ci_low": lo, "ci_high": hi, "p_value": float(fit.pvalues[3])}


# --------------------------------------------------------------------------------------------------
# diagnostics


def compare_models(frame: pd.DataFrame, y: str, x: str = "n", by: str | Sequence[str] | None = None,
                   models: Sequence[str] = tuple(RATE_MODELS), agg: str | None = None, *,
                   rep: str | None = "rep") -> pd.DataFrame:
    """Curvature check: AIC comparison of the rate models on the same response ``log y``.

    All models have two coefficients and the same response, so ``delta_aic`` is a likelihood-ratio
    comparison of non-nested fits.  Akaike weights ``exp(-delta/2) / sum exp(-delta/2)`` are reported,
    with ``curvature_p``, the p-value of a centred ``(log n)^2`` term added to the power model (small:
    the log-log curve bends, so a single exponent over this range is questionable).

    Returns
    -------
    DataFrame
        ``by`` columns, ``model, exponent, aic, delta_aic, akaike_weight, r2, best, curvature, curvature_p``.
    """
    res = fit_rate(frame, y, x=x, by=by, model=list(models), agg=agg, method="robust", rep=rep, warn=False)
    d = res.details.copy()
    by_cols = res.config["by"]
    rel = np.exp(-0.5 * d["delta_aic"])
    d["akaike_weight"] = rel / (rel.groupby([d[c] for c in by_cols]).transform("sum") if by_cols else rel.sum())
    d["best"] = d["model"] == d["best_model"]
    return d[[*by_cols, "model", "exponent", "aic", "delta_aic", "akaike_weight", "r2", "best", "curvature",
              "curvature_p"]].reset_index(drop=True)


@dataclass
class WindowSensitivity:
    """Result of :func:`window_sensitivity`: ``table`` (one row per group x window) and ``plot()``."""

    table: pd.DataFrame
    config: dict[str, Any]

    def plot(self, ax: Any = None, **kwargs: Any) -> Any:
        """Exponent and CI against the dropped end of the n range; see :func:`moestat.plots.plot_window`."""
        from .plots import plot_window

        return plot_window(self, ax=ax, **kwargs)

    def to_frame(self) -> pd.DataFrame:
        return self.table.copy()

    def summary(self) -> pd.DataFrame:
        """One row per group: the range of window exponents and whether all window CIs share a point.

        ``consistent`` is ``max(ci_low) <= min(ci_high)`` over the windows: False means no single exponent is
        compatible with every window (the B.8 signature of pre-asymptotic curvature).  ``drift`` is the
        exponent of the most-trimmed window minus the full-window exponent, per side.
        """
        by = self.config["by"]
        groups = self.table.groupby(by, sort=True) if by else [((), self.table)]
        rows = []
        for key, sub in groups:
            key = _group_key(key, by)
            full = sub[sub["side"] == "full"]["exponent"].iloc[0]
            row = {**dict(zip(by, key, strict=True)), "model": self.config["model"], "full": full,
                   "min": sub["exponent"].min(), "max": sub["exponent"].max(),
                   "consistent": bool(sub["ci_low"].max() <= sub["ci_high"].min())}
            for side in ("smallest", "largest"):
                part = sub[sub["side"] == side]
                row[f"drift_drop_{side}"] = (part.sort_values("dropped")["exponent"].iloc[-1] - full
                                             if len(part) else np.nan)
            rows.append(row)
        return pd.DataFrame(rows)


def window_sensitivity(frame: pd.DataFrame, y: str, x: str = "n", by: str | Sequence[str] | None = None,
                       model: str = "power", agg: str | None = None, ci: float = 0.95,
                       method: str = "cluster_bootstrap", n_boot: int = 1000, seed: int | None = 0, *,
                       rep: str | None = "rep", drop: str = "both", min_values: int = MIN_N_VALUES,
                       **kwargs: Any) -> WindowSensitivity:
    """Exponent as the smallest (``drop="smallest"``) and/or largest (``"largest"``) n values are dropped.

    A genuine asymptotic rate gives a flat profile whose CIs overlap; pre-asymptotic curvature gives a
    drift as n_min grows (peers-and-conventions B.8: -1.18 to -0.10 for an over-specified softmax MoE).

    Returns
    -------
    WindowSensitivity
        ``table`` columns: ``by`` columns, ``side`` (smallest/largest), ``dropped``, ``x_min``, ``x_max``,
        ``n_values``, ``model, exponent, se, ci_low, ci_high, r2``.
    """
    _check_choice("drop", drop, ("both", "smallest", "largest"))
    if not isinstance(model, str):
        raise TypeError("window_sensitivity profiles one model at a time; pass model as a single name.")
    by_cols = _as_list("by", by)
    _check_columns(frame, {"x": [x], "by": by_cols})
    sides = ["smallest", "largest"] if drop == "both" else [drop]
    outer = frame.groupby(by_cols, sort=True) if by_cols else [((), frame)]
    rows = []
    for key, sub in outer:
        key = _group_key(key, by_cols)
        ns = np.sort(sub[x].unique())
        for side in sides:
            for k in range(0, len(ns) - min_values + 1):
                if side == "largest" and k == 0 and "smallest" in sides:
                    continue  # the full window is reported once
                keep = ns[k:] if side == "smallest" else ns[: len(ns) - k]
                res = fit_rate(sub[sub[x].isin(keep)], y, x=x, model=model, agg=agg, ci=ci, method=method,
                               n_boot=n_boot, seed=seed, rep=rep, warn=False, **kwargs)
                t = res.table.iloc[0]
                rows.append({**dict(zip(by_cols, key, strict=True)), "side": "full" if k == 0 else side,
                             "dropped": k, "x_min": keep.min(), "x_max": keep.max(), "n_values": len(keep),
                             "model": model, "exponent": t["exponent"], "se": t["se"], "ci_low": t["ci_low"],
                             "ci_high": t["ci_high"], "r2": t["r2"]})
    config = {"y": y, "x": x, "by": by_cols, "model": model, "agg": agg, "ci": ci, "method": method,
              "n_boot": n_boot, "seed": seed, "drop": drop, "min_values": min_values}
    return WindowSensitivity(pd.DataFrame(rows), config)


# --------------------------------------------------------------------------------------------------
# theory


def _apparent_power_exponent(rate_model: str | None, exponent: float, n_range: tuple[float, float]) -> float:
    """Exponent a plain power fit reports for the noise-free theoretical curve on a log grid over n_range."""
    if rate_model is None or not np.isfinite(exponent):
        return np.nan
    n = np.logspace(np.log10(n_range[0]), np.log10(n_range[1]), 201)
    log_y = -exponent * regressor(rate_model, n)
    return -float(np.polyfit(np.log(n), log_y, 1)[0])


# (source, result, gate, regime, expert, examples, quantity, response, regressor, rate, exponent, rate_model,
#  direction, kind, note)
_THEORY: list[tuple] = [
    ("nguyen2024", "Thm 1", "sigmoid", "1", "any", "A.1-A.3", "regression function L2(mu) error",
     "l2_regression", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", ""),
    ("nguyen2024", "Cor 1", "sigmoid", "2", "any", "", "inf over Gbar of L2(mu) error", "l2_regression", "n",
     "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", ""),
    ("nguyen2024", "Thm 2", "sigmoid", "1", "strongly_identifiable", "relu|gelu (paper); see notes C1 for ReLU",
     "Voronoi loss D1", "D1", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound",
     "D1 squares over-specified terms, so the loss slope is 1/2 although those parameters move at 1/4"),
    ("nguyen2024", "Rem (i)", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "over-specified beta1, eta (cells with |A_j| >= 2)", "param_overspecified", "n", "(log n / n)^{1/4}", 0.25,
     "power_log", "decay", "upper_bound", "track individual parameter errors (notes C8)"),
    ("nguyen2024", "eq (7)", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "over-specified expert sup_x |h - h*|", "expert_overspecified", "n", "(log n / n)^{1/4}", 0.25, "power_log",
     "decay", "upper_bound", ""),
    ("nguyen2024", "implied by Thm 2", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "over-specified cell weight sum |sum sigma(beta0_i) - sigma(beta0*_j)|", "weight_sum", "n",
     "(log n / n)^{1/2}", 0.5, "power_log", "decay", "derived", "not stated in the paper; follows from D1"),
    ("nguyen2024", "structure of D1", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "individual beta0_i in an over-specified cell", "beta0_overspecified", "n", "no rate (not identified)",
     np.nan, None, "decay", "no_rate", ""),
    ("nguyen2024", "Rem (ii)", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "exact-specified beta0, beta1, eta (|A_j| = 1)", "param_exact", "n", "(log n / n)^{1/2}", 0.5, "power_log",
     "decay", "upper_bound", ""),
    ("nguyen2024", "Rem (ii)", "sigmoid", "1", "strongly_identifiable", "relu|gelu", "exact-specified expert",
     "expert_exact", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", ""),
    ("nguyen2024", "Thm 3", "sigmoid", "1", "ridge_input_independent", "phi(a^T x + b) with a*_j = 0",
     "minimax E D_{2,r}", "D2r", "n", ">= n^{-1/2} for all r >= 1", 0.5, "power", "decay", "lower_bound_minimax",
     "proof step 'choose c as a root' is invalid as written (notes C5); conclusion holds"),
    ("nguyen2024", "Thm 3 (i)-(ii)", "sigmoid", "1", "ridge_input_independent", "phi(a^T x + b) with a*_j = 0",
     "parameters beta1, a, b and the expert", "param", "n",
     "slower than n^{-1/(2r)} for all r; could be 1/log n", 1.0, "inverse_log", "decay", "slower_than_polynomial",
     "may not converge at all (exact non-identifiability, notes C5): report inverse_log and flag"),
    ("nguyen2024", "Thm 4", "sigmoid", "1", "polynomial", "(a^T x + b)^p", "minimax E D_{2,r}", "D2r", "n",
     ">= n^{-1/2} for all r >= 1", 0.5, "power", "decay", "lower_bound_minimax", "proof covers p = 1 only"),
    ("nguyen2024", "Thm 4, Table 1", "sigmoid", "1", "polynomial", "(a^T x + b)^p", "parameters and experts",
     "param", "n", "1 / log n", 1.0, "inverse_log", "decay", "slower_than_polynomial", ""),
    ("nguyen2024", "Thm 5", "sigmoid", "2", "weakly_identifiable", "relu|gelu|polynomial with a != 0",
     "Voronoi loss D3 (inf over Gbar)", "D3", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound",
     "ReLU/linear Regime 2 is not truly misspecified (notes C2); GELU is the clean case"),
    ("nguyen2024", "after Thm 5", "sigmoid", "2", "weakly_identifiable", "relu|gelu|polynomial with a != 0",
     "all of beta0, beta1, eta and the experts", "param", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay",
     "upper_bound", ""),
    ("nguyen2024", "Table 1", "sigmoid", "2", "input_independent", "constant", "experts", "expert", "n",
     "1 / log n", 1.0, "inverse_log", "decay", "slower_than_polynomial", "stated 'similar to Thm 3'; not proved"),
    ("nguyen2024", "Table 1 ([26] Thm 3.2)", "softmax", "1|2", "relu_gelu", "relu|gelu", "experts", "expert", "n",
     "n^{-1/4}, could be (log n / n)^{1/4}", 0.25, "power", "decay", "upper_bound", "cited, not proved, in nguyen2024"),
    ("nguyen2024", "Table 1 ([26] Thm 4.6)", "softmax", "1|2", "polynomial", "linear|polynomial", "experts",
     "expert", "n", "1 / log n", 1.0, "inverse_log", "decay", "slower_than_polynomial", "cited from [26]"),
    ("nguyen2024", "Table 1", "softmax", "1|2", "input_independent", "constant", "experts", "expert", "n",
     "1 / log n", 1.0, "inverse_log", "decay", "slower_than_polynomial", "cited from [26]"),
    ("makkuva2020", "Thm 4", "softmax", "", "linear|sigmoid|relu", "", "gate parameters max_i ||w_i - w_i*||",
     "gate_l2", "n", "sqrt(d T log(Tk/delta) / n) down to the floor kappa eps_reg / (1 - rho)", 0.5, "power",
     "decay", "upper_bound", "fixed T, sample-split GD; fit only above the floor"),
    ("makkuva2020", "Thm 4 (derived)", "softmax", "", "linear|sigmoid|relu", "", "samples to reach gate error eps",
     "N_star", "d", "O~(d log(1/eps) / eps^2)", 1.0, "power", "growth", "upper_bound_slope", "linear in d"),
    ("makkuva2020", "Thm 4 (derived)", "softmax", "", "linear|sigmoid|relu", "", "samples to reach gate error eps",
     "N_star", "1/eps", "O~(d log(1/eps) / eps^2)", 2.0, "power", "growth", "upper_bound_slope",
     "parametric in eps, up to log(1/eps)"),
    ("makkuva2020", "Thm 2 (heuristic)", "softmax", "", "linear|sigmoid|relu", "", "regressor angle error",
     "angle_error", "n", "n^{-1/2} if parametric; Thm 2 gives no rate", 0.5, "power", "decay", "derived",
     "notes §8.6: a parametric rate is expected, not proved"),
    ("makkuva2020", "Thm 2 (heuristic)", "softmax", "", "linear|sigmoid|relu", "", "E_reg = 1 - |cos theta|",
     "E_reg", "n", "n^{-1} if parametric (E_reg ~ theta^2 / 2)", 1.0, "power", "decay", "derived",
     "twice the slope of the parameter error (notes pitfall 24)"),
]
# chowdhury2023 §4.2 (slopes of log response on log regressor; upper bounds, test slope <= bound)
_PMOE = [
    ("N_star", "l", "pmoe_separate", 8.0, "Thm 4.2"), ("N_star", "l", "pmoe_joint", 6.0, "Thm 4.5"),
    ("N_star", "l", "cnn", 0.0, "Thm 4.3"), ("N_star", "n", "pmoe_separate", 0.0, "Thm 4.2"),
    ("N_star", "n", "pmoe_joint", 0.0, "Thm 4.5"), ("N_star", "n", "cnn", 8.0, "Thm 4.3"),
    ("N_star", "k", "pmoe_joint", 4.0, "Thm 4.5"), ("N_star", "p", "pmoe_separate", 12.0, "Thm 4.2"),
    ("N_star", "p", "pmoe_joint", 12.0, "Thm 4.5"), ("N_star", "p", "cnn", 12.0, "Thm 4.3"),
    ("N_star", "delta", "pmoe_separate", 6.0, "Thm 4.2"), ("N_star", "delta", "pmoe_joint", 6.0, "Thm 4.5"),
    ("N_star", "delta", "cnn", 6.0, "Thm 4.3"), ("N_star", "1/eps", "pmoe_separate", 16.0, "Thm 4.2"),
    ("N_star", "1/eps", "pmoe_joint", 16.0, "Thm 4.5"), ("N_star", "1/eps", "cnn", 16.0, "Thm 4.3"),
    ("N_star_ratio_cnn_over_separate", "n/l", "pmoe_separate", 8.0, "Thm 4.2 + 4.3"),
    ("M_star", "l", "pmoe_separate", 10.0, "Thm 4.2"), ("M_star", "l", "pmoe_joint", 6.0, "Thm 4.5"),
    ("M_star", "n", "pmoe_joint", 2.0, "Thm 4.5"), ("M_star", "n", "cnn", 10.0, "Thm 4.3"),
    ("M_star", "k", "pmoe_joint", 3.0, "Thm 4.5"),
    ("test_error_fixed_N", "l", "pmoe_separate", 0.5, "Thm 4.2"),
    ("test_error_fixed_N", "l", "pmoe_joint", 0.375, "Thm 4.5"),
    ("test_error_fixed_N", "k", "pmoe_joint", 0.25, "Thm 4.5"),
    ("test_error_fixed_N", "n", "cnn", 0.5, "Thm 4.3"),
    ("router_N_r", "n", "pmoe_separate", 2.0, "Lemma 4.1 (one pass)"),
]


def theory_rates(n_range: tuple[float, float] = (1e3, 1e5)) -> pd.DataFrame:
    """The rates the founding papers predict, as a tidy frame to join against :func:`fit_rate` results.

    Sources: nguyen2024 notes §5.2 (Table 1 and Theorems 1-5; softmax rows are cited there from [26]),
    makkuva2020 notes §6 (Theorem 4 and its derived sample complexity; heuristic parametric rates for
    Theorem 2), chowdhury2023 notes §4.2 (log-log slopes of sample and model complexity; upper bounds).

    Columns: ``source, result, gate, regime, expert, examples, quantity, response, regressor, rate``
    (as printed), ``exponent`` (alpha of ``response ~ regressor^-alpha`` for ``direction="decay"``; the
    slope of ``log response`` on ``log regressor`` for ``"growth"``; ``test_error_fixed_N`` rows are growth
    slopes in l, k, n), ``rate_model`` (the :func:`fit_rate` model that has this rate as a straight line),
    ``direction``, ``kind`` (``upper_bound``, ``lower_bound_minimax``, ``slower_than_polynomial``,
    ``upper_bound_slope``, ``derived``, ``no_rate``), ``power_exponent_in_range`` (what a plain power fit
    reports for the noise-free curve over ``n_range``, e.g. 0.445 for ``(log n / n)^{1/2}`` over
    [1e3, 1e5]; nguyen2024 notes §6), ``note``.
    """
    lo, hi = n_range
    if not (1 < lo < hi):
        raise ValueError(f"n_range must be (low, high) with 1 < low < high, got {n_range!r}.")
    cols = ["source", "result", "gate", "regime", "expert", "examples", "quantity", "response", "regressor", "rate",
            "exponent", "rate_model", "direction", "kind", "note"]
    rows = [dict(zip(cols, r, strict=True)) for r in _THEORY]
    for resp, reg, arch, slope, res in _PMOE:
        rows.append({"source": "chowdhury2023", "result": res, "gate": "patch_top_l" if arch != "cnn" else "none",
                     "regime": "", "expert": arch, "examples": "two-layer ReLU CNN experts",
                     "quantity": resp, "response": resp, "regressor": reg,
                     "rate": f"slope {slope:g} in log {reg}", "exponent": slope, "rate_model": "power",
                     "direction": "growth", "kind": "upper_bound_slope",
                     "note": "loose upper bound: test slope <= bound, not equality"})
    out = pd.DataFrame(rows, columns=cols)
    out["power_exponent_in_range"] = [
        _apparent_power_exponent(m, e, n_range) if d == "decay" and r == "n" else np.nan
        for m, e, d, r in zip(out["rate_model"], out["exponent"], out["direction"], out["regressor"], strict=True)]
    return out[[*cols[:-1], "power_exponent_in_range", "note"]]


# --------------------------------------------------------------------------------------------------
# synthetic frames (design checks and tests)


def simulate_rate_frame(alpha: float, ns: Sequence[float], reps: int, *, model: str = "power", studies: int = 1,
                        sigma: float | Sequence[float] = 0.5, scale: float = 2.0, noise: str = "lognormal",
                        shape: float = 1.0, seed: int | None = 0) -> pd.DataFrame:
    """Synthetic tidy rate frame ``y = scale * exp(-alpha u(n)) * noise``.

    ``u`` is the regressor of ``model`` (``power``: ``y = scale n^-alpha`` times noise).  ``noise="lognormal"``
    draws ``exp(sigma eps)``, ``eps ~ N(0, 1)``; ``sigma`` may be one value or one per n (heteroskedastic
    replicate spread).  ``noise="gamma"`` draws ``G / shape`` with ``G ~ Gamma(shape)`` (mean 1; ``shape = 1`` is
    exponential, like a squared error with 2 degrees of freedom; very skewed on the raw scale, left-skewed on
    the log scale).  In both cases the noise law is the same at every n up to ``sigma``, so the slope of
    ``log y`` is exactly ``-alpha`` in expectation.  Use it to check before running a study whether a planned
    n grid and replicate count give honest, informative intervals (``studies`` independent copies).

    Returns
    -------
    DataFrame
        Columns ``study, n, rep, y`` (one row per study x n x replicate).
    """
    _check_choice("noise", noise, ("lognormal", "gamma"))
    ns = np.asarray(ns, dtype=np.float64)
    reps = int(reps)
    sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64), ns.shape)
    rng = np.random.default_rng(seed)
    n = np.tile(np.repeat(ns, reps), studies)
    mean_log = np.log(scale) - alpha * regressor(model, n)
    if noise == "lognormal":
        log_noise = np.tile(np.repeat(sig, reps), studies) * rng.standard_normal(len(n))
    else:
        log_noise = np.log(rng.gamma(shape, 1.0 / shape, size=len(n)))
    return pd.DataFrame({"study": np.repeat(np.arange(studies), len(ns) * reps), "n": n,
                         "rep": np.tile(np.tile(np.arange(reps), len(ns)), studies), "y": np.exp(mean_log + log_noise)})


def calibrate_design(alpha: float, ns: Sequence[float], reps: int, *, studies: int = 1000,
                     sigma: float | Sequence[float] = 0.5, model: str = "power", noise: str = "lognormal",
                     shape: float = 1.0, seed: int | None = 0, **fit_kwargs: Any) -> pd.DataFrame:
    """Monte Carlo check of :func:`fit_rate` on a design: bias, empirical SE and CI coverage with MC SEs.

    Simulates ``studies`` frames from :func:`simulate_rate_frame` (true exponent ``alpha`` under ``model``;
    ``sigma``, ``noise`` and ``shape`` as there),
    fits each with ``fit_rate(..., model=model, **fit_kwargs)`` and summarises them the way ``rsimsum``
    does: ``bias`` with ``bias_mcse = emp_se / sqrt(S)``, ``emp_se`` (SD of the estimates), ``mean_se``
    (average reported SE), ``coverage`` of the nominal interval with
    ``coverage_mcse = sqrt(coverage (1 - coverage) / S)``.

    Returns
    -------
    DataFrame
        One row: the design (``alpha, model, n_values, n_min, n_max, reps, sigma, studies``), the fit
        settings (``method, agg, interval, ci, n_boot``) and the summaries above.
    """
    frame = simulate_rate_frame(alpha, ns, reps, model=model, studies=studies, sigma=sigma, noise=noise, shape=shape,
                                seed=seed)
    fit_kwargs.setdefault("warn", False)
    res = fit_rate(frame, "y", by="study", model=model, seed=None if seed is None else seed + 1, **fit_kwargs)
    tab = res.table
    s = len(tab)
    cover = float(((tab["ci_low"] <= alpha) & (alpha <= tab["ci_high"])).mean())
    emp = float(tab["exponent"].std(ddof=1))
    cfg = res.config
    return pd.DataFrame([{
        "alpha": alpha, "model": model, "n_values": len(ns), "n_min": float(np.min(ns)), "n_max": float(np.max(ns)),
        "reps": reps, "noise": noise if noise == "lognormal" else f"gamma({shape:g})",
        "sigma": (np.nan if noise == "gamma" else float(sigma) if np.ndim(sigma) == 0
                  else "/".join(f"{v:g}" for v in np.ravel(sigma))),
        "studies": s, "method": cfg["method"], "agg": cfg["agg"] or "none",
        "interval": cfg["interval"], "ci": cfg["ci"], "n_boot": cfg["n_boot"],
        "bias": float(tab["exponent"].mean() - alpha), "bias_mcse": emp / np.sqrt(s), "emp_se": emp,
        "mean_se": float(tab["se"].mean()), "coverage": cover, "coverage_mcse": float(np.sqrt(cover * (1 - cover) / s)),
    }])
