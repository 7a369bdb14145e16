r"""Nguyen, Doan, Pham, Bui, Ho & Rinaldo (2025), "On DeepSeekMoE: statistical benefits of shared experts and
normalized sigmoid gating" (arXiv:2505.10860): the model of a DeepSeek-style layer as a regression function, its
least-squares estimator, matched-atom errors, simulation truths and a :class:`moestat.Study` cell.

What could be read of the paper
-------------------------------
Only its abstract and third-party summaries could be retrieved for this module; its equations, theorems and
simulation settings could not.  The abstract states a convergence analysis of *expert estimation* showing gains in
sample efficiency for (i) the shared-expert strategy and (ii) normalised sigmoid gating (over softmax gating),
verified on synthetic and real data.  Those two statements are the rows of kind ``"claim"`` in :data:`THEORY`
(no rate: the rates were not read).  Everything else here is moestat's own construction, checked numerically in
the tests, and says so.

The model
---------
A DeepSeek-style layer (Dai et al. 2024, DeepSeekMoE; DeepSeek-V3, 2024) adds ``m`` *shared* experts, always
active with weight one, to ``k`` *routed* experts weighted by a router:

.. math:: f_G(x) = \sum_{s=1}^{m} h(x; \kappa_s) + \sum_{j=1}^{k} \pi_j(x)\, h(x; \eta_j),
          \qquad h(x; a, b) = \varphi(a^\top x + b),

with the routed weights :math:`\pi_j` either the **normalised sigmoid** of DeepSeek-V3,
:math:`\pi_j = \sigma(\beta_{1j}^\top x + \beta_{0j}) / \sum_l \sigma(\beta_{1l}^\top x + \beta_{0l})`, or the
**softmax** of DeepSeekMoE / DeepSeek-V2.  Routing here is dense (every routed expert active): moestat's LSE does
not reach the least-squares minimum of a top-K normalised sigmoid model (its objective stops above the objective
at the true parameters: the top-K weights jump where the selected set changes), so top-K routing is left out.
moestat's gate ``normalized_sigmoid`` with ``n_shared`` (:mod:`moestat.gates`) puts shared experts *inside* the
normalisation (their weight is a normalised sigmoid, not one) and differs from them only under top-K routing;
this module uses the additive form of the DeepSeek papers.

:data:`ARCHITECTURES` names the four combinations (shared experts or not) x (normalised sigmoid or softmax).  A
model without shared experts is the plain MoE of :class:`moestat.MoE`; :func:`shared_mean` evaluates its routed
part through :meth:`moestat.MoE.mean_torch`, so the routed weights are moestat's gates.

Identification.  The softmax router is unchanged when one vector is added to every routed gate row, so its gate
rows are identified up to that shift (estimated with the last routed row held at zero, compared after centring).
The normalised sigmoid has no such invariance.  Shared experts are not exchangeable with routed ones (a shared
expert has no gate), so atoms are matched within their group only (:func:`matched_errors`).

Theory for this design
----------------------
At :math:`k = k^*` and :math:`m = m^*` with a non-singular information matrix :math:`J^\top J/n` at the truth
(checked numerically by :func:`information_eigenvalues`), the least-squares estimator of this smooth parametric
model is root-n consistent (Jennrich 1969, Ann. Math. Statist. 40, "Asymptotic properties of non-linear least
squares estimators"; van der Vaart 1998, Asymptotic Statistics, Thm 5.23): every identified parameter and
:math:`\lVert f_{\hat G} - f_{G^*}\rVert_{L^2(\mu)}` converge at :math:`n^{-1/2}`.  These rows are of kind
``"derived"``: they follow from the classical theory, not from the paper.  A fit of the *other* architecture
(e.g. a plain softmax MoE fitted to data from a shared-expert model) is misspecified: its regression function
converges to the best approximation in the fitted class, and its :math:`L^2` distance to the truth has no rate
(kind ``"no_rate"``) unless that distance is zero.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from .._validation import check_choice, check_int
from ..experts import get_expert
from ..model import MoE
from ..params import Params
from ..simulators.regression import simulate
from ..simulators.truth import Truth

__all__ = ["ARCHITECTURES", "BLOCKS", "OTHER", "PARAMS", "REFERENCE", "THEORY", "SharedFit", "SharedParams",
           "as_architecture", "fit_shared_lse", "information_eigenvalues", "l2_distance", "matched_errors",
           "shared_cell", "shared_experts_truth", "shared_jacobian", "shared_mean", "simulate_shared", "truth_params"]

REFERENCE = ("Nguyen, H., Doan, T. T., Pham, Q., Bui, N. D. Q., Ho, N. and Rinaldo, A. (2025). On DeepSeekMoE: "
             "statistical benefits of shared experts and normalized sigmoid gating. arXiv:2505.10860.")

ARCHITECTURES: dict[str, tuple[str, int]] = {
    "shared_nsig": ("normalized_sigmoid", 1),
    "nsig": ("normalized_sigmoid", 0),
    "shared_softmax": ("softmax", 1),
    "softmax": ("softmax", 0),
}
"""Architecture name -> (routing gate, number of shared experts) of :func:`shared_experts_truth`.

