"""Benchmark: EM's gate step for gates other than softmax (its derivatives by plain autograd, not ``torch.func``).

``fit_mle(method="em")`` with a sigmoid, cosine, Laplace, Gaussian, quadratic or top-K gate takes damped Newton
steps on the expected complete-data log-likelihood of the gate (``moestat.fit.em.gradient_gate_step``); its
gradient and Hessian come from ``moestat.fit.em.gate_derivatives``.  Three parts, each printing ratios against a
baseline measured in the same run:

* ``first``: a process's first such fit (sigmoid gate, n = 500, three random starts) in a fresh interpreter, in
  this tree and in ``--baseline`` (a git worktree of an earlier commit), alternating; also whether
  ``torch._dynamo`` got loaded (``torch.func``'s first use imports it).
* ``fits``: whole warm fits (after one warm-up fit in the same fresh interpreter) of several gates and sizes, this
  tree against ``--baseline``, alternating, with whether their log-likelihoods are equal to the bit.
* ``derivatives``: ``gate_derivatives`` against ``torch.func.vmap`` over ``grad`` and ``jacrev`` in one warm
  process, with their largest relative difference; where the Hessian's rows go in several chunks, also the time with
  every row in one backward pass.

    OMP_NUM_THREADS=1 python benchmarks/mle_gate_step.py --baseline /tmp/old [--parts first,fits,derivatives]

About 15 minutes on 2 cores, most of it the large sigmoid cell's fits in ``fits``; ``--parts derivatives`` alone
takes about a minute and needs no baseline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_time import alternate, median_timed, report_first_calls, warm_fit_code  # noqa: E402  (fresh-interpreter runs)

# gate, top_k, k, d, n, replicates R, random starts S
CELLS = [("sigmoid", None, 2, 2, 500, 1, 3), ("sigmoid", None, 4, 5, 5000, 10, 3), ("cosine", None, 3, 3, 2000, 5, 3),
         ("laplace", None, 3, 2, 2000, 5, 3), ("gaussian", None, 3, 2, 2000, 5, 3), ("topk", 2, 4, 3, 2000, 5, 3)]

SETUP = """
import sys, time, warnings
import numpy as np, torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)
import moestat as ms
gate, top_k, k, d, n, R, S = {cell!r}
spec = ms.MoE(gate=gate, k=k, d=d, **({{"top_k": top_k}} if top_k else {{}}))
rng = np.random.default_rng(k * 100 + d)
truth = ms.Params(rng.normal(size=k), rng.normal(scale=1.5, size=(k, d)), rng.normal(scale=2.0, size=(k, d)),
                  rng.normal(size=k), noise_sd=np.full(k, 0.5))
data = ms.simulate(spec, truth, n=n, reps=R, seed=1, model="mixture")
def fit(seed):
    return ms.fit_mle(spec, data.X, data.y, restarts=S, seed=seed, method="em")
