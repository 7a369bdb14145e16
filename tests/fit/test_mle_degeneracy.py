"""Degenerate maximum-likelihood fits are detected and named at fit time, and select_k / the LRT say so."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import moestat as ms


def _point_mass_data(n: int = 400, seed: int = 0):
    """35% of the responses exactly 0 (a point mass, as in health-care use data), the rest a linear expert."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, n)
    y = np.where(rng.uniform(size=n) < 0.35, 0.0, 2 + x + 0.5 * rng.normal(size=n))
    return x[:, None], y


def _switch_data(n: int = 400, seed: int = 0):
    """Two experts split exactly at x = 0 with far-apart lines: the responsibilities separate, the gate is a step."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, n)
    return x[:, None], np.where(x > 0, 2 + x, -2 - x) + 0.05 * rng.normal(size=n)


def test_an_expert_collapsing_onto_tied_responses_is_named():
    X, y = _point_mass_data()
    with pytest.warns(ms.DegenerateFitWarning, match="tied responses .*y = 0"):
        fit = ms.fit_mle(ms.MoE(k=2, d=1), X, y, seed=1)
    found = fit.degeneracy()
    assert "tied_responses" in set(found["kind"])
    assert {"sigma_at_floor", "collapsed_variance"} & set(found["kind"])


def test_a_separating_gate_direction_is_named():
    X, y = _switch_data()
    with pytest.warns(ms.DegenerateFitWarning, match="separating gate"):
        fit = ms.fit_mle(ms.MoE(k=2, d=1), X, y, seed=1)
    row = fit.degeneracy().iloc[0]
    assert row["kind"] == "separating_gate" and "x1" in row["detail"]


def test_a_healthy_fit_is_silent():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 500)
    first = rng.uniform(size=500) < 1 / (1 + np.exp(-2 * x))
    y = np.where(first, 1 + 2 * x, -1 - x) + 0.3 * rng.normal(size=500)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ms.DegenerateFitWarning)
        fit = ms.fit_mle(ms.MoE(k=2, d=1), x[:, None], y, seed=0)
    assert fit.degeneracy().empty


def test_a_vanishing_component_is_named():
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, 400)
    y = 1 + 2 * x + 0.3 * rng.normal(size=400)
    # one expert far from every response: no observation is ever responsible to it, its gate weight goes to zero
    start = ms.Params([0.0, 0.0], [[0.0], [0.0]], [[2.0], [0.0]], [1.0, 100.0], noise_sd=[0.3, 0.3])
    with pytest.warns(ms.DegenerateFitWarning, match="vanishing component"):
        fit = ms.fit_mle(ms.MoE(k=2, d=1), x[:, None], y, init=start, restarts=0)
    assert fit.degeneracy().set_index("expert").loc[1, "kind"] == "vanishing_component"


def test_select_k_skips_spurious_fits_and_says_which():
    X, y = _point_mass_data(seed=2)
    with pytest.warns(ms.DegenerateFitWarning, match="skipped degenerate"):
        sel = ms.select_k(X, y, ks=(1, 2), seed=0)
    row = sel.table.set_index("k")
    assert "tied_responses" in row.loc[2, "degenerate"] and row.loc[1, "degenerate"] == ""
    assert sel.best_k == 1  # the k = 2 fit has the lower BIC, but only by chasing the point mass


def test_select_k_marks_but_keeps_a_step_gate():
    X, y = _switch_data(seed=6)
    with pytest.warns(ms.DegenerateFitWarning, match=r"kept fit\(s\) marked degenerate .*k=2 \(separating_gate\)"):
        sel = ms.select_k(X, y, ks=(1, 2), seed=0)
    assert sel.best_k == 2 and "separating_gate" in sel.table.set_index("k").loc[2, "degenerate"]


def test_the_lrt_warns_when_a_fit_to_the_data_is_degenerate():
    X, y = _point_mass_data(seed=4)
    with pytest.warns(ms.DegenerateFitWarning, match="k=2 fit to the data is degenerate"):
        ms.test_n_experts(X, y, k0=1, k1=2, n_resamples=3, seed=0)


def test_degenerate_bootstrap_refits_are_counted_in_one_warning():
    X, y = _point_mass_data(seed=8)
    with pytest.warns(ms.DegenerateFitWarning):
        fit = ms.fit_mle(ms.MoE(k=2, d=1), X, y, seed=1)
    with pytest.warns(ms.DegenerateFitWarning, match=r"of 6 bootstrap refits degenerated \(.*tied responses"):
        ms.bootstrap(fit, n_resamples=6, kind="nonparametric", seed=0)


def _separated_subgroup_data(seed: int = 1):
    """A logistic majority on x ~ N(0, 1) and a near-empty subgroup (20 of 420 rows) at x in [3, 4] whose 0/1
    responses are separated at x = 3.5: the expert that takes the subgroup has an infinite MLE slope."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=400)
    y = (rng.uniform(size=400) < 1 / (1 + np.exp(-x))).astype(float)
    xs = rng.uniform(3, 4, 20)
    return np.r_[x, xs][:, None], np.r_[y, (xs > 3.5).astype(float)]


