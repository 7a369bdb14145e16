# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Cosine vs perturbed cosine router: least-squares rates of the regression function and of the parameters
#
# Nguyen, Akbarian, Pham, Nguyen, Zhang & Ho (ICLR 2025, "Statistical advantages of perturbing cosine router in
# mixture of experts", arXiv:2405.14131) study the least-squares estimator (LSE) of an MoE regression whose router
# scores are cosines, $\beta_{0i} + \beta_{1i}^\top x/(\lVert\beta_{1i}\rVert\lVert x\rVert)$, or *perturbed*
# cosines, with small constants added to both norms. They prove that
#
# * the regression function converges at $(\log n/n)^{1/2}$ in $L^2(\mu)$ under both routers;
# * under the cosine router the parameters and experts can converge as slowly as $O(1/\log^{\tau} n)$ (a minimax
#   lower bound slower than every polynomial; $\tau > 0$ is not given), because the router's scores do not depend on
#   $\lVert\beta_1\rVert$ (the PDE $\beta_1^\top\partial u/\partial\beta_1 = 0$);
# * under the perturbed router with strongly identifiable experts the rates are polynomial, from
#   $(\log n/n)^{1/4}$ (over-specified Voronoi cells) to $(\log n/n)^{1/2}$ (exact-specified atoms).
#
# The rates are the rows of `moestat.papers.nguyen2025_cosine.THEORY`; this vignette measures the $k = k^*$ part of
# them with `moestat.Study`, and asks whether its design could tell $1/\log^{\tau} n$ from a slow power at all.
#
# ## Pre-specified design (fixed before any run)
#
# * **Truths** — `nguyen2025_cosine.cosine_router_truth(gate)`: $d = 2$, $k^* = 2$ gelu experts, inputs
#   $U[-1, 1]^2$, noise sd 0.1, gate vectors 90° apart (moestat's stand-in: the paper's own simulation values could
#   not be read). One parameter set, three routers: `cosine`, `perturbed_cosine` ($\varepsilon = 0.1$ on both
#   norms) and `softmax` (the linear router, a reference). The three truths share one data stream (same inputs and
#   noise draws), so the routers are compared on paired data.
# * **Fits** — `fit_lse` with the truth's own router and $k = k^* = 2$; starts `near_truth` (jitter 0.05) and
#   `random`, the lower objective wins; L-BFGS (`tol` $10^{-15}$, `gtol` $10^{-9}$, at most 3000 iterations). L-BFGS
#   reaches the same objective as the trust-region Newton fit here at a hundredth of the time (the cosine routers run
#   on the autograd path).
# * **n and replicates** — `quick`: seven n from 1000 to 31623 (1.5 decades), 20 replicates per cell; `full`: nine
#   n from 1000 to 100000 (two decades), 40 replicates. Seed 2025.
# * **Metrics** — `l2` ($\lVert f_{\hat G} - f_{G^*}\rVert_{L^2(\mu)}$, 20000 Monte-Carlo inputs) and the
#   matched-atom errors of `nguyen2025_cosine.router_error_metric` (atoms matched one to one; the router's
#   invariances removed): `err_exact_gate_bias`, `err_exact_gate_slope` (the *identified* slope, centred at the
#   reference atom: the direction $\beta_1/\lVert\beta_1\rVert$ for the cosine router,
#   $\beta_1/(\lVert\beta_1\rVert + \varepsilon)$ for the perturbed one, $\beta_1$ for softmax),
#   `err_exact_expert`, `err_exact_param` (all of an atom's
#   identified differences) and, for the cosine router, `err_exact_gate_norm` ($|\lVert\hat\beta_1\rVert -
#   \lVert\beta^*_1\rVert|$, the part its scores ignore).
# * **Analysis** — `ms.fit_rate` by router (random-effects meta-regression of the per-n mean log error) under the
#   `power`, `power_log` and `inverse_log` models, with verdicts; `ms.compare_models` (AIC of the three models, the
#   way a $1/\log^{\tau}$ rate would show); `ms.window_sensitivity` (one-decade windows, `power_log`);
#   `ms.design_check`; and a **discrimination check**: frames simulated by `ms.rates.simulate_rate_frame` from
#   $y \propto (\log n)^{-\tau}$ ($\tau$ = 0.5, 1, 2) and from the power law with the same average slope, on this
#   design's n grid and replicate count with the replicate spread measured in the data, each scored by
#   `ms.compare_models`.
# * **Decision rule** — a response with a polynomial theory rate $e$ (`l2`; the perturbed router's parameters,
#   $e = 1/2$ at $k = k^*$) *agrees* when its `power_log` interval covers $e$ and its verdict is `power law` or
#   `imprecise`; *faster* / *slower* when the interval lies above / below $e$. A cosine parameter error *shows a
#   polynomial rate* when its `power` verdict is `power law` with a lower bound above 0. The design *can
#   discriminate* $1/\log^{\tau} n$ from a slow power when `compare_models` picks the true model by an AIC margin
#   of at least 2 in at least 80% of the simulated frames of both kinds.
#
# Run: `moestat vignette run cosine-router --quick --out out/cosine-router` (quick) or without `--quick` (full).

