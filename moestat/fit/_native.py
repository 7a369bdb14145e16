r"""The fused C++ least-squares kernel (``_lsq_native.cpp``), built on first use with torch's extension builder.

One call evaluates the objective and gradient of every problem of a batch (:class:`~moestat.fit._objective.MeanKernel`
layout).  Observations are processed in blocks small enough that a block's inputs, its pre-activations
:math:`Z = \Theta\tilde X^\top` and its derivative rows :math:`U = c\,\partial f/\partial Z` stay in the L2 cache
between the forward product, the element-wise pass and the backward product; the element-wise pass is one
vectorised loop (``at::vec``) over the observations.  In Python, with eager torch operations or a
``torch.compile``'d graph, each block costs tens of microseconds of call overhead, so blocks that small do not pay
there, and with large blocks the three steps stream Z and U through memory (docs/performance/lse.md).

The extension is compiled once per machine and torch version (about 8 s with g++; cached under
``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) for the vector instruction set ATen uses on
the CPU (AVX-512, AVX2, else portable code).  Without a C++ compiler on PATH, or if a build fails, the callers
use the eager kernel.  The expert activations are not written here: :func:`source` generates them from the
expert registry (:attr:`moestat.experts.ExpertFamily.native`), so a family's formulas live in one file.

Two more extensions are built the same way: the trust-region Newton loop of ``fit_lse(compile=True)``
(``_newton_native.cpp``, :func:`load_newton`), which shares the activations and gate weights of
``_native_common.cpp`` with this kernel, and the EM loop of ``fit_mle(compile=True)`` (``_em_native.cpp``,
:func:`load_em`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from ..exceptions import warn_user
from ..experts import ExpertFamily, native_families

SOURCE = Path(__file__).with_name("_lsq_native.cpp")
EM_SOURCE = Path(__file__).with_name("_em_native.cpp")
NEWTON_SOURCE = Path(__file__).with_name("_newton_native.cpp")
#: The L-BFGS phase of ``fit_mle(compile=True)``, inserted into :data:`EM_SOURCE` (one extension).
MLE_LBFGS_SOURCE = Path(__file__).with_name("_mle_lbfgs_native.cpp")
#: The element-wise pieces both least-squares kernels share (activations, gate weights), inserted into each.
COMMON_SOURCE = Path(__file__).with_name("_native_common.cpp")

#: Largest number of experts the kernel takes (its per-observation work arrays are sized at compile time).
MAX_K = 32
GATE_CODES = {"sigmoid": 0, "softmax": 1, "topk": 2}
#: Kernel code of each expert family with a C++ form, in registry order.
ACTIVATION_CODES = {f.name: i for i, f in enumerate(native_families())}
_MARKER = "// @ACTIVATION_CASES@"
_SECOND_MARKER = "// @SECOND_DERIVATIVE_CASES@"
_COMMON_MARKER = "// @NATIVE_COMMON@"
_LBFGS_MARKER = "// @MLE_LBFGS@"

#: Bytes of one block's inputs, Z and U (the kernel's working set: half of a 2 MiB L2 cache).  At k = 9, d = 32
#: (1,899 rows) it measured best or within 1% of best among 474-7,598 rows at 20 x 1,000, 20 x 10,000 and
#: 1 x 100,000 observations (benchmarks/lse_kernel_chunks.py).
BLOCK_BYTES = 2**20

#: A built extension: ``torch.ops.<extension name>``, whose attributes are the C++ functions.
NativeOps = Any


def activation_code(family: ExpertFamily) -> int | None:
    """The kernel's code for an expert family (None: not built in; use another kernel)."""
    if not family.input_dependent:
        return ACTIVATION_CODES["linear"]
    return ACTIVATION_CODES.get(family.name)


