"""Metric adapters of the study runner: the exact split family of regime-2 limits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.exceptions import ConvergenceWarning
from moestat.metrics import split_family


@settings(max_examples=20, deadline=None)
@given(expert=st.sampled_from(["relu", "linear"]), atom=st.integers(0, 7), seed=st.integers(0, 10_000))
def test_split_family_reproduces_the_regression_function(expert, atom, seed):
    """f at every member of the split family equals f at the truth (positive homogeneity), to rounding."""
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert=expert, d=6, seed=seed)
    family = split_family(truth, [atom], np.linspace(0, 1, 7))
    X = np.random.default_rng(seed).uniform(-1, 1, size=(300, 6))
    f_true = spec.mean(truth, X)
    f_family = spec.with_k(9).mean(family, X)
    np.testing.assert_allclose(f_family, np.broadcast_to(f_true, f_family.shape), atol=1e-13)


def test_split_family_is_not_exact_for_gelu():
    """gelu is not homogeneous: splitting its expert changes f (the regime-2 limit is genuinely misspecified)."""
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="gelu", d=6, seed=1)
    family = split_family(truth, [0], [0.5])
    X = np.random.default_rng(0).uniform(-1, 1, size=(300, 6))
    gap = np.abs(spec.with_k(9).mean(family, X)[0] - spec.mean(truth, X)).max()
    assert gap > 1e-3


def test_split_family_errors():
    _, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", d=3, seed=0)
    with pytest.raises(ValueError, match="one duplicated atom"):
        split_family(truth, [0, 1], [0.5])
    with pytest.raises(ValueError, match="out of range"):
        split_family(truth, [8], [0.5])


def _ctx(spec, fit_params, truth, info, settings=None):
    from moestat.cells import Estimate, MetricContext

    R = fit_params.n_reps
    est = Estimate(fit_params, np.zeros(R), np.ones(R, bool), {}, settings or {})
    return MetricContext(est, spec.with_k(fit_params.k), spec, truth, info, None, np.random.SeedSequence(0))


def test_gate_matched_loss_picks_the_theory_loss():
    from moestat.cells import gate_matched_loss

    truth_obj = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", d=5, seed=3)
    spec, truth = truth_obj
    member = split_family(truth, [0], [0.3, 0.7])
    out = gate_matched_loss(_ctx(spec, member, truth, truth_obj.info, {"duplicate": "0"}))
    assert list(out["loss_kind"]) == ["D3 split family"] * 2
    np.testing.assert_allclose(out["loss"], 0.0, atol=1e-9)  # t = 0.3, 0.7 lie on the t-grid
    moved = member.perturb(0.05, seed=1)
    assert (gate_matched_loss(_ctx(spec, moved, truth, truth_obj.info, {"duplicate": "0"}))["loss"] > 1e-3).all()
    # regime 1: the duplicated atom has zero gate slope -> D1 against the truth
    r1 = ms.presets.sigmoid_vs_softmax(regime=1, expert="relu", d=5, seed=3)
    same = split_family(r1.params, [7], [0.5])
    out1 = gate_matched_loss(_ctx(r1.spec, same, r1.params, r1.info, {"duplicate": "7"}))
    assert out1["loss_kind"][0] == "D1"
    np.testing.assert_allclose(out1["loss"], ms.voronoi_loss(same, r1.params, kind="D1"))
    # softmax: the loss of the softmax literature against G*
    sm = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", truth_gate="softmax", d=5, seed=3)
    p = sm.params.numpy()
    order = [*range(8), 0]
    gb = p.gate_bias[order].copy()
    gb[[0, 8]] -= np.log(2.0)  # weight-preserving softmax split: an exact representation
    split = ms.Params(gb, p.gate_weight[order], p.expert_weight[order], p.expert_bias[order]).batched()
    np.testing.assert_allclose(sm.spec.with_k(9).mean(split, np.ones((3, 5)) * 0.2)[0],
                               sm.spec.mean(sm.params, np.ones((3, 5)) * 0.2), atol=1e-12)
    out2 = gate_matched_loss(_ctx(sm.spec, split, sm.params, sm.info))
    assert out2["loss_kind"][0] == "softmax"
    np.testing.assert_allclose(out2["loss"], 0.0, atol=1e-10)


def test_invariance_option_and_representation_metric():
    """options.invariance refits the same data with a second solver from the same starts and scores both fits;
    the representation metric reports the nearest exact representation of each fit."""
    study = ms.Study(
        name="inv", seed=3, reps=2, n=[400],
        truth={"preset": "gate_comparison", "expert": "relu", "seed": 0},
        fit={"label": "lse", "k": "truth+1", "options": {"init": ["near_truth", "kmeans"], "box": 10.0,
                                                          "invariance": {"optimizer": "lm", "max_iter": 300}}},
        metrics=["representation", "l2"], threads=1)
    frame = study.run(progress=False)
    for col in ("param", "over_param", "exact_param", "over_sup", "representation", "l2"):
        assert col in frame and f"{col}_alt" in frame
    assert {"objective_alt", "converged_alt", "status_alt"} <= set(frame.columns)
    assert (frame["invariance"] == "lm").all()
    np.testing.assert_allclose(frame["param"], frame["over_param"] + frame["exact_param"], rtol=1e-12)
    assert frame["representation"].str.match(r"^(split \d|dead|reflection)$").all()
    with pytest.raises(ValueError, match="invariance"):
        ms.Study(name="bad", seed=1, reps=2, n=[300], truth={"preset": "gate_comparison", "expert": "relu"},
                 fit={"k": "truth+1", "options": {"invariance": 3}}, metrics=["l2"]).run(progress=False)


def test_a_converged_gelu_sigmoid_split_ends_at_a_dead_atom_representation():
    """Sigmoid-gated gelu: run to convergence (Newton, the default), a weight split of a true atom ends at an exact
    representation with a dying extra atom, so the basin candidate adds nothing to the exact set; L-BFGS stops on
    its cap partway along the valley, within 1e-3 of f* in L2 yet far from every exact representation in parameters
    (an arbitrary point of the valley, which the metric must not use as a limit)."""
    from moestat.cells import gbar_for, representation_metric

    truth_obj, ctx0, kw = _gelu_split_problem(n_mc=20_000)
    spec, truth = truth_obj
    newton, _ = gbar_for(ctx0, None, **kw)
    lbfgs, _ = gbar_for(ctx0, None, **kw, optimizer="lbfgs")
    assert newton.converged[0] and newton.l2[0] < 1e-9  # measured 2.5e-11: exact up to Newton's gradient tolerance
    assert not lbfgs.converged.any() and 1e-5 < lbfgs.l2[0] < 1e-3  # measured 6.3e-5, after 1,000 iterations

    def scores(point, optimizer):
        ctx = _ctx(spec, point.params.select([0]), truth, truth_obj.info, {"box": "none"})
        auto = representation_metric(ctx, n_mc=5_000, gbar_max_iter=1000, gbar_optimizer=optimizer)
        return auto, representation_metric(ctx, n_mc=5_000, basin="exact")

    auto, exact = scores(newton, "auto")
    # the converged limit is a member of the dead family (measured 6.9e-8 from it), which the exact set holds
    assert exact["representation"][0] == "dead" and exact["param"][0] < 1e-5 and auto["param"][0] < 1e-5
    _, exact = scores(lbfgs, "lbfgs")
    assert exact["representation"][0] == "dead" and exact["param"][0] > 0.1  # measured 1.6
    with pytest.raises(ValueError, match="basin"):
        representation_metric(_ctx(spec, newton.params.select([0]), truth, truth_obj.info, {"box": "none"}),
                              n_mc=100, basin="nearest")


def _gelu_split_problem(n_mc: int):
    """The sigmoid-gated gelu truth of the gate-comparison preset (d = 2, k* = 2), a metric context of a k* + 1
    atom fit (no box), and gbar_for's keywords at ``n_mc`` Monte-Carlo inputs with four Newton starts."""
    truth_obj = ms.presets.gate_comparison("gelu", truth_gate="sigmoid", d=2, k=2, seed=0)
    spec, truth = truth_obj
    ctx = _ctx(spec, _two_atoms(truth), truth, truth_obj.info, {"box": "none"})
    kw = {"n_mc": n_mc, "restarts": 4, "max_iter": 1000, "init_scale": 0.05, "tol_l2": 1e-4, "box": None,
          "device": "cpu"}
    return truth_obj, ctx, kw


