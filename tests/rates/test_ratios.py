"""moestat.rates.ratios: sample-complexity ratios, ratio and n* scaling slopes against bounds, mean-response slopes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moestat.rates import sample_complexity
from moestat.rates.ratios import (
    mean_log_slope,
    ratio_scaling_exponent,
    sample_complexity_ratio,
    scaling_against_bound,
)

GRID = np.array([8, 16, 32, 64, 128, 256, 512, 1024], dtype=float)
EPS = (-0.02, 0.0, 0.02, 0.0) * 3   # symmetric replicate noise: the mean curve is exactly the noiseless one


def _curves(n_star: dict, by: list[str]) -> pd.DataFrame:
    """metric = log(n / n*) + noise: the mean curve is linear in log n and crosses 0 exactly at n* (between grid
    points the crossing is interpolated linearly in log n, so it is exact)."""
    rows = []
    for key, ns in n_star.items():
        key = key if isinstance(key, tuple) else (key,)
        for n in GRID:
            for rep, e in enumerate(EPS):
                rows.append({**dict(zip(by, key, strict=True)), "n": n, "rep": rep,
                             "metric": np.log(n / ns) + e})
    return pd.DataFrame(rows)


def _sc(n_star: dict, by: list[str], n_resamples: int = 400, seed: int = 1):
    return sample_complexity(_curves(n_star, by), "metric", 0.0, by=by, n_resamples=n_resamples, seed=seed)


def _order_interval(d: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval by order statistics, written out independently of the library."""
    s = np.sort(d)
    b = len(s)
    return s[int(np.floor((1 - level) / 2 * b))], s[int(np.ceil((1 + level) / 2 * b)) - 1]


def test_ratio_is_the_quotient_of_the_two_n_star_and_its_interval_the_draw_differences():
    sc = _sc({"a": 40.0, "b": 100.0}, ["model"])
    out = sample_complexity_ratio(sc, "a", "b").iloc[0]
    # the mean curves cross exactly at 40 and 100 (see _curves), so the ratio is 0.4 to rounding
    assert out["ratio"] == pytest.approx(0.4, rel=1e-12) and out["bound"] == "estimate"
    assert out["censored"] == "none/none" and out["p_used"] == 1.0
    lo, hi = _order_interval(sc.draws[("a",)] - sc.draws[("b",)], 0.95)
    assert out["ci_low"] == pytest.approx(np.exp(lo), rel=1e-12) and out["ci_high"] == pytest.approx(np.exp(hi))
    assert out["ci_low"] <= 0.4 <= out["ci_high"]
    # a {column: value} key and a tuple key name the same group
    same = sample_complexity_ratio(sc, {"model": "a"}, ("b",))
    pd.testing.assert_frame_equal(same, sample_complexity_ratio(sc, "a", "b"))
    narrow = sample_complexity_ratio(sc, "a", "b", confidence_level=0.5).iloc[0]
    assert out["ci_low"] <= narrow["ci_low"] <= narrow["ci_high"] <= out["ci_high"]


def test_a_denominator_that_never_reaches_the_target_gives_an_upper_bound():
    sc = _sc({"a": 40.0, "b": 5000.0}, ["model"])   # b's curve stays below 0 on the grid (n_max = 1024)
    out = sample_complexity_ratio(sc, "a", "b").iloc[0]
    assert out["censored"] == "none/right" and out["bound"] == "upper"
    assert out["ratio"] == pytest.approx(40.0 / 1024.0, rel=1e-12)
    # every draw of b is censored and enters as log 1024: the interval is that of n*_a / 1024
    lo, hi = _order_interval(sc.draws[("a",)] - np.log(1024.0), 0.95)
    assert out["ci_low"] == pytest.approx(np.exp(lo)) and out["ci_high"] == pytest.approx(np.exp(hi))
    both_bad = sample_complexity_ratio(sc, "b", "a").iloc[0]
    assert both_bad["bound"] == "none" and np.isnan(both_bad["ratio"])


