# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # The Gaussian-gated MoE (CRPE-GMoE): Voronoi-loss rates of the joint MLE, Type I and Type II
#
# Nguyen, Nguyen, Nguyen & Ho (AISTATS 2024, "Towards convergence rates for parameter estimation in Gaussian-gated
# mixture of experts", arXiv:2305.07572) study the maximum-likelihood estimator (MLE) of the Gaussian-gated MoE
# $p_G(x, y) = \sum_i \pi_i \mathcal N(x; c_i, \Gamma_i)\mathcal N(y; A_i x + b_i, \nu_i)$ — a joint density of
# $(X, Y)$ — when the fitted number of experts $K$ exceeds the true $K^* = 3$. Their Voronoi loss $\mathcal D$
# raises the parameter errors of a cell of $m \ge 2$ fitted atoms to powers $\bar r(m)$ (Type I: every true gate
# mean non-zero) or $\tilde r(m)$ (Type II: some true gate mean zero, where the slope interacts with the gate mean),
# so that the loss itself falls like $\sqrt{\log n / n}$ in both settings
# (`moestat.metrics.gaussian_gate_voronoi`). The authors' code, CRPE-GMoE, stores 20 fits at each of 100 sample
# sizes for four settings and $K = 4, 5$; an OLS of log(mean loss) on log n over those stored losses gives exponents
# between 0.50 and 0.52.
#
# This vignette reruns two of the settings with `moestat.Study` (a custom cell,
# `moestat.papers.nguyen2024_gaussian_gate:gllim_cell`), fits the **joint** likelihood (the estimator the theory and
# the authors' EM are about; the conditional likelihood $p(y \mid x)$ does not identify $\pi, c, \Gamma$), reads
# every exponent with `ms.fit_rate`'s interval, curvature test, window analysis and verdict, and re-analyses the
# authors' stored fits (`--peer DIR`).
#
# ## Pre-specified design (fixed before any run)
#
# * **Truths** — `nguyen2024_gaussian_gate.gllim_truth(setting)` for settings 1 (Type I) and 2 (Type II), both with
#   $d = l = 1$, $K^* = 3$, the parameters of CRPE-GMoE `models.py` (after Ho & Nguyen 2016). Covariates come from
#   the gate's own mixture. Settings 3 and 4 ($d = 2$) are left out of the runs (their fits cost more; the peer
#   re-analysis covers all four).
# * **Fits** — `K4`, `K5`: the joint MLE by L-BFGS (`fit_gllim(method="lbfgs")`, at most 20000 iterations,
#   gradient tolerance $10^{-9}$) from the authors' near-truth start (`near_truth_start`: every true atom gets at
#   least one fitted atom; noise sd $0.005\,n^{-0.083}$ on means, slopes, intercepts and $|N(0,
#   (0.0005\,n^{-0.25})^2)|$ on variances), every variance at least $10^{-3}$ times its coordinate's sample variance
#   (the likelihood is unbounded without a floor; the theory's parameter set is compact). Checks (same data sets, same
#   starts): `K4, one EM step`,
#   `K5, one EM step` — exactly one EM step from that start, the protocol of the authors' stored fits (their stored
#   iteration counts are all 0: `em_GLLiM` stops after its first pass, see below). Why L-BFGS: in an over-specified
#   mixture EM crawls along the near-flat directions that split an atom (thousands of iterations at $n = 4000$);
#   L-BFGS reaches the same maxima in a few hundred (checked in the tests and in the first exploration).
# * **n and replicates** — `quick`: n = 250, 500, 1000, 2000, 4000 (1.2 decades), 10 replicates; `full`: n = 250 to
#   16000 (7 values, 1.8 decades), 12 replicates. Seed 2024; every fit of a setting and n sees the same data sets.
# * **Losses** — `gg_loss` (the Voronoi loss, cells by the Euclidean distance of all blocks) with its parts
#   `weight_gap`, `exact_part` (atoms alone in their cell) and `over_part` (cells of 2 or more atoms); `gg_loss_sum`
#   (cells by the sum of block norms: the authors' convention, equal to their stored losses to $10^{-14}$); per-block
#   errors by cell kind (`cells` piece).
# * **Analysis** — `ms.fit_rate` by setting and fit (`power` and `power_log`); the authors' estimator (OLS of the log
#   of the mean loss, `agg="mean", method="robust"`); `ms.window_sensitivity` (`power_log`, half-decade windows);
#   per-block rates by cell kind against `THEORY`.
# * **Decision rule** (`nguyen2024_gaussian_gate.decide`) — a loss *agrees* with the theory when its `power_log`
#   interval covers 1/2 and its verdict is `power law` or `imprecise`; *faster* / *slower* when the interval lies
#   above / below 1/2; *undecided* when the verdict reads no rate. A per-block rate is *consistent* with its upper
#   bound unless it is slower.
#
# Run: `moestat vignette run gaussian-gated-moe --quick --out out/gaussian-gated-moe/quick` (quick) or without
# `--quick` (full). The peer re-analysis: `python vignettes/gaussian-gated-moe.py --peer CRPE-GMoE --out
# out/gaussian-gated-moe`, with `CRPE-GMoE` a clone of github.com/Trung-TinNGUYEN/CRPE-GMoE (commit e04efe2).

