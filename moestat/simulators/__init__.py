"""Simulators: regression/Gaussian-MoE data (``simulate``), the papers' true models (``presets``) and
chen2022 clustered patches (``simulate_clusters``)."""

from . import presets
from .clusters import ClusterConfig, ClusterData, simulate_clusters
from .patches import PatchData, simulate_patches
from .regression import Dataset, replicate_seeds, simulate

__all__ = ["ClusterConfig", "ClusterData", "Dataset", "PatchData", "presets", "replicate_seeds", "simulate",
           "simulate_clusters", "simulate_patches"]
