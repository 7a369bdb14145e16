"""Argument handling shared by the metrics: (spec, Params) pairs, batching, torch blocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._torch import is_torch
from ..model import MoE
from ..params import Params


def unpack(obj: Any, name: str) -> tuple[MoE | None, Params]:
    """Accept a ``Params``, a ``(MoE, Params)`` pair (e.g. a preset ``Truth``) or a fit result (``fit_lse``,
    ``fit_mle``, ...: its ``params``, with its ``spec`` where it has one)."""
    if isinstance(obj, Params):
        return None, obj
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], MoE) and isinstance(obj[1], Params):
        return obj[0], obj[1]
    spec, params = getattr(obj, "spec", None), getattr(obj, "params", None)
    if isinstance(params, Params):  # a fit result; LSEFit carries no spec, its params say what they are
        return (spec if isinstance(spec, MoE) else None), params
    raise TypeError(
        f"{name} must be a moestat.Params, a (MoE spec, Params) pair such as a preset Truth, or a fit result "
        f"(its params), got {type(obj).__name__}."
    )


def check_compatible(spec_a: MoE | None, pa: Params, spec_b: MoE | None, pb: Params,
                     names: tuple[str, str] = ("params", "truth")) -> None:
    """Raise if two parameter sets cannot be compared atom by atom."""
    a, b = names
    if pa.d != pb.d:
        raise ValueError(
            f"{a} has input dimension d={pa.d} but {b} has d={pb.d}; Voronoi cells and parameter "
            "distances need both on the same input space."
        )
    if spec_a is not None and spec_b is not None and spec_a.family.name != spec_b.family.name:
        raise ValueError(
            f"{a} uses expert family {spec_a.expert!r} but {b} uses {spec_b.expert!r}; parameter-space "
            "losses compare atoms of one expert family. Compare regression functions with l2_distance instead."
        )
    if spec_a is not None and spec_a.d != pa.d:
        raise ValueError(f"{a}: the spec has d={spec_a.d} but its Params have d={pa.d}.")
    if spec_b is not None and spec_b.d != pb.d:
        raise ValueError(f"{b}: the spec has d={spec_b.d} but its Params have d={pb.d}.")


def reference_device(*params: Params) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the first torch Params (CPU float64 otherwise)."""
    for p in params:
        if p.is_torch:
            dt = p.gate_bias.dtype if p.gate_bias.is_floating_point() else torch.float64
            return p.gate_bias.device, dt
    return torch.device("cpu"), torch.float64


@dataclass(frozen=True)
class Blocks:
    """Torch blocks of a Params with a leading batch axis: b0 (B,k), b1 (B,k,d), a (B,k,d), b (B,k)."""

    b0: torch.Tensor
    b1: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor

    @property
    def omega(self) -> torch.Tensor:
        """Atoms used by the Voronoi cells, omega = (beta_1, a, b), shape (B, k, 2d + 1)."""
        return torch.cat([self.b1, self.a, self.b.unsqueeze(-1)], dim=-1)


def blocks(p: Params, device: torch.device, dtype: torch.dtype) -> Blocks:
    """Torch blocks of ``p`` on ``device``; unbatched Params get a batch axis of size 1."""
    p = p.batched()

    def conv(x: Any) -> torch.Tensor:
        if is_torch(x):
            return x.detach().to(device=device, dtype=dtype)
        return torch.as_tensor(x, device=device, dtype=dtype)

    return Blocks(conv(p.gate_bias), conv(p.gate_weight), conv(p.expert_weight), conv(p.expert_bias))


def broadcast_reps(n_a: int, n_b: int, names: tuple[str, str]) -> int:
    """Common replicate count of two batches (1 broadcasts)."""
    if n_a == n_b or n_b == 1:
        return n_a
    if n_a == 1:
        return n_b
    raise ValueError(
        f"{names[0]} has R={n_a} replicates but {names[1]} has R={n_b}; pass one {names[1]} (unbatched) "
        f"or one per replicate."
    )


def as_set(obj: Any, name: str) -> Params:
    """A Params (one atom set), a batched Params (a set of S of them) or a sequence of Params -> batched."""
    if isinstance(obj, Params):
        return obj.batched()
    if isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)) and obj and all(
            isinstance(x, Params) for x in obj):
        return Params.stack([x.numpy() if not x.is_torch else x for x in obj])
    raise TypeError(
        f"{name} must be a Params (k atoms), a batched Params (S, k, ...) holding a set of limits, or a "
        f"list of Params; got {type(obj).__name__}."
    )
