"""The fused C++ EM loop (``moestat/fit/_em_native.cpp``) against the tensor loop of :func:`em_fit`.

Both run the same iteration (E-step, proximal weighted least squares and floored variances for Gaussian experts, a
proximal step-halved IRLS step for Poisson and binomial ones, damped Newton gate steps with halving, SQUAREM S3 with
refusals, the same stopping rule), so from the same starts they must take the same
number of iterations, stop with the same flags and reach the same estimates up to rounding: the tensor loop solves
by LU, the C++ loop by Cholesky, and they sum in different orders.  The tolerances (1e-9 relative on the
log-likelihood, 1e-7 on its history, 1e-4 relative on parameters) allow that rounding to grow over a few hundred
iterations of well-posed fits: the property-based test draws k <= 2 experts (positive case weights), the fixed cases
below have k = 3.  Random truths with k = 3 or 4 on 150 rows are often ill-posed (a gate with coefficients in the
hundreds along flat directions, pairs running to the 300-iteration cap), and there the two loops' rounding grows:
a gate coefficient 3.6e-5 relative apart, a history entry 1.6e-9, and a stopping test that flips two iterations
later (58 against 60 iterations, k = 3 Poisson, seed 17).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.fit import _native
from moestat.fit.em import NATIVE_FAMILIES, em_fit, native_applies
from moestat.fit.mle import random_starts

pytestmark = pytest.mark.skipif(not _native.compiler_available(), reason="no C++ compiler for the native EM kernel")


@pytest.fixture
def em_kernels(monkeypatch):
    """The EM loop (``settings["em_kernel"]``) of every fit the inference functions run, in order: a spy on
    ``moestat.inference.fit_mle``."""
    import moestat.inference as inference

    kernels: list[str] = []
    real = inference.fit_mle

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        kernels.append(out.settings["em_kernel"])
        return out

    monkeypatch.setattr(inference, "fit_mle", spy)
    return kernels


def _problem(k: int, d: int, n: int, reps: int, seed: int, weighted: bool, family: str = "gaussian"):
    """A softmax-gated mixture of k experts of ``family`` (binomial: proportions of 1-5 trials)."""
    spec = ms.MoE(gate="softmax", expert="linear", k=k, d=d)
    rng = np.random.default_rng(seed)
    truth = ms.Params(rng.normal(size=k), 2.0 * rng.normal(size=(k, d)), rng.normal(size=(k, d)),
                      np.linspace(-2.0, 2.0, k), noise_sd=np.full(k, 0.4))
    data = ms.simulate(spec, truth, n=n, reps=reps, seed=seed, model="mixture")
    X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
    w = torch.as_tensor(rng.integers(1, 4, size=(reps, n)).astype(float)) if weighted else None
    trials = None
    if family != "gaussian":  # a separated GLM mixture: gate along x_0, experts' intercepts spread on the link scale
        spec = ms.MoE(gate="softmax", expert="linear", k=k, d=d, response=family)
        X = torch.as_tensor(rng.uniform(-1.0, 1.0, size=(reps, n, d)))
        logits = 3.0 * np.linspace(-1.0, 1.0, k)[None, None, :] * X[..., :1].numpy()
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        z = (rng.uniform(size=(reps, n, 1)) > np.cumsum(probs, -1)).sum(-1)
        spread = np.linspace(0.5, 2.5, k) if family == "poisson" else np.linspace(-2.0, 2.0, k)
        eta = spread[z] + 0.5 * X[..., -1].numpy() * np.where(z % 2 == 0, 1.0, -1.0)
        if family == "poisson":
            y = torch.as_tensor(rng.poisson(np.exp(eta)).astype(float))
        else:
            trials = torch.as_tensor(rng.integers(1, 6, size=(reps, n)).astype(float))
            y = torch.as_tensor(rng.binomial(trials.numpy().astype(int), 1 / (1 + np.exp(-eta)))) / trials
    return spec, X, y, w, trials


TOL = 1e-10  # _both's stopping tolerance


def _both(spec, X, y, w, starts, trials=None, **kw):
    init = random_starts(spec, X, y, starts, np.random.SeedSequence(5).spawn(X.shape[0]), trials=trials)
    floor = (1e-3 * y.std(1)) ** 2
    args = dict(var_floor=floor, tol=TOL, max_iter=300, weights=w, trials=trials, **kw)
    return (em_fit(spec, X, y, init, native=False, **args), em_fit(spec, X, y, init, native=True, **args))



def _assert_same_iterations(a, b):
    """The same iteration counts, but for pairs whose stopping test sat at its threshold: both loops stop at the
    first EM step with |l - l_prev| <= tol (1 + |l|), and after SQUAREM jumps two runs' increments differ by a few
    percent (5.44e-8 against 5.60e-8, threshold 5.58e-8, at step 120 of a k = 3 binomial pair), so a count may
    differ by one where the increment of the run that went on lay within 5 % of the threshold."""
    assert torch.equal(a.converged, b.converged)
    for pair in (a.n_iter != b.n_iter).nonzero().tolist():
        counts = (int(a.n_iter[tuple(pair)]), int(b.n_iter[tuple(pair)]))
        assert abs(counts[0] - counts[1]) == 1, f"pair {pair}: {counts} iterations"
        step, later = min(counts), (a, b)[counts.index(max(counts))]
        ll = later.history[:, pair[0], pair[1]]
        threshold = TOL * (1 + abs(float(ll[step])))
        assert abs(abs(float(ll[step] - ll[step - 1])) - threshold) <= 0.05 * threshold, f"pair {pair}: {counts}"


def _assert_same(a, b):
    _assert_same_iterations(a, b)
    torch.testing.assert_close(b.loglik, a.loglik, rtol=1e-9, atol=1e-9)
    assert a.history.shape == b.history.shape
    # mid-run, a SQUAREM jump multiplies a rounding difference by its step length (up to ~100): 1.3e-9 relative
    # on one entry of a k = 3 Poisson history whose final values agree to 1e-12
    torch.testing.assert_close(b.history, a.history, rtol=1e-7, atol=1e-9)
    for f in ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd"):
        torch.testing.assert_close(getattr(b.params, f), getattr(a.params, f), rtol=1e-4, atol=1e-6)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(k=st.integers(1, 2), d=st.integers(1, 3), weighted=st.booleans(), accelerate=st.booleans(),
       gate_steps=st.integers(1, 2), family=st.sampled_from(["gaussian", "poisson", "binomial"]),
       seed=st.integers(0, 10_000))
def test_native_loop_takes_the_tensor_loops_iterations_to_the_same_estimates(k, d, weighted, accelerate, gate_steps,
                                                                              family, seed):
    spec, X, y, w, trials = _problem(k, d, n=150, reps=2, seed=seed, weighted=weighted, family=family)
    a, b = _both(spec, X, y, w, starts=3, trials=trials, accelerate=accelerate, gate_steps=gate_steps)
    _assert_same(a, b)


@pytest.mark.parametrize("family", ["poisson", "binomial"])
def test_glm_experts_with_an_offset_column_and_three_experts(family):
    """A GLM offset (column 0, coefficient 1 in every expert's linear predictor) enters both loops alike; three
    separated experts with case weights."""
    spec, X, y, _, trials = _problem(2, 2, n=200, reps=2, seed=7, weighted=False, family=family)
    _assert_same(*_both(spec, X, y, None, starts=3, trials=trials, offset_column=0))
    spec, X, y, w, trials = _problem(3, 2, n=300, reps=2, seed=8, weighted=True, family=family)
    _assert_same(*_both(spec, X, y, w, starts=3, trials=trials))


@pytest.mark.parametrize("columns", [dict(gate_columns=[1], expert_columns=[0]),
                                     dict(gate_columns=[0, 1], expert_columns=[1])])
def test_separate_gate_and_expert_columns_and_constant_experts(columns):
    spec, X, y, _, _ = _problem(3, 2, n=200, reps=2, seed=4, weighted=False)
    _assert_same(*_both(spec, X, y, None, starts=4, **columns))
    const = ms.MoE(gate="softmax", expert="constant", k=2, d=2)
    _assert_same(*_both(const, X, y, None, starts=3))


def test_an_iteration_cap_stops_every_pair_unconverged_at_the_cap():
    spec, X, y, _, _ = _problem(3, 1, n=200, reps=2, seed=1, weighted=False)
    init = random_starts(spec, X, y, 4, np.random.SeedSequence(1).spawn(2))
    st_ = em_fit(spec, X, y, init, var_floor=(1e-3 * y.std(1)) ** 2, tol=1e-12, max_iter=7, native=True)
    assert (st_.n_iter == 7).all() and not bool(st_.converged.any()) and st_.history.shape[0] == 8


def test_fit_mle_uses_it_where_it_applies_and_says_so():
    """fit_mle(compile=True) on a CPU runs the C++ loop for the softmax-gated Gaussian MoE (settings["em_kernel"]),
    the tensor loop by default and for models the kernel does not cover, with the same maximum."""
    spec, X, y, _, _ = _problem(2, 1, n=300, reps=1, seed=2, weighted=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = dict(seed=0, device="cpu")  # the kernel is the CPU's: on a GPU host "auto" would pick CUDA
        native = ms.fit_mle(spec, X[0], y[0], restarts=4, compile=True, **cpu)
        tensor = ms.fit_mle(spec, X[0], y[0], restarts=4, **cpu)
        sigmoid = ms.fit_mle(ms.MoE(gate="sigmoid", expert="linear", k=2, d=1), X[0], y[0], restarts=2,
                             compile=True, **cpu)
        gradient = ms.fit_mle(spec, X[0], y[0], restarts=2, method="gradient", compile=True, **cpu)
    assert native.settings["em_kernel"] == "native" and tensor.settings["em_kernel"] == "tensor"
    assert sigmoid.settings["em_kernel"] == "tensor" and gradient.settings["em_kernel"] is None
    assert abs(float(native.loglik) - float(tensor.loglik)) < 1e-8 * abs(float(tensor.loglik))
    np.testing.assert_allclose(np.asarray(native.theta), np.asarray(tensor.theta), rtol=1e-6, atol=1e-7)


def test_native_applies_only_to_the_model_it_implements():
    X = torch.zeros(1, 5, 2, dtype=torch.float64)
    gauss = ms.MoE(gate="softmax", expert="linear", k=2, d=2)
    assert native_applies(gauss, X) and native_applies(ms.MoE(gate="softmax", expert="constant", k=2, d=2), X)
    assert not native_applies(gauss, X.float())  # float32: the tensor loop
    assert not native_applies(ms.MoE(gate="sigmoid", expert="linear", k=2, d=2), X)
    assert native_applies(ms.MoE(gate="softmax", expert="linear", k=2, d=2, response="poisson"), X)
    assert native_applies(ms.MoE(gate="softmax", expert="linear", k=2, d=2, response="binomial"), X)
    assert not native_applies(gauss, X, gate_solver="cvxpy")
    assert native_applies(gauss, X, shared_columns=[1])
    assert not native_applies(ms.MoE(gate="softmax", expert="linear", k=65, d=2), X)  # the kernel's limit


def test_bootstrap_refits_and_the_sklearn_estimator_run_the_loop_they_are_asked_for(em_kernels):
    """A bootstrap of a compile=True fit refits with compile=True (the same EM loop as the fit); MoERegressor passes
    its compile option to fit_mle."""
    spec, X, y, _, _ = _problem(2, 1, n=200, reps=1, seed=3, weighted=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for compile_ in (True, False):
            fit = ms.fit_mle(spec, X[0], y[0], restarts=2, seed=0, compile=compile_, device="cpu")
            ms.bootstrap(fit, X[0].numpy(), y[0].numpy(), n_resamples=4, seed=1, progress=False)
        reg = ms.MoERegressor(n_experts=2, restarts=2, random_state=0, compile=True, device="cpu").fit(
            X[0].numpy(), y[0].numpy())
    assert em_kernels == ["native", "tensor"]
    assert reg.fit_.settings["em_kernel"] == "native" and reg.get_params()["compile"] is True


@pytest.mark.parametrize("family", ["poisson", "binomial"])
@pytest.mark.parametrize("penalties", [(1e-6, 0.0), (0.0, 0.5)])
def test_the_starts_irls_equals_irls_weighted(family, penalties):
    """The C++ IRLS of the GLM random starts (fit_mle(compile=True)) takes families.irls_weighted's steps: every lane
    (replicate, restart, expert) of random weights, with trials, an offset, a ridge or a proximal penalty, is at the
    same coefficients after two steps (mid-path, where a wrong Hessian shows) and after ten (converged; 1e-8 allows
    the rounding of ten Newton steps)."""
    from moestat.families import initial_beta, irls_weighted

    rng = np.random.default_rng(11)
    R, S, n, k, p = 2, 3, 120, 2, 3
    Z = torch.as_tensor(np.concatenate([np.ones((R, n, 1)), rng.normal(size=(R, n, p - 1))], -1))
    w = torch.as_tensor(rng.uniform(0.0, 1.0, size=(R, S, n, k)))
    off = torch.as_tensor(rng.normal(scale=0.3, size=(R, n)))
    trials = torch.as_tensor(rng.integers(1, 6, size=(R, n)).astype(float)) if family == "binomial" else None
    eta = Z[..., 1] + off
    if family == "poisson":
        y = torch.as_tensor(rng.poisson(np.exp(eta.numpy())).astype(float))
    else:
        y = torch.as_tensor(rng.binomial(trials.numpy().astype(int), 1 / (1 + np.exp(-eta.numpy())))) / trials
    ridge, prox = penalties
    o4 = off[:, None, :, None]
    start = initial_beta(Z, y, w, family, ridge=1e-6, trials=trials, offset=o4)
    for steps in (2, 10):
        ref = irls_weighted(Z, y, w, start, family, max_iter=steps, ridge=ridge, prox=prox, trials=trials, offset=o4)
        got = _native.load_em().irls(Z, y, w, start, NATIVE_FAMILIES[family], steps, 1e-10, ridge,
                                     prox, y.new_empty(0) if trials is None else trials, off)
        torch.testing.assert_close(got, ref, rtol=1e-8, atol=1e-10)
        assert (got - start).abs().amax(-1).min() > 1e-6  # the steps moved every lane


def test_compile_without_a_compiler_warns_and_runs_the_tensor_loop(monkeypatch):
    spec, X, y, _, _ = _problem(2, 1, n=200, reps=1, seed=3, weighted=False)
    monkeypatch.setattr(_native, "compiler_available", lambda: False)
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler"):
        fit = ms.fit_mle(spec, X[0], y[0], restarts=2, seed=0, compile=True, device="cpu")
    assert fit.settings["em_kernel"] == "tensor"


def test_threads_split_the_pairs_without_changing_a_bit():
    """With threads > 1 the threads take the pairs one at a time (at::parallel_for); each pair's arithmetic is its
    own, so the fit is the one-thread fit bit for bit."""
    spec, X, y, w, _ = _problem(3, 2, n=300, reps=4, seed=5, weighted=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one, two = (ms.fit_mle(spec, X, y, weights=w, restarts=3, seed=1, compile=True, device="cpu", threads=t)
                    for t in (1, 2))
    assert one.settings["em_kernel"] == "native"
    assert torch.equal(torch.as_tensor(np.asarray(one.theta)), torch.as_tensor(np.asarray(two.theta)))
    assert torch.equal(torch.as_tensor(np.asarray(one.loglik)), torch.as_tensor(np.asarray(two.loglik)))


@pytest.mark.parametrize("family", ["gaussian", "poisson", "binomial"])
def test_shared_slopes(family):
    """A slope shared by every expert (column 1; flexmix's FLXMRglmfix): the joint Newton step through the Schur
    complement, with the Gaussian experts' conditional variance update or the GLM experts' halving, in both loops."""
    spec, X, y, w, trials = _problem(2, 2, n=250, reps=2, seed=12, weighted=True, family=family)
    _assert_same(*_both(spec, X, y, w, starts=3, trials=trials, shared_columns=[1]))
    spec, X, y, _, trials = _problem(3, 3, n=300, reps=2, seed=13, weighted=False, family=family)
    _assert_same(*_both(spec, X, y, None, starts=3, trials=trials, shared_columns=[1, 2], accelerate=False))


def test_select_k_and_test_n_experts_pass_compile_on_and_agree_with_the_default(em_kernels):
    """select_k and test_n_experts hand compile=True to their fits (fit_mle's options go through their **fit_kwargs;
    a spy on the fits sees the C++ loop run); the log-likelihoods, criteria and the LRT statistic equal the
    default's to rounding."""
    _, X, y, _, _ = _problem(2, 1, n=200, reps=1, seed=4, weighted=False)
    x, yy = X[0].numpy(), y[0].numpy()
    runs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for c in (False, True):
            em_kernels.clear()
            runs.append((ms.select_k(x, yy, ks=(1, 2), restarts=3, seed=1, device="cpu", progress=False, compile=c),
                         ms.test_n_experts(x, yy, k0=1, k1=2, n_resamples=4, restarts=2, seed=2, device="cpu",
                                           progress=False, compile=c), set(em_kernels)))
    (sel0, lrt0, k0), (sel1, lrt1, k1) = runs
    assert k0 == {"tensor"} and k1 == {"native"}
    np.testing.assert_allclose(sel1.table["loglik"], sel0.table["loglik"], rtol=1e-9)
    np.testing.assert_allclose(sel1.table["bic"], sel0.table["bic"], rtol=1e-9)
    assert abs(lrt1.statistic - lrt0.statistic) <= 1e-6 * abs(lrt0.statistic)
