"""The Engel real-data vignette: importable without computing, loads the data it documents, and its formula is the
centred log-log regression it describes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import moestat as ms

from .conftest import load_vignette

NAME = "real-data-moe"


@pytest.fixture(scope="module")
def mod():
    return load_vignette(NAME)


def test_vignette_contract_and_data(mod):
    assert mod.NAME == NAME and mod.TITLE and callable(mod.run)
    engel = mod.load_data()
    assert engel.shape == (235, 2) and set(engel.columns) == {"income", "foodexp"}  # Engel (1857): 235 households
    assert np.isfinite(engel.to_numpy()).all() and (engel.to_numpy() > 0).all()  # logs are defined
    assert mod._config(True)["B_boot"] < mod._config(False)["B_boot"]


def test_formula_is_the_centred_log_log_regression(mod):
    engel = mod.load_data()
    fit = ms.fit_mle(formula=mod.FORMULA, data=engel, k=1, restarts=1, seed=0)
    assert fit.param_names[:2] == ["expert[0]:const", f"expert[0]:{mod.SLOPE}"]  # terms named from the frame
    # k = 1 is least squares of log(foodexp) on centred log(income) (closed form); one EM step solves it exactly
    x = np.log(engel["income"].to_numpy())
    y = np.log(engel["foodexp"].to_numpy())
    Z = np.c_[np.ones(len(y)), x - x.mean()]
    beta = np.linalg.lstsq(Z, y, rcond=None)[0]
    np.testing.assert_allclose(fit.theta[:2], beta, rtol=1e-9)
    assert beta[0] == pytest.approx(y.mean(), rel=1e-12)  # centring: the intercept is the mean log expenditure


def test_checked_in_lrt_statistic_is_twice_the_loglik_gain_in_the_table():
    """The outputs under docs/ come from one run: the LRT of 1 vs 2 experts is twice the log-likelihood gain of
    select_k's table (both maximise the same likelihoods, up to EM's tolerance and the starts each fit tried)."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs" / "vignettes" / NAME
    assert (docs / "provenance.json").is_file(), "the vignette's outputs belong under docs/vignettes/real-data-moe"
    table = pd.read_csv(docs / "bic_over_k.csv").set_index("k")
    lrt = pd.read_csv(docs / "lrt.csv").set_index("k0")
    gain = 2 * (table.loc[2, "loglik"] - table.loc[1, "loglik"])
    # the 2-expert likelihood has two maxima 0.016 apart and the LRT's fits use fewer starts than select_k (and
    # tol=1e-6): they may stop at the lower one, a statistic up to 2 x 0.016 = 0.032 smaller, hence 0.04
    assert abs(lrt.loc[1, "statistic"] - gain) < 0.04
