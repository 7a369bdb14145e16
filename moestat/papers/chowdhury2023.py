r"""Chowdhury, Zhang, Wang, Liu & Chen (2023), "Patch-level routing in mixture-of-experts is provably
sample-efficient for CNNs" (ICML 2023): the sample- and model-complexity slopes it proves, as data.

Its Theorems 4.2 (pMoE with separately trained router), 4.3 (a plain CNN) and 4.5 (pMoE trained jointly) bound
the sample complexity :math:`N^*`, the model size :math:`M^*` and the test error at fixed :math:`N` by powers of
the patch count :math:`n`, the number of routed patches :math:`l`, the number of experts :math:`k`, the pattern
count :math:`p`, the separation :math:`\delta` and the target error :math:`\epsilon`.  Each row below is the
exponent of one such power: the slope of ``log response`` on ``log regressor``, an upper bound (a measured slope
should not exceed it), not an equality.  The data are simulated by :func:`moestat.simulate_patches`.

The §5.1 experiment (vignette ``patch-routing``) runs through :class:`moestat.Study` with the custom cell
:func:`patch_cell` (``cell="moestat.papers.chowdhury2023:patch_cell"``: truth ``data`` = the data setting, fit
``options`` = the :data:`MODELS` settings, ``n`` = the training size).  It is judged by :func:`rates_table`
(sample complexities at :data:`TARGETS`, the pMoE / CNN ratio against the paper's :data:`PAPER_RATIO`, scaling
slopes against the :data:`SLOPES` bounds, via :mod:`moestat.rates.ratios`) and, for the joint-training sweeps of
Figs. 6-7, :func:`sweep_slopes` and :func:`summarise_sweeps`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from ..cells import CellContext

__all__ = ["ARCHITECTURE", "MODELS", "PAPER_RATIO", "REFERENCE", "SLOPES", "TARGETS", "THEORY", "patch_cell",
           "patch_data", "rates_table", "slope_bound", "summarise_sweeps", "sweep_slopes"]

REFERENCE = ("Chowdhury, M. N. R., Zhang, S., Wang, M., Liu, S. and Chen, P.-Y. (2023). Patch-level routing in "
             "mixture-of-experts is provably sample-efficient for convolutional neural networks. Proceedings of "
             "the 40th International Conference on Machine Learning, PMLR 202.")

SLOPES: list[tuple[str, str, str, float, str]] = [
    ("N_star", "l", "pmoe_separate", 8.0, "Thm 4.2"), ("N_star", "l", "pmoe_joint", 6.0, "Thm 4.5"),
    ("N_star", "l", "cnn", 0.0, "Thm 4.3"), ("N_star", "n", "pmoe_separate", 0.0, "Thm 4.2"),
    ("N_star", "n", "pmoe_joint", 0.0, "Thm 4.5"), ("N_star", "n", "cnn", 8.0, "Thm 4.3"),
    ("N_star", "k", "pmoe_joint", 4.0, "Thm 4.5"), ("N_star", "p", "pmoe_separate", 12.0, "Thm 4.2"),
    ("N_star", "p", "pmoe_joint", 12.0, "Thm 4.5"), ("N_star", "p", "cnn", 12.0, "Thm 4.3"),
    ("N_star", "delta", "pmoe_separate", 6.0, "Thm 4.2"), ("N_star", "delta", "pmoe_joint", 6.0, "Thm 4.5"),
    ("N_star", "delta", "cnn", 6.0, "Thm 4.3"), ("N_star", "1/eps", "pmoe_separate", 16.0, "Thm 4.2"),
    ("N_star", "1/eps", "pmoe_joint", 16.0, "Thm 4.5"), ("N_star", "1/eps", "cnn", 16.0, "Thm 4.3"),
    ("N_star_ratio_cnn_over_separate", "n/l", "pmoe_separate", 8.0, "Thm 4.2 + 4.3"),
    ("M_star", "l", "pmoe_separate", 10.0, "Thm 4.2"), ("M_star", "l", "pmoe_joint", 6.0, "Thm 4.5"),
    ("M_star", "n", "pmoe_joint", 2.0, "Thm 4.5"), ("M_star", "n", "cnn", 10.0, "Thm 4.3"),
    ("M_star", "k", "pmoe_joint", 3.0, "Thm 4.5"),
    ("test_error_fixed_N", "l", "pmoe_separate", 0.5, "Thm 4.2"),
    ("test_error_fixed_N", "l", "pmoe_joint", 0.375, "Thm 4.5"),
    ("test_error_fixed_N", "k", "pmoe_joint", 0.25, "Thm 4.5"),
    ("test_error_fixed_N", "n", "cnn", 0.5, "Thm 4.3"),
    ("router_N_r", "n", "pmoe_separate", 2.0, "Lemma 4.1 (one pass)"),
]
"""(response, regressor, architecture, slope bound, result) for the pMoE variants and the CNN baseline (§4.2)."""

THEORY: list[tuple[Any, ...]] = [
    ("chowdhury2023", result, "patch_top_l" if arch != "cnn" else "none", "", arch, "two-layer ReLU CNN experts",
     response, response, regressor, f"slope {slope:g} in log {regressor}", slope, "power", "growth",
     "upper_bound_slope", "loose upper bound: test slope <= bound, not equality")
    for response, regressor, arch, slope, result in SLOPES
]


# ------------------------------------------------------------------------------------------------------------------
# the §5.1 experiment: models, targets, the Study cell, and the analyses the vignette judges the claim by
# ------------------------------------------------------------------------------------------------------------------

MODELS: dict[str, dict[str, Any]] = {
    "pmoe": {"fit": "pmoe", "training": "separate", "k": 2, "l": 2},
    "pmoe-joint": {"fit": "pmoe", "training": "joint", "k": 8, "l": 6},
    "cnn": {"fit": "cnn"},
}
"""The three learners of §5.1: separate-training pMoE (Algorithm 1, k = 2, l = 2), joint-training pMoE
(Algorithm 2, k = 8, l = 6) and the CNN (eq. 5); all with m = 40 neurons, SGD eta = 0.2, batch 20."""

ARCHITECTURE = {"pmoe": "pmoe_separate", "pmoe-joint": "pmoe_joint", "cnn": "cnn"}
"""Model name -> the architecture name of :data:`SLOPES`."""

PAPER_RATIO = 0.6
"""§5.1: pMoE "only requires 60% of the training samples needed by CNN to achieve 95% test accuracy"."""

TARGETS: dict[str, dict[str, tuple[float, ...]]] = {
    "full": {"synthetic": (0.9, 0.95), "digits": (0.8, 0.85, 0.9)},
    "quick": {"synthetic": (0.9, 0.95), "digits": (0.75, 0.8)},
}
"""Test-accuracy targets of the sample complexity per data variant.  The paper's is 95% on MNIST; on the 8x8
scikit-learn digits the CNN plateaus near 0.86, so the digits targets are 80-90% (75-80% at the quick size,
whose 30-epoch cap keeps accuracies lower)."""


def slope_bound(response: str, regressor: str, architecture: str) -> float:
    """The exponent bound of :data:`SLOPES` for ``response`` (e.g. ``"N_star"``) in ``regressor`` for ``architecture``.

    Raises
    ------
    KeyError
        No such row (the message lists the rows of that response).
    """
    for resp, reg, arch, slope, _ in SLOPES:
        if (resp, reg, arch) == (response, regressor, architecture):
            return slope
    have = [(reg, arch) for resp, reg, arch, _, _ in SLOPES if resp == response]
    raise KeyError(f"no bound for response={response!r}, regressor={regressor!r}, architecture={architecture!r}; "
                   f"the (regressor, architecture) pairs of that response are {have}.")


def patch_data(data: Mapping[str, Any], reps: int) -> tuple[Any, Any]:
    """The training replicates and the test set of one data setting (a Study truth's ``data`` table).

    ``data`` holds the :func:`moestat.simulate_patches` knobs (``variant``, ``n_patches``, ``d`` for the
    synthetic model, optional ``delta_r`` and ``n_confusers``), ``sizes`` (the training sizes: each replicate
    holds ``max(sizes)`` samples, and run ``r`` at size ``N`` uses its first ``N``), ``n_test`` and
    ``seed_key``: the training set is drawn from ``SeedSequence([*seed_key, 0])`` and the test set (split
    ``"test"``: digits images from the held-out pool) from ``SeedSequence([*seed_key, 1])``.
    """
    from ..simulators.patches import simulate_patches

    sim = {k: data[k] for k in ("variant", "n_patches", "d", "delta_r") if k in data}
    if "n_confusers" in data:
        sim["n_confusers"] = tuple(data["n_confusers"])
    if sim.get("variant") == "digits":
        sim.pop("d", None)
    key = [int(v) for v in data["seed_key"]]
    train = simulate_patches(max(data["sizes"]), reps=reps, seed=np.random.SeedSequence([*key, 0]), **sim)
    test = simulate_patches(int(data["n_test"]), seed=np.random.SeedSequence([*key, 1]), split="test", **sim)
    return train, test


def _lane_seeds(seed_key: Sequence[int], sizes: Sequence[int], reps: int, n: int) -> list[np.random.SeedSequence]:
    """The seeds of the lanes (run r, size n), laid out as one batched fit over every (run, size) would spawn them."""
    children = np.random.SeedSequence([int(v) for v in seed_key]).spawn(reps * len(sizes))
    j = list(sizes).index(n)
    return [children[r * len(sizes) + j] for r in range(reps)]


def patch_cell(ctx: CellContext) -> pd.DataFrame:
    """Study cell: train one model (pMoE or CNN) on every run at one training size; one row per run.

    ``ctx.truth_cfg["data"]`` is the data setting (:func:`patch_data`); ``ctx.fit_cfg["options"]`` holds
    ``fit`` (``"pmoe"`` or ``"cnn"``), the :func:`moestat.deep.fit_pmoe` / :func:`moestat.deep.fit_cnn`
    settings (``training, k, l, m, lr, batch_size, epochs, router_epochs, stop_at_zero_error``), ``seed_key``
    (the lanes' seeds are ``SeedSequence(seed_key).spawn(reps x len(sizes))`` in (run, size) order, so a cell
    trains exactly the lanes of a batched fit over all sizes) and optional ``model`` (the name in the frame)
    and ``sweep`` (the knob a sweep moves: adds ``sweep``, ``l_star``, ``n_confusers``, ``delta_r``).  Test
    accuracy is on the data's test set; pMoE rows add ``routing_hit`` and ``routing_maxgate``
    (:meth:`moestat.deep.PatchFit.routing_hit_rate`, Lemma 4.1 and Assumption 4.4).
    """
    from ..deep import fit_cnn, fit_pmoe

    data, opts = ctx.truth_cfg["data"], dict(ctx.fit_cfg.get("options", {}))
    sizes = [int(s) for s in data["sizes"]]
    if ctx.n not in sizes:
        raise ValueError(f"n={ctx.n} is not among the data setting's sizes {sizes}; add it to data.sizes.")
    train, test = patch_data(data, ctx.reps)
    kind = opts.pop("fit")
    model, sweep, seed_key = opts.pop("model", None), opts.pop("sweep", None), opts.pop("seed_key")
    common = {"sizes": [ctx.n], "seed": _lane_seeds(seed_key, sizes, ctx.reps, ctx.n), "device": ctx.device, **opts}
    fit = fit_cnn(train, **common) if kind == "cnn" else fit_pmoe(train, **common)
    frame = fit.to_frame(test)
    frame["lane"] = frame["rep"] * len(sizes) + sizes.index(ctx.n)
    frame = frame.rename(columns={"seed": "lane_seed"})
    if model is not None:
        frame["model"] = model
    frame["variant"] = data["variant"]
    if kind == "pmoe":
        hits = fit.routing_hit_rate(test).groupby("lane")[["hit", "maxgate"]].mean()
        frame["routing_hit"] = hits["hit"].to_numpy()
        frame["routing_maxgate"] = hits["maxgate"].to_numpy()
    if sweep is not None:
        frame.insert(0, "sweep", sweep)
        frame["l_star"] = test.l_star()
        frame["n_confusers"] = repr(tuple(data["n_confusers"]))
        frame["delta_r"] = data["delta_r"]
    return frame


def rates_table(results: pd.DataFrame, targets: Mapping[str, Sequence[float]], *, n_resamples: int = 2000,
                seed: int = 0, base_l: int = 2) -> pd.DataFrame:
    r"""rates.csv: :math:`n^*`, pMoE / CNN ratios and scaling slopes against the theorems' bounds.

    Per data ``variant`` and test-accuracy target: :math:`n^*` per (``n_patches, model, l``)
    (:func:`moestat.rates.sample_complexity` on the runs' accuracy curves, ``kind="n_star"``); the ratio
    :math:`n^*_{model}/n^*_{CNN}` at the same n (:func:`moestat.rates.sample_complexity_ratio`,
    ``kind="ratio"``; the claim of §5.1 is 0.6 at 95%); and (``kind="scaling"``,
    :func:`moestat.rates.scaling_against_bound`) the slope of :math:`\log n^*` in :math:`\log n` for pMoE at
    :math:`l` = ``base_l`` (Thm 4.2: 0) and the CNN (Thm 4.3: at most 8) when there are >= 3 patch counts, in
    :math:`\log l` at fixed n for pMoE (Thm 4.2: at most 8) when there are >= 3 values of l, and of
    :math:`\log(n^*_{CNN}/n^*_{pMoE})` in :math:`\log(n/l)` (:func:`moestat.rates.ratio_scaling_exponent`;
    Thms 4.2-4.3: at most 8) over >= 3 values of n/l.

    ``results`` has one row per (model, run, size): ``variant, n_patches, model, l, run, n_train, accuracy``.
    """
    from ..rates import sample_complexity

    rows = []
    for variant, tgts in targets.items():
        sub = results[results["variant"] == variant]
        if sub.empty:
            continue
        for target in tgts:
            kw = {"x": "n_train", "rep": "run", "n_resamples": n_resamples}
            sc = sample_complexity(sub, "accuracy", target, by=["n_patches", "model", "l"], seed=seed, **kw)
            tab = sc.table.assign(kind="n_star", variant=variant)
            rows.append(tab)
            keys = list(zip(tab["n_patches"], tab["model"], tab["l"], strict=True))
            for n_p, model, l in keys:
                if model != "cnn" and (n_p, "cnn", n_p) in keys:
                    rows.append(_ratio_row(sc, (n_p, model, l), (n_p, "cnn", n_p), variant, target))
            pm = sub[(sub["model"] == "pmoe") & (sub["l"] == base_l)]
            if pm["n_patches"].nunique() >= 3:
                sc_n = sample_complexity(pd.concat([pm, sub[sub["model"] == "cnn"]]), "accuracy", target,
                                         by=["model", "n_patches"], seed=seed + 1, **kw)
                for model in ("pmoe", "cnn"):
                    rows.append(_slope_row(sc_n, "n_patches", {"model": model}, variant, target,
                                           slope_bound("N_star", "n", ARCHITECTURE[model])))
            for n_p, g in sub[sub["model"] == "pmoe"].groupby("n_patches"):
                if g["l"].nunique() >= 3:
                    sc_l = sample_complexity(g, "accuracy", target, by=["l"], seed=seed + 2, **kw)
                    rows.append(_slope_row(sc_l, "l", {}, variant, target, slope_bound("N_star", "l", "pmoe_separate"),
                                           extra={"model": "pmoe", "n_patches": n_p}))
            rows.append(_ratio_slope(sc, keys, variant, target))
    return pd.concat(rows, ignore_index=True)


def _ratio_row(sc: Any, key_a: tuple[Any, ...], key_c: tuple[Any, ...], variant: str, target: float) -> pd.DataFrame:
    from ..rates.ratios import sample_complexity_ratio

    r = sample_complexity_ratio(sc, key_a, key_c).iloc[0]
    return pd.DataFrame([{"kind": "ratio", "variant": variant, "n_patches": key_a[0], "model": f"{key_a[1]}/cnn",
                          "l": key_a[2], "metric": "accuracy", "target": target, "n_star": r["ratio"],
                          "ci_low": r["ci_low"], "ci_high": r["ci_high"], "censored": r["censored"],
                          "p_reached": r["p_used"]}])


def _slope_row(sc: Any, design: str, where: dict[str, Any], variant: str, target: float, bound: float,
               extra: dict[str, Any] | None = None) -> pd.DataFrame:
    from ..rates.ratios import scaling_against_bound

    tab = scaling_against_bound(sc, design, bound, where=where)
    return tab.assign(kind="scaling", variant=variant, target=target, **(extra or {}))


def _ratio_slope(sc: Any, keys: list[tuple[Any, ...]], variant: str, target: float) -> pd.DataFrame:
    from ..rates.ratios import ratio_scaling_exponent

    pairs = [((n, "cnn", n), (n, "pmoe", l), n / l) for n, m, l in keys if m == "pmoe" and (n, "cnn", n) in keys]
    if len({x for _, _, x in pairs}) < 3:
        return pd.DataFrame()
    tab = ratio_scaling_exponent(sc, pairs)
    return tab.assign(kind="scaling", variant=variant, model="cnn/pmoe", target=target, design="n/l",
                      theory_bound=slope_bound("N_star_ratio_cnn_over_separate", "n/l", "pmoe_separate"))


def summarise_sweeps(sweeps: pd.DataFrame) -> pd.DataFrame:
    """Mean, sd and count of test accuracy, mean Assumption-4.4 rate and epochs per (swept knob, value, N)."""
    rows = []
    for knob, g in sweeps.groupby("sweep"):
        s = g.groupby([knob, "n_train"]).agg(
            accuracy_mean=("accuracy", "mean"), accuracy_sd=("accuracy", "std"), runs=("accuracy", "size"),
            maxgate_mean=("routing_maxgate", "mean"), epochs_mean=("epochs_run", "mean")).reset_index()
        rows.append(s.rename(columns={knob: "value"}).assign(sweep=knob))
    out = pd.concat(rows, ignore_index=True)
    return out[["sweep", "value", "n_train", "accuracy_mean", "accuracy_sd", "runs", "maxgate_mean", "epochs_mean"]]


def sweep_slopes(sweeps: pd.DataFrame, *, n_resamples: int = 1000, seed: int = 0,
                 maxgate_min: float = 0.95) -> pd.DataFrame:
    r"""Slope of log(mean test error) on log(knob) per (swept knob, N), over Theorem 4.5's range.

    The range is :math:`l \ge l^*` (Definition D.3) for the l sweep and, for the k sweep, the k whose mean
    Assumption-4.4 rate (``routing_maxgate``) is at least ``maxgate_min``; the slope and its run-bootstrap
    interval are :func:`moestat.rates.mean_log_slope` of :math:`1 -` accuracy (one random stream over all
    groups).  ``theory`` is the exponent of Theorem 4.5's error bound at fixed N (:math:`k^{1/4} l^{3/8}`,
    :data:`SLOPES`) — an upper-bound order, so a measured slope is not expected to equal it.
    """
    from ..rates.ratios import mean_log_slope

    rng = np.random.default_rng(seed)
    rows = []
    l_star = int(sweeps["l_star"].iloc[0])
    for (knob, N), g in sweeps.groupby(["sweep", "n_train"]):
        if knob == "l":
            keep = g[g["l"] >= l_star]
        else:
            ok = g.groupby("k")["routing_maxgate"].mean()
            keep = g[g["k"].isin(ok.index[ok >= maxgate_min])]
        keep = keep.assign(error=1.0 - keep["accuracy"])
        fit = mean_log_slope(keep, knob, "error", rep="run", n_resamples=n_resamples, seed=rng).iloc[0]
        rows.append({"sweep": knob, "n_train": N, "range_min": fit["range_min"], "range_max": fit["range_max"],
                     "n_values": int(fit["n_values"]), "theory": slope_bound("test_error_fixed_N", knob, "pmoe_joint"),
                     "slope": fit["slope"], "ci_low": fit["ci_low"], "ci_high": fit["ci_high"]})
    return pd.DataFrame(rows)
