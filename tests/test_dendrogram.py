"""Dendrograms of mixing measures and the DSC (moestat.dendrogram).

Checks: the merge rule and heights against a 3-atom example worked by hand; a split atom merges back exactly at
height 0 with the density unchanged; every greedy step against a brute-force loop over pairs; the invariances of
the softmax gate (common shift, relabelling, temperature); the DSC against an independent numpy likelihood; DSC
recovery of k* = 2 from an over-specified MLE fit; named errors for bad input.
"""

from __future__ import annotations

import itertools
import math
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pytest
from scipy.cluster.hierarchy import is_valid_linkage
from scipy.special import logsumexp
from scipy.stats import norm

import moestat as ms
from moestat.dendrogram import Dendrogram, dissimilarity, dsc, merge_atoms, mixing_dendrogram

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC2 = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
# well separated: expert means 2 + x in [1, 3] and -2 - x in [-3, -1] on U[-1, 1] inputs, noise sd 0.3
TRUTH2 = ms.Params([0.0, 0.0], [[3.0], [0.0]], [[1.0], [-1.0]], [2.0, -2.0], noise_sd=[0.3, 0.3])


def three_atoms() -> ms.Params:
    """Masses e^{beta_0} = 1, 3, 2; hand-worked in test_merge_rule_hand_computed."""
    return ms.Params(gate_bias=[0.0, math.log(3.0), math.log(2.0)], gate_weight=[[0.0], [0.0], [2.0]],
                     expert_weight=[[1.0], [1.0], [-1.0]], expert_bias=[0.0, 0.4, 3.0],
                     noise_sd=[1.0, 1.0, math.sqrt(3.0)])


# ------------------------------------------------------------------------------------------ the merge rule
def test_merge_rule_hand_computed() -> None:
    # By hand (masses m = 1, 3, 2; d = m_i m_j / (m_i + m_j) * (|d beta_1|^2 + |d a|^2 + |d b|^2 + |d sigma^2|)):
    #   d(0,1) = 3/4 * (0 + 0 + 0.16 + 0) = 0.12
    #   d(0,2) = 2/3 * (4 + 4 + 9 + 2) = 38/3
    #   d(1,2) = 6/5 * (4 + 4 + 6.76 + 2) = 20.112
    # merge 0+1: mass 4, beta_1 = 0, a = 1, b = (0 + 3 * 0.4) / 4 = 0.3, sigma^2 = 1;
    # then d({0,1}, 2) = 8/6 * (4 + 4 + 2.7^2 + 2) = 69.16/3 and the root: mass 6, beta_1 = 4/6, a = 2/6,
    # b = (4 * 0.3 + 2 * 3) / 6 = 1.2, sigma^2 = (4 * 1 + 2 * 3) / 6 = 5/3.
    p = three_atoms()
    D = dissimilarity(p, normalize="none")
    np.testing.assert_allclose([D[0, 1], D[0, 2], D[1, 2]], [0.12, 38 / 3, 20.112], rtol=1e-13)
    assert np.allclose(D, D.T) and np.isinf(np.diag(D)).all()

    tree = mixing_dendrogram(p, normalize="none")
    np.testing.assert_allclose(tree.heights, [0.12, 69.16 / 3], rtol=1e-13)
    want2 = ms.Params([math.log(4.0), math.log(2.0)], [[0.0], [2.0]], [[1.0], [-1.0]], [0.3, 3.0],
                      noise_sd=[1.0, math.sqrt(3.0)])
    want1 = ms.Params([math.log(6.0)], [[2 / 3]], [[1 / 3]], [1.2], noise_sd=[math.sqrt(5 / 3)])
    assert tree.levels[3].allclose(p, rtol=0, atol=0)
    assert tree.levels[2].allclose(want2, rtol=1e-13, atol=1e-14)
    assert tree.levels[1].allclose(want1, rtol=1e-13, atol=1e-14)
    assert tree.members[0][2] == ((0, 1), (2,))
    # scipy numbering: the first merge (atoms 0 and 1) is cluster 3, merged with leaf 2 at the second step
    np.testing.assert_allclose(tree.linkage, [[0, 1, 0.12, 2], [3, 2, 69.16 / 3, 3]], rtol=1e-13)
    assert is_valid_linkage(tree.linkage)
    assert tree.level_height(3) == pytest.approx(0.12, rel=1e-13)
    assert tree.level_height(2) == pytest.approx(69.16 / 3, rel=1e-13)
    assert math.isnan(tree.level_height(1))

    tidy = tree.tidy()
    assert tidy[["k_from", "k_to", "leaves", "n_leaves"]].values.tolist() == [[3, 2, "0+1", 2], [2, 1, "0+1+2", 3]]
    # default normalisation: masses divided by their total 6 (preserved by merging), so every height is /6
    np.testing.assert_allclose(mixing_dendrogram(p).heights, [0.12 / 6, 69.16 / 18], rtol=1e-13)
    # merge_atoms is the same step on its own
    assert merge_atoms(p, 1, 0).allclose(want2, rtol=1e-13, atol=1e-14)


