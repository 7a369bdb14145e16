r"""The identified parameter vector of a Gaussian MoE and its map to parameter blocks.

Inference (observed information, sandwich, Wald tests, bootstrap) works on one flat vector
:math:`\theta` per replicate, in this order:

1. gate terms, row by row, ``gate[i]:const, gate[i]:x1 ... gate[i]:xd``, less what the gate's invariance
   (:attr:`moestat.gates.Gate.gauge`) holds fixed on the *last* expert:

   * ``"row"`` (softmax, top-K, quadratic, Gaussian gates): the weights do not change when every row moves by a
     common shift (:attr:`moestat.gates.Gate.row_shift` with :math:`t = -w_{k-1}`, and a common intercept), so
     the last row is the reference, :math:`(b_{k-1}, w_{k-1}) = 0` (for the softmax gate the representative of
     :meth:`moestat.Params.normalize_softmax` with ``ref=-1``), and only rows ``0 .. k-2`` are free.
     :meth:`ParamLayout.pack` moves any parameters there with the gate's own shift (for the Gaussian gate it
     also changes the intercepts);
   * ``"intercept"`` (Laplace, cosine gates, and the perturbed cosine gate, whose row shift is only local,
     :attr:`moestat.gates.Gate.row_shift_global`: no one row can always be moved to zero, so holding one would
     fit a smaller model): only :math:`b_{k-1} = 0`, every :math:`w_i` free.  The perturbed cosine gate's
     information matrix is then singular along its :math:`d` shift directions, and its standard errors are not
     reported (:class:`moestat.SingularInformationWarning`);
   * ``"none"`` (sigmoid gates normalised over experts): all ``k`` rows are free.

   The cosine gate sees each :math:`w_i` only through its direction (:attr:`moestat.gates.Gate.scale_invariant`),
   so its slopes are the :math:`d - 1` hyperspherical angles of the unit vector :math:`w_i/\lVert w_i\rVert`,
   ``gate[i]:angle1 ... gate[i]:angle{d-1}``: :math:`w_{i1} = \cos\phi_1`,
   :math:`w_{ij} = \sin\phi_1\cdots\sin\phi_{j-1}\cos\phi_j`, :math:`w_{id} = \sin\phi_1\cdots\sin\phi_{d-1}`
   (a chart of the sphere whose only singular points are the poles :math:`\sin\phi_j = 0`), so that the
   information matrix is not singular along the unidentified norms.  With :math:`d = 1` a direction is a sign,
   not a continuous parameter, and the layout refuses the cosine gate.
2. expert rows ``expert[i]:const, expert[i]:x1 ... expert[i]:xd`` (``const`` only for constant
   experts);
3. ``shared:z1 ... shared:zq``, the coefficients :math:`\gamma` common to every expert (present only with
   ``shared_columns``; flexmix's ``FLXMRglmfix(fixed = ~ z)``, Grün & Leisch 2008);
4. ``expert[i]:log_sigma``, the log noise standard deviation of each expert (Wald intervals are
   formed on the log scale, where the likelihood is closer to quadratic); absent for Poisson and binomial
   experts, whose dispersion is fixed at 1.

With ``learn_temperature=True`` the gate terms end with ``gate:log_temperature``, :math:`\log\tau` of a temperature
fitted jointly with the other parameters (positivity by the log; Nguyen, Akbarian & Ho, ICML 2024): it counts in
``n_gate`` (it is the last gate term), has atom -1 in :meth:`ParamLayout.term_info` (common to all experts) and is
unpacked into ``BlockParams.temperature``.  Only gates whose temperature is identified take it
(:attr:`moestat.gates.Gate.temperature_identified`): under an affine gate :math:`(c\beta_0, c\beta_1, c\tau)`
gives the same weights for every :math:`c > 0`.  A parameter set without a temperature is packed with the spec's.

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
from typing import Any

import numpy as np
import torch

from ..gates import GATES
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
    temperature: torch.Tensor | None = None  # a fitted gate temperature (leading axes only), or None: the spec's

    def to_params(self) -> Params:
        return Params(self.gate_bias.detach(), self.gate_weight.detach(), self.expert_weight.detach(),
                      self.expert_bias.detach(), self.noise_sd.detach(),
                      None if self.temperature is None else self.temperature.detach())

    @staticmethod
    def from_params(p: Params) -> BlockParams:
        if p.noise_sd is None:
            raise ValueError("the Gaussian MoE likelihood needs params.noise_sd (one sd per expert).")
        return BlockParams(p.gate_bias, p.gate_weight, p.expert_weight, p.expert_bias, p.noise_sd, p.temperature)

    def map(self, fn) -> BlockParams:
        """Apply ``fn`` to every block and to the temperature (if set)."""
        return BlockParams(fn(self.gate_bias), fn(self.gate_weight), fn(self.expert_weight), fn(self.expert_bias),
                           fn(self.noise_sd), None if self.temperature is None else fn(self.temperature))


class ParamLayout:
    r"""Layout of the identified parameter vector for a spec (see module docstring).

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
    learn_temperature : bool
        Add :math:`\log\tau` as the last gate term (module docstring); ValueError for a gate whose temperature
        is not identified.
    offset_column : int, optional
        An input column :math:`o_t` that enters every expert's linear predictor with coefficient fixed at 1,
        :math:`\eta_{ti} = b_i + a_i^\top x_t + o_t` (an offset, e.g. :math:`\log` exposure for Poisson counts;
        McCullagh & Nelder 1989, §6.2.3): not in :math:`\theta`; :meth:`unpack` writes the 1.  Not a gate,
        expert or shared column (their defaults leave it out).  Needs input-dependent experts.
    """

    def __init__(self, spec: MoE, feature_names: Sequence[str] | None = None, *,
                 gate_columns: Sequence[int] | None = None, expert_columns: Sequence[int] | None = None,
                 shared_columns: Sequence[int] | None = None, learn_temperature: bool = False,
                 offset_column: int | None = None) -> None:
        self.learn_temperature = check_learn_temperature(spec, learn_temperature)
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
        self.offset_column = None if offset_column is None else _offset_column(offset_column, self.d)
        if self.offset_column is not None and not spec.family.input_dependent:
            raise ValueError(f"offset_column={self.offset_column} needs experts with a linear predictor in x; "
                             f"expert={spec.expert!r} has none. Use expert='linear' or drop the offset.")
        off = () if self.offset_column is None else (self.offset_column,)
        if expert_columns is None and (self.shared_columns or off):
            expert_columns = [j for j in range(self.d) if j not in self.shared_columns and j not in off]
        if gate_columns is None and off:
            gate_columns = [j for j in range(self.d) if j not in off]
        self.gate_columns = _columns("gate_columns", gate_columns, self.d)
        self.expert_columns = _columns("expert_columns", expert_columns, self.d)
        both = sorted(set(self.shared_columns) & set(self.expert_columns))
        if both:
            raise ValueError(f"columns {both} are in both expert_columns and shared_columns; a column's expert "
                             "coefficient is either expert-specific or shared. Remove it from one of them.")
        for name, cols in (("gate_columns", self.gate_columns), ("expert_columns", self.expert_columns),
                           ("shared_columns", self.shared_columns)):
            if off and off[0] in cols:
                raise ValueError(f"the offset column {off[0]} is also in {name}; an offset's coefficient is fixed at "
                                 f"1, not estimated. Remove it from {name}.")
        gauge = spec.gating.gauge
        self.gauge = "intercept" if gauge == "row" and not spec.gating.row_shift_global else gauge
        self.ref_fixed = self.gauge == "row"
        self.angles = spec.gate == "cosine"
        if self.angles and (self.d < 2 or len(self.gate_columns) != self.d):
            raise ValueError(f"the cosine gate depends on w_i only through its direction, which the likelihood layout "
                             f"holds as d - 1 angles over every input column; got d={self.d}, gate_columns="
                             f"{list(self.gate_columns)}. With d = 1 the direction is a sign (not a continuous "
                             "parameter): use another gate, or all columns with d >= 2.")
        self.expert_slopes = spec.family.input_dependent
        self.pg = (self.d - 1 if self.angles else len(self.gate_columns)) + 1
        self.pe = len(self.expert_columns) + 1 if self.expert_slopes else 1
        self.gate_free = self._gate_mask()
        self.n_gate_table = int(self.gate_free.sum())  # the gate table's free entries, before log(tau)
        self.n_gate = self.n_gate_table + int(self.learn_temperature)
        # gather map: entry (i, c) of the (k, pg) gate table is theta_gate[index - 1], or 0 where index is 0 (fixed)
        index = torch.zeros(self.k * self.pg, dtype=torch.long)
        index[self.gate_free.flatten()] = torch.arange(1, self.n_gate_table + 1)
        self._gate_index = index.reshape(self.k, self.pg)
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

    def _gate_mask(self) -> torch.Tensor:
        """(k, pg) boolean: which entries (intercept, slopes) of each gate row are free (module docstring)."""
        free = torch.ones(self.k, self.pg, dtype=torch.bool)
        if self.gauge == "row":
            free[-1] = False
        elif self.gauge == "intercept":
            free[-1, 0] = False
        return free

    def _gate_cols(self) -> list[str]:
        if self.angles:
            return ["const", *(f"angle{j + 1}" for j in range(self.d - 1))]
        return ["const", *(self.feature_names[j] for j in self.gate_columns)]

    def _expert_cols(self) -> list[str]:
        return ["const", *(self.feature_names[j] for j in self.expert_columns)] if self.expert_slopes else ["const"]

    @property
    def names(self) -> list[str]:
        """Term names, e.g. ``gate[0]:const``, ``gate:log_temperature``, ``expert[1]:x1``, ``shared:z``,
        ``expert[1]:log_sigma``."""
        return [f"{block}:{c}" if i < 0 else f"{block}[{i}]:{c}" for block, i, c in self.term_info()]

    def term_info(self) -> list[tuple[str, int, str]]:
        """(block, atom, coefficient) for each term, matching :attr:`names`; shared terms and the learned
        temperature have atom -1 (no one expert)."""
        cols = self._gate_cols()
        info = [("gate", i, c) for i in range(self.k) for j, c in enumerate(cols) if bool(self.gate_free[i, j])]
        if self.learn_temperature:
            info.append(("gate", -1, "log_temperature"))
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
        gb, gw = self.unpack_gate(theta[..., : self.n_gate])
        e = theta[..., self.n_gate : self.n_gate + self.n_expert].reshape(*lead, k, self.pe)
        if self.expert_slopes:
            ew, eb = self._scatter(e[..., 1:], self.expert_columns), e[..., 0]
        else:
            ew, eb = torch.zeros(*lead, k, d, dtype=theta.dtype, device=theta.device), e[..., 0]
        start = self.n_gate + self.n_expert
        tau = self.unpack_temperature(theta[..., : self.n_gate])
        if self.n_shared:  # the equality constraint: one gamma written into every expert's shared columns
            gamma = theta[..., start : start + self.n_shared].unsqueeze(-2).expand(*lead, k, self.n_shared)
            cols = torch.as_tensor(self.shared_columns, dtype=torch.long, device=theta.device)
            ew = ew.index_copy(-1, cols, gamma)
            start += self.n_shared
        if self.offset_column is not None:
            ew = ew.index_fill(-1, torch.tensor([self.offset_column], device=theta.device), 1.0)
        if self.dispersion:
            sd = torch.exp(theta[..., start:])
        else:  # GLM experts: dispersion fixed at 1, carried as a constant block
            sd = torch.ones(*lead, k, dtype=theta.dtype, device=theta.device)
        return BlockParams(gb, gw, ew, eb, sd, tau)

    def unpack_temperature(self, theta_gate: torch.Tensor) -> torch.Tensor | None:
        r"""The learned temperature :math:`\tau = e^{\theta}` (...,) of the last gate term, or None without one."""
        return torch.exp(theta_gate[..., self.n_gate_table]) if self.learn_temperature else None

    def unpack_gate(self, theta_gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``(gate_bias (..., k), gate_weight (..., k, d))`` from the gate terms ``theta_gate`` (..., n_gate)
        (differentiable; a gather, so it also runs under ``torch.func.vmap``); a learned :math:`\log\tau` is not
        read here (:meth:`unpack_temperature`)."""
        zero = torch.zeros(*theta_gate.shape[:-1], 1, dtype=theta_gate.dtype, device=theta_gate.device)
        g = torch.cat([zero, theta_gate], dim=-1)[..., self._gate_index.to(theta_gate.device)]  # (..., k, pg)
        slopes = _sphere(g[..., 1:]) if self.angles else self._scatter(g[..., 1:], self.gate_columns)
        return g[..., 0], slopes

    def pack_gate(self, gate_bias: torch.Tensor, gate_weight: torch.Tensor,
                  temperature: torch.Tensor | None = None) -> torch.Tensor:
        r"""The gate terms (..., n_gate) of any gate parameters, moved to the layout's reference first (module
        docstring); the inverse of :meth:`unpack_gate` up to the gate's invariance.  With a learned temperature the
        last term is :math:`\log` ``temperature`` (the spec's temperature where it is None)."""
        gb, gw = self._to_reference(gate_bias, gate_weight)
        gw = _angles(gw) if self.angles else self._gather(gw, self.gate_columns)
        g = torch.cat([gb.unsqueeze(-1), gw], dim=-1)
        terms = g[..., self.gate_free.to(g.device)]
        if not self.learn_temperature:
            return terms
        if temperature is None:
            temperature = torch.full(terms.shape[:-1], float(self.spec.temperature), dtype=terms.dtype,
                                     device=terms.device)
        log_tau = torch.log(torch.as_tensor(temperature, dtype=terms.dtype, device=terms.device))
        return torch.cat([terms, log_tau.expand(terms.shape[:-1]).unsqueeze(-1)], dim=-1)

    def _to_reference(self, gb: torch.Tensor, gw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Equivalent gate parameters (same weights at every x) with the last expert's fixed entries at zero."""
        gate = self.spec.gating
        if self.gauge == "none":
            return gb, gw
        if self.gauge == "row" and gate.row_shift is not None:  # a global shift: t = -w_{k-1} zeroes the last row
            gw, gb = gate.row_shift(gw, gb, -gw[..., -1, :])
            gw = torch.cat([gw[..., :-1, :], torch.zeros_like(gw[..., -1:, :])], dim=-2)  # exactly 0, no rounding
        return gb - gb[..., -1:], gw

    def pack(self, p: BlockParams | Params) -> torch.Tensor:
        """``theta`` (..., P) from blocks; the gate is first moved to the last-expert reference (:meth:`pack_gate`).
        Slopes on columns outside a block's columns are dropped (they are zero in a fit of this layout)."""
        g = self.pack_gate(p.gate_bias, p.gate_weight, getattr(p, "temperature", None))
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


def check_learn_temperature(spec: MoE, learn_temperature: bool) -> bool:
    """``learn_temperature`` as a bool; TypeError for a non-bool, ValueError where ``spec``'s gate does not identify
    a temperature (:attr:`moestat.gates.Gate.temperature_identified`), naming the fix."""
    if not isinstance(learn_temperature, bool):
        raise TypeError(f"learn_temperature must be True or False, got {learn_temperature!r}.")
    if learn_temperature and not spec.gating.temperature_identified:
        ok = [name for name, gate in GATES.items() if gate.temperature_identified]
        raise ValueError(
            f"learn_temperature=True: the temperature of gate={spec.gate!r} is not identified, since scaling the gate "
            f"parameters and the temperature by the same c > 0 leaves the gate weights unchanged (for an affine "
            f"gate (c beta_0, c beta_1, c tau) gives the weights of (beta_0, beta_1, tau)). Fix the temperature "
            f"(learn_temperature=False, MoE(temperature=...)): the gate parameters then absorb its scale. Or use a "
            f"gate that identifies it: {ok}.")
    return learn_temperature


def _offset_column(column: Any, d: int) -> int:
    if isinstance(column, bool) or not isinstance(column, (int, np.integer)) or not 0 <= int(column) < d:
        raise ValueError(f"offset_column must be a column index in [0, {d}), got {column!r}.")
    return int(column)


def _columns(name: str, columns: Sequence[int] | None, d: int) -> tuple[int, ...]:
    if columns is None:
        return tuple(range(d))
    cols = tuple(int(c) for c in columns)
    if len(set(cols)) != len(cols) or any(not 0 <= c < d for c in cols) or list(cols) != sorted(cols):
        raise ValueError(f"{name} must be increasing, distinct column indices in [0, {d}), got {list(columns)}.")
    return cols


def _sphere(angles: torch.Tensor) -> torch.Tensor:
    r"""Unit vectors (..., d) from hyperspherical angles (..., d-1): :math:`u_1 = \cos\phi_1`,
    :math:`u_j = \prod_{l<j}\sin\phi_l\,\cos\phi_j`, :math:`u_d = \prod_{l<d}\sin\phi_l`."""
    ones = torch.ones_like(angles[..., :1])
    sines = torch.cumprod(torch.cat([ones, torch.sin(angles)], dim=-1), dim=-1)  # prod_{l<j} sin(phi_l), j = 1..d
    return sines * torch.cat([torch.cos(angles), ones], dim=-1)


def _angles(w: torch.Tensor) -> torch.Tensor:
    r"""Hyperspherical angles (..., d-1) of the direction of ``w`` (..., d), the inverse of :func:`_sphere`:
    :math:`\phi_j = \operatorname{atan2}(\lVert w_{j+1:}\rVert, w_j)` for :math:`j < d-1` (in :math:`[0, \pi]`)
    and :math:`\phi_{d-1} = \operatorname{atan2}(w_d, w_{d-1})` (in :math:`(-\pi, \pi]`)."""
    d = w.shape[-1]
    tail = torch.flip(torch.sqrt(torch.cumsum(torch.flip(w * w, [-1]), dim=-1)), [-1])  # ||w_{j:}||, j = 1..d
    first = torch.atan2(tail[..., 1:d - 1], w[..., : d - 2])
    last = torch.atan2(w[..., -1:], w[..., -2:-1])
    return torch.cat([first, last], dim=-1)
