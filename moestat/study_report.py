r"""Performance measures with Monte Carlo SEs and ADEMP reports of a simulation study.

A :class:`moestat.Study` frame has one row per (cell, replicate).  This module summarises it the way
Morris, White & Crowther (2019, *Statistics in Medicine* 38:2074) ask simulation studies to be reported:

* :func:`performance` — per cell (truth x fitted model x n), performance measures each with its Monte Carlo
  standard error (MCSE), computed by :func:`moestat.simperf.performance_measures` (Morris et al. 2019,
  Table 6; rsimsum's ``simsum``) and :func:`moestat.simperf.jackknife_mcse`:

  - **parameters** (fits that record ``est:<term>``, ``se:<term>`` and ``true:<term>`` columns, as the ``mle``
    estimator does when the fitted model has the truth's parameter vector): for every term :math:`\theta_j`,
    bias, relative bias, empirical SE, MSE, RMSE, model SE, its relative error, coverage and bias-eliminated
    coverage of the Wald interval :math:`\hat\theta_j \pm z\,\widehat{\mathrm{SE}}_j`, and power (the Wald test
    of :math:`\theta_j = 0`);
  - **metrics** (losses such as the Voronoi losses, :math:`L^2` errors): the mean :math:`\bar L` with MCSE
    :math:`s/\sqrt R` (the bias of :math:`L` against 0), the empirical SE :math:`s` with MCSE
    :math:`s/\sqrt{2(R-1)}`, the root mean square :math:`\sqrt{\overline{L^2}}` with its delta-method MCSE, and
    two quantities without a closed-form MCSE, with the leave-one-replicate-out jackknife MCSE (Efron & Stein
    1981): ``log_mean`` :math:`\log\bar L` and ``mean_log`` :math:`\overline{\log L}` (the per-n statistic of
    the rate fits of :func:`moestat.fit_rate`).

* :func:`write_report` — ``DIR/report.md``: the study's ADEMP plan (aims, data-generating mechanisms,
  estimands, methods, performance measures; from the ``[ademp]`` table or derived from the configuration), the
  failure counts, the performance table with MCSEs, the rate table with verdicts and log-log figures
  (:func:`moestat.rates.plots.plot_rate`, PNGs under ``DIR/report/``).

Rows whose fit raised (``status == "error"``) carry no estimates: both skip them, with a warning that says how
many (:func:`successful_rows`), and the report counts them.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .exceptions import StudyFailureWarning, warn_user
from .simperf import jackknife_mcse, performance_measures

if TYPE_CHECKING:  # pragma: no cover
    from .study import Study

__all__ = ["METRIC_COLUMNS", "derive_ademp", "metric_columns", "parameter_frame", "performance", "successful_rows",
           "write_report"]


def successful_rows(frame: pd.DataFrame, *, what: str = "the rate fit") -> pd.DataFrame:
    """The rows of a study frame whose fit did not raise (``status != "error"``), with a
    :class:`StudyFailureWarning` saying how many error rows were skipped (frames without ``status`` pass)."""
    if "status" not in frame.columns:
        return frame
    err = frame["status"].astype(str) == "error"
    if err.any():
        warn_user(f"{what} skips {int(err.sum())} error row(s) of {len(frame)} (fits or metrics that raised; see "
                  "their message column).", StudyFailureWarning)
    return frame.loc[~err]


#: Columns a registered metric writes (a regular expression) where they differ from the metric's name.
METRIC_COLUMNS: dict[str, str] = {
    "parameter_errors": r"err_(over|exact)_.+",
    "representation": r"(over|exact)_(param|sup|l2)|param",
}

_DESCRIPTIONS = {
    "D1": "the Voronoi loss $D_1(\\hat G, G^*)$ of the fitted mixing measure against the truth",
    "D2": "the Voronoi loss $D_2(\\hat G, G^*)$ (over-specified cells raised to the power r)",
    "D3": "the Voronoi loss $D_3(\\hat G, G^*)$",
    "l2": "the $L^2(\\mu)$ distance $\\|f_{\\hat G} - f_{G^*}\\|$ between fitted and true regression functions "
          "(Monte Carlo)",
    "parameter_errors": "the largest parameter error per block in over- and exact-specified Voronoi cells",
    "loss": "the Voronoi loss of the fitted gate's theory (softmax loss, $D_1$ or $\\inf D_3$ over the split "
            "family)",
    "representation": "errors against the nearest exact representation of the truth",
    "gaussian_voronoi": "the Voronoi loss of the softmax-gated Gaussian MoE (Nguyen, Nguyen & Ho 2023): $D_1$ "
                        "for $k = k^*$, $D_2$ with cell-size exponents for $k > k^*$, with its cell pattern "
                        "`cell_sizes`",
}
_ADEMP_TITLES = {"aims": "Aims", "data_generating_mechanisms": "Data-generating mechanisms",
                 "estimands": "Estimands", "methods": "Methods", "performance_measures": "Performance measures"}
_BY = ("truth", "fit", "n")
_METRIC_MEASURES = ("mean", "empirical_se", "rmse", "log_mean", "mean_log")


# -------------------------------------------------------------------------------------------- columns
def metric_columns(frame: pd.DataFrame, metrics: Iterable[str]) -> list[str]:
    """The numeric columns of ``frame`` that the named metrics wrote (``*_alt`` columns of a second solver left
    out): the metric's own name, or the columns matching :data:`METRIC_COLUMNS` for metrics that write several."""
    out: list[str] = []
    numeric = [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])
               and not pd.api.types.is_bool_dtype(frame[c])]
    for name in metrics:
        pattern = METRIC_COLUMNS.get(name)
        found = [c for c in numeric if re.fullmatch(pattern, c)] if pattern else [c for c in numeric if c == name]
        out += [c for c in found if c not in out]
    return out


