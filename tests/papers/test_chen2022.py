"""moestat.papers.chen2022: the paper's tables, reference points, success criteria and its Study cell; and
moestat.deep.metrics.dispatch_spread (moved here from the cluster-moe vignette)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import moestat as ms
from moestat.cells import CellContext
from moestat.deep import fit_cluster_moe
from moestat.deep.metrics import dispatch_entropy, dispatch_spread
from moestat.papers import chen2022

CELL = "moestat.papers.chen2022:cluster_cell"


# ------------------------------------------------------------------------------------------- dispatch_spread

def test_dispatch_spread_by_hand():
    # replicate 0: each cluster on its own expert (6 of 8 idle); replicate 1: cluster 0 split 50/50 over
    # experts 0 and 1, expert 1 also gets all of cluster 1 -> purity (50 + 100) / 200
    counts = np.zeros((2, 2, 8))
    counts[0, 0, 0], counts[0, 1, 3] = 100, 100
    counts[1, 0, 0], counts[1, 0, 1], counts[1, 1, 1] = 50, 50, 100
    spread, purity = dispatch_spread(counts)
    np.testing.assert_allclose(spread, [1.0, 1.5])
    np.testing.assert_allclose(purity, [1.0, 0.75])
    # the threshold is strict: a 4% share (4 of 100) does not count at 5%, does at 3%
    one = np.array([[96.0, 4.0], [0.0, 100.0]])
    assert dispatch_spread(one)[0].tolist() == [1.0] and dispatch_spread(one, threshold=0.03)[0].tolist() == [1.5]


def test_dispatch_spread_against_a_loop():
    counts = np.random.default_rng(3).integers(0, 30, size=(5, 4, 8)) * (np.random.default_rng(4).random((5, 4, 8))
                                                                         < 0.4)
    spread, purity = dispatch_spread(counts, threshold=0.1)
    for r in range(5):
        per_cluster = [sum(counts[r, k, m] / max(counts[r, k].sum(), 1) > 0.1 for m in range(8)) for k in range(4)]
        assert spread[r] == pytest.approx(np.mean(per_cluster))
        assert purity[r] == pytest.approx(sum(max(counts[r, :, m]) for m in range(8)) / counts[r].sum())


@pytest.mark.parametrize("bad, match", [(np.zeros(3), "shape"), (-np.ones((1, 2, 2)), "non-negative"),
                                        (np.ones((1, 2, 2, 2)), "shape")])
def test_dispatch_spread_refuses_bad_counts(bad, match):
    with pytest.raises(ValueError, match=match):
        dispatch_spread(bad)
    with pytest.raises(ValueError, match=r"threshold=1\.5"):
        dispatch_spread(np.ones((2, 2)), threshold=1.5)


# ------------------------------------------------------------------------------------------- the paper's numbers

def test_tables_hold_the_papers_values():
    # literal values read off chen2022 Table 3 (setting 1, nonlinear MoE; setting 3, single cubic CNN) and Table 9
    t3 = chen2022.TABLE3.set_index(["setting", "model"])
    assert tuple(t3.loc[(1, "moe-cubic"), ["paper_accuracy", "paper_accuracy_sd", "paper_entropy",
                                            "paper_entropy_sd"]]) == (99.46, 0.55, 0.098, 0.087)
    assert t3.loc[(3, "single-cubic"), "paper_accuracy"] == 72.69
    assert len(chen2022.TABLE3) == 16 and set(chen2022.TABLE3["ablation"]) == {"none"}
    t9 = chen2022.TABLE9.set_index("setting")
    assert tuple(t9.loc[1, ["paper_accuracy", "paper_accuracy_sd"]]) == (93.81, 1.02)
    assert len(chen2022.PAPER_RESULTS) == 20


def test_thm41_settings_are_those_with_equal_alpha_and_gamma_laws():
    from moestat.simulators.clusters import SETTINGS, ClusterConfig

    equal = tuple(s for s, cfg in sorted(SETTINGS.items()) if ClusterConfig(**cfg).alpha_gamma_equal)
    assert equal == chen2022.THM41_SETTINGS and chen2022.THM41_CEILING == 7 / 8


# ------------------------------------------------------------------------------------------- reference points

def test_oracles_reach_their_reference_accuracies():
    data = ms.simulate_clusters(setting=3, n=4000, reps=2, seed=11)
    acc = chen2022.oracle_accuracy(data).set_index(["model", "rep"])["accuracy"]
    assert (acc.loc["oracle-moe"] > 0.99).all()
    # the step predictor is right exactly when eps = y, y = 1 or k > k' (clusters 0-based here): count those
    # examples directly (the Gaussian patch crosses its thresholds on well under 2% of examples at sigma_p = 1)
    right = (data.eps == data.y) | (data.y == 1) | (data.cluster > data.noise_cluster)
    np.testing.assert_allclose(acc.loc["oracle-patch-additive"], right.mean(axis=1), atol=0.02)
    # and that share is 7/8: 0.02 is ~4 binomial SEs at n = 4000 (SE = sqrt(0.875 * 0.125 / 4000) = 0.0052)
    np.testing.assert_allclose(right.mean(axis=1), chen2022.THM41_CEILING, atol=0.02)
    with pytest.raises(ValueError, match="oracles contains 'oracle-x'"):
        chen2022.oracle_accuracy(data, ["oracle-x"])


def test_signal_span_optimum_respects_thm41():
    res = chen2022.signal_span_optimum(3, n=10_000, restarts=2, iters=60)
    assert list(res["family"]) == ["linear", "cubic", "cubic-bias"]
    # every family is patch-additive, so in setting 3 (D_alpha = D_gamma) accuracy <= 7/8; 0.015 is 3 SEs of an
    # accuracy on the 5,000 hold-out examples (SE = sqrt(0.875 * 0.125 / 5000) = 0.0047)
    assert (res["holdout_accuracy"] <= chen2022.THM41_CEILING + 0.015).all()
    assert (res["holdout_accuracy"] > 0.6).all()  # the search finds something well above chance (0.5)
    with pytest.raises(ValueError, match="restarts=0"):
        chen2022.signal_span_optimum(3, n=100, restarts=0)


# ------------------------------------------------------------------------------------------- success criteria

def _rows() -> pd.DataFrame:
    """Two settings, a cubic MoE with and without load balancing, a single CNN; hand-chosen numbers."""
    rows = []
    for s in (1, 3):
        for run, (a0, a1, e0, e1) in enumerate([(0.90, 0.93, 0.5, 0.4), (0.95, 0.94, 0.3, 0.1),
                                                (0.99, 0.97, 0.1, 0.2)]):
            rows.append(dict(setting=s, model="moe-cubic", ablation="none", load_balance=0.0, run=run, accuracy=a0,
                             dispatch_entropy=e0, n_test=1000))
            rows.append(dict(setting=s, model="moe-cubic", ablation="load-balance", load_balance=0.1, run=run,
                             accuracy=a1, dispatch_entropy=e1, n_test=1000))
            rows.append(dict(setting=s, model="single-cubic", ablation="none", load_balance=0.0, run=run,
                             accuracy=0.70 + 0.1 * run, dispatch_entropy=np.nan, n_test=1000))
    return pd.DataFrame(rows)


def test_summarize_by_hand_and_next_to_the_paper():
    summ = chen2022.summarize(_rows()).set_index(["setting", "model", "ablation"])
    row = summ.loc[(3, "moe-cubic", "none")]
    assert row["runs"] == 3
    assert row["accuracy"] == pytest.approx((90 + 95 + 99) / 3)
    assert row["accuracy_sd"] == pytest.approx(np.sqrt(((90 - 94.667) ** 2 + (95 - 94.667) ** 2 + (99 - 94.667) ** 2)
                                                       / 2), abs=1e-3)
    assert row["dispatch_entropy"] == pytest.approx(0.3)
    assert row["paper_accuracy"] == 99.99 and row["paper_entropy"] == 0.008  # Table 3, setting 3
    assert np.isnan(summ.loc[(3, "moe-cubic", "load-balance"), "paper_accuracy"])  # Table 9 is the linear MoE only
    with pytest.raises(ValueError, match="lacks the columns"):
        chen2022.summarize(_rows().drop(columns="accuracy"))


def test_ablation_effects_match_a_paired_t_test():
    eff = chen2022.ablation_effects(_rows()).set_index(["setting", "model", "metric"])
    rows = _rows().query("setting == 1 and model == 'moe-cubic'")
    with_lb = rows.query("ablation == 'load-balance'")["accuracy"].to_numpy()
    without = rows.query("ablation == 'none'")["accuracy"].to_numpy()
    ci = stats.ttest_rel(with_lb, without).confidence_interval(0.95)
    got = eff.loc[(1, "moe-cubic", "accuracy")]
    assert got["runs"] == 3 and got["mean_difference"] == pytest.approx(np.mean(with_lb - without))
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert set(eff.index.get_level_values("metric")) == {"accuracy", "dispatch_entropy"}  # the columns present
    with pytest.raises(ValueError, match=r"confidence_level=1\.5"):
        chen2022.ablation_effects(_rows(), confidence_level=1.5)


def test_ceiling_checks_take_single_cnns_of_the_thm41_settings():
    rows = _rows()
    rows.loc[(rows["model"] == "single-cubic") & (rows["run"] == 2) & (rows["setting"] == 3), "accuracy"] = 0.95
    chk = chen2022.ceiling_checks(rows)
    assert set(chk["setting"]) == {3} and set(chk["model"]) == {"single-cubic"} and len(chk) == 3
    # one-sided 99% Clopper-Pearson lower bound = the lower end of the two-sided 98% exact interval
    for _, r in chk.iterrows():
        low = stats.binomtest(round(r["accuracy"] * 1000), 1000).proportion_ci(0.98, method="exact").low
        assert r["lower_bound"] == pytest.approx(low, rel=1e-9) and r["consistent"] == (low <= 0.875)
    assert chk["consistent"].tolist() == [True, True, False]  # 95% of 1,000 is far above 87.5%
    assert chen2022.ceiling_checks(rows[rows["setting"] == 1]).empty


# ------------------------------------------------------------------------------------------- the Study cell

def _ctx(data: dict, options: dict, label: str = "m", n: int = 60, reps: int = 2) -> CellContext:
    seq = np.random.SeedSequence(5, spawn_key=(0, 1, n))
    return CellContext(truth_cfg={"label": "t", "data": data}, fit_cfg={"label": label, "options": options}, n=n,
                       reps=reps, data_seed=seq, fit_seed=seq, metric_seed=seq, device="cpu")


def test_cluster_cell_runs_in_a_study_and_matches_a_direct_fit(tmp_path):
    moe = dict(kind="moe", activation="cubic", M=4, J=4, T=6, eval_every=3, dtype="float64")
    study = ms.Study(truth={"label": "s", "data": {"setting": 3, "n_test": 100, "data_seed": 7, "model_seed": 8}},
                     fit=[{"label": "moe-cubic", "options": moe},
                          {"label": "single-linear", "options": dict(kind="single", activation="linear", J=4, T=4)},
                          {"label": "oracle-moe", "options": {"kind": "oracle", "oracle": "moe"}}],
                     n=[60], reps=2, seed=1, cell=CELL, device="cpu", threads=1)
    frame = study.run(tmp_path, progress=False).set_index(["model", "rep"])
    assert (frame["status"] == "ok").all() and len(frame) == 6
    # the cell's wiring: the same numbers as simulating and fitting by hand with the data table's seeds
    train, test = ms.simulate_clusters(setting=3, n=160, reps=2, seed=7).split(60)
    direct = fit_cluster_moe(train, test=test, seed=8, device="cpu", **{k: v for k, v in moe.items() if k != "kind"})
    np.testing.assert_array_equal(frame.loc["moe-cubic", "accuracy"], direct.evaluate(test)["accuracy"])
    np.testing.assert_array_equal(frame.loc["moe-cubic", "train_accuracy"], direct.evaluate(train)["accuracy"])
    assert (frame.loc["oracle-moe", "n_train"] == 0).all() and (frame.loc["oracle-moe", "accuracy"] > 0.9).all()
    assert frame.loc["single-linear", "dispatch_entropy"].isna().all() and (frame["truth_setting"] == 3).all()
    # pieces: the final dispatch table recounts the test split, and its entropy (by a loop) is the row's
    disp = study.pieces("dispatch", checkpoint=tmp_path)
    assert set(disp["model"]) == {"moe-cubic"} and (disp.groupby("rep")["count"].sum() == 100).all()
    for r, tab in disp.groupby("rep"):
        n = tab.pivot(index="cluster", columns="expert", values="count").to_numpy(float)
        h = -sum(n[k, m] / n.sum() * np.log(n[k, m] / n[:, m].sum()) for k in range(n.shape[0])
                 for m in range(n.shape[1]) if n[k, m] > 0)
        assert frame.loc[("moe-cubic", r), "dispatch_entropy"] == pytest.approx(h, rel=1e-12)
        assert dispatch_entropy(n) == pytest.approx(h, rel=1e-12)
    hist = study.pieces("history", checkpoint=tmp_path)
    assert set(hist["model"]) == {"moe-cubic", "single-linear"} and set(hist["iteration"]) >= {0, 3, 6}
    assert set(study.pieces("alignment", checkpoint=tmp_path)["component"]) == {"expert", "router"}


def test_cluster_cell_default_seeds_pair_the_fits_of_a_truth():
    # without data_seed/model_seed the study's data stream seeds both; at iteration 0 (the initialisation, recorded
    # in the history) two fits that differ only in the load-balancing coefficient must agree exactly (same test
    # data, same W0)
    fits = [{"label": f"moe-{a}", "options": dict(kind="moe", M=4, J=4, T=3, load_balance=a)} for a in (0.0, 5.0)]
    study = ms.Study(truth={"label": "s", "data": {"setting": 1, "n_test": 80}}, fit=fits, n=[40], reps=2, seed=3,
                     cell=CELL, device="cpu")
    frame = study.run(progress=False)
    hist = study.pieces("history").query("split == 'test' and iteration == 0")
    a, b = (hist[hist["fit"] == f].sort_values(["rep", "metric"])["value"].to_numpy() for f in ("moe-0.0", "moe-5.0"))
    assert len(a) == 2 * 3 and np.array_equal(a, b)  # accuracy, dispatch entropy, dead experts of 2 replicates
    assert frame.query("fit == 'moe-5.0'")["ablation"].eq("load-balance").all()
    assert frame.query("fit == 'moe-0.0'")["ablation"].eq("none").all()
    # another master seed gives other data
    other = ms.Study(truth={"label": "s", "data": {"setting": 1, "n_test": 80}}, fit=fits[:1], n=[40], reps=2, seed=4,
                     cell=CELL, device="cpu")
    other.run(progress=False)
    c = other.pieces("history").query("split == 'test' and iteration == 0").sort_values(["rep", "metric"])["value"]
    assert not np.array_equal(c.to_numpy(), a)


@pytest.mark.parametrize("data, options, match", [
    ({"setting": 1, "n_test": 50, "sigma": 1}, {"kind": "moe"}, "data knobs \\['sigma'\\]"),
    ({"n_test": 50}, {"kind": "moe"}, "needs 'setting'"),
    ({"setting": 1, "n_test": 50}, {"kind": "deep"}, "options.kind='deep'"),
    ({"setting": 1, "n_test": 50}, {"kind": "moe", "optimizer": "adam"}, "options \\['optimizer'\\]"),
    ({"setting": 1, "n_test": 50}, {"kind": "oracle", "oracle": "bayes"}, "oracle='bayes'"),
])
def test_cluster_cell_refuses_bad_settings(data, options, match):
    with pytest.raises(ValueError, match=match):
        chen2022.cluster_cell(_ctx(data, options))
