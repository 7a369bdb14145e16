r"""Model matrices of a mixture of GLM experts from Wilkinson formulas (Wilkinson & Rogers 1973), by formulaic.

A statistician's mixture of experts names three sets of covariates (flexmix's interface, Grün & Leisch 2008,
Journal of Statistical Software 28(4); its ``FLXMRglmfix`` for the shared part):

* the **experts'** covariates and the response, ``formula = "y ~ x1 + np.log(x2) + C(group)"``;
* the **gate's** covariates (the concomitant variables), ``gate_formula = "~ w1 + w2"``, by default the experts';
* optional **shared** covariates, ``shared = "~ z"``, whose coefficients are common to every expert.

:func:`build_design` turns them into numeric matrices with formulaic (so ``I(x**2)``, ``np.log(x)``, ``C(g)``,
interactions ``x:g`` and stateful transforms like ``center(x)`` work as in R / patsy) and keeps formulaic's model
specs, so :meth:`ModelDesign.transform` rebuilds the same columns for new data *by column name*, with the
categorical levels and transform state of the training data.

**Intercepts.**  moestat adds the column of ones itself (its design is :math:`Z = (1, X)`), so no matrix here
contains an intercept column: ``X`` and ``X_gate`` hold the covariates only, and
``expert_coef_names`` / ``gate_coef_names`` put ``"Intercept"`` first, in the order of the coefficients
:math:`(b, a)`.  A formula that removes the intercept (``"y ~ 0 + x"`` or ``"y ~ x - 1"``) sets
``expert_intercept`` (``gate_intercept``) to False; categorical terms are then coded with all their levels, as
in R.  Shared columns never have an intercept (the experts' own intercepts play that role), and a shared formula
must not remove it, so that its categorical terms are coded against a baseline level.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import functools
import importlib
import re
import sys
import types
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from formulaic import Formula, ModelSpec, model_matrix
from formulaic.errors import FormulaicError, FormulaParsingError
from formulaic.transforms import TRANSFORMS

from ._validation import validate_arguments

__all__ = ["MISSING", "DesignMatrices", "ModelDesign", "build_design"]

MISSING = ("raise", "drop")
"""The missing-data policies: ``"raise"`` (a ValueError naming the columns) or ``"drop"`` (drop those rows)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m|[\u29da\u29db]")  # formulaic's error highlighting
_BACKTICK = re.compile(r"`([^`]*)`")


# ------------------------------------------------------------------ formula parsing and variable discovery
def _clean(message: str) -> str:
    return _ANSI.sub("", message).strip()


@functools.lru_cache(maxsize=256)
def _formula(text: str) -> Any:
    """formulaic's parse of ``text``, once per distinct text (never mutated here; a parse error is not cached)."""
    return Formula(text)


def _parse(argument: str, text: Any, *, two_sided: bool) -> Any:
    """Parse ``text`` with formulaic; return the StructuredFormula (two-sided) or the right-hand side."""
    if not isinstance(text, str):
        raise TypeError(f"{argument} must be a formula string such as "
                        f"{'y ~ x1 + x2' if two_sided else '~ w1 + w2'!r}, got {type(text).__name__}.")
    try:
        parsed = _formula(text)
    except FormulaParsingError as exc:
        raise ValueError(f"{argument}={text!r} is not a valid formula: {_clean(str(exc))}") from None
    has_lhs = hasattr(parsed, "lhs")
    if two_sided:
        if not has_lhs:
            raise ValueError(f"formula={text!r} has no response; write it as 'y ~ x1 + x2' (the response left of ~).")
        if len(list(parsed.lhs)) != 1:
            raise ValueError(f"formula={text!r} has {len(list(parsed.lhs))} response terms; a mixture of experts "
                             "models one response (for binomial counts pass the proportion and trials).")
        rhs = parsed.rhs
    else:
        if has_lhs:
            raise ValueError(f"{argument}={text!r} has a left-hand side; it names covariates only, "
                             "e.g. '~ w1 + w2'.")
        rhs = parsed
    if isinstance(rhs, tuple):
        raise ValueError(f"{argument}={text!r} has several parts separated by '|'; pass the gate covariates as "
                         "gate_formula= and the shared ones as shared= instead.")
    return parsed


