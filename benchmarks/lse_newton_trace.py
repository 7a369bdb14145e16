"""Diagnosis: the iterations of ``fit_lse``'s trust-region Newton method on one start of a ``lse_vs_scipy.py`` cell.

On the d = 1 cells of ``benchmarks/lse_vs_scipy.py`` moestat's Newton method needs two to three times the
iterations that scipy's ``least_squares(method="trf")`` needs evaluations, which is why those cells are its slowest
against scipy.  This script fits one replicate from one of the benchmark's k-means starts and prints, per iteration,
the damping :math:`\\lambda` of the trial, whether the step was accepted, the trial objective and the extreme
eigenvalues of the exact Hessian :math:`H` the step used (a long, curved valley shows as a condition number of
1e4-1e5 with :math:`\\lambda` oscillating and many short accepted steps); then the totals, and scipy's evaluations
from the same start with the same stopping rule.  The per-iteration values come from wrapping the solver's
trial-step function (``moestat.fit._optim._damped_trial``); the fit itself is ``fit_lse``'s.

``--timing R`` then times both fitters on that start, untraced, median of R runs after a warm-up: the whole
``fit_lse`` call, the same call stopped after one iteration (``max_iter=1``), their difference per further
iteration (the cost of one Newton iteration of one problem) and the rest (the call's fixed cost: checks, starting
layout, result frame); scipy's whole fit and its time per evaluation.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/lse_newton_trace.py --gate softmax --d 1 --k 2 --n 500 --rep 1 [--timing 21]
"""

from __future__ import annotations

import argparse
import sys
import timeit
import warnings
from pathlib import Path

import numpy as np
import torch

import moestat as ms
import moestat.fit._optim as optim

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lse_vs_scipy import PlainMoE, make_starts, run_scipy, theta_rows, truth_params  # the benchmark's own cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gate", default="softmax", choices=("softmax", "sigmoid"))
    parser.add_argument("--d", type=int, default=1)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--reps", type=int, default=5, help="replicates simulated (as lse_vs_scipy.py)")
    parser.add_argument("--restarts", type=int, default=4, help="k-means starts per replicate (as lse_vs_scipy.py)")
    parser.add_argument("--rep", type=int, default=1, help="the replicate traced")
    parser.add_argument("--start", type=int, default=0, help="the start traced")
    parser.add_argument("--gtol", type=float, default=1e-10)
    parser.add_argument("--max-iter", type=int, default=200)
    parser.add_argument("--timing", type=int, default=0, metavar="R",
                        help="also time both fitters on this start (median of R runs; 0: no timing)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = ms.MoE(gate=args.gate, expert="linear", k=args.k, d=args.d)
    data = ms.simulate(spec, truth_params(args.gate, args.k, args.d), n=args.n, reps=args.reps, seed=1,
                       inputs="gaussian")
    starts = make_starts(spec, data.X, data.y, args.restarts, "kmeans", seed=2)
    row = args.rep * args.restarts + args.start
    X, y, start = data.X[args.rep:args.rep + 1], data.y[args.rep:args.rep + 1], starts.select([row])

    trace: list[tuple[float, float, float, float, float]] = []
    inner = optim._damped_trial

    def traced(problem, theta, fidx, H, b, lam, D, tries=40):
        out = inner(problem, theta, fidx, H, b, lam, D, tries)
        eig = torch.linalg.eigvalsh(H[0])
        f_now = float(problem.value(theta)[0])
        trace.append((float(out[3][0]), float(out[2][0]), f_now, float(eig.min()), float(eig.max())))
        return out

    optim._damped_trial = traced
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ms.ConvergenceWarning)
            fit = ms.fit_lse(spec, X, y, init=start, restarts=1, gtol=args.gtol, max_iter=args.max_iter,
                             condition=False, optimizer="newton")
    finally:
        optim._damped_trial = inner
    print(f"{'it':>4} {'lambda':>9} {'accepted':>8} {'objective (trial)':>18} {'eig min':>10} {'eig max':>9}")
    rejected = 0
    for i, (lam, f_trial, f_now, lo, hi) in enumerate(trace):
        accepted = bool(np.isfinite(f_trial) and f_trial < f_now)
        rejected += not accepted
        print(f"{i:4d} {lam:9.2e} {accepted!s:>8} {f_trial:18.12f} {lo:10.2e} {hi:9.2e}")
    res = fit.restarts
    print(f"Newton: {int(res['n_iter'].iloc[0])} iterations, {rejected} trials rejected, status "
          f"{res['status'].iloc[0]}, objective {float(res['objective'].iloc[0]):.12f}")
    prob = PlainMoE(args.gate, args.k, data.X[args.rep], data.y[args.rep])
    x0 = theta_rows(start).reshape(1, -1)[0][prob.free]
    (sp,), _ = run_scipy([prob], [x0], "analytic", args.gtol, args.max_iter)
    print(f"scipy trf: {sp.nfev} evaluations, status {sp.status}, objective {prob.objective(sp.x):.12f}, "
          f"gradient {prob.grad_norm(sp.x):.2e}")
    if args.timing:
        iters = int(res["n_iter"].iloc[0])

        def newton(max_iter: int) -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ms.ConvergenceWarning)
                ms.fit_lse(spec, X, y, init=start, restarts=1, gtol=args.gtol, max_iter=max_iter, condition=False,
                           optimizer="newton")

        def scipy_fit() -> None:
            run_scipy([prob], [x0], "analytic", args.gtol, args.max_iter)

        def median_seconds(fn) -> float:  # after one warm-up call
            fn()
            return float(np.median(timeit.repeat(fn, number=1, repeat=args.timing)))

        t_full, t_one, t_sp = (median_seconds(f) for f in
                               (lambda: newton(args.max_iter), lambda: newton(1), scipy_fit))
        per_iter = (t_full - t_one) / max(iters - 1, 1)
        print(f"timing (median of {args.timing}): fit_lse {1e3 * t_full:.2f} ms for {iters} iterations = "
              f"{1e3 * (t_one - per_iter):.2f} ms fixed + {1e3 * per_iter:.3f} ms per iteration; "
              f"scipy {1e3 * t_sp:.2f} ms for {sp.nfev} evaluations = {1e3 * t_sp / sp.nfev:.3f} ms per evaluation")


if __name__ == "__main__":
    main()
