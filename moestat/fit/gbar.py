r"""The regime-2 limit :math:`\bar G` of an over-specified least-squares fit.

In regime 2 of nguyen2024 (§2.7, Theorem 5) the LSE with :math:`k > k^*` atoms converges to the set of
population minimisers

.. math:: \bar{\mathcal G} = \operatorname*{arg\,min}_{G \in \mathcal G_k(\Theta) \setminus \mathcal G_{k^*}(\Theta)}
          \| f_G - f_{G^*} \|_{L^2(\mu)},

and the loss :math:`D_3` is measured against it (an infimum over the set).  :func:`estimate_gbar`
approximates the set numerically: a noise-free least-squares fit of :math:`f_{G^*}` on a
large Monte-Carlo sample from :math:`\mu` (the sample average is the :math:`L^2(\mu)` distance up to
Monte-Carlo error), from several near-truth starts, each start duplicating one true atom.  Distances
are re-evaluated on an independent Monte-Carlo sample.

For ReLU and linear experts the set is a continuum: duplicating a gate and splitting its
expert, :math:`\varphi(t z) + \varphi((1-t)z) = \varphi(z)` for :math:`t \in (0, 1)`, reproduces
:math:`f_{G^*}` exactly, so the minimum distance is 0 and the near-minimisers spread along the orbit.
:class:`GBarResult` reports that spread.

For experts with :math:`\varphi(0) = 0` (GELU, tanh, ReLU, linear) a box on the parameters does not
rule out an extra atom with a zero expert, :math:`a = 0, b = 0`, which also reproduces
:math:`f_{G^*}` with k atoms whatever its gate.  The set returned is therefore the near-minimisers
*reachable from starts that duplicate the given true atoms*, not the whole argmin; the misspecified
limit of nguyen2024 Theorem 5 needs a parameter set that keeps experts away from zero.

The fits must be run to convergence.  For sigmoid-gated gelu truths with non-zero gate slopes the split of
a true atom is not exact, and the distance falls from the split, by less than :math:`3\times10^{-4}` in
:math:`L^2(\mu)`, along a flat valley whose end is an exact representation with a dying extra atom (a zero
expert or a gate switching off).  L-BFGS stops on its iteration cap anywhere along that valley (it converged
from none of 30 such starts in 3,000 iterations), so its end points are not limits; trust-region Newton
(``optimizer="auto"``, the default, for these small problems) converges from all of them
(``benchmarks/gbar_convergence.py``, docs/representations.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .._validation import (
    Device,
    Integer,
    Optional,
    Real,
    Seed,
    check_int,
    validate_arguments,
)
from ..metrics.distance import l2_distance
from ..metrics.matching import match_atoms
from ..model import MoE
from ..params import Params
from ..report import Result
from ..simulators.regression import draw_inputs, replicate_seeds
from .base import params_tidy
from .init import check_duplicate, near_truth
from .lse import ConvergenceWarning, fit_lse

_BLOCKS = ("gate_bias", "gate_weight", "expert_weight", "expert_bias")


@dataclass
class GBarResult(Result):
    """Near-minimisers of the population :math:`L^2(\\mu)` distance among k-atom fits.

    Attributes
    ----------
    params : Params
        Batched (S, ...): the S fits, sorted by ``l2`` (smallest first).
    l2 : ndarray (S,)
        :math:`\\|f_G - f_{G^*}\\|_{L^2(\\mu)}` on an independent Monte-Carlo sample.
    l2_fit : ndarray (S,)
        The same distance on the fitting sample (the square root of the fit's objective).
    near : ndarray of bool (S,)
        Near-minimisers: ``l2 <= min(l2) + tol_l2``.
    duplicate : list of list of int
        The true atoms each start duplicated.
    converged : ndarray of bool (S,)
    spread : dict
        Per block, the largest absolute coordinate difference between a near-minimiser and the best
        one after matching atoms (Hungarian on all blocks): 0 for a unique minimiser, large for a
        continuum.
    settings : dict
    """

    params: Params
    l2: np.ndarray
    l2_fit: np.ndarray
    near: np.ndarray
    duplicate: list
    converged: np.ndarray
    spread: dict
    settings: dict = field(default_factory=dict)

    @property
    def best(self) -> Params:
        """The fit with the smallest distance (unbatched)."""
        return self.params.select(0)

    @property
    def near_minimisers(self) -> Params:
        """The near-minimisers, batched."""
        return self.params.select(np.flatnonzero(self.near))

    def tidy(self) -> pd.DataFrame:
        """One row per fit x block x atom x coefficient of the S fits (``fit`` = index, smallest ``l2`` first)."""
        return params_tidy(self.params).rename(columns={"rep": "fit"})

    def glance(self) -> pd.DataFrame:
        """One row per fit: ``l2`` (independent sample), ``l2_fit``, ``near``, ``converged``, ``duplicate``."""
        return pd.DataFrame({"fit": np.arange(len(self.l2)), "l2": self.l2, "l2_fit": self.l2_fit, "near": self.near,
                             "converged": self.converged,
                             "duplicate": [",".join(map(str, d)) for d in self.duplicate]})

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame: one row per (fit, quantity) plus one row per spread block; settings as columns."""
        S = len(self.l2)
        q = {"l2": self.l2, "l2_fit": self.l2_fit, "near": self.near.astype(float),
             "converged": self.converged.astype(float)}
        frame = pd.DataFrame({"fit": np.tile(np.arange(S), len(q)), "quantity": np.repeat(list(q), S),
                              "value": np.concatenate([np.asarray(v, float) for v in q.values()]),
                              "duplicate": [",".join(map(str, d)) for d in self.duplicate] * len(q)})
        spread = pd.DataFrame({"fit": -1, "quantity": [f"spread_{b}" for b in self.spread],
                               "value": list(self.spread.values()), "duplicate": ""})
        frame = pd.concat([frame, spread], ignore_index=True)
        for key, value in self.settings.items():
            frame[key] = value if not isinstance(value, (list, tuple, dict)) else str(value)
        return frame


@validate_arguments(k=Integer(1), n_mc=Integer(1), restarts=Integer(1), seed=Seed(), tol=Real(0), tol_l2=Real(0),
                    init_scale=Real(0, open_low=True), max_iter=Integer(1), low=Real(), high=Real(), device=Device(),
                    threads=Optional(Integer(1)))
def estimate_gbar(spec: MoE, truth: Params, k: int, *, n_mc: int = 100_000, restarts: int = 8,
                  duplicate: Sequence[int] | Sequence[Sequence[int]] | None = None, seed: int = 0,
                  tol: float = 1e-12, tol_l2: float = 1e-4, init_scale: float = 0.05,
                  optimizer: str = "auto", max_iter: int = 3000, box: Any = None,
                  inputs: str = "uniform", low: float = -1.0, high: float = 1.0,
                  device: str = "auto", compile: bool | str = False, threads: int | None = 1) -> GBarResult:
    r"""Approximate the set :math:`\bar{\mathcal G}` of k-atom minimisers of :math:`\|f_G - f_{G^*}\|_{L^2(\mu)}`.

    Parameters
    ----------
    spec : MoE
        The specification of the truth (gate and expert family); the fits use ``spec.with_k(k)``.
    truth : Params
        Unbatched true parameters with k* atoms.
    k : int
        Number of fitted atoms, ``k > k*``.
    n_mc : int
        Monte-Carlo sample size from :math:`\mu` (fit and held-out sample each).
    restarts : int
        Number of starts S.
    duplicate : list of int, or list of such lists, optional
        Which true atoms the extra fitted atoms duplicate: one list (``k - k*`` indices) for every start,
        or one list per start.  Default: start ``s`` duplicates true atom ``s mod k*`` (``k - k*`` times),
        so every duplication choice is tried.  Regime 2 uses atoms with non-zero gate slope.
    seed : int
        Seeds the Monte-Carlo samples and the starts.
    tol : float
        Relative objective tolerance of the least-squares fits.
    tol_l2 : float
        A fit is a near-minimiser when its held-out distance is within ``tol_l2`` of the smallest.
    init_scale, optimizer, max_iter, box :
        Passed to :func:`moestat.fit_lse`.  ``optimizer="auto"``: trust-region Newton up to 1,000 parameters (a
        certified local minimum; ``converged`` says which fits got there), L-BFGS above.
    inputs, low, high :
        The input distribution :math:`\mu` (:func:`moestat.simulate`'s conventions; nguyen2024: U[-1,1]^d).
    device, compile :
        Passed to :func:`moestat.fit_lse`.  ``compile=True`` on a CPU runs each start's Newton run in C++ (about
        3.5 times faster for the flagship study's estimate, with the same near-minimisers: their distances to
        :math:`f_{G^*}` agree to about 1e-7 along the flat split valleys; docs/performance/study.md);
        its setting is then recorded in ``settings``.
    threads : int or None
        Passed to :func:`moestat.fit_lse`: with ``compile=True`` that many starts run at once (the same results as
        one thread; recorded in ``settings`` when not 1).

    Returns
    -------
    GBarResult
    """
    if not isinstance(spec, MoE):
        raise TypeError(f"spec must be a moestat.MoE, got {type(spec).__name__}.")
    if not isinstance(truth, Params) or truth.is_batched:
        raise TypeError("truth must be an unbatched moestat.Params (one true mixing measure).")
    spec.check_params(truth)
    k = check_int("k", k)
    if k <= truth.k:
        raise ValueError(f"k={k} must exceed the truth's k*={truth.k}: G-bar is a limit of over-specified fits.")
    S, n_mc = check_int("restarts", restarts), check_int("n_mc", n_mc)
    extra = k - truth.k
    if duplicate is None:
        dups = [[s % truth.k] * extra for s in range(S)]
    elif len(duplicate) > 0 and isinstance(duplicate[0], (list, tuple, np.ndarray)):
        if len(duplicate) != S:
            raise ValueError(f"duplicate has {len(duplicate)} lists but restarts={S}; give one per start.")
        dups = [check_duplicate(list(d), truth.k, k) for d in duplicate]
    else:
        dups = [check_duplicate(list(duplicate), truth.k, k)] * S
    for d in dups:
        check_duplicate(d, truth.k, k)

    ss_fit, ss_test, ss_init = replicate_seeds(seed, 3)
    X = draw_inputs(np.random.default_rng(ss_fit), n_mc, spec.d, inputs, low, high)
    X_test = draw_inputs(np.random.default_rng(ss_test), n_mc, spec.d, inputs, low, high)
    y = np.asarray(spec.mean(truth, X))
    fit_spec = spec.with_k(k)
    seeds = np.random.SeedSequence(ss_init.entropy, spawn_key=ss_init.spawn_key).spawn(S)
    starts = Params.stack([near_truth(fit_spec, truth, 1, 1, duplicate=d, scale=init_scale, seed=[sd])
                           for d, sd in zip(dups, seeds, strict=True)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit = fit_lse(fit_spec, X, y, init=starts, restarts=S, optimizer=optimizer, max_iter=max_iter, tol=tol,
                      box=box, device=device, condition=False, compile=compile, threads=threads)
    all_p = fit.restart_params
    l2 = np.atleast_1d(l2_distance(fit_spec, all_p, truth, X_test, spec_b=spec))
    l2_fit = np.sqrt(fit.restarts.objective.to_numpy())
    order = np.argsort(l2, kind="stable")
    params = all_p.select(order)
    l2, l2_fit = l2[order], l2_fit[order]
    converged = fit.restarts.converged.to_numpy()[order]
    dups = [dups[i] for i in order]
    near = l2 <= l2[0] + tol_l2
    spread = _spread(fit_spec, params.select(np.flatnonzero(near)), params.select(0))
    settings = {"gate": spec.gate, "expert": spec.expert, "k": k, "k_true": truth.k, "d": spec.d, "n_mc": n_mc,
                "restarts": S, "seed": seed, "tol": tol, "tol_l2": tol_l2, "init_scale": init_scale,
                "optimizer": optimizer, "max_iter": max_iter, "box": str(box), "inputs": inputs,
                "low": low, "high": high}
    if compile is not False:  # recorded only when asked for, so the default frames keep their columns
        settings["compile"] = compile
    if threads != 1:
        settings["threads"] = threads
    return GBarResult(params, l2, l2_fit, near, dups, converged, spread, settings)


def _spread(spec: MoE, near: Params, best: Params) -> dict[str, float]:
    softmax = spec.gate in ("softmax", "topk")
    m = match_atoms(near, best, method="hungarian", blocks=_BLOCKS, softmax=softmax)
    aligned = near.permute(m.perm)
    b = best.batched(near.n_reps)
    return {name: float(np.abs(getattr(aligned, name) - getattr(b, name)).max()) for name in _BLOCKS}
