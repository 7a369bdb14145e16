r"""Batched Hessians and Jacobians by plain autograd, for the fitters' autograd paths and their standard errors.

Many independent problems (a replicate x restart each) share one autograd graph: problem :math:`a`'s objective
depends on its own parameters :math:`\theta_a` only, so one backward pass of the summed objective gives every
problem's gradient, and a backward pass of that gradient with a unit cotangent :math:`e_j` gives row :math:`j` of
every problem's Hessian (reverse over reverse).  :func:`hessian_rows` stacks several rows into one backward pass
(``is_grads_batched``) in chunks whose intermediates stay in cache.  :func:`hessian_chunks` never makes a chunk of a
single row: a pass with one cotangent takes other BLAS kernels than a batched one and can give other last bits,
while batched passes of any size give the same numbers, so a Hessian does not depend on the chunking.
:func:`replicate_hessians` takes one row per pass (the standard errors of ``MLEFit`` and the contaminated MoE).

Per-observation gradients (a residual Jacobian, scores, delta-method gradients) come from :func:`rowwise_gradients`:
each observation is evaluated at its own copy of its problem's parameters, so one backward pass of the summed values
gives every observation's gradient, in chunks of observations that bound the copies.

``torch.func`` (``vmap`` of ``jacrev``, ``hessian``) computes the same derivatives, but its first use in a process
imports torch's compiler (about 1 s), its vmapped Hessian pushes every row through one pass (3x slower on large
fits), and its reverse-mode Jacobian of n residuals runs n cotangents through the whole batch: time and memory
quadratic in n (a cosine-gated least-squares Newton fit at n = 2,000 spent 2.8 s per Jacobian).
"""

from __future__ import annotations

import itertools

import torch

#: Numbers held by one batched backward pass of :func:`hessian_rows` (Hessian rows times the per-row size of the
#: graph's intermediates).  On a CPU the rows go in chunks that stay in cache (30 problems, k = 4, n = 5,000 and
#: 24 parameters: all rows at once took 3x the time of chunks of three); a GPU takes more at once.  A pass's
#: intermediates are a few times its numbers (on the least-squares reference path, 40-80 MB on a CPU).
HESSIAN_CHUNK_ELEMENTS = {"cpu": 2**21, "other": 2**25}


def chunk_budget(device: torch.device) -> int:
    """:data:`HESSIAN_CHUNK_ELEMENTS` for ``device``."""
    return HESSIAN_CHUNK_ELEMENTS["cpu" if device.type == "cpu" else "other"]


