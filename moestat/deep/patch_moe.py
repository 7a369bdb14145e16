r"""Patch-level MoE (pMoE) with expert-choice top-l routing, and its CNN baseline (chowdhury2023).

Models (all bias-free, ReLU, output weights fixed at initialisation, paper §3):

* **pMoE**, eq. (1): with :math:`k` experts of :math:`m/k` neurons, router kernels
  :math:`w_s \in \mathbb R^d`, routing scores :math:`g_{j,s}(x) = \langle w_s, x^{(j)}\rangle` and
  :math:`J_s(x)` the indices of the **top-l** scores of expert :math:`s` (expert-choice routing:
  each expert takes exactly :math:`l` patches; a patch may go to several experts or none),

  .. math::
     f_M(\theta, x) = \sum_{s=1}^{k}\sum_{r=1}^{m/k} \frac{a_{r,s}}{l}
        \sum_{j\in J_s(x)} \mathrm{ReLU}(\langle w_{r,s}, x^{(j)}\rangle)\, G_{j,s}(x).

  Gating ``"hard"``: :math:`G \equiv 1` (eq. 3, separate training).  ``"softmax_selected"``:
  :math:`G_{j,s} = e^{g_{j,s}} / \sum_{i\in J_s} e^{g_{i,s}}` — **the corrected eq. (4)**: the paper
  prints the denominator :math:`\sum_{i\in J_s} g_{i,s}`, a typo; Lemma H.1 (gates summing to one),
  eq. (26) (its exact gradient, checked in the tests) and the authors' MNIST code all use the
  softmax over the selected set.  ``"softmax_all"``: softmax over all :math:`n` scores, then
  top-l (the authors' WRN code; selected gates do not sum to one).
* **CNN**, eq. (5): :math:`f_C(\theta, x) = \sum_{r=1}^{m} a_r \frac1n \sum_{j=1}^{n}
  \mathrm{ReLU}(\langle w_r, x^{(j)}\rangle)`.

Training (§3.2, Algorithms 1-2): minibatch SGD on the logistic loss (2),
:math:`L = \frac1N\sum_i \log(1 + e^{-y_i f(x_i)})`, with the output layer fixed.

* **separate** (k = 2): the routers minimise the linear loss (6),
  :math:`l_r = -\frac{1}{N_r}\sum_i y_i \langle w_1 - w_2, \sum_j x_i^{(j)}\rangle`, first; its
  gradient does not depend on :math:`w`, so ``router_method="closed_form"`` gives SGD's end point,
  :math:`w_{1,2} = w_{1,2}^{(0)} \pm \eta_r E_r \frac{1}{B_r}\sum_{i\le N_r} y_i \sum_j x_i^{(j)}`
  (exact when :math:`B_r` divides :math:`N_r`); ``"sgd"`` runs the minibatch loop.  Then the experts
  train with the routers frozen and :math:`G \equiv 1`.
* **joint**: routers and experts are updated together by SGD on (2) with the corrected eq. (4)
  gates; top-l selection passes no gradient, so autograd reproduces eq. (26) exactly.
* ``epochs=1`` is the theory's one-pass SGD (:math:`T = N/B`); more epochs reproduce the
  experiments' multi-epoch protocol (150 epochs in the authors' code).

Everything is batched over *lanes*: independent replicates x training sizes with stacked
weights, one tensor program per step (``torch.einsum`` over a leading lane axis).  Lane ``(r, N)``
trains on the first ``N`` samples of replicate ``r`` (nested designs share draws across sizes);
lanes with fewer steps get zero-weight batches at the end, which leave their weights unchanged.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

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
from ..fit.base import FixedBudgetFit, add_settings, check_reps, select_history, weights_tidy

SeedArg = int | np.random.SeedSequence | Sequence[np.random.SeedSequence] | None

GATINGS = ("hard", "softmax_selected", "softmax_all")


# ----------------------------------------------------------------------------------------------
# model formulas (pure functions of stacked parameters; leading lane axis L)
# ----------------------------------------------------------------------------------------------

def expert_choice_topl(scores: torch.Tensor, l: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Expert-choice routing: for each expert, the top-``l`` patches by score.

    Parameters
    ----------
    scores : Tensor, shape (..., k, n)
        Routing scores :math:`g_{j,s} = \langle w_s, x^{(j)}\rangle`.
    l : int
        Patches kept per expert (``1 <= l < n``).

    Returns
    -------
    values, idx : Tensor, shape (..., k, l)
        The selected scores (differentiable) and patch indices :math:`J_s(x)` (sorted by score).
    """
    return scores.topk(l, dim=-1)


