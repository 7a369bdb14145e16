# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Contaminated MoE with a frozen expert: prompt vanishing and prompt merging
#
# A pre-trained model $f_0$ is kept frozen and one trainable Gaussian *prompt* expert is mixed in:
#
# $$p(y\mid x) = (1 - w(x))\,f_0(y\mid x) + w(x)\,\mathcal N(y;\ a x + b,\ \nu),$$
#
# with a constant weight $w = \lambda$ (Yan, Nguyen, Le, Akbarian & Ho, AISTATS 2025, arXiv:2410.12258) or a softmax
# gate $w(x) = \sigma(\beta x + \tau)$ (Yan, Nguyen, Le, Akbarian, Ho & Rinaldo, NeurIPS 2025, arXiv:2505.18455).
# The gate and the prompt $\theta = (a, b, \nu)$ are estimated by maximum likelihood
# (`moestat.contaminated.fit_contaminated`). Both papers show that the rates depend on whether $\lambda^*$ vanishes
# with $n$ (*prompt vanishing*) and on whether the prompt's family contains $f_0$ (*distinguishability*); when it does
# and the prompt approaches $f_0$ (*prompt merging*), the rates slow down with the distance
# $\lVert\Delta^*\rVert = \lVert\theta^* - \theta_0\rVert$. The exponents of
# `moestat.papers.yan2025_contaminated.THEORY` were derived for this package from the local expansion of the density
# (the papers' theorem statements could not be read here) and are checked against the expected information in the
# tests; this vignette measures them.
#
# ## Pre-specified design (fixed before any run)
#
# * **Truths** (`yan2025_contaminated.SETTINGS`, inputs $x \sim U[-2, 2]$; moestat's choices, the papers' simulation
#   values could not be read):
#   `dist_fixed` — frozen two-expert tanh MoE, prompt $0.5x + \mathcal N(0, 0.09)$, $\lambda^* = 0.3$;
#   `dist_vanishing` — the same with $\lambda^*_n = 0.3\,(n/1000)^{-1/4}$;
#   `nondist_merging` — frozen $\mathcal N(x, 0.25)$, prompt slope $1 + 0.4\,(n/1000)^{-1/6}$ (intercept and
#   variance equal to the frozen ones), $\lambda^* = 0.5$;
#   `softmax_dist` — frozen tanh MoE, gate $\sigma(2x)$, the prompt of `dist_fixed`;
#   `softmax_nondist_merging` — frozen $\mathcal N(x, 0.25)$, gate $\sigma(2x)$, prompt slope
#   $1 + 0.8\,(n/1000)^{-1/4}$.
# * **Fit** — `fit_contaminated`, 10 EM steps then damped Newton with the closed-form Hessian (tolerance $10^{-12}$ on
#   the mean log-likelihood); starts `near_truth` (jitter 0.05), `ols` and one `random`; the highest likelihood wins.
# * **n and replicates** — `quick`: seven n from 1000 to 31623 (1.5 decades), 20 replicates; `full`: nine n from
#   1000 to 100000, 40 replicates. Seed 2025.
# * **Responses** — `lam_err` $|\hat\lambda - \lambda^*_n|$ or `gate_err` $\lVert\hat\beta - \beta^*\rVert +
#   |\hat\tau - \tau^*|$, `prompt_err` $\lVert\hat\theta - \theta^*_n\rVert$, and the loss that is $n^{-1/2}$
#   uniformly (`loss_dist` or `loss_nondist`, `moestat.contaminated.losses`).
# * **Two predictions per response** — the theory's small-distance limit (`predicted_exponent`: e.g.
#   $1/2 - 2\kappa$ for $\hat\lambda$ under merging at rate $\kappa$) and the expected information of *this* design
#   (`design_exponents`: $\sqrt{[I^{-1}]/n}$ at each truth $G^*_n$, its log-log slope), which includes the finite
#   distances $\lVert\Delta^*_n\rVert$ and $\lambda^*_n$ of the grid.
# * **Analysis** — `ms.fit_rate` (model `power`, random effects over the per-n mean log error) by setting and
#   response; `ms.window_sensitivity` (one-decade windows); the root-mean-square error at each n against the
#   information's prediction (`calibration.csv`); fit diagnostics (`fits.csv`).
# * **Decision rule** — against the design's prediction $e_d$ and the theory's limit $e_t$ separately: *agrees* when
#   the 95% interval covers it, *faster* / *slower* when the interval lies above / below it; *undecided* when the
#   verdict is `range too narrow`. A response is *slower than parametric* when its interval lies below 1/2.
#
# Run: `moestat vignette run contaminated-moe --quick --out out/contaminated-moe --workers 1` (quick, one core) or
# without `--quick` (full).

