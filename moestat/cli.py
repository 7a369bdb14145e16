"""The ``moestat`` command line.

``moestat --version``; ``moestat simulate`` draws data from a paper preset and prints a tidy
frame.  Further sub-commands (studies, rates, vignettes) register themselves in
:func:`build_parser`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .simulators import presets, simulate

    truth = presets.sigmoid_vs_softmax(regime=args.regime, expert=args.expert,
                                       truth_gate=args.gate, seed=args.truth_seed)
    spec, params = truth
    data = simulate(spec, params, n=args.n, reps=args.reps, seed=args.seed)
    frame = data.to_frame()
    keep = ["rep", "obs", "x0", "x1", "y"]
    summary = frame.groupby("rep")["y"].agg(["count", "mean", "std"]).reset_index()
    print(f"truth: {truth.info['source']}, gate={spec.gate}, expert={spec.expert}, k*={spec.k}, "
          f"d={spec.d}, noise sd={spec.noise_sd:g}; regime {truth.info['regime']}, "
          f"zero-slope atoms {truth.info['zero_slope_atoms']}")
    print("\ntrue parameters (tidy, first rows):")
    print(params.to_frame().head(8).to_string(index=False))
    print(f"\nsimulated data: {data.n_reps} replicates x n={data.n} (first rows):")
    print(frame[keep].head(8).to_string(index=False))
    print("\nper-replicate summary of y:")
    print(summary.to_string(index=False))
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / "data.csv", index=False)
        params.to_frame().to_csv(out / "truth.csv", index=False)
        print(f"\nwrote {out / 'data.csv'} and {out / 'truth.csv'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="moestat",
        description="Mixtures of experts as statistical models: simulate, fit, score, estimate rates.",
    )
    parser.add_argument("--version", action="version", version=f"moestat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sim = sub.add_parser("simulate", help="simulate data from a nguyen2024 preset and print a tidy frame",
                         description="Simulate replicate data sets from the sigmoid-vs-softmax preset.")
    sim.add_argument("--regime", type=int, choices=(1, 2), default=2, help="preset regime (default 2)")
    sim.add_argument("--expert", default="relu", help="expert family of the truth (default relu)")
    sim.add_argument("--gate", choices=("sigmoid", "softmax"), default="sigmoid",
                     help="gate of the truth (default sigmoid)")
    sim.add_argument("--n", type=int, default=1000, help="sample size per replicate (default 1000)")
    sim.add_argument("--reps", type=int, default=3, help="number of replicates (default 3)")
    sim.add_argument("--seed", type=int, default=1, help="data seed (default 1)")
    sim.add_argument("--truth-seed", type=int, default=0, help="seed of the parameter draw (default 0)")
    sim.add_argument("--out", default=None, help="folder to write data.csv and truth.csv into")
    sim.set_defaults(func=_cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``moestat`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    pd.set_option("display.width", 120)
    np.set_printoptions(precision=4)
    try:
        return int(args.func(args))
    except (ValueError, TypeError) as exc:
        print(f"moestat: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
