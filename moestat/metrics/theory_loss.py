r"""The Voronoi loss each convergence theorem of nguyen2024 is stated in, chosen from the fit's gate and regime.

* softmax gates: the softmax Voronoi loss against :math:`G^*` (translation removed);
* sigmoid gates, exact fit (:math:`k = k^*`) or every duplicated atom with a zero gate slope (regime 1):
  :math:`D_1(\hat G, G^*)` (Theorem 2);
* sigmoid gates in regime 2: :math:`\inf_{\bar G} D_3(\hat G, \bar G)` (Theorem 5) — over the exact split family
  :func:`moestat.metrics.split_family` for positively homogeneous experts (linear, relu) with one extra atom,
  otherwise over a given set of near-minimisers :math:`\bar{\mathcal G}` (e.g. from
  :func:`moestat.estimate_gbar`), which the caller estimates (and caches) because it costs a noise-free fit.

The study metric ``"loss"`` is this function plus the G-bar estimation and its cache ([exact
representations](../representations.md) explains why a regime-2 limit is a set).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model import MoE
from ..params import Params
from .representations import split_family
from .voronoi import voronoi_loss

SPLIT_GRID = 201
"""Values of the split parameter t in [0, 1] over which the split-family infimum is taken."""


def theory_loss_kind(fit_spec: MoE, truth_spec: MoE, truth: Params, duplicate: Sequence[int]) -> str:
    """Which loss :func:`theory_loss` uses: ``"softmax"``, ``"D1"``, ``"D3 split family"`` or
    ``"D3 estimated G-bar"`` (the last needs ``gbar``)."""
    if fit_spec.gate != "sigmoid":
        return "softmax"
    slopes = np.linalg.norm(np.asarray(truth.numpy().gate_weight), axis=-1)
    if fit_spec.k == truth_spec.k or all(slopes[j] == 0 for j in duplicate):
        return "D1"
    if fit_spec.family.homogeneous and fit_spec.k == truth_spec.k + 1:
        return "D3 split family"
    return "D3 estimated G-bar"


def theory_loss(params: Params, truth: Params, fit_spec: MoE, truth_spec: MoE, duplicate: Sequence[int], *,
                gbar: Params | None = None, n_split: int = SPLIT_GRID) -> tuple[np.ndarray, str]:
    """The theorem's loss of each fitted replicate, and its kind (:func:`theory_loss_kind`).

    Parameters
    ----------
    params : Params
        Fitted parameters (batched over replicates).
    truth : Params
        True parameters (:math:`k^*` atoms).
    fit_spec, truth_spec : MoE
        The fitted and the true model.
    duplicate : sequence of int
        The true atoms that received the extra fitted atoms (their gate slopes decide the regime).
    gbar : Params, optional
        Near-minimisers :math:`\\bar{\\mathcal G}` (batched), required when the kind is ``"D3 estimated G-bar"``.
    n_split : int
        Grid size of the split family.
    """
    kind = theory_loss_kind(fit_spec, truth_spec, truth, duplicate)
    if kind == "softmax":
        value = voronoi_loss(params, truth, kind="softmax")
    elif kind == "D1":
        value = voronoi_loss(params, truth, kind="D1")
    elif kind == "D3 split family":
        value = voronoi_loss(params, None, kind="D3", gbar=split_family(truth, duplicate, np.linspace(0, 1, n_split)))
    else:
        if gbar is None:
            raise ValueError("this fit is in regime 2 with a non-homogeneous expert: pass gbar=, the near-minimisers "
                             "of the population least-squares problem (moestat.estimate_gbar(...).near_minimisers).")
        value = voronoi_loss(params, None, kind="D3", gbar=gbar)
    return np.asarray(value, float), kind
