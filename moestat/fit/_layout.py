r"""The identified parameter vector of a Gaussian MoE and its map to parameter blocks.

Inference (observed information, sandwich, Wald tests, bootstrap) works on one flat vector
:math:`\theta` per replicate, in this order:

1. gate rows ``gate[i]:const, gate[i]:x1 ... gate[i]:xd`` for the free gate rows. Softmax and
   top-K gates are invariant to adding a common :math:`(t_0, t_1)` to every row, so the
   *last* expert is the reference with :math:`(\beta_{0,k-1}, \beta_{1,k-1}) = 0` (the
   representative of :meth:`moestat.Params.normalize_softmax` with ``ref=-1``) and only rows
   ``0 .. k-2`` are free.  Sigmoid gates normalised over experts have no such invariance: all
   ``k`` rows are free.
2. expert rows ``expert[i]:const, expert[i]:x1 ... expert[i]:xd`` (``const`` only for constant
   experts);
3. ``expert[i]:log_sigma``, the log noise standard deviation of each expert (Wald intervals are
   formed on the log scale, where the likelihood is closer to quadratic).

Expert labels are 0-based, like :class:`moestat.Params` atoms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..model import MoE
from ..params import Params


@dataclass
class BlockParams:
    """Duck-typed parameter blocks with arbitrary leading batch axes (used inside the engines)."""

    gate_bias: torch.Tensor
    gate_weight: torch.Tensor
    expert_weight: torch.Tensor
    expert_bias: torch.Tensor
    noise_sd: torch.Tensor

    def to_params(self) -> Params:
        return Params(self.gate_bias.detach(), self.gate_weight.detach(), self.expert_weight.detach(),
                      self.expert_bias.detach(), self.noise_sd.detach())

    @staticmethod
    def from_params(p: Params) -> BlockParams:
        if p.noise_sd is None:
            raise ValueError("the Gaussian MoE likelihood needs params.noise_sd (one sd per expert).")
        return BlockParams(p.gate_bias, p.gate_weight, p.expert_weight, p.expert_bias, p.noise_sd)

    def map(self, fn) -> BlockParams:
        return BlockParams(*(fn(getattr(self, n)) for n in
                             ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd")))


class ParamLayout:
    """Layout of the identified parameter vector for a spec (see module docstring).

    Parameters
    ----------
    spec : MoE
    feature_names : sequence of str, optional
        Names of the ``d`` input columns (default ``x1 .. xd``).
    """

    def __init__(self, spec: MoE, feature_names: Sequence[str] | None = None) -> None:
        self.spec = spec
        self.k, self.d = spec.k, spec.d
        if feature_names is None:
            feature_names = [f"x{j + 1}" for j in range(self.d)]
        if len(feature_names) != self.d:
            raise ValueError(f"feature_names has {len(feature_names)} entries but d={self.d}.")
        self.feature_names = [str(f) for f in feature_names]
        self.ref_fixed = spec.gate in ("softmax", "topk")
        self.n_gate_rows = self.k - 1 if self.ref_fixed else self.k
        self.expert_slopes = spec.family.input_dependent
        self.pe = self.d + 1 if self.expert_slopes else 1
        self.n_gate = self.n_gate_rows * (self.d + 1)
        self.n_expert = self.k * self.pe
        self.size = self.n_gate + self.n_expert + self.k

    @property
    def names(self) -> list[str]:
        """Term names, e.g. ``gate[0]:const``, ``expert[1]:x1``, ``expert[1]:log_sigma``."""
        cols = ["const", *self.feature_names]
        out = [f"gate[{i}]:{c}" for i in range(self.n_gate_rows) for c in cols]
        ecols = cols if self.expert_slopes else ["const"]
        out += [f"expert[{i}]:{c}" for i in range(self.k) for c in ecols]
        out += [f"expert[{i}]:log_sigma" for i in range(self.k)]
        return out

    def term_info(self) -> list[tuple[str, int, str]]:
        """(block, atom, coefficient) for each term, matching :attr:`names`."""
        cols = ["const", *self.feature_names]
        info = [("gate", i, c) for i in range(self.n_gate_rows) for c in cols]
        ecols = cols if self.expert_slopes else ["const"]
        info += [("expert", i, c) for i in range(self.k) for c in ecols]
        info += [("expert", i, "log_sigma") for i in range(self.k)]
        return info

    def unpack(self, theta: torch.Tensor) -> BlockParams:
        """Blocks from ``theta`` of shape (..., P) (differentiable)."""
        lead = theta.shape[:-1]
        k, d = self.k, self.d
        g = theta[..., : self.n_gate].reshape(*lead, self.n_gate_rows, d + 1)
        if self.ref_fixed:
            g = torch.cat([g, torch.zeros(*lead, 1, d + 1, dtype=theta.dtype, device=theta.device)], dim=-2)
        e = theta[..., self.n_gate : self.n_gate + self.n_expert].reshape(*lead, k, self.pe)
        if self.expert_slopes:
            ew, eb = e[..., 1:], e[..., 0]
        else:
            ew, eb = torch.zeros(*lead, k, d, dtype=theta.dtype, device=theta.device), e[..., 0]
        sd = torch.exp(theta[..., self.n_gate + self.n_expert :])
        return BlockParams(g[..., 0], g[..., 1:], ew, eb, sd)

    def pack(self, p: BlockParams | Params) -> torch.Tensor:
        """``theta`` (..., P) from blocks; softmax gates are first moved to the last-expert reference."""
        gb, gw = p.gate_bias, p.gate_weight
        if self.ref_fixed:
            gb = gb - gb[..., -1:]
            gw = gw - gw[..., -1:, :]
            gb, gw = gb[..., :-1], gw[..., :-1, :]
        g = torch.cat([gb.unsqueeze(-1), gw], dim=-1).flatten(-2)
        if self.expert_slopes:
            e = torch.cat([p.expert_bias.unsqueeze(-1), p.expert_weight], dim=-1).flatten(-2)
        else:
            e = p.expert_bias
        return torch.cat([g, e, torch.log(p.noise_sd)], dim=-1)
