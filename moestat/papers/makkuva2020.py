r"""Makkuva, Oh, Kannan & Viswanath (2020), "Learning in Gated Neural Networks" (AISTATS 2020; arXiv:1906.02777):
the rates it proves for its gated network (as data), the success criterion and rate configuration of its
experiments, and the :class:`moestat.Study` cell that runs them.

The gated network is

.. math:: y = \sum_i z_i\, g(a_i^{*\top} x) + \xi,\qquad P[z_i = 1 \mid x] = \mathrm{softmax}_i(w^{*\top} x),
   \qquad x \sim N(0, I_d),\ \xi \sim N(0, \sigma^2).

Its data are simulated by :func:`moestat.simulate_gated_nn` and fitted by :func:`moestat.fit_tensor` (the
paper's two-stage tensor method: the experts from the fourth-order loss :math:`L_4`, then the gate from the
likelihood :math:`L_{\log}` with the experts frozen), :func:`moestat.fit_em_gated` (EM, the revised version's
baseline), :func:`moestat.fit_l2_gated` (least squares on the joint model, the paper's :math:`\ell_2` baseline)
and :func:`moestat.fit.tensor.fit_gate` (the gate alone with the experts given, the paper's Fig. 2(b)).

* :func:`gated_nn_cell` is the custom cell of a :class:`moestat.Study` over these data and fits
  (``cell="moestat.papers.makkuva2020:gated_nn_cell"``): data knobs in the truth's ``data`` table
  (:data:`DATA_KEYS`), the estimator and its settings in the fit's ``options`` (:data:`METHODS`), ``n`` the
  study's n.  Its frame has the selected restart's errors per replicate; its pieces are ``restarts`` (every
  random start's errors) and, when asked for, ``history`` (the per-iteration trace).
* :data:`SUCCESS` / :func:`recovered`: what counts as a recovered network from one random start.
* :data:`RATE_FIT`, :data:`RATE_H0`, :func:`rate_config`, :func:`rate_frame`, :func:`rate_table`: the rate fit of
  the gate and regressor errors against n (Theorem 4's :math:`n^{-1/2}`).
* :data:`THEORY`: the proved rates as rows of :func:`moestat.rates.theory_rates`.

The vignette ``gated-nn-recovery`` runs the paper's experiments through these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from ..cells import CellContext, CellOutput
    from ..fit.gated import GatedFit
    from ..rates import RateResult
    from ..simulators.gated_nn import GatedNNData

__all__ = ["DATA_KEYS", "ERROR_METRICS", "METHODS", "RATE_FIT", "RATE_H0", "REFERENCE", "SUCCESS", "THEORY",
           "gated_nn_cell", "rate_config", "rate_frame", "rate_table", "recovered"]

REFERENCE = ("Makkuva, A. V., Oh, S., Kannan, S. and Viswanath, P. (2020). Learning in gated neural networks. "
             "Proceedings of the 23rd International Conference on Artificial Intelligence and Statistics "
             "(AISTATS), PMLR 108.")

# One row per result, in the columns of :data:`moestat.papers.THEORY_COLUMNS`: (source, result, gate, regime,
# expert, examples, quantity, response, regressor, rate, exponent, rate_model, direction, kind, note).
THEORY: list[tuple[Any, ...]] = [
    ("makkuva2020", "Thm 4", "softmax", "", "linear|sigmoid|relu", "", "gate parameters max_i ||w_i - w_i*||",
     "gate_l2", "n", "sqrt(d T log(Tk/delta) / n) down to the floor kappa eps_reg / (1 - rho)", 0.5, "power",
     "decay", "upper_bound", "fixed T, sample-split GD; fit only above the floor"),
    ("makkuva2020", "Thm 4 (derived)", "softmax", "", "linear|sigmoid|relu", "", "samples to reach gate error eps",
     "N_star", "d", "O~(d log(1/eps) / eps^2)", 1.0, "power", "growth", "upper_bound_slope", "linear in d"),
    ("makkuva2020", "Thm 4 (derived)", "softmax", "", "linear|sigmoid|relu", "", "samples to reach gate error eps",
     "N_star", "1/eps", "O~(d log(1/eps) / eps^2)", 2.0, "power", "growth", "upper_bound_slope",
     "parametric in eps, up to log(1/eps)"),
    ("makkuva2020", "Thm 2 (heuristic)", "softmax", "", "linear|sigmoid|relu", "", "regressor angle error",
     "angle_error", "n", "n^{-1/2} if parametric; Thm 2 gives no rate", 0.5, "power", "decay", "derived",
     "a parametric rate is expected, not proved"),
    ("makkuva2020", "Thm 2 (heuristic)", "softmax", "", "linear|sigmoid|relu", "", "E_reg = 1 - |cos theta|",
     "E_reg", "n", "n^{-1} if parametric (E_reg ~ theta^2 / 2)", 1.0, "power", "decay", "derived",
     "twice the slope of the parameter error (E_reg ~ theta^2 / 2)"),
]

# ----------------------------------------------------------------------------- success criterion

SUCCESS: dict[str, float] = {"E_reg": 0.05, "gate_l2": 0.5}
r"""Thresholds of :func:`recovered`: :math:`\mathcal E_{\mathrm{reg}} \le 0.05` (every expert within about 18
degrees, :math:`\arccos 0.95`) and :math:`\max_i \|w'_i - w_i^*\|_2 \le 0.5` (half the norm of :math:`w^*`).
The paper reports curves only; these values are ours, set between its two outcomes (the spurious optima of
least squares sit at :math:`\mathcal E_{\mathrm{reg}} \approx 0.3`-:math:`0.8`)."""

ERROR_METRICS = ("E_reg", "reg_angle", "reg_l2", "reg_l2_unsigned", "E_gate", "gate_l2", "gate_fro")
"""The error columns of :func:`gated_nn_cell` (from :func:`moestat.metrics.gated.regressor_error` and
:func:`moestat.metrics.gated.gating_error`), in this order."""


def recovered(frame: pd.DataFrame, *, e_reg: float = SUCCESS["E_reg"],
              gate_l2: float = SUCCESS["gate_l2"]) -> pd.Series:
    r"""Whether each fit (row) recovered the gated network: experts and gate both close to the truth.

    .. math:: \mathrm{recovered} = \Big[\,1 - \max_{\pi}\min_i |\cos(\hat a_{\pi(i)}, a_i^*)| \le \epsilon_{reg}
       \Big] \wedge \Big[\max_{i<k} \|\hat w_{\pi(i)} - \hat w_{\pi(k)} - w_i^*\|_2 \le \epsilon_{gate}\Big],

    the paper's regressor error :math:`\mathcal E_{\mathrm{reg}}` (makkuva2020 §4, "Error metric") and the norm
    of its Theorems 3-4 for the gate, both after the bottleneck relabelling :math:`\pi` of the experts
    (:func:`moestat.metrics.gated.regressor_error`, :func:`moestat.metrics.gated.gating_error`).  Makkuva, Oh,
    Kannan & Viswanath (2020), AISTATS, judge a random start a success when it reaches the global optimum
    (Fig. 2); the thresholds :data:`SUCCESS` make that a rule.

    Parameters
    ----------
    frame : pandas.DataFrame
        One fit per row, with columns ``E_reg`` and ``gate_l2`` (the frame or the ``restarts`` piece of
        :func:`gated_nn_cell`).
    e_reg, gate_l2 : float
        The thresholds :math:`\epsilon_{reg}` and :math:`\epsilon_{gate}` (default :data:`SUCCESS`).

    Returns
    -------
    pandas.Series of bool
        Aligned with ``frame``; a NaN error (a failed fit) is not a success.
    """
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame with columns E_reg and gate_l2, got "
                        f"{type(frame).__name__}.")
    missing = [c for c in ("E_reg", "gate_l2") if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks the columns {missing}; pass the errors of a gated fit (e.g. the frame or "
                         "the 'restarts' piece of gated_nn_cell).")
    for name, value in (("e_reg", e_reg), ("gate_l2", gate_l2)):
        if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
            raise ValueError(f"{name}={value!r} must be a finite threshold >= 0, e.g. {SUCCESS}.")
    return (frame["E_reg"] <= e_reg) & (frame["gate_l2"] <= gate_l2)


# ----------------------------------------------------------------------------- rates against n

RATE_FIT: dict[str, Any] = dict(model="power", method="cluster_bootstrap", n_resamples=2000, seed=2020,
                                confidence_level=0.95)
r"""Keyword arguments of :func:`moestat.fit_rate` for the errors against n: the power model
:math:`\log \mathrm{error} = c - \alpha \log n` fitted by OLS on the replicate-level errors, with the cluster
bootstrap t interval (replicates resampled within each n, as each n has its own independent data sets)."""

RATE_H0 = 0.5
r""":math:`\alpha = 1/2`: Theorem 4's rate for the gate error :math:`\max_i\|w_i - w_i^*\|_2` (above the floor
:math:`\kappa\varepsilon_{reg}/(1-\rho_\sigma)`), and the parametric rate expected (not proved, Theorem 2) for
the largest regressor angle."""


def rate_config() -> dict[str, Any]:
    """The rate analysis of :func:`rate_table` as a provenance record (function, grouping, knobs, test, AIC)."""
    return {"function": "moestat.fit_rate", "by": "method (one fit per metric)", "rep": "rep", **RATE_FIT,
            "interval": "t (Satterthwaite df)", "resample": "within_n", "h0_exponent": RATE_H0,
            "aic": "moestat.compare_models (power, power_log, inverse_log; robust fits)"}


def rate_frame(errors: pd.DataFrame, metrics: Sequence[str] = ("gate_l2", "reg_angle")) -> pd.DataFrame:
    r"""Errors against n in the tidy layout of :func:`moestat.fit_rate`: one row per (method, metric, n, rep).

    The regressor angle of a gate-only fit whose experts are the truth (``method`` starting with ``"gate|A=A*"``)
    is identically 0 and is dropped, as is every (method, metric) group with fewer distinct n than
    :data:`moestat.rates.MIN_N_VALUES` (a rate needs several sample sizes).

    Parameters
    ----------
    errors : pandas.DataFrame
        Wide errors with columns ``method, n, rep`` and the ``metrics``.
    metrics : sequence of str
        Error columns to keep (default: Theorem 4's gate error and the largest regressor angle).

    Returns
    -------
    pandas.DataFrame
        Columns ``method, n, rep, metric, error``.
    """
    from ..rates import MIN_N_VALUES

    missing = [c for c in ("method", "n", "rep", *metrics) if c not in errors.columns]
    if missing:
        raise ValueError(f"errors lacks the columns {missing}; pass the wide errors (method, n, rep, metrics) of "
                         "the fits against n.")
    tidy = errors.melt(id_vars=["method", "n", "rep"], value_vars=list(metrics), var_name="metric",
                       value_name="error")
    tidy = tidy[~((tidy["metric"] == "reg_angle") & (tidy["method"] == "gate|A=A*"))]  # experts known: 0
    keep = tidy.groupby(["method", "metric"])["n"].transform("nunique") >= MIN_N_VALUES
    return tidy[keep].reset_index(drop=True)


def rate_table(errors: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, RateResult]]:
    r"""Rate exponents of the errors against n, the test of :math:`\alpha = 1/2` and an AIC model comparison.

    For each metric of :func:`rate_frame`, :func:`moestat.fit_rate` (:data:`RATE_FIT`, grouped by ``method``)
    fits :math:`\mathrm{error} \approx C n^{-\alpha}`; :func:`moestat.test_exponent` tests
    :math:`H_0: \alpha = 1/2` (:data:`RATE_H0`, Theorem 4 of makkuva2020); :func:`moestat.compare_models` ranks the
    power, power-log and inverse-log models by AIC (a curvature check).  Short n ranges are not errors: their
    :class:`moestat.RateWarning` is silenced here and recorded in the ``warnings`` column.

    Parameters
    ----------
    errors : pandas.DataFrame
        As :func:`rate_frame`.

    Returns
    -------
    table : pandas.DataFrame
        ``fit_rate``'s details and knobs per (method, metric), plus ``h0_exponent, h0_statistic, h0_p_value,
        aic_best_model, aic_weight_power`` (empty when no group has enough n values).
    results : dict of str to RateResult
        The fit of each metric (for :meth:`moestat.rates.RateResult.plot`).
    """
    import warnings

    from ..rates import RateWarning, compare_models, fit_rate, test_exponent

    tidy = rate_frame(errors)
    frames, results = [], {}
    for metric, g in tidy.groupby("metric", sort=True):
        with warnings.catch_warnings():  # short n ranges are flagged in the ``warnings`` column instead
            warnings.simplefilter("ignore", RateWarning)
            res = fit_rate(g, "error", by="method", rep="rep", **RATE_FIT)
        results[str(metric)] = res
        # fit_rate's best_model / delta_aic are dropped: the AIC columns below compare the three models
        tab = res.to_frame(details=True, config=True).drop(columns=["delta_aic", "best_model"])
        test = test_exponent(res, RATE_H0)
        tab["h0_exponent"] = RATE_H0
        tab["h0_statistic"] = test["statistic"].to_numpy()
        tab["h0_p_value"] = test["p_value"].to_numpy()
        aic = compare_models(g, "error", by="method", rep="rep").set_index(["method", "model"])
        best = aic[aic["best"]].reset_index().set_index("method")
        tab["aic_best_model"] = tab["method"].map(best["model"])
        tab["aic_weight_power"] = [aic.loc[(m, "power"), "akaike_weight"] for m in tab["method"]]
        tab.insert(1, "metric", metric)
        frames.append(tab)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), results


# ----------------------------------------------------------------------------- the study cell

DATA_KEYS = ("d", "k", "activation", "sigma", "regressors", "gate", "gate_norm", "truth_seed", "inputs",
             "mixture_p", "mixture_mu", "seed", "start_seed", "ns", "offset_starts")
"""Data knobs of :func:`gated_nn_cell` (the truth's ``data`` table).  The first eleven are keywords of
:func:`moestat.simulate_gated_nn` (defaults: the paper's d = 10, k = 2, identity experts, sigma = 0.05,
:math:`a_i^* = e_i`, :math:`w_1^* = e_3`).  ``seed``: the data seed (default: the study's data stream);
``start_seed``: the seed of the random starts (:func:`moestat.fit.tensor.gated_starts`) shared by every estimator
of this truth (default: a stream of the study's data seed); ``ns``: the n grid of an experiment that offsets both
integer seeds by the position of the cell's n in it (the i-th n draws its data from ``seed + i``), so that each n
has independent data and starts; ``offset_starts`` (default True): False keeps one start seed for every n of the
grid (only the data seed moves with n), as the nonlinear-experts experiment of the vignette ``gated-nn-recovery``
was first run."""

METHODS = ("tensor", "em", "l2", "gate")
"""Estimators of :func:`gated_nn_cell` (fit option ``method``): :func:`moestat.fit_tensor`,
:func:`moestat.fit_em_gated`, :func:`moestat.fit_l2_gated`, :func:`moestat.fit.tensor.fit_gate`."""

_CELL_OPTIONS = ("method", "restarts", "start_seed", "record_every", "experts", "experts_fit")
_STARTS_KEY = 2**31 - 1  # spawn-key entry of the default starts stream; replicates use 0..reps-1


def _seed_offset(n: int, ns: Any) -> int:
    """Position of ``n`` in the experiment's n grid ``ns`` (0 without a grid)."""
    if ns is None:
        return 0
    grid = [int(v) for v in ns]
    if n not in grid:
        raise ValueError(f"data.ns={grid} does not hold the cell's n={n}; list every n of the study in data.ns "
                         "(it offsets the seeds by the position of n) or leave ns out.")
    return grid.index(n)


def _seed(value: Any, offset: int, default: np.random.SeedSequence) -> int | np.random.SeedSequence:
    """An integer seed plus the n offset, or (``None``) a fresh copy of the study's stream ``default``."""
    if value is None:
        return np.random.SeedSequence(default.entropy, spawn_key=default.spawn_key)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"seed {value!r} must be a non-negative integer (or left out to use the study's streams).")
    return int(value) + offset


def _simulate(ctx: CellContext) -> tuple[GatedNNData, int]:
    """The cell's replicate data sets (from the truth's ``data`` table) and the seed offset of its n."""
    from ..simulators.gated_nn import simulate_gated_nn

    data_cfg = ctx.truth_cfg["data"]
    unknown = sorted(set(data_cfg) - set(DATA_KEYS))
    if unknown:
        raise ValueError(f"truth {ctx.truth_cfg.get('label')!r}: data knobs {unknown} are not known to "
                         f"gated_nn_cell; valid knobs are {list(DATA_KEYS)}.")
    offset = _seed_offset(ctx.n, data_cfg.get("ns"))
    sim = {k: v for k, v in data_cfg.items() if k not in ("seed", "start_seed", "ns", "offset_starts")}
    if "mixture_mu" in sim and not np.isscalar(sim["mixture_mu"]):
        sim["mixture_mu"] = np.asarray(sim["mixture_mu"], dtype=float)
    seed = _seed(data_cfg.get("seed"), offset, ctx.data_seed)
    return simulate_gated_nn(n=ctx.n, reps=ctx.reps, seed=seed, **sim), offset


def _starts(ctx: CellContext, value: Any, offset: int) -> int | np.random.SeedSequence:
    """Seed of the random starts: ``value`` + the n offset, or a stream of the study's data seed."""
    stream = np.random.SeedSequence(ctx.data_seed.entropy, spawn_key=(*ctx.data_seed.spawn_key, _STARTS_KEY))
    return _seed(value, offset, stream)


def _fit(data: GatedNNData, opts: Mapping[str, Any], start: int | np.random.SeedSequence,
         data_start: int | np.random.SeedSequence, device: str) -> GatedFit:
    """Run the estimator ``opts["method"]`` on ``data``; ``start`` seeds its random starts, ``data_start`` those
    shared by the truth's estimators (the least-squares experts of ``experts="l2"``)."""
    from ..fit.gated_baselines import fit_em_gated, fit_l2_gated
    from ..fit.tensor import fit_gate, fit_tensor, gated_starts

    method = opts.get("method")
    if method not in METHODS:
        raise ValueError(f"options.method={method!r} is not an estimator of gated_nn_cell; use one of "
                         f"{list(METHODS)}.")
    truth = data.truth
    assert truth is not None  # simulate_gated_nn always attaches its truth
    settings = {k: v for k, v in opts.items() if k not in _CELL_OPTIONS}
    settings.setdefault("activation", truth.activation)
    settings.setdefault("sigma", truth.sigma)
    settings.setdefault("device", device)
    if opts.get("record_every") is not None:
        settings.update(truth=truth, record_every=opts["record_every"])
    S = int(opts.get("restarts", 1))
    R, k, d = data.X.shape[0], truth.k, truth.d
    if method != "gate":
        fn: Callable[..., GatedFit] = {"tensor": fit_tensor, "em": fit_em_gated, "l2": fit_l2_gated}[method]
        return fn(data.X, data.y, k, restarts=S, init=gated_starts(R, S, k, d, seed=start), **settings)
    experts = opts.get("experts", "truth")
    if experts == "truth":
        A: Any = truth.regressors
    elif experts == "l2":  # the least-squares experts of every start (Fig. 2(b)), refitted from the truth's starts
        l2 = {"sigma": settings["sigma"], "activation": settings["activation"], "device": device,
              **dict(opts.get("experts_fit", {}))}
        A = fit_l2_gated(data.X, data.y, k, restarts=S, init=gated_starts(R, S, k, d, seed=data_start),
                         **l2).restart_regressors
    else:
        raise ValueError(f"options.experts={experts!r} is not valid for method 'gate'; use 'truth' (A = A*) or "
                         "'l2' (A = the least-squares estimate of every start).")
    return fit_gate(data.X, data.y, A, restarts=S, seed=start, **settings)


def _wide(errors: pd.DataFrame) -> pd.DataFrame:
    """Tidy errors (``rep, [restart,] metric, value``) as one column per metric, in :data:`ERROR_METRICS` order."""
    idx = [c for c in ("rep", "restart") if c in errors.columns]
    wide = errors.pivot(index=idx, columns="metric", values="value")
    return wide[[m for m in ERROR_METRICS if m in wide.columns]].reset_index().rename_axis(columns=None)


def gated_nn_cell(ctx: CellContext) -> CellOutput:
    r"""A :class:`moestat.Study` cell: simulate makkuva2020's gated network, fit it, score every start.

    The truth's ``data`` table holds the data knobs (:data:`DATA_KEYS`), passed to
    :func:`moestat.simulate_gated_nn` for ``ctx.reps`` replicates of size ``ctx.n``.  The fit's ``options`` hold

    * ``method`` (:data:`METHODS`): ``"tensor"`` (:func:`moestat.fit_tensor`), ``"em"``
      (:func:`moestat.fit_em_gated`), ``"l2"`` (:func:`moestat.fit_l2_gated`) or ``"gate"`` (the gate alone,
      :func:`moestat.fit.tensor.fit_gate`, with ``experts="truth"`` for :math:`A = A^*` or ``"l2"`` for the
      least-squares experts of every start, fitted with the settings ``experts_fit``);
    * ``restarts`` (random starts per replicate, default 1), ``start_seed`` (the seed of this fit's starts; default
      the truth's ``start_seed``, so that every estimator of a truth starts from the same points), and
      ``record_every`` (record errors along the iterations every so many iterations: the ``history`` piece);
    * every other option is a keyword of the estimator (``l4_iters``, ``iters``, ``gate_iters``, ...); ``sigma``
      and ``activation`` default to the truth's (known noise level, the paper's setting).

    Errors are :func:`moestat.metrics.gated.regressor_error` and :func:`moestat.metrics.gated.gating_error`
    (:data:`ERROR_METRICS`; the paper's :math:`\mathcal E_{\mathrm{reg}}` and Theorem 4's gate norm among them).

    Returns
    -------
    moestat.study.CellOutput
        Frame: one row per replicate (its selected restart: lowest final objective) with ``rep, method,
        objective, best_restart`` and the errors.  Pieces: ``restarts`` (one row per replicate x start:
        ``rep, restart``, the errors, ``objective`` and ``selected``) and, with ``record_every``, ``history``
        (the fit's trace ``rep, restart, stage, iter, metric, value``).
    """
    from ..cells import CellOutput

    opts = dict(ctx.fit_cfg.get("options", {}))
    data, offset = _simulate(ctx)
    offset_starts = ctx.truth_cfg["data"].get("offset_starts", True)
    if not isinstance(offset_starts, bool):
        raise ValueError(f"data.offset_starts must be true or false, got {offset_starts!r}.")
    start_offset = offset if offset_starts else 0
    data_start = _starts(ctx, ctx.truth_cfg["data"].get("start_seed"), start_offset)
    own = opts.get("start_seed")
    start = data_start if own is None else _starts(ctx, own, start_offset)
    fit = _fit(data, opts, start, data_start, str(ctx.device))
    frame = _wide(fit.errors(data.truth))
    frame.insert(1, "method", fit.method)
    frame.insert(2, "objective", fit.objective)
    frame.insert(3, "best_restart", fit.best_restart)
    restarts = _wide(fit.errors(data.truth, restarts=True))
    restarts["objective"] = fit.restart_objective[restarts["rep"].to_numpy(), restarts["restart"].to_numpy()]
    restarts["selected"] = restarts["restart"].to_numpy() == fit.best_restart[restarts["rep"].to_numpy()]
    pieces = {"restarts": restarts}
    if opts.get("record_every") is not None:
        pieces["history"] = fit.history.reset_index(drop=True)
    return CellOutput(frame, pieces)
