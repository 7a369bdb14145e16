"""Griffe extension: the reStructuredText markup of moestat's docstrings, rewritten as Markdown at docs-build time.

moestat's docstrings are numpy-style with Sphinx roles (``:func:`x```, ``:math:`...```, ``.. math::`` blocks,
double-backtick literals).  mkdocstrings renders docstrings as Markdown, where these show literally.  Rather than
rewrite ~800 docstrings, :func:`convert_rst` translates them when griffe loads the package:

* ``:math:`x``` -> ``\\(x\\)`` and ``.. math::`` blocks -> ``$$ ... $$`` paragraphs (pymdownx.arithmatex,
  generic mode, which wraps both for MathJax);
* ````x```` -> ```x``` (a Markdown code span);
* ``:func:`a.b```, ``:class:``, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``, ``:exc:``, ``:obj:`` ->
  ``<autoref identifier="moestat.full.path" optional>`a.b`</autoref>``: a mkdocs-autorefs cross-reference to
  the object's canonical path.  ``optional`` makes autorefs render plain code, without a warning, when the object
  is not rendered on any page (private helpers), so ``mkdocs build --strict`` never fails on a reference.  A name
  that does not resolve to a moestat object at all (``:mod:`ast```) becomes plain code.  ``~a.b.C`` shows ``C``;
  ``title <target>`` shows ``title``; ``!target`` is never linked;
* a paragraph ending in ``::`` followed by an indented block -> ``:`` and a fenced ``python`` code block;
* simple tables (``====`` borders) -> pipe tables; definition lists (a term line, then its indented definition)
  -> ``def_list`` items (``term`` / ``:   definition``), outside the numpy sections griffe parses itself;
* what belongs to a list item is indented four spaces (Python-Markdown's rule; rST aligns it with the item's
  text), so that a ``.. math::`` block inside an item stays in the item.

Configured in ``mkdocs.yml`` under the python handler's ``extensions:``.  The converter is a pure function so
that ``tests/test_docs_site.py`` checks it on small strings.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import griffe

_log = logging.getLogger("mkdocs.plugins.moestat_rst")

XREF_ROLES = frozenset({"func", "class", "meth", "mod", "attr", "data", "exc", "obj", "const", "any"})
"""Sphinx Python-domain roles turned into cross-references."""

_INLINE_RE = re.compile(
    r"(?<![\w`]):(?:py:)?(?P<role>[a-z]+):`(?P<body>[^`]+)`(?!`)"  # :role:`body`
    r"|``(?P<literal>[^`](?:[^`]|`(?!`))*?)``(?!`)"  # ``literal``
)
_MATH_DIRECTIVE_RE = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<rest>.*)$")
_DIRECTIVE_OPTION_RE = re.compile(r"^:[a-z-]+:")
_FENCE_RE = re.compile(r"^[ \t]*(```|~~~)")
_TITLED_TARGET_RE = re.compile(r"(?s)(?P<title>.*?)\s*<(?P<target>[^<>]+)>")

Resolver = Callable[[str], str | None]


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block_end(lines: list[str], start: int, base: int) -> int:
    """Index one past the last line of the indented block that starts at ``start`` (lines indented beyond ``base``
    or blank), trailing blank lines excluded."""
    end = start
    for j in range(start, len(lines)):
        if lines[j].strip() and _indent_of(lines[j]) <= base:
            break
        if lines[j].strip():
            end = j + 1
    return end


def _dedent(lines: list[str]) -> list[str]:
    width = min((_indent_of(line) for line in lines if line.strip()), default=0)
    return [line[width:] if line.strip() else "" for line in lines]


def _math_block(indent: str, first: str, body: list[str]) -> list[str]:
    """``$$`` paragraphs for the content of one ``.. math::`` directive (one per blank-line separated equation)."""
    content = ([first.strip()] if first.strip() else []) + [line.strip() for line in _dedent(body)]
    while content and _DIRECTIVE_OPTION_RE.match(content[0]):  # :label:, :nowrap: (no Markdown equivalent)
        content.pop(0)
    equations: list[list[str]] = [[]]
    for line in content:
        if line:
            equations[-1].append(line)
        elif equations[-1]:
            equations.append([])
    out: list[str] = []
    for eq in (e for e in equations if e):
        out += ["", f"{indent}$$", *(f"{indent}{line}" for line in eq), f"{indent}$$"]
    return [*out, ""]


def _literal_intro(line: str) -> str | None:
    """The line that introduces an rST literal block (``text::`` -> ``text:``, a bare ``::`` -> dropped), or None
    when ``line`` does not end in ``::``."""
    stripped = line.rstrip()
    if not stripped.endswith("::") or stripped.lstrip().startswith(".. "):
        return None
    if stripped.strip() == "::":
        return ""
    if stripped.endswith(" ::"):
        return stripped[:-3]
    return stripped[:-1]


_TABLE_BORDER_RE = re.compile(r"^[ \t]*=+(?: +=+)+[ \t]*$")
_SECTION_RULE_RE = re.compile(r"^[ \t]*-{3,}[ \t]*$")
_NOT_A_TERM = (".. ", "$", "\\", ">>>", "* ", "- ", "+ ", "| ", ":", "#", "```", "~~~")

STRUCTURED_SECTIONS = frozenset({
    "parameters", "other parameters", "returns", "yields", "receives", "raises", "warns", "warnings",
    "attributes", "methods", "see also",
})
"""numpy-docstring sections whose top level griffe parses itself (``name : type`` + indented description)."""

Piece = tuple[bool, list[str]]  # (is_code, lines): code pieces are final, prose pieces get the inline conversion


def _fenced(lines: list[str], i: int) -> tuple[int, list[Piece]] | None:
    """An existing fenced code block, copied through to its closing fence."""
    if not _FENCE_RE.match(lines[i]):
        return None
    fence = lines[i].strip()[:3]
    end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines) - 1)
    return end + 1, [(True, lines[i : end + 1])]


def _math_directive(lines: list[str], i: int) -> tuple[int, list[Piece]] | None:
    """``.. math::`` with its content on the same line and/or in the indented block below it."""
    math = _MATH_DIRECTIVE_RE.match(lines[i])
    if not math:
        return None
    end = _block_end(lines, i + 1, len(math["indent"]))
    return end, [(True, _math_block(math["indent"], math["rest"], lines[i + 1 : end]))]


def _literal_block(lines: list[str], i: int) -> tuple[int, list[Piece]] | None:
    """``text::`` + an indented block -> ``text:`` + a fenced ``python`` block."""
    intro = _literal_intro(lines[i])
    nxt = next((j for j in range(i + 1, len(lines)) if lines[j].strip()), None)
    if intro is None or nxt is None or _indent_of(lines[nxt]) <= _indent_of(lines[i]):
        return None
    end = _block_end(lines, nxt, _indent_of(lines[i]))
    pad = " " * _indent_of(lines[i])
    code = [f"{pad}{c}".rstrip() for c in _dedent(lines[nxt:end])]
    intro_piece: list[Piece] = [(False, [intro])] if intro.strip() else []
    return end, [*intro_piece, (True, ["", f"{pad}```python", *code, f"{pad}```"])]


def _table_cells(line: str, starts: list[int]) -> list[str]:
    bounds = [*starts[1:], None]
    return [line[a:b].strip() if b is not None else line[a:].strip() for a, b in zip(starts, bounds, strict=True)]


def _escape_pipes(cell: str) -> str:
    """A Markdown table cell: ``|`` escaped in text, ``\\vert`` / ``\\Vert`` inside maths, untouched in code."""
    out = []
    for part in re.split(r"(`[^`]*`|\\\(.*?\\\))", cell):
        if part.startswith("\\("):
            out.append(part.replace("\\|", "\\Vert ").replace("|", "\\vert "))
        elif part.startswith("`"):
            out.append(part)
        else:
            out.append(part.replace("|", "\\|"))
    return "".join(out)


def _simple_table(lines: list[str], i: int, resolve: Resolver | None) -> tuple[int, list[Piece]] | None:
    """An rST simple table (``====`` borders) -> a Markdown pipe table; a row whose first column is blank continues
    the row above, as in rST."""
    if not _TABLE_BORDER_RE.match(lines[i]) or (i > 0 and lines[i - 1].strip()):
        return None
    borders = [j for j in range(i + 1, len(lines)) if _TABLE_BORDER_RE.match(lines[j])][:2]
    if not borders:
        return None
    starts = [m.start() for m in re.finditer(r"=+", lines[i])]
    end = borders[-1] + 1 if len(borders) == 2 else borders[0] + 1
    header_end = borders[0] if len(borders) == 2 else i
    rows: list[list[str]] = []
    for j in range(i + 1, end - 1):
        if j == header_end or not lines[j].strip():
            continue
        cells = _table_cells(lines[j], starts)
        if rows and not cells[0] and j != header_end + 1:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
    n_header = 1 if len(borders) == 2 else 0
    header = rows[0] if n_header else [""] * len(starts)
    pad = " " * _indent_of(lines[i])

    def row(cells: list[str]) -> str:
        return pad + "| " + " | ".join(_escape_pipes(_convert_inline(c, resolve)) for c in cells) + " |"

    table = [row(header), pad + "|" + "---|" * len(starts), *(row(r) for r in rows[n_header:])]
    return end, [(True, ["", *table, ""])]


def _definition(lines: list[str], i: int, section: str | None) -> bool:
    """Rewrite an rST definition-list item starting at ``lines[i]`` (a one-line term, then its indented definition)
    in place as a Markdown ``def_list`` item (``term`` / ``:   definition``); True when it did."""
    term = lines[i]
    t = _indent_of(term)
    body = i + 1
    if (not term.strip() or body >= len(lines) or not lines[body].strip() or _indent_of(lines[body]) <= t
            or (i > 0 and lines[i - 1].strip() and _indent_of(lines[i - 1]) <= t)
            or term.strip().startswith(_NOT_A_TERM) or term.rstrip().endswith("::")
            or re.match(r"\s*\d+[.)] ", term) or (section in STRUCTURED_SECTIONS and t == 0)):
        return False
    end = _block_end(lines, body, t)
    b = _indent_of(lines[body])
    for j in range(body, end):
        if lines[j].strip():
            shift = " " * (t + 4 + max(0, _indent_of(lines[j]) - b))
            lines[j] = (" " * t + ":   " if j == body else shift) + lines[j].strip()
    return True


_BULLET_RE = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>[*+-]|\d+[.)]|#\.)[ ]+\S")


def _reindent_lists(lines: list[str]) -> list[str]:
    """Indent what belongs to a list item by four spaces, as Python-Markdown needs (rST aligns it with the item's
    text, two spaces after ``*``): a ``.. math::`` block or second paragraph inside an item stays inside it."""
    out: list[str] = []
    stack: list[tuple[int, int]] = []  # (content offset, extra spaces) of each enclosing list item
    for line in lines:
        if not line.strip():
            out.append(line)
            continue
        indent = _indent_of(line)
        while stack and indent < stack[-1][0]:
            stack.pop()
        out.append(" " * sum(extra for _, extra in stack) + line)
        bullet = _BULLET_RE.match(line)
        if bullet:
            offset = len(bullet["indent"]) + len(bullet["marker"]) + 1
            stack.append((offset, max(0, len(bullet["indent"]) + 4 - offset)))
    return out


def _convert_blocks(text: str, resolve: Resolver | None = None) -> Iterator[tuple[bool, str]]:
    """Split ``text`` into (is_code, chunk) pieces with the block-level rST rewritten (``.. math::``, ``::`` literal
    blocks, simple tables, definition lists); code chunks are not touched by the inline conversion."""
    lines = _reindent_lists(text.split("\n"))
    i = 0
    prose: list[str] = []
    section: str | None = None
    while i < len(lines):
        if i + 1 < len(lines) and lines[i].strip() and _SECTION_RULE_RE.match(lines[i + 1]):
            section = lines[i].strip().lower()
        hit = (_fenced(lines, i) or _math_directive(lines, i) or _literal_block(lines, i)
               or _simple_table(lines, i, resolve))
        if hit is None:
            if _definition(lines, i, section) and i > 0 and lines[i - 1].strip():
                prose.append("")  # a blank line between def_list items, or the term continues the definition above
            prose.append(lines[i])
            i += 1
            continue
        i, pieces = hit
        for is_code, chunk in pieces:
            if is_code:
                yield from _flush(prose)
                yield True, "\n".join(chunk)
            else:
                prose.extend(chunk)
    yield from _flush(prose)


def _flush(prose: list[str]) -> Iterator[tuple[bool, str]]:
    """Yield the prose lines gathered so far as one chunk (nothing when there are none) and clear the list."""
    if prose:
        yield False, "\n".join(prose)
    prose.clear()


def _xref(body: str, resolve: Resolver | None) -> str:
    titled = _TITLED_TARGET_RE.fullmatch(body.strip())
    title, target = (titled["title"], titled["target"]) if titled and titled["title"] else (None, body.strip())
    no_link = target.startswith("!")
    short = target.lstrip("!").startswith("~")
    target = target.lstrip("!~")
    shown = title or (target.rsplit(".", 1)[-1] if short else target)
    code = f"`{shown}`" if "`" not in shown else f"`` {shown} ``"
    path = None if no_link or resolve is None else resolve(target)
    if path is None:
        return code
    return f'<autoref identifier="{path}" optional>{code}</autoref>'


def _convert_inline(text: str, resolve: Resolver | None) -> str:
    def repl(match: re.Match[str]) -> str:
        if match["literal"] is not None:
            literal = re.sub(r"\s*\n\s*", " ", match["literal"])
            return f"`{literal}`" if "`" not in literal else match[0]
        role, body = match["role"], match["body"]
        if role == "math":
            return "\\(" + re.sub(r"\s*\n\s*", " ", body.strip()) + "\\)"
        if role in XREF_ROLES:
            return _xref(body, resolve)
        return f"`{body.strip()}`"  # :ref:, :term:, ... : no target on this site; keep the text as code

    return _INLINE_RE.sub(repl, text)


def convert_rst(text: str, resolve: Resolver | None = None) -> str:
    """Rewrite the reStructuredText markup of one docstring as Markdown for mkdocstrings.

    Parameters
    ----------
    text : str
        A docstring (already dedented, as griffe stores it).
    resolve : callable, optional
        Maps a role target (``"fit_rate"``, ``"moestat.fit.base.FitResult"``) to the canonical dotted path of the
        object it names, or None when it names none; without it every cross-reference becomes plain code.

    Returns
    -------
    str
        The docstring with roles, ``.. math::`` blocks, double-backtick literals and ``::`` literal blocks in
        Markdown (see the module docstring); other text unchanged.
    """
    pieces = _convert_blocks(text, resolve)
    return "\n".join(chunk if code else _convert_inline(chunk, resolve) for code, chunk in pieces)


def _safe(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except (KeyError, ValueError, AttributeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _member(obj: griffe.Object | griffe.Alias, dotted: str) -> griffe.Object | griffe.Alias | None:
    """``obj``'s member at the dotted path ``dotted``, inherited class members included."""
    for part in dotted.split("."):
        members = _safe(lambda o=obj: o.all_members if o.is_class else o.members)
        if not members or part not in members:
            return None
        obj = members[part]
    return obj


