r"""Chowdhury, Zhang, Wang, Liu & Chen (2023), "Patch-level routing in mixture-of-experts is provably
sample-efficient for CNNs" (ICML 2023): the sample- and model-complexity slopes it proves, as data.

Its Theorems 4.2 (pMoE with separately trained router), 4.3 (a plain CNN) and 4.5 (pMoE trained jointly) bound
the sample complexity :math:`N^*`, the model size :math:`M^*` and the test error at fixed :math:`N` by powers of
the patch count :math:`n`, the number of routed patches :math:`l`, the number of experts :math:`k`, the pattern
count :math:`p`, the separation :math:`\delta` and the target error :math:`\epsilon`.  Each row below is the
exponent of one such power: the slope of ``log response`` on ``log regressor``, an upper bound (a measured slope
should not exceed it), not an equality.  The data are simulated by :func:`moestat.simulate_patches`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REFERENCE", "SLOPES", "THEORY"]

REFERENCE = ("Chowdhury, M. N. R., Zhang, S., Wang, M., Liu, S. and Chen, P.-Y. (2023). Patch-level routing in "
             "mixture-of-experts is provably sample-efficient for convolutional neural networks. Proceedings of "
             "the 40th International Conference on Machine Learning, PMLR 202.")

SLOPES: list[tuple[str, str, str, float, str]] = [
    ("N_star", "l", "pmoe_separate", 8.0, "Thm 4.2"), ("N_star", "l", "pmoe_joint", 6.0, "Thm 4.5"),
    ("N_star", "l", "cnn", 0.0, "Thm 4.3"), ("N_star", "n", "pmoe_separate", 0.0, "Thm 4.2"),
    ("N_star", "n", "pmoe_joint", 0.0, "Thm 4.5"), ("N_star", "n", "cnn", 8.0, "Thm 4.3"),
    ("N_star", "k", "pmoe_joint", 4.0, "Thm 4.5"), ("N_star", "p", "pmoe_separate", 12.0, "Thm 4.2"),
    ("N_star", "p", "pmoe_joint", 12.0, "Thm 4.5"), ("N_star", "p", "cnn", 12.0, "Thm 4.3"),
    ("N_star", "delta", "pmoe_separate", 6.0, "Thm 4.2"), ("N_star", "delta", "pmoe_joint", 6.0, "Thm 4.5"),
    ("N_star", "delta", "cnn", 6.0, "Thm 4.3"), ("N_star", "1/eps", "pmoe_separate", 16.0, "Thm 4.2"),
    ("N_star", "1/eps", "pmoe_joint", 16.0, "Thm 4.5"), ("N_star", "1/eps", "cnn", 16.0, "Thm 4.3"),
    ("N_star_ratio_cnn_over_separate", "n/l", "pmoe_separate", 8.0, "Thm 4.2 + 4.3"),
    ("M_star", "l", "pmoe_separate", 10.0, "Thm 4.2"), ("M_star", "l", "pmoe_joint", 6.0, "Thm 4.5"),
    ("M_star", "n", "pmoe_joint", 2.0, "Thm 4.5"), ("M_star", "n", "cnn", 10.0, "Thm 4.3"),
    ("M_star", "k", "pmoe_joint", 3.0, "Thm 4.5"),
    ("test_error_fixed_N", "l", "pmoe_separate", 0.5, "Thm 4.2"),
    ("test_error_fixed_N", "l", "pmoe_joint", 0.375, "Thm 4.5"),
    ("test_error_fixed_N", "k", "pmoe_joint", 0.25, "Thm 4.5"),
    ("test_error_fixed_N", "n", "cnn", 0.5, "Thm 4.3"),
    ("router_N_r", "n", "pmoe_separate", 2.0, "Lemma 4.1 (one pass)"),
]
"""(response, regressor, architecture, slope bound, result) for the pMoE variants and the CNN baseline (§4.2)."""

THEORY: list[tuple[Any, ...]] = [
    ("chowdhury2023", result, "patch_top_l" if arch != "cnn" else "none", "", arch, "two-layer ReLU CNN experts",
     response, response, regressor, f"slope {slope:g} in log {regressor}", slope, "power", "growth",
     "upper_bound_slope", "loose upper bound: test slope <= bound, not equality")
    for response, regressor, arch, slope, result in SLOPES
]
