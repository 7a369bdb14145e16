r"""Nguyen, Ho & Rinaldo (2024), "Sigmoid gating is more sample efficient than softmax gating in mixture of
experts" (NeurIPS 2024): the true models of its experiments and the rates it proves, as data.

``sigmoid_vs_softmax`` builds the truths of its experiments (§4 Table 2, App. C Tables 3
and 4): d = 32, k* = 8 ridge experts, noise variance
:math:`\nu = 0.01`, inputs :math:`U[-1,1]^{32}`, and

.. math::

    \beta^*_{0i} \sim N(0, \nu_g),\quad \beta^*_{1i} \sim N(0_d, \nu_g I_d),\quad
    a^*_i \sim N(0_d, \nu_e I_d),\quad b^*_i \sim N(0, \nu_e),

with :math:`\nu_g = 0.01/d`, :math:`\nu_e = 1/d`, and the gate slopes of some
atoms set to :math:`0_d`:

* regime 1 (Table 3): atoms 7 and 8 (indices 6, 7) have zero slope;
* regime 2 (Tables 2 and 4): atom 8 (index 7) has zero slope.

The regime of an over-specified fit depends on *which* true atom gets the extra
fitted expert: duplicating a zero-slope atom gives regime 1, a
non-zero-slope atom regime 2.  The preset records the candidates for its regime
in ``info["duplicate_candidates"]`` (0-based) and the default choice in
``info["duplicate"]``.  The paper's draws are unknown; the seeds are moestat's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._validation import check_choice, check_int
from ..model import MoE
from ..params import Params
from ..simulators.truth import Truth

__all__ = ["PRESETS", "REFERENCE", "THEORY", "draw_truth", "gate_comparison", "sigmoid_vs_softmax"]

REFERENCE = ("Nguyen, H., Ho, N. and Rinaldo, A. (2024). Sigmoid gating is more sample efficient than softmax "
             "gating in mixture of experts. Advances in Neural Information Processing Systems 37.")


def draw_truth(d: int, k: int, *, gate_var: float, expert_var: float, zero_slope: list[int],
               rng: np.random.Generator) -> Params:
    """Draw the Table 2-4 parameter distribution; ``zero_slope`` atoms get :math:`\\beta_1 = 0_d`."""
    gate_bias = rng.normal(0.0, np.sqrt(gate_var), size=k)
    gate_weight = rng.normal(0.0, np.sqrt(gate_var), size=(k, d))
    expert_weight = rng.normal(0.0, np.sqrt(expert_var), size=(k, d))
    expert_bias = rng.normal(0.0, np.sqrt(expert_var), size=k)
    gate_weight[zero_slope] = 0.0
    return Params(gate_bias, gate_weight, expert_weight, expert_bias)


def sigmoid_vs_softmax(regime: int = 2, expert: str = "relu", *, truth_gate: str = "sigmoid",
                       d: int = 32, k: int = 8, noise_var: float = 0.01,
                       gate_var: float | None = None, expert_var: float | None = None,
                       seed: int = 0) -> Truth:
    r"""True model of nguyen2024's experiments.

    Parameters
    ----------
    regime : {1, 2}
        1: Table 3 (atoms 7, 8 with zero gate slope); 2: Tables 2/4 (atom 8 only).
    expert : str
        Expert family of the truth (the paper uses "relu" and "linear"; "gelu" is the clean case).
    truth_gate : {"sigmoid", "softmax"}
        Gate of the true model.  The paper's §4 prints a softmax truth for Figure 1 and
        App. C a sigmoid truth; choose explicitly.
    d, k : int
        Input dimension (32) and number of true experts (8).
    noise_var : float
        Noise variance :math:`\nu` (0.01).
    gate_var, expert_var : float, optional
        :math:`\nu_g` (default 0.01/d) and :math:`\nu_e` (default 1/d).
    seed : int
        Seed of the parameter draw.

    Returns
    -------
    Truth
        Unpacks as ``spec, params``; ``.info`` records the regime and duplicate candidates.
    """
    if regime not in (1, 2):
        raise ValueError(f"regime must be 1 or 2, got {regime!r}.")
    check_choice("truth_gate", truth_gate, ("sigmoid", "softmax"))
    d, k = check_int("d", d), check_int("k", k, minimum=2)
    gate_var = 0.01 / d if gate_var is None else float(gate_var)
    expert_var = 1.0 / d if expert_var is None else float(expert_var)
    if gate_var < 0 or expert_var < 0 or noise_var < 0:
        raise ValueError("gate_var, expert_var and noise_var must be non-negative.")
    zero_slope = [k - 2, k - 1] if regime == 1 else [k - 1]
    candidates = zero_slope if regime == 1 else [i for i in range(k) if i not in zero_slope]
    params = draw_truth(d, k, gate_var=gate_var, expert_var=expert_var, zero_slope=zero_slope,
                        rng=np.random.default_rng(seed))
    spec = MoE(gate=truth_gate, expert=expert, k=k, d=d, noise_sd=float(np.sqrt(noise_var)))
    info = {
        "source": "nguyen2024 " + ("App. C Table 3" if regime == 1 else
                                   ("§4 Table 2" if truth_gate == "softmax" else "App. C Table 4")),
        "regime": regime,
        "truth_gate": truth_gate,
        "expert": expert,
        "zero_slope_atoms": zero_slope,
        "duplicate_candidates": candidates,
        "duplicate": [candidates[0]],
        "gate_var": gate_var,
        "expert_var": expert_var,
        "noise_var": noise_var,
        "inputs": "uniform[-1,1]",
        "seed": seed,
    }
    return Truth(spec, params, info)


def gate_comparison(expert: str = "gelu", *, truth_gate: str = "sigmoid", d: int = 4, k: int = 3,
                    noise_var: float = 0.01, gate_var: float = 1.0, expert_var: float = 1.0, seed: int = 0,
                    regime: int = 2, bias_bound: float = 2.0, kink_margin: float = 0.25, min_separation: float = 0.5,
                    max_draws: int = 10_000) -> Truth:
    r"""A truth for comparing gates on one functional: generic atoms, gates that vary, every expert kinked.

    Parameters are drawn from the nguyen2024 distributions
    :math:`\beta^*_{0i} \sim N(0, \nu_g)`, :math:`\beta^*_{1i} \sim N(0_d, \nu_g I_d)`,
    :math:`a^*_i \sim N(0_d, \nu_e I_d)`, :math:`b^*_i \sim N(0, \nu_e)` with :math:`\nu_g = \nu_e = 1` by
    default (so gate logits vary by about :math:`\pm\sqrt{d/3}` over :math:`U[-1,1]^d`), and a draw is
    kept only when

    * in ``regime=2`` (the default) no atom has a zero gate slope (draws are continuous, so this always holds:
      there is no regime-1 atom and none of the extra exact families that zero-slope atoms bring); in
      ``regime=1`` atom 0's gate slope is set to :math:`0_d` after the draw (a constant gate
      :math:`\sigma(\beta^*_{00})`), and the rules below are checked on that modified draw;
    * every ridge expert changes regime inside the cube, :math:`|b^*_i| \le \|a^*_i\|_1 - \text{kink\_margin}`
      (a relu expert always active or always off on the support would have a larger exact set);
    * every gate intercept satisfies :math:`|\beta^*_{0i}| \le` ``bias_bound`` (no atom nearly switched off);
    * atoms are separated: :math:`\min_{i \ne j}\|(\beta^*_{1i}, a^*_i, b^*_i) - (\beta^*_{1j}, a^*_j, b^*_j)\| \ge`
      ``min_separation``.

    The acceptance rule does not depend on ``expert`` or ``truth_gate``, so one seed gives the same
    parameters for every expert family and both gates (paired comparisons).  The duplicated atom of an
    over-specified fit defaults to atom 0: it has a non-zero slope in ``regime=2`` and a zero slope in
    ``regime=1`` (nguyen2024's regimes: the over-specified atoms' true gate slopes are all zero in regime 1,
    not all zero in regime 2).  For most seeds the two regimes share every other parameter (the same first
    accepted draw); a draw whose zero-slope version breaks the separation rule moves regime 1 to a later draw.

    Returns
    -------
    Truth
        ``info`` records the rules, the number of draws it took (``draws``) and the default ``duplicate``.
    """
    check_choice("truth_gate", truth_gate, ("sigmoid", "softmax"))
    d, k = check_int("d", d), check_int("k", k, minimum=2)
    if regime not in (1, 2):
        raise ValueError(f"regime must be 1 (atom 0 has a zero gate slope) or 2 (no zero slope), got {regime!r}.")
    zero_slope = [0] if regime == 1 else []
    rng = np.random.default_rng(seed)
    max_draws = check_int("max_draws", max_draws)
    draws = 0
    while draws < max_draws:
        draws += 1
        p = draw_truth(d, k, gate_var=gate_var, expert_var=expert_var, zero_slope=zero_slope, rng=rng)
        reach = np.abs(p.expert_weight).sum(1)
        omega = np.concatenate([p.gate_weight, p.expert_weight, p.expert_bias[:, None]], 1)
        dist = np.linalg.norm(omega[:, None] - omega[None], axis=-1)
        dist[np.diag_indices(k)] = np.inf
        if (np.all(np.abs(p.expert_bias) <= reach - kink_margin) and np.all(np.abs(p.gate_bias) <= bias_bound)
                and dist.min() >= min_separation):
            break
    else:
        raise ValueError(f"no draw in {max_draws} met the rules (bias_bound={bias_bound}, kink_margin={kink_margin}, "
                         f"min_separation={min_separation}); relax them or raise max_draws.")
    spec = MoE(gate=truth_gate, expert=expert, k=k, d=d, noise_sd=float(np.sqrt(noise_var)))
    info = {"source": "moestat gate-comparison design (nguyen2024 parameter distributions, constrained draws)",
            "regime": regime, "truth_gate": truth_gate, "expert": expert, "zero_slope_atoms": zero_slope,
            "duplicate_candidates": list(range(k)), "duplicate": [0], "gate_var": gate_var, "expert_var": expert_var,
            "noise_var": noise_var, "inputs": "uniform[-1,1]", "seed": seed, "draws": draws,
            "bias_bound": bias_bound, "kink_margin": kink_margin, "min_separation": min_separation}
    return Truth(spec, p, info)


PRESETS: dict[str, Callable[..., Truth]] = {"sigmoid_vs_softmax": sigmoid_vs_softmax,
                                             "gate_comparison": gate_comparison}
"""The paper's truths by name (a :class:`moestat.Study` truth entry names them as ``preset``)."""

# One row per result, in the columns of :data:`moestat.papers.THEORY_COLUMNS`: (source, result, gate, regime,
# expert, examples, quantity, response, regressor, rate, exponent, rate_model, direction, kind, note).
THEORY: list[tuple[Any, ...]] = [
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
     "no theorem: the split runs into the dead-atom family, outside Thm 5's compact setting",
     np.nan, None, "decay", "no_rate",
     "for phi(0) = 0 the only exact k*+1 representations have a dead extra atom; run to convergence, a weight "
     "split of the gate-comparison gelu truths runs into them along a flat valley (L2 fall < 3e-4); Thm 5's "
     "misspecified limit (response D3) needs a parameter set that keeps the copy alive, and no theorem gives "
     "the rate towards the dead-atom family"),
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
]
