"""Benchmark: wall time of ``import moestat`` in a fresh interpreter, which every CLI call and every study worker
process pays, against a baseline tree measured in the same run.

Each repeat imports moestat from this tree and from ``--baseline`` (a git worktree of an earlier commit), alternating,
each in a new process started from a neutral directory so that the tree on ``PYTHONPATH`` is the one imported.
Printed: each time, the medians, their ratio, and the slowest modules of this tree's import (``python -X importtime``,
cumulative).

    python benchmarks/import_time.py --baseline /tmp/old [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TIMED = "import time; t = time.perf_counter(); import moestat; print(time.perf_counter() - t, moestat.__file__)"


def warm_fit_code(setup: str, result: str) -> str:
    """Code for :func:`run_in_tree`: ``setup`` (which defines ``fit(seed)``), one warm-up ``fit(0)``, then three
    timed ``fit(1)``; prints their median seconds, the expression ``result`` of the last fit ``f``, and
    ``moestat.__file__``."""
    return setup + f"""
fit(0)
times = []
for _ in range(3):
    t = time.perf_counter()
    f = fit(1)
    times.append(time.perf_counter() - t)
print(sorted(times)[1], {result}, ms.__file__)
"""


def run_in_tree(tree: Path, code: str, cwd: str) -> list[str]:
    """The words ``code`` prints, run in a fresh interpreter that imports moestat from ``tree`` (started in the
    neutral directory ``cwd``); the code prints ``moestat.__file__`` last, which is checked and dropped."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    if not Path(out[-1]).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"imported {out[-1]}, not the tree {tree}: is moestat installed non-editable?")
    return out[:-1]


def alternate(baseline: Path, code: str, repeats: int, cwd: str) -> tuple[list[list[str]], list[list[str]]]:
    """The words ``code`` prints (:func:`run_in_tree`) in ``repeats`` fresh interpreters of ``baseline`` and of this
    tree, alternating, baseline first: (the baseline's runs, this tree's runs)."""
    old, new = [], []
    for _ in range(repeats):
        old.append(run_in_tree(baseline, code, cwd))
        new.append(run_in_tree(HERE, code, cwd))
    return old, new


def report_first_calls(old: list[list[str]], new: list[list[str]]) -> float:
    """Print each tree's seconds (the first word of each run), their medians and the second words (whether
    ``torch._dynamo`` got loaded); return the ratio of the medians, baseline over this tree."""
    for name, runs in (("this tree", new), ("baseline", old)):
        print(f"{name:>10}: " + " ".join(f"{float(r[0]):.3f}" for r in runs)
              + f"  median {statistics.median(float(r[0]) for r in runs):.3f} s, "
              f"dynamo loaded: {sorted({r[1] for r in runs})}")
    return statistics.median(float(r[0]) for r in old) / statistics.median(float(r[0]) for r in new)


def median_timed(fn, repeats: int):
    """Median seconds of ``repeats`` calls of ``fn`` after one warm-up call, and the last call's output."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def import_seconds(tree: Path, cwd: str) -> float:
    """Seconds of ``import moestat`` from ``tree`` in a fresh interpreter."""
    return float(run_in_tree(tree, TIMED, cwd)[0])


def slowest_modules(tree: Path, cwd: str, top: int) -> list[tuple[float, str]]:
    """The ``top`` modules with the largest cumulative import time (seconds) under ``-X importtime``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import moestat"], cwd=cwd, env=env,
                         capture_output=True, text=True, check=True).stderr
    rows = []
    for line in err.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]) / 1e6, parts[2].strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a tree of an earlier commit (git worktree)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cwd:
        times: dict[str, list[float]] = {"this tree": [], "baseline": []}
        for _ in range(args.repeats):
            times["baseline"].append(import_seconds(args.baseline, cwd))
            times["this tree"].append(import_seconds(HERE, cwd))
        for name, ts in times.items():
            print(f"{name:>10}: " + " ".join(f"{t:.3f}" for t in ts) + f"  median {statistics.median(ts):.3f} s")
        ratio = statistics.median(times["baseline"]) / statistics.median(times["this tree"])
        print(f"baseline / this tree: {ratio:.2f}x")
        print("slowest modules of this tree's import (cumulative seconds):")
        for seconds, name in slowest_modules(HERE, cwd, args.top):
            print(f"  {seconds:6.3f}  {name}")


if __name__ == "__main__":
    main()
