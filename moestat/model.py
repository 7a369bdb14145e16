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
  :func:`moestat.gates.log_mixture_weights`: every registered gate except ``sigmoid`` already sums to one
  over experts (softmax-family gates by their softmax, ``topk`` over its selected experts,
  ``normalized_sigmoid`` over its active set); sigmoid gates are divided by their sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ._torch import Array, is_torch, to_numpy, to_tensor
from ._validation import check_choice, check_finite, check_int, check_nonnegative
from .experts import ExpertFamily, get_expert
from .families import FAMILIES, Family, get_family, normal_log_density
from .gates import GATES, Gate, gate_logits, gate_scores, gate_weights, get_gate, log_mixture_weights
from .params import Params


def tempered(scores: torch.Tensor, temperature: torch.Tensor | None, spec_temperature: float) -> torch.Tensor:
    r"""``scores`` (..., n, k) times :math:`\tau_{\mathrm{spec}}/\tau` for a fitted temperature ``temperature`` (its
    leading axes match those of ``scores`` before (n, k), or it is a scalar); ``scores`` unchanged for ``None``.

    The gate normalisations divide by the spec's temperature :math:`\tau_{\mathrm{spec}}`, so the weights of the
    result are those of ``scores`` divided by ``temperature``."""
    if temperature is None:
        return scores
    return scores * (spec_temperature / temperature).unsqueeze(-1).unsqueeze(-1)


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
    gate : str
        Gating function, a key of :data:`moestat.gates.GATES`: ``"softmax"``, ``"sigmoid"``, ``"topk"``,
        ``"normalized_sigmoid"``, ``"laplace"``, ``"cosine"``, ``"perturbed_cosine"``, ``"quadratic"``,
        ``"gaussian"`` (formulas in :mod:`moestat.gates` and docs/gates.md).
    expert : str
        Expert family name (:data:`moestat.experts.EXPERTS`).
    k : int
        Number of experts.
    d : int
        Input dimension.
    noise_sd : float
        Standard deviation of the Gaussian noise (used when Params has no ``noise_sd``).
    top_k : int, optional
        Number of active experts for ``gate="topk"`` (required) or routed experts for
        ``gate="normalized_sigmoid"`` (optional; all routed experts when None).
    temperature : float
        Gate temperature (the scores of every gate are divided by it); a fitted temperature in the parameters
        (``Params.temperature``, ``learn_temperature=True`` of the fitters) takes its place.
    n_shared : int
        ``gate="normalized_sigmoid"`` only: the first ``n_shared`` experts are shared (always active).
    gate_eps : float, optional
        ``gate="perturbed_cosine"`` only: the constant added to both norms (default
        :data:`moestat.gates.PERTURBED_COSINE_EPS`).
    response : {"gaussian", "poisson", "binomial"}
        The experts' response distribution (:mod:`moestat.families`): Gaussian experts with noise sd, or GLM
        experts with the canonical link, :math:`y \\mid \\text{expert } i \\sim F(g^{-1}(a_i^\\top x + b_i))`
        (Jordan & Jacobs 1994, §3).  GLM experts are linear predictors: ``expert`` must be ``"linear"`` or
        ``"constant"``.

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
    n_shared: int = 0
    gate_eps: float | None = None
    response: str = "gaussian"

    def __post_init__(self) -> None:
        check_choice("gate", self.gate, GATES)
        get_expert(self.expert)
        check_int("k", self.k)
        check_int("d", self.d)
        check_nonnegative("noise_sd", self.noise_sd)
        if not isinstance(self.response, str) or self.response not in FAMILIES:
            raise ValueError(f"response={self.response!r} is not supported; valid values are {sorted(FAMILIES)}.")
        if self.response != "gaussian" and self.expert not in ("linear", "constant"):
            raise ValueError(f"response={self.response!r} (GLM experts) needs expert='linear' or 'constant' (a "
                             f"linear predictor with the canonical link), got expert={self.expert!r}.")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")
        self._check_gate_options()

    def _check_gate_options(self) -> None:
        options = self.gating.options
        users = {opt: " or ".join(f"gate={g!r}" for g, gate in GATES.items() if opt in gate.options)
                 for opt in ("top_k", "n_shared", "eps")}
        if self.gate == "topk" and self.top_k is None:
            raise ValueError("gate='topk' needs top_k, the number of experts active per input.")
        if self.top_k is not None and "top_k" not in options:
            raise ValueError(f"top_k is only used with {users['top_k']}, not gate={self.gate!r}; drop it.")
        check_int("n_shared", self.n_shared, minimum=0)
        if self.n_shared and "n_shared" not in options:
            raise ValueError(f"n_shared is only used with {users['n_shared']}, not gate={self.gate!r}; "
                             "drop it.")
        if self.n_shared >= self.k:
            raise ValueError(f"n_shared={self.n_shared} leaves no routed expert among k={self.k}; "
                             "choose n_shared < k.")
        if self.top_k is not None:
            check_int("top_k", self.top_k)
            routed = self.k - self.n_shared
            if self.top_k > routed and self.n_shared == 0:
                raise ValueError(f"top_k={self.top_k} exceeds k={self.k}; choose top_k <= k.")
            if self.top_k > routed:
                raise ValueError(f"top_k={self.top_k} exceeds the k - n_shared = {routed} routed experts; "
                                 f"choose top_k <= {routed}.")
        if self.gate_eps is not None:
            if "eps" not in options:
                raise ValueError(f"gate_eps is only used with {users['eps']}, not gate={self.gate!r}; "
                                 "drop it.")
            if isinstance(self.gate_eps, bool) or not (isinstance(self.gate_eps, (int, float))
                                                      and 0 < self.gate_eps < math.inf):
                raise ValueError(f"gate_eps must be a finite number > 0, got {self.gate_eps!r}; e.g. gate_eps=0.1.")

    # ------------------------------------------------------------- helpers
    @property
    def family(self) -> ExpertFamily:
        """The expert family object."""
        return get_expert(self.expert)

    @property
    def glm(self) -> Family:
        """The experts' response family (:class:`moestat.families.Family`)."""
        return get_family(self.response)

    @property
    def has_noise_sd(self) -> bool:
        """Whether the experts have a noise sd (Gaussian experts) or a fixed dispersion (Poisson, binomial)."""
        return self.response == "gaussian"

    def expert_response_mean(self, pre: torch.Tensor) -> torch.Tensor:
        r"""Each expert's mean response from its pre-activation: :math:`\varphi(z)` for Gaussian experts,
        :math:`g^{-1}(z)` for GLM experts (their activation is the identity)."""
        out = self.family.activation(pre)
        return out if self.response == "gaussian" else self.glm.inverse_link(out)

    @property
    def gating(self) -> Gate:
        """The registered :class:`moestat.gates.Gate` object of ``gate``."""
        return get_gate(self.gate)

    def with_k(self, k: int) -> MoE:
        """The same specification with ``k`` experts (e.g. an over-specified fit)."""
        top_k = self.top_k
        if top_k is not None and top_k + self.n_shared > k:
            raise ValueError(f"k={k} is smaller than top_k={top_k}" + (f" + n_shared={self.n_shared}." if self.n_shared
                                                                       else "."))
        return replace(self, k=check_int("k", k))

    def n_params(self, *, identified: bool = True) -> int:
        """Number of free mean parameters (gate + experts).

        With ``identified=True`` the gate loses the dimension of its invariance
        (:meth:`moestat.gates.Gate.n_redundant`): ``d + 1`` for the softmax, top-K, quadratic, Gaussian and
        perturbed cosine gates (a common shift of every gate row), 1 for the Laplace gate (a common intercept
        shift), ``1 + k`` for the cosine gate (also the norm of each :math:`w_i`), 0 for the sigmoid gates.
        """
        gate = self.k * (self.d + 1)
        if identified:
            gate -= self.gating.n_redundant(self.k, self.d)
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
    def gate_scores(self, X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        r"""Torch-only gate scores :math:`s_i(x)` (:func:`moestat.gates.gate_scores`), shape (..., n, k).

        For the softmax, top-K and (normalised) sigmoid gates these are the affine logits
        :math:`w_i^\top x + b_i`; every gate's weights are :meth:`mean_from_linear`'s normalisation of them.
        """
        return gate_scores(self.gate, X, weight, bias, eps=self.gate_eps)

    def _logits(self, p: Params, X: torch.Tensor) -> torch.Tensor:
        r"""The gate scores of ``p`` at ``X``, ready for the gate normalisation (which divides by ``temperature``).

        Where ``p`` carries a fitted temperature :math:`\hat\tau` (``Params.temperature``, shape () or (R,)), the
        scores are multiplied by :math:`\tau_{\mathrm{spec}}/\hat\tau`, so that the normalisation divides them by
        :math:`\hat\tau`: every method reading the scores from here (:meth:`mean`, :meth:`gate_weights`,
        :meth:`loglik`, simulation) then uses the fitted temperature.  Without one they are the scores unchanged.
        """
        scores = self.gate_scores(X, p.gate_weight, p.gate_bias)
        return tempered(scores, getattr(p, "temperature", None), self.temperature)

    def _gates(self, p: Params, X: torch.Tensor) -> torch.Tensor:
        return gate_weights(self.gate, self._logits(p, X), top_k=self.top_k,
                            temperature=self.temperature, n_shared=self.n_shared)

    def _experts(self, p: Params, X: torch.Tensor) -> torch.Tensor:
        out = self.family.evaluate(X, p.expert_weight, p.expert_bias)
        return out if self.response == "gaussian" else self.glm.inverse_link(out)

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

    # Every estimator's layout meets the model's formulas here: the gate scores (the affine logits of the
    # input-affine gates; :meth:`gate_scores` for the others) and the expert pre-activations (affine in x,
    # computed in whatever layout an engine keeps) go in, the model's gate normalisation, activation and noise
    # density are applied once.  ``dim`` is the expert axis.
    def mean_from_linear(self, logits: torch.Tensor, pre: torch.Tensor, *, dim: int = -1) -> torch.Tensor:
        r""":math:`f_G = \sum_i \pi_i\,\varphi(z_i)` from the gate logits :math:`\ell_i` and the expert
        pre-activations :math:`z_i = a_i^\top x + b_i` (the constant expert: :math:`z_i = b_i`, no activation),
        both with the expert axis ``dim``.  The logits are the gate's scores (:meth:`gate_scores`): an engine
        that forms :math:`w_i^\top x + b_i` itself is right only for gates with ``gating.input_affine``."""
        weights = gate_weights(self.gate, logits, top_k=self.top_k, temperature=self.temperature, dim=dim,
                               n_shared=self.n_shared)
        return (weights * self.expert_response_mean(pre)).sum(dim)

    def log_joint_from_linear(self, logits: torch.Tensor, pre: torch.Tensor, y: torch.Tensor,
                              sd: torch.Tensor | float) -> torch.Tensor:
        r""":math:`\log\tilde\pi_i(x_t) + \log\mathcal N(y_t; \varphi(z_{ti}), \sigma_i^2)`, the log of each
        component's joint density (Jordan & Jacobs 1994), from logits and pre-activations with the expert axis
        on -2 and observations last (``y`` broadcasts against ``(..., 1, n)``, ``sd`` against ``(..., k, 1)``).
        Its log-sum-exp over experts is the mixture log-likelihood of each observation."""
        logw = log_mixture_weights(self.gate, logits, top_k=self.top_k, temperature=self.temperature, dim=-2,
                                   n_shared=self.n_shared)
        if self.response != "gaussian":  # GLM experts: the family's log-density at the linear predictor; no sd
            return logw + self.glm.log_density(y, self.family.activation(pre))
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
        if self.response != "gaussian":
            self.glm.check_response(to_numpy(yt))
        elif bool((sd <= 0).any()):
            raise ValueError("the Gaussian MoE likelihood needs noise_sd > 0 for every expert.")
        terms = torch.logsumexp(self.log_density_components(p, Xt, yt), dim=-1)
        out = terms.sum(-1) if reduce == "sum" else terms
        return out if torch_in else to_numpy(out)
