"""The cosine-router vignette (nguyen2025_cosine): its pre-specified design, a tiny size run end to end and resumed,
its decision rule, and the discrimination check deciding both ways on designs chosen to make it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import moestat._vignette_index as vindex

TINY = {"n": [300, 600, 1200], "reps": 3, "studies": 20}


@pytest.fixture
def mod():
    return vindex.load(vindex.find("cosine-router"))


@pytest.fixture
def tiny(mod, monkeypatch):
    monkeypatch.setitem(mod.SIZES, "quick", dict(TINY))
    return mod


def test_design_is_prespecified(mod):
    assert mod.NAME == "cosine-router" and mod.TITLE and callable(mod.run)
    quick, full = mod.SIZES["quick"], mod.SIZES["full"]
    # quick: >= 5 sample sizes over >= 1 decade (the verdict's minimum); full: two decades, more replicates
    assert len(quick["n"]) >= 5 and max(quick["n"]) / min(quick["n"]) >= 10 and quick["reps"] >= 20
    assert max(full["n"]) / min(full["n"]) >= 100 and full["reps"] > quick["reps"]
    studies = mod.make_studies("full")
    assert list(studies) == ["study"]
    study = studies["study"]
    assert [t["gate"] for t in study.truths] == ["cosine", "perturbed_cosine", "softmax"]
    assert {t["stream"] for t in study.truths} == {"paired"}  # one data stream: the routers see the same data
    assert {json.dumps(t["params"], sort_keys=True) for t in study.truths} == {
        json.dumps({k: list(v) for k, v in mod.paper.PARAMS.items()}, sort_keys=True)}
    (fit,) = study.fits
    assert fit["k"] == "truth" and fit.get("gate") is None  # each truth is fitted with its own router, k = k*
    assert fit["options"]["init"] == ["near_truth", "random"] and fit["options"]["optimizer"] == "lbfgs"
    assert study.n == full["n"] and study.reps == full["reps"]
    with pytest.raises(ValueError, match="size='huge'"):
        mod.make_studies("huge")


def _row(**kw):
    base = {"response": "l2", "kind": "upper_bound", "model": "power_log", "verdict": "power law",
            "ci_low": 0.4, "ci_high": 0.6, "theory_exponent": 0.5}
    return pd.Series({**base, **kw})


def test_decision_rule(mod):
    assert mod.decide(_row()) == "agrees"
    assert mod.decide(_row(verdict="imprecise", ci_low=0.1, ci_high=0.9)) == "agrees"
    assert mod.decide(_row(ci_low=0.55, ci_high=0.7)) == "faster than theory"
    assert mod.decide(_row(ci_low=0.2, ci_high=0.45)) == "slower than theory"
    assert mod.decide(_row(verdict="curved: exponent is local")) == "undecided (curved: exponent is local)"
    assert mod.decide(_row(model="power")) == ""  # the rule reads the theory's model only
    slow = {"kind": "slower_than_polynomial", "theory_exponent": np.nan, "model": "power"}
    assert mod.decide(_row(**slow)) == "polynomial rate"
    assert mod.decide(_row(**slow, verdict="imprecise")) == "no polynomial rate shown (imprecise)"
    assert mod.decide(_row(**slow, ci_low=-0.1)) == "no polynomial rate shown (power law)"
    assert mod.decide(_row(response=mod.NORM, verdict="no decay")) == "not identified (no decay)"


def test_discrimination_check_decides_both_ways(mod):
    """Six decades, 200 replicates and little noise tell (log n)^-1 from a power law; the quick design's 1.5
    decades with the replicate spread of real errors (sd 0.5 on the log scale) cannot."""
    wide = mod.discrimination_table(list(np.logspace(2, 8, 7).astype(int)), 200, 0.1, 20)
    narrow = mod.discrimination_table(mod.SIZES["quick"]["n"], 20, 0.5, 20)
    assert wide["discriminates"].all() and not narrow["discriminates"].any()
    # the apparent power exponent of tau / log n over the range grows with tau
    assert np.all(np.diff(narrow["power_exponent"].to_numpy()) > 0)


def test_tiny_size_runs_and_resumes(tiny, tmp_path):
    frame = tiny.run(tmp_path, quick=True, workers=1, progress=False)
    for f in ["results.csv", "rates.csv", "models.csv", "windows.csv", "design.csv", "discrimination.csv",
              "rates.png", "provenance.json"]:
        assert (tmp_path / f).is_file(), f
    assert len(frame) == 3 * 3 * 3 and set(frame["gate"]) == {"cosine", "perturbed_cosine", "softmax"}
    assert (frame["status"] == "ok").all() and (frame["l2"] > 0).all()
    norm = frame["err_exact_gate_norm"]
    assert norm[frame["gate"] == "cosine"].notna().all() and norm[frame["gate"] != "cosine"].isna().all()
    # paired data: every router's replicate r at n is fitted to the same inputs (same data seed)
    assert frame.groupby(["n", "rep"])["data_seed"].nunique().eq(1).all()
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert set(rates["model"]) == {"power", "power_log", "inverse_log"}
    assert (rates["verdict"] == "range too narrow").all()  # 3 n values over 0.6 decade
    pl = rates[(rates["model"] == "power_log") & (rates["response"] == "l2") & (rates["gate"] != "softmax")]
    assert (pl["decision"] == "undecided (range too narrow)").all() and (pl["theory_exponent"] == 0.5).all()
    models = pd.read_csv(tmp_path / "models.csv")
    assert models.groupby(["gate", "response"])["akaike_weight"].sum().to_numpy() == pytest.approx(1.0)
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["sizes"]["n"] == TINY["n"] and prov["config"]["seed"] == tiny.SEED
    cells = sorted((tmp_path / "study" / "cells").glob("*.parquet"))
    stamps = [p.stat().st_mtime_ns for p in cells]
    again = tiny.run(tmp_path, quick=True, workers=1, progress=False)
    assert [p.stat().st_mtime_ns for p in cells] == stamps  # resumed: no cell recomputed
    pd.testing.assert_frame_equal(again.reset_index(drop=True), frame.reset_index(drop=True))
