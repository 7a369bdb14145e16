"""The contaminated-moe vignette (yan2025_contaminated): its pre-specified design, the decision rule, and a tiny
size run end to end and resumed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from .conftest import load_vignette

TINY = {"n": [300, 600, 1200], "reps": 3}


@pytest.fixture
def mod():
    return load_vignette("contaminated-moe")


@pytest.fixture
def tiny(mod, monkeypatch):
    monkeypatch.setitem(mod.SIZES, "quick", dict(TINY))
    return mod


def test_design_is_prespecified(mod):
    assert mod.NAME == "contaminated-moe" and mod.TITLE and callable(mod.run)
    quick, full = mod.SIZES["quick"], mod.SIZES["full"]
    # quick: >= 5 sample sizes over >= 1 decade (the verdict's minimum); full: two decades, more replicates
    assert len(quick["n"]) >= 5 and max(quick["n"]) / min(quick["n"]) >= 10 and quick["reps"] >= 20
    assert max(full["n"]) / min(full["n"]) >= 100 and full["reps"] > quick["reps"]
    study = mod.make_studies("full")["study"]
    assert [t["label"] for t in study.truths] == list(mod.paper.SETTINGS)
    (fit,) = study.fits
    assert fit["options"]["init"] == ["near_truth", "ols", "random"] and fit["options"]["method"] == "newton"
    assert study.n == full["n"] and study.reps == full["reps"]
    assert mod.responses("dist_vanishing") == ["lam_err", "prompt_err", "loss_dist"]
    assert mod.responses("softmax_nondist_merging") == ["gate_err", "prompt_err", "loss_nondist"]
    with pytest.raises(ValueError, match="size='huge'"):
        mod.make_studies("huge")


def test_decision_rule(mod):
    assert mod.decide(0.4, 0.6, 0.5, "power law") == "agrees"
    assert mod.decide(0.1, 0.9, 0.5, "imprecise") == "agrees"
    assert mod.decide(0.55, 0.7, 0.5, "power law") == "faster"
    assert mod.decide(0.2, 0.45, 0.5, "curved: exponent is local") == "slower"
    assert mod.decide(0.2, 0.45, 0.5, "range too narrow") == "undecided (range too narrow)"
    assert mod.decide(0.2, 0.45, np.nan, "power law") == ""


def test_tiny_size_runs_and_resumes(tiny, tmp_path):
    frame = tiny.run(tmp_path, quick=True, workers=1, progress=False)
    for f in ["results.csv", "rates.csv", "design.csv", "windows.csv", "calibration.csv", "fits.csv", "rates.png",
              "provenance.json"]:
        assert (tmp_path / f).is_file(), f
    assert len(frame) == 5 * 3 * 3 and set(frame["truth"]) == set(tiny.paper.SETTINGS)
    assert (frame["prompt_err"] > 0).all()
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert len(rates) == 5 * 3 and (rates["verdict"] == "range too narrow").all()  # 3 n values, 0.6 decade
    assert (rates["vs_design"] == "undecided (range too narrow)").all()
    # the theory's limit per row is the paper's predicted_exponent (e.g. 1/2 - 2/6 for lambda under merging)
    row = rates[(rates["setting"] == "nondist_merging") & (rates["response"] == "lam_err")].iloc[0]
    assert row["theory_exponent"] == pytest.approx(1 / 6) and 1 / 6 < row["design_exponent"] < 0.5
    calib = pd.read_csv(tmp_path / "calibration.csv")
    assert len(calib) == 5 * 3 * 3 and (calib["predicted"] > 0).all() and (calib["replicates"] == 3).all()
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["sizes"]["n"] == TINY["n"] and prov["config"]["seed"] == tiny.SEED
    cells = sorted((tmp_path / "study" / "cells").glob("*.parquet"))
    stamps = [p.stat().st_mtime_ns for p in cells]
    again = tiny.run(tmp_path, quick=True, workers=1, progress=False)
    assert [p.stat().st_mtime_ns for p in cells] == stamps  # resumed: no cell recomputed
    pd.testing.assert_frame_equal(again.reset_index(drop=True), frame.reset_index(drop=True))
