r"""The mixture-of-GLM-experts log-likelihood and its analytic gradient on the packed parameter vector.

:func:`moestat.fit_mle` hands the starts that EM has not finished to batched L-BFGS
(:func:`moestat.fit.mle.gradient_fit`), which evaluates the negative mean log-likelihood and its gradient at every
trial point.  For softmax-gated linear experts of the Gaussian family or of a canonical-link GLM family (Poisson,
binomial) both have closed forms (Jordan & Jacobs 1994, §4: the score of a mixture is the responsibility-weighted
score of its components), so the evaluation runs as a handful of batched products on the packed vector
:math:`\theta` of :class:`moestat.fit._layout.ParamLayout` instead of unpacking it into parameter blocks and
recording an autograd graph.  With gate design :math:`z^g_t`, expert design :math:`z^e_t`, shared covariates
:math:`s_t`, case weights :math:`c_t`, binomial trials :math:`m_t` (1 otherwise) and :math:`n` observations,

.. math::

    a_{tj} = \alpha_j^\top z^g_t \;(\alpha_{k-1} = 0),\qquad
    \eta_{tj} = \beta_j^\top z^e_t + \gamma^\top s_t + o_t,\qquad
    \log f_{tj} = m_t[y_t\eta_{tj} - b(\eta_{tj})] + \kappa_t,

    \ell_t = \log\sum_j \exp(\log\pi_{tj} + \log f_{tj}),\qquad
    \pi_{t\cdot} = \mathrm{softmax}(a_{t\cdot}),\qquad
    L(\theta) = -\tfrac1n\sum_t c_t\,\ell_t,

with :math:`b` the family's cumulant and :math:`\kappa_t` its normalising constant (:math:`-\log y_t!` for
Poisson, :math:`\log\binom{m_t}{m_t y_t}` for binomial).  Gaussian experts have
:math:`\log f_{tj} = -r_{tj}^2/(2\sigma_j^2) - \tfrac12\log\sigma_j^2 - \tfrac12\log 2\pi` with
:math:`r_{tj} = y_t - \eta_{tj}`, and their variances enter :math:`\theta` as log-scales :math:`\rho_j` above the
floor, :math:`\sigma_j^2 = \sigma_{\min}^2 + e^{2\rho_j}` (the parameterisation of
:func:`moestat.fit.mle.gradient_fit`).  With the responsibilities
:math:`\tau_{tj} = \exp(\log\pi_{tj} + \log f_{tj} - \ell_t)` and
:math:`u_{tj} = \partial\log f_{tj}/\partial\eta_{tj}`, which is :math:`m_t(y_t - \mu_{tj})` for a canonical link and
:math:`r_{tj}/\sigma_j^2` for Gaussian experts,

.. math::

    \frac{\partial L}{\partial\alpha_j} = -\tfrac1n\sum_t c_t(\tau_{tj} - \pi_{tj})\,z^g_t,\qquad
    \frac{\partial L}{\partial\beta_j} = -\tfrac1n\sum_t c_t\tau_{tj}u_{tj}\,z^e_t,\qquad
    \frac{\partial L}{\partial\gamma} = -\tfrac1n\sum_t c_t\sum_j\tau_{tj}u_{tj}\,s_t,

    \frac{\partial L}{\partial\rho_j} = -\tfrac1n\sum_t c_t\tau_{tj}\Bigl(\frac{r_{tj}^2}{\sigma_j^2} - 1\Bigr)
    \frac{e^{2\rho_j}}{\sigma_j^2}\quad\text{(Gaussian)}.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..families import normal_log_density
from ..model import MoE
from ._layout import ParamLayout


def direct_glm(spec: MoE, layout: ParamLayout) -> bool:
    """Whether :class:`GLMMixtureObjective` covers this model: a softmax gate affine in its inputs at temperature 1
    (none learned), the last expert as the gate's reference, and Poisson or binomial experts, or linear or constant
    Gaussian experts."""
    if not _plain_softmax(spec, layout):
        return False
    if spec.response == "gaussian":
        return layout.dispersion and spec.expert in ("linear", "constant")
    return not layout.dispersion and spec.response in ("poisson", "binomial")


def native_mixture(spec: MoE, layout: ParamLayout) -> bool:
    """Whether the C++ L-BFGS of ``fit_mle(compile=True)`` (``_mle_lbfgs_native.cpp``) covers this model: the
    gates of :func:`direct_glm`, with at most 64 Gaussian (linear or constant), Poisson or binomial experts."""
    return (_plain_softmax(spec, layout) and spec.response in ("gaussian", "poisson", "binomial")
            and spec.expert in ("linear", "constant") and spec.k <= 64)


def _plain_softmax(spec: MoE, layout: ParamLayout) -> bool:
    """A softmax gate affine in its inputs at temperature 1 (none learned) with the last expert as reference."""
    return (spec.gate == "softmax" and spec.gating.input_affine and float(spec.temperature) == 1.0
            and not layout.learn_temperature and layout.ref_fixed and not layout.angles)


@dataclass
class GLMMixtureObjective:
    r"""Value and gradient of :math:`L(\theta)` (module docstring) for A problems with their own data.

    Attributes
    ----------
    Zg, Ze : Tensor
        Gate and expert designs with the intercept row first, (A, pg, n) and (A, pe, n).
    Zs : Tensor or None
        Shared covariates (A, q, n), no intercept.
    y : Tensor
        Responses (A, n) (binomial: the proportion of successes).
    trials, weights : Tensor or None
        Binomial trials :math:`m_t` and case weights :math:`c_t`, (A, n).
    response : str
        ``"gaussian"``, ``"poisson"`` or ``"binomial"``.
    k, n : int
        Experts, and the :math:`n` of :math:`L` (the number of rows, not the sum of the weights).
    offset : Tensor or None
        A known term :math:`o_t` (A, n) of every expert's linear predictor (coefficient fixed at 1).
    floor2 : Tensor or None
        Gaussian experts: each problem's variance floor :math:`\sigma_{\min}^2`, (A, 1); the last k entries of
        :math:`\theta` are then the log-scales :math:`\rho_j`.
    """

    Zg: torch.Tensor
    Ze: torch.Tensor
    Zs: torch.Tensor | None
    y: torch.Tensor
    trials: torch.Tensor | None
    weights: torch.Tensor | None
    response: str
    k: int
    n: int
    offset: torch.Tensor | None = None
    floor2: torch.Tensor | None = None

    def __post_init__(self) -> None:
        y, m = self.y, self.trials
        if self.response == "gaussian":
            if self.floor2 is None:
                raise ValueError("GLMMixtureObjective: Gaussian experts need floor2, the variance floor (A, 1).")
            self._const = torch.zeros_like(y)
        elif self.response == "poisson":
            self._const = -torch.lgamma(y + 1.0)
        elif m is None:
            self._const = torch.zeros_like(y)  # log C(1, y) = 0 for y in {0, 1}
        else:
            s = m * y
            self._const = torch.lgamma(m + 1.0) - torch.lgamma(s + 1.0) - torch.lgamma(m - s + 1.0)
        self._n_gate = (self.k - 1) * self.Zg.shape[1]
        self._n_expert = self.k * self.Ze.shape[1]

    def __call__(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L (A,), dL/dtheta (A, P))`` at the packed vectors ``theta`` (A, P)."""
        A, k = theta.shape[0], self.k
        pg, pe = self.Zg.shape[1], self.Ze.shape[1]
        ng, ne = self._n_gate, self._n_expert
        gate = torch.cat([theta[:, :ng].reshape(A, k - 1, pg), theta.new_zeros(A, 1, pg)], dim=1)
        logpi = torch.log_softmax(torch.bmm(gate, self.Zg), dim=1)  # (A, k, n)
        eta = torch.bmm(theta[:, ng:ng + ne].reshape(A, k, pe), self.Ze)
        if self.Zs is not None:
            eta = eta + torch.bmm(theta[:, ng + ne:ng + ne + self.Zs.shape[1]].unsqueeze(1), self.Zs)
        if self.offset is not None:
            eta = eta + self.offset.unsqueeze(1)
        y = self.y.unsqueeze(1)
        if self.response == "gaussian":
            return self._gaussian(theta, logpi, eta, y)
        if self.response == "poisson":
            mu = torch.exp(eta)
            kernel = y * eta - mu
        else:
            mu = torch.sigmoid(eta)
            kernel = y * eta - (eta.clamp_min(0.0) + torch.log1p(torch.exp(-eta.abs())))  # log(1 + e^eta), exact
        m = None if self.trials is None else self.trials.unsqueeze(1)
        if m is not None:
            kernel = m * kernel
        logc = logpi + kernel + self._const.unsqueeze(1)
        lse = torch.logsumexp(logc, dim=1)  # (A, n)
        tau = torch.exp(logc - lse.unsqueeze(1))
        c = None if self.weights is None else self.weights.unsqueeze(1)
        value = -(lse if c is None else lse * c[:, 0]).sum(-1) / self.n
        score_eta = tau * (y - mu)
        if m is not None:
            score_eta = score_eta * m
        return value, self._gradient(tau, logpi, score_eta, [])

    def _gaussian(self, theta: torch.Tensor, logpi: torch.Tensor, eta: torch.Tensor, y: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Value and gradient for Gaussian experts; ``theta`` ends with the k log-scales."""
        assert self.floor2 is not None  # checked in __post_init__
        share = torch.exp(2.0 * theta[:, -self.k:]).unsqueeze(-1)  # e^(2 rho_j), (A, k, 1)
        var = self.floor2.unsqueeze(-1) + share
        resid = y - eta
        logc = logpi + normal_log_density(resid, var=var)
        lse = torch.logsumexp(logc, dim=1)
        tau = torch.exp(logc - lse.unsqueeze(1))
        value = -(lse if self.weights is None else lse * self.weights).sum(-1) / self.n
        u = resid / var
        score_eta = tau * u
        score_var = score_eta * resid - tau  # tau_j (r_j^2 / sd_j^2 - 1)
        if self.weights is not None:
            score_var = score_var * self.weights.unsqueeze(1)
        score_rho = score_var.sum(-1) * (share / var).squeeze(-1)
        return value, self._gradient(tau, logpi, score_eta, [score_rho])

    def _gradient(self, tau: torch.Tensor, logpi: torch.Tensor, score_eta: torch.Tensor,
                  tail: list[torch.Tensor]) -> torch.Tensor:
        """The packed gradient from the gate's and the linear predictors' scores, then ``tail`` (per-problem
        scores already summed over observations and weighted), all divided by -n."""
        A = tau.shape[0]
        score_gate = tau[:, :-1] - logpi[:, :-1].exp()
        if self.weights is not None:
            c = self.weights.unsqueeze(1)
            score_gate, score_eta = score_gate * c, score_eta * c
        parts = [torch.bmm(score_gate, self.Zg.transpose(1, 2)).reshape(A, -1),
                 torch.bmm(score_eta, self.Ze.transpose(1, 2)).reshape(A, -1)]
        if self.Zs is not None:
            parts.append(torch.bmm(score_eta.sum(1, keepdim=True), self.Zs.transpose(1, 2)).reshape(A, -1))
        return torch.cat(parts + tail, dim=1) / (-self.n)
