"""Benchmark: the first-use build of moestat's three C++ extensions, as shipped against the same source with
``torch/extension.h`` prepended (what torch's ``load_inline`` adds unless told not to, and what the sources
included before they moved to ATen and ``TORCH_LIBRARY``).

Each extension (``lsq``, ``newton``, ``em``) is built ``--repeats`` times each way, alternating, under a fresh name
in an empty ``TORCH_EXTENSIONS_DIR``, so every build compiles from nothing; the wall time includes loading the
library.  Printed: the seconds of each build, the median per extension and way, and their ratio.

    PYTHONPATH=. python benchmarks/native_build.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from moestat.fit import _native

SOURCES = {"lsq": _native.source, "newton": _native.newton_source, "em": _native.em_source}


def build_seconds(stem: str, implicit_headers: bool, rep: int) -> float:
    """Wall seconds of one build from nothing of extension ``stem`` (a fresh name: nothing cached)."""
    tag = f"bench{rep}{'full' if implicit_headers else 'lean'}{time.time_ns() % 10**9}_{stem}"
    start = time.perf_counter()
    ops = _native._build(tag, SOURCES[stem](), implicit_headers=implicit_headers)
    seconds = time.perf_counter() - start
    assert hasattr(ops, {"lsq": "value_grad", "newton": "newton", "em": "em_softmax"}[stem])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not _native.compiler_available():
        raise SystemExit("no C++ compiler on PATH: nothing to build")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCH_EXTENSIONS_DIR"] = cache
        print(f"{'extension':<10}{'headers':<22}{'seconds per build':<28}{'median':>8}")
        medians: dict[tuple[str, bool], float] = {}
        for stem in SOURCES:
            times: dict[bool, list[float]] = {False: [], True: []}
            for rep in range(args.repeats):
                for implicit in ((False, True) if rep % 2 == 0 else (True, False)):
                    times[implicit].append(build_seconds(stem, implicit, rep))
            for implicit in (True, False):
                medians[stem, implicit] = statistics.median(times[implicit])
                label = "torch/extension.h" if implicit else "ATen + TORCH_LIBRARY"
                runs = ", ".join(f"{t:.1f}" for t in times[implicit])
                print(f"{stem:<10}{label:<22}{runs:<28}{medians[stem, implicit]:>8.1f}")
        print()
        for stem in SOURCES:
            print(f"{stem}: {medians[stem, True] / medians[stem, False]:.2f}x faster to build")
        total = [sum(medians[s, implicit] for s in SOURCES) for implicit in (True, False)]
        print(f"all three: {total[0]:.1f} s -> {total[1]:.1f} s ({total[0] / total[1]:.2f}x)")


if __name__ == "__main__":
    main()
