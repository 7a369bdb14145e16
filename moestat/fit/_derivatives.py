r"""Batched Hessians and Jacobians by plain autograd, for the fitters' autograd paths.

Many independent problems (a replicate x restart each) share one autograd graph: problem :math:`a`'s objective
depends on its own parameters :math:`\theta_a` only, so one backward pass of the summed objective gives every
problem's gradient, and a backward pass of that gradient with a unit cotangent :math:`e_j` gives row :math:`j` of
every problem's Hessian (reverse over reverse).  :func:`hessian_rows` stacks several rows into one backward pass
(``is_grads_batched``) in chunks whose intermediates stay in cache.  :func:`hessian_chunks` never makes a chunk of a
single row: a pass with one cotangent takes other BLAS kernels than a batched one and can give other last bits,
while batched passes of any size give the same numbers, so a Hessian does not depend on the chunking.

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
