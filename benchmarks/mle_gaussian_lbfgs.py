"""Benchmark: the L-BFGS phase of ``fit_mle`` for Gaussian experts, closed-form gradient against autograd.

``fit_mle`` minimises the negative mean log-likelihood by batched L-BFGS (``moestat.fit.mle.gradient_fit``) for
``method="gradient"`` and for the EM starts still running at ``switch_after``.  For softmax-gated linear or constant
Gaussian experts the value and gradient now come in closed form on the packed vector
(``moestat.fit._glm_objective.GLMMixtureObjective``, as for Poisson and binomial experts before); autograd through
the generic likelihood took them before.  Two parts, each printing ratios against a baseline measured in the same run:

* ``fits``: whole warm fits (median of 3 after a warm-up fit, fresh interpreters) in this tree and in ``--baseline``
  (a git worktree of an earlier commit), alternating, with the largest difference of their log-likelihoods: an
  over-specified formula fit (k = 3 on two classes, whose EM crawls and hands its starts to L-BFGS) and array fits
  with EM's hand-over and with ``method="gradient"``;
* ``evaluations``: one value-and-gradient evaluation of A problems, the closed form against autograd through
  ``log_components`` (what the L-BFGS phase ran before), in one warm process, with their largest relative
  difference.

    OMP_NUM_THREADS=1 python benchmarks/mle_gaussian_lbfgs.py --baseline /tmp/old [--parts fits,evaluations]

About 8 minutes on the 2-core AVX2 host; ``--parts evaluations`` alone takes half a minute and needs no baseline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_time import alternate, median_timed, warm_fit_code  # fresh-interpreter runs

# label, method, k, d, n, replicates R, random starts S (array API, data simulated from a k-expert softmax MoE)
CELLS = [("em", "em", 3, 2, 2000, 10, 3), ("gradient", "gradient", 3, 2, 2000, 10, 3),
         ("gradient", "gradient", 4, 5, 5000, 5, 3)]

SETUP = """
import sys, time, warnings
import numpy as np, pandas as pd, torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)
import moestat as ms
cell = {cell!r}
if cell[0] == "shared":  # flexmix's NPreg design (two classes on x in (0, 10), a shared x^2 term, a gate on x), k = 3
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, 200)
    first = rng.uniform(size=200) < 1 / (1 + np.exp(-(x - 5)))
    y = np.where(first, 5 * x, 40 - 3 * x) + 0.1 * x**2 + np.where(first, 3.0, 1.5) * rng.normal(size=200)
    df = pd.DataFrame({{"x": x, "yn": y}})
    def fit(seed):
        return ms.fit_mle(formula="yn ~ x", data=df, k=3, shared="~ I(x**2)", restarts=10, seed=seed, tol=1e-10,
                          max_iter=5000)
else:
    label, method, k, d, n, R, S = cell
    spec = ms.MoE(k=k, d=d)
    rng = np.random.default_rng(k * 100 + d)
    truth = ms.Params(rng.normal(size=k), rng.normal(scale=1.5, size=(k, d)), rng.normal(scale=2.0, size=(k, d)),
                      rng.normal(size=k), noise_sd=np.full(k, 0.5))
    data = ms.simulate(spec, truth, n=n, reps=R, seed=1, model="mixture")
    def fit(seed):
        return ms.fit_mle(spec, data.X, data.y, restarts=S, seed=seed, method=method)
