r"""Batched optimisers for a batch of independent least-squares problems.

Every optimiser works on a flat parameter tensor of shape (A, P): one row per problem (replicate x
restart).  Per-problem state (step sizes, curvature pairs, damping) lives in tensors with the same
leading axis, and each problem has its own convergence test.  A problem that has converged is
*frozen*: its result is written out and it is removed from the active set, so later iterations cost
only what the remaining problems need (:meth:`LSProblem.set_active` gathers their data once).

* :func:`lbfgs` — full-batch limited-memory BFGS (Nocedal & Wright 2006, Alg. 7.5; the direction by the
  two-loop recursion or the compact representation, :func:`lbfgs_direction`) with a backtracking Armijo
  line search (safeguarded quadratic interpolation), box constraints by projection along the search
  path and a projected gradient (coordinates at a bound whose gradient points outward are held);
  curvature pairs with :math:`s^\top y \le 10^{-10}\|s\|\|y\|`
  are skipped.
* :func:`adam` — full-batch Adam (Kingma & Ba 2015) with projection.
* :func:`sgd_protocol` — the papers' protocol (nguyen2024 §4): plain minibatch SGD, fixed epochs,
  learning rate and batch size, a fresh random permutation per epoch and problem; no convergence test.
* :func:`levenberg_marquardt` — Gauss-Newton with Levenberg-Marquardt damping (Moré 1978 scaling
  :math:`D = \max_{\text{iter}} \mathrm{diag}(J^\top J)`, Nielsen's damping update), one batched
  Cholesky solve per iteration, projection onto the box.
* :func:`newton` — trust-region Newton with the exact Hessian (:meth:`LSProblem.gauss_newton` with
  ``exact=True``), damped like LM; it certifies a stop with the gradient tolerance, and the caller checks the
  Hessian's smallest eigenvalue at the end (a saddle is not a minimum).

Convergence (per problem): ``gtol`` — sup-norm of the projected gradient :math:`\le` ``gtol``;
``ftol`` — relative decrease :math:`(L_{k} - L_{k+1}) \le \mathrm{tol}\cdot\max(|L_k|, |L_{k+1}|)`;
``xtol`` (LM only) — :math:`\|\delta\| \le 10^{-15}(\|\theta\| + 10^{-15})`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .._random import randperm
from . import _native
from ._objective import LSProblem, MeanKernel, per_problem_on_cpu

STATUS = {0: "running", 1: "gtol", 2: "ftol", 3: "xtol", 4: "max_iter", 5: "line_search",
          6: "damping", 7: "budget", 8: "saddle", 9: "stall", 10: "kink"}
"""Status codes of a problem; 1-3 and 10 count as converged (10: a stop at a kink of a piecewise-smooth objective
certified by :func:`moestat.fit.lse.fit_lse`)."""
CONVERGED = (1, 2, 3, 10)


@dataclass
class OptimResult:
    """Per-problem results of a batched optimisation (all tensors have leading size B)."""

    theta: torch.Tensor
    loss: torch.Tensor
    grad_norm: torch.Tensor
    n_iter: torch.Tensor
    status: torch.Tensor
    history: list = field(default_factory=list)
    n_evals: int = 0

    @property
    def converged(self) -> torch.Tensor:
        return torch.isin(self.status, torch.tensor(CONVERGED, device=self.status.device))


def concat_results(parts: list[tuple[int, OptimResult]]) -> OptimResult:
    """Join the results of consecutive blocks of problems; ``parts`` holds (offset, result) pairs."""
    res = [r for _, r in parts]
    history = [(it, act + off, f, g) for off, r in parts for it, act, f, g in r.history]
    return OptimResult(torch.cat([r.theta for r in res]), torch.cat([r.loss for r in res]),
                       torch.cat([r.grad_norm for r in res]), torch.cat([r.n_iter for r in res]),
                       torch.cat([r.status for r in res]), history, sum(r.n_evals for r in res))


class _Tracker:
    """Bookkeeping shared by the optimisers: global results, the active set, history, progress."""

    def __init__(self, problem: LSProblem | ClosureProblem, theta: torch.Tensor, max_iter: int, history: bool,
                 progress: bool, desc: str) -> None:
        B = theta.shape[0]
        dev = theta.device
        self.problem = problem
        self.res = OptimResult(theta.clone(), torch.full((B,), float("nan"), dtype=theta.dtype, device=dev),
                               torch.full((B,), float("nan"), dtype=theta.dtype, device=dev),
                               torch.zeros(B, dtype=torch.long, device=dev),
                               torch.zeros(B, dtype=torch.long, device=dev))
        self.keep_history = history
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=max_iter, desc=desc, leave=False)

    @property
    def active(self) -> torch.Tensor:
        return self.problem.active

    def record(self, it: int, loss: torch.Tensor, gnorm: torch.Tensor) -> None:
        if self.keep_history:
            self.res.history.append((it, self.active.clone(), loss.detach().clone(), gnorm.detach().clone()))
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(active=int(self.active.numel()))

    def finish(self, done: torch.Tensor, status: torch.Tensor, theta: torch.Tensor, loss: torch.Tensor,
               gnorm: torch.Tensor, n_iter: torch.Tensor | int) -> torch.Tensor:
        """Write out the problems flagged in ``done`` (local mask); return the mask of those kept.  ``n_iter`` is
        per problem, or one count when every active problem has taken the same number of iterations."""
        idx = self.active[done]
        r = self.res
        r.theta[idx], r.loss[idx], r.grad_norm[idx] = theta[done], loss[done], gnorm[done]
        r.n_iter[idx], r.status[idx] = n_iter if isinstance(n_iter, int) else n_iter[done], status[done]
        keep = ~done
        if bool(done.any()) and bool(keep.any()):
            self.problem.set_active(self.active[keep])
        return keep

    def close(self) -> OptimResult:
        if self.bar is not None:
            self.bar.close()
        self.problem.set_active(torch.arange(self.res.theta.shape[0], device=self.res.theta.device))
        self.res.n_evals = self.problem.n_evals
        return self.res


class ClosureProblem:
    r"""A batch of ``B`` independent smooth minimisations given by a closure, for the optimisers here.

    ``f(x, rows)`` maps the parameters ``x`` (A, P) of the problems ``rows`` (A,) (global indices of
    the active problems) to their values (A,); gradients come from autograd.  There is no box:
    projection is the identity.  The likelihood engine (:func:`moestat.fit_mle`) minimises the
    negative log-likelihood through it, so both engines share one L-BFGS (:func:`lbfgs`).
    """

    def __init__(self, f, B: int, device: torch.device | str) -> None:
        self.f = f
        self.n_evals = 0
        self.active = torch.arange(B, device=device)

    def set_active(self, idx: torch.Tensor) -> None:
        self.active = idx

    def value_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.n_evals += 1
        with torch.enable_grad():
            xv = x.detach().requires_grad_(True)
            fx = self.f(xv, self.active)
            (g,) = torch.autograd.grad(fx.sum(), xv)
        return fx.detach(), g.detach()

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def projected_gradient(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return g


class AnalyticProblem(ClosureProblem):
    """A :class:`ClosureProblem` whose closure computes the gradients itself: ``f(x, rows)`` returns the values
    (A,) and their gradients (A, P), and no autograd graph is recorded."""

    def value_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.n_evals += 1
        return self.f(x.detach(), self.active)


def _gnorm(g: torch.Tensor) -> torch.Tensor:
    return g.abs().amax(1)


def _gradient(problem: LSProblem, theta: torch.Tensor, b: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Sup-norm of the projected gradient :math:`2b` of each problem, with the full gradient ``g`` (zeros on the
    fixed coordinates) and its projection ``gp`` when ``problem`` has a box; without one ``g`` and ``gp`` are None and
    the norm is that of :math:`2b` itself (the same number: fixed coordinates add zeros to a maximum of absolute
    values), two tensor operations fewer per iteration."""
    if problem.lower is None:
        return _gnorm(2.0 * b), None, None
    g = torch.zeros_like(theta)
    g[:, problem.free_idx] = 2.0 * b
    gp = problem.projected_gradient(theta, g)
    return _gnorm(gp), g, gp


