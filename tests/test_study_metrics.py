"""Metric adapters of the study runner: the exact split family of regime-2 limits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat._cells import split_family


@settings(max_examples=20, deadline=None)
@given(expert=st.sampled_from(["relu", "linear"]), atom=st.integers(0, 7), seed=st.integers(0, 10_000))
def test_split_family_reproduces_the_regression_function(expert, atom, seed):
    """f at every member of the split family equals f at the truth (positive homogeneity), to rounding."""
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert=expert, d=6, seed=seed)
    family = split_family(truth, [atom], np.linspace(0, 1, 7))
    X = np.random.default_rng(seed).uniform(-1, 1, size=(300, 6))
    f_true = spec.mean(truth, X)
    f_family = spec.with_k(9).mean(family, X)
    np.testing.assert_allclose(f_family, np.broadcast_to(f_true, f_family.shape), atol=1e-13)


def test_split_family_is_not_exact_for_gelu():
    """gelu is not homogeneous: splitting its expert changes f (the regime-2 limit is genuinely misspecified)."""
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="gelu", d=6, seed=1)
    family = split_family(truth, [0], [0.5])
    X = np.random.default_rng(0).uniform(-1, 1, size=(300, 6))
    gap = np.abs(spec.with_k(9).mean(family, X)[0] - spec.mean(truth, X)).max()
    assert gap > 1e-3


def test_split_family_errors():
    _, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", d=3, seed=0)
    with pytest.raises(ValueError, match="one duplicated atom"):
        split_family(truth, [0, 1], [0.5])
    with pytest.raises(ValueError, match="out of range"):
        split_family(truth, [8], [0.5])