def _has_intercept(rhs: Any) -> bool:
    return any(str(term) == "1" for term in rhs)


@functools.lru_cache(maxsize=1024)
def _factor_names(expr: str) -> tuple[frozenset[str], frozenset[str]]:
    """Names an expression reads as values and names it calls or dereferences (functions, modules); once per
    distinct expression."""
    values = set(_BACKTICK.findall(expr))
    code = _BACKTICK.sub("_bq_", expr)  # a quoted name is a value; a placeholder keeps the expression parseable
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError:
        return frozenset(values), frozenset()
    functions: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                functions.add(node.func.id)
                if node.func.id == "Q" and node.args and isinstance(node.args[0], ast.Constant):
                    values.add(str(node.args[0].value))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            functions.add(node.value.id)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in functions and node.id != "_bq_":
            values.add(node.id)
    return frozenset(values), frozenset(functions)


def _formula_names(terms: Any) -> tuple[set[str], set[str]]:
    values: set[str] = set()
    functions: set[str] = set()
    for term in terms:
        for factor in term.factors:
            method = getattr(factor.eval_method, "value", factor.eval_method)
            if method == "literal":
                continue
            if method == "lookup":
                values.add(factor.expr)
                continue
            v, f = _factor_names(factor.expr)
            values |= v
            functions |= f
    return values, functions


def _resolve(argument: str, text: str, terms: Any, columns: pd.Index, namespace: Mapping[str, Any],
             context: dict[str, Any]) -> list[str]:
    """The data columns a formula reads; unknown names raise naming ``argument``; user objects go into ``context``."""
    values, functions = _formula_names(terms)
    used = []
    for name in sorted(values | functions):
        if name in columns:
            used.append(name)
        elif name in TRANSFORMS or hasattr(builtins, name):
            continue
        elif name in namespace:
            context[name] = namespace[name]
        elif name in values:
            close = difflib.get_close_matches(name, [str(c) for c in columns], n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"{argument}={text!r} uses the column {name!r}, which is not in data "
                             f"(columns: {', '.join(map(str, columns[:20]))}{'...' if len(columns) > 20 else ''})."
                             + hint)
        else:
            raise ValueError(f"{argument}={text!r} calls {name!r}, which is neither a column of data nor a known "
                             "function; pass it in context={...}.")
    return [c for c in columns if c in used]


# ------------------------------------------------------------------ checks on data
def _as_frame(name: str, data: Any) -> pd.DataFrame:
    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, Mapping):
        try:
            return pd.DataFrame(dict(data))
        except ValueError as exc:
            raise ValueError(f"{name} could not be made into a DataFrame: {exc}") from None
    raise TypeError(f"{name} must be a pandas DataFrame (or a dict of equal-length columns), "
                    f"got {type(data).__name__}.")


def _missing_rows(argument: str, frame: pd.DataFrame, columns: list[str], policy: str) -> np.ndarray:
    """Rows to keep (bool mask); with ``policy="raise"`` any missing value raises naming the columns."""
    if not columns:
        return np.ones(len(frame), dtype=bool)
    bad = np.zeros(len(frame), dtype=bool)
    counts = {}
    for c in columns:
        na = frame[c].isna().to_numpy().reshape(len(frame), -1).any(axis=1)  # a duplicated name gives a frame
        counts[c] = int(na.sum())
        bad |= na
    if bad.any() and policy == "raise":
        listed = ", ".join(f"{c!r} ({counts[c]} missing)" for c in columns if counts[c])
        raise ValueError(f"{argument} has missing values (NaN/None) in {int(bad.sum())} of {len(frame)} rows, in the "
                         f"columns the formulas use: {listed}. Impute them, or pass missing='drop' to drop those "
                         "rows.")
    keep: np.ndarray = ~bad
    return keep


