r"""One figure style for moestat's plots: legible at the docs' page width, labelled in mathtext, self-explaining.

Every plotting function of the package draws through this module, so that a figure read on its own says

* what it shows (a title on every panel);
* what is on its axes, in the papers' notation (:func:`label` maps known metric and column names, e.g. ``l2`` to
  $\|\hat f - f^*\|_{L^2(\mu)}$ and ``n`` to "sample size $n$");
* what its error bars are and at which level its intervals are (:func:`bars_text`, :func:`interval_text`, written
  on the figure by :func:`note` or :func:`caption`);
* which line is which, fitted lines included (legends outside the data: :func:`legend_below` for one panel,
  :func:`legend_panel` in a spare panel or the legend row of :func:`subplots` for a legend shared by several
  panels).

**Legibility rule.**  A figure of width $W$ inches shown at $P$ pixels (the docs' content column is about
$P = 750$) displays a font of $s$ points at $s\,P / (72\,W)$ pixels.  :func:`fontsize` scales the base sizes
(:data:`SIZES`, chosen for $W = 7.5$ in) by $\max(1, W / 7.5)$, so that the smallest text (legend and notes,
8.5 pt) is displayed at $8.5 \cdot 750 / (72 \cdot 7.5) \approx 11.8$ px or more whatever the figure's width;
:func:`smallest_font_px` measures it on a drawn figure.

Usage::

    from moestat import figstyle

    with figstyle.style():
        fig, ax = plt.subplots(figsize=(figstyle.PAGE_WIDTH_IN, 3.6))
        ...
        figstyle.finish_axes(ax, title="...", xlabel="n", ylabel="l2")
        figstyle.legend_below(ax)
        figstyle.note(ax, figstyle.bars_text("2sd", replicates=40))
        figstyle.save(fig, "out.png")
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DPI", "LABELS", "MIN_FONT_PX", "PAGE_WIDTH_IN", "PAGE_WIDTH_PX", "RC", "SHORT_NAMES", "SIZES", "bars_text",
    "caption", "finish_axes", "font_scale", "fontsize", "interval_text", "label", "legend_below", "legend_panel",
    "note", "save", "short_name", "smallest_font_px", "style", "subplots",
]

PAGE_WIDTH_PX = 750
"""Width (pixels) at which the docs show a figure: the content column of the mkdocs theme."""

PAGE_WIDTH_IN = 7.5
"""Figure width (inches) for which :data:`SIZES` are chosen; wider figures get proportionally larger fonts."""

DPI = 150
"""Resolution of saved figures (a 7.5 in figure is 1125 px wide, downscaled by the browser: sharp text)."""

MIN_FONT_PX = 11.0
"""Smallest displayed font size (pixels at :data:`PAGE_WIDTH_PX`) that the tests require of every figure."""

SIZES: dict[str, float] = {"title": 10.5, "label": 10.0, "tick": 9.0, "legend": 8.5, "note": 8.5}
"""Font sizes (points) of each role at :data:`PAGE_WIDTH_IN`; :func:`fontsize` scales them to the figure."""

RC: dict[str, Any] = {
    "font.size": SIZES["label"],
    "axes.titlesize": SIZES["title"],
    "axes.labelsize": SIZES["label"],
    "xtick.labelsize": SIZES["tick"],
    "ytick.labelsize": SIZES["tick"],
    "legend.fontsize": SIZES["legend"],
    "legend.title_fontsize": SIZES["legend"],
    "legend.frameon": False,
    "figure.titlesize": SIZES["title"] + 1.5,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.5,
    "mathtext.fontset": "dejavusans",
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.08,
}
"""rcParams of :func:`style` (matplotlib names)."""

_NORM = r"\|\hat f - f^*\|"
LABELS: dict[str, str] = {
    "n": r"sample size $n$",
    "n_train": r"training samples $N$",
    "l2": r"$\|\hat f - f^*\|_{L^2(\mu)}$",
    "sup": r"$\|\hat f - f^*\|_{\infty}$",
    "loss": r"Voronoi loss $\mathcal{D}(\hat G, G^*)$",
    "voronoi": r"Voronoi loss $\mathcal{D}(\hat G, G^*)$",
    "D1": r"$\mathcal{D}_1(\hat G, G^*)$",
    "D2": r"$\mathcal{D}_2(\hat G, G^*)$",
    "D3": r"$\mathcal{D}_3(\hat G, \bar G)$",
    "param": r"$\inf_{\tilde G \in \mathcal{E}_k} d(\hat G, \tilde G)$",
    "over_param": r"$d_{\mathrm{over}}(\hat G, \mathcal{E}_k)$",
    "exact_param": r"$d_{\mathrm{exact}}(\hat G, \mathcal{E}_k)$",
    "over_sup": r"$\sup_x \tilde\pi |h - \tilde h|$ (over-specified atoms)",
    "exact_sup": r"$\sup_x \tilde\pi |h - \tilde h|$ (exact atoms)",
    "over_l2": r"$(\mathbb{E}_\mu[\tilde\pi (h - \tilde h)^2])^{1/2}$ (over-specified)",
    "exact_l2": r"$(\mathbb{E}_\mu[\tilde\pi (h - \tilde h)^2])^{1/2}$ (exact)",
    "exponent": r"exponent $\alpha$",
    "n_star": r"$n^*$",
    "accuracy": "test accuracy",
    "gate_l2": r"$\max_i \|\hat w_i - w_i^*\|_2$",
    "reg_angle": r"$\max_i \angle(\hat a_i, a_i^*)$ (rad)",
    "E_reg": r"$E_{\mathrm{reg}} = \max_i (1 - |\cos \angle(\hat a_i, a_i^*)|)$",
    "sigma": r"noise level $\sigma$",
    "objective": r"least-squares objective $\hat L_n(\hat G)$",
}
"""Mathtext axis labels of known metric and column names (:func:`label` adds the ``_best``/``_alt`` suffixes and
the ``err_<over|exact>_<block>`` parameter errors of :func:`moestat.cells.parameter_error_metric`)."""

SHORT_NAMES: dict[str, str] = {
    "l2": "regression-function error",
    "loss": "Voronoi loss",
    "voronoi": "Voronoi loss",
    "D1": "Voronoi loss D1",
    "D2": "Voronoi loss D2",
    "D3": "Voronoi loss D3",
    "param": "representation error",
    "over_param": "over-specified error",
    "exact_param": "exact-atom error",
    "gate_l2": "gate error",
    "reg_angle": "regressor angle",
}
"""Plain-text names for titles (titles stay short; the axis label carries the formula)."""

_SUFFIXES = {"_best": "lowest-objective fit", "_alt": "second solver"}
_BLOCKS = {"gate_bias": r"|\hat\beta_{0i} - \beta_{0j}^*|", "gate_weight": r"\|\hat\beta_{1i} - \beta_{1j}^*\|",
           "expert_weight": r"\|\hat a_i - a_j^*\|", "expert_bias": r"|\hat b_i - b_j^*|",
           "expert": r"\|\hat\eta_i - \eta_j^*\|",
           "weight_sum": r"|\sum_{i \in A_j} \exp\hat\beta_{0i} - \exp\beta_{0j}^*|"}
_ERR = re.compile(r"^err_(over|exact)_(\w+)$")


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string (a column or metric name), got {value!r} ({type(value).__name__}).")
    return value


def label(name: str, *, suffix_note: bool = True) -> str:
    r"""Axis label of a metric or column ``name``: its mathtext form if known, else ``name`` itself.

    Known names are the keys of :data:`LABELS`; ``name + "_best"`` / ``"_alt"`` (the lowest-objective fit and the
    second solver of :func:`moestat.lowest_objective`) get the base label followed by that note (unless
    ``suffix_note=False``), and ``err_<over|exact>_<block>`` (nguyen2024 Thm 2 parameter errors) the largest error
    of that block over the Voronoi cells $A_j$ of that kind, e.g. ``err_over_expert`` is
    "$\max_{j, i \in A_j} \|\hat\eta_i - \eta_j^*\|$ (over-specified atoms)".

    Examples
    --------
    >>> label("l2")
    '$\\|\\hat f - f^*\\|_{L^2(\\mu)}$'
    >>> label("l2_best")
    '$\\|\\hat f - f^*\\|_{L^2(\\mu)}$, lowest-objective fit'
    >>> label("my_metric")
    'my_metric'
    """
    _check_str("name", name)
    if name in LABELS:
        return LABELS[name]
    for suffix, what in _SUFFIXES.items():
        base = name.removesuffix(suffix)
        if base != name and (base in LABELS or _ERR.match(base)):
            return label(base) + (f", {what}" if suffix_note else "")
    m = _ERR.match(name)
    if m and m.group(2) in _BLOCKS:
        kind = "over-specified" if m.group(1) == "over" else "exact"
        over = "j" if m.group(2) == "weight_sum" else "{j, i \\in A_j}"
        return rf"$\max_{over} {_BLOCKS[m.group(2)]}$ ({kind} atoms)"
    return name


def short_name(name: str) -> str:
    """Plain-text name of ``name`` for titles (:data:`SHORT_NAMES`, ``_best``/``_alt`` removed), else ``name``."""
    _check_str("name", name)
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    return SHORT_NAMES.get(name, name)


@contextlib.contextmanager
def style() -> Iterator[None]:
    """Context manager applying :data:`RC` (``matplotlib.rc_context``); figures made inside it keep the style."""
    import matplotlib

    with matplotlib.rc_context(RC):  # type: ignore[arg-type]  # keys are checked by rc_context at run time
        yield


def font_scale(fig: Any) -> float:
    r"""$\max(1, W / 7.5)$ for a figure ``W`` inches wide: the factor that keeps text legible at the page width."""
    width = float(fig.get_size_inches()[0])
    return max(1.0, width / PAGE_WIDTH_IN)


def fontsize(fig: Any, role: str) -> float:
    """Font size (points) of ``role`` (a key of :data:`SIZES`) in ``fig``, scaled by :func:`font_scale`."""
    if role not in SIZES:
        raise ValueError(f"role={role!r} is not a font role; use one of {sorted(SIZES)}.")
    return SIZES[role] * font_scale(fig)


def finish_axes(ax: Any, *, title: str | None = None, xlabel: str | None = None, ylabel: str | None = None,
                raw: bool = False) -> Any:
    """Set the title and the axis labels (through :func:`label` unless ``raw``) with the style's sizes.

    Tick labels get the tick size explicitly, so the figure keeps its sizes when drawn outside :func:`style`.
    ``None`` leaves a text as it is.  Returns ``ax``.
    """
    fig = ax.figure
    if title is not None:
        ax.set_title(title, fontsize=fontsize(fig, "title"))
    if xlabel is not None:
        ax.set_xlabel(xlabel if raw else label(xlabel), fontsize=fontsize(fig, "label"))
    if ylabel is not None:
        ax.set_ylabel(ylabel if raw else label(ylabel), fontsize=fontsize(fig, "label"))
    ax.tick_params(labelsize=fontsize(fig, "tick"), which="both")
    ax.grid(True, which="major", alpha=0.3, lw=0.5)
    return ax


def bars_text(kind: str, replicates: int | Sequence[int] | None = None, *, unit: str = "replicates",
              centre: str | None = None) -> str:
    r"""What a figure's error bars are, in words, for :func:`note` / :func:`caption`.

    ``kind``: ``"2sd_log"`` (centre $\times/\div\ e^{2 s}$, $s$ the SD of $\log y$: the geometric $\pm 2$ SD),
    ``"2sd"`` (mean $\pm 2$ SD), ``"1sd"``, ``"1se"`` (mean $\pm$ 1 standard error), ``"range"`` (min to max) or
    ``"none"``.  ``replicates``: the count behind each bar (an int, or the counts, reported as a range if they
    differ); ``unit`` names what is counted; ``centre`` names the plotted centre (e.g. "geometric mean").
    """
    texts = {"2sd_log": r"bars: $\times/\div\,e^{2s}$, $s$ = SD of $\log y$",
             "2sd": r"bars: $\pm$2 SD", "1sd": r"bars: $\pm$1 SD", "1se": r"bars: $\pm$1 standard error of the mean",
             "range": "bars: min to max", "none": "no error bars"}
    if kind not in texts:
        raise ValueError(f"kind={kind!r} is not a kind of error bar; use one of {sorted(texts)}.")
    out = texts[kind]
    count = _count_text(replicates)
    if count and kind != "none":
        out += f" over {count} {unit}"
    if centre:
        out = f"markers: {centre}; " + out
    return out


def _count_text(replicates: int | Sequence[int] | None) -> str:
    if replicates is None:
        return ""
    counts = [int(replicates)] if isinstance(replicates, int | float) else [int(r) for r in replicates]
    if not counts:
        return ""
    lo, hi = min(counts), max(counts)
    return f"R = {lo}" if lo == hi else f"R = {lo}-{hi}"


_METHODS = {"random_effects": "random effects, Knapp-Hartung",
            "unit_bootstrap": "unit bootstrap", "cluster_bootstrap": "cluster bootstrap",
            "robust": "cluster-robust SE", "bootstrap": "bootstrap"}


def interval_text(confidence_level: float, *, what: str = "exponent", method: str | None = None) -> str:
    """``"[ ]: 95% CI of the exponent (unit bootstrap)"``: the level and kind of the intervals in a legend."""
    if isinstance(confidence_level, bool) or not isinstance(confidence_level, int | float):
        raise TypeError(f"confidence_level must be a number in (0, 1), got {confidence_level!r}.")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1) (e.g. 0.95), got {confidence_level}.")
    pct = f"{100 * confidence_level:.3g}%"
    out = f"[ ]: {pct} CI of the {what}"
    if method:
        out += f" ({_METHODS.get(method, method.replace('_', ' '))})"
    return out


def _visible_len(token: str) -> int:
    """Characters a token shows: a ``$...$`` token counts each TeX command as one glyph, braces and ^/_ as none."""
    if not (token.startswith("$") and token.endswith("$")):
        return len(token)
    body = re.sub(r"\\[A-Za-z]+", "x", token[1:-1])
    return max(1, len(re.sub(r"[{}^_$\\,]", "", body)))


def _wrap(text: str, width_in: float, size_pt: float) -> str:
    """Wrap ``text`` to lines of about ``width_in`` inches at ``size_pt`` (DejaVu Sans averages about 0.55 em per
    character); a ``$...$`` span is never broken and counts its visible glyphs."""
    chars = max(24, int(width_in * 72 / (0.55 * size_pt)))
    lines: list[str] = []
    for paragraph in text.split("\n"):
        tokens = re.findall(r"\$[^$]*\$\S*|\S+", paragraph)
        line, used = "", 0
        for tok in tokens:
            n = _visible_len(tok)
            if line and used + 1 + n > chars:
                lines.append(line)
                line, used = tok, n
            else:
                line, used = (f"{line} {tok}", used + 1 + n) if line else (tok, n)
        lines.append(line)
    return "\n".join(lines)


_AFTER_LEGENDS = 6
"""zorder of notes and captions: drawn after legends (zorder 5), so that they are placed at the legends' current
positions, never at those of the previous draw."""


def note(ax: Any, text: str, *, below: Any = None) -> Any:
    """Write ``text`` (small, wrapped to the axes' width) under the axes: under ``below`` (an artist, e.g. the
    legend of :func:`legend_below`) if given, else under the x-axis label.  Returns the annotation."""
    _check_str("text", text)
    fig = ax.figure
    size = fontsize(fig, "note")
    width = ax.get_position().width * fig.get_size_inches()[0]
    anchor = below if below is not None else ax.xaxis.label
    return ax.annotate(_wrap(text, width, size), xy=(0.5, 0.0), xycoords=anchor, xytext=(0, -4),
                       textcoords="offset points", ha="center", va="top", fontsize=size, color="0.25",
                       annotation_clip=False, zorder=_AFTER_LEGENDS)


def _below_everything(fig: Any) -> Any:
    """A callable giving, at draw time, the union of the visible axes' tight boxes and the figure legends."""
    from matplotlib.transforms import Bbox

    def bbox(renderer: Any) -> Any:
        boxes = [a.get_tightbbox(renderer) for a in fig.axes if a.get_visible()]
        boxes += [leg.get_window_extent(renderer) for leg in fig.legends]
        boxes = [b for b in boxes if b is not None and b.width > 0]
        return Bbox.union(boxes) if boxes else fig.bbox

    return bbox


