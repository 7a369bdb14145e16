"""The CUDA path against the CPU path: every fitter that takes ``device=`` gives the CPU's answer on a GPU.

Skipped where no CUDA device is present (CI has none); run on a GPU machine with
``python -m pytest tests/test_cuda.py``.  Comparisons run in float64 on both devices, so that they test
the code path and not float32 round-off (float64 is the default on every device); one test checks
``dtype="float32"``.
Tolerances: the devices do the same float64 arithmetic in a different order (cuBLAS and CUDA reductions vs
MKL/OpenMP), so sums over n terms differ by a few ulps times n; iterative fits amplify this through their
iterations but stay far below the statistical error of the estimates they produce.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import moestat as ms
from moestat._random import randn, seeded_generators
from moestat.fit._objective import MeanKernel

# MOESTAT_TEST_DEVICE=cpu runs these comparisons CPU against CPU: a check of the tests themselves
CUDA = torch.device(os.environ.get("MOESTAT_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(CUDA.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")
F64 = torch.float64


def _kernel_inputs(device, G=2, s=3, n=2000, d=3, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(G, n, d, generator=g, dtype=F64) * 2 - 1
    Xa = torch.cat([torch.ones(G, n, 1, dtype=F64), X], -1)
    y = torch.randn(G, n, generator=g, dtype=F64)
    theta = torch.randn(G, s, 2 * k, d + 1, generator=g, dtype=F64)
    return theta.to(device), Xa.to(device), y.to(device)


@pytest.mark.parametrize(("gate", "top_k"), [("sigmoid", None), ("softmax", None), ("topk", 2)])
@pytest.mark.parametrize("expert", ["relu", "gelu", "tanh", "linear"])
def test_mean_kernel_on_cuda_equals_cpu(gate, top_k, expert):
    """Objective, gradient and exact curvature rows of the fused eager kernel on CUDA (compile=True serves CUDA
    tensors with it too) against the CPU's eager kernel."""
    spec = ms.MoE(gate=gate, expert=expert, k=4, d=3, top_k=top_k, temperature=0.8)
    cpu = MeanKernel.from_spec(spec)
    gpu = MeanKernel.from_spec(spec, compile=True)
    if CUDA.type == "cuda":
        assert gpu.kind(CUDA) == "eager"
    args_cpu = _kernel_inputs("cpu")
    args_gpu = tuple(a.to(CUDA) for a in args_cpu)
    f0, g0 = cpu.value_grad(*args_cpu)
    f1, g1 = gpu.value_grad(*args_gpu)
    # float64 sums over n = 2000 terms in another order: relative round-off ~1e-13
    torch.testing.assert_close(f1.cpu(), f0, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(g1.cpu(), g0, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(gpu.value(*args_gpu).cpu(), cpu.value(*args_cpu), rtol=1e-11, atol=1e-13)
    rows_cpu = cpu.exact_curvature_rows(*args_cpu)
    rows_gpu = gpu.exact_curvature_rows(*args_gpu)
    for a, b in zip(rows_gpu, rows_cpu, strict=True):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-10, atol=1e-12)


def test_model_formulas_on_cuda_tensors():
    """MoE.mean and the log-likelihood take CUDA tensors and return what the CPU returns."""
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="gelu", seed=0)
    data = ms.simulate(spec, truth, n=500, reps=2, seed=1)
    p_cpu = truth.to_torch("cpu", F64)
    p_gpu = truth.to_torch(CUDA, F64)
    X = torch.as_tensor(data.X[0])
    y = torch.as_tensor(data.y[0])
    m = spec.mean(p_gpu, X.to(CUDA))
    assert m.device.type == CUDA.type
    torch.testing.assert_close(m.cpu(), spec.mean(p_cpu, X), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(spec.loglik(p_gpu, X.to(CUDA), y.to(CUDA)).cpu(), spec.loglik(p_cpu, X, y),
                               rtol=1e-12, atol=1e-10)


def test_random_draws_are_the_same_on_every_device():
    """A seed gives the same starts on CPU and CUDA (moestat draws on the CPU, then moves)."""
    seeds = np.random.SeedSequence(5).spawn(3)
    a = randn(seeded_generators(seeds), (4, 2), dtype=torch.float32)
    b = randn(seeded_generators(seeds), (4, 2), device=CUDA, dtype=torch.float32)
    assert b.device.type == CUDA.type
    torch.testing.assert_close(b.cpu(), a, rtol=0, atol=0)


@pytest.fixture(scope="module")
def regime2():
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    data = ms.simulate(spec, truth, n=4000, reps=3, seed=1)
    return spec.with_k(spec.k + 1), truth, data


def _mean_gap(spec, a, b, X, *, rms: bool = False) -> float:
    """Largest (or root-mean-square) gap between two fits' regression functions at the inputs X (R, n, d)."""
    Xt = torch.as_tensor(X)
    gap = spec.mean(a.to_torch("cpu", F64), Xt) - spec.mean(b.to_torch("cpu", F64), Xt)
    return float(gap.pow(2).mean().sqrt()) if rms else float(gap.abs().max())


@pytest.mark.parametrize("optimizer", ["lbfgs", "newton", "sgd"])
def test_fit_lse_on_cuda_equals_cpu(regime2, optimizer):
    """fit_lse (float64 by default on both) from the same seeded starts: same objective, same function."""
    spec, truth, data = regime2
    kw = dict(truth=truth, duplicate=[0], seed=2, restarts=2, optimizer=optimizer, underdetermined="warn")
    if optimizer == "sgd":
        kw.update(epochs=3, lr=0.05, batch_size=64)
    elif optimizer == "lbfgs":
        # a fixed budget: over a flat over-specified valley, round-off steers long L-BFGS runs apart (measured on
        # an H200: objectives 4e-4 apart after convergence, both within the noise), 30 iterations stay together
        kw.update(max_iter=30, tol=0.0, gtol=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = ms.fit_lse(spec, data.X, data.y, device="cpu", **kw)
        gpu = ms.fit_lse(spec, data.X, data.y, device=str(CUDA), **kw)
    assert gpu.settings["device"] == str(CUDA)
    assert gpu.settings["dtype"] == "float64"
    # Newton converges to one minimum; L-BFGS runs the same 30 steps and SGD the same minibatches
    np.testing.assert_allclose(gpu.objective, cpu.objective, rtol=1e-6)
    # the fitted regression functions agree far inside the noise sd (0.1)
    assert _mean_gap(spec, gpu.params, cpu.params, data.X) < 1e-4


def test_fit_lse_in_float32_on_cuda_stays_close_to_float64(regime2):
    """dtype="float32" (a choice for speed) fits within float32 accuracy of the float64 CPU fit."""
    spec, truth, data = regime2
    kw = dict(truth=truth, duplicate=[0], seed=2, restarts=2, underdetermined="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = ms.fit_lse(spec, data.X, data.y, device="cpu", **kw)
        gpu = ms.fit_lse(spec, data.X, data.y, device=str(CUDA), dtype="float32", **kw)
    assert gpu.settings["dtype"] == "float32"
    # float32 stops where its round-off hides further descent (measured on CPU: 9e-4 relative above float64);
    # 2e-3 relative (1.7e-5) stays ~90x below the objective's sampling scale noise_var * n_params / n = 1.5e-3
    np.testing.assert_allclose(gpu.objective, cpu.objective, rtol=2e-3)
    # a float32 fit may end elsewhere in the flat valley (measured on CPU: RMS gap 2.3e-3); the bound 1e-2 is a
    # quarter of the estimate's own RMS error noise_sd * sqrt(n_params / n) = 0.039
    assert _mean_gap(spec, gpu.params, cpu.params, data.X, rms=True) < 1e-2


def test_batched_fit_on_cuda_equals_one_replicate_alone():
    """On CUDA a replicate's fit does not depend on the batch it is fitted in, up to round-off: cuBLAS picks
    its batched-product algorithm by batch size, so the products round differently from one problem alone."""
    spec, truth = ms.presets.gate_comparison("gelu", seed=1)
    data = ms.simulate(spec, truth, n=600, reps=2, seed=3)
    kinds = ["near_truth", "kmeans", "random", "random"]
    kw = dict(init=kinds, truth=truth, duplicate=[0], condition=False, device=str(CUDA))
    fit = ms.fit_lse(spec.with_k(4), data.X, data.y, seed=5, **kw)
    child = np.random.SeedSequence(5).spawn(2)[1]
    alone = ms.fit_lse(spec.with_k(4), data.X[1], data.y[1], seed=[child], **kw)
    # Newton stops inside the flat over-specified valley where round-off leads it (measured on an H200: 3.9e-6
    # relative, 3.4e-8 absolute); 1e-4 keeps a 25x margin and stays 1,000x below the objective (~0.009)
    np.testing.assert_allclose(alone.restarts.objective.to_numpy(), fit.restarts.objective.to_numpy()[4:],
                               rtol=1e-4)


def test_memory_budget_blocks_on_cuda_give_the_one_program_fit():
    """fit_lse's memory budget on CUDA (where block_bytes="auto" is one program): a budget for two replicates fits
    four in blocks, and the certificate one replicate's Hessian at a time, with the one-program fit."""
    from moestat.fit._memory import LSEMemoryModel

    spec, truth = ms.presets.gate_comparison("gelu", seed=1)  # exactly specified: a regular minimum per replicate
    data = ms.simulate(spec, truth, n=600, reps=4, seed=3)
    F = 2 * spec.k * (spec.d + 1)  # sigmoid gate: every coordinate free
    m = LSEMemoryModel.of("newton", F, 600, 4, spec.d, spec.k)
    budget = int(m.fixed + 2 * 2 * m.per_problem) + 1  # two replicates' two restarts
    kw = dict(truth=truth, seed=5, restarts=2, device=str(CUDA), dtype="float64")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = ms.fit_lse(spec, data.X, data.y, memory_budget=None, **kw)
        blocks = ms.fit_lse(spec, data.X, data.y, memory_budget=budget, **kw)
    assert (one.settings["replicates_per_block"], blocks.settings["replicates_per_block"]) == (4, 2)
    # cuBLAS rounds a batch of two differently from four, so Newton may stop elsewhere within its gradient tolerance:
    # the objective moves by about gtol^2 / lambda_min (far below 1e-8 relative); the curvature, with condition
    # numbers up to 1.8e6 here, by up to gtol / lambda_min relative to the point (on the CPU, whose blocks also round
    # differently: 3e-8), so the certificate's values are compared to 1e-3 (the replicates' own values differ by
    # 11 % or more)
    np.testing.assert_allclose(blocks.objective, one.objective, rtol=1e-8)
    np.testing.assert_allclose(blocks.hessian_min_eig, one.hessian_min_eig, rtol=1e-3)
    np.testing.assert_allclose(blocks.cond, one.cond, rtol=1e-3)


def test_fit_mle_on_cuda_equals_cpu():
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=1, expert="linear", d=2, k=2, truth_gate="softmax", seed=0)
    data = ms.simulate(spec, truth, n=1500, reps=2, seed=3)
    kw = dict(restarts=2, seed=4, max_iter=200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = ms.fit_mle(spec, data.X, data.y, device="cpu", **kw)
        gpu = ms.fit_mle(spec, data.X, data.y, device=str(CUDA), **kw)
    # EM + Newton to the same optimum: log-likelihoods (sums over n = 1500) agree to 1e-6 relative
    np.testing.assert_allclose(np.asarray(gpu.objective), np.asarray(cpu.objective), rtol=1e-6)
    assert _mean_gap(spec, gpu.params, cpu.params, data.X) < 1e-4


def test_sigmoid_gated_em_on_cuda_equals_cpu():
    """EM's gate step for a gate other than softmax (autograd gradient and Hessian, batched backward passes)."""
    spec = ms.MoE(gate="sigmoid", k=2, d=2)
    truth = ms.Params([0.5, -0.5], [[1.5, -1.0], [-1.0, 1.0]], [[2.0, 0.0], [-2.0, 1.0]], [1.0, -1.0],
                      noise_sd=[0.3, 0.3])
    data = ms.simulate(spec, truth, n=1500, reps=2, seed=3, model="mixture")
    kw = dict(restarts=2, seed=4, max_iter=200, method="em")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = ms.fit_mle(spec, data.X, data.y, device="cpu", **kw)
        gpu = ms.fit_mle(spec, data.X, data.y, device=str(CUDA), **kw)
    # generalised EM to the same maximum: log-likelihoods (sums over n = 1500) agree to 1e-6 relative
    np.testing.assert_allclose(np.asarray(gpu.loglik), np.asarray(cpu.loglik), rtol=1e-6)
    assert _mean_gap(spec, gpu.params, cpu.params, data.X) < 1e-4


def test_reference_path_newton_fit_on_cuda_equals_cpu():
    """fit_lse on the autograd reference path (a cosine gate): the residual Jacobian from per-observation parameter
    copies, the exact Hessian by reverse over reverse, the certificate."""
    spec = ms.MoE(gate="cosine", k=2, d=2, expert="gelu")
    truth = ms.Params([0.5, 0.0], [[1.0, 1.0], [-1.0, 0.5]], [[1.0, -0.5], [-1.0, 0.5]], [0.2, -0.2])
    data = ms.simulate(spec, truth, n=3000, reps=2, seed=5)
    kw = dict(init="near_truth", truth=truth, seed=6, optimizer="newton")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = ms.fit_lse(spec, data.X, data.y, device="cpu", **kw)
        gpu = ms.fit_lse(spec, data.X, data.y, device=str(CUDA), **kw)
    assert gpu.settings["kernel"] == cpu.settings["kernel"] == "autograd"
    # Newton to the same minimum: objectives (means of 3000 squares) agree to 1e-9 relative, the certificate's
    # smallest eigenvalue (a difference of sums) to 1e-5 of the largest scale
    np.testing.assert_allclose(gpu.objective, cpu.objective, rtol=1e-9)
    np.testing.assert_allclose(gpu.hessian_min_eig, cpu.hessian_min_eig, rtol=1e-4, atol=1e-8)
    assert _mean_gap(spec, gpu.params, cpu.params, data.X) < 1e-4


def test_glm_formula_fit_with_an_offset_and_its_predictions_on_cuda_equal_cpu():
    """A Poisson formula fit with a gate covariate and an offset (EM's fused IRLS step, the closed-form L-BFGS
    gradient, the offset column), its standard errors (the observed information and the sandwich, from the plain
    autograd Hessian and per-observation scores), then the predictive kinds: variance, and the delta-method SE of the
    mean (autograd through the packed parameters, every point at its own copy) with its interval."""
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 1500
    df = pd.DataFrame({"x": rng.normal(size=n), "z": rng.normal(size=n), "t": rng.uniform(0.5, 3.0, n)})
    upper = rng.random(n) < 1 / (1 + np.exp(-2 * df["z"]))
    df["c"] = rng.poisson(df["t"] * np.exp(np.where(upper, 1.0 + 0.5 * df["x"], -0.5 - 0.3 * df["x"])))
    kw = dict(formula="c ~ x", data=df, k=2, family="poisson", gate_formula="~ z", offset="np.log(t)", restarts=3,
              seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = ms.fit_mle(**kw, device="cpu")
        gpu = ms.fit_mle(**kw, device=str(CUDA))
    # the same optimum: log-likelihoods (sums over n = 1500) to 1e-8 relative, coefficients to 1e-5
    assert float(gpu.loglik) == pytest.approx(float(cpu.loglik), rel=1e-8)
    np.testing.assert_allclose(np.asarray(gpu.theta), np.asarray(cpu.theta), atol=1e-5)
    for cov in ("oim", "sandwich"):  # the same optimum to 1e-5: the SEs there to 1e-4 relative
        np.testing.assert_allclose(gpu.bse(cov), cpu.bse(cov), rtol=1e-4, err_msg=cov)
    new = df.iloc[:20]
    for kind in ("mean", "variance", "mean_se"):
        np.testing.assert_allclose(gpu.predict(new, kind), cpu.predict(new, kind), rtol=1e-4, err_msg=kind)
    np.testing.assert_allclose(gpu.predict(new, "mean_ci"), cpu.predict(new, "mean_ci"), rtol=1e-4)


@pytest.fixture(scope="module")
def gated():
    return ms.simulate_gated_nn(n=3000, reps=2, seed=0, d=4, k=2)


@pytest.mark.parametrize("fitter", ["tensor", "em", "l2"])
def test_gated_network_fits_on_cuda_equal_cpu(gated, fitter):
    data = gated
    fn = {"tensor": ms.fit_tensor, "em": ms.fit_em_gated, "l2": ms.fit_l2_gated}[fitter]
    kw = {"tensor": dict(l4_iters=100, gate_iters=50), "em": dict(iters=20), "l2": dict(iters=100)}[fitter]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = fn(data.X, data.y, 2, restarts=2, seed=0, device="cpu", dtype="float64", **kw)
        gpu = fn(data.X, data.y, 2, restarts=2, seed=0, device=str(CUDA), dtype="float64", **kw)
    # the same iterations in float64 from the same starts: a fixed budget, so round-off only
    np.testing.assert_allclose(np.asarray(gpu.objective), np.asarray(cpu.objective), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gpu.params.numpy().expert_weight, cpu.params.numpy().expert_weight,
                               rtol=1e-5, atol=1e-7)


def test_cluster_moe_on_cuda_follows_the_cpu_trajectory():
    from moestat.deep.cluster_moe import fit_cluster_moe, fit_single_cnn

    tr, te = ms.simulate_clusters(setting=3, n=400, reps=2, seed=7).split(200)
    kw = dict(T=40, eta=0.01, eta_r=1.0, test=te, eval_every=20, seed=3, dtype="float64", router_noise=1.0)
    cpu = fit_cluster_moe(tr, device="cpu", **kw)
    gpu = fit_cluster_moe(tr, device=str(CUDA), **kw)
    # same seeded draws (initial weights, router noise) and float64 steps: routing decisions coincide
    np.testing.assert_allclose(gpu.W.detach().cpu().numpy(), cpu.W.detach().cpu().numpy(), rtol=1e-7, atol=1e-9)
    kw1 = dict(J=8, T=30, seed=1, dtype="float64", batch_size=16)
    c1 = fit_single_cnn(tr, device="cpu", **kw1)
    g1 = fit_single_cnn(tr, device=str(CUDA), **kw1)
    np.testing.assert_allclose(g1.W.detach().cpu().numpy(), c1.W.detach().cpu().numpy(), rtol=1e-7, atol=1e-9)


def test_patch_moe_on_cuda_equals_cpu():
    from moestat.deep.patch_moe import fit_pmoe

    data = ms.simulate_patches(n=200, reps=2, seed=0)
    kw = dict(epochs=3, seed=0, dtype="float64")
    cpu = fit_pmoe(data, device="cpu", **kw)
    gpu = fit_pmoe(data, device=str(CUDA), **kw)
    np.testing.assert_allclose(np.asarray(gpu.objective), np.asarray(cpu.objective), rtol=1e-7, atol=1e-10)


def test_estimate_gbar_on_cuda_equals_cpu():
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    # L-BFGS named: the tolerance below was measured for it on an H200 (estimate_gbar's default is now Newton)
    kw = dict(n_mc=20_000, restarts=2, duplicate=[0], seed=0, max_iter=100, tol=0.0, optimizer="lbfgs")
    cpu = ms.estimate_gbar(spec, truth, spec.k + 1, device="cpu", **kw)
    gpu = ms.estimate_gbar(spec, truth, spec.k + 1, device=str(CUDA), **kw)
    # 100 float64 L-BFGS steps from the same starts on the same Monte-Carlo inputs; round-off steers them apart
    # inside the flat valley (measured on an H200: 1.8e-7 absolute), which G-bar's near-minimiser threshold
    # tol_l2 = 1e-4 cannot see: 1e-6 keeps a 100x margin below it
    np.testing.assert_allclose(np.asarray(gpu.l2), np.asarray(cpu.l2), rtol=0, atol=1e-6)


def test_study_with_a_pool_on_cuda_and_one_on_the_cpu(tmp_path):
    """A study run with one process pool per device (``workers={"cuda": 1, "cpu": 1}``): the GPU's worker starts
    on the largest cell, the CPU's on the smallest, every cell runs once, and each cell's converged fit has the
    objective of an all-CPU run where both converged (float64 Newton to its tolerance from the same seeded start)."""
    if CUDA.type != "cuda":
        pytest.skip("a second device is needed (MOESTAT_TEST_DEVICE=cpu leaves one)")
    study = ms.Study(truth={"preset": "sigmoid_vs_softmax", "regime": 2, "expert": "relu", "d": 4, "seed": 0},
                     fit={"label": "lse", "k": "truth+1"}, n=[400, 800, 1600, 3200], reps=2, seed=3, threads=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = study.run(progress=False, device="cpu")
        mixed = study.run(tmp_path, progress=False, workers={str(CUDA): 1, "cpu": 1})
    device = mixed.groupby("n")["device"].agg(set)
    assert device.loc[3200] == {str(CUDA)} and device.loc[400] == {"cpu"}
    assert list(mixed["cell"]) == list(cpu["cell"])
    # fits converged on both devices from the same start: the same minimum up to round-off (1e-6, as for fit_lse);
    # on the CPU 5 of these 8 converge (the other three stop at the iteration cap, where round-off may part them)
    both = (mixed["converged"] & cpu["converged"]).to_numpy()
    assert both.sum() >= 4
    np.testing.assert_allclose(mixed["objective"][both], cpu["objective"][both], rtol=1e-6)
