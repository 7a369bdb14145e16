r"""Where a study's cells run: one device for all, a device per cell, or process pools on several devices.

A study run on a GPU host has two kinds of workers: the GPU, which fits the largest cells many times faster than a
CPU core but spends a few milliseconds of host time per iteration whatever the size, and the host's CPU cores, which
fit small cells about as fast.  :class:`CellLanes` hands cells to one process pool per device as their workers become
free: the devices named first take the largest cells left, the device named last takes the smallest, and the two
ends meet wherever the devices' speeds put them, with no size threshold to tune.  Near the meeting point the last
device holds back from a cell unless, at the speeds measured so far, it would finish that cell in half the time the
others need for everything left, so that a CPU core does not start a large cell at the end that the GPU would have
fitted in a second.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._torch import resolve_device

DeviceRule = Callable[[Mapping[str, Any]], str]

#: The last device takes a cell only if its estimated time for it, times this margin, is at most the time the other
#: devices need for every cell left (:class:`CellLanes`).  Chosen by replaying the flagship study's 200 measured cell
#: times (``benchmarks/project_study_pools.py --margin``): with two GPU processes and fourteen CPU ones, 2 keeps the
#: projected run at 107 s or less where 1 reaches 123 s, once each GPU process's first cell carries 10 s of start-up.
HOLD_BACK_MARGIN = 2.0


def resolve_device_name(device: Any, where: str) -> str:
    """``device`` ("auto", "cpu", "cuda", "cuda:N") as the name torch gives it; errors name ``where``."""
    if not isinstance(device, str):
        raise ValueError(f"{where} must be a device name ('auto', 'cpu', 'cuda' or 'cuda:N'), got {device!r}.")
    try:
        return str(resolve_device(device))
    except RuntimeError as exc:  # torch's own message for a malformed name ("Invalid device string")
        raise ValueError(f"{where}={device!r} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'.") from exc
    except ValueError as exc:  # CUDA asked for on a machine without it
        raise ValueError(f"{where}={device!r}: CUDA is not available on this machine; use 'cpu' or 'auto'.") from exc


def parse_workers(workers: int | str | Mapping[str, int] | None) -> int | dict[str, int] | None:
    """Worker processes: ``None``, a count, or one pool per device as a mapping or as text ``"cuda=2,cpu=14"``.

    Raises
    ------
    ValueError
        Naming ``workers`` and the form it takes.
    """
    if workers is None:
        return None
    if isinstance(workers, str):
        text = workers.strip()
        if text.lstrip("+-").isdigit():
            workers = int(text)
        else:
            pools: dict[str, int] = {}
            for part in text.split(","):
                key, sep, number = part.partition("=")
                if not sep or not number.strip().isdigit():
                    raise ValueError(f"workers={text!r} is not a number of processes or a list of DEVICE=N pools, "
                                     "e.g. 'cuda=2,cpu=14'.")
                pools[key.strip()] = int(number)
            workers = pools
    if isinstance(workers, bool):
        raise ValueError(f"workers must be a number of processes or a mapping of devices to them, got {workers!r}.")
    if isinstance(workers, int):
        if workers < 1:
            raise ValueError(f"workers must be a positive number of processes, got {workers}.")
        return workers
    if not isinstance(workers, Mapping) or not workers:
        raise ValueError(f"workers must be a number of processes or a non-empty mapping of devices to them, e.g. "
                         f"{{'cuda': 2, 'cpu': 14}}; got {workers!r}.")
    out: dict[str, int] = {}
    for name, count in workers.items():
        device = resolve_device_name(name, "workers' device")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"workers[{name!r}] must be a positive number of processes, got {count!r}.")
        if device in out:
            raise ValueError(f"workers names device {device!r} twice ({list(workers)}); give each device one pool.")
        out[device] = count
    return out


def executor_for(workers: int | dict[str, int] | None) -> str | None:
    """``Study.run``'s executor for parsed ``workers`` (:func:`parse_workers`): worker processes for pools per device
    or more than one process, else the calling process."""
    return "processes" if isinstance(workers, dict) or (workers or 1) > 1 else None


def cell_size(cell: Mapping[str, Any]) -> int:
    """The order in which cells are handed out: by sample size, the cost that grows fastest."""
    return int(cell["n"])


class CellLanes:
    """Cells waiting for the workers of several devices, handed out largest first or smallest first.

    Parameters
    ----------
    cells : sequence of dict
        The cells to run.
    devices : sequence of str
        The pools' devices, in the order of preference for large cells: every device but the last takes the largest
        cell left, the last takes the smallest (with one device, the largest).
    placement : callable, optional
        A fixed device per cell (``placement(cell) -> device``); each device then takes only its own cells, largest
        first.  Without it any device may take any cell.
    workers : mapping of str to int, optional
        Each device's number of workers.  With it, the small end holds back where it would be slower: a worker of
        the last device declines the smallest cell left unless it would finish it in at most half the time the
        other devices, at their measured speeds (:meth:`record`), need to get through every cell left (the margin
        :data:`HOLD_BACK_MARGIN`).  Without it (or before both ends have finished a cell) every request is served.

    Notes
    -----
    A device's time for a cell is estimated from the cells it has finished: the median time of the nearest smaller
    size it has finished, scaled up in proportion to ``n`` (or the smallest size it has finished, not scaled down,
    for a cell below all of them).  A GPU's time grows more slowly than n below n ~ 10^5 (it is bound by the host),
    so its estimates err high, towards serving the CPU's request.  A CPU's time can grow faster than n between two
    sizes: in the flagship study's cells the median went from 5.5 s at n = 50,600 to 22.5 s at 160,000, 4.1 times
    for 3.2 times the observations, so its linear estimate can err low by half.  The margin covers that: a cell
    started at the end by a core costs the whole run, one left to the GPU costs it seconds.
    """

    def __init__(self, cells: Sequence[dict[str, Any]], devices: Sequence[str],
                 placement: Callable[[dict[str, Any]], str] | None = None,
                 workers: Mapping[str, int] | None = None) -> None:
        self.devices = list(devices)
        self.workers = dict(workers) if workers is not None else None
        self._seen: dict[str, dict[int, list[float]]] = {d: {} for d in self.devices}
        ordered = sorted(cells, key=lambda c: -cell_size(c))  # stable: ties keep the design's order
        self._small_end = self.devices[-1] if len(self.devices) > 1 and placement is None else None
        if placement is None:
            self._shared: deque[dict[str, Any]] | None = deque(ordered)
            self._own: dict[str, deque[dict[str, Any]]] = {}
        else:
            self._shared = None
            self._own = {d: deque() for d in self.devices}
            for c in ordered:
                self._own[placement(c)].append(c)

    def take(self, device: str) -> dict[str, Any] | None:
        """The next cell for a free worker of ``device``, or None when none is left for it (or it declines)."""
        queue = self._shared if self._shared is not None else self._own[device]
        if not queue:
            return None
        if device != self._small_end:
            return queue.popleft()
        if self.workers is not None and self._others_sooner(device, queue):
            return None
        return queue.pop()

    def record(self, device: str, cell: Mapping[str, Any], seconds: float) -> None:
        """A worker of ``device`` finished ``cell`` in ``seconds``."""
        self._seen[device].setdefault(cell_size(cell), []).append(float(seconds))

    def estimate(self, device: str, n: int) -> float | None:
        """``device``'s time for a cell of size ``n``: the median time of the nearest smaller size it has finished,
        scaled by ``n`` (see the class notes); None before its first cell."""
        seen = self._seen[device]
        if not seen:
            return None
        below = [m for m in seen if m <= n]
        m = max(below) if below else min(seen)
        return float(np.median(seen[m])) * max(n / m, 1.0)

    def _others_sooner(self, device: str, queue: deque[dict[str, Any]]) -> bool:
        assert self.workers is not None
        mine = self.estimate(device, cell_size(queue[-1]))
        if mine is None:
            return False
        others = [d for d in self.devices if d != device]
        total = 0.0
        for d in others:  # the other devices share the queue; their combined rate is the sum of their rates
            times = [self.estimate(d, cell_size(c)) for c in queue]
            if any(t is None for t in times):
                return False
            total += self.workers[d] / sum(t for t in times if t is not None)
        return 1.0 / total < HOLD_BACK_MARGIN * mine

    def waiting(self, device: str) -> int:
        """Cells that a worker of ``device`` could still take."""
        return len(self._shared if self._shared is not None else self._own[device])
