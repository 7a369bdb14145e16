"""Shared pieces of the rate modules: model transforms, input checks, per-n cells, weighted LS, meta-regression.

Private to the modules of :mod:`moestat.rates`, which re-exports the public names.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import special, stats

from .._validation import column_list as _as_list  # noqa: F401  (its former home: old imports keep working)

RATE_MODELS: dict[str, str] = {
    "power": "log y = c - alpha * log n",
    "power_log": "log y = c - alpha * log(n / log n)",
    "inverse_log": "log y = c - alpha * log(log n)",
}
_AGGS = (None, "mean", "median", "logmean")
_METHODS = ("auto", "random_effects", "unit_bootstrap", "cluster_bootstrap", "robust")
_INTERVALS = ("t", "percentile")
_RESAMPLE = (None, "within_n", "rep")
_KNAPP_HARTUNG = ("standard", "modified")
#: Leading columns of ``RateResult.table`` (after the ``by`` columns): the estimate, then the diagnostics.
TABLE_COLUMNS = ["model", "exponent", "se", "ci_low", "ci_high", "intercept", "r2", "aic", "n_values", "replicates",
                 "verdict", "curvature_p", "best_model", "delta_aic", "window_consistent", "window_drift", "tau2",
                 "shock_p"]
#: The verdicts of :func:`moestat.rates.fit_rate`, in the order the rule checks them.
VERDICTS = ("range too narrow", "no decay", "curved: exponent is local", "imprecise", "power law")
MIN_N_VALUES = 3
RECOMMENDED_N_VALUES = 5
MIN_CLUSTERS = 10
MIN_UNITS = 5


def rao_wu(centre: Any, draws: Any, size: int) -> Any:
    r"""Rescaled bootstrap draws :math:`\hat\theta + \sqrt{m/(m-1)}\,(\theta^* - \hat\theta)`.

    A bootstrap mean over ``size`` = m resampled units has variance :math:`s^2 (m-1)/m^2`; rescaling the
    deviations by :math:`\sqrt{m/(m-1)}` makes it the unbiased :math:`s^2/m` (the rescaling bootstrap of
    Rao & Wu 1988), which matters at the 5-20 replicates or units of a rate study.
    """
    return centre + np.sqrt(size / (size - 1)) * (draws - centre)


# --------------------------------------------------------------------------------------------------
# validation helpers




def _check_columns(frame: Any, columns: dict[str, list[str]]) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame (tidy: one row per cell x replicate), got "
                        f"{type(frame).__name__}.")
    missing = [(arg, c) for arg, cols in columns.items() for c in cols if c not in frame.columns]
    if missing:
        named = ", ".join(f"{c!r} (from {arg}=)" for arg, c in missing)
        raise ValueError(f"frame is missing column(s) {named}; available columns are {list(frame.columns)}.")


def _check_models(model: str | Sequence[str]) -> list[str]:
    if isinstance(model, str):
        models = list(RATE_MODELS) if model == "all" else [model]
    elif isinstance(model, Sequence) and len(model) > 0:
        models = list(model)
    else:
        raise TypeError(f"model must be one of {list(RATE_MODELS)}, 'all', or a non-empty list of them; got {model!r}.")
    for m in models:
        if m not in RATE_MODELS:
            raise ValueError(f"model={m!r} is not supported; valid models are {list(RATE_MODELS)} (or 'all').")
    if len(set(models)) != len(models):
        raise ValueError(f"model lists a model twice: {models}.")
    return models


def _check_level(ci: Any) -> float:
    if isinstance(ci, bool) or not isinstance(ci, numbers.Real) or not 0 < ci < 1:
        raise ValueError(f"confidence_level must be strictly between 0 and 1 (e.g. 0.95), got {ci!r}.")
    return float(ci)


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; valid values are {list(choices)}.")
    return value


def _check_nboot(n_resamples: Any) -> int:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, numbers.Integral) or n_resamples < 100:
        raise ValueError("n_resamples must be an integer >= 100 (2000 or more for 95% intervals), "
                         f"got {n_resamples!r}.")
    return int(n_resamples)


def regressor(model: str, n: np.ndarray) -> np.ndarray:
    """The transform ``u(n)`` each rate model regresses ``log y`` on (``exponent = -slope``)."""
    n = np.asarray(n, dtype=np.float64)
    if model == "power":
        return np.log(n)
    if model == "power_log":
        return np.log(n) - np.log(np.log(n))
    if model == "inverse_log":
        return np.log(np.log(n))
    raise ValueError(f"model={model!r} is not supported; valid models are {list(RATE_MODELS)}.")


def _group_key(key: Any, by: list[str]) -> tuple:
    if not by:
        return ()
    return key if isinstance(key, tuple) else (key,)


def _key_text(key: tuple, by: list[str]) -> str:
    return ", ".join(f"{b}={v!r}" for b, v in zip(by, key, strict=True)) if by else "the frame"


# --------------------------------------------------------------------------------------------------
# per-group cell data


@dataclass
class _Cells:
    """Replicate-level data of one group, sorted by n: values[i] holds the y of every replicate at ns[i].

    ``reps[i]`` are the replicate ids of those rows and ``units[i]`` their unit ids (``None`` without
    ``units=``); rows are sorted by (n, unit, rep).
    """

    ns: np.ndarray
    values: list[np.ndarray]
    reps: list[np.ndarray]
    units: list[np.ndarray] | None = None

    @property
    def counts(self) -> np.ndarray:
        return np.array([len(v) for v in self.values])

    def subset(self, idx: np.ndarray) -> _Cells:
        """The cells at positions ``idx`` (a window of the n grid)."""
        return _Cells(self.ns[idx], [self.values[i] for i in idx], [self.reps[i] for i in idx],
                      None if self.units is None else [self.units[i] for i in idx])


def _cells(sub: pd.DataFrame, x: str, y: str, rep: str | None, units: str | None = None) -> _Cells:
    xs = sub[x].to_numpy(dtype=np.float64)
    ys = sub[y].to_numpy(dtype=np.float64)
    keys = [xs]
    rep_values = unit_values = None
    if units is not None:
        unit_values = sub[units].to_numpy()
        keys.insert(0, pd.factorize(unit_values, sort=True)[0])
    if rep is not None:
        rep_values = sub[rep].to_numpy()
        keys.insert(0, pd.factorize(rep_values, sort=True)[0])
    order = np.lexsort(keys) if len(keys) > 1 else np.argsort(xs, kind="stable")
    xs, ys = xs[order], ys[order]
    ns, starts = np.unique(xs, return_index=True)
    bounds = np.r_[starts, len(xs)]
    parts = [slice(bounds[i], bounds[i + 1]) for i in range(len(ns))]
    values = [ys[s] for s in parts]
    reps = [rep_values[order][s] if rep is not None else np.arange(s.stop - s.start) for s in parts]
    unit_cells = None if units is None else [unit_values[order][s] for s in parts]
    return _Cells(ns, values, reps, unit_cells)


def _prepare(frame: pd.DataFrame, y: str, x: str, by: list[str], rep: str | None,
             models: list[str], units: str | None = None) -> dict[tuple, _Cells]:
    """Validate a tidy rate frame and split it into per-group cells."""
    _check_columns(frame, {"y": [y], "x": [x], "by": by, **({"rep": [rep]} if rep else {}),
                           **({"units": [units]} if units else {})})
    if units is not None and (units in by or units in (x, y)):
        raise ValueError(f"units={units!r} must be a column of its own, not also x, y or one of by={by}.")
    for col in (x, y):
        if not pd.api.types.is_numeric_dtype(frame[col]):
            raise TypeError(f"column {col!r} must be numeric, got dtype {frame[col].dtype}.")
    values = frame[y].to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        raise ValueError(f"column {y!r} has {bad} NaN/inf value(s); drop the failed rows explicitly "
                         f"(frame.dropna(subset=[{y!r}]) or na='drop') and report how many were dropped.")
    if (values <= 0).any():
        bad = int((values <= 0).sum())
        raise ValueError(f"column {y!r} has {bad} non-positive value(s); every rate model fits log {y}, so y "
                         "must be > 0. Remove exact zeros explicitly or add a documented floor.")
    xs = frame[x].to_numpy(dtype=np.float64)
    if not np.isfinite(xs).all() or (xs <= 0).any():
        raise ValueError(f"column {x!r} must hold finite positive sample sizes.")
    if any(m != "power" for m in models) and (xs <= 1).any():
        raise ValueError(f"models {[m for m in models if m != 'power']} use log(log {x}); every {x!r} must be > 1.")
    if units is not None and frame[units].isna().any():
        raise ValueError(f"column {units!r} (from units=) has missing values; every row needs its unit id.")
    groups: dict[tuple, _Cells] = {}
    iterator = frame.groupby(by, sort=True, dropna=False) if by else [((), frame)]
    ident = [x, *([units] if units else []), *([rep] if rep else [])]
    for key, sub in iterator:
        key = _group_key(key, by)
        if rep is not None and sub.duplicated(ident).any():
            dup = sub.loc[sub.duplicated(ident, keep=False), ident].iloc[0].tolist()
            raise ValueError(f"{_key_text(key, by)} has several rows for ({', '.join(ident)}) = {tuple(dup)}; add "
                             "the columns that tell them apart (gate, expert, metric, ...) to by=.")
        cells = _cells(sub, x, y, rep, units)
        if len(cells.ns) < MIN_N_VALUES:
            raise ValueError(f"{_key_text(key, by)} has {len(cells.ns)} distinct {x} value(s) "
                             f"({cells.ns.tolist()}); a rate fit needs at least {MIN_N_VALUES}.")
        groups[key] = cells
    return groups


# --------------------------------------------------------------------------------------------------
# per-n statistics and the weighted LS slope


def _cell_stat(v: np.ndarray, agg: str | None, axis: int = -1) -> np.ndarray:
    """Per-n statistic z_n the regression uses: mean log y (replicate level / logmean) or log of mean/median."""
    if agg is None or agg == "logmean":
        return np.log(v).mean(axis=axis)
    if agg == "mean":
        return np.log(v.mean(axis=axis))
    return np.log(np.median(v, axis=axis))


def _wls_slope(u: np.ndarray, z: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted LS of z on u along the last axis (batched over leading axes): returns (intercept, slope)."""
    w = w / w.sum()
    ub = (w * u).sum()
    du = u - ub
    slope = (z * (w * du)).sum(axis=-1) / (w * du * du).sum()
    intercept = (z * w).sum(axis=-1) - slope * ub
    return intercept, slope


