"""Declarative constraint tables of the public functions (moestat._validation.validate_arguments)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import moestat as ms
from moestat import deep
from moestat._validation import Choice, Integer, Real, Seed, validate_arguments

PUBLIC = [ms.fit_lse, ms.fit_mle, ms.fit_tensor, ms.fit_em_gated, ms.fit_l2_gated, ms.estimate_gbar, ms.bootstrap,
          ms.test_n_experts, ms.select_k, ms.simulate, ms.simulate_clusters, ms.simulate_patches,
          ms.simulate_gated_nn, ms.fit_rate, ms.compare_rates, ms.window_sensitivity, ms.sample_complexity,
          deep.fit_cluster_moe, deep.fit_single_cnn, deep.fit_pmoe, deep.fit_cnn, ms.voronoi_loss,
          ms.metrics.voronoi_losses, ms.match_atoms, ms.l2_distance, ms.design_check,
          ms.calibrate_design, ms.compare_models, ms.test_exponent, ms.scaling_exponent, ms.predicted_rate,
          ms.theory_rates, ms.center_softmax, ms.voronoi_cells, ms.check_identifiability, ms.gating_error,
          ms.regressor_error, ms.gaussian_voronoi_frame, ms.gaussian_voronoi_loss, ms.parameter_errors,
          ms.permutation_invariant_error, ms.representation_errors, ms.sup_expert_error, ms.lowest_objective,
          ms.optimizer_invariance, ms.jackknife_mcse, ms.n_reps_for, ms.build_design]
CASES = [(fn, name) for fn in PUBLIC for name in fn.parameter_constraints]

GARBAGE = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=5), st.sampled_from([[1, 2], {"a": 1}, (), object(), np.float64("nan"),
                                                          torch.int64, "gpu", -1, 0, 1.5, float("inf")]))


@pytest.mark.parametrize(("fn", "name"), CASES, ids=[f"{fn.__name__}-{name}" for fn, name in CASES])
def test_defaults_satisfy_the_table(fn, name):
    default = inspect.signature(fn).parameters[name].default
    if default is inspect.Parameter.empty:
        return  # required argument: no default to check
    assert fn.parameter_constraints[name].accepts(default), f"{fn.__name__}({name}={default!r})"


@pytest.mark.parametrize(("fn", "name"), CASES, ids=[f"{fn.__name__}-{name}" for fn, name in CASES])
@given(value=GARBAGE)
def test_garbage_gets_a_clean_error_naming_function_and_argument(fn, name, value):
    """Any value the table rejects raises ValueError or TypeError at entry, before any work is done (the call
    passes no other argument, so reaching the body would fail differently)."""
    assume(not fn.parameter_constraints[name].accepts(value))
    with pytest.raises((ValueError, TypeError), match=rf"^{fn.__name__}\(\): {name} must be "):
        fn(**{name: value})


@pytest.mark.parametrize(("call", "match"), [
    (lambda: ms.fit_mle(None, None, None, seed=-1), r"fit_mle\(\): seed must be None, an integer >= 0"),
    (lambda: ms.fit_tensor(None, None, 2, seed="7"), r"fit_tensor\(\): seed must be"),
    (lambda: deep.fit_pmoe(None, seed=-3), r"fit_pmoe\(\): seed must be"),
    (lambda: ms.fit_rate(None, "y", seed=1.5), r"fit_rate\(\): seed must be"),
    (lambda: ms.fit_lse(None, None, None, device="gpu"), r"device must be 'auto', 'cpu', 'cuda'"),
    (lambda: ms.fit_mle(None, None, None, dtype=torch.int64), r"dtype must be None, 'float64', 'float32'"),
    (lambda: ms.window_sensitivity(None, "y", min_values=1), r"min_values must be an integer >= 3, got 1"),
    (lambda: ms.fit_l2_gated(None, None, 2, lr=-0.1), r"lr must be a positive finite number, got -0.1"),
    (lambda: ms.fit_lse(None, None, None, restarts=True), r"restarts must be an integer >= 1, got True \(bool\)"),
])
def test_inputs_that_used_to_slip_through(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_constraint_semantics_and_table_errors():
    assert Integer(1).accepts(3) and not Integer(1).accepts(0) and not Integer(1).accepts(True)
    assert not Integer(1).accepts_type(2.0)  # 2.0 is a TypeError: integers only
    assert Real(0, open_low=True).accepts(1e-300) and not Real(0, open_low=True).accepts(0.0)
    assert not Real().accepts(float("nan")) and not Real().accepts(float("inf"))
    assert Seed().accepts(np.random.SeedSequence(1)) and Seed().accepts([np.random.SeedSequence(1)])
    assert not Seed().accepts([]) and not Seed().accepts(np.random.default_rng(0))
    assert Choice("a", "b").accepts("a") and not Choice("a", "b").accepts("c")
    with pytest.raises(TypeError, match="names unknown arguments"):
        validate_arguments(nope=Integer(1))(lambda x: x)