def test_a_glm_expert_on_separated_data_is_named_diverging():
    # k = 1: complete separation, the classic infinite logistic MLE (Albert & Anderson 1984)
    x = np.random.default_rng(0).uniform(-1, 1, 100)
    with pytest.warns(ms.DegenerateFitWarning, match="diverging expert"):
        fit = ms.fit_mle(ms.MoE(k=1, d=1, response="binomial"), x[:, None], (x > 0).astype(float), seed=0)
    row = fit.degeneracy().iloc[0]
    assert row["kind"] == "diverging_expert" and "x1" in row["detail"]
    # independent check of the criterion: the fitted slope times sd(x) is far beyond 20 logits
    assert abs(fit.theta[1]) * x.std() > ms.fit.results.DIVERGING_LINPRED


def test_a_glm_expert_running_off_in_a_near_empty_subgroup_is_named():
    X, y = _separated_subgroup_data()
    with pytest.warns(ms.DegenerateFitWarning, match="diverging expert"):
        fit = ms.fit_mle(ms.MoE(k=2, d=1, response="binomial"), X, y, seed=0)
    found = fit.degeneracy()
    assert list(found["kind"]) == ["diverging_expert"]
    j = int(found["expert"].iloc[0])
    slope = fit.params.expert_weight[j, 0]
    assert abs(slope) * X[:, 0].std() > 20  # the flagged expert is the steep one


def test_a_healthy_binomial_fit_is_silent():
    rng = np.random.default_rng(4)
    x = rng.uniform(-2, 2, 600)
    first = rng.uniform(size=600) < 1 / (1 + np.exp(-2 * x))
    p = np.where(first, 1 / (1 + np.exp(-(1 + x))), 1 / (1 + np.exp(-(-1 - 0.5 * x))))
    y = (rng.uniform(size=600) < p).astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ms.DegenerateFitWarning)
        fit = ms.fit_mle(ms.MoE(k=1, d=1, response="binomial"), x[:, None], y, seed=0)
    assert fit.degeneracy().empty


def test_a_narrow_expert_beside_a_wide_one_is_not_a_collapsed_variance():
    """Two genuine experts, sd 0.3 and 10 (ratio 0.03 < COLLAPSE_RATIO), each holding about half of n = 1,000:
    Hathaway's ratio alone called the narrow one collapsed; with the posterior-mass condition neither is flagged,
    while a spurious k = 3 component on a handful of points still is (the probe in the `collapsed` docstring)."""
    import moestat as ms

    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1, noise_sd=1.0)
    truth = ms.Params(np.zeros(2), np.zeros((2, 1)), np.array([[1.0], [0.0]]), np.array([0.0, 0.0]),
                      noise_sd=np.array([0.3, 10.0]))
    data = ms.simulate(spec, truth, n=1000, reps=1, seed=3, model="mixture")
    fit = ms.fit_mle(ms.MoE(gate="softmax", expert="linear", k=2, d=1), data.X[0], data.y[0], restarts=5, seed=1,
                     progress=False)
    comp = fit.components()
    assert comp["sigma"].min() / comp["sigma"].max() < 0.05  # the ratio rule alone would fire
    assert not comp["collapsed"].any()
    assert "collapsed_variance" not in set(fit.degeneracy()["kind"])


def test_component_table_matches_the_fit_s_own_properties():
    """components() against its definitions, computed here from public attributes: the case-weighted mean of the
    gate probabilities, sigma, the floor and collapse flags, and the small-weight flag; for two replicates at once."""
    from moestat.fit.results import SMALL_WEIGHT

    X, y = _point_mass_data()
    Xr, yr = np.stack([X, X[::-1]]), np.stack([y, y[::-1] + 0.1])
    c = np.random.default_rng(2).integers(1, 4, size=(2, len(y))).astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_mle(ms.MoE(k=3, d=1), Xr, yr, weights=c, seed=1, restarts=2, progress=False)
    comp = fit.components()
    weight = (np.asarray(fit.gate_probs_train()) * c[..., None]).sum(1) / c.sum(1, keepdims=True)
    np.testing.assert_allclose(comp["mean_weight"], weight.ravel(), rtol=1e-12)
    np.testing.assert_allclose(comp["sigma"], np.asarray(fit.params.noise_sd).ravel(), rtol=1e-12)
    np.testing.assert_array_equal(comp["sigma_at_floor"], np.asarray(fit.at_floor).ravel())
    np.testing.assert_array_equal(comp["collapsed"], np.asarray(fit.collapsed).ravel())
    np.testing.assert_array_equal(comp["small"], weight.ravel() < SMALL_WEIGHT)
    assert comp[["rep", "expert"]].values.tolist() == [[r, i] for r in range(2) for i in range(3)]
    assert comp["collapsed"].any()  # the point mass: at least one flag is exercised
