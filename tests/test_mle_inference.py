"""Inference for Gaussian MoE fits: bootstrap, LRT for k, select_k, scikit-learn wrapper, statistical validity."""

from __future__ import annotations

import numpy as np
import pandas as pd
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
    shown = repr(res).splitlines()  # the whole comparison, whatever pandas' display width
    assert shown[0] == "SelectKResult(criterion='bic', best_k=2)" and len(shown) == 5
    assert shown[1].split() == ["k", "loglik", "df", "aic", "bic", "icl", "converged", "n_small", "n_at_floor",
                                "degenerate", "best"]
    with pytest.raises(ValueError, match="criterion"):
        ms.select_k(*data2, ks=(1, 2), criterion="dic")



@pytest.mark.parametrize(("call", "wrong", "suggested"), [
    ("test_n_experts", "n_boot", "n_resamples"), ("bootstrap", "B_resamples", "n_resamples"),
    ("select_k", "restart", "restarts"), ("select_k", "tolerance_of_em", None)])
def test_an_unknown_extra_keyword_is_named_with_the_function_called(data2, fit2, call, wrong, suggested):
    args = (fit2,) if call == "bootstrap" else data2
    with pytest.raises(TypeError, match=rf"^{call}\(\) got an unexpected keyword argument '{wrong}': its extra "
                                        "keywords go to fit_mle") as err:
        getattr(ms, call)(*args, seed=0, **{wrong: 3})
    assert (f"Did you mean '{suggested}'" in str(err.value)) if suggested else ("Did you mean" not in str(err.value))

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


# ------------------------------------------------------------------- shared coefficients and binomial trials
def _shared_slope_frame(n: int = 400, seed: int = 12) -> pd.DataFrame:
    """Two experts on x (gate on x) and one slope 1.5 on z common to both: y = b_j + a_j x + 1.5 z + 0.3 e."""
    rng = np.random.default_rng(seed)
    x, z = rng.uniform(-1, 1, n), rng.normal(size=n)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-3 * x))
    y = np.where(first, 1 + 2 * x, -1 - x) + 1.5 * z + 0.3 * rng.normal(size=n)
    return pd.DataFrame({"x": x, "z": z, "y": y})


def _binomial_trials_data(n: int = 400, seed: int = 11) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two logistic experts, gate on x, m_t in 5..30 trials per row; y is the proportion of successes."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, n)
    m = rng.integers(5, 31, n).astype(float)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-(0.3 + 2.0 * x)))
    eta = np.where(first, 1.0 + 1.5 * x, -1.0 - 1.0 * x)
    return x[:, None], rng.binomial(m.astype(int), 1 / (1 + np.exp(-eta))) / m, m


@pytest.fixture(scope="module")
def binomial_fit():
    X, y, m = _binomial_trials_data()
    return ms.fit_mle(ms.MoE(k=2, d=1, response="binomial"), X, y, trials=m, seed=1), X, y, m


