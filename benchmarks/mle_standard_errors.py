"""Benchmark: the derivatives behind a maximum-likelihood fit's standard errors, against ``torch.func``.

``MLEFit``'s observed information (the Hessian of the log-likelihood), its per-observation scores (sandwich and OPG
covariances) and the delta-method gradients of ``predict(kind="mean_ci")`` are computed with plain autograd
(``moestat.fit._derivatives.replicate_hessians``, ``pointwise_gradients``).  Two parts, each printing ratios against a
baseline measured in the same run:

* ``first``: a user's first standard errors in a fresh interpreter, ``fit_mle`` on statsmodels' Engel data (k = 2)
  then ``bse()``, ``bse("sandwich")`` and ``predict(kind="mean_ci")``, timed in this tree and in ``--baseline`` (a
  git worktree of an earlier commit), alternating; also whether ``torch._dynamo`` got loaded.
* ``contaminated``: a process's first ``fit_contaminated`` with its standard errors, then ``fisher_information``,
  this tree against ``--baseline``, alternating (not in the default parts).
* ``sizes``: the Hessian of batched fits of growing size, ``replicate_hessians`` against
  ``torch.func.vmap(torch.func.hessian(...))`` in one warm process, with their largest relative difference.

    OMP_NUM_THREADS=1 python benchmarks/mle_standard_errors.py --baseline /tmp/old [--parts first,sizes,contaminated]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_time import alternate, report_first_calls, run_in_tree  # noqa: E402  (fresh-interpreter runs)

FIRST = """
import sys, time, warnings
warnings.simplefilter("ignore")
import statsmodels.api as sm
import moestat as ms
engel = sm.datasets.engel.load_pandas().data
fit = ms.fit_mle(formula="np.log(foodexp) ~ np.log(income)", data=engel, k=2, sd_floor=0.05, restarts=5, seed=1)
t = time.perf_counter()
fit.bse(); fit.bse("sandwich"); fit.predict(engel.head(), "mean_ci")
print(time.perf_counter() - t, "torch._dynamo" in sys.modules, ms.__file__)
"""


CONTAMINATED = """
import sys, time, warnings
warnings.simplefilter("ignore")
import moestat as ms
from moestat.contaminated import ContaminatedMoE, ContaminatedParams, FrozenExpert, fit_contaminated, fisher_information
model = ContaminatedMoE(FrozenExpert.gaussian_expert([1.0], 0.0, 0.25), "softmax", "tanh")
truth = ContaminatedParams(weight=[2.0], bias=-0.5, var=0.04, gate_weight=[1.5], gate_bias=-0.5)
data = model.simulate(truth, 2000, reps=2, seed=2, inputs="uniform", low=-2, high=2)
t = time.perf_counter()
fit = fit_contaminated(model, data.X, data.y, seed=0)
info = fisher_information(model, truth)
print(time.perf_counter() - t, "torch._dynamo" in sys.modules, ms.__file__)
"""


def part_contaminated(baseline: Path, repeats: int) -> None:
    print("== a process's first contaminated-MoE fit with standard errors, then the Fisher information (softmax gate, "
          "tanh prompt, n = 2,000, R = 2): seconds, torch._dynamo loaded")
    with tempfile.TemporaryDirectory() as cwd:
        old, new = alternate(baseline, CONTAMINATED, repeats, cwd)
    print(f"baseline / this tree: {report_first_calls(old, new):.1f}x")


def first_call(tree: Path, cwd: str) -> tuple[float, bool]:
    """Seconds of the first standard errors and mean CIs in a fresh interpreter importing ``tree``, and whether
    ``torch._dynamo`` got loaded."""
    seconds, dynamo = run_in_tree(tree, FIRST, cwd)
    return float(seconds), dynamo == "True"


def part_first(baseline: Path, repeats: int) -> None:
    print("== first standard errors in a fresh interpreter (Engel, k = 2): seconds, torch._dynamo loaded")
    with tempfile.TemporaryDirectory() as cwd:
        runs: dict[str, list[tuple[float, bool]]] = {"this tree": [], "baseline": []}
        for _ in range(repeats):
            runs["baseline"].append(first_call(baseline, cwd))
            runs["this tree"].append(first_call(HERE, cwd))
    for name, rs in runs.items():
        print(f"{name:>10}: " + " ".join(f"{t:.3f}" for t, _ in rs)
              + f"  median {statistics.median(t for t, _ in rs):.3f} s, dynamo loaded: {sorted({d for _, d in rs})}")
    ratio = statistics.median(t for t, _ in runs["baseline"]) / statistics.median(t for t, _ in runs["this tree"])
    print(f"baseline / this tree: {ratio:.1f}x")


def _timed(fn, repeats: int):
    """Mean seconds of ``repeats`` calls after one warm-up call (first-use costs are the other part's subject)."""
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    return (time.perf_counter() - start) / repeats, out


def hessian_times(k: int, d: int, n: int, R: int, seed: int, repeats: int) -> tuple[int, float, float, float]:
    """P, the seconds of torch.func's and of replicate_hessians' Hessians of one batched fit, their difference."""
    import numpy as np
    import torch

    import moestat as ms
    from moestat.fit._derivatives import replicate_hessians

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(R, n, d))
    y = X[..., 0] + 0.5 * np.abs(X[..., -1]) + 0.3 * rng.normal(size=(R, n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_mle(ms.MoE(k=k, d=d), X, y, restarts=1, seed=0, max_iter=20)
    f, (Xt, yt, w) = fit._f_obs(), fit._data_args()
    ref_fn = torch.func.vmap(torch.func.hessian(lambda t, x, yy, ww: (f(t, x, yy) * ww).sum()))
    t_ref, H_ref = _timed(lambda: ref_fn(fit._theta, Xt, yt, w), repeats)
    t_new, H_new = _timed(lambda: replicate_hessians(lambda t: (f(t, Xt, yt) * w).sum(), fit._theta), repeats)
    return fit._theta.shape[-1], t_ref, t_new, float((H_new - H_ref).abs().max() / H_ref.abs().max())


def part_sizes(repeats: int) -> None:
    print("== Hessian of batched Gaussian-expert fits: torch.func (fwd-over-rev, vmapped) vs replicate_hessians")
    print("k d n R P | torch.func s | replicate_hessians s | ratio | max relative difference")
    for k, d, n, R in [(2, 1, 500, 1), (3, 4, 1000, 1), (5, 10, 2000, 1), (5, 10, 2000, 10), (9, 20, 5000, 5)]:
        P, t_ref, t_new, rel = hessian_times(k, d, n, R, seed=k * 100 + R, repeats=repeats)
        print(f"{k} {d} {n} {R} {P} | {t_ref:.4f} | {t_new:.4f} | {t_ref / t_new:.2f}x | {rel:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a tree of an earlier commit (git worktree), for --parts first")
    parser.add_argument("--parts", default="first,sizes")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    parts = args.parts.split(",")
    if "first" in parts:
        if args.baseline is None:
            raise SystemExit("--parts first needs --baseline TREE (e.g. git worktree add /tmp/old HEAD~1)")
        part_first(args.baseline, args.repeats)
    if "sizes" in parts:
        part_sizes(max(1, args.repeats // 2))
    if "contaminated" in parts:
        if args.baseline is None:
            raise SystemExit("--parts contaminated needs --baseline TREE")
        part_contaminated(args.baseline, args.repeats)


if __name__ == "__main__":
    main()
