"""chowdhury2023 patch-routing data: the generators match their definitions (§4.2, Definition D.3)."""

import numpy as np
import pytest
from scipy import stats

import moestat as ms
from moestat.simulators.patches import DISCRIMINATIVE, _digit_pools

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def synth():
    return ms.simulate_patches(4000, reps=2, seed=11, n_patches=12, d=24, p=5, delta_d=0.2, delta_r=0.5,
                               n_confusers=(2, 1), set_diameter=0.3)


@pytest.fixture(scope="module")
def digits():
    return ms.simulate_patches(3000, reps=2, seed=5, variant="digits", n_patches=9)


def test_shapes_unit_norms_and_pattern_geometry(synth):
    d = synth
    assert d.X.shape == (2, 4000, 12, 24) and d.y.shape == (2, 4000) and d.set_id.shape == (2, 4000, 12)
    np.testing.assert_allclose(np.linalg.norm(d.X, axis=-1), 1.0, atol=1e-12)
    b = d.bank
    assert np.isclose(b.o1 @ b.o2, 0.2) and np.isclose(np.linalg.norm(b.o2), 1.0)
    irr = d.X[d.set_id != DISCRIMINATIVE]
    # |<o_i, q>| <= delta_r for every irrelevant q (§4.2); neutral sets are orthogonal to span(o1, o2)
    assert np.abs(irr @ b.o1).max() <= 0.5 + 1e-12 and np.abs(irr @ b.o2).max() <= 0.5 + 1e-12
    neutral = d.X[(d.set_id >= 0) & (d.set_id < 5)]
    assert np.abs(neutral @ b.o1).max() < 1e-12
    # every point lies within set_diameter / 2 of its set centre
    ids = d.set_id[d.set_id != DISCRIMINATIVE]
    assert np.linalg.norm(irr - b.centres[ids], axis=1).max() <= 0.15 + 1e-12


def test_exactly_one_discriminative_patch_and_the_label_rule(synth):
    d = synth
    assert ((d.set_id == DISCRIMINATIVE).sum(-1) == 1).all()
    disc = np.take_along_axis(d.X, d.pos[..., None, None], axis=2)[:, :, 0]
    expected = np.where((d.y == 1)[..., None], d.bank.o1, d.bank.o2)
    np.testing.assert_array_equal(disc, expected)
    np.testing.assert_array_equal(np.take_along_axis(d.set_id, d.pos[..., None], axis=2)[..., 0], DISCRIMINATIVE)
    # no irrelevant patch equals a discriminative pattern
    irr = d.X[d.set_id != DISCRIMINATIVE]
    assert np.linalg.norm(irr - d.bank.o1, axis=1).min() > 0.1
    assert np.linalg.norm(irr - d.bank.o2, axis=1).min() > 0.1


def test_class_balance_uniform_position_and_class_free_irrelevant_law(synth):
    d = synth
    y = d.y.ravel()
    # P(y=+1) = 1/2: with 8000 labels the sd of the mean of 1{y=1} is 0.0056; allow 4 sd
    assert abs((y == 1).mean() - 0.5) < 4 * 0.5 / np.sqrt(y.size)
    # position uniform on [n]: chi-square goodness of fit (p < 1e-4 would flag a non-uniform law)
    counts = np.bincount(d.pos.ravel(), minlength=12)
    assert stats.chisquare(counts).pvalue > 1e-4
    # the irrelevant sets have the same law in both classes (chi-square homogeneity of set counts)
    ids = d.set_id
    table = np.stack([np.bincount(ids[d.y == c].ravel() + 1, minlength=8) for c in (1, -1)])
    assert stats.chi2_contingency(table[:, 1:]).pvalue > 1e-4
    # each sample carries exactly n_confusers = (2, 1) confuser patches
    assert ((ids == 5).sum(-1) == 2).all() and ((ids == 6).sum(-1) == 1).all()


def test_confuser_counts_and_l_star(synth):
    d = synth
    # <o1 - o2, c_+> = 2 delta_r = 1 > (1 - delta_d)/2 = 0.4, so the 3 confusers count (Definition D.3)
    assert (d.confuser_counts() == 3).all() and d.l_star() == 4
    none = ms.simulate_patches(200, seed=1, n_patches=8, d=16)
    assert none.l_star() == 1