def _rel_decrease_small(f_old: torch.Tensor, f_new: torch.Tensor, tol: float) -> torch.Tensor:
    scale = torch.maximum(f_old.abs(), f_new.abs()).clamp_min(torch.finfo(f_old.dtype).tiny)
    return (f_old - f_new) <= tol * scale



def _finish_stopped(tr, it: int, max_iter: int, gn: torch.Tensor, gtol: float, theta: torch.Tensor,
                    f: torch.Tensor, n_iter: torch.Tensor | int,
                    extra: Sequence[tuple[torch.Tensor, int]] = ()) -> torch.Tensor | None:
    """Record the problems that stop at this iteration; return the mask of those that go on.

    Status 1: projected-gradient norm <= ``gtol``; ``extra``, pairs (mask, status) in order of precedence, adds
    optimiser-specific stops; 4: the iteration cap.  Returns None when no problem stopped.  The status vector is
    built only when some problem stops: the test itself is one mask and one reduction.
    """
    converged = gn <= gtol
    done = converged
    for mask, _ in extra:
        done = done | mask
    if it < max_iter and not bool(done.any()):
        return None
    status = torch.full_like(gn, 4 if it == max_iter else 0, dtype=torch.long)
    for mask, code in reversed(extra):
        status = torch.where(mask, code, status)  # torch.where, not a masked write: that would wait for a GPU
    status = torch.where(converged, 1, status)
    return tr.finish(status > 0, status, theta, f, gn, n_iter)

_COMPACT_MAX_ELEMS = 32_768  # A * m * P up to which the compact form beats the two-loop recursion on CPU


def lbfgs_direction(g: torch.Tensor, Sh: torch.Tensor, Yh: torch.Tensor, rho: torch.Tensor, gamma: torch.Tensor,
                    ptr: int) -> torch.Tensor:
    r"""The L-BFGS product :math:`H g` for every problem (A problems, m stored pairs, P parameters).

    Two exact evaluations of the same product, picked by size: the two-loop recursion (Nocedal &
    Wright 2006, Alg. 7.4; 4m vector operations of size A x P) for large batches, and the compact
    representation (:func:`_compact_direction`; a fixed dozen operations) when
    :math:`A m P \le 32768`, where the two-loop's per-operation overhead dominates (measured on
    CPU: 5 problems x 20 pairs x 11 parameters, 0.73 ms vs 0.15 ms; 20 x 10 x 594, 0.73 ms vs 2.6 ms).

    Parameters
    ----------
    g : (A, P); Sh, Yh : (A, m, P) ring buffers; rho : (A, m) with :math:`1/s^\top y`, or 0 for an
    empty, skipped or reset slot (a no-op); gamma : (A,) the initial scaling :math:`H_0 = \gamma I`;
    ptr : the slot the next pair will overwrite (the oldest pair).
    """
    if Sh.numel() <= _COMPACT_MAX_ELEMS:
        return _compact_direction(g, Sh, Yh, rho, gamma, ptr)
    m = Sh.shape[1]
    q = g.clone()
    order = [(ptr - 1 - j) % m for j in range(m)]  # newest first
    alphas = []
    for j in order:
        a = rho[:, j] * (Sh[:, j] * q).sum(1)
        q.sub_(a.unsqueeze(1) * Yh[:, j])
        alphas.append(a)
    q.mul_(gamma.unsqueeze(1))
    for j, a in zip(reversed(order), reversed(alphas), strict=True):
        b = rho[:, j] * (Yh[:, j] * q).sum(1)
        q.add_(Sh[:, j] * (a - b).unsqueeze(1))
    return q


