"""Figures of moestat.rates.plots in the moestat.figstyle style: titles, mathtext labels, a legend entry per fitted
line with its exponent and interval, and the meaning of the error bars written on the figure, checked against what
is drawn (bar ends and fitted lines recomputed from the data and the fit tables)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.lines import Line2D

import moestat as ms
from moestat import figstyle as fs
from moestat.rates.plots import plot_invariance, plot_unit_profiles

NS = np.geomspace(1e3, 1e5, 6).round()
REPS = 8


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    """gate x n x rep with a D1 column (Voronoi loss, known label), exponents 0.5 and 0.25."""
    rng = np.random.default_rng(1)
    rows = [{"gate": gate, "n": n, "rep": r, "D1": 3.0 * n ** -alpha * np.exp(0.3 * rng.standard_normal())}
            for gate, alpha in (("sigmoid", 0.5), ("softmax", 0.25)) for n in NS for r in range(REPS)]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def units_frame() -> pd.DataFrame:
    """expert x gate x truth x n with l2 (and its second-solver copy l2_alt), five truths each."""
    rng = np.random.default_rng(2)
    rows = [{"expert": e, "gate": g, "truth_seed": s, "n": n,
             "l2": 2 * n ** -0.5 * np.exp(rng.normal(0, 0.2)), "l2_alt": 2 * n ** -0.5 * np.exp(rng.normal(0, 0.2)),
             "exact_param": n ** -0.4 * np.exp(rng.normal(0, 0.3)),
             "exact_param_alt": n ** -0.4 * np.exp(rng.normal(0, 0.3))}
            for e in ("gelu", "relu") for g in ("sigmoid", "softmax") for s in range(5) for n in NS]
    return pd.DataFrame(rows).assign(l2_best=lambda f: f["l2"], exact_param_best=lambda f: f["exact_param"])


def _texts(fig) -> str:
    """Every text drawn on the figure (titles, labels, notes, captions, legends), joined."""
    from matplotlib.text import Text

    return " | ".join(t.get_text().replace("\n", " ") for t in fig.findobj(Text) if t.get_visible() and t.get_text())


def _fit_lines(ax) -> list[Line2D]:
    return [ln for ln in ax.get_lines() if ln.get_label().split(": ")[-1].startswith("fit ")]


# ------------------------------------------------------------------------------------------- plot_rate


def test_plot_rate_labels_legend_and_note(frame):
    res = ms.fit_rate(frame, "D1", by="gate", model=["power", "inverse_log"], n_resamples=200)
    ax = res.plot()
    fig = ax.figure
    assert ax.get_title() == "Voronoi loss D1 against sample size"
    assert ax.get_ylabel() == r"$\mathcal{D}_1(\hat G, G^*)$" and ax.get_xlabel() == "sample size $n$"
    # one legend entry per fitted line, each with the exponent and interval of its row of the fit table
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    fits = _fit_lines(ax)
    assert len(fits) == len(res.details) == 4
    for _, row in res.details.iterrows():
        base = {"power": "n", "inverse_log": "(log n)"}[row["model"]]
        text = f"{row['gate']}: fit {base}^-{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
        assert text in legend
    # the note says what the markers and bars are, over how many replicates, and the intervals' level and method
    note = _texts(fig)
    assert "markers: geometric mean" in note and "SD of $\\log y$" in note
    assert f"R = {REPS} replicates" in note
    assert "95% CI of the exponent" in note and "random effects, Knapp-Hartung" in note
    assert fs.smallest_font_px(fig) >= fs.MIN_FONT_PX


def test_plot_rate_bars_are_what_the_note_says(frame):
    """Geometric: centre exp(mean log y), bars centre x/÷ exp(2 sd(log y)); agg="mean": mean -/+ 2 sd; range:
    min to max -- recomputed from the frame and compared with the drawn error-bar segments."""
    sub = frame[frame["gate"] == "sigmoid"]
    logs = sub.groupby("n")["D1"].apply(lambda v: np.log(v.to_numpy()))
    centre = np.exp([v.mean() for v in logs])
    sd = np.array([v.std(ddof=1) for v in logs])
    mean, sd_y = sub.groupby("n")["D1"].mean().to_numpy(), sub.groupby("n")["D1"].std().to_numpy()
    cases = {
        ("geo", None, "2sd"): (centre * np.exp(-2 * sd), centre * np.exp(2 * sd), "SD of $\\log y$"),
        # the lower end is kept positive (at 1e-3 of the mean) for the log axis
        ("mean", "mean", "2sd"): (np.maximum(mean - 2 * sd_y, 1e-3 * mean), mean + 2 * sd_y,
                                  r"$\pm$2 SD over R = 8 replicates (lower end kept positive)"),
        ("range", None, "range"): (sub.groupby("n")["D1"].min(), sub.groupby("n")["D1"].max(), "min to max"),
    }
    for (_, agg, spread), (low, high, words) in cases.items():
        ax = ms.fit_rate(sub, "D1", agg=agg, n_resamples=200).plot(spread=spread)
        segments = ax.containers[0].lines[2][0].get_segments()  # the errorbar's vertical bar segments
        ends = np.array([[s[0][1], s[1][1]] for s in segments])
        np.testing.assert_allclose(ends[:, 0], np.asarray(low), rtol=1e-10)
        np.testing.assert_allclose(ends[:, 1], np.asarray(high), rtol=1e-10)
        assert words in _texts(ax.figure)
        plt.close(ax.figure)


def test_plot_rate_confidence_level_and_no_note(frame):
    sub = frame[frame["gate"] == "softmax"]
    ax = ms.fit_rate(sub, "D1", confidence_level=0.9, n_resamples=200).plot(title="my title")
    assert ax.get_title() == "my title" and "90% CI of the exponent" in _texts(ax.figure)
    assert len(_fit_lines(ax)) == 1 and _fit_lines(ax)[0].get_color() == "red"  # the papers' single red line
    ax = ms.fit_rate(sub, "D1", n_resamples=200).plot(note=False, spread="none")
    assert "bars" not in _texts(ax.figure) and not ax.texts


def test_window_and_sample_complexity_plots(frame):
    ws = ms.window_sensitivity(frame[frame["gate"] == "sigmoid"], "D1", n_resamples=200)
    ax = ws.plot()
    assert ax.get_title() and r"$\alpha$" in ax.get_ylabel()
    assert "bars: 95% CI of the exponent refitted without the dropped n values" in _texts(ax.figure)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["drop smallest n", "drop largest n"]
    assert fs.smallest_font_px(ax.figure) >= fs.MIN_FONT_PX
    rng = np.random.default_rng(0)
    acc = pd.DataFrame([{"l": l_, "n": n, "rep": r, "acc": 1 - 0.5 * np.exp(-n / (50 * l_)) + 0.01 * rng.normal()}
                        for l_ in (1, 2, 4) for n in (10, 30, 100, 300, 1000, 3000) for r in range(5)])
    sc = ms.sample_complexity(acc, "acc", 0.9, by="l", n_resamples=200)
    ax = sc.plot(design="l")
    assert ax.get_title() == "sample size to reach acc ≥ 0.9"
    assert ax.get_ylabel().startswith("$n^*$") and ax.get_xlabel() == "l"
    assert "bars: 95% CI of the $n^*$ (bootstrap)" in _texts(ax.figure)
    assert fs.smallest_font_px(ax.figure) >= fs.MIN_FONT_PX


# ------------------------------------------------------------------------------------------- unit profiles


@pytest.fixture(scope="module")
def unit_rates(units_frame) -> pd.DataFrame:
    tabs = [ms.fit_rate(units_frame, y, by=["expert", "gate"], units="truth_seed", n_resamples=200, seed=0)
            .table.assign(y=y) for y in ("l2_best", "exact_param_best")]
    return pd.concat(tabs, ignore_index=True)


def test_unit_profiles_panels_legend_fitted_lines_and_caption(units_frame, unit_rates, tmp_path):
    fig = plot_unit_profiles(units_frame, unit_rates, ["exact_param", "l2"], hue="gate", label="test",
                             colors={"sigmoid": "tab:blue", "softmax": "tab:green"})
    axes = [a for a in fig.axes if a.get_visible()]
    assert len(axes) == 4  # responses down the rows, one column per expert
    assert [a.get_title() for a in axes] == ["gelu: exact-atom error (test)", "relu: exact-atom error (test)",
                                            "gelu: regression-function error (test)",
                                            "relu: regression-function error (test)"]
    assert axes[2].get_ylabel() == fs.label("l2") and axes[0].get_ylabel() == fs.label("exact_param")
    for ax, (expert, y) in zip(axes, [("gelu", "exact_param_best"), ("relu", "exact_param_best"),
                                      ("gelu", "l2_best"), ("relu", "l2_best")], strict=True):
        leg = ax.get_legend()
        texts = [t.get_text() for t in leg.get_texts()]
        assert len(texts) == 2  # one entry per gate
        for gate, text in zip(("sigmoid", "softmax"), texts, strict=True):
            row = unit_rates[(unit_rates["y"] == y) & (unit_rates["expert"] == expert)
                             & (unit_rates["gate"] == gate)].iloc[0]
            interval = f"{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
            assert text == f"{gate}: {interval}, {row['verdict']}"
        # each entry's key shows the median (markers) and the fitted line (dashed)
        keys = [ln for ln in leg.findobj(Line2D) if ln is not leg]
        assert sum(ln.get_linestyle() == "--" for ln in keys) == 2
        # the dashed fitted lines are exp(intercept - exponent log n) of the table's rows
        dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert len(dashed) == 2
        for ln, gate in zip(dashed, ("sigmoid", "softmax"), strict=True):
            row = unit_rates[(unit_rates["y"] == y) & (unit_rates["expert"] == expert)
                             & (unit_rates["gate"] == gate)].iloc[0]
            n = np.asarray(ln.get_xdata())
            np.testing.assert_allclose(ln.get_ydata(), np.exp(row["intercept"] - row["exponent"] * np.log(n)),
                                       rtol=1e-12)
    caption = _texts(fig)
    assert "median over truths" in caption and "no error bars" in caption and "95% CI" in caption
    assert fs.smallest_font_px(fig) >= fs.MIN_FONT_PX
    assert plot_unit_profiles(units_frame, unit_rates, ["l2"], hue="gate", path=tmp_path / "p.png") is None
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_unit_profiles_confidence_level(units_frame, unit_rates):
    fig = plot_unit_profiles(units_frame, unit_rates, ["l2"], hue="gate", confidence_level=0.9)
    assert "90% CI" in _texts(fig)
    with pytest.raises(ValueError, match=r"confidence_level=0\.9 disagrees"):
        plot_unit_profiles(units_frame, unit_rates.assign(ci=0.95), ["l2"], hue="gate", confidence_level=0.9)
    assert "80% CI" in _texts(plot_unit_profiles(units_frame, unit_rates.assign(ci=0.8), ["l2"], hue="gate"))


def test_unit_profiles_one_level_wraps_responses(units_frame, unit_rates):
    one = units_frame[units_frame["expert"] == "gelu"]
    fig = plot_unit_profiles(one, unit_rates, ["exact_param", "l2"], hue="gate")
    visible = [a for a in fig.axes if a.get_visible()]
    assert len(visible) == 2 and visible[0].get_title() == "gelu: exact-atom error"
    # short legends fit under half-width panels: two columns
    assert visible[0].get_position().x1 < visible[1].get_position().x0


# ------------------------------------------------------------------------------------------- invariance


@pytest.mark.parametrize("responses", [["l2"], ["l2", "exact_param"], ["l2", "exact_param", "l2_best"]])
def test_invariance_legend_outside_the_data_and_caption(units_frame, responses):
    frame = units_frame.assign(l2_best_alt=units_frame["l2_alt"])
    fig = plot_invariance(frame, responses, hue="gate")
    data_axes = [a for a in fig.axes if a.get_visible() and a.axison]
    assert len(data_axes) == len(responses)
    for ax, y in zip(data_axes, responses, strict=True):
        assert ax.get_title() == fs.short_name(y)
        assert ax.get_xlabel() == f"{fs.label(y)}, Newton (default)" and "$" in ax.get_xlabel()
        assert len(ax.collections) == 4  # gate x expert
    legends = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    assert len(legends) == 1
    texts = [t.get_text() for t in legends[0].get_texts()]
    assert texts == ["sigmoid, gelu", "softmax, gelu", "sigmoid, relu", "softmax, relu"]
    # the legend never sits inside a data panel: its box does not meet any data axes' box
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    box = legends[0].get_window_extent(r)
    assert not any(box.overlaps(ax.get_window_extent(r)) for ax in data_axes)
    assert "dotted: y = x" in _texts(fig)
    assert fs.smallest_font_px(fig) >= fs.MIN_FONT_PX


def test_rate_text_shows_the_power_of_a_growing_metric_with_a_plus():
    from moestat.rates.plots import _rate_text

    assert _rate_text("power", 0.5, 0.4, 0.6) == "n^-0.50 [0.40, 0.60]"
    # y ~ n^(+0.34): the power and its interval, not "n^--0.34"
    assert _rate_text("power", -0.34, -0.5, -0.2) == "n^+0.34 [0.20, 0.50]"
