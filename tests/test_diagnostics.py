"""Optimiser invariance and design checks (moestat.diagnostics)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import moestat as ms

NS = np.array([1000, 3000, 10000, 30000, 100000])


def _frame(seed: int = 0, units: int = 6) -> pd.DataFrame:
    """One row per (unit, n): y = 2 n^-1/2 x lognormal(0.2), objective = noise variance 0.01, both converged."""
    rng = np.random.default_rng(seed)
    rows = [{"truth_seed": u, "n": n, "y": 2 * n ** -0.5 * np.exp(0.2 * rng.standard_normal()),
             "objective": 0.01, "converged": True, "converged_alt": True, "truth_noise_var": 0.01}
            for u in range(units) for n in NS]
    return pd.DataFrame(rows)


def test_identical_solvers_are_invariant_and_delta_is_the_scaled_objective_gap():
    f = _frame()
    f["y_alt"] = f["y"]
    f["objective_alt"] = f["objective"] + 0.01 * 2.5 / f["n"]  # n (F_alt - F) / nu = 2.5 exactly
    out = ms.optimizer_invariance(f, "y", units="truth_seed", n_resamples=200).iloc[0]
    assert out["verdict"] == "invariant" and out["agree"] == 1 and out["exponent_shift"] == pytest.approx(0, abs=1e-12)
    assert out["objective_delta_median"] == pytest.approx(2.5) and out["objective_delta_max"] == pytest.approx(2.5)
    assert out["flat_disagree"] == 0 and out["pairs"] == len(f) and out["both_converged"] == 1


def test_a_solver_that_changes_the_slope_is_flagged():
    f = _frame()
    f["y_alt"] = f["y"] * (f["n"] / 1000) ** 0.3  # the alt solver's errors fall at n^-0.2 instead of n^-0.5
    f["objective_alt"] = f["objective"]
    out = ms.optimizer_invariance(f, "y", units="truth_seed", n_resamples=200).iloc[0]
    assert out["verdict"] == "optimiser-dependent rate"
    assert out["exponent_shift"] == pytest.approx(-0.3, abs=1e-9)  # exact: the log ratio is linear in log n
    # equal objectives with responses that differ: the data do not determine the response
    assert out["flat_disagree"] == pytest.approx(1 - out["agree"])


def test_scattered_fits_with_the_same_slope():
    f = _frame()
    rng = np.random.default_rng(1)
    f["y_alt"] = f["y"] * np.exp(rng.choice([-1.0, 1.0], len(f)))  # every row off by a factor e, no trend in n
    f["objective_alt"] = f["objective"]
    out = ms.optimizer_invariance(f, "y", units="truth_seed", n_resamples=200, max_shift=1.0).iloc[0]
    assert out["agree"] == 0 and out["verdict"] == "rate invariant, fits differ"


def test_invariance_by_groups_and_errors():
    f = pd.concat([_frame().assign(gate=g) for g in ("sigmoid", "softmax")], ignore_index=True)
    f["y_alt"], f["objective_alt"] = f["y"], f["objective"]
    out = ms.optimizer_invariance(f, ["y"], by="gate", units="truth_seed", n_resamples=100)
    assert list(out["gate"]) == ["sigmoid", "softmax"] and (out["verdict"] == "invariant").all()
    with pytest.raises(ValueError, match="invariance='lm'"):
        ms.optimizer_invariance(f.drop(columns="y_alt"), "y")
    with pytest.raises(ValueError, match="noise_var"):
        ms.optimizer_invariance(f, "y", noise_var=-1.0)


def test_design_check_counts_and_thresholds():
    truths = [ms.presets.gate_comparison("relu", truth_gate=g, d=3, seed=s) for g in ("sigmoid", "softmax")
              for s in range(3)]
    out = ms.design_check(truths, [1600, 16000, 160000], basin=False).set_index("check")
    P = ms.MoE(gate="sigmoid", expert="relu", k=4, d=3).n_params()  # the larger (sigmoid) count: 4 (4 + 4) = 32
    assert P == 32 and out.loc["obs_per_param", "value"] == pytest.approx(1600 / 32)
    assert bool(out.loc["obs_per_param", "passed"]) and out.loc["decades", "value"] == pytest.approx(2.0)
    assert out.loc["truths", "value"] == 3 and not bool(out.loc["truths", "passed"])
    with pytest.raises(ValueError, match="truths is empty"):
        ms.design_check([], [1, 10])
    with pytest.raises(ValueError, match="two positive"):
        ms.design_check(truths, [100])


def test_basin_gap_separates_exact_splits_and_reports_the_optimisers_convergence():
    """relu under a sigmoid gate: the weight split is exact (gap 0 by positive homogeneity, no fit runs).  gelu: the
    split is not exact, but run to convergence (Newton, the default) it ends at a dead-atom representation, a gap
    below 1e-3 of the resolution, so "exact"; L-BFGS stops on its cap partway along the valley (no start converged)
    and reports a "floor" gap that is only where it stopped.  The note says how many starts converged."""
    truths = [ms.presets.gate_comparison(e, truth_gate="sigmoid", d=2, k=2, seed=0) for e in ("relu", "gelu")]
    out = ms.design_check(truths, [1e3, 1e5], min_truths=1, n_mc=10_000).query("check == 'basin_gap'")
    relu, gelu = out.iloc[0], out.iloc[1]
    assert relu["note"].startswith("exact") and relu["value"] == 0 and relu["passed"]
    assert gelu["note"].startswith("exact: weight-split basin L2 gap (estimate_gbar, auto, 2/2 starts converged)")
    assert gelu["passed"] and gelu["value"] < 1e-3 * gelu["threshold"]
    stopped = ms.design_check(truths[1:], [1e3, 1e5], min_truths=1, n_mc=10_000, basin_optimizer="lbfgs")
    row = stopped.query("check == 'basin_gap'").iloc[0]
    assert row["note"].startswith("floor") and "0/2 starts converged" in row["note"] and not row["passed"]
    # where L-BFGS stops on its cap depends on rounding: measured 7.7e-8 against 3.6e-5 on the CPU, 8.6e-8 against
    # 2.8e-6 on an H200 (device "auto"); ten times is a margin both clear
    assert gelu["value"] < 0.1 * row["value"]


def test_basin_gap_is_exact_when_the_duplicated_atom_has_a_constant_gate():
    """Regime 1: splitting the weight sigma(b0*) of a zero-slope atom between two copies with its expert is exact
    for gelu too, so no basin fit runs; the split itself reproduces f* to round-off."""
    truth = ms.presets.gate_comparison("gelu", truth_gate="sigmoid", d=2, k=2, seed=0, regime=1)
    row = ms.design_check([truth], [1e3, 1e5], min_truths=1).query("check == 'basin_gap'").iloc[0]
    assert row["note"].startswith("exact: the duplicated atom's gate is constant") and row["value"] == 0
    spec, p = truth
    w = 1.0 / (1.0 + np.exp(-p.gate_bias[0]))
    half = np.log(w / 2) - np.log1p(-w / 2)  # sigma(half) = w / 2
    split = ms.Params(np.r_[half, half, p.gate_bias[1:]], np.r_[p.gate_weight[:1], p.gate_weight],
                      np.r_[p.expert_weight[:1], p.expert_weight], np.r_[p.expert_bias[:1], p.expert_bias])
    X = np.random.default_rng(0).uniform(-1, 1, (2000, 2))
    np.testing.assert_allclose(spec.with_k(3).mean(split, X), spec.mean(p, X), rtol=0, atol=1e-14)


def test_lowest_objective_takes_each_row_from_the_better_solver():
    f = pd.DataFrame({"objective": [1.0, 2.0, 3.0], "objective_alt": [1.5, 1.0, 3.0], "y": [10.0, 20.0, 30.0],
                      "y_alt": [11.0, 21.0, 31.0]})
    out = ms.lowest_objective(f, "y", names=("newton", "lm"))
    assert list(out["y_best"]) == [10.0, 21.0, 30.0]  # row 1: the alternative is lower; row 2: a tie stays primary
    assert list(out["objective_best"]) == [1.0, 1.0, 3.0] and list(out["solver_best"]) == ["newton", "lm", "newton"]
    assert "y_best" not in f  # a copy
    with pytest.raises(ValueError, match="invariance='lm'"):
        ms.lowest_objective(f.drop(columns="y_alt"), "y")


def test_solver_rate_tables_cover_every_solver_and_response():
    rng = np.random.default_rng(0)
    rows = [{"expert": "gelu", "gate": g, "truth_seed": s, "n": n, **{f"y{suf}": n ** -0.5 * np.exp(rng.normal(0, .2))
                                                                      for suf in ("", "_alt", "_best")}}
            for g in ("sigmoid", "softmax") for s in range(5) for n in (1000, 3000, 10000, 30000, 100000)]
    rates, windows, cmp = ms.diagnostics.solver_rate_tables(pd.DataFrame(rows), ["y"], between="gate",
                                                            levels=["sigmoid", "softmax"], n_resamples=200)
    assert set(rates["solver"]) == {"lowest objective", "newton", "lm"} and len(rates) == 3 * 2
    assert set(cmp["solver"]) == set(rates["solver"]) and len(cmp) == 3 and (cmp["level_a"] == "sigmoid").all()
    assert set(windows["y"]) == {"y", "y_alt", "y_best"} and rates["exponent"].between(0.3, 0.7).all()


def test_complete_units_drops_units_missing_a_cell_and_reports_them():
    from moestat.diagnostics import complete_units

    rows = [{"gate": g, "truth_seed": s, "n": n, "y": 1.0} for g in ("sigmoid", "softmax") for s in range(6)
            for n in (100, 1000, 10000)]
    f = pd.DataFrame(rows)
    f = f[~((f.gate == "sigmoid") & (f.truth_seed == 4) & (f.n == 1000))]  # one missing cell
    kept, dropped = complete_units(f, "truth_seed", by=["gate"])
    assert dropped == {"sigmoid": [4]} and len(kept) == len(f) - 2
    assert set(kept[kept.gate == "softmax"].truth_seed) == set(range(6))
    paired, gone = complete_units(kept, "truth_seed", across="gate")  # seed 4 now lacks one gate level
    assert gone == {"all": [4]} and 4 not in set(paired.truth_seed)


def test_complete_units_and_rate_tables_take_a_frame_with_repeated_row_labels():
    """A frame concatenated from several runs' files (pd.concat without ignore_index) repeats its row labels: the
    same rows are kept, with their labels, and the rate tables equal those of the relabelled frame."""
    from moestat.diagnostics import complete_units

    rng = np.random.default_rng(1)
    rows = [{"expert": "relu", "gate": g, "truth_seed": s, "n": n, **{f"y{suf}": n ** -0.5 * np.exp(rng.normal(0, .2))
                                                                      for suf in ("", "_alt", "_best")}}
            for g in ("sigmoid", "softmax") for s in range(6) for n in (1000, 3000, 10000, 30000, 100000)]
    unique = pd.DataFrame(rows)
    unique = unique.drop(index=7)  # seed 1 of the sigmoid gate misses n = 10,000
    repeated = pd.concat([unique.iloc[i:i + 1] for i in range(len(unique))])
    repeated.index = np.zeros(len(repeated), dtype=int)
    kept_u, dropped_u = complete_units(unique, "truth_seed", by=["gate"])
    kept_r, dropped_r = complete_units(repeated, "truth_seed", by=["gate"])
    assert dropped_r == dropped_u == {"sigmoid": [1]}
    assert (kept_r.index == 0).all()
    pd.testing.assert_frame_equal(kept_r.reset_index(drop=True), kept_u.reset_index(drop=True))
    kw = dict(between="gate", levels=["sigmoid", "softmax"], n_resamples=200)
    for a, b in zip(ms.diagnostics.solver_rate_tables(repeated, ["y"], **kw),
                    ms.diagnostics.solver_rate_tables(unique, ["y"], **kw), strict=True):
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
