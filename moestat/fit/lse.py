r"""Least-squares estimation of a MoE regression, batched over replicates and restarts.

The estimator (nguyen2024 eq. 3) is

.. math:: \hat G_n \in \operatorname*{arg\,min}_{G \in \mathcal G_k(\Theta)}
          \frac1n \sum_{t=1}^n \big(Y_t - f_G(X_t)\big)^2 ,

over mixing measures with ``k`` atoms whose parameters lie in a compact set :math:`\Theta`.  The
compact set is part of the estimator: without it the sigmoid LSE can drive a redundant gate to
:math:`-\infty` or an expert to zero and, at small n, run off to parameter values of
order :math:`10^3`-:math:`10^6`.  ``box=`` is that set (a projection), and :class:`LSEFit` reports
which replicates end on its boundary.

R replicates x S restarts are one ``(R*S, 2k, d+1)`` parameter tensor; the objective and its
gradient come from a fused hand-derived kernel (:mod:`moestat.fit._objective`) and the optimisers
(:mod:`moestat.fit._optim`) keep per-problem state and convergence masks.

``learn_temperature=True`` adds the gate temperature as one more parameter, :math:`\log\tau` in row :math:`2k` of a
problem's table (the autograd reference kernel, :class:`moestat.fit._objective.ReferenceKernel`), for gates whose
temperature is identified (Nguyen, Akbarian & Ho, ICML 2024); the estimate is ``fit.params.temperature``.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from .._random import fresh_seed, seeded_generators, torch_seed
from .._torch import Array, cpu_threads, resolve_device, resolve_dtype, to_numpy, to_tensor
from .._validation import (
    Boolean,
    Choice,
    Device,
    Dtype,
    Integer,
    Optional,
    Real,
    Seed,
    as_numeric,
    check_choice,
    check_finite,
    check_int,
    input_scale,
    validate_arguments,
)
from ..exceptions import ConvergenceWarning, UnderdeterminedWarning, warn_user
from ..model import MoE
from ..params import Params
from . import _native, _optim
from ._layout import check_learn_temperature
from ._memory import LSE_MEMORY_BUDGET, LSEMemoryModel, memory_bytes
from ._objective import LSProblem, MeanKernel, ReferenceKernel, kernel_mode
from .base import FitResult, check_reps
from .init import from_params, kmeans_init, near_truth, random_init

OPTIMIZERS = ("auto", "newton", "lbfgs", "adam", "sgd", "lm")
INITS = ("auto", "near_truth", "random", "kmeans")
_START_KINDS = ("near_truth", "random", "kmeans")
_BLOCKS = ("gate_bias", "gate_weight", "expert_weight", "expert_bias")
_DEFAULT_MAX_ITER = {"newton": 200, "lbfgs": 1000, "adam": 5000, "lm": 200, "sgd": None}
#: ``optimizer="auto"`` runs Newton up to this many free parameters per problem (its Hessian takes F^2 floats per
#: problem and its factorisation F^3/3 flops per iteration), L-BFGS above.
NEWTON_MAX_PARAMS = 1000
#: ``compile=True`` runs Newton fits with at most this many free parameters per problem in the C++ loop: up to 950 it
#: measured faster than the tensor loop (benchmarks/lse_newton_native.py); larger problems (only with
#: ``optimizer="newton"``) are unmeasured and keep the tensor loop.
NATIVE_NEWTON_MAX_FREE = NEWTON_MAX_PARAMS
#: With ``block_bytes="auto"``, the inputs one call of the C++ Newton loop takes (it copies them transposed).  The
#: loop blocks each problem's observations for the cache itself, so blocks of replicates only bound that copy; large
#: blocks keep every thread busy, since a call's threads take its problems one at a time.
NATIVE_NEWTON_BLOCK_BYTES = 2**28
_DEFAULT_LR = {"adam": 1e-2, "sgd": 0.1}
_SADDLE_TOL = 1e-8  # smallest Hessian eigenvalue below -tol * largest |eigenvalue|: negative curvature


@dataclass
class LSEFit(FitResult):
    """Result of :func:`fit_lse` for R replicates (a :class:`~moestat.fit.base.FitResult`).

    Attributes
    ----------
    params : Params
        Batched numpy Params (R, ...): the restart with the smallest objective per replicate.  Softmax
        and top-K fits are reported in the normalisation :math:`\\beta_{0k} = 0, \\beta_{1k} = 0_d`.
    objective : ndarray (R,)
        :math:`\\frac1n\\sum_t (y_t - f_{\\hat G}(x_t))^2` at ``params``.
    converged : ndarray of bool (R,)
        Whether the best restart met ``tol``/``gtol`` (always False for the SGD protocol unless its final
        gradient is below ``gtol``).
    status : ndarray of str (R,)
        ``"gtol"``, ``"ftol"``, ``"xtol"``, ``"kink"`` (converged); ``"max_iter"``, ``"line_search"``,
        ``"damping"``, ``"stall"``, ``"saddle"``, ``"budget"`` (SGD protocol).  ``"kink"``: relu experts make the
        objective piecewise smooth, and a stop with no further decrease whose gradient is within the jump that
        observations on kinks can cause (:meth:`LSProblem.kink_tolerance`) is a non-smooth local minimum.
    n_iter : ndarray of int (R,)
        Iterations (SGD: minibatch steps).
    grad_norm : ndarray (R,)
        Sup-norm of the projected gradient at ``params``.
    cond : ndarray (R,)
        Condition number :math:`\\lambda_{\\max}/\\lambda_{\\min}` of :math:`J^\\top J` (free coordinates)
        at ``params``: the conditioning of the observed information; ``inf`` when singular to working
        precision (:math:`\\lambda_{\\min} \\le \\epsilon\\lambda_{\\max}`, so at most about 1e7 in float32), e.g.
        flat directions of relu/linear experts at zero gate slopes; NaN when not computed.
    hit_bound : ndarray of bool (R,)
        Whether ``params`` has a free coordinate on the box boundary.
    hessian_min_eig : ndarray (R,)
        Smallest eigenvalue of the exact Hessian of the objective (free coordinates) at ``params``, divided by
        its largest absolute eigenvalue: > 0 at a strict local minimum, about 0 along a flat direction, < 0 at a
        saddle (newton fits with negative curvature beyond 1e-8 get status ``"saddle"``).  NaN when not
        computed (``condition=False`` with another optimiser).
    restarts : DataFrame
        One row per (rep, restart): objective, converged, status, n_iter, grad_norm, hit_bound, best.
    restart_params : Params
        All restarts, batched (R*S, ...), row ``r*S + s``.
    start_params : Params or None
        The starting values of every restart, batched like ``restart_params`` (so a second solver can be run
        from exactly the start that won: ``init=fit.start_params.select(...)``).
    history : DataFrame or None
        With ``history=True``: one row per (rep, restart, iter) with objective and grad_norm.
    settings : dict
        Every configuration knob (init, init_scale, duplicate, optimizer, tolerances, box, seed, ...).
    wall_time : float
        Seconds spent in the optimiser.
    """

    params: Params
    objective: np.ndarray
    converged: np.ndarray
    status: np.ndarray
    n_iter: np.ndarray
    grad_norm: np.ndarray
    cond: np.ndarray
    hit_bound: np.ndarray
    restarts: pd.DataFrame
    restart_params: Params
    history: pd.DataFrame | None
    settings: dict[str, Any] = field(default_factory=dict)
    wall_time: float = float("nan")
    hessian_min_eig: np.ndarray | None = None
    start_params: Params | None = None

    @property
    def n_reps(self) -> int:
        return int(self.objective.shape[0])

    def glance(self) -> pd.DataFrame:
        """One row per replicate: objective, converged, status, n_iter, grad_norm, cond, hessian_min_eig,
        hit_bound, the best restart and its start, wall_time and every setting."""
        best = self.restarts[self.restarts["best"]].reset_index(drop=True)
        frame = pd.DataFrame({
            "rep": np.arange(self.n_reps), "objective": self.objective, "converged": self.converged,
            "status": self.status, "n_iter": self.n_iter, "grad_norm": self.grad_norm, "cond": self.cond,
            "hessian_min_eig": (np.full(self.n_reps, np.nan) if self.hessian_min_eig is None
                                else self.hessian_min_eig),
            "hit_bound": self.hit_bound, "best_restart": best["restart"].to_numpy(),
            "best_start": best["start"].to_numpy(), "wall_time": self.wall_time,
        })
        for key, value in self.config_columns().items():
            frame[key] = value
        return frame

    def select(self, rep: int | Sequence[int] | np.ndarray) -> LSEFit:
        """The fit of replicate(s) ``rep`` (batched; restarts, starting values and history follow)."""
        idx = check_reps(rep, self.n_reps)
        S = len(self.restarts) // self.n_reps
        rows = (idx[:, None] * S + np.arange(S)[None]).ravel()
        renumber = {int(old): new for new, old in enumerate(idx)}
        restarts = self.restarts.iloc[rows].reset_index(drop=True)
        restarts["rep"] = restarts["rep"].map(renumber)
        history = None
        if self.history is not None:
            history = self.history[self.history["rep"].isin(idx)].copy()
            history["rep"] = history["rep"].map(renumber)
            history = history.sort_values(["rep", "restart", "iter"], ignore_index=True)
        return LSEFit(
            params=self.params.select(idx), objective=self.objective[idx], converged=self.converged[idx],
            status=self.status[idx], n_iter=self.n_iter[idx], grad_norm=self.grad_norm[idx], cond=self.cond[idx],
            hit_bound=self.hit_bound[idx], restarts=restarts, restart_params=self.restart_params.select(rows),
            history=history, settings=dict(self.settings), wall_time=self.wall_time,
            hessian_min_eig=None if self.hessian_min_eig is None else np.asarray(self.hessian_min_eig)[idx],
            start_params=None if self.start_params is None else self.start_params.select(rows),
        )

    def config_columns(self) -> dict[str, Any]:
        """The settings as scalar columns (lists are joined with commas)."""
        out = {}
        for key, value in self.settings.items():
            if isinstance(value, (list, tuple)):
                value = ",".join(str(v) for v in value)
            elif isinstance(value, dict):
                value = ";".join(f"{k}={v}" for k, v in value.items())
            out[key] = value
        return out

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame: one row per (rep, quantity) with ``value`` and every setting as a column."""
        quantities = {"objective": self.objective, "converged": self.converged.astype(float),
                      "n_iter": self.n_iter.astype(float), "grad_norm": self.grad_norm, "cond": self.cond,
                      "hessian_min_eig": (np.full(self.n_reps, np.nan) if self.hessian_min_eig is None
                                          else self.hessian_min_eig),
                      "hit_bound": self.hit_bound.astype(float)}
        R = self.n_reps
        frame = pd.DataFrame({
            "rep": np.tile(np.arange(R), len(quantities)),
            "quantity": np.repeat(list(quantities), R),
            "value": np.concatenate([np.asarray(v, dtype=float) for v in quantities.values()]),
        })
        frame["status"] = np.tile(self.status, len(quantities))
        frame["wall_time"] = self.wall_time
        for key, value in self.config_columns().items():
            frame[key] = value
        return frame

    def __repr__(self) -> str:
        s = self.settings
        return (f"LSEFit(R={self.n_reps}, gate={s.get('gate')!r}, expert={s.get('expert')!r}, k={s.get('k')}, "
                f"optimizer={s.get('optimizer')!r}, converged={int(self.converged.sum())}/{self.n_reps}, "
                f"median objective={np.median(self.objective):.3g})")


