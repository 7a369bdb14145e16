"""``MeanKernel.value`` and ``MeanKernel.mean`` evaluated chunk by chunk of observations (issue 21): the same
numbers as one pass over all observations and as the model's own formula, with workspaces of one chunk only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import moestat as ms
from moestat.fit._objective import LSProblem, MeanKernel, ReferenceKernel
from moestat.fit.lse import _free_mask

CASES = [("sigmoid", "linear"), ("sigmoid", "relu"), ("softmax", "tanh"), ("softmax", "constant"),
         ("topk", "gelu"), ("softmax", "poly3")]


def _spec(gate: str, expert: str) -> ms.MoE:
    return ms.MoE(gate=gate, expert=expert, k=3, d=2, top_k=2 if gate == "topk" else None)


def _inputs(n: int, G: int = 2, s: int = 3, seed: int = 0):
    """theta (G, s, 2k, d+1), augmented X (G, n, d+1), y (G, n) for k = 3, d = 2."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.cat([torch.ones(G, n, 1, dtype=torch.float64),
                   torch.randn(G, n, 2, dtype=torch.float64, generator=gen)], -1)
    y = torch.randn(G, n, dtype=torch.float64, generator=gen)
    theta = 0.7 * torch.randn(G, s, 6, 3, dtype=torch.float64, generator=gen)
    return theta, X, y


def _kernel(spec: ms.MoE, rows: int | None) -> MeanKernel:
    """The eager kernel with chunks of ``rows`` observations (None: the defaults, one chunk at these sizes)."""
    if rows is None:
        return MeanKernel.from_spec(spec)
    # chunk_bytes=1 leaves the overhead floor: chunk_min_elems // (G s 2k) rows per chunk (G s 2k = 36 here)
    return MeanKernel.from_spec(spec, chunk_bytes=1, chunk_min_elems=36 * rows)


@pytest.mark.parametrize("gate,expert", CASES)
@pytest.mark.parametrize("rows", [1, 7, 50])
def test_chunked_value_and_mean_equal_one_pass_and_model(gate, expert, rows):
    spec = _spec(gate, expert)
    theta, X, y = _inputs(53)
    if not spec.family.input_dependent:
        theta[:, :, 3:, 1:] = 0.0  # constant experts: fit_lse holds the expert slopes at 0 (not free)
    chunked, whole = _kernel(spec, rows), _kernel(spec, None)
    assert chunked._chunk_rows(2, 3, 53, 3, 8) == rows
    assert whole._chunk_rows(2, 3, 53, 3, 8) == 53
    ref = ReferenceKernel(spec)  # independent: the model's own mean formula (MoE.mean_from_linear)
    f = chunked.mean(theta, X)
    # 1e-12: the same per-observation arithmetic; only the split of the sum of squares into chunks differs
    torch.testing.assert_close(f, whole.mean(theta, X), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f, ref.mean(theta, X), rtol=1e-12, atol=1e-12)
    L = chunked.value(theta, X, y)
    torch.testing.assert_close(L, whole.value(theta, X, y), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(L, ref.value(theta, X, y), rtol=1e-12, atol=1e-12)
    # and the objective against a direct sum over observations of the returned mean (brute force, numpy)
    expect = ((f.numpy() - y.numpy()[:, None]) ** 2).mean(-1)
    np.testing.assert_allclose(L.numpy(), expect, rtol=1e-12, atol=1e-15)
    # value_grad's objective (chunked the same way, a separate code path) agrees too
    torch.testing.assert_close(chunked.value_grad(theta, X, y)[0], L, rtol=1e-12, atol=1e-15)


def test_workspace_holds_one_chunk_only():
    """After value() and mean() on n = 4,000 observations with 100-row chunks every cached buffer spans at most
    100 observations; a whole-n workspace (the behaviour before chunking) would fail this."""
    spec = _spec("sigmoid", "relu")
    theta, X, y = _inputs(4000)
    kernel = _kernel(spec, 100)
    kernel.value(theta, X, y)
    kernel.mean(theta, X)
    sizes = {buf.shape[-1] for ws in kernel._ws.values() for buf in ws.values()}
    assert sizes == {100}
    elems = sum(buf.numel() for ws in kernel._ws.values() for buf in ws.values())
    assert elems <= 2 * 3 * (8 * 3 + 2) * 100  # G s (8k + 2) c: one chunk's workspace


def test_ls_problem_value_and_kink_bound_unchanged_by_chunks():
    """LSProblem.value and kink_tolerance (which uses mean) give the same numbers with tiny chunks."""
    spec = _spec("sigmoid", "relu")
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(3, 200, 2, dtype=torch.float64, generator=gen)
    y = torch.randn(3, 200, dtype=torch.float64, generator=gen)
    theta = 0.5 * torch.randn(6, 18, dtype=torch.float64, generator=gen)
    free = _free_mask(spec, torch.device("cpu"))
    small = LSProblem(_kernel(spec, 9), X, y, 2, free)
    big = LSProblem(_kernel(spec, None), X, y, 2, free)
    torch.testing.assert_close(small.value(theta), big.value(theta), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(small.kink_tolerance(theta), big.kink_tolerance(theta), rtol=1e-12, atol=0.0)
    # after an active-set change the data are gathered per problem (s = 1): still equal
    idx = torch.tensor([1, 4])
    small.set_active(idx)
    big.set_active(idx)
    torch.testing.assert_close(small.value(theta[idx]), big.value(theta[idx]), rtol=1e-12, atol=1e-15)
