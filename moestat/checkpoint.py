"""Checkpoints of long jobs: atomic file writes and a store of finished cells that a resumed run skips.

A long computation (a simulation study, a vignette's sweeps) is split into cells whose results are tidy
frames.  :class:`CellStore` keeps one file per finished cell and gives it back when the job is resumed, so
a run killed at any moment loses at most the cells in progress and never leaves a half-written one:

* every file is written to a temporary name beside its target, flushed to disk (``fsync``) and renamed over
  the target (:func:`write_frame`): a reader sees the old file or the whole new one, never a torn one;
* beside every file sits its SHA-256 (``<file>.sha256``); :func:`read_frame` refuses a file whose bytes no
  longer match (a bit flipped on disk, a file edited or copied over), so a resumed run recomputes such a cell
  instead of trusting it.  A file without a checksum (written before checksums) is read as it is;
* a cell's file name carries a hash of the configuration it was computed under (the store's ``config`` and
  the cell's own ``key``), so a changed setting recomputes the cell instead of reusing a stale one, and two
  configurations (say a quick and a full run) can share one folder.

:class:`moestat.Study` keeps its cells the same way (``cells/<id>.parquet``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .exceptions import CheckpointWarning, warn_user

__all__ = ["CellStore", "ChecksumError", "config_hash", "read_frame", "write_atomic", "write_frame"]


class ChecksumError(ValueError):
    """A checkpoint file's bytes do not match the SHA-256 recorded beside it."""


def write_atomic(path: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, fsync it and rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _checksum_path(p: Path) -> Path:
    return p.with_name(p.name + ".sha256")


def _file_digest(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_frame(frame: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write ``frame`` atomically as parquet or CSV (by the suffix of ``path``), without the index, and its
    SHA-256 beside it (``<path>.sha256``, also atomic)."""
    p = Path(path)
    if p.suffix == ".parquet":
        write_atomic(p, lambda tmp: frame.to_parquet(tmp, index=False))
    elif p.suffix == ".csv":
        write_atomic(p, lambda tmp: frame.to_csv(tmp, index=False))
    else:
        raise ValueError(f"path must end in .parquet or .csv, got {str(path)!r}.")
    digest = _file_digest(p)
    write_atomic(_checksum_path(p), lambda tmp: Path(tmp).write_text(digest + "\n"))


def read_frame(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a frame written by :func:`write_frame`, checking its SHA-256 when one is recorded beside it.

    Raises
    ------
    ChecksumError
        If the file's bytes differ from the recorded checksum (the file was damaged or replaced).
    """
    p = Path(path)
    sidecar = _checksum_path(p)
    if sidecar.is_file():
        recorded = sidecar.read_text().strip()
        actual = _file_digest(p)
        if actual != recorded:
            raise ChecksumError(f"{p.name} does not match its recorded SHA-256 ({recorded[:12]}..., file "
                                f"{actual[:12]}...): the file was damaged or replaced after it was written.")
    return pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def config_hash(config: Any, length: int = 10) -> str:
    """A short, stable hex digest of a configuration (dicts compared by content, key order ignored)."""
    text = json.dumps(_canonical(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


class CellStore:
    """Finished cells of a job, one file per cell in ``directory``; see the module docstring.

    Parameters
    ----------
    directory : path
        Folder of the cell files (created if missing).
    config : mapping, optional
        The job's configuration: part of every cell's hash.
    resume : bool
        Give back finished cells (True) or recompute and overwrite them (False).
    fmt : {"csv", "parquet"}
        File format of the cells.

    Examples
    --------
    >>> store = CellStore(tmp_path / "pieces", config=cfg)            # doctest: +SKIP
    >>> frame = store.get("vs_n", lambda: simulate_and_fit(cfg))        # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike[str], *, config: Mapping[str, Any] | None = None,
                 resume: bool = True, fmt: str = "csv") -> None:
        if fmt not in ("csv", "parquet"):
            raise ValueError(f"fmt must be 'csv' or 'parquet', got {fmt!r}.")
        self.directory = Path(directory)
        self.config = dict(config or {})
        self.resume = bool(resume)
        self.fmt = fmt
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, name: str, key: Mapping[str, Any] | None = None) -> Path:
        """The file of cell ``name`` (with the cell's own ``key``, if any) under the store's configuration."""
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip("-") or "cell"
        digest = config_hash({"config": self.config, "name": str(name), "key": dict(key or {})})
        return self.directory / f"{slug}-{digest}.{self.fmt}"

    def done(self, name: str, key: Mapping[str, Any] | None = None) -> bool:
        """Whether cell ``name`` is stored (under this configuration)."""
        return self.path(name, key).is_file()

    def read(self, name: str, key: Mapping[str, Any] | None = None) -> pd.DataFrame:
        """The stored frame of cell ``name`` (FileNotFoundError naming the cell if it is not stored)."""
        p = self.path(name, key)
        if not p.is_file():
            raise FileNotFoundError(f"cell {name!r} is not stored in {str(self.directory)!r} under this "
                                    "configuration; run the job (with resume=True) to compute it.")
        return read_frame(p)

    def write(self, name: str, frame: pd.DataFrame, key: Mapping[str, Any] | None = None) -> None:
        """Store ``frame`` as cell ``name`` (atomically)."""
        write_frame(frame, self.path(name, key))

    def get(self, name: str, compute: Callable[[], pd.DataFrame], key: Mapping[str, Any] | None = None
            ) -> pd.DataFrame:
        """Cell ``name``: the stored frame when resuming and it is there, else ``compute()``, stored first.

        The frame returned after computing is the stored one read back, so that a fresh and a resumed run
        return identical frames (same dtypes and float round trip)."""
        if self.resume and self.done(name, key):
            try:
                return self.read(name, key)
            except ChecksumError as err:
                warn_user(f"stored cell {name!r}: {err} Recomputing it.", CheckpointWarning)
        self.write(name, compute(), key)
        return self.read(name, key)