# ------------------------------------------------------------------ input checks
def _as_data(X: Array, y: Array, spec: MoE) -> tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]:
    X, y = as_numeric("X", X), as_numeric("y", y)
    if X.ndim == 2:
        X = X[None]
        if y.ndim == 1:
            y = y[None]
    if X.ndim != 3:
        raise ValueError(f"X must have shape (n, d) or (R, n, d), got shape {tuple(X.shape)}.")
    if tuple(y.shape) != tuple(X.shape[:2]):
        raise ValueError(f"y has shape {tuple(y.shape)} but X has shape {tuple(X.shape)}; y must have shape "
                         "(n,) for X (n, d) or (R, n) for X (R, n, d).")
    if X.shape[-1] != spec.d:
        raise ValueError(f"X has {X.shape[-1]} columns but spec has d={spec.d}; build the spec with "
                         "d=X.shape[-1].")
    if X.shape[1] < 1:
        raise ValueError("X has no observations (n = 0).")
    check_finite("X", X)
    check_finite("y", y)
    return X, y


def _scale_weights(p: Params, s: np.ndarray | None, *, inverse: bool = False) -> Params:
    r"""The same MoE with inputs divided by ``s`` (per column): slopes times ``s`` (``inverse``: divided by ``s``).

    Gate logits and expert pre-activations are affine in x, so :math:`\beta_1^\top x = (\beta_1 s)^\top (x / s)`: a
    fit on ``X / s`` maps back exactly, whatever the gate and the expert family."""
    if s is None:
        return p
    q = p.numpy()
    f = 1.0 / s if inverse else s
    return Params(q.gate_bias, q.gate_weight * f, q.expert_weight * f, q.expert_bias, noise_sd=q.noise_sd,
                  temperature=q.temperature)


