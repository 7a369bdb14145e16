"""Deep MoE experiments: MoE of CNN experts (chen2022) and patch-level routing (chowdhury2023)."""

from . import metrics
from .cluster_moe import (
    ACTIVATIONS,
    ClusterMoEFit,
    expert_outputs,
    fit_cluster_moe,
    fit_single_cnn,
    initial_expert_weights,
    load_balance_loss,
    load_entropy,
    load_shares,
    moe_forward,
    routed_expert_output,
)
from .metrics import dispatch_counts, dispatch_entropy, dispatch_table
from .patch_moe import (
    PatchFit,
    cnn_logits,
    expert_choice_topl,
    fit_cnn,
    fit_pmoe,
    pmoe_logits,
    router_gradient_eq26,
)

__all__ = [
    "ACTIVATIONS",
    "ClusterMoEFit",
    "PatchFit",
    "cnn_logits",
    "dispatch_counts",
    "dispatch_entropy",
    "dispatch_table",
    "expert_choice_topl",
    "expert_outputs",
    "fit_cluster_moe",
    "fit_cnn",
    "fit_pmoe",
    "fit_single_cnn",
    "initial_expert_weights",
    "load_balance_loss",
    "load_entropy",
    "load_shares",
    "metrics",
    "moe_forward",
    "pmoe_logits",
    "routed_expert_output",
    "router_gradient_eq26",
]
