"""Benchmark: moestat's shared-coefficient MoE (``fit_mle(..., shared=)``) against R flexmix's ``FLXMRglmfix``.

Data: flexmix's ``NPreg`` (n = 200, two latent classes, regressor ``x``; responses ``yn`` Gaussian, ``yp`` Poisson),
exported by R.  Models (the same in both programs): k = 2 experts with their own intercept and slope on ``x``, a
coefficient on ``x^2`` shared by both experts (``FLXMRglmfix(fixed = ~ I(x^2))`` / ``shared="~ I(x**2)"``) and a
multinomial-logit gate on ``x`` (``concomitant = FLXPmultinom(~ x)`` / moestat's default gate).  flexmix runs with
``minprior = 0`` (keeps every component, as moestat does), 10 random starts via ``stepFlexmix`` and its EM tolerance
1e-10 (at most 5,000 iterations); moestat with 10 random starts and the same stopping rule.  Printed: the best
log-likelihood of each (higher is better), the shared coefficient, and the CPU seconds of one fit (flexmix: median of
3 ``system.time`` calls, ``OMP_NUM_THREADS=1``; moestat: median of 11 after a warm-up, one torch thread) for three
moestat settings: its defaults (EM, then L-BFGS from iteration 30 for the starts still running), ``compile=True``
(the same in the fused C++ EM loop) and ``compile=True, switch_after=None`` (pure EM to the tolerance, the algorithm
flexmix runs).  The maxima must agree (the first two to 1e-8, pure EM to 1e-6).  flexmix's Gaussian log-likelihood
uses the ML variance (divisor sum of weights), as moestat does.

Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_shared_vs_flexmix.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from mle_vs_flexmix_glm import cpu_timed_fits  # a sibling benchmark's timing loop

R_SCRIPT = r"""
suppressMessages(library(flexmix))
args <- commandArgs(trailingOnly = TRUE)
data("NPreg", package = "flexmix")
write.csv(NPreg[, c("x", "yn", "yp")], args[1], row.names = FALSE)
for (fam in c("gaussian", "poisson")) {
  f <- if (fam == "gaussian") yn ~ x else yp ~ x
  cpus <- c()
  for (run in 1:3) {
    set.seed(1)
    tt <- system.time(m <- stepFlexmix(f, data = NPreg, k = 2, nrep = 10, verbose = FALSE,
                                      model = FLXMRglmfix(family = fam, fixed = ~ I(x^2)),
                                      concomitant = FLXPmultinom(~ x),
                                      control = list(minprior = 0, tolerance = 1e-10, iter.max = 5000)))
    cpus <- c(cpus, tt[["user.self"]] + tt[["sys.self"]])
  }
  cf <- parameters(m)
  cat(sprintf("%s %.12g %.12g %d %.4f\n", fam, as.numeric(logLik(m)), cf[grep("x\\^2", rownames(cf)), 1],
              as.integer(attr(logLik(m), "df")), median(cpus)))
}
"""


def run_flexmix(csv: Path) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".R", delete=False) as fh:
        fh.write(R_SCRIPT)
    res = subprocess.run(["Rscript", fh.name, str(csv)], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = {}
    for line in res.stdout.strip().splitlines():  # "family loglik shared df cpu_s"
        fam, ll, shared, df, cpu = line.split()
        out[fam] = {"loglik": float(ll), "shared": float(shared), "df": int(df), "cpu_s": float(cpu)}
    return out


def main() -> None:
    if shutil.which("Rscript") is None:
        raise SystemExit("Rscript not found: install R and r-cran-flexmix to run this benchmark.")
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "npreg.csv"
        r = run_flexmix(csv)
        df = pd.read_csv(csv)
    torch.set_num_threads(1)
    rows = []
    for fam, resp in (("gaussian", "yn"), ("poisson", "yp")):
        kw = dict(formula=f"{resp} ~ x", data=df, k=2, shared="~ I(x**2)", family=fam, restarts=10, seed=0,
                  tol=1e-10, max_iter=5000)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degeneracy and convergence warnings: the maxima are compared
            fit, cpus = cpu_timed_fits(kw, 11)
            compiled, c_cpus = cpu_timed_fits({**kw, "compile": True}, 11)
            pure, p_cpus = cpu_timed_fits({**kw, "compile": True, "switch_after": None}, 11)
        assert abs(float(compiled.loglik) - float(fit.loglik)) < 1e-8, "the two EM loops disagree"
        # pure EM stops by EM's own rule instead of L-BFGS's: the same maximum to the tolerance, not to the bit
        assert abs(float(pure.loglik) - float(fit.loglik)) < 1e-6, "pure EM and the hand-over disagree"
        shared = dict(zip(fit.param_names, fit.theta, strict=True))["shared:I(x ** 2)"]
        flex = r[fam]["cpu_s"]
        rows.append({"family": fam, "moestat_loglik": float(fit.loglik), "flexmix_loglik": r[fam]["loglik"],
                     "moestat_shared": float(shared), "flexmix_shared": r[fam]["shared"], "moestat_df": fit.df_model,
                     "flexmix_df": r[fam]["df"], "flexmix_cpu_s": flex,
                     **{f"{name}_cpu_s": float(np.median(c)) for name, c in
                        (("default", cpus), ("compiled", c_cpus), ("compiled_pure_em", p_cpus))},
                     **{f"{name}_ratio": f"{flex / float(np.median(c)):.1f}x" for name, c in
                        (("default", cpus), ("compiled", c_cpus), ("compiled_pure_em", p_cpus))}})
    with pd.option_context("display.width", 250):
        print(pd.DataFrame(rows).T.to_string(header=False))


if __name__ == "__main__":
    main()
