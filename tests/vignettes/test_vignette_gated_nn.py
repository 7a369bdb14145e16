"""Smoke test of the gated-nn-recovery vignette (through moestat.Study) at its tiny "smoke" size.

The science it calls (the cell, the success criterion, the rate analysis) is tested in
tests/papers/test_makkuva2020.py; here: the vignette builds its studies, writes every promised file and resumes.
"""

import json

import pandas as pd
import pytest

import moestat._vignette_index as vindex
from moestat.papers import makkuva2020 as paper


@pytest.fixture(scope="module")
def vignette():
    return vindex.load(vindex.find("gated-nn-recovery"))  # importing computes nothing


def test_every_part_is_a_study_of_the_paper_cell(vignette):
    studies = vignette.make_studies("full")
    assert set(studies) == {"compare", "vs_n", "vs_n_em", "sigma", "nonlinear", "scaling", "nongauss"}
    assert all(s.cell is paper.gated_nn_cell for s in studies.values())
    full = vignette.SIZES["full"]
    assert list(studies["vs_n"].n) == list(full["vs_n"]["ns"])  # n is the study's n where the part varies it
    assert max(studies["vs_n_em"].n) <= full["vs_n"]["em_max_n"]
    compare = studies["compare"]
    assert [f["label"] for f in compare.fits] == ["tensor", "em", "l2", "gate|A=A*", "gate|A=l2"]
    assert len(compare.cells) == 5 and compare.reps == 1
    with pytest.raises(ValueError, match="size='huge'"):
        vignette.make_studies("huge")


def test_vignette_runs_and_resumes(vignette, tmp_path, monkeypatch):
    assert vignette.NAME == "gated-nn-recovery"
    monkeypatch.setitem(vignette.SIZES, "quick", vignette.SIZES["smoke"])
    vignette.run(tmp_path, quick=True)
    for name in ("results.csv", "rates.csv", "provenance.json", "compare_summary.csv", "fig_vs_n.png",
                 "fig_compare_iterations.png", "fig_sigma.png", "fig_nonlinear.png", "fig_scaling.png"):
        assert (tmp_path / name).exists(), name
    res = pd.read_csv(tmp_path / "results.csv")
    assert {"part", "metric", "value", "method"} <= set(res.columns)
    assert set(res["part"]) == {"compare", "vs_n", "sigma", "nonlinear", "scaling", "nongauss"}
    prov = json.loads((tmp_path / "provenance.json").read_text())["config"]
    assert prov["size"] == "quick" and prov["cell"] == "moestat.papers.makkuva2020:gated_nn_cell"
    assert prov["rate_fit"]["function"] == "moestat.fit_rate"
    rates = pd.read_csv(tmp_path / "rates.csv")   # ms.fit_rate details + its knobs + H0 alpha = 1/2 + AIC columns
    assert {"method", "metric", "model", "exponent", "se", "ci_low", "ci_high", "df", "cov_type", "n_values",
            "replicates", "curvature_p", "config_method", "interval", "n_resamples", "resample", "seed",
            "h0_exponent", "h0_p_value", "aic_best_model", "aic_weight_power"} <= set(rates.columns)
    assert set(rates["config_method"]) == {"cluster_bootstrap"} and set(rates["resample"]) == {"within_n"}
    assert {("tensor", "gate_l2"), ("tensor", "reg_angle"), ("gate|A=A*", "gate_l2")} <= set(
        zip(rates["method"], rates["metric"], strict=True))
    summary = pd.read_csv(tmp_path / "compare_summary.csv").set_index("method")
    smoke = vignette.SIZES["smoke"]["compare"]
    assert set(summary.index) == {"tensor", "em", "l2", "gate|A=A*", "gate|A=l2"}
    assert (summary["starts"] == smoke["starts"]).all()  # every random start of the comparison is scored
    # the per-start errors come back from the cell's "restarts" piece
    compare = res[(res["part"] == "compare") & (res["metric"] == "E_reg")]
    assert len(compare) == 5 * smoke["starts"] and (compare.loc[compare["method"] == "gate|A=A*", "value"] == 0).all()
    assert list((tmp_path / "study" / "compare" / "pieces").iterdir())  # restarts and history pieces
    cells = sorted((tmp_path / "study").glob("*/cells/*.parquet"))
    assert len(cells) == sum(len(s.cells) for s in vignette.make_studies("quick").values())
    stamps = {p: p.stat().st_mtime_ns for p in cells}
    before = (tmp_path / "results.csv").read_bytes()
    vignette.run(tmp_path, quick=True)              # resume: no cell is refitted, the tables are the same
    assert {p: p.stat().st_mtime_ns for p in cells} == stamps
    assert (tmp_path / "results.csv").read_bytes() == before
