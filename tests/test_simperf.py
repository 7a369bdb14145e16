"""Performance measures with MCSE (moestat.simperf): hand calculations, an independent transcription of rsimsum's
formulas, a brute-force Monte Carlo check of every MCSE, the jackknife MCSE and replicate sizing."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from moestat.simperf import MEASURES, jackknife_mcse, n_reps_for, performance_measures


def _table(res: pd.DataFrame) -> pd.DataFrame:
    return res.set_index("measure")


# ------------------------------------------------------------------------------------------------ hand calculation
def test_truth_measures_match_a_hand_calculation():
    # estimates 1, 1.5, 0.5, 2 of theta = 1: errors 0, .5, -.5, 1; mean estimate 1.25, sum of squared
    # deviations from it 1.25; squared errors 0, .25, .25, 1.
    frame = pd.DataFrame({"estimate": [1.0, 1.5, 0.5, 2.0], "truth": 1.0})
    t = _table(performance_measures(frame))
    assert list(t.index) == ["bias", "relative_bias", "empirical_se", "mse", "rmse"]
    assert t.loc["bias", "estimate"] == pytest.approx(0.25)
    assert t.loc["bias", "mcse"] == pytest.approx(math.sqrt(1.25 / (4 * 3)))
    assert t.loc["relative_bias", "estimate"] == pytest.approx(0.25)          # theta = 1
    assert t.loc["empirical_se", "estimate"] == pytest.approx(math.sqrt(1.25 / 3))
    assert t.loc["empirical_se", "mcse"] == pytest.approx(math.sqrt(1.25 / 3) / math.sqrt(6))
    assert t.loc["mse", "estimate"] == pytest.approx(0.375)
    # (d^2 - mse)^2 = .140625 + .015625 + .015625 + .390625 = .5625, over n(n-1) = 12
    assert t.loc["mse", "mcse"] == pytest.approx(math.sqrt(0.5625 / 12))
    assert t.loc["rmse", "estimate"] == pytest.approx(math.sqrt(0.375))
    assert t.loc["rmse", "mcse"] == pytest.approx(math.sqrt(0.5625 / 12) / (2 * math.sqrt(0.375)))
    assert (t["n_reps"] == 4).all()


def test_model_se_is_the_root_mean_squared_se_with_its_hand_mcse():
    # se^2 = .09, .16, .25, .36: mean .215, sample variance .0409 / 3
    frame = pd.DataFrame({"estimate": [1.0, 1.5, 0.5, 2.0], "truth": 1.0, "se": [0.3, 0.4, 0.5, 0.6]})
    t = _table(performance_measures(frame, std_error="se"))
    modse, var_v, empse = math.sqrt(0.215), 0.0409 / 3, math.sqrt(1.25 / 3)
    assert t.loc["model_se", "estimate"] == pytest.approx(modse)
    assert t.loc["model_se", "estimate"] != pytest.approx(0.45)              # not the plain mean of the SEs
    assert t.loc["model_se", "mcse"] == pytest.approx(math.sqrt(var_v / (4 * 4 * 0.215)))
    assert t.loc["relative_error_model_se", "estimate"] == pytest.approx(100 * (modse / empse - 1))
    assert t.loc["relative_error_model_se", "mcse"] == pytest.approx(
        100 * modse / empse * math.sqrt(var_v / (4 * 4 * modse**4) + 1 / 6))
    # z = 1.96: |errors| 0, .5, .5, 1 against z * se = .59, .78, .98, 1.18: all covered
    assert t.loc["coverage", "estimate"] == 1.0 and t.loc["coverage", "mcse"] == 0.0
    # around the mean 1.25: |.25|, |.25|, |.75|, |.75| against .59, .78, .98, 1.18: all covered
    assert t.loc["bias_eliminated_coverage", "estimate"] == 1.0
    # Wald test of 0: |est| >= z se: 1 >= .59, 1.5 >= .78, .5 < .98, 2 >= 1.18: 3 of 4
    assert t.loc["power", "estimate"] == 0.75
    assert t.loc["power", "mcse"] == pytest.approx(math.sqrt(0.75 * 0.25 / 4))


# ------------------------------------------------------------------------------------------------ rsimsum reference
def _rsimsum_reference(est, truth, se, level):
    """A plain-Python transcription of rsimsum's ``.performance`` (R/performance.R, rsimsum 0.13) on complete data."""
    n = len(est)
    mean = statistics.fmean(est)
    crit = stats.norm.ppf(1 - (1 - level) / 2)
    d = [e - t for e, t in zip(est, truth, strict=True)]
    bias = sum(d) / n
    rb_i = [(e - t) / t for e, t in zip(est, truth, strict=True)]
    empse = math.sqrt(sum((e - mean) ** 2 for e in est) / (n - 1))
    mse = sum(x * x for x in d) / n
    se2 = [s * s for s in se]
    modelse = math.sqrt(sum(se2) / n)
    se2_var = statistics.variance(se2)
    cover = sum(1 for e, t, s in zip(est, truth, se, strict=True) if e - crit * s <= t <= e + crit * s) / n
    becover = sum(1 for e, s in zip(est, se, strict=True) if e - crit * s <= mean <= e + crit * s) / n
    power = sum(1 for e, s in zip(est, se, strict=True) if abs(e) >= crit * s) / n
    return {
        "bias": (bias, math.sqrt(sum((e - mean) ** 2 for e in est) / (n * (n - 1)))),
        "relative_bias": (sum(rb_i) / n, statistics.stdev(rb_i) / math.sqrt(n)),
        "empirical_se": (empse, empse / math.sqrt(2 * (n - 1))),
        "mse": (mse, math.sqrt(sum((x * x - mse) ** 2 for x in d) / (n * (n - 1)))),
        "model_se": (modelse, math.sqrt(se2_var / (4 * n * modelse**2))),
        "relative_error_model_se": (100 * (modelse / empse - 1), 100 * (modelse / empse)
                                    * math.sqrt(se2_var / (4 * n * modelse**4) + 1 / (2 * (n - 1)))),
        "coverage": (cover, math.sqrt(cover * (1 - cover) / n)),
        "bias_eliminated_coverage": (becover, math.sqrt(becover * (1 - becover) / n)),
        "power": (power, math.sqrt(power * (1 - power) / n)),
    }


