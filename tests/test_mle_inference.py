"""Inference for Gaussian MoE fits: bootstrap, LRT for k, select_k, scikit-learn wrapper, statistical validity."""

from __future__ import annotations

import numpy as np
import pytest

import moestat as ms
from moestat.fit._layout import BlockParams, ParamLayout

SPEC2 = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
TRUTH2 = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.5])
SPEC1 = SPEC2.with_k(1)
TRUTH1 = ms.Params([0.0], [[0.0]], [[1.0]], [0.0], noise_sd=[0.5])


@pytest.fixture(scope="module")
def data2():
    d = ms.simulate(SPEC2, TRUTH2, n=300, seed=0, model="mixture")
    return d.X[0], d.y[0]


@pytest.fixture(scope="module")
def fit2(data2):
    return ms.fit_mle(SPEC2, *data2, seed=1)


def test_parametric_bootstrap_se_agrees_with_observed_information(fit2, data2):
    bs = ms.bootstrap(fit2, *data2, n_resamples=40, seed=2)
    assert bs.n_failed == 0 and bs.draws.shape == (40, 8)
    ratio = bs.se() / fit2.bse()
    # B=40 gives the bootstrap SE a relative sd of about 1/sqrt(2*39) ~ 11%; 35% is a > 3 sd band
    assert np.all(np.abs(ratio - 1) < 0.35)
    # aligned draws are centred on the estimate (no label switching mixes the two experts' atoms)
    centre = np.abs(np.median(bs.draws, 0) - fit2.theta) / fit2.bse()
    assert centre.max() < 1.0
    ci = bs.conf_int()
    assert (ci[:, 0] < fit2.theta).all() and (fit2.theta < ci[:, 1]).all()
    tf = bs.to_frame()
    assert list(tf["term"]) == fit2.param_names and tf["n_failed"].iloc[0] == 0


def test_bootstrap_aligns_labels_of_a_relabelled_fit(fit2, data2):
    swapped = fit2.relabel([1, 0])
    bs = ms.bootstrap(swapped, *data2, n_resamples=20, seed=3, kind="nonparametric")
    centre = np.abs(np.median(bs.ok, 0) - swapped.theta) / swapped.bse()
    assert centre.max() < 1.0


def test_bootstrap_reports_failures_instead_of_redrawing(fit2, data2):
    # max_iter=1 cannot converge: every refit fails and is reported, none is silently replaced
    with pytest.warns(UserWarning, match="bootstrap refits failed"):
        bs = ms.bootstrap(fit2, *data2, n_resamples=5, seed=4, max_iter=1, restarts=1)
    assert bs.n_failed == 5 and np.isnan(bs.draws).all()


def test_bootstrap_rejects_batched_fit():
    d = ms.simulate(SPEC2, TRUTH2, n=100, reps=2, seed=5, model="mixture")
    fit = ms.fit_mle(SPEC2, d.X, d.y, seed=6, restarts=2)
    with pytest.raises(ValueError, match="single data set"):
        ms.bootstrap(fit, d.X[0], d.y[0], n_resamples=5)


def test_lrt_rejects_one_expert_for_two_expert_data(data2):
    lrt = ms.test_n_experts(*data2, k0=1, k1=2, n_resamples=9, seed=7, restarts=2)
    assert lrt.statistic > 50
    assert lrt.p_value == pytest.approx(1 / 10)  # the smallest attainable p-value with B=9
    frame = lrt.to_frame()
    assert frame["B_ok"].iloc[0] == 9


def test_lrt_batched_on_null_data_gives_valid_pvalues():
    d = ms.simulate(SPEC1, TRUTH1, n=100, reps=2, seed=8, model="mixture")
    lrt = ms.test_n_experts(d.X, d.y, k0=1, k1=2, n_resamples=9, seed=9, restarts=1)
    # the split start nests the k0 fit, so the statistic is (up to optimiser tolerance) non-negative
    assert (lrt.statistic > -1e-4).all() and (lrt.null_distribution > -1e-4).all()
    assert lrt.p_value.shape == (2,) and ((lrt.p_value >= 0.1) & (lrt.p_value <= 1)).all()


