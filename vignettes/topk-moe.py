# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Top-K sparse softmax gating: exact- and over-specified MLE rates, and which over-specified fits can converge
#
# Nguyen, Akbarian, Yan & Ho (ICLR 2024, "Statistical perspective of top-K sparse softmax gating mixture of experts",
# arXiv:2309.13850) study the maximum-likelihood estimator of a Gaussian MoE whose gate keeps the $K$ largest softmax
# scores and renormalises them. Their abstract (the text beyond it could not be read; see the page) states: with
# $k = k_*$ experts, density and parameter estimation are parametric; with $k > k_*$, the number $\bar K$ of experts
# the fitted gate selects must reach "the total cardinality of a certain number of Voronoi cells" for the density
# to converge, the density rate stays parametric and the parameter rates become "substantially slow".
#
# This vignette measures those rates with `moestat.Study` (`estimator = "mle"`, gate `topk`), scores the fits with
# the region-wise Voronoi losses of `moestat.metrics.topk_voronoi` (derived for this reproduction: on each input
# region the top-K model is the softmax MoE of the selected experts) and the expected Hellinger distance, and checks
# the $\bar K$ condition with fits that violate it.
#
# ## Pre-specified design (fixed before any rate was computed)
#
# * **Truth** `chain` (`nguyen2024_topk.topk_truth("chain")`, moestat's stand-in: the paper's settings could not be
#   read): $d = 1$, $X \sim U[0, 1]$, $k_* = 3$, $K = 2$, scores $1 - 4x$, $0$, $-3 + 4x$ (expert 2 selected
#   everywhere, expert 1 on $x < 1/2$, expert 3 on $x > 1/2$), experts $4 - 2x$, $2x - 1$, $1 + 4x$, sds 0.3, 0.4,
#   0.3 (experts 1 and 3 meet at $x = 1/2$, so the density is continuous at the region boundary). Responses from the
#   mixture.
# * **Fits** (`fit_mle`, L-BFGS on the log-likelihood, `method = "gradient"`, from the truth jittered by
#   $N(0, 0.05^2)$, no random restarts): `exact` $k = 3$, $\bar K = 2$; `over` $k = 4$, $\bar K = 3$ with expert 2
#   split (the one admissible split: expert 2 is active on both regions, so each region selects exactly the atoms of
#   its cells, $|A_S| = 3$).
# * **Checks** (small): `split 1, Kbar 3` (expert 1 split, $\bar K = 3$: on $x > 1/2$ the gate must select an atom
#   of expert 1's cell); `split 2, Kbar 2` ($\bar K = 2 < |A_S| = 3$); the `lambda` truth of a third-party script
#   (top-1, $k_* = 2$) fitted with $k = 3$, $\bar K = 2$; and the **pilot** that fixed the truth: `chain_jump` (expert
#   3 $= -4 + x$, a density jump at $x = 1/2$), `exact` fits from the exact truth and from a 0.05 jitter.
# * **n and replicates**: `quick` — n = 500, 889, 1581, 2812, 5000 (one decade), 20 replicates; `full` — seven n from
#   500 to 20000 (1.6 decades), 40 replicates; checks n = 500, 1581, 5000 with 10 replicates; pilot n = 2000 with
#   10 replicates. Seed 2024.
# * **Metrics**: `topk_voronoi` ($D$: exact-specified for `exact`, cell-size exponents $\bar r(2) = 4$ for `over`),
#   the block errors `err_<beta1|a|b|nu>_cell<1|2>` (atoms alone in their cell, atoms of the split cell),
#   `hellinger` ($E_X h$ on 200 inputs), `loglik_gap` $= \ell_n(\hat G) - \ell_n(G^*)$, `selection_match`,
#   `min_selected_share`.
# * **Analysis**: `ms.fit_rate` by fit and response, model `power_log` ($\log y$ on $\log(n/\log n)$), with the
#   theory's exponent (`nguyen2024_topk.THEORY`); `ms.window_sensitivity` (half-decade windows at the quick size).
# * **Decision rules** (`nguyen2024_topk.decide`, `CRITERIA`): the theory's rates are upper bounds, so a rate
#   *agrees* when its 95% interval covers the exponent, is *faster than the bound (consistent)* when above it,
#   *contradicts* when below it, and is *undecided* with the verdict `range too narrow`, `no decay` or `curved`. A fit
#   *reached the maximum* when `loglik_gap >= -1`; a cell is usable when 90% of its fits did. An inadmissible check
#   fit *stalls* when its mean Hellinger distance at the largest n is at least 0.7 times that at the smallest n, and
#   *abandons the split* when an atom is never selected (median `min_selected_share` below 0.01).
#
# Run: `moestat vignette run topk-moe --quick --out out/topk-moe` (quick) or without `--quick` (full).

