"""What the founding papers predict, as data: :func:`theory_rates` and the lookup :func:`predicted_rate`.

The rows live with their papers (``THEORY`` in each module of :mod:`moestat.papers`), which register them here
(:func:`register_theory`) when the package is imported; this module puts them in one frame and adds what a power fit
over a finite range of n would report.  It never imports a paper."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import pandas as pd

from .._validation import Constraint, validate_arguments
from ._core import regressor

__all__ = ["THEORY_COLUMNS", "predicted_rate", "register_theory", "theory_rates"]

THEORY_COLUMNS = ("source", "result", "gate", "regime", "expert", "examples", "quantity", "response", "regressor",
                  "rate", "exponent", "rate_model", "direction", "kind", "note")
"""The columns of a theory row (see :func:`theory_rates` for their meaning)."""

_ROWS: dict[str, list[dict[str, Any]]] = {}


def register_theory(source: str, rows: list[tuple[Any, ...]] | tuple[tuple[Any, ...], ...]) -> None:
    """Register (or replace) the theory rows of one paper, each a tuple in the order of :data:`THEORY_COLUMNS`.

    Raises ``ValueError`` when a row has the wrong length or names another source.
    """
    checked = []
    for row in rows:
        if len(row) != len(THEORY_COLUMNS):
            raise ValueError(f"theory row of {source!r} has {len(row)} fields; it needs {len(THEORY_COLUMNS)}: "
                             f"{THEORY_COLUMNS}.")
        if row[0] != source:
            raise ValueError(f"theory row {row[:2]!r} registered under source {source!r}; its first field must be "
                             "the source.")
        checked.append(dict(zip(THEORY_COLUMNS, row, strict=True)))
    _ROWS[source] = checked


class _NRange(Constraint):
    """A range of sample sizes ``(low, high)`` with ``1 < low < high``, both finite."""

    description = "(low, high) with 1 < low < high, both finite"

    def accepts_type(self, value: Any) -> bool:
        return (isinstance(value, (tuple, list, np.ndarray)) and len(value) == 2
                and all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in value))

    def accepts(self, value: Any) -> bool:
        return self.accepts_type(value) and bool(np.isfinite(value).all()) and 1 < value[0] < value[1]


class _Text(Constraint):
    """A string (a name looked up in the theory table)."""

    description = "a string"

    def accepts_type(self, value: Any) -> bool:
        return isinstance(value, str)


class _Regime(Constraint):
    """A regime label: an integer (e.g. 2) or its string form."""

    description = "an integer or a string (a regime label, e.g. 2)"

    def accepts_type(self, value: Any) -> bool:
        return isinstance(value, str) or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def _apparent_power_exponent(rate_model: str | None, exponent: float, n_range: tuple[float, float]) -> float:
    """Exponent a plain power fit reports for the noise-free theoretical curve on a log grid over n_range."""
    if rate_model is None or not np.isfinite(exponent):
        return np.nan
    n = np.logspace(np.log10(n_range[0]), np.log10(n_range[1]), 201)
    log_y = -exponent * regressor(rate_model, n)
    return -float(np.polyfit(np.log(n), log_y, 1)[0])


@validate_arguments(n_range=_NRange())
def theory_rates(n_range: tuple[float, float] = (1e3, 1e5)) -> pd.DataFrame:
    """The rates the founding papers predict, as a tidy frame to join against :func:`fit_rate` results.

    Sources: every module of :mod:`moestat.papers` — nguyen2024 (Table 1 and Theorems 1-5; its softmax rows cite
    its reference [26]), makkuva2020 (Theorem 4 and its derived sample complexity; heuristic parametric rates for
    Theorem 2), chowdhury2023 (Theorems 4.2-4.5: log-log slopes of sample and model complexity; upper bounds),
    nguyen2023 (softmax-gated Gaussian MoE: MLE rates by Voronoi cell size), nguyen2025_cosine (cosine and
    perturbed cosine routers), nguyen2024_temperature (a fitted temperature; the activation gate),
    nguyen2024_topk (top-K sparse softmax gating), nguyen2024_gaussian_gate (Gaussian-gated MoE),
    nguyen2025_shared (shared experts and normalised sigmoid gating) and yan2025_contaminated (contaminated MoE
    with a frozen expert).  Rows whose paper's body could not be read are of kind ``derived`` or ``claim`` and say
    so in their ``note``.

    Columns: ``source, result, gate, regime, expert, examples, quantity, response, regressor, rate``
    (as printed), ``exponent`` (alpha of ``response ~ regressor^-alpha`` for ``direction="decay"``; the
    slope of ``log response`` on ``log regressor`` for ``"growth"``; ``test_error_fixed_N`` rows are growth
    slopes in l, k, n), ``rate_model`` (the :func:`fit_rate` model that has this rate as a straight line),
    ``direction``, ``kind`` (``upper_bound``, ``lower_bound_minimax``, ``slower_than_polynomial``,
    ``upper_bound_slope``, ``derived``, ``no_rate``, ``claim``: a qualitative statement of a paper, no rate),
    ``power_exponent_in_range`` (what a plain power fit
    reports for the noise-free curve over ``n_range``, e.g. 0.445 for ``(log n / n)^{1/2}`` over
    [1e3, 1e5]), ``note``.
    """
    lo, hi = n_range
    if not (1 < lo < hi):
        raise ValueError(f"n_range must be (low, high) with 1 < low < high, got {n_range!r}.")
    cols = list(THEORY_COLUMNS)
    rows = [row for source_rows in _ROWS.values() for row in source_rows]
    out = pd.DataFrame(rows, columns=cols)
    out["power_exponent_in_range"] = [
        _apparent_power_exponent(m, e, n_range) if d == "decay" and r == "n" else np.nan
        for m, e, d, r in zip(out["rate_model"], out["exponent"], out["direction"], out["regressor"], strict=True)]
    return out[[*cols[:-1], "power_exponent_in_range", "note"]]


@validate_arguments(gate=_Text(), expert=_Text(), response=_Text(), regime=_Regime())
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