# %%
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import moestat as ms
from moestat import figstyle as fs
from moestat._vignette import run_study_timed
from moestat.papers import nguyen2025_cosine as paper
from moestat.provenance import write_provenance
from moestat.study import successful_rows

NAME = "cosine-router"
TITLE = "Cosine vs perturbed cosine router: least-squares rates of the regression function and the parameters"

SEED = 2025
GATES = list(paper.GATES)
EXPERT = "gelu"
METRIC = "moestat.papers.nguyen2025_cosine:router_error_metric"
RESPONSES = ["l2", "err_exact_param", "err_exact_gate_slope", "err_exact_gate_bias", "err_exact_expert"]
NORM = "err_exact_gate_norm"
"""The cosine router's unidentified slope norm (NaN for the other routers)."""
MODELS = ["power", "power_log", "inverse_log"]
STARTS = ["near_truth", "random"]
FIT_OPTIONS: dict[str, Any] = {"init": STARTS, "optimizer": "lbfgs", "max_iter": 3000, "tol": 1e-15, "gtol": 1e-9,
                               "condition": False}
TAUS = (0.5, 1.0, 2.0)
"""The exponents tau of the 1/log^tau profiles of the discrimination check."""
DECISIVE_AIC = 2.0
DECISIVE_SHARE = 0.8

SIZES: dict[str, dict[str, Any]] = {
    # two decades, 40 replicates (not run for the rendered page: about an hour on 2 CPU cores)
    "full": {"n": [1000, 1778, 3162, 5623, 10000, 17783, 31623, 56234, 100000], "reps": 40, "studies": 400},
    # 1.5 decades, 20 replicates: minutes on 2 CPU cores
    "quick": {"n": [1000, 1778, 3162, 5623, 10000, 17783, 31623], "reps": 20, "studies": 200},
    # the smoke test: seconds
    "tiny": {"n": [300, 600, 1200], "reps": 3, "studies": 20},
}

ADEMP = {
    "aims": "Measure the least-squares convergence rates of a cosine-router and a perturbed-cosine-router MoE "
            "(Nguyen et al., ICLR 2025) at k = k*, and whether the design can tell 1/log^tau n from a slow power.",
    "data_generating_mechanisms": "d = 2, k* = 2 gelu experts, inputs U[-1,1]^2, noise sd 0.1; one parameter set "
                                  "(nguyen2025_cosine.PARAMS) with a cosine, a perturbed cosine (eps = 0.1) and a "
                                  "softmax router, on shared inputs and noise.",
    "estimands": ["L2(mu) distance of the regression function",
                  "matched-atom errors of the identified parameters (intercepts, slopes, experts, all)",
                  "the cosine router's slope norm (not identified)",
                  "the exponent alpha of E log error ~ c - alpha u(n), u = log n, log(n/log n), log log n"],
    "methods": ["fit_lse with the truth's router, k = 2, starts near_truth and random, L-BFGS"],
    "performance_measures": ["rate exponents with 95% intervals, curvature tests, window drift and verdicts",
                             "AIC of the power, power_log and inverse_log models",
                             "share of simulated frames on which the AIC picks the true model"],
}


