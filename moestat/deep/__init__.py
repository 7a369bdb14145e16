"""Deep MoE experiments: MoE of CNN experts (chen2022) and patch-level routing (chowdhury2023)."""

from . import metrics
from .cluster_moe import (
    ACTIVATIONS,
    ClusterMoEFit,
    expert_outputs,
    fit_cluster_moe,
    fit_single_cnn,
    initial_expert_weights,
    moe_forward,
    routed_expert_output,
)
from .metrics import dispatch_counts, dispatch_entropy, dispatch_table

__all__ = [
    "ACTIVATIONS",
    "ClusterMoEFit",
    "dispatch_counts",
    "dispatch_entropy",
    "dispatch_table",
    "expert_outputs",
    "fit_cluster_moe",
    "fit_single_cnn",
    "initial_expert_weights",
    "metrics",
    "moe_forward",
    "routed_expert_output",
]
