"""Benchmark: pMoE / CNN training batched over lanes (stacked weights) vs a per-lane Python loop.

Both arms train the same lanes (replicate x training size) with the same seeds, so the weights must
agree to rounding; the script checks that and prints the wall-time ratio loop / batched, measured in
the same run (absolute times are noisy on a shared machine).

    PYTHONPATH=. python benchmarks/patch_moe_batched.py [--reps 10] [--epochs 5] [--threads 1] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
import torch

import moestat as ms
from moestat.deep import fit_cnn, fit_pmoe

MODELS = {
    "pmoe-separate": (fit_pmoe, {"training": "separate", "l": 2}),
    "pmoe-joint": (fit_pmoe, {"training": "joint", "k": 8, "l": 6}),
    "cnn": (fit_cnn, {}),
}


def bench(reps: int, sizes: list[int], epochs: int, n_patches: int, d: int, dtype: str) -> pd.DataFrame:
    data = ms.simulate_patches(max(sizes), reps=reps, seed=1, n_patches=n_patches, d=d)
    rows = []
    for name, (fn, kw) in MODELS.items():
        common = {"m": 40, "epochs": epochs, "batch_size": 20, "device": "cpu", "dtype": dtype, **kw}
        t0 = time.perf_counter()
        batched = fn(data, sizes=sizes, seed=7, **common)
        t_batched = time.perf_counter() - t0
        seeds = np.random.SeedSequence(7).spawn(len(batched.lanes))
        t0 = time.perf_counter()
        loop = []
        for i, row in batched.lanes.iterrows():
            r, N = int(row["rep"]), int(row["n_train"])
            loop.append(fn(data.X[r:r + 1, :N], data.y[r:r + 1, :N], seed=[seeds[i]], **common))
        t_loop = time.perf_counter() - t0
        diff = max(float((batched.params["W"][i] - f.params["W"][0]).abs().max()) for i, f in enumerate(loop))
        rows.append({"model": name, "lanes": len(batched.lanes), "reps": reps, "sizes": str(sizes), "epochs": epochs,
                     "n_patches": n_patches, "d": d, "dtype": dtype, "threads": torch.get_num_threads(),
                     "batched_s": t_batched, "loop_s": t_loop, "speedup": t_loop / t_batched, "max_abs_diff": diff})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 200, 400])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--n-patches", type=int, default=16)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    frame = bench(args.reps, args.sizes, args.epochs, args.n_patches, args.d, args.dtype)
    pd.set_option("display.width", 160)
    print(frame.round(4).to_string(index=False))
    if args.out:
        frame.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
