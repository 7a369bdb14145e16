"""One warning hierarchy (moestat.exceptions): every warning is a MoestatWarning, each old import path is the same
class, and the fitters' convergence warnings share one base."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import moestat as ms
import moestat.exceptions as exc


def test_every_warning_is_a_moestat_warning_and_exported():
    classes = [c for _, c in inspect.getmembers(exc, inspect.isclass) if c.__module__ == exc.__name__]
    names = {c.__name__ for c in classes}
    assert names == set(exc.__all__)
    for c in classes:
        assert getattr(ms, c.__name__) is c  # one public name per class, at the top level
        if issubclass(c, Warning):
            assert issubclass(c, ms.MoestatWarning) and issubclass(c, UserWarning)
    assert issubclass(ms.MLEConvergenceWarning, ms.ConvergenceWarning)
    assert issubclass(ms.StudyConfigError, ValueError)


def test_old_import_paths_name_the_same_classes():
    from moestat.fit import ConvergenceWarning, MLEConvergenceWarning, SingularInformationWarning
    from moestat.fit.mle import UnderdeterminedWarning
    from moestat.metrics.representations import RepresentationWarning
    from moestat.rates import RateWarning
    from moestat.rates._core import _as_list  # noqa: F401  (the private core still imports)
    from moestat.study import StudyConfigError

    assert (ConvergenceWarning, MLEConvergenceWarning, SingularInformationWarning, UnderdeterminedWarning,
            RepresentationWarning, RateWarning, StudyConfigError) == (
        ms.ConvergenceWarning, ms.MLEConvergenceWarning, ms.SingularInformationWarning, ms.UnderdeterminedWarning,
        ms.RepresentationWarning, ms.RateWarning, ms.StudyConfigError)


def test_one_filter_reaches_a_real_fitters_warning():
    spec, truth = ms.presets.gate_comparison("relu", d=2, k=2, seed=0)
    data = ms.simulate(spec, truth, n=300, reps=1, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ms.MoestatWarning)
        with pytest.raises(ms.ConvergenceWarning, match="did not converge"):
            ms.fit_lse(spec, data.X, data.y, truth=truth, max_iter=1, tol=0.0, gtol=0.0, condition=False)
    with pytest.raises(ms.StudyConfigError, match="preset"):
        ms.Study(name="bad", truth={"preset": "nope"}, fit={"estimator": "lse"}, n=[100], reps=1, seed=0)
    assert np.isfinite(data.y).all()


def test_warnings_point_at_the_users_line():
    """A warning from inside moestat, reached through the argument-check and renamed-argument decorators, is
    attributed to the caller's file and line (filters by module and the shown location then work)."""
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
    X, y = np.linspace(-1, 1, 5)[:, None], np.zeros(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ms.fit_lse(spec, X, y, init="random", underdetermined="warn", max_iter=2)  # 5 < 6 mean parameters
        line = inspect.currentframe().f_lineno - 1
    under = [w for w in caught if issubclass(w.category, ms.UnderdeterminedWarning)]
    assert under and under[0].filename == __file__ and under[0].lineno == line