def _compact_direction(g: torch.Tensor, Sh: torch.Tensor, Yh: torch.Tensor, rho: torch.Tensor, gamma: torch.Tensor,
                       ptr: int) -> torch.Tensor:
    r""":math:`H g` by the compact representation (Byrd, Nocedal & Schnabel 1994, eq. 2.6), :math:`H_0 = \gamma I`:

    .. math:: H g = \gamma g + S p - \gamma Y v,\quad v = R^{-1} S^\top g,\quad
              p = R^{-\top}\big((D + \gamma Y^\top Y) v - \gamma Y^\top g\big),

    with the stored pairs as the columns of S and Y in chronological order,
    :math:`R_{ij} = s_i^\top y_j` for :math:`i \le j` (upper triangular) and
    :math:`D = \mathrm{diag}(s_i^\top y_i)`.  A slot with ``rho == 0`` acts as a zero pair, which
    decouples from the others (its diagonal entry of R is set to 1).  Arguments as :func:`lbfgs_direction`.
    """
    m = Sh.shape[1]
    order = [(ptr + j) % m for j in range(m)]  # oldest first
    valid = (rho[:, order] != 0).unsqueeze(-1)
    S = Sh[:, order] * valid
    Y = Yh[:, order] * valid
    SY = torch.bmm(S, Y.transpose(1, 2))
    R = torch.triu(SY)
    R.diagonal(dim1=1, dim2=2).add_((~valid.squeeze(-1)).to(R.dtype))
    gam = gamma.unsqueeze(-1)
    Sg = torch.bmm(S, g.unsqueeze(-1))
    Yg = torch.bmm(Y, g.unsqueeze(-1))
    v = torch.linalg.solve_triangular(R, Sg, upper=True)
    inner = torch.bmm(Y, Y.transpose(1, 2)).mul_(gam.unsqueeze(-1))
    inner.diagonal(dim1=1, dim2=2).add_(SY.diagonal(dim1=1, dim2=2))
    p = torch.linalg.solve_triangular(R.transpose(1, 2), torch.bmm(inner, v) - gam.unsqueeze(-1) * Yg, upper=False)
    return gam * g + torch.bmm(S.transpose(1, 2), p).squeeze(-1) - gam * torch.bmm(Y.transpose(1, 2), v).squeeze(-1)


def lbfgs(problem: LSProblem | ClosureProblem, theta: torch.Tensor, *, max_iter: int = 1000, tol: float = 1e-12,
          gtol: float = 1e-10, memory: int = 10, max_ls: int = 30, c1: float = 1e-4,
          history: bool = False, progress: bool = False) -> OptimResult:
    """Batched L-BFGS with a backtracking line search and box projection (see module docstring)."""
    tr = _Tracker(problem, theta, max_iter, history, progress, "L-BFGS")
    theta = problem.project(theta.clone())
    A, P = theta.shape
    dt, dev = theta.dtype, theta.device
    f, g = problem.value_grad(theta)
    Sh = torch.zeros(A, memory, P, dtype=dt, device=dev)
    Yh = torch.zeros_like(Sh)
    rho = torch.zeros(A, memory, dtype=dt, device=dev)
    gamma = torch.ones(A, dtype=dt, device=dev)
    has_hist = torch.zeros(A, dtype=torch.bool, device=dev)
    ptr = 0
    # Every active problem takes one iteration per pass, so the iteration count is the pass number: ``it``.
    for it in range(max_iter + 1):
        gp = problem.projected_gradient(theta, g)
        gn = _gnorm(gp)
        tr.record(it, f, gn)
        keep = _finish_stopped(tr, it, max_iter, gn, gtol, theta, f, it)
        if keep is not None:
            if not bool(keep.any()):
                break
            theta, f, g, gp = theta[keep], f[keep], g[keep], gp[keep]
            Sh, Yh, rho, gamma, has_hist = Sh[keep], Yh[keep], rho[keep], gamma[keep], has_hist[keep]
            A = theta.shape[0]
        q = lbfgs_direction(gp, Sh, Yh, rho, gamma, ptr)
        d = -q
        d.masked_fill_(gp == 0, 0.0)
        gd = (d * gp).sum(1)
        bad = ~(gd < 0)
        if bool(bad.any()):
            d[bad] = -gp[bad]
            rho[bad] = 0.0
            gamma[bad] = 1.0
            has_hist[bad] = False
            gd = (d * gp).sum(1)
        t = torch.where(has_hist, 1.0, (1.0 / d.norm(dim=1)).clamp(max=1.0))
        new_theta, new_f, new_g, failed = _line_search(problem, theta, f, g, gp, d, gd, t, max_ls, c1)
        s = new_theta - theta
        yv = new_g - g
        sy = (s * yv).sum(1)
        curv = sy > 1e-10 * s.norm(dim=1) * yv.norm(dim=1)
        small = _rel_decrease_small(f, new_f, tol)
        if failed is not None:
            curv, small = curv & ~failed, small & ~failed
        Sh[:, ptr] = s * curv.unsqueeze(1)
        Yh[:, ptr] = yv * curv.unsqueeze(1)
        rho[:, ptr] = torch.where(curv, 1.0 / torch.where(curv, sy, 1.0), 0.0)
        gamma = torch.where(curv, sy / (yv * yv).sum(1).clamp_min(torch.finfo(dt).tiny), gamma)
        has_hist |= curv
        ptr = (ptr + 1) % memory
        theta, f, g = new_theta, new_f, new_g
        status = torch.where(small, 2, 0) if failed is None else torch.where(failed, 5, torch.where(small, 2, 0))
        done = status > 0
        if bool(done.any()):
            gn = _gnorm(problem.projected_gradient(theta, g))
            keep = tr.finish(done, status, theta, f, gn, it + 1)
            if not bool(keep.any()):
                break
            theta, f, g = theta[keep], f[keep], g[keep]
            Sh, Yh, rho, gamma, has_hist = Sh[keep], Yh[keep], rho[keep], gamma[keep], has_hist[keep]
            A = theta.shape[0]
    return tr.close()


