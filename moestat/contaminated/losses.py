r"""Parameter losses of a contaminated MoE: how far an estimate is from the truth, in the coordinates in which the
maximum-likelihood estimator converges at :math:`n^{-1/2}`.

Notation: :math:`\theta = (a, b, \nu)` the prompt's parameters, :math:`\theta_0` the frozen expert's (when it is a
Gaussian ridge expert of the prompt's family), :math:`\Delta^* = \theta^* - \theta_0` the distance of the true
prompt from it; :math:`\lVert\cdot\rVert` is the Euclidean norm.

**Constant gate** (Yan, Nguyen, Le, Akbarian & Ho, AISTATS 2025, arXiv:2410.12258):

.. math::

    D_{\mathrm{dist}} = |\hat\lambda - \lambda^*| + \lambda^* \lVert\hat\theta - \theta^*\rVert, \qquad
    D_{\mathrm{nondist}} = |\hat\lambda - \lambda^*|\,\lVert\Delta^*\rVert^2
        + \lambda^* \lVert\Delta^*\rVert\,\lVert\hat\theta - \theta^*\rVert .

**Softmax gate** :math:`\sigma(\beta^\top x + \tau)` (Yan, Nguyen, Le, Akbarian, Ho & Rinaldo, NeurIPS 2025,
arXiv:2505.18455):

.. math::

    D_{\mathrm{dist}} = \lVert\hat\beta - \beta^*\rVert + |\hat\tau - \tau^*| + \lVert\hat\theta - \theta^*\rVert,
    \qquad
    D_{\mathrm{nondist}} = \lVert\Delta^*\rVert\bigl(\lVert\hat\beta - \beta^*\rVert + |\hat\tau - \tau^*|\bigr)
        + \lVert\hat\theta - \theta^*\rVert .

The weights are those of the local expansion of :math:`p_{\hat G} - p_{G^*}` (see ``docs/contaminated.md``): the
prompt's information is proportional to :math:`\lambda^{*2}`, so :math:`\hat\theta` converges at
:math:`n^{-1/2}/\lambda^*` (prompt vanishing when :math:`\lambda^* \to 0`); when the prompt's family contains
:math:`f_0`, the first-order term identifies only :math:`\lambda\Delta` (constant gate) or
:math:`w(x)\Delta` (softmax gate), so :math:`\hat\lambda` is left to the second-order term
(:math:`n^{-1/2}/\lVert\Delta^*\rVert^2`) and the gate parameters to :math:`n^{-1/2}/\lVert\Delta^*\rVert`.  The
papers' theorem statements could not be read for this module (only their abstracts): these weights are derived
here and checked against the Fisher information (:func:`moestat.contaminated.fisher_information`) in the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .model import ContaminatedParams

__all__ = ["LOSSES", "contaminated_errors", "distinguishable_loss", "nondistinguishable_loss"]

LOSSES = ("distinguishable", "nondistinguishable")


def _pair(estimate: ContaminatedParams, truth: ContaminatedParams) -> tuple[ContaminatedParams, ContaminatedParams]:
    for name, value in (("estimate", estimate), ("truth", truth)):
        if not isinstance(value, ContaminatedParams):
            raise TypeError(f"{name} must be a ContaminatedParams, got {type(value).__name__}.")
    if estimate.gate != truth.gate:
        raise ValueError(f"estimate has gate={estimate.gate!r} but truth has gate={truth.gate!r}; compare fits with "
                         "their own truth's gate.")
    if estimate.d != truth.d:
        raise ValueError(f"estimate has d={estimate.d} but truth has d={truth.d}.")
    if truth.n_reps not in (1, estimate.n_reps):
        raise ValueError(f"truth has R={truth.n_reps} parameter sets but the estimate has R={estimate.n_reps}; give "
                         "one truth or one per replicate.")
    return estimate, truth


def _theta0(theta0: Any, d: int) -> np.ndarray:
    arr = np.asarray(theta0, dtype=float)
    if arr.shape != (d + 2,) or not np.isfinite(arr).all():
        raise ValueError(f"theta0 must be the frozen expert's finite (a0 (d), b0, nu0), a vector of length {d + 2}, "
                         f"got shape {arr.shape}; FrozenExpert.theta0() gives it.")
    return arr


def _blocks(estimate: ContaminatedParams, truth: ContaminatedParams) -> dict[str, np.ndarray]:
    """Per-replicate pieces: ``lam_err`` or ``gate_err`` (and ``beta_err``, ``tau_err``), ``prompt_err``, ``lam``."""
    prompt = np.linalg.norm(estimate.theta() - truth.theta(), axis=1)
    if estimate.gate == "constant":
        lam_true = np.broadcast_to(truth.lam, estimate.lam.shape)
        return {"lam_err": np.abs(estimate.lam - lam_true), "prompt_err": prompt, "lam": lam_true}
    beta = np.linalg.norm(estimate.gate_weight - truth.gate_weight, axis=1)
    tau = np.abs(estimate.gate_bias - truth.gate_bias)
    return {"beta_err": beta, "tau_err": tau, "gate_err": beta + tau, "prompt_err": prompt}


def distinguishable_loss(estimate: ContaminatedParams, truth: ContaminatedParams) -> np.ndarray:
    r"""The loss :math:`D_{\mathrm{dist}}` of the module docstring, one value per replicate of ``estimate``.

    Constant gate: :math:`|\hat\lambda - \lambda^*| + \lambda^*\lVert\hat\theta - \theta^*\rVert`; softmax gate:
    :math:`\lVert\hat\beta - \beta^*\rVert + |\hat\tau - \tau^*| + \lVert\hat\theta - \theta^*\rVert`.

    Examples
    --------
    >>> est = ContaminatedParams(weight=[1.0], bias=0.0, var=1.0, lam=0.5)
    >>> tru = ContaminatedParams(weight=[1.0], bias=0.4, var=1.3, lam=0.4)
    >>> round(float(distinguishable_loss(est, tru)[0]), 12)  # 0.1 + 0.4 * 0.5
    0.3
    """
    est, tru = _pair(estimate, truth)
    b = _blocks(est, tru)
    if est.gate == "constant":
        out: np.ndarray = b["lam_err"] + b["lam"] * b["prompt_err"]
    else:
        out = b["gate_err"] + b["prompt_err"]
    return out


def nondistinguishable_loss(estimate: ContaminatedParams, truth: ContaminatedParams, theta0: Any) -> np.ndarray:
    r"""The loss :math:`D_{\mathrm{nondist}}` of the module docstring, one value per replicate of ``estimate``.

    ``theta0`` is the frozen expert's :math:`(a_0, b_0, \nu_0)` (:meth:`FrozenExpert.theta0`);
    :math:`\Delta^* = \theta^* - \theta_0`.  Constant gate: :math:`|\hat\lambda - \lambda^*|\lVert\Delta^*\rVert^2 +
    \lambda^*\lVert\Delta^*\rVert\lVert\hat\theta - \theta^*\rVert`; softmax gate:
    :math:`\lVert\Delta^*\rVert(\lVert\hat\beta - \beta^*\rVert + |\hat\tau - \tau^*|) + \lVert\hat\theta -
    \theta^*\rVert`.
    """
    est, tru = _pair(estimate, truth)
    t0 = _theta0(theta0, est.d)
    delta = np.linalg.norm(np.broadcast_to(tru.theta(), est.theta().shape) - t0, axis=1)
    b = _blocks(est, tru)
    if est.gate == "constant":
        out: np.ndarray = b["lam_err"] * delta ** 2 + b["lam"] * delta * b["prompt_err"]
    else:
        out = delta * b["gate_err"] + b["prompt_err"]
    return out


def contaminated_errors(estimate: ContaminatedParams, truth: ContaminatedParams, theta0: Any = None
                        ) -> dict[str, np.ndarray]:
    r"""Every error of an estimate, one array (R,) each: ``prompt_err`` :math:`\lVert\hat\theta - \theta^*\rVert`;
    ``lam_err`` :math:`|\hat\lambda - \lambda^*|` (constant gate) or ``beta_err``, ``tau_err`` and ``gate_err``
    (their sum; softmax gate); ``loss_dist``; and, with ``theta0``, ``delta``
    (:math:`\lVert\Delta^*\rVert`) and ``loss_nondist`` (NaN without it)."""
    est, tru = _pair(estimate, truth)
    out = {k: v for k, v in _blocks(est, tru).items() if k != "lam"}
    out["loss_dist"] = distinguishable_loss(est, tru)
    R = est.n_reps
    if theta0 is None:
        out["delta"] = np.full(R, np.nan)
        out["loss_nondist"] = np.full(R, np.nan)
    else:
        t0 = _theta0(theta0, est.d)
        out["delta"] = np.linalg.norm(np.broadcast_to(tru.theta(), est.theta().shape) - t0, axis=1)
        out["loss_nondist"] = nondistinguishable_loss(est, tru, t0)
    return out
