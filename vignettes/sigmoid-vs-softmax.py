# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Sigmoid vs softmax gating: a design that can decide
#
# Nguyen, Ho & Rinaldo (NeurIPS 2024) prove that the least-squares estimator (LSE) of an
# over-specified MoE recovers its experts faster under **sigmoid** gating than under **softmax**
# gating: in their regime 2 the over-specified atoms converge at $n^{-1/2}$ under sigmoid gating,
# against $n^{-1/4}$ (relu, gelu) and $1/\log n$ (linear) under softmax gating (their Table 1).
#
# This vignette measures that claim on **one functional for both gates**: first-order,
# mass-weighted parameter errors against the *nearest exact representation* of the true regression
# function (`ms.representation_errors`, docs/representations.md), split into the over-specified
# atoms (`over_param`) and the atoms matched to unchanged true atoms (`exact_param`), plus the
# regression-function distance `l2`. The design follows the rules of a study that can decide:
#
# * **truths** — `ms.presets.gate_comparison`: d = 3, k* = 3, gate and expert variances 1 (gates
#   vary across the input cube), every ridge expert kinked inside the cube, atoms separated; ten
#   truth draws (seeds 0-9), each used with a sigmoid and a softmax gate (same parameters, same
#   inputs and noise: paired). gelu experts are the headline (both theories' identifiability
#   conditions hold), relu the paper's own case;
# * **fits** — k = 4 atoms, the default `fit_lse` (trust-region Newton with the exact Hessian, run to
#   its gradient tolerance) from three starts: near the truth with atom 0 duplicated, k-means of the
#   data and random; box $|\theta| \le 10$;
# * **n** — 1600 to 160000 (two decades, five values): 50 observations per free parameter (P = 32) at
#   the smallest n;
# * **checks** — every fit is repeated on the same data by Levenberg-Marquardt, started where the winning Newton
#   restart started (`*_alt` columns; `ms.optimizer_invariance`). The headline uses, per row,
#   whichever of the two fits reached the lower least-squares objective (`ms.lowest_objective`,
#   `*_best` columns: the better approximation of the estimator); each solver's own rates are the
#   sensitivity check. Every rate carries its curvature test, window table and verdict, with truth
#   as the resampling unit of every interval (`units="truth_seed"`).
#
# Run: `moestat vignette run sigmoid-vs-softmax --out out/sigmoid-vs-softmax` (add `--quick` for the
# reduced size: gelu only, five truths, one decade).

# %%
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

import moestat as ms
from moestat._vignette import run_study_timed
from moestat.diagnostics import solver_rate_tables
from moestat.provenance import write_provenance

NAME = "sigmoid-vs-softmax"
TITLE = "Sigmoid vs softmax gating on one functional: exact representations, converged LSE, ten truths"

SIZES: dict[str, dict[str, Any]] = {
    # the rendered study: two decades, ten truths (about 25 minutes with two worker processes on 2 CPU cores)
    "full": {"n": [1600, 5060, 16000, 50600, 160000], "seeds": list(range(10)), "experts": ["gelu", "relu"]},
    # the secondary linear-expert study (same design; rendered separately, its own time on the page)
    "linear": {"n": [1600, 5060, 16000, 50600, 160000], "seeds": list(range(10)), "experts": ["linear"]},
    # the README's main job: one decade, five truths (the fewest the unit bootstrap accepts), gelu
    "quick": {"n": [1600, 2850, 5060, 9000, 16000], "seeds": [0, 1, 2, 3, 4], "experts": ["gelu"]},
}
SEED = 2026
D = 3
BOX = 10.0
STARTS = ["near_truth", "kmeans", "random"]
RESPONSES = ["over_param", "exact_param", "l2"]
UNITS = "truth_seed"


def make_study(size: str = "full", **override: Any) -> ms.Study:
    """The study at a size of ``SIZES``; ``override`` replaces n, seeds, experts, max_iter or starts."""
    cfg = {"max_iter": 400, "starts": STARTS, **SIZES[size], **override}
    return ms.Study(
        name=f"{NAME}-{size}",
        truth={"preset": "gate_comparison", "d": D, "stream": "{expert}-{seed}",
               "grid": {"expert": cfg["experts"], "truth_gate": ["sigmoid", "softmax"], "seed": cfg["seeds"]}},
        fit={"label": "lse", "estimator": "lse", "k": "truth+1",
             "options": {"init": list(cfg["starts"]), "box": BOX, "max_iter": cfg["max_iter"],
                         "invariance": {"optimizer": "lm", "max_iter": cfg["max_iter"] + 100,
                                            "starts": "best"}}},
        n=cfg["n"], reps=1, metrics=["representation", "l2"], seed=SEED, threads=1,
        description="sigmoid vs softmax gating on representation errors: gate_comparison truths, k = k* + 1",
    )


# %% [markdown]
# ## Rates, comparison and checks
#
# Every exponent is `ms.fit_rate` with `units="truth_seed"`: the unit bootstrap resamples whole
# truths, so a truth that is easy (or hard) at every n moves its whole profile, not one cell. The
# gate comparison is `ms.compare_rates(..., paired=True, units="truth_seed")` (both gates see the
# same truth parameters and data). Each rate row has its `verdict`; each comparison row says which
# gate is faster or why the data cannot tell.


