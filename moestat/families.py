r"""GLM expert families and the batched IRLS M-step of a mixture of GLM experts.

A *GLM expert* (Jordan & Jacobs 1994, Neural Computation 6, §3; McCullagh & Nelder 1989, *Generalized Linear
Models*, 2nd ed., ch. 2) models the response of expert :math:`j` by an exponential family with canonical
parameter :math:`\eta_j = z^\top\beta_j`, :math:`z = (1, x)`:

.. math:: \log f(y;\eta, \phi) = \frac{m\,[y\eta - b(\eta)]}{\phi} + c(y, m, \phi),\qquad
          \mu = b'(\eta) = g^{-1}(\eta),\qquad \mathrm{Var}(y) = \phi\, V(\mu)/m.

========== ========== ======================== ====================== ============================ ====================
family     link       :math:`b(\eta)`          :math:`V(\mu)`         :math:`\phi`                 response
========== ========== ======================== ====================== ============================ ====================
gaussian   identity   :math:`\eta^2/2`         1                      variance :math:`\sigma^2`    real
poisson    log        :math:`e^\eta`           :math:`\mu`            1                            counts 0, 1, 2, ...
binomial   logit      :math:`\log(1+e^\eta)`   :math:`\mu(1-\mu)`     1                            proportion in [0, 1]
========== ========== ======================== ====================== ============================ ====================

**Binomial convention** (statsmodels' ``GLM(..., family=Binomial(), var_weights=m)``): the response ``y`` is the
*proportion* of successes in ``m`` trials, ``m * y`` successes; ``trials=None`` means :math:`m = 1` (Bernoulli,
``y`` in {0, 1}).  The log-density is the full binomial log-pmf
:math:`\log\binom{m}{my} + my\log\mu + m(1-y)\log(1-\mu)`.  The trials ``m`` enter every formula below as
prior weights; *case* (frequency) weights and EM responsibilities are separate and multiply them.

Every link here is canonical, so Fisher scoring is Newton's method and the IRLS working quantities are
(McCullagh & Nelder 1989, §2.5)

.. math:: w^{\mathrm{IRLS}} = m\,V(\mu),\qquad z^{\mathrm{IRLS}} = \eta + \frac{y - \mu}{V(\mu)}.

The expert M-step of EM (Jordan & Jacobs 1994, §4) maximises, for every expert :math:`j` separately,

.. math:: Q_j(\beta_j) = \sum_t w_{tj}\, m_t\,[y_t\eta_{tj} - b(\eta_{tj})],\qquad
          \eta_{tj} = z_t^\top\beta_j + o_{tj},

with :math:`w_{tj}` = responsibility :math:`\times` case weight and :math:`o` an optional offset; its score
equations are :math:`\sum_t w_{tj} m_t z_t (y_t - \mu_{tj}) = 0`.  :func:`irls_weighted` solves them for every
(replicate, restart, expert) lane at once.  All tensors carry moestat's leading axes (R, S) = (replicates,
restarts): design ``Z`` (R, n, p), response ``y`` (R, n), weights ``w`` (R, S, n, k), coefficients
``beta`` (R, S, k, p).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

Tensor = torch.Tensor

__all__ = ["FAMILIES", "Family", "IRLSInfo", "dispersion_update", "get_family", "initial_beta", "irls_weighted",
           "normal_log_density"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

_MAX_HALVINGS = 30  # step sizes 1, 1/2, ..., 2^-29 in the step-halving line search
_ROUNDING = 64.0  # an increase below 64 ulps of the objective's terms is lost in rounding
_INTEGER_TOL = 1e-8  # relative tolerance of the integer checks on counts (float round-off of m * y)


def normal_log_density(resid: torch.Tensor, *, sd: torch.Tensor | float | None = None,
                       var: torch.Tensor | None = None) -> torch.Tensor:
    r"""Gaussian log-density of residuals, the one formula every likelihood in moestat uses.

    .. math:: \log\mathcal N(y; \mu, \sigma^2) = -\frac{(y - \mu)^2}{2\sigma^2} - \log\sigma
              - \tfrac12\log(2\pi),

    with ``resid`` :math:`= y - \mu`.  Pass the standard deviation ``sd`` (a tensor or a float) or the
    variance ``var`` (a tensor; saves the square root in EM, whose M-step estimates variances); either must
    broadcast against ``resid``.
    """
    if (sd is None) == (var is None):
        raise TypeError("normal_log_density needs exactly one of sd= and var=.")
    # the constants join the (small) scale term before it meets the (large) residual term: one full-size pass less
    if var is not None:
        return -0.5 * (resid * resid) / var - (0.5 * torch.log(var) + _HALF_LOG_2PI)
    if sd is None:  # unreachable (checked above); narrows the type
        raise TypeError("normal_log_density needs exactly one of sd= and var=.")
    z = resid / sd
    log_sd = torch.log(sd) if isinstance(sd, torch.Tensor) else math.log(sd)
    return -0.5 * z * z - (log_sd + _HALF_LOG_2PI)


# ------------------------------------------------------------------ response checks
def _as_numpy(name: str, value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got an array of dtype {arr.dtype}; convert it to floats.")
    return arr.astype(np.float64, copy=False)


def _first_bad(arr: np.ndarray, bad: np.ndarray) -> str:
    idx = np.flatnonzero(bad.ravel())
    return f"{int(idx.size)} entries, e.g. {float(arr.ravel()[idx[0]]):g} at flat position {int(idx[0])}"


def _check_finite(name: str, arr: np.ndarray) -> None:
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name} must be finite; it has NaN or infinite values ({_first_bad(arr, bad)}). "
                         "Remove or impute those rows.")


def _is_integer(arr: np.ndarray) -> np.ndarray:
    result: np.ndarray = np.abs(arr - np.round(arr)) <= _INTEGER_TOL * np.maximum(1.0, np.abs(arr))
    return result


def _check_gaussian(y: Any, trials: Any = None) -> None:
    _no_trials("gaussian", trials)
    _check_finite("y", _as_numpy("y", y))


def _check_poisson(y: Any, trials: Any = None) -> None:
    _no_trials("poisson", trials)
    arr = _as_numpy("y", y)
    _check_finite("y", arr)
    bad = (arr < 0) | ~_is_integer(arr)
    if bad.any():
        raise ValueError(f"y must hold non-negative integer counts for family='poisson'; it has negative or "
                         f"non-integer values ({_first_bad(arr, bad)}). Pass counts, or use family='gaussian' "
                         "for a continuous response.")


def _check_binomial(y: Any, trials: Any = None) -> None:
    arr = _as_numpy("y", y)
    _check_finite("y", arr)
    bad = (arr < 0) | (arr > 1)
    if bad.any():
        raise ValueError(f"y must be a proportion in [0, 1] for family='binomial' ({_first_bad(arr, bad)} "
                         "are outside); for counts of successes out of m trials pass y = successes / m and "
                         "trials=m.")
    if trials is None:
        bad = ~_is_integer(arr)
        if bad.any():
            raise ValueError(f"y must be 0 or 1 for family='binomial' without trials ({_first_bad(arr, bad)} are "
                             "fractional); for proportions of m trials pass trials=m.")
        return
    m = _as_numpy("trials", trials)
    _check_finite("trials", m)
    bad = (m <= 0) | ~_is_integer(m)
    if bad.any():
        raise ValueError(f"trials must be positive integers (numbers of binomial trials); got "
                         f"{_first_bad(m, bad)}.")
    try:
        successes = np.broadcast_to(arr * m, np.broadcast_shapes(arr.shape, m.shape))
    except ValueError:
        raise ValueError(f"trials has shape {m.shape}, which does not broadcast against y of shape {arr.shape}; "
                         "pass one number of trials per observation.") from None
    bad = ~_is_integer(successes)
    if bad.any():
        raise ValueError(f"y * trials must be whole numbers of successes for family='binomial' "
                         f"({_first_bad(successes, bad)}); y is the proportion of successes out of trials.")


def _no_trials(name: str, trials: Any) -> None:
    if trials is not None:
        raise ValueError(f"trials is only used by family='binomial', not family={name!r}; drop it "
                         "(case weights go into the IRLS weights w).")


# ------------------------------------------------------------------ log-densities (full, with constants)
def _log1p_exp(eta: Tensor) -> Tensor:
    r""":math:`\log(1 + e^\eta)`, exact for every :math:`\eta` (torch's ``softplus`` returns :math:`\eta` itself
    above 20, an error of :math:`e^{-20} \approx 2\times 10^{-9}` per observation)."""
    return eta.clamp_min(0.0) + torch.log1p(torch.exp(-eta.abs()))


def _gaussian_log_density(y: Tensor, eta: Tensor, dispersion: Tensor | float | None = None,
                          trials: Tensor | None = None) -> Tensor:
    _no_trials("gaussian", trials)
    if dispersion is None:
        raise ValueError("dispersion (the Gaussian variance sigma^2) is required for family='gaussian'.")
    var = dispersion if isinstance(dispersion, torch.Tensor) else torch.as_tensor(dispersion, dtype=eta.dtype,
                                                                                   device=eta.device)
    return normal_log_density(y - eta, var=var)


def _poisson_log_density(y: Tensor, eta: Tensor, dispersion: Tensor | float | None = None,
                         trials: Tensor | None = None) -> Tensor:
    _no_trials("poisson", trials)
    return y * eta - torch.exp(eta) - torch.lgamma(y + 1.0)


def _binomial_log_density(y: Tensor, eta: Tensor, dispersion: Tensor | float | None = None,
                          trials: Tensor | None = None) -> Tensor:
    if trials is None:
        log_choose: Tensor | float = 0.0  # log C(1, y) = 0 for y in {0, 1}
        kernel = y * eta - _log1p_exp(eta)
    else:
        s = trials * y
        log_choose = torch.lgamma(trials + 1.0) - torch.lgamma(s + 1.0) - torch.lgamma(trials - s + 1.0)
        kernel = trials * (y * eta - _log1p_exp(eta))
    return kernel + log_choose


# ------------------------------------------------------------------ the family object
@dataclass(frozen=True)
class Family:
    r"""One exponential family of GLM experts with its canonical link (see the module docstring).

    Attributes
    ----------
    name : str
        ``"gaussian"``, ``"poisson"`` or ``"binomial"``.
    link : str
        Name of the (canonical) link :math:`g`: ``"identity"``, ``"log"`` or ``"logit"``.
    has_dispersion : bool
        Whether the family has a free dispersion :math:`\phi` (the Gaussian variance); fixed at 1 otherwise.
    inverse_link : callable
        :math:`\mu = g^{-1}(\eta)`, elementwise on tensors.
    link_function : callable
        :math:`\eta = g(\mu)`, elementwise on tensors.
    variance : callable
        The variance function :math:`V(\mu)`.
    cumulant : callable
        The cumulant function :math:`b(\eta)`, with :math:`b'(\eta) = \mu`.
    log_density : callable
        ``log_density(y, eta, dispersion=None, trials=None)``: the full log-density (normalising constants
        included) of ``y`` given the linear predictor ``eta``, elementwise with broadcasting.  ``dispersion`` is
        the Gaussian *variance* (required for gaussian, ignored by the others); ``trials`` the binomial
        :math:`m` (``None`` = 1; must be ``None`` for the other families).
    check_response : callable
        ``check_response(y, trials=None)`` raises ``ValueError`` naming ``y`` (or ``trials``) when the data
        are outside the family's support: non-finite values (all), negative or non-integer counts (poisson),
        values outside [0, 1] or non-integer successes ``m * y`` (binomial).
    """

    name: str
    link: str
    has_dispersion: bool
    inverse_link: Callable[[Tensor], Tensor] = field(repr=False)
    link_function: Callable[[Tensor], Tensor] = field(repr=False)
    variance: Callable[[Tensor], Tensor] = field(repr=False)
    cumulant: Callable[[Tensor], Tensor] = field(repr=False)
    log_density: Callable[..., Tensor] = field(repr=False)
    check_response: Callable[..., None] = field(repr=False)
    _start_mu: Callable[[Tensor, Tensor, Tensor | None], Tensor] = field(repr=False)

    def log_kernel(self, y: Tensor, eta: Tensor, trials: Tensor | None = None) -> Tensor:
        r"""The part of :math:`\phi\log f` that depends on :math:`\eta`: :math:`m[y\eta - b(\eta)]`.

        The Gaussian kernel is written :math:`-(y-\eta)^2/2`, which differs from :math:`y\eta - \eta^2/2` by
        :math:`y^2/2` (free of :math:`\eta`) and keeps full precision near the optimum.
        """
        if self.name == "gaussian":
            resid = y - eta
            return -0.5 * resid * resid
        kernel = y * eta - self.cumulant(eta)
        return kernel if trials is None else trials * kernel

    def working(self, y: Tensor, eta: Tensor, trials: Tensor | None = None) -> tuple[Tensor, Tensor]:
        r"""Canonical-link IRLS working response and weight (McCullagh & Nelder 1989, §2.5).

        Returns :math:`(z, w) = (\eta + (y - \mu)/V(\mu),\; m V(\mu))` with :math:`\mu = g^{-1}(\eta)`; one
        weighted least-squares fit of :math:`z` on the design with weights :math:`w` is one Newton step.
        :math:`V(\mu)` is floored at the smallest positive double so a saturated fit gives large, finite values.
        """
        mu = self.inverse_link(eta)
        v = self.variance(mu).clamp_min(torch.finfo(eta.dtype).tiny)
        z = eta + (y - mu) / v
        return z, v if trials is None else trials * v


def _binomial_start(y: Tensor, w: Tensor, trials: Tensor | None) -> Tensor:
    m = 1.0 if trials is None else trials
    return (m * y + 0.5) / (m + 1.0)


def _poisson_start(y: Tensor, w: Tensor, trials: Tensor | None) -> Tensor:
    # the weighted mean of each lane (statsmodels uses the plain mean: (y + mean y) / 2), w of shape (..., n, k)
    ybar = (w * y).sum(-2, keepdim=True) / w.sum(-2, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    return (y + ybar) / 2.0 + 0.0 * w


def _gaussian_start(y: Tensor, w: Tensor, trials: Tensor | None) -> Tensor:
    return y + 0.0 * w


def _ones_like(mu: Tensor) -> Tensor:
    return torch.ones_like(mu)


FAMILIES: dict[str, Family] = {
    "gaussian": Family("gaussian", "identity", True, inverse_link=lambda eta: eta, link_function=lambda mu: mu,
                       variance=_ones_like, cumulant=lambda eta: 0.5 * eta * eta,
                       log_density=_gaussian_log_density, check_response=_check_gaussian,
                       _start_mu=_gaussian_start),
    "poisson": Family("poisson", "log", False, inverse_link=torch.exp, link_function=torch.log,
                      variance=lambda mu: mu, cumulant=torch.exp, log_density=_poisson_log_density,
                      check_response=_check_poisson, _start_mu=_poisson_start),
    "binomial": Family("binomial", "logit", False, inverse_link=torch.sigmoid, link_function=torch.logit,
                       variance=lambda mu: mu * (1.0 - mu), cumulant=_log1p_exp,
                       log_density=_binomial_log_density, check_response=_check_binomial,
                       _start_mu=_binomial_start),
}
"""The GLM expert families by name."""


def get_family(name: str | Family) -> Family:
    """The :class:`Family` called ``name`` (a :class:`Family` passes through).

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`FAMILIES`, listing the valid names.
    """
    if isinstance(name, Family):
        return name
    if not isinstance(name, str) or name not in FAMILIES:
        raise ValueError(f"family={name!r} is not supported; valid values are {sorted(FAMILIES)}.")
    return FAMILIES[name]


# ------------------------------------------------------------------ batched IRLS
class IRLSInfo(NamedTuple):
    """Diagnostics of :func:`irls_weighted` (``return_info=True``); every array has shape (R, S, k)."""

    converged: Tensor  # bool: the last Newton step met the tolerance
    n_iter: Tensor  # long: Newton iterations that moved the lane
    objective: Tensor  # the penalised M-step objective at the returned beta
    history: Tensor  # (T + 1, R, S, k): the objective before each iteration and at the end


def _check_shapes(Z: Tensor, y: Tensor, w: Tensor, beta: Tensor) -> None:
    if Z.ndim != 3:
        raise ValueError(f"Z must have shape (R, n, p), got {tuple(Z.shape)}.")
    R, n, p = Z.shape
    if tuple(y.shape) != (R, n):
        raise ValueError(f"y must have shape (R, n) = {(R, n)} to match Z, got {tuple(y.shape)}.")
    if w.ndim != 4 or w.shape[0] != R or w.shape[2] != n:
        raise ValueError(f"w must have shape (R, S, n, k) with R={R}, n={n}, got {tuple(w.shape)}.")
    S, k = w.shape[1], w.shape[3]
    if tuple(beta.shape) != (R, S, k, p):
        raise ValueError(f"beta_init must have shape (R, S, k, p) = {(R, S, k, p)}, got {tuple(beta.shape)}.")


def _linear_predictor(Z: Tensor, beta: Tensor, offset: Tensor | None) -> Tensor:
    """:math:`\\eta_{tj} = z_t^\\top\\beta_j + o_{tj}`, shape (R, S, n, k)."""
    eta = torch.einsum("rnp,rskp->rsnk", Z, beta)
    return eta if offset is None else eta + offset


def _objective(family: Family, Z: Tensor, y4: Tensor, w: Tensor, beta: Tensor, beta0: Tensor,
               offset: Tensor | None, m4: Tensor | None, ridge: float, prox: float) -> tuple[Tensor, Tensor]:
    r"""Penalised M-step objective :math:`Q_j(\beta) - \tfrac{\lambda}{2}\|\beta\|^2
    - \tfrac{\rho}{2}\|\beta-\beta^{0}\|^2`, shape (R, S, k), and the sum of the absolute values of its terms
    (which bounds its floating-point rounding error, in units of the machine epsilon)."""
    eta = _linear_predictor(Z, beta, offset)
    terms = w * family.log_kernel(y4, eta, m4)
    q, scale = terms.sum(-2), terms.abs().sum(-2)
    if ridge:
        pen = 0.5 * ridge * (beta * beta).sum(-1)
        q, scale = q - pen, scale + pen
    if prox:
        pen = 0.5 * prox * ((beta - beta0) ** 2).sum(-1)
        q, scale = q - pen, scale + pen
    return q, scale


def _newton_direction(family: Family, Z: Tensor, y4: Tensor, w: Tensor, beta: Tensor, beta0: Tensor,
                      offset: Tensor | None, m4: Tensor | None, ridge: float,
                      prox: float) -> tuple[Tensor, Tensor, Tensor]:
    r"""Newton (= Fisher scoring) direction of every lane, its decrement :math:`g^\top H^{-1} g` (twice the increase
    the quadratic model predicts) and whether its solve succeeded.

    Gradient :math:`g_j = \sum_t w_{tj} m_t (y_t - \mu_{tj}) z_t - \lambda\beta_j - \rho(\beta_j - \beta_j^0)`,
    negative Hessian :math:`H_j = \sum_t w_{tj} m_t V(\mu_{tj}) z_t z_t^\top + (\lambda + \rho) I`.
    """
    eta = _linear_predictor(Z, beta, offset)
    mu = family.inverse_link(eta)
    wm = w if m4 is None else w * m4
    grad = torch.einsum("rnp,rsnk->rskp", Z, wm * (y4 - mu))
    zw = (wm * family.variance(mu)).unsqueeze(-1) * Z[:, None, :, None, :]  # (R, S, n, k, p)
    H = torch.einsum("rsnkp,rnq->rskpq", zw, Z)
    if ridge or prox:
        grad = grad - ridge * beta - prox * (beta - beta0)
        H = H + (ridge + prox) * torch.eye(Z.shape[-1], dtype=Z.dtype, device=Z.device)
    delta, info = torch.linalg.solve_ex(H, grad.unsqueeze(-1))
    delta = delta.squeeze(-1)
    ok = (info == 0) & torch.isfinite(delta).all(-1)
    delta = torch.where(ok.unsqueeze(-1), delta, torch.zeros_like(delta))
    return delta, (grad * delta).sum(-1), ok


def irls_weighted(Z: Tensor, y: Tensor, w: Tensor, beta_init: Tensor, family: str | Family, *,
                  max_iter: int = 50, tol: float = 1e-10, ridge: float = 0.0, prox: float = 0.0,
                  offset: Tensor | None = None, trials: Tensor | None = None,
                  return_info: bool = False) -> Tensor | tuple[Tensor, IRLSInfo]:
    r"""Weighted GLM fit of every expert of every (replicate, restart) at once: the GLM-expert M-step.

    Maximises, for each lane :math:`(r, s, j)`, the penalised M-step objective

    .. math:: Q_j(\beta_j) = \sum_t w_{tj}\, m_t\, [y_t\eta_{tj} - b(\eta_{tj})]
              - \tfrac{\lambda}{2}\|\beta_j\|^2 - \tfrac{\rho}{2}\|\beta_j - \beta_j^{\mathrm{init}}\|^2,
              \qquad \eta_{tj} = z_t^\top\beta_j + o_{tj},

    whose stationarity conditions with :math:`\lambda = \rho = 0` are the weighted score equations
    :math:`\sum_t w_{tj} m_t z_t (y_t - \mu_{tj}) = 0` (Jordan & Jacobs 1994, §4).  Each iteration is a
    Newton step (Fisher scoring = IRLS for canonical links; McCullagh & Nelder 1989, §2.5)
    :math:`\beta \leftarrow \beta + t H^{-1} g` with step halving :math:`t = 1, 1/2, \ldots, 2^{-29}`: the
    longest step that does not lower :math:`Q_j` is taken, so the objective never decreases (a generalised EM
    M-step; Dempster, Laird & Rubin 1977).  Near the optimum, where the increase :math:`g^\top H^{-1}g/2` predicted
    by the quadratic model is below 64 ulps of :math:`\sum_t |w_{tj}\,\mathrm{kernel}_{tj}|` (so no comparison
    of objective values can see it), the full Newton step is taken unchecked; this keeps the quadratic convergence
    to machine precision and can lower :math:`Q_j` by rounding error only.  A lane whose Newton step is at most
    ``tol * (1 + max|beta|)`` (largest absolute entry) is converged and frozen; a lane for which no step raises
    the objective, or whose Hessian is singular, stays where it is.

    Parameters
    ----------
    Z : Tensor (R, n, p)
        Design, usually :math:`(1, X)`; shared by all restarts and experts of a replicate.
    y : Tensor (R, n)
        Response (binomial: proportions in [0, 1], see ``trials``).
    w : Tensor (R, S, n, k)
        Non-negative weights: responsibilities times case weights.
    beta_init : Tensor (R, S, k, p)
        Starting coefficients; pass the previous EM iterate so the M-step objective cannot decrease.
    family : str or Family
        ``"gaussian"``, ``"poisson"`` or ``"binomial"``.
    max_iter : int
        Newton iterations at most (Gaussian: one step is exact).
    tol : float
        Convergence tolerance on the Newton step (relative to ``1 + max|beta|``).
    ridge : float
        :math:`\lambda \ge 0`, an L2 penalty on all coefficients (changes the estimator).
    prox : float
        :math:`\rho \ge 0`, a proximal penalty centred at ``beta_init``; it is zero at the start, so the
        unpenalised :math:`Q_j` still never decreases and fixed points are the unpenalised ones.  It keeps the
        Newton system non-singular for experts whose weights vanish (like :func:`moestat.fit.em.weighted_ls`).
    offset : Tensor, optional
        Known part of the linear predictor, broadcastable to (R, S, n, k) (e.g. ``log(exposure)`` (R, 1, n, 1)
        for Poisson, or shared-coefficient terms).
    trials : Tensor (R, n), optional
        Binomial trials :math:`m` (``None`` = 1).
    return_info : bool
        Also return an :class:`IRLSInfo`.

    Returns
    -------
    Tensor (R, S, k, p), or (beta, IRLSInfo) with ``return_info=True``.
    """
    fam = get_family(family)
    _check_shapes(Z, y, w, beta_init)
    if trials is not None and fam.name != "binomial":
        _no_trials(fam.name, trials)
    if not (ridge >= 0 and prox >= 0 and math.isfinite(ridge) and math.isfinite(prox)):
        raise ValueError(f"ridge and prox must be finite and >= 0, got ridge={ridge}, prox={prox}.")
    y4 = y[:, None, :, None]
    m4 = None if trials is None else trials[:, None, :, None]
    beta0 = beta_init
    beta = beta_init.clone()
    q, scale = _objective(fam, Z, y4, w, beta, beta0, offset, m4, ridge, prox)
    active = torch.isfinite(q)
    converged = torch.zeros_like(active)
    n_iter = torch.zeros(q.shape, dtype=torch.long, device=q.device)
    history = [q]
    for _ in range(max_iter):
        if not bool(active.any()):
            break
        delta, decrement, ok = _newton_direction(fam, Z, y4, w, beta, beta0, offset, m4, ridge, prox)
        small = delta.abs().amax(-1) <= tol * (1.0 + beta.abs().amax(-1))
        # an increase below the objective's rounding error cannot be measured: take the full Newton step there
        unmeasurable = decrement <= _ROUNDING * torch.finfo(q.dtype).eps * scale
        beta, q, scale, moved = _step_halving(fam, Z, y4, w, beta, beta0, offset, m4, ridge, prox, delta, q, scale,
                                              active & ok, unmeasurable)
        n_iter += moved.long()
        converged |= active & ok & small
        active &= ok & moved & ~small
        history.append(q)
    if not return_info:
        return beta
    return beta, IRLSInfo(converged, n_iter, q, torch.stack(history))


def _step_halving(fam: Family, Z: Tensor, y4: Tensor, w: Tensor, beta: Tensor, beta0: Tensor,
                  offset: Tensor | None, m4: Tensor | None, ridge: float, prox: float, delta: Tensor,
                  q: Tensor, scale: Tensor, todo: Tensor,
                  unmeasurable: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Take the longest step ``t * delta`` (t = 1, 1/2, ...) that does not lower ``q`` in the lanes ``todo``
    (the full step in lanes whose predicted increase is ``unmeasurable``).

    Returns the new coefficients, objective, its rounding scale and the lanes that moved.
    """
    moved = torch.zeros_like(todo)
    t = 1.0
    for _ in range(_MAX_HALVINGS):
        if not bool(todo.any()):
            break
        cand = beta + t * delta
        qc, sc = _objective(fam, Z, y4, w, cand, beta0, offset, m4, ridge, prox)
        acc = todo & torch.isfinite(qc) & ((qc >= q) | unmeasurable)
        beta = torch.where(acc.unsqueeze(-1), cand, beta)
        q, scale = torch.where(acc, qc, q), torch.where(acc, sc, scale)
        moved |= acc
        unmeasurable = torch.zeros_like(unmeasurable)  # only the full step is taken unmeasured
        todo = todo & ~acc
        t *= 0.5
    return beta, q, scale, moved