"""

FIRST = SETUP + """
t = time.perf_counter()
f = fit(0)
print(time.perf_counter() - t, "torch._dynamo" in sys.modules, float(np.sum(f.loglik)).hex(), ms.__file__)
"""

WARM = warm_fit_code(SETUP, 'float(np.sum(f.loglik)).hex()')


def part_first(baseline: Path, repeats: int) -> None:
    print("== a process's first EM fit with a sigmoid gate (n = 500, 3 starts): seconds, torch._dynamo loaded")
    with tempfile.TemporaryDirectory() as cwd:
        old, new = alternate(baseline, FIRST.format(cell=CELLS[0]), repeats, cwd)
    ratio = report_first_calls(old, new)
    same = {r[2] for r in old} == {r[2] for r in new}
    print(f"baseline / this tree: {ratio:.2f}x; log-likelihoods equal to the bit: {same}")


def part_fits(baseline: Path, repeats: int) -> None:
    print("== warm EM fits (median of 3 after a warm-up fit, fresh interpreters, alternating)")
    print("gate k d n R S | baseline s | this tree s | ratio | log-likelihoods equal to the bit")
    with tempfile.TemporaryDirectory() as cwd:
        for cell in CELLS:
            old, new = alternate(baseline, WARM.format(cell=cell), repeats, cwd)
            t_old = statistics.median(float(r[0]) for r in old)
            t_new = statistics.median(float(r[0]) for r in new)
            same = {r[1] for r in old} == {r[1] for r in new}
            gate, top_k, k, d, n, R, S = cell
            label = gate if top_k is None else f"{gate}{top_k}"
            print(f"{label} {k} {d} {n} {R} {S} | {t_old:.3f} | {t_new:.3f} | {t_old / t_new:.2f}x | {same}")


def derivative_times(cell: tuple, gen, repeats: int) -> None:
    """Print one cell's derivative timings: ``torch.func`` against ``gate_derivatives``, and the chunks' effect."""
    import torch

    import moestat as ms
    from moestat.fit import _derivatives as derivatives
    from moestat.fit import em
    from moestat.fit._layout import ParamLayout

    gate, top_k, k, d, n, R, S = cell
    spec = ms.MoE(gate=gate, k=k, d=d, **({"top_k": top_k} if top_k else {}))
    layout = ParamLayout(spec)
    A, P = R * S, layout.n_gate
    X = torch.randn(A, n, d, generator=gen, dtype=torch.float64)
    tau = torch.softmax(torch.randn(A, k, n, generator=gen, dtype=torch.float64), 1)
    theta = 0.5 * torch.randn(A, P, generator=gen, dtype=torch.float64)
    logw = em.gate_log_weights(spec, layout, theta, X)
    tau = torch.where(torch.isfinite(logw), tau, torch.zeros_like(tau))  # top-K: no mass outside the selection

    def q_one(th, x, t):
        return em.expected_gate_loglik(t, em.gate_log_weights(spec, layout, th, x))

    grad_fn = torch.func.vmap(torch.func.grad(q_one))
    hess_fn = torch.func.vmap(torch.func.jacrev(torch.func.grad(q_one)))

    def ours():
        return em.gate_derivatives(spec, layout, X, tau, theta)

    t_ref, (g_ref, H_ref) = median_timed(lambda: (grad_fn(theta, X, tau), hess_fn(theta, X, tau)), repeats)
    t_new, (g_new, H_new) = median_timed(ours, repeats)
    rg = float((g_new - g_ref).abs().max() / g_ref.abs().max())
    rh = float((H_new - H_ref).abs().max() / H_ref.abs().max())
    label = gate if top_k is None else f"{gate}{top_k}"
    print(f"{label} {k} {d} {n} {A} {P} | {t_ref:.4f} | {t_new:.4f} | {t_ref / t_new:.2f}x | {rg:.1e}, {rh:.1e}")
    budget = derivatives.HESSIAN_CHUNK_ELEMENTS["cpu"]
    chunks = derivatives.hessian_chunks(P, budget // (A * k * n))
    if len(chunks) > 1:  # the same derivatives with every Hessian row in one backward pass
        derivatives.HESSIAN_CHUNK_ELEMENTS["cpu"] = 2**62
        try:
            t_one, (_, H_one) = median_timed(ours, repeats)
        finally:
            derivatives.HESSIAN_CHUNK_ELEMENTS["cpu"] = budget
        print(f"    {len(chunks)} chunks of {chunks[0][1]} rows: {t_new:.4f} s; all {P} rows in one pass: "
              f"{t_one:.4f} s ({t_one / t_new:.2f}x); equal to the bit: {torch.equal(H_one, H_new)}")


def part_derivatives(repeats: int) -> None:
    import torch

    torch.set_num_threads(1)
    print("== the gate step's gradient and Hessian: torch.func (vmap of grad, jacrev) vs gate_derivatives")
    print("gate k d n pairs P | torch.func s | gate_derivatives s | ratio | max relative difference (g, H)")
    gen = torch.Generator().manual_seed(0)
    for cell in CELLS:
        derivative_times(cell, gen, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a tree of an earlier commit (git worktree), for first and fits")
    parser.add_argument("--parts", default="first,fits,derivatives")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    parts = args.parts.split(",")
    if {"first", "fits"} & set(parts) and args.baseline is None:
        raise SystemExit("--parts first and fits need --baseline TREE (e.g. git worktree add /tmp/old HEAD~1)")
    if "first" in parts:
        part_first(args.baseline, args.repeats)
    if "fits" in parts:
        part_fits(args.baseline, max(1, args.repeats // 2 + 1))
    if "derivatives" in parts:
        part_derivatives(args.repeats)


if __name__ == "__main__":
    main()
