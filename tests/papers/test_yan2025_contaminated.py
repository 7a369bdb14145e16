"""yan2025_contaminated: the theory rows, the exponents they carry, the truths indexed by n, the information's
predictions and the study cell."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import moestat as ms
from moestat.contaminated import fisher_information
from moestat.papers import yan2025_contaminated as paper
from moestat.rates import theory
from moestat.rates.theory import THEORY_COLUMNS, register_theory


def test_theory_rows_are_well_formed_and_match_predicted_exponent(monkeypatch):
    assert all(len(row) == len(THEORY_COLUMNS) for row in paper.THEORY)
    monkeypatch.setattr(theory, "_ROWS", dict(theory._ROWS))  # register into a copy: other tests see the original
    register_theory("yan2025_contaminated", paper.THEORY)  # accepted by the registry (same source, right length)
    table = theory.theory_rates()
    assert (table["source"] == "yan2025_contaminated").sum() == len(paper.THEORY)
    assert theory.predicted_rate("constant", "linear", "lam_err", regime="merging") == \
        "n^{-1/2} / ||Delta*||^2 = n^{-(1/2 - 2 kappa)}"
    rows = [dict(zip(THEORY_COLUMNS, row, strict=True)) for row in paper.THEORY]
    assert {r["gate"] for r in rows} == {"constant", "softmax"}
    assert {r["kind"] for r in rows} <= {"derived", "upper_bound"}
    kw = {"lambda_fixed": {"gamma": 0.0, "kappa": 0.0, "distinguishable": True},
          "lambda_vanishing": {"gamma": paper.GAMMA, "kappa": 0.0, "distinguishable": True}}
    for r in rows:
        regime = r["regime"].split("|")[-1]
        if regime == "merging":
            args = {"gamma": 0.0, "kappa": paper.KAPPA if r["gate"] == "constant" else paper.KAPPA_SOFTMAX,
                    "distinguishable": False}
        else:
            args = kw[regime]
        assert r["exponent"] == pytest.approx(paper.predicted_exponent(r["response"], gate=r["gate"], **args)), r
        assert r["response"] in paper.RESPONSES and r["direction"] == "decay" and r["rate_model"] == "power"


def test_predicted_exponent_by_hand():
    pe = paper.predicted_exponent
    assert pe("lam_err") == 0.5 and pe("prompt_err", gamma=0.25) == 0.25
    assert pe("lam_err", distinguishable=False, kappa=0.1) == pytest.approx(0.3)
    assert pe("prompt_err", distinguishable=False, kappa=0.1, gamma=0.05) == pytest.approx(0.35)
    assert pe("loss_nondist", distinguishable=False, kappa=0.2) == 0.5 and np.isnan(pe("loss_nondist"))
    assert pe("gate_err", gate="softmax", distinguishable=False, kappa=0.2) == pytest.approx(0.3)
    assert pe("prompt_err", gate="softmax", distinguishable=False, kappa=0.2) == 0.5
    assert np.isnan(pe("gate_err")) and np.isnan(pe("lam_err", gate="softmax"))
    with pytest.raises(ValueError, match="response='l2'"):
        pe("l2")
    with pytest.raises(ValueError, match="kappa must be"):
        pe("lam_err", kappa=-1.0)


def test_settings_are_truths_indexed_by_n():
    a, b = paper.setting_truth("dist_vanishing", 1000), paper.setting_truth("dist_vanishing", 16000)
    assert a.info["lam_n"] == pytest.approx(0.3) and b.info["lam_n"] == pytest.approx(0.15)  # 0.3 * 16^-1/4
    m1, m2 = paper.setting_truth("nondist_merging", 1000), paper.setting_truth("nondist_merging", 64000)
    assert m1.info["delta_n"] == pytest.approx(0.4) and m2.info["delta_n"] == pytest.approx(0.2)  # 0.4 * 64^-1/6
    assert np.allclose(m2.params.theta()[0], [1.2, 0.0, 0.25]) and not m1.info["distinguishable"]
    s = paper.setting_truth("softmax_nondist_merging", 1000)
    assert s.info["delta_n"] == pytest.approx(0.8) and s.model.gate == "softmax"
    d = paper.setting_truth("dist_fixed", 50)
    assert d.info["distinguishable"] and d.model.frozen.gaussian is None and d.params.lam[0] == 0.3
    assert paper.setting_truth("dist_fixed", 50, lam=0.2).params.lam[0] == 0.2  # overrides
    with pytest.raises(ValueError, match="setting='x'"):
        paper.setting_truth("x", 10)


def test_information_predictions_reach_the_theory_limit_as_the_distance_shrinks():
    """On the vignette's grid the information predicts exponents between the theory's limit and 1/2; with the same
    rates but 20 times smaller distances the limit is reached (within 0.05: the next terms of the expansion)."""
    ns = [1000, 31623]
    fixed = paper.design_exponents("dist_fixed", ns)
    assert np.allclose(fixed["exponent"], 0.5)  # a fixed truth: the information does not change with n
    grid = paper.design_exponents("nondist_merging", ns).set_index("response")["exponent"]
    assert 1 / 6 < grid["lam_err"] < 0.5 and 1 / 3 < grid["prompt_err"] < 0.5
    small = paper.design_exponents("nondist_merging", ns, separation=0.02 * 1000 ** paper.KAPPA)
    small = small.set_index("response")["exponent"]
    assert small["lam_err"] == pytest.approx(1 / 6, abs=0.05)
    assert small["prompt_err"] == pytest.approx(1 / 3, abs=0.05)
    assert small["loss_nondist"] == pytest.approx(0.5, abs=0.05)
    soft = paper.design_exponents("softmax_nondist_merging", ns, separation=0.02 * 1000 ** paper.KAPPA_SOFTMAX)
    soft = soft.set_index("response")["exponent"]
    assert soft["gate_err"] == pytest.approx(0.25, abs=0.05) and soft["prompt_err"] == pytest.approx(0.5, abs=0.05)


def test_predicted_sizes_combine_the_inverse_information_by_hand():
    truth = paper.setting_truth("nondist_merging", 1000)
    info = fisher_information(truth.model, truth.params, low=-2.0, high=2.0, n_y=2001)
    cov = np.linalg.inv(info) / 1000
    got = paper.predicted_sizes(truth, 1000, info)
    assert got["lam_err"] == pytest.approx(np.sqrt(cov[0, 0]))
    assert got["prompt_err"] == pytest.approx(np.sqrt(cov[1, 1] + cov[2, 2] + cov[3, 3]))
    assert got["loss_nondist"] == pytest.approx(got["lam_err"] * 0.4 ** 2 + 0.5 * 0.4 * got["prompt_err"])


def _ctx(setting, n=400, reps=3, **options):
    return SimpleNamespace(truth_cfg={"label": setting, "data": {"setting": setting}},
                           fit_cfg={"label": "mle", "options": options}, n=n, reps=reps,
                           data_seed=np.random.SeedSequence(1), fit_seed=np.random.SeedSequence(2))


def test_cell_scores_the_fits_against_the_truth_of_its_n():
    frame = paper.contaminated_cell(_ctx("nondist_merging", init=["near_truth", "ols"]))
    assert list(frame["rep"]) == [0, 1, 2]
    truth = paper.setting_truth("nondist_merging", 400)
    assert np.allclose(frame["delta_n"], truth.info["delta_n"]) and np.allclose(frame["lam_n"], 0.5)
    # errors recomputed from the reported estimates (an independent path through the columns)
    lam_err = np.abs(frame["est_gate_lam"] - 0.5)
    assert np.allclose(frame["lam_err"], lam_err)
    theta = frame[["est_prompt_x1", "est_prompt_const", "est_prompt_var"]].to_numpy()
    assert np.allclose(frame["prompt_err"], np.linalg.norm(theta - truth.params.theta(), axis=1))
    assert frame["gate_err"].isna().all() and frame["loss_nondist"].notna().all()
    assert frame["converged"].all() and (frame["loglik_gap"] > -1e-6).all()  # near-truth start: at least the truth
    soft = paper.contaminated_cell(_ctx("softmax_dist", reps=2))
    assert soft["lam_err"].isna().all() and soft["gate_err"].notna().all() and soft["loss_nondist"].isna().all()
    with pytest.raises(ValueError, match="not used by contaminated_cell"):
        paper.contaminated_cell(_ctx("dist_fixed", lr=0.1))
    with pytest.raises(ValueError, match="needs 'setting'"):
        paper.contaminated_cell(SimpleNamespace(truth_cfg={"label": "x", "data": {}}, fit_cfg={}, n=10, reps=1))


def test_cell_runs_inside_a_study_with_common_data_per_truth():
    study = ms.Study(name="yan-small", truth=[{"label": s, "data": {"setting": s}} for s in ("dist_fixed",
                                                                                                "softmax_dist")],
                     fit=[{"label": "newton", "options": {"method": "newton"}},
                          {"label": "em", "options": {"method": "em", "init": ["near_truth"]}}],
                     n=[300, 600], reps=2, seed=3, cell="moestat.papers.yan2025_contaminated:contaminated_cell")
    frame = study.run()
    assert len(frame) == 2 * 2 * 2 * 2 and set(frame["status"]) == {"ok"}
    # both estimators of a truth see the same data: EM and Newton reach the same maximum
    wide = frame.pivot_table(index=["truth", "n", "rep"], columns="fit", values="loglik")
    assert np.allclose(wide["em"], wide["newton"], atol=1e-5)
    assert isinstance(frame, pd.DataFrame) and frame["prompt_err"].notna().all()
