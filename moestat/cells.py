r"""What one cell of a study computes: truths, estimators, metrics and the built-in cell.

A *cell* of a :class:`moestat.Study` is one (truth, fitted model, n) combination; it
simulates ``reps`` replicate data sets and fits all of them in **one batched call**.
Estimators and metrics are looked up by name in two small registries:

* an estimator is ``fn(spec, X, y, *, truth, seed, device, **options) -> Estimate``
  (``X (R, n, d)``, ``y (R, n)``; ``truth`` is the :class:`~moestat.simulators.Truth`);
* a metric is ``fn(ctx: MetricContext, **options)`` returning an ``(R,)`` array (one column
  named after the metric) or a dict ``{column: (R,) array}``.

Both registries accept new entries (:func:`register_estimator`, :func:`register_metric`);
a study also accepts the functions themselves (module-level, so that worker processes can
import them) and, for experiments that are not "simulate, fit, score", a whole cell callable
(:class:`CellContext` in, tidy frame out).

Failed fits are rows, never silently redrawn: every row carries ``status`` (``"ok"``,
``"not_converged"`` or ``"error"``, :data:`STATUSES`) and ``message``.  When the batched fit of a
cell raises, the built-in cell refits each replicate alone (:func:`estimator_cell`), so one bad
replicate costs one row, not the cell; a metric that raises marks the cell's rows ``"error"`` and
keeps the fits' columns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import pickle
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ._validation import Choice, Constraint, Real
from .checkpoint import write_atomic
from .model import MoE
from .params import Params
from .simulators.regression import Dataset, simulate
from .simulators.truth import PRESETS, Truth

# ---------------------------------------------------------------------------- truths

TRUTH_SIM_KEYS = ("inputs", "low", "high", "model", "design")
"""Simulation knobs a truth entry may carry (passed to :func:`moestat.simulate`; ``design`` is ``"random"``,
``"linspace"`` or an (n, d) array given as a list of rows)."""

STATUSES = ("ok", "not_converged", "error")
"""Values of the ``status`` column: the fit converged, it did not, or it (or a metric on it) raised."""

EXPLICIT_TRUTH_KEYS = ("gate", "expert", "k", "d", "noise_sd", "top_k", "temperature", "params")
"""Keys of an explicit truth (an :class:`~moestat.MoE` and its parameters)."""


def preset_keys(name: str) -> tuple[str, ...]:
    """Keyword arguments a truth entry may give preset ``name`` (from its signature; ``n`` is the cell's)."""
    fn = PRESETS[name]
    return tuple(p.name for p in inspect.signature(fn).parameters.values() if p.name != "n")


def indexed_by_n(name: str) -> bool:
    """Whether preset ``name`` builds a sequence of truths :math:`G^*_n`: it takes the sample size ``n``."""
    return "n" in inspect.signature(PRESETS[name]).parameters


def build_truth(cfg: Mapping[str, Any], n: int | None = None) -> Truth:
    """The true model described by a (validated) truth entry of a study, at sample size ``n`` for a preset that
    is indexed by n (:func:`indexed_by_n`; e.g. a local alternative whose atoms approach each other as n grows)."""
    if cfg.get("preset") is not None:
        kwargs = {k: v for k, v in cfg.items() if k in preset_keys(cfg["preset"])}
        if indexed_by_n(cfg["preset"]):
            if n is None:
                raise ValueError(f"preset {cfg['preset']!r} is a sequence of truths indexed by n; build it for a "
                                 "sample size (build_truth(cfg, n=...)).")
            kwargs["n"] = int(n)
        return PRESETS[cfg["preset"]](**kwargs)
    spec = MoE(**{k: cfg[k] for k in ("gate", "expert", "k", "d", "noise_sd", "top_k", "temperature")
                  if cfg.get(k) is not None})
    params = Params(**{k: np.asarray(v, dtype=np.float64) for k, v in cfg["params"].items()})
    spec.check_params(params)
    zero = np.flatnonzero(np.all(np.asarray(params.numpy().gate_weight) == 0, axis=-1))
    info = {"source": "explicit", "duplicate": [], "zero_slope_atoms": [int(i) for i in zero]}
    return Truth(spec, params, info)


def simulate_cell(truth: Truth, truth_cfg: Mapping[str, Any], n: int, reps: int,
                  seed: np.random.SeedSequence) -> Dataset:
    """Replicate data sets of one cell (replicate r uses child r of ``seed``)."""
    spec, params = truth
    kw = {k: truth_cfg[k] for k in TRUTH_SIM_KEYS if truth_cfg.get(k) is not None}
    return simulate(spec, params, n=n, reps=reps, seed=seed, **kw)


# ------------------------------------------------------------------------ estimators

@dataclass
class Estimate:
    """What an estimator returns to the study runner.

    Attributes
    ----------
    params : Params
        Fitted parameters, batched over the R replicates (numpy or torch).
    objective : ndarray, shape (R,)
        Final value of the estimator's objective (e.g. the mean squared residual).
    converged : ndarray of bool, shape (R,)
        Per-replicate convergence flags.
    info : dict of str to ndarray (R,)
        Further per-replicate diagnostics (iterations, gradient norm, conditioning, ...);
        each becomes a column of the study frame.
    settings : dict of str to scalar
        The estimator's resolved settings (defaults filled in); each becomes a column.
    alt : Estimate, optional
        A second fit of the same data (the optimiser-invariance check): every metric is computed for it
        too, in columns suffixed ``_alt``, with ``objective_alt``, ``converged_alt`` and ``status_alt``.
    """

    params: Params
    objective: np.ndarray
    converged: np.ndarray
    info: dict[str, np.ndarray] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    alt: Estimate | None = None


def ols_estimator(spec: MoE, X: np.ndarray, y: np.ndarray, *, truth: Truth | None = None,
                  seed: np.random.SeedSequence | None = None, device: str = "cpu",
                  ridge: float = 0.0) -> Estimate:
    r"""Closed-form least squares for a one-expert linear model (the exact LSE of that model).

    With ``k = 1`` and a softmax gate the gate weight is identically 1, so
    :math:`f(x) = a^\top x + b` and eq. (3) of nguyen2024 is ordinary least squares:
    :math:`(\hat a, \hat b) = \arg\min \sum_t (y_t - a^\top x_t - b)^2`, solved for all
    replicates at once with a batched SVD solve (``torch.linalg.lstsq``, driver ``gelsd``); ``ridge > 0`` adds
    :math:`\lambda\|a\|^2` (normal equations).  A baseline and a cheap, exact estimator for
    testing study machinery.  It always runs on the CPU: ``gelsd`` has no CUDA implementation, and a
    (d + 1)-column solve gains nothing from a GPU (``device`` is accepted for the study's uniform call).
    """
    if spec.k != 1 or spec.expert != "linear" or spec.gate != "softmax":
        raise ValueError("estimator 'ols' fits the one-expert linear model only: use k=1, expert='linear', "
                         f"gate='softmax' (got k={spec.k}, expert={spec.expert!r}, gate={spec.gate!r}).")
    dev = torch.device("cpu")
    Xt = torch.as_tensor(X, dtype=torch.float64, device=dev)
    yt = torch.as_tensor(y, dtype=torch.float64, device=dev)
    R, n, d = Xt.shape
    Z = torch.cat([Xt, torch.ones(R, n, 1, dtype=Xt.dtype, device=dev)], dim=-1)
    if ridge > 0:
        pen = torch.eye(d + 1, dtype=Xt.dtype, device=dev) * ridge
        pen[d, d] = 0.0
        coef = torch.linalg.solve(Z.transpose(1, 2) @ Z + pen, Z.transpose(1, 2) @ yt.unsqueeze(-1))[..., 0]
    else:
        # gelsd (SVD) is deterministic run to run; the default pivoted-QR driver is not bitwise reproducible
        coef = torch.linalg.lstsq(Z, yt.unsqueeze(-1), driver="gelsd").solution[..., 0]
    resid = yt - (Z @ coef.unsqueeze(-1))[..., 0]
    zeros = np.zeros((R, 1, d))
    params = Params(np.zeros((R, 1)), zeros, coef[:, None, :d].cpu().numpy(), coef[:, d:].cpu().numpy())
    return Estimate(params, (resid**2).mean(-1).cpu().numpy(), np.ones(R, dtype=bool),
                    {"rank": torch.linalg.matrix_rank(Z).cpu().numpy()})


def lse_estimator(spec: MoE, X: np.ndarray, y: np.ndarray, *, truth: Truth | None = None,
                  seed: np.random.SeedSequence | None = None, device: str = "auto",
                  **options: Any) -> Estimate:
    """The least-squares estimator :func:`moestat.fit_lse` as a study estimator.

    With ``init="near_truth"`` (the default when a truth is known) the true parameters are passed on;
    when the fitted model has more experts than the truth and ``duplicate`` is not given, the
    preset's default duplicated atoms (``truth.info["duplicate"]``) are used.  The resolved settings
    of the fit (``duplicate``, ``init_scale``, ``max_iter``, tolerances, ...) become columns.
    """
    from .fit.lse import ConvergenceWarning, fit_lse

    opts = dict(options)
    invariance = opts.pop("invariance", None)
    init = opts.get("init", "near_truth" if truth is not None else "auto")
    opts["init"] = init
    uses_truth = init == "near_truth" or (isinstance(init, (list, tuple)) and "near_truth" in init)
    if uses_truth and truth is not None:
        opts.setdefault("truth", truth.params)
        if spec.k > truth.spec.k and "duplicate" not in opts:
            opts["duplicate"] = default_duplicate(spec, truth)
    with warnings.catch_warnings():
        # convergence is recorded per replicate in the frame (converged, status, n_iter columns)
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit = fit_lse(spec, X, y, seed=seed, device=device, **opts)
        est = estimate_from_fit(fit)
        if invariance is not None:
            alt = _invariance_options(invariance)
            starts = alt.pop("starts", "all")
            alt_opts = {**opts, **alt}
            if starts == "best":  # the second solver starts where the first solver's winning restart started
                rows = fit.restarts.index[fit.restarts["best"]].to_numpy()
                for key in ("truth", "duplicate", "init_scale", "restarts"):
                    alt_opts.pop(key, None)
                alt_opts["init"] = fit.start_params.select(rows)
            est.alt = estimate_from_fit(fit_lse(spec, X, y, seed=seed, device=device, **alt_opts))
            est.settings["invariance"] = alt_opts["optimizer"]
            est.settings["invariance_starts"] = starts
    return est


def default_duplicate(spec: MoE, truth: Truth) -> list[int]:
    """The true atoms that get the ``k - k*`` extra fitted copies of a near-truth start: the truth's recorded
    default (``truth.info["duplicate"]``, set by the presets), else an error asking for ``options.duplicate``."""
    extra = spec.k - truth.spec.k
    if extra <= 0:
        return []
    dup = [int(j) for j in truth.info.get("duplicate", [])]
    if len(dup) < extra:
        raise ValueError(f"the fit has {extra} more experts than the truth; give options.duplicate, the "
                         f"{extra} true atoms (0-based) that get an extra fitted copy.")
    return dup[:extra]


def _lse_options_target() -> Callable[..., Any]:
    from .fit.lse import fit_lse

    return fit_lse


class _Invariance(Constraint):
    """The ``invariance`` option: an optimizer name or a table with an ``optimizer`` key (and ``starts``)."""

    description = ("an optimizer name (e.g. 'lm') or a table with an 'optimizer' key and optionally "
                   "starts = 'all' or 'best'")

    def accepts_type(self, value: Any) -> bool:
        return isinstance(value, (str, Mapping))

    def accepts(self, value: Any) -> bool:
        if isinstance(value, str):
            return True
        return (isinstance(value, Mapping) and "optimizer" in value
                and value.get("starts", "all") in INVARIANCE_STARTS)


lse_estimator.forwards_to = _lse_options_target  # type: ignore[attr-defined]
lse_estimator.extra_options = ("invariance",)  # type: ignore[attr-defined]
lse_estimator.extra_constraints = {"invariance": _Invariance()}  # type: ignore[attr-defined]

#: Arguments a study passes to every estimator itself (not options of a fit entry).
STUDY_SUPPLIED = ("spec", "X", "y", "truth", "seed", "device")


def estimator_options(fn: Callable[..., Any]) -> tuple[set[str] | None, dict[str, Any]]:
    """Option names an estimator accepts (None: any, it takes ``**options`` it does not forward to a known fitter;
    the fitter's arguments count, less the estimator's ``excluded_options``) and the constraint table of its
    options: the fitter's, updated with the estimator's own ``extra_constraints`` (a dict, or a function returning
    one; empty if none)."""
    params = inspect.signature(fn).parameters
    named = {k for k, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    names = named - set(STUDY_SUPPLIED)
    extra = getattr(fn, "extra_constraints", {})
    own = dict(extra() if callable(extra) else extra)
    forwards = getattr(fn, "forwards_to", None)
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return names, own
    if forwards is None:
        return None, own
    target = forwards()
    names |= set(inspect.signature(target).parameters) - set(STUDY_SUPPLIED)
    names |= set(getattr(fn, "extra_options", ()))
    names -= set(getattr(fn, "excluded_options", ()))
    return names, {**dict(getattr(target, "parameter_constraints", {})), **own}


INVARIANCE_STARTS = ("all", "best")


def _invariance_options(invariance: Any) -> dict[str, Any]:
    """Options of the second solver: ``"lm"``/``"lbfgs"``/... or a table with ``optimizer``, its settings and
    ``starts`` (``"all"``: the first fit's starts; ``"best"``: per replicate, only the start of the first fit's
    lowest-objective restart)."""
    if isinstance(invariance, str):
        return {"optimizer": invariance}
    if isinstance(invariance, Mapping) and "optimizer" in invariance:
        out = dict(invariance)
        if out.get("starts", "all") not in INVARIANCE_STARTS:
            raise ValueError(f"options.invariance.starts must be one of {INVARIANCE_STARTS}, got {out['starts']!r}: "
                             "'all' refits from every start of the first fit, 'best' from its winning start only.")
        return out
    raise ValueError(f"options.invariance must name an optimizer (e.g. 'lm') or be a table with an 'optimizer' key, "
                     f"got {invariance!r}.")


def estimate_from_fit(fit: Any) -> Estimate:
    """Convert a fit (``params``, ``objective``, ``converged``, diagnostics, ``settings``) to :class:`Estimate`."""
    def arr(value: Any) -> np.ndarray:
        return np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value)

    R = fit.params.numpy().n_reps
    info: dict[str, np.ndarray] = {}
    for name in ("status", "n_iter", "grad_norm", "cond", "hit_bound", "hessian_min_eig"):
        value = getattr(fit, name, None)
        if value is not None and arr(value).shape == (R,):
            # the optimiser's stop reason (gtol, ftol, max_iter, ...) is column ``stop``: ``status`` is the study's
            info["stop" if name == "status" else name] = arr(value)
    restarts = getattr(fit, "restarts", None)
    if isinstance(restarts, pd.DataFrame) and "start" in restarts and "best" in restarts:
        best = restarts[restarts["best"]].sort_values("rep")
        if len(best) == R:
            info["best_start"] = best["start"].to_numpy(dtype=object)  # which start kind won each replicate
    settings = fit.config_columns() if hasattr(fit, "config_columns") else dict(getattr(fit, "settings", {}))
    return Estimate(fit.params.numpy(), arr(fit.objective).astype(float), arr(fit.converged).astype(bool), info,
                    settings)


# ------------------------------------------------------------------- maximum likelihood

MLE_INITS = ("random", "near_truth")
"""Values of the ``mle`` estimator's ``init`` option."""

SE_KINDS = ("auto", "oim", "sandwich", "opg", "none")
"""Values of the ``mle`` estimator's ``se`` option (``auto``: ``oim`` when the fit is comparable to the truth)."""

ISOLATED_KEY = 2**31 - 1
"""Spawn-key entry of the fit seed of a replicate refitted alone (after its cell's batched fit raised)."""


class _AtomList(Constraint):
    """A list of non-negative integer atom indices (``duplicate``)."""

    description = "a list of non-negative integer atom indices, e.g. [0] or [0, 1]"

    def accepts_type(self, value: Any) -> bool:
        return isinstance(value, (list, tuple))

    def accepts(self, value: Any) -> bool:
        return self.accepts_type(value) and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in value)


