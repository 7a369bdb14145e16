# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # A Poisson mixture of experts for doctor visits (RAND Health Insurance Experiment)
#
# The RAND Health Insurance Experiment data shipped with statsmodels (`statsmodels.datasets.randhie`, the subset
# used by Cameron & Trivedi 2005, *Microeconometrics*; Deb & Trivedi 2002, *J. Health Economics* 21, 601-625, fitted
# latent-class count models to RAND HIE visits) record, for 20,190 person-years, the number of outpatient visits
# to a doctor (`mdvis`) with the insurance plan
# (`lncoins` = log(coinsurance + 1), `idp` individual deductible, `lpi` participation incentive, `fmde` maximum
# expenditure), health (`physlm` physical limitation, `disea` chronic-disease index, self-rated health `hlthg`,
# `hlthf`, `hlthp`; excellent is the omitted level).  31% of the counts are 0 and the variance is 7 times the
# mean.  A Poisson mixture of experts with log-linear experts and a gate on the health covariates,
#
# $$p(y\mid x, w) = \sum_{i=1}^k \pi_i(w)\,\frac{\mu_i(x)^y e^{-\mu_i(x)}}{y!},\qquad
# \log\mu_i(x) = b_i + a_i^\top x,\qquad \pi_i(w) = \mathrm{softmax}_i(c + G w),$$
#
# asks whether people fall into groups that use care differently (latent classes of users) and whether health
# predicts the group.  A Gaussian mixture of experts on the same counts degenerates: the Gaussian density is
# unbounded on the 6,308 tied zeros, so an expert collapses onto them (`DegenerateFitWarning`).
#
# The vignette chooses k with `select_k(..., family="poisson")` (BIC and ICL), reports the chosen fit (coefficients
# with observed-information and sandwich SEs, named from the frame), checks the k = 1 fit against statsmodels'
# Poisson GLM, shows the Gaussian fits' degeneracy, and checks how much of the over-dispersion and of the zeros
# each model reproduces (against statsmodels' negative binomial regression as a reference).

# %%
from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

NAME = "real-data-counts"
TITLE = "Poisson mixture of experts for RAND HIE doctor visits, and the Gaussian fit that degenerates"

FORMULA = "mdvis ~ lncoins + idp + lpi + fmde + physlm + disea + hlthg + hlthf + hlthp"
GATE_FORMULA = "~ disea + physlm"
#: full: all 20,190 rows, 40 starts per k; quick: a random subsample of 3,000 rows, 10 starts (under a minute on 2
#: cores); smoke: 1,500 rows, 3 starts, for the test suite.  ``k_compare``: the k at which the Gaussian and Poisson
#: fits are set side by side.  Many starts because the likelihood has many local maxima (``restarts_poisson.csv``).
SIZES: dict[str, dict[str, Any]] = {
    "smoke": {"n": 1500, "restarts": 3, "ks": [1, 2, 3], "k_compare": 3},
    "quick": {"n": 3000, "restarts": 10, "ks": [1, 2, 3], "k_compare": 3},
    "full": {"n": None, "restarts": 40, "ks": [1, 2, 3, 4], "k_compare": 4},
}
SEED = 2026
OUTPUTS = ("data_summary.csv", "select_k_poisson.csv", "select_k_gaussian.csv", "degeneracy_gaussian.csv",
           "compare.csv", "degeneracy_compare.csv", "restarts_poisson.csv", "gaussian_warning.txt", "coefficients.csv",
           "components.csv", "summary.txt", "glm_check.csv", "fit_checks.csv", "rates_and_gate.png", "results.csv",
           "provenance.json")


def load_data(n: int | None = None, seed: int = SEED):
    """The RAND HIE frame (bundled with statsmodels, no download); ``n`` rows drawn without replacement if given."""
    import statsmodels.api as sm

    data = sm.datasets.randhie.load_pandas().data
    if n is not None and n < len(data):
        data = data.sample(n=n, random_state=seed).reset_index(drop=True)
    return data


def _size(quick: bool, size: str | None) -> tuple[str, dict[str, Any]]:
    name = size or ("quick" if quick else "full")
    if name not in SIZES:
        raise ValueError(f"size={name!r} is not a size of {NAME}; valid sizes are {sorted(SIZES)}.")
    return name, SIZES[name]


