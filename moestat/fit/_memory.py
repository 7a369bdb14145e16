r"""Memory budgets of the fitters: the ``memory_budget`` argument, and the least-squares fit's memory model.

``fit_mle`` and ``fit_lse`` take the same ``memory_budget`` (bytes, or a string such as ``"2GB"``) and fit their
(replicate, restart) problems in blocks, one after another, each of as many problems as the fitter's model of its
memory allows.  The maximum-likelihood model (:class:`moestat.fit.mle.MemoryModel`) counts arrays per observation;
the least-squares model here counts what grows with the number of problems: Newton's and Levenberg-Marquardt's
Hessians are :math:`F^2` per problem (:math:`F` free parameters: 594 at the flagship size, 2.7 MiB each), which at
hundreds of problems is gigabytes, while the observations are already processed in chunks of fixed size.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from typing import Any

import numpy as np

from ..exceptions import MoestatWarning, warn_user

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def memory_bytes(value: Any) -> int | None:
    """``memory_budget`` in bytes: a positive integer, a string such as ``"2GB"``, ``"512 MiB"`` or ``"1.5e9"``
    (decimal units B, KB, MB, GB, TB = 1000^j bytes; binary KiB, MiB, GiB, TiB = 1024^j), or ``None`` (no budget)."""
    if value is None:
        return None
    fix = "pass bytes as a positive integer, a string such as '2GB' or '512MiB', or None for no budget"
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"memory_budget={value!r} is not a size; {fix}.")
        size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    elif isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        size = float(value)
    else:
        raise TypeError(f"memory_budget must be a number of bytes, a string or None, got {type(value).__name__}; "
                        f"{fix}.")
    if not (np.isfinite(size) and size >= 1):
        raise ValueError(f"memory_budget={value!r} must be at least 1 byte; {fix}.")
    return int(size)


#: ``fit_lse``'s default ``memory_budget``: 2 * 10^9 bytes.
LSE_MEMORY_BUDGET = "2GB"
#: Margin of :class:`LSEMemoryModel` over the arrays it counts (allocator rounding, temporaries of the linear algebra).
_MARGIN = 1.2


@dataclasses.dataclass(frozen=True)
class LSEMemoryModel:
    r"""Estimated memory of a ``fit_lse`` call, in bytes, for sizing its blocks of replicates.

    One (replicate, restart) problem with :math:`F` free parameters, :math:`n` observations, :math:`2k` atom rows
    and :math:`p = d + 1` input columns holds, in words (``itemsize`` bytes each), times a margin of 1.2:

    * Newton and Levenberg-Marquardt (the tensor loops): :math:`3F^2` (the Hessian or :math:`J^\top J`, the spare
      it is written into at the next iteration, the damped copy or its Cholesky factor) plus the packed pair sums
      the Hessian is gathered from, :math:`k(2k+1)\,p(p+1)/2`;
    * the C++ Newton loop (``compile=True``): its work arrays are per thread, not per problem, so :math:`16F`;
    * L-BFGS: its 10 stored pairs and line-search points, :math:`36F`; Adam and the SGD protocol :math:`16F`;
    * every optimiser: :math:`4n` for residual-length arrays (the means and residuals of the kink bound of relu fits);
    * on the autograd reference path (gates the fused kernels do not know, a learned temperature; ``reference_rows``,
      the rows :math:`m` of a problem's parameter table, :math:`2k` or :math:`2k+1`): the first-order optimisers'
      autograd graph of the objective, :math:`4mn`; Newton and Levenberg-Marquardt, and the certificate, the residual
      Jacobian and the graph its exact Hessian is differentiated through, :math:`n(mp + 16m)`.  Measured growth per
      problem at n = 4,000 (cosine, Laplace, quadratic, Gaussian gates, k = 3 to 6): 13-29 words per observation
      for L-BFGS, 43-126 with the certificate, against the model's 28-52 and 118-268 (before the margin).

    The certificate after the fit (the exact Hessian and its eigenvalues at each replicate's best restart, and the
    condition number of :math:`J^\top J`) holds :math:`3F^2` plus the packed sums per replicate whatever the
    optimiser (:attr:`certificate`).  ``fixed`` is what the call holds whatever the blocks: its float64 copy of the
    data and the tensors made from it, :math:`Rn(d+2)` float64 values and as many words (:math:`2Rn(d+2)` words in
    float64).  Not counted: the observation chunks' workspaces, which do not grow with the number of problems or
    observations (about 20 MiB on a CPU; on a GPU up to :data:`moestat.fit._objective.CUDA_WORKSPACE_BYTES` each for
    the objective, the Hessian and the inputs' pair products, and at most
    :data:`moestat.fit._objective.WORKSPACE_CACHE_BYTES` of the objective's earlier chunk shapes kept for reuse),
    on the reference path its chunks of observations for the Jacobian (about 10 MB on a CPU) and its batched
    backward passes for the Hessian's rows (a few times :data:`moestat.fit._derivatives.HESSIAN_CHUNK_ELEMENTS`
    numbers: about 40-80 MB on a CPU), and the caller's own arrays.  Measured against the peak of live torch
    allocations at the flagship size (k = 9, d = 32, sigmoid and softmax gates, n = 1,000 and 8,000): it grew by
    5.5-6.5 MiB per problem beyond the data, against the model's 9.6-10.9 MiB (docs/performance.md).  An estimate,
    not a guarantee.
    """

    per_problem: float
    certificate: float
    fixed: float

    @staticmethod
    def of(optimizer: str, F: int, n: int, R: int, d: int, k: int, *, native: bool = False,
           itemsize: int = 8, reference_rows: int | None = None) -> LSEMemoryModel:
        p = d + 1
        packed = k * (2 * k + 1) * p * (p + 1) / 2
        m = reference_rows or 0
        second_order = 3 * F * F + packed + n * (m * p + 16 * m)
        if optimizer in ("newton", "lm"):
            state = 16 * F if native else second_order
        elif optimizer == "lbfgs":
            state = 36 * F + 4 * m * n
        else:
            state = 16 * F + 4 * m * n
        return LSEMemoryModel(per_problem=itemsize * _MARGIN * (state + 4 * n),
                              certificate=itemsize * _MARGIN * (second_order + 4 * n),
                              fixed=float((8 + itemsize) * R * n * (d + 2)))

    def replicates_per_block(self, budget: int | None, restarts: int, total: int, *, certificate: bool = False) -> int:
        """How many replicates (``restarts`` problems each, or one best restart each for the ``certificate``) a
        block holds within ``budget``: at least one, at most ``total``."""
        if budget is None:
            return max(total, 1)
        per = self.certificate if certificate else self.per_problem * restarts
        return int(max(1, min(total, (budget - self.fixed) // per)))

    def check(self, budget: int | None, restarts: int, *, certificate: bool = True) -> None:
        """Warn when even one replicate at a time (its ``restarts`` problems, or its ``certificate`` when the fit
        computes one) needs more than ``budget``."""
        if budget is None:
            return
        for need, what in ((self.fixed + self.per_problem * restarts, f"one replicate's {restarts} restart(s)"),
                           (self.fixed + self.certificate if certificate else 0.0, "one replicate's certificate")):
            if need > budget:
                warn_user(f"memory_budget={budget} bytes is below the estimated {need / 1e6:.3g} MB needed for the "
                          f"data and {what} at a time; running one replicate at a time anyway. Raise memory_budget "
                          "to silence this.", MoestatWarning)
                return
