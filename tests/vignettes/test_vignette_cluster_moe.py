"""Smoke test of the cluster-moe vignette (chen2022 through moestat.Study) on a tiny internal size; the --quick
size runs in CI separately.  Its science (the cell, oracles, summaries, ablation effects, signal-span search,
dispatch spread) is tested in tests/papers/test_chen2022.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import moestat._vignette_index as vindex
from moestat import figstyle as fs


@pytest.fixture
def vignette(monkeypatch):
    mod = vindex.load(vindex.find("cluster-moe"))
    tiny = dict(mod.SIZES["quick"], runs=2, n_train=120, n_test=200, T_moe=20, T_single=10, J_single=8,
                eval_every=10)
    monkeypatch.setitem(mod.SIZES, "quick", tiny)
    return mod


def test_studies_hold_the_settings_models_and_ablation(vignette):
    studies = vignette.make_studies("quick")
    assert list(studies) == ["study", "study-lb0.1"]
    main, lb = studies["study"], studies["study-lb0.1"]
    assert [t["data"]["setting"] for t in main.truths] == [1, 3] and main.n == [120] and main.reps == 2
    assert [f["label"] for f in main.fits] == ["oracle-moe", "oracle-patch-additive", "moe-cubic", "moe-linear",
                                               "single-cubic", "single-linear"]
    assert [t["data"]["setting"] for t in lb.truths] == [1]
    assert {f["options"]["load_balance"] for f in lb.fits} == {0.1}
    # the ablation's truth is the main study's setting 1: same data and model seeds (a paired comparison)
    assert lb.truths[0]["data"] == main.truths[0]["data"]
    full = vignette.make_studies("full")
    assert set(full) == {"study", "study-lb0.1", "study-lb0.001"}
    assert [t["data"]["setting"] for t in full["study-lb0.001"].truths] == [1]
    with pytest.raises(ValueError, match="size='huge'"):
        vignette.make_studies("huge")


def test_quick_size_changes_only_the_budget_and_full_is_the_rendered_one():
    """The page's numbers come from "full"; "quick" (the --quick run described on the page) is full with fewer
    settings, runs, test examples and iterations, and a larger expert step that keeps the normalised-GD path
    length eta * T of full (each step moves an expert that receives examples by eta in Frobenius norm)."""
    mod = vindex.load(vindex.find("cluster-moe"))
    full, quick = mod.SIZES["full"], mod.SIZES["quick"]
    # the configuration behind docs/vignettes/cluster-moe.md (its "What differs from the paper" table)
    assert (full["settings"], full["runs"], full["n_train"], full["n_test"]) == ((1, 2, 3, 4), 10, 1_000, 16_000)
    assert (full["T_moe"], full["T_single"], full["eta"], full["eta_r"], full["sigma0"]) == (4000, 1000, 1e-3, 0.1, 0.1)
    assert (full["M"], full["J"], full["J_single"], full["dtype"]) == (8, 16, 128, "float32")
    assert full["load_balance"] == (0.1,) and full["load_balance_extra"] == {1: (1e-3,)}
    # eta * T: each expert's weights travel the same distance under normalised GD (a step of length eta each)
    assert quick["eta"] * quick["T_moe"] == pytest.approx(full["eta"] * full["T_moe"], rel=1e-12)
    same = {"M", "J", "eta_r", "sigma0", "router_noise", "data_seed", "model_seed", "models", "ablation_models",
            "n_train", "dtype", "single_optimizer", "single_weight_decay"}
    assert {k: quick[k] for k in same} == {k: full[k] for k in same}
    assert set(quick["settings"]) <= set(full["settings"]) and quick["runs"] < full["runs"]


def test_vignette_runs_and_resumes(vignette, tmp_path, monkeypatch):
    mod = vignette
    assert mod.NAME == "cluster-moe" and callable(mod.run)
    threads = torch.get_num_threads()
    drawn = {}
    save = mod.fs.save

    def record(fig, path, **kwargs):  # inspect each figure as it is saved
        fig.canvas.draw()
        drawn[Path(path).name] = _figure_facts(fig)
        save(fig, path, **kwargs)

    monkeypatch.setattr(mod.fs, "save", record)
    mod.run(tmp_path, quick=True)
    assert torch.get_num_threads() == threads  # restored
    res = pd.read_csv(tmp_path / "results.csv")
    assert {"model", "run", "n_train", "accuracy", "dispatch_entropy", "study", "cell", "truth_setting"} <= set(
        res.columns)
    assert {"moe-cubic", "moe-linear", "single-cubic", "single-linear", "oracle-moe"} <= set(res["model"])
    assert (res["status"] == "ok").all()
    moe = res[res["model"].str.startswith("moe")]
    assert moe["dispatch_entropy"].between(0, 1.4).all() and res["accuracy"].between(0, 1).all()
    assert len(res.query("model == 'moe-cubic' and ablation == 'none'")) == 2 * 2  # 2 settings x 2 runs
    lb = res.query("ablation == 'load-balance'")
    assert set(lb["model"]) == {"moe-cubic", "moe-linear"} and set(lb["setting"]) == {1} and len(lb) == 2 * 2
    assert lb["load_entropy"].between(0, np.log(8) + 1e-12).all() and (lb["load_balance"] > 0).all()
    assert moe["experts_per_cluster"].between(1, 8).all() and moe["expert_purity"].between(0.25, 1).all()
    assert moe["init_all_groups_nonempty"].notna().all()
    eff = pd.read_csv(tmp_path / "ablation_effects.csv")
    assert set(eff["metric"]) >= {"accuracy", "dispatch_entropy", "load_entropy"} and (eff["runs"] == 2).all()
    cub = res.query("setting == 1 and model == 'moe-cubic'")
    acc = cub.groupby("ablation")["accuracy"].mean()
    got = eff.query("model == 'moe-cubic' and metric == 'accuracy'")["mean_difference"].item()
    assert np.isclose(got, acc["load-balance"] - acc["none"])
    summ = pd.read_csv(tmp_path / "summary.csv")
    assert {"paper_accuracy", "accuracy_sd", "expert_purity"} <= set(summ.columns)
    assert set(pd.read_csv(tmp_path / "ceiling_check.csv")["setting"]) == {3}
    for f in ("summary_by_init.csv", "summary_load_balance.csv", "accuracy.png", "dispatch_entropy.png",
              "alignment.png", "dispatch_tables.png", "load_balance.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    _check_figures(drawn, res)
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["size"] == "quick" and prov["config"]["n_train"] == 120
    assert prov["config"]["studies"] == {"study": "cluster-moe", "study-lb0.1": "cluster-moe-lb0.1"}
    # resume: every study cell is read back, none refitted (their files keep their mtimes)
    cells = {p: p.stat().st_mtime_ns for p in tmp_path.glob("study*/cells/*.parquet")}
    assert len(cells) == 2 * 6 + 2
    mod.run(tmp_path, quick=True)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("study*/cells/*.parquet")} == cells
    again = pd.read_csv(tmp_path / "results.csv")
    pd.testing.assert_frame_equal(again.drop(columns="wall_time"), res.drop(columns="wall_time"))


def _figure_facts(fig) -> dict:
    """What the style promises of a drawn figure: panels with their titles and labels, legends and where they
    sit, the texts (caption included), error bars and the smallest displayed font."""
    renderer = fig.canvas.get_renderer()
    data_axes = [a for a in fig.axes if a.get_visible() and a.axison]
    legends = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    texts = " ".join(t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text")) if t.get_visible())
    return {"titles": [a.get_title() for a in data_axes], "ylabels": [a.get_ylabel() for a in data_axes],
            "legend_over_data": any(leg.get_window_extent(renderer).overlaps(a.get_window_extent(renderer))
                                    for leg in legends for a in data_axes),
            "n_legends": len(legends), "texts": texts, "font_px": fs.smallest_font_px(fig),
            "errorbars": [(c.get_label(), seg) for a in data_axes for c in a.containers
                          if hasattr(c, "has_yerr") and c.has_yerr
                          for seg in [c.lines[2][0].get_segments()]]}


def _check_figures(drawn: dict, res: pd.DataFrame) -> None:
    assert set(drawn) == {"accuracy.png", "dispatch_entropy.png", "alignment.png", "dispatch_tables.png",
                          "load_balance.png"}
    for name, facts in drawn.items():
        assert all(facts["titles"]), name  # a title on every panel
        assert facts["n_legends"] <= 1 and not facts["legend_over_data"], name  # one legend, outside the data
        assert facts["font_px"] >= fs.MIN_FONT_PX, name  # legible at the docs' page width
    # captions say what a point, a line and a bar are, and over how many runs
    assert "R = 2 runs" in drawn["accuracy.png"]["texts"] and "no error bars" in drawn["accuracy.png"]["texts"]
    assert "R = 2 runs" in drawn["dispatch_entropy.png"]["texts"]
    assert r"$\pm$1 SD over R = 2 runs" in drawn["load_balance.png"]["texts"]
    assert drawn["accuracy.png"]["titles"] == ["setting 1 (no proven ceiling)", "setting 3 (Thm 4.1 applies)"]
    # dispatch tables: the run-0 entropy of each panel is the one in results.csv
    run0 = res.query("run == 0 and ablation == 'none'").set_index(["setting", "model"])["dispatch_entropy"]
    assert drawn["dispatch_tables.png"]["titles"] == [
        f"setting {s}, {m.split('-')[1]} MoE: $H$ = {run0[(s, m)]:.2f}" for s in (1, 3)
        for m in ("moe-cubic", "moe-linear")]
    # load balance: each bar is mean +- 1 SD (ddof 1) over the runs of results.csv, in panel order
    bars = [seg[0] for _, seg in drawn["load_balance.png"]["errorbars"]]  # one setting: one segment per series
    expected = []
    for col, scale in (("accuracy", 100), ("dispatch_entropy", 1), ("load_entropy", 1)):  # panel order
        for model in ("moe-cubic", "moe-linear"):  # series order within a panel
            for coef in (0.0, 0.1):
                pick = (res["setting"] == 1) & (res["model"] == model) & np.isclose(res["load_balance"], coef)
                v = res.loc[pick, col].to_numpy() * scale
                expected.append((v.mean() - v.std(ddof=1), v.mean() + v.std(ddof=1)))
    got = [(seg[0][1], seg[1][1]) for seg in bars]
    np.testing.assert_allclose(got, expected, rtol=1e-6)  # results.csv is a text round trip of the drawn frame
