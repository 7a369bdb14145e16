# %% [markdown]
# # Patch-level routing needs fewer samples than a CNN (chowdhury2023)
#
# Chowdhury et al. (ICML 2023) prove that a patch-level MoE (pMoE) whose experts each keep the
# top-l of the n patches (expert-choice routing) learns with
# $N_S = \Omega(l^8 \cdots)$ samples where a CNN over all patches needs $N_C = \Omega(n^8 \cdots)$,
# and report that on 16-patch MNIST composites pMoE "only requires 60% of the training samples
# needed by CNN to achieve 95% test accuracy" (§5.1, Fig. 4).
#
# This vignette treats the claim as a statistical experiment:
#
# 1. **Accuracy against the training size** for separate-training pMoE (k = 2, l = 2; the routers
#    minimise the linear loss (6) first), joint-training pMoE (k = 8, l = 6, softmax over the
#    selected patches: the corrected eq. (4)) and the CNN (eq. 5), all with m = 40 neurons, SGD with
#    $\eta = 0.2$, batch 20, trained until zero training error (at most 150 epochs), on
#    * the paper's synthetic data model (unit-norm patterns, one discriminative patch among n = 16),
#    * a real-data variant: the 8x8 handwritten digits that scikit-learn ships, "1" vs "0"
#      discriminative, digits 2-9 irrelevant (the paper uses 28x28 MNIST).
# 2. **Sample complexity** $n^*$: the smallest training size whose mean test accuracy reaches the
#    target, interpolated on the log grid, with a bootstrap CI over runs (``moestat.rates``), and the
#    ratio $n^*_{pMoE}/n^*_{CNN}$ with its CI.
# 3. **Scaling with n/l**: $n^*$ for n in {4, 8, 16, 32} patches at l = 2. The theory predicts
#    $\log(N_C/N_S)$ grows with slope **at most 8** in $\log(n/l)$, $N_C$ with slope at most 8 in
#    $\log n$ and $N_S$ not at all in n. These are *upper bounds* (sufficient conditions, with hidden
#    constants and log factors, and with the network width also growing as $n^{10}$) — a measured
#    slope below 8 is consistent with the theory; the paper itself observed a ratio near 1.7 where
#    $(n/l)^8 \approx 1.7 \times 10^7$.
# 4. **Joint training against k and l at fixed N** (Figs. 6-7): test accuracy as the number of
#    experts k or the patches per expert l moves from the §5.1 setting (k = 8, l = 6), on synthetic
#    data with $l^* = 6$ (``--parts sweeps`` runs only this part; ``sweeps.csv``, ``sweep_k_l.png``).

# %%
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import moestat as ms
from moestat._placement import executor_for, parse_workers
from moestat.papers import chowdhury2023 as paper

NAME = "patch-routing"
TITLE = "Patch-level routing (pMoE) vs CNN: sample complexity and its scaling with n/l"

CELL = "moestat.papers.chowdhury2023:patch_cell"
# Joint-training sweeps (Figs. 6-7): synthetic data with 5 confuser patches closer to o_1 in every sample, so
# Definition D.3 gives l* = 6 as in the paper's Fig. 7 (delta_r = 0.6 > (1 - delta_d)/2 lets them outrank o_1).
# The swept knob moves from the paper's joint setting k = 8, l = 6 (§5.1) with m = 40 neurons in total.
SWEEP_DATA = {"n_patches": 16, "delta_r": 0.6, "n_confusers": [5, 0], "base_k": 8, "base_l": 6}


