"""Benchmark: moestat's EM against R flexmix (and mixtools::hmeEM for k = 2) on the same data sets.

Softmax-gated mixtures of linear-Gaussian experts, d = 1, x ~ U[-1, 1], k = 2..4, n up to 10,000
(mixtools' ``hmeEM`` handles k = 2 only and is slow, so it runs for n <= 1000 by default).
Every fitter gets the same number of random starts and the same stopping rule (relative log-likelihood
change 1e-8, at most 2000 EM iterations); flexmix runs with ``minprior = 0`` so it keeps every
component, as moestat does.  Printed: best log-likelihood of each fitter (higher is better) and the
wall-time and CPU-time ratios flexmix / moestat measured in the same run (on a shared machine the
CPU-time ratio is the steadier of the two).  R runs in a subprocess (``Rscript``), on
one core; moestat runs with one torch thread and reports the median of ``--repeat`` identical fits
(R's flexmix fit is run once: its 5 starts take seconds to minutes).

Usage::

    python benchmarks/mle_vs_flexmix.py [--quick] [--restarts 5] [--out benchmarks/results/mle_vs_flexmix.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import moestat as ms

R_SCRIPT = r"""
suppressMessages({library(flexmix); library(mixtools)})
args <- commandArgs(trailingOnly = TRUE)
dat <- read.csv(args[1]); k <- as.integer(args[2]); nrep <- as.integer(args[3]); seed <- as.integer(args[4])
with_mixtools <- as.integer(args[5]) == 1
set.seed(seed)
best <- -Inf; iters <- NA
tt <- system.time({
  for (r in seq_len(nrep)) {
    f <- try(flexmix(y ~ x, data = dat, k = k, concomitant = FLXPmultinom(~ x),
                     control = list(iter.max = 2000, tolerance = 1e-8, minprior = 0)), silent = TRUE)
    if (!inherits(f, "try-error")) {
      ll <- as.numeric(logLik(f))
      if (length(f@prior) == k && ll > best) { best <- ll; iters <- f@iter }
    }
  }
})
t <- tt[["elapsed"]]; tcpu <- tt[["user.self"]] + tt[["sys.self"]]
mt_best <- NA; mt_time <- NA; mt_cpu <- NA
if (k == 2 && with_mixtools) {
  mt_best <- -Inf
  mt <- system.time({
    for (r in seq_len(nrep)) {
      h <- try(hmeEM(dat$y, dat$x, k = 2, epsilon = 1e-8, maxit = 2000, verb = FALSE), silent = TRUE)
      if (!inherits(h, "try-error") && is.finite(h$loglik) && h$loglik > mt_best) mt_best <- h$loglik
    }
  })
  mt_time <- mt[["elapsed"]]; mt_cpu <- mt[["user.self"]] + mt[["sys.self"]]
}
cat(sprintf(paste0('{"flexmix_loglik": %.10f, "flexmix_time": %.4f, "flexmix_cpu": %.4f, "flexmix_iter": %s, ',
                   '"mixtools_loglik": %s, "mixtools_time": %s, "mixtools_cpu": %s}\n'),
            best, t, tcpu, ifelse(is.na(iters), "null", iters),
            ifelse(is.na(mt_best), "null", sprintf("%.10f", mt_best)),
            ifelse(is.na(mt_time), "null", sprintf("%.4f", mt_time)),
            ifelse(is.na(mt_cpu), "null", sprintf("%.4f", mt_cpu))))
