"""Smoke test of vignettes/gated-nn-recovery.py at its tiny "smoke" size (the --quick size takes minutes)."""

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

PATH = Path(__file__).resolve().parents[2] / "vignettes" / "gated-nn-recovery.py"


@pytest.fixture(scope="module")
def vignette():
    spec = importlib.util.spec_from_file_location("gated_nn_recovery", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)      # importing computes nothing
    return mod


def test_vignette_runs_and_resumes(vignette, tmp_path, monkeypatch):
    assert vignette.NAME == "gated-nn-recovery"
    monkeypatch.setitem(vignette.SIZES, "quick", vignette.SIZES["smoke"])
    vignette.run(tmp_path, quick=True)
    for name in ("results.csv", "rates.csv", "provenance.json", "compare_summary.csv", "fig_vs_n.png",
                 "fig_compare_iterations.png"):
        assert (tmp_path / name).exists(), name
    res = pd.read_csv(tmp_path / "results.csv")
    assert {"part", "metric", "value", "method"} <= set(res.columns)
    assert set(res["part"]) == {"compare", "vs_n", "sigma", "nonlinear", "scaling", "nongauss"}
    prov = json.loads((tmp_path / "provenance.json").read_text())["config"]
    assert prov["size"] == "quick"
    assert prov["rate_fit"]["function"] == "moestat.fit_rate"
    rates = pd.read_csv(tmp_path / "rates.csv")   # ms.fit_rate details + its knobs + H0 alpha = 1/2 + AIC columns
    assert {"method", "metric", "model", "exponent", "se", "ci_low", "ci_high", "df", "cov_type", "n_values",
            "replicates", "curvature_p", "config_method", "interval", "n_resamples", "resample", "seed",
            "h0_exponent", "h0_p_value", "aic_best_model", "aic_weight_power"} <= set(rates.columns)
    assert set(rates["config_method"]) == {"cluster_bootstrap"} and set(rates["cov_type"]) == {"bootstrap"}
    assert set(rates["resample"]) == {"within_n"}
    assert {("tensor", "gate_l2"), ("tensor", "reg_angle"), ("gate|A=A*", "gate_l2")} <= set(
        zip(rates["method"], rates["metric"], strict=True))
    assert ((rates["ci_low"] <= rates["exponent"]) & (rates["exponent"] <= rates["ci_high"])).all()
    (piece,) = (tmp_path / "pieces").glob("vs_n-*.csv")  # named by a hash of the configuration
    stamp = piece.stat().st_mtime_ns
    vignette.run(tmp_path, quick=True)              # resume: finished pieces are not recomputed
    assert piece.stat().st_mtime_ns == stamp
