"""Estimators: least squares (lse), maximum likelihood (em, mle), tensor/Hermite moments (tensor), and the
regime-2 limit set of an over-specified least-squares fit (gbar: noise-free least-squares fits of f_G*)."""

from .gbar import GBarResult, estimate_gbar
from .gllim import GLLiMFit, GLLiMParams, fit_gllim, gllim_loglik, simulate_gllim
from .lse import ConvergenceWarning, LSEFit, fit_lse
from .mle import fit_mle
from .results import MLEConvergenceWarning, MLEFit, SingularInformationWarning

__all__ = ["ConvergenceWarning", "GBarResult", "GLLiMFit", "GLLiMParams", "LSEFit", "MLEConvergenceWarning", "MLEFit",
           "SingularInformationWarning", "estimate_gbar", "fit_gllim", "fit_lse", "fit_mle", "gllim_loglik",
           "simulate_gllim"]
