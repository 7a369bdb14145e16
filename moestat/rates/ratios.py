r"""Sample-complexity ratios between two designs and scaling slopes judged against a theoretical bound.

Papers that compare two learners by the samples each needs (Chowdhury, Zhang, Wang, Liu & Chen 2023, ICML,
"Patch-level routing in mixture-of-experts is provably sample-efficient for CNNs": :math:`N_S/N_C`, and its
growth in :math:`n/l`) make three kinds of statement, each estimated here from the bootstrap draws that
:func:`moestat.rates.sample_complexity` already holds:

* a **ratio** :math:`n^*_a / n^*_b` of two groups' sample complexities (:func:`sample_complexity_ratio`);
* a **scaling slope** of :math:`\log n^*` in the log of a design knob, to be compared with a theoretical
  upper bound on that slope (:func:`scaling_against_bound`, built on :func:`moestat.rates.scaling_exponent`),
  or of a log ratio in the log of a knob (:func:`ratio_scaling_exponent`);
* at a fixed sample size, the slope of the log of a mean response (e.g. the test error) in the log of a knob,
  with an interval from resampling the replicates, which are paired across the knob's values
  (:func:`mean_log_slope`).

Theory of this kind gives sufficient sample sizes with hidden constants, so its exponents are *upper bounds*:
a measured slope whose interval reaches below the bound is consistent with it; only an interval lying wholly
above the bound contradicts it.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ._core import _check_level, _check_nboot
from .complexity import SampleComplexityResult, _order_stat_interval, scaling_exponent

__all__ = ["mean_log_slope", "ratio_scaling_exponent", "sample_complexity_ratio", "scaling_against_bound"]

MIN_BOOT = 100
"""Fewest usable bootstrap draws for a percentile interval of a slope (fewer: the interval is NaN)."""


def _check_result(result: Any) -> SampleComplexityResult:
    if not isinstance(result, SampleComplexityResult):
        raise TypeError(f"result must be a SampleComplexityResult from moestat.rates.sample_complexity, got "
                        f"{type(result).__name__}.")
    return result


def _key(result: SampleComplexityResult, key: Any, name: str) -> tuple[Any, ...]:
    """A group key of ``result`` given as a tuple of its ``by`` values, a single value or a ``{column: value}``."""
    by = result.config["by"]
    if isinstance(key, Mapping):
        missing = [c for c in by if c not in key]
        if missing:
            raise ValueError(f"{name}={dict(key)!r} must give every by column {by}; missing {missing}.")
        key = tuple(key[c] for c in by)
    elif not isinstance(key, tuple):
        key = (key,)
    if key not in result.draws:
        raise ValueError(f"{name}={key!r} is not a group of the sample-complexity result; its groups are "
                         f"{sorted(result.draws, key=str)} (values of {by}).")
    return tuple(key)


def _row(result: SampleComplexityResult, key: tuple[Any, ...]) -> pd.Series:
    by = result.config["by"]
    tab = result.table
    mask = np.ones(len(tab), dtype=bool)
    for c, v in zip(by, key, strict=True):
        mask &= (tab[c] == v).to_numpy()
    return tab[mask].iloc[0]


def sample_complexity_ratio(result: SampleComplexityResult, numerator: Any, denominator: Any, *,
                            confidence_level: float | None = None) -> pd.DataFrame:
    r"""Ratio :math:`n^*_a / n^*_b` of two groups' sample complexities, with a bootstrap interval.

    The point estimate is :math:`\hat n^*_a / \hat n^*_b` when both are uncensored.  The interval takes order
    statistics (as :func:`moestat.rates.sample_complexity` does) of the differences of the two groups'
    independent bootstrap draws,

    .. math:: \log n^{*(b)}_a - \log n^{*(b)}_b,\qquad b = 1, \dots, B,

    exponentiated.  Censored draws enter conservatively for a claim that design ``a`` needs *fewer* samples:
    a draw of ``b`` that never reaches the target (:math:`n^*_b > n_{max}`) enters as :math:`\log n_{max}`,
    and a draw of ``a`` reached at the smallest size (:math:`n^*_a \le n_{min}`) as :math:`\log n_{min}`;
    both make the ratio larger.  When ``b`` itself is right-censored the point is
    :math:`\hat n^*_a / n_{max}`, an upper bound (``bound="upper"``).  This is how Chowdhury et al. (2023,
    ICML, §5.1) state their claim that pMoE "only requires 60% of the training samples needed by CNN".

    Parameters
    ----------
    result : SampleComplexityResult
        From :func:`moestat.rates.sample_complexity`, with both groups among its ``by`` groups.
    numerator, denominator : tuple, scalar or dict
        The two groups: a tuple of the ``by`` values (in ``by`` order), one value when ``by`` has one
        column, or a ``{column: value}`` table.
    confidence_level : float, optional
        Default: the level of ``result``.

    Returns
    -------
    DataFrame
        One row: ``ratio, ci_low, ci_high, censored`` (``"<numerator>/<denominator>"`` censoring codes),
        ``bound`` (``"estimate"``, ``"upper"`` or ``"none"`` when no point can be given) and ``p_used``
        (share of bootstrap draws whose difference is defined).
    """
    result = _check_result(result)
    level = _check_level(result.config["ci"] if confidence_level is None else confidence_level)
    ka, kb = _key(result, numerator, "numerator"), _key(result, denominator, "denominator")
    pa, pb = _row(result, ka), _row(result, kb)
    b = np.where(np.isposinf(result.draws[kb]), np.log(pb["n_max"]), result.draws[kb])
    a = np.where(np.isneginf(result.draws[ka]), np.log(pa["n_min"]), result.draws[ka])
    with np.errstate(invalid="ignore"):
        diff = a - b
    diff = diff[~np.isnan(diff)]
    lo, hi = _order_stat_interval(diff, level) if diff.size else (np.nan, np.nan)
    if pa["censored"] == "none" and pb["censored"] == "none":
        point, bound = pa["n_star"] / pb["n_star"], "estimate"
    elif pa["censored"] == "none" and pb["censored"] == "right":
        point, bound = pa["n_star"] / pb["n_max"], "upper"
    else:
        point, bound = np.nan, "none"
    return pd.DataFrame([{"ratio": float(point), "ci_low": float(np.exp(lo)), "ci_high": float(np.exp(hi)),
                          "censored": f"{pa['censored']}/{pb['censored']}", "bound": bound,
                          "p_used": diff.size / a.size}])


def _centred_slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r"""OLS slope of ``y`` (..., m) on ``x`` (m,) along the last axis: :math:`\sum (x-\bar x) y / \sum (x-\bar x)^2`."""
    xc = x - x.mean()
    slope: np.ndarray = (y - y.mean(axis=-1, keepdims=True)) @ xc / (xc @ xc)
    return slope


def _interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    if draws.size < MIN_BOOT:
        return np.nan, np.nan
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def ratio_scaling_exponent(result: SampleComplexityResult, pairs: Sequence[tuple[Any, Any, float]], *,
                           confidence_level: float | None = None) -> pd.DataFrame:
    r"""Slope :math:`b` of :math:`\log(n^*_{num}/n^*_{den}) = c + b \log x` over several pairs of groups.

    Each pair ``(numerator, denominator, x)`` gives one point; the slope is OLS over the pairs whose two
    :math:`n^*` are both uncensored, and its interval refits the slope on the paired bootstrap draws of
    :math:`\log n^*_{num} - \log n^*_{den}` (draws with a censored value are skipped; at least
    100 usable draws are needed, else the interval is NaN).  Chowdhury et al. (2023, ICML, Thms 4.2-4.3) bound
    the CNN / pMoE ratio by :math:`(n/l)^8`: numerator the CNN, denominator pMoE, :math:`x = n/l`.

    Parameters
    ----------
    result : SampleComplexityResult
    pairs : sequence of (numerator key, denominator key, x)
        Keys as in :func:`sample_complexity_ratio`; ``x > 0``; at least 3 distinct ``x``.
    confidence_level : float, optional
        Default: the level of ``result``.

    Returns
    -------
    DataFrame
        One row: ``exponent, ci_low, ci_high, n_points`` (pairs), ``n_censored`` (pairs left out),
        ``boot_used`` and ``note`` (why the slope is NaN: fewer than 3 distinct uncensored ``x``).
    """
    result = _check_result(result)
    level = _check_level(result.config["ci"] if confidence_level is None else confidence_level)
    pts: list[tuple[tuple[Any, ...], tuple[Any, ...], float]] = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, tuple) or len(pair) != 3:
            raise TypeError(f"pairs[{i}]={pair!r} must be a (numerator, denominator, x) tuple.")
        num, den, x = pair
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not np.isfinite(x) or x <= 0:
            raise ValueError(f"pairs[{i}] has x={x!r}; x must be a positive finite number (its log is the regressor).")
        pts.append((_key(result, num, f"pairs[{i}] numerator"), _key(result, den, f"pairs[{i}] denominator"),
                    float(x)))
    if len({x for _, _, x in pts}) < 3:
        raise ValueError(f"pairs span {len({x for _, _, x in pts})} distinct x values; a slope needs at least 3.")
    ok = [(a, b, x) for a, b, x in pts if _row(result, a)["censored"] == "none"
          and _row(result, b)["censored"] == "none"]
    base = {"n_points": len(pts), "n_censored": len(pts) - len(ok)}
    if len({x for _, _, x in ok}) < 3:
        return pd.DataFrame([{"exponent": np.nan, "ci_low": np.nan, "ci_high": np.nan, **base, "boot_used": 0,
                              "note": f"only {len(ok)} pairs with both n* uncensored; need 3 values of x"}])
    lx = np.log([x for _, _, x in ok])
    ly = np.log([_row(result, a)["n_star"] / _row(result, b)["n_star"] for a, b, _ in ok])
    with np.errstate(invalid="ignore"):
        draws = np.column_stack([result.draws[a] - result.draws[b] for a, b, _ in ok])
    good = np.isfinite(draws).all(axis=1)
    lo, hi = _interval(_centred_slope(lx, draws[good]), level)
    return pd.DataFrame([{"exponent": float(_centred_slope(lx, ly)), "ci_low": lo, "ci_high": hi, **base,
                          "boot_used": int(good.sum()), "note": None}])


def _subset(result: SampleComplexityResult, table: pd.DataFrame) -> SampleComplexityResult:
    by = result.config["by"]
    keys = [tuple(r[c] for c in by) for _, r in table.iterrows()]
    return SampleComplexityResult(table.reset_index(drop=True), {k: result.draws[k] for k in keys},
                                  dict(result.config))


def scaling_against_bound(result: SampleComplexityResult, design: str, bound: float, *,
                          where: Mapping[str, Any] | None = None,
                          confidence_level: float | None = None) -> pd.DataFrame:
    r"""Scaling exponent of :math:`n^*` in ``design`` per group, next to a theoretical upper bound on it.

    Fits :math:`\log n^* = a + b \log(\text{design})` with :func:`moestat.rates.scaling_exponent` (OLS on the
    uncensored points, bootstrap interval) separately for each group of the other ``by`` columns, so that one
    group with too few uncensored points does not stop the others: that group's row carries the reason in
    ``note`` and NaN estimates; the warnings of a group's fit (dropped censored points, censored draws) go to
    its ``note`` too.  ``consistent`` is ``ci_low <= bound``: a sufficient-condition bound such as
    :math:`N_C = O(n^8)` (Chowdhury et al. 2023, ICML, Thm 4.3) is contradicted only by an interval wholly
    above it.

    Parameters
    ----------
    result : SampleComplexityResult
        With ``design`` among its ``by`` columns.
    design : str
        The knob (a positive ``by`` column).
    bound : float
        The theory's exponent for this response and knob (an upper bound on the slope).
    where : dict, optional
        Keep only the groups whose ``by`` columns equal these values.
    confidence_level : float, optional
        Default: the level of ``result``.

    Returns
    -------
    DataFrame
        The other ``by`` columns, ``design, theory_bound, exponent, ci_low, ci_high, n_points, n_censored,
        boot_used, consistent, note``.
    """
    result = _check_result(result)
    if isinstance(bound, bool) or not isinstance(bound, numbers.Real) or not np.isfinite(bound):
        raise ValueError(f"bound must be a finite number (the theory's exponent), got {bound!r}.")
    by = result.config["by"]
    if design not in by:
        raise ValueError(f"design={design!r} must be one of the by columns of the sample-complexity result ({by}); "
                         "add it to by= when calling sample_complexity.")
    where = dict(where or {})
    unknown = [c for c in where if c not in by]
    if unknown:
        raise ValueError(f"where={where!r} names {unknown}, which are not by columns of the result ({by}).")
    rest = [c for c in by if c != design]
    tab = result.table
    for c, v in where.items():
        tab = tab[tab[c] == v]
    if tab.empty:
        raise ValueError(f"where={where!r} matches no group of the sample-complexity result.")
    rows = []
    for key, sub in (tab.groupby(rest, sort=True) if rest else [((), tab)]):
        key = key if isinstance(key, tuple) else (key,)
        base = {**dict(zip(rest, key, strict=True)), "design": design, "theory_bound": float(bound)}
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fit = scaling_exponent(_subset(result, sub), design, confidence_level=confidence_level)
        except ValueError as err:
            rows.append({**base, "exponent": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n_points": len(sub),
                         "n_censored": int((sub["censored"] != "none").sum()), "boot_used": 0,
                         "consistent": np.nan, "note": str(err)})
            continue
        r = fit.iloc[0]
        note = "; ".join(str(w.message) for w in caught) or None
        rows.append({**base, "exponent": r["exponent"], "ci_low": r["ci_low"], "ci_high": r["ci_high"],
                     "n_points": int(r["n_points"]), "n_censored": int(r["n_censored"]),
                     "boot_used": int(r["boot_used"]),
                     "consistent": bool(r["ci_low"] <= bound) if np.isfinite(r["ci_low"]) else np.nan,
                     "note": note})
    return pd.DataFrame(rows)


def mean_log_slope(frame: pd.DataFrame, x: str, y: str, *, rep: str = "rep", n_resamples: int = 1000,
                   confidence_level: float = 0.95, seed: int | np.random.Generator | None = 0) -> pd.DataFrame:
    r"""Slope of :math:`\log \bar y(x)` on :math:`\log x`, with an interval from resampling replicates.

    :math:`\bar y(x)` is the mean of ``y`` over the replicates at knob value ``x`` and the slope is OLS,
    :math:`\hat b = \sum_j (u_j - \bar u)\log \bar y(x_j) / \sum_j (u_j - \bar u)^2` with :math:`u = \log x`.
    The interval resamples replicates (rows of the replicate x knob table, so the pairing across knob values
    — common random numbers — is kept), refits the slope on each draw's means and takes percentiles; draws
    with a non-positive mean are skipped, and with fewer than 100 usable draws the interval is NaN.  With
    fewer than 3 knob values or a non-positive mean the slope is NaN and no random numbers are drawn.  Chowdhury
    et al. (2023, ICML, Thm 4.5) bound the test error at fixed :math:`N` by :math:`k^{1/4} l^{3/8}` (slopes
    1/4 in :math:`\log k`, 3/8 in :math:`\log l`).

    Parameters
    ----------
    frame : DataFrame
        One row per (replicate, knob value).
    x, y : str
        The knob (positive) and the response (e.g. a test error).
    rep : str
        Replicate id column.
    n_resamples : int
        Bootstrap draws.
    confidence_level : float
    seed : int, Generator or None
        A Generator is used as is (to share one stream over several calls).

    Returns
    -------
    DataFrame
        One row: ``range_min, range_max, n_values, slope, ci_low, ci_high``.
    """
    missing = [f"{arg}={c!r}" for arg, c in (("x", x), ("y", y), ("rep", rep)) if c not in frame.columns]
    if missing:
        raise ValueError(f"{', '.join(missing)}: no such column in frame; columns are {list(frame.columns)}.")
    level = _check_level(confidence_level)
    n_resamples = _check_nboot(n_resamples)
    rng = np.random.default_rng(seed)
    table = frame.pivot_table(index=rep, columns=x, values=y)
    values = table.columns.to_numpy(float)
    if (values <= 0).any():
        raise ValueError(f"column x={x!r} must be positive to take logs; got {values[values <= 0].tolist()}.")
    base = {"range_min": float(values.min()) if values.size else np.nan,
            "range_max": float(values.max()) if values.size else np.nan, "n_values": int(values.size)}
    mean = table.mean()
    if values.size < 3 or (mean <= 0).any():
        return pd.DataFrame([{**base, "slope": np.nan, "ci_low": np.nan, "ci_high": np.nan}])
    uc = np.log(values) - np.log(values).mean()
    E = table.to_numpy()
    draws = E[rng.integers(0, len(E), size=(n_resamples, len(E)))].mean(1)   # (n_resamples, values)
    good = (draws > 0).all(1)
    lo, hi = _interval(np.log(draws[good]) @ uc / (uc @ uc), level)
    slope = float(np.log(mean.to_numpy()) @ uc / (uc @ uc))
    return pd.DataFrame([{**base, "slope": slope, "ci_low": lo, "ci_high": hi}])
