"""Plots for rate studies (matplotlib; safe under the Agg backend, never calls ``plt.show``).

Every figure follows :mod:`moestat.figstyle`: a title per panel, mathtext axis labels for known metrics, the
meaning of the error bars and the level of the intervals written on the figure, fitted lines in the legend with
their exponent and interval, legends outside the data, fonts legible at the docs' page width.

* :func:`plot_rate` — the papers' Figure 1 style: log-log points with replicate spread, fitted lines,
  exponent and CI in the legend (nguyen2024 Fig. 1-2).
* :func:`plot_window` — exponent and CI as the smallest / largest n are dropped (window sensitivity).
* :func:`plot_sample_complexity` — n* with its bootstrap CI against a design variable (chowdhury2023 Fig. 5).
* :func:`plot_unit_profiles` — every truth's error profile, the median and the fitted line per group, with
  exponents, intervals and verdicts.
* :func:`plot_invariance` — each fit's response against a second solver's on the same data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .. import figstyle as fs

if TYPE_CHECKING:  # pragma: no cover
    from .complexity import SampleComplexityResult
    from .exponents import RateResult, WindowSensitivity

__all__ = ["plot_invariance", "plot_rate", "plot_sample_complexity", "plot_unit_profiles", "plot_window"]

_LINESTYLES = {"power": "-.", "power_log": "--", "inverse_log": ":"}
_UNIT_NAMES = {"truth_seed": ("truth", "truths"), "rep": ("replicate", "replicates")}
_MODEL_NAMES = {"power": r"$C n^{-\alpha}$", "power_log": r"$C (n/\log n)^{-\alpha}$",
                "inverse_log": r"$C (\log n)^{-\alpha}$"}


def _axes(ax: Any, height: float = 4.4) -> Any:
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(fs.PAGE_WIDTH_IN, height), layout="constrained")
    return ax


def _label(key: tuple[Any, ...], by: list[str]) -> str:
    return ", ".join(str(v) for v in key) if by else ""


def _rate_text(model: str, exponent: float, lo: float, hi: float) -> str:
    base = {"power": "n", "power_log": "(n/log n)", "inverse_log": "(log n)"}[model]
    # the legend gives the fitted law y ~ base^(-exponent) with the interval of the power shown; a negative
    # exponent (a growing y) reads as a plus
    if exponent >= 0:
        return f"{base}^-{exponent:.2f} [{lo:.2f}, {hi:.2f}]"
    return f"{base}^+{-exponent:.2f} [{-hi:.2f}, {-lo:.2f}]"


def _centre_and_band(cells: Any, agg: str | None, spread: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Per-n centre and bar ends: geometric mean $\times/\div\ e^{2 s}$ ($s$ the SD of $\log y$) for replicate-level
    and ``logmean`` fits, mean (median) $\pm 2$ SD clipped positive for ``agg="mean"`` (``"median"``); ``range``
    replaces the ends by the min and max."""
    if agg in (None, "logmean"):
        logs = cells.apply(lambda v: np.log(v.to_numpy(float)))
        centre = np.exp(np.array([v.mean() for v in logs]))
        sd = np.array([v.std(ddof=1) if len(v) > 1 else 0.0 for v in logs])
        low, high = centre * np.exp(-2 * sd), centre * np.exp(2 * sd)
    else:
        centre = (cells.mean() if agg == "mean" else cells.median()).to_numpy(float)
        sd = cells.std(ddof=1).fillna(0.0).to_numpy(float)
        low, high = np.maximum(centre - 2 * sd, centre * 1e-3), centre + 2 * sd
    if spread == "range":
        low, high = cells.min().to_numpy(float), cells.max().to_numpy(float)
    return centre, low, high


def _rate_note(cfg: dict[str, Any], spread: str, counts: list[int], points: bool, models: list[str]) -> str:
    """The caption of :func:`plot_rate`: markers, bars, dots, lines and the intervals' level, as drawn."""
    agg = cfg["agg"]
    centre = {None: "geometric mean", "logmean": "geometric mean", "mean": "mean", "median": "median"}[agg]
    kind = {"2sd": "2sd_log" if agg in (None, "logmean") else "2sd", "range": "range", "none": "none"}[spread]
    text = fs.bars_text(kind, counts, centre=centre)
    if kind == "2sd":
        text += " (lower end kept positive)"
    if points:
        text += "; dots: replicates"
    laws = ", ".join(_MODEL_NAMES[m] for m in models)
    text += f"; lines: fitted {laws}; " + fs.interval_text(cfg["ci"], what="exponent $\\alpha$",
                                                            method=cfg.get("method"))
    return text


