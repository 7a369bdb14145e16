"""The papers' true models by name: ``ms.presets.sigmoid_vs_softmax(...)``, ``ms.presets.PRESETS``.

Each preset lives in its paper's module (:mod:`moestat.papers.nguyen2024`); this module registers them in the
library's registry (:data:`moestat.simulators.truth.PRESETS`, the ``PRESETS`` here), so a :class:`moestat.Study`
truth entry ``{"preset": name, ...}`` and ``ms.presets.<name>`` find the same function.
"""

from __future__ import annotations

from ..simulators.truth import PRESETS, Truth, register_preset
from . import nguyen2024, nguyen2024_topk
from .nguyen2024 import draw_truth, gate_comparison, sigmoid_vs_softmax

__all__ = ["PRESETS", "Truth", "draw_truth", "gate_comparison", "sigmoid_vs_softmax"]

for _name, _fn in {**nguyen2024.PRESETS, **nguyen2024_topk.PRESETS}.items():
    register_preset(_name, _fn)
