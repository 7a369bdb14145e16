"""Likelihood studies: the 'mle' estimator, its near-truth start, parameter columns, the Gaussian-MoE Voronoi loss
metric, and Study.performance on its frame."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

import moestat as ms
from moestat.cells import MetricContext, gaussian_voronoi_metric, near_truth_mle_start
from moestat.simulators import Truth
from moestat.study import Study, StudyConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

GAUSS_TRUTH = {"label": "g2", "gate": "softmax", "expert": "linear", "k": 2, "d": 1, "model": "mixture",
               "params": {"gate_bias": [1.0, 0.0], "gate_weight": [[3.0], [0.0]], "expert_weight": [[1.0], [-1.0]],
                          "expert_bias": [0.5, -0.5], "noise_sd": [0.2, 0.4]}}
SPEC = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
TRUTH = ms.Params([1.0, 0.0], [[3.0], [0.0]], [[1.0], [-1.0]], [0.5, -0.5], noise_sd=[0.2, 0.4])


@pytest.fixture(scope="module")
def mle_study(tmp_path_factory):
    study = Study(name="mle", truth=GAUSS_TRUTH,
                  fit=[{"label": "exact", "estimator": "mle", "options": {"init": "near_truth", "init_scale": 0.0}},
                       {"label": "over", "estimator": "mle", "k": 3,
                        "options": {"init": "near_truth", "duplicate": [0]}}],
                  n=[100, 200, 400], reps=3, metrics=["gaussian_voronoi", "l2"], seed=5, threads=1)
    folder = tmp_path_factory.mktemp("mle_study")
    return study, study.run(folder, progress=False), folder


def _cell_data(study: Study, n: int) -> ms.simulators.regression.Dataset:
    key = next(c["data_key"] for c in study.cells if c["n"] == n)
    return ms.simulate(SPEC, TRUTH, n=n, reps=study.reps, seed=np.random.SeedSequence(study.seed, spawn_key=key),
                       model="mixture")


def test_exact_fit_columns_match_a_direct_fit_mle_call(mle_study):
    """Estimates, standard errors and true values recorded by the study equal a fit_mle call made here on the same
    data (simulated independently from the cell's data seed) from the truth (init_scale = 0, no random restarts)."""
    study, frame, _ = mle_study
    rows = frame[(frame["fit"] == "exact") & (frame["n"] == 200)].sort_values("rep")
    data = _cell_data(study, 200)
    fit = ms.fit_mle(SPEC, data.X, data.y, init=TRUTH, restarts=0, seed=0)
    aligned = fit.align_to(TRUTH)
    names = aligned.param_names
    np.testing.assert_allclose(rows[[f"est:{t}" for t in names]].to_numpy(), aligned.theta, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(rows[[f"se:{t}" for t in names]].to_numpy(), aligned.bse(), rtol=1e-6)
    np.testing.assert_allclose(rows["objective"], -np.asarray(fit.loglik) / 200, rtol=1e-10)
    # theta* by hand: softmax gate row 0 against the last expert, expert rows (const, x1), log sigma
    expect = {"gate[0]:const": 1.0, "gate[0]:x1": 3.0, "expert[0]:const": 0.5, "expert[0]:x1": 1.0,
              "expert[1]:const": -0.5, "expert[1]:x1": -1.0, "expert[0]:log_sigma": np.log(0.2),
              "expert[1]:log_sigma": np.log(0.4)}
    assert set(expect) == set(names)
    for term, value in expect.items():
        assert (rows[f"true:{term}"] == value).all(), term
    assert (rows["status"] == "ok").all() and (rows["se"] == "oim").all() and (rows["init"] == "near_truth").all()


def test_over_specified_fits_have_cell_patterns_and_no_parameter_columns(mle_study):
    _, frame, _ = mle_study
    over = frame[frame["fit"] == "over"]
    assert over["est:gate[0]:const"].isna().all()  # k = 3 has no term-by-term truth
    assert (over["se"] == "none").all() and (over["k"] == 3).all()  # se="auto": no SEs without a term-wise truth
    # three fitted atoms in two cells: a pattern "2-1" or "1-2" (or an empty cell)
    assert set(over["cell_sizes"]) <= {"2-1", "1-2", "3-0", "0-3"} and (over["voronoi_kind"] == "over").all()
    assert (frame.loc[frame["fit"] == "exact", "cell_sizes"] == "1-1").all()
    # the pattern column is a grouping column of the rate fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ms.RateWarning)  # 3 n values, 3 replicates: expected fragility warnings
        res = ms.fit_rate(frame[frame["fit"] == "exact"], "gaussian_voronoi", by="cell_sizes")
    assert list(res.table["cell_sizes"]) == ["1-1"] and np.isfinite(res.table["exponent"]).all()


def test_near_truth_start_splits_atoms_and_keeps_noise_sds():
    """Hand calculation: truth gate intercepts (1, 0), atom 0 split into two copies -> intercepts 1 - log 2 for
    both copies; after the last-expert normalisation the copies' summed softmax weight against atom 1 is still
    e^1 : e^0, and every copy starts at its atom's noise sd."""
    truth = Truth(SPEC, TRUTH, {"duplicate": [0]})
    spec3 = ms.MoE(gate="softmax", expert="linear", k=3, d=1)
    start, dup = near_truth_mle_start(spec3, truth, 2, None, 0.0, np.random.SeedSequence(1))
    assert dup == [0]
    np.testing.assert_allclose(start.noise_sd, [[0.2, 0.4, 0.2]] * 2)
    gb = start.gate_bias[0]
    np.testing.assert_allclose(gb, [0.0, -(1 - np.log(2)), 0.0], atol=1e-12)
    w = np.exp(gb)
    np.testing.assert_allclose((w[0] + w[2]) / w[1], np.e, rtol=1e-12)
    np.testing.assert_allclose(start.expert_bias[0], [0.5, -0.5, 0.5])
    noisy, _ = near_truth_mle_start(spec3, truth, 2, [0], 0.1, np.random.SeedSequence(1))
    assert not np.allclose(noisy.expert_bias[0], noisy.expert_bias[1])  # each replicate its own perturbation
    with pytest.raises(ValueError, match=r"duplicate index 5 is out of range"):
        near_truth_mle_start(spec3, truth, 2, [5], 0.0, np.random.SeedSequence(1))


def test_gaussian_voronoi_metric_by_hand():
    """D1 of a fit that moves expert 1's intercept by 0.1: on the translation-centred measures the weights are
    pi = softmax(1, 0), so D1 = pi_1 * 0.1 = 0.1 / (1 + e); a split truth has loss 0 and pattern '2-1'."""
    moved = ms.Params([1.0, 0.0], [[3.0], [0.0]], [[1.0], [-1.0]], [0.5, -0.4], noise_sd=[0.2, 0.4]).batched(1)
    est = ms.cells.Estimate(moved, np.zeros(1), np.ones(1, dtype=bool))
    ctx = MetricContext(est, SPEC, SPEC, TRUTH, {}, None, np.random.SeedSequence(0))
    cols = gaussian_voronoi_metric(ctx)
    np.testing.assert_allclose(cols["gaussian_voronoi"], [0.1 / (1 + np.e)], rtol=1e-12)
    assert list(cols["cell_sizes"]) == ["1-1"] and list(cols["voronoi_kind"]) == ["exact"]
    spec3 = ms.MoE(gate="softmax", expert="linear", k=3, d=1)
    split, _ = near_truth_mle_start(spec3, Truth(SPEC, TRUTH, {}), 1, [0], 0.0, np.random.SeedSequence(0))
    ctx3 = MetricContext(ms.cells.Estimate(split, np.zeros(1), np.ones(1, dtype=bool)), spec3, SPEC, TRUTH, {},
                         None, np.random.SeedSequence(0))
    cols3 = gaussian_voronoi_metric(ctx3)
    np.testing.assert_allclose(cols3["gaussian_voronoi"], [0.0], atol=1e-12)
    assert list(cols3["cell_sizes"]) == ["2-1"] and list(cols3["n_empty_cells"]) == [0]


def test_performance_matches_hand_computation(mle_study):
    study, frame, _ = mle_study
    perf = study.performance(frame)
    rows = frame[(frame["fit"] == "exact") & (frame["n"] == 400)]
    term = "expert[0]:x1"
    est, se, true = rows[f"est:{term}"], rows[f"se:{term}"], rows[f"true:{term}"]
    sel = perf[(perf["fit"] == "exact") & (perf["n"] == 400) & (perf["quantity"] == term)].set_index("measure")
    R = len(rows)
    np.testing.assert_allclose(sel.loc["bias", "estimate"], (est - true).mean(), rtol=1e-12)
    np.testing.assert_allclose(sel.loc["bias", "mcse"], est.std(ddof=1) / np.sqrt(R), rtol=1e-12)
    z = stats.norm.ppf(0.975)
    np.testing.assert_allclose(sel.loc["coverage", "estimate"], np.mean(np.abs(est - true) <= z * se))
    np.testing.assert_allclose(sel.loc["model_se", "estimate"], np.sqrt(np.mean(se**2)), rtol=1e-12)
    # metric rows: mean with s / sqrt(R); log of the mean with a leave-one-out jackknife written out here
    loss = frame.loc[(frame["fit"] == "over") & (frame["n"] == 100), "gaussian_voronoi"].to_numpy()
    met = perf[(perf["fit"] == "over") & (perf["n"] == 100) & (perf["quantity"] == "gaussian_voronoi")]
    met = met.set_index("measure")
    np.testing.assert_allclose(met.loc["mean", ["estimate", "mcse"]], [loss.mean(), loss.std(ddof=1) / np.sqrt(3)],
                               rtol=1e-12)
    loo = np.array([np.log(np.delete(loss, i).mean()) for i in range(3)])
    np.testing.assert_allclose(met.loc["log_mean", "mcse"], np.sqrt(2 / 3 * ((loo - loo.mean()) ** 2).sum()),
                               rtol=1e-12)
    np.testing.assert_allclose(met.loc["mean_log", "estimate"], np.log(loss).mean(), rtol=1e-12)
    assert set(perf["kind"]) == {"metric", "parameter"}
    assert set(perf.loc[perf["kind"] == "metric", "quantity"]) == {"gaussian_voronoi", "l2"}
    assert (perf.loc[perf["kind"] == "parameter", "fit"] == "exact").all()  # no parameter rows for k = 3


def test_performance_input_errors(mle_study):
    study, frame, _ = mle_study
    with pytest.raises(ValueError, match=r"metrics \['D9'\] are not columns of the frame"):
        study.performance(frame, ["D9"])
    with pytest.raises(ValueError, match=r"by=\['gate_x'\]: columns \['gate_x'\] are not in the frame"):
        study.performance(frame, by=["gate_x"])
    with pytest.raises(TypeError, match="results must be the study's frame"):
        study.performance(3)


def test_not_converged_mle_fits_are_rows():
    """Two EM iterations cannot converge at tol 1e-14: every replicate is kept with status not_converged."""
    s = Study(truth=GAUSS_TRUTH, fit={"estimator": "mle", "options": {"max_iter": 2, "tol": 1e-14, "restarts": 1,
                                                                      "switch_after": None, "se": "none"}},
              n=[60], reps=2, seed=3, threads=1, max_failures=2)
    with pytest.warns(ms.study.StudyFailureWarning, match="2 not converged"):
        df = s.run(progress=False)
    assert (df["status"] == "not_converged").all() and (~df["converged"]).all() and (df["n_iter"] <= 2).all()
    assert (df["message"] == "").all()


@pytest.mark.parametrize("options, message", [
    ({"init": "kmeans"}, r"options.init must be one of the valid values \['random', 'near_truth'\]"),
    ({"methd": "em"}, r"options.methd is not an option of estimator 'mle' \(did you mean 'method'\?\)"),
    ({"method": "newton"}, r"options.method must be one of the valid values \['em', 'gradient'\]"),
    ({"se": "hessian"}, r"options.se must be one of the valid values \['auto', 'oim'"),
    ({"duplicate": [-1]}, r"options.duplicate must be a list of non-negative integer atom indices"),
    ({"restarts": -1}, r"options.restarts must be an integer >= 0"),
    ({"formula": "y ~ x"}, r"options.formula is not an option of estimator 'mle'"),
])
def test_mle_options_are_checked_at_configuration(options, message):
    with pytest.raises(StudyConfigError, match=message):
        Study(truth=GAUSS_TRUTH, fit={"estimator": "mle", "options": options}, n=[50], reps=2)


def test_mle_study_round_trips_through_toml():
    s = Study(truth=GAUSS_TRUTH, fit={"estimator": "mle", "options": {"init": "near_truth", "method": "gradient"}},
              n=[50], reps=2, metrics=["gaussian_voronoi"], metric_options={"gaussian_voronoi": {"rbar": {"4": 8.0}}})
    back = Study.from_toml(s.to_toml())
    assert [c["id"] for c in back.cells] == [c["id"] for c in s.cells]
    assert back.fits[0]["options"] == {"init": "near_truth", "method": "gradient"}
