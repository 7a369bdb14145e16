"""Shape properties shared by the simulated data sets (inputs ``X`` with leading axes (replicate, sample))."""

from __future__ import annotations


class ReplicateShapes:
    """Mixin for data classes whose ``X`` has shape (R, n, ...): replicates first, samples second."""

    @property
    def n_reps(self) -> int:
        """Number of replicates R."""
        return int(self.X.shape[0])

    @property
    def n(self) -> int:
        """Number of samples per replicate (the papers' n, or N in chowdhury2023)."""
        return int(self.X.shape[1])