def truth_entry(gate: str) -> dict[str, Any]:
    """The study's truth entry of ``gate``: :func:`nguyen2025_cosine.cosine_router_truth` as an explicit model."""
    truth = paper.cosine_router_truth(gate, EXPERT)
    spec = truth.spec
    return {"label": gate, "gate": gate, "expert": spec.expert, "k": spec.k, "d": spec.d, "noise_sd": spec.noise_sd,
            "params": {key: list(np.asarray(value).tolist()) for key, value in paper.PARAMS.items()},
            "inputs": "uniform", "stream": "paired"}


def make_study(size: str = "full", **override: Any) -> ms.Study:
    """The study at a size of ``SIZES``; ``override`` replaces ``n`` or ``reps``."""
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not a size of this vignette; valid sizes are {sorted(SIZES)}.")
    cfg = {**SIZES[size], **override}
    return ms.Study(name=f"{NAME}-{size}", truth=[truth_entry(g) for g in GATES],
                    fit={"label": "lse", "estimator": "lse", "k": "truth", "options": dict(FIT_OPTIONS)},
                    n=list(cfg["n"]), reps=int(cfg["reps"]), metrics=["l2", METRIC], seed=SEED, threads=1,
                    ademp=ADEMP, description="LSE rates of cosine, perturbed cosine and softmax routers at k = k*")


def make_studies(size: str = "full", **override: Any) -> dict[str, ms.Study]:
    """The vignette's studies by output folder: one, ``{"study": make_study(size)}``."""
    return {"study": make_study(size, **override)}


# %% [markdown]
# ## Rates, model comparison and checks
#
# `rates.csv`: one row per router, response and rate model, with the interval, verdict, the paper's rate
# (`ms.predicted_rate`) and the decision of the rule above. `models.csv`: `ms.compare_models` (AIC, Akaike
# weights, curvature). `windows.csv`: the `power_log` exponent as the smallest or largest n are dropped.
# `design.csv`: `ms.design_check`. `discrimination.csv`: the simulated check, for the design that ran and (when
# that was not the full size) for the full size's n grid and replicates, both with the replicate spread measured
# in the run.


# %%
RATE_COLS = ["model", "exponent", "se", "ci_low", "ci_high", "verdict", "curvature_p", "best_model", "delta_aic",
             "window_consistent", "window_drift", "tau2", "n_values", "replicates"]


def _theory(gate: str, response: str) -> tuple[str, float, str]:
    """(rate as printed, exponent, kind) of the paper's row for ``gate`` and ``response`` ('' / NaN if none)."""
    tab = ms.theory_rates()
    hit = tab[(tab["source"] == "nguyen2025_cosine") & (tab["gate"] == gate) & (tab["response"] == response)]
    if hit.empty:
        return "", np.nan, ""
    row = hit.iloc[0]
    return str(row["rate"]), float(row["exponent"]), str(row["kind"])


def decide(row: pd.Series) -> str:
    """The pre-specified decision for one rate row (see the design)."""
    if row["response"] == NORM:
        return "identified: decays" if row["verdict"] == "power law" else f"not identified ({row['verdict']})"
    if row["kind"] == "slower_than_polynomial":
        if row["model"] != "power":
            return ""
        polynomial = row["verdict"] == "power law" and row["ci_low"] > 0
        return "polynomial rate" if polynomial else f"no polynomial rate shown ({row['verdict']})"
    if not np.isfinite(row["theory_exponent"]) or row["model"] != "power_log":
        return ""
    if row["verdict"] in ("range too narrow", "no decay", "curved: exponent is local"):
        return f"undecided ({row['verdict']})"
    if row["ci_low"] > row["theory_exponent"]:
        return "faster than theory"
    if row["ci_high"] < row["theory_exponent"]:
        return "slower than theory"
    return "agrees"


