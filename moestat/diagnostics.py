r"""Checks that a rate study's answer is a property of its data: optimiser invariance and design adequacy.

Two questions come before any exponent is read.

*Does the answer move with the optimiser?*  :func:`optimizer_invariance` compares a study's primary fits
with a second fit of the *same* data by another solver (the ``*_alt`` columns that
``Study(fit={"options": {"invariance": "lm"}})`` writes).  Per row it reports whether the two responses
agree, and on the scale of the data how far apart the two objectives are,

.. math::

    \Delta = \frac{n\,(F_\text{alt} - F)}{\nu},

the difference of the two residual sums of squares in units of the noise variance :math:`\nu` (a
likelihood-ratio statistic under Gaussian noise).  :math:`|\Delta| < 1` with responses that differ means the
data cannot tell the two estimates apart: the response is not determined by the data at that n (a flat
objective), whatever the solver.  Per group it fits the rate of the response on both columns and
reports the shift of the exponent.  :func:`lowest_objective` adds, per row, the responses of the solver
that reached the lower objective: the better approximation of the least-squares estimator.

*Can the design decide?*  :func:`design_check` tests a planned design against the rules of the
gate-comparison study (docs/representations.md, docs/vignettes/sigmoid-vs-softmax.md): at least
``min_obs_per_param`` observations per free parameter at the smallest n, at least ``min_decades``
decades of n, at least ``min_truths`` truth draws (truth is the resampling unit of the intervals), and
per truth the L2 gap of the weight-split basin, :math:`\|f_{\bar G} - f_{G^*}\|_{L^2(\mu)}` for the best
noise-free k-atom fit started from a split of a true atom (:func:`moestat.estimate_gbar`), against the
statistical resolution :math:`\sqrt{\nu P / n_\max}`.  A gap far below the resolution but not zero is a
floor: the fits sit in a basin whose limit is not an exact representation of :math:`f_{G^*}`, the data at
:math:`n_\max` cannot push them out, and parameter errors stall.  The gap is only as good as the optimiser's
convergence: for sigmoid-gelu truths at gate variance 1 the converged splits end at exact dead-atom
representations (gap about 0), where L-BFGS had stopped 1e-7 to 1e-4 away.  A zero gap (an exact
representation) is no floor: the representation errors measure against it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ._validation import Boolean, Choice, Integer, Real, Seed, check_int, renamed_arguments, validate_arguments
from .model import MoE
from .params import Params
from .rates import RateWarning, compare_rates, fit_rate

INVARIANCE_COLUMNS = ["response", "pairs", "both_converged", "agree", "median_abs_log_ratio", "objective_delta_median",
                      "objective_delta_max", "flat_disagree", "exponent", "ci_low", "ci_high", "exponent_alt",
                      "ci_low_alt", "ci_high_alt", "exponent_shift", "verdict", "dropped_units"]


def _group_iter(frame: pd.DataFrame, by: list[str]):
    if not by:
        yield (), frame
        return
    for key, g in frame.groupby(by, sort=True, dropna=False):
        yield (key if isinstance(key, tuple) else (key,)), g


@validate_arguments(rel_tol=Real(0, open_low=True), max_shift=Real(0, open_low=True),
                    min_agree=Real(0, 1, open_low=True))
def optimizer_invariance(frame: pd.DataFrame, responses: str | Sequence[str], *, by: str | Sequence[str] | None = None,
                         x: str = "n", units: str | None = None, suffix: str = "_alt", rel_tol: float = 0.25,
                         max_shift: float = 0.1, min_agree: float = 0.8, noise_var: str | float = "truth_noise_var",
                         **rate_kwargs: Any) -> pd.DataFrame:
    r"""Do a study's responses and rates survive a change of optimiser?

    Parameters
    ----------
    frame : DataFrame
        A study frame with, for each response ``y``, the column ``y + suffix`` from a second solver on the
        same data, and ``objective``/``objective_alt``, ``converged``/``converged_alt``.
    responses : str or list of str
        Response columns to check (e.g. ``["over_param", "exact_param", "l2"]``).
    by : column(s), optional
        One row per group and response (e.g. ``["gate", "expert"]``).
    x, units, rate_kwargs :
        Passed to :func:`moestat.fit_rate` for the two exponents (``units="truth_seed"`` resamples truths).
    rel_tol : float
        Two responses agree when :math:`|\log(y/y_\text{alt})| \le \log(1 + \text{rel\_tol})`.
    max_shift, min_agree : float
        Verdict thresholds (below).
    noise_var : column name or float
        The noise variance :math:`\nu` that scales the objective gap.

    Returns
    -------
    DataFrame
        ``by`` columns and ``response, pairs, both_converged`` (share of rows where both solvers
        converged), ``agree`` (share of rows that agree), ``median_abs_log_ratio``,
        ``objective_delta_median``, ``objective_delta_max`` (of :math:`\Delta = n (F_\text{alt} - F)/\nu`;
        positive: the primary fit is better), ``flat_disagree`` (share of rows with :math:`|\Delta| < 1`
        whose responses disagree: the data do not determine the response), ``exponent, ci_low, ci_high``
        and ``exponent_alt, ci_low_alt, ci_high_alt`` (power-law fits on each column),
        ``exponent_shift`` (alt minus primary) and ``verdict``, the first that applies:
        ``"optimiser-dependent rate"`` (:math:`|\text{shift}| > \text{max\_shift}`),
        ``"rate invariant, fits differ"`` (``agree < min_agree``), else ``"invariant"``; ``dropped_units``: with
        ``units``, the units left out of both exponents because one solver's response is missing (zero or not
        finite) at some n (:func:`complete_units`).
    """
    responses = [responses] if isinstance(responses, str) else list(responses)
    by = [] if by is None else ([by] if isinstance(by, str) else list(by))
    if not (rel_tol > 0 and max_shift > 0 and 0 < min_agree <= 1):
        raise ValueError("rel_tol and max_shift must be > 0 and min_agree in (0, 1].")
    needed = {x, "objective", "objective" + suffix, "converged", "converged" + suffix, *by}
    for y in responses:
        needed |= {y, y + suffix}
    if isinstance(noise_var, str):
        needed.add(noise_var)
    elif not noise_var > 0:
        raise ValueError(f"noise_var must be a column name or a positive number, got {noise_var!r}.")
    missing = sorted(needed - set(frame.columns))
    if missing:
        raise ValueError(f"frame lacks columns {missing}; run the study with fit options invariance='lm' (or a "
                         f"table naming another optimizer) so every response has its '{suffix}' twin.")
    nu = frame[noise_var].to_numpy(float) if isinstance(noise_var, str) else np.full(len(frame), float(noise_var))
    delta_all = frame[x].to_numpy(float) * (frame["objective" + suffix].to_numpy(float)
                                            - frame["objective"].to_numpy(float)) / nu
    frame = frame.assign(_delta=delta_all)
    rows = []
    for y in responses:
        for key, g in _group_iter(frame, by):
            a, b = g[y].to_numpy(float), g[y + suffix].to_numpy(float)
            ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
            lr = np.abs(np.log(a[ok] / b[ok]))
            agree = lr <= np.log1p(rel_tol)
            delta = g["_delta"].to_numpy(float)[ok]
            row: dict[str, Any] = dict(zip(by, key, strict=True))
            row.update(response=y, pairs=int(ok.sum()),
                       both_converged=float(np.mean(g["converged"].astype(bool)
                                                    & g["converged" + suffix].astype(bool))),
                       agree=float(agree.mean()) if ok.any() else np.nan,
                       median_abs_log_ratio=float(np.median(lr)) if ok.any() else np.nan,
                       objective_delta_median=float(np.median(delta)) if ok.any() else np.nan,
                       objective_delta_max=float(delta[np.argmax(np.abs(delta))]) if ok.any() else np.nan,
                       flat_disagree=float(np.mean((np.abs(delta) < 1) & ~agree)) if ok.any() else np.nan)
            paired, gone = (g[ok], {}) if units is None else complete_units(g[ok], units)
            row["dropped_units"] = ", ".join(map(str, gone.get("all", [])))
            for col, tag in ((y, ""), (y + suffix, "_alt")):
                est = _exponent(paired, col, x=x, units=units, **rate_kwargs)
                row.update({f"exponent{tag}": est[0], f"ci_low{tag}": est[1], f"ci_high{tag}": est[2]})
            row["exponent_shift"] = row["exponent_alt"] - row["exponent"]
            if np.isfinite(row["exponent_shift"]) and abs(row["exponent_shift"]) > max_shift:
                row["verdict"] = "optimiser-dependent rate"
            elif not np.isfinite(row["exponent_shift"]):
                row["verdict"] = "no rate to compare"
            elif row["agree"] < min_agree:
                row["verdict"] = "rate invariant, fits differ"
            else:
                row["verdict"] = "invariant"
            rows.append(row)
    return pd.DataFrame(rows, columns=[*by, *INVARIANCE_COLUMNS])


@validate_arguments()  # frame and its column names are data, checked against the frame
def lowest_objective(frame: pd.DataFrame, responses: str | Sequence[str], *, suffix: str = "_alt",
                     best_suffix: str = "_best", names: tuple[str, str] = ("primary", "alt")) -> pd.DataFrame:
    r"""Add, per row, the responses of whichever solver reached the lower least-squares objective.

    The least-squares estimator is the *global* minimiser of :math:`F(G) = \frac1n\sum_t (y_t - f_G(x_t))^2`.
    Two solvers run from the same starts on the same data give two local minimisers; the one with the lower
    objective is the better approximation of the estimator, whichever solver found it.  Reporting it
    (alongside each solver's own columns) keeps a solver that stops early at some rows from deciding the
    answer.

    Parameters
    ----------
    frame : DataFrame
        With ``objective``, ``objective + suffix`` and, for each response, ``y`` and ``y + suffix``.
    responses : str or list of str
    suffix, best_suffix : str
        Suffix of the second solver's columns and of the added columns.
    names : (str, str)
        Labels of the two solvers in the added ``solver + best_suffix`` column.

    Returns
    -------
    DataFrame
        A copy with ``y + best_suffix`` for every response, ``objective + best_suffix`` and
        ``solver + best_suffix`` (ties go to the primary solver).
    """
    responses = [responses] if isinstance(responses, str) else list(responses)
    needed = {"objective", "objective" + suffix, *responses, *(y + suffix for y in responses)}
    missing = sorted(needed - set(frame.columns))
    if missing:
        raise ValueError(f"frame lacks columns {missing}; run the study with fit options invariance='lm' so every "
                         f"response has its '{suffix}' twin.")
    alt = (frame["objective" + suffix] < frame["objective"]).to_numpy()
    out = frame.copy()
    for y in responses:
        out[y + best_suffix] = np.where(alt, frame[y + suffix], frame[y])
    out["objective" + best_suffix] = np.where(alt, frame["objective" + suffix], frame["objective"])
    out["solver" + best_suffix] = np.where(alt, names[1], names[0])
    return out


SOLVERS = {"_best": "lowest objective", "": "newton", "_alt": "lm"}
"""Column suffix -> solver label of a study run with ``options.invariance`` and :func:`lowest_objective`."""


def complete_units(frame: pd.DataFrame, units: str, *, by: Sequence[str] = (), across: str | None = None
                   ) -> tuple[pd.DataFrame, dict[str, list[Any]]]:
    """Keep the units (e.g. truth draws) that have rows at every n of their group; with ``across``, also at every
    level of that column within the group (the units a paired comparison can use).

    A unit-bootstrap interval resamples whole units, so every unit must span the group's n grid; a response that
    is missing (not finite or not positive) at one cell of a unit removes that unit from the group's fit.  Returns
    ``(kept rows, {group label: dropped units})``, so the caller can report what was left out.
    """
    by = list(by)
    rows = frame.reset_index(drop=True)  # positions: a frame concatenated from several runs repeats its labels
    keep = pd.Series(True, index=rows.index)
    dropped: dict[str, list[Any]] = {}
    groups = rows.groupby(by, sort=False) if by else [((), rows)]
    for key, g in groups:
        need = g["n"].nunique() * (g[across].nunique() if across else 1)
        cols = ["n", across] if across else ["n"]
        have = g.drop_duplicates([units, *cols]).groupby(units).size()
        bad = sorted(have.index[have < need].tolist())
        if bad:
            key = key if isinstance(key, tuple) else (key,)
            dropped[", ".join(map(str, key)) or "all"] = bad
            keep[g.index[g[units].isin(bad)]] = False
    return frame[keep.to_numpy()], dropped


@renamed_arguments(n_boot="n_resamples")
def solver_rate_tables(frame: pd.DataFrame, responses: Sequence[str], *, between: str, levels: Sequence[Any],
                       by: str = "expert", units: str | None = "truth_seed", solvers: dict[str, str] | None = None,
                       n_resamples: int = 2000, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Rates, windows and a paired comparison of ``between`` for every response under every solver.

    For each ``response + suffix`` column (``solvers``: ``_best`` the lowest-objective fit, ``""`` the default
    solver, ``_alt`` the second solver) and positive finite rows: :func:`moestat.fit_rate` by ``[by, between]``
    (table and window table) and :func:`moestat.compare_rates` of ``levels[0]`` against ``levels[1]`` paired
    within ``by``, with ``units`` as the resampling unit.  Every row carries ``y``, ``response`` and ``solver``;
    units whose response is missing at some n (or, for the comparison, at one level) are left out of that fit by
    :func:`complete_units` and listed in ``dropped_units``.  Returns ``(rates, windows, comparisons)``.
    """
    rates, windows, comparisons = [], [], []
    for suffix, solver in (solvers or SOLVERS).items():
        for r in responses:
            y = r + suffix
            sub = frame[np.isfinite(frame[y]) & (frame[y] > 0)]
            dropped = ""
            if units is not None:
                sub, gone = complete_units(sub, units, by=[by, between])
                dropped = "; ".join(f"{k}: {v}" for k, v in gone.items())
            res = fit_rate(sub, y, by=[by, between], units=units, n_resamples=n_resamples, seed=seed)
            rates.append(res.table.assign(y=y, response=r, solver=solver, dropped_units=dropped))
            windows.append(res.windows.assign(y=y, response=r, solver=solver))
            if units is not None:  # a paired comparison needs each unit at both levels
                sub, gone_pair = complete_units(sub, units, by=[by], across=between)
                dropped = "; ".join(f"{k}: {v}" for k, v in {**gone, **gone_pair}.items())
            cmp = compare_rates(sub, y, between=between, by=by, paired=True, units=units, levels=list(levels),
                                n_resamples=n_resamples, seed=seed)
            comparisons.append(cmp.assign(y=y, response=r, solver=solver, dropped_units=dropped))
    return (pd.concat(rates, ignore_index=True), pd.concat(windows, ignore_index=True),
            pd.concat(comparisons, ignore_index=True))


def _exponent(g: pd.DataFrame, y: str, *, x: str, units: str | None, **kwargs: Any) -> tuple[float, float, float]:
    if g[x].nunique() < 2:
        return np.nan, np.nan, np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RateWarning)  # the study's own rate tables carry the warnings
        t = fit_rate(g, y, x=x, units=units, **kwargs).table.iloc[0]
    return float(t["exponent"]), float(t["ci_low"]), float(t["ci_high"])


