"""Peak memory of ``fit_lse`` and ``fit_mle`` as n and R grow, and of the least-squares pieces that chunk (issue 21).

Three measures of one call, each from its own run of the call (they disturb one another):

* **peak RSS**: the resident-set high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs`` before the
  call, after glibc's ``malloc_trim`` has returned freed heap memory) minus the resident set before the call:
  every page the call touched, numpy, torch and allocator slack included;
* **numpy peak**: ``tracemalloc``'s peak (numpy reports its buffers to it; torch does not);
* **torch peak**: the largest sum of live torch CPU allocations, replayed from ``torch.profiler`` memory events
  (each op's own allocations at its start, frees where they happen).

``fits``: ``fit_lse`` (sigmoid gate, k = 3 linear experts, d = 4, k-means start, Newton, at most 20 iterations;
with its CPU default ``block_bytes="auto"``, 8 MiB of inputs per block of replicates, and as one program,
``block_bytes=None``, the CUDA default; and with ``compile=True``, each problem's Newton run in C++, whose work arrays
are one block of observations per thread) and ``fit_mle`` (softmax gate, k = 3 linear experts, d = 4, EM with 2
random starts, at most 100 iterations) on R replicates of n observations.  Printed with each peak divided by n R:
a constant means memory linear in n R; the inputs take 8 (d + 1) = 40 bytes per observation and replicate.

``pieces``: the torch peak of one call of each least-squares piece for A = 8 problems of the flagship size
(k = 9, d = 32) as n grows: the objective + gradient (``MeanKernel.value_grad``, chunked to the L2 cache), the
exact Hessian (``LSProblem.gauss_newton(exact=True)``, under the preset's sigmoid gate and under softmax; chunked
to 8 MiB counting every temporary since issue 21, before to 8 MiB of pair products), the objective alone
(``MeanKernel.value``: the trial points of Newton and LM) and the mean (``MeanKernel.mean``: the kink bound of
relu fits), both chunked like ``value_grad`` since issue 21, and ``LSProblem.kink_tolerance`` (the mean, its
residuals and max |x|).  A piece that chunks has a peak that stops growing
with n, apart from its output (``mean`` returns A n values); one that does not grows like A n k.

``blocks``: ``fit_mle``'s memory budget (issue 21) on the issue's workload, R = 20 replicates x 5 random starts of
n observations (softmax gate, k = 3 linear experts, d = 4, EM then L-BFGS for the slow starts, ``fit_mle``'s
defaults otherwise): peak RSS, torch peak and wall time for ``memory_budget=None`` (one block: the behaviour before
issue 21), the default ``"1GB"`` and ``"256MB"``, with the number of blocks and whether every budget gave the same
fit (restart log-likelihoods to 1e-8 relative, the tolerance of EM's stopping rule).  n = 5,000 with ``--quick``,
20,000 without.

``lse-blocks``: ``fit_lse``'s memory budget (issue 21) on the flagship preset (k = 9, d = 32: 594 free parameters,
a 2.7 MiB Hessian per problem), R replicates x 4 restarts of n = 1,000 (R = 20 with ``--quick``, 80 without): peak
RSS, torch peak and wall time for no budget, the default ``"2GB"``, ``"512MB"`` and ``"256MB"``, without cache blocks
(``block_bytes=None``, the GPU's default, so that the budget alone decides the blocks), with the replicates per
block, the model's estimate for one block and whether every budget gave the same fit (objectives to 1e-10).  Peak
RSS after other fits of the same process includes the heap they left fragmented: ``--budgets 512MB`` runs one budget
(the first budget listed is the reference of "same fit").  ``--device cuda``: the same fits on a GPU, with the
device allocator's peak (the observation chunks' workspaces, which the budget does not count, included).

``largest-cell``: the peak RSS of the flagship vignette's (``sigmoid-vs-softmax``) largest cells, n = 160,000 with
both truth gates for one truth seed and ``--expert`` (gelu or relu), run in this process as the study runs them.

Run (Linux only: ``/proc/self/status`` and ``clear_refs``)::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/peak_memory.py [--quick] [--parts PARTS]

with PARTS a comma-separated list of fits, pieces, blocks, lse-blocks and largest-cell (default fits,pieces).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import os
import re
import sys
import time
import tracemalloc
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import moestat as ms
from moestat.fit._layout import ParamLayout
from moestat.fit._memory import LSEMemoryModel
from moestat.fit._objective import LSProblem, MeanKernel
from moestat.fit.lse import _free_mask
from moestat.fit.mle import MemoryModel, memory_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lse_vs_scipy import md_table, truth_params

MiB = 2.0**20
try:
    LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc: the RSS measure then includes what the allocator had cached
    LIBC = None


def _status(field: str) -> int:
    """A memory field of /proc/self/status (``VmRSS``, ``VmHWM``, ...), in bytes."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", text).group(1)) * 1024


