"""The C++ Newton loop's Hessian: pair sums in register tiles against the same sums as BLAS calls.

Each Newton iteration of ``fit_lse(compile=True)`` forms half the exact Hessian from the sums
:math:`M_{ab,ll'} = \\sum_t C_{ab,t}\\,\\tilde x_{tl}\\tilde x_{tl'}` (``mu = k(2k+1)`` pair rows C against
``mx = p(p+1)/2`` input pair products, p = d + 1), block by block of observations.  The loop computes them in
register tiles of up to 4 x 4 sums when ``mu * mx`` is at most its threshold (``SMALL_PRODUCT`` in
``moestat/fit/_newton_native.cpp``), else as two BLAS calls per block.  This script times the loop's own Hessian
evaluation (``value_hessian``, with the loop's block size) both ways on the same data, per shape, and prints the
time of each, BLAS over tiles, and the largest difference between the two Hessians (rounding).  Shapes: the small
problems of ``lse_vs_scipy.py``, the problems of 119-950 free parameters of ``lse_newton_native.py`` and the flagship
preset (k = 9, d = 32), all with linear experts: the pair sums do not depend on the activation, and the activation's
own cost (gelu's erf in particular) would only dilute the ratio.
Median of ``--repeat`` alternating rounds of ``--calls`` evaluations each.  Run::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/lse_newton_pair_sums.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from lse_vs_scipy import md_table  # benchmarks/ is on the path when this script runs

from moestat.fit import _native
from moestat.fit._optim import native_block_rows

# (gate, d, k, n): mu * mx from 30 (d = 1, k = 2) to 267,750 (d = 49, k = 10)
SHAPES = [("softmax", 1, 2, 500), ("softmax", 2, 3, 1000), ("softmax", 4, 3, 2000), ("sigmoid", 4, 4, 5000),
          ("softmax", 8, 4, 5000), ("softmax", 16, 4, 2000), ("softmax", 8, 8, 2000), ("softmax", 24, 4, 2000),
          ("sigmoid", 32, 9, 1000), ("softmax", 49, 10, 2000)]
QUICK = [SHAPES[1], SHAPES[4], SHAPES[8]]
TILES, BLAS = 1 << 62, 0  # small_product arguments: every sum in tiles / every block through BLAS


def shape_row(gate: str, d: int, k: int, n: int, calls: int, repeat: int) -> dict:
    module = _native.load_newton()
    rng = np.random.default_rng(0)
    p = d + 1
    X = torch.cat([torch.ones(n, 1, dtype=torch.float64), torch.as_tensor(rng.normal(size=(n, d)))], 1)
    XT = X.T.contiguous()
    y = torch.as_tensor(rng.normal(size=n))
    theta = torch.as_tensor(rng.normal(scale=1 / np.sqrt(p), size=2 * k * p))
    free = torch.ones(2 * k * p, dtype=torch.bool)
    if gate == "softmax":
        free[(k - 1) * p : k * p] = False
    free_idx = torch.nonzero(free).squeeze(1)
    chunk = native_block_rows(k, p, 8)
    linear = _native.ACTIVATION_CODES["linear"]

    def evaluate(small_product: int, evaluations: int = 1) -> torch.Tensor:
        """H after ``evaluations`` evaluations with one work space (allocated once, as in the loop)."""
        return module.value_hessian(theta, XT, y, free_idx, k, _native.GATE_CODES[gate], k, linear, False, 1.0,
                                    chunk, small_product, evaluations)[2]

    H = {"tiles": evaluate(TILES), "BLAS": evaluate(BLAS)}
    times: dict[str, list[float]] = {"tiles": [], "BLAS": []}
    for _ in range(repeat + 1):  # the first round warms up and is dropped
        for name, small_product in (("tiles", TILES), ("BLAS", BLAS)):
            t0 = time.perf_counter()
            evaluate(small_product, calls)
            times[name].append((time.perf_counter() - t0) / calls)
    tiles, blas = float(np.median(times["tiles"][1:])), float(np.median(times["BLAS"][1:]))
    mu, mx = k * (2 * k + 1), p * (p + 1) // 2
    return {"gate": gate, "d": d, "k": k, "n": n, "free": int(free.sum()), "mu * mx": mu * mx,
            "block rows": min(chunk, n), "tiles ms": round(tiles * 1e3, 4), "BLAS ms": round(blas * 1e3, 4),
            "BLAS / tiles": round(blas / tiles, 3),
            "max |H diff| / max |H|": f"{float((H['tiles'] - H['BLAS']).abs().max() / H['BLAS'].abs().max()):.1e}",
            "loop uses": "tiles" if mu * mx <= _native_small_product() else "BLAS"}


def _native_small_product() -> int:
    """The loop's threshold, read from its C++ source (the one place it is set)."""
    for line in _native.NEWTON_SOURCE.read_text().splitlines():
        if line.startswith("constexpr int64_t SMALL_PRODUCT"):
            return int(line.split("=")[1].strip(" ;"))
    raise RuntimeError("SMALL_PRODUCT not found in the Newton loop's source")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="three shapes (about 5 s)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.1f}, loop threshold mu*mx <= {_native_small_product()}\n")
    rows = []
    for gate, d, k, n in QUICK if args.quick else SHAPES:
        sums = k * (2 * k + 1) * (d + 1) * (d + 2) // 2 * n  # multiply-adds of one evaluation's pair sums
        calls = int(np.clip(3e7 // sums, 3, 5000))  # rounds of 10 ms or more, past the clock's ramp-up
        rows.append(shape_row(gate, d, k, n, calls, args.repeat))
        print(md_table(rows[-1:]).splitlines()[-1], flush=True)
    print("\n## the C++ Newton loop's Hessian: pair sums in register tiles vs BLAS\n" + md_table(rows))


if __name__ == "__main__":
    main()
