"""Smoke test of vignettes/patch-routing.py on a configuration smaller than --quick (--quick itself: ~35 s)."""

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("moestat.rates", reason="the vignette's sample-complexity step uses moestat.rates")

VIGNETTE = Path(__file__).resolve().parents[1] / "vignettes" / "patch-routing.py"


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
    cfg.update(max_epochs=10, n_test=200, n_boot=200)
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
