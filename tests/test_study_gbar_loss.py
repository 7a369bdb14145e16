"""The study metric ``loss`` in regime 2 for non-homogeneous (gelu) experts: D3 against an estimated G-bar."""

from __future__ import annotations

import numpy as np
import pytest

import moestat as ms
from moestat import cells as _cells
from moestat.cells import MetricContext, StudyCache, gate_matched_loss, lse_estimator
from moestat.metrics import split_family
from moestat.simulators import Truth

GBAR = {"gbar_n_mc": 3000, "gbar_restarts": 2, "gbar_max_iter": 300, "gbar_init_scale": 0.05}


def _truth(expert: str) -> Truth:
    # k* = 2 in d = 2; both atoms have non-zero gate slopes, so duplicating atom 0 is regime 2
    params = ms.Params(np.array([0.2, -0.3]), np.array([[1.2, -0.4], [-0.8, 0.9]]),
                       np.array([[1.0, 0.5], [-0.7, 1.1]]), np.array([0.3, -0.2]))
    spec = ms.MoE(gate="sigmoid", expert=expert, k=2, d=2, noise_sd=0.1)
    return Truth(spec, params, {"duplicate": [0], "regime": 2})


def _fit_ctx(truth: Truth, n: int, reps: int = 3, seed: int = 5, cache: StudyCache | None = None) -> MetricContext:
    spec3 = truth.spec.with_k(3)
    data = ms.simulate(truth.spec, truth.params, n=n, reps=reps, seed=seed)
    est = lse_estimator(spec3, data.X, data.y, truth=truth, seed=np.random.SeedSequence(seed), device="cpu",
                        init="near_truth", init_scale=0.05, optimizer="lbfgs", max_iter=300, box=3.0)
    return MetricContext(est, spec3, truth.spec, truth.params, truth.info, data,
                         np.random.SeedSequence(11, spawn_key=(1, n)), cache=cache)


@pytest.fixture(scope="module")
def gelu_cells():
    cache = StudyCache()  # one study run's cache, shared by its cells
    truth = _truth("gelu")
    cells = {n: (ctx, gate_matched_loss(ctx, **GBAR))
             for n in (300, 20_000) for ctx in [_fit_ctx(truth, n, cache=cache)]}
    return cells, cache


def test_gelu_regime2_loss_is_finite_and_records_gbar(gelu_cells):
    gelu_cells, cache = gelu_cells
    ctx, out = gelu_cells[300]
    assert list(out["loss_kind"]) == ["D3 estimated G-bar"] * 3
    assert np.isfinite(out["loss"]).all() and (out["loss"] > 0).all()
    assert (out["gbar_n_mc"] == 3000).all() and (out["gbar_restarts"] == 2).all()
    assert np.isfinite(out["gbar_l2"]).all() and (out["gbar_l2"] >= 0).all()
    # one G-bar per (truth, k, duplicate, box, settings): both cells (different n and metric streams) share it
    assert len(cache) == 1
    assert out["gbar_seed"][0] == gelu_cells[20_000][1]["gbar_seed"][0]
    # D3 is the infimum over the cached near-minimisers, computed independently here
    res = cache.values()[0]
    assert res.settings["box"] != "None"  # the fit's box (3.0) was passed on
    assert np.abs(res.params.expert_weight).max() <= 3.0 + 1e-12
    direct = np.min([ms.voronoi_loss(ctx.fit.params, None, kind="D3",
                                     gbar=res.near_minimisers.select(s)) for s in range(int(res.near.sum()))],
                    axis=0)
    np.testing.assert_allclose(out["loss"], direct, rtol=1e-12)


def test_gelu_regime2_loss_falls_with_n(gelu_cells):
    """Fixed seeds; the fits at n = 20000 are ~8x closer to G-bar (in D3, a first-order loss expected to fall like
    n^{-1/2}, i.e. by ~8x over this 67x range) than at n = 300.  We require only a factor 2 on the median:
    G-bar is itself approximate (the estimate's L2 distance and its optimiser floor), which caps how far D3
    can fall, and three replicates give a noisy median."""
    gelu_cells, _ = gelu_cells
    small = np.median(gelu_cells[300][1]["loss"])
    large = np.median(gelu_cells[20_000][1]["loss"])
    assert large < small / 2, (small, large)


def test_gelu_regime2_loss_is_reproducible(gelu_cells):
    """Same study seed, fresh cache -> the same G-bar and bit-identical losses (CPU, float64)."""
    import dataclasses

    ctx, out = gelu_cells[0][300]
    again = gate_matched_loss(dataclasses.replace(ctx, cache=StudyCache()), **GBAR)
    np.testing.assert_array_equal(again["loss"], out["loss"])


def test_relu_regime2_still_uses_the_split_family():
    """Homogeneous experts keep the exact split family; no G-bar is estimated and no gbar_* columns appear."""
    cache = StudyCache()
    truth = _truth("relu")
    member = split_family(truth.params, [0], [0.25, 0.6])
    est = _cells.Estimate(member, np.zeros(2), np.ones(2, bool), {}, {"duplicate": "0"})
    ctx = MetricContext(est, truth.spec.with_k(3), truth.spec, truth.params, truth.info, None,
                        np.random.SeedSequence(0), cache=cache)
    out = gate_matched_loss(ctx, **GBAR)
    assert list(out) == ["loss", "loss_kind"]
    assert list(out["loss_kind"]) == ["D3 split family"] * 2
    np.testing.assert_allclose(out["loss"], 0.0, atol=1e-9)  # 0.25 and 0.6 lie on the 201-point t-grid
    assert len(cache) == 0