def config(quick: bool = False) -> dict:
    """Every knob of the experiment (the full size is what docs/vignettes/patch-routing.md shows)."""
    targets = {v: list(t) for v, t in paper.TARGETS["quick" if quick else "full"].items()}
    if quick:
        grid = [8, 16, 32, 64, 128, 256, 512]
        return {
            "seed": 2023, "quick": True, "m": 40, "lr": 0.2, "batch_size": 20, "max_epochs": 30,
            "router_epochs": 100, "n_test": 500, "d": 64, "n_resamples": 500,
            "blocks": [
                {"variant": "synthetic", "n_patches": 16, "models": ["pmoe", "cnn"], "runs": 3, "grid": grid},
                {"variant": "synthetic", "n_patches": 4, "models": ["pmoe", "cnn"], "runs": 3, "grid": grid},
                {"variant": "synthetic", "n_patches": 8, "models": ["pmoe", "cnn"], "runs": 3, "grid": grid},
                {"variant": "synthetic", "n_patches": 16, "l": 4, "models": ["pmoe"], "runs": 3, "grid": grid},
                {"variant": "synthetic", "n_patches": 16, "l": 8, "models": ["pmoe"], "runs": 3, "grid": grid},
                {"variant": "digits", "n_patches": 16, "models": ["pmoe", "cnn"], "runs": 3, "grid": grid},
            ],
            "targets": targets,
            "sweeps": {**SWEEP_DATA, "sizes": [64], "runs": 3, "k_grid": [1, 2, 8, 20], "l_grid": [1, 2, 6, 10]},
        }
    grid = [8, 11, 16, 23, 32, 45, 64, 91, 128, 181, 256, 362, 512, 724, 1024]
    return {
        "seed": 2023, "quick": False, "m": 40, "lr": 0.2, "batch_size": 20, "max_epochs": 150,
        "router_epochs": 100, "n_test": 1000, "d": 64, "n_resamples": 2000,
        "blocks": [
            {"variant": "synthetic", "n_patches": 16, "models": ["pmoe", "pmoe-joint", "cnn"], "runs": 8,
             "grid": grid},
            {"variant": "synthetic", "n_patches": 4, "models": ["pmoe", "cnn"], "runs": 8, "grid": grid},
            {"variant": "synthetic", "n_patches": 8, "models": ["pmoe", "cnn"], "runs": 8, "grid": grid},
            {"variant": "synthetic", "n_patches": 32, "models": ["pmoe", "cnn"], "runs": 8, "grid": grid},
            *({"variant": "synthetic", "n_patches": 32, "l": l, "models": ["pmoe"], "runs": 8, "grid": grid}
              for l in (4, 8, 16)),
            {"variant": "digits", "n_patches": 16, "models": ["pmoe", "pmoe-joint", "cnn"], "runs": 6,
             "grid": [16, 32, 64, 128, 256, 512, 1024, 2048]},
        ],
        "targets": targets,
        "sweeps": {**SWEEP_DATA, "sizes": [32, 64, 128, 256, 512], "runs": 20, "k_grid": [1, 2, 4, 5, 8, 10, 20, 40],
                   "l_grid": [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15]},
    }


# %% [markdown]
# ## The blocks as studies
#
# A *block* is one data distribution (variant, n patches) and its models: one ``moestat.Study`` whose truth
# is the data setting (``data``: the ``simulate_patches`` knobs, the block's training sizes and its seed),
# whose fits are the models (``options``: the ``fit_pmoe`` / ``fit_cnn`` settings) and whose ``n`` is the
# training size. Each cell (model, N) is ``moestat.papers.chowdhury2023.patch_cell``: it trains the model on
# the first N samples of every run's replicate (all runs in one batched tensor program) and scores test
# accuracy on an independent test set of ``n_test`` samples (the digits test set draws its images from a
# held-out pool). All models of a block see the same training replicates (common random numbers). The
# vignette keeps its own seed streams (``seed_key``), so the numbers are those of the earlier one-fit-per-block
# version: lane (run r, size N) gets the same seed as in a batched fit over every (run, size).

# %%
VARIANT_CODE = {"synthetic": 0, "digits": 1}


def block_name(block: dict) -> str:
    """Name of a block's study (its folder under ``out/study``)."""
    tag = f"-l{block['l']}" if "l" in block else ""
    return f"{block['variant']}-n{block['n_patches']}{tag}"


def _training(cfg: dict) -> dict:
    return {"m": cfg["m"], "lr": cfg["lr"], "batch_size": cfg["batch_size"], "epochs": cfg["max_epochs"],
            "stop_at_zero_error": True}