``shared_nsig`` is the DeepSeek-V3 layer (shared experts + normalised sigmoid routing), ``softmax`` the plain
softmax MoE; ``shared_softmax`` (DeepSeekMoE / DeepSeek-V2) and ``nsig`` separate the two features.  Without
shared experts the shared atom of :data:`PARAMS` becomes a routed atom with a zero gate row."""

OTHER = {"shared_nsig": "softmax", "softmax": "shared_nsig", "nsig": "shared_softmax", "shared_softmax": "nsig"}
"""The architecture that differs from each in both features (the misspecified fit of ``architecture="other"``)."""

BLOCKS = ("routed_gate", "routed_expert", "shared_expert", "expert", "param")
"""The error columns of :func:`matched_errors`, each prefixed ``err_``."""

PARAMS: dict[str, Any] = {
    "gate_bias": [-0.8, -1.9], "gate_weight": [[-3.2, 4.9], [3.9, -1.0]],
    "expert_weight": [[-0.9, 3.1], [-0.5, -3.9]], "expert_bias": [1.3, 0.5],
    "shared_weight": [[-7.5, -0.9]], "shared_bias": [0.1],
}
r"""The true atoms (:math:`d = 2`): two routed atoms and one shared expert.

Chosen before any study ran, for conditioning: among 2500 random draws (gate and expert slopes :math:`N(0, 3^2)`,
intercepts :math:`N(0, 1)`) the two with the largest smallest eigenvalue of the information matrix
:math:`J^\top J / n` over the four architectures (about :math:`8\cdot 10^{-5}` and :math:`7\cdot 10^{-5}`) were
rounded to one decimal, and the better after rounding was kept: smallest eigenvalue about :math:`7\cdot 10^{-5}`
under the normalised sigmoid, :math:`4\cdot 10^{-4}` under softmax (:func:`information_eigenvalues`)."""

NOISE_SD = 0.02
r"""Noise sd of :func:`shared_experts_truth`: with the smallest information eigenvalue
:math:`\lambda \approx 7\cdot 10^{-5}`, the worst-determined direction has asymptotic sd
:math:`\sigma/\sqrt{n\lambda} \approx 0.08` at :math:`n = 1000`, small against the parameters (the asymptotic
regime holds over the studied n)."""

_SRC = "nguyen2025_shared"


# ----------------------------------------------------------------------------- theory
def _derived(gate: str, regime: str, response: str, quantity: str) -> tuple[Any, ...]:
    return (_SRC, "classical LSE asymptotics at k = k* (not the paper)", gate, regime, "any", "gelu", quantity,
            response, "n", "n^{-1/2}", 0.5, "power", "decay", "derived",
            "identifiable smooth model with non-singular information at the truth (checked numerically): "
            "Jennrich (1969), van der Vaart (1998) Thm 5.23")


def _arch_rows(gate: str, regime: str) -> list[tuple[Any, ...]]:
    rows = [_derived(gate, regime, "l2", "L2(mu) distance of the fitted regression function"),
            _derived(gate, regime, "err_param", "all parameters of an atom (largest over atoms)"),
            _derived(gate, regime, "err_expert", "expert parameters (largest over shared and routed experts)"),
            _derived(gate, regime, "err_routed_gate", "routed gate parameters (identified part)"),
            _derived(gate, regime, "err_routed_expert", "routed expert parameters")]
    if regime == "shared":
        rows.append(_derived(gate, regime, "err_shared_expert", "shared expert parameters"))
    return rows


THEORY: list[tuple[Any, ...]] = [
    *_arch_rows("normalized_sigmoid", "shared"), *_arch_rows("normalized_sigmoid", "plain"),
    *_arch_rows("softmax", "shared"), *_arch_rows("softmax", "plain"),
    (_SRC, "misspecified fit (not the paper)", "normalized_sigmoid|softmax", "cross", "any", "gelu",
     "L2(mu) distance to the truth of a fit of the other architecture", "l2", "n",
     "no rate: converges to the best approximation in the fitted class", np.nan, None, "decay", "no_rate",
     "a plain softmax MoE fitted to shared-expert data, or the reverse"),
    (_SRC, "abstract: shared experts", "normalized_sigmoid|softmax", "shared", "any", "",
     "expert estimation with shared experts, against routed experts only", "err_expert", "n",
     "more sample-efficient (direction only; the theorem's rate was not read)", np.nan, None, "decay", "claim",
     "the abstract's claim; the paper's model, loss and rates could not be read"),
    (_SRC, "abstract: normalized sigmoid gating", "normalized_sigmoid", "", "any", "",
     "expert estimation under normalised sigmoid gating, against softmax gating", "err_expert", "n",
     "more sample-efficient (direction only; the theorem's rate was not read)", np.nan, None, "decay", "claim",
     "the abstract's claim; the paper's model, loss and rates could not be read"),
]
"""Theory rows in the columns of :data:`moestat.rates.theory.THEORY_COLUMNS`; ``regime`` is ``"shared"`` (with
shared experts), ``"plain"`` (without) or ``"cross"`` (fit of the other architecture).  The derived rows come
first, so that :func:`moestat.rates.predicted_rate` returns them; the abstract's claims (kind ``"claim"``, no
rate) come last."""


# ----------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class SharedParams:
    r"""Parameters of a DeepSeek-style layer: the routed atoms and the shared experts.

    Attributes
    ----------
    routed : Params
        Routed atoms (:math:`\beta_0, \beta_1, a, b`), unbatched (k, ...) or batched (R, k, ...).
    shared_weight : ndarray, shape (m, d) or (R, m, d)
        Shared expert slopes :math:`a_s` (``m = 0``: an empty array).
    shared_bias : ndarray, shape (m,) or (R, m)
        Shared expert intercepts :math:`b_s`.
    """

    routed: Params
    shared_weight: np.ndarray
    shared_bias: np.ndarray

    def __post_init__(self) -> None:
        r = self.routed.numpy()
        object.__setattr__(self, "routed", r)
        sw = np.asarray(self.shared_weight, dtype=float)
        sb = np.asarray(self.shared_bias, dtype=float)
        d = np.asarray(r.gate_weight).shape[-1]
        lead = np.asarray(r.gate_bias).shape[:-1]
        sw = sw.reshape(*lead, -1, d) if sw.size else np.zeros((*lead, 0, d))
        sb = sb.reshape(*lead, -1) if sb.size else np.zeros((*lead, 0))
        if sw.shape[-2] != sb.shape[-1]:
            raise ValueError(f"shared_weight has {sw.shape[-2]} shared experts but shared_bias has {sb.shape[-1]}; "
                             "give one slope row and one intercept per shared expert.")
        object.__setattr__(self, "shared_weight", sw)
        object.__setattr__(self, "shared_bias", sb)

    @property
    def k(self) -> int:
        """Number of routed atoms."""
        return int(np.asarray(self.routed.gate_bias).shape[-1])

    @property
    def m(self) -> int:
        """Number of shared experts."""
        return int(self.shared_bias.shape[-1])

    @property
    def d(self) -> int:
        return int(np.asarray(self.routed.gate_weight).shape[-1])

    @property
    def batched(self) -> bool:
        return bool(np.asarray(self.routed.gate_bias).ndim == 2)

    def flat(self) -> np.ndarray:
        """The parameter vector (..., P): gate intercepts, gate slopes, expert slopes, expert intercepts, shared
        slopes, shared intercepts (row-major blocks)."""
        r = self.routed
        lead = np.asarray(r.gate_bias).shape[:-1]
        parts = [np.asarray(r.gate_bias), np.asarray(r.gate_weight), np.asarray(r.expert_weight),
                 np.asarray(r.expert_bias), self.shared_weight, self.shared_bias]
        return np.concatenate([np.reshape(p, (*lead, -1)) for p in parts], axis=-1)

    @classmethod
    def from_flat(cls, theta: np.ndarray, k: int, m: int, d: int) -> SharedParams:
        """Inverse of :meth:`flat` (``theta`` of shape (P,) or (R, P))."""
        theta = np.asarray(theta, dtype=float)
        blocks = _split(theta, k, m, d)
        return cls(Params(blocks["b0"], blocks["w"], blocks["a"], blocks["b"]), blocks["sa"], blocks["sb"])

    def select(self, rows: Sequence[int] | np.ndarray) -> SharedParams:
        """The replicates ``rows`` of batched parameters."""
        return SharedParams(self.routed.select(np.asarray(rows)), self.shared_weight[np.asarray(rows)],
                            self.shared_bias[np.asarray(rows)])


def _sizes(k: int, m: int, d: int) -> list[tuple[str, int, tuple[int, ...]]]:
    return [("b0", k, (k,)), ("w", k * d, (k, d)), ("a", k * d, (k, d)), ("b", k, (k,)), ("sa", m * d, (m, d)),
            ("sb", m, (m,))]


def _split(theta: Any, k: int, m: int, d: int) -> dict[str, Any]:
    """Blocks of a flat parameter vector (numpy or torch, leading axes kept)."""
    out, i = {}, 0
    lead = tuple(theta.shape[:-1])
    for name, size, shape in _sizes(k, m, d):
        out[name] = theta[..., i:i + size].reshape(*lead, *shape)
        i += size
    if i != theta.shape[-1]:
        raise ValueError(f"a parameter vector of k={k} routed atoms, m={m} shared experts and d={d} has {i} entries, "
                         f"got {theta.shape[-1]}.")
    return out


def _check_architecture(architecture: str) -> tuple[str, int]:
    check_choice("architecture", architecture, ARCHITECTURES)
    return ARCHITECTURES[architecture]


# ----------------------------------------------------------------------------- the model
def shared_mean(architecture: str, expert: str, theta: torch.Tensor, X: torch.Tensor, k: int, m: int
                ) -> torch.Tensor:
    r"""Regression function :math:`f_G(x) = \sum_s h(x;\kappa_s) + \sum_j \pi_j(x) h(x;\eta_j)` (module
    docstring), differentiable in ``theta``.

    Parameters
    ----------
    architecture : str
        A key of :data:`ARCHITECTURES`; its gate routes the ``k`` routed experts (``m`` must match it).
    expert : str
        Expert family (:func:`moestat.experts.get_expert`), shared and routed alike.
    theta : Tensor, shape (..., P)
        Flat parameters (:meth:`SharedParams.flat` layout).
    X : Tensor, shape (..., n, d)
    k, m : int
        Routed atoms and shared experts.

    Returns
    -------
    Tensor, shape (..., n)
    """
    gate, m_arch = _check_architecture(architecture)
    if m != m_arch:
        raise ValueError(f"architecture={architecture!r} has {m_arch} shared experts, got m={m}; use "
                         f"m={m_arch} or another architecture.")
    d = X.shape[-1]
    b = _split(theta, k, m, d)
    spec = MoE(gate=gate, expert=expert, k=k, d=d)
    routed = Params(b["b0"], b["w"], b["a"], b["b"])
    out = spec.mean_torch(routed, X)
    if m:
        out = out + get_expert(expert).evaluate(X, b["sa"], b["sb"]).sum(-1)
    return out


def _torch(a: Any) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


def evaluate(architecture: str, expert: str, params: SharedParams, X: np.ndarray) -> np.ndarray:
    """:func:`shared_mean` on numpy parameters and inputs: (n,) or, for batched params and X (R, n, d), (R, n)."""
    out = shared_mean(architecture, expert, _torch(params.flat()), _torch(X), params.k, params.m)
    return out.detach().numpy()


def shared_jacobian(architecture: str, expert: str, theta: torch.Tensor, X: torch.Tensor, k: int, m: int
                    ) -> torch.Tensor:
    r"""Jacobian :math:`\partial f_G(x_t)/\partial\theta` of :func:`shared_mean`, shape (n, P), in closed form.

    With :math:`z_j = a_j^\top x + b_j`, :math:`\varphi_j = \varphi(z_j)`, routed weights :math:`\pi_j` and the
    routed mean :math:`\bar f = \sum_j \pi_j\varphi_j`, the derivative in the router score :math:`s_l` is
    :math:`g_l = \pi_l(\varphi_l - \bar f)` for the softmax and :math:`g_l = (1 - \sigma(s_l))\,\pi_l(\varphi_l -
    \bar f)` for the normalised sigmoid (:math:`\partial\pi_j/\partial s_l = (1-\sigma_l)\pi_l(\delta_{jl} -
    \pi_j)`).  Then :math:`\partial f/\partial\beta_{0l} = g_l`, :math:`\partial f/\partial\beta_{1l} = g_l x`,
    :math:`\partial f/\partial a_j = \pi_j\varphi'(z_j) x`, :math:`\partial f/\partial b_j = \pi_j\varphi'(z_j)`,
    and for a shared expert the same without :math:`\pi`.  ``theta`` is one parameter vector (P,), ``X`` (n, d).
    """
    gate, m_arch = _check_architecture(architecture)
    if m != m_arch:
        raise ValueError(f"architecture={architecture!r} has {m_arch} shared experts, got m={m}.")
    n, d = X.shape
    b = _split(theta, k, m, d)
    fam = get_expert(expert)
    s = X @ b["w"].T + b["b0"]
    z = X @ b["a"].T + b["b"]
    phi, dphi = fam.activation(z), fam.phi_prime(z)
    if gate == "softmax":
        pi = torch.softmax(s, dim=-1)
        dscore = torch.ones_like(s)
    else:
        sig = torch.sigmoid(s)
        pi = sig / sig.sum(-1, keepdim=True)
        dscore = 1.0 - sig
    g = dscore * pi * (phi - (pi * phi).sum(-1, keepdim=True))
    cols = [g, (g.unsqueeze(-1) * X.unsqueeze(-2)).reshape(n, k * d),
            ((pi * dphi).unsqueeze(-1) * X.unsqueeze(-2)).reshape(n, k * d), pi * dphi]
    if m:
        zs = X @ b["sa"].T + b["sb"]
        ds = fam.phi_prime(zs)
        cols += [(ds.unsqueeze(-1) * X.unsqueeze(-2)).reshape(n, m * d), ds]
    return torch.cat(cols, dim=-1)


# ----------------------------------------------------------------------------- truths
def _truth_params() -> SharedParams:
    p = PARAMS
    return SharedParams(Params(np.asarray(p["gate_bias"], float), np.asarray(p["gate_weight"], float),
                               np.asarray(p["expert_weight"], float), np.asarray(p["expert_bias"], float)),
                        np.asarray(p["shared_weight"], float), np.asarray(p["shared_bias"], float))


def as_architecture(params: SharedParams, m: int) -> SharedParams:
    r"""The same experts with ``m`` shared experts: shared experts become routed atoms with a zero gate row
    (:math:`\beta_0 = 0, \beta_1 = 0`, appended last), or the last routed atoms become shared experts (their gate
    rows dropped).  Batched parameters stay batched."""
    m = check_int("m", m, minimum=0)
    r = params.routed
    if m == params.m:
        return params
    if m > params.m:
        extra = m - params.m
        if extra > params.k - 1:
            raise ValueError(f"m={m} would leave fewer than one routed atom of the k={params.k}; choose m <= "
                             f"{params.m + params.k - 1}.")
        cut = params.k - extra
        sw = np.concatenate([params.shared_weight, np.asarray(r.expert_weight)[..., cut:, :]], axis=-2)
        sb = np.concatenate([params.shared_bias, np.asarray(r.expert_bias)[..., cut:]], axis=-1)
        routed = Params(np.asarray(r.gate_bias)[..., :cut], np.asarray(r.gate_weight)[..., :cut, :],
                        np.asarray(r.expert_weight)[..., :cut, :], np.asarray(r.expert_bias)[..., :cut])
        return SharedParams(routed, sw, sb)
    move = params.m - m
    lead = np.asarray(r.gate_bias).shape[:-1]
    b0 = np.concatenate([np.asarray(r.gate_bias), np.zeros((*lead, move))], axis=-1)
    w = np.concatenate([np.asarray(r.gate_weight), np.zeros((*lead, move, params.d))], axis=-2)
    a = np.concatenate([np.asarray(r.expert_weight), params.shared_weight[..., m:, :]], axis=-2)
    b = np.concatenate([np.asarray(r.expert_bias), params.shared_bias[..., m:]], axis=-1)
    return SharedParams(Params(b0, w, a, b), params.shared_weight[..., :m, :], params.shared_bias[..., :m])


def shared_experts_truth(architecture: str = "shared_nsig", expert: str = "gelu", *,
                         noise_sd: float = NOISE_SD) -> Truth:
    r"""The true model of the shared-experts reproduction: the atoms of :data:`PARAMS` in ``architecture``.

    :math:`d = 2`, one shared expert and two routed atoms (``shared_*``) or three routed atoms, the third with a
    zero gate row (plain architectures, :func:`as_architecture`); inputs :math:`U[-1, 1]^2`; Gaussian noise of sd
    ``noise_sd``.  One parameter set for every architecture, so that studies on one data stream compare them on
    paired data.  moestat's stand-in: the paper's simulation settings could not be read.

    Returns
    -------
    Truth
        ``spec`` and ``params`` are the *routed* part (a :class:`moestat.MoE`; simulating it alone omits the shared
        experts: use :func:`simulate_shared`); ``info["shared_weight"]``, ``info["shared_bias"]`` hold the shared
        experts and ``info["architecture"]`` the name.
    """
    gate, m = _check_architecture(architecture)
    if isinstance(noise_sd, bool) or not isinstance(noise_sd, (int, float)) or not 0 < noise_sd < np.inf:
        raise ValueError(f"noise_sd must be a finite number > 0, got {noise_sd!r}; e.g. noise_sd={NOISE_SD}.")
    p = as_architecture(_truth_params(), m)
    spec = MoE(gate=gate, expert=expert, k=p.k, d=p.d, noise_sd=float(noise_sd))
    info = {"source": "moestat stand-in for the synthetic setting of nguyen2025_shared (arXiv:2505.10860)",
            "architecture": architecture, "gate": gate, "n_shared": m, "expert": expert, "inputs": "uniform[-1,1]",
            "noise_sd": float(noise_sd), "shared_weight": p.shared_weight.tolist(),
            "shared_bias": p.shared_bias.tolist(), "duplicate": []}
    return Truth(spec, p.routed, info)


def truth_params(truth: Truth) -> SharedParams:
    """The :class:`SharedParams` of a :func:`shared_experts_truth`."""
    return SharedParams(truth.params, np.asarray(truth.info["shared_weight"], float),
                        np.asarray(truth.info["shared_bias"], float))


def simulate_shared(truth: Truth, n: int, reps: int, seed: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(X (R, n, d), y (R, n))``: :func:`moestat.simulate` of the routed part plus the shared experts.

    The inputs and the noise come from :func:`moestat.simulate` with ``seed``; they do not depend on the
    parameters, so truths simulated with one seed share inputs and noise (paired data)."""
    data = simulate(truth.spec, truth.params, n=n, reps=reps, seed=seed)
    p = truth_params(truth)
    if p.m:
        shared = get_expert(truth.spec.expert)(data.X, p.shared_weight, p.shared_bias).sum(-1)
        return data.X, data.y + shared
    return data.X, data.y


