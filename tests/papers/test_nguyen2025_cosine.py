"""nguyen2025_cosine (Nguyen et al., ICLR 2025, perturbed cosine router): theory rows, the simulation truth and the
matched-atom errors, each checked against an independent computation (hand formulas, numpy loops)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import moestat as ms
from moestat.papers import PAPERS, THEORY_COLUMNS
from moestat.papers import nguyen2025_cosine as paper

EPS = 0.1


def _rows() -> dict[tuple[str, str], dict]:
    rows = [dict(zip(THEORY_COLUMNS, r, strict=True)) for r in paper.THEORY]
    return {(r["gate"], r["response"]): r for r in rows}


def test_module_is_registered_and_rows_are_well_formed():
    assert PAPERS["nguyen2025_cosine"] is paper and "2405.14131" in paper.REFERENCE
    for row in paper.THEORY:
        assert len(row) == len(THEORY_COLUMNS) and row[0] == "nguyen2025_cosine"
        assert row[3] == "" and row[8] == "n" and row[12] == "decay"
    table = ms.theory_rates()
    assert (table["source"] == "nguyen2025_cosine").sum() == len(paper.THEORY) == 12


def test_theory_rates_match_the_paper():
    rows = _rows()
    for gate in ("cosine", "perturbed_cosine"):  # Theorem on the regression function: both routers
        r = rows[(gate, "l2")]
        assert (r["exponent"], r["rate_model"], r["kind"]) == (0.5, "power_log", "upper_bound")
    for block in paper.BLOCKS:
        cos = rows[("cosine", f"err_exact_{block}")]
        assert math.isnan(cos["exponent"]) and cos["rate_model"] == "inverse_log"
        assert cos["kind"] == "slower_than_polynomial" and cos["examples"] == ""  # whatever the experts
        pert = rows[("perturbed_cosine", f"err_exact_{block}")]
        assert (pert["exponent"], pert["rate_model"]) == (0.5, "power_log") and "gelu" in pert["examples"]
    for block in ("gate_slope", "expert"):  # over-specified cells: (log n / n)^{1/4}
        assert rows[("perturbed_cosine", f"err_over_{block}")]["exponent"] == 0.25
    assert ("perturbed_cosine", "err_over_gate_bias") not in rows  # split intercepts have no rate
    assert ms.predicted_rate("perturbed_cosine", "gelu", "err_exact_param") == "(log n / n)^{1/2}"
    assert ms.predicted_rate("perturbed_cosine", "linear", "err_exact_param") == ""  # not strongly identifiable
    assert ms.predicted_rate("cosine", "linear", "err_exact_expert").startswith("O(1/log^{tau} n)")


def test_apparent_power_exponent_of_the_l2_rate_by_hand():
    """A power fit to (log n / n)^{1/2} over [1e3, 1e5] reports less than 1/2: the OLS slope of
    0.5 log(n / log n) on log n, computed here with numpy on the same 201-point grid."""
    table = ms.theory_rates()
    row = table[(table["source"] == "nguyen2025_cosine") & (table["response"] == "l2")].iloc[0]
    n = np.logspace(3, 5, 201)
    slope = np.polyfit(np.log(n), 0.5 * np.log(n / np.log(n)), 1)[0]
    assert row["power_exponent_in_range"] == pytest.approx(slope, rel=1e-10) and slope < 0.5


def _gelu(z: np.ndarray) -> np.ndarray:
    return z * 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))


def _mean_by_hand(gate: str, x: np.ndarray) -> np.ndarray:
    """f(x) = sum_i softmax_i(s(x)) gelu(a_i^T x + b_i), scores written from the paper's formulas."""
    p = {k: np.asarray(v, float) for k, v in paper.PARAMS.items()}
    out = np.zeros(len(x))
    for t, xt in enumerate(x):
        scores = []
        for i in range(2):
            w = p["gate_weight"][i]
            if gate == "cosine":
                s = p["gate_bias"][i] + w @ xt / (np.linalg.norm(w) * np.linalg.norm(xt))
            elif gate == "perturbed_cosine":
                s = p["gate_bias"][i] + w @ xt / ((np.linalg.norm(w) + EPS) * (np.linalg.norm(xt) + EPS))
            else:
                s = p["gate_bias"][i] + w @ xt
            scores.append(s)
        weights = np.exp(scores) / np.exp(scores).sum()
        experts = _gelu(p["expert_weight"] @ xt + p["expert_bias"])
        out[t] = weights @ experts
    return out