@pytest.mark.parametrize("level", [0.9, 0.95])
def test_every_measure_matches_a_transcription_of_rsimsum(level):
    rng = np.random.default_rng(11)
    n = 300
    truth = rng.choice([0.5, 1.0, 2.0], n)                                  # a truth that varies by row
    se = 0.3 * np.sqrt(rng.chisquare(15, n) / 15)
    est = truth + 0.1 + rng.normal(0, 0.35, n)
    frame = pd.DataFrame({"estimate": est, "truth": truth, "se": se})
    t = _table(performance_measures(frame, std_error="se", confidence_level=level))
    ref = _rsimsum_reference(est.tolist(), truth.tolist(), se.tolist(), level)
    for measure, (value, mcse) in ref.items():
        assert t.loc[measure, "estimate"] == pytest.approx(value, rel=1e-12, abs=1e-15), measure
        assert t.loc[measure, "mcse"] == pytest.approx(mcse, rel=1e-12, abs=1e-15), measure


# ------------------------------------------------------------------------------------------------ brute force
def test_each_mcse_matches_the_spread_of_the_measure_over_repeated_studies():
    # 2000 independent "studies" of 60 replicates: the SD of a measure across studies is what its MCSE estimates.
    # The SD is itself estimated to ~1.6% (1/sqrt(2 * 1999)) and the MCSE formulas are first-order (O(1/n) at
    # n = 60), so they must agree within 10% (about 6 SEs of the SD).
    rng = np.random.default_rng(2024)
    studies, n = 2000, 60
    truth = 1.0
    se = 0.25 * np.sqrt(rng.chisquare(20, (studies, n)) / 20)              # model SEs that vary by replicate
    est = truth + 0.05 + rng.normal(0, 0.25, (studies, n))
    frame = pd.DataFrame({"study": np.repeat(np.arange(studies), n), "estimate": est.ravel(), "truth": truth,
                          "se": se.ravel()})
    res = performance_measures(frame, std_error="se", by="study", null=0.6)
    for measure, block in res.groupby("measure"):
        sd, mean_mcse = block["estimate"].std(ddof=1), block["mcse"].mean()
        assert mean_mcse == pytest.approx(sd, rel=0.10), measure


