# %% [markdown]
# # Learning gated networks: tensor (L4) + likelihood (L_log) vs EM vs least squares
#
# Makkuva, Oh, Kannan & Viswanath, *Learning in Gated Neural Networks* (AISTATS 2020) study the gated
# network
# :math:`y = \sum_i z_i\,g(a_i^{*\top} x) + \xi`, :math:`P[z_i=1\mid x] = \mathrm{softmax}_i(w^{*\top}x)`,
# :math:`x \sim N(0, I_d)`, and propose a two-stage estimator: the experts from a fourth-order
# Hermite/score loss **L4** whose local minima are all global, then the gate from the likelihood
# **L_log** with the experts frozen.  Their experiments (d = 10, k = 2, identity experts, sigma = 0.05,
# :math:`a_i^* = e_i`, :math:`w_1^* = e_3`) show L4 recovering the experts where SGD on the squared loss
# (and, in the revised version, EM) gets stuck.
#
# This vignette reruns that comparison with moestat — same data, same random starts, every knob recorded —
# and goes beyond it: the :math:`n^{-1/2}` rate of the gate error (Theorem 4), the floor that the regressor
# error puts under the gate error and how it moves with sigma, non-orthogonal gates with non-linear
# experts (outside the theory), scaling in d and k, and the revised version's non-Gaussian inputs.
# The paper reports no numbers (only curves without axes values), so nothing here can be matched
# number-for-number; hyper-parameters the paper leaves out are our choices and are listed in ``SIZES``.
#
# Every part runs through ``moestat.Study`` with the custom cell ``moestat.papers.makkuva2020.gated_nn_cell``
# (data knobs in the truth's ``data`` table, the estimator and its settings in the fit's ``options``); the
# success criterion (``recovered``) and the rate analysis (``rate_table``) live in the same paper module.  This
# script holds the configuration (``SIZES``), the studies, the figures and the prose.

# %%
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from moestat.papers import makkuva2020 as paper

NAME = "gated-nn-recovery"
TITLE = "makkuva2020: two-stage tensor recovery of gated networks vs EM and least squares"

#: Every part is a ``moestat.Study`` whose cell is ``paper.gated_nn_cell``: the truth's ``data`` table holds the
#: data knobs (and this vignette's own data and start seeds, so the numbers match the earlier script), the fit's
#: ``options`` the estimator and its settings.  A random start succeeds when ``paper.recovered`` says so
#: (``paper.SUCCESS``: E_reg <= 0.05, gate_l2 <= 0.5).
CELL = "moestat.papers.makkuva2020:gated_nn_cell"

_FITS = dict(tensor=dict(l4_iters=500, l4_lr=0.02, gate_iters=100, gate_step=2.0, gate_radius=5.0, mu=0.1,
                         lam=10.0, ridge=0.01, project=True, sign="moment"),
             em=dict(iters=100, gate_steps=5, gate_step=2.0), l2=dict(iters=600, lr=0.02, optimizer="adam"))
#: "full" is what docs/vignettes/gated-nn-recovery.md shows, sized for a 2-core CPU shared with ~8 other jobs
#: (about 5 CPU-minutes); "quick" is the CI smoke test.
SIZES = {
    "full": dict(fits={**_FITS, "tensor": {**_FITS["tensor"], "l4_iters": 400, "gate_iters": 60},
                       "em": {**_FITS["em"], "iters": 50}, "l2": {**_FITS["l2"], "iters": 400}},
                 seed=2020,
                 compare=dict(n=10_000, starts=20),
                 vs_n=dict(ns=(2_000, 5_000, 10_000, 20_000, 50_000), reps=4, starts=1, em_iters=30,
                           em_max_n=10_000),
                 sigma=dict(sigmas=(0.01, 0.03, 0.1, 0.3), n=10_000, reps=3, starts=1),
                 nonlinear=dict(activations=("linear", "relu", "tanh"), ns=(20_000, 100_000), reps=2,
                                gate_iters=10),
                 scaling=dict(dk=((10, 2), (20, 2), (10, 3), (20, 4)), n=10_000, reps=1, starts=4, em_iters=30),
                 nongauss=dict(ps=(0.5, 0.8), mu_norm=1.0, n=20_000, reps=2)),
    "quick": dict(fits={**_FITS, "tensor": {**_FITS["tensor"], "l4_iters": 300, "gate_iters": 40},
                        "em": {**_FITS["em"], "iters": 30}, "l2": {**_FITS["l2"], "iters": 200}},
                  seed=2020,
                  compare=dict(n=5_000, starts=4),
                  vs_n=dict(ns=(2_000, 5_000, 10_000), reps=2, starts=1, em_iters=20, em_max_n=10_000),
                  sigma=dict(sigmas=(0.05, 0.2), n=5_000, reps=2, starts=1),
                  nonlinear=dict(activations=("linear", "relu"), ns=(20_000,), reps=1, gate_iters=10),
                  scaling=dict(dk=((10, 2), (10, 3)), n=5_000, reps=1, starts=2, em_iters=20),
                  nongauss=dict(ps=(0.5, 0.9), mu_norm=1.0, n=10_000, reps=1)),
    # "smoke": the size hook for the test suite (seconds); not meant to be read.
    "smoke": dict(fits={**_FITS, "tensor": {**_FITS["tensor"], "l4_iters": 40, "gate_iters": 5},
                        "em": {**_FITS["em"], "iters": 4}, "l2": {**_FITS["l2"], "iters": 10}},
                  seed=2020,
                  compare=dict(n=1_000, starts=2),
                  vs_n=dict(ns=(1_000, 1_500, 2_000), reps=2, starts=1, em_iters=3, em_max_n=1_000),
                  sigma=dict(sigmas=(0.05, 0.2), n=1_000, reps=1, starts=1),
                  nonlinear=dict(activations=("linear",), ns=(2_000,), reps=1, gate_iters=3),
                  scaling=dict(dk=((6, 2),), n=1_000, reps=1, starts=2, em_iters=3),
                  nongauss=dict(ps=(0.5,), mu_norm=1.0, n=1_000, reps=1)),
}