def parameter_frame(frame: pd.DataFrame, by: Sequence[str] = _BY) -> pd.DataFrame:
    """Long frame of per-replicate parameter estimates: ``[*by, rep, term, estimate, std_error, true_value]``
    from the ``est:<term>``, ``se:<term>`` and ``true:<term>`` columns (rows without an estimate dropped)."""
    terms = [c[4:] for c in frame.columns if c.startswith("est:") and f"true:{c[4:]}" in frame.columns]
    keys = [c for c in (*by, "rep") if c in frame.columns]
    parts = []
    for term in terms:
        part = frame[keys].copy()
        part["term"] = term
        part["estimate"] = pd.to_numeric(frame[f"est:{term}"], errors="coerce")
        se = frame.get(f"se:{term}")
        part["std_error"] = np.nan if se is None else pd.to_numeric(se, errors="coerce")
        part["true_value"] = pd.to_numeric(frame[f"true:{term}"], errors="coerce")
        parts.append(part[np.isfinite(part["estimate"]) & np.isfinite(part["true_value"])])
    if not parts:
        return pd.DataFrame(columns=[*keys, "term", "estimate", "std_error", "true_value"])
    return pd.concat(parts, ignore_index=True)


# ---------------------------------------------------------------------------------------- performance
def _jack(values: np.ndarray, stat: Any) -> tuple[float, float]:
    if len(values) < 2:
        return float(stat(values)), math.nan
    return jackknife_mcse(values, stat)


def _metric_rows(values: np.ndarray) -> list[tuple[str, float, float, int]]:
    """mean, empirical SE and RMSE of a loss (against 0) with closed-form MCSEs; log of the mean and mean of the
    log with jackknife MCSEs (only where every value is > 0)."""
    v = values[np.isfinite(values)]
    rows: list[tuple[str, float, float, int]] = []
    if len(v) == 0:
        return rows
    tab = performance_measures(pd.DataFrame({"estimate": v}), truth=0.0).set_index("measure")
    names = {"bias": "mean", "empirical_se": "empirical_se", "rmse": "rmse"}
    for src, dst in names.items():
        rows.append((dst, float(tab.loc[src, "estimate"]), float(tab.loc[src, "mcse"]), int(tab.loc[src, "n_reps"])))
    if (v > 0).all():
        rows.append(("log_mean", *_jack(v, lambda x: np.log(np.mean(x))), len(v)))
        rows.append(("mean_log", *_jack(v, lambda x: np.mean(np.log(x))), len(v)))
    return rows


