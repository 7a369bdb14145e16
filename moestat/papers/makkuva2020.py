r"""Makkuva, Oh, Kannan & Viswanath (2020), "Learning in Gated Neural Networks" (AISTATS 2020; arXiv:1906.02777):
the rates it proves for its gated network, as data.

The gated network's data are simulated by :func:`moestat.simulate_gated_nn` and fitted by
:func:`moestat.fit_tensor` (the paper's two-stage tensor method) and its baselines.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REFERENCE", "THEORY"]

REFERENCE = ("Makkuva, A. V., Oh, S., Kannan, S. and Viswanath, P. (2020). Learning in gated neural networks. "
             "Proceedings of the 23rd International Conference on Artificial Intelligence and Statistics "
             "(AISTATS), PMLR 108.")

# One row per result, in the columns of :data:`moestat.papers.THEORY_COLUMNS`: (source, result, gate, regime,
# expert, examples, quantity, response, regressor, rate, exponent, rate_model, direction, kind, note).
THEORY: list[tuple[Any, ...]] = [
    ("makkuva2020", "Thm 4", "softmax", "", "linear|sigmoid|relu", "", "gate parameters max_i ||w_i - w_i*||",
     "gate_l2", "n", "sqrt(d T log(Tk/delta) / n) down to the floor kappa eps_reg / (1 - rho)", 0.5, "power",
     "decay", "upper_bound", "fixed T, sample-split GD; fit only above the floor"),
    ("makkuva2020", "Thm 4 (derived)", "softmax", "", "linear|sigmoid|relu", "", "samples to reach gate error eps",
     "N_star", "d", "O~(d log(1/eps) / eps^2)", 1.0, "power", "growth", "upper_bound_slope", "linear in d"),
    ("makkuva2020", "Thm 4 (derived)", "softmax", "", "linear|sigmoid|relu", "", "samples to reach gate error eps",
     "N_star", "1/eps", "O~(d log(1/eps) / eps^2)", 2.0, "power", "growth", "upper_bound_slope",
     "parametric in eps, up to log(1/eps)"),
    ("makkuva2020", "Thm 2 (heuristic)", "softmax", "", "linear|sigmoid|relu", "", "regressor angle error",
     "angle_error", "n", "n^{-1/2} if parametric; Thm 2 gives no rate", 0.5, "power", "decay", "derived",
     "a parametric rate is expected, not proved"),
    ("makkuva2020", "Thm 2 (heuristic)", "softmax", "", "linear|sigmoid|relu", "", "E_reg = 1 - |cos theta|",
     "E_reg", "n", "n^{-1} if parametric (E_reg ~ theta^2 / 2)", 1.0, "power", "decay", "derived",
     "twice the slope of the parameter error (E_reg ~ theta^2 / 2)"),
]
