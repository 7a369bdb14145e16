"""The docs site: the rST -> Markdown docstring converter (docs/_ext/rst_to_md.py) on small strings, its name
resolution against the package, and a strict build of the whole site checked for raw reStructuredText and for
scripts or stylesheets loaded from another host.

The build runs ``mkdocs build --strict`` once per module (about 5-10 s; MathJax comes from ``node_modules``, which
the build's hook installs with ``npm ci`` when it is missing).  The browser check of tools/docs_check.py needs
Chromium and is marked ``slow``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


rst = _load(ROOT / "docs" / "_ext" / "rst_to_md.py")
docs_check = _load(ROOT / "tools" / "docs_check.py")

RESOLVED = {"fit_rate": "moestat.rates.exponents.fit_rate", "moestat.fit.base.FitResult": "moestat.fit.base.FitResult"}


def resolve(target: str) -> str | None:
    return RESOLVED.get(target)


# ---------------------------------------------------------------- the converter on small strings (hand-written)

@pytest.mark.parametrize(("source", "expected"), [
    # inline maths -> arithmatex's \( \); a role broken over lines is joined with one space
    (r"with :math:`\sigma^2` noise", r"with \(\sigma^2\) noise"),
    (":math:`a +\n    b` done", r"\(a + b\) done"),
    # double-backtick literals -> Markdown code spans; one containing a backtick stays double
    ("``gate_bias`` and ``a`b``", "`gate_bias` and ``a`b``"),
    # cross-references: resolved -> optional autoref to the canonical path; ~ shows the last component
    (":func:`fit_rate`", '<autoref identifier="moestat.rates.exponents.fit_rate" optional>`fit_rate`</autoref>'),
    (":class:`~moestat.fit.base.FitResult`",
     '<autoref identifier="moestat.fit.base.FitResult" optional>`FitResult`</autoref>'),
    # an explicit title; a ! target is never linked; an unresolved name and an unknown role become code
    (":func:`the rate fit <fit_rate>`",
     '<autoref identifier="moestat.rates.exponents.fit_rate" optional>`the rate fit`</autoref>'),
    (":func:`!fit_rate`", "`fit_rate`"),
    (":mod:`ast` and :py:meth:`Foo.bar`", "`ast` and `Foo.bar`"),
    (":ref:`some-label`", "`some-label`"),
])
def test_inline_roles(source: str, expected: str) -> None:
    assert rst.convert_rst(source, resolve) == expected


def test_math_directive_same_line_with_continuation() -> None:
    source = "Density\n\n.. math:: \\log p = -x^2\n          - c,\n\nwith c."
    assert rst.convert_rst(source) == "Density\n\n\n$$\n\\log p = -x^2\n- c,\n$$\n\n\nwith c."


def test_math_directive_block_options_and_two_equations() -> None:
    source = ".. math::\n   :label: eq1\n\n   a = b\n\n   c = d\n"
    assert rst.convert_rst(source) == "\n$$\na = b\n$$\n\n$$\nc = d\n$$\n\n"


def test_literal_block_becomes_fenced_python() -> None:
    source = "Example::\n\n    x = 1\n      y = 2\n\nafter"
    assert rst.convert_rst(source) == "Example:\n\n```python\nx = 1\n  y = 2\n```\n\nafter"


def test_fenced_code_is_left_alone() -> None:
    source = "```python\n:func:`x` ``y``\n```\n:func:`x`"
    assert rst.convert_rst(source) == "```python\n:func:`x` ``y``\n```\n`x`"


def test_simple_table_with_continuation_row_and_pipes() -> None:
    source = ("Before\n\n======== ============\nname     value\n======== ============\n"
              "a        :math:`|x|`\nb        ``c|d``, e|f\n         continued\n======== ============\n\nAfter")
    expected = ("Before\n\n\n| name | value |\n|---|---|\n| a | \\(\\vert x\\vert \\) |\n"
                "| b | `c|d`, e\\|f continued |\n\n\nAfter")
    assert rst.convert_rst(source) == expected


def test_definition_list_becomes_def_list() -> None:
    source = 'Kinds:\n\n``"D1"`` (eq. 6)\n    first line\n    second line\n``"D2"``\n    other\n\nTail'
    expected = 'Kinds:\n\n`"D1"` (eq. 6)\n:   first line\n    second line\n\n`"D2"`\n:   other\n\nTail'
    assert rst.convert_rst(source) == expected


def test_numpy_parameters_are_not_definition_lists() -> None:
    source = "Summary.\n\nParameters\n----------\nx : int\n    The :math:`x`.\n"
    assert rst.convert_rst(source) == "Summary.\n\nParameters\n----------\nx : int\n    The \\(x\\).\n"


def test_list_item_content_is_indented_four_spaces() -> None:
    source = "* item one\n  continues\n\n  .. math:: a = b\n\n* item two"
    expected = "* item one\n    continues\n\n\n    $$\n    a = b\n    $$\n\n\n* item two"
    assert rst.convert_rst(source) == expected


# ---------------------------------------------------------------- resolution against the loaded package

@pytest.fixture(scope="module")
def package():
    import griffe

    return griffe.load("moestat", search_paths=[str(ROOT)], resolve_aliases=False)


def _runtime_path(obj: object) -> str:
    """The object's canonical path as Python itself reports it (an independent check of griffe's)."""
    return f"{obj.__module__}.{obj.__qualname__}"  # type: ignore[attr-defined]


def test_resolver_matches_python_canonical_paths(package) -> None:
    import moestat as ms

    resolver = rst.PackageResolver(package)
    in_rates = resolver.resolver(package["rates"])
    assert in_rates("fit_rate") == _runtime_path(ms.fit_rate)  # an import of the scope module
    assert in_rates("moestat.Params") == _runtime_path(ms.Params)  # absolute, through a re-export
    assert in_rates("voronoi_loss") == _runtime_path(ms.voronoi_loss)  # the package's top level
    # a method named relative to its class, from the docstring of another method of that class
    fit_result = ms.fit.base.FitResult
    in_method = resolver.resolver(package["fit.base.FitResult.glance"])
    assert in_method("tidy") == _runtime_path(fit_result.tidy)
    assert in_method("ast") is None  # not a moestat object: shown as code


# ---------------------------------------------------------------- the whole site, built strictly

# a role left raw shows as ":func:`x`", or as ":func:<code>x</code>" once Markdown made a code span of its body
RAW_RST = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|math):(?:`|<code)|\.\. math::")
STRIP = re.compile(r"<(pre|script|style|textarea)\b.*?</\1>", re.DOTALL | re.IGNORECASE)
EXTERNAL = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"(?:https?:)?//[^\"]*\"[^>]*>", re.IGNORECASE)


def _build(out: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once per test session: under pytest-xdist the workers share one build (a file lock in the
    session's temporary folder), so the tests of this module spread over workers do not build it twice."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.mktemp("site")
        _build(out)
        return out
    from filelock import FileLock

    out = tmp_path_factory.getbasetemp().parent / "docs-site"  # shared by this session's workers only
    with FileLock(f"{out}.lock"):
        if not (out / "index.html").is_file():
            _build(out)
    return out


def _pages(site: Path) -> dict[str, str]:
    return {p.relative_to(site).as_posix(): p.read_text(encoding="utf-8") for p in site.rglob("*.html")}


def test_no_raw_rst_left_in_text(site: Path) -> None:
    found = []
    for page, html in _pages(site).items():
        text = STRIP.sub("", html)
        found += [f"{page}: ...{text[max(0, m.start() - 60):m.end() + 40]!r}" for m in RAW_RST.finditer(text)]
    assert not found, "raw reStructuredText in the built site:\n" + "\n".join(found[:20])


def test_no_script_or_stylesheet_from_another_host(site: Path) -> None:
    found = [f"{page}: {tag}" for page, html in _pages(site).items() for tag in EXTERNAL.findall(html)
             if "stylesheet" in tag or "<script" in tag.lower() or "preconnect" in tag]
    assert not found, "assets from another host:\n" + "\n".join(sorted(set(found))[:20])


def test_mathjax_shipped_with_the_site(site: Path) -> None:
    mathjax = site / "javascripts" / "mathjax"
    assert (mathjax / "tex-chtml.js").stat().st_size > 500_000
    assert len(list((mathjax / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))) >= 20
    assert (mathjax / "input" / "tex" / "extensions" / "boldsymbol.js").is_file()  # autoloaded on demand
    index = (site / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<script src="javascripts/mathjax-config\.js"></script>\s*'
                     r'<script src="javascripts/mathjax/tex-chtml\.js"></script>', index)


def test_api_pages_render_roles_as_links_and_maths(site: Path) -> None:
    metrics = (site / "api" / "metrics" / "index.html").read_text(encoding="utf-8")
    # moestat/metrics/matching.py: ":func:`voronoi_loss`" -> a link to the object rendered on the same page
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="#moestat\.metrics\.voronoi\.voronoi_loss">'
                     r"<code>voronoi_loss</code></a>", metrics)
    # its ".. math::" block -> display maths, and a :math: role -> inline maths
    assert '<div class="arithmatex">\\[\n\\min_{\\pi} \\Big(' in metrics
    assert '<span class="arithmatex">\\(k = k^*\\)</span>' in metrics
    # moestat/experts.py's rST simple table -> an HTML table
    model = (site / "api" / "model" / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<th>name</th>\s*<th><span class=\"arithmatex\">\\\(\\varphi\(z\)\\\)</span></th>", model)


def test_private_modules_stay_out_of_the_api_reference(site: Path) -> None:
    ids = set()
    for page, html in _pages(site).items():
        if page.startswith("api/"):
            ids.update(re.findall(r'id="(moestat\.[\w.]+)"', html))
    private = sorted(i for i in ids if any(part.startswith("_") for part in i.split(".")))
    assert ids and not private, private[:20]


# ---------------------------------------------------------------- tools/docs_check.py

def test_external_assets_lists_only_assets_from_other_hosts() -> None:
    html = ('<script src="https://cdn.example/x.js"></script><script src="js/local.js"></script>'
            '<link rel="stylesheet" href="//fonts.example/css"><link rel="canonical" href="https://site.example/">'
            '<a href="https://example.org/">a link</a>')
    assert docs_check.external_assets(html) == ["https://cdn.example/x.js", "//fonts.example/css"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs the Debian package chromium")
def test_docs_check_in_chromium(site: Path, tmp_path: Path) -> None:
    """Two API pages rendered at 1280 px: MathJax typesets, and no raw TeX, blank maths or clipping remains."""
    shots = tmp_path / "shots"
    code = docs_check.main([str(site), "--screenshots", str(shots), "--only", "api/metrics/*", "api/model/*",
                            "--json", str(tmp_path / "report.json")])
    report = {r["page"]: r for r in __import__("json").loads((tmp_path / "report.json").read_text())}
    assert set(report) == {"api/metrics/index.html", "api/model/index.html"}
    assert all(r["height"] > 1000 and not r["error"] for r in report.values()), report
    assert code == 0, {page: docs_check.PageReport(**r).problems() for page, r in report.items()}
    assert sorted(p.name for p in shots.iterdir()) == ["api__metrics.png", "api__model.png"]
