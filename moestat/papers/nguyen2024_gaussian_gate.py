r"""Nguyen, Nguyen, Nguyen & Ho (2024), "Towards convergence rates for parameter estimation in Gaussian-gated mixture
of experts" (AISTATS 2024; arXiv:2305.07572): its simulation truths, the rates of its maximum-likelihood estimator as
data, the near-truth starts of its code, and the :class:`moestat.Study` cell that reruns its experiment.

The model is the Gaussian-gated MoE read as a joint density of :math:`(X, Y)` (the GLLiM parameterisation,
:mod:`moestat.fit.gllim`):

.. math:: p_G(x, y) = \sum_{i=1}^{K} \pi_i\, \mathcal N(x; c_i, \Gamma_i)\, \mathcal N(y; A_i x + b_i, \nu_i).

The estimator the theory is about is the maximum-likelihood estimator of this joint density: its Voronoi losses
contain :math:`|\sum_{i\in\mathcal A_j}\pi_i - \pi^*_j|`, :math:`\|\Delta c\|` and :math:`\|\Delta\Gamma\|`, which
only the joint likelihood identifies (the conditional density :math:`p_G(y\mid x)` sees the gate only through the
differences of its quadratic scores), and the authors' code (github.com/Trung-TinNGUYEN/CRPE-GMoE) maximises the
joint likelihood by EM (``functions.py``, ``em_GLLiM``).  moestat fits it with :func:`moestat.fit.gllim.fit_gllim`.
moestat's gate ``"gaussian"`` is the conditional, unit-covariance form of this gate and is not used here; the truths
are not :class:`moestat.simulators.truth.Truth` objects, because the inputs come from the gate's own mixture
:math:`\sum_i \pi_i\mathcal N(c_i, \Gamma_i)` (which a ``Truth`` cannot express): they are
:class:`~moestat.fit.gllim.GLLiMParams`, simulated by :func:`moestat.fit.gllim.simulate_gllim`.

Contents

* :data:`SETTINGS` / :func:`gllim_truth`: the four true models of the authors' ``models.py`` (:math:`K^* = 3`,
  after the simulation of Ho & Nguyen 2016, Ann. Statist.): settings 1, 3 are Type I (every gate mean
  :math:`c^*_j \ne 0`), 2, 4 Type II (:math:`c^*_1 = 0`); :math:`d = 1` (1, 2) or 2 (3, 4), :math:`l = 1`.
* :func:`near_truth_start`: the code's starting values (every true atom gets at least one fitted atom; Gaussian
  noise of sd :math:`0.005\,n^{-0.083}` on means, slopes and intercepts, :math:`|N(0, (0.0005\,n^{-0.25})^2)|` added
  to the variances).
* :func:`gllim_cell`: a :class:`moestat.Study` cell (``cell="moestat.papers.nguyen2024_gaussian_gate:gllim_cell"``).
* :data:`THEORY`: the rates as rows of :func:`moestat.rates.theory_rates`; :func:`decide`: the success criterion.
* :func:`peer_grid`, :data:`PEER`: the authors' n grid and repository.

The Voronoi loss is :func:`moestat.metrics.gaussian_gate_voronoi.gaussian_gate_voronoi_loss`.  The reproduction is
the vignette ``gaussian-gated-moe``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .._validation import check_choice, check_int
from ..fit.gllim import BLOCKS, METHODS, GLLiMParams, fit_gllim, simulate_gllim
from ..metrics.gaussian_gate_voronoi import (
    GG_BLOCKS,
    KNOWN_RBAR,
    KNOWN_RTILDE,
    gaussian_gate_cell_errors,
    gaussian_gate_voronoi_frame,
)

if TYPE_CHECKING:
    from ..cells import CellContext, CellOutput

__all__ = ["DATA_KEYS", "FIT_KEYS", "K_STAR", "PEER", "RBAR", "REFERENCE", "RTILDE", "SETTINGS", "SUCCESS", "THEORY",
           "decide", "gllim_cell", "gllim_truth", "near_truth_start", "peer_grid", "settings_table", "start_pattern"]

REFERENCE = ("Nguyen, H., Nguyen, T., Nguyen, K. and Ho, N. (2024). Towards convergence rates for parameter "
             "estimation in Gaussian-gated mixture of experts. Proceedings of the 27th International Conference on "
             "Artificial Intelligence and Statistics (AISTATS), PMLR 238; arXiv:2305.07572.")

PEER = {"repository": "github.com/Trung-TinNGUYEN/CRPE-GMoE", "commit": "e04efe24c22338434e134e23e1e77d16de474e77"}
"""The authors' code, as read for this module (settings, starts, losses, stored fits)."""