def performance(frame: pd.DataFrame, metrics: Sequence[str] | None = None, *, by: Sequence[str] = _BY,
                confidence_level: float = 0.95, converged_only: bool = False) -> pd.DataFrame:
    r"""Performance measures with Monte Carlo SEs per cell of a study frame (see the module docstring).

    Parameters
    ----------
    frame : DataFrame
        A study frame (:meth:`moestat.Study.run`, :func:`moestat.study.load_results`).
    metrics : list of str, optional
        Metric columns to summarise (default: none; :meth:`moestat.Study.performance` passes the study's
        metrics' columns, :func:`metric_columns`).
    by : list of str
        Grouping columns (default the cell: ``truth``, ``fit``, ``n``).
    confidence_level : float
        Level of the Wald intervals behind ``coverage`` (and of the test behind ``power``).
    converged_only : bool
        Use only the rows with ``status == "ok"`` (default: every fit that did not raise, converged or not).

    Returns
    -------
    DataFrame
        ``[*by, kind, quantity, measure, estimate, mcse, n_reps]``: ``kind`` is ``"parameter"`` (``quantity`` a
        term of :math:`\theta`, measures of :func:`moestat.simperf.performance_measures`) or ``"metric"``
        (``quantity`` a metric column; measures ``mean``, ``empirical_se``, ``rmse``, ``log_mean``,
        ``mean_log``).  ``mcse`` is NaN where a group has one replicate.
    """

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a study's result frame (a pandas DataFrame), got {type(frame).__name__}.")
    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in by if c not in frame.columns]
    if missing:
        raise ValueError(f"by={by}: columns {missing} are not in the frame; available: "
                         f"{sorted(map(str, frame.columns))}.")
    metrics = [] if metrics is None else [metrics] if isinstance(metrics, str) else list(metrics)
    absent = [m for m in metrics if m not in frame.columns]
    if absent:
        raise ValueError(f"metrics {absent} are not columns of the frame; metric columns are e.g. "
                         f"{metric_columns(frame, ['D1', 'D2', 'D3', 'l2', 'loss', 'gaussian_voronoi'])}.")
    rows = successful_rows(frame, what="performance()")
    if converged_only and "status" in rows.columns:
        rows = rows[rows["status"].astype(str) == "ok"]
    parts = []
    out = []
    for key, sub in (rows.groupby(by, sort=True, dropna=False) if len(rows) else []):
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            vals = pd.to_numeric(sub[m], errors="coerce").to_numpy(dtype=float)
            out += [(*key, m, *row) for row in _metric_rows(vals)]
    if out:
        parts.append(pd.DataFrame(out, columns=[*by, "quantity", "measure", "estimate", "mcse", "n_reps"])
                     .assign(kind="metric"))
    long = parameter_frame(rows, by)
    if len(long):
        has_se = bool(np.isfinite(long["std_error"]).any())
        tab = performance_measures(long, estimate="estimate", truth="true_value",
                                   std_error="std_error" if has_se else None, by=[*by, "term"],
                                   confidence_level=confidence_level)
        order = {t: i for i, t in enumerate(dict.fromkeys(long["term"]))}  # the layout's order of theta
        tab = tab.sort_values([*by, "term"], key=lambda c: c.map(order) if c.name == "term" else c, kind="stable")
        parts.append(tab.rename(columns={"term": "quantity"}).assign(kind="parameter"))
    cols = [*by, "kind", "quantity", "measure", "estimate", "mcse", "n_reps"]
    if not parts:
        return pd.DataFrame(columns=cols)
    result = pd.concat(parts, ignore_index=True)[cols]
    return result.astype({"estimate": np.float64, "mcse": np.float64, "n_reps": np.int64})


