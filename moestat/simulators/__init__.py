"""Simulators: regression/Gaussian-MoE data (``simulate``) and the papers' true models (``presets``)."""

from . import presets
from .patches import PatchData, simulate_patches
from .regression import Dataset, replicate_seeds, simulate

__all__ = ["Dataset", "PatchData", "presets", "replicate_seeds", "simulate", "simulate_patches"]