def rate_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``fit_rate`` of every response by router under the three models, with the paper's rate and the decision."""
    parts = []
    for y in [*RESPONSES, NORM]:
        sub = frame[frame["gate"] == "cosine"] if y == NORM else frame
        res = ms.fit_rate(sub, y, by="gate", model=MODELS, warn=False)
        tab = res.to_frame(details=True)
        parts.append(tab[["gate", *[c for c in RATE_COLS if c in tab.columns]]].assign(response=y))
    out = pd.concat(parts, ignore_index=True)
    theory = [_theory(g, r) for g, r in zip(out["gate"], out["response"], strict=True)]
    out["theory"] = [t[0] for t in theory]
    out["theory_exponent"] = [t[1] for t in theory]
    out["kind"] = [t[2] for t in theory]
    out["decision"] = [decide(row) for _, row in out.iterrows()]
    return out[["gate", "response", *[c for c in out.columns if c not in ("gate", "response")]]]


def model_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``ms.compare_models`` (power, power_log, inverse_log) by router, for every response."""
    parts = []
    for y in [*RESPONSES, NORM]:
        sub = frame[frame["gate"] == "cosine"] if y == NORM else frame
        parts.append(ms.compare_models(sub, y, by="gate", models=MODELS).assign(response=y))
    out = pd.concat(parts, ignore_index=True)
    return out[["gate", "response", *[c for c in out.columns if c not in ("gate", "response")]]]


def window_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``ms.window_sensitivity`` of the ``power_log`` exponent by router (one-decade windows), one row per window."""
    parts = []
    for y in RESPONSES:
        ws = ms.window_sensitivity(frame, y, by="gate", model="power_log", min_span=1.0)
        parts.append(ws.table.assign(response=y))
    return pd.concat(parts, ignore_index=True)


def design_table(size_cfg: dict[str, Any]) -> pd.DataFrame:
    """``ms.design_check`` on the three truths (observations per parameter, decades, truths; no basin gaps: those
    concern split atoms of over-specified fits)."""
    truths = [paper.cosine_router_truth(g, EXPERT) for g in GATES]
    return ms.design_check(truths, size_cfg["n"], k=2, basin=False)


def log_spread(frame: pd.DataFrame) -> float:
    """Median over routers, parameter responses and n of the standard deviation of log error across replicates:
    the replicate noise the discrimination check simulates."""
    cols = [c for c in RESPONSES if c != "l2"]
    sds = [np.log(frame[c]).groupby([frame["gate"], frame["n"]]).std() for c in cols]
    return float(np.nanmedian(pd.concat(sds).to_numpy()))


def _decisive(models: pd.DataFrame, truth_model: str) -> pd.Series:
    """Per simulated study: the true model has the lowest AIC and the other is at least ``DECISIVE_AIC`` worse."""
    wide = models.pivot(index="study", columns="model", values="delta_aic")
    other = "power" if truth_model == "inverse_log" else "inverse_log"
    return (wide[truth_model] == 0) & (wide[other] >= DECISIVE_AIC)


