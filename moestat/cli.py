"""The ``moestat`` command line.

* ``moestat simulate`` — draw data from a paper preset and print a tidy frame;
* ``moestat study run STUDY.toml --out DIR [--resume] [--workers N] [--device auto|cpu|cuda]``,
  ``moestat study check STUDY.toml``, ``moestat study performance DIR`` (performance measures with Monte Carlo
  SEs) and ``moestat study report DIR`` (``DIR/report.md``: ADEMP, failures, performance, rates, figures);
* ``moestat rates DIR --y D1 --by gate,expert`` — the rate table (printed, CSV and PNG);
* ``moestat vignette list`` and ``moestat vignette run NAME [--quick | --size SIZE] [--out DIR] [--workers N]``.

Exit codes: 0 success; 2 a usage or input error (message on stderr, prefixed ``moestat: error:``);
3 a study stopped by failed fits (``max_failures``; finished cells are kept); 130 interrupted (finished work is
kept); 1 an unexpected failure (traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .papers import presets
    from .simulators import simulate

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


# --------------------------------------------------------------------------- study

def _cmd_study_run(args: argparse.Namespace) -> int:
    from ._placement import executor_for, parse_workers
    from .study import Study

    try:
        workers = parse_workers(args.workers)
    except ValueError as exc:
        raise _UsageError(f"--{exc}") from None
    study = Study.from_toml(args.study)
    out = Path(args.out) if args.out else Path("out") / Path(args.study).stem
    if out.exists() and not out.is_dir():
        raise _UsageError(f"--out {out} is a file; give a folder for the study's cells and results.")
    existing = out / "cells"
    if existing.is_dir() and any(existing.glob("*.parquet")) and not (args.resume or args.overwrite):
        raise _UsageError(f"{out} already holds results of a study; pass --resume to continue it or "
                          "--overwrite to recompute every cell.")
    executor = executor_for(workers)
    print(f"{study!r}\nwriting to {out}", flush=True)
    from .study import StudyFailureError

    try:
        frame = study.run(out, resume=not args.overwrite, executor=executor, workers=workers,
                          progress=not args.quiet, device=args.device)
    except KeyboardInterrupt:  # Study.run has stopped its workers and recorded the interruption
        print(f"\n{_interrupted(args, out)}", file=sys.stderr)
        return 130
    except StudyFailureError as exc:
        print(f"moestat: error: {exc}", file=sys.stderr)
        return 3
    _print_summary(frame)
    print(f"\nwrote {len(frame)} rows: {out / 'results.parquet'}, {out / 'results.csv'}, "
          f"{out / 'provenance.json'}")
    return 0


def _interrupted(args: argparse.Namespace, out: Path) -> str:
    """What an interrupted ``study run`` kept (from ``provenance.json``) and the command that continues it."""
    finished = ""
    with contextlib.suppress(OSError, ValueError, KeyError, AttributeError):
        prov = json.loads((out / "provenance.json").read_text())["config"]
        if prov["status"] == "interrupted":
            finished = f"{prov['cells_finished']} of {prov['n_cells']} cells finished; "
    again = ["moestat", "study", "run", str(args.study), "--out", str(out), "--resume"]
    again += ["--workers", str(args.workers)] if args.workers else []
    again += ["--device", args.device] if args.device else []
    return (f"moestat: interrupted: {finished}the finished cells are saved in {out} (cells that were running "
            f"stopped and will be recomputed). Continue with: {shlex.join(again)}")


def _print_summary(frame: pd.DataFrame) -> None:
    skip = {"rep", "seed", "k", "n", "wall_time", "fit_wall_time", "objective", "converged"}
    numeric = [c for c in frame.select_dtypes("number").columns
               if c not in skip and not c.startswith(("truth_", "est:", "se:", "true:")) and frame[c].nunique() > 1]
    keys = [c for c in ("truth", "fit", "n") if c in frame.columns]
    cols = [c for c in ("objective", *numeric) if c in frame.columns][:6]
    agg = frame.groupby(keys, sort=False)[cols].mean()
    if "converged" in frame.columns:
        agg["converged"] = frame.groupby(keys, sort=False)["converged"].mean()
    if "status" in frame.columns:
        agg["failed"] = frame.groupby(keys, sort=False)["status"].agg(lambda s: int((s != "ok").sum()))
    if "device" in frame.columns and frame["device"].nunique() > 1:  # pools per device: where each cell ran
        agg["device"] = frame.groupby(keys, sort=False)["device"].first()
    print("\nmeans over replicates:")
    print(agg.to_string(float_format=lambda v: f"{v:.4g}"))


def _cmd_study_check(args: argparse.Namespace) -> int:
    from .study import Study

    study = Study.from_toml(args.study)
    print(repr(study))
    for c in study.cells:
        print(f"  {c['id']}")
    print(f"{len(study.cells)} cells x {study.reps} replicates; configuration is valid.")
    return 0


def _study_of(folder: Path):
    from .study import Study

    if not folder.is_dir():
        raise _UsageError(f"{folder} is not a folder; give the --out folder of `moestat study run`.")
    toml = folder / "study.toml"
    if not toml.is_file():
        raise _UsageError(f"{folder} has no study.toml; give the --out folder of `moestat study run`.")
    return Study.from_toml(toml)


def _cmd_study_performance(args: argparse.Namespace) -> int:
    from .study import load_results

    folder = Path(args.dir)
    study = _study_of(folder)
    frame = load_results(folder, partial=args.partial)
    metrics = [m for m in (args.metrics or "").split(",") if m] or None
    table = study.performance(frame, metrics, confidence_level=args.confidence_level,
                              converged_only=args.converged_only)
    with pd.option_context("display.max_rows", None, "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False))
    out = Path(args.out) if args.out else folder / "performance.csv"
    table.to_csv(out, index=False)
    print(f"\nwrote {out}")
    return 0


def _cmd_study_report(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    folder = Path(args.dir)
    study = _study_of(folder)
    path = study.report(folder, confidence_level=args.confidence_level, partial=args.partial)
    print(f"wrote {path} (figures in {folder / 'report'}, tables performance.csv and rates.csv)")
    return 0


# --------------------------------------------------------------------------- rates

def _cmd_rates(args: argparse.Namespace) -> int:
    from .study import load_results
    from .study_report import successful_rows

    try:
        from .rates import fit_rate
    except ImportError as exc:  # pragma: no cover - depends on the rates module being present
        raise _UsageError(f"moestat rates needs moestat.rates ({exc}).") from exc
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = successful_rows(load_results(args.results, partial=args.partial), what="moestat rates")
    by = [b for b in (args.by or "").split(",") if b]
    missing = [c for c in [args.y, args.x, *by, *([args.units] if args.units else [])] if c not in frame.columns]
    if missing:
        raise _UsageError(f"columns {missing} are not in the results (--y/--x/--by/--units); available: "
                          f"{sorted(frame.columns)}.")
    kwargs = {"y": args.y, "x": args.x, "by": by or None, "model": args.model,
              "confidence_level": args.confidence_level, "units": args.units}
    if args.method:
        kwargs["method"] = args.method
    if args.seed is not None:
        kwargs["seed"] = args.seed
    result = fit_rate(frame, **kwargs)
    table = result.table
    print(result.summary())
    base = Path(args.out) if args.out else (Path(args.results) if Path(args.results).is_dir()
                                            else Path(args.results).parent) / f"rates_{args.y}"
    base.parent.mkdir(parents=True, exist_ok=True)
    csv, windows = base.with_name(base.name + ".csv"), base.with_name(base.name + "_windows.csv")
    png = base.with_name(base.name + ".png")
    table.to_csv(csv, index=False)
    result.windows.to_csv(windows, index=False)
    ax = result.plot()
    fig = ax.figure if hasattr(ax, "figure") else plt.gcf()
    fig.savefig(png, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(f"\nwrote {csv}, {windows} and {png}")
    return 0


# ------------------------------------------------------------------------ vignettes

def _cmd_vignette_list(args: argparse.Namespace) -> int:
    from ._vignette_index import discover

    found = discover()
    if not found:
        print("no vignettes are installed.")
        return 0
    width = max(len(v.name) for v in found)
    for v in found:
        print(f"{v.name:<{width}}  {v.title}")
    return 0


def _cmd_vignette_run(args: argparse.Namespace) -> int:
    from ._vignette_index import find, load

    info = find(args.name)
    module = load(info)
    out = Path(args.out) if args.out else Path("out") / info.name
    kwargs = {}
    if args.size is not None:
        sizes = sorted(getattr(module, "SIZES", {}))
        if args.size not in sizes:
            raise _UsageError(f"--size {args.size!r} is not a size of vignette {info.name}; valid sizes are "
                              f"{sizes or 'none (it has only the default and --quick)'}.")
        if args.quick:
            raise _UsageError("--quick and --size are exclusive (--quick is the size 'quick'); pass one of them.")
        kwargs["size"] = args.size
    if args.workers is not None:
        from ._placement import parse_workers

        try:
            workers = parse_workers(args.workers)
        except ValueError as exc:
            raise _UsageError(f"--{exc}") from None
        if "workers" not in inspect.signature(module.run).parameters:
            raise _UsageError(f"vignette {info.name} runs in one process; drop --workers.")
        kwargs["workers"] = workers
    label = f" ({args.size})" if args.size else (" (quick)" if args.quick else "")
    print(f"running vignette {info.name}{label} -> {out}", flush=True)
    try:
        module.run(out, quick=args.quick, resume=not args.no_resume, **kwargs)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished pieces are saved in {out}; rerun the same command to continue.",
              file=sys.stderr)
        return 130
    files = sorted(p.name for p in out.iterdir() if p.is_file()) if out.is_dir() else []
    print(f"{info.name}: wrote {', '.join(files)} in {out}")
    return 0


class _UsageError(ValueError):
    """A mistake in the command line or its inputs (exit code 2)."""


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="moestat",
        description="Mixtures of experts as statistical models: simulate, fit, score, estimate rates.",
        epilog="Start with: moestat vignette run sigmoid-vs-softmax --quick --out out/sigmoid-vs-softmax",
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

    study = sub.add_parser("study", help="run a simulation study described in a TOML file",
                           description="Run or check a declarative simulation study (see docs/studies.md).")
    study_sub = study.add_subparsers(dest="study_command", metavar="SUBCOMMAND")
    run = study_sub.add_parser("run", help="run every cell of a study, checkpointing each as it finishes",
                               description="Run a study: one batched fit per (truth, fitted model, n) cell; "
                                           "each finished cell is saved in OUT/cells/ so --resume continues "
                                           "an interrupted run.")
    run.add_argument("study", metavar="STUDY.toml", help="study file")
    run.add_argument("--out", metavar="DIR", help="output folder (default out/<study file name>)")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue a run in DIR, skipping finished cells")
    mode.add_argument("--overwrite", action="store_true", help="recompute every cell even if DIR holds results")
    run.add_argument("--workers", default=None, metavar="N|DEVICE=N,...",
                     help="worker processes (default: run cells in this process), or one pool per device, e.g. "
                          "cuda=2,cpu=14: the first-named devices take the largest cells left, the last the smallest")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                     help="device for the fits (default: the study's, usually auto)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=_cmd_study_run)
    check = study_sub.add_parser("check", help="validate a study file and list its cells",
                                 description="Validate a study file and list its cells without running them.")
    check.add_argument("study", metavar="STUDY.toml", help="study file")
    check.set_defaults(func=_cmd_study_check)
    perf = study_sub.add_parser("performance", help="performance measures with Monte Carlo SEs of a finished study",
                                description="Per cell (truth x fit x n): bias, empirical SE, MSE, model SE, "
                                            "coverage ... of the parameters (estimators that record them, e.g. "
                                            "mle) and mean, empirical SE, RMSE, log mean, mean log of each "
                                            "metric, each with its Monte Carlo SE; printed and written as CSV.")
    perf.add_argument("dir", metavar="DIR", help="the study's output folder (--out of study run)")
    perf.add_argument("--metrics", default=None, metavar="COLS",
                      help="comma-separated metric columns (default: the study's metrics)")
    perf.add_argument("--confidence-level", type=float, default=0.95,
                      help="level of the coverage intervals (default 0.95)")
    perf.add_argument("--converged-only", action="store_true", help="use only rows with status ok")
    perf.add_argument("--partial", action="store_true", help="use the finished cells of an unfinished study")
    perf.add_argument("--out", metavar="CSV", default=None, help="CSV file to write (default DIR/performance.csv)")
    perf.set_defaults(func=_cmd_study_performance)
    report = study_sub.add_parser("report", help="write DIR/report.md: ADEMP, failures, performance, rates",
                                  description="Write DIR/report.md with the ADEMP sections (from the study's "
                                              "[ademp] table or derived from its configuration), failure counts, "
                                              "the performance table with Monte Carlo SEs, the rate table with "
                                              "verdicts and log-log figures (DIR/report/*.png).")
    report.add_argument("dir", metavar="DIR", help="the study's output folder (--out of study run)")
    report.add_argument("--confidence-level", type=float, default=0.95,
                        help="level of the coverage and exponent intervals (default 0.95)")
    report.add_argument("--partial", action="store_true", help="report the finished cells of an unfinished study")
    report.set_defaults(func=_cmd_study_report)
    study.set_defaults(func=None, _sub_parser=study)

    rates = sub.add_parser("rates", help="estimate convergence exponents from a study's results",
                           description="Fit y ~ n^-alpha per group of a study's results; print the rate table "
                                       "with its verdicts and diagnostics, and write it as CSV (plus the window "
                                       "table, PREFIX_windows.csv) with a log-log plot (PNG).")
    rates.add_argument("results", metavar="DIR", help="study output folder (or a results .parquet/.csv file)")
    rates.add_argument("--y", required=True, help="error column, e.g. D1")
    rates.add_argument("--x", default="n", help="sample-size column (default n)")
    rates.add_argument("--by", default="truth,fit", help="comma-separated grouping columns (default truth,fit)")
    rates.add_argument("--model", default="power", choices=("power", "power_log", "inverse_log"),
                       help="rate model (default power: log y = c - alpha log n)")
    rates.add_argument("--method", default=None,
                       choices=("auto", "random_effects", "unit_bootstrap", "cluster_bootstrap", "robust"),
                       help="interval method (default auto: unit_bootstrap with --units, else random_effects)")
    rates.add_argument("--units", metavar="COL", default=None,
                       help="column of independent units spanning the n grid (e.g. a truth-draw id); resampled "
                            "whole by the unit bootstrap")
    rates.add_argument("--confidence-level", "--ci", dest="confidence_level", type=float, default=0.95,
                       help="confidence level of the intervals (default 0.95; --ci is its former name)")
    rates.add_argument("--seed", type=int, default=None, help="bootstrap seed")
    rates.add_argument("--partial", action="store_true",
                       help="read the finished cells of an unfinished study (default: refuse it and say how to "
                            "finish it)")
    rates.add_argument("--out", metavar="PREFIX", default=None,
                       help="write PREFIX.csv, PREFIX_windows.csv and PREFIX.png (default DIR/rates_<y>)")
    rates.set_defaults(func=_cmd_rates)

    vig = sub.add_parser("vignette", help="list or run the vignettes that reproduce the papers",
                         description="List or run moestat's vignettes (installed with the package).")
    vig_sub = vig.add_subparsers(dest="vignette_command", metavar="SUBCOMMAND")
    vl = vig_sub.add_parser("list", help="list the installed vignettes", description="List the installed vignettes.")
    vl.set_defaults(func=_cmd_vignette_list)
    vr = vig_sub.add_parser("run", help="run a vignette", description="Run a vignette; it writes results.csv, "
                            "rates.csv, figures (PNG) and provenance.json into --out.")
    vr.add_argument("name", metavar="NAME", help="vignette name (see 'moestat vignette list')")
    vr.add_argument("--quick", action="store_true", help="reduced size (minutes on 2 CPU cores)")
    vr.add_argument("--size", metavar="SIZE", default=None,
                    help="a named size of the vignette (its SIZES, e.g. 'linear' for sigmoid-vs-softmax)")
    vr.add_argument("--out", metavar="DIR", default=None, help="output folder (default out/NAME)")
    vr.add_argument("--no-resume", action="store_true", help="recompute pieces already saved in DIR")
    vr.add_argument("--workers", metavar="N|DEVICE=N,...", default=None,
                    help="worker processes for the vignette's study cells (default: the CPU count), or one pool per "
                         "device, e.g. cuda=2,cpu=14")
    vr.set_defaults(func=_cmd_vignette_run)
    vig.set_defaults(func=None, _sub_parser=vig)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``moestat`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.func is None:  # a command group without its sub-command
        args._sub_parser.print_help(sys.stderr)
        return 2
    pd.set_option("display.width", 120)
    np.set_printoptions(precision=4)
    try:
        return int(args.func(args))
    except (ValueError, TypeError, OSError) as exc:  # OSError: a missing, unreadable or unwritable path
        print(f"moestat: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