# --------------------------------------------------------------------------------------------- ADEMP
def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _fmt(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            return "" if np.isnan(value) else str(value)
        return f"{value:.4g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame, max_rows: int | None = None) -> str:
    """A GitHub-flavoured markdown table of ``frame`` (numbers to 4 significant digits)."""
    if frame.empty:
        return "_(none)_"
    shown = frame if max_rows is None else frame.head(max_rows)
    head = "| " + " | ".join(map(str, shown.columns)) + " |"
    rule = "|" + "|".join("---" for _ in shown.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    more = [f"\n_{len(frame) - len(shown)} more rows in the CSV file._"] if len(shown) < len(frame) else []
    return "\n".join([head, rule, *body, *more])


def _dgm_table(study: Study) -> pd.DataFrame:
    rows = []
    for t in study.truths:
        from .cells import build_truth, truth_with_noise

        if "data" in t:  # a custom cell's own data: its knobs are all there is to show
            rows.append({"truth": t["label"], "source": "custom cell data",
                         "settings": ", ".join(f"{k}={v}" for k, v in t["data"].items())})
            continue
        truth = build_truth(t, n=min(study.n))
        spec = truth.spec
        design = t.get("design", "random")
        sd = np.unique(np.round(np.asarray(truth_with_noise(truth).noise_sd, dtype=float), 6))
        rows.append({"truth": t["label"], "source": t.get("preset") or "explicit", "gate": spec.gate,
                     "expert": spec.expert, "k*": spec.k, "d": spec.d,
                     "noise sd": ", ".join(f"{v:g}" for v in sd),
                     "model": t.get("model", "regression"),
                     "inputs": (t.get("inputs", "uniform") if isinstance(design, str) and design == "random"
                                else f"fixed design ({design if isinstance(design, str) else 'array'})")})
    return pd.DataFrame(rows)


def _methods_table(study: Study) -> pd.DataFrame:
    from .cells import metric_name

    rows = []
    for f in study.fits:
        rows.append({"fit": f["label"], "estimator": metric_name(f.get("estimator", "lse")),
                     "gate": f.get("gate") or "(truth's)", "expert": f.get("expert") or "(truth's)",
                     "k": f.get("k") or "truth", "options": json.dumps(f.get("options", {}), sort_keys=True,
                                                                      default=str)})
    return pd.DataFrame(rows)


def derive_ademp(study: Study, frame: pd.DataFrame | None = None) -> dict[str, list[str]]:
    """ADEMP sections derived from a study's configuration (and its frame, for the parameter estimands), as
    lists of markdown paragraphs; the ``[ademp]`` table's entries take precedence in :func:`write_report`."""
    from .cells import metric_name

    names = [metric_name(m) for m in study.metrics]
    fits = ", ".join(f["label"] for f in study.fits)
    ns = ", ".join(map(str, study.n))
    has_params = frame is not None and any(str(c).startswith("est:") for c in frame.columns)
    aims = [study.description] if study.description else []
    aims.append(f"Measure how the error of the fitted models ({fits}) decreases with the sample size "
                f"n in {{{ns}}} under {len(study.truths)} data-generating mechanism(s)"
                + (f", scored by {', '.join(names)}." if names else "."))
    dgm = [f"{len(study.truths)} true model(s) x n in {{{ns}}}, {study.reps} replicate data sets per (truth, n); "
           f"master seed {study.seed} (data of replicate r: child r of SeedSequence(seed, spawn_key=(0, "
           "crc32(truth), n))), shared by every fitted model of a truth.", markdown_table(_dgm_table(study))]
    estimands = [f"`{m}`: {_DESCRIPTIONS.get(m, 'a user metric (see its docstring)')}." for m in names]
    if has_params:
        estimands.append("The parameter vector $\\theta$ (gate rows against the last expert, expert rows, "
                         "$\\log\\sigma_i$) of every fit whose model has the truth's parameterisation, after "
                         "relabelling the fitted experts to the truth.")
    if not estimands:
        estimands = ["The fitted models' objective values (no metrics were configured)."]
    methods = [f"{len(study.fits)} fitted model(s), each fitted to all replicates of a cell in one batched call:",
               markdown_table(_methods_table(study))]
    perf = ["Per cell (truth x fitted model x n), with Monte Carlo SEs (Morris, White & Crowther 2019): mean, "
            "empirical SE and root mean square of each metric; the log of the mean and the mean of the log with "
            "jackknife MCSEs."]
    if has_params:
        perf.append("For the parameters: bias, relative bias, empirical SE, MSE, RMSE, model SE and its relative "
                    "error, coverage and bias-eliminated coverage of the Wald intervals, and power.")
    perf.append("Convergence exponents of each metric in n (`moestat.fit_rate`: random-effects meta-regression of "
                "the per-n mean log error, Knapp-Hartung intervals) with verdicts; failed fits counted per cell.")
    return {"aims": aims, "data_generating_mechanisms": dgm, "estimands": estimands, "methods": methods,
            "performance_measures": perf}


def _ademp_section(key: str, given: Mapping[str, Any] | None, derived: dict[str, list[str]]) -> str:
    title = _ADEMP_TITLES[key]
    if given and key in given:
        text = given[key]
        items = _as_list(text)
        body = items[0] if isinstance(text, str) else "\n".join(f"- {v}" for v in items)
        if key in ("data_generating_mechanisms", "methods"):  # the configuration's facts follow the plan
            body += "\n\nFrom the configuration:\n\n" + "\n\n".join(derived[key])
        return f"### {title}\n\n{body}\n"
    return f"### {title}\n\n" + "\n\n".join(derived[key]) + "\n\n_(derived from the configuration)_\n"


# ---------------------------------------------------------------------------------------------- report
def failure_table(frame: pd.DataFrame, by: Sequence[str] = _BY) -> pd.DataFrame:
    """Replicates per status (``ok``, ``not_converged``, ``error``) for each cell."""
    from .cells import STATUSES

    status = frame["status"].astype(str) if "status" in frame.columns else pd.Series("ok", index=frame.index)
    counts = pd.crosstab([frame[c] for c in by], status).reindex(columns=list(STATUSES), fill_value=0)
    return counts.reset_index().rename_axis(columns=None)


def _enough_sizes(rows: pd.DataFrame, y: str, by: Sequence[str], min_n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of the groups of ``by`` that have a value of ``y`` at ``min_n`` or more sample sizes, and a table
    (group x n: replicates) of the other groups, which a rate fit cannot use (e.g. a rare Voronoi cell pattern)."""
    valid = rows[np.isfinite(pd.to_numeric(rows[y], errors="coerce"))] if y in rows.columns else rows.iloc[:0]
    sizes = valid.groupby(list(by), dropna=False)["n"].transform("nunique")
    keep = rows.index.isin(valid.index[sizes >= min_n])
    thin = valid[sizes < min_n]
    sparse = (thin.groupby([*by, "n"], dropna=False).size().rename("replicates").reset_index()
              if len(thin) else pd.DataFrame())
    return rows[keep], sparse


def _rate_section(rows: pd.DataFrame, metrics: list[str], fig_dir: Path, base: Path,
                  confidence_level: float) -> tuple[str, list[pd.DataFrame]]:
    from .rates import MIN_N_VALUES, fit_rate

    n_values = rows["n"].nunique() if "n" in rows.columns else 0
    if not metrics:
        return "The study records no metric columns to fit rates to.\n", []
    if n_values < MIN_N_VALUES:
        return (f"A rate fit needs at least {MIN_N_VALUES} sample sizes; this study has {n_values}.\n", [])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts, tables = [], []
    for y in metrics:
        groupings = [["truth", "fit"]]
        if y == "gaussian_voronoi" and "cell_sizes" in rows.columns and rows["cell_sizes"].nunique() > 1:
            groupings.append(["truth", "fit", "cell_sizes"])
        for by in groupings:
            title = f"#### `{y}`" + (" by cell pattern" if "cell_sizes" in by else "")
            data, sparse = _enough_sizes(rows, y, by, MIN_N_VALUES)
            if data.empty:
                parts.append(f"{title}\n\nNo group has {MIN_N_VALUES} sample sizes with a value of `{y}`.\n")
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    res = fit_rate(data, y, by=by, na="drop", confidence_level=confidence_level)
                except (ValueError, TypeError) as exc:
                    parts.append(f"{title}\n\nNo rate fit: {exc}\n")
                    continue
            table = res.table[[*by, "model", "exponent", "ci_low", "ci_high", "verdict", "n_values", "replicates"]]
            tables.append(table.assign(y=y))
            stem = re.sub(r"[^A-Za-z0-9._-]+", "-", f"rate_{y}" + ("_by_cells" if "cell_sizes" in by else ""))
            ax = res.plot()
            fig = ax.figure
            fig.savefig(fig_dir / f"{stem}.png", dpi=110, bbox_inches="tight")
            plt.close(fig)
            rel = (fig_dir / f"{stem}.png").relative_to(base).as_posix()
            notes = sorted({str(w.message) for w in caught})
            text = [title, "", markdown_table(table), "", f"![rate of {y}]({rel})"]
            if not sparse.empty:
                text += ["", f"Groups seen at fewer than {MIN_N_VALUES} sample sizes (no rate; their replicates by n):",
                         "", markdown_table(sparse)]
            if notes:
                text += ["", "Warnings of the fit:", *[f"- {n}" for n in notes]]
            parts.append("\n".join(text) + "\n")
    return "\n".join(parts), tables


def write_report(directory: str | Path, study: Study, frame: pd.DataFrame, *,
                 confidence_level: float = 0.95, partial: bool = False, max_rows: int = 200) -> Path:
    """Write ``DIR/report.md`` (and ``DIR/report/*.png``, ``DIR/performance.csv``, ``DIR/rates.csv``).

    Parameters
    ----------
    directory : path
        The study's folder (``--out`` of ``moestat study run``).
    study : Study
        The study (``Study.report`` and ``moestat study report DIR`` pass it, read from ``DIR/study.toml``).
    frame : DataFrame
        Its results (:func:`moestat.study.load_results` of ``DIR``).
    confidence_level : float
        Level of the coverage intervals and of the rate intervals.
    partial : bool
        Report the finished cells of an unfinished (or stopped) study.
    max_rows : int
        Rows of the performance table shown in the markdown (all of them are in ``performance.csv``).

    Returns
    -------
    Path
        The report's path.
    """
    from . import __version__

    base = Path(directory)
    base.mkdir(parents=True, exist_ok=True)
    fig_dir = base / "report"
    fig_dir.mkdir(exist_ok=True)
    derived = derive_ademp(study, frame)
    from .cells import metric_name

    metrics = metric_columns(frame, [metric_name(m) for m in study.metrics])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skipped error rows are counted in the failures section
        perf = performance(frame, metrics, confidence_level=confidence_level)
        rows = successful_rows(frame)
    perf.to_csv(base / "performance.csv", index=False)
    failures = failure_table(frame)
    rate_text, rate_tables = _rate_section(rows, metrics, fig_dir, base, confidence_level)
    if rate_tables:
        pd.concat(rate_tables, ignore_index=True).to_csv(base / "rates.csv", index=False)
    status = frame["status"].astype(str) if "status" in frame.columns else pd.Series("ok", index=frame.index)
    errors = frame.loc[status == "error"]
    lines = [f"# Simulation study `{study.name}`", ""]
    if study.description:
        lines += [study.description, ""]
    lines += [f"{len(study.cells)} cells ({len(study.truths)} truths x {len(study.fits)} fitted models x "
              f"{len(study.n)} sample sizes) x {study.reps} replicates = {len(frame)} rows; moestat {__version__}.",
              "", "## ADEMP", ""]
    for key in _ADEMP_TITLES:
        lines += [_ademp_section(key, study.ademp, derived)]
    lines += ["## Failures", "",
              f"{int((status == 'ok').sum())} fits ok, {int((status == 'not_converged').sum())} not converged, "
              f"{len(errors)} errors (rows with status `error` carry no estimates and are left out of the "
              "performance and rate tables).", "", markdown_table(failures), ""]
    if len(errors):
        lines += ["First errors:", ""]
        lines += [f"- `{r.cell}` rep {r.rep}: {_fmt(r.message)}" for r in errors.head(5).itertuples()]
        lines += [""]
    lines += ["## Performance", "",
              f"Estimates with Monte Carlo SEs (`mcse`), {round(confidence_level * 100)}% intervals for coverage; "
              "all rows in [performance.csv](performance.csv).", "", markdown_table(perf, max_rows), "",
              "## Convergence rates", "", rate_text]
    path = base / "report.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
