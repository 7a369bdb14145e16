"""Benchmark: the Figure-1 study, batched cells vs fitting one replicate at a time.

Runs a sub-grid of the sigmoid-vs-softmax study (``--experts``, ``--gates``, ``--n``, ``--reps``) twice
on the same data and settings:

* **batched** — ``Study.run``: one ``fit_lse`` call per cell fits all R replicates together;
* **loop** — the same fits one replicate at a time (``fit_lse`` with R = 1, the replicate's own data
  and seed child), the way a script without a batched engine runs them.

Both run a fixed number of L-BFGS iterations (``tol = gtol = 0``) so they do the same optimisation
work; the ratio loop / batched is the speed-up of batching.  It also extrapolates the full Figure-1
study (n = 1e3..1e5, 20 replicates, 2 gates x 2 experts) from the measured per-observation cost.

    python benchmarks/study_fig1.py                      # default sub-grid
    python benchmarks/study_fig1.py --n 1000 4000 --reps 20 --iters 50
    python benchmarks/study_fig1.py --full --workers 2 --out out/fig1-bench   # the whole study, timed
    python benchmarks/study_fig1.py --full --device cuda --gbar-compile ...      # G-bar estimates in C++
    python benchmarks/study_fig1.py --full --workers cuda=2,cpu=14 ...           # a GPU host: GPU and CPU pools
    python benchmarks/study_fig1.py --full --size quick --compile --out OUT     # as if compile=True were the default

``--full`` runs the sigmoid-vs-softmax vignette's full-size study itself (its current design: ten paired truths,
relu and gelu experts, both gates, n from 1,600 to 160,000, one converged least-squares fit per cell from three
starts with a second solver's check; 200 cells) with ``--workers`` processes on ``--device`` (or one pool per
device: ``--workers cuda=2,cpu=14`` lets a GPU host's GPU take the largest cells and its cores the smallest), into a
fresh checkpoint folder, and prints its wall time against the performance issue's targets for that design (30 minutes
on the 2-core CPU, 2 minutes on one H100).  The study's earlier 40-cell design (n = 1e3..1e5, 20 replicates,
L-BFGS for 1000 iterations and the SGD protocol) had targets of 15 minutes and 1 minute.  ``--size quick`` runs the
README's main job (50 cells) instead; ``--compile`` runs every fit and G-bar estimate in the C++ loops
(``compile=True``, ``gbar_compile=True``), so that ``benchmarks/compare_study_run.py OUT/cells --reference FOLDER``
shows what the results would be if they were the default (FOLDER: the same size run by the vignette).

Absolute times depend on the machine and its load (the development machine was shared by several
jobs); the ratio is measured in one run and is the figure to compare.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings

import numpy as np
import torch

from moestat._placement import parse_workers
from moestat.cells import CellContext, build_truth
from moestat.fit.lse import fit_lse
from moestat.study import Study


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", nargs="+", default=["relu"])
    ap.add_argument("--gates", nargs="+", default=["sigmoid", "softmax"])
    ap.add_argument("--n", nargs="+", type=int, default=[1000, 2000])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of each fit on the CPU (fit_lse's threads=; its default is 1)")
    ap.add_argument("--full", action="store_true", help="time the vignette's whole study instead (--size)")
    ap.add_argument("--size", default="full", choices=["full", "quick"],
                    help="--full: the vignette's size (full: 200 cells; quick: the README's main job, 50 cells)")
    ap.add_argument("--compile", action="store_true",
                    help="--full: every fit with compile=True and the G-bar estimates with gbar_compile=True, as if "
                         "the C++ loops were the default (compare the rows with compare_study_run.py)")
    ap.add_argument("--workers", default="2",
                    help="worker processes for --full (CPU), or one pool per device, e.g. cuda=2,cpu=14 (the GPU's "
                         "workers take the largest cells left, the CPU's the smallest; --device is then ignored)")
    ap.add_argument("--out", default="out/fig1-bench", help="checkpoint folder for --full (must not exist)")
    ap.add_argument("--gbar-compile", action="store_true",
                    help="--full: the representation metric's G-bar estimates with gbar_compile=True (Newton in C++ "
                         "on the CPU; not the vignette's setting)")
    ap.add_argument("--gbar-threads", type=int, default=1,
                    help="--full with --gbar-compile: threads of each G-bar estimate (its starts run at once; the "
                         "same estimates)")
    args = ap.parse_args()
    if args.full:
        full_study(args)
        return
    warnings.simplefilter("ignore")
    opts = {"init": "near_truth", "optimizer": "lbfgs", "max_iter": args.iters, "tol": 0.0, "gtol": 0.0,
            "box": 10.0, "condition": False, "threads": args.threads}
    study = Study(truth={"preset": "sigmoid_vs_softmax", "regime": 2, "seed": 0, "stream": "{expert}",
                         "grid": {"expert": args.experts, "truth_gate": args.gates}},
                  fit={"label": "lse", "k": "truth+1", "options": opts}, n=args.n, reps=args.reps, seed=1,
                  device=args.device)
    print(f"fit threads {args.threads} (process: {torch.get_num_threads()}), device {args.device}; "
          f"{len(study.cells)} cells x {args.reps} replicates, {args.iters} L-BFGS iterations each")
    # warm-up: kernel selection/compilation and allocator caches are paid once, outside both timings
    warm = Study(truth={"preset": "sigmoid_vs_softmax", "regime": 2, "seed": 0, "expert": args.experts[0]},
                 fit={"label": "lse", "k": "truth+1", "options": {**opts, "max_iter": 2}}, n=[min(args.n)],
                 reps=args.reps, seed=99, device=args.device)
    warm.run(progress=False)
    wt = build_truth(warm.truths[0])
    fit_lse(wt.spec.with_k(9), np.zeros((1, min(args.n), 32)) + 0.1, np.zeros((1, min(args.n))), truth=wt.params,
            duplicate=wt.info["duplicate"], seed=0, device=args.device, **{**opts, "max_iter": 2})
    t0 = time.perf_counter()
    frame = study.run(progress=False)
    batched = time.perf_counter() - t0

    t0 = time.perf_counter()
    loop_obj = []
    for cell in study.cells:
        truth = build_truth(cell["truth"])
        ctx = CellContext(cell["truth"], cell["fit"], cell["n"], args.reps,
                          np.random.SeedSequence(study.seed, spawn_key=cell["data_key"]),
                          np.random.SeedSequence(study.seed, spawn_key=cell["fit_key"]),
                          np.random.SeedSequence(study.seed, spawn_key=cell["metric_key"]), args.device)
        data = ctx.data()
        spec = ctx.fit_spec()
        children = np.random.SeedSequence(study.seed, spawn_key=cell["fit_key"]).spawn(args.reps)
        for r in range(args.reps):  # the same start as replicate r of the batched call
            fit = fit_lse(spec, data.X[r:r + 1], data.y[r:r + 1], truth=truth.params,
                          duplicate=truth.info["duplicate"], seed=[children[r]], device=args.device, **opts)
            loop_obj.append(float(fit.objective[0]))
    loop = time.perf_counter() - t0
    obs = sum(c["n"] for c in study.cells) * args.reps
    print(f"batched study: {batched:8.2f} s   loop over replicates: {loop:8.2f} s   speed-up x{loop / batched:.2f}")
    print(f"median objective batched {np.median(frame['objective']):.6g} vs loop {np.median(loop_obj):.6g}")
    full_obs = sum([1000, 3162, 10000, 31623, 100000]) * 20 * 4
    per_obs_iter = batched / (obs * args.iters)
    print(f"batched cost {per_obs_iter * 1e9:.1f} ns per observation-iteration; the full Figure-1 LSE study "
          f"(4 truths, n = 1e3..1e5, 20 reps) at 1000 iterations would take about "
          f"{per_obs_iter * full_obs * 1000 / 3600:.1f} h here")


def full_study(args: argparse.Namespace) -> None:
    """Run and time the vignette's full-size study (a fresh run: the folder must not exist)."""
    from pathlib import Path

    from moestat import _vignette_index

    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"--out {out} exists; a timed run needs a fresh folder.")
    vignette = _vignette_index.load(_vignette_index.find("sigmoid-vs-softmax"))
    study = vignette.make_study(args.size)
    if args.compile:
        fit = {**study.fit, "options": {**study.fit["options"], "compile": True}}
        study = dataclasses.replace(study, fit=fit)
    if args.gbar_compile or args.compile:
        options = {name: dict(opts) for name, opts in study.metric_options.items()}
        options.setdefault("representation", {})["gbar_compile"] = True
        if args.gbar_threads != 1:
            options["representation"]["gbar_threads"] = args.gbar_threads
        study = dataclasses.replace(study, metric_options=options)
    pools = parse_workers(args.workers)
    t0 = time.perf_counter()
    if isinstance(pools, dict):
        frame = study.run(out, workers=pools, progress=True)
        where = ", ".join(f"{d} {n}" for d, n in pools.items())
    else:
        workers = pools if args.device == "cpu" else 1
        frame = study.run(out, executor="processes" if workers > 1 else None, workers=workers, device=args.device,
                          progress=True)
        where = f"{args.device} {workers}"
    wall = time.perf_counter() - t0
    on_gpu = "cuda" in (",".join(pools) if isinstance(pools, dict) else args.device)
    target = 2 if on_gpu else 30  # minutes, for the study's current (200-cell) design
    verdict = f" (target {target} min: {'met' if wall <= 60 * target else 'not met'})" if args.size == "full" else ""
    cell_minutes = frame["wall_time"].sum() / 60  # each row carries its share of its cell's wall time
    print(f"{args.size} sigmoid-vs-softmax study{', compiled' if args.compile else ''}: {len(study.cells)} cells, "
          f"{len(frame)} rows, worker(s) {where}: {wall:.0f} s = {wall / 60:.1f} min{verdict}; "
          f"cell time summed {cell_minutes:.1f} min")
    per_cell = frame.groupby("cell").agg(device=("device", "first"), n=("n", "first"), seconds=("wall_time", "sum"))
    print(per_cell.groupby(["device", "n"])["seconds"].agg(["count", "sum", "median"]).to_string())


if __name__ == "__main__":
    main()