K_STAR = 3
"""True number of experts in every setting."""

RBAR: dict[int, float] = dict(KNOWN_RBAR)
r""":math:`\bar r(m)` of a Type I cell of :math:`m` fitted atoms."""

RTILDE: dict[int, float] = dict(KNOWN_RTILDE)
r""":math:`\tilde r(m)` of a Type II (zero gate mean) cell, as in the authors' code."""

# ----------------------------------------------------------------------------- the four true models
_A1, _A2 = 0.017324 / 0.042824, -0.0125 / 0.0175
"""Slopes of experts 1 and 2: covariances over variances of the joint Gaussians of Ho & Nguyen (2016)."""

SETTINGS: dict[int, dict[str, Any]] = {
    1: {"type": "I", "d": 1, "c": [[-0.1], [0.1], [0.5]], "label": "Type I, d = 1"},
    2: {"type": "II", "d": 1, "c": [[0.0], [0.1], [0.5]], "label": "Type II, d = 1"},
    3: {"type": "I", "d": 2, "c": [[-0.1, -0.1], [0.1, 0.1], [0.5, 0.5]], "label": "Type I, d = 2"},
    4: {"type": "II", "d": 2, "c": [[0.0, 0.0], [0.1, 0.1], [0.5, 0.5]], "label": "Type II, d = 2"},
}
"""The four settings of CRPE-GMoE ``models.py``: gate means :math:`c^*` (the rest is :func:`gllim_truth`)."""


def gllim_truth(setting: int) -> GLLiMParams:
    r"""The true model of ``setting`` (1-4), with :math:`K^* = 3` and :math:`l = 1`, as CRPE-GMoE ``models.py``.

    Weights :math:`\pi^* = (0.3, 0.4, 0.3)`; gate means :math:`c^*` of :data:`SETTINGS` (in :math:`d = 2` both
    coordinates equal); gate covariances :math:`\Gamma^* = (0.042824, 0.0175, 0.01)\,I_d`; slopes
    :math:`a_1 = 0.017324/0.042824`, :math:`a_2 = -0.0125/0.0175`, :math:`a_3 = 0` (every row of :math:`A_j` equal to
    :math:`a_j`); intercepts :math:`b_j = \beta_j - a_j\,c^*_{j1}` with :math:`\beta = (0.3, -0.4, 0.2)`; expert
    variances :math:`\nu_1 = 0.0081759 - 0.017324\,a_1 c^*_{11}` (Type I) or :math:`0.0081759 - 0.017324\,a_1` (Type
    II; the code's formula differs between the two), :math:`\nu_2 = 0.0175 + 0.0125^2/0.0175`,
    :math:`\nu_3 = 0.0175`.  The numbers are those of the code (after the joint Gaussians of Ho & Nguyen 2016), not
    derived here.
    """
    if isinstance(setting, bool) or setting not in SETTINGS:
        raise ValueError(f"setting={setting!r} is not a CRPE-GMoE setting; valid settings are {list(SETTINGS)}.")
    spec = SETTINGS[setting]
    d = spec["d"]
    c = np.asarray(spec["c"], dtype=float)
    a = np.array([_A1, _A2, 0.0])
    c1 = c[:, 0]
    nu1 = 0.0081759 - 0.017324 * _A1 * (c1[0] if spec["type"] == "I" else 1.0)
    return GLLiMParams(pi=np.array([0.3, 0.4, 0.3]), c=c,
                       Gamma=np.array([0.042824, 0.0175, 0.01])[:, None, None] * np.eye(d),
                       A=np.repeat(a[:, None, None], d, axis=2),
                       b=(np.array([0.3, -0.4, 0.2]) - a * c1)[:, None],
                       nu=np.array([nu1, 0.0175 + 0.0125 ** 2 / 0.0175, 0.0175])[:, None, None])


