"""Smoke test of the patch-routing vignette (loaded through the vignette index) on a configuration smaller than
--quick (--quick itself: ~35 s). Its science is tested in tests/papers/test_chowdhury2023.py and
tests/rates/test_ratios.py."""

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import moestat._vignette_index as vindex
from moestat import figstyle as fs

pytest.importorskip("moestat.rates", reason="the vignette's sample-complexity step uses moestat.rates")


def _load():
    return vindex.load(vindex.find("patch-routing"))


def _record_figures(mod, monkeypatch) -> dict:
    """Replace figstyle.save (as the vignette calls it) by one that records each figure's facts, then saves."""
    drawn = {}
    save = fs.save

    def record(fig, path, **kwargs):
        fig.canvas.draw()
        drawn[Path(path).name] = _figure_facts(fig)
        save(fig, path, **kwargs)

    monkeypatch.setattr(fs, "save", record)
    return drawn


def _figure_facts(fig) -> dict:
    """What the style promises of a drawn figure: panels with titles and labels, legends and where they sit, the
    texts (caption and notes included), the error bars and the smallest displayed font."""
    renderer = fig.canvas.get_renderer()
    data_axes = [a for a in fig.axes if a.get_visible() and a.axison]
    legends = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    texts = " ".join(t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text")) if t.get_visible())
    texts = " ".join(texts.split())  # captions and notes are wrapped: compare words
    return {"titles": [a.get_title() for a in data_axes], "xlabels": [a.get_xlabel() for a in data_axes],
            "ylabels": [a.get_ylabel() for a in data_axes],
            "legend_over_data": any(leg.get_window_extent(renderer).overlaps(a.get_window_extent(renderer))
                                    for leg in legends for a in data_axes),
            "legend_labels": [t.get_text() for leg in legends for t in leg.get_texts()],
            "n_legends": len(legends), "texts": texts, "font_px": fs.smallest_font_px(fig),
            "errorbars": [[seg for seg in c.lines[2][0].get_segments()] for a in data_axes for c in a.containers
                          if getattr(c, "has_yerr", False)]}


def _check_style(drawn: dict) -> None:
    for name, facts in drawn.items():
        assert facts["titles"] and all(facts["titles"]), name  # a title on every panel
        assert all(facts["xlabels"]) and all(facts["ylabels"]), name  # labelled axes
        assert facts["n_legends"] == 1 and not facts["legend_over_data"], name  # one legend, outside the data
        assert facts["font_px"] >= fs.MIN_FONT_PX, name  # legible at the docs' page width


def _stamps(folder):
    return {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.glob("*/cells/*.parquet")}


def test_import_computes_nothing_and_defines_the_contract(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    mod = _load()
    assert time.perf_counter() - t0 < 5
    assert mod.NAME == "patch-routing" and isinstance(mod.TITLE, str) and callable(mod.run)
    assert list(tmp_path.iterdir()) == []
    cfg = mod.config(quick=False)
    # every block is one study: truth = the data setting, fits = the models, n = the training sizes
    for block in cfg["blocks"]:
        study = mod.block_study(cfg, block)
        assert study.n == block["grid"] and study.reps == block["runs"]
        assert [f["label"] for f in study.fits] == block["models"]
    sweeps = mod.sweep_study(cfg)
    assert len(sweeps.fits) == len(cfg["sweeps"]["k_grid"]) + len(cfg["sweeps"]["l_grid"])


def _small_config(mod):
    cfg = mod.config(quick=True)
    cfg.update(max_epochs=10, n_test=200, n_resamples=200)
    for block in cfg["blocks"]:
        block["grid"] = [8, 16, 32, 64, 128]
        block["runs"] = 2
    return cfg


def test_quick_run_writes_results_rates_figures_provenance(tmp_path, monkeypatch):
    mod = _load()
    small = _small_config(mod)
    monkeypatch.setattr(mod, "config", lambda quick=False: small)
    drawn = _record_figures(mod, monkeypatch)
    mod.run(tmp_path, quick=True, parts=("blocks",))
    res = pd.read_csv(tmp_path / "results.csv")
    assert {"model", "run", "n_train", "accuracy", "variant", "l", "n_patches", "cell"} <= set(res.columns)
    assert set(res["model"]) == {"pmoe", "cnn"} and set(res["variant"]) == {"synthetic", "digits"}
    assert res["accuracy"].between(0, 1).all()
    # one row per (block, model, run, size)
    n_fits = sum(len(b["models"]) for b in small["blocks"])
    assert len(res) == n_fits * 2 * 5
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert {"n_star", "ratio", "scaling"} <= set(rates["kind"])
    for name in ("accuracy_vs_n.png", "nstar_vs_n_over_l.png", "provenance.json"):
        assert (tmp_path / name).exists()
    assert len(list((tmp_path / "study").iterdir())) == len(small["blocks"])
    _check_blocks_figures(drawn, res, rates)
    # resume: a second call reuses the saved study cells (no retraining) and reproduces the same results
    stamps = _stamps(tmp_path / "study")
    assert len(stamps) == n_fits * 5
    mod.run(tmp_path, quick=True, parts=("blocks",))
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "results.csv"), res)
    assert _stamps(tmp_path / "study") == stamps


