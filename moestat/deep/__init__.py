"""Deep MoE experiments: MoE of CNN experts (chen2022) and patch-level routing (chowdhury2023)."""
