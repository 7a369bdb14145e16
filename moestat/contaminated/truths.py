r"""Truths of a contaminated MoE indexed by the sample size, for minimax-style experiments.

Both papers state rates that hold uniformly over truths that may move with :math:`n`: the mixing weight may vanish
(AISTATS 2025's *prompt vanishing*) and the prompt may approach the frozen expert (*prompt merging*, the
non-distinguishable setting).  :func:`contaminated_truth` builds such a truth for one :math:`n`:

.. math::

    \lambda^*_n = c_\lambda\, n^{-\gamma}, \qquad
    \theta^*_n = \theta_0 + c_\Delta\, n^{-\kappa}\, \frac{u}{\lVert u\rVert}
    \quad\text{(or a fixed } \theta^* \text{)},

with :math:`\theta = (a, b, \nu)` and :math:`\theta_0` the frozen expert's parameters.  :math:`\gamma = 0` and
:math:`\kappa = 0` give fixed truths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import check_int
from .model import ContaminatedMoE, ContaminatedParams, FrozenExpert

__all__ = ["ContaminatedTruth", "contaminated_truth"]


@dataclass(frozen=True)
class ContaminatedTruth:
    """A true contaminated MoE: ``model``, unbatched ``params`` and ``info`` (``n``, ``lam_n``, ``delta_n``,
    ``distinguishable`` and the knobs)."""

    model: ContaminatedMoE
    params: ContaminatedParams
    info: dict[str, Any]

    def simulate(self, reps: int = 1, *, seed: Any = None, **kw: Any) -> Any:
        """``model.simulate(params, info["n"], reps=reps, seed=seed, **kw)``."""
        return self.model.simulate(self.params, self.info["n"], reps=reps, seed=seed, **kw)

    def theta0(self) -> np.ndarray | None:
        """The frozen expert's :math:`(a_0, b_0, \\nu_0)`, or None when it is not one Gaussian ridge expert."""
        return None if self.model.frozen.gaussian is None else self.model.frozen.theta0()


def _real(name: str, value: Any, *, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}.")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}.")
    if nonneg and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}.")
    return float(value)


def _vector(name: str, value: Any, length: int) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.shape != (length,) or not np.isfinite(arr).all():
        raise ValueError(f"{name} must be a finite vector of length {length}, got {np.asarray(value).tolist()!r}.")
    return arr


def contaminated_truth(n: int, frozen: FrozenExpert, *, gate: str = "constant", expert: str = "linear",
                       lam: float = 0.3, lam_rate: float = 0.0, gate_weight: Any = None, gate_bias: float = 0.0,
                       prompt: Any = None, direction: Any = None, separation: float = 1.0,
                       approach_rate: float = 0.0) -> ContaminatedTruth:
    r"""A contaminated-MoE truth for sample size ``n`` (see the module docstring).

    Parameters
    ----------
    n : int
        The sample size the truth is built for (a study passes each cell's n).
    frozen : FrozenExpert
        The frozen model :math:`f_0`.
    gate : {"constant", "softmax"}
    expert : str
        The prompt's ridge family.
    lam, lam_rate : float
        Constant gate: :math:`\lambda^*_n = \mathrm{lam}\cdot n^{-\mathrm{lam\_rate}}` (must lie in (0, 1)).
    gate_weight, gate_bias : array (d,), float
        Softmax gate: :math:`\beta^*` and :math:`\tau^*` (fixed).
    prompt : array (d + 2,), optional
        A fixed prompt :math:`\theta^* = (a, b, \nu)`.  Without it the prompt approaches the frozen expert:
        :math:`\theta^*_n = \theta_0 + \mathrm{separation}\cdot n^{-\mathrm{approach\_rate}}\, u/\lVert u\rVert`
        with ``direction`` :math:`u`; this needs a frozen Gaussian ridge expert (:meth:`FrozenExpert.theta0`).
    direction : array (d + 2,), optional
    separation, approach_rate : float
        :math:`c_\Delta > 0` and :math:`\kappa \ge 0`.

    Returns
    -------
    ContaminatedTruth
        ``info``: ``n``, ``lam_n`` (NaN for the softmax gate), ``delta_n`` (:math:`\lVert\theta^*_n - \theta_0\rVert`,
        NaN without a Gaussian frozen expert), ``distinguishable`` and the knobs.
    """
    n = check_int("n", n)
    if not isinstance(frozen, FrozenExpert):
        raise TypeError(f"frozen must be a FrozenExpert, got {type(frozen).__name__}.")
    lam_rate = _real("lam_rate", lam_rate, nonneg=True)
    approach_rate = _real("approach_rate", approach_rate, nonneg=True)
    separation = _real("separation", separation, positive=True)
    d = frozen.d
    if d is None:
        source = prompt if prompt is not None else direction
        if source is None:
            raise ValueError("give the frozen model's d (FrozenExpert(d=...)) or a prompt / direction vector.")
        d = int(np.asarray(source).shape[0]) - 2
        if d < 1:
            raise ValueError(f"prompt / direction must have length d + 2 >= 3, got {np.asarray(source).tolist()!r}.")
    model = ContaminatedMoE(frozen, gate, expert, d)
    theta0 = model.frozen.theta0() if frozen.gaussian is not None else None
    if prompt is not None:
        if direction is not None:
            raise ValueError("give either prompt (a fixed prompt) or direction (a prompt approaching the frozen "
                             "expert), not both.")
        theta = _vector("prompt", prompt, d + 2)
    else:
        if theta0 is None:
            raise ValueError(f"a prompt approaching the frozen model needs it to be one Gaussian ridge expert "
                             f"(FrozenExpert.gaussian_expert); {frozen.label!r} is not; give prompt=(a, b, nu).")
        if direction is None:
            raise ValueError("give direction (the prompt's direction u away from the frozen expert, length d + 2) or "
                             "a fixed prompt.")
        u = _vector("direction", direction, d + 2)
        norm = float(np.linalg.norm(u))
        if norm == 0.0:
            raise ValueError("direction must be non-zero.")
        theta = theta0 + separation * float(n) ** (-approach_rate) * u / norm
    if theta[-1] <= 0:
        raise ValueError(f"the prompt's variance nu = {theta[-1]:.4g} at n={n} is not positive; choose a direction "
                         "or separation that keeps nu > 0.")
    info: dict[str, Any] = {"n": n, "gate": gate, "expert": expert, "distinguishable": model.distinguishable,
                            "frozen": frozen.label, "lam_rate": lam_rate, "approach_rate": approach_rate,
                            "separation": separation if prompt is None else np.nan,
                            "delta_n": float(np.linalg.norm(theta - theta0)) if theta0 is not None else np.nan}
    a, b, nu = theta[:d], theta[d], theta[d + 1]
    if gate == "constant":
        lam_n = _real("lam", lam, positive=True) * float(n) ** (-lam_rate)
        if not 0 < lam_n < 1:
            raise ValueError(f"lam * n^-lam_rate = {lam_n:.4g} at n={n} must lie in (0, 1); lower lam.")
        params = ContaminatedParams(weight=a, bias=b, var=nu, lam=lam_n)
        info.update(lam=lam, lam_n=lam_n)
    else:
        beta = _vector("gate_weight", np.zeros(d) if gate_weight is None else gate_weight, d)
        params = ContaminatedParams(weight=a, bias=b, var=nu, gate_weight=beta,
                                    gate_bias=_real("gate_bias", gate_bias))
        info.update(lam_n=np.nan, gate_weight=beta.tolist(), gate_bias=float(gate_bias))
    return ContaminatedTruth(model, params, info)