# %%
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import moestat as ms
from moestat import figstyle as fs
from moestat._vignette import run_study_timed
from moestat.papers import nguyen2024_topk as paper
from moestat.provenance import write_provenance
from moestat.rates.theory import THEORY_COLUMNS
from moestat.study import successful_rows

NAME = "topk-moe"
TITLE = "Top-K sparse softmax gating: exact- and over-specified MLE rates and the over-specified selection condition"

SEED = 2024
METRICS = ["moestat.papers.nguyen2024_topk:topk_metric", "moestat.papers.nguyen2024_topk:hellinger_metric"]
RESPONSES = {"exact": ["hellinger", "topk_voronoi", "err_beta1_cell1", "err_a_cell1", "err_b_cell1", "err_nu_cell1"],
             "over": ["hellinger", "topk_voronoi", "err_beta1_cell2", "err_b_cell2", "err_a_cell2", "err_nu_cell2",
                      "err_beta1_cell1", "err_a_cell1", "err_b_cell1", "err_nu_cell1"]}
FIT_OPTIONS: dict[str, Any] = {"init": "near_truth", "init_scale": 0.05, "method": "gradient"}

# label -> (k, Kbar, split true atoms)
FITS = {"exact": (3, 2, []), "over": (4, 3, [1])}
CHECK_FITS = {"split 1, Kbar 3": (4, 3, [0]), "split 2, Kbar 2": (4, 2, [1])}
LAMBDA_FITS = {"lambda k 3, Kbar 2": (3, 2, [0])}
PILOT_FITS = {"exact, start = truth": 0.0, "exact, start jitter 0.05": 0.05}

SIZES: dict[str, dict[str, Any]] = {
    # 1.6 decades, 40 replicates
    "full": {"n": [500, 920, 1700, 3130, 5770, 10600, 20000], "reps": 40, "check_n": [500, 1581, 5000],
             "check_reps": 10, "pilot_n": [2000], "pilot_reps": 10},
    # one decade, 20 replicates: minutes on one CPU core
    "quick": {"n": [500, 889, 1581, 2812, 5000], "reps": 20, "check_n": [500, 1581, 5000], "check_reps": 10,
              "pilot_n": [2000], "pilot_reps": 10},
    # the smoke test: seconds
    "tiny": {"n": [200, 400, 800], "reps": 3, "check_n": [200, 800], "check_reps": 2, "pilot_n": [300],
             "pilot_reps": 2},
}
WINDOW_SPAN = {"quick": 0.5, "full": 1.0, "tiny": 0.3}
"""Minimum span (decades) of the windows of ``windows.csv``."""

ADEMP = {
    "aims": "Measure the MLE rates of a top-K sparse softmax-gated Gaussian MoE (Nguyen, Akbarian, Yan & Ho, ICLR "
            "2024) exact- (k = k*) and over-specified (k > k*), and check the over-specified selection condition.",
    "data_generating_mechanisms": "d = 1, X ~ U[0,1], k* = 3, K = 2 (nguyen2024_topk.PARAMS, 'chain'); responses "
                                  "from the mixture. Checks: the same truth; 'chain_jump'; the top-1 'lambda' truth.",
    "estimands": ["expected Hellinger distance of the conditional density",
                  "region-wise Voronoi loss (metrics.topk_voronoi) and block errors by cell size",
                  "the exponent alpha of E log y ~ c - alpha log(n / log n)"],
    "methods": ["fit_mle, gate topk, L-BFGS from the truth jittered by N(0, 0.05^2): k = 3 with Kbar = 2, and k = 4 "
                "with Kbar = 3 and expert 2 split"],
    "performance_measures": ["rate exponents with 95% intervals, curvature tests, window drift and verdicts",
                             "share of fits reaching the truth's log-likelihood, selection match"],
}