def _size(quick: bool) -> tuple[str, dict]:
    name = "quick" if quick else os.environ.get("MOESTAT_GATED_NN_SIZE", "full")
    if name not in SIZES:
        raise ValueError(f"MOESTAT_GATED_NN_SIZE={name!r}; use one of {sorted(SIZES)}.")
    return name, SIZES[name]


def _study(part: str, cfg: dict, truth, fit, n, reps: int):
    import moestat as ms

    return ms.Study(truth=truth, fit=fit, n=list(n), reps=reps, seed=cfg["seed"], name=f"{NAME}-{part}", cell=CELL)


# %% [markdown]
# ## 1. The paper's comparison: one data set, 20 random starts, three methods
#
# All three estimators start from the same 20 random points (rows of A uniform on the sphere, gate
# entries N(0, 1/d)).  At the "full" size the tensor method runs 400 full-batch Adam steps on the projected
# L4 and then 60 projected-GD steps on L_log; least squares runs 400 Adam steps on the joint squared loss;
# EM runs 50 iterations (exact weighted least squares for the experts, 5 gradient steps for the gate).
# EM iterations are more expensive (a weighted d x d solve per expert) and converge in far fewer steps,
# so "same budget" here means each method is run well past the point where its error stops changing
# (see the iteration plot).  We also rerun the gate stage with A fixed at the truth and at the
# least-squares estimate (the paper's Fig. 2(b)).

# %%
def _compare_study(cfg: dict):
    c, f, s = cfg["compare"], cfg["fits"], cfg["seed"]
    gate = {k: f["tensor"][k] for k in ("gate_iters", "gate_step", "gate_radius")}
    fits = [
        {"label": "tensor", "options": {"method": "tensor", "restarts": c["starts"], "record_every": 10,
                                        **f["tensor"]}},
        {"label": "em", "options": {"method": "em", "restarts": c["starts"], "record_every": 2, **f["em"]}},
        {"label": "l2", "options": {"method": "l2", "restarts": c["starts"], "record_every": 10, **f["l2"]}},
        {"label": "gate|A=A*", "options": {"method": "gate", "experts": "truth", "restarts": c["starts"],
                                           "start_seed": s + 2, "record_every": 10, **gate}},
        {"label": "gate|A=l2", "options": {"method": "gate", "experts": "l2", "experts_fit": f["l2"],
                                           "restarts": c["starts"], "start_seed": s + 2, "record_every": 10,
                                           **gate}},
    ]
    truth = {"label": "paper", "data": {"seed": s, "start_seed": s + 1}}
    return _study("compare", cfg, truth, fits, [c["n"]], 1)


# %% [markdown]
# ## 2. Error against n, and the gate's n^-1/2 rate
#
# For each n we draw independent replicate data sets and fit every replicate (and its starts) in one
# batched call.  The exponent alpha of ``error ~ C n^-alpha`` comes from ``ms.fit_rate``: OLS of
# log(error) on log(n) over the replicate-level points, with its default cluster-bootstrap t interval
# (replicates resampled within each n, Satterthwaite degrees of freedom; see docs/rates.md).
# ``ms.test_exponent`` tests H0: alpha = 1/2 and ``ms.compare_models`` compares the power model with the
# log-corrected ones by AIC (a curvature check).  Theorem 4 predicts alpha = 1/2 for the gate in the
# max-l2 norm down to a floor set by the regressor error; the regressor angle should also fall like
# n^-1/2 (so E_reg = 1 - cos like n^-1).

