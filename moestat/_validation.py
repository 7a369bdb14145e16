"""Argument checks shared by the public API.  Each error names the argument and the fix."""

from __future__ import annotations

import functools
import numbers
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch


def check_int(name: str, value: Any, *, minimum: int = 1) -> int:
    """Return ``value`` as an int, raising if it is not an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__}).")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}.")
    return int(value)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise listing the valid ones."""
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; valid values are {sorted(choices)}.")
    return value


def check_nonnegative(name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a non-negative number, got {value!r}.")
    if not np.isfinite(float(value)) or value < 0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value}.")
    return float(value)


def check_finite(name: str, x: Any) -> None:
    """Raise a ValueError if ``x`` holds NaN or infinite entries."""
    if isinstance(x, torch.Tensor):
        ok = bool(torch.isfinite(x).all())
    else:
        ok = bool(np.isfinite(np.asarray(x, dtype=np.float64)).all())
    if not ok:
        raise ValueError(
            f"{name} contains NaN or infinite values; remove or impute those entries before fitting."
        )


def renamed_arguments(**renames: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: accept the former keyword names ``old=new`` of a public function's arguments, with a
    :class:`FutureWarning` naming the new name (so code written against an older moestat keeps running)."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}() got both {new}= and its former name {old}=; "
                                        f"pass {new}= only.")
                    warnings.warn(f"{fn.__name__}({old}=...) is now {fn.__name__}({new}=...); the name {old!r} "
                                  "will be removed.", FutureWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return wrapper
    return deco
