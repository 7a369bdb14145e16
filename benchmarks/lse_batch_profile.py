"""Where a batched ``fit_lse`` loses against a Python loop of single-replicate fits on the CPU (issue 21).

Workload: R = 20 replicates of a k = 3, d = 2 MoE with linear experts (softmax and sigmoid gates), inputs
N(0, I), n in {200, 1000}; ``fit_lse`` with its defaults (``optimizer="auto"``, here trust-region Newton;
``init="kmeans"``; ``condition=True``).  The loop fits replicate r alone with the r-th child of the batched
fit's seed, so both start from the same values and reach the same objectives (checked and printed).

Parts (``--parts``), all ratios measured in the same run:

``fit``
    Wall time of the batched fit and of the loop (min and max of ``--repeat`` alternating runs), the speed-up
    loop / batched, and the minor page faults of each, in this process and in a child process whose glibc
    ``malloc`` keeps freed blocks (``MALLOC_MMAP_THRESHOLD_`` = 32 MiB, ``MALLOC_TRIM_THRESHOLD_`` = 1 GiB, the
    values ``mallopt`` accepts): a fresh multi-MB temporary is otherwise served by ``mmap`` or by heap memory just
    returned to the system, and every first touch of one of its pages faults.
``flagship``
    The same comparison on the workload of ``lse_batched.py --quick --parts loop`` (d = 32, k = 9 relu experts,
    near-truth starts, R = 4, n = 1000, 20 iterations), which measured 0.7-1.0x, with the optimiser it runs by
    default (``"auto"``: Newton for these 594 parameters).
``where``
    A cProfile breakdown of one batched fit and one loop into the pieces of ``fit_lse`` (starting values, solver,
    exact Hessian and its element-wise part, trial objectives, damped Cholesky steps, post-fit eigenvalues), each
    with its loop / batched time ratio: a ratio near 1 is a piece that batching does not make cheaper.
``kernel``
    One exact-Hessian assembly (``LSProblem.gauss_newton(exact=True)``) for A = 1 and A = R problems: the
    per-problem cost ratio (A = R time / R / A = 1 time; below 1 means batching pays) and page faults per call, in
    this process and with the malloc settings above.
``step``
    The linear algebra of one damped Newton step on R Hessians of F = 2k(d+1) parameters: batched LAPACK
    calls on the (R, F, F) batch (as ``newton`` ran them before) against the one-problem-at-a-time path it takes
    on a CPU since issue 21 (``fit._optim._damped_solve``); both give the same steps.
``kmeans``
    ``fit.init.kmeans_init`` (since issue 21 the Lloyd iterations of all replicates and starts run at once, in
    ``fit.init.lloyd_labels``) and the replicate-by-replicate Lloyd loop it replaced, from the same initial
    centres; the labels must agree.

Run (one torch thread; on a shared machine only the ratios of one run mean much)::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/lse_batch_profile.py [--quick] [--parts fit,where]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import moestat as ms
from moestat.fit._objective import LSProblem, MeanKernel
from moestat.fit._optim import _damped_solve, _take_accepted
from moestat.fit.init import _replicate_rngs, kmeans_init, lloyd_labels
from moestat.fit.lse import _free_mask

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lse_vs_scipy import md_table, truth_params

#: glibc malloc settings of the child runs: blocks up to 32 MiB from the heap, freed memory kept up to 1 GiB.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**25), "MALLOC_TRIM_THRESHOLD_": str(2**30)}

#: The pieces of ``fit_lse`` reported by the breakdown: label -> (file suffix, function name).
PIECES = {
    "fit_lse (total)": ("fit/lse.py", "fit_lse"),
    "starting values (kmeans_init)": ("fit/init.py", "kmeans_init"),
    "solver (newton)": ("fit/_optim.py", "newton"),
    "solver (lbfgs)": ("fit/_optim.py", "lbfgs"),
    "exact Hessian + gradient (gauss_newton, all calls)": ("fit/_objective.py", "gauss_newton"),
    "  of which curvature rows (exact_curvature_rows)": ("fit/_objective.py", "exact_curvature_rows"),
    "  of which pair products (_pair_products)": ("fit/_objective.py", "_pair_products"),
    "trial objective (LSProblem.value)": ("fit/_objective.py", "value"),
    "damped Cholesky step (_damped_trial)": ("fit/_optim.py", "_damped_trial"),
    "eigenvalues after the fit (eigvalsh)": ("", "linalg_eigvalsh"),
}


def minflt() -> int:
    """Minor page faults of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def workload(gate: str, n: int, R: int, k: int, d: int, expert: str):
    """Spec and data (R replicates) of one cell."""
    spec = ms.MoE(gate=gate, expert=expert, k=k, d=d)
    data = ms.simulate(spec, truth_params(gate, k, d, seed=0), n=n, reps=R, seed=1, inputs="gaussian")
    return spec, data


