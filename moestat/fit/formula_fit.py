r"""Formula fits: a :class:`moestat.formula.ModelDesign` as the inputs of one MoE.

A model whose gate and experts read different covariates (``gate_formula``) is fitted as the MoE on the union of
the two designs' columns, with the gate's slopes fixed at zero on expert-only columns and the experts' slopes fixed
at zero on gate-only columns (:class:`moestat.fit._layout.ParamLayout`'s ``gate_columns`` / ``expert_columns``):

.. math::
    p(y \mid x, w) = \sum_i \pi_i(w)\, \mathcal N(y;\, a_i^\top x + b_i,\, \sigma_i^2),
    \qquad u = (x, w) \text{ with } \beta_{1i}[x\text{-only}] = 0,\ a_i[w\text{-only}] = 0,

the concomitant-variable mixture of flexmix (Grün & Leisch 2008, ``concomitant = FLXPmultinom(~ w)``).  A term
that both formulas contain is one column used by both blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formula import DesignMatrices, ModelDesign, build_design


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
    """

    X: np.ndarray
    y: np.ndarray
    weights: np.ndarray | None
    names: list[str]
    gate_columns: tuple[int, ...]
    expert_columns: tuple[int, ...]
    design: ModelDesign


def _union_names(design: ModelDesign) -> tuple[list[str], list[int]]:
    """Union column names and, for each gate-only column, its index in ``design.X_gate``."""
    names = list(design.expert_names)
    extra = [j for j, g in enumerate(design.gate_names) if g not in names]
    return names + [design.gate_names[j] for j in extra], extra


def union_matrix(design: ModelDesign, X: np.ndarray, X_gate: np.ndarray) -> np.ndarray:
    """``[X, X_gate[:, gate-only columns]]``: the inputs of the union MoE."""
    _, extra = _union_names(design)
    return np.ascontiguousarray(np.concatenate([X, X_gate[:, extra]], axis=1)) if extra else X


def transform_union(design: ModelDesign, new_data: Any) -> np.ndarray:
    """New data (a frame, columns found by name) as the union MoE's inputs."""
    m: DesignMatrices = design.transform(new_data)
    return union_matrix(design, m.X, m.X_gate)


def formula_inputs(formula: str, data: Any, *, gate_formula: str | None = None, weights: Any = None,
                   missing: str = "raise", context: dict[str, Any] | None = None) -> FormulaInputs:
    """Build the design (:func:`moestat.build_design`) and the union MoE's arrays.

    Raises
    ------
    ValueError
        If a formula removes the intercept (moestat's gates and experts always have one).
    """
    design = build_design(formula, data, gate_formula=gate_formula, weights=weights, missing=missing,
                          context=context)
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
    expert_cols = tuple(range(len(design.expert_names)))
    X = union_matrix(design, design.X, design.X_gate)
    return FormulaInputs(X, design.y, design.weights, names, gate_cols, expert_cols, design)