def pmoe_logits(X: torch.Tensor, router: torch.Tensor, W: torch.Tensor, a: torch.Tensor, *, l: int,
                gating: str = "hard", scale: str = "l") -> torch.Tensor:
    r"""pMoE output :math:`f_M(\theta, x)` of chowdhury2023 eq. (1), batched over lanes.

    Parameters
    ----------
    X : Tensor, shape (L, B, n, d)
    router : Tensor, shape (L, k, d)
        Gating kernels :math:`w_s`.
    W : Tensor, shape (L, k, m/k, d)
        Hidden weights :math:`w_{r,s}`.
    a : Tensor, shape (L, k, m/k)
        Output weights :math:`a_{r,s}`.
    l : int
        Patches per expert.
    gating : {"hard", "softmax_selected", "softmax_all"}
        eq. (3), the corrected eq. (4), or the authors' WRN variant.
    scale : {"l", "n"}
        Normalise the patch sum by :math:`1/l` (eq. 1) or :math:`1/n` (the authors' code, global
        average pooling over all positions).

    Returns
    -------
    Tensor, shape (L, B)
    """
    L, B, n, d = X.shape
    k, me = W.shape[1], W.shape[2]
    # layouts chosen so that every product is a batched matmul over (lane, expert) without copies
    scores = torch.matmul(router, X.reshape(L, B * n, d).transpose(1, 2)).view(L, k, B, n)
    top, idx = expert_choice_topl(scores, l)                                         # (L, k, B, l)
    base = torch.arange(L, device=X.device).view(L, 1, 1, 1) * (B * n) + torch.arange(B, device=X.device).view(
        1, 1, B, 1) * n
    Xsel = X.reshape(L * B * n, d).index_select(0, (base + idx).reshape(-1)).view(L * k, B * l, d)
    h = torch.relu(torch.matmul(Xsel, W.reshape(L * k, me, d).transpose(1, 2))).view(L, k, B, l, me)
    if gating == "softmax_selected":
        h = h * torch.softmax(top, dim=-1).unsqueeze(-1)
    elif gating == "softmax_all":
        h = h * torch.gather(torch.softmax(scores, dim=-1), 3, idx).unsqueeze(-1)
    return torch.einsum("lkbjm,lkm->lb", h, a) / (l if scale == "l" else n)