def peer_grid(n_num: int = 100, ns_max: int = 100_000) -> np.ndarray:
    """The sample sizes of CRPE-GMoE ``experiment.py``: 5 evenly spaced in [100, 500], then ``n_num - 5`` evenly
    spaced in [500, ``ns_max``] (500 twice), truncated to integers."""
    n_num = check_int("n_num", n_num, minimum=6)
    ns = np.concatenate([np.linspace(100, 500, 5), np.linspace(500, ns_max, n_num - 5)])
    out: np.ndarray = ns.astype(int)
    return out


# ----------------------------------------------------------------------------- starts
def start_pattern(truth: GLLiMParams, k: int, rng: np.random.Generator) -> np.ndarray:
    """The true atom each of ``k`` fitted atoms starts at: uniform draws, redrawn until every true atom is used
    (the partition rule of CRPE-GMoE ``experiment.py``)."""
    k_star = truth.k
    if k < k_star:
        raise ValueError(f"k={k} fitted atoms cannot cover the {k_star} true atoms; pass k >= {k_star}.")
    while True:
        s = rng.integers(0, k_star, size=k)
        if np.unique(s).size == k_star:
            return s


def near_truth_start(truth: GLLiMParams, k: int, n: int, rng: np.random.Generator, *, scale: float = 1.0,
                     pattern: np.ndarray | None = None) -> GLLiMParams:
    r"""A start near the truth as in CRPE-GMoE ``experiment.py`` (``init_params_GLLiM``).

    Fitted atom :math:`i` copies true atom :math:`s_i` (:func:`start_pattern`) with weight :math:`\pi^*_{s_i}/m_{s_i}`
    (:math:`m_j` atoms share atom :math:`j`); :math:`c, A, b` get independent :math:`N(0, \sigma_1^2)` noise and the
    diagonals of :math:`\Gamma, \nu` get :math:`|N(0, \sigma_2^2)|`, with :math:`\sigma_1 = 0.005\,n^{-0.083}` and
    :math:`\sigma_2 = 0.0005\,n^{-0.25}`, both times ``scale``.  The noise shrinks with :math:`n`: the start itself
    approaches the truth as the sample grows.  ``pattern`` (the :math:`s_i`) is drawn by :func:`start_pattern` when
    not given.
    """
    s = start_pattern(truth, k, rng) if pattern is None else np.asarray(pattern, dtype=int)
    if s.shape != (k,) or s.min() < 0 or s.max() >= truth.k:
        raise ValueError(f"pattern must hold {k} true-atom indices in [0, {truth.k}), got {s!r}.")
    counts = np.bincount(s, minlength=truth.k)
    sd1, sd2 = scale * 0.005 * n ** -0.083, scale * 0.0005 * n ** -0.25
    d, l_ = truth.d, truth.l

    def jitter_cov(cov: np.ndarray, p: int) -> np.ndarray:
        out: np.ndarray = cov[s] + np.abs(rng.normal(0.0, sd2, size=(k, p)))[:, :, None] * np.eye(p)
        return out

    c = truth.c[s] + rng.normal(0.0, sd1, size=(k, d))
    gamma = jitter_cov(truth.Gamma, d)
    a = truth.A[s] + rng.normal(0.0, sd1, size=(k, l_, d))
    b = truth.b[s] + rng.normal(0.0, sd1, size=(k, l_))
    nu = jitter_cov(truth.nu, l_)
    return GLLiMParams(pi=truth.pi[s] / counts[s], c=c, Gamma=gamma, A=a, b=b, nu=nu)


