"""Studies whose cells bring their own data and fits (custom cells with ``data`` truths) and side tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moestat import Study
from moestat.exceptions import StudyConfigError

from .study_cells import LINEAR_TRUTH, mean_estimate_cell

CELL = "tests.study_cells:mean_estimate_cell"


def _study(**kw):
    cfg = dict(truth={"label": "normal", "data": {"mu": 0.0}, "grid": {"data.mu": [0.0, 2.0]}},
               fit=[{"label": "mean"}, {"label": "shrunk", "options": {"shrink": 0.5}}],
               n=[10, 40], reps=3, seed=4, cell=CELL, name="means")
    cfg.update(kw)
    return Study(**cfg)


def test_data_truths_expand_their_grid_and_reach_the_cell_with_the_fit_options():
    study = _study()
    assert [t["label"] for t in study.truths] == ["normal-mu=0.0", "normal-mu=2.0"]
    frame = study.run(progress=False)
    assert len(frame) == 2 * 2 * 2 * 3
    assert set(frame["truth_preset"]) == {"data"} and set(frame["truth_mu"]) == {0.0, 2.0}
    assert set(frame["estimator"]) == {"mean_estimate_cell"} and set(frame["shrink"].dropna()) == {0.5}
    # the estimate is the mean of the cell's draws: error = shrink * mean - mu, so with shrink 1/2 at mu = 2 the
    # error centres on -1 (10-40 draws: SE of the mean <= 1/sqrt(10) ~ 0.32, so 1.0 away is > 3 SE)
    shrunk = frame[(frame["fit"] == "shrunk") & (frame["truth_mu"] == 2.0)]["error"]
    assert np.all(np.abs(shrunk + 1.0) < 1.0)
    assert {"gate", "expert", "k"}.isdisjoint(frame.columns)  # no MoE was fitted


def test_fits_of_one_data_truth_see_the_same_draws():
    frame = _study().run(progress=False)
    mean = frame[frame["fit"] == "mean"].set_index(["truth", "n", "rep"])["estimate"]
    shrunk = frame[frame["fit"] == "shrunk"].set_index(["truth", "n", "rep"])["estimate"]
    np.testing.assert_allclose(shrunk, 0.5 * mean.loc[shrunk.index], rtol=1e-15)


def test_pieces_are_stored_with_their_cell_and_read_back_after_resume(tmp_path):
    study = _study()
    first = study.run(tmp_path, progress=False)
    history = study.pieces("history")
    assert len(history) == sum(n * 3 for n in (10, 40)) * 4
    assert list(history.columns[:5]) == ["study", "cell", "truth", "fit", "n"]
    stored = study.pieces("history", checkpoint=tmp_path)
    pd.testing.assert_frame_equal(stored, history)
    # the last running mean of each replicate is the estimate of the unshrunk fit
    last = history[history["step"] == history["n"] - 1]
    got = last[last["fit"] == "mean"].set_index(["truth", "n", "rep"])["running_mean"].sort_index()
    want = first[first["fit"] == "mean"].set_index(["truth", "n", "rep"])["estimate"].sort_index()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    again = _study()
    pd.testing.assert_frame_equal(again.run(tmp_path, progress=False), first)
    with pytest.raises(KeyError, match=r"no piece named 'history'"):
        again.pieces("history")  # every cell was resumed: nothing computed in memory
    pd.testing.assert_frame_equal(again.pieces("history", checkpoint=tmp_path), history)


def test_process_workers_return_the_same_frame_and_pieces(tmp_path):
    serial = _study()
    a = serial.run(progress=False)
    parallel = _study()
    b = parallel.run(tmp_path, executor="processes", workers=2, progress=False)
    pd.testing.assert_frame_equal(a.drop(columns="wall_time"), b.drop(columns="wall_time"))
    pd.testing.assert_frame_equal(serial.pieces("history"), parallel.pieces("history", checkpoint=tmp_path))


def test_data_truths_need_a_custom_cell_and_a_table():
    with pytest.raises(StudyConfigError, match=r"study.truth\[0\].data is read by a custom cell only"):
        Study(truth={"data": {"mu": 1.0}}, n=[10], reps=1)
    with pytest.raises(StudyConfigError, match="must be a table"):
        Study(truth={"data": 3.0}, n=[10], reps=1, cell=CELL)
    with pytest.raises(StudyConfigError, match="unknown key"):
        Study(truth={"data": {"mu": 1.0}, "expert": "relu"}, n=[10], reps=1, cell=CELL)
    with pytest.raises(StudyConfigError, match=r"unknown key 'gate\.x'"):
        Study(truth={"data": {"mu": 1.0}, "grid": {"gate.x": [1]}}, n=[10], reps=1, cell=CELL)


def test_a_model_truth_with_a_custom_cell_keeps_its_columns():
    from .study_cells import normal_equations_cell

    frame = Study(truth=LINEAR_TRUTH, n=[30], reps=2, seed=1, cell=normal_equations_cell).run(progress=False)
    assert {"truth_gate", "gate", "expert", "k"} <= set(frame.columns)
    assert mean_estimate_cell.__name__ == "mean_estimate_cell"
