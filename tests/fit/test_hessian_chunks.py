"""The Gauss-Newton matrix and the exact Hessian of ``LSProblem.gauss_newton`` with every temporary counted in its
chunk size (issue 21): the same numbers as the implementation before (kept below as the reference, a verbatim copy
of ``exact_curvature_rows`` and the assembly of H as they were), as autograd, and within the memory budget."""

from __future__ import annotations

import pytest
import torch

import moestat as ms
from moestat.fit._objective import LSProblem, MeanKernel, ReferenceKernel, _pair_products
from moestat.fit.lse import _free_mask
from tests.torch_memory import torch_peak


def _old_curvature_rows(kern: MeanKernel, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor):
    """``MeanKernel.exact_curvature_rows`` before issue 21 (one concatenated W, fresh divided blocks)."""
    G, s = theta.shape[:2]
    k, n, tau = kern.k, X.shape[1], kern.temperature
    ws = kern._workspace(G, s, n, X)
    pi, h, dh, f = kern._forward(theta, X, ws)
    ze = ws["Z"].view(G, s, 2 * k, n)[:, :, k:]
    r = torch.sub(f, y.unsqueeze(1), out=ws["r"])
    pos = kern._pair_positions(X.device)
    eye = torch.arange(k, device=X.device)
    slope = 1.0 if dh is None else dh
    if kern.gate == "sigmoid":
        d1 = pi * (1.0 - pi)
        blocks = [d1 * (1.0 - 2.0 * pi) * h / tau**2, d1 * slope / tau]
        where = [pos[eye, eye], pos[eye, k + eye]]
    else:
        hf = h - f.unsqueeze(2)
        gi, gj = torch.triu_indices(k, k, device=X.device)
        pp = pi[:, :, gi] * pi[:, :, gj]
        gg = pp.mul_(hf[:, :, gi] + hf[:, :, gj]).neg_()
        gg[:, :, gi == gj] += pi * hf
        dhj = slope if dh is None else dh.unsqueeze(2)
        ge = (pi.unsqueeze(3) * pi.unsqueeze(2)).mul_(dhj).neg_()
        ge[:, :, eye, eye] += pi * slope
        blocks = [gg / tau**2, ge.view(G, s, k * k, n) / tau]
        ei, ej = torch.meshgrid(eye, eye, indexing="ij")
        where = [pos[gi, gj], pos[ei.reshape(-1), k + ej.reshape(-1)]]
    if kern.act2 is not None:
        blocks.append(pi * kern.act2(ze))
        where.append(pos[k + eye, k + eye])
    U = kern._dfdz(pi, h, dh, f, None, ws["U"])
    C = _pair_products(U.view(G * s, 2 * k, n))
    W = torch.cat(blocks, 2).view(G * s, -1, n).mul_(r.view(G * s, 1, n))
    C.index_add_(1, torch.cat(where), W)
    return r, U, C.view(G, s, -1, n)


