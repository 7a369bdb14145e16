"""Shared command-line entry for vignette scripts (``python vignettes/NAME.py --quick --out DIR``).

A vignette is a jupytext percent script in ``vignettes/`` defining ``NAME``, ``TITLE`` and
``run(out, quick=False, resume=True)``; ``run`` writes ``results.csv``, its figures (PNG),
``rates.csv`` where rates are estimated and ``provenance.json`` into ``out``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def vignette_cli(run: Callable[..., object], name: str, argv: Sequence[str] | None = None) -> int:
    """Parse ``--quick``, ``--out`` and ``--no-resume`` and call ``run``."""
    parser = argparse.ArgumentParser(prog=f"vignette {name}", description=f"Run the {name} vignette.")
    parser.add_argument("--quick", action="store_true", help="reduced size (minutes on 2 CPU cores)")
    parser.add_argument("--out", default=f"out/{name}", help=f"output folder (default out/{name})")
    parser.add_argument("--no-resume", action="store_true", help="recompute finished cells")
    args = parser.parse_args(argv)
    run(Path(args.out), quick=args.quick, resume=not args.no_resume)
    print(f"{name}: results written to {args.out}")
    return 0