def _wls_coefs(X: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The (p, m) matrix H with coefficients = H z for the weighted LS of z on the columns of X (m, p)."""
    xtw = X.T * w
    return np.linalg.solve(xtw @ X, xtw)


def _ols_stats(u: np.ndarray, endog: np.ndarray) -> tuple[float, float, float, float, float]:
    """OLS of ``endog`` on ``(1, u)``: intercept, slope, R^2, AIC and BIC as statsmodels ``OLS`` defines them.

    ``llf = -N/2 (log(2 pi RSS / N) + 1)``, ``AIC = -2 llf + 2 * 2``, ``BIC = -2 llf + 2 log N`` (two
    coefficients); the closed form keeps the three-model comparison cheap inside large simulation loops.
    """
    n = len(endog)
    ub, yb = u.mean(), endog.mean()
    du = u - ub
    slope = float((du * (endog - yb)).sum() / (du * du).sum())
    intercept = float(yb - slope * ub)
    rss = float(((endog - intercept - slope * u) ** 2).sum())
    tss = float(((endog - yb) ** 2).sum())
    llf = -0.5 * n * (np.log(2 * np.pi * max(rss, 1e-300) / n) + 1)
    return intercept, slope, 1 - rss / tss if tss > 0 else np.nan, -2 * llf + 4, -2 * llf + 2 * np.log(n)


# --------------------------------------------------------------------------------------------------
# random-effects meta-regression of the per-n statistics


def _trigamma_inverse(x: float) -> float:
    """Solve ``trigamma(y) = x`` for y > 0 by Newton's method (Smyth 2004, Appendix; limma's trigammaInverse)."""
    if x > 1e7:
        return 1 / np.sqrt(x)
    if x < 1e-6:
        return 1 / x
    y = 0.5 + 1 / x
    for _ in range(50):
        tri = special.polygamma(1, y)
        dif = tri * (1 - tri / x) / special.polygamma(2, y)
        y += dif
        if -dif / y < 1e-8:
            break
    return float(y)


def _moderate_variances(s2: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, float, float]:
    r"""Empirical-Bayes moderated variances (Smyth 2004, the limma ``squeezeVar`` estimator).

    Each cell's sample variance ``s_n^2`` on ``d_n`` degrees of freedom is shrunk towards a common prior
    value ``s_0^2`` fitted to all cells: with ``e_n = log s_n^2 - digamma(d_n/2) + log(d_n/2)``,
    ``trigamma(d_0/2) = var(e) - mean(trigamma(d_n/2))`` and
    ``s_0^2 = exp(mean(e) + digamma(d_0/2) - log(d_0/2))``,

    .. math:: \tilde s_n^2 = (d_0 s_0^2 + d_n s_n^2) / (d_0 + d_n).

    When the cells' variances scatter no more than sampling alone explains, ``d_0 = inf`` and every cell
    gets ``s_0^2``; when they differ clearly, ``d_0`` is small and each cell keeps its own variance.

    Returns
    -------
    (moderated variances, d_0, s_0^2)
    """
    e = np.log(s2) - special.digamma(d / 2) + np.log(d / 2)
    emean = float(e.mean())
    evar = float(((e - emean) ** 2).sum() / (len(e) - 1)) - float(special.polygamma(1, d / 2).mean())
    if evar > 0:
        d0 = 2 * _trigamma_inverse(evar)
        s02 = float(np.exp(emean + special.digamma(d0 / 2) - np.log(d0 / 2)))
        return (d0 * s02 + d * s2) / (d0 + d), d0, s02
    s02 = float(np.exp(emean))
    return np.full_like(s2, s02), np.inf, s02


@dataclass
class _MetaFit:
    """A (random-effects) meta-regression: coefficients, their KH covariance and the heterogeneity statistics."""

    beta: np.ndarray
    cov: np.ndarray
    df: float
    tau2: float
    q_e: float
    shock_p: float


def _re_metareg(X: np.ndarray, z: np.ndarray, v: np.ndarray | None, df_within: float = np.inf,
                truncate: bool = False) -> _MetaFit:
    r"""Random-effects meta-regression of z (m,) on X (m, p) with known within variances v (m,).

    Model ``z_n = x_n' beta + b_n + e_n`` with ``b_n ~ N(0, tau^2)`` (a shock shared by the cell) and
    ``e_n ~ N(0, v_n)`` (replicate noise of the cell statistic).

    * Fixed-effects fit with ``W_0 = diag(1 / v_n)``; residual heterogeneity statistic
      ``Q_E = sum_n (z_n - x_n' b_0)^2 / v_n`` (Cochran's Q for meta-regression).
    * Method-of-moments ``tau^2 = max(0, (Q_E - (m - p)) / tr(P))``,
      ``P = W_0 - W_0 X (X' W_0 X)^{-1} X' W_0`` (DerSimonian & Laird 1986 generalised to
      meta-regression; Viechtbauer 2010, the "DL" estimator).
    * Random-effects weights ``w_n = 1 / (v_n + tau^2)``, ``beta = (X' W X)^{-1} X' W z``.
    * Knapp-Hartung covariance ``q (X' W X)^{-1}`` with ``q = sum_n w_n (z_n - x_n' beta)^2 / (m - p)``
      and a t reference on ``m - p`` degrees of freedom (Knapp & Hartung 2003).  ``truncate=True`` uses
      ``max(q, 1)`` (the "modified" Knapp-Hartung factor).

    ``shock_p`` tests ``tau^2 = 0`` with ``Q_E / (m - p)`` against ``F(m - p, df_within)`` (the chi-square
    reference of Cochran's test when ``df_within = inf``; ``df_within`` is the degrees of freedom of the
    within variances, finite when they are estimated).

    ``v=None`` is the equal-weight fallback: ordinary least squares of z on X with the classical covariance
    ``RSS / (m - p) (X' X)^{-1}`` (no tau^2; ``tau2`` and ``shock_p`` are NaN).
    """
    m, p = X.shape
    df = float(m - p)
    if v is None:
        xtx_inv = np.linalg.inv(X.T @ X)
        beta = xtx_inv @ (X.T @ z)
        r = z - X @ beta
        cov = float(r @ r) / df * xtx_inv
        return _MetaFit(beta, cov, df, np.nan, np.nan, np.nan)
    w0 = 1.0 / v
    xtw0 = X.T * w0
    a0_inv = np.linalg.inv(xtw0 @ X)
    r0 = z - X @ (a0_inv @ (xtw0 @ z))
    q_e = float((w0 * r0 * r0).sum())
    tr_p = float(w0.sum() - np.trace(a0_inv @ ((X.T * w0 ** 2) @ X)))
    tau2 = max(0.0, (q_e - df) / tr_p) if tr_p > 0 else 0.0
    w = 1.0 / (v + tau2)
    xtw = X.T * w
    a_inv = np.linalg.inv(xtw @ X)
    beta = a_inv @ (xtw @ z)
    r = z - X @ beta
    q = float((w * r * r).sum()) / df
    if truncate:
        q = max(q, 1.0)
    shock_p = float(stats.f.sf(q_e / df, df, df_within)) if np.isfinite(df_within) else float(stats.chi2.sf(q_e, df))
    return _MetaFit(beta, q * a_inv, df, tau2, q_e, shock_p)


def _re_ml_nll(X: np.ndarray, z: np.ndarray, v: np.ndarray, t2: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of the meta-regression at each between-cell variance in ``t2`` (K,), beta profiled."""
    w = 1.0 / (v[None, :] + t2[:, None])                        # (K, m)
    xtw = X.T[None, :, :] * w[:, None, :]                       # (K, p, m)
    beta = np.linalg.solve(xtw @ X, (xtw @ z)[..., None])[..., 0]
    r = z[None, :] - beta @ X.T
    return 0.5 * np.sum(np.log(2 * np.pi / w) + w * r * r, axis=1)


def _re_ml_aic(X: np.ndarray, z: np.ndarray, v: np.ndarray) -> float:
    r"""AIC of the random-effects meta-regression of z on X fitted by maximum likelihood.

    ``-2 max_{beta, tau^2 >= 0} sum_n log phi(z_n; x_n' beta, v_n + tau^2) + 2 (p + 1)``: the likelihood of the
    per-n statistics under the same variance model as the interval (within variances ``v_n`` plus a
    between-cell variance ``tau^2``).  ``tau^2`` is profiled over 0 and a geometric grid on
    ``[1e-8, 1] x 10 (var z + max v)`` (steps of 10%), refined by a parabola in ``log tau^2`` through the best
    grid point and its neighbours.  Used to compare the rate models on the same responses without
    mistaking cell shocks for curvature.
    """
    ub = 10.0 * (float(z.var()) + float(v.max()))
    logt = np.linspace(np.log(1e-8 * ub), np.log(ub), 193)
    nll = _re_ml_nll(X, z, v, np.r_[0.0, np.exp(logt)])
    best = float(nll.min())
    k = int(np.argmin(nll[1:]))
    if 0 < k < len(logt) - 1:
        y0, y1, y2 = nll[k: k + 3]
        den = y0 - 2 * y1 + y2
        if den > 0:
            h = logt[1] - logt[0]
            t_star = logt[k] + 0.5 * h * (y0 - y2) / den
            best = min(best, float(_re_ml_nll(X, z, v, np.array([np.exp(t_star)]))[0]))
    return 2.0 * best + 2.0 * (X.shape[1] + 1)
