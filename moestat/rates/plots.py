"""Plots for rate studies (matplotlib; safe under the Agg backend, never calls ``plt.show``).

* :func:`plot_rate` — the papers' Figure 1 style: log-log points with replicate spread, fitted lines,
  exponent and CI in the legend (nguyen2024 Fig. 1-2).
* :func:`plot_window` — exponent and CI as the smallest / largest n are dropped (window sensitivity).
* :func:`plot_sample_complexity` — n* with its bootstrap CI against a design variable (chowdhury2023 Fig. 5).
* :func:`plot_unit_profiles` — every truth's error profile and the median per group, with exponents and verdicts.
* :func:`plot_invariance` — each fit's response against a second solver's on the same data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # pragma: no cover
    from .complexity import SampleComplexityResult
    from .exponents import RateResult, WindowSensitivity

__all__ = ["plot_invariance", "plot_rate", "plot_sample_complexity", "plot_unit_profiles", "plot_window"]

_LINESTYLES = {"power": "-.", "power_log": "--", "inverse_log": ":"}


def _axes(ax: Any) -> Any:
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6.0, 4.2))
    return ax


def _label(key: tuple, by: list[str]) -> str:
    return ", ".join(str(v) for v in key) if by else ""


def _rate_text(model: str, exponent: float, lo: float, hi: float) -> str:
    base = {"power": "n", "power_log": "(n/log n)", "inverse_log": "(log n)"}[model]
    return f"{base}^-{exponent:.2f} [{lo:.2f}, {hi:.2f}]"


def plot_rate(result: RateResult, ax: Any = None, *, models: list[str] | None = None, spread: str = "2sd",
              points: bool = True, colors: list[str] | None = None) -> Any:
    """Log-log plot of a :class:`~moestat.rates.RateResult` in the papers' Figure 1 style.

    Per group: replicate values (faint dots, ``points=True``), a per-n centre with error bars and the
    fitted line of each model with ``exponent [ci_low, ci_high]`` in the legend (red dash-dot as in the papers
    for a single group and model; otherwise in the group's colour, one line style per model).  The centre matches the
    fit: geometric mean for replicate-level and ``logmean`` fits, mean or median for ``agg="mean"`` /
    ``"median"``.  ``spread="2sd"`` draws centre x/÷ exp(2 sd of log y) (geometric) or mean -/+ 2 sd
    clipped to positive values (the papers' +-2 SD bars); ``"range"`` draws min to max; ``"none"`` no bars.

    Returns
    -------
    matplotlib Axes
    """
    from ._core import regressor

    if spread not in ("2sd", "range", "none"):
        raise ValueError(f"spread={spread!r} is not supported; use '2sd', 'range' or 'none'.")
    ax = _axes(ax)
    cfg = result.config
    by, x, y, agg = cfg["by"], cfg["x"], cfg["y"], cfg["agg"]
    models = list(cfg["models"]) if models is None else list(models)
    details = result.details
    groups = result.data.groupby(by, sort=True) if by else [((), result.data)]
    palette = colors or [f"C{i}" for i in range(10)]
    single = len(models) == 1 and result.data.groupby(by).ngroups == 1 if by else len(models) == 1
    for gi, (key, sub) in enumerate(groups):
        key = key if isinstance(key, tuple) else (key,)
        key = key if by else ()
        color = palette[gi % len(palette)]
        label = _label(key, by)
        cells = sub.groupby(x, sort=True)[y]
        ns = np.asarray(list(cells.groups.keys()), dtype=np.float64)
        if points:
            ax.scatter(sub[x], sub[y], s=6, alpha=0.25, color=color, linewidths=0)
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
        yerr = None if spread == "none" else np.vstack([centre - low, high - centre])
        ax.errorbar(ns, centre, yerr=yerr, fmt="o-", color=color, ms=4, lw=1.2, capsize=2,
                    label=f"{label} data" if label else "data")
        mask = np.ones(len(details), dtype=bool)
        for b, v in zip(by, key, strict=True):
            mask &= (details[b] == v).to_numpy()
        grid = np.logspace(np.log10(ns.min()), np.log10(ns.max()), 100)
        for _, row in details[mask].iterrows():
            if row["model"] not in models:
                continue
            fitted = np.exp(row["intercept"] - row["exponent"] * regressor(row["model"], grid))
            text = _rate_text(row["model"], row["exponent"], row["ci_low"], row["ci_high"])
            ax.plot(grid, fitted, _LINESTYLES[row["model"]], color="red" if single else color, lw=1.4,
                    label=f"{label}: {text}" if label else text)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"sample size {x}")
    ax.set_ylabel(y)
    ax.legend(fontsize=7, frameon=False)
    return ax


def plot_window(ws: WindowSensitivity, ax: Any = None) -> Any:
    """Exponent with CI bars against the number of dropped smallest / largest n values.

    A flat profile with overlapping intervals supports one asymptotic exponent; a drift means the fitted
    "rate" is pre-asymptotic curvature (peers-and-conventions B.8).
    """
    ax = _axes(ax)
    tab = ws.table
    by = ws.config["by"]
    groups = tab.groupby(by, sort=True) if by else [((), tab)]
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
            ax.errorbar(xs, est, yerr=err, fmt=marker + ("-" if side == "smallest" else "--"), color=f"C{gi % 10}",
                        ms=4, capsize=2, label=f"{label + ': ' if label else ''}drop {side} n")
    ax.set_xlabel("number of n values dropped")
    ax.set_ylabel(f"exponent ({ws.config['model']})")
    ax.axhline(0, color="grey", lw=0.5)
    ax.legend(fontsize=7, frameon=False)
    return ax


def plot_sample_complexity(res: SampleComplexityResult, ax: Any = None, *, design: str | None = None) -> Any:
    """n* with bootstrap CI against ``design`` (a ``by`` column) on log-log axes; censored points as triangles.

    Right-censored n* (target never reached) are drawn at ``n_max`` with an upward triangle; left-censored
    at ``n_min`` with a downward triangle.
    """
    ax = _axes(ax)
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
    for gi, (key, sub) in enumerate(groups):
        key = key if isinstance(key, tuple) else (key,)
        color = f"C{gi % 10}"
        label = _label(key if rest else (), rest) or res.config["metric"]
        ok = sub[sub["censored"] == "none"]
        hi = ok["ci_high"].to_numpy(float)
        hi_plot = np.where(np.isfinite(hi), hi, ok["n_max"].to_numpy(float))
        err = np.vstack([ok["n_star"] - ok["ci_low"].clip(lower=1e-12), hi_plot - ok["n_star"]])
        ax.errorbar(ok[design], ok["n_star"], yerr=err, fmt="o-", color=color, ms=4, capsize=2, label=label)
        right = sub[sub["censored"] == "right"]
        left = sub[sub["censored"] == "left"]
        ax.scatter(right[design], right["n_max"], marker="^", color=color)
        ax.scatter(left[design], left["n_min"], marker="v", color=color)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(design)
    ax.set_ylabel(f"n* ({res.config['metric']} {'>=' if res.config['direction'] == 'above' else '<='} "
                  f"{res.config['target']:g})")
    ax.legend(fontsize=7, frameon=False)
    return ax


def plot_unit_profiles(frame: pd.DataFrame, rates: pd.DataFrame, responses: list[str], *, hue: str,
                       rows: str = "expert", units: str = "truth_seed", suffix: str = "_best",
                       colors: dict[Any, str] | None = None, hue_label: str = "{}", label: str = "",
                       ylabel: str = "lowest-objective fit", path: Any = None) -> Any:
    """One log-log panel per ``rows`` level and response: every unit's profile (thin), the median over units
    (thick) per ``hue`` level, and that level's exponent, interval and verdict from ``rates`` in the legend.

    ``rates`` is a :func:`moestat.fit_rate` table with a ``y`` column (``response + suffix``) and the ``rows``
    and ``hue`` columns; ``hue_label`` formats a hue level for the legend (e.g. ``"regime {}"``).  Returns the
    matplotlib Figure, or saves it to ``path`` (110 dpi), closes it and returns None.
    """
    import matplotlib.pyplot as plt

    levels = [r for r in ("gelu", "relu", "linear") if r in set(frame[rows])] or sorted(set(frame[rows]))
    fig, axes = plt.subplots(len(levels), len(responses), figsize=(4.4 * len(responses), 3.6 * len(levels)),
                             squeeze=False)
    for i, level in enumerate(levels):
        for j, y in enumerate(r + suffix for r in responses):
            ax = axes[i, j]
            for h, sub in frame[frame[rows] == level].groupby(hue):
                color = (colors or {}).get(h)
                for _, one in sub.groupby(units):
                    one = one.sort_values("n")
                    ax.plot(one["n"], one[y], "-", color=color, alpha=0.2, lw=0.8)
                med = sub.groupby("n")[y].median()
                row = rates[(rates["y"] == y) & (rates[rows] == level) & (rates[hue] == h)]
                text = hue_label.format(h)
                if len(row):
                    r = row.iloc[0]
                    text += f": {r['exponent']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}], {r['verdict']}"
                ax.plot(med.index, med.values, "o-", color=color, lw=2, ms=4, label=text)
            ax.set(xscale="log", yscale="log", xlabel="sample size n", ylabel=f"{y} ({ylabel})",
                   title=f"{level}: {y.removesuffix(suffix)} ({label})")
            ax.legend(fontsize=6.5)
    fig.tight_layout()
    return _save(fig, path)


def plot_invariance(frame: pd.DataFrame, responses: list[str], *, hue: str, marker: str = "expert",
                    suffix: str = "_alt", colors: dict[Any, str] | None = None, hue_label: str = "{}",
                    label: str = "", names: tuple[str, str] = ("Newton (default)", "Levenberg-Marquardt"),
                    path: Any = None) -> Any:
    """Each fit's response against its second solver's on the same data (``y`` vs ``y + suffix``), one panel per
    response, log-log with the diagonal: the picture behind :func:`moestat.optimizer_invariance`.  Returns the
    matplotlib Figure, or saves it to ``path`` (110 dpi), closes it and returns None."""
    import matplotlib.pyplot as plt

    shapes = {"gelu": "o", "relu": "s", "linear": "^"}
    fig, axes = plt.subplots(1, len(responses), figsize=(4.2 * len(responses), 3.8), squeeze=False)
    for ax, y in zip(axes[0], responses, strict=True):
        for (m, h), sub in frame.groupby([marker, hue]):
            ax.scatter(sub[y], sub[y + suffix], s=12, marker=shapes.get(m, "o"), color=(colors or {}).get(h),
                       alpha=0.7, label=f"{hue_label.format(h)}, {m}")
        both = frame[[y, y + suffix]].to_numpy()
        lo, hi = np.nanmin(both[both > 0]), np.nanmax(both)
        ax.plot([lo, hi], [lo, hi], "k:", lw=1)
        ax.set(xscale="log", yscale="log", xlabel=f"{y}, {names[0]}", ylabel=f"{y}, {names[1]}",
               title=f"{y}: same data, two solvers ({label})")
        ax.legend(fontsize=6.5)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: Any, path: Any) -> Any:
    """Return ``fig``, or save it to ``path`` at 110 dpi and close it."""
    if path is None:
        return fig
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
