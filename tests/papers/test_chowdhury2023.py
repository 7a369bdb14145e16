"""moestat.papers.chowdhury2023: the bounds lookup, the Study cell of the patch-routing experiments, the rates
table and the sweep slopes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moestat import Study
from moestat.cells import CellContext
from moestat.papers import chowdhury2023 as paper

DATA = {"variant": "synthetic", "n_patches": 8, "d": 16, "sizes": [16, 32], "n_test": 100, "seed_key": [7, 0, 8]}
OPTS = {"fit": "pmoe", "training": "separate", "k": 2, "l": 2, "m": 8, "lr": 0.2, "batch_size": 8, "epochs": 4,
        "router_epochs": 5, "stop_at_zero_error": True, "model": "pmoe", "seed_key": [7, 0, 8, 2, 0]}


def _ctx(n: int, data=None, opts=None, reps: int = 2) -> CellContext:
    ss = np.random.SeedSequence(0)
    return CellContext(truth_cfg={"label": "t", "data": dict(data or DATA)},
                       fit_cfg={"label": "f", "options": dict(opts or OPTS)}, n=n, reps=reps, data_seed=ss,
                       fit_seed=ss, metric_seed=ss, device="cpu")


def test_slope_bound_reads_the_theorem_rows():
    assert paper.slope_bound("N_star", "n", "cnn") == 8.0              # Thm 4.3: N_C = O(n^8)
    assert paper.slope_bound("N_star", "n", "pmoe_separate") == 0.0    # Thm 4.2: no n in N_S
    assert paper.slope_bound("test_error_fixed_N", "l", "pmoe_joint") == 0.375   # Thm 4.5: l^(3/8)
    with pytest.raises(KeyError, match="no bound for response='N_star', regressor='m'"):
        paper.slope_bound("N_star", "m", "cnn")
    assert set(paper.ARCHITECTURE) == set(paper.MODELS) and 0 < paper.PAPER_RATIO < 1
    assert 0.95 in paper.TARGETS["full"]["synthetic"]   # the paper's own target


def test_cell_trains_exactly_the_lanes_of_one_batched_fit_over_all_sizes():
    """The cell at size N reproduces lane (r, N) of a batched fit over every size (an independent call of
    fit_pmoe with the seed spawned over all lanes): same data, same lane seeds, same accuracy and routing."""
    from moestat.deep import fit_pmoe

    train, test = paper.patch_data(DATA, 2)
    batched = fit_pmoe(train, training="separate", k=2, l=2, m=8, lr=0.2, batch_size=8, epochs=4, router_epochs=5,
                       stop_at_zero_error=True, sizes=DATA["sizes"], seed=np.random.SeedSequence([7, 0, 8, 2, 0]),
                       device="cpu")
    want = batched.to_frame(test)
    for n in DATA["sizes"]:
        got = paper.patch_cell(_ctx(n))
        ref = want[want["n_train"] == n].reset_index(drop=True)
        np.testing.assert_array_equal(got["lane"], ref["lane"])
        np.testing.assert_array_equal(got["accuracy"], ref["accuracy"])
        np.testing.assert_array_equal(got["epochs_run"], ref["epochs_run"])
        assert list(got["lane_seed"]) == list(ref["seed"]) and set(got["model"]) == {"pmoe"}
        assert got["routing_hit"].between(0, 1).all() and (got["variant"] == "synthetic").all()


def test_cell_runs_in_a_study_with_one_row_per_run():
    cnn = {k: v for k, v in OPTS.items() if k not in ("training", "k", "l", "router_epochs")}
    study = Study(truth={"label": "syn", "data": DATA},
                  fit=[{"label": "pmoe", "options": OPTS},
                       {"label": "cnn", "options": {**cnn, "fit": "cnn", "model": "cnn", "seed_key": [7, 0, 8, 2, 2]}}],
                  n=DATA["sizes"], reps=2, seed=7, cell="moestat.papers.chowdhury2023:patch_cell", threads=1)
    frame = study.run(progress=False)
    assert len(frame) == 2 * 2 * 2 and set(frame["status"]) == {"ok"}
    assert (frame["n"] == frame["n_train"]).all() and frame["accuracy"].between(0, 1).all()
    assert frame.loc[frame["model"] == "cnn", "routing_hit"].isna().all()


def test_cell_rejects_bad_settings_with_the_fit_functions_messages():
    with pytest.raises(ValueError, match="n=24 is not among the data setting's sizes"):
        paper.patch_cell(_ctx(24))
    with pytest.raises(ValueError, match="must be smaller than the number of patches"):   # top-l needs l < n
        paper.patch_cell(_ctx(16, opts={**OPTS, "training": "joint", "k": 2, "l": 8}))
    with pytest.raises(ValueError, match="multiple of k"):   # m = 8 neurons split over k experts
        paper.patch_cell(_ctx(16, opts={**OPTS, "training": "joint", "k": 3, "l": 2}))


def test_sweep_cell_adds_the_swept_knob_and_l_star():
    data = {**DATA, "n_patches": 16, "delta_r": 0.6, "n_confusers": [5, 0], "seed_key": [7, 2, 16]}
    opts = {**OPTS, "training": "joint", "k": 2, "l": 6, "sweep": "l", "model": None, "seed_key": [7, 3, 1, 6]}
    got = paper.patch_cell(_ctx(16, data=data, opts=opts))
    # 5 confusers closer to o_1 in every sample: Definition D.3 gives l* = 6, as in the paper's Fig. 7
    assert set(got["sweep"]) == {"l"} and set(got["l_star"]) == {6} and set(got["l"]) == {6}
    assert set(got["n_confusers"]) == {"(5, 0)"} and got["routing_maxgate"].between(0, 1).all()


def _results() -> pd.DataFrame:
    """Accuracy curves whose mean crosses 0.9 at known N: a + b log N, runs at +-0.01 around it."""
    rows = []
    n_star = {(4, "pmoe", 2): 30.0, (4, "cnn", 4): 40.0, (8, "pmoe", 2): 30.0, (8, "cnn", 8): 80.0,
              (16, "pmoe", 2): 30.0, (16, "cnn", 16): 160.0}
    for (n_p, model, l), ns in n_star.items():
        for N in (8, 16, 32, 64, 128, 256, 512):
            for run, e in enumerate((-0.01, 0.0, 0.01, 0.0)):
                rows.append({"variant": "synthetic", "n_patches": n_p, "model": model, "l": l, "run": run,
                             "n_train": N, "accuracy": min(0.9 + 0.05 * np.log(N / ns) + e, 1.0)})
    return pd.DataFrame(rows), n_star


def test_rates_table_reports_n_star_ratios_and_slopes_against_the_bounds():
    results, n_star = _results()
    rates = paper.rates_table(results, {"synthetic": [0.9]}, n_resamples=300, seed=1)
    ns = rates[rates["kind"] == "n_star"].set_index(["n_patches", "model"])["n_star"]
    for (n_p, model, _), want in n_star.items():   # the mean curve crosses 0.9 exactly at n* (linear in log N)
        assert ns.loc[(n_p, model)] == pytest.approx(want, rel=1e-9)
    ratio = rates[rates["kind"] == "ratio"].set_index("n_patches")["n_star"]
    np.testing.assert_allclose(ratio.loc[[4, 8, 16]], [30 / 40, 30 / 80, 30 / 160], rtol=1e-9)
    sl = rates[rates["kind"] == "scaling"].set_index(["design", "model"])
    # CNN n* doubles with n: slope 1 in log n (bound 8, Thm 4.3); pMoE flat (bound 0, Thm 4.2); CNN/pMoE: 1 in log(n/l)
    assert sl.loc[("n_patches", "cnn"), "exponent"] == pytest.approx(1.0, abs=1e-9)
    assert sl.loc[("n_patches", "pmoe"), "exponent"] == pytest.approx(0.0, abs=1e-9)
    assert sl.loc[("n/l", "cnn/pmoe"), "exponent"] == pytest.approx(1.0, abs=1e-9)
    assert list(sl.loc[[("n_patches", "cnn"), ("n_patches", "pmoe"), ("n/l", "cnn/pmoe")], "theory_bound"]) == [8, 0, 8]


def test_sweep_slopes_recover_a_known_power_law():
    """Error = c * l^0.5 for l >= l* (and k^0.2 where Assumption 4.4 holds): the OLS slopes are 0.5 / 0.2.

    Runs scatter symmetrically around the law, so the mean error is exactly on it; the bootstrap CI must
    contain the true exponent. Below l* (and at k with maxgate < 0.95) the points are off the law and must
    be excluded.
    """
    rows = []
    for run, eps in enumerate((-0.01, 0.0, 0.01) * 4):
        for l in (2, 6, 8, 12, 15):
            acc = 0.5 if l < 6 else 1 - 0.05 * l**0.5 + eps
            rows.append({"sweep": "l", "k": 8, "l": l, "run": run, "n_train": 64, "accuracy": acc,
                         "routing_maxgate": 1.0, "l_star": 6, "epochs_run": 3})
        for k in (1, 4, 8, 20, 40):
            acc = 0.5 if k == 1 else 1 - 0.05 * k**0.2 + eps
            rows.append({"sweep": "k", "k": k, "l": 6, "run": run, "n_train": 64, "accuracy": acc,
                         "routing_maxgate": 0.5 if k == 1 else 1.0, "l_star": 6, "epochs_run": 3})
    sweeps = pd.DataFrame(rows)
    out = paper.sweep_slopes(sweeps, n_resamples=300).set_index("sweep")
    assert out.loc["l", "slope"] == pytest.approx(0.5, abs=1e-9) and out.loc["l", "range_min"] == 6
    assert out.loc["k", "slope"] == pytest.approx(0.2, abs=1e-9) and out.loc["k", "range_min"] == 4
    assert out.loc["l", "ci_low"] <= 0.5 <= out.loc["l", "ci_high"]
    assert out.loc["k", "ci_low"] <= 0.2 <= out.loc["k", "ci_high"]
    assert list(out.loc[["k", "l"], "theory"]) == [0.25, 0.375]
    summ = paper.summarise_sweeps(sweeps)
    assert len(summ) == 10 and (summ["runs"] == 12).all()
    l6 = summ[(summ["sweep"] == "l") & (summ["value"] == 6)].iloc[0]
    assert l6["accuracy_mean"] == pytest.approx(1 - 0.05 * 6**0.5, abs=1e-12)
