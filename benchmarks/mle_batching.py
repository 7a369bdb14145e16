"""Benchmark: one batched ``fit_mle`` call over R data sets against R separate calls (CPU time, same run).

Both use ``fit_mle``'s default memory budget (``"1GB"``: at the default sizes every fit is one block) unless
``--memory-budget`` names another (e.g. ``64MB`` to fit the batched call in blocks; ``none``: one block).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/mle_batching.py [--reps 20] [--n 1000] [--memory-budget 64MB]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

import moestat as ms

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mle_vs_flexmix import truth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--memory-budget", default=None, help="fit_mle's memory_budget (default: fit_mle's own)")
    args = parser.parse_args()
    opts = {} if args.memory_budget is None else {
        "memory_budget": None if args.memory_budget.lower() == "none" else args.memory_budget}
    warnings.simplefilter("ignore", ms.MLEConvergenceWarning)
    torch.set_num_threads(1)
    for k in (2, 3):
        spec = ms.MoE(gate="softmax", expert="linear", k=k, d=1)
        data = ms.simulate(spec, truth(k), n=args.n, reps=args.reps, seed=7, model="mixture")
        ms.fit_mle(spec, data.X[0], data.y[0], restarts=1, max_iter=3)  # warm-up
        t = time.process_time()
        for r in range(args.reps):
            ms.fit_mle(spec, data.X[r], data.y[r], restarts=5, seed=r, **opts)
        loop = time.process_time() - t
        t = time.process_time()
        ms.fit_mle(spec, data.X, data.y, restarts=5, seed=1, **opts)
        batch = time.process_time() - t
        print(f"k={k} n={args.n} R={args.reps}: {args.reps} separate fits {loop:.2f} s CPU, "
              f"one batched fit {batch:.2f} s CPU, ratio {loop / batch:.2f}x")


if __name__ == "__main__":
    main()
