r"""Choosing the number of experts under :math:`\varepsilon`-contamination: a simulation study of :func:`select_k`.

Do Tien Hai, Trung Nguyen Mai, TrungTin Nguyen, Ho, Nguyen & Drovandi (2025, "Dendrograms of mixing measures for
softmax-gated Gaussian mixture of experts: consistency without model sweeps", arXiv:2510.12744) report that when
the data are :math:`\varepsilon`-contaminated, AIC, BIC and ICL choose too many experts as :math:`n` grows, while
their dendrogram selection criterion (DSC, :mod:`moestat.dendrogram`) still recovers the number of experts of the
clean part.  This module holds the pieces of a study that measures this for :func:`moestat.select_k`:

* **contamination** (:func:`contaminate`, :func:`simulate_contaminated`): Huber's gross-error model applied to
  the responses, :math:`Y_t = (1 - B_t)\,Y^{\circ}_t + B_t\,O_t` with :math:`B_t \sim \mathrm{Bernoulli}
  (\varepsilon)` and :math:`O_t \sim Q` independent of :math:`(X_t, Y^{\circ}_t)`, where :math:`Y^\circ_t` comes
  from the clean softmax-gated Gaussian MoE (:func:`moestat.simulate`, ``model="mixture"``), so that
  :math:`Y \mid X \sim (1-\varepsilon)\,p_{G_0}(\cdot\mid X) + \varepsilon\,Q` (Huber 1964, "Robust estimation of
  a location parameter", *Ann. Math. Statist.* 35:73).  :math:`Q` is :math:`\mathcal N(\mathrm{loc},
  \mathrm{scale}^2)` or :math:`U[\mathrm{loc} - \mathrm{scale}, \mathrm{loc} + \mathrm{scale}]`;
* **the choices of every criterion from one set of fits** (:func:`selection_choices`): AIC, BIC and ICL with
  :func:`moestat.select_k`'s rule (fits at a spurious maximum are skipped), the same criteria as a plain
  :math:`\arg\min` over all fits (``*_raw``, the textbook rule), and DSC;
* **selection frequencies with Monte Carlo standard errors** (:func:`selection_frequencies`): the share
  :math:`\hat p_k` of replicates choosing :math:`k` with the binomial MCSE :math:`\sqrt{\hat p_k(1-\hat p_k)/R}`
  (Morris, White & Crowther 2019, *Stat. Med.* 38:2074, Table 6, the MCSE of coverage and power);
* the whole grid (:func:`contamination_study`) and a printable table (:func:`frequency_table`).

Draws are coupled across :math:`\varepsilon` (common random numbers): for one seed the clean data, the uniforms
:math:`U_t` behind :math:`B_t = 1\{U_t < \varepsilon\}` and the outlying values :math:`O_t` do not depend on
:math:`\varepsilon`, so the outliers at a smaller :math:`\varepsilon` are a subset of those at a larger one, and
differences between contamination levels are not blurred by fresh noise.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ._validation import Choice, Integer, Real, Seed, check_int, validate_arguments
from ._validation import column_list as _columns
from .exceptions import DegenerateFitWarning
from .inference import _SPURIOUS, select_k
from .model import MoE
from .params import Params
from .simulators.regression import simulate

__all__ = ["CRITERIA", "OUTLIER_DISTRIBUTIONS", "ContaminatedData", "contaminate", "contamination_study",
           "frequency_table", "selection_choices", "selection_frequencies", "simulate_contaminated"]

#: The rules :func:`selection_choices` reports: ``select_k``'s rule for AIC/BIC/ICL (spurious fits skipped), the
#: plain argmin over every fit (``*_raw``) and the dendrogram selection criterion.
CRITERIA: tuple[str, ...] = ("aic", "bic", "icl", "aic_raw", "bic_raw", "icl_raw", "dsc")

#: The contaminating distributions :math:`Q` of :func:`contaminate`.
OUTLIER_DISTRIBUTIONS: tuple[str, ...] = ("normal", "uniform")


# ------------------------------------------------------------------------------------------------ seeds
def _root(seed: int | np.random.SeedSequence | None) -> np.random.SeedSequence:
    """A fresh SeedSequence equal to ``seed`` (spawning from it never changes the caller's object)."""
    if isinstance(seed, np.random.SeedSequence):
        return np.random.SeedSequence(seed.entropy, spawn_key=seed.spawn_key)
    return np.random.SeedSequence(seed)


def _child(root: np.random.SeedSequence, *key: int) -> np.random.SeedSequence:
    """The child of ``root`` at spawn key ``key``: the same stream whatever was spawned before."""
    return np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, *key))


