"""Shared helpers of the vignette tests."""

from __future__ import annotations

import time
from types import ModuleType

import moestat._vignette_index as vindex


def load_vignette(name: str) -> ModuleType:
    """The vignette ``name`` as installed (through the package index), checking that importing it computes nothing
    (under 5 s: a vignette that fitted at import would take far longer)."""
    t0 = time.perf_counter()
    module = vindex.load(vindex.find(name))
    assert time.perf_counter() - t0 < 5
    return module
