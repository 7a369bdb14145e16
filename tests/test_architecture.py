"""The package's import graph: no cycle between moestat's top-level modules and subpackages.

Every ``import``/``from ... import`` of a moestat module counts — at module level or inside a function (a
lazy import is still a dependency) — except those under ``if TYPE_CHECKING:``, which never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import moestat

ROOT = Path(moestat.__file__).parent


def _unit(module: str) -> str:
    """``moestat.fit.lse`` -> ``moestat.fit``: the top-level module or subpackage a module belongs to."""
    return ".".join(module.split(".")[:2])


class _Imports(ast.NodeVisitor):
    def __init__(self, package: str) -> None:
        self.package, self.targets = package, []

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            for n in node.orelse:
                self.visit(n)
            return
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = parts[:len(parts) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            names = [f"{target}.{a.name}" for a in node.names] if not node.module or target == "moestat" else [target]
            self.targets += names
        elif node.module and node.module.split(".")[0] == "moestat":
            self.targets.append(node.module)

    def visit_Import(self, node: ast.Import) -> None:
        self.targets += [a.name for a in node.names if a.name.split(".")[0] == "moestat"]


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for path in ROOT.rglob("*.py"):
        parts = ["moestat", *path.relative_to(ROOT).with_suffix("").parts]
        is_init = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_init else parts)
        visitor = _Imports(module if is_init else module.rsplit(".", 1)[0])
        visitor.visit(ast.parse(path.read_text()))
        for target in visitor.targets:
            a, b = _unit(module), _unit(target)
            if a != b and a != "moestat" and b != "moestat":
                graph.add_edge(a, b)
    return graph


def test_no_import_cycle_between_modules_and_subpackages():
    graph = import_graph()
    assert graph.number_of_edges() > 20  # the parser found the package's imports
    assert ("moestat.fit", "moestat.metrics") in graph.edges  # a known dependency, read through a relative import
    assert list(nx.simple_cycles(graph)) == []


def test_the_check_sees_a_cycle_when_there_is_one():
    graph = import_graph()
    graph.add_edge("moestat.metrics", "moestat.fit")
    assert list(nx.simple_cycles(graph))


def test_no_public_class_lives_in_a_private_module():
    """Every class the public API exports (``__all__`` of moestat and its subpackages) is defined in a public
    module, so its documented home is a path users can import."""
    import importlib
    import inspect as _inspect

    packages = ["moestat", "moestat.fit", "moestat.metrics", "moestat.rates", "moestat.deep", "moestat.simulators"]
    offenders = []
    for name in packages:
        mod = importlib.import_module(name)
        for attr in getattr(mod, "__all__", []):
            obj = getattr(mod, attr, None)
            if _inspect.isclass(obj) and obj.__module__.startswith("moestat"):
                if any(part.startswith("_") for part in obj.__module__.split(".")):
                    offenders.append(f"{name}.{attr} is defined in {obj.__module__}")
    assert not offenders, offenders


def test_every_subpackage_ships_in_the_wheel():
    """A subpackage missing from ``[tool.setuptools] packages`` works in an editable install and is absent from the
    wheel a user installs (``moestat.rates`` was)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {"moestat"} | {"moestat." + ".".join(init.parent.relative_to(ROOT).parts)
                             for init in ROOT.rglob("__init__.py") if init.parent != ROOT}
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [tool.setuptools] packages in pyproject.toml"


def test_no_string_holds_an_escape_that_was_meant_as_tex():
    r"""A docstring's TeX in a non-raw string loses its backslashes: ``"\bar"`` is a backspace and ``"ar"``, ``"\top"``
    a tab and ``"op"``, ``"\vdots"`` a vertical tab (and a file written with such a string evaluated holds the control
    bytes themselves).  The docs then show broken maths.  No string constant of the package or the vignettes may
    hold a backspace, bell, form feed, vertical tab or tab."""
    import ast

    root = Path(__file__).resolve().parents[1]
    bad = []
    for path in sorted([*root.joinpath("moestat").rglob("*.py"), *root.joinpath("vignettes").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and any(c in node.value for c in "\a\b\f\v\t"):
                bad.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not bad, f"string constants with control characters (use a raw docstring r\"\"\"...): {bad}"


def test_import_loads_no_plotting_or_umbrella_modules():
    """``import moestat`` starts every CLI call and study worker process.  It loads only the statsmodels models it
    uses, not ``statsmodels.api``, whose graphics and kernel-density modules (and joblib) added about 0.4 s of the
    2.4 s import on the 2-core development machine; plotting and torch.compile load when a function needs them.  Run
    in a fresh interpreter, since the test session has imported these modules already."""
    import subprocess
    import sys

    heavy = ("statsmodels.api", "statsmodels.graphics.api", "joblib", "matplotlib", "sklearn", "torch._dynamo")
    code = f"import sys, moestat; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"import moestat loaded {loaded}; import them inside the functions that use them"