def test_select_k_picks_two_on_two_expert_data(data2):
    res = ms.select_k(*data2, ks=(1, 2, 3), seed=10, restarts=3)
    assert res.best_k == 2
    assert list(res.table["k"]) == [1, 2, 3] and res.table["best"].sum() == 1
    with pytest.raises(ValueError, match="criterion"):
        ms.select_k(*data2, ks=(1, 2), criterion="dic")


def test_sklearn_regressor_fits_and_exposes_results(data2):
    pytest.importorskip("sklearn")
    from sklearn.model_selection import cross_val_score

    X, y = data2
    est = ms.MoERegressor(n_experts=2, random_state=0).fit(X, y)
    assert est.converged_ and est.params_.k == 2
    assert np.isclose(est.loglik(X, y), est.loglik_)
    Z = np.c_[np.ones(len(y)), X]
    ols_r2 = 1 - ((y - Z @ np.linalg.lstsq(Z, y, rcond=None)[0]) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    assert est.score(X, y) >= ols_r2  # the MoE conditional mean nests the linear regression (k=1 limit)
    assert est.gate_probs(X).shape == (300, 2)
    scores = cross_val_score(ms.MoERegressor(n_experts=2, restarts=2, random_state=0), X, y, cv=3)
    assert np.isfinite(scores).all()
    sig = ms.MoERegressor(n_experts=2, gate="sigmoid", restarts=2, random_state=0).fit(X, y)
    assert sig.fit_.settings["method"] == "gradient"


# ------------------------------------------------------------------------------- statistical validity
def _validity(R: int, n: int, seed: int):
    d = ms.simulate(SPEC2, TRUTH2, n=n, reps=R, seed=seed, model="mixture")
    fit = ms.fit_mle(SPEC2, d.X, d.y, seed=seed + 1, restarts=2, init=TRUTH2).align_to(TRUTH2)
    th0 = ParamLayout(SPEC2).pack(BlockParams.from_params(TRUTH2.to_torch())).numpy()
    ratio = fit.bse().mean(0) / fit.theta.std(0, ddof=1)
    ci = fit.conf_int()
    cover = ((ci[..., 0] <= th0) & (th0 <= ci[..., 1])).mean(0)
    return ratio, cover


def test_standard_errors_and_wald_coverage_reduced():
    ratio, cover = _validity(R=80, n=300, seed=20)
    # R=80: the MC sd has relative sd ~ 1/sqrt(2R) = 8%, so +-25% is a ~3 sd band per term;
    # per-term coverage has binomial sd 2.4%, the mean over 8 terms is checked at +-4%.
    assert np.all(np.abs(ratio - 1) < 0.25), ratio
    assert 0.91 <= cover.mean() <= 0.99, cover


@pytest.mark.slow
def test_standard_errors_and_wald_coverage_full():
    ratio, cover = _validity(R=1000, n=500, seed=30)
    # issue criterion: MC sd vs mean bse within 10%, 95% Wald coverage in [93%, 97%] for each term
    assert np.all(np.abs(ratio - 1) < 0.10), ratio
    assert np.all((cover >= 0.93) & (cover <= 0.97)), cover


@pytest.mark.slow
def test_bootstrap_lrt_size_full():
    d = ms.simulate(SPEC1, TRUTH1, n=200, reps=600, seed=40, model="mixture")
    lrt = ms.test_n_experts(d.X, d.y, k0=1, k1=2, n_resamples=19, seed=41, restarts=1)
    size = (lrt.p_value <= 0.05).mean()
    # issue criterion: size within 5% +- 2%.  With B=19, p <= 0.05 means the observed LR beats all 19 null
    # draws, an exact 5% test under exchangeability; R=600 null data sets give the size a binomial sd of
    # 0.9%, so the band is +-2.2 sd.
    assert 0.03 <= size <= 0.07, size