# ----------------------------------------------------------------------------- theory
_SRC = "nguyen2024_gaussian_gate"
_NAMES = {"c": "gate means c", "Gamma": "gate covariances Gamma", "A": "expert slopes A", "b": "expert intercepts b",
          "nu": "expert variances nu"}


def _block_rows(kind: str, m: int, r: float) -> list[tuple[Any, ...]]:
    """Per-block rows of a cell of ``m`` atoms: Type I (``kind="I"``, exponent r = rbar(m)) or Type II (``"II"``)."""
    rows = []
    for block in GG_BLOCKS:
        if block in ("c", "b"):
            e, how = 1.0 / (2 * r), f"|d {block}|^{r:g}"
        elif block == "A" and kind == "I":
            e, how = 0.25, "|d A|^2"
        else:
            e, how = 1.0 / r, f"|d {block}|^{r / 2:g}"
        name = "rbar" if kind == "I" else "rtilde"
        response = f"{block}_cell{m}" if kind == "I" else f"{block}_zero_cell{m}"
        where = "a cell whose true gate mean is non-zero" if kind == "I" else "the cell of a zero gate mean"
        rows.append((_SRC, f"over-specified MLE, Type {kind} cell", "gaussian", "over", "linear", "",
                     f"{_NAMES[block]} in {where} with {m} fitted atoms", response, "n",
                     f"(log n / n)^{{{e:g}}}", e, "power_log", "decay", "upper_bound",
                     f"{name}({m}) = {r:g}: the loss term {how} falls like (log n / n)^(1/2)"))
    return rows


THEORY: list[tuple[Any, ...]] = [
    (_SRC, "density estimation", "gaussian", "exact|over", "linear", "",
     "expected Hellinger distance of the joint density", "hellinger", "n", "(log n / n)^{1/2}", 0.5, "power_log",
     "decay", "upper_bound", "joint density of (X, Y); any K >= K*"),
    (_SRC, "MLE, Voronoi loss (Type I and II)", "gaussian", "exact|over", "linear", "",
     "Voronoi loss D(G_n, G*) (gaussian_gate_voronoi_loss)", "gg_loss", "n", "(log n / n)^{1/2}", 0.5,
     "power_log", "decay", "upper_bound",
     "one loss for both settings: Type II cells (zero gate mean) raise |d A| to rtilde/2 instead of 2"),
    (_SRC, "MLE, Voronoi loss (Type I and II)", "gaussian", "exact|over", "linear", "",
     "sum over true atoms of |weight sum of the cell - pi*_j|", "weight_gap", "n", "(log n / n)^{1/2}", 0.5,
     "power_log", "decay", "upper_bound", "the first term of the loss"),
    *[(_SRC, "MLE, atoms alone in their cell", "gaussian", "exact|over", "linear", "",
       f"{_NAMES[block]} of an atom alone in its Voronoi cell", f"{block}_exact", "n", "(log n / n)^{1/2}", 0.5,
       "power_log", "decay", "upper_bound", "every atom when K = K*") for block in GG_BLOCKS],
    *[row for m, r in RBAR.items() for row in _block_rows("I", m, r)],
    *[row for m, r in RTILDE.items() for row in _block_rows("II", m, r)],
]
"""The paper's rates as rows of :data:`moestat.rates.theory.THEORY_COLUMNS`.  The per-block rows follow from the
loss's bound (each term is at most the loss); their ``response`` names are the columns of the vignette's cell
tables (``<block>_exact``, ``<block>_cell<m>``, ``<block>_zero_cell<m>``)."""

SUCCESS = {"theory_exponent": 0.5, "model": "power_log"}
"""The loss agrees with the theory when its ``power_log`` exponent's interval covers 1/2 (:func:`decide`)."""