def _entry(name: str, label: str | None = None) -> dict[str, Any]:
    """The study truth entry of ``paper.topk_truth(name)`` as an explicit model."""
    values, top_k = paper.TRUTHS[name]
    return {"label": label or name, "gate": "topk", "top_k": top_k, "expert": "linear", "k": len(values["gate_bias"]),
            "d": 1, "params": {key: np.asarray(v).tolist() for key, v in values.items()}, "inputs": "uniform",
            "low": 0.0, "high": 1.0, "model": "mixture"}


def _fit(label: str, k: int, top_k: int, split: list[int], **options: Any) -> dict[str, Any]:
    opts = {**FIT_OPTIONS, **options}
    if split:
        opts["duplicate"] = list(split)
    return {"label": label, "estimator": "mle", "gate": "topk", "k": k, "top_k": top_k, "options": opts}


def make_studies(size: str = "full", **override: Any) -> dict[str, ms.Study]:
    """The vignette's studies by output folder: ``rates`` (the headline fits), ``checks`` (inadmissible splits),
    ``lambda`` (the top-1 truth) and ``pilot`` (the discontinuous truth); ``override`` replaces entries of
    ``SIZES[size]``."""
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not a size of this vignette; valid sizes are {sorted(SIZES)}.")
    cfg = {**SIZES[size], **override}
    common = {"metrics": list(METRICS), "seed": SEED, "threads": 1, "ademp": ADEMP}
    return {
        "rates": ms.Study(name=f"{NAME}-{size}-rates", truth=_entry("chain"), n=list(cfg["n"]), reps=int(cfg["reps"]),
                          fit=[_fit(lab, *spec) for lab, spec in FITS.items()],
                          description="MLE rates of a top-K (K = 2) Gaussian MoE, k = k* and k > k*", **common),
        "checks": ms.Study(name=f"{NAME}-{size}-checks", truth=_entry("chain"), n=list(cfg["check_n"]),
                           reps=int(cfg["check_reps"]), fit=[_fit(lab, *spec) for lab, spec in CHECK_FITS.items()],
                           description="over-specified fits violating the selection condition", **common),
        "lambda": ms.Study(name=f"{NAME}-{size}-lambda", truth=_entry("lambda"), n=list(cfg["check_n"]),
                           reps=int(cfg["check_reps"]), fit=[_fit(lab, *spec) for lab, spec in LAMBDA_FITS.items()],
                           description="a top-1 truth fitted with k = 3, Kbar = 2", **common),
        "pilot": ms.Study(name=f"{NAME}-{size}-pilot", truth=_entry("chain_jump"), n=list(cfg["pilot_n"]),
                          reps=int(cfg["pilot_reps"]),
                          fit=[_fit(lab, 3, 2, [], init_scale=s) for lab, s in PILOT_FITS.items()],
                          description="the pilot: a truth whose density jumps at the region boundary", **common),
    }


# %% [markdown]
# ## Rates, checks and the theory
#
# `rates.csv`: one row per fit and response with the `power_log` exponent, its interval, verdict, window drift, the
# theory's exponent and its source (read from the abstract, or derived), and the decision. `windows.csv`: the
# exponent as the smallest or largest n are dropped. `fits.csv`: per fit and n, the share of fits that reached the
# truth's log-likelihood, the median `selection_match` and `min_selected_share`, the cell patterns and the median
# metrics. `admissibility.csv`: the check fits, their Hellinger trend and decision. `pilot.csv`: the pilot.


# %%
RATE_COLS = ["model", "exponent", "se", "ci_low", "ci_high", "verdict", "curvature_p", "window_consistent",
             "window_drift", "tau2", "n_values", "replicates"]


def theory_table() -> pd.DataFrame:
    """The paper module's theory rows as a frame."""
    return pd.DataFrame(paper.THEORY, columns=list(THEORY_COLUMNS))