def test_merge_adds_gate_masses_and_keeps_the_others() -> None:
    # at x = 0 the softmax weights are the normalised masses e^{beta_0}: merging two atoms must give the merged
    # atom the sum of their weights and leave every other weight unchanged (softmax computed independently here)
    rng = np.random.default_rng(3)
    p = ms.Params(rng.normal(size=4), rng.normal(size=(4, 2)), rng.normal(size=(4, 2)), rng.normal(size=4),
                  noise_sd=rng.uniform(0.5, 1.5, size=4))
    w = np.exp(p.gate_bias) / np.exp(p.gate_bias).sum()
    for i, j in itertools.combinations(range(4), 2):
        q = merge_atoms(p, i, j)
        wq = np.exp(q.gate_bias) / np.exp(q.gate_bias).sum()
        others = [m for m in range(4) if m not in (i, j)]
        np.testing.assert_allclose(wq[i], w[i] + w[j], rtol=1e-13)  # merged atom sits at min(i, j) = i
        np.testing.assert_allclose(np.delete(wq, i), w[others], rtol=1e-13)


def _brute_d(p: ms.Params, i: int, j: int, scale: float) -> float:
    """The dissimilarity written out term by term, in python floats."""
    mi, mj = math.exp(p.gate_bias[i]) / scale, math.exp(p.gate_bias[j]) / scale
    sq = sum((p.gate_weight[i][c] - p.gate_weight[j][c]) ** 2 for c in range(p.d))
    sq += sum((p.expert_weight[i][c] - p.expert_weight[j][c]) ** 2 for c in range(p.d))
    sq += (p.expert_bias[i] - p.expert_bias[j]) ** 2
    return float(1.0 / (1.0 / mi + 1.0 / mj) * (sq + abs(p.noise_sd[i] ** 2 - p.noise_sd[j] ** 2)))


