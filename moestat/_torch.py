"""Conversions between the numpy edge of the API and the torch core.

Every model formula is written once, in torch.  Public functions accept numpy
arrays or torch tensors; these helpers decide the device and dtype of the
computation and convert results back to the caller's array type.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

Array = Any  # numpy.ndarray | torch.Tensor


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """Return the torch device for ``device`` ("auto" picks CUDA when present).

    Raises
    ------
    ValueError
        If ``device`` is "cuda" and no CUDA device is available.
    """
    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} was requested but CUDA is not available; "
            "pass device='cpu' or device='auto'."
        )
    return dev


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    """float64 unless ``dtype`` says otherwise, on every device.

    Estimates must not depend on the hardware: float32 round-off in a mean of squared residuals (relative
    ~1e-7) limits parameters along flat directions to ~3e-4, the size of the estimation errors that rate
    studies measure at large n.  ``dtype="float32"`` is a choice for speed on GPUs with slow float64.
    """
    if dtype is None:
        return torch.float64
    if isinstance(dtype, str):
        try:
            return {"float64": torch.float64, "float32": torch.float32, "double": torch.float64,
                    "float": torch.float32}[dtype]
        except KeyError:
            raise ValueError(f"dtype={dtype!r} is not supported; use 'float64' or 'float32'.") from None
    return dtype


def is_torch(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def to_tensor(x: Array, *, device: torch.device | None = None,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """Convert ``x`` (numpy, list, scalar or tensor) to a tensor on ``device``/``dtype``."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device or x.device, dtype=dtype or x.dtype)
    arr = np.asarray(x, dtype=np.float64)
    if not arr.flags.writeable:  # torch would share a read-only buffer (pandas 3 columns are) and warn about it
        arr = arr.copy()
    return torch.as_tensor(arr, dtype=dtype or torch.float64, device=device or "cpu")


def to_numpy(x: Array) -> np.ndarray:
    """Convert a tensor (any device) or array-like to a numpy array."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def reference_tensor_kwargs(*arrays: Array) -> dict[str, Any]:
    """The device/dtype of the first torch tensor among ``arrays`` (CPU float64 if none)."""
    for a in arrays:
        if isinstance(a, torch.Tensor):
            return {"device": a.device, "dtype": a.dtype}
    return {"device": torch.device("cpu"), "dtype": torch.float64}


@contextmanager
def cpu_threads(threads: int | None, device: torch.device) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads on CPU (restored afterwards).

    moestat's fitters work on many small batched problems; on a CPU shared with other processes,
    OpenMP threads that wait for each other made such fits 10-25x slower than one thread (measured
    on a 2-core machine, docs/performance.md).  ``None`` leaves torch's setting alone; on CUDA the
    setting is irrelevant and left alone too.
    """
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}.")
    if threads is None or device.type != "cpu":
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)
