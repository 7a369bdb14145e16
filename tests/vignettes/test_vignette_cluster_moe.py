"""Smoke test of the cluster-moe vignette (chen2022 through moestat.Study) on a tiny internal size; the --quick
size runs in CI separately.  Its science (the cell, oracles, summaries, ablation effects, signal-span search,
dispatch spread) is tested in tests/papers/test_chen2022.py."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import moestat._vignette_index as vindex


@pytest.fixture
def vignette(monkeypatch):
    mod = vindex.load(vindex.find("cluster-moe"))
    tiny = dict(mod.SIZES["quick"], runs=2, n_train=120, n_test=200, T_moe=20, T_single=10, J_single=8,
                eval_every=10)
    monkeypatch.setitem(mod.SIZES, "quick", tiny)
    return mod


def test_studies_hold_the_settings_models_and_ablation(vignette):
    studies = vignette.make_studies("quick")
    assert list(studies) == ["study", "study-lb0.1"]
    main, lb = studies["study"], studies["study-lb0.1"]
    assert [t["data"]["setting"] for t in main.truths] == [1, 3] and main.n == [120] and main.reps == 2
    assert [f["label"] for f in main.fits] == ["oracle-moe", "oracle-patch-additive", "moe-cubic", "moe-linear",
                                               "single-cubic", "single-linear"]
    assert [t["data"]["setting"] for t in lb.truths] == [1]
    assert {f["options"]["load_balance"] for f in lb.fits} == {0.1}
    # the ablation's truth is the main study's setting 1: same data and model seeds (a paired comparison)
    assert lb.truths[0]["data"] == main.truths[0]["data"]
    full = vignette.make_studies("full")
    assert set(full) == {"study", "study-lb0.1", "study-lb0.001"}
    assert [t["data"]["setting"] for t in full["study-lb0.001"].truths] == [1]
    with pytest.raises(ValueError, match="size='huge'"):
        vignette.make_studies("huge")


def test_vignette_runs_and_resumes(vignette, tmp_path):
    mod = vignette
    assert mod.NAME == "cluster-moe" and callable(mod.run)
    threads = torch.get_num_threads()
    mod.run(tmp_path, quick=True)
    assert torch.get_num_threads() == threads  # restored
    res = pd.read_csv(tmp_path / "results.csv")
    assert {"model", "run", "n_train", "accuracy", "dispatch_entropy", "study", "cell", "truth_setting"} <= set(
        res.columns)
    assert {"moe-cubic", "moe-linear", "single-cubic", "single-linear", "oracle-moe"} <= set(res["model"])
    assert (res["status"] == "ok").all()
    moe = res[res["model"].str.startswith("moe")]
    assert moe["dispatch_entropy"].between(0, 1.4).all() and res["accuracy"].between(0, 1).all()
    assert len(res.query("model == 'moe-cubic' and ablation == 'none'")) == 2 * 2  # 2 settings x 2 runs
    lb = res.query("ablation == 'load-balance'")
    assert set(lb["model"]) == {"moe-cubic", "moe-linear"} and set(lb["setting"]) == {1} and len(lb) == 2 * 2
    assert lb["load_entropy"].between(0, np.log(8) + 1e-12).all() and (lb["load_balance"] > 0).all()
    assert moe["experts_per_cluster"].between(1, 8).all() and moe["expert_purity"].between(0.25, 1).all()
    assert moe["init_all_groups_nonempty"].notna().all()
    eff = pd.read_csv(tmp_path / "ablation_effects.csv")
    assert set(eff["metric"]) >= {"accuracy", "dispatch_entropy", "load_entropy"} and (eff["runs"] == 2).all()
    cub = res.query("setting == 1 and model == 'moe-cubic'")
    acc = cub.groupby("ablation")["accuracy"].mean()
    got = eff.query("model == 'moe-cubic' and metric == 'accuracy'")["mean_difference"].item()
    assert np.isclose(got, acc["load-balance"] - acc["none"])
    summ = pd.read_csv(tmp_path / "summary.csv")
    assert {"paper_accuracy", "accuracy_sd", "expert_purity"} <= set(summ.columns)
    assert set(pd.read_csv(tmp_path / "ceiling_check.csv")["setting"]) == {3}
    for f in ("summary_by_init.csv", "summary_load_balance.csv", "accuracy.png", "dispatch_entropy.png",
              "alignment.png", "dispatch_tables.png", "load_balance.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["size"] == "quick" and prov["config"]["n_train"] == 120
    assert prov["config"]["studies"] == {"study": "cluster-moe", "study-lb0.1": "cluster-moe-lb0.1"}
    # resume: every study cell is read back, none refitted (their files keep their mtimes)
    cells = {p: p.stat().st_mtime_ns for p in tmp_path.glob("study*/cells/*.parquet")}
    assert len(cells) == 2 * 6 + 2
    mod.run(tmp_path, quick=True)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("study*/cells/*.parquet")} == cells
    again = pd.read_csv(tmp_path / "results.csv")
    pd.testing.assert_frame_equal(again.drop(columns="wall_time"), res.drop(columns="wall_time"))