def discrimination_table(ns: Sequence[int], reps: int, sigma: float, studies: int, seed: int = SEED
                         ) -> pd.DataFrame:
    """Can this n grid and replicate count tell :math:`(\\log n)^{-\\tau}` from a power law?

    For each :math:`\\tau` of ``TAUS``: ``studies`` frames from ``y = 2 (log n)^-tau`` times log-normal noise of sd
    ``sigma`` (``ms.simulate_rate_frame``), and as many from the power law whose exponent is the average power
    exponent fitted to the first kind; each frame is scored by ``ms.compare_models`` (power vs inverse_log).
    Columns: ``tau``, ``power_exponent`` (the apparent power exponent of the log profile), ``share_log_detected``
    and ``share_power_detected`` (the true model wins by ``DECISIVE_AIC``), ``discriminates`` (both shares at least
    ``DECISIVE_SHARE``), and the design."""
    rows = []
    for i, tau in enumerate(TAUS):
        log_frame = ms.rates.simulate_rate_frame(tau, ns, reps, model="inverse_log", studies=studies, sigma=sigma,
                                           seed=seed + 2 * i)
        log_models = ms.compare_models(log_frame, "y", by="study", models=("power", "inverse_log"))
        alpha = float(log_models.loc[log_models["model"] == "power", "exponent"].mean())
        pow_frame = ms.rates.simulate_rate_frame(alpha, ns, reps, model="power", studies=studies, sigma=sigma,
                                           seed=seed + 2 * i + 1)
        pow_models = ms.compare_models(pow_frame, "y", by="study", models=("power", "inverse_log"))
        share_log = float(_decisive(log_models, "inverse_log").mean())
        share_pow = float(_decisive(pow_models, "power").mean())
        rows.append({"tau": tau, "power_exponent": alpha, "share_log_detected": share_log,
                     "share_power_detected": share_pow,
                     "discriminates": bool(min(share_log, share_pow) >= DECISIVE_SHARE),
                     "n_min": int(min(ns)), "n_max": int(max(ns)), "n_values": len(ns), "reps": reps,
                     "sigma": sigma, "studies": studies})
    return pd.DataFrame(rows)


# %% [markdown]
# ## Figure
# `rates.png`: one panel per response; per router, the geometric mean of the replicate errors at each n with bars
# $\times/\div\,e^{2\,\mathrm{se}}$ (se: the standard error of the mean log error) and the fitted `power_log`
# line, its exponent and 95% interval printed in the panel; the last panel is the cosine router's slope norm
# (`power` line), which its scores ignore.


# %%
COLORS = {"cosine": "tab:red", "perturbed_cosine": "tab:blue", "softmax": "tab:gray"}
TITLES = {"l2": "regression function", "err_exact_param": "all parameters of an atom",
          "err_exact_gate_slope": "router slope (identified part)", "err_exact_gate_bias": "router intercept",
          "err_exact_expert": "expert parameters", NORM: "cosine router: slope norm"}
YLABELS = {"err_exact_param": r"$\max_j \|\Delta\theta_j\|$", "err_exact_gate_slope": r"$\max_j \|\Delta u_j\|$",
           NORM: r"$\max_j |\,\|\hat\beta_{1j}\| - \|\beta^*_{1j}\|\,|$"}


def _panel(ax: Any, frame: pd.DataFrame, y: str, model: str) -> None:
    """Per-n geometric means with +-2 se bars and the fitted line of ``model`` for every router in ``frame``."""
    res = ms.fit_rate(frame, y, by="gate", model=model, warn=False).to_frame(details=True).set_index("gate")
    lines = []
    for gate, sub in frame.groupby("gate", sort=False):
        logs = np.log(sub[y]).groupby(sub["n"])
        ns = np.asarray(list(logs.groups), float)
        centre, se = logs.mean().to_numpy(), (logs.std() / np.sqrt(logs.size())).to_numpy()
        ax.errorbar(ns, np.exp(centre), yerr=[np.exp(centre) - np.exp(centre - 2 * se),
                                              np.exp(centre + 2 * se) - np.exp(centre)],
                    fmt="o", ms=3.5, capsize=2, color=COLORS[gate])
        row = res.loc[gate]
        grid = np.logspace(np.log10(ns.min()), np.log10(ns.max()), 50)
        ax.plot(grid, np.exp(row["intercept"] - row["exponent"] * ms.rates.regressor(model, grid)), "--",
                color=COLORS[gate], lw=1.2)
        lines.append((f"{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]", COLORS[gate]))
    for i, (text, color) in enumerate(lines):
        ax.text(0.03, 0.04 + 0.075 * i, text, transform=ax.transAxes, color=color,
                fontsize=fs.fontsize(ax.figure, "legend"))
    ax.set_xscale("log")
    ax.set_yscale("log")


