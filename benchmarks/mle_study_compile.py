"""Benchmark: a maximum-likelihood study with ``compile=True`` in every fit against the default tensor loops.

Runs the softmax Gaussian MoE vignette's study (``--size``; ``--n`` and ``--reps`` cut it) twice, one after the other
in this process and into fresh folders: as the vignette defines it (``fit_mle``'s defaults: EM and its L-BFGS phase
in the tensor loops), then with ``compile=True`` added to every fit's options (both phases in the fused C++ loops).
Prints each run's wall time and their ratio, how far the two runs' losses are apart, and the rate table by fit of
each (exponent, 95% interval, verdict; the vignette's own analysis).  The two loops agree to rounding, so the losses
of the well-determined fits agree to many digits; in the over-specified fits the path along a flat likelihood can
end elsewhere, and the exponents must then agree within their intervals for the rates to be a property of the
estimator rather than of the loop.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_study_compile.py   # the quick size, 2 minutes
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_study_compile.py --n 1000 1778 3162 --reps 4   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from moestat import _vignette_index


def run_once(study, workers: int, out: Path) -> tuple[float, pd.DataFrame]:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = study.run(out, executor="processes" if workers > 1 else None, workers=workers, progress=False)
    return time.perf_counter() - t0, frame


def main() -> None:
    os.environ["PYTHONWARNINGS"] = "ignore"  # the worker processes' degeneracy warnings: the losses are compared
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="quick", help="the vignette's study size (quick, full)")
    ap.add_argument("--n", type=int, nargs="+", default=None, help="the sample sizes (default: the size's)")
    ap.add_argument("--reps", type=int, default=None, help="replicates per cell (default: the size's)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of each run (1: in this process)")
    args = ap.parse_args()
    vignette = _vignette_index.load(_vignette_index.find("softmax-gaussian-moe"))
    override = {key: value for key, value in (("n", args.n), ("reps", args.reps)) if value is not None}
    default = vignette.make_study(args.size, **override)
    plain_entry = vignette.fit_entry
    vignette.fit_entry = lambda label: {**plain_entry(label),
                                        "options": {**plain_entry(label)["options"], "compile": True}}
    try:
        compiled = vignette.make_study(args.size, **override)
    finally:
        vignette.fit_entry = plain_entry
    print(f"{default!r}; {args.workers} workers each", flush=True)
    y = vignette.Y
    with tempfile.TemporaryDirectory(prefix="mle-study-compile-") as tmp:
        wall_a, a = run_once(default, args.workers, Path(tmp) / "default")
        print(f"defaults (tensor loops): {wall_a:7.1f} s", flush=True)
        wall_b, b = run_once(compiled, args.workers, Path(tmp) / "compiled")
        print(f"compile=True (C++ loops): {wall_b:7.1f} s   default / compiled x{wall_a / wall_b:.2f}", flush=True)
    keys = ["fit", "n", "rep"]
    both = a[[*keys, y]].merge(b[[*keys, y]], on=keys, suffixes=("_default", "_compiled"))
    rel = (np.abs(both[f"{y}_compiled"] - both[f"{y}_default"]) / np.abs(both[f"{y}_default"])).to_numpy()
    print(f"\n{y}: {len(rel)} fits; relative difference <= 1e-6 in {int((rel <= 1e-6).sum())}, "
          f"<= 1e-3 in {int((rel <= 1e-3).sum())}; largest {np.nanmax(rel):.2e}")
    per_fit = pd.DataFrame({"fit": both["fit"], "rel": rel}).groupby("fit")["rel"]
    print(pd.DataFrame({"fits": per_fit.size(), "<= 1e-6": per_fit.apply(lambda r: int((r <= 1e-6).sum())),
                        "largest": per_fit.max().map(lambda v: f"{v:.1e}")}).to_string())
    cols = ["exponent", "ci_low", "ci_high", "verdict"]
    ra, rb = vignette.rates_by_fit(a), vignette.rates_by_fit(b)
    table = ra[["fit", *cols]].merge(rb[["fit", *cols]], on="fit", suffixes=("", " (compiled)"))
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3f}".format):
        print("\nrates by fit\n" + table.to_string(index=False))


if __name__ == "__main__":
    main()
