"""The gaussian-gated-moe vignette (nguyen2024_gaussian_gate): its pre-specified design, a tiny size run end to end and
resumed, and the peer re-analysis on a synthetic copy of the authors' stored arrays."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from moestat.metrics.gaussian_gate_voronoi import gaussian_gate_voronoi_loss
from moestat.papers import nguyen2024_gaussian_gate as paper

from .conftest import load_vignette


@pytest.fixture(scope="module")
def mod():
    return load_vignette("gaussian-gated-moe")


def test_design_is_prespecified(mod):
    assert mod.NAME == "gaussian-gated-moe" and mod.TITLE and callable(mod.run)
    quick, full = mod.SIZES["quick"], mod.SIZES["full"]
    # quick: >= 5 sample sizes over >= 1 decade (the verdict's minimum); full: more decades and replicates
    assert len(quick["n"]) >= 5 and max(quick["n"]) / min(quick["n"]) >= 10
    assert max(full["n"]) / min(full["n"]) > max(quick["n"]) / min(quick["n"]) and full["reps"] > quick["reps"]
    study = mod.make_studies("full")["study"]
    assert [t["data"]["setting"] for t in study.truths] == [1, 2]
    assert len({t["stream"] for t in study.truths}) == 2  # the two settings have their own data
    fits = {f["label"]: f["options"] for f in study.fits}
    assert {fits["K4"]["k"], fits["K5"]["k"]} == {4, 5} and fits["K4"]["method"] == "lbfgs"
    assert fits["K4, one EM step"] == {"k": 4, "steps": 1} and fits["K5, one EM step"] == {"k": 5, "steps": 1}
    assert study.n == full["n"] and study.reps == full["reps"]
    with pytest.raises(ValueError, match="size='huge'"):
        mod.make_studies("huge")
    with pytest.raises(ValueError, match="are not fits of this vignette"):
        mod.make_study("quick", fits=["K7"])


def test_tiny_size_runs_and_resumes(mod, tmp_path):
    frame = mod.run(tmp_path, size="tiny", workers=1, progress=False)
    for f in ["results.csv", "rates.csv", "peer_method.csv", "rates_sensitivity.csv", "windows.csv", "blocks.csv",
              "fits.csv", "checks.csv", "loss.png", "provenance.json"]:
        assert (tmp_path / f).is_file(), f
    assert len(frame) == 2 * 2 * 3 * 3 and (frame["status"] == "ok").all() and (frame["gg_loss"] > 0).all()
    # every fit of a setting and n sees the same data sets (common random numbers)
    assert frame.groupby(["truth", "n", "rep"])["data_seed"].nunique().eq(1).all()
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert set(rates["model"]) == {"power", "power_log"} and set(rates["response"]) == set(mod.RESPONSES)
    assert (rates["verdict"] == "range too narrow").all()  # 3 n values over 0.6 decade
    assert (rates.loc[rates["model"] == "power_log", "decision"] == "undecided (range too narrow)").all()
    checks = pd.read_csv(tmp_path / "checks.csv")
    assert set(checks["check"]) == {"K4, one EM step"} and (checks["data_sets"] == 3).all()
    blocks = pd.read_csv(tmp_path / "blocks.csv")
    assert {"c_exact", "A_exact"} <= set(blocks["response"])
    assert blocks["theory_exponent"].notna().all()  # every block response has its THEORY row
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["sizes"]["n"] == mod.SIZES["tiny"]["n"] and prov["config"]["seed"] == mod.SEED
    cells = sorted((tmp_path / "study" / "cells").glob("*.parquet"))
    stamps = [p.stat().st_mtime_ns for p in cells]
    again = mod.run(tmp_path, size="tiny", workers=1, progress=False)
    assert [p.stat().st_mtime_ns for p in cells] == stamps  # resumed: no cell recomputed
    pd.testing.assert_frame_equal(again.reset_index(drop=True), frame.reset_index(drop=True))


def _fake_peer(root, reps: int = 2) -> None:
    """Arrays shaped like CRPE-GMoE's results_GLLiM: fits near the truth with errors ~ n^-1/2 and the stored loss
    computed in the authors' convention."""
    rng = np.random.default_rng(0)
    ns = paper.peer_grid()
    folder = root / "results_GLLiM"
    folder.mkdir(parents=True)
    for setting in paper.SETTINGS:
        truth = paper.gllim_truth(setting)
        for k in (4, 5):
            blocks: dict[str, list] = {b: [] for b in ("pi", "c", "Gamma", "A", "b", "nu")}
            for n in ns:
                for _ in range(reps):
                    s = np.array([0, 1, 2, *rng.integers(0, 3, k - 3)])
                    e = 0.5 / np.sqrt(n)
                    w = truth.pi[s] / np.bincount(s, minlength=3)[s] * (1 + e * rng.standard_normal(k))
                    blocks["pi"].append(w / w.sum())
                    for name in ("c", "A", "b"):
                        atoms = getattr(truth, name)[s]
                        blocks[name].append(atoms + e * rng.standard_normal(atoms.shape))
                    for name in ("Gamma", "nu"):
                        blocks[name].append(getattr(truth, name)[s] * (1 + e * abs(rng.standard_normal())))
            arrays = {b: np.asarray(v).reshape(ns.size, reps, *np.asarray(v).shape[1:]) for b, v in blocks.items()}
            stem = folder / paper_template(setting, k)
            for b, v in arrays.items():
                np.save(f"{stem}{b}.npy", v)
            flat = {b: v.reshape(-1, *v.shape[2:]) for b, v in arrays.items()}
            loss = gaussian_gate_voronoi_loss(flat, truth, cell_distance="sum").reshape(ns.size, reps)
            np.save(f"{stem}loss.npy", loss)
            np.save(f"{stem}iters.npy", np.zeros((ns.size, reps)))


def paper_template(setting: int, k: int) -> str:
    return f"result_model{setting}_K{k}_n100000_rep20_"


def test_peer_reanalysis_on_synthetic_arrays(mod, tmp_path):
    _fake_peer(tmp_path / "peer")
    tables = mod.run_peer(tmp_path / "peer", tmp_path / "out")
    for f in ["check.csv", "rates.csv", "windows.csv", "per_n.csv", "peer.png", "source.json"]:
        assert (tmp_path / "out" / "peer" / f).is_file(), f
    check = tables["check"]
    assert len(check) == 8 and (check["max_rel_difference"] < 1e-12).all() and (check["iters_max"] == 0).all()
    # errors ~ n^-1/2 in the weights and the atoms alone; the split cells' powers make their terms fall faster, so
    # the loss falls at 1/2 or a little faster (0.1: two replicates per n and the faster terms at small n)
    assert check["exponent_peer_formula"].between(0.45, 0.62).all()
    assert (check["exponent_log_mean_ols"] - check["exponent_peer_formula"]).abs().max() < 0.05
    gap = tables["rates"].query("response == 'weight_gap' and model == 'power' and estimator.str.startswith('mean')")
    assert gap["exponent"].between(0.4, 0.6).all()
    with pytest.raises(ValueError, match="has no results_GLLiM folder"):
        mod.run_peer(tmp_path, tmp_path / "out")
