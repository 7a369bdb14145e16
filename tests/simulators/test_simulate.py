"""Simulator: moments, reproducibility, the spawn property, the Gaussian-MoE generative model, presets."""

import numpy as np
import pytest

import moestat as ms
from tests.test_params import make_params


@pytest.fixture(scope="module")
def preset():
    return ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)


def test_shapes_and_input_ranges(preset):
    spec, params = preset
    data = ms.simulate(spec, params, n=200, reps=3, seed=1)
    assert data.X.shape == (3, 200, 32) and data.y.shape == (3, 200) and data.z is None
    assert data.X.min() >= -1 and data.X.max() <= 1
    g = ms.simulate(spec, params, n=10, reps=1, seed=1, inputs="gaussian", low=0, high=1)
    assert g.X.min() < 0  # gaussian inputs ignore the uniform bounds


def test_regression_moments_match_the_model(preset):
    spec, params = preset
    n = 20_000
    data = ms.simulate(spec, params, n=n, reps=2, seed=7)
    resid = data.y - spec.mean(params, data.X)
    # residuals are N(0, 0.1^2): the sample mean has sd 0.1/sqrt(n) = 7e-4 -> 5 sd tolerance 3.5e-3;
    # the sample variance has sd about 0.01*sqrt(2/n) = 1e-4 -> tolerance 5e-4.
    assert np.abs(resid.mean(1)).max() < 3.5e-3
    assert np.abs(resid.var(1) - 0.01).max() < 5e-4
    # E[y] = E[f(X)]: compare with a Monte-Carlo estimate of E f on an independent sample (2 x 1e5 draws).
    ef = spec.mean(params, np.random.default_rng(0).uniform(-1, 1, size=(200_000, 32))).mean()
    sd_y = data.y.std()
    assert abs(data.y.mean() - ef) < 5 * sd_y / np.sqrt(2 * n)


def test_seed_reproducibility_and_spawn_property(preset):
    spec, params = preset
    a = ms.simulate(spec, params, n=50, reps=20, seed=11)
    b = ms.simulate(spec, params, n=50, reps=20, seed=11)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    children = np.random.SeedSequence(11).spawn(20)
    single = ms.simulate(spec, params, n=50, seed=[children[7]])
    np.testing.assert_array_equal(single.X[0], a.X[7])
    np.testing.assert_array_equal(single.y[0], a.y[7])
    fewer = ms.simulate(spec, params, n=50, reps=5, seed=11)
    np.testing.assert_array_equal(fewer.y, a.y[:5])  # adding replicates never changes earlier ones
    other = ms.simulate(spec, params, n=50, reps=2, seed=12)
    assert not np.allclose(other.y, a.y[:2])


def test_mixture_model_latent_frequencies_and_conditional_moments():
    # Constant gates (zero slopes) -> P(z = i) = softmax(b0)_i exactly; 2 experts with distinct noise.
    p = ms.Params(gate_bias=np.array([0.0, np.log(3.0)]), gate_weight=np.zeros((2, 1)),
                  expert_weight=np.array([[2.0], [-1.0]]), expert_bias=np.array([0.5, 0.0]),
                  noise_sd=np.array([0.2, 0.5]))
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
    n = 40_000
    data = ms.simulate(spec, p, n=n, reps=1, seed=3, model="mixture")
    z = data.z[0]
    # P(z=1) = 3/4; binomial sd sqrt(0.75*0.25/n) = 2.2e-3 -> 5 sd tolerance 0.011.
    assert abs(z.mean() - 0.75) < 0.011
    x, y = data.X[0, :, 0], data.y[0]
    for i, (slope, icpt, sd) in enumerate([(2.0, 0.5, 0.2), (-1.0, 0.0, 0.5)]):
        r = y[z == i] - (slope * x[z == i] + icpt)
        assert abs(r.std() - sd) < 0.02 * sd / 0.2  # sd of a sample sd with >= 1e4 draws is < 1%
        assert abs(r.mean()) < 5 * sd / np.sqrt((z == i).sum())


def test_sigmoid_mixture_normalises_gates():
    p = make_params(k=3, d=2, seed=0, noise=True)
    spec = ms.MoE(gate="sigmoid", expert="linear", k=3, d=2)
    data = ms.simulate(spec, p, n=30_000, reps=1, seed=5, model="mixture")
    w = spec.gate_weights(p, data.X[0])
    w = w / w.sum(1, keepdims=True)
    # empirical frequency of each expert vs the mean normalised weight: binomial sd < 0.003 -> tol 0.015
    np.testing.assert_allclose(np.bincount(data.z[0], minlength=3) / 30_000, w.mean(0), atol=0.015)


def test_batched_params_one_per_replicate():
    p = make_params(R=3, k=2, d=2)
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=2, noise_sd=0.0)
    data = ms.simulate(spec, p, n=10, seed=0)
    assert data.n_reps == 3
    np.testing.assert_allclose(data.y[2], spec.mean(p.select(2), data.X[2]), rtol=1e-14)


