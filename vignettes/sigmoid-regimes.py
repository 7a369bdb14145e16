# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Sigmoid gating in regimes 1 and 2: a design that can decide
#
# Nguyen, Ho & Rinaldo (NeurIPS 2024) split an over-specified sigmoid-gated MoE by the true gate slope of
# the atom that gets the extra fitted expert. In **regime 1** that slope is zero (the atom's gate
# $\sigma(\beta^*_0)$ is constant) and, for strongly identifiable experts such as gelu, the over-specified
# atoms converge at $n^{-1/4}$ (their Theorem 2); in **regime 2** it is not zero and the over-specified
# atoms converge at $n^{-1/2}$ (Theorem 5). Their Figure 2 shows the two regimes on d = 32, k* = 8 truths.
#
# This vignette measures the claim on the design of the sigmoid-vs-softmax vignette, which passes the
# design checks (docs/diagnostics.md), with **one functional for both regimes**: mass-weighted first-order
# errors against the nearest exact representation of the true regression function
# (`ms.representation_errors`): `over_param` (the atoms a representation adds or changes), `exact_param`
# (atoms matched to unchanged true atoms) and `l2` $= \|f_{\hat G} - f_{G^*}\|_{L^2(\mu)}$.
#
# * **truths** — `ms.presets.gate_comparison(regime=r)`, d = 3, k* = 3, sigmoid gate, gate and expert
#   variances 1; in regime 1 atom 0's gate slope is zeroed, in regime 2 it is kept; atom 0 is the one
#   duplicated. Ten truth draws (seeds 0-9); both regimes of a seed share every other parameter, the
#   inputs and the noise (paired). gelu experts are the headline (strongly identifiable: Theorem 2 applies
#   in regime 1), relu the paper's case (Theorem 2 does not apply to a zero-slope relu atom);
# * **fits** — k = 4, the default `fit_lse` (trust-region Newton to its gradient tolerance) from three
#   starts (near the truth with atom 0 duplicated, k-means, random), box $|\theta| \le 10$; every fit
#   repeated by Levenberg-Marquardt; per row the lower objective is reported (`*_best`);
# * **n** — 1600 to 160000 (two decades); 50 observations per free parameter at the smallest n;
# * **checks** — each rate's curvature test, window table and verdict, with truth as the resampling unit
#   (`units="truth_seed"`); optimiser invariance; the regime comparison paired over truths.
#
# Run: `moestat vignette run sigmoid-regimes --out out/sigmoid-regimes` (add `--quick` for gelu only,
# five truths, one decade).

# %%
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

import moestat as ms
from moestat._vignette import run_study_timed
from moestat.diagnostics import solver_rate_tables
from moestat.provenance import write_provenance

NAME = "sigmoid-regimes"
TITLE = "Sigmoid gating, regime 1 vs regime 2 on one functional: exact representations, converged LSE, ten truths"

SIZES: dict[str, dict[str, Any]] = {
    # the rendered study: two decades, ten truths, gelu and relu
    "full": {"n": [1600, 5060, 16000, 50600, 160000], "seeds": list(range(10)), "experts": ["gelu", "relu"]},
    # gelu, one decade, five truths (the fewest the unit bootstrap accepts)
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
        truth={"preset": "gate_comparison", "d": D, "truth_gate": "sigmoid", "stream": "{expert}-{seed}",
               "grid": {"expert": cfg["experts"], "regime": [1, 2], "seed": cfg["seeds"]}},
        fit={"label": "lse", "estimator": "lse", "k": "truth+1",
             "options": {"init": list(cfg["starts"]), "box": BOX, "max_iter": cfg["max_iter"],
                         "invariance": {"optimizer": "lm", "max_iter": cfg["max_iter"] + 100}}},
        n=cfg["n"], reps=1, metrics=["representation", "l2"], seed=SEED, threads=1,
        description="sigmoid gating, regime 1 (zero-slope atom duplicated) vs regime 2: gate_comparison truths",
    )


