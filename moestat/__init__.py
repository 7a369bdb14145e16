"""moestat: mixtures of experts as statistical models.

Simulate from a true MoE, fit it, score the fit against the truth with
symmetry-aware losses and estimate convergence exponents with confidence
intervals.  See https://moestat docs (``docs/``) for the guide.
"""

from importlib.metadata import PackageNotFoundError, version

from . import experts, gates
from .experts import EXPERTS, ExpertFamily, get_expert
from .fit import LSEFit, fit_lse
from .gates import GATES
from .model import MoE
from .params import Params
from .simulators import Dataset, presets, simulate

try:
    __version__ = version("moestat")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = [
    "EXPERTS",
    "GATES",
    "Dataset",
    "ExpertFamily",
    "LSEFit",
    "MoE",
    "Params",
    "__version__",
    "experts",
    "fit_lse",
    "gates",
    "get_expert",
    "presets",
    "simulate",
]
