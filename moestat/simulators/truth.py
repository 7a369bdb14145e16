"""The true model of a simulation (an MoE spec, its parameters and their provenance) and the registry of named
truths (presets) that :class:`moestat.Study` entries name.

The presets themselves live with their papers (:mod:`moestat.papers`), which register them here when the
package is imported; the library reads the registry and never imports a paper."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..model import MoE
from ..params import Params

__all__ = ["PRESETS", "Truth", "register_preset"]


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


PRESETS: dict[str, Callable[..., Truth]] = {}
"""Preset names to the functions that build them (filled by :mod:`moestat.papers` at import)."""


def register_preset(name: str, fn: Callable[..., Truth]) -> None:
    """Make ``fn`` (keyword arguments -> :class:`Truth`) a preset a study truth can name as ``{"preset": name}``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"preset name must be an identifier such as 'sigmoid_vs_softmax', got {name!r}.")
    if not callable(fn):
        raise TypeError(f"preset {name!r} must be a callable returning a Truth, got {type(fn).__name__}.")
    PRESETS[name] = fn
