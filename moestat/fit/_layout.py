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
3. ``shared:z1 ... shared:zq``, the coefficients :math:`\gamma` common to every expert (present only with
   ``shared_columns``; flexmix's ``FLXMRglmfix(fixed = ~ z)``, Grün & Leisch 2008);
4. ``expert[i]:log_sigma``, the log noise standard deviation of each expert (Wald intervals are
   formed on the log scale, where the likelihood is closer to quadratic); absent for Poisson and binomial
   experts, whose dispersion is fixed at 1.

A gate or experts restricted to some input columns (``gate_columns`` / ``expert_columns``) have coefficients on
those columns only; the other slopes are fixed at zero and are not in :math:`\theta`.

**Shared coefficients as an equality constraint.**  A model with shared covariates :math:`s_t`,

.. math:: \eta_{tj} = b_j + a_j^\top x_t + \gamma^\top s_t,

is the MoE on the inputs :math:`(x, s)` with the constraint that every expert has the *same* slope on each
shared column: :meth:`unpack` writes the one value :math:`\gamma_c` into column :math:`c` of every expert's
slope row, so every consumer of the blocks (the likelihood, its autograd Hessian and scores, prediction,
simulation, posteriors) sees the constrained model without knowing about it, and the constrained parameter
vector has :math:`q` entries for :math:`\gamma` instead of :math:`kq`.  :meth:`pack` projects blocks onto the
constraint (the mean over experts of each shared column's slopes; exact when they agree, as in every fit).

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
    gate_columns, expert_columns : sequence of int, optional
        The input columns the gate and the experts use (default: all ``d``; the experts' default leaves out the
        shared columns).  A model whose gate and experts
        have different covariates (a concomitant-variable gate, flexmix's ``concomitant=``) is the MoE on the
        union of the columns with the coefficients of the other block's columns fixed at zero: they are not
        in :math:`\theta`, and :meth:`unpack` writes zeros there.
    shared_columns : sequence of int, optional
        Input columns whose expert coefficient is common to all experts (module docstring); disjoint from
        ``expert_columns``.  Needs input-dependent experts.
    """

    def __init__(self, spec: MoE, feature_names: Sequence[str] | None = None, *,
                 gate_columns: Sequence[int] | None = None, expert_columns: Sequence[int] | None = None,
                 shared_columns: Sequence[int] | None = None) -> None:
        self.spec = spec
        self.k, self.d = spec.k, spec.d
        if feature_names is None:
            feature_names = [f"x{j + 1}" for j in range(self.d)]
        if len(feature_names) != self.d:
            raise ValueError(f"feature_names has {len(feature_names)} entries but d={self.d}.")
        self.feature_names = [str(f) for f in feature_names]
        self.shared_columns = () if shared_columns is None else _columns("shared_columns", shared_columns, self.d)
        if self.shared_columns and not spec.family.input_dependent:
            raise ValueError(f"shared_columns={list(self.shared_columns)} needs experts with slopes; "
                             f"expert={spec.expert!r} has none. Use expert='linear' or drop shared_columns.")
        if expert_columns is None and self.shared_columns:
            expert_columns = [j for j in range(self.d) if j not in self.shared_columns]
        self.gate_columns = _columns("gate_columns", gate_columns, self.d)
        self.expert_columns = _columns("expert_columns", expert_columns, self.d)
        both = sorted(set(self.shared_columns) & set(self.expert_columns))
        if both:
            raise ValueError(f"columns {both} are in both expert_columns and shared_columns; a column's expert "
                             "coefficient is either expert-specific or shared. Remove it from one of them.")
        self.ref_fixed = spec.gate in ("softmax", "topk")
        self.n_gate_rows = self.k - 1 if self.ref_fixed else self.k
        self.expert_slopes = spec.family.input_dependent
        self.pg = len(self.gate_columns) + 1
        self.pe = len(self.expert_columns) + 1 if self.expert_slopes else 1
        self.n_gate = self.n_gate_rows * self.pg
        self.n_expert = self.k * self.pe
        self.n_shared = len(self.shared_columns)
        self.dispersion = spec.has_noise_sd
        self.size = self.n_gate + self.n_expert + self.n_shared + (self.k if self.dispersion else 0)

    @property
    def full_columns(self) -> bool:
        """True when gate and experts use every input column."""
        all_cols = tuple(range(self.d))
        return self.gate_columns == all_cols and self.expert_columns == all_cols and not self.shared_columns

    @property
    def expert_design_columns(self) -> tuple[int, ...]:
        """The columns of the experts' linear predictor: their own columns and the shared ones, increasing."""
        return tuple(sorted(self.expert_columns + self.shared_columns))

    def _gate_cols(self) -> list[str]:
        return ["const", *(self.feature_names[j] for j in self.gate_columns)]

    def _expert_cols(self) -> list[str]:
        return ["const", *(self.feature_names[j] for j in self.expert_columns)] if self.expert_slopes else ["const"]

    @property
    def names(self) -> list[str]:
        """Term names, e.g. ``gate[0]:const``, ``expert[1]:x1``, ``shared:z``, ``expert[1]:log_sigma``."""
        return [f"shared:{c}" if block == "shared" else f"{block}[{i}]:{c}" for block, i, c in self.term_info()]

    def term_info(self) -> list[tuple[str, int, str]]:
        """(block, atom, coefficient) for each term, matching :attr:`names`; shared terms have atom -1 (no one
        expert)."""
        info = [("gate", i, c) for i in range(self.n_gate_rows) for c in self._gate_cols()]
        info += [("expert", i, c) for i in range(self.k) for c in self._expert_cols()]
        info += [("shared", -1, self.feature_names[j]) for j in self.shared_columns]
        if self.dispersion:
            info += [("expert", i, "log_sigma") for i in range(self.k)]
        return info

    def _scatter(self, coef: torch.Tensor, columns: tuple[int, ...]) -> torch.Tensor:
        """Slopes on the chosen columns ``(..., m)`` -> all ``d`` columns, zeros elsewhere."""
        if len(columns) == self.d:
            return coef
        out = torch.zeros(*coef.shape[:-1], self.d, dtype=coef.dtype, device=coef.device)
        return out.index_copy(-1, torch.as_tensor(columns, dtype=torch.long, device=coef.device), coef)

    def _gather(self, coef: torch.Tensor, columns: tuple[int, ...]) -> torch.Tensor:
        if len(columns) == self.d:
            return coef
        return coef[..., list(columns)]

    def unpack(self, theta: torch.Tensor) -> BlockParams:
        """Blocks from ``theta`` of shape (..., P) (differentiable)."""
        lead = theta.shape[:-1]
        k, d = self.k, self.d
        g = theta[..., : self.n_gate].reshape(*lead, self.n_gate_rows, self.pg)
        if self.ref_fixed:
            g = torch.cat([g, torch.zeros(*lead, 1, self.pg, dtype=theta.dtype, device=theta.device)], dim=-2)
        e = theta[..., self.n_gate : self.n_gate + self.n_expert].reshape(*lead, k, self.pe)
        if self.expert_slopes:
            ew, eb = self._scatter(e[..., 1:], self.expert_columns), e[..., 0]
        else:
            ew, eb = torch.zeros(*lead, k, d, dtype=theta.dtype, device=theta.device), e[..., 0]
        start = self.n_gate + self.n_expert
        if self.n_shared:  # the equality constraint: one gamma written into every expert's shared columns
            gamma = theta[..., start : start + self.n_shared].unsqueeze(-2).expand(*lead, k, self.n_shared)
            cols = torch.as_tensor(self.shared_columns, dtype=torch.long, device=theta.device)
            ew = ew.index_copy(-1, cols, gamma)
            start += self.n_shared
        if self.dispersion:
            sd = torch.exp(theta[..., start:])
        else:  # GLM experts: dispersion fixed at 1, carried as a constant block
            sd = torch.ones(*lead, k, dtype=theta.dtype, device=theta.device)
        return BlockParams(g[..., 0], self._scatter(g[..., 1:], self.gate_columns), ew, eb, sd)

    def pack(self, p: BlockParams | Params) -> torch.Tensor:
        """``theta`` (..., P) from blocks; softmax gates are first moved to the last-expert reference.  Slopes on
        columns outside a block's columns are dropped (they are zero in a fit of this layout)."""
        gb, gw = p.gate_bias, self._gather(p.gate_weight, self.gate_columns)
        if self.ref_fixed:
            gb = gb - gb[..., -1:]
            gw = gw - gw[..., -1:, :]
            gb, gw = gb[..., :-1], gw[..., :-1, :]
        g = torch.cat([gb.unsqueeze(-1), gw], dim=-1).flatten(-2)
        if self.expert_slopes:
            ew = self._gather(p.expert_weight, self.expert_columns)
            e = torch.cat([p.expert_bias.unsqueeze(-1), ew], dim=-1).flatten(-2)
        else:
            e = p.expert_bias
        parts = [g, e]
        if self.n_shared:
            parts.append(p.expert_weight[..., list(self.shared_columns)].mean(-2))
        if self.dispersion:
            parts.append(torch.log(p.noise_sd))
        return torch.cat(parts, dim=-1)


def _columns(name: str, columns: Sequence[int] | None, d: int) -> tuple[int, ...]:
    if columns is None:
        return tuple(range(d))
    cols = tuple(int(c) for c in columns)
    if len(set(cols)) != len(cols) or any(not 0 <= c < d for c in cols) or list(cols) != sorted(cols):
        raise ValueError(f"{name} must be increasing, distinct column indices in [0, {d}), got {list(columns)}.")
    return cols