def cnn_logits(X: torch.Tensor, W: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    r"""CNN output :math:`f_C(\theta, x)` of chowdhury2023 eq. (5), batched over lanes.

    ``X`` (L, B, n, d), ``W`` (L, m, d), ``a`` (L, m) -> (L, B).
    """
    h = torch.relu(torch.einsum("lbnd,lmd->lbmn", X, W)).mean(-1)
    return torch.einsum("lbm,lm->lb", h, a)


def router_gradient_eq26(x: np.ndarray, y: int, router: np.ndarray, W: np.ndarray, a: np.ndarray, *,
                         l: int, scale: str = "l") -> np.ndarray:
    r"""Router gradient of the per-sample logistic loss under joint training, chowdhury2023 eq. (26).

    .. math::
       \frac{\partial \mathcal L}{\partial w_s} = -y\, v \sum_{r=1}^{m/k} a_{r,s}\, \frac1l
       \sum_{j\in J_s} \mathrm{ReLU}(\langle w_{r,s}, x^{(j)}\rangle)\, G_{j,s}
       \sum_{i \in J_s\setminus j} (x^{(j)} - x^{(i)})\, G_{i,s},
       \qquad v = \frac{1}{1 + e^{y f_M(\theta, x)}},

    with :math:`G` the softmax over the selected set (the corrected eq. 4) and :math:`r` summed
    over the expert's :math:`m/k` neurons (the paper writes :math:`[m]`, a slip).  A plain numpy
    reference (one sample, loops) used to check the autograd trainer.

    Parameters
    ----------
    x : ndarray, shape (n, d)
    y : {+1, -1}
    router : ndarray, shape (k, d)
    W : ndarray, shape (k, m/k, d)
    a : ndarray, shape (k, m/k)

    Returns
    -------
    ndarray, shape (k, d)
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    norm = l if scale == "l" else n
    k = router.shape[0]
    f = 0.0
    parts = []
    for s in range(k):
        g = x @ router[s]
        J = np.argsort(-g, kind="stable")[:l]
        G = np.exp(g[J] - g[J].max())
        G /= G.sum()
        relu = np.maximum(x[J] @ W[s].T, 0.0)  # (l, m/k)
        f += float(a[s] @ (relu * G[:, None]).sum(0)) / norm
        parts.append((J, G, relu))
    v = 1.0 / (1.0 + np.exp(y * f))
    grad = np.zeros_like(router, dtype=np.float64)
    for s, (J, G, relu) in enumerate(parts):
        for jj, j in enumerate(J):
            inner = sum(((x[j] - x[i]) * G[ii] for ii, i in enumerate(J) if i != j), np.zeros(x.shape[1]))
            grad[s] += float(a[s] @ relu[jj]) / norm * G[jj] * inner
    return -y * v * grad


# ----------------------------------------------------------------------------------------------
# data handling
# ----------------------------------------------------------------------------------------------

def _as_arrays(data: Any, y: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(X (R, N, n, d), y (R, N)) from a PatchData or arrays (a single replicate may drop the R axis)."""
    if y is None:
        if not hasattr(data, "X") or not hasattr(data, "y"):
            raise TypeError("data must be a PatchData (from simulate_patches) or pass X and y arrays.")
        X, y = data.X, data.y
    else:
        X = data
    X = to_numpy(X).astype(np.float64, copy=False)
    y = to_numpy(y)
    if X.ndim == 3:
        X, y = X[None], np.asarray(y)[None]
    if X.ndim != 4 or y.shape != X.shape[:2]:
        raise ValueError(f"expected X of shape (R, N, n_patches, d) and y of shape (R, N); got X {X.shape}, "
                         f"y {np.shape(y)}.")
    if not np.isin(y, (-1, 1)).all():
        raise ValueError("labels y must be coded +1 / -1 (chowdhury2023's convention).")
    if not np.isfinite(X).all():
        raise ValueError("X contains NaN or infinite values; remove those samples before fitting.")
    return X, y.astype(np.float64)


def _check_lr(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite learning rate, got {value!r}; SGD needs a step > 0.")
    return float(value)


def _lanes(R: int, N: int, sizes: Sequence[int] | None) -> pd.DataFrame:
    if sizes is None:
        sizes = [N]
    sizes = [check_int("sizes", s) for s in sizes]
    if max(sizes) > N:
        raise ValueError(f"sizes must not exceed the {N} samples per replicate in the data; got max {max(sizes)}.")
    reps, ns = np.meshgrid(np.arange(R), np.asarray(sizes), indexing="ij")
    return pd.DataFrame({"lane": np.arange(reps.size), "rep": reps.ravel(), "n_train": ns.ravel()})


class _LaneStream:
    """The minibatch stream of one lane: per epoch a fresh permutation, padded to whole batches."""

    def __init__(self, rng: np.random.Generator, N: int, B: int, epochs: int) -> None:
        self.rng, self.N, self.B = rng, N, B
        self.nb = math.ceil(N / B)
        self.total = epochs * self.nb
        self.done = 0
        self.buf_idx = np.zeros((0, B), dtype=np.int64)
        self.buf_w = np.zeros((0, B), dtype=bool)

    def take(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        want = min(c, self.total - self.done)
        while self.buf_idx.shape[0] < want:
            perm = np.zeros(self.nb * self.B, dtype=np.int64)
            w = np.zeros(self.nb * self.B, dtype=bool)
            perm[: self.N] = self.rng.permutation(self.N)
            w[: self.N] = True
            self.buf_idx = np.concatenate([self.buf_idx, perm.reshape(self.nb, self.B)])
            self.buf_w = np.concatenate([self.buf_w, w.reshape(self.nb, self.B)])
        idx = np.zeros((c, self.B), dtype=np.int64)
        w = np.zeros((c, self.B), dtype=bool)
        idx[:want], w[:want] = self.buf_idx[:want], self.buf_w[:want]
        self.buf_idx, self.buf_w = self.buf_idx[want:], self.buf_w[want:]
        self.done += want
        return idx, w


def _weighted_logistic(f: torch.Tensor, yb: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
    """Sum over lanes of each lane's mean logistic loss over its real batch items (eq. 2 / eq. 10)."""
    per = F.softplus(-yb * f) * wb
    return (per.sum(1) / wb.sum(1).clamp(min=1.0)).sum()


# ----------------------------------------------------------------------------------------------
# fitted model
# ----------------------------------------------------------------------------------------------

@dataclass
class PatchFit(FixedBudgetFit):
    """A batch of trained pMoE or CNN models (one per lane = replicate x training size), a
    :class:`~moestat.fit.base.FitResult` over lanes: ``objective`` is a lane's training loss at its last
    evaluation, ``n_iter`` the epoch budget (minibatch SGD runs a fixed budget, so ``converged`` is False).

    Attributes
    ----------
    model : {"pmoe", "cnn"}
    params : dict of Tensor
        Stacked weights, on the CPU whatever device trained them: pMoE ``router (L,k,d)``, ``W (L,k,m/k,d)``,
        ``a (L,k,m/k)``; CNN ``W (L,m,d)``, ``a (L,m)``.  Predictions run on the training device when it is
        present here, else on the CPU.
    lanes : DataFrame
        ``lane, rep, n_train, seed``: which data replicate and how many of its first samples each
        lane trained on, and the lane's SeedSequence (``entropy/spawn_key``).
    config : dict
        Every knob of the fit (recorded in :meth:`to_frame`).
    history : DataFrame
        Tidy per-lane evaluations at ``eval_epochs`` (epoch, train_loss, train_acc, test_acc).
    """

    model: str
    params: dict[str, torch.Tensor]
    lanes: pd.DataFrame
    config: dict[str, Any]
    history: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def n_reps(self) -> int:
        """Number of lanes (the fit's replicate axis)."""
        return len(self.lanes)

    @property
    def objective(self) -> np.ndarray:
        """(L,) the training loss at each lane's last evaluation (NaN if none was recorded)."""
        out = np.full(self.n_reps, np.nan)
        h = self.history
        if len(h) and "train_loss" in h:
            last = h.sort_values("epoch").groupby("lane").tail(1)
            out[last["lane"].to_numpy(int)] = last["train_loss"].to_numpy(float)
        return out

    def tidy(self) -> pd.DataFrame:
        """One row per lane × weight block × expert × coordinate (``coef`` = ``"i,j"``)."""
        axes = {"router": 1, "W": 1, "a": 1} if self.model == "pmoe" else {"W": 1, "a": 1}
        return weights_tidy(self.params, axes)

    def _budget(self) -> int:
        return int(self.config.get("epochs", 0))

    def glance(self) -> pd.DataFrame:
        """One row per lane: data replicate, training size, final training loss, budget and scalar settings."""
        frame = self.lanes[["lane", "rep", "n_train"]].reset_index(drop=True).rename(columns={"rep": "data_rep"})
        frame.insert(0, "rep", np.arange(self.n_reps))
        frame["model"] = self.name
        frame["objective"], frame["converged"], frame["n_iter"] = self.objective, self.converged, self.n_iter
        return add_settings(frame, self.config)

    def select(self, rep) -> PatchFit:
        """The fit of lane(s) ``rep`` (renumbered 0, 1, ...; each keeps its data replicate and training size)."""
        idx = check_reps(rep, self.n_reps)
        first = next(iter(self.params.values()))
        it = torch.as_tensor(idx, device=first.device)
        lanes = self.lanes.iloc[idx].reset_index(drop=True).assign(lane=np.arange(len(idx)))
        return PatchFit(self.model, {k: v[it] for k, v in self.params.items()}, lanes, dict(self.config),
                        select_history(self.history, idx, column="lane"))

    @property
    def name(self) -> str:
        """``pmoe-separate``, ``pmoe-joint`` or ``cnn``."""
        return "cnn" if self.model == "cnn" else f"pmoe-{self.config['training']}"

    def _device(self) -> torch.device:
        dev = torch.device(self.config.get("device", "cpu"))
        return dev if dev.type == "cpu" or torch.cuda.is_available() else torch.device("cpu")

    def _logits(self, X: torch.Tensor) -> torch.Tensor:
        p = {name: v.to(X.device) for name, v in self.params.items()}
        if self.model == "cnn":
            return cnn_logits(X, p["W"], p["a"])
        return pmoe_logits(X, p["router"], p["W"], p["a"], l=self.config["l"], gating=self.config["gating"],
                           scale=self.config["scale"])

    @torch.no_grad()
    def decision_function(self, data: Any, *, chunk: int = 64) -> np.ndarray:
        """Logits :math:`f(x)` of every lane on its replicate's samples: (L, N).

        ``data`` is a PatchData or an array X (R, N, n, d); lane ``i`` is evaluated on replicate
        ``lanes.rep[i]`` (a single replicate is shared by all lanes).
        """
        X = data.X if hasattr(data, "X") else to_numpy(data)
        if X.ndim == 3:
            X = X[None]
        ref, dev = self.params["W"], self._device()
        rep = np.array(self.lanes["rep"]) if X.shape[0] > 1 else np.zeros(len(self.lanes), dtype=np.int64)
        if X.shape[0] > 1 and rep.max() >= X.shape[0]:
            raise ValueError(f"data has {X.shape[0]} replicates but the fit has lanes on replicate {rep.max()}.")
        Xt = torch.as_tensor(X, dtype=ref.dtype, device=dev)
        rep_t = torch.as_tensor(rep, device=dev)
        out = [self._logits(Xt[rep_t, s:s + chunk]) for s in range(0, X.shape[1], chunk)]
        return to_numpy(torch.cat(out, dim=1))

    def accuracy(self, data: Any, y: Any = None) -> np.ndarray:
        r"""Test accuracy :math:`\hat P[y f(x) > 0]` of every lane, shape (L,)."""
        X, yy = _as_arrays(data, y)
        f = self.decision_function(X)
        rep = np.array(self.lanes["rep"]) if X.shape[0] > 1 else np.zeros(len(self.lanes), dtype=np.int64)
        return (yy[rep] * f > 0).mean(1)

    def routing_hit_rate(self, data: Any, *, chunk: int = 64) -> pd.DataFrame:
        r"""How often the discriminative patch is routed (Lemma 4.1, Fig. 8; Assumption 4.4, Fig. 9).

        Per lane and class :math:`c`: ``hit`` :math:`= \max_s P(j_o \in J_s(x) \mid y=c)` and, for
        softmax gates, ``maxgate`` :math:`= \max_s P(j_o \in J_s,\ G_{j_o,s} = \max_j G_{j,s} \mid y=c)`
        with ``expert`` the maximising :math:`s`.  Separate training fixes expert 0 for y=+1 and
        expert 1 for y=-1.  Needs ``data.pos`` (a PatchData).
        """
        if self.model != "pmoe":
            raise ValueError("routing_hit_rate applies to pMoE fits only.")
        if not hasattr(data, "pos"):
            raise TypeError("routing_hit_rate needs a PatchData with the positions of the discriminative patch.")
        dev = self._device()
        ref = self.params["router"].to(dev)
        X = data.X
        rep = np.array(self.lanes["rep"]) if X.shape[0] > 1 else np.zeros(len(self.lanes), dtype=np.int64)
        rep_t = torch.as_tensor(rep, device=dev)
        Xt = torch.as_tensor(X, dtype=ref.dtype, device=dev)
        with torch.no_grad():   # chunks over samples keep the (lanes x chunk x n x d) gather small
            idx = torch.cat([expert_choice_topl(torch.einsum("lbnd,lkd->lbkn", Xt[rep_t, s:s + chunk], ref),
                                                self.config["l"])[1] for s in range(0, X.shape[1], chunk)], dim=1)
        idx = to_numpy(idx)
        pos = data.pos[rep][:, :, None, None]
        hit = (idx == pos).any(-1)          # (L, N, k)
        top = idx[..., 0] == pos[..., 0]     # (L, N, k): o has the largest score, hence the largest gate
        rows = []
        for c in (1, -1):
            sel = data.y[rep] == c          # (L, N)
            cnt = sel.sum(1)[:, None]
            h = (hit & sel[:, :, None]).sum(1) / cnt
            t = (top & sel[:, :, None]).sum(1) / cnt
            if self.config["training"] == "separate":
                s = np.full(len(self.lanes), 0 if c == 1 else 1)
            else:
                s = t.argmax(1)
            lanes = np.arange(len(self.lanes))
            rows.append(self.lanes.assign(cls=c, expert=s, hit=h[lanes, s], maxgate=t[lanes, s]))
        return pd.concat(rows, ignore_index=True)

    def to_frame(self, test: Any = None, y: Any = None) -> pd.DataFrame:
        """Tidy frame, one row per lane: model, rep, n_train, (accuracy on ``test``) and every config knob."""
        frame = self.lanes.assign(model=self.name)
        if test is not None:
            frame["accuracy"] = self.accuracy(test, y)
        for key, val in self.config.items():
            if key not in frame.columns:
                frame[key] = val if not isinstance(val, (list, tuple, dict)) else repr(val)
        return frame


# ----------------------------------------------------------------------------------------------
# trainers
# ----------------------------------------------------------------------------------------------

def _setup(data, y, sizes, seed, device, dtype):
    X, yy = _as_arrays(data, y)
    R, N = X.shape[:2]
    lanes = _lanes(R, N, sizes)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    if isinstance(seed, (list, tuple)):
        if len(seed) != len(lanes) or not all(isinstance(s, np.random.SeedSequence) for s in seed):
            raise ValueError(f"seed given as a list must hold one numpy.random.SeedSequence per lane ({len(lanes)}).")
        lane_seeds = list(seed)
    else:
        root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        lane_seeds = root.spawn(len(lanes))
    lanes["seed"] = [f"{s.entropy}/{'-'.join(map(str, s.spawn_key))}" for s in lane_seeds]
    return X, yy, lanes, dev, dt, lane_seeds


def _on_cpu(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: v.detach().cpu() for name, v in params.items()}


def _train(params: dict[str, torch.Tensor], trainable: Sequence[str], logits_fn, X: np.ndarray, y: np.ndarray,
           lanes: pd.DataFrame, rngs: list[np.random.Generator], *, lr: dict[str, float], batch_size: int,
           epochs: int, eval_epochs: Sequence[int], test: tuple[torch.Tensor, torch.Tensor] | None,
           stop_at_zero_error: bool = False, chunk_steps: int = 256) -> pd.DataFrame:
    """Minibatch SGD over all lanes at once; returns the history frame.

    ``logits_fn(P, Xb)`` maps a parameter dict of lanes-first tensors and a batch (L', B, n, d) to
    logits (L', B).  Lanes that have finished their ``epochs * ceil(N/B)`` steps leave the active
    set, so a grid of training sizes costs the sum of its sizes, not size x grid.  With
    ``stop_at_zero_error`` a lane stops at the end of the first epoch in which none of its
    minibatch samples was misclassified (counted before each update, like Keras's epoch accuracy).
    Adds ``epochs_run`` to ``lanes``.
    """
    ref = params[trainable[0]]
    dev, dt = ref.device, ref.dtype
    Xt = torch.as_tensor(X, dtype=dt, device=dev)
    yt = torch.as_tensor(y, dtype=dt, device=dev)
    rep_all = torch.as_tensor(np.array(lanes["rep"]), device=dev)
    sizes = np.array(lanes["n_train"])
    streams = [_LaneStream(g, int(N), batch_size, epochs) for g, N in zip(rngs, sizes, strict=True)]
    totals = np.array([s.total for s in streams])
    eval_at: dict[int, list[tuple[int, int]]] = {}
    for i, s in enumerate(streams):
        for e in eval_epochs:
            eval_at.setdefault(int(e * s.nb), []).append((i, int(e)))
    eval_steps = sorted(eval_at)
    hist: list[pd.DataFrame] = []
    nb_all = torch.as_tensor([s.nb for s in streams], device=dev)
    errs = torch.zeros(len(streams), dtype=dt, device=dev)
    stop_step = torch.zeros(len(streams), dtype=torch.long, device=dev)
    t = 0
    while (totals > t).any():
        act = np.flatnonzero(totals > t)
        nxt = [u for u in eval_steps if u > t]
        c = int(min(chunk_steps, totals[act].min() - t, (nxt[0] - t) if nxt else chunk_steps))
        act_t = torch.as_tensor(act, device=dev)
        P = {nm: v[act_t].clone() for nm, v in params.items()}
        for nm in trainable:
            P[nm].requires_grad_(True)
        rep = rep_all[act_t]
        taken = [streams[i].take(c) for i in act]
        idx_all = torch.as_tensor(np.stack([a for a, _ in taken], axis=1), device=dev)   # (c, L', B)
        w_all = torch.as_tensor(np.stack([b for _, b in taken], axis=1), dtype=dt, device=dev)
        live = stop_step[act_t] == 0
        err, nb = errs[act_t], nb_all[act_t]
        for u in range(c):
            idx = idx_all[u]
            yb, wb = yt[rep[:, None], idx], w_all[u] * live[:, None] if stop_at_zero_error else w_all[u]
            f = logits_fn(P, Xt[rep[:, None], idx])
            grads = torch.autograd.grad(_weighted_logistic(f, yb, wb), [P[nm] for nm in trainable])
            with torch.no_grad():
                for nm, g in zip(trainable, grads, strict=True):
                    P[nm] -= lr[nm] * g
                if stop_at_zero_error:
                    err += ((yb * f <= 0) * wb).sum(1)
                    end = (t + u + 1) % nb == 0
                    now = end & (err == 0) & live
                    stop_step[act_t[now]] = t + u + 1
                    live &= ~now
                    err = torch.where(end, torch.zeros_like(err), err)
        with torch.no_grad():
            for nm in trainable:
                params[nm][act_t] = P[nm].detach()
            errs[act_t] = err
        t += c
        if stop_at_zero_error:
            stopped = to_numpy(stop_step) > 0
            totals[stopped] = np.minimum(totals[stopped], to_numpy(stop_step)[stopped])
        if t in eval_at:
            hist.append(_evaluate(logits_fn, params, Xt, yt, rep_all, sizes, eval_at[t], test, lanes))
    lanes["epochs_run"] = totals // np.array([s.nb for s in streams])
    return pd.concat(hist, ignore_index=True) if hist else pd.DataFrame()


@torch.no_grad()
def _evaluate(logits_fn, params, Xt, yt, rep, sizes, which, test, lanes, chunk: int = 64) -> pd.DataFrame:
    lane_ids = [i for i, _ in which]
    sel = torch.as_tensor(lane_ids, device=Xt.device)
    P = {nm: v[sel] for nm, v in params.items()}
    rep = rep[sel]
    sizes = sizes[lane_ids]
    N = Xt.shape[1]
    f = torch.cat([logits_fn(P, Xt[rep, s:s + chunk]) for s in range(0, N, chunk)], dim=1)
    yy = yt[rep]
    mask = torch.arange(N, device=Xt.device)[None, :] < torch.as_tensor(sizes, device=Xt.device)[:, None]
    loss = (F.softplus(-yy * f) * mask).sum(1) / mask.sum(1)
    acc = ((yy * f > 0) & mask).sum(1) / mask.sum(1)
    rows = lanes.iloc[lane_ids][["lane", "rep", "n_train"]].copy()
    rows["epoch"] = [e for _, e in which]
    rows["train_loss"] = to_numpy(loss)
    rows["train_acc"] = to_numpy(acc)
    if test is not None:
        Xs, ys = test
        trep = rep if Xs.shape[0] > 1 else torch.zeros_like(rep)
        ft = torch.cat([logits_fn(P, Xs[trep, s:s + chunk]) for s in range(0, Xs.shape[1], chunk)], dim=1)
        rows["test_acc"] = to_numpy((ys[trep] * ft > 0).double().mean(1))
    return rows


def _init_gauss(rngs: list[np.random.Generator], shape: tuple[int, ...], std: float, dev, dt) -> torch.Tensor:
    return torch.as_tensor(np.stack([g.normal(0.0, std, size=shape) for g in rngs]), dtype=dt, device=dev)


def _common_checks(lr, batch_size, epochs, eval_epochs):
    lr = _check_lr("lr", lr)
    batch_size = check_int("batch_size", batch_size)
    epochs = check_int("epochs", epochs)
    eval_epochs = [check_int("eval_epochs", e) for e in (eval_epochs or [])]
    if any(e > epochs for e in eval_epochs):
        raise ValueError(f"eval_epochs must not exceed epochs={epochs}, got {eval_epochs}.")
    return lr, batch_size, epochs, eval_epochs


def _test_tensors(test, dev, dt):
    if test is None:
        return None
    Xs, ys = _as_arrays(test)
    return torch.as_tensor(Xs, dtype=dt, device=dev), torch.as_tensor(ys, dtype=dt, device=dev)


def separate_router(X: np.ndarray, y: np.ndarray, router0: torch.Tensor, lanes: pd.DataFrame, *,
                    router_lr: float, router_epochs: int, router_batch_size: int, n_router: int | None,
                    method: str, rngs: list[np.random.Generator] | None = None) -> torch.Tensor:
    r"""Train the two separate-training routers on the linear loss (6) of chowdhury2023.

    ``closed_form``: :math:`w_{1,2} = w^{(0)}_{1,2} \pm \eta_r E_r \frac{1}{B_r}\sum_{i\le N_r} y_i
    \sum_j x_i^{(j)}` — the end point of :math:`E_r` epochs of minibatch SGD when :math:`B_r`
    divides :math:`N_r` (the gradient of (6) does not depend on the weights).  ``sgd``: the
    explicit minibatch loop (a last partial batch is averaged over its own size).
    Lane ``i`` uses the first ``min(n_router, n_train_i)`` samples of its replicate (the authors'
    code reuses the expert-training samples).  Returns ``router (L, 2, d)``.
    """
    dev, dt = router0.device, router0.dtype
    sizes = np.array(lanes["n_train"])
    nr = np.minimum(sizes, n_router) if n_router is not None else sizes
    Xt = torch.as_tensor(X, dtype=dt, device=dev)
    yt = torch.as_tensor(y, dtype=dt, device=dev)
    rep = np.array(lanes["rep"])
    psum = Xt.sum(2)  # (R, N, d): sum over patches
    router = router0.clone()
    if method == "closed_form":
        for i in range(len(lanes)):
            step = router_lr * router_epochs / router_batch_size * (yt[rep[i], : nr[i], None] * psum[rep[i], : nr[i]]
                                                                   ).sum(0)
            router[i, 0] += step
            router[i, 1] -= step
        return router
    streams = [_LaneStream(g, int(N), router_batch_size, router_epochs) for g, N in zip(rngs, nr, strict=True)]
    total = max(s.total for s in streams)
    taken = [s.take(total) for s in streams]
    idx = torch.as_tensor(np.stack([a for a, _ in taken], axis=1), device=dev)  # (T, L, B)
    w = torch.as_tensor(np.stack([b for _, b in taken], axis=1), dtype=dt, device=dev)
    rep_t = torch.as_tensor(rep, device=dev)
    for t in range(total):
        contrib = yt[rep_t[:, None], idx[t]] * w[t]                           # (L, B)
        grad1 = -(contrib[..., None] * psum[rep_t[:, None], idx[t]]).sum(1) / w[t].sum(1).clamp(min=1.0)[:, None]
        router[:, 0] -= router_lr * grad1
        router[:, 1] += router_lr * grad1
    return router


@validate_arguments(k=Optional(Integer(1)), m=Integer(1), l=Integer(1), lr=Real(0, open_low=True),
                    batch_size=Integer(1), epochs=Integer(1), router_epochs=Integer(0), router_batch_size=Integer(1),
                    stop_at_zero_error=Boolean(), seed=Seed(), device=Device(), dtype=Dtype())
def fit_pmoe(data: Any, y: Any = None, *, training: str = "separate", k: int | None = None, m: int = 40,
             l: int = 2, lr: float = 0.2, batch_size: int = 20, epochs: int = 150, gating: str | None = None,
             scale: str = "l", a_init: str = "gaussian", init_std: float | None = None,
             router_init_std: float | None = None, router_lr: float | None = None, router_epochs: int = 100,
             router_batch_size: int = 20, router_method: str = "closed_form", n_router: int | None = None,
             stop_at_zero_error: bool = False, sizes: Sequence[int] | None = None, test: Any = None,
             eval_epochs: Sequence[int] | None = None, seed: SeedArg = None, device: str = "auto",
             dtype: torch.dtype | str | None = None) -> PatchFit:
    r"""Train pMoE models (chowdhury2023 eq. 1, Algorithms 1-2) on every lane at once.

    Parameters
    ----------
    data, y : PatchData, or X (R, N, n, d) and y (R, N) in {+1, -1}
        Training data.
    training : {"separate", "joint"}
        Algorithm 1 (routers on loss (6) first, then experts with :math:`G\equiv1`; needs k = 2)
        or Algorithm 2 (routers and experts together, softmax gates over the selected patches).
    k : int, optional
        Number of experts (default 2 separate, 8 joint, as in §5.1).
    m : int
        Total neurons (m/k per expert); §5.1 uses 40.
    l : int
        Patches per expert, ``1 <= l < n``.
    lr : float
        SGD step :math:`\eta` for the expert weights (0.2 in §5.1).
    batch_size, epochs : int
        Minibatch size B and passes over the data (``epochs=1``: one-pass SGD, T = N/B).
    gating : {"hard", "softmax_selected", "softmax_all"}, optional
        Default ``"hard"`` (eq. 3) for separate and ``"softmax_selected"`` (corrected eq. 4) for joint.
    scale : {"l", "n"}
        :math:`1/l` normalisation of eq. (1) or the authors' :math:`1/n`.
    a_init : {"gaussian", "sign_by_expert"}
        Output weights :math:`a_{r,s}\sim N(0,1)` (paper) or +1 on expert 1 / -1 on expert 2
        (the authors' code, separate training).  Never trained.
    init_std : float, optional
        Std of :math:`w_{r,s}^{(0)}` (default :math:`1/\sqrt m`, eq. 8).
    router_init_std : float, optional
        Std of :math:`w_s^{(0)}` (default :math:`1/(n^2\sqrt d)`, eq. 7 without its log factor).
    router_lr, router_epochs, router_batch_size, router_method, n_router
        Separate training: the SGD of loss (6) (default :math:`\eta_r = \eta`, 100 epochs, B_r = 20,
        closed form, on the lane's own training samples).  Joint training: ``router_lr`` is the
        routers' step (default :math:`\eta`).
    stop_at_zero_error : bool
        Stop a lane after the first epoch without a misclassified training sample (§5.1: "until
        zero training error"; ``epochs`` is then the cap, 150 for the CNN in the paper).  Errors are
        counted on each minibatch before its update.  ``lanes.epochs_run`` records the epochs used.
    sizes : sequence of int, optional
        Training sizes: lane (r, N) trains on the first N samples of replicate r (default: all).
    test : PatchData, optional
        Test data for ``history`` (one replicate shared, or one per data replicate).
    eval_epochs : sequence of int, optional
        Epochs at which to record train/test metrics in ``history``.
    seed : int, SeedSequence or list of SeedSequence
        Initialisation and minibatch order; lane i uses ``SeedSequence(seed).spawn(L)[i]``, or the
        i-th sequence of a list (one per lane: re-runs one lane of a batched fit on its own).
    device, dtype
        ``"auto"`` picks CUDA when present; float64 on CPU by default.

    Returns
    -------
    PatchFit
    """
    check_choice("training", training, ("separate", "joint"))
    k = (2 if training == "separate" else 8) if k is None else check_int("k", k)
    if training == "separate" and k != 2:
        raise ValueError(f"separate training routes with the two routers of loss (6): k must be 2, got {k}.")
    m = check_int("m", m)
    if m % k:
        raise ValueError(f"m={m} must be a multiple of k={k} (m/k neurons per expert).")
    l = check_int("l", l)
    lr, batch_size, epochs, eval_epochs = _common_checks(lr, batch_size, epochs, eval_epochs)
    router_lr = lr if router_lr is None else _check_lr("router_lr", router_lr)
    router_epochs = check_int("router_epochs", router_epochs)
    router_batch_size = check_int("router_batch_size", router_batch_size)
    gating = ("hard" if training == "separate" else "softmax_selected") if gating is None else gating
    check_choice("gating", gating, GATINGS)
    check_choice("scale", scale, ("l", "n"))
    check_choice("a_init", a_init, ("gaussian", "sign_by_expert"))
    check_choice("router_method", router_method, ("closed_form", "sgd"))
    if n_router is not None:
        n_router = check_int("n_router", n_router)
    X, yy, lanes, dev, dt, lane_seeds = _setup(data, y, sizes, seed, device, dtype)
    n, d = X.shape[2], X.shape[3]
    if l >= n:
        raise ValueError(f"l={l} must be smaller than the number of patches n={n}: each expert keeps the top-l "
                         "patches; lower l.")
    init_std = 1.0 / math.sqrt(m) if init_std is None else float(init_std)
    router_init_std = 1.0 / (n**2 * math.sqrt(d)) if router_init_std is None else float(router_init_std)
    children = [s.spawn(3) for s in lane_seeds]
    init_rngs = [np.random.default_rng(c[0]) for c in children]
    me = m // k
    W = _init_gauss(init_rngs, (k, me, d), init_std, dev, dt)
    router = _init_gauss(init_rngs, (k, d), router_init_std, dev, dt)
    if a_init == "gaussian":
        a = _init_gauss(init_rngs, (k, me), 1.0, dev, dt)
    else:
        if k != 2:
            raise ValueError("a_init='sign_by_expert' needs k=2 (+1 on the y=+1 expert, -1 on the other).")
        a = torch.tensor([[1.0] * me, [-1.0] * me], dtype=dt, device=dev).expand(len(lanes), k, me).clone()
    if training == "separate":
        router = separate_router(X, yy, router, lanes, router_lr=router_lr, router_epochs=router_epochs,
                                 router_batch_size=router_batch_size, n_router=n_router, method=router_method,
                                 rngs=[np.random.default_rng(c[2]) for c in children])
    params = {"router": router, "W": W, "a": a}
    trainable = ["W"] if training == "separate" else ["W", "router"]

    def logits_fn(P, Xb):
        return pmoe_logits(Xb, P["router"], P["W"], P["a"], l=l, gating=gating, scale=scale)

    config = {"training": training, "k": k, "m": m, "l": l, "n_patches": n, "d": d, "lr": lr,
              "router_lr": router_lr, "batch_size": batch_size, "epochs": epochs, "one_pass": epochs == 1,
              "gating": gating, "scale": scale, "a_init": a_init, "init_std": init_std,
              "router_init_std": router_init_std, "router_epochs": router_epochs if training == "separate" else None,
              "router_batch_size": router_batch_size if training == "separate" else None,
              "router_method": router_method if training == "separate" else None, "n_router": n_router,
              "stop_at_zero_error": bool(stop_at_zero_error),
              "device": str(dev), "dtype": str(dt).replace("torch.", "")}
    history = _train(params, trainable, logits_fn, X, yy, lanes,
                     [np.random.default_rng(c[1]) for c in children], lr={"W": lr, "router": router_lr},
                     batch_size=batch_size, epochs=epochs, eval_epochs=eval_epochs, test=_test_tensors(test, dev, dt),
                     stop_at_zero_error=bool(stop_at_zero_error))
    return PatchFit("pmoe", _on_cpu(params), lanes, config, history)


@validate_arguments(m=Integer(1), lr=Real(0, open_low=True), batch_size=Integer(1), epochs=Integer(1),
                    stop_at_zero_error=Boolean(), seed=Seed(), device=Device(), dtype=Dtype())
def fit_cnn(data: Any, y: Any = None, *, m: int = 40, lr: float = 0.2, batch_size: int = 20, epochs: int = 150,
            init_std: float | None = None, stop_at_zero_error: bool = False, sizes: Sequence[int] | None = None,
            test: Any = None, eval_epochs: Sequence[int] | None = None, seed: SeedArg = None, device: str = "auto",
            dtype: torch.dtype | str | None = None) -> PatchFit:
    r"""Train the two-layer CNN baseline of chowdhury2023 eq. (5) by minibatch SGD on every lane at once.

    :math:`w_r^{(0)} \sim N(0, I/m)` (eq. 8, or ``init_std``), :math:`a_r \sim N(0,1)` fixed.  The
    arguments mean what they mean in :func:`fit_pmoe` (m = 40 neurons, :math:`\eta = 0.2`, B = 20,
    150 epochs by default: the paper's §5.1 text; the authors' script uses 4 filters).
    """
    m = check_int("m", m)
    lr, batch_size, epochs, eval_epochs = _common_checks(lr, batch_size, epochs, eval_epochs)
    X, yy, lanes, dev, dt, lane_seeds = _setup(data, y, sizes, seed, device, dtype)
    n, d = X.shape[2], X.shape[3]
    init_std = 1.0 / math.sqrt(m) if init_std is None else float(init_std)
    children = [s.spawn(3) for s in lane_seeds]
    init_rngs = [np.random.default_rng(c[0]) for c in children]
    params = {"W": _init_gauss(init_rngs, (m, d), init_std, dev, dt),
              "a": _init_gauss(init_rngs, (m,), 1.0, dev, dt)}

    def logits_fn(P, Xb):
        return cnn_logits(Xb, P["W"], P["a"])

    config = {"training": None, "k": 1, "m": m, "l": n, "n_patches": n, "d": d, "lr": lr, "batch_size": batch_size,
              "epochs": epochs, "one_pass": epochs == 1, "gating": None, "scale": "n", "a_init": "gaussian",
              "init_std": init_std, "stop_at_zero_error": bool(stop_at_zero_error), "device": str(dev),
              "dtype": str(dt).replace("torch.", "")}
    history = _train(params, ["W"], logits_fn, X, yy, lanes, [np.random.default_rng(c[1]) for c in children],
                     lr={"W": lr}, batch_size=batch_size, epochs=epochs, eval_epochs=eval_epochs,
                     test=_test_tensors(test, dev, dt), stop_at_zero_error=bool(stop_at_zero_error))
    return PatchFit("cnn", _on_cpu(params), lanes, config, history)
