"""Benchmark: chen2022 MoE training batched over replicates vs a per-replicate loop.

Fits ``R`` replicates of the top-1 cubic MoE (Algorithm 1) once as one stacked tensor program and once
as ``R`` separate fits with the same child seeds, checks that both give the same weights, and prints
the wall-time ratio measured in the same run.  A second comparison times the sparse top-1 dispatch
(``routed_expert_output``) against computing every expert densely.

Usage::

    PYTHONPATH=. python benchmarks/cluster_moe_batched.py [--reps 8] [--n 1000] [--T 40] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

import moestat as ms
from moestat.deep import cluster_moe as cm
from moestat.deep import fit_cluster_moe


def _time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--T", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtype", default="float64")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train = ms.simulate_clusters(setting=1, n=args.n, reps=args.reps, seed=0)
    kw = dict(T=args.T, device="cpu", dtype=args.dtype)
    print(f"setting 1, K=4 P=4 d=50, M=8 J=16, R={args.reps}, n={args.n}, T={args.T}, {args.dtype}, "
          f"{args.threads} thread(s), best of {args.repeat}")
    for act in ("cubic", "linear"):
        res = {}
        t_batch = _time(lambda act=act, res=res: res.__setitem__(
            "b", fit_cluster_moe(train, activation=act, seed=1, **kw)), args.repeat)
        seeds = res["b"].seeds

        def loop(act=act, seeds=seeds, res=res):
            res["l"] = [fit_cluster_moe(train.select(r), activation=act, seed=[seeds[r]], **kw)
                        for r in range(args.reps)]

        t_loop = _time(loop, args.repeat)
        err = max(float((res["b"].W[r] - f.W[0]).abs().max()) for r, f in enumerate(res["l"]))
        print(f"moe-{act}: batched {t_batch:.3f} s, per-replicate loop {t_loop:.3f} s, "
              f"loop/batched = {t_loop / t_batch:.2f}x, max |W_batched - W_loop| = {err:.1e}")

    # sparse top-1 dispatch vs dense all-expert computation (forward + backward of the expert outputs)
    dt = torch.float64 if args.dtype == "float64" else torch.float32
    X = torch.as_tensor(train.X, dtype=dt)
    W = (0.1 * torch.randn(args.reps, 8, 50, 16, dtype=dt)).requires_grad_(True)
    expert = torch.randint(0, 8, (args.reps, args.n))

    def dense():
        torch.autograd.grad(cm.expert_outputs(X, W, "cubic").gather(-1, expert[..., None]).sum(), W)

    def routed():
        torch.autograd.grad(cm.routed_expert_output(X, W, expert, "cubic").sum(), W)

    t_d, t_r = _time(dense, args.repeat * 3), _time(routed, args.repeat * 3)
    print(f"cubic expert outputs (fwd+bwd, balanced routing): dense {t_d * 1e3:.1f} ms, routed {t_r * 1e3:.1f} ms, "
          f"dense/routed = {t_d / t_r:.2f}x")


if __name__ == "__main__":
    main()