def hessian_chunks(P: int, rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive chunks of the P Hessian rows, about ``rows`` each and never fewer than two
    (unless P is 1): as few chunks as ``rows`` allows, of sizes that differ by at most one."""
    m = max(1, min(-(-P // max(rows, 2)), P // 2))
    bounds = [P * i // m for i in range(m + 1)]
    return list(itertools.pairwise(bounds))


def hessian_rows(grad: torch.Tensor, theta: torch.Tensor, per_row: int) -> torch.Tensor:
    r"""Every problem's Hessian (A, P, P) from its gradient ``grad`` (A, P), computed with ``create_graph=True``
    from ``theta`` (A, ...) with P numbers per problem: batched backward passes of ``grad`` with the unit
    cotangents of a chunk of rows (:func:`hessian_chunks`, sized by :func:`chunk_budget` over ``per_row``, the
    numbers of the graph's intermediates per row).  The graph is released after the last chunk."""
    A, P = grad.shape
    chunks = hessian_chunks(P, chunk_budget(theta.device) // max(1, per_row))
    unit = torch.eye(P, dtype=grad.dtype, device=grad.device)
    rows = []
    for i, (start, stop) in enumerate(chunks):
        cotangents = unit[start:stop].unsqueeze(1).expand(stop - start, A, P)
        (h,) = torch.autograd.grad(grad, theta, grad_outputs=cotangents, is_grads_batched=True,
                                   retain_graph=i < len(chunks) - 1)
        rows.append(h.reshape(stop - start, A, P))
    H = rows[0] if len(rows) == 1 else torch.cat(rows)
    return H.detach().permute(1, 0, 2)


def rowwise_gradients(fn, theta: torch.Tensor, *data: torch.Tensor, rows_per_chunk: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Values (A, n) and gradients (A, n, P) of ``fn`` at each of the n rows of every problem's ``data`` (arrays
    (A, n, ...)), each row at its own copy of its problem's parameters ``theta`` (A, P): ``fn`` maps copies
    (B, P) and rows (B, 1, ...) to values (B, 1), and one backward pass of a chunk's summed values gives every row's
    gradient (the copies share nothing).  At most ``rows_per_chunk`` rows of each problem per chunk: memory
    O(A x chunk x P), the arithmetic of one batched forward and backward pass per chunk."""
    A, P = theta.shape
    n = data[0].shape[1]
    values, grads = [], []
    for lo in range(0, n, rows_per_chunk):
        m = min(n, lo + rows_per_chunk) - lo
        rows = tuple(a[:, lo : lo + m].reshape(A * m, 1, *a.shape[2:]) for a in data)
        copies = theta.detach().unsqueeze(1).expand(A, m, P).reshape(A * m, P).requires_grad_(True)
        with torch.enable_grad():
            value = fn(copies, *rows)[:, 0]
            (g,) = torch.autograd.grad(value.sum(), copies)
        values.append(value.detach().reshape(A, m))
        grads.append(g.reshape(A, m, P))
    if len(values) == 1:
        return values[0], grads[0]
    return torch.cat(values, 1), torch.cat(grads, 1)


#: Rows per backward pass of :func:`pointwise_gradients`.
POINTWISE_CHUNK = 4096


def pointwise_gradients(fn, theta: torch.Tensor, *data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Values (n,) and gradients (n, P) in :math:`\theta` (P,) of ``fn(theta, *rows)`` at each of the n rows of
    ``data`` (arrays (n, ...)), where ``fn`` maps parameters (A, P) and data (A, 1, ...) to values (A, 1):
    :func:`rowwise_gradients` for one problem, :data:`POINTWISE_CHUNK` rows at a time.  (``torch.func.vmap`` over
    ``grad`` or ``jacfwd`` gives the same numbers but loads ``torch._dynamo`` on first use, about 1 s.)"""
    values, grads = rowwise_gradients(fn, theta.reshape(1, -1), *(a.unsqueeze(0) for a in data),
                                      rows_per_chunk=POINTWISE_CHUNK)
    return values[0], grads[0]


def replicate_hessians(total, theta: torch.Tensor) -> torch.Tensor:
    r"""Hessians (R, P, P) of ``total(theta)``, a scalar that sums R independent terms, one per row of ``theta`` (R, P).

    Reverse over reverse with plain autograd: :math:`g = \nabla_\theta\,\mathrm{total}` (R, P) keeps its graph,
    and one backward pass per coordinate :math:`i` gives :math:`\nabla_\theta\sum_{r}g_{r,i}`, whose row
    :math:`r` is :math:`H_{r,i,\cdot}` since the terms of other replicates do not depend on :math:`\theta_r`.
    ``torch.func.vmap(torch.func.hessian(...))`` gives the same matrices to rounding (relative 1e-15), but it loads
    ``torch._dynamo`` on first use (about 1 s of a process's first standard error) and its batched passes over all
    P coordinates are memory-bound: at P = 104, R = 10, n = 2,000 it took 2.87 s against 0.48 s here, at P = 366,
    R = 5, n = 5,000 32.9 s against 5.4 s (2-core machine, one thread, ``benchmarks/mle_standard_errors.py``); at
    P = 8 to 28 both take milliseconds.
    """
    theta = theta.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(total(theta), theta, create_graph=True)
        rows = [torch.autograd.grad(g[:, i].sum(), theta, retain_graph=True)[0] for i in range(theta.shape[-1])]
    return torch.stack(rows, dim=1).detach()