"""


def truth(k: int) -> ms.Params:
    """k well-separated linear experts with a gate that switches along x."""
    slopes = np.linspace(-3.0, 3.0, k)
    return ms.Params(gate_bias=np.zeros(k), gate_weight=(4.0 * np.linspace(-1, 1, k))[:, None],
                     expert_weight=slopes[:, None], expert_bias=np.linspace(-2.0, 2.0, k)[::-1].copy(),
                     noise_sd=np.full(k, 0.3))


def run_r(path: Path, k: int, restarts: int, seed: int, script: Path, mixtools: bool) -> dict:
    out = subprocess.run(["Rscript", str(script), str(path), str(k), str(restarts), str(seed), str(int(mixtools))],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:  # e.g. a missing R package: say which, instead of a bare CalledProcessError
        raise SystemExit(f"the R fit failed (exit {out.returncode}); R said:\n{out.stderr.strip()}\nInstall "
                         "r-cran-flexmix and r-cran-mixtools (Debian), or pass --mixtools-max-n 0 to skip mixtools.")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n in {1000} only")
    parser.add_argument("--ns", type=int, nargs="*", default=None, help="sample sizes (default 1000 10000)")
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="moestat fits per cell; the median time is reported")
    parser.add_argument("--mixtools-max-n", type=int, default=1000,
                        help="run mixtools::hmeEM (k = 2 only, slow) up to this n")
    parser.add_argument("--out", default="benchmarks/results/mle_vs_flexmix.csv")
    args = parser.parse_args()
    if shutil.which("Rscript") is None:
        raise SystemExit("Rscript not found: install r-base-core r-cran-flexmix r-cran-mixtools (Debian) first.")
    torch.set_num_threads(1)
    ns = args.ns or ([1000] if args.quick else [1000, 10_000])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "fit.R"
        script.write_text(R_SCRIPT)
        for n in ns:
            for k in (2, 3, 4):
                spec = ms.MoE(gate="softmax", expert="linear", k=k, d=1)
                data = ms.simulate(spec, truth(k), n=n, seed=1000 * k + n, model="mixture")
                X, y = data.X[0], data.y[0]
                csv = Path(tmp) / f"d_{n}_{k}.csv"
                pd.DataFrame({"x": X[:, 0], "y": y}).to_csv(csv, index=False)
                ms.fit_mle(spec, X, y, restarts=1, max_iter=5, seed=0)  # warm-up (imports, allocator)
                walls, cpus = [], []
                for _ in range(args.repeat):  # the fit is deterministic: repeats only steady the timing
                    t0, c0 = time.perf_counter(), time.process_time()
                    fit = ms.fit_mle(spec, X, y, restarts=args.restarts, seed=k, tol=1e-8, max_iter=2000)
                    walls.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
                t_ms, c_ms = float(np.median(walls)), float(np.median(cpus))
                r = run_r(csv, k, args.restarts, k, script, mixtools=n <= args.mixtools_max_n)
                row = {"n": n, "k": k, "restarts": args.restarts, "moestat_loglik": float(fit.loglik),
                       "moestat_time_s": t_ms, "moestat_cpu_s": c_ms, "moestat_converged": bool(fit.converged), **r}
                row["loglik_diff_vs_flexmix"] = row["moestat_loglik"] - row["flexmix_loglik"]
                row["speedup_vs_flexmix"] = row["flexmix_time"] / t_ms
                row["cpu_speedup_vs_flexmix"] = row["flexmix_cpu"] / c_ms
                if row["mixtools_time"] is not None:
                    row["speedup_vs_mixtools"] = row["mixtools_time"] / t_ms
                    row["cpu_speedup_vs_mixtools"] = row["mixtools_cpu"] / c_ms
                rows.append(row)
                print(json.dumps(row), flush=True)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                pd.DataFrame(rows).to_csv(args.out, index=False)  # saved as we go
    frame = pd.DataFrame(rows)
    cols = ["n", "k", "moestat_loglik", "flexmix_loglik", "mixtools_loglik", "loglik_diff_vs_flexmix",
            "moestat_time_s", "flexmix_time", "speedup_vs_flexmix", "moestat_cpu_s", "flexmix_cpu",
            "cpu_speedup_vs_flexmix"]
    print(frame[[c for c in cols if c in frame]].to_string(index=False, float_format="%.3f"))


if __name__ == "__main__":
    main()
