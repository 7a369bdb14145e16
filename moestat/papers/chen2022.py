r"""Chen, Deng, Wu, Gu & Li (2022), "Towards Understanding Mixture of Experts in Deep Learning" (NeurIPS 2022).

Its data are clustered patches (:func:`moestat.simulate_clusters`); its models a mixture of two-layer CNN experts
with a top-1 router and a single CNN (:mod:`moestat.deep`).  The paper proves accuracy statements rather than
rates, so it adds no rows to :func:`moestat.rates.theory_rates`.  This module holds what its experiments are judged
by and the study cell that reruns them:

* the paper's numbers: :data:`TABLE3` (Tables 1 and 3: accuracy and dispatch entropy of the four models in the four
  settings), :data:`TABLE9` (linear MoE with load balancing) and :data:`PAPER_RESULTS` (both);
* reference points: :data:`THM41_CEILING` (Thm 4.1: every patch-additive predictor, e.g. any single two-layer CNN,
  has test accuracy at most 7/8 when :math:`\mathcal D_\alpha = \mathcal D_\gamma`, settings :data:`THM41_SETTINGS`),
  attained by the patch-additive step oracle, and the MoE oracle (~100%) — :func:`oracle_accuracy`;
  :func:`signal_span_optimum` searches the best single CNN in the span of the signals;
* success criteria: :func:`ceiling_checks` (single CNNs under the Thm 4.1 ceiling), :func:`summarize` (means next to
  the paper's values) and :func:`ablation_effects` (paired effect of the load-balancing loss, Table 9);
* :func:`cluster_cell`, a :class:`moestat.Study` custom cell that simulates one setting, fits one model (a top-1 MoE
  of CNN experts by Algorithm 1, a single CNN, or an oracle) on all replicates at once and returns one row per
  replicate with the training history, final dispatch tables and alignment curves as pieces.

Example
-------
>>> import moestat as ms
>>> study = ms.Study(
...     truth={"label": "setting", "data": {"n_test": 2000}, "grid": {"data.setting": [1, 3]}},
...     fit=[{"label": "moe-cubic", "options": {"kind": "moe", "activation": "cubic", "T": 300}},
...          {"label": "oracle-moe", "options": {"kind": "oracle", "oracle": "moe"}}],
...     n=[400], reps=2, seed=1, cell="moestat.papers.chen2022:cluster_cell", device="cpu")
>>> len(study.cells)
4
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..deep import metrics as mt
from ..deep.metrics import THM41_CEILING

__all__ = ["MOE_ORACLE", "ORACLES", "PAPER_RESULTS", "PATCH_ADDITIVE_ORACLE", "REFERENCE", "TABLE3", "TABLE9",
           "THM41_CEILING", "THM41_SETTINGS", "ablation_effects", "ceiling_checks", "cluster_cell", "oracle_accuracy",
           "signal_span_optimum", "summarize"]

REFERENCE = ("Chen, Z., Deng, Y., Wu, Y., Gu, Q. and Li, Y. (2022). Towards understanding mixture of experts in deep "
             "learning. Advances in Neural Information Processing Systems 35.")

THM41_SETTINGS = (3, 4)
"""The paper settings with :math:`\\mathcal D_\\alpha = \\mathcal D_\\gamma` (both U(0.5, 2)), where Thm 4.1 bounds
every patch-additive predictor's accuracy by :data:`THM41_CEILING` = 0.875; settings 1 and 2 have no proven bound."""

MOE_ORACLE = "oracle-moe"
"""Route by :math:`\\arg\\max_k\\langle c_k, s(x)\\rangle`, predict :math:`\\mathrm{sign}\\langle v_k, s(x)\\rangle`
(:func:`moestat.deep.metrics.moe_oracle`): what a specialised MoE can reach (~100%)."""
PATCH_ADDITIVE_ORACLE = "oracle-patch-additive"
"""The step predictor of :func:`moestat.deep.metrics.patch_additive_oracle`, which attains the 87.5% of Thm 4.1."""
ORACLES = (MOE_ORACLE, PATCH_ADDITIVE_ORACLE)

