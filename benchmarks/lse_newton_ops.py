"""Tensor operations per iteration of ``fit_lse``'s Newton loop (the tensor loop, ``compile=False``), by phase.

On a GPU the converged fit is bound by the host: every tensor operation is a kernel launch costing a few microseconds
of host time, whatever the arrays' size (docs/performance/lse.md, *Converged fits on the GPU*).  The number of
operations per iteration is therefore the GPU's cost model, and it can be counted exactly on any machine: a
``TorchDispatchMode`` sees every ATen operation the loop dispatches.  Operations that launch nothing on a GPU
(views, scalar reads, empty allocations) are counted apart.  Phases: ``hessian`` (:meth:`LSProblem.gauss_newton`,
the exact Hessian and gradient at accepted points), ``trial value`` (:meth:`LSProblem.value` at each trial point),
``solve`` (the damped Cholesky solve), ``loop`` (the rest of :func:`moestat.fit._optim.newton`: gradient norm,
stopping tests, gain ratio, damping update).  Also printed: wall time per iteration of the whole fit, one thread
(fit set-up and result included).

Counts are deterministic; with ``--baseline PATH`` (a moestat tree, e.g. from ``git worktree add /tmp/old <rev>``)
the same cells run on that tree in a child process and the ratios baseline / this tree are printed.  Run::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/lse_newton_ops.py [--baseline /tmp/old] [--device cuda]

With ``--device cuda`` the fits run on the GPU (its own chunking), so the counts are its kernel launches and the
times its host-bound milliseconds per iteration.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import moestat as ms
from moestat.fit import _objective, _optim

#: (label, gate, expert, k fitted, d, n, R): the flagship preset (sigmoid-gated truth, gelu experts, fitted with
#: k = 9) at one and twenty replicates, and a small softmax problem where the host's share is largest.
#: One replicate each: at n = 1,000 all observations fit one chunk on a CPU as on a GPU, so the counts are those a
#: GPU would launch (a CPU splits larger problems into cache-sized chunks, a GPU does not).
CELLS = [("flagship", "flagship", "gelu", 9, 32, 1000, 1), ("small softmax", "softmax", "linear", 3, 2, 1000, 1),
         ("small sigmoid", "sigmoid", "gelu", 3, 2, 1000, 1)]
REPEAT = 5  # timed fits per cell (the minimum is printed)
NO_LAUNCH = {"detach", "lift_fresh", "alias", "_local_scalar_dense", "empty", "new_empty", "scalar_tensor"}


class _Count(TorchDispatchMode):
    def __init__(self, phase: list[str]) -> None:
        super().__init__()
        self.phase = phase
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        launches = not (func.is_view or func.overloadpacket.__name__ in NO_LAUNCH)
        self.counts[self.phase[-1] if launches else "no launch"] += 1
        return func(*args, **(kwargs or {}))


def _phase(phase: list[str], name: str, fn):
    def wrapped(*args, **kwargs):
        phase.append(name)
        try:
            return fn(*args, **kwargs)
        finally:
            phase.pop()
    return wrapped


def _workload(gate: str, expert: str, k: int, d: int, n: int, R: int):
    if gate == "flagship":
        spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert=expert, seed=0)
        data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
        return spec.with_k(k), data, {"truth": truth, "duplicate": [0], "seed": 2, "underdetermined": "warn"}
    spec = ms.MoE(gate=gate, expert=expert, k=k, d=d)
    rng = np.random.default_rng(3)
    truth = ms.Params(rng.normal(size=k), rng.normal(size=(k, d)), rng.normal(size=(k, d)), rng.normal(size=k),
                      noise_sd=np.full(k, 0.1))
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
    return spec, data, {"seed": 2}


def count_cell(gate: str, expert: str, k: int, d: int, n: int, R: int, device: str = "cpu") -> dict:
    """Operations per Newton iteration by phase, and seconds per iteration of an uncounted fit (the fastest of
    :data:`REPEAT`)."""
    spec, data, kw = _workload(gate, expert, k, d, n, R)
    kw = {**kw, "optimizer": "newton", "condition": False, "device": device}
    phase = ["loop"]
    saved = {}
    targets = [(_objective.LSProblem, "gauss_newton", "hessian"), (_objective.LSProblem, "value", "trial value"),
               (_optim, "_damped_solve", "solve")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ms.fit_lse(spec, data.X, data.y, **{**kw, "max_iter": 2})  # warm-up
        seconds = float("inf")
        for _ in range(REPEAT):
            t0 = time.perf_counter()
            fit = ms.fit_lse(spec, data.X, data.y, **kw)
            seconds = min(seconds, time.perf_counter() - t0)
        iters = int(fit.restarts["n_iter"].sum())
        for owner, name, label in targets:
            saved[(owner, name)] = getattr(owner, name)
            setattr(owner, name, _phase(phase, label, saved[(owner, name)]))
        counter = _Count(phase)
        try:
            with counter:
                ms.fit_lse(spec, data.X, data.y, **kw)
        finally:
            for (owner, name), fn in saved.items():
                setattr(owner, name, fn)
    out = {phase_name: c / iters for phase_name, c in counter.counts.items()}
    out["launches"] = sum(v for key, v in out.items() if key != "no launch")
    out["iterations"] = iters
    out["ms per iteration"] = 1e3 * seconds / iters
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="a moestat tree to count in a child process, for ratios in the same run")
    ap.add_argument("--device", default="cpu", help="the fits' device (on cuda the counts are the kernel launches)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the child's output format
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = {label: count_cell(*cell, device=args.device) for label, *cell in CELLS}
    if args.json:
        print(json.dumps(rows))
        return
    base = None
    if args.baseline:  # baseline, this tree, baseline: the times are the faster of each side's two runs
        env = {**os.environ, "PYTHONPATH": args.baseline}
        runs = []
        for _ in range(2):
            done = subprocess.run([sys.executable, __file__, "--json", "--device", args.device], env=env,
                                  capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            if len(runs) == 1:
                again = {label: count_cell(*cell, device=args.device) for label, *cell in CELLS}
                for label, row in rows.items():
                    row["ms per iteration"] = min(row["ms per iteration"], again[label]["ms per iteration"])
        base = runs[0]
        for label, row in base.items():
            row["ms per iteration"] = min(row["ms per iteration"], runs[1][label]["ms per iteration"])
    print(f"torch {torch.__version__}, device {args.device}, one thread; operations per Newton iteration")
    phases = ["hessian", "trial value", "solve", "loop", "launches", "no launch", "ms per iteration"]
    print("| cell | iterations | " + " | ".join(phases) + (" | launches, baseline / this | ms, baseline / this"
                                                             if base else "") + " |")
    print("|---" * (2 + len(phases) + (2 if base else 0)) + "|")
    for label, row in rows.items():
        cells = [f"{row.get(p, 0.0):.1f}" for p in phases]
        extra = ""
        if base:
            b = base[label]
            if b["iterations"] != row["iterations"]:
                raise AssertionError(f"{label}: {b['iterations']} iterations in the baseline, {row['iterations']} here")
            extra = (f" | {b['launches']:.1f} / {row['launches']:.1f} = {b['launches'] / row['launches']:.2f}x"
                     f" | {b['ms per iteration'] / row['ms per iteration']:.2f}x")
        print(f"| {label} | {row['iterations']} | " + " | ".join(cells) + extra + " |")


if __name__ == "__main__":
    main()
