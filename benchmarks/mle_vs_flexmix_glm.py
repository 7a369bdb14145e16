"""Benchmark: moestat's formula/GLM MLE against R flexmix on flexmix's own ``NPreg`` data (issue 17's check).

Grün & Leisch (2008, *Journal of Statistical Software* 28(4)) fit mixtures of regressions to ``NPreg`` (n = 200,
two latent classes; columns ``x``, ``yn`` Gaussian, ``yp`` Poisson counts, ``yb``, ``class``).  R writes the data to
a CSV, a gate covariate ``z`` is added (below), and both sides fit the *same file*:

* ``poisson_x``: Poisson experts ``yp ~ x`` (the formula of flexmix's vignette, ``model = FLXMRglm(family =
  "poisson")``) with constant mixing weights (flexmix's plain mixture; moestat ``gate_formula="~ 1"``);
* ``poisson_x2``: the same with ``yp ~ x + I(x^2)``;
* ``gaussian_gate_z``: Gaussian experts ``yn ~ x + I(x^2)`` and a gate on a different covariate,
  ``concomitant = FLXPmultinom(~ z)`` / ``gate_formula="~ z"``.  ``z = (class - 1) + 0.5 e``, ``e ~ N(0, 1)`` from
  ``numpy.random.default_rng(17)``: a noisy copy of the latent class (``id2`` would separate the classes exactly,
  sending the gate coefficients to infinity).  flexmix's Gaussian M-step sets
  :math:`\\sigma_j^2 = \\sum_t w_{tj} r_{tj}^2 / (\\bar w_j (n - p))` (``n/(n-p)`` times the weighted ML value), so
  its EM does not reach the likelihood maximum; the row ``gaussian_gate_z_mlsigma`` refits flexmix with the same
  model but the ML variance :math:`\\sum_t w_{tj} r_{tj}^2/\\sum_t w_{tj}` in its M-step.

Both sides get 10 random starts (flexmix ``stepFlexmix(..., nrep = 10)``, keeping the best) and the same stopping
rule (relative log-likelihood change 1e-8, at most 2000 iterations); flexmix runs with ``minprior = 0`` so it keeps
both components.  Components are matched by the permutation closest in expert coefficients; gate coefficients are
compared as log-odds against flexmix's component 1 (constant gates: :math:`\\log(\\pi_j/\\pi_1)`).  Times are
measured in the same run, in ``--rounds`` paired rounds: in each round moestat (one torch thread) times
``--repeat`` identical fits after a warm-up, each including the formula parsing, and flexmix
(``OMP_NUM_THREADS=1``) ``--r-repeat`` identical ``stepFlexmix`` calls (``system.time``: elapsed, and user + system
CPU), each side's median giving the round's ratio.  The machine's speed drifts over seconds (other tenants of a
shared host), so the two sides of a round are measured back to back and the reported ratio is the median of the
rounds' ratios (``cpu_speedup``, with its range ``cpu_speedup_min`` / ``_max``); the times are the medians over
rounds.  Each round also times ``fit_mle(..., compile=True)`` (EM in the fused C++ loop where it applies: the
Gaussian cases; ``compiled_em_kernel`` says which ran) against the same flexmix times: ``cpu_speedup_compiled``.
``--large-n N`` adds the same
cases on flexmix's own generator ``ExNPreg(N / 2)`` (N rows) to show how the ratio scales with n.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/mle_vs_flexmix_glm.py [--out benchmarks/results/mle_vs_flexmix_glm.csv]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import moestat as ms

R_DATA = r"""
suppressMessages(library(flexmix))
args <- commandArgs(trailingOnly = TRUE); n <- as.integer(args[2])
if (n == 0) { data("NPreg", package = "flexmix"); d <- NPreg } else { set.seed(17); d <- ExNPreg(n / 2) }
write.csv(d[, c("x", "yn", "yp", "yb", "class")], args[1], row.names = FALSE)
cat(as.character(packageVersion("flexmix")), "\n")
"""

R_FIT = r"""
suppressMessages(library(flexmix))
args <- commandArgs(trailingOnly = TRUE)
dat <- read.csv(args[1]); form <- as.formula(args[2]); fam <- args[3]; conc <- args[4]
k <- as.integer(args[5]); nrep <- as.integer(args[6]); seed <- as.integer(args[7]); nrun <- as.integer(args[8])
ml_sigma <- as.integer(args[9]) == 1
model <- FLXMRglm(family = fam)
if (ml_sigma) {  # the same Gaussian model, with the weighted ML variance in the M-step
  stock <- model@fit
  model@fit <- function(x, y, w, component) {
    fit <- lm.wfit(x, y, w = w, offset = offset)
    z@defineComponent(para = list(coef = coef(fit), df = ncol(x) + 1,
                                  sigma = sqrt(sum(fit$weights * fit$residuals^2) / sum(fit$weights))))
  }
  environment(model@fit) <- environment(stock)
}
concomitant <- if (conc == "") FLXPconstant() else FLXPmultinom(as.formula(conc))
ctrl <- list(iter.max = 2000, tolerance = 1e-8, minprior = 0)
walls <- c(); cpus <- c()
for (run in seq_len(nrun)) {
  set.seed(seed)
  tt <- system.time(f <- stepFlexmix(form, data = dat, k = k, nrep = nrep, model = model,
                                     concomitant = concomitant, control = ctrl, verbose = FALSE))
  walls <- c(walls, tt[["elapsed"]]); cpus <- c(cpus, tt[["user.self"]] + tt[["sys.self"]])
}
vec <- function(v) paste0("[", paste(sprintf("%.12g", v), collapse = ","), "]")
p <- parameters(f)
g <- if (conc == "") matrix(log(prior(f) / prior(f)[1]), nrow = 1) else parameters(f, which = "concomitant")
cat(sprintf(paste0('{"flexmix_loglik": %.10f, "flexmix_wall_s": %.4f, "flexmix_cpu_s": %.4f, "flexmix_iter": %d, ',
                   '"flexmix_k": %d, "flexmix_converged": %s, "flexmix_expert": %s, "flexmix_gate": %s, ',
                   '"flexmix_prior": %s}\n'),
            as.numeric(logLik(f)), median(walls), median(cpus), f@iter, length(f@prior),
            ifelse(f@converged, "true", "false"), vec(p), vec(g), vec(prior(f))))
