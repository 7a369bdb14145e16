"""Estimators: least squares (lse), maximum likelihood (em, mle), tensor/Hermite moments (tensor)."""

from .mle import fit_mle
from .results import MLEConvergenceWarning, MLEFit, SingularInformationWarning

__all__ = ["MLEConvergenceWarning", "MLEFit", "SingularInformationWarning", "fit_mle"]