def _theory(fit: str, response: str) -> tuple[float, str, str]:
    """(exponent, rate, note) of the theory row of ``response`` for the fit's regime (NaN if none)."""
    tab = theory_table()
    hit = tab[(tab["regime"] == ("exact" if fit == "exact" else "over")) & (tab["response"] == response)]
    if hit.empty:
        return np.nan, "", ""
    row = hit.iloc[0]
    return float(row["exponent"]), str(row["rate"]), str(row["note"])


def rate_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``fit_rate`` (``power_log``) of every response of every headline fit, with the theory and the decision."""
    parts = []
    for fit, responses in RESPONSES.items():
        sub = frame[frame["fit"] == fit]
        if sub.empty:
            continue
        for y in responses:
            if sub[y].notna().sum() == 0:
                continue
            res = ms.fit_rate(sub.dropna(subset=[y]), y, model="power_log", warn=False)
            tab = res.to_frame(details=True)
            parts.append(tab[[c for c in RATE_COLS if c in tab.columns]].assign(fit=fit, response=y))
    out = pd.concat(parts, ignore_index=True)
    theory = [_theory(f, r) for f, r in zip(out["fit"], out["response"], strict=True)]
    out["theory_exponent"] = [t[0] for t in theory]
    out["theory_rate"] = [t[1] for t in theory]
    out["theory_source"] = ["abstract" if t[2].startswith("read") else "derived" for t in theory]
    out["decision"] = [paper.decide(row) for _, row in out.iterrows()]
    return out[["fit", "response", *[c for c in out.columns if c not in ("fit", "response")]]]


def window_table(frame: pd.DataFrame, span: float) -> pd.DataFrame:
    """``ms.window_sensitivity`` of the ``power_log`` exponent of the loss and the Hellinger distance by fit."""
    parts = []
    for y in ("topk_voronoi", "hellinger"):
        ws = ms.window_sensitivity(frame, y, by="fit", model="power_log", min_span=span)
        parts.append(ws.table.assign(response=y))
    return pd.concat(parts, ignore_index=True)


def fit_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per study, truth, fit and n: replicates, converged and usable shares, routing diagnostics, cell patterns and
    median metrics."""
    floor = paper.CRITERIA["loglik_gap_floor"]
    rows = []
    for (study, truth, fit, n), g in frame.groupby(["study_part", "truth", "fit", "n"], sort=False):
        patterns = g["cell_sizes"].value_counts()
        rows.append({"study": study, "truth": truth, "fit": fit, "n": n, "replicates": len(g),
                     "converged": float(g["converged"].mean()),
                     "reached_truth_loglik": float((g["loglik_gap"] >= floor).mean()),
                     "loglik_gap_median": float(g["loglik_gap"].median()),
                     "selection_match_median": float(g["selection_match"].median()),
                     "min_selected_share_median": float(g["min_selected_share"].median()),
                     "cell_patterns": "; ".join(f"{p}: {c}" for p, c in patterns.items()),
                     "hellinger_mean": float(g["hellinger"].mean()),
                     "topk_voronoi_median": float(g["topk_voronoi"].median())})
    out = pd.DataFrame(rows)
    out["usable"] = out["reached_truth_loglik"] >= paper.CRITERIA["min_share_reaching_truth"]
    return out


def admissibility_decision(g: pd.DataFrame) -> str:
    """The pre-specified decision for one check fit (rows of all its n)."""
    by_n = g.groupby("n")
    first, last = by_n["hellinger"].mean().iloc[0], by_n["hellinger"].mean().iloc[-1]
    share = by_n["min_selected_share"].median().iloc[-1]
    if share < 0.01:
        return "abandons the split (an atom is never selected)"
    if last >= paper.CRITERIA["density_floor_ratio"] * first:
        return "stalls (the density stops converging)"
    return "converges"


