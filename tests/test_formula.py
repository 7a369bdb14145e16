"""Formula interface: model matrices against hand-built ones, the missing-data policy, weights, transform()."""

import pickle

import numpy as np
import pandas as pd
import pytest

from moestat.formula import DesignMatrices, ModelDesign, build_design


def _frame(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "y": rng.normal(size=n),
        "x": rng.uniform(1.0, 3.0, size=n),
        "w1": rng.normal(size=n),
        "w2": rng.normal(size=n),
        "z": rng.normal(size=n),
        "g": list("abc" * (n // 3)),
        "s": list("uv" * (n // 2)),
        "count": rng.poisson(3.0, size=n),
    }, index=pd.RangeIndex(100, 100 + n))


def _dummies(values, levels):
    """Treatment coding by hand: one 0/1 column per non-baseline level."""
    return np.column_stack([(np.asarray(values) == lev).astype(float) for lev in levels[1:]])


# ------------------------------------------------------------------ matrices against hand-built ones
def test_terms_match_hand_built_matrices():
    df = _frame()
    d = build_design("y ~ x + I(x**2) + np.log(x) + C(g)", df)
    x = df["x"].to_numpy()
    expected = np.column_stack([x, x**2, np.log(x), _dummies(df["g"], ["a", "b", "c"])])
    np.testing.assert_allclose(d.X, expected, rtol=1e-15)
    np.testing.assert_array_equal(d.y, df["y"].to_numpy())
    assert d.response_name == "y"
    assert d.expert_names == ("x", "I(x ** 2)", "np.log(x)", "C(g)[T.b]", "C(g)[T.c]")
    assert d.expert_coef_names == ("Intercept", *d.expert_names)  # moestat's coefficient order (b, a)
    assert d.expert_intercept and d.X.dtype == np.float64 and d.X.shape == (12, 5)
    assert d.n == 12 and d.d == 5
    # default gate = the expert covariates
    assert not d.separate_gate and d.gate_names == d.expert_names and d.gate_intercept
    np.testing.assert_array_equal(d.X_gate, d.X)
    assert d.X_shared is None and d.shared_names == () and d.weights is None


def test_interactions_and_string_columns():
    df = _frame()
    d = build_design("y ~ x:s + g", df)
    x, s = df["x"].to_numpy(), df["s"].to_numpy()
    # x:s with no main effect of x: formulaic codes s fully (one slope per level), g by treatment
    expected = np.column_stack([_dummies(df["g"], ["a", "b", "c"]), x * (s == "u"), x * (s == "v")])
    np.testing.assert_allclose(d.X, expected, rtol=1e-15)
    assert d.expert_names == ("g[T.b]", "g[T.c]", "x:s[u]", "x:s[v]")


def test_expression_response_and_boolean_response():
    df = _frame()
    d = build_design("np.log(count + 1) ~ x", df)
    np.testing.assert_allclose(d.y, np.log(df["count"] + 1.0), rtol=1e-15)
    assert d.response_name == "np.log(count + 1)"
    b = build_design("flag ~ x", df.assign(flag=df["y"] > 0))
    np.testing.assert_array_equal(b.y, (df["y"] > 0).to_numpy().astype(float))


def test_separate_gate_and_shared_matrices():
    df = _frame()
    d = build_design("y ~ x", df, gate_formula="~ w1 + w2", shared="~ z + C(s)")
    assert d.separate_gate and d.gate_formula == "~ w1 + w2"
    np.testing.assert_array_equal(d.X_gate, df[["w1", "w2"]].to_numpy())
    assert d.gate_coef_names == ("Intercept", "w1", "w2")
    # shared columns: no intercept, categorical coded against a baseline (the experts' intercepts cover it)
    np.testing.assert_array_equal(d.X_shared, np.column_stack([df["z"], _dummies(df["s"], ["u", "v"])]))
    assert d.shared_names == ("z", "C(s)[T.v]")
    assert d.data_columns == ("y", "x", "w1", "w2", "z", "s")


def test_removed_intercepts_are_recorded():
    df = _frame()
    d = build_design("y ~ 0 + C(g)", df, gate_formula="~ w1 - 1")
    assert not d.expert_intercept and not d.gate_intercept
    assert d.expert_coef_names == ("C(g)[a]", "C(g)[b]", "C(g)[c]")  # all levels when there is no intercept
    np.testing.assert_array_equal(d.X.sum(axis=1), 1.0)
    assert d.gate_coef_names == ("w1",)


def test_mapping_data_and_context_functions():
    df = _frame()

    def cube(v):
        return v**3

    d = build_design("y ~ cube(x)", df)  # found in the caller's variables
    np.testing.assert_allclose(d.X[:, 0], df["x"] ** 3, rtol=1e-15)
    d2 = build_design("y ~ f(x)", {c: df[c].to_numpy() for c in df.columns}, context={"f": np.sqrt})
    np.testing.assert_allclose(d2.X[:, 0], np.sqrt(df["x"]), rtol=1e-15)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"formula": "y ~ xx + g"}, r"^formula='y ~ xx \+ g' uses the column 'xx', which is not in data.*'x'"),
    ({"formula": "yy ~ x"}, r"^formula='yy ~ x' uses the column 'yy', which is not in data"),
    ({"formula": "y ~ x", "gate_formula": "~ w3"}, r"^gate_formula='~ w3' uses the column 'w3'"),
    ({"formula": "y ~ x", "shared": "~ q"}, r"^shared='~ q' uses the column 'q'"),
    ({"formula": "~ x"}, r"^formula='~ x' has no response"),
    ({"formula": "y + z ~ x"}, r"has 2 response terms"),
    ({"formula": "y ~ x +"}, r"^formula='y ~ x \+' is not a valid formula"),
    ({"formula": "y ~ x", "gate_formula": "y ~ w1"}, r"^gate_formula='y ~ w1' has a left-hand side"),
    ({"formula": "y ~ x + z", "shared": "~ z"}, r"^shared='~ z' and formula='y ~ x \+ z' both contain \['z'\]"),
    ({"formula": "y ~ x", "shared": "~ 0 + z"}, r"^shared='~ 0 \+ z' removes the intercept"),
    ({"formula": "y ~ undefined_fn(x)"}, r"calls 'undefined_fn'.*context="),
    ({"formula": "y ~ np.log(w1)"}, r"^formula='y ~ np.log\(w1\)' gives non-finite values .*\['np.log\(w1\)'\]"),
    ({"formula": "y ~ x", "missing": "omit"}, r"^missing='omit' is not supported"),
    ({"formula": "y ~ x | w1"}, r"several parts"),
])
def test_bad_formulas_raise_naming_the_argument(kwargs, match):
    kwargs = dict(kwargs)
    formula = kwargs.pop("formula")
    with pytest.raises(ValueError, match=match):
        build_design(formula, _frame(), **kwargs)