def peak_rss(fn) -> float:
    """Resident-set high-water mark during ``fn()`` minus the resident set before it, in bytes.

    Freed heap memory is first returned to the system (glibc ``malloc_trim``), so that the call has to fault in
    every page it uses and the difference is its peak rather than what it needed beyond the allocator's cache."""
    gc.collect()
    if LIBC is not None:
        LIBC.malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current VmRSS
    before = _status("VmRSS")
    fn()
    return float(_status("VmHWM") - before)


def peak_numpy(fn) -> float:
    """tracemalloc's peak during ``fn()`` (numpy buffers and Python objects), in bytes."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return float(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()


def peak_torch(fn) -> float:
    """Largest sum of live torch CPU allocations during ``fn()``, from the profiler's memory events, in bytes."""
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return float(peak)


MEASURES = {"peak RSS": peak_rss, "numpy peak": peak_numpy, "torch peak": peak_torch}


def fit_call(which: str, n: int, R: int):
    """The fit to measure (data drawn before the call)."""
    d, k = 4, 3
    if which.startswith("fit_lse"):
        spec = ms.MoE(gate="sigmoid", expert="linear", k=k, d=d)
        data = ms.simulate(spec, truth_params("sigmoid", k, d), n=n, reps=R, seed=1, inputs="gaussian")
        blocks = None if "one program" in which else "auto"
        compiled = "compile=True" in which
        return lambda: ms.fit_lse(spec, data.X, data.y, seed=2, max_iter=20, block_bytes=blocks, compile=compiled)
    spec = ms.MoE(gate="softmax", expert="linear", k=k, d=d)
    truth = truth_params("softmax", k, d)
    truth = ms.Params(truth.gate_bias, truth.gate_weight, truth.expert_weight, truth.expert_bias,
                      noise_sd=np.full(k, 0.3))
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1, inputs="gaussian", model="mixture")
    return lambda: ms.fit_mle(spec, data.X, data.y, restarts=2, seed=2, max_iter=100, progress=False)


FITS = ("fit_lse", "fit_lse, one program (block_bytes=None)", "fit_mle (2 restarts)",
        "fit_lse(compile=True): the Newton loop in C++")
#: ``--fits`` names of :data:`FITS`.
FIT_KEYS = {"lse": FITS[0], "lse-one-program": FITS[1], "mle": FITS[2], "lse-compiled": FITS[3]}