def batched(spec, data, seed: int, **kw):
    return ms.fit_lse(spec, data.X, data.y, seed=seed, **kw)


def loop(spec, data, seed: int, **kw):
    children = np.random.SeedSequence(seed).spawn(data.X.shape[0])  # the batched fit's per-replicate streams
    return [ms.fit_lse(spec, data.X[r], data.y[r], seed=[children[r]], **kw) for r in range(data.X.shape[0])]


def compare(run_batched, run_loop, repeat: int) -> dict:
    """Alternating timed runs of both paths (after a warm-up of each): times, page faults, objectives."""
    run_batched()
    run_loop()
    tb, tl, cb, cl, fb_, fl_ = [], [], [], [], [], []
    fb = fl = None
    for _ in range(repeat):
        f0, c0, t0 = minflt(), time.process_time(), time.perf_counter()
        fb = run_batched()
        tb.append(time.perf_counter() - t0)
        cb.append(time.process_time() - c0)
        fb_.append(minflt() - f0)
        f0, c0, t0 = minflt(), time.process_time(), time.perf_counter()
        fl = run_loop()
        tl.append(time.perf_counter() - t0)
        cl.append(time.process_time() - c0)
        fl_.append(minflt() - f0)
    obj_loop = np.array([f.objective[0] for f in fl])
    return {"optimizer": fb.settings["optimizer"], "batched s": f"{min(tb):.3g}-{max(tb):.3g}",
            "loop s": f"{min(tl):.3g}-{max(tl):.3g}", "speed-up": min(tl) / min(tb),
            "speed-up (CPU time)": min(cl) / min(cb),
            "faults batched": int(np.median(fb_)), "faults loop": int(np.median(fl_)),
            "iters batched (sum/max)": f"{int(fb.n_iter.sum())}/{int(fb.n_iter.max())}",
            "iters loop (sum)": int(sum(f.n_iter[0] for f in fl)), "converged": int(fb.converged.sum()),
            "max rel objective diff": float(np.max(np.abs(obj_loop - fb.objective) / np.abs(fb.objective)))}


def fit_rows(args) -> list[dict]:
    rows = []
    for gate in args.gates.split(","):
        for n in args.ns_list:
            spec, data = workload(gate, n, args.reps, args.k, args.d, args.expert)
            kw = {"optimizer": args.optimizer}
            res = compare(lambda spec=spec, data=data, kw=kw: batched(spec, data, 3, **kw),
                          lambda spec=spec, data=data, kw=kw: loop(spec, data, 3, **kw), args.repeat)
            rows.append({"gate": gate, "n": n, "R": args.reps, **res})
    return rows


def flagship_rows(args) -> list[dict]:
    """``lse_batched.py --quick --parts loop`` at n = 1000, with fit_lse's default optimiser."""
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    fit_spec, R, n = spec.with_k(9), 4, 1000
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
    kw = {"seed": 2, "underdetermined": "warn", "max_iter": 20, "condition": False, "optimizer": args.optimizer}
    starts = ms.fit.init.near_truth(fit_spec, truth, R, duplicate=[0], scale=0.05, seed=2)
    res = compare(lambda: ms.fit_lse(fit_spec, data.X, data.y, truth=truth, duplicate=[0], **kw),
                  lambda: [ms.fit_lse(fit_spec, data.X[r], data.y[r], init=starts.select(r), **kw) for r in range(R)],
                  args.repeat)
    return [{"workload": "d=32, k=9 relu, sigmoid gate", "n": n, "R": R, **res}]