def test_reproducible_and_replicates_respawn():
    a = ms.simulate_patches(50, reps=3, seed=4, n_patches=6, d=10)
    b = ms.simulate_patches(50, reps=3, seed=4, n_patches=6, d=10)
    np.testing.assert_array_equal(a.X, b.X)
    one = ms.simulate_patches(50, seed=[a.seeds[2]], n_patches=6, d=10)
    np.testing.assert_array_equal(one.X[0], a.X[2])
    np.testing.assert_array_equal(one.y[0], a.y[2])
    # the pattern bank is the truth: shared across seeds, changed by bank_seed
    c = ms.simulate_patches(5, seed=9, n_patches=6, d=10)
    np.testing.assert_array_equal(c.bank.centres, a.bank.centres)
    assert not np.allclose(ms.simulate_patches(5, seed=9, n_patches=6, d=10, bank_seed=1).bank.centres,
                           a.bank.centres)


def test_digits_variant_label_rule_norms_and_disjoint_pools(digits):
    d = digits
    assert d.X.shape == (2, 3000, 9, 64)
    np.testing.assert_allclose(np.linalg.norm(d.X, axis=-1), 1.0, atol=1e-12)
    assert ((d.set_id == DISCRIMINATIVE).sum(-1) == 1).all()
    pools = _digit_pools("unit", 0, 0.7)
    disc = np.take_along_axis(d.X, d.pos[..., None, None], axis=2)[:, :, 0]

    def member(rows, pool):
        return (np.abs(rows[:, None, :] - pool[None]).max(-1) < 1e-12).any(1)

    assert member(disc[d.y == 1][:600], pools["train"][1]).all()    # digit "1" <-> y = +1
    assert member(disc[d.y == -1][:600], pools["train"][0]).all()   # digit "0" <-> y = -1
    irr = d.X[0][d.set_id[0] == 3][:200]                      # set 3 = digit "5"
    assert member(irr, pools["train"][5]).all()
    assert abs((d.y == 1).mean() - 0.5) < 4 * 0.5 / np.sqrt(d.y.size)
    test = ms.simulate_patches(300, seed=6, variant="digits", n_patches=9, split="test")
    tdisc = np.take_along_axis(test.X, test.pos[..., None, None], axis=2)[0, :, 0]
    assert not member(tdisc, np.concatenate([pools["train"][0], pools["train"][1]])).any()
    raw = ms.simulate_patches(20, seed=6, variant="digits", scale="raw")
    assert raw.X.max() <= 1.0 and raw.X.min() >= 0.0


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"l": 16}, "l=16 must be smaller"),
    ({"l": 20, "n_patches": 8}, "smaller than n_patches"),
    ({"n_confusers": (10, 10)}, "leaves no room"),
    ({"n_confusers": (1, 1), "delta_r": 0.8}, "infeasible"),
    ({"delta_d": 1.0}, "delta_d"),
    ({"delta_r": -0.1}, "delta_r"),
    ({"variant": "mnist"}, "variant"),
    ({"n_confusers": -1}, "n_confusers"),
    ({"variant": "digits", "split": "val"}, "split"),
    ({"variant": "digits", "n_confusers": 1}, "synthetic variant only"),
    ({"n_patches": 1}, "n_patches"),
])
def test_bad_input_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ms.simulate_patches(10, seed=0, **kwargs)


def test_balanced_labels_give_balanced_prefixes_and_fix_the_router_imbalance():
    from moestat.deep import fit_pmoe

    bal = ms.simulate_patches(64, reps=8, seed=3, n_patches=32, d=64, balanced=True)
    assert (bal.y.reshape(8, 32, 2).sum(-1) == 0).all()         # every pair (hence even prefix) balanced
    iid = ms.simulate_patches(64, reps=8, seed=3, n_patches=32, d=64)
    test = ms.simulate_patches(500, seed=4, n_patches=32, d=64)
    hit = {}
    for name, data in (("iid", iid), ("balanced", bal)):
        h = fit_pmoe(data, l=2, m=2, epochs=1, seed=0).routing_hit_rate(test)
        hit[name] = h.pivot(index="rep", columns="cls", values="hit")
    # i.i.d. labels: the router's (n-1) * mean(y) * mean-pattern term pushes the class whose sign mean(y) has out
    # of the top-l (on top of the set-count noise of Lemma E.3, O(n / sqrt(N_r))); balanced labels remove that term.
    # At these seeds: i.i.d. 7 of 16 (replicate, class) cells fail, balanced 1 of 16.
    fail_iid, fail_bal = hit["iid"] < 0.5, hit["balanced"] < 0.5
    assert fail_iid.to_numpy().sum() >= 4 and fail_bal.to_numpy().sum() <= 2
    ybar = iid.y.mean(1)
    one = fail_iid.sum(axis=1) == 1
    failing_class = np.where(fail_iid[1], 1, -1)
    assert one.sum() >= 3 and (failing_class[one] == np.sign(ybar[one])).all()