def plot_rates(frame: pd.DataFrame, path: Path, label: str) -> None:
    """The figure described above, saved to ``path``."""
    from matplotlib.lines import Line2D

    fig, axes, legend_ax = fs.subplots(3, 2, figsize=(fs.PAGE_WIDTH_IN, 11.5), legend_height=0.6)
    for ax, y in zip(axes.flat, [*RESPONSES, NORM], strict=True):
        sub = frame[frame["gate"] == "cosine"] if y == NORM else frame
        _panel(ax, sub, y, "power" if y == NORM else "power_log")
        fs.finish_axes(ax, title=TITLES[y], xlabel="n")
        fs.finish_axes(ax, ylabel=YLABELS.get(y, y), raw=y in YLABELS)
    gates = [g for g in COLORS if g in set(frame["gate"])]
    handles = [Line2D([], [], color=COLORS[g], marker="o", ls="--") for g in gates]
    fs.legend_panel(legend_ax, handles, [g.replace("_", " ") + " router" for g in gates], ncol=len(gates))
    reps = int(frame.groupby(["gate", "n"]).size().min())
    fs.caption(fig, f"{label}; markers: geometric mean over at least {reps} replicates, bars: times/divided by "
                    "exp(2 se) of the mean log error; dashed: fitted C (n / log n)^-alpha (C n^-alpha for the slope "
                    "norm); printed: alpha [95% interval, random effects with Knapp-Hartung], one line per router.")
    fs.save(fig, path)


# %%
def run(out: str | Path, quick: bool = False, resume: bool = True, *, size: str | None = None,
        progress: bool = True, workers: int | str | dict[str, int] | None = None, **override: Any) -> pd.DataFrame:
    """Run the study (resumable) and write results.csv, rates.csv, models.csv, windows.csv, design.csv,
    discrimination.csv (for this size and the full size), rates.png and provenance.json into ``out`` (the study's
    cells in ``out/study``).

    ``size`` picks an entry of ``SIZES`` (default ``"quick"`` or ``"full"``); ``override`` replaces ``n``, ``reps``
    or ``studies`` (simulated frames per tau of the discrimination check).  ``workers`` (default: the CPU count)
    runs cells in worker processes.
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
    rate_table(ok).to_csv(out / "rates.csv", index=False)
    model_table(ok).to_csv(out / "models.csv", index=False)
    window_table(ok).to_csv(out / "windows.csv", index=False)
    design_table(cfg).to_csv(out / "design.csv", index=False)
    sigma = log_spread(ok)
    designs = {size: cfg} if size == "full" else {size: cfg, "full": SIZES["full"]}
    pd.concat([discrimination_table(d["n"], int(d["reps"]), sigma, int(cfg["studies"])).assign(design=name)
               for name, d in designs.items()], ignore_index=True).to_csv(out / "discrimination.csv", index=False)
    plot_rates(ok, out / "rates.png", "full size" if size == "full" else f"{size} size")
    write_provenance(out, {"vignette": NAME, "size": size, "sizes": cfg, "study": study.to_dict(), "seed": SEED,
                           "timing": timing, "rows": len(frame), "failed_rows": int(len(frame) - len(ok)),
                           "log_spread": sigma})
    return frame


# %% [markdown]
# ## Results
# The rendered results, with what the data show, are in `docs/vignettes/cosine-router.md`.

# %%
if __name__ == "__main__":
    import sys

    from moestat._vignette import vignette_cli

    sys.exit(vignette_cli(run, NAME))
