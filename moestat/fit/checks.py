r"""Predictive checks of a fitted mixture of experts: does the fitted conditional distribution reproduce the data's
mean, variance and zeros?

The fitted conditional distribution is the mixture (Jordan & Jacobs 1994, *Neural Computation* 6, 181-214)
:math:`p(y\mid x) = \sum_i \pi_i(x)\,f_i(y\mid x)` with component means :math:`\mu_i(x)` and variances
:math:`v_i(x)`.  Its moments are (:func:`mixture_moments`)

.. math::

    \mathbb E[y\mid x] = \sum_i \pi_i\mu_i,\qquad
    \mathrm{Var}[y\mid x] = \sum_i \pi_i\,(v_i + \mu_i^2) - \mathbb E[y\mid x]^2,\qquad
    P(y = 0\mid x) = \sum_i \pi_i\,f_i(0\mid x),

with :math:`v_i = \sigma_i^2` for Gaussian experts, :math:`v_i = \mu_i` and :math:`f_i(0) = e^{-\mu_i}` for
Poisson experts, and, for binomial experts with :math:`m` trials and the response a proportion of successes,
:math:`v_i = \mu_i(1-\mu_i)/m` and :math:`f_i(0) = (1-\mu_i)^m`.

:func:`predictive_checks` sets these against the data, over the sample :math:`t = 1..n` (case weights
:math:`c_t`, all one unless the fit has them; :math:`N = \sum_t c_t`):

* the observed mean :math:`\bar y = \sum_t c_t y_t / N` against the fitted :math:`\sum_t c_t\,\mathbb E[y\mid x_t]/N`;
* the observed variance :math:`\sum_t c_t (y_t - \bar y)^2/N` against the fitted marginal variance over the
  sample's covariates (law of total variance) :math:`\sum_t c_t\,\{\mathrm{Var}[y\mid x_t] +
  (\mathbb E[y\mid x_t] - \bar m)^2\}/N`, :math:`\bar m` the fitted mean;
* for count responses, the observed share of zeros against :math:`\sum_t c_t\,P(y = 0\mid x_t)/N`
  (Mullahy 1997, *Review of Economics and Statistics* 79, 586-593, on zeros as a check of count models);
* the Pearson dispersion :math:`\sum_t c_t\,(y_t - \mathbb E[y_t\mid x_t])^2/\mathrm{Var}[y_t\mid x_t]\,/\,(N - df)`,
  about 1 when the model's variance matches the data's (McCullagh & Nelder 1989, *Generalized Linear Models*,
  2nd ed., §4.5; Cameron & Trivedi 2013, *Regression Analysis of Count Data*, 2nd ed., §5.2);
* the log-likelihood, the number of free parameters ``df`` and BIC :math:`-2\ell + df\log N`.

:func:`count_model_checks` writes the same row for a statsmodels count regression (e.g. a negative binomial
NB2 reference, Cameron & Trivedi 2013 §3.3), so that a mixture and a single-distribution model are compared
on one scale; :func:`compare_glm` sets a one-expert fit against statsmodels' GLM with the same terms, and
:func:`restart_logliks` tabulates every random start's final log-likelihood (how often the starts reach the
best maximum).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from scipy import special, stats

from .._torch import to_numpy
from .._validation import check_choice

if TYPE_CHECKING:
    from .results import MLEFit

__all__ = ["compare_glm", "count_model_checks", "mixture_moments", "predictive_checks", "restart_logliks"]

_RESPONSES = ("binomial", "gaussian", "poisson")
#: Columns of :func:`predictive_checks` and :func:`count_model_checks` (after ``rep`` / ``model``).
CHECK_COLUMNS = ("n", "df", "loglik", "bic", "observed_mean", "fitted_mean", "observed_variance", "fitted_variance",
                 "observed_zero_share", "fitted_zero_share", "pearson_dispersion")


def mixture_moments(weights: Any, means: Any, sd: Any = 1.0, response: str = "gaussian",
                    trials: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Mean, variance and :math:`P(y = 0)` of a mixture of Gaussian, Poisson or binomial components.

    :math:`\mathbb E[y] = \sum_i \pi_i\mu_i`, :math:`\mathrm{Var}[y] = \sum_i \pi_i(v_i + \mu_i^2) -
    \mathbb E[y]^2`, :math:`P(y = 0) = \sum_i \pi_i f_i(0)`, with the component variances :math:`v_i` and zero
    probabilities :math:`f_i(0)` of the module docstring (law of total variance for a finite mixture;
    McLachlan & Peel 2000, *Finite Mixture Models*, §1.4).

    Parameters
    ----------
    weights, means : array (..., k)
        Mixture weights (summing to one over the last axis) and component means: Gaussian means, Poisson rates or
        binomial success probabilities.
    sd : float or array broadcasting against (..., k)
        Gaussian components' standard deviations (ignored for the other responses).
    response : {"gaussian", "poisson", "binomial"}
    trials : array (...,), optional
        Binomial components: trials per row (default one, a Bernoulli response); the moments are then those of
        the proportion of successes :math:`y = s/m`.

    Returns
    -------
    mean, variance, p_zero : ndarray (...,)
        ``p_zero`` is NaN for Gaussian components (a continuous response puts no mass at 0).
    """
    check_choice("response", response, _RESPONSES)
    w, mu = np.asarray(weights, dtype=float), np.asarray(means, dtype=float)
    if w.shape != mu.shape:
        raise ValueError(f"weights and means must have the same shape (..., k), got {w.shape} and {mu.shape}.")
    if response == "gaussian":
        comp_var = np.broadcast_to(np.asarray(sd, dtype=float) ** 2, mu.shape)
        comp_zero = np.full(mu.shape, np.nan)
    elif response == "poisson":
        comp_var, comp_zero = mu, np.exp(-mu)
    else:
        m = 1.0 if trials is None else np.asarray(trials, dtype=float)[..., None]
        comp_var, comp_zero = mu * (1 - mu) / m, (1 - mu) ** m
    mean = (w * mu).sum(-1)
    variance = (w * (comp_var + mu ** 2)).sum(-1) - mean ** 2
    return mean, variance, (w * comp_zero).sum(-1)