def test_non_numeric_response_and_bad_data():
    with pytest.raises(TypeError, match=r"^the response 's' of formula='s ~ x' must be numeric"):
        build_design("s ~ x", _frame())
    with pytest.raises(TypeError, match=r"^the response .* must be one numeric column"):
        build_design("C(count) ~ x", _frame())  # a numeric column made categorical
    with pytest.raises(TypeError, match=r"^data must be a pandas DataFrame"):
        build_design("y ~ x", np.zeros((3, 2)))
    with pytest.raises(TypeError, match=r"^formula must be a formula string"):
        build_design(None, _frame())


# ------------------------------------------------------------------ weights
def test_weights_are_validated_and_accepted():
    df = _frame()
    w = np.arange(12, dtype=float) % 3
    np.testing.assert_array_equal(build_design("y ~ x", df, weights=w).weights, w)
    np.testing.assert_array_equal(build_design("y ~ x", df.assign(cw=w), weights="cw").weights, w)
    with pytest.raises(ValueError, match=r"^weights has shape \(11,\) but data has 12 rows"):
        build_design("y ~ x", df, weights=w[:11])
    with pytest.raises(ValueError, match=r"^weights must be finite and non-negative; 1 are not \(e.g. -1 at row 2\)"):
        build_design("y ~ x", df, weights=np.where(np.arange(12) == 2, -1.0, 1.0))
    with pytest.raises(ValueError, match=r"^weights must be finite"):
        build_design("y ~ x", df, weights=np.where(np.arange(12) == 2, np.nan, 1.0))
    with pytest.raises(ValueError, match=r"^weights are all zero"):
        build_design("y ~ x", df, weights=np.zeros(12))
    with pytest.raises(ValueError, match=r"^weights='nope' is not a column of data"):
        build_design("y ~ x", df, weights="nope")
    with pytest.raises(TypeError, match=r"^weights must hold real numbers"):
        build_design("y ~ x", df, weights=["a"] * 12)


# ------------------------------------------------------------------ missing data
def _with_gaps():
    df = _frame()
    df.loc[101, "x"] = np.nan
    df.loc[104, "g"] = None
    df.loc[107, "w2"] = np.nan  # used only by the gate
    df.loc[110, "count"] = np.nan  # not used by any formula: never a reason to drop
    return df


