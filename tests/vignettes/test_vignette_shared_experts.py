"""The shared-experts vignette (nguyen2025_shared): its pre-specified design, its decision rules deciding both ways
on frames built to make them, and a tiny size run end to end and resumed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import moestat._vignette_index as vindex


@pytest.fixture(scope="module")
def mod():
    return vindex.load(vindex.find("shared-experts"))


def test_design_is_prespecified(mod):
    assert mod.NAME == "shared-experts" and mod.TITLE and callable(mod.run)
    quick, full = mod.SIZES["quick"], mod.SIZES["full"]
    # quick: >= 5 sample sizes over >= 1 decade (the verdict's minimum); full: more decades and replicates
    assert len(quick["n"]) >= 5 and max(quick["n"]) / min(quick["n"]) >= 10 and quick["reps"] >= 20
    assert max(full["n"]) / min(full["n"]) > max(quick["n"]) / min(quick["n"]) and full["reps"] > quick["reps"]
    studies = mod.make_studies("full")
    assert list(studies) == ["own", "cross", "audit"]
    own, cross, audit = studies["own"], studies["cross"], studies["audit"]
    assert [t["data"]["architecture"] for t in own.truths] == ["shared_nsig", "nsig", "shared_softmax", "softmax"]
    for study in studies.values():  # one data stream: every architecture sees the same inputs and noise
        assert {t["stream"] for t in study.truths} == {"paired"} and study.seed == mod.SEED
        assert study.cell is mod.paper.shared_cell  # the cell named by CELL
    (fit,) = own.fits
    assert fit["options"] == {"architecture": "own", "starts": ["near_truth"]}
    assert own.n == full["n"] and own.reps == full["reps"]
    assert [t["data"]["architecture"] for t in cross.truths] == ["shared_nsig", "softmax"]
    assert cross.fits[0]["options"]["architecture"] == "other" and cross.n == full["cross_n"]
    assert audit.fits[0]["options"]["starts"] == ["near_truth", "random"] and audit.n == [full["audit_n"]]
    with pytest.raises(ValueError, match="size='huge'"):
        mod.make_studies("huge")


def _row(**kw):
    base = {"model": "power", "verdict": "power law", "ci_low": 0.4, "ci_high": 0.6, "theory_exponent": 0.5}
    return pd.Series({**base, **kw})


def test_rate_decision_rule(mod):
    assert mod.decide(_row()) == "agrees"
    assert mod.decide(_row(verdict="imprecise", ci_low=0.1, ci_high=0.9)) == "agrees"
    assert mod.decide(_row(ci_low=0.55, ci_high=0.7)) == "faster than theory"
    assert mod.decide(_row(ci_low=0.2, ci_high=0.45)) == "slower than theory"
    assert mod.decide(_row(verdict="range too narrow")) == "undecided (range too narrow)"
    assert mod.decide(_row(model="power_log")) == ""  # the theory's model only
    assert mod.decide(_row(theory_exponent=np.nan)) == ""


def _frame(scales, ns=(1000, 2000, 4000, 8000, 16000), reps=20, seed=0):
    """err_expert = scale * n^-1/2 * lognormal(0, 0.2) per architecture: scale 2 needs 4 times the samples."""
    rng = np.random.default_rng(seed)
    rows = [{"architecture": a, "n": n, "rep": r, "err_expert": s * n**-0.5 * np.exp(0.2 * rng.standard_normal())}
            for a, s in scales.items() for n in ns for r in range(reps)]
    return pd.DataFrame(rows)


def test_efficiency_rule_decides_both_ways(mod):
    # shared architectures at half the error of plain ones: ratio 1/4 for shared vs plain, 1 for the routers
    frame = _frame({"shared_nsig": 1.0, "nsig": 2.0, "shared_softmax": 1.0, "softmax": 2.0})
    eff, claims = mod.efficiency_tables(frame, n_resamples=400)
    ratio = eff[eff["kind"] == "ratio"].set_index(["a", "b"])
    assert ratio.loc[("shared_nsig", "nsig"), "value"] == pytest.approx(0.25, rel=0.2)  # sd 0.2/sqrt(20) per cell
    assert ratio.loc[("shared_nsig", "nsig"), "verdict"] == "shared_nsig more sample-efficient"
    assert ratio.loc[("nsig", "softmax"), "verdict"] == "undecided"
    decided = dict(zip(claims["claim"], claims["decision"], strict=True))
    assert decided == {"shared experts": "supported on this truth", "normalised sigmoid": "undecided"}
    # the reverse: the normalised sigmoid architectures need more samples, shared experts change nothing
    frame = _frame({"shared_nsig": 2.0, "nsig": 2.0, "shared_softmax": 1.0, "softmax": 1.0})
    _, claims = mod.efficiency_tables(frame, n_resamples=400)
    decided = dict(zip(claims["claim"], claims["decision"], strict=True))
    assert decided == {"shared experts": "undecided", "normalised sigmoid": "contradicted on this truth"}
    # the target is the geometric mean of the architectures' mean errors at the middle n
    mid = frame[frame["n"] == 4000].groupby("architecture")["err_expert"].mean()
    assert mod.efficiency_target(frame) == pytest.approx(float(np.exp(np.log(mid).mean())))


def test_tiny_size_runs_and_resumes(mod, tmp_path):
    frame = mod.run(tmp_path, size="tiny", workers=1, progress=False)
    for f in ["results.csv", "cross_results.csv", "audit_results.csv", "rates.csv", "windows.csv",
              "efficiency.csv", "claims.csv", "cross.csv", "audit.csv", "information.csv", "rates.png",
              "provenance.json"]:
        assert (tmp_path / f).is_file(), f
    tiny = mod.SIZES["tiny"]
    assert len(frame) == 4 * len(tiny["n"]) * tiny["reps"] and (frame["status"] == "ok").all()
    assert frame.groupby(["n", "rep"])["data_seed"].nunique().eq(1).all()  # paired data
    shared = frame["n_shared"] == 1
    assert frame.loc[shared, "err_shared_expert"].notna().all() and frame.loc[~shared, "err_shared_expert"].isna().all()
    cross = pd.read_csv(tmp_path / "cross.csv")
    assert set(zip(cross["truth"], cross["fit"], strict=True)) == {("shared_nsig", "softmax"),
                                                                   ("softmax", "shared_nsig")}
    assert (cross["ratio"] > 10).all()  # the other architecture cannot reproduce the truth
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert (rates["verdict"] == "range too narrow").all()  # 3 n values over 0.6 decade
    power = rates[rates["model"] == "power"]
    assert (power["theory_exponent"] == 0.5).all() and power["decision"].str.startswith("undecided").all()
    info = pd.read_csv(tmp_path / "information.csv")
    assert (info["lambda_min"] > 0).all() and set(info["architecture"]) == set(mod.ARCHS)
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["sizes"]["n"] == tiny["n"] and prov["config"]["seed"] == mod.SEED
    cells = sorted((tmp_path / "own" / "study" / "cells").glob("*.parquet"))
    stamps = [p.stat().st_mtime_ns for p in cells]
    again = mod.run(tmp_path, size="tiny", workers=1, progress=False)
    assert [p.stat().st_mtime_ns for p in cells] == stamps  # resumed: no cell recomputed
    pd.testing.assert_frame_equal(again.reset_index(drop=True), frame.reset_index(drop=True))
