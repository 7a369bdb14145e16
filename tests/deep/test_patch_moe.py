"""pMoE / CNN of chowdhury2023: eq. (1), (4) corrected, (5), (6), (21), (26), routing, batching, bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.deep.patch_moe import (
    cnn_logits,
    expert_choice_topl,
    fit_cnn,
    fit_pmoe,
    pmoe_logits,
    router_gradient_eq26,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _rand_model(rng, L, k, me, d, router_scale=1.0):
    t = lambda a: torch.as_tensor(a, dtype=torch.float64)  # noqa: E731
    return (t(rng.normal(size=(L, k, d)) * router_scale), t(rng.normal(size=(L, k, me, d))),
            t(rng.normal(size=(L, k, me))))


def _pmoe_loop(x, router, W, a, l, gating, scale):
    """eq. (1) written out with loops for one sample: the independent reference."""
    n = x.shape[0]
    f = 0.0
    for s in range(router.shape[0]):
        g = x @ router[s]
        J = np.argsort(-g)[:l]
        if gating == "hard":
            G = np.ones(l)
        elif gating == "softmax_selected":
            G = np.exp(g[J]) / np.exp(g[J]).sum()
        else:
            G = (np.exp(g) / np.exp(g).sum())[J]
        for r in range(W.shape[1]):
            f += a[s, r] / (l if scale == "l" else n) * sum(max(W[s, r] @ x[j], 0.0) * G[q] for q, j in enumerate(J))
    return f


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 12), k=st.integers(1, 4), data=st.data())
def test_expert_choice_selects_exactly_l_top_patches_per_expert(n, k, data):
    l = data.draw(st.integers(1, n - 1))
    seed = data.draw(st.integers(0, 2**31 - 1))
    scores = torch.as_tensor(np.random.default_rng(seed).normal(size=(3, k, n)))
    vals, idx = expert_choice_topl(scores, l)
    assert idx.shape == (3, k, l)
    for b in range(3):
        for s in range(k):
            chosen = set(idx[b, s].tolist())
            assert len(chosen) == l                                        # l distinct patches
            brute = set(np.argsort(-scores[b, s].numpy())[:l].tolist())    # brute-force top-l
            assert chosen == brute
    np.testing.assert_array_equal(vals.numpy(), torch.gather(scores, -1, idx).numpy())


@pytest.mark.parametrize("gating", ["hard", "softmax_selected", "softmax_all"])
@pytest.mark.parametrize("scale", ["l", "n"])
def test_pmoe_logits_match_eq1_written_out(gating, scale):
    rng = np.random.default_rng(0)
    L, B, n, d, k, me, l = 2, 3, 7, 5, 3, 4, 3
    X = torch.as_tensor(rng.normal(size=(L, B, n, d)))
    router, W, a = _rand_model(rng, L, k, me, d)
    f = pmoe_logits(X, router, W, a, l=l, gating=gating, scale=scale).numpy()
    ref = [[_pmoe_loop(X[i, b].numpy(), router[i].numpy(), W[i].numpy(), a[i].numpy(), l, gating, scale)
            for b in range(B)] for i in range(L)]
    np.testing.assert_allclose(f, ref, rtol=1e-12, atol=1e-12)


def test_cnn_matches_eq5_and_is_pmoe_with_one_expert_taking_all_patches():
    rng = np.random.default_rng(1)
    L, B, n, d, m = 2, 4, 6, 5, 7
    X = torch.as_tensor(rng.normal(size=(L, B, n, d)))
    W = torch.as_tensor(rng.normal(size=(L, m, d)))
    a = torch.as_tensor(rng.normal(size=(L, m)))
    f = cnn_logits(X, W, a).numpy()
    ref = np.einsum("lm,lbmn->lb", a.numpy(), np.maximum(np.einsum("lbnd,lmd->lbmn", X.numpy(), W.numpy()), 0)) / n
    np.testing.assert_allclose(f, ref, rtol=1e-12)
    # §3.1: (5) is (1) with k = 1, l = n, G = 1 (and 1/n normalisation)
    router = torch.as_tensor(rng.normal(size=(L, 1, d)))
    g = pmoe_logits(X, router, W[:, None], a[:, None], l=n, gating="hard", scale="l").numpy()
    np.testing.assert_allclose(g, f, rtol=1e-12)


def test_router_gradient_matches_eq26_autograd_and_finite_differences():
    """chowdhury2023 eq. (26) vs central differences of the per-sample logistic loss and vs autograd."""
    rng = np.random.default_rng(3)
    n, d, k, me, l = 8, 6, 3, 4, 3
    for trial in range(5):
        x = rng.normal(size=(n, d))
        y = (-1) ** trial
        router, W, a = (v[0].numpy() for v in _rand_model(rng, 1, k, me, d))
        gaps = np.sort(x @ router.T, axis=0)[::-1]
        assert (gaps[l - 1] - gaps[l] > 1e-3).all()  # the top-l sets are locally constant: FD is valid

        def loss(R, x=x, y=y, W=W, a=a):
            f = pmoe_logits(torch.as_tensor(x)[None, None], torch.as_tensor(R)[None], torch.as_tensor(W)[None],
                            torch.as_tensor(a)[None], l=l, gating="softmax_selected")
            return float(torch.nn.functional.softplus(-y * f))

        h = 1e-6
        fd = np.zeros_like(router)
        for s in range(k):
            for c in range(d):
                e = np.zeros_like(router)
                e[s, c] = h
                fd[s, c] = (loss(router + e) - loss(router - e)) / (2 * h)
        eq26 = router_gradient_eq26(x, y, router, W, a, l=l)
        # central differences have O(h^2) truncation and O(eps/h) ~ 1e-10 rounding error
        np.testing.assert_allclose(eq26, fd, atol=1e-8, rtol=1e-6)
        Rt = torch.as_tensor(router, dtype=torch.float64).requires_grad_(True)
        f = pmoe_logits(torch.as_tensor(x)[None, None], Rt[None], torch.as_tensor(W)[None],
                        torch.as_tensor(a)[None], l=l, gating="softmax_selected")
        (g,) = torch.autograd.grad(torch.nn.functional.softplus(-y * f).sum(), Rt)
        np.testing.assert_allclose(g.numpy(), eq26, atol=1e-12, rtol=1e-10)


def test_one_pass_single_batch_step_is_eq21_cnn_gradient():
    """epochs=1 with B = N is one SGD step; the step must be -lr times eq. (21) averaged over the batch."""
    data = ms.simulate_patches(8, seed=2, n_patches=5, d=6)
    fit0 = fit_cnn(data, m=6, lr=1e-300, batch_size=8, epochs=1, seed=4)  # ~ the initial weights
    fit1 = fit_cnn(data, m=6, lr=0.3, batch_size=8, epochs=1, seed=4)
    W0, a = fit0.params["W"][0].numpy(), fit0.params["a"][0].numpy()
    X, y = data.X[0], data.y[0]
    f = (np.maximum(np.einsum("ind,md->imn", X, W0), 0).mean(-1)) @ a
    v = 1 / (1 + np.exp(y * f))
    act = (np.einsum("ind,md->imn", X, W0) >= 0)
    grad = np.zeros_like(W0)
    for i in range(8):   # eq. (21): -y a_r v (1/n) sum_j x_j 1{<w_r, x_j> >= 0}
        grad += -y[i] * v[i] * a[:, None] * np.einsum("mn,nd->md", act[i], X[i]) / X.shape[1]
    np.testing.assert_allclose(fit1.params["W"][0].numpy(), W0 - 0.3 * grad / 8, atol=1e-12)
    assert fit1.config["one_pass"]


def test_separate_router_closed_form_equals_sgd_and_routes_discriminative_patches():
    data = ms.simulate_patches(400, reps=2, seed=7, n_patches=10, d=16)
    kw = {"m": 4, "l": 2, "epochs": 1, "router_epochs": 3, "router_batch_size": 20, "seed": 1, "sizes": [200, 400]}
    cf = fit_pmoe(data, router_method="closed_form", **kw)
    sgd = fit_pmoe(data, router_method="sgd", **kw)
    # loss (6) has a weight-free gradient: the SGD end point is the closed form when B_r divides N_r
    np.testing.assert_allclose(sgd.params["router"].numpy(), cf.params["router"].numpy(), rtol=1e-10, atol=1e-12)
    test = ms.simulate_patches(500, seed=8, n_patches=10, d=16)
    hits = cf.routing_hit_rate(test)
    assert (hits["hit"] == 1.0).all() and set(hits["expert"]) == {0, 1}  # Lemma 4.1 with l >= l* = 1


def test_routing_threshold_with_same_side_confusers():
    """Confusers with <o1-o2, q> = 2 delta_r = 1.2 > 1 outrank o; o is routed iff l exceeds their number."""
    kw = {"n_patches": 12, "d": 32, "delta_r": 0.6, "n_confusers": (3, 3)}
    train = ms.simulate_patches(600, seed=1, **kw)
    test = ms.simulate_patches(400, seed=2, **kw)
    rates = {l: fit_pmoe(train, m=2, l=l, epochs=1, seed=0).routing_hit_rate(test)["hit"].min() for l in (3, 4)}
    assert rates[3] == 0.0 and rates[4] == 1.0


def test_batched_lanes_equal_a_per_lane_loop():
    data = ms.simulate_patches(60, reps=2, seed=3, n_patches=6, d=8)
    for fn, kw in [(fit_pmoe, {"training": "joint", "k": 2, "l": 3}), (fit_pmoe, {"l": 2}), (fit_cnn, {})]:
        batched = fn(data, m=4, epochs=2, batch_size=7, sizes=[20, 60], seed=5, **kw)
        seeds = np.random.SeedSequence(5).spawn(4)
        for i, row in batched.lanes.iterrows():
            r, N = int(row["rep"]), int(row["n_train"])
            one = fn(data.X[r:r + 1, :N], data.y[r:r + 1, :N], m=4, epochs=2, batch_size=7, seed=[seeds[i]], **kw)
            for name, val in one.params.items():
                np.testing.assert_allclose(batched.params[name][i].numpy(), val[0].numpy(), rtol=1e-10, atol=1e-12)


def test_pmoe_needs_fewer_samples_than_cnn_reduced():
    """Reduced version of the vignette's claim: at N = 60 separate pMoE beats the CNN on synthetic data."""
    train = ms.simulate_patches(60, reps=3, seed=21, n_patches=16, d=32)
    test = ms.simulate_patches(1000, seed=22, n_patches=16, d=32)
    acc_p = fit_pmoe(train, l=2, epochs=20, seed=1).accuracy(test)
    acc_c = fit_cnn(train, epochs=20, seed=1).accuracy(test)
    # at these seeds pMoE scores (0.78, 1.00, 0.995) and the CNN (0.65, 0.92, 0.50): means 0.93 vs 0.69. The
    # thresholds (0.85; a 0.1 gap) leave room for BLAS-level rounding differences, not for a broken trainer.
    assert acc_p.mean() > 0.85 and acc_p.mean() > acc_c.mean() + 0.1
    fr = fit_pmoe(train, l=2, epochs=2, seed=1, eval_epochs=[1, 2], test=test)
    assert set(fr.history["epoch"]) == {1, 2} and fr.history["test_acc"].between(0, 1).all()
    frame = fr.to_frame(test)
    assert {"model", "rep", "n_train", "accuracy", "l", "gating", "lr"} <= set(frame.columns)
    assert (frame["model"] == "pmoe-separate").all()


