"""moestat: mixtures of experts as statistical models.

Simulate from a true MoE, fit it, score the fit against the truth with
symmetry-aware losses and estimate convergence exponents with confidence
intervals.  See https://moestat docs (``docs/``) for the guide.
"""

from importlib.metadata import PackageNotFoundError, version

from . import experts, gates
from .experts import EXPERTS, ExpertFamily, get_expert
from .gates import GATES
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
    "experts",
    "gates",
    "get_expert",
    "presets",
    "simulate",
]
