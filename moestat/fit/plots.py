r"""Plots of a fitted mixture of experts: :func:`plot_fit` (``MLEFit.plot``).

The figure shows the fitted model along one covariate :math:`x_j`, the others held fixed at
:math:`\bar x_{-j}` (their means, the most frequent level of a categorical one, or values given in ``at=``):

* top panel: the data :math:`(x_{tj}, y_t)` coloured by their maximum a posteriori expert
  :math:`\arg\max_i \tau_i(x_t, y_t)`, and each expert's mean :math:`h(x;\eta_i)` over a grid of :math:`x_j`
  (for Poisson experts the rate :math:`\lambda_i(x) = e^{a_i^\top x + b_i}`, for binomial experts the success
  probability);
* bottom panel: the gate weights :math:`\tilde\pi_i(x)` over the same grid (Jordan & Jacobs 1994's gating
  network, normalised to sum to one).

The scatter shows the data marginally in :math:`x_j`; the lines are conditional on :math:`\bar x_{-j}` (the
legend's title says at which values).  Drawn with :mod:`moestat.figstyle`.  The lines carry ``gid`` labels
``"expert_mean_<i>"`` and ``"gate_<i>"`` so that tests and users can find them.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .. import figstyle

if TYPE_CHECKING:
    from .results import MLEFit

__all__ = ["plot_fit"]

_MEAN_WORD = {"gaussian": "mean", "poisson": "rate", "binomial": "probability"}


def _covariates(fit: MLEFit) -> list[str]:
    """The covariates a user can put on the x axis: a formula fit's data columns (response excluded), else the
    fit's feature names."""
    if fit.design is None:
        return list(fit.layout.feature_names)
    cols = fit.design._specs.columns
    used = [c for part in ("expert", "gate", "shared", "offset") for c in cols.get(part, [])]
    response = set(cols.get("response", []))
    return [c for c in dict.fromkeys(used) if c not in response]


def _training_frame(fit: MLEFit, rep: int, covariates: list[str]) -> pd.DataFrame:
    """A formula fit's data rebuilt from its design when every covariate is itself a column of the design."""
    names = list(fit.layout.feature_names)
    offset = fit.design.offset_formula
    if offset is not None and offset in fit.design.data_columns:  # an offset that is a column is kept as it is
        names[names.index(f"offset({offset})")] = offset
    absent = [c for c in covariates if c not in names]
    if absent:
        raise ValueError(f"the fit does not keep the raw column(s) {absent} (the formula transforms them); pass "
                         "data=, the frame the fit was made from, e.g. fit.plot('x', data=df).")
    X = fit._X[rep].detach().cpu().numpy()
    frame = pd.DataFrame({c: X[:, names.index(c)] for c in covariates}, index=fit.design.index)
    frame[fit.response_name] = fit._y[rep].detach().cpu().numpy()
    return frame


def _choose_x(x: str | int | None, covariates: list[str], fit: MLEFit) -> str:
    if x is None:
        if fit.design is None:  # an array fit: the experts' first covariate
            return covariates[fit.layout.expert_columns[0]] if fit.layout.expert_columns else covariates[0]
        return covariates[0]
    if isinstance(x, numbers.Integral) and not isinstance(x, bool) and fit.design is None:
        if not 0 <= int(x) < len(covariates):
            raise ValueError(f"x={x} is not a column index of the fit's {len(covariates)} covariates {covariates}.")
        return covariates[int(x)]
    if not isinstance(x, str) or x not in covariates:
        raise ValueError(f"x={x!r} is not a covariate of the fit; choose one of {covariates}.")
    return x


def _held_value(values: pd.Series) -> Any:
    """The value a covariate is held at: its mean if numeric (not bool), else its most frequent value."""
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        return float(values.mean())
    return values.mode(dropna=True).iloc[0]