def plot_rate(result: RateResult, ax: Any = None, *, models: list[str] | None = None, spread: str = "2sd",
              points: bool = True, colors: list[str] | None = None, title: str | None = None,
              note: bool = True) -> Any:
    r"""Log-log plot of a :class:`~moestat.rates.RateResult` in the papers' Figure 1 style.

    Per group: replicate values (faint dots, ``points=True``), a per-n centre with error bars and the
    fitted line of each model, $\log y = c - \alpha\, u(n)$ ($u = \log n$ for ``power``), labelled
    ``exponent [ci_low, ci_high]`` in the legend (red dash-dot as in the papers for a single group and model;
    otherwise in the group's colour, one line style per model).  The centre matches the fit: geometric mean
    for replicate-level and ``logmean`` fits, mean or median for ``agg="mean"`` / ``"median"``.
    ``spread="2sd"`` draws centre $\times/\div\ e^{2 s}$, $s$ the SD of $\log y$ (geometric), or mean
    $\pm 2$ SD clipped to positive values (the papers' $\pm 2$ SD bars); ``"range"`` draws min to max;
    ``"none"`` no bars.  The title (``title``, default "<metric> against <x>"), mathtext axis labels
    (:func:`moestat.figstyle.label`) and, with ``note=True``, a note under the legend saying what the markers,
    bars and lines are and the level and method of the intervals, follow :mod:`moestat.figstyle`.

    Returns
    -------
    matplotlib Axes
    """
    from ._core import regressor

    if spread not in ("2sd", "range", "none"):
        raise ValueError(f"spread={spread!r} is not supported; use '2sd', 'range' or 'none'.")
    cfg = result.config
    by, x, y, agg = cfg["by"], cfg["x"], cfg["y"], cfg["agg"]
    models = list(cfg["models"]) if models is None else list(models)
    details = result.details
    groups = result.data.groupby(by, sort=True) if by else [((), result.data)]
    palette = colors or [f"C{i}" for i in range(10)]
    single = len(models) == 1 and result.data.groupby(by).ngroups == 1 if by else len(models) == 1
    counts: list[int] = []
    with fs.style():
        ax = _axes(ax)
        for gi, (key, sub) in enumerate(groups):
            key = key if isinstance(key, tuple) else (key,)
            key = key if by else ()
            color = palette[gi % len(palette)]
            label = _label(key, by)
            cells = sub.groupby(x, sort=True)[y]
            counts += [int(c) for c in cells.size()]
            ns = np.asarray(list(cells.groups.keys()), dtype=np.float64)
            if points:
                ax.scatter(sub[x], sub[y], s=6, alpha=0.25, color=color, linewidths=0)
            centre, low, high = _centre_and_band(cells, agg, spread)
            yerr = None if spread == "none" else np.vstack([centre - low, high - centre])
            ax.errorbar(ns, centre, yerr=yerr, fmt="o-", color=color, ms=4, lw=1.2, capsize=2,
                        label=f"{label}: data" if label else "data")
            mask = np.ones(len(details), dtype=bool)
            for b, v in zip(by, key, strict=True):
                mask &= (details[b] == v).to_numpy()
            grid = np.logspace(np.log10(ns.min()), np.log10(ns.max()), 100)
            for _, row in details[mask].iterrows():
                if row["model"] not in models:
                    continue
                fitted = np.exp(row["intercept"] - row["exponent"] * regressor(row["model"], grid))
                text = _rate_text(row["model"], row["exponent"], row["ci_low"], row["ci_high"])
                ax.plot(grid, fitted, _LINESTYLES[row["model"]], color="red" if single else color, lw=1.6,
                        label=f"{label}: fit {text}" if label else f"fit {text}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        default = f"{fs.short_name(y)} against {'sample size' if x == 'n' else x}"
        fs.finish_axes(ax, title=default if title is None else title, xlabel=x, ylabel=y)
        n_entries = len(ax.get_legend_handles_labels()[0])
        leg = fs.legend_below(ax, ncol=2 if n_entries > 3 else 1)
        if note:
            fs.note(ax, _rate_note(cfg, spread, counts, points, models), below=leg)
    return ax


def plot_window(ws: WindowSensitivity, ax: Any = None, *, title: str | None = None, note: bool = True) -> Any:
    """Exponent with CI bars against the number of dropped smallest / largest n values.

    A flat profile with overlapping intervals supports one asymptotic exponent; a drift means the fitted
    "rate" is pre-asymptotic curvature (peers-and-conventions B.8).  The note under the legend (``note=True``)
    gives the intervals' level and method.
    """
    tab = ws.table
    by = ws.config["by"]
    groups = tab.groupby(by, sort=True) if by else [((), tab)]
    with fs.style():
        ax = _axes(ax)
        for gi, (key, sub) in enumerate(groups):
            key = key if isinstance(key, tuple) else (key,)
            label = _label(key if by else (), by)
            full = sub[sub["side"] == "full"]
            for side, marker, shift in (("smallest", "o", -0.08), ("largest", "s", 0.08)):
                part = pd.concat([full, sub[sub["side"] == side]]).sort_values("dropped")
                if len(part) <= len(full):
                    continue
                xs = part["dropped"].to_numpy(float) + shift
                est = part["exponent"].to_numpy(float)
                err = np.vstack([est - part["ci_low"].to_numpy(float), part["ci_high"].to_numpy(float) - est])
                ax.errorbar(xs, est, yerr=err, fmt=marker + ("-" if side == "smallest" else "--"),
                            color=f"C{gi % 10}", ms=4, capsize=2,
                            label=f"{label + ': ' if label else ''}drop {side} n")
        ax.axhline(0, color="grey", lw=0.5)
        model = ws.config["model"]
        default = f"window sensitivity of the {fs.short_name(ws.config['y'])} exponent"
        fs.finish_axes(ax, title=default if title is None else title, xlabel="number of n values dropped",
                       ylabel=fs.label("exponent") + f" ({model} law)", raw=True)
        n_entries = len(ax.get_legend_handles_labels()[0])
        leg = fs.legend_below(ax, ncol=2 if n_entries > 3 else 1)
        if note:
            text = (fs.interval_text(ws.config["ci"], what="exponent refitted without the dropped n values",
                                     method=ws.config.get("method")).replace("[ ]", "bars")
                    + r"; grey line: $\alpha = 0$")
            fs.note(ax, text, below=leg)
    return ax


def plot_sample_complexity(res: SampleComplexityResult, ax: Any = None, *, design: str | None = None,
                           title: str | None = None, note: bool = True) -> Any:
    """n* with bootstrap CI against ``design`` (a ``by`` column) on log-log axes; censored points as triangles.

    Right-censored n* (target never reached) are drawn at ``n_max`` with an upward triangle; left-censored
    at ``n_min`` with a downward triangle.  The note under the legend (``note=True``) says so and gives the
    intervals' level.
    """
    tab = res.table
    by = res.config["by"]
    if design is None:
        if not by:
            raise ValueError("design= must name a by column of the sample-complexity result to plot against.")
        design = by[-1]
    if design not in by:
        raise ValueError(f"design={design!r} is not a by column ({by}).")
    rest = [c for c in by if c != design]
    groups = tab.groupby(rest, sort=True) if rest else [((), tab)]
    cfg = res.config
    op = r"\geq" if cfg["direction"] == "above" else r"\leq"
    with fs.style():
        ax = _axes(ax)
        for gi, (key, sub) in enumerate(groups):
            key = key if isinstance(key, tuple) else (key,)
            color = f"C{gi % 10}"
            label = _label(key if rest else (), rest) or cfg["metric"]
            ok = sub[sub["censored"] == "none"]
            hi = ok["ci_high"].to_numpy(float)
            hi_plot = np.where(np.isfinite(hi), hi, ok["n_max"].to_numpy(float))
            err = np.vstack([ok["n_star"] - ok["ci_low"].clip(lower=1e-12), hi_plot - ok["n_star"]])
            ax.errorbar(ok[design], ok["n_star"], yerr=err, fmt="o-", color=color, ms=4, capsize=2, label=label)
            right = sub[sub["censored"] == "right"]
            left = sub[sub["censored"] == "left"]
            ax.scatter(right[design], right["n_max"], marker="^", color=color,
                       label=f"{label}: not reached by n_max" if len(right) else None)
            ax.scatter(left[design], left["n_min"], marker="v", color=color,
                       label=f"{label}: reached at n_min" if len(left) else None)
        ax.set_xscale("log")
        ax.set_yscale("log")
        target = f"{fs.short_name(cfg['metric'])} {'≥' if cfg['direction'] == 'above' else '≤'} {cfg['target']:g}"
        fs.finish_axes(ax, title=f"sample size to reach {target}" if title is None else title)
        fs.finish_axes(ax, xlabel=design)
        fs.finish_axes(ax, ylabel=rf"$n^*$ (mean {fs.short_name(cfg['metric'])} ${op}$ {cfg['target']:g})", raw=True)
        n_entries = len(ax.get_legend_handles_labels()[0])
        leg = fs.legend_below(ax, ncol=2 if n_entries > 3 else 1)
        if note:
            text = (fs.interval_text(cfg["ci"], what="$n^*$", method="bootstrap").replace("[ ]", "bars")
                    + " (drawn to n_max when unbounded); ▲ at n_max: target not reached in the grid; "
                      "▼ at n_min: reached at the smallest n")
            fs.note(ax, text, below=leg)
    return ax


def _grid(n_levels: int, n_responses: int, legend_in: float) -> tuple[int, int, bool]:
    """(rows, columns, by_level): one column per level when there are several; else the responses in two columns,
    or in one when a legend ``legend_in`` inches wide would not fit under a half-width panel."""
    if n_levels > 1:
        return n_responses, n_levels, True
    ncol = min(2, n_responses)
    if ncol == 2 and legend_in > fs.PAGE_WIDTH_IN / 2 - 0.2:
        ncol = 1
    return -(-n_responses // ncol), ncol, False


def _legend_width_in(labels: list[str], handle_em: float = 3.6) -> float:
    """Width (inches) of a one-column legend of ``labels`` at the legend size of a page-wide figure (DejaVu Sans
    averages about 0.55 em per character)."""
    size = fs.SIZES["legend"]
    chars = max((len(t) for t in labels), default=0)
    return (0.55 * chars + handle_em + 1.5) * size / 72.0


def _level_of(rates: pd.DataFrame, confidence_level: float | None) -> float:
    """The intervals' level: ``confidence_level``, else the table's ``ci`` column, else fit_rate's 0.95."""
    recorded = sorted(set(rates["ci"].dropna())) if "ci" in rates.columns else []
    if confidence_level is None:
        return float(recorded[0]) if len(recorded) == 1 else 0.95
    if recorded and any(abs(r - confidence_level) > 1e-12 for r in recorded):
        raise ValueError(f"confidence_level={confidence_level} disagrees with the rates table's ci column "
                         f"{recorded}; pass the level the rates were fitted at or leave it None.")
    return float(confidence_level)


def _pick_rate(rates: pd.DataFrame, y: str, rows: str, level: Any, hue: str, h: Any) -> pd.Series | None:
    row = rates[(rates["y"] == y) & (rates[rows] == level) & (rates[hue] == h)]
    if not len(row):
        return None
    if "model" in row.columns and (row["model"] == "power").any():
        row = row[row["model"] == "power"]
    return row.iloc[0]


def _hue_text(hue_label: str, h: Any, r: pd.Series | None) -> str:
    """Legend text of one hue level: ``hue_label`` formatted, then ``exponent [ci_low, ci_high], verdict``."""
    text = hue_label.format(h)
    if r is not None:
        text += f": {r['exponent']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}], {r['verdict']}"
    return text


def _profile_panel(ax: Any, sub_frame: pd.DataFrame, rates: pd.DataFrame, y: str, *, rows: str, level: Any,
                   hue: str, units: str, colors: dict[Any, str] | None, hue_label: str) -> tuple[list[Any], list[str]]:
    """One panel of :func:`plot_unit_profiles`: thin unit profiles, the median and the fitted line per hue level;
    returns the legend's handles (median and fitted line as a pair) and labels."""
    from ._core import regressor

    handles, labels = [], []
    for h, sub in sub_frame.groupby(hue):
        color = (colors or {}).get(h)
        for _, one in sub.groupby(units):
            one = one.sort_values("n")
            ax.plot(one["n"], one[y], "-", color=color, alpha=0.2, lw=0.8)
        med = sub.groupby("n")[y].median()
        (line,) = ax.plot(med.index, med.values, "o-", color=color, lw=2, ms=4)
        r = _pick_rate(rates, y, rows, level, hue, h)
        text = _hue_text(hue_label, h, r)
        handle: Any = line
        if r is not None:
            if np.isfinite(r.get("intercept", np.nan)) and r.get("model", "power") in _MODEL_NAMES:
                grid = np.geomspace(float(med.index.min()), float(med.index.max()), 50)
                fit = np.exp(r["intercept"] - r["exponent"] * regressor(r.get("model", "power"), grid))
                (fit_line,) = ax.plot(grid, fit, "--", color=line.get_color(), lw=1.3)
                handle = (line, fit_line)
        handles.append(handle)
        labels.append(text)
    return handles, labels


def plot_unit_profiles(frame: pd.DataFrame, rates: pd.DataFrame, responses: list[str], *, hue: str,
                       rows: str = "expert", units: str = "truth_seed", suffix: str = "_best",
                       colors: dict[Any, str] | None = None, hue_label: str = "{}", label: str = "",
                       ylabel: str = "lowest-objective fit", confidence_level: float | None = None,
                       path: Any = None) -> Any:
    r"""One log-log panel per ``rows`` level and response: every unit's profile (thin), the median over units
    (thick) and the fitted rate law $y = e^{c}\, n^{-\alpha}$ (dashed) per ``hue`` level, whose legend entry gives
    that level's exponent, interval and verdict from ``rates``.

    ``rates`` is a :func:`moestat.fit_rate` table with a ``y`` column (``response + suffix``) and the ``rows``
    and ``hue`` columns (``intercept`` and ``model`` draw the fitted line; a ``power`` row is preferred);
    ``hue_label`` formats a hue level for the legend (e.g. ``"regime {}"``); ``ylabel`` names the fits in the
    caption.  Panels: one column per ``rows`` level (responses down the rows), or the responses in two columns
    when there is one level; titles ``"<level>: <response> (<label>)"``.  ``confidence_level`` is the level
    the rates were fitted at (default: the table's ``ci`` column, else :func:`moestat.fit_rate`'s 0.95), stated
    in the caption.  Returns the matplotlib Figure, or saves it to ``path``
    (:func:`moestat.figstyle.save`), closes it and returns None.
    """
    import matplotlib.pyplot as plt
    from matplotlib.legend_handler import HandlerTuple

    level_ci = _level_of(rates, confidence_level)
    levels = [r for r in ("gelu", "relu", "linear") if r in set(frame[rows])] or sorted(set(frame[rows]))
    texts = [_hue_text(hue_label, h, _pick_rate(rates, r + suffix, rows, lev, hue, h))
             for lev in levels for r in responses for h in sorted(set(frame.loc[frame[rows] == lev, hue]))]
    nrow, ncol, by_level = _grid(len(levels), len(responses), _legend_width_in(texts))
    n_hue = frame[hue].nunique()
    row_height = (2.9 if ncol > 1 else 2.7) + 0.75 + 0.16 * n_hue
    with fs.style():
        fig, axes = plt.subplots(nrow, ncol, figsize=(fs.PAGE_WIDTH_IN, row_height * nrow), squeeze=False,
                                 layout="constrained")
        panels = [(levels[j], responses[i]) for i in range(len(responses)) for j in range(len(levels))] \
            if by_level else [(levels[0], r) for r in responses]
        for ax, (level, response) in zip(axes.flat, panels, strict=False):
            y = response + suffix
            handles, labels = _profile_panel(ax, frame[frame[rows] == level], rates, y, rows=rows, level=level,
                                             hue=hue, units=units, colors=colors, hue_label=hue_label)
            ax.set(xscale="log", yscale="log")
            name = fs.short_name(response)
            fs.finish_axes(ax, title=f"{level}: {name} ({label})" if label else f"{level}: {name}",
                           xlabel="n", ylabel=response)
            fs.legend_below(ax, handles=handles, labels=labels, handlelength=3.6,
                            handler_map={tuple: HandlerTuple(ndivide=None, pad=0.6)})
        for ax in axes.flat[len(panels):]:
            ax.set_visible(False)
        pct = f"{100 * level_ci:.3g}%"
        one, many = _UNIT_NAMES.get(units, (units, units))
        fs.caption(fig, f"Thin lines: one {one} each; thick lines with markers: median over {many} at each n "
                        f"(no error bars); dashed: fitted rate law $y = C n^{{-\\alpha}}$. Legend: exponent "
                        f"$\\alpha$, its {pct} CI in [ ], and the verdict. Fits: {ylabel}.")
    return _save(fig, path)


def plot_invariance(frame: pd.DataFrame, responses: list[str], *, hue: str, marker: str = "expert",
                    suffix: str = "_alt", colors: dict[Any, str] | None = None, hue_label: str = "{}",
                    label: str = "", names: tuple[str, str] = ("Newton (default)", "Levenberg-Marquardt"),
                    path: Any = None) -> Any:
    """Each fit's response against its second solver's on the same data (``y`` vs ``y + suffix``), one panel per
    response (two columns), log-log with the diagonal: the picture behind :func:`moestat.optimizer_invariance`.
    One legend for all panels, below them; a caption says what a point and the diagonal are.  Returns the
    matplotlib Figure, or saves it to ``path`` (:func:`moestat.figstyle.save`), closes it and returns None."""
    import matplotlib.pyplot as plt

    shapes = {"gelu": "o", "relu": "s", "linear": "^"}
    ncol = min(2, len(responses))
    nrow = -(-len(responses) // ncol)
    width = fs.PAGE_WIDTH_IN if ncol > 1 else 5.2
    n_entries = len(frame.groupby([marker, hue]))
    legend_row = 0.0 if len(responses) == 1 or len(responses) < nrow * ncol else 0.25 + 0.18 * -(-n_entries // 4)
    with fs.style():
        if legend_row:
            fig, axes, legend_ax = fs.subplots(nrow, ncol, figsize=(width, 3.9 * nrow + legend_row),
                                               legend_height=legend_row)
        else:
            fig, axes = plt.subplots(nrow, ncol, figsize=(width, 3.9 * nrow), squeeze=False, layout="constrained")
            legend_ax = None
        for ax, y in zip(axes.flat, responses, strict=False):
            for (m, h), sub in frame.groupby([marker, hue]):
                ax.scatter(sub[y], sub[y + suffix], s=14, marker=shapes.get(m, "o"), color=(colors or {}).get(h),
                           alpha=0.7, label=f"{hue_label.format(h)}, {m}")
            both = frame[[y, y + suffix]].to_numpy()
            lo, hi = np.nanmin(both[both > 0]), np.nanmax(both)
            ax.plot([lo, hi], [lo, hi], "k:", lw=1)
            ax.set(xscale="log", yscale="log")
            title = fs.short_name(y) + (f" ({label})" if label else "")
            fs.finish_axes(ax, title=title, xlabel=f"{fs.label(y)}, {names[0]}",
                           ylabel=f"{fs.label(y)}, {names[1]}", raw=True)
        spare = list(axes.flat[len(responses):])
        for ax in spare[1:]:
            ax.set_visible(False)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        if len(responses) == 1:
            fs.legend_below(axes.flat[0], ncol=2)
        elif spare:
            fs.legend_panel(spare[0], handles, labels, title=f"{hue}, {marker}")
        else:
            fs.legend_panel(legend_ax, handles, labels, ncol=min(4, len(labels)))
        fig.suptitle(f"Same data, two solvers: {names[0]} against {names[1]}", fontsize=fs.fontsize(fig, "title"))
        fs.caption(fig, f"Each point: one fit, its error under {names[0]} (x) and {names[1]} (y) on the same data "
                        f"and starts; dotted: y = x (equal errors), points below it: {names[1]} reached the "
                        f"smaller error. Colour: {hue}; marker: {marker}.")
    return _save(fig, path)


def _save(fig: Any, path: Any) -> Any:
    """Return ``fig``, or save it to ``path`` (:func:`moestat.figstyle.save`: 150 dpi, tight) and close it."""
    if path is None:
        return fig
    fs.save(fig, path)
    return None
