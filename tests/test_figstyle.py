"""Tests of moestat.figstyle: labels, texts, font scaling, placement of legends, notes and captions, saving."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.mathtext import MathTextParser

from moestat import figstyle as fs


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ------------------------------------------------------------------------------------------- labels


@pytest.mark.parametrize("name", ["l2", "loss", "voronoi", "D1", "D2", "D3", "param", "over_param", "exact_param",
                                  "n", "err_over_expert", "err_exact_gate_weight", "err_over_weight_sum",
                                  "l2_best", "exact_param_alt"])
def test_known_metrics_get_mathtext_that_renders(name):
    """Every known name maps to a label with a $...$ span, and each span is valid mathtext (the parser raises on
    a bad command, an unbalanced brace or a double subscript)."""
    text = fs.label(name)
    spans = re.findall(r"\$[^$]+\$", text)
    assert spans, f"{name!r} -> {text!r} has no mathtext"
    parser = MathTextParser("path")
    for span in spans:
        parser.parse(span, dpi=72)


def test_label_table_values_all_render():
    parser = MathTextParser("path")
    for name, text in fs.LABELS.items():
        for span in re.findall(r"\$[^$]+\$", text):
            parser.parse(span, dpi=72)
        assert text, name


def test_label_suffixes_and_unknown_names():
    assert fs.label("l2") == r"$\|\hat f - f^*\|_{L^2(\mu)}$"
    assert fs.label("l2_best") == fs.label("l2") + ", lowest-objective fit"
    assert fs.label("l2_alt") == fs.label("l2") + ", second solver"
    assert fs.label("l2_best", suffix_note=False) == fs.label("l2")
    assert fs.label("n") == "sample size $n$"
    assert fs.label("my_metric") == "my_metric"  # unknown: unchanged
    assert fs.label("my_metric_best") == "my_metric_best"  # a suffix alone does not make a name known
    assert "over-specified" in fs.label("err_over_expert") and r"\eta" in fs.label("err_over_expert")
    assert fs.short_name("l2_best") == "regression-function error"
    assert fs.short_name("y") == "y"
    with pytest.raises(TypeError, match="name must be a string"):
        fs.label(3)


# ------------------------------------------------------------------------------------------- texts


def test_bars_text_says_what_the_bars_are():
    assert fs.bars_text("2sd", 40) == r"bars: $\pm$2 SD over R = 40 replicates"
    assert fs.bars_text("1se", [20, 20, 20], unit="runs") == r"bars: $\pm$1 standard error of the mean over R = 20 runs"
    assert fs.bars_text("range", [3, 5, 4]).endswith("min to max over R = 3-5 replicates")
    assert "SD of" in fs.bars_text("2sd_log") and r"e^{2s}" in fs.bars_text("2sd_log")
    assert fs.bars_text("none", 10) == "no error bars"  # no count for bars that are not drawn
    assert fs.bars_text("1sd", centre="median").startswith("markers: median; bars:")
    with pytest.raises(ValueError, match="kind='3sd'"):
        fs.bars_text("3sd")


def test_interval_text_states_level_and_method():
    assert fs.interval_text(0.95) == "[ ]: 95% CI of the exponent"
    assert fs.interval_text(0.9, method="unit_bootstrap") == "[ ]: 90% CI of the exponent (unit bootstrap)"
    assert fs.interval_text(0.995, what="n*", method="my_method") == "[ ]: 99.5% CI of the n* (my method)"
    with pytest.raises(ValueError, match="confidence_level must be in"):
        fs.interval_text(95)
    with pytest.raises(TypeError, match="confidence_level must be a number"):
        fs.interval_text("0.95")


def test_wrap_keeps_mathtext_whole_and_lines_short():
    text = ("markers: geometric mean; " + fs.bars_text("2sd_log", 40) + "; lines: fitted $C n^{-\\alpha}$; "
            + fs.interval_text(0.95, method="random_effects")) * 2
    out = fs._wrap(text, 3.0, 8.5)
    limit = int(3.0 * 72 / (0.55 * 8.5))

    def glyphs(line: str) -> int:  # a TeX command is one glyph; braces, ^, _, \, and $ show nothing
        return len(re.sub(r"[{}^_$\\,]", "", re.sub(r"\\[A-Za-z]+", "x", line)))

    for line in out.split("\n"):
        assert line.count("$") % 2 == 0, line  # no $...$ span is cut
        assert glyphs(line) <= limit, line
    assert out.replace("\n", " ") == text.strip()  # only spaces became line breaks


# ------------------------------------------------------------------------------------------- sizes


def test_font_sizes_scale_with_figure_width():
    """At the page width and below the base sizes hold; a figure twice as wide gets twice the points, so that
    its text is displayed at the same pixel size when shown PAGE_WIDTH_PX wide."""
    narrow, page, wide = (plt.figure(figsize=(w, 3)) for w in (5.0, fs.PAGE_WIDTH_IN, 2 * fs.PAGE_WIDTH_IN))
    for role, size in fs.SIZES.items():
        assert fs.fontsize(narrow, role) == size
        assert fs.fontsize(page, role) == size
        assert fs.fontsize(wide, role) == pytest.approx(2 * size)
    with pytest.raises(ValueError, match="role='huge'"):
        fs.fontsize(page, "huge")


def test_smallest_font_px_matches_the_saved_image(tmp_path):
    """Independent check: the displayed size of a 10 pt text is 10 * 750 / (72 * W), W the width (inches) of
    the saved tight image, read back from the PNG's pixel width at the saving dpi."""
    fig, ax = plt.subplots(figsize=(6.0, 3.0))
    ax.plot([1, 2], [1, 2])
    ax.set_title("title", fontsize=10)
    for t in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
        t.set_fontsize(12)
    ax.xaxis.label.set_fontsize(12)
    fig.savefig(tmp_path / "f.png", dpi=100, bbox_inches="tight", pad_inches=0)
    width_in = mpimg.imread(tmp_path / "f.png").shape[1] / 100
    expected = 10 * fs.PAGE_WIDTH_PX / (72 * width_in)
    # the PNG width is rounded to whole pixels: 1 px in ~600 -> about 0.2% on the ratio
    assert fs.smallest_font_px(fig) == pytest.approx(expected, rel=5e-3)


