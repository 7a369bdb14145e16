"""Deep MoE experiments: MoE of CNN experts (chen2022) and patch-level routing (chowdhury2023)."""

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
    "PatchFit",
    "cnn_logits",
    "expert_choice_topl",
    "fit_cnn",
    "fit_pmoe",
    "pmoe_logits",
    "router_gradient_eq26",
]