def test_fit_box_parsing():
    est = _cells.Estimate(None, np.zeros(1), np.ones(1, bool), {},
                          {"box": "gate_bias=(-2.0, 2.0);expert_weight=(-1.0, 3.0)"})
    ctx = MetricContext(est, None, None, None, {}, None, np.random.SeedSequence(0))
    assert _cells._fit_box(ctx) == {"gate_bias": (-2.0, 2.0), "expert_weight": (-1.0, 3.0)}
    est.settings["box"] = "none"
    assert _cells._fit_box(ctx) is None


def test_theory_loss_picks_each_theorems_loss():
    """moestat.metrics.theory_loss: softmax Voronoi loss, D1 in regime 1 or at k = k*, D3 over the split family for
    relu in regime 2, D3 over given near-minimisers otherwise (and an error naming gbar= when they are missing)."""
    from moestat.metrics import split_family, theory_loss, theory_loss_kind, voronoi_loss

    relu2 = ms.presets.gate_comparison("relu", truth_gate="sigmoid", d=3, seed=0, regime=2)
    relu1 = ms.presets.gate_comparison("relu", truth_gate="sigmoid", d=3, seed=0, regime=1)
    gelu2 = ms.presets.gate_comparison("gelu", truth_gate="sigmoid", d=3, seed=0, regime=2)
    soft = ms.presets.gate_comparison("relu", truth_gate="softmax", d=3, seed=0)
    k4 = relu2.spec.with_k(4)
    assert theory_loss_kind(soft.spec.with_k(4), soft.spec, soft.params, [0]) == "softmax"
    assert theory_loss_kind(k4, relu1.spec, relu1.params, [0]) == "D1"
    assert theory_loss_kind(relu2.spec, relu2.spec, relu2.params, []) == "D1"
    assert theory_loss_kind(k4, relu2.spec, relu2.params, [0]) == "D3 split family"
    assert theory_loss_kind(gelu2.spec.with_k(4), gelu2.spec, gelu2.params, [0]) == "D3 estimated G-bar"
    fit = split_family(relu2.params, [0], [0.3, 0.7]).perturb(0.01, seed=1)   # two fitted "replicates"
    value, kind = theory_loss(fit, relu2.params, k4, relu2.spec, [0], n_split=11)
    expected = voronoi_loss(fit, None, kind="D3", gbar=split_family(relu2.params, [0], np.linspace(0, 1, 11)))
    np.testing.assert_allclose(value, expected, rtol=1e-12)
    assert kind == "D3 split family"
    with pytest.raises(ValueError, match="gbar="):
        theory_loss(fit, gelu2.params, gelu2.spec.with_k(4), gelu2.spec, [0])


def test_gbar_is_kept_in_the_study_folder_and_reused(tmp_path, monkeypatch):
    """With a cache folder (a checkpointed study's DIR/cache) the estimated G-bar is written there once; a fresh
    process (empty in-memory cache) or a resumed run reads it instead of re-estimating, and a damaged file is
    recomputed."""
    import dataclasses

    from moestat.fit import gbar as gbar_mod

    truth = _truth("gelu")
    ctx = dataclasses.replace(_fit_ctx(truth, 300), cache_dir=str(tmp_path / "cache"))
    first = gate_matched_loss(ctx, **GBAR)  # no StudyCache: one for this call, on the folder
    (stored,) = (tmp_path / "cache").glob("gbar-*.pkl")
    calls = []
    real = gbar_mod.estimate_gbar
    monkeypatch.setattr(gbar_mod, "estimate_gbar", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = gate_matched_loss(ctx, **GBAR)
    assert calls == []  # read from the folder
    np.testing.assert_array_equal(again["loss"], first["loss"])
    stored.write_bytes(b"torn")
    third = gate_matched_loss(ctx, **GBAR)
    assert calls == [1] and stored.stat().st_size > 100  # recomputed and rewritten
    np.testing.assert_array_equal(third["loss"], first["loss"])


def test_a_study_run_estimates_gbar_once_and_keeps_nothing_after_it(monkeypatch):
    """The cache belongs to the run: two cells (two n) of one truth share one G-bar estimate, and a second run of
    the same study estimates it again (no process-global state survives a run)."""
    from moestat.fit import gbar as gbar_mod

    calls = []
    real = gbar_mod.estimate_gbar
    monkeypatch.setattr(gbar_mod, "estimate_gbar", lambda *a, **k: calls.append(1) or real(*a, **k))
    study = ms.Study(name="gbar-once", seed=3, reps=2, n=[200, 400],
                     truth={"preset": "gate_comparison", "expert": "gelu", "d": 2, "k": 2, "seed": 0},
                     fit={"k": "truth+1", "options": {"init": "near_truth", "optimizer": "lbfgs", "max_iter": 50,
                                                      "box": 3.0}},
                     metrics=["loss"], metric_options={"loss": GBAR})
    first = study.run(progress=False)
    assert calls == [1] and set(first["loss_kind"]) == {"D3 estimated G-bar"}
    again = study.run(progress=False)
    assert calls == [1, 1]
    np.testing.assert_array_equal(again["loss"], first["loss"])