# %%
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import moestat as ms
from moestat import figstyle as fs
from moestat._vignette import run_study_timed
from moestat.metrics.gaussian_gate_voronoi import GG_BLOCKS, gaussian_gate_voronoi_frame
from moestat.papers import nguyen2024_gaussian_gate as paper
from moestat.provenance import write_provenance
from moestat.study import successful_rows

NAME = "gaussian-gated-moe"
TITLE = "Gaussian-gated MoE (CRPE-GMoE): joint-MLE Voronoi-loss rates, Type I and Type II, and the peer's fits"

SEED = 2024
Y = "gg_loss"
THEORY = 0.5
"""The theory's exponent of the loss in n (up to the log factor): ``power_log`` model."""
SETTINGS_RUN = (1, 2)
CELL = "moestat.papers.nguyen2024_gaussian_gate:gllim_cell"
FIT_OPTIONS: dict[str, Any] = {"method": "lbfgs", "max_iter": 20000, "tol": 1e-9}
FITS: dict[str, dict[str, Any]] = {
    "K4": {"k": 4},
    "K5": {"k": 5},
    # checks: one EM step from the same start (the protocol of the authors' stored fits)
    "K4, one EM step": {"k": 4, "steps": 1, "check": "K4"},
    "K5, one EM step": {"k": 5, "steps": 1, "check": "K5"},
}
HEADLINE = [f for f in FITS if "check" not in FITS[f]]
RESPONSES = [Y, "weight_gap", "exact_part", "over_part", "gg_loss_sum"]
MODELS = ["power", "power_log"]
WINDOW_SPAN = 0.5

SIZES: dict[str, dict[str, Any]] = {
    # 1.8 decades, 12 replicates (about half an hour on one core; see the page for whether it was run)
    "full": {"n": [250, 500, 1000, 2000, 4000, 8000, 16000], "reps": 12, "fits": list(FITS)},
    # 1.2 decades, 10 replicates: minutes on one core
    "quick": {"n": [250, 500, 1000, 2000, 4000], "reps": 10, "fits": list(FITS)},
    # the smoke test: seconds
    "tiny": {"n": [150, 300, 600], "reps": 3, "fits": ["K4", "K4, one EM step"]},
}

ADEMP = {
    "aims": "Measure the convergence exponent of the Voronoi loss of the joint MLE of a Gaussian-gated MoE "
            "(Nguyen, Nguyen, Nguyen & Ho, AISTATS 2024) with K = 4, 5 > K* = 3 in a Type I and a Type II "
            "setting, against the theory's 1/2 and the authors' stored fits (exponents 0.50-0.52).",
    "data_generating_mechanisms": "CRPE-GMoE settings 1 (Type I) and 2 (Type II): d = l = 1, K* = 3, "
                                  "(x, y) from the joint GLLiM density.",
    "estimands": ["the Voronoi loss D(G_n, G*) and its parts (weight gap, atoms alone, split cells)",
                  "per-block parameter errors by cell kind",
                  "the exponent alpha of E log D ~ c - alpha u(n), u = log n or log(n / log n)"],
    "methods": ["joint MLE by L-BFGS (fit_gllim) from the authors' near-truth start, K = 4 and 5",
                "one EM step from the same start (the protocol of the authors' stored fits; check)"],
    "performance_measures": ["rate exponents with 95% intervals, curvature tests, window drift and verdicts",
                             "log-likelihood gain of the MLE over one EM step"],
}


def truth_entry(setting: int) -> dict[str, Any]:
    """The study's truth entry of a CRPE-GMoE setting (the custom cell's ``data`` table)."""
    return {"label": f"setting {setting} (Type {paper.SETTINGS[setting]['type']})", "stream": f"setting{setting}",
            "data": {"setting": setting}}


def fit_entry(label: str) -> dict[str, Any]:
    """The ``fit`` entry of a label of ``FITS``."""
    spec = FITS[label]
    options = {"k": spec["k"], "steps": spec["steps"]} if "steps" in spec else {
        "k": spec["k"], **FIT_OPTIONS, "method": spec.get("method", FIT_OPTIONS["method"])}
    return {"label": label, "options": options}


