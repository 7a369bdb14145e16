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
    assert len(study.cells) > 0 and study.reps >= 2
    assert all(n > 594 for n in study.n)  # more observations than the k = 9 model's parameters


@pytest.mark.slow  # about a minute on an idle 2-core machine (12 cells, rate bootstraps, three figures)
def test_sigmoid_vs_softmax_tiny_run_and_resume(tmp_path):
    mod = vindex.load(vindex.find("sigmoid-vs-softmax"))
    kw = dict(size="quick", n=[700, 800, 900], reps=2, max_iter=3, experts=["relu"], epochs=1, progress=False)
    frame = mod.run(tmp_path, **kw)
    for f in ["results.csv", "rates.csv", "comparison.csv", "floor.csv", "loss.png", "l2.png", "conditioning.png",
              "provenance.json"]:
        assert (tmp_path / f).is_file(), f
    assert set(frame["gate"]) == {"sigmoid", "softmax"} and set(frame["fit"]) == {"lse", "paper-sgd"}
    assert len(frame) == 2 * 2 * 3 * 2
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert {"y", "fitted_on", "fit", "expert", "gate", "exponent", "ci_low", "ci_high"} <= set(rates.columns)
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["sizes"]["n"] == [700, 800, 900]
    stamp = (tmp_path / "study" / "results.parquet").stat().st_mtime_ns
    cells = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "study" / "cells").glob("*.parquet")}
    again = mod.run(tmp_path, **kw)  # resume: every cell is loaded, none recomputed
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "study" / "cells").glob("*.parquet")} == cells
    assert (tmp_path / "study" / "results.parquet").stat().st_mtime_ns >= stamp
    pd.testing.assert_frame_equal(frame, again)
