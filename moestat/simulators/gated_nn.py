r"""Simulation from the gated neural network of makkuva2020 (eq. 1).

.. math::
    y = \sum_{i=1}^k z_i\, g(\langle a_i^*, x\rangle) + \xi, \qquad
    P[z_i = 1 \mid x] = \frac{e^{\langle w_i^*, x\rangle}}{\sum_j e^{\langle w_j^*, x\rangle}}, \qquad
    \xi \sim N(0, \sigma^2),

with :math:`w_k^* = 0` and :math:`x \sim N(0, I_d)`.  The paper's setting (makkuva2020 §4) is
``d=10, k=2``, :math:`g` the identity, :math:`\sigma = 0.05`, :math:`a_i^* = e_i`, :math:`w_i^* = e_{k+i}`
(the gate orthogonal to the regressors).  Variants: random unit regressors, random (non-orthogonal)
gates (makkuva2020 Fig. 3), other activations, and the revised version's non-Gaussian inputs
:math:`x \sim p\,N(\mu, I) + (1-p)\,N(-\mu, I)` (Fig. 3(c) of the revised version).

Replicate ``r`` draws its data from ``default_rng(SeedSequence(seed).spawn(R)[r])`` as in
:func:`moestat.simulate`; the truth is drawn once from ``truth_seed`` and shared by the replicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._validation import (
    Integer,
    Optional,
    Real,
    Seed,
    check_choice,
    check_int,
    validate_arguments,
)
from ..exceptions import warn_user
from ..hermite import get_activation
from ..model import MoE
from ..params import Params
from .regression import Dataset, SeedLike, replicate_seeds
from .truth import Truth


@dataclass(frozen=True)
class GatedNNTruth:
    """The true parameters of a gated network.

    Attributes
    ----------
    regressors : ndarray, shape (k, d)
        Expert vectors :math:`a_i^*` as rows (unit norm).
    gate_weight : ndarray, shape (k, d)
        Gate vectors :math:`w_i^*` as rows, last row 0 (the paper's :math:`w_k^* = 0`).
    activation : str
    sigma : float
    inputs : str
        ``"gaussian"`` or ``"mixture"``.
    info : dict
        The simulator's configuration (regressor/gate kind, mixture settings, truth seed).
    """

    regressors: np.ndarray
    gate_weight: np.ndarray
    activation: str
    sigma: float
    inputs: str = "gaussian"
    info: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.regressors.shape[0])

    @property
    def d(self) -> int:
        return int(self.regressors.shape[1])

    @property
    def spec(self) -> MoE:
        """The gated network as a :class:`moestat.MoE`: a softmax gate and ridge experts with the network's
        activation (the biases of :meth:`to_params` are zero), noise sd ``sigma``."""
        return MoE(gate="softmax", expert=self.activation, k=self.k, d=self.d, noise_sd=self.sigma)

    def to_params(self) -> Params:
        """The truth as :class:`moestat.Params` (zero biases, common noise sd)."""
        k = self.k
        return Params(gate_bias=np.zeros(k), gate_weight=self.gate_weight, expert_weight=self.regressors,
                      expert_bias=np.zeros(k), noise_sd=np.full(k, self.sigma))

    def to_truth(self) -> Truth:
        """``(spec, params)`` with the configuration as ``info``: the gated network as a MoE truth, for every
        MoE tool (``simulate`` with Gaussian inputs, metrics, rates)."""
        return Truth(self.spec, self.to_params(), {"source": "makkuva2020 gated network", "inputs": self.inputs,
                                                     **self.info})

    def gate_probs(self, X: np.ndarray) -> np.ndarray:
        """:math:`P[z = i \\mid x]` (the MoE's softmax gate weights), shape (..., n, k)."""
        return np.asarray(self.spec.gate_weights(self.to_params(), np.asarray(X, dtype=float)))

    def mean(self, X: np.ndarray) -> np.ndarray:
        """:math:`E[y \\mid x] = \\sum_i p_i(x) g(a_i^\\top x)` (the MoE's regression function), shape (..., n)."""
        return np.asarray(self.spec.mean(self.to_params(), np.asarray(X, dtype=float)))


@dataclass(frozen=True)
class GatedNNData(Dataset):
    """:class:`moestat.Dataset` plus the ``truth`` (:class:`GatedNNTruth`) it was drawn from."""

    truth: GatedNNTruth | None = None


def _unit_rows(rng: np.random.Generator, k: int, d: int) -> np.ndarray:
    A = rng.standard_normal((k, d))
    return A / np.linalg.norm(A, axis=1, keepdims=True)


def gated_nn_truth(d: int = 10, k: int = 2, *, activation: str = "linear", sigma: float = 0.05,
                   regressors: str | np.ndarray = "orthonormal", gate: str | np.ndarray = "orthogonal",
                   gate_norm: float = 1.0, truth_seed: int | None = 0, inputs: str = "gaussian",
                   mixture_p: float = 0.5, mixture_mu: float | np.ndarray = 1.0) -> GatedNNTruth:
    r"""Build a true gated network (see :func:`simulate_gated_nn` for the arguments)."""
    d = check_int("d", d, minimum=1)
    k = check_int("k", k, minimum=1)
    act = get_activation(activation)
    if not (np.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite noise sd >= 0, got {sigma}.")
    check_choice("inputs", inputs, ("gaussian", "mixture"))
    if not 2 * k - 1 < d:
        warn_user(f"d={d} <= 2k-1={2 * k - 1}: makkuva2020's theory (Assumption 3) needs 2k-1 < d for the gate "
                      "to be orthogonal to the regressors; recovery guarantees do not apply.", UserWarning)
    rng = np.random.default_rng(truth_seed)
    if isinstance(regressors, str):
        check_choice("regressors", regressors, ("orthonormal", "random"))
        if k > d:
            raise ValueError(f"k={k} regressors cannot be linearly independent in d={d}; use k <= d.")
        A = np.eye(d)[:k] if regressors == "orthonormal" else _unit_rows(rng, k, d)
    else:
        A = np.asarray(regressors, dtype=float)
        if A.shape != (k, d):
            raise ValueError(f"regressors must have shape (k, d) = ({k}, {d}), got {A.shape}.")
    kind_gate = gate if isinstance(gate, str) else "given"
    if isinstance(gate, str):
        check_choice("gate", gate, ("orthogonal", "random"))
        W = np.zeros((k, d))
        if gate == "random":
            W[: k - 1] = _unit_rows(rng, k - 1, d) * gate_norm
        else:
            if d < 2 * k - 1:
                raise ValueError(f"gate='orthogonal' needs d >= 2k-1 (= {2 * k - 1}) to place k-1 gate vectors "
                                 f"orthogonal to the k regressors; got d={d}. Use gate='random' or a larger d.")
            if isinstance(regressors, str) and regressors == "orthonormal":
                W[: k - 1] = np.eye(d)[k: 2 * k - 1] * gate_norm
            else:
                Q, _ = np.linalg.qr(A.T, mode="complete")   # columns k.. span the orthogonal complement
                comp = Q[:, k:]
                G = rng.standard_normal((comp.shape[1], k - 1))
                Gq, _ = np.linalg.qr(G)
                W[: k - 1] = (comp @ Gq).T * gate_norm
    else:
        W = np.asarray(gate, dtype=float)
        if W.shape == (k - 1, d):
            W = np.vstack([W, np.zeros((1, d))])
        if W.shape != (k, d):
            raise ValueError(f"gate must have shape (k-1, d) or (k, d), got {W.shape}.")
        W = W - W[-1]
    info = {"regressors": regressors if isinstance(regressors, str) else "given", "gate": kind_gate,
            "gate_norm": gate_norm, "truth_seed": truth_seed}
    if inputs == "mixture":
        if not 0.0 <= mixture_p <= 1.0:
            raise ValueError(f"mixture_p must lie in [0, 1], got {mixture_p}.")
        mu = np.asarray(mixture_mu, dtype=float)
        if mu.ndim == 0:
            mu = _unit_rows(rng, 1, d)[0] * float(mu)
        if mu.shape != (d,):
            raise ValueError(f"mixture_mu must be a norm (float) or a vector of length d={d}, got shape {mu.shape}.")
        info.update(mixture_p=mixture_p, mixture_mu=mu.tolist())
    return GatedNNTruth(A, W, act.name, float(sigma), inputs, info)


@validate_arguments(n=Integer(1), reps=Optional(Integer(1)), seed=Seed(), d=Integer(1), k=Integer(1), sigma=Real(0))
def simulate_gated_nn(n: int, reps: int | None = None, seed: SeedLike = None, *, d: int = 10, k: int = 2,
                      activation: str = "linear", sigma: float = 0.05,
                      regressors: str | np.ndarray = "orthonormal", gate: str | np.ndarray = "orthogonal",
                      gate_norm: float = 1.0, truth_seed: int | None = 0, inputs: str = "gaussian",
                      mixture_p: float = 0.5, mixture_mu: float | np.ndarray = 1.0,
                      truth: GatedNNTruth | None = None) -> GatedNNData:
    r"""Simulate R replicate data sets from makkuva2020's gated network (eq. 1).

    Parameters
    ----------
    n : int
        Sample size per replicate.
    reps : int, optional
        Number of replicates (default 1).
    seed : int, SeedSequence or list of SeedSequence
        Data seed; replicate r uses ``SeedSequence(seed).spawn(reps)[r]``.
    d, k : int
        Input dimension and number of experts (paper: 10, 2).
    activation : str
        Expert activation (:data:`moestat.hermite.ACTIVATIONS`; paper: identity, ``"linear"``).
    sigma : float
        Noise sd (paper: 0.05).
    regressors : {"orthonormal", "random"} or array (k, d)
        :math:`a_i^* = e_i` (paper) or uniform unit vectors.
    gate : {"orthogonal", "random"} or array (k-1, d) / (k, d)
        ``"orthogonal"``: unit gate vectors orthogonal to span(a*) (:math:`w_i^* = e_{k+i}` for orthonormal
        regressors, the paper's default); ``"random"``: uniform on the sphere (makkuva2020 Fig. 3).
    gate_norm : float
        Norm of each :math:`w_i^*`, i < k (sharpness of the gate).
    truth_seed : int
        Seed for the random regressors / gates / mixture mean.
    inputs : {"gaussian", "mixture"}
        :math:`N(0, I_d)` or :math:`p\,N(\mu, I) + (1-p)\,N(-\mu, I)` (revised version, Fig. 3(c)); a float
        ``mixture_mu`` is the norm of a random :math:`\mu`.
    truth : GatedNNTruth, optional
        Use this truth instead of building one.

    Returns
    -------
    GatedNNData
        ``X (R, n, d)``, ``y (R, n)``, the latent experts ``z (R, n)``, ``seeds`` and ``truth``.

    Examples
    --------
    >>> import moestat as ms
    >>> data = ms.simulate_gated_nn(n=1000, reps=3, seed=1)
    >>> data.X.shape, data.truth.regressors.shape
    ((3, 1000, 10), (2, 10))
    """
    n = check_int("n", n)
    if truth is None:
        truth = gated_nn_truth(d, k, activation=activation, sigma=sigma, regressors=regressors, gate=gate,
                               gate_norm=gate_norm, truth_seed=truth_seed, inputs=inputs,
                               mixture_p=mixture_p, mixture_mu=mixture_mu)
    elif not isinstance(truth, GatedNNTruth):
        raise TypeError(f"truth must be a GatedNNTruth, got {type(truth).__name__}.")
    seeds = replicate_seeds(seed, reps)
    g = get_activation(truth.activation).numpy
    Xs, ys, zs = [], [], []
    for s in seeds:
        rng = np.random.default_rng(s)
        X = rng.standard_normal((n, truth.d))
        if truth.inputs == "mixture":
            sign = np.where(rng.uniform(size=n) < truth.info["mixture_p"], 1.0, -1.0)
            X = X + sign[:, None] * np.asarray(truth.info["mixture_mu"])[None, :]
        p = truth.gate_probs(X)
        u = rng.uniform(size=n)
        z = np.minimum((u[:, None] > np.cumsum(p, axis=1)).sum(1), truth.k - 1)
        h = g(np.take_along_axis(X @ truth.regressors.T, z[:, None], axis=1)[:, 0])
        Xs.append(X)
        ys.append(h + truth.sigma * rng.standard_normal(n))
        zs.append(z)
    return GatedNNData(np.stack(Xs), np.stack(ys), np.stack(zs), seeds, truth)
