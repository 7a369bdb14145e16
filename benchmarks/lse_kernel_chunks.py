"""Sweep of the least-squares kernel's block size: eager and native (issue 3).

Workload: the nguyen2024 regime-2 preset (d = 32, k* = 8, relu experts, sigmoid truth) fitted with
k = 9, float64; R = 20 replicates at n = 1,000 and 10,000, one at n = 100,000.  For each n and minimum
chunk size, prints one objective + gradient
evaluation as a ratio to the forward product it contains (``theta @ X^T`` for all R problems), both
measured in the same run (lower deciles of 40 calls of each, alternating).  Run

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/lse_kernel_chunks.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import moestat as ms
from moestat.fit._objective import MeanKernel
from moestat.papers import presets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lse_batched import interleaved_ratio


def main() -> None:
    torch.set_num_threads(1)
    truth = presets.sigmoid_vs_softmax(regime=2)
    spec = truth.spec.with_k(9)
    print("| R | n | rows per chunk | eager ratio |")
    print("|---|---|---|---|")
    for R, n in ((20, 1000), (20, 10_000), (1, 100_000)):  # the last: a study's replicate block at n = 1e5
        sweep(truth, spec, n, R)
    print("\n| R | n | native block rows | native ratio |")
    print("|---|---|---|---|")
    for R, n in ((20, 1000), (20, 10_000), (1, 100_000)):
        sweep_native(truth, spec, n, R)


def workload(truth, spec, n: int, R: int):
    """Data, a parameter batch and the forward product ``theta @ X^T`` that the kernels are compared with."""
    k, p = spec.k, spec.d + 1
    data = ms.simulate(truth.spec, truth.params, n=n, reps=R, seed=1)
    X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
    Xa = torch.cat([torch.ones(R, n, 1, dtype=X.dtype), X], -1)
    theta = torch.randn(R, 1, 2 * k, p, dtype=X.dtype) * 0.2
    Z = torch.empty(R, 2 * k, n, dtype=X.dtype)

    def fwd():
        torch.bmm(theta.reshape(R, 2 * k, p), Xa.transpose(1, 2), out=Z)

    return theta, Xa, y, fwd


def sweep(truth, spec, n: int, R: int) -> None:
    """Print one table row per minimum chunk size at sample size ``n``."""
    theta, Xa, y, fwd = workload(truth, spec, n, R)
    for min_elems in (2**17, 2**18, 2**19, 2**20, 2**30):
        kernel = MeanKernel.from_spec(spec, chunk_min_elems=min_elems)
        ratio = interleaved_ratio(lambda kernel=kernel: kernel.value_grad(theta, Xa, y), fwd, 40)[0]
        rows = kernel._chunk_rows(R, 1, n, spec.d + 1, 8)
        print(f"| {R} | {n} | {rows} | {ratio:.2f} |", flush=True)

def sweep_native(truth, spec, n: int, R: int) -> None:
    """Print one table row per block size of the native kernel (``_native.BLOCK_BYTES``)."""
    from moestat.fit import _native

    if _native.load() is None:
        print("| native kernel unavailable |")
        return
    theta, Xa, y, fwd = workload(truth, spec, n, R)
    kernel = MeanKernel.from_spec(spec, compile="native")
    default = _native.BLOCK_BYTES
    try:
        for block_bytes in (2**18, 2**19, 2**20, 2**21, 2**22):
            _native.BLOCK_BYTES = block_bytes
            ratio = interleaved_ratio(lambda: kernel.value_grad(theta, Xa, y), fwd, 40)[0]
            print(f"| {R} | {n} | {_native.block_rows(2 * spec.k, spec.d + 1, 8)} | {ratio:.2f} |", flush=True)
    finally:
        _native.BLOCK_BYTES = default


if __name__ == "__main__":
    main()
