"""Shared command-line entry for vignette scripts (``python vignettes/NAME.py --quick --out DIR``).

A vignette is a jupytext percent script in ``vignettes/`` defining ``NAME``, ``TITLE`` and
``run(out, quick=False, resume=True)``; ``run`` writes ``results.csv``, its figures (PNG),
``rates.csv`` where rates are estimated and ``provenance.json`` into ``out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._placement import executor_for, parse_workers
from .exceptions import MoestatWarning, warn_user
from .provenance import stale_outputs_note


def vignette_cli(run: Callable[..., object], name: str, argv: Sequence[str] | None = None, *,
                 sizes: Sequence[str] | None = None, workers: bool = False,
                 peer: tuple[Callable[[str, str], object], str] | None = None) -> int:
    """Parse ``--quick``, ``--out`` and ``--no-resume`` and call ``run``.

    Options a vignette's ``run`` takes as keywords: ``sizes`` adds ``--size`` (one of them), ``workers`` adds
    ``--workers N``, and ``peer = (run_peer, repository)`` adds ``--peer DIR`` (a clone of that repository), passed
    to ``run`` as ``peer=``; ``--peer`` without a size or ``--quick`` calls ``run_peer(DIR, out)`` alone (the
    authors' stored fits re-analysed, no study run).
    """
    parser = argparse.ArgumentParser(prog=f"vignette {name}", description=f"Run the {name} vignette.")
    parser.add_argument("--quick", action="store_true", help="reduced size (minutes on 2 CPU cores)")
    if sizes is not None:
        parser.add_argument("--size", choices=sorted(sizes), help="a named size")
    parser.add_argument("--out", default=f"out/{name}", help=f"output folder (default out/{name})")
    parser.add_argument("--no-resume", action="store_true", help="recompute finished cells")
    if workers:
        parser.add_argument("--workers", default=None,
                            help="worker processes (default: the CPU count), or one pool per device: cuda=2,cpu=14")
    if peer is not None:
        parser.add_argument("--peer", default=None, help=f"a clone of {peer[1]}")
    args = parser.parse_args(argv)
    size = getattr(args, "size", None)
    options: dict[str, Any] = {}
    if sizes is not None:
        options["size"] = size
    if workers:
        try:
            options["workers"] = parse_workers(args.workers)
        except ValueError as exc:
            parser.error(f"--{exc}")
    if peer is not None and args.peer is not None and not args.quick and size is None:
        peer[0](args.peer, args.out)
    else:
        if peer is not None:
            options["peer"] = args.peer
        run(Path(args.out), quick=args.quick, resume=not args.no_resume, **options)
    print(f"{name}: results written to {args.out}")
    return 0


def run_study_timed(study: Any, out: Path, *, resume: bool = True, progress: bool = True,
                    workers: int | str | Mapping[str, int] | None = None) -> tuple[Any, dict[str, Any]]:
    """Run ``study`` into ``out/study`` (worker processes when ``workers`` > 1; default: the CPU count; or one pool
    per device, ``{"cuda": 2, "cpu": 14}`` or ``"cuda=2,cpu=14"``: :meth:`moestat.Study.run`) and
    return ``(frame, timing)``: ``study_seconds``, ``cells_computed`` and ``workers``.  The timing is saved in
    ``out/study/timing.json`` as soon as the study finishes; when every cell was loaded from an earlier run, the
    timing of the run that computed them is returned (that file, else ``out/provenance.json``), so a re-render
    keeps the measured time.  Cells reused from a run of other code (:func:`moestat.provenance.stale_outputs_note`)
    give a :class:`moestat.exceptions.MoestatWarning`."""
    pools = parse_workers(workers) or os.cpu_count() or 1
    cells = out / "study" / "cells"
    stored = {p.name for p in cells.glob("*.parquet")} if resume and cells.is_dir() else set()
    note = stale_outputs_note(out) if stored else None
    if note:  # cells of older code would be mixed with cells of the current code
        warn_user(f"{len(stored)} finished study cells are reused: {note}", MoestatWarning)
    t0 = time.perf_counter()
    frame = study.run(out / "study", resume=resume, progress=progress, executor=executor_for(pools), workers=pools)
    seconds = time.perf_counter() - t0
    computed = len({p.name for p in cells.glob("*.parquet")} - stored) if resume else len(study.cells)
    timing = {"study_seconds": round(seconds, 1), "cells_computed": computed,
              "workers": ",".join(f"{d}={n}" for d, n in pools.items()) if isinstance(pools, dict) else pools}
    saved = out / "study" / "timing.json"
    previous = out / "provenance.json"
    if computed > 0:
        saved.write_text(json.dumps(timing))  # kept even if a later step of the vignette fails
    elif saved.is_file():
        timing = json.loads(saved.read_text())
    elif previous.is_file():
        timing = json.loads(previous.read_text())["config"].get("timing", timing)
    return frame, timing