def make_study(size: str = "full", **override: Any) -> ms.Study:
    """The study at a size of ``SIZES``; ``override`` replaces ``n``, ``reps`` or ``fits``."""
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not a size of this vignette; valid sizes are {sorted(SIZES)}.")
    cfg = {**SIZES[size], **override}
    unknown = set(cfg["fits"]) - set(FITS)
    if unknown:
        raise ValueError(f"fits {sorted(unknown)} are not fits of this vignette; valid fits are {list(FITS)}.")
    return ms.Study(name=f"{NAME}-{size}", truth=[truth_entry(s) for s in SETTINGS_RUN],
                    fit=[fit_entry(f) for f in cfg["fits"]], n=list(cfg["n"]), reps=int(cfg["reps"]), seed=SEED,
                    threads=1, cell=CELL, ademp=ADEMP, device="cpu",
                    description="Joint-MLE Voronoi-loss rates of the CRPE-GMoE settings 1 and 2, K = 4, 5")


def make_studies(size: str = "full", **override: Any) -> dict[str, ms.Study]:
    """The vignette's studies by output folder: one, ``{"study": make_study(size)}``."""
    return {"study": make_study(size, **override)}


# %% [markdown]
# ## Rates and checks
#
# `rates.csv`: `ms.fit_rate` of the loss, its parts and the loss in the authors' convention, by setting and fit,
# under `power` and `power_log`, with the theory's 1/2 and the decision. `peer_method.csv`: the authors' estimator
# on these fits. `rates_sensitivity.csv` (added after the first quick run): the loss's exponent on all fits, on the
# fits with no variance at its floor, and on the fits without a *spike* (a component whose input variance is below
# a tenth of the smallest true one: a few points fitted by a steep local line). `windows.csv`: the `power_log`
# exponent of the loss as the smallest or largest n are dropped. `blocks.csv`: per-block rates by cell kind (atoms
# alone; Type I and Type II cells of 2 and 3 atoms) against `THEORY`. `fits.csv`: per setting, fit and n —
# convergence, share at the variance floor, iterations, log-likelihood gained over the start, start and final cell
# patterns, the loss's median and mean and the medians of its parts. `checks.csv`: each one-step fit against the MLE
# on the same data sets.


# %%
RATE_COLS = ["model", "exponent", "se", "ci_low", "ci_high", "verdict", "curvature_p", "window_consistent",
             "window_drift", "tau2", "n_values", "replicates"]


def _k_of(fit: pd.Series) -> pd.Series:
    return fit.map({label: spec["k"] for label, spec in FITS.items()})