# %%
def _vs_n_studies(cfg: dict) -> list:
    c, f, s = cfg["vs_n"], cfg["fits"], cfg["seed"]
    truth = {"label": "paper", "data": {"seed": s + 100, "start_seed": s + 200, "ns": list(c["ns"])}}
    fits = [{"label": "tensor", "options": {"method": "tensor", "restarts": c["starts"], **f["tensor"]}},
            {"label": "gate|A=A*", "options": {"method": "gate", "experts": "truth", "restarts": c["starts"],
                                               "start_seed": s + 300, "gate_iters": f["tensor"]["gate_iters"]}}]
    em = {"label": "em", "options": {"method": "em", "restarts": c["starts"], **{**f["em"], "iters": c["em_iters"]}}}
    return [_study("vs_n", cfg, truth, fits, c["ns"], c["reps"]),
            _study("vs_n_em", cfg, truth, em, [n for n in c["ns"] if n <= c["em_max_n"]], c["reps"])]


# %% [markdown]
# ## 3. The floor under the gate error, against sigma
#
# Theorems 3-4 bound the gate error by a contraction term plus :math:`\kappa\varepsilon_{reg}/(1-\rho_\sigma)`,
# where the regressor error is measured in units of :math:`\sigma^2`.  At fixed n we compare the
# two-stage gate error with the oracle gate error (experts known): their gap is the floor.

# %%
def _sigma_study(cfg: dict):
    c, f, s = cfg["sigma"], cfg["fits"], cfg["seed"]
    truths = [{"label": f"sigma={sig}", "data": {"sigma": sig, "seed": s + 400 + i, "start_seed": s + 1}}
              for i, sig in enumerate(c["sigmas"])]
    fits = [{"label": "tensor", "options": {"method": "tensor", "restarts": c["starts"], **f["tensor"]}},
            {"label": "gate|A=A*", "options": {"method": "gate", "experts": "truth", "start_seed": s + 2,
                                               "gate_iters": f["tensor"]["gate_iters"]}}]
    return _study("sigma", cfg, truths, fits, [c["n"]], c["reps"])


# %% [markdown]
# ## 4. Non-linear experts and non-orthogonal gates
#
# The theory needs the gate orthogonal to the experts; the paper relaxes this only for identity
# experts.  For non-linear g the L4 moments pick up terms from the gate direction (we measured a
# 15-45% bias in ReLU moments), so the recovered directions should be biased by an amount that does not
# shrink with n.  Gate: unit vector orthogonal to the experts vs uniform on the sphere.

# %%
def _nonlinear_study(cfg: dict):
    c, f, s = cfg["nonlinear"], cfg["fits"], cfg["seed"]
    truths = [{"label": f"{act}-{gate}", "data": {"activation": act, "gate": gate, "truth_seed": 7,
                                                  "seed": s + 500 + 10 * i, "start_seed": s, "ns": list(c["ns"]),
                                                  "offset_starts": False}}
              for i, act in enumerate(c["activations"]) for gate in ("orthogonal", "random")]
    fit = {"label": "tensor", "options": {"method": "tensor", "restarts": 1,
                                          **{**f["tensor"], "gate_iters": c["gate_iters"]}}}
    return _study("nonlinear", cfg, truths, fit, c["ns"], c["reps"])


# %% [markdown]
# ## 5. Scaling in d and k, and the revised version's non-Gaussian inputs
#
# Random unit experts (not orthonormal) with the gate orthogonal to them, several starts per replicate:
# success fraction and errors of the tensor method against EM.  Then inputs from
# :math:`p\,N(\mu, I) + (1-p)\,N(-\mu, I)`, :math:`\|\mu\| = 1` (revised version, Fig. 3(c)), fitted with the
# Gaussian transforms (moestat warns; the warning is silenced here and recorded).

# %%
def _scaling_study(cfg: dict):
    c, f, s = cfg["scaling"], cfg["fits"], cfg["seed"]
    truths = [{"label": f"d={d}-k={k}", "data": {"d": d, "k": k, "regressors": "random", "truth_seed": 11 + i,
                                                 "seed": s + 600 + i, "start_seed": s + 700 + i}}
              for i, (d, k) in enumerate(c["dk"])]
    fits = [{"label": "tensor", "options": {"method": "tensor", "restarts": c["starts"], **f["tensor"]}},
            {"label": "em", "options": {"method": "em", "restarts": c["starts"],
                                        **{**f["em"], "iters": c["em_iters"]}}}]
    return _study("scaling", cfg, truths, fits, [c["n"]], c["reps"])


