"""Importable helper for the memory tests: the peak of live torch CPU allocations during a call."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from torch.profiler import ProfilerActivity, profile


def torch_peak(fn: Callable[[], Any]) -> float:
    """Largest sum of live torch CPU allocations during ``fn()``, in bytes, replayed from the profiler's memory
    events (each operation's allocations at its start, frees where they happen)."""
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return float(peak)