def rate_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``fit_rate`` of every response by setting and fit under ``MODELS``, with the theory and the decision."""
    parts = []
    for y in RESPONSES:
        res = ms.fit_rate(frame, y, by=["truth", "fit"], model=MODELS, warn=False)
        tab = res.to_frame(details=True)
        parts.append(tab[["truth", "fit", *[c for c in RATE_COLS if c in tab.columns]]].assign(response=y))
    out = pd.concat(parts, ignore_index=True)
    out["theory_exponent"] = THEORY
    out["decision"] = [paper.decide(v, lo, hi, THEORY) if m == "power_log" else ""
                       for v, lo, hi, m in zip(out["verdict"], out["ci_low"], out["ci_high"], out["model"],
                                               strict=True)]
    return out[["truth", "fit", "response", *[c for c in out.columns if c not in ("truth", "fit", "response")]]]


SPIKE = 0.1
"""A fitted component whose input variances include one below ``SPIKE`` times the smallest true input variance
is a *spike* (a few points fitted by a steep local line; see the page)."""


def spike_flags(frame: pd.DataFrame, params: pd.DataFrame) -> pd.Series:
    """Per row of ``frame``: whether its fit has a spike component (``SPIKE``), from the ``params`` piece."""
    diag = [c for c in params.columns if c.startswith("Gamma_") and len(set(c.split("_")[2:])) == 1]
    keyed = params.set_index(["truth", "fit", "n", "rep"])
    low = pd.Series(False, index=keyed.index)
    for setting in frame["truth_setting"].unique():
        floor = SPIKE * float(np.diagonal(paper.gllim_truth(int(setting)).Gamma, axis1=-2, axis2=-1).min())
        rows = keyed.index.get_level_values("truth").isin(frame.loc[frame["truth_setting"] == setting, "truth"])
        low[rows] = (keyed.loc[rows, diag].fillna(np.inf) < floor).any(axis=1).to_numpy()
    return pd.Series(low.reindex(pd.MultiIndex.from_frame(frame[["truth", "fit", "n", "rep"]])).to_numpy(),
                     index=frame.index)


def sensitivity_table(frame: pd.DataFrame, spikes: pd.Series) -> pd.DataFrame:
    """Sensitivity (added after the first quick run): ``fit_rate`` of the loss (``power_log``) by setting and fit on
    all fits, on the fits with no variance at its floor and on the fits without a spike component, with the share of
    fits each leaves out."""
    rows = []
    variants = (("all fits", pd.Series(True, index=frame.index)),
                ("no variance at the floor", ~frame["at_floor"].astype(bool)), ("no spike component", ~spikes))
    for label, keep in variants:
        tab = ms.fit_rate(frame[keep], Y, by=["truth", "fit"], model="power_log", warn=False).to_frame(details=True)
        left = (~keep).groupby([frame["truth"], frame["fit"]]).mean()
        part = tab[["truth", "fit", "exponent", "ci_low", "ci_high", "verdict", "curvature_p", "n_values"]]
        rows.append(part.assign(fits=label, share_left_out=[float(left.loc[(t, f)])
                                                            for t, f in zip(part["truth"], part["fit"], strict=True)]))
    out = pd.concat(rows, ignore_index=True)
    out["decision"] = [paper.decide(v, lo, hi, THEORY) for v, lo, hi in zip(out["verdict"], out["ci_low"],
                                                                             out["ci_high"], strict=True)]
    return out


def peer_method(frame: pd.DataFrame) -> pd.DataFrame:
    """The authors' estimator on these fits: OLS of log(mean loss over replicates) on log n (``agg="mean"``,
    ``method="robust"``), for the loss and for the loss in their convention."""
    parts = []
    for y in (Y, "gg_loss_sum"):
        tab = ms.fit_rate(frame, y, by=["truth", "fit"], agg="mean", method="robust", warn=False).table
        parts.append(tab[["truth", "fit", "exponent", "ci_low", "ci_high", "verdict", "curvature_p"]].assign(
            response=y))
    return pd.concat(parts, ignore_index=True)


def window_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``ms.window_sensitivity`` of the loss (``power_log``) by setting and fit, windows of at least
    ``WINDOW_SPAN`` decades."""
    ws = ms.window_sensitivity(frame, Y, by=["truth", "fit"], model="power_log", min_span=WINDOW_SPAN)
    return ws.table


def fit_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per setting, fit and n: fits, converged share, share with a variance at its floor, median iterations, median
    log-likelihood gain over the start,
    the start and final cell patterns, the share whose pattern moved, and the loss and its parts."""
    f = frame.assign(gain=frame["loglik"] - frame["loglik_start"],
                     moved=frame["cell_sizes"] != frame["start_pattern"])

    def patterns(s: pd.Series) -> str:
        return ", ".join(f"{p}: {c}" for p, c in s.value_counts().items())

    g = f.groupby(["truth", "fit", "n"], sort=False)
    return g.agg(fits=(Y, "size"), converged=("converged", "mean"), at_floor=("at_floor", "mean"),
                 n_iter_median=("n_iter", "median"),
                 loglik_gain_median=("gain", "median"), start_patterns=("start_pattern", patterns),
                 final_patterns=("cell_sizes", patterns), pattern_moved=("moved", "mean"),
                 empty_cells=("empty_cells", "sum"), loss_median=(Y, "median"), loss_mean=(Y, "mean"),
                 weight_gap_median=("weight_gap", "median"), exact_part_median=("exact_part", "median"),
                 over_part_median=("over_part", "median")).reset_index()


def check_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Each check fit against its MLE fit on the same data sets and starts, per setting and n: the MLE's
    log-likelihood gain, the two losses' medians, and the share of data sets where the MLE's loss is larger."""
    rows = []
    for label, spec in FITS.items():
        ref = spec.get("check")
        if ref is None or not {label, ref} <= set(frame["fit"]):
            continue
        a = frame[frame["fit"] == ref].set_index(["truth", "n", "rep"])
        b = frame[frame["fit"] == label].set_index(["truth", "n", "rep"]).reindex(a.index)
        part = pd.DataFrame({"gain": a["loglik"] - b["loglik"], "mle": a[Y], "check": b[Y],
                             "mle_larger": a[Y] > b[Y], "mle_over": a["over_part"], "check_over": b["over_part"],
                             "iter_check": b["n_iter"]})
        out = part.groupby(level=["truth", "n"]).agg(
            data_sets=("gain", "size"), loglik_gain_min=("gain", "min"), loglik_gain_median=("gain", "median"),
            loglik_gain_max=("gain", "max"), loss_mle_median=("mle", "median"), loss_check_median=("check", "median"),
            mle_loss_larger=("mle_larger", "mean"), over_part_mle_median=("mle_over", "median"),
            over_part_check_median=("check_over", "median"), n_iter_check_median=("iter_check", "median")
        ).reset_index()
        rows.append(out.assign(check=label, headline=ref))
    if not rows:
        return pd.DataFrame()
    tab = pd.concat(rows, ignore_index=True)
    return tab[["check", "headline", *[c for c in tab.columns if c not in ("check", "headline")]]]


