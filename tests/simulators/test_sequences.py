"""Truths indexed by n (local alternatives) and their use in a Study."""

from __future__ import annotations

import numpy as np
import pytest

import moestat as ms
from moestat.cells import build_truth, indexed_by_n
from moestat.exceptions import StudyConfigError
from moestat.simulators import local_alternative


def _theta(p):
    p = p.numpy()
    return np.concatenate([p.gate_weight, p.expert_weight, p.expert_bias[:, None]], axis=1)


@pytest.mark.parametrize("n", [10, 1000, 123_456])
def test_the_moved_atom_sits_c_n_to_the_minus_gamma_from_its_partner(n):
    base = ms.presets.gate_comparison("relu", d=3, k=3, seed=4)
    seq = local_alternative(n, gamma=0.3, separation=2.0, expert="relu", d=3, k=3, seed=4)
    t0, t = _theta(base.params), _theta(seq.params)
    np.testing.assert_allclose(np.linalg.norm(t[2] - t[0]), 2.0 * n ** -0.3, rtol=1e-12)
    # the direction is the base truth's: the moved atom lies on the segment from atom 0 towards its old place
    u_old = (t0[2] - t0[0]) / np.linalg.norm(t0[2] - t0[0])
    np.testing.assert_allclose((t[2] - t[0]) / np.linalg.norm(t[2] - t[0]), u_old, rtol=1e-12)
    np.testing.assert_array_equal(t[:2], t0[:2])  # the other atoms and every gate intercept are the base truth's
    np.testing.assert_array_equal(seq.params.numpy().gate_bias, base.params.numpy().gate_bias)
    assert seq.info["separation_n"] == pytest.approx(2.0 * n ** -0.3, rel=1e-12) and seq.info["n"] == n


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="gamma must be a positive"):
        local_alternative(100, gamma=0.0)
    with pytest.raises(ValueError, match="atom and moved must differ"):
        local_alternative(100, atom=2, moved=2)
    with pytest.raises(ValueError, match="base='local_alternative' is not a fixed preset"):
        local_alternative(100, base="local_alternative")
    with pytest.raises(ValueError, match="moved must be an atom index"):
        local_alternative(100, moved=7)


def test_a_study_builds_one_truth_per_n_and_records_the_knobs():
    assert indexed_by_n("local_alternative") and not indexed_by_n("gate_comparison")
    cfg = {"preset": "local_alternative", "gamma": 0.5, "expert": "relu", "d": 2, "k": 3, "seed": 0}
    with pytest.raises(ValueError, match="indexed by n"):
        build_truth(cfg)
    a, b = build_truth(cfg, n=100), build_truth(cfg, n=10_000)
    assert not np.allclose(_theta(a.params), _theta(b.params))
    study = ms.Study(truth={**cfg, "label": "local"}, fit={}, n=[100, 10_000], reps=2, metrics=["l2"], seed=1)
    frame = study.run(progress=False)
    assert set(frame["truth_gamma"]) == {0.5} and "truth_n" not in frame.columns
    assert list(frame["n"].unique()) == [100, 10_000]
    with pytest.raises(StudyConfigError, match="unknown key 'n'"):
        ms.Study(truth={**cfg, "n": 5}, fit={}, n=[100], reps=1)
