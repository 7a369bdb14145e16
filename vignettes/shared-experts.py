# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # DeepSeek-style shared experts with normalised sigmoid routing vs plain softmax: least-squares estimation
#
# Nguyen, Doan, Pham, Bui, Ho & Rinaldo (2025, "On DeepSeekMoE: statistical benefits of shared experts and
# normalized sigmoid gating", arXiv:2505.10860) analyse the two features that set the DeepSeekMoE layer apart:
# **shared experts**, always active, and **normalised sigmoid** routing of the other experts. Their abstract
# claims gains in sample efficiency for expert estimation from both. Only the abstract could be read for this
# vignette: the paper's equations, rates and simulation settings could not, so this vignette tests the two claims
# on moestat's own design and says which parts of the question it can and cannot decide.
#
# The model (`moestat.papers.nguyen2025_shared`): $f(x) = \sum_s h(x;\kappa_s) + \sum_j \pi_j(x)\,h(x;\eta_j)$,
# gelu ridge experts $h(x; a, b) = \mathrm{gelu}(a^\top x + b)$, shared experts with weight one, routed experts
# weighted by the normalised sigmoid $\pi_j = \sigma(s_j)/\sum_l\sigma(s_l)$ or by the softmax, $s_j =
# \beta_{1j}^\top x + \beta_{0j}$, dense routing.
#
# ## Pre-specified design (fixed before any run)
#
# * **Architectures** — `shared_nsig` (one shared expert + two routed experts, normalised sigmoid: DeepSeek-V3),
#   `softmax` (three routed experts, softmax: the plain MoE), and the two that separate the features:
#   `shared_softmax` (DeepSeekMoE / DeepSeek-V2) and `nsig`. One parameter set for all four
#   (`nguyen2025_shared.PARAMS`): the same three gelu experts; without shared experts the shared expert becomes a
#   routed atom with a zero gate row. $d = 2$, inputs $U[-1,1]^2$, noise sd 0.02. The parameters were chosen for
#   conditioning among 2500 random draws (the largest smallest eigenvalue of the information matrix over the four
#   architectures, after rounding); all four truths share one data stream (same inputs and noise: paired).
# * **Fits** (`own` study) — each truth fitted by its own architecture with $k = k^*$ (the paper's
#   least-squares estimator), Levenberg-Marquardt from a start near the truth (`fit_shared_lse`, exact Jacobian).
#   **Start audit** (`audit` study, one n) — the same fits from a near-truth and a random start; the audit reports
#   how often the random start reaches a lower objective. **Same data, other model** (`cross` study) — the
#   `shared_nsig` data fitted by the plain `softmax` MoE and the `softmax` data by `shared_nsig` (misspecified
#   fits, started at the truth's experts mapped into the fitted architecture; tolerances $10^{-8}$, at most 300
#   residual evaluations, because a misspecified fit's large residual makes Levenberg-Marquardt slow).
# * **n and replicates** — `quick`: 1000 to 16000 (five n, 1.2 decades), 20 replicates; cross fits at n = 1000,
#   4000, 16000 with 5 replicates; audit at n = 4000 with 5 replicates. `full`: 1000 to 64000 (seven n,
#   1.8 decades), 40 replicates; cross fits at 1000 to 64000 (four n) with 5; audit at n = 8000 with 20.
#   Seed 2505.
# * **Metrics** — `l2` ($\lVert f_{\hat G} - f^*\rVert_{L^2(\mu)}$, 20000 Monte-Carlo inputs) and the matched
#   errors of `nguyen2025_shared.matched_errors` (atoms matched within their group: shared experts are not
#   exchangeable with routed ones; softmax gate rows compared after centring): `err_expert` (largest expert
#   error over all three experts — the headline, comparable across architectures), `err_param`,
#   `err_routed_gate`, `err_routed_expert`, `err_shared_expert`.
# * **Theory for this design** — at $k = k^*$ every architecture is a smooth identified parametric model
#   (checked: `information.csv`), so every error falls at $n^{-1/2}$ (classical nonlinear least squares; the rows
#   of kind `derived` in `nguyen2025_shared.THEORY`). The design therefore **cannot show a difference of rates**:
#   sample efficiency is compared through the constants, as the ratio of the sample sizes two architectures need
#   to reach one error.
# * **Decision rules** — *rates*: a response agrees with $n^{-1/2}$ when its `power` interval covers 1/2 and its
#   verdict is `power law` or `imprecise`; faster / slower when the interval lies above / below.
#   *Sample efficiency*: `ms.rates.sample_complexity` of `err_expert` (mean over replicates) with target
#   $\varepsilon$ = the geometric mean over the four architectures of the mean `err_expert` at the middle n;
#   `ms.rates.sample_complexity_ratio` $n^*_A/n^*_B$ with its 95% interval; A is *more sample-efficient* when the
#   interval lies below 1, *less* when above, *undecided* otherwise. The claim "shared experts help" is
#   *supported on this truth* when both shared-vs-plain ratios (under either router) are below 1, *contradicted*
#   when both are above; "normalised sigmoid helps" likewise with both nsig-vs-softmax ratios; otherwise
#   *undecided*. *Misspecified fits*: the `l2` of a fit of the other architecture *has a floor* when at the
#   largest n its mean exceeds three times the well-specified fit's on the same data and its `power` exponent's
#   upper 95% limit is below 0.25.
#
# Run: `moestat vignette run shared-experts --quick --out out/shared-experts` (quick) or without `--quick`
# (full).

