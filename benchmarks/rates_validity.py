"""Full-size validity check of moestat.rates (recorded in docs/rates.md) and the bootstrap speed ratio.

    PYTHONPATH=. python benchmarks/rates_validity.py [--studies 1000] [--out DIR]
    PYTHONPATH=. python benchmarks/rates_validity.py --scenarios [--scenario-studies 2000]

Prints markdown tables: bias / coverage of the exponent CI over simulated studies with a known exponent
(the designs of tests/rates/test_rates_validity.py with the default method and with the replicate bootstrap,
plus the alternative intervals and aggregations), size, power and verdicts of compare_rates, and the time
of the vectorised bootstrap against a statsmodels refit per draw measured in the same run.
``--scenarios`` prints coverage under the replicate structures of tests/rates/test_rate_verdicts.py (iid
replicates, a shock shared by each n cell, replicates nested across n, independent units with their own
exponents) for the default method and the alternatives, including the modified (truncated) Knapp-Hartung
factor.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels.api as sm

import moestat as ms
from moestat import rates

G5 = np.geomspace(1e3, 1e5, 5).round()
G9 = np.geomspace(1e3, 1e5, 9).round()
LOW5 = np.geomspace(1e2, 1e4, 5).round()
WIDE7 = np.geomspace(1e2, 1e6, 7).round()
# the designs asserted by tests/rates/test_rates_validity.py::test_coverage_full (default method: random effects),
# the same designs with the replicate bootstrap (the default before random effects), then extra rows for the docs
BOOT = {"method": "cluster_bootstrap"}
DESIGNS = [
    (0.5, "power", G5, 5, {}),
    (0.25, "power", G9, 20, {}),
    (1.0, "power", LOW5, 3, {}),
    (0.5, "power_log", G9, 10, {}),
    (1.0, "inverse_log", WIDE7, 10, {}),
    (0.5, "power", G9, 20, {"method": "robust"}),
    (0.5, "power", G9, 10, {"noise": "gamma", "shape": 1.0}),
    (0.5, "power", G9, 10, {"sigma": np.linspace(1.0, 0.25, 9)}),
    (0.5, "power", G5, 5, BOOT),
    (0.25, "power", G9, 20, BOOT),
    (1.0, "power", LOW5, 3, BOOT),
    (0.5, "power_log", G9, 10, BOOT),
    (1.0, "inverse_log", WIDE7, 10, BOOT),
    (0.5, "power", G5, 5, {"interval": "percentile"}),
    (1.0, "power", LOW5, 3, {"interval": "percentile"}),
    (0.5, "power", G5, 5, {"method": "robust"}),
    (0.5, "power", G9, 10, {"agg": "mean"}),
    (0.5, "power", G9, 10, {"agg": "median"}),
    (0.5, "power", G9, 10, {"agg": "logmean"}),
    (0.5, "power", G5, 5, {"noise": "gamma", "shape": 1.0}),
    (0.5, "power", G9, 10, {"noise": "gamma", "shape": 1.0, **BOOT}),
    (0.5, "power", G9, 10, {"sigma": np.linspace(1.0, 0.25, 9), **BOOT}),
    (0.5, "power", G9, 10, {"noise": "gamma", "shape": 1.0, "agg": "mean"}),
    (0.5, "power", G5, 5, {"estimator": "huber"}),
    (0.5, "power", G9, 10, {"estimator": "huber"}),
    (0.5, "power", G9, 10, {"estimator": "huber", "method": "robust"}),
]


def coverage_table(studies: int, only: list[int] | None = None) -> pd.DataFrame:
    out = []
    for i, (alpha, model, ns, reps, kw) in enumerate(DESIGNS):
        if only is not None and i not in only:
            continue
        t0 = time.perf_counter()
        row = ms.calibrate_design(alpha, ns, reps, model=model, studies=studies, n_resamples=999, seed=2024, **kw)
        row["seconds"] = time.perf_counter() - t0
        row["estimator"] = kw.get("estimator", "ols")
        out.append(row)
    return pd.concat(out, ignore_index=True)


def compare_table(studies: int) -> pd.DataFrame:
    """Rejection rate at 5% and the verdict shares of compare_rates: the default (random effects), the interaction
    model and the replicate bootstrap."""
    rows = []
    for label, (aa, ab), ns, reps, seed in [("size", (0.5, 0.5), G9, 10, 21), ("power", (0.5, 0.25), G9, 10, 23),
                                            ("size", (0.5, 0.5), G5, 5, 25), ("power", (0.5, 0.25), G5, 5, 27)]:
        a = rates.simulate_rate_frame(aa, ns, reps, studies=studies, seed=seed).assign(gate="sigmoid")
        b = rates.simulate_rate_frame(ab, ns, reps, studies=studies, seed=seed + 1).assign(gate="softmax")
        frame = pd.concat([a, b], ignore_index=True)
        res = pd.concat([ms.compare_rates(frame, "y", between="gate", by="study", n_resamples=999, method=m)
                         for m in ("auto", "both")], ignore_index=True)
        for method, sub in res.groupby("method", sort=False):
            rate = float((sub["p_value"] < 0.05).mean())
            rows.append({"check": label, "alpha_a": aa, "alpha_b": ab, "n_values": len(ns), "reps": reps,
                         "method": method, "studies": studies, "rejection_rate": rate,
                         "mcse": float(np.sqrt(rate * (1 - rate) / studies)),
                         "faster_share": float(sub["verdict"].str.endswith("faster").mean()),
                         "curved_share": float(sub["verdict"].str.endswith("curved").mean())})
    return pd.DataFrame(rows)


# replicate structures of tests/rates/test_rate_verdicts.py (true exponent 0.5): (label, ns, reps, simulation options)
SCENARIOS = [
    ("iid", G5, 5, {}),
    ("iid", G9, 10, {}),
    ("shock (cell_sd 0.2)", G9, 10, {"cell_sd": 0.2}),
    ("nested (rep_sd 0.5)", G9, 10, {"rep_sd": 0.5}),
    ("units (10 x 2 reps, unit_slope_sd 0.1, cell_sd 0.1)", G9, 2, {"units": 10, "unit_slope_sd": 0.1,
                                                                     "cell_sd": 0.1}),
]
# (label, fit options, units-scenario only): the default and the alternatives; resample_units=False fits a
# units frame ignoring its unit column (robust keeps it and clusters on the units)
SCENARIO_FITS = [
    ("default (auto)", {}, False),
    ("random_effects, modified KH", {"method": "random_effects", "knapp_hartung": "modified",
                                     "resample_units": False}, False),
    ("cluster_bootstrap (within_n)", {"method": "cluster_bootstrap", "resample_units": False}, False),
    ("robust", {"method": "robust"}, False),
    ("random_effects ignoring units", {"method": "random_effects", "resample_units": False}, True),
]


def scenario_table(studies: int) -> pd.DataFrame:
    """Coverage, widths and verdict shares of each method under each replicate structure (seeds fixed)."""
    rows = []
    for label, ns, reps, sim in SCENARIOS:
        for fit_label, fit, units_only in SCENARIO_FITS:
            if units_only and "units" not in sim:
                continue
            if "units" not in sim:
                fit = {k: v for k, v in fit.items() if k != "resample_units"}
            t0 = time.perf_counter()
            row = ms.calibrate_design(0.5, ns, reps, studies=studies, n_resamples=999, seed=2025, **sim, **fit)
            row.insert(0, "scenario", label)
            row.insert(1, "fit", fit_label)
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
    return pd.concat(rows, ignore_index=True)


def speed(n_resamples: int = 999, repeats: int = 5) -> pd.DataFrame:
    """Vectorised bootstrap of fit_rate against a statsmodels OLS refit per bootstrap draw (same resampling).

    Each timing is the minimum over ``repeats`` runs (the machine is shared; the minimum is the least
    disturbed run)."""
    frame = rates.simulate_rate_frame(0.5, G9, 20, seed=1)
    groups = [g["y"].to_numpy() for _, g in frame.groupby("n")]
    exog = sm.add_constant(np.log(np.repeat(G9, 20)))

    def vectorised() -> None:
        ms.fit_rate(frame, "y", method="cluster_bootstrap", n_resamples=n_resamples, seed=0)

    def loop() -> None:
        rng = np.random.default_rng(0)
        for _ in range(n_resamples):
            ydraw = np.concatenate([v[rng.integers(0, len(v), len(v))] for v in groups])
            sm.OLS(np.log(ydraw), exog).fit()

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    fast, slow = best(vectorised), best(loop)
    return pd.DataFrame([{"n_resamples": n_resamples, "rows": len(frame), "repeats": repeats, "vectorised_s": fast,
                          "statsmodels_loop_s": slow, "speedup": slow / fast}])


def sample_complexity_check(studies: int = 150) -> pd.DataFrame:
    """Coverage of the n* intervals and of the scaling-exponent interval (n* proportional to l^1.5)."""
    import warnings

    from moestat.rates.complexity import _crossing

    ns = np.geomspace(25, 25 * 2 ** 12, 13)
    ls = np.array([2, 4, 8, 16])

    def curve(n, l):
        return 1 - 0.5 * np.exp(-n / (8.0 * l ** 1.5))

    truth = {l: float(np.exp(_crossing((curve(ns, l) - 0.9)[None, :], np.log(ns))[0][0])) for l in ls}
    true_slope = float(np.polyfit(np.log(ls), np.log([truth[l] for l in ls]), 1)[0])
    rows = []
    for reps, noise in [(5, 0.05), (10, 0.02)]:
        rng = np.random.default_rng(2)
        big_l = np.repeat(ls, len(ns) * reps)
        big_n = np.tile(np.repeat(ns, reps), len(ls))
        rep = np.tile(np.arange(reps), len(ls) * len(ns))
        frame = pd.concat([pd.DataFrame({"study": s, "l": big_l, "n": big_n, "rep": rep,
                                         "acc": curve(big_n, big_l) + noise * rng.standard_normal(big_n.size)})
                           for s in range(studies)], ignore_index=True)
        sc = ms.sample_complexity(frame, "acc", 0.9, by=["study", "l"], n_resamples=999)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = sc.scaling("l")
        tab = sc.table.assign(truth=lambda t: t["l"].map(truth))
        point_cov = ((tab["ci_low"] <= tab["truth"]) & (tab["truth"] <= tab["ci_high"])).groupby(tab["l"]).mean()
        rows.append({"reps": reps, "noise_sd": noise, "studies": studies, "true_slope": true_slope,
                     "mean_slope": fit["exponent"].mean(), "emp_se": fit["exponent"].std(),
                     "mean_se": fit["se"].mean(),
                     "slope_coverage": float(((fit["ci_low"] <= true_slope) & (true_slope <= fit["ci_high"])).mean()),
                     "n_star_coverage_by_l": "/".join(f"{v:.3f}" for v in point_cov)})
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame) -> str:
    """A pipe table (no tabulate dependency)."""
    def fmt(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", type=int, default=1000)
    ap.add_argument("--out", default=None, help="folder for CSV copies of the tables")
    ap.add_argument("--speed-only", action="store_true", help="only the bootstrap timing")
    ap.add_argument("--sample-complexity", action="store_true", help="only the n* / scaling coverage check")
    ap.add_argument("--only", default=None, help="comma-separated indices of DESIGNS to run (coverage only)")
    ap.add_argument("--scenarios", action="store_true", help="only the replicate-structure scenarios table")
    ap.add_argument("--scenario-studies", type=int, default=2000, help="studies per scenario row (default 2000)")
    args = ap.parse_args()
    if args.scenarios:
        sc = scenario_table(args.scenario_studies)
        cols = ["scenario", "fit", "n_values", "reps", "method", "studies", "bias", "bias_mcse", "emp_se", "mean_se",
                "coverage", "coverage_mcse", "mean_width", "power_law_share", "curved_share", "seconds"]
        print(markdown(sc[cols]), flush=True)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            sc.to_csv(Path(args.out) / "scenarios.csv", index=False)
        return
    if args.speed_only:
        print(markdown(speed()))
        return
    if args.sample_complexity:
        print(markdown(sample_complexity_check()))
        return
    only = [int(i) for i in args.only.split(",")] if args.only else None
    cov = coverage_table(args.studies, only)
    cols = ["alpha", "model", "n_values", "n_min", "n_max", "reps", "noise", "sigma", "estimator", "method", "agg",
            "interval",
            "studies", "bias",
            "bias_mcse", "emp_se", "mean_se", "coverage", "coverage_mcse", "seconds"]
    print(markdown(cov[cols]), flush=True)
    if only is not None:
        return
    cmp_ = compare_table(args.studies)
    print()
    print(markdown(cmp_), flush=True)
    sp = speed()
    print()
    print(markdown(sp))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        cov.to_csv(out / "coverage.csv", index=False)
        cmp_.to_csv(out / "compare_rates.csv", index=False)
        sp.to_csv(out / "speed.csv", index=False)


if __name__ == "__main__":
    main()
