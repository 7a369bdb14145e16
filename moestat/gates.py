r"""Gating functions of a mixture of experts: a registry of :class:`Gate` objects.

A gate turns an input :math:`x \in \mathbb R^d` and the gate parameters of ``k`` experts — the intercepts
:math:`b_i` (``Params.gate_bias``) and the vectors :math:`w_i` (``Params.gate_weight``) — into mixture
weights :math:`\pi_i(x)`, in two steps:

1. **scores** :math:`s_i(x)` (:attr:`Gate.scores`): log-weights up to a term common to all experts for the
   softmax family, logits of independent sigmoids for the sigmoid family;
2. **normalisation** (:func:`gate_weights`), with a temperature :math:`\tau > 0` that divides the scores:

   * ``"softmax"``: :math:`\pi_i = e^{s_i/\tau}/\sum_j e^{s_j/\tau}` (rows sum to one);
   * ``"topk"``: the softmax over the ``top_k`` largest scores, exactly zero elsewhere;
   * ``"sigmoid"``: :math:`\pi_i = \sigma(s_i/\tau)`, independent per expert (rows need not sum to one);
   * ``"normalized_sigmoid"``: :math:`\pi_i = \sigma(s_i/\tau)\,\mathbb 1[i \in A(x)]/
     \sum_{j \in A(x)}\sigma(s_j/\tau)` over the active set :math:`A(x)` (shared experts plus the ``top_k``
     routed experts of largest score).

The scores of each gate (its normalisation in brackets):

* ``softmax`` :math:`w_i^\top x + b_i` (softmax); ``topk`` the same (top-K softmax);
  ``sigmoid`` the same (sigmoid); ``normalized_sigmoid`` the same (normalised sigmoid);
* ``laplace`` :math:`b_i - \lVert x - w_i\rVert` (softmax);
* ``cosine`` :math:`b_i + \cos(w_i, x)` (softmax);
* ``perturbed_cosine`` :math:`b_i + w_i^\top x/((\lVert w_i\rVert+\varepsilon)(\lVert x\rVert+\varepsilon))`
  (softmax);
* ``quadratic`` :math:`b_i + x^\top \mathrm{diag}(w_i)\, x` (softmax);
* ``gaussian`` :math:`b_i - \tfrac12\lVert x - w_i\rVert^2` (softmax);
* ``activation`` :math:`\tanh(w_i^\top x + b_i)` (softmax).

A fitted (learned) temperature is identified only for the gates whose scores are not homogeneous of degree one
in the gate parameters (:attr:`Gate.temperature_identified`).

Every function is a pure torch function, numerically stable at inputs and scores of any magnitude, and
differentiable in the gate parameters.  ``GATES`` maps each name to its :class:`Gate`; it can be used
wherever a collection of gate names is expected (``name in GATES``, ``list(GATES)``).  See ``docs/gates.md``
for the identifiability of each gate and the estimators that support it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._validation import check_choice, check_int

#: Default :math:`\varepsilon` added to both norms of the perturbed cosine gate.
PERTURBED_COSINE_EPS = 0.1

_NORM_FLOOR = 1e-12  # cos(w, 0) := 0 and cos(0, x) := 0 (the convention of torch.nn.functional.normalize)

ScoreFn = Callable[..., torch.Tensor]
RowShift = Callable[..., tuple[torch.Tensor, torch.Tensor]]


# ----------------------------------------------------------------------------- score functions
def gate_logits(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    r"""Affine logits :math:`\ell_{ri}(x) = w_{ri}^\top x + b_{ri}` (the softmax, top-K and sigmoid scores).

    Parameters
    ----------
    X : Tensor, shape (..., n, d)
    weight : Tensor, shape (..., k, d)
        Gate slopes :math:`w` (:math:`\beta_1`).
    bias : Tensor, shape (..., k)
        Gate intercepts :math:`b` (:math:`\beta_0`).

    Returns
    -------
    Tensor, shape (..., n, k)
    """
    return X @ weight.transpose(-1, -2) + bias.unsqueeze(-2)


def laplace_scores(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    r"""Laplace gate scores :math:`s_i(x) = b_i - \lVert x - w_i\rVert_2`, shape (..., n, k).

    With the softmax, :math:`\pi_i(x) \propto \exp(b_i - \lVert x - w_i\rVert)`: the Laplace gating function of
    Nguyen, Han, Harris, Saria & Ho (2024), "On expert estimation in hierarchical mixture of experts: beyond
    softmax gating functions" (arXiv:2410.02935).  The distance is formed from the differences (no
    :math:`\lVert x\rVert^2 - 2x^\top w + \lVert w\rVert^2` cancellation), and its gradient at :math:`x = w_i` is
    the subgradient 0.
    """
    diff = X.unsqueeze(-2) - weight.unsqueeze(-3)  # (..., n, k, d)
    dist: torch.Tensor = torch.linalg.vector_norm(diff, dim=-1)
    return bias.unsqueeze(-2) - dist


def cosine_scores(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    r"""Cosine router scores :math:`s_i(x) = b_i + \cos(w_i, x) = b_i + w_i^\top x/(\lVert w_i\rVert\lVert x\rVert)`.

    Nguyen, Akbarian, Pham, Nguyen, Zhang & Ho (ICLR 2025), "Statistical advantages of perturbing cosine router
    in mixture of experts".  The temperature of :func:`gate_weights` divides the whole score, so
    :math:`\pi_i \propto \exp(b_i/\tau + \cos(w_i, x)/\tau)`: the paper's :math:`\beta_{0i} + \cos/\tau` with
    :math:`\beta_{0i} = b_i/\tau`.  Only the direction of :math:`w_i` matters (its norm is not identified); a
    zero vector has cosine 0 by convention (norms are floored at 1e-12).
    """
    xn = X / torch.linalg.vector_norm(X, dim=-1, keepdim=True).clamp_min(_NORM_FLOOR)
    wn = weight / torch.linalg.vector_norm(weight, dim=-1, keepdim=True).clamp_min(_NORM_FLOOR)
    return gate_logits(xn, wn, bias)


def perturbed_cosine_scores(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *,
                            eps: float = PERTURBED_COSINE_EPS) -> torch.Tensor:
    r"""Perturbed cosine router scores :math:`s_i(x) = b_i + w_i^\top x / ((\lVert w_i\rVert + \varepsilon)
    (\lVert x\rVert + \varepsilon))`.

    Nguyen et al. (ICLR 2025), "Statistical advantages of perturbing cosine router in mixture of experts": adding
    a small constant to the :math:`L^2` norms of the cosine router removes the interaction between the
    gate parameters that slows the cosine router's rates to :math:`O(1/\log^{\tau} n)` and restores polynomial
    rates.  Unlike the cosine gate, the norm of :math:`w_i` is identified; as for the softmax gate, the
    gate rows are identified up to a common shift (of the intercepts and of :math:`w_i/(\lVert w_i\rVert+\varepsilon)`,
    see :attr:`Gate.row_shift`).  ``eps`` > 0 (default :data:`PERTURBED_COSINE_EPS`).
    """
    eps = _check_eps(eps)
    xs = X / (torch.linalg.vector_norm(X, dim=-1, keepdim=True) + eps)
    ws = weight / (torch.linalg.vector_norm(weight, dim=-1, keepdim=True) + eps)
    return gate_logits(xs, ws, bias)


def quadratic_scores(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    r"""Quadratic monomial gate scores :math:`s_i(x) = x^\top A_i x + b_i` with :math:`A_i = \mathrm{diag}(w_i)`,
    i.e. :math:`\sum_j w_{ij} x_j^2 + b_i`.

    Akbarian, Nguyen, Han & Ho (2024), "Quadratic gating mixture of experts: statistical insights into
    self-attention" (arXiv:2410.11222) study the quadratic polynomial gate :math:`x^\top A_i x + c_i^\top x + b_i`
    and the quadratic monomial gate :math:`x^\top A_i x + b_i`, and show that the monomial gate is the more
    sample-efficient.  A full symmetric :math:`A_i` needs :math:`d(d+1)/2` numbers per expert, more than
    :class:`moestat.Params` holds (:math:`d` gate slopes), so moestat implements the monomial gate with diagonal
    :math:`A_i` stored in ``gate_weight``; for :math:`d = 1` this *is* the paper's monomial gate
    (:math:`a_i x^2 + b_i`).  It is the softmax gate in the features :math:`x \odot x`.
    """
    return gate_logits(X * X, weight, bias)


def gaussian_scores(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    r"""Gaussian gate scores: :math:`\pi_i(x) \propto e^{b_i}\,\mathcal N(x; w_i, I_d)`, i.e. log-weights
    :math:`b_i - \tfrac12\lVert x - w_i\rVert^2` up to a term common to all experts.

    The Gaussian-gated MoE of Xu, Jordan & Hinton (1995, NeurIPS), "An alternative model for mixtures of
    experts", whose parameter estimation rates are studied by Nguyen, Nguyen, Nguyen & Ho (AISTATS 2024),
    "Towards convergence rates for parameter estimation in Gaussian-gated mixture of experts"; here with unit
    covariance.  The scores are input-quadratic, but the quadratic term :math:`-\tfrac12\lVert x\rVert^2` is
    common to all experts and cancels in the softmax, so they are returned in the equivalent affine form

    .. math:: s_i(x) = w_i^\top x + b_i - \tfrac12\lVert w_i\rVert^2
              = b_i - \tfrac12\lVert x - w_i\rVert^2 + \tfrac12\lVert x\rVert^2 ,

    which keeps the scores of order :math:`\lVert x\rVert` (the expanded form would cancel terms of order
    :math:`\lVert x\rVert^2` and lose all digits at :math:`\lVert x\rVert \sim 10^4`).  The gate is therefore the
    softmax gate with intercepts :math:`b_i - \tfrac12\lVert w_i\rVert^2` (a one-to-one reparameterisation).
    """
    return gate_logits(X, weight, bias - 0.5 * (weight * weight).sum(-1))


def activation_scores(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    r"""Activation gate scores :math:`s_i(x) = \varphi(w_i^\top x + b_i)`, :math:`\varphi = \tanh`, shape (..., n, k).

    The activation dense-to-sparse gate of Nguyen, Akbarian & Ho (ICML 2024), "Is temperature sample efficient for
    softmax Gaussian mixture of experts?" (arXiv:2401.13875): the output of the linear layer goes through an
    activation before the softmax with temperature, :math:`\pi_i \propto \exp(\varphi(w_i^\top x + b_i)/\tau)`.
    The paper asks the activation and its derivatives to be linearly independent (the exact conditions were not
    read); moestat uses :math:`\tanh`.  Because :math:`\tanh` is bounded and not linear, the scores are not
    homogeneous in :math:`(w, b)`: the temperature is identified (:attr:`Gate.temperature_identified`), unlike an
    affine gate's, where :math:`(cw, cb, c\tau)` gives the same weights.  No parameter shift leaves the weights
    unchanged (not translation invariant; every gate row is free).  Stable at any input: :math:`\tanh` saturates.
    """
    return torch.tanh(gate_logits(X, weight, bias))


# ----------------------------------------------------------------------------- invariances
def _shift_slopes(weight: torch.Tensor, bias: torch.Tensor, t: torch.Tensor, **_: Any
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Affine-in-features gates: adding ``t`` to every slope adds the common term ``t^T phi(x)`` to every score."""
    return weight + t.unsqueeze(-2), bias


