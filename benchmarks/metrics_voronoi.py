"""Benchmark: Voronoi losses on 1,000 replicates x k = 9 fitted atoms x d = 32 (k* = 8), CPU.

Every loss is timed as one batched call and compared with a baseline measured in the same run: the
same D1 computed one replicate at a time with numpy (vectorised within a replicate), the way the
papers' scripts score fits.  Reports the median of ``--repeats`` timings.

    PYTHONPATH=$PWD python benchmarks/metrics_voronoi.py [--reps 1000] [--repeats 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import moestat as ms


def baseline_d1(fit: ms.Params, truth: ms.Params) -> np.ndarray:
    """D1 replicate by replicate in numpy (the per-replicate loop the batched code replaces)."""
    f, t = fit.numpy(), truth.numpy()
    om_t = np.concatenate([t.gate_weight, t.expert_weight, t.expert_bias[:, None]], 1)
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    out = np.empty(f.n_reps)
    for r in range(f.n_reps):
        om = np.concatenate([f.gate_weight[r], f.expert_weight[r], f.expert_bias[r][:, None]], 1)
        cell = ((om[:, None] - om_t[None]) ** 2).sum(-1).argmin(1)
        sizes = np.bincount(cell, minlength=t.k)
        d_b1 = np.linalg.norm(f.gate_weight[r] - t.gate_weight[cell], axis=1)
        d_eta = np.sqrt(((f.expert_weight[r] - t.expert_weight[cell]) ** 2).sum(1)
                        + (f.expert_bias[r] - t.expert_bias[cell]) ** 2)
        d_b0 = np.abs(f.gate_bias[r] - t.gate_bias[cell])
        over = sizes[cell] >= 2
        gap = np.abs(np.bincount(cell, weights=sig(f.gate_bias[r]), minlength=t.k) - sig(t.gate_bias))
        out[r] = (gap[sizes >= 2].sum() + (d_b1**2 + d_eta**2)[over].sum()
                  + (d_b0 + d_b1 + d_eta)[~over].sum())
    return out


def timeit(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--gbar-set", type=int, default=20, help="size S of the G-bar set for D3")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    _, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    idx = [*range(8), 0]                                   # k = 9: atom 0 duplicated
    w = 1 / (1 + np.exp(-truth.gate_bias[0])) / 2
    gb = truth.gate_bias[idx].copy()
    gb[[0, 8]] = np.log(w / (1 - w))
    start = ms.Params(gb, truth.gate_weight[idx], truth.expert_weight[idx], truth.expert_bias[idx])
    fit = start.batched(args.reps).perturb(0.01, seed=1)
    gbar_set = start.batched(args.gbar_set).perturb(0.005, seed=2)

    base = timeit(lambda: baseline_d1(fit, truth), args.repeats)
    np.testing.assert_allclose(ms.voronoi_loss(fit, truth, "D1"), baseline_d1(fit, truth), rtol=1e-12)
    cases = {
        "D1": lambda: ms.voronoi_loss(fit, truth, "D1"),
        "D1 strict": lambda: ms.voronoi_loss(fit, truth, "D1", strict=True),
        "D2 (r=2)": lambda: ms.voronoi_loss(fit, truth, "D2", r=2),
        "D3 (one G-bar)": lambda: ms.voronoi_loss(fit, None, "D3", gbar=start),
        f"D3 (inf over S={args.gbar_set})": lambda: ms.voronoi_loss(fit, None, "D3", gbar=gbar_set),
        "softmax (centred)": lambda: ms.voronoi_loss(fit, truth, "softmax"),
        "voronoi_cells": lambda: ms.voronoi_cells(fit, truth),
        "parameter_errors (frame)": lambda: ms.parameter_errors(fit, truth),
        "match_atoms hungarian": lambda: ms.match_atoms(fit, truth, "hungarian"),
    }
    print(f"R={args.reps} replicates, k=9, k*=8, d=32, torch threads={torch.get_num_threads()}, "
          f"median of {args.repeats}")
    print(f"{'operation':34s} {'seconds':>10s} {'x faster than baseline':>24s}")
    print(f"{'baseline: D1 per-replicate numpy':34s} {base:10.4f} {1.0:24.1f}")
    for name, fn in cases.items():
        t = timeit(fn, args.repeats)
        print(f"{name:34s} {t:10.4f} {base / t:24.1f}")


if __name__ == "__main__":
    main()