def test_missing_raise_names_columns_and_count():
    with pytest.raises(ValueError, match=r"^data has missing values \(NaN/None\) in 3 of 12 rows.*'x' \(1 missing\), "
                                         r"'g' \(1 missing\), 'w2' \(1 missing\).*missing='drop'"):
        build_design("y ~ x + C(g)", _with_gaps(), gate_formula="~ w2")


def test_missing_drop_records_the_rows_kept():
    df = _with_gaps()
    w = np.linspace(1.0, 2.0, 12)
    d = build_design("y ~ x + C(g)", df, gate_formula="~ w2", weights=w, missing="drop")
    keep = ~np.isin(df.index, [101, 104, 107])
    assert d.n_dropped == 3 and d.n == 9
    np.testing.assert_array_equal(d.kept, keep)
    assert list(d.index) == list(df.index[keep])
    np.testing.assert_array_equal(d.y, df["y"].to_numpy()[keep])
    np.testing.assert_array_equal(d.weights, w[keep])
    full = build_design("y ~ x + C(g)", df.loc[keep], gate_formula="~ w2", weights=w[keep])
    np.testing.assert_array_equal(d.X, full.X)
    np.testing.assert_array_equal(d.X_gate, full.X_gate)
    assert "n_dropped=3" in repr(d)


def test_missing_in_a_weights_column_follows_the_policy():
    df = _frame().assign(cw=1.0)
    df.loc[103, "cw"] = np.nan
    with pytest.raises(ValueError, match=r"'cw' \(1 missing\)"):
        build_design("y ~ x", df, weights="cw")
    assert build_design("y ~ x", df, weights="cw", missing="drop").n_dropped == 1


# ------------------------------------------------------------------ transform
def _design():
    return build_design("y ~ x + I(x**2) + np.log(x) + C(g) + center(w1)", _frame(), gate_formula="~ w2 + s",
                        shared="~ z")


def test_transform_of_the_training_data_reproduces_the_design():
    d = _design()
    t = d.transform(_frame())
    assert isinstance(t, DesignMatrices) and t.n_dropped == 0
    for a, b in ((t.X, d.X), (t.X_gate, d.X_gate), (t.X_shared, d.X_shared), (t.y, d.y)):
        np.testing.assert_array_equal(a, b)


def test_transform_is_by_column_name():
    d = _design()
    df = _frame()
    shuffled = df[list(reversed(df.columns))].copy()
    t = d.transform(shuffled)
    np.testing.assert_array_equal(t.X, d.X)
    np.testing.assert_array_equal(t.X_gate, d.X_gate)
    np.testing.assert_array_equal(t.X_shared, d.X_shared)
    # renaming columns so that the positions match but the names do not is caught
    renamed = df.rename(columns={"w2": "w3"})
    with pytest.raises(ValueError, match=r"^new_data lacks the column\(s\) \['w2'\]"):
        d.transform(renamed)


def test_transform_of_new_rows_uses_the_stored_state():
    d = _design()
    train = _frame()
    new = pd.DataFrame({"x": [2.0, 1.5], "w1": [0.0, 1.0], "w2": [0.3, -0.3], "s": ["v", "v"], "z": [1.0, 2.0],
                        "g": ["c", "a"]})  # a subset of the levels, in another order; no response
    t = d.transform(new)
    assert t.y is None
    mean_w1 = train["w1"].mean()  # center() keeps the training mean
    expected = np.array([[2.0, 4.0, np.log(2.0), 0.0, 1.0, 0.0 - mean_w1],
                         [1.5, 2.25, np.log(1.5), 0.0, 0.0, 1.0 - mean_w1]])
    np.testing.assert_allclose(t.X, expected, rtol=1e-14)
    np.testing.assert_array_equal(t.X_gate, [[0.3, 1.0], [-0.3, 1.0]])  # s coded against the training baseline u
    np.testing.assert_array_equal(t.X_shared, [[1.0], [2.0]])


def test_transform_rejects_unseen_levels_naming_the_column():
    d = _design()
    new = _frame().assign(g=["a", "b", "d"] * 4)
    with pytest.raises(ValueError, match=r"^new_data column 'g' has levels \['d'\]"):
        d.transform(new)


