"""Argument checks shared by the public API.  Each error names the argument and the fix."""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from .exceptions import warn_user


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
                    warn_user(f"{fn.__name__}({old}=...) is now {fn.__name__}({new}=...); the name {old!r} "
                                  "will be removed.", FutureWarning)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return wrapper
    return deco


def keyword_only_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a function whose options became keyword-only: options still passed by position are mapped to
    their names, in the signature's order, with a :class:`FutureWarning` (so older positional calls keep running)."""
    params = list(inspect.signature(fn).parameters.values())
    n_pos = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    options = [p.name for p in params if p.kind == p.KEYWORD_ONLY]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(args) > n_pos:
            extra = args[n_pos:]
            if len(extra) > len(options):
                raise TypeError(f"{fn.__name__}() takes {n_pos} positional arguments but {len(args)} were given.")
            names = options[:len(extra)]
            for name, value in zip(names, extra, strict=True):
                if name in kwargs:
                    raise TypeError(f"{fn.__name__}() got multiple values for argument {name!r}.")
                kwargs[name] = value
            warn_user(f"{fn.__name__}(): pass {', '.join(names)} by keyword ({names[0]}=...); options after the "
                      f"first {n_pos} arguments are keyword-only and positional options will stop working.",
                      FutureWarning)
            args = args[:n_pos]
        return fn(*args, **kwargs)
    return wrapper


