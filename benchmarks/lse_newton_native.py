"""The Newton loop in C++ (``fit_lse(compile=True)``) against the batched tensor loop (``fit_lse``'s default).

Both fit the same data from the same starts with ``fit_lse``'s defaults otherwise (``optimizer="auto"``: trust-region
Newton with the exact Hessian, to ``gtol`` 1e-10), so the two calls run the same method; the ratio is the time of
the default call over the time of the compiled one, whole calls (starts given, ``condition=False``), lower of
``--repeat`` alternating runs.  Printed per cell: both times, the ratio, the largest relative difference between the
two fits' objectives over the restarts both converged, converged restarts of each, and the median iterations.

Cells: the softmax and sigmoid cells of ``lse_vs_scipy.py`` (linear experts, k-means starts, R = 5 replicates x 4
starts), d = 2 cells with the experts whose C++ forms came later (leaky_relu, softplus, celu, poly2, poly3) and with
top-K gates (gelu experts, top 2 of 4 and of 8), gelu experts with near-truth starts at 119-950 free parameters, and
the flagship preset (regime 2, relu experts, sigmoid gate, k = 9, near-truth starts, R = 20, 594 free parameters).
Run::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/lse_newton_native.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
import torch
from lse_vs_scipy import md_table, truth_params  # benchmarks/ is on the path when this script runs

import moestat as ms
from moestat.fit.init import kmeans_init

SMALL = [("softmax", 1, 2, 500), ("softmax", 2, 3, 1000), ("softmax", 4, 4, 5000), ("sigmoid", 1, 2, 500),
         ("sigmoid", 2, 3, 1000), ("sigmoid", 4, 4, 5000)]
LARGE = [(16, 4, 2000), (8, 8, 2000), (24, 4, 2000), (49, 10, 2000)]
# the families whose C++ forms came after the first five, at d = 2, n = 1,000 with the truths of SMALL: polynomial
# experts at k = 2 with a softmax gate, where poly2 fits converge (poly3 fits there run to the iteration cap)
FAMILIES = [("sigmoid", "leaky_relu", 3), ("sigmoid", "softplus", 3), ("sigmoid", "celu", 3), ("softmax", "poly2", 2),
            ("softmax", "poly3", 2)]
# top-K softmax gates (C++ since the same day): gelu experts, d = 2, n = 1,000, keeping top_k of k
TOPK = [(4, 2), (8, 2)]


def gelu_truth(k: int, d: int) -> ms.Params:
    rng = np.random.default_rng(0)
    return ms.Params(rng.normal(size=k), rng.normal(size=(k, d)) / np.sqrt(d), rng.normal(size=(k, d)) / np.sqrt(d),
                     rng.normal(size=k), noise_sd=np.full(k, 0.1)).normalize_softmax(-1)


def compare(label: str, spec: ms.MoE, X, y, repeat: int, **kw) -> dict:
    def run(compile: bool):
        t0 = time.perf_counter()
        fit = ms.fit_lse(spec, X, y, condition=False, compile=compile, **kw)
        return fit, time.perf_counter() - t0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ms.ConvergenceWarning)
        run(False), run(True)  # warm-up (and the C++ build)
        times = {False: [], True: []}
        fits = {}
        for _ in range(repeat):
            for c in (False, True):
                fits[c], t = run(c)
                times[c].append(t)
    a, b = fits[False].restarts, fits[True].restarts
    stopped = {"gtol", "saddle", "kink"}  # the loops' own converged stops (saddle: a label fit_lse adds afterwards)
    both = (a["status"].isin(stopped) & b["status"].isin(stopped)).to_numpy()
    diff = np.abs(a["objective"] - b["objective"]) / a["objective"]
    return {"cell": label, "fits": len(a), "default s": min(times[False]), "compile=True s": min(times[True]),
            "ratio": min(times[False]) / min(times[True]), "loop": fits[True].settings.get("newton_loop", "tensor"),
            "max rel objective diff (both converged)": float(diff[both].max()) if both.any() else float("nan"),
            "converged default / compiled": f"{int(a['converged'].sum())}/{int(b['converged'].sum())}",
            "median iterations default / compiled": f"{int(a['n_iter'].median())}/{int(b['n_iter'].median())}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer cells and replicates (about 20 s)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.1f}\n")
    rows = []
    R, S = (2, 3) if args.quick else (5, 4)
    for gate, d, k, n in SMALL[::2] if args.quick else SMALL:
        spec = ms.MoE(gate=gate, expert="linear", k=k, d=d)
        data = ms.simulate(spec, truth_params(gate, k, d), n=n, reps=R, seed=1, inputs="gaussian")
        starts = kmeans_init(spec, data.X, data.y, S, seed=2)
        rows.append(compare(f"{gate} linear d={d} k={k} n={n}, {R}x{S} k-means starts", spec, data.X, data.y,
                            args.repeat, init=starts, restarts=S))
        print(md_table(rows[-1:]).splitlines()[-1], flush=True)
    for gate, expert, k in FAMILIES[1::2] if args.quick else FAMILIES:
        spec = ms.MoE(gate=gate, expert=expert, k=k, d=2)
        data = ms.simulate(spec, truth_params(gate, k, 2), n=1000, reps=R, seed=1, inputs="gaussian")
        starts = kmeans_init(spec, data.X, data.y, S, seed=2)
        rows.append(compare(f"{gate} {expert} d=2 k={k} n=1000, {R}x{S} k-means starts", spec, data.X, data.y,
                            args.repeat, init=starts, restarts=S))
        print(md_table(rows[-1:]).splitlines()[-1], flush=True)
    for k, top_k in TOPK[:1] if args.quick else TOPK:
        spec = ms.MoE(gate="topk", expert="gelu", k=k, d=2, top_k=top_k)
        data = ms.simulate(spec, truth_params("softmax", k, 2), n=1000, reps=R, seed=1, inputs="gaussian")
        starts = kmeans_init(spec, data.X, data.y, S, seed=2)
        rows.append(compare(f"topk (keeps {top_k}) gelu d=2 k={k} n=1000, {R}x{S} k-means starts", spec, data.X,
                            data.y, args.repeat, init=starts, restarts=S))
        print(md_table(rows[-1:]).splitlines()[-1], flush=True)
    for d, k, n in LARGE[:1] if args.quick else LARGE:
        spec = ms.MoE(gate="softmax", expert="gelu", k=k, d=d)
        truth = gelu_truth(k, d)
        data = ms.simulate(spec, truth, n=n, reps=2, seed=1)
        F = (2 * k - 1) * (d + 1)
        rows.append(compare(f"softmax gelu d={d} k={k} n={n} (F={F}), 2 near-truth fits", spec, data.X, data.y,
                            1 if args.quick else args.repeat, init="near_truth", truth=truth, seed=2))
        print(md_table(rows[-1:]).splitlines()[-1], flush=True)
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    Rf = 4 if args.quick else 20
    data = ms.simulate(spec, truth, n=1000, reps=Rf, seed=1)
    rows.append(compare(f"flagship preset, regime 2 relu, k=9, n=1000, R={Rf} near-truth", spec.with_k(9), data.X,
                        data.y, 1, init="near_truth", truth=truth, duplicate=[0], seed=2))
    print("\n## fit_lse: the Newton loop in C++ (compile=True) vs the batched tensor loop (default)\n" + md_table(rows))


if __name__ == "__main__":
    main()