EXACT_SIGMOID_SPLITS = ("relu", "linear")
"""Experts whose weight split under a sigmoid gate is exact (positive homogeneity); under a softmax gate every
split of an atom's weight between two copies with the truth's expert is exact (docs/representations.md)."""

DESIGN_COLUMNS = ["check", "scope", "value", "threshold", "passed", "note"]


@validate_arguments(min_obs_per_param=Real(0, open_low=True), min_decades=Real(0), min_truths=Integer(1),
                    basin=Boolean(), n_mc=Integer(1), seed=Seed(), exact_gap=Real(0, open_low=True),
                    basin_optimizer=Choice("auto", "newton", "lbfgs", "lm"))
def design_check(truths: Sequence[Any], n: Sequence[float], *, k: int | str = "truth+1", min_obs_per_param: float = 50,
                 min_decades: float = 2.0, min_truths: int = 10, basin: bool = True, n_mc: int = 20_000,
                 restarts: int | None = None, seed: int = 0, exact_gap: float = 1e-3,
                 basin_optimizer: str = "auto") -> pd.DataFrame:
    r"""Can a planned gate-comparison design decide?  One row per check.

    Parameters
    ----------
    truths : sequence of Truth
        The true models (``(spec, params)`` pairs, e.g. from :func:`moestat.presets.gate_comparison`), one
        per truth draw and gate/expert.  Truths with ``info["seed"]`` count as draws of that seed.
    n : sequence of float
        The sample sizes.
    k : int or ``"truth+1"``
        Fitted atoms.
    min_obs_per_param, min_decades, min_truths : float
        Thresholds of the rules in the module docstring.
    basin : bool
        Each truth's weight-split basin gap: 0 where the split is exact (softmax gates; sigmoid gates with relu
        or linear experts, or with a duplicated atom of zero gate slope, ``info["duplicate"]``), else the
        smallest held-out distance of :func:`moestat.estimate_gbar` (seconds per truth), run by
        ``basin_optimizer`` (``"auto"``: trust-region Newton to convergence; ``"lbfgs"`` stops on its iteration
        cap in the flat valleys of sigmoid-gelu splits, so its gaps are only where it stopped).  The row's note
        says how many starts converged.
    n_mc, restarts, seed :
        Passed to :func:`moestat.estimate_gbar` (``restarts`` defaults to k*, one split per true atom).
    exact_gap : float
        A gap below ``exact_gap`` times the resolution counts as an exact representation (no floor).

    Returns
    -------
    DataFrame
        Columns ``check, scope, value, threshold, passed, note``.  ``check`` is ``obs_per_param`` (n_min / P,
        P the identified parameter count of the k-atom fit), ``decades``, ``truths`` (distinct truth
        seeds), and per truth ``basin_gap`` (scope ``"<gate>/<expert>/seed <s>"``; value the gap, threshold
        the resolution :math:`\sqrt{\nu P / n_\max}`, note ``exact``, ``resolved`` or ``floor``).
    """
    from .fit.gbar import estimate_gbar

    if len(truths) == 0:
        raise ValueError("truths is empty; pass the Truth objects of the design (e.g. presets.gate_comparison(...)).")
    ns = np.asarray(n, float)
    if ns.ndim != 1 or len(ns) < 2 or np.any(ns <= 0):
        raise ValueError(f"n must list at least two positive sample sizes, got {n!r}.")
    rows = []
    specs = []
    for t in truths:
        spec, params = t[0], t[1]
        if not isinstance(spec, MoE) or not isinstance(params, Params):
            raise TypeError("each truth must be a (MoE, Params) pair, e.g. from moestat.presets.gate_comparison.")
        kk = params.k + 1 if k == "truth+1" else check_int("k", k)
        specs.append((spec, params, kk, getattr(t, "info", {})))
    P = max(spec.with_k(kk).n_params() for spec, _, kk, _ in specs)
    ratio = ns.min() / P
    rows.append(("obs_per_param", "design", ratio, min_obs_per_param, ratio >= min_obs_per_param,
                 f"n_min={ns.min():g}, P={P} free parameters of the {specs[0][2]}-atom fit"))
    dec = float(np.log10(ns.max() / ns.min()))
    rows.append(("decades", "design", dec, min_decades, dec >= min_decades - 1e-9,
                 f"n from {ns.min():g} to {ns.max():g}"))
    seeds = {info.get("seed", i) for i, (_, _, _, info) in enumerate(specs)}
    rows.append(("truths", "design", float(len(seeds)), float(min_truths), len(seeds) >= min_truths,
                 "distinct truth draws; truth is the resampling unit of every interval"))
    if basin:
        for i, (spec, params, kk, info) in enumerate(specs):
            nu = float(spec.noise_sd) ** 2
            Pk = spec.with_k(kk).n_params()
            resolution = float(np.sqrt(nu * Pk / ns.max()))
            scope = f"{spec.gate}/{spec.expert}/seed {info.get('seed', i)}"
            duplicated = info.get("duplicate", [0])
            constant_gate = bool(np.all(np.asarray(params.gate_weight)[duplicated] == 0))
            if spec.gate == "softmax" or spec.expert in EXACT_SIGMOID_SPLITS or constant_gate:
                why = ("the duplicated atom's gate is constant (regime 1), so splitting its weight is exact for every "
                       "expert" if constant_gate and spec.gate == "sigmoid" else
                       "the weight split is an exact representation of f* for this gate and expert")
                rows.append(("basin_gap", scope, 0.0, resolution, True, f"exact: {why}"))
                continue
            res = estimate_gbar(spec, params, kk, n_mc=n_mc, restarts=restarts or params.k, seed=seed,
                                optimizer=basin_optimizer)
            gap = float(np.min(res.l2))
            status = "exact" if gap < exact_gap * resolution else ("resolved" if gap > resolution else "floor")
            rows.append(("basin_gap", scope, gap, resolution, status != "floor",
                         f"{status}: weight-split basin L2 gap (estimate_gbar, {basin_optimizer}, "
                         f"{int(np.sum(res.converged))}/{len(res.l2)} starts converged) vs sqrt(nu P / n_max)"))
    return pd.DataFrame(rows, columns=DESIGN_COLUMNS)
