r"""Maximum-likelihood fitting of Gaussian mixtures of experts: :func:`fit_mle`.

The conditional density is (Jordan & Jacobs 1994; :meth:`moestat.MoE.loglik`)

.. math:: p(y\mid x) = \sum_{i=1}^k \tilde\pi_i(x)\, \mathcal N\big(y;\, h(x;\eta_i),\, \sigma_i^2\big),

with :math:`\tilde\pi` the gate weights normalised to sum to one: softmax and top-K gates already
do; **sigmoid gates are divided by their sum over experts**,
:math:`\tilde\pi_i = \sigma(\ell_i)/\sum_j\sigma(\ell_j)` (the choice of
:func:`moestat.gates.log_mixture_weights`; an unnormalised sigmoid gate is not a mixture density).

Two estimators, both batched over replicates x restarts in one tensor program:

* ``method="em"`` — EM with closed-form expert/variance updates and an IRLS gate step
  (:mod:`moestat.fit.em`); softmax gate, linear or constant experts;
* ``method="gradient"`` — direct maximisation of the log-likelihood by L-BFGS (torch autograd) for
  every gate and expert family; every (replicate, restart) pair has its own L-BFGS memory and
  backtracking line search (:func:`moestat.fit._optim.lbfgs`, shared with the least-squares engine),
  all in one tensor program.  With top-K gates
  and ``top_k = 1`` the gate gradient is zero almost everywhere, so the gate cannot move from its start.

The noise standard deviations are kept above the floor
:math:`\sigma_{\min} = \texttt{sd\_floor}\cdot\mathrm{sd}(y)` (default ``1e-3``), which keeps the
likelihood bounded; fits at the floor are flagged (``MLEFit.at_floor``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from .._torch import cpu_threads, resolve_device, resolve_dtype, to_tensor
from .._validation import (
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
from ..exceptions import UnderdeterminedWarning, warn_user
from ..families import initial_beta, irls_weighted
from ..model import MoE
from ..params import Params
from ._layout import BlockParams, ParamLayout
from ._optim import ClosureProblem, lbfgs
from .em import design, em_fit, weighted_ls
from .formula_fit import formula_inputs
from .results import MLEFit, log_joint

METHODS = ("em", "gradient")


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
    if spec.family.input_dependent:
        Z = np.concatenate([np.ones((*Xn.shape[:2], 1)), Xn], axis=-1)
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
    """
    R, n, d = X.shape
    k = spec.k
    cols = list(range(d)) if expert_columns is None else list(expert_columns)
    Z = design(X[..., cols], spec.family.input_dependent)
    p = Z.shape[-1]
    m = min(p + 1, n)
    idx = np.stack([np.random.default_rng(s).integers(0, n, size=(S, k, m)) for s in seeds])
    w = torch.full((R, S, k, n), 0.01 * m / n, dtype=X.dtype, device=X.device)
    w.scatter_(-1, torch.as_tensor(idx, device=X.device), 1.0)
    w = w.transpose(-1, -2)
    if spec.has_noise_sd:
        beta = weighted_ls(Z, y, w, torch.zeros(R, S, k, p, dtype=X.dtype, device=X.device), 1e-10)
        mu = torch.einsum("rnp,rskp->rsnk", Z, beta)
        var = ((y[:, None, :, None] - mu) ** 2).mean(-2)
    else:  # GLM experts: a few IRLS steps on the subset weights (ridge: a subset of p + 1 points may separate)
        beta = irls_weighted(Z, y, w, initial_beta(Z, y, w, spec.glm, ridge=1e-6, trials=trials), spec.glm,
                             max_iter=10, ridge=1e-6, trials=trials)
        var = torch.ones(R, S, k, dtype=X.dtype, device=X.device)
    zeros_k = torch.zeros(R, S, k, dtype=X.dtype, device=X.device)
    ew = torch.zeros(R, S, k, d, dtype=X.dtype, device=X.device)
    if spec.family.input_dependent:
        ew[..., cols] = beta[..., 1:]
    return BlockParams(zeros_k, torch.zeros(R, S, k, d, dtype=X.dtype, device=X.device), ew, beta[..., 0],
                       var.sqrt())


