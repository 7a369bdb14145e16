"""Gauss-Newton information H = J'J/n: Kronecker pair products vs the explicit Jacobian (issues 3, 6).

Every least-squares fit reports cond(J'J) at its solution, and each Levenberg-Marquardt step forms J'J.
The Jacobian row of observation t is u_t (x) x_t (2k derivative multipliers times the d+1 augmented
inputs), so ``LSProblem.gauss_newton`` forms H from the products u_j u_j' (j <= j') and x_l x_l'
(l <= l') in one matrix product.  The baseline, timed in the same run, is what the engine did before:
form J (n x P) chunk by chunk and accumulate J'J with a batched matrix product.

Workload: the nguyen2024 regime-2 preset (d = 32, k* = 8, relu experts, sigmoid truth) fitted with
k = 9 (P = 594), float64, one thread; the study's replicate blocks (20 x 1,000, 3 x 10,000, 1 x 100,000).
Prints seconds (lower decile), the speed-up and the largest relative difference between the two H.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/lse_gauss_newton.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import moestat as ms
from moestat.fit._objective import LSProblem, MeanKernel
from moestat.papers import presets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lse_batched import lower_decile


def explicit_jtj(prob: LSProblem, theta: torch.Tensor, max_bytes: int = 2**28) -> torch.Tensor:
    """J'J/n with J formed explicitly in chunks (the engine's previous implementation)."""
    th = prob._theta4(theta)
    A, n, P = theta.shape[0], prob.n, prob.P
    H = torch.zeros(A, P, P, dtype=theta.dtype)
    chunk = max(1, min(n, max_bytes // max(1, A * P * theta.element_size())))
    for lo in range(0, n, chunk):
        Xc, yc = prob._Xg[:, lo : lo + chunk], prob._yg[:, lo : lo + chunk]
        _, u = prob.kernel.residual_jacobian(th, Xc, yc)
        J = (u.transpose(2, 3).unsqueeze(-1) * Xc.unsqueeze(1).unsqueeze(-2)).reshape(A, Xc.shape[1], P)
        H.baddbmm_(J.transpose(1, 2), J)
    return H / n


def main() -> None:
    torch.set_num_threads(1)
    truth = presets.sigmoid_vs_softmax(regime=2)
    spec = truth.spec.with_k(9)
    print("| replicates x n | explicit J'J, s | pair products, s | speed-up | max rel. difference of H |")
    print("|---|---|---|---|---|")
    for R, n in ((20, 1000), (3, 10_000), (1, 100_000)):
        data = ms.simulate(truth.spec, truth.params, n=n, reps=R, seed=1)
        X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
        prob = LSProblem(MeanKernel.from_spec(spec), X, y, 1, torch.ones(18, 33, dtype=torch.bool))
        theta = torch.randn(R, prob.P, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.3
        H_new, H_old = prob.gauss_newton(theta)[1], explicit_jtj(prob, theta)
        diff = float((H_new - H_old).abs().max() / H_old.abs().max())
        reps = 5 if n >= 100_000 else 10
        t_old = lower_decile(lambda prob=prob, theta=theta: explicit_jtj(prob, theta), reps)
        t_new = lower_decile(lambda prob=prob, theta=theta: prob.gauss_newton(theta), reps)
        print(f"| {R} x {n:,} | {t_old:.3f} | {t_new:.3f} | {t_old / t_new:.2f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