# %% [markdown]
# ## Rates, comparison and checks
# Every exponent is `ms.fit_rate(..., units="truth_seed")`; the regime comparison is
# `ms.compare_rates(..., between="truth_regime", paired=True)` with `difference` = regime 2 − regime 1
# (positive: regime 2 faster, the theory's direction for the over-specified atoms).


# %%
def rate_tables(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(rates with verdicts and the theory's rate, windows, paired regime comparison), every response and solver."""
    out, windows, comparisons = solver_rate_tables(frame, RESPONSES, between="truth_regime", levels=[2, 1],
                                                   units=UNITS)
    out["theory"] = [ms.predicted_rate("sigmoid", e, r, regime=g)
                     for e, r, g in zip(out["expert"], out["response"], out["truth_regime"], strict=True)]
    return out, windows, comparisons


def design_table(size_cfg: dict[str, Any]) -> pd.DataFrame:
    """``ms.design_check`` on the study's truths (the basin gaps of regime-2 gelu truths take about a minute each)."""
    truths = [ms.presets.gate_comparison(e, truth_gate="sigmoid", d=D, seed=s, regime=r)
              for e in size_cfg["experts"] for r in (1, 2) for s in size_cfg["seeds"]]
    return ms.design_check(truths, size_cfg["n"], min_truths=10, basin=len(size_cfg["seeds"]) >= 10)


# %% [markdown]
# ## Figures
# `rates.png`: one panel per expert and functional, each truth's profile (thin) and the median over
# truths (thick), both regimes, with the fitted exponent and its verdict in the legend (lowest-objective
# fits). `invariance.png`: the Newton fit's errors against the Levenberg-Marquardt fit's on the same data.


# %%
COLORS = {1: "tab:orange", 2: "tab:blue"}


def plot_rates(frame: pd.DataFrame, rates: pd.DataFrame, path: Path, label: str) -> None:
    ms.rates.plots.plot_unit_profiles(frame, rates, RESPONSES, hue="truth_regime", units=UNITS, colors=COLORS,
                                      hue_label="regime {}", label=label, path=path)


def plot_invariance(frame: pd.DataFrame, path: Path, label: str) -> None:
    ms.rates.plots.plot_invariance(frame, RESPONSES, hue="truth_regime", colors=COLORS, hue_label="regime {}",
                                   label=label, path=path)


# %%
def run(out: str | Path, quick: bool = False, resume: bool = True, *, size: str | None = None,
        progress: bool = True, workers: int | str | dict[str, int] | None = None, **override: Any) -> pd.DataFrame:
    """Run the study (resumable) and write results.csv, rates.csv, windows.csv, comparison.csv,
    invariance.csv, design.csv, rates.png, invariance.png and provenance.json.

    ``size`` picks an entry of ``SIZES`` (default ``"quick"`` or ``"full"``); ``override`` replaces ``n``,
    ``seeds``, ``experts``, ``max_iter`` or ``starts``.  ``workers`` (default: the CPU count) runs cells in
    worker processes.
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
    inv = ms.optimizer_invariance(frame, RESPONSES, by=["expert", "truth_regime"], units=UNITS, n_resamples=1000,
                                  seed=0)
    inv.to_csv(out / "invariance.csv", index=False)
    design_table(cfg).to_csv(out / "design.csv", index=False)
    label = size if size != "full" else "full size"
    plot_rates(frame, rates, out / "rates.png", label)
    plot_invariance(frame, out / "invariance.png", label)
    write_provenance(out, {"vignette": NAME, "size": size, "sizes": cfg, "study": study.to_dict(), "seed": SEED,
                           "d": D, "box": BOX, "timing": timing, "rows": len(frame)})
    return frame


# %% [markdown]
# ## Results
# The rendered results, with the answer the data support, are in `docs/vignettes/sigmoid-regimes.md`.

# %%
if __name__ == "__main__":
    import sys

    from moestat._vignette import vignette_cli

    sys.exit(vignette_cli(run, NAME))
