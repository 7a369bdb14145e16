"""Does the weight-split basin of a sigmoid-gated gelu truth have a limit of its own?  A convergence check of
:func:`moestat.estimate_gbar` on the ten sigmoid/gelu truths of the sigmoid-vs-softmax vignette (d = 3, k* = 3,
k = 4 fitted atoms).

For each truth, from the same starts (one weight split of each true atom, estimate_gbar's seed 0, 20,000
noise-free Monte-Carlo inputs):

* ``lbfgs``: estimate_gbar as ``design_check`` runs it (L-BFGS, at most 3,000 iterations, no box);
* ``newton``: the same starts, trust-region Newton with the exact Hessian, run to its gradient tolerance (it
  stops only at a point whose Hessian has no negative eigenvalue);
* ``newton from lbfgs``: Newton started at the L-BFGS end points.

Columns: the smallest and largest held-out L2 distance to f*, the starts that converged, and, for the fit of
smallest distance, the smallest largest contribution of one atom, max_x |sigma(gate_i(x)) phi(expert_i(x))| over
the held-out inputs (about 0 for a dead atom: a zero expert or a gate switched off).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/gbar_convergence.py [--seeds 10] [--gate-var 1] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pandas as pd

import moestat as ms
from moestat.simulators.regression import draw_inputs


def smallest_atom_contribution(spec: ms.MoE, params: ms.Params, X: np.ndarray) -> float:
    """min over atoms of max over X of |one atom's term| (a sigmoid gate's terms are separable)."""
    one = spec.with_k(1)
    terms = []
    for i in range(params.k):
        atom = ms.Params(np.asarray(params.gate_bias)[i:i + 1], np.asarray(params.gate_weight)[i:i + 1],
                         np.asarray(params.expert_weight)[i:i + 1], np.asarray(params.expert_bias)[i:i + 1])
        terms.append(float(np.max(np.abs(np.asarray(one.mean(atom, X))))))
    return min(terms)


def summary_row(params: ms.Params, converged: np.ndarray, wall: float, truth, X_test: np.ndarray) -> dict:
    """Distances of the fits ``params`` (batched, k* + 1 atoms) to the truth on ``X_test``, their convergence, and
    the smallest atom contribution of the closest fit."""
    fit_spec = truth.spec.with_k(truth.spec.k + 1)
    l2 = np.atleast_1d(ms.l2_distance(fit_spec, params, truth.params, X_test, spec_b=truth.spec))
    best = params.select(int(np.argmin(l2)))
    return {"min_l2": l2.min(), "max_l2": l2.max(), "converged": f"{int(np.sum(converged))}/{len(l2)}",
            "smallest_atom_contribution": smallest_atom_contribution(fit_spec, best, X_test), "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--gate-var", type=float, default=1.0,
                    help="the truths' gate variance nu_g (gelu-clean-test: 0.01/d .. 3/d, d = 3)")
    ap.add_argument("--out", default=None, help="write the table to this CSV file")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    X_test = draw_inputs(np.random.default_rng(12345), 20_000, 3, "uniform", -1.0, 1.0)
    rows = []
    for seed in range(args.seeds):
        truth = ms.presets.gate_comparison("gelu", truth_gate="sigmoid", d=3, seed=seed, gate_var=args.gate_var)
        spec, k = truth.spec, truth.spec.k + 1
        fit_spec = spec.with_k(k)

        for optimizer in ("lbfgs", "newton"):
            t0 = time.perf_counter()
            gb = ms.estimate_gbar(spec, truth.params, k, n_mc=20_000, restarts=spec.k, seed=0, optimizer=optimizer,
                                  device="cpu")
            rows.append({"gate_var": args.gate_var, "seed": seed, "optimizer": optimizer,
                         **summary_row(gb.params, gb.converged, time.perf_counter() - t0, truth, X_test)})
            print(rows[-1], flush=True)
            if optimizer == "lbfgs":
                lbfgs_ends = gb.params
        # Newton from the L-BFGS end points, on estimate_gbar's own fitting sample (same seed, same draw)
        ss_fit = ms.simulators.regression.replicate_seeds(0, 3)[0]
        X = draw_inputs(np.random.default_rng(ss_fit), 20_000, spec.d, "uniform", -1.0, 1.0)
        y = np.asarray(spec.mean(truth.params, X))
        t0 = time.perf_counter()
        fits = [ms.fit_lse(fit_spec, X, y, init=lbfgs_ends.select(s), optimizer="newton", max_iter=1000,
                           condition=False, device="cpu") for s in range(lbfgs_ends.n_reps)]
        stacked = ms.Params.stack([f.params.select(0) for f in fits])
        rows.append({"gate_var": args.gate_var, "seed": seed, "optimizer": "newton from lbfgs",
                     **summary_row(stacked, np.array([f.converged[0] for f in fits]),
                                   time.perf_counter() - t0, truth, X_test)})
        print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.out:
        frame.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
