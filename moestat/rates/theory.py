"""What the founding papers predict, as data: :func:`theory_rates` and the lookup :func:`predicted_rate`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._core import regressor

__all__ = ["predicted_rate", "theory_rates"]


def _apparent_power_exponent(rate_model: str | None, exponent: float, n_range: tuple[float, float]) -> float:
    """Exponent a plain power fit reports for the noise-free theoretical curve on a log grid over n_range."""
    if rate_model is None or not np.isfinite(exponent):
        return np.nan
    n = np.logspace(np.log10(n_range[0]), np.log10(n_range[1]), 201)
    log_y = -exponent * regressor(rate_model, n)
    return -float(np.polyfit(np.log(n), log_y, 1)[0])


# (source, result, gate, regime, expert, examples, quantity, response, regressor, rate, exponent, rate_model,
#  direction, kind, note)
_THEORY: list[tuple] = [
    ("nguyen2024", "Thm 1", "sigmoid", "1", "any", "A.1-A.3", "regression function L2(mu) error",
     "l2_regression", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", ""),
    ("nguyen2024", "Cor 1", "sigmoid", "2", "any", "", "inf over Gbar of L2(mu) error", "l2_regression", "n",
     "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", ""),
    ("nguyen2024", "Thm 2", "sigmoid", "1", "strongly_identifiable", "relu|gelu (relu fails at zero-slope atoms)",
     "Voronoi loss D1", "D1", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound",
     "D1 squares over-specified terms, so the loss slope is 1/2 although those parameters move at 1/4"),
    ("nguyen2024", "Rem (i)", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "over-specified beta1, eta (cells with |A_j| >= 2)", "param_overspecified", "n", "(log n / n)^{1/4}", 0.25,
     "power_log", "decay", "upper_bound", "D1 mixes orders; track individual parameter errors"),
    ("nguyen2024", "eq (7)", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "over-specified expert sup_x |h - h*|", "expert_overspecified", "n", "(log n / n)^{1/4}", 0.25, "power_log",
     "decay", "upper_bound", ""),
    ("nguyen2024", "implied by Thm 2", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "over-specified cell weight sum |sum sigma(beta0_i) - sigma(beta0*_j)|", "weight_sum", "n",
     "(log n / n)^{1/2}", 0.5, "power_log", "decay", "derived", "not stated in the paper; follows from D1"),
    ("nguyen2024", "structure of D1", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "individual beta0_i in an over-specified cell", "beta0_overspecified", "n", "no rate (not identified)",
     np.nan, None, "decay", "no_rate", ""),
    ("nguyen2024", "Rem (ii)", "sigmoid", "1", "strongly_identifiable", "relu|gelu",
     "exact-specified beta0, beta1, eta (|A_j| = 1)", "param_exact", "n", "(log n / n)^{1/2}", 0.5, "power_log",
     "decay", "upper_bound", ""),
    ("nguyen2024", "Rem (ii)", "sigmoid", "1", "strongly_identifiable", "relu|gelu", "exact-specified expert",
     "expert_exact", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", ""),
    ("nguyen2024", "Thm 3", "sigmoid", "1", "ridge_input_independent", "phi(a^T x + b) with a*_j = 0",
     "minimax E D_{2,r}", "D2r", "n", ">= n^{-1/2} for all r >= 1", 0.5, "power", "decay", "lower_bound_minimax",
     "the proof's step 'choose c as a root' is invalid as written; the conclusion holds"),
    ("nguyen2024", "Thm 3 (i)-(ii)", "sigmoid", "1", "ridge_input_independent", "phi(a^T x + b) with a*_j = 0",
     "parameters beta1, a, b and the expert", "param", "n",
     "slower than n^{-1/(2r)} for all r; could be 1/log n", 1.0, "inverse_log", "decay", "slower_than_polynomial",
     "may not converge at all (exact non-identifiability): report inverse_log and flag"),
    ("nguyen2024", "Thm 4", "sigmoid", "1", "polynomial", "(a^T x + b)^p", "minimax E D_{2,r}", "D2r", "n",
     ">= n^{-1/2} for all r >= 1", 0.5, "power", "decay", "lower_bound_minimax", "proof covers p = 1 only"),
    ("nguyen2024", "Thm 4, Table 1", "sigmoid", "1", "polynomial", "(a^T x + b)^p", "parameters and experts",
     "param", "n", "1 / log n", 1.0, "inverse_log", "decay", "slower_than_polynomial", ""),
    ("nguyen2024", "Thm 5", "sigmoid", "2", "weakly_identifiable", "relu|gelu|polynomial with a != 0",
     "Voronoi loss D3 (inf over Gbar)", "D3", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound",
     "relu/linear regime 2 is not misspecified (exact split family); gelu is the clean case"),
    ("nguyen2024", "after Thm 5", "sigmoid", "2", "weakly_identifiable", "relu|gelu|polynomial with a != 0",
     "all of beta0, beta1, eta and the experts", "param", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay",
     "upper_bound", ""),
    ("nguyen2024", "Table 1", "sigmoid", "2", "input_independent", "constant", "experts", "expert", "n",
     "1 / log n", 1.0, "inverse_log", "decay", "slower_than_polynomial", "stated 'similar to Thm 3'; not proved"),
    ("nguyen2024", "Table 1 ([26] Thm 3.2)", "softmax", "1|2", "relu_gelu", "relu|gelu", "experts", "expert", "n",
     "n^{-1/4}, could be (log n / n)^{1/4}", 0.25, "power", "decay", "upper_bound", "cited, not proved, in nguyen2024"),
    ("nguyen2024", "Table 1 ([26] Thm 4.6)", "softmax", "1|2", "polynomial", "linear|polynomial", "experts",
     "expert", "n", "1 / log n", 1.0, "inverse_log", "decay", "slower_than_polynomial", "cited from [26]"),
    ("nguyen2024", "Table 1", "softmax", "1|2", "input_independent", "constant", "experts", "expert", "n",
     "1 / log n", 1.0, "inverse_log", "decay", "slower_than_polynomial", "cited from [26]"),
    # the representation functional (moestat.representation_errors): mass-weighted first-order errors against the
    # nearest exact k* + 1 atom representation, "over" = the atoms a representation adds or changes
    ("nguyen2024", "Thm 5", "sigmoid", "2", "relu", "relu", "over-specified atoms vs the exact split family",
     "over_param", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound",
     "the split family is exact for relu, so Thm 5's limit is a representation of f*; weak identifiability "
     "fails at its symmetric member t = 1/2"),
    ("nguyen2024", "Thm 5", "sigmoid", "2", "linear", "linear", "over-specified atoms vs the exact split family",
     "over_param", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound",
     "additive splits are exact; first-order identifiability fails at copies with equal experts"),
    ("nguyen2024", "Thm 5 (limit not exact)", "sigmoid", "2", "gelu", "gelu|tanh|sigmoid",
     "over-specified atoms vs the exact set", "over_param", "n",
     "no rate while the fit stays in the split basin: its limit is misspecified", np.nan, None, "decay", "no_rate",
     "for phi(0) = 0 the only exact k*+1 representations have a dead extra atom; Thm 5's rate is towards "
     "the misspecified basin limit (response D3), whose experts differ from the truth"),
    ("nguyen2024", "Thm 5", "sigmoid", "2", "gelu", "gelu|tanh|sigmoid", "all atoms vs the misspecified limit",
     "D3", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", "measured against estimate_gbar"),
    ("nguyen2024", "Thm 5", "sigmoid", "2", "weakly_identifiable", "relu|gelu|linear",
     "atoms matched to unchanged true atoms", "exact_param", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay",
     "upper_bound", "against the exact set for relu/linear; against the basin limit for gelu"),
    ("nguyen2024", "Thm 2, Rem (i)", "sigmoid", "1", "gelu", "gelu",
     "over-specified atoms vs the exact weight-split family", "over_param", "n", "(log n / n)^{1/4}", 0.25,
     "power_log", "decay", "upper_bound",
     "a zero-slope atom's weight split is exact for every expert; strong identifiability holds for gelu, and "
     "the copies' slopes and experts move at the fourth root (D1 squares them)"),
    ("nguyen2024", "Thm 2, Rem (ii)", "sigmoid", "1", "gelu", "gelu", "atoms matched to unchanged true atoms",
     "exact_param", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", ""),
    ("nguyen2024", "Thm 2 does not apply", "sigmoid", "1", "relu", "relu",
     "over-specified atoms vs the exact set", "over_param", "n",
     "no theorem: strong identifiability fails at a zero-slope relu atom", np.nan, None, "decay", "no_rate",
     "positive homogeneity (h = a'dh/da + b dh/db) breaks the condition; the exact set adds the orbit "
     "sigma(u) h(x; c eta*) and the relu c-continuum of the split, which the infimum covers"),
    ("nguyen2024", "Thm 2 does not apply", "sigmoid", "1", "relu", "relu", "atoms matched to unchanged true atoms",
     "exact_param", "n", "no theorem: strong identifiability fails at a zero-slope relu atom", np.nan, None,
     "decay", "no_rate", ""),
    ("nguyen2024", "Table 1 ([26] Thm 3.2)", "softmax", "1|2", "strongly_identifiable", "gelu|relu|sigmoid|tanh",
     "over-specified atoms (mass-weighted) vs the split family", "over_param", "n", "(log n / n)^{1/4}", 0.25,
     "power_log", "decay", "upper_bound", "second-order identifiability of the copies; relu adds the (s, c) "
     "continuum, which the infimum covers"),
    ("nguyen2024", "Table 1 ([26] Thm 4.6)", "softmax", "1|2", "polynomial", "linear",
     "over-specified atoms vs the split family", "over_param", "n", "1 / log n", 1.0, "inverse_log", "decay",
     "slower_than_polynomial", "gate-expert interaction (a PDE) slows the over-specified cell"),
    ("nguyen2024", "Table 1 ([26], Voronoi loss exact cells)", "softmax", "1|2", "any", "gelu|relu|linear",
     "atoms matched to unchanged true atoms", "exact_param", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay",
     "upper_bound", "first-order terms of the softmax Voronoi loss"),
    ("nguyen2024", "Thm 1 / Cor 1 (both gates)", "sigmoid|softmax", "1|2", "any", "", "regression function",
     "l2", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound", "the same functional for both gates"),
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
# chowdhury2023 §4.2 (slopes of log response on log regressor; upper bounds, test slope <= bound)
_PMOE = [
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


def theory_rates(n_range: tuple[float, float] = (1e3, 1e5)) -> pd.DataFrame:
    """The rates the founding papers predict, as a tidy frame to join against :func:`fit_rate` results.

    Sources: nguyen2024 (Table 1 and Theorems 1-5; its softmax rows cite its reference [26]), makkuva2020
    (Theorem 4 and its derived sample complexity; heuristic parametric rates for Theorem 2), chowdhury2023
    (Theorems 4.2-4.5: log-log slopes of sample and model complexity; upper bounds).

    Columns: ``source, result, gate, regime, expert, examples, quantity, response, regressor, rate``
    (as printed), ``exponent`` (alpha of ``response ~ regressor^-alpha`` for ``direction="decay"``; the
    slope of ``log response`` on ``log regressor`` for ``"growth"``; ``test_error_fixed_N`` rows are growth
    slopes in l, k, n), ``rate_model`` (the :func:`fit_rate` model that has this rate as a straight line),
    ``direction``, ``kind`` (``upper_bound``, ``lower_bound_minimax``, ``slower_than_polynomial``,
    ``upper_bound_slope``, ``derived``, ``no_rate``), ``power_exponent_in_range`` (what a plain power fit
    reports for the noise-free curve over ``n_range``, e.g. 0.445 for ``(log n / n)^{1/2}`` over
    [1e3, 1e5]), ``note``.
    """
    lo, hi = n_range
    if not (1 < lo < hi):
        raise ValueError(f"n_range must be (low, high) with 1 < low < high, got {n_range!r}.")
    cols = ["source", "result", "gate", "regime", "expert", "examples", "quantity", "response", "regressor", "rate",
            "exponent", "rate_model", "direction", "kind", "note"]
    rows = [dict(zip(cols, r, strict=True)) for r in _THEORY]
    for resp, reg, arch, slope, res in _PMOE:
        rows.append({"source": "chowdhury2023", "result": res, "gate": "patch_top_l" if arch != "cnn" else "none",
                     "regime": "", "expert": arch, "examples": "two-layer ReLU CNN experts",
                     "quantity": resp, "response": resp, "regressor": reg,
                     "rate": f"slope {slope:g} in log {reg}", "exponent": slope, "rate_model": "power",
                     "direction": "growth", "kind": "upper_bound_slope",
                     "note": "loose upper bound: test slope <= bound, not equality"})
    out = pd.DataFrame(rows, columns=cols)
    out["power_exponent_in_range"] = [
        _apparent_power_exponent(m, e, n_range) if d == "decay" and r == "n" else np.nan
        for m, e, d, r in zip(out["rate_model"], out["exponent"], out["direction"], out["regressor"], strict=True)]
    return out[[*cols[:-1], "power_exponent_in_range", "note"]]


def predicted_rate(gate: str, expert: str, response: str, *, regime: int | str = 2) -> str:
    """The rate :func:`theory_rates` predicts for one gate, expert, response and regime, as printed ("" if none).

    A row applies when its ``response`` is ``response``, ``gate`` and ``regime`` (``"|"``-separated lists) contain
    the arguments, and ``examples`` lists ``expert`` or is empty; the first such row wins (rows for a named
    expert come before the generic ones of the same result).

    Examples
    --------
    >>> predicted_rate("softmax", "gelu", "over_param")
    '(log n / n)^{1/4}'
    >>> predicted_rate("sigmoid", "gelu", "over_param", regime=1)
    '(log n / n)^{1/4}'
    """
    table = theory_rates()
    hit = table[(table["response"] == response)
                & table["gate"].str.split("|").map(lambda gates: gate in gates)
                & table["regime"].map(lambda r: r == "" or str(regime) in r.split("|"))
                & table["examples"].map(lambda e: e == "" or expert in e.split("|"))]
    return str(hit["rate"].iloc[0]) if len(hit) else ""