def caption(fig: Any, text: str) -> Any:
    """Write ``text`` under everything drawn in the figure (its axes, their legends and notes, the figure's
    legends), small and wrapped to the figure's width; saved with ``bbox_inches="tight"`` (:func:`save`) it is
    part of the image.  Returns the annotation."""
    from matplotlib.text import Annotation

    _check_str("text", text)
    size = fontsize(fig, "note")
    ann = Annotation(_wrap(text, fig.get_size_inches()[0] * 0.95, size), xy=(0.5, 0.0),
                     xycoords=_below_everything(fig), xytext=(0, -6), textcoords="offset points", ha="center",
                     va="top", fontsize=size, color="0.25", annotation_clip=False, zorder=_AFTER_LEGENDS)
    fig.add_artist(ann)
    return ann


def _below_axis_pts(ax: Any) -> float:
    """Points from the bottom of the axes to the bottom of its x tick labels and x label (measured with the
    figure's renderer; estimated from the font sizes where the canvas has none), plus a 4 pt gap."""
    fig = ax.figure
    try:
        renderer = fig.canvas.get_renderer()
        axis_box = ax.xaxis.get_tightbbox(renderer)
        depth_px = ax.get_window_extent(renderer).y0 - axis_box.y0 if axis_box is not None else 0.0
        return max(0.0, float(depth_px)) * 72.0 / float(fig.dpi) + 4.0
    except AttributeError:  # a canvas without a renderer: tick labels about 1.5 em (mathtext), label 1.4 em
        tick, lab = fontsize(fig, "tick"), fontsize(fig, "label")
        return 7.0 + 1.5 * tick + (4.0 + 1.4 * lab if ax.get_xlabel() else 0.0) + 4.0


