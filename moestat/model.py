r"""The MoE specification: regression function, Gaussian MoE likelihood, least-squares objective.

For parameters :math:`G` (see :class:`moestat.Params`), gate weights
:math:`\pi_i(x)` (:mod:`moestat.gates`) and experts :math:`h(x;\eta_i)`
(:mod:`moestat.experts`):

* regression function (nguyen2024 eq. 2 and 14):
  :math:`f_G(x) = \sum_{i=1}^k \pi_i(x)\, h(x; \eta_i)`;
* least-squares objective (nguyen2024 eq. 3, divided by n):
  :math:`L_n(G) = \frac1n \sum_{t=1}^n (y_t - f_G(x_t))^2`;
* Gaussian MoE conditional density (Jordan & Jacobs 1994), per-expert noise:
  :math:`p(y \mid x) = \sum_i \tilde\pi_i(x)\, \mathcal N(y; h(x;\eta_i), \sigma_i^2)`,
  where :math:`\tilde\pi` are the normalised weights of
  :func:`moestat.gates.log_mixture_weights` (sigmoid gates divided by their sum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ._torch import Array, is_torch, to_numpy, to_tensor
from ._validation import check_choice, check_finite, check_int, check_nonnegative
from .experts import ExpertFamily, get_expert
from .gates import GATES, gate_logits, gate_weights, log_mixture_weights
from .params import Params

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


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


def _prepare(params: Params, X: Array, *extra: Array) -> tuple[Params, torch.Tensor, list[torch.Tensor], bool]:
    """Convert inputs to torch on a common device; report whether the caller passed torch."""
    torch_in = is_torch(X)
    if torch_in:
        dev, dt = X.device, X.dtype
        Xt = X
    else:
        dev, dt = torch.device("cpu"), torch.float64
        Xt = to_tensor(X)
    p = params.to_torch(dev, dt) if not (params.is_torch and params.gate_bias.device == dev
                                          and params.gate_bias.dtype == dt) else params
    rest = [e if e is None or (is_torch(e) and e.device == dev) else to_tensor(e, device=dev, dtype=dt)
            for e in extra]
    return p, Xt, rest, torch_in


@dataclass(frozen=True)
class MoE:
    """Specification of a mixture-of-experts regression model.

    Parameters
    ----------
    gate : {"softmax", "sigmoid", "topk"}
        Gating function (:mod:`moestat.gates`).
    expert : str
        Expert family name (:data:`moestat.experts.EXPERTS`).
    k : int
        Number of experts.
    d : int
        Input dimension.
    noise_sd : float
        Standard deviation of the Gaussian noise (used when Params has no ``noise_sd``).
    top_k : int, optional
        Number of active experts for ``gate="topk"``.
    temperature : float
        Gate temperature (logits are divided by it).

    Examples
    --------
    >>> import moestat as ms
    >>> spec = ms.MoE(gate="sigmoid", expert="relu", k=8, d=32, noise_sd=0.1)
    """

    gate: str = "softmax"
    expert: str = "linear"
    k: int = 2
    d: int = 1
    noise_sd: float = 0.1
    top_k: int | None = None
    temperature: float = 1.0

    def __post_init__(self) -> None:
        check_choice("gate", self.gate, GATES)
        get_expert(self.expert)
        check_int("k", self.k)
        check_int("d", self.d)
        check_nonnegative("noise_sd", self.noise_sd)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")
        if self.gate == "topk":
            if self.top_k is None:
                raise ValueError("gate='topk' needs top_k, the number of experts active per input.")
            check_int("top_k", self.top_k)
            if self.top_k > self.k:
                raise ValueError(f"top_k={self.top_k} exceeds k={self.k}; choose top_k <= k.")
        elif self.top_k is not None:
            raise ValueError(f"top_k is only used with gate='topk', not gate={self.gate!r}; drop it.")

    # ------------------------------------------------------------- helpers
    @property
    def family(self) -> ExpertFamily:
        """The expert family object."""
        return get_expert(self.expert)

    def with_k(self, k: int) -> MoE:
        """The same specification with ``k`` experts (e.g. an over-specified fit)."""
        top_k = self.top_k
        if top_k is not None and top_k > k:
            raise ValueError(f"k={k} is smaller than top_k={top_k}.")
        return replace(self, k=check_int("k", k))

    def n_params(self, *, identified: bool = True) -> int:
        """Number of free mean parameters (gate + experts).

        With ``identified=True`` the softmax/top-K gate loses the ``d + 1``
        parameters fixed by the translation normalisation.
        """
        gate = self.k * (self.d + 1)
        if identified and self.gate in ("softmax", "topk"):
            gate -= self.d + 1
        return gate + self.k * self.family.n_params(self.d)

    def check_params(self, params: Params) -> None:
        """Raise if ``params`` does not match this specification's ``k`` and ``d``."""
        if not isinstance(params, Params):
            raise TypeError(f"params must be a moestat.Params, got {type(params).__name__}.")
        if params.k != self.k:
            raise ValueError(f"params has k={params.k} experts but the MoE spec has k={self.k}; "
                             "use spec.with_k(params.k) or pass matching params.")
        if params.d != self.d:
            raise ValueError(f"params has input dimension d={params.d} but the MoE spec has d={self.d}.")

    def _check_X(self, X: Array, params: Params) -> None:
        if X.ndim not in (2, 3):
            raise ValueError(f"X must have shape (n, d) or (R, n, d), got shape {tuple(X.shape)}.")
        if X.shape[-1] != self.d:
            raise ValueError(f"X has {X.shape[-1]} columns but the model has d={self.d}; "
                             "pass inputs of dimension d or build the spec with d=X.shape[-1].")
        if X.ndim == 3 and params.is_batched and X.shape[0] != params.n_reps:
            raise ValueError(f"X has R={X.shape[0]} replicates but params has R={params.n_reps}.")
        check_finite("X", X)

    # ---------------------------------------------------------- torch core
    def _logits(self, p: Params, X: torch.Tensor) -> torch.Tensor:
        return gate_logits(X, p.gate_weight, p.gate_bias)

    def _gates(self, p: Params, X: torch.Tensor) -> torch.Tensor:
        return gate_weights(self.gate, self._logits(p, X), top_k=self.top_k,
                            temperature=self.temperature)

    def _experts(self, p: Params, X: torch.Tensor) -> torch.Tensor:
        return self.family.evaluate(X, p.expert_weight, p.expert_bias)

    def _noise_sd(self, p: Params, like: torch.Tensor) -> torch.Tensor:
        if p.noise_sd is not None:
            return torch.as_tensor(p.noise_sd)
        return torch.full(p.gate_bias.shape, float(self.noise_sd), dtype=like.dtype, device=like.device)

    def mean_torch(self, p: Params, X: torch.Tensor) -> torch.Tensor:
        """Torch-only :math:`f_G(X)` with no conversions or checks (hot path of the estimators)."""
        return self.mean_from_linear(self._logits(p, X), self._pre_activations(p, X))

    def _pre_activations(self, p: Params, X: torch.Tensor) -> torch.Tensor:
        if not self.family.input_dependent:
            bias: torch.Tensor = p.expert_bias
            lead = torch.broadcast_shapes(X.shape[:-2], bias.shape[:-1])  # type: ignore[no-untyped-call]
            return bias.unsqueeze(-2).expand(*lead, X.shape[-2], bias.shape[-1])
        return gate_logits(X, p.expert_weight, p.expert_bias)

    # Every estimator's layout meets the model's formulas here: the logits and the expert pre-activations
    # (affine in x, computed in whatever layout an engine keeps) go in, the model's gate, activation and noise
    # density are applied once.  ``dim`` is the expert axis.
    def mean_from_linear(self, logits: torch.Tensor, pre: torch.Tensor, *, dim: int = -1) -> torch.Tensor:
        r""":math:`f_G = \sum_i \pi_i\,\varphi(z_i)` from the gate logits :math:`\ell_i` and the expert
        pre-activations :math:`z_i = a_i^\top x + b_i` (the constant expert: :math:`z_i = b_i`, no activation),
        both with the expert axis ``dim``."""
        weights = gate_weights(self.gate, logits, top_k=self.top_k, temperature=self.temperature, dim=dim)
        return (weights * self.family.activation(pre)).sum(dim)

    def log_joint_from_linear(self, logits: torch.Tensor, pre: torch.Tensor, y: torch.Tensor,
                              sd: torch.Tensor | float) -> torch.Tensor:
        r""":math:`\log\tilde\pi_i(x_t) + \log\mathcal N(y_t; \varphi(z_{ti}), \sigma_i^2)`, the log of each
        component's joint density (Jordan & Jacobs 1994), from logits and pre-activations with the expert axis
        on -2 and observations last (``y`` broadcasts against ``(..., 1, n)``, ``sd`` against ``(..., k, 1)``).
        Its log-sum-exp over experts is the mixture log-likelihood of each observation."""
        logw = log_mixture_weights(self.gate, logits, top_k=self.top_k, temperature=self.temperature, dim=-2)
        return logw + normal_log_density(y - self.family.activation(pre), sd=sd)

    # ---------------------------------------------------------- public API
    def gate_weights(self, params: Params, X: Array) -> Array:
        """Gate weights :math:`\\pi_i(x)`, shape (..., n, k)."""
        self.check_params(params)
        p, Xt, _, torch_in = _prepare(params, X)
        self._check_X(Xt, p)
        out = self._gates(p, Xt)
        return out if torch_in else to_numpy(out)

    def expert_means(self, params: Params, X: Array) -> Array:
        """Expert outputs :math:`h(x; \\eta_i)`, shape (..., n, k)."""
        self.check_params(params)
        p, Xt, _, torch_in = _prepare(params, X)
        self._check_X(Xt, p)
        out = self._experts(p, Xt)
        return out if torch_in else to_numpy(out)

    def mean(self, params: Params, X: Array) -> Array:
        r"""Regression function :math:`f_G(x) = \sum_i \pi_i(x) h(x;\eta_i)`, shape (..., n).

        ``X`` of shape (n, d) with batched params (R, ...) broadcasts to (R, n).
        numpy in, numpy out; torch in, torch out (device preserved).
        """
        self.check_params(params)
        p, Xt, _, torch_in = _prepare(params, X)
        self._check_X(Xt, p)
        if p.is_batched and Xt.ndim == 2:
            Xt = Xt.unsqueeze(0)
        out = self.mean_torch(p, Xt)
        return out if torch_in else to_numpy(out)

    def residual_loss(self, params: Params, X: Array, y: Array) -> Array:
        r"""Least-squares objective :math:`\frac1n\sum_t (y_t - f_G(x_t))^2` per replicate.

        Returns shape (R,) for batched inputs, a scalar otherwise.
        """
        self.check_params(params)
        p, Xt, (yt,), torch_in = _prepare(params, X, y)
        self._check_X(Xt, p)
        self._check_y(yt, Xt)
        if p.is_batched and Xt.ndim == 2:
            Xt = Xt.unsqueeze(0)
        out = ((yt - self.mean_torch(p, Xt)) ** 2).mean(-1)
        return out if torch_in else to_numpy(out)

    def _check_y(self, y: torch.Tensor, X: torch.Tensor) -> None:
        if tuple(y.shape) != tuple(X.shape[:-1]):
            raise ValueError(f"y has shape {tuple(y.shape)} but X has shape {tuple(X.shape)}; "
                             "y must have shape X.shape[:-1], i.e. (n,) or (R, n).")
        check_finite("y", y)

    def log_density_components(self, p: Params, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r"""Torch-only :math:`\log\tilde\pi_i(x_t) + \log\mathcal N(y_t; h_i(x_t), \sigma_i^2)`, shape (..., n, k)."""
        joint = self.log_joint_from_linear(self._logits(p, X).transpose(-1, -2),
                                           self._pre_activations(p, X).transpose(-1, -2),
                                           y.unsqueeze(-2), self._noise_sd(p, X).unsqueeze(-1))
        return joint.transpose(-1, -2)

    def loglik(self, params: Params, X: Array, y: Array, *, reduce: str = "sum") -> Array:
        r"""Gaussian MoE log-likelihood :math:`\sum_t \log \sum_i \tilde\pi_i(x_t) N(y_t; h_i(x_t), \sigma_i^2)`.

        Parameters
        ----------
        reduce : {"sum", "none"}
            ``"sum"`` gives one value per replicate; ``"none"`` the per-observation terms.
        """
        check_choice("reduce", reduce, ("sum", "none"))
        self.check_params(params)
        p, Xt, (yt,), torch_in = _prepare(params, X, y)
        self._check_X(Xt, p)
        self._check_y(yt, Xt)
        if p.is_batched and Xt.ndim == 2:
            Xt, yt = Xt.unsqueeze(0), yt.unsqueeze(0)
        sd = self._noise_sd(p, Xt)
        if bool((sd <= 0).any()):
            raise ValueError("the Gaussian MoE likelihood needs noise_sd > 0 for every expert.")
        terms = torch.logsumexp(self.log_density_components(p, Xt, yt), dim=-1)
        out = terms.sum(-1) if reduce == "sum" else terms
        return out if torch_in else to_numpy(out)
