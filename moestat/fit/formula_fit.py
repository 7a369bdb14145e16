r"""Formula fits: a :class:`moestat.formula.ModelDesign` as the inputs of one MoE.

A model whose gate and experts read different covariates (``gate_formula``) is fitted as the MoE on the union of
the two designs' columns, with the gate's slopes fixed at zero on expert-only columns and the experts' slopes fixed
at zero on gate-only columns (:class:`moestat.fit._layout.ParamLayout`'s ``gate_columns`` / ``expert_columns``):

.. math::
    p(y \mid x, w) = \sum_i \pi_i(w)\, \mathcal N(y;\, a_i^\top x + b_i,\, \sigma_i^2),
    \qquad u = (x, w) \text{ with } \beta_{1i}[x\text{-only}] = 0,\ a_i[w\text{-only}] = 0,

the concomitant-variable mixture of flexmix (Grün & Leisch 2008, ``concomitant = FLXPmultinom(~ w)``).  A term
that both formulas contain is one column used by both blocks.

Shared covariates (``shared="~ z"``, flexmix's ``FLXMRglmfix(fixed = ~ z)``) are further columns of the union,
placed after the experts' own, whose expert coefficient is one :math:`\gamma` common to every expert
(``shared_columns``; :class:`moestat.fit._layout.ParamLayout` writes it into every expert's slope row):
:math:`\eta_{tj} = b_j + a_j^\top x_t + \gamma^\top z_t`.  The union's column order is experts', shared, then
gate-only columns.

An offset (``offset="np.log(exposure)"``) is the last column of the union, with every expert's coefficient fixed at 1
and no gate coefficient (``offset_column``): :math:`\eta_{tj} = b_j + a_j^\top x_t + o_t`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..formula import ModelDesign, build_design


@dataclass(frozen=True)
class FormulaInputs:
    """The arrays of a formula fit.

    Attributes
    ----------
    X : ndarray (n, d)
        The union of the expert and gate covariates (expert columns first).
    y : ndarray (n,)
    weights : ndarray (n,) or None
    names : list of str
        Column names of ``X``.
    gate_columns, expert_columns : tuple of int
        The columns of ``X`` each block uses.
    design : ModelDesign
    shared_columns : tuple of int
        The columns of ``X`` with one coefficient common to all experts (empty without ``shared``).
    trials : ndarray (n,) or None
        Binomial trials of the rows kept.
    offset_column : int or None
        The column of ``X`` holding the offset (the last one), or None.
    """

    X: np.ndarray
    y: np.ndarray
    weights: np.ndarray | None
    names: list[str]
    gate_columns: tuple[int, ...]
    expert_columns: tuple[int, ...]
    design: ModelDesign
    shared_columns: tuple[int, ...] = ()
    trials: np.ndarray | None = None
    offset_column: int | None = None


def _union_names(design: ModelDesign) -> tuple[list[str], list[int]]:
    """Union column names (experts', shared, gate-only, then ``offset(...)``) and, for each gate-only column, its
    index in ``design.X_gate``."""
    names = list(design.expert_names) + list(design.shared_names)
    extra = [j for j, g in enumerate(design.gate_names) if g not in names]
    offset = [f"offset({design.offset_formula})"] if design.offset_formula is not None else []
    return names + [design.gate_names[j] for j in extra] + offset, extra


def union_matrix(design: ModelDesign, X: np.ndarray, X_gate: np.ndarray, X_shared: np.ndarray | None = None,
                 offset: np.ndarray | None = None) -> np.ndarray:
    """``[X, X_shared, X_gate[:, gate-only columns], offset]``: the inputs of the union MoE."""
    _, extra = _union_names(design)
    parts = [X] + ([X_shared] if X_shared is not None and X_shared.shape[1] else []) + \
        ([X_gate[:, extra]] if extra else []) + ([offset[:, None]] if offset is not None else [])
    return np.ascontiguousarray(np.concatenate(parts, axis=1)) if len(parts) > 1 else X


def _trials(trials: Any, data: Any, design: ModelDesign) -> np.ndarray | None:
    """Binomial trials as an array over the design's kept rows: a column name of ``data`` or one value per row."""
    if trials is None:
        return None
    if isinstance(trials, str):
        if not isinstance(data, pd.DataFrame) or trials not in data.columns:
            raise ValueError(f"trials={trials!r} is not a column of data; pass a column name or an array of "
                             f"{len(design.kept)} numbers of trials.")
        trials = data[trials]
    arr = np.asarray(trials.to_numpy() if isinstance(trials, pd.Series) else trials)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"trials must hold numbers of binomial trials, got an array of dtype {arr.dtype}.")
    if arr.ndim != 1 or arr.shape[0] != len(design.kept):
        raise ValueError(f"trials has shape {arr.shape} but data has {len(design.kept)} rows; pass one number of "
                         "trials per row of data (or a column name).")
    return np.array(arr[design.kept], dtype=np.float64)


def formula_inputs(formula: str, data: Any, *, gate_formula: str | None = None, weights: Any = None,
                   missing: str = "raise", context: dict[str, Any] | None = None, shared: str | None = None,
                   trials: Any = None, offset: str | None = None) -> FormulaInputs:
    """Build the design (:func:`moestat.build_design`) and the union MoE's arrays.

    ``shared`` (``"~ z"``) adds covariates with one coefficient common to all experts; ``trials`` (a column name
    of ``data`` or an array with one entry per row) are binomial trials, subset to the rows the design keeps (they
    must have no missing values); ``offset`` (``"np.log(exposure)"``) is the last column, with coefficient 1.

    Raises
    ------
    ValueError
        If a formula removes the intercept (moestat's gates and experts always have one).
    """
    design = build_design(formula, data, gate_formula=gate_formula, shared=shared, weights=weights,
                          missing=missing, context=context, offset=offset)
    if not design.expert_intercept:
        raise ValueError(f"formula={formula!r} removes the intercept ('0 +' or '- 1'); moestat's experts always "
                         "have one: drop the '0 +' / '- 1'.")
    if not design.gate_intercept:
        raise ValueError(f"gate_formula={gate_formula!r} removes the intercept; moestat's gate always has one: drop "
                         "the '0 +' / '- 1'.")
    names, _ = _union_names(design)
    if not names:
        raise ValueError(f"formula={formula!r} has no covariates; a mixture of experts needs at least one (for a "
                         "mixture of constants use an array fit with expert='constant').")
    gate_cols = tuple(sorted(names.index(g) for g in design.gate_names))
    d_e = len(design.expert_names)
    expert_cols = tuple(range(d_e))
    shared_cols = tuple(range(d_e, d_e + len(design.shared_names)))
    X = union_matrix(design, design.X, design.X_gate, design.X_shared, design.offset)
    return FormulaInputs(X, design.y, design.weights, names, gate_cols, expert_cols, design, shared_cols,
                         _trials(trials, data, design), None if design.offset is None else len(names) - 1)
