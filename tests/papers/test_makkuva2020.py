"""moestat.papers.makkuva2020: the success criterion, the rate analysis and the Study cell of the gated network."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import moestat as ms
from moestat.cells import CellContext
from moestat.fit.tensor import fit_gate, gated_starts
from moestat.metrics.gated import gating_error, regressor_error
from moestat.papers import makkuva2020 as paper

CELL = "moestat.papers.makkuva2020:gated_nn_cell"
TENSOR = dict(l4_iters=30, l4_lr=0.02, gate_iters=5, gate_step=2.0, gate_radius=5.0, mu=0.1, lam=10.0, ridge=0.01)


# ----------------------------------------------------------------------------- recovered

def test_recovered_needs_both_errors_at_or_below_their_thresholds():
    frame = pd.DataFrame({"E_reg": [0.0, 0.05, 0.0500001, 0.01, np.nan, 0.3],
                          "gate_l2": [0.1, 0.5, 0.1, 0.6, 0.1, 0.1]})
    # by hand: both small; both exactly at the thresholds (<=); E_reg just above; gate too far; NaN; stuck l2 optimum
    assert paper.recovered(frame).tolist() == [True, True, False, False, False, False]
    assert paper.SUCCESS == {"E_reg": 0.05, "gate_l2": 0.5}
    assert paper.recovered(frame, e_reg=0.4, gate_l2=1.0).tolist() == [True, True, True, True, False, True]


def test_recovered_rejects_bad_input_by_name():
    with pytest.raises(ValueError, match=r"lacks the columns \['gate_l2'\]"):
        paper.recovered(pd.DataFrame({"E_reg": [0.0]}))
    with pytest.raises(TypeError, match="pandas DataFrame"):
        paper.recovered({"E_reg": [0.0], "gate_l2": [0.0]})
    with pytest.raises(ValueError, match="e_reg=-1"):
        paper.recovered(pd.DataFrame({"E_reg": [0.0], "gate_l2": [0.0]}), e_reg=-1)


# ----------------------------------------------------------------------------- rates

def _errors(alpha: dict[str, float], ns=(1000, 2000, 5000, 10000), reps: int = 4, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for method, a in alpha.items():
        for n in ns:
            for r in range(reps):
                rows.append({"method": method, "n": n, "rep": r, "gate_l2": 3.0 * n ** -a * np.exp(0.1 * rng.normal()),
                             "reg_angle": 2.0 * n ** -a * np.exp(0.1 * rng.normal())})
    return pd.DataFrame(rows)


def test_rate_frame_drops_the_known_experts_angle_and_short_n_ranges():
    errors = pd.concat([_errors({"tensor": 0.5, "gate|A=A*": 0.5}),
                        _errors({"em": 0.5}, ns=(1000, 2000))], ignore_index=True)  # EM: 2 n values only
    tidy = paper.rate_frame(errors)
    got = set(zip(tidy["method"], tidy["metric"], strict=True))
    assert got == {("tensor", "gate_l2"), ("tensor", "reg_angle"), ("gate|A=A*", "gate_l2")}
    assert len(tidy) == 3 * 4 * 4  # three (method, metric) groups x 4 n x 4 replicates
    want = errors.set_index(["method", "n", "rep"])["gate_l2"]
    g = tidy[tidy["metric"] == "gate_l2"].set_index(["method", "n", "rep"])["error"]
    np.testing.assert_array_equal(g.to_numpy(), want.loc[g.index].to_numpy())
    with pytest.raises(ValueError, match=r"lacks the columns \['rep'\]"):
        paper.rate_frame(errors.drop(columns="rep"))


def test_rate_table_exponents_are_the_ols_slopes_and_test_one_half():
    errors = _errors({"tensor": 0.5, "gate|A=A*": 1.0})
    table, results = paper.rate_table(errors)
    assert set(results) == {"gate_l2", "reg_angle"}
    for (method, metric), row in table.set_index(["method", "metric"]).iterrows():
        g = errors[errors["method"] == method]
        slope = np.polyfit(np.log(g["n"]), np.log(g[metric]), 1)[0]  # independent OLS on the replicate points
        assert row["exponent"] == pytest.approx(-slope, rel=1e-9)
        assert row["h0_exponent"] == 0.5 and row["config_method"] == "cluster_bootstrap"
    # true exponents 0.5 and 1.0 with 10% log-noise on 16 points per fit: H0 alpha = 1/2 is kept for the first
    # (p > 0.01 unless a 1% event) and rejected for the second (slope 1 is ~10 s.e. away)
    p = table.set_index(["method", "metric"])["h0_p_value"]
    assert p[("tensor", "gate_l2")] > 0.01 and p[("gate|A=A*", "gate_l2")] < 1e-3
    assert paper.rate_config()["h0_exponent"] == paper.RATE_H0 == 0.5


# ----------------------------------------------------------------------------- the cell

def _ctx(data: dict, options: dict, n: int = 400, reps: int = 2) -> CellContext:
    # device="cpu" here and in the hand-written calls the cells are compared with bit for bit: under "auto" those
    # would run on a GPU, whose reductions round differently (1e-16 apart on an H200)
    ss = np.random.SeedSequence(5, spawn_key=(0, 1, n))
    return CellContext(truth_cfg={"label": "t", "data": data}, fit_cfg={"label": "f", "options": options}, n=n,
                       reps=reps, data_seed=ss, fit_seed=np.random.SeedSequence(6), metric_seed=ss, device="cpu")


def _wide(errors: pd.DataFrame) -> pd.DataFrame:
    idx = [c for c in ("rep", "restart") if c in errors]
    return errors.pivot(index=idx, columns="metric", values="value")


def test_cell_matches_the_library_calls_it_stands_for():
    data = {"d": 6, "k": 2, "seed": 11, "start_seed": 12}
    out = paper.gated_nn_cell(_ctx(data, {"method": "tensor", "restarts": 3, **TENSOR}))
    # the same fit written out by hand: simulate, shared starts, fit_tensor, the library's error metrics
    sim = ms.simulate_gated_nn(n=400, reps=2, seed=11, d=6, k=2)
    fit = ms.fit_tensor(sim.X, sim.y, 2, sigma=0.05, restarts=3, init=gated_starts(2, 3, 2, 6, seed=12), device="cpu",
                        **TENSOR)
    want = pd.concat([_wide(regressor_error(fit.regressors, sim.truth.regressors)),
                      _wide(gating_error(fit.gate_weight, sim.truth.gate_weight, A_hat=fit.regressors,
                                         A_star=sim.truth.regressors))], axis=1)
    frame = out.frame.set_index("rep")
    for metric in paper.ERROR_METRICS:
        np.testing.assert_array_equal(frame[metric].to_numpy(), want[metric].to_numpy())
    np.testing.assert_array_equal(frame["objective"], fit.objective)
    restarts = out.pieces["restarts"]
    assert len(restarts) == 2 * 3 and restarts["selected"].sum() == 2 and "history" not in out.pieces
    chosen = restarts[restarts["selected"]].set_index("rep")
    np.testing.assert_array_equal(chosen["E_reg"], frame["E_reg"])
    np.testing.assert_array_equal(chosen["restart"], frame["best_restart"])


def test_n_grid_offsets_every_seed_and_gate_fits_use_their_own_start_seed():
    data = {"d": 6, "k": 2, "seed": 20, "start_seed": 30, "ns": [300, 400]}
    out = paper.gated_nn_cell(_ctx(data, {"method": "gate", "experts": "truth", "restarts": 2, "start_seed": 40,
                                          "gate_iters": 4}))
    sim = ms.simulate_gated_nn(n=400, reps=2, seed=21, d=6, k=2)  # n = 400 is the second n: seed + 1
    fit = fit_gate(sim.X, sim.y, sim.truth.regressors, sigma=0.05, restarts=2, gate_iters=4, seed=41, device="cpu")
    got = out.pieces["restarts"].set_index(["rep", "restart"])["gate_l2"]
    want = _wide(fit.errors(sim.truth, restarts=True))["gate_l2"]
    np.testing.assert_array_equal(got.to_numpy(), want.loc[got.index].to_numpy())
    assert (out.frame["E_reg"] == 0).all()  # the experts are the truth's


def test_offset_starts_false_keeps_one_start_seed_for_every_n_and_still_offsets_the_data():
    """``offset_starts=False`` (the nonlinear-experts experiment as first run): the n = 400 cell of the grid draws
    its data from seed + 1 but starts from the start seed itself."""
    data = {"d": 6, "k": 2, "seed": 20, "start_seed": 30, "ns": [300, 400], "offset_starts": False}
    out = paper.gated_nn_cell(_ctx(data, {"method": "tensor", "restarts": 2, **TENSOR}))
    sim = ms.simulate_gated_nn(n=400, reps=2, seed=21, d=6, k=2)
    fit = ms.fit_tensor(sim.X, sim.y, 2, sigma=0.05, restarts=2, init=gated_starts(2, 2, 2, 6, seed=30), device="cpu",
                        **TENSOR)
    np.testing.assert_array_equal(out.frame.set_index("rep")["objective"], fit.objective)
    with pytest.raises(ValueError, match="offset_starts"):
        paper.gated_nn_cell(_ctx({**data, "offset_starts": "no"}, {"method": "tensor", "restarts": 1, **TENSOR}))


def test_gate_on_least_squares_experts_refits_them_from_the_truths_starts():
    data = {"d": 6, "k": 2, "seed": 3, "start_seed": 4}
    l2 = {"iters": 8, "lr": 0.02}
    out = paper.gated_nn_cell(_ctx(data, {"method": "gate", "experts": "l2", "experts_fit": l2, "restarts": 2,
                                          "start_seed": 9, "gate_iters": 3, "record_every": 1}, reps=1))
    sim = ms.simulate_gated_nn(n=400, reps=1, seed=3, d=6, k=2)
    A = ms.fit_l2_gated(sim.X, sim.y, 2, sigma=0.05, restarts=2, init=gated_starts(1, 2, 2, 6, seed=4),
                        device="cpu", **l2).restart_regressors
    fit = fit_gate(sim.X, sim.y, A, sigma=0.05, gate_iters=3, seed=9, device="cpu")
    np.testing.assert_array_equal(out.frame["gate_l2"], _wide(fit.errors(sim.truth))["gate_l2"])
    hist = out.pieces["history"]
    assert {"E_reg", "gate_l2", "loss"} <= set(hist["metric"]) and hist["iter"].max() == 3


def test_cell_without_seeds_uses_the_study_streams():
    out = paper.gated_nn_cell(_ctx({"d": 6}, {"method": "em", "restarts": 1, "iters": 2}))
    ctx = _ctx({"d": 6}, {})
    sim = ms.simulate_gated_nn(n=400, reps=2, seed=ctx.data_seed, d=6)
    starts = np.random.SeedSequence(ctx.data_seed.entropy, spawn_key=(*ctx.data_seed.spawn_key, 2**31 - 1))
    fit = ms.fit_em_gated(sim.X, sim.y, 2, sigma=0.05, restarts=1, iters=2, init=gated_starts(2, 1, 2, 6, starts),
                          device="cpu")
    np.testing.assert_array_equal(out.frame["E_reg"], _wide(fit.errors(sim.truth))["E_reg"])


@pytest.mark.parametrize(("data", "options", "match"), [
    ({"dd": 6}, {"method": "tensor"}, r"data knobs \['dd'\]"),
    ({"d": 6}, {"method": "sgd"}, r"options.method='sgd'"),
    ({"d": 6, "ns": [100, 200]}, {"method": "tensor"}, r"data.ns=\[100, 200\] does not hold the cell's n=400"),
    ({"d": 6}, {"method": "gate", "experts": "em"}, r"options.experts='em'"),
    ({"d": 6, "seed": -1}, {"method": "tensor"}, r"seed -1 must be a non-negative integer"),
])
def test_cell_rejects_bad_settings_by_name(data, options, match):
    with pytest.raises(ValueError, match=match):
        paper.gated_nn_cell(_ctx(data, options))


def test_study_runs_the_cell_and_resumes_with_its_pieces(tmp_path):
    def study() -> ms.Study:
        return ms.Study(truth={"label": "paper", "data": {"d": 6, "seed": 1, "start_seed": 2, "ns": [300, 500]}},
                        fit=[{"label": "tensor", "options": {"method": "tensor", "restarts": 2, "record_every": 10,
                                                             **TENSOR}},
                             {"label": "em", "options": {"method": "em", "restarts": 2, "iters": 3}}],
                        n=[300, 500], reps=2, seed=0, cell=CELL, name="makkuva-test")
    first = study().run(tmp_path, progress=False)
    assert len(first) == 2 * 2 * 2 and set(first["status"]) == {"ok"}
    assert set(first["method"]) == {"tensor", "em"} and set(first["truth_d"]) == {6}
    hist = study().pieces("history", checkpoint=tmp_path)
    assert set(hist["fit"]) == {"tensor"}  # only the tensor fit asked for a trace
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "cells").glob("*.parquet")}
    again = study().run(tmp_path, progress=False)
    pd.testing.assert_frame_equal(again, first)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "cells").glob("*.parquet")} == stamps
