"""nguyen2024_topk (top-K sparse softmax gating, ICLR 2024): theory rows, truths, the Hellinger distance against
closed forms and quadrature, the study metrics on hand-built contexts, the decision rule."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import integrate, stats

import moestat as ms
from moestat.cells import Estimate
from moestat.metrics.topk_voronoi import region_inputs
from moestat.papers import nguyen2024_topk as paper
from moestat.rates.theory import THEORY_COLUMNS


def test_theory_rows():
    tab = pd.DataFrame(paper.THEORY, columns=list(THEORY_COLUMNS))
    assert set(tab["source"]) == {"nguyen2024_topk"} and set(tab["gate"]) == {"topk"}
    assert set(tab["regime"]) == {"exact", "over"}
    exact, over = tab[tab["regime"] == "exact"], tab[tab["regime"] == "over"]
    # k = k*: everything parametric (the abstract)
    assert (exact["exponent"] == 0.5).all() and exact["note"].str.startswith("read").all()
    # k > k*: density parametric (read); split-cell exponents 1/(2 rbar(2)) and 1/rbar(2) with rbar(2) = 4 (derived)
    by = over.set_index("response")["exponent"]
    assert by["hellinger"] == 0.5 and by["topk_voronoi"] == 0.5
    assert by["err_beta1_cell2"] == by["err_b_cell2"] == pytest.approx(1 / 8)
    assert by["err_a_cell2"] == by["err_nu_cell2"] == pytest.approx(1 / 4)
    assert over.loc[over["response"].str.endswith("cell2"), "note"].str.startswith("derived").all()
    # every row's response is a column the study metrics write
    ctx = _ctx(paper.topk_truth("chain"), _split_truth())
    written = {**paper.topk_metric(ctx), "hellinger": paper.hellinger_metric(ctx)}
    assert set(tab["response"]) <= set(written)


def _split_truth():
    """The chain truth with expert 2 as two identical half-weight copies (k = 4)."""
    p = paper.PARAMS
    order = [0, 1, 2, 1]
    b0 = np.asarray(p["gate_bias"], float)[order]
    b0[[1, 3]] -= np.log(2.0)
    return ms.Params(b0, np.asarray(p["gate_weight"], float)[order], np.asarray(p["expert_weight"], float)[order],
                     np.asarray(p["expert_bias"], float)[order], noise_sd=np.asarray(p["noise_sd"], float)[order])


def _ctx(truth, fitted, fit_top_k=3, n=300, seed=0):
    data = ms.simulate(truth.spec, truth.params, n=n, reps=1, seed=seed, model="mixture", low=0.0, high=1.0)
    fit_spec = ms.MoE(gate="topk", top_k=fit_top_k, expert="linear", k=fitted.k, d=1)
    est = Estimate(fitted.batched(), np.zeros(1), np.ones(1, bool))
    return SimpleNamespace(fit=est, fit_spec=fit_spec, truth_spec=truth.spec, truth=truth.params, data=data)


def test_truths():
    chain = paper.topk_truth("chain")
    assert chain.spec.gate == "topk" and chain.spec.top_k == 2 and chain.spec.k == 3
    assert chain.info["regions"] == {"0-1": pytest.approx(0.5, abs=1e-3), "1-2": pytest.approx(0.5, abs=1e-3)}
    lam = paper.topk_truth("lambda")
    assert lam.spec.top_k == 1 and lam.info["regions"]["1"] == pytest.approx(0.32, abs=1e-3)

    def jump(name):
        """|E[y | x = 1/2 + e] - E[y | x = 1/2 - e]| for a small e."""
        t = paper.topk_truth(name)
        X = np.array([[0.5 - 1e-6], [0.5 + 1e-6]])
        m = t.spec.mean(t.params, X)
        return abs(m[1] - m[0])

    # chain: experts 1 and 3 meet at x = 1/2 (4 - 2x = 1 + 4x = 3), so the mean does not jump there; chain_jump:
    # the weight 0.27 moves from 3 to -3.5, a jump of 0.27 * 6.5
    assert jump("chain") < 1e-4
    assert jump("chain_jump") == pytest.approx(6.5 / (1 + np.e), rel=1e-3)
    with pytest.raises(ValueError, match="name"):
        paper.topk_truth("nope")


def _top1(b0, b1, a, b, sd):
    return ms.Params(np.asarray(b0, float), np.asarray(b1, float)[:, None], np.asarray(a, float)[:, None],
                     np.asarray(b, float), noise_sd=np.asarray(sd, float))


def test_hellinger_closed_form_for_top1_models():
    """Under a top-1 gate each conditional density is one Gaussian, whose Hellinger distance has a closed form:
    h^2 = 1 - sqrt(2 s1 s2 / (s1^2 + s2^2)) exp(-(m1 - m2)^2 / (4 (s1^2 + s2^2)))."""
    spec = ms.MoE(gate="topk", top_k=1, expert="linear", k=2, d=1)
    p = _top1([-8.0, 0.0], [25.0, 0.0], [-20.0, 20.0], [15.0, -5.0], [0.3, 0.4])
    q = _top1([-7.0, 0.0], [25.0, 0.0], [-19.5, 20.2], [14.8, -5.1], [0.35, 0.38])
    X = region_inputs(size=500)
    x = X[:, 0]
    sel_p, sel_q = (-8 + 25 * x > 0), (-7 + 25 * x > 0)
    m1, s1 = np.where(sel_p, 15 - 20 * x, -5 + 20 * x), np.where(sel_p, 0.3, 0.4)
    m2, s2 = np.where(sel_q, 14.8 - 19.5 * x, -5.1 + 20.2 * x), np.where(sel_q, 0.35, 0.38)
    h2 = 1 - np.sqrt(2 * s1 * s2 / (s1**2 + s2**2)) * np.exp(-((m1 - m2) ** 2) / (4 * (s1**2 + s2**2)))
    got = paper.expected_hellinger(spec, p, spec, q, X)[0]
    # trapezoid with 12 points per sd on +-9 sd: error far below 1e-6 of h ~ 0.1-0.3
    assert got == pytest.approx(np.mean(np.sqrt(h2)), rel=1e-6)
    assert paper.expected_hellinger(spec, p, spec, p, X)[0] == pytest.approx(0.0, abs=1e-7)


def test_hellinger_of_mixtures_against_quad():
    """A top-2 three-expert mixture at two inputs against scipy's adaptive quadrature of sqrt(p q)."""
    truth = paper.topk_truth("chain")
    other = ms.Params(np.array([1.2, 0.1, -3.0]), np.array([[-4.5], [0.2], [4.0]]), np.array([[-2.2], [2.1], [3.7]]),
                      np.array([4.1, -0.9, 1.1]), noise_sd=np.array([0.33, 0.42, 0.25]))
    X = np.array([[0.2], [0.8]])
    got = paper.expected_hellinger(truth.spec, other, truth.spec, truth.params, X)[0]
    w_p, w_q = truth.spec.gate_weights(other, X), truth.spec.gate_weights(truth.params, X)
    mu_p, mu_q = truth.spec.expert_means(other, X), truth.spec.expert_means(truth.params, X)
    def dens(y, w, mu, sd):
        return float(np.sum(w * stats.norm.pdf(y, mu, sd)))

    def h_at(t):
        bc = integrate.quad(lambda y: np.sqrt(dens(y, w_p[t], mu_p[t], other.noise_sd)
                                              * dens(y, w_q[t], mu_q[t], truth.params.noise_sd)),
                            -10, 15, limit=400, epsabs=1e-12)[0]
        return np.sqrt(max(1 - bc, 0.0))

    hs = [h_at(0), h_at(1)]
    # both are accurate to ~1e-9 in h^2; 1e-6 relative on h leaves room for the square root near small h
    assert got == pytest.approx(np.mean(hs), rel=1e-6)