def test_ratio_rejects_unknown_groups_and_wrong_results():
    sc = _sc({"a": 40.0, "b": 100.0}, ["model"])
    with pytest.raises(ValueError, match=r"numerator=.*not a group"):
        sample_complexity_ratio(sc, "c", "b")
    with pytest.raises(ValueError, match="must give every by column"):
        sample_complexity_ratio(sc, {"l": 2}, "b")
    with pytest.raises(TypeError, match="result must be a SampleComplexityResult"):
        sample_complexity_ratio(sc.table, "a", "b")


def test_ratio_slope_recovers_a_known_power_law():
    # n*_cnn / n*_pmoe = 2 * x^1.5 over x = n/l in {2, 4, 8}: the slope is 1.5 (checked against np.polyfit)
    xs = {4: 2.0, 8: 4.0, 16: 8.0}
    n_star = {}
    for n, x in xs.items():
        n_star[(n, "pmoe")] = 20.0
        n_star[(n, "cnn")] = 20.0 * 2 * x ** 1.5   # at most 20 * 2 * 8^1.5 = 905 < 1024: inside the grid
    sc = _sc(n_star, ["patches", "model"])
    pairs = [((n, "cnn"), (n, "pmoe"), x) for n, x in xs.items()]
    out = ratio_scaling_exponent(sc, pairs).iloc[0]
    want = np.polyfit(np.log(list(xs.values())), np.log([n_star[(n, "cnn")] / 20.0 for n in xs]), 1)[0]
    assert want == pytest.approx(1.5, abs=1e-9) and out["exponent"] == pytest.approx(want, abs=1e-9)
    assert out["ci_low"] <= 1.5 <= out["ci_high"] and out["n_points"] == 3 and out["n_censored"] == 0
    # the interval refits the slope on the paired draws: recompute it by polyfit on each draw
    d = np.column_stack([sc.draws[a] - sc.draws[b] for a, b, _ in pairs])
    slopes = np.array([np.polyfit(np.log(list(xs.values())), row, 1)[0] for row in d if np.isfinite(row).all()])
    assert out["boot_used"] == len(slopes)
    np.testing.assert_allclose([out["ci_low"], out["ci_high"]], np.quantile(slopes, [0.025, 0.975]), rtol=1e-9)


def test_ratio_slope_with_censored_pairs_says_why_and_rejects_too_few_x():
    sc = _sc({(4, "cnn"): 50.0, (4, "pmoe"): 20.0, (8, "cnn"): 5000.0, (8, "pmoe"): 20.0,
              (16, "cnn"): 300.0, (16, "pmoe"): 20.0}, ["patches", "model"])
    pairs = [((n, "cnn"), (n, "pmoe"), n / 2) for n in (4, 8, 16)]
    out = ratio_scaling_exponent(sc, pairs).iloc[0]
    assert np.isnan(out["exponent"]) and out["n_censored"] == 1 and "only 2 pairs" in out["note"]
    with pytest.raises(ValueError, match="2 distinct x values"):
        ratio_scaling_exponent(sc, pairs[:2])
    with pytest.raises(ValueError, match="x must be a positive"):
        ratio_scaling_exponent(sc, [(a, b, -1.0) for a, b, _ in pairs])


def test_scaling_against_bound_fits_each_group_and_judges_the_bound():
    # pmoe: n* = 10 l^2 (slope 2); cnn: only two uncensored points -> its own note, pmoe still fitted
    n_star = {("pmoe", l): 10.0 * l ** 2 for l in (1, 2, 3, 4)}
    n_star.update({("cnn", 1): 30.0, ("cnn", 2): 60.0, ("cnn", 3): 5000.0, ("cnn", 4): 9000.0})
    sc = _sc(n_star, ["model", "l"])
    with pytest.warns(Warning):   # scaling_exponent on the whole result stops at the CNN; per group it does not
        with pytest.raises(ValueError, match="only 2 uncensored"):
            sc.scaling("l")
    out = scaling_against_bound(sc, "l", 8.0).set_index("model")
    want = np.polyfit(np.log([1, 2, 3, 4]), np.log([10.0 * l ** 2 for l in (1, 2, 3, 4)]), 1)[0]
    assert out.loc["pmoe", "exponent"] == pytest.approx(want, abs=1e-9) and want == pytest.approx(2.0)
    assert out.loc["pmoe", "consistent"] and out.loc["pmoe", "theory_bound"] == 8.0
    assert np.isnan(out.loc["cnn", "exponent"]) and "only 2 uncensored" in out.loc["cnn", "note"]
    assert out.loc["cnn", "n_censored"] == 2
    # replicate noise of +-0.02 in log n* makes the slope's interval tight around 2: a bound of 1 is contradicted
    tight = scaling_against_bound(sc, "l", 1.0, where={"model": "pmoe"})
    assert len(tight) == 1 and tight["ci_low"].iloc[0] > 1.0 and not tight["consistent"].iloc[0]