def test_style_context_sets_and_restores_rcparams():
    before = dict(matplotlib.rcParams)
    with fs.style():
        for key, value in fs.RC.items():
            assert matplotlib.rcParams[key] == value, key
    assert matplotlib.rcParams["legend.fontsize"] == before["legend.fontsize"]
    assert matplotlib.rcParams["savefig.dpi"] == before["savefig.dpi"]


# ------------------------------------------------------------------------------------------- placement


def _extent(artist, renderer):
    return artist.get_window_extent(renderer)


def test_legend_below_and_note_sit_under_the_axis_label():
    """legend_below puts the legend under the x tick labels and label (no overlap with the data area), note under
    the legend; finish_axes sets the mathtext label and explicit sizes."""
    with fs.style():
        fig, ax = plt.subplots(figsize=(fs.PAGE_WIDTH_IN, 4), layout="constrained")
        ax.plot([1e2, 1e4], [1e-1, 1e-3], label="a line")
        ax.plot([1e2, 1e4], [1e-2, 1e-3], label="another line")
        ax.set(xscale="log", yscale="log")
        fs.finish_axes(ax, title="T", xlabel="n", ylabel="l2")
        leg = fs.legend_below(ax, ncol=2)
        note = fs.note(ax, "bars: something", below=leg)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    axes_box, label_box = ax.get_window_extent(r), ax.xaxis.label.get_window_extent(r)
    leg_box, note_box = _extent(leg, r), _extent(note, r)
    ticks = [t.get_window_extent(r) for t in ax.get_xticklabels() if t.get_text()]
    assert leg_box.y1 <= label_box.y0 + 0.5  # below the x label (half a pixel of rounding)
    assert leg_box.y1 <= min(b.y0 for b in ticks) and leg_box.y1 < axes_box.y0
    assert note_box.y1 <= leg_box.y0 + 0.5
    assert ax.get_ylabel() == fs.label("l2") and ax.get_xlabel() == "sample size $n$"
    assert ax.xaxis.get_major_ticks()[0].label1.get_fontsize() == fs.SIZES["tick"]