# ----------------------------------------------------------------------------- the least-squares estimator
STARTS = ("near_truth", "random")
"""Start kinds of :func:`fit_shared_lse`."""


@dataclass
class SharedFit:
    """Result of :func:`fit_shared_lse`: one fit per replicate (the start with the lowest objective).

    Attributes
    ----------
    params : SharedParams
        Batched (R, ...) fitted parameters; softmax routers are returned with the last routed gate row at zero.
    objectives : dict of str to ndarray (R,)
        The objective reached from each start (the audit of the starts).
    objective : ndarray (R,)
        Mean squared residual :math:`\\frac1n\\sum_t (y_t - f_{\\hat G}(x_t))^2`.
    converged : ndarray of bool (R,)
        The winning start stopped on a tolerance (MINPACK status > 0), not on ``max_nfev``.
    grad_norm : ndarray (R,)
        Sup-norm of the objective's gradient in the free parameters at the fit.
    nfev : ndarray (R,)
        Residual evaluations of the winning start.
    start : ndarray of str (R,)
        Which start won.
    architecture : str
    """

    params: SharedParams
    objective: np.ndarray
    converged: np.ndarray
    grad_norm: np.ndarray
    nfev: np.ndarray
    start: np.ndarray
    architecture: str
    objectives: dict[str, np.ndarray]