def decide(verdict: str, ci_low: float, ci_high: float, theory: float = 0.5) -> str:
    """The success criterion for one rate: ``"agrees"`` when ``[ci_low, ci_high]`` covers ``theory`` and the
    verdict reads a rate (``"power law"`` or ``"imprecise"``); ``"faster than theory"`` / ``"slower than theory"``
    when the interval lies above / below it; ``"undecided (<verdict>)"`` when the verdict reads no rate."""
    if verdict in ("range too narrow", "no decay", "curved: exponent is local"):
        return f"undecided ({verdict})"
    if not (np.isfinite(ci_low) and np.isfinite(ci_high)):
        return "undecided (no interval)"
    if ci_low > theory:
        return "faster than theory"
    if ci_high < theory:
        return "slower than theory"
    return "agrees"


# ----------------------------------------------------------------------------- the study cell
DATA_KEYS = ("setting",)
"""Keys of a truth's ``data`` table read by :func:`gllim_cell`."""

FIT_KEYS = ("k", "method", "max_iter", "tol", "var_floor", "steps", "start_scale")
"""Keys of a fit's ``options`` read by :func:`gllim_cell`."""

_STARTS_KEY = 7_919
"""Spawn-key entry of the start stream (shared by every fit of one truth and n, so that fits of the same k start
from the same points)."""


def _seeds(ctx: CellContext, key: int | None = None) -> list[np.random.SeedSequence]:
    base = ctx.data_seed
    head = (*base.spawn_key, key) if key is not None else tuple(base.spawn_key)
    return [np.random.SeedSequence(base.entropy, spawn_key=(*head, r)) for r in range(ctx.reps)]


def _options(ctx: CellContext) -> dict[str, Any]:
    data = ctx.truth_cfg.get("data", {})
    unknown = sorted(set(data) - set(DATA_KEYS))
    if unknown or "setting" not in data:
        what = f"data knobs {unknown} are not read" if unknown else "data has no 'setting'"
        raise ValueError(f"truth {ctx.truth_cfg.get('label')!r}: {what}; gllim_cell needs data = {{'setting': s}} "
                         f"with s one of {list(SETTINGS)}.")
    opts = dict(ctx.fit_cfg.get("options", {}))
    unknown = sorted(set(opts) - set(FIT_KEYS))
    if unknown:
        raise ValueError(f"fit {ctx.fit_cfg.get('label')!r}: options {unknown} are not read by gllim_cell; valid "
                         f"options are {list(FIT_KEYS)}.")
    if "k" not in opts:
        raise ValueError(f"fit {ctx.fit_cfg.get('label')!r}: options.k (fitted experts, >= {K_STAR}) is required.")
    check_choice("options.method", opts.get("method", "lbfgs"), METHODS)
    return opts


def _flat_params(params: GLLiMParams) -> pd.DataFrame:
    """Fitted parameters, one row per replicate, one column per entry (``pi_0``, ``c_1_0``, ``A_0_0_1``, ...)."""
    cols: dict[str, np.ndarray] = {"rep": np.arange(params.reps)}
    for name in BLOCKS:
        arr = getattr(params, name)
        for idx in np.ndindex(*arr.shape[1:]):
            key = (slice(None), *idx)
            cols["_".join([name, *map(str, idx)])] = arr[key]
    return pd.DataFrame(cols)


