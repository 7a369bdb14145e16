r"""The least-squares objective of a MoE regression with a fused, hand-derived gradient and Jacobian.

Parameter layout
----------------
One problem (a replicate x restart) is a matrix :math:`\Theta \in \mathbb R^{2k \times (d+1)}`:
row :math:`i < k` is gate atom :math:`i`, ``[beta_0i, beta_1i]``; row :math:`k + i` is expert atom
:math:`i`, ``[b_i, a_i]``.  With the augmented inputs :math:`\tilde x = (1, x)` all logits and expert
pre-activations come from **one** matrix product :math:`Z = \tilde X \Theta^\top` of shape (n, 2k).

Objective (nguyen2024 eq. 3, divided by n) and gradient
-------------------------------------------------------
:math:`L(\Theta) = \frac1n\sum_t r_t^2`, :math:`r_t = f_\Theta(x_t) - y_t`,
:math:`f = \sum_i \pi_i h_i`, :math:`\pi = g(Z_{\mathrm{gate}}/\tau)`, :math:`h_i = \varphi(Z_{\mathrm{exp},i})`.
With :math:`c_t = 2 r_t / n` the chain rule gives the gradient with respect to :math:`Z`

* expert columns: :math:`\partial L/\partial Z_{\mathrm{exp},ti} = c_t\,\pi_{ti}\,\varphi'(Z_{\mathrm{exp},ti})`;
* sigmoid gate columns: :math:`\partial L/\partial Z_{\mathrm{gate},ti} = c_t\,h_{ti}\,\pi_{ti}(1-\pi_{ti})/\tau`;
* softmax and top-K gate columns: :math:`c_t\,\pi_{ti}(h_{ti} - f_t)/\tau` (the top-K selection is
  piecewise constant, so its derivative is the softmax one on the selected experts and zero elsewhere);

and :math:`\nabla_\Theta L = (\partial L/\partial Z)^\top \tilde X`: a second matrix product.  One
objective + gradient evaluation is two products plus a few element-wise passes; the test-suite checks
it against autograd and finite differences.  The Jacobian of the residuals used by Gauss-Newton is
:math:`\partial r_t/\partial\Theta_{j\cdot} = u_{tj}\,\tilde x_t` with :math:`u_t = \partial f_t/\partial Z_t`
(the same expressions without :math:`c_t`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..exceptions import warn_user
from ..experts import ExpertFamily
from ..gates import gate_logits
from ..model import MoE, tempered
from . import _native
from ._derivatives import hessian_rows, rowwise_gradients


def activation_and_derivative(family: ExpertFamily) -> Callable:
    r"""In-place evaluator ``act(z, h, dh, tmp) -> (phi(z), phi'(z))`` for an expert family
    (:meth:`ExpertFamily.value_and_derivative_into`); a returned derivative of ``None`` means
    :math:`\varphi' \equiv 1` (linear and constant experts)."""
    return family.value_and_derivative_into


def activation_second_derivative(family: ExpertFamily) -> Callable | None:
    r"""``z -> phi''(z)`` for an expert family, or ``None`` where :math:`\varphi'' \equiv 0` (constant, linear,
    relu away from its kink): :meth:`ExpertFamily.phi_second`.  Used by the exact Hessian
    (:meth:`MeanKernel.exact_curvature_rows`)."""
    if not family.input_dependent or family.piecewise_linear:
        return None
    return family.phi_second


KERNEL_MODES = ("eager", "native", "auto")

#: Gates whose Z-derivatives :class:`MeanKernel` derives by hand; every other gate runs on :class:`ReferenceKernel`.
FUSED_GATES = ("softmax", "sigmoid", "topk")

#: Parameter copies (numbers) in one chunk of observations of :meth:`ReferenceKernel.residual_derivatives`, which
#: evaluates each observation at its own copy of its problem's parameters.  With the graph through the model's mean a
#: chunk holds about 5x that beyond the Jacobian (10 MB on a CPU, where 2^20 copies took 22 MB and no less time).
JACOBIAN_CHUNK_ELEMENTS = {"cpu": 2**18, "other": 2**24}

#: Largest workspace (bytes) of one chunk of observations on a GPU (eager kernel, Gauss-Newton pair products).
CUDA_WORKSPACE_BYTES = 2**30
#: Bytes of chunk workspaces one :class:`MeanKernel` keeps for reuse, all shapes together (besides at most seven
#: shapes): a GPU's workspaces reach :data:`CUDA_WORKSPACE_BYTES` each, and a shrinking active set asks for a new
#: shape at every size, so without a cap seven of them (7 GiB) could stay allocated.
WORKSPACE_CACHE_BYTES = 2 * CUDA_WORKSPACE_BYTES

#: On a CPU, a batch of F x F matrices larger than this (A F^2 doubles) is factored, solved and assembled one problem
#: at a time: batched LAPACK calls and gathers then work out of cache (flagship size, A = 20, F = 594: 3.5x slower
#: per problem), while below it one batched call beats a Python loop (A = 200, F = 18: 12x faster).
CPU_PER_PROBLEM_BYTES = 2**23


def per_problem_on_cpu(batch: torch.Tensor) -> bool:
    """Whether a batch of matrices (A, F, F) is handled one problem at a time: on a CPU, above
    :data:`CPU_PER_PROBLEM_BYTES`."""
    return batch.device.type == "cpu" and batch.numel() * batch.element_size() > CPU_PER_PROBLEM_BYTES


def kernel_mode(compile: bool | str) -> str:
    """Normalise ``fit_lse(compile=...)``: False/"eager", "native", True/"auto"."""
    if compile is True or compile == "auto":
        return "auto"
    if compile is False or compile is None:
        return "eager"
    if compile == "inductor":
        raise ValueError("compile='inductor' is no longer offered: torch.compile failed to build the flagship-size "
                         "kernel on CUDA and ran slower than the eager kernel on CPU (docs/performance/lse.md); "
                         "use compile=True (the native C++ kernel on CPU, the eager kernel elsewhere).")
    if isinstance(compile, str) and compile in KERNEL_MODES:
        return compile
    raise ValueError(f"compile must be True, False or one of {KERNEL_MODES}, got {compile!r}.")


class MeanKernel:
    """The MoE mean, its Z-derivatives and the least-squares objective for one spec, batched.

    Tensors are grouped: ``X`` (G, n, d+1) augmented inputs, ``y`` (G, n) responses and ``theta``
    (G, s, 2k, d+1): ``s`` problems share the data of each of the ``G`` groups (restarts of one
    replicate), so the data are never copied per restart.  Intermediates live in the layout
    (G, s, 2k, n) — observations last and contiguous — and in reused workspace buffers, so each
    element-wise pass is one vectorised sweep without a fresh allocation.
    """

    def __init__(self, gate: str, k: int, top_k: int | None, temperature: float, act: Callable, *,
                 chunk_bytes: int = 2**21, chunk_min_elems: int = 2**17,
                 native: Callable | None = None, native_act: int | None = None) -> None:
        self.gate, self.k, self.top_k, self.temperature, self.act = gate, k, top_k, float(temperature), act
        self.chunk_bytes, self.chunk_min_elems = chunk_bytes, chunk_min_elems
        self.native, self.native_act = native, native_act
        self.act2: Callable | None = None
        self._ws: dict = {}
        self._pair_pos: dict = {}
        self._curvature_idx: dict = {}

    @classmethod
    def from_spec(cls, spec: MoE, *, compile: bool | str = False, chunk_bytes: int = 2**21,
                  chunk_min_elems: int = 2**17, learn_temperature: bool = False) -> MeanKernel | ReferenceKernel:
        """Kernel for ``spec``.

        ``compile`` (see :func:`kernel_mode`): ``False`` — the eager kernel; ``"native"`` or ``True`` — the
        fused C++ kernel (:mod:`moestat.fit._native`) for CPU tensors where it applies (sigmoid, softmax or
        top-K gate, k <= 32, an expert family with a C++ form), the eager kernel for everything else (CUDA
        tensors included).
        Gates the fused kernels do not know (every gate but softmax, sigmoid and top-K) get the autograd
        :class:`ReferenceKernel` whatever ``compile`` says, and so does a fitted temperature
        (``learn_temperature``)."""
        mode = kernel_mode(compile)
        if spec.gate not in FUSED_GATES or learn_temperature:
            return ReferenceKernel(spec, learn_temperature=learn_temperature)
        if mode in ("auto", "native") and not _native.compiler_available():
            warn_user(f"compile={compile!r}: no C++ compiler (c++, g++ or clang++) on PATH, which the native "
                          "kernel needs; using the eager kernel.", UserWarning)
            mode = "eager"
        native = None
        if mode in ("auto", "native") and _native.supports(spec.gate, spec.k, spec.family):
            module = _native.load()
            native = None if module is None else module.value_grad
        kernel = cls(spec.gate, spec.k, spec.top_k, float(spec.temperature),
                     activation_and_derivative(spec.family), chunk_bytes=chunk_bytes,
                     chunk_min_elems=chunk_min_elems, native=native,
                     native_act=_native.activation_code(spec.family))
        kernel.act2 = activation_second_derivative(spec.family)
        return kernel

    def kind(self, device: torch.device) -> str:
        """The kernel that evaluates tensors on ``device``: ``"native"`` or ``"eager"``."""
        return "native" if self.native is not None and device.type == "cpu" else "eager"

    def _chunk_rows(self, G: int, s: int, n: int, p: int, itemsize: int, device: torch.device | None = None) -> int:
        """Observations per chunk.

        On a CPU: small enough that the chunk's inputs and its five (G, s, k|2k, c) buffers fit in about
        ``chunk_bytes`` (an L2 cache), so the inputs are read from memory once per evaluation; but at
        least ``chunk_min_elems`` array elements per chunk, so the fixed cost of the ~25 tensor operations per
        chunk stays small against their work.  On a GPU each operation is a kernel launch and the device
        is fed only by large arrays: chunks hold up to :data:`CUDA_WORKSPACE_BYTES` of buffers (measured on
        an H200 at k = 9, d = 32, R = 20: cache-sized chunks made an evaluation 74-123x the forward product,
        5-12x slower than plain autograd).
        """
        per_row = G * (5 * s * 2 * self.k + p) * itemsize
        if device is not None and device.type == "cuda":
            return max(1, min(n, CUDA_WORKSPACE_BYTES // max(1, per_row)))
        by_cache = self.chunk_bytes // max(1, per_row)
        by_overhead = self.chunk_min_elems // max(1, G * s * 2 * self.k)
        return max(1, min(n, max(by_cache, by_overhead)))

    def _workspace(self, G: int, s: int, n: int, like: torch.Tensor) -> dict:
        key = (G, s, n, like.dtype, like.device)
        ws = self._ws.get(key)
        if ws is None:
            k = self.k
            shapes = {"Z": (G, s * 2 * k, n), "U": (G, s, 2 * k, n), "pi": (G, s, k, n), "h": (G, s, k, n),
                      "dh": (G, s, k, n), "tmp": (G, s, k, n), "f": (G, s, n), "r": (G, s, n)}
            held = sum(t.numel() * t.element_size() for kept in self._ws.values() for t in kept.values())
            size = sum(math.prod(shape) for shape in shapes.values()) * like.element_size()
            if len(self._ws) > 6 or held + size > WORKSPACE_CACHE_BYTES:
                self._ws.clear()
            ws = {name: torch.empty(shape, dtype=like.dtype, device=like.device) for name, shape in shapes.items()}
            self._ws[key] = ws
        return ws

    def _forward(self, theta: torch.Tensor, X: torch.Tensor, ws: dict):
        """Fill the workspace with Z, pi, h, dh and f; return (pi, h, dh, f, ze)."""
        G, s, two_k, p = theta.shape
        k, n = self.k, X.shape[1]
        Z = torch.bmm(theta.reshape(G, s * two_k, p), X.transpose(1, 2), out=ws["Z"]).view(G, s, two_k, n)
        zg, ze = Z[:, :, :k], Z[:, :, k:]
        pi = ws["pi"]
        if self.gate == "sigmoid" and self.temperature == 1.0:
            torch.sigmoid(zg, out=pi)
        elif self.temperature != 1.0:
            torch.div(zg, self.temperature, out=pi)
        else:
            pi.copy_(zg)
        if self.gate == "sigmoid":
            if self.temperature != 1.0:
                pi.sigmoid_()
        else:
            if self.gate == "topk":
                idx = pi.topk(self.top_k, dim=2).indices
                keep = torch.zeros(pi.shape, dtype=torch.bool, device=pi.device).scatter_(2, idx, True)
                pi.masked_fill_(~keep, float("-inf"))
            pi.sub_(pi.amax(2, keepdim=True)).exp_()
            pi.div_(pi.sum(2, keepdim=True))
        h, dh = self.act(ze, ws["h"], ws["dh"], ws["tmp"])
        tmp = ws["tmp"]
        torch.mul(pi, h, out=tmp)
        f = torch.sum(tmp, 2, out=ws["f"])
        return pi, h, dh, f

    def _chunks(self, theta: torch.Tensor, X: torch.Tensor):
        """Observation ranges ``(lo, hi)`` of :meth:`_chunk_rows` and their workspaces, for the element-wise
        evaluations that need no gradient (:meth:`mean`, :meth:`value`): their memory is the workspace of one chunk,
        not the (G, s, 8k + 2, n) of all observations at once."""
        G, s, _, p = theta.shape
        n = X.shape[1]
        c = self._chunk_rows(G, s, n, p, X.element_size(), X.device)
        for lo in range(0, n, c):
            hi = min(n, lo + c)
            yield lo, hi, self._workspace(G, s, hi - lo, X)

    def mean(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """:math:`f_\\Theta(x_t)`, shape (G, s, n) (a fresh tensor), chunk by chunk of observations."""
        G, s = theta.shape[:2]
        out = torch.empty(G, s, X.shape[1], dtype=X.dtype, device=X.device)
        for lo, hi, ws in self._chunks(theta, X):
            out[:, :, lo:hi] = self._forward(theta, X[:, lo:hi], ws)[3]
        return out

    def value(self, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Objective :math:`L = \\frac1n\\sum_t r_t^2`, shape (G, s): the sum of squares accumulates chunk by chunk
        of observations (:meth:`_chunk_rows`, as in :meth:`value_grad`)."""
        G, s = theta.shape[:2]
        n = X.shape[1]
        loss = torch.zeros(G, s, dtype=X.dtype, device=X.device)
        for lo, hi, ws in self._chunks(theta, X):
            f = self._forward(theta, X[:, lo:hi], ws)[3]
            r = torch.sub(f, y[:, lo:hi].unsqueeze(1), out=ws["r"])
            loss.add_(torch.linalg.vector_norm(r, dim=-1).square_())
        return loss.div_(n)

    def _dfdz(self, pi, h, dh, f, c, U) -> torch.Tensor:
        """Write :math:`c\\,\\partial f/\\partial Z` into ``U`` (G, s, 2k, n); ``c`` is (G, s, n) or None."""
        k = self.k
        ug, ue = U[:, :, :k], U[:, :, k:]
        if c is None:
            ue.copy_(pi)
        else:
            torch.mul(pi, c.unsqueeze(2), out=ue)
        if self.gate == "sigmoid":
            torch.mul(ue, h, out=ug)
            ug.addcmul_(ug, pi, value=-1.0)  # c pi h (1 - pi)
        else:
            torch.sub(h, f.unsqueeze(2), out=pi)  # pi no longer needed as such: reuse for (h - f)
            ug.copy_(ue).mul_(pi)
        if dh is not None:
            ue.mul_(dh)
        if self.temperature != 1.0:
            ug.div_(self.temperature)
        return U

    def value_grad(self, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Objective (G, s) and its gradient (G, s, 2k, d+1) in one fused pass.

        Observations are processed in chunks (:meth:`_chunk_rows`) so the element-wise work stays in
        cache; the gradient accumulates chunk by chunk.
        """
        G, s, two_k, p = theta.shape
        n = X.shape[1]
        if self.native is not None and X.device.type == "cpu":
            rows = _native.block_rows(s * two_k, p, X.element_size())
            loss, grad = self.native(theta.reshape(G, s * two_k, p), X, y, self.k,
                                     *_native.gate_args(self.gate, self.k, self.top_k), self.native_act,
                                     self.temperature, rows)
            return loss, grad.view(G, s, two_k, p)
        c = self._chunk_rows(G, s, n, p, X.element_size(), X.device)
        loss = torch.zeros(G, s, dtype=X.dtype, device=X.device)
        grad = torch.zeros(G, s * two_k, p, dtype=X.dtype, device=X.device)
        for lo in range(0, n, c):
            Xc, yc = (X, y) if c >= n else (X[:, lo : lo + c], y[:, lo : lo + c])
            ws = self._workspace(G, s, Xc.shape[1], X)
            pi, h, dh, f = self._forward(theta, Xc, ws)
            r = torch.sub(f, yc.unsqueeze(1), out=ws["r"])
            loss.add_(torch.linalg.vector_norm(r, dim=-1).square_())
            U = self._dfdz(pi, h, dh, f, r.mul_(2.0 / n), ws["U"])
            grad.baddbmm_(U.view(G, s * two_k, -1), Xc)
        return loss.div_(n), grad.view(G, s, two_k, p)

    def residual_jacobian(self, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residuals r (G, s, n) and :math:`u = \\partial f/\\partial Z` (G, s, 2k, n), fresh tensors.

        The Jacobian row of observation t for problem (g, s) is :math:`u_{\\cdot t} \\otimes \\tilde x_t`.
        """
        G, s = theta.shape[:2]
        ws = self._workspace(G, s, X.shape[1], X)
        pi, h, dh, f = self._forward(theta, X, ws)
        r = f - y.unsqueeze(1)
        U = self._dfdz(pi, h, dh, f, None, ws["U"]).clone()
        return r, U


    def hessian_row_elems(self, exact: bool) -> int:
        r"""Array elements per observation and problem that one chunk of :meth:`LSProblem.gauss_newton` holds at
        its peak: :meth:`exact_curvature_rows` (``exact``) or :meth:`residual_jacobian`, with the pair rows.

        With :math:`m = 2k(2k+1)/2` pair rows and :math:`T = k(k+1)/2` gate pairs: two workspaces of
        :math:`8k + 2` (the chunk's and the last, shorter chunk's, both cached), the :math:`m` pair rows, the
        squared residuals (1) and, for ``exact``, the non-zero blocks of W while they are formed: under a sigmoid
        gate at most 4k live at once (3k blocks and one product), under softmax and top-K the k(k+1)/2 gate-gate
        block and its three gathered operands plus the :math:`k^2` gate-expert block and the k expert-expert
        block (:math:`4T + k^2 + 2k`); the second derivative of the experts adds up to 5k (its own
        temporaries).  Without ``exact``: the copied u (2k) and the residuals (1).  Upper bounds: one chunk's
        allocations replayed from ``torch.profiler`` came to 0.57-0.78 of the count (sigmoid, softmax, top-K;
        gelu, tanh, relu, linear experts; 1.0 without the second workspace for Gauss-Newton).
        """
        k = self.k
        elems = 2 * (8 * k + 2) + k * (2 * k + 1) + 1
        if not exact:
            return elems + 2 * k + 1
        w = 4 * k if self.gate == "sigmoid" else 2 * k * (k + 1) + k * k + 2 * k
        return elems + w + (5 * k if self.act2 is not None else 0)

    def _pair_positions(self, device: torch.device) -> torch.Tensor:
        """(2k, 2k) table: the position of the pair (i, j) among the unordered pairs of the 2k derivative rows,
        in the order of :func:`_pair_products` (cached per device)."""
        table = self._pair_pos.get(device)
        if table is None:
            m = 2 * self.k
            a, b = torch.triu_indices(m, m, device=device)
            table = torch.empty(m, m, dtype=torch.long, device=device)
            table[a, b] = table[b, a] = torch.arange(a.numel(), device=device)
            self._pair_pos[device] = table
        return table

    def _curvature_indices(self, device: torch.device) -> dict:
        """The index tensors of :meth:`exact_curvature_rows` (built once per device): ``eye`` (k,), the gate pairs
        ``gi, gj`` (``torch.triu_indices(k, k)``), the diagonal pairs among them ``gg_diagonal``, and the pair-row
        positions of W's non-zero blocks: ``sigmoid`` (gate-gate diagonal, gate-expert diagonal), ``softmax``
        (gate-gate pairs, all gate-expert pairs) and ``act2`` (expert-expert diagonal)."""
        ix = self._curvature_idx.get(device)
        if ix is None:
            k = self.k
            pos = self._pair_positions(device)
            eye = torch.arange(k, device=device)
            gi, gj = torch.triu_indices(k, k, device=device)
            ei, ej = torch.meshgrid(eye, eye, indexing="ij")
            ix = {"eye": eye, "gi": gi, "gj": gj, "gg_diagonal": eye * k - eye * (eye - 1) // 2,
                  "sigmoid": (pos[eye, eye], pos[eye, k + eye]),
                  "softmax": (pos[gi, gj], pos[ei.reshape(-1), k + ej.reshape(-1)]),
                  "act2": pos[k + eye, k + eye]}
            self._curvature_idx[device] = ix
        return ix

    def exact_curvature_rows(self, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""Residuals r (G, s, n), :math:`u = \partial f/\partial Z` (G, s, 2k, n) and the unordered pair rows
        :math:`C_{ij} = u_iu_j + r\,W_{ij}` (:math:`i \le j`, order of :func:`_pair_products`), shape
        (G, s, 2k(2k+1)/2, n), with :math:`W = \partial^2 f/\partial Z\,\partial Z^\top`.

        With logits :math:`l = Z_{\mathrm{gate}}/\tau`, experts :math:`h_i = \varphi(Z_{\mathrm{exp},i})` and
        :math:`f = \sum_i \pi_i h_i`:

        * sigmoid: :math:`W_{g_ig_i} = \pi_i(1-\pi_i)(1-2\pi_i)h_i/\tau^2`,
          :math:`W_{g_ie_i} = \pi_i(1-\pi_i)h'_i/\tau`, :math:`W_{e_ie_i} = \pi_i h''_i`, all others 0;
        * softmax (and top-K on its selected experts):
          :math:`W_{g_ig_j} = [\delta_{ij}\pi_i(h_i - f) - \pi_i\pi_j(h_i + h_j - 2f)]/\tau^2`,
          :math:`W_{g_ie_j} = \pi_i(\delta_{ij}h'_i - \pi_j h'_j)/\tau`, :math:`W_{e_ie_i} = \pi_i h''_i`.

        The Hessian of :math:`f_t` in :math:`\Theta` is :math:`W_t \otimes \tilde x_t\tilde x_t^\top`, so half
        the exact Hessian of the objective is :math:`\frac1n\sum_t C_t \otimes \tilde x_t\tilde x_t^\top`, with the
        Kronecker structure of :math:`J^\top J` (:meth:`LSProblem.gauss_newton` with ``exact=True``).  Only the
        non-zero entries of W are formed (3k of them for a sigmoid gate) and added into the pair rows in place;
        the test-suite checks the resulting Hessian against autograd.  ``u`` and ``r`` are workspace buffers,
        valid until the next evaluation of this kernel.
        """
        G, s = theta.shape[:2]
        k, n, tau = self.k, X.shape[1], self.temperature
        ws = self._workspace(G, s, n, X)
        pi, h, dh, f = self._forward(theta, X, ws)
        ze = ws["Z"].view(G, s, 2 * k, n)[:, :, k:]
        r = torch.sub(f, y.unsqueeze(1), out=ws["r"])
        ix = self._curvature_indices(X.device)
        eye = ix["eye"]
        slope = 1.0 if dh is None else dh  # linear experts: h' = 1
        if self.gate == "sigmoid":
            d1 = pi * (1.0 - pi)
            blocks = [(d1 * (1.0 - 2.0 * pi)).mul_(h).div_(tau**2), d1.mul_(slope).div_(tau)]
            where = list(ix["sigmoid"])
            del d1
        else:
            hf = h - f.unsqueeze(2)
            gi, gj = ix["gi"], ix["gj"]
            gg = pi[:, :, gi] * pi[:, :, gj]
            gg.mul_(hf[:, :, gi] + hf[:, :, gj]).neg_()
            gg[:, :, ix["gg_diagonal"]] += pi * hf  # where gi == gj: an index, not a mask (no sync)
            del hf
            dhj = slope if dh is None else dh.unsqueeze(2)
            ge = (pi.unsqueeze(3) * pi.unsqueeze(2)).mul_(dhj).neg_()  # (G, s, k, k, n): -pi_i pi_j h'_j
            ge[:, :, eye, eye] += pi * slope
            blocks = [gg.div_(tau**2), ge.view(G, s, k * k, n).div_(tau)]
            where = list(ix["softmax"])
            del gg, ge
        if self.act2 is not None:
            blocks.append(pi * self.act2(ze))
            where.append(ix["act2"])
        U = self._dfdz(pi, h, dh, f, None, ws["U"])  # overwrites pi under softmax: W is formed above
        C = _pair_products(U.view(G * s, 2 * k, n))
        rr = r.view(G * s, 1, n)
        while blocks:  # the positions of the blocks are disjoint: each C entry gets one addition, as with one W
            C.index_add_(1, where.pop(0), blocks.pop(0).view(G * s, -1, n).mul_(rr))
        return r, U, C.view(G, s, -1, n)


class ReferenceKernel:
    r"""The least-squares objective evaluated by the model itself, with autograd derivatives.

    The reference path of :func:`moestat.fit_lse` for gates the fused kernels do not know (scores that are
    not :math:`w_i^\top x + b_i`, or a normalisation :class:`MeanKernel` does not derive by hand): the mean is
    :meth:`moestat.MoE.mean_from_linear` of :meth:`moestat.MoE.gate_scores` and the expert pre-activations, so
    it is the model's own formula; gradients come from autograd, and so do the Jacobian and exact Hessian behind
    :meth:`LSProblem.gauss_newton` (:meth:`residual_derivatives`), per problem instead of the Kronecker pair
    products.  Same tensor layout and methods as :class:`MeanKernel`; slower, exact.

    With ``learn_temperature`` a problem's table has one more row, :math:`2k`, whose first entry is
    :math:`\rho = \log\tau` of a fitted gate temperature (its other entries are held fixed by the caller): the
    scores are divided by :math:`e^\rho` instead of ``spec.temperature``.  ``rows`` is the table's number of rows.
    """

    kronecker = False  # the residual Jacobian has no u (x) x~ structure: LSProblem asks for it directly

    def __init__(self, spec: MoE, *, learn_temperature: bool = False) -> None:
        self.spec, self.gate, self.k = spec, spec.gate, spec.k
        self.learn_temperature = bool(learn_temperature)
        self.rows = 2 * spec.k + int(self.learn_temperature)
        if spec.gate in FUSED_GATES:
            self.note = ("a learned temperature (learn_temperature=True): the objective, its gradient and Hessian ran "
                         "on the autograd reference path (compile= has no effect)")
        else:
            self.note = (f"gate={spec.gate!r} is not one of the fused kernels' gates {list(FUSED_GATES)}: the "
                         "objective, its gradient and Hessian ran on the autograd reference path (compile= has no "
                         "effect)")

    def kind(self, device: torch.device) -> str:
        """``"autograd"`` on every device."""
        return "autograd"

    def _f(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """Differentiable mean (G, s, n) from ``theta`` (G, s, rows, d+1) and augmented inputs ``X`` (G, n, d+1)."""
        k, spec = self.k, self.spec
        Xr = X[..., 1:].unsqueeze(1)
        scores = spec.gate_scores(Xr, theta[..., :k, 1:], theta[..., :k, 0])
        if self.learn_temperature:  # row 2k holds log(tau): divide the scores by tau, not by spec.temperature
            scores = tempered(scores, torch.exp(theta[..., 2 * k, 0]), spec.temperature)
        if spec.family.input_dependent:
            pre = gate_logits(Xr, theta[..., k:2 * k, 1:], theta[..., k:2 * k, 0])
        else:
            pre = theta[..., k:2 * k, 0].unsqueeze(-2)
        return spec.mean_from_linear(scores, pre)

    def mean(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        r""":math:`f_\Theta(x_t)`, shape (G, s, n)."""
        with torch.no_grad():
            return self._f(theta, X)

    def value(self, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r"""Objective :math:`L = \frac1n\sum_t r_t^2`, shape (G, s)."""
        with torch.no_grad():
            return (self._f(theta, X) - y.unsqueeze(1)).square().mean(-1)

    def value_grad(self, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Objective (G, s) and its autograd gradient (G, s, 2k, d+1)."""
        with torch.enable_grad():
            th = theta.detach().requires_grad_(True)
            loss = (self._f(th, X) - y.unsqueeze(1)).square().mean(-1)
            (grad,) = torch.autograd.grad(loss.sum(), th)
        return loss.detach(), grad

    def residual_derivatives(self, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor, *, exact: bool
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        r"""Per problem (``theta`` (A, rows, d+1), ``X`` (A, n, d+1), ``y`` (A, n)): residuals r (A, n), their
        Jacobian J (A, n, P) and, with ``exact``, the Hessian of :math:`\frac12\sum_t r_t^2`,
        :math:`J^\top J + \sum_t r_t \nabla^2 r_t` (A, P, P); else None.

        J by reverse mode, with each observation evaluated at its own copy of its problem's parameters: one backward
        pass of :math:`\sum_t f(x_t;\theta^{(t)})` then gives every row :math:`\partial r_t/\partial\theta` (the
        copies share nothing; :func:`moestat.fit._derivatives.rowwise_gradients`), in chunks of observations of at
        most :data:`JACOBIAN_CHUNK_ELEMENTS` copied numbers.
        H by reverse over reverse (:func:`moestat.fit._derivatives.hessian_rows`).  Time and memory linear in n
        (``torch.func.vmap(jacrev(...))`` ran n cotangents through the whole batch: quadratic); J equals its to
        rounding (to the bit at one chunk for most gates), H ``torch.func.hessian``'s to a relative
        :math:`10^{-14}`.
        """
        A, n = y.shape
        shape, P = theta.shape[1:], theta[0].numel()
        r = self.mean(theta.unsqueeze(1), X)[:, 0] - y
        step = max(1, JACOBIAN_CHUNK_ELEMENTS["cpu" if theta.device.type == "cpu" else "other"] // (A * P))

        def fitted(copies: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # (B, P), (B, 1, d+1) -> (B, 1)
            return self._f(copies.view(-1, 1, *shape), x)[:, 0]

        _, J = rowwise_gradients(fitted, theta.reshape(A, P), X, rows_per_chunk=step)
        if not exact:
            return r, J, None
        with torch.enable_grad():
            th = theta.detach().requires_grad_(True)
            half_ss = 0.5 * (self._f(th.unsqueeze(1), X)[:, 0] - y).square().sum()
            (grad,) = torch.autograd.grad(half_ss, th, create_graph=True)
            H = hessian_rows(grad.reshape(A, P), th, per_row=A * n * self.rows)
        return r, J, H


def _pair_products(rows: torch.Tensor) -> torch.Tensor:
    """Products of all pairs of rows :math:`i \\le j` of ``rows`` (..., m, c), in the order of
    ``torch.triu_indices(m, m)``: shape (..., m(m+1)/2, c).  One broadcast multiply per row into
    contiguous slices (an index gather on the pair axis measured 10x slower)."""
    m = rows.shape[-2]
    out = rows.new_empty(*rows.shape[:-2], m * (m + 1) // 2, rows.shape[-1])
    start = 0
    for i in range(m):
        torch.mul(rows[..., i : i + 1, :], rows[..., i:, :], out=out[..., start : start + m - i, :])
        start += m - i
    return out


class LSProblem:
    """A batch of B = R*S least-squares problems sharing the data of their replicate.

    Problem ``b`` fits replicate ``b // S``.  ``theta`` tensors handed in and out are flat,
    shape (A, P) with P = 2k(d+1) (one more row, P = (2k+1)(d+1), with a kernel that learns the temperature), for
    the A currently *active* problems (:meth:`set_active`).
    While every problem is active the data are used in place (grouped per replicate); after some
    converge, the data of the remaining ones are gathered once and cached.

    Parameters
    ----------
    kernel : MeanKernel or ReferenceKernel
    X : Tensor, shape (R, n, d)
    y : Tensor, shape (R, n)
    S : int
        Restarts per replicate.
    free : Tensor of bool, shape (rows, d+1)
        Coordinates that are optimised (False: held at their initial value).
    lower, upper : Tensor, shape (2k, d+1), optional
        Box constraints (projection).
    """

    def __init__(self, kernel: MeanKernel | ReferenceKernel, X: torch.Tensor, y: torch.Tensor, S: int,
                 free: torch.Tensor, lower: torch.Tensor | None = None, upper: torch.Tensor | None = None) -> None:
        R, n, d = X.shape
        self.kernel, self.R, self.S, self.n, self.p = kernel, R, S, n, d + 1
        self.X = torch.cat([torch.ones(R, n, 1, dtype=X.dtype, device=X.device), X], -1)
        self.y = y
        rows = getattr(kernel, "rows", 2 * kernel.k)  # 2k, and one more for a learned temperature
        self.shape = (rows, d + 1)
        self.P = rows * (d + 1)
        self.free = free.reshape(-1)
        self.free_idx = torch.nonzero(self.free).squeeze(1)
        self.lower = None if lower is None else lower.reshape(-1)
        self.upper = None if upper is None else upper.reshape(-1)
        self.rep_of = torch.arange(R * S, device=X.device) // S
        self.n_evals = 0
        self._pairs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._assembly_idx: dict[torch.device, torch.Tensor] = {}
        self._input_pairs: dict[tuple[int, int], torch.Tensor] = {}
        self._transposed: torch.Tensor | None = None
        self.set_active(torch.arange(R * S, device=X.device))

    def transposed_inputs(self) -> torch.Tensor:
        """The augmented inputs transposed, (R, d+1, n) and contiguous (the C++ Newton loop's layout), made once."""
        if self._transposed is None:
            self._transposed = self.X.transpose(1, 2).contiguous()
        return self._transposed

    # ------------------------------------------------------------ active set
    def set_active(self, idx: torch.Tensor) -> None:
        """Restrict evaluations to the problems ``idx`` (global indices, increasing)."""
        self.active = idx
        self._input_pairs.clear()
        if idx.numel() == self.R * self.S:
            self._Xg, self._yg, self._s = self.X, self.y, self.S
        else:
            reps = self.rep_of[idx]
            self._Xg, self._yg, self._s = self.X[reps], self.y[reps], 1

    def _theta4(self, theta: torch.Tensor) -> torch.Tensor:
        return theta.reshape(-1, self._s, *self.shape)

    # ------------------------------------------------------------ evaluation
    def value(self, theta: torch.Tensor) -> torch.Tensor:
        """Objective of the active problems, shape (A,)."""
        self.n_evals += 1
        return self.kernel.value(self._theta4(theta), self._Xg, self._yg).reshape(-1)

    def value_grad(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Objective (A,) and gradient (A, P); fixed coordinates get a zero gradient."""
        self.n_evals += 1
        loss, grad = self.kernel.value_grad(self._theta4(theta), self._Xg, self._yg)
        grad = grad.reshape(theta.shape)
        return loss.reshape(-1), grad.mul_(self.free)

    def value_grad_on(self, theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Objective and gradient of each active problem on its own data ``X`` (A, m, d+1), ``y`` (A, m)."""
        loss, grad = self.kernel.value_grad(theta.reshape(-1, 1, *self.shape), X, y)
        return loss.reshape(-1), grad.reshape(theta.shape).mul_(self.free)

    def _pair_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """For the 2k derivative rows and the d+1 inputs: the position of every ordered pair (i, j) among the
        unordered pairs in the order of :func:`_pair_products` (cached per device)."""
        if self._pairs is None or self._pairs[0].device != device:
            tables = []
            for m in self.shape:
                a, b = torch.triu_indices(m, m, device=device)
                full = torch.empty(m, m, dtype=torch.long, device=device)
                pos = torch.arange(a.numel(), device=device)
                full[a, b] = pos
                full[b, a] = pos
                tables.append(full)
            self._pairs = (tables[0], tables[1])
        return self._pairs

    def gauss_newton(self, theta: torch.Tensor, *, max_bytes: int | None = None, exact: bool = False,
                     out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""Objective (A,), :math:`H = J^\top J/n` (A, F, F) and :math:`b = J^\top r/n` (A, F).

        With ``exact=True`` H is half the exact Hessian of the objective,
        :math:`\frac1n\sum_t (u_t u_t^\top + r_t W_t) \otimes \tilde x_t\tilde x_t^\top`
        (:meth:`MeanKernel.exact_curvature_rows`): the residual-curvature term that Gauss-Newton drops is
        added to the pair products before the one matrix product, at the same cost.  Then
        :math:`L(\Theta + \delta) = L + 2b^\top\delta + \delta^\top H\delta + O(\|\delta\|^3)`.

        ``F`` is the number of free coordinates; the gradient is :math:`2b`.  The Jacobian row of
        observation :math:`t` is the Kronecker product :math:`u_t \otimes \tilde x_t` (module docstring), so

        .. math:: H_{(j,l),(j',l')} = \frac1n \sum_t (u_{tj} u_{tj'})\,(\tilde x_{tl} \tilde x_{tl'}),

        one matrix product of the :math:`2k(2k+1)/2` products :math:`u_{tj}u_{tj'}` (:math:`j \le j'`) with
        the :math:`(d+1)(d+2)/2` products :math:`\tilde x_{tl}\tilde x_{tl'}` (:math:`l \le l'`): about
        :math:`nP^2/2` flops instead of the :math:`2nP^2` of :math:`J^\top J` with J formed explicitly
        (3.7x fewer at k = 9, d = 32), and J is never stored.  Observations are processed in chunks whose
        arrays — the kernel's workspace, the curvature-row temporaries, the pair products of u and of
        :math:`\tilde x` (:meth:`_hessian_chunk`) — take at most ``max_bytes``: by default 8 MiB on a CPU (the
        products are written and read back from cache; 128 MiB chunks measured 1.4x slower at n = 100,000) and
        :data:`CUDA_WORKSPACE_BYTES` on a GPU, where each chunk costs a dozen kernel launches and small ones leave
        the device idle.  H is then gathered from the packed sums straight into its (A, F, F) output
        (:meth:`_assemble`), so beyond the outputs and the (A, 2k(2k+1)/2, (d+1)(d+2)/2) accumulator a call
        allocates about ``max_bytes`` whatever n (before issue 21, which counted the pair products only: up to 7x).
        The pair products of :math:`\tilde x` depend on the data only: up to ``max_bytes`` of them are kept between
        calls on the same active set (:meth:`_input_pair_products`), the same numbers formed once.
        ``out``, a spare (A, F, F) tensor (an earlier H no longer needed), receives H instead of a fresh allocation:
        on a CPU a fresh batch of 20 Hessians of 594 parameters (56 MB) is mapped from the system page by page
        (about 1 ms per problem), where one H alone is reused from the heap.
        """
        self.n_evals += 1
        if isinstance(self.kernel, ReferenceKernel):
            return self._gauss_newton_reference(theta, exact)
        th = self._theta4(theta)
        G, s, two_k, p = th.shape
        A, n = G * s, self.n
        mu, mx = two_k * (two_k + 1) // 2, p * (p + 1) // 2
        M = torch.zeros(G, s * mu, mx, dtype=theta.dtype, device=theta.device)
        b = torch.zeros(G, s * two_k, p, dtype=theta.dtype, device=theta.device)
        loss = torch.zeros(A, dtype=theta.dtype, device=theta.device)
        if max_bytes is None:
            max_bytes = CUDA_WORKSPACE_BYTES if theta.device.type == "cuda" else 2**23
        chunk = self._hessian_chunk(G, s, max_bytes, exact, theta.element_size())
        for lo in range(0, n, chunk):
            Xc, yc = self._Xg[:, lo : lo + chunk], self._yg[:, lo : lo + chunk]
            c = Xc.shape[1]
            if exact:
                r, u, uu = self.kernel.exact_curvature_rows(th, Xc, yc)
                uu = uu.view(G, s * mu, c)
            else:
                r, u = self.kernel.residual_jacobian(th, Xc, yc)  # (G, s, c), (G, s, 2k, c)
                uu = _pair_products(u.view(A, two_k, c)).view(G, s * mu, c)
            xx = self._input_pair_products(lo, Xc, max_bytes)  # (G, mx, c)
            M.baddbmm_(uu, xx.transpose(1, 2))
            del uu, xx
            b.baddbmm_(u.mul_(r.unsqueeze(2)).view(G, s * two_k, c), Xc)
            loss.add_((r * r).sum(2).reshape(A))
        H = self._assemble(M.view(A, mu, mx).div_(n), max_bytes, out)
        b = b.reshape(A, self.P)[:, self.free_idx]
        return loss / n, H, b / n

    def _input_pair_products(self, lo: int, Xc: torch.Tensor, max_bytes: int) -> torch.Tensor:
        r"""The pair products :math:`\tilde x_{tl}\tilde x_{tl'}` (:math:`l \le l'`) of the chunk of observations
        starting at ``lo``, shape (G, (d+1)(d+2)/2, c).  They depend on the data only, so they are kept for the next
        Hessian of the same active set while all kept chunks take at most ``max_bytes`` (the chunk budget of
        :meth:`gauss_newton`): a problem whose pair products fit that budget forms them once per active set instead
        of once per iteration."""
        key = (lo, Xc.shape[1])
        xx = self._input_pairs.get(key)
        if xx is None:
            xx = _pair_products(Xc.transpose(1, 2).contiguous())
            kept = sum(v.numel() * v.element_size() for v in self._input_pairs.values())
            if kept + xx.numel() * xx.element_size() <= max_bytes:
                self._input_pairs[key] = xx
        return xx

    def _hessian_chunk(self, G: int, s: int, max_bytes: int, exact: bool, itemsize: int) -> int:
        """Observations per chunk of :meth:`gauss_newton`: every array a chunk allocates (the kernel's
        :meth:`MeanKernel.hessian_row_elems` per problem, the transposed inputs and their (d+1)(d+2)/2 pair products
        per group) fits in ``max_bytes``."""
        p, kernel = self.p, self.kernel
        assert isinstance(kernel, MeanKernel)  # gauss_newton sends a ReferenceKernel to _gauss_newton_reference
        per_row = (G * s * kernel.hessian_row_elems(exact) + G * (p + p * (p + 1) // 2)) * itemsize
        return max(1, min(self.n, max_bytes // max(1, per_row)))

    def _assemble(self, M: torch.Tensor, max_bytes: int, out: torch.Tensor | None = None) -> torch.Tensor:
        r"""H (A, F, F) over the free coordinates from the packed pair sums M (A, m_u, m_x):
        :math:`H_{a,(i,l),(j,l')} = M_{a,\,\mathrm{pos}_u(i,j),\,\mathrm{pos}_x(l,l')}` (coordinate f = i(d+1) + l).

        One gather straight into the output (``out`` when it has H's shape), with flat indices of at most
        ``max_bytes`` (two int64 tables per block of rows): no (A, P, P) temporaries besides H itself.  When the
        whole (F, F) index fits, it is built once per device and kept (:meth:`_assembly_index`); on a CPU, above
        :data:`CPU_PER_PROBLEM_BYTES`, each problem is then gathered by itself, a one-dimensional ``index_select``
        (A = 20, F = 594: 0.2 ms per problem, against 1.7 ms for one ``index_select`` along the second axis of the
        batch and 1.4 ms to rebuild the index).
        """
        A, mu, mx = M.shape
        F = self.free_idx.numel()
        flat = M.view(A, mu * mx)
        rows = max(1, min(F, max_bytes // (2 * 8 * F)))
        fits = out is not None and out.shape == (A, F, F) and out.dtype == M.dtype and out.is_contiguous()
        H = out if fits else M.new_empty(A, F, F)
        if rows == F:  # one block: the gather's (A, F F) output is H
            idx = self._assembly_index(M.device, mx)
            if not per_problem_on_cpu(H):
                return torch.index_select(flat, 1, idx, out=H.view(A, F * F)).view(A, F, F)
            for a in range(A):
                torch.index_select(flat[a], 0, idx, out=H[a].view(-1))
            return H
        for lo in range(0, F, rows):
            idx = self._flat_positions(M.device, mx, lo, lo + rows)
            for a in range(A):
                torch.index_select(flat[a], 0, idx, out=H[a, lo : lo + rows].view(-1))
        return H

    def _assembly_index(self, device: torch.device, mx: int) -> torch.Tensor:
        """The flat (F F,) positions in the packed pair sums (A, m_u m_x) of H's entries, row-major (built on first
        use on ``device`` and kept: F = 594 takes 2.8 MB)."""
        idx = self._assembly_idx.get(device)
        if idx is None:
            idx = self._assembly_idx[device] = self._flat_positions(device, mx, 0, self.free_idx.numel())
        return idx

    def _flat_positions(self, device: torch.device, mx: int, lo: int, hi: int) -> torch.Tensor:
        r"""Flat positions in the packed pair sums of H's rows ``lo:hi`` (all F columns), row-major:
        :math:`\mathrm{pos}_u(i, j)\,m_x + \mathrm{pos}_x(l, l')` for free coordinates f = i(d+1) + l."""
        u_pair, x_pair = self._pair_tables(device)
        free = self.free_idx.to(device)
        i, l = free // self.p, free % self.p
        return u_pair[i[lo:hi]][:, i].mul_(mx).add_(x_pair[l[lo:hi]][:, l]).view(-1)

    def _gauss_newton_reference(self, theta: torch.Tensor, exact: bool
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`gauss_newton` for a :class:`ReferenceKernel`: J and the exact Hessian by autograd
        (:meth:`ReferenceKernel.residual_derivatives`)."""
        kernel = self.kernel
        assert isinstance(kernel, ReferenceKernel)
        s, n = self._s, self.n
        th = theta.reshape(-1, *self.shape)
        X, y = self._Xg.repeat_interleave(s, 0), self._yg.repeat_interleave(s, 0)
        r, J, Hx = kernel.residual_derivatives(th, X, y, exact=exact)
        J = J[:, :, self.free_idx]
        if Hx is None:
            H = J.transpose(1, 2) @ J
        else:
            H = Hx[:, self.free_idx][:, :, self.free_idx]
        b = (J.transpose(1, 2) @ r.unsqueeze(-1)).squeeze(-1)
        return r.square().sum(1) / n, H / n, b / n

    def kink_tolerance(self, theta: torch.Tensor) -> torch.Tensor:
        r"""Largest one-sided gradient (sup-norm) at a non-smooth stationary point of an objective with kinks.

        When observation t crosses the kink of a relu expert, the gradient jumps by at most
        :math:`\frac2n |r_t|\,\|\tilde x_t\|_\infty` in the coordinates of that expert (the gate weight
        :math:`\pi \le 1`).  At a local minimum where at most :math:`k(d+1)` observations sit on kink
        hyperplanes (generic position: d + 1 points fix each hyperplane) the gradient evaluated with
        :math:`\varphi'(0) = 0` is within :math:`k(d+1)\,\frac2n\max_t|r_t|\max_t\|\tilde x_t\|_\infty` of a
        subgradient that vanishes.  Returns that bound for each active problem, shape (A,).
        """
        th = self._theta4(theta)
        f = self.kernel.mean(th, self._Xg)  # (G, s, n), a fresh tensor: the residuals overwrite it
        r = f.sub_(self._yg.unsqueeze(1)).abs_().amax(-1).reshape(-1)  # (A,)
        X = self._Xg  # max |x| as max(max x, -min x): no (G, n, d+1) copy of the inputs
        xmax = torch.maximum(X.amax((1, 2)), X.amin((1, 2)).neg()).repeat_interleave(self._s)
        k = self.kernel.k
        return k * (self.p) * 2.0 / self.n * r * xmax

    # -------------------------------------------------------------- box
    def project(self, theta: torch.Tensor) -> torch.Tensor:
        """Clamp onto the box (identity without one)."""
        if self.lower is None:
            return theta
        return torch.maximum(torch.minimum(theta, self.upper), self.lower)

    def projected_gradient(self, theta: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Zero the components that point out of the box at active bounds."""
        if self.lower is None:
            return grad
        blocked = ((theta <= self.lower) & (grad > 0)) | ((theta >= self.upper) & (grad < 0))
        return grad.masked_fill(blocked, 0.0)

    def at_bound(self, theta: torch.Tensor) -> torch.Tensor:
        """Per problem: does any free coordinate sit on a bound?  Shape (A,)."""
        if self.lower is None:
            return torch.zeros(theta.shape[0], dtype=torch.bool, device=theta.device)
        tol_lo = 1e-12 * (1.0 + self.lower.abs())
        tol_hi = 1e-12 * (1.0 + self.upper.abs())
        hit = (theta <= self.lower + tol_lo) | (theta >= self.upper - tol_hi)
        return (hit & self.free).any(1)