def _check_blocks_figures(drawn: dict, res: pd.DataFrame, rates: pd.DataFrame) -> None:
    assert set(drawn) == {"accuracy_vs_n.png", "nstar_vs_n_over_l.png"}
    _check_style(drawn)
    acc, ns = drawn["accuracy_vs_n.png"], drawn["nstar_vs_n_over_l.png"]
    assert acc["titles"] == ["synthetic data, n = 16 patches", "digits data, n = 16 patches"]
    assert acc["xlabels"] == [fs.label("n_train")] * 2 and acc["ylabels"] == ["test accuracy"] * 2
    assert "pMoE, separate training ($k$ = 2, $l$ = 2)" in acc["legend_labels"]
    # the caption says what a marker and a bar are, and over how many runs
    assert "markers: mean test accuracy (200 test samples)" in acc["texts"]
    assert r"bars: $\pm$1 SD over R = 2 runs" in acc["texts"]
    # each bar is mean +- 1 SD (ddof 1) over the runs of results.csv: first panel, first model (pmoe), in N order
    v = res.query("variant == 'synthetic' and n_patches == 16 and model == 'pmoe'").groupby("n_train")["accuracy"]
    expected = np.column_stack([v.mean() - v.std(), v.mean() + v.std()])
    got = np.array([[seg[0][1], seg[1][1]] for seg in acc["errorbars"][0]])
    np.testing.assert_allclose(got, expected, rtol=1e-6)  # results.csv is a text round trip of the drawn frame
    target = max(rates.query("kind == 'n_star' and variant == 'synthetic'")["target"])
    assert ns["titles"] == [f"synthetic data: sample complexity $n^*$ at {target:.0%} accuracy vs $n/l$"]
    assert ns["ylabels"] == [rf"$n^*$ (training samples for {target:.0%})"]
    assert "bars: 95% CI of the $n^*$ (bootstrap of the runs within each N)" in ns["texts"]
    assert "censored $n^*$ (target not reached) is not drawn" in ns["texts"]


def _sweep_config(mod):
    cfg = mod.config(quick=True)
    cfg.update(max_epochs=8, n_test=200)
    cfg["sweeps"].update(sizes=[16, 32], runs=2, k_grid=[1, 4], l_grid=[2, 6])
    return cfg


