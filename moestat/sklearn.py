"""scikit-learn estimator for mixtures of experts (Gaussian, Poisson or binomial experts): :class:`MoERegressor`.

Follows the scikit-learn contract: the constructor only stores hyper-parameters, :meth:`fit` validates
and returns ``self``, learned state ends in ``_``; verified with
:func:`sklearn.utils.estimator_checks.check_estimator`.  scikit-learn is an optional dependency
(``pip install moestat[sklearn]``); ``import moestat`` does not import it.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_array, check_random_state
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from .exceptions import warn_user
from .fit.mle import fit_mle
from .fit.results import MLEConvergenceWarning
from .model import MoE


class MoERegressor(RegressorMixin, BaseEstimator):
    """Maximum-likelihood mixture of experts as a scikit-learn regressor (:func:`moestat.fit_mle` underneath).

    Parameters
    ----------
    n_experts : int
        Number of experts k.
    gate : {"softmax", "sigmoid", "topk"}
    expert : str
        Expert family (``"linear"``, ``"relu"``, ..., see :data:`moestat.experts.EXPERTS`).
    method : {"auto", "em", "gradient"}
        ``"auto"`` uses EM where it applies (softmax gate, linear/constant experts), else L-BFGS.
    restarts : int
        Random starts; the best log-likelihood is kept.
    top_k : int, optional
        Active experts per input for ``gate="topk"``.
    tol, max_iter, sd_floor
        See :func:`moestat.fit_mle`.
    device : str
        ``"auto"``, ``"cpu"`` or ``"cuda"``.
    random_state : int, RandomState or None
    family : {"gaussian", "poisson", "binomial"}
        The experts' response distribution (:func:`moestat.fit_mle`'s ``family``): Gaussian experts, or GLM experts
        for counts (log link) and 0/1 responses (logit link).  ``predict`` is then the mixture's mean rate or
        probability.
    gate_columns, expert_columns : sequence of int, optional
        The columns of ``X`` the gate and the experts use (default: all; the experts' default leaves out
        ``shared_columns``), as in :func:`moestat.fit_mle`: e.g. a gate on a concomitant variable only.
    shared_columns : sequence of int, optional
        Columns of ``X`` whose expert coefficient :math:`\\gamma` is common to every expert (:func:`moestat.fit_mle`'s
        ``shared_columns``; flexmix's ``FLXMRglmfix(fixed = ~ z)``): expert :math:`j`'s linear predictor is
        :math:`b_j + a_j^\\top x + \\gamma^\\top z`.  The gate still reads them unless ``gate_columns`` leaves them
        out.  :math:`\\gamma` appears once in ``fit_.summary()`` (terms ``shared:<column>``).
    offset_column : int, optional
        The column of ``X`` holding an offset (:func:`moestat.fit_mle`'s ``offset_column``): added to every expert's
        linear predictor with coefficient 1, e.g. :math:`\\log` exposure for counts; new rows carry theirs in the
        same column.
    compile : bool
        :func:`moestat.fit_mle`'s ``compile``: EM in the fused C++ loop (softmax gate, Gaussian, Poisson or binomial
        experts, CPU), the same estimates up to rounding, faster on small data; compiled on first use.

    Attributes
    ----------
    fit_ : moestat.MLEFit
        The full results object (standard errors, tests, summary).
    params_ : moestat.Params
    loglik_, bic_ : float
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        The columns of a DataFrame ``X`` (set by scikit-learn); they name the terms of ``fit_.summary()``.
    converged_ : bool
    n_iter_ : int
        Iterations of the selected start.

    Notes
    -----
    When the training set has fewer observations than the model has free parameters, the MLE is not
    identified: :meth:`fit` emits :class:`moestat.fit.mle.UnderdeterminedWarning` and still returns a
    finite fit (scikit-learn pipelines expect ``fit`` to work on small data); :func:`moestat.fit_mle`
    raises in that case by default.
    """

    def __init__(self, n_experts: int = 2, gate: str = "softmax", expert: str = "linear", method: str = "auto",
                 restarts: int = 5, top_k: int | None = None, tol: float = 1e-8, max_iter: int | None = None,
                 sd_floor: float = 1e-3, device: str = "auto", random_state=None, family: str = "gaussian",
                 gate_columns=None, expert_columns=None, shared_columns=None, offset_column=None,
                 compile: bool = False) -> None:
        self.n_experts = n_experts
        self.gate = gate
        self.expert = expert
        self.method = method
        self.restarts = restarts
        self.top_k = top_k
        self.tol = tol
        self.max_iter = max_iter
        self.sd_floor = sd_floor
        self.device = device
        self.random_state = random_state
        self.family = family
        self.gate_columns = gate_columns
        self.expert_columns = expert_columns
        self.shared_columns = shared_columns
        self.offset_column = offset_column
        self.compile = compile

    def _spec(self, d: int) -> MoE:
        return MoE(gate=self.gate, expert=self.expert, k=self.n_experts, d=d, top_k=self.top_k,
                   response=self.family)

    def fit(self, X, y, sample_weight=None, trials=None):
        """Fit by maximum likelihood; returns ``self``.

        ``sample_weight`` (n,): case weights :math:`c_t \\ge 0`, the log-likelihood
        :math:`\\sum_t c_t\\log p(y_t\\mid x_t)` (integer weights fit as the rows repeated; see
        :func:`moestat.fit_mle`'s ``weights``).  The columns of a DataFrame ``X`` name the terms of the summary, and the
        name of a pandas Series ``y`` its response.

        ``trials`` (n,): ``family="binomial"`` only, the number of trials :math:`m_t` of each row, with ``y`` the
        proportion of successes (:func:`moestat.fit_mle`'s ``trials``; statsmodels' ``var_weights`` convention).
        Like ``sample_weight`` it is a per-row fit parameter, so ``Pipeline.fit(X, y, moeregressor__trials=m)``
        and ``cross_validate(..., params={"trials": m})`` pass each fold its rows' trials.  ``predict`` (the mean
        proportion) needs no trials; ``predict_quantile``, ``predict_interval``, ``posterior`` and ``loglik`` of
        such a fit take the new rows' ``trials``.
        """
        y_name = getattr(y, "name", None)  # a named Series names the response in summary()
        X, y = validate_data(self, X, y, y_numeric=True, dtype=np.float64, ensure_min_samples=2)
        if isinstance(y_name, str):
            y = pd.Series(y, name=y_name)
        weights = None
        if sample_weight is not None:
            weights = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        m = None if trials is None else _check_trials(trials, X.shape[0])
        spec = self._spec(X.shape[1])
        method = self.method
        if method == "auto":
            method = "em" if spec.gate == "softmax" and spec.expert in ("linear", "constant") else "gradient"
        seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
        names = getattr(self, "feature_names_in_", None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MLEConvergenceWarning)
            fit = fit_mle(spec, X, y, method=method, restarts=self.restarts, tol=self.tol, max_iter=self.max_iter,
                          sd_floor=self.sd_floor, device=self.device, seed=int(seed), underdetermined="warn",
                          weights=weights, gate_columns=self.gate_columns, expert_columns=self.expert_columns,
                          shared_columns=self.shared_columns, offset_column=self.offset_column, trials=m,
                          progress=False, compile=self.compile,
                          feature_names=None if names is None else [str(c) for c in names])
        if not fit.converged:
            warn_user("the best start did not converge; increase max_iter.", MLEConvergenceWarning)
        self.fit_ = fit
        self.params_ = fit.params
        self.loglik_ = float(fit.loglik)
        self.bic_ = float(fit.bic)
        self.converged_ = bool(fit.converged)
        self.n_iter_ = int(fit.n_iter)
        return self

    def predict(self, X, return_std: bool = False, trials=None):
        r"""Conditional mean :math:`E[y\mid x] = \sum_i\tilde\pi_i(x)h(x;\eta_i)`; with ``return_std=True`` also
        the standard deviation of the fitted predictive distribution, :math:`\mathrm{Var}[y\mid x]^{1/2}` (law of
        total variance, :meth:`moestat.MLEFit.predict` ``kind="variance"``), as scikit-learn's
        ``BayesianRidge.predict(X, return_std=True)``.  A fit with binomial ``trials`` needs the new rows' trials
        for the standard deviation."""
        check_is_fitted(self, "fit_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        mean = np.asarray(self.fit_.predict(X), dtype=np.float64)
        if not return_std:
            return mean
        return mean, np.sqrt(np.asarray(self.fit_.predict(X, "variance", trials=trials), dtype=np.float64))

    def predict_quantile(self, X, q, trials=None):
        """Quantiles ``q`` of the fitted predictive distribution at X (:meth:`moestat.MLEFit.predict`,
        ``kind="quantile"``): (m,) for a scalar ``q``, else (m, len(q)); a fit with binomial ``trials`` needs the new
        rows' trials (the quantiles are then proportions of successes)."""
        check_is_fitted(self, "fit_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray(self.fit_.predict(X, "quantile", q=q, trials=trials), dtype=np.float64)

    def predict_interval(self, X, confidence_level: float = 0.95, trials=None):
        """Central prediction intervals of coverage ``confidence_level`` at X, shape (m, 2)
        (:meth:`moestat.MLEFit.predict`); a fit with binomial ``trials`` needs the new rows' trials."""
        check_is_fitted(self, "fit_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray(self.fit_.predict(X, "interval", confidence_level=confidence_level, trials=trials),
                          dtype=np.float64)

    def summary(self, **kwargs):
        """The fit's :meth:`moestat.MLEFit.summary` (terms named by the columns of a DataFrame ``X``)."""
        check_is_fitted(self, "fit_")
        return self.fit_.summary(**kwargs)

    def gate_probs(self, X):
        """Mixture weights of each expert at X, shape (m, k)."""
        check_is_fitted(self, "fit_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray(self.fit_.gate_probs(X))

    def posterior(self, X, y, trials=None):
        """Posterior expert probabilities given (X, y), shape (m, k); a fit with binomial ``trials`` needs the new
        rows' trials."""
        check_is_fitted(self, "fit_")
        X, y = validate_data(self, X, y, reset=False, dtype=np.float64, y_numeric=True)
        return np.asarray(self.fit_.posterior(X, y, trials=trials))

    def loglik(self, X, y, trials=None) -> float:
        r"""Log-likelihood of (X, y) under the fitted model.

        A fit with binomial ``trials`` needs the new rows' trials :math:`m_t`; the log-likelihood is then the full
        binomial mixture log-pmf of the fit,

        .. math:: \sum_t \log\sum_j \pi_j(x_t)\binom{m_t}{m_ty_t}\mu_j(x_t)^{m_ty_t}(1-\mu_j(x_t))^{m_t(1-y_t)}.
        """
        check_is_fitted(self, "fit_")
        X, y = validate_data(self, X, y, reset=False, dtype=np.float64, y_numeric=True)
        with_trials = bool(self.fit_.settings.get("trials"))
        if trials is None and not with_trials:
            return float(self.fit_.spec.loglik(self.params_, X, y))
        if not with_trials:
            raise TypeError("trials= is for fits with binomial trials; this fit has none, drop it from loglik().")
        if trials is None:
            raise TypeError("this fit has binomial trials: loglik() needs trials=, the number of trials of each row.")
        m = _check_trials(trials, X.shape[0])
        self.fit_.spec.glm.check_response(y, m)
        pi = np.asarray(self.fit_.gate_probs(X), dtype=np.float64)
        mu = np.asarray(self.fit_.expert_means(X), dtype=np.float64)  # success probabilities (m, k)
        with np.errstate(divide="ignore"):
            log_f = stats.binom.logpmf(np.rint(y * m)[:, None], m[:, None], mu) + np.log(pi)
        return float(logsumexp(log_f, axis=1).sum())


def _check_trials(trials: Any, n: int) -> np.ndarray:
    """Binomial trials as a float64 array (n,), one per row (their values are checked by :func:`moestat.fit_mle`)."""
    m = check_array(trials, ensure_2d=False, dtype=np.float64, input_name="trials")
    if m.ndim != 1 or m.shape[0] != n:
        raise ValueError(f"trials has shape {m.shape} but X has {n} rows; pass one number of trials per row, like "
                         "sample_weight.")
    return np.asarray(m, dtype=np.float64)
