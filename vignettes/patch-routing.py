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

import numpy as np
import pandas as pd

NAME = "patch-routing"
TITLE = "Patch-level routing (pMoE) vs CNN: sample complexity and its scaling with n/l"

MODELS = {
    "pmoe": {"fit": "pmoe", "training": "separate", "k": 2, "l": 2},
    "pmoe-joint": {"fit": "pmoe", "training": "joint", "k": 8, "l": 6},
    "cnn": {"fit": "cnn"},
}
THEORY_BOUND = 8.0  # chowdhury2023 Thms 4.2-4.3: N_C / N_S = Theta((n/l)^8) as upper bounds; N_C ~ n^8
# Joint-training sweeps (Figs. 6-7): synthetic data with 5 confuser patches closer to o_1 in every sample, so
# Definition D.3 gives l* = 6 as in the paper's Fig. 7 (delta_r = 0.6 > (1 - delta_d)/2 lets them outrank o_1).
# The swept knob moves from the paper's joint setting k = 8, l = 6 (§5.1) with m = 40 neurons in total.
SWEEP_DATA = {"n_patches": 16, "delta_r": 0.6, "n_confusers": [5, 0], "base_k": 8, "base_l": 6}


def config(quick: bool = False) -> dict:
    """Every knob of the experiment (the full size is what docs/vignettes/patch-routing.md shows)."""
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
            "targets": {"synthetic": [0.9, 0.95], "digits": [0.75, 0.8]},
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
        "targets": {"synthetic": [0.9, 0.95], "digits": [0.8, 0.85, 0.9]},
        "sweeps": {**SWEEP_DATA, "sizes": [32, 64, 128, 256, 512], "runs": 20, "k_grid": [1, 2, 4, 5, 8, 10, 20, 40],
                   "l_grid": [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15]},
    }


# %% [markdown]
# ## Training one block
#
# A *block* is one data distribution (variant, n patches). All models of a block see the same
# training replicates (common random numbers); lane (run r, size N) trains on the first N samples of
# replicate r, all lanes of a model in one batched tensor program (``moestat.deep.fit_pmoe`` /
# ``fit_cnn``). Test accuracy uses an independent test set of ``n_test`` samples (the digits test
# set draws its images from a held-out pool).

# %%
def _block_seeds(cfg: dict, block: dict) -> dict[str, np.random.SeedSequence]:
    key = [cfg["seed"], {"synthetic": 0, "digits": 1}[block["variant"]], block["n_patches"]]
    extra = [block["l"]] if "l" in block else []   # blocks that vary l share the data, not the model seeds
    return {"train": np.random.SeedSequence([*key, 0]), "test": np.random.SeedSequence([*key, 1]),
            **{m: np.random.SeedSequence([*key, 2, i, *extra]) for i, m in enumerate(MODELS)}}


def cell_name(block: dict, model: str) -> str:
    """Name of one (block, model) cell under ``out/cells`` (its file adds a hash of the cell's settings)."""
    tag = f"-l{block['l']}" if "l" in block else ""
    return f"{block['variant']}-n{block['n_patches']}{tag}-{model}"


def _store(out: Path, cfg: dict, resume: bool):
    """The finished cells (moestat.checkpoint): files named by a hash of the settings, written atomically."""
    from moestat.checkpoint import CellStore

    shared = {k: v for k, v in cfg.items() if k not in ("blocks", "sweeps")}
    return CellStore(out / "cells", config=shared, resume=resume)