def _old_gauss_newton(prob: LSProblem, theta: torch.Tensor, exact: bool, max_bytes: int = 2**23):
    """``LSProblem.gauss_newton`` before issue 21: chunks counting the pair products only, H gathered twice,
    permuted and restricted to the free coordinates by two more gathers."""
    th = prob._theta4(theta)
    G, s, two_k, p = th.shape
    A, n = G * s, prob.n
    u_pair, x_pair = prob._pair_tables(theta.device)
    mu, mx = two_k * (two_k + 1) // 2, p * (p + 1) // 2
    M = torch.zeros(G, s * mu, mx, dtype=theta.dtype)
    b = torch.zeros(G, s * two_k, p, dtype=theta.dtype)
    loss = torch.zeros(A, dtype=theta.dtype)
    chunk = max(1, min(n, max_bytes // ((A * (mu + two_k) + G * mx) * theta.element_size())))
    for lo in range(0, n, chunk):
        Xc, yc = prob._Xg[:, lo : lo + chunk], prob._yg[:, lo : lo + chunk]
        c = Xc.shape[1]
        if exact:
            r, u, uu = _old_curvature_rows(prob.kernel, th, Xc, yc)
            uu = uu.view(G, s * mu, c)
        else:
            r, u = prob.kernel.residual_jacobian(th, Xc, yc)
            uu = _pair_products(u.view(A, two_k, c)).view(G, s * mu, c)
        xx = _pair_products(Xc.transpose(1, 2).contiguous())
        M.baddbmm_(uu, xx.transpose(1, 2))
        b.baddbmm_(u.mul_(r.unsqueeze(2)).view(G, s * two_k, c), Xc)
        loss.add_((r * r).sum(2).reshape(A))
    M = M.view(A, mu, mx)
    H = M[:, u_pair.reshape(-1)][:, :, x_pair.reshape(-1)]
    H = H.view(A, two_k, two_k, p, p).permute(0, 1, 3, 2, 4).reshape(A, prob.P, prob.P)
    if prob.free_idx.numel() < prob.P:
        H = H[:, prob.free_idx][:, :, prob.free_idx]
    b = b.reshape(A, prob.P)[:, prob.free_idx]
    return loss / n, H.div_(n), b / n


# gate, expert, k, d, temperature: every W branch (sigmoid, softmax, top-K; with and without phi''; tau != 1),
# free masks with held rows (softmax gauge) and held slopes (constant experts)
CASES = [("sigmoid", "gelu", 3, 2, 1.0), ("sigmoid", "linear", 2, 4, 1.0), ("sigmoid", "tanh", 4, 1, 0.7),
         ("softmax", "gelu", 3, 3, 1.0), ("softmax", "relu", 4, 2, 1.0), ("softmax", "constant", 3, 2, 1.3),
         ("topk", "poly3", 4, 2, 1.0), ("softmax", "tanh", 5, 6, 2.0)]


def _problem(gate, expert, k, d, tau, n=301, R=2, S=3, seed=0):
    spec = ms.MoE(gate=gate, expert=expert, k=k, d=d, top_k=2 if gate == "topk" else None, temperature=tau)
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(R, n, d, dtype=torch.float64, generator=gen)
    y = torch.randn(R, n, dtype=torch.float64, generator=gen)
    prob = LSProblem(MeanKernel.from_spec(spec), X, y, S, _free_mask(spec, torch.device("cpu")))
    theta = 0.6 * torch.randn(R * S, prob.P, dtype=torch.float64, generator=gen)
    if not spec.family.input_dependent:
        theta.view(R * S, 2 * k, d + 1)[:, k:, 1:] = 0.0  # constant experts: fit_lse holds the slopes at 0
    prob.spec = spec
    return prob, theta


@pytest.mark.parametrize("gate,expert,k,d,tau", CASES)
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("max_bytes", [None, 40_000])
def test_equals_previous_implementation(gate, expert, k, d, tau, exact, max_bytes):
    prob, theta = _problem(gate, expert, k, d, tau)
    budget = 2**23 if max_bytes is None else max_bytes
    new = prob.gauss_newton(theta, exact=exact, max_bytes=max_bytes)
    old = _old_gauss_newton(prob, theta, exact, budget)
    # 1e-12: the same products and sums per observation; only the chunk boundaries move, which regroups the
    # float64 sums over observations (rounding ~1e-16 relative per addition)
    for a, b_ in zip(new, old, strict=True):
        torch.testing.assert_close(a, b_, rtol=1e-12, atol=1e-12)
    if max_bytes is not None:  # tiny chunks (several per call) against one chunk for all 301 observations
        whole = _old_gauss_newton(prob, theta, exact, 2**40)
        for a, b_ in zip(new, whole, strict=True):
            torch.testing.assert_close(a, b_, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gate,expert,k,d,tau", [CASES[0], CASES[3], CASES[5]])
def test_equals_autograd_hessian_after_active_set_change(gate, expert, k, d, tau):
    """Independent check: half the autograd Hessian of L = mean r^2 over the free coordinates, for a subset of the
    problems (gathered data, s = 1)."""
    prob, theta = _problem(gate, expert, k, d, tau, n=57)
    idx = torch.tensor([0, 4])
    prob.set_active(idx)
    _, H, b = prob.gauss_newton(theta[idx], exact=True, max_bytes=10_000)
    free, ref = prob.free_idx, ReferenceKernel(prob.spec)  # the model's own mean formula, with autograd
    for j, a in enumerate(idx.tolist()):
        X, y = prob.X[a // prob.S], prob.y[a // prob.S]

        def loss(t, X=X, y=y):
            return (ref._f(t.reshape(1, 1, *prob.shape), X[None])[0, 0] - y).square().mean()

        Hx = torch.autograd.functional.hessian(loss, theta[a])[free][:, free] / 2
        gx = torch.autograd.functional.jacobian(loss, theta[a])[free] / 2
        # 1e-10: autograd's Hessian sums the same terms in another order (float64)
        torch.testing.assert_close(H[j], Hx, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(b[j], gx, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("gate,expert", [("sigmoid", "gelu"), ("softmax", "gelu"), ("topk", "tanh")])
def test_peak_within_budget(gate, expert):
    """Beyond its outputs and the accumulator M (sizes independent of n), one call allocates at most 1.5x
    ``max_bytes``, the inputs' pair products it keeps for the next call included (before issue 21 it took up to 7x:
    the curvature temporaries and the (A, P, P) copies)."""
    prob, theta = _problem(gate, expert, 4, 8, 1.0, n=6000, R=2, S=2)
    budget = 2**20
    prob.kernel._ws.clear()
    A, F, P = theta.shape[0], prob.free_idx.numel(), prob.P
    mu, mx = prob.shape[0] * (prob.shape[0] + 1) // 2, prob.p * (prob.p + 1) // 2
    fixed = 8 * (A * F * F + A * mu * mx + 2 * A * P + A)
    peak = torch_peak(lambda: prob.gauss_newton(theta, exact=True, max_bytes=budget))
    assert peak - fixed <= 1.5 * budget, (peak - fixed) / budget
    prob.kernel._ws.clear()
    old = torch_peak(lambda: _old_gauss_newton(prob, theta, True, budget))
    assert old - fixed > 1.5 * budget  # the measure can fail: the previous implementation exceeds it


def test_kink_tolerance_formula():
    """k (d+1) 2/n max|r| max|x~| by brute force in numpy, with inputs whose largest magnitude is negative."""
    prob, theta = _problem("sigmoid", "relu", 3, 2, 1.0, n=40)
    prob.X[1, 5, 2] = -9.0
    got = prob.kink_tolerance(theta).numpy()
    f = prob.kernel.mean(prob._theta4(theta), prob.X).numpy()
    for a in range(theta.shape[0]):
        g = a // prob.S
        r = abs(f[g, a % prob.S] - prob.y[g].numpy()).max()
        expect = 3 * 3 * 2.0 / 40 * r * abs(prob.X[g].numpy()).max()
        assert got[a] == pytest.approx(expect, rel=1e-14)  # the same max and products: exact up to rounding
    assert prob.kink_tolerance(theta)[3] == pytest.approx(3 * 3 * 2.0 / 40 * 9.0 * abs(
        f[1, 0] - prob.y[1].numpy()).max(), rel=1e-14)


def test_input_pair_products_kept_per_active_set(monkeypatch):
    """The inputs' pair products are formed once per active set and reused bit for bit; a new active set forms its
    own (a stale copy would pair the Hessian of replicate 1 with the inputs of replicate 0); the kept products stay
    within ``max_bytes``."""
    prob, theta = _problem("softmax", "gelu", 3, 3, 1.0, n=301, R=2, S=3)
    fresh, _ = _problem("softmax", "gelu", 3, 3, 1.0, n=301, R=2, S=3)
    first = prob.gauss_newton(theta, exact=True)
    formed = []
    real = _pair_products
    monkeypatch.setattr("moestat.fit._objective._pair_products", lambda rows: formed.append(rows.shape) or real(rows))
    again = prob.gauss_newton(theta, exact=True)
    assert all(shape[-2] == 2 * prob.kernel.k for shape in formed)  # only the rows of u: the inputs' were kept
    for a, b_ in zip(first, again, strict=True):
        assert torch.equal(a, b_)
    idx = torch.tensor([3, 4])  # both of replicate 1: the same number of groups as the full set, other inputs
    prob.set_active(idx)
    fresh.set_active(idx)
    fresh._input_pairs.clear()
    for a, b_ in zip(prob.gauss_newton(theta[idx], exact=True), fresh.gauss_newton(theta[idx], exact=True),
                     strict=True):
        assert torch.equal(a, b_)
    budget = 30_000  # several chunks of 301 observations; only some of their pair products fit
    prob.set_active(torch.arange(6))
    prob.gauss_newton(theta, exact=True, max_bytes=budget)
    kept = sum(v.numel() * v.element_size() for v in prob._input_pairs.values())
    assert 0 < kept <= budget
    assert len(prob._input_pairs) < len(range(0, prob.n, prob._hessian_chunk(2, 3, budget, True, 8)))