def admissibility_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The check fits (and, for reference, the headline fits at the check sizes): Hellinger trend and decision."""
    rows = []
    for (truth, fit), g in frame.groupby(["truth", "fit"], sort=False):
        by_n = g.groupby("n")
        h = by_n["hellinger"].mean()
        rows.append({"truth": truth, "fit": fit, "n_min": int(h.index.min()), "n_max": int(h.index.max()),
                     "hellinger_n_min": float(h.iloc[0]), "hellinger_n_max": float(h.iloc[-1]),
                     "ratio": float(h.iloc[-1] / h.iloc[0]),
                     "loglik_gap_per_obs_n_max": float((g["loglik_gap"] / g["n"])[g["n"] == g["n"].max()].median()),
                     "selection_match_n_max": float(by_n["selection_match"].median().iloc[-1]),
                     "min_selected_share_n_max": float(by_n["min_selected_share"].median().iloc[-1]),
                     "decision": admissibility_decision(g)})
    return pd.DataFrame(rows)


def pilot_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The pilot: per start, the log-likelihood gaps and the median errors (a fit short of the maximum has a gap
    below ``CRITERIA['loglik_gap_floor']``)."""
    floor = paper.CRITERIA["loglik_gap_floor"]
    return frame.groupby(["truth", "fit", "n"], sort=False).apply(lambda g: pd.Series({
        "replicates": len(g), "short_of_truth_loglik": int((g["loglik_gap"] < floor).sum()),
        "loglik_gap_min": float(g["loglik_gap"].min()), "loglik_gap_median": float(g["loglik_gap"].median()),
        "topk_voronoi_median": float(g["topk_voronoi"].median()),
        "err_beta1_median": float(g["err_beta1_cell1"].median()),
        "err_nu_median": float(g["err_nu_cell1"].median())}), include_groups=False).reset_index()


# %% [markdown]
# ## Figure
# `rates.png`: one panel per quantity (Hellinger distance, Voronoi loss, and the errors of the gate slopes, expert
# intercepts, expert slopes and variances); per fit, the geometric mean of the replicates at each n with bars
# $\times/\div\,e^{2\,\mathrm{se}}$ and the fitted `power_log` line with its exponent and 95% interval. The `over`
# fit's errors are those of the split cell (expert 2's two atoms); the `exact` fit's those of every atom.


# %%
COLORS = {"exact": "tab:blue", "over": "tab:red"}
PANELS = [("hellinger", {"exact": "hellinger", "over": "hellinger"}, "density: expected Hellinger"),
          ("loss", {"exact": "topk_voronoi", "over": "topk_voronoi"}, "region-wise Voronoi loss"),
          ("beta1", {"exact": "err_beta1_cell1", "over": "err_beta1_cell2"}, "gate slopes (split cell for over)"),
          ("b", {"exact": "err_b_cell1", "over": "err_b_cell2"}, "expert intercepts"),
          ("a", {"exact": "err_a_cell1", "over": "err_a_cell2"}, "expert slopes"),
          ("nu", {"exact": "err_nu_cell1", "over": "err_nu_cell2"}, "noise variances")]