def _nongauss_study(cfg: dict):
    c, f, s = cfg["nongauss"], cfg["fits"], cfg["seed"]
    truths = [{"label": "gaussian", "data": {"inputs": "gaussian", "truth_seed": 3, "seed": s + 800,
                                             "start_seed": 0}}]
    truths += [{"label": f"mixture-p={p}", "data": {"inputs": "mixture", "mixture_p": p, "mixture_mu": c["mu_norm"],
                                                   "truth_seed": 3, "seed": s + 800 + i, "start_seed": 0}}
               for i, p in enumerate(c["ps"], start=1)]
    fit = {"label": "tensor", "options": {"method": "tensor", "restarts": 1, "check_inputs": False, **f["tensor"]}}
    return _study("nongauss", cfg, truths, fit, [c["n"]], c["reps"])


def make_studies(size: str = "full") -> dict:
    """The studies of every part at ``size`` (a key of ``SIZES``), by part name; building one computes nothing."""
    if size not in SIZES:
        raise ValueError(f"size={size!r}; use one of {sorted(SIZES)}.")
    cfg = SIZES[size]
    vs_n, vs_n_em = _vs_n_studies(cfg)
    return {"compare": _compare_study(cfg), "vs_n": vs_n, "vs_n_em": vs_n_em, "sigma": _sigma_study(cfg),
            "nonlinear": _nonlinear_study(cfg), "scaling": _scaling_study(cfg), "nongauss": _nongauss_study(cfg)}


# %% [markdown]
# ## Figures
#
# Every figure is drawn through ``moestat.figstyle``: a title per panel, axis labels in the paper's notation
# (:math:`\mathcal{E}_{\mathrm{reg}}`, :math:`\max_i\|\hat w_i - w_i^*\|_2`, :math:`\sigma`, :math:`n`), legends
# outside the data (fitted and reference lines included) and a caption saying what the thin and thick lines,
# markers, bars and intervals are, over how many starts or replicates and at which level.

# %%
COLORS = {"tensor": "C0", "em": "C1", "l2": "C3", "gate|A=A*": "k", "gate|A=l2": "C3"}
METHOD_NAMES = {"tensor": r"tensor ($L_4$, then $L_{\log}$)", "em": "EM", "l2": r"least squares ($\ell_2$)",
                "gate|A=A*": r"oracle gate ($L_{\log}$ with $A = A^*$)",
                "gate|A=l2": r"gate with $A = \hat A_{\ell_2}$"}
YLABELS = {"E_reg": r"$\mathcal{E}_{\mathrm{reg}} = 1 - \min_i |\langle \hat a_{\pi(i)}, a_i^* \rangle|$",
           "gate_l2": r"$\max_i \|\hat w_{\pi(i)} - w_i^*\|_2$",
           "reg_angle": r"$\max_i \angle(\hat a_{\pi(i)}, a_i^*)$ (rad)"}
MATCHING = (r"$\pi$: the permutation matching $\hat A$ to $A^*$; gates re-referenced to the last expert "
            r"($w_k = 0$)")
ACTIVATIONS = {"linear": "identity", "relu": "ReLU", "tanh": "tanh"}
FLOOR = 1e-6
"""Errors below this are drawn at it on log axes (EM's regressor error reaches about 2e-6)."""


def _names(keys) -> list[str]:
    return [METHOD_NAMES.get(k, k) for k in keys]


def _one_panel(height: float):
    """A one-panel figure of the page's width (``moestat.figstyle.subplots``): ``(fig, ax)``."""
    from moestat import figstyle as fs

    fig, axes, _ = fs.subplots(1, 1, figsize=(fs.PAGE_WIDTH_IN, height))
    return fig, axes[0, 0]