def _free_mask(gate: str, k: int, m: int, d: int) -> np.ndarray:
    """Free coordinates of the flat vector: all, except the last routed gate row under softmax (held at zero)."""
    free = np.ones(2 * k + 2 * k * d + m * d + m, dtype=bool)
    if gate == "softmax":
        free[k - 1] = False
        free[k + (k - 1) * d: k + k * d] = False
    return free


def _gauge(theta: np.ndarray, gate: str, k: int, d: int) -> np.ndarray:
    """Softmax: subtract the last routed gate row from every routed gate row (the same router)."""
    theta = np.array(theta, dtype=float)
    if gate == "softmax":
        theta[:k] -= theta[k - 1]
        w = theta[k:k + k * d].reshape(k, d)
        theta[k:k + k * d] = (w - w[k - 1]).ravel()
    return theta


def _fit_one(architecture: str, expert: str, X: torch.Tensor, y: torch.Tensor, theta0: np.ndarray, k: int,
             m: int, max_nfev: int, tol: float) -> tuple[np.ndarray, float, bool, float, int]:
    """Levenberg-Marquardt (MINPACK, :func:`scipy.optimize.least_squares`) from one start; exact Jacobian in closed
    form (:func:`shared_jacobian`).  Returns (theta, objective, converged, gradient sup-norm, nfev)."""
    from scipy.optimize import least_squares

    gate, _ = ARCHITECTURES[architecture]
    d = X.shape[-1]
    free = _free_mask(gate, k, m, d)
    base = torch.as_tensor(_gauge(theta0, gate, k, d))
    idx = torch.as_tensor(np.flatnonzero(free))
    scale = 1.0 / np.sqrt(X.shape[0])

    def full(v: torch.Tensor) -> torch.Tensor:
        return base.index_put((idx,), v)

    def fun(v: np.ndarray) -> np.ndarray:
        out: np.ndarray = ((shared_mean(architecture, expert, full(torch.as_tensor(v)), X, k, m) - y)
                           * scale).numpy()
        return out

    def jac(v: np.ndarray) -> np.ndarray:
        J = shared_jacobian(architecture, expert, full(torch.as_tensor(v)), X, k, m)[:, idx] * scale
        out: np.ndarray = J.numpy()
        return out

    v0 = base[idx].numpy()
    with np.errstate(all="ignore"):
        res = least_squares(fun, v0, jac=jac, method="lm", xtol=tol, ftol=tol, gtol=tol, max_nfev=max_nfev)
    theta = full(torch.as_tensor(res.x)).numpy()
    r = res.fun
    grad = float(np.abs(2.0 * (res.jac.T @ r)).max())
    return theta, float(r @ r), bool(res.status > 0 and np.isfinite(r).all()), grad, int(res.nfev)