# %%
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import moestat as ms
from moestat import figstyle as fs
from moestat._vignette import run_study_timed
from moestat.papers import yan2025_contaminated as paper
from moestat.provenance import write_provenance
from moestat.study import successful_rows

NAME = "contaminated-moe"
TITLE = "Contaminated MoE with a frozen expert: prompt vanishing and prompt merging"

SEED = 2025
SETTINGS = list(paper.SETTINGS)
CELL = "moestat.papers.yan2025_contaminated:contaminated_cell"
FIT_OPTIONS: dict[str, Any] = {"method": "newton", "init": ["near_truth", "ols", "random"], "restarts": 1}
RATE: dict[str, Any] = {"model": "power", "confidence_level": 0.95}

SIZES: dict[str, dict[str, Any]] = {
    # two decades, 40 replicates (not run for the rendered page)
    "full": {"n": [1000, 1778, 3162, 5623, 10000, 17783, 31623, 56234, 100000], "reps": 40},
    # 1.5 decades, 20 replicates: a few minutes on one core
    "quick": {"n": [1000, 1778, 3162, 5623, 10000, 17783, 31623], "reps": 20},
    # the smoke test: seconds
    "tiny": {"n": [300, 600, 1200], "reps": 3},
}

ADEMP = {
    "aims": "Measure the MLE rates of a contaminated MoE with a frozen expert (Yan et al., AISTATS 2025 and NeurIPS "
            "2025) under a vanishing mixing weight and a prompt merging into the frozen expert.",
    "data_generating_mechanisms": "Five truths indexed by n (yan2025_contaminated.SETTINGS): a frozen tanh MoE or a "
                                  "frozen linear Gaussian expert, a linear Gaussian prompt, a constant weight or a "
                                  "softmax gate; x ~ U[-2, 2].",
    "estimands": ["|lambda_hat - lambda*_n| or ||beta_hat - beta*|| + |tau_hat - tau*||",
                  "||theta_hat - theta*_n||, theta = (a, b, nu)", "the papers' losses (n^-1/2 uniformly)"],
    "methods": ["fit_contaminated: EM then damped Newton, starts near_truth, ols, random"],
    "performance_measures": ["rate exponents with 95% intervals and verdicts",
                             "RMSE against the expected information's prediction"],
}


def _setting_kw(setting: str) -> dict[str, Any]:
    """Gate, distinguishability and the rates gamma, kappa of a setting (for :func:`paper.predicted_exponent`)."""
    cfg = paper.SETTINGS[setting]
    return {"gate": cfg["gate"], "distinguishable": cfg["frozen"] == "moe", "gamma": float(cfg.get("lam_rate", 0.0)),
            "kappa": float(cfg.get("approach_rate", 0.0))}


def responses(setting: str) -> list[str]:
    """The rate responses of ``setting``: the gate's error, the prompt's, and the uniform loss."""
    kw = _setting_kw(setting)
    gate = "lam_err" if kw["gate"] == "constant" else "gate_err"
    return [gate, "prompt_err", "loss_dist" if kw["distinguishable"] else "loss_nondist"]


def make_study(size: str = "full", **override: Any) -> ms.Study:
    """The study at a size of ``SIZES``; ``override`` replaces ``n`` or ``reps``."""
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not a size of this vignette; valid sizes are {sorted(SIZES)}.")
    cfg = {**SIZES[size], **override}
    return ms.Study(name=f"{NAME}-{size}", truth=[{"label": s, "data": {"setting": s}} for s in SETTINGS],
                    fit={"label": "mle", "options": dict(FIT_OPTIONS)}, n=list(cfg["n"]), reps=int(cfg["reps"]),
                    seed=SEED, cell=CELL, threads=1, ademp=ADEMP,
                    description="MLE rates of contaminated MoE with a frozen expert")


def make_studies(size: str = "full", **override: Any) -> dict[str, ms.Study]:
    """The vignette's studies by output folder: one, ``{"study": make_study(size)}``."""
    return {"study": make_study(size, **override)}


# %% [markdown]
# ## Rates, predictions and checks
#
# `rates.csv`: one row per setting and response with the `power` exponent, its interval and verdict, the theory's
# limit, the design's information prediction and the decisions. `design.csv`: `design_exponents` on the run's grid.
# `windows.csv`: `ms.window_sensitivity`. `calibration.csv`: root-mean-square error against the information's
# asymptotic size at each n. `fits.csv`: convergence, boundary fits, the likelihood gap to the truth and how often
# the starts ended at different stationary points.


# %%
RATE_COLS = ["exponent", "se", "ci_low", "ci_high", "verdict", "curvature_p", "window_consistent", "window_drift",
             "tau2", "n_values", "replicates"]