def test_power_and_rejection_rate_match_their_closed_forms():
    # est ~ N(0.5, 0.2) with se = 0.2: the Wald test of null=0 rejects with probability
    # P(|Z + 2.5| >= z) = Phi(2.5 - z) + Phi(-2.5 - z); at null = 0.5 it is the nominal size 0.05.
    rng = np.random.default_rng(5)
    n = 20000
    frame = pd.DataFrame({"estimate": rng.normal(0.5, 0.2, n), "truth": 0.5, "se": 0.2,
                          "p": rng.uniform(size=n)})
    z = stats.norm.ppf(0.975)
    t0 = _table(performance_measures(frame, std_error="se", p_value="p"))
    expected = stats.norm.cdf(2.5 - z) + stats.norm.cdf(-2.5 - z)
    assert abs(t0.loc["power", "estimate"] - expected) < 4 * t0.loc["power", "mcse"]  # 4 MCSE: a 6e-5 false alarm
    t1 = _table(performance_measures(frame, std_error="se", null=0.5))
    assert abs(t1.loc["power", "estimate"] - 0.05) < 4 * t1.loc["power", "mcse"]
    # uniform p-values reject at the test's level
    assert abs(t0.loc["rejection_rate", "estimate"] - 0.05) < 4 * t0.loc["rejection_rate", "mcse"]
    t2 = _table(performance_measures(frame, std_error="se", p_value="p", alpha_test=0.2))
    assert abs(t2.loc["rejection_rate", "estimate"] - 0.2) < 4 * t2.loc["rejection_rate", "mcse"]


# ------------------------------------------------------------------------------------------------ shape and missing
def test_missing_values_are_dropped_per_measure_and_counted():
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"estimate": rng.normal(1, 0.2, 50), "truth": 1.0, "se": rng.uniform(0.1, 0.3, 50)})
    frame.loc[[0, 1, 2], "estimate"] = np.nan
    frame.loc[[2, 3], "se"] = np.nan                                        # row 2 misses both
    t = _table(performance_measures(frame, std_error="se"))
    assert t.loc["bias", "n_reps"] == 47 and t.loc["empirical_se", "n_reps"] == 47
    assert t.loc["model_se", "n_reps"] == 46 and t.loc["coverage", "n_reps"] == 46
    est_only = _table(performance_measures(frame.dropna(subset=["estimate"])))
    assert t.loc["bias", "estimate"] == est_only.loc["bias", "estimate"]
    both = _table(performance_measures(frame.dropna(), std_error="se"))
    for m in ("model_se", "relative_error_model_se", "coverage", "bias_eliminated_coverage", "power"):
        assert t.loc[m, "estimate"] == both.loc[m, "estimate"]
        assert t.loc[m, "mcse"] == both.loc[m, "mcse"]


def test_columns_grouping_and_omitted_measures():
    rng = np.random.default_rng(4)
    frame = pd.DataFrame({"method": np.repeat(["a", "b"], 30), "estimate": rng.normal(2, 1, 60), "theta": 2.0})
    res = performance_measures(frame, truth="theta", by="method")
    assert list(res.columns) == ["method", "measure", "estimate", "mcse", "n_reps"]
    assert "model_se" not in set(res["measure"]) and not res["estimate"].isna().any()   # omitted, not NaN-filled
    sub = _table(performance_measures(frame[frame.method == "b"], truth="theta"))
    got = res[res.method == "b"].set_index("measure")
    pd.testing.assert_frame_equal(got[["estimate", "mcse", "n_reps"]], sub[["estimate", "mcse", "n_reps"]])
    scalar = performance_measures(frame, truth=2.0, by="method")
    pd.testing.assert_frame_equal(scalar, res)
    only_empse = performance_measures(frame, truth=None)
    assert list(only_empse["measure"]) == ["empirical_se"]
    assert list(performance_measures(frame.assign(theta=0.0), truth="theta")["measure"]) == [
        "bias", "empirical_se", "mse", "rmse"]                              # relative bias undefined at theta = 0
    assert list(MEASURES)[:5] == ["bias", "relative_bias", "empirical_se", "mse", "rmse"]