def _shift_gaussian(weight: torch.Tensor, bias: torch.Tensor, t: torch.Tensor, **_: Any
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Gaussian gate: :math:`(w_i + t,\ b_i + t^\top w_i + \tfrac12\lVert t\rVert^2)` adds :math:`t^\top x` to every
    score (check by expanding :func:`gaussian_scores`)."""
    tt = t.unsqueeze(-2)
    return weight + tt, bias + (weight * tt).sum(-1) + 0.5 * (t * t).sum(-1, keepdim=True)


def _shift_perturbed_cosine(weight: torch.Tensor, bias: torch.Tensor, t: torch.Tensor, *,
                            eps: float = PERTURBED_COSINE_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Perturbed cosine gate: with :math:`u_i = g(w_i) = w_i/(\lVert w_i\rVert + \varepsilon)` the score is
    :math:`b_i + u_i^\top x/(\lVert x\rVert + \varepsilon)`, and :math:`g` maps :math:`\mathbb R^d` one-to-one onto
    the open unit ball with inverse :math:`g^{-1}(u) = \varepsilon u/(1 - \lVert u\rVert)`.  Moving every
    :math:`u_i` by ``t`` adds a common term to every score: :math:`w_i \mapsto g^{-1}(g(w_i) + t)`, defined while
    every :math:`\lVert g(w_i) + t\rVert < 1` (a local invariance)."""
    eps = _check_eps(eps)
    u = weight / (torch.linalg.vector_norm(weight, dim=-1, keepdim=True) + eps) + t.unsqueeze(-2)
    norm = torch.linalg.vector_norm(u, dim=-1, keepdim=True)
    if bool((norm >= 1).any()):
        raise ValueError("the shift t moves a perturbed cosine gate vector out of the unit ball (||g(w) + t|| >= 1); "
                         "use a smaller t.")
    return eps * u / (1 - norm), bias


# ----------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Gate:
    r"""One registered gating function.

    Attributes
    ----------
    name : str
    scores : callable
        ``scores(X, gate_weight, gate_bias, **score_options) -> (..., n, k)``: the scores :math:`s_i(x)`.
    normalization : {"softmax", "topk", "sigmoid", "normalized_sigmoid"}
        How scores become weights (:func:`gate_weights`).
    normalized : bool
        Whether the weights :math:`\pi_i(x)` sum to one over experts (then they are the mixture weights of the
        likelihood as they are; otherwise :func:`log_mixture_weights` divides them by their sum).
    translation_invariant : bool
        Whether adding one constant to every score (every ``gate_bias``) leaves the weights unchanged, so the
        intercepts are identified only up to a common shift.
    input_affine : bool
        Whether the scores are the affine logits :math:`w_i^\top x + b_i` of :func:`gate_logits`: then the fused
        least-squares kernels and the likelihood engines' logit layouts apply; otherwise an estimator must
        evaluate :attr:`scores` (fit_lse's autograd reference path).
    options : tuple of str
        The options the gate uses: ``temperature`` (all), ``top_k``, ``n_shared``, ``eps``.
    reference : str
        The paper the gate comes from.
    row_shift : callable, optional
        ``(gate_weight, gate_bias, t, **score_options) -> (gate_weight', gate_bias')`` for a vector ``t``
        (..., d): the
        :math:`d`-dimensional part of the invariance group (the score of every expert changes by one common
        function of :math:`x`).  Where it exists, together with the intercept shift it moves any atom's gate
        row anywhere, so estimators may hold one atom's whole gate row fixed; else only its intercept.
    scale_invariant : bool
        Whether each :math:`w_i` matters only through its direction (cosine gate: its norm is not identified).
    score_options : tuple of str
        The keyword options of :attr:`scores` (``eps`` for the perturbed cosine gate).
    row_shift_global : bool
        Whether :attr:`row_shift` is defined for every ``t`` (then any gate row can be moved to zero, and the
        likelihood layout holds the last row at zero); ``False`` for the perturbed cosine gate, whose shift stays in
        the unit ball (a local invariance), so a likelihood fit holds only its last intercept fixed.
    temperature_identified : bool
        Whether a temperature fitted jointly with the gate parameters is identified (``learn_temperature=True`` of
        :func:`moestat.fit_mle` and :func:`moestat.fit_lse`).  ``False`` when a rescaling of the gate parameters by
        :math:`c > 0` rescales the scores by :math:`c` up to the gate's invariances: then :math:`(c\,\text{params},
        c\tau)` gives the weights of :math:`(\text{params}, \tau)` for a range of :math:`c`.  That holds for the
        affine gates (softmax, top-K, sigmoid, normalised sigmoid), the quadratic gate (linear in its parameters),
        the Gaussian gate (the softmax gate with intercepts :math:`b_i - \tfrac12\lVert w_i\rVert^2`) and, locally,
        the perturbed cosine gate (:math:`g(w_i) \mapsto c\,g(w_i)` stays in the unit ball); the Laplace, cosine
        and activation gates identify it (the test-suite checks the rank of the Jacobian in the gate parameters and
        :math:`\log\tau`).
    """

    name: str
    scores: ScoreFn
    normalization: str
    normalized: bool
    translation_invariant: bool
    input_affine: bool
    options: tuple[str, ...]
    reference: str
    row_shift: RowShift | None = None
    scale_invariant: bool = False
    score_options: tuple[str, ...] = ()
    row_shift_global: bool = True
    temperature_identified: bool = False

    @property
    def gauge(self) -> str:
        """What the invariance lets an estimator hold fixed on one atom: ``"row"``, ``"intercept"`` or ``"none"``."""
        if not self.translation_invariant:
            return "none"
        return "row" if self.row_shift is not None else "intercept"

    def n_redundant(self, k: int, d: int) -> int:
        """Number of gate parameters not identified (dimension of the invariance): subtract it from ``k(d+1)``."""
        gauge = {"row": d + 1, "intercept": 1, "none": 0}[self.gauge]
        return gauge + (k if self.scale_invariant else 0)


_J_J = "Jordan & Jacobs (1994), Neural Computation 6(2), 'Hierarchical mixtures of experts and the EM algorithm'"
_SIG = ("Nguyen, Ho & Rinaldo (NeurIPS 2024), 'Sigmoid gating is more sample efficient than softmax gating in "
        "mixture of experts'")
_TOPK = "Shazeer et al. (ICLR 2017), 'Outrageously large neural networks: the sparsely-gated mixture-of-experts layer'"
_NSIG = ("Nguyen, Doan, Pham, Bui, Ho & Rinaldo (2025), 'On DeepSeekMoE: statistical benefits of shared experts and "
         "normalized sigmoid gating' (arXiv:2505.10860); Dai et al. (2024), DeepSeekMoE")
_LAP = ("Nguyen, Han, Harris, Saria & Ho (2024), 'On expert estimation in hierarchical mixture of experts: beyond "
        "softmax gating functions' (arXiv:2410.02935)")
_COS = ("Nguyen, Akbarian, Pham, Nguyen, Zhang & Ho (ICLR 2025), 'Statistical advantages of perturbing cosine router "
        "in mixture of experts'")
_QUAD = ("Akbarian, Nguyen, Han & Ho (2024), 'Quadratic gating mixture of experts: statistical insights into "
         "self-attention' (arXiv:2410.11222); monomial gate with diagonal A_i")
_GAU = ("Xu, Jordan & Hinton (NeurIPS 1995), 'An alternative model for mixtures of experts'; Nguyen, Nguyen, Nguyen "
        "& Ho (AISTATS 2024), 'Towards convergence rates for parameter estimation in Gaussian-gated mixture of "
        "experts'; unit covariance")
_TEMP = ("Nguyen, Akbarian & Ho (ICML 2024), 'Is temperature sample efficient for softmax Gaussian mixture of "
         "experts?' (arXiv:2401.13875): activation dense-to-sparse gate, with tanh")

GATES: dict[str, Gate] = {g.name: g for g in (
    Gate("softmax", gate_logits, "softmax", True, True, True, ("temperature",), _J_J, _shift_slopes),
    Gate("sigmoid", gate_logits, "sigmoid", False, False, True, ("temperature",), _SIG),
    Gate("topk", gate_logits, "topk", True, True, True, ("temperature", "top_k"), _TOPK, _shift_slopes),
    Gate("normalized_sigmoid", gate_logits, "normalized_sigmoid", True, False, True,
         ("temperature", "top_k", "n_shared"), _NSIG),
    Gate("laplace", laplace_scores, "softmax", True, True, False, ("temperature",), _LAP, temperature_identified=True),
    Gate("cosine", cosine_scores, "softmax", True, True, False, ("temperature",), _COS, scale_invariant=True,
         temperature_identified=True),
    Gate("perturbed_cosine", perturbed_cosine_scores, "softmax", True, True, False, ("temperature", "eps"), _COS,
         _shift_perturbed_cosine, score_options=("eps",), row_shift_global=False),
    Gate("quadratic", quadratic_scores, "softmax", True, True, False, ("temperature",), _QUAD, _shift_slopes),
    Gate("gaussian", gaussian_scores, "softmax", True, True, False, ("temperature",), _GAU, _shift_gaussian),
    Gate("activation", activation_scores, "softmax", True, False, False, ("temperature",), _TEMP,
         temperature_identified=True),
)}
"""The registered gates, keyed by name."""


def get_gate(name: str) -> Gate:
    """The registered :class:`Gate` called ``name`` (ValueError listing the valid names otherwise)."""
    gate = GATES.get(name) if isinstance(name, str) else None
    if gate is None:
        check_choice("gate", name, GATES)  # raises, naming the valid gates
    return gate  # type: ignore[return-value]


def gate_scores(name: str, X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, **options: Any) -> torch.Tensor:
    r"""Scores :math:`s_i(x)` of the gate ``name``, shape (..., n, k); ``options`` the gate does not use are ignored.

    ``X`` (..., n, d), ``weight`` (..., k, d), ``bias`` (..., k); leading axes broadcast.
    """
    gate = get_gate(name)
    used = {key: value for key, value in options.items() if key in gate.score_options and value is not None}
    return gate.scores(X, weight, bias, **used)


# ----------------------------------------------------------------------------- normalisations
def _check_temperature(temperature: float) -> float:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}; pass a positive temperature (1.0 = none).")
    return float(temperature)