# %%
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import moestat as ms
from moestat import figstyle as fs
from moestat._vignette import run_study_timed
from moestat.papers import nguyen2025_shared as paper
from moestat.provenance import write_provenance
from moestat.study import successful_rows

NAME = "shared-experts"
TITLE = "DeepSeek-style shared experts with normalised sigmoid routing vs plain softmax: least squares at k = k*"

SEED = 2505
ARCHS = list(paper.ARCHITECTURES)
CROSS = {a: paper.OTHER[a] for a in ("shared_nsig", "softmax")}
"""The misspecified fits: truth architecture -> fitted architecture (DeepSeek-style and plain softmax, both ways)."""
CELL = "moestat.papers.nguyen2025_shared:shared_cell"
RESPONSES = ["err_expert", "err_param", "err_routed_gate", "err_routed_expert", "err_shared_expert", "l2"]
HEADLINE = "err_expert"
SECONDARY = "err_expert_01"
"""The larger error of experts 0 and 1, the two experts that are routed in every architecture (added after the
first quick run: see the docs page); ``err_expert`` also holds expert 2, shared in two architectures."""
MODELS = ["power", "power_log"]
PAIRS = [("shared_nsig", "softmax", "DeepSeek-style vs plain softmax"),
         ("shared_nsig", "nsig", "shared experts, normalised sigmoid router"),
         ("shared_softmax", "softmax", "shared experts, softmax router"),
         ("nsig", "softmax", "normalised sigmoid vs softmax, no shared expert"),
         ("shared_nsig", "shared_softmax", "normalised sigmoid vs softmax, with a shared expert")]
CLAIMS = {"shared experts": [("shared_nsig", "nsig"), ("shared_softmax", "softmax")],
          "normalised sigmoid": [("nsig", "softmax"), ("shared_nsig", "shared_softmax")]}
FLOOR_FACTOR = 3.0
FLOOR_MAX_EXPONENT = 0.25

SIZES: dict[str, dict[str, Any]] = {
    # 1.8 decades, 40 replicates
    "full": {"n": [1000, 2000, 4000, 8000, 16000, 32000, 64000], "reps": 40, "cross_n": [1000, 4000, 16000, 64000],
             "cross_reps": 5, "audit_n": 8000, "audit_reps": 20},
    # 1.2 decades, 20 replicates: minutes on one core
    "quick": {"n": [1000, 2000, 4000, 8000, 16000], "reps": 20, "cross_n": [1000, 4000, 16000], "cross_reps": 5,
              "audit_n": 4000, "audit_reps": 5},
    # the smoke test: seconds
    "tiny": {"n": [300, 600, 1200], "reps": 3, "cross_n": [300, 600, 1200], "cross_reps": 2, "audit_n": 600,
             "audit_reps": 2},
}
CROSS_OPTIONS = {"tol": 1e-8, "max_nfev": 300}
"""Misspecified fits: looser tolerances (their residual is large, so Levenberg-Marquardt converges linearly)."""

