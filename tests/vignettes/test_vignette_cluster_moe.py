"""Smoke test of vignettes/cluster-moe.py on a tiny internal size (the --quick size runs in CI separately)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

VIGNETTE = Path(__file__).resolve().parents[2] / "vignettes" / "cluster-moe.py"


def _load():
    spec = importlib.util.spec_from_file_location("cluster_moe_vignette", VIGNETTE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # importing computes nothing
    return mod


def test_vignette_runs_and_resumes(tmp_path, monkeypatch):
    mod = _load()
    assert mod.NAME == "cluster-moe" and callable(mod.run)
    tiny = dict(mod.SIZES["quick"], runs=2, n_train=120, n_test=200, T_moe=20, T_single=10, J_single=8,
                eval_every=10)
    monkeypatch.setitem(mod.SIZES, "quick", tiny)
    threads = torch.get_num_threads()
    mod.run(tmp_path, quick=True)
    assert torch.get_num_threads() == threads  # restored
    res = pd.read_csv(tmp_path / "results.csv")
    assert {"model", "run", "n_train", "accuracy", "dispatch_entropy"} <= set(res.columns)
    models = set(res["model"])
    assert {"moe-cubic", "moe-linear", "single-cubic", "single-linear", "oracle-moe"} <= models
    moe = res[res["model"].str.startswith("moe")]
    assert moe["dispatch_entropy"].between(0, 1.4).all() and res["accuracy"].between(0, 1).all()
    assert len(res.query("model == 'moe-cubic' and ablation == 'none'")) == 2 * 2  # 2 settings x 2 runs
    lb = res.query("ablation == 'load-balance'")
    assert set(lb["model"]) == {"moe-cubic", "moe-linear"} and set(lb["setting"]) == {1} and len(lb) == 2 * 2
    assert lb["load_entropy"].between(0, np.log(8) + 1e-12).all() and (lb["load_balance"] > 0).all()
    assert moe["experts_per_cluster"].between(1, 8).all() and moe["expert_purity"].between(0.25, 1).all()
    eff = pd.read_csv(tmp_path / "ablation_effects.csv")
    assert set(eff["metric"]) >= {"accuracy", "dispatch_entropy", "load_entropy"} and (eff["runs"] == 2).all()
    assert (eff["ci_low"] <= eff["mean_difference"]).all() and (eff["mean_difference"] <= eff["ci_high"]).all()
    cub = res.query("setting == 1 and model == 'moe-cubic'")
    acc = cub.groupby("ablation")["accuracy"].mean()
    direct = acc["load-balance"] - acc["none"]
    got = eff.query("model == 'moe-cubic' and metric == 'accuracy'")["mean_difference"].item()
    assert np.isclose(got, direct)
    for fig in ("accuracy.png", "dispatch_entropy.png", "alignment.png", "dispatch_tables.png", "load_balance.png"):
        assert (tmp_path / fig).stat().st_size > 0
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["size"] == "quick" and prov["config"]["n_train"] == 120
    # resume: finished cells are read back, not refitted
    (piece,) = (tmp_path / "pieces").glob("setting1-moe-cubic-??????????.csv")  # name + hash of the settings
    stamp = piece.stat().st_mtime_ns
    mod.run(tmp_path, quick=True)
    assert piece.stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "results.csv"), res)


def test_signal_span_optimum_respects_thm41():
    mod = _load()
    res = mod.signal_span_optimum(3, n=20_000, restarts=2, iters=60)
    assert list(res["family"]) == ["linear", "cubic", "cubic-bias"]
    # every family is patch-additive, so in setting 3 (D_alpha = D_gamma) accuracy <= 7/8; 0.015 is 3 se of
    # an accuracy on the 10,000 hold-out examples
    assert (res["holdout_accuracy"] <= 0.875 + 0.015).all()
    assert (res["holdout_accuracy"] > 0.6).all()  # the search finds something well above chance


def test_dispatch_spread():
    mod = _load()
    # replicate 0: each cluster on its own expert (4 of 8 idle); replicate 1: cluster 0 split 50/50 over
    # experts 0 and 1, expert 1 also gets all of cluster 1 -> purity (50 + 100) / 200
    counts = np.zeros((2, 2, 8))
    counts[0, 0, 0], counts[0, 1, 3] = 100, 100
    counts[1, 0, 0], counts[1, 0, 1], counts[1, 1, 1] = 50, 50, 100
    spread, purity = mod.dispatch_spread(counts)
    np.testing.assert_allclose(spread, [1.0, 1.5])
    np.testing.assert_allclose(purity, [1.0, 0.75])