def _box_bounds(box: Any, spec: MoE, dtype: torch.dtype, device: torch.device
                ) -> tuple[torch.Tensor | None, torch.Tensor | None, dict | None]:
    """Lower/upper bound tensors (2k, d+1) from ``box`` and its normalised record."""
    if box is None:
        return None, None, None
    if isinstance(box, numbers.Real) and not isinstance(box, bool):
        box = dict.fromkeys(_BLOCKS, float(box))
    if not isinstance(box, Mapping):
        raise TypeError("box must be None, a positive number c (every parameter in [-c, c]) or a dict "
                        f"mapping blocks {list(_BLOCKS)} to c or (low, high); got {type(box).__name__}.")
    unknown = set(box) - set(_BLOCKS)
    if unknown:
        raise ValueError(f"box has unknown blocks {sorted(unknown)}; valid blocks are {list(_BLOCKS)}.")
    k, p = spec.k, spec.d + 1
    lo = torch.full((2 * k, p), -float("inf"), dtype=dtype, device=device)
    hi = torch.full((2 * k, p), float("inf"), dtype=dtype, device=device)
    where = {"gate_bias": (slice(0, k), slice(0, 1)), "gate_weight": (slice(0, k), slice(1, p)),
             "expert_bias": (slice(k, 2 * k), slice(0, 1)), "expert_weight": (slice(k, 2 * k), slice(1, p))}
    record = {}
    for name, bound in box.items():
        if isinstance(bound, numbers.Real) and not isinstance(bound, bool):
            low, high = -float(bound), float(bound)
        else:
            try:
                low, high = (float(v) for v in bound)
            except (TypeError, ValueError):
                raise TypeError(f"box[{name!r}] must be c > 0 or a pair (low, high), got {bound!r}.") from None
        if not (low < high) or np.isnan(low) or np.isnan(high):
            raise ValueError(f"box[{name!r}] needs low < high, got ({low}, {high}).")
        rows, cols = where[name]
        lo[rows, cols], hi[rows, cols] = low, high
        record[name] = (low, high)
    if spec.gate in ("softmax", "topk") and "gate_bias" in record and not (
            record["gate_bias"][0] <= 0 <= record["gate_bias"][1]):
        raise ValueError("softmax fits fix the last atom's gate intercept at 0 (translation normalisation); "
                         "the gate_bias box must contain 0.")
    if spec.gate in ("softmax", "topk") and "gate_weight" in record and not (
            record["gate_weight"][0] <= 0 <= record["gate_weight"][1]):
        raise ValueError("softmax fits fix the last atom's gate slope at 0; the gate_weight box must contain 0.")
    return lo, hi, record


def _compiled_newton(kernel: MeanKernel | ReferenceKernel, spec: MoE, device: torch.device, traced: bool,
                     n_free: int) -> _native.NativeOps | None:
    """The C++ Newton loop (:func:`moestat.fit._optim.newton_native`) where ``compile`` asked for native code and it
    applies: the native kernel in use (CPU, sigmoid, softmax or top-K gate), :math:`\\varphi''` in C++, at most
    :data:`NATIVE_NEWTON_MAX_FREE` free parameters and no per-iteration ``history`` or ``progress`` (``traced``); None
    otherwise (the tensor loop)."""
    if traced or device.type != "cpu" or not isinstance(kernel, MeanKernel) or kernel.native is None:
        return None
    if not _native.newton_supports(spec.gate, spec.k, spec.family) or n_free > NATIVE_NEWTON_MAX_FREE:
        return None
    return _native.load_newton()


def _certificate(problem: LSProblem, theta: torch.Tensor, best: torch.Tensor, per_block: int, *, condition: bool,
                 newton_loop: _native.NativeOps | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    r"""The condition number of :math:`J^\top J` (when ``condition``; else None) and the exact Hessian's eigenvalues
    (ascending) at each replicate's best restart (``best``: problem indices), ``per_block`` replicates at a time.
    With the C++ Newton loop the Hessian is the one it ended with, formed without a batched evaluation."""
    conds, evs = [], []
    for lo in range(0, best.shape[0], per_block):
        rows = best[lo : lo + per_block]
        problem.set_active(rows)
        if condition:
            _, H, _ = problem.gauss_newton(theta[rows])
            ev = torch.linalg.eigvalsh(H)
            lam_min, lam_max = ev[:, 0], ev[:, -1]
            conds.append(torch.where(lam_min > lam_max * torch.finfo(ev.dtype).eps, lam_max / lam_min,
                                     torch.full_like(lam_min, float("inf"))))
        if newton_loop is not None:
            He = _optim.native_hessians(problem, theta[rows], newton_loop)
        else:
            _, He, _ = problem.gauss_newton(theta[rows], exact=True)
        evs.append(torch.linalg.eigvalsh(He))
    return (torch.cat(conds) if condition else None), torch.cat(evs)


def _free_mask(spec: MoE, device: torch.device) -> torch.Tensor:
    k, p = spec.k, spec.d + 1
    free = torch.ones(2 * k, p, dtype=torch.bool, device=device)
    gauge = spec.gating.gauge
    if gauge == "row":
        free[k - 1] = False  # translation normalisation: the last gate row is held (at 0 for softmax/top-K)
    elif gauge == "intercept":
        free[k - 1, 0] = False  # only a common intercept shift is free: hold the last atom's intercept
    if not spec.family.input_dependent:
        free[k:, 1:] = False  # constant experts have no slope
    return free


def _params_to_theta(p: Params, dtype: torch.dtype, device: torch.device,
                     temperature: np.ndarray | None = None) -> torch.Tensor:
    """Flat tables (B, 2k(d+1)) of batched Params; with ``temperature`` (B,) one more row ``[log tau, 0, ..., 0]``."""
    gb, gw = to_tensor(p.gate_bias, device=device, dtype=dtype), to_tensor(p.gate_weight, device=device, dtype=dtype)
    ew, eb = (to_tensor(p.expert_weight, device=device, dtype=dtype),
              to_tensor(p.expert_bias, device=device, dtype=dtype))
    gate = torch.cat([gb.unsqueeze(-1), gw], -1)
    expert = torch.cat([eb.unsqueeze(-1), ew], -1)
    rows = [gate, expert]
    if temperature is not None:
        tau_row = torch.zeros(gb.shape[0], 1, gw.shape[-1] + 1, dtype=dtype, device=device)
        tau_row[:, 0, 0] = torch.log(to_tensor(np.asarray(temperature, dtype=float), device=device, dtype=dtype))
        rows.append(tau_row)
    return torch.cat(rows, -2).reshape(gb.shape[0], -1)


def _theta_to_params(theta: torch.Tensor, k: int, d: int, learn_temperature: bool = False) -> Params:
    t = to_numpy(theta).reshape(-1, 2 * k + int(learn_temperature), d + 1)
    temperature = np.exp(t[:, 2 * k, 0]) if learn_temperature else None
    return Params(t[:, :k, 0], t[:, :k, 1:], t[:, k:2 * k, 1:], t[:, k:2 * k, 0], temperature=temperature)


def _start_temperature(spec: MoE, init: Any, truth: Params | None, kinds: list[str] | None, R: int, S: int
                       ) -> np.ndarray:
    """Starting temperatures (R*S,) of a fit that learns it, rows r*S + s: an ``init`` Params' temperature, else the
    truth's for ``near_truth`` starts, else ``spec.temperature``."""
    out = np.full((R, S), float(spec.temperature))

    def per_rep(p: Params) -> np.ndarray | None:
        if p.temperature is None:
            return None
        t = np.asarray(p.numpy().temperature, dtype=float)
        return np.broadcast_to(t.reshape(-1, 1) if t.ndim else t, (R, 1))

    if isinstance(init, Params):
        t = per_rep(init)
        if t is not None:
            out[:] = t
    elif kinds is not None and truth is not None:
        t = per_rep(truth)
        if t is not None:
            for s, kind in enumerate(kinds):
                if kind == "near_truth":
                    out[:, s] = t[:, 0]
    return out.reshape(-1)


def _check_real(name: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}.")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value}.")
    return float(value)