def run_block(cfg: dict, block: dict, model: str) -> pd.DataFrame:
    """Train ``model`` on every (run, size) lane of ``block``; one row per lane."""
    import moestat as ms
    from moestat.deep import fit_cnn, fit_pmoe

    seeds = _block_seeds(cfg, block)
    sim = {"variant": block["variant"], "n_patches": block["n_patches"]}
    if block["variant"] == "synthetic":
        sim["d"] = cfg["d"]
    train = ms.simulate_patches(max(block["grid"]), reps=block["runs"], seed=seeds["train"], **sim)
    test = ms.simulate_patches(cfg["n_test"], seed=seeds["test"], split="test", **sim)
    spec = MODELS[model]
    common = {"m": cfg["m"], "lr": cfg["lr"], "batch_size": cfg["batch_size"], "epochs": cfg["max_epochs"],
              "stop_at_zero_error": True, "sizes": block["grid"], "seed": seeds[model]}
    if spec["fit"] == "cnn":
        fit = fit_cnn(train, **common)
    else:
        fit = fit_pmoe(train, training=spec["training"], k=spec["k"], l=block.get("l", spec["l"]),
                       router_epochs=cfg["router_epochs"], **common)
    frame = fit.to_frame(test).rename(columns={"rep": "run"})
    frame["model"] = model
    frame["variant"] = block["variant"]
    if spec["fit"] == "pmoe":
        hits = fit.routing_hit_rate(test).groupby("lane")[["hit", "maxgate"]].mean()
        frame["routing_hit"] = frame["lane"].map(hits["hit"])
        frame["routing_maxgate"] = frame["lane"].map(hits["maxgate"])
    return frame


# %% [markdown]
# ## Sample complexity, the pMoE / CNN ratio and the scaling with n/l
#
# ``moestat.rates.sample_complexity`` finds $n^*$ on each accuracy curve (mean over runs; the first
# crossing of the target, interpolated in $\log N$) and bootstraps runs within each N for a CI;
# right-censored means the target was never reached on the grid. The ratio's CI combines the two
# models' bootstrap draws of $\log n^*$. ``scaling_exponent`` regresses $\log n^*$ on
# $\log n$; the ratio's slope on $\log(n/l)$ is fitted the same way on the paired draws.

