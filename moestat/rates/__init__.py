"""Convergence exponents and sample complexity, with confidence intervals, tests, diagnostics and verdicts.

A rate study produces a tidy long frame: one row per (cell, replicate) with the sample size ``n``, a
replicate id ``rep`` and metric columns (a Voronoi loss, a parameter error, an accuracy).  This module
estimates the exponent ``alpha`` of ``error ~ C n^-alpha`` from such frames, with intervals that respect
the replicate structure (shocks shared by a cell, replicates nested across n, independent truth draws),
tests on exponents, model-fit and window diagnostics, a verdict on whether the exponent is a rate at all,
and sample complexities.

Rate models (every model regresses ``log y`` on a transform ``u(n)``, so their AICs are comparable):

============== ===================================== ====================================================
model          equation                              use
============== ===================================== ====================================================
``power``      ``log y = c - alpha log n``           parametric rates ``n^-alpha``
``power_log``  ``log y = c - alpha log(n / log n)``  bounds with a log factor, ``(log n / n)^alpha``
``inverse_log`` ``log y = c - alpha log log n``      slow rates ``(log n)^-alpha``; ``alpha = 1`` is the
                                                     ``1 / log n`` rate of polynomial / input-independent
                                                     experts (nguyen2024 Table 1)
============== ===================================== ====================================================

The exponent reported is always ``alpha`` (positive for a decaying error).  Sources: nguyen2024 §4 and §6
for the models; DerSimonian & Laird (1986), Knapp & Hartung (2003), Viechtbauer (2010) and Smyth (2004)
for the random-effects intervals.
"""

from ..exceptions import RateWarning
from . import plots
from ._core import MIN_N_VALUES, RATE_MODELS, VERDICTS, regressor
from .complexity import SampleComplexityResult, sample_complexity, scaling_exponent
from .exponents import (
    RateResult,
    WindowSensitivity,
    calibrate_design,
    compare_models,
    compare_rates,
    fit_rate,
    simulate_rate_frame,
    test_exponent,
    window_sensitivity,
)
from .ratios import mean_log_slope, ratio_scaling_exponent, sample_complexity_ratio, scaling_against_bound
from .theory import predicted_rate, register_theory, theory_rates

__all__ = [
    "MIN_N_VALUES",
    "RATE_MODELS",
    "VERDICTS",
    "RateResult",
    "RateWarning",
    "SampleComplexityResult",
    "WindowSensitivity",
    "calibrate_design",
    "compare_models",
    "compare_rates",
    "fit_rate",
    "mean_log_slope",
    "plots",
    "predicted_rate",
    "ratio_scaling_exponent",
    "register_theory",
    "regressor",
    "sample_complexity",
    "sample_complexity_ratio",
    "scaling_against_bound",
    "scaling_exponent",
    "simulate_rate_frame",
    "test_exponent",
    "theory_rates",
    "window_sensitivity",
]