@pytest.mark.parametrize("gate", ["cosine", "perturbed_cosine", "softmax"])
def test_truth_is_the_stated_model(gate):
    truth = paper.cosine_router_truth(gate)
    spec, params = truth
    assert (spec.gate, spec.expert, spec.k, spec.d, spec.noise_sd) == (gate, "gelu", 2, 2, 0.1)
    for key, value in paper.PARAMS.items():
        np.testing.assert_array_equal(np.asarray(getattr(params.numpy(), key)), np.asarray(value))
    w = np.asarray(paper.PARAMS["gate_weight"])
    assert w[0] @ w[1] == 0.0  # the gate vectors are 90 degrees apart
    assert truth.info["inputs"] == "uniform[-1,1]" and (truth.info["gate_eps"] == EPS) == (gate == "perturbed_cosine")
    x = np.random.default_rng(0).uniform(-1, 1, size=(50, 2))
    np.testing.assert_allclose(np.asarray(spec.mean(params, x)), _mean_by_hand(gate, x), rtol=1e-10, atol=1e-12)


def test_truth_rejects_bad_arguments():
    with pytest.raises(ValueError, match="gate"):
        paper.cosine_router_truth("laplace")
    with pytest.raises(ValueError, match="noise_sd"):
        paper.cosine_router_truth("cosine", noise_sd=0.0)


def test_perturbed_map_by_hand():
    np.testing.assert_allclose(paper.perturbed_map(np.array([3.0, 4.0]), 0.1), np.array([3.0, 4.0]) / 5.1)
    np.testing.assert_allclose(paper.perturbed_map(np.zeros(2)), np.zeros(2))


def _truth_params() -> ms.Params:
    return paper.cosine_router_truth("cosine").params.numpy()


def _with(p: ms.Params, **changes: np.ndarray) -> ms.Params:
    blocks = {k: np.array(getattr(p, k), float) for k in ("gate_bias", "gate_weight", "expert_weight", "expert_bias")}
    blocks.update(changes)
    return ms.Params(**blocks)


@pytest.mark.parametrize("gate", ["cosine", "perturbed_cosine", "softmax"])
def test_errors_vanish_at_the_truth_and_ignore_relabelling(gate):
    t = _truth_params()
    zero = paper.router_errors(t, t, gate)
    assert all(np.all(v == 0) for v in zero.values())
    swapped = _with(t, gate_bias=np.asarray(t.gate_bias)[::-1], gate_weight=np.asarray(t.gate_weight)[::-1],
                    expert_weight=np.asarray(t.expert_weight)[::-1], expert_bias=np.asarray(t.expert_bias)[::-1])
    assert all(np.all(np.abs(v) < 1e-12) for v in paper.router_errors(swapped, t, gate).values())


def test_errors_ignore_each_routers_invariances():
    t = _truth_params()
    w, b = np.asarray(t.gate_weight), np.asarray(t.gate_bias)
    # common intercept shift: every router
    for gate in paper.GATES:
        out = paper.router_errors(_with(t, gate_bias=b + 0.7), t, gate)
        assert out["err_exact_param"][0] == pytest.approx(0.0, abs=1e-12)
    # cosine: rescaling each slope changes only the (unidentified) norm, by |lambda - 1| ||w||
    scaled = _with(t, gate_weight=w * np.array([[2.0], [0.5]]))
    out = paper.router_errors(scaled, t, "cosine")
    assert out["err_exact_param"][0] == pytest.approx(0.0, abs=1e-12)
    assert out["err_exact_gate_norm"][0] == pytest.approx(max(np.linalg.norm(w[0]), 0.5 * np.linalg.norm(w[1])))
    # cosine, k = 2: (u1, u2) and (-u2, -u1) give the same scores' difference, hence the same regression function
    # (checked on inputs); the errors must not count it
    u = w / np.linalg.norm(w, axis=1, keepdims=True)
    reflected = _with(t, gate_weight=np.stack([-3.0 * u[1], -0.5 * u[0]]))
    x = np.random.default_rng(1).uniform(-1, 1, size=(200, 2))
    spec = paper.cosine_router_truth("cosine").spec
    np.testing.assert_allclose(np.asarray(spec.mean(reflected, x)), np.asarray(spec.mean(t, x)), atol=1e-12)
    out = paper.router_errors(reflected, t, "cosine")
    assert out["err_exact_param"][0] == pytest.approx(0.0, abs=1e-12) and out["err_exact_gate_norm"][0] > 1.0
    # perturbed: u_i = w_i / (||w_i|| + eps) moved by a common t, mapped back by w = eps u / (1 - ||u||)
    u = w / (np.linalg.norm(w, axis=1, keepdims=True) + EPS) + np.array([0.05, -0.03])
    moved = EPS * u / (1 - np.linalg.norm(u, axis=1, keepdims=True))
    assert paper.router_errors(_with(t, gate_weight=moved), t, "perturbed_cosine")["err_exact_param"][0] == \
        pytest.approx(0.0, abs=1e-12)
    # softmax: a common slope shift
    out = paper.router_errors(_with(t, gate_weight=w + np.array([0.4, -0.2])), t, "softmax")
    assert out["err_exact_param"][0] == pytest.approx(0.0, abs=1e-12)
    # ... which the perturbed and cosine routers do not share: there it is an error
    assert paper.router_errors(_with(t, gate_weight=w + np.array([0.4, -0.2])), t, "cosine")[
        "err_exact_gate_slope"][0] > 0.05


