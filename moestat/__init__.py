"""moestat: mixtures of experts as statistical models.

Simulate from a true MoE, fit it, score the fit against the truth with
symmetry-aware losses and estimate convergence exponents with confidence
intervals.  See https://moestat docs (``docs/``) for the guide.
"""

from importlib.metadata import PackageNotFoundError, version

from . import contaminated, deep, experts, gates, hermite, metrics, papers, rates
from .contaminated import ContaminatedFit, ContaminatedMoE, ContaminatedParams, FrozenExpert, fit_contaminated
from .diagnostics import design_check, lowest_objective, optimizer_invariance
from .exceptions import (
    CheckpointWarning,
    ConvergenceWarning,
    DegenerateFitWarning,
    MoestatWarning,
    RepresentationWarning,
    StudyConfigError,
    StudyFailureWarning,
    UnderdeterminedWarning,
)
from .experts import EXPERTS, ExpertFamily, get_expert
from .families import FAMILIES, Family, get_family
from .fit import (
    GBarResult,
    LSEFit,
    MLEConvergenceWarning,
    MLEFit,
    SingularInformationWarning,
    estimate_gbar,
    fit_lse,
    fit_mle,
)
from .fit.gated import GatedFit
from .fit.gated_baselines import fit_em_gated, fit_l2_gated
from .fit.gllim import GLLiMParams, fit_gllim
from .fit.tensor import fit_tensor
from .formula import ModelDesign, build_design
from .gates import GATES
from .inference import bootstrap, select_k, test_n_experts
from .metrics import (
    RepresentationErrors,
    center_softmax,
    check_identifiability,
    gaussian_voronoi_frame,
    gaussian_voronoi_loss,
    l2_distance,
    match_atoms,
    parameter_errors,
    permutation_invariant_error,
    representation_errors,
    sup_expert_error,
    voronoi_cells,
    voronoi_loss,
)
from .metrics.gated import gating_error, regressor_error
from .model import MoE
from .papers import presets
from .params import Params
from .rates import (
    RateResult,
    RateWarning,
    SampleComplexityResult,
    WindowSensitivity,
    calibrate_design,
    compare_models,
    compare_rates,
    fit_rate,
    plots,
    predicted_rate,
    sample_complexity,
    scaling_exponent,
    test_exponent,
    theory_rates,
    window_sensitivity,
)
from .simperf import jackknife_mcse, n_reps_for, performance_measures
from .simulators import ClusterData, Dataset, PatchData, Truth, simulate, simulate_clusters, simulate_patches
from .simulators.gated_nn import GatedNNData, GatedNNTruth, simulate_gated_nn
from .solve_n import SolveNResult, solve_n
from .study import Study, StudyFailureError


def __getattr__(name: str):
    # MoERegressor needs scikit-learn (an optional dependency): import it only when asked for.
    if name == "MoERegressor":
        from .sklearn import MoERegressor

        return MoERegressor
    raise AttributeError(f"module 'moestat' has no attribute {name!r}")


try:
    __version__ = version("moestat")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = [
    "EXPERTS",
    "FAMILIES",
    "GATES",
    "CheckpointWarning",
    "ClusterData",
    "ContaminatedFit",
    "ContaminatedMoE",
    "ContaminatedParams",
    "ConvergenceWarning",
    "Dataset",
    "DegenerateFitWarning",
    "ExpertFamily",
    "Family",
    "FrozenExpert",
    "GBarResult",
    "GLLiMParams",
    "GatedFit",
    "GatedNNData",
    "GatedNNTruth",
    "LSEFit",
    "MLEConvergenceWarning",
    "MLEFit",
    "MoE",
    "MoERegressor",
    "ModelDesign",
    "MoestatWarning",
    "Params",
    "PatchData",
    "RateResult",
    "RateWarning",
    "RepresentationErrors",
    "RepresentationWarning",
    "SampleComplexityResult",
    "SingularInformationWarning",
    "SolveNResult",
    "Study",
    "StudyConfigError",
    "StudyFailureError",
    "StudyFailureWarning",
    "Truth",
    "UnderdeterminedWarning",
    "WindowSensitivity",
    "__version__",
    "bootstrap",
    "build_design",
    "calibrate_design",
    "center_softmax",
    "check_identifiability",
    "compare_models",
    "compare_rates",
    "contaminated",
    "deep",
    "design_check",
    "estimate_gbar",
    "experts",
    "fit_contaminated",
    "fit_em_gated",
    "fit_gllim",
    "fit_l2_gated",
    "fit_lse",
    "fit_mle",
    "fit_rate",
    "fit_tensor",
    "gates",
    "gating_error",
    "gaussian_voronoi_frame",
    "gaussian_voronoi_loss",
    "get_expert",
    "get_family",
    "hermite",
    "jackknife_mcse",
    "l2_distance",
    "lowest_objective",
    "match_atoms",
    "metrics",
    "n_reps_for",
    "optimizer_invariance",
    "papers",
    "parameter_errors",
    "performance_measures",
    "permutation_invariant_error",
    "plots",
    "predicted_rate",
    "presets",
    "rates",
    "regressor_error",
    "representation_errors",
    "sample_complexity",
    "scaling_exponent",
    "select_k",
    "simulate",
    "simulate_clusters",
    "simulate_gated_nn",
    "simulate_patches",
    "solve_n",
    "sup_expert_error",
    "test_exponent",
    "test_n_experts",
    "theory_rates",
    "voronoi_cells",
    "voronoi_loss",
    "window_sensitivity",
]