def _theory_blocks() -> pd.DataFrame:
    cols = list(ms.rates.theory.THEORY_COLUMNS)
    return pd.DataFrame(paper.THEORY, columns=cols).set_index("response")


def block_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """Per setting, fit, n and replicate: the largest error of every block over the atoms alone in their cell
    (``<block>_exact``) and over the atoms of Type I / Type II cells of m atoms (``<block>_cell<m>``,
    ``<block>_zero_cell<m>``); NaN where the replicate has no such cell."""
    kind = np.where(cells["cell_size"] == 1, "exact",
                    np.where(cells["zero_location"], "zero_cell", "cell") + cells["cell_size"].astype(str))
    kind = pd.Series(kind, index=cells.index).where(cells["cell_size"] > 0)
    long = cells.assign(kind=kind).dropna(subset=["kind"])
    wide = long.groupby(["truth", "fit", "n", "rep", "kind"])[[f"err_{b}" for b in GG_BLOCKS]].max().unstack("kind")
    wide.columns = [f"{b[4:]}_{k}" for b, k in wide.columns]
    return wide.reset_index()


def block_table(cells: pd.DataFrame, min_values: int = 3) -> pd.DataFrame:
    """``fit_rate`` (``power_log``) of every block error by cell kind, for the MLE fits, against the ``THEORY`` row
    of that response; a response seen at fewer than ``min_values`` sample sizes gets no exponent."""
    wide = block_frame(cells[cells["fit"].isin(HEADLINE)])
    theory = _theory_blocks()
    rows = []
    for col in [c for c in wide.columns if c not in ("truth", "fit", "n", "rep")]:
        for (truth, fit), sub in wide.dropna(subset=[col]).groupby(["truth", "fit"]):
            counts = sub.groupby("n").size()
            base = {"truth": truth, "fit": fit, "response": col, "n_values": int((counts >= 2).sum()),
                    "rows": len(sub)}
            if base["n_values"] < min_values:
                rows.append({**base, "verdict": f"no exponent: seen at {base['n_values']} sample size(s)"})
                continue
            keep = sub[sub["n"].isin(counts[counts >= 2].index)]
            row = ms.fit_rate(keep, col, model="power_log", warn=False).to_frame(details=True).iloc[0]
            rows.append({**base, **{c: row[c] for c in ("exponent", "ci_low", "ci_high", "verdict", "curvature_p")}})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["theory"] = out["response"].map(theory["rate"])
    out["theory_exponent"] = out["response"].map(theory["exponent"])
    decisions = []
    for _, r in out.iterrows():
        if not np.isfinite(r.get("exponent", np.nan)) or not np.isfinite(r["theory_exponent"]):
            decisions.append("")
            continue
        d = paper.decide(r["verdict"], r["ci_low"], r["ci_high"], r["theory_exponent"])
        decisions.append("consistent (upper bound)" if d in ("agrees", "faster than theory") else d)
    out["decision"] = decisions
    return out


# %% [markdown]
# ## Figure
# `loss.png`: one panel per setting and $K$: the loss of the MLE (blue) and of one EM step from the same start
# (orange) against n — per-n geometric means over the replicates with bars $\times/\div\,e^{2\,\mathrm{se}}$ (se:
# the standard error of the mean log loss), the replicates as dots, the fitted `power` line, and its exponent with
# its 95% interval printed in the panel.


# %%
COLORS = {"mle": "tab:blue", "one step": "tab:orange"}