def _check_row(y: np.ndarray, mean: np.ndarray, variance: np.ndarray, p_zero: np.ndarray | None, loglik: float,
               df: int, weights: np.ndarray | None = None) -> dict[str, Any]:
    """One row of :data:`CHECK_COLUMNS` (module docstring); ``p_zero`` None for a continuous response."""
    c = np.ones_like(y) if weights is None else weights
    n = float(c.sum())
    obs_mean, fit_mean = float((c * y).sum() / n), float((c * mean).sum() / n)
    count = p_zero is not None
    return {"n": round(n) if abs(n - round(n)) < 1e-9 else n, "df": int(df), "loglik": float(loglik),
            "bic": float(-2 * loglik + df * np.log(n)),
            "observed_mean": obs_mean, "fitted_mean": fit_mean,
            "observed_variance": float((c * (y - obs_mean) ** 2).sum() / n),
            "fitted_variance": float((c * (variance + (mean - fit_mean) ** 2)).sum() / n),
            "observed_zero_share": float((c * (y == 0)).sum() / n) if count else np.nan,
            "fitted_zero_share": float((c * p_zero).sum() / n) if count else np.nan,
            "pearson_dispersion": float((c * (y - mean) ** 2 / variance).sum() / (n - df))}


def _mixture_loglik(y: np.ndarray, weights: np.ndarray, means: np.ndarray, sd: np.ndarray, response: str,
                    trials: np.ndarray | None) -> float:
    r""":math:`\sum_t \log\sum_i \pi_{ti} f_i(y_t)` with scipy's densities (the binomial one of the number of
    successes :math:`m_t y_t`, the convention of :mod:`moestat.families`)."""
    yv = y[:, None]
    if response == "gaussian":
        comp = stats.norm.logpdf(yv, means, sd)
    elif response == "poisson":
        comp = stats.poisson.logpmf(yv, means)
    else:
        m = np.ones_like(y) if trials is None else trials
        comp = stats.binom.logpmf(np.round(yv * m[:, None]), m[:, None], means)
    with np.errstate(divide="ignore"):
        return float(special.logsumexp(np.log(weights) + comp, axis=-1).sum())


def _fit_data(fit: MLEFit, X: Any, y: Any, trials: Any) -> dict[str, Any]:
    """Weights, means, sds (R, m, k / R, 1, k), responses (R, m), trials and case weights of the checked rows."""
    R = fit.n_reps
    if X is None:
        if y is not None or trials is not None:
            raise TypeError("y= and trials= go with X=; predictive_checks(fit) without X checks the training data.")
        w, mu, sd = fit._predictive(None)
        m = None if fit._m is None else to_numpy(fit._m)
        return {"w": w, "mu": mu, "sd": sd, "y": to_numpy(fit._y), "m": m, "c": to_numpy(fit._w),
                "loglik": np.broadcast_to(np.asarray(fit.loglik, dtype=float), (R,))}
    # one pass through a formula: the inputs, the rows a fit with missing="drop" can use, and a frame's response
    Xt, yt, kept = fit._data_kept(X, y, y_from_frame=True)
    if yt is None:
        raise TypeError("predictive_checks(fit, X) needs y=, the responses (or, for a formula fit, a frame X "
                        f"holding the response column {fit.response_name!r}).")
    w, mu, sd = fit._predictive_at(Xt)
    ys = to_numpy(yt)  # (R, m), checked finite and one per used row of X
    # a copy: a pandas column is a read-only view (copy-on-write), which torch warns about
    m_t = fit._trials_at(X, None if trials is None else np.array(trials, dtype=float), w.shape[1],
                         "predictive_checks", kept)
    m = None if m_t is None else to_numpy(m_t)
    ll = np.array([_mixture_loglik(ys[r], w[r], mu[r], sd[r], fit.spec.response, None if m is None else m[r])
                   for r in range(R)])
    return {"w": w, "mu": mu, "sd": sd, "y": ys, "m": m, "c": None, "loglik": ll}


