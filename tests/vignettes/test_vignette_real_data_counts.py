"""The RAND HIE count vignette: importable without computing, and a smoke run of its quick size: every promised file
is written, the Poisson fit is not degenerate while the Gaussian one is.  Its statistics (predictive checks, the GLM
comparison, restart log-likelihoods) are library functions, tested in tests/fit/test_checks.py."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from .conftest import load_vignette

NAME = "real-data-counts"


@pytest.fixture(scope="module")
def mod():
    return load_vignette(NAME)


def test_contract_and_data(mod):
    assert mod.NAME == NAME and mod.TITLE and callable(mod.run)
    assert set(mod.SIZES) == {"smoke", "quick", "full"} and mod.SIZES["full"]["n"] is None
    data = mod.load_data()
    # statsmodels' randhie documents 20,190 person-years and 10 variables; 6,308 of the visit counts are zero
    assert data.shape == (20190, 10) and int((data["mdvis"] == 0).sum()) == 6308
    sub = mod.load_data(500)
    assert len(sub) == 500 and sub.equals(mod.load_data(500))  # the subsample is fixed by the seed
    with pytest.raises(ValueError, match="size='huge'"):
        mod._size(False, "huge")


# smoke: ~10 s, quick: ~25 s on an idle 2-core machine
@pytest.mark.parametrize("size", ["smoke", pytest.param("quick", marks=pytest.mark.slow)])
def test_run_writes_everything_and_names_the_degenerate_fit(mod, tmp_path, size):
    mod.run(tmp_path, size=size)
    for f in mod.OUTPUTS:
        assert (tmp_path / f).is_file(), f
    compare = pd.read_csv(tmp_path / "compare.csv").set_index("family")
    # the Gaussian fit collapses an expert onto the zeros; the Poisson fit with the same k is not degenerate
    assert compare.loc["gaussian", "n_findings"] > 0 and "tied_responses" in compare.loc["gaussian", "kinds"]
    assert compare.loc["poisson", "n_findings"] == 0
    found = pd.read_csv(tmp_path / "degeneracy_compare.csv")
    assert (found["kind"] == "tied_responses").any() and found["detail"].str.contains("y = 0").any()
    assert "DegenerateFitWarning" in (tmp_path / "gaussian_warning.txt").read_text()
    sel_g = pd.read_csv(tmp_path / "select_k_gaussian.csv")
    assert sel_g["degenerate"].notna().any() and not sel_g.loc[sel_g["best"], "degenerate"].notna().any()
    sel_p = pd.read_csv(tmp_path / "select_k_poisson.csv")
    assert sel_p["degenerate"].isna().all() and sel_p["best"].sum() == 1
    glm = pd.read_csv(tmp_path / "glm_check.csv").set_index("term")
    # k = 1 is the Poisson GLM: both reach its unique MLE (strictly concave log-likelihood; measured differences
    # ~1e-10), and both SEs invert the same observed information (measured relative differences ~1e-7)
    assert glm["abs_diff"].max() < 1e-6 and glm["se_rel_diff"].max() < 1e-4
    checks = pd.read_csv(tmp_path / "fit_checks.csv")
    disp = checks.set_index("model")["pearson_dispersion"]
    assert disp.iloc[1] < disp.iloc[0]  # the mixture absorbs part of the over-dispersion of the one-expert GLM
    assert list(checks.columns) == mod.CHECK_COLUMNS and checks["model"].str.startswith("NB2").iloc[-1]
    # every model's predicted share of zeros is a probability, against the data's one observed share
    assert checks["predicted_zero_share"].between(0, 1).all() and checks["observed_zero_share"].nunique() == 1
    coef = pd.read_csv(tmp_path / "coefficients.csv")
    assert coef["term"].str.contains("lncoins").any() and coef["std_error"].notna().all()
    assert (coef["se_sandwich"] > 0).all() and np.isfinite(coef["se_sandwich"]).all()  # fit.bse("sandwich")
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["size"] == size and prov["config"]["n_rows"] == mod.SIZES[size]["n"]
    stamp = (tmp_path / "results.csv").stat().st_mtime_ns
    mod.run(tmp_path, size=size)  # resume: the outputs are complete for this size, nothing is recomputed
    assert (tmp_path / "results.csv").stat().st_mtime_ns == stamp
