"""The Engel real-data vignette: importable without computing, loads the data it documents."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

PATH = Path(__file__).resolve().parents[2] / "vignettes" / "real-data-moe.py"


def _module():
    spec = importlib.util.spec_from_file_location("real_data_moe", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # importing must not fit anything
    return mod


def test_vignette_contract_and_data():
    mod = _module()
    assert mod.NAME == "real-data-moe" and mod.TITLE and callable(mod.run)
    X, y, centre = mod._load()
    assert X.shape == (235, 1) and y.shape == (235,)  # Engel (1857): 235 households
    assert abs(X.mean()) < 1e-12 and np.isfinite(y).all() and 6 < centre < 7.5