def test_errors_of_known_perturbations_by_hand():
    t = _truth_params()
    w, eb = np.asarray(t.gate_weight), np.asarray(t.expert_bias)
    # an expert intercept moved by 0.3: only the expert block, and the whole-atom norm, see it
    out = paper.router_errors(_with(t, expert_bias=eb + np.array([0.3, 0.0])), t, "perturbed_cosine")
    assert out["err_exact_expert"][0] == pytest.approx(0.3) and out["err_exact_param"][0] == pytest.approx(0.3)
    assert out["err_exact_gate_slope"][0] == 0.0 and out["err_exact_gate_bias"][0] == 0.0
    # cosine: atom 0's direction rotated by theta: the chord 2 sin(theta / 2)
    theta = 0.2
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    turned = w.copy()
    turned[0] = rot @ w[0]
    out = paper.router_errors(_with(t, gate_weight=turned), t, "cosine")
    assert out["err_exact_gate_slope"][0] == pytest.approx(2 * np.sin(theta / 2), rel=1e-12)
    assert out["err_exact_gate_norm"][0] == pytest.approx(0.0, abs=1e-12)
    # perturbed: atom 0's slope moved; atom 1 is the reference, so the error is ||g(w0') - g(w0)||
    moved = w.copy()
    moved[0] = moved[0] + np.array([0.3, 0.1])
    g = lambda v: v / (np.sqrt(v @ v) + EPS)  # noqa: E731 - the hand formula
    out = paper.router_errors(_with(t, gate_weight=moved), t, "perturbed_cosine")
    assert out["err_exact_gate_slope"][0] == pytest.approx(np.linalg.norm(g(moved[0]) - g(w[0])), rel=1e-12)
    # the reference atom's intercept moved by delta: the other atom's centred intercept is off by delta
    out = paper.router_errors(_with(t, gate_bias=np.asarray(t.gate_bias) + np.array([0.0, 0.25])), t, "softmax")
    assert out["err_exact_gate_bias"][0] == pytest.approx(0.25)


def test_errors_are_per_replicate():
    t = _truth_params()
    eb = np.asarray(t.expert_bias)
    batched = ms.Params(gate_bias=np.stack([t.gate_bias] * 2), gate_weight=np.stack([t.gate_weight] * 2),
                        expert_weight=np.stack([t.expert_weight] * 2), expert_bias=np.stack([eb, eb + 0.1]))
    out = paper.router_errors(batched, t, "cosine")
    np.testing.assert_allclose(out["err_exact_expert"], [0.0, 0.1], atol=1e-12)


def test_errors_reject_bad_input():
    t = _truth_params()
    three = ms.Params(gate_bias=np.zeros(3), gate_weight=np.ones((3, 2)), expert_weight=np.ones((3, 2)),
                      expert_bias=np.zeros(3))
    with pytest.raises(ValueError, match="k=3"):
        paper.router_errors(three, t, "cosine")
    with pytest.raises(ValueError, match="gate"):
        paper.router_errors(t, t, "sigmoid")
    ctx = SimpleNamespace(fit_spec=ms.MoE(gate="softmax", expert="gelu", k=2, d=2),
                          truth_spec=ms.MoE(gate="cosine", expert="gelu", k=2, d=2), fit=None, truth=t)
    with pytest.raises(ValueError, match="truth's router"):
        paper.router_error_metric(ctx)


def test_metric_fills_the_norm_column_for_every_router():
    t = _truth_params()
    for gate in paper.GATES:
        spec = ms.MoE(gate=gate, expert="gelu", k=2, d=2)
        ctx = SimpleNamespace(fit_spec=spec, truth_spec=spec, fit=SimpleNamespace(params=t), truth=t)
        out = paper.router_error_metric(ctx)
        assert set(out) == {f"err_exact_{b}" for b in (*paper.BLOCKS, "gate_norm")}
        assert np.isnan(out["err_exact_gate_norm"][0]) == (gate != "cosine")
