"""Projection (not a measurement): the flagship study's wall time on a GPU host with one process pool per device.

Replays :class:`moestat._placement.CellLanes` — the scheduler of ``Study.run(workers={"cuda": G, "cpu": C})`` — in a
discrete-event simulation over the 200 cells of the sigmoid-vs-softmax vignette's full study, with

* each cell's CPU time: its ``wall_time`` in the vignette's checked-in ``results.csv`` (one core of the 2-core
  development machine) times ``--cpu-slowdown`` (the GPU host's core against that one: 1.7–1.8 for the H200
  host, from the G-bar estimate on one thread there and here: 13.0 s against 7.6 s with six starts, 5.9 s against
  3.3 s with four);
* each cell's GPU time: the median cell time at its n on an H200, one process (``--gpu-seconds``, from
  ``benchmarks/results/cuda_check_h200_2026-11-2[67].txt``), times ``--contention`` when two or more GPU processes
  share the device (1: they overlap perfectly; G: no gain from more than one process).

It prints the projected wall time and the cells the GPU takes, for each pool split, with and without the small end
holding back (``CellLanes(workers=...)``), with and without ``--gpu-start`` seconds added to each GPU process's first
cell; ``--margin`` replays another hold-back margin.  The CPU processes' start-up, the G-bar estimates' extra time in
the first cell of each truth, and the checkpoint writes are not modelled.

    python benchmarks/project_study_pools.py
"""

from __future__ import annotations

import argparse
import heapq
from pathlib import Path

import pandas as pd

from moestat import _placement as placement
from moestat._placement import CellLanes

ROOT = Path(__file__).resolve().parents[1]


def simulate(cells: list[dict], cuda: int, cpu: int, gpu_seconds: dict[int, float], slowdown: float,
             contention: float, hold_back: bool, gpu_start: float = 0.0) -> tuple[float, int]:
    """(makespan in seconds, cells run on the GPU) of one run; ``gpu_start``: seconds added to the first cell of
    each GPU process (its CUDA context and first kernels)."""
    devices = [d for d, w in (("cuda", cuda), ("cpu", cpu)) if w]
    workers = {"cuda": cuda, "cpu": cpu}
    lanes = CellLanes(cells, devices, workers={d: workers[d] for d in devices} if hold_back else None)
    free, events, on_gpu, end = dict(workers), [], 0, 0.0
    starting = cuda

    def fill(now: float) -> None:
        nonlocal starting
        for d in devices:
            while free[d]:
                c = lanes.take(d)
                if c is None:
                    break
                cost = gpu_seconds[c["n"]] * (contention if cuda > 1 else 1.0) if d == "cuda" else c["cpu"] * slowdown
                if d == "cuda" and starting:
                    cost, starting = cost + gpu_start, starting - 1
                heapq.heappush(events, (now + cost, c["id"], d, cost))
                free[d] -= 1

    fill(0.0)
    by_id = {c["id"]: c for c in cells}
    while events:
        end, cid, d, cost = heapq.heappop(events)
        free[d] += 1
        on_gpu += d == "cuda"
        lanes.record(d, by_id[cid], cost)
        fill(end)
    return end, on_gpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(ROOT / "docs/vignettes/sigmoid-vs-softmax/results.csv"))
    ap.add_argument("--gpu-seconds", default="1600:0.97,5060:0.97,16000:1.01,50600:1.80,160000:2.35",
                    help="n:seconds per cell on the GPU, one process")
    ap.add_argument("--cpu-slowdown", type=float, default=1.8)
    ap.add_argument("--contention", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    ap.add_argument("--splits", nargs="+", default=["0:16", "1:0", "1:15", "2:14", "3:13", "4:12"],
                    help="GPU processes:CPU processes")
    ap.add_argument("--gpu-start", type=float, nargs="+", default=[0.0, 10.0],
                    help="seconds of start-up added to each GPU process's first cell (one table per value)")
    ap.add_argument("--margin", type=float, default=None,
                    help="the hold-back margin to replay (default: moestat._placement.HOLD_BACK_MARGIN)")
    args = ap.parse_args()
    if args.margin is not None:
        placement.HOLD_BACK_MARGIN = args.margin
    frame = pd.read_csv(args.results)
    per_cell = frame.groupby("cell", sort=False).agg(n=("n", "first"), seconds=("wall_time", "sum"))
    cells = [{"id": cid, "n": int(r.n), "cpu": float(r.seconds)} for cid, r in per_cell.iterrows()]
    gpu = {int(k): float(v) for k, v in (part.split(":") for part in args.gpu_seconds.split(","))}
    print(f"{len(cells)} cells; CPU time summed {sum(c['cpu'] for c in cells):.0f} s on the development machine, "
          f"x{args.cpu_slowdown} on the GPU host; GPU seconds per cell {gpu}")
    for start in args.gpu_start:
        print(f"projected wall seconds (cells on the GPU) per contention factor {args.contention}; GPU start-up "
              f"{start:g} s per process; hold-back margin {placement.HOLD_BACK_MARGIN:g}")
        for split in args.splits:
            cuda, cpu = map(int, split.split(":"))
            for hold_back in (False, True):
                runs = [simulate(cells, cuda, cpu, gpu, args.cpu_slowdown, k, hold_back, start)
                        for k in args.contention]
                label = "holding back" if hold_back else "plain two ends"
                print(f"  cuda={cuda:<2} cpu={cpu:<3} {label:>15}: "
                      + "  ".join(f"{t:5.0f} s ({g:3d})" for t, g in runs))


if __name__ == "__main__":
    main()
