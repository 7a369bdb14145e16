"""MkDocs hook: ship MathJax with the built site, so that no page loads a script from another host.

MathJax 3 comes from the npm registry, pinned (with its integrity hash) by ``package.json`` /
``package-lock.json`` at the repository root.  When ``node_modules/mathjax`` is missing or not the pinned version,
the hook runs ``npm ci`` once; without npm the build stops with the command to run.  It then adds to the site, under
``javascripts/mathjax/``, the files a page can load: the ``tex-chtml.js`` component, the TeX extensions it
autoloads (``\\boldsymbol``, ``\\cancel``, ...), the CHTML woff-v2 fonts, the menu and accessibility components and
MathJax's licence; and ``javascripts/mathjax-config.js`` (``docs/_ext/mathjax-config.js``).  ``mkdocs.yml`` lists
both scripts in ``extra_javascript``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

_log = logging.getLogger("mkdocs.plugins.moestat_mathjax")

SITE_DIR = "javascripts/mathjax"
"""Where the vendored files go in the built site (``mkdocs.yml``'s ``extra_javascript`` points here)."""

VENDORED = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2", "ui", "a11y", "sre")
"""Paths under the package's ``es5/`` folder that the site needs (``tex-chtml.js`` loads the rest on demand)."""


def _pinned_version(root: Path) -> str:
    return str(json.loads((root / "package.json").read_text())["dependencies"]["mathjax"])


def _installed_version(root: Path) -> str | None:
    manifest = root / "node_modules" / "mathjax" / "package.json"
    return str(json.loads(manifest.read_text())["version"]) if manifest.is_file() else None


def mathjax_dir(root: Path) -> Path:
    """The ``es5/`` folder of the pinned MathJax under ``root/node_modules``, installed with ``npm ci`` if needed.

    Raises ``PluginError`` naming the command to run when npm is missing or the install fails.
    """
    pinned = _pinned_version(root)
    if _installed_version(root) == pinned:
        return root / "node_modules" / "mathjax" / "es5"
    # one install at a time: `npm ci` empties node_modules first, which a concurrent build would read half-made
    lock = Path(tempfile.gettempdir()) / f"moestat-mathjax-{hashlib.sha1(str(root).encode()).hexdigest()[:12]}.lock"
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _install(root, pinned)
    return root / "node_modules" / "mathjax" / "es5"


def _install(root: Path, pinned: str) -> None:
    """``npm ci`` in ``root`` unless another build has just installed the pinned MathJax."""
    if _installed_version(root) != pinned:
        npm = shutil.which("npm")
        if npm is None:
            raise PluginError(f"MathJax {pinned} is not installed and npm is not on PATH: install Node.js/npm "
                              f"(Debian: apt-get install -y npm), then run `npm ci` in {root}.")
        _log.info("Installing MathJax %s from the npm registry (npm ci)", pinned)
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=root,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0 or _installed_version(root) != pinned:
            raise PluginError(f"`npm ci` in {root} did not install MathJax {pinned} (exit {done.returncode}):\n"
                              f"{done.stderr[-2000:]}")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the MathJax files and its configuration to the site's files."""
    root = Path(config.config_file_path).parent
    es5 = mathjax_dir(root)
    for entry in VENDORED:
        path = es5 / entry
        for src in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if src.is_file():
                rel = src.relative_to(es5).as_posix()
                files.append(File.generated(config, f"{SITE_DIR}/{rel}", abs_src_path=str(src)))
    files.append(File.generated(config, f"{SITE_DIR}/LICENSE", abs_src_path=str(es5.parent / "LICENSE")))
    config_js = Path(__file__).with_name("mathjax-config.js")
    files.append(File.generated(config, "javascripts/mathjax-config.js", abs_src_path=str(config_js)))
    return files