# %%
def _sorted_interval(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    s = np.sort(draws)
    b = len(s)
    lo = s[max(int(np.floor((1 - level) / 2 * b)), 0)]
    hi = s[min(int(np.ceil((1 + level) / 2 * b)) - 1, b - 1)]
    return float(lo), float(hi)


def analyse(results: pd.DataFrame, cfg: dict) -> pd.DataFrame:
    """rates.csv: n* per (variant, n_patches, model, l, target), pMoE/CNN ratios, scaling slopes."""
    from moestat.rates import sample_complexity

    rows = []
    base_l = MODELS["pmoe"]["l"]
    for variant, targets in cfg["targets"].items():
        sub = results[results["variant"] == variant]
        if sub.empty:
            continue
        for target in targets:
            kw = {"x": "n_train", "rep": "run", "n_resamples": cfg["n_resamples"]}
            sc = sample_complexity(sub, "accuracy", target, by=["n_patches", "model", "l"], seed=cfg["seed"], **kw)
            tab = sc.table.assign(kind="n_star", variant=variant)
            rows.append(tab)
            ix = tab.set_index(["n_patches", "model", "l"])
            for n_p, model, l in ix.index:
                if model != "cnn" and (n_p, "cnn", n_p) in ix.index:
                    rows.append(_ratio_row(sc, ix, (n_p, model, l), (n_p, "cnn", n_p), variant, target))
            # n* against n: pMoE at l = 2 (theory: flat, up to the router's n^2) and the CNN (l = n; bound 8)
            pm = sub[(sub["model"] == "pmoe") & (sub["l"] == base_l)]
            if pm["n_patches"].nunique() >= 3:
                sc_n = sample_complexity(pd.concat([pm, sub[sub["model"] == "cnn"]]), "accuracy", target,
                                         by=["model", "n_patches"], seed=cfg["seed"] + 1, **kw)
                for model in ("pmoe", "cnn"):
                    rows.append(_slope_row(sc_n, "n_patches", {"model": model}, variant, target,
                                           THEORY_BOUND if model == "cnn" else 0.0))
            # n* against l at fixed n for pMoE (Thm 4.2: N_S = O(l^8))
            for n_p, g in sub[sub["model"] == "pmoe"].groupby("n_patches"):
                if g["l"].nunique() >= 3:
                    sc_l = sample_complexity(g, "accuracy", target, by=["l"], seed=cfg["seed"] + 2, **kw)
                    rows.append(_slope_row(sc_l, "l", {"model": "pmoe", "n_patches": n_p}, variant, target,
                                           THEORY_BOUND))
            rows.append(_ratio_slope(sc, ix, variant, target))
    return pd.concat(rows, ignore_index=True)


def _ratio_row(sc, ix: pd.DataFrame, key_a: tuple, key_c: tuple, variant: str, target: float) -> pd.DataFrame:
    """n*_model / n*_CNN at the same n, with a CI from the two groups' bootstrap draws of log n*."""
    pa, pc = ix.loc[key_a], ix.loc[key_c]
    # a CNN draw that never reaches the target has n* > n_max: log n_max turns the ratio into an upper
    # bound (censored ".../right"); a pMoE draw at the smallest size has n* <= n_min: n_min errs against pMoE
    b = np.where(np.isposinf(sc.draws[key_c]), np.log(pc["n_max"]), sc.draws[key_c])
    a = np.where(np.isneginf(sc.draws[key_a]), np.log(pa["n_min"]), sc.draws[key_a])
    with np.errstate(invalid="ignore"):
        diff = a - b
    diff = diff[~np.isnan(diff)]
    lo, hi = _sorted_interval(diff) if diff.size else (np.nan, np.nan)
    if pa["censored"] == "none" and pc["censored"] == "none":
        point = pa["n_star"] / pc["n_star"]
    elif pa["censored"] == "none" and pc["censored"] == "right":
        point = pa["n_star"] / pc["n_max"]   # upper bound
    else:
        point = np.nan
    return pd.DataFrame([{"kind": "ratio", "variant": variant, "n_patches": key_a[0], "model": f"{key_a[1]}/cnn",
                          "l": key_a[2], "metric": "accuracy", "target": target, "n_star": point,
                          "ci_low": float(np.exp(lo)), "ci_high": float(np.exp(hi)),
                          "censored": f"{pa['censored']}/{pc['censored']}", "p_reached": diff.size / a.size}])


def _slope_row(sc, design: str, where: dict, variant: str, target: float, bound: float) -> pd.DataFrame:
    """``moestat.rates.scaling_exponent`` of log n* on log(design) for the rows matching ``where``."""
    import warnings

    from moestat.rates import scaling_exponent

    base = {"kind": "scaling", "variant": variant, "target": target, "design": design, "theory_bound": bound,
            **where}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tab = scaling_exponent(sc, design)
    except ValueError as err:  # fewer than 3 uncensored n*: say so in the table
        return pd.DataFrame([{**base, "note": str(err)}])
    for col, val in where.items():
        if col in tab.columns:
            tab = tab[tab[col] == val]
    r = tab.iloc[0]
    tag = f"model={where['model']!r}" if "model" in where else ""
    note = "; ".join(str(w.message) for w in caught if tag in str(w.message) or "the frame" in str(w.message)) or None
    return pd.DataFrame([{**base, "exponent": r["exponent"], "ci_low": r["ci_low"], "ci_high": r["ci_high"],
                          "n_points": r["n_points"], "n_censored": r["n_censored"], "note": note}])


def _ratio_slope(sc, ix: pd.DataFrame, variant: str, target: float) -> pd.DataFrame:
    """OLS slope of log(n*_CNN / n*_pMoE) on log(n/l) over every (n, l) with both n* uncensored.

    The CI refits the slope on the paired bootstrap draws (draws with a censored point are skipped).
    """
    pairs = [(n, l) for n, m, l in ix.index if m == "pmoe" and (n, "cnn", n) in ix.index]
    if len({n / l for n, l in pairs}) < 3:
        return pd.DataFrame()
    ok = [(n, l) for n, l in pairs
          if ix.loc[(n, "pmoe", l), "censored"] == "none" and ix.loc[(n, "cnn", n), "censored"] == "none"]
    base = {"kind": "scaling", "variant": variant, "model": "cnn/pmoe", "target": target, "design": "n/l",
            "theory_bound": THEORY_BOUND, "n_points": len(pairs), "n_censored": len(pairs) - len(ok)}
    if len({n / l for n, l in ok}) < 3:
        return pd.DataFrame([{**base, "note": f"only {len(ok)} (n, l) cells with both n* uncensored; need 3 values"}])
    x = np.log([n / l for n, l in ok])
    y = np.log([ix.loc[(n, "cnn", n), "n_star"] / ix.loc[(n, "pmoe", l), "n_star"] for n, l in ok])
    slope = np.polyfit(x, y, 1)[0]
    with np.errstate(invalid="ignore"):
        draws = np.column_stack([sc.draws[(n, "cnn", n)] - sc.draws[(n, "pmoe", l)] for n, l in ok])
    good = np.isfinite(draws).all(1)
    xc = x - x.mean()
    slopes = (draws[good] - draws[good].mean(1, keepdims=True)) @ xc / (xc @ xc)
    lo, hi = np.quantile(slopes, [0.025, 0.975]) if good.sum() >= 100 else (np.nan, np.nan)
    return pd.DataFrame([{**base, "exponent": float(slope), "ci_low": float(lo), "ci_high": float(hi),
                          "boot_used": int(good.sum())}])


# %% [markdown]
# ## Figures

# %%
def plot(results: pd.DataFrame, rates: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"pmoe": "C0", "pmoe-joint": "C2", "cnn": "C3"}
    main = results[results["n_patches"] == 16]
    variants = sorted(main["variant"].unique(), reverse=True)
    fig, axes = plt.subplots(1, len(variants), figsize=(5.2 * len(variants), 3.8), squeeze=False)
    for ax, variant in zip(axes[0], variants, strict=True):
        sub = main[main["variant"] == variant]
        for model, g in sub.groupby("model"):
            s = g.groupby("n_train")["accuracy"].agg(["mean", "std"])
            ax.errorbar(s.index, s["mean"], yerr=s["std"], marker="o", ms=3, capsize=2, label=model,
                        color=colors.get(model))
        for target in sorted(set(rates.loc[rates["variant"] == variant, "target"].dropna())):
            ax.axhline(target, color="grey", lw=0.6, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("training samples N")
        ax.set_ylabel("test accuracy (mean ± 1 sd over runs)")
        ax.set_title(f"{variant}, n = 16 patches")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_n.png", dpi=120)
    plt.close(fig)

    ns = rates[(rates["kind"] == "n_star") & (rates["variant"] == "synthetic")]
    if ns["n_patches"].nunique() >= 3:
        target = max(ns["target"])
        ns = ns[(ns["target"] == target) & ns["model"].isin(["pmoe", "cnn"])].copy()
        base_l = MODELS["pmoe"]["l"]
        ns["x"] = np.where(ns["model"] == "cnn", ns["n_patches"] / base_l, ns["n_patches"] / ns["l"])
        n_big = ns.loc[(ns["model"] == "pmoe") & (ns["l"] != base_l), "n_patches"]
        series = {"cnn (x = n/2)": (ns["model"] == "cnn", "C3"),
                  f"pmoe, l = {base_l}, n varies": ((ns["model"] == "pmoe") & (ns["l"] == base_l), "C0")}
        if not n_big.empty:
            nb = int(n_big.iloc[0])
            series[f"pmoe, n = {nb}, l varies"] = ((ns["model"] == "pmoe") & (ns["n_patches"] == nb), "C9")
        fig, ax = plt.subplots(figsize=(5.6, 4.0))
        for label, (mask, color) in series.items():
            g = ns[mask & np.isfinite(ns["n_star"])].sort_values("x")   # censored n* are not drawn
            yerr = np.vstack([g["n_star"] - g["ci_low"], g["ci_high"] - g["n_star"]])
            yerr = np.clip(np.nan_to_num(yerr, nan=0.0, posinf=0.0), 0, None)
            ax.errorbar(g["x"], g["n_star"], yerr=yerr, marker="o", capsize=3, label=label, color=color)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("n / l")
        ax.set_ylabel(f"n* for {target:.0%} test accuracy (95% CI)")
        ax.set_title("synthetic: sample complexity vs n/l")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "nstar_vs_n_over_l.png", dpi=120)
        plt.close(fig)



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
def sweep_cells(cfg: dict) -> list[tuple[str, int]]:
    """The (knob, value) pieces of the sweeps, in run order."""
    sw = cfg["sweeps"]
    return [("k", int(v)) for v in sw["k_grid"]] + [("l", int(v)) for v in sw["l_grid"]]


def _sweep_data(cfg: dict):
    import moestat as ms

    sw = cfg["sweeps"]
    sim = {"n_patches": sw["n_patches"], "d": cfg["d"], "delta_r": sw["delta_r"],
           "n_confusers": tuple(sw["n_confusers"])}
    key = [cfg["seed"], 2, sw["n_patches"]]
    train = ms.simulate_patches(max(sw["sizes"]), reps=sw["runs"], seed=np.random.SeedSequence([*key, 0]), **sim)
    test = ms.simulate_patches(cfg["n_test"], seed=np.random.SeedSequence([*key, 1]), **sim)
    return train, test


def run_sweep_cell(cfg: dict, knob: str, value: int, data=None) -> pd.DataFrame:
    """Joint-training pMoE with ``knob`` (``"k"`` or ``"l"``) set to ``value``; one row per (run, N) lane.

    Raises ``ValueError`` from ``fit_pmoe`` when l >= n (expert-choice top-l needs l < n) or when m is not
    a multiple of k.
    """
    from moestat.deep import fit_pmoe

    if knob not in ("k", "l"):
        raise ValueError(f"knob must be 'k' or 'l', got {knob!r}.")
    sw = cfg["sweeps"]
    train, test = _sweep_data(cfg) if data is None else data
    k = value if knob == "k" else sw["base_k"]
    l = value if knob == "l" else sw["base_l"]
    seed = np.random.SeedSequence([cfg["seed"], 3, {"k": 0, "l": 1}[knob], value])
    fit = fit_pmoe(train, training="joint", k=k, l=l, m=cfg["m"], lr=cfg["lr"], batch_size=cfg["batch_size"],
                   epochs=cfg["max_epochs"], stop_at_zero_error=True, sizes=sw["sizes"], seed=seed)
    frame = fit.to_frame(test).rename(columns={"rep": "run"})
    hits = fit.routing_hit_rate(test).groupby("lane")[["hit", "maxgate"]].mean()
    frame["routing_hit"] = frame["lane"].map(hits["hit"])
    frame["routing_maxgate"] = frame["lane"].map(hits["maxgate"])
    frame.insert(0, "sweep", knob)
    frame["l_star"] = test.l_star()
    frame["n_confusers"] = repr(tuple(sw["n_confusers"]))
    frame["delta_r"] = sw["delta_r"]
    return frame


def run_sweeps(cfg: dict, store) -> pd.DataFrame:
    """Every (knob, value) piece, stored as cell ``sweep-<knob>-<value>`` as it finishes."""
    frames, data = [], None
    for knob, value in sweep_cells(cfg):
        name, key = f"sweep-{knob}-{value}", {"sweeps": cfg["sweeps"]}
        if store.resume and store.done(name, key):
            frames.append(store.read(name, key))
            continue
        data = _sweep_data(cfg) if data is None else data
        store.write(name, run_sweep_cell(cfg, knob, value, data), key)
        frames.append(store.read(name, key))
    sweeps = pd.concat(frames, ignore_index=True)
    lead = ["sweep", "k", "l", "run", "n_train", "accuracy", "routing_hit", "routing_maxgate", "epochs_run",
            "model", "n_patches", "l_star"]
    return sweeps[lead + [c for c in sweeps.columns if c not in lead]]


def summarise_sweeps(sweeps: pd.DataFrame) -> pd.DataFrame:
    """Mean, sd and count of test accuracy (and routing rates) per (knob, value, N)."""
    rows = []
    for knob, g in sweeps.groupby("sweep"):
        s = g.groupby([knob, "n_train"]).agg(
            accuracy_mean=("accuracy", "mean"), accuracy_sd=("accuracy", "std"), runs=("accuracy", "size"),
            maxgate_mean=("routing_maxgate", "mean"), epochs_mean=("epochs_run", "mean")).reset_index()
        rows.append(s.rename(columns={knob: "value"}).assign(sweep=knob))
    out = pd.concat(rows, ignore_index=True)
    return out[["sweep", "value", "n_train", "accuracy_mean", "accuracy_sd", "runs", "maxgate_mean", "epochs_mean"]]


SWEEP_THEORY = {"k": 0.25, "l": 0.375}  # Thm 4.5 at fixed N: error bound ~ k^(1/4) l^(3/8) (chowdhury2023 §4.3)


def sweep_slopes(sweeps: pd.DataFrame, *, n_resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    r"""OLS slope of log(mean test error) on log(knob) per (knob, N), over the theorem's range.

    The range is :math:`l \ge l^*` for the l sweep and, for the k sweep, the k whose mean
    Assumption-4.4 rate (``routing_maxgate``) is at least 0.95. The 95% CI resamples runs (the same
    runs for every knob value: common random numbers); draws with a zero mean error are skipped.
    ``theory`` is the exponent of Theorem 4.5's error bound at fixed N — an upper-bound order, so a
    measured slope is not expected to equal it.
    """
    rng = np.random.default_rng(seed)
    rows = []
    l_star = int(sweeps["l_star"].iloc[0])
    for (knob, N), g in sweeps.groupby(["sweep", "n_train"]):
        if knob == "l":
            keep = g[g["l"] >= l_star]
        else:
            ok = g.groupby("k")["routing_maxgate"].mean()
            keep = g[g["k"].isin(ok.index[ok >= 0.95])]
        err = keep.pivot_table(index="run", columns=knob, values="accuracy").rsub(1.0)
        base = {"sweep": knob, "n_train": N, "range_min": float(err.columns.min()) if err.shape[1] else np.nan,
                "range_max": float(err.columns.max()) if err.shape[1] else np.nan, "n_values": err.shape[1],
                "theory": SWEEP_THEORY[knob]}
        if err.shape[1] < 3 or (err.mean() <= 0).any():
            rows.append({**base, "slope": np.nan, "ci_low": np.nan, "ci_high": np.nan})
            continue
        x = np.log(err.columns.to_numpy(float))
        xc = x - x.mean()
        slope = float(np.log(err.mean().to_numpy()) @ xc / (xc @ xc))
        E = err.to_numpy()
        draws = E[rng.integers(0, len(E), size=(n_resamples, len(E)))].mean(1)   # (n_resamples, values)
        good = (draws > 0).all(1)
        bs = np.log(draws[good]) @ xc / (xc @ xc)
        lo, hi = np.quantile(bs, [0.025, 0.975]) if good.sum() >= 100 else (np.nan, np.nan)
        rows.append({**base, "slope": slope, "ci_low": float(lo), "ci_high": float(hi)})
    return pd.DataFrame(rows)


def plot_sweeps(sweeps: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = summarise_sweeps(sweeps)
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.8))
    for ax, knob in zip(axes, ("k", "l"), strict=True):
        sub = summ[summ["sweep"] == knob]
        for i, (N, g) in enumerate(sub.groupby("n_train")):
            se = (g["accuracy_sd"] / np.sqrt(g["runs"])).fillna(0)
            ax.errorbar(g["value"], g["accuracy_mean"], yerr=se, marker="o", ms=3, capsize=2, label=f"N = {N}",
                        color=f"C{i}")
        if knob == "l":
            ax.axvline(int(sweeps["l_star"].iloc[0]), color="grey", ls="--", lw=0.8, label="l* (Def. D.3)")
            k_fixed = int(sweeps.loc[sweeps["sweep"] == "l", "k"].iloc[0])
            ax.set_xlabel(f"patches per expert l (k = {k_fixed})")
        else:
            ax.set_xscale("log", base=2)
            l_fixed = int(sweeps.loc[sweeps["sweep"] == "k", "l"].iloc[0])
            ax.set_xlabel(f"number of experts k (l = {l_fixed}, m = 40 in total)")
        ax.set_ylabel("test accuracy (mean ± 1 se over runs)")
        ax.set_title(f"joint-training pMoE: accuracy vs {knob}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sweep_k_l.png", dpi=120)
    plt.close(fig)


# %% [markdown]
# ## Run

# %%
def run(out, quick: bool = False, resume: bool = True, *, variants: tuple[str, ...] | None = None,
        parts: tuple[str, ...] = ("blocks", "sweeps")) -> None:
    """Train every block and sweep; write results.csv, rates.csv, sweeps.csv, figures, provenance.json.

    ``variants`` restricts the block training to some data variants (e.g. to split the work over two
    processes that share ``out``); the analysis then uses the cells present. ``parts`` picks the pieces:
    ``"blocks"`` (accuracy vs N, n*, ratios, scaling: results.csv, rates.csv) and/or ``"sweeps"``
    (joint training vs k and l at fixed N: sweeps.csv, sweep_k_l.png).
    """
    import torch

    from moestat.provenance import write_provenance

    unknown = set(parts) - {"blocks", "sweeps"}
    if unknown or not parts:
        raise ValueError(f"parts must be a non-empty subset of ('blocks', 'sweeps'), got {parts!r}.")
    out = Path(out)
    cfg = config(quick)
    store = _store(out, cfg, resume)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small batched steps are overhead-bound; one thread per process is fastest
    try:
        frames = []
        for block in cfg["blocks"] if "blocks" in parts else []:
            if variants is not None and block["variant"] not in variants:
                continue
            for model in block["models"]:
                frames.append(store.get(cell_name(block, model), lambda block=block, model=model:
                                        run_block(cfg, block, model), key={"block": block}))
        sweeps = run_sweeps(cfg, store) if "sweeps" in parts else None
    finally:
        torch.set_num_threads(threads)
    if frames:
        results = pd.concat(frames, ignore_index=True)
        lead = ["model", "run", "n_train", "accuracy", "variant", "l", "n_patches", "k", "m", "epochs_run"]
        results = results[lead + [c for c in results.columns if c not in lead]]
        results.to_csv(out / "results.csv", index=False)
        rates = analyse(results, cfg)
        rates.to_csv(out / "rates.csv", index=False)
        plot(results, rates, out)
    if sweeps is not None:
        sweeps.to_csv(out / "sweeps.csv", index=False)
        summarise_sweeps(sweeps).to_csv(out / "sweeps_summary.csv", index=False)
        sweep_slopes(sweeps, seed=cfg["seed"]).to_csv(out / "sweep_slopes.csv", index=False)
        plot_sweeps(sweeps, out)
    write_provenance(out, {"vignette": NAME, **cfg, "models": json.loads(json.dumps(MODELS)),
                           "parts": list(parts), "torch_threads_training": 1})


# %%
if __name__ == "__main__":
    import argparse
    import functools
    import sys

    from moestat._vignette import vignette_cli

    # extra switch of this vignette: --parts sweeps runs only the Figs. 6-7 sweeps (blocks, sweeps or both)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--parts", default="blocks,sweeps")
    known, rest = pre.parse_known_args()
    sys.exit(vignette_cli(functools.partial(run, parts=tuple(known.parts.split(","))), NAME, rest))
