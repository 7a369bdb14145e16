r"""Declarative simulation studies: a grid of (truth x fitted model x n) cells, run reproducibly.

A :class:`Study` names one or more true models (a paper preset or an explicit MoE and its
parameters), one or more fitted models (gate, expert family, number of experts, estimator and
its options), a grid of sample sizes, a number of replicates, the metrics to record and a
master seed.  :meth:`Study.run` fits every cell — all replicates of a cell in **one batched
estimator call** — and returns a tidy frame with one row per (cell, replicate) and every
configuration knob as a column.

Reproducibility and fault tolerance
-----------------------------------
* Seeds.  With master seed ``s``, the data of (truth ``t``, sample size ``n``) come from
  ``SeedSequence(s, spawn_key=(0, crc32(t), n))`` (``t`` is the truth's ``stream`` if it has one, else
  its label) (replicate ``r`` uses its child ``r``), so every
  fitted model of one truth sees the same data ("under the same data", nguyen2024 Fig. 1); the fit of
  cell (t, f, n) gets its own child ``SeedSequence(s, spawn_key=(1, crc32(t), crc32(f), n))`` and
  metrics a shared Monte-Carlo stream ``(2, crc32(t), n)``.  Keys use labels and ``n`` rather than
  positions, so adding a fitted model, a truth or a sample size never changes existing cells.
* Checkpoints.  With ``checkpoint=DIR`` each finished cell is written to ``DIR/cells/<id>.parquet``
  atomically (temporary file + ``os.replace``), so a run killed at any moment (even by SIGKILL)
  leaves only complete cells; ``resume=True`` skips them.  The final frame is always assembled from
  the stored cells, so an interrupted-and-resumed run returns the same frame as an uninterrupted one.
  Cell ids carry a hash of the cell's full configuration: changing a knob recomputes that cell.
* Executors.  ``executor=None`` runs cells in this process; ``"processes"`` uses a spawn-context
  :class:`concurrent.futures.ProcessPoolExecutor`; any :class:`concurrent.futures.Executor` works,
  including Dask's ``Client.get_executor()``.  Cells are independent and seeded by key, so the frame
  is the same for every executor (bit for bit at an equal number of torch threads per cell; set
  ``threads``).  Only ``wall_time``-type columns differ between runs.  ``workers={"cuda": 2, "cpu": 14}``
  runs one process pool per device (a GPU host's GPU takes the largest cells, its cores the smallest); a
  cell's rows then depend on the device it ran on, within round-off (the ``device`` column).
* Failures.  A fit that raises or does not converge is a row (``status`` ``"error"`` or
  ``"not_converged"``, ``message``), stored and resumed like any other, never silently redrawn.  Without
  ``max_failures`` the first error stops the study (:class:`StudyFailureError`, finished cells kept); with it,
  failed replicates (errors and non-converged fits) are counted and the study stops once there are more.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import copy
import ctypes
import difflib
import hashlib
import importlib
import io
import itertools
import json
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from . import cells as _cells
from ._placement import CellLanes, DeviceRule, cell_size, parse_workers, resolve_device_name
from .cells import (
    ESTIMATORS,
    EXPLICIT_TRUTH_KEYS,
    METRICS,
    STATUSES,
    TRUTH_SIM_KEYS,
    CellContext,
    CellOutput,
    Estimate,
    MetricContext,
    StudyCache,
    estimator_cell,
    metric_name,
    preset_keys,
    register_estimator,
    register_metric,
    status_from,
)
from .checkpoint import read_frame, write_atomic, write_frame
from .exceptions import CheckpointWarning, StudyConfigError, StudyFailureWarning, warn_user
from .experts import EXPERTS, get_expert
from .gates import GATES
from .simulators.truth import PRESETS
from .study_report import successful_rows

__all__ = [
    "ESTIMATORS",
    "METRICS",
    "CellContext",
    "CellOutput",
    "Estimate",
    "MetricContext",
    "Study",
    "StudyConfigError",
    "StudyFailureError",
    "StudyFailureWarning",
    "load_results",
    "register_estimator",
    "register_metric",
    "successful_rows",
]

STUDY_KEYS = ("name", "description", "seed", "reps", "n", "truth", "fit", "metrics", "metric_options",
              "device", "threads", "cell", "max_failures", "ademp")
ADEMP_KEYS = ("aims", "data_generating_mechanisms", "estimands", "methods", "performance_measures")
"""Keys of a study's ``[ademp]`` table (Morris, White & Crowther 2019): each a string or a list of strings."""
FIT_KEYS = ("label", "estimator", "gate", "expert", "k", "top_k", "temperature", "options", "grid")
_NESTED = ("options", "data")  # tables whose keys a grid may set as "options.NAME" / "data.NAME"
FORMAT_VERSION = 1
_RESERVED = ("study", "cell", "truth", "fit", "n", "rep", "seed", "data_seed", "fit_seed", "device",
             "estimator", "gate", "expert", "k", "objective", "converged", "status", "message", "wall_time")


class StudyFailureError(RuntimeError):
    """A study stopped because of failed fits: the first error (no ``max_failures``) or more failed replicates
    than ``max_failures`` allows.  Finished cells, the failed ones included, stay in the checkpoint folder."""


# ----------------------------------------------------------------------------- helpers

def _import_ref(ref: str, what: str) -> Callable[..., Any]:
    """Resolve ``"package.module:function"``."""
    mod, _, attr = ref.partition(":")
    if not mod or not attr:
        raise StudyConfigError(f"{what}={ref!r} is neither a registered name nor an import path "
                               "'package.module:function'.")
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise StudyConfigError(f"{what}={ref!r} could not be imported: {exc}.") from exc
    if not callable(obj):
        raise StudyConfigError(f"{what}={ref!r} is not callable.")
    return obj


def _resolve(ref: Any, registry: Mapping[str, Callable[..., Any]], what: str) -> Any:
    if callable(ref):
        return ref
    if isinstance(ref, str):
        if ref in registry:
            return ref
        if ":" in ref:
            return _import_ref(ref, what)
    raise StudyConfigError(f"{what}={ref!r} is not known; valid values are {sorted(registry)} "
                           "or an import path 'package.module:function'.")


def _check_keys(where: str, entry: Mapping[str, Any], valid: Iterable[str]) -> None:
    if not isinstance(entry, Mapping):
        raise StudyConfigError(f"{where} must be a table (dict), got {type(entry).__name__}.")
    valid = list(valid)
    for key in entry:
        if key not in valid:
            raise StudyConfigError(f"{where}: unknown key {key!r}; valid keys are {sorted(valid)}.")


def _crc(label: str) -> int:
    return zlib.crc32(label.encode())


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-") or "x"


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if callable(value):
        return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"
    return value


def _scalar(value: Any) -> Any:
    """A frame-cell representation of a knob (lists and tables as compact JSON)."""
    if isinstance(value, (list, tuple, dict, np.ndarray)):
        return json.dumps(_jsonable(value), sort_keys=True, separators=(",", ":"))
    if callable(value):
        return _jsonable(value)
    return value


def _expand(where: str, entries: Any, valid: Sequence[str]) -> list[dict[str, Any]]:
    """Normalise a truth/fit section to a list of entries, expanding each entry's ``grid`` table."""
    if isinstance(entries, Mapping):
        entries = [entries]
    if not isinstance(entries, (list, tuple)) or not entries:
        raise StudyConfigError(f"study.{where} must be a table or a non-empty list of tables.")
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        _check_keys(f"study.{where}[{i}]", entry, valid)
        entry = copy.deepcopy(dict(entry))
        grid = entry.pop("grid", None) or {}
        if not isinstance(grid, Mapping) or any(not isinstance(v, (list, tuple)) or not v for v in grid.values()):
            raise StudyConfigError(f"study.{where}[{i}].grid must map keys to non-empty lists of values.")
        for key in grid:
            top = key.split(".", 1)[0]
            if top not in valid or top == "grid" or ("." in key and top not in _NESTED):
                raise StudyConfigError(f"study.{where}[{i}].grid: unknown key {key!r}; valid keys are "
                                       f"{sorted(k for k in valid if k != 'grid')} (options as 'options.NAME', "
                                       "a custom cell's data knobs as 'data.NAME').")
        keys = list(grid)
        for combo in itertools.product(*(grid[k] for k in keys)) if keys else [()]:
            e = copy.deepcopy(entry)
            for key, value in zip(keys, combo, strict=True):
                if "." in key:
                    top, name = key.split(".", 1)
                    e.setdefault(top, {})[name] = value
                else:
                    e[key] = value
            if keys:
                suffix = "-".join(f"{k.split('.', 1)[1]}={v}" if "." in k else str(v)
                                  for k, v in zip(keys, combo, strict=True))
                e["label"] = f"{entry['label']}-{suffix}" if entry.get("label") else suffix
            e["_source"] = i
            out.append(e)
    return out


# --------------------------------------------------------------------------- the study