def _two_atoms(truth):
    """A batched k* + 1 atom Params (the gbar_for cache key only reads the truth and the fitted k)."""
    return ms.Params(np.r_[truth.gate_bias, 0.0][None], np.r_[truth.gate_weight, np.zeros((1, truth.d))][None],
                     np.r_[truth.expert_weight, np.zeros((1, truth.d))][None], np.r_[truth.expert_bias, 0.0][None])


def test_invariance_from_the_winning_start_only():
    """options.invariance.starts='best' runs the second solver once per replicate, from the starting values of the
    first fit's lowest-objective restart: the same objective as LM run by hand from fit.start_params of that row."""
    from moestat.cells import lse_estimator

    truth = ms.presets.gate_comparison("gelu", seed=1)
    spec = truth.spec.with_k(4)
    data = ms.simulate(truth.spec, truth.params, n=400, reps=2, seed=5)
    opts = {"init": ["near_truth", "kmeans", "random"], "box": 10.0, "max_iter": 200}
    est = lse_estimator(spec, data.X, data.y, truth=truth, seed=7,
                        invariance={"optimizer": "lm", "max_iter": 300, "starts": "best"}, **opts)
    assert est.settings["invariance_starts"] == "best"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit = ms.fit_lse(spec, data.X, data.y, truth=truth.params, duplicate=[0], seed=7, **opts)
        rows = np.flatnonzero(fit.restarts["best"].to_numpy())
        assert fit.start_params.n_reps == 6 and len(rows) == 2
        lm = ms.fit_lse(spec, data.X, data.y, init=fit.start_params.select(rows), optimizer="lm", max_iter=300,
                        box=10.0, seed=7)
    np.testing.assert_array_equal(est.objective, fit.objective)
    # the same deterministic computation from the same start: equal to round-off
    np.testing.assert_allclose(est.alt.objective, lm.objective, rtol=1e-12)
    with pytest.raises(ValueError, match=r"invariance\.starts"):
        lse_estimator(spec, data.X, data.y, truth=truth, invariance={"optimizer": "lm", "starts": "first"}, **opts)


