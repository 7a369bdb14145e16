r"""Top-1 MoE of two-layer CNN experts and single-CNN baselines (chen2022 §3, Algorithm 1).

Model (chen2022 eq. 3.1 and §3).  Expert :math:`m` is a two-layer CNN with second layer fixed to +1,
:math:`f_m(x) = \sum_{j\le J}\sum_{p\le P}\sigma(\langle w_{m,j}, x^{(p)}\rangle)` with
:math:`\sigma(z) = z^3` ("cubic", nonlinear MoE) or :math:`\sigma(z) = z` ("linear").  The router is
linear in the patch sum, :math:`h(x) = \Theta^\top s(x)`, :math:`s(x) = \sum_p x^{(p)}`, with gate values
:math:`\pi_m = \mathrm{softmax}(h)_m`, and the MoE output is :math:`F(x) = \pi_{m^*}(x) f_{m^*}(x)`
with top-1 routing :math:`m^* = \arg\max_m h_m(x)` (noiseless at test time, Thm 4.2).

Training (Algorithm 1).  :math:`W^{(0)}_{m,j} \sim N(0, \sigma_0^2 I)`, :math:`\Theta^{(0)} = 0`.  At
iteration :math:`t` example :math:`i` is dispatched to :math:`m_{i,t} = \arg\max_m\{h_m(x_i) + r_{m,i}\}`,
:math:`r \sim U[0, b]` i.i.d. (``router_noise = b``, the paper's :math:`b = 1`), and the perturbed
logistic loss (3.3)

.. math:: \mathcal L^{(t)} = \frac1n\sum_i \log\bigl(1 + e^{-y_i \pi_{m_{i,t}}(x_i) f_{m_{i,t}}(x_i)}\bigr)
          + a\,\mathcal L_{\mathrm{bal}}

is minimised by *normalized* gradient descent on each expert, :math:`W_m \leftarrow W_m - \eta\,
\nabla_{W_m}\mathcal L/\|\nabla_{W_m}\mathcal L\|_F` (3.4; skipped when the gradient is 0, i.e. the expert
received no example) and plain gradient descent on the router, :math:`\theta_m \leftarrow \theta_m -
\eta_r\nabla_{\theta_m}\mathcal L` (3.5).  The routing decision is a constant for the gradient: the router
learns only through the gate value :math:`\pi_{m_{i,t}}`.

Load balancing (optional, ``load_balance = a > 0``).  The paper never gives its formula; moestat uses the
Switch-Transformer auxiliary loss (Fedus et al. 2022, eq. 4)
:math:`\mathcal L_{\mathrm{bal}} = M\sum_m \mathrm{frac}_m\,\bar\pi_m` with
:math:`\mathrm{frac}_m = \frac1n\sum_i 1[m_{i,t} = m]` (no gradient) and
:math:`\bar\pi_m = \frac1n\sum_i \pi_m(x_i)`; it is 1 at a perfectly balanced dispatch and acts only on the
router.

Single-CNN baselines: :math:`F(x) = \sum_{j\le J} a_j \sum_p \sigma(\langle w_j, x^{(p)}\rangle)` with any
activation and width; :math:`a_j = 1` fixed by default for odd activations (cubic, linear, tanh — the
experts' architecture) and trained otherwise (ReLU/CELU/GELU need signed output weights).  Trained by
full-batch Adam with weight decay (App. A.2: lr 0.01 nonlinear / 0.003 linear, weight decay 5e-4) or GD.

Everything is batched over ``R`` replicates: weights are stacked, ``W`` (R, M, d, J) and ``Theta``
(R, d, M); the loss is the sum of the per-replicate losses, so its gradient is the per-replicate gradient
and every update is per replicate.  Replicate ``r`` draws its initialisation and router noise from its own
``torch.Generator`` seeded from ``SeedSequence(seed).spawn(R)[r]``: fitting replicates one at a time with
the same child seeds gives the same result as the batched fit (up to floating-point summation order).
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as Fnn

from .._random import rand, randint, randn, seeded_generators
from .._torch import resolve_device, resolve_dtype, to_numpy
from .._validation import (
    Boolean,
    Device,
    Dtype,
    Integer,
    Optional,
    Real,
    Seed,
    check_choice,
    check_int,
    validate_arguments,
)
from ..experts import get_expert
from ..fit.base import FixedBudgetFit, add_settings, check_reps, select_history, weights_tidy
from ..simulators.clusters import ClusterData
from ..simulators.regression import SeedLike, replicate_seeds
from . import metrics as mt

ACTIVATIONS: tuple[str, ...] = ("cubic", "linear", "relu", "celu", "gelu", "tanh")
"""Expert activations of the cluster MoE (formulas in :mod:`moestat.experts`; ``cubic`` is ``poly3``)."""


def _phi(activation: str):
    return get_expert(activation).activation


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {value!r}.")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number (a step size / scale), got {value}.")
    return float(value)


def _check_nonneg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
    return float(value)


def initial_expert_weights(seed: SeedLike, R: int, M: int, d: int, J: int, sigma0: float,
                           device: str | torch.device = "cpu", dtype: torch.dtype | str | None = None
                           ) -> torch.Tensor:
    """:math:`W^{(0)}`, shape (R, M, d, J): exactly the initialisation :func:`fit_cluster_moe` uses for ``seed``."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    gens = seeded_generators(replicate_seeds(seed, R))
    return sigma0 * randn(gens, (M, d, J), device=dev, dtype=dt)


