"""The study-based vignettes: importing computes nothing; a tiny run writes every promised file."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

import moestat._vignette_index as vindex

VIGNETTES = ["sigmoid-vs-softmax", "sigmoid-regimes", "gelu-clean-test"]


@pytest.mark.parametrize("name", VIGNETTES)
def test_vignette_imports_without_computing(name):
    t0 = time.perf_counter()
    mod = vindex.load(vindex.find(name))
    assert time.perf_counter() - t0 < 5
    assert mod.NAME == name and mod.TITLE and callable(mod.run)
    study = mod.make_study("quick")
    assert len(study.cells) > 0
    if name in ("sigmoid-vs-softmax", "sigmoid-regimes", "gelu-clean-test"):
        # the decisive design: >= 50 observations per parameter (P = 32 for d = 3, k = 4), >= 1 decade quick and
        # 2 decades full, >= 5 truths quick (the unit bootstrap's minimum) and 10 full, starts beyond the truth
        full = mod.make_study("full")
        assert min(study.n) >= 50 * 32 and max(study.n) / min(study.n) >= 10 and max(full.n) / min(full.n) >= 100
        assert len(mod.SIZES["quick"]["seeds"]) >= 5 and len(mod.SIZES["full"]["seeds"]) >= 10
        assert {"kmeans", "random"} <= set(mod.STARTS)


def test_gelu_clean_test_pairs_the_gate_variances_of_each_truth():
    mod = vindex.load(vindex.find("gelu-clean-test"))
    study = mod.make_study("quick")
    by_var: dict = {}
    for t in study.truths:
        assert t["expert"] == "gelu" and t["truth_gate"] == "sigmoid" and t["regime"] == 2
        by_var.setdefault(t["gate_var"], {})[t["seed"]] = t["stream"]
    assert sorted(by_var) == sorted(mod.GATE_VARS.values()) and mod.GATE_VARS[mod.REFERENCE] == 1.0
    streams = list(by_var.values())
    assert all(s == streams[0] for s in streams)  # same inputs and noise for every gate variance of a seed


def test_sigmoid_regimes_pairs_the_two_regimes_of_each_truth():
    mod = vindex.load(vindex.find("sigmoid-regimes"))
    study = mod.make_study("quick")
    regimes = {(t["seed"], t["regime"]): t for t in study.truths}
    assert {r for _, r in regimes} == {1, 2} and all(t["truth_gate"] == "sigmoid" for t in study.truths)
    for seed in mod.SIZES["quick"]["seeds"]:  # same data stream for both regimes of a truth draw (paired)
        assert regimes[(seed, 1)]["stream"] == regimes[(seed, 2)]["stream"]


@pytest.mark.slow  # about a minute on an idle 2-core machine (30 small cells, rate bootstraps, two figures)
def test_sigmoid_vs_softmax_tiny_run_and_resume(tmp_path):
    mod = vindex.load(vindex.find("sigmoid-vs-softmax"))
    kw = dict(size="quick", n=[1600, 2500, 4000], seeds=[0, 1, 2, 3, 4], experts=["relu"], max_iter=30,
              starts=["near_truth", "kmeans"], progress=False, workers=1)
    frame = mod.run(tmp_path, **kw)
    for f in ["results.csv", "rates.csv", "windows.csv", "comparison.csv", "invariance.csv", "design.csv",
              "starts.csv", "rates.png", "invariance.png", "provenance.json"]:
        assert (tmp_path / f).is_file(), f
    assert set(frame["gate"]) == {"sigmoid", "softmax"} and len(frame) == 2 * 5 * 3
    assert {"over_param", "over_param_alt", "objective_alt", "best_start", "representation"} <= set(frame.columns)
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert {"y", "solver", "expert", "gate", "exponent", "ci_low", "ci_high", "verdict", "theory"} <= set(rates.columns)
    assert set(rates["solver"]) == {"lowest objective", "newton", "lm"}
    cmp = pd.read_csv(tmp_path / "comparison.csv")
    assert cmp["verdict"].notna().all()
    inv = pd.read_csv(tmp_path / "invariance.csv")
    assert set(inv["response"]) == {"over_param", "exact_param", "l2"} and inv["verdict"].notna().all()
    design = pd.read_csv(tmp_path / "design.csv")
    assert not bool(design.set_index("check").loc["truths", "passed"])  # 5 truths < 10: the quick size says so
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["sizes"]["n"] == [1600, 2500, 4000]
    cells = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "study" / "cells").glob("*.parquet")}
    again = mod.run(tmp_path, **kw)  # resume: every cell is loaded, none recomputed
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "study" / "cells").glob("*.parquet")} == cells
    pd.testing.assert_frame_equal(frame, again)


@pytest.mark.slow  # about a minute on an idle 2-core machine (30 small cells, rate bootstraps, two figures)
def test_sigmoid_regimes_tiny_run(tmp_path):
    mod = vindex.load(vindex.find("sigmoid-regimes"))
    kw = dict(size="quick", n=[1600, 2500, 4000], seeds=[0, 1, 2, 3, 4], max_iter=30, starts=["near_truth", "kmeans"],
              progress=False, workers=1)
    frame = mod.run(tmp_path, **kw)
    for f in ["results.csv", "rates.csv", "windows.csv", "comparison.csv", "invariance.csv", "design.csv", "rates.png",
              "invariance.png", "provenance.json"]:
        assert (tmp_path / f).is_file(), f
    assert set(frame["truth_regime"]) == {1, 2} and set(frame["gate"]) == {"sigmoid"} and len(frame) == 2 * 5 * 3
    rates = pd.read_csv(tmp_path / "rates.csv")
    one = rates[(rates["truth_regime"] == 1) & (rates["response"] == "over_param")]
    assert set(one["theory"]) == {"(log n / n)^{1/4}"}  # Theorem 2 for gelu in regime 1
    cmp = pd.read_csv(tmp_path / "comparison.csv")
    assert set(cmp["level_a"]) == {2} and set(cmp["level_b"]) == {1} and cmp["verdict"].notna().all()
    inv = pd.read_csv(tmp_path / "invariance.csv")
    assert set(inv["truth_regime"]) == {1, 2} and inv["verdict"].notna().all()
    # regime 1: the duplicated atom's weight split is exact, so the nearest representations are splits of atom 0
    # (or dead atoms), never a gelu basin limit of atom 0
    reg1 = frame[frame["truth_regime"] == 1]["representation"].astype(str)
    assert not reg1.str.fullmatch("gbar 0").any()


@pytest.mark.slow  # about two minutes on an idle 2-core machine (60 small cells, the identifiability table, figures)
def test_gelu_clean_test_tiny_run(tmp_path):
    mod = vindex.load(vindex.find("gelu-clean-test"))
    kw = dict(size="quick", n=[1600, 2500, 4000], seeds=[0, 1, 2, 3, 4], max_iter=30, starts=["near_truth", "kmeans"],
              progress=False, workers=1, basin=False)
    frame = mod.run(tmp_path, **kw)
    for f in ["identifiability.csv", "results.csv", "rates.csv", "windows.csv", "comparison.csv", "invariance.csv",
              "design.csv", "rates.png", "invariance.png", "provenance.json"]:
        assert (tmp_path / f).is_file(), f
    assert len(frame) == 4 * 5 * 3 and set(frame["gate"]) == {"sigmoid"}
    rates = pd.read_csv(tmp_path / "rates.csv")
    best = rates[rates["solver"] == "lowest objective"]
    assert sorted(set(best["gate_var"])) == sorted(mod.GATE_VARS) and best["verdict"].notna().all()
    cmp = pd.read_csv(tmp_path / "comparison.csv")
    assert set(cmp["level_b"]) == {1.0} and set(cmp["gate_var"]) == set(mod.GATE_VARS) - {mod.REFERENCE}
    ident = pd.read_csv(tmp_path / "identifiability.csv")
    assert set(ident["expert"]) == {"relu", "linear", "gelu"}