class PackageResolver:
    """Resolves Sphinx role targets against one loaded package, the way Sphinx's Python domain looks them up:
    an absolute path, then a name relative to each enclosing scope of the docstring's object (its class, module
    and packages, imports included), then the package's top level, then a unique dotted suffix of any object."""

    def __init__(self, package: griffe.Module) -> None:
        self.package = package
        self.by_suffix: dict[str, set[str]] = defaultdict(set)
        for obj in _walk(package):
            parts = obj.path.split(".")
            for n in (1, 2):
                if len(parts) > n:
                    self.by_suffix[".".join(parts[-n:])].add(obj.path)

    def lookup(self, path: str) -> str | None:
        head, _, rest = path.partition(".")
        if head != self.package.name:
            return None
        found = _member(self.package, rest) if rest else self.package
        return None if found is None else _safe(lambda: found.canonical_path)

    def resolver(self, obj: griffe.Object) -> Resolver:
        def resolve(target: str) -> str | None:
            target = target.strip().lstrip(".").removesuffix("()")
            scopes: list[str] = []
            scope: griffe.Object | None = obj
            while scope is not None:
                scopes.append(scope.path)
                scope = scope.parent
            for candidate in [target, *(f"{s}.{target}" for s in scopes)]:
                path = self.lookup(candidate)
                if path is not None:
                    return path
            suffix = self.by_suffix.get(target, set())
            if len(suffix) == 1:
                return self.lookup(next(iter(suffix)))
            _log.debug("rst roles: %r in %s names no unique moestat object; shown as code", target, obj.path)
            return None

        return resolve


def _walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined under it (aliases, i.e. imports, skipped)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)  # type: ignore[arg-type]


class RstToMarkdown(griffe.Extension):
    """Converts every docstring of a loaded package with :func:`convert_rst` (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        resolver = PackageResolver(pkg)
        for obj in _walk(pkg):
            if obj.docstring is None:
                continue
            obj.docstring.value = convert_rst(obj.docstring.value, resolver.resolver(obj))
            obj.docstring.__dict__.pop("parsed", None)  # drop a parse cached before the rewrite
