"""Re-run a vignette and compare every table it writes with the checked-in one under ``docs/vignettes``.

Usage::

    .venv/bin/python tools/vignette_repro.py softmax-gaussian-moe --size quick [--workers 2] [--out DIR]
    .venv/bin/python tools/vignette_repro.py real-data-counts             # the size the vignette runs by default

The vignette runs as its page says (``moestat vignette run NAME [--quick | --size SIZE]``) into ``--out`` (default
``out/repro/NAME``).  Its checked-in folder is ``docs/vignettes/NAME/SIZE`` where that exists, else
``docs/vignettes/NAME``.  Every CSV present on both sides is compared column by column, except columns that time
something (``time``, ``wall``, ``second``, ``created``, ``elapsed`` in the name):

* ``equal``: every value the same (NaN equal to NaN);
* ``equal to rtol``: numbers within ``--rtol`` relative (default 1e-9; plus ``--atol`` absolute, default 0), text
  the same;
* ``DIFFER``: the columns that do not, with how many rows and the largest relative difference.

CSVs on one side only, and tables of another shape, are listed.  Both runs' ``provenance.json`` name the source
commit and, since 2026-11-27, the processor and the instruction set torch used (``cpu``, ``cpu_capability``): on
another processor an over-specified fit may end elsewhere (docs/studies.md, *Reproducing a result*).  Exits 1 when
any table differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
#: Substrings of column names that time something; such columns are not compared.
TIMING = ("time", "wall", "second", "created", "elapsed")


def compare_tables(new: pd.DataFrame, old: pd.DataFrame, rtol: float = 1e-9,
                   atol: float = 0.0) -> tuple[str, list[str]]:
    """(``"equal"``, ``"equal to rtol"`` or ``"DIFFER"``, the differing columns described) for two tables; numbers
    are equal to the tolerance when ``|new - old| <= atol + rtol |old|``."""
    if list(new.columns) != list(old.columns) or new.shape != old.shape:
        extra = sorted(set(new.columns) ^ set(old.columns))
        where = f"; columns on one side: {extra}" if extra else ""
        return "DIFFER", [f"shape {new.shape} against {old.shape}{where}"]
    exact, notes = True, []
    for column in new.columns:
        if any(word in column.lower() for word in TIMING):
            continue
        a, b = new[column], old[column]
        if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
            x, y = a.to_numpy(float), b.to_numpy(float)
            if np.array_equal(x, y, equal_nan=True):
                continue
            exact = False
            close = np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
            if not close.all():
                with np.errstate(divide="ignore", invalid="ignore"):
                    rel = np.abs(x - y)[~close] / np.abs(y[~close])
                notes.append(f"{column} ({int((~close).sum())} rows, largest relative difference {np.nanmax(rel):.1e})")
        else:
            same = (a.isna() & b.isna()) | (a.astype(str) == b.astype(str))
            if not same.all():
                exact = False
                notes.append(f"{column} ({int((~same).sum())} rows of text)")
    if notes:
        return "DIFFER", notes
    return ("equal" if exact else "equal to rtol"), []


def checked_in_folder(name: str, size: str | None) -> Path:
    """``docs/vignettes/NAME/SIZE`` where it exists, else ``docs/vignettes/NAME``."""
    base = ROOT / "docs" / "vignettes" / name
    return base / size if size and (base / size).is_dir() else base


def machine(folder: Path) -> str:
    """The source commit, processor and instruction set a ``provenance.json`` names."""
    path = folder / "provenance.json"
    if not path.exists():
        return "no provenance.json"
    record = json.loads(path.read_text())
    commit = (record.get("source") or {}).get("commit", "?")
    return (f"commit {str(commit)[:10]}, cpu {record.get('cpu', 'not recorded')!r}, "
            f"cpu_capability {record.get('cpu_capability', 'not recorded')!r}, created {record.get('created')}")


def compare_folders(new: Path, old: Path, rtol: float, atol: float = 0.0) -> bool:
    """Print one line per CSV; True when every table on both sides is equal to ``rtol``."""
    ok = True
    ours = {p.relative_to(new) for p in new.rglob("*.csv")}
    theirs = {p.relative_to(old) for p in old.rglob("*.csv")}
    for rel in sorted(ours & theirs):
        verdict, notes = compare_tables(pd.read_csv(new / rel), pd.read_csv(old / rel), rtol, atol)
        ok &= verdict != "DIFFER"
        print(f"  {rel}: {verdict}" + (": " + "; ".join(notes) if notes else ""))
    for rel in sorted(ours - theirs):
        print(f"  {rel}: written by this run only")
    for rel in sorted(theirs - ours):
        print(f"  {rel}: checked in only")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="the vignette (moestat vignette list)")
    ap.add_argument("--size", default=None, help="'quick' or a named size of the vignette; default its default size")
    ap.add_argument("--workers", default=None,
                    help="worker processes of the vignette's study (default: the command's; not for one-process ones)")
    ap.add_argument("--out", default=None, help="where the run writes (default out/repro/NAME)")
    ap.add_argument("--rtol", type=float, default=1e-9, help="relative tolerance of 'equal to rtol' (default 1e-9)")
    ap.add_argument("--atol", type=float, default=0.0,
                    help="absolute tolerance as well (default 0; for columns that are themselves rounding-level "
                         "differences, such as two estimators' gap at 1e-11)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else ROOT / "out" / "repro" / args.name
    size_args = [] if args.size is None else (["--quick"] if args.size == "quick" else ["--size", args.size])
    workers = [] if args.workers is None else ["--workers", args.workers]
    cmd = [sys.executable, "-m", "moestat", "vignette", "run", args.name, *size_args, "--out", str(out), *workers,
           "--no-resume"]
    print(" ".join(cmd), flush=True)
    run = subprocess.run(cmd, cwd=ROOT)
    if run.returncode:
        return run.returncode
    old = checked_in_folder(args.name, args.size)
    print(f"this run:   {machine(out)}\nchecked in: {machine(old)} ({old.relative_to(ROOT)})")
    return 0 if compare_folders(out, old, args.rtol, args.atol) else 1


if __name__ == "__main__":
    sys.exit(main())
