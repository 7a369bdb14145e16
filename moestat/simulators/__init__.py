"""Simulators: regression/Gaussian-MoE data (``simulate``) from a :class:`Truth`, clustered patches
(``simulate_clusters``) and patch-routing data (``simulate_patches``).  The papers' true models are in
:mod:`moestat.papers`."""

from .clusters import ClusterConfig, ClusterData, simulate_clusters
from .patches import PatchData, simulate_patches
from .regression import Dataset, replicate_seeds, simulate
from .sequences import local_alternative
from .truth import Truth, register_preset

register_preset("local_alternative", local_alternative)

__all__ = ["ClusterConfig", "ClusterData", "Dataset", "PatchData", "Truth", "local_alternative", "replicate_seeds",
           "simulate", "simulate_clusters", "simulate_patches"]
