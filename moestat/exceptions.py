"""moestat's warnings and errors, in one hierarchy.

Every warning moestat emits is a :class:`MoestatWarning` (a ``UserWarning``), so one filter reaches them all::

    import warnings
    warnings.simplefilter("error", ms.MoestatWarning)     # make every moestat warning an error

and each kind has its own class to filter on:

* :class:`ConvergenceWarning` — an estimator's best start did not meet its convergence tolerance (any fitter;
  :class:`MLEConvergenceWarning` is the maximum-likelihood fitters' subclass);
* :class:`SingularInformationWarning` — the observed information is singular: no standard errors;
* :class:`UnderdeterminedWarning` — fewer observations than free parameters;
* :class:`DegenerateFitWarning` — a fit that degenerated (a vanishing component, a variance at the floor or
  collapsed onto tied responses, a separating gate direction);
* :class:`RateWarning` — a rate fit that is possible but statistically fragile;
* :class:`RepresentationWarning` — a truth whose exact set is larger than the families searched.

Invalid arguments raise ``ValueError`` or ``TypeError`` naming the argument; an invalid study configuration
raises :class:`StudyConfigError` (a ``ValueError``) naming the key and the valid values.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["CheckpointWarning", "ConvergenceWarning", "DegenerateFitWarning", "MLEConvergenceWarning",
           "MoestatWarning", "RateWarning", "RepresentationWarning", "SingularInformationWarning",
           "StudyConfigError", "StudyFailureWarning", "UnderdeterminedWarning"]


class MoestatWarning(UserWarning):
    """Base class of every warning moestat emits."""


class ConvergenceWarning(MoestatWarning):
    """The best restart of some replicate did not meet the convergence tolerance."""


class MLEConvergenceWarning(ConvergenceWarning):
    """The best start of at least one replicate did not meet the maximum-likelihood convergence criterion."""


class SingularInformationWarning(MoestatWarning):
    """The observed information is singular or not positive definite: standard errors are not reported."""


class DegenerateFitWarning(MoestatWarning):
    """A maximum-likelihood fit degenerated: what happened, to which expert, and what to do."""


class UnderdeterminedWarning(MoestatWarning):
    """Fewer observations than free parameters (``underdetermined="warn"`` of fit_lse and fit_mle): the estimator is
    not identified."""


class RateWarning(MoestatWarning):
    """A rate fit that is technically possible but statistically fragile (narrow range, few n values...)."""


class RepresentationWarning(MoestatWarning):
    """The exact set of this truth is larger than the families searched: errors are upper bounds."""


class StudyFailureWarning(MoestatWarning):
    """A finished study holds failed replicates (rows with ``status`` ``"error"`` or ``"not_converged"``), or a
    rate fit skipped error rows."""


class CheckpointWarning(MoestatWarning):
    """A stored cell was damaged, belonged to another cell or lacked replicates: it is recomputed."""


class StudyConfigError(ValueError):
    """An invalid study configuration; the message names the key and the valid values."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the user's line: the first caller outside the moestat package.

    A fixed ``stacklevel`` points into moestat whenever a public function is reached through a decorator
    (argument checks, renamed arguments) or a helper; walking the stack keeps warnings filterable by the
    user's module and shown at the user's call."""
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
