"""Estimators: least squares (lse), maximum likelihood (em, mle), tensor/Hermite moments (tensor)."""

from .lse import ConvergenceWarning, LSEFit, fit_lse

__all__ = ["ConvergenceWarning", "LSEFit", "fit_lse"]
