r"""Maximum-likelihood fitting of Gaussian mixtures of experts: :func:`fit_mle`.

The conditional density is (Jordan & Jacobs 1994; :meth:`moestat.MoE.loglik`)

.. math:: p(y\mid x) = \sum_{i=1}^k \tilde\pi_i(x)\, \mathcal N\big(y;\, h(x;\eta_i),\, \sigma_i^2\big),

with :math:`\tilde\pi` the gate weights normalised to sum to one: softmax and top-K gates already
do; **sigmoid gates are divided by their sum over experts**,
:math:`\tilde\pi_i = \sigma(\ell_i)/\sum_j\sigma(\ell_j)` (the choice of
:func:`moestat.gates.log_mixture_weights`; an unnormalised sigmoid gate is not a mixture density).

Two estimators, both batched over replicates x restarts in one tensor program:

* ``method="em"`` — EM with closed-form expert/variance updates and an IRLS gate step
  (:mod:`moestat.fit.em`) for the softmax gate, or a damped Newton gate step with autograd derivatives (a
  generalised EM step, :func:`moestat.fit.em.gradient_gate_step`) for every other gate: those not affine in x
  (``laplace``, ``cosine``, ``perturbed_cosine``, ``quadratic``, ``gaussian``, ``activation``) and ``sigmoid``,
  ``normalized_sigmoid`` and ``topk`` (top-K: each observation's selected set held at the current parameters in
  the step's derivatives, as in the gradient path below; the line search compares true objectives); linear or
  constant experts;
* ``method="gradient"`` — direct maximisation of the log-likelihood by L-BFGS (torch autograd; the closed-form
  gradient of :class:`moestat.fit._glm_objective.GLMMixtureObjective` for a plain softmax gate with linear or
  constant Gaussian, Poisson or binomial experts) for every gate of :data:`moestat.gates.GATES` and every expert
  family; every (replicate, restart) pair has its own
  L-BFGS memory and backtracking line search (:func:`moestat.fit._optim.lbfgs`, shared with the least-squares
  engine), all in one tensor program.  Gates not affine in x are evaluated by the model's
  :meth:`moestat.MoE.gate_scores` (:func:`log_components`).  Top-K gates are differentiated with each
  observation's selected set held at the evaluation point (the likelihood jumps where the set changes; the line
  search compares true likelihoods); with ``top_k = 1`` the gate gradient is zero almost everywhere, so the gate
  cannot move from its start.

The free terms of each gate (what its invariance holds fixed on the last expert; the cosine gate's directions as
angles) are those of :class:`moestat.fit._layout.ParamLayout`; docs/gates.md tabulates them.

``learn_temperature=True`` fits the gate temperature :math:`\tau` jointly with the other parameters, as
:math:`\log\tau` (the last gate term of the layout, ``gate:log_temperature``; Nguyen, Akbarian & Ho, ICML 2024),
on the gradient path only; it is refused for gates whose temperature is not identified (every affine gate:
:math:`(c\beta_0, c\beta_1, c\tau)` gives the same weights).  The estimate is ``fit.params.temperature``.

The noise standard deviations are kept above the floor
:math:`\sigma_{\min} = \texttt{sd\_floor}\cdot\mathrm{sd}(y)` (default ``1e-3``), which keeps the
likelihood bounded; fits at the floor are flagged (``MLEFit.at_floor``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from .._torch import cpu_threads, resolve_device, resolve_dtype, to_tensor
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
    check_int,
    input_scale,
    validate_arguments,
)
from ..exceptions import MoestatWarning, UnderdeterminedWarning, warn_user
from ..families import initial_beta, irls_weighted
from ..model import MoE, tempered
from ..params import Params
from . import _native
from ._glm_objective import GLMMixtureObjective, direct_glm, native_mixture
from ._layout import BlockParams, ParamLayout, check_learn_temperature
from ._memory import memory_bytes
from ._optim import CONVERGED, AnalyticProblem, ClosureProblem, lbfgs
from .em import NATIVE_FAMILIES, design, em_fit, glm_density_constant, native_applies, weighted_ls
from .formula_fit import formula_inputs
from .results import MLEFit, log_joint

METHODS = ("em", "gradient")
#: Gates ``method="em"`` fits: the softmax gate with its IRLS gate step, every other gate with a gradient
#: (damped Newton) gate step (:func:`moestat.fit.em.gradient_gate_step`).
EM_GATES = ("softmax", "laplace", "cosine", "perturbed_cosine", "quadratic", "gaussian", "sigmoid",
            "normalized_sigmoid", "topk", "activation")
#: Gates whose scores use every input column (a zero slope does not drop a column from a distance or a norm).
_ALL_COLUMN_GATES = ("laplace", "cosine", "perturbed_cosine")


def _check_data(spec: MoE, X, y, underdetermined: str = "raise", layout: ParamLayout | None = None,
                trials: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
    X, y = as_numeric("X", X), as_numeric("y", y)
    Xn = np.array(X.detach().cpu().numpy() if isinstance(X, torch.Tensor) else X, dtype=np.float64)
    yn = np.array(y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else y, dtype=np.float64)
    single = Xn.ndim == 2
    if Xn.ndim == 1:
        raise ValueError(f"X must have shape (n, d) or (R, n, d), got shape {Xn.shape}; "
                         "for one covariate pass X.reshape(-1, 1).")
    if Xn.ndim not in (2, 3):
        raise ValueError(f"X must have shape (n, d) or (R, n, d), got shape {Xn.shape}.")
    if single:
        Xn = Xn[None]
        yn = yn[None] if yn.ndim == 1 else yn
    if yn.shape != Xn.shape[:2]:
        raise ValueError(f"y has shape {np.shape(y)} but X has shape {np.shape(X)}; "
                         "y must have shape X.shape[:-1].")
    if Xn.shape[-1] != spec.d:
        raise ValueError(f"X has {Xn.shape[-1]} columns but spec.d={spec.d}; build the spec with d=X.shape[-1].")
    for name, a in (("X", Xn), ("y", yn)):
        if not np.isfinite(a).all():
            raise ValueError(f"{name} contains NaN or infinite values; remove or impute those rows before fitting.")
    n = Xn.shape[1]
    if n == 0:
        raise ValueError("X has no observations (n = 0).")
    if spec.k > n:
        raise ValueError(f"k={spec.k} experts exceed the n={n} observations; choose k <= n.")
    P = (layout or ParamLayout(spec)).size
    if n < P and underdetermined == "warn":
        warn_user(f"n={n} observations are fewer than the {P} free parameters: the MLE is not identified "
                      "(estimates are one maximiser among many; standard errors are not available).",
                      UnderdeterminedWarning)
    elif n < P:
        raise ValueError(f"n={n} observations are fewer than the {P} free parameters of a {spec.k}-expert "
                         f"{spec.gate}/{spec.expert} MoE in d={spec.d}; the MLE is not identified. "
                         "Use fewer experts or more data.")
    sd = yn.std(axis=1)
    if not spec.has_noise_sd:
        spec.glm.check_response(yn, trials)
    elif (sd <= 1e-12 * (1.0 + np.abs(yn).max(axis=1))).any():
        raise ValueError("y is constant (zero variance) in at least one replicate; a Gaussian MoE cannot be "
                         "fitted to a constant response.")
    if spec.family.input_dependent:  # an offset column is not estimated: it may be constant or repeat a covariate
        off = None if layout is None else layout.offset_column
        Z = np.concatenate([np.ones((*Xn.shape[:2], 1)), np.delete(Xn, off, axis=-1) if off is not None else Xn],
                           axis=-1)
        sv = np.linalg.svd(Z, compute_uv=False)
        if (sv[:, -1] <= 1e-10 * sv[:, 0]).any():
            raise ValueError("X is rank deficient: with the intercept, some column is constant or collinear with "
                             "others, so every expert's design (1, X) is singular. Drop that column "
                             "(experts and gate already have an intercept).")
    return Xn, yn, single


def _as_init_list(init, spec: MoE, R: int) -> list[Params]:
    if isinstance(init, str):
        check_choice("init", init, ("random",))
        return []
    items = [init] if isinstance(init, Params) else list(init)
    out = []
    for p in items:
        if not isinstance(p, Params):
            raise TypeError(f"init must be 'random', a Params or a list of Params, got {type(p).__name__}.")
        spec.check_params(p)
        if p.is_batched and p.n_reps != R:
            raise ValueError(f"init Params has R={p.n_reps} replicates but the data has R={R}.")
        if p.noise_sd is None:
            import dataclasses

            p = dataclasses.replace(p, noise_sd=np.full(p.gate_bias.shape, spec.noise_sd if spec.has_noise_sd
                                                        else 1.0))
        out.append(p.numpy().batched(R) if not p.is_batched else p.numpy())
    return out


def start_subsets(seeds: Sequence[np.random.SeedSequence], S: int, k: int, m: int, n: int) -> np.ndarray:
    """The observations each random start's experts are fitted through, (R, S, k, m) indices in ``range(n)``.

    Replicate ``r`` draws all its starts at once from its own stream ``seeds[r]`` (one call of
    ``Generator.integers``), so the subsets do not depend on how the starts are later split into blocks.
    """
    return np.stack([np.random.default_rng(s).integers(0, n, size=(S, k, m)) for s in seeds])


def subset_size(spec: MoE, expert_columns: Sequence[int] | None, d: int, n: int) -> int:
    """``m = min(p + 1, n)`` observations per expert of a random start (``p`` the experts' design columns)."""
    p = (d if expert_columns is None else len(list(expert_columns))) if spec.family.input_dependent else 0
    return min(p + 2, n)


def subset_starts(spec: MoE, X: torch.Tensor, y: torch.Tensor, idx: np.ndarray,
                  expert_columns: Sequence[int] | None = None, trials: torch.Tensor | None = None,
                  offset_column: int | None = None, native: bool = False) -> BlockParams:
    r"""Starts fitted through the random subsets ``idx`` (R, S, k, m) of the data X (R, n, d): shape (R, S, ...).

    Each expert is the least-squares fit through its ``m`` observations (weight 1, every other observation weight
    :math:`0.01\,m/n`), with :math:`\sigma_i^2` its mean squared residual over all data and an equal-weight gate
    (all gate coefficients 0; the activation gate's intercepts all 0.5, :data:`_EQUAL_WEIGHT_INTERCEPT`); GLM
    experts take a few ridge IRLS steps instead (a subset of ``p + 1`` points may separate).  An ``offset_column``
    enters every expert's linear predictor with coefficient 1 (Gaussian experts: the fit of :math:`y - o`).
    ``native``: the GLM experts' IRLS runs in the C++ extension of :func:`moestat.fit.em.em_fit`'s ``native`` loop
    (the same steps, one lane at a time; :func:`moestat.fit._native.load_em`).  Arguments as :func:`random_starts`.
    """
    R, n, d = X.shape
    S, k, m = idx.shape[1:]
    cols = list(range(d)) if expert_columns is None else list(expert_columns)
    Z = design(X[..., cols], spec.family.input_dependent)
    p = Z.shape[-1]
    w = torch.full((R, S, k, n), 0.01 * m / n, dtype=X.dtype, device=X.device)
    w.scatter_(-1, torch.as_tensor(idx, device=X.device), 1.0)
    w = w.transpose(-1, -2)
    off = None if offset_column is None else X[..., offset_column]
    if spec.has_noise_sd:
        yo = y if off is None else y - off
        beta = weighted_ls(Z, yo, w, torch.zeros(R, S, k, p, dtype=X.dtype, device=X.device), 1e-10)
        mu = torch.einsum("rnp,rskp->rsnk", Z, beta)
        var = ((yo[:, None, :, None] - mu) ** 2).mean(-2)
    else:  # GLM experts: a few IRLS steps on the subset weights (ridge: a subset of p + 1 points may separate)
        o4 = None if off is None else off[:, None, :, None]
        beta = initial_beta(Z, y, w, spec.glm, ridge=1e-6, trials=trials, offset=o4)
        kernel = _native.load_em() if native and Z.device.type == "cpu" and Z.dtype == torch.float64 else None
        if kernel is not None:
            none = y.new_empty(0)
            beta = kernel.irls(Z, y, w, beta, NATIVE_FAMILIES[spec.glm.name], 10, 1e-10, 1e-6, 0.0,
                               none if trials is None else trials, none if off is None else off)
        else:
            beta = irls_weighted(Z, y, w, beta, spec.glm, max_iter=10, ridge=1e-6, trials=trials, offset=o4)
        var = torch.ones(R, S, k, dtype=X.dtype, device=X.device)
    gb = torch.full((R, S, k), _EQUAL_WEIGHT_INTERCEPT.get(spec.gate, 0.0), dtype=X.dtype, device=X.device)
    ew = torch.zeros(R, S, k, d, dtype=X.dtype, device=X.device)
    if spec.family.input_dependent:
        ew[..., cols] = beta[..., 1:]
    if offset_column is not None:
        ew[..., offset_column] = 1.0
    return BlockParams(gb, torch.zeros(R, S, k, d, dtype=X.dtype, device=X.device), ew, beta[..., 0], var.sqrt())


#: The common gate intercept of a random start's equal-weight gate, where 0 will not do.  The activation gate's
#: scores are odd, tanh(-z) = -tanh(z): with k = 2 the rows (b_0, w_0), (b_1, w_1) and (-b_1, -w_1), (-b_0, -w_0)
#: give the same weights, and the set (b_1, w_1) = -(b_0, w_0) of that symmetry, where the information is singular,
#: is never left by a gradient path started on it, as an all-zero gate is; equal intercepts 0.5 lie off it.
_EQUAL_WEIGHT_INTERCEPT = {"activation": 0.5}


def random_starts(spec: MoE, X: torch.Tensor, y: torch.Tensor, S: int,
                  seeds: Sequence[np.random.SeedSequence], expert_columns: Sequence[int] | None = None,
                  trials: torch.Tensor | None = None) -> BlockParams:
    r"""Random-subset starts, shape (R, S, ...).

    Each expert of each start is the least-squares fit through ``p + 1`` random observations
    (``p = d + 1``; weight 1, every other observation weight :math:`0.01\,(p+1)/n`), with
    :math:`\sigma_i^2` its mean squared residual over all data and an equal-weight gate (all gate
    coefficients 0).  Replicate ``r`` draws from its own stream ``seeds[r]``, so adding
    replicates never changes earlier replicates' starts.  ``expert_columns`` are all the columns of the experts'
    linear predictor (shared ones included: each expert gets its own slope there, which the fit's layout then
    projects onto the constraint by averaging); ``trials`` are binomial trials (R, n).
    (:func:`start_subsets` draws the subsets, :func:`subset_starts` fits through them.)
    """
    _, n, d = X.shape
    idx = start_subsets(seeds, S, spec.k, subset_size(spec, expert_columns, d, n), n)
    return subset_starts(spec, X, y, idx, expert_columns, trials)


def log_components(spec: MoE, p: BlockParams, Zt: torch.Tensor, y: torch.Tensor,
                   trials: torch.Tensor | None = None) -> torch.Tensor:
    r""":math:`\log\tilde\pi_i(x_t) + \log\mathcal N(y_t; h_i(x_t), \sigma_i^2)` in the (A, k, n) layout.

    The same quantity as :meth:`moestat.MoE.log_density_components` (which returns (..., n, k)), for A
    flat problems with their own data: ``Zt`` (A, d+1, n) is the transposed design :math:`(1, x_t)`,
    ``y`` (A, n), and the blocks ``p`` have leading axis A.  Experts sit on axis 1 and observations
    last, so the softmax/log-sum-exp reductions over experts run along a strided axis (several times
    faster on CPU than over a short last axis) and logits and expert pre-activations are batched
    matrix products.  ``trials`` (A, n): binomial trials (:func:`moestat.fit.results.log_joint`).  Gates whose
    scores are not affine in x (``Gate.input_affine`` false) get their scores from :meth:`moestat.MoE.gate_scores`
    at the inputs ``Zt[:, 1:]``; the model's :meth:`moestat.MoE.log_joint_from_linear` then applies every gate's
    normalisation.
    """
    logits, pre = _linear_parts(spec, p, Zt)
    return log_joint(spec, logits, pre, y.unsqueeze(1), p.noise_sd.unsqueeze(-1),
                     None if trials is None else trials.unsqueeze(1))


def _linear_parts(spec: MoE, p: BlockParams, Zt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate scores (A, k, n) and expert pre-activations (A, k, n) or (A, k, 1) of :func:`log_components`."""
    if spec.gating.input_affine:
        logits = torch.bmm(torch.cat([p.gate_bias.unsqueeze(-1), p.gate_weight], dim=-1), Zt)
    else:  # the gate's own scores (distances, cosines, ...), from the model
        logits = spec.gate_scores(Zt[:, 1:].transpose(1, 2), p.gate_weight, p.gate_bias).transpose(1, 2)
    logits = tempered(logits, p.temperature, spec.temperature)  # a learned temperature (A,), else unchanged
    if spec.family.input_dependent:
        pre = torch.bmm(torch.cat([p.expert_bias.unsqueeze(-1), p.expert_weight], dim=-1), Zt)
    else:
        pre = p.expert_bias.unsqueeze(-1)
    return logits, pre


def gradient_fit(spec: MoE, X: torch.Tensor, y: torch.Tensor, init: BlockParams, layout: ParamLayout, *,
                 sd_floor: torch.Tensor, max_iter: int, gtol: float, ftol: float,
                 weights: torch.Tensor | None = None, trials: torch.Tensor | None = None,
                 callback: Callable[[int], None] | None = None, native: bool = False
                 ) -> tuple[BlockParams, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Batched L-BFGS on :math:`-\ell_{rs}(\theta_{rs})/n` for every pair; returns params, loglik, converged, n_iter.

    The noise sd is parameterised as :math:`\sigma = (\sigma_{\min}^2 + e^{2\rho})^{1/2}` so the floor
    holds throughout.  A pair is converged when :math:`\max_j|\partial(\ell/n)/\partial\theta_j| \le`
    ``gtol``, or when a step lowers :math:`-\ell/n` by at most ``ftol`` relative; every pair has its own
    L-BFGS memory and line search, and converged pairs leave the active set
    (:func:`moestat.fit._optim.lbfgs`, the optimiser of the least-squares engine).  ``callback(n_active)``, if
    given, is called at every evaluation with the number of pairs still iterating (the progress bar).  Softmax-gated
    linear Gaussian, Poisson and binomial experts take the closed-form value and gradient of
    :class:`moestat.fit._glm_objective.GLMMixtureObjective` on the packed vector; every other model, autograd
    through :func:`log_components`.  ``native=True`` (``fit_mle(compile=True)``): where
    :func:`~moestat.fit._glm_objective.native_mixture` holds, on a CPU in float64, each pair's whole run is one C++
    loop (``_mle_lbfgs_native.cpp``: the same objective with its closed-form gradient, Gaussian experts included,
    and the same L-BFGS steps and stops; results agree with the tensor loop to rounding); ``callback`` is then called
    once, at the end.
    """
    R, n, _ = X.shape
    k = spec.k
    S = init.gate_bias.shape[1]
    rep_of = torch.arange(R * S, device=X.device) // S
    floor2 = (sd_floor**2).repeat_interleave(S)[:, None]
    theta0 = layout.pack(init)
    if layout.dispersion:
        sd0 = init.noise_sd.clamp_min(1.01 * sd_floor[:, None, None])
        rho0 = 0.5 * torch.log(sd0**2 - (sd_floor**2)[:, None, None])
        v0 = torch.cat([theta0[..., :-k], rho0], dim=-1).detach().reshape(R * S, -1)
    else:  # GLM experts: no noise sd
        v0 = theta0.detach().reshape(R * S, -1)
    Zt = design(X, True).transpose(1, 2)
    B = R * S
    # one extra "pacer" problem, -sum(v), which never converges while a real pair runs, so L-BFGS never works on a
    # batch of one: torch's batch-of-one products take other BLAS kernels than batched ones, and a pair's arithmetic
    # would depend on whether it happened to be the last of its batch (and so on its block)
    v0 = torch.cat([v0, torch.zeros_like(v0[:1])])
    cache: dict[str, Any] = {}
    direct = direct_glm(spec, layout)
    columns = design_rows(layout)

    def unpack(v: torch.Tensor, fl2: torch.Tensor) -> BlockParams:
        p = layout.unpack(v)
        if not layout.dispersion:
            return p
        p.noise_sd = torch.sqrt(fl2 + torch.exp(2 * v[..., -k:]))
        return p

    def refresh(rows: torch.Tensor) -> int:
        """Gather the active pairs' data once per active set; returns how many real pairs are active."""
        if cache.get("rows") is not rows:
            real = rows[:-1] if int(rows[-1]) == B else rows
            r = rep_of[real]
            cache.update(rows=rows, n_real=int(real.numel()), Zt=Zt[r], y=y[r], fl2=floor2[real],
                         w=None if weights is None else weights[r], m=None if trials is None else trials[r])
            if direct:
                Zr = cache["Zt"]
                cache["objective"] = GLMMixtureObjective(
                    Zr[:, columns["gate"]], Zr[:, columns["expert"]],
                    Zr[:, columns["shared"]] if columns["shared"] else None, cache["y"], cache["m"], cache["w"],
                    spec.response, k, n, None if layout.offset_column is None else Zr[:, 1 + layout.offset_column],
                    cache["fl2"] if layout.dispersion else None)
            if callback is not None:
                callback(cache["n_real"])
        return cache["n_real"]

    def pacer(v: torch.Tensor) -> torch.Tensor:
        # the pacer alone: a flat objective far below its linear one, so the first trial step is accepted and the
        # zero gradient stops it at the next check (a flat 0 could sit above the pacer's value and cost every
        # backtracking step of the line search, about 30 evaluations)
        return v.sum(-1) * 0.0 - 0.5 * torch.finfo(v.dtype).max

    def negll(v: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        a = refresh(rows)
        if a == 0:
            return pacer(v)
        logc = log_components(spec, unpack(v[:a], cache["fl2"]), cache["Zt"], cache["y"], cache["m"])
        lse = torch.logsumexp(logc, dim=1)
        out = -(lse if cache["w"] is None else lse * cache["w"]).sum(-1) / n
        return out if a == v.shape[0] else torch.cat([out, -v[a:].sum(-1)])

    def negll_grad(v: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = refresh(rows)
        if a == 0:
            return pacer(v), torch.zeros_like(v)
        out, grad = cache["objective"](v[:a])
        if a == v.shape[0]:
            return out, grad
        return torch.cat([out, -v[a:].sum(-1)]), torch.cat([grad, -torch.ones_like(v[a:])])

    kernel = (_native.load_em() if native and native_mixture(spec, layout) and X.device.type == "cpu"
              and X.dtype == torch.float64 else None)
    if kernel is not None:
        data = native_mixture_data(spec, layout, Zt[rep_of], y[rep_of], None if weights is None else weights[rep_of],
                                   None if trials is None else trials[rep_of])
        v, loss, _, n_it, status, _ = kernel.lbfgs_softmax(v0[:B], *data, floor2[:, 0], NATIVE_FAMILIES[spec.response],
                                                           k, max_iter, ftol, gtol, 20, 30, 1e-4)
        if callback is not None:
            callback(0)
        ll = (-loss * n).reshape(R, S)
        conv = torch.isin(status, torch.tensor(CONVERGED)).reshape(R, S) & torch.isfinite(ll)
        p = unpack(v, floor2).map(lambda a: a.reshape(R, S, *a.shape[1:]))
        return p, ll, conv, n_it.reshape(R, S)
    problem = AnalyticProblem(negll_grad, B + 1, X.device) if direct else ClosureProblem(negll, B + 1, X.device)
    res = lbfgs(problem, v0, max_iter=max_iter, tol=ftol, gtol=gtol, memory=20)
    ll = (-res.loss[:B] * n).reshape(R, S)
    conv = res.converged[:B].reshape(R, S) & torch.isfinite(ll)
    p = unpack(res.theta[:B], floor2).map(lambda a: a.detach().reshape(R, S, *a.shape[1:]))
    return p, ll, conv, res.n_iter[:B].reshape(R, S)


def design_rows(layout: ParamLayout) -> dict[str, list[int]]:
    """The rows of the transposed design :math:`(1, x_t)` that the gate, the experts and the shared slopes use."""
    return {"gate": [0, *(1 + c for c in layout.gate_columns)],
            "expert": [0, *(1 + c for c in layout.expert_columns)] if layout.expert_slopes else [0],
            "shared": [1 + c for c in layout.shared_columns]}


def native_mixture_data(spec: MoE, layout: ParamLayout, Zt: torch.Tensor, y: torch.Tensor,
                        weights: torch.Tensor | None, trials: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The data arguments of the C++ L-BFGS (``lbfgs_softmax`` and ``mixture_value_grad`` of
    :func:`moestat.fit._native.load_em`) for problems with their own data: transposed design ``Zt`` (A, d+1, n),
    ``y``, ``weights``, ``trials`` (A, n); absent parts as empty tensors."""
    rows, none = design_rows(layout), y.new_empty(0)
    constant = none if layout.dispersion else glm_density_constant(spec, y, trials)
    return (y, none if weights is None else weights, Zt[:, rows["gate"]], Zt[:, rows["expert"]],
            Zt[:, rows["shared"]] if rows["shared"] else none, none if trials is None else trials,
            none if layout.offset_column is None else Zt[:, 1 + layout.offset_column], constant)


# ------------------------------------------------------------------------------------------ memory budget
#: ``fit_mle``'s default ``memory_budget``: 10^9 bytes.
MEMORY_BUDGET = "1GB"


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    r"""Estimated memory of a ``fit_mle`` call, in bytes, for sizing its blocks of (replicate, restart) problems.

    A block of :math:`A` problems of :math:`n` observations holds about :math:`A\,n\,b` bytes, with :math:`b` the
    bytes per observation and problem of the phase (``em``: the random starts and EM; ``lbfgs``: the L-BFGS
    iterations, of ``method="gradient"`` or of the slow EM starts), counted in float64 words (``itemsize``
    bytes each) from the arrays the phase keeps per observation of each problem (:func:`moestat.fit.em.em_fit`,
    :func:`gradient_fit`), with a margin of 20-25 %, checked against the peak of live torch allocations (the
    estimate was 1.2-2.4x the measured growth per problem for EM and 1.3-1.5x for L-BFGS at d = 1-8, k = 2-5,
    softmax gate, linear experts; docs/performance.md).  An estimate, not a guarantee.  ``fixed`` is what the call
    holds whatever the blocks: its float64 copy of the data and the rescaled inputs, :math:`2 R n (d + 1)` words.
    """

    em: float
    lbfgs: float
    fixed: float

    @staticmethod
    def of(spec: MoE, layout: ParamLayout, R: int, n: int, *, weighted: bool, trials: bool,
           itemsize: int = 8) -> MemoryModel:
        d, k = spec.d, spec.k
        pg = len(layout.gate_columns) + 1
        shared = len(layout.shared_columns)
        pe = len(layout.expert_columns) + 1 if spec.family.input_dependent else 1
        extra = int(weighted) + int(trials)
        data = d + 1 + extra  # the block's gathered copy of its problems' data
        # em_fit: response, designs (gate, experts, shared), per-observation outer products z z^T (small p), z y;
        # a pass that drops finished problems from the active set copies them once more
        gram = (pg * pg if pg * pg <= 64 else 0) + (pe * pe if pe != pg and pe * pe <= 64 else 0)
        em_data = 1 + pg + (pe if pe != pg else 0) + shared + gram + pe + extra
        # (k, n) arrays of an iteration (log gate weights, log components, residuals, responsibilities, temporaries),
        # the gate Newton step's (k - 1)^2 weights; without precomputed z z^T the weighted Gram matrices form
        # (m, p, n) products; shared or GLM experts add k p-wide products
        em_work = pg + 12 * k + 2 * (k - 1) ** 2
        if pg * pg > 64:
            em_work += 1.5 * (k - 1) ** 2 * pg + k * pe
        if shared or not spec.has_noise_sd:
            em_work += 2 * k * (pe + shared)
        starts = k * (2 * pe + 3) + pe  # subset weights (k), their weighted design and its broadcast copy, means
        em = 1.2 * (data + max(2 * em_data + em_work, starts))
        # L-BFGS (fitted on the peak of live torch allocations, d = 1-8, k = 2-5): the active problems' design, the
        # log-likelihood's autograd graph and the line search's trial points
        lbfgs = 1.25 * (1 + 3 * pg + 5 * k + 1.5 * k * pe + 2 * shared) + data + extra
        return MemoryModel(em=itemsize * em, lbfgs=itemsize * lbfgs, fixed=itemsize * 2 * R * n * (d + 1 + extra))

    def problems_per_block(self, budget: int | None, n: int, total: int, phase: str) -> int:
        """How many problems of ``n`` observations a block of ``phase`` ("em" or "lbfgs") holds within ``budget``."""
        if budget is None:
            return max(total, 1)
        per = getattr(self, phase) * n
        return int(max(1, min(total, (budget - self.fixed) // per)))

    def check(self, budget: int | None, n: int, method: str) -> None:
        """Warn when even one problem at a time needs more than ``budget``."""
        if budget is None:
            return
        need = self.fixed + n * max(self.lbfgs, self.em if method == "em" else 0.0)
        if need > budget:
            warn_user(f"memory_budget={budget} bytes is below the estimated {need / 1e6:.0f} MB needed for the data "
                      "and one (replicate, restart) problem at a time; fitting one problem at a time anyway. "
                      "Raise memory_budget to silence this.", MoestatWarning)


# ------------------------------------------------------------------------------------------ progress
class _Progress:
    """A tqdm bar over the (replicate, restart) problems of one ``fit_mle`` call, advancing as problems finish.

    ``progress=True`` opens it at once, ``False`` never; ``None`` follows :func:`moestat.bootstrap` and
    :func:`moestat.select_k`: it opens in interactive sessions, when the expected run time (``expected_s``) exceeds
    ``moestat._progress.PROGRESS_AFTER_S`` seconds, at a block boundary where the time so far extrapolated over the
    blocks predicts a longer run, or once the fit has run that long.  The postfix names the phase, block and
    iteration.
    """

    def __init__(self, total: int, progress: bool | None, expected_s: float) -> None:
        from .._progress import PROGRESS_AFTER_S, _interactive

        self.total, self.auto, self.after = total, progress is None, PROGRESS_AFTER_S
        self.done, self.phase, self.t0, self.bar = 0, "", time.perf_counter(), None
        if progress or (self.auto and (_interactive() or expected_s > self.after)):
            self._open()

    def _open(self) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, initial=self.done, desc="fit_mle", leave=False,
                        bar_format="{desc}: {n_fmt}/{total_fmt} problems done |{bar:10}| {elapsed} elapsed{postfix}")

    def update(self, done: int, phase: str) -> None:
        """``done`` problems are finished; the fit is now in ``phase``."""
        done = max(done, self.done)
        if self.bar is None and self.due():
            self.done = done
            self._open()
        if self.bar is not None:
            if phase != self.phase:
                self.bar.set_postfix_str(phase, refresh=False)
            self.bar.update(done - self.done)
        self.done, self.phase = done, phase

    def due(self) -> bool:
        """Under ``progress=None``: whether the fit has run long enough for the bar to open."""
        return self.auto and time.perf_counter() - self.t0 > self.after

    def block_done(self, done: int, blocks: int) -> None:
        """``done`` of ``blocks`` blocks of the current phase have run: open the bar if they predict a long run."""
        if self.bar is None and self.auto and done < blocks:
            if (time.perf_counter() - self.t0) * blocks / done > self.after:
                self._open()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# ------------------------------------------------------------------------------------------ blocks of problems
@dataclasses.dataclass
class _Problems:
    """The (replicate, restart) problems of one ``fit_mle`` call, flat: problem ``q = r S + s`` is start ``s`` of
    replicate ``r``; the first ``U`` starts are the user's (``user``, (R, U, ...)), the others random (``subsets``,
    (R, S - U, k, m), :func:`start_subsets`).  ``X`` is on the fitting scale."""

    X: torch.Tensor
    y: torch.Tensor
    floor: torch.Tensor
    weights: torch.Tensor | None
    trials: torch.Tensor | None
    user: BlockParams | None
    subsets: np.ndarray | None
    S: int
    native: bool = False  # fit_mle(compile=True): EM and the GLM starts' IRLS in the C++ extension

    @property
    def R(self) -> int:
        return int(self.X.shape[0])

    def data(self, q: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                                           torch.Tensor | None]:
        """Each problem's own copy of its replicate's data: X (A, n, d), y, floor, weights, trials."""
        r = torch.as_tensor(q // self.S, device=self.X.device)
        return (self.X[r], self.y[r], self.floor[r], None if self.weights is None else self.weights[r],
                None if self.trials is None else self.trials[r])

    def starts(self, spec: MoE, layout: ParamLayout, q: np.ndarray, X: torch.Tensor, y: torch.Tensor,
               trials: torch.Tensor | None) -> BlockParams:
        """The starting values of problems ``q`` (A, 1, ...), from their gathered data ``X``, ``y``."""
        r, s = q // self.S, q % self.S
        U = 0 if self.user is None else int(self.user.gate_bias.shape[1])
        mine, rand = np.flatnonzero(s < U), np.flatnonzero(s >= U)
        parts = []
        if mine.size and self.user is not None:
            ru, su = (torch.as_tensor(a, device=X.device) for a in (r[mine], s[mine]))
            parts.append((mine, self.user.map(lambda a: a[ru, su].unsqueeze(1))))
        if rand.size and self.subsets is not None:
            sel = torch.as_tensor(rand, device=X.device)
            idx = self.subsets[r[rand], s[rand] - U][:, None]
            parts.append((rand, subset_starts(spec, X[sel], y[sel], idx, layout.expert_design_columns,
                                              None if trials is None else trials[sel], layout.offset_column,
                                              native=self.native)))
        if layout.learn_temperature:  # starts without a temperature start at the spec's
            for _, b in parts:
                if b.temperature is None:
                    b.temperature = torch.full(b.gate_bias.shape[:2], float(spec.temperature), dtype=X.dtype,
                                               device=X.device)
        if len(parts) == 1:
            out = parts[0][1]
        else:
            out = parts[0][1].map(lambda a: a.new_empty((q.size, *a.shape[1:])))
            for rows, b in parts:
                at = torch.as_tensor(rows, device=X.device)
                for f in _fields(b):
                    getattr(out, f)[at] = getattr(b, f)
        out.noise_sd = out.noise_sd.clamp_min(self.floor[torch.as_tensor(r, device=X.device)][:, None, None])
        return out


_FIELDS = ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd")


def _fields(p: BlockParams) -> tuple[str, ...]:
    """The blocks of ``p`` that are set: :data:`_FIELDS` and, for a learned temperature, ``temperature``."""
    return _FIELDS if p.temperature is None else (*_FIELDS, "temperature")


@dataclasses.dataclass
class _Flat:
    """Results of every problem, flat (Q = R S): parameters (Q, ...), loglik, converged, n_iter, EM history."""

    params: BlockParams
    loglik: torch.Tensor
    converged: torch.Tensor
    n_iter: torch.Tensor
    history: torch.Tensor | None = None

    @staticmethod
    def empty(spec: MoE, Q: int, X: torch.Tensor, learn_temperature: bool = False) -> _Flat:
        k, d, dt, dev = spec.k, spec.d, X.dtype, X.device
        return _Flat(BlockParams(torch.zeros(Q, k, dtype=dt, device=dev), torch.zeros(Q, k, d, dtype=dt, device=dev),
                                 torch.zeros(Q, k, d, dtype=dt, device=dev), torch.zeros(Q, k, dtype=dt, device=dev),
                                 torch.zeros(Q, k, dtype=dt, device=dev),
                                 torch.ones(Q, dtype=dt, device=dev) if learn_temperature else None),
                     torch.full((Q,), -torch.inf, dtype=dt, device=dev), torch.zeros(Q, dtype=torch.bool, device=dev),
                     torch.zeros(Q, dtype=torch.long, device=dev))

    def put(self, q: torch.Tensor, p: BlockParams, ll: torch.Tensor, conv: torch.Tensor, n_iter: torch.Tensor) -> None:
        """Store the (A, 1, ...) results of problems ``q``."""
        for f in _fields(self.params):
            getattr(self.params, f)[q] = getattr(p, f)[:, 0]
        self.loglik[q], self.converged[q], self.n_iter[q] = ll[:, 0], conv[:, 0], n_iter[:, 0]

    def per_replicate(self, R: int, S: int) -> tuple[BlockParams, torch.Tensor, torch.Tensor, torch.Tensor,
                                                     torch.Tensor | None]:
        """(params, loglik, converged, n_iter, history) with leading axes (R, S) ((T, R, S) for the history)."""
        return (self.params.map(lambda a: a.reshape(R, S, *a.shape[1:])), self.loglik.reshape(R, S),
                self.converged.reshape(R, S), self.n_iter.reshape(R, S),
                None if self.history is None else self.history.reshape(-1, R, S))


def _cat_temperatures(temps: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The user starts' temperatures (R, U) side by side, or None where no start has one (a start without one gets
    the spec's later, :meth:`_Problems.starts`)."""
    if all(t is None for t in temps):
        return None
    if any(t is None for t in temps):
        raise ValueError("init lists Params with and without a temperature; give every start a temperature, or none.")
    return torch.cat(temps, dim=1)  # type: ignore[arg-type]


def _ranges(q: np.ndarray, size: int) -> list[np.ndarray]:
    """``q`` cut into consecutive blocks of at most ``size``."""
    return [q[a:a + size] for a in range(0, q.size, size)]


def _pad_history(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate the blocks' EM histories (T_b, A_b) along problems, repeating each block's last row up to the
    longest: a problem that stopped keeps its log-likelihood in later rows, as in one unblocked run."""
    T = max(h.shape[0] for h in parts)
    return torch.cat([torch.cat([h, h[-1:].expand(T - h.shape[0], -1)]) if h.shape[0] < T else h for h in parts],
                     dim=1)


def _em_blocks(spec: MoE, probs: _Problems, layout: ParamLayout, blocks: list[np.ndarray], bar: _Progress, *,
               tol: float, max_iter: int, gate_steps: int, gate_solver: str, finishes: bool) -> _Flat:
    """EM from each block's starts, one block after another (``finishes``: no L-BFGS phase follows)."""
    out = _Flat.empty(spec, probs.R * probs.S, probs.X)
    hist, done = [], 0
    for b, q in enumerate(blocks):
        Xb, yb, fl, wb, mb = probs.data(q)
        init = probs.starts(spec, layout, q, Xb, yb, mb)
        phase = f"EM, block {b + 1}/{len(blocks)}"

        def report(it: int, keep: torch.Tensor, size: int = q.size, phase: str = phase, before: int = done) -> None:
            if bar.bar is not None or bar.due():  # count (a device sync) only for a bar that shows
                bar.update(before + size - int(keep.sum()), f"{phase}, iteration {it}")

        st = em_fit(spec, Xb, yb, init, var_floor=fl**2, tol=tol, max_iter=max_iter, gate_steps=gate_steps,
                    gate_solver=gate_solver, gate_columns=layout.gate_columns, expert_columns=layout.expert_columns,
                    weights=wb, shared_columns=layout.shared_columns, trials=mb, callback=report,
                    layout=layout, offset_column=layout.offset_column, native=probs.native)
        at = torch.as_tensor(q, device=probs.X.device)
        out.put(at, st.params, st.loglik, st.converged, st.n_iter)
        hist.append(st.history[:, :, 0])
        done += q.size if finishes else int(st.converged.sum())
        bar.update(done, phase)
        bar.block_done(b + 1, len(blocks))
        del Xb, yb, init, st
    out.history = _pad_history(hist)
    return out


def _lbfgs_blocks(spec: MoE, probs: _Problems, layout: ParamLayout, blocks: list[np.ndarray], bar: _Progress,
                  out: _Flat | None, done: int, *, max_iter: int, gtol: float, ftol: float) -> _Flat:
    """L-BFGS on each block: from the starts (``out=None``), or continuing ``out``'s problems, of which each keeps the
    L-BFGS end point only if its log-likelihood is at least the one it started from."""
    res = _Flat.empty(spec, probs.R * probs.S, probs.X, layout.learn_temperature) if out is None else out
    for b, q in enumerate(blocks):
        Xb, yb, fl, wb, mb = probs.data(q)
        at = torch.as_tensor(q, device=probs.X.device)
        init = (probs.starts(spec, layout, q, Xb, yb, mb) if out is None
                else res.params.map(lambda a, at=at: a[at][:, None]))
        phase = f"L-BFGS, block {b + 1}/{len(blocks)}"

        def report(active: int, size: int = q.size, phase: str = phase, before: int = done) -> None:
            bar.update(before + size - active, phase)

        p2, ll2, conv2, it2 = gradient_fit(spec, Xb, yb, init, layout, sd_floor=fl, max_iter=max_iter, gtol=gtol,
                                           ftol=ftol, weights=wb, trials=mb, callback=report, native=probs.native)
        if out is None:
            res.put(at, p2, ll2, conv2, it2)
        else:
            better = torch.isfinite(ll2[:, 0]) & (ll2[:, 0] >= res.loglik[at])
            for f in _fields(res.params):
                new, old = getattr(p2, f)[:, 0], getattr(res.params, f)[at]
                getattr(res.params, f)[at] = torch.where(better.reshape(-1, *([1] * (new.dim() - 1))), new, old)
            res.loglik[at] = torch.where(better, ll2[:, 0], res.loglik[at])
            res.converged[at] = conv2[:, 0] & better
            res.n_iter[at] += it2[:, 0]
        done += q.size
        bar.update(done, phase)
        bar.block_done(b + 1, len(blocks))
        del Xb, yb, init, p2
    return res


def _solve(spec: MoE, probs: _Problems, layout: ParamLayout, model: MemoryModel, budget: int | None,
           bar: _Progress, *, method: str, tol: float, max_iter: int, gate_steps: int, gate_solver: str,
           gtol: float, switch_after: int | None, screen: float | None) -> _Flat:
    """EM (then L-BFGS for the slow starts) or L-BFGS from every problem's start, in blocks within ``budget``.

    Problems are independent, so the blocks give the unblocked fit: each problem's arithmetic does not depend on
    which others share its block.  The one step that compares problems, ``screen`` (a start against the best start
    of its replicate), runs between the phases, on every problem's EM end point."""
    n, Q = int(probs.X.shape[1]), probs.R * probs.S
    every = np.arange(Q)
    if method != "em":
        blocks = _ranges(every, model.problems_per_block(budget, n, Q, "lbfgs"))
        return _lbfgs_blocks(spec, probs, layout, blocks, bar, None, 0, max_iter=max_iter, gtol=gtol, ftol=0.01 * tol)
    em_iter = max_iter if switch_after is None else min(max_iter, switch_after)
    blocks = _ranges(every, model.problems_per_block(budget, n, Q, "em"))
    out = _em_blocks(spec, probs, layout, blocks, bar, tol=tol, max_iter=em_iter, gate_steps=gate_steps,
                     gate_solver=gate_solver, finishes=switch_after is None)
    if switch_after is None:
        return out
    ll = out.loglik.reshape(probs.R, probs.S)
    slow = ~out.converged.reshape(probs.R, probs.S) & torch.isfinite(ll)
    if screen is not None:
        best_now = torch.where(torch.isfinite(ll), ll, torch.full_like(ll, -torch.inf)).amax(1, keepdim=True)
        slow &= ll >= best_now - screen
    todo = np.flatnonzero(slow.reshape(-1).cpu().numpy())
    bar.update(Q - todo.size, "L-BFGS")
    if todo.size == 0:
        return out
    blocks = _ranges(todo, model.problems_per_block(budget, n, todo.size, "lbfgs"))
    return _lbfgs_blocks(spec, probs, layout, blocks, bar, out, Q - todo.size, max_iter=max(max_iter - em_iter, 1),
                         gtol=gtol, ftol=0.01 * tol)


@validate_arguments(restarts=Integer(0), tol=Real(0), max_iter=Optional(Integer(1)), sd_floor=Real(0),
                    gate_steps=Integer(1), gtol=Real(0), device=Device(), dtype=Dtype(), seed=Seed(),
                    underdetermined=Choice("raise", "warn"), switch_after=Optional(Integer(0)),
                    screen=Optional(Real(0, open_low=True)), threads=Optional(Integer(1)), progress=Optional(Boolean()),
                    learn_temperature=Boolean(), compile=Boolean())
def fit_mle(spec: MoE | None = None, X=None, y=None, *, formula: str | None = None, data=None, k: int | None = None,
            gate_formula: str | None = None, weights=None, missing: str = "raise",
            gate_columns: Sequence[int] | None = None, expert_columns: Sequence[int] | None = None,
            family: str | None = None, method: str = "em", shared: str | None = None,
            shared_columns: Sequence[int] | None = None, trials=None, learn_temperature: bool = False,
            offset: str | None = None, offset_column: int | None = None,
            restarts: int = 5, init="random", tol: float = 1e-8,
            max_iter: int | None = None, sd_floor: float = 1e-3, gate_solver: str = "newton", gate_steps: int = 1,
            gtol: float = 1e-7, device: str = "auto", dtype=None, seed=None,
            feature_names: Sequence[str] | None = None, underdetermined: str = "raise",
            switch_after: int | None = 30, screen: float | None = 10.0, threads: int | None = 1,
            memory_budget: int | str | None = MEMORY_BUDGET, progress: bool | None = None,
            compile: bool = False) -> MLEFit:
    r"""Maximum-likelihood fit of a Gaussian MoE, batched over replicates and restarts.

    Two interfaces: arrays (``fit_mle(spec, X, y)``) or a formula and a data frame
    (``fit_mle(formula="y ~ x1 + np.log(x2)", data=df, k=2, gate_formula="~ w")``).

    Parameters
    ----------
    spec : MoE, optional
        Gate, expert family, number of experts ``k`` and input dimension ``d``.  With ``formula``, optional: the
        gate, expert family and ``k`` are taken from it (its ``d`` is replaced by the design's), else a softmax gate
        and linear experts with ``k`` experts.
    X : array, shape (n, d) or (R, n, d)
        Inputs; with a leading axis, R independent data sets are fitted in one tensor program.
    y : array, shape (n,) or (R, n)
        A named pandas Series names the response in ``summary()`` (``Dep. Variable``; default ``"y"``).
    formula : str, optional
        A Wilkinson formula for the experts, e.g. ``"y ~ x1 + I(x1**2) + C(group)"`` (:func:`moestat.build_design`,
        formulaic): term names come from the frame and appear in ``param_names``, ``tidy()`` and ``summary()``;
        ``predict`` and friends then take frames and find columns by name.
    data : DataFrame, optional
        The data the formulas read.
    k : int, optional
        Number of experts for a formula fit without ``spec``.
    gate_formula : str, optional
        The gate's own covariates, e.g. ``"~ w1 + w2"`` (concomitant variables, flexmix's ``concomitant=``);
        default: the experts' covariates.  The fit is the MoE on the union of both designs with each block's
        slopes fixed at zero on the other block's columns (:mod:`moestat.fit.formula_fit`).
    weights : array, shape (n,) or (R, n), or a column name with ``formula``, optional
        Case (frequency) weights :math:`c_t \ge 0`: the log-likelihood is :math:`\sum_t c_t\log p(y_t\mid x_t)`,
        so integer weights give the fit of the data with each row repeated :math:`c_t` times (same estimates, same
        observed-information standard errors, ``nobs`` = :math:`\sum_t c_t`).
    missing : {"raise", "drop"}
        Rows with NaN in a variable used: raise (default) or drop them (``settings["n_dropped"]`` says how many).
    family : {"gaussian", "poisson", "binomial"}, optional
        The experts' response distribution (``MoE(response=...)``): Gaussian experts, or GLM experts with the
        canonical link (log for counts, logit for 0/1 responses), fitted by EM with IRLS expert steps or by
        L-BFGS, with observed-information standard errors (:mod:`moestat.families`).  Default: the spec's
        (``"gaussian"``).  Binomial responses are 0/1, or proportions of successes with ``trials``.
    gate_columns, expert_columns : sequence of int, optional
        Array interface: the columns of ``X`` the gate and the experts use (default: all; the experts' default
        leaves out ``shared_columns``); the other block's slopes are fixed at zero.  ``gate_formula`` sets them for a
        formula fit.
    shared : str, optional
        Formula interface: covariates whose coefficient :math:`\gamma` is common to every expert, e.g. ``"~ z"``
        (flexmix's ``FLXMRglmfix(fixed = ~ z)``): expert :math:`j`'s linear predictor is
        :math:`b_j + a_j^\top x + \gamma^\top z`.  EM solves every expert's coefficients and :math:`\gamma`
        jointly (:func:`moestat.fit.em.shared_newton_step`); the gradient path and all standard errors include
        :math:`\gamma`, which appears once in ``tidy()`` (block ``"shared"``, terms ``shared:z``).  Shared columns
        are not gate covariates unless ``gate_formula`` names them.
    shared_columns : sequence of int, optional
        Array interface: the columns of ``X`` with a shared expert coefficient (disjoint from ``expert_columns``).
    trials : array (n,) or (R, n), or a column name with ``formula``, optional
        Binomial experts: the number of trials :math:`m_t` of each row, with ``y`` the *proportion* of successes
        (statsmodels' ``GLM(y, X, Binomial(), var_weights=m)`` convention).  The log-likelihood is the full binomial
        log-pmf, :math:`\log\binom{m_t}{m_ty_t}` included (so it is not the Bernoulli log-likelihood of the rows
        expanded into trials, which lacks that constant).
    offset : str, optional
        Formula interface: a column of ``data`` or an expression of columns (``"np.log(exposure)"``) added to every
        expert's linear predictor with coefficient fixed at 1, :math:`\eta_{ti} = b_i + a_i^\top x_t + o_t`: an
        exposure for Poisson counts (rates per unit of :math:`e^{o_t}`), or a known part of the mean (R's
        ``offset()``, statsmodels' ``offset=``).  It is a column of the fit's inputs (``offset(...)``) with no
        coefficient in :math:`\theta`; ``predict`` and the other methods read it from a new frame by name.
    offset_column : int, optional
        Array interface: the column of ``X`` holding the offset (it is then neither a gate nor an expert column).
    learn_temperature : bool
        Fit the gate temperature :math:`\tau` jointly with the other parameters, as the term
        ``gate:log_temperature`` (:math:`\log\tau`, so :math:`\tau > 0`; starting at ``spec.temperature`` or at an
        ``init`` Params' ``temperature``); the estimate is ``fit.params.temperature``.  Needs ``method="gradient"``
        and a gate whose temperature is identified (``laplace``, ``cosine``, ``activation``:
        :attr:`moestat.gates.Gate.temperature_identified`); for affine gates :math:`(c\beta_0, c\beta_1, c\tau)`
        gives the same model, so it is refused there (Nguyen, Akbarian & Ho, ICML 2024; docs/temperature.md).
        ``False`` (default): the temperature is fixed at ``spec.temperature``, as before.
    method : {"em", "gradient"}
        EM (softmax gate with IRLS, any other gate with a gradient gate step; linear or constant experts) or L-BFGS
        on the log-likelihood (any gate/expert).  The cosine gate needs ``d >= 2`` (its slopes are directions);
        ``gate_columns`` / ``gate_formula`` are refused for the ``laplace``, ``cosine`` and ``perturbed_cosine``
        gates, whose distances and norms use every column.
    restarts : int
        Number of random-subset starts (:func:`random_starts`) per replicate; the start with the
        highest log-likelihood is kept.  ``restarts=0`` uses only ``init``.
    init : "random", Params or list of Params
        Extra starts tried before the random ones (unbatched: shared by all replicates; batched: one per
        replicate), e.g. the truth for a near-truth experiment or a previous fit for a warm start.
    tol : float
        EM stops when :math:`|\ell_t - \ell_{t-1}| \le \mathrm{tol}(1 + |\ell_t|)`; L-BFGS also stops
        when a step raises :math:`\ell` by at most ``0.01 * tol`` relative (besides the ``gtol`` test).
    max_iter : int, optional
        EM iterations (default 2000) or L-BFGS iterations (default 500).
    sd_floor : float
        Variance floor: :math:`\sigma_i \ge \texttt{sd\_floor}\cdot\mathrm{sd}(y)` per replicate.
    gate_solver : {"newton", "cvxpy"}
        EM gate M-step: batched damped Newton/IRLS (default) or the exact cvxpy solve (slow; small problems).
    gate_steps : int
        Newton steps per EM iteration (a generalised EM step; the objective never decreases), IRLS for the softmax
        gate, saddle-free Newton with autograd derivatives for the other gates.
    gtol : float
        L-BFGS gradient tolerance on the per-observation log-likelihood scale.
    device, dtype
        ``"auto"`` picks CUDA when present.  float64 on every device by default (unlike the least-squares
        engine): the log-likelihood sums n terms, EM's stopping rule is relative to it, and standard
        errors need an accurate Hessian.  ``dtype="float32"`` is allowed on GPU for speed.
    seed : int or SeedSequence, optional
        Replicate ``r`` draws its random starts from ``SeedSequence(seed).spawn(R)[r]``.
    feature_names : sequence of str, optional
        Column names used in term names (default: the columns of a DataFrame ``X``, else ``x1 .. xd``); a frame
        passed later to ``predict`` is read by these names, never by position.
    switch_after : int or None
        ``method="em"`` only: (replicate, restart) pairs that have not converged after this many EM
        iterations continue with batched L-BFGS from their EM state (EM converges linearly, and slowly
        near flat or singular optima; quasi-Newton converges superlinearly).  Both phases never lower
        the likelihood (EM ascent; Armijo line search), and the L-BFGS result is kept only if it is at
        least as good.  ``None`` runs pure EM for up to ``max_iter`` iterations (``history`` then covers
        every iteration).
    screen : float or None
        ``method="em"`` with ``switch_after``: at the switch, starts whose log-likelihood is more than
        ``screen`` below the best start of the same replicate are abandoned instead of refined (the
        short-runs strategy of Biernacki, Celeux & Govaert 2003).  Their ``restart_loglik`` is the value
        where they stopped.  ``None`` refines every start.
    underdetermined : {"raise", "warn"}
        What to do when n is smaller than the number of free parameters: raise ``ValueError`` (default)
        or emit :class:`UnderdeterminedWarning` and fit anyway (the estimate is then one maximiser among
        many; the proximal EM terms keep it finite).  :class:`moestat.MoERegressor` uses ``"warn"``.
    threads : int or None
        Torch intra-op threads for the solve on CPU (restored afterwards); ``None`` keeps torch's
        setting.  One thread by default, as :func:`moestat.fit_lse`: the batched problems are small, and
        threads that wait on each other on a shared CPU cost more than they gain.
    memory_budget : int, str or None
        The memory the fit may work in, in bytes or as a string such as ``"2GB"`` or ``"512MiB"`` (default
        ``"1GB"``, :data:`MEMORY_BUDGET`; on a GPU, device memory).  The R x S (replicate, restart) problems are
        independent, so they are fitted in blocks, one after another, of as many problems as the budget holds after
        the data: a block of A problems of n observations takes about :math:`A\,n\,b` bytes, with :math:`b` the
        estimate of :class:`MemoryModel` (about 0.8 KB per observation at d = 4, k = 3 for EM).  The result is the
        same for every budget (each problem's arithmetic does not depend on its block; blocks may split one
        replicate's restarts, and ``screen`` compares every start of a replicate after all blocks have run EM).
        ``None``: one block.  A budget below one problem at a time warns and fits one at a time.
    progress : bool or None
        A tqdm bar counting the problems that have finished, with the phase, block and iteration as postfix.
        ``None`` (the default of :func:`moestat.bootstrap` and :func:`moestat.select_k`) shows it in interactive
        sessions or when the fit is expected (or, once running, predicted) to take more than 10 s.
    compile : bool
        ``True``: on a CPU in float64, EM with a softmax gate and Gaussian, Poisson or binomial experts (Newton
        gate steps; case weights, trials, offsets and shared slopes included) runs in a fused C++ loop, one
        (replicate, restart) pair after another (:func:`moestat.fit.em.em_fit` with ``native=True``): the same
        iterations, stopping rule and acceleration as the tensor loop, with estimates equal to it up to rounding
        (1e-12 on the NPreg fits), 1.4 to 2.5 times faster on whole fits of a few hundred rows.  The L-BFGS phase
        after ``switch_after`` then runs in C++ as well, one loop per start with the closed-form gradient
        (:func:`gradient_fit` with ``native=True``: the same steps, end points equal up to rounding; 7 to 25 times
        faster on fits where that phase dominates).  With ``method="gradient"`` that C++ L-BFGS runs from the
        starts, for a softmax gate affine in the inputs at temperature 1 and at most 64 Gaussian, Poisson or binomial
        experts (``fit.settings["lbfgs_kernel"]`` says which loop ran).  It is compiled by torch's extension builder
        on first use (about 11 s, once per machine and torch version); without a C++ compiler, and for other models,
        devices or dtypes, the tensor loop runs.  ``False`` (default, as :func:`moestat.fit_lse`'s ``compile``): the
        tensor loop, whose results the checked-in vignettes reproduce bit for bit on the same kind of processor
        (docs/studies.md, *Reproducing a result*).  ``fit.settings["em_kernel"]`` says which ran.

    Returns
    -------
    MLEFit
        Estimates, standard errors, tests, information criteria (see :class:`moestat.MLEFit`).  A fit that
        degenerated (a vanishing component, a variance at the floor or collapsed onto tied responses, a separating
        gate direction) warns with :class:`moestat.DegenerateFitWarning` saying which expert, what happened and what
        to do; ``fit.degeneracy()`` lists the findings.

    Raises
    ------
    ValueError
        Non-finite data, ``k > n``, fewer observations than free parameters, constant ``y``, a rank-deficient
        design, or an unsupported method/spec pair.

    Examples
    --------
    >>> import numpy as np, moestat as ms
    >>> spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
    >>> truth = ms.Params([2.0, 0.0], [[4.0], [0.0]], [[1.0], [-1.0]], [0.5, -0.5], noise_sd=[0.2, 0.2])
    >>> data = ms.simulate(spec, truth, n=500, seed=0, model="mixture")
    >>> fit = ms.fit_mle(spec, data.X[0], data.y[0], seed=1)
    >>> fit.summary()  # doctest: +SKIP
    """
    t_start = time.perf_counter()
    check_choice("missing", missing, ("raise", "drop"))
    budget = memory_bytes(memory_budget)
    if feature_names is None and isinstance(X, pd.DataFrame):
        feature_names = [str(c) for c in X.columns]
    y_name = str(y.name) if isinstance(y, pd.Series) and y.name is not None else "y"
    spec, X, y, weights, design, columns, n_dropped = _resolve_inputs(spec, X, y, formula=formula, data=data, k=k,
                                                                      gate_formula=gate_formula, weights=weights,
                                                                      missing=missing, gate_columns=gate_columns,
                                                                      expert_columns=expert_columns, shared=shared,
                                                                      shared_columns=shared_columns, trials=trials,
                                                                      offset=offset, offset_column=offset_column)
    trials_column = trials if design is not None and isinstance(trials, str) else None
    trials = columns[4]
    if design is not None:
        feature_names = columns[0]
    if family is not None:
        if family != spec.response and spec.response != "gaussian":
            raise ValueError(f"family={family!r} disagrees with spec.response={spec.response!r}; pass one of them.")
        spec = dataclasses.replace(spec, response=family)
    check_choice("method", method, METHODS)
    check_choice("gate_solver", gate_solver, ("newton", "cvxpy"))
    restarts = check_int("restarts", restarts, minimum=0)
    gate_steps = check_int("gate_steps", gate_steps)
    if not (tol > 0 and gtol > 0 and sd_floor > 0):
        raise ValueError(f"tol, gtol and sd_floor must be > 0, got tol={tol}, gtol={gtol}, sd_floor={sd_floor}.")
    _check_method(spec, method, gate_solver, columns[1], learn_temperature)
    if columns[5] is not None and spec.gate in _ALL_COLUMN_GATES:
        raise ValueError(f"an offset with gate={spec.gate!r}: this gate's distances and norms read every input column, "
                         "the offset's too. Use a gate affine in x (softmax, sigmoid, ...) or drop the offset.")
    max_iter = check_int("max_iter", max_iter if max_iter is not None else (2000 if method == "em" else 500))
    check_choice("underdetermined", underdetermined, ("raise", "warn"))
    layout = ParamLayout(spec, feature_names, gate_columns=columns[1], expert_columns=columns[2],
                         shared_columns=columns[3], learn_temperature=learn_temperature, offset_column=columns[5])
    m_n = _check_trials(trials, spec, X)
    Xn, yn, single = _check_data(spec, X, y, underdetermined, layout, m_n)
    R = Xn.shape[0]
    w_n = _check_weights(weights, yn)
    m_n = None if m_n is None else np.array(np.broadcast_to(m_n, yn.shape), dtype=np.float64, copy=True)
    user = _as_init_list(init, spec, R)
    if not learn_temperature and any(p.temperature is not None for p in user):
        raise ValueError("init carries a fitted temperature (Params.temperature) but learn_temperature=False fixes "
                         f"the temperature at spec.temperature={spec.temperature}; pass learn_temperature=True (e.g. "
                         "bootstrap(fit, learn_temperature=True) for a fit that learned it), or drop the init's "
                         "temperature (dataclasses.replace(init, temperature=None)).")
    if restarts + len(user) == 0:
        raise ValueError("restarts=0 needs at least one start in init.")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    Xt, yt = to_tensor(Xn, device=dev, dtype=dt), to_tensor(yn, device=dev, dtype=dt)
    # inputs far from unit scale are fitted as X / s and the slopes mapped back (exact: the likelihood is
    # equivariant), so the estimate does not depend on the inputs' units; standard errors are then computed on the
    # user's scale at that estimate
    in_scale = input_scale(Xn) if spec.gating.input_affine else None  # exact only for gates affine in x
    if in_scale is not None and layout.offset_column is not None:
        in_scale[layout.offset_column] = 1.0  # the offset's coefficient is fixed at 1: its column is not rescaled
    s_t = None if in_scale is None else to_tensor(in_scale, device=dev, dtype=dt)
    X_fit = Xt if s_t is None else Xt / s_t
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    seeds = ss.spawn(R)
    w_t = None if w_n is None else to_tensor(w_n, device=dev, dtype=dt)
    m_t = None if m_n is None else to_tensor(m_n, device=dev, dtype=dt)
    floor = to_tensor(sd_floor * yn.std(axis=1) if spec.has_noise_sd else np.zeros(R), device=dev, dtype=dt)
    user_b = None
    if user:
        parts = []
        for p in user:
            b = BlockParams.from_params(p.to_torch(dev, dt)).map(lambda a: a.unsqueeze(1))
            if s_t is not None:
                b.gate_weight, b.expert_weight = b.gate_weight * s_t, b.expert_weight * s_t
            parts.append(b)
        gb, gw, ew, eb, sd = (torch.cat([getattr(b, f) for b in parts], dim=1) for f in _FIELDS)
        user_b = BlockParams(gb, gw, ew, eb, sd, _cat_temperatures([b.temperature for b in parts]))
    S = len(user) + restarts
    subsets = None if not restarts else start_subsets(
        seeds, restarts, spec.k, subset_size(spec, layout.expert_design_columns, spec.d, Xn.shape[1]), Xn.shape[1])
    probs = _Problems(X_fit, yt, floor, w_t, m_t, user_b, subsets, S)
    model = MemoryModel.of(spec, layout, R, Xn.shape[1], weighted=w_t is not None, trials=m_t is not None,
                           itemsize=Xt.element_size())
    model.check(budget, Xn.shape[1], method)
    from .._progress import _expected_seconds

    bar = _Progress(R * S, progress, _expected_seconds(R, S, Xn.shape[1], spec.k, spec.d))
    native = compile and (native_applies(spec, Xt, gate_solver, layout.shared_columns) if method == "em" else
                          native_mixture(spec, layout) and Xt.device.type == "cpu" and Xt.dtype == torch.float64)
    if native and not _native.compiler_available():
        warn_user("compile=True: no C++ compiler (c++, g++ or clang++) on PATH, which the fused EM and L-BFGS loops "
                  "need; the tensor loops run instead (the same estimates up to rounding, slower).", UserWarning)
        native = False
    native = native and _native.load_em() is not None
    probs.native = native
    try:
        with cpu_threads(threads, dev):
            flat = _solve(spec, probs, layout, model, budget, bar, method=method, tol=tol, max_iter=max_iter,
                          gate_steps=gate_steps, gate_solver=gate_solver, gtol=gtol, switch_after=switch_after,
                          screen=screen)
    finally:
        bar.close()
    pb, ll, conv, n_iter, history = flat.per_replicate(R, S)
    ll_safe = torch.where(torch.isfinite(ll), ll, torch.full_like(ll, -torch.inf))
    best = ll_safe.argmax(dim=1)
    r_idx = torch.arange(R, device=dev)
    chosen = pb.map(lambda a: a[r_idx, best])
    if s_t is not None:
        chosen.gate_weight, chosen.expert_weight = chosen.gate_weight / s_t, chosen.expert_weight / s_t
    settings = {"method": method, "restarts": restarts, "n_user_starts": len(user), "tol": tol,
                "max_iter": max_iter, "sd_floor": sd_floor, "gate_solver": gate_solver if method == "em" else None,
                "gate_steps": gate_steps if method == "em" else None, "gtol": gtol,
                "switch_after": switch_after if method == "em" else None, "screen": screen if method == "em" else None,
                "device": str(dev), "dtype": str(dt).replace("torch.", ""), "threads": threads,
                "seed_entropy": ss.entropy, "seed_spawn_key": list(ss.spawn_key),
                "input_scale": None if in_scale is None else ",".join(f"{v:.3g}" for v in in_scale),
                "formula": formula, "gate_formula": gate_formula, "weighted": w_n is not None, "missing": missing,
                "n_dropped": n_dropped, "shared": shared, "trials": m_n is not None, "memory_budget": budget,
                "em_kernel": ("native" if native else "tensor") if method == "em" else None,
                "wall_time": time.perf_counter() - t_start}
    if learn_temperature:  # recorded only when set: fits with a fixed temperature keep their columns
        settings["learn_temperature"] = True
    if compile and method != "em":  # likewise: which L-BFGS loop ran (with EM, em_kernel says it)
        settings["lbfgs_kernel"] = "native" if native else "tensor"
    if columns[5] is not None:  # likewise an offset
        settings["offset"] = offset if design is not None else f"column {columns[5]}"
    fit = MLEFit(spec=spec, layout=layout, X=Xt, y=yt, blocks=chosen, loglik=ll[r_idx, best],
                  converged=conv[r_idx, best], n_iter=n_iter[r_idx, best], restart_loglik=ll.detach(),
                  best_restart=best, sd_floor=floor, single=single, settings=settings,
                  history=None if history is None else history[:, r_idx, best], weights=w_t, design=design,
                  response_name=y_name if design is None else design.response_name, trials=m_t)
    fit.trials_column = trials_column
    fit._warn_degenerate()
    return fit


def _check_method(spec: MoE, method: str, gate_solver: str, gate_columns: Sequence[int] | None,
                  learn_temperature: bool = False) -> None:
    """Refuse the method/spec pairs fit_mle cannot fit (ValueError naming the fix)."""
    check_learn_temperature(spec, learn_temperature)
    if learn_temperature and method == "em":
        raise ValueError("learn_temperature=True fits log(temperature) by L-BFGS on the log-likelihood; the EM gate "
                         "step does not update a temperature. Pass method='gradient'.")
    if method == "em" and (spec.gate not in EM_GATES or spec.expert not in ("linear", "constant")):
        raise ValueError(f"method='em' supports gate={' / '.join(repr(g) for g in EM_GATES)} with expert='linear' "
                         f"or 'constant', not gate={spec.gate!r}, expert={spec.expert!r}; use method='gradient'.")
    if method == "em" and gate_solver == "cvxpy" and spec.gate != "softmax":
        raise ValueError(f"gate_solver='cvxpy' solves the softmax gate's convex M-step; gate={spec.gate!r} takes the "
                         "gradient gate step. Use gate_solver='newton'.")
    if gate_columns is not None and spec.gate in _ALL_COLUMN_GATES and list(gate_columns) != list(range(spec.d)):
        raise ValueError(f"gate={spec.gate!r} measures distances or norms over every input column, so its scores do "
                         f"not ignore a column whose slope is zero; gate_columns={list(gate_columns)} (or a "
                         "gate_formula) is for gates affine in x or in x*x. Drop gate_columns, or pass only the "
                         "gate's columns as X.")


def _resolve_inputs(spec: MoE | None, X: Any, y: Any, *, formula: str | None, data: Any, k: int | None,
                    gate_formula: str | None, weights: Any, missing: str, gate_columns: Sequence[int] | None = None,
                    expert_columns: Sequence[int] | None = None, shared: str | None = None,
                    shared_columns: Sequence[int] | None = None, trials: Any = None, offset: str | None = None,
                    offset_column: int | None = None) -> tuple[MoE, Any, Any, Any, Any, tuple, int]:
    """``(spec, X, y, weights, design, (names, gate_columns, expert_columns, shared_columns, trials, offset_column),
    n_dropped)`` for either interface."""
    if formula is None:
        _check_no_offset(offset)
        if isinstance(trials, str):
            raise TypeError(f"trials={trials!r} names a column, which needs formula= and data=; with arrays pass "
                            "the numbers of trials as an array.")
        for name, value in (("data", data), ("gate_formula", gate_formula), ("shared", shared)):
            if value is not None:
                raise TypeError(f"{name}= needs formula=; with arrays pass fit_mle(spec, X, y).")
        if not isinstance(spec, MoE):
            raise TypeError(f"spec must be a moestat.MoE, got {type(spec).__name__}; or fit by formula: "
                            "fit_mle(formula='y ~ x', data=df, k=2).")
        if X is None or y is None:
            raise TypeError("fit_mle needs X and y (or formula= and data=).")
        if k is not None and k != spec.k:
            raise ValueError(f"k={k} disagrees with spec.k={spec.k}; pass one of them.")
        if missing == "drop" and trials is not None:
            raise TypeError("missing='drop' with trials= is for formula fits; drop the rows with missing values from "
                            "X, y and trials yourself.")
        X, y, weights, n_dropped = _drop_missing(X, y, weights, missing)
        return (spec, X, y, weights, None, (None, gate_columns, expert_columns, shared_columns, trials, offset_column),
                n_dropped)
    if offset_column is not None:
        raise TypeError("offset_column= is for arrays; a formula fit names its offset with offset='column' or "
                        "offset='np.log(exposure)'.")
    if gate_columns is not None or expert_columns is not None or shared_columns is not None:
        raise TypeError("gate_columns/expert_columns/shared_columns are for arrays; a formula fit sets them with "
                        "gate_formula= and shared=.")
    if X is not None or y is not None:
        raise TypeError("pass either formula= and data= or arrays X and y, not both.")
    if data is None:
        raise TypeError("formula= needs data=, the frame its columns come from.")
    if spec is not None and not isinstance(spec, MoE):
        raise TypeError(f"spec must be a moestat.MoE or None, got {type(spec).__name__}.")
    if spec is None and k is None:
        raise TypeError("a formula fit needs k= (the number of experts) or spec=.")
    if spec is not None and k is not None and k != spec.k:
        raise ValueError(f"k={k} disagrees with spec.k={spec.k}; pass one of them.")
    inputs = formula_inputs(formula, data, gate_formula=gate_formula, weights=weights, missing=missing, shared=shared,
                            trials=trials, offset=offset)
    d = inputs.X.shape[1]
    spec = MoE(k=check_int("k", k), d=d) if spec is None else dataclasses.replace(spec, d=d)
    return (spec, inputs.X, inputs.y, inputs.weights, inputs.design,
            (inputs.names, inputs.gate_columns, inputs.expert_columns, inputs.shared_columns or None, inputs.trials,
             inputs.offset_column),
            inputs.design.n_dropped)


def _check_no_offset(offset: Any) -> None:
    """An offset named by a column or expression needs a formula fit (TypeError naming the array interface's way)."""
    if offset is not None:
        raise TypeError(f"offset={offset!r} names a column or expression, which needs formula= and data=; with "
                        "arrays put the offset in a column of X and pass offset_column=<its index>.")


def _check_trials(trials: Any, spec: MoE, X: Any) -> np.ndarray | None:
    """Binomial trials as a float64 array (n,) or (R, n) (values are checked with the response)."""
    if trials is None:
        return None
    if spec.response != "binomial":
        raise ValueError(f"trials= is for binomial experts (family='binomial'), not family={spec.response!r}; drop "
                         "it, or pass family='binomial' with y the proportion of successes.")
    m = np.asarray(as_numeric("trials", trials), dtype=np.float64)
    shape = np.shape(X)[:-1]
    if m.shape != tuple(shape) and m.shape != tuple(shape[-1:]):
        raise ValueError(f"trials has shape {m.shape} but the data has shape {tuple(shape)} (observations); pass one "
                         "number of trials per row.")
    return m


def _drop_missing(X: Any, y: Any, weights: Any, missing: str) -> tuple[Any, Any, Any, int]:
    """Array interface: with ``missing="drop"``, rows of one data set with NaN in X, y or weights go."""
    if missing == "raise":
        return X, y, weights, 0
    Xn, yn = np.asarray(as_numeric("X", X), dtype=float), np.asarray(as_numeric("y", y), dtype=float)
    if Xn.ndim != 2:
        raise ValueError("missing='drop' works on one data set (X of shape (n, d)); a batch of replicates must "
                         "have no missing values.")
    bad = np.isnan(Xn).any(1) | np.isnan(yn)
    if weights is not None:
        bad |= np.isnan(np.asarray(weights, dtype=float))
    if bad.all():
        raise ValueError("missing='drop' leaves no rows: every row has a missing value.")
    keep = ~bad
    return Xn[keep], yn[keep], None if weights is None else np.asarray(weights, dtype=float)[keep], int(bad.sum())


def _check_weights(weights: Any, yn: np.ndarray) -> np.ndarray | None:
    """Case weights as (R, n) float64: finite, non-negative, the data's length, not all zero."""
    if weights is None:
        return None
    w = np.asarray(as_numeric("weights", weights), dtype=np.float64)
    R, n = yn.shape
    if w.ndim == 1:
        w = np.broadcast_to(w, (R, w.shape[0]))
    if w.shape != (R, n):
        raise ValueError(f"weights has shape {np.shape(weights)} but the data has n={n} observations"
                         f"{'' if R == 1 else f' in each of R={R} replicates'}; pass one weight per row.")
    if not np.isfinite(w).all():
        raise ValueError("weights contains NaN or infinite values; pass finite case weights (or missing='drop').")
    if (w < 0).any():
        raise ValueError(f"weights must be >= 0, got a minimum of {w.min():g}; case weights count observations.")
    if (w.sum(1) <= 0).any():
        raise ValueError("weights are all zero in some replicate; at least one row must carry weight.")
    return np.array(w, dtype=np.float64, order="C", copy=True)
