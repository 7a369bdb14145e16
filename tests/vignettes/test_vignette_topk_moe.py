"""The topk-moe vignette (nguyen2024_topk): its pre-specified design, and a tiny size run end to end through the
vignette index and resumed without refitting."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from .conftest import load_vignette

# the smallest design that still exercises every study, table and the figure (seconds on one core)
TINY = {"n": [150, 300, 600], "reps": 2, "check_n": [150, 300], "check_reps": 2, "pilot_n": [150], "pilot_reps": 2}


@pytest.fixture(scope="module")
def mod():
    return load_vignette("topk-moe")


def test_design_is_prespecified(mod):
    assert mod.NAME == "topk-moe" and mod.TITLE and callable(mod.run)
    quick, full = mod.SIZES["quick"], mod.SIZES["full"]
    # quick: >= 5 sample sizes over >= 1 decade, >= 20 replicates; full: wider and more replicates
    assert len(quick["n"]) >= 5 and max(quick["n"]) / min(quick["n"]) >= 10 and quick["reps"] >= 20
    assert max(full["n"]) / min(full["n"]) > max(quick["n"]) / min(quick["n"]) and full["reps"] > quick["reps"]
    studies = mod.make_studies("quick")
    assert list(studies) == ["rates", "checks", "lambda", "pilot"]
    rates = studies["rates"]
    (truth,) = rates.truths
    assert truth["gate"] == "topk" and truth["top_k"] == 2 and truth["k"] == 3
    assert truth["params"] == mod.paper.PARAMS
    fits = {f["label"]: f for f in rates.fits}
    assert (fits["exact"]["k"], fits["exact"]["top_k"]) == (3, 2)
    assert (fits["over"]["k"], fits["over"]["top_k"], fits["over"]["options"]["duplicate"]) == (4, 3, [1])
    for f in fits.values():
        assert f["options"]["init"] == "near_truth" and f["options"]["method"] == "gradient"
    assert studies["lambda"].truths[0]["top_k"] == 1 and studies["pilot"].truths[0]["label"] == "chain_jump"
    assert rates.n == quick["n"] and rates.reps == quick["reps"]
    with pytest.raises(ValueError, match="size='huge'"):
        mod.make_studies("huge")


def test_tiny_size_runs_and_resumes(mod, tmp_path, monkeypatch):
    monkeypatch.setitem(mod.SIZES, "tiny", dict(TINY))
    frame = mod.run(tmp_path, size="tiny", workers=1, progress=False)
    for name in ("results.csv", "rates.csv", "windows.csv", "fits.csv", "admissibility.csv", "pilot.csv",
                 "theory.csv", "rates.png", "provenance.json"):
        assert (tmp_path / name).is_file(), name
    assert set(frame["study_part"]) == {"rates", "checks", "lambda", "pilot"}
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert set(rates["fit"]) == {"exact", "over"}
    # every headline response got a theory exponent and a decision (three n values: 'range too narrow')
    assert rates["theory_exponent"].notna().all() and rates["decision"].str.len().gt(0).all()
    adm = pd.read_csv(tmp_path / "admissibility.csv")
    assert set(adm["fit"]) == {"split 1, Kbar 3", "split 2, Kbar 2", "lambda k 3, Kbar 2"}
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["size"] == "tiny" and set(prov["config"]["timing"]) == {"rates", "checks", "lambda", "pilot"}
    # resume: every cell is read back, nothing is refitted (the stored cells are untouched), the frame is the same
    cells = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/study/cells/*.parquet")}
    assert len(cells) == 3 * 2 + 2 * 2 + 2 + 2  # rates: 3 n x 2 fits; checks: 2 n x 2 fits; lambda: 2; pilot: 2
    again = mod.run(tmp_path, size="tiny", workers=1, progress=False)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/study/cells/*.parquet")} == cells
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert all(t["cells_computed"] > 0 for t in prov["config"]["timing"].values())  # the timing of the first run
    cols = ["study_part", "fit", "n", "rep", "topk_voronoi", "hellinger"]
    pd.testing.assert_frame_equal(again[cols].reset_index(drop=True), frame[cols].reset_index(drop=True))
