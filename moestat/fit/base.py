r"""The interface every moestat fit shares: :class:`FitResult`.

A fit is always batched over replicates (``R`` data sets fitted at once; ``R = 1`` for one data set) and
answers the same questions whatever the estimator:

* ``params`` — the estimates as :class:`moestat.Params`, one row per replicate;
* ``objective``, ``converged``, ``n_iter`` — per replicate; ``settings`` — every configuration knob;
  ``wall_time`` — seconds in the optimiser;
* :meth:`FitResult.tidy` — one row per replicate × atom × block × coefficient with the ``estimate`` (and
  ``std_error``, ``conf_low``, ``conf_high`` where the estimator has inference);
* :meth:`FitResult.glance` — one row per replicate: objective, convergence, iterations, fit criteria and the
  settings;
* :meth:`FitResult.summary` — a printable :class:`moestat.fit.results.Summary` of one replicate;
* :meth:`FitResult.select` — the same fit restricted to some replicates.

The column vocabulary follows the broom package of R (``tidy``/``glance``), which statisticians coming from
R already read.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..params import Params
from ..report import Result, Summary

TIDY_COLUMNS = ["rep", "block", "atom", "coef", "estimate"]
"""Columns every :meth:`FitResult.tidy` frame has (``block`` is ``"gate"`` or ``"expert"``; ``coef`` is
``"const"``, ``"x1"``, ..., or ``"log_sigma"``/``"sigma"`` for the noise scale)."""


def params_tidy(params: Params) -> pd.DataFrame:
    """:data:`TIDY_COLUMNS` frame of a (batched) Params: gate and expert intercepts (``const``), slopes
    (``x1`` ... ``xd``) and, when present, the expert noise scale (``sigma``)."""
    long = params.numpy().batched().to_frame()
    block = long["block"].map({"gate_bias": "gate", "gate_weight": "gate", "expert_bias": "expert",
                               "expert_weight": "expert", "noise_sd": "expert"})
    slope = long["block"].isin(["gate_weight", "expert_weight"])
    coef = np.where(slope, "x" + (long["coord"] + 1).astype(str),
                    np.where(long["block"] == "noise_sd", "sigma", "const"))
    out = pd.DataFrame({"rep": long["rep"], "block": block, "atom": long["atom"], "coef": coef,
                        "estimate": long["value"].astype(float)})
    order = {"const": -1, "sigma": 10**9}
    key = out["coef"].map(lambda c: order.get(c, int(c[1:]) if c.startswith("x") else 0))
    return (out.assign(_b=out["block"].map({"gate": 0, "expert": 1}), _k=key)
            .sort_values(["rep", "_b", "atom", "_k"], kind="stable").drop(columns=["_b", "_k"])
            .reset_index(drop=True))


def add_settings(frame: pd.DataFrame, settings: dict[str, Any], *, scalars_only: bool = False) -> pd.DataFrame:
    """Add each setting as a constant column of a :meth:`FitResult.glance` frame (columns already there win):
    scalars as they are, lists, tuples and dicts as text (skipped with ``scalars_only``)."""
    for key, value in settings.items():
        if key in frame:
            continue
        if isinstance(value, (int, float, str, bool)) or value is None:
            frame[key] = value
        elif isinstance(value, (list, tuple, dict)) and not scalars_only:
            frame[key] = str(value)
    return frame


def check_reps(rep: int | Sequence[int] | np.ndarray, n_reps: int) -> np.ndarray:
    """Replicate indices as a 1-d int array, each in ``[0, n_reps)`` (error names the argument)."""
    idx = np.atleast_1d(np.asarray(rep))
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"rep must be an integer or a non-empty sequence of integers, got {rep!r}.")
    if (idx < 0).any() or (idx >= n_reps).any():
        raise ValueError(f"rep must be in [0, {n_reps}), got {idx.tolist()}.")
    return idx.astype(np.int64)


class FitResult(Result):
    """Base class of moestat's fit results (see the module docstring for the shared interface).

    Subclasses provide ``params``, ``objective``, ``converged``, ``n_iter``, ``settings`` and ``wall_time``, and
    implement :meth:`glance` and :meth:`select`; :meth:`tidy` and :meth:`summary` have defaults built from them.
    """

    # ``converged``, ``n_iter``, ``settings`` and ``wall_time`` are fields or properties of each subclass
    params: Any
    objective: Any

    @property
    def n_reps(self) -> int:
        """Number of replicates R."""
        return int(np.atleast_1d(np.asarray(self.objective)).shape[0])

    def tidy(self) -> pd.DataFrame:
        """One row per replicate × block × atom × coefficient with its ``estimate`` (:data:`TIDY_COLUMNS`)."""
        return params_tidy(self.params)

    @abc.abstractmethod
    def glance(self) -> pd.DataFrame:
        """One row per replicate: objective, convergence, iterations, fit criteria and settings."""

    @abc.abstractmethod
    def select(self, rep: int | Sequence[int] | np.ndarray) -> FitResult:
        """The same fit restricted to replicate(s) ``rep`` (still batched)."""

    def summary(self, rep: int = 0) -> Summary:
        """A printable summary of replicate ``rep``: its :meth:`glance` row and :meth:`tidy` coefficients."""
        (r,) = check_reps(rep, self.n_reps)
        row = self.glance().iloc[int(r)]
        coef = self.tidy()
        coef = coef[coef["rep"] == r].drop(columns="rep").set_index(["block", "atom", "coef"])
        header = {str(k): (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items() if k != "rep"}
        return Summary(header, coef, pd.DataFrame(), [], title=f"{type(self).__name__}: replicate {int(r)}")


def weights_tidy(weights: dict[str, Any], atom_axis: dict[str, int | None]) -> pd.DataFrame:
    """:data:`TIDY_COLUMNS` frame of stacked network weights (deep fits): ``weights[name]`` has a leading replicate
    (or lane) axis; ``atom_axis[name]`` is the axis that indexes experts (``None``: no expert axis, atom -1); every
    other index is flattened into ``coef`` (``"i,j"``)."""
    parts = []
    for name, w in weights.items():
        if w is None:
            continue
        a = np.asarray(w.detach().cpu() if hasattr(w, "detach") else w, dtype=float)
        ax = atom_axis.get(name)
        if ax is not None:
            a = np.moveaxis(a, ax, 1)
        R = a.shape[0]
        lead = 2 if ax is not None else 1
        K = a.shape[1] if ax is not None else 1
        rest = a.shape[lead:]
        flat = a.reshape(R, K, -1)
        coefs = [",".join(map(str, ix)) for ix in np.ndindex(*rest)] if rest else ["0"]
        parts.append(pd.DataFrame({
            "rep": np.repeat(np.arange(R), K * len(coefs)), "block": name,
            "atom": np.tile(np.repeat(np.arange(K) if ax is not None else [-1], len(coefs)), R),
            "coef": np.tile(coefs, R * K), "estimate": flat.ravel(),
        }))
    return pd.concat(parts, ignore_index=True)[TIDY_COLUMNS]


def select_history(history: pd.DataFrame, idx: np.ndarray, column: str = "rep") -> pd.DataFrame:
    """Rows of a long history frame for replicates ``idx``, renumbered 0, 1, ... in the order of ``idx``."""
    if history is None or not len(history) or column not in history:
        return history
    renumber = {int(old): new for new, old in enumerate(idx)}
    out = history[history[column].isin(idx)].copy()
    out[column] = out[column].map(renumber)
    return out.reset_index(drop=True)


class FixedBudgetFit(FitResult):
    """A :class:`FitResult` of an estimator that runs a fixed iteration budget (the papers' protocols: SGD epochs,
    gradient-descent steps): there is no convergence test, so ``converged`` is False, ``n_iter`` is the budget
    (:meth:`_budget`), and ``settings`` is the fit's ``config``."""

    config: dict[str, Any]

    @abc.abstractmethod
    def _budget(self) -> int:
        """The iteration budget the estimator ran (epochs, steps)."""

    @property
    def converged(self) -> np.ndarray:
        return np.zeros(self.n_reps, dtype=bool)

    @property
    def n_iter(self) -> np.ndarray:
        return np.full(self.n_reps, self._budget())

    @property
    def settings(self) -> dict[str, Any]:
        """Every configuration knob (``config``)."""
        return self.config

    @property
    def wall_time(self) -> float:
        return float(self.config.get("wall_time", float("nan")))