def profile_pieces(fn) -> dict[str, float]:
    """cProfile cumulative seconds of each piece of :data:`PIECES` in one call of ``fn``."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    return {label: sum(v[3] for (file, _, func), v in stats.items()
                       if func == name and (file.endswith(suffix) if suffix else True)
                       and not any(c[2] == name for c in v[4]))  # top-level frames only (no recursion)
            for label, (suffix, name) in PIECES.items()}


def where_rows(args) -> list[dict]:
    rows = []
    for gate in args.gates.split(","):
        for n in args.ns_list:
            spec, data = workload(gate, n, args.reps, args.k, args.d, args.expert)
            kw = {"optimizer": args.optimizer}
            batched(spec, data, 3, **kw)
            pb = profile_pieces(lambda spec=spec, data=data, kw=kw: batched(spec, data, 3, **kw))
            pl = profile_pieces(lambda spec=spec, data=data, kw=kw: loop(spec, data, 3, **kw))
            for label in PIECES:
                if pb[label] > 0 or pl[label] > 0:
                    rows.append({"gate": gate, "n": n, "piece": label, "batched ms": 1e3 * pb[label],
                                 "loop ms": 1e3 * pl[label], "share of batched fit": pb[label] / pb["fit_lse (total)"],
                                 "loop / batched": pl[label] / pb[label] if pb[label] > 0 else float("nan")})
    return rows


def lower_decile(fn, reps: int) -> tuple[float, float]:
    """Lower decile of ``reps`` timed calls (after one warm-up) and the mean page faults per call."""
    fn()
    f0, ts = minflt(), []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.quantile(ts, 0.1)), (minflt() - f0) / reps


def kernel_rows(args) -> list[dict]:
    """Per-call cost of one exact-Hessian assembly for A = 1 and A = R problems (random parameters)."""
    rows, R, k, d = [], args.reps, args.k, args.d
    for gate in args.gates.split(","):
        spec = ms.MoE(gate=gate, expert=args.expert, k=k, d=d)
        for n in args.ns_list:
            res = {}
            for A in (1, R):
                gen = torch.Generator().manual_seed(0)
                X = torch.randn(A, n, d, dtype=torch.float64, generator=gen)
                y = torch.randn(A, n, dtype=torch.float64, generator=gen)
                prob = LSProblem(MeanKernel.from_spec(spec), X, y, 1, _free_mask(spec, torch.device("cpu")))
                theta = 0.5 * torch.randn(A, 2 * k * (d + 1), dtype=torch.float64, generator=gen)
                res[A] = lower_decile(lambda prob=prob, theta=theta: prob.gauss_newton(theta, exact=True),
                                      10 if args.quick else 30)
            rows.append({"gate": gate, "n": n, "A=1 ms": 1e3 * res[1][0], f"A={R} ms": 1e3 * res[R][0],
                         "per-problem cost ratio": res[R][0] / R / res[1][0], f"faults per call (A={R})": res[R][1]})
    return rows


def step_rows(args) -> list[dict]:
    """One damped Newton step's linear algebra on A = R exact Hessians of the flagship size (F = 2k(d+1)): the
    batched LAPACK calls (``cholesky_ex`` and ``cholesky_solve`` on the (A, F, F) batch, and the ``torch.where``
    that kept the accepted problems' Hessians, as ``newton`` ran them before issue 21's fix) against the per-problem
    path ``_damped_solve`` takes on a CPU now.  Both give the same bits (checked)."""
    R, F = args.reps, 2 * args.k * (args.d + 1)
    gen = torch.Generator().manual_seed(0)
    J = torch.randn(R, 2 * F, F, dtype=torch.float64, generator=gen)
    H = J.transpose(1, 2) @ J / F
    Dreg = H.diagonal(dim1=1, dim2=2).clone()
    lam = torch.full((R,), 1e-3, dtype=torch.float64)
    b = torch.randn(R, F, dtype=torch.float64, generator=gen)
    accept = torch.ones(R, dtype=torch.bool)
    accept[0] = False  # one rejected step, as after a failed trial
    H_new, H_old = H.clone(), H.flip(0)  # the fresh Hessians of an iteration and those they replace

    def batched_step():
        L, _ = torch.linalg.cholesky_ex(H + torch.diag_embed(lam.unsqueeze(1) * Dreg))
        step = torch.cholesky_solve(-b.unsqueeze(-1), L).squeeze(-1)
        return step, torch.where(accept.view(-1, 1, 1), H_new, H_old)

    def per_problem_step():
        return _damped_solve(H, b, lam, Dreg, tries=1)[0], _take_accepted(accept, H_new, H_old, int(accept.sum()))

    same = bool(torch.equal(batched_step()[0], per_problem_step()[0]))
    reps = 3 if args.quick else 10
    t_batched, t_loop = lower_decile(batched_step, reps)[0], lower_decile(per_problem_step, reps)[0]
    return [{"A": R, "F": F, "batched ms per problem": 1e3 * t_batched / R,
             "per-problem ms per problem": 1e3 * t_loop / R, "batched / per-problem": t_batched / t_loop,
             "same steps": same}]


def lloyd_loop(Zs: np.ndarray, centres: np.ndarray, n_iter: int) -> np.ndarray:
    """``kmeans_init``'s Lloyd iterations as they ran before issue 21, one data set at a time (the reference of
    the batched :func:`moestat.fit.init.lloyd_labels`)."""
    k, out = centres.shape[1], []
    for r in range(Zs.shape[0]):
        c = centres[r].copy()
        for _ in range(n_iter):
            lab = ((Zs[r][:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
            for i in range(k):
                if np.any(lab == i):
                    c[i] = Zs[r][lab == i].mean(0)
        out.append(((Zs[r][:, None, :] - c[None]) ** 2).sum(-1).argmin(1))
    return np.stack(out)


def kmeans_rows(args) -> list[dict]:
    """kmeans_init, the old one-data-set-at-a-time Lloyd loop and the batched ``lloyd_labels`` it now runs, from
    the same initial centres (the labels must agree)."""
    rows, R, n_iter = [], args.reps, 20
    for n in args.ns_list:
        spec, data = workload(args.gates.split(",")[0], n, R, args.k, args.d, args.expert)
        X, y = data.X, data.y
        Z = np.concatenate([X, y[..., None]], -1)
        Zs = (Z - Z.mean(1, keepdims=True)) / Z.std(1, keepdims=True)
        centres = np.stack([Zs[r][rng.choice(n, size=args.k, replace=False)]
                            for r, rng in enumerate(_replicate_rngs(5, R))])  # kmeans_init's first draws
        t_init = lower_decile(lambda spec=spec, X=X, y=y: kmeans_init(spec, X, y, 1, seed=5), 5)[0]
        t_loop = lower_decile(lambda Zs=Zs, c=centres: lloyd_loop(Zs, c, n_iter), 5)[0]
        t_batch = lower_decile(lambda Zs=Zs, c=centres: lloyd_labels(Zs, c, n_iter), 5)[0]
        same = (lloyd_loop(Zs, centres, n_iter) == lloyd_labels(Zs, centres, n_iter)).all(1)
        rows.append({"n": n, "R": R, "k": args.k, "kmeans_init ms": 1e3 * t_init, "old Lloyd loop ms": 1e3 * t_loop,
                     "batched Lloyd (lloyd_labels) ms": 1e3 * t_batch, "Lloyd loop / batched": t_loop / t_batch,
                     "labels equal": f"{int(same.sum())}/{R}"})
    return rows


PARTS = {"fit": fit_rows, "flagship": flagship_rows, "where": where_rows, "kernel": kernel_rows,
         "step": step_rows, "kmeans": kmeans_rows}
TITLES = {"fit": "batched fit vs loop of single-replicate fits (fit_lse defaults)",
          "flagship": "the lse_batched.py --quick loop workload, fit_lse's default optimiser",
          "where": "where the time goes (cProfile, one batched fit vs one loop)",
          "kernel": "one exact Hessian + gradient (LSProblem.gauss_newton), A = 1 vs A = R problems",
          "step": "a damped Newton step's linear algebra on R Hessians: batched LAPACK calls vs one problem at a time",
          "kmeans": "k-means starts: kmeans_init, the old Lloyd loop and the batched Lloyd iterations"}
#: Parts also run in a child process with :data:`MALLOC_ENV`, and the columns taken from it.
WITH_MALLOC = {"fit": ("speed-up", "speed-up (CPU time)", "faults batched"),
               "flagship": ("speed-up", "speed-up (CPU time)", "faults batched"),
               "kernel": ("per-problem cost ratio", "faults per call (A={R})")}


def child_rows(part: str, argv: list[str], malloc: bool) -> list[dict]:
    """Rows of ``part`` from a fresh child process (glibc's mmap threshold adapts to what a process has freed, so
    every measurement starts from the same allocator state), with :data:`MALLOC_ENV` when ``malloc``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(MALLOC_ENV if malloc else {})}
    cmd = [sys.executable, __file__, *argv, "--parts", part, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (the same sizes)")
    ap.add_argument("--ns", default="200,1000", help="comma-separated sample sizes")
    ap.add_argument("--gates", default="softmax,sigmoid")
    ap.add_argument("--expert", default="linear")
    ap.add_argument("--reps", type=int, default=20, help="replicates R")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--d", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=None, help="timed runs of each path (default 5; quick 2)")
    ap.add_argument("--optimizer", default="auto")
    ap.add_argument("--parts", default="fit,flagship,where,kernel,kmeans")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    args = ap.parse_args()
    args.ns_list = [int(v) for v in args.ns.split(",")]
    args.repeat = args.repeat or (2 if args.quick else 5)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # ConvergenceWarning of replicates that end on max_iter: counted in the tables
    parts = args.parts.split(",")
    if args.json:
        print(json.dumps([row for part in parts for row in PARTS[part](args)]))
        return
    argv = [a for i, a in enumerate(argv) if a != "--parts" and (i == 0 or argv[i - 1] != "--parts")]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, R={args.reps}, k={args.k}, d={args.d}, "
          f"expert {args.expert}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f}\n", flush=True)
    for part in parts:
        rows = child_rows(part, argv, malloc=False)
        if part in WITH_MALLOC:
            for row, other in zip(rows, child_rows(part, argv, malloc=True), strict=True):
                for col in WITH_MALLOC[part]:
                    col = col.format(R=args.reps)
                    row[f"{col}, malloc keeps blocks"] = other[col]
        print(f"## {TITLES[part]}\n" + md_table(rows) + "\n", flush=True)


if __name__ == "__main__":
    main()