def truth_with_noise(truth: Truth) -> Params:
    """The true parameters with one noise sd per expert (the spec's ``noise_sd`` where the Params carry none)."""
    p = truth.params.numpy()
    if p.noise_sd is None:
        p = dataclasses.replace(p, noise_sd=np.full(np.shape(p.gate_bias), float(truth.spec.noise_sd)))
    return p


def near_truth_mle_start(spec: MoE, truth: Truth, R: int, duplicate: Sequence[int] | None, scale: float,
                         seed: np.random.SeedSequence) -> tuple[Params, list[int]]:
    r"""Near-truth starts of the likelihood fit, one per replicate, with noise sds.

    The mean parameters are :func:`moestat.fit.init.near_truth`'s (the least-squares near-truth start): true atom
    :math:`j` split into :math:`m_j` copies keeps its gate weight (softmax :math:`\beta_{0j} - \log m_j`, sigmoid
    :math:`\operatorname{logit}(\sigma(\beta_{0j})/m_j)`), then :math:`N(0, \text{scale}^2)` noise on every free
    coordinate (replicate ``r`` from child ``r`` of ``seed``).  Every copy of atom :math:`j` starts at the true
    noise sd :math:`\sigma_j`.  Returns the batched starts and the duplicated atoms used.
    """
    from .fit.init import check_duplicate, near_truth

    dup = check_duplicate(default_duplicate(spec, truth) if duplicate is None else list(duplicate),
                          truth.spec.k, spec.k)
    start = near_truth(spec, truth.params.numpy(), R, 1, duplicate=dup, scale=scale, seed=seed)
    order = list(range(truth.spec.k)) + dup
    sd = np.asarray(truth_with_noise(truth).noise_sd, dtype=np.float64)[..., order]
    return dataclasses.replace(start, noise_sd=np.broadcast_to(sd, np.shape(start.gate_bias)).copy()), dup


