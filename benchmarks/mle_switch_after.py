"""When EM should hand over to L-BFGS: ``fit_mle`` with ``switch_after`` in {30 (the default), 100, 300, None} on
everyday data sets, CPU time and the maximum reached (10 random starts, seeds 0 and 1, best of 3 timed fits after a
warm-up, one torch thread).

Data: statsmodels' ``engel`` (k = 2, 3), scikit-learn's ``diabetes`` (k = 2 with a gate on bmi and s5 and all ten
covariates in the experts; k = 3 on three covariates), a 3,000-row subsample of statsmodels' ``randhie`` (Poisson,
k = 3, gate on disea and physlm), a simulated binomial mixture with trials (k = 3, 1,000 rows), and flexmix's
``NPreg`` (the cases of ``mle_vs_flexmix_glm.py``) when ``Rscript`` with flexmix is installed.  Prints one line per
case and setting.  With ``--standardised``, the Gaussian cases are also fitted at the default with the response
centred and scaled to unit SD (the log-likelihood printed is moved back to the original scale, minus n log SD): how
much of the L-BFGS phase's cost is the response's scale.

``--overspecified`` runs the other side of the trade-off instead: the singular fits the switch was set for, as the
softmax Gaussian MoE vignette fits them (its lambda-shaped truth, d = 1, k* = 2, fixed design on [0, 1]; k = 3 with
expert 2 split and k = 4 with splits (1, 2) and (2, 2), started near the truth, no restarts; 5 replicates at n =
1,000 and 10,000), at ``switch_after`` 30 and 100: CPU seconds per cell, and per replicate the maximum each reaches
(-loglik/n).  With ``--standardised`` as well, the same fits at 30 on the standardised response instead (the pooled
mean and SD of the cell; the near-truth start mapped alike).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_switch_after.py [--cases diabetes_k2,engel_k3] [--standardised]
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_switch_after.py --overspecified [--standardised]

``--compile`` fits everything with ``compile=True`` (EM in the fused C++ loop, about ten times cheaper per iteration
on these sizes; the L-BFGS phase is the same): where the switch pays when EM is cheap.

``--rates`` tests a rate-based switching rule on the everyday cases: pure EM from the same 10 starts (seeds 0 and 1),
and for every start still running at iteration 30, the ratio of its last two three-iteration gains (one SQUAREM
cycle each) and the iterations pure EM still needed.  A ratio of 1 or more predicts no convergence (switch); the
summary counts those among the starts EM finished within 30 more iterations.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_switch_after.py --rates
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
from mle_vs_flexmix_glm import R_DATA, cpu_timed_fits, write_data  # flexmix's NPreg, with the gate covariate z

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
                                         gate_formula="~ 1"),
                # mle_shared_vs_flexmix.py's Gaussian model: a coefficient on x^2 shared by both experts, gate on x
                "npreg_gaussian_shared": dict(formula="yn ~ x", data=df, k=2, shared="~ I(x**2)")}
    return out


#: The over-specified fits: (k, the experts of the k* = 2 truth split to start them; each split adds one expert).
OVERSPECIFIED = ((3, [1]), (4, [0, 1]), (4, [1, 1]))


def vignette_truth():
    """The softmax Gaussian MoE vignette's lambda-shaped truth (d = 1, k* = 2): spec, params and the cell's Truth."""
    from moestat.cells import Truth

    spec = ms.MoE(k=2, d=1, gate="softmax", expert="linear")
    params = ms.Params(gate_bias=np.array([-8.0, 0.0]), gate_weight=np.array([[25.0], [0.0]]),
                       expert_weight=np.array([[-20.0], [20.0]]), expert_bias=np.array([15.0, -5.0]),
                       noise_sd=np.array([0.3, 0.4]))
    return spec, params, Truth(spec, params, {})


def vignette_data(n: int, reps: int):
    """``reps`` samples of ``n`` from the truth on the fixed design on [0, 1] (seed n)."""
    spec, params, _ = vignette_truth()
    return ms.simulate(spec, params, n=n, reps=reps, seed=n, model="mixture", design="linspace", low=0.0, high=1.0)


def overspecified(reps: int = 5, standardised: bool = False, compile: bool = False) -> None:
    """The vignette's over-specified fits at ``switch_after`` 30 and 100: CPU s and -loglik/n per replicate
    (``standardised``: at 30 only, on the response centred and scaled by its pooled mean and SD, the truth mapped
    alike; -loglik/n moved back to the original scale)."""
    from moestat.cells import Truth, mle_estimator

    spec, params, truth = vignette_truth()
    print(f"{'n':>6s} {'k':>2s} {'split':>6s} {'switch_after':>12s} {'CPU s':>6s}  -loglik/n per replicate")
    for n in (1000, 10000):
        data = vignette_data(n, reps)
        y, fit_truth, shift = data.y, truth, 0.0
        if standardised:
            centre, sd = float(np.mean(data.y)), float(np.std(data.y))
            y = (data.y - centre) / sd
            fit_truth = Truth(spec, ms.Params(params.gate_bias, params.gate_weight, params.expert_weight / sd,
                                              (params.expert_bias - centre) / sd, params.noise_sd / sd), {})
            shift = np.log(sd)
        for k, split in OVERSPECIFIED:
            for switch in ((30, "30, std. y"),) if standardised else (30, 100):
                setting = switch[0] if isinstance(switch, tuple) else switch
                t0 = time.process_time()
                est = mle_estimator(spec.with_k(k), data.X, y, truth=fit_truth, seed=np.random.SeedSequence(7),
                                    init="near_truth", duplicate=split, se="none", switch_after=setting,
                                    device="cpu", compile=compile)
                cpu = time.process_time() - t0
                label = ",".join(str(i + 1) for i in split)
                name = switch[1] if isinstance(switch, tuple) else str(switch)
                print(f"{n:6d} {k:2d} {label:>6s} {name:>12s} {cpu:6.2f}  "
                      + " ".join(f"{v + shift:.4f}" for v in np.asarray(est.objective, dtype=float)), flush=True)


def rates(table: dict[str, dict], at: int = 30) -> None:
    """Pure EM's log-likelihood path per start; the SQUAREM-cycle gain ratio at ``at`` against the iterations left."""
    from moestat.fit import mle as mle_module

    captured = {}
    em_fit = mle_module.em_fit

    def recording(*args, **kwargs):
        state = em_fit(*args, **kwargs)
        captured["history"], captured["n_iter"] = state.history[:, :, 0].numpy(), state.n_iter.flatten().numpy()
        return state

    mle_module.em_fit = recording
    soon = soon_slow = 0
    try:
        print(f"{'case':24s} {'seed':>4s} {'start':>5s} {'ratio at ' + str(at):>12s} {'EM iterations left':>19s}")
        for name, kw in table.items():
            for seed in (0, 1):
                ms.fit_mle(**kw, restarts=10, seed=seed, switch_after=None, progress=False)
                hist, n_iter = captured["history"], captured["n_iter"]
                for s in np.flatnonzero(n_iter > at):
                    last, before = hist[at, s] - hist[at - 3, s], hist[at - 3, s] - hist[at - 6, s]
                    ratio = last / before if before > 0 else np.inf
                    left = int(n_iter[s]) - at
                    soon += left <= 30
                    soon_slow += left <= 30 and ratio >= 1
                    print(f"{name:24s} {seed:4d} {s:5d} {ratio:12.3f} {left:19d}")
    finally:
        mle_module.em_fit = em_fit
    print(f"starts finished by pure EM within 30 more iterations: {soon}; with a ratio >= 1 at {at}: {soon_slow}")


