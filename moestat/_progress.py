"""When a long computation shows a progress bar: the rule shared by the likelihood fitter and the inference
functions (``progress=None``: interactive sessions, or runs expected to take longer than :data:`PROGRESS_AFTER_S`)."""

from __future__ import annotations

import sys

__all__ = ["PROGRESS_AFTER_S", "SECONDS_PER_UNIT"]

#: A run expected to take longer than this many seconds shows a progress bar under ``progress=None``.
PROGRESS_AFTER_S = 10.0
#: Rough seconds per unit of work (one start x observation x expert x coefficient) of a batched bootstrap refit,
#: measured on one thread of a shared 2-core CPU (float64, d = 1, k = 2-3, n = 500-2000: 0.6-4e-6); used only to
#: decide whether to show a bar.
SECONDS_PER_UNIT = 2e-6


def _interactive() -> bool:
    """Whether Python runs interactively: a REPL (``sys.ps1``, ``python -i``) or an IPython / Jupyter shell."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def _expected_seconds(n_fits: int, starts: int, n: int, k: int, d: int) -> float:
    """A rough run time of ``n_fits`` batched refits: :data:`SECONDS_PER_UNIT` x fits x starts x n x k x (d + 1)."""
    return SECONDS_PER_UNIT * n_fits * starts * n * k * (d + 1)