def fit_shared_lse(architecture: str, X: np.ndarray, y: np.ndarray, *, k: int, expert: str = "gelu",
                   starts: Sequence[str] = STARTS, truth: SharedParams | None = None, seed: Any = None,
                   init_scale: float = 0.05, random_scale: float = 1.0, max_nfev: int = 400,
                   tol: float = 1e-12) -> SharedFit:
    r"""Least-squares estimator of a DeepSeek-style layer (:func:`shared_mean`) for R replicates, one at a time.

    .. math:: \hat G_n \in \arg\min_G \frac1n\sum_{t=1}^n (Y_t - f_G(X_t))^2

    over ``k`` routed atoms and the architecture's shared experts, by Levenberg-Marquardt (MINPACK through
    :func:`scipy.optimize.least_squares`, exact Jacobian :func:`shared_jacobian`) from every start in ``starts``;
    the lowest objective wins.  Softmax routers hold the last routed gate row at zero (their invariance).

    Parameters
    ----------
    architecture : str
        A key of :data:`ARCHITECTURES` (the fitted model).
    X : array (R, n, d)
    y : array (R, n)
    k : int
        Routed atoms of the fitted model.
    expert : str
    starts : sequence of {"near_truth", "random"}
        ``near_truth``: ``truth`` plus :math:`N(0, \text{init\_scale}^2)` noise on every coordinate (an oracle
        start, as moestat's ``fit_lse`` offers); ``random``: :math:`N(0, \text{random\_scale}^2)` coordinates.
    truth : SharedParams, optional
        Parameters in the fitted architecture (``k`` routed atoms), needed by ``near_truth`` (for a misspecified
        fit: the truth's experts mapped by :func:`as_architecture`).
    seed : int or SeedSequence
        Seeds the starts (replicate r uses child r).
    max_nfev : int
        Residual evaluations per start (a start that stops on it is not converged).
    tol : float
        MINPACK's ``xtol``, ``ftol`` and ``gtol``.

    Returns
    -------
    SharedFit
    """
    _, m = _check_architecture(architecture)
    k = check_int("k", k)
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    if X.ndim != 3 or y.shape != X.shape[:2]:
        raise ValueError(f"X must have shape (R, n, d) and y (R, n); got X {X.shape} and y {y.shape}.")
    for s in starts:
        check_choice("starts", s, STARTS)
    if not starts or len(set(starts)) != len(starts):
        raise ValueError(f"starts must name each kind at most once and not be empty, got {list(starts)!r}; "
                         "e.g. starts=['near_truth', 'random'].")
    if "near_truth" in starts:
        if truth is None:
            raise ValueError("starts include 'near_truth', which needs truth (SharedParams in the fitted "
                             "architecture); pass truth= or use starts=['random'].")
        if truth.k != k or truth.m != m:
            raise ValueError(f"truth has k={truth.k} routed atoms and m={truth.m} shared experts; the fit has k={k} "
                             f"and m={m}: map it with as_architecture(truth, m).")
    R, _, d = X.shape
    P = 2 * k + 2 * k * d + m * d + m
    children = np.random.SeedSequence(seed).spawn(R) if not isinstance(seed, np.random.SeedSequence) \
        else seed.spawn(R)
    thetas, objs, conv, grads, nfevs, wins = [], [], [], [], [], []
    per_start: dict[str, list[float]] = {s: [] for s in starts}
    for r in range(R):
        rng = np.random.default_rng(children[r])
        Xr, yr = torch.as_tensor(X[r]), torch.as_tensor(y[r])
        best: tuple[Any, ...] | None = None
        for s in starts:
            if s == "near_truth":
                theta0 = truth.flat() + init_scale * rng.standard_normal(P)  # type: ignore[union-attr]
            else:
                theta0 = random_scale * rng.standard_normal(P)
            out = _fit_one(architecture, expert, Xr, yr, theta0, k, m, max_nfev, tol)
            per_start[s].append(out[1])
            if best is None or out[1] < best[1]:
                best = (*out, s)
        assert best is not None
        thetas.append(best[0])
        objs.append(best[1])
        conv.append(best[2])
        grads.append(best[3])
        nfevs.append(best[4])
        wins.append(best[5])
    params = SharedParams.from_flat(np.stack(thetas), k, m, d)
    return SharedFit(params, np.asarray(objs), np.asarray(conv), np.asarray(grads), np.asarray(nfevs),
                     np.asarray(wins, dtype=object), architecture,
                     {s: np.asarray(v) for s, v in per_start.items()})


