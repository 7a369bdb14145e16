r"""Truths indexed by the sample size: sequences :math:`G^*_n` for local-alternative and minimax experiments.

A fixed truth asks how fast an estimator approaches one :math:`G^*`; a sequence asks whether it can resolve a
structure that shrinks with :math:`n`.  :func:`local_alternative` moves one atom of a fixed truth towards another,

.. math::

    \theta^*_{m,n} = \theta^*_{j} + c\, n^{-\gamma}\, u, \qquad
    u = \frac{\theta^*_m - \theta^*_j}{\|\theta^*_m - \theta^*_j\|},

on the atoms' coordinates :math:`\theta = (\beta_1, a, b)` (gate slope, expert weight, expert bias; the gate
intercepts stay), so the two atoms are :math:`c\,n^{-\gamma}` apart.  An estimator whose parameter error in the
merging cell falls like :math:`n^{-\alpha}` can tell them apart only while :math:`\gamma < \alpha`; the
over-specified rates of the sigmoid- and softmax-gated theories (Nguyen, Ho & Rinaldo 2024, Table 1) predict where
that boundary lies.  A :class:`moestat.Study` truth naming such a preset gets each cell's ``n``.
"""

from __future__ import annotations

import numpy as np

from .._validation import check_int
from ..params import Params
from .truth import PRESETS, Truth

__all__ = ["local_alternative"]


def local_alternative(n: int, *, gamma: float = 0.25, separation: float = 1.0, base: str = "gate_comparison",
                      atom: int = 0, moved: int | None = None, expert: str = "gelu", truth_gate: str = "sigmoid",
                      d: int = 2, k: int = 3, noise_var: float = 0.01, seed: int = 0) -> Truth:
    r"""A truth whose atom ``moved`` sits :math:`c\,n^{-\gamma}` from atom ``atom``, the rest a fixed truth's.

    Parameters
    ----------
    n : int
        The sample size the truth is built for (a study passes each cell's n).
    gamma : float
        Rate at which the two atoms merge, :math:`\gamma > 0`.
    separation : float
        The distance :math:`c` at :math:`n = 1`.
    base : str
        The preset that gives the fixed atoms (default ``"gate_comparison"``), called with ``expert``,
        ``truth_gate``, ``d``, ``k``, ``noise_var`` and ``seed``.
    atom, moved : int
        The atom approached and the atom that moves (default: the last one).
    expert, truth_gate, d, k, noise_var, seed
        The base truth's expert family, gate, input dimension, number of experts, noise variance and seed.

    Returns
    -------
    Truth
        ``info`` adds ``n``, ``gamma``, ``separation_n`` (:math:`c\,n^{-\gamma}`), ``atom``, ``moved`` and the base.

    Examples
    --------
    >>> import moestat as ms
    >>> far = local_alternative(100, gamma=0.5, d=2, k=3, seed=0)
    >>> near = local_alternative(10_000, gamma=0.5, d=2, k=3, seed=0)
    >>> round(near.info["separation_n"] / far.info["separation_n"], 6)
    0.1
    """
    n = check_int("n", n)
    for name, value in (("gamma", gamma), ("separation", separation)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
            raise ValueError(f"local_alternative(): {name} must be a positive finite number, got {value!r}.")
    if base not in PRESETS or base == "local_alternative":
        raise ValueError(f"local_alternative(): base={base!r} is not a fixed preset; valid values are "
                         f"{sorted(p for p in PRESETS if p != 'local_alternative')}.")
    spec, params = fixed = PRESETS[base](expert=expert, truth_gate=truth_gate, d=d, k=k, noise_var=noise_var,
                                         seed=seed)
    p = params.numpy()
    moved = k - 1 if moved is None else moved
    for name, value in (("atom", atom), ("moved", moved)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < k:
            raise ValueError(f"local_alternative(): {name} must be an atom index in [0, {k}), got {value!r}.")
    if atom == moved:
        raise ValueError(f"local_alternative(): atom and moved must differ, both are {atom}.")
    theta = np.concatenate([p.gate_weight, p.expert_weight, p.expert_bias[:, None]], axis=1)
    direction = theta[moved] - theta[atom]
    norm = float(np.linalg.norm(direction))
    if norm == 0.0:
        raise ValueError(f"local_alternative(): atoms {atom} and {moved} of the base truth coincide; choose others.")
    gap = float(separation) * float(n) ** (-float(gamma))
    theta[moved] = theta[atom] + gap * direction / norm
    out = Params(p.gate_bias.copy(), theta[:, :d].copy(), theta[:, d:2 * d].copy(), theta[:, 2 * d].copy())
    info = {**fixed.info, "source": f"moestat local alternative on {base}", "base": base, "n": n, "gamma": gamma,
            "separation": separation, "separation_n": gap, "atom": atom, "moved": moved,
            "duplicate": [], "duplicate_candidates": []}
    return Truth(spec, out, info)
