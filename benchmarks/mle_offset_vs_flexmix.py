"""Benchmark: GLM mixtures of experts on flexmix's ``betablocker`` data, moestat against R flexmix: Poisson experts with
an offset (``offset=`` / ``FLXMRglm(family = "poisson", offset = ...)``) and binomial experts with trials
(``trials=`` / ``FLXMRglm(family = "binomial")`` on ``cbind(successes, failures)``).

Data: flexmix's ``betablocker`` (Aitkin 1999, *Biometrics* 55: 117-128; 22 hospitals x 2 treatments = 44 rows:
``Deaths`` out of ``Total`` patients), exported by R.  Models (the same in both programs), k = 2 and 3, constant
mixing weights (flexmix's plain mixture; moestat ``gate_formula="~ 1"``) or, in the ``*_gate`` models, mixing
weights that depend on the treatment (flexmix ``concomitant = FLXPmultinom(~ Treatment)``; moestat
``gate_formula="~ Treatment"``):

* ``poisson_offset``: Poisson experts ``Deaths ~ Treatment`` with offset ``log(Total)`` (each expert a death rate
  per patient, with a treatment effect);
* ``binomial``: binomial experts for the proportion ``Deaths / Total`` out of ``Total`` trials, ``~ Treatment``
  (flexmix: ``cbind(Deaths, Total - Deaths) ~ Treatment``; both log-likelihoods are the full binomial log-pmf,
  the binomial coefficients included).

Both get 10 random starts (flexmix ``stepFlexmix(..., nrep = 10)``, ``minprior = 0``) and the same stopping rule
(relative log-likelihood change 1e-10, at most 5,000 iterations).  Printed per model and k: each program's best
log-likelihood (higher is better), its experts' control-arm death rates per patient, and the CPU seconds of one fit
(moestat: median of 11 after a warm-up, one torch thread; flexmix: median of 3 ``system.time`` calls,
``OMP_NUM_THREADS=1``); moestat is timed with its default EM (the tensor loop) and with ``compile=True`` (the fused
C++ EM loop), whose maxima must agree.  Needs ``Rscript`` with flexmix (Debian ``r-cran-flexmix``).

Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_offset_vs_flexmix.py [--models poisson_offset binomial ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
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
data("betablocker", package = "flexmix")
write.csv(betablocker[, c("Deaths", "Total", "Center", "Treatment")], args[1], row.names = FALSE)
poisson <- list(formula = Deaths ~ Treatment, model = FLXMRglm(family = "poisson", offset = log(betablocker$Total)),
                rate = exp, concomitant = FLXPconstant())
binomial <- list(formula = cbind(Deaths, Total - Deaths) ~ Treatment, model = FLXMRglm(family = "binomial"),
                 rate = plogis, concomitant = FLXPconstant())
gate <- FLXPmultinom(~ Treatment)
models <- list(poisson_offset = poisson, binomial = binomial,
               poisson_offset_gate = modifyList(poisson, list(concomitant = gate)),
               binomial_gate = modifyList(binomial, list(concomitant = gate)))
out <- list()
for (name in args[-1]) {
  spec <- models[[name]]
  for (k in c(2, 3)) {
    cpus <- c()
    for (run in 1:3) {
      set.seed(1)
      tt <- system.time(m <- stepFlexmix(spec$formula, data = betablocker, k = k, nrep = 10, verbose = FALSE,
                                        model = spec$model, concomitant = spec$concomitant,
                                        control = list(minprior = 0, tolerance = 1e-10, iter.max = 5000)))
      cpus <- c(cpus, tt[["user.self"]] + tt[["sys.self"]])
    }
    cf <- parameters(m)
    out[[length(out) + 1]] <- sprintf(
      '{"model": "%s", "k": %d, "loglik": %.10f, "cpu_s": %.4f, "k_kept": %d, "control_rate": [%s]}',
      name, k, as.numeric(logLik(m)), median(cpus), length(m@prior),
      paste(sprintf("%.8g", spec$rate(cf[1, ])), collapse = ","))
  }
}
cat(paste(out, collapse = "\n"), "\n")
"""

#: moestat's side of each model: fit_mle's arguments, and the inverse link that turns an intercept into a rate
MODELS = {
    "poisson_offset": (dict(formula="Deaths ~ Treatment", family="poisson", offset="np.log(Total)",
                            gate_formula="~ 1"), np.exp),
    "binomial": (dict(formula="p ~ Treatment", family="binomial", trials="Total", gate_formula="~ 1"),
                 lambda b: 1 / (1 + np.exp(-b))),
}
for _name in ("poisson_offset", "binomial"):  # the same experts, with mixing weights that depend on the treatment
    MODELS[f"{_name}_gate"] = ({**MODELS[_name][0], "gate_formula": "~ Treatment"}, MODELS[_name][1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    args = ap.parse_args()
    if shutil.which("Rscript") is None:
        sys.exit("needs Rscript with flexmix (apt-get install r-cran-flexmix)")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        script, csv = Path(tmp) / "fit.R", Path(tmp) / "betablocker.csv"
        script.write_text(R_SCRIPT)
        out = subprocess.run(["Rscript", str(script), str(csv), *args.models], capture_output=True, text=True,
                             check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        flexmix = [json.loads(line) for line in out.stdout.split("\n") if line.strip().startswith("{")]
        df = pd.read_csv(csv)
    df["p"] = df["Deaths"] / df["Total"]
    print(f"{'model':>19s} {'k':>2s} {'moestat loglik':>16s} {'flexmix loglik':>16s} {'moestat - flexmix':>18s} "
          f"{'moestat CPU s':>14s} {'flexmix CPU s':>14s} {'ratio':>6s} {'compiled CPU s':>15s} {'ratio':>6s}  "
          "control-arm death rates (moestat / flexmix)")
    for r in flexmix:
        model, rate = MODELS[r["model"]]
        kw = dict(data=df, k=r["k"], restarts=10, seed=1, tol=1e-10, max_iter=5000, **model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degeneracy and convergence warnings: the maxima are compared
            fit, cpus = cpu_timed_fits(kw, 11)
            compiled, c_cpus = cpu_timed_fits({**kw, "compile": True}, 11)
        assert abs(float(compiled.loglik) - float(fit.loglik)) < 1e-8, "the two EM loops disagree"
        rates = rate(np.asarray(fit.params.expert_bias, dtype=float))
        cpu, c_cpu = float(np.median(cpus)), float(np.median(c_cpus))
        print(f"{r['model']:>19s} {r['k']:2d} {float(fit.loglik):16.6f} {r['loglik']:16.6f} "
              f"{float(fit.loglik) - r['loglik']:18.2e} {cpu:14.4f} {r['cpu_s']:14.4f} {r['cpu_s'] / cpu:5.1f}x "
              f"{c_cpu:15.4f} {r['cpu_s'] / c_cpu:5.1f}x  "
              f"{np.sort(rates).round(5).tolist()} / {np.sort(r['control_rate']).round(5).tolist()}", flush=True)


if __name__ == "__main__":
    main()