_NAN = np.nan
TABLE3 = pd.DataFrame([
    (1, "single-linear", 68.71, _NAN, _NAN, _NAN), (1, "single-cubic", 79.48, _NAN, _NAN, _NAN),
    (1, "moe-linear", 92.99, 2.11, 1.300, 0.044), (1, "moe-cubic", 99.46, 0.55, 0.098, 0.087),
    (2, "single-linear", 60.59, _NAN, _NAN, _NAN), (2, "single-cubic", 72.29, _NAN, _NAN, _NAN),
    (2, "moe-linear", 88.48, 1.96, 1.294, 0.036), (2, "moe-cubic", 98.09, 1.27, 0.171, 0.103),
    (3, "single-linear", 74.81, _NAN, _NAN, _NAN), (3, "single-cubic", 72.69, _NAN, _NAN, _NAN),
    (3, "moe-linear", 95.93, 1.34, 1.160, 0.100), (3, "moe-cubic", 99.99, 0.02, 0.008, 0.011),
    (4, "single-linear", 74.63, _NAN, _NAN, _NAN), (4, "single-cubic", 68.60, _NAN, _NAN, _NAN),
    (4, "moe-linear", 93.30, 1.48, 1.160, 0.155), (4, "moe-cubic", 98.92, 1.18, 0.089, 0.120),
], columns=["setting", "model", "paper_accuracy", "paper_accuracy_sd", "paper_entropy", "paper_entropy_sd"]).assign(
    ablation="none")
"""chen2022 Table 3 (Table 1 = settings 1-2): test accuracy (%) and dispatch entropy (nats), mean and sd over 10 runs
for the MoEs (M = 8 experts of J = 16 filters); the single CNNs (128 filters) are one run each (no sd)."""

TABLE9 = pd.DataFrame([(1, 93.81, 1.02), (2, 89.20, 2.20), (3, 95.12, 0.58), (4, 92.50, 1.55)],
                      columns=["setting", "paper_accuracy", "paper_accuracy_sd"]).assign(
                          model="moe-linear", ablation="load-balance")
"""chen2022 Table 9: the linear MoE *with* load balancing, accuracy (%) over 10 runs (loss and coefficient not
stated)."""

PAPER_RESULTS = pd.concat([TABLE3, TABLE9], ignore_index=True)
""":data:`TABLE3` and :data:`TABLE9` in one frame keyed by (setting, model, ablation)."""


# ----------------------------------------------------------------------------- reference points

def oracle_accuracy(test: Any, oracles: Sequence[str] = ORACLES) -> pd.DataFrame:
    """Test accuracy of the paper's two reference predictors, one row per (oracle, replicate).

    ``"oracle-moe"`` routes by :math:`\\arg\\max_k\\langle c_k, s(x)\\rangle` with :math:`s(x) = \\sum_p x^{(p)}` and
    scores :math:`\\langle v_k, s(x)\\rangle` (~100%: the accuracy a specialised MoE can reach, chen2022 Thm 4.2);
    ``"oracle-patch-additive"`` is the patch-additive step predictor of
    :func:`moestat.deep.metrics.patch_additive_oracle`: right on every :math:`\\varepsilon = y` example and on an
    :math:`\\varepsilon = -y` example exactly when :math:`y = 1` or :math:`k > k'`, so its accuracy is
    :math:`1/2 + 1/4 + 1/8 = 7/8`, the Thm 4.1 ceiling (at :math:`\\sigma_p = 2` the Gaussian patch crosses its
    thresholds more often and it scores about 77%).

    Parameters
    ----------
    test : moestat.simulators.clusters.ClusterData
        Test data (R replicates), e.g. the second part of ``simulate_clusters(...).split(n_train)``.
    oracles : sequence of str
        Which of :data:`ORACLES` to score.

    Returns
    -------
    pandas.DataFrame
        Columns ``model`` (the oracle), ``rep``, ``accuracy``.
    """
    scorers = {MOE_ORACLE: mt.moe_oracle, PATCH_ADDITIVE_ORACLE: mt.patch_additive_oracle}
    rows = []
    for name in oracles:
        if name not in scorers:
            raise ValueError(f"oracles contains {name!r}; valid oracles are {list(ORACLES)}.")
        acc = mt.accuracy(test.y, scorers[name](test))
        rows.append(pd.DataFrame({"model": name, "rep": np.arange(len(acc)), "accuracy": acc}))
    return pd.concat(rows, ignore_index=True)