def test_legend_below_without_labels_returns_none():
    _, ax = plt.subplots()
    ax.plot([1, 2], [1, 2])
    assert fs.legend_below(ax) is None


def _figure(legend_row: bool, caption: str | None):
    with fs.style():
        fig, axes, legend_ax = fs.subplots(1, 2, legend_height=0.4 if legend_row else 0.0)
        for ax in axes.flat:
            ax.plot([0, 1], [0, 1], label="line")
            fs.finish_axes(ax, title="t", xlabel="x", ylabel="y", raw=True)
        if legend_row:
            fs.legend_panel(legend_ax, *axes[0, 0].get_legend_handles_labels())
        cap = fs.caption(fig, caption) if caption else None
    return fig, cap


@pytest.mark.parametrize("legend_row", [False, True])
def test_caption_is_under_everything_and_survives_a_tight_save(tmp_path, legend_row):
    """The caption is drawn under the axes and the legend row, and the tight save keeps it whole: the saved image
    is taller than the same figure's without caption by the caption's height (3 lines of 8.5 pt at 150 dpi,
    about 1.2 line spacing), which fails if the save crops the caption off or draws it over the panels."""
    text = "CAPTION " * 60
    fig, cap = _figure(legend_row, text)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    lowest = min(a.get_tightbbox(r).y0 for a in fig.axes if a.get_visible())
    assert cap.get_window_extent(r).y1 <= lowest + 0.5
    n_lines = cap.get_text().count("\n") + 1
    fs.save(fig, tmp_path / "with.png")
    assert not plt.fignum_exists(fig.number)  # save closes the figure
    fig, _ = _figure(legend_row, None)
    fs.save(fig, tmp_path / "without.png")
    extra_px = mpimg.imread(tmp_path / "with.png").shape[0] - mpimg.imread(tmp_path / "without.png").shape[0]
    line_px = fs.SIZES["note"] / 72 * fs.DPI
    # lower bound: the glyph height of every line (~1 em each); upper: 1.5 em per line plus the 6 pt offset
    assert n_lines * line_px <= extra_px <= n_lines * 1.5 * line_px + 6 / 72 * fs.DPI + 2


def test_subplots_layout_and_errors():
    fig, axes, legend_ax = fs.subplots(2, 3, sharey=True, legend_height=0.5)
    assert axes.shape == (2, 3) and legend_ax is not None and not legend_ax.axison
    assert all(a.get_shared_y_axes().joined(axes[0, 0], a) for a in axes.flat)
    assert fig.get_size_inches()[0] == fs.PAGE_WIDTH_IN
    _, axes, legend_ax = fs.subplots(1, 1)
    assert axes.shape == (1, 1) and legend_ax is None
    with pytest.raises(ValueError, match="nrows must be an integer >= 1"):
        fs.subplots(0, 1)
    with pytest.raises(ValueError, match="height_ratios has 1 entries"):
        fs.subplots(2, 1, height_ratios=[1.0])


def test_legend_panel_turns_a_spare_panel_into_the_legend():
    _, axes = plt.subplots(1, 2)
    (line,) = axes[0].plot([0, 1], [0, 1], label="a")
    leg = fs.legend_panel(axes[1], [line], ["a"], title="hue")
    assert not axes[1].axison and leg.get_title().get_text() == "hue"
    assert [t.get_text() for t in leg.get_texts()] == ["a"]
    assert np.isclose(leg.get_texts()[0].get_fontsize(), fs.SIZES["legend"])
