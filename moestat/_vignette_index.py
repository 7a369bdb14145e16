"""Find and load the vignettes shipped in ``moestat.vignettes`` (from a checkout or a wheel).

Every ``*.py`` file of the package ``moestat.vignettes`` (the ``vignettes/`` folder of the
repository) that assigns module-level ``NAME`` and ``TITLE`` strings is a vignette.  Listing
reads those two assignments with :mod:`ast` (no code runs); running loads the file by path with
:mod:`importlib` as ``moestat.vignettes.<module_name>`` (file names contain hyphens).
"""

from __future__ import annotations

import ast
import importlib.resources
import importlib.util
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

_KEEP = ExitStack()  # keeps extracted files alive when the package lives in a zip archive


@dataclass(frozen=True)
class VignetteInfo:
    """A discovered vignette: its ``NAME``, ``TITLE`` and file."""

    name: str
    title: str
    path: Path


def _literal(tree: ast.Module, target: str) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == target for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, str) else None
    return None


def _roots() -> list:
    """Where vignettes live: the checkout's ``vignettes/`` beside the imported package (when moestat runs
    from a source tree), then the installed package ``moestat.vignettes`` (wheel or editable install)."""
    roots = []
    checkout = Path(__file__).resolve().parent.parent / "vignettes"
    if (checkout / "__init__.py").is_file():
        roots.append(checkout)
    try:
        roots.append(importlib.resources.files("moestat.vignettes"))
    except ModuleNotFoundError:
        pass
    return roots


def discover() -> list[VignetteInfo]:
    """All installed vignettes, sorted by name (the first root that has a name wins)."""
    found: list[VignetteInfo] = []
    for root in _roots():
        names = {v.name for v in found}
        found += [v for v in _scan(root) if v.name not in names]
    return sorted(found, key=lambda v: v.name)


def _scan(root) -> list[VignetteInfo]:
    found = []
    for entry in root.iterdir():
        if not entry.name.endswith(".py") or entry.name.startswith("_"):
            continue
        path = Path(_KEEP.enter_context(importlib.resources.as_file(entry)))
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        name, title = _literal(tree, "NAME"), _literal(tree, "TITLE")
        if name:
            found.append(VignetteInfo(name, title or "", path))
    return found


def find(name: str) -> VignetteInfo:
    """The vignette called ``name``; a ValueError lists the available names otherwise."""
    found = discover()
    for v in found:
        if v.name == name or v.path.stem == name:
            return v
    raise ValueError(f"no vignette named {name!r}; available: {[v.name for v in found]} "
                     "(see 'moestat vignette list').")


def load(info: VignetteInfo) -> ModuleType:
    """Import a vignette file by path as ``moestat.vignettes.<stem with _ for ->``."""
    mod_name = "moestat.vignettes." + info.path.stem.replace("-", "_")
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, info.path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a loader
        raise ValueError(f"cannot load vignette file {info.path}.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    if not callable(getattr(module, "run", None)):
        raise ValueError(f"vignette {info.name!r} ({info.path}) defines no run(out, quick=False, resume=True).")
    return module
