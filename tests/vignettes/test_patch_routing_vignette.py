"""Smoke test of vignettes/patch-routing.py on a configuration smaller than --quick (--quick itself: ~35 s)."""

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("moestat.rates", reason="the vignette's sample-complexity step uses moestat.rates")

VIGNETTE = Path(__file__).resolve().parents[2] / "vignettes" / "patch-routing.py"


def _load():
    spec = importlib.util.spec_from_file_location("patch_routing_vignette", VIGNETTE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_import_computes_nothing_and_defines_the_contract(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mod = _load()
    assert mod.NAME == "patch-routing" and isinstance(mod.TITLE, str) and callable(mod.run)
    assert list(tmp_path.iterdir()) == []


def _small_config(mod):
    cfg = mod.config(quick=True)
    cfg.update(max_epochs=10, n_test=200, n_resamples=200)
    for block in cfg["blocks"]:
        block["grid"] = [8, 16, 32, 64, 128]
        block["runs"] = 2
    return cfg


def test_quick_run_writes_results_rates_figures_provenance(tmp_path, monkeypatch):
    mod = _load()
    small = _small_config(mod)
    monkeypatch.setattr(mod, "config", lambda quick=False: small)
    mod.run(tmp_path, quick=True)
    res = pd.read_csv(tmp_path / "results.csv")
    assert {"model", "run", "n_train", "accuracy", "variant", "l", "n_patches"} <= set(res.columns)
    assert set(res["model"]) == {"pmoe", "cnn"} and set(res["variant"]) == {"synthetic", "digits"}
    assert res["accuracy"].between(0, 1).all()
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert {"n_star", "ratio", "scaling"} <= set(rates["kind"])
    for name in ("accuracy_vs_n.png", "nstar_vs_n_over_l.png", "provenance.json"):
        assert (tmp_path / name).exists()
    # resume: a second call reuses the saved cells (no retraining) and reproduces the same results
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").iterdir()}
    mod.run(tmp_path, quick=True)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "results.csv"), res)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").iterdir()} == stamps


def _sweep_config(mod):
    cfg = mod.config(quick=True)
    cfg.update(max_epochs=8, n_test=200)
    cfg["sweeps"].update(sizes=[16, 32], runs=2, k_grid=[1, 4], l_grid=[2, 6])
    return cfg


def test_sweeps_write_one_row_per_knob_value_run_and_size(tmp_path, monkeypatch):
    mod = _load()
    cfg = _sweep_config(mod)
    monkeypatch.setattr(mod, "config", lambda quick=False: cfg)
    mod.run(tmp_path, quick=True, parts=("sweeps",))
    assert not (tmp_path / "results.csv").exists()   # the blocks part did not run
    sw = pd.read_csv(tmp_path / "sweeps.csv")
    assert {"sweep", "k", "l", "run", "n_train", "accuracy", "routing_maxgate", "l_star"} <= set(sw.columns)
    assert sw["accuracy"].between(0, 1).all() and sw["routing_maxgate"].between(0, 1).all()
    # one row per (knob value, run, N); the other knob stays at the paper's joint setting k = 8, l = 6
    for knob, other, grid, fixed in (("k", "l", [1, 4], 6), ("l", "k", [2, 6], 8)):
        sub = sw[sw["sweep"] == knob]
        assert len(sub) == len(grid) * 2 * 2
        assert not sub.duplicated([knob, "run", "n_train"]).any()
        assert sorted(sub[knob].unique()) == grid and set(sub[other]) == {fixed}
        assert set(sub["n_train"]) == {16, 32} and set(sub["model"]) == {"pmoe-joint"}
    # 5 confusers closer to o_1 in every sample: Definition D.3 gives l* = 6, as in the paper's Fig. 7
    assert set(sw["l_star"]) == {6}
    summ = pd.read_csv(tmp_path / "sweeps_summary.csv")
    assert len(summ) == 4 * 2 and (summ["runs"] == 2).all()
    assert (tmp_path / "sweep_k_l.png").exists() and (tmp_path / "sweep_slopes.csv").exists()
    # resume: the saved cells are reused, not retrained
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").iterdir()}
    mod.run(tmp_path, quick=True, parts=("sweeps",))
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").iterdir()} == stamps
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "sweeps.csv"), sw)


def test_sweep_rejects_l_not_below_n_and_bad_knobs(tmp_path):
    mod = _load()
    cfg = _sweep_config(mod)
    cfg["sweeps"].update(sizes=[16], runs=1)
    n = cfg["sweeps"]["n_patches"]
    for l in (n, n + 1):   # expert-choice top-l needs l < n
        with pytest.raises(ValueError, match="must be smaller than the number of patches"):
            mod.run_sweep_cell(cfg, "l", l)
    with pytest.raises(ValueError, match="multiple of k"):   # m = 40 neurons split over k experts
        mod.run_sweep_cell(cfg, "k", 3)
    with pytest.raises(ValueError, match="knob must be"):
        mod.run_sweep_cell(cfg, "m", 4)
    with pytest.raises(ValueError, match="parts must be"):
        mod.run(tmp_path, quick=True, parts=("figures",))


def test_sweep_slopes_recover_a_known_power_law():
    """Error = c * l^0.5 for l >= l* (and k^0.2 where Assumption 4.4 holds): the OLS slopes are 0.5 / 0.2.

    Runs scatter symmetrically around the law, so the mean error is exactly on it; the bootstrap CI must
    contain the true exponent. Below l* (and at k with maxgate < 0.95) the points are off the law and must
    be excluded.
    """
    mod = _load()
    rows = []
    for run, eps in enumerate((-0.01, 0.0, 0.01) * 4):
        for l in (2, 6, 8, 12, 15):
            acc = 0.5 if l < 6 else 1 - 0.05 * l**0.5 + eps
            rows.append({"sweep": "l", "k": 8, "l": l, "run": run, "n_train": 64, "accuracy": acc,
                         "routing_maxgate": 1.0, "l_star": 6})
        for k in (1, 4, 8, 20, 40):
            acc = 0.5 if k == 1 else 1 - 0.05 * k**0.2 + eps
            rows.append({"sweep": "k", "k": k, "l": 6, "run": run, "n_train": 64, "accuracy": acc,
                         "routing_maxgate": 0.5 if k == 1 else 1.0, "l_star": 6})
    out = mod.sweep_slopes(pd.DataFrame(rows), n_resamples=300).set_index("sweep")
    assert out.loc["l", "slope"] == pytest.approx(0.5, abs=1e-9) and out.loc["l", "range_min"] == 6
    assert out.loc["k", "slope"] == pytest.approx(0.2, abs=1e-9) and out.loc["k", "range_min"] == 4
    assert out.loc["l", "ci_low"] <= 0.5 <= out.loc["l", "ci_high"]
    assert out.loc["k", "ci_low"] <= 0.2 <= out.loc["k", "ci_high"]
    assert list(out.loc[["k", "l"], "theory"]) == [0.25, 0.375]
