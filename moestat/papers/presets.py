"""The papers' true models by name: ``ms.presets.sigmoid_vs_softmax(...)``, ``ms.presets.PRESETS``.

Each preset lives in its paper's module (:mod:`moestat.papers.nguyen2024`); this module gathers them, so a
:class:`moestat.Study` truth entry ``{"preset": name, ...}`` and ``ms.presets.<name>`` find the same function.
"""

from __future__ import annotations

from collections.abc import Callable

from ..simulators.truth import Truth
from . import nguyen2024
from .nguyen2024 import draw_truth, gate_comparison, sigmoid_vs_softmax

__all__ = ["PRESETS", "Truth", "draw_truth", "gate_comparison", "sigmoid_vs_softmax"]

PRESETS: dict[str, Callable[..., Truth]] = {**nguyen2024.PRESETS}
"""Registry of preset names to constructors."""