def _panel(ax: Any, frame: pd.DataFrame, columns: dict[str, str]) -> None:
    from matplotlib.ticker import NullFormatter

    lines = []
    for fit, y in columns.items():
        sub = frame[frame["fit"] == fit].dropna(subset=[y])
        if sub.empty:
            continue
        logs = np.log(sub[y]).groupby(sub["n"])
        ns = np.asarray(list(logs.groups), float)
        centre, se = logs.mean().to_numpy(), (logs.std() / np.sqrt(logs.size())).to_numpy()
        ax.errorbar(ns, np.exp(centre), yerr=[np.exp(centre) - np.exp(centre - 2 * se),
                                              np.exp(centre + 2 * se) - np.exp(centre)],
                    fmt="o", ms=3.5, capsize=2, color=COLORS[fit])
        row = ms.fit_rate(sub, y, model="power_log", warn=False).to_frame(details=True).iloc[0]
        grid = np.logspace(np.log10(ns.min()), np.log10(ns.max()), 50)
        ax.plot(grid, np.exp(row["intercept"] - row["exponent"] * ms.rates.regressor("power_log", grid)), "--",
                color=COLORS[fit], lw=1.2)
        theory = _theory(fit, y)[0]
        lines.append((f"{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}] (theory {theory:.3g})",
                      COLORS[fit]))
    for i, (text, color) in enumerate(lines):
        ax.text(0.03, 0.04 + 0.08 * i, text, transform=ax.transAxes, color=color,
                fontsize=fs.fontsize(ax.figure, "legend"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted(set(frame["n"]))[::2]
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, [str(int(t)) for t in ticks])


def plot_rates(frame: pd.DataFrame, path: Path, label: str) -> None:
    """The figure described above, saved to ``path``."""
    from matplotlib.lines import Line2D

    fig, axes, legend_ax = fs.subplots(3, 2, figsize=(fs.PAGE_WIDTH_IN, 11.5), legend_height=0.6)
    for ax, (_, columns, title) in zip(axes.flat, PANELS, strict=True):
        _panel(ax, frame, columns)
        fs.finish_axes(ax, title=title, xlabel="n")
        fs.finish_axes(ax, ylabel="mean distance" if title.startswith("density") else "error", raw=True)
    fits = [f for f in COLORS if f in set(frame["fit"])]
    handles = [Line2D([], [], color=COLORS[f], marker="o", ls="--") for f in fits]
    labels = {"exact": "exact: k = 3, Kbar = 2", "over": "over: k = 4, Kbar = 3, expert 2 split"}
    fs.legend_panel(legend_ax, handles, [labels[f] for f in fits], ncol=len(fits))
    reps = int(frame.groupby(["fit", "n"]).size().min())
    fs.caption(fig, f"{label}; markers: geometric mean over {reps} replicates, bars: times/divided by exp(2 se) of the "
                    "mean log value; dashed: fitted C (n / log n)^-alpha; printed: alpha [95% interval, random effects "
                    "with Knapp-Hartung] and the theory's exponent (an upper bound).")
    fs.save(fig, path)


# %%
def _run_all(studies: dict[str, ms.Study], out: Path, resume: bool, progress: bool,
             workers: int | str | dict[str, int] | None) -> tuple[pd.DataFrame, dict[str, Any]]:
    frames, timing = [], {}
    for part, study in studies.items():
        frame, timing[part] = run_study_timed(study, out / part, resume=resume, progress=progress, workers=workers)
        frames.append(frame.assign(study_part=part))
    return pd.concat(frames, ignore_index=True), timing


def run(out: str | Path, quick: bool = False, resume: bool = True, *, size: str | None = None,
        progress: bool = True, workers: int | str | dict[str, int] | None = None, **override: Any) -> pd.DataFrame:
    """Run the studies (resumable) and write results.csv, rates.csv, windows.csv, fits.csv, admissibility.csv,
    pilot.csv, theory.csv, rates.png and provenance.json into ``out`` (each study's cells in ``out/<part>/study``).

    ``size`` picks an entry of ``SIZES`` (default ``"quick"`` or ``"full"``); ``override`` replaces its entries.
    ``workers`` (default: the CPU count) runs cells in worker processes.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size = size or ("quick" if quick else "full")
    studies = make_studies(size, **override)
    frame, timing = _run_all(studies, out, resume, progress, workers)
    frame.to_csv(out / "results.csv", index=False)
    ok = successful_rows(frame)
    rates = ok[ok["study_part"] == "rates"]
    rate_table(rates).to_csv(out / "rates.csv", index=False)
    window_table(rates, WINDOW_SPAN.get(size, 0.5)).to_csv(out / "windows.csv", index=False)
    fit_table(ok).to_csv(out / "fits.csv", index=False)
    admissibility_table(ok[ok["study_part"].isin(["checks", "lambda"])]).to_csv(out / "admissibility.csv",
                                                                                index=False)
    pilot_table(ok[ok["study_part"] == "pilot"]).to_csv(out / "pilot.csv", index=False)
    theory_table().to_csv(out / "theory.csv", index=False)
    plot_rates(rates, out / "rates.png", "full size" if size == "full" else f"{size} size")
    write_provenance(out, {"vignette": NAME, "size": size, "sizes": {**SIZES[size], **override},
                           "studies": {k: s.to_dict() for k, s in studies.items()}, "seed": SEED, "timing": timing,
                           "rows": len(frame), "failed_rows": int(len(frame) - len(ok))})
    return frame


# %% [markdown]
# ## Results
# The rendered results, with the verdicts and what differs from the paper, are in `docs/vignettes/topk-moe.md`.

# %%
if __name__ == "__main__":
    import sys

    from moestat._vignette import vignette_cli

    sys.exit(vignette_cli(run, NAME))