def comparable(spec: MoE, truth_spec: MoE) -> bool:
    """True when the fitted model has the truth's parameter vector (same gate, experts, k, d, top-K, temperature):
    the fit's :math:`\\hat\\theta` then estimates the true :math:`\\theta` term by term."""
    return all(getattr(spec, a) == getattr(truth_spec, a) for a in ("gate", "expert", "k", "d", "top_k",
                                                                     "temperature"))


def parameter_columns(fit: Any, truth: Truth, se: str) -> dict[str, np.ndarray]:
    r"""Per-replicate estimates, standard errors and true values of every term of :math:`\theta`.

    The fit is first relabelled to the truth (:meth:`moestat.MLEFit.align_to`, Hungarian matching), then
    ``est:<term>`` is :math:`\hat\theta_j`, ``se:<term>`` its standard error (``se`` = ``"oim"``, ``"sandwich"``
    or ``"opg"``, :meth:`moestat.MLEFit.bse`; NaN where the information is singular) and ``true:<term>`` the true
    :math:`\theta_j` in the same parameterisation (softmax gates against the last expert, ``log_sigma``).
    """
    aligned = fit.align_to(truth_with_noise(truth))
    theta = np.atleast_2d(np.asarray(aligned.theta, dtype=float))
    std = np.atleast_2d(np.asarray(aligned.bse(se), dtype=float))
    true = aligned.layout.pack(truth_with_noise(truth).to_torch("cpu", torch.float64)).cpu().numpy()
    out: dict[str, np.ndarray] = {}
    for j, name in enumerate(aligned.param_names):
        out[f"est:{name}"] = theta[:, j]
        out[f"se:{name}"] = std[:, j]
        out[f"true:{name}"] = np.full(theta.shape[0], float(true[j]))
    return out


def _best_start(restart_loglik: Any) -> np.ndarray:
    """Index of the start with the highest finite log-likelihood per replicate (the one fit_mle keeps)."""
    ll = np.atleast_2d(np.asarray(restart_loglik, dtype=float))
    return np.argmax(np.where(np.isfinite(ll), ll, -np.inf), axis=-1)


