"""Simulators: regression/Gaussian-MoE data (``simulate``) and the papers' true models (``presets``)."""

from . import presets
from .regression import Dataset, replicate_seeds, simulate

__all__ = ["Dataset", "presets", "replicate_seeds", "simulate"]