def signal_span_optimum(setting: int, n: int = 200_000, seed: int = 13, restarts: int = 30,
                        iters: int = 400) -> pd.DataFrame:
    r"""Best found accuracy of single CNNs restricted to the span of the signals (a lower bound per family).

    On a signal patch :math:`z = \lambda u` (:math:`u` one of the 2K signals :math:`v_k, c_k`) a single CNN adds
    :math:`\sum_j a_j\sigma(\lambda\langle w_j, u\rangle + b_j)`.  For the cubic activation this is
    :math:`t_u\lambda^3` without biases and a cubic polynomial :math:`t_u\lambda^3 + q_u\lambda^2 + l_u\lambda + c`
    with them, so up to the Gaussian patch a single cubic CNN is a linear classifier on the features
    :math:`\sum_p\langle u, x^{(p)}\rangle^q` (q = 3; or q = 1, 2, 3 and a constant), a linear CNN one on
    q = 1.  Each family's smoothed 0-1 accuracy :math:`\frac1m\sum_i \mathrm{sigmoid}(-y_i\phi_i^\top w / (\lVert w
    \rVert s_t))` (annealed :math:`s_t = 0.3\cdot 0.99^t`) is minimised by Adam from ``restarts`` random starts on
    the first half of one sample of setting ``setting`` (chen2022 Def. 3.1); the best start is scored on the other
    half.  All three families are patch-additive, so in settings :data:`THM41_SETTINGS` their hold-out accuracy is
    at most :data:`THM41_CEILING` up to sampling error (a search, not a proof).

    Parameters
    ----------
    setting : {1, 2, 3, 4}
        Paper setting.
    n : int
        Sample size (half to search, half to score).
    seed : int
        Seed of the sample and of the random starts.
    restarts, iters : int
        Random starts and Adam steps per start.

    Returns
    -------
    pandas.DataFrame
        One row per family (``linear``, ``cubic``, ``cubic-bias``): ``search_accuracy`` (first half),
        ``holdout_accuracy`` (second half) and the arguments.
    """
    import torch

    from ..simulators.clusters import simulate_clusters

    for name, value, low in (("n", n, 4), ("restarts", restarts, 1), ("iters", iters, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name}={value!r} must be an integer >= {low}.")
    data = simulate_clusters(setting=setting, n=n, reps=1, seed=seed)
    proj = np.concatenate([np.einsum("npd,kd->npk", data.X[0], data.V[0]),
                           np.einsum("npd,kd->npk", data.X[0], data.C[0])], axis=2)
    y = torch.as_tensor(data.y[0], dtype=torch.float64)
    half = n // 2
    rows = []
    for family, powers, const in (("linear", (1,), False), ("cubic", (3,), False),
                                  ("cubic-bias", (1, 2, 3), True)):
        phi = np.hstack([(proj ** q).sum(axis=1) for q in powers] + ([np.ones((n, 1))] if const else []))
        P = torch.as_tensor(phi)
        sd = P.std(dim=0)
        P = P / torch.where(sd > 0, sd, torch.ones_like(sd))
        gen = torch.Generator().manual_seed(seed)
        best_acc, best_w = -1.0, None
        for _ in range(restarts):
            w = torch.randn(P.shape[1], generator=gen, dtype=torch.float64).requires_grad_(True)
            opt = torch.optim.Adam([w], lr=0.05)
            for it in range(iters):
                margin = y[:half] * (P[:half] @ w) / w.norm()
                loss = torch.sigmoid(-margin / (0.3 * 0.99 ** it)).mean()
                opt.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                opt.step()
            acc = float(((P[:half] @ w) * y[:half] > 0).double().mean())
            if acc > best_acc:
                best_acc, best_w = acc, w.detach().clone()
        assert best_w is not None  # restarts >= 1
        test_acc = float(((P[half:] @ best_w) * y[half:] > 0).double().mean())
        rows.append(dict(setting=setting, family=family, search_accuracy=best_acc, holdout_accuracy=test_acc,
                         n=n, seed=seed, restarts=restarts, iters=iters))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- the study cell

_KINDS = ("moe", "single", "oracle")
_DATA_KEYS = ("setting", "n_test", "data_seed", "model_seed")


def _fit_keywords(kind: str) -> list[str]:
    from ..deep.cluster_moe import fit_cluster_moe, fit_single_cnn

    fn = fit_cluster_moe if kind == "moe" else fit_single_cnn
    return [p for p in inspect.signature(fn).parameters if p not in ("train", "test", "seed", "device")]


def _cell_settings(ctx: Any) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The data knobs, the model kind and the remaining fit options of a cell, checked."""
    data = dict(ctx.truth_cfg["data"])
    unknown = sorted(set(data) - set(_DATA_KEYS))
    if unknown:
        raise ValueError(f"cluster_cell: data knobs {unknown} are not known; valid knobs are {list(_DATA_KEYS)}.")
    for key in ("setting", "n_test"):
        if key not in data:
            raise ValueError(f"cluster_cell: the truth's data table needs {key!r} (e.g. data = {{setting = 1, "
                             "n_test = 16000}}).")
    opts = dict(ctx.fit_cfg["options"])
    kind = opts.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"cluster_cell: options.kind={kind!r} is not valid; use one of {list(_KINDS)}.")
    if kind == "oracle":
        name = opts.pop("oracle", None)
        if name not in ("moe", "patch-additive") or opts:
            raise ValueError(f"cluster_cell: an oracle fit takes options.oracle = 'moe' or 'patch-additive' and no "
                             f"other option; got oracle={name!r}, other options {sorted(opts)}.")
        opts["oracle"] = f"oracle-{name}"
    else:
        valid = _fit_keywords(kind)
        bad = sorted(set(opts) - set(valid))
        if bad:
            raise ValueError(f"cluster_cell: options {bad} are not options of kind={kind!r}; valid options are "
                             f"{valid}.")
    return data, kind, opts


def _seeds(ctx: Any, data: Mapping[str, Any]) -> tuple[Any, Any]:
    """Data and model seeds: the data table's ``data_seed``/``model_seed`` when given, else the study's data stream
    (replicate r's data from its child r) and that stream's child R for the models.  Both are shared by every fit of
    a truth, so the models of one setting are compared on the same data, initialisation and router noise."""
    base = ctx.data_seed
    data_seed = data.get("data_seed")
    model_seed = data.get("model_seed")
    if data_seed is None:
        data_seed = np.random.SeedSequence(base.entropy, spawn_key=tuple(base.spawn_key))
    if model_seed is None:
        model_seed = np.random.SeedSequence(base.entropy, spawn_key=(*base.spawn_key, ctx.reps))
    return data_seed, model_seed


def _moe_extras(fit: Any, test: Any, train: Any, model_seed: Any, frame: pd.DataFrame,
                setting: int, label: str, load_balance: float) -> dict[str, pd.DataFrame]:
    """Per-replicate routing statistics of a fitted MoE added to ``frame``; its dispatch and alignment pieces."""
    from ..deep.cluster_moe import initial_expert_weights

    counts = fit.dispatch_counts(test)
    frame["experts_per_cluster"], frame["expert_purity"] = mt.dispatch_spread(counts)
    cfg = fit.config
    W0 = initial_expert_weights(model_seed, fit.n_reps, cfg["M"], train.config.d, cfg["J"], cfg["sigma0"],
                                device=str(fit.W.device), dtype=cfg["dtype"])
    owners = mt.expert_groups_from_init(W0.cpu().numpy(), train.V)
    frame["init_all_groups_nonempty"] = pd.array(mt.all_groups_nonempty(owners, train.config.K), dtype="boolean")
    tag = dict(setting=setting, model=label, load_balance=load_balance)
    return {"dispatch": mt.dispatch_table(counts).assign(**tag),
            "alignment": fit.alignment.assign(**tag)}


def cluster_cell(ctx: Any) -> Any:
    """A :class:`moestat.Study` cell for chen2022's experiments: simulate one setting, fit one model, score it.

    Data knobs (``truth = {data = {...}}``): ``setting`` (1-4, chen2022 Table 3), ``n_test`` (test examples per
    replicate), optional ``data_seed`` and ``model_seed`` (see below).  The study's ``n`` is the number of training
    examples: ``simulate_clusters(setting, n + n_test, reps, data_seed).split(n)``.

    Fit options (``fit = {label, options = {...}}``): ``kind`` = ``"moe"`` (:func:`moestat.deep.fit_cluster_moe`,
    Algorithm 1; the other options are its keywords: ``activation``, ``M``, ``J``, ``T``, ``eta``, ``eta_r``,
    ``sigma0``, ``router_noise``, ``load_balance``, ``eval_every``, ``dtype``), ``"single"``
    (:func:`moestat.deep.fit_single_cnn`: ``activation``, ``J``, ``T``, ``optimizer``, ``weight_decay``, ``bias``,
    ``batch_size``, ...) or ``"oracle"`` with ``oracle`` = ``"moe"`` or ``"patch-additive"``
    (:func:`oracle_accuracy`; nothing is trained).  The fit's label is the ``model`` column.

    Seeds.  With ``data_seed``/``model_seed`` in the data table the cell uses them as given (the integer seeds of
    the cluster-moe vignette, so its numbers do not change); otherwise the study's data stream gives the data
    (replicate r = child r) and its child R the models' initialisation and router noise.  Either way every fit of
    one truth sees the same data and the same initial weights (paired comparisons, e.g. with and without load
    balancing).  Models run on ``ctx.device``.

    Returns
    -------
    moestat.study.CellOutput
        One row per replicate: ``setting, model, ablation, load_balance, run, n_train, n_test, T, accuracy,
        dispatch_entropy`` and, for fitted models, ``train_accuracy, wall_time_s``; for MoEs also ``n_dead_experts,
        max_load_share, load_entropy, router_sum_norm`` (test split, noiseless routing), ``experts_per_cluster,
        expert_purity`` (:func:`moestat.deep.metrics.dispatch_spread`) and ``init_all_groups_nonempty`` (every
        cluster owns an expert at initialisation, Def. D.3).  Pieces: ``history`` (training curves), and for MoEs
        ``dispatch`` (final test dispatch table) and ``alignment`` (Figs. 4-5 statistics over training).
    """
    from ..deep.cluster_moe import fit_cluster_moe, fit_single_cnn
    from ..simulators.clusters import simulate_clusters
    from ..study import CellOutput

    data, kind, opts = _cell_settings(ctx)
    setting, n_test, label = int(data["setting"]), int(data["n_test"]), ctx.fit_cfg["label"]
    data_seed, model_seed = _seeds(ctx, data)
    train, test = simulate_clusters(setting=setting, n=ctx.n + n_test, reps=ctx.reps, seed=data_seed).split(ctx.n)
    if kind == "oracle":
        acc = oracle_accuracy(test, [opts["oracle"]])["accuracy"].to_numpy()
        frame = pd.DataFrame({"rep": np.arange(ctx.reps), "setting": setting, "model": label, "ablation": "none",
                              "load_balance": 0.0, "run": np.arange(ctx.reps), "n_train": 0, "n_test": test.n,
                              "T": 0, "accuracy": acc, "dispatch_entropy": np.nan})
        return CellOutput(frame)
    fitter = fit_cluster_moe if kind == "moe" else fit_single_cnn
    fit = fitter(train, test=test, seed=model_seed, device=ctx.device, **opts)
    ev = fit.evaluate(test)
    lb = float(opts.get("load_balance", 0.0)) if kind == "moe" else 0.0
    frame = pd.DataFrame({"rep": ev["rep"].to_numpy(), "setting": setting, "model": label,
                          "ablation": "load-balance" if lb > 0 else "none", "load_balance": lb,
                          "run": ev["rep"].to_numpy(), "n_train": train.n, "n_test": test.n, "T": fit.config["T"],
                          "accuracy": ev["accuracy"].to_numpy(), "dispatch_entropy": ev["dispatch_entropy"].to_numpy(),
                          "train_accuracy": fit.evaluate(train)["accuracy"].to_numpy(),
                          "wall_time_s": fit.wall_time_s})
    pieces = {"history": fit.history.assign(setting=setting, model=label, load_balance=lb)}
    if kind == "moe":
        for col in ("n_dead_experts", "max_load_share", "load_entropy", "router_sum_norm"):
            frame[col] = ev[col].to_numpy()
        pieces.update(_moe_extras(fit, test, train, model_seed, frame, setting, label, lb))
    return CellOutput(frame, pieces)


# ----------------------------------------------------------------------------- success criteria

def ceiling_checks(results: pd.DataFrame, settings: Sequence[int] = THM41_SETTINGS, level: float = 0.99
                   ) -> pd.DataFrame:
    """Thm 4.1 checked on every single-CNN run of ``settings``: is its test accuracy consistent with a true accuracy
    of at most :data:`THM41_CEILING`?  (One-sided Clopper-Pearson lower bound at ``level`` against 0.875,
    :func:`moestat.deep.metrics.ceiling_check`; ``consistent`` is False only when the bound exceeds the ceiling.)

    ``results`` needs the columns ``setting, model, run, accuracy, n_test``; single CNNs are the models whose name
    starts with ``single``.  Returns one row per run (empty when there is none).
    """
    _need(results, ("setting", "model", "run", "accuracy", "n_test"), "results")
    single = results[results["model"].astype(str).str.startswith("single") & results["setting"].isin(settings)]
    parts = []
    for n_test, g in single.groupby("n_test", sort=False):
        chk = mt.ceiling_check(g["accuracy"].to_numpy(), int(n_test), level=level)
        parts.append(pd.concat([g[["setting", "model", "run"]].reset_index(drop=True), chk], axis=1))
    if not parts:
        return pd.DataFrame(columns=["setting", "model", "run", "accuracy", "n_test", "lower_bound", "ceiling",
                                     "level", "consistent"])
    return pd.concat(parts, ignore_index=True)


def _need(frame: pd.DataFrame, columns: Sequence[str], name: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{name} must be a pandas DataFrame (the study's rows), got {type(frame).__name__}.")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} lacks the columns {missing}; pass the rows of cluster_cell (Study.run).")


SUMMARY_EXTRAS = ("load_entropy", "max_load_share", "n_dead_experts", "experts_per_cluster", "expert_purity")
"""Per-run columns :func:`summarize` averages when present."""


def summarize(results: pd.DataFrame, by: Sequence[str] = ("setting", "model", "ablation")) -> pd.DataFrame:
    """Mean and sd over runs next to the paper's values.

    Per group of ``by``: ``runs``, accuracy mean and sd in %, dispatch entropy mean and sd (nats), the means of
    :data:`SUMMARY_EXTRAS` present in ``results``, and the paper's ``paper_*`` columns of :data:`PAPER_RESULTS`
    (Table 3; Table 9 for the linear MoE with load balancing) matched on the keys ``setting, model, ablation`` that
    ``by`` contains.  A missing ``ablation`` column means no ablation (``"none"``).
    """
    by = list(by)
    _need(results, ("accuracy", "dispatch_entropy"), "results")
    results = results.assign(ablation=results["ablation"].fillna("none") if "ablation" in results else "none")
    _need(results, by, "results")
    g = results.groupby(by, dropna=False)
    summ = pd.DataFrame({"runs": g.size(), "accuracy": g["accuracy"].mean() * 100,
                         "accuracy_sd": g["accuracy"].std() * 100, "dispatch_entropy": g["dispatch_entropy"].mean(),
                         "dispatch_entropy_sd": g["dispatch_entropy"].std()})
    for col in SUMMARY_EXTRAS:
        if col in results:
            summ[col] = g[col].mean()
    summ = summ.reset_index()
    keys = [k for k in ("setting", "model", "ablation") if k in by]
    paper = PAPER_RESULTS[keys + [c for c in PAPER_RESULTS if c.startswith("paper")]].drop_duplicates(keys)
    return summ.merge(paper, on=keys, how="left")


ABLATION_METRICS = ("accuracy", "dispatch_entropy", "load_entropy", "max_load_share", "n_dead_experts")
"""The per-run columns whose paired load-balancing effect :func:`ablation_effects` estimates."""


def ablation_effects(results: pd.DataFrame, confidence_level: float = 0.95) -> pd.DataFrame:
    r"""Paired effect of load balancing (chen2022 Table 9 and its remark that balancing "is not the key").

    For each (setting, model, coefficient ``load_balance``) and metric of :data:`ABLATION_METRICS`, the differences
    :math:`d_r = x_r^{\text{balanced}} - x_r^{\text{none}}` of the runs ``r`` that share data, initialisation and
    router noise, their mean :math:`\bar d` and the t interval :math:`\bar d \pm t_{1-(1-c)/2,\,R-1}\, s_d/\sqrt R`
    (``NaN`` bounds with a single run).

    ``results`` holds rows with ``ablation`` = ``"none"`` and ``"load-balance"`` and the columns ``setting, model,
    run, load_balance`` and the metrics.  Returns columns ``setting, model, load_balance, metric, runs,
    mean_difference, ci_low, ci_high``.
    """
    from scipy import stats

    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level={confidence_level!r} must lie in (0, 1), e.g. 0.95.")
    keys = ["setting", "model", "run"]
    _need(results, [*keys, "ablation", "load_balance"], "results")
    metrics = [c for c in ABLATION_METRICS if c in results]
    base = results[results["ablation"] == "none"].set_index(keys)[metrics]
    rows = []
    q = 1 - (1 - confidence_level) / 2
    for (s, m, a), g in results[results["ablation"] == "load-balance"].groupby(["setting", "model", "load_balance"]):
        diff = g.set_index(keys)[metrics] - base.reindex(g.set_index(keys).index)
        for col in metrics:
            d = diff[col].dropna()
            half = stats.t.ppf(q, len(d) - 1) * d.std() / np.sqrt(len(d)) if len(d) > 1 else np.nan
            rows.append(dict(setting=s, model=m, load_balance=a, metric=col, runs=len(d), mean_difference=d.mean(),
                             ci_low=d.mean() - half, ci_high=d.mean() + half))
    return pd.DataFrame(rows, columns=["setting", "model", "load_balance", "metric", "runs", "mean_difference",
                                       "ci_low", "ci_high"])