def test_scaling_against_bound_validates_its_arguments():
    sc = _sc({("pmoe", l): 10.0 * l for l in (1, 2, 4)}, ["model", "l"])
    with pytest.raises(ValueError, match="design='n' must be one of the by columns"):
        scaling_against_bound(sc, "n", 8.0)
    with pytest.raises(ValueError, match="bound must be a finite number"):
        scaling_against_bound(sc, "l", float("nan"))
    with pytest.raises(ValueError, match="not by columns"):
        scaling_against_bound(sc, "l", 8.0, where={"variant": "x"})
    with pytest.raises(ValueError, match="matches no group"):
        scaling_against_bound(sc, "l", 8.0, where={"model": "cnn"})


def _power_frame(exponent: float, values=(2, 4, 8, 16, 32)) -> pd.DataFrame:
    rows = []
    for run, e in enumerate((-0.01, 0.0, 0.01) * 4):
        for v in values:
            rows.append({"knob": v, "run": run, "error": 0.05 * v ** exponent + e})
    return pd.DataFrame(rows)


def test_mean_log_slope_recovers_a_power_law_and_resamples_runs():
    frame = _power_frame(0.5)
    out = mean_log_slope(frame, "knob", "error", rep="run", n_resamples=500, seed=3).iloc[0]
    # runs scatter symmetrically around the law, so the mean error is exactly on it
    assert out["slope"] == pytest.approx(0.5, abs=1e-9) and out["ci_low"] <= 0.5 <= out["ci_high"]
    assert (out["range_min"], out["range_max"], out["n_values"]) == (2.0, 32.0, 5)
    # independent bootstrap: the same resampling indices, slopes by np.polyfit on each draw's means
    table = frame.pivot_table(index="run", columns="knob", values="error").to_numpy()
    idx = np.random.default_rng(3).integers(0, len(table), size=(500, len(table)))
    slopes = [np.polyfit(np.log([2, 4, 8, 16, 32]), np.log(table[i].mean(0)), 1)[0] for i in idx]
    np.testing.assert_allclose([out["ci_low"], out["ci_high"]], np.quantile(slopes, [0.025, 0.975]), rtol=1e-9)
    # a shared Generator continues one stream over calls
    rng = np.random.default_rng(3)
    first = mean_log_slope(frame, "knob", "error", rep="run", n_resamples=500, seed=rng)
    pd.testing.assert_frame_equal(first, mean_log_slope(frame, "knob", "error", rep="run", n_resamples=500, seed=3))


def test_mean_log_slope_is_undefined_with_few_values_or_zero_error_and_checks_columns():
    few = mean_log_slope(_power_frame(0.5, values=(2, 4)), "knob", "error", rep="run").iloc[0]
    assert np.isnan(few["slope"]) and few["n_values"] == 2
    zero = _power_frame(0.5).assign(error=lambda f: np.where(f["knob"] == 32, 0.0, f["error"]))
    assert np.isnan(mean_log_slope(zero, "knob", "error", rep="run").iloc[0]["slope"])
    with pytest.raises(ValueError, match="rep='rep': no such column"):
        mean_log_slope(_power_frame(0.5), "knob", "error")
    with pytest.raises(ValueError, match="must be positive"):
        mean_log_slope(_power_frame(0.5).assign(knob=lambda f: f["knob"] - 2), "knob", "error", rep="run")
