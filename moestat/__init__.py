"""moestat: mixtures of experts as statistical models.

Simulate from a true MoE, fit it, score the fit against the truth with
symmetry-aware losses and estimate convergence exponents with confidence
intervals.  See https://moestat docs (``docs/``) for the guide.
"""

from importlib.metadata import PackageNotFoundError, version

from . import experts, gates, metrics
from .experts import EXPERTS, ExpertFamily, get_expert
from .gates import GATES
from .metrics import (
    center_softmax,
    check_identifiability,
    l2_distance,
    match_atoms,
    parameter_errors,
    permutation_invariant_error,
    sup_expert_error,
    voronoi_cells,
    voronoi_loss,
)
from .model import MoE
from .params import Params
from .simulators import Dataset, presets, simulate
from .study import Study

try:
    __version__ = version("moestat")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = [
    "EXPERTS",
    "GATES",
    "Dataset",
    "ExpertFamily",
    "MoE",
    "Params",
    "Study",
    "__version__",
    "center_softmax",
    "check_identifiability",
    "experts",
    "gates",
    "get_expert",
    "l2_distance",
    "match_atoms",
    "metrics",
    "parameter_errors",
    "permutation_invariant_error",
    "presets",
    "simulate",
    "sup_expert_error",
    "voronoi_cells",
    "voronoi_loss",
]