def test_single_replicate_gives_nan_mcse_without_warnings():
    frame = pd.DataFrame({"estimate": [1.2], "truth": 1.0, "se": 0.1})
    t = _table(performance_measures(frame, std_error="se"))
    assert t.loc["bias", "estimate"] == pytest.approx(0.2) and np.isnan(t.loc["bias", "mcse"])
    assert np.isnan(t.loc["empirical_se", "estimate"])


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"estimate": "est"}, ValueError, r"missing column\(s\) 'est' \(from estimate=\)"),
    ({"std_error": "sd"}, ValueError, r"'sd' \(from std_error=\)"),
    ({"by": ["scenario"]}, ValueError, r"'scenario' \(from by=\)"),
    ({"confidence_level": 1.0}, ValueError, "confidence_level must be a finite number > 0 and < 1"),
    ({"confidence_level": 0.0}, ValueError, "confidence_level"),
    ({"alpha_test": 1.5}, ValueError, "alpha_test"),
    ({"truth": "label"}, TypeError, "column 'label' must hold numbers"),
    ({"truth": [1.0]}, TypeError, "truth must be a column name, a finite number or None"),
    ({"std_error": "neg"}, ValueError, "negative standard errors"),
    ({"p_value": "big"}, ValueError, r"outside \[0, 1\]"),
    ({"estimate": "inf"}, ValueError, "infinite value"),
])
def test_bad_input_names_the_argument(kwargs, error, match):
    frame = pd.DataFrame({"estimate": [1.0, 2.0], "truth": 1.0, "label": ["x", "y"], "neg": [-0.1, 0.2],
                          "big": [0.5, 1.2], "inf": [1.0, np.inf]})
    with pytest.raises(error, match=match):
        performance_measures(frame, **kwargs)
    with pytest.raises(TypeError, match="pandas DataFrame"):
        performance_measures(frame.to_numpy())


# ------------------------------------------------------------------------------------------------ jackknife
def test_jackknife_of_the_mean_is_the_bias_mcse_exactly():
    x = np.random.default_rng(6).gamma(2.0, 1.0, 200)
    est, mcse = jackknife_mcse(x, np.mean)
    assert est == pytest.approx(x.mean())
    assert mcse == pytest.approx(x.std(ddof=1) / math.sqrt(len(x)), rel=1e-10)   # exact identity, rounding only


def test_jackknife_of_log_mean_agrees_with_the_delta_method():
    # delta method: MCSE(log mean) = s / (sqrt(n) * mean).  The jackknife differs by the quadratic term of the
    # Taylor expansion, a relative O(1/n) = O(1e-3) at n = 1000; 1% leaves a tenfold margin.
    x = np.random.default_rng(7).exponential(1.0, 1000)
    est, mcse = jackknife_mcse(x, lambda v: np.log(v.mean()))
    assert est == pytest.approx(np.log(x.mean()))
    assert mcse == pytest.approx(x.std(ddof=1) / (math.sqrt(len(x)) * x.mean()), rel=0.01)


def test_jackknife_over_a_frame_drops_every_row_of_a_replicate():
    rng = np.random.default_rng(8)
    ns = np.array([100, 400, 1600, 6400])
    frame = pd.DataFrame([(r, n, rng.exponential(n**-0.5)) for r in range(25) for n in ns],
                         columns=["rep", "n", "loss"])

    def exponent(f: pd.DataFrame) -> float:
        m = f.groupby("n")["loss"].mean()
        return float(np.polyfit(np.log(m.index.to_numpy(dtype=float)), np.log(m.to_numpy()), 1)[0])

    est, mcse = jackknife_mcse(frame, exponent)
    loo = np.array([exponent(frame[frame.rep != r]) for r in range(25)])   # brute force
    assert est == pytest.approx(exponent(frame))
    assert mcse == pytest.approx(math.sqrt(24 / 25 * ((loo - loo.mean()) ** 2).sum()), rel=1e-12)
    assert 0 < mcse < 0.2


