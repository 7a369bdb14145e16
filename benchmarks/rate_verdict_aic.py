"""How often each curvature signal fires on clean power laws and on ``1/log n`` profiles.

Design: 10 truth units x 5 n values over two decades (1600 to 160000), one replicate per unit and n,
``sigma=0.3``, unit intercept sd 0.5, unit exponent sd 0.05, cell shock sd 0.1, unit bootstrap (300 draws).
The rule that enters ``fit_rate``'s verdict must fire near its nominal level on the clean power law; the
printed rates show why ``delta_aic > 2`` was dropped from it.

Run: ``python benchmarks/rate_verdict_aic.py [studies]`` (default 120 studies per profile, ~10 s).
"""
from __future__ import annotations

import sys
import warnings

import numpy as np

import moestat as ms
from moestat import rates


def main(studies: int = 120) -> None:
    ns = np.geomspace(1600, 160000, 5).round()
    warnings.simplefilter("ignore", ms.RateWarning)
    for label, model, alpha in [("power n^-0.5", "power", 0.5), ("1/log n", "inverse_log", 1.0)]:
        rows = []
        for s in range(studies):
            df = rates.simulate_rate_frame(alpha, ns, 1, model=model, sigma=0.3, seed=s, units=10, unit_sd=0.5,
                                           unit_slope_sd=0.05, cell_sd=0.1)
            t = ms.fit_rate(df, "y", units="unit", n_resamples=300, seed=s).table.iloc[0]
            rows.append((t["delta_aic"], t["curvature_p"], bool(t["window_consistent"])))
        d, p, w = (np.array(c) for c in zip(*rows, strict=True))
        print(f"{label:14s} delta_aic>2 {np.mean(d > 2):.3f}  delta_aic>6 {np.mean(d > 6):.3f}  "
              f"curvature_p<0.05 {np.mean(p < 0.05):.3f}  windows inconsistent {np.mean(~w):.3f}  "
              f"verdict curved {np.mean((p < 0.05) | ~w):.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 120)