# %%


def rate_tables(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(rates with verdicts, windows, paired gate comparison) for every response and solver, per expert and gate.

    ``solver`` is ``"lowest objective"`` (per row, the fit of whichever solver reached the lower objective:
    the headline), ``"newton"`` (the default ``fit_lse``) or ``"lm"`` (the invariance refit)."""
    out, windows, comparisons = solver_rate_tables(frame, RESPONSES, between="gate", levels=["sigmoid", "softmax"],
                                                   units=UNITS)
    out["theory"] = [ms.predicted_rate(g, e, r, regime=2)
                     for g, e, r in zip(out["gate"], out["expert"], out["response"], strict=True)]
    return out, windows, comparisons


def design_table(size_cfg: dict[str, Any], basin: bool = True) -> pd.DataFrame:
    """``ms.design_check`` on the study's truths (observations per parameter, decades, truths, basin gaps)."""
    truths = [ms.presets.gate_comparison(e, truth_gate=g, d=D, seed=s)
              for e in size_cfg["experts"] for g in ("sigmoid", "softmax") for s in size_cfg["seeds"]]
    return ms.design_check(truths, size_cfg["n"], min_truths=10, basin=basin)


def start_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Which start and which solver won, and the representation nearest to the reported (lowest-objective) fit."""
    rep = frame["representation"].where(frame["solver_best"] != "lm", frame["representation_alt"])
    fam = rep.astype(str).str.split(" ").str[0]
    return (frame.assign(family=fam).groupby(["expert", "gate", "solver_best", "best_start", "family"]).size()
            .rename("fits").reset_index())


# %% [markdown]
# ## Figures
# `rates.png`: one panel per expert and functional, each truth's profile (thin) and the median over
# truths (thick), both gates, with the fitted exponent and its verdict in the legend; the fits are the
# lowest-objective ones (per row, whichever solver reached the lower least-squares objective).
# `invariance.png`: the Newton fit's errors against the Levenberg-Marquardt fit's on the same data.


# %%
COLORS = {"sigmoid": "tab:blue", "softmax": "tab:green"}


def plot_rates(frame: pd.DataFrame, rates: pd.DataFrame, path: Path, label: str) -> None:
    ms.rates.plots.plot_unit_profiles(frame, rates, RESPONSES, hue="gate", units=UNITS, colors=COLORS,
                                      hue_label="{}", label=label, path=path)


def plot_invariance(frame: pd.DataFrame, path: Path, label: str) -> None:
    ms.rates.plots.plot_invariance(frame, RESPONSES, hue="gate", colors=COLORS, hue_label="{}", label=label,
                                   path=path)


# %%
def run(out: str | Path, quick: bool = False, resume: bool = True, *, size: str | None = None,
        progress: bool = True, workers: int | str | dict[str, int] | None = None, basin: bool | None = None,
        **override: Any) -> pd.DataFrame:
    """Run the study (resumable) and write results.csv, rates.csv, windows.csv, comparison.csv,
    invariance.csv, design.csv, starts.csv, rates.png, invariance.png and provenance.json.

    ``size`` picks an entry of ``SIZES`` (default ``"quick"`` or ``"full"``); ``override`` replaces ``n``,
    ``seeds``, ``experts``, ``max_iter`` or ``starts``.  ``workers`` (default: the CPU count) runs cells in
    worker processes.  ``basin`` runs the basin-gap part of the design check (a noise-free fit per sigmoid-gated
    gelu truth, about a minute each; default: at the full sizes only).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size = size or ("quick" if quick else "full")
    cfg = {**SIZES[size], **override}
    study = make_study(size, **override)
    frame, timing = run_study_timed(study, out, resume=resume, progress=progress, workers=workers)
    frame = ms.lowest_objective(frame, RESPONSES, names=("newton", "lm"))
    frame.to_csv(out / "results.csv", index=False)
    rates, windows, comparison = rate_tables(frame)
    rates.to_csv(out / "rates.csv", index=False)
    windows.to_csv(out / "windows.csv", index=False)
    comparison.to_csv(out / "comparison.csv", index=False)
    inv = ms.optimizer_invariance(frame, RESPONSES, by=["expert", "gate"], units=UNITS, n_resamples=1000, seed=0)
    inv.to_csv(out / "invariance.csv", index=False)
    design_table(cfg, basin=size != "quick" if basin is None else basin).to_csv(out / "design.csv", index=False)
    start_table(frame).to_csv(out / "starts.csv", index=False)
    label = size if size != "full" else "full size"
    plot_rates(frame, rates, out / "rates.png", label)
    plot_invariance(frame, out / "invariance.png", label)
    write_provenance(out, {"vignette": NAME, "size": size, "sizes": cfg, "study": study.to_dict(), "seed": SEED,
                           "d": D, "box": BOX, "timing": timing, "rows": len(frame)})
    return frame


# %% [markdown]
# ## Results
# The rendered results, with the answer the data support, are in `docs/vignettes/sigmoid-vs-softmax.md`.

# %%
if __name__ == "__main__":
    import sys

    from moestat._vignette import vignette_cli

    sys.exit(vignette_cli(run, NAME))