@pytest.mark.parametrize(("fn", "kwargs", "match"), [
    (fit_pmoe, {"l": 6}, "l=6 must be smaller"),
    (fit_pmoe, {"l": 9}, "smaller than the number of patches"),
    (fit_pmoe, {"lr": 0.0}, "lr must be a positive"),
    (fit_pmoe, {"lr": -0.2}, "lr must be a positive"),
    (fit_pmoe, {"lr": math.nan}, "lr must be a positive"),
    (fit_pmoe, {"router_lr": 0}, "router_lr must be a positive"),
    (fit_cnn, {"lr": -1.0}, "lr must be a positive"),
    (fit_pmoe, {"k": 3}, "k must be 2"),
    (fit_pmoe, {"training": "joint", "k": 3, "m": 40}, "multiple of k"),
    (fit_pmoe, {"gating": "soft"}, "gating"),
    (fit_pmoe, {"sizes": [100]}, "sizes must not exceed"),
    (fit_cnn, {"epochs": 0}, "epochs"),
])
def test_bad_input_raises(fn, kwargs, match):
    data = ms.simulate_patches(30, seed=0, n_patches=6, d=8)
    with pytest.raises(ValueError, match=match):
        fn(data, **kwargs)


def test_bad_data_raises():
    data = ms.simulate_patches(30, seed=0, n_patches=6, d=8)
    with pytest.raises(ValueError, match=r"\+1 / -1"):
        fit_cnn(data.X, (data.y + 1) // 2)
    with pytest.raises(ValueError, match="shape"):
        fit_cnn(data.X[..., 0], data.y)
    with pytest.raises(TypeError, match="PatchData"):
        fit_cnn(np.zeros((2, 3)))


def test_stop_at_zero_error_equals_training_for_the_epochs_it_ran():
    """A lane stopped at epoch E must hold exactly the weights of the same lane trained for E epochs."""
    data = ms.simulate_patches(80, reps=2, seed=12, n_patches=8, d=16)
    stopped = fit_pmoe(data, l=2, m=8, epochs=40, sizes=[40, 80], seed=3, stop_at_zero_error=True)
    ran = stopped.lanes["epochs_run"].to_numpy()
    assert (ran >= 1).all() and (ran < 40).any()
    seeds = np.random.SeedSequence(3).spawn(4)
    for i, row in stopped.lanes.iterrows():
        r, N = int(row["rep"]), int(row["n_train"])
        ref = fit_pmoe(data.X[r:r + 1, :N], data.y[r:r + 1, :N], l=2, m=8, epochs=int(ran[i]), seed=[seeds[i]])
        np.testing.assert_allclose(stopped.params["W"][i].numpy(), ref.params["W"][0].numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_pmoe_beats_cnn_at_small_n_full_protocol():
    """§5.1 protocol (m=40, lr 0.2, B=20, until zero training error, <=150 epochs), 8 runs on synthetic n=16.

    At N = 64 the separate pMoE's mean accuracy exceeds the CNN's by more than 0.03 (measured at these
    seeds: 0.992 vs 0.925; run-to-run standard errors of the means are about 0.01 and 0.02, so the
    margin is ~1.5 combined standard errors below the measured gap).
    """
    train = ms.simulate_patches(64, reps=8, seed=31, n_patches=16, d=64)
    test = ms.simulate_patches(1000, seed=32, n_patches=16, d=64)
    kw = {"epochs": 150, "stop_at_zero_error": True, "seed": 5}
    acc_p = fit_pmoe(train, l=2, **kw).accuracy(test)
    acc_c = fit_cnn(train, **kw).accuracy(test)
    assert acc_p.mean() > acc_c.mean() + 0.03
