"""moestat: mixtures of experts as statistical models.

Simulate from a true MoE, fit it, score the fit against the truth with
symmetry-aware losses and estimate convergence exponents with confidence
intervals.  See https://moestat docs (``docs/``) for the guide.
"""

from importlib.metadata import PackageNotFoundError, version

from . import experts, gates
from .experts import EXPERTS, ExpertFamily, get_expert
from .fit import MLEConvergenceWarning, MLEFit, SingularInformationWarning, fit_mle
from .gates import GATES
from .inference import bootstrap, select_k, test_n_experts
from .model import MoE
from .params import Params
from .simulators import Dataset, presets, simulate


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
    "GATES",
    "Dataset",
    "ExpertFamily",
    "MLEConvergenceWarning",
    "MLEFit",
    "MoE",
    "MoERegressor",
    "Params",
    "SingularInformationWarning",
    "__version__",
    "bootstrap",
    "experts",
    "fit_mle",
    "gates",
    "get_expert",
    "presets",
    "select_k",
    "simulate",
    "test_n_experts",
]