"""

#: (name, moestat formula, R formula, family, moestat gate formula, R concomitant formula, ML sigma in flexmix)
CASES = [
    ("poisson_x", "yp ~ x", "yp ~ x", "poisson", "~ 1", "", False),
    ("poisson_x2", "yp ~ x + I(x**2)", "yp ~ x + I(x^2)", "poisson", "~ 1", "", False),
    ("gaussian_gate_z", "yn ~ x + I(x**2)", "yn ~ x + I(x^2)", "gaussian", "~ z", "~ z", False),
    ("gaussian_gate_z_mlsigma", "yn ~ x + I(x**2)", "yn ~ x + I(x^2)", "gaussian", "~ z", "~ z", True),
]


def write_data(path: Path, n: int, script: Path) -> str:
    """NPreg (``n = 0``) or ``ExNPreg(n / 2)`` written by R, plus ``z``; returns flexmix's version."""
    out = subprocess.run(["Rscript", str(script), str(path), str(n)], capture_output=True, text=True, check=True)
    df = pd.read_csv(path)
    rng = np.random.default_rng(17)
    df["z"] = df["class"] - 1 + 0.5 * rng.standard_normal(len(df))
    df.to_csv(path, index=False)  # float repr round-trips exactly: R and Python read identical doubles
    return out.stdout.strip()


def run_r(script: Path, csv: Path, case: tuple, k: int, restarts: int, seed: int, repeat: int) -> dict:
    _, _, r_formula, family, _, concomitant, ml_sigma = case
    cmd = ["Rscript", str(script), str(csv), r_formula, family, concomitant, str(k), str(restarts), str(seed),
           str(repeat), str(int(ml_sigma))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def fit_moestat(df: pd.DataFrame, case: tuple, k: int, restarts: int, seed: int, repeat: int, compile: bool = False):
    """Warm-up, then ``repeat`` identical fits; returns the fit and the median wall and CPU seconds.  ``compile``:
    ``fit_mle(compile=True)``, EM in the fused C++ loop where it applies (Gaussian experts, softmax gate)."""
    _, formula, _, family, gate_formula, _, _ = case
    kwargs = dict(formula=formula, data=df, k=k, family=family, gate_formula=gate_formula, tol=1e-8, max_iter=2000,
                  compile=compile)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ms.MLEConvergenceWarning)
        ms.fit_mle(**kwargs, restarts=1, seed=0)  # warm-up (imports, allocator, formulaic)
    walls, cpus = [], []
    for _ in range(repeat):  # the fit is deterministic: repeats only steady the timing
        t0, c0 = time.perf_counter(), time.process_time()
        fit = ms.fit_mle(**kwargs, restarts=restarts, seed=seed)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return fit, float(np.median(walls)), float(np.median(cpus))


