"""Seeds and random draws that give the same numbers on every device.

A torch generator on a CUDA device produces a different stream from a CPU generator with the same
seed, so a fit seeded the same way would start from different points on the two devices.  moestat
therefore keeps one CPU generator per replicate (or per replicate x restart) and draws every random
tensor on the CPU, in the dtype asked for, before moving it to the computation's device: the same
``seed`` gives the same starts, minibatches and router noise on CPU and GPU (the draws are small
against the fits they seed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

CPU = torch.device("cpu")


def fresh_seed(seed: Any) -> Any:
    """``seed`` itself, or for ``None`` a new :class:`numpy.random.SeedSequence` from the operating system's entropy.

    Estimators call it first, so that a fit with ``seed=None`` (fresh randomness, numpy's and scikit-learn's
    default) still records in its settings the entropy it drew and can be repeated from them."""
    return np.random.SeedSequence() if seed is None else seed


def torch_seed(seed: Any) -> int:
    """A 63-bit torch seed derived from ``seed`` (int, None, SeedSequence or a list of them)."""
    if isinstance(seed, (list, tuple)):
        entropy = [int(s.generate_state(1)[0]) for s in seed]
        ss = np.random.SeedSequence(entropy)
    elif isinstance(seed, np.random.SeedSequence):
        ss = seed
    else:
        ss = np.random.SeedSequence(seed)
    return int(ss.generate_state(1, dtype=np.uint64)[0] % (2**63))


def seeded_generators(seeds: Sequence[np.random.SeedSequence]) -> list[torch.Generator]:
    """One CPU torch generator per seed sequence, seeded from 63 bits of the sequence's state."""
    gens = []
    for s in seeds:
        g = torch.Generator(device=CPU)
        g.manual_seed(int(s.generate_state(1, dtype=np.uint64)[0] % (2**63)))
        gens.append(g)
    return gens


def randn(gens: Sequence[torch.Generator], shape: tuple[int, ...], *, device: torch.device | str = CPU,
          dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Standard normal draws of ``shape``, one slice per generator: shape ``(len(gens), *shape)``."""
    out = torch.stack([torch.randn(shape, generator=g, dtype=dtype) for g in gens])
    return out.to(device)


def rand(gens: Sequence[torch.Generator], shape: tuple[int, ...], *, device: torch.device | str = CPU,
         dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """U[0, 1) draws of ``shape``, one slice per generator: shape ``(len(gens), *shape)``."""
    out = torch.stack([torch.rand(shape, generator=g, dtype=dtype) for g in gens])
    return out.to(device)


def randint(gens: Sequence[torch.Generator], high: int, size: int, *,
            device: torch.device | str = CPU) -> torch.Tensor:
    """``size`` indices drawn uniformly from ``0 .. high - 1`` per generator: shape ``(len(gens), size)``."""
    out = torch.stack([torch.randint(high, (size,), generator=g) for g in gens])
    return out.to(device)


def randperm(gens: Sequence[torch.Generator], n: int, *, device: torch.device | str = CPU) -> torch.Tensor:
    """One permutation of ``0 .. n - 1`` per generator: shape ``(len(gens), n)``."""
    out = torch.stack([torch.randperm(n, generator=g) for g in gens])
    return out.to(device)
