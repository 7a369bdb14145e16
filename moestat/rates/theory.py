"""What the founding papers predict, as data: :func:`theory_rates` and the lookup :func:`predicted_rate`.

The rows live with their papers (``THEORY`` in each module of :mod:`moestat.papers`); this module puts them in one
frame and adds what a power fit over a finite range of n would report."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..papers import THEORY_COLUMNS, theory_rows
from ._core import regressor

__all__ = ["predicted_rate", "theory_rates"]


def _apparent_power_exponent(rate_model: str | None, exponent: float, n_range: tuple[float, float]) -> float:
    """Exponent a plain power fit reports for the noise-free theoretical curve on a log grid over n_range."""
    if rate_model is None or not np.isfinite(exponent):
        return np.nan
    n = np.logspace(np.log10(n_range[0]), np.log10(n_range[1]), 201)
    log_y = -exponent * regressor(rate_model, n)
    return -float(np.polyfit(np.log(n), log_y, 1)[0])


def theory_rates(n_range: tuple[float, float] = (1e3, 1e5)) -> pd.DataFrame:
    """The rates the founding papers predict, as a tidy frame to join against :func:`fit_rate` results.

    Sources: nguyen2024 (Table 1 and Theorems 1-5; its softmax rows cite its reference [26]), makkuva2020
    (Theorem 4 and its derived sample complexity; heuristic parametric rates for Theorem 2), chowdhury2023
    (Theorems 4.2-4.5: log-log slopes of sample and model complexity; upper bounds).

    Columns: ``source, result, gate, regime, expert, examples, quantity, response, regressor, rate``
    (as printed), ``exponent`` (alpha of ``response ~ regressor^-alpha`` for ``direction="decay"``; the
    slope of ``log response`` on ``log regressor`` for ``"growth"``; ``test_error_fixed_N`` rows are growth
    slopes in l, k, n), ``rate_model`` (the :func:`fit_rate` model that has this rate as a straight line),
    ``direction``, ``kind`` (``upper_bound``, ``lower_bound_minimax``, ``slower_than_polynomial``,
    ``upper_bound_slope``, ``derived``, ``no_rate``), ``power_exponent_in_range`` (what a plain power fit
    reports for the noise-free curve over ``n_range``, e.g. 0.445 for ``(log n / n)^{1/2}`` over
    [1e3, 1e5]), ``note``.
    """
    lo, hi = n_range
    if not (1 < lo < hi):
        raise ValueError(f"n_range must be (low, high) with 1 < low < high, got {n_range!r}.")
    cols = list(THEORY_COLUMNS)
    rows = theory_rows()
    out = pd.DataFrame(rows, columns=cols)
    out["power_exponent_in_range"] = [
        _apparent_power_exponent(m, e, n_range) if d == "decay" and r == "n" else np.nan
        for m, e, d, r in zip(out["rate_model"], out["exponent"], out["direction"], out["regressor"], strict=True)]
    return out[[*cols[:-1], "power_exponent_in_range", "note"]]


def predicted_rate(gate: str, expert: str, response: str, *, regime: int | str = 2) -> str:
    """The rate :func:`theory_rates` predicts for one gate, expert, response and regime, as printed ("" if none).

    A row applies when its ``response`` is ``response``, ``gate`` and ``regime`` (``"|"``-separated lists) contain
    the arguments, and ``examples`` lists ``expert`` or is empty; the first such row wins (rows for a named
    expert come before the generic ones of the same result).

    Examples
    --------
    >>> predicted_rate("softmax", "gelu", "over_param")
    '(log n / n)^{1/4}'
    >>> predicted_rate("sigmoid", "gelu", "over_param", regime=1)
    '(log n / n)^{1/4}'
    """
    table = theory_rates()
    hit = table[(table["response"] == response)
                & table["gate"].str.split("|").map(lambda gates: gate in gates)
                & table["regime"].map(lambda r: r == "" or str(regime) in r.split("|"))
                & table["examples"].map(lambda e: e == "" or expert in e.split("|"))]
    return str(hit["rate"].iloc[0]) if len(hit) else ""