def test_gbar_compiled_gives_the_same_limits_under_its_own_cache_key():
    """``gbar_compile=True`` runs each start's Newton run in C++: the same near-minimiser set as the default
    estimate, recorded in the result's settings and cached apart from it.  The starts end along the flat split
    valley, where two runs to the same gradient tolerance stop at points whose distances to f* differ by up to
    about 1e-7 (at most 5.2e-8 here), three orders below ``tol_l2``.  Whether a start that ends in the valley meets
    the gradient tolerance within ``max_iter`` is not compared: here three of four starts in both estimates, but on
    the H200 host's CPU (torch 2.11) the compiled estimate's third start stopped at the cap, as near as the others."""
    from moestat.cells import gate_matched_loss, gbar_for, representation_metric

    _, ctx, kw = _gelu_split_problem(n_mc=4_000)
    default, seed = gbar_for(ctx, None, **kw)
    compiled, seed_c = gbar_for(ctx, None, **kw, compile=True)
    assert seed == seed_c and "compile" not in default.settings and compiled.settings["compile"] is True
    assert compiled.converged[np.argmin(compiled.l2)] and default.converged[np.argmin(default.l2)]
    np.testing.assert_allclose(compiled.l2, default.l2, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(compiled.near, default.near)
    assert default.l2.max() < 1e-6
    cols = gate_matched_loss(ctx, gbar_n_mc=4_000, gbar_box=None, gbar_compile=True)
    assert cols["gbar_compile"].all() and "gbar_compile" not in gate_matched_loss(ctx, gbar_n_mc=4_000, gbar_box=None)
    # the representation metric's basin estimate takes the option too: the same nearest representation
    rep = [representation_metric(ctx, n_mc=2_000, gbar_n_mc=4_000, gbar_box=None, gbar_compile=c)
           for c in (False, True)]
    assert rep[0]["representation"][0] == rep[1]["representation"][0]
    np.testing.assert_allclose(rep[1]["param"], rep[0]["param"], rtol=1e-4)


def test_gbar_threads_give_the_compiled_estimate_to_the_bit():
    """``gbar_threads`` runs the compiled estimate's starts on that many threads at once: the same limits to the bit
    as one thread, recorded in ``settings``, a ``gbar_threads`` column and the cache key (the tensor loop's BLAS
    may round differently on more threads, so a threaded estimate is never served a one-thread one or back)."""
    import dataclasses

    from moestat.cells import StudyCache, gate_matched_loss, gbar_for

    _, ctx, kw = _gelu_split_problem(n_mc=4_000)
    ctx = dataclasses.replace(ctx, cache=StudyCache())
    one, _ = gbar_for(ctx, None, **kw, compile=True)
    two, _ = gbar_for(ctx, None, **kw, compile=True, threads=2)
    assert len(ctx.cache) == 2  # two keys
    assert "threads" not in one.settings and two.settings["threads"] == 2
    np.testing.assert_array_equal(two.l2, one.l2)
    np.testing.assert_array_equal(two.params.gate_weight, one.params.gate_weight)
    np.testing.assert_array_equal(two.params.expert_weight, one.params.expert_weight)
    cols = gate_matched_loss(ctx, gbar_n_mc=4_000, gbar_box=None, gbar_compile=True, gbar_threads=2)
    assert (cols["gbar_threads"] == 2).all()
    assert "gbar_threads" not in gate_matched_loss(ctx, gbar_n_mc=4_000, gbar_box=None, gbar_compile=True)


@pytest.mark.parametrize(("options", "message"), [
    ({"gbar_thread": 2}, r"metric_options.representation.gbar_thread is not an option of metric 'representation' "
                         r"\(did you mean 'gbar_threads'\?\)"),
    ({"gbar_threads": 0}, r"metric_options.representation.gbar_threads must be None or an integer >= 1, got 0"),
    ({"gbar_restarts": 2.5}, r"metric_options.representation.gbar_restarts must be an integer >= 1, got 2.5"),
    ({"gbar_device": "gpu"}, r"metric_options.representation.gbar_device must be 'auto', 'cpu'"),
])
def test_metric_options_are_checked_before_any_cell_runs(options, message):
    """A metric option the metric does not take, or a gbar_* value that estimate_gbar would reject, is refused when
    the study is built, naming the option as the study spells it."""
    with pytest.raises(ms.study.StudyConfigError, match=message):
        ms.Study(truth={"preset": "sigmoid_vs_softmax", "regime": 2, "expert": "gelu", "d": 2},
                 fit={"k": "truth+1"}, n=[100], reps=1, metrics=["representation"],
                 metric_options={"representation": options})


def test_metric_options_of_a_custom_metric_with_keyword_catch_all_are_not_restricted():
    def custom(ctx, **options):
        return {}

    study = ms.Study(truth={"preset": "sigmoid_vs_softmax", "regime": 2, "expert": "gelu", "d": 2},
                     fit={"k": "truth+1"}, n=[100], reps=1, metrics=[custom], metric_options={"custom": {"any": 1}})
    assert study.metric_options == {"custom": {"any": 1}}
