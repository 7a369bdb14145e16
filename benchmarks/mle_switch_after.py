"""When EM should hand over to L-BFGS: ``fit_mle`` with ``switch_after`` in {30 (the default), 100, 300, None} on
everyday data sets, CPU time and the maximum reached (10 random starts, seeds 0 and 1, best of 3 timed fits after a
warm-up, one torch thread).

Data: statsmodels' ``engel`` (k = 2, 3), scikit-learn's ``diabetes`` (k = 2 with a gate on bmi and s5 and all ten
covariates in the experts; k = 3 on three covariates), a 3,000-row subsample of statsmodels' ``randhie`` (Poisson,
k = 3, gate on disea and physlm), a simulated binomial mixture with trials (k = 3, 1,000 rows), and flexmix's
``NPreg`` (the cases of ``mle_vs_flexmix_glm.py``) when ``Rscript`` with flexmix is installed.  Prints one line per
case and setting.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_switch_after.py [--cases diabetes_k2,engel_k3]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels.api as sm
import torch
from sklearn.datasets import load_diabetes

import moestat as ms

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mle_vs_flexmix_glm import R_DATA, write_data  # flexmix's NPreg, with the gate covariate z

SETTINGS = (30, 100, 300, None)


def npreg() -> pd.DataFrame | None:
    if shutil.which("Rscript") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        script, csv = Path(tmp) / "data.R", Path(tmp) / "npreg.csv"
        script.write_text(R_DATA)
        write_data(csv, 0, script)
        return pd.read_csv(csv)


def binomial_mixture(n: int = 1000, seed: int = 5) -> pd.DataFrame:
    """Three logistic experts on x with 1-5 trials per row, equal shares."""
    rng = np.random.default_rng(seed)
    x, m, comp = rng.normal(size=n), rng.integers(1, 6, n), rng.integers(0, 3, n)
    p = 1 / (1 + np.exp(-(np.array([-1.5, 0.0, 1.5])[comp] + np.array([1.0, -1.0, 0.5])[comp] * x)))
    return pd.DataFrame({"x": x, "m": m, "y": rng.binomial(m, p) / m})


def cases() -> dict[str, dict]:
    diab = load_diabetes(as_frame=True).frame
    engel = sm.datasets.engel.load_pandas().data
    rand = sm.datasets.randhie.load_pandas().data.sample(3000, random_state=0)
    out = {
        "engel_k2": dict(formula="foodexp ~ income", data=engel, k=2),
        "engel_k3": dict(formula="foodexp ~ income", data=engel, k=3),
        "diabetes_k2": dict(formula="target ~ age + sex + bmi + bp + s1 + s2 + s3 + s4 + s5 + s6", data=diab, k=2,
                            gate_formula="~ bmi + s5"),
        "diabetes_k3": dict(formula="target ~ bmi + bp + s5", data=diab, k=3),
        "randhie_poisson_k3": dict(formula="mdvis ~ lncoins + idp + physlm + disea", data=rand, k=3,
                                   family="poisson", gate_formula="~ disea + physlm"),
        "binomial_k3": dict(formula="y ~ x", data=binomial_mixture(), k=3, family="binomial", trials="m"),
    }
    df = npreg()
    if df is not None:
        out |= {"npreg_gaussian_gate_z": dict(formula="yn ~ x + I(x**2)", data=df, k=2, gate_formula="~ z"),
                "npreg_poisson_x": dict(formula="yp ~ x", data=df, k=2, family="poisson", gate_formula="~ 1"),
                "npreg_poisson_x2": dict(formula="yp ~ x + I(x**2)", data=df, k=2, family="poisson",
                                         gate_formula="~ 1")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # convergence and degeneracy warnings: the maxima are printed
    table = cases()
    names = args.cases.split(",") if args.cases else list(table)
    print(f"{'case':24s} {'switch_after':>12s} {'seed':>4s} {'CPU ms':>8s} {'log-likelihood':>16s}")
    for name in names:
        for switch in SETTINGS:
            for seed in (0, 1):
                kw = dict(table[name], restarts=10, seed=seed, switch_after=switch, progress=False)
                ms.fit_mle(**kw)  # warm-up
                times = []
                for _ in range(3):
                    t0 = time.process_time()
                    fit = ms.fit_mle(**kw)
                    times.append(time.process_time() - t0)
                print(f"{name:24s} {switch!s:>12s} {seed:4d} {1e3 * min(times):8.0f} {float(fit.loglik):16.4f}",
                      flush=True)


if __name__ == "__main__":
    main()