def _panel(ax: Any, frame: pd.DataFrame) -> None:
    """The loss of every fit in ``frame`` against n, with its fitted power line and exponent."""
    res = ms.fit_rate(frame, Y, by="fit", warn=False).to_frame(details=True).set_index("fit")
    for i, (fit, sub) in enumerate(frame.groupby("fit", sort=False)):
        color = COLORS["one step" if "steps" in FITS[str(fit)] else "mle"]
        logs = np.log(sub[Y]).groupby(sub["n"])
        ns = np.asarray(list(logs.groups), float)
        centre, se = logs.mean().to_numpy(), (logs.std() / np.sqrt(logs.size())).to_numpy()
        ax.scatter(sub["n"] * (1.04 if i else 0.96), sub[Y], s=4, color=color, alpha=0.35, lw=0)
        ax.errorbar(ns, np.exp(centre), yerr=[np.exp(centre) - np.exp(centre - 2 * se),
                                              np.exp(centre + 2 * se) - np.exp(centre)],
                    fmt="o", ms=3.5, capsize=2, color=color)
        row = res.loc[fit]
        grid = np.logspace(np.log10(ns.min()), np.log10(ns.max()), 50)
        ax.plot(grid, np.exp(row["intercept"] - row["exponent"] * np.log(grid)), "--", color=color, lw=1.2)
        ax.text(0.03, 0.04 + 0.08 * i, f"{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]",
                transform=ax.transAxes, color=color, fontsize=fs.fontsize(ax.figure, "legend"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_rates(frame: pd.DataFrame, path: Path, label: str) -> None:
    """The figure described above, saved to ``path``."""
    from matplotlib.lines import Line2D

    truths = list(dict.fromkeys(frame["truth"]))
    ks = sorted(_k_of(frame["fit"]).unique())
    fig, axes, legend_ax = fs.subplots(len(truths), len(ks), figsize=(fs.PAGE_WIDTH_IN, 3.4 * len(truths) + 0.6),
                                       legend_height=0.6)
    for i, truth in enumerate(truths):
        for j, k in enumerate(ks):
            _panel(axes[i, j], frame[(frame["truth"] == truth) & (_k_of(frame["fit"]) == k)])
            fs.finish_axes(axes[i, j], title=f"{truth}, K = {k}", xlabel="n", ylabel="Voronoi loss" if j == 0 else None)
    handles = [Line2D([], [], color=c, marker="o", ls="--") for c in COLORS.values()]
    fs.legend_panel(legend_ax, handles, ["joint MLE (L-BFGS)", "one EM step from the same start"], ncol=2)
    reps = int(frame.groupby(["truth", "fit", "n"]).size().min())
    fs.caption(fig, f"{label}; markers: geometric mean over {reps} replicates (dots), bars: times/divided by exp(2 se) "
                    "of the mean log loss; dashed: fitted C n^-alpha; printed: alpha [95% interval, random effects "
                    "with Knapp-Hartung]")
    fs.save(fig, path)


# %% [markdown]
# ## The peer's stored fits (`--peer DIR`)
#
# CRPE-GMoE stores, for each setting m = 1..4 and K = 4, 5, the fitted $\pi, c, \Gamma, A, b, \nu$
# (`results_GLLiM/result_model<m>_K<K>_n100000_rep20_<block>.npy`, 100 n values x 20 replicates), the iteration
# counts (`_iters.npy`) and the losses (`_loss.npy`, from `params_to_metric_GLLiM.py`). `peer_tables` recomputes the
# loss on every stored fit in the authors' convention (and checks it against the stored one), splits it into its
# parts, refits the exponent with the authors' estimator and with moestat's, over the whole grid and over windows.


# %%
PEER_TEMPLATE = "result_model{m}_K{k}_n100000_rep20_"


def load_peer(peer_dir: str | os.PathLike[str], setting: int, k: int) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                                                 np.ndarray]:
    """The authors' stored fits (blocks flattened over n and replicate), losses (n, reps) and iterations."""
    base = Path(peer_dir) / "results_GLLiM"
    if not base.is_dir():
        raise ValueError(f"peer_dir={str(peer_dir)!r} has no results_GLLiM folder; pass a clone of "
                         f"{paper.PEER['repository']} (commit {paper.PEER['commit'][:7]}).")
    stem = base / PEER_TEMPLATE.format(m=setting, k=k)
    blocks = {b: np.load(f"{stem}{b}.npy") for b in ("pi", "c", "Gamma", "A", "b", "nu")}
    flat = {b: v.reshape(-1, *v.shape[2:]) for b, v in blocks.items()}
    return flat, np.load(f"{stem}loss.npy"), np.load(f"{stem}iters.npy")


def peer_frame(peer_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per stored fit: ``setting, K, n, rep``, the stored loss ``peer_loss`` and iterations ``peer_iters``,
    the loss recomputed in the authors' convention (``recomputed``), its parts and cell pattern, and moestat's loss
    with Euclidean cells (``gg_loss``)."""
    grid = paper.peer_grid()
    parts = []
    for setting in paper.SETTINGS:
        truth = paper.gllim_truth(setting)
        for k in (4, 5):
            flat, loss, iters = load_peer(peer_dir, setting, k)
            code = gaussian_gate_voronoi_frame(flat, truth, cell_distance="sum")
            reps = loss.shape[1]
            # n = 500 appears twice in the grid (end of the first block, start of the second): its second 20 fits
            # become replicates 20-39 of n = 500, so that (n, rep) identifies a fit
            rep = np.tile(np.arange(reps), loss.shape[0]) + reps * np.repeat(_repeat_index(grid), reps)
            parts.append(pd.DataFrame({
                "setting": setting, "type": paper.SETTINGS[setting]["type"], "K": k, "grid_index":
                np.repeat(np.arange(grid.size), reps), "n": np.repeat(grid, reps), "rep": rep,
                "peer_loss": loss.ravel(), "peer_iters": iters.ravel(), "recomputed": code["loss"].to_numpy(),
                "weight_gap": code["weight_gap"].to_numpy(), "exact_part": code["exact_part"].to_numpy(),
                "over_part": code["over_part"].to_numpy(), "cell_sizes": code["cell_sizes"].to_numpy(),
                Y: gaussian_gate_voronoi_frame(flat, truth)["loss"].to_numpy()}))
    return pd.concat(parts, ignore_index=True)


def _repeat_index(grid: np.ndarray) -> np.ndarray:
    """For each grid point, how many earlier points have the same n."""
    seen: dict[int, int] = {}
    out = []
    for n in grid:
        out.append(seen.get(int(n), 0))
        seen[int(n)] = out[-1] + 1
    return np.asarray(out)


def peer_formula(pf: pd.DataFrame) -> pd.Series:
    """The authors' exponent exactly as their plotting script defines it: the OLS slope of log(mean loss over the
    20 replicates) on log n over all 100 grid points (n = 500 counted twice)."""
    means = pf.groupby("grid_index").agg(n=("n", "first"), loss=("peer_loss", "mean"))
    return pd.Series({"exponent_peer_formula": -float(np.polyfit(np.log(means["n"]), np.log(means["loss"]), 1)[0])})


def peer_tables(pf: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``check`` (recomputed against stored losses, stored iterations, the exponent by the authors' formula and by
    ``fit_rate``'s version of it: the 40 fits at n = 500 pooled into one point),
    ``rates`` (both estimators, ``power`` and ``power_log``, the loss and its parts), ``windows`` (the authors'
    estimator as the smallest or largest n are dropped, one-decade windows) and ``per_n`` (means per n)."""
    by = ["setting", "K"]
    g = pf.groupby(by)
    check = g.apply(lambda d: pd.Series({
        "fits": len(d), "max_rel_difference": float(((d["recomputed"] - d["peer_loss"]).abs() / d["peer_loss"]).max()),
        "iters_max": int(d["peer_iters"].max()), "euclid_equals_sum": bool(np.allclose(d[Y], d["recomputed"])),
        "patterns": ", ".join(f"{p}: {c}" for p, c in d["cell_sizes"].value_counts().items())}),
        include_groups=False).reset_index()
    published = ms.fit_rate(pf, "peer_loss", by=by, agg="mean", method="robust", warn=False).table
    check = check.merge(published[[*by, "exponent"]].rename(columns={"exponent": "exponent_log_mean_ols"}), on=by)
    check = check.merge(g.apply(peer_formula, include_groups=False).reset_index(), on=by)
    rows = []
    for y in ("peer_loss", "weight_gap", "exact_part", "over_part"):
        for estimator, kw in (("log of mean, OLS (peer)", {"agg": "mean", "method": "robust"}),
                              ("mean log, random effects (moestat)", {})):
            tab = ms.fit_rate(pf, y, by=by, model=MODELS, warn=False, **kw).to_frame(details=True)
            rows.append(tab[[*by, *[c for c in RATE_COLS if c in tab.columns]]].assign(response=y,
                                                                                        estimator=estimator))
    rates = pd.concat(rows, ignore_index=True)
    wins = []
    for estimator, kw in (("log of mean, OLS (peer)", {"agg": "mean", "method": "robust"}),
                          ("mean log, random effects (moestat)", {})):
        ws = ms.window_sensitivity(pf, "peer_loss", by=by, min_span=1.0, **kw)
        wins.append(ws.table.assign(estimator=estimator))
    per_n = pf.groupby([*by, "n"]).agg(peer_loss_mean=("peer_loss", "mean"), weight_gap_mean=("weight_gap", "mean"),
                                       exact_part_mean=("exact_part", "mean"),
                                       over_part_mean=("over_part", "mean")).reset_index()
    return {"check": check, "rates": rates, "windows": pd.concat(wins, ignore_index=True), "per_n": per_n}


def plot_peer(per_n: pd.DataFrame, path: Path) -> None:
    """Per setting (K = 4 solid, K = 5 dashed): the mean stored loss and the means of its three parts."""
    fig, axes, leg_ax = fs.subplots(2, 2, figsize=(fs.PAGE_WIDTH_IN, 7.0), legend_height=0.7)
    colors = {"peer_loss_mean": "black", "weight_gap_mean": "tab:blue", "exact_part_mean": "tab:green",
              "over_part_mean": "tab:red"}
    handles: list[Any] = []
    for ax, setting in zip(axes.flat, paper.SETTINGS, strict=True):
        for k, ls in ((4, "-"), (5, "--")):
            sub = per_n[(per_n["setting"] == setting) & (per_n["K"] == k)]
            lines = [ax.plot(sub["n"], sub[c], color=col, ls=ls, lw=1.1)[0] for c, col in colors.items()]
            handles = handles or lines
        ax.set_xscale("log")
        ax.set_yscale("log")
        fs.finish_axes(ax, title=f"setting {setting}: {paper.SETTINGS[setting]['label']}", xlabel="n",
                       ylabel="mean over 20 fits", raw=True)
    fs.legend_panel(leg_ax, handles, ["stored loss", "weight gap", "atoms alone in their cell",
                                      "cells of 2-3 atoms"], ncol=4)
    fs.caption(fig, "CRPE-GMoE's stored fits (commit e04efe2), 100 n values x 20 replicates; K = 4 solid, "
                    "K = 5 dashed")
    fs.save(fig, path)


def run_peer(peer_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> dict[str, pd.DataFrame]:
    """Re-analyse the authors' stored fits into ``out/peer``: check.csv, rates.csv, windows.csv, per_n.csv,
    peer.png and source.json."""
    target = Path(out) / "peer"
    target.mkdir(parents=True, exist_ok=True)
    tables = peer_tables(peer_frame(peer_dir))
    for name, table in tables.items():
        table.to_csv(target / f"{name}.csv", index=False)
    plot_peer(tables["per_n"], target / "peer.png")
    (target / "source.json").write_text(json.dumps({**paper.PEER, "files": PEER_TEMPLATE + "<block>.npy"},
                                                   indent=1))
    return tables


# %%
def run(out: str | Path, quick: bool = False, resume: bool = True, *, size: str | None = None,
        progress: bool = True, workers: int | str | dict[str, int] | None = None,
        peer: str | os.PathLike[str] | None = None,
        **override: Any) -> pd.DataFrame:
    """Run the study (resumable) and write results.csv, rates.csv, peer_method.csv, rates_sensitivity.csv, windows.csv,
    blocks.csv, fits.csv, checks.csv, loss.png and provenance.json into ``out`` (the study's cells in ``out/study``).

    ``size`` picks an entry of ``SIZES`` (default ``"quick"`` or ``"full"``); ``override`` replaces ``n``, ``reps``
    or ``fits``.  ``workers`` (default: the CPU count) runs cells in worker processes.  ``peer`` (a clone of
    CRPE-GMoE) also re-analyses the authors' stored fits into ``out/peer`` (:func:`run_peer`).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size = size or ("quick" if quick else "full")
    study = make_study(size, **override)
    frame, timing = run_study_timed(study, out, resume=resume, progress=progress, workers=workers)
    frame.to_csv(out / "results.csv", index=False)
    ok = successful_rows(frame)
    rate_table(ok).to_csv(out / "rates.csv", index=False)
    peer_method(ok).to_csv(out / "peer_method.csv", index=False)
    sensitivity_table(ok, spike_flags(ok, study.pieces("params", out / "study"))).to_csv(
        out / "rates_sensitivity.csv", index=False)
    window_table(ok).to_csv(out / "windows.csv", index=False)
    block_table(study.pieces("cells", out / "study")).to_csv(out / "blocks.csv", index=False)
    fit_table(frame).to_csv(out / "fits.csv", index=False)
    check_table(ok).to_csv(out / "checks.csv", index=False)
    plot_rates(ok, out / "loss.png", "full size" if size == "full" else f"{size} size")
    write_provenance(out, {"vignette": NAME, "size": size, "sizes": {**SIZES[size], **override},
                           "study": study.to_dict(), "seed": SEED, "timing": timing, "rows": len(frame),
                           "failed_rows": int(len(frame) - len(ok))})
    if peer is not None:
        run_peer(peer, out)
    return frame


# %% [markdown]
# ## Results
# The rendered results, with the exponents and what explains each difference from the authors' stored fits, are in
# `docs/vignettes/gaussian-gated-moe.md`.

# %%
def main(argv: Sequence[str] | None = None) -> int:
    """``python vignettes/gaussian-gated-moe.py [--quick | --size SIZE] [--out DIR] [--workers N] [--peer DIR]``;
    with ``--peer`` alone (no size) only the authors' stored fits are re-analysed."""
    from moestat._vignette import vignette_cli

    return vignette_cli(run, NAME, argv, sizes=list(SIZES), workers=True,
                        peer=(run_peer, "github.com/Trung-TinNGUYEN/CRPE-GMoE"))


if __name__ == "__main__":
    import sys

    sys.exit(main())
