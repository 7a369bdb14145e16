"""The shared result interface (moestat.fit.base.FitResult) on the least-squares and likelihood fits."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import moestat as ms
from moestat.fit.base import TIDY_COLUMNS, FitResult


@pytest.fixture(scope="module")
def data():
    spec, truth = ms.presets.gate_comparison("gelu", seed=1)
    return spec, truth, ms.simulate(spec, truth, n=300, reps=3, seed=2)


@pytest.fixture(scope="module")
def lse(data):
    spec, truth, d = data
    return ms.fit_lse(spec, d.X, d.y, init=["near_truth", "kmeans"], truth=truth, seed=0, history=True)


@pytest.fixture(scope="module")
def mle():
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1, noise_sd=0.3)
    truth = ms.Params(np.array([0.0, 0.0]), np.array([[2.0], [0.0]]), np.array([[1.0], [-1.0]]),
                      np.array([0.5, -0.5]), np.array([0.3, 0.3]))
    d = ms.simulate(spec, truth, n=400, reps=3, seed=4)
    return ms.fit_mle(spec, d.X, d.y, restarts=2, seed=0)


def test_every_fit_is_a_fit_result(lse, mle):
    for fit in (lse, mle):
        assert isinstance(fit, FitResult) and fit.n_reps == 3


def test_glance_has_one_row_per_replicate(lse, mle):
    g = lse.glance()
    assert list(g["rep"]) == [0, 1, 2]
    np.testing.assert_array_equal(g["objective"], lse.objective)
    assert {"converged", "n_iter", "status", "best_start", "optimizer"} <= set(g.columns)
    gm = mle.glance()
    np.testing.assert_allclose(gm["loglik"], mle.loglik)
    np.testing.assert_allclose(mle.objective, -mle.loglik / mle.nobs)


def test_tidy_lists_every_coefficient_with_its_estimate(lse, mle):
    t = lse.tidy()
    assert list(t.columns[: len(TIDY_COLUMNS)]) == TIDY_COLUMNS
    p = lse.params
    gate = t[(t.block == "gate") & (t.coef == "x2")].sort_values(["rep", "atom"])["estimate"].to_numpy()
    np.testing.assert_array_equal(gate, np.asarray(p.gate_weight)[:, :, 1].ravel())
    ebias = t[(t.block == "expert") & (t.coef == "const")].sort_values(["rep", "atom"])["estimate"].to_numpy()
    np.testing.assert_array_equal(ebias, np.asarray(p.expert_bias).ravel())
    tm = mle.tidy()
    assert set(TIDY_COLUMNS) <= set(tm.columns) and {"std_error", "conf_low", "conf_high"} <= set(tm.columns)
    assert (tm["atom"] == tm["expert"]).all()


def test_select_keeps_the_replicates_it_names(lse, mle):
    sub = lse.select([2, 0])
    assert isinstance(sub, type(lse)) and sub.n_reps == 2
    np.testing.assert_array_equal(sub.objective, lse.objective[[2, 0]])
    assert sub.params.allclose(lse.params.select([2, 0]))
    assert list(sub.restarts["rep"]) == [0, 0, 1, 1]
    np.testing.assert_array_equal(sub.restarts["objective"], lse.restarts["objective"].to_numpy()[[4, 5, 0, 1]])
    assert set(sub.history["rep"]) == {0, 1} and sub.start_params.n_reps == 4
    pd.testing.assert_frame_equal(sub.glance().drop(columns="rep").reset_index(drop=True),
                                  lse.glance().iloc[[2, 0]].drop(columns="rep").reset_index(drop=True))
    one = mle.select(1)
    assert one.n_reps == 1 and not one.single
    np.testing.assert_allclose(one.loglik, mle.loglik[[1]])
    # standard errors recomputed on the selected replicate's data equal the batched fit's
    np.testing.assert_allclose(one.bse(), mle.bse()[[1]], rtol=1e-10)
    with pytest.raises(ValueError, match="rep must be in"):
        lse.select(3)


def test_one_summary_type_renders_as_text_html_and_latex(lse, mle):
    for summ in (lse.summary(1), mle.summary(1)):
        text, html, tex = summ.as_text(), summ.as_html(), summ.as_latex()
        assert "const" in text and "<table" in html and "\\begin{tabular}" in tex
    assert "LSEFit: replicate 1" in lse.summary(1).as_text()


def test_gated_fits_share_the_interface():
    """The gated-network estimators (fixed iteration budgets) return FitResults: objective of the selected
    restart, converged False, n_iter the budget, glance/tidy/select like the other fits."""
    data = ms.simulate_gated_nn(n=2000, reps=3, seed=5)
    fit = ms.fit_l2_gated(data.X, data.y, 2, restarts=3, iters=40, seed=0)
    assert isinstance(fit, FitResult) and fit.n_reps == 3
    np.testing.assert_array_equal(fit.objective, fit.restart_objective[np.arange(3), fit.best_restart])
    assert not fit.converged.any() and (fit.n_iter == 40).all()
    g = fit.glance()
    assert list(g["rep"]) == [0, 1, 2] and (g["method"] == "l2").all()
    t = fit.tidy()
    np.testing.assert_array_equal(t[(t.block == "expert") & (t.coef == "x1")].sort_values(["rep", "atom"])["estimate"],
                                  fit.regressors[:, :, 0].ravel())
    sub = fit.select([1])
    np.testing.assert_array_equal(sub.objective, fit.objective[[1]])
    np.testing.assert_array_equal(sub.regressors, fit.regressors[[1]])
    assert set(sub.history["rep"]) <= {0}


def test_deep_fits_share_the_interface():
    """The cluster MoE and the patch MoE return FitResults: weights as params, a tidy weight table, one glance row
    per replicate (lane), select keeping its replicates' weights and history."""
    from moestat.deep import fit_cluster_moe, fit_pmoe

    tr, _ = ms.simulate_clusters(setting=3, n=200, reps=3, seed=7).split(100)
    cm = fit_cluster_moe(tr, T=5, seed=1, device="cpu")
    assert isinstance(cm, FitResult) and cm.n_reps == 3 and not cm.converged.any() and (cm.n_iter == 5).all()
    assert np.isfinite(cm.objective).all()
    t = cm.tidy()
    assert list(t.columns) == TIDY_COLUMNS
    W = t[t.block == "W"]
    assert len(W) == cm.W.numel() and np.isclose(W["estimate"].sum(), float(cm.W.sum()))
    one = cm.select(2)
    assert torch.equal(one.W, cm.W[2:3]) and one.glance()["objective"].iloc[0] == cm.objective[2]
    data = ms.simulate_patches(60, reps=2, seed=7, n_patches=5, d=6)
    pm = fit_pmoe(data, m=4, epochs=2, batch_size=20, seed=3)
    assert isinstance(pm, FitResult) and pm.n_reps == len(pm.lanes)
    g = pm.glance()
    assert list(g["rep"]) == list(range(pm.n_reps)) and {"data_rep", "n_train", "objective"} <= set(g.columns)
    last = pm.select([pm.n_reps - 1])
    assert last.n_reps == 1 and int(last.lanes["rep"].iloc[0]) == int(pm.lanes["rep"].iloc[-1])
    np.testing.assert_array_equal(last.objective, pm.objective[[-1]])
    assert set(pm.tidy()["block"]) == set(pm.params)


def test_gated_network_is_a_moe():
    """makkuva2020's gated network is a softmax-gated MoE with zero biases: its truth converts to (MoE, Params) and
    its gate probabilities and regression function are the MoE's, checked against the paper's formula in numpy."""
    data = ms.simulate_gated_nn(n=400, reps=2, seed=1, activation="relu", gate="random", gate_norm=2.0)
    t = data.truth
    spec, params = t.to_truth()
    assert spec.gate == "softmax" and spec.expert == "relu" and spec.noise_sd == t.sigma
    assert np.all(params.gate_bias == 0) and np.all(params.expert_bias == 0)
    logits = data.X @ t.gate_weight.T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(t.gate_probs(data.X), p, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(t.mean(data.X), (p * np.maximum(data.X @ t.regressors.T, 0)).sum(-1), rtol=1e-12,
                               atol=1e-14)
    np.testing.assert_allclose(spec.mean(params, data.X[0]), t.mean(data.X[0]), rtol=1e-12, atol=1e-14)
