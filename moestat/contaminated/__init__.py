r"""Contaminated mixtures of experts: a frozen (known, pre-trained) model mixed with one trainable prompt expert.

.. math::

    p(y \mid x) = \bigl(1 - w(x)\bigr) f_0(y \mid x) + w(x)\,\mathcal N\bigl(y; \varphi(a^\top x + b), \nu\bigr),

with a constant weight :math:`w(x) = \lambda` (Yan, Nguyen, Le, Akbarian & Ho, AISTATS 2025) or a softmax gate
:math:`w(x) = \sigma(\beta^\top x + \tau)` (Yan, Nguyen, Le, Akbarian, Ho & Rinaldo, NeurIPS 2025).

* :mod:`.model` — :class:`FrozenExpert` (a moestat MoE, one Gaussian expert or any log-density),
  :class:`ContaminatedMoE` (density, responsibilities, simulation) and :class:`ContaminatedParams`;
* :mod:`.fit` — :func:`fit_contaminated` (EM or damped Newton with autograd; several starts) and
  :class:`ContaminatedFit`;
* :mod:`.losses` — the papers' parameter losses and per-block errors;
* :mod:`.truths` — truths indexed by the sample size (:math:`\lambda_n = c\,n^{-\gamma}`, prompts approaching the
  frozen expert);
* :mod:`.information` — the expected information by quadrature (:func:`fisher_information`,
  :func:`asymptotic_sd`).
"""

from .fit import METHODS, ContaminatedFit, fit_contaminated, observed_information
from .information import asymptotic_sd, fisher_information
from .losses import LOSSES, contaminated_errors, distinguishable_loss, nondistinguishable_loss
from .model import GATES, ContaminatedData, ContaminatedMoE, ContaminatedParams, FrozenExpert
from .truths import ContaminatedTruth, contaminated_truth

__all__ = ["GATES", "LOSSES", "METHODS", "ContaminatedData", "ContaminatedFit", "ContaminatedMoE",
           "ContaminatedParams", "ContaminatedTruth", "FrozenExpert", "asymptotic_sd", "contaminated_errors",
           "contaminated_truth", "distinguishable_loss", "fisher_information", "fit_contaminated",
           "nondistinguishable_loss", "observed_information"]