def log_components(spec: MoE, p: BlockParams, Zt: torch.Tensor, y: torch.Tensor,
                   trials: torch.Tensor | None = None) -> torch.Tensor:
    r""":math:`\log\tilde\pi_i(x_t) + \log\mathcal N(y_t; h_i(x_t), \sigma_i^2)` in the (A, k, n) layout.

    The same quantity as :meth:`moestat.MoE.log_density_components` (which returns (..., n, k)), for A
    flat problems with their own data: ``Zt`` (A, d+1, n) is the transposed design :math:`(1, x_t)`,
    ``y`` (A, n), and the blocks ``p`` have leading axis A.  Experts sit on axis 1 and observations
    last, so the softmax/log-sum-exp reductions over experts run along a strided axis (several times
    faster on CPU than over a short last axis) and logits and expert pre-activations are batched
    matrix products.  ``trials`` (A, n): binomial trials (:func:`moestat.fit.results.log_joint`).
    """
    logits = torch.bmm(torch.cat([p.gate_bias.unsqueeze(-1), p.gate_weight], dim=-1), Zt)
    if spec.family.input_dependent:
        pre = torch.bmm(torch.cat([p.expert_bias.unsqueeze(-1), p.expert_weight], dim=-1), Zt)
    else:
        pre = p.expert_bias.unsqueeze(-1)
    return log_joint(spec, logits, pre, y.unsqueeze(1), p.noise_sd.unsqueeze(-1),
                     None if trials is None else trials.unsqueeze(1))