def _count(values) -> str:
    """``"20"`` or ``"2-4"``: the counts behind a centre, as a range if they differ."""
    lo, hi = int(min(values)), int(max(values))
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _fig_compare(path: Path, hist: pd.DataFrame, em_gate_steps: int) -> None:
    """Errors along the iterations: every start (thin) and the median over the starts (thick), per method."""
    from matplotlib.lines import Line2D

    from moestat import figstyle as fs

    methods = [m for m in ("tensor", "em", "l2") if m in set(hist["method"])]
    fig, axes, legend_ax = fs.subplots(1, 2, figsize=(fs.PAGE_WIDTH_IN, 4.4), legend_height=0.75)
    switch = hist.loc[(hist["method"] == "tensor") & (hist["stage"] == "gate"), "iter"]
    clipped = False
    for ax, metric in zip(axes.flat, ("E_reg", "gate_l2"), strict=True):
        for method in methods:
            h = hist[(hist["method"] == method) & (hist["metric"] == metric)]
            clipped |= bool((h["value"] < FLOOR).any())
            for _, g in h.groupby("restart"):
                ax.plot(g["iter"], g["value"].clip(lower=FLOOR), color=COLORS[method], alpha=0.2, lw=0.7)
            med = h.groupby("iter")["value"].median()
            ax.plot(med.index, med.clip(lower=FLOOR), color=COLORS[method], lw=2.2)
        ax.axhline(paper.SUCCESS[metric], color="0.35", ls="--", lw=1)
        if len(switch):
            ax.axvline(switch.min(), color="C0", ls=":", lw=1)
        ax.set_yscale("log")
        title = "regressor error" if metric == "E_reg" else "gate error"
        fs.finish_axes(ax, title=f"{title} along the iterations", xlabel=r"iteration $t$ (full passes)",
                       ylabel=YLABELS[metric], raw=True)
    handles = [Line2D([], [], color=COLORS[m], lw=2.2) for m in methods]
    labels = [f"{name}: median" for name in _names(methods)]
    handles += [Line2D([], [], color="0.4", lw=0.7, alpha=0.6), Line2D([], [], color="0.35", ls="--", lw=1)]
    labels += ["one random start (thin, method's colour)", "success threshold"]
    if len(switch):
        handles.append(Line2D([], [], color="C0", ls=":", lw=1))
        labels.append(r"tensor: switch from $L_4$ to $L_{\log}$")
    fs.legend_panel(legend_ax, handles, labels, ncol=2)
    starts = hist.groupby("method")["restart"].nunique()
    text = (f"One data set (n = {int(hist['n'].iloc[0]):,}, d = 10, k = 2, identity experts, "
            f"$\\sigma$ = 0.05); the same {_count(starts[methods])} random starts for every method. Thin lines: "
            "each start; thick lines: the median over the starts at each recorded iteration. Dashed: the success "
            f"thresholds $\\mathcal{{E}}_{{\\mathrm{{reg}}}} \\leq$ {paper.SUCCESS['E_reg']} and gate error "
            f"$\\leq$ {paper.SUCCESS['gate_l2']}. An EM iteration is one exact weighted least-squares step for the "
            f"experts plus {em_gate_steps} gate gradient steps. {MATCHING}.")
    if clipped:
        text += f" Errors below {FLOOR:g} are drawn at {FLOOR:g}."
    fs.caption(fig, text)
    fs.save(fig, path)


def _rate_panel(ax, res, title: str, metric: str) -> None:
    """``RateResult.plot`` on ``ax`` with the reference slope n^-1/2 (drawn first: it joins the legend)."""
    from moestat import figstyle as fs

    ns = np.array(sorted(res.data["n"].unique()), dtype=float)
    ref = np.exp(res.data["error"].map(np.log).mean()) * (ns / np.exp(np.log(ns).mean())) ** -paper.RATE_H0
    ax.plot(ns, ref, ":", color="0.45", lw=1.4, label=r"reference slope $n^{-1/2}$")
    res.plot(ax=ax, colors=[COLORS.get(m, "C2") for m in sorted(res.data["method"].unique())], title=title,
             note=False)
    fs.finish_axes(ax, ylabel=YLABELS[metric], raw=True)
    legend = ax.get_legend()
    for text in legend.get_texts():
        for key in sorted(METHOD_NAMES, key=len, reverse=True):
            if text.get_text().startswith(key + ":"):
                text.set_text(METHOD_NAMES[key] + text.get_text()[len(key):])
                break


def _fig_vs_n(path: Path, rate_results: dict) -> None:
    """Errors against n with the fitted power lines of ``paper.rate_table`` (one panel per metric)."""
    from moestat import figstyle as fs

    panels = [(m, t) for m, t in (("reg_angle", "largest regressor angle against sample size"),
                                  ("gate_l2", "gate error against sample size")) if m in rate_results]
    if not panels:
        return
    fig, axes, _ = fs.subplots(len(panels), 1, figsize=(fs.PAGE_WIDTH_IN, 4.6 * len(panels)))
    for ax, (metric, title) in zip(axes.flat, panels, strict=True):
        _rate_panel(ax, rate_results[metric], title, metric)
    res = rate_results[panels[-1][0]]
    counts = res.data.groupby(["method", "n"]).size()
    cfg = res.config
    text = ("Each n has its own independent data sets (d = 10, k = 2, $\\sigma$ = 0.05), one random start each; "
            + fs.bars_text("2sd_log", [int(c) for c in counts], centre="geometric mean over the replicates")
            + "; faint dots: the replicates; lines through the markers join the geometric means. "
            "Dash-dotted lines: fitted $C n^{-\\alpha}$ (OLS of $\\log$ error on $\\log n$ over the replicates), "
            "labelled $n^{-\\alpha}$ [interval]; "
            + fs.interval_text(cfg["ci"], what="exponent $\\alpha$", method=cfg.get("method"))
            + f", {cfg['n_resamples']} resamples of the replicates within each n. Dotted: slope $n^{{-1/2}}$ "
            "through the geometric mean of all points (Theorem 4's rate for the gate, the parametric rate for the "
            "angle; a reference, not a fit). " + MATCHING + ".")
    fs.caption(fig, text)
    fs.save(fig, path)


