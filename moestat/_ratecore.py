"""Shared pieces of the rate modules: model transforms, input checks, per-n cells, weighted LS.

Private to :mod:`moestat.rates` and :mod:`moestat.sample_complexity`; the public names are re-exported
there.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

RATE_MODELS: dict[str, str] = {
    "power": "log y = c - alpha * log n",
    "power_log": "log y = c - alpha * log(n / log n)",
    "inverse_log": "log y = c - alpha * log(log n)",
}
_AGGS = (None, "mean", "median", "logmean")
_METHODS = ("cluster_bootstrap", "robust")
_INTERVALS = ("t", "percentile")
_RESAMPLE = ("within_n", "rep")
TABLE_COLUMNS = ["model", "exponent", "se", "ci_low", "ci_high", "intercept", "r2", "aic", "n_values", "replicates"]
MIN_N_VALUES = 3
RECOMMENDED_N_VALUES = 5
MIN_CLUSTERS = 10


class RateWarning(UserWarning):
    """A rate fit that is technically possible but statistically fragile (narrow range, few n values...)."""


# --------------------------------------------------------------------------------------------------
# validation helpers


def _as_list(name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return list(value)
    raise TypeError(f"{name} must be a column name or a list of column names, got {value!r}.")


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
        raise ValueError(f"ci must be a confidence level strictly between 0 and 1 (e.g. 0.95), got {ci!r}.")
    return float(ci)


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; valid values are {list(choices)}.")
    return value


def _check_nboot(n_boot: Any) -> int:
    if isinstance(n_boot, bool) or not isinstance(n_boot, numbers.Integral) or n_boot < 100:
        raise ValueError(f"n_boot must be an integer >= 100 (2000 or more for 95% intervals), got {n_boot!r}.")
    return int(n_boot)


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
    """Replicate-level data of one group, sorted by n: values[i] holds the y of every replicate at ns[i]."""

    ns: np.ndarray
    values: list[np.ndarray]
    reps: list[np.ndarray]

    @property
    def counts(self) -> np.ndarray:
        return np.array([len(v) for v in self.values])


def _cells(sub: pd.DataFrame, x: str, y: str, rep: str | None) -> _Cells:
    xs = sub[x].to_numpy(dtype=np.float64)
    ys = sub[y].to_numpy(dtype=np.float64)
    if rep is not None:
        rep_values = sub[rep].to_numpy()
        codes = pd.factorize(rep_values, sort=True)[0]
        order = np.lexsort((codes, xs))
        rep_values = rep_values[order]
    else:
        order = np.argsort(xs, kind="stable")
    xs, ys = xs[order], ys[order]
    ns, starts = np.unique(xs, return_index=True)
    bounds = np.r_[starts, len(xs)]
    values = [ys[bounds[i]:bounds[i + 1]] for i in range(len(ns))]
    reps = [rep_values[bounds[i]:bounds[i + 1]] if rep is not None else np.arange(bounds[i + 1] - bounds[i])
            for i in range(len(ns))]
    return _Cells(ns, values, reps)


def _prepare(frame: pd.DataFrame, y: str, x: str, by: list[str], rep: str | None,
             models: list[str]) -> dict[tuple, _Cells]:
    """Validate a tidy rate frame and split it into per-group cells."""
    _check_columns(frame, {"y": [y], "x": [x], "by": by, **({"rep": [rep]} if rep else {})})
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
    groups: dict[tuple, _Cells] = {}
    iterator = frame.groupby(by, sort=True, dropna=False) if by else [((), frame)]
    for key, sub in iterator:
        key = _group_key(key, by)
        if rep is not None and sub.duplicated([x, rep]).any():
            dup = sub.loc[sub.duplicated([x, rep], keep=False), [x, rep]].iloc[0].tolist()
            raise ValueError(f"{_key_text(key, by)} has several rows for ({x}, {rep}) = {tuple(dup)}; add the "
                             "columns that tell them apart (gate, expert, metric, ...) to by=.")
        cells = _cells(sub, x, y, rep)
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
