"""Benchmark: moestat's shared-coefficient MoE (``fit_mle(..., shared=)``) against R flexmix's ``FLXMRglmfix``.

Data: flexmix's ``NPreg`` (n = 200, two latent classes, regressor ``x``; responses ``yn`` Gaussian, ``yp`` Poisson),
exported by R.  Models (the same in both programs): k = 2 experts with their own intercept and slope on ``x``, a
coefficient on ``x^2`` shared by both experts (``FLXMRglmfix(fixed = ~ I(x^2))`` / ``shared="~ I(x**2)"``) and a
multinomial-logit gate on ``x`` (``concomitant = FLXPmultinom(~ x)`` / moestat's default gate).  flexmix runs with
``minprior = 0`` (keeps every component, as moestat does), 10 random starts via ``stepFlexmix`` and its EM tolerance
1e-10; moestat with 10 random starts.  Printed: the best log-likelihood of each (higher is better) and the shared
coefficient.  flexmix's Gaussian log-likelihood uses the ML variance (divisor sum of weights), as moestat does.

Usage::

    python benchmarks/mle_shared_vs_flexmix.py
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd

import moestat as ms

R_SCRIPT = r"""
suppressMessages(library(flexmix))
args <- commandArgs(trailingOnly = TRUE)
data("NPreg", package = "flexmix")
write.csv(NPreg[, c("x", "yn", "yp")], args[1], row.names = FALSE)
set.seed(1)
for (fam in c("gaussian", "poisson")) {
  f <- if (fam == "gaussian") yn ~ x else yp ~ x
  m <- stepFlexmix(f, data = NPreg, k = 2, nrep = 10, verbose = FALSE,
                   model = FLXMRglmfix(family = fam, fixed = ~ I(x^2)),
                   concomitant = FLXPmultinom(~ x), control = list(minprior = 0, tolerance = 1e-10, iter.max = 5000))
  cf <- parameters(m)
  cat(sprintf("%s %.12g %.12g %d\n", fam, as.numeric(logLik(m)), cf[grep("x\\^2", rownames(cf)), 1],
              as.integer(attr(logLik(m), "df"))))
}
"""


def run_flexmix(csv: Path) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".R", delete=False) as fh:
        fh.write(R_SCRIPT)
    res = subprocess.run(["Rscript", fh.name, str(csv)], capture_output=True, text=True, check=True)
    out = {}
    for line in res.stdout.strip().splitlines():  # "family loglik shared df"
        fam, ll, shared, df = line.split()
        out[fam] = {"loglik": float(ll), "shared": float(shared), "df": int(df)}
    return out


def main() -> None:
    if shutil.which("Rscript") is None:
        raise SystemExit("Rscript not found: install R and r-cran-flexmix to run this benchmark.")
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "npreg.csv"
        r = run_flexmix(csv)
        df = pd.read_csv(csv)
    rows = []
    for fam, resp in (("gaussian", "yn"), ("poisson", "yp")):
        fit = ms.fit_mle(formula=f"{resp} ~ x", data=df, k=2, shared="~ I(x**2)", family=fam, restarts=10, seed=0)
        shared = dict(zip(fit.param_names, fit.theta, strict=True))["shared:I(x ** 2)"]
        rows.append({"family": fam, "moestat_loglik": fit.loglik, "flexmix_loglik": r[fam]["loglik"],
                     "moestat_shared": shared, "flexmix_shared": r[fam]["shared"], "moestat_df": fit.df_model,
                     "flexmix_df": r[fam]["df"]})
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
