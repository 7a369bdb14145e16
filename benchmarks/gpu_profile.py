"""Where a GPU's time goes in the flagship study's two costs: the converged least-squares fit and the G-bar estimate.

1. ``--parts newton``: ``fit_lse`` with its defaults (trust-region Newton for the flagship preset's 594 parameters)
   on R = 1 and R replicates at ``--n``, timed per iteration, then the R-replicate fit under ``torch.profiler``:
   the operators with the most self time on the host and on the device, and the host-device synchronisations.
2. ``--parts gbar``: :func:`moestat.estimate_gbar` for one truth of the sigmoid-vs-softmax vignette (gelu experts,
   sigmoid gate, d = 3, k = k* + 1, the study's settings: 20,000 Monte-Carlo inputs, ``--gbar-restarts`` starts
   (default 4), at most 1,000 iterations of ``--gbar-optimizer``, box 10) on each device of ``--devices``: wall
   time, and how far the devices' distances differ.  The device ``cpu-compiled`` is the CPU with ``compile=True``
   (each start's Newton run in C++), ``cpu-compiled-threads`` the same on ``--gbar-threads`` threads (starts at once).

    PYTHONPATH=. python benchmarks/gpu_profile.py --devices cpu,cuda [--parts newton,gbar]

On a machine without CUDA, ``--devices cpu`` runs both parts on the CPU (a check of the script itself).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import moestat as ms


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def newton_part(device: str, n: int, R: int) -> None:
    spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    fit_spec = spec.with_k(9)
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
    kw = {"truth": truth, "duplicate": [0], "seed": 2, "underdetermined": "warn", "device": device}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ms.fit_lse(fit_spec, data.X[:2], data.y[:2], **{**kw, "max_iter": 2})  # warm-up
        for reps in (1, R):
            _sync(device)
            t0 = time.perf_counter()
            fit = ms.fit_lse(fit_spec, data.X[:reps], data.y[:reps], **kw)
            _sync(device)
            wall = time.perf_counter() - t0
            iters = int(fit.n_iter.max())
            print(f"{device} n={n} R={reps}: {wall:.3f} s, {iters} iterations (max over replicates), "
                  f"{1e3 * wall / iters:.2f} ms per iteration", flush=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        with profile(activities=activities) as prof:
            ms.fit_lse(fit_spec, data.X, data.y, **kw)
            _sync(device)
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=45))
    if device.startswith("cuda"):
        print(events.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=45))
    scalar_reads = ("aten::item", "aten::_local_scalar_dense")
    syncs = sum(e.count for e in events if "Synchronize" in e.key or e.key in scalar_reads)
    print(f"host-device synchronisations and scalar reads: {syncs}", flush=True)


def gbar_part(devices: list[str], optimizer: str, restarts: int = 4, duplicate: str = "first",
              threads: int = 1) -> None:
    truth = ms.presets.gate_comparison("gelu", truth_gate="sigmoid", d=3, seed=0)
    k = truth.spec.k + 1
    dup = [int(v) for v in truth.info["duplicate"]][:1] if duplicate == "first" else None
    results = {}
    for name in devices:
        device, compiled = ("cpu", True) if name.startswith("cpu-compiled") else (name, False)
        th = threads if name == "cpu-compiled-threads" else 1
        _sync(device)
        t0 = time.perf_counter()
        gb = ms.estimate_gbar(truth.spec, truth.params, k, n_mc=20_000, restarts=restarts, duplicate=dup, seed=7,
                              max_iter=1000, box=10.0, device=device, optimizer=optimizer, compile=compiled,
                              threads=th)
        _sync(device)
        wall = time.perf_counter() - t0
        results[name] = gb
        print(f"estimate_gbar on {name} ({restarts} starts): {wall:.2f} s; l2 {np.array2string(gb.l2, precision=6)}, "
              f"near-minimisers {int(gb.near.sum())}/{len(gb.near)}", flush=True)
    if len(results) > 1:
        a, b = (results[d] for d in devices[:2])
        print(f"largest difference of the sorted distances ({devices[0]} vs {devices[1]}): "
              f"{np.max(np.abs(np.sort(a.l2) - np.sort(b.l2))):.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="cpu",
                    help="comma-separated devices, cpu-compiled for the CPU with compile=True, cpu-compiled-threads "
                         "for that on --gbar-threads threads (newton part: the last one, which must be a torch "
                         "device)")
    ap.add_argument("--parts", default="newton,gbar")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--gbar-optimizer", default="auto",
                    help="estimate_gbar's optimizer (the H200 figures of 2026-11-26: lbfgs, then the default)")
    ap.add_argument("--gbar-restarts", type=int, default=4,
                    help="estimate_gbar's starts (the sigmoid-vs-softmax study's basin estimate asks for 2 k* = 6)")
    ap.add_argument("--gbar-duplicate", choices=["first", "none"], default="first",
                    help="starts duplicating the preset's first duplicated atom, or none (the basin estimate's)")
    ap.add_argument("--gbar-threads", type=int, default=2,
                    help="threads of the cpu-compiled-threads estimate (its starts run at once)")
    args = ap.parse_args()
    devices = args.devices.split(",")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"GPU {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}", flush=True)
    if "gbar" in args.parts:
        gbar_part(devices, args.gbar_optimizer, args.gbar_restarts, args.gbar_duplicate, args.gbar_threads)
    if "newton" in args.parts:
        newton_part(devices[-1], args.n, args.reps)


if __name__ == "__main__":
    main()