# %% [markdown]
# ## Fits
#
# `select_k` fits k = 1, 2, ... by EM (IRLS expert steps) with random restarts and reports BIC and ICL; fits at
# a spurious maximum (a vanishing component, a variance at the floor or collapsed onto tied responses) are marked
# and skipped.  The Poisson fit is chosen by ICL (BIC keeps falling with k: see the page); experts are labelled by
# their mean fitted rate, expert 0 the lowest.

# %%
def _select(family: str, data, cfg: dict, seed) -> Any:
    import moestat as ms

    return ms.select_k(formula=FORMULA, data=data, gate_formula=GATE_FORMULA, ks=cfg["ks"], family=family,
                       criterion="icl", restarts=cfg["restarts"], seed=seed, missing="drop")


def _recorded(fn, *args, **kwargs) -> tuple[Any, list[str]]:
    """Call ``fn`` and return its result with the texts of the moestat warnings it raised."""
    from moestat.exceptions import MoestatWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MoestatWarning)
        result = fn(*args, **kwargs)
    return result, [f"{w.category.__name__}: {w.message}" for w in caught if issubclass(w.category, MoestatWarning)]


def _order_by_rate(fit, data):
    """Relabel the experts by mean fitted rate over the data (expert 0 = the lowest)."""
    import numpy as np

    return fit.relabel(np.argsort(np.asarray(fit.expert_means(data)).mean(0)))


def _formula_refit(fit, data):
    """The same fit through the formula interface (warm start at ``fit``, no random restarts): ``select_k``'s fits
    are array fits, this one keeps the response name and the frame's design for the summary and the plot."""
    import moestat as ms

    return ms.fit_mle(formula=FORMULA, data=data, k=fit.spec.k, gate_formula=GATE_FORMULA, family=fit.spec.response,
                      init=fit.params, restarts=0, missing="drop")


def _table(sel) -> Any:
    cols = ["k", "loglik", "df", "aic", "bic", "icl", "converged", "n_small", "n_at_floor", "degenerate", "best"]
    return sel.table[cols]


def _restart_logliks(sel) -> Any:
    """Every random start's final log-likelihood for each k (:func:`moestat.fit.checks.restart_logliks`)."""
    import pandas as pd

    from moestat.fit.checks import restart_logliks

    frames = [restart_logliks(f).assign(k=k) for k, f in sel.fits.items()]
    return pd.concat(frames, ignore_index=True)[["k", "start", "loglik", "gap_to_best"]]


def _degeneracy_over_k(sel) -> Any:
    import pandas as pd

    frames = [f.degeneracy().assign(k=k) for k, f in sel.fits.items()]
    out = pd.concat(frames, ignore_index=True)
    return out[["k", "expert", "kind", "detail", "advice"]]


# %% [markdown]
# ## Checks of the fitted model
#
# `moestat.fit.checks.predictive_checks(fit)` sets the fitted mixture against the data: for a Poisson
# mixture $\mathbb E[y\mid x] = \sum_i \pi_i\mu_i$,
# $\mathrm{Var}[y\mid x] = \sum_i \pi_i(\mu_i + \mu_i^2) - \mathbb E[y\mid x]^2$
# and $P(y = 0\mid x) = \sum_i \pi_i e^{-\mu_i}$, and the Pearson dispersion
# $\sum_t (y_t - \mathbb E[y_t\mid x_t])^2 / \mathrm{Var}[y_t\mid x_t] \,/\, (n - \mathrm{df})$ is about 1 when
# the model's variance matches the data's.  `count_model_checks` writes the same row for statsmodels' negative
# binomial (NB2) regression, $\mathrm{Var} = \mu + \alpha\mu^2$ and $P(0) = (1 + \alpha\mu)^{-1/\alpha}$;
# `compare_glm` sets the k = 1 fit against statsmodels' Poisson GLM.

# %%
CHECK_COLUMNS = ["model", "df", "loglik", "bic", "pearson_dispersion", "predicted_zero_share", "observed_zero_share"]


