r"""Performance measures of a simulation study with their Monte Carlo standard errors (MCSE).

A simulation study estimates the properties of a method (bias, precision, coverage, power) from a finite number
of replicates, so every reported measure is itself an estimate with a Monte Carlo error.  This module reports
each measure with its MCSE, using the definitions and MCSE formulas of

* Morris, T. P., White, I. R. & Crowther, M. J. (2019). Using simulation studies to evaluate statistical methods.
  *Statistics in Medicine* 38(11), 2074-2102, Table 6;
* the R package rsimsum (Gasparini 2018, *Journal of Open Source Software* 3(26), 739; function ``simsum``,
  vignette "Introduction to rsimsum"), which implements the same table (and adds relative bias);

and adds two tools those references describe but do not automate: a leave-one-replicate-out jackknife MCSE
for any derived quantity (:func:`jackknife_mcse`; Efron & Stein 1981, *Annals of Statistics* 9:586; its use for
simulation summaries is Koehler, Brown & Haneuse 2009, *The American Statistician* 63:155) and the number of
replicates that reaches a target MCSE (:func:`n_reps_for`, Morris et al. 2019 §5.3).

Notation: $n$ replicates $i = 1..n$, estimates $\hat\theta_i$ with mean $\bar\theta$, true value $\theta$, model
standard errors $\widehat{\mathrm{SE}}_i$, $z = \Phi^{-1}(1 - (1 - \text{level}) / 2)$.  See
``docs/simulation-performance.md`` for every formula with its MCSE.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from ._validation import Integer, Optional, Real, validate_arguments
from ._validation import column_list as _columns

__all__ = ["MEASURES", "jackknife_mcse", "n_reps_for", "performance_measures"]

_PILOT_N_REPS = Optional(Integer(2))
_PILOT_N_REPS.description = "an integer >= 2 (the pilot's replicates; None with a pilot frame)"

#: The measures :func:`performance_measures` reports, in its row order; those marked "se" need ``std_error``,
#: "p" needs ``p_value``.
MEASURES: dict[str, str] = {
    "bias": "truth",
    "relative_bias": "truth",
    "empirical_se": "",
    "mse": "truth",
    "rmse": "truth",
    "model_se": "se",
    "relative_error_model_se": "se",
    "coverage": "truth, se",
    "bias_eliminated_coverage": "se",
    "power": "se",
    "rejection_rate": "p",
}

_Row = tuple[str, float, float, int]


# ----------------------------------------------------------------------------------------------- input checks


def _numeric_column(frame: pd.DataFrame, arg: str, column: str) -> np.ndarray:
    """Column ``column`` (named by argument ``arg``) as float64, NaN kept; non-numeric or infinite values raise."""
    series = frame[column]
    if not (pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)):
        raise TypeError(f"{arg}={column!r}: column {column!r} must hold numbers, got dtype {series.dtype}; convert "
                        f"it first (frame[{column!r}] = pd.to_numeric(frame[{column!r}])).")
    values: np.ndarray = series.to_numpy(dtype=np.float64, na_value=np.nan)
    if np.isinf(values).any():
        raise ValueError(f"{arg}={column!r}: column {column!r} has {int(np.isinf(values).sum())} infinite value(s); "
                         "set failed replicates to NaN (they are then dropped and counted in n_reps).")
    return values


def _check_frame(frame: Any, needed: dict[str, list[str]]) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame with one row per replicate, got {type(frame).__name__}.")
    missing = [(arg, c) for arg, cols in needed.items() for c in cols if c not in frame.columns]
    if missing:
        named = ", ".join(f"{c!r} (from {arg}=)" for arg, c in missing)
        raise ValueError(f"frame is missing column(s) {named}; available columns are {list(frame.columns)}.")


# ----------------------------------------------------------------------------------------------- measures
def _safe_div(num: float, den: float) -> float:
    return float(num / den) if den > 0 else math.nan


def _bias_rows(est: np.ndarray, truth: np.ndarray) -> list[_Row]:
    r"""Bias $\frac1n\sum(\hat\theta_i - \theta)$, MCSE $\sqrt{\frac{1}{n(n-1)}\sum(\hat\theta_i-\bar\theta)^2}$;
    relative bias $\frac1n\sum(\hat\theta_i - \theta)/\theta$, MCSE $\mathrm{sd}\{(\hat\theta_i-\theta)/\theta\}
    /\sqrt n$ (rsimsum; omitted when some $\theta = 0$)."""
    keep = np.isfinite(est) & np.isfinite(truth)
    e, t = est[keep], truth[keep]
    n = int(keep.sum())
    d = e - t
    rows: list[_Row] = [("bias", float(d.mean()) if n else math.nan,
                         math.sqrt(_safe_div(float(((e - e.mean()) ** 2).sum()), n * (n - 1))) if n > 1 else math.nan,
                         n)]
    if not (t == 0).any():
        rel = d / t
        rows.append(("relative_bias", float(rel.mean()) if n else math.nan,
                     float(rel.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan, n))
    return rows


def _empse_row(est: np.ndarray) -> _Row:
    r"""Empirical SE $\sqrt{\frac{1}{n-1}\sum(\hat\theta_i-\bar\theta)^2}$, MCSE $\mathrm{EmpSE}/\sqrt{2(n-1)}$."""
    e = est[np.isfinite(est)]
    n = len(e)
    if n < 2:
        return ("empirical_se", math.nan, math.nan, n)
    empse = float(e.std(ddof=1))
    return ("empirical_se", empse, empse / math.sqrt(2 * (n - 1)), n)


def _mse_rows(est: np.ndarray, truth: np.ndarray) -> list[_Row]:
    r"""MSE $\frac1n\sum(\hat\theta_i-\theta)^2$, MCSE $\sqrt{\sum\{(\hat\theta_i-\theta)^2-\mathrm{MSE}\}^2
    /\{n(n-1)\}}$; RMSE $\sqrt{\mathrm{MSE}}$, MCSE by the delta method $\mathrm{MCSE(MSE)}/(2\,\mathrm{RMSE})$."""
    keep = np.isfinite(est) & np.isfinite(truth)
    n = int(keep.sum())
    d2 = (est[keep] - truth[keep]) ** 2
    mse = float(d2.mean()) if n else math.nan
    mse_mcse = math.sqrt(float(((d2 - mse) ** 2).sum()) / (n * (n - 1))) if n > 1 else math.nan
    rmse = math.sqrt(mse) if n else math.nan
    return [("mse", mse, mse_mcse, n), ("rmse", rmse, _safe_div(mse_mcse, 2 * rmse), n)]


def _model_se_rows(est: np.ndarray, se: np.ndarray) -> list[_Row]:
    r"""Model SE $\sqrt{\frac1n\sum\widehat{\mathrm{SE}}_i^2}$ (root mean squared SE, as rsimsum and Morris et al.),
    MCSE $\sqrt{\widehat{\mathrm{Var}}(\widehat{\mathrm{SE}}^2_i)/(4n\,\mathrm{ModSE}^2)}$; relative % error
    $100(\mathrm{ModSE}/\mathrm{EmpSE}-1)$, MCSE $100\frac{\mathrm{ModSE}}{\mathrm{EmpSE}}
    \sqrt{\widehat{\mathrm{Var}}(\widehat{\mathrm{SE}}^2_i)/(4n\,\mathrm{ModSE}^4)+1/(2(n-1))}$.  Both on the
    replicates with an estimate and an SE."""
    keep = np.isfinite(est) & np.isfinite(se)
    n = int(keep.sum())
    if n < 2:
        return [("model_se", math.sqrt(float(se[keep][0] ** 2)) if n else math.nan, math.nan, n),
                ("relative_error_model_se", math.nan, math.nan, n)]
    v = se[keep] ** 2
    modse = math.sqrt(float(v.mean()))
    var_v = float(v.var(ddof=1))
    empse = float(est[keep].std(ddof=1))
    modse_mcse = math.sqrt(_safe_div(var_v, 4 * n * modse**2))
    ratio = _safe_div(modse, empse)
    rel = 100 * (ratio - 1)
    rel_mcse = 100 * ratio * math.sqrt(_safe_div(var_v, 4 * n * modse**4) + 1 / (2 * (n - 1)))
    return [("model_se", modse, modse_mcse, n), ("relative_error_model_se", rel, rel_mcse, n)]


def _proportion_row(name: str, hits: np.ndarray) -> _Row:
    r"""A proportion $\hat p = \frac1n\sum I_i$ with MCSE $\sqrt{\hat p(1-\hat p)/n}$ (coverage, power)."""
    n = len(hits)
    if n == 0:
        return (name, math.nan, math.nan, 0)
    p = float(hits.mean())
    return (name, p, math.sqrt(p * (1 - p) / n), n)


def _interval_rows(est: np.ndarray, truth: np.ndarray | None, se: np.ndarray, z: float, null: float) -> list[_Row]:
    r"""Coverage $\frac1n\sum I(|\hat\theta_i-\theta| \le z\widehat{\mathrm{SE}}_i)$, bias-eliminated coverage
    (the same with $\bar\theta$ for $\theta$) and power $\frac1n\sum I(|\hat\theta_i-\theta_0| \ge
    z\widehat{\mathrm{SE}}_i)$ (Wald test of ``null`` $=\theta_0$), each with the binomial MCSE."""
    rows: list[_Row] = []
    keep = np.isfinite(est) & np.isfinite(se)
    if truth is not None:
        kt = keep & np.isfinite(truth)
        rows.append(_proportion_row("coverage", np.abs(est[kt] - truth[kt]) <= z * se[kt]))
    e, s = est[keep], se[keep]
    centre = e.mean() if len(e) else math.nan
    rows.append(_proportion_row("bias_eliminated_coverage", np.abs(e - centre) <= z * s))
    rows.append(_proportion_row("power", np.abs(e - null) >= z * s))
    return rows


def _group_rows(est: np.ndarray, truth: np.ndarray | None, se: np.ndarray | None, pval: np.ndarray | None,
                z: float, null: float, alpha_test: float) -> list[_Row]:
    rows: list[_Row] = []
    if truth is not None:
        rows += _bias_rows(est, truth)
    rows.append(_empse_row(est))
    if truth is not None:
        rows += _mse_rows(est, truth)
    if se is not None:
        rows += _model_se_rows(est, se)
        rows += _interval_rows(est, truth, se, z, null)
    if pval is not None:
        rows.append(_proportion_row("rejection_rate", pval[np.isfinite(pval)] < alpha_test))
    order = {m: i for i, m in enumerate(MEASURES)}
    return sorted(rows, key=lambda r: order[r[0]])


@validate_arguments(confidence_level=Real(0, 1, open_low=True, open_high=True), null=Real(),
                    alpha_test=Real(0, 1, open_low=True, open_high=True))
def performance_measures(frame: pd.DataFrame, *, estimate: str = "estimate", truth: str | float | None = "truth",
                         std_error: str | None = None, by: str | Sequence[str] | None = None,
                         confidence_level: float = 0.95, null: float = 0.0, p_value: str | None = None,
                         alpha_test: float = 0.05) -> pd.DataFrame:
    r"""Performance measures of a simulation study, each with its Monte Carlo standard error.

    Definitions and MCSEs are those of Morris, White & Crowther (2019, *Stat. Med.* 38:2074, Table 6) as
    implemented by the R package rsimsum (``simsum``; vignette "Introduction to rsimsum"); $n$ is the number of
    replicates a measure uses, $\bar\theta$ the mean estimate, $z = \Phi^{-1}(1-(1-\text{level})/2)$:

    * ``bias``: $\frac1n\sum(\hat\theta_i-\theta)$; MCSE $\sqrt{\sum(\hat\theta_i-\bar\theta)^2/\{n(n-1)\}}$.
    * ``relative_bias``: $\frac1n\sum(\hat\theta_i-\theta)/\theta$; MCSE
      $\mathrm{sd}\{(\hat\theta_i-\theta)/\theta\}/\sqrt n$.
    * ``empirical_se``: $\mathrm{EmpSE}=\sqrt{\sum(\hat\theta_i-\bar\theta)^2/(n-1)}$; MCSE
      $\mathrm{EmpSE}/\sqrt{2(n-1)}$.
    * ``mse``: $\frac1n\sum(\hat\theta_i-\theta)^2$; MCSE $\sqrt{\sum\{(\hat\theta_i-\theta)^2-\mathrm{MSE}\}^2
      /\{n(n-1)\}}$.
    * ``rmse``: $\sqrt{\mathrm{MSE}}$; MCSE $\mathrm{MCSE(MSE)}/(2\,\mathrm{RMSE})$ (delta method).
    * ``model_se``: $\mathrm{ModSE}=\sqrt{\frac1n\sum\widehat{\mathrm{SE}}_i^2}$; MCSE
      $\sqrt{\widehat{\mathrm{Var}}(\widehat{\mathrm{SE}}_i^2)/(4n\,\mathrm{ModSE}^2)}$.
    * ``relative_error_model_se``: $100(\mathrm{ModSE}/\mathrm{EmpSE}-1)$ (percent); MCSE
      $100\frac{\mathrm{ModSE}}{\mathrm{EmpSE}}\sqrt{\widehat{\mathrm{Var}}(\widehat{\mathrm{SE}}_i^2)
      /(4n\,\mathrm{ModSE}^4)+1/\{2(n-1)\}}$.
    * ``coverage``: $c=\frac1n\sum I(|\hat\theta_i-\theta|\le z\widehat{\mathrm{SE}}_i)$; MCSE $\sqrt{c(1-c)/n}$.
    * ``bias_eliminated_coverage``: the same with $\bar\theta$ in place of $\theta$; MCSE $\sqrt{c(1-c)/n}$.
    * ``power``: $p=\frac1n\sum I(|\hat\theta_i-\theta_0|\ge z\widehat{\mathrm{SE}}_i)$; MCSE $\sqrt{p(1-p)/n}$.
    * ``rejection_rate``: $r=\frac1n\sum I(p_i < \alpha_\text{test})$; MCSE $\sqrt{r(1-r)/n}$.

    Conventions, where the two references differ or leave a choice:

    * ``model_se`` is the **root mean squared** model SE $\sqrt{\overline{\widehat{\mathrm{SE}}^2}}$ (rsimsum's
      ``modelse`` and Morris et al.'s "average ModSE"), not the plain mean of the SEs: it is the square root of
      the average variance, the quantity comparable with the empirical variance.
    * ``relative_bias`` is a fraction and ``relative_error_model_se`` a percentage, as in rsimsum;
      ``coverage``, ``power`` and ``rejection_rate`` are proportions (Morris et al. print them as %).
    * ``power`` is rsimsum's Wald rejection at level $1-$ ``confidence_level``, generalised to a null value
      $\theta_0$ = ``null`` (rsimsum tests $\theta_0=0$).  ``rejection_rate`` is the same measure (Morris et al.'s
      "rejection %") for the test the user ran, read from ``p_value``: $p_i < $ ``alpha_test``.  Which of power or
      type-I error it estimates depends on whether the null is true in the data-generating mechanism.
    * Missing values (NaN) are dropped **per measure** and the count used is ``n_reps``: bias, relative bias,
      MSE, RMSE need an estimate (and truth); the empirical SE an estimate; every SE-based measure the estimate
      and its SE (the relative error compares model and empirical SE on the same replicates).  rsimsum instead
      counts the replicates with both an estimate and an SE for every measure once ``se`` is given.
    * Intervals use the normal critical value $z$ (rsimsum's default; it offers $t$ quantiles too).  An interval
      boundary counts as covered and as rejected (rsimsum's ``>=`` / ``<=``).

    Parameters
    ----------
    frame : DataFrame
        One row per replicate (and per group of ``by``).
    estimate : str
        Column of the point estimates $\hat\theta_i$.
    truth : str, float or None
        Column of the true value $\theta$ (it may vary by row) or one number; None omits the measures that need
        the truth (bias, relative bias, MSE, RMSE, coverage).  ``relative_bias`` is omitted for a group whose
        truth is 0 in some replicate (it is undefined).
    std_error : str, optional
        Column of the model standard errors; without it the SE-based measures (``model_se``,
        ``relative_error_model_se``, ``coverage``, ``bias_eliminated_coverage``, ``power``) are omitted.
    by : str or list of str, optional
        Grouping columns (method, scenario, n ...); one block of measures per group.
    confidence_level : float
        Level of the Wald intervals of ``coverage``; ``power`` tests at $1-$ ``confidence_level``.
    null : float
        Null value $\theta_0$ of the Wald test behind ``power``.
    p_value : str, optional
        Column of p-values; adds ``rejection_rate``.
    alpha_test : float
        Level of the test read from ``p_value``.

    Returns
    -------
    DataFrame
        Columns ``[*by, "measure", "estimate", "mcse", "n_reps"]``, one row per group and measure in the order
        of :data:`MEASURES`.  ``mcse`` is NaN where it needs more replicates than there are (e.g. one).

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(1)
    >>> frame = pd.DataFrame({"estimate": rng.normal(1.0, 0.2, 500), "truth": 1.0, "se": 0.2})
    >>> tab = performance_measures(frame, std_error="se")
    >>> int(tab.set_index("measure").loc["coverage", "n_reps"])
    500
    """
    by_cols = _columns("by", by)
    truth_col = truth if isinstance(truth, str) else None
    if truth is not None and truth_col is None and (isinstance(truth, bool) or not isinstance(truth, numbers.Real)
                                                   or not np.isfinite(truth)):
        raise TypeError(f"truth must be a column name, a finite number or None, got {truth!r}.")
    named = {"estimate": [estimate], "truth": [truth_col] if truth_col else [],
             "std_error": [std_error] if std_error else [], "p_value": [p_value] if p_value else [], "by": by_cols}
    for arg in ("estimate", "std_error", "p_value"):
        value = {"estimate": estimate, "std_error": std_error, "p_value": p_value}[arg]
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{arg} must be a column name (str){'' if arg == 'estimate' else ' or None'}, "
                            f"got {value!r}.")
    _check_frame(frame, named)
    est = _numeric_column(frame, "estimate", estimate)
    tru = (_numeric_column(frame, "truth", truth_col) if truth_col
           else None if truth is None else np.full(len(frame), float(truth)))
    se = _numeric_column(frame, "std_error", std_error) if std_error else None
    if se is not None and (se < 0).any():
        raise ValueError(f"std_error={std_error!r}: column {std_error!r} has negative standard errors "
                         f"(e.g. {se[se < 0][0]!r}); standard errors must be >= 0.")
    pv = _numeric_column(frame, "p_value", p_value) if p_value else None
    if pv is not None and ((pv < 0) | (pv > 1)).any():
        raise ValueError(f"p_value={p_value!r}: column {p_value!r} has values outside [0, 1] "
                         f"(e.g. {pv[(pv < 0) | (pv > 1)][0]!r}).")
    z = float(stats.norm.ppf(1 - (1 - confidence_level) / 2))
    groups = (frame.groupby(by_cols, sort=True, dropna=False).indices.items() if by_cols
              else [((), np.arange(len(frame)))])
    out = []
    for key, idx in groups:
        key_t = key if isinstance(key, tuple) else (key,)
        rows = _group_rows(est[idx], None if tru is None else tru[idx], None if se is None else se[idx],
                           None if pv is None else pv[idx], z, float(null), float(alpha_test))
        out += [(*key_t, *row) for row in rows]
    result = pd.DataFrame(out, columns=[*by_cols, "measure", "estimate", "mcse", "n_reps"])
    return result.astype({"estimate": np.float64, "mcse": np.float64, "n_reps": np.int64})


# ----------------------------------------------------------------------------------------------- jackknife
def _scalar(value: Any, where: str) -> float:
    arr = np.asarray(value, dtype=np.float64)
    if arr.size != 1:
        raise ValueError(f"statistic must return one number, got shape {arr.shape} {where}.")
    out = float(arr.reshape(()))
    if not np.isfinite(out):
        raise ValueError(f"statistic returned {out} {where}; it must be finite on every leave-one-replicate-out "
                         "subset (e.g. guard a log against zero means).")
    return out


@validate_arguments()  # values, statistic and the column rep are data, checked against values
def jackknife_mcse(values: Any, statistic: Callable[[Any], Any], *, rep: str = "rep") -> tuple[float, float]:
    r"""Leave-one-replicate-out jackknife Monte Carlo SE of a derived quantity $T$ of the whole replicate set.

    With $T_{(i)}$ the statistic recomputed without replicate $i$ and $\bar T_{(\cdot)}$ their mean,

    $$\mathrm{MCSE}_\text{jack}(T) = \sqrt{\frac{n-1}{n}\sum_{i=1}^n \bigl(T_{(i)} - \bar T_{(\cdot)}\bigr)^2}$$

    (Efron & Stein 1981, *Ann. Statist.* 9:586; Koehler, Brown & Haneuse 2009, *Amer. Statist.* 63:155, for
    simulation summaries).  For the mean it equals the bias MCSE $s/\sqrt n$ exactly; for a smooth function
    $g(\bar x)$ it agrees with the delta method $|g'(\bar x)|\,s/\sqrt n$ to $O(1/n)$.  Use it for measures
    without a closed-form MCSE: the log of a mean loss, a fitted exponent, a ratio of two measures.

    Parameters
    ----------
    values : array-like or DataFrame
        Replicates along axis 0 of an array (a 1-D array of per-replicate values, or rows of a 2-D array), or a
        DataFrame with a ``rep`` column: leaving replicate $r$ out drops all its rows (every n, every method).
    statistic : callable
        ``statistic(subset) -> float``, called on the full set and on each leave-one-out subset (same type as
        ``values``).
    rep : str
        Replicate column of a DataFrame ``values``.

    Returns
    -------
    (estimate, mcse) : tuple of float
        ``statistic(values)`` and its jackknife MCSE.
    """
    if not callable(statistic):
        raise TypeError(f"statistic must be a callable subset -> float, got {type(statistic).__name__}.")
    if isinstance(values, pd.DataFrame):
        if rep not in values.columns:
            raise ValueError(f"values is a DataFrame without the replicate column rep={rep!r}; available columns "
                             f"are {list(values.columns)} (pass rep=<column>).")
        codes, labels = pd.factorize(values[rep], sort=True)
        if (codes < 0).any():
            raise ValueError(f"values[{rep!r}] has missing replicate ids; fill or drop those rows first.")
        subsets = ((lab, values[codes != j]) for j, lab in enumerate(labels))
        n = len(labels)
    else:
        arr = np.asarray(values)
        if arr.ndim == 0 or arr.dtype.kind not in "biuf":
            raise TypeError(f"values must be a numeric array with replicates along axis 0 or a DataFrame with a "
                            f"{rep!r} column, got {type(values).__name__} of dtype {arr.dtype}.")
        n = arr.shape[0]
        subsets = ((i, np.delete(arr, i, axis=0)) for i in range(n))
        values = arr
    if n < 2:
        raise ValueError(f"values has {n} replicate(s); the jackknife needs at least 2.")
    full = _scalar(statistic(values), "on all replicates")
    loo = np.array([_scalar(statistic(sub), f"without replicate {lab!r}") for lab, sub in subsets])
    mcse = math.sqrt((n - 1) / n * float(((loo - loo.mean()) ** 2).sum()))
    return full, mcse


# ----------------------------------------------------------------------------------------------- replicate sizing
def _needed(pilot_mcse: float, pilot_n: float, target: float) -> int:
    r"""$\lceil n_\text{pilot}(\mathrm{MCSE}_\text{pilot}/\mathrm{MCSE}_\text{target})^2\rceil$, at least 2."""
    raw = pilot_n * (pilot_mcse / target) ** 2
    return max(2, math.ceil(round(raw, 6)))  # round: (0.2 / 0.1)**2 = 4.000000000000001 must give 4 n, not 4 n + 1


def _check_positive(name: str, value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__}).")
    v = float(value)
    if not np.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {value!r}.")
    return v


def _n_reps_frame(pilot: pd.DataFrame, target_mcse: float | Mapping[str, float],
                  measure: str | Sequence[str] | None) -> pd.DataFrame:
    _check_frame(pilot, {"pilot_mcse": ["measure", "mcse", "n_reps"]})
    frame = pilot
    if measure is not None:
        wanted = _columns("measure", measure)
        unknown = sorted(set(wanted) - set(pilot["measure"]))
        if unknown:
            raise ValueError(f"measure={unknown} not in the pilot frame; its measures are "
                             f"{sorted(set(pilot['measure']))}.")
        frame = pilot[pilot["measure"].isin(wanted)]
    if isinstance(target_mcse, Mapping):
        absent = sorted(set(frame["measure"]) - set(target_mcse))
        if absent:
            raise ValueError(f"target_mcse has no target for measure(s) {absent}; give one per measure or pass "
                             "measure= to select some.")
        targets = frame["measure"].map(lambda m: _check_positive(f"target_mcse[{m!r}]", target_mcse[m]))
    else:
        t = _check_positive("target_mcse", target_mcse)
        targets = pd.Series(t, index=frame.index)
    out = frame.copy()
    out["target_mcse"] = targets.astype(np.float64)
    needed = []
    for mc, n, t in zip(out["mcse"], out["n_reps"], out["target_mcse"], strict=True):
        ok = np.isfinite(mc) and mc >= 0 and n >= 2
        needed.append(_needed(float(mc), float(n), float(t)) if ok else pd.NA)
    out["n_reps_needed"] = pd.array(needed, dtype="Int64")
    return out.reset_index(drop=True)


@validate_arguments(pilot_n_reps=_PILOT_N_REPS)
def n_reps_for(pilot_mcse: float | pd.DataFrame, pilot_n_reps: int | None = None,
               target_mcse: float | Mapping[str, float] | None = None, *,
               measure: str | Sequence[str] | None = None) -> int | pd.DataFrame:
    r"""Replicates needed for a Monte Carlo SE to reach ``target_mcse``, from a pilot run.

    Every MCSE of :func:`performance_measures` falls as $1/\sqrt{n}$ in the number of replicates $n$
    (Morris et al. 2019, *Stat. Med.* 38:2074, §5.3), so a pilot with MCSE $m_0$ on $n_0$ replicates needs

    $$n = \left\lceil n_0 \left(\frac{m_0}{m_\text{target}}\right)^2 \right\rceil$$

    replicates (at least 2).  For coverage, Morris et al.'s $n = c(1-c)/m_\text{target}^2$ is the same rule
    with the pilot's $c$.

    Parameters
    ----------
    pilot_mcse : float or DataFrame
        The pilot's MCSE, or a frame from :func:`performance_measures` (columns ``measure, mcse, n_reps``).
    pilot_n_reps : int
        Replicates of the pilot (number form only; a frame carries ``n_reps``).
    target_mcse : float or dict
        The MCSE wanted; with a frame, one number for all measures or ``{measure: target}``.
    measure : str or list of str, optional
        With a frame: the measures to size (default all rows).

    Returns
    -------
    int or DataFrame
        The number of replicates; with a frame, the (selected) pilot rows plus ``target_mcse`` and
        ``n_reps_needed`` (``<NA>`` where the pilot MCSE is missing).
    """
    if isinstance(pilot_mcse, pd.DataFrame):
        if pilot_n_reps is not None:
            raise TypeError("pilot_n_reps is read from the pilot frame's n_reps column; do not pass it with a frame.")
        if target_mcse is None:
            raise TypeError("n_reps_for() needs target_mcse (a number or a {measure: target} dict).")
        return _n_reps_frame(pilot_mcse, target_mcse, measure)
    if measure is not None:
        raise TypeError("measure= selects rows of a pilot frame; with a number pilot_mcse leave it out.")
    if isinstance(pilot_n_reps, bool) or not isinstance(pilot_n_reps, numbers.Integral) or pilot_n_reps < 2:
        raise ValueError(f"pilot_n_reps must be an integer >= 2 (the pilot's replicates), got {pilot_n_reps!r}.")
    if isinstance(target_mcse, Mapping) or target_mcse is None:
        raise TypeError(f"target_mcse must be a number > 0 with a number pilot_mcse, got {target_mcse!r}.")
    m0 = _check_positive("pilot_mcse", pilot_mcse, allow_zero=True)
    return _needed(m0, float(pilot_n_reps), _check_positive("target_mcse", target_mcse))