def _check_weights(weights: Any, data: pd.DataFrame) -> np.ndarray | None:
    if weights is None:
        return None
    if isinstance(weights, str):
        if weights not in data.columns:
            raise ValueError(f"weights={weights!r} is not a column of data; pass a column name or an array of "
                             f"{len(data)} case weights.")
        weights = data[weights]
    if isinstance(weights, (pd.Series, pd.DataFrame)):
        weights = weights.to_numpy()
    arr = np.asarray(weights)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"weights must hold real numbers, got an array of dtype {arr.dtype}.")
    arr = np.array(arr, dtype=np.float64, copy=True)
    if arr.ndim != 1 or arr.shape[0] != len(data):
        raise ValueError(f"weights has shape {arr.shape} but data has {len(data)} rows; pass one case weight per "
                         "row of data.")
    return arr


def _validate_weights(arr: np.ndarray) -> None:
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"weights must be finite and non-negative; {int(bad.sum())} are not "
                         f"(e.g. {float(arr[i]):g} at row {i}). Drop those rows or fix the weights.")
    if not arr.sum() > 0:
        raise ValueError("weights are all zero; at least one row needs a positive case weight.")


def _categorical_levels(spec: ModelSpec) -> dict[str, list[Any]]:
    """Column -> levels of the categorical factors that are a column or ``C(column, ...)``."""
    out: dict[str, list[Any]] = {}
    for expr, (kind, state) in spec.encoder_state.items():
        if getattr(kind, "value", kind) != "categorical" or "categories" not in state:
            continue
        name = expr
        m = re.fullmatch(r"C\(\s*(`[^`]*`|[A-Za-z_][A-Za-z0-9_.]*)\s*(,.*)?\)", expr, flags=re.S)
        if m:
            name = m.group(1).strip("`")
        out[name] = list(state["categories"])
    return out


def _check_levels(frame: pd.DataFrame, levels: dict[str, list[Any]]) -> None:
    for column, known in levels.items():
        if column not in frame.columns:
            continue
        values = pd.unique(frame[column].dropna())
        unseen = [v for v in values if v not in set(known)]
        if unseen:
            raise ValueError(f"new_data column {column!r} has levels {unseen!r} that the design's data did not have "
                             f"(known levels: {known!r}); their effects are not estimated. Drop or recode those "
                             "rows.")


