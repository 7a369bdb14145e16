"""Benchmark: ``fit_lse``'s autograd reference path (gates the fused kernels do not know, a learned temperature).

Newton and Levenberg-Marquardt on that path take the residual Jacobian J and the exact Hessian H from
``ReferenceKernel.residual_derivatives``: plain autograd, each observation at its own copy of the parameters for J
and reverse over reverse for H.  Before, ``torch.func.vmap(jacrev(...))`` ran n unit cotangents through the whole
batch (time and memory quadratic in n) and ``torch.func.hessian`` took forward over reverse.  Three parts, each
printing ratios against a baseline measured in the same run:

* ``derivatives``: J and H of one call, ``torch.func`` (the code before, inline) against ``residual_derivatives``,
  as n grows, with their largest relative differences; beyond n = 4,000 the new code alone.
* ``first``: a process's first cosine-gated ``fit_lse`` (n = 300, Newton) in a fresh interpreter, this tree
  against ``--baseline`` (a git worktree of an earlier commit), alternating; also whether ``torch._dynamo`` got
  loaded (``torch.func``'s first use imports it).
* ``fits``: whole warm ``fit_lse`` calls with the defaults (Newton to its tolerances, curvature certificate), one
  per gate, this tree against ``--baseline`` in fresh interpreters, alternating, with their objectives.

    OMP_NUM_THREADS=1 python benchmarks/lse_reference_path.py --baseline /tmp/old [--parts derivatives,first,fits]

About 8 minutes on 2 cores, most of it the baseline's fits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_time import alternate, median_timed, report_first_calls  # noqa: E402  (fresh-interpreter runs)

# gate, learn_temperature, k, d, n, replicates
FIT_CELLS = [("cosine", False, 3, 2, 1000, 2), ("laplace", False, 3, 2, 1000, 2), ("gaussian", False, 3, 2, 1000, 2),
             ("normalized_sigmoid", False, 3, 2, 1000, 2), ("laplace", True, 3, 2, 1000, 2)]

SETUP = """
import sys, time, warnings
import numpy as np, torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)
import moestat as ms
gate, learn_temperature, k, d, n, R = {cell!r}
spec = ms.MoE(gate=gate, k=k, d=d, expert="gelu")
rng = np.random.default_rng(k * 10 + d)
truth = ms.Params(rng.normal(size=k), rng.normal(scale=1.5, size=(k, d)), rng.normal(size=(k, d)), rng.normal(size=k))
data = ms.simulate(spec, truth, n=n, reps=R, seed=1)
def fit(X, y):
    return ms.fit_lse(spec, X, y, init="near_truth", truth=truth, seed=0, learn_temperature=learn_temperature)
"""

FIRST = SETUP + """
t = time.perf_counter()
f = fit(data.X[:1, :300], data.y[:1, :300])
print(time.perf_counter() - t, "torch._dynamo" in sys.modules, ms.__file__)
"""

WARM = SETUP + """
fit(data.X[:1, :200], data.y[:1, :200])
t = time.perf_counter()
f = fit(data.X, data.y)
print(time.perf_counter() - t, f.settings["optimizer"], float(np.sum(f.objective)).hex(), ms.__file__)
"""


def part_first(baseline: Path, repeats: int) -> None:
    print("== a process's first cosine-gated fit_lse (n = 300, Newton): seconds, torch._dynamo loaded")
    with tempfile.TemporaryDirectory() as cwd:
        old, new = alternate(baseline, FIRST.format(cell=FIT_CELLS[0]), repeats, cwd)
    print(f"baseline / this tree: {report_first_calls(old, new):.2f}x")


def part_fits(baseline: Path, repeats: int) -> None:
    print("== warm fit_lse with the defaults, R replicates (fresh interpreters, alternating; a warm-up fit first)")
    print("gate k d n R | optimizer | baseline s | this tree s | ratio | objectives (sum): baseline, this tree")
    with tempfile.TemporaryDirectory() as cwd:
        for cell in FIT_CELLS:
            old, new = alternate(baseline, WARM.format(cell=cell), repeats, cwd)
            t_old = statistics.median(float(r[0]) for r in old)
            t_new = statistics.median(float(r[0]) for r in new)
            gate, learn_temperature, k, d, n, R = cell
            label = gate + (" (learned temperature)" if learn_temperature else "")
            o_old, o_new = float.fromhex(old[0][2]), float.fromhex(new[0][2])
            print(f"{label} {k} {d} {n} {R} | {new[0][1]} | {t_old:.2f} | {t_new:.2f} | {t_old / t_new:.1f}x | "
                  f"{o_old:.12g}, {o_new:.12g}")


def torch_func_derivatives(kernel, theta, X, y):
    """J and H as the reference path computed them before: ``torch.func`` per problem."""
    import torch

    def resid(t, x, yy):
        return kernel._f(t[None, None], x[None])[0, 0] - yy

    A, n = y.shape
    P = theta[0].numel()
    with torch.enable_grad():
        J = torch.func.vmap(torch.func.jacrev(resid))(theta, X, y).reshape(A, n, P)
        H = torch.func.vmap(torch.func.hessian(lambda t, x, yy: 0.5 * resid(t, x, yy).square().sum()))(theta, X, y)
    return J, H.reshape(A, P, P)


def part_derivatives(repeats: int) -> None:
    import torch

    import moestat as ms
    from moestat.fit._objective import ReferenceKernel

    torch.set_num_threads(1)
    print("== J and H of one call, cosine gate, k = 3 gelu experts, d = 2, 4 problems: torch.func vs "
          "residual_derivatives")
    print("n | torch.func s | residual_derivatives s | ratio | max relative difference (J, H)")
    kernel = ReferenceKernel(ms.MoE(gate="cosine", k=3, d=2, expert="gelu"))
    gen = torch.Generator().manual_seed(0)
    A = 4
    theta = 0.7 * torch.randn(A, kernel.rows, 3, generator=gen, dtype=torch.float64)
    for n in (250, 500, 1000, 2000, 4000, 16000, 64000):
        X = torch.cat([torch.ones(A, n, 1, dtype=torch.float64),
                       torch.rand(A, n, 2, generator=gen, dtype=torch.float64) * 2 - 1], -1)
        y = torch.randn(A, n, generator=gen, dtype=torch.float64)
        t_new, (_, J, H) = median_timed(lambda: kernel.residual_derivatives(theta, X, y, exact=True), repeats)  # noqa: B023
        if n > 4000:
            print(f"{n} | - | {t_new:.4f} | - | -")
            continue
        t_ref, (J_ref, H_ref) = median_timed(lambda: torch_func_derivatives(kernel, theta, X, y), max(1, repeats // 2))  # noqa: B023
        rj = float((J - J_ref).abs().max() / J_ref.abs().max())
        rh = float((H - H_ref).abs().max() / H_ref.abs().max())
        print(f"{n} | {t_ref:.4f} | {t_new:.4f} | {t_ref / t_new:.0f}x | {rj:.1e}, {rh:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a tree of an earlier commit (git worktree), for first and fits")
    parser.add_argument("--parts", default="derivatives,first,fits")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    parts = args.parts.split(",")
    if {"first", "fits"} & set(parts) and args.baseline is None:
        raise SystemExit("--parts first and fits need --baseline TREE (e.g. git worktree add /tmp/old HEAD~1)")
    if "derivatives" in parts:
        part_derivatives(args.repeats)
    if "first" in parts:
        part_first(args.baseline, 2 * args.repeats - 1)
    if "fits" in parts:
        part_fits(args.baseline, max(1, args.repeats - 1))


if __name__ == "__main__":
    main()