def gllim_cell(ctx: CellContext) -> CellOutput:
    r"""A :class:`moestat.Study` cell: simulate a CRPE-GMoE setting, fit the joint MLE from near-truth starts, score.

    The truth's ``data`` table holds ``setting`` (1-4, :func:`gllim_truth`); the fit's ``options`` hold ``k``
    (fitted experts), ``method`` (:data:`moestat.fit.gllim.METHODS`, default ``"lbfgs"``), ``max_iter`` (default
    5000), ``tol`` (default :math:`10^{-9}`), ``var_floor`` (default :math:`10^{-3}`), ``start_scale`` (multiplies the
    start noise, default 1) and ``steps``:
    when given, exactly that many plain EM steps (the protocol of CRPE-GMoE's stored fits, ``steps=1``; such rows
    are ``ok`` by design).  Replicate ``r``'s data use child ``r`` of the cell's data seed; its start (from
    :func:`near_truth_start`) uses child ``r`` of a start stream of the same seed, shared by every fit of the truth
    and n, so fits with the same ``k`` start from the same point.

    Returns
    -------
    moestat.study.CellOutput
        Frame, one row per replicate: ``method, k_fit, loglik, loglik_start, n_iter, converged, at_floor`` (a
        variance at its lower bound, :class:`moestat.fit.gllim.GLLiMFit`) (and ``status``,
        ``message`` for fixed-step fits), the loss ``gg_loss`` (Euclidean cells) with its parts (``weight_gap,
        exact_part, over_part, cell_sizes, empty_cells, cell_<j>``), the loss in the code's convention
        ``gg_loss_sum`` (cells by the sum of block norms, its ``cell_sizes_sum``) and ``start_pattern`` (fitted
        atoms per true atom at the start).  Pieces: ``cells`` (:func:`moestat.metrics.gaussian_gate_voronoi.
        gaussian_gate_cell_errors` with ``rep``) and ``params`` (the fitted parameters, one row per replicate).
    """
    from ..cells import CellOutput

    opts = _options(ctx)
    truth = gllim_truth(int(ctx.truth_cfg["data"]["setting"]))
    k = check_int("options.k", opts["k"], minimum=K_STAR)
    X, Y, _ = simulate_gllim(truth, ctx.n, ctx.reps, seed=_seeds(ctx))
    rngs = [np.random.default_rng(s) for s in _seeds(ctx, _STARTS_KEY)]
    scale = float(opts.get("start_scale", 1.0))
    patterns = [start_pattern(truth, k, rng) for rng in rngs]
    start = GLLiMParams.stack([near_truth_start(truth, k, ctx.n, rng, scale=scale, pattern=s)
                               for rng, s in zip(rngs, patterns, strict=True)])
    steps = opts.get("steps")
    if steps is not None:
        fit = fit_gllim(X, Y, start, method="em", max_iter=check_int("options.steps", steps), tol=0.0)
    else:
        fit = fit_gllim(X, Y, start, method=opts.get("method", "lbfgs"), max_iter=int(opts.get("max_iter", 5000)),
                        tol=float(opts.get("tol", 1e-9)), var_floor=float(opts.get("var_floor", 1e-3)))
    frame = pd.DataFrame({"rep": np.arange(ctx.reps), "method": "em" if steps is not None else
                          opts.get("method", "lbfgs"), "k_fit": k, "loglik": fit.loglik,
                          "loglik_start": [h[0] for h in fit.history], "n_iter": fit.n_iter,
                          "converged": fit.converged, "at_floor": fit.at_floor})
    if steps is not None:
        frame["status"] = "ok"
        frame["message"] = f"{int(steps)} EM step(s) by design (the protocol of CRPE-GMoE's stored fits)"
    loss = gaussian_gate_voronoi_frame(fit.params, truth).rename(columns={"loss": "gg_loss"})
    code = gaussian_gate_voronoi_frame(fit.params, truth, cell_distance="sum")
    frame = pd.concat([frame, loss], axis=1)
    frame["gg_loss_sum"] = code["loss"].to_numpy()
    frame["cell_sizes_sum"] = code["cell_sizes"].to_numpy()
    frame["start_pattern"] = ["-".join(map(str, np.bincount(s, minlength=truth.k))) for s in patterns]
    cells = gaussian_gate_cell_errors(fit.params, truth)
    return CellOutput(frame, {"cells": cells, "params": _flat_params(fit.params)})


def settings_table() -> pd.DataFrame:
    """The four true models, one row per setting and atom (for the vignette's page)."""
    rows = []
    for setting, spec in SETTINGS.items():
        t = gllim_truth(setting)
        for j in range(t.k):
            rows.append({"setting": setting, "type": spec["type"], "d": spec["d"], "atom": j + 1,
                         "pi": t.pi[j], "c": t.c[j].tolist(), "Gamma": float(t.Gamma[j, 0, 0]),
                         "A": t.A[j, 0].tolist(), "b": float(t.b[j, 0]), "nu": float(t.nu[j, 0, 0])})
    return pd.DataFrame(rows)