def _check_eps(eps: float) -> float:
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps > 0 and eps < float("inf")):
        raise ValueError(f"eps must be a finite number > 0 (the constant added to both norms of the perturbed cosine "
                         f"gate), got {eps!r}; e.g. eps={PERTURBED_COSINE_EPS}.")
    return float(eps)


def softmax_gate(logits: torch.Tensor, temperature: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Softmax gate :math:`\pi_i = \exp(\ell_i/\tau)/\sum_j \exp(\ell_j/\tau)` over the expert axis ``dim``."""
    return torch.softmax(logits / _check_temperature(temperature), dim=dim)


def sigmoid_gate(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    r"""Independent sigmoid gates :math:`\pi_i = \sigma(\ell_i/\tau)` (Nguyen, Ho & Rinaldo 2024, eq. 2)."""
    return torch.sigmoid(logits / _check_temperature(temperature))


def _topk_mask(logits: torch.Tensor, top_k: int, dim: int = -1) -> torch.Tensor:
    k = logits.shape[dim]
    top_k = check_int("top_k", top_k)
    if top_k > k:
        raise ValueError(f"top_k={top_k} exceeds the number of experts k={k}; choose top_k <= k.")
    idx = logits.topk(top_k, dim=dim).indices
    mask = torch.zeros_like(logits, dtype=torch.bool)
    return mask.scatter(dim, idx, True)


def topk_softmax_gate(logits: torch.Tensor, top_k: int, temperature: float = 1.0, dim: int = -1) -> torch.Tensor:
    r"""Top-K sparse softmax: softmax over the ``top_k`` largest logits of each row, zero elsewhere.

    :math:`\pi_i = \mathbb 1[i \in \mathrm{TopK}(\ell)]\, \exp(\ell_i/\tau) /
    \sum_{j \in \mathrm{TopK}(\ell)} \exp(\ell_j/\tau)` (Shazeer et al. 2017).  Ties are broken by
    :func:`torch.topk`.
    """
    mask = _topk_mask(logits, top_k, dim)
    masked = (logits / _check_temperature(temperature)).masked_fill(~mask, float("-inf"))
    return torch.softmax(masked, dim=dim)


def active_experts(scores: torch.Tensor, top_k: int | None = None, n_shared: int = 0, dim: int = -1) -> torch.Tensor:
    r"""Boolean mask of the active set :math:`A(x)` of the normalised sigmoid gate.

    The first ``n_shared`` experts (along ``dim``) are shared, always on; among the other (routed) experts the
    ``top_k`` of largest score are on (all of them when ``top_k`` is None).
    """
    k = scores.shape[dim]
    n_shared = check_int("n_shared", n_shared, minimum=0)
    if n_shared >= k:
        raise ValueError(f"n_shared={n_shared} leaves no routed expert among k={k}; choose n_shared < k.")
    routed = scores.narrow(dim, n_shared, k - n_shared)
    if top_k is None:
        routed_on = torch.ones_like(routed, dtype=torch.bool)
    else:
        if check_int("top_k", top_k) > k - n_shared:
            raise ValueError(f"top_k={top_k} exceeds the k - n_shared = {k - n_shared} routed experts; "
                             "choose top_k <= k - n_shared.")
        routed_on = _topk_mask(routed, top_k, dim)
    if n_shared == 0:
        return routed_on
    shared_on = torch.ones_like(scores.narrow(dim, 0, n_shared), dtype=torch.bool)
    return torch.cat([shared_on, routed_on], dim=dim)


def normalized_sigmoid_log_weights(scores: torch.Tensor, top_k: int | None = None, n_shared: int = 0,
                                   temperature: float = 1.0, dim: int = -1) -> torch.Tensor:
    r""":math:`\log\pi_i` of the normalised sigmoid gate; :math:`-\infty` outside the active set.

    .. math:: \pi_i(x) = \frac{\sigma(s_i/\tau)\,\mathbb 1[i \in A(x)]}{\sum_{j\in A(x)} \sigma(s_j/\tau)},

    with :math:`A(x)` from :func:`active_experts`.  DeepSeekMoE (Dai et al. 2024; DeepSeek-V3) routes each
    token to its shared experts and the ``top_k`` routed experts of largest sigmoid affinity and normalises the
    affinities of the selected experts; moestat puts the shared experts inside the normalisation (their weight
    is their normalised sigmoid, not a fixed 1), so the weights sum to one and the regression function is a
    mixture, whose likelihood is a density.  Whether Nguyen et al. (2025), "On DeepSeekMoE: statistical benefits
    of shared experts and normalized sigmoid gating", analyse this form or DeepSeek's additive one (shared
    experts with weight 1 beside the normalised routed experts) could not be checked against the paper's text;
    the additive form is fitted by :func:`moestat.papers.nguyen2025_shared.fit_shared_lse` (vignette
    ``shared-experts``).  Computed in log space (stable at any score).
    """
    mask = active_experts(scores, top_k, n_shared, dim)
    ls = torch.nn.functional.logsigmoid(scores / _check_temperature(temperature)).masked_fill(~mask, float("-inf"))
    return ls - torch.logsumexp(ls, dim=dim, keepdim=True)


def _needs_top_k(name: str, top_k: int | None) -> int:
    if top_k is None:
        raise ValueError(f"gate={name!r} needs top_k (the number of active experts per input).")
    return top_k


def gate_weights(name: str, logits: torch.Tensor, *, top_k: int | None = None, temperature: float = 1.0,
                 dim: int = -1, n_shared: int = 0) -> torch.Tensor:
    r"""Weights :math:`\pi_i(x)` of the gate ``name`` (a key of ``GATES``) from its scores ``logits``.

    ``logits`` are the gate's scores :math:`s_i(x)` (:func:`gate_scores`; the affine logits for the softmax,
    top-K and sigmoid gates), ``dim`` the expert axis.  Options a gate does not use are ignored: ``top_k``
    (top-K gate: required; normalised sigmoid: optional), ``n_shared`` (normalised sigmoid).
    """
    norm = get_gate(name).normalization
    if norm == "softmax":
        return softmax_gate(logits, temperature, dim)
    if norm == "sigmoid":
        return sigmoid_gate(logits, temperature)
    if norm == "topk":
        return topk_softmax_gate(logits, _needs_top_k(name, top_k), temperature, dim)
    return normalized_sigmoid_log_weights(logits, top_k, n_shared, temperature, dim).exp()


def log_mixture_weights(name: str, logits: torch.Tensor, *, top_k: int | None = None,
                        temperature: float = 1.0, dim: int = -1, n_shared: int = 0) -> torch.Tensor:
    r"""Log of the *normalised* mixture weights used in a mixture density.

    A mixture density needs weights that sum to one.  Every gate except ``sigmoid`` already does
    (:attr:`Gate.normalized`): softmax-family gates by their softmax, the top-K gate by its softmax over the
    selected experts, the normalised sigmoid by construction.  Sigmoid gates are normalised over experts,
    :math:`\tilde\pi_i = \sigma(\ell_i)/\sum_j \sigma(\ell_j)`, which is the convention moestat uses for the
    Gaussian MoE likelihood with sigmoid gates.  Inactive experts (top-K, normalised sigmoid) get
    :math:`-\infty`.  ``dim`` is the expert axis (the likelihood engine keeps experts on axis 1 and observations
    last, where these reductions are several times faster on CPU than over a short last axis).
    """
    norm = get_gate(name).normalization
    tau = _check_temperature(temperature)
    if norm == "softmax":
        return torch.log_softmax(logits / tau, dim=dim)
    if norm == "sigmoid":
        ls = torch.nn.functional.logsigmoid(logits / tau)
        return ls - torch.logsumexp(ls, dim=dim, keepdim=True)
    if norm == "topk":
        mask = _topk_mask(logits, _needs_top_k(name, top_k), dim)
        return torch.log_softmax((logits / tau).masked_fill(~mask, float("-inf")), dim=dim)
    return normalized_sigmoid_log_weights(logits, top_k, n_shared, tau, dim)