def decide(estimate_low: float, estimate_high: float, target: float, verdict: str) -> str:
    """The pre-specified decision for one exponent interval against one predicted exponent."""
    if not np.isfinite(target):
        return ""
    if verdict == "range too narrow":
        return "undecided (range too narrow)"
    if estimate_low > target:
        return "faster"
    if estimate_high < target:
        return "slower"
    return "agrees"


def design_table(ns: list[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``paper.design_sizes`` of every setting on the grid ``ns`` and their exponents (``paper.size_exponents``)."""
    sizes = pd.concat([paper.design_sizes(s, ns) for s in SETTINGS], ignore_index=True)
    return sizes, paper.size_exponents(sizes)


def rate_table(frame: pd.DataFrame, design: pd.DataFrame) -> pd.DataFrame:
    """``fit_rate`` of every setting's responses, with the theory's limit, the design's prediction and decisions."""
    rows = []
    for setting in SETTINGS:
        sub = frame[frame["truth"] == setting]
        for y in responses(setting):
            res = ms.fit_rate(sub, y, warn=False, **RATE).to_frame(details=True).iloc[0]
            theory = paper.predicted_exponent(y, **_setting_kw(setting))
            hit = design[(design["setting"] == setting) & (design["response"] == y)]
            pred = float(hit["exponent"].iloc[0]) if len(hit) else np.nan
            row = {"setting": setting, "response": y, **{c: res[c] for c in RATE_COLS if c in res.index},
                   "theory_exponent": theory, "design_exponent": pred}
            row["vs_design"] = decide(row["ci_low"], row["ci_high"], pred, row["verdict"])
            row["vs_theory"] = decide(row["ci_low"], row["ci_high"], theory, row["verdict"])
            row["slower_than_parametric"] = bool(row["ci_high"] < 0.5)
            rows.append(row)
    return pd.DataFrame(rows)


def window_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``ms.window_sensitivity`` of the ``power`` exponent (one-decade windows), per setting and response."""
    parts = []
    for setting in SETTINGS:
        sub = frame[frame["truth"] == setting]
        for y in responses(setting):
            ws = ms.window_sensitivity(sub, y, model="power", min_span=1.0)
            parts.append(ws.table.assign(setting=setting, response=y))
    return pd.concat(parts, ignore_index=True)


def calibration_table(frame: pd.DataFrame, sizes: pd.DataFrame) -> pd.DataFrame:
    """Root-mean-square error per setting, response and n against the expected information's asymptotic size
    (``paper.predicted_sizes``: the square root of the summed variances of the response's block)."""
    rows = []
    for setting in SETTINGS:
        for y in responses(setting):
            for _, s in sizes[(sizes["setting"] == setting) & (sizes["response"] == y)].iterrows():
                sub = frame[(frame["truth"] == setting) & (frame["n"] == s["n"])]
                rmse = float(np.sqrt(np.mean(sub[y].to_numpy() ** 2)))
                rows.append({"setting": setting, "response": y, "n": int(s["n"]), "rmse": rmse,
                             "predicted": float(s["size"]), "ratio": rmse / float(s["size"]), "replicates": len(sub)})
    return pd.DataFrame(rows)


SPREAD = 1e-6
"""Final log-likelihoods of two starts further apart than this are different stationary points."""


def fits_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per setting: share converged and on the boundary, the likelihood gap to the truth (smallest, median), and the
    share of replicates whose starts ended at different stationary points (``start_spread`` above ``SPREAD``)."""
    out = frame.assign(split=frame["start_spread"] > SPREAD).groupby("truth").agg(
        fits=("rep", "size"), converged=("converged", "mean"), boundary=("boundary", "mean"),
        loglik_gap_min=("loglik_gap", "min"), loglik_gap_median=("loglik_gap", "median"),
        starts_disagree=("split", "mean"), start_spread_max=("start_spread", "max"))
    return out.reindex(SETTINGS).reset_index().rename(columns={"truth": "setting"})


# %% [markdown]
# ## Figure
# `rates.png`: one panel per setting; markers: the root-mean-square error of each response at each n; dotted lines:
# the expected information's prediction for the same response; printed: the fitted exponent with its 95% interval,
# the design's predicted exponent and the theory's limit.


# %%
COLORS = {"lam_err": "tab:red", "gate_err": "tab:red", "prompt_err": "tab:blue", "loss_dist": "tab:green",
          "loss_nondist": "tab:green"}
TITLES = {"dist_fixed": r"distinguishable, $\lambda^* = 0.3$",
          "dist_vanishing": r"distinguishable, $\lambda^*_n \propto n^{-1/4}$",
          "nondist_merging": r"merging, $\|\Delta^*_n\| \propto n^{-1/6}$, $\lambda^* = 0.5$",
          "softmax_dist": r"softmax gate, distinguishable",
          "softmax_nondist_merging": r"softmax gate, merging, $\|\Delta^*_n\| \propto n^{-1/4}$"}


def plot_rates(calib: pd.DataFrame, rates: pd.DataFrame, path: Path, label: str) -> None:
    """The figure described above, saved to ``path``."""
    from matplotlib.lines import Line2D

    fig, axes, _ = fs.subplots(3, 2, figsize=(fs.PAGE_WIDTH_IN, 11.0), legend_height=0.0)
    for ax, setting in zip(axes.flat, SETTINGS, strict=False):
        lines = []
        for y in responses(setting):
            sub = calib[(calib["setting"] == setting) & (calib["response"] == y)]
            ax.plot(sub["n"], sub["rmse"], "o", ms=4, color=COLORS[y])
            ax.plot(sub["n"], sub["predicted"], ":", lw=1.4, color=COLORS[y])
            r = rates[(rates["setting"] == setting) & (rates["response"] == y)].iloc[0]
            lines.append((f"{r['exponent']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]   info "
                          f"{r['design_exponent']:.2f}   limit {r['theory_exponent']:.2f}", COLORS[y]))
        for i, (text, color) in enumerate(lines):
            ax.text(0.97, 0.96 - 0.075 * i, text, transform=ax.transAxes, color=color, ha="right", va="top",
                    fontsize=fs.fontsize(fig, "legend"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        shown = calib.loc[calib["setting"] == setting, ["rmse", "predicted"]].to_numpy()
        ax.set_ylim(shown.min() / 1.3, shown.max() * 4.0)  # headroom for the printed exponents
        fs.finish_axes(ax, title=TITLES[setting], xlabel="n")
        fs.finish_axes(ax, ylabel="RMSE", raw=True)
    legend = axes.flat[-1]
    handles = [Line2D([], [], color=c, marker="o", ls="") for c in ("tab:red", "tab:blue", "tab:green")]
    handles.append(Line2D([], [], color="0.3", ls=":"))
    fs.legend_panel(legend, handles, [r"gate: $|\hat\lambda - \lambda^*|$ or $\|\hat\beta - \beta^*\| + "
                                      r"|\hat\tau - \tau^*|$", r"prompt: $\|\hat\theta - \theta^*\|$",
                                      "the setting's uniform loss", "expected-information prediction"])
    reps = int(calib["replicates"].min())
    fs.caption(fig, f"{label}; markers: root-mean-square error over {reps} replicates; dotted: sqrt of the inverse "
                    "expected information over n (the asymptotic size of each response at that truth); printed: the "
                    "fitted power exponent of the mean log error [95% interval, random effects], the exponent the "
                    "information predicts on this grid, and the theory's small-distance limit.")
    fs.save(fig, path)


# %%
def run(out: str | Path, quick: bool = False, resume: bool = True, *, size: str | None = None,
        progress: bool = True, workers: int | str | dict[str, int] | None = None, **override: Any) -> pd.DataFrame:
    """Run the study (resumable) and write results.csv, rates.csv, design.csv, windows.csv, calibration.csv,
    fits.csv, rates.png and provenance.json into ``out`` (the study's cells in ``out/study``).

    ``size`` picks an entry of ``SIZES`` (default ``"quick"`` or ``"full"``); ``override`` replaces ``n`` or
    ``reps``.  ``workers`` (default: the CPU count) runs cells in worker processes.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size = size or ("quick" if quick else "full")
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not a size of this vignette; valid sizes are {sorted(SIZES)}.")
    cfg = {**SIZES[size], **override}
    study = make_study(size, **{k: v for k, v in override.items() if k in ("n", "reps")})
    frame, timing = run_study_timed(study, out, resume=resume, progress=progress, workers=workers)
    frame.to_csv(out / "results.csv", index=False)
    ok = successful_rows(frame)
    ns = [int(n) for n in cfg["n"]]
    sizes, design = design_table(ns)
    design.to_csv(out / "design.csv", index=False)
    rates = rate_table(ok, design)
    rates.to_csv(out / "rates.csv", index=False)
    window_table(ok).to_csv(out / "windows.csv", index=False)
    calib = calibration_table(ok, sizes)
    calib.to_csv(out / "calibration.csv", index=False)
    fits_table(ok).to_csv(out / "fits.csv", index=False)
    plot_rates(calib, rates, out / "rates.png", "full size" if size == "full" else f"{size} size")
    write_provenance(out, {"vignette": NAME, "size": size, "sizes": cfg, "study": study.to_dict(), "seed": SEED,
                           "timing": timing, "rows": len(frame), "failed_rows": int(len(frame) - len(ok)),
                           "rate_fit": RATE})
    return frame


# %% [markdown]
# ## Results
# The rendered results, with what the data show, are in `docs/vignettes/contaminated-moe.md`.

# %%
if __name__ == "__main__":
    import sys

    from moestat._vignette import vignette_cli

    sys.exit(vignette_cli(run, NAME))