# ------------------------------------------------------------------ materialisation
def _materialize(argument: str, text: str, spec: Any, frame: pd.DataFrame, context: dict[str, Any]) -> Any:
    """formulaic model matrix (or matrices) of ``spec`` (a formula or a ModelSpec) on ``frame``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if isinstance(spec, ModelSpec):
                out = spec.get_model_matrix(frame, context=context)
            else:
                out = model_matrix(spec, frame, context=context, na_action="ignore", output="numpy")
        except FormulaicError as exc:
            raise ValueError(f"{argument}={text!r} could not be evaluated on the data: {_clean(str(exc))}") from None
    for w in caught:
        if type(w.message).__name__ == "DataMismatchWarning":
            raise ValueError(f"{argument}={text!r}: {w.message}; drop or recode those rows.")
        if not issubclass(w.category, RuntimeWarning):  # NaN/inf from a transform: _numeric raises a clearer error
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out


def _materialize_parts(parts: dict[str, tuple[str, str, Any]], frame: pd.DataFrame, context: dict[str, Any]
                       ) -> dict[str, Any]:
    """Model matrices of every formula part, ``{part: (argument, text, parsed)}``, from one formulaic call.

    formulaic then evaluates each factor once for all parts and pools their per-call set-up (a quarter to a third of
    the time of one call per part on a few hundred rows).  The matrices and model specs are those of one call per
    part.  If the joint call fails or warns of data it cannot encode, the parts are materialised one at a time, so
    the error names the argument whose formula caused it (:func:`_materialize`).
    """
    caught: list[warnings.WarningMessage] | None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            joint = Formula(**{name: parsed for name, (_, _, parsed) in parts.items()})
            out = model_matrix(joint, frame, context=context, na_action="ignore", output="numpy")
        except FormulaicError:
            caught = None
    if caught is None or any(type(w.message).__name__ == "DataMismatchWarning" for w in caught):
        return {name: _materialize(argument, text, parsed, frame, context)
                for name, (argument, text, parsed) in parts.items()}
    for w in caught:
        if not issubclass(w.category, RuntimeWarning):  # NaN/inf from a transform: _numeric raises a clearer error
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return {name: getattr(out, name) for name in parts}


def _numeric(argument: str, text: str, mm: Any, *, drop_intercept: bool) -> tuple[np.ndarray, tuple[str, ...]]:
    names = [str(c) for c in mm.model_spec.column_names]
    arr = mm.to_numpy(dtype=np.float64) if hasattr(mm, "to_numpy") else np.asarray(mm, dtype=np.float64)
    if drop_intercept and "Intercept" in names:
        j = names.index("Intercept")
        arr = np.delete(arr, j, axis=1)
        names.pop(j)
    bad = ~np.isfinite(arr)
    if bad.any():
        cols = [names[j] for j in np.flatnonzero(bad.any(axis=0))]
        raise ValueError(f"{argument}={text!r} gives non-finite values (NaN or inf) in {int(bad.any(axis=1).sum())} "
                         f"rows of the columns {cols} (e.g. np.log of a value <= 0); transform or drop those rows.")
    return np.array(arr, dtype=np.float64, order="C", copy=True), tuple(names)  # writable (torch.as_tensor needs it)


def _check_response_column(text: str, terms: Any, frame: pd.DataFrame) -> None:
    for term in terms:
        for factor in term.factors:
            if getattr(factor.eval_method, "value", factor.eval_method) != "lookup":
                continue
            col = frame[factor.expr]
            if not (pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col)):
                raise TypeError(f"the response {factor.expr!r} of formula={text!r} must be numeric, got dtype "
                                f"{col.dtype}; recode it (e.g. a 0/1 column for a binomial response).")


def _response(text: str, mm: Any) -> tuple[np.ndarray, str]:
    names = [str(c) for c in mm.model_spec.column_names]
    if len(names) != 1:
        raise TypeError(f"the response of formula={text!r} must be one numeric column; it was encoded as the "
                        f"{len(names)} columns {names} (a categorical response). Recode it as numbers.")
    y, _ = _numeric("formula", text, mm, drop_intercept=False)
    return y[:, 0], names[0]


# ------------------------------------------------------------------ the design objects
@dataclass(frozen=True, eq=False)
class DesignMatrices:
    """Matrices of :meth:`ModelDesign.transform` for new data (no intercept columns; see :mod:`moestat.formula`).

    Attributes
    ----------
    y : ndarray (n,) or None
        The response, when new_data has the columns it needs.
    X, X_gate : ndarray (n, d), (n, d_gate)
        Expert and gate covariates, in the columns of the design.
    X_shared : ndarray (n, q) or None
    index : pandas.Index
        The labels of the rows kept.
    kept : ndarray of bool (len(new_data),)
        Which rows of new_data were kept.
    n_dropped : int
    offset : ndarray (n,) or None
        The offset of the rows kept (a design with ``offset``).
    """

    y: np.ndarray | None
    X: np.ndarray
    X_gate: np.ndarray
    X_shared: np.ndarray | None
    index: pd.Index
    kept: np.ndarray
    n_dropped: int
    offset: np.ndarray | None = None


class _Specs:
    """formulaic's model specs and the user objects the formulas call (picklable: modules by name)."""

    def __init__(self, response: ModelSpec, expert: ModelSpec, gate: ModelSpec | None, shared: ModelSpec | None,
                 columns: dict[str, list[str]], context: dict[str, Any], offset: ModelSpec | None = None) -> None:
        self.response, self.expert, self.gate, self.shared, self.offset = response, expert, gate, shared, offset
        self.columns, self.context = columns, context

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["context"] = {k: ("__module__", v.__name__) if isinstance(v, types.ModuleType) else v
                            for k, v in self.context.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        ctx = state["context"]
        state["context"] = {k: importlib.import_module(v[1]) if isinstance(v, tuple) and len(v) == 2
                            and v[0] == "__module__" else v for k, v in ctx.items()}
        self.__dict__.update(state)


@dataclass(frozen=True, eq=False)
class ModelDesign:
    """Numeric design of a mixture of GLM experts, built by :func:`build_design`.

    Attributes
    ----------
    formula, gate_formula, shared_formula : str (gate / shared: or None)
    response_name : str
        The response column (or expression, e.g. ``"np.log(y)"``).
    y : ndarray (n,)
    X : ndarray (n, d)
        Expert covariates, no intercept column; column names ``expert_names``.
    X_gate : ndarray (n, d_gate)
        Gate covariates, no intercept column (the expert covariates when ``gate_formula`` is None).
    X_shared : ndarray (n, q) or None
        Covariates whose coefficients all experts share (never an intercept).
    expert_intercept, gate_intercept : bool
        Whether moestat adds an intercept to the experts / the gate (False when a formula removes it).
    weights : ndarray (n,) or None
        Case (frequency) weights of the rows kept; None when not given.
    missing : {"raise", "drop"}
    n_dropped : int
        Rows dropped for missing values.
    index : pandas.Index
        The labels of the rows kept (``data.index[kept]``).
    kept : ndarray of bool (len(data),)
        Which rows of data were kept.
    offset_formula : str or None
        The offset expression (``offset=``), e.g. ``"np.log(exposure)"``.
    offset : ndarray (n,) or None
        Its values on the rows kept: a known term of every expert's linear predictor, coefficient fixed at 1.
    """

    formula: str
    gate_formula: str | None
    shared_formula: str | None
    response_name: str
    y: np.ndarray
    X: np.ndarray
    expert_names: tuple[str, ...]
    expert_intercept: bool
    X_gate: np.ndarray
    gate_names: tuple[str, ...]
    gate_intercept: bool
    X_shared: np.ndarray | None
    shared_names: tuple[str, ...]
    weights: np.ndarray | None
    missing: str
    n_dropped: int
    index: pd.Index
    kept: np.ndarray
    _specs: _Specs = field(repr=False)
    offset_formula: str | None = None
    offset: np.ndarray | None = None

    def __repr__(self) -> str:
        parts = [f"formula={self.formula!r}"]
        parts += [f"gate_formula={self.gate_formula!r}"] if self.gate_formula is not None else []
        parts += [f"shared={self.shared_formula!r}"] if self.shared_formula is not None else []
        parts += [f"offset={self.offset_formula!r}"] if self.offset_formula is not None else []
        parts += [f"n={self.n}", f"expert_coef_names={self.expert_coef_names}"]
        parts += [f"gate_coef_names={self.gate_coef_names}"] if self.separate_gate else []
        parts += [f"shared_names={self.shared_names}"] if self.X_shared is not None else []
        parts += ["weights=..."] if self.weights is not None else []
        parts += [f"n_dropped={self.n_dropped}"] if self.n_dropped else []
        return f"ModelDesign({', '.join(parts)})"

    @property
    def n(self) -> int:
        """Number of observations (rows kept)."""
        return int(self.y.shape[0])

    @property
    def d(self) -> int:
        """Number of expert covariates (columns of ``X``)."""
        return int(self.X.shape[1])

    @property
    def separate_gate(self) -> bool:
        """Whether the gate has its own covariates (``gate_formula`` was given)."""
        return self.gate_formula is not None

    @property
    def expert_coef_names(self) -> tuple[str, ...]:
        """Names of each expert's coefficients in moestat's order: ``"Intercept"`` (if any), then ``expert_names``."""
        return (("Intercept",) if self.expert_intercept else ()) + self.expert_names

    @property
    def gate_coef_names(self) -> tuple[str, ...]:
        """Names of each gate row's coefficients: ``"Intercept"`` (if any), then ``gate_names``."""
        return (("Intercept",) if self.gate_intercept else ()) + self.gate_names

    @property
    def data_columns(self) -> tuple[str, ...]:
        """The columns of data the formulas read (response, experts, gate, shared)."""
        seen: dict[str, None] = {}
        for cols in self._specs.columns.values():
            seen.update(dict.fromkeys(cols))
        return tuple(seen)

    def transform(self, new_data: Any, *, missing: str | None = None) -> DesignMatrices:
        """The expert, gate and shared matrices (and the response, when present) of ``new_data``.

        Columns are found by name with formulaic's stored model specs, so the column order of ``new_data`` does not
        matter, categorical terms keep the design's levels (a level the design's data did not have raises
        ``ValueError`` naming the column) and stateful transforms (``center(x)``, ``scale(x)``) keep the design's
        state.  ``missing`` (default: the design's policy) treats rows with missing values in the columns used.

        Raises
        ------
        ValueError
            If ``new_data`` lacks a covariate column (named in the message), has unseen categorical levels, or
            (``missing="raise"``) missing values.
        """
        policy = self.missing if missing is None else missing
        if policy not in MISSING:
            raise ValueError(f"missing={policy!r} is not supported; valid values are {list(MISSING)}.")
        frame = _as_frame("new_data", new_data)
        sp = self._specs
        needed = [c for part in ("expert", "gate", "shared", "offset") for c in sp.columns.get(part, [])]
        absent = [c for c in dict.fromkeys(needed) if c not in frame.columns]
        if absent:
            raise ValueError(f"new_data lacks the column(s) {absent} that the design's formulas use; "
                             f"it has {list(map(str, frame.columns))}.")
        with_y = all(c in frame.columns for c in sp.columns["response"])
        used = list(dict.fromkeys(needed + (sp.columns["response"] if with_y else [])))
        keep = _missing_rows("new_data", frame, used, policy)
        sub = frame.iloc[np.flatnonzero(keep)] if not keep.all() else frame
        if len(sub) == 0:
            raise ValueError("new_data has no rows left after dropping rows with missing values.")
        specs = [s for s in (sp.expert, sp.gate, sp.shared, getattr(sp, "offset", None)) if s is not None]
        for s in specs:
            _check_levels(sub, _categorical_levels(s))
        X, _ = _numeric("formula", self.formula, _materialize("formula", self.formula, sp.expert, sub, sp.context),
                        drop_intercept=True)
        X_gate = X
        if sp.gate is not None and self.gate_formula is not None:
            mm = _materialize("gate_formula", self.gate_formula, sp.gate, sub, sp.context)
            X_gate, _ = _numeric("gate_formula", self.gate_formula, mm, drop_intercept=True)
        X_shared = None
        if sp.shared is not None and self.shared_formula is not None:
            mm = _materialize("shared", self.shared_formula, sp.shared, sub, sp.context)
            X_shared, _ = _numeric("shared", self.shared_formula, mm, drop_intercept=True)
        offset = None
        if getattr(sp, "offset", None) is not None and self.offset_formula is not None:
            mm = _materialize("offset", self.offset_formula, sp.offset, sub, sp.context)
            offset = _numeric("offset", self.offset_formula, mm, drop_intercept=True)[0][:, 0]
        y = None
        if with_y:
            y, _ = _response(self.formula, _materialize("formula", self.formula, sp.response, sub, sp.context))
        return DesignMatrices(y, X, X_gate, X_shared, sub.index, keep, int((~keep).sum()), offset)


def _caller_namespace(depth: int) -> dict[str, Any]:
    """The variables of the caller ``depth`` frames up, skipping the argument-check wrapper of the public function."""
    frame = sys._getframe(depth + 1)
    while frame.f_globals.get("__name__") == validate_arguments.__module__ and frame.f_back is not None:
        frame = frame.f_back
    return {**frame.f_globals, **frame.f_locals}


@validate_arguments()  # formula, data and the options naming columns or formulas are checked against data
def build_design(formula: str, data: Any, *, gate_formula: str | None = None, shared: str | None = None,
                 weights: Any = None, missing: str = "raise",
                 context: Mapping[str, Any] | None = None, offset: str | None = None) -> ModelDesign:
    """Build the response, expert, gate and shared matrices of a mixture of GLM experts from formulas.

    Parameters
    ----------
    formula : str
        ``"y ~ x1 + x2"``: the response and the experts' covariates.  Terms follow Wilkinson & Rogers (1973) as
        formulaic reads them: ``I(x**2)``, ``np.log(x)``, ``C(g)`` (or a string/categorical column ``g``),
        interactions ``x:g`` / ``x*g``, ``center(x)``, ``poly(x, 2)``, ``bs(x, df=4)``.
    data : pandas.DataFrame (or a dict of columns)
    gate_formula : str, optional
        ``"~ w1 + w2"``: the gate's covariates; default the experts'.
    shared : str, optional
        ``"~ z"``: covariates with one coefficient common to all experts (flexmix's ``FLXMRglmfix(fixed = ~ z)``).
        They must not also be expert covariates.
    weights : array-like (len(data),) or str, optional
        Case (frequency) weights, or the name of a column of data holding them: finite and non-negative.
    missing : {"raise", "drop"}
        Rows with a missing value (NaN, None, NaT) in any column the formulas read (or the weights column):
        ``"raise"`` raises a ValueError naming the columns and the count; ``"drop"`` drops them and records
        ``n_dropped``, ``kept`` and ``index``.
    context : mapping, optional
        Names the formulas call that are not columns (your own functions); default: the caller's variables.
        numpy is always available as ``np``.
    offset : str, optional
        ``"np.log(exposure)"`` or a column name: one numeric term added to every expert's linear predictor with
        coefficient 1 (an exposure or a known part of the mean; R's ``offset()``, statsmodels' ``offset=``).

    Returns
    -------
    ModelDesign
        No matrix has an intercept column (moestat adds it; see :mod:`moestat.formula`).

    Raises
    ------
    ValueError
        A formula naming a column that data lacks (the message names the argument and the column), a missing
        response, missing values under ``missing="raise"``, invalid weights, a column both expert and shared.
    TypeError
        A non-numeric response, data that is not a DataFrame.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> df = pd.DataFrame({"y": [1.0, 2.0, 0.5, 3.0], "x": [1.0, 2.0, 3.0, 4.0], "g": list("abab")})
    >>> design = build_design("y ~ np.log(x) + C(g)", df)
    >>> design.expert_coef_names
    ('Intercept', 'np.log(x)', 'C(g)[T.b]')
    """
    if missing not in MISSING:
        raise ValueError(f"missing={missing!r} is not supported; valid values are {list(MISSING)}.")
    frame = _as_frame("data", data)
    if len(frame) == 0:
        raise ValueError("data has no rows.")
    if context is not None and not isinstance(context, Mapping):
        raise TypeError(f"context must be a mapping of names to objects, got {type(context).__name__}.")
    namespace = dict(context) if context is not None else _caller_namespace(1)
    parsed = _parse("formula", formula, two_sided=True)
    gate_parsed = None if gate_formula is None else _parse("gate_formula", gate_formula, two_sided=False)
    shared_parsed = None if shared is None else _parse("shared", shared, two_sided=False)
    if offset is not None and not isinstance(offset, str):
        raise TypeError(f"offset must be a column name or an expression of columns such as 'np.log(exposure)', got "
                        f"{type(offset).__name__}; add an array to data as a column and name it.")
    offset_parsed = None if offset is None else _parse("offset", f"~ 0 + {offset}", two_sided=False)
    if shared_parsed is not None and not _has_intercept(shared_parsed):
        raise ValueError(f"shared={shared!r} removes the intercept; keep it (it is dropped anyway: shared columns "
                         "are coded against the experts' own intercepts), e.g. write '~ z' instead of '~ 0 + z'.")
    ctx: dict[str, Any] = {}
    columns = {
        "response": _resolve("formula", formula, parsed.lhs, frame.columns, namespace, ctx),
        "expert": _resolve("formula", formula, parsed.rhs, frame.columns, namespace, ctx),
        "gate": [] if gate_parsed is None else _resolve("gate_formula", str(gate_formula), gate_parsed,
                                                        frame.columns, namespace, ctx),
        "shared": [] if shared_parsed is None else _resolve("shared", str(shared), shared_parsed, frame.columns,
                                                            namespace, ctx),
        "offset": [] if offset_parsed is None else _resolve("offset", str(offset), offset_parsed, frame.columns,
                                                            namespace, ctx),
    }
    if not columns["response"] and not list(parsed.lhs):
        raise ValueError(f"formula={formula!r} has no response; write it as 'y ~ x1 + x2'.")
    _check_response_column(formula, parsed.lhs, frame)
    w_all = _check_weights(weights, frame)
    used = list(dict.fromkeys([c for cols in columns.values() for c in cols]
                              + ([weights] if isinstance(weights, str) else [])))
    keep = _missing_rows("data", frame, used, missing)
    sub = frame.iloc[np.flatnonzero(keep)] if not keep.all() else frame
    if len(sub) == 0:
        raise ValueError("data has no rows left after dropping rows with missing values.")
    w = None if w_all is None else w_all[keep]
    if w is not None:
        _validate_weights(w)
    parts = {"lhs": ("formula", formula, parsed.lhs), "rhs": ("formula", formula, parsed.rhs)}
    for name, text, part in (("gate", gate_formula, gate_parsed), ("shared", shared, shared_parsed),
                             ("offset", offset, offset_parsed)):
        if part is not None:
            parts[name] = (name if name != "gate" else "gate_formula", str(text), part)
    mms = _materialize_parts(parts, sub, ctx)
    y, response_name = _response(formula, mms["lhs"])
    X, expert_names = _numeric("formula", formula, mms["rhs"], drop_intercept=True)
    gate_spec = X_gate = None
    gate_names, gate_intercept = expert_names, _has_intercept(parsed.rhs)
    if gate_parsed is not None:
        mm = mms["gate"]
        gate_spec = mm.model_spec
        X_gate, gate_names = _numeric("gate_formula", str(gate_formula), mm, drop_intercept=True)
        gate_intercept = _has_intercept(gate_parsed)
    shared_spec = X_shared = None
    shared_names: tuple[str, ...] = ()
    if shared_parsed is not None:
        mm = mms["shared"]
        shared_spec = mm.model_spec
        X_shared, shared_names = _numeric("shared", str(shared), mm, drop_intercept=True)
        both = sorted(set(shared_names) & set(expert_names))
        if both:
            raise ValueError(f"shared={shared!r} and formula={formula!r} both contain {both}; a column is either "
                             "expert-specific or shared. Remove it from one of them.")
    offset_spec = off = None
    if offset_parsed is not None:
        mm = mms["offset"]
        offset_spec = mm.model_spec
        off_matrix, off_names = _numeric("offset", str(offset), mm, drop_intercept=True)
        if off_matrix.shape[1] != 1:
            raise ValueError(f"offset={offset!r} must give one numeric column; it gives {list(off_names)} (a "
                             "categorical term?). Pass a numeric column or expression, e.g. 'np.log(exposure)'.")
        off = off_matrix[:, 0]
    specs = _Specs(mms["lhs"].model_spec, mms["rhs"].model_spec, gate_spec, shared_spec, columns, ctx, offset_spec)
    return ModelDesign(formula=formula, gate_formula=gate_formula, shared_formula=shared, response_name=response_name,
                       y=y, X=X, expert_names=expert_names, expert_intercept=_has_intercept(parsed.rhs),
                       X_gate=X if X_gate is None else X_gate, gate_names=gate_names, gate_intercept=gate_intercept,
                       X_shared=X_shared, shared_names=shared_names, weights=w, missing=missing,
                       n_dropped=int((~keep).sum()), index=sub.index, kept=keep, _specs=specs,
                       offset_formula=offset, offset=off)
