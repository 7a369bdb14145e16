"""nguyen2024_gaussian_gate (Nguyen, Nguyen, Nguyen & Ho, AISTATS 2024): the four CRPE-GMoE truths, the authors'
near-truth starts, the theory rows, the success criterion and the Study cell."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import moestat as ms
from moestat.fit.gllim import GLLiMParams, fit_gllim, simulate_gllim
from moestat.metrics.gaussian_gate_voronoi import gaussian_gate_voronoi_loss
from moestat.papers import nguyen2024_gaussian_gate as paper
from moestat.rates.theory import THEORY_COLUMNS, register_theory
from moestat.study import StudyFailureError


def test_truths_are_the_settings_of_the_code():
    """The numbers of CRPE-GMoE models.py, typed here from its formulas: slopes covariance / variance, intercepts
    beta - a c_1, the first expert's variance 0.0081759 - 0.017324 a_1 c_1 (Type I) or - 0.017324 a_1 (Type II)."""
    a1, a2 = 0.017324 / 0.042824, -0.0125 / 0.0175
    t1 = paper.gllim_truth(1)
    np.testing.assert_allclose(t1.pi, [0.3, 0.4, 0.3])
    np.testing.assert_allclose(t1.c[:, 0], [-0.1, 0.1, 0.5])
    np.testing.assert_allclose(t1.Gamma[:, 0, 0], [0.042824, 0.0175, 0.01])
    np.testing.assert_allclose(t1.A[:, 0, 0], [a1, a2, 0.0])
    np.testing.assert_allclose(t1.b[:, 0], [0.3 + 0.1 * a1, -0.4 - 0.1 * a2, 0.2])
    np.testing.assert_allclose(t1.nu[:, 0, 0], [0.0081759 + 0.1 * a1 * 0.017324, 0.0175 + 0.0125 * 0.0125 / 0.0175,
                                                0.0175])
    t2 = paper.gllim_truth(2)
    assert t2.c[0, 0] == 0.0 and t2.b[0, 0] == pytest.approx(0.3) and t2.nu[0, 0, 0] == pytest.approx(
        0.0081759 - a1 * 0.017324)
    t3, t4 = paper.gllim_truth(3), paper.gllim_truth(4)
    assert (t3.d, t4.d) == (2, 2) and np.array_equal(t3.c[:, 0], t3.c[:, 1]) and (t4.c[0] == 0).all()
    np.testing.assert_allclose(t3.A[:, 0, 1], t1.A[:, 0, 0])
    np.testing.assert_allclose(t3.Gamma, t1.Gamma[:, 0, 0, None, None] * np.eye(2))
    np.testing.assert_allclose(t3.b, t1.b)
    np.testing.assert_allclose(t4.nu, t2.nu)
    table = paper.settings_table()
    assert len(table) == 12 and set(table["type"]) == {"I", "II"}
    for bad in (0, 5, "1", True):
        with pytest.raises(ValueError, match="valid settings are"):
            paper.gllim_truth(bad)


def test_peer_grid():
    ns = paper.peer_grid()
    assert ns.size == 100 and ns[0] == 100 and ns[-1] == 100_000
    assert (ns == 500).sum() == 2 and np.all(np.diff(ns) >= 0)  # 500 ends the first block and starts the second


def test_near_truth_start():
    truth = paper.gllim_truth(2)
    rng = np.random.default_rng(0)
    for k in (3, 4, 5):
        s = paper.start_pattern(truth, k, rng)
        assert sorted(set(s.tolist())) == [0, 1, 2]  # every true atom is covered
        start = paper.near_truth_start(truth, k, 1000, rng, pattern=s)
        counts = np.bincount(s, minlength=3)
        np.testing.assert_allclose(start.pi, truth.pi[s] / counts[s])
        assert (start.Gamma >= truth.Gamma[s]).all() and (start.nu >= truth.nu[s]).all()  # |noise| is added
    # the noise scale: sd 0.005 n^-0.083 on the means; 2000 draws estimate it within 5% (4 standard errors of an
    # sd estimate are 4 / sqrt(2 * 2000) = 6%)
    n = 4000
    draws = np.array([paper.near_truth_start(truth, 3, n, rng, pattern=[0, 1, 2]).c[:, 0] - truth.c[:, 0]
                      for _ in range(2000)])
    assert draws.std() == pytest.approx(0.005 * n ** -0.083, rel=0.06)
    with pytest.raises(ValueError, match="cannot cover"):
        paper.start_pattern(truth, 2, rng)
    with pytest.raises(ValueError, match="pattern must hold 4"):
        paper.near_truth_start(truth, 4, 100, rng, pattern=[0, 1, 2])


def test_theory_rows():
    register_theory("nguyen2024_gaussian_gate", paper.THEORY)  # validates lengths and the source field
    rows = pd.DataFrame(paper.THEORY, columns=list(THEORY_COLUMNS)).set_index("response")
    expected = {"gg_loss": 0.5, "weight_gap": 0.5, "c_exact": 0.5, "A_exact": 0.5,
                # Type I cells: c, b at 1/(2 rbar), Gamma, nu at 1/rbar, A at 1/4 whatever the cell size
                "c_cell2": 1 / 8, "Gamma_cell2": 1 / 4, "A_cell2": 1 / 4, "b_cell3": 1 / 12, "nu_cell3": 1 / 6,
                "A_cell3": 1 / 4,
                # Type II cells: the slope joins Gamma and nu at 1/rtilde
                "A_zero_cell2": 1 / 4, "A_zero_cell3": 1 / 6, "c_zero_cell3": 1 / 12}
    for response, exponent in expected.items():
        assert rows.loc[response, "exponent"] == pytest.approx(exponent), response
    assert set(rows["rate_model"]) == {"power_log"} and rows.index.is_unique


