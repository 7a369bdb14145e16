"""Exact Hessian of the least-squares objective: packed curvature rows vs the dense W (issues 15, 21).

Every Newton iteration of the default ``fit_lse`` forms half the exact Hessian
:math:`\\frac1n\\sum_t (u_tu_t^\\top + r_tW_t)\\otimes\\tilde x_t\\tilde x_t^\\top`.
``MeanKernel.exact_curvature_rows`` writes only the non-zero entries of :math:`W_t` (3k under a sigmoid gate,
k(k+1)/2 + k^2 + k under softmax) into the unordered pair rows, reusing the forward pass's buffers. The baseline,
timed in the same run, is the previous implementation: a dense (2k, 2k, n) W from fresh zeros, a second product for
the expert pre-activations, copies of the forward buffers and a gather of its upper triangle.

Workloads: the flagship study's largest cells (``gate_comparison``, d = 3, k = 4, three starts sharing n = 160,000
observations) for gelu and relu experts under both gates, and the d = 32, k = 9 regime-2 preset (one problem,
n = 100,000).  float64, one thread.  Prints seconds (lower decile), the speed-up and the largest relative
difference between the two Hessians.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/lse_exact_hessian.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import moestat as ms
from moestat.fit._objective import LSProblem, MeanKernel, _pair_products
from moestat.papers import presets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lse_batched import lower_decile


def dense_exact_hessian(prob: LSProblem, theta: torch.Tensor, max_bytes: int = 2**23) -> torch.Tensor:
    """Half the exact Hessian through a dense W per observation (the engine's previous implementation)."""
    kern, th = prob.kernel, prob._theta4(theta)
    G, s, two_k, p = th.shape
    k, A, n, tau = kern.k, G * s, prob.n, kern.temperature
    mu, mx = two_k * (two_k + 1) // 2, p * (p + 1) // 2
    M = torch.zeros(G, s * mu, mx, dtype=theta.dtype)
    chunk = max(1, min(n, max_bytes // ((A * (mu + two_k) + G * mx) * theta.element_size())))
    eye = torch.arange(k)
    wa, wb = torch.triu_indices(two_k, two_k)
    for lo in range(0, n, chunk):
        X, y = prob._Xg[:, lo : lo + chunk], prob._yg[:, lo : lo + chunk]
        c = X.shape[1]
        pi, h, dh, f = kern._forward(th, X, kern._workspace(G, s, c, X))
        pi, h, f = pi.clone(), h.clone(), f.clone()
        dh = torch.ones_like(h) if dh is None else dh.clone()
        ze = torch.bmm(th[:, :, k:].reshape(G, s * k, -1), X.transpose(1, 2)).view(G, s, k, c)
        r = f - y.unsqueeze(1)
        U = kern._dfdz(pi.clone(), h, dh, f, None, torch.empty(G, s, two_k, c, dtype=X.dtype))
        W = torch.zeros(G, s, two_k, two_k, c, dtype=X.dtype)
        if kern.gate == "sigmoid":
            d1 = pi * (1.0 - pi)
            W[:, :, eye, eye] = d1 * (1.0 - 2.0 * pi) * h / tau**2
            W[:, :, eye, k + eye] = W[:, :, k + eye, eye] = d1 * dh / tau
        else:
            hf = h - f.unsqueeze(2)
            pp = pi.unsqueeze(3) * pi.unsqueeze(2)
            gg = -pp * (hf.unsqueeze(3) + hf.unsqueeze(2))
            gg[:, :, eye, eye] += pi * hf
            W[:, :, :k, :k] = gg / tau**2
            ge = -pp * dh.unsqueeze(2)
            ge[:, :, eye, eye] += pi * dh
            W[:, :, :k, k:] = ge / tau
            W[:, :, k:, :k] = ge.transpose(2, 3) / tau
        if kern.act2 is not None:
            W[:, :, k + eye, k + eye] = pi * kern.act2(ze)
        uu = _pair_products(U.view(A, two_k, c))
        uu.addcmul_(W.view(A, two_k, two_k, c)[:, wa, wb], r.reshape(A, 1, c))
        M.baddbmm_(uu.view(G, s * mu, c), _pair_products(X.transpose(1, 2).contiguous()).transpose(1, 2))
    u_pair, x_pair = prob._pair_tables(theta.device)
    H = M.view(A, mu, mx)[:, u_pair.reshape(-1)][:, :, x_pair.reshape(-1)]
    return H.view(A, two_k, two_k, p, p).permute(0, 1, 3, 2, 4).reshape(A, prob.P, prob.P) / n


def workloads():
    for expert in ("gelu", "relu"):
        for gate in ("sigmoid", "softmax"):
            spec, truth = presets.gate_comparison(expert, truth_gate=gate, d=3, seed=0)
            yield f"{expert}/{gate}, d=3, k=4, 3 starts x 160,000", spec.with_k(4), spec, truth, 160_000, 3
    truth = presets.sigmoid_vs_softmax(regime=2, expert="gelu")
    yield "gelu/sigmoid, d=32, k=9, 1 x 100,000", truth.spec.with_k(9), truth.spec, truth.params, 100_000, 1


def main() -> None:
    torch.set_num_threads(1)
    print("| workload | dense W, s | packed rows, s | speed-up | max rel. difference of H |")
    print("|---|---|---|---|---|")
    for label, fit_spec, spec, truth, n, S in workloads():
        data = ms.simulate(spec, truth, n=n, seed=1)
        X, y = torch.as_tensor(data.X).reshape(1, n, -1), torch.as_tensor(data.y).reshape(1, n)
        free = torch.ones(2 * fit_spec.k, fit_spec.d + 1, dtype=torch.bool)
        prob = LSProblem(MeanKernel.from_spec(fit_spec), X, y, S, free)
        theta = torch.randn(S, prob.P, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.5
        H_new, H_old = prob.gauss_newton(theta, exact=True)[1], dense_exact_hessian(prob, theta)
        diff = float((H_new - H_old).abs().max() / H_old.abs().max())
        t_old = lower_decile(lambda prob=prob, theta=theta: dense_exact_hessian(prob, theta), 7)
        t_new = lower_decile(lambda prob=prob, theta=theta: prob.gauss_newton(theta, exact=True), 7)
        print(f"| {label} | {t_old:.3f} | {t_new:.3f} | {t_old / t_new:.2f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