def test_dataset_frame_and_select(preset):
    spec, params = preset
    data = ms.simulate(spec, params, n=5, reps=2, seed=0)
    f = data.to_frame()
    assert len(f) == 10 and {"rep", "obs", "x0", "x31", "y"} <= set(f.columns)
    assert data.select(1).y.shape == (1, 5)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(n=0), ValueError, "n must be"),
    (dict(n=10, reps=0), ValueError, "reps must be"),
    (dict(n=10, inputs="beta"), ValueError, "valid values"),
    (dict(n=10, low=1.0, high=-1.0), ValueError, "high must exceed low"),
    (dict(n=10, seed="abc"), TypeError, "seed must be"),
    (dict(n=2.5), TypeError, "n must be an integer"),
])
def test_bad_simulation_arguments(preset, kwargs, exc, match):
    spec, params = preset
    with pytest.raises(exc, match=match):
        ms.simulate(spec, params, **kwargs)


def test_presets_follow_the_paper_tables():
    r1 = ms.presets.sigmoid_vs_softmax(regime=1, expert="linear", seed=3)
    r2 = ms.presets.sigmoid_vs_softmax(regime=2, expert="linear", seed=3)
    spec, p1 = r1
    assert (spec.d, spec.k, spec.gate, spec.expert) == (32, 8, "sigmoid", "linear")
    assert np.isclose(spec.noise_sd**2, 0.01)
    zero1 = np.where(~p1.gate_weight.any(1))[0].tolist()
    zero2 = np.where(~r2.params.gate_weight.any(1))[0].tolist()
    assert zero1 == [6, 7] == r1.info["zero_slope_atoms"]
    assert zero2 == [7] == r2.info["zero_slope_atoms"]
    assert r1.info["duplicate_candidates"] == [6, 7] and r2.info["duplicate_candidates"] == list(range(7))
    soft = ms.presets.sigmoid_vs_softmax(regime=2, truth_gate="softmax", seed=3)
    assert soft.spec.gate == "softmax" and "Table 2" in soft.info["source"]


def test_preset_variances_match_their_definitions():
    # pool many draws: sample variance of N(0, v) over m draws has relative sd sqrt(2/m)
    big = ms.presets.sigmoid_vs_softmax(regime=2, d=32, k=400, seed=1).params
    nonzero = big.gate_weight[:-1]
    assert abs(nonzero.var() / (0.01 / 32) - 1) < 5 * np.sqrt(2 / nonzero.size)
    assert abs(big.expert_weight.var() / (1 / 32) - 1) < 5 * np.sqrt(2 / big.expert_weight.size)
    with pytest.raises(ValueError, match="regime must be 1 or 2"):
        ms.presets.sigmoid_vs_softmax(regime=3)


def test_gate_comparison_preset_follows_its_rules():
    for seed in range(6):
        truth = ms.presets.gate_comparison("relu", seed=seed)
        p = truth.params
        assert np.all(np.linalg.norm(p.gate_weight, axis=1) > 0)  # no zero-slope atom
        assert np.all(np.abs(p.expert_bias) <= np.abs(p.expert_weight).sum(1) - 0.25)  # a kink inside the cube
        assert np.all(np.abs(p.gate_bias) <= 2.0)
        omega = np.concatenate([p.gate_weight, p.expert_weight, p.expert_bias[:, None]], 1)
        dist = np.linalg.norm(omega[:, None] - omega[None], axis=-1)[~np.eye(3, dtype=bool)]
        assert dist.min() >= 0.5
        assert truth.info["duplicate"] == [0] and truth.info["draws"] >= 1
        # the same draw for every expert family and either gate (paired designs)
        other = ms.presets.gate_comparison("linear", truth_gate="softmax", seed=seed)
        np.testing.assert_array_equal(other.params.expert_weight, p.expert_weight)
        assert other.spec.gate == "softmax" and other.spec.expert == "linear"
    with pytest.raises(ValueError, match="no draw"):
        ms.presets.gate_comparison("relu", seed=0, bias_bound=1e-6, max_draws=20)


def test_gate_comparison_regime_1_zeroes_the_duplicated_atoms_slope():
    shared = 0
    for seed in range(10):
        one = ms.presets.gate_comparison("gelu", d=3, seed=seed, regime=1)
        two = ms.presets.gate_comparison("gelu", d=3, seed=seed)
        p = one.params
        assert np.all(p.gate_weight[0] == 0) and np.all(np.linalg.norm(p.gate_weight[1:], axis=1) > 0)
        assert one.info["regime"] == 1 and one.info["zero_slope_atoms"] == [0] and one.info["duplicate"] == [0]
        assert two.info["regime"] == 2 and two.info["zero_slope_atoms"] == []
        omega = np.concatenate([p.gate_weight, p.expert_weight, p.expert_bias[:, None]], 1)
        assert np.linalg.norm(omega[:, None] - omega[None], axis=-1)[~np.eye(3, dtype=bool)].min() >= 0.5
        if one.info["draws"] == two.info["draws"]:  # the same draw, but for the zeroed slope
            np.testing.assert_array_equal(p.expert_weight, two.params.expert_weight)
            np.testing.assert_array_equal(p.gate_weight[1:], two.params.gate_weight[1:])
            shared += 1
    assert shared >= 8  # the separation rule rarely rejects a zeroed draw that it accepted with its slope
    with pytest.raises(ValueError, match="regime must be 1"):
        ms.presets.gate_comparison("gelu", regime=3)
