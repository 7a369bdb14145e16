r"""Nguyen, Nguyen & Ho (2023), "Demystifying Softmax Gating Function in Gaussian Mixture of Experts" (NeurIPS 2023;
arXiv:2305.03288): the rates of the maximum-likelihood estimator of a softmax-gated Gaussian MoE, as data.

The model is :math:`p_G(y\mid x) = \sum_i \mathrm{softmax}_i(\beta_1^\top x + \beta_0)\,
\mathcal N(y \mid a_i^\top x + b_i, \nu_i)`.  The paper bounds the conditional density's expected Hellinger
distance by :math:`\sqrt{\log n / n}` and each Voronoi loss by that distance, so :math:`D_1` (fitted
:math:`k = k^*`) and :math:`D_2` (:math:`k > k^*`) fall like :math:`(\log n / n)^{1/2}`
(:func:`moestat.gaussian_voronoi_loss`; docs page "Voronoi losses for the softmax-gated Gaussian MoE").  Reading
the exponents of :math:`D_2` back into the parameters gives the per-parameter rates below: an over-specified cell of
:math:`m` atoms moves :math:`\beta_1, b` at :math:`n^{-1/(2\bar r(m))}` and :math:`a, \nu` at
:math:`n^{-1/\bar r(m)}`, with :math:`\bar r(2) = 4` and :math:`\bar r(3) = 6` (the smallest :math:`r` for which
the system of polynomial equations of the paper's Section 3 has only the trivial solution).

The rows name the response columns a :class:`moestat.Study` with the ``gaussian_voronoi`` metric writes
(``gaussian_voronoi``), with ``regime`` ``"exact"`` (:math:`k = k^*`) or ``"over"`` (:math:`k > k^*`); the
per-parameter rows are for studies that record parameter errors by cell size.  The reproduction is the vignette
``softmax-gaussian-moe``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RBAR", "REFERENCE", "THEORY"]

REFERENCE = ("Nguyen, H., Nguyen, T. and Ho, N. (2023). Demystifying softmax gating function in Gaussian mixture of "
             "experts. Advances in Neural Information Processing Systems 36.")

RBAR = {2: 4, 3: 6}
r"""The exponent :math:`\bar r(m)` of an over-specified Voronoi cell of :math:`m` fitted atoms."""

_EXAMPLES = "linear"


def _cell_rows(m: int, rbar: int) -> list[tuple[Any, ...]]:
    """The parameter rows of an over-specified cell of ``m`` atoms (exponents 1/(2 rbar) and 1/rbar)."""
    return [
        ("nguyen2023", "over-specified MLE (D2 bound)", "softmax", "over", "linear", _EXAMPLES,
         f"beta1 and b in a cell of {m} atoms", f"param_cell{m}_slow", "n", f"n^{{-1/{2 * rbar}}} (up to logs)",
         1.0 / (2 * rbar), "power_log", "decay", "upper_bound",
         f"rbar({m}) = {rbar}: the D2 terms |d beta1|^rbar and |d b|^rbar fall like (log n / n)^(1/2)"),
        ("nguyen2023", "over-specified MLE (D2 bound)", "softmax", "over", "linear", _EXAMPLES,
         f"a and nu in a cell of {m} atoms", f"param_cell{m}_fast", "n", f"n^{{-1/{rbar}}} (up to logs)",
         1.0 / rbar, "power_log", "decay", "upper_bound",
         f"rbar({m}) = {rbar}: the D2 terms |d a|^(rbar/2) and |d nu|^(rbar/2) fall like (log n / n)^(1/2)"),
    ]


# One row per result, in the columns of :data:`moestat.rates.theory.THEORY_COLUMNS`.
THEORY: list[tuple[Any, ...]] = [
    ("nguyen2023", "density estimation", "softmax", "exact|over", "linear", _EXAMPLES,
     "expected Hellinger distance of the conditional density", "hellinger", "n", "(log n / n)^{1/2}", 0.5,
     "power_log", "decay", "upper_bound", "holds for every k >= k*"),
    ("nguyen2023", "exact-specified MLE", "softmax", "exact", "linear", _EXAMPLES, "Voronoi loss D1 (k = k*)",
     "gaussian_voronoi", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound",
     "every parameter at n^{-1/2} up to logs"),
    ("nguyen2023", "over-specified MLE", "softmax", "over", "linear", _EXAMPLES, "Voronoi loss D2 (k > k*)",
     "gaussian_voronoi", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay", "upper_bound",
     "the loss falls at the parametric rate although the parameters of split cells move slower"),
    ("nguyen2023", "over-specified MLE", "softmax", "over", "linear", _EXAMPLES,
     "weight sum of an over-specified cell", "weight_sum", "n", "(log n / n)^{1/2}", 0.5, "power_log", "decay",
     "upper_bound", "the first term of D2"),
    *[row for m, rbar in RBAR.items() for row in _cell_rows(m, rbar)],
]