def gradient_fit(spec: MoE, X: torch.Tensor, y: torch.Tensor, init: BlockParams, layout: ParamLayout, *,
                 sd_floor: torch.Tensor, max_iter: int, gtol: float, ftol: float,
                 weights: torch.Tensor | None = None, trials: torch.Tensor | None = None
                 ) -> tuple[BlockParams, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Batched L-BFGS on :math:`-\ell_{rs}(\theta_{rs})/n` for every pair; returns params, loglik, converged, n_iter.

    The noise sd is parameterised as :math:`\sigma = (\sigma_{\min}^2 + e^{2\rho})^{1/2}` so the floor
    holds throughout.  A pair is converged when :math:`\max_j|\partial(\ell/n)/\partial\theta_j| \le`
    ``gtol``, or when a step lowers :math:`-\ell/n` by at most ``ftol`` relative; every pair has its own
    L-BFGS memory and line search, and converged pairs leave the active set
    (:func:`moestat.fit._optim.lbfgs`, the optimiser of the least-squares engine).
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
    cache: dict = {}

    def unpack(v: torch.Tensor, fl2: torch.Tensor) -> BlockParams:
        p = layout.unpack(v)
        if not layout.dispersion:
            return p
        p.noise_sd = torch.sqrt(fl2 + torch.exp(2 * v[..., -k:]))
        return p

    def negll(v: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if cache.get("rows") is not rows:  # gather the active pairs' data once per active set
            r = rep_of[rows]
            cache.update(rows=rows, Zt=Zt[r], y=y[r], fl2=floor2[rows], w=None if weights is None else weights[r],
                         m=None if trials is None else trials[r])
        logc = log_components(spec, unpack(v, cache["fl2"]), cache["Zt"], cache["y"], cache["m"])
        lse = torch.logsumexp(logc, dim=1)
        return -(lse if cache["w"] is None else lse * cache["w"]).sum(-1) / n

    res = lbfgs(ClosureProblem(negll, R * S, X.device), v0, max_iter=max_iter, tol=ftol, gtol=gtol, memory=20)
    ll = (-res.loss * n).reshape(R, S)
    conv = res.converged.reshape(R, S) & torch.isfinite(ll)
    p = unpack(res.theta, floor2).map(lambda a: a.detach().reshape(R, S, *a.shape[1:]))
    return p, ll, conv, res.n_iter.reshape(R, S)


def _finish_lbfgs(spec: MoE, X: torch.Tensor, y: torch.Tensor, pb: BlockParams, ll: torch.Tensor, conv: torch.Tensor,
                  n_iter: torch.Tensor, slow: torch.Tensor, layout: ParamLayout, floor: torch.Tensor, *,
                  max_iter: int, gtol: float, ftol: float, weights: torch.Tensor | None = None,
                  trials: torch.Tensor | None = None):
    """Continue the (replicate, restart) pairs flagged ``slow`` with batched L-BFGS from their EM state."""
    r_idx, s_idx = slow.nonzero(as_tuple=True)
    sub = pb.map(lambda a: a[r_idx, s_idx].unsqueeze(1))
    p2, ll2, conv2, it2 = gradient_fit(spec, X[r_idx], y[r_idx], sub, layout, sd_floor=floor[r_idx],
                                       max_iter=max(max_iter, 1), gtol=gtol, ftol=ftol,
                                       weights=None if weights is None else weights[r_idx],
                                       trials=None if trials is None else trials[r_idx])
    better = torch.isfinite(ll2[:, 0]) & (ll2[:, 0] >= ll[r_idx, s_idx])
    out = pb.map(lambda a: a.clone())
    for name in ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd"):
        new = getattr(p2, name)[:, 0]
        old = getattr(out, name)[r_idx, s_idx]
        mask = better.reshape(-1, *([1] * (new.dim() - 1)))
        getattr(out, name)[r_idx, s_idx] = torch.where(mask, new, old)
    ll, conv, n_iter = ll.clone(), conv.clone(), n_iter.clone()
    ll[r_idx, s_idx] = torch.where(better, ll2[:, 0], ll[r_idx, s_idx])
    conv[r_idx, s_idx] = conv2[:, 0] & better
    n_iter[r_idx, s_idx] += it2[:, 0]
    return out, ll, conv, n_iter


def _solve(spec: MoE, Xt: torch.Tensor, yt: torch.Tensor, init_b: BlockParams, layout: ParamLayout,
           floor: torch.Tensor, *, method: str, tol: float, max_iter: int, gate_steps: int, gate_solver: str,
           gtol: float, switch_after: int | None, screen: float | None, weights: torch.Tensor | None = None,
           trials: torch.Tensor | None = None):
    """EM (then L-BFGS for the slow starts) or L-BFGS from the starts ``init_b`` (R, S, ...)."""
    if method != "em":
        pb, ll, conv, n_iter = gradient_fit(spec, Xt, yt, init_b, layout, sd_floor=floor, max_iter=max_iter,
                                            gtol=gtol, ftol=0.01 * tol, weights=weights, trials=trials)
        return pb, ll, conv, n_iter, None
    em_iter = max_iter if switch_after is None else min(max_iter, switch_after)
    st = em_fit(spec, Xt, yt, init_b, var_floor=floor**2, tol=tol, max_iter=em_iter,
                gate_steps=gate_steps, gate_solver=gate_solver, gate_columns=layout.gate_columns,
                expert_columns=layout.expert_columns, weights=weights, shared_columns=layout.shared_columns,
                trials=trials)
    pb, ll, conv, n_iter = st.params, st.loglik, st.converged, st.n_iter
    slow = ~conv & torch.isfinite(ll)
    if screen is not None:
        best_now = torch.where(torch.isfinite(ll), ll, torch.full_like(ll, -torch.inf)).amax(1, keepdim=True)
        slow &= ll >= best_now - screen
    if switch_after is not None and bool(slow.any()):
        pb, ll, conv, n_iter = _finish_lbfgs(spec, Xt, yt, pb, ll, conv, n_iter, slow, layout, floor,
                                             max_iter=max_iter - em_iter, gtol=gtol, ftol=0.01 * tol,
                                             weights=weights, trials=trials)
    return pb, ll, conv, n_iter, st.history


@validate_arguments(restarts=Integer(0), tol=Real(0), max_iter=Optional(Integer(1)), sd_floor=Real(0),
                    gate_steps=Integer(1), gtol=Real(0), device=Device(), dtype=Dtype(), seed=Seed(),
                    underdetermined=Choice("raise", "warn"), switch_after=Optional(Integer(0)),
                    screen=Optional(Real(0, open_low=True)), threads=Optional(Integer(1)))
def fit_mle(spec: MoE | None = None, X=None, y=None, *, formula: str | None = None, data=None, k: int | None = None,
            gate_formula: str | None = None, weights=None, missing: str = "raise",
            gate_columns: Sequence[int] | None = None, expert_columns: Sequence[int] | None = None,
            family: str | None = None, method: str = "em", shared: str | None = None,
            shared_columns: Sequence[int] | None = None, trials=None,
            restarts: int = 5, init="random", tol: float = 1e-8,
            max_iter: int | None = None, sd_floor: float = 1e-3, gate_solver: str = "newton", gate_steps: int = 1,
            gtol: float = 1e-7, device: str = "auto", dtype=None, seed=None,
            feature_names: Sequence[str] | None = None, underdetermined: str = "raise",
            switch_after: int | None = 30, screen: float | None = 10.0, threads: int | None = 1) -> MLEFit:
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
    method : {"em", "gradient"}
        EM (softmax gate; linear or constant experts) or L-BFGS on the log-likelihood (any gate/expert).
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
        Newton steps per EM iteration (a generalised EM step; the objective never decreases).
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
    check_choice("missing", missing, ("raise", "drop"))
    if feature_names is None and isinstance(X, pd.DataFrame):
        feature_names = [str(c) for c in X.columns]
    spec, X, y, weights, design, columns, n_dropped = _resolve_inputs(spec, X, y, formula=formula, data=data, k=k,
                                                                      gate_formula=gate_formula, weights=weights,
                                                                      missing=missing, gate_columns=gate_columns,
                                                                      expert_columns=expert_columns, shared=shared,
                                                                      shared_columns=shared_columns, trials=trials)
    trials = columns[4]
    if design is not None:
        feature_names = columns[0]
    if family is not None:
        if family != spec.response and spec.response != "gaussian":
            raise ValueError(f"family={family!r} disagrees with spec.response={spec.response!r}; pass one of them.")
        spec = dataclasses.replace(spec, response=family)
    if not spec.gating.input_affine:
        raise ValueError(f"fit_mle supports gates whose logits are affine in x (softmax, sigmoid, topk, "
                         f"normalized_sigmoid), not gate={spec.gate!r}: its likelihood engine builds affine logits. "
                         "Fit this gate by least squares (fit_lse), which evaluates every gate of the registry.")
    check_choice("method", method, METHODS)
    check_choice("gate_solver", gate_solver, ("newton", "cvxpy"))
    restarts = check_int("restarts", restarts, minimum=0)
    gate_steps = check_int("gate_steps", gate_steps)
    if not (tol > 0 and gtol > 0 and sd_floor > 0):
        raise ValueError(f"tol, gtol and sd_floor must be > 0, got tol={tol}, gtol={gtol}, sd_floor={sd_floor}.")
    if method == "em" and (spec.gate != "softmax" or spec.expert not in ("linear", "constant")):
        raise ValueError(f"method='em' supports gate='softmax' with expert='linear' or 'constant', not "
                         f"gate={spec.gate!r}, expert={spec.expert!r}; use method='gradient'.")
    max_iter = check_int("max_iter", max_iter if max_iter is not None else (2000 if method == "em" else 500))
    check_choice("underdetermined", underdetermined, ("raise", "warn"))
    layout = ParamLayout(spec, feature_names, gate_columns=columns[1], expert_columns=columns[2],
                         shared_columns=columns[3])
    m_n = _check_trials(trials, spec, X)
    Xn, yn, single = _check_data(spec, X, y, underdetermined, layout, m_n)
    R = Xn.shape[0]
    w_n = _check_weights(weights, yn)
    m_n = None if m_n is None else np.array(np.broadcast_to(m_n, yn.shape), dtype=np.float64, copy=True)
    user = _as_init_list(init, spec, R)
    if restarts + len(user) == 0:
        raise ValueError("restarts=0 needs at least one start in init.")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    Xt, yt = to_tensor(Xn, device=dev, dtype=dt), to_tensor(yn, device=dev, dtype=dt)
    # inputs far from unit scale are fitted as X / s and the slopes mapped back (exact: the likelihood is
    # equivariant), so the estimate does not depend on the inputs' units; standard errors are then computed on the
    # user's scale at that estimate
    in_scale = input_scale(Xn)
    s_t = None if in_scale is None else to_tensor(in_scale, device=dev, dtype=dt)
    X_fit = Xt if s_t is None else Xt / s_t
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    seeds = ss.spawn(R)
    w_t = None if w_n is None else to_tensor(w_n, device=dev, dtype=dt)
    m_t = None if m_n is None else to_tensor(m_n, device=dev, dtype=dt)
    floor = to_tensor(sd_floor * yn.std(axis=1) if spec.has_noise_sd else np.zeros(R), device=dev, dtype=dt)
    starts = []
    for p in user:
        b = BlockParams.from_params(p.to_torch(dev, dt)).map(lambda a: a.unsqueeze(1))
        b.noise_sd = b.noise_sd.clamp_min(floor[:, None, None])
        if s_t is not None:
            b.gate_weight, b.expert_weight = b.gate_weight * s_t, b.expert_weight * s_t
        starts.append(b)
    if restarts:
        starts.append(random_starts(spec, X_fit, yt, restarts, seeds, layout.expert_design_columns, m_t))
    fields = ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd")
    init_b = BlockParams(*(torch.cat([getattr(s, f) for s in starts], dim=1) for f in fields))
    init_b.noise_sd = init_b.noise_sd.clamp_min(floor[:, None, None])
    with cpu_threads(threads, dev):
        pb, ll, conv, n_iter, history = _solve(spec, X_fit, yt, init_b, layout, floor, method=method, tol=tol,
                                               max_iter=max_iter, gate_steps=gate_steps, gate_solver=gate_solver,
                                               gtol=gtol, switch_after=switch_after, screen=screen, weights=w_t,
                                               trials=m_t)
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
                "n_dropped": n_dropped, "shared": shared, "trials": m_n is not None}
    fit = MLEFit(spec=spec, layout=layout, X=Xt, y=yt, blocks=chosen, loglik=ll[r_idx, best],
                  converged=conv[r_idx, best], n_iter=n_iter[r_idx, best], restart_loglik=ll.detach(),
                  best_restart=best, sd_floor=floor, single=single, settings=settings,
                  history=None if history is None else history[:, r_idx, best], weights=w_t, design=design,
                  response_name="y" if design is None else design.response_name, trials=m_t)
    fit._warn_degenerate()
    return fit


def _resolve_inputs(spec: MoE | None, X: Any, y: Any, *, formula: str | None, data: Any, k: int | None,
                    gate_formula: str | None, weights: Any, missing: str, gate_columns: Sequence[int] | None = None,
                    expert_columns: Sequence[int] | None = None, shared: str | None = None,
                    shared_columns: Sequence[int] | None = None, trials: Any = None
                    ) -> tuple[MoE, Any, Any, Any, Any, tuple, int]:
    """``(spec, X, y, weights, design, (names, gate_columns, expert_columns, shared_columns, trials), n_dropped)``
    for either interface."""
    if formula is None:
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
        return spec, X, y, weights, None, (None, gate_columns, expert_columns, shared_columns, trials), n_dropped
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
                            trials=trials)
    d = inputs.X.shape[1]
    spec = MoE(k=check_int("k", k), d=d) if spec is None else dataclasses.replace(spec, d=d)
    return (spec, inputs.X, inputs.y, inputs.weights, inputs.design,
            (inputs.names, inputs.gate_columns, inputs.expert_columns, inputs.shared_columns or None, inputs.trials),
            inputs.design.n_dropped)


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
