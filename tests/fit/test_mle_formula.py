"""fit_mle's statistician's interface: formulas, a gate with its own covariates, case weights, missing data, and
predictions that read new frames by column name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.special import logsumexp

import moestat as ms


def _concomitant_data(n: int = 500, seed: int = 0) -> pd.DataFrame:
    """Experts on x, gate on w only (a concomitant variable), plus a nuisance column."""
    rng = np.random.default_rng(seed)
    x, w = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-4 * w))
    y = np.where(first, 1 + 2 * x, -1 - x) + 0.2 * rng.normal(size=n)
    return pd.DataFrame({"y": y, "x": x, "w": w, "noise": rng.normal(size=n)})


def _loglik_by_hand(theta: np.ndarray, x: np.ndarray, w: np.ndarray, y: np.ndarray, c: np.ndarray | None = None):
    """The concomitant model's log-likelihood written out in numpy (reference expert 1):
    theta = (g0, g_w, b0, a0, b1, a1, log s0, log s1)."""
    g0, gw, b0, a0, b1, a1, ls0, ls1 = theta
    logit = g0 + gw * w
    logpi = np.stack([logit, np.zeros_like(logit)], 1)
    logpi -= logsumexp(logpi, axis=1, keepdims=True)
    mu = np.stack([b0 + a0 * x, b1 + a1 * x], 1)
    sd = np.exp([ls0, ls1])
    logn = -0.5 * ((y[:, None] - mu) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi)
    terms = logsumexp(logpi + logn, axis=1)
    return float(terms.sum() if c is None else (c * terms).sum())


@pytest.mark.parametrize("method", ["em", "gradient"])
def test_gate_formula_fits_the_concomitant_model(method):
    df = _concomitant_data()
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", method=method, seed=1)
    assert fit.param_names == ["gate[0]:const", "gate[0]:w", "expert[0]:const", "expert[0]:x", "expert[1]:const",
                               "expert[1]:x", "expert[0]:log_sigma", "expert[1]:log_sigma"]
    p = fit.params
    # the union MoE has columns (x, w): the gate never uses x, the experts never use w
    assert np.all(p.gate_weight[:, 0] == 0) and np.all(p.expert_weight[:, 1] == 0)
    theta = np.asarray(fit.theta)
    x, w, y = (df[c].to_numpy() for c in ("x", "w", "y"))
    assert fit.loglik == pytest.approx(_loglik_by_hand(theta, x, w, y), rel=1e-10)
    # a maximum: the central-difference gradient of the hand-written likelihood vanishes (step 1e-5: truncation
    # error ~1e-10 x third derivative, far below the 1e-3 allowed for a converged fit of n = 500)
    grad = [(_loglik_by_hand(theta + h, x, w, y) - _loglik_by_hand(theta - h, x, w, y)) / 2e-5
            for h in np.eye(len(theta)) * 1e-5]
    assert np.max(np.abs(grad)) < 1e-3
    # the truth is recovered within a few standard errors (truth gate slope -4 relative to the reference expert)
    assert abs(theta[1] - (-4.0 if theta[3] < 0 else 4.0)) < 4 * fit.bse()[1]


def test_em_and_gradient_agree_on_a_concomitant_fit():
    df = _concomitant_data(seed=3)
    em = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", seed=2)
    gr = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", method="gradient", init=em.params, seed=2)
    # both stop at the same maximum: loglik to the EM tolerance (1e-8 relative)
    assert gr.loglik == pytest.approx(em.loglik, rel=1e-7)


def test_formula_without_gate_formula_is_the_array_fit_with_names():
    df = _concomitant_data(seed=4)
    by_formula = ms.fit_mle(formula="y ~ x + w", data=df, k=2, seed=5)
    spec = ms.MoE(k=2, d=2)
    by_array = ms.fit_mle(spec, df[["x", "w"]].to_numpy(), df["y"].to_numpy(), seed=5)
    np.testing.assert_allclose(np.asarray(by_formula.theta), np.asarray(by_array.theta), rtol=1e-12, atol=1e-12)
    assert by_formula.param_names[:3] == ["gate[0]:const", "gate[0]:x", "gate[0]:w"]
    assert by_array.param_names[:3] == ["gate[0]:const", "gate[0]:x1", "gate[0]:x2"]


def test_transformations_and_categorical_terms_reach_the_names():
    df = _concomitant_data(seed=6).assign(g=lambda f: np.where(f["noise"] > 0, "a", "b"), xp=lambda f: f["x"] + 2)
    fit = ms.fit_mle(formula="y ~ np.log(xp) + C(g)", data=df, k=2, seed=0)
    assert "expert[0]:np.log(xp)" in fit.param_names and "expert[0]:C(g)[T.b]" in fit.param_names


@pytest.mark.parametrize("method", ["em", "gradient"])
def test_integer_weights_equal_repeated_rows(method):
    df = _concomitant_data(n=300, seed=7)
    counts = np.random.default_rng(8).integers(1, 4, len(df))
    weighted = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", weights=counts, method=method, seed=1)
    repeated = ms.fit_mle(formula="y ~ x", data=df.loc[df.index.repeat(counts)], k=2, gate_formula="~ w",
                          method=method, seed=1, init=weighted.params)
    assert weighted.nobs == repeated.nobs == counts.sum()
    # the same likelihood function: equal maxima (to the stopping tolerances), estimates and observed-information SEs
    assert weighted.loglik == pytest.approx(repeated.loglik, rel=1e-8)
    np.testing.assert_allclose(np.asarray(weighted.theta), np.asarray(repeated.theta), atol=1e-4)
    np.testing.assert_allclose(weighted.bse(), repeated.bse(), rtol=1e-3)
    np.testing.assert_allclose(weighted.bse("sandwich"), repeated.bse("sandwich"), rtol=1e-3)
    assert weighted.bic == pytest.approx(repeated.bic, rel=1e-8)


def test_array_weights_and_the_weighted_likelihood():
    df = _concomitant_data(n=200, seed=9)
    c = np.random.default_rng(1).uniform(0.5, 2.0, len(df))
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", weights=c, seed=0)
    x, w, y = (df[col].to_numpy() for col in ("x", "w", "y"))
    assert fit.loglik == pytest.approx(_loglik_by_hand(np.asarray(fit.theta), x, w, y, c), rel=1e-10)
    assert "case weights" in str(fit.summary())


def test_predictions_read_frames_by_name_not_position():
    df = _concomitant_data(seed=10)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", seed=0)
    new = df.head(20)
    reordered = new[["noise", "w", "y", "x"]].copy()
    np.testing.assert_array_equal(fit.predict(new), fit.predict(reordered))
    np.testing.assert_array_equal(fit.posterior(new, new["y"]), fit.posterior(reordered, reordered["y"]))
    with pytest.raises(ValueError, match="'w'"):
        fit.predict(new.drop(columns="w"))
    # an array fit on a frame keeps the frame's names and reads new frames by them
    arr = ms.fit_mle(ms.MoE(k=2, d=2), df[["x", "w"]], df["y"], seed=0)
    assert "gate[0]:w" in arr.param_names
    np.testing.assert_array_equal(arr.predict(new[["w", "x"]]), arr.predict(new[["x", "w"]].to_numpy()))


def test_missing_rows_raise_or_are_dropped_and_counted():
    df = _concomitant_data(seed=11)
    df.loc[[3, 7, 9], "x"] = np.nan
    with pytest.raises(ValueError, match="x"):
        ms.fit_mle(formula="y ~ x", data=df, k=2)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, missing="drop", seed=0)
    assert fit.settings["n_dropped"] == 3 and fit.nobs == len(df) - 3
    arr = ms.fit_mle(ms.MoE(k=2, d=1), df[["x"]].to_numpy(), df["y"].to_numpy(), missing="drop", seed=0)
    assert arr.settings["n_dropped"] == 3
    np.testing.assert_allclose(np.asarray(arr.theta), np.asarray(fit.theta), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"weights": -np.ones(500)}, "weights must be"),
    ({"weights": np.ones(499)}, "weights"),
    ({"weights": np.r_[np.nan, np.ones(499)]}, "weights"),
    ({"formula": "y ~ x + nothere"}, "nothere"),
    ({"formula": "y ~ 0 + x"}, "intercept"),
    ({"gate_formula": "~ absent"}, "absent"),
])
def test_bad_formula_inputs_name_the_argument(kwargs, match):
    df = _concomitant_data()
    args = {"formula": "y ~ x", "data": df, "k": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        ms.fit_mle(**args)


def test_formula_and_array_interfaces_do_not_mix():
    df = _concomitant_data()
    with pytest.raises(TypeError, match="either formula"):
        ms.fit_mle(formula="y ~ x", data=df, k=2, X=df[["x"]], y=df["y"])
    with pytest.raises(TypeError, match="needs data"):
        ms.fit_mle(formula="y ~ x", k=2)
    with pytest.raises(TypeError, match="k="):
        ms.fit_mle(formula="y ~ x", data=df)
    with pytest.raises(TypeError, match="needs formula"):
        ms.fit_mle(ms.MoE(k=2, d=1), df[["x"]], df["y"], gate_formula="~ w")


@pytest.mark.parametrize("kind", ["parametric", "nonparametric"])
def test_bootstrap_of_a_weighted_concomitant_fit_keeps_its_structure(kind):
    df = _concomitant_data(n=200, seed=12)
    counts = np.random.default_rng(2).integers(1, 3, len(df))
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", weights=counts, seed=0)
    boot = ms.bootstrap(fit, n_resamples=20, kind=kind, seed=1)
    assert boot.draws.shape == (20, fit.layout.size)
    ok = ~boot.failed
    assert ok.sum() >= 18
    # bootstrap SEs near the observed-information SEs (20 resamples: a relative SE of an SD of ~16%, so a factor 2
    # bounds the ratio with room to spare)
    ratio = boot.draws[ok].std(0, ddof=1) / fit.bse()
    assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio


def test_select_k_and_the_lrt_take_a_formula_with_a_gate_formula():
    df = _concomitant_data(n=300, seed=13)
    sel = ms.select_k(formula="y ~ x", data=df, gate_formula="~ w", ks=(1, 2, 3), seed=0)
    assert sel.best_k == 2
    assert "gate[0]:w" in sel.fits[2].param_names and "gate[0]:x" not in sel.fits[2].param_names
    direct = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", seed=0)
    # the same model: the k = 2 fit reaches the same maximum as a direct formula fit (EM tolerance)
    assert sel.fits[2].loglik == pytest.approx(direct.loglik, rel=1e-6)
    lrt = ms.test_n_experts(formula="y ~ x", data=df, gate_formula="~ w", k0=1, k1=2, n_resamples=9, seed=0)
    assert lrt.fit1.param_names == sel.fits[2].param_names
    # the fits keep the formula: the summary names the response, new frames go through the formula's terms
    named = ms.select_k(formula="np.log(visits) ~ x", data=df.assign(visits=np.exp(df["y"])), gate_formula="~ w",
                        ks=(2,), seed=0)
    assert named.fits[2].response_name == "np.log(visits)" and "np.log(visits)" in str(named.fits[2].summary())
    # the same model fitted from other starts: the two EM runs stop within their tolerance of one maximum
    np.testing.assert_allclose(named.fits[2].predict(df.head(5)), sel.fits[2].predict(df.head(5)), atol=1e-4)
    assert lrt.p_value == pytest.approx(0.1)  # two clearly separated experts: no null draw reaches the statistic