def legend_below(ax: Any, *, ncol: int = 1, handles: Sequence[Any] | None = None,
                 labels: Sequence[str] | None = None, **kwargs: Any) -> Any:
    """The axes' legend centred under its x label, outside the data; ``ncol`` columns.  Returns the Legend (None
    when nothing is labelled).  Set the scales, limits and x label first: the legend is placed below the tick
    labels and the label as they are then (a fixed distance in points, kept when a layout engine resizes the
    axes)."""
    import matplotlib.transforms as mtransforms

    fig = ax.figure
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    dy = _below_axis_pts(ax) / 72.0
    shift = mtransforms.ScaledTranslation(0.0, -dy, fig.dpi_scale_trans)
    options = {"frameon": False, "borderaxespad": 0.0, "handlelength": 2.2, **kwargs}
    return ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                     bbox_transform=ax.transAxes + shift, ncol=ncol, fontsize=fontsize(fig, "legend"), **options)


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None,
             legend_height: float = 0.0, sharex: bool = False, sharey: bool = False,
             height_ratios: Sequence[float] | None = None) -> tuple[Any, Any, Any]:
    """A constrained-layout figure of ``nrows`` x ``ncols`` panels (default width :data:`PAGE_WIDTH_IN`) and, when
    ``legend_height`` (inches) is positive, a full-width row under them for the figure's shared legend
    (:func:`legend_panel`).  Returns ``(fig, axes, legend_ax)``: ``axes`` a 2-d array, ``legend_ax`` None without
    a legend row.

    The shared legend lives in an axes, not in ``fig.legend``: ``bbox_inches="tight"`` keeps every axes where the
    layout put it but re-anchors figure legends to the cropped edge, where they would cover a caption or title.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    for name, value in (("nrows", nrows), ("ncols", ncols)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    width, height = figsize or (PAGE_WIDTH_IN, 3.6 * nrows + legend_height)
    ratios = list(height_ratios) if height_ratios is not None else [1.0] * nrows
    if len(ratios) != nrows:
        raise ValueError(f"height_ratios has {len(ratios)} entries; give one per row ({nrows}).")
    fig = plt.figure(figsize=(width, height), layout="constrained")
    if legend_height > 0:
        ratios.append(sum(ratios) * legend_height / max(height - legend_height, 1e-9))
    grid = fig.add_gridspec(len(ratios), ncols, height_ratios=ratios)
    axes = np.empty((nrows, ncols), dtype=object)
    for i in range(nrows):
        for j in range(ncols):
            axes[i, j] = fig.add_subplot(grid[i, j], sharex=axes[0, 0] if sharex and (i or j) else None,
                                         sharey=axes[0, 0] if sharey and (i or j) else None)
    for ax in axes.flat:
        if sharex and ax.get_subplotspec().rowspan.stop < nrows:
            ax.tick_params(labelbottom=False, which="both")
        if sharey and ax.get_subplotspec().colspan.start > 0:
            ax.tick_params(labelleft=False, which="both")
    legend_ax = fig.add_subplot(grid[nrows, :]) if legend_height > 0 else None
    if legend_ax is not None:
        legend_ax.axis("off")
    return fig, axes, legend_ax


def legend_panel(ax: Any, handles: Sequence[Any], labels: Sequence[str], *, ncol: int = 1, **kwargs: Any) -> Any:
    """Turn an unused panel ``ax`` (or the legend row of :func:`subplots`) into the figure's shared legend, centred,
    ``ncol`` columns: no data there to hide."""
    ax.axis("off")
    return ax.legend(handles, labels, loc="center", ncol=ncol, fontsize=fontsize(ax.figure, "legend"), frameon=False,
                     borderaxespad=0.0, **kwargs)


def save(fig: Any, path: str | Path, *, dpi: int = DPI) -> None:
    """Save ``fig`` at ``dpi`` with a tight bounding box (captions and outside legends included) and close it.

    Figures whose shared legend is a ``fig.legend`` may lose their caption under it (see :func:`subplots`)."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.08)
    plt.close(fig)


def smallest_font_px(fig: Any, page_px: float = PAGE_WIDTH_PX) -> float:
    r"""Smallest displayed font (pixels) of the figure's visible texts when its saved (tight) image is shown
    ``page_px`` pixels wide: $\min_t s_t \cdot P / (72\, W_{\mathrm{tight}})$ over text artists $t$ of size
    $s_t$ points, $W_{\mathrm{tight}}$ the width of the tight bounding box in inches (the saved width)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width_in = fig.get_tightbbox(renderer).width
    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and t.get_window_extent(renderer).width > 0]
    if not sizes:
        raise ValueError("smallest_font_px: the figure has no visible text.")
    return float(min(sizes)) * page_px / (72.0 * float(width_in))