# ------------------------------------------------------------------ declarative constraint tables
class Constraint:
    """What one argument of a public function accepts; ``description`` completes "<name> must be ..."."""

    description = "valid"

    def accepts_type(self, value: Any) -> bool:
        """Whether ``value`` has a type this constraint takes (False raises TypeError, else ValueError)."""
        return True

    def accepts(self, value: Any) -> bool:
        return self.accepts_type(value)

    def __repr__(self) -> str:
        return self.description


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class Integer(Constraint):
    """An integer (not a bool) in ``[minimum, maximum]``."""

    def __init__(self, minimum: int | None = None, maximum: int | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum
        bounds = [f">= {minimum}"] if minimum is not None else []
        bounds += [f"<= {maximum}"] if maximum is not None else []
        self.description = "an integer" + (" " + " and ".join(bounds) if bounds else "")

    def accepts_type(self, value: Any) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    def accepts(self, value: Any) -> bool:
        return (self.accepts_type(value) and (self.minimum is None or value >= self.minimum)
                and (self.maximum is None or value <= self.maximum))


class Real(Constraint):
    """A finite real number (not a bool) in an interval (``open_low``/``open_high`` exclude the ends)."""

    def __init__(self, low: float | None = None, high: float | None = None, *, open_low: bool = False,
                 open_high: bool = False) -> None:
        self.low, self.high, self.open_low, self.open_high = low, high, open_low, open_high
        bounds = [(">" if open_low else ">=") + f" {low:g}"] if low is not None else []
        bounds += [("<" if open_high else "<=") + f" {high:g}"] if high is not None else []
        if low == 0 and high is None:
            self.description = "a positive finite number" if open_low else "a finite non-negative number"
        else:
            self.description = "a finite number" + (" " + " and ".join(bounds) if bounds else "")

    def accepts_type(self, value: Any) -> bool:
        return _is_real(value)

    def accepts(self, value: Any) -> bool:
        if not self.accepts_type(value) or not np.isfinite(float(value)):
            return False
        v = float(value)
        if self.low is not None and (v <= self.low if self.open_low else v < self.low):
            return False
        return not (self.high is not None and (v >= self.high if self.open_high else v > self.high))


class Boolean(Constraint):
    description = "True or False"

    def accepts_type(self, value: Any) -> bool:
        return isinstance(value, (bool, np.bool_))


class Choice(Constraint):
    """One of a fixed set of values."""

    def __init__(self, *choices: Any) -> None:
        self.choices = choices
        self.description = f"one of the valid values {list(choices)}"

    def accepts_type(self, value: Any) -> bool:
        return any(isinstance(value, type(c)) for c in self.choices)

    def accepts(self, value: Any) -> bool:
        return self.accepts_type(value) and value in self.choices


class Seed(Constraint):
    """A seed: None, an integer >= 0, a numpy SeedSequence or a list of them (one per replicate)."""

    description = "None, an integer >= 0, a numpy.random.SeedSequence or a list of SeedSequences"

    def accepts_type(self, value: Any) -> bool:
        if value is None or isinstance(value, np.random.SeedSequence):
            return True
        if isinstance(value, (list, tuple)):
            return len(value) > 0 and all(isinstance(s, np.random.SeedSequence) for s in value)
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    def accepts(self, value: Any) -> bool:
        return self.accepts_type(value) and not (isinstance(value, numbers.Integral) and value < 0)


class Device(Constraint):
    """A torch device: "auto", "cpu", "cuda", "cuda:N" or a torch.device."""

    description = "'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device"

    def accepts_type(self, value: Any) -> bool:
        return isinstance(value, (str, torch.device))

    def accepts(self, value: Any) -> bool:
        if isinstance(value, torch.device):
            return value.type in ("cpu", "cuda")
        return isinstance(value, str) and (value in ("auto", "cpu", "cuda")
                                           or (value.startswith("cuda:") and value[5:].isdigit()))


class Dtype(Constraint):
    """A floating dtype: None (float64), "float64", "float32" (or "double", "float") or the torch dtypes."""

    description = "None, 'float64', 'float32' or torch.float64 / torch.float32"

    def accepts_type(self, value: Any) -> bool:
        return value is None or isinstance(value, (str, torch.dtype))

    def accepts(self, value: Any) -> bool:
        return value is None or value in ("float64", "float32", "double", "float", torch.float64, torch.float32)


class Optional(Constraint):
    """None or what ``inner`` accepts."""

    def __init__(self, inner: Constraint) -> None:
        self.inner = inner
        self.description = f"None or {inner.description}"

    def accepts_type(self, value: Any) -> bool:
        return value is None or self.inner.accepts_type(value)

    def accepts(self, value: Any) -> bool:
        return value is None or self.inner.accepts(value)


def validate_arguments(**table: Constraint) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: check a public function's arguments against its constraint table at entry.

    Every argument the caller passes that the table names is checked; a value of the wrong type raises
    :class:`TypeError`, one out of range :class:`ValueError`, each naming the function, the argument, what it
    accepts and the value given.  Defaults are not checked (tests check that they satisfy the table).  The
    table is kept as ``fn.parameter_constraints`` (scikit-learn's ``_parameter_constraints`` idea), so the
    accepted values of every argument are written in one place, beside the signature.
    """
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        unknown = set(table) - set(sig.parameters)
        if unknown:
            raise TypeError(f"constraint table of {fn.__name__} names unknown arguments {sorted(unknown)}")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind_partial(*args, **kwargs).arguments
            except TypeError:
                return fn(*args, **kwargs)  # let Python report the wrong call itself
            for name, constraint in table.items():
                if name in bound and not constraint.accepts(bound[name]):
                    value = bound[name]
                    kind = ValueError if constraint.accepts_type(value) else TypeError
                    raise kind(f"{fn.__name__}(): {name} must be {constraint.description}, got {value!r}"
                               + ("" if kind is ValueError else f" ({type(value).__name__})") + ".")
            return fn(*args, **kwargs)

        wrapper.parameter_constraints = dict(table)  # type: ignore[attr-defined]
        return wrapper
    return deco


def as_numeric(name: str, value: Any) -> Any:
    """``value`` as a numeric array: numpy and torch arrays pass (a torch tensor keeps its device); pandas frames
    and series, lists and scalars become float64 numpy arrays.  Non-numeric data (strings, objects, complex
    numbers) and tensors on a device that holds no data raise, naming ``name`` and the fix."""
    if isinstance(value, torch.Tensor):
        if value.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is a tensor on device {value.device.type!r}, which holds no data to fit; "
                             "pass a CPU or CUDA tensor (or a numpy array).")
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers, got a tensor of dtype {value.dtype}.")
        return value
    if isinstance(value, (pd.DataFrame, pd.Series)):
        value = value.to_numpy()  # their values, without index or column labels
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        example = next(iter(arr.ravel()), None) if arr.size else None
        raise TypeError(f"{name} must hold real numbers, got an array of dtype {arr.dtype}"
                        + (f" (e.g. {example!r})" if example is not None else "")
                        + "; convert it to floats first (pandas: frame.astype(float)).")
    return arr.astype(np.float64, copy=False)


#: Root-mean-square range of an input column inside which the estimators' defaults are tuned.
UNIT_SCALE = (1e-2, 1e2)


def input_scale(X: Any) -> np.ndarray | None:
    """Per-column root-mean-square of ``X`` (..., n, d) when some column lies outside :data:`UNIT_SCALE`, else None.

    The estimators' starting values, step sizes and tolerances assume inputs of unit order; a MoE fit on far-off
    scales can stop at a worse optimum while reporting convergence (measured: a 2-expert softmax/linear MLE at
    log-likelihood -201 instead of 394 with the inputs scaled by 1e-6).  The estimators therefore fit ``X / s``
    and map the slopes back, which is exact (gate logits and expert pre-activations are affine in x).  All-zero
    columns keep scale 1 (a rank problem, reported elsewhere)."""
    x = X.detach().cpu().double().numpy() if isinstance(X, torch.Tensor) else np.asarray(X, dtype=np.float64)
    if x.size == 0:
        return None
    rms = np.sqrt((x.reshape(-1, x.shape[-1]) ** 2).mean(0))
    if not (((rms < UNIT_SCALE[0]) & (rms > 0)) | (rms > UNIT_SCALE[1])).any():
        return None
    out: np.ndarray = np.where(rms > 0, rms, 1.0)
    return out


def column_list(name: str, value: Any) -> list[str]:
    """``None`` -> ``[]``, a column name -> ``[name]``, a sequence of names -> a list; anything else is a TypeError
    naming the argument."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return list(value)
    raise TypeError(f"{name} must be a column name or a list of column names, got {value!r}.")