def mle_estimator(spec: MoE, X: np.ndarray, y: np.ndarray, *, truth: Truth | None = None,
                  seed: np.random.SeedSequence | None = None, device: str = "auto", init: str = "random",
                  duplicate: Sequence[int] | None = None, init_scale: float = 0.05, se: str = "auto",
                  **options: Any) -> Estimate:
    r"""The maximum-likelihood estimator :func:`moestat.fit_mle` as a study estimator.

    Maximises :math:`\ell(\theta) = \sum_t \log \sum_i \tilde\pi_i(x_t)\,\mathcal N(y_t; h(x_t;\eta_i),
    \sigma_i^2)` (Jordan & Jacobs 1994) for all replicates in one batched call; ``options`` are
    :func:`moestat.fit_mle`'s (``method``, ``restarts``, ``tol``, ``max_iter``, ``sd_floor``, ``switch_after``, ...).

    ``init="random"`` (default) is :func:`moestat.fit_mle`'s own random-subset starts.  ``init="near_truth"``
    starts at the truth, noise sds included (:func:`near_truth_mle_start`): for ``k > k*`` the atoms
    ``duplicate`` (default: the preset's ``truth.info["duplicate"]``) are split with their gate weight kept, as the
    least-squares near-truth start does, and every free coordinate gets :math:`N(0, \text{init\_scale}^2)` noise
    (``init_scale = 0`` is the exact truth; copies of one atom then stay identical under EM).  With
    ``near_truth`` the random restarts default to 0 (``restarts`` adds them).

    ``se`` (``"auto"``: ``"oim"`` when the fitted model has the truth's parameter vector, else ``"none"``)
    records ``est:<term>``, ``se:<term>`` and ``true:<term>`` for every term of :math:`\theta`
    (:func:`parameter_columns`), the input of :meth:`moestat.Study.performance`'s bias, coverage and
    model-SE measures.  Per-replicate columns: ``loglik``, ``n_iter``, ``best_restart``, ``n_collapsed``
    (components flagged by :attr:`moestat.MLEFit.collapsed`).  Seeds: the fit uses child ``(0,)`` and the
    near-truth perturbation child ``(1,)`` of the cell's fit seed.
    """
    from .exceptions import MLEConvergenceWarning, SingularInformationWarning
    from .fit.mle import fit_mle

    if init not in MLE_INITS:
        raise ValueError(f"options.init must be one of {list(MLE_INITS)} for estimator 'mle', got {init!r}.")
    if se not in SE_KINDS:
        raise ValueError(f"options.se must be one of {list(SE_KINDS)}, got {se!r}.")
    root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    fit_seed = np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, 0))
    opts = dict(options)
    settings: dict[str, Any] = {"init": init}
    R = int(np.shape(X)[0])
    if init == "near_truth":
        if truth is None:
            raise ValueError("options.init='near_truth' needs the truth; use init='random' without one.")
        start, dup = near_truth_mle_start(spec, truth, R, duplicate, init_scale,
                                          np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, 1)))
        opts.setdefault("restarts", 0)
        settings.update(duplicate=",".join(map(str, dup)), init_scale=init_scale)
        fit_init: Any = start
    elif duplicate is not None:
        raise ValueError("options.duplicate only applies to init='near_truth' (it names the true atoms split "
                         "into the extra fitted experts).")
    else:
        fit_init = "random"
    with warnings.catch_warnings():
        # non-convergence and singular information are recorded per replicate (converged, status, se:* = NaN)
        warnings.simplefilter("ignore", MLEConvergenceWarning)
        warnings.simplefilter("ignore", SingularInformationWarning)
        fit = fit_mle(spec, X, y, init=fit_init, seed=fit_seed, device=device, **{"progress": False, **opts})
        kind = se if se != "auto" else ("oim" if truth is not None and comparable(spec, truth.spec) else "none")
        info: dict[str, np.ndarray] = {
            "loglik": np.atleast_1d(np.asarray(fit.loglik, dtype=float)),
            "n_iter": np.atleast_1d(np.asarray(fit.n_iter)),
            "best_restart": _best_start(fit.restart_loglik),
            "n_collapsed": np.atleast_2d(np.asarray(fit.collapsed)).sum(-1),
        }
        if kind != "none" and truth is not None and comparable(spec, truth.spec):
            info.update(parameter_columns(fit, truth, kind))
        elif kind != "none":
            kind = "none (fit not comparable to the truth)"
    skip = {"seed_entropy", "seed_spawn_key", "device", "threads", "wall_time"}  # the cell times the fit itself
    settings.update({k: v for k, v in fit.settings.items() if k not in skip and k not in settings})
    settings["se"] = kind
    return Estimate(fit.params.numpy(), np.atleast_1d(np.asarray(fit.objective, dtype=float)),
                    np.atleast_1d(np.asarray(fit.converged, dtype=bool)), info, settings)


def _mle_options_target() -> Callable[..., Any]:
    from .fit.mle import fit_mle

    return fit_mle


def _mle_constraints() -> dict[str, Constraint]:
    """Constraints of the ``mle`` estimator's own options and of the fit_mle options its table leaves out."""
    from .fit.mle import METHODS

    return {"init": Choice(*MLE_INITS), "se": Choice(*SE_KINDS), "init_scale": Real(0), "duplicate": _AtomList(),
            "method": Choice(*METHODS), "gate_solver": Choice("newton", "cvxpy")}


mle_estimator.forwards_to = _mle_options_target  # type: ignore[attr-defined]
mle_estimator.extra_constraints = _mle_constraints  # type: ignore[attr-defined]
# fit_mle's formula interface builds spec, X and y itself; a study supplies them
mle_estimator.excluded_options = ("formula", "data", "k", "gate_formula", "weights", "missing")  # type: ignore[attr-defined]


ESTIMATORS: dict[str, Callable[..., Estimate]] = {"lse": lse_estimator, "ols": ols_estimator,
                                                 "mle": mle_estimator}
"""Estimator registry: name -> function (see the module docstring for the signature)."""


def register_estimator(name: str, fn: Callable[..., Estimate]) -> None:
    """Add an estimator to the registry (in this process; pass the function itself to use process pools)."""
    if not callable(fn):
        raise TypeError(f"register_estimator: fn must be callable, got {type(fn).__name__}.")
    ESTIMATORS[name] = fn


# --------------------------------------------------------------------------- metrics

@dataclass
class MetricContext:
    """Everything a metric may use to score the fits of one cell.

    Attributes
    ----------
    fit : Estimate
        The estimator's output (fitted ``params`` batched over R replicates).
    fit_spec, truth_spec : MoE
        Fitted and true model specifications.
    truth : Params
        True parameters (unbatched).
    truth_info : dict
        The truth's metadata (regime, zero-slope atoms, duplicated atoms, ...).
    data : Dataset
        The replicate data sets of the cell.
    seed : numpy.random.SeedSequence
        A stream reserved for the metric (e.g. a Monte-Carlo sample).
    cache_dir : str, optional
        The study's folder for cell-independent results (see :class:`CellContext`).
    cache : StudyCache, optional
        The study run's shared results (see :class:`CellContext`).
    """

    fit: Estimate
    fit_spec: MoE
    truth_spec: MoE
    truth: Params
    truth_info: dict[str, Any]
    data: Dataset
    seed: np.random.SeedSequence
    cache_dir: str | None = None
    cache: StudyCache | None = None


def _voronoi(kind: str) -> Callable[..., np.ndarray]:
    def metric(ctx: MetricContext, **options: Any) -> np.ndarray:
        from .metrics import voronoi_loss

        return np.asarray(voronoi_loss(ctx.fit.params, ctx.truth, kind=kind, **options), dtype=float)

    metric.__name__ = kind
    metric.__doc__ = f"Voronoi loss {kind} of the fit against the truth (:func:`moestat.voronoi_loss`)."
    return metric


def l2_metric(ctx: MetricContext, n_mc: int = 20_000) -> np.ndarray:
    r"""Monte-Carlo :math:`\|f_{\hat G} - f_{G^*}\|_{L^2(\mu)}` on one input sample shared by the cell."""
    from .metrics import l2_distance

    rng = np.random.default_rng(ctx.seed)
    X_mc = rng.uniform(-1.0, 1.0, size=(n_mc, ctx.truth_spec.d))
    return np.asarray(l2_distance(ctx.fit_spec, ctx.fit.params, ctx.truth, X_mc, spec_b=ctx.truth_spec),
                      dtype=float)


def parameter_error_metric(ctx: MetricContext) -> dict[str, np.ndarray]:
    r"""Per-replicate summaries of :func:`moestat.parameter_errors` for over- and exact-specified atoms.

    Columns ``err_<specified>_<block>``: the largest error of a fitted atom against its true atom, over
    over-specified cells (:math:`|A_j| \ge 2`, ``specified="over"``) or exact cells (:math:`|A_j| = 1`),
    per block (``gate_bias``, ``gate_weight``, ``expert_weight``, ``expert_bias``, ``expert`` = the whole
    :math:`\eta`) and ``err_over_weight_sum`` (the cell weight-sum gap).  nguyen2024 (Remark after Thm 2;
    its Theorem 2) predicts :math:`n^{-1/4}` for over-specified slopes and experts, :math:`n^{-1/2}` for
    exact-specified parameters and weight sums, and no rate for individual over-specified intercepts.
    NaN where a replicate has no cell of that kind.
    """
    from .metrics import parameter_errors

    frame = parameter_errors((ctx.fit_spec, ctx.fit.params), (ctx.truth_spec, ctx.truth))
    return summarise_parameter_errors(frame, ctx.fit.params.numpy().n_reps)


