"""The batched EM loop's bookkeeping: iteration counts and histories of pairs that stop at different iterations,
and outputs that are ordinary tensors although a softmax-gated EM runs in inference mode."""

from __future__ import annotations

import numpy as np
import torch

import moestat as ms
from moestat.fit.em import em_fit
from moestat.fit.mle import random_starts

GAUSS = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
TRUTH = ms.Params([0.5, 0.0], [[3.0], [0.0]], [[2.0], [-2.0]], [1.0, -1.0], noise_sd=[0.5, 0.5])


def _fit(max_iter: int = 2000, accelerate: bool = False):
    data = ms.simulate(GAUSS, TRUTH, n=300, reps=2, seed=3, model="mixture")
    X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
    init = random_starts(GAUSS, X, y, 6, np.random.SeedSequence(3).spawn(2))
    floor = (1e-3 * y.std(1)) ** 2
    return em_fit(GAUSS, X, y, init, var_floor=floor, tol=1e-10, max_iter=max_iter, accelerate=accelerate)


def test_each_pair_counts_its_own_iterations_and_its_history_freezes_where_it_stopped():
    st = _fit()
    n_iter, ll, hist = st.n_iter.numpy().ravel(), st.loglik.numpy().ravel(), st.history.numpy().reshape(
        st.history.shape[0], -1)
    assert bool(st.converged.all())
    assert len(set(n_iter.tolist())) > 3, n_iter  # pairs stop at different iterations: the working set shrinks
    assert hist.shape[0] == n_iter.max() + 1  # row t: the log-likelihood before iteration t's M-step
    for j in range(n_iter.size):
        # a pair's last recorded step is its n_iter-th M-step; its history is constant from there on
        np.testing.assert_array_equal(hist[n_iter[j]:, j], ll[j])
        assert hist[n_iter[j] - 1, j] != ll[j]  # and that step did change it (plain EM ascends strictly here)


def test_an_iteration_cap_counts_every_pair_at_the_cap():
    st = _fit(max_iter=7, accelerate=True)
    assert (st.n_iter.numpy() == 7).all() and not bool(st.converged.any())
    assert st.history.shape[0] == 8


def test_outputs_are_ordinary_tensors_usable_with_autograd_and_in_place():
    st = _fit(max_iter=20, accelerate=True)
    for t in (st.loglik, st.converged, st.n_iter, st.history, st.params.gate_bias, st.params.expert_weight,
              st.params.noise_sd):
        assert not t.is_inference()
    st.loglik.add_(0.0)  # an inference tensor refuses in-place updates outside inference mode
    w = st.params.expert_weight.requires_grad_(True)
    (w * w).sum().backward()
    assert w.grad is not None


def test_spec_by_name_runs_the_same_fit():
    data = ms.simulate(GAUSS, TRUTH, n=300, reps=2, seed=3, model="mixture")
    X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
    init = random_starts(GAUSS, X, y, 3, np.random.SeedSequence(3).spawn(2))
    floor = (1e-3 * y.std(1)) ** 2
    positional = em_fit(GAUSS, X, y, init, var_floor=floor, tol=1e-10, max_iter=50)
    named = em_fit(spec=GAUSS, X=X, y=y, init=init, var_floor=floor, tol=1e-10, max_iter=50)
    torch.testing.assert_close(named.loglik, positional.loglik, rtol=0, atol=0)
    assert not named.loglik.is_inference()


def test_the_starts_are_not_modified():
    """em_fit writes its estimates into its own arrays, never into ``init`` (constant experts' coefficients were a
    view of it, so the caller's starts came back as the estimates)."""
    data = ms.simulate(GAUSS, TRUTH, n=300, reps=2, seed=3, model="mixture")
    X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
    for spec in (GAUSS, ms.MoE(gate="softmax", expert="constant", k=2, d=1)):
        init = random_starts(spec, X, y, 3, np.random.SeedSequence(3).spawn(2))
        before = init.map(torch.clone)
        em_fit(spec, X, y, init, var_floor=(1e-3 * y.std(1)) ** 2, tol=1e-10, max_iter=20)
        for f in ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd"):
            assert torch.equal(getattr(init, f), getattr(before, f)), (spec.expert, f)
