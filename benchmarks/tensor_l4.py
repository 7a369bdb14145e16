"""Benchmark: cost of one L4 step (loss + gradient) of the sample form vs n and d.

The empirical L4 (makkuva2020 eq. 7) is evaluated per sample from U = X A^T and G = A A^T, so one
full-batch step costs O(n d k) and the d^4 moment tensor is never formed.  This script measures the
time of one forward + backward pass (an "epoch" of full-batch training) over grids of n and d and
reports ratios against the smallest size measured in the same run, plus the log-log slope (1 = linear).
For contrast it times the tensor form's one-off moment computation, O(n p^4), at small p.

Usage::

    PYTHONPATH=. python benchmarks/tensor_l4.py [--out docs/performance/tensor] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from moestat.fit.tensor import _l4_batched, _l4_moments


def _time_step(n: int, d: int, k: int, restarts: int, repeats: int, seed: int = 0) -> float:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(1, n, d, generator=g, dtype=torch.float64)
    y = torch.randn(1, n, generator=g, dtype=torch.float64)
    q4, q2 = y**4 - 6 * y**2, y**2
    A = torch.randn(1, restarts, k, d, generator=g, dtype=torch.float64, requires_grad=True)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        loss = _l4_batched(A, X, q4, q2, 24.0, 2.0, 0.1, 10.0, 1.0).sum()
        loss.backward()
        times.append(time.perf_counter() - t0)
        A.grad = None
    return float(np.median(times[1:]))


def _time_moments(n: int, p: int, repeats: int) -> float:
    X = torch.randn(1, n, p, dtype=torch.float64)
    y = torch.randn(1, n, dtype=torch.float64)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _l4_moments(X, y**4, y**2)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _slope(x, t) -> float:
    return float(np.polyfit(np.log(x), np.log(t), 1)[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/performance/tensor")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--restarts", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in (5_000, 10_000, 20_000, 50_000, 100_000, 200_000):
        rows.append(dict(sweep="n", n=n, d=20, seconds=_time_step(n, 20, args.k, args.restarts, args.repeats)))
    for d in (10, 20, 50, 100, 200, 400):
        rows.append(dict(sweep="d", n=20_000, d=d, seconds=_time_step(20_000, d, args.k, args.restarts,
                                                                      args.repeats)))
    for p in (2, 4, 6, 8, 10):
        rows.append(dict(sweep="moments_p", n=20_000, d=p, seconds=_time_moments(20_000, p, args.repeats)))
    df = pd.DataFrame(rows)
    df["k"], df["restarts"], df["threads"] = args.k, args.restarts, 1
    summary = []
    for sweep, x in (("n", "n"), ("d", "d"), ("moments_p", "d")):
        g = df[df["sweep"] == sweep].sort_values(x)
        base = g.iloc[0]
        df.loc[g.index, "size_ratio"] = g[x] / base[x]
        df.loc[g.index, "time_ratio"] = g["seconds"] / base["seconds"]
        summary.append(dict(sweep=sweep, loglog_slope=_slope(g[x], g["seconds"]),
                            tail_slope=_slope(g[x].iloc[-3:], g["seconds"].iloc[-3:])))
    df.to_csv(out / "tensor_l4.csv", index=False)
    summ = pd.DataFrame(summary)
    summ.to_csv(out / "tensor_l4_slopes.csv", index=False)
    print(df.to_string(index=False))
    print(summ.to_string(index=False))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (sweep, x, ref) in zip(axes, (("n", "n", 1), ("d", "d", 1), ("moments_p", "d", 4)), strict=True):
        g = df[df["sweep"] == sweep].sort_values(x)
        ax.loglog(g[x], g["time_ratio"], "o-", label="measured / smallest")
        ax.loglog(g[x], (g[x] / g[x].iloc[0]) ** ref, "k--", label=f"slope {ref}")
        ax.set_xlabel("p (tensor form)" if sweep == "moments_p" else x)
        ax.set_ylabel("time ratio")
        ax.legend(fontsize=8)
    axes[0].set_title("L4 step, sample form, d=20")
    axes[1].set_title("L4 step, sample form, n=20,000")
    axes[2].set_title("tensor-form moments O(n p^4), n=20,000")
    fig.tight_layout()
    fig.savefig(out / "tensor_l4.png", dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
