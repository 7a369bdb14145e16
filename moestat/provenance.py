"""Provenance records: what produced a result (package versions, configuration, seeds, device)."""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import write_atomic


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.random.SeedSequence):
        return {"entropy": value.entropy, "spawn_key": list(value.spawn_key)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


#: The paths of a checkout whose uncommitted changes :func:`source_revision` reports (git pathspecs).
CODE_PATHS = ("moestat", "vignettes", "benchmarks", ":(exclude)benchmarks/results", "pyproject.toml",
              "constraints.txt")


@functools.cache
def source_revision(root: Path | None = None) -> dict[str, Any] | None:
    """The git commit of the moestat source tree and whether its code had uncommitted changes, or None when
    moestat does not run from a git checkout (an installed wheel) or git is not available.

    A result's numbers depend on the code that produced it, which the package version alone does not name: the
    package, the vignette and benchmark scripts and the dependency pins (:data:`CODE_PATHS`), not the results they
    write (``docs/``, ``benchmarks/results/``) or the tests.  Read once per process, at the first call (the code a
    run has imported is the code of its start)."""
    root = Path(__file__).resolve().parent.parent if root is None else root
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                  *CODE_PATHS],
                                 capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "uncommitted_changes": bool(changed)}


def stale_outputs_note(out: str | os.PathLike[str], name: str = "provenance.json") -> str | None:
    """A note when the outputs in ``out`` were produced by other code than the code running now, else None.

    Reads the commit recorded in ``out/provenance.json`` (:func:`source_revision`); None when either commit is
    unknown (no record, a record written before commits were recorded, or not a git checkout).  A run that resumes
    from finished outputs keeps them as they are, so results of older code would otherwise pass for current ones.
    """
    path = Path(out) / name
    try:
        recorded = (json.loads(path.read_text()).get("source") or {}).get("commit")
    except (OSError, ValueError, AttributeError):
        return None
    now = source_revision()
    if not recorded or now is None or recorded == now["commit"]:
        return None
    return (f"the outputs in {out} were produced by moestat commit {recorded[:10]}, and the code is now at "
            f"{now['commit'][:10]}; they were kept as they are (--no-resume recomputes them).")


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`; "" if unknown).

    With ``cpu_capability`` (the vector instruction set torch's CPU kernels dispatch to) it tells whether a result
    can be expected to reproduce bit for bit: another processor or instruction set rounds some sums differently, and
    fits on flat likelihoods (over-specified models) carry such differences to other end points
    (docs/studies.md, *Reproducing a result*)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def provenance(config: dict[str, Any] | None = None, *, device: str | None = None) -> dict[str, Any]:
    """A JSON-ready record of the software, machine (processor and the instruction set torch uses on it) and
    configuration behind a result."""
    import pandas as pd
    import scipy
    import torch

    from . import __version__

    return {
        "moestat": __version__,
        "source": source_revision(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "pandas": pd.__version__,
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device": device,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": _jsonable(config or {}),
    }


def write_json_atomic(path: str | os.PathLike[str], payload: dict[str, Any]) -> Path:
    """Write ``payload`` as JSON to ``path`` atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_jsonable(payload), indent=2, sort_keys=True)
    write_atomic(path, lambda tmp: Path(tmp).write_text(text))
    return path


def write_provenance(out: str | os.PathLike[str], config: dict[str, Any] | None = None, *,
                     device: str | None = None, name: str = "provenance.json") -> Path:
    """Write :func:`provenance` into ``out/provenance.json`` and return its path."""
    return write_json_atomic(Path(out) / name, provenance(config, device=device))