ADEMP = {
    "aims": "Compare the least-squares expert estimation of a DeepSeek-style layer (shared experts, normalised "
            "sigmoid routing) with a plain softmax MoE and the two mixed architectures (Nguyen et al. 2025, "
            "arXiv:2505.10860), at k = k*.",
    "data_generating_mechanisms": "d = 2, three gelu experts (nguyen2025_shared.PARAMS) as one shared + two "
                                  "routed (shared architectures) or three routed (plain); inputs U[-1,1]^2, "
                                  "noise sd 0.02; one data stream shared by the four truths.",
    "estimands": ["largest expert parameter error over the three experts", "largest atom error",
                  "routed gate, routed expert and shared expert errors", "L2(mu) distance of the regression function",
                  "sample size needed to reach a target expert error, and its ratio between architectures"],
    "methods": ["least squares by Levenberg-Marquardt, k = k*, own architecture, near-truth start",
                "start audit: near-truth and random starts", "misspecified fits of the other architecture"],
    "performance_measures": ["rate exponents with 95% intervals and verdicts", "sample-complexity ratios with 95% "
                             "intervals", "L2 floor of the misspecified fits", "share of random starts that win"],
}


def truth_entry(arch: str) -> dict[str, Any]:
    """The study's truth entry of ``arch``: data settings read by ``shared_cell``, on the paired stream."""
    return {"label": arch, "stream": "paired", "data": {"architecture": arch}}


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not a size of this vignette; valid sizes are {sorted(SIZES)}.")


def make_studies(size: str = "full", **override: Any) -> dict[str, ms.Study]:
    """The vignette's studies by output folder: ``own``, ``cross`` and ``audit``; ``override`` replaces entries of
    the size (``n``, ``reps``, ``cross_n``, ``cross_reps``, ``audit_n``, ``audit_reps``)."""
    _check_size(size)
    cfg = {**SIZES[size], **override}
    common: dict[str, Any] = {"seed": SEED, "threads": 1, "cell": CELL, "ademp": ADEMP}
    own = ms.Study(name=f"{NAME}-own-{size}", truth=[truth_entry(a) for a in ARCHS],
                   fit={"label": "own", "options": {"architecture": "own", "starts": ["near_truth"]}},
                   n=list(cfg["n"]), reps=int(cfg["reps"]),
                   description="each architecture fitted by least squares at k = k*", **common)
    cross = ms.Study(name=f"{NAME}-cross-{size}", truth=[truth_entry(a) for a in CROSS],
                     fit={"label": "other", "options": {"architecture": "other", "starts": ["near_truth"],
                                                        **CROSS_OPTIONS}},
                     n=list(cfg["cross_n"]), reps=int(cfg["cross_reps"]),
                     description="the same data fitted by the other architecture", **common)
    audit = ms.Study(name=f"{NAME}-audit-{size}", truth=[truth_entry(a) for a in ARCHS],
                     fit={"label": "own-2starts", "options": {"architecture": "own",
                                                              "starts": ["near_truth", "random"],
                                                              "max_nfev": 150}},
                     n=[int(cfg["audit_n"])], reps=int(cfg["audit_reps"]),
                     description="near-truth and random starts on the same data", **common)
    return {"own": own, "cross": cross, "audit": audit}


# %% [markdown]
# ## Rates, sample efficiency and checks
#
# `rates.csv`: `ms.fit_rate` by architecture under `power` and `power_log`, with the theory's rate and the
# decision. `windows.csv`: the `power` exponent in one-decade windows. `efficiency.csv`: the target, each
# architecture's $n^*$ and the five ratios with their verdicts, for `err_expert` (the pre-specified headline) and
# `err_expert_01` (the two experts routed in every architecture: a sensitivity analysis added after the first quick
# run); `claims.csv`: the two claims' verdicts for both.
# `cross.csv`: mean `l2` by n of the well-specified and the misspecified fits on the same data, the misspecified
# fits' `power` exponent and the floor decision. `audit.csv`: the start audit. `information.csv`: the smallest and
# largest eigenvalue of each architecture's information matrix at the truth and the observations per parameter
# at the smallest n.