def predictive_checks(fit: MLEFit, X: Any = None, y: Any = None, *, trials: Any = None) -> pd.DataFrame:
    r"""Observed against fitted mean, variance and share of zeros, Pearson dispersion, log-likelihood, df, BIC.

    The formulas are in the module docstring (:mod:`moestat.fit.checks`); the fitted moments of each row come
    from :func:`mixture_moments` at the fitted gate weights and expert means.

    Parameters
    ----------
    fit : MLEFit
        A fit of :func:`moestat.fit_mle` (any family; batched fits give one row per replicate).
    X : array (m, d) or DataFrame, optional
        Rows to check (a frame goes through a formula fit's formula).  Default: the training data, with the fit's
        case weights and its own log-likelihood.  On new rows the log-likelihood is
        :math:`\sum_t\log\sum_i\pi_i(x_t)f_i(y_t\mid x_t)`, computed with scipy's densities.
    y : array (m,), optional
        The responses of ``X`` (a formula fit reads them from a frame ``X`` holding the response column).
    trials : array (m,), optional
        A fit with binomial trials: the new rows' numbers of trials.

    Returns
    -------
    DataFrame
        One row per replicate: ``rep`` and :data:`CHECK_COLUMNS` (``n`` is the sum of the case weights; the zero
        shares are NaN for Gaussian experts).

    Examples
    --------
    >>> fit = ms.fit_mle(formula="visits ~ age", data=df, k=2, family="poisson")  # doctest: +SKIP
    >>> predictive_checks(fit)[["observed_zero_share", "fitted_zero_share", "pearson_dispersion"]]  # doctest: +SKIP
    """
    from .results import MLEFit

    if not isinstance(fit, MLEFit):
        raise TypeError(f"fit must be an MLEFit (from moestat.fit_mle), got {type(fit).__name__}.")
    d = _fit_data(fit, X, y, trials)
    response = fit.spec.response
    rows = []
    for r in range(fit.n_reps):
        m = None if d["m"] is None else d["m"][r]
        mean, var, p0 = mixture_moments(d["w"][r], d["mu"][r], d["sd"][r], response, m)
        c = None if d["c"] is None else d["c"][r]
        row = _check_row(d["y"][r], mean, var, None if response == "gaussian" else p0, d["loglik"][r],
                         fit.df_model, c)
        rows.append({"rep": r, **row})
    return pd.DataFrame(rows, columns=["rep", *CHECK_COLUMNS])


def count_model_checks(result: Any) -> pd.DataFrame:
    r"""The row of :func:`predictive_checks` for a fitted statsmodels count regression, on its own data.

    The conditional mean, variance and :math:`P(y = 0\mid x)` come from the model itself
    (``result.predict(which="mean" | "var" | "prob")``, statsmodels >= 0.14), so any of its count models
    works: ``Poisson``, ``NegativeBinomial`` (NB2: :math:`\mathrm{Var} = \mu + \alpha\mu^2`,
    :math:`P(0) = (1 + \alpha\mu)^{-1/\alpha}`; NB1), ``GeneralizedPoisson``, the zero-inflated models.
    ``df`` counts every estimated parameter (NB2's :math:`\alpha` included).

    Parameters
    ----------
    result : statsmodels count-model results
        E.g. ``statsmodels.formula.api.negativebinomial(formula, data).fit()``.

    Returns
    -------
    DataFrame
        One row with :data:`CHECK_COLUMNS`.
    """
    model = getattr(result, "model", None)
    if model is None or not all(hasattr(result, a) for a in ("predict", "llf", "params")):
        raise TypeError(f"result must be a fitted statsmodels count model (e.g. smf.negativebinomial(...).fit()), "
                        f"got {type(result).__name__}.")
    try:
        variance = np.asarray(result.predict(which="var"), dtype=float)
        p_zero = np.asarray(result.predict(which="prob", y_values=[0]), dtype=float).reshape(-1)
    except (TypeError, ValueError, NotImplementedError) as err:
        raise TypeError(f"result ({type(model).__name__}) does not predict variances and probabilities "
                        "(predict(which='var' | 'prob')); pass a statsmodels count model's result "
                        "(Poisson, NegativeBinomial, GeneralizedPoisson, zero-inflated).") from err
    y = np.asarray(model.endog, dtype=float)
    mean = np.asarray(result.predict(which="mean"), dtype=float)
    row = _check_row(y, mean, variance, p_zero, float(result.llf), len(np.asarray(result.params)))
    return pd.DataFrame([row], columns=list(CHECK_COLUMNS))