def _median_range(ax, frame: pd.DataFrame, x: str, y: str, color: str, fmt: str, label: str) -> None:
    """Median of ``y`` per ``x`` (markers joined by a line) with min-to-max bars over the replicates."""
    g = frame.groupby(x)[y]
    med = g.median()
    ax.errorbar(med.index, med, yerr=[med - g.min(), g.max() - med], fmt=fmt, color=color, ms=5, capsize=3,
                lw=1.5, label=label)


def _fig_sigma(path: Path, sig: pd.DataFrame, n: int) -> None:
    """Two-stage vs oracle gate error, and the L4 regressor angle, against sigma."""
    from moestat import figstyle as fs

    fig, axes, legend_ax = fs.subplots(1, 2, figsize=(fs.PAGE_WIDTH_IN, 4.0), legend_height=0.55)
    ax_gate, ax_reg = axes.flat
    methods = sorted(set(sig["method"]), key=lambda m: (m != "tensor", m))
    for method in methods:
        g = sig[sig["method"] == method]
        _median_range(ax_gate, g, "sigma", "gate_l2", COLORS.get(method, "C2"), "-o", METHOD_NAMES.get(method, method))
    tensor = sig[sig["method"] == "tensor"]
    _median_range(ax_reg, tensor, "sigma", "reg_angle", COLORS["tensor"], "-o", METHOD_NAMES["tensor"])
    sigmas = sorted(sig["sigma"].unique())
    for ax, metric, title in ((ax_gate, "gate_l2", "gate error: two-stage vs oracle"),
                              (ax_reg, "reg_angle", r"regressor angle of $L_4$")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sigmas, [f"{s:g}" for s in sigmas])
        ax.set_xticks([], minor=True)
        fs.finish_axes(ax, title=title, xlabel="sigma")
        fs.finish_axes(ax, ylabel=YLABELS[metric], raw=True)
    handles, labels = ax_gate.get_legend_handles_labels()
    fs.legend_panel(legend_ax, handles, labels, ncol=len(handles))
    reps = sig.groupby(["method", "sigma"]).size()
    fs.caption(fig, f"n = {n:,} per data set, d = 10, k = 2; one "
                    "random start per replicate. Markers: median over "
                    f"{_count(reps)} independent replicates per $\\sigma$; bars: min to max over them. The gap "
                    "between the two-stage and the oracle gate error is the floor "
                    "$\\kappa\\varepsilon_{\\mathrm{reg}}/(1-\\rho_\\sigma)$ of Theorems 3-4. " + MATCHING + ".")
    fs.save(fig, path)


