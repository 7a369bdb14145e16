r"""The mixing measure of a mixture of experts: ``Params``.

A fitted or true MoE with ``k`` experts is the measure (nguyen2024 §2.2)

.. math:: G = \sum_{i=1}^{k} w(\beta_{0i})\, \delta_{(\beta_{1i}, \eta_i)},

with gate intercepts :math:`\beta_{0i}` (``gate_bias``), gate slopes
:math:`\beta_{1i}` (``gate_weight``) and expert parameters
:math:`\eta_i = (a_i, b_i)` (``expert_weight``, ``expert_bias``); optional
per-expert noise standard deviations ``noise_sd`` are used by the Gaussian MoE
likelihood.  Every array may carry a leading replicate axis ``R``:
``gate_bias (R, k)``, ``gate_weight (R, k, d)``, ...  Arrays are numpy arrays or
torch tensors (all of one kind); see :meth:`Params.to_torch` and
:meth:`Params.numpy`.

An optional gate ``temperature`` (shape () or (R,), one per replicate) is a parameter of the measure where it was
fitted (``learn_temperature=True`` of :func:`moestat.fit_mle` / :func:`moestat.fit_lse`; Nguyen, Akbarian & Ho, ICML
2024): :class:`moestat.MoE` then divides the gate scores by it instead of by the spec's fixed ``temperature``.  It is
not an atom block (:data:`BLOCKS`): it is common to all experts, and :meth:`Params.permute` leaves it alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from ._torch import Array, is_torch, to_numpy, to_tensor
from ._validation import check_finite, check_int

BLOCKS = ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd")
"""Parameter blocks in their canonical order."""

_VECTOR_BLOCKS = ("gate_weight", "expert_weight")


def _as_array(name: str, value: Any) -> Array:
    if is_torch(value):
        return value
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"Params.{name} must be a numeric array, got {type(value).__name__}.") from exc


@dataclass(frozen=True, eq=False)
class Params:
    r"""Parameters (the mixing measure) of a mixture of experts, optionally batched over replicates.

    Parameters
    ----------
    gate_bias : array, shape (k,) or (R, k)
        Gate intercepts :math:`\beta_0`.
    gate_weight : array, shape (k, d) or (R, k, d)
        Gate slopes :math:`\beta_1`.
    expert_weight : array, shape (k, d) or (R, k, d)
        Expert slopes :math:`a` (zeros for constant experts).
    expert_bias : array, shape (k,) or (R, k)
        Expert intercepts :math:`b`.
    noise_sd : array, shape (k,) or (R, k), optional
        Per-expert noise standard deviations (Gaussian MoE likelihood).
    temperature : array, shape () or (R,), optional
        A fitted gate temperature :math:`\tau > 0`, common to all experts; when set, :class:`moestat.MoE`
        divides the gate scores by it instead of by its own ``temperature``.

    Raises
    ------
    ValueError
        If the shapes are inconsistent, an entry is NaN/inf, ``noise_sd`` is negative or ``temperature`` is not
        positive.
    """

    gate_bias: Array
    gate_weight: Array
    expert_weight: Array
    expert_bias: Array
    noise_sd: Array | None = None
    temperature: Array | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, _as_array(f.name, value))
        kinds = {is_torch(a) for _, a in self.blocks()}
        if self.temperature is not None:
            kinds.add(is_torch(self.temperature))
        if len(kinds) > 1:
            raise TypeError("Params blocks mix numpy arrays and torch tensors; convert them to one kind.")
        gb = self.gate_bias
        if gb.ndim not in (1, 2):
            raise ValueError(
                f"gate_bias must have shape (k,) or (R, k), got shape {tuple(gb.shape)}."
            )
        batch, k = tuple(gb.shape[:-1]), gb.shape[-1]
        if k < 1:
            raise ValueError("Params needs at least one expert (k >= 1); gate_bias is empty.")
        d = self.gate_weight.shape[-1] if self.gate_weight.ndim >= 1 else -1
        expected = {
            "gate_bias": (*batch, k),
            "gate_weight": (*batch, k, d),
            "expert_weight": (*batch, k, d),
            "expert_bias": (*batch, k),
            "noise_sd": (*batch, k),
        }
        for name, arr in self.blocks():
            if tuple(arr.shape) != expected[name]:
                raise ValueError(
                    f"Params.{name} has shape {tuple(arr.shape)} but gate_bias {tuple(gb.shape)} and "
                    f"gate_weight {tuple(self.gate_weight.shape)} imply {expected[name]}; "
                    "all blocks must share the replicate axis R, the number of experts k and the input "
                    "dimension d."
                )
            check_finite(f"Params.{name}", arr)
        if self.noise_sd is not None and bool((self.noise_sd < 0).any()):
            raise ValueError("Params.noise_sd must be non-negative; got a negative standard deviation.")
        if self.temperature is not None:
            self._check_temperature(batch)

    def _check_temperature(self, batch: tuple[int, ...]) -> None:
        t: Any = self.temperature
        if tuple(t.shape) != batch:
            raise ValueError(f"Params.temperature has shape {tuple(t.shape)} but gate_bias "
                             f"{tuple(self.gate_bias.shape)} implies {batch}: one temperature per replicate (a "
                             "scalar for unbatched Params).")
        check_finite("Params.temperature", t)
        if not bool((t > 0).all()):
            raise ValueError(f"Params.temperature must be > 0, got {to_numpy(t).tolist()}; pass a positive "
                             "temperature, or None for the spec's.")

    # ------------------------------------------------------------------ shape
    @property
    def k(self) -> int:
        """Number of experts (atoms)."""
        return int(self.gate_bias.shape[-1])

    @property
    def d(self) -> int:
        """Input dimension."""
        return int(self.gate_weight.shape[-1])

    @property
    def is_batched(self) -> bool:
        """True when the blocks carry a leading replicate axis."""
        return bool(self.gate_bias.ndim == 2)

    @property
    def n_reps(self) -> int | None:
        """Number of replicates R, or None for an unbatched Params."""
        return int(self.gate_bias.shape[0]) if self.is_batched else None

    @property
    def is_torch(self) -> bool:
        return is_torch(self.gate_bias)

    def blocks(self) -> Iterator[tuple[str, Array]]:
        """Iterate over ``(name, array)`` for the blocks that are set, in canonical order."""
        for name in BLOCKS:
            value = getattr(self, name)
            if value is not None:
                yield name, value

    def _map(self, fn: Callable[[str, Array], Array]) -> Params:
        """Apply ``fn(name, array)`` to every block and to the temperature (if set)."""
        extra = {} if self.temperature is None else {"temperature": fn("temperature", self.temperature)}
        return replace(self, **{name: fn(name, a) for name, a in self.blocks()}, **extra)

    # ------------------------------------------------------------ conversion
    def to_torch(self, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> Params:
        """Return a copy whose blocks are torch tensors on ``device``/``dtype``."""
        dev = torch.device(device) if device is not None else None
        return self._map(lambda _, a: to_tensor(a, device=dev, dtype=dtype))

    def numpy(self) -> Params:
        """Return a copy whose blocks are numpy float arrays."""
        return self._map(lambda _, a: to_numpy(a).astype(np.float64, copy=False))

    def detach(self) -> Params:
        """Torch blocks detached from the autograd graph (numpy blocks unchanged)."""
        return self._map(lambda _, a: a.detach() if is_torch(a) else a)

    # ------------------------------------------------------------ replicates
    def batched(self, reps: int | None = None) -> Params:
        """Add a leading replicate axis (of size ``reps``, repeating) if there is none."""
        if self.is_batched:
            if reps is not None and reps != self.n_reps:
                raise ValueError(f"Params already has R={self.n_reps} replicates, not {reps}.")
            return self
        r = 1 if reps is None else check_int("reps", reps)

        def expand(_: str, a: Array) -> Array:
            if is_torch(a):
                return a.unsqueeze(0).expand(r, *a.shape).clone()
            return np.repeat(a[None], r, axis=0)

        return self._map(expand)

    def select(self, rep: int | Sequence[int] | np.ndarray) -> Params:
        """Replicate ``rep`` (an int drops the replicate axis; a sequence keeps it)."""
        if not self.is_batched:
            raise ValueError("select(rep) needs batched Params (with a leading replicate axis).")
        R = int(self.gate_bias.shape[0])
        if isinstance(rep, (int, np.integer)):
            if not -R <= rep < R:
                raise IndexError(f"rep={rep} is out of range for R={R} replicates.")
            return self._map(lambda _, a: a[int(rep)])
        idx = np.asarray(rep, dtype=np.int64)
        return self._map(lambda _, a: a[torch.as_tensor(idx, device=a.device)] if is_torch(a) else a[idx])

    @staticmethod
    def stack(items: Sequence[Params]) -> Params:
        """Stack unbatched Params (or concatenate batched ones) along the replicate axis."""
        if not items:
            raise ValueError("stack needs at least one Params.")
        batched = [p.batched() for p in items]
        out = {}
        for name in BLOCKS:
            vals = [getattr(p, name) for p in batched]
            if any(v is None for v in vals):
                if not all(v is None for v in vals):
                    raise ValueError(f"stack: block {name} is set in some Params and not in others.")
                continue
            out[name] = torch.cat(vals, 0) if is_torch(vals[0]) else np.concatenate(vals, 0)
        temps: list[Any] = [p.temperature for p in batched]
        if any(t is not None for t in temps):
            if not all(t is not None for t in temps):
                raise ValueError("stack: temperature is set in some Params and not in others.")
            out["temperature"] = torch.cat(temps, 0) if is_torch(temps[0]) else np.concatenate(temps, 0)
        return Params(**out)

    # -------------------------------------------------------------- symmetry
    def permute(self, perm: Sequence[int] | np.ndarray) -> Params:
        """Relabel the experts: atom ``i`` of the result is atom ``perm[i]`` of ``self``.

        ``perm`` has shape (k,) (same relabelling for every replicate) or (R, k).
        """
        p = np.asarray(to_numpy(perm), dtype=np.int64)
        valid = p.ndim in (1, 2) and p.shape[-1] == self.k and all(
            sorted(row.tolist()) == list(range(self.k)) for row in p.reshape(-1, self.k)
        )
        if not valid:
            raise ValueError(f"perm must be a permutation of range({self.k}), got {p.tolist()}.")
        if p.ndim == 2 and not self.is_batched:
            raise ValueError("a (R, k) permutation needs batched Params.")
        if p.ndim == 2 and p.shape[0] != self.n_reps:
            raise ValueError(f"perm has {p.shape[0]} rows but Params has R={self.n_reps} replicates.")

        def apply(name: str, a: Array) -> Array:
            if name == "temperature":  # common to all experts: a relabelling leaves it alone
                return a
            axis = 1 if self.is_batched else 0
            if p.ndim == 1:
                idx = torch.as_tensor(p, device=a.device) if is_torch(a) else p
                return a[:, idx] if axis == 1 else a[idx]
            rows = np.arange(p.shape[0])[:, None]
            if is_torch(a):
                return a[torch.as_tensor(rows, device=a.device), torch.as_tensor(p, device=a.device)]
            return a[rows, p]

        return self._map(apply)

    def normalize_softmax(self, ref: int = -1) -> Params:
        r"""Remove the translation invariance of softmax gates.

        Softmax weights are unchanged by adding a common :math:`(t_0, t_1)` to
        every :math:`(\beta_{0i}, \beta_{1i})` (nguyen2024 §2.3).  This returns
        the representative with :math:`\beta_{0,\mathrm{ref}} = 0` and
        :math:`\beta_{1,\mathrm{ref}} = 0_d`.
        """
        if not -self.k <= ref < self.k:
            raise ValueError(f"ref={ref} is not an expert index for k={self.k}.")
        gb = self.gate_bias - self.gate_bias[..., ref : ref + 1 if ref != -1 else None]
        gw = self.gate_weight - self.gate_weight[..., ref : ref + 1 if ref != -1 else None, :]
        return replace(self, gate_bias=gb, gate_weight=gw)

    def perturb(self, scale: float, *, seed: int | np.random.SeedSequence | None = None,
                blocks: Sequence[str] = ("gate_bias", "gate_weight", "expert_weight", "expert_bias")
                ) -> Params:
        """Add independent N(0, scale^2) noise to the named blocks (a near-truth start)."""
        if scale < 0:
            raise ValueError(f"scale must be >= 0, got {scale}.")
        rng = np.random.default_rng(seed)
        unknown = set(blocks) - set(BLOCKS)
        if unknown:
            raise ValueError(f"blocks {sorted(unknown)} are not parameter blocks; valid: {list(BLOCKS)}.")

        def add(name: str, a: Array) -> Array:
            if name not in blocks:
                return a
            noise = rng.normal(0.0, scale, size=tuple(a.shape))
            return a + to_tensor(noise, device=a.device, dtype=a.dtype) if is_torch(a) else a + noise

        return self._map(add)

    # ----------------------------------------------------------------- tidy
    def to_frame(self) -> pd.DataFrame:
        """Tidy long frame: one row per (rep, atom, block, coord) with the ``value``.

        Scalar blocks (``gate_bias``, ``expert_bias``, ``noise_sd``) have ``coord`` 0.
        Unbatched Params report ``rep`` 0.  A ``temperature`` has one row per replicate, block ``"temperature"``,
        atom -1 (no one expert).
        """
        p = self.numpy().batched()
        R, k, d = int(p.gate_bias.shape[0]), p.k, p.d
        parts = []
        rep: np.ndarray
        atom: np.ndarray
        coord: np.ndarray
        for name, a in p.blocks():
            if name in _VECTOR_BLOCKS:
                rep, atom, coord = np.meshgrid(np.arange(R), np.arange(k), np.arange(d), indexing="ij")
                vals = a
            else:
                rep, atom = np.meshgrid(np.arange(R), np.arange(k), indexing="ij")
                coord = np.zeros_like(rep)
                vals = a
            parts.append(pd.DataFrame({
                "rep": rep.ravel(), "atom": atom.ravel(), "block": name,
                "coord": coord.ravel(), "value": np.asarray(vals).ravel(),
            }))
        if p.temperature is not None:  # common to all experts: atom -1
            parts.append(pd.DataFrame({"rep": np.arange(R), "atom": -1, "block": "temperature", "coord": 0,
                                       "value": np.asarray(p.temperature, dtype=float)}))
        return pd.concat(parts, ignore_index=True)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> Params:
        """Inverse of :meth:`to_frame` (always returns batched Params)."""
        missing = {"rep", "atom", "block", "coord", "value"} - set(frame.columns)
        if missing:
            raise ValueError(f"frame is missing columns {sorted(missing)}; expected Params.to_frame() output.")
        R = int(frame["rep"].max()) + 1
        k = int(frame["atom"].max()) + 1
        gw = frame[frame["block"] == "gate_weight"]
        d = int(gw["coord"].max()) + 1
        out: dict[str, np.ndarray] = {}
        for name in BLOCKS:
            sub = frame[frame["block"] == name]
            if sub.empty:
                continue
            shape = (R, k, d) if name in _VECTOR_BLOCKS else (R, k)
            arr = np.full(shape, np.nan)
            if name in _VECTOR_BLOCKS:
                arr[sub["rep"], sub["atom"], sub["coord"]] = sub["value"]
            else:
                arr[sub["rep"], sub["atom"]] = sub["value"]
            out[name] = arr
        temp = frame[frame["block"] == "temperature"]
        if not temp.empty:
            arr = np.full(R, np.nan)
            arr[temp["rep"]] = temp["value"]
            out["temperature"] = arr
        return cls(**out)

    def __repr__(self) -> str:
        kind = "torch" if self.is_torch else "numpy"
        reps = f"R={self.n_reps}, " if self.is_batched else ""
        noise = ", noise_sd" if self.noise_sd is not None else ""
        temp = ", temperature" if self.temperature is not None else ""
        return f"Params({reps}k={self.k}, d={self.d}, {kind}{noise}{temp})"

    def allclose(self, other: Params, *, rtol: float = 1e-7, atol: float = 1e-10) -> bool:
        """Blockwise ``numpy.allclose`` against ``other`` (same labelling; the temperatures, where set, too)."""
        a, b = self.numpy(), other.numpy()
        names_a = [n for n, _ in a.blocks()]
        if names_a != [n for n, _ in b.blocks()] or (a.temperature is None) != (b.temperature is None):
            return False
        if a.temperature is not None:
            names_a.append("temperature")
        return all(np.allclose(getattr(a, n), getattr(b, n), rtol=rtol, atol=atol) for n in names_a)