def _truth_params(truth: Any) -> Params | None:
    if truth is None or isinstance(truth, Params):
        return truth
    if isinstance(truth, tuple) and len(truth) == 2 and isinstance(truth[1], Params):
        return truth[1]  # a presets Truth (spec, params)
    raise TypeError(f"truth must be a moestat.Params (or a presets Truth), got {type(truth).__name__}.")


def _replicates_per_block(block_bytes: Any, dev: torch.device, R: int, n: int, d: int, itemsize: int) -> int:
    """How many replicates one batched program takes (all of them unless a CPU cache budget says otherwise)."""
    if block_bytes == "auto":
        block_bytes = None if dev.type == "cuda" else 2**23
    if block_bytes is None:
        return R
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, numbers.Integral) or block_bytes < 1:
        raise ValueError(f"block_bytes must be 'auto', None or a positive integer, got {block_bytes!r}.")
    return max(1, min(R, int(block_bytes) // max(1, n * (d + 1) * itemsize)))


def _problem_generators(seed: Any, count: int) -> list[torch.Generator]:
    """One torch generator per problem (replicate x restart, in that order), each seeded by its own child of
    the fit's seed, so that a problem's random stream does not depend on how problems are batched."""
    return seeded_generators(np.random.SeedSequence(torch_seed(seed)).spawn(count))


def _starts(kind: str, S: int, spec: MoE, truth: Params | None, X: np.ndarray, y: np.ndarray, R: int,
            duplicate: Sequence[int] | None, scale: float, seed: Any) -> Params:
    """R*S starts of one kind (rows r*S + s)."""
    if kind == "near_truth":
        return near_truth(spec, truth, R, S, duplicate=duplicate, scale=scale, seed=seed)
    if kind == "random":
        return random_init(spec, y, S, scale=scale, seed=seed)
    return kmeans_init(spec, X, y, S, scale=scale, seed=seed)


def _mixed_starts(kinds: list[str], spec: MoE, truth: Params | None, X: np.ndarray, y: np.ndarray, R: int,
                  duplicate: Sequence[int] | None, scale: float | None, seed: Any) -> Params:
    """Starts of several kinds, one per entry of ``kinds`` and replicate (rows r*S + s, s in the order of ``kinds``).

    Kind q of replicate r draws from ``SeedSequence(child_r.entropy, spawn_key=child_r.spawn_key + (q,))``, so its
    starts do not depend on the other kinds or replicates; each kind keeps its default scale unless ``scale``."""
    from ..simulators.regression import replicate_seeds

    children = replicate_seeds(seed, R)
    order = list(dict.fromkeys(kinds))
    blocks = {}
    for q, kind in enumerate(order):
        seeds = [np.random.SeedSequence(c.entropy, spawn_key=(*c.spawn_key, q)) for c in children]
        s_kind = kinds.count(kind)
        sc = scale if scale is not None else {"near_truth": 0.05, "random": 1.0}.get(kind, 0.0)
        blocks[kind] = (_starts(kind, s_kind, spec, truth, X, y, R, duplicate, sc, seeds), s_kind)
    picks = []
    for r in range(R):
        used = dict.fromkeys(order, 0)
        for kind in kinds:
            starts, s_kind = blocks[kind]
            picks.append(starts.select([r * s_kind + used[kind]]))
            used[kind] += 1
    return Params.stack(picks)


# ------------------------------------------------------------------ estimator
@validate_arguments(optimizer=Choice(*OPTIMIZERS), restarts=Integer(1), max_iter=Optional(Integer(1)), tol=Real(0),
                    gtol=Real(0), epochs=Integer(1),
                    lr=Optional(Real(0, open_low=True)), batch_size=Integer(1),
                    init_scale=Optional(Real(0, open_low=True)), device=Device(), dtype=Dtype(), seed=Seed(),
                    progress=Boolean(), history=Boolean(), condition=Boolean(), threads=Optional(Integer(1)),
                    underdetermined=Choice("raise", "warn"), learn_temperature=Boolean())
def fit_lse(spec: MoE, X: Array, y: Array, *, init: str | Sequence[str] | Params = "auto", truth: Params | None = None,
            duplicate: Sequence[int] | None = None, init_scale: float | None = None, restarts: int = 1,
            optimizer: str = "auto", max_iter: int | None = None, tol: float = 1e-12, gtol: float = 1e-10,
            box: float | Mapping[str, Any] | None = None, epochs: int = 10, lr: float | None = None,
            batch_size: int = 32, device: str | torch.device = "auto", dtype: torch.dtype | str | None = None,
            seed: Any = None, progress: bool = False, history: bool = False, condition: bool = True,
            compile: bool | str = False, block_bytes: int | str | None = "auto", threads: int | None = 1,
            underdetermined: str = "raise", learn_temperature: bool = False,
            memory_budget: int | str | None = LSE_MEMORY_BUDGET) -> LSEFit:
    r"""Least-squares estimator of a MoE regression for R replicates at once.

    Parameters
    ----------
    spec : MoE
        The fitted model (gate, expert family, number of atoms ``k``, ``d``).
    X : array, shape (n, d) or (R, n, d)
    y : array, shape (n,) or (R, n)
    init : {"auto", "near_truth", "random", "kmeans"}, list of them, or Params
        Starting values (:mod:`moestat.fit.init`).  ``"auto"``: ``"near_truth"`` when ``truth`` is given,
        else ``"kmeans"``.  A list gives one start per entry (and sets ``restarts``), e.g.
        ``["near_truth", "kmeans", "random", "random"]``, so that the oracle start is not the only one; the
        best objective wins and ``fit.restarts["start"]`` says which kind each start was.  A Params is used as
        given (unbatched: shared by all replicates; batched with R or R*restarts rows).
    truth : Params, optional
        True parameters (k* atoms), needed by ``init="near_truth"``.
    duplicate : list of int, optional
        For ``near_truth`` with k > k*: the ``k - k*`` true atoms that get an extra fitted copy, with a
        weight-preserving split (sigmoid :math:`\operatorname{logit}(\sigma(\beta_0)/m)`, softmax
        :math:`\beta_0 - \log m`).  Decides the regime of an over-specified fit; recorded.
    init_scale : float, optional
        Perturbation sd: near_truth default 0.05, random default 1.0 (a scale factor), kmeans and user
        Params default 0 (restarts > 1 from a user Params need > 0).
    restarts : int
        Starts per replicate; the one with the smallest objective is returned.
    optimizer : {"auto", "newton", "lbfgs", "lm", "adam", "sgd"}
        ``"auto"`` (default): ``"newton"`` when a problem has at most ``NEWTON_MAX_PARAMS`` (1000) free
        parameters, else ``"lbfgs"``; the choice is recorded in ``settings["optimizer"]``.  ``"newton"``:
        trust-region Newton with the exact Hessian (same cost per iteration as Gauss-Newton, quadratic
        convergence; converged only on ``gtol`` at a point whose Hessian has no negative eigenvalue, so
        the result is a certified local minimum of the least-squares objective).  ``"lbfgs"``: full-batch
        L-BFGS.  ``"lm"``: Gauss-Newton/Levenberg-Marquardt.  ``"adam"``: full-batch Adam.  ``"sgd"``: the
        papers' minibatch SGD protocol (``epochs``, ``lr``, ``batch_size``), which measures an optimiser
        budget rather than the estimator.  Memory :math:`O(P^2)` per problem for newton and lm.
    max_iter : int, optional
        Iteration cap (defaults: newton 200, lbfgs 1000, adam 5000, lm 200; unused by sgd).  A problem
        that stops on the cap has status ``"max_iter"`` and ``converged = False``.
    tol : float
        Relative objective decrease below which a problem is converged (``"ftol"``; lbfgs and lm only:
        Newton stops on the gradient).
    gtol : float
        Sup-norm of the projected gradient of the objective below which a problem is converged (``"gtol"``).
    box : float or dict, optional
        The compact parameter set: ``c`` puts every coordinate in [-c, c]; a dict maps blocks
        (``gate_bias``, ``gate_weight``, ``expert_weight``, ``expert_bias``) to ``c`` or ``(low, high)``.
        Enforced by projection; ``hit_bound`` reports replicates on the boundary.
    epochs, lr, batch_size :
        SGD protocol settings (the paper: 10 epochs, lr 0.1; batch size unstated, moestat default 32).
        ``lr`` is also Adam's step (default 1e-2).
    device : "auto", "cpu", "cuda" or torch.device
    dtype : torch dtype, optional
        float64 by default on every device; ``"float32"`` trades accuracy (~1e-4 relative) for GPU speed.
    seed : int, SeedSequence or list of SeedSequence
        Seeds the starting values (replicate r uses ``SeedSequence(seed).spawn(R)[r]``) and the SGD
        permutations.
    progress : bool
        Show a tqdm bar.
    history : bool
        Keep the objective and gradient norm of every iteration (``fit.history``).
    condition : bool
        Compute ``fit.cond`` (one :math:`J^\top J` per replicate: :math:`O(nP^2)` work).
    compile : bool or {"native", "eager"}
        ``True`` or ``"native"``: a C++ kernel that keeps each block of observations in cache through both
        products and the element-wise pass, for CPU tensors (sigmoid, softmax or top-K softmax gate, k <= 32,
        an expert family with a C++ form: :func:`moestat.experts.native_families`; built once per machine in
        about 30 s), worth it for long studies at large n (docs/performance/lse.md).  Everything else (CUDA
        tensors, other gates and experts, more experts) and the default ``False`` run the eager kernel, already
        fused by hand.  Results agree with the eager kernel to round-off.  ``fit.settings["kernel"]`` records
        the kernel that ran.  Newton fits (up to :data:`NATIVE_NEWTON_MAX_FREE` free parameters) also run the
        whole Newton loop in C++, one problem at a time with its arrays in cache
        (:func:`moestat.fit._optim.newton_native`; 3-13x faster on small problems, where the batched loop's
        cost is dispatch, 1.15-1.2x at the flagship size;
        ``settings["newton_loop"] == "native"``), unless
        ``history`` or ``progress`` asks for per-iteration output.  It agrees with the tensor loop to rounding,
        except at the rounding floor of the objective, where it takes a step whose predicted decrease the
        objective cannot resolve if the objective did not rise (docs/lse.md).
    block_bytes : "auto", int or None
        Cache blocking over replicates: one batched program takes as many replicates as have inputs of
        at most ``block_bytes`` bytes, and blocks run one after another.  ``"auto"``: 8 MiB on CPU (where
        a batch whose data exceed the cache is memory-bound and slower than fitting the replicates one
        by one; see docs/performance/lse.md), everything at once on CUDA; with the C++ Newton loop
        (``compile=True``), which blocks each problem's observations itself, up to 256 MiB of inputs per call,
        whose problems its threads take one at a time.  ``None``: one program.  Results do not depend on it.
        The SGD protocol ignores it (each step touches one minibatch, so its replicates run as one program
        unless ``memory_budget`` splits them; each problem draws its minibatches from its own stream).
    memory_budget : int, str or None
        Bytes the fit may hold for its data and its problems' arrays (an integer, or a string such as ``"2GB"`` or
        ``"512MiB"``; default ``"2GB"``; ``None``: no budget).  Newton's and Levenberg-Marquardt's Hessians take
        :math:`F^2` words per (replicate, restart) problem (2.7 MiB at the flagship size), so without a budget a
        batch of hundreds of problems holds gigabytes: blocks of replicates (never splitting one replicate's
        restarts) are made small enough for the estimate of :class:`moestat.fit._memory.LSEMemoryModel`, and the
        certificate after the fit (the exact Hessian's eigenvalues at each replicate's best restart) is computed in
        blocks the same way.  Where ``block_bytes`` already makes smaller blocks it decides.  The observation
        chunks' workspaces (about 20 MiB on a CPU, up to 1 GiB each on a GPU, and at most 2 GiB of earlier
        chunk shapes kept for reuse) do not grow with the problems and are not counted.  A budget below one
        replicate at a time warns and fits one at a time.  Blocks change only the round-off of batched products
        (see ``block_bytes``).  ``fit.settings["replicates_per_block"]`` records the
        block size, and ``fit.settings["memory_budget"]`` a budget other than the default.
    threads : int or None
        torch intra-op threads on CPU during the solve (default 1, restored afterwards): blocks of
        small batched problems gain little from threads and lose 10-25x when other processes share the
        cores.  ``None`` keeps torch's setting.  Use study workers (processes) for parallelism.  The C++ Newton
        loop (``compile=True``) gives the threads whole problems, each taking the next as it becomes free (the same
        results as one thread; a batch of 20 flagship replicates ran 1.5-1.9x faster on two threads than a loop
        of single fits, docs/performance/lse.md).
    underdetermined : {"raise", "warn"}
        What to do when n is smaller than the number of mean parameters: raise ``ValueError`` (default) or
        emit :class:`moestat.UnderdeterminedWarning` and fit anyway — the same policy as
        :func:`moestat.fit_mle`.
    learn_temperature : bool
        Fit the gate temperature :math:`\tau` jointly (as :math:`\log\tau`, so :math:`\tau > 0`), starting at an
        ``init`` Params' ``temperature``, at the truth's for ``near_truth`` starts, else at ``spec.temperature``;
        the estimate is ``fit.params.temperature`` (also in ``restart_params``).  Only for gates whose temperature
        is identified (``laplace``, ``cosine``, ``activation``: :attr:`moestat.gates.Gate.temperature_identified`;
        an affine gate's :math:`(c\beta_0, c\beta_1, c\tau)` is the same model, docs/temperature.md); ``box``
        does not bound it.  It runs on the autograd reference kernel.  ``False`` (default): the temperature is
        ``spec.temperature``, fixed, as before.

    Returns
    -------
    LSEFit

    Raises
    ------
    ValueError, TypeError
        Shape/NaN problems, ``init="near_truth"`` without ``truth``, bad ``duplicate``, ``restarts < 1``,
        unknown optimiser or init, malformed ``box``.

    Examples
    --------
    >>> import moestat as ms
    >>> spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="gelu", seed=0)
    >>> data = ms.simulate(spec, truth, n=2000, reps=4, seed=1)
    >>> fit = ms.fit_lse(spec.with_k(9), data.X, data.y, init="near_truth", truth=truth, duplicate=[0],
    ...                  seed=2, box=10.0)
    >>> fit.params.n_reps
    4
    """
    if not isinstance(spec, MoE):
        raise TypeError(f"spec must be a moestat.MoE, got {type(spec).__name__}.")
    check_learn_temperature(spec, learn_temperature)
    if not learn_temperature and isinstance(init, Params) and init.temperature is not None:
        raise ValueError("init carries a fitted temperature (Params.temperature) but learn_temperature=False fixes "
                         f"the temperature at spec.temperature={spec.temperature}; pass learn_temperature=True, or "
                         "drop the init's temperature (dataclasses.replace(init, temperature=None)).")
    check_choice("optimizer", optimizer, OPTIMIZERS)
    optimizer_requested = optimizer
    if optimizer == "auto":
        optimizer = "newton" if int(_free_mask(spec, torch.device("cpu")).sum()) <= NEWTON_MAX_PARAMS else "lbfgs"
    restarts = check_int("restarts", restarts)
    truth = _truth_params(truth)
    kinds: list[str] | None = None
    if isinstance(init, Params):
        init_name = "params"
    elif isinstance(init, (list, tuple)):
        if not init:
            raise ValueError("init given as a list needs at least one start kind, e.g. ['near_truth', 'kmeans'].")
        kinds = [check_choice("init", kind, _START_KINDS) for kind in init]
        if restarts not in (1, len(kinds)):
            raise ValueError(f"init lists {len(kinds)} starts but restarts={restarts}; a list of start kinds sets the "
                             "number of restarts (one per entry): drop restarts or make them agree.")
        restarts = len(kinds)
        init_name = ",".join(kinds)
    else:
        check_choice("init", init, INITS)
        init_name = init if init != "auto" else ("near_truth" if truth is not None else "kmeans")
        kinds = [init_name] * restarts if init_name != "params" else None
    if kinds is not None and "near_truth" in kinds and truth is None:
        raise ValueError("init='near_truth' needs truth= (the true Params); pass truth or use init='kmeans'.")
    if duplicate is not None and (kinds is None or "near_truth" not in kinds):
        raise ValueError("duplicate= only applies to init='near_truth'.")
    max_iter = _DEFAULT_MAX_ITER[optimizer] if max_iter is None else check_int("max_iter", max_iter)
    tol, gtol = _check_real("tol", tol), _check_real("gtol", gtol)
    compile_mode = kernel_mode(compile)  # checked before any work starts
    budget = memory_bytes(memory_budget)
    check_choice("underdetermined", underdetermined, ("raise", "warn"))
    lr = _DEFAULT_LR.get(optimizer) if lr is None else _check_real("lr", lr, positive=True)
    epochs, batch_size = check_int("epochs", epochs), check_int("batch_size", batch_size)
    default_scale = {"near_truth": 0.05, "random": 1.0}.get(init_name, 0.0)
    scales = None if init_scale is None else _check_real("init_scale", init_scale)
    init_scale = default_scale if init_scale is None else scales

    X, y = _as_data(X, y, spec)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    Xn, yn = to_numpy(X).astype(np.float64), to_numpy(y).astype(np.float64)
    R, n, d = Xn.shape
    P = spec.n_params() + int(learn_temperature)
    if n < P and underdetermined == "warn":
        warn_user(f"n={n} observations are fewer than the {P} mean parameters: the least-squares estimator is "
                      "not identified (the fit is one minimiser among many).", UnderdeterminedWarning)
    elif n < P:
        raise ValueError(f"n={n} observations are fewer than the {P} mean parameters of a {spec.k}-expert "
                         f"{spec.gate}/{spec.expert} MoE in d={spec.d}; the least-squares estimator is not identified. "
                         "Use fewer experts or more data, or pass underdetermined='warn' to fit anyway.")
    lower, upper, box_record = _box_bounds(box, spec, dt, dev)
    # inputs far from unit scale are fitted as X / s (starts, steps and tolerances assume unit-order inputs) and
    # the slopes are mapped back: the fitted function is the same at every scale of the inputs
    # (exact only for gates affine in x: the others are fitted on the inputs as given)
    in_scale = input_scale(Xn) if spec.gating.input_affine else None
    if in_scale is not None:
        Xn = Xn / in_scale
        truth = None if truth is None else _scale_weights(truth, in_scale)
        if init_name == "params":
            init = _scale_weights(init, in_scale)
        col = torch.as_tensor(np.concatenate([[1.0], in_scale]), dtype=dt, device=dev)
        lower = None if lower is None else lower * col
        upper = None if upper is None else upper * col

    # starting values (numpy, R*S rows)
    dup_record = [int(j) for j in duplicate] if duplicate is not None else []
    seed = fresh_seed(seed)
    if init_name == "params":
        start = from_params(spec, init, R, restarts, scale=init_scale, seed=seed)
    elif len(set(kinds)) == 1:
        start = _starts(kinds[0], restarts, spec, truth, Xn, yn, R, duplicate, init_scale, seed)
    else:
        start = _mixed_starts(kinds, spec, truth, Xn, yn, R, duplicate, scales, seed)

    Xt, yt = to_tensor(Xn, device=dev, dtype=dt), to_tensor(yn, device=dev, dtype=dt)
    kernel = MeanKernel.from_spec(spec, compile=compile, learn_temperature=learn_temperature)
    free = _free_mask(spec, dev)
    tau0 = None
    if learn_temperature:  # one more row: [log tau, held zeros]
        free = torch.cat([free, torch.zeros(1, d + 1, dtype=torch.bool, device=dev)])
        free[-1, 0] = True
        if lower is not None and upper is not None:
            lower = torch.cat([lower, torch.full((1, d + 1), -float("inf"), dtype=dt, device=dev)])
            upper = torch.cat([upper, torch.full((1, d + 1), float("inf"), dtype=dt, device=dev)])
        tau0 = _start_temperature(spec, init, truth, kinds, R, restarts)
        start = Params(start.gate_bias, start.gate_weight, start.expert_weight, start.expert_bias,
                       noise_sd=start.noise_sd, temperature=tau0)
    problem = LSProblem(kernel, Xt, yt, restarts, free, lower, upper)
    theta0 = _params_to_theta(start, dt, dev, tau0)
    if optimizer == "sgd" and batch_size > n:
        raise ValueError(f"batch_size={batch_size} exceeds n={n}; choose batch_size <= n.")
    generators = _problem_generators(seed, R * restarts) if optimizer == "sgd" else []
    newton_loop = (_compiled_newton(kernel, spec, dev, history or progress, int(free.sum()))
                   if optimizer == "newton" else None)
    native_auto = newton_loop is not None and block_bytes == "auto"
    group = _replicates_per_block(NATIVE_NEWTON_BLOCK_BYTES if native_auto else block_bytes, dev, R, n, d,
                                  Xt.element_size())
    memory = LSEMemoryModel.of(optimizer, int(free.sum()), n, R, d, spec.k, native=newton_loop is not None,
                               itemsize=Xt.element_size(),
                               reference_rows=kernel.rows if isinstance(kernel, ReferenceKernel) else None)
    memory.check(budget, restarts, certificate=condition or optimizer == "newton")
    memory_group = memory.replicates_per_block(budget, restarts, R)
    group = min(group, memory_group)
    if optimizer == "sgd":  # one minibatch per step: the cache argument for blocks does not apply, the memory one does
        group = memory_group

    def run(prob: LSProblem, th: torch.Tensor, lo: int = 0) -> _optim.OptimResult:
        with cpu_threads(threads, dev):
            return solve(prob, th, generators[lo : lo + th.shape[0]])

    def solve(prob: LSProblem, th: torch.Tensor, gens: list[torch.Generator]) -> _optim.OptimResult:
        if optimizer == "lbfgs":
            return _optim.lbfgs(prob, th, max_iter=max_iter, tol=tol, gtol=gtol, history=history, progress=progress)
        if optimizer == "lm":
            return _optim.levenberg_marquardt(prob, th, max_iter=max_iter, tol=tol, gtol=gtol, history=history,
                                              progress=progress)
        if optimizer == "newton":
            # stall: a decrease below 1e-6 of the statistical scale of the objective (about L F / n) in 20 iterations
            stall_tol = max(1e-14, 1e-6 * int(free.sum()) / n)
            if newton_loop is not None:
                return _optim.newton_native(prob, th, newton_loop, max_iter=max_iter, gtol=gtol, stall_tol=stall_tol)
            return _optim.newton(prob, th, max_iter=max_iter, gtol=gtol, history=history, progress=progress,
                                 stall_tol=stall_tol)
        if optimizer == "adam":
            return _optim.adam(prob, th, lr=lr, max_iter=max_iter, gtol=gtol, history=history, progress=progress)
        return _optim.sgd_protocol(prob, th, epochs=epochs, lr=lr, batch_size=batch_size, gtol=gtol,
                                   generators=gens, history=history, progress=progress)

    t0 = time.perf_counter()
    if group >= R:
        res = run(problem, theta0)
    else:
        parts = []
        for lo in range(0, R, group):
            hi = min(R, lo + group)
            sub = LSProblem(kernel, Xt[lo:hi], yt[lo:hi], restarts, free, lower, upper)
            parts.append((lo * restarts, run(sub, theta0[lo * restarts : hi * restarts], lo * restarts)))
        res = _optim.concat_results(parts)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t0

    S = restarts
    if spec.family.name == "relu" and optimizer in ("newton", "lm", "lbfgs"):
        # piecewise-smooth objective: a stop with no further decrease and a gradient within the kink bound is a
        # non-smooth local minimum (status "kink", converged)
        bounds = []
        with cpu_threads(threads, dev):
            for lo in range(0, R, memory_group):  # a mean and residuals of n per problem
                hi = min(R, lo + memory_group) * S
                problem.set_active(torch.arange(lo * S, hi, device=dev))
                bounds.append(problem.kink_tolerance(res.theta[lo * S : hi]))
        bound = torch.cat(bounds)
        stalled = torch.isin(res.status, torch.tensor([2, 5, 6, 9], device=dev))
        res.status = torch.where(stalled & (res.grad_norm <= bound), torch.full_like(res.status, 10), res.status)
    loss = res.loss.reshape(R, S)
    loss_sel = torch.where(torch.isfinite(loss), loss, torch.full_like(loss, float("inf")))
    best_s = loss_sel.argmin(1)
    best = torch.arange(R, device=dev) * S + best_s
    hit_all = problem.at_bound(res.theta)
    converged_all = res.converged
    status_all = np.array([_optim.STATUS[int(c)] for c in to_numpy(res.status)], dtype=object)

    all_params = _scale_weights(_theta_to_params(res.theta, spec.k, d, learn_temperature), in_scale, inverse=True)
    best_np = to_numpy(best)
    rep_idx, rs_idx = np.repeat(np.arange(R), S), np.tile(np.arange(S), R)
    cond = np.full(R, np.nan)
    hess_min = np.full(R, np.nan)
    if condition or optimizer == "newton":
        per_block = memory.replicates_per_block(budget, 1, R, certificate=True)
        with cpu_threads(threads, dev):  # the eigensolver's OpenMP team stalls on a shared CPU like the solve
            cond_t, ev = _certificate(problem, res.theta, best, per_block, condition=condition,
                                      newton_loop=newton_loop)
        if cond_t is not None:
            cond = to_numpy(cond_t).astype(float)
        scale = ev.abs().amax(1).clamp_min(torch.finfo(dt).tiny)
        hess_min = to_numpy(ev[:, 0] / scale).astype(float)
        if optimizer == "newton":  # a gradient-tolerance stop with negative curvature is a saddle, not a minimum
            saddle = (ev[:, 0] < -_SADDLE_TOL * scale) & (res.status[best] == 1)  # (kink stops: H omits the kinks)
            res.status[best[saddle]] = 8
            converged_all = res.converged
            status_all = np.array([_optim.STATUS[int(c)] for c in to_numpy(res.status)], dtype=object)
    restarts_frame = pd.DataFrame({
        "rep": rep_idx, "restart": rs_idx, "objective": to_numpy(res.loss).astype(float),
        "converged": to_numpy(converged_all), "status": status_all, "n_iter": to_numpy(res.n_iter),
        "grad_norm": to_numpy(res.grad_norm).astype(float), "hit_bound": to_numpy(hit_all),
        "best": np.isin(np.arange(R * S), best_np),
        "start": np.tile(np.array(kinds if kinds is not None else ["params"] * S, dtype=object), R),
    })

    hist_frame = None
    if history:
        rows = []
        for it, act, f, gn in res.history:
            a = to_numpy(act)
            rows.append(pd.DataFrame({"rep": a // S, "restart": a % S, "iter": it,
                                      "objective": to_numpy(f).astype(float), "grad_norm": to_numpy(gn).astype(float)}))
        hist_frame = pd.concat(rows, ignore_index=True).sort_values(["rep", "restart", "iter"], ignore_index=True)

    settings = {
        "estimator": "lse", "gate": spec.gate, "expert": spec.expert, "k": spec.k, "d": spec.d, "n": n,
        "top_k": spec.top_k, "temperature": spec.temperature, "init": init_name, "init_scale": init_scale,
        "duplicate": dup_record, "restarts": S, "optimizer": optimizer, "optimizer_requested": optimizer_requested,
        "max_iter": max_iter, "tol": tol,
        "gtol": gtol, "box": box_record if box_record is not None else "none",
        "epochs": epochs if optimizer == "sgd" else None, "lr": lr,
        "batch_size": batch_size if optimizer == "sgd" else None,
        "seed": seed if isinstance(seed, (int, type(None))) else str(seed), "device": str(dev),
        "dtype": str(dt).replace("torch.", ""), "compile": compile_mode, "kernel": kernel.kind(dev),
        "kernel_note": getattr(kernel, "note", None),
        "replicates_per_block": group, "n_evals": res.n_evals,
        "input_scale": None if in_scale is None else ",".join(f"{v:.3g}" for v in in_scale),
    }
    if budget != memory_bytes(LSE_MEMORY_BUDGET):  # a column only when asked for, so the default frames keep theirs
        settings["memory_budget"] = budget
    if learn_temperature:  # recorded only when set: fits with a fixed temperature keep their columns
        settings["learn_temperature"] = True
    if newton_loop is not None:  # likewise: the tensor loop's fits keep their columns
        settings["newton_loop"] = "native"
    fit = LSEFit(
        params=all_params.select(best_np), objective=to_numpy(res.loss[best]).astype(float),
        converged=to_numpy(converged_all[best]), status=status_all[best_np],
        n_iter=to_numpy(res.n_iter[best]), grad_norm=to_numpy(res.grad_norm[best]).astype(float), cond=cond,
        hit_bound=to_numpy(hit_all[best]), restarts=restarts_frame, restart_params=all_params,
        history=hist_frame, settings=settings, wall_time=wall, hessian_min_eig=hess_min,
        start_params=_scale_weights(start, in_scale, inverse=True),
    )
    if optimizer != "sgd" and not fit.converged.all():
        bad = int((~fit.converged).sum())
        stops = sorted(set(fit.status[~fit.converged]))
        advice = ("a saddle point has negative curvature: restart from other starts (restarts > 1)"
                  if stops == ["saddle"] else "raise max_iter, loosen tol/gtol or add restarts")
        warn_user(f"{bad} of {R} replicates did not converge (status: {stops}); {advice}.",
                      ConvergenceWarning)
    return fit