def test_decide():
    assert paper.decide("power law", 0.4, 0.6) == "agrees"
    assert paper.decide("imprecise", 0.1, 1.2) == "agrees"
    assert paper.decide("power law", 0.55, 0.7) == "faster than theory"
    assert paper.decide("power law", 0.2, 0.45) == "slower than theory"
    assert paper.decide("range too narrow", 0.4, 0.6) == "undecided (range too narrow)"
    assert paper.decide("imprecise", np.nan, np.nan) == "undecided (no interval)"
    assert paper.decide("power law", 0.1, 0.2, theory=0.125) == "agrees"


def _study(tmp_path, fits):
    return ms.Study(name="gg", truth=[{"label": "s2", "data": {"setting": 2}}], fit=fits, n=[300, 600], reps=2,
                    seed=3, cell="moestat.papers.nguyen2024_gaussian_gate:gllim_cell", threads=1, device="cpu")


def test_cell_runs_scores_and_pairs_fits(tmp_path):
    study = _study(tmp_path, [{"label": "K4", "options": {"k": 4}},
                              {"label": "one step", "options": {"k": 4, "steps": 1}}])
    frame = study.run(tmp_path / "s", progress=False)
    assert len(frame) == 8 and (frame["status"] == "ok").all()
    mle, one = (frame[frame["fit"] == f].set_index(["n", "rep"]) for f in ("K4", "one step"))
    # the same data and the same start: the starting log-likelihood is shared
    np.testing.assert_allclose(mle["loglik_start"], one.loc[mle.index, "loglik_start"])
    assert (one["n_iter"] == 1).all() and (one["loglik"] > one["loglik_start"]).all()  # one EM step raises it
    assert (mle["loglik"] >= one.loc[mle.index, "loglik"] - 1e-6).all()  # here the MLE is above one EM step
    # the stored losses are the loss of the stored parameters
    params = study.pieces("params", tmp_path / "s")
    truth = paper.gllim_truth(2)
    for _, row in frame.iterrows():
        p = params[(params["fit"] == row["fit"]) & (params["n"] == row["n"]) & (params["rep"] == row["rep"])]
        blocks = {name: np.array([p[c].iloc[0] for c in p.columns if c.startswith(name + "_")])
                  for name in ("pi", "c", "Gamma", "A", "b", "nu")}
        shapes = {"pi": (4,), "c": (4, 1), "Gamma": (4, 1, 1), "A": (4, 1, 1), "b": (4, 1), "nu": (4, 1, 1)}
        fitted = {name: blocks[name].reshape(shape) for name, shape in shapes.items()}
        assert row["gg_loss"] == pytest.approx(gaussian_gate_voronoi_loss(fitted, truth), rel=1e-10)
        assert row["gg_loss_sum"] == pytest.approx(gaussian_gate_voronoi_loss(fitted, truth, cell_distance="sum"),
                                                   rel=1e-10)
    cells = study.pieces("cells", tmp_path / "s")
    assert len(cells) == 8 * 3 and cells["zero_location"].sum() == 8  # setting 2: the first gate mean is zero


def test_cell_matches_a_direct_fit(tmp_path):
    """The cell's data and starts are child r of its seeds: refitting them directly gives the same fit."""
    study = _study(tmp_path, [{"label": "K4", "options": {"k": 4, "method": "squarem", "max_iter": 200}}])
    frame = study.run(tmp_path / "d", progress=False)
    cell = next(c for c in study.cells if c["n"] == 300)
    data_seed = np.random.SeedSequence(study.seed, spawn_key=cell["data_key"])
    seeds = [np.random.SeedSequence(data_seed.entropy, spawn_key=(*data_seed.spawn_key, r)) for r in range(2)]
    X, Y, _ = simulate_gllim(paper.gllim_truth(2), 300, 2, seed=seeds)
    rngs = [np.random.default_rng(np.random.SeedSequence(data_seed.entropy,
                                                         spawn_key=(*data_seed.spawn_key, paper._STARTS_KEY, r)))
            for r in range(2)]
    starts = GLLiMParams.stack([paper.near_truth_start(paper.gllim_truth(2), 4, 300, g) for g in rngs])
    fit = fit_gllim(X, Y, starts, method="squarem", max_iter=200, tol=1e-9)
    np.testing.assert_allclose(frame.loc[frame["n"] == 300, "loglik"].to_numpy(), fit.loglik, rtol=1e-12)


def test_cell_rejects_bad_options(tmp_path):
    bad = ms.Study(name="gg", truth=[{"label": "s", "data": {"setting": 1, "noise": 2}}],
                   fit=[{"label": "K4", "options": {"k": 4}}], n=[100], reps=1, seed=0,
                   cell=paper.gllim_cell, threads=1, device="cpu")
    with pytest.raises(StudyFailureError, match=r"data knobs \['noise'\] are not read"):
        bad.run(tmp_path / "b", progress=False)
    bad = _study(tmp_path, [{"label": "K4", "options": {"k": 4, "lr": 0.1}}])
    with pytest.raises(StudyFailureError, match=r"options \['lr'\] are not read by gllim_cell"):
        bad.run(tmp_path / "c", progress=False)
    bad = _study(tmp_path, [{"label": "K2", "options": {"k": 2}}])
    with pytest.raises(StudyFailureError, match=r"options\.k must be an integer >= 3"):
        bad.run(tmp_path / "e", progress=False)