def block_study(cfg: dict, block: dict) -> ms.Study:
    """The study of one block: truth = its data setting, fits = its models, n = its training sizes."""
    key = [cfg["seed"], VARIANT_CODE[block["variant"]], block["n_patches"]]
    data = {"variant": block["variant"], "n_patches": block["n_patches"], "sizes": list(block["grid"]),
            "n_test": cfg["n_test"], "seed_key": key}
    if block["variant"] == "synthetic":
        data["d"] = cfg["d"]
    extra = [block["l"]] if "l" in block else []   # blocks that vary l share the data, not the model seeds
    fits = []
    for model in block["models"]:
        spec = paper.MODELS[model]
        opts = {"fit": spec["fit"], "model": model, **_training(cfg),
                "seed_key": [*key, 2, list(paper.MODELS).index(model), *extra]}
        if spec["fit"] == "pmoe":
            opts.update(training=spec["training"], k=spec["k"], l=block.get("l", spec["l"]),
                        router_epochs=cfg["router_epochs"])
        fits.append({"label": model, "options": opts})
    return ms.Study(truth={"label": f"{block['variant']}-n{block['n_patches']}", "data": data}, fit=fits,
                    n=list(block["grid"]), reps=block["runs"], seed=cfg["seed"], threads=1,
                    name=f"{NAME}-{block_name(block)}", cell=CELL)


def sweep_study(cfg: dict) -> ms.Study:
    """The joint-training sweeps: truth = the l* = 6 synthetic data, one fit per (knob, value), n = the sizes."""
    sw = cfg["sweeps"]
    data = {"variant": "synthetic", "n_patches": sw["n_patches"], "d": cfg["d"], "delta_r": sw["delta_r"],
            "n_confusers": list(sw["n_confusers"]), "sizes": list(sw["sizes"]), "n_test": cfg["n_test"],
            "seed_key": [cfg["seed"], 2, sw["n_patches"]]}
    fits = []
    for knob, values in (("k", sw["k_grid"]), ("l", sw["l_grid"])):
        for value in values:
            k = int(value) if knob == "k" else sw["base_k"]
            l = int(value) if knob == "l" else sw["base_l"]
            fits.append({"label": f"{knob}={int(value)}", "options": {
                "fit": "pmoe", "training": "joint", "k": k, "l": l, **_training(cfg), "sweep": knob,
                "seed_key": [cfg["seed"], 3, {"k": 0, "l": 1}[knob], int(value)]}})
    return ms.Study(truth={"label": f"sweep-n{sw['n_patches']}", "data": data}, fit=fits, n=list(sw["sizes"]),
                    reps=sw["runs"], seed=cfg["seed"], threads=1, name=f"{NAME}-sweeps", cell=CELL)


STUDY_COLUMNS = {"study", "truth", "fit", "n", "estimator", "seed", "data_seed", "fit_seed", "status", "message",
                 "wall_time", "opt_fit", "seed_key", "sweep_key"}


def _lanes(frame: pd.DataFrame, study: ms.Study) -> pd.DataFrame:
    """One row per (fit, run, size) in the order of a batched fit (fit, then lane); the cell's columns only."""
    order = {f["label"]: i for i, f in enumerate(study.fits)}
    frame = frame.assign(_order=frame["fit"].map(order)).sort_values(["_order", "lane"], kind="stable")
    keep = [c for c in frame.columns if c not in STUDY_COLUMNS and not c.startswith(("truth_", "_"))]
    return frame[keep].rename(columns={"rep": "run", "lane_seed": "seed"}).reset_index(drop=True)


def _run_study(study: ms.Study, folder: Path, resume: bool,
               workers: int | str | dict[str, int] | None) -> pd.DataFrame:
    pools = parse_workers(workers)
    frame = study.run(folder, resume=resume, progress=False, executor=executor_for(pools), workers=pools)
    return _lanes(frame, study)


# %% [markdown]
# ## Sample complexity, the pMoE / CNN ratio and the scaling with n/l
#
# ``moestat.rates.sample_complexity`` finds $n^*$ on each accuracy curve (mean over runs; the first
# crossing of the target, interpolated in $\log N$) and bootstraps runs within each N for a CI;
# right-censored means the target was never reached on the grid. ``sample_complexity_ratio`` gives
# $n^*_{pMoE}/n^*_{CNN}$ with a CI from the two models' bootstrap draws of $\log n^*$;
# ``scaling_against_bound`` regresses $\log n^*$ on $\log n$ (or $\log l$) next to the theorem's bound and
# ``ratio_scaling_exponent`` fits the ratio's slope on $\log(n/l)$ on the paired draws
# (``moestat.rates.ratios``). Which ratios and slopes, and the bounds they are judged against, are the
# paper's: ``moestat.papers.chowdhury2023.rates_table``.

