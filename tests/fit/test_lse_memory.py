"""fit_lse's memory budget (issue 21): blocks of replicates sized from LSEMemoryModel bound the Hessians' memory, and
give the fit of one batch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import moestat as ms
from moestat.exceptions import ConvergenceWarning, MoestatWarning
from moestat.fit import _derivatives, _objective
from moestat.fit._memory import LSE_MEMORY_BUDGET, LSEMemoryModel, memory_bytes
from moestat.fit._objective import LSProblem
from moestat.fit.lse import _free_mask
from tests.torch_memory import torch_peak

# F = 2 k (d + 1) = 300 free parameters: each problem's Hessians (3 F^2 words, 2.1 MB) outweigh its n-length arrays,
# as at the flagship size (F = 594), while a fit stays fast
K, D, N = 6, 24, 400
SPEC = ms.MoE(gate="sigmoid", expert="gelu", k=K, d=D)
# device="cpu": the profiler measures the CPU allocator (on a GPU the Hessians live elsewhere)
KW = {"seed": 2, "max_iter": 2, "device": "cpu"}


def _truth(spec: ms.MoE) -> ms.Params:
    rng = np.random.default_rng(0)
    k, d = spec.k, spec.d
    return ms.Params(rng.normal(size=k), rng.normal(size=(k, d)) / np.sqrt(d), rng.normal(size=(k, d)) / np.sqrt(d),
                     rng.normal(size=k))


def _data(reps: int, spec: ms.MoE = SPEC, n: int = N):
    return ms.simulate(spec, _truth(spec), n=n, reps=reps, seed=1, inputs="gaussian")


def _fit(data, spec: ms.MoE = SPEC, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return ms.fit_lse(spec, data.X, data.y, **{**KW, **kw})


def _model(R: int, optimizer: str = "newton", spec: ms.MoE = SPEC, n: int = N) -> LSEMemoryModel:
    return LSEMemoryModel.of(optimizer, int(_free_mask(spec, torch.device("cpu")).sum()), n, R, spec.d, spec.k)


def test_default_budget_is_two_gigabytes_and_other_budgets_are_recorded():
    assert memory_bytes(LSE_MEMORY_BUDGET) == 2 * 10**9
    data = _data(2)
    fit = _fit(data, restarts=2)
    assert fit.settings["replicates_per_block"] == 2  # 2 x 2 problems of 2.9 MB: far inside the default
    assert "memory_budget" not in fit.settings  # a column only when asked for: default study frames keep theirs
    assert _fit(data, restarts=2, memory_budget="1GB").settings["memory_budget"] == 10**9
    assert _fit(data, restarts=2, memory_budget=None).settings["memory_budget"] is None


@pytest.mark.parametrize(("value", "error"), [("lots", ValueError), (-5, ValueError), (True, TypeError),
                                               ([1], TypeError)])
def test_bad_memory_budget_is_named(value, error):
    with pytest.raises(error, match="memory_budget"):
        ms.fit_lse(SPEC, *_xy(), memory_budget=value)


def _xy():
    data = _data(1)
    return data.X, data.y


def test_blocks_are_sized_from_the_model():
    R, S = 6, 2
    m = _model(R)
    budget = int(m.fixed + 2 * S * m.per_problem) + 1  # two replicates' problems
    assert m.replicates_per_block(budget, S, R) == 2
    assert m.replicates_per_block(None, S, R) == R
    fit = _fit(_data(R), restarts=S, memory_budget=budget)
    assert fit.settings["replicates_per_block"] == 2


def test_the_budget_bounds_the_fits_memory_and_gives_the_same_fit():
    # 8 replicates x 2 restarts: 16 problems, about 46 MB by the model in one batch; a 20 MB budget fits them in
    # blocks of three replicates, and the certificate (one Hessian per replicate) in blocks of six
    R, S = 8, 2
    data = _data(R)
    budget = 20 * 10**6
    m = _model(R)
    assert (m.replicates_per_block(budget, S, R), m.replicates_per_block(budget, 1, R, certificate=True)) == (3, 6)
    fits = {}
    peaks = {b: torch_peak(lambda b=b: fits.setdefault(b, _fit(data, restarts=S, memory_budget=b)))
             for b in (None, budget)}
    assert fits[None].settings["replicates_per_block"] == R
    assert fits[budget].settings["replicates_per_block"] == 3
    # not counted by the budget: the observation chunks' workspaces (objective, Hessian and the inputs' pair
    # products, 8 MiB each at most on a CPU), which do not grow with the problems
    assert peaks[budget] <= budget + 3 * 2**23
    assert peaks[None] > 1.5 * peaks[budget]
    # blocks change only the round-off of batched products (test_lse.py: test_cache_blocks_do_not_change_results)
    np.testing.assert_allclose(fits[budget].objective, fits[None].objective, rtol=1e-10)
    np.testing.assert_allclose(fits[budget].hessian_min_eig, fits[None].hessian_min_eig, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(fits[budget].cond, fits[None].cond, rtol=1e-6)


def test_certificate_and_kink_bound_in_blocks_equal_one_batch(monkeypatch):
    # relu experts (the kink bound runs on every problem) and L-BFGS: with a budget for one replicate the solve, the
    # kink bound and the certificate run one replicate at a time
    spec = ms.MoE(gate="softmax", expert="relu", k=3, d=4)
    data = _data(5, spec, 500)
    m = _model(5, "lbfgs", spec, 500)
    budget = int(m.fixed + max(2 * m.per_problem, m.certificate)) + 1
    assert (m.replicates_per_block(budget, 2, 5), m.replicates_per_block(budget, 1, 5, certificate=True)) == (1, 1)
    batches: dict[str, list[int]] = {"kink": [], "eigvalsh": []}
    kink, eigvalsh = LSProblem.kink_tolerance, torch.linalg.eigvalsh

    def spy_kink(self, theta):
        batches["kink"].append(theta.shape[0])
        return kink(self, theta)

    def spy_eigvalsh(H):
        batches["eigvalsh"].append(H.shape[0])
        return eigvalsh(H)

    monkeypatch.setattr(LSProblem, "kink_tolerance", spy_kink)
    monkeypatch.setattr(torch.linalg, "eigvalsh", spy_eigvalsh)
    one = _fit(data, spec, optimizer="lbfgs", restarts=2, max_iter=30, memory_budget=None)
    assert batches == {"kink": [10], "eigvalsh": [5, 5]}  # J^T J's and the exact Hessian's eigenvalues
    batches = {"kink": [], "eigvalsh": []}
    blocks = _fit(data, spec, optimizer="lbfgs", restarts=2, max_iter=30, memory_budget=budget)
    assert batches == {"kink": [2] * 5, "eigvalsh": [1] * 10}
    np.testing.assert_allclose(blocks.objective, one.objective, rtol=1e-10)
    np.testing.assert_allclose(blocks.cond, one.cond, rtol=1e-6)
    np.testing.assert_allclose(blocks.hessian_min_eig, one.hessian_min_eig, rtol=1e-6, atol=1e-12)
    assert list(blocks.restarts["status"]) == list(one.restarts["status"])


def test_a_budget_below_one_replicate_warns_and_fits_one_at_a_time():
    with pytest.warns(MoestatWarning, match="memory_budget=1000 bytes is below .* one replicate's 2 restart"):
        fit = _fit(_data(3), restarts=2, memory_budget=1000)
    assert fit.settings["replicates_per_block"] == 1
    # L-BFGS's own state is small: a budget for its restarts but not for the certificate warns about the certificate
    m = _model(3, "lbfgs")
    budget = int(m.fixed + 2 * m.per_problem) + 1
    with pytest.warns(MoestatWarning, match="one replicate's certificate"):
        _fit(_data(3), restarts=2, optimizer="lbfgs", memory_budget=budget)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MoestatWarning)
        _fit(_data(3), restarts=2, optimizer="lbfgs", memory_budget=budget, condition=False)  # no certificate


def test_the_estimate_bounds_the_measured_growth_per_problem():
    # the torch peak of one batch grows by about the model's per-problem bytes with each problem: the model must not
    # be below the measurement (it is an upper estimate: 1.3-1.6x it at the flagship size, docs/performance.md), nor
    # far above it (4x; measured 2.6x here, where the packed pair sums weigh more against F^2).  From 8 problems on:
    # below that the observation chunks' workspaces, which the model leaves out, are still growing to their caps
    peaks = {R: torch_peak(lambda R=R: _fit(_data(R), memory_budget=None, block_bytes=None)) for R in (8, 24)}
    data_per_replicate = 2 * N * (D + 2) * 8  # the model's fixed part: the data (arrays of the fit's own making)
    growth = (peaks[24] - peaks[8]) / 16 - data_per_replicate
    per = _model(8).per_problem
    assert growth <= per <= 4 * growth


@pytest.mark.parametrize(("gate", "optimizer", "condition"), [("cosine", "newton", True), ("laplace", "lbfgs", False)])
def test_the_estimate_bounds_the_measured_growth_per_problem_on_the_reference_path(gate, optimizer, condition):
    # the autograd reference path holds per problem what grows with n: the residual Jacobian and the graph of its
    # exact Hessian (Newton, the certificate) or the objective's graph (L-BFGS); measured 77-98 and 13-20 words per
    # observation for these gates, against the model's 118 and 28 (before its margin of 1.2)
    spec, n = ms.MoE(gate=gate, k=3, d=2, expert="gelu"), 4000
    kw = {"optimizer": optimizer, "condition": condition, "max_iter": 3, "memory_budget": None, "block_bytes": None}
    peaks = {R: torch_peak(lambda R=R: _fit(_data(R, spec, n), spec, **kw)) for R in (4, 12)}
    growth = (peaks[12] - peaks[4]) / 8 - 2 * n * (spec.d + 2) * 8
    per = LSEMemoryModel.of(optimizer, int(_free_mask(spec, torch.device("cpu")).sum()), n, 4, spec.d, spec.k,
                            reference_rows=2 * spec.k)
    assert growth <= per.per_problem <= 4 * growth
    assert growth <= per.certificate  # the certificate's Jacobian and Hessian graph too


def test_a_reference_path_fit_keeps_its_budget(monkeypatch):
    # the working memory the budget leaves out (the Jacobian's chunks of observations, about 10 MB, and the Hessian's
    # batched backward passes, 40-80 MB on a CPU) made small, so that what the budget bounds decides the peak
    monkeypatch.setitem(_objective.JACOBIAN_CHUNK_ELEMENTS, "cpu", 2**15)
    monkeypatch.setitem(_derivatives.HESSIAN_CHUNK_ELEMENTS, "cpu", 2**17)
    spec, R = ms.MoE(gate="cosine", k=3, d=2, expert="gelu"), 6
    data = _data(R, spec, 4000)
    kw = {"max_iter": 1, "block_bytes": None}
    fits: dict[int | None, ms.LSEFit] = {}
    peak_all = torch_peak(lambda: fits.setdefault(None, _fit(data, spec, memory_budget=None, **kw)))
    budget = int(peak_all / 2)
    peak = torch_peak(lambda: fits.setdefault(budget, _fit(data, spec, memory_budget=budget, **kw)))
    assert fits[None].settings["replicates_per_block"] == R
    assert 1 <= fits[budget].settings["replicates_per_block"] < R
    assert peak <= budget + 2**23  # what is left: chunks of 2^15 copies and passes of 2^17 numbers, under 8 MiB
    np.testing.assert_allclose(fits[budget].objective, fits[None].objective, rtol=1e-10)


def test_the_sgd_protocol_keeps_the_budget_and_its_paths():
    # the SGD protocol ignores block_bytes (one minibatch per step) but not the budget; each problem draws its
    # minibatches from its own stream, so blocks give the one-program fit to the bit
    data = _data(4)
    kw = {"optimizer": "sgd", "epochs": 1, "batch_size": 32, "lr": 0.01, "restarts": 2}
    m = LSEMemoryModel.of("sgd", int(_free_mask(SPEC, torch.device("cpu")).sum()), N, 4, D, K)
    budget = int(m.fixed + 2 * 2 * m.per_problem) + 1  # two replicates' problems
    one = _fit(data, memory_budget=None, condition=False, **kw)
    blocks = _fit(data, memory_budget=budget, condition=False, **kw)
    assert (one.settings["replicates_per_block"], blocks.settings["replicates_per_block"]) == (4, 2)
    np.testing.assert_array_equal(blocks.objective, one.objective)


def _held(kernel) -> int:
    return sum(t.numel() * t.element_size() for ws in kernel._ws.values() for t in ws.values())


def test_kernel_keeps_chunk_workspaces_within_its_cache_bytes(monkeypatch):
    """A shrinking active set asks the kernel for a workspace of a new shape at every size; on a GPU each reaches
    CUDA_WORKSPACE_BYTES, so the kernel keeps at most WORKSPACE_CACHE_BYTES of them (here scaled down to 1 MB, the
    shapes of 80 kB to 800 kB), where it used to keep seven whatever their size."""
    from moestat.fit import _objective
    from moestat.fit._objective import MeanKernel

    kernel = MeanKernel.from_spec(ms.MoE(gate="softmax", expert="gelu", k=3, d=2))
    like = torch.zeros(1, dtype=torch.float64)
    per_group = 2 * 500 * (8 * 3 + 2) * 8  # s = 2 restarts, n = 500 observations: 208 kB per group
    monkeypatch.setattr(_objective, "WORKSPACE_CACHE_BYTES", 10**6)
    for G in (4, 3, 2, 1, 4, 3):
        ws = kernel._workspace(G, 2, 500, like)
        assert ws["Z"].shape == (G, 2 * 2 * 3, 500)
        assert _held(kernel) <= 10**6
        assert kernel._workspace(G, 2, 500, like) is ws  # the workspace in use is reused, not made again
    assert _held(kernel) == 3 * per_group  # G = 3 alone: adding it to G = 4's would exceed the cap
    monkeypatch.setattr(_objective, "WORKSPACE_CACHE_BYTES", 2**31)  # the default: small CPU shapes, seven kept
    kernel._ws.clear()
    for G in range(1, 9):
        kernel._workspace(G, 2, 500, like)
    assert len(kernel._ws) == 1  # the eighth shape cleared the seven before it
    assert _held(kernel) == 8 * per_group


def test_fit_does_not_depend_on_the_kernels_workspace_cache(monkeypatch):
    """Workspaces are overwritten before they are read: a cache of one shape at a time gives the same fit, to the
    bit, as the default (restarts that stop at different iterations shrink the active set through many shapes)."""
    from moestat.fit import _objective

    spec = ms.MoE(gate="softmax", expert="gelu", k=3, d=2)
    data = ms.simulate(spec, _truth(spec), n=300, reps=3, seed=4, inputs="gaussian")
    kw = {"seed": 5, "restarts": 3, "device": "cpu", "block_bytes": None, "max_iter": 200}
    ref = _fit(data, spec, **kw)
    monkeypatch.setattr(_objective, "WORKSPACE_CACHE_BYTES", 1)
    small = _fit(data, spec, **kw)
    assert len(set(np.asarray(ref.n_iter).ravel())) > 1  # the replicates stopped at different iterations
    np.testing.assert_array_equal(small.objective, ref.objective)
    np.testing.assert_array_equal(small.n_iter, ref.n_iter)
    np.testing.assert_array_equal(small.restart_params.expert_weight, ref.restart_params.expert_weight)
