# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # A mixture of experts for Engel's food-expenditure data
#
# Engel's (1857) data on 235 Belgian working-class households (shipped with statsmodels as
# `statsmodels.datasets.engel`) relate annual food expenditure to income.  On the log-log scale the
# slope is the income elasticity of food demand.  A softmax-gated mixture of linear-Gaussian experts
# asks whether households fall into regimes with different elasticities and noise levels, and where
# along the income axis each regime dominates:
#
# $$p(y\mid x) = \sum_{i=1}^k \pi_i(x)\,\mathcal N(y;\ b_i + a_i x,\ \sigma_i^2),\qquad
# x = \log(\text{income}),\ y = \log(\text{food expenditure}).$$
#
# Mixture likelihoods are unbounded: an expert can fit d + 1 = 2 households exactly and let
# $\sigma_i \to 0$.  With moestat's permissive default floor ($\sigma_i \ge 10^{-3}\,\mathrm{sd}(y)$)
# exactly that happens here at k = 3 (an expert with weight 0.009 and $\sigma$ at the floor; BIC then
# prefers the spurious k = 3 fit).  The vignette therefore sets `sd_floor=0.05`
# ($\sigma_i \ge 0.05\,\mathrm{sd}(y) \approx 0.02$ on the log scale, well below the fitted noise
# levels of 0.07-0.13) and reports which fits touch the floor.
#
# The vignette fits k = 1..4 by maximum likelihood (EM, random restarts), reports BIC and ICL over k,
# tests k = 1 vs 2 and 2 vs 3 with the parametric-bootstrap likelihood-ratio test, and reports the
# 2-expert fit with standard errors (observed information, sandwich, bootstrap) and a plot of its
# experts and gate.

# %%
from __future__ import annotations

import json
from pathlib import Path

NAME = "real-data-moe"
TITLE = "Mixture of experts for Engel's food-expenditure data: SEs, BIC over k, bootstrap LRT"


def _load():
    import numpy as np
    import statsmodels.api as sm

    d = sm.datasets.engel.load_pandas().data
    x = np.log(d["income"].to_numpy())
    return (x - x.mean())[:, None], np.log(d["foodexp"].to_numpy()), float(x.mean())