# ------------------------------------------------------------------------------------------ contamination
def _check_epsilon(epsilon: Any) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating, np.integer)):
        raise TypeError(f"epsilon must be a number in [0, 1), got {epsilon!r} ({type(epsilon).__name__}); "
                        "e.g. epsilon=0.05 replaces about 5% of the responses.")
    if not 0.0 <= float(epsilon) < 1.0:
        raise ValueError(f"epsilon must lie in [0, 1), got {epsilon!r}; it is the probability that a response is "
                         "replaced by an outlier (epsilon=0 is clean data).")
    return float(epsilon)


def _draw_outliers(rng: np.random.Generator, shape: tuple[int, ...], distribution: str, loc: float,
                   scale: float) -> np.ndarray:
    """:math:`O \\sim \\mathcal N(\\mathrm{loc}, \\mathrm{scale}^2)` or :math:`U[\\mathrm{loc}\\pm\\mathrm{scale}]`."""
    if distribution == "normal":
        return rng.normal(loc, scale, size=shape)
    return rng.uniform(loc - scale, loc + scale, size=shape)


@validate_arguments(seed=Seed(), distribution=Choice(*OUTLIER_DISTRIBUTIONS), loc=Real(),
                    scale=Real(0, open_low=True))
def contaminate(y: Any, epsilon: float, *, seed: int | np.random.SeedSequence | None = None,
                distribution: str = "normal", loc: float = 0.0, scale: float = 10.0
                ) -> tuple[np.ndarray, np.ndarray]:
    r"""Replace each response by an outlier with probability ``epsilon`` (Huber's gross-error model).

    .. math:: Y_t = (1 - B_t)\,y_t + B_t\,O_t,\qquad B_t = 1\{U_t < \varepsilon\},\quad U_t \sim U(0, 1),
       \quad O_t \sim Q,

    all independent of ``y``; :math:`Q = \mathcal N(\mathrm{loc}, \mathrm{scale}^2)` (``"normal"``) or
    :math:`U[\mathrm{loc} - \mathrm{scale}, \mathrm{loc} + \mathrm{scale}]` (``"uniform"``).  The number of
    outliers is random, :math:`\mathrm{Binomial}(n, \varepsilon)`, as in the mixture
    :math:`(1-\varepsilon)P_0 + \varepsilon Q` (Huber 1964, *Ann. Math. Statist.* 35:73).  For one ``seed`` the
    :math:`U_t` and :math:`O_t` do not depend on ``epsilon``: a larger ``epsilon`` keeps every outlier of a smaller
    one (common random numbers across contamination levels).

    Parameters
    ----------
    y : array of shape (n,) or (R, n)
        Clean responses (not modified).
    epsilon : float in [0, 1)
        Contamination probability :math:`\varepsilon`.
    seed : int or SeedSequence, optional
        Stream of :math:`(U_t, O_t)`.
    distribution : {"normal", "uniform"}
        The contaminating distribution :math:`Q`.
    loc, scale : float
        Centre and spread of :math:`Q` (sd for ``"normal"``, half-width for ``"uniform"``); ``scale > 0``.

    Returns
    -------
    (ndarray, ndarray)
        The contaminated responses (float64, the shape of ``y``) and the boolean outlier indicators :math:`B_t`.

    Examples
    --------
    >>> import numpy as np
    >>> y_c, out = contaminate(np.zeros(1000), 0.1, seed=0, loc=50.0, scale=1.0)
    >>> bool((y_c[out] > 40).all()), bool((y_c[~out] == 0).all())
    (True, True)
    """
    eps = _check_epsilon(epsilon)
    arr = np.array(y, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.shape[-1] == 0:
        raise ValueError(f"y must have shape (n,) or (R, n) with n >= 1, got shape {arr.shape}.")
    if not np.isfinite(arr).all():
        raise ValueError("y contains NaN or infinite values; contaminate clean, finite responses.")
    rng = np.random.default_rng(_root(seed))
    u = rng.uniform(size=arr.shape)
    outliers = _draw_outliers(rng, arr.shape, distribution, float(loc), float(scale))
    flag = u < eps
    return np.where(flag, outliers, arr), flag


@dataclass(frozen=True)
class ContaminatedData:
    """R contaminated data sets from :func:`simulate_contaminated`.

    Attributes
    ----------
    X : ndarray, shape (R, n, d)
    y : ndarray, shape (R, n)
        Contaminated responses.
    y_clean : ndarray, shape (R, n)
        The responses of the clean MoE before contamination.
    z : ndarray of int, shape (R, n)
        The latent expert of each clean response (meaningless where ``outlier`` is True).
    outlier : ndarray of bool, shape (R, n)
        Which responses were replaced.
    epsilon : float
    """

    X: np.ndarray
    y: np.ndarray
    y_clean: np.ndarray
    z: np.ndarray
    outlier: np.ndarray
    epsilon: float

    @property
    def n_reps(self) -> int:
        """Number of replicates R."""
        return int(self.y.shape[0])


@validate_arguments(n=Integer(1), reps=Integer(1), seed=Seed(), distribution=Choice(*OUTLIER_DISTRIBUTIONS),
                    loc=Real(), scale=Real(0, open_low=True))
def simulate_contaminated(spec: MoE, params: Params, n: int, epsilon: float, reps: int = 1,
                          seed: int | np.random.SeedSequence | None = None, *, distribution: str = "normal",
                          loc: float = 0.0, scale: float = 10.0, **simulate_kwargs: Any) -> ContaminatedData:
    r"""Simulate R data sets from a Gaussian MoE and contaminate their responses (:func:`contaminate`).

    The clean part is :func:`moestat.simulate` with ``model="mixture"`` (draw the expert
    :math:`Z\mid X \sim \mathrm{Categorical}(\pi(X))`, then :math:`Y^\circ \mid X, Z=i \sim \mathcal N(a_i^\top X +
    b_i, \sigma_i^2)`); then each response is replaced with probability ``epsilon`` by a draw from :math:`Q`, so
    :math:`Y\mid X \sim (1-\varepsilon)\,p_{G_0}(\cdot\mid X) + \varepsilon\,Q`.

    Parameters
    ----------
    spec, params : MoE, Params
        The clean model and its true parameters (``params.noise_sd`` gives each expert's sd).
    n, reps : int
        Sample size and number of replicates.
    epsilon : float in [0, 1)
        Contamination probability.
    seed : int or SeedSequence
        Master seed.  The clean data use child ``(0,)`` (so they equal ``simulate(..., seed=child)``) and the
        contamination child ``(1, r)`` for replicate ``r``; neither depends on ``epsilon`` (common random numbers).
    distribution, loc, scale
        The contaminating distribution :math:`Q` (:func:`contaminate`).
    **simulate_kwargs
        Passed to :func:`moestat.simulate` (``inputs``, ``low``, ``high``, ``design``); ``model`` is fixed to
        ``"mixture"``.

    Returns
    -------
    ContaminatedData
    """
    if "model" in simulate_kwargs:
        raise TypeError(f"simulate_contaminated() draws the clean part from the Gaussian MoE (model='mixture'); "
                        f"drop model={simulate_kwargs['model']!r}.")
    eps = _check_epsilon(epsilon)
    root = _root(seed)
    data = simulate(spec, params, n, reps, _child(root, 0), model="mixture", **simulate_kwargs)
    pairs = [contaminate(data.y[r], eps, seed=_child(root, 1, r), distribution=distribution, loc=loc, scale=scale)
             for r in range(data.n_reps)]
    y = np.stack([p[0] for p in pairs])
    flag = np.stack([p[1] for p in pairs])
    return ContaminatedData(data.X, y, data.y, data.z, flag, eps)


# ------------------------------------------------------------------------------------------- the choices
def _guarded_choice(table: pd.DataFrame, column: str) -> int:
    """``select_k``'s rule: argmin of ``column`` over the fits not at a spurious maximum (all fits if none is)."""
    skip = table["degenerate"].map(lambda kinds: bool(set(str(kinds).split(", ")) & _SPURIOUS))
    usable = table[~skip] if (~skip).any() else table
    return int(usable.loc[usable[column].idxmin(), "k"])


def _chosen_fit_flags(table: pd.DataFrame, k: int) -> str:
    return str(table.loc[table["k"] == k, "degenerate"].iloc[0])


@validate_arguments(restarts=Integer(1), seed=Seed())
def selection_choices(X: Any, y: Any, ks: Sequence[int] = (1, 2, 3, 4), *, restarts: int = 5,
                      seed: int | np.random.SeedSequence | None = None, **fit_kwargs: Any) -> pd.DataFrame:
    r"""The number of experts every criterion of :data:`CRITERIA` chooses, from one set of fits.

    Fits a softmax-gated Gaussian MoE of linear experts for each :math:`k` in ``ks`` once
    (:func:`moestat.select_k` with ``criterion="dsc"``, whose table holds AIC, BIC, ICL and DSC) and reads:

    * ``aic``, ``bic``, ``icl``: :math:`\arg\min_k` of the criterion among the fits :func:`moestat.select_k`
      keeps (a fit at a spurious maximum, i.e. with a vanishing component, a variance at the floor or collapsed,
      is skipped unless every fit is); this equals ``select_k(..., criterion=c).best_k`` for the same seed;
    * ``aic_raw``, ``bic_raw``, ``icl_raw``: :math:`\arg\min_k` over every fit, with
      :math:`\mathrm{AIC} = -2\hat\ell_k + 2\,\mathrm{df}_k`, :math:`\mathrm{BIC} = -2\hat\ell_k + \mathrm{df}_k
      \log n` and ICL the BIC plus twice the entropy of the posterior expert memberships (Biernacki, Celeux &
      Govaert 2000, *IEEE TPAMI* 22:719);
    * ``dsc``: :math:`\arg\min_{2\le\kappa\le K}\mathrm{DSC}(\kappa)` on the dendrogram of the largest fit
      (:func:`moestat.dendrogram.dsc`; Do Tien Hai et al. 2025, arXiv:2510.12744).

    Parameters
    ----------
    X : array, shape (n, d)
    y : array, shape (n,)
    ks : sequence of int
        Candidate numbers of experts; ``max(ks) >= 3`` (DSC merges the atoms of the largest fit).
    restarts : int
        Random starts per fit.
    seed : int or SeedSequence
        Seed of the fits (the caller's SeedSequence object is not advanced).
    **fit_kwargs
        Passed to :func:`moestat.fit_mle` through :func:`moestat.select_k` (e.g. ``device="cpu"``).

    Returns
    -------
    DataFrame
        One row per criterion: ``criterion``, ``k_selected`` and ``degenerate`` (the kinds
        :meth:`moestat.MLEFit.degeneracy` found in the fit with ``k_selected`` experts; for ``dsc`` those of the
        over-specified fit it merged).
    """
    ks = [check_int("ks", k) for k in ks]
    if len(ks) == 0 or max(ks) < 3:
        raise ValueError(f"ks must include a k >= 3 (DSC merges the atoms of the largest fit), got ks={ks}; "
                         "e.g. ks=(1, 2, 3, 4).")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        res = select_k(X, y, ks=ks, criterion="dsc", restarts=restarts, seed=_root(seed), progress=False,
                       **fit_kwargs)
    table = res.table
    rows = []
    for crit in ("aic", "bic", "icl"):
        k = _guarded_choice(table, crit)
        rows.append({"criterion": crit, "k_selected": k, "degenerate": _chosen_fit_flags(table, k)})
    for crit in ("aic", "bic", "icl"):
        k = int(table.loc[table[crit].idxmin(), "k"])
        rows.append({"criterion": f"{crit}_raw", "k_selected": k, "degenerate": _chosen_fit_flags(table, k)})
    rows.append({"criterion": "dsc", "k_selected": int(res.best_k),
                 "degenerate": _chosen_fit_flags(table, int(table["k"].max()))})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------- frequencies
def selection_frequencies(choices: pd.DataFrame, *, by: str | Sequence[str] = ("criterion",),
                          k: str = "k_selected", ks: Sequence[int] | None = None) -> pd.DataFrame:
    r"""How often each number of experts is chosen, with its binomial Monte Carlo standard error.

    In each group of ``by`` with :math:`R` replicates (rows), the frequency of :math:`k` is
    :math:`\hat p_k = R^{-1}\sum_{r=1}^R 1\{\hat k_r = k\}` and its MCSE is
    :math:`\sqrt{\hat p_k(1-\hat p_k)/R}` (the binomial MCSE of a proportion; Morris, White & Crowther 2019,
    *Stat. Med.* 38:2074, Table 6).  It is 0 when :math:`\hat p_k` is 0 or 1, which does not mean certainty: with
    no hit in :math:`R` replicates, a 95% upper bound for :math:`p_k` is about :math:`3/R` (the "rule of three").

    Parameters
    ----------
    choices : DataFrame
        One row per replicate and group, e.g. from :func:`contamination_study`.
    by : str or sequence of str
        Grouping columns (criterion, n, epsilon ...).
    k : str
        Column of the chosen number of experts.
    ks : sequence of int, optional
        The numbers of experts to report (default: every value in ``choices[k]``); a :math:`k` never chosen in a
        group is reported with frequency 0.

    Returns
    -------
    DataFrame
        Columns ``[*by, "k", "count", "n_reps", "frequency", "mcse"]``.
    """
    if not isinstance(choices, pd.DataFrame):
        raise TypeError(f"choices must be a pandas DataFrame (one row per replicate), got {type(choices).__name__}.")
    by_cols = _columns("by", by)
    missing = [c for c in [*by_cols, k] if c not in choices.columns]
    if missing:
        raise ValueError(f"choices has no column(s) {missing}; its columns are {list(choices.columns)}. "
                         "Pass by= and k= naming existing columns.")
    if choices.empty:
        raise ValueError("choices is empty; there is no replicate to count.")
    values = pd.to_numeric(choices[k], errors="coerce")
    if values.isna().any():
        raise ValueError(f"column k={k!r} must hold whole numbers of experts, found non-numeric or missing values.")
    levels = sorted(int(v) for v in values.unique()) if ks is None else [check_int("ks", v) for v in ks]
    rows = []
    for key, idx in choices.groupby(by_cols, sort=True).indices.items():
        key_t = key if isinstance(key, tuple) else (key,)
        picked = values.to_numpy()[idx]
        R = len(picked)
        for kk in levels:
            count = int(np.sum(picked == kk))
            p = count / R
            rows.append((*key_t, kk, count, R, p, float(np.sqrt(p * (1 - p) / R))))
    return pd.DataFrame(rows, columns=[*by_cols, "k", "count", "n_reps", "frequency", "mcse"])


def frequency_table(frequencies: pd.DataFrame, *, index: str | Sequence[str] = ("n", "epsilon", "criterion"),
                    digits: int = 2) -> pd.DataFrame:
    """A wide, printable view of :func:`selection_frequencies`: one column per k, cells ``"p (mcse)"``.

    Parameters
    ----------
    frequencies : DataFrame
        From :func:`selection_frequencies`.
    index : str or sequence of str
        The grouping columns that index the rows.
    digits : int
        Decimals of the frequency and its MCSE.

    Returns
    -------
    DataFrame
        Rows ``index``, columns ``k=1, k=2, ...``, plus ``R`` (the replicates of the row).
    """
    idx = _columns("index", index)
    need = [*idx, "k", "frequency", "mcse", "n_reps"]
    missing = [c for c in need if c not in frequencies.columns]
    if missing:
        raise ValueError(f"frequencies has no column(s) {missing}; pass the output of selection_frequencies "
                         "grouped by the columns of index=.")
    digits = check_int("digits", digits, minimum=0)
    cell = frequencies.assign(cell=[f"{p:.{digits}f} ({s:.{digits}f})"
                                    for p, s in zip(frequencies["frequency"], frequencies["mcse"], strict=True)])
    wide = cell.pivot_table(index=idx, columns="k", values="cell", aggfunc="first")
    wide.columns = [f"k={c}" for c in wide.columns]
    wide["R"] = cell.groupby(idx)["n_reps"].first()
    return wide


# ------------------------------------------------------------------------------------------------ the study
@validate_arguments(reps=Integer(1), seed=Seed(), restarts=Integer(1),
                    distribution=Choice(*OUTLIER_DISTRIBUTIONS), loc=Real(), scale=Real(0, open_low=True))
def contamination_study(spec: MoE, params: Params, *, ns: Sequence[int], epsilons: Sequence[float], reps: int,
                        ks: Sequence[int] = (1, 2, 3, 4), seed: int | np.random.SeedSequence | None = 0,
                        restarts: int = 5, distribution: str = "normal", loc: float = 0.0, scale: float = 10.0,
                        simulate_kwargs: Mapping[str, Any] | None = None, fit_kwargs: Mapping[str, Any] | None = None,
                        on_replicate: Callable[[dict[str, Any]], None] | None = None) -> pd.DataFrame:
    r"""Which number of experts each criterion chooses, over a grid of sample sizes and contamination levels.

    For every sample size :math:`n` and replicate :math:`r`, one clean data set is drawn
    (:func:`simulate_contaminated` with seed child ``(n, r)`` of ``seed``) and contaminated at every
    :math:`\varepsilon` in ``epsilons`` with the same uniforms and outlying values (common random numbers); each
    contaminated set is fitted with the same fit seed (child ``(n, r, 2)``) and every criterion's choice is
    recorded (:func:`selection_choices`).  Tabulate with :func:`selection_frequencies`.  The streams are keyed by
    the value of :math:`n`, not its position in ``ns``, so runs over different lists of sample sizes (or in
    separate processes, one :math:`n` each) give the same data for the same :math:`(n, r)`.

    Parameters
    ----------
    spec, params : MoE, Params
        The clean softmax-gated Gaussian MoE and its true parameters.
    ns : sequence of int
        Sample sizes.
    epsilons : sequence of float in [0, 1)
        Contamination probabilities.
    reps : int
        Replicates per :math:`(n, \varepsilon)`.
    ks : sequence of int
        Candidate numbers of experts (``max(ks) >= 3``; its largest is DSC's over-specified fit).
    seed : int or SeedSequence
        Master seed.
    restarts : int
        Random starts per fit.
    distribution, loc, scale
        The contaminating distribution :math:`Q` (:func:`contaminate`).
    simulate_kwargs : mapping, optional
        Passed to :func:`moestat.simulate` (``low``, ``high``, ``inputs`` ...).
    fit_kwargs : mapping, optional
        Passed to :func:`moestat.fit_mle` (e.g. ``{"device": "cpu"}``).
    on_replicate : callable, optional
        Called after every fitted data set with a dict (``n``, ``epsilon``, ``rep``, ``seconds``), e.g. to print
        progress.

    Returns
    -------
    DataFrame
        One row per (n, epsilon, rep, criterion): ``n``, ``epsilon``, ``rep``, ``criterion``, ``k_selected``,
        ``degenerate``, ``n_outliers`` and ``seconds`` (the wall time of the data set's fits).
    """
    ns = [check_int("ns", n) for n in ns]
    eps_list = [_check_epsilon(e) for e in epsilons]
    if not ns or not eps_list:
        raise ValueError(f"ns and epsilons must each list at least one value, got ns={ns}, epsilons={eps_list}.")
    root = _root(seed)
    sim_kw, fit_kw = dict(simulate_kwargs or {}), dict(fit_kwargs or {})
    frames = []
    for n in ns:
        for r in range(reps):
            for eps in eps_list:
                data = simulate_contaminated(spec, params, n, eps, 1, _child(root, n, r), distribution=distribution,
                                             loc=loc, scale=scale, **sim_kw)
                start = time.perf_counter()
                frame = selection_choices(data.X[0], data.y[0], ks, restarts=restarts, seed=_child(root, n, r, 2),
                                          **fit_kw)
                seconds = time.perf_counter() - start
                frames.append(frame.assign(n=n, epsilon=eps, rep=r, n_outliers=int(data.outlier.sum()),
                                           seconds=seconds))
                if on_replicate is not None:
                    on_replicate({"n": n, "epsilon": eps, "rep": r, "seconds": seconds})
    out = pd.concat(frames, ignore_index=True)
    return out[["n", "epsilon", "rep", "criterion", "k_selected", "degenerate", "n_outliers", "seconds"]]