def _cases(template: str, path: Path, marker: str, field: str) -> str:
    """``template`` with ``marker`` replaced by one ``case`` per family of :data:`ACTIVATION_CODES` that has C++
    statements in ``field`` (:class:`~moestat.experts.ExpertFamily`)."""
    if marker not in template:
        raise RuntimeError(f"{path.name} lost its {marker!r} marker.")
    families = {f.name: f for f in native_families()}
    cases = "\n    ".join(f"case {code}: {{ {getattr(families[name], field)} break; }}"
                           for name, code in ACTIVATION_CODES.items() if getattr(families[name], field) is not None)
    return template.replace(marker, cases)


def _generated(path: Path) -> str:
    r"""The C++ source of ``path`` with :data:`COMMON_SOURCE` inserted and one ``case`` of :math:`\varphi, \varphi'`
    and :math:`\varphi''` per family of :data:`ACTIVATION_CODES` (from the registry)."""
    code = path.read_text()
    if _COMMON_MARKER not in code:
        raise RuntimeError(f"{path.name} lost its {_COMMON_MARKER!r} marker.")
    code = code.replace(_COMMON_MARKER, COMMON_SOURCE.read_text())
    return _cases(_cases(code, COMMON_SOURCE, _MARKER, "native"), COMMON_SOURCE, _SECOND_MARKER, "native_second")


@functools.cache
def source() -> str:
    """The kernel's C++ source with one ``case`` per family of :data:`ACTIVATION_CODES` (from the registry)."""
    return _generated(SOURCE)


@functools.cache
def em_source() -> str:
    """The EM extension's C++ source: :data:`EM_SOURCE` with :data:`MLE_LBFGS_SOURCE` inserted."""
    code = EM_SOURCE.read_text()
    if _LBFGS_MARKER not in code:
        raise RuntimeError(f"{EM_SOURCE.name} lost its {_LBFGS_MARKER!r} marker.")
    return code.replace(_LBFGS_MARKER, MLE_LBFGS_SOURCE.read_text())


@functools.cache
def newton_source() -> str:
    """The Newton loop's C++ source, generated as :func:`source`."""
    return _generated(NEWTON_SOURCE)


def gate_args(gate: str, k: int, top_k: int | None) -> tuple[int, int]:
    """The kernels' gate arguments: the gate's code and the number of experts it keeps (``top_k`` for a top-K gate,
    all k otherwise)."""
    return GATE_CODES[gate], top_k if gate == "topk" and top_k is not None else k


def supports(gate: str, k: int, family: ExpertFamily) -> bool:
    """Whether the native kernel evaluates this model (sigmoid, softmax or top-K softmax gate, k <= 32, an expert
    family with a C++ form)."""
    return gate in GATE_CODES and 1 <= k <= MAX_K and activation_code(family) is not None


def newton_supports(gate: str, k: int, family: ExpertFamily) -> bool:
    r"""Whether the native Newton loop fits this model: as :func:`supports`, and :math:`\varphi''` in C++
    (:attr:`~moestat.experts.ExpertFamily.native_second`) unless the family is piecewise linear."""
    if not supports(gate, k, family):
        return False
    return not family.input_dependent or family.piecewise_linear or family.native_second is not None


@functools.cache
def compiler_available() -> bool:
    """Whether a C++ compiler is on PATH (the native kernels need one); looked up once per process."""
    return any(shutil.which(c) for c in ("c++", "g++", "clang++"))


def block_rows(rows_per_obs: int, p: int, itemsize: int) -> int:
    """Observations per block: inputs (p values) and the Z and U rows of every problem fit in BLOCK_BYTES."""
    return max(64, BLOCK_BYTES // ((2 * rows_per_obs + p) * itemsize))


#: Compiler flags per vector instruction set, as torch's inductor uses them for its generated C++ (x86-64 only).
_ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2"],
}


