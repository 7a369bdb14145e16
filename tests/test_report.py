"""The shared report of every result (moestat.report.Result): tidy, glance and one Summary type."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import moestat as ms
from moestat import rates
from moestat.report import Result, Summary

SPEC2 = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
TRUTH2 = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.5])


def _check_report(res: Result, tidy_rows: int, glance_rows: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    assert isinstance(res, Result)
    tidy, glance = res.tidy(), res.glance()
    assert isinstance(tidy, pd.DataFrame) and len(tidy) == tidy_rows
    assert isinstance(glance, pd.DataFrame) and len(glance) == glance_rows
    summary = res.summary()
    assert isinstance(summary, Summary)
    for text in (summary.as_text(), summary.as_html(), summary.as_latex()):
        assert isinstance(text, str) and len(text) > 50
    return tidy, glance


def test_rate_result_reports_the_exponent_with_broom_columns():
    df = rates.simulate_rate_frame(0.5, np.geomspace(100, 1e5, 9).round(), 20, seed=1)
    res = ms.fit_rate(df, "y")
    tidy, glance = _check_report(res, 1, 1)
    row, table = tidy.iloc[0], res.table.iloc[0]
    assert row["term"] == "exponent" and row["estimate"] == table["exponent"]
    assert (row["std_error"], row["conf_low"], row["conf_high"]) == (table["se"], table["ci_low"], table["ci_high"])
    assert glance.iloc[0]["verdict"] == table["verdict"] == row["verdict"]
    assert "verdict rule" in res.summary() and "power law" in res.summary()
    assert str(res) == res.summary().as_text()


def test_window_sensitivity_and_sample_complexity_report():
    df = rates.simulate_rate_frame(0.5, np.geomspace(100, 1e5, 9).round(), 10, seed=2)
    ws = ms.window_sensitivity(df, "y", n_resamples=100)
    tidy, glance = _check_report(ws, len(ws.table), 1)
    np.testing.assert_array_equal(tidy["estimate"], ws.table["exponent"])
    assert bool(glance.iloc[0]["consistent"])  # a power law: every window's interval shares a point
    acc = pd.DataFrame({"n": np.repeat([100.0, 200, 400, 800], 2), "rep": [0, 1] * 4,
                        "acc": np.repeat([0.5, 0.6, 0.8, 0.9], 2)})
    sc = ms.sample_complexity(acc, "acc", 0.7, n_resamples=100)
    tidy, _ = _check_report(sc, 1, 1)
    assert tidy.iloc[0]["term"] == "n_star" and tidy.iloc[0]["estimate"] == sc.table.iloc[0]["n_star"]


@pytest.fixture(scope="module")
def mle_fit():
    data = ms.simulate(SPEC2, TRUTH2, n=300, seed=0, model="mixture")
    return data.X[0], data.y[0], ms.fit_mle(SPEC2, data.X[0], data.y[0], seed=1)


def test_bootstrap_lrt_and_select_k_report(mle_fit):
    X, y, fit = mle_fit
    bs = ms.bootstrap(fit, X, y, n_resamples=8, seed=2)
    tidy, glance = _check_report(bs, len(bs.names), 1)
    np.testing.assert_allclose(tidy["std_error"], bs.se())
    np.testing.assert_allclose(tidy[["conf_low", "conf_high"]], bs.conf_int(0.05))
    assert glance.iloc[0]["n_resamples"] == 8 and glance.iloc[0]["n_ok"] + glance.iloc[0]["n_failed"] == 8
    lrt = ms.test_n_experts(X, y, k0=1, k1=2, n_resamples=4, seed=7, restarts=1)
    tidy, _ = _check_report(lrt, 1, 1)
    assert tidy.iloc[0]["statistic"] == lrt.statistic and tidy.iloc[0]["p_value"] == lrt.p_value
    sel = ms.select_k(X, y, ks=(1, 2), seed=10, restarts=1)
    _, glance = _check_report(sel, 2, 1)
    assert glance.iloc[0]["best_k"] == sel.best_k


def test_gbar_result_reports_its_fits():
    spec = ms.MoE(gate="sigmoid", expert="relu", k=2, d=1)
    truth = ms.Params([0.2, -0.3], [[1.0], [-1.0]], [[1.0], [0.5]], [0.0, 0.3])
    gb = ms.estimate_gbar(spec, truth, 3, n_mc=2000, restarts=2, duplicate=[0], max_iter=50, device="cpu")
    tidy, glance = _check_report(gb, 2 * 2 * 3 * 2, 2)  # 2 fits x 2 blocks x 3 atoms x (const, x1)
    np.testing.assert_array_equal(glance["l2"], gb.l2)
    assert set(tidy["fit"]) == {0, 1}