def standardised(kw: dict) -> tuple[dict, float]:
    """The case with its response column centred and scaled to unit SD, and the log-likelihood shift n log SD."""
    response = kw["formula"].split("~")[0].strip()
    df = kw["data"].copy()
    sd = float(df[response].std())
    df[response] = (df[response] - df[response].mean()) / sd
    return dict(kw, data=df), len(df) * np.log(sd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    parser.add_argument("--standardised", action="store_true",
                        help="also fit the Gaussian cases at the default on the standardised response")
    parser.add_argument("--rates", action="store_true", help="test a rate-based switching rule (pure EM paths)")
    parser.add_argument("--overspecified", action="store_true",
                        help="run the softmax Gaussian MoE vignette's over-specified fits at 30 and 100 instead")
    parser.add_argument("--compile", action="store_true",
                        help="every fit with compile=True (EM and its L-BFGS phase in the fused C++ loops)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # convergence and degeneracy warnings: the maxima are printed
    if args.overspecified:
        overspecified(standardised=args.standardised, compile=args.compile)
        return
    table = cases()
    if args.rates:
        rates({name: table[name] for name in (args.cases.split(",") if args.cases else table)})
        return
    names = args.cases.split(",") if args.cases else list(table)
    print(f"{'case':24s} {'switch_after':>12s} {'seed':>4s} {'CPU ms':>8s} {'log-likelihood':>16s}")
    for name in names:
        for switch in SETTINGS:
            for seed in (0, 1):
                kw = dict(table[name], restarts=10, seed=seed, switch_after=switch, progress=False,
                          compile=args.compile)
                fit, times = cpu_timed_fits(kw, 3)
                print(f"{name:24s} {switch!s:>12s} {seed:4d} {1e3 * min(times):8.0f} {float(fit.loglik):16.4f}",
                      flush=True)
        if args.standardised and table[name].get("family", "gaussian") == "gaussian":
            case, shift = standardised(table[name])
            for seed in (0, 1):
                fit, times = cpu_timed_fits(dict(case, restarts=10, seed=seed, progress=False), 3)
                print(f"{name:24s} {'30, std. y':>12s} {seed:4d} {1e3 * min(times):8.0f} "
                      f"{float(fit.loglik) - shift:16.4f}", flush=True)


if __name__ == "__main__":
    main()