def _isa() -> str:
    """The vector instruction set ATen dispatches to on this CPU (``AVX512``, ``AVX2``, else portable code)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "scalar"
    capability = torch.backends.cpu.get_cpu_capability()
    return capability if capability in _ISA_FLAGS else "scalar"


def _build(stem: str, code: str, *, implicit_headers: bool = False) -> NativeOps:
    """Compile (first call on a machine) and load the extension of C++ source ``code``; its functions are the
    operators of ``torch.ops.<name>``, where the name carries ``stem``, the instruction set, the torch version and a
    hash of the code, so a changed source builds a new extension.

    The sources include ATen and torch's operator registry (``TORCH_LIBRARY``) only, and the builder is told not
    to prepend ``torch/extension.h`` (the C++ frontend and pybind11), which took 11-14 s of a 22-24 s build
    (``benchmarks/native_build.py`` builds each extension both ways; ``implicit_headers=True`` is its baseline).
    The header set changes the compiler's inlining, and with it where products and sums fuse into FMAs, so the
    two builds' results agree to rounding, not bit for bit."""
    from torch.utils import cpp_extension

    try:  # the ninja wheel's binary, also when the interpreter's bin folder is not on PATH
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    isa = _isa()
    # at::parallel_for is an OpenMP pragma in a header: without -fopenmp the kernel would run on one thread
    openmp = ["-fopenmp"] if sys.platform.startswith("linux") else []
    flags = ["-O3", *_ISA_FLAGS.get(isa, []), *openmp]
    digest = hashlib.sha256(code.encode()).hexdigest()[:12]
    name = f"moestat_{stem}_{isa.lower()}_torch{torch.__version__.split('+')[0].replace('.', '_')}_{digest}"
    # a torch whose builder lacks no_implicit_headers prepends torch/extension.h: a working library, built slower
    lean = not implicit_headers and "no_implicit_headers" in _load_inline_parameters()
    name += "" if lean else "_implicit_headers"
    cpp_extension.load_inline(  # type: ignore[no-untyped-call]
        name=name, cpp_sources=[code], extra_cflags=flags, extra_ldflags=openmp, is_python_module=False,
        verbose=False, **({"no_implicit_headers": True} if lean else {}))
    return getattr(torch.ops, name)


@functools.cache
def _load_inline_parameters() -> frozenset[str]:
    """The keyword arguments this torch's ``cpp_extension.load_inline`` takes."""
    from torch.utils import cpp_extension

    return frozenset(inspect.signature(cpp_extension.load_inline).parameters)


@functools.cache
def load() -> NativeOps | None:
    """Build (first call on a machine) and import the least-squares extension; None, with a warning, if that fails."""
    try:
        return _build("lsq", source())
    except Exception as err:  # any build or import failure means: use another kernel
        warn_user(f"moestat's native least-squares kernel could not be built ({type(err).__name__}: {err}); "
                      "using the eager kernel instead.", UserWarning)
        return None


@functools.cache
def load_newton() -> NativeOps | None:
    """Build (first call on a machine) and import the Newton extension (``_newton_native.cpp``: the trust-region
    Newton method of :func:`moestat.fit._optim.newton`, one whole run per problem); None, with a warning, if that
    fails."""
    try:
        return _build("newton", newton_source())
    except Exception as err:  # any build or import failure means: use the tensor loop
        warn_user(f"moestat's native Newton loop could not be built ({type(err).__name__}: {err}); using the tensor "
                  "loop instead.", UserWarning)
        return None


@functools.cache
def load_em() -> NativeOps | None:
    """Build (first call on a machine) and import the EM extension (``_em_native.cpp``: EM with a softmax gate and
    Gaussian, Poisson or binomial experts, :func:`moestat.fit.em.em_fit` with ``native=True``, the GLM starts' IRLS,
    and ``_mle_lbfgs_native.cpp``, the L-BFGS phase of :func:`moestat.fit.mle.gradient_fit` with a ``native``
    kernel); None, with a warning, if that fails."""
    try:
        return _build("em", em_source())
    except Exception as err:  # any build or import failure means: use the tensor loop
        warn_user(f"moestat's native EM kernel could not be built ({type(err).__name__}: {err}); using the tensor "
                  "loop instead.", UserWarning)
        return None