def initial_beta(Z: Tensor, y: Tensor, w: Tensor, family: str | Family, *, trials: Tensor | None = None,
                 ridge: float = 0.0, offset: Tensor | None = None) -> Tensor:
    r"""Starting coefficients (R, S, k, p) by one IRLS step from the usual starting means.

    The starting means are those of statsmodels' GLM: :math:`\mu^0 = y` (gaussian, so the result is the exact
    weighted least-squares fit), :math:`(y + \bar y_j)/2` with :math:`\bar y_j` the :math:`w`-weighted mean
    of lane :math:`j` (poisson), :math:`(m y + 1/2)/(m + 1)` (binomial).  With :math:`\eta^0 = g(\mu^0)`, the
    step is the weighted least-squares fit of the working response :math:`\eta^0 + (y-\mu^0)/V(\mu^0)` with
    weights :math:`w\,m\,V(\mu^0)` (McCullagh & Nelder 1989, §2.5), plus ``ridge`` on the diagonal; an
    ``offset`` (the known part of the linear predictor, as in :func:`irls_weighted`) is taken off the working
    response.  Shapes as in :func:`irls_weighted`.
    """
    fam = get_family(family)
    beta_shape = (*w.shape[:2], w.shape[3], Z.shape[-1])
    _check_shapes(Z, y, w, torch.zeros(beta_shape, dtype=Z.dtype, device=Z.device))
    y4 = y[:, None, :, None]
    m4 = None if trials is None else trials[:, None, :, None]
    mu0 = fam._start_mu(y4, w, m4)
    z, wi = fam.working(y4, fam.link_function(mu0), m4)
    if offset is not None:
        z = z - offset
    ww = w * wi
    zw = ww.unsqueeze(-1) * Z[:, None, :, None, :]
    A = torch.einsum("rsnkp,rnq->rskpq", zw, Z)
    b = torch.einsum("rsnkp,rsnk->rskp", zw, z)
    if ridge:
        A = A + ridge * torch.eye(Z.shape[-1], dtype=Z.dtype, device=Z.device)
    sol, info = torch.linalg.solve_ex(A, b.unsqueeze(-1))
    sol = sol.squeeze(-1)
    ok = (info == 0) & torch.isfinite(sol).all(-1)
    return torch.where(ok.unsqueeze(-1), sol, torch.zeros_like(sol))