"""

WARM = warm_fit_code(SETUP, '",".join(repr(float(v)) for v in np.ravel(f.loglik))')


def part_fits(baseline: Path, repeats: int) -> None:
    print("== warm fit_mle fits with Gaussian experts (median of 3 after a warm-up fit, fresh interpreters, "
          "alternating)")
    print("cell | baseline s | this tree s | ratio | largest log-likelihood difference")
    with tempfile.TemporaryDirectory() as cwd:
        for cell in [("shared",), *CELLS]:
            old, new = alternate(baseline, WARM.format(cell=cell), repeats, cwd)
            t_old = statistics.median(float(r[0]) for r in old)
            t_new = statistics.median(float(r[0]) for r in new)
            ll_old = [float(v) for v in old[-1][1].split(",")]
            ll_new = [float(v) for v in new[-1][1].split(",")]
            diff = max(abs(a - b) for a, b in zip(ll_old, ll_new, strict=True))
            if cell[0] == "shared":
                label = "NPreg-like, over-specified k=3, n=200, shared x^2, gate on x, 10 starts"
            else:
                label = "{} k={} d={} n={} R={} S={}".format(*cell[:1], *cell[2:])
            print(f"{label} | {t_old:.3f} | {t_new:.3f} | {t_old / t_new:.2f}x | {diff:.1e}")


def evaluation_times(k: int, d: int, n: int, A: int, gen, repeats: int) -> None:
    """Print one size's evaluation times: autograd through ``log_components`` against the closed form."""
    import torch

    import moestat as ms
    from moestat.fit import mle
    from moestat.fit._glm_objective import GLMMixtureObjective
    from moestat.fit._layout import ParamLayout

    spec = ms.MoE(k=k, d=d)
    layout = ParamLayout(spec)
    X = torch.randn(A, n, d, generator=gen, dtype=torch.float64)
    y = 2.0 * torch.randn(A, n, generator=gen, dtype=torch.float64)
    v = 0.5 * torch.randn(A, layout.size, generator=gen, dtype=torch.float64)
    floor2 = torch.full((A, 1), 1e-4, dtype=torch.float64)
    Zt = mle.design(X, True).transpose(1, 2)
    rows = mle.design_rows(layout)
    objective = GLMMixtureObjective(Zt[:, rows["gate"]], Zt[:, rows["expert"]], None, y, None, None, "gaussian", k, n,
                                    None, floor2)

    def autograd():
        with torch.enable_grad():
            t = v.detach().requires_grad_(True)
            p = layout.unpack(t)
            p.noise_sd = torch.sqrt(floor2 + torch.exp(2 * t[:, -k:]))
            value = -torch.logsumexp(mle.log_components(spec, p, Zt, y), dim=1).sum(-1) / n
            (g,) = torch.autograd.grad(value.sum(), t)
        return value.detach(), g

    t_ref, (f_ref, g_ref) = median_timed(autograd, repeats)
    t_new, (f_new, g_new) = median_timed(lambda: objective(v), repeats)
    rf = float(((f_new - f_ref).abs() / f_ref.abs()).max())
    rg = float((g_new - g_ref).abs().max() / g_ref.abs().max())
    print(f"{k} {d} {n} {A} | {t_ref:.5f} | {t_new:.5f} | {t_ref / t_new:.2f}x | {rf:.1e}, {rg:.1e}")


def part_evaluations(repeats: int) -> None:
    import torch

    torch.set_num_threads(1)
    print("== one value + gradient of A problems: autograd through log_components vs the closed form")
    print("k d n A | autograd s | closed form s | ratio | max relative difference (value, gradient)")
    gen = torch.Generator().manual_seed(0)
    for k, d, n, A in ((2, 1, 200, 10), (3, 2, 2000, 30), (4, 5, 5000, 15), (9, 8, 1000, 20)):
        evaluation_times(k, d, n, A, gen, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a tree of an earlier commit (git worktree), for fits")
    parser.add_argument("--parts", default="fits,evaluations")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    parts = args.parts.split(",")
    if "fits" in parts and args.baseline is None:
        raise SystemExit("--parts fits needs --baseline TREE (e.g. git worktree add /tmp/old HEAD~1)")
    if "fits" in parts:
        part_fits(args.baseline, args.repeats)
    if "evaluations" in parts:
        part_evaluations(max(5, args.repeats))


if __name__ == "__main__":
    main()
