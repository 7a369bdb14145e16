"""Estimators: least squares (lse), maximum likelihood (em, mle), tensor/Hermite moments (tensor)."""