# ----------------------------------------------------------------------------- errors
def _gate_features(b0: np.ndarray, w: np.ndarray, gate: str, ref: np.ndarray) -> np.ndarray:
    """Identified gate coordinates (R, k, 1 + d): (b0, w), centred at atom ``ref`` (R,) under softmax."""
    g = np.concatenate([b0[..., None], w], axis=-1)
    if gate == "softmax":
        g = g - np.take_along_axis(g, ref[:, None, None], axis=1)
    return g


def matched_errors(fitted: SharedParams, truth: SharedParams, architecture: str) -> dict[str, np.ndarray]:
    r"""Largest per-atom errors of a fit with the truth's numbers of routed atoms and shared experts, after matching
    atoms within each group.  One value per replicate in each column.

    Routed atoms are matched to the true routed atoms by the permutation :math:`\pi` minimising
    :math:`\sum_j \lVert\Delta g_j\rVert^2 + \lVert\Delta\eta_j\rVert^2`, shared experts to the true shared
    experts by the permutation minimising :math:`\sum_s\lVert\Delta\kappa_s\rVert^2` (exhaustive; the first
    minimiser wins ties).  Shared experts are never matched to routed atoms: a shared expert has no gate and
    weight one, so the two groups are not exchangeable.  With :math:`g_i = (\beta_{0i}, \beta_{1i})` the gate row
    (under softmax centred at the fitted atom matched to the last true routed atom, :math:`g_i - g_{\pi(k)}`,
    against :math:`g^*_j - g^*_k`: the softmax sees only differences) and :math:`\eta = (a, b)`:

    * ``err_routed_gate``: :math:`\max_j \lVert\hat g_{\pi(j)} - g^*_j\rVert`;
    * ``err_routed_expert``: :math:`\max_j \lVert\hat\eta_{\pi(j)} - \eta^*_j\rVert`;
    * ``err_shared_expert``: :math:`\max_s \lVert\hat\kappa_{\sigma(s)} - \kappa^*_s\rVert` (NaN without shared
      experts);
    * ``err_expert``: the largest expert error over shared and routed experts (the three experts of
      :data:`PARAMS` in every architecture, so comparable across architectures);
    * ``err_param``: the largest error of an atom, :math:`\sqrt{\lVert\Delta g\rVert^2 + \lVert\Delta\eta\rVert^2}`
      for a routed atom and :math:`\lVert\Delta\kappa\rVert` for a shared one;
    * ``err_expert_<j>``: the error of true expert ``j``, the routed atoms first and the shared experts after them
      (the order :func:`as_architecture` keeps, so expert ``j`` is the same expert in every architecture).

    Parameters
    ----------
    fitted : SharedParams
        Unbatched or batched (R, ...).
    truth : SharedParams
        Unbatched, the same k, m and d.
    architecture : str
        A key of :data:`ARCHITECTURES`; only its gate is used (it decides the centring), so any number of shared
        experts is accepted.

    Returns
    -------
    dict of str to ndarray (R,)
    """
    gate, _ = _check_architecture(architecture)
    if truth.batched:
        raise ValueError("truth must be unbatched (one set of true parameters); select one replicate first.")
    if (fitted.k, fitted.m, fitted.d) != (truth.k, truth.m, truth.d):
        raise ValueError(f"matched_errors needs a fit with the truth's numbers of atoms: fit k={fitted.k}, "
                         f"m={fitted.m}, d={fitted.d}; truth k={truth.k}, m={truth.m}, d={truth.d}.")
    k, m = truth.k, truth.m
    if max(k, m) > 7:
        raise ValueError(f"matching is exhaustive over permutations; k={k}, m={m} is too many (at most 7 each).")
    f = fitted if fitted.batched else SharedParams(fitted.routed.batched(1), fitted.shared_weight[None],
                                                   fitted.shared_bias[None])
    fr, tr = f.routed, truth.routed
    R = np.asarray(fr.gate_bias).shape[0]
    f_eta = np.concatenate([np.asarray(fr.expert_weight), np.asarray(fr.expert_bias)[..., None]], -1)
    t_eta = np.concatenate([np.asarray(tr.expert_weight), np.asarray(tr.expert_bias)[..., None]], -1)
    t_g = _gate_features(np.asarray(tr.gate_bias)[None], np.asarray(tr.gate_weight)[None], gate,
                         np.array([k - 1]))[0]
    best_cost = np.full(R, np.inf)
    d_g = np.full((R, k), np.nan)
    d_eta = np.full((R, k), np.nan)
    for perm in itertools.permutations(range(k)):
        p = list(perm)
        g = _gate_features(np.asarray(fr.gate_bias)[:, p], np.asarray(fr.gate_weight)[:, p], gate,
                           np.full(R, k - 1))
        dg = np.linalg.norm(g - t_g, axis=-1)
        de = np.linalg.norm(f_eta[:, p] - t_eta, axis=-1)
        cost = (dg**2 + de**2).sum(-1)
        better = cost < best_cost
        best_cost = np.where(better, cost, best_cost)
        d_g = np.where(better[:, None], dg, d_g)
        d_eta = np.where(better[:, None], de, d_eta)
    out = {"err_routed_gate": d_g.max(-1), "err_routed_expert": d_eta.max(-1)}
    for j in range(k):
        out[f"err_expert_{j}"] = d_eta[:, j]
    routed_param = np.sqrt(d_g**2 + d_eta**2).max(-1)
    if m:
        f_kap = np.concatenate([f.shared_weight, f.shared_bias[..., None]], -1)
        t_kap = np.concatenate([truth.shared_weight, truth.shared_bias[..., None]], -1)
        best, d_kap = np.full(R, np.inf), np.full((R, m), np.nan)
        for perm in itertools.permutations(range(m)):
            dk = np.linalg.norm(f_kap[:, list(perm)] - t_kap, axis=-1)
            cost = (dk**2).sum(-1)
            better = cost < best
            best = np.where(better, cost, best)
            d_kap = np.where(better[:, None], dk, d_kap)
        shared = d_kap.max(-1)
        for j in range(m):
            out[f"err_expert_{k + j}"] = d_kap[:, j]
        out["err_shared_expert"] = shared
        out["err_expert"] = np.maximum(out["err_routed_expert"], shared)
        out["err_param"] = np.maximum(routed_param, shared)
    else:
        out["err_shared_expert"] = np.full(R, np.nan)
        out["err_expert"] = out["err_routed_expert"]
        out["err_param"] = routed_param
    return out