def summarise_parameter_errors(frame: pd.DataFrame, reps: int) -> dict[str, np.ndarray]:
    """Reduce a tidy ``parameter_errors`` frame to per-replicate maxima by cell type and block."""
    out: dict[str, np.ndarray] = {}
    f = frame[frame["specified"].isin(["over", "exact"])]
    for (kind, block), sub in f.groupby(["specified", "block"], sort=True):
        out[f"err_{kind}_{block}"] = sub.groupby("rep")["error"].max().reindex(range(reps)).to_numpy(float)
    return out


def _duplicates(ctx: MetricContext) -> list[int]:
    dup = ctx.fit.settings.get("duplicate")
    if isinstance(dup, str):
        return [int(v) for v in dup.split(",") if v.strip()]
    if dup is not None:
        return [int(v) for v in np.atleast_1d(dup)]
    return [int(v) for v in ctx.truth_info.get("duplicate", [])][: max(0, ctx.fit_spec.k - ctx.truth_spec.k)]


class StudyCache:
    r"""Results that the cells of one study run share, such as the estimated :math:`\bar{\mathcal G}`.

    :meth:`moestat.Study.run` makes one per run and hands it to every cell (:attr:`CellContext.cache`,
    :attr:`MetricContext.cache`): results are held in memory for the cells that run in this process and, with a
    ``directory`` (a checkpointed study's ``DIR/cache``, or a temporary folder while worker processes run), written
    there atomically, so worker processes and resumed runs read them instead of recomputing.  A pickled cache (sent
    to a worker) carries its folder, not its memory.

    Parameters
    ----------
    directory : path, optional
        Folder of the stored results (``<name>.pkl``); without it results live in memory only.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = None if directory is None else Path(directory)
        self._memory: dict[str, Any] = {}

    def get(self, name: str, compute: Callable[[], Any]) -> Any:
        """The result stored under ``name`` (letters, digits, ``-``), computing and storing it when absent; a
        damaged file is recomputed and overwritten."""
        if name in self._memory:
            return self._memory[name]
        path = None if self.directory is None else self.directory / f"{name}.pkl"
        value = None if path is None else _read_pickle(path)
        if value is None:
            value = compute()
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                blob = pickle.dumps(value)
                write_atomic(path, lambda tmp: Path(tmp).write_bytes(blob))
        self._memory[name] = value
        return value

    def values(self) -> list[Any]:
        """The results held in memory."""
        return list(self._memory.values())

    def __len__(self) -> int:
        return len(self._memory)

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "_memory": {}}


def _fit_box(ctx: MetricContext) -> Any:
    """The fit's box constraint from its settings (``fit_lse`` records it as ``block=(low, high);...``)."""
    box = ctx.fit.settings.get("box")
    if box is None or (isinstance(box, str) and box.strip().lower() in ("", "none")):
        return None
    if isinstance(box, str):
        return {name.strip(): tuple(float(v) for v in bound.strip(" ()").split(","))
                for name, bound in (part.split("=", 1) for part in box.split(";") if part.strip())}
    return box


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def _read_pickle(path: Path) -> Any:
    """The result stored at ``path``, or None when there is none or it is damaged (the caller then recomputes it
    and overwrites the file)."""
    if not path.is_file():
        return None
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError):
        return None


def gbar_for(ctx: MetricContext, dup: Sequence[int] | None, *, n_mc: int, restarts: int, max_iter: int,
             init_scale: float, tol_l2: float, box: Any, device: str, optimizer: str = "auto",
             compile: bool | str = False, threads: int | None = 1) -> tuple[Any, int]:
    r""":func:`moestat.estimate_gbar` for the cell's truth and fitted k, kept in the study's :class:`StudyCache`
    (``ctx.cache``; without one, in a cache of ``ctx.cache_dir`` for this call).

    The seed is derived from the study's master seed (``ctx.seed.entropy``) alone, so every cell of a
    study (every n) scores against the same :math:`\bar{\mathcal G}`.  Returns the result and its seed.
    """
    from .fit.gbar import estimate_gbar

    seed = int(np.random.SeedSequence(ctx.seed.entropy, spawn_key=(2,)).generate_state(1)[0])
    p = ctx.truth.numpy()
    truth_key = tuple(np.ascontiguousarray(np.asarray(getattr(p, b), dtype=float)).tobytes()
                      for b in ("gate_bias", "gate_weight", "expert_weight", "expert_bias"))
    spec = ctx.truth_spec
    key = (spec.gate, spec.expert, spec.d, spec.k, truth_key, ctx.fit_spec.k, None if dup is None else tuple(dup),
           _hashable(box), n_mc, restarts, max_iter, init_scale, tol_l2, seed, optimizer)
    if compile is not False:  # a compiled estimate is another result (equal to rounding); default keys unchanged
        key = (*key, ("compile", compile))
    if threads != 1:  # the same compiled result on any number of threads, but not always so for the tensor loop
        key = (*key, ("threads", threads))
    extra = ctx.fit_spec.k - spec.k
    cache = ctx.cache if ctx.cache is not None else StudyCache(ctx.cache_dir)
    name = f"gbar-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}"
    result = cache.get(name, lambda: estimate_gbar(
        spec, ctx.truth, ctx.fit_spec.k, n_mc=n_mc, restarts=restarts,
        duplicate=None if dup is None else list(dup)[:extra], seed=seed, init_scale=init_scale, max_iter=max_iter,
        tol_l2=tol_l2, box=box, device=device, optimizer=optimizer, compile=compile, threads=threads))
    return result, seed


