"""Benchmark of the batched least-squares engine (issue 3).  Prints ratios measured in the same run.

Workload: the nguyen2024 regime-2 preset (d = 32, k* = 8, relu experts, sigmoid truth), fitted with
k = 9 experts (duplicate=[0]) from near-truth starts, R = 20 replicates.

1. Kernel cost: one objective + gradient evaluation vs the forward matrix product it contains
   (``theta @ X^T`` for all R problems), for the hand-fused eager kernel, the native C++ kernel (CPU) and
   plain autograd through ``MoE.mean_torch``; achieved GFLOP/s of the two products against a measured
   square-matmul rate.  ``--device cuda`` times the kernels on a GPU (synchronised).
2. Batched fit vs a Python loop fitting the replicates one at a time, same settings (L-BFGS; ``--optimizer``
   picks another: since ``fit_lse``'s default became ``"auto"``, i.e. Newton for these 594 parameters, the
   optimiser is named explicitly).
3. L-BFGS vs Adam vs the papers' SGD protocol at n = 10,000: objective reached and wall time.
4. ``--parts scaling``: R = 20 replicates vs one at n = 10,000 (50 L-BFGS iterations), on the CPU and, when
   present, on CUDA, with the CPU/GPU time ratio (issue 3's GPU targets).
5. ``--parts converged``: ``fit_lse`` with its defaults (``optimizer="auto"``, i.e. trust-region Newton for these
   594 parameters, run to its own tolerances) on R replicates at once, on one replicate, and (``--loop``) on a
   loop of R single-replicate fits from the same starts, per device of ``--devices``: the converged estimator's
   batching targets (batched >= 3x the loop at n = 1,000 and >= 1.5x at 10,000 on the CPU; R = 20 <= 2x R = 1
   on a GPU).  ``--compile`` times ``fit_lse(compile=True)`` instead; ``--threads N`` gives every call N CPU
   threads (the C++ loop then runs N of a batch's problems at once).

Timings use the lower decile of repeated calls (the machine may be shared); a kernel and the forward
product it is compared with are called alternately, so that load changes hit both alike.  Run

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/lse_batched.py [--quick] [--device cuda] [--parts ...]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

import moestat as ms
from moestat.fit import ConvergenceWarning
from moestat.fit._objective import MeanKernel

SYNC = {"fn": lambda: None}  # torch.cuda.synchronize when timing CUDA work


def timed(fn) -> float:
    SYNC["fn"]()
    t = time.perf_counter()
    fn()
    SYNC["fn"]()
    return time.perf_counter() - t


def lower_decile(fn, reps: int) -> float:
    fn()
    return float(np.quantile([timed(fn) for _ in range(reps)], 0.1))


def interleaved_ratio(num, den, reps: int) -> tuple[float, float, float]:
    """``(t_num / t_den, t_num, t_den)`` from lower deciles of calls alternating between the two, so that a
    change in the machine's load during the measurement affects numerator and denominator alike."""
    num(), den()
    t_num, t_den = [], []
    for _ in range(reps):
        for fn, ts in ((den, t_den), (num, t_num)):
            ts.append(timed(fn))
    a, b = float(np.quantile(t_num, 0.1)), float(np.quantile(t_den, 0.1))
    return a / b, a, b


def matmul_rate(size: int = 512, reps: int = 20, device: str = "cpu", dtype: torch.dtype = torch.float64) -> float:
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    return 2 * size**3 / lower_decile(lambda: a @ b, reps) / 1e9