# %% [markdown]
# ## Figures
#
# Drawn in the package style (``moestat.figstyle``): a title on every panel, mathtext axis labels, legends in a
# row under the panels or under the axes (never over the data) and a caption that says what a marker, a line and
# an error bar are, over how many runs, and at which level the intervals are. ``redraw`` redraws them from the
# CSVs a run wrote (no training).

# %%
CONFIDENCE_LEVEL = 0.95
"""Level of the $n^*$ intervals of rates.csv (the default of ``moestat.rates.sample_complexity``)."""

COLORS = {"pmoe": "C0", "pmoe-joint": "C2", "cnn": "C3"}


def model_name(model: str) -> str:
    """Display name of a model of ``paper.MODELS`` for legends, e.g. "pMoE, separate training (k = 2, l = 2)"."""
    spec = paper.MODELS[model]
    if spec["fit"] == "cnn":
        return "CNN (all n patches)"
    return f"pMoE, {spec['training']} training ($k$ = {spec['k']}, $l$ = {spec['l']})"


def _run_counts(frame: pd.DataFrame, keys: list[str], run: str = "run") -> list[int]:
    """Runs behind each plotted point (one point per ``keys`` group)."""
    return [int(v) for v in frame.groupby(keys)[run].nunique()]


def _accuracy_figure(results: pd.DataFrame, rates: pd.DataFrame, out: Path, n_test: int | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from moestat import figstyle as fs

    main = results[results["n_patches"] == 16]
    variants = sorted(main["variant"].unique(), reverse=True)
    with fs.style():
        fig, axes, legend_ax = fs.subplots(1, len(variants), figsize=(fs.PAGE_WIDTH_IN, 3.6 + 0.6),
                                           legend_height=0.6)
        handles: dict[str, object] = {}
        for ax, variant in zip(axes[0], variants, strict=True):
            sub = main[main["variant"] == variant]
            for model in [m for m in paper.MODELS if m in set(sub["model"])]:
                s = sub[sub["model"] == model].groupby("n_train")["accuracy"].agg(["mean", "std"])
                handles[model_name(model)] = ax.errorbar(s.index, s["mean"], yerr=s["std"].fillna(0.0), marker="o",
                                                         ms=3, capsize=2, color=COLORS.get(model))
            for target in sorted(set(rates.loc[rates["variant"] == variant, "target"].dropna())):
                handles["target accuracy (defines $n^*$)"] = ax.axhline(target, color="0.5", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            fs.finish_axes(ax, title=f"{variant} data, n = 16 patches", xlabel="n_train", ylabel="accuracy")
        fs.legend_panel(legend_ax, list(handles.values()), list(handles), ncol=2)
        runs = _run_counts(main, ["variant", "model", "n_train"])
        tests = f" ({n_test:,} test samples)" if n_test else ""
        fs.caption(fig, fs.bars_text("1sd", runs, unit="runs", centre=f"mean test accuracy{tests}")
                   + "; all models of a panel are trained on the same replicates.")
        fs.save(fig, out / "accuracy_vs_n.png")


def _nstar_figure(rates: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from moestat import figstyle as fs

    ns = rates[(rates["kind"] == "n_star") & (rates["variant"] == "synthetic")]
    if ns["n_patches"].nunique() < 3:
        return
    target = max(ns["target"])
    ns = ns[(ns["target"] == target) & ns["model"].isin(["pmoe", "cnn"])].copy()
    base_l = paper.MODELS["pmoe"]["l"]
    ns["x"] = np.where(ns["model"] == "cnn", ns["n_patches"] / base_l, ns["n_patches"] / ns["l"])
    n_big = ns.loc[(ns["model"] == "pmoe") & (ns["l"] != base_l), "n_patches"]
    series = {f"CNN (plotted at $n/{base_l}$)": (ns["model"] == "cnn", "C3"),
              f"pMoE, $l$ = {base_l}, n varies": ((ns["model"] == "pmoe") & (ns["l"] == base_l), "C0")}
    if not n_big.empty:
        nb = int(n_big.iloc[0])
        series[f"pMoE, n = {nb}, $l$ varies"] = ((ns["model"] == "pmoe") & (ns["n_patches"] == nb), "C9")
    with fs.style():
        fig, axes, _ = fs.subplots(1, 1, figsize=(fs.PAGE_WIDTH_IN, 4.4))
        ax = axes[0, 0]
        for name, (mask, color) in series.items():
            g = ns[mask & np.isfinite(ns["n_star"])].sort_values("x")   # censored n* are not drawn
            yerr = np.vstack([g["n_star"] - g["ci_low"], g["ci_high"] - g["n_star"]])
            yerr = np.clip(np.nan_to_num(yerr, nan=0.0, posinf=0.0), 0, None)
            ax.errorbar(g["x"], g["n_star"], yerr=yerr, marker="o", capsize=3, label=name, color=color)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        fs.finish_axes(ax, title=f"synthetic data: sample complexity $n^*$ at {target:.0%} accuracy vs $n/l$",
                       xlabel=r"$n/l$ (patches / patches kept per expert)",
                       ylabel=rf"$n^*$ (training samples for {target:.0%})", raw=True)
        leg = fs.legend_below(ax, ncol=3)
        level = fs.interval_text(CONFIDENCE_LEVEL, what="$n^*$", method="bootstrap of the runs within each N")
        fs.note(ax, f"markers: $n^*$, first crossing of the target by the mean accuracy over runs; bars: "
                    f"{level.removeprefix('[ ]: ')}; a censored $n^*$ (target not reached) is not drawn.", below=leg)
        fs.save(fig, out / "nstar_vs_n_over_l.png")


def plot(results: pd.DataFrame, rates: pd.DataFrame, out: Path, *, n_test: int | None = None) -> None:
    """accuracy_vs_n.png (mean test accuracy ± 1 SD over runs against N, n = 16 patches, one panel per data
    variant) and nstar_vs_n_over_l.png ($n^*$ with its bootstrap CI against $n/l$, synthetic data, largest
    target; drawn when rates.csv has >= 3 patch counts)."""
    out = Path(out)
    _accuracy_figure(results, rates, out, n_test)
    _nstar_figure(rates, out)


# %% [markdown]
# ## Joint training: test accuracy against k and l at fixed N (Figs. 6-7)
#
# Theorem 4.5 (joint training, conditional on the unproven router Assumption 4.4) needs
# $N_J = \Omega(k^4 l^6 \cdots/\varepsilon^{16})$ samples, i.e. at fixed N the guaranteed error
# grows like $k^{1/4} l^{3/8}$ — for $l \ge l^*$ and for k large enough that Assumption 4.4 holds.
# The paper's Figs. 6-7 plot test accuracy against k and l at fixed N (no numbers are given). Here
# one knob moves at a time from the §5.1 joint setting (k = 8, l = 6, m = 40), on synthetic data
# built to have $l^* = 6$; each knob value is one batched fit over (run, N) lanes, all values share
# the training replicates and the test set (common random numbers). ``maxgate`` is the rate of
# Assumption 4.4 / Fig. 9: the best expert takes the discriminative patch with the largest gate.

# %%
def sweeps_table(frame: pd.DataFrame) -> pd.DataFrame:
    """sweeps.csv: one row per (knob value, run, N), the swept knob first."""
    lead = ["sweep", "k", "l", "run", "n_train", "accuracy", "routing_hit", "routing_maxgate", "epochs_run",
            "model", "n_patches", "l_star"]
    return frame[lead + [c for c in frame.columns if c not in lead]]


def sweep_l_star(cfg: dict[str, Any]) -> int:
    """$l^*$ of Definition D.3 on the sweeps' test set (one plus the largest confuser count in a sample), as the
    cell records it in sweeps.csv; draws the data only (no training)."""
    data = sweep_study(cfg).truths[0]["data"]
    _, test = paper.patch_data(data, reps=1)
    return int(test.l_star())


def plot_sweep_summary(summary: pd.DataFrame, out: Path, *, l_star: int, k_fixed: int, l_fixed: int,
                       m: int) -> None:
    r"""sweep_k_l.png from sweeps_summary.csv: mean test accuracy $\pm$ 1 standard error
    ($\mathrm{sd}/\sqrt{R}$ over the R runs) against k (at $l$ = ``l_fixed``) and against l (at $k$ =
    ``k_fixed``), one line per N, the dashed line at ``l_star``."""
    import matplotlib

    matplotlib.use("Agg")
    from moestat import figstyle as fs

    sizes = sorted(summary["n_train"].unique())
    with fs.style():
        fig, axes, legend_ax = fs.subplots(1, 2, figsize=(fs.PAGE_WIDTH_IN, 3.6 + 0.5), legend_height=0.5)
        handles: dict[str, object] = {}
        for ax, knob in zip(axes[0], ("k", "l"), strict=True):
            sub = summary[summary["sweep"] == knob]
            for i, N in enumerate(sizes):
                g = sub[sub["n_train"] == N].sort_values("value")
                se = (g["accuracy_sd"] / np.sqrt(g["runs"])).fillna(0.0)
                handles[f"$N$ = {N}"] = ax.errorbar(g["value"], g["accuracy_mean"], yerr=se, marker="o", ms=3,
                                                    capsize=2, color=f"C{i}")
            if knob == "l":
                handles[f"$l^*$ = {l_star} (Definition D.3)"] = ax.axvline(l_star, color="0.4", ls="--", lw=0.9)
                fs.finish_axes(ax, title=f"accuracy vs patches per expert ($k$ = {k_fixed})",
                               xlabel="patches per expert $l$", ylabel="accuracy")
            else:
                ax.set_xscale("log", base=2)
                fs.finish_axes(ax, title=f"accuracy vs number of experts ($l$ = {l_fixed})",
                               xlabel="number of experts $k$", ylabel="accuracy")
        fs.legend_panel(legend_ax, list(handles.values()), list(handles), ncol=len(handles))
        runs = [int(r) for r in summary["runs"]]
        fs.caption(fig, fs.bars_text("1se", runs, unit="runs", centre="mean test accuracy")
                   + f"; joint-training pMoE, $m = {m}$ neurons in total, one knob moved at a time from "
                     f"$k$ = {k_fixed}, $l$ = {l_fixed}; every knob value sees the same training replicates.")
        fs.save(fig, Path(out) / "sweep_k_l.png")


def plot_sweeps(sweeps: pd.DataFrame, out: Path, *, m: int = 40) -> None:
    """sweep_k_l.png from sweeps.csv (one row per knob value, run and N): :func:`plot_sweep_summary` of
    ``paper.summarise_sweeps(sweeps)``, with $l^*$ and the fixed k and l read from the rows."""
    plot_sweep_summary(paper.summarise_sweeps(sweeps), out, l_star=int(sweeps["l_star"].iloc[0]),
                       k_fixed=int(sweeps.loc[sweeps["sweep"] == "l", "k"].iloc[0]),
                       l_fixed=int(sweeps.loc[sweeps["sweep"] == "k", "l"].iloc[0]), m=m)


def redraw(folder: str | Path, quick: bool = False) -> list[str]:
    """Redraw the figures in ``folder`` from the CSVs a run wrote there (no training): accuracy_vs_n.png and
    nstar_vs_n_over_l.png need results.csv and rates.csv; sweep_k_l.png needs sweeps.csv or, failing that,
    sweeps_summary.csv (with $l^*$ and the fixed k, l of ``config(quick)``).  Returns the figures drawn."""
    folder = Path(folder)
    cfg = config(quick)
    drawn = []
    if (folder / "results.csv").exists() and (folder / "rates.csv").exists():
        plot(pd.read_csv(folder / "results.csv"), pd.read_csv(folder / "rates.csv"), folder, n_test=cfg["n_test"])
        drawn += [p for p in ("accuracy_vs_n.png", "nstar_vs_n_over_l.png") if (folder / p).exists()]
    sw = cfg["sweeps"]
    if (folder / "sweeps.csv").exists():
        plot_sweeps(pd.read_csv(folder / "sweeps.csv"), folder, m=cfg["m"])
        drawn.append("sweep_k_l.png")
    elif (folder / "sweeps_summary.csv").exists():
        plot_sweep_summary(pd.read_csv(folder / "sweeps_summary.csv"), folder, l_star=sweep_l_star(cfg),
                           k_fixed=sw["base_k"], l_fixed=sw["base_l"], m=cfg["m"])
        drawn.append("sweep_k_l.png")
    return drawn


# %% [markdown]
# ## Run

# %%
def run(out, quick: bool = False, resume: bool = True, *, variants: tuple[str, ...] | None = None,
        parts: tuple[str, ...] = ("blocks", "sweeps"), workers: int | str | dict[str, int] | None = None) -> None:
    """Run every block study and the sweeps; write results.csv, rates.csv, sweeps.csv, figures, provenance.json.

    Each study checkpoints its cells under ``out/study/<block>`` (``out/study/sweeps``) and resumes them.
    ``variants`` restricts the blocks to some data variants (e.g. to split the work over two processes that
    share ``out``); the analysis then uses the blocks run. ``parts`` picks the pieces: ``"blocks"`` (accuracy
    vs N, n*, ratios, scaling: results.csv, rates.csv) and/or ``"sweeps"`` (joint training vs k and l at fixed
    N: sweeps.csv, sweep_k_l.png). ``workers`` > 1 runs each study's cells in that many processes.
    """
    from moestat.provenance import write_provenance

    unknown = set(parts) - {"blocks", "sweeps"}
    if unknown or not parts:
        raise ValueError(f"parts must be a non-empty subset of ('blocks', 'sweeps'), got {parts!r}.")
    out = Path(out)
    cfg = config(quick)
    frames, studies = [], []
    for block in cfg["blocks"] if "blocks" in parts else []:
        if variants is not None and block["variant"] not in variants:
            continue
        studies.append(block_name(block))
        frames.append(_run_study(block_study(cfg, block), out / "study" / block_name(block), resume, workers))
    sweeps = None
    if "sweeps" in parts:
        studies.append("sweeps")
        sweeps = sweeps_table(_run_study(sweep_study(cfg), out / "study" / "sweeps", resume, workers))
    if frames:
        results = pd.concat(frames, ignore_index=True)
        lead = ["model", "run", "n_train", "accuracy", "variant", "l", "n_patches", "k", "m", "epochs_run"]
        results = results[lead + [c for c in results.columns if c not in lead]]
        results.to_csv(out / "results.csv", index=False)
        rates = paper.rates_table(results, cfg["targets"], n_resamples=cfg["n_resamples"], seed=cfg["seed"],
                                  base_l=paper.MODELS["pmoe"]["l"])
        rates.to_csv(out / "rates.csv", index=False)
        plot(results, rates, out, n_test=cfg["n_test"])
    if sweeps is not None:
        sweeps.to_csv(out / "sweeps.csv", index=False)
        paper.summarise_sweeps(sweeps).to_csv(out / "sweeps_summary.csv", index=False)
        paper.sweep_slopes(sweeps, seed=cfg["seed"]).to_csv(out / "sweep_slopes.csv", index=False)
        plot_sweeps(sweeps, out, m=cfg["m"])
    write_provenance(out, {"vignette": NAME, **cfg, "models": json.loads(json.dumps(paper.MODELS)),
                           "parts": list(parts), "torch_threads_training": 1, "cell": CELL,
                           "studies": [f"study/{s}" for s in studies]})


# %%
if __name__ == "__main__":
    import argparse
    import functools
    import sys

    from moestat._vignette import vignette_cli

    # extra switches of this vignette: --parts sweeps runs only the Figs. 6-7 sweeps (blocks, sweeps or both);
    # --workers N runs each study's cells in N processes; --redraw FOLDER redraws the figures of FOLDER from its
    # CSVs (no training; e.g. docs/vignettes/patch-routing)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--parts", default="blocks,sweeps")
    pre.add_argument("--workers", default=None, help="worker processes, or pools per device: cuda=2,cpu=14")
    pre.add_argument("--redraw", default=None)
    known, rest = pre.parse_known_args()
    if known.redraw is not None:
        print("redrawn:", ", ".join(redraw(known.redraw, quick="--quick" in rest)) or "nothing (no CSVs)")
        sys.exit(0)
    sys.exit(vignette_cli(functools.partial(run, parts=tuple(known.parts.split(",")), workers=known.workers),
                          NAME, rest))