# %%
RATE_COLS = ["model", "exponent", "se", "ci_low", "ci_high", "verdict", "curvature_p", "window_consistent",
             "window_drift", "n_values", "replicates"]


def _regime(arch: str) -> str:
    return "shared" if paper.ARCHITECTURES[arch][1] else "plain"


def _theory(arch: str, response: str) -> tuple[str, float]:
    """(rate as printed, exponent) of the derived theory row for ``arch`` and ``response`` ('' / NaN if none),
    read from ``nguyen2025_shared.THEORY`` (the rows ``ms.theory_rates()`` lists once the paper is registered)."""
    tab = pd.DataFrame(paper.THEORY, columns=list(ms.rates.theory.THEORY_COLUMNS))
    gate = paper.ARCHITECTURES[arch][0]
    hit = tab[(tab["source"] == "nguyen2025_shared") & (tab["gate"] == gate) & (tab["regime"] == _regime(arch))
              & (tab["response"] == response) & (tab["kind"] == "derived")]
    if hit.empty:
        return "", np.nan
    return str(hit.iloc[0]["rate"]), float(hit.iloc[0]["exponent"])


def decide(row: pd.Series) -> str:
    """The pre-specified decision for one rate row (``power`` model; theory exponent in ``theory_exponent``)."""
    if row["model"] != "power" or not np.isfinite(row["theory_exponent"]):
        return ""
    if row["verdict"] in ("range too narrow", "no decay", "curved: exponent is local"):
        return f"undecided ({row['verdict']})"
    if row["ci_low"] > row["theory_exponent"]:
        return "faster than theory"
    if row["ci_high"] < row["theory_exponent"]:
        return "slower than theory"
    return "agrees" if row["verdict"] in ("power law", "imprecise") else f"undecided ({row['verdict']})"


def rate_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``fit_rate`` of every response by architecture under ``MODELS``, with the theory rate and the decision."""
    parts = []
    for y in RESPONSES:
        sub = frame[frame[y].notna()]
        tab = ms.fit_rate(sub, y, by="architecture", model=MODELS, warn=False).to_frame(details=True)
        parts.append(tab[["architecture", *[c for c in RATE_COLS if c in tab.columns]]].assign(response=y))
    out = pd.concat(parts, ignore_index=True)
    theory = [_theory(a, r) for a, r in zip(out["architecture"], out["response"], strict=True)]
    out["theory"] = [t[0] for t in theory]
    out["theory_exponent"] = [t[1] for t in theory]
    out["decision"] = [decide(row) for _, row in out.iterrows()]
    return out[["architecture", "response", *[c for c in out.columns if c not in ("architecture", "response")]]]


def window_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``ms.window_sensitivity`` of the ``power`` exponent by architecture (one-decade windows)."""
    parts = []
    for y in RESPONSES:
        sub = frame[frame[y].notna()]
        ws = ms.window_sensitivity(sub, y, by="architecture", model="power", min_span=1.0)
        parts.append(ws.table.assign(response=y))
    return pd.concat(parts, ignore_index=True)


