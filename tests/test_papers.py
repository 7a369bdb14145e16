"""The papers package: one module per founding paper, each with its citation, presets and theory rows."""

from __future__ import annotations

import re

import numpy as np

import moestat as ms
from moestat import papers
from moestat.rates import theory_rates


def test_every_paper_has_a_citation_and_theory_rows_carry_its_key():
    for key, module in papers.PAPERS.items():
        assert re.fullmatch(r"[a-z]+\d{4}(_[a-z]+)*", key) and module.REFERENCE.count("(") >= 1
        for row in getattr(module, "THEORY", []):
            assert len(row) == len(papers.THEORY_COLUMNS)
            assert row[0] == key, f"{key}.THEORY has a row of {row[0]}"


def test_theory_rates_is_the_union_of_the_papers_rows_in_paper_order():
    table = theory_rates()
    expected = [row for m in papers.PAPERS.values() for row in getattr(m, "THEORY", [])]
    assert len(table) == len(expected)
    assert list(table["source"].unique()) == [key for key, m in papers.PAPERS.items() if getattr(m, "THEORY", None)]
    # the founding papers' rows are unchanged as later papers join
    counts = table["source"].value_counts()
    assert {key: int(counts[key]) for key in ("nguyen2024", "makkuva2020", "chowdhury2023", "nguyen2023",
                                              "nguyen2025_cosine")} == {"nguyen2024": 32, "makkuva2020": 5,
                                                                        "chowdhury2023": 27, "nguyen2023": 8,
                                                                        "nguyen2025_cosine": 12}
    np.testing.assert_array_equal(table["exponent"].to_numpy(float), np.array([r[10] for r in expected], float))


def test_chowdhury2023_rows_are_built_from_its_slope_table():
    rows = [r for r in papers.chowdhury2023.THEORY]
    assert len(rows) == len(papers.chowdhury2023.SLOPES)
    for row, (response, regressor, arch, slope, result) in zip(rows, papers.chowdhury2023.SLOPES, strict=True):
        assert (row[1], row[4], row[7], row[8], row[10]) == (result, arch, response, regressor, slope)
        assert row[2] == ("none" if arch == "cnn" else "patch_top_l")


def test_the_preset_registry_is_what_ms_presets_and_study_read():
    assert ms.presets.PRESETS is papers.PRESETS
    assert ms.presets.sigmoid_vs_softmax is papers.nguyen2024.sigmoid_vs_softmax
    truth = ms.presets.PRESETS["sigmoid_vs_softmax"](regime=2, expert="gelu", seed=0)
    assert isinstance(truth, ms.Truth) and truth.spec.k == 8
    study = ms.Study(truth={"preset": "gate_comparison", "seed": 1}, fit={}, n=[200], reps=1)
    assert study.truths[0]["preset"] == "gate_comparison"


def test_nguyen2023_rows_read_the_cell_exponents_back_into_parameter_rates():
    """An over-specified cell of m atoms: the D2 terms |d beta1|^rbar and |d a|^(rbar/2) fall like n^(-1/2), so beta1
    moves at 1/(2 rbar) and a at 1/rbar; rbar(2) = 4 gives 1/8 and 1/4 (the docs page's example)."""
    table = theory_rates()
    rows = table[table["source"] == "nguyen2023"].set_index("response")
    assert rows.loc["param_cell2_slow", "exponent"] == 1 / 8 and rows.loc["param_cell2_fast", "exponent"] == 1 / 4
    assert rows.loc["param_cell3_slow", "exponent"] == 1 / 12 and rows.loc["param_cell3_fast", "exponent"] == 1 / 6
    assert ms.predicted_rate("softmax", "linear", "gaussian_voronoi", regime="over") == "(log n / n)^{1/2}"
    assert ms.predicted_rate("sigmoid", "linear", "gaussian_voronoi", regime="over") == ""