def cpu_timed_fits(kwargs: dict, repeat: int) -> tuple[object, list[float]]:
    """``ms.fit_mle(**kwargs)`` once as a warm-up, then ``repeat`` times timed; returns the last fit and the CPU
    seconds of each timed call (the fit is deterministic: repeats only steady the timing)."""
    ms.fit_mle(**kwargs)
    cpus = []
    for _ in range(repeat):
        t0 = time.process_time()
        fit = ms.fit_mle(**kwargs)
        cpus.append(time.process_time() - t0)
    return fit, cpus


def moestat_coefficients(fit, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Expert coefficients (k, p) in formula order and gate coefficients (k, q), last expert's row zero."""
    theta = dict(zip(fit.param_names, np.asarray(fit.theta, dtype=float), strict=True))
    expert = np.array([[v for name, v in theta.items() if name.startswith(f"expert[{j}]:")
                        and not name.endswith("log_sigma")] for j in range(k)])
    gate = np.array([[v for name, v in theta.items() if name.startswith(f"gate[{j}]:")] for j in range(k - 1)])
    return expert, np.vstack([gate, np.zeros((1, gate.shape[1]))])


def n_expert_coef(fit) -> int:
    """Coefficients per expert (intercept included), p of flexmix's n - p."""
    return sum(name.startswith("expert[0]:") and not name.endswith("log_sigma") for name in fit.param_names)


def sigma_loss(n: int, p: int) -> float:
    r"""Log-likelihood flexmix's Gaussian variance gives away at fixed coefficients and responsibilities.

    flexmix's variance is :math:`c\,\hat\sigma_j^2` with :math:`c = n/(n-p)` and :math:`\hat\sigma_j^2` the
    weighted ML value; the component's expected complete-data log-likelihood
    :math:`-\tfrac{n_j}{2}(\log 2\pi\sigma^2 + \hat\sigma_j^2/\sigma^2)` then drops by
    :math:`\tfrac{n_j}{2}(\log c + 1/c - 1)`; summed over components (:math:`\sum_j n_j = n`) the drop is
    :math:`\tfrac n2(\log c + 1/c - 1) \approx p^2/(4n)`.  A first-order prediction of the gap to the maximum.
    """
    c = n / (n - p)
    return n / 2 * (np.log(c) + 1 / c - 1)


def compare_coefficients(fit, r: dict, k: int, gaussian: bool) -> dict:
    """Match components (closest expert coefficients) and return the largest absolute differences."""
    expert, gate = moestat_coefficients(fit, k)
    rexp = np.asarray(r["flexmix_expert"]).reshape(k, -1)  # R's column-major (rows, k) matrix, one row per comp
    rsig = rexp[:, -1] if gaussian else None
    rexp = rexp[:, :-1] if gaussian else rexp
    rgate = np.asarray(r["flexmix_gate"]).reshape(k, -1)
    perm = min(itertools.permutations(range(k)), key=lambda p: float(((expert[list(p)] - rexp) ** 2).sum()))
    expert, gate = expert[list(perm)], gate[list(perm)]
    out = {"max_abs_diff_expert_coef": float(np.abs(expert - rexp).max()),
           "max_abs_diff_gate_logodds": float(np.abs((gate - gate[0]) - (rgate - rgate[0])).max()),
           "moestat_expert": expert.round(6).tolist(), "moestat_gate_logodds": (gate - gate[0]).round(6).tolist()}
    if gaussian:
        sd = np.asarray(fit.params.noise_sd, dtype=float)[list(perm)]
        out["max_abs_diff_sigma"] = float(np.abs(sd - rsig).max())
        out["moestat_sigma"] = sd.round(6).tolist()
    return out


def paired_rounds(df: pd.DataFrame, case: tuple, k: int, args: argparse.Namespace, fit_script: Path, csv: Path,
                  rounds: int, r_repeat: int) -> tuple[object, dict, dict]:
    """``rounds`` rounds of (moestat fits, moestat fits with ``compile=True``, flexmix fits) back to back; the fit,
    flexmix's output and the timings."""
    walls, cpus, c_cpus, r_walls, r_cpus, r = [], [], [], [], [], {}
    fit = compiled = None
    for _ in range(rounds):
        fit, wall, cpu = fit_moestat(df, case, k, args.restarts, args.seed, args.repeat)
        compiled, _, c_cpu = fit_moestat(df, case, k, args.restarts, args.seed, args.repeat, compile=True)
        r = run_r(fit_script, csv, case, k, args.restarts, args.seed, r_repeat)
        walls.append(wall)
        cpus.append(cpu)
        c_cpus.append(c_cpu)
        r_walls.append(r["flexmix_wall_s"])
        r_cpus.append(r["flexmix_cpu_s"])
    cpu_ratio = np.asarray(r_cpus) / np.asarray(cpus)
    c_ratio = np.asarray(r_cpus) / np.asarray(c_cpus)
    wall_ratio = np.asarray(r_walls) / np.asarray(walls)
    timing = {"rounds": rounds, "moestat_wall_s": float(np.median(walls)), "moestat_cpu_s": float(np.median(cpus)),
              "flexmix_wall_s": float(np.median(r_walls)), "flexmix_cpu_s": float(np.median(r_cpus)),
              "cpu_speedup": float(np.median(cpu_ratio)), "cpu_speedup_min": float(cpu_ratio.min()),
              "cpu_speedup_max": float(cpu_ratio.max()), "wall_speedup": float(np.median(wall_ratio)),
              "round_cpu_speedups": cpu_ratio.round(2).tolist(),
              "compiled_em_kernel": None if compiled is None else compiled.settings["em_kernel"],
              "compiled_loglik_diff": None if compiled is None or fit is None
              else float(compiled.loglik) - float(fit.loglik),
              "moestat_compiled_cpu_s": float(np.median(c_cpus)), "cpu_speedup_compiled": float(np.median(c_ratio)),
              "cpu_speedup_compiled_min": float(c_ratio.min()), "cpu_speedup_compiled_max": float(c_ratio.max())}
    return fit, r, timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=21,
                        help="moestat fits per case; the median time is reported (a fit on 200 rows takes 15-40 ms)")
    parser.add_argument("--r-repeat", type=int, default=3, help="flexmix fits per case on NPreg (1 for --large-n)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="paired rounds of (moestat, flexmix) timings on NPreg (1 for --large-n)")
    parser.add_argument("--large-n", type=int, default=5000,
                        help="also run the cases on ExNPreg data of this many rows (0: NPreg only)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/mle_vs_flexmix_glm.csv")
    args = parser.parse_args()
    if shutil.which("Rscript") is None:
        raise SystemExit("Rscript not found: install r-base-core r-cran-flexmix (Debian) first.")
    torch.set_num_threads(1)
    k, rows = 2, []
    with tempfile.TemporaryDirectory() as tmp:
        data_script, fit_script = Path(tmp) / "data.R", Path(tmp) / "fit.R"
        data_script.write_text(R_DATA)
        fit_script.write_text(R_FIT)
        for n in [0] + ([args.large_n] if args.large_n else []):
            csv = Path(tmp) / f"npreg_{n}.csv"
            version = write_data(csv, n, data_script)
            df = pd.read_csv(csv)
            for case in CASES:
                fit, r, timing = paired_rounds(df, case, k, args, fit_script, csv, args.rounds if n == 0 else 1,
                                               args.r_repeat if n == 0 else 1)
                row = {"data": "NPreg" if n == 0 else f"ExNPreg({n // 2})", "n": len(df), "case": case[0],
                       "family": case[3], "formula": case[1], "gate_formula": case[4], "restarts": args.restarts,
                       "flexmix_version": version, "moestat_loglik": float(fit.loglik),
                       "moestat_converged": bool(fit.converged), **r, **timing}
                row["loglik_diff"] = row["moestat_loglik"] - row["flexmix_loglik"]
                if case[3] == "gaussian" and not case[6]:
                    row["predicted_flexmix_sigma_loss"] = sigma_loss(len(df), n_expert_coef(fit))
                row.update(compare_coefficients(fit, r, k, gaussian=case[3] == "gaussian"))
                rows.append(row)
                print(json.dumps(row), flush=True)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                pd.DataFrame(rows).to_csv(args.out, index=False)  # saved as we go
    cols = ["data", "case", "moestat_loglik", "flexmix_loglik", "loglik_diff", "predicted_flexmix_sigma_loss",
            "max_abs_diff_expert_coef",
            "max_abs_diff_gate_logodds", "max_abs_diff_sigma", "moestat_cpu_s", "flexmix_cpu_s", "cpu_speedup",
            "cpu_speedup_min", "cpu_speedup_max", "compiled_em_kernel", "moestat_compiled_cpu_s",
            "cpu_speedup_compiled", "cpu_speedup_compiled_min", "cpu_speedup_compiled_max",
            "moestat_wall_s", "flexmix_wall_s", "wall_speedup"]
    frame = pd.DataFrame(rows)
    with pd.option_context("display.width", 250):
        print(frame[cols].to_string(index=False, float_format="%.4g"))


if __name__ == "__main__":
    main()
