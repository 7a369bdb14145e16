"""The founding papers, one module each: their true models (presets), the rates they prove (as data), and the
criteria their experiments are judged by.

========================  ==================================================================================
module                    paper
========================  ==================================================================================
``nguyen2024``            sigmoid vs softmax gating (presets ``sigmoid_vs_softmax``, ``gate_comparison``)
``makkuva2020``           learning in gated neural networks (tensor method)
``chen2022``              mixtures of CNN experts on clustered patches
``chowdhury2023``         patch-level routing (pMoE) sample complexity
``nguyen2023``            softmax-gated Gaussian MoE: MLE rates by Voronoi cell size
``nguyen2024_temperature`` temperature in softmax Gaussian MoE; the activation gate
``nguyen2024_topk``        top-K sparse softmax gating: region-wise Voronoi losses and rates
``nguyen2024_gaussian_gate`` Gaussian-gated MoE (joint GLLiM MLE): Voronoi-loss rates, Type I/II
``nguyen2025_shared``      shared experts and normalised sigmoid gating (DeepSeekMoE): derived rates, claims
``yan2025_contaminated``   contaminated MoE with a frozen expert (constant / softmax gate)
========================  ==================================================================================

:data:`PRESETS` maps every preset name to its constructor (:class:`moestat.Study` truths name them as
``preset``); each paper's ``THEORY`` rows are registered for :func:`moestat.rates.theory_rates` when this package
is imported (:func:`theory_rows` lists them).  The papers depend on the library (model, simulators, rates, study),
never the other way round: the library holds the registries and the papers fill them.
"""

from __future__ import annotations

from typing import Any

from ..rates.theory import THEORY_COLUMNS, register_theory
from . import (
    chen2022,
    chowdhury2023,
    makkuva2020,
    nguyen2023,
    nguyen2024,
    nguyen2024_gaussian_gate,
    nguyen2024_temperature,
    nguyen2024_topk,
    nguyen2025_cosine,
    nguyen2025_shared,
    presets,
    yan2025_contaminated,
)
from .presets import PRESETS

__all__ = ["PAPERS", "PRESETS", "THEORY_COLUMNS", "chen2022", "chowdhury2023", "makkuva2020", "nguyen2023",
           "nguyen2024", "nguyen2024_gaussian_gate", "nguyen2024_temperature", "nguyen2024_topk",
           "nguyen2025_cosine", "nguyen2025_shared", "presets", "theory_rows", "yan2025_contaminated"]

PAPERS = {"nguyen2024": nguyen2024, "makkuva2020": makkuva2020, "chen2022": chen2022,
          "chowdhury2023": chowdhury2023, "nguyen2023": nguyen2023, "nguyen2025_cosine": nguyen2025_cosine,
          "nguyen2024_temperature": nguyen2024_temperature, "yan2025_contaminated": yan2025_contaminated,
          "nguyen2024_topk": nguyen2024_topk, "nguyen2024_gaussian_gate": nguyen2024_gaussian_gate,
          "nguyen2025_shared": nguyen2025_shared}
"""The paper modules by key; each has ``REFERENCE`` (the citation) and, where the paper proves rates, ``THEORY``."""


def theory_rows() -> list[dict[str, Any]]:
    """Every paper's theory rows as dicts keyed by :data:`THEORY_COLUMNS`, in the order of :data:`PAPERS`."""
    rows: list[dict[str, Any]] = []
    for module in PAPERS.values():
        rows += [dict(zip(THEORY_COLUMNS, row, strict=True)) for row in getattr(module, "THEORY", [])]
    return rows


for _key, _module in PAPERS.items():
    register_theory(_key, list(getattr(_module, "THEORY", [])))