def test_sweeps_write_one_row_per_knob_value_run_and_size(tmp_path, monkeypatch):
    mod = _load()
    cfg = _sweep_config(mod)
    monkeypatch.setattr(mod, "config", lambda quick=False: cfg)
    drawn = _record_figures(mod, monkeypatch)
    mod.run(tmp_path, quick=True, parts=("sweeps",))
    assert not (tmp_path / "results.csv").exists()   # the blocks part did not run
    sw = pd.read_csv(tmp_path / "sweeps.csv")
    assert {"sweep", "k", "l", "run", "n_train", "accuracy", "routing_maxgate", "l_star"} <= set(sw.columns)
    assert list(sw.columns[:3]) == ["sweep", "k", "l"]
    assert sw["accuracy"].between(0, 1).all() and sw["routing_maxgate"].between(0, 1).all()
    # one row per (knob value, run, N); the other knob stays at the paper's joint setting k = 8, l = 6
    for knob, other, grid, fixed in (("k", "l", [1, 4], 6), ("l", "k", [2, 6], 8)):
        sub = sw[sw["sweep"] == knob]
        assert len(sub) == len(grid) * 2 * 2
        assert not sub.duplicated([knob, "run", "n_train"]).any()
        assert sorted(sub[knob].unique()) == grid and set(sub[other]) == {fixed}
        assert set(sub["n_train"]) == {16, 32} and set(sub["model"]) == {"pmoe-joint"}
    assert set(sw["l_star"]) == {6}
    summ = pd.read_csv(tmp_path / "sweeps_summary.csv")
    assert len(summ) == 4 * 2 and (summ["runs"] == 2).all()
    assert (tmp_path / "sweep_k_l.png").exists() and (tmp_path / "sweep_slopes.csv").exists()
    _check_sweep_figure(drawn, sw)
    # redraw from the summary alone (as for the checked-in docs): the same figure, l* recomputed from the data
    (tmp_path / "sweeps.csv").rename(tmp_path / "sweeps.keep")
    first = drawn.pop("sweep_k_l.png")
    assert mod.redraw(tmp_path, quick=True) == ["sweep_k_l.png"]
    _check_sweep_figure(drawn, sw)  # the same bars (sweeps_summary.csv holds the runs' mean, sd and count)
    assert {k: drawn["sweep_k_l.png"][k] for k in ("titles", "texts")} == {k: first[k] for k in ("titles", "texts")}
    (tmp_path / "sweeps.keep").rename(tmp_path / "sweeps.csv")
    stamps = _stamps(tmp_path / "study")
    assert len(stamps) == 4 * 2
    mod.run(tmp_path, quick=True, parts=("sweeps",))
    assert _stamps(tmp_path / "study") == stamps
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "sweeps.csv"), sw)


def _check_sweep_figure(drawn: dict, sw: pd.DataFrame) -> None:
    assert set(drawn) == {"sweep_k_l.png"}
    _check_style(drawn)
    facts = drawn["sweep_k_l.png"]
    assert facts["titles"] == ["accuracy vs number of experts ($l$ = 6)", "accuracy vs patches per expert ($k$ = 8)"]
    assert facts["xlabels"] == ["number of experts $k$", "patches per expert $l$"]
    assert facts["ylabels"] == ["test accuracy"] * 2
    assert facts["legend_labels"] == ["$N$ = 16", "$N$ = 32", "$l^*$ = 6 (Definition D.3)"]
    assert r"bars: $\pm$1 standard error of the mean over R = 2 runs" in facts["texts"]
    # each bar is mean +- sd / sqrt(R) over the runs of sweeps.csv, computed here from the rows
    # (panel k then l; one series per N; points in knob order)
    expected = []
    for knob in ("k", "l"):
        for N in (16, 32):
            g = sw[(sw["sweep"] == knob) & (sw["n_train"] == N)].groupby(knob)["accuracy"]
            se = g.std() / np.sqrt(g.size())
            expected.append(np.column_stack([g.mean() - se, g.mean() + se]))
    got = [np.array([[seg[0][1], seg[1][1]] for seg in bars]) for bars in facts["errorbars"]]
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)  # sweeps.csv is a text round trip of the drawn frame


def test_sweep_l_star_of_the_full_configuration_is_the_papers():
    """The docs' sweep figure is redrawn from sweeps_summary.csv with l* recomputed from the data setting: it must
    be the paper's Fig. 7 value, 6 (5 confusers in every sample + 1, Definition D.3)."""
    mod = _load()
    assert mod.sweep_l_star(mod.config(quick=False)) == 6


def test_run_rejects_unknown_parts(tmp_path):
    with pytest.raises(ValueError, match="parts must be"):
        _load().run(tmp_path, quick=True, parts=("figures",))
