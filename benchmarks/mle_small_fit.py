"""Benchmark: CPU time of one small formula fit (flexmix's ``NPreg``, 200 rows, 10 restarts) — the fixed costs.

Times ``fit_mle(formula=..., data=NPreg, k=2, restarts=10)`` for the three cases of ``mle_vs_flexmix_glm.py``
(same data, gate covariate ``z`` and stopping rule) and prints one JSON line: case -> [median CPU ms over ``--repeat``
fits after a warm-up, log-likelihood].  To compare two versions of moestat, run it alternately with each tree first on
``PYTHONPATH`` (the printed log-likelihoods must agree):

    git worktree add /tmp/old <rev>
    for i in 1 2; do
        PYTHONPATH=/tmp/old python benchmarks/mle_small_fit.py; PYTHONPATH=. python benchmarks/mle_small_fit.py
    done

``--compile`` also times each case with ``fit_mle(compile=True)`` (the fused C++ EM loop where it applies),
alternating fit by fit with the default in the same process; ``--k`` sets the number of experts.  ``--phases`` also
reports where each fit's time goes: the median CPU ms per fit in building the design (formula
parsing and model matrices), the random starts, EM, the L-BFGS phase, the fit-time degeneracy check and the rest
(argument checks, layout, result assembly), timed by wrapping those internal functions.

Needs ``Rscript`` with flexmix (for the data only).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import moestat as ms
import moestat.fit.formula_fit as formula_fit
import moestat.fit.mle as mle
from moestat.fit.results import MLEFit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mle_vs_flexmix_glm import CASES, R_DATA, write_data  # the same data and cases

#: (owner, attribute, phase) of the functions ``--phases`` times.
PHASES = [(formula_fit, "build_design", "design"), (mle._Problems, "starts", "starts"), (mle, "em_fit", "em"),
          (mle, "gradient_fit", "lbfgs"), (MLEFit, "_warn_degenerate", "degeneracy")]


def time_phases(spent: dict[str, float]) -> None:
    """Wrap the functions of :data:`PHASES` so that each call adds its CPU seconds to ``spent[phase]``."""
    for owner, name, phase in PHASES:
        inner = getattr(owner, name)

        def timed(*args, _inner=inner, _phase=phase, **kwargs):
            t0 = time.process_time()
            try:
                return _inner(*args, **kwargs)
            finally:
                spent[_phase] += time.process_time() - t0

        setattr(owner, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--phases", action="store_true", help="also report the median CPU ms of each phase")
    parser.add_argument("--compile", action="store_true",
                        help="also time each case with fit_mle(compile=True) (entries '<case>:compile'), alternating "
                             "with the default fit in the same process")
    parser.add_argument("--k", type=int, default=2, help="number of experts")
    args = parser.parse_args()
    spent: dict[str, float] = collections.defaultdict(float)
    if args.phases:
        time_phases(spent)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        script, csv = Path(tmp) / "data.R", Path(tmp) / "npreg.csv"
        script.write_text(R_DATA)
        write_data(csv, 0, script)
        df = pd.read_csv(csv)
    out = {}
    for name, formula, _, family, gate_formula, _, ml_sigma in CASES:
        if ml_sigma:  # the same moestat fit as the case before it
            continue
        kwargs = dict(formula=formula, data=df, k=args.k, family=family, gate_formula=gate_formula, tol=1e-8,
                      max_iter=2000, restarts=args.restarts, seed=1)
        variants = {name: {}, f"{name}:compile": {"compile": True}} if args.compile else {name: {}}
        times: dict[str, list[float]] = {v: [] for v in variants}
        phases: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        fits = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ms.MLEConvergenceWarning)
            warnings.simplefilter("ignore", ms.DegenerateFitWarning)
            for extra in variants.values():
                ms.fit_mle(**kwargs, **extra)  # warm-up (and the C++ build on first use)
            for _ in range(args.repeat):
                for v, extra in variants.items():
                    spent.clear()
                    t0 = time.process_time()
                    fits[v] = ms.fit_mle(**kwargs, **extra)
                    times[v].append(time.process_time() - t0)
                    phases[v].append(dict(spent, rest=times[v][-1] - sum(spent.values())))
        for v in variants:
            out[v] = [round(1e3 * float(np.median(times[v])), 2), float(fits[v].loglik)]
            if args.phases:
                out[v].append({p: round(1e3 * float(np.median([ph.get(p, 0.0) for ph in phases[v]])), 2)
                               for _, _, p in [*PHASES, (None, None, "rest")]})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