def efficiency_target(frame: pd.DataFrame, y: str = HEADLINE) -> float:
    """The pre-specified target: geometric mean over architectures of the mean ``y`` at the middle n."""
    ns = np.sort(frame["n"].unique())
    mid = ns[len(ns) // 2]
    means = frame[frame["n"] == mid].groupby("architecture")[y].mean()
    return float(np.exp(np.log(means).mean()))


def _ratio_verdict(lo: float, hi: float) -> str:
    if hi < 1:
        return "more sample-efficient"
    if lo > 1:
        return "less sample-efficient"
    return "undecided"


def efficiency_tables(frame: pd.DataFrame, y: str = HEADLINE, n_resamples: int = 2000
                      ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(efficiency, claims): n* of every architecture for the target error and the ratios of ``PAIRS``; the two
    claims' verdicts from ``CLAIMS``."""
    target = efficiency_target(frame, y)
    sc = ms.rates.sample_complexity(frame, y, target, by="architecture", direction="below",
                                    n_resamples=n_resamples, seed=SEED)
    rows = []
    for arch in ARCHS:
        r = sc.table[sc.table["architecture"] == arch].iloc[0]
        rows.append({"kind": "n_star", "a": arch, "b": "", "label": arch, "metric": y, "target": target,
                     "value": r["n_star"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "censored": r["censored"],
                     "verdict": ""})
    verdicts = {}
    for a, b, label in PAIRS:
        rat = ms.rates.sample_complexity_ratio(sc, a, b).iloc[0]
        verdict = _ratio_verdict(float(rat["ci_low"]), float(rat["ci_high"]))
        verdicts[(a, b)] = verdict
        rows.append({"kind": "ratio", "a": a, "b": b, "label": label, "metric": y, "target": target,
                     "value": rat["ratio"], "ci_low": rat["ci_low"], "ci_high": rat["ci_high"],
                     "censored": rat["censored"], "verdict": f"{a} {verdict}" if verdict != "undecided" else verdict})
    claims = []
    for claim, pairs in CLAIMS.items():
        vs = [verdicts[p] for p in pairs]
        if all(v == "more sample-efficient" for v in vs):
            decision = "supported on this truth"
        elif all(v == "less sample-efficient" for v in vs):
            decision = "contradicted on this truth"
        else:
            decision = "undecided"
        claims.append({"claim": claim, "metric": y, "pairs": "; ".join(f"{a}/{b}: {v}" for (a, b), v in zip(pairs, vs,
                                                                                              strict=True)),
                       "decision": decision})
    return pd.DataFrame(rows), pd.DataFrame(claims)


def cross_table(own: pd.DataFrame, cross: pd.DataFrame) -> pd.DataFrame:
    """Mean ``l2`` by n of the well-specified and the misspecified fit on the same data, with the misspecified
    fit's ``power`` exponent and the floor decision at the largest n."""
    rows = []
    for truth, fit in CROSS.items():
        well = own[own["truth"] == truth].groupby("n")["l2"].mean()
        sub = cross[cross["truth"] == truth]
        mis = sub.groupby("n")["l2"].mean()
        res = ms.fit_rate(sub, "l2", model="power", warn=False).to_frame(details=True).iloc[0]
        n_max = int(mis.index.max())
        floor = bool(mis[n_max] > FLOOR_FACTOR * well[n_max] and res["ci_high"] < FLOOR_MAX_EXPONENT)
        for n in mis.index:
            rows.append({"truth": truth, "fit": fit, "n": int(n), "l2_well": well[n], "l2_misspecified": mis[n],
                         "ratio": mis[n] / well[n], "exponent": res["exponent"], "ci_low": res["ci_low"],
                         "ci_high": res["ci_high"], "verdict": res["verdict"],
                         "decision": "floor" if floor else "no floor shown"})
    return pd.DataFrame(rows)


def audit_table(audit: pd.DataFrame) -> pd.DataFrame:
    """Per architecture: replicates, how often the random start won (lower objective by more than 1e-10
    relative), and the largest relative objective gain of a random start."""
    gain = (audit["objective_near_truth"] - audit["objective_random"]) / audit["objective_near_truth"]
    out = audit.assign(gain=gain, won=gain > 1e-10).groupby("architecture").agg(
        n=("n", "first"), replicates=("rep", "size"), random_won=("won", "sum"), max_gain=("gain", "max"),
        converged=("converged", "mean")).reset_index()
    return out


def information_table(n_min: int, n_eval: int = 20_000) -> pd.DataFrame:
    """Smallest and largest eigenvalue of each architecture's information matrix at the truth, the free
    parameters and the observations per free parameter at the smallest n."""
    X = np.random.default_rng(SEED).uniform(-1.0, 1.0, size=(n_eval, 2))
    rows = []
    for arch in ARCHS:
        tp = paper.truth_params(paper.shared_experts_truth(arch))
        ev = paper.information_eigenvalues(arch, tp, X)
        rows.append({"architecture": arch, "free_parameters": len(ev), "lambda_min": ev[0], "lambda_max": ev[-1],
                     "obs_per_parameter_at_n_min": n_min / len(ev),
                     "worst_sd_at_n_min": paper.NOISE_SD / np.sqrt(n_min * ev[0])})
    return pd.DataFrame(rows)


# %% [markdown]
# ## Figure
# `rates.png`: one panel per response; per architecture, the geometric mean of the replicate errors at each n with
# bars $\times/\div\,e^{2\,\mathrm{se}}$ and the fitted `power` line, its exponent and 95% interval printed in the
# panel. The last panel is the `l2` of the well-specified fits (solid) and of the misspecified fits on the same
# data (dotted).


# %%
COLORS = {"shared_nsig": "tab:red", "nsig": "tab:orange", "shared_softmax": "tab:purple", "softmax": "tab:blue"}
TITLES = {"err_expert": "experts (largest of three)", "err_param": "all parameters of an atom",
          "err_routed_gate": "routed gates (identified part)", "err_routed_expert": "routed experts",
          "err_shared_expert": "shared expert", "l2": "regression function"}
YLABELS = {"err_expert": r"$\max \|\Delta\eta\|$", "err_param": r"$\max_j \|\Delta\theta_j\|$",
           "err_routed_gate": r"$\max_j \|\Delta g_j\|$", "err_routed_expert": r"$\max_j \|\Delta\eta_j\|$",
           "err_shared_expert": r"$\|\Delta\kappa\|$"}


def _points(ax: Any, sub: pd.DataFrame, y: str, color: str, ls: str = "o") -> None:
    logs = np.log(sub[y]).groupby(sub["n"])
    ns = np.asarray(list(logs.groups), float)
    centre, se = logs.mean().to_numpy(), (logs.std() / np.sqrt(logs.size())).to_numpy()
    ax.errorbar(ns, np.exp(centre), yerr=[np.exp(centre) - np.exp(centre - 2 * se),
                                          np.exp(centre + 2 * se) - np.exp(centre)],
                fmt=ls, ms=3.5, capsize=2, color=color)


def _panel(ax: Any, frame: pd.DataFrame, y: str) -> None:
    sub = frame[frame[y].notna()]
    res = ms.fit_rate(sub, y, by="architecture", model="power", warn=False).to_frame(details=True)
    res = res.set_index("architecture")
    lines = []
    for arch in [a for a in COLORS if a in set(sub["architecture"])]:
        part = sub[sub["architecture"] == arch]
        _points(ax, part, y, COLORS[arch])
        row = res.loc[arch]
        ns = np.sort(part["n"].unique()).astype(float)
        grid = np.logspace(np.log10(ns.min()), np.log10(ns.max()), 50)
        ax.plot(grid, np.exp(row["intercept"] - row["exponent"] * np.log(grid)), "--", color=COLORS[arch], lw=1.2)
        lines.append((f"{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]", COLORS[arch]))
    for i, (text, color) in enumerate(lines):
        ax.text(0.03, 0.04 + 0.075 * i, text, transform=ax.transAxes, color=color,
                fontsize=fs.fontsize(ax.figure, "legend"))
    ax.set_xscale("log")
    ax.set_yscale("log")


def _cross_panel(ax: Any, own: pd.DataFrame, cross: pd.DataFrame) -> None:
    for truth, fit in CROSS.items():
        well = own[own["truth"] == truth]
        mis = cross[cross["truth"] == truth]
        for part, ls in ((well, "-"), (mis, ":")):
            m = part.groupby("n")["l2"].mean()
            ax.plot(m.index, m.to_numpy(), ls, marker="o", ms=3, color=COLORS[truth if ls == "-" else fit])
    ax.set_xscale("log")
    ax.set_yscale("log")


def plot_rates(own: pd.DataFrame, cross: pd.DataFrame, path: Path, label: str) -> None:
    """The figure described above, saved to ``path``."""
    from matplotlib.lines import Line2D

    fig, axes, _ = fs.subplots(4, 2, figsize=(fs.PAGE_WIDTH_IN, 14.0))
    panels = [*RESPONSES]
    for ax, y in zip(axes.flat[:len(panels)], panels, strict=True):
        _panel(ax, own, y)
        fs.finish_axes(ax, title=TITLES[y], xlabel="n")
        fs.finish_axes(ax, ylabel=YLABELS.get(y, y), raw=y in YLABELS)
    ax = axes.flat[len(panels)]
    _cross_panel(ax, own, cross)
    fs.finish_axes(ax, title="same data, other architecture", xlabel="n", ylabel="l2")
    handles = [Line2D([], [], color=COLORS[a], marker="o", ls="--") for a in COLORS]
    labels = [a.replace("_", " + ").replace("nsig", "normalised sigmoid") for a in COLORS]
    handles += [Line2D([], [], color="k", ls="-"), Line2D([], [], color="k", ls=":")]
    labels += ["well-specified fit (last panel)", "fit of the other architecture (last panel; colour: fitted)"]
    fs.legend_panel(axes.flat[-1], handles, labels, ncol=1)
    reps = int(own.groupby(["architecture", "n"]).size().min())
    fs.caption(fig, f"{label}; markers: geometric mean over {reps} replicates, bars: times/divided by exp(2 se) of "
                    "the mean log error; dashed: fitted C n^-alpha; printed: alpha [95% interval, random effects "
                    "with Knapp-Hartung], one line per architecture. Last panel: mean l2 of the well-specified "
                    "(solid, colour of the truth) and misspecified (dotted, colour of the fitted architecture) fits.")
    fs.save(fig, path)


# %%
def run(out: str | Path, quick: bool = False, resume: bool = True, *, size: str | None = None,
        progress: bool = True, workers: int | str | dict[str, int] | None = None, **override: Any) -> pd.DataFrame:
    """Run the three studies (resumable, each in ``out/<study>/study``) and write results.csv (the ``own`` study),
    cross_results.csv, audit_results.csv, rates.csv, windows.csv, efficiency.csv, claims.csv, cross.csv,
    audit.csv, information.csv, rates.png and provenance.json into ``out``.

    ``size`` picks an entry of ``SIZES`` (default ``"quick"`` or ``"full"``); ``override`` replaces entries of the
    size.  ``workers`` (default: the CPU count) runs cells in worker processes.
    Returns the ``own`` study's frame.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size = size or ("quick" if quick else "full")
    _check_size(size)
    cfg = {**SIZES[size], **override}
    studies = make_studies(size, **override)
    frames, timing = {}, {}
    for name, study in studies.items():
        frames[name], timing[name] = run_study_timed(study, out / name, resume=resume, progress=progress,
                                                     workers=workers)
    frames["own"][SECONDARY] = frames["own"][["err_expert_0", "err_expert_1"]].max(axis=1)
    frames["own"].to_csv(out / "results.csv", index=False)
    frames["cross"].to_csv(out / "cross_results.csv", index=False)
    frames["audit"].to_csv(out / "audit_results.csv", index=False)
    own, cross, audit = (successful_rows(frames[k]) for k in ("own", "cross", "audit"))
    rate_table(own).to_csv(out / "rates.csv", index=False)
    window_table(own).to_csv(out / "windows.csv", index=False)
    tables = [efficiency_tables(own, y) for y in (HEADLINE, SECONDARY)]
    pd.concat([t[0] for t in tables], ignore_index=True).to_csv(out / "efficiency.csv", index=False)
    pd.concat([t[1] for t in tables], ignore_index=True).to_csv(out / "claims.csv", index=False)
    cross_table(own, cross).to_csv(out / "cross.csv", index=False)
    audit_table(audit).to_csv(out / "audit.csv", index=False)
    information_table(int(min(cfg["n"]))).to_csv(out / "information.csv", index=False)
    plot_rates(own, cross, out / "rates.png", "full size" if size == "full" else f"{size} size")
    write_provenance(out, {"vignette": NAME, "size": size, "sizes": cfg, "seed": SEED, "timing": timing,
                           "studies": {k: s.to_dict() for k, s in studies.items()},
                           "rows": {k: len(v) for k, v in frames.items()},
                           "failed_rows": {k: int(len(frames[k]) - len(v)) for k, v in
                                           (("own", own), ("cross", cross), ("audit", audit))},
                           "not_converged": {k: int((f["status"] == "not_converged").sum()) for k, f in
                                             frames.items()}})
    return frames["own"]


# %% [markdown]
# ## Results
# The rendered results, with what the data show, are in `docs/vignettes/shared-experts.md`.

# %%
if __name__ == "__main__":
    import sys

    from moestat._vignette import vignette_cli

    sys.exit(vignette_cli(run, NAME))
