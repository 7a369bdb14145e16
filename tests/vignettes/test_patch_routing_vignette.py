"""Smoke test of the patch-routing vignette (loaded through the vignette index) on a configuration smaller than
--quick (--quick itself: ~35 s). Its science is tested in tests/papers/test_chowdhury2023.py and
tests/rates/test_ratios.py."""

import time

import pandas as pd
import pytest

import moestat._vignette_index as vindex

pytest.importorskip("moestat.rates", reason="the vignette's sample-complexity step uses moestat.rates")


def _load():
    return vindex.load(vindex.find("patch-routing"))


def _stamps(folder):
    return {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.glob("*/cells/*.parquet")}


def test_import_computes_nothing_and_defines_the_contract(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    mod = _load()
    assert time.perf_counter() - t0 < 5
    assert mod.NAME == "patch-routing" and isinstance(mod.TITLE, str) and callable(mod.run)
    assert list(tmp_path.iterdir()) == []
    cfg = mod.config(quick=False)
    # every block is one study: truth = the data setting, fits = the models, n = the training sizes
    for block in cfg["blocks"]:
        study = mod.block_study(cfg, block)
        assert study.n == block["grid"] and study.reps == block["runs"]
        assert [f["label"] for f in study.fits] == block["models"]
    sweeps = mod.sweep_study(cfg)
    assert len(sweeps.fits) == len(cfg["sweeps"]["k_grid"]) + len(cfg["sweeps"]["l_grid"])


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
    mod.run(tmp_path, quick=True, parts=("blocks",))
    res = pd.read_csv(tmp_path / "results.csv")
    assert {"model", "run", "n_train", "accuracy", "variant", "l", "n_patches", "cell"} <= set(res.columns)
    assert set(res["model"]) == {"pmoe", "cnn"} and set(res["variant"]) == {"synthetic", "digits"}
    assert res["accuracy"].between(0, 1).all()
    # one row per (block, model, run, size)
    n_fits = sum(len(b["models"]) for b in small["blocks"])
    assert len(res) == n_fits * 2 * 5
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert {"n_star", "ratio", "scaling"} <= set(rates["kind"])
    for name in ("accuracy_vs_n.png", "nstar_vs_n_over_l.png", "provenance.json"):
        assert (tmp_path / name).exists()
    assert len(list((tmp_path / "study").iterdir())) == len(small["blocks"])
    # resume: a second call reuses the saved study cells (no retraining) and reproduces the same results
    stamps = _stamps(tmp_path / "study")
    assert len(stamps) == n_fits * 5
    mod.run(tmp_path, quick=True, parts=("blocks",))
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "results.csv"), res)
    assert _stamps(tmp_path / "study") == stamps


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
    assert list(sw.columns[:3]) == ["sweep", "k", "l"]
    assert sw["accuracy"].between(0, 1).all() and sw["routing_maxgate"].between(0, 1).all()
    # one row per (knob value, run, N); the other knob stays at the paper's joint setting k = 8, l = 6
    for knob, other, grid, fixed in (("k", "l", [1, 4], 6), ("l", "k", [2, 6], 8)):
        sub = sw[sw["sweep"] == knob]
        assert len(sub) == len(grid) * 2 * 2
        assert not sub.duplicated([knob, "run", "n_train"]).any()
        assert sorted(sub[knob].unique()) == grid and set(sub[other]) == {fixed}
        assert set(sub["n_train"]) == {16, 32} and set(sub["model"]) == {"pmoe-joint"}
    assert set(sw["l_star"]) == {6}
    summ = pd.read_csv(tmp_path / "sweeps_summary.csv")
    assert len(summ) == 4 * 2 and (summ["runs"] == 2).all()
    assert (tmp_path / "sweep_k_l.png").exists() and (tmp_path / "sweep_slopes.csv").exists()
    stamps = _stamps(tmp_path / "study")
    assert len(stamps) == 4 * 2
    mod.run(tmp_path, quick=True, parts=("sweeps",))
    assert _stamps(tmp_path / "study") == stamps
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "sweeps.csv"), sw)


def test_run_rejects_unknown_parts(tmp_path):
    with pytest.raises(ValueError, match="parts must be"):
        _load().run(tmp_path, quick=True, parts=("figures",))
