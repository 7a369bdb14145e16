"""Metrics that respect MoE symmetries: Voronoi losses, matching, distances, identifiability."""

from .distance import l2_distance, sup_expert_error
from .errors import parameter_errors
from .gaussian_gate_voronoi import gaussian_gate_voronoi_frame, gaussian_gate_voronoi_loss
from .gaussian_voronoi import GAUSSIAN_KINDS, gaussian_voronoi_frame, gaussian_voronoi_loss
from .identifiability import IdentifiabilityResult, check_identifiability, derivative_family, homogeneity_orbit
from .matching import Matching, match_atoms, permutation_invariant_error
from .representations import (
    RepresentationErrors,
    RepresentationWarning,
    mu_sample,
    representation_errors,
    sample_representations,
    split_family,
)
from .theory_loss import theory_loss, theory_loss_kind
from .topk_voronoi import topk_voronoi_frame, topk_voronoi_loss
from .voronoi import KINDS, VoronoiCells, center_softmax, voronoi_cells, voronoi_loss, voronoi_losses

__all__ = [
    "GAUSSIAN_KINDS",
    "KINDS",
    "IdentifiabilityResult",
    "Matching",
    "RepresentationErrors",
    "RepresentationWarning",
    "VoronoiCells",
    "center_softmax",
    "check_identifiability",
    "derivative_family",
    "gaussian_gate_voronoi_frame",
    "gaussian_gate_voronoi_loss",
    "gaussian_voronoi_frame",
    "gaussian_voronoi_loss",
    "homogeneity_orbit",
    "l2_distance",
    "match_atoms",
    "mu_sample",
    "parameter_errors",
    "permutation_invariant_error",
    "representation_errors",
    "sample_representations",
    "split_family",
    "sup_expert_error",
    "theory_loss",
    "theory_loss_kind",
    "topk_voronoi_frame",
    "topk_voronoi_loss",
    "voronoi_cells",
    "voronoi_loss",
    "voronoi_losses",
]
