r"""Nguyen, Akbarian & Ho (2024), "Is temperature sample efficient for softmax Gaussian mixture of experts?" (ICML
2024; arXiv:2401.13875): the rates it states, a simulation truth with a temperature, the scale invariance of the
affine gate, and a temperature error for studies, as data and functions.

The model is a Gaussian MoE fitted by maximum likelihood whose gate carries a temperature :math:`\tau > 0`
estimated jointly with the other parameters:

* dense-to-sparse gate: :math:`\pi_i(x) = \mathrm{softmax}_i\big((\beta_{1}^\top x + \beta_{0})/\tau\big)`,
  moestat's ``softmax`` gate with its ``temperature``;
* activation dense-to-sparse gate: the output of the linear layer goes through an activation :math:`\varphi`
  before the softmax, moestat's ``activation`` gate,
  :math:`\pi_i(x) = \mathrm{softmax}_i\big(\varphi(\beta_{1i}^\top x + \beta_{0i})/\tau\big)` with
  :math:`\varphi = \tanh` (:func:`moestat.gates.activation_scores`).

Only the abstract of the paper (and a third-party summary of it) could be read for this module; its body, the exact
parameter space, the theorem numbers and the simulation settings were not.  What the abstract states: because the
temperature interacts with the other parameters through partial differential equations, the parameter estimation
rates of the dense-to-sparse gate are slower than every polynomial rate and can be as slow as
:math:`O(1/\log n)`; under linear-independence conditions on the activation and its derivatives the activation
gate restores polynomial rates.  The third-party summary adds that the conditional density converges at the
parametric rate :math:`\tilde O(n^{-1/2})` in both models and gives :math:`\tilde O(n^{-1/2})` and
:math:`\tilde O(n^{-1/4})` as the activation gate's rates (exact- and over-specified); those rows say so in their
``note``.

moestat's reading of the interaction (checked numerically in the tests and in ``docs/temperature.md``): the affine
scores are homogeneous of degree one, :math:`(c\beta_0, c\beta_1, c\tau)` gives the gate of
:math:`(\beta_0, \beta_1, \tau)` for every :math:`c > 0` (:func:`rescale_gate`), i.e.
:math:`\tau\,\partial u/\partial\tau = -(\beta_0\,\partial u/\partial\beta_0 + \beta_1^\top\partial u/\partial\beta_1)`
for :math:`u = \exp((\beta_1^\top x + \beta_0)/\tau)`.  So :math:`\tau` is not identified from an affine gate, and
:func:`moestat.fit_mle` / :func:`moestat.fit_lse` refuse ``learn_temperature=True`` there
(:attr:`moestat.gates.Gate.temperature_identified`); with the activation gate it is identified and is fitted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_choice
from ..model import MoE
from ..params import Params
from ..simulators.truth import Truth

__all__ = ["GATES", "PARAMS", "REFERENCE", "TAU", "THEORY", "rescale_gate", "temperature_error_metric",
           "temperature_errors", "temperature_truth"]

REFERENCE = ("Nguyen, H., Akbarian, P. and Ho, N. (2024). Is temperature sample efficient for softmax Gaussian "
             "mixture of experts? Proceedings of the 41st International Conference on Machine Learning (ICML 2024), "
             "PMLR 235; arXiv:2401.13875.")

GATES = ("softmax", "activation")
"""The paper's gates in moestat: the dense-to-sparse gate (``softmax`` with a temperature) and the activation
dense-to-sparse gate (``activation``, :math:`\\varphi = \\tanh`)."""

_SRC = "nguyen2024_temperature"
_UNREAD = "the paper's body was not read: exponent from a third-party summary, unverified"

# One row per result, in the columns of :data:`moestat.rates.theory.THEORY_COLUMNS`.
THEORY: list[tuple[Any, ...]] = [
    (_SRC, "density estimation", "softmax|activation", "exact|over", "linear", "linear",
     "expected Hellinger distance of the conditional density", "hellinger", "n", "(log n / n)^{1/2}", 0.5,
     "power_log", "decay", "upper_bound", f"every k >= k*, temperature fitted; {_UNREAD}"),
    (_SRC, "parameter estimation (dense-to-sparse gate, temperature fitted)", "softmax", "exact|over", "linear",
     "linear", "temperature tau and gate parameters (beta_0, beta_1)", "err_temperature", "n",
     "slower than any polynomial, as slow as O(1/log n)", 1.0, "inverse_log", "decay", "slower_than_polynomial",
     "abstract: the temperature interacts with the gate parameters through a PDE. In moestat the affine gate is "
     "invariant to (c beta_0, c beta_1, c tau), so tau is not identified and fit_lse / fit_mle refuse "
     "learn_temperature for it (docs/temperature.md)"),
    (_SRC, "parameter estimation (activation dense-to-sparse gate), exact-specified atoms", "activation", "exact",
     "linear", "linear", "temperature, gate and expert parameters", "err_temperature", "n", "(log n / n)^{1/2}", 0.5,
     "power_log", "decay", "upper_bound",
     f"abstract: polynomial under linear-independence conditions on the activation and its derivatives; {_UNREAD}"),
    (_SRC, "parameter estimation (activation dense-to-sparse gate), over-specified atoms", "activation", "over",
     "linear", "linear", "parameters of atoms in Voronoi cells with two or more fitted atoms", "err_over_param", "n",
     "(log n / n)^{1/4}", 0.25, "power_log", "decay", "upper_bound",
     f"abstract: polynomial; k > k*; no moestat metric writes err_over_param for this paper yet; {_UNREAD}"),
]
"""The paper's rates as data (:func:`moestat.rates.theory_rates`)."""