def test_study_metrics_on_hand_built_contexts():
    chain = paper.topk_truth("chain")
    # the fit equal to the truth (k = k*): zero loss, zero errors, exact routing, no likelihood gap
    out = paper.topk_metric(_ctx(chain, chain.params, fit_top_k=2))
    assert out["topk_voronoi"][0] == pytest.approx(0.0, abs=1e-14) and out["cell_sizes"][0] == "1-1-1"
    assert out["selection_match"][0] == 1.0 and out["loglik_gap"][0] == pytest.approx(0.0, abs=1e-9)
    assert out["min_selected_share"][0] == pytest.approx(0.5, abs=1e-3) and np.isnan(out["err_b_cell2"][0])
    # the admissible split (k = 4, Kbar = 3) is the same density: zero loss, likelihood and Hellinger distance equal
    ctx = _ctx(chain, _split_truth())
    out = paper.topk_metric(ctx)
    assert out["topk_voronoi"][0] == pytest.approx(0.0, abs=1e-13) and out["cell_sizes"][0] == "1-2-1"
    assert out["loglik_gap"][0] == pytest.approx(0.0, abs=1e-8) and out["selection_match"][0] == 1.0
    assert paper.hellinger_metric(ctx)[0] == pytest.approx(0.0, abs=1e-7)
    # the same split selected by Kbar = 2: one copy is dropped everywhere -> a worse likelihood, a positive distance
    ctx2 = _ctx(chain, _split_truth(), fit_top_k=2)
    out2 = paper.topk_metric(ctx2)
    assert out2["selection_match"][0] == 0.0 and out2["loglik_gap"][0] < -10
    assert paper.hellinger_metric(ctx2)[0] > 0.05


def _row(**kw):
    base = {"model": "power_log", "verdict": "power law", "ci_low": 0.4, "ci_high": 0.6, "theory_exponent": 0.5}
    return pd.Series({**base, **kw})


def test_decision_rule():
    assert paper.decide(_row()) == "agrees"
    assert paper.decide(_row(ci_low=0.55, ci_high=0.8)) == "faster than the bound (consistent)"
    assert paper.decide(_row(ci_low=0.1, ci_high=0.3)) == "slower than the bound (contradicts)"
    assert paper.decide(_row(verdict="no decay")) == "undecided (no decay)"
    assert paper.decide(_row(theory_exponent=np.nan)) == ""
    assert paper.decide(_row(model="power")) == ""
