"""Voronoi losses of the Gaussian-gated MoE (Type I and Type II cells): against a brute-force implementation of the
definition, hand calculations, invariances, and the cell conventions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from moestat.metrics.gaussian_gate_voronoi import (
    gaussian_gate_cell_errors,
    gaussian_gate_cells,
    gaussian_gate_voronoi_frame,
    gaussian_gate_voronoi_loss,
)

RBAR = {2: 4.0, 3: 6.0}


def _random(k: int, d: int, l_: int, rng: np.random.Generator, zero: int | None = None) -> dict[str, np.ndarray]:
    g = rng.standard_normal((k, d, d))
    n = rng.standard_normal((k, l_, l_))
    c = rng.standard_normal((k, d))
    if zero is not None:
        c[zero] = 0.0
    pi = rng.uniform(0.5, 1.5, k)
    return {"pi": pi / pi.sum(), "c": c, "Gamma": g @ np.swapaxes(g, -1, -2) + np.eye(d),
            "A": rng.standard_normal((k, l_, d)), "b": rng.standard_normal((k, l_)),
            "nu": n @ np.swapaxes(n, -1, -2) + np.eye(l_)}


def _near(truth: dict[str, np.ndarray], pattern: list[int], rng: np.random.Generator, scale: float) -> dict:
    """Fitted atoms copied from the true atoms of ``pattern`` plus noise (weights split within a cell)."""
    counts = np.bincount(pattern, minlength=len(truth["pi"]))
    out = {key: np.array([truth[key][j] for j in pattern]) for key in ("c", "Gamma", "A", "b", "nu")}
    for key in ("c", "A", "b"):
        out[key] = out[key] + scale * rng.standard_normal(out[key].shape)
    for key in ("Gamma", "nu"):
        e = scale * rng.standard_normal(out[key].shape)
        out[key] = out[key] + 0.5 * (e + np.swapaxes(e, -1, -2))
    w = truth["pi"][pattern] / counts[pattern] * rng.uniform(0.8, 1.2, len(pattern))
    out["pi"] = w / w.sum()
    return out


def _brute(fitted: dict, truth: dict, cell_distance: str) -> float:
    """The loss from its definition, atom by atom, with Python loops and scalars."""
    keys = ("c", "Gamma", "A", "b", "nu")
    k, k_star = len(fitted["pi"]), len(truth["pi"])

    def norm(a: np.ndarray) -> float:
        return float(np.sqrt((np.asarray(a) ** 2).sum()))

    cells = []
    for i in range(k):
        dists = []
        for j in range(k_star):
            parts = [norm(fitted[key][i] - truth[key][j]) for key in keys]
            dists.append(np.sqrt(sum(p * p for p in parts)) if cell_distance == "euclidean" else sum(parts))
        cells.append(int(np.argmin(dists)))
    total = 0.0
    for j in range(k_star):
        members = [i for i in range(k) if cells[i] == j]
        total += abs(sum(fitted["pi"][i] for i in members) - truth["pi"][j])
        m = len(members)
        type_two = norm(truth["c"][j]) == 0.0
        for i in members:
            e = {key: norm(fitted[key][i] - truth[key][j]) for key in keys}
            if m == 1:
                total += fitted["pi"][i] * sum(e.values())
                continue
            r = RBAR[m]
            slope = r / 2 if type_two else 2.0
            total += fitted["pi"][i] * (e["c"] ** r + e["Gamma"] ** (r / 2) + e["A"] ** slope + e["b"] ** r
                                        + e["nu"] ** (r / 2))
    return total


@pytest.mark.parametrize("cell_distance", ["euclidean", "sum"])
@pytest.mark.parametrize("zero", [None, 0])
def test_loss_matches_brute_force(cell_distance, zero):
    rng = np.random.default_rng(3 if zero is None else 4)
    truth = _random(3, 2, 1, rng, zero=zero)
    patterns = [[0, 0, 1, 2], [0, 1, 1, 2, 2], [0, 0, 0, 1, 2], [2, 1, 0]]
    for pattern, scale in itertools.product(patterns, (0.05, 0.3)):
        fitted = _near(truth, pattern, rng, scale)
        assert gaussian_gate_voronoi_loss(fitted, truth, cell_distance=cell_distance) == pytest.approx(
            _brute(fitted, truth, cell_distance), rel=1e-12)


def test_batched_equals_one_by_one_and_frame_parts_add_up():
    rng = np.random.default_rng(5)
    truth = _random(3, 1, 1, rng, zero=1)
    fits = [_near(truth, [0, 1, 1, 2], rng, 0.2) for _ in range(6)]
    batch = {key: np.stack([f[key] for f in fits]) for key in fits[0]}
    losses = gaussian_gate_voronoi_loss(batch, truth)
    assert losses.shape == (6,)
    np.testing.assert_allclose(losses, [gaussian_gate_voronoi_loss(f, truth) for f in fits], rtol=1e-14)
    frame = gaussian_gate_voronoi_frame(batch, truth)
    np.testing.assert_allclose(frame["loss"], losses, rtol=1e-14)
    np.testing.assert_allclose(frame["weight_gap"] + frame["exact_part"] + frame["over_part"], losses, rtol=1e-12)
    cells = frame[["cell_0", "cell_1", "cell_2"]].sum(axis=1)
    np.testing.assert_allclose(frame["weight_gap"] + cells, losses, rtol=1e-12)


def test_invariances():
    rng = np.random.default_rng(7)
    truth = _random(3, 2, 2, rng, zero=2)
    fitted = _near(truth, [0, 1, 2, 2, 1], rng, 0.1)
    loss = gaussian_gate_voronoi_loss(fitted, truth)
    perm = rng.permutation(5)
    assert gaussian_gate_voronoi_loss({k: v[perm] for k, v in fitted.items()}, truth) == pytest.approx(loss, rel=1e-14)
    tperm = np.array([2, 0, 1])
    assert gaussian_gate_voronoi_loss(fitted, {k: v[tperm] for k, v in truth.items()}) == pytest.approx(loss,
                                                                                                          rel=1e-14)
    assert gaussian_gate_voronoi_loss(truth, truth) == 0.0
    # an atom split into exact copies whose weights add up to its weight: still no loss
    split = {k: v[[0, 0, 1, 2]].copy() for k, v in truth.items()}
    split["pi"] = np.array([0.25, 0.75, 1.0, 1.0]) * truth["pi"][[0, 0, 1, 2]]
    assert gaussian_gate_voronoi_loss(split, truth) == pytest.approx(0.0, abs=1e-15)


def _one(c: float) -> dict[str, np.ndarray]:
    return {"pi": np.array([1.0]), "c": np.array([[c]]), "Gamma": np.array([[[1.0]]]), "A": np.array([[[0.0]]]),
            "b": np.array([[0.0]]), "nu": np.array([[[1.0]]])}


def test_hand_calculations():
    # one atom alone in its cell: |d c| + |d Gamma| = 0.1 + 0.2
    fit = {**_one(1.1), "Gamma": np.array([[[1.2]]])}
    assert gaussian_gate_voronoi_loss(fit, _one(1.0)) == pytest.approx(0.3, rel=1e-12)
    # two atoms of weight 1/2 at c* +- 0.1: each term 0.5 * 0.1^rbar(2) = 0.5e-4
    two = {k: np.repeat(v, 2, axis=0) for k, v in _one(1.0).items()}
    two["pi"] = np.array([0.5, 0.5])
    two["c"] = np.array([[1.1], [0.9]])
    assert gaussian_gate_voronoi_loss(two, _one(1.0)) == pytest.approx(1e-4, rel=1e-10)
    # three atoms of weight 1/3 with slopes 0.2, -0.2, 0: Type I squares |d A| -> (0.04 + 0.04) / 3; Type II
    # (c* = 0) raises it to rtilde(3)/2 = 3 -> (0.008 + 0.008) / 3
    three = {k: np.repeat(v, 3, axis=0) for k, v in _one(1.0).items()}
    three["pi"] = np.full(3, 1 / 3)
    three["A"] = np.array([[[0.2]], [[-0.2]], [[0.0]]])
    assert gaussian_gate_voronoi_loss(three, _one(1.0)) == pytest.approx(0.08 / 3, rel=1e-10)
    three["c"] = np.zeros((3, 1))
    assert gaussian_gate_voronoi_loss(three, _one(0.0)) == pytest.approx(0.016 / 3, rel=1e-10)
    # zero_atol decides what counts as a zero gate mean
    assert gaussian_gate_voronoi_loss(three, _one(1e-9)) == pytest.approx(0.08 / 3, rel=1e-6)
    assert gaussian_gate_voronoi_loss(three, _one(1e-9), zero_atol=1e-8) == pytest.approx(0.016 / 3, rel=1e-6)


def test_cell_conventions_differ_where_they_should():
    """An atom 1.0 away from true atom 0 in c only, and 0.6 away from atom 1 in both c and b: the Euclidean
    distances are 1.0 and 0.85 (cell 1), the sums of block norms 1.0 and 1.2 (cell 0)."""
    truth = {k: np.repeat(v, 2, axis=0) for k, v in _one(1.0).items()}
    truth["pi"] = np.array([0.5, 0.5])
    truth["c"] = np.array([[1.0], [1.4]])
    truth["b"] = np.array([[0.0], [0.6]])
    fit = {**_one(2.0), "b": np.array([[0.0]])}
    assert gaussian_gate_cells(fit, truth).tolist() == [1]
    assert gaussian_gate_cells(fit, truth, cell_distance="sum").tolist() == [0]


def test_cell_errors_table():
    rng = np.random.default_rng(2)
    truth = _random(3, 1, 1, rng, zero=0)
    fitted = _near(truth, [0, 0, 2, 2], rng, 0.05)  # true atom 1 has no fitted atom
    tab = gaussian_gate_cell_errors(fitted, truth)
    assert tab["cell_size"].tolist() == [2, 0, 2] and tab["zero_location"].tolist() == [True, False, False]
    assert np.isnan(tab.loc[1, "err_c"]) and tab.loc[1, "weight_sum_error"] == pytest.approx(truth["pi"][1])
    assert tab.loc[0, "err_b"] == pytest.approx(np.abs(fitted["b"][:2, 0] - truth["b"][0, 0]).max())
    frame = gaussian_gate_voronoi_frame(fitted, truth)
    assert frame["cell_sizes"].iloc[0] == "2-0-2" and frame["empty_cells"].iloc[0] == 1


def test_exponents_for_large_cells_and_bad_input():
    rng = np.random.default_rng(1)
    truth = _random(1, 1, 1, rng)
    four = _near(truth, [0, 0, 0, 0], rng, 0.1)
    with pytest.raises(ValueError, match=r"4 fitted atoms and no rbar\(4\) is known; pass rbar=\{4: value\}"):
        gaussian_gate_voronoi_loss(four, truth)
    by_map = gaussian_gate_voronoi_loss(four, truth, rbar={4: 8.0})
    assert gaussian_gate_voronoi_loss(four, truth, rbar=lambda m: 2.0 * m) == pytest.approx(by_map, rel=1e-14)
    assert gaussian_gate_cell_errors(four, truth)["cell_size"].tolist() == [4]  # no exponent needed there
    with pytest.raises(TypeError, match="missing \\['nu'\\]"):
        gaussian_gate_voronoi_loss({k: v for k, v in four.items() if k != "nu"}, truth)
    with pytest.raises(ValueError, match="same d and l"):
        gaussian_gate_voronoi_loss(_random(2, 2, 1, rng), _random(2, 1, 1, rng))
    with pytest.raises(ValueError, match="no replicate axis"):
        gaussian_gate_voronoi_loss(four, {k: np.repeat(v[None], 2, axis=0) for k, v in truth.items()})
    with pytest.raises(ValueError, match="cell_distance='max' is not supported"):
        gaussian_gate_voronoi_loss(four, truth, cell_distance="max")
    with pytest.raises(ValueError, match="zero_atol"):
        gaussian_gate_voronoi_loss(four, truth, zero_atol=-1.0)
    with pytest.raises(TypeError, match="rbar must map cell sizes"):
        gaussian_gate_voronoi_loss(four, truth, rbar={4: "eight"})
