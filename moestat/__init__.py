"""moestat: mixtures of experts as statistical models.

Simulate from a true MoE, fit it, score the fit against the truth with
symmetry-aware losses and estimate convergence exponents with confidence
intervals.  See https://moestat docs (``docs/``) for the guide.
"""

from importlib.metadata import PackageNotFoundError, version

from . import experts, gates, hermite, metrics
from .experts import EXPERTS, ExpertFamily, get_expert
from .fit._gated import GatedFit
from .fit.gated_baselines import fit_em_gated, fit_l2_gated
from .fit.tensor import fit_tensor
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
from .metrics.gated import gating_error, regressor_error
from .model import MoE
from .params import Params
from .simulators import Dataset, presets, simulate
from .simulators.gated_nn import GatedNNData, GatedNNTruth, simulate_gated_nn

try:
    __version__ = version("moestat")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = [
    "EXPERTS",
    "GATES",
    "Dataset",
    "ExpertFamily",
    "GatedFit",
    "GatedNNData",
    "GatedNNTruth",
    "MoE",
    "Params",
    "__version__",
    "center_softmax",
    "check_identifiability",
    "experts",
    "fit_em_gated",
    "fit_l2_gated",
    "fit_tensor",
    "gates",
    "gating_error",
    "get_expert",
    "hermite",
    "l2_distance",
    "match_atoms",
    "metrics",
    "parameter_errors",
    "permutation_invariant_error",
    "presets",
    "regressor_error",
    "simulate",
    "simulate_gated_nn",
    "sup_expert_error",
    "voronoi_cells",
    "voronoi_loss",
]