def _fit_checks(data, fits: dict[str, Any]) -> Any:
    import pandas as pd
    import statsmodels.formula.api as smf

    from moestat.fit.checks import count_model_checks, predictive_checks

    nb = smf.negativebinomial(FORMULA, data).fit(disp=0, maxiter=200)
    frames = [predictive_checks(fit).assign(model=label) for label, fit in fits.items()]
    frames.append(count_model_checks(nb).assign(model="NB2 regression (statsmodels, not a mixture)"))
    out = pd.concat(frames, ignore_index=True).rename(columns={"fitted_zero_share": "predicted_zero_share"})
    return out[CHECK_COLUMNS]


def _glm_check(fit1, data) -> Any:
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    from moestat.fit.checks import compare_glm

    return compare_glm(fit1, smf.glm(FORMULA, data, family=sm.families.Poisson()).fit())


def _coefficients(fit) -> Any:
    import numpy as np

    tf = fit.to_frame("oim")
    coef = tf[["term", "block", "atom", "coef", "estimate", "std_error", "statistic", "p_value", "conf_low",
               "conf_high"]].copy()
    coef["se_sandwich"] = fit.bse("sandwich")  # White (1982); per-observation scores in row chunks
    coef["rate_ratio"] = np.where(coef["block"] == "expert", np.exp(coef["estimate"]), np.nan)
    return coef


def _components(fit, data) -> Any:
    import numpy as np
    import pandas as pd

    post = fit.posterior_frame()
    y = data.loc[post.index, "mdvis"].to_numpy()
    mu = np.asarray(fit.expert_means(data))
    comp = fit.components()[["expert", "mean_weight"]].copy()
    comp["mean_rate"] = mu.mean(0)
    comp["map_share"] = [float(np.mean(post["component"] == i)) for i in comp["expert"]]
    comp["map_mean_visits"] = [float(y[post["component"] == i].mean()) if (post["component"] == i).any()
                               else np.nan for i in comp["expert"]]
    comp["map_zero_share"] = [float(np.mean(y[post["component"] == i] == 0)) if (post["component"] == i).any()
                              else np.nan for i in comp["expert"]]
    return pd.DataFrame(comp)


# %% [markdown]
# ## Figure
#
# `fit.plot("disea", data=..., at={"physlm": 0})` draws the fitted expert rates $\mu_i$ over the chronic-disease
# index (the other covariates at their sample means, physlm at 0) with the data coloured by MAP expert, and the gate
# probabilities $\pi_i$ below.  For counts the vignette then puts the top panel on the $\log(1 + y)$ scale, jitters
# the points vertically (ties at each count hide each other) and adds the gate for people with a physical
# limitation (physlm = 1, dashed).

# %%
def _gate_profile(fit, data, x: str, **fixed: float) -> tuple[Any, Any]:
    """Gate probabilities along ``x`` (min to max) with the other covariates at their means, ``fixed`` overriding."""
    import numpy as np
    import pandas as pd

    grid = np.linspace(data[x].min(), data[x].max(), 200)
    frame = pd.DataFrame({c: np.full(len(grid), data[c].mean()) for c in data.columns if c != "mdvis"})
    frame[x] = grid
    for c, v in fixed.items():
        frame[c] = v
    return grid, np.asarray(fit.gate_probs(frame))


def _jitter_points(ax, rng, width: float = 0.3) -> None:
    """Jitter the scatter points of ``ax`` vertically by up to ``width`` and make them small and light."""
    import numpy as np

    for coll in ax.collections:
        off = np.asarray(coll.get_offsets(), dtype=float).copy()
        off[:, 1] += rng.uniform(-width, width, len(off))
        coll.set_offsets(off)
        coll.set_sizes([3.0])
        coll.set_alpha(0.3)
        coll.set_rasterized(True)