def kernel_table(spec, truth, n: int, R: int, reps: int, device: str = "cpu",
                 dtype: torch.dtype = torch.float64) -> list[dict]:
    fit_spec = spec.with_k(9)
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
    X = torch.as_tensor(data.X, device=device, dtype=dtype)
    y = torch.as_tensor(data.y, device=device, dtype=dtype)
    Xa = torch.cat([torch.ones(R, n, 1, dtype=X.dtype, device=device), X], -1)
    k, p = fit_spec.k, fit_spec.d + 1
    theta = torch.randn(R, 1, 2 * k, p, dtype=X.dtype).to(device) * 0.2
    Z = torch.empty(R, 2 * k, n, dtype=X.dtype, device=device)
    def fwd():
        torch.bmm(theta.reshape(R, 2 * k, p), Xa.transpose(1, 2), out=Z)

    t_fwd = lower_decile(fwd, reps)
    flops = 2 * 2 * R * n * p * 2 * k  # forward + backward products
    rows = [{"n": n, "kernel": "forward product only", "ms": t_fwd * 1e3, "ratio": 1.0,
             "GFLOP/s": flops / 2 / t_fwd / 1e9}]
    eager = MeanKernel.from_spec(fit_spec)
    ratio, t, _ = interleaved_ratio(lambda: eager.value_grad(theta, Xa, y), fwd, reps)
    rows.append({"n": n, "kernel": "fused eager (moestat default)", "ms": t * 1e3, "ratio": ratio,
                 "GFLOP/s": flops / t / 1e9})
    native = MeanKernel.from_spec(fit_spec, compile="native") if device == "cpu" else None
    if native is not None and native.native is not None:
        ratio, t, _ = interleaved_ratio(lambda: native.value_grad(theta, Xa, y), fwd, reps)
        rows.append({"n": n, "kernel": "native C++ (compile=True on CPU)", "ms": t * 1e3, "ratio": ratio,
                     "GFLOP/s": flops / t / 1e9})

    def autograd():
        th = theta.reshape(R, 2 * k, p).clone().requires_grad_(True)
        prm = ms.Params(th[:, :k, 0], th[:, :k, 1:], th[:, k:, 1:], th[:, k:, 0])
        loss = ((fit_spec.mean_torch(prm, X) - y) ** 2).mean(-1).sum()
        loss.backward()

    ratio, t, _ = interleaved_ratio(autograd, fwd, reps)
    rows.append({"n": n, "kernel": "plain autograd", "ms": t * 1e3, "ratio": ratio, "GFLOP/s": flops / t / 1e9})
    return rows


def batched_vs_loop(spec, truth, n: int, R: int, max_iter: int, optimizer: str = "lbfgs") -> dict:
    fit_spec = spec.with_k(9)
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
    kw = {"truth": truth, "duplicate": [0], "seed": 2, "underdetermined": "warn",
          "max_iter": max_iter, "condition": False, "optimizer": optimizer}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ms.fit_lse(fit_spec, data.X[:2], data.y[:2], **{**kw, "max_iter": 2})  # warm-up
        t0 = time.perf_counter()
        batched = ms.fit_lse(fit_spec, data.X, data.y, **kw)
        t_batch = time.perf_counter() - t0
        starts = ms.fit.init.near_truth(fit_spec, truth, R, duplicate=[0], scale=0.05, seed=2)
        t0 = time.perf_counter()
        loop = [ms.fit_lse(fit_spec, data.X[r], data.y[r], **{**kw, "init": starts.select(r), "truth": None,
                                                               "duplicate": None}) for r in range(R)]
        t_loop = time.perf_counter() - t0
    obj_loop = np.array([f.objective[0] for f in loop])
    return {"n": n, "R": R, "optimizer": batched.settings["optimizer"], "max_iter": max_iter, "batched_s": t_batch,
            "loop_s": t_loop,
            "speedup": t_loop / t_batch,
            "max_rel_objective_diff": float(np.max(np.abs(obj_loop - batched.objective) / batched.objective)),
            "iters_batched": int(batched.n_iter.sum()), "iters_loop": int(sum(f.n_iter[0] for f in loop))}


def optimiser_table(spec, truth, n: int, R: int, lbfgs_iter: int, adam_iter: int) -> list[dict]:
    fit_spec = spec.with_k(9)
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
    kw = {"truth": truth, "duplicate": [0], "seed": 2, "underdetermined": "warn",
          "condition": False}
    runs = [("lbfgs", {"max_iter": lbfgs_iter}), ("adam", {"max_iter": adam_iter, "lr": 1e-3}),
            ("sgd", {"epochs": 10, "lr": 0.1, "batch_size": 32})]
    rows = []
    for name, extra in runs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            t0 = time.perf_counter()
            fit = ms.fit_lse(fit_spec, data.X, data.y, optimizer=name, **kw, **extra)
            wall = time.perf_counter() - t0
        rows.append({"optimizer": name, "settings": extra, "median_objective": float(np.median(fit.objective)),
                     "max_objective": float(fit.objective.max()), "median_grad_norm": float(np.median(fit.grad_norm)),
                     "converged": int(fit.converged.sum()), "wall_s": wall})
    return rows


