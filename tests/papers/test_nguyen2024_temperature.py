"""nguyen2024_temperature (Nguyen, Akbarian & Ho, ICML 2024, temperature in softmax Gaussian MoE): theory rows, the
simulation truth, the affine gate's scale invariance and the temperature error, each checked against an independent
computation (hand formulas, numpy)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import moestat as ms
from moestat.papers import THEORY_COLUMNS
from moestat.papers import nguyen2024_temperature as paper
from moestat.rates import theory


@pytest.fixture
def registered(monkeypatch):
    """The rows registered for the duration of a test (the package registers them once the lead lists the paper)."""
    monkeypatch.setattr(theory, "_ROWS", dict(theory._ROWS))
    theory.register_theory("nguyen2024_temperature", paper.THEORY)


def _rows() -> dict[tuple[str, str, str], dict]:
    rows = [dict(zip(THEORY_COLUMNS, r, strict=True)) for r in paper.THEORY]
    return {(r["gate"], r["regime"], r["response"]): r for r in rows}


def test_rows_are_well_formed():
    assert "2401.13875" in paper.REFERENCE and "ICML 2024" in paper.REFERENCE
    for row in paper.THEORY:
        assert len(row) == len(THEORY_COLUMNS) and row[0] == "nguyen2024_temperature"
        assert row[8] == "n" and row[12] == "decay" and row[11] in ms.rates.RATE_MODELS
    assert {g for row in paper.THEORY for g in row[2].split("|")} == set(paper.GATES)


def test_theory_rates_state_the_abstract(registered):
    rows = _rows()
    slow = rows[("softmax", "exact|over", "err_temperature")]
    assert slow["kind"] == "slower_than_polynomial" and slow["rate_model"] == "inverse_log"
    assert slow["exponent"] == 1.0 and "O(1/log n)" in slow["rate"]
    exact = rows[("activation", "exact", "err_temperature")]
    assert (exact["exponent"], exact["rate_model"], exact["kind"]) == (0.5, "power_log", "upper_bound")
    assert rows[("activation", "over", "err_over_param")]["exponent"] == 0.25
    for row in rows.values():  # what was not read in the paper says so
        if row["rate_model"] == "power_log":
            assert "not read" in row["note"]
    assert ms.predicted_rate("activation", "linear", "err_temperature", regime="exact") == "(log n / n)^{1/2}"
    assert ms.predicted_rate("softmax", "linear", "err_temperature", regime="over").startswith("slower than any")
    table = ms.theory_rates()
    assert (table["source"] == "nguyen2024_temperature").sum() == len(paper.THEORY)


def test_apparent_power_exponent_of_the_inverse_log_rate_by_hand(registered):
    """A power fit to 1/log n over [1e3, 1e5] reports a small positive exponent: the OLS slope of log log n on log n,
    computed here with numpy on the same 201-point grid."""
    table = ms.theory_rates()
    row = table[(table["source"] == "nguyen2024_temperature") & (table["gate"] == "softmax")].iloc[0]
    n = np.logspace(3, 5, 201)
    slope = np.polyfit(np.log(n), np.log(np.log(n)), 1)[0]
    assert row["power_exponent_in_range"] == pytest.approx(slope, rel=1e-10) and 0 < slope < 0.2


def test_truth_has_the_temperature_and_simulate_uses_it():
    spec, params = paper.temperature_truth("activation", tau=0.6, noise_sd=0.2)
    assert (spec.gate, spec.k, spec.d, spec.temperature) == ("activation", 2, 1, 0.6)
    assert params.noise_sd.tolist() == [0.2, 0.2]
    X = np.linspace(-1, 1, 11)[:, None]
    s = np.tanh(X @ np.array(paper.PARAMS["gate_weight"]).T + paper.PARAMS["gate_bias"]) / 0.6
    pi = np.exp(s) / np.exp(s).sum(1, keepdims=True)
    f = (pi * (X @ np.array(paper.PARAMS["expert_weight"]).T + paper.PARAMS["expert_bias"])).sum(1)
    np.testing.assert_allclose(spec.mean(params, X), f, rtol=1e-13)  # float64 round-off
    soft = paper.temperature_truth("softmax")
    assert soft.spec.gate == "softmax" and soft.spec.temperature == paper.TAU and soft.info["temperature"] == 1.0
    data = ms.simulate(spec, params, n=20, seed=0)
    assert data.X.shape == (1, 20, 1) and ((-1 <= data.X) & (data.X <= 1)).all()


def test_rescale_gate_is_the_affine_gates_scale_invariance():
    spec, params = paper.temperature_truth("softmax", tau=0.5)
    X = np.linspace(-1, 1, 21)[:, None]
    base = spec.gate_weights(params, X)
    act = ms.MoE(gate="activation", k=2, d=1, temperature=0.5)
    for c in (0.1, 2.0, 7.5):
        scaled = paper.rescale_gate(params, c, 0.5)
        assert float(scaled.temperature) == pytest.approx(0.5 * c, rel=1e-15)
        np.testing.assert_allclose(spec.gate_weights(scaled, X), base, rtol=1e-12, atol=1e-15)  # round-off
        assert np.abs(act.gate_weights(scaled, X) - act.gate_weights(params, X)).max() > 1e-2
    with pytest.raises(ValueError, match="c must be a finite number > 0"):
        paper.rescale_gate(params, 0.0, 0.5)


def test_temperature_errors_by_hand():
    p = ms.Params.stack([ms.Params([0.0, 0.0], [[1.0], [2.0]], [[0.0], [0.0]], [0.0, 0.0], temperature=t)
                         for t in (0.5, 2.0)])
    out = paper.temperature_errors(p, 1.0, 9.0)
    np.testing.assert_allclose(out["err_temperature"], [0.5, 1.0], rtol=1e-15)
    np.testing.assert_allclose(out["err_log_temperature"], [math.log(2.0)] * 2, rtol=1e-15)
    fixed = paper.temperature_errors(ms.Params([0.0], [[1.0]], [[0.0]], [0.0]), 1.0, 1.5)
    np.testing.assert_allclose(fixed["err_temperature"], [0.5], rtol=1e-15)  # the fitted spec's fixed temperature
    with pytest.raises(ValueError, match="truth_temperature must be a finite number > 0"):
        paper.temperature_errors(p, -1.0, 1.0)


def test_temperature_error_metric_reads_the_truth_and_the_fit():
    spec, truth = paper.temperature_truth("activation", tau=0.8)
    fitted = ms.Params.stack([ms.Params(truth.gate_bias, truth.gate_weight, truth.expert_weight, truth.expert_bias,
                                        temperature=t) for t in (0.8, 1.0)])
    ctx = SimpleNamespace(fit=SimpleNamespace(params=fitted), truth=truth, truth_spec=spec, fit_spec=spec)
    out = paper.temperature_error_metric(ctx)
    np.testing.assert_allclose(out["err_temperature"], [0.0, 0.2], atol=1e-15)


def test_bad_input():
    with pytest.raises(ValueError, match="valid values"):
        paper.temperature_truth("cosine")
    with pytest.raises(ValueError, match="tau must be a finite number > 0"):
        paper.temperature_truth(tau=0.0)
    with pytest.raises(ValueError, match="noise_sd must be a finite number > 0"):
        paper.temperature_truth(noise_sd=-1.0)