def dispersion_update(y: Tensor, mu: Tensor, w: Tensor, *, floor: Tensor | float = 0.0, old: Tensor | None = None,
                      prox: float = 0.0) -> Tensor:
    r"""Closed-form M-step of the Gaussian experts' variances, shape (R, S, k).

    .. math:: \sigma_j^2 = \max\Big(\frac{\sum_t w_{tj}(y_t - \mu_{tj})^2 + \rho\,\sigma_j^{2,\mathrm{old}}}
              {\sum_t w_{tj} + \rho},\ \sigma^2_{\min}\Big),

    the maximiser of :math:`\sum_t w_{tj}\log\mathcal N(y_t;\mu_{tj},\sigma_j^2)` (Jordan & Jacobs 1994, §4;
    the ML estimate, divisor :math:`\sum_t w_{tj}`, not the unbiased :math:`n - p`) over
    :math:`\sigma_j^2 \ge \sigma^2_{\min}`; the proximal weight :math:`\rho` (``prox``, needs ``old``) keeps a
    component whose weights vanish at its old variance, as in :mod:`moestat.fit.em`.

    Parameters
    ----------
    y : Tensor
        The responses, (R, n).
    mu : Tensor
        The expert means, (R, S, n, k).
    w : Tensor
        The weights, (R, S, n, k).
    floor : float or Tensor
        The variance floor, broadcastable to (R, S, k).
    old : Tensor, optional
        The previous variances (R, S, k), required when ``prox > 0``.
    """
    if prox and old is None:
        raise ValueError("dispersion_update(prox > 0) needs old=, the previous variances (R, S, k).")
    resid = y[:, None, :, None] - mu
    num = (w * resid * resid).sum(-2)
    den = w.sum(-2)
    if prox and old is not None:
        num, den = num + prox * old, den + prox
    var = num / den
    floor_t = floor if isinstance(floor, torch.Tensor) else torch.as_tensor(floor, dtype=var.dtype,
                                                                            device=var.device)
    return torch.maximum(var, floor_t)