def test_select_k_with_shared_slope_picks_the_true_k():
    df = _shared_slope_frame()
    res = ms.select_k(formula="y ~ x", data=df, shared="~ z", ks=(1, 2, 3), seed=3, restarts=3)
    # fixed seed, so the choice is deterministic; it is also not marginal: BIC(1) - BIC(2) ~ 720 and BIC(3) - BIC(2)
    # ~ 13 (a Bayes factor of e^6.7 against a third expert, whose fit is moreover degenerate and skipped: a vanishing
    # expert at the variance floor), so k = 2 is the BIC minimum with or without the skip
    assert res.best_k == 2
    table = res.table.set_index("k")
    assert table["bic"].idxmin() == 2 and table.loc[1, "bic"] - table.loc[2, "bic"] > 100
    # parameters counted by hand: gate (k-1) x (const, x), experts k x (const, x), one shared slope, k sigmas
    assert list(table["df"]) == [2 * (k - 1) + 2 * k + 1 + k for k in (1, 2, 3)]
    # k = 1 with a shared slope is the linear regression y ~ x + z: its maximised Gaussian log-likelihood is
    # -n/2 (log(2 pi RSS/n) + 1) (closed form); one EM step solves least squares exactly, so only rounding remains
    Z = np.c_[np.ones(len(df)), df["x"], df["z"]]
    rss = ((df["y"] - Z @ np.linalg.lstsq(Z, df["y"], rcond=None)[0]) ** 2).sum()
    assert table.loc[1, "loglik"] == pytest.approx(-len(df) / 2 * (np.log(2 * np.pi * rss / len(df)) + 1), rel=1e-9)
    fit = res.fits[2]
    assert fit.param_names.count("shared:z") == 1 and fit.layout.shared_columns == (1,)
    gamma, se = fit.theta[fit.param_names.index("shared:z")], fit.bse()[fit.param_names.index("shared:z")]
    assert abs(gamma - 1.5) < 4 * se  # the true shared slope, within 4 standard errors
    # the array interface takes the same model as shared_columns (here the gate also reads z: one more column)
    arrays = ms.select_k(df[["x", "z"]].to_numpy(), df["y"].to_numpy(), ks=(1,), shared_columns=[1], seed=3)
    assert arrays.table["loglik"].iloc[0] == pytest.approx(table.loc[1, "loglik"], rel=1e-9)
    with pytest.raises(TypeError, match="shared= needs formula"):
        ms.select_k(df[["x", "z"]].to_numpy(), df["y"].to_numpy(), ks=(1,), shared="~ z")


def test_parametric_bootstrap_with_trials_agrees_with_observed_information(binomial_fit):
    fit = binomial_fit[0]
    bs = ms.bootstrap(fit, n_resamples=40, seed=2)
    assert bs.n_failed == 0 and bs.config["trials"]
    ratio = bs.se() / fit.bse()
    # B=40: a bootstrap SE has relative sd ~ 1/sqrt(2*39) = 11%, so 35% is a > 3 sd band per term.  Drawing the
    # resamples as 0/1 responses (trials dropped) would inflate every SE by ~sqrt(mean m) ~ 4, far outside it
    assert np.all(np.abs(ratio - 1) < 0.35), ratio
    centre = np.abs(np.median(bs.draws, 0) - fit.theta) / fit.bse()
    assert centre.max() < 1.0  # labels aligned: the draws sit around the estimate


def test_nonparametric_bootstrap_resamples_rows_with_their_trials(binomial_fit):
    from moestat.inference import _resamples

    fit, X, y, m = binomial_fit
    seeds = np.random.SeedSequence(5).spawn(3)
    Xb, yb, wb, mb = _resamples(fit, X[None], y[None], 3, "nonparametric", None, np.random.SeedSequence(4), seeds, m)
    assert wb is None  # unweighted fit: the resample's multiplicities are its repeated rows
    rows = {(a, b, c) for a, b, c in zip(X[:, 0], y, m, strict=True)}
    for b in range(3):  # every resampled (x, y, m) is one of the original rows, trials included (brute force)
        assert all(t in rows for t in zip(Xb[b, :, 0], yb[b], mb[b], strict=True))
        assert len(set(zip(Xb[b, :, 0], mb[b], strict=True))) < len(y)  # drawn with replacement
    bs = ms.bootstrap(fit, n_resamples=20, seed=6, kind="nonparametric")
    assert bs.n_failed == 0
    again = ms.bootstrap(fit, X, y, n_resamples=20, seed=6, kind="nonparametric", trials=m)
    np.testing.assert_array_equal(again.draws, bs.draws)  # trials= given explicitly: the fit's own, same draws
    ratio = bs.se() / fit.bse()
    # B=20 nonparametric: the SE's relative sd is ~16-20% (pairs resampling adds the design's variability), so a
    # +-60% band is a ~3 sd check that the refits saw trials (without them every SE would be ~4 times larger)
    assert np.all(np.abs(ratio - 1) < 0.6), ratio
    with pytest.raises(ValueError, match="trials has shape"):
        ms.bootstrap(fit, n_resamples=5, trials=m[:10])


