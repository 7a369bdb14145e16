"""Estimators: least squares (lse), maximum likelihood (em, mle), tensor/Hermite moments (tensor)."""

from .lse import ConvergenceWarning, LSEFit, fit_lse
from .mle import fit_mle
from .results import MLEConvergenceWarning, MLEFit, SingularInformationWarning

__all__ = ["ConvergenceWarning", "LSEFit", "MLEConvergenceWarning", "MLEFit", "SingularInformationWarning",
           "fit_lse", "fit_mle"]
