"""Data inputs at the estimators' doors: lossless conversions give the same fit, non-numbers a clean error."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import moestat as ms

SPEC = ms.MoE(gate="softmax", expert="linear", k=2, d=2)
TRUTH = ms.Params([0.5, 0.0], [[2.0, -1.0], [0.0, 0.0]], [[1.0, 0.5], [-1.0, 0.2]], [0.3, -0.3])


@pytest.fixture(scope="module")
def data():
    d = ms.simulate(SPEC, TRUTH, n=200, seed=3)
    X = np.round(d.X[0] * 4) / 4  # a grid of quarters: exact in float32 and as integers after scaling by 4
    return X, d.y[0]


@pytest.fixture(scope="module")
def mixture_data():
    """Draws from the mixture itself (a regular likelihood maximum: the gate does not run off to a step, as it can on
    draws of the regression function, where the information and the SEs of a separating gate are not finite)."""
    d = ms.simulate(SPEC, ms.Params(TRUTH.gate_bias, TRUTH.gate_weight, TRUTH.expert_weight, TRUTH.expert_bias,
                                    noise_sd=[0.3, 0.3]), n=400, seed=3, model="mixture")
    return np.round(d.X[0] * 4) / 4, d.y[0]


def _lse(X, y):
    return ms.fit_lse(SPEC, X, y, init="random", restarts=2, seed=1, max_iter=30, condition=False).objective


def _mle(X, y):
    return ms.fit_mle(SPEC, X, y, restarts=2, seed=1, max_iter=30).loglik


CONVERSIONS = {
    "DataFrame/Series": lambda X, y: (pd.DataFrame(X, columns=["a", "b"]), pd.Series(y)),
    "lists": lambda X, y: (X.tolist(), y.tolist()),
    "float32": lambda X, y: (X.astype(np.float32), y.astype(np.float32)),
    "torch": lambda X, y: (torch.as_tensor(X), torch.as_tensor(y)),
}


@pytest.mark.parametrize("fit", [_lse, _mle], ids=["fit_lse", "fit_mle"])
@pytest.mark.parametrize("convert", list(CONVERSIONS), ids=list(CONVERSIONS))
def test_lossless_conversions_give_the_same_fit(data, fit, convert):
    X, y = data
    Xc, yc = CONVERSIONS[convert](X, y)
    if convert == "float32":  # y is rounded to float32 too: compare with the float64 fit of the same numbers
        y = y.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(fit(Xc, yc), fit(X, y), rtol=1e-10)


def test_integer_arrays_are_numbers(data):
    X, y = data
    Xi = (X * 4).astype(np.int64)
    np.testing.assert_allclose(_lse(Xi, y), _lse(Xi.astype(np.float64), y), rtol=1e-12)


@pytest.mark.parametrize("fitter", ["fit_lse", "fit_mle", "fit_tensor"])
def test_non_numbers_empty_data_and_meta_tensors_get_clean_errors(data, fitter):
    X, y = data
    call = {"fit_lse": lambda X, y: ms.fit_lse(SPEC, X, y, init="random"),
            "fit_mle": lambda X, y: ms.fit_mle(SPEC, X, y),
            "fit_tensor": lambda X, y: ms.fit_tensor(X, y, 2)}[fitter]
    words = np.array([["a", "b"]] * len(y), dtype=object)
    with pytest.raises(TypeError, match=r"X must hold real numbers, got an array of dtype object \(e.g. 'a'\)"):
        call(words, y)
    with pytest.raises(TypeError, match="y must hold real numbers"):
        call(X, np.array(["1.0"] * len(y)))
    with pytest.raises(ValueError, match=r"no observations|0 observations"):
        call(np.zeros((0, 2)), np.zeros(0))
    with pytest.raises(ValueError, match="tensor on device 'meta'"):
        call(torch.empty(len(y), 2, device="meta"), torch.as_tensor(y))


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1e3, 1e6])
def test_fit_lse_gives_the_same_function_at_every_input_scale(data, scale):
    """fit_lse fits inputs far from unit scale as X / s and maps the slopes back (the model is equivariant): the
    fitted function and objective are those of the unit-scale fit (measured gap 1e-9), and a box still bounds the
    slopes on the user's scale."""
    X, y = data
    kw = dict(init="kmeans", restarts=3, seed=1, condition=False)
    unit = ms.fit_lse(SPEC, X, y, **kw)
    scaled = ms.fit_lse(SPEC, X * scale, y, **kw)
    assert unit.settings["input_scale"] is None and scaled.settings["input_scale"] is not None
    np.testing.assert_allclose(scaled.objective, unit.objective, rtol=1e-8)
    gap = np.abs(SPEC.mean(scaled.params, X * scale) - SPEC.mean(unit.params, X)).max()
    assert gap < 1e-6  # both converged to gtol; the residual sd is 0.1
    box = 0.3 / scale  # tight enough to bind the slopes on the user's scale
    boxed = ms.fit_lse(SPEC, X * scale, y, box={"expert_weight": box}, **kw)
    assert np.abs(boxed.params.expert_weight).max() <= box * (1 + 1e-9) and boxed.hit_bound.any()


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1e3, 1e6])
def test_fit_mle_gives_the_same_estimate_at_every_input_scale(mixture_data, scale):
    """fit_mle fits inputs far from unit scale as X / s and maps the slopes back: the log-likelihood is the unit-scale
    one (it was -201 instead of 394 at scale 1e-6 before), the slopes scale by 1 / scale, and at moderate scales the
    standard errors of the slopes do too."""
    X, y = mixture_data
    kw = dict(restarts=3, seed=1, tol=1e-14, max_iter=5000)  # both run to the optimum, not to a stopping rule
    unit = ms.fit_mle(SPEC, X, y, **kw)
    scaled = ms.fit_mle(SPEC, X * scale, y, **kw)
    assert unit.settings["input_scale"] is None and scaled.settings["input_scale"] is not None
    np.testing.assert_allclose(scaled.loglik, unit.loglik, rtol=1e-8)
    np.testing.assert_allclose(scaled.params.expert_weight * scale, unit.params.expert_weight, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(scaled.predict(X * scale), unit.predict(X), atol=1e-6)
    if 1e-3 <= scale <= 1e3:  # at 1e-6 the user-scale information spans 12 decades and may be declared singular
        slope = [i for i, name in enumerate(unit.param_names) if "x" in name.split(":")[-1]]
        np.testing.assert_allclose(np.asarray(scaled.bse())[slope] * scale, np.asarray(unit.bse())[slope], rtol=1e-3)
