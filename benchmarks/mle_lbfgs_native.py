"""Benchmark: the L-BFGS phase of ``fit_mle(compile=True)`` in C++ (``_mle_lbfgs_native.cpp``) against the tensor
L-BFGS that followed the C++ EM loop before.

Both variants run EM in the fused C++ loop and hand the starts still running at ``switch_after=30`` (the default) to
L-BFGS; they differ only in that phase: one C++ loop per start with the closed-form gradient ("native"), or the
batched tensor L-BFGS on the closed-form objective of ``moestat.fit._glm_objective`` (for Gaussian experts since
2026-11-27; autograd before) ("tensor", selected here by switching the native loop off).  Printed per case: CPU ms
of a whole fit for each (median of 5, alternating, after a warm-up, one torch thread), their ratio, the difference
of the maxima (native minus tensor: the two loops agree to rounding on a regular likelihood), and how far the
tensor loop's maximum moves when one data column is multiplied by 1 + 1e-14 ("perturbed": where rounding alone
moves it, the two loops' maxima need not agree).

Regular fits: the cases of ``mle_switch_after.py`` (10 random starts, seeds 0 and 1; the NPreg cases need Rscript
with flexmix).  ``--overspecified``: the softmax Gaussian MoE vignette's over-specified fits of that benchmark (k = 3
and 4 started near a k* = 2 truth, 5 replicates, n = 1,000 and 10,000), where the path along a flat likelihood decides
the end point, so the maxima of the two loops may differ; CPU s of one run each and -loglik/n per replicate.  The
tensor loop runs once more on the responses times 1 + 1e-14: how far rounding alone moves those end points.
``--method gradient``: the regular cases fitted by L-BFGS from the starts (``fit_mle(method="gradient")``), where
the whole fit is the L-BFGS phase; "tensor" is then the default fit (the GLM starts' IRLS in torch as well).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_lbfgs_native.py [--cases diabetes_k2,engel_k3]
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_lbfgs_native.py --overspecified
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/mle_lbfgs_native.py --method gradient
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

import moestat as ms
from moestat.fit import mle as mle_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mle_switch_after import OVERSPECIFIED, cases, vignette_data, vignette_truth  # the same fits


@contextlib.contextmanager
def lbfgs_loop(kind: str) -> Iterator[None]:
    """Run the L-BFGS phase in the C++ loop (``native``) or in the tensor loop (``tensor``)."""
    real = mle_module.native_mixture
    if kind == "tensor":
        mle_module.native_mixture = lambda spec, layout: False
    try:
        yield
    finally:
        mle_module.native_mixture = real


def timed(kw: dict) -> tuple[float, object]:
    t0 = time.process_time()
    fit = ms.fit_mle(**kw)
    return time.process_time() - t0, fit


def perturbed(kw: dict) -> dict:
    """``kw`` with one data column times 1 + 1e-14: the response of Gaussian models, else the first covariate (a
    count or a proportion would leave its range)."""
    data, (lhs, rhs) = kw["data"].copy(), kw["formula"].split("~")
    column = lhs.strip() if kw.get("family", "gaussian") == "gaussian" else next(
        c for c in data.columns if c in rhs and c != lhs.strip())
    data[column] = data[column] * (1 + 1e-14)
    return dict(kw, data=data)


def regular(names: list[str] | None, method: str, repeat: int = 5) -> None:
    table = cases()
    print(f"{'case':24s} {'seed':>4s} {'native ms':>10s} {'tensor ms':>10s} {'ratio':>7s} {'loglik diff':>12s} "
          f"{'perturbed':>10s}")
    for name in names or list(table):
        for seed in (0, 1):
            kw = dict(table[name], restarts=10, seed=seed, compile=True, progress=False, method=method)
            times: dict[str, list[float]] = {"native": [], "tensor": []}
            fits = {}
            for kind in times:  # warm-up
                with lbfgs_loop(kind):
                    fits[kind] = timed(kw)[1]
            for _ in range(repeat):
                for kind in times:
                    with lbfgs_loop(kind):
                        cpu, fits[kind] = timed(kw)
                    times[kind].append(cpu)
            a, b = (1e3 * float(np.median(times[kind])) for kind in ("native", "tensor"))
            diff = float(fits["native"].loglik) - float(fits["tensor"].loglik)
            with lbfgs_loop("tensor"):  # how far rounding alone moves the tensor loop's maximum
                moved = float(timed(perturbed(kw))[1].loglik) - float(fits["tensor"].loglik)
            print(f"{name:24s} {seed:4d} {a:10.1f} {b:10.1f} {b / a:6.1f}x {diff:12.2e} {moved:10.2e}", flush=True)


def overspecified(reps: int = 5) -> None:
    from moestat.cells import mle_estimator

    spec, _, truth = vignette_truth()
    print(f"{'n':>6s} {'k':>2s} {'split':>6s} {'loop':>7s} {'CPU s':>6s}  -loglik/n per replicate")
    for n in (1000, 10000):
        data = vignette_data(n, reps)
        for k, split in OVERSPECIFIED:
            cpus, ends = {}, {}
            # the tensor loop once more on the responses times (1 + 1e-14): how far rounding alone moves the ends
            for kind, y in (("native", data.y), ("tensor", data.y), ("tensor", data.y * (1 + 1e-14))):
                with lbfgs_loop(kind):
                    t0 = time.process_time()
                    est = mle_estimator(spec.with_k(k), data.X, y, truth=truth, seed=np.random.SeedSequence(7),
                                        init="near_truth", duplicate=split, se="none", device="cpu", compile=True)
                    cpu = time.process_time() - t0
                name = kind if y is data.y else "tensor, y(1 + 1e-14)"
                cpus[name], ends[name] = cpu, np.asarray(est.objective, dtype=float)
                label = ",".join(str(i + 1) for i in split)
                print(f"{n:6d} {k:2d} {label:>6s} {name:>7s} {cpu:6.2f}  " + " ".join(f"{v:.4f}" for v in ends[name]),
                      flush=True)
            gap = {name: float(np.abs(ends[name] - ends["tensor"]).max())
                   for name in ("native", "tensor, y(1 + 1e-14)")}
            print(f"{'':>17s} ratio {cpus['tensor'] / cpus['native']:5.1f}x; largest |end - tensor end|: native "
                  f"{gap['native']:.1e}, tensor on y(1 + 1e-14) {gap['tensor, y(1 + 1e-14)']:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None, help="comma-separated case names of mle_switch_after.py")
    parser.add_argument("--overspecified", action="store_true", help="the vignette's over-specified fits instead")
    parser.add_argument("--method", default="em", choices=["em", "gradient"], help="fit_mle's method (regular cases)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # convergence and degeneracy warnings: the maxima are printed
    if args.overspecified:
        overspecified()
    else:
        regular(args.cases.split(",") if args.cases else None, args.method)


if __name__ == "__main__":
    main()
