"""Benchmark: ``fit_mle(compile=True)`` (EM in the fused C++ loop) against the default tensor loop on batched work.

The C++ loop runs the (replicate, restart) pairs one after another, the tensor loop all at once, so the question is
whether the C++ loop still pays when a fit has many pairs.  Two cases, CPU seconds on one thread, default first:

* ``bootstrap(fit, n_resamples=200)`` of flexmix's NPreg fit with Gaussian experts and a gate on ``z`` (the data
  and ``z`` of ``mle_vs_flexmix_glm.py``; 200 resamples x 3 starts), a warm-up bootstrap first;
* ``fit_mle`` of 50 simulated replicates x 5 random starts, softmax gate, k = 3 linear experts, d = 2, at n = 400
  and 4,000 (pure EM: ``switch_after=None``), with the summed log-likelihoods (they must agree).

Needs ``Rscript`` with flexmix (for NPreg).  ``--threads N`` instead times the simulated case's ``compile=True``
fits in wall seconds with one thread and with N (the C++ loop's threads take the pairs one at a time), alternating
``--repeat`` times, and checks that both give the same log-likelihoods to the bit.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_compile_batched.py
    PYTHONPATH=. python benchmarks/mle_compile_batched.py --threads 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import moestat as ms
from moestat.simulators.regression import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mle_vs_flexmix_glm import R_DATA, write_data  # the same data


def simulated(n: int) -> tuple[ms.MoE, Dataset]:
    """50 replicates of the k = 3, d = 2 softmax-gated mixture of linear experts."""
    spec = ms.MoE(k=3, d=2)
    truth = ms.Params([0.5, 0.0, -0.5], [[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], [[1.0, 0.5], [-1.0, 0.2], [0.3, -0.4]],
                      [0.5, -0.5, 0.0], noise_sd=[0.3, 0.3, 0.3])
    return spec, ms.simulate(spec, truth, n=n, reps=50, seed=0, model="mixture")


def threads_rows(threads: int, repeat: int) -> None:
    """Wall seconds of the simulated case with ``compile=True`` on one thread and on ``threads``."""
    warnings.simplefilter("ignore")
    for n in (400, 4000):
        spec, data = simulated(n)
        times: dict[int, list[float]] = {1: [], threads: []}
        lls = {}
        for _ in range(repeat):
            for t in times:
                t0 = time.perf_counter()
                f = ms.fit_mle(spec, data.X, data.y, restarts=5, seed=3, compile=True, switch_after=None,
                               progress=False, threads=t)
                times[t].append(time.perf_counter() - t0)
                lls[t] = np.asarray(f.loglik)
        same = bool((lls[1] == lls[threads]).all())
        print(f"50 replicates x 5 starts, n = {n}, compile=True ({f.settings['em_kernel']} loop): one thread "
              f"{min(times[1]):.3f}-{max(times[1]):.3f} s, {threads} threads {min(times[threads]):.3f}-"
              f"{max(times[threads]):.3f} s, ratio of medians {np.median(times[1]) / np.median(times[threads]):.2f}x, "
              f"log-likelihoods equal: {same}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="time compile=True on one thread against this many")
    ap.add_argument("--repeat", type=int, default=5, help="alternating rounds of --threads")
    args = ap.parse_args()
    if args.threads:
        threads_rows(args.threads, args.repeat)
        return
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        script, csv = Path(tmp) / "data.R", Path(tmp) / "npreg.csv"
        script.write_text(R_DATA)
        write_data(csv, 0, script)
        df = pd.read_csv(csv)
    for compile_ in (False, True):
        fit = ms.fit_mle(formula="yn ~ x + I(x**2)", data=df, k=2, gate_formula="~ z", restarts=10, seed=1,
                         compile=compile_)
        ms.bootstrap(fit, n_resamples=20, seed=2, progress=False)  # warm-up
        t0 = time.process_time()
        ms.bootstrap(fit, n_resamples=200, seed=2, progress=False)
        print(f"bootstrap of the NPreg fit, 200 resamples, compile={compile_}: {time.process_time() - t0:.3f} s "
              f"({fit.settings['em_kernel']} loop)", flush=True)
    for n in (400, 4000):
        spec, data = simulated(n)
        for compile_ in (False, True):
            t0 = time.process_time()
            f = ms.fit_mle(spec, data.X, data.y, restarts=5, seed=3, compile=compile_, switch_after=None,
                           progress=False)
            print(f"50 replicates x 5 starts, n = {n}, k = 3, compile={compile_}: {time.process_time() - t0:.2f} s, "
                  f"summed log-likelihood {np.sum(f.loglik):.6f}", flush=True)


if __name__ == "__main__":
    main()
