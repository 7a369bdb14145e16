r"""Per-atom parameter errors inside Voronoi cells, as a tidy frame.

The Voronoi losses mix squared over-specified terms with first-power exact-specified terms, so a loss
converging at :math:`n^{-1/2}` hides parameters converging at :math:`n^{-1/4}` (nguyen2024 Remark after
Theorem 2).  :func:`parameter_errors` reports every ingredient separately so each can get
its own rate:

* for every fitted atom :math:`i \in A_j`: :math:`|\Delta\beta_{0ij}|`, :math:`\|\Delta\beta_{1ij}\|`,
  :math:`\|\Delta a_{ij}\|`, :math:`|\Delta b_{ij}|` and :math:`\|\Delta\eta_{ij}\|`;
* for every true atom :math:`j`: the weight-sum gap :math:`|\sum_{i\in A_j} w(\beta_{0i}) - w(\beta^*_{0j})|`
  with :math:`w = \sigma` (sigmoid gate) or :math:`w = \exp` (softmax gate, after
  :func:`moestat.metrics.center_softmax`).

Expected behaviour under nguyen2024 regime 1 with strongly identifiable experts: over-specified cells
(:math:`|A_j|\ge 2`) give :math:`n^{-1/4}` for :math:`\Delta\beta_1` and :math:`\Delta\eta`, and
:math:`n^{-1/2}` for the weight-sum gap; individual :math:`\beta_{0i}` in those cells have no rate;
exact-specified cells give :math:`n^{-1/2}` throughout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .._torch import to_numpy
from .._validation import Choice, Optional, check_choice, validate_arguments
from ..model import MoE
from ._common import blocks, broadcast_reps, check_compatible, reference_device, unpack
from .distance import sup_expert_error
from .voronoi import _assign, _pieces, center_softmax

ATOM_BLOCKS = ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "expert")
"""Per-fitted-atom error blocks (``expert`` is the joint :math:`\\|\\Delta\\eta\\|`)."""


@validate_arguments(gate=Optional(Choice("sigmoid", "softmax")))
def parameter_errors(params: Any, truth: Any, *, gate: str | None = None, X: Any = None,
                     spec: MoE | None = None) -> pd.DataFrame:
    r"""Tidy per-atom errors: one row per replicate x true atom x block (x fitted atom in the cell).

    Parameters
    ----------
    params : Params or (MoE, Params)
        Fitted parameters, unbatched or batched (R, k, ...).
    truth : Params or (MoE, Params)
        True parameters (k* atoms).
    gate : {"sigmoid", "softmax"}, optional
        Weight map for the weight-sum gap (:math:`\sigma(\beta_0)` or :math:`e^{\beta_0}`).  Defaults to
        the gate of the spec passed with ``truth`` (or ``params``), else ``"sigmoid"``.  With
        ``"softmax"`` both measures are centred first (:func:`moestat.metrics.center_softmax`).
    X : array, shape (m, d), optional
        If given, adds block ``expert_sup``: :math:`\max_t |h(x_t,\eta_i) - h(x_t,\eta^*_j)|` per fitted
        atom (nguyen2024 eq. 7/10; :func:`moestat.metrics.sup_expert_error`).  Needs the expert family:
        ``spec`` or a ``(MoE, Params)`` pair.
    spec : MoE, optional
        Specification used for ``expert_sup`` (defaults to the spec of ``truth`` or ``params``).

    Returns
    -------
    pandas.DataFrame
        Columns ``rep``, ``true_atom``, ``cell_size``, ``specified`` (``"over"`` if
        :math:`|A_j|\ge2`, ``"exact"`` if 1, ``"empty"`` if 0), ``block`` (one of ``gate_bias``,
        ``gate_weight``, ``expert_weight``, ``expert_bias``, ``expert`` per fitted atom, or
        ``weight_sum`` per cell), ``fitted_atom`` (-1 for ``weight_sum``), ``error`` (absolute value or
        Euclidean norm) and ``gate``.  Empty cells appear through their ``weight_sum`` row only.

    Examples
    --------
    Separate rates for over- and exact-specified parameters::

        errs = ms.parameter_errors(fit.params, truth)
        errs.groupby(["specified", "block"])["error"].mean()
    """
    spec_p, p = unpack(params, "params")
    spec_t, t = unpack(truth, "truth")
    check_compatible(spec_p, p, spec_t, t)
    if gate is None:
        known = spec_t or spec_p or spec
        gate = "sigmoid" if known is None or known.gate == "sigmoid" else "softmax"
    check_choice("gate", gate, ("sigmoid", "softmax"))
    if gate == "softmax":
        p, t = center_softmax(p), center_softmax(t)
    dev, dt = reference_device(p, t)
    bp, bt = blocks(p, dev, dt), blocks(t, dev, dt)
    R = broadcast_reps(bp.b0.shape[0], bt.b0.shape[0], ("params", "truth"))
    pc = _pieces(bp, bt, "sigmoid" if gate == "sigmoid" else "exp")
    idx, _ = _assign(bp, bt)
    assign = np.broadcast_to(to_numpy(idx), (R, bp.b0.shape[1]))
    sizes = to_numpy(pc.sizes).astype(np.int64)
    k, k_star = assign.shape[1], sizes.shape[1]
    label = np.where(sizes >= 2, "over", np.where(sizes == 1, "exact", "empty"))

    reps = np.repeat(np.arange(R), k)
    fitted = np.tile(np.arange(k), R)
    true_atom = assign.ravel()
    cell_size = sizes[reps, true_atom]
    values = {"gate_bias": pc.d_b0, "gate_weight": pc.d_b1, "expert_weight": pc.d_a,
              "expert_bias": pc.d_b, "expert": pc.d_eta}
    parts = [pd.DataFrame({
        "rep": reps, "true_atom": true_atom, "cell_size": cell_size, "specified": label[reps, true_atom],
        "block": name, "fitted_atom": fitted,
        "error": np.broadcast_to(to_numpy(v), (R, k)).ravel(),
    }) for name, v in values.items()]
    cell_reps = np.repeat(np.arange(R), k_star)
    cells = np.tile(np.arange(k_star), R)
    parts.append(pd.DataFrame({
        "rep": cell_reps, "true_atom": cells, "cell_size": sizes.ravel(), "specified": label.ravel(),
        "block": "weight_sum", "fitted_atom": -1, "error": to_numpy(pc.gap).ravel(),
    }))
    if X is not None:
        spec_x = spec if spec is not None else (spec_t or spec_p)
        if spec_x is None:
            raise ValueError("X was given but no expert family is known: pass spec=MoE(...) or (spec, Params) "
                             "pairs so that expert_sup can evaluate the experts.")
        sup = sup_expert_error(spec_x, p, t, X)
        parts.append(pd.DataFrame({
            "rep": reps, "true_atom": true_atom, "cell_size": cell_size, "specified": label[reps, true_atom],
            "block": "expert_sup", "fitted_atom": fitted, "error": np.broadcast_to(sup, (R, k)).ravel(),
        }))
    out = pd.concat(parts, ignore_index=True)
    out["gate"] = gate
    return out.sort_values(["rep", "true_atom", "block", "fitted_atom"], kind="stable").reset_index(drop=True)