def l2_distance(architecture_a: str, params_a: SharedParams, architecture_b: str, params_b: SharedParams,
                X_mc: np.ndarray, expert: str = "gelu") -> np.ndarray:
    r"""Monte-Carlo :math:`\lVert f_A - f_B\rVert_{L^2(\mu)} = (\frac1N\sum_i (f_A(x_i) - f_B(x_i))^2)^{1/2}` on
    the inputs ``X_mc`` (N, d); ``params_a`` batched (R, ...) or not, ``params_b`` unbatched.  The two models may
    have different architectures (a misspecified fit against its truth)."""
    X = _torch(X_mc)
    fa = shared_mean(architecture_a, expert, _torch(params_a.flat()), X, params_a.k, params_a.m)
    fb = shared_mean(architecture_b, expert, _torch(params_b.flat()), X, params_b.k, params_b.m)
    out: np.ndarray = np.sqrt(((fa - fb) ** 2).mean(-1).detach().numpy())
    return out


def information_eigenvalues(architecture: str, params: SharedParams, X: np.ndarray, expert: str = "gelu"
                            ) -> np.ndarray:
    r"""Eigenvalues (ascending) of the information matrix :math:`J^\top J / n` of the regression function at
    ``params`` over the free coordinates (softmax: the last routed gate row held fixed), with
    :math:`J_{ti} = \partial f(x_t)/\partial\theta_i` on the inputs ``X`` (n, d).  A smallest eigenvalue away from
    zero means the parameters are locally identified and the LSE is root-n consistent (module docstring)."""
    gate, m = _check_architecture(architecture)
    Xt = _torch(X)
    idx = torch.as_tensor(np.flatnonzero(_free_mask(gate, params.k, m, params.d)))
    J = shared_jacobian(architecture, expert, _torch(params.flat()), Xt, params.k, m)[:, idx]
    out: np.ndarray = torch.linalg.eigvalsh(J.T @ J / Xt.shape[0]).detach().numpy()
    return out