def gate_matched_loss(ctx: MetricContext, n_split: int = 201, gbar_n_mc: int = 20_000, gbar_restarts: int = 4,
                      gbar_max_iter: int = 1000, gbar_init_scale: float = 0.05, gbar_tol_l2: float = 1e-4,
                      gbar_box: Any = "fit", gbar_device: str = "cpu", gbar_optimizer: str = "auto",
                      gbar_compile: bool = False, gbar_threads: int | None = 1) -> dict[str, np.ndarray]:
    r"""The Voronoi loss each theory uses for the fitted gate (:func:`moestat.metrics.theory_loss`), in one column
    ``loss`` (kind in ``loss_kind``), with the regime-2 G-bar estimated and cached here.

    * softmax fits: the softmax Voronoi loss against :math:`G^*` (``kind="softmax"``; translation removed);
    * sigmoid fits whose duplicated atoms all have zero gate slope (regime 1): :math:`D_1(\hat G, G^*)`;
    * sigmoid fits in regime 2 with linear/relu experts: :math:`\inf_t D_3(\hat G, \bar G_t)` over the exact
      split family :func:`split_family` (``n_split`` values of t in [0, 1]);
    * sigmoid fits in regime 2 with other (non-homogeneous) experts, e.g. gelu:
      :math:`\inf_{\bar G \in \bar{\mathcal G}} D_3(\hat G, \bar G)` over the near-minimisers of
      :func:`moestat.estimate_gbar` (nguyen2024 Thm 5; docs/representations.md), ``loss_kind = "D3 estimated G-bar"``.
      :math:`\bar{\mathcal G}` is computed once per (truth, fitted k, duplicated atoms, box, settings) and kept
      (the study's :class:`StudyCache`): ``gbar_n_mc`` noise-free Monte-Carlo inputs from :math:`U[-1,1]^d`,
      ``gbar_restarts`` starts duplicating the fit's duplicated atom, ``gbar_optimizer`` (``"auto"``: trust-region
      Newton for these small problems, run to convergence; ``"lbfgs"`` stops on its cap in the flat valleys of
      sigmoid-gelu splits) for at most ``gbar_max_iter`` iterations inside ``gbar_box`` (``"fit"``: the fit's own
      box — needed for gelu, whose copies could otherwise escape to infinity), on ``gbar_device`` (CPU by
      default: float64, bit-reproducible), with ``gbar_compile=True`` each start's Newton run in C++ on a CPU
      (about 3.5 times faster, with the same near-minimisers; cached apart from the default's), and with
      ``gbar_threads`` starts at once (``fit_lse``'s ``threads``; the same compiled result on any number).  The starts
      duplicate only the fit's duplicated atoms, so the infimum is over the near-minimisers of the basin the
      near-truth LSE starts in.  Its settings, seed and held-out :math:`L^2(\mu)` distance
      :math:`\min_G \|f_G - f_{G^*}\|` become columns ``gbar_*``.
    """
    from .metrics.theory_loss import theory_loss, theory_loss_kind

    R = ctx.fit.params.numpy().n_reps
    dup = _duplicates(ctx)
    if theory_loss_kind(ctx.fit_spec, ctx.truth_spec, ctx.truth, dup) != "D3 estimated G-bar":
        value, kind = theory_loss(ctx.fit.params, ctx.truth, ctx.fit_spec, ctx.truth_spec, dup, n_split=n_split)
        return {"loss": value, "loss_kind": np.full(R, kind, dtype=object)}
    box = _fit_box(ctx) if isinstance(gbar_box, str) and gbar_box == "fit" else gbar_box
    res, seed = gbar_for(ctx, dup, n_mc=gbar_n_mc, restarts=gbar_restarts, max_iter=gbar_max_iter,
                         init_scale=gbar_init_scale, tol_l2=gbar_tol_l2, box=box, device=gbar_device,
                         optimizer=gbar_optimizer, compile=gbar_compile, threads=gbar_threads)
    value, kind = theory_loss(ctx.fit.params, ctx.truth, ctx.fit_spec, ctx.truth_spec, dup, gbar=res.near_minimisers)
    cols: dict[str, np.ndarray] = {"loss": value, "loss_kind": np.full(R, kind, dtype=object)}
    scalars = {"gbar_l2": float(res.l2[0]), "gbar_n_near": int(res.near.sum()), "gbar_n_mc": gbar_n_mc,
               "gbar_restarts": gbar_restarts, "gbar_max_iter": gbar_max_iter, "gbar_init_scale": gbar_init_scale,
               "gbar_tol_l2": gbar_tol_l2, "gbar_seed": seed, "gbar_converged": int(res.converged.sum())}
    if gbar_compile:  # a column only when asked for, so the default frames keep theirs
        scalars["gbar_compile"] = True
    if gbar_threads != 1:
        scalars["gbar_threads"] = gbar_threads
    for name, v in scalars.items():
        cols[name] = np.full(R, v)
    return cols


def representation_metric(ctx: MetricContext, n_mc: int = 20_000, gbar_n_mc: int = 20_000, gbar_restarts: int = 4,
                          gbar_max_iter: int = 1000, gbar_init_scale: float = 0.05, gbar_tol_l2: float = 1e-4,
                          gbar_box: Any = "fit", gbar_device: str = "cpu", gbar_optimizer: str = "auto",
                          gbar_compile: bool = False, gbar_threads: int | None = 1, basin: str = "auto",
                          basin_tol: float = 1e-3) -> dict[str, np.ndarray]:
    r"""Errors against the nearest exact representation of the truth (:func:`moestat.representation_errors`).

    Columns: ``over_param``, ``exact_param``, ``param`` (first-order parameter errors of the atoms a
    representation adds or changes, of the atoms matched to unchanged true atoms, and their sum),
    ``over_sup``, ``over_l2``, ``exact_sup``, ``exact_l2`` (expert-function errors on ``n_mc`` inputs from
    :math:`U[-1,1]^d` drawn from the cell's metric stream, shared by every fit of the cell),
    ``representation`` (the family of the nearest member: ``split j``, ``dead``, ``reflection``, ``truth`` or
    ``gbar``) and ``representation_xi`` (its parameter).  Where no exact k-atom representation exists (a
    sigmoid gate with sigmoid-activation experts) the misspecified limits of
    :func:`moestat.estimate_gbar` are the candidates (cached per truth and fit, options ``gbar_*`` as for the
    ``loss`` metric).

    ``basin="auto"`` (default) also adds the converged limits of the weight-split basins where the split is
    not itself exact (a sigmoid gate with experts other than relu and linear): :func:`moestat.estimate_gbar`
    with one split of every true atom (``2 k*`` starts, ``gbar_optimizer``), keeping the limits within
    ``basin_tol`` of :math:`f_{G^*}` in :math:`L^2(\mu)`.  For the gelu truths of the gate-comparison preset at
    gate variance 1 the converged splits switch their extra atom off as far as the box allows (a zero expert,
    or a gate intercept on the box), within about 1e-6 of :math:`f_{G^*}`; at small gate variances they stop
    1e-7 to 1e-6 from :math:`f_{G^*}` with every atom alive.  Both are far below the statistical resolution
    :math:`\sqrt{\nu P/n}` of any feasible n (docs/representations.md).  ``basin="exact"`` uses the exact
    representations only.
    """
    from .metrics.representations import representation_errors

    rng = np.random.default_rng(ctx.seed)
    X_mc = rng.uniform(-1.0, 1.0, size=(n_mc, ctx.truth_spec.d))
    fit, truth = (ctx.fit_spec, ctx.fit.params), (ctx.truth_spec, ctx.truth)
    try:
        res = representation_errors(fit, truth, X=X_mc)
    except ValueError as exc:
        if "no exact k-atom representation" not in str(exc):
            raise
        box = _fit_box(ctx) if isinstance(gbar_box, str) and gbar_box == "fit" else gbar_box
        gb, _ = gbar_for(ctx, _duplicates(ctx), n_mc=gbar_n_mc, restarts=gbar_restarts, max_iter=gbar_max_iter,
                         init_scale=gbar_init_scale, tol_l2=gbar_tol_l2, box=box, device=gbar_device,
                         optimizer=gbar_optimizer, compile=gbar_compile, threads=gbar_threads)
        res = representation_errors(fit, truth, X=X_mc, gbar=gb.near_minimisers)
    else:
        if basin not in ("auto", "exact"):
            raise ValueError(f"representation metric option basin must be 'auto' or 'exact', got {basin!r}.")
        if basin == "auto" and ctx.truth_spec.gate == "sigmoid" and ctx.truth_spec.expert not in ("relu", "linear"):
            box = _fit_box(ctx) if isinstance(gbar_box, str) and gbar_box == "fit" else gbar_box
            gb, _ = gbar_for(ctx, None, n_mc=gbar_n_mc, restarts=2 * ctx.truth_spec.k, max_iter=gbar_max_iter,
                             init_scale=gbar_init_scale, tol_l2=gbar_tol_l2, box=box, device=gbar_device,
                             optimizer=gbar_optimizer, compile=gbar_compile, threads=gbar_threads)
            near = np.flatnonzero(np.asarray(gb.l2) <= basin_tol)
            if len(near):
                res = representation_errors(fit, truth, X=X_mc, gbar=gb.params.select(near))
    s = res.summary
    cols = {c: s[c].to_numpy(dtype=float) for c in ("over_param", "exact_param", "param", "over_sup", "over_l2",
                                                     "exact_sup", "exact_l2")}
    fam = [f"{f} {a}" if f in ("split", "gbar") else f for f, a in zip(s["family"], s["atom"], strict=True)]
    cols["representation"] = np.asarray(fam, dtype=object)
    cols["representation_xi"] = s["xi"].to_numpy(dtype=object)
    return cols