def _fig_nonlinear(path: Path, nonlin: pd.DataFrame) -> None:
    """Median regressor angle of the tensor method per activation, gate (orthogonal/random) and n."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from moestat import figstyle as fs

    fig, ax = _one_panel(4.0)
    acts = list(dict.fromkeys(nonlin["activation"]))
    combos = [(gate, n) for gate in ("orthogonal", "random") for n in sorted(nonlin["n"].unique())]
    combos = [c for c in combos if ((nonlin["gate"] == c[0]) & (nonlin["n"] == c[1])).any()]
    width = 0.8 / len(combos)
    ns = sorted(nonlin["n"].unique())
    shades = {n: 0.45 + 0.55 * i / max(1, len(ns) - 1) for i, n in enumerate(ns)}
    for j, (gate, n) in enumerate(combos):
        color = COLORS["tensor"] if gate == "orthogonal" else COLORS["em"]
        sub = nonlin[(nonlin["gate"] == gate) & (nonlin["n"] == n)]
        for i, act in enumerate(acts):
            vals = sub.loc[sub["activation"] == act, "reg_angle"].to_numpy(float)
            if not len(vals):
                continue
            x = i - 0.4 + width * (j + 0.5)
            ax.bar(x, np.median(vals), width * 0.92, color=color, alpha=shades[n], edgecolor=color)
            ax.plot(np.full(len(vals), x), vals, "o", color="k", ms=3.5, mfc="white", mew=1)
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.5 * nonlin["reg_angle"].min())
    ax.set_xticks(range(len(acts)), [f"$g$ = {ACTIVATIONS.get(a, a)}" for a in acts])
    fs.finish_axes(ax, title="tensor method, non-linear experts: orthogonal vs random gate")
    fs.finish_axes(ax, ylabel=YLABELS["reg_angle"], raw=True)
    handles = [Patch(color=COLORS["tensor"] if g == "orthogonal" else COLORS["em"], alpha=shades[n])
               for g, n in combos]
    labels = [f"{g} gate, n = {n:,}" for g, n in combos]
    handles.append(Line2D([], [], ls="", marker="o", color="k", mfc="white", ms=3.5))
    labels.append("one replicate")
    leg = fs.legend_below(ax, ncol=3, handles=handles, labels=labels)
    reps = nonlin.groupby(["activation", "gate", "n"]).size()
    fs.note(ax, f"Bars: median over {_count(reps)} independent replicates (one random start each); dots: each "
                "replicate. d = 10, k = 2, $\\sigma$ = 0.05. Orthogonal gate: a unit vector orthogonal to the "
                "experts (the theory's assumption); random: uniform on the sphere.", below=leg)
    fs.save(fig, path)


def _fig_scaling(path: Path, scaling: pd.DataFrame, n: int) -> None:
    """Fraction of random starts recovered per (d, k), tensor vs EM."""
    from moestat import figstyle as fs

    fig, ax = _one_panel(3.8)
    ok = scaling.assign(ok=paper.recovered(scaling)).groupby(["method", "d", "k"])["ok"]
    frac, total = ok.mean().unstack("method"), ok.size().unstack("method")
    methods = [m for m in ("tensor", "em") if m in frac.columns] + [m for m in frac.columns
                                                                   if m not in ("tensor", "em")]
    width = 0.8 / len(methods)
    for j, method in enumerate(methods):
        x = np.arange(len(frac)) - 0.4 + width * (j + 0.5)
        ax.bar(x, frac[method], width * 0.92, color=COLORS.get(method, "C2"), label=METHOD_NAMES.get(method, method))
        for xi, f, t in zip(x, frac[method], total[method], strict=True):
            ax.text(xi, f + 0.02, f"{round(f * t):d}/{t:d}", ha="center", va="bottom",
                    fontsize=fs.fontsize(fig, "legend"))
    ax.set_xticks(range(len(frac)), [f"$d$ = {d}, $k$ = {k}" for d, k in frac.index])
    ax.set_ylim(0, 1.15)
    fs.finish_axes(ax, title="scaling in (d, k): fraction of random starts recovered",
                   ylabel="fraction of starts recovered", raw=True)
    leg = fs.legend_below(ax, ncol=len(methods))
    fs.note(ax, f"Bars: fraction of the {_count(total.to_numpy().ravel())} random starts (same starts for both "
                f"methods, one data set per (d, k), n = {n:,}"
                ", random unit experts, gate orthogonal to them) that reach "
                f"$\\mathcal{{E}}_{{\\mathrm{{reg}}}} \\leq$ {paper.SUCCESS['E_reg']} and "
                f"$\\max_i \\|\\hat w_i - w_i^*\\|_2 \\leq$ {paper.SUCCESS['gate_l2']}; printed: recovered / "
                "starts.", below=leg)
    fs.save(fig, path)


def _figures(out: Path, hist: pd.DataFrame, final: pd.DataFrame, rate_results: dict,
             sig: pd.DataFrame, nonlin: pd.DataFrame, scaling: pd.DataFrame, cfg: dict) -> None:
    """The five figures of the page, in ``moestat.figstyle``; ``cfg`` is the run's size (``SIZES[size]``) for the
    captions (``final`` is not drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    from moestat import figstyle as fs

    with fs.style():
        _fig_compare(out / "fig_compare_iterations.png", hist, cfg["fits"]["em"]["gate_steps"])
        _fig_vs_n(out / "fig_vs_n.png", rate_results)
        _fig_sigma(out / "fig_sigma.png", sig, cfg["sigma"]["n"])
        _fig_nonlinear(out / "fig_nonlinear.png", nonlin)
        _fig_scaling(out / "fig_scaling.png", scaling, cfg["scaling"]["n"])


# %% [markdown]
# ## Run everything
#
# Each part's study writes its cells to ``study/<part>/cells/`` (one file per cell, written atomically with a
# checksum) and the cells' side tables to ``study/<part>/pieces/restarts/`` (every random start's errors) and
# ``study/<part>/pieces/history/`` (the comparison's per-iteration errors); a rerun resumes from them and refits
# nothing.  The tables below are the studies' frames and pieces in the layout of ``results.csv``.

# %%
_ERRORS = ("E_reg", "reg_angle", "reg_l2", "reg_l2_unsigned", "E_gate", "gate_l2", "gate_fro")


def _table(study, frame: pd.DataFrame, **knobs: str) -> pd.DataFrame:
    """A study frame (or ``restarts`` piece) as ``method, rep, [restart,] errors, knobs``; a knob is a column of
    the frame (``n``, ``selected``) or a data knob of the row's truth."""
    data = {t["label"]: t["data"] for t in study.truths}
    idx = [c for c in ("rep", "restart") if c in frame.columns]
    out = frame[idx + sorted(c for c in _ERRORS if c in frame.columns)].copy()
    out.insert(0, "method", frame["fit"].to_numpy())
    for name, key in knobs.items():
        out[name] = frame[key].to_numpy() if key in frame.columns else [data[t].get(key) for t in frame["truth"]]
    return out.reset_index(drop=True)


def _long(parts: dict[str, pd.DataFrame], size: str) -> pd.DataFrame:
    """``results.csv``: one row per (part, fit, setting, metric)."""
    long = []
    for part, frame in parts.items():
        keys = [c for c in frame.columns if c not in _ERRORS]
        m = frame.melt(id_vars=keys, value_vars=[c for c in _ERRORS if c in frame], var_name="metric")
        m.insert(0, "part", part)
        long.append(m)
    results = pd.concat(long, ignore_index=True)
    results["size"] = size
    return results


def run(out, quick: bool = False, resume: bool = True) -> None:
    """Run all parts through ``moestat.Study``, writing ``study/<part>/``, ``results.csv``, ``rates.csv``,
    ``compare_summary.csv``, figures and ``provenance.json``."""
    import torch

    from moestat.provenance import write_provenance

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    size, cfg = _size(quick)
    torch.manual_seed(cfg["seed"])
    studies = make_studies(size)
    frames = {part: study.run(out / "study" / part, resume=resume, progress=False) for part, study in studies.items()}

    def piece(part: str, name: str) -> pd.DataFrame:
        return studies[part].pieces(name, checkpoint=out / "study" / part)

    final = _table(studies["compare"], piece("compare", "restarts"))
    final = final.sort_values(["method", "rep", "restart"], ignore_index=True)  # as the earlier script's pivot
    hist = piece("compare", "history").rename(columns={"fit": "method"})
    hist = hist[hist["metric"].isin(["E_reg", "gate_l2", "loss"])]
    vs_n = pd.concat([_table(studies[p], frames[p], n="n") for p in ("vs_n", "vs_n_em")], ignore_index=True)
    vs_n = vs_n.sort_values("n", kind="stable", ignore_index=True)  # by n, then tensor, gate|A=A*, em
    sig = _table(studies["sigma"], frames["sigma"], sigma="sigma")
    nonlin = _table(studies["nonlinear"], frames["nonlinear"], activation="activation", gate="gate", n="n")
    scaling = _table(studies["scaling"], piece("scaling", "restarts"), d="d", k="k", selected="selected")
    nongauss = _table(studies["nongauss"], frames["nongauss"], inputs="inputs", p="mixture_p")
    rates, rate_results = paper.rate_table(vs_n)

    parts = {"compare": final, "vs_n": vs_n, "sigma": sig, "nonlinear": nonlin, "scaling": scaling,
             "nongauss": nongauss}
    _long(parts, size).to_csv(out / "results.csv", index=False)
    rates.to_csv(out / "rates.csv", index=False)
    summary = (final.assign(success=paper.recovered(final)).groupby("method")
               .agg(starts=("success", "size"), success_fraction=("success", "mean"),
                    median_E_reg=("E_reg", "median"), median_gate_l2=("gate_l2", "median")).reset_index())
    summary.to_csv(out / "compare_summary.csv", index=False)
    _figures(out, hist, final, rate_results, sig, nonlin, scaling, cfg)
    write_provenance(out, {"vignette": NAME, "size": size, "success": paper.SUCCESS, **cfg,
                           "truth": "d=10, k=2, a*=e1,e2, w1*=e3 (w2*=0), g=identity, sigma=0.05 unless stated",
                           "inputs_check": "check_inputs=False in the non-Gaussian part (the fit warns otherwise)",
                           "rate_fit": paper.rate_config(), "cell": CELL,
                           "studies": {part: f"study/{part}" for part in studies}})


# %%
if __name__ == "__main__":
    import sys

    from moestat._vignette import vignette_cli

    sys.exit(vignette_cli(run, NAME))