def _grid(values: pd.Series, n_grid: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The grid of x and, for a categorical x, its levels (positions 0 .. L-1 on the axis)."""
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        v = values.to_numpy(dtype=float)
        return np.linspace(np.nanmin(v), np.nanmax(v), n_grid), None
    levels = np.asarray(pd.unique(values.dropna()))
    try:
        levels = np.sort(levels)
    except TypeError:
        pass
    return np.arange(len(levels), dtype=float), levels


def _grid_inputs(fit: MLEFit, frame: pd.DataFrame, covariates: list[str], x: str, grid: np.ndarray,
                 levels: np.ndarray | None, at: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Inputs along the grid (a frame for a formula fit, an array otherwise) and the values held fixed."""
    held = {c: at[c] if c in at else _held_value(frame[c]) for c in covariates if c != x}
    xs = levels if levels is not None else grid
    if fit.design is not None:
        g = pd.DataFrame({c: [v] * len(xs) for c, v in held.items()})
        g[x] = xs
        return g, held
    X = np.empty((len(xs), len(covariates)))
    for j, c in enumerate(covariates):
        X[:, j] = xs if c == x else float(held[c])
    return X, held


def _axes(ax: Any) -> tuple[Any, Any, Any, Any]:
    """``(fig, top, bottom or None, legend axes or None)`` from ``ax``: None (a new two-panel figure), one Axes
    (the means only) or a pair of Axes (means, gate)."""
    if ax is None:
        fig, axes, legend_ax = figstyle.subplots(2, 1, sharex=True, height_ratios=[2.0, 1.0], legend_height=0.6,
                                                 figsize=(figstyle.PAGE_WIDTH_IN, 6.4))
        return fig, axes[0, 0], axes[1, 0], legend_ax
    if hasattr(ax, "plot") and hasattr(ax, "figure"):
        return ax.figure, ax, None, None
    pair = list(np.ravel(np.asarray(ax, dtype=object)))
    if len(pair) != 2 or not all(hasattr(a, "plot") for a in pair):
        raise TypeError(f"ax must be None, a matplotlib Axes (the means panel only) or a pair of Axes (means, "
                        f"gate), got {ax!r}.")
    return pair[0].figure, pair[0], pair[1], None


def plot_fit(fit: MLEFit, x: str | int | None = None, *, ax: Any = None, at: Mapping[str, Any] | None = None,
             data: pd.DataFrame | None = None, rep: int = 0, n_grid: int = 200) -> Any:
    r"""Draw the fitted expert means over covariate ``x`` with the data coloured by MAP expert, the gate below.

    Parameters
    ----------
    fit : MLEFit
    x : str or int, optional
        The covariate on the horizontal axis: a column of the formula's data (a raw column such as ``income``,
        also when the formula uses ``np.log(income)``), or a feature name / column index of an array fit.
        Default: the first covariate of the experts.  A categorical column is drawn at its levels.
    ax : matplotlib Axes, pair of Axes, optional
        Where to draw: a pair (means, gate), or one Axes for the means panel only.  Default: a new figure.
    at : mapping, optional
        Values at which the other covariates are held (default: their means; the most frequent level of a
        categorical covariate).  The columns of an offset are covariates too: ``at={"exposure": 1}`` draws the
        experts' rates per unit of exposure.
    data : DataFrame, optional
        A formula fit's data (needed when the formula transforms a covariate, e.g. ``np.log(x)``, since the fit
        keeps only its design); its rows are the points drawn.
    rep : int
        The replicate of a batched fit.
    n_grid : int
        Grid points along a numeric ``x``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    if not 0 <= rep < fit.n_reps or isinstance(rep, bool):
        raise ValueError(f"rep must be an integer in [0, {fit.n_reps}), got {rep!r}.")
    if isinstance(n_grid, bool) or not isinstance(n_grid, numbers.Integral) or n_grid < 2:
        raise ValueError(f"n_grid must be an integer >= 2, got {n_grid!r}.")
    at = dict(at or {})
    covariates = _covariates(fit)
    x = _choose_x(x, covariates, fit)
    unknown = [c for c in at if c not in covariates]
    if unknown:
        raise ValueError(f"at= names {unknown}, which are not covariates of the fit; choose among {covariates}.")
    if data is not None and fit.design is None:
        raise TypeError("data= is for formula fits; an array fit draws its own training data.")
    if fit.design is not None:
        frame = data if data is not None else _training_frame(fit, rep, covariates)
        post = fit.posterior_frame(frame) if data is not None else fit.posterior_frame()
        post = post[post["rep"] == rep] if "rep" in post else post
        y = fit.design.transform(frame).y if data is not None else fit._y[rep].detach().cpu().numpy()
        xdata = frame.loc[post.index, x]
    else:
        X = fit._X[rep].detach().cpu().numpy()
        frame = pd.DataFrame(X, columns=covariates)
        post = fit.posterior_frame()
        post = post[post["rep"] == rep] if "rep" in post else post
        y, xdata = fit._y[rep].detach().cpu().numpy(), frame[x]
    grid, levels = _grid(frame[x], n_grid)
    inputs, held = _grid_inputs(fit, frame, covariates, x, grid, levels, at)
    means = np.asarray(fit.expert_means(inputs)).reshape(fit.n_reps, len(grid), -1)[rep]
    gates = np.asarray(fit.gate_probs(inputs)).reshape(fit.n_reps, len(grid), -1)[rep]
    xpos = xdata.to_numpy(dtype=float) if levels is None else _level_positions(xdata, levels)
    with figstyle.style():
        fig, top, bottom, legend_ax = _axes(ax)
        word = _MEAN_WORD[fit.spec.response]
        handles = _draw_means(top, xpos, np.asarray(y, dtype=float), post["component"].to_numpy(), grid, means,
                              discrete=levels is not None, word=word)
        figstyle.finish_axes(top, title=f"Fitted expert {word}s and the data by MAP expert",
                             ylabel=f"{fit.response_name}" + ("" if word == "mean" else f" (expert {word}s)"),
                             raw=True)
        if bottom is not None:
            _draw_gates(bottom, grid, gates, discrete=levels is not None)
            figstyle.finish_axes(bottom, title=r"Gate weights $\tilde\pi_i(x)$", xlabel=x,
                                 ylabel="gate weight", raw=True)
        last = bottom if bottom is not None else top
        if bottom is None:
            figstyle.finish_axes(top, xlabel=x, raw=True)
        if levels is not None:
            last.set_xticks(grid, [str(v) for v in levels])
        title = "lines at " + ", ".join(f"{c} = {v:.3g}" if isinstance(v, (float, np.floating)) else f"{c} = {v}"
                                        for c, v in held.items()) if held else None
        ncol = min(means.shape[1], 4)  # one column per expert: its line above its points
        if legend_ax is not None:
            figstyle.legend_panel(legend_ax, *zip(*handles, strict=True), ncol=ncol, title=title)
        else:
            figstyle.legend_below(last, handles=[h for h, _ in handles], labels=[lab for _, lab in handles],
                                  ncol=ncol, title=title)
    return fig


def _level_positions(values: pd.Series, levels: np.ndarray) -> np.ndarray:
    """Positions of a categorical covariate's values, jittered by up to +-0.15 (fixed seed) to show overlap."""
    lookup = {v: i for i, v in enumerate(levels)}
    pos = values.map(lookup).to_numpy(dtype=float)
    return np.asarray(pos + np.random.default_rng(0).uniform(-0.15, 0.15, size=pos.shape))


def _draw_means(ax: Any, xpos: np.ndarray, y: np.ndarray, component: np.ndarray, grid: np.ndarray,
                means: np.ndarray, *, discrete: bool, word: str) -> list[tuple[Any, str]]:
    """The data by MAP expert and each expert's fitted mean; returns (handle, label) pairs for the legend."""
    handles = []
    k = means.shape[1]
    for i in range(k):
        colour = f"C{i}"
        mask = component == i
        pts = ax.scatter(xpos[mask], y[mask], s=9, color=colour, alpha=0.45, linewidths=0, zorder=2)
        (line,) = ax.plot(grid, means[:, i], color=colour, lw=2.2, marker="o" if discrete else None, zorder=3)
        line.set_gid(f"expert_mean_{i}")
        handles += [(line, f"expert {i}: fitted {word}"), (pts, f"expert {i}: data by MAP ({int(mask.sum())})")]
    return handles


def _draw_gates(ax: Any, grid: np.ndarray, gates: np.ndarray, *, discrete: bool) -> None:
    for i in range(gates.shape[1]):
        (line,) = ax.plot(grid, gates[:, i], color=f"C{i}", lw=2.0, marker="o" if discrete else None)
        line.set_gid(f"gate_{i}")
    ax.set_ylim(-0.03, 1.03)