def scaling_table(spec, truth, n: int, R: int, iters: int, devices: list[str], optimizer: str = "lbfgs"
                  ) -> list[dict]:
    """Cost of R replicates against one, per device, and each device's time against the CPU's (same fits).

    A fixed number of L-BFGS iterations (``tol = gtol = 0``), float64 everywhere so that the devices do the
    same arithmetic; a warm-up fit per device pays kernel selection and allocator growth first."""
    fit_spec = spec.with_k(9)
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
    kw = {"truth": truth, "duplicate": [0], "seed": 2, "underdetermined": "warn",
          "max_iter": iters, "tol": 0.0, "gtol": 0.0,
          "condition": False, "dtype": "float64", "optimizer": optimizer}
    rows, cpu_time = [], None
    for device in devices:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            ms.fit_lse(fit_spec, data.X[:2], data.y[:2], device=device, **{**kw, "max_iter": 2})
            times = {}
            for reps in (1, R):
                t0 = time.perf_counter()
                ms.fit_lse(fit_spec, data.X[:reps], data.y[:reps], device=device, **kw)
                times[reps] = time.perf_counter() - t0
        cpu_time = times[R] if device == "cpu" else cpu_time
        rows.append({"device": device, "n": n, "iterations": iters, "R=1 s": times[1], f"R={R} s": times[R],
                     f"R={R} / R=1": times[R] / times[1],
                     "CPU / device (R)": (cpu_time / times[R]) if cpu_time is not None else float("nan")})
    return rows


