"""The C++ L-BFGS phase of ``fit_mle(compile=True)`` (``moestat/fit/_mle_lbfgs_native.cpp``).

Its objective, the negative mean log-likelihood with a closed-form gradient, is checked against autograd through the
tensor path's :func:`moestat.fit.mle.log_components` and against central finite differences.  Its optimiser takes the
steps of :func:`moestat.fit._optim.lbfgs`, so from the same starts both reach the same end points up to rounding: the
tolerances (1e-9 relative on the log-likelihood, 1e-5 on parameters) allow the sums' different order to grow over a
few dozen iterations of well-posed fits, where the ftol stop leaves parameters about sqrt(ftol) apart along flat
directions.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import moestat as ms
from moestat.fit import _native
from moestat.fit._layout import ParamLayout
from moestat.fit.em import NATIVE_FAMILIES, design
from moestat.fit.mle import gradient_fit, log_components, native_mixture_data, random_starts
from moestat.fit.results import DIVERGING_LINPRED

from .test_em_native import _problem

pytestmark = pytest.mark.skipif(not _native.compiler_available(), reason="no C++ compiler for the native EM kernel")

CASES = {
    "gaussian": dict(family="gaussian", weighted=False, layout={}),
    "gaussian, weights, a shared slope": dict(family="gaussian", weighted=True, layout=dict(shared_columns=[1])),
    "gaussian, an offset": dict(family="gaussian", weighted=False, layout=dict(offset_column=0)),
    "gaussian, own gate and expert columns": dict(family="gaussian", weighted=False,
                                                  layout=dict(gate_columns=[1], expert_columns=[0])),
    "gaussian, constant experts": dict(family="gaussian", weighted=True, layout={}, expert="constant"),
    "poisson, weights, an offset": dict(family="poisson", weighted=True, layout=dict(offset_column=0)),
    "poisson, a shared slope": dict(family="poisson", weighted=False, layout=dict(shared_columns=[1])),
    "binomial with trials": dict(family="binomial", weighted=True, layout={}),
    "binomial, a shared slope": dict(family="binomial", weighted=False, layout=dict(shared_columns=[0])),
}


def _case(name: str, k: int = 3, seed: int = 3):
    case = CASES[name]
    spec, X, y, w, trials = _problem(k, 2, n=180, reps=2, seed=seed, weighted=case["weighted"], family=case["family"])
    if case.get("expert") == "constant":
        spec = ms.MoE(gate="softmax", expert="constant", k=k, d=2)
    return spec, ParamLayout(spec, **case["layout"]), X, y, w, trials


def _autograd_objective(spec, layout, X, y, w, trials, floor2):
    """The tensor path's objective: -(1/n) sum_t w_t log sum_j pi_j f_j at the packed vectors v (A, P), one problem
    per replicate, Gaussian sd^2 = floor^2 + exp(2 rho)."""
    Zt = design(X, True).transpose(1, 2)
    k, n = spec.k, X.shape[1]

    def value(v):
        p = layout.unpack(v)
        if layout.dispersion:
            p.noise_sd = torch.sqrt(floor2[:, None] + torch.exp(2 * v[:, -k:]))
        lse = torch.logsumexp(log_components(spec, p, Zt, y, trials), dim=1)
        return -(lse if w is None else lse * w).sum(-1) / n

    return value


def _native_objective(spec, layout, X, y, w, trials, floor2):
    kernel = _native.load_em()
    data = native_mixture_data(spec, layout, design(X, True).transpose(1, 2), y, w, trials)

    def value_grad(v):
        return kernel.mixture_value_grad(v, *data, floor2, NATIVE_FAMILIES[spec.response], spec.k)

    return value_grad


@pytest.mark.parametrize("name", list(CASES))
def test_value_and_gradient_equal_autograd_through_the_tensor_path(name):
    spec, layout, X, y, w, trials = _case(name)
    floor2 = torch.full((2,), 0.05**2, dtype=torch.float64)
    v = 0.5 * torch.as_tensor(np.random.default_rng(1).normal(size=(2, layout.size)))
    reference = _autograd_objective(spec, layout, X, y, w, trials, floor2)
    vr = v.clone().requires_grad_(True)
    f_ref = reference(vr)
    (g_ref,) = torch.autograd.grad(f_ref.sum(), vr)
    f, g = _native_objective(spec, layout, X, y, w, trials, floor2)(v)
    # the same sums in another order: a few ulps of values of order 1-10
    torch.testing.assert_close(f, f_ref.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_gradient_equals_central_differences():
    spec, layout, X, y, w, trials = _case("gaussian, weights, a shared slope")
    floor2 = torch.full((2,), 0.05**2, dtype=torch.float64)
    value_grad = _native_objective(spec, layout, X, y, w, trials, floor2)
    v = 0.5 * torch.as_tensor(np.random.default_rng(2).normal(size=(2, layout.size)))
    _, g = value_grad(v)
    h = 1e-6
    fd = torch.empty_like(v)
    for j in range(v.shape[1]):
        e = torch.zeros_like(v)
        e[:, j] = h
        fd[:, j] = (value_grad(v + e)[0] - value_grad(v - e)[0]) / (2 * h)
    # central differences: O(h^2) truncation plus O(eps / h) ~ 1e-10 rounding on values of order 1
    torch.testing.assert_close(g, fd, rtol=1e-6, atol=1e-8)


def _lbfgs_both(spec, layout, X, y, w, trials, starts=4, max_iter=500):
    init = random_starts(spec, X, y, starts, np.random.SeedSequence(5).spawn(X.shape[0]),
                         expert_columns=layout.expert_design_columns, trials=trials)
    init.noise_sd = init.noise_sd.clamp_min(0.1)
    floor = torch.full((X.shape[0],), 0.05, dtype=X.dtype)
    kw = dict(sd_floor=floor, max_iter=max_iter, gtol=1e-9, ftol=1e-12, weights=w, trials=trials)
    return (gradient_fit(spec, X, y, init, layout, native=False, **kw),
            gradient_fit(spec, X, y, init, layout, native=True, **kw))


@pytest.mark.parametrize("name", list(CASES))
def test_the_native_loop_takes_the_tensor_loops_steps_to_the_same_end_points(name):
    spec, layout, X, y, w, trials = _case(name, k=2, seed=11)
    (pa, lla, ca, ia), (pb, llb, cb, ib) = _lbfgs_both(spec, layout, X, y, w, trials)
    assert bool(ca.all()), "the reference run did not converge: pick a well-posed case"
    assert torch.equal(ca, cb)
    torch.testing.assert_close(llb, lla, rtol=1e-9, atol=1e-9)
    # equal steps: iteration counts equal in most pairs; in the others the ftol test (a gain of 1e-12 relative, near
    # rounding) was crossed a few iterations apart (91 against 94 in a binomial pair)
    assert float((ia == ib).double().mean()) >= 0.75
    assert bool(((ia - ib).abs() <= 2 + 0.05 * ia).all())
    for f in ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd"):
        a, b = getattr(pa, f), getattr(pb, f)
        # a coefficient beyond DIVERGING_LINPRED runs off with (quasi-)separation (a binomial pair reaches slopes of
        # 1475 and 1610): the likelihood is flat along it, so only the ftol stop fixes where it ends, and on an AVX2
        # host the two loops' ends there differ by 1.8e-5 relative (0.029 absolute) at the same log-likelihood
        rtol = torch.where(a.abs() > DIVERGING_LINPRED, 1e-4, 1e-5)
        assert bool(((b - a).abs() <= 1e-5 + rtol * a.abs()).all()), (f, float((b - a).abs().max()))


def test_fit_mle_compile_runs_the_switch_phase_natively_to_the_defaults_maximum():
    """fit_mle(compile=True) with an early hand-over to L-BFGS (switch_after=5): the log-likelihood of every start
    equals the default's (both loops to rounding; the ftol stop is 1e-12 relative), and threads do not change a bit."""
    spec, X, y, w, _ = _problem(2, 2, n=250, reps=1, seed=12, weighted=True)
    kw = dict(restarts=4, seed=1, device="cpu", switch_after=5, weights=w[0].numpy(), shared_columns=[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = ms.fit_mle(spec, X[0].numpy(), y[0].numpy(), **kw)
        one, two = (ms.fit_mle(spec, X[0].numpy(), y[0].numpy(), compile=True, threads=t, **kw) for t in (1, 2))
    assert one.settings["em_kernel"] == "native"
    assert (ref.n_iter > 5).all() if np.ndim(ref.n_iter) else ref.n_iter > 5  # the L-BFGS phase ran
    np.testing.assert_allclose(one.restart_loglik, ref.restart_loglik, rtol=1e-10)
    np.testing.assert_array_equal(np.asarray(one.theta), np.asarray(two.theta))


@pytest.mark.parametrize("family", ["gaussian", "poisson"])
def test_fit_mle_gradient_method_with_compile_runs_the_native_loop_from_the_starts(family, monkeypatch):
    """fit_mle(method="gradient", compile=True): the C++ L-BFGS (a spy counts its calls) from the same starts reaches
    every start's maximum of the default tensor loop (1e-8 relative: both stop at the ftol test, 1e-12 relative, on
    a regular likelihood), and says so in its settings; a default fit keeps its columns.  Every start of this
    problem reaches the same regular maximum (both families): with seed 12 one Gaussian start stopped at -496.46,
    on a flat stretch where the loops' rounding decides the stop (3.6e-9 apart here, 9.6e-4 on the H200 host's
    CPU under torch 2.11)."""
    spec, X, y, _, _ = _problem(2, 2, n=250, reps=1, seed=16, weighted=False, family=family)
    kw = dict(method="gradient", restarts=4, seed=1, device="cpu")
    calls, real = [], _native.load_em()

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real, name)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = ms.fit_mle(spec, X[0].numpy(), y[0].numpy(), **kw)
        monkeypatch.setattr(_native, "load_em", Spy)
        fast = ms.fit_mle(spec, X[0].numpy(), y[0].numpy(), compile=True, **kw)
    assert calls.count("lbfgs_softmax") == 1  # one call for every start
    assert fast.settings["lbfgs_kernel"] == "native" and "lbfgs_kernel" not in ref.settings
    assert fast.settings["em_kernel"] is None
    assert np.isfinite(ref.restart_loglik).all()
    np.testing.assert_allclose(fast.restart_loglik, ref.restart_loglik, rtol=1e-8)


def test_fit_mle_gradient_method_with_compile_keeps_the_tensor_loop_outside_the_native_models():
    """A sigmoid gate is outside the C++ objective: compile=True runs the tensor loop and records it."""
    _, X, y, _, _ = _problem(2, 2, n=150, reps=1, seed=12, weighted=False)
    sigmoid = ms.MoE(gate="sigmoid", expert="linear", k=2, d=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_mle(sigmoid, X[0].numpy(), y[0].numpy(), method="gradient", restarts=2, seed=1, compile=True)
    assert fit.settings["lbfgs_kernel"] == "tensor"


def test_the_iteration_cap_stops_every_pair_unconverged_at_the_cap():
    spec, layout, X, y, w, trials = _case("gaussian, weights, a shared slope", k=2)
    (_, lla, ca, ia), (_, llb, cb, ib) = _lbfgs_both(spec, layout, X, y, w, trials, max_iter=3)
    assert (ib == 3).all() and not bool(cb.any())
    assert torch.equal(ia, ib) and torch.equal(ca, cb)
    torch.testing.assert_close(llb, lla, rtol=1e-12, atol=1e-12)  # three steps: rounding has not grown
