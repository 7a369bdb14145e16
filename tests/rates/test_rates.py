"""Unit tests of moestat.rates: formulas against independent computations, API contract, errors, plots."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat import rates
from moestat.rates import RateWarning, _core, exponents

NS = np.geomspace(1e3, 1e5, 7).round()


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    """Tidy study-like frame: gate x expert x n x rep, with a D1 column (known exponents)."""
    rng = np.random.default_rng(0)
    rows = []
    for gate, alpha in (("sigmoid", 0.5), ("softmax", 0.25)):
        for expert in ("relu", "identity"):
            for n in NS:
                for r in range(8):
                    rows.append({"gate": gate, "expert": expert, "n": n, "rep": r,
                                 "D1": 3.0 * n ** -alpha * np.exp(0.3 * rng.standard_normal())})
    return pd.DataFrame(rows)


def one(frame: pd.DataFrame, gate: str = "sigmoid", expert: str = "relu") -> pd.DataFrame:
    return frame[(frame.gate == gate) & (frame.expert == expert)]


# ------------------------------------------------------------------------------------------- formulas


@pytest.mark.parametrize("model", list(rates.RATE_MODELS))
def test_replicate_level_exponent_is_polyfit_slope(frame, model):
    sub = one(frame)
    res = ms.fit_rate(sub, "D1", model=model, n_resamples=200)
    u = rates.regressor(model, sub["n"].to_numpy())
    slope, intercept = np.polyfit(u, np.log(sub["D1"]), 1)
    row = res.table.iloc[0]
    assert row["exponent"] == pytest.approx(-slope, rel=1e-10)
    assert row["intercept"] == pytest.approx(intercept, rel=1e-10)


def test_regressor_transforms():
    n = np.array([10.0, 1e3, 1e5])
    np.testing.assert_allclose(rates.regressor("power", n), np.log(n))
    np.testing.assert_allclose(rates.regressor("power_log", n), np.log(n / np.log(n)))
    np.testing.assert_allclose(rates.regressor("inverse_log", n), np.log(np.log(n)))


@pytest.mark.parametrize(("agg", "stat"), [("mean", lambda v: np.log(v.mean())),
                                           ("median", lambda v: np.log(v.median())),
                                           ("logmean", lambda v: np.log(v).mean())])
def test_aggregated_fit_is_the_papers_line(frame, agg, stat):
    sub = one(frame)
    res = ms.fit_rate(sub, "D1", agg=agg, n_resamples=200)
    pts = sub.groupby("n")["D1"].apply(stat)
    slope, intercept = np.polyfit(np.log(pts.index.to_numpy(float)), pts.to_numpy(), 1)
    assert res.table["exponent"].iloc[0] == pytest.approx(-slope, rel=1e-10)
    assert res.table["intercept"].iloc[0] == pytest.approx(intercept, rel=1e-10)


def test_r2_and_aic_are_statsmodels_ols(frame):
    sub = one(frame)
    ols = sm.OLS(np.log(sub["D1"].to_numpy()), sm.add_constant(np.log(sub["n"].to_numpy()))).fit()
    row = ms.fit_rate(sub, "D1", n_resamples=200).table.iloc[0]
    assert row["r2"] == pytest.approx(ols.rsquared)
    assert row["aic"] == pytest.approx(ols.aic)


def test_wls_slope_matches_repeated_rows_polyfit():
    rng = np.random.default_rng(1)
    u, z = rng.normal(size=6), rng.normal(size=(3, 6))
    w = np.array([1.0, 2, 3, 1, 5, 2])
    _, slopes = _core._wls_slope(u, z, w)
    for b in range(3):
        ref = np.polyfit(np.repeat(u, w.astype(int)), np.repeat(z[b], w.astype(int)), 1)[0]
        assert slopes[b] == pytest.approx(ref, rel=1e-12)


def test_bootstrap_se_matches_the_analytic_rescaled_variance(frame):
    """The replicate-level slope is linear in the per-n means: its rescaled bootstrap variance is exactly
    sum_n c_n^2 s_n^2 / R_n in expectation.  Tolerance: with B = 20000 draws the bootstrap SD has relative MC
    error about 1/sqrt(2B) = 0.5%; we allow 3%."""
    sub = one(frame)
    res = ms.fit_rate(sub, "D1", method="cluster_bootstrap", n_resamples=20000, seed=3)
    g = sub.groupby("n")["D1"]
    r = g.size().to_numpy(float)
    s2 = g.apply(lambda v: np.log(v).var(ddof=1)).to_numpy()
    u = np.log(g.size().index.to_numpy(float))
    w = r / r.sum()
    du = u - (w * u).sum()
    c = w * du / (w * du * du).sum()
    analytic = np.sqrt(np.sum(c ** 2 * s2 / r))
    assert res.table["se"].iloc[0] == pytest.approx(analytic, rel=0.03)
    # Satterthwaite df from the same pieces (v_n replaced by its exact value s^2/R)
    terms = c ** 2 * s2 / r
    df_exact = terms.sum() ** 2 / np.sum(terms ** 2 / (r - 1))
    assert res.details["df"].iloc[0] == pytest.approx(df_exact, rel=0.1)


def test_satterthwaite_equal_pieces():
    assert exponents._satterthwaite(np.ones(4), np.full(4, 5.0)) == pytest.approx(20.0)


def test_robust_method_is_statsmodels_cluster_and_hc3(frame):
    sub = one(frame)
    endog, exog = np.log(sub["D1"].to_numpy()), sm.add_constant(np.log(sub["n"].to_numpy()))
    hc3 = sm.OLS(endog, exog).fit(cov_type="HC3", use_t=True)
    res = ms.fit_rate(sub, "D1", method="robust")  # 8 reps < 10 ids: HC3
    assert res.details["cov_type"].iloc[0] == "HC3"
    assert res.table["se"].iloc[0] == pytest.approx(hc3.bse[1])
    lo, hi = hc3.conf_int()[1]
    assert (res.table["ci_low"].iloc[0], res.table["ci_high"].iloc[0]) == pytest.approx((-hi, -lo))
    cl = sm.OLS(endog, exog).fit(cov_type="cluster", cov_kwds={"groups": sub["rep"].to_numpy()}, use_t=True)
    res = ms.fit_rate(sub, "D1", method="robust", cluster="rep")
    assert res.table["se"].iloc[0] == pytest.approx(cl.bse[1])
    assert res.details["df"].iloc[0] == 7  # G - 1


def test_resample_rep_uses_whole_replicates(frame):
    res = ms.fit_rate(one(frame), "D1", resample="rep", n_resamples=500)
    assert res.details["df"].iloc[0] == 7
    assert np.isfinite(res.table["se"].iloc[0])
    ragged = one(frame)[lambda f: ~((f["rep"] == 7) & (f["n"] == NS[0]))]
    with pytest.raises(ValueError, match="same replicate ids"):
        ms.fit_rate(ragged, "D1", resample="rep", n_resamples=200)


# ------------------------------------------------------------------------------------------- API


def test_table_columns_and_by_groups(frame):
    res = ms.fit_rate(frame, y="D1", by=["gate", "expert"], n_resamples=300)
    assert list(res.table.columns) == ["gate", "expert", *_core.TABLE_COLUMNS]
    assert len(res.table) == 4
    assert set(res.table["n_values"]) == {len(NS)} and set(res.table["replicates"]) == {8}
    sig = res.table.set_index(["gate", "expert"])
    # exponents recovered (SE ~ 0.02 for this design; 5 SE slack)
    assert sig.loc[("sigmoid", "relu"), "exponent"] == pytest.approx(0.5, abs=0.1)
    assert sig.loc[("softmax", "relu"), "exponent"] == pytest.approx(0.25, abs=0.1)
    assert (res.table["ci_low"] < res.table["exponent"]).all() and (res.table["exponent"] < res.table["ci_high"]).all()
    text = str(res.summary())
    # the default method is now the random-effects meta-regression (method="auto" without units)
    assert "random_effects" in text and "Knapp-Hartung" in text and "sigmoid" in text
    assert repr(res).startswith("RateResult(y='D1'")
    wide = res.to_frame(config=True)
    assert wide["method"].eq("random_effects").all() and wide["n_resamples"].eq(300).all()
    assert res.config["method_requested"] == "auto"
    assert "df" in res.to_frame(details=True).columns
    assert res.config["n_resamples"] == 300 and res.config["by"] == ["gate", "expert"]


def test_model_list_and_all(frame):
    res = ms.fit_rate(one(frame), "D1", model="all", n_resamples=200)
    assert list(res.table["model"]) == ["power", "power_log", "inverse_log"]
    assert (res.details["delta_aic"] >= 0).all() and (res.details["delta_aic"] == 0).sum() == 1


def test_same_seed_same_result_and_frame_without_rep(frame):
    a = ms.fit_rate(one(frame), "D1", n_resamples=300, seed=5).table
    b = ms.fit_rate(one(frame), "D1", n_resamples=300, seed=5).table
    pd.testing.assert_frame_equal(a, b)
    c = ms.fit_rate(one(frame).drop(columns="rep"), "D1", n_resamples=300, seed=5).table
    assert c["exponent"].iloc[0] == pytest.approx(a["exponent"].iloc[0])


@settings(max_examples=20, deadline=None)
@given(scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**16))
def test_invariances(scale, seed):
    """Multiplying y by a constant moves only the intercept; shuffling rows and relabelling replicates
    change nothing (the bootstrap sorts by n and rep before drawing)."""
    base = rates.simulate_rate_frame(0.4, NS, 4, seed=seed)
    ref = ms.fit_rate(base, "y", n_resamples=200, seed=1).table.iloc[0]
    scaled = base.assign(y=base["y"] * scale)
    row = ms.fit_rate(scaled, "y", n_resamples=200, seed=1).table.iloc[0]
    assert row["exponent"] == pytest.approx(ref["exponent"], rel=1e-9, abs=1e-12)
    assert row["se"] == pytest.approx(ref["se"], rel=1e-9)
    assert row["intercept"] == pytest.approx(ref["intercept"] + np.log(scale), rel=1e-9, abs=1e-9)
    shuffled = base.sample(frac=1.0, random_state=seed)
    row = ms.fit_rate(shuffled, "y", n_resamples=200, seed=1).table.iloc[0]
    assert row["exponent"] == pytest.approx(ref["exponent"], rel=1e-12)
    assert row["se"] == pytest.approx(ref["se"], rel=1e-12)


def test_test_exponent_agrees_with_the_interval(frame):
    res = ms.fit_rate(frame, "D1", by=["gate", "expert"], n_resamples=500)
    for value in (0.25, 0.5, 0.3):
        t = ms.test_exponent(res, value)
        inside = (t["ci_low"] <= value) & (value <= t["ci_high"])
        assert (t["reject"] == ~inside).all()
    t = res.test_exponent(0.5)
    assert list(t.columns[:3]) == ["gate", "expert", "model"]
    one_sided = ms.test_exponent(res, 0.5, alternative="less")
    two = ms.test_exponent(res, 0.5)
    below = one_sided["statistic"] < 0
    np.testing.assert_allclose(one_sided.loc[below, "p_value"], two.loc[below, "p_value"] / 2)


def test_compare_rates_interaction_equals_separate_fits(frame):
    out = ms.compare_rates(frame, y="D1", between="gate", by=["expert"], method="both", n_resamples=500)
    assert set(out["method"]) == {"interaction", "bootstrap"}
    sep = ms.fit_rate(frame, "D1", by=["gate", "expert"], n_resamples=200).table.set_index(["gate", "expert"])
    for _, row in out.iterrows():
        ea = sep.loc[(row["level_a"], row["expert"]), "exponent"]
        eb = sep.loc[(row["level_b"], row["expert"]), "exponent"]
        assert row["difference"] == pytest.approx(ea - eb, rel=1e-9)
        assert row["exponent_a"] == pytest.approx(ea, rel=1e-9)
        assert row["ci_low"] < row["difference"] < row["ci_high"]
        assert row["p_value"] < 1e-4  # true difference 0.25, SE about 0.03
        assert row["verdict"] == "sigmoid faster" and row["verdict_a"] == "power law"
    sub = frame[frame.expert == "relu"]
    one_pair = ms.compare_rates(sub, "D1", between="gate", levels=("softmax", "sigmoid"), method="interaction")
    assert one_pair["difference"].iloc[0] < 0 and len(one_pair) == 1


def test_compare_models_weights_sum_to_one(frame):
    c = ms.compare_models(frame, "D1", by=["gate", "expert"])
    np.testing.assert_allclose(c.groupby(["gate", "expert"])["akaike_weight"].sum(), 1.0)
    assert c.groupby(["gate", "expert"])["best"].sum().eq(1).all()


def test_window_sensitivity_full_window_matches_fit(frame):
    sub = one(frame)
    ws = ms.window_sensitivity(sub, "D1", n_resamples=300)
    full = ws.table[ws.table["side"] == "full"]
    assert len(full) == 1
    assert full["exponent"].iloc[0] == pytest.approx(ms.fit_rate(sub, "D1", n_resamples=300).table["exponent"].iloc[0])
    # NS spans 2 decades in 6 steps of 1/3 decade; the default min_span=1 keeps windows spanning >= 1 decade:
    # dropping k = 1..3 smallest (k = 4 leaves 3 values over 0.67 decades), and k largest likewise
    m = len(NS)
    assert (ws.table["side"] == "smallest").sum() == 3 == (ws.table["side"] == "largest").sum()
    assert ws.table["span"].min() == pytest.approx(1.0, abs=1e-3) and ws.table["n_values"].min() == 4
    # min_span=0 restores every window down to 3 n values (k = 1..m-3 per side)
    ws0 = ms.window_sensitivity(sub, "D1", n_resamples=300, min_span=0.0)
    assert (ws0.table["side"] == "smallest").sum() == m - 3 == (ws0.table["side"] == "largest").sum()
    assert ws0.table["n_values"].min() == 3
    summary = ws.glance()
    assert summary["consistent"].iloc[0]  # a true power law: every window's CI shares a point
    assert summary["full"].iloc[0] == pytest.approx(full["exponent"].iloc[0])
    ws2 = ms.window_sensitivity(frame, "D1", by=["gate", "expert"], drop="smallest", n_resamples=200)
    assert set(ws2.table["side"]) == {"full", "smallest"}
    assert ws2.table.groupby(["gate", "expert"]).size().eq(m - 3).all()


def test_window_sensitivity_exposes_curvature():
    """B.8 in miniature: a loss with pre-asymptotic curvature, y = n^-1 + 1e-3 n^-0.1, gives a steep exponent on
    the full window and a shallow one once the small n are dropped.  With intervals that count only replicate
    noise (the replicate bootstrap) the profile drifts far beyond its CIs; the random-effects default treats the
    misfit as between-cell variance, widens every window, and flags the curve through curvature_p, the
    windows on both sides and the verdict."""
    rng = np.random.default_rng(4)
    ns = np.geomspace(1e1, 1e5, 9).round()
    n = np.repeat(ns, 10)
    y = (n ** -1.0 + 1e-3 * n ** -0.1) * np.exp(0.1 * rng.standard_normal(n.size))
    df = pd.DataFrame({"n": n, "rep": np.tile(np.arange(10), len(ns)), "y": y})
    boot = ms.window_sensitivity(df, "y", drop="smallest", method="cluster_bootstrap", n_resamples=300)
    ws = boot.table
    first, last = ws.iloc[0], ws.iloc[-1]
    assert first["exponent"] > last["exponent"] + 0.2
    assert first["ci_low"] > last["ci_high"]
    summary = boot.glance().iloc[0]
    assert not summary["consistent"] and summary["drift_drop_smallest"] < -0.2
    assert summary["drift"] == pytest.approx(summary["drift_drop_smallest"])  # the last window moves farthest
    res = ms.fit_rate(df, "y", warn=False)
    row = res.table.iloc[0]
    assert row["verdict"] == "curved: exponent is local" and row["curvature_p"] < 1e-3
    assert not row["window_consistent"] and row["best_model"] != "power"
    assert res.config["method"] == "random_effects" and row["tau2"] > 0 and row["shock_p"] < 1e-6
    cm = ms.compare_models(df, "y")
    assert cm["curvature_p"].iloc[0] < 1e-6


# ------------------------------------------------------------------------------------------- warnings / errors


def test_warnings_for_narrow_range_and_few_values():
    df = rates.simulate_rate_frame(0.5, [1000, 2000, 4000, 8000], 4)
    with pytest.warns(RateWarning, match="decade"), pytest.warns(RateWarning, match="distinct n values"):
        res = ms.fit_rate(df, "y", n_resamples=200)
    assert "decade" in res.details["warnings"].iloc[0]


def test_percentile_interval_flags_biased_log_mean():
    """Very skewed replicate losses (sigma 2 on the log scale): log(mean) is noisy and biased; the percentile
    interval of the papers' fit can then exclude its own point estimate (B.8); we only check that the
    fit runs and that any such case is reported in the warnings column."""
    df = rates.simulate_rate_frame(0.5, NS, 6, sigma=2.0, seed=8)
    res = ms.fit_rate(df, "y", agg="mean", interval="percentile", n_resamples=400, warn=False)
    row = res.table.iloc[0]
    outside = not row["ci_low"] <= row["exponent"] <= row["ci_high"]
    assert outside == ("percentile interval" in res.details["warnings"].iloc[0])


def test_error_messages(frame):
    sub = one(frame)
    with pytest.raises(ValueError, match=r"missing column.*'loss'.*y="):
        ms.fit_rate(sub, "loss")
    with pytest.raises(ValueError, match=r"'arch' \(from by=\)"):
        ms.fit_rate(sub, "D1", by=["gate", "arch"])
    with pytest.raises(ValueError, match="non-positive"):
        ms.fit_rate(sub.assign(D1=sub["D1"] - sub["D1"].min()), "D1")
    with pytest.raises(ValueError, match="NaN"):
        ms.fit_rate(sub.assign(D1=np.where(sub["rep"] == 0, np.nan, sub["D1"])), "D1")
    with_nan = sub.assign(D1=np.where((sub["rep"] == 0) & (sub["n"] == NS[0]), np.nan, sub["D1"]))
    with pytest.warns(RateWarning, match="dropped 1 row"):
        res = ms.fit_rate(with_nan, "D1", na="drop", n_resamples=200)
    assert res.config["dropped_na"] == 1 and res.details["rows"].iloc[0] == len(sub) - 1
    with pytest.raises(ValueError, match="at least 3"):
        ms.fit_rate(sub[sub["n"].isin(NS[:2])], "D1")
    single = sub[(sub["rep"] == 0) | (sub["n"] != NS[0])]
    with pytest.raises(ValueError, match="single replicate"):
        ms.fit_rate(single, "D1", method="cluster_bootstrap")
    res = ms.fit_rate(single, "D1", method="robust")
    assert np.isfinite(res.table["se"].iloc[0])
    # the default (random effects) cannot estimate the within variance there: it falls back, saying why
    with pytest.warns(RateWarning, match="single replicate.*Fell back to ordinary least squares"):
        res = ms.fit_rate(single, "D1")
    assert res.details["cov_type"].iloc[0] == "cell_ols" and res.details["df"].iloc[0] == len(NS) - 2
    with pytest.raises(ValueError, match="several rows"):
        ms.fit_rate(frame, "D1", by="gate")
    with pytest.raises(ValueError, match="model='cubic'"):
        ms.fit_rate(sub, "D1", model="cubic")
    with pytest.raises(ValueError, match="confidence_level must be"):
        ms.fit_rate(sub, "D1", confidence_level=95)
    with pytest.raises(ValueError, match="n_resamples"):
        ms.fit_rate(sub, "D1", n_resamples=10)
    with pytest.raises(ValueError, match="agg"):
        ms.fit_rate(sub, "D1", agg="max")
    with pytest.raises(TypeError, match="DataFrame"):
        ms.fit_rate(sub.to_numpy(), "D1")
    with pytest.raises(ValueError, match=r"must be > 1"):
        ms.fit_rate(sub.assign(n=sub["n"] / 1000), "D1", model="inverse_log")
    with pytest.raises(ValueError, match="single level"):
        ms.compare_rates(sub, "D1", between="gate")
    with pytest.raises(ValueError, match="value must be"):
        ms.test_exponent(ms.fit_rate(sub, "D1", n_resamples=200), float("nan"))


# ------------------------------------------------------------------------------------------- sample complexity


def _acc_frame(ls=(2, 4, 8, 16), reps=8, noise=0.02, seed=0, slope=2.0):
    """Accuracy curves acc = 1 - 0.5 exp(-n / (c l^slope)): the target 0.9 is reached at
    n* = c l^slope log(5), so log n* has slope `slope` in log l."""
    rng = np.random.default_rng(seed)
    ns = np.geomspace(25, 25 * 2 ** 10, 11)
    rows = []
    for l in ls:
        for n in ns:
            acc = 1 - 0.5 * np.exp(-n / (8.0 * l ** slope))
            for r in range(reps):
                rows.append({"l": l, "n": n, "rep": r, "acc": acc + noise * rng.standard_normal()})
    return pd.DataFrame(rows)


def test_sample_complexity_interpolates_exactly_without_noise():
    df = pd.DataFrame({"n": np.repeat([100.0, 200, 400, 800], 2), "rep": [0, 1] * 4,
                       "acc": np.repeat([0.5, 0.6, 0.8, 0.9], 2)})
    sc = ms.sample_complexity(df, "acc", 0.7, n_resamples=200)
    # halfway between 0.6 (n=200) and 0.8 (n=400) on the log-n scale
    assert sc.table["n_star"].iloc[0] == pytest.approx(np.sqrt(200 * 400))
    assert sc.table["censored"].iloc[0] == "none"
    assert sc.table["ci_low"].iloc[0] == pytest.approx(np.sqrt(200 * 400))  # no replicate spread
    right = ms.sample_complexity(df, "acc", 0.95, n_resamples=200).table.iloc[0]
    assert right["censored"] == "right" and np.isinf(right["n_star"]) and np.isinf(right["ci_high"])
    left = ms.sample_complexity(df, "acc", 0.4, n_resamples=200).table.iloc[0]
    assert left["censored"] == "left" and left["n_star"] == 100
    below = ms.sample_complexity(df.assign(err=1 - df["acc"]), "err", 0.3, direction="below", n_resamples=200)
    assert below.table["n_star"].iloc[0] == pytest.approx(np.sqrt(200 * 400))


def test_sample_complexity_fraction_rule():
    df = pd.DataFrame({"n": np.repeat([10.0, 20, 40], 4), "rep": [0, 1, 2, 3] * 3,
                       "acc": [0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1]})
    sc = ms.sample_complexity(df, "acc", 1.0, rule="fraction", q=0.5, n_resamples=200).table.iloc[0]
    # success fraction 0.25 at n=10, 0.75 at n=20: q=0.5 reached halfway on log n
    assert sc["n_star"] == pytest.approx(np.sqrt(10 * 20))


def test_scaling_exponent_recovers_slope():
    sc = ms.sample_complexity(_acc_frame(slope=2.0), "acc", 0.9, by="l", n_resamples=500)
    assert (sc.table["censored"] == "none").all()
    fit = sc.scaling("l").iloc[0]
    # noise-free n* has slope exactly 2; interpolation on a factor-2 grid biases it by < 0.1
    assert fit["exponent"] == pytest.approx(2.0, abs=0.1)
    assert fit["ci_low"] < fit["exponent"] < fit["ci_high"]
    theory = ms.theory_rates()
    bound = theory.query("source == 'chowdhury2023' and response == 'N_star' and regressor == 'l' "
                         "and expert == 'pmoe_separate'")["exponent"].iloc[0]
    assert fit["ci_low"] <= bound  # consistent with the (loose) upper bound 8


def test_scaling_exponent_with_censoring_tobit():
    df = _acc_frame(ls=(4, 16, 64, 256, 2048), slope=1.0)  # n* = 8 log(5) l exceeds the grid for l = 2048
    sc = ms.sample_complexity(df, "acc", 0.9, by="l", n_resamples=300)
    assert sc.table["censored"].iloc[-1] == "right"
    with pytest.warns(RateWarning):
        dropped = sc.scaling("l").iloc[0]
    tobit = sc.scaling("l", censored="tobit").iloc[0]
    assert dropped["n_censored"] == tobit["n_censored"] == 1
    assert tobit["exponent"] == pytest.approx(1.0, abs=0.15)
    assert np.isfinite(tobit["se"])


# ------------------------------------------------------------------------------------------- theory and plots


def test_theory_rates_table():
    t = ms.theory_rates()
    from moestat import papers

    assert {"nguyen2024", "makkuva2020", "chowdhury2023", "nguyen2023", "nguyen2025_cosine"} <= set(t["source"])
    assert set(t["source"]) == {key for key, m in papers.PAPERS.items() if getattr(m, "THEORY", None)}
    # apparent power slopes over [1e3, 1e5] of the three shapes
    by_rate = t[t["source"] == "nguyen2024"].groupby("rate")["power_exponent_in_range"].first()
    assert by_rate["(log n / n)^{1/2}"] == pytest.approx(0.445, abs=5e-4)
    assert by_rate["(log n / n)^{1/4}"] == pytest.approx(0.2225, abs=5e-4)
    assert by_rate["1 / log n"] == pytest.approx(0.110, abs=5e-4)
    d1 = t[(t["quantity"] == "Voronoi loss D1")].iloc[0]
    assert d1["exponent"] == 0.5 and d1["rate_model"] == "power_log" and d1["gate"] == "sigmoid"
    soft = t[(t["gate"] == "softmax") & (t["expert"] == "relu_gelu")].iloc[0]
    assert soft["exponent"] == 0.25
    assert t["rate_model"].dropna().isin(list(rates.RATE_MODELS)).all()


def test_predicted_rate_looks_up_gate_expert_response_and_regime():
    # Table 1 of nguyen2024 on the representation functional: sigmoid regime 2 vs the exact split family at 1/2,
    # regime 1 (a zero-slope atom duplicated) at 1/4 for gelu, softmax at 1/4 (relu, gelu) or 1/log n (linear)
    assert ms.predicted_rate("sigmoid", "relu", "over_param", regime=2) == "(log n / n)^{1/2}"
    assert ms.predicted_rate("sigmoid", "gelu", "over_param", regime=1) == "(log n / n)^{1/4}"
    assert ms.predicted_rate("sigmoid", "gelu", "over_param").startswith("no theorem: the split runs into the dead")
    assert ms.predicted_rate("sigmoid", "relu", "over_param", regime=1).startswith("no theorem")
    assert ms.predicted_rate("softmax", "relu", "over_param", regime=1) == "(log n / n)^{1/4}"
    assert ms.predicted_rate("softmax", "linear", "over_param") == "1 / log n"
    for gate in ("sigmoid", "softmax"):
        for regime in (1, 2):
            assert ms.predicted_rate(gate, "gelu", "l2", regime=regime) == "(log n / n)^{1/2}"
    assert ms.predicted_rate("sigmoid", "gelu", "no_such_response") == ""
    # every answer is a row of theory_rates with the same gate, response and regime
    t = ms.theory_rates()
    hit = t[(t["response"] == "over_param") & (t["regime"] == "1") & (t["expert"] == "gelu")]
    assert list(hit["rate"]) == [ms.predicted_rate("sigmoid", "gelu", "over_param", regime=1)]


def test_plots_render(frame, tmp_path):
    import matplotlib.pyplot as plt

    res = ms.fit_rate(frame, "D1", by=["gate", "expert"], model=["power", "inverse_log"], n_resamples=200)
    ax = res.plot()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    row = res.table.iloc[0]
    assert any(f"n^-{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]" in s for s in labels)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    ax.figure.savefig(tmp_path / "rate.png")
    for agg in ("mean", "median"):
        ms.fit_rate(one(frame), "D1", agg=agg, n_resamples=200).plot(spread="range")
    ws = ms.window_sensitivity(one(frame), "D1", n_resamples=200)
    ws.plot().figure.savefig(tmp_path / "window.png")
    sc = ms.sample_complexity(_acc_frame(), "acc", 0.9, by="l", n_resamples=200)
    sc.plot(design="l").figure.savefig(tmp_path / "nstar.png")
    assert (tmp_path / "nstar.png").stat().st_size > 0
    plt.close("all")


@settings(max_examples=15, deadline=None)
@given(c=st.floats(0.01, 100.0), target=st.floats(0.55, 0.95), seed=st.integers(0, 2**16))
def test_sample_complexity_equivariance(c, target, seed):
    """Rescaling the n grid by c rescales n* by c (interpolation is linear in log n); n* lies between the
    grid points that bracket the crossing of the mean curve."""
    rng = np.random.default_rng(seed)
    ns = np.array([10.0, 30, 100, 300, 1000])
    rows = [{"n": n, "rep": r, "acc": 1 - 0.5 * np.exp(-n / 100) + 0.01 * rng.standard_normal()}
            for n in ns for r in range(4)]
    df = pd.DataFrame(rows)
    a = ms.sample_complexity(df, "acc", target, n_resamples=100).table.iloc[0]
    b = ms.sample_complexity(df.assign(n=df["n"] * c), "acc", target, n_resamples=100).table.iloc[0]
    assert a["censored"] == b["censored"]
    if a["censored"] == "none":
        assert b["n_star"] == pytest.approx(c * a["n_star"], rel=1e-9)
        mean = df.groupby("n")["acc"].mean()
        first = mean.index[np.argmax(mean.to_numpy() >= target)]
        prev = mean.index[max(np.argmax(mean.to_numpy() >= target) - 1, 0)]
        assert prev <= a["n_star"] <= first


# ------------------------------------------------------------------------------------------- Huber


def test_huber_irls_matches_statsmodels_rlm():
    rng = np.random.default_rng(9)
    u = np.repeat(np.log(NS), 6)
    ys = -0.5 * u + rng.standard_t(2, size=(4, u.size))
    b0, b1 = exponents._huber_fit(u, ys)
    for i in range(4):
        ref = sm.RLM(ys[i], sm.add_constant(u), M=sm.robust.norms.HuberT()).fit(conv="coefs", tol=1e-12,
                                                                                maxiter=1000)
        assert (b0[i], b1[i]) == pytest.approx(tuple(ref.params), rel=1e-6, abs=1e-8)


def test_huber_resists_outlying_replicates():
    """5% of replicates stuck 100x above the curve (a fit in a bad local optimum): OLS on logs is pulled
    far from the true 0.5, the Huber fit much less."""
    df = rates.simulate_rate_frame(0.5, NS, 20, sigma=0.3, seed=3)
    rng = np.random.default_rng(0)
    df.loc[rng.random(len(df)) < 0.05, "y"] *= 100
    ols = ms.fit_rate(df, "y", n_resamples=300).table.iloc[0]
    hub = ms.fit_rate(df, "y", estimator="huber", n_resamples=300)
    row = hub.table.iloc[0]
    assert abs(row["exponent"] - 0.5) < 0.5 * abs(ols["exponent"] - 0.5)
    assert row["ci_low"] < row["exponent"] < row["ci_high"]
    assert np.isnan(row["aic"]) and hub.config["estimator"] == "huber"
    rob = ms.fit_rate(df, "y", estimator="huber", method="robust").table.iloc[0]
    assert rob["exponent"] == pytest.approx(row["exponent"])
    with pytest.raises(ValueError, match="agg=None"):
        ms.fit_rate(df, "y", estimator="huber", agg="mean")


def test_unit_profile_and_invariance_plots(tmp_path):
    import matplotlib.pyplot as plt

    from moestat.rates.plots import plot_invariance, plot_unit_profiles

    rng = np.random.default_rng(0)
    ns = [1000, 3000, 10000, 30000, 100000]
    rows = [{"expert": e, "gate": g, "truth_seed": s, "n": n,
             "y": 3 * n ** -0.5 * np.exp(rng.normal(0, 0.2)), "y_alt": 3 * n ** -0.5 * np.exp(rng.normal(0, 0.2))}
            for e in ("gelu", "relu") for g in ("sigmoid", "softmax") for s in range(5) for n in ns]
    frame = pd.DataFrame(rows).assign(y_best=lambda f: f["y"])
    rates_table = ms.fit_rate(frame, "y_best", by=["expert", "gate"], units="truth_seed", n_resamples=200, seed=0).table
    fig = plot_unit_profiles(frame, rates_table.assign(y="y_best"), ["y"], hue="gate", hue_label="gate {}",
                             colors={"sigmoid": "tab:blue"}, label="test")
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == "gelu: y (test)"
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    row = rates_table[(rates_table["expert"] == "gelu") & (rates_table["gate"] == "sigmoid")].iloc[0]
    interval = f"{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
    assert legend[0] == f"gate sigmoid: {interval}, {row['verdict']}"
    fig.savefig(tmp_path / "profiles.png")
    plt.close(fig)
    fig = plot_invariance(frame, ["y"], hue="gate")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["sigmoid, gelu", "softmax, gelu", "sigmoid, relu",
                                                                   "softmax, relu"]
    assert ax.get_xscale() == "log" and len(ax.collections) == 4
    plt.close(fig)


def test_former_argument_names_still_work_with_a_future_warning():
    """n_boot= (rates) and B= (bootstrap, LRT) became n_resamples=: the old names give the same result with a
    FutureWarning naming the new one; passing both is an error."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"n": np.repeat([100, 200, 400, 800, 1600], 8), "rep": np.tile(np.arange(8), 5)})
    frame["y"] = frame["n"] ** -0.5 * np.exp(rng.normal(0, 0.1, len(frame)))
    new = ms.fit_rate(frame, "y", n_resamples=200, seed=1, warn=False).table
    with pytest.warns(FutureWarning, match=r"n_resamples="):
        old = ms.fit_rate(frame, "y", n_boot=200, seed=1, warn=False).table
    pd.testing.assert_frame_equal(new, old)
    with pytest.raises(TypeError, match="former name"):
        ms.fit_rate(frame, "y", n_boot=200, n_resamples=200)


def test_ci_is_now_confidence_level():
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"n": np.repeat([100, 200, 400, 800, 1600], 8), "rep": np.tile(np.arange(8), 5)})
    frame["y"] = frame["n"] ** -0.5 * np.exp(rng.normal(0, 0.1, len(frame)))
    new = ms.fit_rate(frame, "y", confidence_level=0.9, n_resamples=200, seed=1, warn=False).table
    with pytest.warns(FutureWarning, match="confidence_level="):
        old = ms.fit_rate(frame, "y", ci=0.9, n_resamples=200, seed=1, warn=False).table
    pd.testing.assert_frame_equal(new, old)