def test_every_step_merges_the_closest_pair() -> None:
    rng = np.random.default_rng(11)
    K = 6
    p = ms.Params(rng.normal(size=K), rng.normal(size=(K, 2)), rng.normal(size=(K, 2)), rng.normal(size=K),
                  noise_sd=rng.uniform(0.3, 2.0, size=K))
    tree = mixing_dendrogram(p)
    scale = float(np.exp(p.gate_bias).sum())
    for k in range(K, 1, -1):
        level = tree.levels[k]
        pairs = {(i, j): _brute_d(level, i, j, scale) for i, j in itertools.combinations(range(k), 2)}
        (i, j), best = min(pairs.items(), key=lambda kv: kv[1])
        assert tree.level_height(k) == pytest.approx(best, rel=1e-12)
        # the atoms merged at this step are the brute-force argmin pair of this level
        clusters = tree.members[0][k]
        assert tuple(sorted(clusters[i] + clusters[j])) in tree.members[0][k - 1]
        # the next level is this level with that pair merged (by the formula, written out here)
        mi, mj = math.exp(level.gate_bias[i]), math.exp(level.gate_bias[j])
        wi, wj = mi / (mi + mj), mj / (mi + mj)
        nxt = tree.levels[k - 1]
        assert nxt.gate_bias[i] == pytest.approx(math.log(mi + mj), rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(nxt.expert_weight[i], wi * level.expert_weight[i] + wj * level.expert_weight[j],
                                   rtol=1e-12, atol=1e-13)
        assert nxt.noise_sd[i] ** 2 == pytest.approx(wi * level.noise_sd[i] ** 2 + wj * level.noise_sd[j] ** 2,
                                                     rel=1e-12)


def test_split_atom_merges_back_exactly_at_height_zero() -> None:
    # atom 0 of the truth split into two copies with masses 0.3 and 0.7 of e^{beta_00}: the same density
    b0 = TRUTH2.gate_bias[0]
    split = ms.Params([b0 + math.log(0.3), TRUTH2.gate_bias[1], b0 + math.log(0.7)],
                      [TRUTH2.gate_weight[0], TRUTH2.gate_weight[1], TRUTH2.gate_weight[0]],
                      [TRUTH2.expert_weight[0], TRUTH2.expert_weight[1], TRUTH2.expert_weight[0]],
                      [TRUTH2.expert_bias[0], TRUTH2.expert_bias[1], TRUTH2.expert_bias[0]],
                      noise_sd=[0.3, 0.3, 0.3])
    tree = mixing_dendrogram(split, SPEC2.with_k(3))
    assert tree.heights[0] == 0.0  # identical atoms: every difference is exactly 0
    assert tree.members[0][2] == ((0, 2), (1,))
    # log(0.3 e^b + 0.7 e^b) = b up to rounding: the atom comes back (1e-12: a few ulps of the values)
    assert tree.levels[2].allclose(TRUTH2, rtol=1e-12, atol=1e-12)
    data = ms.simulate(SPEC2, TRUTH2, n=300, seed=5, model="mixture")
    X, y = data.X[0], data.y[0]
    ll_truth = SPEC2.loglik(TRUTH2, X, y)
    # the density is unchanged by the split and by the merge: equal log-likelihoods (1e-10 on sums of 300 terms
    # of size ~1: rounding only)
    assert SPEC2.with_k(3).loglik(split, X, y) == pytest.approx(ll_truth, abs=1e-10)
    assert SPEC2.loglik(tree.levels[2], X, y) == pytest.approx(ll_truth, abs=1e-10)


# ------------------------------------------------------------------------------------------- invariances
def _random_params(seed: int, K: int = 5, d: int = 2) -> ms.Params:
    rng = np.random.default_rng(seed)
    return ms.Params(rng.normal(size=K), rng.normal(size=(K, d)), rng.normal(size=(K, d)), rng.normal(size=K),
                     noise_sd=rng.uniform(0.3, 2.0, size=K))


def test_common_shift_of_the_gate() -> None:
    # a softmax gate is unchanged by beta_0 -> beta_0 + t0, beta_1 -> beta_1 + t1 for every atom
    p = _random_params(2)
    t0, t1 = 1.7, np.array([0.4, -2.0])
    q = ms.Params(p.gate_bias + t0, p.gate_weight + t1, p.expert_weight, p.expert_bias, noise_sd=p.noise_sd)
    a, b = mixing_dendrogram(p), mixing_dendrogram(q)
    assert a.members == b.members
    np.testing.assert_allclose(b.heights, a.heights, rtol=1e-12)  # "total": invariant
    a0, b0 = mixing_dendrogram(p, normalize="none"), mixing_dendrogram(q, normalize="none")
    np.testing.assert_allclose(b0.heights, math.exp(t0) * a0.heights, rtol=1e-12)  # "none": scaled by e^{t0}
    for k in a.levels:  # the merged measures are the shifted merged measures
        la, lb = a.levels[k], b.levels[k]
        np.testing.assert_allclose(lb.gate_bias, la.gate_bias + t0, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lb.gate_weight, la.gate_weight + t1, rtol=1e-12, atol=1e-12)


def test_relabelling_the_atoms() -> None:
    p = _random_params(4)
    perm = [3, 0, 4, 1, 2]
    a, b = mixing_dendrogram(p), mixing_dendrogram(p.permute(perm))
    np.testing.assert_allclose(b.heights, a.heights, rtol=1e-12)
    relabel = {new: old for new, old in enumerate(perm)}
    for k in a.levels:
        got = {tuple(sorted(relabel[m] for m in c)) for c in b.members[0][k]}
        assert got == set(a.members[0][k])


def test_temperature_uses_the_effective_logits() -> None:
    # with temperature tau the gate is softmax((beta_1 x + beta_0) / tau): scaling the gate by tau and using tau
    # must give the same heights and the same levels scaled by tau
    p = three_atoms()
    tau = 2.5
    q = ms.Params(tau * p.gate_bias, tau * p.gate_weight, p.expert_weight, p.expert_bias, noise_sd=p.noise_sd)
    spec = ms.MoE(gate="softmax", expert="linear", k=3, d=1, temperature=tau)
    a, b = mixing_dendrogram(p), mixing_dendrogram(q, spec)
    np.testing.assert_allclose(b.heights, a.heights, rtol=1e-12)
    np.testing.assert_allclose(b.levels[1].gate_bias, tau * a.levels[1].gate_bias, rtol=1e-12)
    np.testing.assert_allclose(b.levels[1].gate_weight, tau * a.levels[1].gate_weight, rtol=1e-12)
    assert b.temperature == tau


def test_batched_params_loop_over_replicates() -> None:
    p, q = _random_params(7, K=4), _random_params(8, K=4)
    tree = mixing_dendrogram(ms.Params.stack([p, q]))
    one, two = mixing_dendrogram(p), mixing_dendrogram(q)
    assert tree.is_batched and tree.heights.shape == (2, 3) and tree.linkage.shape == (2, 3, 4)
    np.testing.assert_allclose(tree.heights, [one.heights, two.heights], rtol=0)
    for k in range(1, 5):
        assert tree.levels[k].select(0).allclose(one.levels[k], rtol=0, atol=0)
        assert tree.levels[k].select(1).allclose(two.levels[k], rtol=0, atol=0)
    assert tree.members == [one.members[0], two.members[0]]
    assert tree.tidy()["rep"].tolist() == [0, 0, 0, 1, 1, 1]
    assert len(tree.glance()) == 2 and set(tree.atoms()["level"]) == {1, 2, 3, 4}


# --------------------------------------------------------------------------------------------------- DSC
def _numpy_loglik(p: ms.Params, X: np.ndarray, y: np.ndarray) -> float:
    """Softmax-gated Gaussian MoE log-likelihood written directly with scipy (independent of moestat.MoE)."""
    logits = X @ np.asarray(p.gate_weight).T + np.asarray(p.gate_bias)
    log_gate = logits - logsumexp(logits, axis=1, keepdims=True)
    means = X @ np.asarray(p.expert_weight).T + np.asarray(p.expert_bias)
    comp = norm.logpdf(y[:, None], loc=means, scale=np.asarray(p.noise_sd))
    return float(logsumexp(log_gate + comp, axis=1).sum())


def test_dsc_formula_against_an_independent_likelihood() -> None:
    data = ms.simulate(SPEC2, TRUTH2, n=400, seed=21, model="mixture")
    X, y = data.X[0], data.y[0]
    p = _random_params(9, K=4, d=1)
    tree = mixing_dendrogram(p)
    for omega in (None, 2.0):
        table = dsc(tree, X, y, SPEC2, omega=omega)
        w = math.log(400) if omega is None else omega
        assert table["k"].tolist() == [4, 3, 2, 1]
        for row in table.itertuples():
            ll = _numpy_loglik(tree.levels[row.k], X, y)
            assert row.loglik == pytest.approx(ll, rel=1e-10)  # two float64 evaluations of one sum
            if row.k >= 2:
                assert row.dsc == pytest.approx(-(tree.level_height(row.k) + w * ll / 400), rel=1e-10)
            else:
                assert math.isnan(row.dsc) and not row.selected
        best = table[table["k"] >= 2].sort_values("dsc")["k"].iloc[0]
        assert table.loc[table["selected"], "k"].tolist() == [best] and table.attrs["best_k"] == best


@pytest.mark.filterwarnings("ignore::moestat.DegenerateFitWarning")
def test_dsc_recovers_two_well_separated_experts() -> None:
    # Data seed 0, fit seed 100 (5 random starts), n = 1000, K = 4.  Why the margin is safe: at level 2 the height is
    # the separation of the two true experts, about 1/(1/0.5 + 1/0.5) * (3^2 + 2^2 + 4^2) = 7.25 (masses 1/2 each,
    # gate slopes 3 vs 0, expert slopes 1 vs -1, intercepts 2 vs -2); at levels 3 and 4 the heights merge two fitted
    # copies of one expert (observed 0.007 and 0.011), and the average log-likelihood is within 0.03 nats of level
    # 2's, which omega_n = log 1000 = 6.9 turns into < 0.3; level 1 loses about 24 nats per observation.  Observed:
    # DSC(2) = -2.55 against 4.57 at k = 4, a margin of 7 where the test asks for 3.
    data = ms.simulate(SPEC2, TRUTH2, n=1000, seed=0, model="mixture")
    X, y = data.X[0], data.y[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_mle(SPEC2.with_k(4), X, y, restarts=5, seed=100)
    tree = mixing_dendrogram(fit.params, SPEC2.with_k(4))
    table = dsc(tree, X, y, SPEC2)
    assert table.attrs["best_k"] == 2
    crit = table.set_index("k")["dsc"]
    assert min(crit[3], crit[4]) - crit[2] > 3.0
    # the merged level-2 measure is close to the truth (heights are not all that is right): expert intercepts
    lvl2 = tree.levels[2]
    assert sorted(lvl2.expert_bias) == pytest.approx([-2.0, 2.0], abs=0.15)  # ~10 SE of a mean of 500 points


# ------------------------------------------------------------------------------------------------ figure
def test_plot_draws_the_merges() -> None:
    tree = mixing_dendrogram(three_atoms(), normalize="none")
    ax = tree.plot()
    try:
        assert ax.get_ylim()[1] >= 69.16 / 3
        assert sorted(t.get_text() for t in ax.get_xticklabels()) == ["atom 0", "atom 1", "atom 2"]
        drawn = sum(len(c.get_segments()) for c in ax.collections)
        assert drawn == 2  # one U-shaped link per merge
        assert ax.get_title().startswith("Dendrogram of the mixing measure")
    finally:
        plt.close(ax.figure)


# ------------------------------------------------------------------------------------------------ errors
def test_bad_input_named_errors() -> None:
    p = three_atoms()
    with pytest.raises(ValueError, match=r"spec\.gate='sigmoid'"):
        mixing_dendrogram(p, ms.MoE(gate="sigmoid", expert="linear", k=3, d=1))
    with pytest.raises(ValueError, match=r"spec\.expert='relu'"):
        mixing_dendrogram(p, ms.MoE(gate="softmax", expert="relu", k=3, d=1))
    no_sd = ms.Params(p.gate_bias, p.gate_weight, p.expert_weight, p.expert_bias)
    with pytest.raises(ValueError, match=r"params\.noise_sd is None"):
        mixing_dendrogram(no_sd)
    with pytest.raises(TypeError, match=r"moestat\.Params"):
        mixing_dendrogram({"gate_bias": [0.0]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k=3 experts but the MoE spec has k=2"):
        mixing_dendrogram(p, SPEC2)
    with pytest.raises(ValueError, match="normalize='sum'"):
        mixing_dendrogram(p, normalize="sum")
    with pytest.raises(ValueError, match="i and j must be two different atoms"):
        merge_atoms(p, 1, 1)
    tree = mixing_dendrogram(p)
    X, y = np.zeros((5, 1)), np.zeros(5)
    with pytest.raises(ValueError, match="omega=0"):
        dsc(tree, X, y, SPEC2, omega=0)
    with pytest.raises(ValueError, match=r"spec\.temperature=2\.0 differs"):
        dsc(tree, X, y, ms.MoE(gate="softmax", expert="linear", k=2, d=1, temperature=2.0))
    with pytest.raises(ValueError, match=r"spec\.gate='topk'"):
        dsc(tree, X, y, ms.MoE(gate="topk", expert="linear", k=3, d=1, top_k=1))
    with pytest.raises(TypeError, match="Dendrogram"):
        dsc(p, X, y, SPEC2)  # type: ignore[arg-type]
    single = mixing_dendrogram(ms.Params([0.0], [[0.0]], [[1.0]], [0.0], noise_sd=[1.0]))
    assert isinstance(single, Dendrogram) and single.heights.shape == (0,)
    with pytest.raises(ValueError, match="one atom"):
        dsc(single, X, y, SPEC2)
    with pytest.raises(ValueError, match="k=7 is not a level"):
        tree.level_height(7)


def test_select_k_by_dsc_reads_the_dendrogram_of_the_largest_fit() -> None:
    """select_k(criterion="dsc") merges the atoms of its k = max(ks) fit; on the well-separated two-expert truth it
    chooses k = 2 (the margin argument of the test above) while reporting every k's BIC beside DSC."""
    data = ms.simulate(SPEC2, TRUTH2, n=1000, seed=0, model="mixture")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sel = ms.select_k(data.X[0], data.y[0], ks=(1, 2, 3, 4), criterion="dsc", seed=3)
    table = sel.table.set_index("k")
    assert sel.best_k == 2 and sel.criterion == "dsc"
    assert np.isnan(table.loc[1, "dsc"]) and table.loc[2, "dsc"] < table.loc[[3, 4], "dsc"].min() - 3
    with pytest.raises(ValueError, match="criterion='dsc'"):
        ms.select_k(data.X[0], data.y[0], ks=(1, 2), criterion="dsc")
