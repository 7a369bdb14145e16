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
    if name == "sigmoid-vs-softmax":
        # the decisive design: >= 50 observations per parameter (P = 32 for d = 3, k = 4), >= 1 decade quick and
        # 2 decades full, >= 5 truths quick (the unit bootstrap's minimum) and 10 full, starts beyond the truth
        full = mod.make_study("full")
        assert min(study.n) >= 50 * 32 and max(study.n) / min(study.n) >= 10 and max(full.n) / min(full.n) >= 100
        assert len(mod.SIZES["quick"]["seeds"]) >= 5 and len(mod.SIZES["full"]["seeds"]) >= 10
        assert {"kmeans", "random"} <= set(mod.STARTS)
    else:
        assert study.reps >= 2
        assert all(n > 594 for n in study.n)  # more observations than the k = 9 model's parameters


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
    assert set(rates["solver"]) == {"newton", "lm"}
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
