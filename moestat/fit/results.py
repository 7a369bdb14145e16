r"""Results of a maximum-likelihood MoE fit, in the statsmodels idiom: :class:`MLEFit`.

Standard errors come from the identified parameter vector :math:`\theta` of
:mod:`moestat.fit._layout` (softmax reference expert fixed at zero, log noise sd):

* ``kind="oim"`` — observed information: :math:`\widehat V = (-\nabla^2\ell(\hat\theta))^{-1}`, the
  Hessian by torch autograd (exact, not finite differences);
* ``kind="sandwich"`` — :math:`H^{-1} J H^{-1}` with :math:`J = \sum_t s_t s_t^\top`, :math:`s_t` the
  per-observation scores (White 1982; statsmodels' ``covjhj``), robust to misspecification;
* ``kind="opg"`` — :math:`J^{-1}` (outer product of gradients; statsmodels' ``covjac``).

When :math:`-H` is not positive definite (relative smallest eigenvalue below ``1e-10``, typical of
over-specified ``k`` where the true model sits on a singular point) the information is declared
singular: ``information_singular`` is set, a :class:`SingularInformationWarning` is raised and the
covariance is NaN rather than a misleading pseudo-inverse.

Information criteria (lower is better; ``df`` = length of :math:`\theta`):
:math:`\mathrm{AIC} = -2\ell + 2\,df`, :math:`\mathrm{BIC} = -2\ell + df\log n`,
:math:`\mathrm{ICL} = \mathrm{BIC} + 2\,\mathrm{EN}` with the posterior entropy
:math:`\mathrm{EN} = -\sum_t\sum_i\tau_{ti}\log\tau_{ti}` (Biernacki, Celeux & Govaert 2000; the form
flexmix's ``ICL`` uses).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy import stats

from .._torch import to_numpy, to_tensor
from .._validation import check_choice
from ..exceptions import DegenerateFitWarning, MLEConvergenceWarning, SingularInformationWarning, warn_user
from ..gates import log_mixture_weights
from ..model import MoE
from ..params import Params
from ..report import Summary
from ._layout import BlockParams, ParamLayout
from .base import FitResult, check_reps
from .formula_fit import transform_union

COV_KINDS = ("oim", "sandwich", "opg")
SMALL_WEIGHT = 0.05
#: A component whose sigma is below this fraction of the largest one is flagged as collapsed (Hathaway's ratio).
COLLAPSE_RATIO = 0.05
#: A component carrying less than this share of the (weighted) observations is "vanishing".
VANISHING_WEIGHT = 0.01
#: A gate slope that moves the logit by more than this per standard deviation of its covariate makes the gate a
#: step function (a separating direction: the likelihood keeps rising as the slope grows, as in logistic regression).
SEPARATION_LOGIT_PER_SD = 20.0
#: An expert puts at least this share of its responsibility on one repeated response value: collapsing onto ties.
TIED_SHARE = 0.5


@dataclass
class WaldTest:
    """Result of :meth:`MLEFit.wald_test` (arrays over replicates when the fit is batched)."""

    statistic: Any
    df: int
    p_value: Any
    kind: str

    def __repr__(self) -> str:
        return f"WaldTest(statistic={self.statistic}, df={self.df}, p_value={self.p_value}, kind={self.kind!r})"


class MLEFit(FitResult):
    """A fitted Gaussian MoE (one or R replicates) with inference methods (a :class:`~moestat.fit.base.FitResult`).

    Created by :func:`moestat.fit_mle`; not meant to be built by hand.  Arrays over replicates have a
    leading axis of length R; for a fit to a single data set (``X`` of shape (n, d)) that axis is
    dropped in every public output.

    Attributes
    ----------
    spec : MoE
    loglik : float or ndarray (R,)
    converged, n_iter, best_restart : per replicate
    restart_loglik : ndarray (R, S)
        Final log-likelihood of every start (diagnoses multimodality).
    history : ndarray (T,) or (T, R), or None
        EM log-likelihood before each iteration for the selected start (``method="em"``).
    settings : dict
        Every configuration knob of the fit.
    """

    def __init__(self, *, spec: MoE, layout: ParamLayout, X: torch.Tensor, y: torch.Tensor, blocks: BlockParams,
                 loglik: torch.Tensor, converged: torch.Tensor, n_iter: torch.Tensor, restart_loglik: torch.Tensor,
                 best_restart: torch.Tensor, sd_floor: torch.Tensor, single: bool, settings: dict,
                 history: torch.Tensor | None = None, weights: torch.Tensor | None = None,
                 design: Any = None, response_name: str = "y") -> None:
        self.spec = spec
        self.layout = layout
        self._X, self._y = X, y
        self._w = torch.ones_like(y) if weights is None else weights
        self.weighted = weights is not None
        self.design = design
        self.response_name = response_name
        self._blocks = blocks
        self._theta = layout.pack(blocks).detach()
        self.single = single
        self.settings = settings
        self._loglik = to_numpy(loglik).astype(float)
        self._converged = to_numpy(converged).astype(bool)
        self._n_iter = to_numpy(n_iter).astype(int)
        self._restart_loglik = to_numpy(restart_loglik)
        self._best = to_numpy(best_restart).astype(int)
        self._floor = to_numpy(sd_floor)
        self.history = None if history is None else (to_numpy(history)[:, 0] if single else to_numpy(history))
        self._hess: torch.Tensor | None = None
        self._scores: torch.Tensor | None = None
        self._warned_singular = False
        if not self._converged.all():
            bad = np.flatnonzero(~self._converged).tolist()
            warn_user(f"the best start did not converge within max_iter={settings['max_iter']} for "
                          f"replicate(s) {bad[:10]}{'...' if len(bad) > 10 else ''}; raise max_iter or loosen tol.",
                          MLEConvergenceWarning)

    # ------------------------------------------------------------- helpers
    def _out(self, a: np.ndarray) -> Any:
        """Drop the replicate axis for a single-data-set fit."""
        a = np.asarray(a)
        return (a[0].item() if a.ndim == 1 else a[0]) if self.single else a

    @property
    def n_reps(self) -> int:
        return int(self._X.shape[0])

    @property
    def nobs(self) -> int | float:
        """Number of observations; with case weights their sum (statsmodels' ``nobs`` with ``freq_weights``)."""
        if not self.weighted:
            return int(self._X.shape[1])
        total = float(to_numpy(self._w[0]).sum())
        return round(total) if abs(total - round(total)) < 1e-9 else total

    @property
    def df_model(self) -> int:
        """Number of free parameters (length of :math:`\\theta`)."""
        return self.layout.size

    @property
    def param_names(self) -> list[str]:
        return self.layout.names

    # ------------------------------------------------------------ estimates
    @property
    def params(self) -> Params:
        """Estimates as :class:`moestat.Params` (softmax gates in the last-expert reference)."""
        p = self._blocks.to_params().numpy()
        if not self.spec.has_noise_sd:  # GLM experts have no noise sd
            p = Params(p.gate_bias, p.gate_weight, p.expert_weight, p.expert_bias)
        return p.select(0) if self.single else p

    @property
    def theta(self) -> Any:
        """The identified parameter vector (P,) or (R, P), named by :attr:`param_names`."""
        return self._out(to_numpy(self._theta))

    @property
    def loglik(self) -> Any:
        return self._out(self._loglik)

    llf = loglik

    @property
    def converged(self) -> Any:
        return self._out(self._converged)

    @property
    def objective(self) -> Any:
        """The minimised objective: the negative log-likelihood per observation, :math:`-\\ell/n`."""
        return self._out(-self._loglik / self.nobs)

    @property
    def wall_time(self) -> float:
        """Seconds spent fitting (``settings["wall_time"]``; NaN if not recorded)."""
        return float(self.settings.get("wall_time", float("nan")))

    def select(self, rep: int | Sequence[int] | np.ndarray) -> MLEFit:
        """The fit of replicate(s) ``rep``, batched (the replicate axis is kept even for one replicate)."""
        idx = check_reps(rep, self.n_reps)
        it = torch.as_tensor(idx, device=self._X.device)
        out = MLEFit.__new__(MLEFit)
        out.__dict__.update(self.__dict__)
        out._X, out._y, out._w = self._X[it], self._y[it], self._w[it]
        out._blocks = self._blocks.map(lambda a: a[it])
        out._theta = self._theta[it]
        for name in ("_loglik", "_converged", "_n_iter", "_restart_loglik", "_best", "_floor"):
            setattr(out, name, getattr(self, name)[idx])
        if self.history is not None:
            out.history = self.history[:, None] if self.single else self.history[:, idx]
        out.single = False
        out._hess = out._scores = None
        out._warned_singular = False
        return out

    @property
    def n_iter(self) -> Any:
        return self._out(self._n_iter)

    @property
    def restart_loglik(self) -> np.ndarray:
        return self._restart_loglik[0] if self.single else self._restart_loglik

    @property
    def at_floor(self) -> Any:
        """Per expert: True where :math:`\\sigma_i` sits at the variance floor (the MLE there is constrained)."""
        sd = to_numpy(self._blocks.noise_sd)
        return self._out(sd <= self._floor[:, None] * (1 + 1e-6))

    @property
    def collapsed(self) -> Any:
        r"""Per expert: True where the component's variance has collapsed: a likely spurious maximiser.

        A Gaussian MoE likelihood is unbounded: a component can put :math:`\sigma_i \to 0` on a few points it
        interpolates (Kiefer & Wolfowitz 1956), and over-specified fits often stop on such spurious maximisers,
        above the variance floor (McLachlan & Peel 2000, §3.10).  Flagged where :math:`\sigma_i` sits at the floor
        (:attr:`at_floor`) or breaks Hathaway's (1985) ratio constraint
        :math:`\sigma_i / \max_j \sigma_j \ge c` at :math:`c` = :data:`COLLAPSE_RATIO` (measured on 50
        over-specified k = 3 fits to k* = 2 data with sigma 0.5: flagged components had sigma 0.001-0.02, the others
        0.23-0.6).  A true model may have variances that far apart: then the flag asks for a look, not a refit."""
        sd = to_numpy(self._blocks.noise_sd)
        small = sd < COLLAPSE_RATIO * sd.max(-1, keepdims=True)
        floor = sd <= self._floor[:, None] * (1 + 1e-6)
        return self._out(floor | small)

    # ------------------------------------------------------------ labels
    def degeneracy(self) -> pd.DataFrame:
        """What degenerated in each replicate's fit: one row per (rep, expert, kind) with a ``detail`` and ``advice``.

        Kinds: ``"vanishing_component"`` (mean weight below ``VANISHING_WEIGHT``), ``"sigma_at_floor"``,
        ``"collapsed_variance"`` (Hathaway's ratio, :attr:`collapsed`), ``"tied_responses"`` (at least half of the
        expert's responsibility sits on one repeated value of y — a point mass the Gaussian density can only chase
        with :math:`\\sigma \\to 0`), ``"separating_gate"`` (a gate slope moving the logit by more than
        ``SEPARATION_LOGIT_PER_SD`` per SD of its covariate: the gate is a step, its slope and SE are not finite
        in the limit).  Empty when nothing degenerated.
        """
        rows: list[dict[str, Any]] = []
        comp = self.components()
        y = to_numpy(self._y)
        X = to_numpy(self._X)
        tau = to_numpy(self._posterior_t(self._X, self._y)) * to_numpy(self._w)[..., None]  # (R, n, k)
        gw = to_numpy(self._blocks.gate_weight)
        ref = self.spec.gate in ("softmax", "topk")
        names = self.layout.feature_names
        for r in range(self.n_reps):
            c = comp[comp["rep"] == r].set_index("expert")
            values, counts = np.unique(y[r], return_counts=True)
            tied = values[counts >= max(5, 0.02 * y.shape[1])]
            sdx = X[r].std(0)
            for i in range(self.spec.k):
                base = {"rep": r, "expert": i}
                if c.loc[i, "mean_weight"] < VANISHING_WEIGHT:
                    rows.append({**base, "kind": "vanishing_component",
                                 "detail": f"mean weight {c.loc[i, 'mean_weight']:.4f}",
                                 "advice": "fit fewer experts (select_k)"})
                for v in (tied if self.spec.has_noise_sd else ()):  # counts tie by nature; a GLM expert fits them
                    share = tau[r, y[r] == v, i].sum() / max(tau[r, :, i].sum(), 1e-300)
                    if share >= TIED_SHARE:
                        rows.append({**base, "kind": "tied_responses",
                                     "detail": f"{share:.0%} of its responsibility on y = {v:g} "
                                               f"({int((y[r] == v).sum())} tied observations)",
                                     "advice": "model the point mass (a count or hurdle family), or raise sd_floor"})
                if c.loc[i, "sigma_at_floor"]:
                    rows.append({**base, "kind": "sigma_at_floor", "detail": f"sigma {c.loc[i, 'sigma']:.3g} at "
                                 "the variance floor", "advice": "raise sd_floor, constrain sigma or drop k"})
                elif c.loc[i, "collapsed"]:
                    rows.append({**base, "kind": "collapsed_variance",
                                 "detail": f"sigma {c.loc[i, 'sigma']:.3g} < {COLLAPSE_RATIO} x the largest",
                                 "advice": "more restarts, a higher sd_floor or fewer experts"})
                if ref and i == self.spec.k - 1:
                    continue
                slope = gw[r, i] - (gw[r, -1] if ref else 0.0)
                steep = np.abs(slope) * sdx
                j = int(np.argmax(steep))
                if steep[j] > SEPARATION_LOGIT_PER_SD:
                    rows.append({**base, "kind": "separating_gate",
                                 "detail": f"gate slope {slope[j]:.4g} on {names[j]} ({steep[j]:.0f} logits per SD)",
                                 "advice": "a separating gate direction: the gate is a step and its slope diverges; "
                                           "drop k, or read the split as a threshold, not a coefficient"})
        return pd.DataFrame(rows, columns=["rep", "expert", "kind", "detail", "advice"])

    def _warn_degenerate(self) -> None:
        found = self.degeneracy()
        if found.empty:
            return
        lines = [f"rep {row.rep} expert {row.expert}: {row.kind.replace('_', ' ')} ({row.detail}); {row.advice}"
                 for row in found.head(6).itertuples()]
        more = f" ... and {len(found) - 6} more (fit.degeneracy())" if len(found) > 6 else ""
        warn_user("the fit degenerated: " + "; ".join(lines) + more + ".", DegenerateFitWarning)

    def relabel(self, perm) -> MLEFit:
        """The same fit with experts relabelled: expert ``i`` of the result is expert ``perm[i]`` of this fit.

        ``perm`` has shape (k,) or (R, k).  Softmax gates are re-expressed relative to the new last
        expert, so :attr:`theta`, standard errors and tests refer to the new labels.
        """
        p = self._blocks.to_params().numpy().permute(np.asarray(perm) if not self.single or np.ndim(perm) == 1
                                                     else np.asarray(perm)[None])
        dev, dt = self._X.device, self._X.dtype
        new = BlockParams.from_params(p.to_torch(dev, dt))
        out = MLEFit.__new__(MLEFit)
        out.__dict__.update(self.__dict__)
        out._blocks = new
        out._theta = self.layout.pack(new).detach()
        out._hess = out._scores = None
        out._warned_singular = False
        return out

    def align_to(self, params: Params) -> MLEFit:
        r"""Relabel the experts to best match ``params`` (e.g. the truth), by the Hungarian algorithm.

        The cost between a fitted and a reference expert is the squared Euclidean distance between their
        atoms :math:`(b_i, a_i, \log\sigma_i)` (and gate rows, after the softmax normalisation).
        """
        from ..metrics.matching import optimal_assignment

        self.spec.check_params(params)
        ref = params.numpy().batched(self.n_reps) if not params.is_batched else params.numpy()
        if ref.noise_sd is None:
            ref = Params(ref.gate_bias, ref.gate_weight, ref.expert_weight, ref.expert_bias,
                         np.full(ref.gate_bias.shape, self.spec.noise_sd))
        fit = self._blocks.to_params().numpy()

        def atoms(p: Params) -> np.ndarray:
            q = p.normalize_softmax() if self.spec.gate in ("softmax", "topk") else p
            return np.concatenate([q.gate_bias[..., None], q.gate_weight, p.expert_bias[..., None], p.expert_weight,
                                   np.log(p.noise_sd)[..., None]], -1)

        a_ref, a_fit = atoms(ref), atoms(fit)
        perms = optimal_assignment(((a_ref[:, :, None, :] - a_fit[:, None, :, :]) ** 2).sum(-1))  # (R, k)
        return self.relabel(perms[0] if self.single else perms)

    # ------------------------------------------------------ likelihood parts
    def _f_obs(self):
        spec, layout = self.spec, self.layout

        def f(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.logsumexp(spec.log_density_components(layout.unpack(theta), X, y), dim=-1)

        return f

    def _meat(self) -> np.ndarray:
        """:math:`J = \\sum_t c_t s_t s_t^\\top` (case weights :math:`c_t`; all one when unweighted)."""
        s = to_numpy(self._score_obs())
        return np.einsum("rni,rn,rnj->rij", s, to_numpy(self._w), s)

    def hessian(self) -> np.ndarray:
        """Hessian of the log-likelihood in :math:`\\theta`, (P, P) or (R, P, P) (torch autograd)."""
        return self._out(to_numpy(self._hessian()))

    def _hessian(self) -> torch.Tensor:
        if self._hess is None:
            f = self._f_obs()
            try:
                h = torch.func.vmap(torch.func.hessian(lambda t, X, y, w: (f(t, X, y) * w).sum()))(
                    self._theta, self._X, self._y, self._w)
            except RuntimeError:  # an op without a batching rule: fall back to a loop over replicates
                h = torch.stack([torch.autograd.functional.hessian(
                    lambda t, r=r: (f(t, self._X[r], self._y[r]) * self._w[r]).sum(), self._theta[r])
                    for r in range(self.n_reps)])
            self._hess = h.detach()
        return self._hess

    def _score_obs(self) -> torch.Tensor:
        if self._scores is None:
            f = self._f_obs()
            try:
                s = torch.func.vmap(torch.func.jacrev(f))(self._theta, self._X, self._y)
            except RuntimeError:
                s = torch.stack([torch.autograd.functional.jacobian(lambda t, r=r: f(t, self._X[r], self._y[r]),
                                                                    self._theta[r]) for r in range(self.n_reps)])
            self._scores = s.detach()
        return self._scores

    def score_obs(self) -> np.ndarray:
        """Per-observation scores :math:`\\partial \\log p(y_t\\mid x_t)/\\partial\\theta`, (n, P) or (R, n, P)."""
        return self._out(to_numpy(self._score_obs()))

    @property
    def information_singular(self) -> Any:
        """True where :math:`-H` is not numerically positive definite (SEs not reported)."""
        return self._out(self._singular())

    def _singular(self) -> np.ndarray:
        ev = np.linalg.eigvalsh(-to_numpy(self._hessian()))
        return ~(ev[:, 0] > 1e-10 * np.abs(ev[:, -1]))

    def cov_params(self, kind: str = "oim") -> np.ndarray:
        """Covariance of :math:`\\hat\\theta`: ``"oim"``, ``"sandwich"`` or ``"opg"`` (module docstring)."""
        check_choice("kind", kind, COV_KINDS)
        H = to_numpy(self._hessian())
        sing = self._singular()
        P = H.shape[-1]
        cov = np.full(H.shape, np.nan)
        ok = ~sing
        if kind == "opg":
            J = self._meat()
            ev = np.linalg.eigvalsh(J)
            ok = ev[:, 0] > 1e-10 * np.abs(ev[:, -1])
            cov[ok] = np.linalg.inv(J[ok])
        elif ok.any():
            Hinv = np.linalg.inv(-H[ok])
            if kind == "oim":
                cov[ok] = Hinv
            else:
                cov[ok] = Hinv @ self._meat()[ok] @ Hinv
        if (~ok).any() and not self._warned_singular:
            self._warned_singular = True
            bad = np.flatnonzero(~ok).tolist()
            warn_user(f"the information matrix ({P} parameters) is singular or not positive definite for "
                          f"replicate(s) {bad[:10]}; standard errors are reported as NaN (typical when k exceeds "
                          "the true number of experts, or a component is empty).", SingularInformationWarning)
        return self._out(cov)

    def bse(self, kind: str = "oim") -> Any:
        """Standard errors :math:`\\sqrt{\\mathrm{diag}\\,\\widehat V}` of :math:`\\hat\\theta`."""
        cov = np.asarray(self.cov_params(kind))
        return np.sqrt(np.clip(np.diagonal(cov, axis1=-2, axis2=-1), 0, None))

    def tvalues(self, kind: str = "oim") -> Any:
        return np.asarray(self.theta) / self.bse(kind)

    def pvalues(self, kind: str = "oim") -> Any:
        return 2 * stats.norm.sf(np.abs(self.tvalues(kind)))

    def conf_int(self, alpha: float = 0.05, kind: str = "oim") -> Any:
        """Wald intervals :math:`\\hat\\theta_j \\pm z_{1-\\alpha/2}\\,\\mathrm{se}_j`, shape (P, 2) or (R, P, 2)."""
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}.")
        z = stats.norm.ppf(1 - alpha / 2)
        th, se = np.asarray(self.theta), self.bse(kind)
        return np.stack([th - z * se, th + z * se], axis=-1)

    def _restriction(self, R: Any) -> np.ndarray:
        names = self.param_names
        if isinstance(R, str):
            R = [R]
        if isinstance(R, Sequence) and all(isinstance(t, str) for t in R):
            unknown = [t for t in R if t not in names]
            if unknown:
                raise ValueError(f"unknown terms {unknown}; valid terms are fit.param_names, e.g. {names[:3]}.")
            M = np.zeros((len(R), len(names)))
            for i, t in enumerate(R):
                M[i, names.index(t)] = 1.0
            return M
        M = np.atleast_2d(np.asarray(R, dtype=float))
        if M.shape[1] != len(names):
            raise ValueError(f"the restriction matrix needs {len(names)} columns (one per parameter), got {M.shape}.")
        return M

    def wald_test(self, R: Any, q: Any = 0.0, kind: str = "oim") -> WaldTest:
        r"""Wald test of :math:`H_0: R\theta = q`.

        :math:`W = (R\hat\theta-q)^\top(R\widehat VR^\top)^{-1}(R\hat\theta-q) \sim \chi^2_r` under
        :math:`H_0`.

        Parameters
        ----------
        R : list of term names (tests that they are all zero, or equal to ``q``) or an (r, P) matrix.
        q : float or array (r,)
        kind : covariance kind (see :meth:`cov_params`).

        Returns
        -------
        WaldTest
            The statistic with its :math:`\chi^2_r` p-value.
        """
        M = self._restriction(R)
        qv = np.broadcast_to(np.asarray(q, dtype=float), (M.shape[0],))
        th = to_numpy(self._theta)
        cov = np.asarray(self.cov_params(kind))
        cov = cov[None] if self.single else cov
        diff = th @ M.T - qv
        V = M @ cov @ M.T
        stat = np.einsum("ri,ri->r", diff, np.linalg.solve(V, diff[..., None])[..., 0])
        pv = stats.chi2.sf(stat, M.shape[0])
        return WaldTest(self._out(stat), int(M.shape[0]), self._out(pv), kind)

    # ---------------------------------------------------- model selection
    def _posterior_t(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        lc = self.spec.log_density_components(self._blocks, X, y)
        return torch.softmax(lc, dim=-1)

    def _entropy(self) -> np.ndarray:
        tau = self._posterior_t(self._X, self._y)
        return to_numpy(-((tau * torch.log(tau.clamp_min(1e-300))).sum(-1) * self._w).sum(-1))

    @property
    def aic(self) -> Any:
        return self._out(-2 * self._loglik + 2 * self.df_model)

    def _bic(self) -> np.ndarray:
        return -2 * self._loglik + np.log(self.nobs) * self.df_model

    @property
    def bic(self) -> Any:
        return self._out(self._bic())

    @property
    def icl(self) -> Any:
        return self._out(np.asarray(self._bic()) + 2 * self._entropy())

    # ---------------------------------------------------------- prediction
    def _data(self, X: Any, y: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        dev, dt = self._X.device, self._X.dtype
        X = self._by_name(X)
        Xt = to_tensor(np.asarray(X, dtype=float) if not isinstance(X, torch.Tensor) else X, device=dev, dtype=dt)
        if Xt.ndim == 1 and self.spec.d == 1:
            Xt = Xt[:, None]
        if Xt.ndim != 2 or Xt.shape[-1] != self.spec.d:
            raise ValueError(f"X must have shape (m, {self.spec.d}), got {tuple(Xt.shape)}.")
        if not bool(torch.isfinite(Xt).all()):
            raise ValueError("X contains NaN or infinite values.")
        Xt = Xt.unsqueeze(0).expand(self.n_reps, *Xt.shape)
        yt = None
        if y is not None:
            yt = to_tensor(np.asarray(y, dtype=float) if not isinstance(y, torch.Tensor) else y, device=dev,
                           dtype=dt)
            if yt.shape != Xt.shape[1:2]:
                raise ValueError(f"y must have shape ({Xt.shape[1]},), got {tuple(yt.shape)}.")
            if not bool(torch.isfinite(yt).all()):
                raise ValueError("y contains NaN or infinite values.")
            yt = yt.unsqueeze(0).expand(self.n_reps, -1)
        return Xt, yt

    def _by_name(self, X: Any) -> Any:
        """New inputs as the fit's columns: a frame goes through the formula (by column name) or, for an array fit,
        its columns are picked by the fit's feature names; never by position."""
        if not isinstance(X, pd.DataFrame):
            return X
        if self.design is not None:
            return transform_union(self.design, X)
        names = self.layout.feature_names
        missing = [c for c in names if c not in X.columns]
        if missing:
            raise ValueError(f"X is a DataFrame without the fit's column(s) {missing} (the fit's columns are "
                             f"{names}); pass a frame with those columns, or an array in that column order.")
        return X[names].to_numpy(dtype=float, copy=True)

    def gate_probs(self, X: Any) -> Any:
        r"""Normalised mixture weights :math:`\tilde\pi_i(x)`, (m, k) or (R, m, k)."""
        Xt, _ = self._data(X)
        b = self._blocks
        logits = Xt @ b.gate_weight.transpose(-1, -2) + b.gate_bias.unsqueeze(-2)
        lw = log_mixture_weights(self.spec.gate, logits, top_k=self.spec.top_k, temperature=self.spec.temperature,
                                 n_shared=self.spec.n_shared)
        return self._out(to_numpy(lw.exp()))

    def expert_means(self, X: Any) -> Any:
        """Expert regression functions :math:`h(x;\\eta_i)`, (m, k) or (R, m, k)."""
        Xt, _ = self._data(X)
        b = self._blocks
        pre = Xt @ b.expert_weight.transpose(-1, -2) + b.expert_bias.unsqueeze(-2)
        if not self.spec.family.input_dependent:
            pre = b.expert_bias.unsqueeze(-2).expand_as(pre)
        return self._out(to_numpy(self.spec.expert_response_mean(pre)))

    def predict(self, X: Any) -> Any:
        r"""Conditional mean of the fitted density, :math:`E[y\mid x] = \sum_i\tilde\pi_i(x)h(x;\eta_i)`.

        For sigmoid gates this uses the *normalised* weights of the density (not
        :meth:`moestat.MoE.mean`, the unnormalised regression function of the least-squares papers).
        """
        return (np.asarray(self.gate_probs(X)) * np.asarray(self.expert_means(X))).sum(-1)

    def posterior(self, X: Any, y: Any) -> Any:
        r"""Posterior expert probabilities :math:`\tau_i(x, y)`, (m, k) or (R, m, k)."""
        Xt, yt = self._data(X, y)
        return self._out(to_numpy(self._posterior_t(Xt, yt)))

    # --------------------------------------------------------------- tidy
    def components(self) -> pd.DataFrame:
        """One row per (rep, expert): mean mixture weight over the data, sigma, floor and small-weight flags."""
        tau_w = np.asarray(self.gate_probs_train())
        sd = to_numpy(self._blocks.noise_sd)
        R, k = sd.shape
        c = to_numpy(self._w)
        w = (tau_w.reshape(R, -1, k) * c[..., None]).sum(1) / c.sum(1, keepdims=True)
        floor = np.asarray(self.at_floor).reshape(R, k)
        collapsed = np.asarray(self.collapsed).reshape(R, k)
        if not self.spec.has_noise_sd:
            sd = np.full_like(sd, np.nan)
        return pd.DataFrame({"rep": np.repeat(np.arange(R), k), "expert": np.tile(np.arange(k), R),
                             "mean_weight": w.ravel(), "sigma": sd.ravel(),
                             "small": w.ravel() < SMALL_WEIGHT, "sigma_at_floor": floor.ravel(),
                             "collapsed": collapsed.ravel()})

    def gate_probs_train(self) -> np.ndarray:
        """Normalised mixture weights at the training inputs, (R, n, k)."""
        b = self._blocks
        logits = self._X @ b.gate_weight.transpose(-1, -2) + b.gate_bias.unsqueeze(-2)
        lw = log_mixture_weights(self.spec.gate, logits, top_k=self.spec.top_k, temperature=self.spec.temperature,
                                 n_shared=self.spec.n_shared)
        return to_numpy(lw.exp())

    def to_frame(self, kind: str = "oim", alpha: float = 0.05) -> pd.DataFrame:
        """Tidy coefficient frame: one row per (rep, term) with ``block``, ``atom`` (also as ``expert``, its former
        name), ``coef``, estimate, SE, z, p-value, CI and the settings."""
        th = to_numpy(self._theta)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SingularInformationWarning)
            cov = np.asarray(self.cov_params(kind))
        cov = cov[None] if self.single else cov
        se = np.sqrt(np.clip(np.diagonal(cov, axis1=-2, axis2=-1), 0, None))
        z = stats.norm.ppf(1 - alpha / 2)
        R, P = th.shape
        info = self.layout.term_info()
        with np.errstate(invalid="ignore", divide="ignore"):
            stat = th / se
        frame = pd.DataFrame({
            "rep": np.repeat(np.arange(R), P), "term": np.tile(self.param_names, R),
            "block": np.tile([b for b, _, _ in info], R), "atom": np.tile([a for _, a, _ in info], R),
            "expert": np.tile([a for _, a, _ in info], R),
            "coef": np.tile([c for _, _, c in info], R), "estimate": th.ravel(), "std_error": se.ravel(),
            "statistic": stat.ravel(), "p_value": (2 * stats.norm.sf(np.abs(stat))).ravel(),
            "conf_low": (th - z * se).ravel(), "conf_high": (th + z * se).ravel(),
        })
        frame["cov_kind"] = kind
        return self._with_config(frame)

    tidy = to_frame

    def glance(self) -> pd.DataFrame:
        """One row per replicate: loglik, df, AIC, BIC, ICL, n, convergence, iterations, restarts, small and collapsed
        components."""
        comp = self.components()
        frame = pd.DataFrame({
            "rep": np.arange(self.n_reps), "loglik": self._loglik, "df": self.df_model, "nobs": self.nobs,
            "aic": np.atleast_1d(self.aic), "bic": np.atleast_1d(self.bic), "icl": np.atleast_1d(self.icl),
            "converged": self._converged, "n_iter": self._n_iter, "best_restart": self._best,
            "n_starts": self._restart_loglik.shape[1],
            "n_small": comp.groupby("rep")["small"].sum().to_numpy(),
            "n_collapsed": comp.groupby("rep")["collapsed"].sum().to_numpy(),
            "information_singular": self._singular(),
        })
        return self._with_config(frame)

    def _with_config(self, frame: pd.DataFrame) -> pd.DataFrame:
        frame["gate"], frame["expert_family"], frame["k"], frame["d"] = (self.spec.gate, self.spec.expert,
                                                                         self.spec.k, self.spec.d)
        for key in ("method", "restarts", "tol", "max_iter", "sd_floor", "device"):
            frame[key] = self.settings[key]
        return frame

    def summary(self, rep: int = 0, kind: str = "oim", alpha: float = 0.05) -> Summary:
        """A statsmodels-like printable summary of replicate ``rep``."""
        if not 0 <= rep < self.n_reps:
            raise ValueError(f"rep must be in [0, {self.n_reps}), got {rep}.")
        tf = self.to_frame(kind, alpha)
        tf = tf[tf["rep"] == rep].set_index("term")
        lo, hi = f"[{alpha / 2:g}", f"{1 - alpha / 2:g}]"
        coef = tf[["estimate", "std_error", "statistic", "p_value", "conf_low", "conf_high"]].rename(
            columns={"estimate": "coef", "std_error": "std err", "statistic": "z", "p_value": "P>|z|",
                     "conf_low": lo, "conf_high": hi})
        comp = self.components()
        comp = comp[comp["rep"] == rep].drop(columns="rep").set_index("expert")
        ll = float(self._loglik[rep])
        header = {
            "Dep. Variable": self.response_name,
            "Model": f"{self.spec.gate} gate / {self.spec.expert}"
                     + ("" if self.spec.has_noise_sd else f" {self.spec.response} (link {self.spec.glm.link})"),
            "Experts (k)": self.spec.k,
            "Observations": self.nobs, "Parameters": self.df_model, "Method": self.settings["method"],
            "Covariance": kind, "Log-likelihood": f"{ll:.4f}", "AIC": f"{np.atleast_1d(self.aic)[rep]:.3f}",
            "BIC": f"{np.atleast_1d(self.bic)[rep]:.3f}",
            "ICL": f"{np.atleast_1d(self.icl)[rep]:.3f}", "Converged": bool(self._converged[rep]),
            "Iterations": int(self._n_iter[rep]),
        }
        notes = []
        if self.weighted:
            notes.append("case weights: the log-likelihood is sum_t c_t log p(y_t | x_t); Observations is sum_t c_t.")
        if self.spec.gate in ("softmax", "topk"):
            notes.append(f"gate coefficients are relative to expert {self.spec.k - 1} (reference, fixed at 0).")
        if self.spec.gate == "sigmoid":
            notes.append("sigmoid gates are normalised over experts in the density: pi_i = s_i / sum_j s_j.")
        if self._singular()[rep]:
            notes.append("the information matrix is singular: standard errors are not available.")
        if comp["small"].any():
            notes.append(f"expert(s) {comp.index[comp['small']].tolist()} have mean weight < {SMALL_WEIGHT} "
                         "(kept, not dropped).")
        if comp["sigma_at_floor"].any():
            notes.append("some sigma sits at the variance floor: the likelihood is constrained there.")
        if comp["collapsed"].any():
            notes.append(f"expert(s) {comp.index[comp['collapsed']].tolist()} have a collapsed variance (sigma "
                         f"< {COLLAPSE_RATIO} x the largest): likely a spurious maximiser; refit with more restarts, a "
                         "higher sd_floor or fewer experts.")
        kind_name = {"gaussian": "Gaussian", "poisson": "Poisson", "binomial": "Binomial"}[self.spec.response]
        return Summary(header, coef, comp, notes, title=f"{kind_name} mixture of experts: maximum likelihood")

    def __repr__(self) -> str:
        reps = "" if self.single else f"R={self.n_reps}, "
        return (f"MLEFit({reps}{self.spec.gate}/{self.spec.expert}, k={self.spec.k}, n={self.nobs}, "
                f"method={self.settings['method']!r}, loglik={np.round(self.loglik, 4)})")
