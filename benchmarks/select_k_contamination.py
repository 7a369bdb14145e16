"""How often AIC, BIC, ICL and DSC choose each number of experts when the data are epsilon-contaminated.

Truth (the setting of "experiment 5" in the public code of Do Tien Hai et al. 2025, arXiv:2510.12744,
``maitrungnguyen/Dendrogram_SGMoE``): K* = 2 softmax-gated Gaussian linear experts in d = 1, X ~ U[0, 1],
gate logits (-8 + 25 x, 0), experts 15 - 20 x (sd 0.3) and -5 + 20 x (sd 0.4).  Clean responses come from
``moestat.simulate(..., model="mixture")``.  Contamination (our design; that code has no contamination
experiment): each response is replaced with probability epsilon by a draw from N(0, 10^2), which covers and
exceeds the clean range (about -5 to 9); the outliers are coupled across epsilon (common random numbers).
Every data set is fitted once per k in 1..4 (``select_k``, 5 restarts, CPU) and every criterion of
``moestat.selection_study.CRITERIA`` is read from those fits; DSC merges the k = 4 fit.

Frequencies carry the binomial Monte Carlo SE sqrt(p (1 - p) / R).

Run:
    python benchmarks/select_k_contamination.py --quick   # n = 500, 2000; R = 10; about 3 min on 2 cores
    python benchmarks/select_k_contamination.py           # n = 500, 2000, 8000; R = 100; a few hours on 1 core
Options --reps and --ns override the size.  The data of (n, replicate r) depend only on the seed, n and r, so
separate processes (e.g. one per n, ``--ns 8000``) reproduce the corresponding rows of a single run, and a run
with R = 40 contains the R = 10 run.  Writes benchmarks/results/select_k_contamination_<size>.csv (one row per
data set and criterion), ..._<size>_freq.csv (frequencies with MCSE) and ..._<size>_provenance.json
(``_n<ns>_R<reps>`` instead of ``_<size>`` when --ns or --reps is given).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import moestat as ms
from moestat.provenance import provenance as provenance_record
from moestat.provenance import write_json_atomic
from moestat.selection_study import contamination_study, frequency_table, selection_frequencies

SPEC = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
TRUTH = ms.Params([-8.0, 0.0], [[25.0], [0.0]], [[-20.0], [20.0]], [15.0, -5.0], noise_sd=[0.3, 0.4])
SIZES = {"quick": {"ns": [500, 2000], "reps": 10}, "full": {"ns": [500, 2000, 8000], "reps": 100}}
SETTINGS = {"epsilons": [0.0, 0.01, 0.05, 0.1], "ks": [1, 2, 3, 4], "seed": 20251014, "restarts": 5,
            "distribution": "normal", "loc": 0.0, "scale": 10.0, "simulate_kwargs": {"low": 0.0, "high": 1.0},
            "fit_kwargs": {"device": "cpu"}}
OUT = Path(__file__).resolve().parent / "results"


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the small size (n = 500, 2000; R = 10)")
    p.add_argument("--reps", type=int, default=None, help="replicates per (n, epsilon); overrides the size")
    p.add_argument("--ns", type=int, nargs="+", default=None, help="sample sizes; override the size")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--out", type=Path, default=OUT, help="folder of the CSV and provenance files")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse(sys.argv[1:] if argv is None else argv)
    size = "quick" if args.quick else "full"
    ns = args.ns or SIZES[size]["ns"]
    reps = args.reps or SIZES[size]["reps"]
    torch.set_num_threads(args.threads)
    config = {"size": size, "ns": ns, "reps": reps, "truth": {"spec": repr(SPEC), "gate_bias": [-8.0, 0.0],
              "gate_weight": [[25.0], [0.0]], "expert_weight": [[-20.0], [20.0]], "expert_bias": [15.0, -5.0],
              "noise_sd": [0.3, 0.4]}, **SETTINGS}
    start = time.perf_counter()
    total = len(ns) * reps * len(SETTINGS["epsilons"])
    done = [0]

    def tick(info: dict) -> None:
        done[0] += 1
        if done[0] % 10 == 0 or done[0] == total:
            print(f"  {done[0]}/{total} data sets ({time.perf_counter() - start:.0f} s)", flush=True)

    choices = contamination_study(SPEC, TRUTH, ns=ns, reps=reps, on_replicate=tick, **SETTINGS)
    wall = time.perf_counter() - start
    freq = selection_frequencies(choices, by=["n", "epsilon", "criterion"], ks=SETTINGS["ks"])
    stem = f"select_k_contamination_{size}" if args.ns is None and args.reps is None else \
        f"select_k_contamination_n{'-'.join(map(str, ns))}_R{reps}"
    args.out.mkdir(parents=True, exist_ok=True)
    choices.to_csv(args.out / f"{stem}.csv", index=False)
    freq.to_csv(args.out / f"{stem}_freq.csv", index=False)
    write_json_atomic(args.out / f"{stem}_provenance.json",
                      provenance_record({**config, "wall_seconds": round(wall, 1)}, device="cpu"))
    print(f"\nSelection frequency of each k, with binomial MCSE sqrt(p(1-p)/R) in brackets; K* = 2; "
          f"{wall:.0f} s wall.")
    print(frequency_table(freq).to_string())
    print(f"\nwrote {args.out / stem}.csv, {stem}_freq.csv, {stem}_provenance.json")


if __name__ == "__main__":
    main()