def gaussian_voronoi_metric(ctx: MetricContext, kind: str = "auto", variance: bool = True, strict: bool = False,
                            translation: str = "center", cell_distance: str = "euclidean",
                            rbar: Mapping[Any, float] | None = None) -> dict[str, np.ndarray]:
    r"""The Voronoi loss of the softmax-gated Gaussian MoE (Nguyen, Nguyen & Ho, NeurIPS 2023) of each fit.

    :math:`D_1` for :math:`k = k^*`, :math:`D_2` with the cell-size exponents :math:`\bar r(|A_j|)` for
    :math:`k > k^*` (:func:`moestat.metrics.gaussian_voronoi.gaussian_voronoi_frame`; options as there, ``rbar``
    as a table ``{4 = 8.0}``).  Columns: ``gaussian_voronoi`` (the loss), ``cell_sizes`` (the sizes
    :math:`|A_j|` in true-atom order, e.g. ``"2-1"``: fit rates per pattern with
    ``fit_rate(frame, "gaussian_voronoi", by="cell_sizes")``), ``voronoi_kind`` (``exact``/``over``) and
    ``n_empty_cells``.  The noise variances come from the fitted parameters (maximum likelihood) or, for fits
    without them (least squares), from the fitted spec's ``noise_sd``.
    """
    from .metrics.gaussian_voronoi import gaussian_voronoi_frame

    frame = gaussian_voronoi_frame((ctx.fit_spec, ctx.fit.params), (ctx.truth_spec, ctx.truth), kind=kind,
                                   variance=variance, strict=strict, translation=translation,
                                   cell_distance=cell_distance, rbar=None if rbar is None else dict(rbar))
    return {"gaussian_voronoi": frame["loss"].to_numpy(float), "cell_sizes": frame["cell_sizes"].to_numpy(object),
            "voronoi_kind": frame["kind"].to_numpy(object), "n_empty_cells": frame["n_empty"].to_numpy(int)}


METRICS: dict[str, Callable[..., Any]] = {
    "D1": _voronoi("D1"),
    "D2": _voronoi("D2"),
    "D3": _voronoi("D3"),
    "l2": l2_metric,
    "parameter_errors": parameter_error_metric,
    "loss": gate_matched_loss,
    "representation": representation_metric,
    "gaussian_voronoi": gaussian_voronoi_metric,
}
"""Metric registry: name -> function (see the module docstring for the signature)."""


def metric_options(fn: Callable[..., Any]) -> tuple[set[str] | None, dict[str, Constraint]]:
    """Option names a metric accepts (its keyword parameters after the context; None: any, it takes ``**options``)
    and their constraints: a ``gbar_<name>`` option has :func:`moestat.estimate_gbar`'s constraint on ``<name>``,
    since it is passed on there."""
    from .fit.gbar import estimate_gbar

    params = list(inspect.signature(fn).parameters.values())[1:]
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    gbar = getattr(estimate_gbar, "parameter_constraints", {})
    table = {name: gbar[name[5:]] for name in names if name.startswith("gbar_") and name[5:] in gbar}
    return (None if any(p.kind is p.VAR_KEYWORD for p in params) else names), table


def register_metric(name: str, fn: Callable[..., Any]) -> None:
    """Add a metric to the registry (in this process; pass the function itself to use process pools)."""
    if not callable(fn):
        raise TypeError(f"register_metric: fn must be callable, got {type(fn).__name__}.")
    METRICS[name] = fn


def metric_name(metric: str | Callable[..., Any]) -> str:
    return metric if isinstance(metric, str) else getattr(metric, "__name__", repr(metric))


# ----------------------------------------------------------------------------- cells

@dataclass
class CellContext:
    """One cell of a study, handed to a custom cell callable (and used by the built-in cell).

    Attributes
    ----------
    truth_cfg, fit_cfg : dict
        The validated truth and fit entries of the study (``fit_cfg["options"]`` holds the
        estimator options).
    n, reps : int
        Sample size and number of replicates.
    data_seed, fit_seed, metric_seed : numpy.random.SeedSequence
        The cell's streams: the data stream is shared by every fit of the same truth and n
        (common random numbers, "under the same data" as nguyen2024 Fig. 1); replicate r
        of the data uses its child r.
    device : str
        Device requested by the study.
    metrics : list
        Metric names or callables; ``metric_options`` their keyword arguments.
    cache_dir : str, optional
        The study's folder for results shared by cells (``DIR/cache`` of a checkpointed run): metrics keep
        expensive cell-independent pieces there, such as the estimated :math:`\\bar{\\mathcal G}`, so that worker
        processes and resumed runs reuse them.
    """

    truth_cfg: dict[str, Any]
    fit_cfg: dict[str, Any]
    n: int
    reps: int
    data_seed: np.random.SeedSequence
    fit_seed: np.random.SeedSequence
    metric_seed: np.random.SeedSequence
    device: str = "cpu"
    metrics: list[Any] = field(default_factory=list)
    metric_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_dir: str | None = None
    cache: StudyCache | None = None
    _truth: Truth | None = None
    _data: Dataset | None = None

    def truth(self) -> Truth:
        """The true model (built once)."""
        if "data" in self.truth_cfg:
            raise ValueError(f"truth {self.truth_cfg['label']!r} is a custom cell's data settings "
                             f"({self.truth_cfg['data']}), not a model: read ctx.truth_cfg['data'].")
        if self._truth is None:
            self._truth = build_truth(self.truth_cfg, n=self.n)
        return self._truth

    def data(self) -> Dataset:
        """The cell's R replicate data sets (simulated once)."""
        if self._data is None:
            self._data = simulate_cell(self.truth(), self.truth_cfg, self.n, self.reps, self.data_seed)
        return self._data

    def fit_spec(self) -> MoE:
        """The fitted model: the truth's spec with the fit entry's gate, expert and k."""
        spec = self.truth().spec
        f = self.fit_cfg
        k = resolve_k(f.get("k"), spec.k)
        return MoE(gate=f.get("gate") or spec.gate, expert=f.get("expert") or spec.expert, k=k, d=spec.d,
                   noise_sd=spec.noise_sd, top_k=f.get("top_k"), temperature=f.get("temperature") or 1.0)


