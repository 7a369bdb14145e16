"""tools/vignette_repro.py: the comparison of a re-run vignette's tables with the checked-in ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("vignette_repro", ROOT / "tools" / "vignette_repro.py")
repro = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(repro)


def _table(**cols):
    return pd.DataFrame(cols)


def test_equal_tables_and_nan_are_equal():
    a = _table(x=[1.0, np.nan], label=["a", None])
    assert repro.compare_tables(a, a.copy()) == ("equal", [])


def test_rounding_within_rtol_is_told_apart_from_equal():
    a, b = _table(x=[1.0, 2.0]), _table(x=[1.0, 2.0 * (1 + 1e-12)])
    assert repro.compare_tables(a, b) == ("equal to rtol", [])
    verdict, notes = repro.compare_tables(a, b, rtol=1e-14)
    assert verdict == "DIFFER" and notes[0].startswith("x (1 rows")
    gaps = _table(gap=[2.1e-13]), _table(gap=[1.0e-13])  # a column that is itself a rounding-level difference
    assert repro.compare_tables(*gaps)[0] == "DIFFER"
    assert repro.compare_tables(*gaps, atol=1e-9) == ("equal to rtol", [])


def test_differences_name_the_columns_rows_and_size():
    a = _table(loss=[1.0, 2.0, 3.0], verdict=["power law", "imprecise", "curved"])
    b = _table(loss=[1.0, 2.5, 3.0], verdict=["power law", "imprecise", "imprecise"])
    verdict, notes = repro.compare_tables(a, b)
    assert verdict == "DIFFER"
    assert notes == ["loss (1 rows, largest relative difference 2.0e-01)", "verdict (1 rows of text)"]


def test_timing_columns_are_not_compared():
    a, b = _table(x=[1.0], fit_wall_time=[3.0], study_seconds=[5.0]), _table(x=[1.0], fit_wall_time=[9.0],
                                                                             study_seconds=[1.0])
    assert repro.compare_tables(a, b) == ("equal", [])


def test_tables_of_another_shape_differ():
    verdict, notes = repro.compare_tables(_table(x=[1.0], y=[2.0]), _table(x=[1.0], z=[2.0]))
    assert verdict == "DIFFER" and "['y', 'z']" in notes[0]


def test_the_checked_in_folder_of_a_size():
    assert repro.checked_in_folder("softmax-gaussian-moe", "quick").name == "quick"
    assert repro.checked_in_folder("real-data-moe", "quick").name == "real-data-moe"  # one folder, no sizes


def test_folders_list_one_sided_tables_and_fail_on_a_difference(tmp_path, capsys):
    new, old = tmp_path / "new", tmp_path / "old"
    for folder in (new, old):
        (folder / "study").mkdir(parents=True)
    _table(x=[1.0]).to_csv(new / "rates.csv", index=False)
    _table(x=[1.0]).to_csv(old / "rates.csv", index=False)
    _table(x=[1.0]).to_csv(new / "study" / "results.csv", index=False)
    _table(x=[1.0]).to_csv(old / "fits.csv", index=False)
    assert repro.compare_folders(new, old, 1e-9)
    out = capsys.readouterr().out
    assert "rates.csv: equal" in out and "results.csv: written by this run only" in out
    assert "fits.csv: checked in only" in out
    _table(x=[2.0]).to_csv(old / "rates.csv", index=False)
    assert not repro.compare_folders(new, old, 1e-9)
