"""The predictive side of an MLE fit: mixture quantiles and intervals, conditional simulation, the posterior frame,
the plot of a fitted model and the per-component summary, each checked against an independent computation."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats
from scipy.special import softmax

import moestat as ms
from moestat import figstyle
from moestat.fit.checks import predictive_checks
from moestat.fit.results import mixture_cdf, mixture_quantile
from moestat.inference import _draw

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC2 = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
TRUTH2 = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.5])
XNEW = np.array([[-0.9], [-0.2], [0.0], [0.4], [1.1]])
QS = np.array([0.025, 0.1, 0.5, 0.9, 0.975])


@pytest.fixture(scope="module")
def gauss():
    d = ms.simulate(SPEC2, TRUTH2, n=400, seed=0, model="mixture")
    return ms.fit_mle(SPEC2, d.X[0], d.y[0], seed=1, restarts=3)


def _frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    """Experts on x, gate on w (a concomitant variable), Gaussian response y and count response visits."""
    rng = np.random.default_rng(seed)
    x, w = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    first = rng.uniform(size=n) < 1 / (1 + np.exp(-3 * w))
    y = np.where(first, 1 + 2 * x, -1 - x) + 0.3 * rng.normal(size=n)
    visits = rng.poisson(np.where(first, np.exp(0.5 + x), np.exp(2 - x)))
    return pd.DataFrame({"y": y, "visits": visits, "x": x, "w": w})


@pytest.fixture(scope="module")
def counts():
    return ms.fit_mle(formula="visits ~ x", data=_frame(), k=2, gate_formula="~ w", family="poisson", seed=2)


def _by_hand(fit, X):
    """Softmax weights and expert means of the fitted params, written out in numpy."""
    p = fit.params
    w = softmax(p.gate_bias + X @ p.gate_weight.T, axis=1)
    eta = p.expert_bias + X @ p.expert_weight.T
    mu = {"gaussian": eta, "poisson": np.exp(eta), "binomial": 1 / (1 + np.exp(-eta))}[fit.spec.response]
    return w, mu


# ----------------------------------------------------------------------------------------- quantiles
@pytest.mark.parametrize("family", ["gaussian", "poisson", "binomial"])
def test_one_expert_quantiles_and_intervals_are_scipys(family):
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 300)
    y = {"gaussian": 0.5 + x + 0.7 * rng.normal(size=300), "poisson": rng.poisson(np.exp(1 + x)),
         "binomial": (rng.uniform(size=300) < 1 / (1 + np.exp(-2 * x))).astype(float)}[family]
    fit = ms.fit_mle(ms.MoE(k=1, d=1, response=family), x[:, None], y, seed=0, restarts=1)
    _, mu = _by_hand(fit, XNEW)
    q = fit.predict(XNEW, "quantile", q=QS)
    iv = fit.predict(XNEW, "interval", confidence_level=0.9)
    if family == "gaussian":
        sd = fit.params.noise_sd[0]
        np.testing.assert_allclose(q, stats.norm.ppf(QS, mu, sd), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(iv, stats.norm.ppf([0.05, 0.95], mu, sd), rtol=1e-12, atol=1e-12)
    else:
        ppf = stats.poisson.ppf if family == "poisson" else (lambda p, m: stats.binom.ppf(p, 1, m))
        np.testing.assert_array_equal(q, ppf(QS, mu))
        np.testing.assert_array_equal(iv, ppf([0.05, 0.95], mu))
    assert fit.predict(XNEW, "quantile", q=0.5).shape == (5,)  # a scalar q drops its axis


def test_gaussian_mixture_quantiles_invert_the_hand_written_cdf(gauss):
    w, mu = _by_hand(gauss, XNEW)
    sd = gauss.params.noise_sd
    q = gauss.predict(XNEW, "quantile", q=QS)
    for t in range(len(XNEW)):
        def cdf(v, t=t):
            return float((w[t] * stats.norm.cdf(v, mu[t], sd)).sum())
        for j, p in enumerate(QS):
            root = optimize.brentq(lambda v, p=p, cdf=cdf: cdf(v) - p, -20, 20, xtol=1e-13)
            # brentq's own tolerance is 1e-13; the bisection stops at a few ulps of y
            assert q[t, j] == pytest.approx(root, abs=1e-10)
    # the interval is the pair of central quantiles
    np.testing.assert_allclose(gauss.predict(XNEW, "interval", confidence_level=0.95), q[:, [0, -1]], rtol=0,
                               atol=1e-12)


def test_count_mixture_quantile_is_the_smallest_y_with_cdf_at_least_q(counts):
    df = _frame().iloc[:25]
    w, mu = _by_hand(counts, df[["x", "w"]].to_numpy())
    q = counts.predict(df, "quantile", q=QS)
    grid = np.arange(400)
    cdf = (w[:, None, :] * stats.poisson.cdf(grid[None, :, None], mu[:, None, :])).sum(-1)  # brute force
    brute = np.array([[grid[np.argmax(row >= p)] for p in QS] for row in cdf])
    np.testing.assert_array_equal(q, brute)
    lo, hi = counts.predict(df, "interval", confidence_level=0.8).T
    cover = np.take_along_axis(cdf, hi[:, None].astype(int), 1)[:, 0] - np.where(
        lo > 0, np.take_along_axis(cdf, np.maximum(lo - 1, 0)[:, None].astype(int), 1)[:, 0], 0.0)
    assert np.all(cover >= 0.8 - 1e-12)  # a discrete central interval covers at least its level


def test_quantiles_and_intervals_agree_with_monte_carlo(gauss, counts):
    N = 40_000
    sims = gauss.simulate(XNEW, n_draws=N, seed=4)
    assert sims.shape == (N, len(XNEW))
    q = gauss.predict(XNEW, "quantile", q=QS)
    w, mu = _by_hand(gauss, XNEW)
    dens = (w[:, None, :] * stats.norm.pdf(q[..., None], mu[:, None, :], gauss.params.noise_sd)).sum(-1)
    # the empirical q-quantile of N draws has sd sqrt(q(1-q)/N) / f(Q); 5 sd over 25 checks
    se = np.sqrt(QS * (1 - QS) / N) / dens
    assert np.all(np.abs(np.quantile(sims, QS, axis=0).T - q) < 5 * se)
    mean = gauss.predict(XNEW)
    assert np.all(np.abs(sims.mean(0) - mean) < 5 * sims.std(0) / np.sqrt(N))  # 5 SE of a mean
    iv = gauss.predict(XNEW, "interval", confidence_level=0.9)
    inside = ((sims >= iv[:, 0]) & (sims <= iv[:, 1])).mean(0)
    assert np.all(np.abs(inside - 0.9) < 5 * np.sqrt(0.9 * 0.1 / N))  # binomial sd of a coverage
    df = _frame().iloc[:5]
    csims = counts.simulate(df, n_draws=N, seed=5)
    assert np.all(csims == np.round(csims)) and csims.min() >= 0
    cmean = counts.predict(df)
    assert np.all(np.abs(csims.mean(0) - cmean) < 5 * csims.std(0) / np.sqrt(N))


def test_mixture_quantile_skips_components_with_zero_weight():
    w = np.array([[[0.0, 1.0]]])  # a top-K gate can give an expert exactly zero weight
    out = mixture_quantile([0.5], w, np.array([[[100.0, 0.0]]]), np.array([[[1.0, 2.0]]]))
    assert out[0, 0, 0] == pytest.approx(0.0, abs=1e-12)
    assert mixture_cdf(0.0, w[0], np.array([[100.0, 0.0]]), np.array([[1.0, 2.0]]))[0] == pytest.approx(0.5)


def test_simulate_is_the_bootstrap_sampler_and_follows_the_seed(gauss):
    a = gauss.simulate(XNEW, n_draws=6, seed=7)
    np.testing.assert_array_equal(a, gauss.simulate(XNEW, n_draws=6, seed=7))
    ref = _draw(gauss.spec, gauss.params.batched(), XNEW[None], 6, np.random.SeedSequence(7).spawn(1))[0]
    np.testing.assert_array_equal(a, ref)
    assert gauss.simulate(n_draws=2, seed=0).shape == (2, 400)  # default: the training inputs


def test_batched_fit_predicts_per_replicate():
    d = ms.simulate(SPEC2, TRUTH2, n=200, reps=2, seed=8, model="mixture")
    fit = ms.fit_mle(SPEC2, d.X, d.y, seed=9, restarts=2)
    q = fit.predict(XNEW, "quantile", q=[0.2, 0.8])
    assert q.shape == (2, len(XNEW), 2)
    p = fit.params.select(1)  # replicate 1's quantiles solve F(q | x) = p under its own parameters
    w = softmax(p.gate_bias + XNEW @ p.gate_weight.T, axis=1)
    mu = p.expert_bias + XNEW @ p.expert_weight.T
    cdf = (w[:, None, :] * stats.norm.cdf(q[1][..., None], mu[:, None, :], p.noise_sd)).sum(-1)
    np.testing.assert_allclose(cdf, np.broadcast_to([0.2, 0.8], cdf.shape), atol=1e-12)
    assert fit.simulate(XNEW, n_draws=3, seed=1).shape == (2, 3, len(XNEW))
    pf = fit.posterior_frame()
    assert list(pf.columns) == ["rep", "posterior_0", "posterior_1", "component"] and len(pf) == 400


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"kind": "median"}, ValueError, "kind"), ({"kind": "quantile"}, TypeError, "needs q="),
    ({"kind": "quantile", "q": 1.0}, ValueError, "q must be"), ({"kind": "quantile", "q": [[0.5]]}, ValueError, "q"),
    ({"kind": "interval", "confidence_level": 95}, ValueError, "confidence_level"),
    ({"q": 0.5}, TypeError, "q= is for"),
])
def test_predict_rejects_bad_arguments(gauss, kwargs, error, match):
    with pytest.raises(error, match=match):
        gauss.predict(XNEW, **kwargs)
    with pytest.raises(ValueError, match="n_draws"):
        gauss.simulate(XNEW, n_draws=0)


# ------------------------------------------------------------------------------------ posterior frame
def test_posterior_frame_is_bayes_rule_indexed_by_the_data_rows():
    df = _frame(300, seed=10)
    df.index = df.index + 1000
    df.loc[1003, "x"] = np.nan  # dropped by missing="drop": the frame keeps the data's labels of the kept rows
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", missing="drop", seed=11)
    pf = fit.posterior_frame()
    kept = df.dropna()
    assert list(pf.index) == list(kept.index) and list(pf.columns) == ["posterior_0", "posterior_1", "component"]
    w, mu = _by_hand(fit, kept[["x", "w"]].to_numpy())
    joint = w * stats.norm.pdf(kept["y"].to_numpy()[:, None], mu, fit.params.noise_sd)
    tau = joint / joint.sum(1, keepdims=True)
    np.testing.assert_allclose(pf[["posterior_0", "posterior_1"]].to_numpy(), tau, rtol=1e-8, atol=1e-12)
    np.testing.assert_array_equal(pf["component"].to_numpy(), tau.argmax(1))
    new = kept.iloc[:7][["w", "y", "x"]]  # any column order; the response is read from the frame
    pd.testing.assert_frame_equal(fit.posterior_frame(new), pf.iloc[:7])
    with pytest.raises(TypeError, match="needs y="):
        fit.posterior_frame(new.drop(columns="y"))
    arr = ms.fit_mle(SPEC2, kept[["x"]].to_numpy(), kept["y"].to_numpy(), seed=1)
    assert list(arr.posterior_frame().index) == list(range(len(kept)))



def test_posterior_frame_of_new_data_reads_the_frame_once(monkeypatch):
    """One pass through the formula gives the inputs, the response and the kept rows (posterior_frame and
    predictive_checks took two)."""
    df = _frame(300, seed=10)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", missing="drop", seed=11)
    new = df.iloc[:6].copy()
    new.loc[new.index[1], "x"] = np.nan
    calls = []
    transform = ms.formula.ModelDesign.transform
    monkeypatch.setattr(ms.formula.ModelDesign, "transform", lambda self, *a, **k: calls.append(1)
                        or transform(self, *a, **k))
    pf = fit.posterior_frame(new)
    assert len(calls) == 1 and list(pf.index) == list(new.index[[0, 2, 3, 4, 5]])
    checks = predictive_checks(fit, new)
    assert len(calls) == 2 and int(checks["n"].iloc[0]) == 5


def test_posterior_reads_the_response_from_a_frame_of_a_formula_fit():
    df = _frame(300, seed=10)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", seed=11)
    new = df.iloc[:9][["y", "w", "x"]]  # any column order
    np.testing.assert_array_equal(fit.posterior(new), fit.posterior(new, new["y"].to_numpy()))
    np.testing.assert_array_equal(fit.posterior(new), fit.posterior_frame(new)[["posterior_0", "posterior_1"]])
    with pytest.raises(TypeError, match=r"needs y=.*response column 'y'"):
        fit.posterior(new.drop(columns="y"))
    arr = ms.fit_mle(SPEC2, df[["x"]].to_numpy(), df["y"].to_numpy(), seed=1, restarts=1)
    with pytest.raises(TypeError, match=r"needs y=, the responses of the rows of X\.$"):
        arr.posterior(df[["x"]].to_numpy())


def test_a_dropped_row_of_new_data_predicts_nan_in_its_place():
    df = _frame(300, seed=10)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", missing="drop", seed=11)
    new = df.iloc[:8].copy()
    new.loc[new.index[2], "w"] = np.nan  # a gate covariate missing: the row cannot be predicted
    new.loc[new.index[5], "x"] = np.nan  # an expert covariate missing
    ok = np.ones(8, dtype=bool)
    ok[[2, 5]] = False
    complete = new[ok]
    for name, call in [("predict", lambda X: fit.predict(X)), ("interval", lambda X: fit.predict(X, "interval")),
                       ("quantiles", lambda X: fit.predict(X, "quantile", q=[0.1, 0.9])),
                       ("gate_probs", fit.gate_probs), ("expert_means", fit.expert_means),
                       ("posterior", lambda X: fit.posterior(X))]:
        full, part = np.asarray(call(new)), np.asarray(call(complete))
        assert full.shape[0] == 8, name  # one row per row of the frame passed in (R's na.exclude)
        assert np.isnan(full[~ok]).all(), name
        np.testing.assert_array_equal(full[ok], part, err_msg=name)
    y_all = new["y"].to_numpy()  # y given for every row is cut to the kept rows
    np.testing.assert_array_equal(fit.posterior(new.drop(columns="y"), y_all)[ok], fit.posterior(complete))
    draws = fit.simulate(new, n_draws=3, seed=4)
    assert draws.shape == (3, 8) and np.isnan(draws[:, ~ok]).all() and np.isfinite(draws[:, ok]).all()
    pf = fit.posterior_frame(new)  # the tidy frame lists the kept rows by label
    assert list(pf.index) == list(complete.index)
    checks = predictive_checks(fit, new)  # an aggregate over the usable rows, as on the complete frame
    pd.testing.assert_frame_equal(checks, predictive_checks(fit, complete))
    pd.testing.assert_frame_equal(predictive_checks(fit, new.drop(columns="y"), y_all), checks)
    strict = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", seed=11)
    with pytest.raises(ValueError, match="missing values"):  # missing="raise" (default) still refuses them
        strict.predict(new)


def test_a_dict_of_columns_reads_like_a_frame():
    df = _frame(300, seed=10)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", seed=11)
    rows = df.iloc[:5]
    as_dict = {c: rows[c].to_list() for c in ("w", "x")}
    np.testing.assert_array_equal(fit.predict(as_dict), fit.predict(rows))
    np.testing.assert_array_equal(fit.gate_probs(as_dict), fit.gate_probs(rows))
    with pytest.raises(ValueError, match="equal-length columns"):
        fit.predict({"x": [0.1, 0.2], "w": [0.3]})

# ------------------------------------------------------------------------------------------------ plot
def _lines(ax, prefix):
    return {ln.get_gid(): ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith(prefix)}


def test_plot_draws_the_fitted_means_and_gates_of_a_formula_fit():
    df = _frame(300, seed=12)
    fit = ms.fit_mle(formula="y ~ x", data=df, k=2, gate_formula="~ w", seed=13)
    fig = fit.plot("w", at={"x": 0.25})
    top, bottom = fig.axes[0], fig.axes[1]
    means, gates = _lines(top, "expert_mean_"), _lines(bottom, "gate_")
    assert len(means) == 2 and len(gates) == 2
    grid = means["expert_mean_0"].get_xdata()
    assert grid[0] == pytest.approx(df["w"].min()) and grid[-1] == pytest.approx(df["w"].max())
    frame = pd.DataFrame({"x": 0.25, "w": grid})
    for i in range(2):
        np.testing.assert_allclose(means[f"expert_mean_{i}"].get_ydata(), fit.expert_means(frame)[:, i])
        np.testing.assert_allclose(gates[f"gate_{i}"].get_ydata(), fit.gate_probs(frame)[:, i])
    w, _ = _by_hand(fit, frame[["x", "w"]].to_numpy())  # and by hand from the coefficients
    np.testing.assert_allclose(gates["gate_1"].get_ydata(), w[:, 1], rtol=1e-10)
    # the points are the data, coloured by MAP expert
    pts = np.vstack([c.get_offsets() for c in top.collections])
    assert len(pts) == len(df)
    assert figstyle.smallest_font_px(fig) >= figstyle.MIN_FONT_PX
    plt.close(fig)


def test_plot_of_a_poisson_fit_shows_rates_and_takes_axes(counts):
    fig, axes = plt.subplots(2, 1)
    counts.plot("x", ax=axes)  # w at its mean
    means = _lines(axes[0], "expert_mean_")
    grid = means["expert_mean_0"].get_xdata()
    X = np.c_[grid, np.full_like(grid, _frame()["w"].mean())]
    _, rate = _by_hand(counts, X)
    for i in range(2):
        np.testing.assert_allclose(means[f"expert_mean_{i}"].get_ydata(), rate[:, i], rtol=1e-10)
    assert "rate" in axes[0].get_title()
    plt.close(fig)


def test_plot_of_an_array_fit_and_its_errors(gauss):
    fig = gauss.plot()
    gates = _lines(fig.axes[1], "gate_")
    grid = gates["gate_0"].get_xdata()
    np.testing.assert_allclose(gates["gate_0"].get_ydata(), gauss.gate_probs(grid[:, None])[:, 0])
    plt.close(fig)
    with pytest.raises(ValueError, match="not a covariate"):
        gauss.plot("income")
    df = _frame(200, seed=14)
    logfit = ms.fit_mle(formula="visits ~ np.exp(x)", data=df, k=2, family="poisson", seed=1)
    with pytest.raises(ValueError, match="pass data="):
        logfit.plot("x")
    fig = logfit.plot("x", data=df)
    grid = _lines(fig.axes[0], "expert_mean_")["expert_mean_1"].get_xdata()
    np.testing.assert_allclose(_lines(fig.axes[0], "expert_mean_")["expert_mean_1"].get_ydata(),
                               logfit.expert_means(pd.DataFrame({"x": grid}))[:, 1])
    plt.close(fig)


# --------------------------------------------------------------------------------------------- summary
def test_summary_has_one_block_per_gate_row_and_expert(counts):
    s = counts.summary()
    assert s.header["Dep. Variable"] == "visits" and s.header["Family"] == "poisson (log link)"
    titles = [t for t, _ in s.blocks]
    assert titles[0].startswith("Gate 0: log-odds of expert 0 against expert 1")
    assert titles[1].startswith("Expert 0:") and titles[2].startswith("Expert 1:")
    assert [list(b.index) for _, b in s.blocks] == [["gate[0]:const", "gate[0]:w"],
                                                    ["expert[0]:const", "expert[0]:x"],
                                                    ["expert[1]:const", "expert[1]:x"]]
    # the blocks hold the coefficient table's numbers, which are the fit's estimates and standard errors
    stacked = pd.concat([b for _, b in s.blocks])
    pd.testing.assert_frame_equal(stacked, s.coef)
    np.testing.assert_allclose(stacked["coef"], counts.theta)
    np.testing.assert_allclose(stacked["std err"], counts.bse())
    weight = counts.components()["mean_weight"]
    assert f"mean weight {weight[1]:.3f}" in titles[2]
    text, html, tex = s.as_text(), s.as_html(), s.as_latex()
    for t in titles:
        assert t in text and t in html
        assert t.replace("_", r"\_") in tex
    assert html.count("<h5>") == 4 and tex.count(r"\begin{tabular}") == 5  # header + 3 blocks + components
    assert "visits" in text
    assert list(s.components.columns) == ["mean_weight", "small"]  # Poisson experts: no sigma columns


# -------------------------------------------------------------------------------------------- progress
def test_bootstrap_progress_reports_its_stages(gauss, capsys):
    ms.bootstrap(gauss, n_resamples=3, seed=1, progress=True)
    err = capsys.readouterr().err
    assert "bootstrap" in err and "refit 3 resamples (one batched fit)" in err
    ms.bootstrap(gauss, n_resamples=3, seed=1, progress=False)
    ms.bootstrap(gauss, n_resamples=3, seed=1)  # None: a short, non-interactive run shows nothing
    assert capsys.readouterr().err == ""
    with pytest.raises(TypeError, match="progress"):
        ms.bootstrap(gauss, n_resamples=3, progress="yes")


def test_select_k_and_lrt_progress(gauss, capsys, monkeypatch):
    X, y = gauss._X[0].cpu().numpy(), gauss._y[0].cpu().numpy()
    ms.select_k(X, y, ks=(1, 2), restarts=1, seed=0, progress=True)
    err = capsys.readouterr().err
    assert "select_k" in err and "k=2" in err
    ms.select_k(X, y, ks=(1, 2), restarts=1, seed=0)
    assert capsys.readouterr().err == ""  # None: the fits so far predict a short run
    # None opens the bar as soon as the time so far, extrapolated over the stages, predicts a long run
    monkeypatch.setattr("moestat.inference.PROGRESS_AFTER_S", 0.0)
    ms.select_k(X, y, ks=(1, 2), restarts=1, seed=0)
    assert "select_k" in capsys.readouterr().err
    monkeypatch.undo()
    ms.test_n_experts(X[:150], y[:150], n_resamples=2, restarts=1, seed=0, progress=True)
    err = capsys.readouterr().err
    assert "test_n_experts" in err and "refit k=2 to 2 null resamples" in err


def test_read_only_inputs_give_no_torch_warning(gauss):
    """pandas 3 hands out read-only arrays (columns, df.to_numpy()); torch warns when it wraps one without a copy."""
    import warnings

    X = gauss._X[0].cpu().numpy().copy()
    X.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        mean = gauss.predict(X)
    np.testing.assert_allclose(mean, gauss.predict(X.copy()), rtol=0, atol=0)