# ----------------------------------------------------------------------------- the simulation truth
PARAMS = {"gate_bias": [0.5, -0.5], "gate_weight": [[3.0], [-2.0]], "expert_weight": [[1.0], [-1.5]],
          "expert_bias": [0.5, -0.3]}
r"""True atoms of :func:`temperature_truth`: :math:`d = 1`, :math:`k^* = 2`.  On inputs :math:`U[-1, 1]` the
activation gate's pre-activations :math:`\beta_{1i}x + \beta_{0i}` reach :math:`\pm 2.5` to :math:`3.5`, where
:math:`\tanh` saturates: a gate in its linear range (:math:`\tanh z \approx z`) would make the temperature almost
unidentified, like the affine gate's."""

TAU = 1.0
r"""The true temperature of :func:`temperature_truth` by default.  The weights' plateaus where :math:`\tanh` saturates,
:math:`\sigma(\pm 2/\tau)` for :math:`k = 2`, carry most of the information about :math:`\tau`; at :math:`\tau = 1`
they are 0.88 and 0.12, at :math:`\tau = 0.5` 0.98 and 0.02, and the standard error of :math:`\log\hat\tau` was
about twice as large there (MLE, :math:`n = 3000`, four replicates: 0.06-0.15 against 0.06-0.31)."""


def temperature_truth(gate: str = "activation", tau: float = TAU, expert: str = "linear", *,
                      noise_sd: float = 0.1) -> Truth:
    r"""The true model of a temperature study: :math:`d = 1`, :math:`k^* = 2` atoms of :data:`PARAMS`, temperature
    ``tau`` (the spec's ``temperature``, which :func:`moestat.simulate` divides the gate scores by), inputs
    :math:`U[-1, 1]`, Gaussian noise of sd ``noise_sd``.

    The paper's own simulation values could not be read; this is moestat's stand-in: one parameter set for both
    gates, so that the two truths differ only in the gate.

    Parameters
    ----------
    gate : {"softmax", "activation"}
    tau : float
        True temperature (> 0).
    expert : str
        Expert family (the paper's Gaussian MoE has linear experts).
    noise_sd : float
        Noise standard deviation (> 0), the same for both experts.

    Returns
    -------
    Truth
        ``info`` records the source, the inputs and the temperature.
    """
    check_choice("gate", gate, GATES)
    for name, value in (("tau", tau), ("noise_sd", noise_sd)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < np.inf:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}; e.g. {name}=0.5.")
    spec = MoE(gate=gate, expert=expert, k=2, d=1, noise_sd=float(noise_sd), temperature=float(tau))
    params = Params(**{key: np.asarray(value, dtype=float) for key, value in PARAMS.items()},
                    noise_sd=np.full(2, float(noise_sd)))
    info = {"source": "moestat stand-in for the synthetic setting of nguyen2024_temperature (ICML 2024)",
            "gate": gate, "expert": expert, "inputs": "uniform[-1,1]", "noise_sd": float(noise_sd),
            "temperature": float(tau), "duplicate": [0]}
    return Truth(spec, params, info)


# ----------------------------------------------------------------------------- the scale invariance
def rescale_gate(params: Params, c: float, temperature: float) -> Params:
    r"""The parameters :math:`(c\beta_0, c\beta_1)` with temperature :math:`c\tau` (``Params.temperature``): under an
    affine gate (softmax, top-K, sigmoid, normalised sigmoid, quadratic) they give the gate of
    :math:`(\beta_0, \beta_1)` at temperature :math:`\tau` = ``temperature``, for every :math:`c > 0`, since
    :math:`(c\beta_1^\top x + c\beta_0)/(c\tau) = (\beta_1^\top x + \beta_0)/\tau`."""
    for name, value in (("c", c), ("temperature", temperature)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < np.inf:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    p = params.numpy()
    batch = np.shape(p.gate_bias)[:-1]
    return Params(p.gate_bias * c, p.gate_weight * c, p.expert_weight, p.expert_bias, p.noise_sd,
                  temperature=np.full(batch, float(c) * float(temperature)))


# ----------------------------------------------------------------------------- the temperature error
def temperature_errors(fitted: Params, truth_temperature: float, fitted_default: float) -> dict[str, np.ndarray]:
    r"""``err_temperature`` :math:`|\hat\tau - \tau^*|` and ``err_log_temperature``
    :math:`|\log\hat\tau - \log\tau^*|`, one value per replicate.

    :math:`\hat\tau` is ``fitted.temperature`` (a fit with ``learn_temperature=True``), else ``fitted_default``
    (the fitted spec's fixed temperature); ``truth_temperature`` is :math:`\tau^*`."""
    if not (isinstance(truth_temperature, (int, float)) and 0 < truth_temperature < np.inf):
        raise ValueError(f"truth_temperature must be a finite number > 0, got {truth_temperature!r}.")
    f = fitted.numpy().batched()
    tau = (np.full(int(f.gate_bias.shape[0]), float(fitted_default)) if f.temperature is None
           else np.asarray(f.temperature, dtype=float))
    return {"err_temperature": np.abs(tau - truth_temperature),
            "err_log_temperature": np.abs(np.log(tau) - np.log(truth_temperature))}


def temperature_error_metric(ctx: Any) -> dict[str, np.ndarray]:
    """Study metric (``metrics=["moestat.papers.nguyen2024_temperature:temperature_error_metric"]``):
    :func:`temperature_errors` of the cell's fits against the truth's temperature (the truth's
    ``Params.temperature`` if set, else its spec's)."""
    truth_tau = ctx.truth.temperature
    tau_star = float(ctx.truth_spec.temperature) if truth_tau is None else float(np.asarray(truth_tau))
    return temperature_errors(ctx.fit.params, tau_star, float(ctx.fit_spec.temperature))