def test_jackknife_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        jackknife_mcse([1.0], np.mean)
    with pytest.raises(TypeError, match="statistic must be a callable"):
        jackknife_mcse([1.0, 2.0], "mean")
    with pytest.raises(ValueError, match="without the replicate column rep='rep'"):
        jackknife_mcse(pd.DataFrame({"x": [1, 2]}), len)
    with pytest.raises(ValueError, match=r"returned -inf without replicate 0"), np.errstate(divide="ignore"):
        jackknife_mcse(np.array([2.0, 0.0]), lambda v: np.log(v.mean()))
    with pytest.raises(ValueError, match="one number"):
        jackknife_mcse(np.arange(3.0), lambda v: v)
    with pytest.raises(TypeError, match="numeric array"):
        jackknife_mcse(np.array(["a", "b"]), len)


# ------------------------------------------------------------------------------------------------ n_reps_for
def test_n_reps_for_scales_with_the_square_of_the_mcse_ratio():
    assert n_reps_for(0.02, 100, 0.01) == 400
    assert n_reps_for(0.2, 100, 0.1) == 400                                 # no float round-up to 401
    assert n_reps_for(0.03, 100, 0.02) == 225
    assert n_reps_for(0.031, 100, 0.02) == math.ceil(100 * (0.031 / 0.02) ** 2)
    assert n_reps_for(0.0, 100, 0.01) == 2


def test_n_reps_for_reaches_the_target_on_fresh_replicates():
    # pilot of 100 N(0, 1) replicates, target bias MCSE 0.02: the bias MCSE on the sized run is sd/sqrt(n) with sd
    # estimated from the pilot (~7% relative error at 100 replicates) -> within 20% of the target.
    rng = np.random.default_rng(9)
    pilot = performance_measures(pd.DataFrame({"estimate": rng.normal(0, 1, 100), "truth": 0.0}))
    sized = n_reps_for(pilot, target_mcse=0.02, measure="bias")
    n = int(sized["n_reps_needed"].iloc[0])
    run = _table(performance_measures(pd.DataFrame({"estimate": rng.normal(0, 1, n), "truth": 0.0})))
    assert run.loc["bias", "mcse"] == pytest.approx(0.02, rel=0.2)
    assert list(sized.columns) == ["measure", "estimate", "mcse", "n_reps", "target_mcse", "n_reps_needed"]


def test_n_reps_for_frame_with_per_measure_targets():
    pilot = pd.DataFrame({"method": ["a", "a", "b"], "measure": ["bias", "coverage", "bias"],
                          "estimate": [0.1, 0.94, 0.2], "mcse": [0.02, 0.01, np.nan], "n_reps": [100, 100, 100]})
    out = n_reps_for(pilot, target_mcse={"bias": 0.01, "coverage": 0.005})
    assert out["n_reps_needed"].tolist()[:2] == [400, 400]
    assert out["n_reps_needed"].isna().tolist() == [False, False, True]
    with pytest.raises(ValueError, match=r"no target for measure\(s\) \['coverage'\]"):
        n_reps_for(pilot, target_mcse={"bias": 0.01})
    with pytest.raises(ValueError, match=r"measure=\['power'\] not in the pilot frame"):
        n_reps_for(pilot, target_mcse=0.01, measure="power")


@pytest.mark.parametrize(("args", "kwargs", "error", "match"), [
    ((0.02, 1, 0.01), {}, ValueError, "pilot_n_reps must be an integer >= 2"),
    ((0.02, 100, 0.0), {}, ValueError, "target_mcse must be a finite number > 0"),
    ((-0.1, 100, 0.01), {}, ValueError, "pilot_mcse must be a finite number >= 0"),
    ((0.02, 100, None), {}, TypeError, "target_mcse must be a number"),
    ((0.02, 100, 0.01), {"measure": "bias"}, TypeError, "measure= selects rows of a pilot frame"),
    (("0.02", 100, 0.01), {}, TypeError, "pilot_mcse must be a number"),
])
def test_n_reps_for_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        n_reps_for(*args, **kwargs)
