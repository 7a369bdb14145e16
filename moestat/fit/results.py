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

The predictive side reads the fitted conditional distribution
:math:`F(y\mid x) = \sum_i \tilde\pi_i(x) F_i(y\mid x)` (Jordan & Jacobs 1994): :meth:`MLEFit.predict` gives its
mean, quantiles (bisection on :func:`mixture_cdf`, :func:`mixture_quantile`) and central prediction intervals,
:meth:`MLEFit.simulate` draws from it (:func:`sample_mixture`, also the parametric bootstrap's sampler), and
:meth:`MLEFit.posterior_frame` tabulates the posterior expert probabilities with the MAP expert.
:meth:`MLEFit.summary` groups the coefficients per gate row and expert (a :class:`moestat.report.Summary` with
``blocks``) and
:meth:`MLEFit.plot` draws the fit (:mod:`moestat.fit.plots`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy import special, stats

from .._torch import to_numpy, to_tensor
from .._validation import Seed, check_choice, check_int
from ..exceptions import DegenerateFitWarning, MLEConvergenceWarning, SingularInformationWarning, warn_user
from ..gates import log_mixture_weights
from ..model import MoE
from ..params import Params
from ..report import Summary
from ._derivatives import pointwise_gradients, replicate_hessians
from ._layout import BlockParams, ParamLayout
from .base import FitResult, check_reps
from .checks import mixture_moments
from .formula_fit import union_matrix

COV_KINDS = ("oim", "sandwich", "opg")
SMALL_WEIGHT = 0.05
#: A component whose sigma is below this fraction of the largest one is flagged as collapsed (Hathaway's ratio) ...
COLLAPSE_RATIO = 0.05
#: ... when it also holds fewer observations (posterior mass) than this many per expert coefficient: a spurious
#: maximiser interpolates a handful of points, a genuinely narrow expert holds a share of the data.
COLLAPSE_POINTS_PER_COEF = 10
#: A component carrying less than this share of the (weighted) observations is "vanishing".
VANISHING_WEIGHT = 0.01
#: A gate slope that moves the logit by more than this per standard deviation of its covariate makes the gate a
#: step function (a separating direction: the likelihood keeps rising as the slope grows, as in logistic regression).
SEPARATION_LOGIT_PER_SD = 20.0
#: An expert puts at least this share of its responsibility on one repeated response value: collapsing onto ties.
TIED_SHARE = 0.5
#: A GLM expert whose linear predictor moves by more than this per SD of a covariate, or whose responsibility-
#: weighted mean linear predictor is this far out (binomial: mean |eta|; Poisson: -mean eta), has a diverging
#: coefficient.  A logit of 20 is a probability within 2e-9 of 0 or 1 (a log-rate of -20 a rate of 2e-9): a true
#: slope that steep would separate any sample of fewer than e^20 ~ 5e8 observations, so finite estimates this large
#: come from (quasi-)separation, where the MLE is infinite and the optimiser stopped on a tolerance
#: (Albert & Anderson 1984, Biometrika 71).
DIVERGING_LINPRED = 20.0


def log_joint(spec: MoE, logits: torch.Tensor, pre: torch.Tensor, y: torch.Tensor, sd: torch.Tensor | float,
              trials: torch.Tensor | None = None) -> torch.Tensor:
    r""":meth:`moestat.MoE.log_joint_from_linear` with binomial trials: :math:`\log\tilde\pi_i(x_t) + \log f_i(y_t)`.

    With ``trials`` :math:`m_t` (broadcasting like ``y``) a binomial expert's density is the full binomial log-pmf of
    the proportion :math:`y_t` of :math:`m_t` trials, :math:`\log\binom{m_t}{m_ty_t} + m_t[y_t\eta - \log(1 +
    e^\eta)]` (:mod:`moestat.families`); without, the model's own density.
    """
    if trials is None:
        return spec.log_joint_from_linear(logits, pre, y, sd)
    logw = log_mixture_weights(spec.gate, logits, top_k=spec.top_k, temperature=spec.temperature, dim=-2,
                               n_shared=spec.n_shared)
    return logw + spec.glm.log_density(y, spec.family.activation(pre), trials=trials)


def _check_level(level: Any) -> None:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"confidence_level must be a number in (0, 1), e.g. 0.95; got {level!r}.")


def _check_probabilities(name: str, q: Any) -> np.ndarray:
    """``q`` as a 1-d float array of probabilities strictly inside (0, 1)."""
    try:
        arr = np.atleast_1d(np.asarray(q, dtype=float))
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a probability or a sequence of probabilities in (0, 1), got {q!r}.") from None
    if arr.ndim != 1 or arr.size == 0 or not np.all((arr > 0) & (arr < 1)):
        raise ValueError(f"{name} must be a probability or a 1-d sequence of probabilities strictly between 0 and 1 "
                         f"(e.g. 0.9 or [0.1, 0.5, 0.9]), got {q!r}.")
    return arr


def _equilibrated_inverse(A: np.ndarray, rtol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    r"""Inverses of symmetric positive semi-definite matrices ``A`` (..., P, P) after symmetric diagonal scaling.

    With :math:`D = \mathrm{diag}(A)^{-1/2}`, :math:`A^{-1} = D\,(DAD)^{-1}D` exactly; :math:`DAD` has a unit
    diagonal, so its eigenvalues do not depend on the units of the parameters (a covariate measured in
    millimetres instead of kilometres scales a row and column of :math:`A` by :math:`10^{12}`, which made the raw
    matrix look singular).  A matrix counts as invertible (``ok``) when the smallest eigenvalue of :math:`DAD` exceeds
    ``rtol`` times its largest; the others get NaN.
    """
    d = np.sqrt(np.clip(np.diagonal(A, axis1=-2, axis2=-1), 0.0, None))
    scale = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    B = A * scale[..., :, None] * scale[..., None, :]
    ev = np.linalg.eigvalsh(B)
    ok = (d > 0).all(-1) & (ev[..., 0] > rtol * np.abs(ev[..., -1]))
    out = np.full(A.shape, np.nan)
    if ok.any():
        out[ok] = np.linalg.inv(B[ok]) * scale[ok][..., :, None] * scale[ok][..., None, :]
    return out, ok


def mixture_cdf(y: Any, weights: np.ndarray, means: np.ndarray, sd: Any = 1.0,
                response: str = "gaussian", trials: Any = None) -> np.ndarray:
    r"""The mixture CDF :math:`F(y\mid x) = \sum_i \pi_i F_i(y)` of Gaussian, Poisson or binomial components.

    :math:`F_i(y) = \Phi((y - \mu_i)/\sigma_i)` (``"gaussian"``), the Poisson CDF with rate :math:`\mu_i`, or the
    CDF of the proportion of successes in ``trials`` :math:`m` Bernoulli(:math:`\mu_i`) trials (``"binomial"``;
    default one trial), :math:`P(\mathrm{Bin}(m, \mu_i) \le m y)`.  ``y`` has shape ``(...,)``
    and ``weights``, ``means`` (and ``sd``) shape ``(..., k)`` or anything broadcasting against ``y[..., None]``;
    ``trials`` broadcasts against ``y``.
    """
    yv = np.asarray(y, dtype=float)[..., None]
    if response == "gaussian":
        comp = special.ndtr((yv - means) / sd)
    elif response == "poisson":
        comp = stats.poisson.cdf(yv, means)
    elif response == "binomial":
        m = 1.0 if trials is None else np.asarray(trials, dtype=float)[..., None]
        comp = stats.binom.cdf(np.floor(yv * m + 1e-9), m, means)
    else:
        raise ValueError(f"response={response!r} is not supported; valid values are ['binomial', 'gaussian', "
                         "'poisson'].")
    return (weights * comp).sum(-1)


def _component_quantiles(probs: np.ndarray, means: np.ndarray, sd: np.ndarray, response: str,
                         trials: np.ndarray | float = 1.0) -> np.ndarray:
    """Each component's ``probs``-quantile: shape (..., m, Q, k) from means (..., m, k), sd (..., 1, k); binomial
    components in numbers of successes out of ``trials`` (..., m, 1, 1)."""
    p = probs[:, None]
    if response == "gaussian":
        return means[..., None, :] + sd[..., None, :] * special.ndtri(p)
    if response == "poisson":
        return stats.poisson.ppf(p, means[..., None, :])
    return stats.binom.ppf(p, trials, means[..., None, :])


def mixture_quantile(probs: Any, weights: np.ndarray, means: np.ndarray, sd: Any = 1.0,
                     response: str = "gaussian", trials: Any = None) -> np.ndarray:
    r"""Quantiles :math:`F^{-1}(q\mid x)` of the mixture :func:`mixture_cdf`, vectorised over inputs and ``probs``.

    The quantile lies in :math:`[\min_i Q_i(q), \max_i Q_i(q)]` over the components with positive weight
    (:math:`Q_i` the component quantile): at the lower end every :math:`F_i \le q`, at the upper end every
    :math:`F_i \ge q`, and :math:`F` is their convex combination.  Gaussian mixtures: bisection on :math:`F` inside
    that bracket down to the floating-point resolution of :math:`y`.  Poisson and Bernoulli mixtures: integer
    bisection for the smallest :math:`y` with :math:`F(y) \ge q`.

    Parameters
    ----------
    probs : array (Q,)
        Probabilities in (0, 1).
    weights, means : array (..., m, k)
        Mixture weights (summing to one over k) and component means (rates / probabilities for GLM components).
    sd : array (..., 1, k) or float
        Gaussian components' sds (ignored otherwise).
    response : {"gaussian", "poisson", "binomial"}
    trials : array (..., m) or None
        Binomial components: trials per input (default one); the quantiles are then proportions of successes.

    Returns
    -------
    ndarray (..., m, Q)
    """
    probs = _check_probabilities("probs", probs)
    w, mu = np.asarray(weights, dtype=float), np.asarray(means, dtype=float)
    sd = np.broadcast_to(np.asarray(sd, dtype=float), (*mu.shape[:-2], 1, mu.shape[-1]))
    m = np.ones(mu.shape[:-1]) if trials is None or response != "binomial" else \
        np.broadcast_to(np.asarray(trials, dtype=float), mu.shape[:-1])
    comp = _component_quantiles(probs, mu, sd, response, m[..., None, None])
    live = (w > 0)[..., None, :]
    lo = np.where(live, comp, np.inf).min(-1)
    hi = np.where(live, comp, -np.inf).max(-1)
    W, M, S = w[..., None, :], mu[..., None, :], sd[..., None, :]
    mq = m[..., None]  # (..., m, 1) against (..., m, Q)

    def below(y: np.ndarray) -> np.ndarray:  # y in counts of successes for binomial components
        if response == "binomial":
            return mixture_cdf(y / mq, W, M, S, response, mq) < probs
        return mixture_cdf(y, W, M, S, response) < probs

    if response != "gaussian":  # smallest integer y with F(y) >= q: F(lo) < q <= F(hi) throughout
        lo = lo - 1
        while np.any(hi - lo > 1):
            mid = np.floor((lo + hi) / 2)
            low = below(mid)
            lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
        return hi / mq if response == "binomial" else hi
    for _ in range(200):  # each step halves the bracket; 200 steps reach any float64 resolution
        mid = 0.5 * (lo + hi)
        low = below(mid)
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
        if np.all(hi - lo <= 4 * np.finfo(float).eps * np.maximum(np.abs(lo), np.abs(hi)) + 1e-300):
            break
    return 0.5 * (lo + hi)


def sample_mixture(response: str, weights: np.ndarray, means: np.ndarray, sd: np.ndarray, n_draws: int,
                   rng: np.random.Generator, trials: np.ndarray | None = None) -> np.ndarray:
    r"""``n_draws`` responses per input from a mixture: weights and means (n, k), sds (k,); returns (n_draws, n).

    An expert :math:`z_t` per draw and input by inverse-CDF sampling of the weights, then a normal (mean
    :math:`\mu_{tz}`, sd :math:`\sigma_z`), Poisson (rate :math:`\mu_{tz}`) or Bernoulli (probability
    :math:`\mu_{tz}`) draw; with binomial ``trials`` :math:`m_t` (n,) the proportion
    :math:`\mathrm{Bin}(m_t, \mu_{tz})/m_t`.  The one sampler of :meth:`MLEFit.simulate` and the parametric
    bootstrap.
    """
    n, k = weights.shape
    cum = np.cumsum(weights, axis=-1)
    u = rng.uniform(size=(n_draws, n))
    z = np.minimum((u[..., None] > cum[None]).sum(-1), k - 1)
    mean = np.take_along_axis(np.broadcast_to(means, (n_draws, n, k)), z[..., None], -1)[..., 0]
    if response == "poisson":
        return rng.poisson(mean).astype(float)
    if response == "binomial" and trials is not None:
        m = np.broadcast_to(np.asarray(trials, dtype=float), (n_draws, n))
        return rng.binomial(m.astype(np.int64), mean) / m
    if response == "binomial":
        return (rng.uniform(size=(n_draws, n)) < mean).astype(float)
    return mean + np.asarray(sd)[z] * rng.standard_normal((n_draws, n))


def _linear_hypotheses(specs: list[str], names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Restriction matrix and right-hand sides of equations in the parameters (``"a = b"``, ``"a - 2 b = 1"``; one
    without ``=`` means ``= 0``), parsed by formulaic's ``LinearConstraints``; the term names are quoted for it, since
    ``expert[0]:x`` is not an identifier."""
    from formulaic.errors import FormulaicError
    from formulaic.utils.constraints import LinearConstraints

    # one pass, longest names first (no name eats part of a longer one); a name the user quoted stays as it is
    terms = re.compile("(?<!`)(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + ")(?!`)")
    quoted = [terms.sub(lambda m: f"`{m.group(0)}`", text) for text in specs]
    try:
        c = LinearConstraints.from_spec(quoted, variable_names=names)
    except (FormulaicError, ValueError, KeyError) as exc:
        raise ValueError(f"R={specs!r}: unknown terms or a malformed equation ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}); terms are spelt as in fit.param_names, e.g. {names[:3]}, "
                         "and an equation reads like 'expert[0]:x = expert[1]:x'.") from None
    return np.asarray(c.constraint_matrix, dtype=float), np.asarray(c.constraint_values, dtype=float)


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
                 design: Any = None, response_name: str = "y", trials: torch.Tensor | None = None) -> None:
        self.spec = spec
        self._m = trials  # binomial trials (R, n), or None
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
        #: a formula fit's trials column (``trials="m"``): new frames holding it give their rows' trials
        self.trials_column: str | None = None
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
            p = Params(p.gate_bias, p.gate_weight, p.expert_weight, p.expert_bias, temperature=p.temperature)
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
        """Seconds :func:`moestat.fit_mle` took, from its call to the result (formula, starts and optimisation;
        ``settings["wall_time"]``; NaN for a result built otherwise)."""
        return float(self.settings.get("wall_time", float("nan")))

    def select(self, rep: int | Sequence[int] | np.ndarray) -> MLEFit:
        """The fit of replicate(s) ``rep``, batched (the replicate axis is kept even for one replicate)."""
        idx = check_reps(rep, self.n_reps)
        it = torch.as_tensor(idx, device=self._X.device)
        out = MLEFit.__new__(MLEFit)
        out.__dict__.update(self.__dict__)
        out._X, out._y, out._w = self._X[it], self._y[it], self._w[it]
        out._m = None if self._m is None else self._m[it]
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
        return self._out(self._at_floor())

    def _at_floor(self) -> np.ndarray:
        """:attr:`at_floor` as an (R, k) array."""
        out: np.ndarray = to_numpy(self._blocks.noise_sd) <= self._floor[:, None] * (1 + 1e-6)
        return out

    @property
    def collapsed(self) -> Any:
        r"""Per expert: True where the component's variance has collapsed: a likely spurious maximiser.

        A Gaussian MoE likelihood is unbounded: a component can put :math:`\sigma_i \to 0` on a few points it
        interpolates (Kiefer & Wolfowitz 1956), and over-specified fits often stop on such spurious maximisers,
        above the variance floor (McLachlan & Peel 2000, §3.10).  Flagged where :math:`\sigma_i` sits at the floor
        (:attr:`at_floor`) or breaks Hathaway's (1985) ratio constraint
        :math:`\sigma_i / \max_j \sigma_j \ge c` at :math:`c` = :data:`COLLAPSE_RATIO` while holding a posterior mass
        :math:`\sum_t w_t\tau_{ti}` below :data:`COLLAPSE_POINTS_PER_COEF` observations per expert coefficient.
        Measured on 60 + 60 over-specified k = 3 fits (one start each) to k* = 2 data with sigma 0.5, d = 1: the
        ratio-flagged components had sigma 0.0007-0.02 and a mass of 0-10 observations; every other component held at
        least 3.5 (n = 200) or 14 (n = 1,000) with sigma >= 0.028.  The mass condition keeps a genuinely narrow
        expert beside a wide one (e.g. an expert for outliers, sigma ratio 0.03 but hundreds of observations) from
        being called a spurious maximiser."""
        return self._out(self._collapsed_from(self._weighted_posterior()))

    def _weighted_posterior(self) -> np.ndarray:
        r"""Responsibilities times case weights at the training data, :math:`c_t\tau_{ti}` (R, n, k)."""
        return to_numpy(self._posterior_t(self._X, self._y, self._m)) * to_numpy(self._w)[..., None]

    def _collapsed_from(self, tau_w: np.ndarray) -> np.ndarray:
        """:attr:`collapsed` (R, k) from the weighted responsibilities (R, n, k)."""
        sd = to_numpy(self._blocks.noise_sd)
        few = tau_w.sum(1) < COLLAPSE_POINTS_PER_COEF * (self.spec.d + 1)
        small = (sd < COLLAPSE_RATIO * sd.max(-1, keepdims=True)) & few
        out: np.ndarray = self._at_floor() | small
        return out

    # ------------------------------------------------------------ labels
    def degeneracy(self) -> pd.DataFrame:
        """What degenerated in each replicate's fit: one row per (rep, expert, kind) with a ``detail`` and ``advice``.

        Kinds: ``"vanishing_component"`` (mean weight below ``VANISHING_WEIGHT``), ``"sigma_at_floor"``,
        ``"collapsed_variance"`` (Hathaway's ratio, :attr:`collapsed`), ``"tied_responses"`` (at least half of the
        expert's responsibility sits on one repeated value of y — a point mass the Gaussian density can only chase
        with :math:`\\sigma \\to 0`), ``"separating_gate"`` (a gate slope moving the logit by more than
        ``SEPARATION_LOGIT_PER_SD`` per SD of its covariate: the gate is a step, its slope and SE are not finite
        in the limit), ``"diverging_expert"`` (GLM experts only: a slope moving the expert's linear predictor by
        more than ``DIVERGING_LINPRED`` per SD of its covariate, or a fitted mean saturated at the responsibility-
        weighted mean of the linear predictor (binomial: mean |logit| above it; Poisson: mean log-rate below minus it);
        the expert's subgroup is (quasi-)separated, e.g. a near-empty subgroup with all-0 / all-1 responses, and its
        coefficient runs off to infinity).  Empty when nothing degenerated.
        """
        return pd.DataFrame(self._degeneracy_rows(), columns=["rep", "expert", "kind", "detail", "advice"])

    def _degeneracy_rows(self) -> list[dict[str, Any]]:
        """The rows of :meth:`degeneracy` (the fit-time warning reads them without building a frame)."""
        rows: list[dict[str, Any]] = []
        y = to_numpy(self._y)
        X = to_numpy(self._X)
        tau = self._weighted_posterior()  # (R, n, k)
        comp = self._component_arrays(tau)
        gw = to_numpy(self._blocks.gate_weight)
        ref = self.spec.gate in ("softmax", "topk")
        names = self.layout.feature_names
        diverging = self._diverging_experts(X, tau)
        for r in range(self.n_reps):
            values, counts = np.unique(y[r], return_counts=True)
            tied = values[counts >= max(5, 0.02 * y.shape[1])]
            sdx = X[r].std(0)
            for i in range(self.spec.k):
                base = {"rep": r, "expert": i}
                if comp["mean_weight"][r, i] < VANISHING_WEIGHT:
                    rows.append({**base, "kind": "vanishing_component",
                                 "detail": f"mean weight {comp['mean_weight'][r, i]:.4f}",
                                 "advice": "fit fewer experts (select_k)"})
                for v in (tied if self.spec.has_noise_sd else ()):  # counts tie by nature; a GLM expert fits them
                    share = tau[r, y[r] == v, i].sum() / max(tau[r, :, i].sum(), 1e-300)
                    if share >= TIED_SHARE:
                        rows.append({**base, "kind": "tied_responses",
                                     "detail": f"{share:.0%} of its responsibility on y = {v:g} "
                                               f"({int((y[r] == v).sum())} tied observations)",
                                     "advice": "model the point mass (a count or hurdle family), or raise sd_floor"})
                if comp["sigma_at_floor"][r, i]:
                    rows.append({**base, "kind": "sigma_at_floor", "detail": f"sigma {comp['sigma'][r, i]:.3g} at "
                                 "the variance floor", "advice": "raise sd_floor, constrain sigma or drop k"})
                elif comp["collapsed"][r, i]:
                    rows.append({**base, "kind": "collapsed_variance",
                                 "detail": f"sigma {comp['sigma'][r, i]:.3g} < {COLLAPSE_RATIO} x the largest, on "
                                           "few observations",
                                 "advice": "more restarts, a higher sd_floor or fewer experts"})
                if (r, i) in diverging:
                    rows.append({**base, "kind": "diverging_expert", "detail": "; ".join(diverging[(r, i)]),
                                 "advice": "a separated subgroup: the expert's coefficient is infinite in the limit; "
                                           "drop k, remove or merge the covariate, or use a penalised (Firth) fit"})
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
        return rows

    def _diverging_experts(self, X: np.ndarray, tau: np.ndarray) -> dict[tuple[int, int], list[str]]:
        """``{(rep, expert): [details]}`` of GLM experts with a diverging coefficient (:meth:`degeneracy`)."""
        if self.spec.has_noise_sd or not self.spec.family.input_dependent:
            return {}
        out: dict[tuple[int, int], list[str]] = {}
        ew, eb = to_numpy(self._blocks.expert_weight), to_numpy(self._blocks.expert_bias)
        cols = list(self.layout.expert_design_columns)
        names = self.layout.feature_names
        eta = np.einsum("rnd,rkd->rnk", X, ew) + eb[:, None, :]
        for r in range(self.n_reps):
            sdx = X[r].std(0)
            for i in range(self.spec.k):
                found = []
                if cols:
                    steep = np.abs(ew[r, i, cols]) * sdx[cols]
                    j = int(np.argmax(steep))
                    if steep[j] > DIVERGING_LINPRED:
                        found.append(f"slope {ew[r, i, cols[j]]:.4g} on {names[cols[j]]} ({steep[j]:.0f} per SD on "
                                     f"the {self.spec.glm.link} scale)")
                mass = tau[r, :, i].sum()
                if mass > 0:  # binomial: mean |eta|, Poisson: mean eta, weighted by the expert's responsibility
                    e = np.abs(eta[r, :, i]) if self.spec.response == "binomial" else eta[r, :, i]
                    centre = float((tau[r, :, i] * e).sum() / mass)
                    if (centre if self.spec.response == "binomial" else -centre) > DIVERGING_LINPRED:
                        what = "|logit|" if self.spec.response == "binomial" else "log-rate"
                        found.append(f"fitted mean saturated (mean {what} {centre:.3g} over its responsibility)")
                if found:
                    out[(r, i)] = found
        return out

    def _warn_degenerate(self) -> None:
        found = self._degeneracy_rows()
        if not found:
            return
        lines = [f"rep {row['rep']} expert {row['expert']}: {row['kind'].replace('_', ' ')} ({row['detail']}); "
                 f"{row['advice']}" for row in found[:6]]
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
    def _components(self, blocks: Any, X: torch.Tensor, y: torch.Tensor, m: torch.Tensor | None = None
                    ) -> torch.Tensor:
        """:meth:`moestat.MoE.log_density_components` (..., n, k), with binomial trials ``m`` (..., n) if given."""
        spec = self.spec
        if m is None:
            return spec.log_density_components(blocks, X, y)
        logits = spec._logits(blocks, X).transpose(-1, -2)
        pre = spec._pre_activations(blocks, X).transpose(-1, -2)
        return log_joint(spec, logits, pre, y.unsqueeze(-2), 1.0, m.unsqueeze(-2)).transpose(-1, -2)

    def _f_obs(self):
        layout = self.layout

        def f(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
            return torch.logsumexp(self._components(layout.unpack(theta), X, y, m), dim=-1)

        return f

    def _data_args(self) -> tuple[torch.Tensor, ...]:
        """(X, y, w) and, for a fit with binomial trials, m: the per-replicate data of the likelihood."""
        return (self._X, self._y, self._w) + (() if self._m is None else (self._m,))

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
            X, y, w, *m = self._data_args()
            self._hess = replicate_hessians(lambda t: (f(t, X, y, *m) * w).sum(), self._theta)
        return self._hess

    def _score_obs(self) -> torch.Tensor:
        if self._scores is None:
            f = self._f_obs()
            data = tuple(a for i, a in enumerate(self._data_args()) if i != 2)  # X, y (and trials m)
            self._scores = torch.stack([pointwise_gradients(f, self._theta[r], *(a[r] for a in data))[1]
                                        for r in range(self.n_reps)])
        return self._scores

    def score_obs(self) -> np.ndarray:
        """Per-observation scores :math:`\\partial \\log p(y_t\\mid x_t)/\\partial\\theta`, (n, P) or (R, n, P)."""
        return self._out(to_numpy(self._score_obs()))

    @property
    def information_singular(self) -> Any:
        """True where :math:`-H` is not numerically positive definite (SEs not reported)."""
        return self._out(self._singular())

    def _singular(self) -> np.ndarray:
        return ~_equilibrated_inverse(-to_numpy(self._hessian()))[1]

    def cov_params(self, kind: str = "oim") -> np.ndarray:
        """Covariance of :math:`\\hat\\theta`: ``"oim"``, ``"sandwich"`` or ``"opg"`` (module docstring)."""
        check_choice("kind", kind, COV_KINDS)
        H = to_numpy(self._hessian())
        P = H.shape[-1]
        cov = np.full(H.shape, np.nan)
        if kind == "opg":
            Jinv, ok = _equilibrated_inverse(self._meat())
            cov[ok] = Jinv[ok]
        else:
            Hinv_all, ok = _equilibrated_inverse(-H)
        if kind != "opg" and ok.any():
            Hinv = Hinv_all[ok]
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

    def _restriction(self, R: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """The restriction matrix of :meth:`wald_test` and, for hypotheses written as equations, their right-hand
        sides (None otherwise)."""
        names = self.param_names
        if isinstance(R, str):
            R = [R]
        if isinstance(R, Sequence) and all(isinstance(t, str) for t in R):
            if all(t in names for t in R):
                M = np.zeros((len(R), len(names)))
                for i, t in enumerate(R):
                    M[i, names.index(t)] = 1.0
                return M, None
            return _linear_hypotheses(list(R), list(names))
        M = np.atleast_2d(np.asarray(R, dtype=float))
        if M.shape[1] != len(names):
            raise ValueError(f"the restriction matrix needs {len(names)} columns (one per parameter), got {M.shape}.")
        return M, None

    def wald_test(self, R: Any, q: Any = 0.0, kind: str = "oim") -> WaldTest:
        r"""Wald test of :math:`H_0: R\theta = q`.

        :math:`W = (R\hat\theta-q)^\top(R\widehat VR^\top)^{-1}(R\hat\theta-q) \sim \chi^2_r` under
        :math:`H_0`.

        Parameters
        ----------
        R : term names, linear hypotheses, or an (r, P) matrix
            Term names (tests that they are all zero, or equal to ``q``); equations in the terms, as statsmodels
            writes them, e.g. ``"expert[0]:income = expert[1]:income"`` or ``["gate[0]:w = 0",
            "expert[0]:x - expert[1]:x = 1"]`` (one row each; parsed by formulaic's ``LinearConstraints``, the
            term names as ``fit.param_names`` spells them); or the matrix itself.
        q : float or array (r,)
            The right-hand side for term names or a matrix; equations carry their own.
        kind : covariance kind (see :meth:`cov_params`).

        Returns
        -------
        WaldTest
            The statistic with its :math:`\chi^2_r` p-value.
        """
        M, rhs = self._restriction(R)
        if rhs is not None:
            if np.any(np.asarray(q, dtype=float) != 0.0):
                raise ValueError("q= is for term names or a matrix; equations carry their own right-hand side, e.g. "
                                 "'expert[0]:x = 1'.")
            q = rhs
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
    def _posterior_t(self, X: torch.Tensor, y: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
        lc = self._components(self._blocks, X, y, m)
        return torch.softmax(lc, dim=-1)

    def _entropy(self) -> np.ndarray:
        tau = self._posterior_t(self._X, self._y, self._m)
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
    def _data_kept(self, X: Any, y: Any = None, *, y_from_frame: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None, np.ndarray | None]:
        """New inputs (R, m, d) and responses (R, m) as tensors, and which rows of a frame ``X`` they are: None when
        every row is used, else the mask of the rows a formula fit with ``missing="drop"`` kept (a ``y`` with one
        value per row of ``X`` is cut to those rows).  ``y_from_frame``: without ``y``, a formula fit's frame ``X``
        that holds the response column gives it (one pass through the formula for both)."""
        dev, dt = self._X.device, self._X.dtype
        X, kept, y_frame = self._by_name(X)
        if y is None and y_from_frame:
            y = y_frame
        if kept is not None and y is not None and np.ndim(y) == 1 and len(y) == kept.size:
            y = np.asarray(y)[kept]
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
        return Xt, yt, kept

    def _by_name(self, X: Any) -> tuple[Any, np.ndarray | None, np.ndarray | None]:
        """New inputs as the fit's columns, the mask of the rows kept (None: all) and, for a formula fit's frame that
        holds the response column, the response of those rows (else None): a frame goes through the formula (by
        column name; a fit with ``missing="drop"`` drops rows with a missing value) or, for an array fit, its columns
        are picked by the fit's feature names; never by position.  A dict of columns is read as a frame."""
        if isinstance(X, Mapping):
            try:
                X = pd.DataFrame(dict(X))
            except ValueError as exc:
                raise ValueError(f"X is a dict that does not make a DataFrame ({exc}); give equal-length "
                                 "columns.") from None
        if not isinstance(X, pd.DataFrame):
            return X, None, None
        if self.design is not None:
            m = self.design.transform(X)
            kept = None if bool(np.all(m.kept)) else np.asarray(m.kept)
            return union_matrix(self.design, m.X, m.X_gate, m.X_shared, m.offset), kept, m.y
        names = self.layout.feature_names
        missing = [c for c in names if c not in X.columns]
        if missing:
            raise ValueError(f"X is a DataFrame without the fit's column(s) {missing} (the fit's columns are "
                             f"{names}); pass a frame with those columns, or an array in that column order.")
        return X[names].to_numpy(dtype=float, copy=True), None, None

    def _weights_t(self, b: Any, Xt: torch.Tensor) -> torch.Tensor:
        """Normalised mixture weights of the blocks ``b`` at the inputs ``Xt`` (..., m, d): (..., m, k)."""
        # the gate's own scores (distances, cosines, quadratic forms, ...) and a learned temperature, as the model
        logits = self.spec._logits(b, Xt)
        lw = log_mixture_weights(self.spec.gate, logits, top_k=self.spec.top_k, temperature=self.spec.temperature,
                                 n_shared=self.spec.n_shared)
        return lw.exp()

    def _means_t(self, b: Any, Xt: torch.Tensor) -> torch.Tensor:
        """Expert mean responses of the blocks ``b`` at the inputs ``Xt`` (..., m, d): (..., m, k)."""
        pre = Xt @ b.expert_weight.transpose(-1, -2) + b.expert_bias.unsqueeze(-2)
        if not self.spec.family.input_dependent:
            pre = b.expert_bias.unsqueeze(-2).expand_as(pre)
        return self.spec.expert_response_mean(pre)

    def _weights_np(self, Xt: torch.Tensor) -> np.ndarray:
        """Normalised mixture weights at the (R, m, d) inputs ``Xt``: (R, m, k)."""
        return to_numpy(self._weights_t(self._blocks, Xt))

    def _means_np(self, Xt: torch.Tensor) -> np.ndarray:
        """Expert mean responses at the (R, m, d) inputs ``Xt``: (R, m, k)."""
        return to_numpy(self._means_t(self._blocks, Xt))

    def _mean_se(self, Xt: torch.Tensor, cov: str) -> tuple[np.ndarray, np.ndarray]:
        r"""The predictive mean :math:`m(x;\hat\theta) = \sum_i\tilde\pi_i(x)\mu_i(x)` at the (R, m, d) inputs and its
        delta-method standard error :math:`(g^\top\widehat V g)^{1/2}`, :math:`g = \partial m/\partial\theta`
        (autograd through the packed parameters, :func:`pointwise_gradients`), both (R, m)."""
        V = torch.as_tensor(np.asarray(self.cov_params(cov)).reshape(self.n_reps, *self._theta.shape[-1:] * 2),
                            dtype=self._theta.dtype, device=self._theta.device)
        layout = self.layout

        def mean(theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
            b = layout.unpack(theta)
            return (self._weights_t(b, X) * self._means_t(b, X)).sum(-1)

        pairs = [pointwise_gradients(mean, self._theta[r], Xt[r]) for r in range(self.n_reps)]
        m, G = torch.stack([v for v, _ in pairs]), torch.stack([g for _, g in pairs])  # (R, m), (R, m, P)
        var = torch.einsum("rmp,rpq,rmq->rm", G, V, G)
        return to_numpy(m), np.sqrt(np.clip(to_numpy(var), 0, None))

    def _predictive(self, X: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Weights (R, m, k), expert means (R, m, k) and noise sds (R, 1, k) of the predictive distribution at X
        (the training inputs when X is None); the sds are ones for GLM experts (unused there)."""
        return self._predictive_kept(X)[:3]

    def _predictive_kept(self, X: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """:meth:`_predictive` and the rows of a frame ``X`` it covers (:meth:`_data_kept`)."""
        Xt, _, kept = (self._X, None, None) if X is None else self._data_kept(X)
        return (*self._predictive_at(Xt), kept)

    def _predictive_at(self, Xt: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_predictive` at the (R, m, d) inputs ``Xt``."""
        return self._weights_np(Xt), self._means_np(Xt), to_numpy(self._blocks.noise_sd)[:, None, :]

    @staticmethod
    def _pad(a: np.ndarray, kept: np.ndarray | None, axis: int = 1) -> np.ndarray:
        """``a`` over the kept rows (on ``axis``) spread over all rows of the new frame, NaN where a row was dropped
        for a missing value (R's ``na.exclude``): results stay aligned with the frame passed in."""
        if kept is None:
            return a
        shape = list(a.shape)
        shape[axis] = kept.size
        out = np.full(shape, np.nan)
        at: list[Any] = [slice(None)] * a.ndim
        at[axis] = kept
        out[tuple(at)] = a
        return out

    def gate_probs(self, X: Any) -> Any:
        r"""Normalised mixture weights :math:`\tilde\pi_i(x)`, (m, k) or (R, m, k)."""
        Xt, _, kept = self._data_kept(X)
        return self._out(self._pad(self._weights_np(Xt), kept))

    def expert_means(self, X: Any) -> Any:
        """Expert regression functions :math:`h(x;\\eta_i)`, (m, k) or (R, m, k); for GLM experts the mean response
        :math:`g^{-1}(a_i^\\top x + b_i)` (a Poisson expert's rate, a binomial expert's probability)."""
        Xt, _, kept = self._data_kept(X)
        return self._out(self._pad(self._means_np(Xt), kept))

    def predict(self, X: Any, kind: str = "mean", *, q: Any = None, confidence_level: float = 0.95,
                trials: Any = None, cov: str = "oim") -> Any:
        r"""Predictions from the fitted conditional (mixture) distribution of :math:`y` given :math:`x`.

        The predictive distribution is the fitted mixture (Jordan & Jacobs 1994)
        :math:`F(y\mid x) = \sum_i \tilde\pi_i(x)\, F_i(y\mid x)`, with :math:`F_i` the normal CDF
        :math:`\Phi((y - h(x;\eta_i))/\sigma_i)` for Gaussian experts, or the Poisson / Bernoulli CDF at the
        expert's mean for GLM experts.

        Parameters
        ----------
        X : array (m, d) or DataFrame
            New inputs (a frame is read by column name; see :meth:`gate_probs`).  A formula fit with
            ``missing="drop"`` returns NaN for a row of the frame with a missing value, so the result keeps one row
            per row of ``X`` (R's ``na.exclude``; also :meth:`gate_probs`, :meth:`expert_means`, :meth:`posterior`
            and :meth:`simulate`); with ``missing="raise"`` such a row raises.
        kind : {"mean", "variance", "quantile", "interval", "mean_se", "mean_ci"}
            ``"mean"``: the conditional mean :math:`E[y\mid x] = \sum_i\tilde\pi_i(x)h(x;\eta_i)` (for sigmoid
            gates with the *normalised* weights of the density, not :meth:`moestat.MoE.mean`).
            ``"variance"``: the conditional variance :math:`\mathrm{Var}[y\mid x] = \sum_i\tilde\pi_i(x)(v_i +
            \mu_i^2) - E[y\mid x]^2` (law of total variance; :math:`v_i` = :math:`\sigma_i^2`, the Poisson rate,
            or :math:`\mu_i(1-\mu_i)/m` for a proportion out of :math:`m` trials;
            :func:`moestat.fit.checks.mixture_moments`).
            ``"quantile"``: :math:`F^{-1}(q\mid x)`, found by vectorised bisection on the mixture CDF inside the
            bracket :math:`[\min_i F_i^{-1}(q), \max_i F_i^{-1}(q)]` (it holds the mixture quantile because
            :math:`F` is a convex combination of the :math:`F_i`); for Poisson and binomial experts the smallest
            integer :math:`y` with :math:`F(y\mid x) \ge q`.
            ``"interval"``: the central prediction interval
            :math:`[F^{-1}(\tfrac{1-c}{2}), F^{-1}(\tfrac{1+c}{2})]` with :math:`c` = ``confidence_level``; for
            count and binary responses its coverage is at least ``confidence_level``.
            ``"mean_se"``: the standard error of the fitted mean :math:`\hat m(x)` from the parameters' estimated
            covariance (``cov``), by the delta method: :math:`(g^\top\widehat V g)^{1/2}`,
            :math:`g = \partial m(x;\theta)/\partial\theta` at :math:`\hat\theta` (autograd).
            ``"mean_ci"``: the Wald confidence interval for :math:`E[y\mid x]` at level ``confidence_level``, formed on
            the family's link scale and mapped back (statsmodels' ``get_prediction`` for GLMs): :math:`\hat m \pm
            z\,\mathrm{se}` (Gaussian), :math:`\hat m\,e^{\pm z\,\mathrm{se}/\hat m}` (Poisson), the logistic of
            :math:`\mathrm{logit}\,\hat m \pm z\,\mathrm{se}/(\hat m(1-\hat m))` (binomial), so it stays
            inside the response's range.  It covers the regression function, not a new response (``"interval"``).
            NaN where the information matrix is singular.
        q : float or sequence of float in (0, 1)
            The probabilities of ``kind="quantile"``.
        confidence_level : float in (0, 1)
            The coverage of ``kind="interval"`` (a prediction interval for a new response, not a confidence
            interval for a parameter) and of ``kind="mean_ci"`` (a confidence interval for the mean).
        trials : array (m,), optional
            A fit with binomial trials: the new rows' numbers of trials, needed by ``"variance"``, ``"quantile"``
            and ``"interval"`` (which are then proportions of successes); the mean proportion does not depend on
            them.  ``X=None`` (the training inputs) uses the training trials.
        cov : {"oim", "sandwich", "opg"}
            ``"mean_se"`` and ``"mean_ci"``: the covariance of :math:`\hat\theta` (:meth:`cov_params`).

        Returns
        -------
        ndarray
            ``"mean"``, ``"variance"`` and ``"mean_se"``: (m,); ``"quantile"``: (m,) for a scalar ``q``,
            (m, len(q)) otherwise; ``"interval"`` and ``"mean_ci"``: (m, 2) with the lower and upper ends.  A batched
            fit adds a leading replicate axis.
        """
        check_choice("kind", kind, ("mean", "variance", "quantile", "interval", "mean_se", "mean_ci"))
        if q is not None and kind != "quantile":
            hint = "an interval takes confidence_level=, e.g. confidence_level=0.9" if kind == "interval" else \
                "drop it, or pass kind='quantile'"
            raise TypeError(f"q= is for kind='quantile'; {hint}.")
        if kind in ("mean_se", "mean_ci"):
            return self._predict_mean_uncertainty(X, kind, confidence_level, cov)
        if kind == "mean":
            w, mu, _, kept = self._predictive_kept(X)
            if trials is not None:
                self._new_trials(trials, w.shape[1], "predict", kept)  # checked, unused: the mean is free of m
            return self._out(self._pad((w * mu).sum(-1), kept))
        if kind == "variance":
            w, mu, sd, kept = self._predictive_kept(X)
            m = self._trials_at(X, trials, w.shape[1], "predict", kept)
            _, var, _ = mixture_moments(w, mu, sd, self.spec.response, None if m is None else to_numpy(m))
            return self._out(self._pad(var, kept))
        if kind == "quantile":
            if q is None:
                raise TypeError("kind='quantile' needs q=, the probabilities, e.g. predict(X, 'quantile', q=0.9).")
            probs = _check_probabilities("q", q)
        else:
            _check_level(confidence_level)
            probs = np.array([(1 - confidence_level) / 2, (1 + confidence_level) / 2])
        w, mu, sd, kept = self._predictive_kept(X)
        m = self._trials_at(X, trials, w.shape[1], "predict", kept)
        out = mixture_quantile(probs, w, mu, sd, self.spec.response, None if m is None else to_numpy(m))
        if kind == "quantile" and np.ndim(q) == 0:
            out = out[..., 0]
        return self._out(self._pad(out, kept))

    def _predict_mean_uncertainty(self, X: Any, kind: str, level: float, cov: str) -> Any:
        """:meth:`predict`'s ``"mean_se"`` and ``"mean_ci"``."""
        check_choice("cov", cov, COV_KINDS)
        _check_level(level)
        Xt, _, kept = (self._X, None, None) if X is None else self._data_kept(X)
        mean, se = self._mean_se(Xt, cov)
        if kind == "mean_se":
            return self._out(self._pad(se, kept))
        z = stats.norm.ppf((1 + level) / 2)
        if self.spec.response == "poisson":
            half = z * se / mean
            lo, hi = mean * np.exp(-half), mean * np.exp(half)
        elif self.spec.response == "binomial":
            eta, half = special.logit(mean), z * se / (mean * (1 - mean))
            lo, hi = special.expit(eta - half), special.expit(eta + half)
        else:
            lo, hi = mean - z * se, mean + z * se
        return self._out(self._pad(np.stack([lo, hi], axis=-1), kept))

    def simulate(self, X: Any = None, n_draws: int = 1, seed: Any = None, trials: Any = None) -> Any:
        r"""New responses drawn from the fitted conditional density at the inputs ``X``.

        For each input and draw: an expert :math:`z \sim \mathrm{Categorical}(\tilde\pi(x))`, then
        :math:`y \sim \mathcal N(h(x;\eta_z), \sigma_z^2)` (or the Poisson / Bernoulli law of expert :math:`z`).
        The same sampler draws the parametric bootstrap's responses (:func:`moestat.bootstrap`).

        Parameters
        ----------
        X : array (m, d) or DataFrame, optional
            Inputs (default: the training inputs, for posterior predictive checks).
        n_draws : int
            Draws per input.
        seed : int, SeedSequence or list of SeedSequence, optional
            Replicate ``r`` of a batched fit draws from ``SeedSequence(seed).spawn(R)[r]`` (or ``seed[r]``).
        trials : array (m,), optional
            A fit with binomial trials: the new rows' trials (default with ``X=None``: the training trials); the
            draws are proportions of successes.

        Returns
        -------
        ndarray (n_draws, m), or (R, n_draws, m) for a batched fit.
        """
        n_draws = check_int("n_draws", n_draws)
        if not Seed().accepts(seed):
            kind = ValueError if Seed().accepts_type(seed) else TypeError
            raise kind(f"seed must be {Seed.description}, got {seed!r}.")
        if isinstance(seed, (list, tuple)):
            if len(seed) != self.n_reps:
                raise ValueError(f"seed is a list of {len(seed)} SeedSequences; give one per replicate "
                                 f"({self.n_reps}), or one seed.")
            streams = list(seed)
        else:
            ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
            streams = ss.spawn(self.n_reps)
        w, mu, sd, kept = self._predictive_kept(X)
        m_t = self._trials_at(X, trials, w.shape[1], "simulate", kept)
        m = None if m_t is None else to_numpy(m_t)
        draws = np.stack([sample_mixture(self.spec.response, w[r], mu[r], sd[r, 0], n_draws,
                                         np.random.default_rng(s), None if m is None else m[r])
                          for r, s in enumerate(streams)])
        return self._out(self._pad(draws, kept, axis=2))

    def posterior(self, X: Any, y: Any = None, trials: Any = None) -> Any:
        r"""Posterior expert probabilities :math:`\tau_i(x, y)`, (m, k) or (R, m, k); a fit with binomial trials needs
        the new rows' ``trials`` (``y`` is then their proportion of successes).  A formula fit reads ``y`` from a frame
        ``X`` that holds the response column; otherwise pass ``y`` (:meth:`posterior_frame` is the tidy version)."""
        tau, kept = self._posterior_rows(X, y, trials, "posterior")
        return self._out(self._pad(tau, kept))

    def _posterior_rows(self, X: Any, y: Any, trials: Any, what: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Posterior probabilities (R, m, k) at the rows of ``X`` the fit uses, and which rows those are
        (:meth:`_data_kept`): one pass through a formula for the inputs and the response."""
        Xt, yt, kept = self._data_kept(X, y, y_from_frame=True)
        if yt is None:
            raise TypeError(f"{what}(X) needs y=, the responses of the rows of X"
                            + (f" (or a frame X holding the response column {self.response_name!r})"
                               if self.design is not None else "") + ".")
        m = self._trials_at(X, trials, Xt.shape[1], what, kept)
        return to_numpy(self._posterior_t(Xt, yt, m)), kept

    def _new_trials(self, trials: Any, m_rows: int, what: str, kept: np.ndarray | None = None
                    ) -> torch.Tensor | None:
        """Binomial trials (R, m) of new rows: required by a fit with trials, refused by one without; trials given for
        every row of a frame of which only the ``kept`` rows are used are cut to those rows."""
        if self._m is None:
            if trials is not None:
                raise TypeError(f"trials= is for fits with binomial trials; this fit has none, drop it from {what}().")
            return None
        if trials is None:
            raise TypeError(f"this fit has binomial trials: {what}() at new inputs needs trials=, the number of trials "
                            "of each new row.")
        arr = np.asarray(trials, dtype=float)
        arr = np.broadcast_to(arr, (m_rows,)) if arr.ndim == 0 else arr
        if kept is not None and arr.shape == (kept.size,):
            arr = arr[kept]
        if arr.shape != (m_rows,) or not np.all(np.isfinite(arr)) or np.any(arr < 1) or \
                np.any(arr != np.round(arr)):
            raise ValueError(f"trials must be {m_rows} positive whole numbers (one per new row), got shape "
                             f"{arr.shape}.")
        t = to_tensor(arr, device=self._X.device, dtype=self._X.dtype)
        return t.unsqueeze(0).expand(self.n_reps, -1)

    def _trials_at(self, X: Any, trials: Any, m_rows: int, what: str, kept: np.ndarray | None = None
                   ) -> torch.Tensor | None:
        """The trials of the rows of ``X``: the training trials when ``X`` is None (and no ``trials`` are given);
        for a formula fit whose trials were a column of its data, that column of a frame ``X`` (one value per row of
        ``X``, as an offset is read); else :meth:`_new_trials`."""
        if X is None and trials is None:
            return self._m
        column = self.trials_column
        if trials is None and column is not None and isinstance(X, (pd.DataFrame, Mapping)) and column in X:
            trials = np.asarray(X[column], dtype=float)
        return self._new_trials(trials, m_rows, what, kept)

    def _training_moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance (R, n) of the fitted mixture at the training rows (their trials included)."""
        w, mu, sd = self._predictive(None)
        mean, var, _ = mixture_moments(w, mu, sd, self.spec.response, None if self._m is None else to_numpy(self._m))
        return mean, var

    @property
    def fittedvalues(self) -> Any:
        r"""The fitted conditional means at the training rows, :math:`\hat y_t = E[y\mid x_t]`
        (``predict(None)``), (n,) or (R, n); for binomial trials, proportions of successes."""
        return self._out(self._training_moments()[0])

    @property
    def resid(self) -> Any:
        r"""Response residuals :math:`y_t - \hat y_t` at the training rows, (n,) or (R, n) (statsmodels'
        ``resid_response``); case weights do not scale them."""
        return self._out(to_numpy(self._y) - self._training_moments()[0])

    @property
    def resid_pearson(self) -> Any:
        r"""Pearson residuals :math:`(y_t - \hat y_t)/\mathrm{Var}[y\mid x_t]^{1/2}` under the fitted mixture,
        (n,) or (R, n): about mean 0 and variance 1 when the model holds.  Their sum of squares over
        :math:`n - \mathrm{df}` is the Pearson dispersion of :func:`moestat.fit.checks.predictive_checks`
        (McCullagh & Nelder 1989, §2.4.2)."""
        mean, var = self._training_moments()
        return self._out((to_numpy(self._y) - mean) / np.sqrt(var))

    def posterior_frame(self, X: Any = None, y: Any = None, trials: Any = None) -> pd.DataFrame:
        r"""Posterior expert probabilities as a tidy frame, with the MAP expert.

        One row per observation: ``posterior_0 .. posterior_{k-1}``, the posterior probabilities
        :math:`\tau_i(x_t, y_t) = \tilde\pi_i(x_t) f_i(y_t\mid x_t) / p(y_t\mid x_t)`, and ``component``, the
        maximum a posteriori expert :math:`\arg\max_i\tau_i` (flexmix's ``clusters()``).

        Parameters
        ----------
        X, y : optional
            Default: the training data, indexed by the rows of the data frame a formula fit kept (so the frame
            joins back onto that data).  A formula fit also takes a new frame ``X`` alone when it holds the
            response column; otherwise pass ``y``.
        trials : array, optional
            New rows of a fit with binomial trials: their numbers of trials.

        Returns
        -------
        DataFrame
            Indexed by the data's row labels (a new frame's, or 0 .. m-1 for arrays); a batched fit adds a
            ``rep`` column and stacks the replicates.
        """
        if X is None:
            if y is not None:
                raise TypeError("y= needs X=; posterior_frame() without arguments uses the training data.")
            tau = to_numpy(self._posterior_t(self._X, self._y, self._m))
            index = self.design.index if self.design is not None else pd.RangeIndex(tau.shape[1])
        else:
            tau, kept = self._posterior_rows(X, y, trials, "posterior_frame")  # the kept rows only, listed by label
            if isinstance(X, pd.DataFrame):
                index = X.index if kept is None else X.index[kept]
            else:
                index = pd.RangeIndex(tau.shape[1])
        frames = []
        for r in range(self.n_reps):
            f = pd.DataFrame(tau[r], index=index, columns=[f"posterior_{i}" for i in range(self.spec.k)])
            f["component"] = tau[r].argmax(-1)
            if not self.single:
                f.insert(0, "rep", r)
            frames.append(f)
        return frames[0] if self.single else pd.concat(frames)

    def plot(self, x: str | int | None = None, ax: Any = None, **kwargs: Any) -> Any:
        """Fitted component means over one covariate, the data coloured by MAP expert, the gate below.

        See :func:`moestat.fit.plots.plot_fit` for the arguments (``at=``, ``data=``, ``rep=``, ``n_grid=``);
        returns the matplotlib Figure."""
        from .plots import plot_fit

        return plot_fit(self, x, ax=ax, **kwargs)

    # --------------------------------------------------------------- tidy
    def components(self) -> pd.DataFrame:
        """One row per (rep, expert): mean mixture weight over the data, sigma, floor and small-weight flags."""
        a = self._component_arrays(self._weighted_posterior())
        R, k = a["sigma"].shape
        return pd.DataFrame({"rep": np.repeat(np.arange(R), k), "expert": np.tile(np.arange(k), R),
                             **{name: v.ravel() for name, v in a.items()}})

    def _component_arrays(self, tau_w: np.ndarray) -> dict[str, np.ndarray]:
        """The columns of :meth:`components` as (R, k) arrays, from the weighted responsibilities (R, n, k)."""
        sd = to_numpy(self._blocks.noise_sd)
        R, k = sd.shape
        c = to_numpy(self._w)
        w = (self.gate_probs_train().reshape(R, -1, k) * c[..., None]).sum(1) / c.sum(1, keepdims=True)
        return {"mean_weight": w, "sigma": sd if self.spec.has_noise_sd else np.full_like(sd, np.nan),
                "small": w < SMALL_WEIGHT, "sigma_at_floor": self._at_floor(), "collapsed": self._collapsed_from(tau_w)}

    def gate_probs_train(self) -> np.ndarray:
        """Normalised mixture weights at the training inputs, (R, n, k)."""
        return self._weights_np(self._X)

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
        """A statsmodels-like printable summary of replicate ``rep``: the header (response, model, fit criteria),
        then the coefficients in one block per gate row and per expert (flexmix's ``summary(refit(m))``), each
        expert's block titled with its mean weight and sigma, the components table and notes
        (a :class:`moestat.report.Summary` with ``blocks``; ``as_text()``, ``as_html()``, ``as_latex()``)."""
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
            "Model": f"{self.spec.gate} gate / {self.spec.expert}",
            **({} if self.spec.has_noise_sd else {"Family": f"{self.spec.response} ({self.spec.glm.link} link)"}),
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
        if self.spec.gate in ("softmax", "topk") and self.spec.k > 1:  # one expert has no gate coefficients
            notes.append(f"gate coefficients are relative to expert {self.spec.k - 1} (reference, fixed at 0).")
        if self.layout.offset_column is not None:
            notes.append(f"offset: {self.layout.feature_names[self.layout.offset_column]} is added to every expert's "
                         "linear predictor with coefficient 1.")
        if self.spec.gate == "sigmoid":
            notes.append("sigmoid gates are normalised over experts in the density: pi_i = s_i / sum_j s_j.")
        if self._singular()[rep]:
            notes.append("the information matrix is singular: standard errors are not available.")
        if comp["small"].any():
            notes.append(f"expert(s) {comp.index[comp['small']].tolist()} have mean weight < {SMALL_WEIGHT} "
                         "(kept, not dropped).")
        if comp["sigma_at_floor"].any():
            notes.append(f"expert(s) {comp.index[comp['sigma_at_floor']].tolist()} have sigma at the variance floor: "
                         "the likelihood is constrained there.")
        by_ratio = comp["collapsed"] & ~comp["sigma_at_floor"]  # at the floor is said above, with its own cause
        if by_ratio.any():
            notes.append(f"expert(s) {comp.index[by_ratio].tolist()} have a collapsed variance (sigma "
                         f"< {COLLAPSE_RATIO} x the largest, on few observations): likely a spurious maximiser; "
                         "refit with more restarts, a higher sd_floor or fewer experts.")
        for row in self._degeneracy_rows():
            if row["rep"] == rep and row["kind"] == "tied_responses":
                notes.append(f"expert {row['expert']} has {row['detail']}: {row['advice']}.")
        kind_name = {"gaussian": "Gaussian", "poisson": "Poisson", "binomial": "Binomial"}[self.spec.response]
        shown = comp if self.spec.has_noise_sd else comp.drop(columns=["sigma", "sigma_at_floor", "collapsed"])
        return Summary(header, coef, shown, notes, title=f"{kind_name} mixture of experts: maximum likelihood",
                       blocks=self._summary_blocks(coef, tf, comp, kind_name))

    def _summary_blocks(self, coef: pd.DataFrame, tf: pd.DataFrame, comp: pd.DataFrame,
                        kind_name: str) -> list[tuple[str, pd.DataFrame]]:
        """``(title, rows of coef)`` per gate row and per expert, titled with what each block is."""
        k, blocks = self.spec.k, []
        ref = self.spec.gate in ("softmax", "topk")
        for i in range(k - 1 if ref else k):
            what = (f"log-odds of expert {i} against expert {k - 1} (reference)" if ref
                    else f"{self.spec.gate} score of expert {i} (normalised over experts)")
            blocks.append((f"Gate {i}: {what}", coef[(tf["block"] == "gate") & (tf["atom"] == i)]))
        for i in range(k):
            c = comp.loc[i]
            facts = [f"mean weight {c['mean_weight']:.3f}"]
            if self.spec.has_noise_sd:
                facts.append(f"sigma {c['sigma']:.4g}")
            else:
                facts.append(f"{kind_name} expert, {self.spec.glm.link} link")
            flags = [name for name, on in (("small", c["small"]), ("sigma at floor", c["sigma_at_floor"]),
                                           ("collapsed", c["collapsed"])) if on]
            title = f"Expert {i}: {', '.join(facts)}" + (f" [{', '.join(flags)}]" if flags else "")
            blocks.append((title, coef[(tf["block"] == "expert") & (tf["atom"] == i)]))
        if self.layout.learn_temperature:
            blocks.append(("Gate temperature: log(tau), common to every expert",
                           coef[(tf["block"] == "gate") & (tf["atom"] == -1)]))
        if self.layout.n_shared:
            blocks.append(("Shared: coefficients common to every expert", coef[tf["block"] == "shared"]))
        return blocks

    def __repr__(self) -> str:
        reps = "" if self.single else f"R={self.n_reps}, "
        return (f"MLEFit({reps}{self.spec.gate}/{self.spec.expert}, k={self.spec.k}, n={self.nobs}, "
                f"method={self.settings['method']!r}, loglik={np.round(self.loglik, 4)})")

