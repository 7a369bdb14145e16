"""The true model of a simulation: an MoE spec, its parameters and their provenance."""

from __future__ import annotations

from typing import Any

from ..model import MoE
from ..params import Params

__all__ = ["Truth"]


class Truth(tuple[MoE, Params]):
    """A ``(spec, params)`` pair with metadata; unpacks as ``spec, params = truth``.

    Attributes
    ----------
    spec : MoE
    params : Params
    info : dict
        Provenance: regime, zero-slope atoms, duplicate candidates, variances, seed, source.
    """

    info: dict[str, Any]

    def __new__(cls, spec: MoE, params: Params, info: dict[str, Any]) -> Truth:
        self = super().__new__(cls, (spec, params))
        self.info = info
        return self

    @property
    def spec(self) -> MoE:
        return self[0]

    @property
    def params(self) -> Params:
        return self[1]
