"""scikit-learn estimator for Gaussian mixtures of experts: :class:`MoERegressor`.

Follows the scikit-learn contract: the constructor only stores hyper-parameters, :meth:`fit` validates
and returns ``self``, learned state ends in ``_``; verified with
:func:`sklearn.utils.estimator_checks.check_estimator`.  scikit-learn is an optional dependency
(``pip install moestat[sklearn]``); ``import moestat`` does not import it.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .exceptions import warn_user
from .fit.mle import fit_mle
from .fit.results import MLEConvergenceWarning
from .model import MoE


class MoERegressor(RegressorMixin, BaseEstimator):
    """Maximum-likelihood Gaussian mixture of experts as a scikit-learn regressor.

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

    Attributes
    ----------
    fit_ : moestat.MLEFit
        The full results object (standard errors, tests, summary).
    params_ : moestat.Params
    loglik_, bic_ : float
    n_features_in_ : int

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
                 sd_floor: float = 1e-3, device: str = "auto", random_state=None) -> None:
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

    def _spec(self, d: int) -> MoE:
        return MoE(gate=self.gate, expert=self.expert, k=self.n_experts, d=d, top_k=self.top_k)

    def fit(self, X, y):
        """Fit by maximum likelihood; returns ``self``."""
        X, y = validate_data(self, X, y, y_numeric=True, dtype=np.float64, ensure_min_samples=2)
        spec = self._spec(X.shape[1])
        method = self.method
        if method == "auto":
            method = "em" if spec.gate == "softmax" and spec.expert in ("linear", "constant") else "gradient"
        seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MLEConvergenceWarning)
            fit = fit_mle(spec, X, y, method=method, restarts=self.restarts, tol=self.tol, max_iter=self.max_iter,
                          sd_floor=self.sd_floor, device=self.device, seed=int(seed), underdetermined="warn")
        if not fit.converged:
            warn_user("the best start did not converge; increase max_iter.", MLEConvergenceWarning)
        self.fit_ = fit
        self.params_ = fit.params
        self.loglik_ = float(fit.loglik)
        self.bic_ = float(fit.bic)
        self.converged_ = bool(fit.converged)
        self.n_iter_ = int(fit.n_iter)
        return self

    def predict(self, X):
        r"""Conditional mean :math:`E[y\mid x] = \sum_i\tilde\pi_i(x)h(x;\eta_i)`."""
        check_is_fitted(self, "fit_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray(self.fit_.predict(X), dtype=np.float64)

    def gate_probs(self, X):
        """Mixture weights of each expert at X, shape (m, k)."""
        check_is_fitted(self, "fit_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray(self.fit_.gate_probs(X))

    def posterior(self, X, y):
        """Posterior expert probabilities given (X, y), shape (m, k)."""
        check_is_fitted(self, "fit_")
        X, y = validate_data(self, X, y, reset=False, dtype=np.float64, y_numeric=True)
        return np.asarray(self.fit_.posterior(X, y))

    def loglik(self, X, y) -> float:
        """Log-likelihood of (X, y) under the fitted model."""
        check_is_fitted(self, "fit_")
        X, y = validate_data(self, X, y, reset=False, dtype=np.float64, y_numeric=True)
        return float(self.fit_.spec.loglik(self.params_, X, y))