def plot_rates_and_gate(fit, data, path: Path, *, title: str, x: str = "disea") -> None:
    """``fit.plot`` along ``x`` on the log(1 + y) scale, points jittered, the gate also for physlm = 1."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    from moestat import figstyle

    with figstyle.style():
        fig, axes, _ = figstyle.subplots(2, 1, sharex=True, height_ratios=[2.6, 1.2],
                                         figsize=(figstyle.PAGE_WIDTH_IN, 7.6))
        top, bottom = axes[0, 0], axes[1, 0]
        top.set_yscale("function", functions=(np.log1p, np.expm1))  # log(1 + y): zeros visible, counts spread
        fit.plot(x, ax=(top, bottom), data=data, at={"physlm": 0.0})
        _jitter_points(top, np.random.default_rng(SEED))
        ticks = [0, 1, 2, 5, 10, 20, 50]
        top.set_yticks(ticks, [str(t) for t in ticks])
        top.set_ylim(-0.4, max(60.0, float(data["mdvis"].max()) + 5))
        top.set_title(title, fontsize=figstyle.fontsize(fig, "title"))
        grid, pi = _gate_profile(fit, data, x, physlm=1.0)
        for i in range(fit.spec.k):
            bottom.plot(grid, pi[:, i], color=f"C{i}", ls="--", lw=1.6)
        bottom.set_xlabel("chronic-disease index (disea)", fontsize=figstyle.fontsize(fig, "label"))
        bottom.set_title(r"gate weights $\tilde\pi_i(x)$: solid physlm = 0, dashed physlm = 1",
                         fontsize=figstyle.fontsize(fig, "title"))
        figstyle.caption(fig, f"n = {len(data):,}; y axis on the log(1 + y) scale; points coloured by their maximum a "
                              "posteriori (MAP) expert and jittered vertically by up to 0.3; lines at the values in "
                              "the legend's title (sample means; physlm = 0).")
        figstyle.save(fig, path)


# %% [markdown]
# ## Run

# %%
def _gaussian_compare(data, cfg: dict, seed, poisson_fit) -> tuple[Any, list[str], Any]:
    """The Gaussian fit at ``k_compare`` (its warnings recorded) beside the Poisson fit with the same k."""
    import numpy as np
    import pandas as pd

    import moestat as ms

    k = cfg["k_compare"]
    gfit, messages = _recorded(ms.fit_mle, formula=FORMULA, data=data, k=k, gate_formula=GATE_FORMULA,
                               family="gaussian", restarts=cfg["restarts"], seed=seed, missing="drop")
    rows = []
    for family, fit in (("gaussian", gfit), ("poisson", poisson_fit)):
        found = fit.degeneracy()
        sd = fit.components()["sigma"].to_numpy()
        rows.append({"family": family, "k": k, "loglik": float(fit.loglik), "df": int(fit.df_model),
                     "bic": float(fit.bic), "converged": bool(fit.converged), "n_findings": len(found),
                     "kinds": ", ".join(sorted(set(found["kind"]))),
                     "min_sigma": float(np.nanmin(sd)) if np.isfinite(sd).any() else np.nan,
                     "min_mean_weight": float(fit.components()["mean_weight"].min())})
    return gfit, messages, pd.DataFrame(rows)


def _finished(out: Path, cfg: dict) -> bool:
    """True when every output exists and provenance.json records the same configuration."""
    if not all((out / f).is_file() for f in OUTPUTS):
        return False
    stored = json.loads((out / "provenance.json").read_text())["config"]
    return all(stored.get(key) == value for key, value in cfg.items())


def _write_results(out: Path, tables: dict[str, Any], cfg: dict) -> None:
    import pandas as pd

    rows = [{"quantity": "n", "value": cfg["n_rows"]}, {"quantity": "best_k_icl", "value": cfg["best_k_icl"]},
            {"quantity": "best_k_bic", "value": cfg["best_k_bic"]}]
    for r in tables["coefficients"].itertuples():
        rows.append({"quantity": f"coef:{r.term}", "value": r.estimate, "se_oim": r.std_error,
                     "se_sandwich": r.se_sandwich})
    for family in ("poisson", "gaussian"):
        for r in tables[f"select_k_{family}"].itertuples():
            rows += [{"quantity": f"{family}:{c}_k{int(r.k)}", "value": getattr(r, c)}
                     for c in ("loglik", "bic", "icl")]
    for r in tables["fit_checks"].itertuples():
        rows.append({"quantity": f"dispersion:{r.model}", "value": r.pearson_dispersion})
    res = pd.DataFrame(rows)
    res["size"], res["restarts"], res["seed"] = cfg["size"], cfg["restarts"], cfg["seed"]
    res.to_csv(out / "results.csv", index=False)


def run(out, quick: bool = False, resume: bool = True, size: str | None = None) -> None:
    """Fit, check and plot at ``size`` ("quick" or "full"; ``quick=True`` is "quick"); writes :data:`OUTPUTS`."""
    import numpy as np
    import pandas as pd

    from moestat.provenance import stale_outputs_note, write_provenance

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name, sz = _size(quick, size)
    cfg: dict[str, Any] = {"size": name, **sz, "seed": SEED, "formula": FORMULA, "gate_formula": GATE_FORMULA,
                           "method": "em", "criterion": "icl"}
    if resume and _finished(out, cfg):
        print(f"{NAME}: outputs in {out} are complete for size {name!r}; nothing recomputed (--no-resume redoes them)")
        note = stale_outputs_note(out)
        if note:
            print(f"{NAME}: {note}")
        return
    timing: dict[str, float] = {}
    t_all = t0 = time.perf_counter()
    data = load_data(sz["n"])
    y = data["mdvis"]
    summary = pd.DataFrame([{"n": len(data), "mean": y.mean(), "variance": y.var(), "variance_over_mean":
                             y.var() / y.mean(), "zero_share": float((y == 0).mean()), "max": int(y.max())}])
    s_pois, s_gauss, s_cmp = np.random.SeedSequence(SEED).spawn(3)

    sel_p, warn_p = _recorded(_select, "poisson", data, sz, s_pois)
    timing["select_k_poisson_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sel_g, warn_g = _recorded(_select, "gaussian", data, sz, s_gauss)
    timing["select_k_gaussian_s"] = time.perf_counter() - t0
    table_p, table_g = _table(sel_p), _table(sel_g)
    cfg["best_k_icl"] = int(sel_p.best_k)
    cfg["best_k_bic"] = int(table_p.loc[table_p["bic"].idxmin(), "k"])
    cfg["n_rows"] = len(data)

    t0 = time.perf_counter()
    fit = _order_by_rate(_formula_refit(sel_p.fits[cfg["best_k_icl"]], data), data)
    cfg["n_dropped"] = int(fit.settings["n_dropped"])  # missing="drop": rows with a NaN in a variable used
    gfit, warn_cmp, compare = _gaussian_compare(data, sz, s_cmp, sel_p.fits[sz["k_compare"]])
    timing["gaussian_compare_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tables = {"select_k_poisson": table_p, "select_k_gaussian": table_g, "coefficients": _coefficients(fit),
              "components": _components(fit, data), "glm_check": _glm_check(sel_p.fits[1], data),
              "degeneracy_gaussian": _degeneracy_over_k(sel_g), "compare": compare,
              "degeneracy_compare": gfit.degeneracy(),
              "restarts_poisson": _restart_logliks(sel_p),
              "fit_checks": _fit_checks(data, {"Poisson GLM (moestat k = 1)": sel_p.fits[1],
                                               f"Poisson MoE k = {cfg['best_k_icl']} (ICL)": fit,
                                               f"Poisson MoE k = {max(sz['ks'])}": sel_p.fits[max(sz["ks"])]})}
    timing["inference_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    plot_rates_and_gate(fit, data, out / "rates_and_gate.png",
                        title=f"RAND HIE ({len(data):,} rows): Poisson MoE, k = {fit.spec.k}")
    timing["figure_s"] = time.perf_counter() - t0

    summary.to_csv(out / "data_summary.csv", index=False)
    for key, frame in tables.items():
        frame.to_csv(out / f"{key}.csv", index=False)
    (out / "summary.txt").write_text(fit.summary().as_text())
    (out / "gaussian_warning.txt").write_text("\n".join(
        [f"# fit_mle(family='gaussian', k={sz['k_compare']}):"] + warn_cmp
        + ["", "# select_k(family='gaussian'):"] + warn_g + ["", "# select_k(family='poisson'):"]
        + (warn_p or ["(no moestat warning)"])) + "\n")
    timing["total_s"] = time.perf_counter() - t_all
    cfg["timing"] = {k: round(v, 1) for k, v in timing.items()}
    _write_results(out, tables, cfg)
    write_provenance(out, cfg)


# %%
if __name__ == "__main__":
    import sys

    from moestat._vignette import vignette_cli

    sys.exit(vignette_cli(run, NAME))
