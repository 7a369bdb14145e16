"""Benchmark: where a study's cells run — one process pool, or one pool per device.

Runs the sigmoid-vs-softmax vignette's study (``--size``, optionally cut to ``--seeds`` truths) once per entry of
``--runs``, one after the other in this process, each into a fresh folder, and prints each run's wall time, its
ratio to the first run's (the baseline, measured in the same session), its cells per device, and whether its
frame equals the baseline's.  A run is given as ``Study.run``'s ``workers``: a number of processes on
``--device`` (``"2"``), or one pool per device (``"cuda=2,cpu=14"``: the GPU's workers take the largest cells
left, the CPU's the smallest).

    python benchmarks/study_pools.py                                  # 2-core CPU: "2" against "cpu=2"
    python benchmarks/study_pools.py --size full --seeds 4 --runs cpu=16 cuda=1 cuda=2,cpu=14   # a 16-core GPU host

On a CPU-only machine the two default runs do the same work through the two schedulers (all cells submitted at
once, largest first; or handed out as workers become free), so their ratio is the cost of the second.  Cells
that ran on the same device in both runs are compared bit for bit (threads are fixed per cell), cells that
changed device by their objective (float64 Newton to its tolerance: within 1e-6 relative where both converged).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from moestat import _vignette_index
from moestat._placement import executor_for, parse_workers


def run_once(study, workers: str, device: str, out: Path) -> tuple[float, pd.DataFrame]:
    pools = parse_workers(workers)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = study.run(out, executor=executor_for(pools), workers=pools, progress=False,
                          device=None if isinstance(pools, dict) else device)  # pools name their own devices
    return time.perf_counter() - t0, frame


def compare(base: pd.DataFrame, other: pd.DataFrame) -> str:
    same_device = (base["device"] == other["device"]).to_numpy()
    a, b = base["objective"].to_numpy(), other["objective"].to_numpy()
    bits = bool(np.array_equal(a[same_device], b[same_device], equal_nan=True))
    both = (~same_device) & base["converged"].to_numpy(bool) & other["converged"].to_numpy(bool)
    gap = float(np.max(np.abs(a[both] - b[both]) / np.abs(b[both]))) if both.any() else 0.0
    return (f"same device: {same_device.sum()} rows, objectives {'equal to the bit' if bits else 'DIFFER'}; "
            f"moved: {(~same_device).sum()} rows, largest relative gap where both converged {gap:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="quick", help="the vignette's study size (quick, full, linear)")
    ap.add_argument("--seeds", type=int, default=None, help="keep the first SEEDS truths of each expert and gate")
    ap.add_argument("--runs", nargs="+", default=["2", "cpu=2"],
                    help="each run's workers: a number of processes on --device, or DEVICE=N,... pools")
    ap.add_argument("--device", default="cpu", help="device of the runs given as a number of processes")
    args = ap.parse_args()
    vignette = _vignette_index.load(_vignette_index.find("sigmoid-vs-softmax"))
    override = {} if args.seeds is None else {"seeds": list(range(args.seeds))}
    study = vignette.make_study(args.size, **override)
    print(f"{study!r}; runs {args.runs} (numbers on {args.device})", flush=True)
    base = None
    with tempfile.TemporaryDirectory(prefix="study-pools-") as tmp:
        for i, workers in enumerate(args.runs):
            wall, frame = run_once(study, workers, args.device, Path(tmp) / f"run{i}")
            by_device = frame.drop_duplicates("cell")["device"].value_counts().to_dict()
            line = f"workers {workers:>16}: {wall:7.1f} s"
            if base is None:
                base = (wall, frame)
                line += " (baseline)"
            else:
                line += f"  baseline / this x{base[0] / wall:.2f}"
            print(f"{line}  cells by device {by_device}", flush=True)
            if i:
                print(f"    {compare(base[1], frame)}", flush=True)


if __name__ == "__main__":
    main()