@dataclass
class CellOutput:
    """What a custom cell may return instead of a bare frame: its rows and named side tables.

    Attributes
    ----------
    frame : pandas.DataFrame
        One row per replicate (a ``rep`` column), as a plain cell returns.
    pieces : dict of str to pandas.DataFrame
        Side tables of any shape (training histories, dispatch tables, curves), stored with the cell
        (``DIR/pieces/NAME/<cell>.parquet``, written before the cell's own file, so a finished cell always has
        its pieces) and read back by :meth:`moestat.Study.pieces`.
    """

    frame: pd.DataFrame
    pieces: dict[str, pd.DataFrame] = field(default_factory=dict)


def resolve_k(k: int | str | None, k_true: int) -> int:
    """``None``/"truth" -> k*, "truth+m" -> k* + m, an int -> itself."""
    if k is None or k == "truth":
        return k_true
    if isinstance(k, str):
        return k_true + int(k.split("+", 1)[1])
    return int(k)


def failure_message(exc: BaseException) -> str:
    """One line for a failed fit: ``Type: message (file:line in function)``, naming the innermost frame."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno} in {tb[-1].name})" if tb else ""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}{where}"


def status_from(converged: Any) -> np.ndarray:
    """``"ok"`` where a fit converged, ``"not_converged"`` elsewhere (object array)."""
    return np.where(np.asarray(converged, dtype=bool), "ok", "not_converged").astype(object)


def error_rows(reps: Sequence[int], message: str) -> pd.DataFrame:
    """Rows of replicates whose fit raised: ``status = "error"``, the message, a NaN objective."""
    m = len(reps)
    return pd.DataFrame({"rep": np.asarray(reps, dtype=np.int64), "objective": np.full(m, np.nan),
                         "converged": np.zeros(m, dtype=bool), "status": np.full(m, "error", dtype=object),
                         "message": np.full(m, message, dtype=object)})


def _run_estimator(ctx: CellContext, spec: MoE, truth: Truth, data: Dataset,
                   seed: np.random.SeedSequence) -> tuple[Estimate, float]:
    est = ctx.fit_cfg.get("estimator", "lse")
    fn = ESTIMATORS[est] if isinstance(est, str) else est
    t0 = time.perf_counter()
    fit = fn(spec, data.X, data.y, truth=truth, seed=seed, device=ctx.device, **ctx.fit_cfg.get("options", {}))
    return fit, time.perf_counter() - t0


def _score(ctx: CellContext, spec: MoE, truth: Truth, data: Dataset, fit: Estimate, wall: float,
           reps: np.ndarray) -> pd.DataFrame:
    """The rows of fitted replicates ``reps``: fit columns, settings, metrics, ``status`` and ``message``.

    A metric that raises marks every row ``"error"`` (its message in ``message``); the fit's columns and the
    other metrics are kept."""
    R = len(reps)
    cols: dict[str, Any] = {
        "rep": np.asarray(reps, dtype=np.int64),
        "objective": np.asarray(fit.objective, dtype=float),
        "converged": np.asarray(fit.converged, dtype=bool),
    }
    for name, value in fit.info.items():
        cols[name] = np.asarray(value)
    cols["fit_wall_time"] = np.full(R, wall / R)
    skip = {"gate", "expert", "k", "d", "seed", "truth", "device", "n", "rep", "progress", "history", "status",
            "message"}
    for name, value in fit.settings.items():
        if name in cols or name in skip or value is None:
            continue
        cols[name] = [value if isinstance(value, (str, bool, int, float, np.generic)) else str(value)] * R
    fits = [(fit, "")]
    if fit.alt is not None:
        fits.append((fit.alt, "_alt"))
        cols["objective_alt"] = np.asarray(fit.alt.objective, dtype=float)
        cols["converged_alt"] = np.asarray(fit.alt.converged, dtype=bool)
        cols["status_alt"] = status_from(fit.alt.converged)
        if "stop" in fit.alt.info:
            cols["stop_alt"] = np.asarray(fit.alt.info["stop"])
    failed: list[str] = []
    for est_m, suffix in fits:
        mctx = MetricContext(est_m, spec, truth.spec, truth.params, truth.info, data, ctx.metric_seed,
                             cache_dir=ctx.cache_dir, cache=ctx.cache)
        for m in ctx.metrics:
            fn_m = METRICS[m] if isinstance(m, str) else m
            try:
                value = fn_m(mctx, **ctx.metric_options.get(metric_name(m), {}))
            except Exception as exc:  # recorded in the rows; the study decides (max_failures) whether to go on
                failed.append(f"metric {metric_name(m) + suffix!r} failed: {failure_message(exc)}")
                continue
            if isinstance(value, Mapping):
                for col, v in value.items():
                    cols[col + suffix] = np.asarray(v)
            else:
                cols[metric_name(m) + suffix] = np.asarray(value, dtype=float)
    for col, v in cols.items():
        if np.shape(v) != (R,):
            raise ValueError(f"cell column {col!r} has shape {np.shape(v)}; estimators and metrics must return "
                             f"one value per replicate, shape ({R},).")
    frame = pd.DataFrame(cols)
    at = frame.columns.get_loc("converged") + 1
    frame.insert(at, "status", np.full(R, "error", dtype=object) if failed else status_from(frame["converged"]))
    frame.insert(at + 1, "message", np.full(R, "; ".join(failed), dtype=object))
    return frame


def _isolated(ctx: CellContext, spec: MoE, truth: Truth, data: Dataset, r: int, batched: str) -> pd.DataFrame:
    """Replicate ``r`` refitted alone (after the cell's batched fit raised), seeded by ``(..., ISOLATED_KEY, r)``."""
    note = f"refit alone after the batched fit of the cell failed ({batched})"
    seed = np.random.SeedSequence(ctx.fit_seed.entropy, spawn_key=(*ctx.fit_seed.spawn_key, ISOLATED_KEY, r))
    sub = data.select(r)
    try:
        fit, wall = _run_estimator(ctx, spec, truth, sub, seed)
    except Exception as exc:  # this replicate's own failure: an error row
        own = failure_message(exc)
        return error_rows([r], f"{own} (also when refitted alone)" if own == batched else f"{own}; {note}")
    frame = _score(ctx, spec, truth, sub, fit, wall, np.array([r]))
    frame["message"] = [f"{m}; {note}" if m else note for m in frame["message"]]
    return frame


def estimator_cell(ctx: CellContext) -> pd.DataFrame:
    """The built-in cell: simulate R data sets, fit them in one batched estimator call, score them.

    Returns one row per replicate with the objective, convergence flag, ``status`` and ``message``, the
    estimator's diagnostics, the fit's wall time and one column per metric value.

    When the batched fit raises, every replicate is refitted alone (its fit seed then is
    ``SeedSequence(entropy, spawn_key=(*fit_key, ISOLATED_KEY, r))``, recorded in ``message``): the replicates
    that fit alone get their rows, those that raise again get ``status = "error"`` rows with the message.
    """
    truth = ctx.truth()
    data = ctx.data()
    spec = ctx.fit_spec()
    try:
        fit, wall = _run_estimator(ctx, spec, truth, data, ctx.fit_seed)
    except Exception as exc:  # isolate the failing replicates; they become rows
        batched = failure_message(exc)
        if ctx.reps == 1:
            return error_rows([0], batched)
        return pd.concat([_isolated(ctx, spec, truth, data, r, batched) for r in range(ctx.reps)],
                         ignore_index=True)
    return _score(ctx, spec, truth, data, fit, wall, np.arange(ctx.reps))
