"""Standard errors are equivariant under a change of a covariate's units, at any scale."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import moestat as ms
from moestat.fit.results import _equilibrated_inverse

SPEC = ms.MoE(gate="softmax", expert="linear", k=2, d=1, noise_sd=0.5)
TRUTH = ms.Params(np.array([0.3, 0.0]), np.array([[2.0], [0.0]]), np.array([[1.5], [-1.0]]), np.array([0.5, -0.5]))


@pytest.fixture(scope="module")
def base():
    data = ms.simulate(SPEC, TRUTH, n=800, reps=1, seed=1, model="mixture")
    X, y = data.X[0], data.y[0]
    return X, y, ms.fit_mle(SPEC, X, y, restarts=4, seed=2, progress=False).align_to(TRUTH)


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1e3, 1e6])
@pytest.mark.parametrize("kind", ["oim", "sandwich", "opg"])
def test_rescaled_covariate_scales_its_slopes_standard_errors_and_nothing_else(base, scale, kind):
    """x -> s x maps the slopes to beta/s and leaves the intercepts, so the SEs of slopes are divided by s and the
    others are unchanged.  Before the equilibrated inverse, s = 1e+-6 gave NaN SEs with a 'singular information'
    warning that blamed too many experts.  Tolerance 1e-4 relative: the two fits stop at the same maximum to the
    optimiser's tolerance, not exactly."""
    X, y, fit0 = base
    with warnings.catch_warnings():
        warnings.simplefilter("error", ms.SingularInformationWarning)
        fit = ms.fit_mle(SPEC, X * scale, y, restarts=4, seed=2, progress=False)
        se = fit.align_to(ms.Params(TRUTH.gate_bias, TRUTH.gate_weight / scale, TRUTH.expert_weight / scale,
                                    TRUTH.expert_bias)).tidy(kind=kind)
    ref = fit0.tidy(kind=kind)
    assert (se["term"] == ref["term"]).all()
    slope = ref["term"].str.endswith(":x1").to_numpy()
    ratio = se["std_error"].to_numpy() / ref["std_error"].to_numpy()
    np.testing.assert_allclose(ratio[slope], 1 / scale, rtol=1e-4)
    np.testing.assert_allclose(ratio[~slope], 1.0, rtol=1e-4)


def test_equilibrated_inverse_is_the_inverse_and_flags_a_singular_matrix():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(4, 4))
    A = M @ M.T + 0.1 * np.eye(4)
    D = np.diag([1e-8, 1.0, 1e4, 1e9])
    scaled = D @ A @ D  # condition number ~1e34: a plain eigenvalue test calls it singular
    inv, ok = _equilibrated_inverse(np.stack([A, scaled, np.outer([1.0, 2, 3, 4], [1.0, 2, 3, 4])]))
    assert ok.tolist() == [True, True, False]
    np.testing.assert_allclose(inv[0], np.linalg.inv(A), rtol=1e-10)
    Dinv = np.diag(1 / np.diag(D))
    np.testing.assert_allclose(inv[1], Dinv @ np.linalg.inv(A) @ Dinv, rtol=1e-8)
    assert np.isnan(inv[2]).all()