# ----------------------------------------------------------------------------- the study cell
CELL_OPTIONS = ("architecture", "starts", "init_scale", "random_scale", "max_nfev", "tol", "n_mc")
"""Options a fit entry of a study with ``cell=shared_cell`` may give."""


def shared_cell(ctx: Any) -> pd.DataFrame:
    r"""A :class:`moestat.Study` cell: simulate a :func:`shared_experts_truth`, fit an architecture by
    :func:`fit_shared_lse`, score it.

    The truth entry's ``data`` table holds the keywords of :func:`shared_experts_truth` (``architecture``,
    ``expert``, ``noise_sd``).  The fit entry's ``options`` hold ``architecture`` (the fitted one; ``"own"``, the
    default, is the truth's; ``"other"`` the architecture of :data:`OTHER`), ``starts``, ``init_scale``,
    ``random_scale``, ``max_nfev``, ``tol`` (of :func:`fit_shared_lse`) and ``n_mc`` (Monte-Carlo inputs of the
    :math:`L^2` distance, default 20000).  The fit has as many routed atoms as the truth has experts left after
    the fitted architecture's shared ones (k = k*).  A fit of another architecture starts near the truth's experts
    mapped by :func:`as_architecture`.

    Returns
    -------
    DataFrame
        One row per replicate: ``rep, architecture, truth_architecture, specified`` (``"well"`` or
        ``"misspecified"``), ``gate, n_shared, k, objective, converged, grad_norm, nfev, best_start``,
        ``objective_<start>`` per start, ``l2`` and the :func:`matched_errors` columns (NaN when misspecified).
    """
    data = dict(ctx.truth_cfg.get("data", {}))
    truth = shared_experts_truth(**data)
    opts = dict(ctx.fit_cfg.get("options", {}))
    unknown = sorted(set(opts) - set(CELL_OPTIONS))
    if unknown:
        raise ValueError(f"fit options {unknown} are not options of shared_cell; valid options are "
                         f"{list(CELL_OPTIONS)}.")
    t_arch = truth.info["architecture"]
    wanted = str(opts.pop("architecture", "own"))
    arch: str = {"own": t_arch, "other": OTHER[t_arch]}.get(wanted, wanted)
    gate, m = _check_architecture(arch)
    n_mc = int(opts.pop("n_mc", 20_000))
    tp = truth_params(truth)
    start_params = as_architecture(tp, m)
    X, y = simulate_shared(truth, ctx.n, ctx.reps, ctx.data_seed)
    fit = fit_shared_lse(arch, X, y, k=start_params.k, expert=truth.spec.expert, truth=start_params,
                         seed=ctx.fit_seed, **opts)
    X_mc = np.random.default_rng(ctx.metric_seed).uniform(-1.0, 1.0, size=(n_mc, truth.spec.d))
    frame = pd.DataFrame({"rep": np.arange(ctx.reps), "architecture": arch, "truth_architecture": t_arch,
                          "specified": "well" if arch == t_arch else "misspecified", "gate": gate, "n_shared": m,
                          "k": start_params.k, "objective": fit.objective, "converged": fit.converged,
                          "grad_norm": fit.grad_norm, "nfev": fit.nfev, "best_start": fit.start})
    for s, v in fit.objectives.items():
        frame[f"objective_{s}"] = v
    frame["l2"] = l2_distance(arch, fit.params, t_arch, tp, X_mc, truth.spec.expert)
    names = [f"err_{b}" for b in BLOCKS] + [f"err_expert_{j}" for j in range(tp.k + tp.m)]
    errs = matched_errors(fit.params, tp, arch) if arch == t_arch else {}
    for name in names:
        frame[name] = errs.get(name, np.full(ctx.reps, np.nan))
    return frame