def test_bootstrap_refuses_trials_for_a_fit_without_them(fit2):
    with pytest.raises(TypeError, match="trials= is for fits with binomial trials"):
        ms.bootstrap(fit2, n_resamples=5, trials=np.ones(300))


class _Spy:
    """Wraps the real fit_mle of moestat.inference and records each call's options and resulting fit."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import moestat.inference as inference

        self.real, self.calls = inference.fit_mle, []
        monkeypatch.setattr(inference, "fit_mle", self)

    def __call__(self, *args, **kwargs):
        fit = self.real(*args, **kwargs)
        self.calls.append((args, kwargs, fit))
        return fit


def test_lrt_null_refits_keep_the_shared_design(monkeypatch):
    df = _shared_slope_frame(n=250, seed=13)
    spy = _Spy(monkeypatch)
    lrt = ms.test_n_experts(formula="y ~ x", data=df, shared="~ z", k0=1, k1=2, n_resamples=9, seed=4, restarts=2)
    assert len(spy.calls) == 4  # k0 and k1 to the data, then k0 and k1 to the 9 null resamples (batched)
    for i, (_, kwargs, fit) in enumerate(spy.calls):
        assert fit.layout.shared_columns == (1,) and kwargs["shared_columns"] == (1,)
        assert fit.param_names.count("shared:z") == 1
        assert fit.n_reps == (1 if i < 2 else 9)
    assert lrt.fit1.param_names.count("shared:z") == 1 and lrt.config["shared"] == "z"
    # both nested fits keep the constraint and the k1 fit starts from the k0 fit split, so every statistic is
    # non-negative up to the optimiser's tolerance; with the constraint lost in the null refits, the k0 refit would
    # have the wrong df and the k1 refit extra slopes
    assert lrt.statistic > 50 and (lrt.null_distribution > -1e-4).all()
    assert lrt.p_value == pytest.approx(1 / 10)  # the smallest attainable p-value with B=9


def test_lrt_with_trials_draws_and_refits_with_the_rows_trials(monkeypatch):
    X, y, m = _binomial_trials_data(n=300, seed=14)
    spy = _Spy(monkeypatch)
    lrt = ms.test_n_experts(X, y, k0=1, k1=2, n_resamples=9, seed=7, restarts=2, family="binomial", trials=m)
    (_, k_data, _), (_, _, _), (a_null, k_null, g0), _ = spy.calls
    np.testing.assert_array_equal(k_data["trials"], m[None])
    np.testing.assert_array_equal(k_null["trials"], np.repeat(m[None], 9, axis=0))  # each resample keeps m_t
    ys = np.asarray(a_null[2])
    successes = ys * m
    assert np.allclose(successes, np.rint(successes), atol=1e-9)  # proportions of m_t trials, not 0/1 draws
    assert len(np.unique(ys)) > 2 and g0.settings["trials"]
    assert lrt.statistic > 50 and lrt.p_value == pytest.approx(1 / 10) and lrt.config["trials"]
    assert (lrt.null_distribution > -1e-4).all()


def test_repeat_rows_repeats_per_replicate_arrays_for_the_null_resamples():
    from moestat.inference import _repeat_rows

    w = np.arange(6.0).reshape(2, 3)
    out = _repeat_rows({"weights": w, "trials": np.ones(3), "shared_columns": (1,)}, B=2)
    np.testing.assert_array_equal(out["weights"], [w[0], w[0], w[1], w[1]])  # replicate r's rows r*B .. r*B + B - 1
    assert out["trials"].shape == (3,) and out["shared_columns"] == (1,)