def fit_rows(ns: list[int], Rs: list[int], fits: tuple[str, ...] = FITS) -> list[dict]:
    """Each measure of each fit on the grid, with the peak per observation and replicate against the input's 40 B."""
    rows = []
    for which in fits:
        fit_call(which, 200, 2)()  # warm-up: imports, kernels, allocator arenas
        for n in ns if "one program" not in which else ns[-1:]:
            for R in Rs:
                call = fit_call(which, n, R)
                vals = {name: measure(call) for name, measure in MEASURES.items()}
                rows.append({"fit": which, "n": n, "R": R, "input MiB": 8 * 5 * n * R / MiB,
                             **{f"{name} MiB": v / MiB for name, v in vals.items()},
                             "torch peak per obs x rep (B)": vals["torch peak"] / (n * R),
                             "RSS peak per obs x rep (B)": vals["peak RSS"] / (n * R)})
                print(md_table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


def piece_rows(ns: list[int], A: int = 8) -> list[dict]:
    """Peak torch allocations of one call of each least-squares piece (flagship size) as n grows."""
    truth = ms.presets.sigmoid_vs_softmax(regime=2)
    spec = truth.spec.with_k(9)
    rows = []
    for n in ns:
        data = ms.simulate(truth.spec, truth.params, n=n, reps=A, seed=1)
        X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
        kernel = MeanKernel.from_spec(spec)
        prob = LSProblem(kernel, X, y, 1, _free_mask(spec, torch.device("cpu")))
        theta = 0.2 * torch.randn(A, prob.P, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        th4 = theta.reshape(A, 1, *prob.shape)
        soft = dataclasses.replace(spec, gate="softmax")
        prob_soft = LSProblem(MeanKernel.from_spec(soft), X, y, 1, _free_mask(soft, torch.device("cpu")))
        calls = {"value_grad (chunked, L2)": partial(kernel.value_grad, th4, prob.X, prob.y),
                 "gauss_newton exact (chunked, 8 MiB)": partial(prob.gauss_newton, theta, exact=True),
                 "gauss_newton exact, softmax gate (chunked, 8 MiB)": partial(prob_soft.gauss_newton, theta,
                                                                              exact=True),
                 "kink_tolerance": partial(prob.kink_tolerance, theta),
                 "value (trial points; chunked, L2)": partial(kernel.value, th4, prob.X, prob.y),
                 "mean (kink bound; chunked, L2)": partial(kernel.mean, th4, prob.X)}
        data_mib = (prob.X.numel() + prob.y.numel()) * 8 / MiB
        for name, fn in calls.items():
            kernel._ws.clear()  # a cold workspace, as after an active-set change
            prob_soft.kernel._ws.clear()
            peak = peak_torch(fn)
            rows.append({"piece": name, "A": A, "n": n, "data MiB": data_mib, "torch peak MiB": peak / MiB,
                         "bytes per obs x problem": peak / (n * A)})
    return rows


def measured_fit(fit_call):
    """``(fit, peak RSS, wall seconds, torch peak)`` of a fit: the first run gives the fit, its peak RSS and time,
    a second run under the profiler the torch peak (the measures disturb one another)."""
    fits: list = []
    t0 = time.perf_counter()
    rss = peak_rss(lambda: fits.append(fit_call()))
    wall = time.perf_counter() - t0
    tp = peak_torch(fit_call)
    return fits[0], rss, wall, tp


def block_rows(n: int, R: int = 20, budgets: tuple = (None, "1GB", "256MB")) -> list[dict]:
    """Peak RSS, torch peak and wall time of the issue's fit_mle workload under each memory budget."""
    d, k = 4, 3
    spec = ms.MoE(gate="softmax", expert="linear", k=k, d=d)
    truth = truth_params("softmax", k, d)
    truth = ms.Params(truth.gate_bias, truth.gate_weight, truth.expert_weight, truth.expert_bias,
                      noise_sd=np.full(k, 0.3))
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1, inputs="gaussian", model="mixture")
    model = MemoryModel.of(spec, ParamLayout(spec), R, n, weighted=False, trials=False)
    rows, ref = [], None
    for budget in budgets:
        fit, rss, wall, tp = measured_fit(lambda budget=budget: ms.fit_mle(
            spec, data.X, data.y, restarts=5, seed=2, memory_budget=budget, progress=False))
        ref = fit if ref is None else ref
        b = memory_bytes(budget)
        per = model.problems_per_block(b, n, R * 5, "em")
        rows.append({"budget": str(budget), "n": n, "R x S": R * 5, "EM blocks": -(-R * 5 // per),
                     "problems per EM block": per, "peak RSS MiB": rss / MiB, "torch peak MiB": tp / MiB,
                     "wall s": wall, "loglik sum": float(np.sum(fit.loglik)),
                     "same fit": bool(np.allclose(fit.restart_loglik, ref.restart_loglik, rtol=1e-8))})
        print(md_table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


def lse_block_rows(R: int, n: int = 1000, S: int = 4, budgets: tuple = (None, "2GB", "512MB", "256MB"),
                   device: str = "cpu") -> list[dict]:
    """Peak RSS, torch peak and wall time of ``fit_lse`` on the flagship preset (k = 9, d = 32: 594 free parameters,
    a 2.7 MiB Hessian per problem) for R replicates x S restarts under each memory budget, at most 4 Newton
    iterations (the Hessians are allocated at the first), with ``block_bytes=None`` (no cache blocks: one program
    unless the budget splits it, as on a GPU; on a CPU the default 8 MiB input blocks would hold 31 replicates).
    On a GPU (``device="cuda"``, float32 as ``fit_lse``'s default there) the torch peak is the device allocator's
    (``torch.cuda.max_memory_allocated``, the observation chunks' workspaces included) and RSS is not measured."""
    truth = ms.presets.sigmoid_vs_softmax(regime=2)
    spec = truth.spec
    data = ms.simulate(spec, truth.params, n=n, reps=R, seed=1)
    F = int(_free_mask(spec, torch.device("cpu")).sum())
    cuda = device == "cuda"
    model = LSEMemoryModel.of("newton", F, n, R, spec.d, spec.k, itemsize=4 if cuda else 8)
    rows, ref = [], None
    for budget in budgets:
        def fit_call(budget=budget):
            return ms.fit_lse(spec, data.X, data.y, restarts=S, seed=2, max_iter=4, memory_budget=budget,
                              block_bytes=None, device=device)

        if cuda:
            fit_call()  # warm-up: the allocator's pools, so the peak is this call's
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            fit = fit_call()
            torch.cuda.synchronize()
            wall, rss, tp = time.perf_counter() - t0, float("nan"), float(torch.cuda.max_memory_allocated())
        else:
            fit, rss, wall, tp = measured_fit(fit_call)
        ref = fit if ref is None else ref
        group = fit.settings["replicates_per_block"]
        b = memory_bytes(budget)
        block_model = model.fixed + group * S * model.per_problem
        rows.append({"budget": str(budget), "device": device, "n": n, "R x S": R * S, "replicates per block": group,
                     "blocks": -(-R // group), "model MiB per block": block_model / MiB,
                     "peak RSS MiB": rss / MiB, "torch peak MiB": tp / MiB,
                     "torch peak / budget": tp / b if b else float("nan"), "wall s": wall,
                     "same fit": bool(np.allclose(fit.objective, ref.objective, rtol=1e-10 if not cuda else 1e-5))})
        print(md_table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


def largest_cell_rows(expert: str) -> list[dict]:
    """Peak RSS of the flagship vignette's largest cells (n = 160,000, truth seed 0, both truth gates) run in this
    process: the study's own fits (three starts, the LM invariance refit, the G-bar estimate of gelu fits)."""
    import importlib.util
    import tempfile

    path = Path(__file__).resolve().parents[1] / "vignettes" / "sigmoid-vs-softmax.py"
    loader = importlib.util.spec_from_file_location("sigmoid_vs_softmax", path)
    vignette = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(vignette)
    study = vignette.make_study("full", n=[160000], seeds=[0], experts=[expert])
    frame: list = []

    def call() -> None:
        with tempfile.TemporaryDirectory() as folder:
            frame.append(study.run(folder, workers=1, progress=False))

    t0 = time.perf_counter()
    rss = peak_rss(call)
    return [{"expert": expert, "cells": len(frame[0]), "n": 160000, "peak RSS above the imported state MiB": rss / MiB,
             "process peak RSS MiB": _status("VmHWM") / MiB, "wall s": time.perf_counter() - t0}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n up to 32,000 (under two minutes)")
    ap.add_argument("--parts", default="fits,pieces")
    ap.add_argument("--fits", default=",".join(FIT_KEYS),
                    help=f"fits part: which fits, of {', '.join(FIT_KEYS)} (e.g. one fit in a fresh process)")
    ap.add_argument("--ns", default=None, help="fits part: comma-separated n (default 2,000 to 128,000)")
    ap.add_argument("--Rs", default="2,8", help="fits part: comma-separated R")
    ap.add_argument("--device", default="cpu", help="lse-blocks part: cpu or cuda (the device allocator's peak)")
    ap.add_argument("--expert", default="gelu", help="largest-cell part: the vignette's expert (gelu or relu)")
    ap.add_argument("--budgets", default="none,2GB,512MB,256MB",
                    help="lse-blocks part: comma-separated budgets ('none': no budget), e.g. one per fresh process")
    args = ap.parse_args()
    unknown = sorted(set(args.fits.split(",")) - set(FIT_KEYS))
    if unknown:
        raise SystemExit(f"--fits: unknown {unknown}; choose from {list(FIT_KEYS)}.")
    if not Path("/proc/self/clear_refs").exists():
        raise SystemExit("peak_memory.py needs Linux's /proc/self/status and /proc/self/clear_refs.")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # convergence and degeneracy warnings do not change memory
    print(f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f}\n")
    parts = args.parts.split(",")
    if "fits" in parts:
        ns = [2000, 8000, 32000] if args.quick else [2000, 8000, 32000, 128000]
        if args.ns:
            ns = [int(v) for v in args.ns.split(",")]
        Rs = [int(v) for v in args.Rs.split(",")]
        fits = tuple(FIT_KEYS[key] for key in args.fits.split(","))
        print("## peak memory of one fit as n and R grow\n" + md_table(fit_rows(ns, Rs, fits)) + "\n", flush=True)
    if "blocks" in parts:
        print("## fit_mle under a memory budget (R = 20 x 5 starts, d = 4, k = 3)\n"
              + md_table(block_rows(5000 if args.quick else 20000)) + "\n", flush=True)
    if "lse-blocks" in parts:
        R = 20 if args.quick else 80
        budgets = tuple(None if b == "none" else b for b in args.budgets.split(","))
        print(f"## fit_lse under a memory budget (flagship preset, R = {R} x 4 restarts, n = 1,000, {args.device})\n"
              + md_table(lse_block_rows(R, budgets=budgets, device=args.device)) + "\n", flush=True)
    if "largest-cell" in parts:
        rows = largest_cell_rows(args.expert)
        print("## the flagship vignette's largest cells\n" + md_table(rows) + "\n", flush=True)
    if "pieces" in parts:
        ns = [2000, 8000, 32000] if args.quick else [2000, 8000, 32000, 64000]
        print("## peak torch allocations of one call of each least-squares piece (k = 9, d = 32, A = 8)\n"
              + md_table(piece_rows(ns)) + "\n", flush=True)


if __name__ == "__main__":
    main()