def compare_glm(fit: MLEFit, glm_result: Any) -> pd.DataFrame:
    r"""A one-expert fit against a statsmodels GLM (or other likelihood model) with the same terms.

    A mixture with :math:`k = 1` is the expert's GLM (McCullagh & Nelder 1989): both should reach the same
    maximum likelihood estimate and the same observed-information standard errors.  Terms are matched by name
    (moestat's ``const`` is statsmodels' ``Intercept`` in a formula model).  For Gaussian experts statsmodels
    scales its SEs by the residual variance with :math:`n - p` degrees of freedom, moestat by the maximum
    likelihood :math:`\hat\sigma^2`, so their SEs differ by :math:`\sqrt{n/(n-p)}`.

    Parameters
    ----------
    fit : MLEFit
        A single (not batched) fit with ``k = 1``.
    glm_result : statsmodels results
        With ``params``, ``bse`` (Series named by term) and ``llf``.

    Returns
    -------
    DataFrame
        One row per expert coefficient (``term`` as statsmodels names it, ``moestat``, ``statsmodels``,
        ``se_moestat``, ``se_statsmodels``, ``abs_diff``, ``se_rel_diff``), then a ``loglik`` row.
    """
    if fit.spec.k != 1 or not fit.single:
        raise ValueError(f"compare_glm needs a single fit with k = 1, got k = {fit.spec.k} and {fit.n_reps} "
                         "replicate(s); fit with k=1 (or fit.select(rep)) to compare with a GLM.")
    params, bse = getattr(glm_result, "params", None), getattr(glm_result, "bse", None)
    if not isinstance(params, pd.Series) or not isinstance(bse, pd.Series):
        raise TypeError("glm_result must be a statsmodels results object with named params (fit it from a formula "
                        f"or a DataFrame), got {type(glm_result).__name__}.")
    ours = fit.to_frame()
    ours = ours[ours["block"] == "expert"]
    names = [c if c in params.index or c != "const" else "Intercept" for c in ours["coef"]]
    absent = [c for c in names if c not in params.index]
    if absent:
        raise ValueError(f"the GLM has no term(s) {absent} (its terms: {list(params.index)}); fit it with the same "
                         "formula as the mixture.")
    out = pd.DataFrame({"term": names, "moestat": ours["estimate"].to_numpy(),
                        "statsmodels": params[names].to_numpy(), "se_moestat": ours["std_error"].to_numpy(),
                        "se_statsmodels": bse[names].to_numpy()})
    out["abs_diff"] = (out["moestat"] - out["statsmodels"]).abs()
    out["se_rel_diff"] = (out["se_moestat"] / out["se_statsmodels"] - 1).abs()
    llf = float(glm_result.llf)
    loglik = pd.DataFrame([{"term": "loglik", "moestat": float(fit.loglik), "statsmodels": llf,
                            "abs_diff": abs(float(fit.loglik) - llf)}])
    return pd.concat([out, loglik], ignore_index=True)


def restart_logliks(fit: MLEFit) -> pd.DataFrame:
    r"""Every random start's final log-likelihood and its gap to the best, :math:`\max_s \ell_s - \ell_s`.

    Many starts far below the best mean a likelihood with many local maxima; a best value reached by one start
    only says that better maxima may remain (McLachlan & Peel 2000, §2.12).  A start that EM's screening
    abandoned keeps the value where it stopped.

    Returns
    -------
    DataFrame
        One row per (replicate, start): ``rep``, ``start``, ``loglik``, ``gap_to_best``.
    """
    ll = np.asarray(fit.restart_loglik, dtype=float).reshape(fit.n_reps, -1)
    gap = np.nanmax(ll, axis=1, keepdims=True) - ll
    R, S = ll.shape
    return pd.DataFrame({"rep": np.repeat(np.arange(R), S), "start": np.tile(np.arange(S), R),
                         "loglik": ll.ravel(), "gap_to_best": gap.ravel()})