def _tensors(data: ClusterData, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.as_tensor(data.X, device=device, dtype=dtype)
    y = torch.as_tensor(data.y, device=device, dtype=dtype)
    return X, y


def expert_outputs(X: torch.Tensor, W: torch.Tensor, activation: str) -> torch.Tensor:
    """All expert outputs :math:`f_m(x_i) = \\sum_{j,p}\\sigma(\\langle w_{m,j}, x_i^{(p)}\\rangle)`, shape (R, n, M).

    ``X`` is (R, n, P, d) and ``W`` (R, M, d, J).  Dense: every expert on every example (the reference
    implementation; training uses :func:`routed_expert_output`).  For the linear activation
    :math:`f_m(x) = \\langle\\sum_j w_{m,j}, s(x)\\rangle` is computed from the patch sum.
    """
    R, n, P, d = X.shape
    M, J = W.shape[1], W.shape[3]
    if activation == "linear":
        return torch.bmm(X.sum(dim=2), W.sum(dim=-1).transpose(1, 2))
    Z = torch.bmm(X.reshape(R, n * P, d), W.permute(0, 2, 1, 3).reshape(R, d, M * J))
    return _phi(activation)(Z).reshape(R, n, P, M, J).sum(dim=(2, 4))


def routed_expert_output(X: torch.Tensor, W: torch.Tensor, expert: torch.Tensor, activation: str) -> torch.Tensor:
    """:math:`f_{m_i}(x_i)` for the routed expert only, shape (R, n) (sparse top-1 dispatch).

    Examples are grouped by (replicate, expert), padded to the largest group and pushed through one
    batched matrix product of shape (R*M, capacity*P, d) x (R*M, d, J): cost proportional to
    ``M * max group size`` instead of ``M * n`` for the dense :func:`expert_outputs`.  Padding rows are
    zero patches and are never read back.
    """
    R, n, P, d = X.shape
    M, J = W.shape[1], W.shape[3]
    if activation == "linear":
        return expert_outputs(X, W, activation).gather(-1, expert.unsqueeze(-1)).squeeze(-1)
    flat = (expert + M * torch.arange(R, device=X.device)[:, None]).reshape(-1)
    counts = torch.bincount(flat, minlength=R * M)
    cap = int(counts.max())
    order = torch.argsort(flat, stable=True)
    group = flat[order]
    slot = torch.arange(R * n, device=X.device) - (torch.cumsum(counts, 0) - counts)[group] + group * cap
    buf = X.new_zeros((R * M * cap, P * d)).index_copy_(0, slot, X.reshape(R * n, P * d)[order])
    Z = torch.bmm(buf.view(R * M, cap * P, d), W.reshape(R * M, d, J))
    out = _phi(activation)(Z).reshape(R * M * cap, P * J).sum(dim=-1)[slot]
    return out.new_empty(R * n).index_copy(0, order, out).reshape(R, n)


def router_logits(X: torch.Tensor, Theta: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
    """:math:`h(x) = \\Theta^\\top s(x)`, :math:`s(x) = \\sum_p x^{(p)}`, shape (R, n, M); ``Theta`` is (R, d, M).

    Pass the patch sums ``s`` (R, n, d) to avoid recomputing them.
    """
    return torch.bmm(X.sum(dim=2) if s is None else s, Theta)


def moe_forward(X: torch.Tensor, W: torch.Tensor, Theta: torch.Tensor, activation: str,
                noise: torch.Tensor | None = None, dense: bool = False, s: torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
    """Top-1 MoE forward pass.  ``noise`` (R, n, M) is added to the logits for the routing decision only.

    Returns a dict with ``F`` (R, n), ``expert`` (R, n), ``h`` (R, n, M), ``pi`` (R, n, M) and ``f``
    (R, n), the routed expert's output (computed densely over all experts when ``dense=True``).
    """
    h = router_logits(X, Theta, s)
    with torch.no_grad():
        expert = (h if noise is None else h + noise).argmax(dim=-1)
    pi = torch.softmax(h, dim=-1)
    idx = expert.unsqueeze(-1)
    f = (expert_outputs(X, W, activation).gather(-1, idx).squeeze(-1) if dense
         else routed_expert_output(X, W, expert, activation))
    F = pi.gather(-1, idx).squeeze(-1) * f
    return {"F": F, "expert": expert, "h": h, "pi": pi, "f": f}


def load_balance_loss(expert: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    r"""Switch-Transformer auxiliary loss (Fedus et al. 2022, eq. 4), per replicate, shape (R,).

    .. math:: \mathcal L_{\mathrm{bal}} = M\sum_{m=1}^M \mathrm{frac}_m\,\bar\pi_m,\qquad
              \mathrm{frac}_m = \frac1n\sum_i 1[m_i = m],\qquad \bar\pi_m = \frac1n\sum_i \pi_m(x_i),

    with ``expert`` (R, n) the dispatch :math:`m_i` (a constant: no gradient flows through it) and ``pi``
    (R, n, M) the softmax gate values.  chen2022 uses a load-balancing loss in Table 9 and its CIFAR runs
    (coefficient 1e-3) but never states its formula; this is the standard one it cites.  It equals 1
    whenever :math:`\pi_m(x_i) = 1/M` for all :math:`i, m` (whatever the dispatch) and ranges in
    :math:`(0, M)`.  Its router gradient is

    .. math:: \nabla_{\theta_m}\mathcal L_{\mathrm{bal}} = \frac Mn\sum_i \pi_m(x_i)
              \Bigl(\mathrm{frac}_m - \sum_{m'}\mathrm{frac}_{m'}\pi_{m'}(x_i)\Bigr) s(x_i),

    which sums to 0 over :math:`m`, so Lemma E.1 (:math:`\sum_m\theta_m^{(t)} = 0`) still holds.
    """
    M = pi.shape[-1]
    frac = Fnn.one_hot(expert, M).to(pi.dtype).mean(dim=1)
    return M * (frac * pi.mean(dim=1)).sum(dim=-1)


def moe_loss(X: torch.Tensor, y: torch.Tensor, W: torch.Tensor, Theta: torch.Tensor, activation: str,
             noise: torch.Tensor | None, load_balance: float = 0.0, dense: bool = False,
             s: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Perturbed loss (chen2022 eq. 3.3) plus ``load_balance`` x :func:`load_balance_loss`, per replicate (R,).

    The balance term uses the dispatch of this iteration (noisy during training).
    """
    out = moe_forward(X, W, Theta, activation, noise, dense, s)
    loss = Fnn.softplus(-y * out["F"]).mean(dim=1)
    if load_balance > 0:
        loss = loss + load_balance * load_balance_loss(out["expert"], out["pi"])
    return loss, out


def load_shares(counts: Any) -> np.ndarray:
    """Share of examples routed to each expert, shape (R, M), from cluster x expert counts (R, K, M)."""
    loads = np.asarray(counts, dtype=np.float64).sum(axis=-2)
    return loads / loads.sum(axis=-1, keepdims=True)


def load_entropy(counts: Any) -> np.ndarray:
    r"""Entropy of the expert load distribution in nats, :math:`-\sum_m q_m\log q_m` (:math:`0\log 0 = 0`).

    :math:`q_m` is the share of examples routed to expert :math:`m` (:func:`load_shares`).  It is
    :math:`\log M` for a perfectly balanced router and 0 when one expert takes everything; unlike the
    dispatch entropy :math:`H(\text{cluster}\mid\text{expert})` it measures balance, not purity.
    """
    q = load_shares(counts)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(q > 0, q * np.log(q), 0.0).sum(axis=-1)


@dataclass
class ClusterMoEFit(FixedBudgetFit):
    """A fitted batch of top-1 MoEs (or single CNNs, ``kind="single"``), a :class:`~moestat.fit.base.FitResult`:
    ``params`` are the weights (dict), ``objective`` the final training loss, ``n_iter`` the budget ``T``
    (normalised gradient descent runs a fixed budget, so ``converged`` is False).

    Attributes
    ----------
    kind : {"moe", "single"}
    activation : str
    W : torch.Tensor
        Filters, shape (R, M, d, J) (``M = 1`` for a single CNN).
    Theta : torch.Tensor or None
        Router, shape (R, d, M) (None for a single CNN).
    a : torch.Tensor or None
        Second-layer weights of a single CNN, shape (R, J).
    b : torch.Tensor or None
        Filter biases of a single CNN fitted with ``bias=True``, shape (R, J).
    config : dict
        Every knob of the fit.
    history : DataFrame
        Long: rep, iteration, split, metric, value (loss, accuracy, dispatch_entropy, ...).
    alignment : DataFrame
        Long alignment statistics over training (see :func:`moestat.deep.metrics.alignment_frame`).
    seeds : list of SeedSequence
    wall_time_s : float
    """

    kind: str
    activation: str
    W: torch.Tensor
    Theta: torch.Tensor | None
    a: torch.Tensor | None
    config: dict[str, Any]
    history: pd.DataFrame
    alignment: pd.DataFrame
    seeds: list[np.random.SeedSequence] = field(repr=False)
    wall_time_s: float = 0.0
    b: torch.Tensor | None = None

    @property
    def n_reps(self) -> int:
        return int(self.W.shape[0])

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The weights as numpy arrays with a leading replicate axis: ``W`` and ``Theta`` (MoE) or ``W``, ``a``
        and ``b`` (single CNN)."""
        named = {"W": self.W, "Theta": self.Theta, "a": self.a, "b": self.b}
        return {k: to_numpy(v) for k, v in named.items() if v is not None}

    @property
    def objective(self) -> np.ndarray:
        """(R,) the training loss at the last recorded iteration (NaN if none was recorded)."""
        h = self.history
        out = np.full(self.n_reps, np.nan)
        if len(h):
            loss = h[(h["split"] == "train") & (h["metric"] == "loss")]
            last = loss[loss["iteration"] == loss["iteration"].max()]
            out[last["rep"].to_numpy(int)] = last["value"].to_numpy(float)
        return out

    @property
    def wall_time(self) -> float:
        return float(self.wall_time_s)

    def tidy(self) -> pd.DataFrame:
        """One row per replicate × weight block × expert × coordinate (``coef`` = ``"i,j"``)."""
        return weights_tidy(self.params, {"W": 1, "Theta": 2, "a": None, "b": None})

    def _budget(self) -> int:
        return int(self.config.get("T", 0))

    def glance(self) -> pd.DataFrame:
        """One row per replicate: kind, activation, final training loss, budget and the scalar settings."""
        frame = pd.DataFrame({"rep": np.arange(self.n_reps), "kind": self.kind, "activation": self.activation,
                              "objective": self.objective, "converged": self.converged, "n_iter": self.n_iter,
                              "wall_time": self.wall_time})
        return add_settings(frame, self.config)

    def select(self, rep) -> ClusterMoEFit:
        """The fit of replicate(s) ``rep`` (batched; history and alignment follow)."""
        idx = check_reps(rep, self.n_reps)
        it = torch.as_tensor(idx, device=self.W.device)
        pick = (lambda t: None if t is None else t[it])  # noqa: E731
        return ClusterMoEFit(self.kind, self.activation, self.W[it], pick(self.Theta), pick(self.a), dict(self.config),
                             select_history(self.history, idx), select_history(self.alignment, idx),
                             [self.seeds[i] for i in idx], self.wall_time_s, pick(self.b))

    def predict(self, data: ClusterData, *, noise: float = 0.0, seed: SeedLike = None) -> dict[str, np.ndarray]:
        """Scores ``F`` (R, n) and, for an MoE, the chosen ``expert`` (R, n) (noiseless routing by default)."""
        with torch.no_grad():
            X, _ = _tensors(data, self.W.device, self.W.dtype)
            if self.kind == "single":
                return {"F": to_numpy(single_forward(X, self.W[:, 0], self.a, self.activation, self.b))}
            nz = None
            if noise > 0:
                gens = seeded_generators(replicate_seeds(seed, self.n_reps))
                nz = noise * rand(gens, (X.shape[1], self.Theta.shape[-1]), device=X.device, dtype=X.dtype)
            out = moe_forward(X, self.W, self.Theta, self.activation, nz)
        return {"F": to_numpy(out["F"]), "expert": to_numpy(out["expert"])}

    def dispatch_counts(self, data: ClusterData) -> np.ndarray:
        """Cluster x expert counts (R, K, M) with noiseless routing."""
        if self.kind == "single":
            raise ValueError("a single CNN has no router; dispatch tables exist only for kind='moe'.")
        return mt.dispatch_counts(data.cluster, self.predict(data)["expert"], data.config.K, self.W.shape[1])

    def evaluate(self, data: ClusterData) -> pd.DataFrame:
        """One row per replicate: accuracy and, for an MoE, dispatch entropy, dead experts, load share."""
        pred = self.predict(data)
        frame = pd.DataFrame({"rep": np.arange(self.n_reps), "accuracy": mt.accuracy(data.y, pred["F"])})
        if self.kind == "moe":
            counts = mt.dispatch_counts(data.cluster, pred["expert"], data.config.K, self.W.shape[1])
            frame["dispatch_entropy"] = mt.dispatch_entropy(counts)
            frame = frame.merge(mt.load_summary(counts), on="rep")
            frame["load_entropy"] = load_entropy(counts)
            frame["router_sum_norm"] = to_numpy(self.Theta.sum(dim=-1).norm(dim=-1))
        else:
            frame["dispatch_entropy"] = np.nan
        return frame

    def to_frame(self, data: ClusterData) -> pd.DataFrame:
        """Tidy: one row per (rep, quantity) on ``data``, with the fit's configuration as columns."""
        long = self.evaluate(data).melt(id_vars="rep", var_name="quantity", value_name="value")
        for key, value in self.config.items():
            long[key] = value if not isinstance(value, (list, tuple, dict)) else str(value)
        return long


def single_forward(X: torch.Tensor, W: torch.Tensor, a: torch.Tensor, activation: str,
                   b: torch.Tensor | None = None) -> torch.Tensor:
    """Single CNN :math:`F(x) = \\sum_j a_j\\sum_p\\sigma(\\langle w_j, x^{(p)}\\rangle + b_j)`.

    Shapes: ``X`` (R, n, P, d), ``W`` (R, d, J), ``a`` and ``b`` (R, J).

    ``b = None`` is the bias-free CNN of chen2022 eq. 3.1; with biases it is the family of Thm 4.1.
    """
    R, n, P, d = X.shape
    if activation == "linear":  # sum_j a_j (<w_j, s(x)> + P b_j)
        out = torch.bmm(X.sum(dim=2), (W * a[:, None, :]).sum(dim=-1, keepdim=True)).squeeze(-1)
        return out if b is None else out + P * (a * b).sum(dim=-1, keepdim=True)
    Z = torch.bmm(X.reshape(R, n * P, d), W)
    if b is not None:
        Z = Z + b[:, None, :]
    Z = _phi(activation)(Z).reshape(R, n, P, -1).sum(dim=2)
    return (Z * a[:, None, :]).sum(dim=-1)


def _record(rows: list[dict[str, Any]], it: int, split: str, metric: str, values: Any) -> None:
    for r, v in enumerate(np.atleast_1d(to_numpy(values))):
        rows.append({"rep": r, "iteration": it, "split": split, "metric": metric, "value": float(v)})


def _common_checks(train: ClusterData, test: ClusterData | None, T: int, eval_every: int | None
                   ) -> tuple[int, int]:
    if not isinstance(train, ClusterData):
        raise TypeError(f"train must be a ClusterData from simulate_clusters, got {type(train).__name__}.")
    if test is not None:
        if not isinstance(test, ClusterData):
            raise TypeError(f"test must be a ClusterData or None, got {type(test).__name__}.")
        if test.n_reps != train.n_reps or test.X.shape[2:] != train.X.shape[2:]:
            raise ValueError("test must have the same replicates, P and d as train (use ClusterData.split).")
    T = check_int("T", T)
    eval_every = T if eval_every is None else check_int("eval_every", eval_every)
    return T, eval_every


@validate_arguments(M=Integer(1), J=Integer(1), T=Integer(0), eta=Real(0, open_low=True), eta_r=Real(0),
                    sigma0=Real(0, open_low=True), router_noise=Real(0), load_balance=Real(0),
                    eval_every=Optional(Integer(1)), seed=Seed(), device=Device(), dtype=Dtype())
def fit_cluster_moe(train: ClusterData, *, M: int = 8, J: int = 16, activation: str = "cubic", T: int = 2000,
                    eta: float = 1e-3, eta_r: float = 0.1, sigma0: float = 0.1, router_noise: float = 1.0,
                    load_balance: float = 0.0, test: ClusterData | None = None, eval_every: int | None = None,
                    seed: SeedLike = 0, device: str | torch.device = "auto", dtype: torch.dtype | str | None = None,
                    ) -> ClusterMoEFit:
    """Fit ``R`` top-1 MoEs of CNN experts with Algorithm 1 of chen2022 (batched over replicates).

    Parameters
    ----------
    train : ClusterData
        Training data, ``R`` replicates; the MoE of replicate ``r`` is fitted to replicate ``r``.
    M, J : int
        Experts and filters per expert (paper: 8 and 16).
    activation : {"cubic", "linear"}
        Expert activation (nonlinear vs linear MoE); other activations of :data:`ACTIVATIONS` are accepted.
    T : int
        Full-batch iterations (not reported by the paper).
    eta, eta_r : float
        Normalized-GD step of the experts and GD step of the router (paper: 0.001 and 0.1).
    sigma0 : float
        Standard deviation of the initial filters (not reported by the paper; see docs/deep-clusters.md).
    router_noise : float
        Width ``b`` of the Uniform[0, b] routing noise during training (paper: 1; 0 disables it).
    load_balance : float
        Coefficient of the Switch load-balancing loss (0 = off, as in the paper's Tables 1 and 3).
    test : ClusterData, optional
        Evaluated (noiseless routing) every ``eval_every`` iterations and at the end.
    eval_every : int, optional
        Evaluation period (default: only at ``t = 0`` and ``t = T``).
    seed : int, SeedSequence or list of SeedSequence
        Model seed: initialisation and router noise of replicate ``r`` use child ``r``.
    device, dtype
        ``"auto"`` picks CUDA when present; float64 on CPU by default.

    Returns
    -------
    ClusterMoEFit
    """
    T, eval_every = _common_checks(train, test, T, eval_every)
    M, J = check_int("M", M), check_int("J", J)
    activation = check_choice("activation", activation, ACTIVATIONS)
    eta, eta_r = _check_positive("eta", eta), _check_positive("eta_r", eta_r)
    sigma0 = _check_positive("sigma0", sigma0)
    router_noise = _check_nonneg("router_noise", router_noise)
    load_balance = _check_nonneg("load_balance", load_balance)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    R, n, _, d = train.X.shape
    seeds = replicate_seeds(seed, R)
    gens = seeded_generators(seeds)
    X, y = _tensors(train, dev, dt)
    S = X.sum(dim=2)
    Xt = _tensors(test, dev, dt)[0] if test is not None else None
    V, C = train.V, train.C

    W = (sigma0 * randn(gens, (M, d, J), device=dev, dtype=dt)).requires_grad_(True)
    Theta = torch.zeros((R, d, M), device=dev, dtype=dt, requires_grad=True)
    rows: list[dict[str, Any]] = []
    align: list[pd.DataFrame] = []

    def evaluate(it: int, train_loss: torch.Tensor | None) -> None:
        if train_loss is not None:
            _record(rows, it, "train", "loss", train_loss)
        align.append(mt.alignment_frame(to_numpy(W), to_numpy(Theta), V, C, it))
        _record(rows, it, "router", "router_sum_norm", Theta.detach().sum(dim=-1).norm(dim=-1))
        if Xt is None:
            return
        with torch.no_grad():
            out = moe_forward(Xt, W, Theta, activation)
        counts = mt.dispatch_counts(test.cluster, to_numpy(out["expert"]), test.config.K, M)
        _record(rows, it, "test", "accuracy", mt.accuracy(test.y, to_numpy(out["F"])))
        _record(rows, it, "test", "dispatch_entropy", mt.dispatch_entropy(counts))
        _record(rows, it, "test", "n_dead_experts", (counts.sum(axis=1) == 0).sum(axis=1))

    t0 = time.perf_counter()
    evaluate(0, None)
    for t in range(T):
        noise = router_noise * rand(gens, (n, M), device=dev, dtype=dt) if router_noise > 0 else None
        loss, _ = moe_loss(X, y, W, Theta, activation, noise, load_balance, s=S)
        gW, gTheta = torch.autograd.grad(loss.sum(), (W, Theta))
        with torch.no_grad():
            norm = gW.flatten(2).norm(dim=-1)[:, :, None, None]
            W -= eta * torch.where(norm > 0, gW / norm.clamp_min(torch.finfo(dt).tiny), torch.zeros_like(gW))
            Theta -= eta_r * gTheta
        if (t + 1) % eval_every == 0 or t + 1 == T:
            evaluate(t + 1, loss.detach())
    wall = time.perf_counter() - t0
    config = dict(model=f"moe-{activation}", M=M, J=J, activation=activation, T=T, eta=eta, eta_r=eta_r,
                  sigma0=sigma0, router_noise=router_noise, load_balance=load_balance, n_train=n,
                  optimizer="normalized-gd/gd", device=str(dev), dtype=str(dt).replace("torch.", ""))
    return ClusterMoEFit("moe", activation, W.detach(), Theta.detach(), None, config, pd.DataFrame(rows),
                         pd.concat(align, ignore_index=True), seeds, wall)


@validate_arguments(J=Integer(1), T=Integer(0), lr=Optional(Real(0, open_low=True)), weight_decay=Real(0),
                    sigma0=Real(0, open_low=True), bias=Boolean(), batch_size=Optional(Integer(1)),
                    eval_every=Optional(Integer(1)), seed=Seed(), device=Device(), dtype=Dtype())
def fit_single_cnn(train: ClusterData, *, J: int = 128, activation: str = "cubic", T: int = 2000,
                   optimizer: str = "adam", lr: float | None = None, weight_decay: float = 5e-4,
                   sigma0: float = 0.1, train_second_layer: bool | None = None, bias: bool = False,
                   batch_size: int | None = None,
                   test: ClusterData | None = None, eval_every: int | None = None, seed: SeedLike = 0,
                   device: str | torch.device = "auto", dtype: torch.dtype | str | None = None) -> ClusterMoEFit:
    """Fit ``R`` single two-layer CNNs (the patch-additive baselines of chen2022 Tables 1, 3, 7, 8).

    Parameters
    ----------
    J : int
        Width (paper: 128 and 512).
    activation : str
        One of :data:`ACTIVATIONS` (cubic, linear, relu, celu, gelu, tanh).
    optimizer : {"adam", "gd"}
        Full-batch Adam (App. A.2) or gradient descent (main text); both with L2 weight decay.
    lr : float, optional
        Step size; default 0.01, or 0.003 for the linear activation (App. A.2).
    train_second_layer : bool, optional
        Train the output weights :math:`a_j` (initialised at 1); default: fixed for odd activations.
    bias : bool
        Give every filter a trained bias :math:`b_j` (initialised at 0): :math:`\\sigma(\\langle w_j,
        x^{(p)}\\rangle + b_j)`, the family of Thm 4.1.  Default False, the bias-free CNN of eq. 3.1.
    batch_size : int, optional
        ``None`` (default): full-batch steps.  Otherwise each of the ``T`` steps uses ``batch_size``
        examples drawn uniformly with replacement, independently per replicate (from the replicate's own
        generator, after its initialisation draw); the loss is the mean over the batch.
    weight_decay, sigma0, test, eval_every, seed, device, dtype
        As in :func:`fit_cluster_moe` (``weight_decay`` is the L2 penalty of the optimizer).

    Returns
    -------
    ClusterMoEFit
        With ``kind="single"``, ``W`` of shape (R, 1, d, J) and the output weights in ``a``.
    """
    T, eval_every = _common_checks(train, test, T, eval_every)
    J = check_int("J", J)
    activation = check_choice("activation", activation, ACTIVATIONS)
    optimizer = check_choice("optimizer", optimizer, ("adam", "gd"))
    lr = _check_positive("lr", (0.003 if activation == "linear" else 0.01) if lr is None else lr)
    weight_decay, sigma0 = _check_nonneg("weight_decay", weight_decay), _check_positive("sigma0", sigma0)
    train_a = not get_expert(activation).odd if train_second_layer is None else bool(train_second_layer)
    if batch_size is not None:
        batch_size = check_int("batch_size", batch_size)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    R, n, _, d = train.X.shape
    seeds = replicate_seeds(seed, R)
    gens = seeded_generators(seeds)
    X, y = _tensors(train, dev, dt)
    Xt, _ = _tensors(test, dev, dt) if test is not None else (None, None)
    W = (sigma0 * randn(gens, (d, J), device=dev, dtype=dt)).requires_grad_(True)
    a = torch.ones((R, J), device=dev, dtype=dt, requires_grad=train_a)
    b = torch.zeros((R, J), device=dev, dtype=dt, requires_grad=True) if bias else None
    params = [W] + ([a] if train_a else []) + ([b] if bias else [])
    opt = (torch.optim.Adam(params, lr=lr, weight_decay=weight_decay) if optimizer == "adam"
           else torch.optim.SGD(params, lr=lr, weight_decay=weight_decay))
    rows: list[dict[str, Any]] = []
    align: list[pd.DataFrame] = []

    def evaluate(it: int, train_loss: torch.Tensor | None) -> None:
        if train_loss is not None:
            _record(rows, it, "train", "loss", train_loss)
        align.append(mt.alignment_frame(to_numpy(W)[:, None], None, train.V, train.C, it))
        if Xt is not None:
            with torch.no_grad():
                score = to_numpy(single_forward(Xt, W, a, activation, b))
            _record(rows, it, "test", "accuracy", mt.accuracy(test.y, score))

    t0 = time.perf_counter()
    evaluate(0, None)
    rows_r = torch.arange(R, device=dev)[:, None]
    for t in range(T):
        opt.zero_grad(set_to_none=True)
        if batch_size is None:
            Xb, yb = X, y
        else:
            idx = randint(gens, n, batch_size, device=dev)
            Xb, yb = X[rows_r, idx], y[rows_r, idx]
        loss = Fnn.softplus(-yb * single_forward(Xb, W, a, activation, b)).mean(dim=1)
        loss.sum().backward()
        opt.step()
        if (t + 1) % eval_every == 0 or t + 1 == T:
            evaluate(t + 1, loss.detach())
    wall = time.perf_counter() - t0
    config = dict(model=f"single-{activation}", M=1, J=J, activation=activation, T=T, optimizer=optimizer, lr=lr,
                  weight_decay=weight_decay, sigma0=sigma0, train_second_layer=train_a, bias=bool(bias),
                  batch_size=batch_size,
                  n_train=n,
                  device=str(dev), dtype=str(dt).replace("torch.", ""))
    return ClusterMoEFit("single", activation, W.detach()[:, None], None, a.detach(), config, pd.DataFrame(rows),
                         pd.concat(align, ignore_index=True), seeds, wall, None if b is None else b.detach())