def test_transform_missing_policy():
    d = _design()
    new = _frame()
    new.loc[102, "x"] = np.nan
    with pytest.raises(ValueError, match=r"^new_data has missing values.*'x' \(1 missing\)"):
        d.transform(new)
    t = d.transform(new, missing="drop")
    assert t.n_dropped == 1 and 102 not in t.index and t.X.shape[0] == 11
    np.testing.assert_array_equal(t.X, d.X[np.arange(12) != 2])
    with pytest.raises(ValueError, match=r"^missing='x' is not supported"):
        d.transform(new, missing="x")


def test_design_pickles_and_keeps_transforming():
    d = _design()
    back = pickle.loads(pickle.dumps(d))
    assert isinstance(back, ModelDesign)
    np.testing.assert_array_equal(back.transform(_frame()).X, d.X)


def test_matrices_are_writable_float_arrays():
    """torch.as_tensor warns on read-only arrays (pandas' copy-on-write hands those out)."""
    d = build_design("y ~ x", _frame().assign(cw=1.0), weights="cw", gate_formula="~ w1", shared="~ z")
    for a in (d.y, d.X, d.X_gate, d.X_shared, d.weights):
        assert a.flags.writeable and a.dtype == np.float64
    t = d.transform(_frame())
    assert t.y.flags.writeable and t.X.flags.writeable


def test_a_repeated_formula_gives_the_same_design_on_other_data_and_a_bad_one_raises_every_time():
    """Each formula text is parsed once and reused: the reuse must not carry data (levels, rows) from one call to the
    next, and a formula that does not parse must raise on every call (a parse error is not remembered as a result)."""
    first = build_design("y ~ x + C(g)", _frame(12, seed=0))
    other = _frame(12, seed=1).assign(g=list("cbd" * 4))  # other rows, a level the first frame lacks
    second = build_design("y ~ x + C(g)", other)
    assert second.X.shape == (12, 3) and second.expert_names == ("x", "C(g)[T.c]", "C(g)[T.d]")
    np.testing.assert_array_equal(second.X[:, 0], other["x"].to_numpy())
    np.testing.assert_array_equal(second.X[:, 1:], _dummies(other["g"], ["b", "c", "d"]))
    assert first.expert_names == ("x", "C(g)[T.b]", "C(g)[T.c]")
    for _ in range(2):
        with pytest.raises(ValueError, match="not a valid formula"):
            build_design("y ~ x +", _frame())


def test_missing_values_in_a_duplicated_column_name_are_found():
    """A frame with two columns of one name: a missing value in either is found (read column by column)."""
    from moestat.formula import _missing_rows

    df = _frame().rename(columns={"w1": "x"})  # two columns named x
    df.iloc[3, 2] = np.nan  # in the second one
    keep = _missing_rows("data", df, ["x"], "drop")
    assert keep.tolist() == [i != 3 for i in range(12)]
    with pytest.raises(ValueError, match="missing values"):
        _missing_rows("data", df, ["x"], "raise")


def test_one_joint_materialisation_equals_one_call_per_part_and_errors_still_name_their_argument():
    """build_design evaluates every formula part in one formulaic call; each part's matrix and its model spec (used
    on new data) must equal those of materialising that part alone, and a part that fails names its argument."""
    from moestat.formula import _formula, _materialize

    df = _frame(12, seed=2)
    d = build_design("y ~ x + I(x**2) + C(g)", df, gate_formula="~ w1 + C(g)", shared="~ w2")
    alone = {name: _materialize(name, text, _formula(text), df, {})
             for name, text in (("formula", "y ~ x + I(x**2) + C(g)"), ("gate_formula", "~ w1 + C(g)"),
                                ("shared", "~ w2"))}
    np.testing.assert_array_equal(d.X, np.asarray(alone["formula"].rhs)[:, 1:])
    np.testing.assert_array_equal(d.y, np.asarray(alone["formula"].lhs)[:, 0])
    np.testing.assert_array_equal(d.X_gate, np.asarray(alone["gate_formula"])[:, 1:])
    np.testing.assert_array_equal(d.X_shared, np.asarray(alone["shared"])[:, 1:])
    new = _frame(6, seed=3)
    np.testing.assert_array_equal(d.transform(new).X_gate,
                                  np.asarray(alone["gate_formula"].model_spec.get_model_matrix(new))[:, 1:])
    for kwargs, argument in (({"gate_formula": "~ w1 + I(w1 / 'a')"}, "gate_formula"),
                             ({"shared": "~ I(w2 / 'a')"}, "shared")):
        with pytest.raises(ValueError, match=rf"^{argument}=.* could not be evaluated on the data"):
            build_design("y ~ x", df, **kwargs)
