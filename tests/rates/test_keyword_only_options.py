"""Options of the rate functions are keyword-only after (frame, y); positional options still work, with a warning."""

from __future__ import annotations

import inspect

import pandas as pd
import pytest

import moestat as ms
from moestat.rates import simulate_rate_frame

FUNCTIONS = {ms.fit_rate: 2, ms.compare_rates: 3, ms.window_sensitivity: 2, ms.compare_models: 2,
             ms.sample_complexity: 3}


@pytest.mark.parametrize("fn", list(FUNCTIONS), ids=lambda f: f.__name__)
def test_options_after_the_leading_arguments_are_keyword_only(fn):
    params = list(inspect.signature(fn).parameters.values())
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert len(positional) == FUNCTIONS[fn], positional
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params[len(positional):])


def test_a_positional_option_is_mapped_with_a_future_warning_and_gives_the_same_fit():
    frame = simulate_rate_frame(0.5, [1e3, 3e3, 1e4, 3e4, 1e5], reps=5, seed=2)
    by_keyword = ms.fit_rate(frame, "y", x="n", by=None, model="power", method="robust")
    with pytest.warns(FutureWarning, match=r"fit_rate\(\): pass x, by, model by keyword"):
        by_position = ms.fit_rate(frame, "y", "n", None, "power", method="robust")
    pd.testing.assert_frame_equal(by_position.table, by_keyword.table)
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        ms.fit_rate(frame, "y", "n", x="n")