def converged_table(spec, truth, n: int, R: int, devices: list[str], loop: bool, compile: bool = False,
                    threads: int = 1) -> list[dict]:
    """Converged fits with ``fit_lse``'s defaults (``compile``: with ``compile=True``, the Newton loop in C++ on a
    CPU): R replicates in one call against one replicate alone and, with ``loop``, against R single-replicate calls
    from the same near-truth starts (each replicate's start is drawn by the batched call's seed, so the loop repeats
    the batched fits one by one).  Also the time per replicate of the batched call.  ``threads``: ``fit_lse``'s
    CPU threads, the same for every call (the C++ loop runs a batch's problems on that many threads at once; a
    single problem can use them only inside its BLAS and LAPACK calls)."""
    fit_spec = spec.with_k(9)
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
    kw = {"truth": truth, "duplicate": [0], "seed": 2, "underdetermined": "warn", "compile": compile,
          "threads": threads}
    rows = []
    for device in devices:
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

        def run(X, y, device=device, sync=sync, **extra):
            sync()
            t0 = time.perf_counter()
            fit = ms.fit_lse(fit_spec, X, y, device=device, **{**kw, **extra})
            sync()
            return fit, time.perf_counter() - t0

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            run(data.X[:2], data.y[:2], max_iter=2)  # warm-up: allocator growth, kernel selection
            one, t_one = run(data.X[:1], data.y[:1])
            batched, t_batch = run(data.X, data.y)
            # a batched fit runs until its slowest replicate stops: the cost per iteration separates that from
            # the cost of carrying R problems through each iteration
            it_one, it_batch = int(one.n_iter.max()), int(batched.n_iter.max())
            row = {"device": device, "n": n, "R": R, "threads": threads, "optimizer": batched.settings["optimizer"],
                   "loop": batched.settings.get("newton_loop", "tensor"),
                   "R=1 s": t_one, f"R={R} s": t_batch, f"R={R} / R=1": t_batch / t_one,
                   "s per replicate (batched)": t_batch / R,
                   "iterations R=1": it_one, f"iterations R={R} (max)": it_batch,
                   "per-iteration ratio": (t_batch / it_batch) / (t_one / it_one),
                   "converged": f"{int(batched.converged.sum())}/{R}"}
            if loop:
                starts = ms.fit.init.near_truth(fit_spec, truth, R, duplicate=[0], scale=0.05, seed=2)
                t_loop, objs = 0.0, []
                for r in range(R):
                    fit, t = run(data.X[r], data.y[r], init=starts.select(r), truth=None, duplicate=None)
                    t_loop += t
                    objs.append(float(fit.objective[0]))
                row.update({"loop s": t_loop, "loop / batched": t_loop / t_batch,
                            "max rel objective diff": float(np.max(np.abs(np.array(objs) - batched.objective)
                                                                   / batched.objective))})
        rows.append(row)
        print(table([row]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    ap.add_argument("--device", default="cpu", help="device of the kernel part (cpu or cuda)")
    ap.add_argument("--dtype", default="float64", choices=("float64", "float32"), help="dtype of the kernel part")
    ap.add_argument("--devices", default=None, help="devices of the scaling part (default: cpu, and cuda if present)")
    ap.add_argument("--ns", default=None, help="comma-separated sample sizes (default 1000,10000; quick 200,1000)")
    ap.add_argument("--optimizer", default="lbfgs",
                    help="optimiser of the loop and scaling parts (fit_lse's default 'auto' runs Newton here)")
    ap.add_argument("--parts", default="kernel,loop,optim",
                    help="comma-separated: kernel, loop, optim, scaling (R replicates vs one, CPU vs CUDA), "
                         "converged (fit_lse's defaults, R replicates vs one, and vs a loop with --loop)")
    ap.add_argument("--loop", action="store_true", help="converged part: also time the loop of single fits")
    ap.add_argument("--compile", action="store_true",
                    help="converged part: fit_lse(compile=True) (the Newton loop in C++ on a CPU)")
    ap.add_argument("--threads", type=int, default=1,
                    help="converged part: fit_lse(threads=...) for every call, batched and looped (default 1)")
    args = ap.parse_args()
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    ns = [200, 1000] if args.quick else [1000, 10_000]
    if args.ns:
        ns = [int(v) for v in args.ns.split(",")]
    if args.device.startswith("cuda"):
        SYNC["fn"] = torch.cuda.synchronize
    R = 4 if args.quick else args.reps
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, R={R}, kernel device {args.device} "
          f"({args.dtype}), GPU {gpu}")
    size = 4096 if args.device.startswith("cuda") else 512
    rate = matmul_rate(size, device=args.device, dtype=getattr(torch, args.dtype))
    print(f"measured {args.dtype} matmul rate ({size}x{size}, {args.device}): {rate:.1f} GFLOP/s\n")
    parts = args.parts.split(",")
    if "kernel" in parts:
        rows = []
        for n in ns:
            rows += kernel_table(spec, truth, n, R, reps=10 if args.quick else 30, device=args.device,
                                 dtype=getattr(torch, args.dtype))
        for r in rows:
            r["% of matmul rate"] = 100 * r["GFLOP/s"] / rate
        print("## objective + gradient vs the forward product\n" + table(rows) + "\n", flush=True)
    if "loop" in parts:
        rows = [batched_vs_loop(spec, truth, n, R, max_iter=20 if args.quick else (100 if n <= 1000 else 30),
                                optimizer=args.optimizer) for n in ns]
        print(f"## batched fit vs per-replicate loop ({args.optimizer}, same settings)\n" + table(rows) + "\n",
              flush=True)
    if "optim" in parts:
        n = ns[-1]
        rows = optimiser_table(spec, truth, n, R, lbfgs_iter=30 if args.quick else 300,
                               adam_iter=30 if args.quick else 1000)
        print(f"## optimisers at n={n}\n" + table(rows) + "\n", flush=True)
    if "scaling" in parts:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        if args.devices:
            devices = args.devices.split(",")
        rows = scaling_table(spec, truth, ns[-1], R, iters=10 if args.quick else 50, devices=devices,
                             optimizer=args.optimizer)
        note = "" if "cuda" in devices else " (no CUDA device: CPU only)"
        print(f"## {R} replicates vs one{note}\n" + table(rows) + "\n", flush=True)
    if "converged" in parts:
        devices = args.devices.split(",") if args.devices else ["cpu"]
        rows = []
        for n in ns:
            rows += converged_table(spec, truth, n, R, devices, loop=args.loop, compile=args.compile,
                                    threads=args.threads)
        label = "fit_lse(compile=True)" if args.compile else "fit_lse defaults"
        print(f"## converged fits ({label}), {R} replicates vs one\n" + table(rows) + "\n", flush=True)


if __name__ == "__main__":
    main()
