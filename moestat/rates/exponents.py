"""Convergence exponents: fits, comparisons, tests, window diagnostics and verdicts (see :mod:`moestat.rates`)."""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.regression.linear_model import OLS
from statsmodels.robust.norms import HuberT
from statsmodels.robust.robust_linear_model import RLM
from statsmodels.tools.tools import add_constant

__all__ = [
    "RATE_MODELS",
    "VERDICTS",
    "RateResult",
    "RateWarning",
    "WindowSensitivity",
    "calibrate_design",
    "compare_models",
    "compare_rates",
    "fit_rate",
    "simulate_rate_frame",
    "test_exponent",
    "window_sensitivity",
]

from .._validation import (
    Boolean,
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
from ..report import Result, Summary
from ._core import (
    _AGGS,
    _INTERVALS,
    _KNAPP_HARTUNG,
    _METHODS,
    _RESAMPLE,
    MIN_CLUSTERS,
    MIN_N_VALUES,
    MIN_UNITS,
    RATE_MODELS,
    RECOMMENDED_N_VALUES,
    TABLE_COLUMNS,
    VERDICTS,
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
    _moderate_variances,
    _ols_stats,
    _prepare,
    _re_metareg,
    _re_ml_aic,
    _wls_coefs,
    rao_wu,
    regressor,
)

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


def _boot_rows(cells: _Cells, n_resamples: int, rng: np.random.Generator, resample: str) -> np.ndarray:
    """Bootstrap draws of every replicate's log y (B, N), rows in cell order, rescaled around the cell median.

    Used by the Huber fit, which needs rows rather than per-n statistics; the deviation from the cell
    median is multiplied by sqrt(R/(R-1)) as in :func:`_boot_cell_stats`.
    """
    out = []
    if resample == "rep":
        g = len(cells.reps[0])
        pick = rng.integers(0, g, size=(n_resamples, g))
    for i, v in enumerate(cells.values):
        logv = np.log(v)
        r = len(v)
        if resample == "rep":
            draw = logv[np.argsort(cells.reps[i])][pick]
        else:
            draw = logv[rng.integers(0, r, size=(n_resamples, r))]
        centre = np.median(logv)
        out.append(rao_wu(centre, draw, r))
    return np.concatenate(out, axis=1)


def _boot_cell_stats(cells: _Cells, agg: str | None, n_resamples: int, rng: np.random.Generator,
                     resample: str) -> np.ndarray:
    """Rescaled bootstrap draws z*_n (B, m) of the per-n statistics.

    ``within_n`` resamples replicates independently within each n; ``rep`` resamples whole replicate ids
    (the same draw at every n, for nested designs where replicate r at different n shares data).  The
    deviation of each draw from the sample statistic is multiplied by sqrt(R/(R-1)) so that the bootstrap
    variance of a mean is the unbiased s^2/R (the rescaling bootstrap of Rao & Wu 1988).
    """
    z0 = np.array([_cell_stat(v, agg) for v in cells.values])
    m = len(cells.ns)
    out = np.empty((n_resamples, m))
    if resample == "within_n":
        for i, v in enumerate(cells.values):
            r = len(v)
            draw = v[rng.integers(0, r, size=(n_resamples, r))]
            out[:, i] = rao_wu(z0[i], _cell_stat(draw, agg), r)
        return out
    ids = cells.reps[0]
    for i, reps in enumerate(cells.reps):
        if len(reps) != len(ids) or not np.array_equal(np.sort(reps), np.sort(ids)):
            raise ValueError("resample='rep' needs the same replicate ids at every n (a nested design); "
                             f"n={cells.ns[i]:g} has a different set. Use resample='within_n'.")
    g = len(ids)
    pick = rng.integers(0, g, size=(n_resamples, g))
    for i, v in enumerate(cells.values):
        order = np.argsort(cells.reps[i])
        draw = v[order][pick]
        out[:, i] = rao_wu(z0[i], _cell_stat(draw, agg), g)
    return out




def _unit_counts(n_resamples: int, g: int, rng: np.random.Generator) -> np.ndarray:
    """(B, G) multiplicities of a bootstrap draw of G units with replacement (one row per draw)."""
    pick = rng.integers(0, g, size=(n_resamples, g))
    flat = (pick + g * np.arange(n_resamples)[:, None]).ravel()
    return np.bincount(flat, minlength=n_resamples * g).reshape(n_resamples, g).astype(np.float64)


def _unit_matrix(cells: _Cells, agg: str | None, units: str, key_text: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit cell statistics Z (G, m): replicates of unit g at n_i averaged (or aggregated by ``agg``).

    Every unit must appear at every n of the group (a unit spans the n grid)."""
    ids = np.unique(np.concatenate(cells.units))
    g = len(ids)
    if g < MIN_UNITS:
        raise ValueError(f"{key_text} has {g} unit(s) in column {units!r} (from units=); the unit bootstrap needs "
                         f">= {MIN_UNITS} independent units (e.g. truth draws). Simulate more units, or drop units= "
                         "and use method='random_effects'.")
    z = np.empty((g, len(cells.ns)))
    for i, (v, lab) in enumerate(zip(cells.values, cells.units, strict=True)):
        codes = np.searchsorted(ids, lab)
        present = np.bincount(codes, minlength=g)
        if (present == 0).any():
            missing = ids[present == 0][:5].tolist()
            raise ValueError(f"{key_text}: unit(s) {missing} of column {units!r} (from units=) have no rows at "
                             f"n={cells.ns[i]:g}; every unit must span the n grid (drop incomplete units first).")
        if agg is None or agg == "logmean":
            z[:, i] = np.bincount(codes, np.log(v), minlength=g) / present
        elif agg == "mean":
            z[:, i] = np.log(np.bincount(codes, v, minlength=g) / present)
        else:
            z[:, i] = np.log(pd.Series(v).groupby(codes).median().to_numpy())
    return z, ids


@dataclass
class _Engine:
    """One group's data prepared for its interval method; shared by the models, the curvature test and windows.

    ``kind`` is the method actually used: ``random_effects``, ``cell_ols`` (its equal-weight fallback),
    ``cluster_bootstrap``, ``unit_bootstrap`` or ``robust``.
    """

    kind: str
    cells: _Cells
    agg: str | None
    z: np.ndarray                            # (m,) per-n statistic the line is fitted to
    w: np.ndarray                            # (m,) least-squares weights (bootstrap methods)
    v: np.ndarray | None = None              # (m,) within-cell variances of z (random effects)
    df_within: float = np.inf                # degrees of freedom of v (F reference of the shock test)
    truncate: bool = False                   # modified Knapp-Hartung
    zboot: np.ndarray | None = None          # (B, m) bootstrap draws of z
    boot_dfs: np.ndarray | None = None       # per-cell df of the bootstrap variance (Satterthwaite)
    boot_df: float | None = None             # a single df (whole replicate ids or units resampled)
    endog: np.ndarray | None = None          # robust / Huber: the rows' log y (or z for aggregates)
    row_cell: np.ndarray | None = None       # cell index of each row
    clusters: np.ndarray | None = None       # robust: cluster labels of the rows
    rows_boot: np.ndarray | None = None      # Huber: (B, N) draws of the rows
    n_units: int | None = None
    unit_z: np.ndarray | None = None         # (G, m) per-unit statistics
    unit_ids: np.ndarray | None = None


def _cell_variances(cells: _Cells, agg: str | None, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Per-replicate variance ``s_n^2`` of each cell's statistic, so that ``Var(z_n) ~ s_n^2 / R_n``.

    ``agg=None``/``logmean``: the sample variance of log y; ``mean``: the squared coefficient of variation of
    y (delta method for ``log mean y``); ``median``: ``R_n`` times the rescaled within-cell bootstrap variance
    of ``log median y``."""
    counts = cells.counts
    if agg is None or agg == "logmean":
        return np.array([np.log(v).var(ddof=1) for v in cells.values])
    if agg == "mean":
        return np.array([v.var(ddof=1) / v.mean() ** 2 for v in cells.values])
    return counts * _boot_cell_stats(cells, "median", n_resamples, rng, "within_n").var(axis=0, ddof=1)


def _build_engine(cells: _Cells, kind: str, agg: str | None, *, n_resamples: int, rng: np.random.Generator,
                  resample: str, estimator: str, cluster_on: str | None, rep: str | None, units: str | None,
                  truncate: bool, key_text: str, msgs: list[str]) -> _Engine:
    counts = cells.counts
    m = len(cells.ns)
    z = np.array([_cell_stat(v, agg) for v in cells.values])
    w = counts.astype(np.float64) if agg is None else np.ones(m)
    if kind == "random_effects":
        why = None
        if (counts < 2).any():
            why = (f"n = {cells.ns[counts < 2].tolist()} has a single replicate, so its within-cell variance cannot "
                   "be estimated")
        else:
            s2 = _cell_variances(cells, agg, n_resamples, rng)
            if not (np.isfinite(s2).all() and (s2 > 0).all()):
                why = f"the replicates at n = {cells.ns[~(s2 > 0)].tolist()} are identical (zero within-cell variance)"
        if why is not None:
            msgs.append(f"{key_text}: method='random_effects' needs >= 2 distinct replicates at every n; {why}. "
                        "Fell back to ordinary least squares on the per-n statistics (equal weights, t on m - 2 "
                        "df), which assumes the same variance at every n.")
            return _Engine("cell_ols", cells, agg, z, np.ones(m))
        d = counts - 1.0
        mod, d0, _ = _moderate_variances(s2, d)
        df_within = float(np.mean(np.minimum(d0 + d, d.sum())))
        return _Engine("random_effects", cells, agg, z, np.ones(m), v=mod / counts, df_within=df_within,
                       truncate=truncate)
    if kind == "cluster_bootstrap":
        zboot = _boot_cell_stats(cells, agg, n_resamples, rng, resample)
        eng = _Engine(kind, cells, agg, z, w, zboot=zboot)
        if resample == "within_n":
            eng.boot_dfs = counts - 1.0
        else:  # whole replicate ids resampled: one cluster-level variance estimate with G - 1 df
            eng.boot_df = float(len(cells.reps[0]) - 1)
            eng.boot_dfs = np.full(m, eng.boot_df)
        if estimator == "huber":
            eng.rows_boot = _boot_rows(cells, n_resamples, rng, resample)
            eng.endog = np.log(np.concatenate(cells.values))
            eng.row_cell = np.repeat(np.arange(m), counts)
        return eng
    if kind == "unit_bootstrap":
        uz, ids = _unit_matrix(cells, agg, units, key_text)
        g = len(ids)
        zbar = uz.mean(axis=0)
        draws = _unit_counts(n_resamples, g, rng) @ uz / g
        zboot = rao_wu(zbar, draws, g)  # units rescaled as replicates are
        return _Engine(kind, cells, agg, zbar, np.ones(m), zboot=zboot, boot_df=float(g - 1),
                       boot_dfs=np.full(m, g - 1.0), n_units=g, unit_z=uz, unit_ids=ids)
    # robust
    if agg is None:
        endog = np.log(np.concatenate(cells.values))
        row_cell = np.repeat(np.arange(m), counts)
        if units is not None:
            clusters = np.concatenate(cells.units)
        elif cluster_on == "rep":
            clusters = np.concatenate(cells.reps)
        else:
            clusters = None
    else:
        endog, row_cell, clusters = z, np.arange(m), None
    return _Engine("robust", cells, agg, z, w, endog=endog, row_cell=row_cell, clusters=clusters,
                   n_units=None if units is None else len(np.unique(np.concatenate(cells.units))))


@dataclass
class _Coef:
    """Coefficients of one linear fit with standard errors, t degrees of freedom and (bootstrap) draws."""

    beta: np.ndarray
    se: np.ndarray
    df: np.ndarray
    draws: np.ndarray | None = None       # (B, p)
    terms: np.ndarray | None = None       # (p, m) Satterthwaite pieces
    meta: Any = None                      # _MetaFit for random effects
    cov_type: str = ""


def _linear_fit(eng: _Engine, idx: np.ndarray, X: np.ndarray) -> _Coef:
    """Fit the per-n statistics of cells ``idx`` on the columns of X (len(idx), p) under the engine's method."""
    p = X.shape[1]
    if eng.kind in ("random_effects", "cell_ols"):
        meta = _re_metareg(X, eng.z[idx], None if eng.kind == "cell_ols" else eng.v[idx], eng.df_within,
                           eng.truncate)
        return _Coef(meta.beta, np.sqrt(np.diag(meta.cov)), np.full(p, meta.df), meta=meta,
                     cov_type=("cell_ols" if eng.kind == "cell_ols"
                               else "random_effects_kh" + ("_modified" if eng.truncate else "")))
    if eng.kind in ("cluster_bootstrap", "unit_bootstrap"):
        h = _wls_coefs(X, eng.w[idx])
        zb = eng.zboot[:, idx]
        draws = zb @ h.T
        terms = h ** 2 * zb.var(axis=0, ddof=1)
        if eng.boot_df is not None:
            df = np.full(p, eng.boot_df)
        else:
            df = np.array([_satterthwaite(t, eng.boot_dfs[idx]) for t in terms])
        return _Coef(h @ eng.z[idx], draws.std(axis=0, ddof=1), df, draws=draws, terms=terms,
                     cov_type="unit_bootstrap" if eng.kind == "unit_bootstrap" else "bootstrap")
    # robust: statsmodels OLS on the rows of these cells
    mask = np.isin(eng.row_cell, idx)
    pos = np.searchsorted(idx, eng.row_cell[mask])
    labels = None if eng.clusters is None else eng.clusters[mask]
    cov_type, kwds = _robust_cov(labels, "rep" if labels is not None else None)
    rob = OLS(eng.endog[mask], X[pos]).fit(cov_type=cov_type, cov_kwds=kwds or None, use_t=True)
    df = float(getattr(rob, "df_resid_inference", None) or rob.df_resid)
    return _Coef(np.asarray(rob.params), np.asarray(rob.bse), np.full(p, df), cov_type=cov_type)


def _huber_slope(eng: _Engine, idx: np.ndarray, u: np.ndarray, robust: bool, ols: _Coef | None,
                 n_draws: int | None = None) -> tuple[float, float, float, float, np.ndarray | None, str]:
    """Huber M-estimate of the line on the rows of cells ``idx``: (intercept, slope, se, df, slope draws, cov)."""
    mask = np.isin(eng.row_cell, idx)
    u_rows = u[eng.row_cell[mask]]
    exog = add_constant(u_rows, has_constant="add")
    rlm = RLM(eng.endog[mask], exog, M=HuberT(t=HUBER_C)).fit(conv="coefs", tol=1e-10,
                                                                                maxiter=200)
    if robust:
        return float(rlm.params[0]), float(rlm.params[1]), float(rlm.bse[1]), float(mask.sum() - 2), None, "huber_H1"
    rows = eng.rows_boot[:n_draws, mask] if n_draws else eng.rows_boot[:, mask]
    _, slopes = _huber_fit(u_rows, rows, tol=1e-7)  # 1e-7 on coefficients is far below any bootstrap SE
    # t reference: the Satterthwaite df of the least-squares line (an approximation)
    return float(rlm.params[0]), float(rlm.params[1]), float(slopes.std(ddof=1)), float(ols.df[1]), slopes, "bootstrap"


def _robust_cov(rep_labels: np.ndarray | None, cluster: str | None) -> tuple[str, dict[str, Any]]:
    if cluster is not None and rep_labels is not None and len(np.unique(rep_labels)) >= 2:
        return "cluster", {"groups": pd.factorize(rep_labels)[0]}
    return "HC3", {}


def _satterthwaite(terms: np.ndarray, dfs: np.ndarray) -> float:
    terms = np.asarray(terms, dtype=np.float64)
    denom = float(np.sum(terms ** 2 / dfs))
    return float(np.sum(terms) ** 2 / denom) if denom > 0 else float(np.sum(dfs))


def _welch_df(se_a: float, df_a: float, se_b: float, df_b: float) -> float:
    """Welch-Satterthwaite degrees of freedom of a difference of two independent estimates."""
    va, vb = se_a ** 2, se_b ** 2
    denom = va ** 2 / df_a + vb ** 2 / df_b
    return float((va + vb) ** 2 / denom) if denom > 0 else float(df_a + df_b)


def _interval(est: float, se: float, df: float, draws: np.ndarray | None, level: float,
              interval: str) -> tuple[float, float]:
    a = 1 - level
    if interval == "percentile" and draws is not None:
        lo, hi = np.quantile(draws, [a / 2, 1 - a / 2])
        return float(lo), float(hi)
    q = stats.t.ppf(1 - a / 2, df)
    return est - q * se, est + q * se


def _windows(ns: np.ndarray, drop: str, min_values: int, min_span: float) -> list[tuple[str, int, np.ndarray]]:
    """(side, dropped, cell indices) of the windows: the full range, then the smallest / largest n dropped one
    at a time, keeping windows with >= ``min_values`` n values spanning >= ``min_span`` decades."""
    m = len(ns)
    sides = ["smallest", "largest"] if drop == "both" else [drop]
    out = []
    for side in sides:
        for k in range(0, m - min_values + 1):
            if k == 0 and out:
                continue  # the full window is reported once
            idx = np.arange(k, m) if side == "smallest" else np.arange(0, m - k)
            if np.log10(ns[idx[-1]] / ns[idx[0]]) < min_span - 1e-9:
                continue
            out.append(("full" if k == 0 else side, k, idx))
    return out


def _window_summary(exps: np.ndarray, lows: np.ndarray, highs: np.ndarray,
                    full: float) -> tuple[bool | None, float]:
    """``consistent`` (every window interval shares a point: max ci_low <= min ci_high) and ``drift`` (the
    window exponent farthest from the full-range one, minus the full-range exponent; signed)."""
    if len(exps) == 0:
        return None, np.nan
    dev = exps - full
    return bool(lows.max() <= highs.min()), float(dev[np.argmax(np.abs(dev))])


def _verdict(n_values: int, decades: float, ci_low: float, ci_high: float, curvature_p: float,
             window_consistent: bool | None, *, min_decades: float, alpha_curvature: float,
             max_ci_width: float) -> str:
    """The rule of :func:`fit_rate`, checked in this order (the first that applies wins)."""
    if n_values < MIN_N_VALUES or decades < min_decades - 1e-9:
        return "range too narrow"
    if ci_high <= 0 or (ci_low <= 0 and ci_high - ci_low <= max_ci_width):
        return "no decay"  # an increasing error, or a flat one pinned near zero decay
    if (np.isfinite(curvature_p) and curvature_p < alpha_curvature) or window_consistent is False:
        return "curved: exponent is local"
    if ci_high - ci_low > max_ci_width:
        return "imprecise"
    return "power law"


def _log_rows(cells: _Cells, agg: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(cell index, log response) of the rows the AIC comparison fits: replicates, or the m per-n statistics."""
    if agg is None:
        return np.repeat(np.arange(len(cells.ns)), cells.counts), np.log(np.concatenate(cells.values))
    return np.arange(len(cells.ns)), np.array([_cell_stat(v, agg) for v in cells.values])


def _comparison_aic(eng: _Engine, u: np.ndarray, ols_aic: float) -> float:
    """AIC of one rate model under the engine's variance model (the basis of ``best_model`` / ``delta_aic``).

    Random effects: the maximum-likelihood meta-regression of the per-n statistics (cell shocks are part of
    the model, not evidence of curvature); its equal-weight fallback and the unit bootstrap: OLS on the m
    per-n statistics (unit means); the replicate bootstrap and ``robust``: the OLS fit to the log responses
    (``aic``), which treats replicates as independent, as those methods do."""
    X = np.column_stack([np.ones(len(u)), u])
    if eng.kind == "random_effects":
        return _re_ml_aic(X, eng.z, eng.v)
    if eng.kind in ("cell_ols", "unit_bootstrap"):
        return _ols_stats(u, eng.z)[3]
    return ols_aic


def _fit_group(eng: _Engine, models: list[str], *, level: float, interval: str, estimator: str,
               windows: list[tuple[str, int, np.ndarray]], thresholds: dict[str, float],
               window_draws: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict]:
    """Rows of the rate table (one per model), rows of the window table and the pieces compare_rates needs."""
    cells = eng.cells
    ns = cells.ns
    m = len(ns)
    allidx = np.arange(m)
    decades = float(np.log10(ns.max() / ns.min()))
    row_cell, logy = _log_rows(cells, eng.agg)
    ols, aic_cmp = {}, {}
    for mod in RATE_MODELS:
        if mod == "power" or ns.min() > 1:
            u_m = regressor(mod, ns)
            ols[mod] = _ols_stats(u_m[row_cell], logy)
            aic_cmp[mod] = _comparison_aic(eng, u_m, ols[mod][3])
    best = min(aic_cmp, key=aic_cmp.get)
    lnc = np.log(ns) - np.log(ns).mean()
    rows, wrows, pieces = [], [], {}
    robust = eng.kind == "robust"
    for mod in models:
        u = regressor(mod, ns)
        X = np.column_stack([np.ones(m), u])
        fit = _linear_fit(eng, allidx, X)
        b0, b1, se, df = float(fit.beta[0]), float(fit.beta[1]), float(fit.se[1]), float(fit.df[1])
        slope_draws = None if fit.draws is None else fit.draws[:, 1]
        cov_type = fit.cov_type
        if estimator == "huber":
            b0, b1, se, df, slope_draws, cov_type = _huber_slope(eng, allidx, u, robust, fit)
        est = -b1
        lo, hi = _interval(est, se, df, None if slope_draws is None else -slope_draws, level, interval)
        # curvature: a centred (log n)^2 term added to this model, tested under the same variance model
        curv, curv_p = np.nan, np.nan
        if m >= 4:
            c = _linear_fit(eng, allidx, np.column_stack([X, lnc ** 2]))
            curv = float(c.beta[2])
            curv_p = float(2 * stats.t.sf(abs(curv) / c.se[2], c.df[2])) if c.se[2] > 0 else np.nan
        # windows of the same model and method
        wexp, wlo, whi = [], [], []
        for side, k, idx in windows:
            if len(idx) == m:
                e_w, s_w, l_w, h_w = est, se, lo, hi
            else:
                Xw = X[idx]
                fw = _linear_fit(eng, idx, Xw)
                e_w, s_w, d_w = -float(fw.beta[1]), float(fw.se[1]), float(fw.df[1])
                dr = None if fw.draws is None else -fw.draws[:, 1]
                if estimator == "huber":
                    _, b1w, s_w, d_w, hd, _ = _huber_slope(eng, idx, u, robust, fw, window_draws)
                    e_w, dr = -b1w, None if hd is None else -hd
                l_w, h_w = _interval(e_w, s_w, d_w, dr, level, interval)
            sel = np.isin(row_cell, idx)
            r2_w = _ols_stats(u[row_cell[sel]], logy[sel])[2]
            wexp.append(e_w)
            wlo.append(l_w)
            whi.append(h_w)
            wrows.append({"model": mod, "side": side, "dropped": k, "x_min": ns[idx[0]], "x_max": ns[idx[-1]],
                          "n_values": len(idx), "span": float(np.log10(ns[idx[-1]] / ns[idx[0]])), "exponent": e_w,
                          "se": s_w, "ci_low": l_w, "ci_high": h_w, "r2": r2_w})
        consistent, drift = _window_summary(np.array(wexp), np.array(wlo), np.array(whi), est)
        _, _, r2, aic, bic = ols[mod]
        delta = aic_cmp[mod] - aic_cmp[best]
        if estimator == "huber":
            r2, aic, bic = np.nan, np.nan, np.nan
        meta = fit.meta
        row = {"model": mod, "exponent": est, "se": se, "ci_low": lo, "ci_high": hi, "intercept": b0, "r2": r2,
               "aic": aic, "n_values": m, "replicates": int(cells.counts.min()),
               "verdict": _verdict(m, decades, lo, hi, curv_p, consistent, **thresholds),
               "curvature_p": curv_p, "best_model": best, "delta_aic": delta, "window_consistent": consistent,
               "window_drift": drift, "tau2": meta.tau2 if meta is not None else np.nan,
               "shock_p": meta.shock_p if meta is not None else np.nan,
               "df": df, "bic": bic, "rows": int(cells.counts.sum()), "cov_type": cov_type, "x_min": ns.min(),
               "x_max": ns.max(), "decades": decades, "curvature": curv, "aic_compare": aic_cmp[mod],
               "units": eng.n_units or np.nan,
               "windows": len(windows)}
        rows.append(row)
        pieces[mod] = {"kind": eng.kind, "se": se, "df": df, "draws": None if slope_draws is None else -slope_draws,
                       "terms": None if fit.terms is None else fit.terms[1], "dfs": eng.boot_dfs}
    return rows, wrows, pieces


# --------------------------------------------------------------------------------------------------
# results


@dataclass
class RateResult(Result):
    """Result of :func:`fit_rate` (a :class:`moestat.report.Result`: :meth:`tidy`, :meth:`glance`, :meth:`summary`).

    Attributes
    ----------
    table : DataFrame
        One row per group x model: the ``by`` columns, then ``model, exponent, se, ci_low, ci_high,
        intercept, r2, aic, n_values, replicates`` (``replicates`` is the smallest replicate count over n),
        then the diagnostics ``verdict, curvature_p, best_model, delta_aic, window_consistent, window_drift,
        tau2, shock_p`` (see :func:`fit_rate`).
    details : DataFrame
        ``table`` plus ``df`` (degrees of freedom of the t reference), ``bic``, ``rows``, ``cov_type``,
        ``x_min``, ``x_max``, ``decades``, ``curvature`` (coefficient of the centred (log n)^2 term),
        ``units`` (number of units, unit bootstrap), ``windows`` (number of windows fitted), ``warnings``.
    windows : DataFrame
        The window analysis behind ``window_consistent`` / ``window_drift``: ``by`` columns, ``model, side,
        dropped, x_min, x_max, n_values, span, exponent, se, ci_low, ci_high, r2`` (windows spanning at
        least ``min_decades`` decades with at least 3 n values; see :func:`window_sensitivity`).
    data : DataFrame
        The rows used: ``by`` columns, ``x``, ``units`` and ``rep`` (if any) and ``y``.
    config : dict
        Every knob of the fit (y, x, by, rep, units, models, agg, ci, method (the method used; ``auto``
        resolved), method_requested, interval, n_resamples, seed, resample, cluster, estimator, knapp_hartung,
        min_decades, alpha_curvature, max_ci_width, na, dropped_na).
    draws : dict
        ``(group key, model) -> (n_resamples,)`` bootstrap exponents (bootstrap methods only).
    """

    table: pd.DataFrame
    details: pd.DataFrame
    data: pd.DataFrame
    config: dict[str, Any]
    windows: pd.DataFrame = field(default_factory=pd.DataFrame)
    draws: dict[tuple, np.ndarray] = field(default_factory=dict, repr=False)
    _var: dict[tuple, dict[str, Any]] = field(default_factory=dict, repr=False)

    def to_frame(self, *, details: bool = False, config: bool = False) -> pd.DataFrame:
        """The tidy ``table`` (a copy); ``details=True`` gives ``details`` instead; ``config=True`` appends the
        fit's knobs (``y, x, agg, ci, method, interval, n_resamples, seed, resample, cluster, estimator, units``) as
        columns, for a ``rates.csv`` that records how it was made."""
        out = (self.details if details else self.table).copy()
        if config:
            for k in ("y", "x", "agg", "ci", "method", "interval", "n_resamples", "seed", "resample", "cluster",
                      "estimator", "units"):
                out[k if k not in out.columns else f"config_{k}"] = self.config[k]
        return out

    def tidy(self) -> pd.DataFrame:
        """One row per group x model: the ``by`` columns, ``model, term`` (``"exponent"``), ``estimate,
        std_error, conf_low, conf_high`` (the level is ``config["ci"]``) and the ``verdict``."""
        by = self.config["by"]
        t = self.table
        return pd.DataFrame({**{c: t[c] for c in by}, "model": t["model"], "term": "exponent",
                             "estimate": t["exponent"], "std_error": t["se"], "conf_low": t["ci_low"],
                             "conf_high": t["ci_high"], "verdict": t["verdict"]}).reset_index(drop=True)

    def glance(self) -> pd.DataFrame:
        """One row per group x model: the fit statistics and every check behind the verdict (``details``)."""
        return self.details.copy()

    def summary(self) -> Summary:
        """A printable report: the method, the table with its verdicts and diagnostics, and warnings."""
        cfg = self.config
        fitted_on = "replicate-level logs" if cfg["agg"] is None else f"per-n {cfg['agg']}"
        if cfg["estimator"] == "huber":
            fitted_on += ", Huber M-estimate"
        how = {"cluster_bootstrap": f"{cfg['n_resamples']} draws, resample={cfg['resample']}, "
                                    f"interval={cfg['interval']}, seed={cfg['seed']}",
               "unit_bootstrap": f"{cfg['n_resamples']} draws of whole units of {cfg['units']!r}, t on G - 1 df, "
                                 f"seed={cfg['seed']}",
               "random_effects": "per-n statistics, moderated within-cell variances, DerSimonian-Laird tau^2, "
                                 f"{cfg['knapp_hartung']} Knapp-Hartung t on m - 2 df",
               "robust": f"cluster={cfg['cluster']}"}[cfg["method"]]
        header = {"response": cfg["y"], "fitted on": fitted_on, "method": cfg["method"],
                  "intervals": f"{round(cfg['ci'] * 100)}%"}
        cols = ["exponent", "ci_low", "ci_high", "verdict", "curvature_p", "best_model", "delta_aic",
                "window_consistent", "window_drift", "n_values", "replicates", "decades"]
        body = self.details.set_index([*cfg["by"], "model"])[cols]
        notes = [f"{cfg['method']}: {how}", "models: " + "; ".join(f"{m}: {RATE_MODELS[m]}" for m in cfg["models"])]
        notes += _verdict_legend(cfg, self.details).split("\n")
        notes += [f"warning: {w}" for w in dict.fromkeys(w for w in self.details["warnings"] if w)]
        return Summary(header, body, pd.DataFrame(), notes, title=f"Rate fit of {cfg['y']} on {cfg['x']}")

    def __str__(self) -> str:
        return self.summary().as_text()

    def __repr__(self) -> str:
        cfg = self.config
        return (f"RateResult(y={cfg['y']!r}, by={cfg['by']}, models={cfg['models']}, agg={cfg['agg']!r}, "
                f"method={cfg['method']!r}, rows={len(self.table)})\n{self.table.to_string(index=False)}")

    def plot(self, ax: Any = None, **kwargs: Any) -> Any:
        """Log-log plot in the papers' Figure 1 style; see :func:`moestat.rates.plots.plot_rate`."""
        from .plots import plot_rate

        return plot_rate(self, ax=ax, **kwargs)

    def test_exponent(self, value: float, **kwargs: Any) -> pd.DataFrame:
        """Shorthand for :func:`test_exponent` on this result."""
        return test_exponent(self, value, **kwargs)


def _verdict_legend(cfg: dict[str, Any], details: pd.DataFrame) -> str:
    """How to read the verdict column (printed under every rate table)."""
    lines = [f"verdict rule (first that applies): 'range too narrow' (< {MIN_N_VALUES} n values or < "
             f"{cfg['min_decades']:g} decades); 'no decay' (ci_high <= 0, or a CI containing 0 narrower than "
             f"{cfg['max_ci_width']:g}); 'curved: exponent is local' "
             f"(curvature_p < {cfg['alpha_curvature']:g} or window intervals inconsistent); 'imprecise' (CI wider than "
             f"{cfg['max_ci_width']:g}); else 'power law'."]
    curved = details[details["verdict"] == "curved: exponent is local"]
    for _, r in curved.iterrows():
        key = ", ".join(f"{b}={r[b]}" for b in cfg["by"])
        lines.append(f"  {key + ', ' if key else ''}{r['model']}: exponent {r['exponent']:.3g} describes "
                     f"{cfg['x']} in [{r['x_min']:g}, {r['x_max']:g}] only (a local slope, not an asymptotic rate; "
                     f"window drift {r['window_drift']:+.3g}).")
    return "\n".join(lines)


def _resolve_method(method: str, units: str | None, estimator: str, resample: str | None,
                    interval: str) -> str:
    """``auto``: the unit bootstrap with ``units``; the replicate bootstrap when an option only it has is set
    (``estimator='huber'``, ``resample=``, ``interval='percentile'``); otherwise random effects."""
    if method == "auto":
        if units is not None:
            return "unit_bootstrap"
        if estimator == "huber" or resample is not None or interval == "percentile":
            return "cluster_bootstrap"
        return "random_effects"
    if method == "unit_bootstrap" and units is None:
        raise ValueError("method='unit_bootstrap' resamples whole units; name the unit column with units= "
                         "(e.g. units='truth' for truth draws).")
    if units is not None and method in ("random_effects", "cluster_bootstrap"):
        raise ValueError(f"units= is used by method='unit_bootstrap' (the default with units) and 'robust' "
                         f"(clustered on units); method={method!r} would ignore the units. Drop method= or units=.")
    if resample is not None and method != "cluster_bootstrap":
        raise ValueError(f"resample= applies to method='cluster_bootstrap' only (got method={method!r}).")
    if interval == "percentile" and method == "random_effects":
        raise ValueError("interval='percentile' needs bootstrap draws; method='random_effects' gives t intervals. "
                         "Use interval='t' or a bootstrap method.")
    if estimator == "huber" and method in ("random_effects", "unit_bootstrap"):
        raise ValueError(f"estimator='huber' is available with method='cluster_bootstrap' or 'robust', not "
                         f"{method!r}.")
    return method


@keyword_only_options
@renamed_arguments(n_boot="n_resamples", ci="confidence_level")
@validate_arguments(confidence_level=Real(0, 1, open_low=True, open_high=True), n_resamples=Integer(100),
                    seed=Seed(), min_decades=Real(0), alpha_curvature=Real(0, 1, open_low=True, open_high=True),
                    max_ci_width=Real(0, open_low=True), warn=Boolean())
def fit_rate(frame: pd.DataFrame, y: str, *, x: str = "n", by: str | Sequence[str] | None = None,
             model: str | Sequence[str] = "power", agg: str | None = None, confidence_level: float = 0.95,
             method: str = "auto", n_resamples: int = 2000, seed: int | None = 0,
             rep: str | None = "rep", units: str | None = None, interval: str = "t", resample: str | None = None,
             cluster: str | None = "auto", estimator: str = "ols", na: str = "raise", min_decades: float = 1.0,
             alpha_curvature: float = 0.05, max_ci_width: float = 0.3, knapp_hartung: str = "standard",
             warn: bool = True) -> RateResult:
    r"""Estimate convergence exponents ``alpha`` in ``y ~ C n^-alpha`` (or a log variant), with intervals,
    diagnostics and a verdict.

    Each model regresses ``log y`` on ``u(n)``: ``power`` ``u = log n``; ``power_log``
    ``u = log(n / log n)`` (the ``(log n / n)^{1/2}`` bounds of nguyen2024 Thm 1-5); ``inverse_log``
    ``u = log log n`` (``y = C (log n)^-alpha``; ``alpha = 1`` is the ``1/log n`` rate of nguyen2024
    Table 1).  ``exponent = -slope``.

    **Variance model (default ``method="auto"``).**  Without ``units``, the random-effects meta-regression of
    the per-n statistic ``z_n`` (mean of log y over the ``R_n`` replicates at n) on ``u(n)``:

    $$
    z_n = c - \alpha u_n + b_n + e_n, \qquad b_n \sim N(0, \tau^2), \qquad e_n \sim N(0, v_n),
    $$

    where ``b_n`` is a shock shared by every replicate of the cell (one true model, one Monte Carlo sample
    or one limit estimate per n) and ``v_n = s_n^2 / R_n`` the replicate noise of the cell mean.
    ``s_n^2`` is moderated towards a common value fitted to all cells (empirical Bayes, Smyth 2004) so that
    cells with few replicates do not receive erratic weights; ``tau^2`` is the DerSimonian-Laird
    method-of-moments estimate generalised to meta-regression,
    ``tau^2 = max(0, (Q_E - (m - 2)) / tr P)``; the fit is weighted least squares with weights
    ``1 / (v_n + tau^2)`` and the Knapp-Hartung variance
    ``q (X' W X)^{-1}``, ``q = sum_n w_n r_n^2 / (m - 2)``, with a t reference on ``m - 2`` df
    (m = number of n values; DerSimonian & Laird 1986; Knapp & Hartung 2003; Viechtbauer 2010).  Because
    ``q`` is estimated from the scatter of the cell means about the line, the interval stays calibrated
    when replicates are nested across n (a replicate effect shared by all n shifts every cell mean alike and
    cancels from the slope, so ``q < 1`` shrinks the over-stated ``v_n``); the factor is therefore not
    truncated at 1 (``knapp_hartung="modified"`` truncates it; see docs/rates.md for the measured effect).
    ``tau2`` and ``shock_p`` (Cochran's residual ``Q_E`` test of ``tau^2 = 0``, ``Q_E / (m - 2)`` against
    ``F(m - 2, d)`` with ``d`` the degrees of freedom of the moderated variances) are reported.  Where the
    within-cell variance cannot be estimated (a single replicate, or identical replicates, at some n) the
    fit falls back, with a :class:`RateWarning`, to ordinary least squares on the per-n statistics with the
    classical t interval on ``m - 2`` df.

    With ``units`` (a column whose values are independent units that each span the n grid, typically a
    truth-draw id) the default is the unit bootstrap: replicates inside a unit-and-n cell are averaged,
    ``z_n`` is the mean over units, and whole units are resampled with all their rows (``n_resamples`` draws,
    deviations rescaled by ``sqrt(G / (G - 1))``, t reference on ``G - 1`` df; at least 5 units).

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
        ``None`` (default) uses every replicate's ``log y`` (the per-n statistic is the mean log y);
        otherwise one point per n: ``log mean y`` (the papers' way, reproduced for comparison; biased for
        skewed losses), ``log median y`` or ``mean log y``.  For random effects the within variance of
        ``log mean y`` is the delta-method ``CV^2 / R`` and that of ``log median y`` a within-cell bootstrap.
    confidence_level : float
        Confidence level of the intervals (formerly ``ci=``).
    method : {"auto", "random_effects", "unit_bootstrap", "cluster_bootstrap", "robust"}
        ``auto`` (default): ``unit_bootstrap`` with ``units``, ``cluster_bootstrap`` when
        ``estimator="huber"``, ``resample=`` or ``interval="percentile"`` is given (options of that method),
        else ``random_effects``.  ``cluster_bootstrap``: resample replicates within each n
        (``resample="within_n"``) or whole replicate ids (``resample="rep"``) with the sqrt(R/(R-1))
        rescaling; valid when replicates are independent within and across n (no shared shocks).
        ``robust``: statsmodels OLS with a cluster-robust covariance clustered on ``units`` (if given) or
        on ``rep`` (replicate-level fits with >= 10 ids, or ``cluster="rep"``), else HC3.
    n_resamples, seed : int
        Bootstrap draws and seed (numpy ``SeedSequence``; one child stream per group).
    rep : str or None
        Replicate-id column (``None``: rows are replicates).
    units : str or None
        Column of independent units spanning the n grid (see above); replicates inside a unit are only
        averaged.  Needs >= 5 units per group and every unit at every n.
    interval : {"t", "percentile"}
        Bootstrap interval: ``t`` (default) is ``exponent -/+ t_nu se`` (Satterthwaite ``nu`` over the cells
        for the replicate bootstrap, ``G - 1`` for units); ``percentile`` the percentile interval of the
        draws.
    resample : {None, "within_n", "rep"}
        Replicate bootstrap only (``None`` means ``within_n``).
    cluster : {"auto", "rep", None}
        Clustering for ``method="robust"``: ``auto`` clusters on ``rep`` when it has >= 10 ids.
    estimator : {"ols", "huber"}
        ``huber``: Huber M-estimate (statsmodels ``RLM``, ``HuberT(1.345)``, MAD scale) of the replicate-level
        line with the replicate bootstrap (refitting every draw by batched IRLS) or ``method="robust"`` (RLM
        sandwich SE, N - 2 df).  ``r2`` and ``aic`` are NaN; the model comparison uses the OLS fits.
    na : {"raise", "drop"}
        Rows whose ``y`` is NaN (e.g. failed fits): ``raise`` (default) or ``drop`` them with a
        :class:`RateWarning` giving the count, recorded in ``config["dropped_na"]``.
    min_decades, alpha_curvature, max_ci_width : float
        Thresholds of the verdict rule below (also ``min_decades`` is the minimum span of a window).
    knapp_hartung : {"standard", "modified"}
        Random effects: ``modified`` truncates the Knapp-Hartung factor at 1 (wider intervals).
    warn : bool
        Emit :class:`RateWarning` for fits spanning < 1 decade of n, with < 5 n values, or falling back.

    Returns
    -------
    RateResult
        ``table`` columns, after the estimate: ``verdict``; ``curvature_p`` (p-value of a centred
        ``(log n)^2`` term added to the fitted model, tested under the same variance model: Knapp-Hartung t
        for random effects, the bootstrap SE with its df for the bootstraps, robust SE for ``robust``; NaN
        with fewer than 4 n values); ``best_model`` (lowest AIC among ``power``, ``power_log`` and
        ``inverse_log``, all fitted by OLS to the same log responses even when one model was asked for) and
        ``delta_aic`` (this model's AIC minus the best); ``window_consistent`` and ``window_drift`` (the
        windows of ``RateResult.windows``: every window interval shares a point; the window exponent
        farthest from the full-range one minus it); ``tau2`` and ``shock_p`` (random effects).

    Notes
    -----
    The verdict, first rule that applies:

    1. ``"range too narrow"``: fewer than 3 n values or a span below ``min_decades`` decades;
    2. ``"no decay"``: ``ci_high <= 0`` (the error does not decrease), or the interval contains 0 and is
       narrower than ``max_ci_width`` (a flat profile, measured precisely enough to say so);
    3. ``"curved: exponent is local"``: ``curvature_p < alpha_curvature`` or window intervals
       inconsistent; the exponent then describes the fitted window of n only, not an asymptotic rate.
       ``best_model`` and ``delta_aic`` are reported but do not enter the verdict: over two or three decades
       the three rate models are nearly collinear in ``log n`` and ``delta_aic > 2`` fired on 21% of clean
       power laws (10 truth units, 5 n values over 2 decades) but only 8% of ``1/log n`` profiles;
    4. ``"imprecise"``: ``ci_high - ci_low > max_ci_width``;
    5. ``"power law"``: a straight line in the model's coordinates with a precise, stable exponent.

    The point estimate, ``intercept`` and interval follow the method; ``r2``, ``aic`` and ``bic`` are those
    of the ordinary least-squares fit to the log responses (replicate rows, or the per-n points for
    ``agg``), the basis of the model comparison.
    """
    return _fit_rate(frame, y, x=x, by=by, model=model, agg=agg, ci=confidence_level, method=method,
                     n_resamples=n_resamples, seed=seed, rep=rep, units=units, interval=interval, resample=resample,
                     cluster=cluster, estimator=estimator, na=na, min_decades=min_decades,
                     alpha_curvature=alpha_curvature, max_ci_width=max_ci_width, knapp_hartung=knapp_hartung, warn=warn,
                     window=("both", MIN_N_VALUES, min_decades))


def _check_threshold(name: str, value: Any, low: float, high: float = np.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not low <= value < high:
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}), got {value!r}.")
    return float(value)


def _fit_rate(frame: pd.DataFrame, y: str, *, x: str, by: Any, model: Any, agg: str | None, ci: float, method: str,
              n_resamples: int, seed: int | None, rep: str | None, units: str | None, interval: str,
              resample: str | None, cluster: str | None, estimator: str, na: str, min_decades: float,
              alpha_curvature: float, max_ci_width: float, knapp_hartung: str, warn: bool,
              window: tuple[str, int, float]) -> RateResult:
    _check_columns(frame, {"y": [y]})
    _check_choice("na", na, ("raise", "drop"))
    dropped_na = 0
    if na == "drop":
        bad = frame[y].isna()
        dropped_na = int(bad.sum())
        if dropped_na:
            frame = frame[~bad]
            if warn:
                warn_user(f"dropped {dropped_na} row(s) with NaN {y!r} (na='drop').", RateWarning)
    by_cols = _as_list("by", by)
    models = _check_models(model)
    _check_choice("agg", agg, _AGGS)
    level = _check_level(ci)
    _check_choice("method", method, _METHODS)
    _check_choice("interval", interval, _INTERVALS)
    _check_choice("resample", resample, _RESAMPLE)
    _check_choice("cluster", cluster, ("auto", "rep", None))
    _check_choice("estimator", estimator, ("ols", "huber"))
    _check_choice("knapp_hartung", knapp_hartung, _KNAPP_HARTUNG)
    thresholds = {"min_decades": _check_threshold("min_decades", min_decades, 0.0),
                  "alpha_curvature": _check_threshold("alpha_curvature", alpha_curvature, 0.0, 1.0),
                  "max_ci_width": _check_threshold("max_ci_width", max_ci_width, 0.0)}
    if units is not None and not isinstance(units, str):
        raise TypeError(f"units must be one column name (e.g. 'truth'), got {units!r}.")
    if estimator == "huber" and agg is not None:
        raise ValueError(f"estimator='huber' fits replicate-level rows; use agg=None (got agg={agg!r}), or "
                         "agg='median' for a robust per-n line.")
    kind = _resolve_method(method, units, estimator, resample, interval)
    resample = resample or "within_n"
    if kind != "robust":
        n_resamples = _check_nboot(n_resamples)
    if rep is not None and rep not in frame.columns and rep == "rep":
        rep = None  # default rep column absent: rows are the replicates
    groups = _prepare(frame, y, x, by_cols, rep, models, units)
    if kind == "cluster_bootstrap":
        for key, cells in groups.items():
            if resample == "within_n" and (cells.counts < 2).any():
                bad = cells.ns[cells.counts < 2]
                raise ValueError(f"{_key_text(key, by_cols)} has a single replicate at {x} = {bad.tolist()}; the "
                                 "cluster bootstrap resamples replicates within each n and needs >= 2. Use "
                                 "method='random_effects' (default) or 'robust', or add replicates.")
            if resample == "rep" and len(cells.reps[0]) < 2:
                raise ValueError(f"{_key_text(key, by_cols)} has one replicate id; resample='rep' needs >= 2.")
    drop, min_values, min_span = window
    window_draws = min(n_resamples, 400) if estimator == "huber" else None
    seqs = np.random.SeedSequence(seed).spawn(len(groups))
    rows, wrows, draws, var = [], [], {}, {}
    for (key, cells), ss in zip(groups.items(), seqs, strict=True):
        text = _key_text(key, by_cols)
        cluster_on = None
        if kind == "robust" and agg is None and rep is not None and units is None:
            n_ids = len(np.unique(np.concatenate(cells.reps)))
            cluster_on = "rep" if cluster == "rep" or (cluster == "auto" and n_ids >= MIN_CLUSTERS) else None
        rng = np.random.default_rng(ss)
        msgs: list[str] = []
        decades = float(np.log10(cells.ns.max() / cells.ns.min()))
        if decades < 1:
            msgs.append(f"{text}: the {x} range [{cells.ns.min():g}, {cells.ns.max():g}] spans "
                        f"{decades:.2f} < 1 decade; exponents over such ranges are mostly curvature, not rate.")
        if len(cells.ns) < RECOMMENDED_N_VALUES:
            msgs.append(f"{text}: only {len(cells.ns)} distinct {x} values; use >= "
                        f"{RECOMMENDED_N_VALUES} to check curvature and window sensitivity.")
        eng = _build_engine(cells, kind, agg, n_resamples=n_resamples, rng=rng, resample=resample, estimator=estimator,
                            cluster_on=cluster_on, rep=rep, units=units, truncate=knapp_hartung == "modified",
                            key_text=text, msgs=msgs)
        wins = _windows(cells.ns, drop, min_values, min_span)
        group_rows, group_wrows, pieces = _fit_group(eng, models, level=level, interval=interval,
                                                     estimator=estimator, windows=wins, thresholds=thresholds,
                                                     window_draws=window_draws)
        keyd = dict(zip(by_cols, key, strict=True))
        for r in group_rows:
            if kind == "cluster_bootstrap" and agg is not None and interval == "percentile":
                d = pieces[r["model"]]["draws"]
                lo, hi = np.quantile(d, [(1 - level) / 2, (1 + level) / 2])
                if not lo <= r["exponent"] <= hi:
                    msgs.append(f"{text}, {r['model']}: the point estimate lies outside its percentile "
                                f"interval (log of a per-n {agg} of skewed values is biased); prefer agg=None.")
        for r in group_rows:
            r["warnings"] = " | ".join(dict.fromkeys(msgs))
            rows.append({**keyd, **r})
            p = pieces[r["model"]]
            if p["draws"] is not None:
                draws[(key, r["model"])] = p["draws"]
            var[(key, r["model"])] = {**p, "engine": eng}
        wrows += [{**keyd, **w} for w in group_wrows]
        if warn:
            for msg in dict.fromkeys(msgs):
                warn_user(msg, RateWarning)
    details = pd.DataFrame(rows)
    details["window_consistent"] = details["window_consistent"].astype("boolean")
    order = [*by_cols, *TABLE_COLUMNS]
    extra = [c for c in details.columns if c not in order]
    details = details[order + extra]
    wcols = [*by_cols, "model", "side", "dropped", "x_min", "x_max", "n_values", "span", "exponent", "se", "ci_low",
             "ci_high", "r2"]
    windows_tab = pd.DataFrame(wrows, columns=wcols)
    keep = [*by_cols, x, *([units] if units else []), *([rep] if rep else []), y]
    boot = kind in ("cluster_bootstrap", "unit_bootstrap")
    config = {"y": y, "x": x, "by": by_cols, "rep": rep, "units": units, "models": models, "agg": agg, "ci": level,
              "method": kind, "method_requested": method, "interval": interval if boot else "t",
              "n_resamples": n_resamples if kind != "robust" else None, "seed": seed,
              "resample": resample if kind == "cluster_bootstrap" else None,
              "cluster": cluster if kind == "robust" else None, "estimator": estimator,
              "knapp_hartung": knapp_hartung, **thresholds, "na": na, "dropped_na": dropped_na,
              "window": {"drop": drop, "min_values": min_values, "min_span": min_span}}
    return RateResult(table=details[order].copy(), details=details, data=frame[keep].copy(), config=config,
                      windows=windows_tab, draws=draws, _var=var)


# --------------------------------------------------------------------------------------------------
# tests on exponents


@validate_arguments(value=Real(), alternative=Choice("two-sided", "greater", "less"))
def test_exponent(result: RateResult, value: float, *, model: str | None = None,
                  alternative: str = "two-sided") -> pd.DataFrame:
    """Test H0: alpha = ``value`` for every group x model of a :class:`RateResult`.

    The statistic is ``t = (alpha_hat - value) / se`` referred to a t distribution with the result's
    degrees of freedom (``m - 2`` for random effects, ``G - 1`` for the unit bootstrap, Satterthwaite for the
    replicate bootstrap, G-1 or residual df for robust fits).  The test inherits the fit's verdict: for a
    ``"curved: exponent is local"`` row it tests the local slope of the fitted window, not a rate.
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



def _compare_verdict(a: Any, b: Any, verdict_a: str, verdict_b: str, lo: float, hi: float, est: float) -> str:
    """Verdict of one comparison row: whether the two exponents can be told apart, and which is faster."""
    if "range too narrow" in (verdict_a, verdict_b):
        return "cannot discriminate: range too narrow"
    curved = [str(lv) for lv, v in ((a, verdict_a), (b, verdict_b)) if v == "curved: exponent is local"]
    if curved:
        return f"cannot discriminate: {' and '.join(curved)} curved"
    if not np.isfinite(lo) or not np.isfinite(hi) or lo <= 0 <= hi:
        return "cannot discriminate: interval includes 0"
    return f"{a if est > 0 else b} faster"


@keyword_only_options
@renamed_arguments(n_boot="n_resamples", ci="confidence_level")
@validate_arguments(confidence_level=Real(0, 1, open_low=True, open_high=True), n_resamples=Integer(100),
                    seed=Seed(), paired=Boolean(), min_decades=Real(0),
                    alpha_curvature=Real(0, 1, open_low=True, open_high=True), max_ci_width=Real(0, open_low=True))
def compare_rates(frame: pd.DataFrame, y: str, between: str = "gate", *, by: str | Sequence[str] | None = None,
                  x: str = "n", model: str = "power", agg: str | None = None, confidence_level: float = 0.95,
                  method: str = "auto", n_resamples: int = 2000, seed: int | None = 0, rep: str | None = "rep",
                  units: str | None = None, levels: Sequence[Any] | None = None, cluster: str | None = "auto",
                  paired: bool = False, na: str = "raise", min_decades: float = 1.0, alpha_curvature: float = 0.05,
                  max_ci_width: float = 0.3, knapp_hartung: str = "standard") -> pd.DataFrame:
    """Difference of convergence exponents between two levels of ``between``, with CI, p-value and a verdict.

    For every ``by`` group and every pair ``(a, b)`` of levels (or the given ``levels``), estimate
    ``difference = alpha_a - alpha_b`` (positive: ``a`` converges faster).  ``method``:

    * ``auto`` (default): ``unit_bootstrap`` with ``units``, else ``random_effects`` (the variance models
      of :func:`fit_rate`).
    * ``random_effects``: each level's random-effects meta-regression (:func:`fit_rate`);
      ``se = sqrt(se_a^2 + se_b^2)`` with Welch-Satterthwaite degrees of freedom
      ``(se_a^2 + se_b^2)^2 / (se_a^4 / (m_a - 2) + se_b^4 / (m_b - 2))``.
    * ``unit_bootstrap``: independent unit bootstraps of the two levels; ``se`` is the SD of
      ``alpha*_a - alpha*_b``, Welch-Satterthwaite df from ``G_a - 1`` and ``G_b - 1``.
    * ``interaction``: one OLS ``log y = c + g_a c_a - (alpha_b + g_a delta) u(n)`` on both groups'
      replicate-level rows (``g_a`` indicates level ``a``); ``difference = delta``; cluster-robust
      covariance on ``units`` if given, else on ``rep`` (>= 10 ids), else HC3; t reference.
    * ``bootstrap``: replicates resampled within each n and group (the replicate bootstrap of
      :func:`fit_rate`); CI ``difference -/+ t_nu se`` with Satterthwaite ``nu`` over every cell of both
      groups.  ``both``: ``interaction`` and ``bootstrap`` rows.

    ``paired=True`` is for two fits of the *same* data sets (sigmoid and softmax fitted to replicate r at
    each n, matching ``rep`` ids; or the same units): the positive correlation of the two errors then narrows
    the interval instead of being ignored.  ``paired_random_effects`` fits the random-effects meta-regression
    to the per-n mean of the paired differences ``log y_a - log y_b`` (its own within variances and tau^2);
    ``exponent_a`` and ``exponent_b`` are the slopes of each level's per-n means with the same weights, so
    ``difference = exponent_a - exponent_b``.  ``paired_unit_bootstrap`` draws one set of units and uses it
    for both levels (t on G - 1 df).  ``paired_bootstrap`` draws one set of replicate ids per n for both.

    The ``verdict`` column, first rule that applies: ``"cannot discriminate: range too narrow"`` (either
    level's own :func:`fit_rate` verdict is ``"range too narrow"``); ``"cannot discriminate: <level>
    curved"`` (a level's verdict is ``"curved: exponent is local"``: its exponent is a local slope, so a
    difference of exponents depends on the window); ``"cannot discriminate: interval includes 0"``;
    ``"<a> faster"`` or ``"<b> faster"`` (the sign of the difference; level names substituted).  Levels
    with an ``"imprecise"`` or ``"no decay"`` verdict still compare: their uncertainty is in the
    difference's interval.  ``na="drop"`` drops rows whose ``y`` is NaN first (default: raise).

    Returns
    -------
    DataFrame
        ``by`` columns, ``between, level_a, level_b, model, method, exponent_a, exponent_b, difference,
        se, df, ci_low, ci_high, p_value, verdict_a, verdict_b, verdict``.
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
    _check_choice("method", method, ("auto", "random_effects", "unit_bootstrap", "bootstrap", "interaction", "both"))
    level = _check_level(confidence_level)
    if method == "auto":
        method = "unit_bootstrap" if units is not None else "random_effects"
    row_methods = ["interaction", "bootstrap"] if method == "both" else [method]
    fit_method = {"random_effects": "random_effects", "unit_bootstrap": "unit_bootstrap",
                  "bootstrap": "cluster_bootstrap", "interaction": "robust"}[row_methods[-1]]
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
    res = _fit_rate(frame, y, x=x, by=[*by_cols, between], model=model, agg=agg, ci=level, method=fit_method,
                    n_resamples=n_resamples, seed=seed, rep=rep, units=units, interval="t", resample=None,
                    cluster=cluster, estimator="ols", na="raise", min_decades=min_decades,
                    alpha_curvature=alpha_curvature, max_ci_width=max_ci_width, knapp_hartung=knapp_hartung, warn=False,
                    window=("both", MIN_N_VALUES, min_decades))
    keys = list(zip(*(res.details[c] for c in [*by_cols, between]), strict=True))
    expo = dict(zip(keys, res.details["exponent"].astype(float), strict=True))
    verdicts = dict(zip(keys, res.details["verdict"], strict=True))
    truncate = knapp_hartung == "modified"
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
            for rm in row_methods:
                va, vb = res._var[(ka, model)], res._var[(kb, model)]
                if rm == "interaction":
                    out = _interaction(sub, y, x, between, a, b, model, agg, rep, cluster, level, units)
                    name = "interaction"
                elif rm == "bootstrap":
                    if paired:
                        pseed = np.random.SeedSequence([0 if seed is None else seed, len(rows), 7])
                        diff, terms, dfs = _paired_boot(sub, y, x, rep, between, a, b, model, agg, n_resamples,
                                                        np.random.default_rng(pseed))
                    else:
                        diff = va["draws"] - vb["draws"]
                        terms = np.concatenate([va["terms"], vb["terms"]])
                        dfs = np.concatenate([va["dfs"], vb["dfs"]])
                    out = {"exponent_a": ea, "exponent_b": eb, "difference": ea - eb,
                           "se": float(diff.std(ddof=1)), "df": _satterthwaite(terms, dfs)}
                    name = "paired_bootstrap" if paired else "bootstrap"
                elif rm == "random_effects":
                    if paired:
                        out = _paired_re(sub, y, x, rep, between, a, b, model, agg, truncate)
                    else:
                        out = {"exponent_a": ea, "exponent_b": eb, "difference": ea - eb,
                               "se": float(np.hypot(va["se"], vb["se"])),
                               "df": _welch_df(va["se"], va["df"], vb["se"], vb["df"])}
                    name = "paired_random_effects" if paired else "random_effects"
                else:  # unit_bootstrap
                    if paired:
                        pseed = np.random.SeedSequence([0 if seed is None else seed, len(rows), 11])
                        diff, df = _paired_units(va["engine"], vb["engine"], model, n_resamples, units, a, b,
                                                 np.random.default_rng(pseed))
                    else:
                        diff = va["draws"] - vb["draws"]
                        df = _welch_df(va["se"], va["df"], vb["se"], vb["df"])
                    out = {"exponent_a": ea, "exponent_b": eb, "difference": ea - eb,
                           "se": float(diff.std(ddof=1)), "df": df}
                    name = "paired_unit_bootstrap" if paired else "unit_bootstrap"
                if "ci_low" not in out:
                    out["ci_low"], out["ci_high"] = _interval(out["difference"], out["se"], out["df"], None, level,
                                                              "t")
                    est, se = out["difference"], out["se"]
                    out["p_value"] = float(2 * stats.t.sf(abs(est) / se, out["df"])) if se > 0 else float(est == 0)
                verdict = _compare_verdict(a, b, verdicts[ka], verdicts[kb], out["ci_low"], out["ci_high"],
                                           out["difference"])
                rows.append({**base, "method": name, **out, "verdict_a": verdicts[ka], "verdict_b": verdicts[kb],
                             "verdict": verdict})
    if not rows:
        raise ValueError(f"no by-group has both levels of {between!r} to compare.")
    cols = [*by_cols, "between", "level_a", "level_b", "model", "method", "exponent_a", "exponent_b", "difference",
            "se", "df", "ci_low", "ci_high", "p_value", "verdict_a", "verdict_b", "verdict"]
    return pd.DataFrame(rows)[cols]


def _paired_cells(sub: pd.DataFrame, y: str, x: str, rep: str | None, between: str, a: Any,
                  b: Any) -> tuple[_Cells, _Cells]:
    """The two levels' cells, checked to hold the same n values and replicate ids (rows aligned by rep)."""
    if rep is None:
        raise ValueError("paired=True needs a replicate-id column (rep=) that matches rows of the two groups.")
    ca = _cells(sub[sub[between] == a], x, y, rep)
    cb = _cells(sub[sub[between] == b], x, y, rep)
    if not np.array_equal(ca.ns, cb.ns) or any(not np.array_equal(ra, rb) for ra, rb in zip(ca.reps, cb.reps,
                                                                                         strict=True)):
        raise ValueError(f"paired=True needs the same {x} values and the same {rep!r} ids in levels {a!r} and "
                         f"{b!r} (two fits of the same data sets); use paired=False otherwise.")
    return ca, cb


def _paired_boot(sub: pd.DataFrame, y: str, x: str, rep: str | None, between: str, a: Any, b: Any, model: str,
                 agg: str | None, n_resamples: int, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bootstrap of alpha_a - alpha_b drawing the same replicate ids for both groups at each n."""
    ca, cb = _paired_cells(sub, y, x, rep, between, a, b)
    u = regressor(model, ca.ns)
    w = ca.counts.astype(np.float64) if agg is None else np.ones(len(ca.ns))
    wn = w / w.sum()
    du = u - (wn * u).sum()
    c = wn * du / (wn * du * du).sum()
    contrib = np.empty((n_resamples, len(ca.ns)))
    for i, (va, vb) in enumerate(zip(ca.values, cb.values, strict=True)):
        r = len(va)
        idx = rng.integers(0, r, size=(n_resamples, r))
        za0, zb0 = _cell_stat(va, agg), _cell_stat(vb, agg)
        za = rao_wu(za0, _cell_stat(va[idx], agg), r)
        zb = rao_wu(zb0, _cell_stat(vb[idx], agg), r)
        contrib[:, i] = -c[i] * (za - zb)  # exponent = -slope
    return contrib.sum(axis=1), contrib.var(axis=0, ddof=1), ca.counts - 1.0


def _paired_re(sub: pd.DataFrame, y: str, x: str, rep: str | None, between: str, a: Any, b: Any, model: str,
               agg: str | None, truncate: bool) -> dict[str, float]:
    """Random-effects meta-regression of the per-n mean paired difference d_n = mean_r (log y_a - log y_b)."""
    if agg not in (None, "logmean"):
        raise ValueError(f"paired=True with method='random_effects' pairs replicate logs; use agg=None or 'logmean' "
                         f"(got agg={agg!r}), or method='bootstrap'.")
    ca, cb = _paired_cells(sub, y, x, rep, between, a, b)
    m = len(ca.ns)
    X = np.column_stack([np.ones(m), regressor(model, ca.ns)])
    za = np.array([np.log(v).mean() for v in ca.values])
    zb = np.array([np.log(v).mean() for v in cb.values])
    diffs = [np.log(va) - np.log(vb) for va, vb in zip(ca.values, cb.values, strict=True)]
    counts = ca.counts
    s2 = np.array([d.var(ddof=1) if len(d) > 1 else np.nan for d in diffs])
    if (counts < 2).any() or not (s2 > 0).all():
        meta = _re_metareg(X, za - zb, None)
        w = np.ones(m)
    else:
        d = counts - 1.0
        mod, d0, _ = _moderate_variances(s2, d)
        v = mod / counts
        meta = _re_metareg(X, za - zb, v, float(np.mean(np.minimum(d0 + d, d.sum()))), truncate)
        w = 1.0 / (v + meta.tau2)
    h = _wls_coefs(X, w)
    return {"exponent_a": -float((h @ za)[1]), "exponent_b": -float((h @ zb)[1]), "difference": -float(meta.beta[1]),
            "se": float(np.sqrt(meta.cov[1, 1])), "df": meta.df}


def _paired_units(ea: _Engine, eb: _Engine, model: str, n_resamples: int, units: str | None, a: Any, b: Any,
                  rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Draws of alpha*_a - alpha*_b resampling the same units for both levels (t on G - 1 df)."""
    if not (np.array_equal(ea.cells.ns, eb.cells.ns) and np.array_equal(ea.unit_ids, eb.unit_ids)):
        raise ValueError(f"paired=True with units needs the same n values and the same {units!r} ids in levels "
                         f"{a!r} and {b!r}; use paired=False otherwise.")
    g = len(ea.unit_ids)
    counts = _unit_counts(n_resamples, g, rng)
    X = np.column_stack([np.ones(len(ea.cells.ns)), regressor(model, ea.cells.ns)])
    h = _wls_coefs(X, np.ones(len(ea.cells.ns)))
    dz = ea.unit_z - eb.unit_z
    zbar = dz.mean(axis=0)
    zb = rao_wu(zbar, counts @ dz / g, g)
    return -(zb @ h[1]), float(g - 1)


def _interaction(sub: pd.DataFrame, y: str, x: str, between: str, a: Any, b: Any, model: str, agg: str | None,
                 rep: str | None, cluster: str | None, level: float, units: str | None = None) -> dict[str, float]:
    sub = sub[sub[between].isin([a, b])]
    if agg is None:
        endog = np.log(sub[y].to_numpy(dtype=np.float64))
        u = regressor(model, sub[x].to_numpy(dtype=np.float64))
        ga = (sub[between] == a).to_numpy(dtype=np.float64)
        reps = sub[units].to_numpy() if units else sub[rep].to_numpy() if rep else None
    else:
        cells = sub.groupby([between, x], sort=True)[y].apply(lambda v: float(_cell_stat(v.to_numpy(float), agg)))
        cells = cells.reset_index()
        endog = cells[y].to_numpy(dtype=np.float64)
        u = regressor(model, cells[x].to_numpy(dtype=np.float64))
        ga = (cells[between] == a).to_numpy(dtype=np.float64)
        reps = None
    exog = np.column_stack([np.ones_like(u), ga, u, ga * u])
    eff = None
    if reps is not None and (units is not None or cluster == "rep"
                             or (cluster == "auto" and len(np.unique(reps)) >= MIN_CLUSTERS)):
        eff = "rep"
    cov_type, kwds = _robust_cov(reps, eff)
    fit = OLS(endog, exog).fit(cov_type=cov_type, cov_kwds=kwds or None, use_t=True)
    diff = -float(fit.params[3])
    se = float(fit.bse[3])
    df = float(getattr(fit, "df_resid_inference", None) or fit.df_resid)
    lo, hi = _interval(diff, se, df, None, level, "t")
    return {"exponent_a": -float(fit.params[2] + fit.params[3]), "exponent_b": -float(fit.params[2]),
            "difference": diff, "se": se, "df": df, "ci_low": lo, "ci_high": hi, "p_value": float(fit.pvalues[3])}


# --------------------------------------------------------------------------------------------------
# diagnostics


@keyword_only_options
@validate_arguments(agg=Optional(Choice(*(a for a in _AGGS if a is not None))))
def compare_models(frame: pd.DataFrame, y: str, *, x: str = "n", by: str | Sequence[str] | None = None,
                   models: Sequence[str] = tuple(RATE_MODELS), agg: str | None = None,
                   rep: str | None = "rep") -> pd.DataFrame:
    """Curvature check: AIC comparison of the rate models on the same response ``log y``.

    All models have two coefficients and the same response, so ``delta_aic`` (to the best of ``models``) is
    a likelihood-ratio comparison of non-nested fits.  Akaike weights ``exp(-delta/2) / sum exp(-delta/2)``
    are reported, with ``curvature_p``, the robust p-value of a centred ``(log n)^2`` term added to each
    model (small: the curve bends in that model's coordinates, so a single exponent over this range is
    questionable).

    Returns
    -------
    DataFrame
        ``by`` columns, ``model, exponent, aic, delta_aic, akaike_weight, r2, best, curvature, curvature_p``.
    """
    res = fit_rate(frame, y, x=x, by=by, model=list(models), agg=agg, method="robust", rep=rep, warn=False)
    d = res.details.copy()
    by_cols = res.config["by"]
    grouped = d.groupby([d[c] for c in by_cols]) if by_cols else None
    d["delta_aic"] = d["aic"] - (grouped["aic"].transform("min") if by_cols else d["aic"].min())
    rel = np.exp(-0.5 * d["delta_aic"])
    d["akaike_weight"] = rel / (rel.groupby([d[c] for c in by_cols]).transform("sum") if by_cols else rel.sum())
    d["best"] = d["delta_aic"] == 0
    return d[[*by_cols, "model", "exponent", "aic", "delta_aic", "akaike_weight", "r2", "best", "curvature",
              "curvature_p"]].reset_index(drop=True)


@dataclass
class WindowSensitivity(Result):
    """Result of :func:`window_sensitivity`: ``table`` (one row per group x window), ``plot()`` and the
    :class:`moestat.report.Result` views (:meth:`tidy`: the windows; :meth:`glance`: one row per group)."""

    table: pd.DataFrame
    config: dict[str, Any]

    def plot(self, ax: Any = None, **kwargs: Any) -> Any:
        """Exponent and CI against the dropped end of the n range; see :func:`moestat.rates.plots.plot_window`."""
        from .plots import plot_window

        return plot_window(self, ax=ax, **kwargs)

    def to_frame(self) -> pd.DataFrame:
        return self.table.copy()

    def tidy(self) -> pd.DataFrame:
        """One row per group x window: ``table`` with the exponent as ``estimate, std_error, conf_low, conf_high``."""
        return self.table.rename(columns={"exponent": "estimate", "se": "std_error", "ci_low": "conf_low",
                                          "ci_high": "conf_high"}).reset_index(drop=True)

    def summary(self) -> Summary:
        """Printable: :meth:`glance` (one row per group) under the settings."""
        by = self.config["by"]
        header = {k: self.config[k] for k in ("y", "model", "drop") if k in self.config}
        g = self.glance()
        return Summary(header, g.set_index([*by, "model"]) if len(g) else g, pd.DataFrame(),
                       ["consistent: every window's CI shares a point; drift: farthest window minus the full range"],
                       title="Window sensitivity of the rate exponent")

    def glance(self) -> pd.DataFrame:
        """One row per group: the range of window exponents, whether all window CIs share a point, the drift.

        ``consistent`` is ``max(ci_low) <= min(ci_high)`` over the windows: False means no single exponent is
        compatible with every window (the signature of pre-asymptotic curvature).  ``drift`` is the window
        exponent farthest from the full-range exponent minus the full-range exponent (signed);
        ``drift_drop_smallest`` / ``drift_drop_largest`` are the most-trimmed window of each side minus the
        full-range exponent.  ``full`` and the drifts are NaN when the full range is not a window (it spans
        less than ``min_span`` decades).
        """
        by = self.config["by"]
        cols = [*by, "model", "full", "min", "max", "windows", "consistent", "drift", "drift_drop_smallest",
                "drift_drop_largest"]
        groups = self.table.groupby(by, sort=True) if by else ([((), self.table)] if len(self.table) else [])
        rows = []
        for key, sub in groups:
            key = _group_key(key, by)
            full_rows = sub[sub["side"] == "full"]["exponent"]
            full = float(full_rows.iloc[0]) if len(full_rows) else np.nan
            consistent, drift = _window_summary(sub["exponent"].to_numpy(), sub["ci_low"].to_numpy(),
                                                sub["ci_high"].to_numpy(), full)
            row = {**dict(zip(by, key, strict=True)), "model": self.config["model"], "full": full,
                   "min": sub["exponent"].min(), "max": sub["exponent"].max(), "windows": len(sub),
                   "consistent": consistent, "drift": drift}
            for side in ("smallest", "largest"):
                part = sub[sub["side"] == side]
                row[f"drift_drop_{side}"] = (part.sort_values("dropped")["exponent"].iloc[-1] - full
                                             if len(part) else np.nan)
            rows.append(row)
        return pd.DataFrame(rows, columns=cols)


_WINDOW_FIT_KWARGS = {"units": None, "interval": "t", "resample": None, "cluster": "auto", "estimator": "ols",
                      "na": "raise", "knapp_hartung": "standard"}


@keyword_only_options
@renamed_arguments(n_boot="n_resamples", ci="confidence_level")
@validate_arguments(confidence_level=Real(0, 1, open_low=True, open_high=True), n_resamples=Integer(100),
                    seed=Seed(), drop=Choice("both", "smallest", "largest"), min_values=Integer(3), min_span=Real(0))
def window_sensitivity(frame: pd.DataFrame, y: str, *, x: str = "n", by: str | Sequence[str] | None = None,
                       model: str = "power", agg: str | None = None, confidence_level: float = 0.95,
                       method: str = "auto", n_resamples: int = 1000, seed: int | None = 0,
                       rep: str | None = "rep", drop: str = "both", min_values: int = MIN_N_VALUES,
                       min_span: float = 1.0, **kwargs: Any) -> WindowSensitivity:
    """Exponent as the smallest (``drop="smallest"``) and/or largest (``"largest"``) n values are dropped.

    A genuine asymptotic rate gives a flat profile whose CIs overlap; pre-asymptotic curvature gives a
    drift as n_min grows.  Only windows with at least ``min_values`` n values spanning at least
    ``min_span`` decades of n are fitted (a slope over a fraction of a decade is mostly curvature and noise);
    each window is fitted with the same method as :func:`fit_rate` (``method``, ``units`` and the other
    keyword arguments of :func:`fit_rate` are accepted; bootstrap windows reuse the full fit's draws of the
    cells they keep).

    Returns
    -------
    WindowSensitivity
        ``table`` columns: ``by`` columns, ``side`` (full / smallest / largest), ``dropped``, ``x_min``,
        ``x_max``, ``n_values``, ``span`` (decades), ``model, exponent, se, ci_low, ci_high, r2``.
    """
    _check_choice("drop", drop, ("both", "smallest", "largest"))
    if not isinstance(model, str) or model == "all":
        raise TypeError("window_sensitivity profiles one model at a time; pass model as a single name.")
    if isinstance(min_values, bool) or not isinstance(min_values, numbers.Integral) or min_values < MIN_N_VALUES:
        raise ValueError(f"min_values must be an integer >= {MIN_N_VALUES}, got {min_values!r}.")
    span = _check_threshold("min_span", min_span, 0.0)
    unknown = set(kwargs) - set(_WINDOW_FIT_KWARGS) - {"min_decades", "alpha_curvature", "max_ci_width"}
    if unknown:
        raise TypeError(f"window_sensitivity got unexpected keyword argument(s) {sorted(unknown)}; it accepts "
                        f"{sorted(_WINDOW_FIT_KWARGS)}.")
    fit_kw = {**_WINDOW_FIT_KWARGS, "min_decades": 1.0, "alpha_curvature": 0.05, "max_ci_width": 0.3, **kwargs}
    by_cols = _as_list("by", by)
    res = _fit_rate(frame, y, x=x, by=by_cols, model=model, agg=agg, ci=confidence_level, method=method,
                    n_resamples=n_resamples, seed=seed, rep=rep, warn=False, window=(drop, int(min_values), span),
                    **fit_kw)
    cols = [*by_cols, "side", "dropped", "x_min", "x_max", "n_values", "span", "model", "exponent", "se", "ci_low",
            "ci_high", "r2"]
    config = {"y": y, "x": x, "by": by_cols, "model": model, "agg": agg, "ci": confidence_level,
              "method": res.config["method"],
              "n_resamples": n_resamples, "seed": seed, "drop": drop, "min_values": int(min_values), "min_span": span}
    return WindowSensitivity(res.windows[cols].reset_index(drop=True), config)


# --------------------------------------------------------------------------------------------------
# synthetic frames (design checks and tests)


def simulate_rate_frame(alpha: float, ns: Sequence[float], reps: int, *, model: str = "power", studies: int = 1,
                        sigma: float | Sequence[float] = 0.5, scale: float = 2.0, noise: str = "lognormal",
                        shape: float = 1.0, seed: int | None = 0, cell_sd: float = 0.0, rep_sd: float = 0.0,
                        units: int | None = None, unit_sd: float = 0.5,
                        unit_slope_sd: float = 0.0) -> pd.DataFrame:
    r"""Synthetic tidy rate frame ``y = scale * exp(-alpha u(n)) * noise``, with optional shared effects.

    ``u`` is the regressor of ``model`` (``power``: ``y = scale n^-alpha`` times noise).  On the log scale
    the row of study s, unit g, sample size n and replicate r is

    $$
    \log y = \log(\mathrm{scale}) + a_g - (\alpha + d_g) u(n) + c_{g,n} + b_{g,r} + \varepsilon,
    $$

    * ``noise="lognormal"``: ``eps = sigma z``, ``z ~ N(0, 1)`` (``sigma`` one value or one per n, for a
      replicate spread that changes with n); ``noise="gamma"``: ``exp(eps) = G / shape``,
      ``G ~ Gamma(shape)`` (mean 1; ``shape = 1`` is exponential, like a squared error with 2 degrees of
      freedom, left-skewed on the log scale).
    * ``c ~ N(0, cell_sd^2)``: a shock shared by every replicate of an n cell (one true model, one Monte
      Carlo sample or one limit estimate per cell).
    * ``b ~ N(0, rep_sd^2)``: a replicate effect shared across n (nested replicates: replicate r at larger n
      reuses the data of replicate r at smaller n).
    * ``units=T`` draws T independent units per study (e.g. truth draws), each with its own intercept
      ``a_g ~ N(0, unit_sd^2)``, its own cell shocks and replicate effects, and an exponent deviation
      ``d_g ~ N(0, unit_slope_sd^2)``; the estimand is then the mean exponent ``alpha`` over units.
      Without ``units`` there is one unit and ``a = d = 0``.

    In every case the noise law is the same at every n up to ``sigma``, so the slope of ``log y`` is exactly
    ``-alpha`` in expectation.  Use it (or :func:`calibrate_design`) to check before running a study whether
    a planned n grid and replicate count give honest, informative intervals.

    Returns
    -------
    DataFrame
        Columns ``study, n, rep, y``, with ``unit`` after ``study`` when ``units`` is given (one row per
        study x unit x n x replicate; replicate ids are unique within a study).
    """
    _check_choice("noise", noise, ("lognormal", "gamma"))
    for name, val in (("cell_sd", cell_sd), ("rep_sd", rep_sd), ("unit_sd", unit_sd),
                      ("unit_slope_sd", unit_slope_sd)):
        _check_threshold(name, val, 0.0)
    if units is not None and (isinstance(units, bool) or not isinstance(units, numbers.Integral) or units < 1):
        raise ValueError(f"units must be a positive number of units per study (or None), got {units!r}.")
    ns = np.asarray(ns, dtype=np.float64)
    reps = int(reps)
    m = len(ns)
    t = 1 if units is None else int(units)
    sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64), ns.shape)
    rng = np.random.default_rng(seed)
    n = np.tile(np.repeat(ns, reps), studies * t)
    u = regressor(model, n)
    mean_log = np.log(scale) - alpha * u
    if noise == "lognormal":
        log_noise = np.tile(np.repeat(sig, reps), studies * t) * rng.standard_normal(len(n))
    else:
        log_noise = np.log(rng.gamma(shape, 1.0 / shape, size=len(n)))
    per_unit = m * reps
    unit_idx = np.repeat(np.arange(studies * t), per_unit)          # study-and-unit index of each row
    n_idx = np.tile(np.repeat(np.arange(m), reps), studies * t)
    rep_idx = np.tile(np.arange(reps), studies * t * m)
    if cell_sd > 0:
        log_noise = log_noise + cell_sd * rng.standard_normal((studies * t, m))[unit_idx, n_idx]
    if rep_sd > 0:
        log_noise = log_noise + rep_sd * rng.standard_normal((studies * t, reps))[unit_idx, rep_idx]
    cols: dict[str, Any] = {"study": np.repeat(np.arange(studies), t * per_unit)}
    if units is not None:
        a_g = unit_sd * rng.standard_normal(studies * t)
        d_g = unit_slope_sd * rng.standard_normal(studies * t)
        mean_log = mean_log + a_g[unit_idx] - d_g[unit_idx] * u
        cols["unit"] = np.tile(np.repeat(np.arange(t), per_unit), studies)
    # replicate ids are unique within a study (unit g holds g * reps ... g * reps + reps - 1), so the frame is a
    # valid rate frame with or without units=
    rep_id = rep_idx + reps * (unit_idx % t)
    cols.update(n=n, rep=rep_id, y=np.exp(mean_log + log_noise))
    return pd.DataFrame(cols)


@validate_arguments(alpha=Real(), reps=Integer(1), studies=Integer(1), model=Choice(*RATE_MODELS),
                    noise=Choice("lognormal", "gamma"), shape=Real(0, open_low=True), seed=Optional(Integer(0)),
                    cell_sd=Real(0), rep_sd=Real(0), units=Optional(Integer(1)), unit_sd=Real(0),
                    unit_slope_sd=Real(0), resample_units=Boolean())
def calibrate_design(alpha: float, ns: Sequence[float], reps: int, *, studies: int = 1000,
                     sigma: float | Sequence[float] = 0.5, model: str = "power", noise: str = "lognormal",
                     shape: float = 1.0, seed: int | None = 0, cell_sd: float = 0.0, rep_sd: float = 0.0,
                     units: int | None = None, unit_sd: float = 0.5, unit_slope_sd: float = 0.0,
                     resample_units: bool = True, **fit_kwargs: Any) -> pd.DataFrame:
    """Monte Carlo check of :func:`fit_rate` on a design: bias, empirical SE and CI coverage with MC SEs.

    Simulates ``studies`` frames from :func:`simulate_rate_frame` (true exponent ``alpha`` under ``model``;
    ``sigma``, ``noise``, ``shape``, ``cell_sd``, ``rep_sd``, ``units``, ``unit_sd`` and ``unit_slope_sd``
    as there), fits each with ``fit_rate(..., model=model, **fit_kwargs)`` (with ``units="unit"`` when
    ``units`` is given and ``resample_units`` is true; ``resample_units=False`` fits the same frames ignoring
    the units, to see what that costs) and summarises them the way ``rsimsum`` does:
    ``bias`` with ``bias_mcse = emp_se / sqrt(S)``, ``emp_se`` (SD of the estimates), ``mean_se``
    (average reported SE), ``coverage`` of the nominal interval with
    ``coverage_mcse = sqrt(coverage (1 - coverage) / S)``, ``mean_width`` of the interval, and the share of
    studies whose verdict is ``"power law"`` (``power_law_share``) or ``"curved: exponent is local"``
    (``curved_share``).

    Returns
    -------
    DataFrame
        One row: the design (``alpha, model, n_values, n_min, n_max, reps, noise, sigma, cell_sd, rep_sd,
        units, unit_slope_sd, studies``), the fit settings (``method`` actually used, ``agg, interval, ci,
        n_resamples``) and the summaries above.
    """
    frame = simulate_rate_frame(alpha, ns, reps, model=model, studies=studies, sigma=sigma, noise=noise, shape=shape,
                                seed=seed, cell_sd=cell_sd, rep_sd=rep_sd, units=units, unit_sd=unit_sd,
                                unit_slope_sd=unit_slope_sd)
    fit_kwargs.setdefault("warn", False)
    if units is not None and resample_units:
        fit_kwargs["units"] = "unit"
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
        "cell_sd": cell_sd, "rep_sd": rep_sd, "units": units if units is not None else 0,
        "unit_slope_sd": unit_slope_sd,
        "studies": s, "method": cfg["method"], "agg": cfg["agg"] or "none",
        "interval": cfg["interval"], "ci": cfg["ci"], "n_resamples": cfg["n_resamples"],
        "bias": float(tab["exponent"].mean() - alpha), "bias_mcse": emp / np.sqrt(s), "emp_se": emp,
        "mean_se": float(tab["se"].mean()), "coverage": cover, "coverage_mcse": float(np.sqrt(cover * (1 - cover) / s)),
        "mean_width": float((tab["ci_high"] - tab["ci_low"]).mean()),
        "power_law_share": float((tab["verdict"] == "power law").mean()),
        "curved_share": float((tab["verdict"] == "curved: exponent is local").mean()),
    }])