@dataclass
class Study:
    """A simulation study over a grid of true models, fitted models and sample sizes.

    Parameters
    ----------
    truth : dict or list of dict
        True model(s).  A preset: ``{"preset": "sigmoid_vs_softmax", "regime": 2, "expert": "relu",
        "truth_gate": "sigmoid", "seed": 0}`` (any keyword of the preset).  Or explicit:
        ``{"gate", "expert", "k", "d", "noise_sd", "params": {"gate_bias": ..., "gate_weight": ...,
        "expert_weight": ..., "expert_bias": ...}}``.  Simulation knobs ``inputs``, ``low``,
        ``high``, ``model`` and ``design`` (``"random"``, ``"linspace"`` or an (n, d) array as a list of rows,
        which needs a single n) go to :func:`moestat.simulate`.  Optional ``label``, and ``stream``: truths
        with the same stream share their data seeds (same inputs and noise draws; e.g. a sigmoid- and a
        softmax-gated truth with the same parameters, so that fits of the two gates are paired); it may
        name keys of the entry, e.g. ``"{expert}"`` with a grid over ``expert`` and ``truth_gate``.
    fit : dict or list of dict
        Fitted model(s): ``estimator`` (registry name, import path or callable; default ``"lse"``),
        ``gate``, ``expert`` (default: the truth's), ``k`` (int, ``"truth"`` or ``"truth+1"``;
        default the truth's k), ``options`` (estimator keyword arguments), optional ``label``.
    n : sequence of int
        Sample sizes.
    reps : int
        Replicates per cell (fitted together in one batched call).
    metrics : sequence of str or callable
        Metric names (:data:`METRICS`: ``"D1"``, ``"D2"``, ``"D3"``, ``"l2"``, ``"parameter_errors"``),
        import paths or callables; ``metric_options`` maps a metric name to its keyword arguments.
    seed : int
        Master seed (see the module docstring for how cells derive their streams).
    name, description : str
        Recorded in the frame (``study`` column) and the provenance.
    device : {"auto", "cpu", "cuda"}
        Passed to the estimators.
    threads : int, optional
        Torch threads per cell (fix it to compare executors bit for bit).
    cell : callable or str, optional
        A custom cell ``fn(ctx: CellContext) -> DataFrame`` replacing "simulate, fit, score" (an
        import path ``"package.module:function"`` in TOML).  Its frame needs a ``rep`` column.
    max_failures : int or float, optional
        Failed replicates (rows whose ``status`` is ``"error"`` or ``"not_converged"``) the study tolerates: a
        count (``0``: none) or a fraction in (0, 1] of all ``cells x reps`` rows.  The study stops with
        :class:`StudyFailureError` as soon as there are more (finished cells stay on disk).  ``None`` (default):
        non-converged fits never stop the study and the first error stops it.
    ademp : dict, optional
        The study's plan in Morris, White & Crowther's (2019) ADEMP structure: ``aims``,
        ``data_generating_mechanisms``, ``estimands``, ``methods``, ``performance_measures`` (each a string or a
        list of strings); :meth:`report` fills the sections left out from the configuration.

    Notes
    -----
    Any entry of ``truth`` or ``fit`` may carry a ``grid`` table that maps keys to lists; such an
    entry is expanded into one entry per combination (``"options.lr"`` reaches into the options),
    labelled by the values.

    Examples
    --------
    >>> import moestat as ms
    >>> study = ms.Study(
    ...     truth={"preset": "sigmoid_vs_softmax", "regime": 2, "grid": {"expert": ["relu", "linear"]}},
    ...     fit={"k": "truth+1", "grid": {"gate": ["sigmoid", "softmax"]}},
    ...     n=[1000, 10000], reps=20, metrics=["D1"], seed=1)
    >>> len(study.cells)
    8
    """

    truth: Any
    fit: Any = field(default_factory=lambda: {})
    n: Sequence[int] = (1000,)
    reps: int = 20
    metrics: Sequence[Any] = ()
    metric_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: int = 0
    name: str = "study"
    description: str = ""
    device: str = "auto"
    threads: int | None = None
    cell: Any = None
    max_failures: int | float | None = None
    ademp: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.n = self._validate_n()
        self.truths = self._validate_truths()
        self.fits = self._validate_fits()
        if isinstance(self.reps, bool) or not isinstance(self.reps, (int, np.integer)) or self.reps < 1:
            raise StudyConfigError(f"study.reps must be an integer >= 1, got {self.reps!r}.")
        self.reps = int(self.reps)
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise StudyConfigError(f"study.seed must be a non-negative integer, got {self.seed!r}.")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise StudyConfigError(f"study.device={self.device!r} is not valid; valid values are "
                                   "['auto', 'cpu', 'cuda'].")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise StudyConfigError(f"study.threads must be a positive integer or absent, got {self.threads!r}.")
        if isinstance(self.metrics, (str, bytes)) or not isinstance(self.metrics, Sequence):
            raise StudyConfigError("study.metrics must be a list of metric names, e.g. ['D1', 'l2'].")
        self.metrics = [_resolve(m, METRICS, f"study.metrics[{i}]") for i, m in enumerate(self.metrics)]
        names = [metric_name(m) for m in self.metrics]
        if not isinstance(self.metric_options, Mapping):
            raise StudyConfigError("study.metric_options must map metric names to tables of options.")
        for key, opts in self.metric_options.items():
            if key not in names:
                raise StudyConfigError(f"study.metric_options: {key!r} is not among the study's metrics {names}.")
            if not isinstance(opts, Mapping):
                raise StudyConfigError(f"study.metric_options.{key} must be a table of keyword arguments.")
            _check_metric_options(f"study.metric_options.{key}", self.metrics[names.index(key)], key, opts)
        if self.cell is not None:
            if isinstance(self.cell, str):
                self.cell = _import_ref(self.cell, "study.cell")
            elif not callable(self.cell):
                raise StudyConfigError(f"study.cell must be a callable or 'package.module:function', "
                                       f"got {type(self.cell).__name__}.")
        self._check_designs()
        self._check_max_failures()
        self.ademp = self._validate_ademp()

    # ----------------------------------------------------------------- validation
    def _validate_truths(self) -> list[dict[str, Any]]:
        presets = sorted(PRESETS)
        entries = _expand("truth", self.truth, ["label", "stream", "preset", "grid", "data", *EXPLICIT_TRUTH_KEYS,
                                                 *TRUTH_SIM_KEYS, *{k for p in presets for k in preset_keys(p)}])
        for i, e in enumerate(entries):
            where = f"study.truth[{e['_source']}]"
            if "data" in e:
                self._check_data_truth(where, e, i)
            elif e.get("preset") is not None:
                if e["preset"] not in PRESETS:
                    raise StudyConfigError(f"{where}.preset={e['preset']!r} is not valid; valid values are {presets}.")
                _check_keys(where, {k: v for k, v in e.items() if k != "_source"},
                            ["label", "stream", "preset", *preset_keys(e["preset"]), *TRUTH_SIM_KEYS])
                if "expert" in e:
                    self._check_expert(f"{where}.expert", e["expert"])
                if "truth_gate" in e and e["truth_gate"] not in ("sigmoid", "softmax"):
                    raise StudyConfigError(f"{where}.truth_gate={e['truth_gate']!r} is not valid; valid values "
                                           "are ['sigmoid', 'softmax'].")
                if "regime" in e and e["regime"] not in (1, 2):
                    raise StudyConfigError(f"{where}.regime={e['regime']!r} is not valid; valid values are [1, 2].")
                default = "-".join(str(e[k]) for k in ("regime", "expert", "truth_gate") if k in e)
                e.setdefault("label", f"{e['preset']}" + (f"-{default}" if default else f"-{i}"))
            else:
                _check_keys(where, {k: v for k, v in e.items() if k != "_source"},
                            ["label", "stream", *EXPLICIT_TRUTH_KEYS, *TRUTH_SIM_KEYS])
                missing = [k for k in ("gate", "expert", "k", "d", "params") if k not in e]
                if missing:
                    raise StudyConfigError(f"{where} needs 'preset' (valid: {presets}) or an explicit model with "
                                           f"keys gate, expert, k, d, params; missing {missing}.")
                if e["gate"] not in GATES:
                    raise StudyConfigError(f"{where}.gate={e['gate']!r} is not valid; valid values are {list(GATES)}.")
                self._check_expert(f"{where}.expert", e["expert"])
                if not isinstance(e["params"], Mapping):
                    raise StudyConfigError(f"{where}.params must be a table with gate_bias, gate_weight, "
                                           "expert_weight, expert_bias (and optionally noise_sd).")
                e.setdefault("label", f"truth{i}")
            if e.get("stream") is not None:
                try:
                    e["stream"] = str(e["stream"]).format(**e)
                except (KeyError, IndexError, ValueError) as exc:
                    raise StudyConfigError(f"{where}.stream={e['stream']!r}: placeholders must name keys of the "
                                           f"truth entry ({exc}).") from None
            if "inputs" in e and e["inputs"] not in ("uniform", "gaussian"):
                raise StudyConfigError(f"{where}.inputs={e['inputs']!r} is not valid; valid values are "
                                       "['gaussian', 'uniform'].")
            if "model" in e and e["model"] not in ("regression", "mixture"):
                raise StudyConfigError(f"{where}.model={e['model']!r} is not valid; valid values are "
                                       "['mixture', 'regression'].")
        self._check_unique("truth", entries)
        try:  # build each truth once so that bad values fail now, not inside a worker
            for e in entries:
                if "data" in e:
                    continue
                for n in (self.n if e.get("preset") and _cells.indexed_by_n(e["preset"]) else [None]):
                    _cells.build_truth(e, n=n)
        except (TypeError, ValueError) as exc:
            raise StudyConfigError(f"study.truth[{e['_source']}] ({e['label']}): {exc}") from exc
        return entries

    def _check_data_truth(self, where: str, e: dict[str, Any], i: int) -> None:
        """A custom cell's own data settings: ``{"label", "stream", "data": {...}}``, read by the cell only."""
        if self.cell is None:
            raise StudyConfigError(f"{where}.data is read by a custom cell only; give the study cell= (a function "
                                   "fn(ctx) -> DataFrame) or describe the truth by 'preset' or an explicit model.")
        _check_keys(where, {k: v for k, v in e.items() if k != "_source"}, ["label", "stream", "data"])
        if not isinstance(e["data"], Mapping):
            raise StudyConfigError(f"{where}.data must be a table of the cell's data settings, got "
                                   f"{type(e['data']).__name__}.")
        e.setdefault("label", f"data{i}")

    def _validate_fits(self) -> list[dict[str, Any]]:
        entries = _expand("fit", self.fit, FIT_KEYS)
        for i, e in enumerate(entries):
            where = f"study.fit[{e['_source']}]"
            if self.cell is not None and "estimator" not in e:  # a custom cell reads its own options
                opts = e.setdefault("options", {})
                if not isinstance(opts, Mapping):
                    raise StudyConfigError(f"{where}.options must be a table of the cell's fit settings.")
                e.setdefault("label", f"fit{i}")
                continue
            e["estimator"] = _resolve(e.get("estimator", "lse"), ESTIMATORS, f"{where}.estimator")
            if e.get("gate") is not None and e["gate"] not in GATES:
                raise StudyConfigError(f"{where}.gate={e['gate']!r} is not valid; valid values are {list(GATES)}.")
            if e.get("expert") is not None:
                self._check_expert(f"{where}.expert", e["expert"])
            k = e.get("k")
            if k is not None and not (isinstance(k, int) and not isinstance(k, bool) and k >= 1) and not (
                    isinstance(k, str) and re.fullmatch(r"truth(\+[0-9]+)?", k)):
                raise StudyConfigError(f"{where}.k={k!r} is not valid; use a positive integer, 'truth' or "
                                       "'truth+m' (e.g. 'truth+1' for one extra expert).")
            opts = e.setdefault("options", {})
            if not isinstance(opts, Mapping):
                raise StudyConfigError(f"{where}.options must be a table of estimator keyword arguments.")
            _check_options(where, e["estimator"], opts)
            if not e.get("label"):
                est = metric_name(e["estimator"])
                parts = [str(e[key]) for key in ("gate", "expert") if e.get(key)]
                e["label"] = "-".join([*parts, est]) if parts else f"{est}{i}"
        self._check_unique("fit", entries)
        return entries

    @staticmethod
    def _check_expert(where: str, name: Any) -> None:
        try:
            get_expert(name)
        except ValueError:
            raise StudyConfigError(f"{where}={name!r} is not valid; valid values are {list(EXPERTS)} "
                                   "(or 'polyP').") from None

    @staticmethod
    def _check_unique(what: str, entries: list[dict[str, Any]]) -> None:
        labels = [e["label"] for e in entries]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise StudyConfigError(f"study.{what}: labels must be unique, {dup} repeat; give each entry a 'label'.")

    def _check_designs(self) -> None:
        """A fixed design must fit every n of the grid: an array has exactly n rows (so a single n), and
        ``"linspace"`` with d > 1 needs n = m**d."""
        from .simulators.regression import fixed_design

        for e in self.truths:
            if "data" in e:
                continue
            design = e.get("design")
            if design is None or (isinstance(design, str) and design == "random"):
                continue
            where = f"study.truth[{e['_source']}].design"
            if not isinstance(design, (str, list, tuple, np.ndarray)):
                raise StudyConfigError(f"{where} must be 'random', 'linspace' or an (n, d) array given as a list of "
                                       f"rows, got {type(design).__name__}.")
            if e.get("inputs", "uniform") != "uniform":
                raise StudyConfigError(f"{where} is fixed, so inputs={e['inputs']!r} (random inputs) does not apply; "
                                       "drop inputs or use design='random'.")
            d = _cells.build_truth(e, n=self.n[0]).spec.d
            for n in self.n:
                try:
                    fixed_design(design, n, d, float(e.get("low", -1.0)), float(e.get("high", 1.0)))
                except (TypeError, ValueError) as exc:
                    hint = (" A design array fixes n: give the study a single n equal to its number of rows."
                            if not isinstance(design, str) else "")
                    raise StudyConfigError(f"{where} at n={n}: {exc}{hint}") from None

    def _check_max_failures(self) -> None:
        m = self.max_failures
        if m is None:
            return
        if isinstance(m, bool) or not isinstance(m, (int, float, np.integer, np.floating)):
            raise StudyConfigError(f"study.max_failures must be a count (an integer >= 0) or a fraction in (0, 1], "
                                   f"got {m!r}.")
        if isinstance(m, (int, np.integer)):
            if m < 0:
                raise StudyConfigError(f"study.max_failures must be a count >= 0 or a fraction in (0, 1], got {m!r}.")
            self.max_failures = int(m)
        elif not (np.isfinite(m) and 0 < m <= 1):
            raise StudyConfigError(f"study.max_failures={m!r} is a float, so it is a fraction of all replicates and "
                                   "must lie in (0, 1]; give an integer for a count (e.g. max_failures = 5).")
        else:
            self.max_failures = float(m)

    def failure_limit(self) -> int | None:
        """The number of failed replicates the study tolerates (``max_failures`` as a count), or None."""
        m = self.max_failures
        if m is None:
            return None
        if isinstance(m, int):
            return m
        return int(np.floor(float(m) * len(self.cells) * self.reps + 1e-9))

    def _validate_ademp(self) -> dict[str, Any] | None:
        if self.ademp is None:
            return None
        _check_keys("study.ademp", self.ademp, ADEMP_KEYS)
        out: dict[str, Any] = {}
        for key, value in self.ademp.items():
            ok = isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))
            if not ok:
                raise StudyConfigError(f"study.ademp.{key} must be a string or a list of strings, got {value!r}.")
            out[key] = value if isinstance(value, str) else list(value)
        return out

    def _validate_n(self) -> list[int]:
        n = [self.n] if isinstance(self.n, (int, np.integer)) else self.n
        if isinstance(n, (str, bytes)) or not isinstance(n, Iterable):
            raise StudyConfigError(f"study.n must be a list of sample sizes, got {self.n!r}.")
        n = list(n)
        if not n or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in n):
            raise StudyConfigError(f"study.n must be a non-empty list of positive integers, got {n!r}.")
        if len(set(n)) != len(n):
            raise StudyConfigError(f"study.n has repeated values {n}; list each sample size once.")
        return [int(v) for v in n]

    # ----------------------------------------------------------------- TOML
    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (the TOML document)."""
        def strip(entries: Any) -> Any:
            entries = [entries] if isinstance(entries, Mapping) else list(entries)
            return [{k: _jsonable(v) for k, v in e.items() if v is not None} for e in entries]

        out: dict[str, Any] = {"name": self.name, "seed": self.seed, "reps": self.reps, "n": list(self.n),
                               "device": self.device}
        if self.description:
            out["description"] = self.description
        if self.threads is not None:
            out["threads"] = self.threads
        out["metrics"] = [_jsonable(m) if callable(m) else m for m in self.metrics]
        if self.metric_options:
            out["metric_options"] = _jsonable(self.metric_options)
        if self.cell is not None:
            out["cell"] = _jsonable(self.cell)
        if self.max_failures is not None:
            out["max_failures"] = self.max_failures
        if self.ademp:
            out["ademp"] = dict(self.ademp)
        out["truth"] = strip(self.truth)
        out["fit"] = strip(self.fit)
        return out

    def to_toml(self, path: str | os.PathLike | None = None) -> str:
        """The study as a TOML document (written to ``path`` if given).

        Callables (custom cells, estimators, metrics) are written as ``"module:qualname"`` import
        paths; lambdas and nested functions cannot be re-imported and raise a ``ValueError``.
        """
        import tomli_w

        doc = self.to_dict()
        bad = [v for v in json.dumps(doc).split('"') if ":<" in v or "<locals>" in v or "<lambda>" in v]
        if bad:
            raise ValueError(f"to_toml: {bad[0]!r} is not importable; use module-level functions.")
        text = tomli_w.dumps(doc)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_toml(cls, source: str | os.PathLike) -> Study:
        """Read a study from a TOML file path (or a TOML string containing a newline)."""
        import tomllib

        if isinstance(source, str) and "\n" in source:
            text, where = source, "<string>"
        else:
            path = Path(source)
            if not path.is_file():
                raise FileNotFoundError(f"study file {str(path)!r} does not exist.")
            text, where = path.read_text(), str(path)
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise StudyConfigError(f"{where} is not valid TOML: {exc}.") from exc
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Study:
        """Build a study from a parsed TOML document."""
        _check_keys("study", doc, STUDY_KEYS)
        if "truth" not in doc:
            raise StudyConfigError("study needs a [truth] table (or [[truth]] tables).")
        if "n" not in doc:
            raise StudyConfigError("study needs n, the list of sample sizes, e.g. n = [1000, 10000].")
        return cls(**dict(doc))

    # ----------------------------------------------------------------- cells
    @property
    def cells(self) -> list[dict[str, Any]]:
        """The cells in run order (truth, then fit, then n), each with its id and seed keys."""
        out = []
        for t, f, n in itertools.product(self.truths, self.fits, self.n):
            key = {
                "format": FORMAT_VERSION, "truth": _jsonable({k: v for k, v in t.items() if k != "_source"}),
                "fit": _jsonable({k: v for k, v in f.items() if k != "_source"}), "n": n, "reps": self.reps,
                "seed": self.seed, "metrics": [metric_name(m) for m in self.metrics],
                "metric_options": _jsonable(self.metric_options), "cell": _jsonable(self.cell),
                "threads": self.threads,
            }
            digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
            out.append({
                "id": f"{_slug(t['label'])}__{_slug(f['label'])}__n{n}__{digest}",
                "truth": t, "fit": f, "n": n,
                "data_key": (0, _crc(t.get("stream") or t["label"]), n),
                "fit_key": (1, _crc(t["label"]), _crc(f["label"]), n),
                "metric_key": (2, _crc(t.get("stream") or t["label"]), n),
            })
        return out

    def _payload(self, cell: dict[str, Any], device: str, cache: StudyCache | None = None) -> dict[str, Any]:
        return {
            "cell": cell, "study": self.name, "seed": self.seed, "reps": self.reps, "device": device,
            "metrics": self.metrics, "metric_options": dict(self.metric_options), "threads": self.threads,
            "fn": self.cell, "cache": cache,
            "cache_dir": None if cache is None or cache.directory is None else str(cache.directory),
        }

    # ----------------------------------------------------------------- running
    def run(self, checkpoint: str | os.PathLike | None = None, *, resume: bool = True,
            executor: str | cf.Executor | None = None, workers: int | str | Mapping[str, int] | None = None,
            progress: bool = True, device: str | DeviceRule | None = None) -> pd.DataFrame:
        """Run every cell and return the tidy frame (one row per cell x replicate).

        Parameters
        ----------
        checkpoint : path, optional
            Folder for ``cells/*.parquet``, ``results.parquet``, ``results.csv``, ``study.toml`` and
            ``provenance.json``.  Without it nothing is written.
        resume : bool
            Skip cells already stored in ``checkpoint`` (``False`` recomputes and overwrites them).
        executor : None, "processes" or concurrent.futures.Executor
            Where cells run (see the module docstring); a given executor is not shut down.
        workers : int, mapping or str, optional
            Worker processes for ``executor="processes"`` (default: the CPU count).  A mapping such as
            ``{"cuda": 2, "cpu": 14}`` (or the text ``"cuda=2,cpu=14"``) starts one process pool per device and
            implies ``executor="processes"``: cells are handed out as workers become free, the devices named
            first taking the largest cells left (by ``n``) and the device named last the smallest, so a GPU fits
            the large cells while the host's cores fit the small ones, with no size threshold to tune; the last
            device declines a cell unless, at the cell times measured so far, it would finish it in half the time
            the others need for all the cells left (:class:`moestat._placement.CellLanes`).  Which cell ran where
            then depends on timing (each row's ``device`` column says; the provenance counts ``cells_by_device``);
            for a fixed placement pass ``device`` as a callable too.  The processes share the CPU's cores as torch
            threads.
        progress : bool
            Show a tqdm progress bar over cells.
        device : str or callable, optional
            Override the study's device ("auto", "cpu", "cuda", "cuda:N"), or a rule ``device(cell) -> str``
            giving each cell's device from the cell's read-only description (``cell["n"]``,
            ``cell["truth"]``, ``cell["fit"]``, ``cell["id"]``), e.g.
            ``lambda cell: "cuda" if cell["n"] >= 50_000 else "cpu"``; with a mapping of ``workers`` every device
            the rule returns needs a pool there.

        Returns
        -------
        pandas.DataFrame
            Columns: ``study, cell, truth, fit, n, rep``, the truth's knobs (``truth_*``), the fitted
            model's knobs (``estimator, gate, expert, k`` and each estimator option), seeds
            (``seed, data_seed, fit_seed``), ``device``, the cell's outputs (``objective,
            converged``, diagnostics, metric columns) and ``wall_time`` (seconds for the cell,
            divided by its replicates).

        Raises
        ------
        KeyboardInterrupt
            On Ctrl-C (SIGINT), after the run has stopped: pending cells are cancelled and, with
            ``executor="processes"``, the workers are ended at once (SIGTERM; SIGKILL after a few seconds, or at
            once on a second Ctrl-C) and reaped, their unfinished cells to be recomputed by a resume; a given
            executor only has its pending cells cancelled.  ``provenance.json`` then says ``"interrupted"`` and
            how many cells finished (``cells_finished``); they are on disk, and ``resume=True`` continues.
        """
        from tqdm.auto import tqdm

        from .provenance import write_json_atomic, write_provenance

        cells = self.cells
        pools = parse_workers(workers)
        if isinstance(pools, dict):
            if executor not in (None, "processes"):
                raise ValueError(f"workers={workers!r} starts one process pool per device; it cannot be combined "
                                 f"with executor={executor!r} (pass executor='processes' or leave it out).")
            executor = "processes"
        placed = self._placement(cells, device if device is not None else self.device, pools)
        # the run's device(s) for its provenance: one name, or the devices joined by "+"
        dev = "+".join(pools) if isinstance(pools, dict) else "+".join(dict.fromkeys(placed.values()))
        ckpt = Path(checkpoint) if checkpoint is not None else None
        done: dict[str, pd.DataFrame] = {}
        if ckpt is not None:
            cell_dir = ckpt / "cells"
            cell_dir.mkdir(parents=True, exist_ok=True)
            for stale in cell_dir.glob(".*.tmp*"):
                stale.unlink(missing_ok=True)
            if resume:
                self._check_owner(ckpt)
                for c in cells:
                    path = cell_dir / f"{c['id']}.parquet"
                    if path.is_file():
                        frame = _stored_cell(path, c["id"], self.reps)
                        if frame is not None:
                            done[c["id"]] = frame
            self._write_config(ckpt)
            write_provenance(ckpt, self._provenance(cells, dev, status="running"), device=dev)
        todo = [c for c in cells if c["id"] not in done]
        t_start = time.perf_counter()
        tally = _Failures(self, ckpt)
        scratch: tempfile.TemporaryDirectory[str] | None = None
        bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc=self.name, unit="cell",
                   disable=not progress)
        # with our own pool, a second Ctrl-C must not break off the first one's clean-up (it hurries it instead)
        interrupts = _Interrupts(install=executor == "processes" and bool(todo))
        running = None
        try:
            for c in cells:
                if c["id"] in done:
                    tally.add(c["id"], done[c["id"]])
            tally.check(len(done))
            # one cache per run: in memory for this process's cells, in a folder for workers and resumed runs
            if ckpt is None and executor is not None:
                scratch = tempfile.TemporaryDirectory(prefix="moestat-study-cache-")
                cache = StudyCache(scratch.name)
            else:
                cache = StudyCache(None if ckpt is None else ckpt / "cache")
            self._pieces: dict[str, dict[str, pd.DataFrame]] = {}
            running = self._execute(todo, placed, executor, pools, cache, interrupts.again)
            ran_on: dict[str, int] = {}
            for cid, output in running:
                if "device" in output.frame.columns and len(output.frame):
                    on = str(output.frame["device"].iloc[0])
                    ran_on[on] = ran_on.get(on, 0) + 1
                frame = _roundtrip(output.frame)
                pieces = {name: _roundtrip(piece) for name, piece in output.pieces.items()}
                if ckpt is not None:
                    for name, piece in pieces.items():  # before the cell's own file, which marks it finished
                        (ckpt / "pieces" / name).mkdir(parents=True, exist_ok=True)
                        write_frame(piece, ckpt / "pieces" / name / f"{cid}.parquet")
                    write_frame(frame, ckpt / "cells" / f"{cid}.parquet")
                for name, piece in pieces.items():
                    self._pieces.setdefault(name, {})[cid] = piece
                done[cid] = frame
                bar.update(1)
                tally.add(cid, frame)
                tally.check(len(done))
        except KeyboardInterrupt as interrupt:
            _stop_running(running, interrupt)
            if ckpt is not None:
                prov = self._provenance(cells, dev, status="interrupted")
                prov["cells_finished"] = len(done)
                prov["failures"] = tally.record()
                write_provenance(ckpt, prov, device=dev)
            if hasattr(interrupt, "add_note"):  # Python >= 3.11
                where = f"saved in {str(ckpt)!r}; run again with resume=True" if ckpt is not None else \
                    "not saved (no checkpoint folder)"
                interrupt.add_note(f"study {self.name!r} interrupted: {len(done)} of {len(cells)} cells finished, "
                                   f"{where} to continue.")
            raise
        except StudyFailureError:
            if ckpt is not None:
                prov = self._provenance(cells, dev, status="stopped")
                prov["failures"] = tally.record()
                write_provenance(ckpt, prov, device=dev)
            raise
        finally:
            bar.close()
            if scratch is not None:
                scratch.cleanup()
            interrupts.restore()
        result = pd.concat([done[c["id"]] for c in cells], ignore_index=True)
        if ckpt is not None:
            write_frame(result, ckpt / "results.parquet")
            write_frame(result, ckpt / "results.csv")
            prov = self._provenance(cells, dev, status="complete")
            prov["run_wall_time_s"] = time.perf_counter() - t_start
            prov["cells_resumed"] = len(cells) - len(todo)
            prov["cells_by_device"] = dict(sorted(ran_on.items()))
            prov["failures"] = tally.record()
            write_provenance(ckpt, prov, device=dev)
            write_json_atomic(ckpt / "cells.json", {"cells": [c["id"] for c in cells]})
        tally.warn(len(result))
        return result

    def _placement(self, cells: list[dict[str, Any]], device: str | DeviceRule,
                   pools: int | dict[str, int] | None) -> dict[str, str]:
        """Each cell's device by id: the run's one device, or a rule's answer per cell; empty when a mapping of
        worker pools chooses devices as the run goes (:class:`CellLanes`)."""
        if callable(device):
            placed: dict[str, str] = {}
            for c in cells:
                name = resolve_device_name(device(MappingProxyType(c)), f"device(cell) for cell {c['id']!r}")
                if isinstance(pools, dict) and name not in pools:
                    raise ValueError(f"device(cell) put cell {c['id']!r} on {name!r}, but workers={pools!r} has "
                                     f"no pool there; add one, e.g. {{**workers, {name!r}: 1}}.")
                placed[c["id"]] = name
            return placed
        if isinstance(pools, dict):
            if device not in ("auto", self.device):
                raise ValueError(f"device={device!r} with workers={pools!r}: the pools name the devices; leave "
                                 "device out, or pass a rule device(cell) -> device to place each cell.")
            return {}
        name = resolve_device_name(device, "device")
        return {c["id"]: name for c in cells}

    def _execute(self, todo: list[dict[str, Any]], placed: dict[str, str], executor: Any,
                 workers: int | dict[str, int] | None, cache: StudyCache | None = None,
                 hurry: threading.Event | None = None) -> Iterator[tuple[str, CellOutput]]:
        """Yield ``(cell id, CellOutput)`` as cells finish.  On KeyboardInterrupt an own pool's workers are ended
        at once (:func:`_end_workers`; ``hurry``: a second Ctrl-C) and a given executor's pending cells cancelled."""
        if not todo:
            return
        if isinstance(workers, dict):
            yield from self._execute_pools(todo, placed, workers, cache, hurry)
            return
        if executor is None:
            for c in todo:
                yield c["id"], run_cell(self._payload(c, placed[c["id"]], cache))
            return
        owned = False
        if executor == "processes":
            n = min(workers or os.cpu_count() or 1, len(todo))
            # without study.threads, the workers share the cores instead of each starting one thread per core
            executor = cf.ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"),
                                              initializer=_init_worker, initargs=(n, os.getpid()))
            owned = True
        elif not isinstance(executor, cf.Executor):
            raise ValueError(f"executor must be None, 'processes' or a concurrent.futures.Executor, "
                             f"got {executor!r}.")
        futures: dict[cf.Future[CellOutput], str] = {}
        with _pools_stopped_on_exit([executor], owned, futures, hurry):
            # largest cells first (longest-processing-time order): the pool's last cells are short ones,
            # so no worker idles behind one long cell at the end; the frame's row order does not change
            with _sigint_blocked(owned):  # the pool's workers start (spawn) during the submissions
                for c in sorted(todo, key=lambda c: -cell_size(c)):
                    futures[executor.submit(run_cell, self._payload(c, placed[c["id"]], cache))] = c["id"]
            for fut in cf.as_completed(futures):
                yield futures[fut], fut.result()

    def _execute_pools(self, todo: list[dict[str, Any]], placed: dict[str, str], workers: dict[str, int],
                       cache: StudyCache | None, hurry: threading.Event | None) -> Iterator[tuple[str, CellOutput]]:
        """:meth:`_execute` with one process pool per device: each pool is kept as busy as it has workers, taking
        its next cell from :class:`CellLanes` whenever one of its cells finishes."""
        waiting = collections.Counter(placed[c["id"]] for c in todo) if placed else dict.fromkeys(workers, len(todo))
        sizes = {d: min(count, waiting.get(d, 0)) for d, count in workers.items() if waiting.get(d, 0)}
        lanes = CellLanes(todo, list(sizes), (lambda c: placed[c["id"]]) if placed else None, workers=sizes)
        total = sum(sizes.values())
        pools = {d: cf.ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=_init_worker, initargs=(total, os.getpid()))
                 for d, size in sizes.items()}
        futures: dict[cf.Future[CellOutput], tuple[dict[str, Any], str]] = {}
        busy = dict.fromkeys(pools, 0)

        def fill() -> None:
            with _sigint_blocked(True):  # a submission may start a worker (spawn)
                for device, pool in pools.items():
                    while busy[device] < sizes[device]:
                        c = lanes.take(device)
                        if c is None:
                            break
                        futures[pool.submit(run_cell, self._payload(c, device, cache))] = (c, device)
                        busy[device] += 1

        with _pools_stopped_on_exit(list(pools.values()), True, futures, hurry):
            fill()
            while futures:
                finished, _ = cf.wait(futures, return_when=cf.FIRST_COMPLETED)
                for fut in finished:
                    c, d = futures.pop(fut)
                    busy[d] -= 1
                    output = fut.result()
                    if "wall_time" in output.frame.columns and len(output.frame):  # the cell's own time
                        lanes.record(d, c, float(output.frame["wall_time"].iloc[0]) * self.reps)
                    fill()  # a finished cell can also change whether a device that held back takes one
                    yield c["id"], output

    def pieces(self, name: str, checkpoint: str | os.PathLike | None = None) -> pd.DataFrame:
        """A named side table that the study's custom cell returned (:class:`CellOutput`), over all cells.

        Parameters
        ----------
        name : str
            The piece's name (a key of ``CellOutput.pieces``), e.g. ``"history"``.
        checkpoint : path, optional
            The study's folder: read the stored pieces (``DIR/pieces/NAME/<cell>.parquet``) of every finished
            cell.  Without it, the pieces computed by this object's last :meth:`run` (not those it resumed).

        Returns
        -------
        pandas.DataFrame
            The pieces in cell order, each with the columns ``study, cell, truth, fit, n`` in front.
        """
        if checkpoint is not None:
            folder = Path(checkpoint) / "pieces" / name
            frames = [read_frame(folder / f"{c['id']}.parquet") for c in self.cells
                      if (folder / f"{c['id']}.parquet").is_file()]
        else:
            held = getattr(self, "_pieces", {}).get(name, {})
            frames = [held[c["id"]] for c in self.cells if c["id"] in held]
        if not frames:
            where = f"in {str(checkpoint)!r}" if checkpoint is not None else "from this object's last run"
            raise KeyError(f"no piece named {name!r} {where}; a custom cell returns pieces as "
                           "CellOutput(frame, pieces={name: DataFrame}).")
        return pd.concat(frames, ignore_index=True)

    # ----------------------------------------------------------------- summaries
    def _results(self, results: pd.DataFrame | str | os.PathLike, partial: bool = False) -> pd.DataFrame:
        if isinstance(results, pd.DataFrame):
            return results
        if isinstance(results, (str, os.PathLike)):
            return load_results(results, partial=partial)
        raise TypeError(f"results must be the study's frame (Study.run) or its folder, got {type(results).__name__}.")

    def performance(self, results: pd.DataFrame | str | os.PathLike, metrics: Sequence[str] | None = None, *,
                    by: Sequence[str] = ("truth", "fit", "n"), confidence_level: float = 0.95,
                    converged_only: bool = False, partial: bool = False) -> pd.DataFrame:
        r"""Performance measures with Monte Carlo SEs per cell (:func:`moestat.study_report.performance`).

        Parameter rows (bias, empirical SE, MSE, model SE, coverage, ... of every term of :math:`\theta`, from the
        ``est:``/``se:``/``true:`` columns the ``mle`` estimator records) and metric rows (mean, empirical SE,
        RMSE with closed-form MCSEs; ``log_mean`` and ``mean_log`` with jackknife MCSEs) in one tidy frame
        ``[*by, kind, quantity, measure, estimate, mcse, n_reps]``.  Error rows are skipped with a warning.

        Parameters
        ----------
        results : DataFrame or path
            The frame of :meth:`run`, or the study's folder.
        metrics : list of str, optional
            Metric columns (default: the columns this study's metrics wrote,
            :func:`moestat.study_report.metric_columns`).
        by, confidence_level, converged_only, partial
            Grouping columns; level of the coverage intervals; use only ``status == "ok"`` rows; read the
            finished cells of an unfinished study folder.
        """
        from .study_report import metric_columns, performance

        frame = self._results(results, partial)
        cols = metric_columns(frame, [metric_name(m) for m in self.metrics]) if metrics is None else metrics
        return performance(frame, cols, by=by, confidence_level=confidence_level, converged_only=converged_only)

    def rates(self, results: pd.DataFrame | str | os.PathLike, y: str,
              by: str | Sequence[str] | None = ("truth", "fit"), *, partial: bool = False, **options: Any) -> Any:
        """:func:`moestat.fit_rate` of metric ``y`` over the study's rows whose fit did not raise (error rows are
        skipped with a :class:`StudyFailureWarning` that says how many); ``options`` go to ``fit_rate``."""
        from .rates import fit_rate

        frame = successful_rows(self._results(results, partial))
        return fit_rate(frame, y, by=None if by is None else list([by] if isinstance(by, str) else by), **options)

    def report(self, results: pd.DataFrame | str | os.PathLike, directory: str | os.PathLike | None = None, *,
               confidence_level: float = 0.95, partial: bool = False) -> Path:
        """Write the study's ADEMP report ``report.md`` (:func:`moestat.study_report.write_report`) into
        ``directory`` (default: the study folder ``results``); returns its path."""
        from .study_report import write_report

        if directory is None:
            if isinstance(results, pd.DataFrame):
                raise TypeError("report(frame) needs directory=, the folder to write report.md into.")
            directory = results
        return write_report(directory, self, self._results(results, partial), confidence_level=confidence_level,
                            partial=partial)

    def _check_owner(self, ckpt: Path) -> None:
        """Refuse to resume into a folder that another study (another ``name``) wrote."""
        prov = ckpt / "provenance.json"
        if not prov.is_file():
            return
        try:
            owner = json.loads(prov.read_text()).get("config", {}).get("study", {}).get("name")
        except (OSError, ValueError, AttributeError):
            return  # unreadable provenance: the cells are checked one by one
        if owner is not None and owner != self.name:
            raise StudyConfigError(f"{str(ckpt)!r} holds the results of study {owner!r}, not of {self.name!r}; "
                                   "resume into that study's own folder, choose another folder, or pass "
                                   "resume=False (moestat study run --overwrite) to replace them.")

    def _write_config(self, ckpt: Path) -> None:
        try:
            text = self.to_toml()
        except ValueError:
            return
        write_atomic(ckpt / "study.toml", lambda tmp: Path(tmp).write_text(text))

    def _provenance(self, cells: list[dict[str, Any]], device: str, status: str) -> dict[str, Any]:
        return {
            "kind": "moestat.Study", "status": status, "study": _jsonable(self.to_dict()),
            "n_cells": len(cells), "device": device,
            "seeds": {"master": self.seed, "scheme": "SeedSequence(seed, spawn_key=(0, crc32(truth), n)) data; "
                      "(1, crc32(truth), crc32(fit), n) fit; (2, crc32(truth), n) metrics; child r = replicate r"},
            "cells": [{"id": c["id"], "truth": c["truth"]["label"], "fit": c["fit"]["label"], "n": c["n"],
                       "data_key": list(c["data_key"]), "fit_key": list(c["fit_key"])} for c in cells],
        }

    def __repr__(self) -> str:
        return (f"Study(name={self.name!r}, truths={[t['label'] for t in self.truths]}, "
                f"fits={[f['label'] for f in self.fits]}, n={self.n}, reps={self.reps}, cells={len(self.cells)})")


# ------------------------------------------------------------------ failures

class _Failures:
    """Failed replicates of a run (resumed cells included) against the study's ``max_failures``."""

    def __init__(self, study: Study, ckpt: Path | None) -> None:
        self.study, self.ckpt = study, ckpt
        self.limit = study.failure_limit()
        self.errors = self.not_converged = 0
        self.first: list[str] = []
        self.first_error: tuple[str, int, int, str] | None = None

    def add(self, cell_id: str, frame: pd.DataFrame) -> None:
        status = frame["status"].astype(str) if "status" in frame.columns else pd.Series([], dtype=str)
        err, nc = status == "error", status == "not_converged"
        self.errors += int(err.sum())
        self.not_converged += int(nc.sum())
        rows = frame[err | nc]
        for rep, st, msg in zip(rows["rep"], status[err | nc], rows.get("message", [""] * len(rows)), strict=True):
            if len(self.first) < 3:
                self.first.append(f"{cell_id} rep {int(rep)}: {st}" + (f" ({msg})" if msg else ""))
        if err.any() and self.first_error is None:
            self.first_error = (cell_id, int(err.sum()), len(frame), str(frame.loc[err, "message"].iloc[0]))

    @property
    def total(self) -> int:
        return self.errors + self.not_converged

    def _kept(self, n_done: int) -> str:
        if self.ckpt is None:
            return "Run with a checkpoint folder to keep finished cells."
        return (f"The {n_done} finished cells, the failed ones included, are kept in {str(self.ckpt)!r} (delete a "
                "cell's file under cells/ to recompute it); rerun with resume=True (--resume) to continue.")

    def check(self, n_done: int) -> None:
        """Raise :class:`StudyFailureError` when the failures exceed what the study tolerates."""
        if self.limit is None:
            if self.first_error is not None:
                cid, k, r, msg = self.first_error
                raise StudyFailureError(
                    f"study cell {cid}: {msg} ({k} of {r} replicates failed). The study stops at the first failed "
                    "fit because max_failures is not set; set max_failures (a count, or a fraction such as 0.05) "
                    f"to keep failed fits as rows and go on. {self._kept(n_done)}")
            return
        if self.total > self.limit:
            total = len(self.study.cells) * self.study.reps
            raise StudyFailureError(
                f"study {self.study.name!r} stopped: {self.total} failed replicates ({self.errors} errors, "
                f"{self.not_converged} not converged) exceed max_failures={self.study.max_failures!r} ({self.limit} "
                f"of the study's {total} replicates). First failures: {'; '.join(self.first)}. Raise max_failures or "
                f"fix the cause. {self._kept(n_done)}")

    def record(self) -> dict[str, Any]:
        return {"errors": self.errors, "not_converged": self.not_converged, "max_failures": self.study.max_failures,
                "limit": self.limit, "first": list(self.first)}

    def warn(self, rows: int) -> None:
        if self.total:
            warn_user(f"study {self.study.name!r}: {self.total} of {rows} replicates failed ({self.errors} errors, "
                      f"{self.not_converged} not converged); they are rows of the frame (columns status, message), "
                      f"e.g. {self.first[0]}.", StudyFailureWarning)


# ------------------------------------------------------------------ cell execution

def _check_options(where: str, estimator: Any, opts: Mapping[str, Any]) -> None:
    """Refuse, before any cell runs, an option the estimator does not take or a value its fitter's constraint
    table rejects (``moestat study check`` reports the same)."""
    fn = ESTIMATORS[estimator] if isinstance(estimator, str) else estimator
    names, table = _cells.estimator_options(fn)
    label = estimator if isinstance(estimator, str) else metric_name(estimator)
    _check_option_table(f"{where}.options", f"estimator {label!r}", names, table, opts)


def _check_metric_options(where: str, metric: Any, label: str, opts: Mapping[str, Any]) -> None:
    """Refuse, before any cell runs, an option the metric does not take or a value it would pass on to a function
    that rejects it (:func:`moestat.cells.metric_options`)."""
    names, table = _cells.metric_options(METRICS[metric] if isinstance(metric, str) else metric)
    _check_option_table(where, f"metric {label!r}", names, table, opts)


def _check_option_table(where: str, owner: str, names: set[str] | None, table: Mapping[str, Any],
                        opts: Mapping[str, Any]) -> None:
    """Each option of ``opts`` must be among ``names`` (None: any) and accepted by its constraint in ``table``."""
    for key, value in opts.items():
        if names is not None and key not in names:
            close = difflib.get_close_matches(key, sorted(names), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise StudyConfigError(f"{where}.{key} is not an option of {owner}{hint}; valid options are "
                                   f"{sorted(names)}.")
        constraint = table.get(key)
        if constraint is not None and not constraint.accepts(value):
            raise StudyConfigError(f"{where}.{key} must be {constraint.description}, got {value!r}.")


def _share_cores(workers: int) -> None:
    """Process-pool initializer: give each of ``workers`` processes an equal share of the CPU's cores as torch
    threads.  With torch's default of one thread per core in every worker, OpenMP teams oversubscribe the
    CPU and wait on each other (measured: one worker's 594 x 594 eigendecompositions held two threads busy
    for minutes while the other worker ran a fit).  ``study.threads``, when set, still applies per cell."""
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def _stored_cell(path: Path, cell_id: str, reps: int) -> pd.DataFrame | None:
    """A finished cell read back for a resume, or None (with a :class:`CheckpointWarning`) when its file is
    damaged, holds another cell's rows or misses replicates (or repeats some): such a cell is recomputed."""
    def reject(why: str) -> None:
        warn_user(f"stored cell {path.name} {why}; recomputing it.", CheckpointWarning)

    try:
        frame = read_frame(path)
    except Exception as err:  # any unreadable file: truncated, garbage, another format, a checksum mismatch
        reject(f"is damaged ({type(err).__name__}: {err})")
        return None
    if "cell" not in frame or set(frame["cell"]) != {cell_id}:
        found = sorted(map(str, set(frame["cell"]))) if "cell" in frame else "no cell column"
        reject(f"holds rows of {found}, not of {cell_id}")
        return None
    counts = frame["rep"].value_counts() if "rep" in frame else pd.Series(dtype=int)
    if set(counts.index) != set(range(reps)) or counts.nunique() > 1:
        reject(f"does not hold every replicate 0..{reps - 1} equally often")
        return None
    return _upgrade_cell(frame)


def _upgrade_cell(frame: pd.DataFrame) -> pd.DataFrame:
    """A cell stored before failures were rows: its optimiser stop reason (``status``/``status_alt``: gtol, ftol,
    max_iter, ...) becomes ``stop``/``stop_alt`` and ``status``/``message`` are added from ``converged``, so a
    resumed run's frame has the columns of a fresh one (the cell's numbers are unchanged)."""
    if "message" in frame.columns and "status" in frame.columns:
        return frame
    frame = frame.copy()
    if "status" in frame.columns and not set(map(str, frame["status"])) <= set(STATUSES):
        frame = frame.rename(columns={"status": "stop", "status_alt": "stop_alt"})
        if "converged_alt" in frame.columns:
            frame.insert(frame.columns.get_loc("converged_alt") + 1, "status_alt", status_from(frame["converged_alt"]))
    return _roundtrip(_with_status(frame, str(frame["cell"].iloc[0]) if len(frame) else "?"))


def _die_with_parent(parent_pid: int) -> None:
    """End this pool worker when the process that started it dies, even by SIGKILL (which runs no cleanup in
    the parent): on Linux the kernel sends SIGTERM on the parent's death (``prctl(PR_SET_PDEATHSIG)``); a daemon
    thread that polls the parent id covers other systems.  A worker whose parent died before this ran exits at
    once.  Finished cells are safe: only the main process writes them."""
    if sys.platform.startswith("linux"):
        # a libc without prctl (or none loadable) leaves the watch thread below as the only guard
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="moestat-parent-watch", daemon=True).start()


@contextlib.contextmanager
def _sigint_blocked(block: bool = True) -> Iterator[None]:
    """Hold SIGINT blocked in this thread while the pool starts its workers.

    A Ctrl-C at a terminal reaches the whole process group.  A spawned worker inherits the signal mask, so it
    starts with SIGINT blocked and a Ctrl-C that arrives while it still imports (seconds, before
    :func:`_init_worker` runs) stays pending instead of printing a KeyboardInterrupt traceback; the initializer
    then ignores SIGINT, which discards the pending one, and unblocks it.  In this process a Ctrl-C during the
    submissions stays pending too and is raised as soon as they end.
    """
    if not block or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _init_worker(workers: int, parent_pid: int) -> None:
    """Process-pool initializer: share the cores (:func:`_share_cores`), die with the parent, and ignore SIGINT: a
    Ctrl-C at a terminal reaches the whole process group, and it is the main process that ends the workers (a
    worker would otherwise print a KeyboardInterrupt traceback).  The worker started with SIGINT blocked
    (:func:`_sigint_blocked`); ignoring it discards a Ctrl-C that came during the start, then it is unblocked."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with_parent(parent_pid)
    _share_cores(workers)


class _Interrupts:
    """Ctrl-C (SIGINT) in the main process of a run that owns a process pool.

    The first SIGINT raises KeyboardInterrupt as Python's default handler does, and the run starts to end its
    workers.  A second one would break off that clean-up and leave workers running or unreaped, so it sets
    :attr:`again` instead, which makes the clean-up kill the workers at once (:func:`_end_workers`); a third raises
    again, for a clean-up that hangs.  Installed only in the main thread over Python's default handler (a caller's
    own handler is left alone), and restored when the run ends.
    """

    def __init__(self, install: bool) -> None:
        self.count = 0
        self.again = threading.Event()
        self._previous: Any = None
        if install and threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 2:
            self.again.set()
            return
        raise KeyboardInterrupt

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def _end_workers(processes: Sequence[Any], hurry: threading.Event | None = None, grace: float = 5.0) -> None:
    """End pool workers now and reap them: SIGTERM (whose default action ends a process at once, whatever it
    computes), then SIGKILL to those still alive after ``grace`` seconds or as soon as ``hurry`` is set (a second
    Ctrl-C); every worker is joined, so none is left a zombie."""
    import multiprocessing.connection

    for p in processes:
        p.terminate()
    deadline = time.monotonic() + grace
    alive = [p for p in processes if p.is_alive()]
    while alive and time.monotonic() < deadline and not (hurry is not None and hurry.is_set()):
        multiprocessing.connection.wait([p.sentinel for p in alive], timeout=0.1)
        alive = [p for p in alive if p.is_alive()]
    for p in alive:
        p.kill()
    for p in processes:
        p.join(timeout=grace)


def _stop_running(running: Any, interrupt: BaseException) -> None:
    """End the cell generator (:meth:`Study._execute`) of an interrupted run now.  When Ctrl-C came while the run
    stored a cell, the generator waits at its ``yield``: the interrupt is thrown in there, so it ends its pool now
    rather than when it is garbage-collected (closing it then would wait for the running cells)."""
    if running is not None and running.gi_frame is not None:
        with contextlib.suppress(KeyboardInterrupt, StopIteration):
            running.throw(interrupt)


@contextlib.contextmanager
def _pools_stopped_on_exit(executors: Sequence[cf.Executor], owned: bool, futures: Mapping[cf.Future[Any], Any],
                           hurry: threading.Event | None) -> Iterator[None]:
    """Stop the executors' work when the block ends.  On KeyboardInterrupt the workers of our own pools are ended at
    once (:func:`_end_workers`; ``hurry``: a second Ctrl-C) and a given executor's pending cells cancelled; on any
    other exit the pending cells are cancelled; our own pools are shut down in every case."""
    try:
        yield
    except KeyboardInterrupt:
        if owned:
            # the running cells are lost work either way (a resume recomputes them).  The pool's thread sees
            # its workers die and fails the pending cells itself; cancelling them here first would make it
            # raise InvalidStateError on them (CPython 3.11), so they are left to it.
            _end_workers([p for ex in executors for p in (getattr(ex, "_processes", None) or {}).values()], hurry)
        else:
            for fut in futures:
                fut.cancel()
        raise
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise
    finally:
        if owned:
            for ex in executors:
                ex.shutdown(wait=True, cancel_futures=True)


def run_cell(payload: dict[str, Any]) -> CellOutput:
    """Run one cell (in this process or a worker): its frame with every knob as a column, and its pieces."""
    import torch

    cell = payload["cell"]
    seed = payload["seed"]
    threads = payload.get("threads")
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        ctx = CellContext(
            truth_cfg={k: v for k, v in cell["truth"].items() if k != "_source"},
            fit_cfg={k: v for k, v in cell["fit"].items() if k != "_source"},
            n=cell["n"], reps=payload["reps"],
            data_seed=np.random.SeedSequence(seed, spawn_key=cell["data_key"]),
            fit_seed=np.random.SeedSequence(seed, spawn_key=cell["fit_key"]),
            metric_seed=np.random.SeedSequence(seed, spawn_key=cell["metric_key"]),
            device=payload["device"], metrics=list(payload["metrics"]),
            metric_options=payload["metric_options"], cache_dir=payload.get("cache_dir"), cache=payload.get("cache"),
        )
        fn = payload.get("fn") or estimator_cell
        t0 = time.perf_counter()
        pieces: Mapping[str, Any] = {}
        try:
            frame = fn(ctx)
            if isinstance(frame, CellOutput):
                frame, pieces = frame.frame, frame.pieces
        except Exception as exc:  # a failed cell is rows (status "error"); Study.run decides whether to go on
            frame = _cells.error_rows(range(ctx.reps), _cells.failure_message(exc))
        wall = time.perf_counter() - t0
    finally:
        if threads:
            torch.set_num_threads(old_threads)
    if not isinstance(frame, pd.DataFrame) or "rep" not in frame.columns:
        raise TypeError(f"study cell {cell['id']}: the cell function must return a DataFrame with a 'rep' column "
                        "(or a CellOutput whose frame has one).")
    for name, piece in pieces.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name) or not isinstance(
                piece, pd.DataFrame):
            raise TypeError(f"study cell {cell['id']}: piece {name!r} must be a DataFrame under a name of letters, "
                            "digits, '_' or '-'.")
    head = {"study": payload["study"], "cell": cell["id"], "truth": ctx.truth_cfg["label"],
            "fit": ctx.fit_cfg["label"], "n": ctx.n}
    tagged = {name: pd.concat([pd.DataFrame({k: [v] * len(piece) for k, v in head.items() if k not in piece}),
                               piece.reset_index(drop=True)], axis=1) for name, piece in pieces.items()}
    return CellOutput(_decorate(_with_status(frame.reset_index(drop=True), cell["id"]), ctx, payload, wall), tagged)


def _with_status(frame: pd.DataFrame, cell_id: str) -> pd.DataFrame:
    """Add ``status`` (from ``converged``, else ``"ok"``) and ``message`` where a (custom) cell left them out."""
    if "status" in frame.columns:
        bad = sorted(set(map(str, frame["status"])) - set(STATUSES))
        if bad:
            raise ValueError(f"study cell {cell_id}: column 'status' holds {bad}; it is reserved for "
                             f"{list(STATUSES)}. Rename the cell's column.")
    else:
        at = frame.columns.get_loc("converged") + 1 if "converged" in frame.columns else len(frame.columns)
        frame.insert(at, "status", status_from(frame["converged"]) if "converged" in frame.columns
                     else np.full(len(frame), "ok", dtype=object))
    if "message" not in frame.columns:
        frame.insert(frame.columns.get_loc("status") + 1, "message", np.full(len(frame), "", dtype=object))
    return frame


def _decorate(frame: pd.DataFrame, ctx: CellContext, payload: dict[str, Any], wall: float) -> pd.DataFrame:
    cell = payload["cell"]
    cols: dict[str, Any] = {"study": payload["study"], "cell": cell["id"], "truth": ctx.truth_cfg["label"],
                            "fit": ctx.fit_cfg["label"], "n": ctx.n}
    t = ctx.truth_cfg
    if "data" in t:
        cols["truth_preset"] = "data"
        for k, v in t["data"].items():
            cols[f"truth_{k}"] = _scalar(v)
        if t.get("stream") is not None:
            cols["truth_stream"] = t["stream"]
        return _finish(frame, cols, ctx, payload, wall)
    truth = ctx.truth()
    if t.get("preset"):
        import inspect

        bound = inspect.signature(PRESETS[t["preset"]]).bind_partial(
            **{k: v for k, v in t.items() if k in preset_keys(t["preset"])})
        bound.apply_defaults()
        cols["truth_preset"] = t["preset"]
        for k, v in bound.arguments.items():
            if k == "n":
                continue
            cols[k if k.startswith("truth_") else f"truth_{k}"] = _scalar(v)
        cols["truth_duplicate_default"] = _scalar(truth.info.get("duplicate", []))
    else:
        cols["truth_preset"] = "explicit"
        for k in ("gate", "expert", "k", "d", "noise_sd"):
            cols[f"truth_{k}"] = getattr(truth.spec, k)
    for k in (*TRUTH_SIM_KEYS, "stream"):
        if t.get(k) is not None:
            cols[f"truth_{k}"] = _scalar(t[k]) if k != "design" or isinstance(t[k], str) else _design_id(t[k])
    return _finish(frame, cols, ctx, payload, wall, spec=ctx.fit_spec())


def _finish(frame: pd.DataFrame, cols: dict[str, Any], ctx: CellContext, payload: dict[str, Any],
            wall: float, spec: Any = None) -> pd.DataFrame:
    """The fit's knobs (``spec``: the fitted MoE, if the cell fits one), the seeds and the wall time added to a
    cell's frame after the truth's columns."""
    cell = payload["cell"]
    R = payload["reps"]
    f = ctx.fit_cfg
    cols["estimator"] = metric_name(f.get("estimator", "lse")) if payload.get("fn") is None else \
        metric_name(payload["fn"])
    if spec is not None:
        cols["gate"], cols["expert"], cols["k"] = spec.gate, spec.expert, spec.k
    for k in ("top_k", "temperature"):
        if f.get(k) is not None:
            cols[k] = f[k]
    for k, v in f.get("options", {}).items():
        if k in frame.columns:  # the estimator reported its resolved value of this option
            continue
        cols[k if k not in _RESERVED else f"opt_{k}"] = _scalar(v)
    data_seed = np.random.SeedSequence(payload["seed"], spawn_key=cell["data_key"])
    cols["seed"] = payload["seed"]
    cols["fit_seed"] = "/".join(map(str, cell["fit_key"]))
    cols["device"] = payload["device"]
    head = pd.DataFrame({k: [v] * len(frame) for k, v in cols.items() if k not in frame.columns})
    out = pd.concat([head, frame], axis=1)
    reps = out["rep"].to_numpy()
    if len(reps) and (reps.min() < 0 or reps.max() >= R):
        raise ValueError(f"study cell {cell['id']}: rep values must lie in [0, {R}); got {reps.min()}..{reps.max()}.")
    keys = data_seed.spawn_key
    out.insert(out.columns.get_loc("seed") + 1, "data_seed",
               ["/".join(map(str, (*keys, int(r)))) for r in reps])
    out["wall_time"] = wall / max(R, 1)
    return out


def _design_id(design: Any) -> str:
    """A short name of a fixed design array for the frame: its shape and a hash of its values."""
    arr = np.ascontiguousarray(np.asarray(design, dtype=np.float64))
    return f"array{list(arr.shape)}:{hashlib.sha1(arr.tobytes()).hexdigest()[:10]}"


# ----------------------------------------------------------------------- file I/O

def _roundtrip(frame: pd.DataFrame) -> pd.DataFrame:
    """Pass a frame through parquet so in-memory and stored cells have identical dtypes."""
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    buf.seek(0)
    return pd.read_parquet(buf)


def load_results(path: str | os.PathLike, *, partial: bool = False) -> pd.DataFrame:
    """Read a study's frame from a checkpoint folder or a ``.parquet``/``.csv`` file.

    A folder must hold a complete study: its ``provenance.json`` says ``complete`` and ``results.parquet`` holds
    exactly the cells the study lists (``cells.json``).  An interrupted study (or
    one whose results file is older than its cells) is refused with a message that says how to finish it;
    ``partial=True`` instead assembles the finished cells there are, for a look while it runs.
    """
    p = Path(path)
    if p.is_dir():
        prov = p / "provenance.json"
        status = None
        if prov.is_file():
            try:
                status = json.loads(prov.read_text()).get("config", {}).get("status")
            except (OSError, ValueError, AttributeError):
                status = None
        cells = sorted((p / "cells").glob("*.parquet")) if (p / "cells").is_dir() else []
        if partial:
            if cells:
                return pd.concat([pd.read_parquet(c) for c in cells], ignore_index=True)
        elif (p / "results.parquet").is_file() and status in (None, "complete"):
            frame = pd.read_parquet(p / "results.parquet")
            listed = p / "cells.json"
            if listed.is_file() and "cell" in frame:
                want = set(json.loads(listed.read_text()).get("cells", []))
                if set(frame["cell"]) != want:
                    raise ValueError(f"{str(p)!r}: results.parquet does not hold the {len(want)} cells the study "
                                     "lists (cells.json); rerun the study with --resume to rebuild it.")
            return frame
        elif status not in (None, "complete"):
            raise ValueError(f"{str(p)!r} holds an unfinished study (status {status!r}, {len(cells)} cells "
                             "finished); finish it with `moestat study run STUDY.toml --out DIR --resume`, or read "
                             "the finished cells with load_results(..., partial=True) (moestat rates --partial).")
        if not partial and cells and not (p / "results.parquet").is_file():
            return pd.concat([pd.read_parquet(c) for c in cells], ignore_index=True)
        if (p / "results.csv").is_file():
            return pd.read_csv(p / "results.csv")
        raise FileNotFoundError(f"{str(p)!r} holds no study results (results.parquet, cells/*.parquet or "
                                "results.csv); run a study with checkpoint= or --out there first.")
    if p.suffix == ".parquet":
        return pd.read_parquet(p)
    if p.suffix == ".csv":
        return pd.read_csv(p)
    raise FileNotFoundError(f"{str(p)!r} is neither a study folder nor a .parquet/.csv file.")