# %%
def run(out, quick: bool = False, resume: bool = True) -> None:
    """Fit, test and plot; writes CSVs, figures and provenance.json into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    import moestat as ms
    from moestat.provenance import write_provenance

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    X, y, x_centre = _load()
    cfg = {"restarts": 10, "ks": [1, 2, 3, 4], "B_boot": 30 if quick else 200, "B_lrt": 19 if quick else 99,
           "seed": 2026, "method": "em", "tol": 1e-8, "sd_floor": 0.05, "x": "log(income) - mean",
           "y": "log(foodexp)", "quick": quick, "n": len(y)}
    fit_opts = {"sd_floor": cfg["sd_floor"]}
    ss = np.random.SeedSequence(cfg["seed"])
    s_sel, s_fit, s_boot, s_lrt1, s_lrt2 = ss.spawn(5)

    # --- BIC / ICL over k
    path = out / "bic_over_k.csv"
    if resume and path.exists():
        table = pd.read_csv(path)
    else:
        table = ms.select_k(X, y, ks=cfg["ks"], restarts=cfg["restarts"], seed=s_sel, **fit_opts).table
        table.to_csv(path, index=False)
    best_bic = int(table.loc[table["bic"].idxmin(), "k"])

    # --- the 2-expert fit (the LRT rejects k = 1; see the discussion below): OIM, sandwich, bootstrap SEs
    k_main = 2
    spec = ms.MoE(gate="softmax", expert="linear", k=k_main, d=1)
    fit = ms.fit_mle(spec, X, y, restarts=cfg["restarts"], seed=s_fit, feature_names=["log_income"], **fit_opts)
    # label the experts by slope (expert 0 = the lowest elasticity) so reruns read the same
    order = np.argsort(fit.params.expert_weight[:, 0])
    fit = fit.relabel(order)
    path = out / "coefficients.csv"
    if not (resume and path.exists()):
        coef = fit.to_frame("oim")[["term", "estimate", "std_error", "statistic", "p_value", "conf_low", "conf_high"]]
        coef["se_sandwich"] = fit.bse("sandwich")
        bs = ms.bootstrap(fit, X, y, n_resamples=cfg["B_boot"], seed=s_boot)
        coef["se_bootstrap"] = bs.se()
        coef["boot_failed"] = bs.n_failed
        coef.to_csv(path, index=False)
        (out / "summary.txt").write_text(str(fit.summary()))
        fit.components().to_csv(out / "components.csv", index=False)
    coef = pd.read_csv(path)

    # --- bootstrap LRTs for k
    path = out / "lrt.csv"
    if resume and path.exists():
        lrt = pd.read_csv(path)
    else:
        r1 = ms.test_n_experts(X, y, k0=1, k1=2, n_resamples=cfg["B_lrt"], restarts=cfg["restarts"], seed=s_lrt1,
                               **fit_opts)
        r2 = ms.test_n_experts(X, y, k0=2, k1=3, n_resamples=cfg["B_lrt"], restarts=cfg["restarts"], seed=s_lrt2,
                               **fit_opts)
        lrt = pd.concat([r1.to_frame(), r2.to_frame()], ignore_index=True)
        lrt.to_csv(path, index=False)

    # --- figure: data coloured by MAP expert, fitted expert lines; gate weights along income
    grid = np.linspace(X.min(), X.max(), 200)[:, None]
    post = fit.posterior(X, y)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    income = np.exp(X[:, 0] + x_centre)
    gx = np.exp(grid[:, 0] + x_centre)
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for i in range(k_main):
        sel = post.argmax(1) == i
        ax1.scatter(income[sel], np.exp(y[sel]), s=12, alpha=0.6, color=colours[i], label=f"MAP expert {i}")
        ax1.plot(gx, np.exp(fit.expert_means(grid)[:, i]), color=colours[i], lw=2)
        ax2.plot(gx, fit.gate_probs(grid)[:, i], color=colours[i], lw=2, label=f"gate weight, expert {i}")
    ax1.plot(gx, np.exp(fit.predict(grid)), color="k", lw=1, ls="--", label="E[log y | x], back-transformed")
    ax1.set(xscale="log", yscale="log", ylabel="food expenditure",
            title=f"Engel data: {k_main}-expert softmax MoE")
    ax1.legend(fontsize=8)
    ax2.set(xscale="log", xlabel="household income", ylabel="gate weight", ylim=(0, 1))
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "experts_and_gate.png", dpi=120)
    plt.close(fig)

    # --- tidy results: one row per quantity
    rows = [{"quantity": "coef", "term": r.term, "estimate": r.estimate, "se_oim": r.std_error,
             "se_sandwich": r.se_sandwich, "se_bootstrap": r.se_bootstrap} for r in coef.itertuples()]
    rows += [{"quantity": f"{c}_k{int(r.k)}", "estimate": getattr(r, c)} for r in table.itertuples()
             for c in ("loglik", "bic", "icl")]
    rows += [{"quantity": f"lrt_{int(r.k0)}_vs_{int(r.k1)}", "estimate": r.statistic, "p_value": r.p_value}
             for r in lrt.itertuples()]
    rows.append({"quantity": "best_k_bic", "estimate": best_bic})
    rows.append({"quantity": "best_k_icl", "estimate": int(table.loc[table["icl"].idxmin(), "k"])})
    res = pd.DataFrame(rows)
    for key in ("restarts", "seed", "method", "B_boot", "B_lrt", "quick"):
        res[key] = cfg[key]
    res.to_csv(out / "results.csv", index=False)
    write_provenance(out, cfg)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


# %%
if __name__ == "__main__":
    import sys

    from moestat._vignette import vignette_cli

    sys.exit(vignette_cli(run, NAME))