def _line_search(problem: LSProblem | ClosureProblem, theta: torch.Tensor, f: torch.Tensor, g: torch.Tensor,
                 gp: torch.Tensor, d: torch.Tensor, gd: torch.Tensor, t: torch.Tensor, max_ls: int, c1: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    r"""Batched backtracking line search of :func:`lbfgs` along ``d`` from the first steps ``t``: a trial point
    :math:`\theta_t` is accepted when its objective is finite and meets Armijo's condition
    :math:`L(\theta_t) \le L(\theta) + c_1\,g_p^\top(\theta_t - \theta)`; a problem whose trial fails steps back by
    safeguarded quadratic interpolation of :math:`\varphi(t) = L(\theta + t d)` (within :math:`[0.1t, 0.5t]`).

    Returns the accepted points, objectives and gradients (a problem that accepted nothing keeps its own) and the
    mask of the problems whose search failed, or None when none did.  When every problem accepts its first trial
    (always, once L-BFGS has a good model), the trial's tensors are returned as they are."""
    if max_ls < 1:  # no trial at all: every search fails
        return theta.clone(), f.clone(), g.clone(), torch.ones_like(f, dtype=torch.bool)
    new_theta = new_f = new_g = pending = None  # copies made only when some problem refuses its first trial
    for ls in range(max_ls):
        trial = problem.project(theta + t.unsqueeze(1) * d)
        ft, gt = problem.value_grad(trial)
        decrease = (gp * (trial - theta)).sum(1)
        finite = ft.abs() < math.inf  # torch.isfinite in two operations instead of four
        ok = finite & (ft <= f + c1 * decrease)
        if pending is not None:
            ok &= pending
        n_ok = int(ok.sum())
        if ls == 0 and n_ok == ok.numel():
            return trial, ft, gt, None
        if new_theta is None:
            new_theta, new_f, new_g = theta.clone(), f.clone(), g.clone()
        if n_ok:
            new_theta[ok], new_f[ok], new_g[ok] = trial[ok], ft[ok], gt[ok]
        pending = ~ok if pending is None else pending & ~ok
        if not bool(pending.any()):
            break
        denom = 2.0 * (ft - f - t * gd)
        t_q = torch.where(finite & (denom > 0), -gd * t * t / denom, 0.1 * t)
        t = torch.where(pending, torch.minimum(torch.maximum(t_q, 0.1 * t), 0.5 * t), t)
    assert new_theta is not None and new_f is not None and new_g is not None
    return new_theta, new_f, new_g, pending


def adam(problem: LSProblem, theta: torch.Tensor, *, lr: float = 1e-2, max_iter: int = 1000,
         gtol: float = 1e-10, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-12,
         history: bool = False, progress: bool = False) -> OptimResult:
    """Batched full-batch Adam with projection; stops per problem on ``gtol`` or after ``max_iter`` steps."""
    tr = _Tracker(problem, theta, max_iter, history, progress, "Adam")
    theta = problem.project(theta.clone())
    b1, b2 = betas
    m = torch.zeros_like(theta)
    v = torch.zeros_like(theta)
    A = theta.shape[0]
    n_iter = torch.zeros(A, dtype=torch.long, device=theta.device)
    for it in range(max_iter + 1):
        f, g = problem.value_grad(theta)
        gp = problem.projected_gradient(theta, g)
        gn = _gnorm(gp)
        tr.record(it, f, gn)
        keep = _finish_stopped(tr, it, max_iter, gn, gtol, theta, f, n_iter)
        if keep is not None:
            if not bool(keep.any()):
                break
            theta, g, m, v, n_iter = theta[keep], g[keep], m[keep], v[keep], n_iter[keep]
            A = theta.shape[0]
        n_iter += 1
        step = it + 1
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        mhat = m / (1 - b1**step)
        vhat = v / (1 - b2**step)
        theta = problem.project(theta - lr * mhat / (vhat.sqrt() + eps))
    return tr.close()


def sgd_protocol(problem: LSProblem, theta: torch.Tensor, *, epochs: int = 10, lr: float = 0.1,
                 batch_size: int = 32, gtol: float = 1e-10, generators: Sequence[torch.Generator],
                 history: bool = False, progress: bool = False) -> OptimResult:
    r"""The papers' procedure: plain minibatch SGD for a fixed number of epochs (nguyen2024 §4, App. C).

    Each epoch draws a fresh permutation of the n observations per problem — from that problem's own
    generator in ``generators`` (one per problem, so a problem's minibatches do not depend on which
    other problems share the batched program) — and takes
    :math:`\lceil n / \text{batch\_size}\rceil` steps :math:`\theta \leftarrow \Pi(\theta - \text{lr}\,
    \nabla L_{\text{batch}}(\theta))`.  There is no convergence test; the status is ``"budget"``
    unless the full-batch gradient at the end is below ``gtol``.
    """
    tr = _Tracker(problem, theta, epochs, history, progress, "SGD")
    theta = problem.project(theta.clone())
    A, n = theta.shape[0], problem.n
    X, y = problem.X, problem.y
    reps = problem.rep_of[problem.active]
    gens = list(generators)
    if len(gens) != A:
        raise ValueError(f"generators must hold one generator per problem ({A}), got {len(gens)}.")
    n_steps = 0
    for ep in range(epochs):
        if history:
            f, g = problem.value_grad(theta)
            tr.record(ep, f, _gnorm(problem.projected_gradient(theta, g)))
        elif tr.bar is not None:
            tr.bar.update(1)
        perm = randperm(gens, n, device=theta.device)
        for lo in range(0, n, batch_size):
            idx = perm[:, lo : lo + batch_size]
            Xb = X[reps.unsqueeze(1), idx]
            yb = y[reps.unsqueeze(1), idx]
            _, g = problem.value_grad_on(theta, Xb, yb)
            theta = problem.project(theta - lr * g)
            n_steps += 1
    f, g = problem.value_grad(theta)
    gn = _gnorm(problem.projected_gradient(theta, g))
    tr.record(epochs, f, gn)
    status = torch.where(gn <= gtol, 1, 7)
    tr.finish(torch.ones(A, dtype=torch.bool, device=theta.device), status, theta, f, gn,
              torch.full((A,), n_steps, dtype=torch.long, device=theta.device))
    return tr.close()


def _damped_solve(H: torch.Tensor, b: torch.Tensor, lam: torch.Tensor, Dreg: torch.Tensor, tries: int,
                  per_problem: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Solve :math:`(H + \lambda\,\mathrm{diag}(D))\delta = -b` by Cholesky for a batch (H (A, F, F), b (A, F)),
    raising each problem's :math:`\lambda` tenfold (up to ``tries`` times) while its matrix is not positive
    definite.  Returns ``(delta, lam)``; a step that stays undefined is 0.

    On a CPU a large batch is factored and solved one problem at a time: each F x F matrix then stays in cache,
    where the batched LAPACK calls copy all A of them to column-major scratch and back (A = 20, F = 594: 2.4 ms per
    problem against 8.5 ms, the same bits; ``benchmarks/lse_batch_profile.py --parts step``).  On a GPU one batched call
    factors all problems, and only those whose factorisation failed are factored again; so does a CPU for a batch
    of at most :data:`~moestat.fit._objective.CPU_PER_PROBLEM_BYTES` (small problems: one call beats a loop, A =
    200, F = 18: 0.27 ms against 3.4 ms).  ``per_problem`` picks the path (default: by device and size).
    """
    if per_problem is None:
        per_problem = per_problem_on_cpu(H)
    raised = False  # lam is copied before its first change, which few calls make
    if per_problem:
        delta = torch.empty_like(b)
        for a in range(H.shape[0]):
            for _ in range(tries):
                M = H[a].clone()
                M.diagonal().add_(lam[a] * Dreg[a])
                L, info = torch.linalg.cholesky_ex(M)
                if int(info) == 0:
                    break
                if not raised:
                    lam, raised = lam.clone(), True
                lam[a] *= 10.0
            delta[a] = torch.cholesky_solve(-b[a].unsqueeze(-1), L).squeeze(-1)
    else:
        M = H.clone()
        M.diagonal(dim1=1, dim2=2).add_(lam.unsqueeze(1) * Dreg)
        L, info = torch.linalg.cholesky_ex(M)
        for attempt in range(tries):
            bad = torch.nonzero(info > 0).squeeze(1)
            if bad.numel() == 0:
                break
            if not raised:
                lam, raised = lam.clone(), True
            lam[bad] *= 10.0
            if attempt == tries - 1:
                break
            Mb = H[bad]
            Mb.diagonal(dim1=1, dim2=2).add_(lam[bad].unsqueeze(1) * Dreg[bad])
            L[bad], info[bad] = torch.linalg.cholesky_ex(Mb)
        delta = torch.cholesky_solve(-b.unsqueeze(-1), L).squeeze(-1)
    return torch.nan_to_num(delta, nan=0.0, posinf=0.0, neginf=0.0), lam


def _damped_trial(problem: LSProblem, theta: torch.Tensor, fidx: torch.Tensor, H: torch.Tensor, b: torch.Tensor,
                  lam: torch.Tensor, Dreg: torch.Tensor, tries: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""One damped step of LM and Newton: solve :math:`(H + \lambda\,\mathrm{diag}(D))\delta = -b`
    (:func:`_damped_solve`), then project the trial point onto the box.  Returns ``(trial, delta, F(trial),
    lam)`` with ``delta`` the projected step on the free coordinates ``fidx``."""
    delta, lam = _damped_solve(H, b, lam, Dreg, tries)
    if fidx.numel() == theta.shape[1]:
        trial = problem.project(theta + delta)
        return trial, trial - theta, problem.value(trial), lam
    trial = problem.project(theta.index_add(1, fidx, delta))
    return trial, (trial - theta).index_select(1, fidx), problem.value(trial), lam


def _take_accepted(accept: torch.Tensor, new: torch.Tensor, old: torch.Tensor, n_accepted: int) -> torch.Tensor:
    """``torch.where(accept, new, old)`` along the first axis, writing the rejected problems' rows into ``new``
    (few, usually none) instead of allocating a third batch of F x F matrices; ``old`` is then free, and the
    optimisers hand it to the next :meth:`LSProblem.gauss_newton` as its output buffer (which ignores it once
    the active set, and so the shape, has changed)."""
    if n_accepted == accept.numel():
        return new
    rejected = torch.nonzero(~accept).squeeze(1)
    new[rejected] = old[rejected]
    return new


def _where_rows(accept: torch.Tensor, new: torch.Tensor, old: torch.Tensor, n_accepted: int) -> torch.Tensor:
    """``torch.where(accept, new, old)`` along the first axis, skipped when every problem took its step."""
    if n_accepted == accept.numel():
        return new
    return torch.where(accept.view(-1, *([1] * (new.dim() - 1))), new, old)


def _gain_accepts(pred: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    r"""Which trial points the damped methods accept: predicted decrease ``pred`` > 0 and gain ratio
    :math:`\rho = (L - L_{\rm trial})/\text{pred}` > 0.  A trial objective that is NaN or :math:`+\infty` gives
    :math:`\rho` NaN or :math:`-\infty` and is refused by the second test; the objective, a mean of squares, is
    never :math:`-\infty`, so no separate finiteness test is needed."""
    return (pred > 0) & (rho > 0)


def levenberg_marquardt(problem: LSProblem, theta: torch.Tensor, *, max_iter: int = 200, tol: float = 1e-12,
                        gtol: float = 1e-10, xtol: float = 1e-15, damping: float = 1e-3,
                        history: bool = False, progress: bool = False) -> OptimResult:
    r"""Batched Gauss-Newton / Levenberg-Marquardt on the free coordinates.

    Each iteration builds :math:`H = J^\top J/n` and :math:`b = J^\top r/n` for every active problem,
    solves :math:`(H + \lambda D)\delta = -b` with a batched Cholesky factorisation (raising
    :math:`\lambda` where the factorisation fails), projects the trial point onto the box and accepts
    it when the gain ratio :math:`\rho = (L - L_{\text{trial}}) / (\lambda\delta^\top D\delta - \delta^\top b)`
    is positive.  Damping: :math:`\lambda \leftarrow \lambda\max(1/3, 1 - (2\rho - 1)^3)` on success,
    :math:`\lambda \leftarrow \lambda\nu,\ \nu \leftarrow 2\nu` on failure (Nielsen 1999).
    """
    tr = _Tracker(problem, theta, max_iter, history, progress, "LM")
    theta = problem.project(theta.clone())
    A = theta.shape[0]
    dt, dev = theta.dtype, theta.device
    fidx = problem.free_idx
    lam = torch.full((A,), damping, dtype=dt, device=dev)
    nu = torch.full((A,), 2.0, dtype=dt, device=dev)
    f, H, b = problem.gauss_newton(theta)
    spare = None  # the Hessian batch of the last accepted step, reused as the next one's output
    D = torch.diagonal(H, dim1=1, dim2=2).clone()
    # Every active problem takes one iteration per pass, so the iteration count is the pass number: ``it``.
    for it in range(max_iter + 1):
        gn = _gradient(problem, theta, b)[0]
        tr.record(it, f, gn)
        keep = _finish_stopped(tr, it, max_iter, gn, gtol, theta, f, it, extra=[(lam > 1e16, 6)])
        if keep is not None:
            if not bool(keep.any()):
                break
            theta, f, H, b, D, lam, nu = theta[keep], f[keep], H[keep], b[keep], D[keep], lam[keep], nu[keep]
        D = torch.maximum(D, torch.diagonal(H, dim1=1, dim2=2))
        Dreg = D + torch.finfo(dt).eps * D.amax(1, keepdim=True).clamp_min(torch.finfo(dt).tiny)
        trial, delta, ft, lam = _damped_trial(problem, theta, fidx, H, b, lam, Dreg, tries=8)
        pred = lam * (delta * Dreg * delta).sum(1) - (delta * b).sum(1)
        rho = (f - ft) / pred
        accept = _gain_accepts(pred, rho)
        lam = torch.where(accept, lam * torch.clamp(1 - (2 * rho - 1) ** 3, min=1.0 / 3.0), lam * nu)
        nu = torch.where(accept, 2.0, nu * 2.0)
        n_accepted = int(accept.sum())
        if not n_accepted:
            continue  # no step taken, so neither small-step test can hold
        small_f = accept & _rel_decrease_small(f, ft, tol)
        small_x = accept & (delta.norm(dim=1) <= xtol * (theta.norm(dim=1) + xtol))
        theta = _where_rows(accept, trial, theta, n_accepted)
        f = _where_rows(accept, ft, f, n_accepted)
        _, H_new, b_new = problem.gauss_newton(theta, out=spare)
        H, spare = _take_accepted(accept, H_new, H, n_accepted), H
        b = _where_rows(accept, b_new, b, n_accepted)
        status = torch.where(small_f, 2, torch.where(small_x, 3, 0))
        done = status > 0
        if bool(done.any()):
            gn = _gradient(problem, theta, b)[0]
            keep = tr.finish(done, status, theta, f, gn, it + 1)
            if not bool(keep.any()):
                break
            theta, f, H, b, D, lam, nu = theta[keep], f[keep], H[keep], b[keep], D[keep], lam[keep], nu[keep]
    return tr.close()


def newton(problem: LSProblem, theta: torch.Tensor, *, max_iter: int = 200, gtol: float = 1e-10,
           damping: float = 1e-3, stall_window: int = 20, stall_tol: float = 1e-14, history: bool = False,
           progress: bool = False) -> OptimResult:
    r"""Batched trust-region Newton method with the exact Hessian, on the free coordinates.

    Each iteration forms the exact :math:`H` (half the Hessian of the objective) and :math:`b` (half the
    gradient) from the Kronecker pair products (:meth:`LSProblem.gauss_newton`, ``exact=True``), solves
    :math:`(H + \lambda D)\delta = -b` by a batched Cholesky factorisation — raising :math:`\lambda` until
    :math:`H + \lambda D` is positive definite, so negative curvature is never stepped along blindly — and
    accepts the projected trial point when the gain ratio
    :math:`\rho = (L - L_{\rm trial}) / (-2b^\top\delta - \delta^\top H\delta)` is positive.
    :math:`D` is the running maximum of :math:`|\mathrm{diag}\,H|` (Moré's scaling) and :math:`\lambda`
    follows Nielsen's update (as :func:`levenberg_marquardt`).  Near a non-degenerate minimum
    :math:`\lambda \to 0` and the step is the Newton step: convergence is quadratic, so the gradient
    tolerance is met in a few iterations where Gauss-Newton (which drops the residual-curvature term
    :math:`\sum_t r_t \nabla^2 f_t`) converges linearly or stalls.

    Stops per problem: ``gtol`` (sup-norm of the projected gradient, the only converged status here),
    ``max_iter``, ``damping`` (:math:`\lambda > 10^{16}`: no step decreases the objective at working
    precision) and ``stall`` (the objective fell by at most ``stall_tol`` relative over the last
    ``stall_window`` iterations).  Objectives with kinks (relu experts) end on ``damping`` or ``stall`` at a
    non-smooth local minimum, where no gradient tolerance can be met; the caller certifies such stops
    (status ``kink``).  Coordinates on an active box bound whose gradient points outward are held for the step.
    """
    tr = _Tracker(problem, theta, max_iter, history, progress, "Newton")
    theta = problem.project(theta.clone())
    A = theta.shape[0]
    dt, dev = theta.dtype, theta.device
    fidx = problem.free_idx
    lam = torch.full((A,), damping, dtype=dt, device=dev)
    nu = torch.full((A,), 2.0, dtype=dt, device=dev)
    f, H, b = problem.gauss_newton(theta, exact=True)
    spare = None  # the Hessian batch of the last accepted step, reused as the next one's output
    D = torch.diagonal(H, dim1=1, dim2=2).abs()
    past = [f]  # objectives of the last stall_window iterations (oldest first); f is never changed in place
    # Every active problem takes one iteration per pass, so the iteration count is the pass number: ``it``.
    for it in range(max_iter + 1):
        gn, g, gp = _gradient(problem, theta, b)
        held = None if g is None else (gp[:, fidx] == 0) & (g[:, fidx] != 0)  # blocked by the box: no step along these
        tr.record(it, f, gn)
        extra = [(lam > 1e16, 6)]
        if len(past) > stall_window:  # f, a mean of squares, is >= 0 or NaN: its own absolute value
            extra.append(((past[0] - f) <= stall_tol * f.clamp_min(torch.finfo(dt).tiny), 9))
        keep = _finish_stopped(tr, it, max_iter, gn, gtol, theta, f, it, extra=extra)
        if keep is not None:
            if not bool(keep.any()):
                break
            theta, f, H, b, D, lam, nu = theta[keep], f[keep], H[keep], b[keep], D[keep], lam[keep], nu[keep]
            held = None if held is None else held[keep]
            past = [v[keep] for v in past]
        D = torch.maximum(D, torch.diagonal(H, dim1=1, dim2=2).abs())
        Dreg = D + torch.finfo(dt).eps * D.amax(1, keepdim=True).clamp_min(torch.finfo(dt).tiny)
        Hs, bs = H, b
        if held is not None and (dev.type != "cpu" or bool(held.any())):  # on a GPU masking is cheaper than asking
            keepc = (~held).to(dt)
            Hs = H * keepc.unsqueeze(1) * keepc.unsqueeze(2) + torch.diag_embed(held.to(dt))
            bs = b * keepc
        trial, delta, ft, lam = _damped_trial(problem, theta, fidx, Hs, bs, lam, Dreg, tries=40)
        pred = -2.0 * (delta * b).sum(1) - (delta * torch.bmm(H, delta.unsqueeze(-1)).squeeze(-1)).sum(1)
        rho = (f - ft) / pred
        accept = _gain_accepts(pred, rho)
        lam = torch.where(accept, (lam * torch.clamp(1 - (2 * rho - 1) ** 3, min=1.0 / 3.0)).clamp_min(1e-12),
                          lam * nu)
        nu = torch.where(accept, 2.0, nu * 2.0)
        n_accepted = int(accept.sum())
        if n_accepted:
            theta = _where_rows(accept, trial, theta, n_accepted)
            f_new, H_new, b_new = problem.gauss_newton(theta, exact=True, out=spare)
            f = _where_rows(accept, f_new, f, n_accepted)
            H, spare = _take_accepted(accept, H_new, H, n_accepted), H
            b = _where_rows(accept, b_new, b, n_accepted)
        past = [*past[-stall_window:], f]
    return tr.close()


def newton_native(problem: LSProblem, theta: torch.Tensor, module, *, max_iter: int = 200, gtol: float = 1e-10,
                  damping: float = 1e-3, stall_window: int = 20, stall_tol: float = 1e-14,
                  block_bytes: int = 2**20) -> OptimResult:
    r""":func:`newton` with each problem's whole run in C++ (``module``: :func:`moestat.fit._native.load_newton`).

    The same method, step by step: exact Hessian from the pair rows :math:`u_iu_j + rW_{ij}`, Cholesky factorisation
    of :math:`H + \lambda D` with :math:`\lambda` raised tenfold until it succeeds, held coordinates on the box,
    projection, gain ratio, Nielsen's update and the ``gtol``, ``damping``, ``stall`` and ``max_iter`` stops; the
    sums run in another order, so results agree with :func:`newton` to rounding, not bit for bit.  Each problem
    iterates with its arrays in cache and without the batch's per-iteration dispatch, which dominates small problems
    (docs/performance/lse.md).  With several torch threads the problems are shared out between them (the same
    bits as one thread).  The kernel must be a :class:`~moestat.fit._objective.MeanKernel` with a sigmoid, softmax or
    top-K gate and the data on the CPU; no history or progress bar.  ``n_evals`` of the result is the largest number of
    evaluations any problem made.
    """
    XT = problem.transposed_inputs()
    empty = theta.new_empty(0)
    lower = empty if problem.lower is None else problem.lower.to(theta.dtype)
    upper = empty if problem.upper is None else problem.upper.to(theta.dtype)
    k, gate, top_k, act, act2, tau, chunk = _native_model(problem, theta.element_size(), block_bytes)
    th, loss, gnorm, n_iter, status, evals = module.newton(
        theta, XT, problem.y, problem.free_idx, lower, upper, problem.S, k, gate, top_k, act, act2, tau, max_iter,
        gtol, damping, stall_window, stall_tol, chunk)
    return OptimResult(th, loss.to(theta.dtype), gnorm.to(theta.dtype), n_iter, status,
                       n_evals=int(evals.max()) if evals.numel() else 0)


def native_hessians(problem: LSProblem, theta: torch.Tensor, module, block_bytes: int = 2**20) -> torch.Tensor:
    r"""Half the exact Hessian (A, F, F) of the objective at ``theta`` (A, P) for the active problems of ``problem``,
    as :func:`newton_native` forms it in each iteration (``module.value_hessian``): the curvature its stopping
    problems end with, for the saddle check of :func:`moestat.fit_lse`."""
    k, gate, top_k, act, act2, tau, chunk = _native_model(problem, theta.element_size(), block_bytes)
    reps = problem.rep_of[problem.active].tolist()
    XT = problem.transposed_inputs()  # shared with newton_native's run on the same problem
    return torch.stack([module.value_hessian(theta[a], XT[r], problem.y[r], problem.free_idx,
                                             k, gate, top_k, act, act2, tau, chunk, -1, 1)[2]
                        for a, r in enumerate(reps)])


def native_block_rows(k: int, p: int, itemsize: int, block_bytes: int = 2**20) -> int:
    """Observations per block of the C++ Newton loop for k experts and p = d + 1 input columns: its work arrays in
    about ``block_bytes``."""
    mu, mx = k * (2 * k + 1), p * (p + 1) // 2
    # rows per observation: Z and r u (4k), the pair rows (mu) and input pairs (mx), and 2k + 1 more that the loop
    # held when the blocks were measured (kept: the block size sets the order of the sums, and so the bits); a
    # problem in one block also keeps its trial point's lane pass (3k + 2 rows), which stays within 1.2 block_bytes
    return max(64, block_bytes // ((6 * k + mu + mx + 1) * itemsize))


def _native_model(problem: LSProblem, itemsize: int, block_bytes: int
                  ) -> tuple[int, int, int, int, bool, float, int]:
    r"""The model arguments of the C++ Newton loop's functions: k, the gate's code and the experts it keeps, the
    activation code, whether :math:`\varphi''` is used, the temperature, and the observations per block (its work
    arrays in ``block_bytes``)."""
    kernel = problem.kernel
    assert isinstance(kernel, MeanKernel) and kernel.native_act is not None
    chunk = native_block_rows(kernel.k, problem.p, itemsize, block_bytes)
    return (kernel.k, *_native.gate_args(kernel.gate, kernel.k, kernel.top_k), kernel.native_act,
            kernel.act2 is not None, kernel.temperature, chunk)
